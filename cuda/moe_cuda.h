/* moe_cuda.h - Mixtral's sparse mixture of experts on the device, for block.cu (internal to cuda/): the router, the
 * experts' SwiGLU MLPs in the block's encoding (f32, bf16, int8, NF4) and the backward to the MLP's input through
 * the routing weights of the chosen experts, what core/block.c's moe_forward and moe_backward compute (kmath_moe.h
 * holds the arithmetic they share with a host harness).
 *
 * y[N, H] = sum over each token's top-K experts of w * expert(x), from x[N, H]:
 *   - the router's logits (f32), each token's routing (kmath_moe.h), the pairs grouped by expert into slots and each
 *     slot's row of x gathered, all on the device;
 *   - up to SP_CUDA_MOE_DEVICE_ROWS rows (decode steps): the experts' matrices chosen on the device: nothing waits
 *     for the host, so a decode step with experts is captured in a CUDA graph as a dense one is (block.cu captures
 *     steps of at most that many rows). Each used expert's matrices are streamed once for all of its slots by the
 *     dense decode products' vectorised kernel (sp_cuda_wmat_mul_slots: 16-byte loads, L2's first to evict), gate
 *     and up with the SwiGLU in one launch (their sums kept for a backward), then down; where an encoding's rows
 *     are not whole 16-byte chunks (kmath.h's sp_km_chunked), or with sp_cuda_moe_use_vec 0, each slot's three
 *     products a warp a row, one weight a lane, and the SwiGLU a kernel of its own;
 *   - more rows: the experts' first slots come to the host (one sync) and each expert's slots run as one product of
 *     sp_cuda_wmat_mul (GEMMs);
 *   - the outputs summed per token in expert order.
 * The backward (any N) brings the first slots to the host (one sync) and runs each expert's transposed products
 * through sp_cuda_wmat_mul_t_acc.
 *
 * Activations and gradients live in caller-provided device memory (block.cu carves them out of its buffers):
 * sp_cuda_moe_acts_bytes / sp_cuda_moe_grads_bytes for N rows. Queued on the context's stream; errors as
 * sp_status. */
#ifndef SEPAL_CUDA_MOE_CUDA_H
#define SEPAL_CUDA_MOE_CUDA_H

#include <stddef.h>

#include "cuda_backend.h"

#ifdef __cplusplus
extern "C" {
#endif
#include "block.h" /* a C header without linkage guards of its own */

#define SP_CUDA_MOE_DEVICE_ROWS 8 /* rows routed without the host (block.cu's graph limit, kGraphRows) */

typedef struct sp_cuda_moe sp_cuda_moe;

/* The MLP's shapes: hidden H, each expert's FF, its experts and those a token takes (experts 0: a dense block). */
typedef struct sp_moe_dims {
    int H, FF, experts, topk;
} sp_moe_dims;

/* b's dims (experts 0 when b is not a mixture of experts). Host only. */
sp_moe_dims sp_cuda_moe_dims(const sp_block *b);
/* Device bytes of the activations (what the backward reads) and of the backward's gradients for N rows; 256-byte
 * multiples. */
size_t sp_cuda_moe_acts_bytes(const sp_moe_dims *d, size_t N);
size_t sp_cuda_moe_grads_bytes(const sp_moe_dims *d, size_t N);

/* Uploads b's router (f32) and experts (b->qm[4 + 3e + 0..2]: gate, up, down of expert e, in their encoding). */
sp_status sp_cuda_moe_upload(sp_cuda *cu, sp_cuda_moe **out, const sp_block *b, sp_err *err);
void sp_cuda_moe_free(sp_cuda_moe *m); /* NULL: nothing */
/* Device bytes of the router and the experts (sp_block_bytes counts them alike). */
size_t sp_cuda_moe_bytes(const sp_cuda_moe *m);

/* Decode-sized steps' expert products: 1 (the default) the vectorised kernel where the rows allow it, 0 a warp a
 * row (the kernel before it, kept for comparison: bench_block_cuda and test_cuda_block run both). Within rounding
 * of each other (the sums in other orders). NULL: nothing. */
void sp_cuda_moe_use_vec(sp_cuda_moe *m, int on);

/* y[N, H] = moe(x[N, H]) (y may not alias x), keeping the activations in acts (sp_cuda_moe_acts_bytes(N)). */
sp_status sp_cuda_moe_fwd(sp_cuda_moe *m, float *y, const float *x, int N, void *acts, sp_err *err);
/* dx[N, H] += moe'(x)^T dy from the activations of that forward; grads: sp_cuda_moe_grads_bytes(N) of scratch.
 * Syncs once. */
sp_status sp_cuda_moe_bwd(sp_cuda_moe *m, float *dx, const float *dy, int N, const void *acts, void *grads,
                          sp_err *err);

#ifdef __cplusplus
}
#endif
#endif
