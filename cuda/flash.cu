// flash.cu - flash attention (flash.h): the forward and its backward on bf16 tensor cores. q, k, v (and dout) are
// packed first to bf16 [B, heads, L, HD] in the workspace, HD the head size padded to 64 or 128 with zeros, so a
// tile of 64 rows is one contiguous block that cp.async copies in 16-byte pieces. A block of 4 warps takes a tile
// of 64 rows (queries for the forward and dq, keys for dk / dv), 16 rows a warp, and walks the other side's tiles
// of 64: scores by mma.sync m16n8k16 (bf16 in, f32 accumulators), the causal mask and ALiBi on the accumulators,
// the softmax in base 2 (scale and slopes times log2 e), probabilities rounded to bf16 straight from the score
// accumulators into the next product's A fragments. Shared-memory rows are HD + 8 values apart, so ldmatrix's
// eight 16-byte rows fall in distinct banks.
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "flash.h"
#include "launch.cuh"

typedef __nv_bfloat16 bf16;

namespace {

constexpr int kRows = 64;    // a tile's rows
constexpr int kThreads = 128; // 4 warps of 16 rows
constexpr float kLog2e = 1.4426950408889634f;

// ---------------------------------------------------------------------------------------------------------------
// tensor-core and copy primitives

__device__ inline uint32_t pack2(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); // .x (lo) in the low half: the smaller column
    return *reinterpret_cast<uint32_t *>(&v);
}

// c[4] += a[4] b[2]: A 16x16 row-major, B 16x8 column-major, C 16x8 (PTX's m16n8k16 fragment layouts).
__device__ inline void mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ inline void ldsm(uint32_t *r, const bf16 *p)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ inline void ldsm_t(uint32_t *r, const bf16 *p)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// 16 bytes global -> shared; zeros when !ok (src-size 0 reads nothing).
__device__ inline void cp16(bf16 *s, const bf16 *g, bool ok)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(g), "r"(ok ? 16 : 0));
}
// 4 bytes global -> shared (cp.async's .ca form: .cg takes 16 bytes only).
__device__ inline void cp4(float *s, const float *g)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(s);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(a), "l"(g));
}
__device__ inline void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ inline void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// A fragment of the 16x16 block at (m0, k0) of a row-major [m][k] tile of row stride LD.
template <int LD> __device__ inline void frag_a(uint32_t *a, const bf16 *s, int m0, int k0)
{
    int l = threadIdx.x & 31;
    ldsm(a, s + (m0 + (l & 15)) * LD + k0 + (l >> 4) * 8);
}

// B fragments of the two 16x8 blocks at n0 and n0 + 8 (k from k0) of a tile stored [n][k] (b[0..1]: n0, b[2..3]:
// n0 + 8).
template <int LD> __device__ inline void frag_b_nk(uint32_t *b, const bf16 *s, int n0, int k0)
{
    int l = threadIdx.x & 31;
    ldsm(b, s + (n0 + (l >> 4) * 8 + (l & 7)) * LD + k0 + ((l >> 3) & 1) * 8);
}

// The same from a tile stored [k][n] (transposed by ldmatrix).
template <int LD> __device__ inline void frag_b_kn(uint32_t *b, const bf16 *s, int k0, int n0)
{
    int l = threadIdx.x & 31;
    ldsm_t(b, s + (k0 + ((l >> 3) & 1) * 8 + (l & 7)) * LD + n0 + (l >> 4) * 8);
}

// The A fragment of the 16x16 block at (m0, k0) of A = S^T, S a tile stored [k][m] (transposed by ldmatrix).
template <int LD> __device__ inline void frag_a_t(uint32_t *a, const bf16 *s, int m0, int k0)
{
    int l = threadIdx.x & 31;
    ldsm_t(a, s + (k0 + ((l >> 4) & 1) * 8 + (l & 7)) * LD + m0 + ((l >> 3) & 1) * 8);
}

