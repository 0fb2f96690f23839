// kernels.cu - the fused kernels of kernels.h (weights: weights.cu; attention: attn.cu). Their arithmetic is
// kmath.h's; this file holds the launches, the indexing and the shape checks.
#include "kernels.h"

#include "launch.cuh"

using spk::block_max;
using spk::block_sum;

namespace {

// Row kernels: one block of sp_km_row_threads(C) threads a row (blockIdx.x), kmath's strides and trees.
__global__ void rmsnorm_fwd_kernel(float *out, float *rstd, const float *inp, const float *w, int C, float eps,
                                   sp_cuda_pf pf)
{
    __shared__ float sh[SP_KM_MAX_THREADS];
    int tid = threadIdx.x, nt = blockDim.x;
    spk::pdl_trigger(); // a dependent launch (sp_cuda_rmsnorm_fwd_dep) waits here for its input
    spk::prefetch_share(pf);
    spk::pdl_wait();
    const float *x = inp + (long)blockIdx.x * C;
    float *y = out + (long)blockIdx.x * C;
    float r = sp_km_rstd(block_sum(sp_km_sumsq_part(x, C, tid, nt), sh), C, eps);
    for (int c = tid; c < C; c += nt)
        y[c] = sp_km_rmsnorm(x[c], r, w[c]);
    if (rstd && tid == 0)
        rstd[blockIdx.x] = r;
}

__global__ void rmsnorm_bwd_kernel(float *dinp, const float *dout, const float *inp, const float *w,
                                   const float *rstd, int C)
{
    __shared__ float sh[SP_KM_MAX_THREADS];
    spk::norm_bwd_row(dinp, nullptr, dinp, dout, inp, w, nullptr, rstd, C, 1, sh);
}

__global__ void layernorm_fwd_kernel(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                     const float *b, int C, float eps)
{
    __shared__ float sh[SP_KM_MAX_THREADS];
    int tid = threadIdx.x, nt = blockDim.x;
    const float *x = inp + (long)blockIdx.x * C;
    float *y = out + (long)blockIdx.x * C;
    float m = block_sum(sp_km_sum_part(x, C, tid, nt), sh) / (float)C;
    float r = sp_km_rstd(block_sum(sp_km_sqdev_part(x, m, C, tid, nt), sh), C, eps);
    for (int c = tid; c < C; c += nt)
        y[c] = sp_km_layernorm(x[c], m, r, w ? w[c] : 1.0f, b ? b[c] : 0.0f);
    if (tid == 0) {
        mean[blockIdx.x] = m;
        rstd[blockIdx.x] = r;
    }
}

__global__ void layernorm_bwd_kernel(float *dinp, const float *dout, const float *inp, const float *w,
                                     const float *mean, const float *rstd, int C)
{
    __shared__ float sh[SP_KM_MAX_THREADS];
    spk::norm_bwd_row(dinp, nullptr, dinp, dout, inp, w, mean, rstd, C, 0, sh);
}

// A norm's weight (or bias) gradient: one thread a column, the rows in order.
__global__ void norm_dw_kernel(float *dw, const float *dout, const float *inp, const float *mean, const float *rstd,
                               int N, int C, int dy_only)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < C)
        dw[c] += sp_km_norm_dw_col(dout, inp, mean, rstd, N, C, c, dy_only);
}

__global__ void rope_kernel(float *out, const float *inp, const float *inv_freq, int pos0, int T, int nh, int hd,
                            long pairs, int backward)
{
    SPK_GRID_LOOP(e, pairs)
    sp_km_rope_apply(out, inp, inv_freq, pos0, T, nh, hd, e, backward);
}

__global__ void alibi_kernel(float *scores, const float *slopes, int nh, int T, int S, int past, long n)
{
    SPK_GRID_LOOP(e, n)
    {
        int h, s, qpos;
        if (sp_km_score_at(e, nh, T, S, past, &h, &s, &qpos))
            scores[e] += sp_km_alibi(slopes[h], s, qpos);
    }
}

__global__ void swiglu_fwd_kernel(float *out, const float *gate, const float *up, long n)
{
    SPK_GRID_LOOP(i, n)
    out[i] = sp_km_swiglu(gate[i], up[i]);
}

// The sums go to scratch copies when a gradient is not wanted (NULL), so the loop has no branches.
__global__ void swiglu_bwd_kernel(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                                  long n)
{
    SPK_GRID_LOOP(i, n)
    {
        float dg = dgate ? dgate[i] : 0.0f, du = dup ? dup[i] : 0.0f;
        sp_km_swiglu_bwd(&dg, &du, dout[i], gate[i], up[i]);
        if (dgate)
            dgate[i] = dg;
        if (dup)
            dup[i] = du;
    }
}

