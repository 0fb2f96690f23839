/* cuda_emul.h - the CUDA kernels of cuda/kernels.h run on the host: each function does what its kernel's blocks
 * and threads do, with the same kmath.h functions, thread counts, strides and reduction trees, on host arrays.
 * test_cuda_host checks them against core's CPU reference ops (here, without a GPU); test_cuda checks the real
 * kernels against the same references and against these (the device's libm differs from glibc's by an ulp or
 * two, nothing else should). The tolerances both use live here too, one per dtype. */
#ifndef SEPAL_TESTS_CUDA_EMUL_H
#define SEPAL_TESTS_CUDA_EMUL_H

#include <stddef.h>
#include <stdint.h>

#include "gemm.h"
#include "kern.h"
#include "kmath.h"
#include "ops.h"
#include "rng.h"

void emul_rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps);
void emul_rmsnorm_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w, const float *rstd,
                      int N, int C);
void emul_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b, int N,
                        int C, float eps);
void emul_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                        const float *mean, const float *rstd, int N, int C);
void emul_rope(float *out, const float *inp, const float *inv_freq, int pos0, int B, int T, int nh, int hd,
               int backward);
void emul_alibi_add(float *scores, const float *slopes, int B, int nh, int T, int S, int past);
/* the causal softmax of prefill attention: row (b, h, t) over its past + t + 1 visible keys, zeros after */
void emul_causal_softmax(float *scores, long rows, int T, int S, int past);
/* sp_cuda_attn_prefill: its GEMMs (emul_gemm), ALiBi and causal softmax in the same order */
void emul_attn_prefill(float *out, float *probs, const float *q, const float *kc, const float *vc, const float *slopes,
                       int B, int T, int past, int nh, int nkv, int hd, int cap);
/* sp_cuda_attn_backward, the same way (dq, dk, dv added into; NULL: not wanted) */
void emul_attn_backward(float *dq, float *dk, float *dv, const float *dout, const float *probs, const float *q,
                        const float *kc, const float *vc, int B, int T, int past, int nh, int nkv, int hd, int cap);
void emul_softmax(float *out, const float *inp, int N, int C);
/* losses (forward) or dlogits += (backward, losses NULL); returns 1 if a target was >= V (the kernel's flag) */
int emul_crossentropy(float *losses, float *dlogits, const float *dlosses, const float *logits, const int32_t *targets,
                      int N, int V);
/* returns 1 if an id was outside [0, V) */
int emul_embedding(float *out, const int32_t *ids, const float *table, int V, int N, int C);
void emul_wmat_mul(const sp_km_w *w, const float *X, float *Y, int B);
/* The vectorised decode kernel (a matrix sp_km_chunked accepts; ks warps a row: 1, 2 or 4). */
void emul_wmat_vec(const sp_km_w *w, const float *X, float *Y, int B, int ks);
/* The B > 8 products through bf16 GEMMs as weights.cu runs them, tiles of tile rows: Y[B, rows] = X W^T (dx 0) or
 * dX[B, cols] += dY W (dx 1, A = dY), A and the decoded weights rounded to bf16. */
void emul_wmat_gemm_bf16(const sp_km_w *w, const float *A, float *C, int B, int tile, int dx);
void emul_attn_decode(float *out, const float *q, const float *kc, const float *vc, const float *slopes, int B, int nh,
                      int nkv, int hd, int cap, int len);
/* C = alpha op(A) op(B) + beta C, column-major, in double: what cuBLAS computes for plan p */
void emul_gemm(const sp_gemm_plan *p, const float *A, const float *B, float *C);

/* An attention case: q [B, T, nh, hd] and caches [B, cap, nkv, hd] drawn from r (sd 1), the CPU's forward
 * (sp_attention_forward with keep_probs and ALiBi slopes alibi or none): out and probs [B, nh, T, past + T]. */
typedef struct emul_attn {
    sp_attn_dims d;
    size_t nq, nk, np; /* floats of q (and out), of a cache, of probs */
    float *q, *kc, *vc, *out, *probs;
} emul_attn;
void emul_attn_case(emul_attn *c, sp_rng *r, int B, int T, int past, int nh, int nkv, int hd, int cap,
                    const float *alibi);
void emul_attn_free(emul_attn *c);

/* scale[N, out] = sum over c of |X[n, c] W[o, c]|: the size of the rounding of each output of X W^T. */
void emul_linear_scale(float *scale, const float *X, const float *W, int N, int in, int out);
/* x rounded through bf16 / fp16 and back (n values, in place): what the device's casts give the GEMM. */
void emul_round(float *x, size_t n, sp_cu_dtype t);
/* The tolerance of a product in dtype t relative to sum |a_i b_i|: both operands rounded once (bf16 2^-8 each, so
 * 2^-7; fp16 2^-10), plus 2^-16 for the fp32 accumulation of a few thousand terms in any order. */
double emul_gemm_tol(sp_cu_dtype t);

/* n normal values of standard deviation sd (malloc'ed), and a malloc'ed copy of n floats. */
float *emul_randn(sp_rng *r, size_t n, float sd);
/* max |a - b| over max |b| (a NaN in a: infinity): the block-level tolerances' measure */
double emul_rel_err(const float *a, const float *b, size_t n);
float *emul_dup(const float *x, size_t n);

/* The GPU suites' start: without a usable GPU prints "SUITE: skipped: no usable GPU (why)" and returns 77 (ctest's
 * skip); else opens device 0 into *cu (printing "SUITE: running on NAME"), sets CK_FORK=no (a CUDA context made
 * before fork() is unusable in the child) and returns 0; 1 after printing why opening failed. */
int emul_open_gpu(const char *suite, sp_cuda **cu);

/* OK(call), in the GPU suites: the call must succeed (Check's assertion with its message); inside it, E is the
 * sp_err it fills. */
#define OK(call)                                                                                               \
    do {                                                                                                       \
        sp_err e_ = {0};                                                                                       \
        ck_assert_msg((call) == SP_OK, "%s", e_.msg);                                                          \
    } while (0)
#define E (&e_)

/* A transposed product's error (dX[B, C] += dY[B, rows] W, W decoded: dec [rows, C]): max over dX of |a - ref| /
 * (rel sum over r of |dy[b, r] dec[r, c]| + 1e-6 |ref|); <= 1 passes. NaN in either is +inf. */
double emul_mul_t_err(const float *a, const float *ref, const float *dy, const float *dec, int B, int rows, int C,
                      double rel);

/* max over i of |a - b| / (abs_tol + rel_tol |b|); <= 1 passes. NaN in either is +inf. */
double emul_err(const float *a, const float *b, size_t n, double abs_tol, double rel_tol);

#endif
