/* like.c - models of real shape with random weights: see like.h.
 *
 * The work: the config of the model named (its published config.json's fields, cut as asked), checked by the
 * config parser the loaders use; the list of its tensors under its family's names (what core/block.c and
 * core/model.c read); shards planned as transformers plans them (in order, a new shard when the next tensor
 * would pass the size); each shard streamed through the safetensors writer a chunk at a time. */
#include "like.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "convert_llama2c.h"
#include "half.h"
#include "hfdir.h"
#include "rng.h"
#include "safetensors.h"

#define INIT_STD 0.02f        /* transformers' initializer_range */
#define CHUNK (1 << 16)       /* values generated and written at a time */
#define PROGRESS_EVERY (64u << 20)

/* A published model's shapes (from its config.json on the Hugging Face hub). */
typedef struct like_model {
    const char *name, *source;
    sp_arch arch;
    int hidden, intermediate, layers, heads, kv_heads, vocab, max_pos;
    double rope_theta;
    int experts, top_k;
} like_model;

static const like_model like_models[] = {
    {"llama-2-7b", "meta-llama/Llama-2-7b-hf", SP_ARCH_LLAMA, 4096, 11008, 32, 32, 32, 32000, 4096, 1e4, 0, 0},
    {"llama-2-70b", "meta-llama/Llama-2-70b-hf", SP_ARCH_LLAMA, 8192, 28672, 80, 64, 8, 32000, 4096, 1e4, 0, 0},
    {"llama-3-8b", "meta-llama/Meta-Llama-3-8B", SP_ARCH_LLAMA, 4096, 14336, 32, 32, 8, 128256, 8192, 5e5, 0, 0},
    {"mixtral-8x7b", "mistralai/Mixtral-8x7B-v0.1", SP_ARCH_MIXTRAL, 4096, 14336, 32, 32, 8, 32000, 32768, 1e6, 8, 2},
    {"falcon-40b", "tiiuae/falcon-40b", SP_ARCH_FALCON, 8192, 32768, 60, 128, 8, 65024, 2048, 1e4, 0, 0},
    {"bloom-7b1", "bigscience/bloom-7b1", SP_ARCH_BLOOM, 4096, 16384, 30, 32, 32, 250880, 2048, 0, 0, 0},
};

static const like_model *find_model(const char *name)
{
    for (size_t i = 0; name && i < sizeof like_models / sizeof *like_models; i++)
        if (strcmp(like_models[i].name, name) == 0)
            return &like_models[i];
    return NULL;
}

