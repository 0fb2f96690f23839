/* config.h - a model's architecture, read from a Hugging Face config.json.
 *
 * The family (llama, bloom, falcon, mixtral) is chosen from model_type (or, without one, from
 * architectures[0]) and its parser fills `blk`, the description of what one transformer block computes.
 * That description is the only place the families differ for the block code (block.c); the local parts
 * (embedding LayerNorm, final norm kind, tied head) are described by the fields below it. */
#ifndef SEPAL_CONFIG_H
#define SEPAL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "status.h"

typedef enum { SP_ARCH_UNKNOWN, SP_ARCH_LLAMA, SP_ARCH_BLOOM, SP_ARCH_FALCON, SP_ARCH_MIXTRAL } sp_arch;
typedef enum { SP_ROPE_DEFAULT, SP_ROPE_LINEAR, SP_ROPE_LLAMA3 } sp_rope_type;

#define SP_SUPPORTED_ARCHS "llama, bloom, falcon, mixtral"

typedef enum { SP_NORM_RMS, SP_NORM_LAYER } sp_norm_kind;     /* RMSNorm (weight) / LayerNorm (weight + bias) */
typedef enum { SP_POS_ROPE, SP_POS_ALIBI } sp_pos_kind;
typedef enum { SP_MLP_SWIGLU, SP_MLP_GELU, SP_MLP_GELU_TANH, SP_MLP_MOE } sp_mlp_kind;
typedef enum {
    SP_QKV_SPLIT, /* q_proj, k_proj, v_proj (llama, mixtral) */
    SP_QKV_FUSED  /* one query_key_value [nkv * (nh/nkv + 2) * hd, H], per KV group [q x nh/nkv, k, v]:
                     BLOOM and Falcon's MHA ([nh, 3, hd]), Falcon-7B's multi-query ([nh + 2, hd]) and
                     new_decoder_architecture's grouped layout are all this one layout */
} sp_qkv_layout;

/* What one block computes:
 *   sequential: h = x + attn(n1(x)),  out = h + mlp(n2(h))                 (llama, mixtral, bloom, old falcon)
 *   parallel:   out = x + attn(n1(x)) + mlp(n2(x)), n2 = n1 if norms == 1  (falcon) */
typedef struct sp_block_kind {
    sp_norm_kind norm;
    sp_pos_kind pos;
    sp_mlp_kind mlp;
    sp_qkv_layout qkv;
    int parallel;
    int norms;            /* 2, or 1 (a parallel block whose MLP shares the attention's norm) */
    int qkv_bias, out_bias, mlp_bias;
    int n_experts, top_k; /* MoE: experts per block, experts per token */
} sp_block_kind;

typedef struct sp_config {
    char architecture[64]; /* architectures[0], e.g. "LlamaForCausalLM" */
    char model_type[32];   /* "llama" */
    sp_arch arch;
    int hidden;            /* H: hidden_size */
    int intermediate;      /* FF: intermediate_size (per expert for MoE) */
    int n_layers;
    int n_heads;
    int n_kv_heads;        /* key/value heads the KV cache holds (1: multi-query) */
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
    sp_block_kind blk;     /* the block (filled for the supported families) */
    int embed_norm;        /* a LayerNorm right after the embeddings (BLOOM; after shallow prompts are prepended) */
    uint64_t hash;         /* FNV-1a 64 of config.json's bytes: with the directory's name, the model's identity
                              in a swarm (servers and clients of one model must hold the same config.json) */
} sp_config;

/* Loads `path` (a config.json or a directory holding one). Fields the family needs must be present and
 * consistent (a clear error naming the file and field otherwise); an unknown family still loads its common
 * fields, with arch = SP_ARCH_UNKNOWN, so callers can describe it and report "unsupported architecture". A
 * directory without config.json is "DIR: not a model directory (no config.json)"; a path that is not there,
 * "PATH: No such file or directory". */
sp_status sp_config_load(sp_config *cfg, const char *path, sp_err *err);
sp_status sp_config_parse(sp_config *cfg, const char *json, const char *source, sp_err *err);

const char *sp_arch_name(sp_arch a);
/* SP_OK for a supported family, else SP_ERR_UNSUPPORTED with
 * "unsupported architecture: X (supported: llama, bloom, falcon, mixtral)", X the model_type. */
sp_status sp_config_check_supported(const sp_config *cfg, sp_err *err);
/* "multi-head", "grouped-query (4 heads on 2 KV heads)", "multi-query", with ", ALiBi" / ", RoPE". */
void sp_config_attention_desc(const sp_config *cfg, char *buf, size_t cap);

/* Parameters of one block / of the whole model (embeddings + blocks + norms + head unless tied). */
long long sp_config_block_params(const sp_config *cfg);
long long sp_config_total_params(const sp_config *cfg);
/* Parameters one decode step of a block reads: all of them, except a MoE block's unused experts. */
long long sp_config_block_active_params(const sp_config *cfg);
/* Bytes of K and V one position takes in one block's f32 cache: 2 * n_kv_heads * head_dim * 4. */
long long sp_config_kv_bytes_per_token(const sp_config *cfg);

#endif
