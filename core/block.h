/* block.h - one transformer block on the CPU, for every supported family (llama, bloom, falcon, mixtral):
 * forward for a span of positions (batch, position offset, optional KV cache) and backward to the block input
 * (weights frozen) and optionally to the weights. What the block computes comes from the config's
 * sp_block_kind (config.h), chosen by the family at load; the code below it is one implementation:
 *
 *   a   = Wo attn(pos(Wq n1(x) + bq), pos(Wk n1(x) + bk), Wv n1(x) + bv) + bo      pos: RoPE, or ALiBi scores
 *   h   = x + a
 *   out = h + mlp(n2(h))                     sequential (llama, mixtral, bloom)
 *   out = h + mlp(n2(x)), n2 = n1 if 1 norm  parallel (falcon)
 *
 * n1, n2: RMSNorm or LayerNorm; mlp: SwiGLU, GELU (erf or tanh) with biases, or a sparse mixture of SwiGLU
 * experts (a router picks each token's top-k experts, their outputs summed with the renormalised softmax
 * weights). Fused QKV checkpoints (BLOOM, Falcon) are split into q, k, v at load. */
#ifndef SEPAL_BLOCK_H
#define SEPAL_BLOCK_H

#include <stddef.h>

#include "config.h"
#include "kern.h"
#include "pool.h"
#include "rope.h"
#include "safetensors.h"
#include "status.h"

/* A growable scratch buffer reused across calls (one per thread that runs blocks). */
typedef struct sp_ws {
    float *buf;
    size_t cap; /* floats */
} sp_ws;

sp_status sp_ws_reserve(sp_ws *ws, size_t nfloats, sp_err *err);
void sp_ws_free(sp_ws *ws);

/* Weights of one block, f32, HF layout [out, in], carved out of one allocation; a tensor the family does not
 * have is NULL. The same struct holds weight gradients. */
typedef struct sp_block {
    sp_arch arch;
    sp_block_kind k;
    int H, nh, nkv, hd, FF;
    float eps;
    const sp_rope *rope;  /* RoPE tables (NULL for ALiBi) */
    float *alibi;         /* ALiBi slopes [nh] (NULL for RoPE); not a weight */
    float *mem;
    size_t numel;
    float *ln1_w, *ln1_b; /* [H]; b: LayerNorm only */
    float *wq, *bq;       /* [nh*hd, H], [nh*hd] */
    float *wk, *bk;       /* [nkv*hd, H], [nkv*hd] */
    float *wv, *bv;
    float *wo, *bo;       /* [H, nh*hd], [H] */
    float *ln2_w, *ln2_b; /* [H]; NULL when the MLP shares n1 */
    float *w_gate;        /* SwiGLU [FF, H]; MoE [E, FF, H] (w1) */
    float *w_up, *b_up;   /* SwiGLU [FF, H]; GELU: dense_h_to_4h [FF, H], [FF]; MoE [E, FF, H] (w3) */
    float *w_down, *b_down; /* [H, FF], [H]; MoE [E, H, FF] (w2) */
    float *router;        /* MoE [E, H] */
    /* The projection matrices as sp_qmat (kern.h): views of the f32 tensors above, or, after sp_block_quantize,
     * their only copy (the f32 pointers of those are then NULL). Order: q, k, v, o, then gate, up, down of each
     * expert (one "expert" for a dense MLP; gate absent for GELU). Decode-sized products (<= 8 rows) run on the
     * engine's kernels and thread pool, larger ones on sgemm. */
    sp_wtype wtype;
    sp_qmat *qm;
    int nqm;
    sp_qmat *early;       /* sp_block_load_encoded: each matrix encoded as soon as it is read (then its f32 pages
                             are given back), for sp_block_quantize to take; NULL otherwise */
    sp_wtype early_t;
    sp_pool *pool;        /* the engine's default pool unless set */
} sp_block;

/* Allocates zeroed weights shaped by cfg (zero also suits gradients). */
sp_status sp_block_init(sp_block *b, const sp_config *cfg, const sp_rope *rope, sp_err *err);
void sp_block_free(sp_block *b);
/* Re-encodes the projection matrices (wq, wk, wv, wo and the MLP's; norms, biases and a router stay f32) in t
 * and frees their f32 copies: the block then serves forward, inference and the backward to its input (through
 * the decoded weights, as Petals does), not weight gradients. */
