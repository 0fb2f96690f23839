// weights.cu - weight matrices on the device (kernels.h): upload in their encodings, decode (to f32 or bf16), and
// the products with them. Up to 8 rows of X: a fused decode kernel that streams W once in 16-byte loads (kmath.h's
// chunks; rows of odd widths one weight a thread). More rows: bf16 GEMMs with fp32 accumulation (cuBLAS) on bf16
// weights or on tiles of int8 / NF4 rows decoded to bf16 (up to 32 rows of int8 / NF4: passes of the fused
// kernel), f32 weights an f32 GEMM; the same for the transposed product of a backward to the input. The experts of
// a decode step (moe.cu) run the fused kernel's body too, each expert's matrix chosen on the device.
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>

#include "gemm.h"
#include "kernels.h"
#include "launch.cuh"

using spk::block_sum;

namespace {

__global__ void dequant_kernel(float *out, sp_km_w w, int r0, long n)
{
    SPK_GRID_LOOP(e, n)
    out[e] = sp_km_w_at(&w, r0 + (int)(e / w.cols), (int)(e % w.cols));
}

__global__ void dequant_bf16_kernel(__nv_bfloat16 *out, sp_km_w w, int r0, long n)
{
    SPK_GRID_LOOP(e, n)
    out[e] = __float2bfloat16_rn(sp_km_w_at(&w, r0 + (int)(e / w.cols), (int)(e % w.cols)));
}

// What one launch of the decode products computes (sp_cuda_dmul, as the kernels take it): up to three matrices of
// one encoding and width over the same X, their blocks one segment after another (first: each segment's first
// block; a segment its values, scales, rows, output and warps a row), w the encoding, width and NF4's levels.
// swiglu: segment 0 the gate and q[1] / scale[1] the up projection of the same rows, y[0] = swiglu(gate, up).
// bias [rows] and res [B, rows] (one segment; NULL: none) added to the sums in block.c's order.
struct dec_args {
    sp_km_w w;
    const void *q[3];
    const float *scale[3];
    int rows[3], ks[3], first[3];
    float *y[3];
    int nseg, swiglu, evict_first;
    const float *bias, *res;
    int *pos, npos; // advanced by one each, by block 0 after its wait (sp_cuda_dmul)
};

// a.pos[i] += 1 for i < a.npos, by block 0 once the kernel before it is done (after its pdl_wait).
__device__ __forceinline__ void advance_pos(const dec_args &a)
{
    if (a.pos && blockIdx.x == 0 && blockIdx.y == 0 && (int)threadIdx.x < a.npos)
        a.pos[threadIdx.x] += 1;
}

template <typename T> __device__ __forceinline__ T pick(int s, T a, T b, T c) { return s == 0 ? a : s == 1 ? b : c; }

// The segment of block blk, and the block's index inside it (*local).
__device__ __forceinline__ int dec_seg(const dec_args &a, int blk, int *local)
{
    int s = (a.nseg > 1 && blk >= a.first[1]) + (a.nseg > 2 && blk >= a.first[2]);
    *local = blk - pick(s, 0, a.first[1], a.first[2]);
    return s;
}

// Row r of output row b as stored: (sum + bias) + res, lin's bias first, then the residual.
__device__ __forceinline__ float dec_epilogue(const dec_args &a, float y, int b, int r, int rows)
{
    if (a.bias)
        y += a.bias[r];
    if (a.res)
        y += a.res[(long)b * rows + r];
    return y;
}

// Decode product of matrices of odd widths: block r of its segment computes Y[b, r] for every b < B (swiglu: the
// gate's and the up projection's row r). One instance per encoding: with w.type a constant, sp_km_w_at's switch
// folds away and the inner loop is the encoding's own.
template <int TYPE> __global__ void wmat_dot_kernel(dec_args a, const float *X, int B)
{
    __shared__ float sh[SP_KM_MAX_THREADS];
    int tid = threadIdx.x, nt = blockDim.x, r;
    spk::pdl_trigger();
    spk::pdl_wait();
    advance_pos(a);
    int s = dec_seg(a, blockIdx.x, &r);
    sp_km_w w = a.w, u = a.w;
    w.type = u.type = TYPE;
    w.q = pick(s, a.q[0], a.q[1], a.q[2]), w.scale = pick(s, a.scale[0], a.scale[1], a.scale[2]);
    w.rows = pick(s, a.rows[0], a.rows[1], a.rows[2]);
    u.q = a.q[1], u.scale = a.scale[1];
    float *Y = pick(s, a.y[0], a.y[1], a.y[2]);
    for (int b = 0; b < B; b++) {
        const float *x = X + (long)b * w.cols;
        float y = block_sum(sp_km_w_dot_part(&w, r, x, tid, nt), sh);
        if (a.swiglu)
            y = sp_km_swiglu(y, block_sum(sp_km_w_dot_part(&u, r, x, tid, nt), sh));
        if (tid == 0)
            Y[(long)b * w.rows + r] = dec_epilogue(a, y, b, r, w.rows);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The vectorised decode product (kmath.h's chunks). A block of kDecWarps warps; ks consecutive warps share R rows
// (warp part k of a group reads chunks k * 32 + lane, then every 32 ks), each lane holding R x NB sums. A chunk's
// 16 bytes of each of the R rows are loaded once (bypassing L1, so that X stays there) one chunk ahead, decoded
// once, and multiplied with the NB rows of X (NB >= B; rows of X past B are skipped). The first chunk is asked for
// before the kernel waits for the one before it (pdl_wait: X is that one's output). With evict_first, W's lines
// are the first L2 gives up, so that the KV caches and activations of a decode step stay there while its weights
// stream through (on an H200, 7B's bf16 step 0.68 of copy instead of 0.59 at the same shape, 70B's 0.95 instead of
// 0.87; asking L2 for the next two chunks before the wait cost 2 to 15 us a step at every shape: not done).

constexpr int kDecWarps = 4;

// Whether chunk_product has a LIGHT form for TYPE and NB rows of X (int8 and NF4, one row).
constexpr bool light_able(int type, int nb) { return nb == 1 && (type == SP_KM_Q8 || type == SP_KM_NF4); }

// NF4's levels into shared memory (the parameter indexed by a variable would be copied to local memory).
__device__ __forceinline__ void fill_lut(float *lut, const sp_km_w &w)
{
    if (threadIdx.x == 0)
#pragma unroll
        for (int i = 0; i < 16; i++)
            lut[i] = w.levels[i];
    __syncthreads();
}

// An L2 policy for streamed weights: evict first, or normal.
__device__ __forceinline__ uint64_t stream_policy(int evict_first)
{
    uint64_t pol = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (evict_first)
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    else
        asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(pol));
#endif
    return pol;
}

// ld_stream under an L2 policy (stream_policy).
__device__ __forceinline__ uint4 ld_stream_pol(const uint8_t *p, uint64_t pol)
{
    uint4 v;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p), "l"(pol));
#else
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
#endif
    return v;
}

__device__ __forceinline__ uint4 ld_stream(const uint8_t *p)
{
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// Chunk j of each of the R rows (zeros, and a zero scale, past the row's end) and its block's scale; ONE_BRANCH: the
// R loads under one branch (the experts' kernel), else each one predicated (the dense kernel's, as measured).
template <int R, bool SCALED, bool ONE_BRANCH>
__device__ __forceinline__ void load_chunks(uint4 (&q)[R], float (&sc)[R], const uint8_t *const (&row)[R],
                                            const float *const (&srow)[R], int j, int nchunks, uint64_t pol)
{
    if (!ONE_BRANCH) {
        bool in = j < nchunks;
#pragma unroll
        for (int r = 0; r < R; r++) {
            q[r] = in ? ld_stream_pol(row[r] + (long)j * SP_KM_CHUNK, pol) : make_uint4(0, 0, 0, 0);
            sc[r] = SCALED && in ? srow[r][sp_km_chunk_block(j)] : 0.0f;
        }
    } else if (j < nchunks) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            q[r] = ld_stream_pol(row[r] + (long)j * SP_KM_CHUNK, pol);
            sc[r] = SCALED ? srow[r][sp_km_chunk_block(j)] : 0.0f;
        }
    } else {
#pragma unroll
        for (int r = 0; r < R; r++)
            q[r] = make_uint4(0, 0, 0, 0), sc[r] = 0.0f;
    }
}

