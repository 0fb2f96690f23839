/* convert_llama2c.c - llama2.c model.bin + tokenizer.bin -> Hugging Face Llama directory.
 *
 * model.bin: 7 little-endian int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len),
 * then f32 weights in llama2.c order (see l2c_layout). A negative vocab_size means a separate classifier
 * (wcls) follows the RoPE tables; a positive one means it is tied to the embedding.
 * tokenizer.bin: int32 max_token_length, then per token: f32 score, int32 len, len bytes. */
#include "convert_llama2c.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hfdir.h"
#include "safetensors.h"

#define L2C_HDR_BYTES 28
#define L2C_N_SPECIAL 3                    /* <unk>, <s>, </s> */
#define L2C_FIRST_PIECE (L2C_N_SPECIAL + 256) /* ids 3..258 are the byte tokens */
#define L2C_MAX_PIECE (1 << 16)
#define L2C_MAX_LAYERS (1 << 16)
#define SPM_SPACE "\xE2\x96\x81"            /* U+2581, SentencePiece's word-boundary mark */

typedef struct l2c_hdr {
    int64_t dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len;
    int64_t kv_dim, head_size;
    int shared; /* classifier tied to the embedding */
} l2c_hdr;

typedef struct l2c_weights {
    const float *emb, *rms_att, *wq, *wk, *wv, *wo, *rms_ffn, *w1, *w2, *w3, *rms_final, *wcls;
} l2c_weights;

typedef struct l2c_merge {
    float score; /* score of the merged piece */
    int merged, left, right;
} l2c_merge;

typedef struct l2c_vocab {
    int n;
    char **piece; /* Hugging Face spelling, NUL-terminated */
    size_t *len;
    float *score;
    l2c_merge *merges; /* in rank order */
    size_t n_merges;
} l2c_vocab;

/* Open-addressing map from piece text to id (no deletions). */
typedef struct piece_map {
    int *slot; /* id + 1, 0 = empty */
    size_t mask;
    const l2c_vocab *v;
} piece_map;

/* ---------------------------------------------------------------------------------------------- */
/* small helpers */

static int host_is_little_endian(void)
{
    uint16_t x = 1;
    unsigned char c;
    memcpy(&c, &x, 1);
    return c == 1;
}

static int32_t rd_i32(const unsigned char *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* *acc += a * b * c, returning 0 on uint64 overflow. */
static int add_prod(uint64_t *acc, uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t ab, abc;
    if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, &abc))
        return 0;
    return !__builtin_add_overflow(*acc, abc, acc);
}

/* ---------------------------------------------------------------------------------------------- */
/* model.bin */

static sp_status parse_header(const unsigned char *p, size_t size, const char *path, l2c_hdr *h, sp_err *err)
{
    if (size < L2C_HDR_BYTES)
        return sp_errf(err, SP_ERR_FORMAT, "%s: file is %zu bytes, shorter than the %d-byte llama2.c header",
                       path, size, L2C_HDR_BYTES);
    int32_t v[7];
    for (int i = 0; i < 7; i++)
        v[i] = rd_i32(p + 4 * i);
    if (v[0] <= 0 || v[1] <= 0 || v[2] <= 0 || v[3] <= 0 || v[4] <= 0 || v[5] == 0 || v[5] == INT32_MIN ||
        v[6] <= 0)
        return sp_errf(err, SP_ERR_FORMAT,
                       "%s: invalid llama2.c header (dim=%d hidden_dim=%d n_layers=%d n_heads=%d n_kv_heads=%d "
                       "vocab_size=%d seq_len=%d): sizes must be positive",
                       path, v[0], v[1], v[2], v[3], v[4], v[5], v[6]);
    *h = (l2c_hdr){.dim = v[0], .hidden = v[1], .n_layers = v[2], .n_heads = v[3], .n_kv_heads = v[4],
                   .vocab = v[5] < 0 ? -(int64_t)v[5] : v[5], .seq_len = v[6], .shared = v[5] > 0};
    if (h->dim % h->n_heads != 0)
        return sp_errf(err, SP_ERR_FORMAT, "%s: n_heads=%d does not divide dim=%d", path, v[3], v[0]);
    if (h->n_kv_heads > h->n_heads || h->n_heads % h->n_kv_heads != 0)
        return sp_errf(err, SP_ERR_FORMAT, "%s: n_kv_heads=%d does not divide n_heads=%d", path, v[4], v[3]);
    if (h->n_layers > L2C_MAX_LAYERS)
        return sp_errf(err, SP_ERR_FORMAT, "%s: n_layers=%d is implausibly large", path, v[2]);
    h->head_size = h->dim / h->n_heads;
    h->kv_dim = h->dim * h->n_kv_heads / h->n_heads;
    if (h->head_size % 2 != 0)
        return sp_errf(err, SP_ERR_FORMAT, "%s: head size %lld is odd (RoPE needs pairs)", path,
                       (long long)h->head_size);
    return SP_OK;
}

