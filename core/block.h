/* block.h - the Llama transformer block on the CPU: forward for a span of positions (batch, position
 * offset, optional KV cache) and backward to the block input (weights frozen) and optionally to the
 * weights.
 *
 *   h   = x + Wo * attn(rope(Wq * rms(x)), rope(Wk * rms(x)), Wv * rms(x))
 *   out = h + Wdown * (silu(Wgate * rms(h)) * (Wup * rms(h)))                                        */
#ifndef SEPAL_BLOCK_H
#define SEPAL_BLOCK_H

#include <stddef.h>

#include "config.h"
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

/* Weights of one block, f32, HF layout [out, in], carved out of one allocation. The same struct holds
 * weight gradients. */
typedef struct sp_llama_block {
    int H, nh, nkv, hd, FF;
    float eps;
    const sp_rope *rope;
    float *mem;
    size_t numel;
    float *attn_norm;     /* [H] */
    float *wq;            /* [nh*hd, H] */
    float *wk, *wv;       /* [nkv*hd, H] */
    float *wo;            /* [H, nh*hd] */
    float *ffn_norm;      /* [H] */
    float *w_gate, *w_up; /* [FF, H] */
    float *w_down;        /* [H, FF] */
} sp_llama_block;

/* Allocates zeroed weights shaped by cfg (zero also suits gradients). */
sp_status sp_llama_block_init(sp_llama_block *b, const sp_config *cfg, const sp_rope *rope, sp_err *err);
void sp_llama_block_free(sp_llama_block *b);
/* Reads model.layers.{layer}.* from the checkpoint (any float dtype, converted to f32). */
sp_status sp_llama_block_load(sp_llama_block *b, sp_safetensors *st, int layer, sp_err *err);

/* KV cache of one block for B sequences of up to `cap` positions: k, v are [B, cap, nkv, hd]. */
typedef struct sp_kv_cache {
    int B, cap, nkv, hd;
    int len; /* positions filled; the next step writes at len (set it lower to roll back) */
    float *k, *v;
} sp_kv_cache;

sp_status sp_kv_init(sp_kv_cache *kv, int B, int cap, int nkv, int hd, sp_err *err);
void sp_kv_free(sp_kv_cache *kv);
/* Row b of the batch takes old row src[b] (positions [0, kv->len)); src values must be in [0, B). */
sp_status sp_kv_reorder(sp_kv_cache *kv, const int64_t *src, sp_err *err);

/* out[B,T,H] = block(inp[B,T,H]) at positions pos0..pos0+T-1. With a cache, pos0 must equal kv->len:
 * the step's keys/values are appended and attention sees the whole cached prefix; kv->len += T.
 * out may equal inp. */
sp_status sp_llama_block_forward(const sp_llama_block *b, float *out, const float *inp, int B, int T, int pos0,
                                 sp_kv_cache *kv, sp_ws *ws, sp_err *err);

/* Recomputes the forward (no cache, positions pos0..) and back-propagates: dinp[B,T,H] is WRITTEN with
 * d(out . dout)/d(inp); if grads is non-NULL (from sp_llama_block_init) the weight gradients are
 * ACCUMULATED into it. dinp may equal dout. */
sp_status sp_llama_block_backward(const sp_llama_block *b, float *dinp, const float *dout, const float *inp, int B,
                                  int T, int pos0, sp_llama_block *grads, sp_ws *ws, sp_err *err);

/* The activations of one forward, kept for its backward so that it need not recompute them (what PyTorch
 * keeps; about B*T*(5H + 3Q + 3FF) + B*heads*T*T floats). buf grows as needed; free with
 * sp_block_acts_free. */
typedef struct sp_block_acts {
    float *buf;
    size_t cap; /* floats */
    int B, T, pos0;
} sp_block_acts;

size_t sp_llama_block_acts_floats(const sp_llama_block *b, int B, int T);
void sp_block_acts_free(sp_block_acts *k);
/* sp_llama_block_forward without a cache, keeping the activations in k (out may equal inp). */
sp_status sp_llama_block_forward_keep(const sp_llama_block *b, float *out, const float *inp, int B, int T, int pos0,
                                      sp_block_acts *k, sp_err *err);
/* sp_llama_block_backward from k (inp: the block's input of that forward): the same results, no recompute. */
sp_status sp_llama_block_backward_kept(const sp_llama_block *b, float *dinp, const float *dout, const float *inp,
                                       const sp_block_acts *k, sp_llama_block *grads, sp_ws *ws, sp_err *err);

#endif
