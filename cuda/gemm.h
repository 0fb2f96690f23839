/* gemm.h - the linear layers' products on cuBLAS (cublasGemmEx): f32, or bf16 / fp16 operands with fp32
 * accumulation and f32 results. fp32 products stay fp32 (the handle's default math, no TF32).
 *
 * Matrices are row-major as sepal holds them (a weight W is [out, in], the Hugging Face layout); cuBLAS is
 * column-major, so each product is planned on the transposes (a row-major [r, c] array is a column-major
 * [c, r] one). sp_gemm_plan_* are those plans as data: tests/test_cuda_host.c runs them through a
 * column-major reference product on the CPU and checks them against core's sp_linear_forward / _backward. */
#ifndef SEPAL_CUDA_GEMM_H
#define SEPAL_CUDA_GEMM_H

#include "cuda_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { SP_CU_F32, SP_CU_BF16, SP_CU_F16 } sp_cu_dtype;

/* C[m, n] = alpha op(A) op(B) + beta C, column-major, op = transpose when ta / tb; which array is A and which B
 * each constructor says. */
typedef struct sp_gemm_plan {
    int ta, tb, m, n, k, lda, ldb, ldc;
    float alpha, beta;
} sp_gemm_plan;

/* Y[N, out] = X[N, in] W^T (+ Y when acc): A = W, B = X. */
static inline sp_gemm_plan sp_gemm_plan_linear(int N, int in, int out, int acc)
{
    sp_gemm_plan p = {1, 0, out, N, in, in, in, out, 1.0f, acc ? 1.0f : 0.0f};
    return p;
}

/* dX[N, in] += dY[N, out] W: A = W, B = dY. */
static inline sp_gemm_plan sp_gemm_plan_linear_dx(int N, int in, int out)
{
    sp_gemm_plan p = {0, 0, in, N, out, in, out, in, 1.0f, 1.0f};
    return p;
}

/* A tile of a linear layer: columns r0 .. r0 + tr - 1 of Y[N, out] (= Y + r0, rows out floats apart) = X[N, in]
 * W_t^T, W_t the tile's [tr, in] rows of W: A = W_t, B = X. */
static inline sp_gemm_plan sp_gemm_plan_linear_tile(int N, int in, int tr, int out)
{
    sp_gemm_plan p = sp_gemm_plan_linear(N, in, tr, 0);
    p.ldc = out;
    return p;
}

/* Its transpose: dX[N, in] += dY_t W_t, dY_t columns r0 .. r0 + tr - 1 of dY[N, out] (= dY + r0, rows out apart):
 * A = W_t, B = dY_t. */
static inline sp_gemm_plan sp_gemm_plan_linear_dx_tile(int N, int in, int tr, int out)
{
    sp_gemm_plan p = sp_gemm_plan_linear_dx(N, in, tr);
    p.ldb = out;
    return p;
}

/* dW[out, in] += dY^T X: A = X, B = dY. */
static inline sp_gemm_plan sp_gemm_plan_linear_dw(int N, int in, int out)
{
    sp_gemm_plan p = {0, 1, in, out, N, in, out, in, 1.0f, 1.0f};
    return p;
}

/* One head's attention scores P[T, S] = scale Q[T, hd] K[S, hd]^T, rows ldq / ldk floats apart: A = K, B = Q. */
static inline sp_gemm_plan sp_gemm_plan_scores(int T, int S, int hd, int ldq, int ldk, float scale)
{
    sp_gemm_plan p = {1, 0, S, T, hd, ldk, ldq, S, scale, 0.0f};
    return p;
}

/* One head's output O[T, hd] (+)= P[T, S] V[S, hd] (+ O when acc), V's rows ldv and O's ldo floats apart:
 * A = V, B = P. (The backward's dQ += dS K too.) */
static inline sp_gemm_plan sp_gemm_plan_attn_out(int T, int S, int hd, int ldv, int ldo, int acc)
{
    sp_gemm_plan p = {0, 0, hd, T, S, ldv, S, ldo, 1.0f, acc ? 1.0f : 0.0f};
    return p;
}

/* The backward's dV[S, hd] += P[T, S]^T dO[T, hd] (and dK += dS^T Q): A = dO (rows ldq apart), B = P; dV's rows
 * ldk apart. */
static inline sp_gemm_plan sp_gemm_plan_attn_kv_grad(int T, int S, int hd, int ldq, int ldk)
{
    sp_gemm_plan p = {0, 1, hd, S, T, ldq, S, ldk, 1.0f, 1.0f};
    return p;
}

/* Runs plan p on device arrays: A and B of dtype t, C f32 (fp32 accumulation). Queued on the stream. */
sp_status sp_cuda_gemm(sp_cuda *cu, const sp_gemm_plan *p, const void *A, const void *B, float *C, sp_cu_dtype t,
                       sp_err *err);

/* The three products of a linear layer (device arrays, X / dY / W of dtype t; results f32). */
sp_status sp_cuda_linear(sp_cuda *cu, float *Y, const void *X, const void *W, sp_cu_dtype t, int N, int in, int out,
                         int acc, sp_err *err);
sp_status sp_cuda_linear_dx(sp_cuda *cu, float *dX, const void *dY, const void *W, sp_cu_dtype t, int N, int in,
                            int out, sp_err *err);
sp_status sp_cuda_linear_dw(sp_cuda *cu, float *dW, const void *dY, const void *X, sp_cu_dtype t, int N, int in,
                            int out, sp_err *err);

/* dst[n] = src[n] rounded to bf16 / fp16 (to nearest even) on the device (t SP_CU_BF16 or SP_CU_F16). */
sp_status sp_cuda_f32_to(sp_cuda *cu, void *dst, const float *src, long n, sp_cu_dtype t, sp_err *err);

#ifdef __cplusplus
}
#endif
#endif