int sp_like_vocab(const char *like)
{
    const like_model *m = find_model(like);
    return m ? m->vocab : 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* config.json */

/* The width asked for: heads and KV heads stay, the head size follows, the MLP in proportion. */
static sp_status cut_width(const like_model *m, int hidden, int *ff, sp_err *err)
{
    int rope = m->arch != SP_ARCH_BLOOM, hd = hidden / m->heads;
    if (hidden < 64 || hidden > m->hidden || hidden % 64 || hidden % m->heads || (rope && hd % 2))
        return sp_errf(err, SP_ERR_ARG,
                       "--hidden %d: %s's width can be cut to a multiple of 64 up to %d that its %d heads divide "
                       "into heads of %s size", hidden, m->name, m->hidden, m->heads, rope ? "an even" : "one");
    long long scaled = (long long)m->intermediate * hidden / m->hidden;
    *ff = (int)((scaled + 63) / 64 * 64);
    return SP_OK;
}

static void add_common(cJSON *c, const like_model *m, const char *cls, const char *type, sp_dtype dtype)
{
    cJSON_AddItemToArray(cJSON_AddArrayToObject(c, "architectures"), cJSON_CreateString(cls));
    cJSON_AddStringToObject(c, "model_type", type);
    cJSON_AddNumberToObject(c, "vocab_size", m->vocab);
    cJSON_AddNumberToObject(c, "bos_token_id", 1); /* the tokenizer's <s> and </s>, both kinds of it */
    cJSON_AddNumberToObject(c, "eos_token_id", 2);
    cJSON_AddNumberToObject(c, "initializer_range", INIT_STD);
    cJSON_AddStringToObject(c, "torch_dtype", dtype == SP_BF16 ? "bfloat16" : "float32");
}

/* The model's config.json, with `layers` layers of width `hidden` (MLP `ff`). */
static cJSON *make_config(const like_model *m, int layers, int hidden, int ff, sp_dtype dtype)
{
    cJSON *c = cJSON_CreateObject();
    if (!c)
        return NULL;
    if (m->arch == SP_ARCH_LLAMA || m->arch == SP_ARCH_MIXTRAL) {
        int mx = m->arch == SP_ARCH_MIXTRAL;
        add_common(c, m, mx ? "MixtralForCausalLM" : "LlamaForCausalLM", mx ? "mixtral" : "llama", dtype);
        cJSON_AddNumberToObject(c, "hidden_size", hidden);
        cJSON_AddNumberToObject(c, "intermediate_size", ff);
        cJSON_AddNumberToObject(c, "num_hidden_layers", layers);
        cJSON_AddNumberToObject(c, "num_attention_heads", m->heads);
        cJSON_AddNumberToObject(c, "num_key_value_heads", m->kv_heads);
        cJSON_AddNumberToObject(c, "max_position_embeddings", m->max_pos);
        cJSON_AddNumberToObject(c, "rms_norm_eps", 1e-5);
        cJSON_AddNumberToObject(c, "rope_theta", m->rope_theta);
        cJSON_AddStringToObject(c, "hidden_act", "silu");
        cJSON_AddBoolToObject(c, "tie_word_embeddings", 0);
        cJSON_AddBoolToObject(c, "attention_bias", 0);
        if (mx) {
            cJSON_AddNumberToObject(c, "num_local_experts", m->experts);
            cJSON_AddNumberToObject(c, "num_experts_per_tok", m->top_k);
            cJSON_AddNullToObject(c, "sliding_window");
        }
    } else if (m->arch == SP_ARCH_FALCON) { /* 40B: new_decoder_architecture, two LayerNorms, no biases */
        add_common(c, m, "FalconForCausalLM", "falcon", dtype);
        cJSON_AddNumberToObject(c, "hidden_size", hidden); /* the MLP is 4 x hidden_size */
        cJSON_AddNumberToObject(c, "num_hidden_layers", layers);
        cJSON_AddNumberToObject(c, "num_attention_heads", m->heads);
        cJSON_AddNumberToObject(c, "num_kv_heads", m->kv_heads);
        cJSON_AddBoolToObject(c, "new_decoder_architecture", 1);
        cJSON_AddBoolToObject(c, "parallel_attn", 1);
        cJSON_AddBoolToObject(c, "bias", 0);
        cJSON_AddBoolToObject(c, "alibi", 0);
        cJSON_AddNumberToObject(c, "layer_norm_epsilon", 1e-5);
        cJSON_AddNumberToObject(c, "max_position_embeddings", m->max_pos);
        cJSON_AddNumberToObject(c, "rope_theta", m->rope_theta);
    } else { /* BLOOM: ALiBi, so no context length of its own (our default, 2048) */
        add_common(c, m, "BloomForCausalLM", "bloom", dtype);
        cJSON_AddNumberToObject(c, "hidden_size", hidden);
        cJSON_AddNumberToObject(c, "n_layer", layers);
        cJSON_AddNumberToObject(c, "n_head", m->heads);
        cJSON_AddNumberToObject(c, "layer_norm_epsilon", 1e-5);
        cJSON_AddBoolToObject(c, "apply_residual_connection_post_layernorm", 0);
    }
    return c;
}

/* ---------------------------------------------------------------------------------------------- */
/* the tensors */

typedef enum { T_NORMAL, T_ONES, T_ZEROS } tinit;

typedef struct ltensor {
    char name[96];
    int ndim;
    int64_t shape[2];
    tinit init;
    int shard;
} ltensor;

typedef struct tlist {
    ltensor *t;
    int n, cap;
    int oom;
} tlist;

static void add(tlist *l, tinit init, int64_t d0, int64_t d1, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void add(tlist *l, tinit init, int64_t d0, int64_t d1, const char *fmt, ...)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 256;
        ltensor *t = realloc(l->t, (size_t)cap * sizeof *t);
        if (!t) {
            l->oom = 1;
            return;
        }
        l->t = t;
        l->cap = cap;
    }
    ltensor *t = &l->t[l->n++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->ndim = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->init = init;
}

/* "<p><name>.weight" [out, in] at the init scale and its bias [out] at 0 when it has one. */
static void add_linear(tlist *l, const char *p, const char *name, int64_t out, int64_t in, int bias)
{
    add(l, T_NORMAL, out, in, "%s%s.weight", p, name);
    if (bias)
        add(l, T_ZEROS, out, 0, "%s%s.bias", p, name);
}

static void add_norm(tlist *l, const sp_config *c, const char *p, const char *name)
{
    add(l, T_ONES, c->hidden, 0, "%s%s.weight", p, name);
    if (c->blk.norm == SP_NORM_LAYER)
        add(l, T_ZEROS, c->hidden, 0, "%s%s.bias", p, name);
}

/* Llama and Mixtral: model.layers.i.*, in the order transformers' modules hold them. */
static void llama_block(tlist *l, const sp_config *c, int i)
{
    char p[64];
    snprintf(p, sizeof p, "model.layers.%d.", i);
    int64_t H = c->hidden, Q = (int64_t)c->n_heads * c->head_dim, KV = (int64_t)c->n_kv_heads * c->head_dim;
    int64_t FF = c->intermediate;
    add_linear(l, p, "self_attn.q_proj", Q, H, 0);
    add_linear(l, p, "self_attn.k_proj", KV, H, 0);
    add_linear(l, p, "self_attn.v_proj", KV, H, 0);
    add_linear(l, p, "self_attn.o_proj", H, Q, 0);
    if (c->blk.mlp == SP_MLP_MOE) {
        add_linear(l, p, "block_sparse_moe.gate", c->blk.n_experts, H, 0);
        for (int e = 0; e < c->blk.n_experts; e++) { /* w1 gate, w2 down, w3 up */
            char n[64];
            for (int j = 1; j <= 3; j++) {
                snprintf(n, sizeof n, "block_sparse_moe.experts.%d.w%d", e, j);
                add_linear(l, p, n, j == 2 ? H : FF, j == 2 ? FF : H, 0);
            }
        }
    } else {
        add_linear(l, p, "mlp.gate_proj", FF, H, 0);
        add_linear(l, p, "mlp.up_proj", FF, H, 0);
        add_linear(l, p, "mlp.down_proj", H, FF, 0);
    }
    add_norm(l, c, p, "input_layernorm");
    add_norm(l, c, p, "post_attention_layernorm");
}

/* Falcon and BLOOM: transformer.h.i.*, one fused query_key_value (per KV group: its queries, key, value). */
static void fused_block(tlist *l, const sp_config *c, int i)
{
    char p[64];
    snprintf(p, sizeof p, "transformer.h.%d.", i);
    int64_t H = c->hidden, Q = (int64_t)c->n_heads * c->head_dim, FF = c->intermediate;
    int64_t R = (int64_t)(c->n_heads + 2 * c->n_kv_heads) * c->head_dim;
    int two = c->arch == SP_ARCH_FALCON && c->blk.parallel && c->blk.norms == 2;
    add_norm(l, c, p, two ? "ln_attn" : "input_layernorm");
    if (c->blk.norms == 2)
        add_norm(l, c, p, two ? "ln_mlp" : "post_attention_layernorm");
    add_linear(l, p, "self_attention.query_key_value", R, H, c->blk.qkv_bias);
    add_linear(l, p, "self_attention.dense", H, Q, c->blk.out_bias);
    add_linear(l, p, "mlp.dense_h_to_4h", FF, H, c->blk.mlp_bias);
    add_linear(l, p, "mlp.dense_4h_to_h", H, FF, c->blk.mlp_bias);
}

static void list_tensors(tlist *l, const sp_config *c)
{
    int llama = c->arch == SP_ARCH_LLAMA || c->arch == SP_ARCH_MIXTRAL;
    const char *p = llama ? "model." : "transformer.";
    add(l, T_NORMAL, c->vocab, c->hidden, "%s",
        llama ? "model.embed_tokens.weight" : "transformer.word_embeddings.weight");
    if (c->embed_norm)
        add_norm(l, c, p, "word_embeddings_layernorm");
    for (int i = 0; i < c->n_layers; i++)
        (llama ? llama_block : fused_block)(l, c, i);
    add_norm(l, c, p, llama ? "norm" : "ln_f");
    if (!c->tie_embeddings)
        add(l, T_NORMAL, c->vocab, c->hidden, "lm_head.weight");
}

static uint64_t tensor_bytes(const ltensor *t, sp_dtype dt)
{
    return (uint64_t)t->shape[0] * (uint64_t)(t->ndim == 2 ? t->shape[1] : 1) * sp_dtype_size(dt);
}

/* transformers' plan: in order, a new shard when the next tensor would take this one past max (a tensor larger
 * than max alone in its own). Returns the number of shards. */
static int plan_shards(tlist *l, sp_dtype dt, uint64_t max)
{
    int shard = 0;
    uint64_t size = 0;
    for (int i = 0; i < l->n; i++) {
        uint64_t b = tensor_bytes(&l->t[i], dt);
        if (size > 0 && size + b > max) {
            shard++;
            size = 0;
        }
        l->t[i].shard = shard;
        size += b;
    }
    return shard + 1;
}

/* ---------------------------------------------------------------------------------------------- */
/* writing */

typedef struct writer {
    const sp_like_opts *o;
    const char *dir;
    int shards;
    uint64_t done, total, next_progress;
    float f[CHUNK];
    uint16_t h[CHUNK];
} writer;

static void shard_name(const writer *w, int s, char *buf, size_t cap)
{
    if (w->shards == 1)
        snprintf(buf, cap, "model.safetensors");
    else
        snprintf(buf, cap, "model-%05d-of-%05d.safetensors", s + 1, w->shards);
}

/* A tensor's values depend on the seed and its name only. */
static void seed_tensor(sp_rng *r, uint64_t seed, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const char *c = name; *c; c++)
        h = (h ^ (unsigned char)*c) * 0x100000001b3ull;
    sp_rng_seed(r, seed * 0x9E3779B97F4A7C15ull ^ h);
}