/* Number of f32 values after the header, or 0 on overflow. */
static uint64_t expected_floats(const l2c_hdr *h)
{
    uint64_t n = 0, L = (uint64_t)h->n_layers, D = (uint64_t)h->dim;
    int ok = add_prod(&n, (uint64_t)h->vocab, D, 1)       /* token embedding */
             && add_prod(&n, L, D, 2)                       /* rms_att + rms_ffn */
             && add_prod(&n, L, D, D * 2)                   /* wq + wo */
             && add_prod(&n, L, (uint64_t)h->kv_dim, D * 2) /* wk + wv */
             && add_prod(&n, L, (uint64_t)h->hidden, D * 3) /* w1, w2, w3 */
             && add_prod(&n, D, 1, 1)                       /* rms_final */
             && add_prod(&n, (uint64_t)h->seq_len, (uint64_t)h->head_size, 1) /* freq_cis real + imag */
             && (h->shared || add_prod(&n, (uint64_t)h->vocab, D, 1));
    return ok ? n : 0;
}

/* Points the weight pointers into the mapping, in llama2.c order. */
static void l2c_layout(const l2c_hdr *h, const float *p, l2c_weights *w)
{
    int64_t L = h->n_layers, D = h->dim, KV = h->kv_dim, F = h->hidden;
    w->emb = p, p += h->vocab * D;
    w->rms_att = p, p += L * D;
    w->wq = p, p += L * D * D;
    w->wk = p, p += L * KV * D;
    w->wv = p, p += L * KV * D;
    w->wo = p, p += L * D * D;
    w->rms_ffn = p, p += L * D;
    w->w1 = p, p += L * F * D;
    w->w2 = p, p += L * D * F;
    w->w3 = p, p += L * F * D;
    w->rms_final = p, p += D;
    p += h->seq_len * h->head_size; /* freq_cis_real, freq_cis_imag: HF recomputes RoPE */
    w->wcls = h->shared ? w->emb : p;
}

/* llama2.c rotates interleaved pairs (2i, 2i+1); HF Llama rotates halves (i, i + hd/2). Reorder the
 * output rows of each head so that HF's rotate-half pairs the same two values. */
static void permute_heads(float *dst, const float *src, int64_t n_heads, int64_t hd, int64_t in_dim)
{
    size_t row = (size_t)in_dim * sizeof(float);
    for (int64_t h = 0; h < n_heads; h++) {
        float *d = dst + h * hd * in_dim;
        const float *s = src + h * hd * in_dim;
        for (int64_t i = 0; i < hd / 2; i++) {
            memcpy(d + i * in_dim, s + 2 * i * in_dim, row);
            memcpy(d + (hd / 2 + i) * in_dim, s + (2 * i + 1) * in_dim, row);
        }
    }
}

static void set_tensor(sp_st_wtensor *t, const char *name, const float *data, int ndim, int64_t d0, int64_t d1)
{
    *t = (sp_st_wtensor){.name = name, .dtype = SP_F32, .ndim = ndim, .data = data};
    t->shape[0] = d0;
    t->shape[1] = d1;
}