sp_status sp_block_quantize(sp_block *b, sp_wtype t, sp_err *err);
/* Bytes the block's weights take (what a server holds). */
size_t sp_block_bytes(const sp_block *b);
/* Reads block `layer`'s tensors from the checkpoint under the family's names (any float dtype, converted to
 * f32); a fused query_key_value is split into q, k, v. */
sp_status sp_block_load(sp_block *b, sp_safetensors *st, int layer, sp_err *err);
/* sp_block_load then sp_block_quantize(t), each matrix encoded as soon as it is read and its f32 pages given back
 * at once: loading holds one f32 matrix at a time, not the block (a Llama-2-7B block in int8: 180 MB of f32 at
 * most, not 808). After a failure the block is only good for sp_block_free. */
sp_status sp_block_load_encoded(sp_block *b, sp_safetensors *st, int layer, sp_wtype t, sp_err *err);

/* KV cache of one block for B sequences of up to `cap` positions: k, v are [B, cap, nkv, hd]. */
typedef struct sp_kv_cache {
    int B, cap, nkv, hd;
    int len; /* positions filled; the next step writes at len (set it lower to roll back) */
    float *k, *v;
} sp_kv_cache;

sp_status sp_kv_init(sp_kv_cache *kv, int B, int cap, int nkv, int hd, sp_err *err);
void sp_kv_free(sp_kv_cache *kv);
/* Row b of the batch takes old row src[b] (positions [0, kv->len)); src values must be in [0, B). In place. */
sp_status sp_kv_reorder(sp_kv_cache *kv, const int64_t *src, sp_err *err);
/* Row b of B rows (stride floats apart, the first used floats of each) becomes old row src[b] (src[b] in [0, B),
 * repeats allowed), in place: rows nothing else reads are written first, what is left (cycles) is rotated through
 * a small buffer on the stack. Allocates nothing for B <= 64. */
sp_status sp_rows_gather(float *rows, size_t stride, size_t used, const int64_t *src, int B, sp_err *err);

/* SP_OK when a step of B rows of T positions at pos0 may run over kv (NULL: none) of a block with nkv KV heads of
 * hd: SP_ERR_ARG for a bad shape, a cache of other rows or heads or a position other than its length, SP_ERR_RANGE
 * when the positions exceed its capacity (what sp_block_forward checks; the CUDA block checks the same). */
sp_status sp_block_check_step(int nkv, int hd, int B, int T, int pos0, const sp_kv_cache *kv, sp_err *err);

/* out[B,T,H] = block(inp[B,T,H]) at positions pos0..pos0+T-1. With a cache, pos0 must equal kv->len:
 * the step's keys/values are appended and attention sees the whole cached prefix; kv->len += T.
 * out may equal inp. */
sp_status sp_block_forward(const sp_block *b, float *out, const float *inp, int B, int T, int pos0, sp_kv_cache *kv,
                           sp_ws *ws, sp_err *err);
/* The workspace floats sp_block_forward needs for a [B, T] step with a KV cache of cap positions: reserved once
 * (a session's open), the steps of that cache reserve nothing more (each reserves for the whole cap). */
size_t sp_block_ws_floats(const sp_block *b, int B, int T, int cap);

/* Decode steps of n sequences at once (a server's batch): sequence i is kv[i]->B rows (at most
 * SP_KERN_MAX_ROWS) of inp/out [sum of rows, H], one new position each at kv[i]->len, appended to its own cache
 * (kv[i]->len += 1). The weights are read once for all rows; every row's output and cache entry have the bits
 * sp_block_forward(b, .., kv[i]->B, 1, kv[i]->len, kv[i], ..) gives that sequence alone, whatever its
 * batch-mates. item_rows: scratch of n ints. Checks every cache first: on an error nothing has changed. */
sp_status sp_block_decode_batch(const sp_block *b, float *out, const float *inp, sp_kv_cache *const *kv, int n,
                                int *item_rows, sp_ws *ws, sp_err *err);
/* sp_block_decode_batch with T[i] new positions for sequence i (T NULL: 1 each): its rows are [kv[i]->B, T[i], H]
 * in turn in inp/out, kv[i]->B x T[i] of them, at most SP_KERN_MAX_ROWS (short prefills; kv[i]->len += T[i]).
 * item_rows (scratch of n ints) gets each sequence's rows. A sequence's bits are those of sp_block_forward(b, ..,
 * kv[i]->B, T[i], kv[i]->len, kv[i], ..) alone when sp_block_rows_exact(b, kv[i]->B x T[i]). */