static sp_status put_tensor(writer *w, sp_st_writer *sw, const ltensor *t, sp_err *err)
{
    sp_rng r;
    seed_tensor(&r, w->o->seed, t->name);
    uint64_t n = (uint64_t)t->shape[0] * (uint64_t)(t->ndim == 2 ? t->shape[1] : 1);
    int bf16 = w->o->dtype == SP_BF16;
    for (uint64_t i = 0; i < n; i += CHUNK) {
        if (w->o->cancel && __atomic_load_n(w->o->cancel, __ATOMIC_RELAXED))
            return sp_errf(err, SP_ERR_CANCELLED, "model init: interrupted");
        long k = (long)(n - i < CHUNK ? n - i : CHUNK);
        if (t->init == T_NORMAL)
            sp_rng_fill_normal_fast(&r, w->f, k, INIT_STD);
        else
            for (long j = 0; j < k; j++)
                w->f[j] = t->init == T_ONES ? 1.0f : 0.0f;
        for (long j = 0; bf16 && j < k; j++)
            w->h[j] = sp_f32_to_bf16(w->f[j]);
        sp_status s = sp_st_writer_put(sw, bf16 ? (const void *)w->h : (const void *)w->f,
                                       (size_t)k * sp_dtype_size(w->o->dtype), err);
        if (s)
            return s;
        w->done += (uint64_t)k * sp_dtype_size(w->o->dtype);
        if (w->o->progress && (w->done >= w->next_progress || w->done == w->total)) {
            w->o->progress(w->o->user, w->done, w->total);
            w->next_progress = w->done + PROGRESS_EVERY;
        }
    }
    return SP_OK;
}

