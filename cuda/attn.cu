// attn.cu - attention on the device (kernels.h): decode over a KV cache (one query position, GQA / MQA, ALiBi),
// prefill through cuBLAS with the causal softmax, and the cache append. The arithmetic is kmath.h's
// (sp_km_attn_*); the CPU reference is sp_attention_forward.
#include "gemm.h"
#include "kernels.h"
#include "launch.cuh"

using spk::block_max;
using spk::block_sum;

namespace {

// Decode attention: block (b, h) over the len cached positions; p: its len scores, then probabilities.
__global__ void attn_decode_kernel(float *out, const float *q, const float *kc, const float *vc, const float *slopes,
                                   float *scratch, int nh, int nkv, int hd, int cap, int len)
{
    __shared__ float sh[SP_KM_MAX_THREADS];
    int tid = threadIdx.x, nt = blockDim.x, bh = blockIdx.x, h;
    long ldk = (long)nkv * hd, kv0 = sp_km_attn_block(bh, nh, nkv, hd, cap, &h);
    const float *qv = q + (long)bh * hd;
    float *p = scratch + (long)bh * len, scale = 1.0f / sqrtf((float)hd), slope = slopes ? slopes[h] : 0.0f;
    for (int s = tid; s < len; s += nt)
        p[s] = sp_km_attn_score(qv, kc + kv0 + s * ldk, hd, scale, slope, s, len - 1);
    float mx = block_max(sp_km_max_part(p, len, tid, nt), sh); // each thread reads back what it wrote
    float inv = 1.0f / block_sum(sp_km_sumexp_part(p, mx, len, tid, nt), sh);
    for (int s = tid; s < len; s += nt)
        p[s] = sp_km_attn_prob(p[s], mx, inv);
    __syncthreads();
    for (int j = tid; j < hd; j += nt)
        out[(long)bh * hd + j] = sp_km_attn_out(p, vc + kv0, ldk, len, j);
}

// Row blockIdx.x of [rows, S] prefill scores: softmax over its visible keys, zeros after.
__global__ void causal_softmax_kernel(float *scores, int T, int S, int past)
{
    __shared__ float sh[SP_KM_MAX_THREADS];
    int tid = threadIdx.x, nt = blockDim.x, n = sp_km_causal_len(blockIdx.x, T, past);
    float *p = scores + (long)blockIdx.x * S;
    float mx = block_max(sp_km_max_part(p, n, tid, nt), sh);
    float inv = 1.0f / block_sum(sp_km_sumexp_part(p, mx, n, tid, nt), sh);
    for (int s = tid; s < S; s += nt)
        p[s] = s < n ? sp_km_attn_prob(p[s], mx, inv) : 0.0f;
}

// Row blockIdx.x of dP [rows, S] becomes dScore = P (dP - sum(dP P)) scale, in place.
__global__ void softmax_bwd_kernel(float *dp, const float *probs, int S, float scale)
{
    __shared__ float sh[SP_KM_MAX_THREADS];
    int tid = threadIdx.x, nt = blockDim.x;
    float *g = dp + (long)blockIdx.x * S;
    const float *p = probs + (long)blockIdx.x * S;
    float dot = block_sum(sp_km_dot3_part(g, p, NULL, S, tid, nt), sh);
    for (int s = tid; s < S; s += nt)
        g[s] = sp_km_softmax_bwd(p[s], g[s], dot, scale);
}

} // namespace

extern "C" sp_status sp_cuda_attn_decode(sp_cuda *cu, float *out, const float *q, const float *kc, const float *vc,
                                         const float *slopes, int B, int nh, int nkv, int hd, int cap, int len,
                                         sp_err *err)
{
    if (B <= 0 || nh <= 0 || nkv <= 0 || nh % nkv || hd <= 0 || len <= 0 || len > cap)
        return sp_errf(err, SP_ERR_ARG, "attention: bad shape B %d heads %d/%d head dim %d length %d of %d", B, nh,
                       nkv, hd, len, cap);
    void *scratch = NULL;
    sp_status st = sp_cuda_workspace(cu, (size_t)B * nh * len * sizeof(float), &scratch, err);
    if (st != SP_OK)
        return st;
    attn_decode_kernel<<<B * nh, sp_km_row_threads(len), 0, spk::stream_of(cu)>>>(out, q, kc, vc, slopes,
                                                                                 (float *)scratch, nh, nkv, hd, cap,
                                                                                 len);
    return spk::launched(err, "decode attention");
}

extern "C" sp_status sp_cuda_kv_append(sp_cuda *cu, float *cache, const float *x, int B, int T, int cap, int len,
                                       int row, sp_err *err)
{
    if (B <= 0 || T <= 0 || row <= 0 || len < 0 || T > cap - len)
        return sp_errf(err, SP_ERR_ARG, "kv cache: %d positions at %d do not fit %d", T, len, cap);
    size_t w = (size_t)T * row * sizeof(float);
    cudaError_t e = cudaMemcpy2DAsync(cache + (size_t)len * row, (size_t)cap * row * sizeof(float), x, w, w, (size_t)B,
                                      cudaMemcpyDeviceToDevice, spk::stream_of(cu));
    return sp_cuda_error(err, (int)e, "kv cache append");
}

