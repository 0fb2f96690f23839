/* config.c - HF config.json -> sp_config. Accepts both rope_theta/rope_scaling (transformers <= 4)
 * and rope_parameters (transformers 5). */
#include "config.h"

#include <cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Families by model_type (Petals dispatches on it too), and by architectures[0] for configs without one. */
static const struct {
    const char *model_type, *prefix;
    sp_arch arch;
} arch_table[] = {
    {"llama", "Llama", SP_ARCH_LLAMA},
    {"bloom", "Bloom", SP_ARCH_BLOOM},
    {"falcon", "Falcon", SP_ARCH_FALCON},
    {"mixtral", "Mixtral", SP_ARCH_MIXTRAL},
};

const char *sp_arch_name(sp_arch a)
{
    switch (a) {
    case SP_ARCH_LLAMA: return "llama";
    case SP_ARCH_BLOOM: return "bloom";
    case SP_ARCH_FALCON: return "falcon";
    case SP_ARCH_MIXTRAL: return "mixtral";
    default: return "unknown";
    }
}

sp_status sp_config_check_supported(const sp_config *cfg, sp_err *err)
{
    if (cfg->arch != SP_ARCH_UNKNOWN)
        return SP_OK;
    return sp_errf(err, SP_ERR_UNSUPPORTED, "unsupported architecture: %s (supported: " SP_SUPPORTED_ARCHS ")",
                   cfg->model_type[0] ? cfg->model_type : cfg->architecture);
}

/* First of the given keys present as a number; 1 if found. */
static int get_num(const cJSON *root, double *out, const char *k1, const char *k2, const char *k3)
{
    const char *keys[] = {k1, k2, k3};
    for (int i = 0; i < 3; i++) {
        const cJSON *v = keys[i] ? cJSON_GetObjectItemCaseSensitive(root, keys[i]) : NULL;
        if (cJSON_IsNumber(v)) {
            *out = v->valuedouble;
            return 1;
        }
    }
    return 0;
}

static int get_int(const cJSON *root, int *out, const char *k1, const char *k2, const char *k3)
{
    double d;
    if (!get_num(root, &d, k1, k2, k3) || d != (double)(int)d)
        return 0;
    *out = (int)d;
    return 1;
}

static int get_bool(const cJSON *root, const char *key, int dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static void get_str(const cJSON *root, const char *key, char *dst, size_t cap)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (cJSON_IsString(v))
        snprintf(dst, cap, "%s", v->valuestring);
}

/* Reads RoPE settings from rope_parameters (v5) or rope_theta + rope_scaling (v4). */
static sp_status parse_rope(sp_config *c, const cJSON *root, const char *src, sp_err *err)
{
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    c->rope_theta = 10000.0;
    get_num(root, &c->rope_theta, "rope_theta", NULL, NULL);
    const cJSON *p = cJSON_IsObject(rp) ? rp : cJSON_IsObject(rs) ? rs : NULL;
    c->rope_type = SP_ROPE_DEFAULT;
    if (!p)
        return SP_OK;
    get_num(p, &c->rope_theta, "rope_theta", NULL, NULL);
    char type[32] = "default";
    get_str(p, "rope_type", type, sizeof type);
    if (strcmp(type, "default") == 0)
        get_str(p, "type", type, sizeof type);
    if (strcmp(type, "default") == 0)
        return SP_OK;
    if (!get_num(p, &c->rope_factor, "factor", NULL, NULL) || c->rope_factor <= 0)
        return sp_errf(err, SP_ERR_FORMAT, "%s: rope scaling '%s' needs a positive factor", src, type);
    if (strcmp(type, "linear") == 0) {
        c->rope_type = SP_ROPE_LINEAR;
        return SP_OK;
    }
    if (strcmp(type, "llama3") == 0) {
        c->rope_type = SP_ROPE_LLAMA3;
        if (!get_num(p, &c->rope_low_freq_factor, "low_freq_factor", NULL, NULL) ||
            !get_num(p, &c->rope_high_freq_factor, "high_freq_factor", NULL, NULL) ||
            !get_int(p, &c->rope_orig_max_pos, "original_max_position_embeddings", NULL, NULL))
            return sp_errf(err, SP_ERR_FORMAT,
                           "%s: llama3 rope scaling needs low_freq_factor, high_freq_factor, "
                           "original_max_position_embeddings", src);
        if (c->rope_high_freq_factor <= c->rope_low_freq_factor || c->rope_low_freq_factor <= 0)
            return sp_errf(err, SP_ERR_FORMAT, "%s: llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor",
                           src);
        return SP_OK;
    }
    return sp_errf(err, SP_ERR_UNSUPPORTED, "%s: unsupported rope scaling type '%s'", src, type);
}