static sp_status write_shard(writer *w, const tlist *l, int s, const char *meta, sp_err *err)
{
    int first = 0, n = 0;
    while (first < l->n && l->t[first].shard != s)
        first++;
    while (first + n < l->n && l->t[first + n].shard == s)
        n++;
    sp_st_wtensor *wt = calloc((size_t)n, sizeof *wt);
    if (!wt)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        const ltensor *t = &l->t[first + i];
        wt[i] = (sp_st_wtensor){.name = t->name, .dtype = w->o->dtype, .ndim = t->ndim,
                                .shape = {t->shape[0], t->shape[1]}};
    }
    char name[64], path[4096];
    shard_name(w, s, name, sizeof name);
    sp_st_writer *sw = NULL;
    sp_status st = sp_hf_path(path, sizeof path, w->dir, name, err);
    if (!st)
        st = sp_st_writer_open(&sw, path, wt, n, meta, err);
    for (int i = 0; !st && i < n; i++)
        st = put_tensor(w, sw, &l->t[first + i], err);
    free(wt);
    if (st) {
        sp_st_writer_abort(sw);
        return st;
    }
    return sp_st_writer_close(sw, err);
}

/* model.safetensors.index.json: {"metadata": {"total_size": N}, "weight_map": {tensor: shard file}}. */
static sp_status write_index(writer *w, const tlist *l, sp_err *err)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(root, "metadata"), "total_size", (double)w->total);
    cJSON *map = cJSON_AddObjectToObject(root, "weight_map");
    for (int i = 0; i < l->n; i++) {
        char name[64];
        shard_name(w, l->t[i].shard, name, sizeof name);
        cJSON_AddStringToObject(map, l->t[i].name, name);
    }
    return sp_hf_write_json(root, w->dir, "model.safetensors.index.json", 1, err);
}

