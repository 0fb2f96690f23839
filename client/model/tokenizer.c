/* tokenizer.c - tokenizer.json loader and BPE encode / decode, SentencePiece style (byte fallback) and byte-level
 * (GPT-2 / Llama-3) (see tokenizer.h). */
#include "tokenizer.h"

#include <cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define TOK_MAX_ID 10000000 /* ids above this are rejected as malformed */
#define TOK_MAX_PIECE 1000  /* longest piece, so SP_DETOK_BUF always suffices */
#define SPM_SPACE "\xE2\x96\x81"

typedef enum { NORM_PREPEND, NORM_PREPEND_IF_MISSING, NORM_REPLACE } norm_kind;

/* Byte-level pre-tokenization: none (the whole text is one word), the GPT-2 regex, or the Llama-3 one. */
typedef enum { SPLIT_NONE, SPLIT_GPT2, SPLIT_LLAMA3 } split_kind;

/* One normalisation step: prepend `a`, or replace every `a` by `b`. */
typedef struct norm_op {
    norm_kind kind;
    char *a, *b;
} norm_op;

typedef struct pair_entry {
    uint64_t key; /* (left + 1) << 32 | (right + 1); 0 = empty slot */
    int merged;
    int prio; /* rank of the first merge producing `merged` */
} pair_entry;

struct sp_tokenizer {
    sp_tok_kind kind;
    int n_vocab;
    char **piece;       /* tokenizer.json spelling by id; NULL where an id is unused */
    size_t *piece_len;
    char **text;        /* decoded text of ordinary pieces ("▁" -> " ") */
    size_t *text_len;
    short *byte_of;     /* byte value of a <0xXX> token, else -1 */
    unsigned char *special;
    int byte_id[256];   /* id of <0xXX>, or -1 */
    int unk, bos, eos, add_bos, add_eos, byte_fallback, fuse_unk;
    norm_op norm[8];
    int n_norm;
    char *word_mark;    /* Metaspace split: each occurrence starts a word that merges never cross */
    int *slot;          /* piece -> id hash (id + 1, 0 = empty) */
    size_t slot_mask;
    pair_entry *pairs;
    size_t pair_mask;
    /* byte-level BPE only */
    split_kind split;
    int max_digits;     /* SPLIT_LLAMA3: numbers are split into runs of at most this many digits */
    int prefix_space;   /* ByteLevel add_prefix_space: each text segment gets a leading " " if it lacks one */
    int ignore_merges;  /* a pre-token that is itself a vocab piece is taken whole */
    int tmpl_bos;       /* BOS that post_processor's template prepends, or -1 */
    int *spec;          /* special added tokens, by first byte then longest first */
    int spec_start[257]; /* spec[spec_start[b] .. spec_start[b + 1]) start with byte b */
};

/* Context while loading: the file being read, for error messages. */
typedef struct load_ctx {
    sp_tokenizer *t;
    const char *path;
    sp_err *err;
} load_ctx;

/* ---------------------------------------------------------------------------------------------- */
/* hashing */

static uint64_t hash_bytes(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h;
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c *= 2;
    return c;
}

/* Id of piece p[0..n), or -1. */
static int piece_find(const sp_tokenizer *t, const char *p, size_t n)
{
    for (size_t i = hash_bytes(p, n) & t->slot_mask;; i = (i + 1) & t->slot_mask) {
        int id = t->slot[i] - 1;
        if (id < 0)
            return -1;
        if (t->piece_len[id] == n && memcmp(t->piece[id], p, n) == 0)
            return id;
    }
}

static void piece_insert(sp_tokenizer *t, int id)
{
    size_t i = hash_bytes(t->piece[id], t->piece_len[id]) & t->slot_mask;
    while (t->slot[i])
        i = (i + 1) & t->slot_mask;
    t->slot[i] = id + 1;
}

static uint64_t pair_key(int a, int b) { return ((uint64_t)(unsigned)(a + 1) << 32) | (unsigned)(b + 1); }

static const pair_entry *pair_find(const sp_tokenizer *t, int a, int b)
{
    uint64_t key = pair_key(a, b);
    for (size_t i = hash_u64(key) & t->pair_mask;; i = (i + 1) & t->pair_mask) {
        if (t->pairs[i].key == key)
            return &t->pairs[i];
        if (t->pairs[i].key == 0)
            return NULL;
    }
}

/* Adds a merge unless the pair is already known (the first, best-ranked one wins). */
static void pair_insert(sp_tokenizer *t, int a, int b, int merged, int prio)
{
    uint64_t key = pair_key(a, b);
    size_t i = hash_u64(key) & t->pair_mask;
    for (; t->pairs[i].key; i = (i + 1) & t->pair_mask)
        if (t->pairs[i].key == key)
            return;
    t->pairs[i] = (pair_entry){.key = key, .merged = merged, .prio = prio};
}

/* ---------------------------------------------------------------------------------------------- */
/* small helpers */

static char *dup_n(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

/* Length of the UTF-8 character at s[0..n): 1-4 bytes, or 1 for a byte that does not start a valid one. */
static size_t char_len(const unsigned char *s, size_t n)
{
    size_t need = s[0] < 0x80 ? 1 : s[0] >= 0xC2 && s[0] <= 0xDF ? 2 : s[0] >= 0xE0 && s[0] <= 0xEF ? 3
                : s[0] >= 0xF0 && s[0] <= 0xF4 ? 4 : 1;
    if (need > n)
        return 1;
    for (size_t k = 1; k < need; k++)
        if ((s[k] & 0xC0) != 0x80)
            return 1;
    return need;
}

/* The code point of the UTF-8 character s[0..len) that char_len measured; -1 for a lone invalid byte. */
static long char_cp(const unsigned char *s, size_t len)
{
    if (len == 1)
        return s[0] < 0x80 ? s[0] : -1;
    long cp = s[0] & (0x7F >> len);
    for (size_t k = 1; k < len; k++)
        cp = cp << 6 | (s[k] & 0x3F);
    return cp;
}

/* Writes code point cp as UTF-8; returns its length. */
static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp >= 0x10000) {
        o[0] = (char)(0xF0 | cp >> 18);
        o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
        o[2] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[3] = (char)(0x80 | (cp & 0x3F));
        return 4;
    }
    o[0] = (char)(0xE0 | cp >> 12);
    o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
    o[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
}

/* Replaces every `from` in s[0..n) by `to`; returns a malloc'd string and its length in *out_n. */
static char *replace_all(const char *s, size_t n, const char *from, const char *to, size_t *out_n)
{
    size_t fl = strlen(from), tl = strlen(to), count = 0;
    for (size_t i = 0; fl && i + fl <= n;)
        i += memcmp(s + i, from, fl) == 0 ? (count++, fl) : 1;
    size_t len = n - count * fl + count * tl;
    char *r = malloc(len + 1), *o = r;
    if (!r)
        return NULL;
    for (size_t i = 0; i < n;) {
        if (fl && i + fl <= n && memcmp(s + i, from, fl) == 0) {
            memcpy(o, to, tl);
            o += tl;
            i += fl;
        } else {
            *o++ = s[i++];
        }
    }
    *o = '\0';
    *out_n = len;
    return r;
}

static sp_status read_text(const char *path, char **buf, size_t *n, sp_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return sp_errf(err, errno == ENOENT ? SP_ERR_NOTFOUND : SP_ERR_IO, "%s: %s", path, strerror(errno));
    long sz = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    char *b = sz >= 0 && fseek(f, 0, SEEK_SET) == 0 ? malloc((size_t)sz + 1) : NULL;
    int ok = b && fread(b, 1, (size_t)sz, f) == (size_t)sz;
    fclose(f);
    if (!ok) {
        free(b);
        return sp_errf(err, SP_ERR_IO, "%s: read failed", path);
    }
    b[sz] = '\0';
    *buf = b;
    *n = (size_t)sz;
    return SP_OK;
}

/* Parses a whole JSON file; a syntax error names the file and the byte offset. */
static sp_status parse_json_file(const char *path, cJSON **out, sp_err *err)
{
    char *buf = NULL;
    size_t n = 0;
    sp_status s = read_text(path, &buf, &n, err);
    if (s != SP_OK)
        return s;
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(buf, n, &end, 0);
    size_t at = end ? (size_t)(end - buf) : 0;
    free(buf);
    if (!*out)
        return sp_errf(err, SP_ERR_FORMAT, "%s: malformed JSON near byte %zu", path, at);
    return SP_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* a light reader for the two big parts of tokenizer.json (model.vocab, model.merges: up to hundreds of
 * thousands of entries), read in place from the file's text without building a tree; everything else is small
 * and goes through cJSON. */

typedef struct jspan {
    const char *p, *end; /* a JSON value's text */
} jspan;

static const char *jws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

/* The end of the string starting at p ('"'), or NULL. */
static const char *jstr_end(const char *p, const char *end)
{
    for (p++; p < end; p++) {
        if (*p == '\\')
            p++;
        else if (*p == '"')
            return p + 1;
    }
    return NULL;
}

/* The end of the value starting at p (after white space), or NULL if malformed. */
static const char *jskip(const char *p, const char *end, int depth)
{
    p = jws(p, end);
    if (p >= end || depth > 64)
        return NULL;
    if (*p == '"')
        return jstr_end(p, end);
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        p = jws(p + 1, end);
        if (p < end && *p == close)
            return p + 1;
        for (;;) {
            if (close == '}') {
                if (p >= end || *p != '"' || !(p = jstr_end(p, end)))
                    return NULL;
                p = jws(p, end);
                if (p >= end || *p++ != ':')
                    return NULL;
            }
            if (!(p = jskip(p, end, depth + 1)))
                return NULL;
            p = jws(p, end);
            if (p < end && *p == ',') {
                p = jws(p + 1, end);
                continue;
            }
            return p < end && *p == close ? p + 1 : NULL;
        }
    }
    const char *s = p; /* a number or a literal */
    while (p < end && (isalnum((unsigned char)*p) || *p == '-' || *p == '+' || *p == '.'))
        p++;
    return p > s ? p : NULL;
}

static int hexval(const char *p, unsigned *v)
{
    *v = 0;
    for (int i = 0; i < 4; i++) {
        int c = (unsigned char)p[i], d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                                              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        *v = *v << 4 | (unsigned)d;
    }
    return 0;
}

