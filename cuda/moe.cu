// moe.cu - Mixtral's sparse mixture of experts on the device (moe_cuda.h): the router's logits, kmath_moe.h's
// routing and grouping as kernels, the experts' SwiGLU products (decode-sized steps: each used expert's matrices
// chosen on the device and streamed by weights.cu's vectorised decode kernel, gate and up with the SwiGLU in one
// launch, or a warp a row where rows are not whole 16-byte chunks; one grouped product an expert beyond), the
// per-token sums in expert order, and the backward to the MLP's input through the routing weights. core/block.c's
// moe_forward and moe_backward are the specification, op for op.
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "kmath_moe.h"
#include "launch.cuh"
#include "moe_cuda.h"

using spk::block_sum;

struct sp_cuda_moe {
    sp_cuda *cu;
    sp_moe_dims d;
    int type;         // the experts' encoding (an sp_wtype: all alike)
    sp_cuda_wmat *m;  // [3 E]: gate, up, down of expert e at 3 e + 0, 1, 2
    sp_km_w *tab;     // device: m[i].w, what the slot products read
    float *router;    // [E, H] f32
    int *hoff;        // host: the experts' first slots [E + 1], brought over by a sync
    size_t bytes;
    int vec;          // decode-sized steps: the vectorised products (sp_cuda_moe_use_vec; 1 by default)
    int vec_ok[3];    // gate, up, down: every expert's matrix in whole 16-byte chunks (sp_km_chunked)
};