/* Fills the 9 tensors of layer i; q/k come from the permuted copies. names: 9 x 96 bytes. */
static void layer_tensors(const l2c_hdr *h, const l2c_weights *w, const float *q, const float *k, int64_t i,
                          sp_st_wtensor *t, char (*names)[96])
{
    static const char *const suffix[9] = {"input_layernorm",        "self_attn.q_proj", "self_attn.k_proj",
                                          "self_attn.v_proj",       "self_attn.o_proj", "post_attention_layernorm",
                                          "mlp.gate_proj",          "mlp.up_proj",      "mlp.down_proj"};
    int64_t D = h->dim, KV = h->kv_dim, F = h->hidden;
    for (int j = 0; j < 9; j++)
        snprintf(names[j], 96, "model.layers.%lld.%s.weight", (long long)i, suffix[j]);
    set_tensor(&t[0], names[0], w->rms_att + i * D, 1, D, 0);
    set_tensor(&t[1], names[1], q + i * D * D, 2, D, D);
    set_tensor(&t[2], names[2], k + i * KV * D, 2, KV, D);
    set_tensor(&t[3], names[3], w->wv + i * KV * D, 2, KV, D);
    set_tensor(&t[4], names[4], w->wo + i * D * D, 2, D, D);
    set_tensor(&t[5], names[5], w->rms_ffn + i * D, 1, D, 0);
    set_tensor(&t[6], names[6], w->w1 + i * F * D, 2, F, D);
    set_tensor(&t[7], names[7], w->w3 + i * F * D, 2, F, D);
    set_tensor(&t[8], names[8], w->w2 + i * D * F, 2, D, F);
}

static sp_status write_weights(const l2c_hdr *h, const l2c_weights *w, const char *outdir, sp_err *err)
{
    int64_t L = h->n_layers, D = h->dim, KV = h->kv_dim;
    int n = (int)(L * 9 + 3);
    sp_st_wtensor *t = calloc((size_t)n, sizeof *t);
    char(*names)[96] = calloc((size_t)n, sizeof *names);
    float *q = malloc((size_t)(L * D * D) * sizeof(float));
    float *k = malloc((size_t)(L * KV * D) * sizeof(float));
    sp_status s = SP_OK;
    if (!t || !names || !q || !k) {
        s = sp_errf(err, SP_ERR_NOMEM, "out of memory converting %lld layers", (long long)L);
        goto done;
    }
    for (int64_t i = 0; i < L; i++) {
        permute_heads(q + i * D * D, w->wq + i * D * D, h->n_heads, h->head_size, D);
        permute_heads(k + i * KV * D, w->wk + i * KV * D, h->n_kv_heads, h->head_size, D);
    }
    int nt = 0;
    set_tensor(&t[nt++], "model.embed_tokens.weight", w->emb, 2, h->vocab, D);
    for (int64_t i = 0; i < L; i++, nt += 9)
        layer_tensors(h, w, q, k, i, t + nt, names + nt);
    set_tensor(&t[nt++], "model.norm.weight", w->rms_final, 1, D, 0);
    if (!h->shared)
        set_tensor(&t[nt++], "lm_head.weight", w->wcls, 2, h->vocab, D);
    char path[4096];
    s = sp_hf_path(path, sizeof path, outdir, "model.safetensors", err);
    if (s == SP_OK)
        s = sp_st_write(path, t, nt, "{\"format\":\"pt\"}", err);
done:
    free(t);
    free(names);
    free(q);
    free(k);
    return s;
}

static sp_status write_config(const l2c_hdr *h, const char *outdir, sp_err *err)
{
    cJSON *c = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(c, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("LlamaForCausalLM"));
    cJSON_AddStringToObject(c, "model_type", "llama");
    cJSON_AddNumberToObject(c, "hidden_size", (double)h->dim);
    cJSON_AddNumberToObject(c, "intermediate_size", (double)h->hidden);
    cJSON_AddNumberToObject(c, "num_hidden_layers", (double)h->n_layers);
    cJSON_AddNumberToObject(c, "num_attention_heads", (double)h->n_heads);
    cJSON_AddNumberToObject(c, "num_key_value_heads", (double)h->n_kv_heads);
    cJSON_AddNumberToObject(c, "head_dim", (double)h->head_size);
    cJSON_AddNumberToObject(c, "vocab_size", (double)h->vocab);
    cJSON_AddNumberToObject(c, "max_position_embeddings", (double)h->seq_len);
    cJSON_AddNumberToObject(c, "rms_norm_eps", 1e-5);
    cJSON_AddNumberToObject(c, "rope_theta", 10000.0);
    cJSON_AddStringToObject(c, "hidden_act", "silu");
    cJSON_AddBoolToObject(c, "tie_word_embeddings", h->shared);
    cJSON_AddNumberToObject(c, "bos_token_id", 1);
    cJSON_AddNumberToObject(c, "eos_token_id", 2);
    cJSON_AddStringToObject(c, "torch_dtype", "float32");
    cJSON_AddBoolToObject(c, "attention_bias", 0);
    cJSON_AddBoolToObject(c, "mlp_bias", 0);
    return sp_hf_write_json(c, outdir, "config.json", 1, err);
}