// xs = the PV values of X at x (16-byte aligned), by 16-byte loads through the read-only cache.
template <int PV> __device__ __forceinline__ void load_x(float (&xs)[PV], const float *x)
{
    const float4 *xp = reinterpret_cast<const float4 *>(x);
#pragma unroll
    for (int i = 0; i < PV / 4; i++) {
        float4 x4 = __ldg(xp + i);
        xs[4 * i] = x4.x, xs[4 * i + 1] = x4.y, xs[4 * i + 2] = x4.z, xs[4 * i + 3] = x4.w;
    }
}

// acc[r][b] += chunk j of row r times row b of X (b < B), a piece at a time: the R rows decoded once, each X load
// serving all R of them. LIGHT (int8 and NF4, one row of X): each value decoded as its product takes it.
template <int TYPE, int NB, int R, bool LIGHT>
__device__ __forceinline__ void chunk_product(float (&acc)[R][NB], const uint4 (&q)[R], const float (&sc)[R],
                                              const float *X, int cols, int j, int B, const float *lut)
{
    constexpr int PV = TYPE == SP_KM_NF4 || TYPE == SP_KM_Q8 ? 16 : TYPE == SP_KM_BF16 || TYPE == SP_KM_F16 ? 8 : 4;
    constexpr int NP = TYPE == SP_KM_NF4 ? 2 : 1;                                                     // pieces
    if constexpr (LIGHT) {
        // One row of X: a row's values decoded as its product takes them (the same sp_km_piece_dot, so the same
        // bits), instead of all R x PV decoded first, which ptxas held in registers: at R 4
        // int8 95 and NF4 158 a thread (three NF4 blocks an SM; bf16 56), 80 and 72 this way (sm_90, nvcc 13).
#pragma unroll
        for (int p = 0; p < NP; p++) {
            float xs[PV];
            load_x(xs, X + sp_km_piece_col(TYPE, j, p));
#pragma unroll
            for (int r = 0; r < R; r++) {
                uint32_t v[4] = {q[r].x, q[r].y, q[r].z, q[r].w};
                float wv[PV];
#pragma unroll
                for (int t = 0; t < PV; t++)
                    wv[t] = sp_km_piece_val(TYPE, v, p, t, lut);
                acc[r][0] += sp_km_piece_dot(TYPE, wv, xs, PV, sc[r]);
            }
        }
    } else {
#pragma unroll
        for (int p = 0; p < NP; p++) {
            float wv[R][PV];
#pragma unroll
            for (int r = 0; r < R; r++) {
                uint32_t v[4] = {q[r].x, q[r].y, q[r].z, q[r].w};
#pragma unroll
                for (int t = 0; t < PV; t++)
                    wv[r][t] = sp_km_piece_val(TYPE, v, p, t, lut);
            }
            int col = sp_km_piece_col(TYPE, j, p);
#pragma unroll
            for (int b = 0; b < NB; b++) {
                if (b >= B)
                    break;
                float xs[PV];
                load_x(xs, X + (long)b * cols + col);
#pragma unroll
                for (int r = 0; r < R; r++)
                    acc[r][b] += sp_km_piece_dot(TYPE, wv[r], xs, PV, sc[r]);
            }
        }
    }
}