namespace {

enum { GATE, UP, DOWN };

// ---------------------------------------------------------------------------------------------------------------
// layouts: buffers carved one after another out of caller memory, each 256-byte aligned

struct cursor {
    char *base; // NULL: only count
    size_t at;
    template <class T> T *take(size_t n)
    {
        T *p = base && n ? (T *)(void *)(base + at) : nullptr;
        at += (n * sizeof(T) + 255) & ~(size_t)255;
        return p;
    }
};

// Activations of N rows (block.c's acts for a MoE block): logits [N, E], weights and experts [N, K] of each pair,
// each slot's pair and each pair's slot [NK], the experts' first slots [E + 1], the experts that have slots in
// order [min(E, NK)] (then -1), and by slot: the input row and its expert's gate, up, SwiGLU and (unweighted)
// output.
struct macts {
    float *rlog, *rw, *xs, *gate, *up, *act, *ys;
    int32_t *ridx, *slot, *inv, *off, *used;
};

struct mgrads {
    float *dys, *dxs, *dw, *dlog, *dact, *dgate, *dup;
};

size_t acts_layout(const sp_moe_dims &d, size_t N, macts *a, void *base)
{
    size_t NK = N * d.topk, H = d.H, FF = d.FF;
    cursor c = {(char *)base, 0};
    a->rlog = c.take<float>(N * d.experts), a->rw = c.take<float>(NK);
    a->ridx = c.take<int32_t>(NK), a->slot = c.take<int32_t>(NK), a->inv = c.take<int32_t>(NK);
    size_t E = (size_t)d.experts;
    a->off = c.take<int32_t>(E + 1), a->used = c.take<int32_t>(NK < E ? NK : E);
    a->xs = c.take<float>(NK * H), a->gate = c.take<float>(NK * FF), a->up = c.take<float>(NK * FF);
    a->act = c.take<float>(NK * FF), a->ys = c.take<float>(NK * H);
    return c.at;
}

size_t grads_layout(const sp_moe_dims &d, size_t N, mgrads *g, void *base)
{
    size_t NK = N * d.topk, H = d.H, FF = d.FF;
    cursor c = {(char *)base, 0};
    g->dys = c.take<float>(NK * H), g->dxs = c.take<float>(NK * H), g->dw = c.take<float>(NK);
    g->dlog = c.take<float>(N * d.experts), g->dact = c.take<float>(NK * FF), g->dgate = c.take<float>(NK * FF);
    g->dup = c.take<float>(NK * FF);
    return c.at;
}

// ---------------------------------------------------------------------------------------------------------------
// kernels

constexpr int kRouterThreads = 128;

// rlog[n, e] = x[n] . router[e]: block n, a warp an expert at a time (lanes over H, summed by the butterfly).
__global__ void router_kernel(float *rlog, const float *x, const float *router, int H, int E)
{
    int n = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const float *xn = x + (long)n * H;
    for (int e = warp; e < E; e += nw) {
        const float *r = router + (long)e * H;
        float d = 0.0f;
        for (int c = lane; c < H; c += 32)
            d += xn[c] * r[c];
        for (int o = 16; o > 0; o >>= 1)
            d += __shfl_xor_sync(0xffffffffu, d, o);
        if (lane == 0)
            rlog[(long)n * E + e] = d;
    }
}

// Each token's routing, a thread a token.
__global__ void route_kernel(float *rw, int32_t *ridx, const float *rlog, int N, int E, int K)
{
    SPK_GRID_LOOP(n, N)
    sp_km_moe_route(rw + n * K, ridx + n * K, rlog + n * E, E, K);
}

// The grouping: slot[s] = the pair in slot s, inv[i] = the slot of pair i, off[e] = expert e's first slot (e <= E),
// used[g] = the g-th expert with slots (g < ng = min(E, NK); -1 past the last).
__global__ void group_kernel(int32_t *slot, int32_t *inv, int32_t *off, int32_t *used, const int32_t *ridx, int NK,
                             int E, int ng)
{
    SPK_GRID_LOOP(t, (long)NK + E + 1 + ng)
    {
        if (t < NK) {
            int s = sp_km_moe_slot(ridx, NK, (int)t);
            slot[s] = (int32_t)t;
            inv[t] = s;
        } else if (t <= NK + E) {
            off[t - NK] = sp_km_moe_first(ridx, NK, (int)(t - NK));
        } else {
            int g = (int)(t - NK - E - 1);
            used[g] = sp_km_moe_used(ridx, NK, E, g);
        }
    }
}

// xs[s] = x[the token of slot s's pair].
__global__ void gather_kernel(float *xs, const float *x, const int32_t *slot, int K, int H, long n)
{
    SPK_GRID_LOOP(e, n)
    xs[e] = x[(long)(slot[e / H] / K) * H + e % H];
}

// Y[s, r] = X[s] . row r of slot s's expert's matrix `which` (rows, cols: every expert's): blockIdx.y the slot, a
// warp a row (lanes over the columns, summed by the butterfly). One instance per encoding, as weights.cu's
// one-weight-a-thread product; the matrix's view in shared memory (NF4's levels are indexed by value). What decode
// steps run where the rows are not whole 16-byte chunks (vec_products), or with sp_cuda_moe_use_vec 0.
constexpr int kSlotWarps = 8;

template <int TYPE>
__global__ void slot_product_kernel(float *Y, const sp_km_w *tab, int which, const int32_t *ridx,
                                    const int32_t *slot, const float *X, int rows, int cols)
{
    __shared__ sp_km_w w;
    int s = blockIdx.y, lane = threadIdx.x & 31, r = blockIdx.x * kSlotWarps + (threadIdx.x >> 5);
    if (threadIdx.x == 0) {
        w = tab[3 * ridx[slot[s]] + which];
        w.type = TYPE;
    }
    __syncthreads();
    if (r >= rows)
        return;
    float d = sp_km_w_dot_part(&w, r, X + (long)s * cols, lane, 32);
    for (int o = 16; o > 0; o >>= 1)
        d += __shfl_xor_sync(0xffffffffu, d, o);
    if (lane == 0)
        Y[(long)s * rows + r] = d;
}

// y[n, c] = sum of the token's pairs' weight times its slot's output, in expert order from 0 (block.c's sum).
__global__ void combine_kernel(float *y, const float *ys, const float *rw, const int32_t *ridx, const int32_t *inv,
                               int K, int H, long n)
{
    SPK_GRID_LOOP(e, n)
    {
        long t = e / H;
        const int32_t *idx = ridx + t * K;
        float v = 0.0f;
        for (int j = 0, after = -1; j < K; j++) {
            int k = sp_km_moe_next(idx, K, after);
            after = idx[k];
            v += rw[t * K + k] * ys[(long)inv[t * K + k] * H + e % H];
        }
        y[e] = v;
    }
}

// Slot s (block s): dys[s] = w dy[token] and dw[pair] = dy[token] . ys[s] (block.c's first loop of moe_backward).
__global__ void slot_grad_kernel(float *dys, float *dw, const float *dy, const float *ys, const float *rw,
                                 const int32_t *slot, int K, int H)
{
    __shared__ float sh[kRouterThreads];
    int s = blockIdx.x, i = slot[s];
    const float *d = dy + (long)(i / K) * H, *o = ys + (long)s * H;
    float w = rw[i], dot = 0.0f;
    for (int c = threadIdx.x; c < H; c += blockDim.x) {
        dot += d[c] * o[c];
        dys[(long)s * H + c] = w * d[c];
    }
    dot = block_sum(dot, sh);
    if (threadIdx.x == 0)
        dw[i] = dot;
}

__global__ void route_bwd_kernel(float *dlog, const float *dw, const float *rw, const int32_t *ridx, int N, int E,
                                 int K)
{
    SPK_GRID_LOOP(n, N)
    sp_km_moe_route_bwd(dlog + n * E, dw + n * K, rw + n * K, ridx + n * K, E, K);
}

// dx[n, c] += dlog[n] . router[:, c] (sp_linear_backward's input gradient through the router), experts in order.
__global__ void router_dx_kernel(float *dx, const float *dlog, const float *router, int E, int H, long n)
{
    SPK_GRID_LOOP(e, n)
    {
        const float *g = dlog + (e / H) * E;
        float v = 0.0f;
        for (int k = 0; k < E; k++)
            v += g[k] * router[(long)k * H + e % H];
        dx[e] += v;
    }
}

// dx[n, c] += each of the token's slots' input gradient, in expert order (slot order: block.c's scatter).
__global__ void scatter_kernel(float *dx, const float *dxs, const int32_t *ridx, const int32_t *inv, int K, int H,
                               long n)
{
    SPK_GRID_LOOP(e, n)
    {
        long t = e / H;
        const int32_t *idx = ridx + t * K;
        float v = dx[e];
        for (int j = 0, after = -1; j < K; j++) {
            int k = sp_km_moe_next(idx, K, after);
            after = idx[k];
            v += dxs[(long)inv[t * K + k] * H + e % H];
        }
        dx[e] = v;
    }
}

// ---------------------------------------------------------------------------------------------------------------
// the steps

sp_status slot_products(sp_cuda_moe *m, int which, float *Y, const float *X, const macts &a, int NK, sp_err *err)
{
    int rows = which == DOWN ? m->d.H : m->d.FF, cols = which == DOWN ? m->d.FF : m->d.H;
    dim3 grid((unsigned)((rows + kSlotWarps - 1) / kSlotWarps), (unsigned)NK);
    void (*kernel)(float *, const sp_km_w *, int, const int32_t *, const int32_t *, const float *, int, int) =
        m->type == SP_KM_F32    ? slot_product_kernel<SP_KM_F32>
        : m->type == SP_KM_BF16 ? slot_product_kernel<SP_KM_BF16>
        : m->type == SP_KM_Q8   ? slot_product_kernel<SP_KM_Q8>
        : m->type == SP_KM_F16  ? slot_product_kernel<SP_KM_F16>
                                : slot_product_kernel<SP_KM_NF4>;
    kernel<<<grid, kSlotWarps * 32, 0, spk::stream_of(m->cu)>>>(Y, m->tab, which, a.ridx, a.slot, X, rows, cols);
    return spk::launched(err, "experts' products");
}

// Decode-sized steps: matrix `which` of every used expert over its slots' rows of X by weights.cu's vectorised
// kernel (sp_cuda_wmat_mul_slots; N: the step's rows, the most an expert has); GATE: with UP and the SwiGLU into Y
// (a.act), the two products kept in a.gate and a.up for a backward.
sp_status vec_products(sp_cuda_moe *m, int which, float *Y, const float *X, const macts &a, int N, sp_err *err)
{
    int NK = N * m->d.topk;
    sp_cuda_smul s = {};
    s.tab = m->tab, s.used = a.used, s.off = a.off, s.which = which;
    s.ng = NK < m->d.experts ? NK : m->d.experts, s.rows = N, s.swiglu = which == GATE;
    s.Y = Y, s.G = a.gate, s.U = a.up;
    return sp_cuda_wmat_mul_slots(m->cu, &m->m[which], &s, X, err);
}

// Whether decode steps take vec_products for matrix `which` over X.
bool vec_on(const sp_cuda_moe *m, int which, const float *X)
{
    return m->vec && m->vec_ok[which] && (which != GATE || m->vec_ok[UP]) && (uintptr_t)X % 16 == 0;
}

// A decode-sized step's experts (N <= SP_CUDA_MOE_DEVICE_ROWS rows): nothing waits for the host.
sp_status decode_experts(sp_cuda_moe *m, const macts &a, int N, sp_err *err)
{
    int NK = N * m->d.topk;
    long nf = (long)NK * m->d.FF;
    sp_status st = SP_OK;
    if (vec_on(m, GATE, a.xs)) {
        st = vec_products(m, GATE, a.act, a.xs, a, N, err);
    } else {
        st = slot_products(m, GATE, a.gate, a.xs, a, NK, err);
        if (st == SP_OK)
            st = slot_products(m, UP, a.up, a.xs, a, NK, err);
        if (st == SP_OK)
            st = sp_cuda_swiglu_fwd(m->cu, a.act, a.gate, a.up, nf, err);
    }
    if (st != SP_OK)
        return st;
    return vec_on(m, DOWN, a.act) ? vec_products(m, DOWN, a.ys, a.act, a, N, err)
                                  : slot_products(m, DOWN, a.ys, a.act, a, NK, err);
}

// The experts' first slots on the host (m->hoff), from the device's grouping.
sp_status fetch_offsets(sp_cuda_moe *m, const int32_t *off, sp_err *err)
{
    sp_status st = sp_cuda_download(m->cu, m->hoff, off, (size_t)(m->d.experts + 1) * sizeof(int), err);
    if (st != SP_OK)
        return sp_err_prefix(err, "experts: ");
    return SP_OK;
}

// Matrix `which` [rows, cols] of every expert that has slots, on its slots' rows: Y[cnt, rows] = X[cnt, cols] W^T,
// or with t, Y[cnt, cols] += X[cnt, rows] W (the input gradient).
sp_status grouped(sp_cuda_moe *m, int which, int t, float *Y, const float *X, sp_err *err)
{
    int rows = which == DOWN ? m->d.H : m->d.FF, cols = which == DOWN ? m->d.FF : m->d.H;
    int in = t ? rows : cols, out = t ? cols : rows;
    for (int e = 0; e < m->d.experts; e++) {
        int o = m->hoff[e], cnt = m->hoff[e + 1] - o;
        if (cnt <= 0)
            continue;
        const sp_cuda_wmat *W = &m->m[3 * e + which];
        sp_status st = t ? sp_cuda_wmat_mul_t_acc(m->cu, W, X + (long)o * in, Y + (long)o * out, cnt, err)
                         : sp_cuda_wmat_mul(m->cu, W, X + (long)o * in, Y + (long)o * out, cnt, err);
        if (st != SP_OK)
            return st;
    }
    return SP_OK;
}

// Route N rows of x and group their pairs (everything but the experts' products).
sp_status route(sp_cuda_moe *m, const float *x, int N, const macts &a, sp_err *err)
{
    int E = m->d.experts, K = m->d.topk, H = m->d.H, NK = N * K;
    cudaStream_t st = spk::stream_of(m->cu);
    router_kernel<<<N, kRouterThreads, 0, st>>>(a.rlog, x, m->router, H, E);
    route_kernel<<<spk::grid_for(N), spk::kThreads, 0, st>>>(a.rw, a.ridx, a.rlog, N, E, K);
    int ng = NK < E ? NK : E;
    group_kernel<<<spk::grid_for((long)NK + E + 1 + ng), spk::kThreads, 0, st>>>(a.slot, a.inv, a.off, a.used, a.ridx,
                                                                                  NK, E, ng);
    long nx = (long)NK * H;
    gather_kernel<<<spk::grid_for(nx), spk::kThreads, 0, st>>>(a.xs, x, a.slot, K, H, nx);
    return spk::launched(err, "routing to the experts");
}

} // namespace