/* Maps model.bin (header already parsed into *h) after checking that its size matches the header. */
static sp_status map_model(const char *path, const l2c_hdr *h, void **map, size_t *size, sp_err *err)
{
    uint64_t nf = expected_floats(h);
    if (nf == 0 || nf > (UINT64_MAX - L2C_HDR_BYTES) / 4 || nf > SIZE_MAX / 4)
        return sp_errf(err, SP_ERR_FORMAT, "%s: header sizes overflow", path);
    uint64_t want = L2C_HDR_BYTES + nf * 4;
    int fd = open(path, O_RDONLY);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        sp_errf(err, SP_ERR_IO, "%s: %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return SP_ERR_IO;
    }
    *size = (size_t)sb.st_size;
    if ((uint64_t)sb.st_size != want) {
        close(fd);
        return sp_errf(err, SP_ERR_FORMAT,
                       "%s: file is %zu bytes but its header (dim=%lld, %lld layers, vocab %lld, %s classifier) "
                       "needs exactly %llu bytes", path, *size, (long long)h->dim, (long long)h->n_layers,
                       (long long)h->vocab, h->shared ? "tied" : "separate", (unsigned long long)want);
    }
    *map = mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (*map == MAP_FAILED) {
        *map = NULL;
        return sp_errf(err, SP_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
    }
    return SP_OK;
}

/* Writes model.safetensors and config.json from the mapped model.bin. */
static sp_status write_model(const l2c_hdr *h, const void *map, const char *outdir, sp_err *err)
{
    l2c_weights w;
    l2c_layout(h, (const float *)((const unsigned char *)map + L2C_HDR_BYTES), &w);
    sp_status s = write_weights(h, &w, outdir, err);
    return s == SP_OK ? write_config(h, outdir, err) : s;
}

/* ---------------------------------------------------------------------------------------------- */
/* tokenizer.bin */

static void vocab_free(l2c_vocab *v)
{
    for (int i = 0; v->piece && i < v->n; i++)
        free(v->piece[i]);
    free(v->piece);
    free(v->len);
    free(v->score);
    free(v->merges);
}

/* Length of the UTF-8 sequence at p[0..n), or 0 if it is not valid there. */
static size_t utf8_seq(const unsigned char *p, size_t n)
{
    size_t len = p[0] < 0x80 ? 1 : p[0] >= 0xC2 && p[0] <= 0xDF ? 2 : p[0] >= 0xE0 && p[0] <= 0xEF ? 3
               : p[0] >= 0xF0 && p[0] <= 0xF4 ? 4 : 0;
    if (len == 0 || len > n)
        return 0;
    for (size_t i = 1; i < len; i++)
        if ((p[i] & 0xC0) != 0x80)
            return 0;
    return len;
}

/* Byte token `b` is stored either as "<0xXX>" (upstream llama2.c) or as the character itself. */
static int is_byte_token(const unsigned char *p, size_t n, unsigned b)
{
    char hex[8];
    snprintf(hex, sizeof hex, "<0x%02X>", b);
    if (n == 6 && strncasecmp((const char *)p, hex, 6) == 0)
        return 1;
    if (b < 0x80)
        return n == 1 && p[0] == b;
    return n == 2 && p[0] == (0xC0 | (b >> 6)) && p[1] == (0x80 | (b & 0x3F));
}

/* HF spelling of token `id` (malloc'd): specials and byte tokens by name, ' ' -> U+2581 elsewhere. */
static sp_status hf_piece(const char *path, int id, const unsigned char *p, size_t n, char **out, sp_err *err)
{
    static const char *const special[L2C_N_SPECIAL] = {"<unk>", "<s>", "</s>"};
    char buf[16];
    if (id < L2C_FIRST_PIECE) {
        if (id < L2C_N_SPECIAL)
            snprintf(buf, sizeof buf, "%s", special[id]);
        else if (is_byte_token(p, n, (unsigned)(id - L2C_N_SPECIAL)))
            snprintf(buf, sizeof buf, "<0x%02X>", id - L2C_N_SPECIAL);
        else
            return sp_errf(err, SP_ERR_FORMAT, "%s: token %d should be the byte token <0x%02X>", path, id,
                           id - L2C_N_SPECIAL);
        return (*out = strdup(buf)) ? SP_OK : sp_errf(err, SP_ERR_NOMEM, "out of memory");
    }
    size_t spaces = 0;
    for (size_t i = 0; i < n;) {
        size_t k = p[i] ? utf8_seq(p + i, n - i) : 0;
        if (k == 0)
            return sp_errf(err, SP_ERR_FORMAT, "%s: token %d is not valid UTF-8 text", path, id);
        spaces += p[i] == ' ';
        i += k;
    }
    char *s = malloc(n + 2 * spaces + 1), *o = s;
    if (!s)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        if (p[i] == ' ') {
            memcpy(o, SPM_SPACE, 3);
            o += 3;
        } else
            *o++ = (char)p[i];
    }
    *o = '\0';
    *out = s;
    return SP_OK;
}