// The lanes' sums by the butterfly, then the ks warps of the group in order (kmath.h): Y[b, r0 + r] for b < B, r <
// ro (R; swiglu: R / 2, rows ro + r the up projection's) and rows inside the matrix; with swiglu, the gate's and the
// up projection's sums also into G and U where given (moe.cu's activations for a backward). part: kDecWarps x R NB
// floats of shared memory.
template <int NB, int R>
__device__ __forceinline__ void reduce_store(const dec_args &a, float *Y, float *G, float *U, float (&acc)[R][NB],
                                             float (*part)[R * NB], int rows, int r0, int ro, int B, int ks)
{
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group = warp / ks, k = warp % ks;
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int b = 0; b < NB; b++) {
            float v = acc[r][b];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0)
                part[warp][r * NB + b] = v;
        }
    __syncthreads();
    for (int i = lane; k == 0 && i < ro * NB; i += 32) {
        int r = i / NB, b = i % NB;
        if (b >= B || r0 + r >= rows)
            continue;
        float y = 0.0f;
        for (int p = 0; p < ks; p++)
            y += part[group * ks + p][i];
        if (a.swiglu) {
            float u = 0.0f;
            for (int p = 0; p < ks; p++)
                u += part[group * ks + p][i + ro * NB];
            if (G)
                G[(long)b * rows + r0 + r] = y;
            if (U)
                U[(long)b * rows + r0 + r] = u;
            y = sp_km_swiglu(y, u);
        }
        Y[(long)b * rows + r0 + r] = dec_epilogue(a, y, b, r0 + r, rows);
    }
}

// Where a block's sums go (reduce_store's Y, G, U).
struct vec_out {
    float *Y, *G, *U;
};

// One block's rows of the vectorised product (blk: its index among the matrix's blocks): rows of q (scales sq)
// [rows, a.w.cols] (swiglu: with those of the up projection uq, usq) times X [B, cols] into out()'s Y [B, rows] (G,
// U: reduce_store), out called after the loop over the chunks. lut: NF4's levels (fill_lut), part: reduce_store's.
// Shared by the dense products' kernel and the experts' (wmat_slot_kernel), which differ only in where a block's
// matrix, X and Y are. (out, and load_chunks' ONE_BRANCH for the experts, are what left ptxas 13 for sm_90 no
// spills in any instance of the experts' kernel and the dense one's registers within 2 of what they were before it
// shared this body (with 4 to 12 bytes of spills at NF4 / 2 rows of X / R 1 as before, and at bf16 / 2 / R 4 where
// NF4 / 4 / R 2 had them); other ways of writing the same moved spills of 4 to 16 bytes between instances, or took
// the dense f32 and bf16 instances of R 4 up to 14 registers more.)
template <int TYPE, int NB, int R, bool ONE_BRANCH, bool LIGHT, typename OUT>
__device__ __forceinline__ void vec_rows(const dec_args &a, const uint8_t *q, const float *sq, const uint8_t *uq,
                                         const float *usq, int rows, int ks, int blk, const float *X, int B,
                                         const float *lut, float (*part)[R * NB], OUT out)
{
    constexpr bool scaled = TYPE == SP_KM_Q8 || TYPE == SP_KM_NF4;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group = warp / ks, k = warp % ks;
    int ro = a.swiglu ? R / 2 : R, r0 = (blk * (kDecWarps / ks) + group) * ro;
    sp_km_w shape = {};
    shape.type = TYPE, shape.cols = a.w.cols;
    long rb = sp_km_row_bytes(&shape);
    int nchunks = (int)(rb / SP_KM_CHUNK), ns = sp_km_row_scales(&shape), step = 32 * ks;
    const uint8_t *row[R];
    const float *srow[R];
#pragma unroll
    for (int r = 0; r < R; r++) { // rows past the end read the last one; their sums are not written
        bool up = a.swiglu && r >= ro;
        int rr = min(r0 + (up ? r - ro : r), rows - 1);
        row[r] = (up ? uq : q) + (long)rr * rb;
        srow[r] = scaled ? (up ? usq : sq) + (long)rr * ns : nullptr;
    }
    float acc[R][NB];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int b = 0; b < NB; b++)
            acc[r][b] = 0.0f;
    uint4 cur[R], nxt[R];
    float sc[R], nsc[R];
    int j = k * 32 + lane;
    uint64_t pol = stream_policy(a.evict_first);
    load_chunks<R, scaled, ONE_BRANCH>(cur, sc, row, srow, j, nchunks, pol);
    spk::pdl_wait();
    for (; j < nchunks; j += step) {
        load_chunks<R, scaled, ONE_BRANCH>(nxt, nsc, row, srow, j + step, nchunks, pol); // a chunk ahead
        chunk_product<TYPE, NB, R, LIGHT>(acc, cur, sc, X, a.w.cols, j, B, lut);
#pragma unroll
        for (int r = 0; r < R; r++)
            cur[r] = nxt[r], sc[r] = nsc[r];
    }
    vec_out o = out();
    reduce_store<NB, R>(a, o.Y, o.G, o.U, acc, part, rows, r0, ro, B, ks);
}

template <int TYPE, int NB, int R, bool LIGHT>
__global__ void __launch_bounds__(kDecWarps * 32) wmat_vec_kernel(dec_args a, const float *X, int B)
{
    __shared__ float lut[16];
    __shared__ float part[kDecWarps][R * NB];
    spk::pdl_trigger();
    if (TYPE == SP_KM_NF4)
        fill_lut(lut, a.w);
    if (a.pos && blockIdx.x == 0) { // block 0 waits at once (vec_rows' own wait then passes)
        spk::pdl_wait();
        advance_pos(a);
    }
    int blk, s = dec_seg(a, blockIdx.x, &blk);
    vec_rows<TYPE, NB, R, false, LIGHT>(
        a, (const uint8_t *)pick(s, a.q[0], a.q[1], a.q[2]), pick(s, a.scale[0], a.scale[1], a.scale[2]),
        (const uint8_t *)a.q[1], a.scale[1], pick(s, a.rows[0], a.rows[1], a.rows[2]),
        pick(s, a.ks[0], a.ks[1], a.ks[2]), blk, X, B, lut, part,
        [&] { return vec_out{pick(s, a.y[0], a.y[1], a.y[2]), nullptr, nullptr}; });
}