sp_status sp_block_step_batch(const sp_block *b, float *out, const float *inp, sp_kv_cache *const *kv, const int *T,
                              int n, int *item_rows, sp_ws *ws, sp_err *err);
/* 1 if a step of `rows` rows (batch x positions) runs every product of the block in the decode kernels when alone
 * (as sp_block_step_batch runs them whatever its rows): then it gets the same bits alone as in any batch. */
int sp_block_rows_exact(const sp_block *b, int rows);

/* Recomputes the forward (no cache, positions pos0..) and back-propagates: dinp[B,T,H] is WRITTEN with
 * d(out . dout)/d(inp); if grads is non-NULL (from sp_block_init) the weight gradients are ACCUMULATED into
 * it. A MoE block back-propagates through the routing weights of the experts it chose (the choice itself is
 * piecewise constant), as autograd does in transformers. dinp may equal dout. */
sp_status sp_block_backward(const sp_block *b, float *dinp, const float *dout, const float *inp, int B, int T,
                            int pos0, sp_block *grads, sp_ws *ws, sp_err *err);

/* The activations of one forward, kept for its backward so that it need not recompute them (what PyTorch
 * keeps; about B*T*(5H + 3Q + 3FF) + B*heads*T*T floats for a dense block). buf grows as needed; free with
 * sp_block_acts_free. */
typedef struct sp_block_acts {
    float *buf;
    size_t cap; /* floats */
    int B, T, pos0;
} sp_block_acts;

size_t sp_block_acts_floats(const sp_block *b, int B, int T);
void sp_block_acts_free(sp_block_acts *k);
/* sp_block_forward without a cache, keeping the activations in k (out may equal inp). */
sp_status sp_block_forward_keep(const sp_block *b, float *out, const float *inp, int B, int T, int pos0,
                                sp_block_acts *k, sp_err *err);
/* sp_block_backward from k (inp: the block's input of that forward): the same results, no recompute. */
sp_status sp_block_backward_kept(const sp_block *b, float *dinp, const float *dout, const float *inp,
                                 const sp_block_acts *k, sp_block *grads, sp_ws *ws, sp_err *err);

/* A server's merged training requests: item i is item_rows[i] rows (a whole number of sequences of T positions) of
 * inp/out [B, T, H], the items in order. Every item's outputs (and with k its activations, sliced out with
 * sp_block_acts_slice) have the bits sp_block_forward (sp_block_forward_keep) gives it alone, whatever the other
 * items: the per-row work runs over all rows, each product item by item (sgemm's bits follow how many rows it
 * multiplies), an encoded matrix's tiles decoded once for all (kern.h, sp_qmat_mul_items). A MoE block refuses
 * (SP_ERR_UNSUPPORTED: its router groups a batch's rows by expert). k NULL: nothing kept. */
sp_status sp_block_forward_items(const sp_block *b, float *out, const float *inp, int B, int T, int pos0,
                                 const int *item_rows, int n, sp_block_acts *k, sp_ws *ws, sp_err *err);
/* The backward of merged items as sp_block_backward (k NULL: recomputing the forward) or sp_block_backward_kept
 * (k: the items' activations, joined by sp_block_acts_join) gives each alone; no weight gradients. */
sp_status sp_block_backward_items(const sp_block *b, float *dinp, const float *dout, const float *inp, int B, int T,
                                  int pos0, const int *item_rows, int n, const sp_block_acts *k, sp_ws *ws,
                                  sp_err *err);
/* dst = sequences [b0, b0 + nb) of src's activations (dst grows as needed): what sp_block_forward_keep keeps for
 * them alone. */
sp_status sp_block_acts_slice(const sp_block *b, sp_block_acts *dst, const sp_block_acts *src, int b0, int nb,
                              sp_err *err);
/* dst = the activations of parts[0..n) (of one T and pos0) one after the other, as kept for their batch. */
sp_status sp_block_acts_join(const sp_block *b, sp_block_acts *dst, const sp_block_acts *const *parts, int n,
                             sp_err *err);

#endif
