/* block_cuda.h - one transformer block on the device (issue 27): core/block.h's sp_block uploaded in its encoding,
 * its forward (prefill of T positions, decode steps of one), the forward that keeps its activations and the
 * backward to the block's input (weights frozen, as servers run it), with KV caches in device memory charged to a
 * budget. core/block.c is the specification: every call computes what its sp_block_* twin computes, on device
 * arrays, with the same argument order and shapes ([B, T, H] rows of f32).
 *
 * Families: llama (RMSNorm, RoPE, SwiGLU; GQA / MQA), bloom (LayerNorm, ALiBi, GELU, biases) and falcon (parallel
 * attention and MLP, one or two LayerNorms, multi-query or grouped KV heads) and mixtral (llama's attention, a
 * router and sparse SwiGLU experts: moe_cuda.h; decode steps of at most 8 rows route on the device, stream each
 * used expert's matrices in 16-byte loads and are graphed like the others, larger steps and every backward wait
 * once for the experts' row counts).
 *
 * The products go through sp_cuda_wmat_mul (weights.cu; the weights stay in their encoding: f32, bf16, int8,
 * NF4); the backward's transposed products through cuBLAS (f32 and bf16 weights as they are, the gradient rounded
 * to bf16 for a bf16 matrix; int8 / NF4 decoded a tile of rows at a time to f32). On the bf16 path (see
 * sp_cuda_block_use_flash: more than 32 rows of bf16 / int8 / NF4 weights) the forward's kernels write the
 * products' inputs in bf16 (sp_cuda_wmat_mul_h) and the backward's kernels the gradients in bf16
 * (sp_cuda_wmat_mul_t_h; int8 / NF4 decoded to bf16 tiles), the first product into a buffer overwriting it.
 *
 * A decode step (kv given, T = 1) reads its positions from device memory (the cache's per-row positions), so
 * one step's work is the same kernels at every position: with graphs on (the default) the first step of a cache
 * runs as it is, the second is captured into a CUDA graph, and every later step replays it (a new capture only
 * when the context's workspace moved, see sp_cuda_workspace). The graph and the plain launches run the same
 * kernels on the same buffers: the same bits either way. Graphs are used for B <= 8 rows (the fused decode
 * products, which take no workspace); larger batches launch the kernels one by one.
 *
 * Everything is queued on the context's stream: device pointers in, device pointers out; errors as sp_status
 * (cuda_backend.h). Not thread-safe: one thread drives a context and its blocks. */
#ifndef SEPAL_CUDA_BLOCK_CUDA_H
#define SEPAL_CUDA_BLOCK_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "cuda_backend.h"
#include "gemm.h"