// The experts' decode products (sp_cuda_wmat_mul_slots): what an expert's matrix is chosen by, on the device.
struct slot_args {
    const sp_km_w *tab;        // the experts' matrices: expert e's `which` at tab[3 e + which], its up at + 1
    const int32_t *used, *off; // the g-th expert with rows (-1: none), each expert's first row of X and Y
    int which;
    float *G, *U; // swiglu: the gate's and the up projection's sums (NULL: not kept)
};

// Block (x, g): block x of the matrix of the g-th expert with rows (none: the block returns), over its rows of X
// and into its rows of Y, G and U (a.y[0], a.rows[0], a.ks[0]: one segment, every expert's matrix of a.w's shape).
template <int TYPE, int NB, int R, bool LIGHT>
__global__ void __launch_bounds__(kDecWarps * 32) wmat_slot_kernel(dec_args a, slot_args sa, const float *X)
{
    __shared__ float lut[16];
    __shared__ float part[kDecWarps][R * NB];
    int e = __ldg(sa.used + blockIdx.y);
    if (e < 0) // the same for every thread of the block
        return;
    if (TYPE == SP_KM_NF4)
        fill_lut(lut, a.w);
    int o = __ldg(sa.off + e), cnt = __ldg(sa.off + e + 1) - o, rows = a.rows[0];
    const sp_km_w *w = sa.tab + 3 * e + sa.which;
    const uint8_t *uq = a.swiglu ? (const uint8_t *)w[1].q : nullptr;
    const float *usq = a.swiglu ? w[1].scale : nullptr;
    vec_rows<TYPE, NB, R, true, LIGHT>(a, (const uint8_t *)w->q, w->scale, uq, usq, rows, a.ks[0], blockIdx.x,
                                X + (long)o * a.w.cols, cnt < NB ? cnt : NB, lut, part, [&] {
                                    long yo = (long)o * rows;
                                    return vec_out{a.y[0] + yo, sa.G ? sa.G + yo : nullptr,
                                                   sa.U ? sa.U + yo : nullptr};
                                });
}

// Decodes rows r0 .. of a chunked Q8 / NF4 matrix to bf16 (out: the tile, [rows, cols]), a chunk a thread, 8
// values a 16-byte store.
template <int TYPE> __global__ void decode_bf16_kernel(uint4 *out, sp_km_w w, int r0, int n)
{
    constexpr int PV = 16, NP = TYPE == SP_KM_NF4 ? 2 : 1;
    __shared__ float lut[16];
    if (TYPE == SP_KM_NF4)
        fill_lut(lut, w);
    long rb = sp_km_row_bytes(&w);
    int cpr = (int)(rb / SP_KM_CHUNK), ns = sp_km_row_scales(&w);
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x) {
        int r = e / cpr, j = e % cpr;
        uint4 raw = ld_stream((const uint8_t *)w.q + (long)(r0 + r) * rb + (long)j * SP_KM_CHUNK);
        uint32_t v[4] = {raw.x, raw.y, raw.z, raw.w};
        float s = w.scale[(long)(r0 + r) * ns + sp_km_chunk_block(j)];
#pragma unroll
        for (int p = 0; p < NP; p++)
#pragma unroll
            for (int h = 0; h < PV; h += 8) {
                uint32_t o[4];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    __nv_bfloat162 two = __floats2bfloat162_rn(sp_km_piece_val(TYPE, v, p, h + 2 * i, lut) * s,
                                                               sp_km_piece_val(TYPE, v, p, h + 2 * i + 1, lut) * s);
                    memcpy(&o[i], &two, sizeof o[i]);
                }
                long at = (long)r * w.cols + sp_km_piece_col(TYPE, j, p) + h;
                out[at / 8] = make_uint4(o[0], o[1], o[2], o[3]);
            }
    }
}

constexpr int kMaxDecodeRows = 8;          // X rows the fused kernel takes (sp_qmat_mul's decode limit too)
constexpr int kMaxFusedRows = 32;          // int8 / NF4: up to here, passes of the fused kernel (W read B / 8 times)
constexpr size_t kTileBytes = 64u << 20;   // workspace for a tile of rows decoded to bf16

int g_rows_per_warp, g_warps_per_row, g_tile_rows; // sp_cuda_wmat_tune (0: automatic)
int g_evict_first = 1;                             // sp_cuda_wmat_tune_stream
int g_light = -1;                                  // sp_cuda_wmat_tune_light (-1: light_on's default)

// Whether int8 and NF4 products of one row take chunk_product's LIGHT form: sp_cuda_wmat_tune_light's choice, else
// SEPAL_DECODE_LIGHT=0 from the environment turns it off (read once).
bool light_on()
{
    static const bool env = [] {
        const char *e = getenv("SEPAL_DECODE_LIGHT");
        return !e || atoi(e) != 0;
    }();
    return g_light < 0 ? env : g_light != 0;
}

int sm_count()
{
    static const int n = [] {
        int d = 0, c = 0;
        cudaGetDevice(&d);
        cudaDeviceGetAttribute(&c, cudaDevAttrMultiProcessorCount, d);
        return c > 0 ? c : 132;
    }();
    return n;
}

// The fused kernel's rows a warp (R: each X load serves R rows) and warps a row (ks), from bench_kern_cuda --sweep on
// an H200 (7B's [11008, 4096] and [4096, 11008]): f32 2 rows a warp, the rest 4; ks doubled until the grid holds 24
// warps an SM (at least 2 for several rows of X, 4 for f32), while each lane keeps at least two chunks of a row.
// bf16 with one row of X: 4 rows a warp and 4 warps a row, the best of bench_block_cuda's sweep of the whole decode
// step on an H200 (7B 0.70 of copy, 70B 0.95; 2 rows and 1 warp a row for every product gave 0.63 and 0.92).
void decode_shape(const sp_km_w &w, int B, int *R, int *ks)
{
    bool bf16_one = (w.type == SP_KM_BF16 || w.type == SP_KM_F16) && B == 1; // fp16: bf16's bytes, its shape
    *R = g_rows_per_warp ? g_rows_per_warp : w.type == SP_KM_F32 ? 2 : 4;
    int nchunks = (int)(sp_km_row_bytes(&w) / SP_KM_CHUNK);
    int least = bf16_one ? 4 : B == 1 ? 1 : w.type == SP_KM_F32 ? 4 : 2;
    long warps = (w.rows + *R - 1) / *R;
    *ks = g_warps_per_row;
    if (!*ks)
        for (*ks = 1; *ks < kDecWarps && nchunks >= 64 * 2 * *ks && (*ks < least || warps * *ks < 24L * sm_count());)
            *ks *= 2;
}