static sp_status read_file(const char *path, unsigned char **buf, size_t *n, sp_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return sp_errf(err, SP_ERR_IO, "%s: %s", path, strerror(errno));
    long sz = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    unsigned char *b = sz >= 0 && fseek(f, 0, SEEK_SET) == 0 ? malloc((size_t)sz + 1) : NULL;
    int ok = b && fread(b, 1, (size_t)sz, f) == (size_t)sz;
    fclose(f);
    if (!ok) {
        free(b);
        return sp_errf(err, SP_ERR_IO, "%s: read failed", path);
    }
    *buf = b;
    *n = (size_t)sz;
    return SP_OK;
}

/* Parses the tokens of tokenizer.bin (exactly n_vocab of them) into v. */
static sp_status parse_tokens(const char *path, const unsigned char *b, size_t size, l2c_vocab *v, sp_err *err)
{
    size_t off = 4;
    for (int i = 0; i < v->n; i++) {
        if (size - off < 8)
            return sp_errf(err, SP_ERR_FORMAT, "%s: truncated at token %d of %d (offset %zu of %zu bytes)", path, i,
                           v->n, off, size);
        int32_t len = rd_i32(b + off + 4);
        memcpy(&v->score[i], b + off, 4);
        off += 8;
        if (len < 0 || len > L2C_MAX_PIECE)
            return sp_errf(err, SP_ERR_FORMAT, "%s: token %d has invalid length %d", path, i, len);
        if (size - off < (size_t)len)
            return sp_errf(err, SP_ERR_FORMAT, "%s: truncated at token %d of %d (offset %zu of %zu bytes)", path, i,
                           v->n, off, size);
        sp_status s = hf_piece(path, i, b + off, (size_t)len, &v->piece[i], err);
        if (s != SP_OK)
            return s;
        v->len[i] = strlen(v->piece[i]);
        off += (size_t)len;
    }
    if (off != size)
        return sp_errf(err, SP_ERR_FORMAT, "%s: %zu bytes left after the %d tokens the model's vocab_size asks for",
                       path, size - off, v->n);
    return SP_OK;
}

static sp_status read_tokenizer(const char *path, int n_vocab, l2c_vocab *v, sp_err *err)
{
    if (n_vocab < L2C_FIRST_PIECE)
        return sp_errf(err, SP_ERR_FORMAT, "%s: vocab_size %d is below %d (3 special + 256 byte tokens)", path,
                       n_vocab, L2C_FIRST_PIECE);
    unsigned char *b = NULL;
    size_t size = 0;
    sp_status s = read_file(path, &b, &size, err);
    if (s != SP_OK)
        return s;
    v->n = n_vocab;
    v->piece = calloc((size_t)n_vocab, sizeof *v->piece);
    v->len = calloc((size_t)n_vocab, sizeof *v->len);
    v->score = calloc((size_t)n_vocab, sizeof *v->score);
    if (!v->piece || !v->len || !v->score)
        s = sp_errf(err, SP_ERR_NOMEM, "out of memory");
    else if (size < 4 || rd_i32(b) <= 0)
        s = sp_errf(err, SP_ERR_FORMAT, "%s: missing or invalid max_token_length header", path);
    else
        s = parse_tokens(path, b, size, v, err);
    free(b);
    return s;
}

/* ---------------------------------------------------------------------------------------------- */
/* piece -> id map and merges */

static uint64_t hash_bytes(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h;
}