// The A fragment of columns 16 kk .. 16 kk + 15 of a 16 x 64 accumulator tile c[8][4], rounded to bf16.
__device__ inline void acc_to_a(uint32_t *a, const float (*c)[4], int kk)
{
    a[0] = pack2(c[2 * kk][0], c[2 * kk][1]);
    a[1] = pack2(c[2 * kk][2], c[2 * kk][3]);
    a[2] = pack2(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    a[3] = pack2(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

// Rows r0 .. r0 + 63 of a packed [L, HD] matrix into a shared tile (rows past L zeros); every thread takes part.
template <int HD> __device__ inline void load_tile(bf16 *s, const bf16 *g, int r0, int L)
{
    constexpr int CH = HD / 8;
    for (int c = threadIdx.x; c < kRows * CH; c += kThreads) {
        int r = c / CH, col = (c % CH) * 8;
        bool ok = r0 + r < L;
        cp16(s + r * (HD + 8) + col, g + (long)(ok ? r0 + r : 0) * HD + col, ok);
    }
}

// c[N][4] = A (16 rows at m0 of sa, [m][k]) times B^T (sb stored [n][k], 64 rows): 16 x 64 scores.
template <int HD> __device__ inline void scores(float (*c)[4], const bf16 *sa, int m0, const bf16 *sb)
{
    constexpr int LD = HD + 8;
#pragma unroll
    for (int i = 0; i < 8; i++)
        c[i][0] = c[i][1] = c[i][2] = c[i][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        uint32_t a[4];
        frag_a<LD>(a, sa, m0, kk * 16);
#pragma unroll
        for (int np = 0; np < 4; np++) {
            uint32_t b[4];
            frag_b_nk<LD>(b, sb, np * 16, kk * 16);
            mma(c[2 * np], a, b[0], b[1]);
            mma(c[2 * np + 1], a, b[2], b[3]);
        }
    }
}

// acc[HD / 8][4] += P (the 16 x 64 accumulators p, rounded to bf16) times sb (stored [k][n]: 64 rows of HD).
template <int HD> __device__ inline void accumulate(float (*acc)[4], const float (*p)[4], const bf16 *sb)
{
    constexpr int LD = HD + 8;
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        uint32_t a[4];
        acc_to_a(a, p, kk);
#pragma unroll
        for (int np = 0; np < HD / 16; np++) {
            uint32_t b[4];
            frag_b_kn<LD>(b, sb, kk * 16, np * 16);
            mma(acc[2 * np], a, b[0], b[1]);
            mma(acc[2 * np + 1], a, b[2], b[3]);
        }
    }
}

// The end of a key tile's step in the forward and in dq: once the step's copies are in and every warp is done
// with tile a, a's buffer starts taking the next tile (when more) while work() reads tile b; once every warp is done
// with b, b's buffer takes the next tile too, and the step waits until `After` copy groups remain in flight.
template <int HD, int After, typename F>
__device__ inline void next_tiles(F work, bf16 *sa, const bf16 *ga, bf16 *sb, const bf16 *gb, int r0, int L, bool more)
{
    cp_wait<0>();
    __syncthreads();
    if (more) {
        load_tile<HD>(sa, ga, r0, L);
        cp_commit();
    }
    work();
    __syncthreads();
    if (more) {
        load_tile<HD>(sb, gb, r0, L);
        cp_commit();
        cp_wait<After>();
        __syncthreads();
    }
}

// ---------------------------------------------------------------------------------------------------------------
// kernels

struct fparams {
    const bf16 *q, *k, *v, *dout; // packed [B, heads, L, HD]
    float *out;                   // [B, T, nh * hd] (NULL: not written)
    bf16 *outh;                   // the same in bf16 (NULL: not written)
    float *lse;                   // [B, nh, T] log2-sum-exp2 of the scaled scores
    const float *D;               // [B, nh, T] rowsum(dout * out)
    float *dq, *dk, *dv;          // dq [B, T, nh * hd]; dk, dv element (b, s, query head h, d) at
    long kv_bs, kv_rs;            // b * kv_bs + s * kv_rs + h * hd + d (the kv head's own when nh == nkv)
    int acc, kv_acc;              // 1: dq (acc), dk and dv (kv_acc) added into; 0: written
    bf16 *ds;                     // dS^T tiles [B * nh][query tile][key tile][64 keys][64 queries] (dq from them)
    const float *slopes;
    int T, past, S, nh, nkv, hd;
    float sl2, scale;             // scale * log2 e; scale
};

__device__ inline float slope2(const fparams &p, int h) { return p.slopes ? p.slopes[h] * kLog2e : 0.0f; }

// The place of a query-tile block (the forward's, dq's): tile gridDim.y - 1 - blockIdx.y (the longest first) of
// head bh = blockIdx.x = b * nh + h, its kv head's packed keys and values, and the key tiles its queries see.
struct qtile {
    int q0, bh, b, h, nkt;
    const bf16 *K, *V;
};

template <int HD> __device__ inline qtile query_tile(const fparams &p)
{
    qtile t;
    t.q0 = (gridDim.y - 1 - blockIdx.y) * kRows, t.bh = blockIdx.x, t.b = t.bh / p.nh, t.h = t.bh % p.nh;
    long kvoff = (long)(t.b * p.nkv + t.h / (p.nh / p.nkv)) * p.S * HD;
    t.K = p.k + kvoff, t.V = p.v + kvoff;
    t.nkt = (p.past + min(p.T, t.q0 + kRows) + kRows - 1) / kRows;
    return t;
}

// The forward of a query tile (query_tile).
template <int HD> __global__ void __launch_bounds__(kThreads) fwd_kernel(fparams p)
{
    constexpr int LD = HD + 8, NT = HD / 8;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *sQ = reinterpret_cast<bf16 *>(smem), *sK = sQ + kRows * LD, *sV = sK + kRows * LD;
    qtile qt = query_tile<HD>(p);
    int q0 = qt.q0, bh = qt.bh, b = qt.b, h = qt.h, nkt = qt.nkt, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const bf16 *K = qt.K, *V = qt.V;
    load_tile<HD>(sQ, p.q + (long)bh * p.T * HD, q0, p.T);
    load_tile<HD>(sK, K, 0, p.S);
    cp_commit();
    load_tile<HD>(sV, V, 0, p.S);
    cp_commit();
    cp_wait<1>();
    __syncthreads();
    float o[NT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, slope = slope2(p, h);
#pragma unroll
    for (int i = 0; i < NT; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    int t0 = q0 + warp * 16 + (lane >> 2); // the query of accumulators 0, 1 (2, 3: t0 + 8)
    for (int j = 0; j < nkt; j++) {
        float s[8][4];
        scores<HD>(s, sQ, warp * 16, sK);
        bool edge = j * kRows + kRows - 1 > p.past + q0;
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int kpos = j * kRows + nt * 8 + 2 * (lane & 3) + (e & 1), qpos = p.past + t0 + (e >> 1) * 8;
                float v = s[nt][e] * p.sl2 + slope * (float)(kpos - qpos);
                s[nt][e] = edge && kpos > qpos ? -INFINITY : v;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
            }
        float corr[2], rs[2] = {0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < 2; i++) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
            corr[i] = exp2f(m[i] - mx[i]); // 0 on the first tile (m -inf; key 0 is visible to every row)
            m[i] = mx[i];
        }
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[nt][e] = exp2f(s[nt][e] - m[e >> 1]);
                rs[e >> 1] += s[nt][e];
            }
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            o[nt][0] *= corr[0], o[nt][1] *= corr[0];
            o[nt][2] *= corr[1], o[nt][3] *= corr[1];
        }
        l[0] = l[0] * corr[0] + rs[0];
        l[1] = l[1] * corr[1] + rs[1];
        // O += P V_j while K_{j+1} comes in; then V_{j+1}, waiting for K_{j+1} only
        next_tiles<HD, 1>([&] { accumulate<HD>(o, s, sV); }, sK, K, sV, V, (j + 1) * kRows, p.S, j + 1 < nkt);
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
        int t = t0 + i * 8;
        if (t >= p.T)
            continue;
        float inv = 1.0f / l[i];
        long row = ((long)b * p.T + t) * p.nh * p.hd + (long)h * p.hd;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int d = nt * 8 + 2 * (lane & 3) + e;
                if (d >= p.hd)
                    continue;
                float v = o[nt][i * 2 + e] * inv;
                if (p.out)
                    p.out[row + d] = v;
                if (p.outh)
                    p.outh[row + d] = __float2bfloat16_rn(v);
            }
        if (p.lse && (lane & 3) == 0)
            p.lse[(long)bh * p.T + t] = m[i] + log2f(l[i]);
    }
}