// The vectorised kernel's instance for NB rows of X and R rows a warp: the dense products' (sa NULL), or the
// experts' (sa: where their matrices are; never a dependent launch).
template <int TYPE, int NB, int R>
cudaError_t launch_nbr(bool pdl, dim3 grid, cudaStream_t st, const dec_args &a, const slot_args *sa, const float *X,
                       int B)
{
    dim3 block(kDecWarps * 32);
    if constexpr (light_able(TYPE, NB))
        if (light_on())
            return sa ? spk::launch(false, wmat_slot_kernel<TYPE, NB, R, true>, grid, block, 0, st, a, *sa, X)
                      : spk::launch(pdl, wmat_vec_kernel<TYPE, NB, R, true>, grid, block, 0, st, a, X, B);
    if (sa)
        return spk::launch(false, wmat_slot_kernel<TYPE, NB, R, false>, grid, block, 0, st, a, *sa, X);
    return spk::launch(pdl, wmat_vec_kernel<TYPE, NB, R, false>, grid, block, 0, st, a, X, B);
}

template <int TYPE, int NB>
cudaError_t launch_vec_r(int R, bool pdl, dim3 grid, cudaStream_t st, const dec_args &a, const slot_args *sa,
                         const float *X, int B)
{
    if (R == 1)
        return launch_nbr<TYPE, NB, 1>(pdl, grid, st, a, sa, X, B);
    if (R == 2)
        return launch_nbr<TYPE, NB, 2>(pdl, grid, st, a, sa, X, B);
    return launch_nbr<TYPE, NB, 4>(pdl, grid, st, a, sa, X, B);
}

// B: the rows of X (the experts': the most any expert has).
template <int TYPE>
cudaError_t launch_vec(int R, bool pdl, dim3 grid, cudaStream_t st, const dec_args &a, const slot_args *sa,
                       const float *X, int B)
{
    if (B == 1)
        return launch_vec_r<TYPE, 1>(R, pdl, grid, st, a, sa, X, B);
    if (B == 2)
        return launch_vec_r<TYPE, 2>(R, pdl, grid, st, a, sa, X, B);
    if (B <= 4)
        return launch_vec_r<TYPE, 4>(R, pdl, grid, st, a, sa, X, B);
    return launch_vec_r<TYPE, 8>(R, pdl, grid, st, a, sa, X, B);
}

// launch_vec for w's encoding.
cudaError_t launch_vec_w(const sp_km_w &w, int R, bool pdl, dim3 grid, cudaStream_t st, const dec_args &a,
                         const slot_args *sa, const float *X, int B)
{
    switch (w.type) {
    case SP_KM_F32: return launch_vec<SP_KM_F32>(R, pdl, grid, st, a, sa, X, B);
    case SP_KM_BF16: return launch_vec<SP_KM_BF16>(R, pdl, grid, st, a, sa, X, B);
    case SP_KM_F16: return launch_vec<SP_KM_F16>(R, pdl, grid, st, a, sa, X, B);
    case SP_KM_Q8: return launch_vec<SP_KM_Q8>(R, pdl, grid, st, a, sa, X, B);
    default: return launch_vec<SP_KM_NF4>(R, pdl, grid, st, a, sa, X, B);
    }
}

// Whether this build's decode kernels wait where they should in a dependent launch (spk::pdl_able), once.
bool pdl_ok()
{
    static const bool ok = spk::pdl_able(wmat_vec_kernel<SP_KM_BF16, 1, 2, false>);
    return ok;
}

// The kernels' arguments for m (segments, no blocks yet).
dec_args dec_args_of(const sp_cuda_dmul &m)
{
    dec_args a = {};
    a.w = m.W[0]->w;
    a.nseg = m.swiglu ? 1 : m.n, a.swiglu = m.swiglu, a.bias = m.bias, a.res = m.res;
    a.evict_first = g_evict_first, a.pos = m.pos, a.npos = m.pos ? m.npos : 0;
    for (int i = 0; i < m.n; i++) {
        a.q[i] = m.W[i]->w.q, a.scale[i] = m.W[i]->w.scale, a.rows[i] = m.W[i]->w.rows;
        a.y[i] = m.Y[i];
    }
    return a;
}

// m's products for B <= kMaxDecodeRows rows of X in one launch, W read once.
sp_status mul_fused(sp_cuda *cu, const sp_cuda_dmul &m, const float *X, int B, sp_err *err)
{
    cudaStream_t st = spk::stream_of(cu);
    dec_args a = dec_args_of(m);
    const sp_km_w &w = m.W[0]->w;
    bool pdl = m.pdl && pdl_ok();
    cudaError_t e;
    long grid = 0;
    if (!sp_km_chunked(&w) || (uintptr_t)X % 16) { // a block a row of each segment
        for (int i = 0; i < a.nseg; grid += a.rows[i++])
            a.first[i] = (int)grid;
        dim3 block(sp_km_row_threads(w.cols));
        switch (w.type) {
        case SP_KM_F32: e = spk::launch(pdl, wmat_dot_kernel<SP_KM_F32>, dim3(grid), block, 0, st, a, X, B); break;
        case SP_KM_BF16: e = spk::launch(pdl, wmat_dot_kernel<SP_KM_BF16>, dim3(grid), block, 0, st, a, X, B); break;
        case SP_KM_F16: e = spk::launch(pdl, wmat_dot_kernel<SP_KM_F16>, dim3(grid), block, 0, st, a, X, B); break;
        case SP_KM_Q8: e = spk::launch(pdl, wmat_dot_kernel<SP_KM_Q8>, dim3(grid), block, 0, st, a, X, B); break;
        default: e = spk::launch(pdl, wmat_dot_kernel<SP_KM_NF4>, dim3(grid), block, 0, st, a, X, B); break;
        }
        return sp_cuda_error(err, (int)e, "decode product");
    }
    int R = 1;
    for (int i = 0; i < a.nseg; i++) { // each segment's warps a row as when alone (the same sums)
        decode_shape(m.W[i]->w, B, &R, &a.ks[i]);
        if (a.swiglu)
            R = R * 2 > 4 ? 4 : R * 2; // gate and up rows
        long warps = (long)(a.rows[i] + (a.swiglu ? R / 2 : R) - 1) / (a.swiglu ? R / 2 : R) * a.ks[i];
        a.first[i] = (int)grid;
        grid += (warps + kDecWarps - 1) / kDecWarps;
    }
    e = launch_vec_w(w, R, pdl, dim3(grid), st, a, nullptr, X, B);
    return sp_cuda_error(err, (int)e, "decode product");
}