// ---------------------------------------------------------------------------------------------------------------
// the interface

extern "C" sp_moe_dims sp_cuda_moe_dims(const sp_block *b)
{
    sp_moe_dims d = {b->H, b->FF, 0, 0};
    if (b->k.mlp == SP_MLP_MOE)
        d.experts = b->k.n_experts, d.topk = b->k.top_k;
    return d;
}

extern "C" size_t sp_cuda_moe_acts_bytes(const sp_moe_dims *d, size_t N)
{
    macts a;
    return acts_layout(*d, N, &a, NULL);
}

extern "C" size_t sp_cuda_moe_grads_bytes(const sp_moe_dims *d, size_t N)
{
    mgrads g;
    return grads_layout(*d, N, &g, NULL);
}

extern "C" void sp_cuda_moe_free(sp_cuda_moe *m)
{
    if (!m)
        return;
    for (int i = 0; m->m && i < 3 * m->d.experts; i++)
        sp_cuda_wmat_free(m->cu, &m->m[i]);
    free(m->m);
    sp_cuda_free(m->cu, m->tab);
    sp_cuda_free(m->cu, m->router);
    free(m->hoff);
    free(m);
}

extern "C" size_t sp_cuda_moe_bytes(const sp_cuda_moe *m) { return m ? m->bytes : 0; }

