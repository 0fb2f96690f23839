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

// dx = res + norm'(x)^T dy, and dxh = dx in bf16 when given (spk::norm_bwd_row, kernels.cu's norm backward's).
__global__ void norm_bwd_h_kernel(float *dx, __nv_bfloat16 *dxh, const float *res, const float *dy, const float *x,
                                  const float *w, const float *mean, const float *rstd, int C, int rms)
{
    __shared__ float sh[SP_KM_MAX_THREADS];
    spk::norm_bwd_row(dx, dxh, res, dy, x, w, mean, rstd, C, rms, sh);
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

__global__ void swiglu_bwd_h_kernel(__nv_bfloat16 *dgate, __nv_bfloat16 *dup, const float *dout, const float *gate,
                                    const float *up, long n)
{
    SPK_GRID_LOOP(i, n)
    {
        float dg = 0.0f, du = 0.0f;
        sp_km_swiglu_bwd(&dg, &du, dout[i], gate[i], up[i]);
        dgate[i] = __float2bfloat16_rn(dg);
        dup[i] = __float2bfloat16_rn(du);
    }
}

__global__ void gelu_bwd_h_kernel(__nv_bfloat16 *dinp, const float *dout, const float *inp, long n, int tanh_approx)
{
    SPK_GRID_LOOP(i, n)
    {
        float d = 0.0f;
        d += dout[i] * (tanh_approx ? sp_km_gelu_tanh_grad(inp[i]) : sp_km_gelu_grad(inp[i]));
        dinp[i] = __float2bfloat16_rn(d);
    }
}

__global__ void rope_bwd_h_kernel(__nv_bfloat16 *dinp, const float *dout, const float *inv_freq, int pos0, int T,
                                  int nh, int hd, long pairs)
{
    SPK_GRID_LOOP(e, pairs)
    {
        int t, i;
        long o = sp_km_rope_pair(e, T, nh, hd, &t, &i), o2 = o + hd / 2;
        float a = sp_km_rope_angle(pos0 + t, inv_freq[i]), c = cosf(a), s = sinf(a), d1 = 0.0f, d2 = 0.0f;
        sp_km_rope_bwd(&d1, &d2, dout[o], dout[o2], c, s);
        dinp[o] = __float2bfloat16_rn(d1);
        dinp[o2] = __float2bfloat16_rn(d2);
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

extern "C" sp_status sp_cuda_norm_bwd_h(sp_cuda *cu, float *dx, void *dxh, const float *res, const float *dy,
                                        const float *x, const float *w, const float *mean, const float *rstd, int N,
                                        int C, int rms, sp_err *err)
{
    if (N <= 0 || C <= 0 || !dx || !res || !dy || !x || !rstd || (rms && !w) || (!rms && !mean))
        return sp_errf(err, SP_ERR_ARG, "fused norm backward: bad shape [%d, %d] or missing buffers", N, C);
    norm_bwd_h_kernel<<<N, sp_km_row_threads(C), 0, spk::stream_of(cu)>>>(dx, (__nv_bfloat16 *)dxh, res, dy, x, w,
                                                                          mean, rstd, C, rms);
    return spk::launched(err, "fused norm backward");
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

extern "C" sp_status sp_cuda_swiglu_bwd_h(sp_cuda *cu, void *dgate, void *dup, const float *dout, const float *gate,
                                          const float *up, long n, sp_err *err)
{
    if (n <= 0)
        return sp_errf(err, SP_ERR_ARG, "fused swiglu backward: bad size %ld", n);
    swiglu_bwd_h_kernel<<<spk::grid_for(n), spk::kThreads, 0, spk::stream_of(cu)>>>(
        (__nv_bfloat16 *)dgate, (__nv_bfloat16 *)dup, dout, gate, up, n);
    return spk::launched(err, "fused swiglu backward");
}

extern "C" sp_status sp_cuda_gelu_bwd_h(sp_cuda *cu, void *dinp, const float *dout, const float *inp, long n,
                                        int tanh_approx, sp_err *err)
{
    if (n <= 0)
        return sp_errf(err, SP_ERR_ARG, "fused gelu backward: bad size %ld", n);
    gelu_bwd_h_kernel<<<spk::grid_for(n), spk::kThreads, 0, spk::stream_of(cu)>>>((__nv_bfloat16 *)dinp, dout, inp, n,
                                                                                tanh_approx);
    return spk::launched(err, "fused gelu backward");
}

extern "C" sp_status sp_cuda_rope_bwd_h(sp_cuda *cu, void *dinp, const float *dout, const float *inv_freq, int pos0,
                                        int B, int T, int nh, int hd, sp_err *err)
{
    if (B <= 0 || T <= 0 || nh <= 0 || hd <= 0 || hd % 2 || pos0 < 0)
        return sp_errf(err, SP_ERR_ARG, "fused rope backward: bad shape B %d T %d heads %d head dim %d from %d", B, T,
                       nh, hd, pos0);
    long pairs = (long)B * T * nh * (hd / 2);
    rope_bwd_h_kernel<<<spk::grid_for(pairs), spk::kThreads, 0, spk::stream_of(cu)>>>((__nv_bfloat16 *)dinp, dout,
                                                                                    inv_freq, pos0, T, nh, hd, pairs);
    return spk::launched(err, "fused rope backward");
}