/* Decodes the string at *pp into out (NUL-terminated, at most cap - 1 bytes) and moves *pp past it: its length,
 * or -1 if malformed or too long. */
static long jstr(const char **pp, const char *end, char *out, size_t cap)
{
    const char *p = jws(*pp, end);
    if (p >= end || *p != '"')
        return -1;
    size_t n = 0;
    for (p++; p < end && *p != '"'; p++) {
        char tmp[4];
        size_t k = 1;
        if (*p == '\\') {
            if (++p >= end)
                return -1;
            switch (*p) {
            case 'b': tmp[0] = '\b'; break;
            case 'f': tmp[0] = '\f'; break;
            case 'n': tmp[0] = '\n'; break;
            case 'r': tmp[0] = '\r'; break;
            case 't': tmp[0] = '\t'; break;
            case 'u': {
                unsigned cp, lo;
                if (end - p < 5 || hexval(p + 1, &cp))
                    return -1;
                p += 4;
                if (cp >= 0xd800 && cp < 0xdc00) { /* a surrogate pair */
                    if (end - p < 7 || p[1] != '\\' || p[2] != 'u' || hexval(p + 3, &lo) || lo < 0xdc00 || lo >= 0xe000)
                        return -1;
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    p += 6;
                } else if (cp >= 0xdc00 && cp < 0xe000) {
                    return -1;
                }
                k = put_utf8(tmp, cp);
                break;
            }
            case '"':
            case '\\':
            case '/': tmp[0] = *p; break;
            default: return -1; /* no other escape is JSON */
            }
        } else {
            tmp[0] = *p;
        }
        if (n + k >= cap)
            return -1;
        memcpy(out + n, tmp, k);
        n += k;
    }
    if (p >= end)
        return -1;
    out[n] = '\0';
    *pp = p + 1;
    return (long)n;
}

/* Member iteration of the object in s: *pp starts at its '{' (first call) or after the previous member.
 * 1 with key (decoded into key) and the value's span, 0 at the end, -1 if malformed. */
static int jmember(const char **pp, const char *end, char *key, size_t cap, jspan *val)
{
    const char *p = jws(*pp, end);
    if (p < end && *p == '{')
        p = jws(p + 1, end);
    else if (p < end && *p == ',')
        p = jws(p + 1, end);
    if (p < end && *p == '}')
        return *pp = p + 1, 0;
    if (jstr(&p, end, key, cap) < 0)
        return -1;
    p = jws(p, end);
    if (p >= end || *p++ != ':')
        return -1;
    val->p = jws(p, end);
    if (!(val->end = jskip(val->p, end, 0)))
        return -1;
    *pp = val->end;
    return 1;
}

/* Element iteration of the array in s, the same way. */
static int jelem(const char **pp, const char *end, jspan *val)
{
    const char *p = jws(*pp, end);
    if (p < end && (*p == '[' || *p == ','))
        p = jws(p + 1, end);
    if (p < end && *p == ']')
        return *pp = p + 1, 0;
    val->p = p;
    if (!(val->end = jskip(p, end, 0)))
        return -1;
    *pp = val->end;
    return 1;
}

/* A JSON integer in [0, TOK_MAX_ID] at the span, or -1. */
static int jid(jspan v)
{
    long x = 0;
    const char *p = v.p;
    if (p >= v.end || *p < '0' || *p > '9')
        return -1;
    for (; p < v.end && *p >= '0' && *p <= '9'; p++)
        if ((x = x * 10 + (*p - '0')) > TOK_MAX_ID)
            return -1;
    return p == v.end ? (int)x : -1;
}

/* Adds the member key: value (its JSON text) to obj, parsed by cJSON; -1 if malformed. */
static int add_parsed(cJSON *obj, const char *key, jspan v)
{
    cJSON *item = cJSON_ParseWithLength(v.p, (size_t)(v.end - v.p));
    if (!item)
        return -1;
    cJSON_AddItemToObject(obj, key, item);
    return 0;
}

/* Maps tokenizer.json and reads it: model.vocab and model.merges stay spans of the mapped text (read later in
 * place); every other member, at the top and inside "model", goes through cJSON into *root (small). The
 * mapping is the caller's to unmap. A syntax error names the file and the byte offset. */
static sp_status map_json_file(const char *path, char **text, size_t *len, cJSON **root, jspan *vocab, jspan *merges,
                               sp_err *err)
{
    *text = NULL;
    *root = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return sp_errf(err, errno == ENOENT ? SP_ERR_NOTFOUND : SP_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || st.st_size <= 0) {
        close(fd);
        return sp_errf(err, SP_ERR_FORMAT, "%s: empty or unreadable", path);
    }
    char *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return sp_errf(err, SP_ERR_IO, "%s: mmap: %s", path, strerror(errno));
    madvise(m, (size_t)st.st_size, MADV_SEQUENTIAL);
    *text = m;
    *len = (size_t)st.st_size;
    const char *end = m + st.st_size, *p = jws(m, end);
    if (p >= end || *p != '{')
        return sp_errf(err, SP_ERR_FORMAT, "%s: not a JSON object", path);
    if (!jskip(p, end, 0))
        return sp_errf(err, SP_ERR_FORMAT, "%s: malformed JSON", path);
    *root = cJSON_CreateObject();
    cJSON *model = NULL;
    char key[256];
    jspan v;
    int r;
    while (*root && (r = jmember(&p, end, key, sizeof key, &v)) > 0) {
        if (strcmp(key, "model") || *v.p != '{') {
            if (add_parsed(*root, key, v))
                return sp_errf(err, SP_ERR_FORMAT, "%s: malformed JSON near byte %zu", path, (size_t)(v.p - m));
            continue;
        }
        if (!(model = cJSON_AddObjectToObject(*root, "model")))
            break;
        const char *q = v.p;
        jspan mv;
        while ((r = jmember(&q, v.end, key, sizeof key, &mv)) > 0) {
            if (!strcmp(key, "vocab"))
                *vocab = mv;
            else if (!strcmp(key, "merges"))
                *merges = mv;
            else if (add_parsed(model, key, mv))
                return sp_errf(err, SP_ERR_FORMAT, "%s: malformed JSON near byte %zu", path, (size_t)(mv.p - m));
        }
        if (r < 0)
            return sp_errf(err, SP_ERR_FORMAT, "%s: malformed \"model\" object", path);
    }
    if (!*root)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    return SP_OK;
}

/* A JSON integer in [0, TOK_MAX_ID], or -1. */
static int json_id(const cJSON *j)
{
    if (!cJSON_IsNumber(j) || j->valuedouble < 0 || j->valuedouble > TOK_MAX_ID ||
        j->valuedouble != (double)(int)j->valuedouble)
        return -1;
    return (int)j->valuedouble;
}

static const char *json_type(const cJSON *o)
{
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(ty) ? ty->valuestring : "";
}

/* ---------------------------------------------------------------------------------------------- */
/* loading: vocab */

/* Largest id in model.vocab and added_tokens; -1 on a malformed entry. */
static int max_id(load_ctx *c, jspan vocab, const cJSON *added)
{
    int m = -1, r;
    char key[TOK_MAX_PIECE * 2 + 8];
    jspan v;
    for (const char *p = vocab.p; (r = jmember(&p, vocab.end, key, sizeof key, &v)) > 0;) {
        int id = jid(v);
        if (id < 0)
            return sp_errf(c->err, SP_ERR_FORMAT, "%s: vocab entry '%s' has no valid id", c->path, key), -1;
        m = id > m ? id : m;
    }
    if (r < 0)
        return sp_errf(c->err, SP_ERR_FORMAT, "%s: model.vocab is malformed (or a token is longer than %d bytes)",
                       c->path, TOK_MAX_PIECE), -1;
    for (const cJSON *e = added ? added->child : NULL; e; e = e->next) {
        int id = json_id(cJSON_GetObjectItemCaseSensitive(e, "id"));
        if (id < 0 || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(e, "content")))
            return sp_errf(c->err, SP_ERR_FORMAT, "%s: malformed entry in added_tokens", c->path), -1;
        m = id > m ? id : m;
    }
    if (m < 0)
        sp_errf(c->err, SP_ERR_FORMAT, "%s: empty vocab", c->path);
    return m;
}

static sp_status alloc_vocab(sp_tokenizer *t, int n, sp_err *err)
{
    t->n_vocab = n;
    t->piece = calloc((size_t)n, sizeof *t->piece);
    t->piece_len = calloc((size_t)n, sizeof *t->piece_len);
    t->text = calloc((size_t)n, sizeof *t->text);
    t->text_len = calloc((size_t)n, sizeof *t->text_len);
    t->byte_of = malloc((size_t)n * sizeof *t->byte_of);
    t->special = calloc((size_t)n, 1);
    t->slot_mask = pow2_at_least((size_t)n * 2) - 1;
    t->slot = calloc(t->slot_mask + 1, sizeof *t->slot);
    if (!t->piece || !t->piece_len || !t->text || !t->text_len || !t->byte_of || !t->special || !t->slot)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory loading a tokenizer of %d tokens", n);
    for (int i = 0; i < n; i++)
        t->byte_of[i] = -1;
    for (int b = 0; b < 256; b++)
        t->byte_id[b] = -1;
    return SP_OK;
}

/* Stores piece `s` as token `id` (unless it already holds the same text). */
static sp_status set_piece(load_ctx *c, int id, const char *s)
{
    sp_tokenizer *t = c->t;
    size_t n = strlen(s);
    if (t->piece[id])
        return strcmp(t->piece[id], s) == 0 ? SP_OK
               : sp_errf(c->err, SP_ERR_FORMAT, "%s: id %d is both '%s' and '%s'", c->path, id, t->piece[id], s);
    if (n > TOK_MAX_PIECE)
        return sp_errf(c->err, SP_ERR_FORMAT, "%s: token %d is longer than %d bytes", c->path, id, TOK_MAX_PIECE);
    int other = piece_find(t, s, n);
    if (other >= 0)
        return sp_errf(c->err, SP_ERR_FORMAT, "%s: tokens %d and %d are both '%s'", c->path, other, id, s);
    if (!(t->piece[id] = dup_n(s, n)))
        return sp_errf(c->err, SP_ERR_NOMEM, "out of memory");
    t->piece_len[id] = n;
    piece_insert(t, id);
    return SP_OK;
}