// The plain product of one matrix (Y = X W^T) for B <= kMaxDecodeRows.
sp_status mul_one(sp_cuda *cu, const sp_cuda_wmat *W, const float *X, float *Y, int B, sp_err *err)
{
    sp_cuda_dmul m = {};
    m.W[0] = W, m.Y[0] = Y, m.n = 1;
    return mul_fused(cu, m, X, B, err);
}

// Rows of a tile of decoded weights that fit kTileBytes in bf16.
int tile_rows(const sp_km_w &w)
{
    long t = g_tile_rows ? g_tile_rows : (long)(kTileBytes / 2) / w.cols;
    return (int)(t < 1 ? 1 : t > w.rows ? w.rows : t);
}

// The 16-bit type of W's GEMMs: fp16 for fp16 weights (their values exact), else bf16 (int8 / NF4 decoded to it).
sp_cu_dtype half_of(const sp_km_w &w) { return w.type == SP_KM_F16 ? SP_CU_F16 : SP_CU_BF16; }

// W's GEMMs need no decoded tiles (bf16, fp16: the values themselves).
bool whole(const sp_km_w &w) { return w.type == SP_KM_BF16 || w.type == SP_KM_F16; }

// n values of A (f32) rounded to t (bf16 or fp16) at the start of the workspace (*ah), and room for a decoded tile
// of tile_bytes after them (*tile).
sp_status half_operands(sp_cuda *cu, const float *A, long n, size_t tile_bytes, sp_cu_dtype t, void **ah,
                        void **tile, sp_err *err)
{
    size_t ab = ((size_t)n * 2 + 255) & ~(size_t)255;
    void *ws = NULL;
    sp_status st = sp_cuda_workspace(cu, ab + tile_bytes, &ws, err);
    if (st != SP_OK)
        return st;
    *ah = ws;
    *tile = (char *)ws + ab;
    return sp_cuda_f32_to(cu, *ah, A, n, t, err);
}

// The 16-bit GEMMs of a product (dx 0: Y[B, rows] = X W^T; dx 1: dX[B, cols] += dY W, or = when acc is 0) from A
// (X or dY) in half_of(W) (ah) on bf16 or fp16 weights, or on tiles of int8 / NF4 rows decoded to bf16 at wt (tile
// rows: tile_rows; 0 for bf16 and fp16).
sp_status gemm_half_from(sp_cuda *cu, const sp_cuda_wmat *W, const void *ah, void *wt, int tile, float *C, int B,
                         int dx, int acc, sp_err *err)
{
    int rows = W->w.rows, cols = W->w.cols;
    sp_cu_dtype t = half_of(W->w);
    if (!tile && dx) {
        sp_gemm_plan p = sp_gemm_plan_linear_dx(B, cols, rows);
        p.beta = acc ? 1.0f : 0.0f;
        return sp_cuda_gemm(cu, &p, W->q, ah, C, t, err);
    }
    if (!tile)
        return sp_cuda_linear(cu, C, ah, W->q, t, B, cols, rows, 0, err);
    sp_status st = SP_OK;
    for (int r0 = 0; st == SP_OK && r0 < rows; r0 += tile) {
        int tr = rows - r0 < tile ? rows - r0 : tile;
        st = sp_cuda_dequant_bf16(cu, wt, W, r0, tr, err);
        if (st != SP_OK)
            break;
        if (dx) {
            sp_gemm_plan p = sp_gemm_plan_linear_dx_tile(B, cols, tr, rows);
            p.beta = acc || r0 > 0 ? 1.0f : 0.0f;
            st = sp_cuda_gemm(cu, &p, wt, (const uint16_t *)ah + r0, C, SP_CU_BF16, err);
        } else {
            sp_gemm_plan p = sp_gemm_plan_linear_tile(B, cols, tr, rows);
            st = sp_cuda_gemm(cu, &p, wt, ah, C + r0, SP_CU_BF16, err);
        }
    }
    return st;
}

// gemm_half_from with A rounded to half_of(W) first (at the start of the workspace, the tile after it).
sp_status gemm_half(sp_cuda *cu, const sp_cuda_wmat *W, const float *A, float *C, int B, int dx, sp_err *err)
{
    int tile = whole(W->w) ? 0 : tile_rows(W->w);
    void *ah = NULL, *wt = NULL;
    long n = (long)B * (dx ? W->w.rows : W->w.cols);
    sp_status st = half_operands(cu, A, n, (size_t)tile * W->w.cols * 2, half_of(W->w), &ah, &wt, err);
    return st != SP_OK ? st : gemm_half_from(cu, W, ah, wt, tile, C, B, dx, 1, err);
}

// Copies n bytes of host memory to a new device buffer *d (nothing when n is 0).
sp_status put(sp_cuda *cu, void **d, const void *src, size_t n, sp_err *err)
{
    *d = NULL;
    return n ? sp_cuda_dup(cu, d, src, n, err) : SP_OK;
}