static sp_dtype parse_dtype(const cJSON *root)
{
    char s[32] = "float32";
    get_str(root, "torch_dtype", s, sizeof s);
    get_str(root, "dtype", s, sizeof s);
    if (strcmp(s, "float16") == 0)
        return SP_F16;
    if (strcmp(s, "bfloat16") == 0)
        return SP_BF16;
    return SP_F32;
}

/* Fields every architecture we know has, under their various names. */
static sp_status parse_common(sp_config *c, const cJSON *root, const char *src, sp_err *err)
{
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    if (cJSON_IsString(a0))
        snprintf(c->architecture, sizeof c->architecture, "%s", a0->valuestring);
    get_str(root, "model_type", c->model_type, sizeof c->model_type);
    if (!c->architecture[0] && !c->model_type[0])
        return sp_errf(err, SP_ERR_FORMAT, "%s: missing field 'architectures' (and 'model_type')", src);
    for (size_t i = 0; i < sizeof arch_table / sizeof *arch_table; i++)
        if (c->model_type[0] ? strcmp(c->model_type, arch_table[i].model_type) == 0
                             : strncmp(c->architecture, arch_table[i].prefix, strlen(arch_table[i].prefix)) == 0)
            c->arch = arch_table[i].arch;
    if (!c->architecture[0])
        snprintf(c->architecture, sizeof c->architecture, "%s", c->model_type);
    if (!get_int(root, &c->hidden, "hidden_size", "n_embed", "n_embd"))
        return sp_errf(err, SP_ERR_FORMAT, "%s: missing field 'hidden_size'", src);
    if (!get_int(root, &c->n_layers, "num_hidden_layers", "n_layer", NULL))
        return sp_errf(err, SP_ERR_FORMAT, "%s: missing field 'num_hidden_layers'", src);
    if (!get_int(root, &c->n_heads, "num_attention_heads", "n_head", NULL))
        return sp_errf(err, SP_ERR_FORMAT, "%s: missing field 'num_attention_heads'", src);
    if (!get_int(root, &c->vocab, "vocab_size", NULL, NULL))
        return sp_errf(err, SP_ERR_FORMAT, "%s: missing field 'vocab_size'", src);
    if (c->hidden <= 0 || c->n_layers <= 0 || c->n_heads <= 0 || c->vocab <= 0)
        return sp_errf(err, SP_ERR_FORMAT, "%s: hidden_size, num_hidden_layers, num_attention_heads and vocab_size "
                       "must be positive", src);
    c->n_kv_heads = c->n_heads;
    get_int(root, &c->n_kv_heads, "num_key_value_heads", "num_kv_heads", NULL);
    c->head_dim = c->hidden / c->n_heads;
    get_int(root, &c->head_dim, "head_dim", NULL, NULL);
    c->intermediate = 4 * c->hidden;
    get_int(root, &c->intermediate, "intermediate_size", "ffn_hidden_size", NULL);
    c->max_pos = 2048;
    get_int(root, &c->max_pos, "max_position_embeddings", "seq_length", "max_seq_len");
    double eps = 1e-5;
    get_num(root, &eps, "rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps");
    c->norm_eps = (float)eps;
    /* transformers' defaults: LlamaConfig and MixtralConfig untie, BLOOM and Falcon tie */
    c->tie_embeddings = get_bool(root, "tie_word_embeddings", c->arch != SP_ARCH_LLAMA && c->arch != SP_ARCH_MIXTRAL);
    c->bos_id = c->eos_id = -1;
    get_int(root, &c->bos_id, "bos_token_id", NULL, NULL);
    get_int(root, &c->eos_id, "eos_token_id", NULL, NULL);
    c->dtype = parse_dtype(root);
    snprintf(c->hidden_act, sizeof c->hidden_act, "silu");
    get_str(root, "hidden_act", c->hidden_act, sizeof c->hidden_act);
    c->attention_bias = get_bool(root, "attention_bias", 0);
    c->mlp_bias = get_bool(root, "mlp_bias", 0);
    return SP_OK;
}