/* "<0xAB>" (upper-case hex, as SentencePiece writes it) -> 0xAB, else -1. */
static int parse_byte_piece(const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    if (strlen(s) != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    const char *hi = memchr(hex, s[3], 16), *lo = memchr(hex, s[4], 16);
    return hi && lo && s[3] && s[4] ? (int)((hi - hex) * 16 + (lo - hex)) : -1;
}

/* The GPT-2 byte <-> unicode table: bytes 33-126, 161-172 and 174-255 stand for themselves, the other 68
 * (0-32, 127-160, 173), in order, for U+0100 upward. */
static unsigned byte_cp(unsigned b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
        return b;
    return b <= 32 ? 0x100 + b : b <= 160 ? 0x121 + (b - 127) : 0x143;
}

/* The byte that code point cp stands for, or -1. */
static int cp_byte(long cp)
{
    if (cp >= 0 && cp < 256)
        return byte_cp((unsigned)cp) == (unsigned)cp ? (int)cp : -1;
    if (cp >= 0x100 && cp <= 0x120)
        return (int)(cp - 0x100);
    if (cp >= 0x121 && cp <= 0x142)
        return (int)(cp - 0x121 + 127);
    return cp == 0x143 ? 173 : -1;
}

/* Byte-level: the text of a piece is the bytes its characters stand for (or, as Hugging Face's ByteLevel
 * decoder does, the piece itself if one of its characters stands for no byte). Every byte needs a
 * one-character piece, so that any text can be encoded. */
static sp_status derive_byte_level(load_ctx *c)
{
    sp_tokenizer *t = c->t;
    for (int id = 0; id < t->n_vocab; id++) {
        if (!t->piece[id] || t->special[id])
            continue;
        const unsigned char *p = (const unsigned char *)t->piece[id];
        size_t n = t->piece_len[id], k = 0, len;
        char *o = t->text[id] = malloc(n + 1);
        if (!o)
            return sp_errf(c->err, SP_ERR_NOMEM, "out of memory");
        for (size_t i = 0; i < n; i += len) {
            len = char_len(p + i, n - i);
            int b = cp_byte(char_cp(p + i, len));
            if (b < 0) {
                k = n;
                memcpy(o, p, n);
                break;
            }
            o[k++] = (char)b;
        }
        o[k] = '\0';
        t->text_len[id] = k;
    }
    for (unsigned b = 0; b < 256; b++) {
        char ch[4];
        size_t n = put_utf8(ch, byte_cp(b));
        ch[n] = '\0';
        int id = piece_find(t, ch, n);
        if (id < 0 || t->special[id])
            return sp_errf(c->err, SP_ERR_FORMAT, "%s: byte-level BPE vocab has no token '%s' for byte 0x%02X",
                           c->path, ch, b);
        t->byte_id[b] = id;
    }
    return SP_OK;
}

/* Byte tokens and the decoded text of ordinary pieces. */
static sp_status derive_texts(load_ctx *c)
{
    sp_tokenizer *t = c->t;
    if (t->kind == SP_TOK_BYTE_BPE)
        return derive_byte_level(c);
    for (int id = 0; id < t->n_vocab; id++) {
        if (!t->piece[id] || t->special[id])
            continue;
        int b = parse_byte_piece(t->piece[id]);
        if (b >= 0 && t->byte_id[b] < 0) {
            t->byte_of[id] = (short)b;
            t->byte_id[b] = id;
            continue;
        }
        t->text[id] = replace_all(t->piece[id], t->piece_len[id], SPM_SPACE, " ", &t->text_len[id]);
        if (!t->text[id])
            return sp_errf(c->err, SP_ERR_NOMEM, "out of memory");
    }
    return SP_OK;
}

static sp_status load_vocab(load_ctx *c, jspan vocab, const cJSON *added)
{
    if (!vocab.p || vocab.p >= vocab.end || *vocab.p != '{')
        return sp_errf(c->err, SP_ERR_FORMAT, "%s: model.vocab is missing or not an object", c->path);
    if (added && !cJSON_IsArray(added))
        return sp_errf(c->err, SP_ERR_FORMAT, "%s: added_tokens is not an array", c->path);
    int m = max_id(c, vocab, added);
    if (m < 0)
        return SP_ERR_FORMAT;
    sp_status s = alloc_vocab(c->t, m + 1, c->err);
    char key[TOK_MAX_PIECE * 2 + 8];
    jspan v;
    for (const char *p = vocab.p; s == SP_OK && jmember(&p, vocab.end, key, sizeof key, &v) > 0;)
        s = set_piece(c, jid(v), key);
    for (const cJSON *e = added ? added->child : NULL; s == SP_OK && e; e = e->next) {
        int id = json_id(cJSON_GetObjectItemCaseSensitive(e, "id"));
        s = set_piece(c, id, cJSON_GetObjectItemCaseSensitive(e, "content")->valuestring);
        c->t->special[id] = (unsigned char)cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "special"));
    }
    return s == SP_OK ? derive_texts(c) : s;
}

/* ---------------------------------------------------------------------------------------------- */
/* loading: merges */

/* Splits merge entry e (["a", "b"] or "a b") into the ids of its two parts. */
static int merge_parts(const sp_tokenizer *t, jspan e, int *a, int *b)
{
    char x[TOK_MAX_PIECE * 2 + 8], y[TOK_MAX_PIECE * 2 + 8];
    const char *p = e.p;
    if (*p == '[') {
        jspan v;
        const char *q = p;
        if (jelem(&q, e.end, &v) <= 0)
            return 0;
        const char *vp = v.p;
        long nx = jstr(&vp, v.end, x, sizeof x);
        if (nx < 0 || jelem(&q, e.end, &v) <= 0)
            return 0;
        vp = v.p;
        long ny = jstr(&vp, v.end, y, sizeof y);
        if (ny < 0 || jelem(&q, e.end, &v) != 0)
            return 0;
        *a = piece_find(t, x, (size_t)nx);
        *b = piece_find(t, y, (size_t)ny);
        return *a >= 0 && *b >= 0;
    }
    long n = jstr(&p, e.end, x, sizeof x);
    if (n < 0)
        return 0;
    /* "a b": pieces may hold spaces themselves, so take the first split whose halves are both pieces. */
    for (const char *sp = memchr(x, ' ', (size_t)n); sp; sp = memchr(sp + 1, ' ', (size_t)(x + n - sp - 1))) {
        *a = piece_find(t, x, (size_t)(sp - x));
        *b = piece_find(t, sp + 1, (size_t)(x + n - sp - 1));
        if (*a >= 0 && *b >= 0)
            return 1;
    }
    return 0;
}

static sp_status load_merges(load_ctx *c, jspan merges)
{
    sp_tokenizer *t = c->t;
    if (merges.p && (merges.p >= merges.end || *merges.p != '['))
        return sp_errf(c->err, SP_ERR_FORMAT, "%s: model.merges is not an array", c->path);
    int n = 0, r;
    jspan e;
    for (const char *p = merges.p; p && (r = jelem(&p, merges.end, &e)) > 0;)
        n++;
    int *first_rank = malloc((size_t)t->n_vocab * sizeof *first_rank);
    t->pair_mask = pow2_at_least((size_t)n * 2) - 1;
    t->pairs = calloc(t->pair_mask + 1, sizeof *t->pairs);
    if (!first_rank || !t->pairs) {
        free(first_rank);
        return sp_errf(c->err, SP_ERR_NOMEM, "out of memory loading %d merges", n);
    }
    for (int i = 0; i < t->n_vocab; i++)
        first_rank[i] = -1;
    char buf[2 * TOK_MAX_PIECE + 1];
    int rank = 0;
    sp_status s = SP_OK;
    for (const char *p = merges.p; p && jelem(&p, merges.end, &e) > 0; rank++) {
        int a, b;
        if (!merge_parts(t, e, &a, &b)) {
            s = sp_errf(c->err, SP_ERR_FORMAT, "%s: merge %d is malformed or names a piece not in the vocab",
                        c->path, rank);
            break;
        }
        memcpy(buf, t->piece[a], t->piece_len[a]);
        memcpy(buf + t->piece_len[a], t->piece[b], t->piece_len[b]);
        int m = piece_find(t, buf, t->piece_len[a] + t->piece_len[b]);
        if (m < 0) {
            s = sp_errf(c->err, SP_ERR_FORMAT, "%s: merge %d ('%s' + '%s') does not produce a vocab piece",
                        c->path, rank, t->piece[a], t->piece[b]);
            break;
        }
        if (first_rank[m] < 0)
            first_rank[m] = rank;
        /* byte-level BPE (Hugging Face, GPT-2) ranks each merge by its own position */
        pair_insert(t, a, b, m, t->kind == SP_TOK_BYTE_BPE ? rank : first_rank[m]);
    }
    free(first_rank);
    return s;
}

/* ---------------------------------------------------------------------------------------------- */
/* loading: normalizer, pre-tokenizer, options */

static sp_status add_norm(load_ctx *c, norm_kind k, const char *a, const char *b)
{
    sp_tokenizer *t = c->t;
    if (t->n_norm == (int)(sizeof t->norm / sizeof t->norm[0]))
        return sp_errf(c->err, SP_ERR_UNSUPPORTED, "%s: too many normalizer steps", c->path);
    norm_op *op = &t->norm[t->n_norm++];
    op->kind = k;
    op->a = strdup(a);
    op->b = b ? strdup(b) : NULL;
    return op->a && (!b || op->b) ? SP_OK : sp_errf(c->err, SP_ERR_NOMEM, "out of memory");
}

static sp_status load_normalizer(load_ctx *c, const cJSON *n)
{
    const char *type = json_type(n);
    if (!n || cJSON_IsNull(n))
        return SP_OK;
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        sp_status s = SP_OK;
        for (const cJSON *e = cJSON_IsArray(list) ? list->child : NULL; s == SP_OK && e; e = e->next)
            s = load_normalizer(c, e);
        return s;
    }
    if (strcmp(type, "Prepend") == 0) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(n, "prepend");
        if (cJSON_IsString(p))
            return add_norm(c, NORM_PREPEND, p->valuestring, NULL);
    } else if (strcmp(type, "Replace") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(n, "pattern"), "String");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(n, "content");
        if (cJSON_IsString(pat) && pat->valuestring[0] && cJSON_IsString(content))
            return add_norm(c, NORM_REPLACE, pat->valuestring, content->valuestring);
    }
    return sp_errf(c->err, SP_ERR_UNSUPPORTED, "%s: unsupported normalizer '%s'", c->path, type);
}

