/* config.h - a model's architecture, read from a Hugging Face config.json. */
#ifndef SEPAL_CONFIG_H
#define SEPAL_CONFIG_H

#include <stdint.h>

#include "dtype.h"
#include "status.h"

typedef enum { SP_ARCH_UNKNOWN, SP_ARCH_LLAMA, SP_ARCH_BLOOM, SP_ARCH_FALCON, SP_ARCH_MIXTRAL } sp_arch;
typedef enum { SP_ROPE_DEFAULT, SP_ROPE_LINEAR, SP_ROPE_LLAMA3 } sp_rope_type;

typedef struct sp_config {
    char architecture[64]; /* architectures[0], e.g. "LlamaForCausalLM" */
    char model_type[32];   /* "llama" */
    sp_arch arch;
    int hidden;            /* H: hidden_size */
    int intermediate;      /* FF: intermediate_size */
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;          /* hidden / n_heads unless given */
    int vocab;
    int max_pos;           /* max_position_embeddings */
    float norm_eps;        /* rms_norm_eps or layer_norm_epsilon */
    double rope_theta;
    sp_rope_type rope_type;
    double rope_factor;
    double rope_low_freq_factor, rope_high_freq_factor;
    int rope_orig_max_pos;
    int tie_embeddings;
    int bos_id, eos_id;    /* -1 if absent */
    sp_dtype dtype;        /* torch_dtype / dtype, F32 if absent */
    char hidden_act[32];
    int attention_bias, mlp_bias;
    uint64_t hash;         /* FNV-1a 64 of config.json's bytes: with the directory's name, the model's identity
                              in a swarm (servers and clients of one model must hold the same config.json) */
} sp_config;

/* Loads `path` (a config.json or a directory holding one). Fields the architecture needs must be
 * present; unknown architectures still load their common fields, with arch = SP_ARCH_UNKNOWN or the
 * family's enum, so callers can report "unsupported architecture: X". */
sp_status sp_config_load(sp_config *cfg, const char *path, sp_err *err);
sp_status sp_config_parse(sp_config *cfg, const char *json, const char *source, sp_err *err);

const char *sp_arch_name(sp_arch a);
/* Parameters of one block / of the whole model (embeddings + blocks + norm + head unless tied). */
long long sp_config_block_params(const sp_config *cfg);
long long sp_config_total_params(const sp_config *cfg);

#endif