static sp_status require(const cJSON *root, const char *const *fields, size_t n, const char *src, sp_err *err)
{
    for (size_t i = 0; i < n; i++)
        if (!cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(root, fields[i])))
            return sp_errf(err, SP_ERR_FORMAT, "%s: missing field '%s'", src, fields[i]);
    return SP_OK;
}

/* Heads, KV heads and head size every family needs consistent. */
static sp_status check_heads(const sp_config *c, const char *kv_name, const char *src, sp_err *err)
{
    if (c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads != 0)
        return sp_errf(err, SP_ERR_FORMAT, "%s: num_attention_heads (%d) must be a multiple of %s (%d)", src,
                       c->n_heads, kv_name, c->n_kv_heads);
    if (c->head_dim <= 0 || (c->blk.pos == SP_POS_ROPE && c->head_dim % 2 != 0))
        return sp_errf(err, SP_ERR_FORMAT, "%s: head_dim %d must be positive%s", src, c->head_dim,
                       c->blk.pos == SP_POS_ROPE ? " and even" : "");
    if (c->blk.qkv == SP_QKV_FUSED && c->head_dim * c->n_heads != c->hidden)
        return sp_errf(err, SP_ERR_FORMAT, "%s: hidden_size %d is not a multiple of num_attention_heads %d", src,
                       c->hidden, c->n_heads);
    if (c->intermediate <= 0)
        return sp_errf(err, SP_ERR_FORMAT, "%s: the MLP's intermediate size must be positive", src);
    return SP_OK;
}

/* Llama: RMSNorm, RoPE, GQA, SwiGLU; every field of its block must be present. */
static sp_status check_llama(sp_config *c, const cJSON *root, const char *src, sp_err *err)
{
    static const char *const required[] = {"hidden_size", "intermediate_size", "num_hidden_layers",
                                           "num_attention_heads", "vocab_size", "rms_norm_eps"};
    sp_status s = require(root, required, sizeof required / sizeof *required, src, err);
    if (s)
        return s;
    c->blk = (sp_block_kind){.norm = SP_NORM_RMS, .pos = SP_POS_ROPE, .mlp = SP_MLP_SWIGLU, .qkv = SP_QKV_SPLIT,
                             .norms = 2};
    if ((s = check_heads(c, "num_key_value_heads", src, err)))
        return s;
    if (strcmp(c->hidden_act, "silu") != 0)
        return sp_errf(err, SP_ERR_UNSUPPORTED, "%s: hidden_act '%s' not supported for %s (silu only)", src,
                       c->hidden_act, sp_arch_name(c->arch));
    if (c->attention_bias || c->mlp_bias)
        return sp_errf(err, SP_ERR_UNSUPPORTED, "%s: llama with attention_bias/mlp_bias is not supported yet", src);
    return parse_rope(c, root, src, err);
}

/* Mixtral: a Llama block whose MLP is a sparse mixture of SwiGLU experts (w1 gate, w3 up, w2 down) behind a
 * router: softmax over the experts, the top num_experts_per_tok, their weights renormalised. */
static sp_status check_mixtral(sp_config *c, const cJSON *root, const char *src, sp_err *err)
{
    sp_status s = check_llama(c, root, src, err);
    if (s)
        return s;
    c->blk.mlp = SP_MLP_MOE;
    if (!get_int(root, &c->blk.n_experts, "num_local_experts", NULL, NULL) ||
        !get_int(root, &c->blk.top_k, "num_experts_per_tok", NULL, NULL))
        return sp_errf(err, SP_ERR_FORMAT, "%s: missing field 'num_local_experts' or 'num_experts_per_tok'", src);
    if (c->blk.n_experts < 1 || c->blk.n_experts > 1024 || c->blk.top_k < 1 || c->blk.top_k > c->blk.n_experts)
        return sp_errf(err, SP_ERR_FORMAT,
                       "%s: num_experts_per_tok %d must be in 1..num_local_experts (%d, at most 1024)", src,
                       c->blk.top_k, c->blk.n_experts);
    int window = 0; /* a sliding window shorter than the context changes the mask: not implemented */
    if (get_int(root, &window, "sliding_window", NULL, NULL) && window < c->max_pos)
        return sp_errf(err, SP_ERR_UNSUPPORTED,
                       "%s: sliding_window %d (shorter than the context of %d) is not supported", src, window,
                       c->max_pos);
    return SP_OK;
}