/* ---------------------------------------------------------------------------------------------- */
/* the tokenizer */

/* A Llama-style tokenizer of n tokens: the 3 special and 256 byte tokens, then every string of 1, 2, 3, ...
 * characters of a 64-letter alphabet (U+2581, the word mark, among them) in that order, shorter ones merged
 * first. It encodes any text (byte fallback) and decodes every id. */
static sp_status synthetic_tokenizer(int n, int max_len, const char *dir, sp_err *err)
{
    static const char *const specials[3] = {"<unk>", "<s>", "</s>"};
    static const char alpha[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.";
    char **piece = calloc((size_t)n, sizeof *piece);
    float *score = calloc((size_t)n, sizeof *score);
    sp_status s = piece && score ? SP_OK : sp_errf(err, SP_ERR_NOMEM, "out of memory");
    for (int id = 0; !s && id < n; id++) {
        char buf[64] = "";
        if (id < 3)
            snprintf(buf, sizeof buf, "%s", specials[id]);
        else if (id < 259)
            snprintf(buf, sizeof buf, "<0x%02X>", id - 3);
        else {
            long k = id - 259, len = 1, count = 64, digit[8]; /* the k-th string: its length, then its letters */
            while (k >= count)
                k -= count, count *= 64, len++;
            for (long c = len - 1; c >= 0; c--, k /= 64)
                digit[c] = k % 64;
            char *o = buf;
            for (long c = 0; c < len; c++) {
                if (digit[c] == 63)
                    o += sprintf(o, "\xE2\x96\x81");
                else
                    *o++ = alpha[digit[c]];
            }
            *o = '\0';
            score[id] = -(float)(id - 259);
        }
        if (!(piece[id] = strdup(buf)))
            s = sp_errf(err, SP_ERR_NOMEM, "out of memory");
    }
    if (!s)
        s = sp_spm_tokenizer_write(piece, score, n, max_len, dir, err);
    for (int id = 0; piece && id < n; id++)
        free(piece[id]);
    free(piece);
    free(score);
    return s;
}

/* tokenizer.json, tokenizer_config.json and generation_config.json: a copy of o->tokenizer's when the vocabulary
 * is 32000 wide, else made. */
static sp_status write_tokenizer(writer *w, const sp_config *c, sp_like_result *r, sp_err *err)
{
    char src[4096];
    r->synthetic_tokenizer = !w->o->tokenizer || c->vocab != 32000 ||
                             sp_hf_path(src, sizeof src, w->o->tokenizer, "tokenizer.json", NULL) ||
                             access(src, R_OK) != 0;
    if (r->synthetic_tokenizer)
        return synthetic_tokenizer(c->vocab, c->max_pos, w->dir, err);
    sp_status s = sp_hf_copy(src, w->dir, "tokenizer.json", err);
    return s ? s : sp_spm_tokenizer_configs_write(c->max_pos, w->dir, err);
}

/* Removes what was written: every name this writes (the directory was new or empty), and the directory when
 * this made it. */
static void undo(writer *w, int made_dir)
{
    static const char *const fixed[] = {"model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
                                        "generation_config.json", "config.json"};
    char name[64], path[4096];
    for (int i = 0; i < w->shards + 5; i++) {
        if (i < w->shards)
            shard_name(w, i, name, sizeof name);
        else
            snprintf(name, sizeof name, "%s", fixed[i - w->shards]);
        if (!sp_hf_path(path, sizeof path, w->dir, name, NULL))
            unlink(path);
    }
    if (made_dir)
        rmdir(w->dir);
}

/* 0: dir does not exist; 1: it is an empty directory; -1 (err set) otherwise. */
static int dir_state(const char *dir, sp_err *err)
{
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return errno == ENOENT ? 0 : (sp_errf(err, SP_ERR_IO, "%s: %s", dir, strerror(errno)), -1);
    if (!S_ISDIR(sb.st_mode))
        return sp_errf(err, SP_ERR_ARG, "%s: not a directory", dir), -1;
    DIR *d = opendir(dir);
    if (!d)
        return sp_errf(err, SP_ERR_IO, "%s: %s", dir, strerror(errno)), -1;
    struct dirent *e;
    int empty = 1;
    while (empty && (e = readdir(d)))
        empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    closedir(d);
    if (!empty)
        return sp_errf(err, SP_ERR_ARG, "%s: not empty (model init writes a new directory)", dir), -1;
    return 1;
}

/* The config asked for, as text and parsed (the loaders' checks). */
static sp_status build_config(const sp_like_opts *o, char **json, sp_config *c, sp_err *err)
{
    const like_model *m = find_model(o->like);
    if (!m)
        return sp_errf(err, SP_ERR_ARG, "--like %s: not a model we know (%s)", o->like ? o->like : "",
                       SP_LIKE_NAMES);
    if (o->dtype != SP_BF16 && o->dtype != SP_F32)
        return sp_errf(err, SP_ERR_ARG, "model init: the weights are written as bf16 or f32");
    if (o->layers < 0 || o->layers > m->layers)
        return sp_errf(err, SP_ERR_ARG, "--layers %d: %s has %d layers (--layers keeps the width and cuts the depth)",
                       o->layers, m->name, m->layers);
    int hidden = o->hidden ? o->hidden : m->hidden, ff = m->intermediate;
    if (o->hidden && cut_width(m, hidden, &ff, err))
        return SP_ERR_ARG;
    cJSON *root = make_config(m, o->layers ? o->layers : m->layers, hidden, ff, o->dtype);
    *json = root ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!*json)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    return sp_config_parse(c, *json, "config.json", err);
}