/* Whether pre-tokenizer p is of `type` or is a Sequence holding one. */
static int has_pre_tokenizer(const cJSON *p, const char *type)
{
    if (strcmp(json_type(p), type) == 0)
        return 1;
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
    for (const cJSON *e = cJSON_IsArray(list) ? list->child : NULL; e; e = e->next)
        if (has_pre_tokenizer(e, type))
            return 1;
    return 0;
}

/* The model kind, from the model type and the pre-tokenizer. */
static sp_status detect_kind(load_ctx *c, const cJSON *model, const cJSON *pre)
{
    const char *type = json_type(model);
    if (*type && strcmp(type, "BPE") != 0)
        return sp_errf(c->err, SP_ERR_UNSUPPORTED, "%s: unsupported tokenizer model '%s'", c->path, type);
    c->t->kind = has_pre_tokenizer(pre, "ByteLevel") ? SP_TOK_BYTE_BPE : SP_TOK_SPM_BPE;
    if (c->t->kind == SP_TOK_BYTE_BPE) {
        const char *fields[] = {"continuing_subword_prefix", "end_of_word_suffix"};
        for (int i = 0; i < 2; i++) {
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(model, fields[i]);
            if (cJSON_IsString(f) && f->valuestring[0])
                return sp_errf(c->err, SP_ERR_UNSUPPORTED, "%s: byte-level BPE with a %s is not supported", c->path,
                               fields[i]);
        }
    }
    return SP_OK;
}

/* The split regexes we implement (tokenizer.json spelling, JSON escapes undone). Qwen2 uses the Llama-3 one
 * with single digits. */
static const char PAT_GPT2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char PAT_LLAMA3[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?"
                                 "[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char PAT_QWEN2[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?"
                                "[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static sp_status set_split(load_ctx *c, split_kind k, int max_digits)
{
    if (c->t->split != SPLIT_NONE)
        return sp_errf(c->err, SP_ERR_UNSUPPORTED, "%s: more than one splitting pre_tokenizer", c->path);
    c->t->split = k;
    c->t->max_digits = max_digits;
    return SP_OK;
}

/* Byte-level pre-tokenizer: ByteLevel (use_regex: the GPT-2 split), or a Sequence of it and a Split by one of
 * the regexes above (behavior Isolated). Missing ByteLevel options take Hugging Face's defaults (true). */
static sp_status load_byte_level_pre(load_ctx *c, const cJSON *p)
{
    const char *type = json_type(p);
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        sp_status s = SP_OK;
        for (const cJSON *e = cJSON_IsArray(list) ? list->child : NULL; s == SP_OK && e; e = e->next)
            s = load_byte_level_pre(c, e);
        return s;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        c->t->prefix_space = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(p, "add_prefix_space"));
        return cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(p, "use_regex")) ? SP_OK : set_split(c, SPLIT_GPT2, 0);
    }
    if (strcmp(type, "Split") == 0) {
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(p, "pattern"), "Regex");
        const cJSON *behavior = cJSON_GetObjectItemCaseSensitive(p, "behavior");
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "invert")) ||
            (behavior && (!cJSON_IsString(behavior) || strcmp(behavior->valuestring, "Isolated") != 0)))
            return sp_errf(c->err, SP_ERR_UNSUPPORTED, "%s: unsupported Split pre_tokenizer (only behavior Isolated)",
                           c->path);
        if (cJSON_IsString(re) && strcmp(re->valuestring, PAT_GPT2) == 0)
            return set_split(c, SPLIT_GPT2, 0);
        if (cJSON_IsString(re) && strcmp(re->valuestring, PAT_LLAMA3) == 0)
            return set_split(c, SPLIT_LLAMA3, 3);
        if (cJSON_IsString(re) && strcmp(re->valuestring, PAT_QWEN2) == 0)
            return set_split(c, SPLIT_LLAMA3, 1);
        return sp_errf(c->err, SP_ERR_UNSUPPORTED,
                       "%s: unsupported Split pre_tokenizer pattern (only the GPT-2 and Llama-3 regexes)", c->path);
    }
    return sp_errf(c->err, SP_ERR_UNSUPPORTED, "%s: unsupported pre_tokenizer '%s' in a byte-level tokenizer",
                   c->path, type);
}

/* SentencePiece-style pre-tokenizer: null, or Metaspace (turned into normalizer steps). */
static sp_status load_pre_tokenizer(load_ctx *c, const cJSON *p)
{
    const char *type = json_type(p);
    if (!p || cJSON_IsNull(p))
        return SP_OK;
    if (c->t->kind == SP_TOK_BYTE_BPE)
        return load_byte_level_pre(c, p);
    if (strcmp(type, "Metaspace") != 0)
        return sp_errf(c->err, SP_ERR_UNSUPPORTED, "%s: unsupported pre_tokenizer '%s'", c->path, type);
    const cJSON *rep = cJSON_GetObjectItemCaseSensitive(p, "replacement");
    const cJSON *scheme = cJSON_GetObjectItemCaseSensitive(p, "prepend_scheme");
    const cJSON *aps = cJSON_GetObjectItemCaseSensitive(p, "add_prefix_space");
    const char *mark = cJSON_IsString(rep) && rep->valuestring[0] ? rep->valuestring : SPM_SPACE;
    int prepend = cJSON_IsString(scheme) ? strcmp(scheme->valuestring, "never") != 0 : !cJSON_IsFalse(aps);
    sp_status s = add_norm(c, NORM_REPLACE, " ", mark);
    if (s == SP_OK && prepend)
        s = add_norm(c, NORM_PREPEND_IF_MISSING, mark, NULL);
    if (s == SP_OK && !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(p, "split")))
        if (!(c->t->word_mark = strdup(mark)))
            s = sp_errf(c->err, SP_ERR_NOMEM, "out of memory");
    return s;
}

/* The id of a token named by a string or {"content": ...}; -1 if null/absent/unknown. */
static int named_token(const sp_tokenizer *t, const cJSON *j)
{
    if (cJSON_IsObject(j))
        j = cJSON_GetObjectItemCaseSensitive(j, "content");
    return cJSON_IsString(j) ? piece_find(t, j->valuestring, strlen(j->valuestring)) : -1;
}

static void load_model_opts(sp_tokenizer *t, const cJSON *model)
{
    t->unk = named_token(t, cJSON_GetObjectItemCaseSensitive(model, "unk_token"));
    t->byte_fallback = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback"));
    t->fuse_unk = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "fuse_unk"));
    if (t->kind == SP_TOK_BYTE_BPE)
        t->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));
}

/* The special token that post_processor's TemplateProcessing puts first in "single" (a BOS), or -1. */
static int template_bos(const sp_tokenizer *t, const cJSON *pp)
{
    if (strcmp(json_type(pp), "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(pp, "processors");
        for (const cJSON *e = cJSON_IsArray(list) ? list->child : NULL; e; e = e->next) {
            int id = template_bos(t, e);
            if (id >= 0)
                return id;
        }
        return -1;
    }
    if (strcmp(json_type(pp), "TemplateProcessing") != 0)
        return -1;
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(pp, "single");
    const cJSON *first = cJSON_IsArray(single) ? single->child : NULL;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(first, "SpecialToken"), "id");
    if (!cJSON_IsString(name))
        return -1;
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(pp, "special_tokens"), name->valuestring),
        "ids");
    int id = cJSON_IsArray(ids) ? json_id(ids->child) : -1;
    if (id >= 0 && id < t->n_vocab && t->piece[id])
        return id;
    return piece_find(t, name->valuestring, strlen(name->valuestring));
}

typedef struct spec_key {
    unsigned key; /* first byte << 16 | (0xFFFF - length): sorts by first byte, then longest first */
    int id;
} spec_key;

static int spec_cmp(const void *x, const void *y)
{
    const spec_key *a = x, *b = y;
    return a->key != b->key ? (a->key < b->key ? -1 : 1) : (a->id > b->id) - (a->id < b->id);
}

/* Byte-level: the index of special added tokens that encode() looks for in the text. */
static sp_status build_specials(load_ctx *c)
{
    sp_tokenizer *t = c->t;
    int n = 0;
    for (int id = 0; id < t->n_vocab; id++)
        n += t->special[id] && t->piece_len[id] > 0;
    spec_key *keys = malloc(((size_t)n + 1) * sizeof *keys);
    t->spec = malloc(((size_t)n + 1) * sizeof *t->spec);
    if (!keys || !t->spec) {
        free(keys);
        return sp_errf(c->err, SP_ERR_NOMEM, "out of memory");
    }
    int k = 0;
    for (int id = 0; id < t->n_vocab; id++)
        if (t->special[id] && t->piece_len[id] > 0)
            keys[k++] = (spec_key){.key = (unsigned)(unsigned char)t->piece[id][0] << 16 |
                                          (0xFFFFu - (unsigned)t->piece_len[id]),
                                   .id = id};
    qsort(keys, (size_t)n, sizeof *keys, spec_cmp);
    memset(t->spec_start, 0, sizeof t->spec_start);
    for (int i = 0; i < n; i++) {
        t->spec[i] = keys[i].id;
        t->spec_start[(keys[i].key >> 16) + 1]++;
    }
    for (int b = 0; b < 256; b++)
        t->spec_start[b + 1] += t->spec_start[b];
    free(keys);
    return SP_OK;
}

/* tokenizer_config.json is optional: defaults are <s> / </s> with BOS added (byte-level: the BOS of the
 * post_processor template, added only if there is one). */
static sp_status load_config(sp_tokenizer *t, const char *dir, sp_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    int byte_level = t->kind == SP_TOK_BYTE_BPE;
    t->bos = byte_level && t->tmpl_bos >= 0 ? t->tmpl_bos : piece_find(t, "<s>", 3);
    t->eos = piece_find(t, "</s>", 4);
    t->add_bos = byte_level ? t->tmpl_bos >= 0 : t->bos >= 0;
    t->add_eos = 0;
    cJSON *cfg = NULL;
    sp_status s = parse_json_file(path, &cfg, err);
    if (s == SP_ERR_NOTFOUND)
        return SP_OK;
    if (s != SP_OK)
        return s;
    const cJSON *j;
    if ((j = cJSON_GetObjectItemCaseSensitive(cfg, "bos_token")))
        t->bos = named_token(t, j);
    if ((j = cJSON_GetObjectItemCaseSensitive(cfg, "eos_token")))
        t->eos = named_token(t, j);
    j = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token");
    t->add_bos = j ? cJSON_IsTrue(j) : byte_level ? t->tmpl_bos >= 0 : t->bos >= 0;
    t->add_eos = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "add_eos_token"));
    cJSON_Delete(cfg);
    return SP_OK;
}