extern "C" void sp_cuda_moe_use_vec(sp_cuda_moe *m, int on)
{
    if (m)
        m->vec = on != 0;
}

extern "C" sp_status sp_cuda_moe_upload(sp_cuda *cu, sp_cuda_moe **out, const sp_block *b, sp_err *err)
{
    *out = NULL;
    sp_moe_dims d = sp_cuda_moe_dims(b);
    int n = 3 * d.experts;
    if (d.experts < 1 || d.topk < 1 || d.topk > d.experts || !b->router || b->nqm < 4 + n)
        return sp_errf(err, SP_ERR_ARG, "cuda: not a mixture of experts (%d experts, %d a token, %d matrices)", d.experts,
                       d.topk, b->nqm);
    sp_cuda_moe *m = (sp_cuda_moe *)calloc(1, sizeof *m);
    sp_km_w *tab = (sp_km_w *)calloc((size_t)n, sizeof *tab);
    if (m) {
        m->m = (sp_cuda_wmat *)calloc((size_t)n, sizeof *m->m);
        m->hoff = (int *)calloc((size_t)d.experts + 1, sizeof *m->hoff);
    }
    if (!m || !tab || !m->m || !m->hoff) {
        free(tab);
        if (m)
            free(m->m), free(m->hoff), free(m);
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    }
    m->cu = cu, m->d = d, m->type = b->qm[4].type;
    sp_status st = SP_OK;
    for (int i = 0; st == SP_OK && i < n; i++) {
        const sp_qmat *q = &b->qm[4 + i];
        if ((int)q->type != m->type)
            st = sp_errf(err, SP_ERR_ARG, "cuda: experts in %s and %s", sp_wtype_name(q->type),
                         sp_wtype_name((sp_wtype)m->type));
        else
            st = sp_cuda_wmat_upload(cu, &m->m[i], q, err);
        if (st == SP_OK) {
            tab[i] = m->m[i].w;
            m->bytes += sp_qmat_bytes(q->type, q->rows, q->cols);
        }
    }
    m->vec = 1;
    for (int w = 0; w < 3; w++) {
        m->vec_ok[w] = st == SP_OK;
        for (int e = 0; st == SP_OK && e < d.experts; e++)
            m->vec_ok[w] &= sp_km_chunked(&m->m[3 * e + w].w);
    }
    size_t rb = (size_t)d.experts * d.H * sizeof(float);
    if (st == SP_OK)
        st = sp_cuda_dup(cu, (void **)&m->tab, tab, (size_t)n * sizeof *tab, err);
    if (st == SP_OK)
        st = sp_cuda_dup(cu, (void **)&m->router, b->router, rb, err);
    free(tab);
    if (st != SP_OK) {
        sp_cuda_moe_free(m);
        return sp_err_prefix(err, "uploading the experts: ");
    }
    m->bytes += rb;
    *out = m;
    return SP_OK;
}

