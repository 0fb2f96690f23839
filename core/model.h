/* model.h - a model of any supported family (or a part of one) on the CPU: embeddings (and BLOOM's embedding
 * LayerNorm), a span of blocks [first, last), final norm and LM head. The whole model in one process is the
 * baseline the swarm is compared with; a server loads only its blocks, a client only the local parts. */
#ifndef SEPAL_MODEL_H
#define SEPAL_MODEL_H

#include <pthread.h>
#include <stdint.h>

#include "block.h"
#include "config.h"
#include "rng.h"
#include "safetensors.h"

enum {
    SP_LOAD_EMBED = 1,  /* model.embed_tokens / word_embeddings (+ word_embeddings_layernorm) */
    SP_LOAD_HEAD = 2,   /* model.norm / ln_f + lm_head (or the tied embedding) */
    SP_LOAD_BLOCKS = 4, /* model.layers / h .[first, last) */
    SP_LOAD_ALL = 7,
};

typedef struct sp_model {
    sp_config cfg;
    sp_rope rope;
    int first, last;        /* blocks held: [first, last) */
    float *embed;           /* [V, H] or NULL */
    float *embed_norm_w, *embed_norm_b; /* [H]: BLOOM's LayerNorm after the embeddings (NULL: none) */
    float *norm, *norm_b;   /* final norm [H] or NULL; norm_b: its bias (LayerNorm families) */
    float *lm_head;         /* [V, H]; == embed when tied and both loaded */
    int head_is_embed;      /* lm_head aliases embed */
    sp_qmat head_q;         /* the head as the engine's kernels read it: a view of lm_head, or its encoding after
                             * sp_model_quantize (lm_head then stays for the embeddings and training) */
    sp_pool *pool;          /* the blocks' and the head's thread pool (NULL: the engine's default; sp_model_set_pool) */
    sp_block *blocks;       /* last - first of them */
    sp_ws ws;               /* scratch for the runner's own calls */
    float *hid;             /* the runner's hidden states [B*T, H], grown to the largest step (not per token) */
    size_t hid_cap;         /* floats */
    sp_qmat head_screen;    /* greedy with an f32 head: its Q8 encoding, built on first use (sp_model_head_argmax,
                             * or sp_model_head_prepare) */
    int head_screen_state;  /* 0 not tried, 1 built, -1 out of memory (the full head then) */
    float *head_buf;        /* sp_model_head_argmax's scratch: the normed row [H] and the logits [V] */
    pthread_mutex_t head_lock; /* sp_model_head_argmax: the screen built once, its scratch one caller at a time */
    uint64_t bytes_loaded;  /* tensor bytes read from the checkpoint */
    /* f32 embeddings and head are not copied: they point into the checkpoint's mapping, kept open in st (read
     * only, and resident only once used); a tensor in another dtype is converted into memory of its own */
    sp_safetensors *st;
    int embed_mapped, head_mapped;
    int files_mapped;       /* checkpoint files opened (a sharded checkpoint maps only the shards it needs) */
} sp_model;

/* Loads `parts` of the model in directory `dir`. first/last select the blocks when SP_LOAD_BLOCKS is
 * set (last = -1 means all). Fails with SP_ERR_UNSUPPORTED ("unsupported architecture: X (supported: llama,
 * bloom, falcon, mixtral)") for other families. */
sp_status sp_model_load(sp_model **out, const char *dir, unsigned parts, int first, int last, sp_err *err);
/* sp_model_load with each block encoded in t (sp_block_quantize) as soon as it is read, and the checkpoint's
 * pages of its tensors given back: a span loads in its encoding's memory plus one f32 block, not in all of its
 * f32 blocks (a server's --dtype int8 span of a 7B model: 1.7 GB, not 6.5). */
sp_status sp_model_load_encoded(sp_model **out, const char *dir, unsigned parts, int first, int last, sp_wtype t,
                                sp_err *err);
void sp_model_free(sp_model *m);

/* Re-encodes the held blocks' projections (sp_block_quantize) and, with head set, the LM head in t, as a
 * server holding those blocks in --dtype t would (decode through the engine's kernels for that encoding). */