// Q8 and NF4: re-laid out row-major on the host first (kern.c interleaves 16 rows for its SIMD loads).
sp_status put_relaid(sp_cuda *cu, sp_cuda_wmat *w, const sp_qmat *m, sp_err *err)
{
    int nf4 = m->type == SP_W_NF4, blk = nf4 ? SP_KM_NF4_BLOCK : SP_KM_Q8_BLOCK, nb = sp_km_blocks(m->cols, blk);
    size_t nq = (size_t)m->rows * (nf4 ? (size_t)nb * (blk / 2) : (size_t)m->cols), ns = (size_t)m->rows * nb;
    uint8_t *q = (uint8_t *)malloc(nq ? nq : 1);
    float *s = (float *)malloc((ns ? ns : 1) * sizeof(float));
    sp_status st = q && s ? SP_OK
                          : sp_errf(err, SP_ERR_NOMEM, "cuda: out of host memory re-laying an %s matrix",
                                    sp_wtype_name(m->type));
    if (st == SP_OK && nf4)
        st = sp_cuda_nf4_rowmajor(m, q, s, err);
    else if (st == SP_OK)
        sp_cuda_q8_rowmajor(m, (int8_t *)q, s);
    if (st == SP_OK)
        st = put(cu, &w->q, q, nq, err);
    if (st == SP_OK)
        st = put(cu, (void **)&w->scale, s, ns * sizeof(float), err);
    free(q);
    free(s);
    return st;
}

} // namespace

extern "C" sp_status sp_cuda_wmat_upload(sp_cuda *cu, sp_cuda_wmat *out, const sp_qmat *m, sp_err *err)
{
    memset(out, 0, sizeof *out);
    if (m->rows <= 0 || m->cols <= 0 || (unsigned)m->type >= SP_W__COUNT)
        return sp_errf(err, SP_ERR_ARG, "cuda: weights: bad matrix [%d, %d]", m->rows, m->cols);
    sp_status st;
    if (m->type == SP_W_Q8 || m->type == SP_W_NF4)
        st = put_relaid(cu, out, m, err);
    else
        st = put(cu, &out->q, m->q, (size_t)m->rows * m->row_bytes, err);
    if (st != SP_OK) {
        sp_cuda_wmat_free(cu, out);
        return sp_err_prefix(err, "uploading a [%d, %d] %s matrix: ", m->rows, m->cols, sp_wtype_name(m->type));
    }
    out->w = sp_cuda_km_w(m->type, m->rows, m->cols, out->q, out->scale);
    return SP_OK;
}

extern "C" void sp_cuda_wmat_free(sp_cuda *cu, sp_cuda_wmat *w)
{
    sp_cuda_free(cu, w->q);
    sp_cuda_free(cu, w->scale);
    memset(w, 0, sizeof *w);
}

extern "C" void sp_cuda_wmat_tune(int rows_per_warp, int warps_per_row, int tile_rows)
{
    g_tile_rows = tile_rows > 0 ? tile_rows : 0;
    g_rows_per_warp = rows_per_warp == 1 || rows_per_warp == 2 || rows_per_warp == 4 ? rows_per_warp : 0;
    g_warps_per_row = warps_per_row == 1 || warps_per_row == 2 || warps_per_row == 4 ? warps_per_row : 0;
}

extern "C" void sp_cuda_wmat_tune_stream(int evict_first) { g_evict_first = evict_first < 0 ? 1 : evict_first != 0; }

extern "C" void sp_cuda_wmat_tune_light(int on) { g_light = on < 0 ? -1 : on != 0; }

static sp_status check_rows(const sp_cuda_wmat *w, int r0, int rows, sp_err *err)
{
    if (r0 < 0 || rows <= 0 || rows > w->w.rows - r0)
        return sp_errf(err, SP_ERR_ARG, "cuda: decode rows [%d, +%d) of a matrix of %d", r0, rows, w->w.rows);
    return SP_OK;
}

extern "C" sp_status sp_cuda_dequant(sp_cuda *cu, float *out, const sp_cuda_wmat *w, int r0, int rows, sp_err *err)
{
    sp_status st = check_rows(w, r0, rows, err);
    if (st != SP_OK)
        return st;
    long n = (long)rows * w->w.cols;
    dequant_kernel<<<spk::grid_for(n), spk::kThreads, 0, spk::stream_of(cu)>>>(out, w->w, r0, n);
    return spk::launched(err, "decode weights");
}

extern "C" sp_status sp_cuda_dequant_bf16(sp_cuda *cu, void *out, const sp_cuda_wmat *w, int r0, int rows,
                                          sp_err *err)
{
    sp_status st = check_rows(w, r0, rows, err);
    if (st != SP_OK)
        return st;
    cudaStream_t s = spk::stream_of(cu);
    int type = w->w.type;
    if ((type == SP_KM_Q8 || type == SP_KM_NF4) && sp_km_chunked(&w->w) && (uintptr_t)out % 16 == 0) {
        int n = (int)((long)rows * sp_km_row_bytes(&w->w) / SP_KM_CHUNK);
        if (type == SP_KM_Q8)
            decode_bf16_kernel<SP_KM_Q8><<<spk::grid_for(n), spk::kThreads, 0, s>>>((uint4 *)out, w->w, r0, n);
        else
            decode_bf16_kernel<SP_KM_NF4><<<spk::grid_for(n), spk::kThreads, 0, s>>>((uint4 *)out, w->w, r0, n);
    } else {
        long n = (long)rows * w->w.cols;
        dequant_bf16_kernel<<<spk::grid_for(n), spk::kThreads, 0, s>>>((__nv_bfloat16 *)out, w->w, r0, n);
    }
    return spk::launched(err, "decode weights to bf16");
}