extern "C" sp_status sp_cuda_moe_fwd(sp_cuda_moe *m, float *y, const float *x, int N, void *acts, sp_err *err)
{
    if (N <= 0)
        return sp_errf(err, SP_ERR_ARG, "experts: %d rows", N);
    macts a;
    acts_layout(m->d, (size_t)N, &a, acts);
    int NK = N * m->d.topk, H = m->d.H;
    long nf = (long)NK * m->d.FF, ny = (long)N * H;
    sp_status st = route(m, x, N, a, err);
    if (N <= SP_CUDA_MOE_DEVICE_ROWS) { // decode-sized: every slot's expert read on the device, no host round trip
        if (st == SP_OK)
            st = decode_experts(m, a, N, err);
    } else { // the experts' slots as products of several rows
        if (st == SP_OK)
            st = fetch_offsets(m, a.off, err);
        if (st == SP_OK)
            st = grouped(m, GATE, 0, a.gate, a.xs, err);
        if (st == SP_OK)
            st = grouped(m, UP, 0, a.up, a.xs, err);
        if (st == SP_OK)
            st = sp_cuda_swiglu_fwd(m->cu, a.act, a.gate, a.up, nf, err);
        if (st == SP_OK)
            st = grouped(m, DOWN, 0, a.ys, a.act, err);
    }
    if (st != SP_OK)
        return st;
    combine_kernel<<<spk::grid_for(ny), spk::kThreads, 0, spk::stream_of(m->cu)>>>(y, a.ys, a.rw, a.ridx, a.inv,
                                                                                    m->d.topk, H, ny);
    return spk::launched(err, "experts' sum");
}