// A query tile's dq accumulators (rows t0 and t0 + 8 of this lane, dq_kernel's and dq_ds_kernel's layout) added
// into dq (p.acc) or written.
template <int HD> __device__ inline void store_dq(const fparams &p, const float (*acc)[4], int t0, int b, int h)
{
    constexpr int NT = HD / 8;
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int t = t0 + i * 8;
        if (t >= p.T)
            continue;
        float *row = p.dq + ((long)b * p.T + t) * p.nh * p.hd + (long)h * p.hd;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int d = nt * 8 + 2 * (lane & 3) + e;
                if (d < p.hd)
                    row[d] = p.acc ? row[d] + acc[nt][i * 2 + e] : acc[nt][i * 2 + e];
            }
    }
}

// dq of a query tile (query_tile): P from lse, dP = dout V^T, dS = P (dP - D) scale, dq (+)= dS K, over the key
// tiles its queries see. PIPE: the keys and values of tile j + 1 come into a second pair of buffers while tile j's
// products run (six tiles of shared memory); else next_tiles' overlap (four). At most 170 registers a thread: three
// blocks an SM (the plain kernel's shared memory allows three).
template <int HD, bool PIPE> __global__ void __launch_bounds__(kThreads, 3) dq_kernel(fparams p)
{
    constexpr int LD = HD + 8, NT = HD / 8, TL = kRows * LD;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *sQ = reinterpret_cast<bf16 *>(smem), *sO = sQ + TL, *sK = sO + TL, *sV = sK + TL; // PIPE: K1, V1 after
    qtile qt = query_tile<HD>(p);
    int q0 = qt.q0, bh = qt.bh, b = qt.b, h = qt.h, nkt = qt.nkt, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const bf16 *K = qt.K, *V = qt.V;
    load_tile<HD>(sQ, p.q + (long)bh * p.T * HD, q0, p.T);
    load_tile<HD>(sO, p.dout + (long)bh * p.T * HD, q0, p.T);
    load_tile<HD>(sK, K, 0, p.S);
    load_tile<HD>(sV, V, 0, p.S);
    cp_commit();
    int t0 = q0 + warp * 16 + (lane >> 2);
    float lse[2], D[2], slope = slope2(p, h), acc[NT][4];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int t = min(t0 + i * 8, p.T - 1); // rows past T: any finite value (never written)
        lse[i] = p.lse[(long)bh * p.T + t];
        D[i] = p.D[(long)bh * p.T + t];
    }
#pragma unroll
    for (int i = 0; i < NT; i++)
        acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    if (!PIPE) {
        cp_wait<0>();
        __syncthreads();
    }
    for (int j = 0; j < nkt; j++) {
        bf16 *tk = sK, *tv = sV;
        if (PIPE) { // buffers j & 1; tile j + 1 into the other pair (every warp left it at the end of step j - 1)
            tk = sK + (j & 1) * 2 * TL, tv = tk + TL;
            if (j + 1 < nkt) {
                bf16 *nk = sK + ((j + 1) & 1) * 2 * TL;
                load_tile<HD>(nk, K, (j + 1) * kRows, p.S);
                load_tile<HD>(nk + TL, V, (j + 1) * kRows, p.S);
                cp_commit();
                cp_wait<1>();
            } else {
                cp_wait<0>();
            }
            __syncthreads();
        }
        float s[8][4], dp[8][4];
        scores<HD>(s, sQ, warp * 16, tk);
        scores<HD>(dp, sO, warp * 16, tv);
        bool edge = j * kRows + kRows - 1 > p.past + q0;
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int kpos = j * kRows + nt * 8 + 2 * (lane & 3) + (e & 1), qpos = p.past + t0 + (e >> 1) * 8;
                float v = exp2f(s[nt][e] * p.sl2 + slope * (float)(kpos - qpos) - lse[e >> 1]);
                v = edge && kpos > qpos ? 0.0f : v;
                s[nt][e] = v * (dp[nt][e] - D[e >> 1]) * p.scale;
            }
        if (PIPE) {
            accumulate<HD>(acc, s, tk);
            __syncthreads(); // every warp is done with buffers j & 1
        } else {
            // dq += dS K_j while V_{j+1} comes in; then K_{j+1}, waiting for both
            next_tiles<HD, 0>([&] { accumulate<HD>(acc, s, sK); }, sV, V, sK, K, (j + 1) * kRows, p.S, j + 1 < nkt);
        }
    }
    store_dq<HD>(p, acc, t0, b, h);
}

// dq of a query tile (query_tile) from the dS^T tiles dkv_kernel<.., true> stored: dq (+)= dS K over the key tiles
// its queries see, one product a tile (no scores, no exponentials); each next key tile and dS^T tile come into a
// second pair of buffers while a tile's product runs.
template <int HD> __global__ void __launch_bounds__(kThreads) dq_ds_kernel(fparams p)
{
    constexpr int LD = HD + 8, NT = HD / 8, TL = kRows * LD, DL = kRows + 8, DT = kRows * DL, CH = kRows / 8;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *sK = reinterpret_cast<bf16 *>(smem), *sS = sK + 2 * TL; // K0, K1, then dS^T 0, 1
    qtile qt = query_tile<HD>(p);
    int q0 = qt.q0, b = qt.b, h = qt.h, nkt = qt.nkt, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int nqt = (p.T + kRows - 1) / kRows, nkt_all = (p.S + kRows - 1) / kRows;
    const bf16 *K = qt.K, *dS = p.ds + (long)(qt.bh * nqt + q0 / kRows) * nkt_all * (kRows * kRows);
    auto load_ds = [&](bf16 *dst, const bf16 *src) { // a 64 x 64 tile, rows DL apart in shared memory
        for (int c = threadIdx.x; c < kRows * CH; c += kThreads)
            cp16(dst + (c / CH) * DL + (c % CH) * 8, src + (c / CH) * kRows + (c % CH) * 8, true);
    };
    load_tile<HD>(sK, K, 0, p.S);
    load_ds(sS, dS);
    cp_commit();
    float acc[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++)
        acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    for (int j = 0; j < nkt; j++) {
        int buf = j & 1;
        const bf16 *tk = sK + buf * TL, *ts = sS + buf * DT;
        if (j + 1 < nkt) { // the other buffers: every warp left them at the end of step j - 1
            load_tile<HD>(sK + (buf ^ 1) * TL, K, (j + 1) * kRows, p.S);
            load_ds(sS + (buf ^ 1) * DT, dS + (long)(j + 1) * (kRows * kRows));
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) { // acc += dS (this warp's 16 queries x 64 keys) K_j (64 keys x HD)
            uint32_t a[4];
            frag_a_t<DL>(a, ts, warp * 16, kk * 16);
#pragma unroll
            for (int np = 0; np < HD / 16; np++) {
                uint32_t bb[4];
                frag_b_kn<LD>(bb, tk, kk * 16, np * 16);
                mma(acc[2 * np], a, bb[0], bb[1]);
                mma(acc[2 * np + 1], a, bb[2], bb[3]);
            }
        }
        __syncthreads(); // every warp is done with buffers j & 1
    }
    int t0 = q0 + warp * 16 + (lane >> 2);
    store_dq<HD>(p, acc, t0, b, h);
}

