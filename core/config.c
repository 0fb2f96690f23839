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

static const struct {
    const char *prefix;
    sp_arch arch;
} arch_table[] = {
    {"Llama", SP_ARCH_LLAMA},
    {"Bloom", SP_ARCH_BLOOM},
    {"Falcon", SP_ARCH_FALCON},
    {"Mixtral", SP_ARCH_MIXTRAL},
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
        if (strncmp(c->architecture, arch_table[i].prefix, strlen(arch_table[i].prefix)) == 0)
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
    c->tie_embeddings = get_bool(root, "tie_word_embeddings", 1);
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

/* Llama needs every field of its block, and they must be consistent. */
static sp_status check_llama(sp_config *c, const cJSON *root, const char *src, sp_err *err)
{
    static const char *const required[] = {"hidden_size", "intermediate_size", "num_hidden_layers",
                                           "num_attention_heads", "vocab_size", "rms_norm_eps"};
    for (size_t i = 0; i < sizeof required / sizeof *required; i++)
        if (!cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(root, required[i])))
            return sp_errf(err, SP_ERR_FORMAT, "%s: missing field '%s'", src, required[i]);
    if (c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads != 0)
        return sp_errf(err, SP_ERR_FORMAT, "%s: num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)",
                       src, c->n_heads, c->n_kv_heads);
    if (c->head_dim <= 0 || c->head_dim % 2 != 0)
        return sp_errf(err, SP_ERR_FORMAT, "%s: head_dim %d must be positive and even", src, c->head_dim);
    if (c->intermediate <= 0)
        return sp_errf(err, SP_ERR_FORMAT, "%s: intermediate_size must be positive", src);
    if (strcmp(c->hidden_act, "silu") != 0)
        return sp_errf(err, SP_ERR_UNSUPPORTED, "%s: hidden_act '%s' not supported for llama (silu only)", src,
                       c->hidden_act);
    if (c->attention_bias || c->mlp_bias)
        return sp_errf(err, SP_ERR_UNSUPPORTED, "%s: llama with attention_bias/mlp_bias is not supported yet", src);
    return parse_rope(c, root, src, err);
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
    if (!s && (cfg->arch == SP_ARCH_LLAMA || cfg->arch == SP_ARCH_MIXTRAL))
        s = check_llama(cfg, root, source, err);
    cJSON_Delete(root);
    return s;
}

sp_status sp_config_load(sp_config *cfg, const char *path, sp_err *err)
{
    char p[PATH_MAX];
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        snprintf(p, sizeof p, "%s/config.json", path);
    else
        snprintf(p, sizeof p, "%s", path);
    FILE *fp = fopen(p, "rb");
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

long long sp_config_block_params(const sp_config *c)
{
    long long H = c->hidden, q = (long long)c->n_heads * c->head_dim, kv = (long long)c->n_kv_heads * c->head_dim;
    long long FF = c->intermediate;
    switch (c->arch) {
    case SP_ARCH_LLAMA:
        return 2 * H + H * q + 2 * H * kv + q * H + 3 * H * FF;
    default:
        return 0; /* not implemented yet */
    }
}

long long sp_config_total_params(const sp_config *c)
{
    long long emb = (long long)c->vocab * c->hidden;
    return emb + (c->tie_embeddings ? 0 : emb) + c->hidden + (long long)c->n_layers * sp_config_block_params(c);
}