extern "C" sp_status sp_cuda_moe_bwd(sp_cuda_moe *m, float *dx, const float *dy, int N, const void *acts,
                                     void *grads, sp_err *err)
{
    if (N <= 0)
        return sp_errf(err, SP_ERR_ARG, "experts: %d rows", N);
    macts a;
    mgrads g;
    acts_layout(m->d, (size_t)N, &a, (void *)acts);
    size_t gbytes = grads_layout(m->d, (size_t)N, &g, grads);
    int E = m->d.experts, K = m->d.topk, H = m->d.H, NK = N * K;
    long nf = (long)NK * m->d.FF, nx = (long)N * H;
    cudaStream_t s = spk::stream_of(m->cu);
    sp_status st = fetch_offsets(m, a.off, err);
    if (st == SP_OK)
        st = sp_cuda_zero(m->cu, grads, gbytes, err); // the products below accumulate
    if (st != SP_OK)
        return st;
    slot_grad_kernel<<<NK, kRouterThreads, 0, s>>>(g.dys, g.dw, dy, a.ys, a.rw, a.slot, K, H);
    route_bwd_kernel<<<spk::grid_for(N), spk::kThreads, 0, s>>>(g.dlog, g.dw, a.rw, a.ridx, N, E, K);
    router_dx_kernel<<<spk::grid_for(nx), spk::kThreads, 0, s>>>(dx, g.dlog, m->router, E, H, nx);
    st = spk::launched(err, "routing's backward");
    if (st == SP_OK)
        st = grouped(m, DOWN, 1, g.dact, g.dys, err);
    if (st == SP_OK)
        st = sp_cuda_swiglu_bwd(m->cu, g.dgate, g.dup, g.dact, a.gate, a.up, nf, err);
    if (st == SP_OK)
        st = grouped(m, GATE, 1, g.dxs, g.dgate, err);
    if (st == SP_OK)
        st = grouped(m, UP, 1, g.dxs, g.dup, err);
    if (st != SP_OK)
        return st;
    scatter_kernel<<<spk::grid_for(nx), spk::kThreads, 0, s>>>(dx, g.dxs, a.ridx, a.inv, K, H, nx);
    return spk::launched(err, "experts' backward");
}