extern "C" sp_status sp_cuda_causal_softmax(sp_cuda *cu, float *scores, long rows, int T, int S, int past, sp_err *err)
{
    if (rows <= 0 || rows > INT32_MAX || T <= 0 || past < 0 || S != past + T || rows % T)
        return sp_errf(err, SP_ERR_ARG, "causal softmax: bad shape %ld rows T %d S %d past %d", rows, T, S, past);
    causal_softmax_kernel<<<(unsigned)rows, sp_km_row_threads(S), 0, spk::stream_of(cu)>>>(scores, T, S, past);
    return spk::launched(err, "causal softmax");
}

// Plan p once per head bh: A, B, C at the head's offsets (sp_km_head_off's kinds ao, bo, co). Nothing when c is NULL.
static sp_status per_head(sp_cuda *cu, const sp_gemm_plan *p, const float *a, int ao, const float *b, int bo, float *c,
                          int co, int B, int T, int S, int nh, int nkv, int hd, int cap, sp_err *err)
{
    sp_status st = SP_OK;
    for (int bh = 0; c && st == SP_OK && bh < B * nh; bh++)
        st = sp_cuda_gemm(cu, p, a + sp_km_head_off(ao, bh, nh, nkv, T, S, hd, cap),
                          b + sp_km_head_off(bo, bh, nh, nkv, T, S, hd, cap),
                          c + sp_km_head_off(co, bh, nh, nkv, T, S, hd, cap), SP_CU_F32, err);
    return st;
}

static bool attn_shape_ok(int B, int T, int past, int nh, int nkv, int hd, int cap)
{
    return B > 0 && T > 0 && past >= 0 && nh > 0 && nkv > 0 && nh % nkv == 0 && hd > 0 && past + T <= cap;
}

static sp_status attn_bad_shape(sp_err *err, const char *what, int B, int T, int past, int nh, int nkv, int hd, int cap)
{
    return sp_errf(err, SP_ERR_ARG, "%s: bad shape B %d T %d past %d heads %d/%d head dim %d of %d", what, B, T, past,
                   nh, nkv, hd, cap);
}

enum { Q = SP_KM_OFF_Q, KV = SP_KM_OFF_KV, TS = SP_KM_OFF_TS };

extern "C" sp_status sp_cuda_attn_prefill(sp_cuda *cu, float *out, float *probs, const float *q, const float *kc,
                                          const float *vc, const float *slopes, int B, int T, int past, int nh, int nkv,
                                          int hd, int cap, sp_err *err)
{
    if (!attn_shape_ok(B, T, past, nh, nkv, hd, cap))
        return attn_bad_shape(err, "attention", B, T, past, nh, nkv, hd, cap);
    int S = past + T, ldq = nh * hd, ldk = nkv * hd;
    sp_gemm_plan ps = sp_gemm_plan_scores(T, S, hd, ldq, ldk, 1.0f / sqrtf((float)hd));
    sp_gemm_plan po = sp_gemm_plan_attn_out(T, S, hd, ldk, ldq, 0);
    sp_status st = per_head(cu, &ps, kc, KV, q, Q, probs, TS, B, T, S, nh, nkv, hd, cap, err);
    if (st == SP_OK && slopes)
        st = sp_cuda_alibi_add(cu, probs, slopes, B, nh, T, S, past, err);
    if (st == SP_OK)
        st = sp_cuda_causal_softmax(cu, probs, (long)B * nh * T, T, S, past, err);
    if (st == SP_OK)
        st = per_head(cu, &po, vc, KV, probs, TS, out, Q, B, T, S, nh, nkv, hd, cap, err);
    return st;
}

extern "C" sp_status sp_cuda_attn_backward(sp_cuda *cu, float *dq, float *dk, float *dv, const float *dout,
                                           const float *probs, const float *q, const float *kc, const float *vc, int B,
                                           int T, int past, int nh, int nkv, int hd, int cap, sp_err *err)
{
    if (!attn_shape_ok(B, T, past, nh, nkv, hd, cap))
        return attn_bad_shape(err, "attention backward", B, T, past, nh, nkv, hd, cap);
    int S = past + T, ldq = nh * hd, ldk = nkv * hd;
    void *ws = NULL;
    sp_status st = sp_cuda_workspace(cu, (size_t)B * nh * T * S * sizeof(float), &ws, err);
    float *dp = (float *)ws;
    sp_gemm_plan pdp = sp_gemm_plan_scores(T, S, hd, ldq, ldk, 1.0f); // dP = dO V^T
    sp_gemm_plan pkv = sp_gemm_plan_attn_kv_grad(T, S, hd, ldq, ldk); // dV += P^T dO, dK += dS^T Q
    sp_gemm_plan pq = sp_gemm_plan_attn_out(T, S, hd, ldk, ldq, 1);   // dQ += dS K
    if (st == SP_OK)
        st = per_head(cu, &pdp, vc, KV, dout, Q, dp, TS, B, T, S, nh, nkv, hd, cap, err);
    if (st == SP_OK)
        st = per_head(cu, &pkv, dout, Q, probs, TS, dv, KV, B, T, S, nh, nkv, hd, cap, err);
    if (st == SP_OK) { // dP becomes dScore
        softmax_bwd_kernel<<<B * nh * T, sp_km_row_threads(S), 0, spk::stream_of(cu)>>>(dp, probs, S,
                                                                                     1.0f / sqrtf((float)hd));
        st = spk::launched(err, "attention backward");
    }
    if (st == SP_OK)
        st = per_head(cu, &pq, kc, KV, dp, TS, dq, Q, B, T, S, nh, nkv, hd, cap, err);
    if (st == SP_OK)
        st = per_head(cu, &pkv, q, Q, dp, TS, dk, KV, B, T, S, nh, nkv, hd, cap, err);
    return st;
}