__global__ void gelu_fwd_kernel(float *out, const float *inp, long n, int tanh_approx)
{
    SPK_GRID_LOOP(i, n)
    out[i] = tanh_approx ? sp_km_gelu_tanh(inp[i]) : sp_km_gelu(inp[i]);
}

__global__ void gelu_bwd_kernel(float *dinp, const float *dout, const float *inp, long n, int tanh_approx)
{
    SPK_GRID_LOOP(i, n)
    dinp[i] += dout[i] * (tanh_approx ? sp_km_gelu_tanh_grad(inp[i]) : sp_km_gelu_grad(inp[i]));
}

__global__ void embedding_kernel(float *out, const int32_t *ids, const float *table, int V, int C, long n, int *flag)
{
    SPK_GRID_LOOP(e, n)
    {
        int bad = 0;
        out[e] = sp_km_embed(table, ids, V, C, e, &bad);
        if (bad)
            *flag = 1;
    }
}

__global__ void softmax_kernel(float *out, const float *inp, int C)
{
    __shared__ float sh[SP_KM_MAX_THREADS];
    int tid = threadIdx.x, nt = blockDim.x;
    const float *x = inp + (long)blockIdx.x * C;
    float *y = out + (long)blockIdx.x * C;
    float mx = block_max(sp_km_max_part(x, C, tid, nt), sh);
    float sum = block_sum(sp_km_sumexp_part(x, mx, C, tid, nt), sh);
    for (int c = tid; c < C; c += nt)
        y[c] = sp_km_softmax(x[c], mx, sum);
}

// Cross-entropy of row blockIdx.x: the loss (forward, dlogits NULL) or the gradient added to dlogits.
__global__ void crossentropy_kernel(float *losses, float *dlogits, const float *dlosses, const float *logits,
                                    const int32_t *targets, int V, int *flag)
{
    __shared__ float sh[SP_KM_MAX_THREADS];
    int tid = threadIdx.x, nt = blockDim.x, t = targets[blockIdx.x];
    if (t < 0 || t >= V) { // the whole block takes this branch
        if (t >= V && tid == 0)
            *flag = 1;
        if (losses && tid == 0)
            losses[blockIdx.x] = 0.0f;
        return;
    }
    const float *x = logits + (long)blockIdx.x * V;
    float mx = block_max(sp_km_max_part(x, V, tid, nt), sh);
    float sum = block_sum(sp_km_sumexp_part(x, mx, V, tid, nt), sh);
    if (losses) {
        if (tid == 0)
            losses[blockIdx.x] = sp_km_ce_loss(mx, sum, x[t]);
        return;
    }
    float *dx = dlogits + (long)blockIdx.x * V, dl = dlosses[blockIdx.x];
    for (int c = tid; c < V; c += nt)
        dx[c] += sp_km_ce_grad(dl, x[c], mx, sum, c == t);
}

bool dims_ok(int N, int C) { return N > 0 && C > 0; }

sp_status bad_shape(sp_err *err, const char *what, int N, int C)
{
    return sp_errf(err, SP_ERR_ARG, "%s: bad shape [%d, %d]", what, N, C);
}

// Syncs, then turns the context's flag into SP_ERR_ARG with `msg`.
sp_status check_flag(sp_cuda *cu, sp_status launched, const char *msg, sp_err *err)
{
    int flag = 0;
    sp_status st = launched;
    if (st == SP_OK)
        st = sp_cuda_flag_take(cu, &flag, err);
    if (st == SP_OK && flag)
        st = sp_errf(err, SP_ERR_ARG, "%s", msg);
    return st;
}

} // namespace

#define ROW_LAUNCH(kernel, N, C, cu) kernel<<<(N), sp_km_row_threads(C), 0, spk::stream_of(cu)>>>
#define ELEM_LAUNCH(kernel, n, cu) kernel<<<spk::grid_for(n), spk::kThreads, 0, spk::stream_of(cu)>>>

extern "C" sp_status sp_cuda_rmsnorm_fwd_dep(sp_cuda *cu, float *out, float *rstd, const float *inp, const float *w,
                                             int N, int C, float eps, int pdl, const sp_cuda_pf *pf, sp_err *err)
{
    if (!dims_ok(N, C))
        return bad_shape(err, "rmsnorm", N, C);
    static const bool able = spk::pdl_able(rmsnorm_fwd_kernel);
    cudaError_t e = spk::launch(pdl && able, rmsnorm_fwd_kernel, dim3(N), dim3(sp_km_row_threads(C)), 0,
                                spk::stream_of(cu), out, rstd, inp, w, C, eps, pf ? *pf : sp_cuda_pf{});
    return sp_cuda_error(err, (int)e, "rmsnorm");
}