sp_status sp_model_quantize(sp_model *m, sp_wtype t, int head, sp_err *err);
/* The thread pool the held blocks and the head run on (NULL: the engine's default pool). */
void sp_model_set_pool(sp_model *m, sp_pool *pool);

/* A KV cache for every held block. */
typedef struct sp_model_cache {
    int nblocks;
    sp_kv_cache *kv;
} sp_model_cache;

sp_status sp_model_cache_init(sp_model_cache *c, const sp_model *m, int B, int cap, sp_err *err);
void sp_model_cache_free(sp_model_cache *c);
void sp_model_cache_rewind(sp_model_cache *c, int len);

/* hidden[B*T, H] = embed(ids[B*T]); ids are checked against the vocabulary. The raw lookup: shallow prompts go
 * in front of it before sp_model_embed_norm. */
sp_status sp_model_embed(sp_model *m, float *hidden, const int32_t *ids, int n, sp_err *err);
/* The family's normalisation of the block input, in place on hidden[n, H]: BLOOM's word_embeddings_layernorm
 * (applied after shallow prompts are prepended, as Petals does); nothing for the other families. */
void sp_model_embed_norm(const sp_model *m, float *hidden, int n);
/* Runs the held blocks in place on hidden[B, T, H] at positions pos0.. (cache optional). */
sp_status sp_model_blocks(sp_model *m, float *hidden, int B, int T, int pos0, sp_model_cache *cache, sp_err *err);
/* logits[n, V] = lm_head(norm(hidden[n, H])), norm: the family's final RMSNorm or LayerNorm. */
sp_status sp_model_head(sp_model *m, float *logits, const float *hidden, int n, sp_err *err);
/* best[i] = the first maximum of the logits sp_model_head gives for row i of hidden[n, H], the same index
 * (greedy decoding), without all of them when the head is f32: the head's Q8 encoding (made on the first call)
 * gives every logit within a bound it proves (the weights' and the input's rounding, and the floating-point
 * error of both products), and only the rows whose interval reaches the highest lower bound are computed in
 * f32, as sp_model_head computes them; with non-finite values anywhere, the whole head as sp_model_head. */
sp_status sp_model_head_argmax(sp_model *m, int32_t *best, const float *hidden, int n, sp_err *err);
/* Builds now what sp_model_head_argmax builds on its first call (an f32 head's Q8 screen: for stories15M 12 ms, a
 * read of the whole head), so that a generation's begin, not its prompt, pays it; once per model, thread-safe. */
void sp_model_head_prepare(sp_model *m);
/* The final norm alone, out[n, H] = norm(hidden[n, H]). */
sp_status sp_model_final_norm(const sp_model *m, float *out, const float *hidden, int n, sp_err *err);
/* The whole model: logits[B, T, V] for ids[B, T]; with a cache only the last position's logits
 * (logits[B, V]) are computed when last_only. */
sp_status sp_model_forward(sp_model *m, float *logits, const int32_t *ids, int B, int T, int pos0,
                           sp_model_cache *cache, int last_only, sp_err *err);

/* The same pass with a cache, ending in each row's greedy choice: best[b] = the first maximum of the logits
 * sp_model_forward gives for the row's last position (sp_model_head_argmax). */
sp_status sp_model_forward_argmax(sp_model *m, int32_t *best, const int32_t *ids, int B, int T, int pos0,
                                  sp_model_cache *cache, sp_err *err);
/* Sampling: temperature 0 is greedy (the first maximum). */
typedef struct sp_sampler {
    float temperature;
    sp_rng rng;
} sp_sampler;

int sp_sample(sp_sampler *s, const float *logits, int V);

/* Streams each new token; return non-zero to stop. */
typedef int (*sp_token_cb)(int token, void *user);

/* Generates up to max_new tokens after prompt[0..n) (one sequence) with a KV cache; stops early at
 * the EOS id (or BOS, as llama2.c does) if stop_at_eos. out (cap >= max_new) receives the new ids;
 * *n_out their count. */
sp_status sp_model_generate(sp_model *m, const int32_t *prompt, int n, int max_new, sp_sampler *s, int stop_at_eos,
                            int32_t *out, int *n_out, sp_token_cb cb, void *user, sp_err *err);

#endif