#ifdef __cplusplus
extern "C" {
#endif
#include "block.h" /* C headers (block.h, kern.h) without linkage guards of their own */

typedef struct sp_cuda_block sp_cuda_block;
typedef struct sp_cuda_kv sp_cuda_kv;

/* Device bytes that KV caches may take (a server's --cache budget): limit, and what the live caches hold. */
typedef struct sp_cuda_budget {
    size_t limit, used;
} sp_cuda_budget;

/* Charges `bytes` to bu (NULL: no budget): SP_ERR_NOMEM "kv cache: N MB more would exceed the budget (U of L MB
 * held)" and nothing charged when it does not fit. */
sp_status sp_cuda_budget_take(sp_cuda_budget *bu, size_t bytes, sp_err *err);
void sp_cuda_budget_give(sp_cuda_budget *bu, size_t bytes);

/* SP_OK when the block's family and shapes run on the device; SP_ERR_ARG naming a shape that does not. Host only. */
sp_status sp_cuda_block_supported(const sp_block *b, sp_err *err);
/* Device bytes a cache of B rows of cap positions takes for block b: keys and values, and the activations of
 * its decode step (B rows; attention scores of cap positions a head). Host only. */
size_t sp_cuda_kv_bytes(const sp_block *b, int B, int cap);

/* Uploads b: its matrices in their encoding (sp_cuda_wmat_upload), norms and biases f32, RoPE's frequencies or
 * ALiBi's slopes. b is not kept (free it if the host has no use for it). */
sp_status sp_cuda_block_upload(sp_cuda *cu, sp_cuda_block **out, const sp_block *b, sp_err *err);
void sp_cuda_block_free(sp_cuda_block *cb);
/* Device bytes of the block's weights (its workspace not counted). */
size_t sp_cuda_block_bytes(const sp_cuda_block *cb);
/* Decode steps through CUDA graphs (1, the default) or launched one by one (0): the same numbers. */
void sp_cuda_block_use_graphs(sp_cuda_block *cb, int on);
/* Forwards, prefills and backwards of blocks whose weights are bf16, int8 or NF4 (their products round their
 * inputs to bf16 already) with heads of up to 128: flash attention (flash.h) and, beyond 32 rows, fused kernels
 * that hand the products their inputs in bf16 (fused.h) (1, the default); or the cuBLAS attention with its
 * probabilities in device memory and the f32 element-wise kernels (0: the f32 blocks' path). Within the bf16
 * tolerance of each other. Set it between calls, not between a forward_keep and its backward. */
void sp_cuda_block_use_flash(sp_cuda_block *cb, int on);

/* Decode steps of up to 8 rows: 2 (the default) fused kernels (q, k and v in one product; RoPE, the cache's append
 * and attention in one kernel; biases and residuals in the products; SwiGLU's two products and activation in one),
 * each a programmatic dependent of the one before it (Hopper and later: it starts reading its weights while that
 * one finishes); 1 the same kernels launched plainly; 0 the plain kernels, an op a kernel. The same numbers. */
void sp_cuda_block_use_fused(sp_cuda_block *cb, int level);
/* Mixtral's decode steps of up to 8 rows (at any fused level): 1 (the default) each used expert's matrices
 * streamed by the dense decode products' vectorised kernel (moe_cuda.h), 0 a warp a row, one weight a lane (the
 * kernel before it, for comparison). Within rounding of each other; nothing for a dense block. */
void sp_cuda_block_use_moe_vec(sp_cuda_block *cb, int on);
/* Fused decode steps (levels 1 and 2 above): norm 1, the attention and norm 2 each ask L2 for the first mib MiB of
 * the product after it (q, k, v; o_proj; SwiGLU's gate and up, half each) while they run, when the memory would
 * otherwise idle (sm_90 and later; at most 255; the default none, 0, or SEPAL_DECODE_PREFETCH=MiB from the
 * environment). A hint: the same numbers. */
void sp_cuda_block_use_prefetch(sp_cuda_block *cb, int mib);

/* A KV cache of B rows of up to cap positions for block cb, in device memory, charged to budget (may be NULL)
 * with sp_cuda_kv_bytes; len 0. Keys and values [B, cap, nkv, hd] f32 as sp_kv_cache holds them. */
sp_status sp_cuda_kv_new(sp_cuda_block *cb, sp_cuda_kv **out, int B, int cap, sp_cuda_budget *budget, sp_err *err);
/* Frees the cache and its graph and gives its bytes back to its budget (NULL: nothing). */
void sp_cuda_kv_free(sp_cuda_kv *kv);
int sp_cuda_kv_len(const sp_cuda_kv *kv);
/* Rolls back to len positions (0 <= len <= the current length): the next step writes at len. */
sp_status sp_cuda_kv_set_len(sp_cuda_kv *kv, int len, sp_err *err);
/* Row b takes old row src[b] (positions [0, len); src values in [0, B), repeats allowed: beam search's hypo_ids),
 * as sp_kv_reorder does; SP_ERR_ARG and nothing changed for a value outside. */
sp_status sp_cuda_kv_reorder(sp_cuda_kv *kv, const int64_t *src, sp_err *err);
/* 1 when the cache's decode steps replay a captured graph now. */
int sp_cuda_kv_graphed(const sp_cuda_kv *kv);
/* The cache's device arrays (keys, values [B, cap, nkv, hd]). */
void sp_cuda_kv_arrays(const sp_cuda_kv *kv, const float **k, const float **v);

/* out[B, T, H] = block(inp[B, T, H]) at positions pos0 .. pos0 + T - 1 (sp_block_forward). With a cache, pos0
 * must equal its length and B its rows; the step's keys and values are appended and attention sees the whole
 * cached prefix; the length grows by T. T = 1 with a cache is a decode step (graphs, above). out may equal inp. */
sp_status sp_cuda_block_forward(sp_cuda_block *cb, float *out, const float *inp, int B, int T, int pos0,
                                sp_cuda_kv *kv, sp_err *err);

/* Decode steps of n caches at once (a server's batch of sessions; sp_block_decode_batch): cache i's kv[i]->B rows
 * of inp / out [sum of rows, H], one new position each at that cache's length, appended to it (its length += 1).
 * The weights are read once for all rows; each row's result is what sp_cuda_block_forward gives its cache alone,
 * within rounding (the products of more than 8 rows take another path). The caches must be distinct and of this
 * block; every one is checked before anything runs. A graph per number of rows as for one cache, replayed while
 * the batch's row count stays (the rows' positions and caches are uploaded before each step). */
sp_status sp_cuda_block_decode_batch(sp_cuda_block *cb, float *out, const float *inp, sp_cuda_kv *const *kv, int n,
                                     sp_err *err);

/* Activations of one forward kept for its backward (device memory, grown as needed; free with sp_cuda_acts_free). */
typedef struct sp_cuda_acts {
    void *buf;
    size_t bytes;
    int B, T, pos0;
} sp_cuda_acts;

void sp_cuda_acts_free(sp_cuda_block *cb, sp_cuda_acts *k);
/* Device bytes sp_cuda_block_forward_keep allocates for [B, T] (what k->bytes becomes). Host only. */
size_t sp_cuda_block_acts_bytes(const sp_cuda_block *cb, int B, int T);
/* sp_block_forward_keep: the forward without a cache, keeping its activations in k (out may equal inp). */
sp_status sp_cuda_block_forward_keep(sp_cuda_block *cb, float *out, const float *inp, int B, int T, int pos0,
                                     sp_cuda_acts *k, sp_err *err);
/* sp_block_backward_kept without weight gradients: dinp[B, T, H] is WRITTEN with d(out . dout)/d(inp) from k
 * (inp: that forward's input). dinp may equal dout. */
sp_status sp_cuda_block_backward_kept(sp_cuda_block *cb, float *dinp, const float *dout, const float *inp,
                                      const sp_cuda_acts *k, sp_err *err);
/* sp_block_backward without weight gradients: recomputes the forward (no cache), then back-propagates. */
sp_status sp_cuda_block_backward(sp_cuda_block *cb, float *dinp, const float *dout, const float *inp, int B, int T,
                                 int pos0, sp_err *err);

/* The backward's product with an int8 / NF4 matrix W [out, in], decoded rows r0 .. r0 + tr - 1 at a time (A: the
 * decoded tile [tr, in]): dX[N, in] += dY[N, r0 : r0 + tr] tile, the tile's columns of dY rows `out` floats apart
 * (B = dY + r0). */
static inline sp_gemm_plan sp_cuda_plan_dx_tile(int N, int in, int out, int tr)
{
    sp_gemm_plan p = sp_gemm_plan_linear_dx(N, in, tr);
    p.ldb = out;
    return p;
}

#ifdef __cplusplus
}
#endif
#endif
