// weights.cu - weight matrices on the device (kernels.h): upload in their encodings, decode, and the products
// with them (a fused decode kernel for a few rows of X, cuBLAS on f32 or decoded tiles for more).
#include <stdlib.h>
#include <string.h>

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

// Decode product: block r computes Y[b, r] for every b < B. One instance per encoding: with w.type a constant,
// sp_km_w_at's switch folds away and the inner loop is the encoding's own.
template <int TYPE> __global__ void wmat_dot_kernel(float *Y, sp_km_w w, const float *X, int B)
{
    __shared__ float sh[SP_KM_MAX_THREADS];
    int r = blockIdx.x, tid = threadIdx.x, nt = blockDim.x;
    w.type = TYPE;
    for (int b = 0; b < B; b++) {
        float y = block_sum(sp_km_w_dot_part(&w, r, X + (long)b * w.cols, tid, nt), sh);
        if (tid == 0)
            Y[(long)b * w.rows + r] = y;
    }
}

constexpr int kMaxDecodeRows = 8;          // X rows the fused kernel takes (sp_qmat_mul's decode limit too)
constexpr size_t kTileBytes = 64u << 20;   // workspace for a decoded tile of rows

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

extern "C" sp_status sp_cuda_dequant(sp_cuda *cu, float *out, const sp_cuda_wmat *w, int r0, int rows, sp_err *err)
{
    if (r0 < 0 || rows <= 0 || rows > w->w.rows - r0)
        return sp_errf(err, SP_ERR_ARG, "cuda: decode rows [%d, +%d) of a matrix of %d", r0, rows, w->w.rows);
    long n = (long)rows * w->w.cols;
    dequant_kernel<<<spk::grid_for(n), spk::kThreads, 0, spk::stream_of(cu)>>>(out, w->w, r0, n);
    return spk::launched(err, "decode weights");
}

// Y[B, rows] through cuBLAS, a tile of decoded rows at a time (f32 weights directly).
static sp_status mul_gemm(sp_cuda *cu, const sp_cuda_wmat *W, const float *X, float *Y, int B, sp_err *err)
{
    int rows = W->w.rows, cols = W->w.cols;
    if (W->w.type == SP_KM_F32)
        return sp_cuda_linear(cu, Y, X, W->q, SP_CU_F32, B, cols, rows, 0, err);
    long tile = (long)(kTileBytes / sizeof(float)) / cols;
    tile = tile < 1 ? 1 : tile > rows ? rows : tile;
    void *ws = NULL;
    sp_status st = sp_cuda_workspace(cu, (size_t)tile * cols * sizeof(float), &ws, err);
    for (int r0 = 0; st == SP_OK && r0 < rows; r0 += (int)tile) {
        int tr = rows - r0 < tile ? rows - r0 : (int)tile;
        st = sp_cuda_dequant(cu, (float *)ws, W, r0, tr, err);
        sp_gemm_plan p = sp_gemm_plan_linear(B, cols, tr, 0);
        p.ldc = rows; // the tile's columns of Y [B, rows]
        if (st == SP_OK)
            st = sp_cuda_gemm(cu, &p, ws, X, Y + r0, SP_CU_F32, err);
    }
    return st;
}

extern "C" sp_status sp_cuda_wmat_mul(sp_cuda *cu, const sp_cuda_wmat *W, const float *X, float *Y, int B, sp_err *err)
{
    if (B <= 0 || !W->q)
        return sp_errf(err, SP_ERR_ARG, "cuda: product with %d rows or an empty matrix", B);
    if (B > kMaxDecodeRows)
        return mul_gemm(cu, W, X, Y, B, err);
    dim3 grid(W->w.rows), block(sp_km_row_threads(W->w.cols));
    cudaStream_t st = spk::stream_of(cu);
    switch (W->w.type) {
    case SP_KM_F32: wmat_dot_kernel<SP_KM_F32><<<grid, block, 0, st>>>(Y, W->w, X, B); break;
    case SP_KM_BF16: wmat_dot_kernel<SP_KM_BF16><<<grid, block, 0, st>>>(Y, W->w, X, B); break;
    case SP_KM_Q8: wmat_dot_kernel<SP_KM_Q8><<<grid, block, 0, st>>>(Y, W->w, X, B); break;
    default: wmat_dot_kernel<SP_KM_NF4><<<grid, block, 0, st>>>(Y, W->w, X, B); break;
    }
    return spk::launched(err, "decode product");
}