/* Returns the id of piece p[0..n), or -1. */
static int map_find(const piece_map *m, const char *p, size_t n)
{
    for (size_t i = hash_bytes(p, n) & m->mask;; i = (i + 1) & m->mask) {
        int id = m->slot[i] - 1;
        if (id < 0)
            return -1;
        if (m->v->len[id] == n && memcmp(m->v->piece[id], p, n) == 0)
            return id;
    }
}

static sp_status map_build(piece_map *m, const l2c_vocab *v, const char *path, sp_err *err)
{
    size_t cap = 16;
    while (cap < (size_t)v->n * 2)
        cap *= 2;
    m->slot = calloc(cap, sizeof *m->slot);
    m->mask = cap - 1;
    m->v = v;
    if (!m->slot)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    for (int id = 0; id < v->n; id++) {
        int prev = map_find(m, v->piece[id], v->len[id]);
        if (prev >= 0)
            return sp_errf(err, SP_ERR_FORMAT, "%s: tokens %d and %d are both '%s'", path, prev, id, v->piece[id]);
        size_t i = hash_bytes(v->piece[id], v->len[id]) & m->mask;
        while (m->slot[i])
            i = (i + 1) & m->mask;
        m->slot[i] = id + 1;
    }
    return SP_OK;
}

/* Best score first; then by merged id, then by the ids of the parts (deterministic). */
static int merge_cmp(const void *pa, const void *pb)
{
    const l2c_merge *a = pa, *b = pb;
    if (a->score != b->score)
        return a->score > b->score ? -1 : 1;
    if (a->merged != b->merged)
        return a->merged < b->merged ? -1 : 1;
    if (a->left != b->left)
        return a->left < b->left ? -1 : 1;
    return (a->right > b->right) - (a->right < b->right);
}

/* Every split of a piece into two pieces (specials and byte tokens excluded) is a merge; llama2.c merges
 * the pair whose concatenation scores highest, so ranks follow the merged piece's score. */
static sp_status build_merges(const l2c_vocab *v, const piece_map *m, l2c_merge **out, size_t *nout, sp_err *err)
{
    size_t n = 0, cap = (size_t)v->n * 2;
    l2c_merge *mg = malloc(cap * sizeof *mg);
    if (!mg)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    for (int id = L2C_FIRST_PIECE; id < v->n; id++) {
        const char *p = v->piece[id];
        for (size_t k = 1; k < v->len[id]; k++) {
            if (((unsigned char)p[k] & 0xC0) == 0x80)
                continue; /* not a character boundary */
            int a = map_find(m, p, k), b = map_find(m, p + k, v->len[id] - k);
            if (a < L2C_FIRST_PIECE || b < L2C_FIRST_PIECE)
                continue;
            if (n == cap) {
                l2c_merge *g = realloc(mg, (cap *= 2) * sizeof *mg);
                if (!g) {
                    free(mg);
                    return sp_errf(err, SP_ERR_NOMEM, "out of memory");
                }
                mg = g;
            }
            mg[n++] = (l2c_merge){.score = v->score[id], .merged = id, .left = a, .right = b};
        }
    }
    qsort(mg, n, sizeof *mg, merge_cmp);
    *out = mg;
    *nout = n;
    return SP_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* tokenizer.json and friends */

static cJSON *added_token(int id, const char *content)
{
    cJSON *t = cJSON_CreateObject();
    cJSON_AddNumberToObject(t, "id", id);
    cJSON_AddStringToObject(t, "content", content);
    cJSON_AddBoolToObject(t, "single_word", 0);
    cJSON_AddBoolToObject(t, "lstrip", 0);
    cJSON_AddBoolToObject(t, "rstrip", 0);
    cJSON_AddBoolToObject(t, "normalized", 0);
    cJSON_AddBoolToObject(t, "special", 1);
    return t;
}

/* {"type": "Replace", "pattern": {"String": from}, "content": to} */
static cJSON *replace_op(const char *from, const char *to)
{
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "type", "Replace");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(r, "pattern"), "String", from);
    cJSON_AddStringToObject(r, "content", to);
    return r;
}

static cJSON *typed(const char *type)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    return o;
}

