/* proto.c - the sepal wire protocol: explicit little-endian (de)serialisation, and a decoder that checks
 * every count, length and shape of an incoming message before reading through it. The layout is written
 * down in share/doc/protocol.md; the offsets below must match it (tests/test_proto.c pins them). */
#include "proto.h"

#include <cJSON.h>
#include <inttypes.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "half.h"

#define KNOWN_FLAGS ((uint16_t)SP_MSG_F_REPLY)

/* header field offsets */
enum { H_MAGIC = 0, H_MAJOR = 4, H_MINOR = 6, H_TYPE = 8, H_FLAGS = 10, H_NTENSORS = 12, H_REQID = 16,
       H_METALEN = 24, H_RESERVED = 28, H_BODYLEN = 32 };
/* descriptor field offsets */
enum { D_ENC = 0, D_RANK = 1, D_RES16 = 2, D_RES32 = 4, D_SHAPE = 8, D_BYTELEN = 40 };

/* ---------------------------------------------------------------------------------------------- */
/* little-endian byte helpers: the wire order is fixed whatever the host's is */

static void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static uint64_t get_u64(const uint8_t *p) { return (uint64_t)get_u32(p) | ((uint64_t)get_u32(p + 4) << 32); }

static void put_f32(uint8_t *p, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    put_u32(p, u);
}

