// fused.cu - the forward's fused element-wise kernels (fused.h): kernels.cu's row and element kernels with a
// residual in front and a bf16 store at the end.
#include <cuda_bf16.h>

#include "fused.h"
#include "launch.cuh"

using spk::block_sum;

namespace {

__global__ void norm_h_kernel(__nv_bfloat16 *out, float *mean, float *rstd, float *h, const float *y,
                              const float *bias, const float *res, const float *w, const float *b, int C, float eps,
                              int rms)
{
    __shared__ float sh[SP_KM_MAX_THREADS];
    int tid = threadIdx.x, nt = blockDim.x;
    long off = (long)blockIdx.x * C;
    const float *x = y + off;
    if (res) { // each thread reads back only what it wrote
        for (int c = tid; c < C; c += nt) {
            float v = y[off + c];
            if (bias)
                v += bias[c];
            h[off + c] = v + res[off + c];
        }
        x = h + off;
    }
    __nv_bfloat16 *o = out + off;
    if (rms) {
        float r = sp_km_rstd(block_sum(sp_km_sumsq_part(x, C, tid, nt), sh), C, eps);
        for (int c = tid; c < C; c += nt)
            o[c] = __float2bfloat16_rn(sp_km_rmsnorm(x[c], r, w[c]));
        if (rstd && tid == 0)
            rstd[blockIdx.x] = r;
        return;
    }
    float m = block_sum(sp_km_sum_part(x, C, tid, nt), sh) / (float)C;
    float r = sp_km_rstd(block_sum(sp_km_sqdev_part(x, m, C, tid, nt), sh), C, eps);
    for (int c = tid; c < C; c += nt)
        o[c] = __float2bfloat16_rn(sp_km_layernorm(x[c], m, r, w ? w[c] : 1.0f, b ? b[c] : 0.0f));
    if (tid == 0) {
        mean[blockIdx.x] = m;
        rstd[blockIdx.x] = r;
    }
}

__global__ void swiglu_h_kernel(__nv_bfloat16 *out, const float *gate, const float *up, long n)
{
    SPK_GRID_LOOP(i, n)
    out[i] = __float2bfloat16_rn(sp_km_swiglu(gate[i], up[i]));
}

__global__ void gelu_h_kernel(__nv_bfloat16 *out, float *up, const float *bias, long n, int C, int tanh_approx)
{
    SPK_GRID_LOOP(i, n)
    {
        float v = up[i];
        if (bias) {
            v += bias[i % C];
            up[i] = v;
        }
        out[i] = __float2bfloat16_rn(tanh_approx ? sp_km_gelu_tanh(v) : sp_km_gelu(v));
    }
}

} // namespace

extern "C" sp_status sp_cuda_norm_h(sp_cuda *cu, void *out, float *mean, float *rstd, float *h, const float *y,
                                    const float *bias, const float *res, const float *w, const float *b, int N, int C,
                                    float eps, int rms, sp_err *err)
{
    if (N <= 0 || C <= 0 || (res && !h) || (rms && !w) || (!rms && (!mean || !rstd)))
        return sp_errf(err, SP_ERR_ARG, "fused norm: bad shape [%d, %d] or missing buffers", N, C);
    norm_h_kernel<<<N, sp_km_row_threads(C), 0, spk::stream_of(cu)>>>((__nv_bfloat16 *)out, mean, rstd, h, y, bias,
                                                                      res, w, b, C, eps, rms);
    return spk::launched(err, "fused norm");
}

extern "C" sp_status sp_cuda_swiglu_h(sp_cuda *cu, void *out, const float *gate, const float *up, long n,
                                      sp_err *err)
{
    if (n <= 0)
        return sp_errf(err, SP_ERR_ARG, "fused swiglu: bad size %ld", n);
    swiglu_h_kernel<<<spk::grid_for(n), spk::kThreads, 0, spk::stream_of(cu)>>>((__nv_bfloat16 *)out, gate, up, n);
    return spk::launched(err, "fused swiglu");
}

extern "C" sp_status sp_cuda_gelu_h(sp_cuda *cu, void *out, float *up, const float *bias, long n, int C,
                                    int tanh_approx, sp_err *err)
{
    if (n <= 0 || C <= 0 || n % C)
        return sp_errf(err, SP_ERR_ARG, "fused gelu: bad size %ld of rows of %d", n, C);
    gelu_h_kernel<<<spk::grid_for(n), spk::kThreads, 0, spk::stream_of(cu)>>>((__nv_bfloat16 *)out, up, bias, n, C,
                                                                            tanh_approx);
    return spk::launched(err, "fused gelu");
}