extern "C" sp_status sp_cuda_wmat_mul(sp_cuda *cu, const sp_cuda_wmat *W, const float *X, float *Y, int B, sp_err *err)
{
    if (B <= 0 || !W->q)
        return sp_errf(err, SP_ERR_ARG, "cuda: product with %d rows or an empty matrix", B);
    int type = W->w.type;
    if (B <= kMaxDecodeRows || ((type == SP_KM_Q8 || type == SP_KM_NF4) && B <= kMaxFusedRows)) {
        sp_status st = SP_OK;
        for (int b0 = 0; st == SP_OK && b0 < B; b0 += kMaxDecodeRows) {
            int nb = B - b0 < kMaxDecodeRows ? B - b0 : kMaxDecodeRows;
            st = mul_one(cu, W, X + (long)b0 * W->w.cols, Y + (long)b0 * W->w.rows, nb, err);
        }
        return st;
    }
    if (type == SP_KM_F32)
        return sp_cuda_linear(cu, Y, X, W->q, SP_CU_F32, B, W->w.cols, W->w.rows, 0, err);
    return gemm_half(cu, W, X, Y, B, 0, err);
}

extern "C" sp_status sp_cuda_wmat_mul_h(sp_cuda *cu, const sp_cuda_wmat *W, const void *Xh, float *Y, int B,
                                        sp_err *err)
{
    if (B <= 0 || !W->q || W->w.type == SP_KM_F32 || W->w.type == SP_KM_F16)
        return sp_errf(err, SP_ERR_ARG, "cuda: bf16 product with %d rows, an empty, an f32 or an fp16 matrix", B);
    int tile = whole(W->w) ? 0 : tile_rows(W->w);
    void *wt = NULL;
    sp_status st = tile ? sp_cuda_workspace(cu, (size_t)tile * W->w.cols * 2, &wt, err) : SP_OK;
    return st != SP_OK ? st : gemm_half_from(cu, W, Xh, wt, tile, Y, B, 0, 0, err);
}

extern "C" sp_status sp_cuda_wmat_mul_t_h(sp_cuda *cu, const sp_cuda_wmat *W, const void *dYh, float *dX, int B,
                                          int acc, sp_err *err)
{
    if (B <= 0 || !W->q || W->w.type == SP_KM_F32 || W->w.type == SP_KM_F16)
        return sp_errf(err, SP_ERR_ARG,
                       "cuda: bf16 transposed product with %d rows, an empty, an f32 or an fp16 matrix", B);
    int tile = whole(W->w) ? 0 : tile_rows(W->w);
    void *wt = NULL;
    sp_status st = tile ? sp_cuda_workspace(cu, (size_t)tile * W->w.cols * 2, &wt, err) : SP_OK;
    return st != SP_OK ? st : gemm_half_from(cu, W, dYh, wt, tile, dX, B, 1, acc, err);
}

extern "C" sp_status sp_cuda_wmat_mul_fused(sp_cuda *cu, const sp_cuda_dmul *m, const float *X, int B, sp_err *err)
{
    int n = m->n, ok = B > 0 && B <= kMaxDecodeRows && n >= 1 && n <= 3 && (!m->swiglu || n == 2) &&
                       (n == 1 || (!m->bias && !m->res)) && (!m->pos || (m->npos >= 1 && m->npos <= 32));
    for (int i = 0; ok && i < n; i++)
        ok = m->W[i] && m->W[i]->q && m->Y[m->swiglu ? 0 : i] && m->W[i]->w.type == m->W[0]->w.type &&
             m->W[i]->w.cols == m->W[0]->w.cols && (!m->swiglu || m->W[i]->w.rows == m->W[0]->w.rows);
    if (!ok)
        return sp_errf(err, SP_ERR_ARG, "cuda: fused decode product of %d matrices (swiglu %d) on %d rows", n,
                       m->swiglu, B);
    return mul_fused(cu, *m, X, B, err);
}

extern "C" sp_status sp_cuda_wmat_mul_slots(sp_cuda *cu, const sp_cuda_wmat *W, const sp_cuda_smul *m, const float *X,
                                           sp_err *err)
{
    const sp_km_w &w = W->w;
    if (m->ng < 1 || m->ng > 65535 || m->rows < 1 || m->rows > kMaxDecodeRows || m->which < 0 || !m->tab ||
        !m->used || !m->off || !m->Y || !X || (m->swiglu != 0 && m->swiglu != 1))
        return sp_errf(err, SP_ERR_ARG, "cuda: experts' decode products of %d experts on %d rows", m->ng, m->rows);
    if (!sp_km_chunked(&w) || (uintptr_t)X % 16)
        return sp_errf(err, SP_ERR_UNSUPPORTED, "cuda: experts' [%d, %d] %s rows are not 16-byte chunks", w.rows,
                       w.cols, sp_wtype_name((sp_wtype)w.type));
    dec_args a = {};
    a.w = w, a.nseg = 1, a.swiglu = m->swiglu, a.evict_first = g_evict_first;
    a.rows[0] = w.rows, a.y[0] = m->Y;
    int R = 1;
    decode_shape(w, m->rows, &R, &a.ks[0]); // as the dense product of one expert's rows
    if (a.swiglu)
        R = R * 2 > 4 ? 4 : R * 2;
    int ro = a.swiglu ? R / 2 : R;
    long warps = (long)(w.rows + ro - 1) / ro * a.ks[0];
    dim3 grid((unsigned)((warps + kDecWarps - 1) / kDecWarps), (unsigned)m->ng);
    slot_args sa = {m->tab, m->used, m->off, m->which, m->swiglu ? m->G : nullptr, m->swiglu ? m->U : nullptr};
    cudaError_t e = launch_vec_w(w, R, false, grid, spk::stream_of(cu), a, &sa, X, m->rows);
    return sp_cuda_error(err, (int)e, "experts' decode products");
}

extern "C" sp_status sp_cuda_wmat_mul_t_acc(sp_cuda *cu, const sp_cuda_wmat *W, const float *dY, float *dX, int B,
                                            sp_err *err)
{
    if (B <= 0 || !W->q)
        return sp_errf(err, SP_ERR_ARG, "cuda: transposed product with %d rows or an empty matrix", B);
    if (W->w.type == SP_KM_F32)
        return sp_cuda_linear_dx(cu, dX, dY, W->q, SP_CU_F32, B, W->w.cols, W->w.rows, err);
    return gemm_half(cu, W, dY, dX, B, 1, err);
}