static void add_normalizer_decoder(cJSON *root)
{
    cJSON *norm = cJSON_AddObjectToObject(root, "normalizer");
    cJSON_AddStringToObject(norm, "type", "Sequence");
    cJSON *ns = cJSON_AddArrayToObject(norm, "normalizers");
    cJSON *pre = typed("Prepend");
    cJSON_AddStringToObject(pre, "prepend", SPM_SPACE);
    cJSON_AddItemToArray(ns, pre);
    cJSON_AddItemToArray(ns, replace_op(" ", SPM_SPACE));
    cJSON_AddNullToObject(root, "pre_tokenizer");

    cJSON *dec = cJSON_AddObjectToObject(root, "decoder");
    cJSON_AddStringToObject(dec, "type", "Sequence");
    cJSON *ds = cJSON_AddArrayToObject(dec, "decoders");
    cJSON_AddItemToArray(ds, replace_op(SPM_SPACE, " "));
    cJSON_AddItemToArray(ds, typed("ByteFallback"));
    cJSON_AddItemToArray(ds, typed("Fuse"));
    cJSON *strip = typed("Strip");
    cJSON_AddStringToObject(strip, "content", " ");
    cJSON_AddNumberToObject(strip, "start", 1);
    cJSON_AddNumberToObject(strip, "stop", 0);
    cJSON_AddItemToArray(ds, strip);
}

/* HF's post-processor that puts <s> (id 1) in front of every sequence. */
static void add_post_processor(cJSON *root)
{
    cJSON *pp = cJSON_AddObjectToObject(root, "post_processor");
    cJSON_AddStringToObject(pp, "type", "TemplateProcessing");
    const char *lists[2] = {"single", "pair"};
    for (int l = 0; l < 2; l++) {
        cJSON *arr = cJSON_AddArrayToObject(pp, lists[l]);
        for (int part = 0; part <= l; part++) {
            cJSON *st = cJSON_CreateObject(), *sq = cJSON_CreateObject();
            cJSON *a = cJSON_AddObjectToObject(st, "SpecialToken"), *b = cJSON_AddObjectToObject(sq, "Sequence");
            cJSON_AddStringToObject(a, "id", "<s>");
            cJSON_AddNumberToObject(a, "type_id", part);
            cJSON_AddStringToObject(b, "id", part ? "B" : "A");
            cJSON_AddNumberToObject(b, "type_id", part);
            cJSON_AddItemToArray(arr, st);
            cJSON_AddItemToArray(arr, sq);
        }
    }
    cJSON *bos = cJSON_AddObjectToObject(cJSON_AddObjectToObject(pp, "special_tokens"), "<s>");
    cJSON_AddStringToObject(bos, "id", "<s>");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(bos, "ids"), cJSON_CreateNumber(1));
    cJSON_AddItemToArray(cJSON_AddArrayToObject(bos, "tokens"), cJSON_CreateString("<s>"));
}

static void add_model(cJSON *root, const l2c_vocab *v, const l2c_merge *mg, size_t nm)
{
    cJSON *m = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(m, "type", "BPE");
    cJSON_AddNullToObject(m, "dropout");
    cJSON_AddStringToObject(m, "unk_token", "<unk>");
    cJSON_AddNullToObject(m, "continuing_subword_prefix");
    cJSON_AddNullToObject(m, "end_of_word_suffix");
    cJSON_AddBoolToObject(m, "fuse_unk", 1);
    cJSON_AddBoolToObject(m, "byte_fallback", 1);
    cJSON *vocab = cJSON_AddObjectToObject(m, "vocab");
    for (int id = 0; id < v->n; id++)
        cJSON_AddNumberToObject(vocab, v->piece[id], id);
    cJSON *merges = cJSON_AddArrayToObject(m, "merges");
    for (size_t i = 0; i < nm; i++) {
        const char *pair[2] = {v->piece[mg[i].left], v->piece[mg[i].right]};
        cJSON_AddItemToArray(merges, cJSON_CreateStringArray(pair, 2));
    }
}

/* Checks that pieces are unique and derives the merges (before anything is written). */
static sp_status prepare_merges(l2c_vocab *v, const char *path, sp_err *err)
{
    piece_map map = {0};
    sp_status s = map_build(&map, v, path, err);
    if (s == SP_OK)
        s = build_merges(v, &map, &v->merges, &v->n_merges, err);
    free(map.slot);
    return s;
}

static sp_status write_tokenizer_json(const l2c_vocab *v, const char *outdir, sp_err *err)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    for (int id = 0; id < L2C_N_SPECIAL; id++)
        cJSON_AddItemToArray(added, added_token(id, v->piece[id]));
    add_normalizer_decoder(root);
    add_post_processor(root);
    add_model(root, v, v->merges, v->n_merges);
    return sp_hf_write_json(root, outdir, "tokenizer.json", 0, err);
}

