/* fused.h - the forward's fused element-wise kernels on the device (issue 27): each does in one pass over [N, C]
 * rows what a chain of kernels.h's ops does, and writes its result rounded to bf16 (to nearest even) as the next
 * product's input (sp_cuda_wmat_mul_h), so that no f32 copy of it is written and no cast runs. The f32 arithmetic
 * is kernels.h's (kmath.h's functions, threads and reduction trees): the values before the rounding are the same
 * bits as the unfused chain's. out: [N, C] bf16 (uint16); everything else f32; NULL: none. */
#ifndef SEPAL_CUDA_FUSED_H
#define SEPAL_CUDA_FUSED_H

#include "cuda_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* x = y + bias + res (block.c's residual: the bias first; written to h) when res is given, else x = y; then
 * out = norm(x): RMSNorm (rms 1: w, rstd) or LayerNorm (rms 0: w, b may be NULL, mean and rstd kept). */
sp_status sp_cuda_norm_h(sp_cuda *cu, void *out, float *mean, float *rstd, float *h, const float *y,
                         const float *bias, const float *res, const float *w, const float *b, int N, int C, float eps,
                         int rms, sp_err *err);
/* out = swiglu(gate, up) over n values */
sp_status sp_cuda_swiglu_h(sp_cuda *cu, void *out, const float *gate, const float *up, long n, sp_err *err);
/* up[N, C] += bias (NULL: none), in place (the backward's input), then out = gelu(up) (tanh_approx: GELU-tanh) */
sp_status sp_cuda_gelu_h(sp_cuda *cu, void *out, float *up, const float *bias, long n, int C, int tanh_approx,
                         sp_err *err);

/* The backward's twins: each writes the gradient a backward op would ADD into a cleared buffer, rounded to bf16
 * (the next transposed product's input, sp_cuda_wmat_mul_t_h): the same values as that op from zeros, then a cast.
 * sp_swiglu_backward into dgate and dup; sp_gelu_backward (tanh_approx: GELU-tanh) into dinp; sp_rope_backward
 * over [B, T, nh, hd] at positions pos0 .. into dinp (inv_freq as sp_cuda_rope_bwd). */
sp_status sp_cuda_swiglu_bwd_h(sp_cuda *cu, void *dgate, void *dup, const float *dout, const float *gate,
                               const float *up, long n, sp_err *err);
sp_status sp_cuda_gelu_bwd_h(sp_cuda *cu, void *dinp, const float *dout, const float *inp, long n, int tanh_approx,
                             sp_err *err);
sp_status sp_cuda_rope_bwd_h(sp_cuda *cu, void *dinp, const float *dout, const float *inv_freq, int pos0, int B, int T,
                             int nh, int hd, sp_err *err);

/* dx[N, C] = res + the norm's input gradient from dy (RMSNorm with rms 1: w, rstd; LayerNorm: w may be NULL, mean
 * and rstd), the arithmetic of sp_cuda_rmsnorm_bwd / sp_cuda_layernorm_bwd added into a copy of res (res may be
 * dx: in place), and dxh = dx rounded to bf16 when not NULL (the next transposed product's input): the backward's
 * residual without a copy, and the cast after it in the same pass. */
sp_status sp_cuda_norm_bwd_h(sp_cuda *cu, float *dx, void *dxh, const float *res, const float *dy, const float *x,
                             const float *w, const float *mean, const float *rstd, int N, int C, int rms,
                             sp_err *err);

#ifdef __cplusplus
}
#endif
#endif