// Query tile q0's queries and output gradients (packed, from Q and dO) into sq and so, their log-sum-exp and D into
// sl and sd, all as copies in flight (cp.async: the caller commits them).
template <int HD>
__device__ inline void load_query_tile(bf16 *sq, bf16 *so, float *sl, float *sd, const bf16 *Q, const bf16 *dO,
                                       const fparams &p, int bh, int q0)
{
    static_assert(kThreads == 2 * kRows, "a thread a row's lse or D");
    load_tile<HD>(sq, Q, q0, p.T);
    load_tile<HD>(so, dO, q0, p.T);
    int r = threadIdx.x & (kRows - 1);
    long t = (long)bh * p.T + min(q0 + r, p.T - 1); // rows past T: any finite value (masked)
    if (threadIdx.x < kRows)
        cp4(sl + r, p.lse + t);
    else
        cp4(sd + r, p.D + t);
}

// dk, dv of key tile blockIdx.y for query head blockIdx.x (its kv head's keys): over the query tiles that see
// them, P^T from lse, dv (+)= P^T dout, dP^T = V dout^T, dS^T = P^T (dP^T - D) scale, dk (+)= dS^T q. PIPE: query
// tile i + 1 (its queries, output gradients, lse and D) comes into a second set of buffers while tile i's products
// run (six tiles of shared memory); else each tile is copied in and waited for (four). DS: each dS^T tile, rounded
// to bf16 as dk's product takes it, is stored too (p.ds) for dq_ds_kernel.
template <int HD, bool PIPE, bool DS>
__global__ void __launch_bounds__(kThreads, HD == 64 ? 3 : 1) dkv_kernel(fparams p)
{
    constexpr int LD = HD + 8, NT = HD / 8, TL = kRows * LD, NB = PIPE ? 2 : 1;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *sK = reinterpret_cast<bf16 *>(smem), *sV = sK + TL, *sQ = sV + TL; // then dO; PIPE: Q1, dO1
    float *sL = reinterpret_cast<float *>(sQ + NB * 2 * TL);                  // then D; PIPE: L1, D1
    int n0 = blockIdx.y * kRows, bh = blockIdx.x, b = bh / p.nh, h = bh % p.nh;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nqt = (p.T + kRows - 1) / kRows;
    int i0 = max(0, n0 - p.past) / kRows; // the first query tile that sees these keys (< nqt: n0 < past + T)
    long kvoff = (long)(b * p.nkv + h / (p.nh / p.nkv)) * p.S * HD;
    load_tile<HD>(sK, p.k + kvoff, n0, p.S);
    load_tile<HD>(sV, p.v + kvoff, n0, p.S);
    const bf16 *Q = p.q + (long)bh * p.T * HD, *dO = p.dout + (long)bh * p.T * HD;
    if (PIPE) {
        load_query_tile<HD>(sQ, sQ + TL, sL, sL + kRows, Q, dO, p, bh, i0 * kRows);
        cp_commit();
    }
    float dk[NT][4], dv[NT][4], slope = slope2(p, h);
#pragma unroll
    for (int i = 0; i < NT; i++)
        dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.0f;
    int k0 = n0 + warp * 16 + (lane >> 2); // the key of accumulators 0, 1 (2, 3: k0 + 8)
    for (int i = i0; i < nqt; i++) {
        int q0 = i * kRows;
        bf16 *tq = sQ, *to = sQ + TL;
        float *tl = sL, *td = sL + kRows;
        if (PIPE) { // buffers (i - i0) & 1; tile i + 1 into the others (every warp left them at the end of i - 1)
            int buf = (i - i0) & 1;
            tq = sQ + buf * 2 * TL, to = tq + TL, tl = sL + buf * 2 * kRows, td = tl + kRows;
            if (i + 1 < nqt) {
                bf16 *nq = sQ + (buf ^ 1) * 2 * TL;
                float *nl = sL + (buf ^ 1) * 2 * kRows;
                load_query_tile<HD>(nq, nq + TL, nl, nl + kRows, Q, dO, p, bh, q0 + kRows);
                cp_commit();
                cp_wait<1>();
            } else {
                cp_wait<0>();
            }
        } else {
            load_tile<HD>(sQ, Q, q0, p.T);
            load_tile<HD>(sQ + TL, dO, q0, p.T);
            if (threadIdx.x < kRows) {
                int t = min(q0 + (int)threadIdx.x, p.T - 1);
                sL[threadIdx.x] = p.lse[(long)bh * p.T + t];
                sL[kRows + threadIdx.x] = p.D[(long)bh * p.T + t];
            }
            cp_commit();
            cp_wait<0>();
        }
        __syncthreads();
        float s[8][4], dp[8][4];
        scores<HD>(s, sK, warp * 16, tq);
        bool edge = n0 + kRows - 1 > p.past + q0 || q0 + kRows > p.T;
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int c = nt * 8 + 2 * (lane & 3) + (e & 1), kpos = k0 + (e >> 1) * 8, qpos = p.past + q0 + c;
                float v = exp2f(s[nt][e] * p.sl2 + slope * (float)(kpos - qpos) - tl[c]);
                s[nt][e] = edge && (kpos > qpos || q0 + c >= p.T) ? 0.0f : v;
            }
        accumulate<HD>(dv, s, to);
        scores<HD>(dp, sV, warp * 16, to);
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                s[nt][e] *= (dp[nt][e] - td[nt * 8 + 2 * (lane & 3) + (e & 1)]) * p.scale;
        if (DS) { // rows: this warp's keys; columns: the tile's queries (two a 4-byte store)
            bf16 *t = p.ds + ((long)(bh * nqt + i) * gridDim.y + blockIdx.y) * (kRows * kRows);
            int kr = warp * 16 + (lane >> 2), c = 2 * (lane & 3);
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                *reinterpret_cast<uint32_t *>(t + kr * kRows + nt * 8 + c) = pack2(s[nt][0], s[nt][1]);
                *reinterpret_cast<uint32_t *>(t + (kr + 8) * kRows + nt * 8 + c) = pack2(s[nt][2], s[nt][3]);
            }
        }
        accumulate<HD>(dk, s, tq);
        __syncthreads(); // every warp is done with this query tile
    }
    cp_wait<0>(); // nothing left in flight (no query tile sees these keys: the loop ran none)
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int s = k0 + i * 8;
        if (s >= p.S)
            continue;
        long row = (long)b * p.kv_bs + (long)s * p.kv_rs + (long)h * p.hd;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int d = nt * 8 + 2 * (lane & 3) + e;
                if (d >= p.hd)
                    continue;
                float gk = dk[nt][i * 2 + e], gv = dv[nt][i * 2 + e];
                p.dk[row + d] = p.kv_acc ? p.dk[row + d] + gk : gk;
                p.dv[row + d] = p.kv_acc ? p.dv[row + d] + gv : gv;
            }
    }
}