sp_status sp_spm_tokenizer_configs_write(int64_t max_len, const char *outdir, sp_err *err)
{
    cJSON *c = cJSON_CreateObject();
    cJSON_AddBoolToObject(c, "add_bos_token", 1);
    cJSON_AddBoolToObject(c, "add_eos_token", 0);
    cJSON_AddStringToObject(c, "bos_token", "<s>");
    cJSON_AddStringToObject(c, "eos_token", "</s>");
    cJSON_AddStringToObject(c, "unk_token", "<unk>");
    cJSON_AddNumberToObject(c, "model_max_length", (double)max_len);
    cJSON_AddStringToObject(c, "tokenizer_class", "LlamaTokenizer");
    cJSON_AddBoolToObject(c, "legacy", 1);
    cJSON_AddBoolToObject(c, "clean_up_tokenization_spaces", 0);
    sp_status s = sp_hf_write_json(c, outdir, "tokenizer_config.json", 1, err);
    if (s != SP_OK)
        return s;
    cJSON *g = cJSON_CreateObject();
    cJSON_AddNumberToObject(g, "bos_token_id", 1);
    cJSON_AddNumberToObject(g, "eos_token_id", 2);
    return sp_hf_write_json(g, outdir, "generation_config.json", 1, err);
}

sp_status sp_spm_tokenizer_write(char *const *pieces, const float *scores, int n, int max_len, const char *outdir,
                                 sp_err *err)
{
    if (n < L2C_FIRST_PIECE)
        return sp_errf(err, SP_ERR_ARG, "%s: a tokenizer of %d tokens, below %d (3 special + 256 byte tokens)", outdir,
                       n, L2C_FIRST_PIECE);
    l2c_vocab v = {.n = n, .piece = (char **)pieces, .score = (float *)scores};
    if (!(v.len = malloc((size_t)n * sizeof *v.len)))
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++)
        v.len[i] = strlen(pieces[i]);
    sp_status s = prepare_merges(&v, outdir, err);
    if (s == SP_OK)
        s = write_tokenizer_json(&v, outdir, err);
    if (s == SP_OK)
        s = sp_spm_tokenizer_configs_write(max_len, outdir, err);
    free(v.len);
    free(v.merges);
    return s;
}

/* ---------------------------------------------------------------------------------------------- */

sp_status sp_convert_llama2c(const char *model_bin, const char *tokenizer_bin, const char *outdir, sp_err *err)
{
    if (!model_bin || !tokenizer_bin || !outdir)
        return sp_errf(err, SP_ERR_ARG, "sp_convert_llama2c: missing path");
    if (!host_is_little_endian())
        return sp_errf(err, SP_ERR_UNSUPPORTED, "llama2.c conversion needs a little-endian host");
    /* Read and check the header and the tokenizer before writing anything. */
    unsigned char hdr[L2C_HDR_BYTES];
    FILE *f = fopen(model_bin, "rb");
    if (!f)
        return sp_errf(err, SP_ERR_IO, "%s: %s", model_bin, strerror(errno));
    size_t got = fread(hdr, 1, sizeof hdr, f);
    fclose(f);
    l2c_hdr h;
    sp_status s = parse_header(hdr, got, model_bin, &h, err);
    if (s != SP_OK)
        return s;
    if (h.vocab > INT32_MAX / 2)
        return sp_errf(err, SP_ERR_FORMAT, "%s: vocab_size %lld too large", model_bin, (long long)h.vocab);
    void *map = NULL;
    size_t size = 0;
    l2c_vocab v = {0};
    s = map_model(model_bin, &h, &map, &size, err);
    if (s == SP_OK)
        s = read_tokenizer(tokenizer_bin, (int)h.vocab, &v, err);
    if (s == SP_OK)
        s = prepare_merges(&v, tokenizer_bin, err);
    if (s == SP_OK) /* everything is validated: start writing */
        s = sp_hf_mkdir(outdir, err);
    if (s == SP_OK)
        s = write_model(&h, map, outdir, err);
    if (s == SP_OK)
        s = write_tokenizer_json(&v, outdir, err);
    if (s == SP_OK)
        s = sp_spm_tokenizer_configs_write(h.seq_len, outdir, err);
    if (map)
        munmap(map, size);
    vocab_free(&v);
    return s;
}
