/* tokenizer.c - tokenizer.json loader and SentencePiece-style BPE encode / decode (see tokenizer.h). */
#include "tokenizer.h"

#include <cJSON.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOK_MAX_ID 10000000 /* ids above this are rejected as malformed */
#define TOK_MAX_PIECE 1000  /* longest piece, so SP_DETOK_BUF always suffices */
#define SPM_SPACE "\xE2\x96\x81"

typedef enum { NORM_PREPEND, NORM_PREPEND_IF_MISSING, NORM_REPLACE } norm_kind;

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
static int max_id(load_ctx *c, const cJSON *vocab, const cJSON *added)
{
    int m = -1;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        int id = json_id(e);
        if (id < 0)
            return sp_errf(c->err, SP_ERR_FORMAT, "%s: vocab entry '%s' has no valid id", c->path, e->string), -1;
        m = id > m ? id : m;
    }
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

/* Byte tokens and the decoded text of ordinary pieces. */
static sp_status derive_texts(load_ctx *c)
{
    sp_tokenizer *t = c->t;
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

static sp_status load_vocab(load_ctx *c, const cJSON *model, const cJSON *added)
{
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab))
        return sp_errf(c->err, SP_ERR_FORMAT, "%s: model.vocab is missing or not an object", c->path);
    if (added && !cJSON_IsArray(added))
        return sp_errf(c->err, SP_ERR_FORMAT, "%s: added_tokens is not an array", c->path);
    int m = max_id(c, vocab, added);
    if (m < 0)
        return SP_ERR_FORMAT;
    sp_status s = alloc_vocab(c->t, m + 1, c->err);
    for (const cJSON *e = vocab->child; s == SP_OK && e; e = e->next)
        s = set_piece(c, json_id(e), e->string);
    for (const cJSON *e = added ? added->child : NULL; s == SP_OK && e; e = e->next) {
        int id = json_id(cJSON_GetObjectItemCaseSensitive(e, "id"));
        s = set_piece(c, id, cJSON_GetObjectItemCaseSensitive(e, "content")->valuestring);
        c->t->special[id] = (unsigned char)cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "special"));
    }
    return s == SP_OK ? derive_texts(c) : s;
}

/* ---------------------------------------------------------------------------------------------- */
/* loading: merges */

/* Splits merge entry `e` (["a", "b"] or "a b") into the ids of its two parts. */
static int merge_parts(const sp_tokenizer *t, const cJSON *e, int *a, int *b)
{
    if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2) {
        const cJSON *x = cJSON_GetArrayItem(e, 0), *y = cJSON_GetArrayItem(e, 1);
        if (!cJSON_IsString(x) || !cJSON_IsString(y))
            return 0;
        *a = piece_find(t, x->valuestring, strlen(x->valuestring));
        *b = piece_find(t, y->valuestring, strlen(y->valuestring));
        return *a >= 0 && *b >= 0;
    }
    if (!cJSON_IsString(e))
        return 0;
    /* "a b": pieces may hold spaces themselves, so take the first split whose halves are both pieces. */
    const char *s = e->valuestring;
    for (const char *sp = strchr(s, ' '); sp; sp = strchr(sp + 1, ' ')) {
        *a = piece_find(t, s, (size_t)(sp - s));
        *b = piece_find(t, sp + 1, strlen(sp + 1));
        if (*a >= 0 && *b >= 0)
            return 1;
    }
    return 0;
}

static sp_status load_merges(load_ctx *c, const cJSON *model)
{
    sp_tokenizer *t = c->t;
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (merges && !cJSON_IsArray(merges))
        return sp_errf(c->err, SP_ERR_FORMAT, "%s: model.merges is not an array", c->path);
    int n = merges ? cJSON_GetArraySize(merges) : 0;
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
    for (const cJSON *e = merges ? merges->child : NULL; e; e = e->next, rank++) {
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
        pair_insert(t, a, b, m, first_rank[m]);
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
    if (c->t->kind == SP_TOK_BYTE_BPE)
        return sp_errf(c->err, SP_ERR_UNSUPPORTED,
                       "%s: byte-level BPE tokenizers (GPT-2 style) are not supported yet", c->path);
    return SP_OK;
}

/* SentencePiece-style pre-tokenizer: null, or Metaspace (turned into normalizer steps). */
static sp_status load_pre_tokenizer(load_ctx *c, const cJSON *p)
{
    const char *type = json_type(p);
    if (!p || cJSON_IsNull(p))
        return SP_OK;
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
}

/* tokenizer_config.json is optional: defaults are <s> / </s> with BOS added. */
static sp_status load_config(sp_tokenizer *t, const char *dir, sp_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    t->bos = piece_find(t, "<s>", 3);
    t->eos = piece_find(t, "</s>", 4);
    t->add_bos = t->bos >= 0;
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
    t->add_bos = j ? cJSON_IsTrue(j) : t->bos >= 0;
    t->add_eos = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "add_eos_token"));
    cJSON_Delete(cfg);
    return SP_OK;
}

static sp_status load_tokenizer_json(load_ctx *c, const cJSON *root)
{
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    if (!cJSON_IsObject(model))
        return sp_errf(c->err, SP_ERR_FORMAT, "%s: no \"model\" object", c->path);
    sp_status s = detect_kind(c, model, pre);
    if (s == SP_OK)
        s = load_vocab(c, model, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"));
    if (s == SP_OK)
        s = load_merges(c, model);
    if (s == SP_OK)
        s = load_normalizer(c, cJSON_GetObjectItemCaseSensitive(root, "normalizer"));
    if (s == SP_OK)
        s = load_pre_tokenizer(c, pre); /* its steps run after the normalizer's */
    if (s == SP_OK)
        load_model_opts(c->t, model);
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
    cJSON *root = NULL;
    sp_status s = parse_json_file(path, &root, err);
    load_ctx c = {.t = t, .path = path, .err = err};
    if (s == SP_OK)
        s = cJSON_IsObject(root) ? load_tokenizer_json(&c, root)
                                 : sp_errf(err, SP_ERR_FORMAT, "%s: not a JSON object", path);
    cJSON_Delete(root);
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
    if (len > (size_t)(INT32_MAX / 4)) {
        free(s);
        return sp_errf(err, SP_ERR_RANGE, "encode: text of %zu bytes is too long", len);
    }
    /* every byte can become at most one node; each merge queues at most 2 candidates */
    bpe_state st = {.node = malloc((len + 1) * sizeof *st.node), .heap = malloc((3 * len + 1) * sizeof *st.heap)};
    sp_status status = SP_OK;
    if (!st.node || !st.heap) {
        status = sp_errf(err, SP_ERR_NOMEM, "encode: out of memory for %zu bytes", len);
    } else {
        initial_nodes(t, s, len, &st);
        bpe_merge_all(t, &st);
        status = collect_ids(t, &st, add_special, ids, n, err);
    }
    free(s);
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
    int strip = d->at_start || d->prev == t->bos;
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