// dst [B, heads, L, HD] bf16 from src element (b, l, head, d) at b * bs + l * rs + head * hd + d; zeros for
// d >= hd. Eight values a thread, one 16-byte store.
__global__ void pack_kernel(bf16 *dst, const float *src, long bs, long rs, int heads, int L, int hd, int HD, long n8)
{
    SPK_GRID_LOOP(i, n8)
    {
        long e = i * 8, r = e / HD;
        int d0 = (int)(e % HD), l = (int)(r % L), head = (int)(r / L % heads), b = (int)(r / L / heads);
        const float *s = src + b * bs + l * rs + (long)head * hd;
        union {
            uint4 u;
            bf16 h[8];
        } v;
#pragma unroll
        for (int k = 0; k < 8; k++)
            v.h[k] = __float2bfloat16_rn(d0 + k < hd ? s[d0 + k] : 0.0f);
        *reinterpret_cast<uint4 *>(dst + e) = v.u;
    }
}

// dst [B, heads, T, HD] bf16 from src rows [B, T, heads * hd], each value rotated by RoPE at position pos0 + t
// first (kmath's pair (d, d + hd / 2), as sp_cuda_rope_fwd) when inv_freq; zeros for d >= hd.
__global__ void pack_rope_kernel(bf16 *dst, const float *src, const float *inv_freq, int pos0, int heads, int T, int hd,
                                 int HD, long n8)
{
    SPK_GRID_LOOP(i, n8)
    {
        long e = i * 8, r = e / HD;
        int d0 = (int)(e % HD), t = (int)(r % T), head = (int)(r / T % heads), b = (int)(r / T / heads), half = hd / 2;
        const float *x = src + ((long)b * T + t) * heads * hd + (long)head * hd;
        union {
            uint4 u;
            bf16 h[8];
        } v;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            int d = d0 + k;
            float y = 0.0f;
            if (d < hd && !inv_freq) {
                y = x[d];
            } else if (d < hd) {
                int j = d < half ? d : d - half;
                float a = sp_km_rope_angle(pos0 + t, inv_freq[j]), y1, y2;
                sp_km_rope_fwd(&y1, &y2, x[j], x[j + half], cosf(a), sinf(a));
                y = d < half ? y1 : y2;
            }
            v.h[k] = __float2bfloat16_rn(y);
        }
        *reinterpret_cast<uint4 *>(dst + e) = v.u;
    }
}

// D[b, h, t] = sum_d dout * out over row (b, t, h) of [B, T, nh, hd]: a warp a row.
__global__ void dsum_kernel(float *D, const float *dout, const float *out, int T, int nh, int hd, long rows)
{
    long w = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5, nw = ((long)gridDim.x * blockDim.x) >> 5;
    int lane = threadIdx.x & 31;
    for (long r = w; r < rows; r += nw) {
        const float *g = dout + r * hd, *o = out + r * hd;
        float s = 0.0f;
        for (int d = lane; d < hd; d += 32)
            s += g[d] * o[d];
        for (int k = 16; k > 0; k >>= 1)
            s += __shfl_xor_sync(0xffffffffu, s, k);
        if (lane == 0) {
            long bt = r / nh;
            int h = (int)(r % nh), b = (int)(bt / T), t = (int)(bt % T);
            D[((long)b * nh + h) * T + t] = s;
        }
    }
}

// dk[b, s, kvh, d] (+)= sum over kvh's G query heads of scr[b, s, kvh * G + g, d] (scr [B, S, nh, hd]); dk rows
// kv_rs apart, batches kv_bs.
__global__ void gqa_sum_kernel(float *dk, const float *scr, long kv_bs, long kv_rs, int S, int nkv, int G, int hd,
                               int acc, long n)
{
    SPK_GRID_LOOP(i, n)
    {
        int d = (int)(i % hd);
        long r = i / hd;
        int kvh = (int)(r % nkv), s = (int)(r / nkv % S), b = (int)(r / nkv / S);
        const float *x = scr + (((long)b * S + s) * nkv * G + (long)kvh * G) * hd + d;
        float sum = 0.0f;
        for (int g = 0; g < G; g++)
            sum += x[(long)g * hd];
        float *o = dk + b * kv_bs + s * kv_rs + (long)kvh * hd + d;
        *o = acc ? *o + sum : sum;
    }
}

// ---------------------------------------------------------------------------------------------------------------
// host side

size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

int padded(int hd) { return hd <= 64 ? 64 : 128; }

// The shared bytes of a kernel of `tiles` tiles (and extra bytes), raised past the 48 KB default once per kernel.
template <typename K> sp_status smem_for(K kernel, int HD, int tiles, size_t extra, size_t *bytes, sp_err *err)
{
    *bytes = (size_t)tiles * kRows * (HD + 8) * sizeof(bf16) + extra;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)*bytes);
    return sp_cuda_error(err, (int)e, "flash attention: shared memory");
}