extern "C" sp_status sp_cuda_rmsnorm_fwd(sp_cuda *cu, float *out, float *rstd, const float *inp, const float *w, int N,
                                         int C, float eps, sp_err *err)
{
    return sp_cuda_rmsnorm_fwd_dep(cu, out, rstd, inp, w, N, C, eps, 0, NULL, err);
}

static sp_status norm_dw(sp_cuda *cu, float *dw, const float *dout, const float *inp, const float *mean,
                         const float *rstd, int N, int C, int dy_only, sp_err *err)
{
    norm_dw_kernel<<<(C + spk::kThreads - 1) / spk::kThreads, spk::kThreads, 0, spk::stream_of(cu)>>>(
        dw, dout, inp, mean, rstd, N, C, dy_only);
    return spk::launched(err, "norm weight gradient");
}

extern "C" sp_status sp_cuda_rmsnorm_bwd(sp_cuda *cu, float *dinp, float *dw, const float *dout, const float *inp,
                                         const float *w, const float *rstd, int N, int C, sp_err *err)
{
    if (!dims_ok(N, C))
        return bad_shape(err, "rmsnorm backward", N, C);
    if (dinp) {
        ROW_LAUNCH(rmsnorm_bwd_kernel, N, C, cu)(dinp, dout, inp, w, rstd, C);
        sp_status st = spk::launched(err, "rmsnorm backward");
        if (st != SP_OK)
            return st;
    }
    return dw ? norm_dw(cu, dw, dout, inp, NULL, rstd, N, C, 0, err) : SP_OK;
}

extern "C" sp_status sp_cuda_layernorm_fwd(sp_cuda *cu, float *out, float *mean, float *rstd, const float *inp,
                                           const float *w, const float *b, int N, int C, float eps, sp_err *err)
{
    if (!dims_ok(N, C))
        return bad_shape(err, "layernorm", N, C);
    ROW_LAUNCH(layernorm_fwd_kernel, N, C, cu)(out, mean, rstd, inp, w, b, C, eps);
    return spk::launched(err, "layernorm");
}

extern "C" sp_status sp_cuda_layernorm_bwd(sp_cuda *cu, float *dinp, float *dw, float *db, const float *dout,
                                           const float *inp, const float *w, const float *mean, const float *rstd,
                                           int N, int C, sp_err *err)
{
    if (!dims_ok(N, C))
        return bad_shape(err, "layernorm backward", N, C);
    sp_status st = SP_OK;
    if (dinp) {
        ROW_LAUNCH(layernorm_bwd_kernel, N, C, cu)(dinp, dout, inp, w, mean, rstd, C);
        st = spk::launched(err, "layernorm backward");
    }
    if (st == SP_OK && dw)
        st = norm_dw(cu, dw, dout, inp, mean, rstd, N, C, 0, err);
    if (st == SP_OK && db)
        st = norm_dw(cu, db, dout, inp, mean, rstd, N, C, 1, err);
    return st;
}

static sp_status rope(sp_cuda *cu, float *out, const float *inp, const float *inv_freq, int pos0, int B, int T,
                      int nh, int hd, int backward, sp_err *err)
{
    if (B <= 0 || T <= 0 || nh <= 0 || hd <= 0 || hd % 2 || pos0 < 0)
        return sp_errf(err, SP_ERR_ARG, "rope: bad shape B %d T %d heads %d head dim %d from %d", B, T, nh, hd, pos0);
    long pairs = (long)B * T * nh * (hd / 2);
    ELEM_LAUNCH(rope_kernel, pairs, cu)(out, inp, inv_freq, pos0, T, nh, hd, pairs, backward);
    return spk::launched(err, "rope");
}

extern "C" sp_status sp_cuda_rope_fwd(sp_cuda *cu, float *out, const float *inp, const float *inv_freq, int pos0, int B,
                                      int T, int nh, int hd, sp_err *err)
{
    return rope(cu, out, inp, inv_freq, pos0, B, T, nh, hd, 0, err);
}

extern "C" sp_status sp_cuda_rope_bwd(sp_cuda *cu, float *dinp, const float *dout, const float *inv_freq, int pos0,
                                      int B, int T, int nh, int hd, sp_err *err)
{
    return rope(cu, dinp, dout, inv_freq, pos0, B, T, nh, hd, 1, err);
}

