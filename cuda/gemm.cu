// gemm.cu - cuBLAS products of the linear layers and the f32 -> bf16 / fp16 casts that feed them (gemm.h).
#include "gemm.h"

#include "launch.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#ifdef SEPAL_HAVE_CUBLAS
#include <cublas_v2.h>
#endif

static bool shape_ok(const sp_gemm_plan *p)
{
    return p->m > 0 && p->n > 0 && p->k > 0 && p->lda >= (p->ta ? p->k : p->m) &&
           p->ldb >= (p->tb ? p->n : p->k) && p->ldc >= p->m;
}

extern "C" sp_status sp_cuda_gemm(sp_cuda *cu, const sp_gemm_plan *p, const void *A, const void *B, float *C,
                                  sp_cu_dtype t, sp_err *err)
{
    if (!shape_ok(p))
        return sp_errf(err, SP_ERR_ARG, "gemm: bad shape m %d n %d k %d (lda %d ldb %d ldc %d)", p->m, p->n, p->k,
                       p->lda, p->ldb, p->ldc);
#ifdef SEPAL_HAVE_CUBLAS
    cudaDataType ab = t == SP_CU_BF16 ? CUDA_R_16BF : t == SP_CU_F16 ? CUDA_R_16F : CUDA_R_32F;
    float alpha = p->alpha, beta = p->beta;
    cublasStatus_t s = cublasGemmEx((cublasHandle_t)sp_cuda_cublas(cu), p->ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                    p->tb ? CUBLAS_OP_T : CUBLAS_OP_N, p->m, p->n, p->k, &alpha, A, ab, p->lda, B, ab,
                                    p->ldb, &beta, C, CUDA_R_32F, p->ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return sp_cublas_error(err, (int)s, "gemm");
#else
    (void)cu, (void)A, (void)B, (void)C, (void)t;
    return sp_errf(err, SP_ERR_UNSUPPORTED, "gemm: sepal was built without cuBLAS");
#endif
}

extern "C" sp_status sp_cuda_linear(sp_cuda *cu, float *Y, const void *X, const void *W, sp_cu_dtype t, int N, int in,
                                    int out, int acc, sp_err *err)
{
    sp_gemm_plan p = sp_gemm_plan_linear(N, in, out, acc);
    return sp_cuda_gemm(cu, &p, W, X, Y, t, err);
}

extern "C" sp_status sp_cuda_linear_dx(sp_cuda *cu, float *dX, const void *dY, const void *W, sp_cu_dtype t, int N,
                                       int in, int out, sp_err *err)
{
    sp_gemm_plan p = sp_gemm_plan_linear_dx(N, in, out);
    return sp_cuda_gemm(cu, &p, W, dY, dX, t, err);
}

extern "C" sp_status sp_cuda_linear_dw(sp_cuda *cu, float *dW, const void *dY, const void *X, sp_cu_dtype t, int N,
                                       int in, int out, sp_err *err)
{
    sp_gemm_plan p = sp_gemm_plan_linear_dw(N, in, out);
    return sp_cuda_gemm(cu, &p, X, dY, dW, t, err);
}

__global__ void to_bf16_kernel(__nv_bfloat16 *dst, const float *src, long n)
{
    SPK_GRID_LOOP(i, n)
    dst[i] = __float2bfloat16_rn(src[i]);
}

__global__ void to_f16_kernel(__half *dst, const float *src, long n)
{
    SPK_GRID_LOOP(i, n)
    dst[i] = __float2half_rn(src[i]);
}

extern "C" sp_status sp_cuda_f32_to(sp_cuda *cu, void *dst, const float *src, long n, sp_cu_dtype t, sp_err *err)
{
    if (n < 0 || t == SP_CU_F32)
        return sp_errf(err, SP_ERR_ARG, "cast: bad size %ld or target type", n);
    if (n == 0)
        return SP_OK;
    if (t == SP_CU_BF16)
        to_bf16_kernel<<<spk::grid_for(n), spk::kThreads, 0, spk::stream_of(cu)>>>((__nv_bfloat16 *)dst, src, n);
    else
        to_f16_kernel<<<spk::grid_for(n), spk::kThreads, 0, spk::stream_of(cu)>>>((__half *)dst, src, n);
    return spk::launched(err, "cast");
}