// Packs src (rows of `heads` heads of hd, batches bs apart, positions rs apart) to [B, heads, L, HD] bf16.
sp_status pack(sp_cuda *cu, bf16 *dst, const float *src, long bs, long rs, int B, int heads, int L, int hd, int HD,
               sp_err *err)
{
    long n8 = (long)B * heads * L * HD / 8;
    pack_kernel<<<spk::grid_for(n8), spk::kThreads, 0, spk::stream_of(cu)>>>(dst, src, bs, rs, heads, L, hd, HD, n8);
    return spk::launched(err, "flash attention: packing");
}

bool shape_ok(int B, int T, int past, int nh, int nkv, int hd, int cap)
{
    return B > 0 && T > 0 && past >= 0 && nh > 0 && nkv > 0 && nh % nkv == 0 && sp_cuda_flash_ok(hd) &&
           past + T <= cap && past + T <= 65535 * kRows;
}

sp_status bad_shape(sp_err *err, const char *what, int B, int T, int past, int nh, int nkv, int hd, int cap)
{
    return sp_errf(err, SP_ERR_ARG, "%s: bad shape B %d T %d past %d heads %d/%d head dim %d of %d", what, B, T, past,
                   nh, nkv, hd, cap);
}

// The common parameters over packed q, k, v.
fparams params(const bf16 *qh, const bf16 *kh, const bf16 *vh, const float *slopes, int T, int past, int nh, int nkv,
               int hd)
{
    fparams p = {};
    p.q = qh, p.k = kh, p.v = vh, p.slopes = slopes;
    p.T = T, p.past = past, p.S = past + T, p.nh = nh, p.nkv = nkv, p.hd = hd;
    p.scale = 1.0f / sqrtf((float)hd);
    p.sl2 = p.scale * kLog2e;
    return p;
}

// The common parameters, and q, k, v packed at the start of the workspace (ws: room for `extra` bytes after).
sp_status prepare(sp_cuda *cu, fparams *p, const float *q, const float *kc, const float *vc, const float *slopes,
                  int B, int T, int past, int nh, int nkv, int hd, int cap, size_t extra, char **rest, sp_err *err)
{
    int HD = padded(hd), S = past + T;
    size_t nq = align256((size_t)B * nh * T * HD * 2), nk = align256((size_t)B * nkv * S * HD * 2);
    void *ws = NULL;
    sp_status st = sp_cuda_workspace(cu, nq + 2 * nk + extra, &ws, err);
    if (st != SP_OK)
        return st;
    bf16 *qh = (bf16 *)ws, *kh = (bf16 *)((char *)ws + nq), *vh = (bf16 *)((char *)ws + nq + nk);
    *rest = (char *)ws + nq + 2 * nk;
    *p = params(qh, kh, vh, slopes, T, past, nh, nkv, hd);
    long ldq = (long)nh * hd, ldk = (long)nkv * hd;
    st = pack(cu, qh, q, T * ldq, ldq, B, nh, T, hd, HD, err);
    if (st == SP_OK)
        st = pack(cu, kh, kc, cap * ldk, ldk, B, nkv, S, hd, HD, err);
    return st == SP_OK ? pack(cu, vh, vc, cap * ldk, ldk, B, nkv, S, hd, HD, err) : st;
}

template <int HD> sp_status launch_fwd(sp_cuda *cu, const fparams &p, int B, sp_err *err)
{
    size_t smem = 0;
    sp_status st = smem_for(fwd_kernel<HD>, HD, 3, 0, &smem, err);
    if (st != SP_OK)
        return st;
    dim3 grid((unsigned)(B * p.nh), (unsigned)((p.T + kRows - 1) / kRows));
    fwd_kernel<HD><<<grid, kThreads, smem, spk::stream_of(cu)>>>(p);
    return spk::launched(err, "flash attention");
}

// Which backward kernels run pipelined, and dq's source (sp_cuda_flash_set_pipeline); -1: not chosen yet.
int g_pipe = -1;

// The most workspace the stored dS^T tiles may take (else dq recomputes the scores): 7B's 32 heads at 1024 tokens
// take 64 MB, 70B's 64 heads 128 MB.
constexpr size_t kMaxStoredDs = (size_t)256 << 20;

int pipe_mask()
{
    if (g_pipe < 0) {
        const char *e = getenv("SEPAL_FLASH_PIPE");
        g_pipe = e && *e ? atoi(e) & 7 : SP_CUDA_FLASH_PIPE_DEFAULT;
    }
    return g_pipe;
}

// 1 when two blocks of `bytes` of shared memory fit on one of the device's SMs (what a pipelined kernel needs to
// keep the occupancy of the plain one's registers). The device's figure asked once (devices 0 .. 15).
bool two_fit(size_t bytes)
{
    static int per_sm[16]; // 0: not asked yet; -1: unknown
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 16) {
        cudaGetLastError();
        return false;
    }
    int v = __atomic_load_n(&per_sm[dev], __ATOMIC_RELAXED);
    if (!v) {
        if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess || v <= 0) {
            cudaGetLastError();
            v = -1;
        }
        __atomic_store_n(&per_sm[dev], v, __ATOMIC_RELAXED);
    }
    return v > 0 && (size_t)v >= 2 * (bytes + 1024); // the runtime reserves 1 KB a block
}

template <int HD, bool PIPE> sp_status launch_dq(sp_cuda *cu, const fparams &p, int B, sp_err *err)
{
    size_t bytes = 0;
    sp_status st = smem_for(dq_kernel<HD, PIPE>, HD, PIPE ? 6 : 4, 0, &bytes, err);
    if (st != SP_OK)
        return st;
    dim3 grid((unsigned)(B * p.nh), (unsigned)((p.T + kRows - 1) / kRows));
    dq_kernel<HD, PIPE><<<grid, kThreads, bytes, spk::stream_of(cu)>>>(p);
    return spk::launched(err, "flash attention backward (dq)");
}