static sp_status write_all(writer *w, const tlist *l, const sp_config *c, const char *json, sp_like_result *r,
                           sp_err *err)
{
    char meta[256];
    snprintf(meta, sizeof meta, "{\"format\":\"pt\",\"sepal_init\":\"--like %s --layers %d --hidden %d --seed %llu\"}",
             w->o->like, c->n_layers, c->hidden, (unsigned long long)w->o->seed);
    sp_status s = SP_OK;
    for (int i = 0; !s && i < w->shards; i++)
        s = write_shard(w, l, i, meta, err);
    if (!s && w->shards > 1)
        s = write_index(w, l, err);
    if (!s)
        s = write_tokenizer(w, c, r, err);
    if (!s) /* last: a directory with a config.json is whole */
        s = sp_hf_write_json(cJSON_Parse(json), w->dir, "config.json", 1, err);
    return s;
}

sp_status sp_like_init(const char *outdir, const sp_like_opts *o, sp_like_result *r, sp_err *err)
{
    memset(r, 0, sizeof *r);
    char *json = NULL;
    sp_config c;
    sp_status s = build_config(o, &json, &c, err);
    int state = s ? -1 : dir_state(outdir, err);
    if (state < 0) {
        free(json);
        return s ? s : err ? err->code : SP_ERR_ARG;
    }
    tlist l = {0};
    list_tensors(&l, &c);
    writer *w = l.oom ? NULL : calloc(1, sizeof *w);
    if (!w) {
        free(l.t);
        free(json);
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    }
    *w = (writer){.o = o, .dir = outdir};
    w->shards = plan_shards(&l, o->dtype, o->shard_bytes ? o->shard_bytes : SP_LIKE_SHARD_BYTES);
    for (int i = 0; i < l.n; i++)
        w->total += tensor_bytes(&l.t[i], o->dtype);
    *r = (sp_like_result){.layers = c.n_layers, .hidden = c.hidden, .params = sp_config_total_params(&c),
                          .bytes = w->total, .shards = w->shards, .vocab = c.vocab};
    if (w->shards > 99999)
        s = sp_errf(err, SP_ERR_ARG, "model init: %d shards; give a larger --shard-size", w->shards);
    if (!s)
        s = sp_hf_mkdir(outdir, err);
    if (!s)
        s = write_all(w, &l, &c, json, r, err);
    if (s)
        undo(w, state == 0);
    free(w);
    free(l.t);
    free(json);
    return s;
}

sp_status sp_like_parse_size(const char *s, uint64_t *bytes, sp_err *err)
{
    static const struct {
        const char *unit;
        double mult;
    } units[] = {{"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"KIB", 1024.0},
                 {"MIB", 1048576.0}, {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
    char *end = NULL;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    for (size_t i = 0; end && end != s && !errno && v > 0 && i < sizeof units / sizeof *units; i++)
        if (strcasecmp(end, units[i].unit) == 0 && v * units[i].mult >= 1 && v * units[i].mult < 1.8e19) {
            *bytes = (uint64_t)(v * units[i].mult);
            return SP_OK;
        }
    return sp_errf(err, SP_ERR_ARG, "--shard-size: expected a size such as 5GB, 500MB or 2GiB, got '%s'",
                   s ? s : "");
}