extern "C" sp_status sp_cuda_alibi_add(sp_cuda *cu, float *scores, const float *slopes, int B, int nh, int T, int S,
                                       int past, sp_err *err)
{
    if (B <= 0 || nh <= 0 || T <= 0 || past < 0 || S != past + T)
        return sp_errf(err, SP_ERR_ARG, "alibi: bad shape B %d heads %d T %d S %d past %d", B, nh, T, S, past);
    long n = (long)B * nh * T * S;
    ELEM_LAUNCH(alibi_kernel, n, cu)(scores, slopes, nh, T, S, past, n);
    return spk::launched(err, "alibi");
}

extern "C" sp_status sp_cuda_swiglu_fwd(sp_cuda *cu, float *out, const float *gate, const float *up, long n,
                                        sp_err *err)
{
    if (n <= 0)
        return n == 0 ? SP_OK : sp_errf(err, SP_ERR_ARG, "swiglu: bad size %ld", n);
    ELEM_LAUNCH(swiglu_fwd_kernel, n, cu)(out, gate, up, n);
    return spk::launched(err, "swiglu");
}

extern "C" sp_status sp_cuda_swiglu_bwd(sp_cuda *cu, float *dgate, float *dup, const float *dout, const float *gate,
                                        const float *up, long n, sp_err *err)
{
    if (n <= 0)
        return n == 0 ? SP_OK : sp_errf(err, SP_ERR_ARG, "swiglu backward: bad size %ld", n);
    ELEM_LAUNCH(swiglu_bwd_kernel, n, cu)(dgate, dup, dout, gate, up, n);
    return spk::launched(err, "swiglu backward");
}

extern "C" sp_status sp_cuda_gelu_fwd(sp_cuda *cu, float *out, const float *inp, long n, int tanh_approx, sp_err *err)
{
    if (n <= 0)
        return n == 0 ? SP_OK : sp_errf(err, SP_ERR_ARG, "gelu: bad size %ld", n);
    ELEM_LAUNCH(gelu_fwd_kernel, n, cu)(out, inp, n, tanh_approx);
    return spk::launched(err, "gelu");
}

extern "C" sp_status sp_cuda_gelu_bwd(sp_cuda *cu, float *dinp, const float *dout, const float *inp, long n,
                                      int tanh_approx, sp_err *err)
{
    if (n <= 0)
        return n == 0 ? SP_OK : sp_errf(err, SP_ERR_ARG, "gelu backward: bad size %ld", n);
    ELEM_LAUNCH(gelu_bwd_kernel, n, cu)(dinp, dout, inp, n, tanh_approx);
    return spk::launched(err, "gelu backward");
}

extern "C" sp_status sp_cuda_embedding_fwd(sp_cuda *cu, float *out, const int32_t *ids, const float *table, int V,
                                           int N, int C, sp_err *err)
{
    if (!dims_ok(N, C) || V <= 0)
        return bad_shape(err, "embedding", N, C);
    long n = (long)N * C;
    ELEM_LAUNCH(embedding_kernel, n, cu)(out, ids, table, V, C, n, sp_cuda_flag(cu));
    return check_flag(cu, spk::launched(err, "embedding"), "embedding: a token id outside the vocabulary", err);
}

extern "C" sp_status sp_cuda_softmax_fwd(sp_cuda *cu, float *out, const float *inp, int N, int C, sp_err *err)
{
    if (!dims_ok(N, C))
        return bad_shape(err, "softmax", N, C);
    ROW_LAUNCH(softmax_kernel, N, C, cu)(out, inp, C);
    return spk::launched(err, "softmax");
}

static sp_status crossentropy(sp_cuda *cu, float *losses, float *dlogits, const float *dlosses, const float *logits,
                              const int32_t *targets, int N, int V, sp_err *err)
{
    if (!dims_ok(N, V))
        return bad_shape(err, "cross-entropy", N, V);
    ROW_LAUNCH(crossentropy_kernel, N, V, cu)(losses, dlogits, dlosses, logits, targets, V, sp_cuda_flag(cu));
    return check_flag(cu, spk::launched(err, "cross-entropy"), "cross-entropy: a target outside the vocabulary",
                      err);
}

extern "C" sp_status sp_cuda_crossentropy_fwd(sp_cuda *cu, float *losses, const float *logits, const int32_t *targets,
                                              int N, int V, sp_err *err)
{
    return crossentropy(cu, losses, NULL, NULL, logits, targets, N, V, err);
}

extern "C" sp_status sp_cuda_crossentropy_bwd(sp_cuda *cu, float *dlogits, const float *dlosses, const float *logits,
                                              const int32_t *targets, int N, int V, sp_err *err)
{
    return crossentropy(cu, NULL, dlogits, dlosses, logits, targets, N, V, err);
}