template <int HD, bool PIPE, bool DS> sp_status launch_dkv(sp_cuda *cu, const fparams &p, int B, sp_err *err)
{
    size_t bytes = 0;
    sp_status st = smem_for(dkv_kernel<HD, PIPE, DS>, HD, PIPE ? 6 : 4, (PIPE ? 4 : 2) * kRows * sizeof(float),
                            &bytes, err);
    if (st != SP_OK)
        return st;
    dim3 grid((unsigned)(B * p.nh), (unsigned)((p.S + kRows - 1) / kRows));
    dkv_kernel<HD, PIPE, DS><<<grid, kThreads, bytes, spk::stream_of(cu)>>>(p);
    return spk::launched(err, "flash attention backward (dk, dv)");
}

template <int HD> sp_status launch_dq_ds(sp_cuda *cu, const fparams &p, int B, sp_err *err)
{
    size_t bytes = (size_t)2 * kRows * (HD + 8) * sizeof(bf16) + (size_t)2 * kRows * (kRows + 8) * sizeof(bf16);
    cudaError_t e = cudaFuncSetAttribute(dq_ds_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    sp_status st = sp_cuda_error(err, (int)e, "flash attention: shared memory");
    if (st != SP_OK)
        return st;
    dim3 grid((unsigned)(B * p.nh), (unsigned)((p.T + kRows - 1) / kRows));
    dq_ds_kernel<HD><<<grid, kThreads, bytes, spk::stream_of(cu)>>>(p);
    return spk::launched(err, "flash attention backward (dq from dS)");
}

// The backward's kernels by mask (p.ds set: dq from the stored dS^T tiles, after dk / dv).
template <int HD> sp_status launch_bwd(sp_cuda *cu, const fparams &p, int B, int mask, sp_err *err)
{
    size_t six = (size_t)6 * kRows * (HD + 8) * sizeof(bf16) + 4 * kRows * sizeof(float);
    bool fits = (mask & 3) && two_fit(six), pk = fits && (mask & SP_CUDA_FLASH_PIPE_DKV);
    if (p.ds) {
        sp_status st = pk ? launch_dkv<HD, true, true>(cu, p, B, err) : launch_dkv<HD, false, true>(cu, p, B, err);
        return st != SP_OK ? st : launch_dq_ds<HD>(cu, p, B, err);
    }
    sp_status st = fits && (mask & SP_CUDA_FLASH_PIPE_DQ) ? launch_dq<HD, true>(cu, p, B, err)
                                                          : launch_dq<HD, false>(cu, p, B, err);
    if (st != SP_OK)
        return st;
    return pk ? launch_dkv<HD, true, false>(cu, p, B, err) : launch_dkv<HD, false, false>(cu, p, B, err);
}

// The backward's workspace after the operands: dout packed, D, GQA's per-query-head scratch, the stored dS tiles.
struct bwd_ws {
    size_t ndo, nd, nscr, nds;
    size_t total() const { return ndo + nd + 2 * nscr + nds; }
};

bwd_ws bwd_sizes(int B, int T, int S, int nh, int nkv, int hd, int mask)
{
    bwd_ws w;
    w.ndo = align256((size_t)B * nh * T * padded(hd) * 2), w.nd = align256((size_t)B * nh * T * sizeof(float));
    w.nscr = nh > nkv ? align256((size_t)B * S * nh * hd * sizeof(float)) : 0;
    w.nds = (size_t)B * nh * ((T + kRows - 1) / kRows) * ((S + kRows - 1) / kRows) * kRows * kRows * 2;
    if (!(mask & SP_CUDA_FLASH_DQ_STORED) || w.nds > kMaxStoredDs)
        w.nds = 0; // dq recomputes the scores
    return w;
}

// The backward over p's packed operands with its workspace at rest (bwd_sizes' w).
sp_status bwd_run(sp_cuda *cu, fparams p, const bwd_ws &w, char *rest, float *dq, float *dk, float *dv,
                  const float *dout, const float *out, const float *lse, int B, int cap, int acc, int mask,
                  sp_err *err)
{
    int T = p.T, S = p.S, nh = p.nh, nkv = p.nkv, hd = p.hd, HD = padded(hd), G = nh / nkv;
    bf16 *doh = (bf16 *)rest;
    float *D = (float *)(rest + w.ndo), *sk = (float *)(rest + w.ndo + w.nd);
    float *sv = (float *)(rest + w.ndo + w.nd + w.nscr);
    long ldq = (long)nh * hd, ldk = (long)nkv * hd, rows = (long)B * T * nh;
    cudaStream_t s = spk::stream_of(cu);
    sp_status st = pack(cu, doh, dout, T * ldq, ldq, B, nh, T, hd, HD, err);
    if (st != SP_OK)
        return st;
    dsum_kernel<<<spk::grid_for(rows * 32), spk::kThreads, 0, s>>>(D, dout, out, T, nh, hd, rows);
    p.dout = doh, p.lse = (float *)lse, p.D = D, p.dq = dq;
    p.ds = w.nds ? (bf16 *)(rest + w.ndo + w.nd + 2 * w.nscr) : NULL;
    p.acc = acc != 0, p.kv_acc = G > 1 ? 0 : acc != 0; // GQA: each query head's into scratch, every row written
    p.dk = G > 1 ? sk : dk, p.dv = G > 1 ? sv : dv;
    p.kv_bs = G > 1 ? (long)S * ldq : (long)cap * ldk, p.kv_rs = G > 1 ? ldq : ldk;
    st = HD == 64 ? launch_bwd<64>(cu, p, B, mask, err) : launch_bwd<128>(cu, p, B, mask, err);
    if (st != SP_OK || G == 1)
        return st;
    long n = (long)B * S * ldk;
    int a = acc != 0;
    gqa_sum_kernel<<<spk::grid_for(n), spk::kThreads, 0, s>>>(dk, sk, (long)cap * ldk, ldk, S, nkv, G, hd, a, n);
    gqa_sum_kernel<<<spk::grid_for(n), spk::kThreads, 0, s>>>(dv, sv, (long)cap * ldk, ldk, S, nkv, G, hd, a, n);
    return spk::launched(err, "flash attention backward: kv heads");
}

} // namespace

extern "C" int sp_cuda_flash_ok(int hd) { return hd >= 1 && hd <= 128; }

