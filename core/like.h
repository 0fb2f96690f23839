/* like.h - models of real shape with random weights (`sepal model init OUTDIR --like NAME`): what benches and
 * tests use to measure what a 7B or 70B model costs without downloading one.
 *
 * A published model's config.json (its shapes, its family's fields), cut to fewer layers or a narrower width when
 * asked, and a Hugging Face directory for it: sharded safetensors as transformers writes them
 * (model-0000i-of-0000n.safetensors and model.safetensors.index.json, or one model.safetensors), weights drawn at
 * transformers' init scale (normal(0, 0.02) for matrices and embeddings, norms at 1, biases at 0), a tokenizer,
 * config.json last. Written as a stream (a tensor at a time, in chunks: never the model in memory), deterministic
 * per seed (each tensor's values depend on the seed and its name only, not on the shard size). */
#ifndef SEPAL_LIKE_H
#define SEPAL_LIKE_H

#include <stdint.h>

#include "dtype.h"
#include "status.h"

/* The models a directory can be shaped like, as an option's choices. */
#define SP_LIKE_NAMES "llama-2-7b|llama-2-70b|llama-3-8b|mixtral-8x7b|falcon-40b|bloom-7b1"
/* transformers' max_shard_size default */
#define SP_LIKE_SHARD_BYTES 5000000000ull

typedef struct sp_like_opts {
    const char *like;         /* one of SP_LIKE_NAMES */
    int layers;               /* 0: the model's; else 1..the model's (the width stays) */
    int hidden;               /* 0: the model's; else narrower: the same heads and KV heads, head size hidden /
                                 heads, the MLP's width in proportion (a multiple of 64) */
    sp_dtype dtype;           /* SP_BF16 or SP_F32 */
    uint64_t seed;
    uint64_t shard_bytes;     /* 0: SP_LIKE_SHARD_BYTES; a tensor larger than this gets a shard of its own */
    const char *tokenizer;    /* a directory whose tokenizer.json (a 32000-token Llama tokenizer: stories15M's) is
                                 copied when the model's vocabulary is 32000 wide; NULL, or another width: a
                                 synthetic tokenizer of the model's width */
    const int *cancel;        /* non-zero: stop (SP_ERR_CANCELLED, nothing left behind); may be NULL */
    void (*progress)(void *user, uint64_t done, uint64_t total); /* bytes of tensors written; may be NULL */
    void *user;
} sp_like_opts;

typedef struct sp_like_result {
    int layers, hidden;
    long long params;
    uint64_t bytes;           /* tensor data */
    int shards;
    int synthetic_tokenizer;  /* 1: made here; 0: copied from opts.tokenizer */
    int vocab;
} sp_like_result;

/* The vocabulary width of model `like` (0 if unknown): whether a 32000-token tokenizer fits it. */
int sp_like_vocab(const char *like);

/* Writes the directory outdir (created with its parents; it must not exist or be empty). Every option is
 * checked before anything is written; on failure or cancellation what was written is removed again. */
sp_status sp_like_init(const char *outdir, const sp_like_opts *o, sp_like_result *r, sp_err *err);

/* "5GB" (10^9), "500MB", "2GiB" (2^30), "4096" (bytes): transformers' max_shard_size; SP_ERR_ARG otherwise. */
sp_status sp_like_parse_size(const char *s, uint64_t *bytes, sp_err *err);

#endif