/* BLOOM: LayerNorms, ALiBi, fused QKV per head, GELU (tanh), biases everywhere, an embedding LayerNorm. */
static sp_status check_bloom(sp_config *c, const cJSON *root, const char *src, sp_err *err)
{
    c->blk = (sp_block_kind){.norm = SP_NORM_LAYER, .pos = SP_POS_ALIBI, .mlp = SP_MLP_GELU_TANH,
                             .qkv = SP_QKV_FUSED, .norms = 2, .qkv_bias = 1, .out_bias = 1, .mlp_bias = 1};
    c->embed_norm = 1;
    c->n_kv_heads = c->n_heads;
    c->head_dim = c->hidden / c->n_heads;
    c->intermediate = 4 * c->hidden;
    if (get_bool(root, "apply_residual_connection_post_layernorm", 0))
        return sp_errf(err, SP_ERR_UNSUPPORTED, "%s: apply_residual_connection_post_layernorm is not supported", src);
    return check_heads(c, "num_attention_heads", src, err);
}

/* Falcon: LayerNorms, RoPE, GELU, one fused QKV; new_decoder_architecture (40B/180B: grouped KV heads, parallel
 * attention and MLP with two LayerNorms, or one with num_ln_in_parallel_attn 1) or the 7B style (multi-query,
 * one LayerNorm, parallel attention), or the old sequential block; linear biases when `bias`. Defaults are
 * FalconConfig's. */
static sp_status check_falcon(sp_config *c, const cJSON *root, const char *src, sp_err *err)
{
    int new_arch = get_bool(root, "new_decoder_architecture", 0), mq = get_bool(root, "multi_query", 1);
    int parallel = get_bool(root, "parallel_attn", 1), bias = get_bool(root, "bias", 0), nln = 0;
    if (get_bool(root, "alibi", 0))
        return sp_errf(err, SP_ERR_UNSUPPORTED, "%s: falcon with alibi (falcon-rw) is not supported", src);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "num_ln_in_parallel_attn");
    if (v && !cJSON_IsNull(v) && (!get_int(root, &nln, "num_ln_in_parallel_attn", NULL, NULL) || nln < 1 || nln > 2))
        return sp_errf(err, SP_ERR_FORMAT, "%s: num_ln_in_parallel_attn must be 1 or 2", src);
    c->blk = (sp_block_kind){.norm = SP_NORM_LAYER, .pos = SP_POS_ROPE, .mlp = SP_MLP_GELU, .qkv = SP_QKV_FUSED,
                             .parallel = parallel, .qkv_bias = bias, .out_bias = bias, .mlp_bias = bias};
    c->head_dim = c->hidden / c->n_heads;
    if (new_arch) {
        if (!parallel) /* transformers' Falcon has no such block */
            return sp_errf(err, SP_ERR_UNSUPPORTED, "%s: new_decoder_architecture without parallel_attn", src);
        c->blk.norms = nln ? nln : 2;
    } else {
        if (parallel && nln == 2)
            return sp_errf(err, SP_ERR_UNSUPPORTED, "%s: num_ln_in_parallel_attn 2 needs new_decoder_architecture",
                           src);
        c->blk.norms = parallel ? 1 : 2;
        int given = c->n_kv_heads != c->n_heads;
        if (!mq && given)
            return sp_errf(err, SP_ERR_FORMAT, "%s: num_kv_heads %d must equal num_attention_heads %d without "
                           "multi_query or new_decoder_architecture", src, c->n_kv_heads, c->n_heads);
        c->n_kv_heads = mq ? 1 : c->n_heads;
    }
    char act[32] = "gelu";
    get_str(root, "activation", act, sizeof act);
    if (strcmp(act, "gelu_pytorch_tanh") == 0 || strcmp(act, "gelu_new") == 0)
        c->blk.mlp = SP_MLP_GELU_TANH;
    else if (strcmp(act, "gelu") != 0)
        return sp_errf(err, SP_ERR_UNSUPPORTED, "%s: falcon activation '%s' not supported (gelu, gelu_new)", src, act);
    snprintf(c->hidden_act, sizeof c->hidden_act, "%s", act);
    sp_status s = check_heads(c, new_arch ? "num_kv_heads" : "num_attention_heads", src, err);
    return s ? s : parse_rope(c, root, src, err);
}

static uint64_t fnv1a64(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}