extern "C" sp_status sp_cuda_flash_fwd(sp_cuda *cu, float *out, void *outh, float *lse, const float *q,
                                       const float *kc, const float *vc, const float *slopes, int B, int T, int past,
                                       int nh, int nkv, int hd, int cap, sp_err *err)
{
    if (!shape_ok(B, T, past, nh, nkv, hd, cap))
        return bad_shape(err, "flash attention", B, T, past, nh, nkv, hd, cap);
    fparams p;
    char *rest = NULL;
    sp_status st = prepare(cu, &p, q, kc, vc, slopes, B, T, past, nh, nkv, hd, cap, 0, &rest, err);
    if (st != SP_OK)
        return st;
    p.out = out, p.outh = (bf16 *)outh, p.lse = lse;
    return padded(hd) == 64 ? launch_fwd<64>(cu, p, B, err) : launch_fwd<128>(cu, p, B, err);
}

extern "C" void sp_cuda_flash_set_pipeline(int mask) { g_pipe = mask < 0 ? -1 : mask & 7; }

extern "C" int sp_cuda_flash_pipeline(void) { return pipe_mask(); }

extern "C" sp_status sp_cuda_flash_bwd(sp_cuda *cu, float *dq, float *dk, float *dv, const float *dout,
                                       const float *out, const float *lse, const float *q, const float *kc,
                                       const float *vc, const float *slopes, int B, int T, int past, int nh, int nkv,
                                       int hd, int cap, int acc, sp_err *err)
{
    if (!shape_ok(B, T, past, nh, nkv, hd, cap) || !dq || !dk || !dv)
        return bad_shape(err, "flash attention backward", B, T, past, nh, nkv, hd, cap);
    int mask = pipe_mask();
    bwd_ws w = bwd_sizes(B, T, past + T, nh, nkv, hd, mask);
    fparams p;
    char *rest = NULL;
    sp_status st = prepare(cu, &p, q, kc, vc, slopes, B, T, past, nh, nkv, hd, cap, w.total(), &rest, err);
    if (st != SP_OK)
        return st;
    return bwd_run(cu, p, w, rest, dq, dk, dv, dout, out, lse, B, cap, acc, mask, err);
}

extern "C" size_t sp_cuda_flash_packed_bytes(int B, int T, int nh, int nkv, int hd)
{
    int HD = padded(hd);
    return align256((size_t)B * nh * T * HD * 2) + 2 * align256((size_t)B * nkv * T * HD * 2);
}

// The packed operands' places in one buffer of sp_cuda_flash_packed_bytes.
static void packed_parts(void *buf, int B, int T, int nh, int nkv, int hd, bf16 **qh, bf16 **kh, bf16 **vh)
{
    int HD = padded(hd);
    size_t nq = align256((size_t)B * nh * T * HD * 2), nk = align256((size_t)B * nkv * T * HD * 2);
    *qh = (bf16 *)buf, *kh = (bf16 *)((char *)buf + nq), *vh = (bf16 *)((char *)buf + nq + nk);
}

extern "C" sp_status sp_cuda_flash_pack(sp_cuda *cu, void *packed, const float *q, const float *k, const float *v,
                                        const float *inv_freq, int pos0, int B, int T, int nh, int nkv, int hd,
                                        sp_err *err)
{
    if (!shape_ok(B, T, 0, nh, nkv, hd, T) || !packed || pos0 < 0 || (inv_freq && hd % 2))
        return bad_shape(err, "flash attention: packing", B, T, 0, nh, nkv, hd, T);
    bf16 *qh, *kh, *vh;
    packed_parts(packed, B, T, nh, nkv, hd, &qh, &kh, &vh);
    int HD = padded(hd);
    long nq8 = (long)B * nh * T * HD / 8, nk8 = (long)B * nkv * T * HD / 8;
    cudaStream_t s = spk::stream_of(cu);
    pack_rope_kernel<<<spk::grid_for(nq8), spk::kThreads, 0, s>>>(qh, q, inv_freq, pos0, nh, T, hd, HD, nq8);
    pack_rope_kernel<<<spk::grid_for(nk8), spk::kThreads, 0, s>>>(kh, k, inv_freq, pos0, nkv, T, hd, HD, nk8);
    pack_rope_kernel<<<spk::grid_for(nk8), spk::kThreads, 0, s>>>(vh, v, NULL, 0, nkv, T, hd, HD, nk8);
    return spk::launched(err, "flash attention: packing");
}

extern "C" sp_status sp_cuda_flash_fwd_packed(sp_cuda *cu, float *out, void *outh, float *lse, const void *packed,
                                              const float *slopes, int B, int T, int nh, int nkv, int hd, sp_err *err)
{
    if (!shape_ok(B, T, 0, nh, nkv, hd, T) || !packed)
        return bad_shape(err, "flash attention", B, T, 0, nh, nkv, hd, T);
    bf16 *qh, *kh, *vh;
    packed_parts((void *)packed, B, T, nh, nkv, hd, &qh, &kh, &vh);
    fparams p = params(qh, kh, vh, slopes, T, 0, nh, nkv, hd);
    p.out = out, p.outh = (bf16 *)outh, p.lse = lse;
    return padded(hd) == 64 ? launch_fwd<64>(cu, p, B, err) : launch_fwd<128>(cu, p, B, err);
}

extern "C" sp_status sp_cuda_flash_bwd_packed(sp_cuda *cu, float *dq, float *dk, float *dv, const float *dout,
                                              const float *out, const float *lse, const void *packed,
                                              const float *slopes, int B, int T, int nh, int nkv, int hd, int acc,
                                              sp_err *err)
{
    if (!shape_ok(B, T, 0, nh, nkv, hd, T) || !packed || !dq || !dk || !dv)
        return bad_shape(err, "flash attention backward", B, T, 0, nh, nkv, hd, T);
    int mask = pipe_mask();
    bwd_ws w = bwd_sizes(B, T, T, nh, nkv, hd, mask);
    void *ws = NULL;
    sp_status st = sp_cuda_workspace(cu, w.total(), &ws, err);
    if (st != SP_OK)
        return st;
    bf16 *qh, *kh, *vh;
    packed_parts((void *)packed, B, T, nh, nkv, hd, &qh, &kh, &vh);
    fparams p = params(qh, kh, vh, slopes, T, 0, nh, nkv, hd);
    return bwd_run(cu, p, w, (char *)ws, dq, dk, dv, dout, out, lse, B, T, acc, mask, err);
}
