// fused_decode.cu - the decode step's fused attention (kernels.h's sp_cuda_rope_attn_decode): RoPE of the step's query and
// key, the key and value stored into each row's cache, and the decode attention over the cache, one kernel where
// block.cu's plain step rotates by kernels of its own first (then calls this one without RoPE). RoPE in the same
// arithmetic and order (kmath.h), so both give the same bits. Launched as a programmatic dependent when asked (it
// waits before reading anything).
#include "kernels.h"
#include "launch.cuh"

using spk::block_max;
using spk::block_sum;

namespace {

constexpr int kAttnThreads = 256;
int g_keys = 0; // keys a warp scores at once (sp_cuda_attn_tune; 0: kKeys)
constexpr int kKeys = 4; // the default, as measured on an H200 (8 and 16: bench_block_cuda's sweep, not yet run)

// Block bh = (b, h): query head h of row b at position at = pos[b] over the at cached positions of its kv head g
// and the step's own key and value (rotated here, in shared memory; the first query head of g stores them into
// the cache at at, where no block of this step reads). Scores a warp a key (lanes over the head's values, summed
// by shuffles; kKeys keys of a warp at once, each summed as alone), kmath's softmax over the block, then the output
// a warp's share of the keys at a time, the warps' partial sums added in warp order. p: the head's scores (cap
// floats of scratch). Dynamic shared memory: (warps + 3) * hd floats. pf: weights asked of L2 (the next product's).
template <int KK>
__global__ void __launch_bounds__(kAttnThreads)
    rope_attn_decode_kernel(float *out, const float *q, const float *k, const float *v, float *const *kp,
                            float *const *vp, const float *inv_freq, const float *slopes, float *scratch,
                            const int *pos, int nh, int nkv, int hd, int cap, sp_cuda_pf pf)
{
    extern __shared__ float smem[]; // q, k, v [hd], then each warp's partial output [warps][hd]
    __shared__ float sh[kAttnThreads];
    spk::pdl_trigger();
    spk::prefetch_share(pf);
    spk::pdl_wait();
    int bh = blockIdx.x, b = bh / nh, tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;
    int nw = nt >> 5, h, at = pos[b], len = at + 1;
    long ldk = (long)nkv * hd, kv0 = sp_km_attn_block(bh % nh, nh, nkv, hd, cap, &h); // within the row's cache
    long knew = (long)b * ldk + kv0; // the kv head's step key in k [B, nkv * hd]
    float *kc = kp[b], *vc = vp[b];
    float *qs = smem, *ks = smem + hd, *vs = smem + 2 * hd, *part = smem + 3 * hd, *p = scratch + (long)bh * cap;
    float scale = 1.0f / sqrtf((float)hd), slope = slopes ? slopes[h] : 0.0f;
    for (int j = tid; j < hd; j += nt) {
        qs[j] = q[(long)bh * hd + j];
        ks[j] = k[knew + j];
        vs[j] = v[knew + j];
    }
    __syncthreads();
    for (int i = tid; inv_freq && i < hd / 2; i += nt) { // sp_km_rope_apply's rotation at position at
        float a = sp_km_rope_angle(at, inv_freq[i]), c = cosf(a), s = sinf(a);
        sp_km_rope_fwd(&qs[i], &qs[i + hd / 2], qs[i], qs[i + hd / 2], c, s);
        sp_km_rope_fwd(&ks[i], &ks[i + hd / 2], ks[i], ks[i + hd / 2], c, s);
    }
    __syncthreads();
    if (h % (nh / nkv) == 0)
        for (int j = tid; j < hd; j += nt) {
            kc[kv0 + at * ldk + j] = ks[j];
            vc[kv0 + at * ldk + j] = vs[j];
        }
    for (int s0 = warp; s0 < len; s0 += KK * nw) { // KK keys a warp at a time, their loads in flight together
        const float *kr[KK];
        float d[KK];
#pragma unroll
        for (int u = 0; u < KK; u++) {
            int s = s0 + u * nw;
            kr[u] = s == at ? ks : kc + kv0 + (s < len ? s : 0) * ldk;
            d[u] = 0.0f;
        }
        for (int j = lane; j < hd; j += 32)
#pragma unroll
            for (int u = 0; u < KK; u++)
                d[u] += qs[j] * kr[u][j];
#pragma unroll
        for (int u = 0; u < KK; u++) {
            for (int o = 16; o > 0; o >>= 1)
                d[u] += __shfl_xor_sync(0xffffffffu, d[u], o);
            int s = s0 + u * nw;
            if (lane == 0 && s < len)
                p[s] = d[u] * scale + sp_km_alibi(slope, s, len - 1);
        }
    }
    __syncthreads();
    float mx = block_max(sp_km_max_part(p, len, tid, nt), sh);
    float inv = 1.0f / block_sum(sp_km_sumexp_part(p, mx, len, tid, nt), sh);
    for (int s = tid; s < len; s += nt)
        p[s] = sp_km_attn_prob(p[s], mx, inv);
    __syncthreads();
    for (int j = lane; j < hd; j += 32) {
        float o = 0.0f;
#pragma unroll 8
        for (int s = warp; s < len; s += nw)
            o += p[s] * (s == at ? vs[j] : vc[kv0 + s * ldk + j]);
        part[warp * hd + j] = o;
    }
    __syncthreads();
    for (int j = tid; j < hd; j += nt) {
        float o = 0.0f;
        for (int w = 0; w < nw; w++)
            o += part[w * hd + j];
        out[(long)bh * hd + j] = o;
    }
}

} // namespace

extern "C" sp_status sp_cuda_rope_attn_decode(sp_cuda *cu, float *out, const float *q, const float *k, const float *v,
                                              float *const *kp, float *const *vp, const float *inv_freq,
                                              const float *slopes, float *scratch, const int *pos, int N, int nh,
                                              int nkv, int hd, int cap, int pdl, const sp_cuda_pf *pf,
                                              sp_err *err)
{
    if (N <= 0 || nh <= 0 || nkv <= 0 || nh % nkv || hd <= 0 || (inv_freq && hd % 2) || cap <= 0)
        return sp_errf(err, SP_ERR_ARG, "decode attention: %d rows of %d heads on %d KV heads of %d, cache %d", N,
                       nh, nkv, hd, cap);
    static const bool able = spk::pdl_able(rope_attn_decode_kernel<kKeys>);
    size_t shm = (size_t)(kAttnThreads / 32 + 3) * hd * sizeof(float);
    int keys = g_keys ? g_keys : kKeys;
    auto kernel = keys == 16 ? rope_attn_decode_kernel<16>
                  : keys == 8 ? rope_attn_decode_kernel<8>
                              : rope_attn_decode_kernel<kKeys>;
    cudaError_t e = spk::launch(pdl && able, kernel, dim3(N * nh), dim3(kAttnThreads), shm, spk::stream_of(cu), out, q,
                                k, v, kp, vp, inv_freq, slopes, scratch, pos, nh, nkv, hd, cap, pf ? *pf : sp_cuda_pf{});
    return sp_cuda_error(err, (int)e, "decode attention");
}

extern "C" void sp_cuda_attn_tune(int keys) { g_keys = keys == 8 || keys == 16 ? keys : 0; }