static sp_status load_tokenizer_json(load_ctx *c, const cJSON *root, jspan vocab, jspan merges)
{
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    if (!cJSON_IsObject(model))
        return sp_errf(c->err, SP_ERR_FORMAT, "%s: no \"model\" object", c->path);
    sp_status s = detect_kind(c, model, pre);
    if (s == SP_OK)
        s = load_vocab(c, vocab, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"));
    if (s == SP_OK)
        s = load_merges(c, merges);
    if (s == SP_OK)
        s = load_normalizer(c, cJSON_GetObjectItemCaseSensitive(root, "normalizer"));
    if (s == SP_OK)
        s = load_pre_tokenizer(c, pre); /* its steps run after the normalizer's */
    if (s == SP_OK)
        load_model_opts(c->t, model);
    if (s == SP_OK && c->t->kind == SP_TOK_BYTE_BPE) {
        c->t->tmpl_bos = template_bos(c->t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"));
        s = build_specials(c);
    }
    return s;
}

/* ---------------------------------------------------------------------------------------------- */
/* public: load / free / accessors */

void sp_tokenizer_free(sp_tokenizer *t)
{
    if (!t)
        return;
    for (int i = 0; i < t->n_vocab; i++) {
        free(t->piece ? t->piece[i] : NULL);
        free(t->text ? t->text[i] : NULL);
    }
    for (int i = 0; i < t->n_norm; i++) {
        free(t->norm[i].a);
        free(t->norm[i].b);
    }
    free(t->piece);
    free(t->piece_len);
    free(t->text);
    free(t->text_len);
    free(t->byte_of);
    free(t->special);
    free(t->word_mark);
    free(t->slot);
    free(t->pairs);
    free(t->spec);
    free(t);
}

sp_status sp_tokenizer_load(sp_tokenizer **out, const char *dir, sp_err *err)
{
    char path[4096];
    *out = NULL;
    if (!dir || snprintf(path, sizeof path, "%s/tokenizer.json", dir) >= (int)sizeof path)
        return sp_errf(err, SP_ERR_ARG, "invalid tokenizer directory");
    sp_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    t->tmpl_bos = -1;
    cJSON *root = NULL;
    jspan vocab = {0}, merges = {0};
    char *text = NULL;
    size_t len = 0;
    sp_status s = map_json_file(path, &text, &len, &root, &vocab, &merges, err);
    load_ctx c = {.t = t, .path = path, .err = err};
    if (s == SP_OK)
        s = load_tokenizer_json(&c, root, vocab, merges);
    cJSON_Delete(root);
    if (text)
        munmap(text, len);
    if (s == SP_OK)
        s = load_config(t, dir, err);
    if (s != SP_OK) {
        sp_tokenizer_free(t);
        return s;
    }
    *out = t;
    return SP_OK;
}

sp_tok_kind sp_tokenizer_kind(const sp_tokenizer *t) { return t->kind; }
int sp_tokenizer_vocab_size(const sp_tokenizer *t) { return t->n_vocab; }
int sp_tokenizer_bos(const sp_tokenizer *t) { return t->bos; }
int sp_tokenizer_eos(const sp_tokenizer *t) { return t->eos; }

const char *sp_tokenizer_piece(const sp_tokenizer *t, int id)
{
    return id >= 0 && id < t->n_vocab ? t->piece[id] : NULL;
}

/* ---------------------------------------------------------------------------------------------- */
/* encoding */

/* Applies the normalizer steps to text; returns a malloc'd string. */
static char *normalize(const sp_tokenizer *t, const char *text, size_t *len)
{
    size_t n = strlen(text);
    char *s = dup_n(text, n);
    for (int i = 0; s && i < t->n_norm; i++) {
        const norm_op *op = &t->norm[i];
        char *r;
        if (op->kind == NORM_REPLACE) {
            r = replace_all(s, n, op->a, op->b, &n);
        } else {
            size_t al = strlen(op->a);
            if (n == 0 || (op->kind == NORM_PREPEND_IF_MISSING && n >= al && memcmp(s, op->a, al) == 0))
                continue;
            if ((r = malloc(al + n + 1))) {
                memcpy(r, op->a, al);
                memcpy(r + al, s, n + 1);
                n += al;
            }
        }
        free(s);
        s = r;
    }
    *len = n;
    return s;
}

typedef struct bpe_node {
    int id;         /* -1 once merged into its left neighbour */
    int prev, next; /* neighbours in the list, -1 at the ends */
    int word_start; /* merges never join a word start to its left neighbour */
} bpe_node;

typedef struct bpe_cand {
    int prio, left, right, a, b;
} bpe_cand;

typedef struct bpe_state {
    bpe_node *node;
    int n;
    bpe_cand *heap;
    int nheap;
} bpe_state;

/* Heap order: best (lowest) priority, then leftmost. */
static int cand_less(const bpe_cand *x, const bpe_cand *y)
{
    return x->prio != y->prio ? x->prio < y->prio : x->left < y->left;
}

static void heap_push(bpe_state *st, bpe_cand c)
{
    int i = st->nheap++;
    while (i > 0 && cand_less(&c, &st->heap[(i - 1) / 2])) {
        st->heap[i] = st->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    st->heap[i] = c;
}

static bpe_cand heap_pop(bpe_state *st)
{
    bpe_cand top = st->heap[0], last = st->heap[--st->nheap];
    int i = 0;
    for (;;) {
        int k = 2 * i + 1;
        if (k >= st->nheap)
            break;
        if (k + 1 < st->nheap && cand_less(&st->heap[k + 1], &st->heap[k]))
            k++;
        if (!cand_less(&st->heap[k], &last))
            break;
        st->heap[i] = st->heap[k];
        i = k;
    }
    if (st->nheap > 0)
        st->heap[i] = last;
    return top;
}

/* Queues the pair (left, left.next) if the vocabulary can merge it. The heap holds at most one live
 * candidate per node plus stale ones; its capacity is 2 * n (each merge pushes at most 2). */
static void consider_pair(const sp_tokenizer *t, bpe_state *st, int left)
{
    if (left < 0 || st->node[left].next < 0)
        return;
    int right = st->node[left].next;
    if (st->node[right].word_start)
        return;
    const pair_entry *p = pair_find(t, st->node[left].id, st->node[right].id);
    if (p)
        heap_push(st, (bpe_cand){.prio = p->prio, .left = left, .right = right, .a = st->node[left].id,
                                 .b = st->node[right].id});
}

static void bpe_merge_all(const sp_tokenizer *t, bpe_state *st)
{
    for (int i = 0; i < st->n; i++)
        consider_pair(t, st, i);
    while (st->nheap > 0) {
        bpe_cand c = heap_pop(st);
        bpe_node *l = &st->node[c.left], *r = &st->node[c.right];
        if (l->id != c.a || l->next != c.right || r->id != c.b)
            continue; /* stale: one side has changed since it was queued */
        l->id = pair_find(t, c.a, c.b)->merged;
        l->next = r->next;
        if (r->next >= 0)
            st->node[r->next].prev = c.left;
        r->id = -1;
        consider_pair(t, st, l->prev);
        consider_pair(t, st, c.left);
    }
}

static void add_node(bpe_state *st, int id, int word_start)
{
    int i = st->n++;
    st->node[i] = (bpe_node){.id = id, .prev = i - 1, .next = -1, .word_start = word_start};
    if (i > 0)
        st->node[i - 1].next = i;
}

/* Splits normalized text into UTF-8 characters; a character outside the vocab becomes byte tokens (or
 * <unk>). On valid UTF-8 this is llama2.c's split; an invalid byte stands alone (llama2.c would glue stray
 * continuation bytes to the character before them; both decode to the same bytes). */
static void initial_nodes(const sp_tokenizer *t, const char *s, size_t n, bpe_state *st)
{
    size_t ml = t->word_mark ? strlen(t->word_mark) : 0;
    int last_unk = 0;
    for (size_t i = 0; i < n;) {
        size_t len = char_len((const unsigned char *)s + i, n - i);
        int ws = ml && i + ml <= n && memcmp(s + i, t->word_mark, ml) == 0;
        int id = piece_find(t, s + i, len);
        if (id >= 0 && !t->special[id]) {
            add_node(st, id, ws);
            last_unk = 0;
        } else if (t->byte_fallback) {
            for (size_t k = 0; k < len; k++) {
                int b = t->byte_id[(unsigned char)s[i + k]];
                add_node(st, b >= 0 ? b : t->unk, ws && k == 0);
            }
        } else if (!(t->fuse_unk && last_unk)) {
            add_node(st, t->unk, ws);
            last_unk = 1;
        }
        i += len;
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* byte-level pre-tokenization */

/* Unicode letters (\p{L}: Lu Ll Lt Lm Lo) and numbers (\p{N}: Nd Nl No) as sorted inclusive [first, last]
 * code point ranges, for every script in planes 0-3 as of Unicode 14.0: Latin with Latin-1 and Latin
 * Extended, IPA, Greek, Cyrillic, Armenian, Hebrew, Arabic, Syriac, Devanagari and the other Indic scripts,
 * Thai, Georgian, Hangul, Ethiopic, Cherokee, ..., Hiragana, Katakana, CJK ideographs (with extensions
 * A-G and compatibility), fullwidth forms, historic scripts, and the digits, numerals, fractions and
 * superscripts of all of them. Generated from the Unicode Character Database (Python's unicodedata 14.0);
 * a gap made only of unassigned code points is folded into the range around it. Combining marks (\p{M},
 * e.g. U+0301, Devanagari vowel signs) are neither. */
static const uint32_t uni_letter[] = {
    0x41, 0x5A, 0x61, 0x7A, 0xAA, 0xAA, 0xB5, 0xB5, 0xBA, 0xBA, 0xC0, 0xD6, 0xD8, 0xF6, 0xF8, 0x2C1, 0x2C6, 0x2D1,
    0x2E0, 0x2E4, 0x2EC, 0x2EC, 0x2EE, 0x2EE, 0x370, 0x374, 0x376, 0x37D, 0x37F, 0x37F, 0x386, 0x386, 0x388, 0x3F5,
    0x3F7, 0x481, 0x48A, 0x559, 0x560, 0x588, 0x5D0, 0x5F2, 0x620, 0x64A, 0x66E, 0x66F, 0x671, 0x6D3, 0x6D5, 0x6D5,
    0x6E5, 0x6E6, 0x6EE, 0x6EF, 0x6FA, 0x6FC, 0x6FF, 0x6FF, 0x710, 0x710, 0x712, 0x72F, 0x74D, 0x7A5, 0x7B1, 0x7B1,
    0x7CA, 0x7EA, 0x7F4, 0x7F5, 0x7FA, 0x7FA, 0x800, 0x815, 0x81A, 0x81A, 0x824, 0x824, 0x828, 0x828, 0x840, 0x858,
    0x860, 0x887, 0x889, 0x88E, 0x8A0, 0x8C9, 0x904, 0x939, 0x93D, 0x93D, 0x950, 0x950, 0x958, 0x961, 0x971, 0x980,
    0x985, 0x9B9, 0x9BD, 0x9BD, 0x9CE, 0x9CE, 0x9DC, 0x9E1, 0x9F0, 0x9F1, 0x9FC, 0x9FC, 0xA05, 0xA39, 0xA59, 0xA5E,
    0xA72, 0xA74, 0xA85, 0xAB9, 0xABD, 0xABD, 0xAD0, 0xAE1, 0xAF9, 0xAF9, 0xB05, 0xB39, 0xB3D, 0xB3D, 0xB5C, 0xB61,
    0xB71, 0xB71, 0xB83, 0xBB9, 0xBD0, 0xBD0, 0xC05, 0xC39, 0xC3D, 0xC3D, 0xC58, 0xC61, 0xC80, 0xC80, 0xC85, 0xCB9,
    0xCBD, 0xCBD, 0xCDD, 0xCE1, 0xCF1, 0xCF2, 0xD04, 0xD3A, 0xD3D, 0xD3D, 0xD4E, 0xD4E, 0xD54, 0xD56, 0xD5F, 0xD61,
    0xD7A, 0xD7F, 0xD85, 0xDC6, 0xE01, 0xE30, 0xE32, 0xE33, 0xE40, 0xE46, 0xE81, 0xEB0, 0xEB2, 0xEB3, 0xEBD, 0xEC6,
    0xEDC, 0xF00, 0xF40, 0xF6C, 0xF88, 0xF8C, 0x1000, 0x102A, 0x103F, 0x103F, 0x1050, 0x1055, 0x105A, 0x105D,
    0x1061, 0x1061, 0x1065, 0x1066, 0x106E, 0x1070, 0x1075, 0x1081, 0x108E, 0x108E, 0x10A0, 0x10FA, 0x10FC, 0x135A,
    0x1380, 0x138F, 0x13A0, 0x13FD, 0x1401, 0x166C, 0x166F, 0x167F, 0x1681, 0x169A, 0x16A0, 0x16EA, 0x16F1, 0x1711,
    0x171F, 0x1731, 0x1740, 0x1751, 0x1760, 0x1770, 0x1780, 0x17B3, 0x17D7, 0x17D7, 0x17DC, 0x17DC, 0x1820, 0x1884,
    0x1887, 0x18A8, 0x18AA, 0x191E, 0x1950, 0x19C9, 0x1A00, 0x1A16, 0x1A20, 0x1A54, 0x1AA7, 0x1AA7, 0x1B05, 0x1B33,
    0x1B45, 0x1B4C, 0x1B83, 0x1BA0, 0x1BAE, 0x1BAF, 0x1BBA, 0x1BE5, 0x1C00, 0x1C23, 0x1C4D, 0x1C4F, 0x1C5A, 0x1C7D,
    0x1C80, 0x1CBF, 0x1CE9, 0x1CEC, 0x1CEE, 0x1CF3, 0x1CF5, 0x1CF6, 0x1CFA, 0x1DBF, 0x1E00, 0x1FBC, 0x1FBE, 0x1FBE,
    0x1FC2, 0x1FCC, 0x1FD0, 0x1FDB, 0x1FE0, 0x1FEC, 0x1FF2, 0x1FFC, 0x2071, 0x2071, 0x207F, 0x207F, 0x2090, 0x209C,
    0x2102, 0x2102, 0x2107, 0x2107, 0x210A, 0x2113, 0x2115, 0x2115, 0x2119, 0x211D, 0x2124, 0x2124, 0x2126, 0x2126,
    0x2128, 0x2128, 0x212A, 0x212D, 0x212F, 0x2139, 0x213C, 0x213F, 0x2145, 0x2149, 0x214E, 0x214E, 0x2183, 0x2184,
    0x2C00, 0x2CE4, 0x2CEB, 0x2CEE, 0x2CF2, 0x2CF3, 0x2D00, 0x2D6F, 0x2D80, 0x2DDE, 0x2E2F, 0x2E2F, 0x3005, 0x3006,
    0x3031, 0x3035, 0x303B, 0x303C, 0x3041, 0x3096, 0x309D, 0x309F, 0x30A1, 0x30FA, 0x30FC, 0x318E, 0x31A0, 0x31BF,
    0x31F0, 0x31FF, 0x3400, 0x4DBF, 0x4E00, 0xA48C, 0xA4D0, 0xA4FD, 0xA500, 0xA60C, 0xA610, 0xA61F, 0xA62A, 0xA66E,
    0xA67F, 0xA69D, 0xA6A0, 0xA6E5, 0xA717, 0xA71F, 0xA722, 0xA788, 0xA78B, 0xA801, 0xA803, 0xA805, 0xA807, 0xA80A,
    0xA80C, 0xA822, 0xA840, 0xA873, 0xA882, 0xA8B3, 0xA8F2, 0xA8F7, 0xA8FB, 0xA8FB, 0xA8FD, 0xA8FE, 0xA90A, 0xA925,
    0xA930, 0xA946, 0xA960, 0xA97C, 0xA984, 0xA9B2, 0xA9CF, 0xA9CF, 0xA9E0, 0xA9E4, 0xA9E6, 0xA9EF, 0xA9FA, 0xAA28,
    0xAA40, 0xAA42, 0xAA44, 0xAA4B, 0xAA60, 0xAA76, 0xAA7A, 0xAA7A, 0xAA7E, 0xAAAF, 0xAAB1, 0xAAB1, 0xAAB5, 0xAAB6,
    0xAAB9, 0xAABD, 0xAAC0, 0xAAC0, 0xAAC2, 0xAADD, 0xAAE0, 0xAAEA, 0xAAF2, 0xAAF4, 0xAB01, 0xAB5A, 0xAB5C, 0xAB69,
    0xAB70, 0xABE2, 0xAC00, 0xD7FB, 0xF900, 0xFB1D, 0xFB1F, 0xFB28, 0xFB2A, 0xFBB1, 0xFBD3, 0xFD3D, 0xFD50, 0xFDC7,
    0xFDF0, 0xFDFB, 0xFE70, 0xFEFC, 0xFF21, 0xFF3A, 0xFF41, 0xFF5A, 0xFF66, 0xFFDC, 0x10000, 0x100FA,
    0x10280, 0x102D0, 0x10300, 0x1031F, 0x1032D, 0x10340, 0x10342, 0x10349, 0x10350, 0x10375, 0x10380, 0x1039D,
    0x103A0, 0x103CF, 0x10400, 0x1049D, 0x104B0, 0x10563, 0x10570, 0x10855, 0x10860, 0x10876, 0x10880, 0x1089E,
    0x108E0, 0x108F5, 0x10900, 0x10915, 0x10920, 0x10939, 0x10980, 0x109B7, 0x109BE, 0x109BF, 0x10A00, 0x10A00,
    0x10A10, 0x10A35, 0x10A60, 0x10A7C, 0x10A80, 0x10A9C, 0x10AC0, 0x10AC7, 0x10AC9, 0x10AE4, 0x10B00, 0x10B35,
    0x10B40, 0x10B55, 0x10B60, 0x10B72, 0x10B80, 0x10B91, 0x10C00, 0x10CF2, 0x10D00, 0x10D23, 0x10E80, 0x10EA9,
    0x10EB0, 0x10F1C, 0x10F27, 0x10F45, 0x10F70, 0x10F81, 0x10FB0, 0x10FC4, 0x10FE0, 0x10FF6, 0x11003, 0x11037,
    0x11071, 0x11072, 0x11075, 0x11075, 0x11083, 0x110AF, 0x110D0, 0x110E8, 0x11103, 0x11126, 0x11144, 0x11144,
    0x11147, 0x11172, 0x11176, 0x11176, 0x11183, 0x111B2, 0x111C1, 0x111C4, 0x111DA, 0x111DA, 0x111DC, 0x111DC,
    0x11200, 0x1122B, 0x11280, 0x112A8, 0x112B0, 0x112DE, 0x11305, 0x11339, 0x1133D, 0x1133D, 0x11350, 0x11350,
    0x1135D, 0x11361, 0x11400, 0x11434, 0x11447, 0x1144A, 0x1145F, 0x114AF, 0x114C4, 0x114C5, 0x114C7, 0x114C7,
    0x11580, 0x115AE, 0x115D8, 0x115DB, 0x11600, 0x1162F, 0x11644, 0x11644, 0x11680, 0x116AA, 0x116B8, 0x116B8,
    0x11700, 0x1171A, 0x11740, 0x1182B, 0x118A0, 0x118DF, 0x118FF, 0x1192F, 0x1193F, 0x1193F, 0x11941, 0x11941,
    0x119A0, 0x119D0, 0x119E1, 0x119E1, 0x119E3, 0x119E3, 0x11A00, 0x11A00, 0x11A0B, 0x11A32, 0x11A3A, 0x11A3A,
    0x11A50, 0x11A50, 0x11A5C, 0x11A89, 0x11A9D, 0x11A9D, 0x11AB0, 0x11C2E, 0x11C40, 0x11C40, 0x11C72, 0x11C8F,
    0x11D00, 0x11D30, 0x11D46, 0x11D46, 0x11D60, 0x11D89, 0x11D98, 0x11D98, 0x11EE0, 0x11EF2, 0x11FB0, 0x11FB0,
    0x12000, 0x12399, 0x12480, 0x12FF0, 0x13000, 0x1342E, 0x14400, 0x16A5E, 0x16A70, 0x16ABE, 0x16AD0, 0x16AED,
    0x16B00, 0x16B2F, 0x16B40, 0x16B43, 0x16B63, 0x16E7F, 0x16F00, 0x16F4A, 0x16F50, 0x16F50, 0x16F93, 0x16FE1,
    0x16FE3, 0x16FE3, 0x17000, 0x1BC99, 0x1D400, 0x1D6C0, 0x1D6C2, 0x1D6DA, 0x1D6DC, 0x1D6FA, 0x1D6FC, 0x1D714,
    0x1D716, 0x1D734, 0x1D736, 0x1D74E, 0x1D750, 0x1D76E, 0x1D770, 0x1D788, 0x1D78A, 0x1D7A8, 0x1D7AA, 0x1D7C2,
    0x1D7C4, 0x1D7CB, 0x1DF00, 0x1DF1E, 0x1E100, 0x1E12C, 0x1E137, 0x1E13D, 0x1E14E, 0x1E14E, 0x1E290, 0x1E2AD,
    0x1E2C0, 0x1E2EB, 0x1E7E0, 0x1E8C4, 0x1E900, 0x1E943, 0x1E94B, 0x1E94B, 0x1EE00, 0x1EEBB, 0x20000, 0x3134A,
};
static const uint32_t uni_number[] = {
    0x30, 0x39, 0xB2, 0xB3, 0xB9, 0xB9, 0xBC, 0xBE, 0x660, 0x669, 0x6F0, 0x6F9, 0x7C0, 0x7C9, 0x966, 0x96F,
    0x9E6, 0x9EF, 0x9F4, 0x9F9, 0xA66, 0xA6F, 0xAE6, 0xAEF, 0xB66, 0xB6F, 0xB72, 0xB77, 0xBE6, 0xBF2, 0xC66, 0xC6F,
    0xC78, 0xC7E, 0xCE6, 0xCEF, 0xD58, 0xD5E, 0xD66, 0xD78, 0xDE6, 0xDEF, 0xE50, 0xE59, 0xED0, 0xED9, 0xF20, 0xF33,
    0x1040, 0x1049, 0x1090, 0x1099, 0x1369, 0x137C, 0x16EE, 0x16F0, 0x17E0, 0x17F9, 0x1810, 0x1819, 0x1946, 0x194F,
    0x19D0, 0x19DA, 0x1A80, 0x1A99, 0x1B50, 0x1B59, 0x1BB0, 0x1BB9, 0x1C40, 0x1C49, 0x1C50, 0x1C59, 0x2070, 0x2070,
    0x2074, 0x2079, 0x2080, 0x2089, 0x2150, 0x2182, 0x2185, 0x2189, 0x2460, 0x249B, 0x24EA, 0x24FF, 0x2776, 0x2793,
    0x2CFD, 0x2CFD, 0x3007, 0x3007, 0x3021, 0x3029, 0x3038, 0x303A, 0x3192, 0x3195, 0x3220, 0x3229, 0x3248, 0x324F,
    0x3251, 0x325F, 0x3280, 0x3289, 0x32B1, 0x32BF, 0xA620, 0xA629, 0xA6E6, 0xA6EF, 0xA830, 0xA835, 0xA8D0, 0xA8D9,
    0xA900, 0xA909, 0xA9D0, 0xA9D9, 0xA9F0, 0xA9F9, 0xAA50, 0xAA59, 0xABF0, 0xABF9, 0xFF10, 0xFF19, 0x10107, 0x10133,
    0x10140, 0x10178, 0x1018A, 0x1018B, 0x102E1, 0x102FB, 0x10320, 0x10323, 0x10341, 0x10341, 0x1034A, 0x1034A,
    0x103D1, 0x103D5, 0x104A0, 0x104A9, 0x10858, 0x1085F, 0x10879, 0x1087F, 0x108A7, 0x108AF, 0x108FB, 0x108FF,
    0x10916, 0x1091B, 0x109BC, 0x109BD, 0x109C0, 0x109FF, 0x10A40, 0x10A48, 0x10A7D, 0x10A7E, 0x10A9D, 0x10A9F,
    0x10AEB, 0x10AEF, 0x10B58, 0x10B5F, 0x10B78, 0x10B7F, 0x10BA9, 0x10BAF, 0x10CFA, 0x10CFF, 0x10D30, 0x10E7E,
    0x10F1D, 0x10F26, 0x10F51, 0x10F54, 0x10FC5, 0x10FCB, 0x11052, 0x1106F, 0x110F0, 0x110F9, 0x11136, 0x1113F,
    0x111D0, 0x111D9, 0x111E1, 0x111F4, 0x112F0, 0x112F9, 0x11450, 0x11459, 0x114D0, 0x114D9, 0x11650, 0x11659,
    0x116C0, 0x116C9, 0x11730, 0x1173B, 0x118E0, 0x118F2, 0x11950, 0x11959, 0x11C50, 0x11C6C, 0x11D50, 0x11D59,
    0x11DA0, 0x11DA9, 0x11FC0, 0x11FD4, 0x12400, 0x1246E, 0x16A60, 0x16A69, 0x16AC0, 0x16AC9, 0x16B50, 0x16B61,
    0x16E80, 0x16E96, 0x1D2E0, 0x1D2F3, 0x1D360, 0x1D378, 0x1D7CE, 0x1D7FF, 0x1E140, 0x1E149, 0x1E2F0, 0x1E2F9,
    0x1E8C7, 0x1E8CF, 0x1E950, 0x1E959, 0x1EC71, 0x1ECAB, 0x1ECAD, 0x1ECAF, 0x1ECB1, 0x1ED2D, 0x1ED2F, 0x1ED3D,
    0x1F100, 0x1F10C, 0x1FBF0, 0x1FBF9,
};

/* Unicode White_Space (\s): tab, LF, VT, FF, CR, space, U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028,
 * U+2029, U+202F, U+205F, U+3000. */
static int is_space_cp(long cp)
{
    return (cp >= 9 && cp <= 13) || cp == 32 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

static int in_ranges(const uint32_t *r, size_t n_pairs, long cp)
{
    size_t lo = 0, hi = n_pairs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if ((long)r[2 * mid + 1] < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n_pairs && (long)r[2 * lo] <= cp;
}

typedef enum { CH_OTHER, CH_LETTER, CH_NUMBER, CH_SPACE } char_class;

/* The class of the character at s[i] and, in *len, its length; an invalid UTF-8 byte is one CH_OTHER. */
static char_class class_at(const unsigned char *s, size_t n, size_t i, size_t *len)
{
    *len = char_len(s + i, n - i);
    long cp = char_cp(s + i, *len);
    if (cp < 0x80) {
        if (cp < 0)
            return CH_OTHER;
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z')
            return CH_LETTER;
        return cp >= '0' && cp <= '9' ? CH_NUMBER : is_space_cp(cp) ? CH_SPACE : CH_OTHER;
    }
    if (is_space_cp(cp))
        return CH_SPACE;
    if (in_ranges(uni_letter, sizeof uni_letter / sizeof uni_letter[0] / 2, cp))
        return CH_LETTER;
    return in_ranges(uni_number, sizeof uni_number / sizeof uni_number[0] / 2, cp) ? CH_NUMBER : CH_OTHER;
}

/* End of the run of at most `max` characters of class `cls` from s[i]; *last gets the start of its last one. */
static size_t run_end(const unsigned char *s, size_t n, size_t i, char_class cls, size_t max, size_t *last)
{
    size_t len, count = 0;
    *last = i;
    while (i < n && count < max && class_at(s, n, i, &len) == cls) {
        *last = i;
        i += len;
        count++;
    }
    return i;
}

/* 's|'t|'re|'ve|'m|'ll|'d at s[i] (ASCII case-insensitively if `fold`): the match length, or 0. */
static size_t contraction(const unsigned char *s, size_t n, size_t i, int fold)
{
    static const char *const suffix[] = {"s", "t", "re", "ve", "m", "ll", "d"};
    if (s[i] != '\'')
        return 0;
    for (size_t k = 0; k < sizeof suffix / sizeof suffix[0]; k++) {
        size_t l = strlen(suffix[k]), j = 0;
        while (j < l && i + 1 + j < n &&
               (fold && s[i + 1 + j] >= 'A' && s[i + 1 + j] <= 'Z' ? s[i + 1 + j] | 0x20 : s[i + 1 + j]) ==
                   (unsigned char)suffix[k][j])
            j++;
        if (j == l)
            return 1 + l;
    }
    return 0;
}

/* \s+(?!\S)|\s+ at whitespace s[i]: the run, less its last character when a non-space follows it. */
static size_t space_piece(const unsigned char *s, size_t n, size_t i)
{
    size_t last, end = run_end(s, n, i, CH_SPACE, SIZE_MAX, &last);
    return (end < n && last > i ? last : end) - i;
}

/* Length of the GPT-2 pre-token at s[i] (i < n):
 * 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t gpt2_piece(const unsigned char *s, size_t n, size_t i)
{
    size_t len, last, c = contraction(s, n, i, 0);
    if (c)
        return c;
    char_class cls = class_at(s, n, i, &len);
    size_t from = i;
    if (s[i] == ' ' && i + 1 < n) { /* " ?" then a run of the next character's class */
        char_class next = class_at(s, n, i + 1, &len);
        if (next != CH_SPACE) {
            cls = next;
            from = i + 1;
        }
    }
    return cls == CH_SPACE ? space_piece(s, n, i) : run_end(s, n, from, cls, SIZE_MAX, &last) - i;
}

static int is_crlf(unsigned char ch) { return ch == '\r' || ch == '\n'; }

/* Length of the Llama-3 pre-token at s[i] (i < n), numbers in runs of at most `digits`:
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|
 * \s+(?!\S)|\s+ */
static size_t llama3_piece(const unsigned char *s, size_t n, size_t i, int digits)
{
    size_t len, len2, last, c = contraction(s, n, i, 1);
    if (c)
        return c;
    char_class cls = class_at(s, n, i, &len);
    if (cls == CH_LETTER)
        return run_end(s, n, i, CH_LETTER, SIZE_MAX, &last) - i;
    if (cls != CH_NUMBER && !is_crlf(s[i]) && i + len < n && class_at(s, n, i + len, &len2) == CH_LETTER)
        return run_end(s, n, i + len, CH_LETTER, SIZE_MAX, &last) - i;
    if (cls == CH_NUMBER)
        return run_end(s, n, i, CH_NUMBER, (size_t)digits, &last) - i;
    size_t from = s[i] == ' ' && i + 1 < n && class_at(s, n, i + 1, &len2) == CH_OTHER ? i + 1 : i;
    if (from > i || cls == CH_OTHER) {
        size_t end = run_end(s, n, from, CH_OTHER, SIZE_MAX, &last);
        while (end < n && is_crlf(s[end]))
            end++;
        return end - i;
    }
    /* whitespace: up to its last CR / LF if it holds one, else as in GPT-2 */
    size_t end = run_end(s, n, i, CH_SPACE, SIZE_MAX, &last), nl = 0;
    for (size_t k = i; k < end; k++)
        if (is_crlf(s[k]))
            nl = k + 1;
    return nl ? nl - i : space_piece(s, n, i);
}

/* One pre-token: its bytes become the one-character byte tokens that merges then join (or, with
 * ignore_merges, the whole pre-token if it is a piece). */
static void add_word(const sp_tokenizer *t, bpe_state *st, const unsigned char *w, size_t n)
{
    if (t->ignore_merges && 2 * n <= TOK_MAX_PIECE) {
        char buf[TOK_MAX_PIECE];
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            k += put_utf8(buf + k, byte_cp(w[i]));
        int id = piece_find(t, buf, k);
        if (id >= 0 && !t->special[id]) {
            add_node(st, id, 1);
            return;
        }
    }
    for (size_t i = 0; i < n; i++)
        add_node(st, t->byte_id[w[i]], i == 0);
}

/* Splits one stretch of text without special tokens into pre-tokens (into `tmp` first, with a leading
 * space when add_prefix_space asks for one). */
static void byte_level_segment(const sp_tokenizer *t, bpe_state *st, const char *seg, size_t n, char *tmp)
{
    if (n == 0)
        return;
    const unsigned char *s = (const unsigned char *)seg;
    if (t->prefix_space && seg[0] != ' ') {
        tmp[0] = ' ';
        memcpy(tmp + 1, seg, n);
        s = (const unsigned char *)tmp;
        n++;
    }
    for (size_t i = 0; i < n;) {
        size_t len = t->split == SPLIT_GPT2     ? gpt2_piece(s, n, i)
                   : t->split == SPLIT_LLAMA3 ? llama3_piece(s, n, i, t->max_digits)
                                              : n - i;
        add_word(t, st, s + i, len);
        i += len;
    }
}

/* The longest special token at s[i], or -1. */
static int special_at(const sp_tokenizer *t, const char *s, size_t n, size_t i)
{
    int b = (unsigned char)s[i];
    for (int k = t->spec_start[b]; k < t->spec_start[b + 1]; k++) {
        int id = t->spec[k];
        if (t->piece_len[id] <= n - i && memcmp(s + i, t->piece[id], t->piece_len[id]) == 0)
            return id;
    }
    return -1;
}

/* Byte-level: special tokens are cut out of the text (leftmost, then longest), the rest pre-tokenized. Every
 * pre-token and special token starts a word, so merges stay inside pre-tokens. */
static void byte_level_nodes(const sp_tokenizer *t, const char *s, size_t n, bpe_state *st, char *tmp)
{
    size_t seg = 0;
    for (size_t i = 0; i < n;) {
        int id = t->spec_start[256] > 0 ? special_at(t, s, n, i) : -1;
        if (id < 0) {
            i++;
            continue;
        }
        byte_level_segment(t, st, s + seg, i - seg, tmp);
        add_node(st, id, 1);
        i += t->piece_len[id];
        seg = i;
    }
    byte_level_segment(t, st, s + seg, n - seg, tmp);
}

/* Copies the surviving node ids (with BOS / EOS) into a fresh array. */
static sp_status collect_ids(const sp_tokenizer *t, const bpe_state *st, int add_special, int **ids, int *n,
                             sp_err *err)
{
    int bos = add_special && t->add_bos && t->bos >= 0, eos = add_special && t->add_eos && t->eos >= 0;
    int *out = malloc(((size_t)st->n + 2) * sizeof *out), k = 0;
    if (!out)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    if (bos)
        out[k++] = t->bos;
    for (int i = st->n > 0 ? 0 : -1; i >= 0; i = st->node[i].next)
        if (st->node[i].id >= 0) /* an unknown character with neither byte tokens nor <unk> is dropped */
            out[k++] = st->node[i].id;
    if (eos)
        out[k++] = t->eos;
    *ids = out;
    *n = k;
    return SP_OK;
}

sp_status sp_tokenizer_encode(const sp_tokenizer *t, const char *text, int add_special, int **ids, int *n,
                              sp_err *err)
{
    *ids = NULL;
    *n = 0;
    if (!text)
        return sp_errf(err, SP_ERR_ARG, "encode: text is NULL");
    size_t len;
    char *s = normalize(t, text, &len);
    if (!s)
        return sp_errf(err, SP_ERR_NOMEM, "encode: out of memory");
    if (len > (size_t)(INT32_MAX / (t->kind == SP_TOK_BYTE_BPE ? 8 : 4))) {
        free(s);
        return sp_errf(err, SP_ERR_RANGE, "encode: text of %zu bytes is too long", len);
    }
    /* every byte can become at most one node (byte-level: plus one prefix space per stretch between special
     * tokens); each merge queues at most 2 candidates */
    int byte_level = t->kind == SP_TOK_BYTE_BPE;
    size_t nodes = byte_level ? 2 * len + 2 : len + 1;
    bpe_state st = {.node = malloc(nodes * sizeof *st.node), .heap = malloc(3 * nodes * sizeof *st.heap)};
    char *tmp = byte_level && t->prefix_space ? malloc(len + 2) : NULL;
    sp_status status = SP_OK;
    if (!st.node || !st.heap || (byte_level && t->prefix_space && !tmp)) {
        status = sp_errf(err, SP_ERR_NOMEM, "encode: out of memory for %zu bytes", len);
    } else {
        if (byte_level)
            byte_level_nodes(t, s, len, &st, tmp);
        else
            initial_nodes(t, s, len, &st);
        bpe_merge_all(t, &st);
        status = collect_ids(t, &st, add_special, ids, n, err);
    }
    free(s);
    free(tmp);
    free(st.node);
    free(st.heap);
    return status;
}

/* ---------------------------------------------------------------------------------------------- */
/* decoding */

void sp_detok_init(sp_detok *d, const sp_tokenizer *t)
{
    memset(d, 0, sizeof *d);
    d->t = t;
    d->prev = -1;
    d->at_start = 1;
}

/* Length of the complete UTF-8 prefix of b[0..n) that can be emitted now: stops before an incomplete
 * but so-far valid sequence at the end. Invalid bytes count as complete (passed through). */
static size_t utf8_complete(const unsigned char *b, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = b[i];
        size_t need = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
                    : c >= 0xF0 && c <= 0xF4 ? 4 : 1;
        size_t k = 1;
        while (k < need && i + k < n && (b[i + k] & 0xC0) == 0x80)
            k++;
        if (k == need)
            i += need;
        else if (i + k == n)
            return i; /* valid so far, waiting for more bytes */
        else
            i += 1; /* invalid lead: pass the byte through */
    }
    return n;
}

static size_t emit(const unsigned char *b, size_t n, char *out, size_t cap)
{
    size_t w = n < cap ? n : cap;
    if (w)
        memcpy(out, b, w);
    if (w < cap)
        out[w] = '\0';
    return w;
}

size_t sp_detok_push(sp_detok *d, int id, char *out, size_t cap)
{
    const sp_tokenizer *t = d->t;
    if (cap)
        out[0] = '\0';
    if (id < 0 || id >= t->n_vocab || !t->piece[id])
        return 0;
    int strip = t->kind == SP_TOK_SPM_BPE && (d->at_start || d->prev == t->bos);
    d->prev = id;
    if (t->special[id] || id == t->bos || id == t->eos || id == t->unk)
        return 0;
    d->at_start = 0;
    unsigned char buf[SP_DETOK_BUF + 8];
    size_t n = (size_t)d->npending;
    memcpy(buf, d->pending, n);
    if (t->byte_of[id] >= 0) {
        buf[n++] = (unsigned char)t->byte_of[id];
    } else {
        size_t skip = strip && t->text[id][0] == ' ';
        memcpy(buf + n, t->text[id] + skip, t->text_len[id] - skip);
        n += t->text_len[id] - skip;
    }
    size_t done = utf8_complete(buf, n);
    d->npending = (int)(n - done);
    memcpy(d->pending, buf + done, n - done);
    return emit(buf, done, out, cap);
}

size_t sp_detok_flush(sp_detok *d, char *out, size_t cap)
{
    size_t w = emit(d->pending, (size_t)d->npending, out, cap);
    d->npending = 0;
    return w;
}

/* Appends b[0..n) to a growing buffer. */
static int buf_append(char **s, size_t *len, size_t *cap, const char *b, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t nc = (*cap ? *cap * 2 : 256) + n;
        char *r = realloc(*s, nc);
        if (!r)
            return 0;
        *s = r;
        *cap = nc;
    }
    memcpy(*s + *len, b, n);
    *len += n;
    (*s)[*len] = '\0';
    return 1;
}

sp_status sp_tokenizer_decode(const sp_tokenizer *t, const int *ids, int n, char **text, sp_err *err)
{
    sp_detok d;
    sp_detok_init(&d, t);
    char *s = NULL, piece[SP_DETOK_BUF];
    size_t len = 0, cap = 0;
    int ok = buf_append(&s, &len, &cap, "", 0);
    for (int i = 0; ok && i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab || !t->piece[ids[i]]) {
            free(s);
            *text = NULL;
            return sp_errf(err, SP_ERR_RANGE, "decode: token id %d (position %d) is outside the vocab of %d", ids[i],
                           i, t->n_vocab);
        }
        size_t w = sp_detok_push(&d, ids[i], piece, sizeof piece);
        ok = buf_append(&s, &len, &cap, piece, w);
    }
    if (ok) {
        size_t w = sp_detok_flush(&d, piece, sizeof piece);
        ok = buf_append(&s, &len, &cap, piece, w);
    }
    if (!ok) {
        free(s);
        *text = NULL;
        return sp_errf(err, SP_ERR_NOMEM, "decode: out of memory");
    }
    *text = s;
    return SP_OK;
}