sp_status sp_config_parse(sp_config *cfg, const char *json, const char *source, sp_err *err)
{
    memset(cfg, 0, sizeof *cfg);
    cJSON *root = cJSON_Parse(json);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return sp_errf(err, SP_ERR_FORMAT, "%s: not a JSON object", source);
    }
    sp_status s = parse_common(cfg, root, source, err);
    cfg->hash = fnv1a64(json, strlen(json));
    if (!s && cfg->arch == SP_ARCH_LLAMA)
        s = check_llama(cfg, root, source, err);
    else if (!s && cfg->arch == SP_ARCH_MIXTRAL)
        s = check_mixtral(cfg, root, source, err);
    else if (!s && cfg->arch == SP_ARCH_BLOOM)
        s = check_bloom(cfg, root, source, err);
    else if (!s && cfg->arch == SP_ARCH_FALCON)
        s = check_falcon(cfg, root, source, err);
    cJSON_Delete(root);
    return s;
}

sp_status sp_config_load(sp_config *cfg, const char *path, sp_err *err)
{
    char p[PATH_MAX];
    struct stat sb;
    int dir = stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
    if (dir)
        snprintf(p, sizeof p, "%s/config.json", path);
    else
        snprintf(p, sizeof p, "%s", path);
    FILE *fp = fopen(p, "rb");
    if (!fp && errno == ENOENT && dir)
        return sp_errf(err, SP_ERR_IO, "%s: not a model directory (no config.json)", path);
    if (!fp)
        return sp_errf(err, SP_ERR_IO, "%s: %s", p, strerror(errno));
    char *buf = malloc(1 << 20);
    size_t n = buf ? fread(buf, 1, (1 << 20) - 1, fp) : 0;
    fclose(fp);
    if (!buf)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    buf[n] = '\0';
    sp_status s = sp_config_parse(cfg, buf, p, err);
    free(buf);
    return s;
}

/* Parameters of a block's MLP: all experts (active = 0) or the ones a token uses (active = 1). */
static long long mlp_params(const sp_config *c, int active)
{
    long long H = c->hidden, FF = c->intermediate;
    switch (c->blk.mlp) {
    case SP_MLP_SWIGLU: return 3 * H * FF;
    case SP_MLP_MOE: return (active ? c->blk.top_k : c->blk.n_experts) * 3 * H * FF + (long long)c->blk.n_experts * H;
    default: return 2 * H * FF + (c->blk.mlp_bias ? FF + H : 0);
    }
}

static long long block_params(const sp_config *c, int active)
{
    if (c->arch == SP_ARCH_UNKNOWN)
        return 0;
    long long H = c->hidden, q = (long long)c->n_heads * c->head_dim, kv = (long long)c->n_kv_heads * c->head_dim;
    long long norm = c->blk.norm == SP_NORM_LAYER ? 2 * H : H;
    long long attn = H * q + 2 * H * kv + q * H + (c->blk.qkv_bias ? q + 2 * kv : 0) + (c->blk.out_bias ? H : 0);
    return c->blk.norms * norm + attn + mlp_params(c, active);
}

long long sp_config_block_params(const sp_config *c) { return block_params(c, 0); }
long long sp_config_block_active_params(const sp_config *c) { return block_params(c, 1); }

long long sp_config_total_params(const sp_config *c)
{
    long long emb = (long long)c->vocab * c->hidden, norm = c->blk.norm == SP_NORM_LAYER ? 2LL * c->hidden : c->hidden;
    return emb + (c->tie_embeddings ? 0 : emb) + (c->embed_norm ? 2LL * c->hidden : 0) + norm +
           (long long)c->n_layers * sp_config_block_params(c);
}

long long sp_config_kv_bytes_per_token(const sp_config *c)
{
    return 2LL * c->n_kv_heads * c->head_dim * (long long)sizeof(float);
}

void sp_config_attention_desc(const sp_config *c, char *buf, size_t cap)
{
    const char *pos = c->arch == SP_ARCH_UNKNOWN ? "" : c->blk.pos == SP_POS_ALIBI ? ", ALiBi" : ", RoPE";
    if (c->n_kv_heads == c->n_heads)
        snprintf(buf, cap, "multi-head (%d heads of %d)%s", c->n_heads, c->head_dim, pos);
    else if (c->n_kv_heads == 1)
        snprintf(buf, cap, "multi-query (%d heads of %d on 1 KV head)%s", c->n_heads, c->head_dim, pos);
    else
        snprintf(buf, cap, "grouped-query (%d heads of %d on %d KV heads)%s", c->n_heads, c->head_dim, c->n_kv_heads,
                 pos);
}