static float get_f32(const uint8_t *p)
{
    uint32_t u = get_u32(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* A two's complement int8 from its byte without relying on implementation-defined conversions. */
static int get_i8(uint8_t b) { return b < 128 ? (int)b : (int)b - 256; }

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define HOST_LE 1 /* f32/i32/i64 arrays can be copied as they are */
#else
#define HOST_LE 0
#endif

/* ---------------------------------------------------------------------------------------------- */
/* names and sizes */

static const char *const type_names[SP_MSG__END] = {
    [SP_MSG_HELLO] = "HELLO",
    [SP_MSG_INFO] = "INFO",
    [SP_MSG_FORWARD] = "FORWARD",
    [SP_MSG_BACKWARD] = "BACKWARD",
    [SP_MSG_INFERENCE_OPEN] = "INFERENCE_OPEN",
    [SP_MSG_INFERENCE_STEP] = "INFERENCE_STEP",
    [SP_MSG_INFERENCE_CLOSE] = "INFERENCE_CLOSE",
    [SP_MSG_PING] = "PING",
    [SP_MSG_ERROR] = "ERROR",
    [SP_MSG_AUTH] = "AUTH",
};

static const char *const enc_names[SP_ENC__END] = {
    [SP_ENC_F32] = "f32", [SP_ENC_F16] = "f16", [SP_ENC_BF16] = "bf16",
    [SP_ENC_Q8] = "q8",   [SP_ENC_I64] = "i64", [SP_ENC_I32] = "i32",
};

static int type_known(int type) { return type > 0 && type < SP_MSG__END; }
static int enc_known(int enc) { return enc >= 0 && enc < SP_ENC__END; }

const char *sp_msg_type_name(int type) { return type_known(type) ? type_names[type] : "?"; }
const char *sp_encoding_name(int enc) { return enc_known(enc) ? enc_names[enc] : "?"; }

int sp_encoding_from_name(const char *name)
{
    for (int e = 0; name && e < SP_ENC__END; e++)
        if (strcmp(name, enc_names[e]) == 0)
            return e;
    return -1;
}

int sp_encoding_is_float(int enc)
{
    return enc == SP_ENC_F32 || enc == SP_ENC_F16 || enc == SP_ENC_BF16 || enc == SP_ENC_Q8;
}

uint64_t sp_encoding_bytes(int enc, uint64_t numel, int *ok)
{
    uint64_t width = 0;
    switch (enc) {
    case SP_ENC_F32: case SP_ENC_I32: width = 4; break;
    case SP_ENC_F16: case SP_ENC_BF16: width = 2; break;
    case SP_ENC_I64: width = 8; break;
    case SP_ENC_Q8: {
        /* one f32 scale per started block, plus one byte per value */
        uint64_t blocks = numel / SP_PROTO_Q8_BLOCK + (numel % SP_PROTO_Q8_BLOCK != 0);
        int fits = numel <= UINT64_MAX - 4 * blocks; /* 4 * blocks <= 2^60: cannot overflow itself */
        if (ok)
            *ok = fits;
        return fits ? numel + 4 * blocks : 0;
    }
    default:
        if (ok)
            *ok = 0;
        return 0;
    }
    int fits = numel <= UINT64_MAX / width;
    if (ok)
        *ok = fits;
    return fits ? numel * width : 0;
}

sp_proto_limits sp_proto_default_limits(void)
{
    sp_proto_limits l = {SP_PROTO_DEFAULT_MAX_MESSAGE, SP_PROTO_DEFAULT_MAX_META};
    return l;
}

/* ---------------------------------------------------------------------------------------------- */
/* buffers */

/* Freed heap buffers are kept for reuse, so that the messages of a decode step cost no allocation: the buffer a
 * request arrived in goes back here and becomes the next reply's, and so on, on either side and across threads.
 * At most SPARE_SLOTS buffers of at most SPARE_MAX_CAP bytes, SPARE_MAX_BYTES in all, per process; larger ones
 * (and mapped ones) are freed as before. Under ASan a kept buffer is poisoned, so a use after sp_buf_free is
 * still caught. */
#define SPARE_SLOTS 32
#define SPARE_MAX_CAP ((size_t)256 << 10)
#define SPARE_MAX_BYTES ((size_t)4 << 20)

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define SPARE_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define SPARE_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define SPARE_POISON(p, n) ((void)(p), (void)(n))
#define SPARE_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

static struct {
    pthread_mutex_t mu;
    int n;
    size_t bytes;
    uint8_t *base[SPARE_SLOTS];
    size_t cap[SPARE_SLOTS];
} g_spare = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* The smallest kept buffer that holds cap bytes, into the empty b: 1, or 0 if none does. */
static int spare_take(sp_buf *b, size_t cap)
{
    if (cap > SPARE_MAX_CAP)
        return 0;
    pthread_mutex_lock(&g_spare.mu);
    int best = -1;
    for (int i = 0; i < g_spare.n; i++)
        if (g_spare.cap[i] >= cap && (best < 0 || g_spare.cap[i] < g_spare.cap[best]))
            best = i;
    if (best >= 0) {
        b->base = g_spare.base[best];
        b->cap = g_spare.cap[best];
        g_spare.bytes -= b->cap;
        g_spare.n--;
        g_spare.base[best] = g_spare.base[g_spare.n];
        g_spare.cap[best] = g_spare.cap[g_spare.n];
    }
    pthread_mutex_unlock(&g_spare.mu);
    if (best < 0)
        return 0;
    SPARE_UNPOISON(b->base, SP_BUF_HEADROOM + b->cap);
    b->data = b->base + SP_BUF_HEADROOM;
    b->len = 0;
    return 1;
}

/* Keeps a heap buffer of cap bytes (headroom excluded): 1, or 0 when it is too large or there is no room. */
static int spare_put(uint8_t *base, size_t cap)
{
    if (cap > SPARE_MAX_CAP)
        return 0;
    pthread_mutex_lock(&g_spare.mu);
    int ok = g_spare.n < SPARE_SLOTS && g_spare.bytes + cap <= SPARE_MAX_BYTES;
    if (ok) {
        SPARE_POISON(base, SP_BUF_HEADROOM + cap);
        g_spare.base[g_spare.n] = base;
        g_spare.cap[g_spare.n++] = cap;
        g_spare.bytes += cap;
    }
    pthread_mutex_unlock(&g_spare.mu);
    return ok;
}

/* The capacity sp_buf_reserve gives a fresh heap buffer for cap bytes: a power of two with room to spare (the next
 * message, a few bytes longer because its position has one more digit, still fits a kept buffer). */
static size_t spare_round(size_t cap)
{
    if (cap > SPARE_MAX_CAP)
        return cap;
    size_t want = cap + cap / 8, c = 256;
    while (c < want && c < SPARE_MAX_CAP)
        c *= 2;
    return c > cap ? c : cap;
}

void sp_buf_spare_seed(size_t cap, int n)
{
    cap = spare_round(cap);
    if (cap > SPARE_MAX_CAP)
        return;
    pthread_mutex_lock(&g_spare.mu);
    int have = 0;
    for (int i = 0; i < g_spare.n; i++)
        have += g_spare.cap[i] >= cap;
    pthread_mutex_unlock(&g_spare.mu);
    for (; have < n; have++) {
        uint8_t *p = malloc(SP_BUF_HEADROOM + cap);
        if (!p || !spare_put(p, cap)) {
            free(p);
            return;
        }
    }
}

size_t sp_msg_size_f32(size_t meta_max, const size_t *numel, int n)
{
    size_t bytes = SP_PROTO_HEADER_SIZE + meta_max;
    for (int i = 0; i < n; i++)
        bytes += SP_PROTO_DESC_SIZE + numel[i] * 4;
    return bytes;
}

sp_status sp_buf_reserve(sp_buf *b, size_t cap, sp_err *err)
{
    if (!b)
        return sp_errf(err, SP_ERR_ARG, "sp_buf_reserve: no buffer");
    if (b->base && cap <= b->cap)
        return SP_OK;
    if (b->mapped)
        return sp_buf_reserve_mapped(b, cap, err);
    if (!b->base && spare_take(b, cap))
        return SP_OK;
    cap = spare_round(cap);
    if (cap > SIZE_MAX - SP_BUF_HEADROOM)
        return sp_errf(err, SP_ERR_NOMEM, "buffer of %zu bytes is too large", cap);
    uint8_t *nb = realloc(b->base, SP_BUF_HEADROOM + cap); /* realloc keeps the bytes already there */
    if (!nb)
        return sp_errf(err, SP_ERR_NOMEM, "cannot allocate a buffer of %zu bytes", cap);
    b->base = nb;
    b->data = nb + SP_BUF_HEADROOM;
    b->cap = cap;
    return SP_OK;
}

sp_status sp_buf_append(sp_buf *b, const void *p, size_t n, sp_err *err)
{
    if (!b || (n && !p))
        return sp_errf(err, SP_ERR_ARG, "sp_buf_append: no buffer or no data");
    if (n > SIZE_MAX - SP_BUF_HEADROOM - b->len)
        return sp_errf(err, SP_ERR_NOMEM, "buffer of %zu + %zu bytes is too large", b->len, n);
    size_t want = b->len + n;
    if (want > b->cap && b->cap <= (SIZE_MAX - SP_BUF_HEADROOM) / 2 && want < 2 * b->cap)
        want = 2 * b->cap; /* grow geometrically so that appends in a loop stay linear */
    sp_status s = sp_buf_reserve(b, want, err);
    if (s)
        return s;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    return SP_OK;
}

sp_status sp_buf_reserve_mapped(sp_buf *b, size_t cap, sp_err *err)
{
    if (!b)
        return sp_errf(err, SP_ERR_ARG, "sp_buf_reserve_mapped: no buffer");
    if (b->base && cap <= b->cap)
        return SP_OK;
    size_t page = 4096, size = SP_BUF_HEADROOM + cap;
    if (cap > SIZE_MAX - SP_BUF_HEADROOM - page)
        return sp_errf(err, SP_ERR_NOMEM, "buffer of %zu bytes is too large", cap);
    size = (size + page - 1) / page * page;
    uint8_t *nb = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (nb == MAP_FAILED)
        return sp_errf(err, SP_ERR_NOMEM, "cannot map a buffer of %zu bytes", cap);
    if (b->len)
        memcpy(nb + SP_BUF_HEADROOM, b->data, b->len);
    size_t len = b->len;
    sp_buf_free(b);
    b->base = nb;
    b->data = nb + SP_BUF_HEADROOM;
    b->len = len;
    b->cap = size - SP_BUF_HEADROOM;
    b->mapped = size;
    return SP_OK;
}

void sp_buf_free(sp_buf *b)
{
    if (!b)
        return;
    if (b->mapped)
        munmap(b->base, b->mapped);
    else if (b->base && !spare_put(b->base, b->cap))
        free(b->base);
    memset(b, 0, sizeof *b);
}

/* ---------------------------------------------------------------------------------------------- */
/* header */

int sp_msg_header_read(const uint8_t *buf, size_t len, sp_msg_header *h)
{
    if (!buf || !h || len < SP_PROTO_HEADER_SIZE)
        return 0;
    h->magic = get_u32(buf + H_MAGIC);
    h->major = get_u16(buf + H_MAJOR);
    h->minor = get_u16(buf + H_MINOR);
    h->type = get_u16(buf + H_TYPE);
    h->flags = get_u16(buf + H_FLAGS);
    h->n_tensors = get_u32(buf + H_NTENSORS);
    h->request_id = get_u64(buf + H_REQID);
    h->meta_len = get_u32(buf + H_METALEN);
    h->reserved = get_u32(buf + H_RESERVED);
    h->body_len = get_u64(buf + H_BODYLEN);
    return 1;
}

/* Identity checks first (magic, version, type), so that a peer of another version hears about the version
 * rather than about a field whose meaning may have changed. */
static sp_status check_identity(const sp_msg_header *h, sp_err *err)
{
    if (h->magic != SP_PROTO_MAGIC)
        return sp_errf(err, SP_ERR_FORMAT, "bad magic 0x%08" PRIx32 " (expected 0x%08x, \"SEPL\")", h->magic,
                       SP_PROTO_MAGIC);
    if (h->major != SP_PROTO_MAJOR)
        return sp_errf(err, SP_ERR_UNSUPPORTED, "peer speaks protocol %u.%u, we speak %d.%d", h->major, h->minor,
                       SP_PROTO_MAJOR, SP_PROTO_MINOR);
    if (!type_known(h->type))
        return sp_errf(err, SP_ERR_UNSUPPORTED, "unknown message type %u (known: 1..%d)", h->type, SP_MSG__END - 1);
    if (h->flags & ~KNOWN_FLAGS)
        return sp_errf(err, SP_ERR_FORMAT, "unknown flag bits 0x%04x in flags 0x%04x", h->flags & ~KNOWN_FLAGS,
                       h->flags);
    if (h->reserved)
        return sp_errf(err, SP_ERR_FORMAT, "header reserved field is %" PRIu32 ", must be 0", h->reserved);
    return SP_OK;
}

static sp_status check_sizes(const sp_msg_header *h, const sp_proto_limits *lim, sp_err *err)
{
    if (h->n_tensors > SP_PROTO_MAX_TENSORS)
        return sp_errf(err, SP_ERR_FORMAT, "%" PRIu32 " tensors, at most %d allowed", h->n_tensors,
                       SP_PROTO_MAX_TENSORS);
    if (h->meta_len > lim->max_meta)
        return sp_errf(err, SP_ERR_RANGE, "metadata of %" PRIu32 " bytes exceeds the limit of %" PRIu32,
                       h->meta_len, lim->max_meta);
    if (h->body_len > UINT64_MAX - SP_PROTO_HEADER_SIZE || SP_PROTO_HEADER_SIZE + h->body_len > lim->max_message)
        return sp_errf(err, SP_ERR_RANGE, "message of 40 + %" PRIu64 " bytes exceeds the limit of %" PRIu64,
                       h->body_len, lim->max_message);
    /* cannot overflow: meta_len < 2^32, n_tensors <= 8 */
    uint64_t fixed = (uint64_t)h->meta_len + (uint64_t)h->n_tensors * SP_PROTO_DESC_SIZE;
    if (fixed > h->body_len)
        return sp_errf(err, SP_ERR_FORMAT,
                       "body of %" PRIu64 " bytes cannot hold %" PRIu32 " bytes of metadata and %" PRIu32
                       " descriptors (%" PRIu64 " bytes)",
                       h->body_len, h->meta_len, h->n_tensors, fixed);
    return SP_OK;
}

sp_status sp_msg_peek(const uint8_t *buf, size_t len, const sp_proto_limits *lim, uint64_t *body_len, sp_err *err)
{
    sp_proto_limits dl = sp_proto_default_limits();
    sp_msg_header h;
    if (!lim)
        lim = &dl;
    if (!buf && len)
        return sp_errf(err, SP_ERR_ARG, "sp_msg_peek: no buffer");
    if (!sp_msg_header_read(buf, len, &h))
        return sp_errf(err, SP_ERR_FORMAT, "truncated header: %zu bytes, need %d", len, SP_PROTO_HEADER_SIZE);
    sp_status s = check_identity(&h, err);
    if (!s)
        s = check_sizes(&h, lim, err);
    if (!s && body_len)
        *body_len = h.body_len;
    return s;
}

const char *sp_msg_reject_code(const uint8_t *buf, size_t len, sp_status s)
{
    sp_msg_header h;
    if (s == SP_ERR_NOMEM)
        return "internal";
    if (!sp_msg_header_read(buf, len, &h) || h.magic != SP_PROTO_MAGIC)
        return "malformed";
    if (h.major != SP_PROTO_MAJOR)
        return "version";
    if (!type_known(h.type))
        return "unknown_type";
    return "malformed";
}

/* ---------------------------------------------------------------------------------------------- */
/* metadata */

/* Length of the longest prefix of s that is valid UTF-8 without NUL bytes (n if all of it is): strict,
 * so overlong forms, surrogates and code points above U+10FFFF are refused. */
static size_t utf8_valid_prefix(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t need;
        uint32_t cp, min;
        if (c == 0)
            return i;
        if (c < 0x80) {
            i++;
            continue;
        }
        if ((c & 0xe0) == 0xc0)
            need = 1, cp = c & 0x1fu, min = 0x80;
        else if ((c & 0xf0) == 0xe0)
            need = 2, cp = c & 0x0fu, min = 0x800;
        else if ((c & 0xf8) == 0xf0)
            need = 3, cp = c & 0x07u, min = 0x10000;
        else
            return i;
        if (n - i <= need)
            return i;
        for (size_t k = 1; k <= need; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return i;
            cp = (cp << 6) | (s[i + k] & 0x3fu);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return i;
        i += need + 1;
    }
    return n;
}

/* A strict JSON reader (RFC 8259) over the metadata in place: it checks a message's metadata and finds its
 * top-level members without building a tree, so decoding a message allocates nothing. Its text was checked
 * for UTF-8 (no NUL bytes) first. Nesting is limited like cJSON's, so that whatever passes here cJSON parses too
 * (sp_msg_meta). */
#define META_MAX_DEPTH 1000

typedef struct jcur {
    const char *p, *end;
} jcur;

static void j_space(jcur *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static int j_hex4(const char *p, const char *end, unsigned *out)
{
    unsigned v = 0;
    if (end - p < 4)
        return -1;
    for (int i = 0; i < 4; i++) {
        char ch = p[i];
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        v = v << 4 | (unsigned)d;
    }
    *out = v;
    return 0;
}

/* Reads the string at c->p (its opening quote), unescaped into out[0..cap) when out is non-NULL (*len: its
 * whole unescaped length, which may exceed cap); leaves c->p after the closing quote. -1 if malformed: a raw
 * control character, an unknown escape, a \u that is not 4 hex digits or a lone surrogate (cJSON refuses those
 * too). */
static int j_string(jcur *c, char *out, size_t cap, size_t *len)
{
    size_t n = 0;
    if (c->p >= c->end || *c->p != '"')
        return -1;
    c->p++;
    for (;;) {
        if (c->p >= c->end)
            return -1;
        unsigned char ch = (unsigned char)*c->p++;
        char buf[4];
        size_t k = 1;
        if (ch == '"')
            break;
        if (ch < 0x20)
            return -1;
        buf[0] = (char)ch;
        if (ch == '\\') {
            if (c->p >= c->end)
                return -1;
            char e = *c->p++;
            unsigned cp;
            switch (e) {
            case '"': case '\\': case '/': buf[0] = e; break;
            case 'b': buf[0] = '\b'; break;
            case 'f': buf[0] = '\f'; break;
            case 'n': buf[0] = '\n'; break;
            case 'r': buf[0] = '\r'; break;
            case 't': buf[0] = '\t'; break;
            case 'u':
                if (j_hex4(c->p, c->end, &cp))
                    return -1;
                c->p += 4;
                if (cp >= 0xdc00 && cp <= 0xdfff)
                    return -1;
                if (cp >= 0xd800 && cp <= 0xdbff) { /* a high surrogate: its low one must follow */
                    unsigned lo;
                    if (c->end - c->p < 6 || c->p[0] != '\\' || c->p[1] != 'u' || j_hex4(c->p + 2, c->end, &lo) ||
                        lo < 0xdc00 || lo > 0xdfff)
                        return -1;
                    c->p += 6;
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                }
                if (cp < 0x80) {
                    buf[0] = (char)cp;
                } else if (cp < 0x800) {
                    buf[0] = (char)(0xc0 | cp >> 6), buf[1] = (char)(0x80 | (cp & 0x3f)), k = 2;
                } else if (cp < 0x10000) {
                    buf[0] = (char)(0xe0 | cp >> 12), buf[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
                    buf[2] = (char)(0x80 | (cp & 0x3f)), k = 3;
                } else {
                    buf[0] = (char)(0xf0 | cp >> 18), buf[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
                    buf[2] = (char)(0x80 | ((cp >> 6) & 0x3f)), buf[3] = (char)(0x80 | (cp & 0x3f)), k = 4;
                }
                break;
            default: return -1;
            }
        }
        for (size_t i = 0; out && i < k; i++)
            if (n + i < cap)
                out[n + i] = buf[i];
        n += k;
    }
    if (len)
        *len = n;
    return 0;
}

static int j_digits(jcur *c)
{
    const char *p0 = c->p;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9')
        c->p++;
    return c->p > p0 ? 0 : -1;
}

/* -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
static int j_number(jcur *c)
{
    if (c->p < c->end && *c->p == '-')
        c->p++;
    if (c->p < c->end && *c->p == '0')
        c->p++;
    else if (j_digits(c))
        return -1;
    if (c->p < c->end && *c->p == '.') {
        c->p++;
        if (j_digits(c))
            return -1;
    }
    if (c->p < c->end && (*c->p == 'e' || *c->p == 'E')) {
        c->p++;
        if (c->p < c->end && (*c->p == '+' || *c->p == '-'))
            c->p++;
        if (j_digits(c))
            return -1;
    }
    return 0;
}

static int j_literal(jcur *c, const char *lit)
{
    size_t n = strlen(lit);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, lit, n) != 0)
        return -1;
    c->p += n;
    return 0;
}

/* A scalar at c->p (string, number, true, false, null). */
static int j_scalar(jcur *c)
{
    if (c->p >= c->end)
        return -1;
    switch (*c->p) {
    case '"': return j_string(c, NULL, 0, NULL);
    case 't': return j_literal(c, "true");
    case 'f': return j_literal(c, "false");
    case 'n': return j_literal(c, "null");
    default: return *c->p == '-' || (*c->p >= '0' && *c->p <= '9') ? j_number(c) : -1;
    }
}

/* One whole value at c->p, containers included (iterative: the nesting is a bit stack, 1 = object). */
static int j_value(jcur *c)
{
    uint8_t stack[(META_MAX_DEPTH + 7) / 8];
    int depth = 0;
    for (;;) {
        j_space(c);
        if (c->p < c->end && (*c->p == '{' || *c->p == '[')) { /* open a container */
            int obj = *c->p++ == '{';
            if (depth >= META_MAX_DEPTH)
                return -1;
            if (obj)
                stack[depth / 8] |= (uint8_t)(1u << (depth % 8));
            else
                stack[depth / 8] &= (uint8_t)~(1u << (depth % 8));
            depth++;
            j_space(c);
            if (c->p < c->end && *c->p == (obj ? '}' : ']')) {
                c->p++;
                depth--;
            } else if (obj) { /* its first key */
                if (j_string(c, NULL, 0, NULL))
                    return -1;
                j_space(c);
                if (c->p >= c->end || *c->p++ != ':')
                    return -1;
                continue;
            } else {
                continue; /* its first element */
            }
        } else if (j_scalar(c)) {
            return -1;
        }
        /* after a value: the end, a separator, or closing brackets */
        for (;;) {
            if (depth == 0)
                return 0;
            int obj = stack[(depth - 1) / 8] >> ((depth - 1) % 8) & 1;
            j_space(c);
            if (c->p >= c->end)
                return -1;
            char ch = *c->p++;
            if (ch == (obj ? '}' : ']')) {
                depth--;
                continue;
            }
            if (ch != ',')
                return -1;
            if (obj) {
                j_space(c);
                if (j_string(c, NULL, 0, NULL))
                    return -1;
                j_space(c);
                if (c->p >= c->end || *c->p++ != ':')
                    return -1;
            }
            break;
        }
    }
}

/* Checks n bytes of metadata: valid UTF-8 without NUL bytes, one JSON object, nothing else but whitespace (an
 * empty text stands for {}). Allocates nothing. */
static sp_status check_meta(const uint8_t *p, size_t n, sp_err *err)
{
    size_t ok = utf8_valid_prefix(p, n);
    if (ok != n)
        return sp_errf(err, SP_ERR_FORMAT, "metadata is not valid UTF-8 (byte %zu of %zu: 0x%02x)", ok, n, p[ok]);
    jcur c = {(const char *)p, (const char *)p + n};
    if (n >= 3 && p[0] == 0xef && p[1] == 0xbb && p[2] == 0xbf)
        c.p += 3; /* a byte order mark, as cJSON allows */
    j_space(&c);
    if (c.p == c.end && c.p == (const char *)p)
        return SP_OK;
    int object = c.p < c.end && *c.p == '{';
    if (j_value(&c) == 0) {
        j_space(&c);
        if (c.p == c.end)
            return object ? SP_OK : sp_errf(err, SP_ERR_FORMAT, "metadata is JSON but not an object");
    }
    return sp_errf(err, SP_ERR_FORMAT, "metadata is not valid JSON (near byte %zu of %zu)",
                   (size_t)(c.p - (const char *)p), n);
}

/* The value of the first top-level member named key in the (checked) metadata, or NULL. */
static const char *meta_find(const sp_msg *m, const char *key)
{
    if (!m || !key || !m->meta_json || !m->meta_len)
        return NULL;
    jcur c = {m->meta_json, m->meta_json + m->meta_len};
    size_t want = strlen(key);
    while (c.p < c.end && *c.p != '{')
        c.p++;
    c.p++;
    for (;;) {
        j_space(&c);
        if (c.p >= c.end || *c.p != '"')
            return NULL; /* "}": not there */
        char name[256];
        size_t len = 0;
        if (j_string(&c, name, sizeof name, &len))
            return NULL;
        j_space(&c);
        c.p++; /* ':' */
        j_space(&c);
        if (len == want && len <= sizeof name && memcmp(name, key, len) == 0)
            return c.p;
        if (j_value(&c))
            return NULL;
        j_space(&c);
        if (c.p >= c.end || *c.p++ != ',')
            return NULL;
    }
}

struct cJSON *sp_msg_meta(const sp_msg *m)
{
    if (!m)
        return NULL;
    sp_msg *w = (sp_msg *)m; /* the tree is a cache of the text: building it changes nothing a reader sees */
    if (!w->meta)
        w->meta = m->meta_len ? cJSON_ParseWithLength(m->meta_json, m->meta_len) : cJSON_CreateObject();
    return w->meta;
}

const char *sp_meta_str(const sp_msg *m, const char *key)
{
    const char *v = meta_find(m, key);
    if (!v || *v != '"')
        return NULL;
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(sp_msg_meta(m), key);
    return cJSON_IsString(s) ? s->valuestring : NULL;
}

int sp_meta_strcpy(const sp_msg *m, const char *key, char *out, size_t cap)
{
    const char *v = meta_find(m, key);
    size_t len = 0;
    if (!out || !cap)
        return 0;
    out[0] = '\0';
    if (!v || *v != '"')
        return 0;
    jcur c = {v, m->meta_json + m->meta_len};
    if (j_string(&c, out, cap - 1, &len) || len > cap - 1) {
        out[0] = '\0';
        return 0;
    }
    out[len] = '\0';
    return 1;
}

int sp_meta_num(const sp_msg *m, const char *key, double *out)
{
    const char *v = meta_find(m, key);
    if (out)
        *out = 0;
    if (!v || !(*v == '-' || (*v >= '0' && *v <= '9')))
        return 0;
    jcur c = {v, m->meta_json + m->meta_len};
    j_number(&c);
    size_t n = (size_t)(c.p - v);
    double d = 0;
    int plain = n - (*v == '-') <= 15; /* up to 15 digits: exact in a double, read directly */
    for (size_t i = *v == '-'; plain && i < n; i++)
        plain = v[i] >= '0' && v[i] <= '9';
    if (plain) {
        for (size_t i = *v == '-'; i < n; i++)
            d = d * 10 + (v[i] - '0');
        d = *v == '-' ? -d : d;
    } else { /* strtod on a copy, with the locale's decimal point as cJSON does */
        char small[64], *s = n < sizeof small ? small : malloc(n + 1);
        if (!s)
            return 0;
        char point = localeconv()->decimal_point[0];
        for (size_t i = 0; i < n; i++)
            s[i] = v[i] == '.' ? point : v[i];
        s[n] = '\0';
        d = strtod(s, NULL);
        if (s != small)
            free(s);
    }
    if (out)
        *out = d;
    return 1;
}

int sp_meta_int(const sp_msg *m, const char *key, int64_t *out)
{
    double d = NAN;
    if (!sp_meta_num(m, key, &d))
        d = NAN;
    /* the range test also excludes NaN; 2^63 itself does not fit int64 */
    int ok = d >= -9223372036854775808.0 && d < 9223372036854775808.0 && d == floor(d);
    if (out)
        *out = ok ? (int64_t)d : -1;
    return ok;
}

/* ---------------------------------------------------------------------------------------------- */
/* descriptors and tensor views */

static void format_shape(char *buf, size_t cap, int rank, const int64_t *shape)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int k = 0; k < rank && used < cap; k++) {
        int w = snprintf(buf + used, cap - used, "%s%" PRId64, k ? ", " : "[", shape[k]);
        used += w > 0 ? (size_t)w : 0;
    }
    if (used < cap)
        snprintf(buf + used, cap - used, "]");
}

/* Checks the shape (rank dims >= 1, unused dims 0) and computes the element count, overflow-checked. The
 * caller prefixes the message with the tensor. */
static sp_status shape_numel(int rank, const int64_t *shape, uint64_t *numel, sp_err *err)
{
    uint64_t n = 1;
    if (rank < 1 || rank > SP_PROTO_MAX_RANK)
        return sp_errf(err, SP_ERR_FORMAT, "rank %d, must be 1..%d", rank, SP_PROTO_MAX_RANK);
    for (int k = 0; k < rank; k++) {
        if (shape[k] < 1)
            return sp_errf(err, SP_ERR_FORMAT, "dimension %d is %" PRId64 ", must be >= 1", k, shape[k]);
        if (n > UINT64_MAX / (uint64_t)shape[k]) {
            char sh[160];
            format_shape(sh, sizeof sh, rank, shape);
            return sp_errf(err, SP_ERR_FORMAT, "shape %s has more than 2^64 elements", sh);
        }
        n *= (uint64_t)shape[k];
    }
    *numel = n;
    return SP_OK;
}

/* Decodes and checks descriptor i (at d) into t, all but the data pointer. */
static sp_status read_desc(sp_tensor_view *t, const uint8_t *d, int i, uint64_t max_message, sp_err *err)
{
    unsigned enc = d[D_ENC], rank = d[D_RANK];
    uint16_t r16 = get_u16(d + D_RES16);
    uint32_t r32 = get_u32(d + D_RES32);
    if (!enc_known((int)enc))
        return sp_errf(err, SP_ERR_UNSUPPORTED, "tensor %d: unknown encoding %u", i, enc);
    if (r16 || r32)
        return sp_errf(err, SP_ERR_FORMAT, "tensor %d: descriptor reserved fields are %u and %" PRIu32 ", must be 0",
                       i, r16, r32);
    int64_t shape[SP_PROTO_MAX_RANK];
    for (int k = 0; k < SP_PROTO_MAX_RANK; k++) {
        uint64_t u = get_u64(d + D_SHAPE + 8 * k);
        shape[k] = u <= (uint64_t)INT64_MAX ? (int64_t)u : -(int64_t)(~u) - 1; /* two's complement, portably */
    }
    uint64_t numel = 0;
    sp_status s = shape_numel((int)rank, shape, &numel, err);
    if (s)
        return sp_err_prefix(err, "tensor %d: ", i);
    for (unsigned k = rank; k < SP_PROTO_MAX_RANK; k++)
        if (shape[k] != 0)
            return sp_errf(err, SP_ERR_FORMAT, "tensor %d: unused dimension %u (rank %u) is %" PRId64 ", must be 0",
                           i, k, rank, shape[k]);
    if (numel > max_message)
        return sp_errf(err, SP_ERR_RANGE, "tensor %d: %" PRIu64 " elements exceed the message limit of %" PRIu64
                       " bytes", i, numel, max_message);
    int ok = 0;
    uint64_t want = sp_encoding_bytes((int)enc, numel, &ok), byte_len = get_u64(d + D_BYTELEN);
    if (!ok)
        return sp_errf(err, SP_ERR_FORMAT, "tensor %d: %" PRIu64 " x %s overflows 64 bits (byte length %" PRIu64 ")", i,
                       numel, enc_names[enc], byte_len);
    if (byte_len != want)
        return sp_errf(err, SP_ERR_FORMAT, "tensor %d: byte length %" PRIu64 " does not match %" PRIu64
                       " x %s = %" PRIu64, i, byte_len, numel, enc_names[enc], want);
    t->enc = (sp_encoding)enc;
    t->rank = (int)rank;
    memcpy(t->shape, shape, sizeof shape);
    t->numel = numel;
    t->nbytes = byte_len;
    return SP_OK;
}

/* Reads the descriptors after the metadata and points each view at its payload; the payloads must fill
 * the rest of the body exactly. */
static sp_status read_tensors(sp_msg *m, const sp_msg_header *h, const uint8_t *body, uint64_t max_message,
                              sp_err *err)
{
    uint64_t off = (uint64_t)h->meta_len + (uint64_t)h->n_tensors * SP_PROTO_DESC_SIZE; /* <= body_len */
    uint64_t left = h->body_len - off;
    for (uint32_t i = 0; i < h->n_tensors; i++) {
        const uint8_t *d = body + h->meta_len + (size_t)i * SP_PROTO_DESC_SIZE;
        sp_status s = read_desc(&m->t[i], d, (int)i, max_message, err);
        if (s)
            return s;
        if (m->t[i].nbytes > left)
            return sp_errf(err, SP_ERR_FORMAT, "tensor %" PRIu32 ": payload of %" PRIu64 " bytes runs past the end"
                           " of the message (%" PRIu64 " bytes left)", i, m->t[i].nbytes, left);
        m->t[i].data = body + off;
        off += m->t[i].nbytes;
        left -= m->t[i].nbytes;
    }
    if (left)
        return sp_errf(err, SP_ERR_FORMAT, "%" PRIu64 " bytes of trailing data after the last tensor payload", left);
    return SP_OK;
}

sp_status sp_msg_decode(sp_msg *m, const uint8_t *buf, size_t len, const sp_proto_limits *lim, sp_err *err)
{
    sp_proto_limits dl = sp_proto_default_limits();
    sp_msg_header h = {0};
    uint64_t body_len = 0;
    if (!m)
        return sp_errf(err, SP_ERR_ARG, "sp_msg_decode: no message");
    memset(m, 0, sizeof *m); /* a failed decode leaves nothing for sp_msg_clear to free */
    if (!lim)
        lim = &dl;
    sp_status s = sp_msg_peek(buf, len, lim, &body_len, err);
    if (s)
        return s;
    if (body_len != (uint64_t)(len - SP_PROTO_HEADER_SIZE))
        return sp_errf(err, SP_ERR_FORMAT, "body length %" PRIu64 " does not match the %zu bytes after the header",
                       body_len, len - SP_PROTO_HEADER_SIZE);
    sp_msg_header_read(buf, len, &h);
    const uint8_t *body = buf + SP_PROTO_HEADER_SIZE;
    s = read_tensors(m, &h, body, lim->max_message, err);
    if (!s)
        s = check_meta(body, h.meta_len, err);
    if (s) {
        memset(m, 0, sizeof *m);
        return s;
    }
    m->major = h.major;
    m->minor = h.minor;
    m->type = (sp_msg_type)h.type;
    m->flags = h.flags;
    m->request_id = h.request_id;
    m->meta_json = (const char *)body;
    m->meta_len = h.meta_len;
    m->n_tensors = (int)h.n_tensors;
    return SP_OK;
}

void sp_msg_clear(sp_msg *m)
{
    if (!m)
        return;
    cJSON_Delete(m->meta);
    memset(m, 0, sizeof *m);
}

/* A view built by hand could be inconsistent; one from sp_msg_decode always passes. */
static sp_status check_view(const sp_tensor_view *t, sp_err *err)
{
    int ok = 0;
    if (!t || !enc_known((int)t->enc))
        return sp_errf(err, SP_ERR_ARG, "tensor view with unknown encoding");
    uint64_t want = sp_encoding_bytes((int)t->enc, t->numel, &ok);
    if (!ok || want != t->nbytes || (t->nbytes && !t->data))
        return sp_errf(err, SP_ERR_ARG, "tensor view of %" PRIu64 " x %s has %" PRIu64 " bytes", t->numel,
                       enc_names[t->enc], t->nbytes);
    return SP_OK;
}

static void q8_decode(float *dst, const uint8_t *p, uint64_t numel)
{
    for (uint64_t b0 = 0; b0 < numel; b0 += SP_PROTO_Q8_BLOCK) {
        uint64_t nb = numel - b0 < SP_PROTO_Q8_BLOCK ? numel - b0 : SP_PROTO_Q8_BLOCK;
        float scale = get_f32(p);
        p += 4;
        for (uint64_t j = 0; j < nb; j++)
            dst[b0 + j] = scale * (float)get_i8(p[j]);
        p += nb;
    }
}

sp_status sp_tensor_to_f32(const sp_tensor_view *t, float *dst, sp_err *err)
{
    sp_status s = check_view(t, err);
    if (s)
        return s;
    if (!dst && t->numel)
        return sp_errf(err, SP_ERR_ARG, "sp_tensor_to_f32: no destination");
    const uint8_t *p = t->data;
    switch (t->enc) {
    case SP_ENC_F32:
        if (HOST_LE) {
            if (t->nbytes)
                memcpy(dst, p, (size_t)t->nbytes);
        } else {
            for (uint64_t i = 0; i < t->numel; i++)
                dst[i] = get_f32(p + 4 * i);
        }
        return SP_OK;
    case SP_ENC_F16:
        for (uint64_t i = 0; i < t->numel; i++)
            dst[i] = sp_f16_to_f32(get_u16(p + 2 * i));
        return SP_OK;
    case SP_ENC_BF16:
        for (uint64_t i = 0; i < t->numel; i++)
            dst[i] = sp_bf16_to_f32(get_u16(p + 2 * i));
        return SP_OK;
    case SP_ENC_Q8:
        q8_decode(dst, p, t->numel);
        return SP_OK;
    default:
        return sp_errf(err, SP_ERR_ARG, "cannot convert an %s tensor to f32", enc_names[t->enc]);
    }
}

sp_status sp_tensor_to_i64(const sp_tensor_view *t, int64_t *dst, sp_err *err)
{
    sp_status s = check_view(t, err);
    if (s)
        return s;
    if (!dst && t->numel)
        return sp_errf(err, SP_ERR_ARG, "sp_tensor_to_i64: no destination");
    if (t->enc == SP_ENC_I64) {
        for (uint64_t i = 0; i < t->numel; i++) {
            uint64_t u = get_u64(t->data + 8 * i);
            dst[i] = u <= (uint64_t)INT64_MAX ? (int64_t)u : -(int64_t)(~u) - 1;
        }
        return SP_OK;
    }
    if (t->enc == SP_ENC_I32) {
        for (uint64_t i = 0; i < t->numel; i++) {
            uint32_t u = get_u32(t->data + 4 * i);
            dst[i] = u <= (uint32_t)INT32_MAX ? (int64_t)u : (int64_t)u - 4294967296ll;
        }
        return SP_OK;
    }
    return sp_errf(err, SP_ERR_ARG, "cannot convert a %s tensor to integers", enc_names[t->enc]);
}

int sp_tensor_all_finite(const sp_tensor_view *t)
{
    if (check_view(t, NULL))
        return 0;
    const uint8_t *p = t->data;
    switch (t->enc) {
    case SP_ENC_F32:
        for (uint64_t i = 0; i < t->numel; i++)
            if ((get_u32(p + 4 * i) & 0x7f800000u) == 0x7f800000u)
                return 0;
        return 1;
    case SP_ENC_F16:
        for (uint64_t i = 0; i < t->numel; i++)
            if ((get_u16(p + 2 * i) & 0x7c00u) == 0x7c00u)
                return 0;
        return 1;
    case SP_ENC_BF16:
        for (uint64_t i = 0; i < t->numel; i++)
            if ((get_u16(p + 2 * i) & 0x7f80u) == 0x7f80u)
                return 0;
        return 1;
    case SP_ENC_Q8: /* the int8 values are finite; only the scales can be inf/NaN */
        for (uint64_t b0 = 0; b0 < t->numel; b0 += SP_PROTO_Q8_BLOCK) {
            if ((get_u32(p) & 0x7f800000u) == 0x7f800000u)
                return 0;
            p += 4 + (t->numel - b0 < SP_PROTO_Q8_BLOCK ? t->numel - b0 : SP_PROTO_Q8_BLOCK);
        }
        return 1;
    default:
        return 1; /* integers */
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* encoding */

/* Turns a message already in err into an argument error (the caller's input was at fault). */
static sp_status as_arg_error(sp_err *err)
{
    if (err)
        err->code = SP_ERR_ARG;
    return SP_ERR_ARG;
}

/* Checks one tensor to send and returns its payload size. */
static sp_status check_src(const sp_tensor_src *t, int i, uint64_t *nbytes, uint64_t *numel, sp_err *err)
{
    if (!enc_known((int)t->enc))
        return sp_errf(err, SP_ERR_ARG, "tensor %d: unknown encoding %d", i, (int)t->enc);
    sp_status s = shape_numel(t->rank, t->shape, numel, err);
    if (s) {
        sp_err_prefix(err, "tensor %d: ", i);
        return as_arg_error(err);
    }
    if (sp_encoding_is_float((int)t->enc) ? !t->f32 : !t->raw)
        return sp_errf(err, SP_ERR_ARG, "tensor %d: no %s data for a %s tensor", i,
                       sp_encoding_is_float((int)t->enc) ? "f32" : "raw", enc_names[t->enc]);
    int ok = 0;
    *nbytes = sp_encoding_bytes((int)t->enc, *numel, &ok);
    if (!ok)
        return sp_errf(err, SP_ERR_ARG, "tensor %d: %" PRIu64 " x %s does not fit 64 bits", i, *numel,
                       enc_names[t->enc]);
    return SP_OK;
}

static void write_desc(uint8_t *d, const sp_tensor_src *t, uint64_t nbytes)
{
    memset(d, 0, SP_PROTO_DESC_SIZE); /* reserved fields and unused dims */
    d[D_ENC] = (uint8_t)t->enc;
    d[D_RANK] = (uint8_t)t->rank;
    for (int k = 0; k < t->rank; k++)
        put_u64(d + D_SHAPE + 8 * k, (uint64_t)t->shape[k]);
    put_u64(d + D_BYTELEN, nbytes);
}

/* One Q8 block: scale = absmax/127 (0 for an all-zero block), values round(x/scale) in [-127, 127]. */
static void q8_block(uint8_t *out, const float *x, size_t nb)
{
    float amax = 0;
    for (size_t j = 0; j < nb; j++)
        amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    float scale = amax / 127.0f;
    put_f32(out, scale);
    for (size_t j = 0; j < nb; j++) {
        long q = 0;
        if (scale > 0) { /* a subnormal absmax can give scale 0: then every value rounds to 0 */
            float v = x[j] / scale;
            v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v; /* clamp before lrintf: no overflow */
            q = lrintf(v);
        }
        out[4 + j] = (uint8_t)(q & 0xff);
    }
}

static sp_status q8_encode(uint8_t *out, const float *x, uint64_t numel, int ti, sp_err *err)
{
    for (uint64_t i = 0; i < numel; i++)
        if (!isfinite(x[i]))
            return sp_errf(err, SP_ERR_ARG, "tensor %d: non-finite value %g at index %" PRIu64 " cannot be encoded"
                           " as q8", ti, (double)x[i], i);
    for (uint64_t b0 = 0; b0 < numel; b0 += SP_PROTO_Q8_BLOCK) {
        size_t nb = numel - b0 < SP_PROTO_Q8_BLOCK ? (size_t)(numel - b0) : SP_PROTO_Q8_BLOCK;
        q8_block(out, x + b0, nb);
        out += 4 + nb;
    }
    return SP_OK;
}

static void ints_encode(uint8_t *p, const sp_tensor_src *t, uint64_t numel)
{
    const uint8_t *raw = t->raw;
    size_t w = t->enc == SP_ENC_I64 ? 8 : 4;
    if (HOST_LE) {
        memcpy(p, raw, (size_t)numel * w);
        return;
    }
    for (uint64_t i = 0; i < numel; i++) {
        if (w == 8) {
            int64_t v;
            memcpy(&v, raw + 8 * i, 8);
            put_u64(p + 8 * i, (uint64_t)v);
        } else {
            int32_t v;
            memcpy(&v, raw + 4 * i, 4);
            put_u32(p + 4 * i, (uint32_t)v);
        }
    }
}

static sp_status payload_encode(uint8_t *p, const sp_tensor_src *t, uint64_t numel, int i, sp_err *err)
{
    switch (t->enc) {
    case SP_ENC_F32:
        if (HOST_LE)
            memcpy(p, t->f32, (size_t)numel * 4);
        else
            for (uint64_t k = 0; k < numel; k++)
                put_f32(p + 4 * k, t->f32[k]);
        return SP_OK;
    case SP_ENC_F16:
        for (uint64_t k = 0; k < numel; k++)
            put_u16(p + 2 * k, sp_f32_to_f16(t->f32[k]));
        return SP_OK;
    case SP_ENC_BF16:
        for (uint64_t k = 0; k < numel; k++)
            put_u16(p + 2 * k, sp_f32_to_bf16(t->f32[k]));
        return SP_OK;
    case SP_ENC_Q8:
        return q8_encode(p, t->f32, numel, i, err);
    default:
        ints_encode(p, t, numel);
        return SP_OK;
    }
}

static void write_header(uint8_t *p, int type, uint16_t flags, uint64_t request_id, uint32_t meta_len, int n,
                         uint64_t body_len)
{
    put_u32(p + H_MAGIC, SP_PROTO_MAGIC);
    put_u16(p + H_MAJOR, SP_PROTO_MAJOR);
    put_u16(p + H_MINOR, SP_PROTO_MINOR);
    put_u16(p + H_TYPE, (uint16_t)type);
    put_u16(p + H_FLAGS, flags);
    put_u32(p + H_NTENSORS, (uint32_t)n);
    put_u64(p + H_REQID, request_id);
    put_u32(p + H_METALEN, meta_len);
    put_u32(p + H_RESERVED, 0);
    put_u64(p + H_BODYLEN, body_len);
}

/* The metadata we send must pass the peer's decoder: UTF-8 JSON object, length in 32 bits. */
static sp_status check_meta_out(const char *meta, size_t n, sp_err *err)
{
    if (n > UINT32_MAX)
        return sp_errf(err, SP_ERR_ARG, "metadata of %zu bytes does not fit 32 bits", n);
    sp_status s = check_meta((const uint8_t *)meta, n, err);
    return s == SP_ERR_FORMAT ? as_arg_error(err) : s;
}

/* Validates everything to send and returns the body length. */
static sp_status plan_message(int type, uint16_t flags, const char *meta, size_t meta_len, const sp_tensor_src *t,
                              int n, uint64_t *nbytes, uint64_t *numel, uint64_t *body_len, sp_err *err)
{
    if (!type_known(type))
        return sp_errf(err, SP_ERR_ARG, "unknown message type %d", type);
    if (flags & ~KNOWN_FLAGS)
        return sp_errf(err, SP_ERR_ARG, "unknown flag bits 0x%04x", flags & ~KNOWN_FLAGS);
    if (n < 0 || n > SP_PROTO_MAX_TENSORS || (n > 0 && !t))
        return sp_errf(err, SP_ERR_ARG, "%d tensors (at most %d)", n, SP_PROTO_MAX_TENSORS);
    sp_status s = check_meta_out(meta, meta_len, err);
    if (s)
        return s;
    uint64_t body = meta_len + (uint64_t)n * SP_PROTO_DESC_SIZE;
    for (int i = 0; i < n; i++) {
        s = check_src(&t[i], i, &nbytes[i], &numel[i], err);
        if (s)
            return s;
        if (nbytes[i] > UINT64_MAX - body)
            return sp_errf(err, SP_ERR_ARG, "message body does not fit 64 bits");
        body += nbytes[i];
    }
    if (body > SIZE_MAX - SP_PROTO_HEADER_SIZE - SP_BUF_HEADROOM)
        return sp_errf(err, SP_ERR_ARG, "message of 40 + %" PRIu64 " bytes does not fit in memory", body);
    *body_len = body;
    return SP_OK;
}

sp_status sp_msg_encode(sp_buf *out, sp_msg_type type, uint16_t flags, uint64_t request_id, const char *meta_json,
                        const sp_tensor_src *t, int n, sp_err *err)
{
    uint64_t nbytes[SP_PROTO_MAX_TENSORS], numel[SP_PROTO_MAX_TENSORS], body_len = 0;
    if (!out)
        return sp_errf(err, SP_ERR_ARG, "sp_msg_encode: no output buffer");
    out->len = 0;
    size_t meta_len = meta_json ? strlen(meta_json) : 0;
    sp_status s = plan_message((int)type, flags, meta_json, meta_len, t, n, nbytes, numel, &body_len, err);
    if (!s)
        s = sp_buf_reserve(out, SP_PROTO_HEADER_SIZE + (size_t)body_len, err);
    if (s)
        return sp_err_prefix(err, "encoding %s: ", sp_msg_type_name((int)type));
    uint8_t *p = out->data;
    write_header(p, (int)type, flags, request_id, (uint32_t)meta_len, n, body_len);
    p += SP_PROTO_HEADER_SIZE;
    if (meta_len)
        memcpy(p, meta_json, meta_len);
    p += meta_len;
    for (int i = 0; i < n; i++, p += SP_PROTO_DESC_SIZE)
        write_desc(p, &t[i], nbytes[i]);
    for (int i = 0; i < n; i++) {
        s = payload_encode(p, &t[i], numel[i], i, err);
        if (s)
            return sp_err_prefix(err, "encoding %s: ", sp_msg_type_name((int)type));
        p += nbytes[i];
    }
    out->len = SP_PROTO_HEADER_SIZE + (size_t)body_len;
    return SP_OK;
}

/* Error text may come from anywhere (a file name, a peer's bytes): invalid UTF-8 becomes '?', so that the
 * reply always passes the peer's metadata check. */
static char *utf8_sanitize(const char *s)
{
    size_t n = strlen(s), i = 0;
    char *o = malloc(n + 1);
    if (!o)
        return NULL;
    while (i < n) {
        size_t ok = utf8_valid_prefix((const uint8_t *)s + i, n - i);
        memcpy(o + i, s + i, ok);
        i += ok;
        if (i < n)
            o[i++] = '?';
    }
    o[n] = '\0';
    return o;
}

sp_status sp_msg_encode_error(sp_buf *out, uint64_t request_id, const char *code, const char *message, sp_err *err)
{
    char *msg = utf8_sanitize(message ? message : "");
    char *cd = utf8_sanitize(code ? code : "internal");
    cJSON *o = cJSON_CreateObject();
    char *json = NULL;
    if (msg && cd && o && cJSON_AddStringToObject(o, "code", cd) && cJSON_AddStringToObject(o, "message", msg))
        json = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    free(msg);
    free(cd);
    if (!json) {
        if (out)
            out->len = 0;
        return sp_errf(err, SP_ERR_NOMEM, "out of memory for an ERROR reply");
    }
    sp_status s = sp_msg_encode(out, SP_MSG_ERROR, SP_MSG_F_REPLY, request_id, json, NULL, 0, err);
    cJSON_free(json);
    return s;
}
