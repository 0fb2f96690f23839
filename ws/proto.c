/* proto.c - the sepal wire protocol: explicit little-endian (de)serialisation, and a decoder that checks
 * every count, length and shape of an incoming message before reading through it. The layout is written
 * down in share/doc/protocol.md; the offsets below must match it (tests/test_proto.c pins them). */
#include "proto.h"

#include <inttypes.h>
#include <locale.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "half.h"
#include "hex.h"

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
    [SP_MSG_INFERENCE_PUSH] = "INFERENCE_PUSH",
    [SP_MSG_SPAN_PUSH] = "SPAN_PUSH",
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

/* A strict JSON reader (RFC 8259) over the metadata in place: it checks a message's metadata, and the typed
 * decoders below read their fields with it, without building a tree, so decoding allocates nothing. Its text was
 * checked for UTF-8 (no NUL bytes) first. Nesting is limited like cJSON's, so that whatever passes here cJSON (a
 * peer's, say) parses too: test_proto and the fuzz target check that. */
#define META_MAX_DEPTH 1000

typedef struct jcur {
    const char *p, *end;
} jcur;

static void j_space(jcur *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

/* The value of the digit ch in base (at most 16), or -1. */
static int digit_value(char ch, int base)
{
    int d = ch >= '0' && ch <= '9' ? ch - '0' : 99;
    if (ch >= 'a' && ch <= 'f')
        d = ch - 'a' + 10;
    else if (ch >= 'A' && ch <= 'F')
        d = ch - 'A' + 10;
    return d < base ? d : -1;
}

static int j_hex4(const char *p, const char *end, unsigned *out)
{
    unsigned v = 0;
    if (end - p < 4)
        return -1;
    for (int i = 0; i < 4; i++) {
        int d = digit_value(p[i], 16);
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

/* The number at c->p (checked JSON), read as a double the way cJSON reads it, into *out; c->p goes past it. -1 if
 * there is no number there. */
static int j_read_number(jcur *c, double *out)
{
    const char *v = c->p;
    if (v >= c->end || !(*v == '-' || (*v >= '0' && *v <= '9')) || j_number(c))
        return -1;
    size_t n = (size_t)(c->p - v);
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
            return -1;
        char point = localeconv()->decimal_point[0];
        for (size_t i = 0; i < n; i++)
            s[i] = v[i] == '.' ? point : v[i];
        s[n] = '\0';
        d = strtod(s, NULL);
        if (s != small)
            free(s);
    }
    *out = d;
    return 0;
}

char *sp_msg_meta_copy(const sp_msg *m)
{
    size_t n = m && m->meta_json ? m->meta_len : 0;
    char *s = malloc(n + 1);
    if (s && n)
        memcpy(s, m->meta_json, n);
    if (s)
        s[n] = '\0';
    return s;
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
    if (m)
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


/* ---------------------------------------------------------------------------------------------- */
/* typed metadata: each message kind's fields as a table, read and written by one reader and one writer */

typedef enum {
    K_INT,  /* a JSON integer into int or int64_t (by the member's size), within [lo, hi] */
    K_U64,  /* a JSON integer into uint64_t, within [lo, hi] (hi at most 2^53 - 1: exact in a double) */
    K_F64,  /* a finite JSON number into double, within [lo, hi] */
    K_BOOL, /* true or false into int (1, 0) */
    K_STR,  /* a string into char[size], at least lo bytes, no NUL */
    K_HEX,  /* a string of 2 x size hex digits into uint8_t[size] */
    K_X64,  /* a string of 1..16 hex digits into uint64_t */
    K_D64,  /* a string of 1..20 decimal digits into uint64_t */
    K_ENC,  /* a string naming a float encoding into int (SP_ENC_*) */
    K_OBJ,  /* an object, read by the table sub into the member */
} field_kind;

typedef struct meta_table meta_table;

typedef struct field {
    const char *key;
    field_kind kind;
    int req;              /* required: always written, and a decode without it fails */
    size_t off, size;     /* the member in the struct */
    double lo, hi;        /* numbers: the range; strings: lo is the shortest length */
    double absent;        /* optional numbers: the value that stands for "not there" */
    const meta_table *sub; /* K_OBJ */
} field;

/* The structs, by their place in sp_meta_codecs (which says their message and size). */
enum { M_HELLO_REQ, M_HELLO_REPLY, M_INFO_REPLY, M_FORWARD_REQ, M_BACKWARD_REQ, M_OPEN_REQ, M_OPEN_REPLY, M_STEP_REQ,
       M_STEP_REPLY, M_CLOSE_REQ, M_ERROR_REPLY, M_AUTH_HELLO, M_AUTH_CHALLENGE, M_AUTH_PROOF, M_AUTH_VERDICT, M_PUSH_REQ,
       M_FORWARD_REPLY, M_BACKWARD_REPLY, M_SPAN_PUSH_REQ, M__N,
       M_NESTED = -1 };
_Static_assert(M__N == SP_META_CODECS, "sp_meta_codecs lists every struct");

struct meta_table {
    const char *name; /* "INFERENCE_OPEN request"; a nested object's key */
    int id;           /* M_*, or M_NESTED for an object inside one */
    const field *f;
    int n;
    /* what no single field can say (the span of a HELLO reply): NULL, or the message of what is wrong */
    const char *(*check)(const void *v, char *why, size_t cap);
};

#define REQ 1
#define OPT 0
#define I32_MAX 2147483647.0
#define JSON_INT_MAX 9007199254740991.0 /* 2^53 - 1: any larger integer reads as a double >= 2^53, so is refused */
/* A field whose key is its member's name (FIELD_AS: another key). */
#define FIELD_AS(S, m, key, kind, req, lo, hi, absent)                                                                \
    { key, kind, req, offsetof(S, m), sizeof(((S *)0)->m), lo, hi, absent, NULL }
#define FIELD(S, m, kind, req, lo, hi, absent) FIELD_AS(S, m, #m, kind, req, lo, hi, absent)
#define COUNT(S, m) FIELD(S, m, K_INT, OPT, 0, JSON_INT_MAX, -1) /* an optional count: -1 absent */
#define NAME(S, m) FIELD(S, m, K_STR, OPT, 0, 0, 0)              /* an optional string: "" absent */
#define OBJECT(S, m, t) { #m, K_OBJ, OPT, offsetof(S, m), sizeof(((S *)0)->m), 0, 0, 0, &t }
#define SPAN(S) FIELD(S, start, K_INT, REQ, 0, I32_MAX, 0), FIELD(S, end, K_INT, REQ, 0, I32_MAX, 0) /* required */
#define REPLY_ENCODING(S) FIELD(S, reply_encoding, K_ENC, OPT, 0, 0, -1)
#define TABLE(name, id, fields, check) { name, id, fields, (int)(sizeof fields / sizeof *fields), check }

/* HELLO */

static const field hello_req_f[] = {
    NAME(sp_hello_req, version),
    NAME(sp_hello_req, client),
};
static const meta_table hello_req_t = TABLE("HELLO request", M_HELLO_REQ, hello_req_f, NULL);

static const field hello_reply_f[] = {
    NAME(sp_hello_reply, version),
    NAME(sp_hello_reply, server),
    FIELD(sp_hello_reply, model, K_STR, REQ, 1, 0, 0),
    FIELD(sp_hello_reply, config, K_X64, OPT, 0, 0, 0),
    NAME(sp_hello_reply, dtype),
    FIELD(sp_hello_reply, blocks, K_INT, OPT, 1, 1 << 20, 0),
    SPAN(sp_hello_reply),
    NAME(sp_hello_reply, id),
    FIELD(sp_hello_reply, bulk_port, K_INT, OPT, -1, 65535, 0),
    FIELD(sp_hello_reply, bulk_token, K_D64, OPT, 0, 0, 0),
    FIELD(sp_hello_reply, dht_port, K_INT, OPT, 0, 65535, 0),
    NAME(sp_hello_reply, addr),
    FIELD(sp_hello_reply, caps, K_INT, OPT, 0, I32_MAX, 0),
};

static const char *hello_reply_check(const void *v, char *why, size_t cap)
{
    const sp_hello_reply *h = v;
    if (h->start >= h->end)
        snprintf(why, cap, "the span %d:%d holds no block", h->start, h->end);
    else if (h->blocks && h->end > h->blocks)
        snprintf(why, cap, "the span %d:%d is not inside the model's %d blocks", h->start, h->end, h->blocks);
    else
        return NULL;
    return why;
}

static const meta_table hello_reply_t = TABLE("HELLO reply", M_HELLO_REPLY, hello_reply_f, hello_reply_check);

/* INFO */

static const field info_transport_f[] = {
    COUNT(sp_info_transport, conns),
    COUNT(sp_info_transport, pending),
    COUNT(sp_info_transport, accepted),
    COUNT(sp_info_transport, refused),
    COUNT(sp_info_transport, refused_ip),
    COUNT(sp_info_transport, handshake_timeouts),
    COUNT(sp_info_transport, idle_closed),
    COUNT(sp_info_transport, busy),
    COUNT(sp_info_transport, slow),
    COUNT(sp_info_transport, auth_failed),
    COUNT(sp_info_transport, waits),
    COUNT(sp_info_transport, paused),
    COUNT(sp_info_transport, delivered),
    COUNT(sp_info_transport, bulk_refused),
    COUNT(sp_info_transport, bulk_timeouts),
    COUNT(sp_info_transport, out_of_fds),
    COUNT(sp_info_transport, budget_used),
    COUNT(sp_info_transport, budget_peak),
    COUNT(sp_info_transport, budget),
    COUNT(sp_info_transport, budget_conn),
    FIELD(sp_info_transport, swarm_key, K_BOOL, OPT, 0, 1, -1),
};
static const meta_table info_transport_t = TABLE("transport", M_NESTED, info_transport_f, NULL);

static const field info_reply_f[] = {
    FIELD(sp_info_reply, model, K_STR, REQ, 1, 0, 0),
    NAME(sp_info_reply, architecture),
    SPAN(sp_info_reply),
    NAME(sp_info_reply, dtype),
    COUNT(sp_info_reply, weight_bytes),
    NAME(sp_info_reply, protocol),
    COUNT(sp_info_reply, hidden_size),
    NAME(sp_info_reply, family),
    COUNT(sp_info_reply, kv_heads),
    COUNT(sp_info_reply, head_dim),
    COUNT(sp_info_reply, cache_bytes_per_token),
    COUNT(sp_info_reply, cache_bytes_total),
    COUNT(sp_info_reply, cache_tokens_total),
    COUNT(sp_info_reply, cache_tokens_available),
    COUNT(sp_info_reply, max_batch_tokens),
    COUNT(sp_info_reply, max_length),
    FIELD(sp_info_reply, inference_rps, K_F64, OPT, 0, HUGE_VAL, 0),
    FIELD(sp_info_reply, forward_tps, K_F64, OPT, 0, HUGE_VAL, 0),
    NAME(sp_info_reply, public_name),
    COUNT(sp_info_reply, sessions),
    COUNT(sp_info_reply, kept_bytes),
    COUNT(sp_info_reply, requests),
    COUNT(sp_info_reply, batches),
    COUNT(sp_info_reply, batched_rows),
    COUNT(sp_info_reply, batch_peak),
    FIELD(sp_info_reply, queue_wait, K_F64, OPT, 0, HUGE_VAL, 0),
    FIELD(sp_info_reply, max_queue_wait, K_F64, OPT, 0, HUGE_VAL, 0),
    COUNT(sp_info_reply, passed_inference),
    COUNT(sp_info_reply, passed_training),
    NAME(sp_info_reply, device),
    OBJECT(sp_info_reply, transport, info_transport_t),
};
static const meta_table info_reply_t = TABLE("INFO reply", M_INFO_REPLY, info_reply_f, NULL);

/* FORWARD, BACKWARD */


/* A pass pushed from server to server (training): where the request's input comes from, where its output goes. */
#define SPAN_PUSH_FIELDS                                                                                              \
    FIELD(sp_span_req, await, K_U64, OPT, 0, JSON_INT_MAX, 0), FIELD(sp_span_req, await_token, K_X64, OPT, 0, 0, 0),  \
        NAME(sp_span_req, push_host), FIELD(sp_span_req, push_port, K_INT, OPT, 0, 65535, 0),                          \
        FIELD(sp_span_req, push_id, K_U64, OPT, 0, JSON_INT_MAX, 0), FIELD(sp_span_req, push_token, K_X64, OPT, 0, 0, 0)

static const field forward_req_f[] = {
    SPAN(sp_span_req),
    FIELD(sp_span_req, keep, K_U64, OPT, 0, JSON_INT_MAX, 0),
    REPLY_ENCODING(sp_span_req),
    SPAN_PUSH_FIELDS,
};
static const meta_table forward_req_t = TABLE("FORWARD request", M_FORWARD_REQ, forward_req_f, NULL);

static const field backward_req_f[] = {
    SPAN(sp_span_req),
    FIELD_AS(sp_span_req, keep, "kept", K_U64, OPT, 0, JSON_INT_MAX, 0),
    REPLY_ENCODING(sp_span_req),
    SPAN_PUSH_FIELDS,
};
static const meta_table backward_req_t = TABLE("BACKWARD request", M_BACKWARD_REQ, backward_req_f, NULL);

static const field span_reply_f[] = {
    FIELD(sp_span_reply, pushed, K_BOOL, OPT, 0, 1, 0),
    FIELD(sp_span_reply, rx_mbit, K_F64, OPT, 0, HUGE_VAL, 0),
};
static const meta_table forward_reply_t = TABLE("FORWARD reply", M_FORWARD_REPLY, span_reply_f, NULL);
static const meta_table backward_reply_t = TABLE("BACKWARD reply", M_BACKWARD_REPLY, span_reply_f, NULL);

static const field span_push_req_f[] = {
    FIELD(sp_span_push_req, id, K_U64, REQ, 0, JSON_INT_MAX, 0),
    FIELD(sp_span_push_req, token, K_X64, REQ, 0, 0, 0),
};
static const meta_table span_push_req_t = TABLE("SPAN_PUSH request", M_SPAN_PUSH_REQ, span_push_req_f, NULL);

/* inference sessions */

static const field open_req_f[] = {
    SPAN(sp_open_req),
    FIELD(sp_open_req, max_length, K_INT, REQ, 0, I32_MAX, 0),
    FIELD(sp_open_req, batch, K_INT, REQ, 0, I32_MAX, 0),
};
static const meta_table open_req_t = TABLE("INFERENCE_OPEN request", M_OPEN_REQ, open_req_f, NULL);

static const field open_reply_f[] = {
    FIELD(sp_open_reply, session, K_U64, REQ, 0, JSON_INT_MAX, 0),
    FIELD(sp_open_reply, max_length, K_INT, OPT, 0, I32_MAX, -1),
    FIELD(sp_open_reply, push_token, K_X64, OPT, 0, 0, 0),
};
static const meta_table open_reply_t = TABLE("INFERENCE_OPEN reply", M_OPEN_REPLY, open_reply_f, NULL);

static const field step_req_f[] = {
    FIELD(sp_step_req, session, K_U64, REQ, 0, JSON_INT_MAX, 0),
    FIELD(sp_step_req, start_from_position, K_INT, OPT, 0, I32_MAX, -1),
    REPLY_ENCODING(sp_step_req),
    FIELD(sp_step_req, step, K_U64, OPT, 0, JSON_INT_MAX, 0),
    FIELD(sp_step_req, await, K_BOOL, OPT, 0, 1, 0),
    NAME(sp_step_req, push_host),
    FIELD(sp_step_req, push_port, K_INT, OPT, 0, 65535, 0),
    FIELD(sp_step_req, push_session, K_U64, OPT, 0, JSON_INT_MAX, 0),
    FIELD(sp_step_req, push_token, K_X64, OPT, 0, 0, 0),
};
static const meta_table step_req_t = TABLE("INFERENCE_STEP request", M_STEP_REQ, step_req_f, NULL);

static const field step_reply_f[] = {
    FIELD(sp_step_reply, position, K_INT, REQ, 0, I32_MAX, 0),
    FIELD(sp_step_reply, pushed, K_BOOL, OPT, 0, 1, 0),
    FIELD(sp_step_reply, rx_mbit, K_F64, OPT, 0, HUGE_VAL, 0),
};
static const meta_table step_reply_t = TABLE("INFERENCE_STEP reply", M_STEP_REPLY, step_reply_f, NULL);

static const field close_req_f[] = {
    FIELD(sp_close_req, session, K_U64, REQ, 0, JSON_INT_MAX, 0),
};
static const meta_table close_req_t = TABLE("INFERENCE_CLOSE request", M_CLOSE_REQ, close_req_f, NULL);

static const field push_req_f[] = {
    FIELD(sp_push_req, session, K_U64, REQ, 0, JSON_INT_MAX, 0),
    FIELD(sp_push_req, token, K_X64, REQ, 0, 0, 0),
    FIELD(sp_push_req, step, K_U64, REQ, 0, JSON_INT_MAX, 0),
};
static const meta_table push_req_t = TABLE("INFERENCE_PUSH request", M_PUSH_REQ, push_req_f, NULL);

/* ERROR, AUTH */

static const field error_reply_f[] = {
    FIELD(sp_error_reply, code, K_STR, REQ, 1, 0, 0),
    NAME(sp_error_reply, message),
};
static const meta_table error_reply_t = TABLE("ERROR", M_ERROR_REPLY, error_reply_f, NULL);

static const field auth_hello_f[] = {
    FIELD(sp_auth_hello, nonce, K_HEX, REQ, 0, 0, 0),
    NAME(sp_auth_hello, swarm),
};
static const meta_table auth_hello_t = TABLE("AUTH request", M_AUTH_HELLO, auth_hello_f, NULL);

static const field auth_challenge_f[] = {
    FIELD(sp_auth_challenge, nonce, K_HEX, REQ, 0, 0, 0),
    FIELD(sp_auth_challenge, proof, K_HEX, REQ, 0, 0, 0),
};
static const meta_table auth_challenge_t = TABLE("AUTH challenge", M_AUTH_CHALLENGE, auth_challenge_f, NULL);

static const field auth_proof_f[] = {
    FIELD(sp_auth_proof, proof, K_HEX, REQ, 0, 0, 0),
};
static const meta_table auth_proof_t = TABLE("AUTH proof", M_AUTH_PROOF, auth_proof_f, NULL);

static const field auth_verdict_f[] = {
    FIELD(sp_auth_verdict, ok, K_BOOL, REQ, 0, 1, 0),
};
static const meta_table auth_verdict_t = TABLE("AUTH verdict", M_AUTH_VERDICT, auth_verdict_f, NULL);

/* ---------------------------------------------------------------------------------------------- */
/* the reader: a struct from a message's checked metadata, in one pass over its members */

/* A field's place in the struct at base. */
static void *member(void *base, const field *f) { return (char *)base + f->off; }
static const void *cmember(const void *base, const field *f) { return (const char *)base + f->off; }

static void put_int(void *p, const field *f, double d)
{
    if (f->kind == K_U64) {
        uint64_t u = (uint64_t)d;
        memcpy(p, &u, sizeof u);
    } else if (f->size == sizeof(int64_t)) {
        int64_t v = (int64_t)d;
        memcpy(p, &v, sizeof v);
    } else {
        int v = (int)d;
        memcpy(p, &v, sizeof v);
    }
}

static double get_num(const void *p, const field *f)
{
    if (f->kind == K_F64) {
        double d;
        memcpy(&d, p, sizeof d);
        return d;
    }
    if (f->kind == K_U64) {
        uint64_t u;
        memcpy(&u, p, sizeof u);
        return (double)u;
    }
    if (f->size == sizeof(int64_t)) {
        int64_t v;
        memcpy(&v, p, sizeof v);
        return (double)v;
    }
    int v;
    memcpy(&v, p, sizeof v);
    return v;
}

static int is_number_kind(field_kind k) { return k == K_INT || k == K_U64 || k == K_F64 || k == K_BOOL || k == K_ENC; }

/* Every optional number of the table at its absent value (the rest is zero already). */
static void set_absent(const meta_table *t, void *base)
{
    for (int i = 0; i < t->n; i++) {
        const field *f = &t->f[i];
        if (f->kind == K_OBJ)
            set_absent(f->sub, member(base, f));
        else if (is_number_kind(f->kind) && f->kind != K_F64)
            put_int(member(base, f), f, f->absent);
        else if (f->kind == K_F64)
            memcpy(member(base, f), &f->absent, sizeof(double));
    }
}

/* Where a field is, for messages: the message and the path of keys ("INFO reply: 'transport.busy'"). */
typedef struct where {
    const char *msg;    /* the message's name */
    const char *prefix; /* "" or "transport." */
} where;

static sp_status field_bad(sp_err *err, const where *w, const field *f, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static sp_status field_bad(sp_err *err, const where *w, const field *f, const char *fmt, ...)
{
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return sp_errf(err, SP_ERR_FORMAT, "%s: '%s%s' %s", w->msg, w->prefix, f->key, why);
}

/* What kind of JSON value starts at p, for messages. */
static const char *j_kind(const char *p, const char *end)
{
    if (p >= end)
        return "nothing";
    switch (*p) {
    case '"': return "a string";
    case '{': return "an object";
    case '[': return "an array";
    case 't': return "true";
    case 'f': return "false";
    case 'n': return "null";
    default: return "a number";
    }
}

static sp_status read_number(jcur *c, const field *f, void *p, const where *w, sp_err *err)
{
    const char *at = c->p;
    double d = 0;
    int ok = j_read_number(c, &d) == 0, len = (int)(c->p - at);
    const char *kind = ok ? "" : j_kind(at, c->end);
    if (f->kind == K_F64) {
        if (!ok || !isfinite(d) || d < f->lo || d > f->hi)
            return field_bad(err, w, f, "must be a finite number >= %g, got %s%.*s", f->lo, kind, ok ? len : 0, at);
        d += 0.0; /* -0 is 0 */
        memcpy(p, &d, sizeof d);
        return SP_OK;
    }
    /* an int member holds no more than an int does, whatever the row allows */
    int narrow = f->kind != K_U64 && f->size != sizeof(int64_t);
    double lo = narrow && f->lo < INT_MIN ? INT_MIN : f->lo, hi = narrow && f->hi > INT_MAX ? INT_MAX : f->hi;
    if (!ok || d != floor(d) || d < lo || d > hi)
        return field_bad(err, w, f, "must be an integer in %.0f..%.0f, got %s%.*s", lo, hi, kind, ok ? len : 0, at);
    put_int(p, f, d);
    return SP_OK;
}

/* A string value into out[0..cap) (NUL-terminated); *len its length. */
static sp_status read_string(jcur *c, const field *f, char *out, size_t cap, size_t *len, const where *w, sp_err *err)
{
    if (c->p >= c->end || *c->p != '"')
        return field_bad(err, w, f, "must be a string, got %s", j_kind(c->p, c->end));
    if (j_string(c, out, cap - 1, len))
        return field_bad(err, w, f, "is not a valid JSON string");
    if (*len > cap - 1)
        return field_bad(err, w, f, "is %zu bytes long, at most %zu allowed", *len, cap - 1);
    out[*len] = '\0';
    if (strlen(out) != *len)
        return field_bad(err, w, f, "holds a NUL character");
    return SP_OK;
}

/* digits (1..max of them, in base) as a uint64_t; -1 if not that or it overflows. */
static int parse_u64(const char *s, size_t n, int base, size_t max, uint64_t *out)
{
    uint64_t v = 0;
    if (n < 1 || n > max)
        return -1;
    for (size_t i = 0; i < n; i++) {
        int d = digit_value(s[i], base);
        if (d < 0 || v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base)
            return -1;
        v = v * (uint64_t)base + (uint64_t)d;
    }
    *out = v;
    return 0;
}

static sp_status read_text(jcur *c, const field *f, void *p, const where *w, sp_err *err)
{
    char buf[96];
    size_t len = 0;
    sp_status st = f->kind == K_STR ? read_string(c, f, p, f->size, &len, w, err)
                                    : read_string(c, f, buf, sizeof buf, &len, w, err);
    if (st)
        return st;
    switch (f->kind) {
    case K_STR:
        if (len < f->lo)
            return field_bad(err, w, f, "must not be empty");
        return SP_OK;
    case K_HEX:
        if (len != 2 * f->size || sp_hex_decode(buf, p, f->size))
            return field_bad(err, w, f, "must be %zu hex digits, got \"%.40s\"", 2 * f->size, buf);
        return SP_OK;
    case K_ENC: {
        int enc = sp_encoding_from_name(buf);
        if (enc < 0 || !sp_encoding_is_float(enc))
            return field_bad(err, w, f, "names no float encoding: '%.40s' (f32, f16, bf16, q8)", buf);
        memcpy(p, &enc, sizeof enc);
        return SP_OK;
    }
    default: { /* K_X64, K_D64 */
        uint64_t v = 0;
        int hex = f->kind == K_X64;
        if (parse_u64(buf, len, hex ? 16 : 10, hex ? 16 : 20, &v))
            return field_bad(err, w, f, "must be a string of %s, got \"%.40s\"",
                             hex ? "1..16 hex digits" : "decimal digits that fit 64 bits", buf);
        memcpy(p, &v, sizeof v);
        return SP_OK;
    }
    }
}

static sp_status read_object(const meta_table *t, jcur *c, void *base, const where *w, sp_err *err);

static sp_status read_field(jcur *c, const field *f, void *base, const where *w, sp_err *err)
{
    void *p = member(base, f);
    switch (f->kind) {
    case K_INT: case K_U64: case K_F64:
        return read_number(c, f, p, w, err);
    case K_BOOL: {
        int v = j_literal(c, "true") == 0 ? 1 : j_literal(c, "false") == 0 ? 0 : -1;
        if (v < 0)
            return field_bad(err, w, f, "must be true or false, got %s", j_kind(c->p, c->end));
        memcpy(p, &v, sizeof v);
        return SP_OK;
    }
    case K_OBJ: {
        char prefix[64];
        snprintf(prefix, sizeof prefix, "%s%s.", w->prefix, f->key);
        where in = {w->msg, prefix};
        if (c->p >= c->end || *c->p != '{')
            return field_bad(err, w, f, "must be an object, got %s", j_kind(c->p, c->end));
        return read_object(f->sub, c, p, &in, err);
    }
    default:
        return read_text(c, f, p, w, err);
    }
}

/* The field of t named by the key (len bytes, maybe with NULs), or -1. */
static int find_field(const meta_table *t, const char *key, size_t len)
{
    for (int i = 0; i < t->n; i++)
        if (strlen(t->f[i].key) == len && memcmp(t->f[i].key, key, len) == 0)
            return i;
    return -1;
}

/* The object at c->p ('{') into base: known members read (the first of a repeated key), others skipped. */
static sp_status read_object(const meta_table *t, jcur *c, void *base, const where *w, sp_err *err)
{
    uint64_t seen = 0;
    c->p++;
    j_space(c);
    while (c->p < c->end && *c->p != '}') {
        char key[64];
        size_t len = 0;
        if (j_string(c, key, sizeof key, &len))
            return sp_errf(err, SP_ERR_FORMAT, "%s: metadata is not valid JSON", w->msg);
        j_space(c);
        if (c->p >= c->end || *c->p++ != ':')
            return sp_errf(err, SP_ERR_FORMAT, "%s: metadata is not valid JSON", w->msg);
        j_space(c);
        int i = len <= sizeof key ? find_field(t, key, len) : -1;
        if (i >= 0 && !(seen >> i & 1)) {
            seen |= 1ull << i;
            sp_status st = read_field(c, &t->f[i], base, w, err);
            if (st)
                return st;
        } else if (j_value(c)) {
            return sp_errf(err, SP_ERR_FORMAT, "%s: metadata is not valid JSON", w->msg);
        }
        j_space(c);
        if (c->p < c->end && *c->p == ',')
            c->p++;
        j_space(c);
    }
    if (c->p >= c->end)
        return sp_errf(err, SP_ERR_FORMAT, "%s: metadata is not valid JSON", w->msg);
    c->p++; /* '}' */
    for (int i = 0; i < t->n; i++)
        if (t->f[i].req && !(seen >> i & 1))
            return field_bad(err, w, &t->f[i], "is missing");
    return SP_OK;
}

static sp_status meta_decode(const meta_table *t, const sp_msg *m, void *v, sp_err *err)
{
    const sp_meta_codec *k = &sp_meta_codecs[t->id];
    if (!m || !v)
        return sp_errf(err, SP_ERR_ARG, "decoding the %s: no message or no struct", t->name);
    memset(v, 0, k->size);
    set_absent(t, v);
    int reply = (m->flags & SP_MSG_F_REPLY) != 0;
    if (m->type != k->type || reply != (k->flags == SP_MSG_F_REPLY))
        return sp_errf(err, SP_ERR_FORMAT, "expected the %s, got %s %s", t->name, sp_msg_type_name((int)m->type),
                       reply ? "reply" : "request");
    static const char empty[] = "{}";
    jcur c = m->meta_len ? (jcur){m->meta_json, m->meta_json + m->meta_len} : (jcur){empty, empty + 2};
    while (c.p < c.end && *c.p != '{') /* a byte order mark, whitespace */
        c.p++;
    if (c.p >= c.end)
        return sp_errf(err, SP_ERR_FORMAT, "%s: metadata is not a JSON object", t->name);
    where w = {t->name, ""};
    sp_status st = read_object(t, &c, v, &w, err);
    char why[160];
    const char *bad = !st && t->check ? t->check(v, why, sizeof why) : NULL;
    return bad ? sp_errf(err, SP_ERR_FORMAT, "%s: %s", t->name, bad) : st;
}

/* ---------------------------------------------------------------------------------------------- */
/* the writer: a struct as compact JSON, its members in table order */

typedef struct jw {
    char *p;
    size_t n, cap;
    int full; /* something did not fit: the text is unusable */
} jw;

static void jw_raw(jw *w, const char *s, size_t k)
{
    if (w->full || k >= w->cap - w->n) { /* room for the NUL too */
        w->full = 1;
        return;
    }
    memcpy(w->p + w->n, s, k);
    w->n += k;
}

static void jw_lit(jw *w, const char *s) { jw_raw(w, s, strlen(s)); }

/* A JSON string: quotes, backslashes and control characters escaped as cJSON escapes them, the rest as it is. */
static void jw_str(jw *w, const char *s)
{
    jw_lit(w, "\"");
    for (const char *run = s;; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch && ch >= 0x20 && ch != '"' && ch != '\\')
            continue;
        jw_raw(w, run, (size_t)(s - run));
        run = s + 1;
        if (!ch)
            break;
        char esc[8];
        const char *named = ch == '"' ? "\\\"" : ch == '\\' ? "\\\\" : ch == '\b' ? "\\b" : ch == '\f' ? "\\f"
                          : ch == '\n' ? "\\n" : ch == '\r' ? "\\r" : ch == '\t' ? "\\t" : NULL;
        if (!named)
            snprintf(esc, sizeof esc, "\\u%04x", ch);
        jw_lit(w, named ? named : esc);
    }
    jw_lit(w, "\"");
}

/* A double as cJSON prints it: 15 significant digits, 17 when 15 do not read back the same; '.' whatever the
 * locale. */
static void jw_double(jw *w, double d)
{
    char num[40];
    snprintf(num, sizeof num, "%1.15g", d);
    if (strtod(num, NULL) != d)
        snprintf(num, sizeof num, "%1.17g", d);
    char point = localeconv()->decimal_point[0];
    for (char *c = num; *c; c++)
        if (*c == point)
            *c = '.';
    jw_lit(w, num);
}

static sp_status write_object(const meta_table *t, const void *base, jw *w, const where *at, sp_err *err);

/* A number field's value, checked against its range (an argument error: the caller's struct is at fault). Integers
 * are compared and printed as integers: a value past 2^53 is refused, never rounded. */
static sp_status write_number(const field *f, const void *p, jw *w, const where *at, sp_err *err)
{
    char num[32];
    int ok;
    if (f->kind == K_F64) {
        double d = get_num(p, f);
        if (!(isfinite(d) && d >= f->lo && d <= f->hi))
            return sp_errf(err, SP_ERR_ARG, "%s: '%s%s' is %g, not a finite number >= %g", at->msg, at->prefix,
                           f->key, d, f->lo);
        jw_double(w, d);
        return SP_OK;
    }
    if (f->kind == K_U64) {
        uint64_t u;
        memcpy(&u, p, sizeof u);
        ok = u <= (uint64_t)f->hi;
        snprintf(num, sizeof num, "%" PRIu64, u);
    } else {
        int64_t v;
        if (f->size == sizeof v) {
            memcpy(&v, p, sizeof v);
        } else {
            int i;
            memcpy(&i, p, sizeof i);
            v = i;
        }
        ok = v >= (int64_t)f->lo && v <= (int64_t)f->hi;
        snprintf(num, sizeof num, "%" PRId64, v);
    }
    if (!ok)
        return sp_errf(err, SP_ERR_ARG, "%s: '%s%s' is %s, outside %.0f..%.0f", at->msg, at->prefix, f->key, num, f->lo,
                       f->hi);
    jw_lit(w, f->kind == K_BOOL ? (num[0] == '1' ? "true" : "false") : num);
    return SP_OK;
}

static sp_status write_text(const field *f, const void *p, jw *w, const where *at, sp_err *err)
{
    char buf[96];
    uint64_t u;
    int enc;
    switch (f->kind) {
    case K_STR: {
        size_t n = strnlen(p, f->size);
        if (n == f->size || utf8_valid_prefix(p, n) != n || n < f->lo)
            return sp_errf(err, SP_ERR_ARG, "%s: '%s%s' is %s", at->msg, at->prefix, f->key,
                           n == f->size ? "not NUL-terminated" : n < f->lo ? "empty" : "not valid UTF-8");
        jw_str(w, p);
        return SP_OK;
    }
    case K_HEX:
        sp_hex_encode(p, f->size, buf);
        break;
    case K_ENC:
        memcpy(&enc, p, sizeof enc);
        if (!sp_encoding_is_float(enc))
            return sp_errf(err, SP_ERR_ARG, "%s: '%s%s' %d is not a float encoding", at->msg, at->prefix, f->key, enc);
        snprintf(buf, sizeof buf, "%s", enc_names[enc]);
        break;
    default:
        memcpy(&u, p, sizeof u);
        snprintf(buf, sizeof buf, f->kind == K_X64 ? "%016" PRIx64 : "%" PRIu64, u);
    }
    jw_str(w, buf);
    return SP_OK;
}

/* 1 if an optional field holds its absent value (it is left out). */
static int is_absent(const field *f, const void *p)
{
    if (f->req || f->kind == K_OBJ || f->kind == K_HEX)
        return 0;
    if (f->kind == K_STR)
        return *(const char *)p == '\0';
    if (f->kind == K_X64 || f->kind == K_D64) {
        uint64_t u;
        memcpy(&u, p, sizeof u);
        return u == 0;
    }
    return get_num(p, f) == f->absent;
}

static sp_status write_object(const meta_table *t, const void *base, jw *w, const where *at, sp_err *err)
{
    int first = 1;
    jw_lit(w, "{");
    for (int i = 0; i < t->n; i++) {
        const field *f = &t->f[i];
        const void *p = cmember(base, f);
        if (is_absent(f, p))
            continue;
        jw_lit(w, first ? "\"" : ",\"");
        jw_lit(w, f->key);
        jw_lit(w, "\":");
        first = 0;
        sp_status st;
        if (f->kind == K_OBJ) {
            char prefix[64];
            snprintf(prefix, sizeof prefix, "%s%s.", at->prefix, f->key);
            where in = {at->msg, prefix};
            st = write_object(f->sub, p, w, &in, err);
        } else {
            st = is_number_kind(f->kind) && f->kind != K_ENC ? write_number(f, p, w, at, err)
                                                              : write_text(f, p, w, at, err);
        }
        if (st)
            return st;
    }
    jw_lit(w, "}");
    return SP_OK;
}

static sp_status meta_encode(const meta_table *t, const void *v, char *out, size_t cap, sp_err *err)
{
    if (!v || !out || !cap)
        return sp_errf(err, SP_ERR_ARG, "encoding the %s: no struct or no room", t->name);
    out[0] = '\0';
    char why[160];
    const char *bad = t->check ? t->check(v, why, sizeof why) : NULL;
    if (bad)
        return sp_errf(err, SP_ERR_ARG, "%s: %s", t->name, bad);
    jw w = {out, 0, cap, 0};
    where at = {t->name, ""};
    sp_status st = write_object(t, v, &w, &at, err);
    if (!st && w.full)
        st = sp_errf(err, SP_ERR_RANGE, "%s: metadata does not fit %zu bytes", t->name, cap);
    out[st ? 0 : w.n] = '\0';
    return st;
}

/* One encode and one decode per struct, over its table (and the same behind sp_meta_codec's signatures). */
#define META_CODEC(name)                                                                                              \
    sp_status sp_##name##_encode(const sp_##name *v, char *out, size_t cap, sp_err *err)                             \
    {                                                                                                                 \
        return meta_encode(&name##_t, v, out, cap, err);                                                              \
    }                                                                                                                 \
    sp_status sp_##name##_decode(const sp_msg *m, sp_##name *v, sp_err *err)                                          \
    {                                                                                                                 \
        return meta_decode(&name##_t, m, v, err);                                                                     \
    }                                                                                                                 \
    static sp_status any_##name##_encode(const void *v, char *out, size_t cap, sp_err *err)                          \
    {                                                                                                                 \
        return meta_encode(&name##_t, v, out, cap, err);                                                              \
    }                                                                                                                 \
    static sp_status any_##name##_decode(const sp_msg *m, void *v, sp_err *err)                                       \
    {                                                                                                                 \
        return meta_decode(&name##_t, m, v, err);                                                                     \
    }

META_CODEC(hello_req)
META_CODEC(hello_reply)
META_CODEC(info_reply)
META_CODEC(forward_req)
META_CODEC(backward_req)
META_CODEC(open_req)
META_CODEC(open_reply)
META_CODEC(step_req)
META_CODEC(step_reply)
META_CODEC(close_req)
META_CODEC(error_reply)
META_CODEC(auth_hello)
META_CODEC(auth_challenge)
META_CODEC(auth_proof)
META_CODEC(auth_verdict)
META_CODEC(push_req)
META_CODEC(forward_reply)
META_CODEC(backward_reply)
META_CODEC(span_push_req)

#define CODEC(id, name, type, flags)                                                                                  \
    [id] = {#name, type, flags, sizeof(sp_##name), any_##name##_encode, any_##name##_decode}
const sp_meta_codec sp_meta_codecs[SP_META_CODECS] = {
    CODEC(M_HELLO_REQ, hello_req, SP_MSG_HELLO, 0),
    CODEC(M_HELLO_REPLY, hello_reply, SP_MSG_HELLO, SP_MSG_F_REPLY),
    CODEC(M_INFO_REPLY, info_reply, SP_MSG_INFO, SP_MSG_F_REPLY),
    CODEC(M_FORWARD_REQ, forward_req, SP_MSG_FORWARD, 0),
    CODEC(M_BACKWARD_REQ, backward_req, SP_MSG_BACKWARD, 0),
    CODEC(M_OPEN_REQ, open_req, SP_MSG_INFERENCE_OPEN, 0),
    CODEC(M_OPEN_REPLY, open_reply, SP_MSG_INFERENCE_OPEN, SP_MSG_F_REPLY),
    CODEC(M_STEP_REQ, step_req, SP_MSG_INFERENCE_STEP, 0),
    CODEC(M_STEP_REPLY, step_reply, SP_MSG_INFERENCE_STEP, SP_MSG_F_REPLY),
    CODEC(M_CLOSE_REQ, close_req, SP_MSG_INFERENCE_CLOSE, 0),
    CODEC(M_ERROR_REPLY, error_reply, SP_MSG_ERROR, SP_MSG_F_REPLY),
    CODEC(M_AUTH_HELLO, auth_hello, SP_MSG_AUTH, 0),
    CODEC(M_AUTH_CHALLENGE, auth_challenge, SP_MSG_AUTH, SP_MSG_F_REPLY),
    CODEC(M_AUTH_PROOF, auth_proof, SP_MSG_AUTH, 0),
    CODEC(M_AUTH_VERDICT, auth_verdict, SP_MSG_AUTH, SP_MSG_F_REPLY),
    CODEC(M_PUSH_REQ, push_req, SP_MSG_INFERENCE_PUSH, 0),
    CODEC(M_FORWARD_REPLY, forward_reply, SP_MSG_FORWARD, SP_MSG_F_REPLY),
    CODEC(M_BACKWARD_REPLY, backward_reply, SP_MSG_BACKWARD, SP_MSG_F_REPLY),
    CODEC(M_SPAN_PUSH_REQ, span_push_req, SP_MSG_SPAN_PUSH, 0),
};

/* ---------------------------------------------------------------------------------------------- */
/* ERROR replies */

/* Text that may come from anywhere (a file name, a peer's bytes) into out[0..cap): invalid UTF-8 becomes '?', and
 * what does not fit is cut at a character's start, so that the reply always passes the peer's checks. */
static void utf8_sanitize(char *out, size_t cap, const char *s)
{
    size_t n = strlen(s), i = 0;
    if (n > cap - 1) { /* cut where a character starts */
        n = cap - 1;
        while (n > 0 && ((unsigned char)s[n] & 0xc0) == 0x80)
            n--;
    }
    while (i < n) {
        size_t ok = utf8_valid_prefix((const uint8_t *)s + i, n - i);
        memcpy(out + i, s + i, ok);
        i += ok;
        if (i < n)
            out[i++] = '?';
    }
    out[n] = '\0';
}

void sp_meta_set(char *dst, size_t cap, const char *src) { utf8_sanitize(dst, cap, src ? src : ""); }

sp_status sp_msg_encode_error(sp_buf *out, uint64_t request_id, const char *code, const char *message, sp_err *err)
{
    sp_error_reply e;
    sp_meta_set(e.code, sizeof e.code, code && *code ? code : "internal");
    sp_meta_set(e.message, sizeof e.message, message);
    size_t cap = 6 * (sizeof e.code + sizeof e.message) + 64; /* every byte escaped as \u00XX */
    char *json = malloc(cap);
    sp_status st = json ? sp_error_reply_encode(&e, json, cap, err)
                        : sp_errf(err, SP_ERR_NOMEM, "out of memory for an ERROR reply");
    if (!st)
        st = sp_msg_encode(out, SP_MSG_ERROR, SP_MSG_F_REPLY, request_id, json, NULL, 0, err);
    else if (out)
        out->len = 0;
    free(json);
    return st;
}
