// block.cu - one transformer block on the device (block_cuda.h): core/block.c's flat list of ops, each a kernel of
// kernels.h / attn.cu / fused.cu or a product of weights.cu / gemm.cu, plus the few kernels a graph-replayable
// decode step needs (RoPE and the positions in device memory) and the bias / residual adds. Forward and backward
// follow block.c's forward_acts and backward_acts line for line; a decode step of up to 8 rows runs fused kernels
// (decode_rows_fused: the same sums, fewer launches).
#include <stdlib.h>
#include <string.h>

#include "block_cuda.h"
#include "flash.h"
#include "fused.h"
#include "gemm.h"
#include "kernels.h"
#include "launch.cuh"
#include "moe_cuda.h"

#define TRY(call)                                                                                              \
    do {                                                                                                       \
        sp_status s_ = (call);                                                                                 \
        if (s_ != SP_OK)                                                                                       \
            return s_;                                                                                         \
    } while (0)

namespace {

// ---------------------------------------------------------------------------------------------------------------
// kernels

// out = (y + bias[c]) + res, in block.c's order (lin's bias first, then the residual); bias / res NULL: none.
__global__ void bias_res_kernel(float *out, const float *y, const float *bias, const float *res, int C, long n)
{
    SPK_GRID_LOOP(i, n)
    {
        float v = y[i];
        if (bias)
            v += bias[i % C];
        if (res)
            v += res[i];
        out[i] = v;
    }
}

// RoPE of one position per batch row (pos[b]) on x [B, 1, nh, hd], in place.
__global__ void rope_pos_kernel(float *x, const float *inv_freq, const int *pos, int nh, int hd, long pairs)
{
    SPK_GRID_LOOP(e, pairs)
    sp_km_rope_apply(x, x, inv_freq, pos[(int)(e / ((long)nh * (hd / 2)))], 1, nh, hd, e, 0);
}

// pos[b] = value (add 0) or pos[b] += value (add 1) for b < B.
__global__ void pos_kernel(int *pos, int B, int value, int add)
{
    int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b < B)
        pos[b] = add ? pos[b] + value : value;
}

// ---------------------------------------------------------------------------------------------------------------
// layouts

enum { MQ, MK, MV, MO, MGATE, MUP, MDOWN, NMAT }; // sp_block's qm order for a dense MLP

// Activations of one forward over N rows (block.c's acts; mean1/2 unused by RMSNorm; moe: the experts',
// moe_cuda.h). probs holds the flash attention's log-sum-exp instead when it runs. The bf16 path (half_rows) keeps
// the products' inputs in bf16 instead of ln1, ln2 and act: lnh (norm 1), atth (attention), mh (norm 2, then the
// activation).
struct dacts {
    float *ln1, *mean1, *rstd1, *q, *k, *v, *probs, *att, *h1, *ln2, *mean2, *rstd2, *gate, *up, *act, *y, *moe;
    float *lnh, *atth, *mh; // bf16 storage
    float *pk;              // a forward of its own keys on the bf16 path: q, k, v packed for flash (flash.h)
};

// Gradients of one backward (block.c's grads; half: a product's gradient rounded to bf16).
struct dgrads {
    float *dh1, *dln1, *dln2, *datt, *dq, *dk, *dv, *dqp, *dkp, *dact, *dgate, *dup, *half, *dmoe;
};

struct shape {
    size_t H, Q, KV, FF; // FF: the dense MLP's (0 for experts)
    int two, swiglu, rope;
    sp_moe_dims moe;     // experts 0: dense
    int nh, nkv, hd;
};

// Carves buffers of the given float counts out of base (NULL: only counts), each 256-byte aligned; returns bytes.
size_t carve(float **const *ptrs, const size_t *sizes, int n, char *base)
{
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (base)
            *ptrs[i] = sizes[i] ? (float *)(base + total) : NULL;
        total += (sizes[i] * sizeof(float) + 255) & ~(size_t)255;
    }
    return total;
}

// Carves the activations of N rows (half: the bf16 path's buffers instead of ln1, ln2, act; kHalfPacked: and the
// packed attention operands of a forward without a cache).
constexpr int kHalfPacked = 2;

size_t acts_layout(const shape &s, dacts *a, size_t N, size_t probs_n, int half, char *base)
{
    size_t two = (size_t)s.two, ff = N * s.FF, f = half ? 0 : 1, h = half ? 1 : 0, mid = s.FF > s.H ? s.FF : s.H;
    size_t pk = half == kHalfPacked ? (sp_cuda_flash_packed_bytes(1, (int)N, s.nh, s.nkv, s.hd) + 3) / 4 : 0;
    size_t sizes[] = {f * N * s.H, N,  N, N * s.Q, N * s.KV, N * s.KV, probs_n, N * s.Q, N * s.H, f * two * N * s.H,
                      two * N,     two * N, s.swiglu ? ff : 0, ff, f * ff, N * s.H,
                      s.moe.experts ? sp_cuda_moe_acts_bytes(&s.moe, N) / sizeof(float) : 0, h * (N * s.H + 1) / 2,
                      h * (N * s.Q + 1) / 2, h * (N * mid + 1) / 2, pk};
    float **const ptrs[] = {&a->ln1, &a->mean1, &a->rstd1, &a->q,    &a->k,  &a->v,   &a->probs,
                            &a->att, &a->h1,    &a->ln2,   &a->mean2, &a->rstd2, &a->gate, &a->up,
                            &a->act, &a->y,     &a->moe,   &a->lnh,   &a->atth, &a->mh,  &a->pk};
    return carve(ptrs, sizes, (int)(sizeof sizes / sizeof *sizes), base);
}

size_t grads_layout(const shape &s, dgrads *g, size_t N, char *base)
{
    size_t two = (size_t)s.two, rope = (size_t)s.rope, ff = N * s.FF, widest = s.FF > s.Q ? s.FF : s.Q;
    widest = widest > s.H ? widest : s.H;
    size_t sizes[] = {N * s.H, N * s.H, two * N * s.H, N * s.Q, N * s.Q, N * s.KV, N * s.KV, rope * N * s.Q,
                      rope * N * s.KV, ff, s.swiglu ? ff : 0, ff, (N * widest + 1) / 2,
                      s.moe.experts ? sp_cuda_moe_grads_bytes(&s.moe, N) / sizeof(float) : 0};
    float **const ptrs[] = {&g->dh1, &g->dln1, &g->dln2, &g->datt, &g->dq,    &g->dk,  &g->dv,
                            &g->dqp, &g->dkp,  &g->dact, &g->dgate, &g->dup, &g->half, &g->dmoe};
    return carve(ptrs, sizes, (int)(sizeof sizes / sizeof *sizes), base);
}

shape shape_of(const sp_block *b)
{
    sp_moe_dims moe = sp_cuda_moe_dims(b);
    shape s = {(size_t)b->H, (size_t)b->nh * b->hd, (size_t)b->nkv * b->hd, moe.experts ? 0 : (size_t)b->FF,
               b->ln2_w != NULL, b->k.mlp == SP_MLP_SWIGLU, b->k.pos == SP_POS_ROPE, moe, b->nh, b->nkv, b->hd};
    return s;
}

// Rows of decode steps and what a graph of them needs: each row's caches and position (device tables), the rows'
// activations (scores: scap a head), input and output, and the graph. A cache holds one for its rows (its
// positions advanced on the device by the step itself); the block one for batches of several caches (the tables
// uploaded before each step).
struct decoder {
    int N, scap;
    float **kp, **vp; // [N] device: each row's keys and values [cap, nkv * hd]
    int *pos;         // [N] device: the position each row's step writes
    void *buf;        // tables, activations, xin, xout
    dacts a;
    float *xin, *xout;
    const float *in;  // what the step reads: the caller's input, or xin (io_moved)
    float *out;       // and writes: the caller's output, or xout
    int io_moved;     // the caller's buffers moved under a graph: graphs over xin and xout from now on
    int advance;      // the step adds 1 to pos (a cache's own rows)
    cudaGraphExec_t exec;
    void *exec_ws;    // the context's workspace when the graph was captured
    int exec_fused;   // and the block's fused setting (graph_key)
    const float *exec_in;
    float *exec_out;  // and in and out
    int steps;        // steps run (the first runs plainly)
    int graph_failed; // a capture failed: launch one by one from now on
};

// Carves a decoder's buffers out of base (NULL: only counts); returns bytes. The tables come first.
size_t decoder_layout(const shape &s, int nh, decoder *d, char *base)
{
    size_t N = (size_t)d->N, tab = ((2 * N * sizeof(float *) + N * sizeof(int)) + 255) & ~(size_t)255;
    if (base) {
        d->kp = (float **)(void *)base, d->vp = d->kp + N;
        d->pos = (int *)(void *)(d->vp + N);
    }
    char *b = base ? base + tab : NULL;
    size_t n = acts_layout(s, &d->a, N, N * nh * (size_t)d->scap, 0, b);
    size_t io[] = {N * s.H, N * s.H};
    float **const ptrs[] = {&d->xin, &d->xout};
    return tab + n + carve(ptrs, io, 2, b ? b + n : NULL);
}

constexpr int kGraphRows = 8; // decode products fused (weights.cu's limit): no workspace, safe to capture

} // namespace

struct sp_cuda_block {
    sp_cuda *cu;
    sp_block_kind k;
    shape s;
    int H, nh, nkv, hd, FF;
    float eps;
    sp_cuda_wmat m[NMAT]; // a mixture of experts: q, k, v, o only
    sp_cuda_moe *moe;     // its router and experts (NULL: a dense MLP)
    float *ln1_w, *ln1_b, *bq, *bk, *bv, *bo, *ln2_w, *ln2_b, *b_up, *b_down, *inv_freq, *slopes;
    size_t weight_bytes;
    int graphs;
    int flash; // flash attention and the bf16 path where they apply (sp_cuda_block_use_flash)

    int fused; // decode steps of up to kGraphRows rows: 0 the plain kernels, 1 fused ones, 2 fused and dependent
    int moe_vec; // and their experts' products vectorised (sp_cuda_block_use_moe_vec)
    int prefetch; // MiB of the next product's weights a fused step's norms and attention ask L2 for (0: none)
    void *ws;  // forward / backward buffers, grown
    size_t ws_bytes;
    decoder bat;    // batches of several caches (sp_cuda_block_decode_batch)
    void *bat_host; // its tables on the host
};

struct sp_cuda_kv {
    sp_cuda_block *cb;
    sp_cuda_budget *budget;
    size_t bytes;
    int B, cap, len;
    float *k, *v;
    decoder d; // its rows' decode steps (d.pos: the position each row's next step writes)
};

static void decoder_free(sp_cuda *cu, decoder *d);

// ---------------------------------------------------------------------------------------------------------------
// host-side planning

extern "C" sp_status sp_cuda_budget_take(sp_cuda_budget *bu, size_t bytes, sp_err *err)
{
    if (!bu)
        return SP_OK;
    if (bytes > bu->limit || bu->used > bu->limit - bytes)
        return sp_errf(err, SP_ERR_NOMEM, "kv cache: %.1f MB more would exceed the budget (%.1f of %.1f MB held)",
                       bytes / 1e6, bu->used / 1e6, bu->limit / 1e6);
    bu->used += bytes;
    return SP_OK;
}

extern "C" void sp_cuda_budget_give(sp_cuda_budget *bu, size_t bytes)
{
    if (bu)
        bu->used = bytes > bu->used ? 0 : bu->used - bytes;
}

extern "C" sp_status sp_cuda_block_supported(const sp_block *b, sp_err *err)
{
    if (b->nh <= 0 || b->nkv <= 0 || b->nh % b->nkv || b->hd <= 0 || (b->k.pos == SP_POS_ROPE && b->hd % 2))
        return sp_errf(err, SP_ERR_ARG, "cuda: block of %d heads on %d KV heads of %d", b->nh, b->nkv, b->hd);
    return SP_OK;
}

// A cache's device bytes: keys and values, and its rows' decoder.
static size_t kv_bytes(const shape &s, int nh, int B, int cap)
{
    decoder d = {};
    d.N = B, d.scap = cap;
    return 2 * (size_t)B * cap * s.KV * sizeof(float) + decoder_layout(s, nh, &d, NULL);
}

extern "C" size_t sp_cuda_kv_bytes(const sp_block *b, int B, int cap) { return kv_bytes(shape_of(b), b->nh, B, cap); }

// ---------------------------------------------------------------------------------------------------------------
// upload

static sp_status put_vec(sp_cuda_block *cb, float **d, const float *h, size_t n, sp_err *err)
{
    *d = NULL;
    if (!h || !n)
        return SP_OK;
    cb->weight_bytes += n * sizeof(float);
    return sp_cuda_dup(cb->cu, (void **)d, h, n * sizeof(float), err);
}

extern "C" sp_status sp_cuda_block_upload(sp_cuda *cu, sp_cuda_block **out, const sp_block *b, sp_err *err)
{
    *out = NULL;
    TRY(sp_cuda_block_supported(b, err));
    sp_cuda_block *cb = (sp_cuda_block *)calloc(1, sizeof *cb);
    if (!cb)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    cb->cu = cu;
    cb->k = b->k;
    cb->s = shape_of(b);
    cb->H = b->H, cb->nh = b->nh, cb->nkv = b->nkv, cb->hd = b->hd, cb->FF = b->FF, cb->eps = b->eps;
    cb->graphs = 1;
    cb->flash = 1;
    cb->fused = 2;
    cb->moe_vec = 1;
    static const int prefetch = [] { // SEPAL_DECODE_PREFETCH=MiB: the default of sp_cuda_block_use_prefetch (0)
        const char *e = getenv("SEPAL_DECODE_PREFETCH");
        return e ? atoi(e) : 0;
    }();
    sp_cuda_block_use_prefetch(cb, prefetch);
    size_t H = (size_t)b->H, Q = cb->s.Q, KV = cb->s.KV, FF = cb->s.FF;
    sp_status st = SP_OK;
    int nm = b->k.mlp == SP_MLP_MOE ? MO + 1 : NMAT; // the experts' matrices go to sp_cuda_moe_upload
    for (int i = 0; st == SP_OK && i < nm && i < b->nqm; i++)
        if (b->qm[i].q) {
            st = sp_cuda_wmat_upload(cu, &cb->m[i], &b->qm[i], err);
            cb->weight_bytes += sp_qmat_bytes(b->qm[i].type, b->qm[i].rows, b->qm[i].cols);
        }
    struct {
        float **d;
        const float *h;
        size_t n;
    } vecs[] = {{&cb->ln1_w, b->ln1_w, H},  {&cb->ln1_b, b->ln1_b, H}, {&cb->bq, b->bq, Q},
                {&cb->bk, b->bk, KV},       {&cb->bv, b->bv, KV},      {&cb->bo, b->bo, H},
                {&cb->ln2_w, b->ln2_w, H},  {&cb->ln2_b, b->ln2_b, H}, {&cb->b_up, b->b_up, FF},
                {&cb->b_down, b->b_down, H}, {&cb->slopes, b->alibi, (size_t)b->nh},
                {&cb->inv_freq, b->rope ? b->rope->inv_freq : NULL, (size_t)b->hd / 2}};
    for (size_t i = 0; st == SP_OK && i < sizeof vecs / sizeof *vecs; i++)
        st = put_vec(cb, vecs[i].d, vecs[i].h, vecs[i].n, err);
    if (st == SP_OK && b->k.mlp == SP_MLP_MOE) {
        st = sp_cuda_moe_upload(cu, &cb->moe, b, err);
        cb->weight_bytes += sp_cuda_moe_bytes(cb->moe);
    }
    if (st != SP_OK) {
        sp_cuda_block_free(cb);
        return sp_err_prefix(err, "uploading a block: ");
    }
    // not weights (sp_block_bytes counts neither): RoPE's frequencies, ALiBi's slopes
    cb->weight_bytes -= ((cb->inv_freq ? (size_t)b->hd / 2 : 0) + (cb->slopes ? (size_t)b->nh : 0)) * sizeof(float);
    *out = cb;
    return SP_OK;
}

extern "C" void sp_cuda_block_free(sp_cuda_block *cb)
{
    if (!cb)
        return;
    for (int i = 0; i < NMAT; i++)
        sp_cuda_wmat_free(cb->cu, &cb->m[i]);
    float *vecs[] = {cb->ln1_w, cb->ln1_b, cb->bq,   cb->bk,     cb->bv,       cb->bo,
                     cb->ln2_w, cb->ln2_b, cb->b_up, cb->b_down, cb->inv_freq, cb->slopes};
    for (size_t i = 0; i < sizeof vecs / sizeof *vecs; i++)
        sp_cuda_free(cb->cu, vecs[i]);
    sp_cuda_moe_free(cb->moe);
    sp_cuda_free(cb->cu, cb->ws);
    decoder_free(cb->cu, &cb->bat);
    free(cb->bat_host);
    free(cb);
}

extern "C" size_t sp_cuda_block_bytes(const sp_cuda_block *cb) { return cb->weight_bytes; }
extern "C" void sp_cuda_block_use_graphs(sp_cuda_block *cb, int on) { cb->graphs = on != 0; }
extern "C" void sp_cuda_block_use_flash(sp_cuda_block *cb, int on) { cb->flash = on != 0; }

// Flash attention (flash.h) for the forward and prefill and their backward: weights whose products already
// round their inputs to bf16 (bf16, int8, NF4) and heads the kernels take, unless turned off. (fp16 weights take
// their inputs in fp16: the f32 path's kernels, their GEMMs casting to fp16 themselves.)
static bool use_flash(const sp_cuda_block *cb)
{
    for (int i = 0; i < NMAT; i++)
        if (cb->m[i].q && (cb->m[i].w.type == SP_KM_F32 || cb->m[i].w.type == SP_KM_F16))
            return false;
    return cb->flash && sp_cuda_flash_ok(cb->hd);
}

// The bf16 path for N rows: fused kernels hand the products their inputs in bf16 where sp_cuda_wmat_mul would
// round them itself (its GEMMs, beyond 32 rows).
constexpr size_t kHalfRows = 32;
static int half_rows(const sp_cuda_block *cb, size_t N) { return !cb->moe && use_flash(cb) && N > kHalfRows; }
// The same for a forward of its own keys (no cache): its packed attention operands kept too, unless the
// environment's SEPAL_FLASH_PACKED is 0 (read once: the packing of the flash kernels themselves then, as before).
static int half_own(const sp_cuda_block *cb, size_t N)
{
    static const int packed = [] {
        const char *e = getenv("SEPAL_FLASH_PACKED");
        return !(e && !strcmp(e, "0"));
    }();
    return half_rows(cb, N) ? (packed ? kHalfPacked : 1) : 0;
}

extern "C" void sp_cuda_block_use_fused(sp_cuda_block *cb, int level)
{
    cb->fused = level < 0 ? 0 : level > 2 ? 2 : level;
}

extern "C" void sp_cuda_block_use_moe_vec(sp_cuda_block *cb, int on)
{
    cb->moe_vec = on != 0;
    sp_cuda_moe_use_vec(cb->moe, cb->moe_vec);
}

extern "C" void sp_cuda_block_use_prefetch(sp_cuda_block *cb, int mib)
{
    cb->prefetch = mib < 0 ? 0 : mib > 255 ? 255 : mib;
}

// The settings a captured decode step depends on: another value, another graph.
static int graph_key(const sp_cuda_block *cb) { return cb->fused | cb->moe_vec << 2 | cb->prefetch << 3; }

// The block's buffers: at least bytes (grown after a sync: queued kernels may use the old ones).
static sp_status block_ws(sp_cuda_block *cb, size_t bytes, sp_err *err)
{
    if (bytes <= cb->ws_bytes)
        return SP_OK;
    TRY(sp_cuda_sync(cb->cu, err));
    sp_cuda_free(cb->cu, cb->ws);
    cb->ws = NULL;
    cb->ws_bytes = 0;
    TRY(sp_cuda_alloc(cb->cu, &cb->ws, bytes, err));
    cb->ws_bytes = bytes;
    return SP_OK;
}

// ---------------------------------------------------------------------------------------------------------------
// the ops of a forward

static sp_status bias_res(sp_cuda_block *cb, float *out, const float *y, const float *bias, const float *res, int N,
                          int C, sp_err *err)
{
    long n = (long)N * C;
    bias_res_kernel<<<spk::grid_for(n), spk::kThreads, 0, spk::stream_of(cb->cu)>>>(out, y, bias, res, C, n);
    return spk::launched(err, "bias and residual");
}

// Y[N, rows] = X W^T (+ bias): block.c's lin.
static sp_status lin(sp_cuda_block *cb, int which, float *Y, const float *X, const float *bias, int N, sp_err *err)
{
    TRY(sp_cuda_wmat_mul(cb->cu, &cb->m[which], X, Y, N, err));
    return bias ? bias_res(cb, Y, Y, bias, NULL, N, cb->m[which].w.rows, err) : SP_OK;
}

static sp_status norm_fwd(sp_cuda_block *cb, float *out, float *mean, float *rstd, const float *x, const float *w,
                          const float *b, int N, sp_err *err)
{
    if (cb->k.norm == SP_NORM_RMS)
        return sp_cuda_rmsnorm_fwd(cb->cu, out, rstd, x, w, N, cb->H, cb->eps, err);
    return sp_cuda_layernorm_fwd(cb->cu, out, mean, rstd, x, w, b, N, cb->H, cb->eps, err);
}

// lin from X in bf16 (the bf16 path).
static sp_status lin_h(sp_cuda_block *cb, int which, float *Y, const void *Xh, const float *bias, int N, sp_err *err)
{
    TRY(sp_cuda_wmat_mul_h(cb->cu, &cb->m[which], Xh, Y, N, err));
    return bias ? bias_res(cb, Y, Y, bias, NULL, N, cb->m[which].w.rows, err) : SP_OK;
}

// Norm 1 and the q, k, v projections of N rows.
static sp_status attn_in(sp_cuda_block *cb, const float *inp, int N, dacts *a, sp_err *err)
{
    if (a->lnh) {
        TRY(sp_cuda_norm_h(cb->cu, a->lnh, a->mean1, a->rstd1, NULL, inp, NULL, NULL, cb->ln1_w, cb->ln1_b, N, cb->H,
                           cb->eps, cb->k.norm == SP_NORM_RMS, err));
        TRY(lin_h(cb, MQ, a->q, a->lnh, cb->bq, N, err));
        TRY(lin_h(cb, MK, a->k, a->lnh, cb->bk, N, err));
        return lin_h(cb, MV, a->v, a->lnh, cb->bv, N, err);
    }
    TRY(norm_fwd(cb, a->ln1, a->mean1, a->rstd1, inp, cb->ln1_w, cb->ln1_b, N, err));
    TRY(lin(cb, MQ, a->q, a->ln1, cb->bq, N, err));
    TRY(lin(cb, MK, a->k, a->ln1, cb->bk, N, err));
    return lin(cb, MV, a->v, a->ln1, cb->bv, N, err);
}

// y[N, H] = mlp(x) without the down projection's bias (bias_res adds it with the residual).
static sp_status mlp_fwd(sp_cuda_block *cb, float *y, const float *x, int N, dacts *a, sp_err *err)
{
    if (cb->moe)
        return sp_cuda_moe_fwd(cb->moe, y, x, N, a->moe, err);
    long n = (long)N * cb->FF;
    if (cb->k.mlp == SP_MLP_SWIGLU) {
        TRY(lin(cb, MGATE, a->gate, x, NULL, N, err));
        TRY(lin(cb, MUP, a->up, x, NULL, N, err));
        TRY(sp_cuda_swiglu_fwd(cb->cu, a->act, a->gate, a->up, n, err));
    } else {
        TRY(lin(cb, MUP, a->up, x, cb->b_up, N, err));
        TRY(sp_cuda_gelu_fwd(cb->cu, a->act, a->up, n, cb->k.mlp == SP_MLP_GELU_TANH, err));
    }
    return sp_cuda_wmat_mul(cb->cu, &cb->m[MDOWN], a->act, y, N, err);
}

// mlp_fwd on the bf16 path: x, and the activation into a->mh, in bf16.
static sp_status mlp_fwd_h(sp_cuda_block *cb, float *y, const void *x, int N, dacts *a, sp_err *err)
{
    long n = (long)N * cb->FF;
    if (cb->k.mlp == SP_MLP_SWIGLU) {
        TRY(lin_h(cb, MGATE, a->gate, x, NULL, N, err));
        TRY(lin_h(cb, MUP, a->up, x, NULL, N, err));
        TRY(sp_cuda_swiglu_h(cb->cu, a->mh, a->gate, a->up, n, err));
    } else {
        TRY(lin_h(cb, MUP, a->up, x, NULL, N, err));
        TRY(sp_cuda_gelu_h(cb->cu, a->mh, a->up, cb->b_up, n, cb->FF, cb->k.mlp == SP_MLP_GELU_TANH, err));
    }
    return sp_cuda_wmat_mul_h(cb->cu, &cb->m[MDOWN], a->mh, y, N, err);
}

// attn_out_mlp on the bf16 path: the residual, norm 2 and its bf16 rounding in one kernel (a sequential block).
static sp_status attn_out_mlp_h(sp_cuda_block *cb, float *out, const float *inp, int N, dacts *a, sp_err *err)
{
    int rms = cb->k.norm == SP_NORM_RMS;
    TRY(sp_cuda_wmat_mul_h(cb->cu, &cb->m[MO], a->atth, a->h1, N, err));
    const float *m = a->lnh;
    if (cb->ln2_w && !cb->k.parallel) {
        TRY(sp_cuda_norm_h(cb->cu, a->mh, a->mean2, a->rstd2, a->h1, a->h1, cb->bo, inp, cb->ln2_w, cb->ln2_b, N,
                           cb->H, cb->eps, rms, err));
        m = a->mh;
    } else {
        TRY(bias_res(cb, a->h1, a->h1, cb->bo, inp, N, cb->H, err));
        if (cb->ln2_w) {
            TRY(sp_cuda_norm_h(cb->cu, a->mh, a->mean2, a->rstd2, NULL, inp, NULL, NULL, cb->ln2_w, cb->ln2_b, N,
                               cb->H, cb->eps, rms, err));
            m = a->mh;
        }
    }
    TRY(mlp_fwd_h(cb, a->y, m, N, a, err));
    return bias_res(cb, out, a->y, cb->b_down, a->h1, N, cb->H, err);
}

// h1 = x + att Wo^T + bo, then out = h1 + mlp(n2(h1) or n2(x) or n1(x)) (+ the down projection's bias).
static sp_status attn_out_mlp(sp_cuda_block *cb, float *out, const float *inp, int N, dacts *a, sp_err *err)
{
    if (a->atth)
        return attn_out_mlp_h(cb, out, inp, N, a, err);
    TRY(sp_cuda_wmat_mul(cb->cu, &cb->m[MO], a->att, a->h1, N, err));
    TRY(bias_res(cb, a->h1, a->h1, cb->bo, inp, N, cb->H, err));
    const float *m = a->ln1;
    if (cb->ln2_w) {
        TRY(norm_fwd(cb, a->ln2, a->mean2, a->rstd2, cb->k.parallel ? inp : a->h1, cb->ln2_w, cb->ln2_b, N, err));
        m = a->ln2;
    }
    TRY(mlp_fwd(cb, a->y, m, N, a, err));
    return bias_res(cb, out, a->y, cb->b_down, a->h1, N, cb->H, err);
}

static sp_status set_pos(sp_cuda *cu, int *pos, int B, int value, int add, sp_err *err)
{
    pos_kernel<<<(B + 127) / 128, 128, 0, spk::stream_of(cu)>>>(pos, B, value, add);
    return spk::launched(err, "cache positions");
}

// The forward of T positions from pos0 over B rows (block.c's forward_acts); with kv, appended to its cache.
static sp_status forward_acts(sp_cuda_block *cb, float *out, const float *inp, int B, int T, int pos0, sp_cuda_kv *kv,
                              dacts *a, sp_err *err)
{
    int N = B * T;
    TRY(attn_in(cb, inp, N, a, err));
    if (a->pk && !kv) { // RoPE and flash's packing in one pass, the packed operands kept for the backward
        TRY(sp_cuda_flash_pack(cb->cu, a->pk, a->q, a->k, a->v, cb->inv_freq, pos0, B, T, cb->nh, cb->nkv, cb->hd,
                               err));
        TRY(sp_cuda_flash_fwd_packed(cb->cu, a->att, a->atth, a->probs, a->pk, cb->slopes, B, T, cb->nh, cb->nkv,
                                     cb->hd, err));
        return attn_out_mlp(cb, out, inp, N, a, err);
    }
    if (cb->inv_freq) {
        TRY(sp_cuda_rope_fwd(cb->cu, a->q, a->q, cb->inv_freq, pos0, B, T, cb->nh, cb->hd, err));
        TRY(sp_cuda_rope_fwd(cb->cu, a->k, a->k, cb->inv_freq, pos0, B, T, cb->nkv, cb->hd, err));
    }
    const float *K = a->k, *V = a->v;
    int cap = T, past = 0, row = cb->nkv * cb->hd;
    if (kv) {
        TRY(sp_cuda_kv_append(cb->cu, kv->k, a->k, B, T, kv->cap, kv->len, row, err));
        TRY(sp_cuda_kv_append(cb->cu, kv->v, a->v, B, T, kv->cap, kv->len, row, err));
        K = kv->k, V = kv->v, cap = kv->cap, past = kv->len;
    }
    if (use_flash(cb))
        TRY(sp_cuda_flash_fwd(cb->cu, a->att, a->atth, a->probs, a->q, K, V, cb->slopes, B, T, past, cb->nh, cb->nkv,
                              cb->hd, cap, err));
    else
        TRY(sp_cuda_attn_prefill(cb->cu, a->att, a->probs, a->q, K, V, cb->slopes, B, T, past, cb->nh, cb->nkv,
                                 cb->hd, cap, err));
    TRY(attn_out_mlp(cb, out, inp, N, a, err));
    if (kv) {
        kv->len += T;
        TRY(set_pos(cb->cu, kv->d.pos, B, kv->len, 0, err));
    }
    return SP_OK;
}

// ---------------------------------------------------------------------------------------------------------------
// decode steps

// Norm 1 or 2 of a fused decode step (RMSNorm as a dependent launch when pdl, asking L2 for pf's weights).
static sp_status norm_dep(sp_cuda_block *cb, float *out, float *mean, float *rstd, const float *x, const float *w,
                          const float *b, int N, int pdl, const sp_cuda_pf *pf, sp_err *err)
{
    if (cb->k.norm == SP_NORM_RMS)
        return sp_cuda_rmsnorm_fwd_dep(cb->cu, out, rstd, x, w, N, cb->H, cb->eps, pdl, pf, err);
    return norm_fwd(cb, out, mean, rstd, x, w, b, N, err);
}

// What the kernel before the product of matrices mats[0..n) asks L2 for (cb->prefetch MiB in all, none when 0):
// the first bytes of each in the order its blocks read them, one after another (q, k, v), or side by side (SwiGLU's
// gate and up, a block's rows of both at once: an equal share of each). Values only (Q8 / NF4 scales are small).
static sp_cuda_pf prefetch_of(const sp_cuda_block *cb, const int *mats, int n, bool side_by_side)
{
    sp_cuda_pf pf = {};
    size_t left = (size_t)cb->prefetch << 20, each = n ? left / (size_t)n : 0;
    for (int i = 0; i < n && i < 3 && left; i++) {
        const sp_km_w &w = cb->m[mats[i]].w;
        size_t bytes = (size_t)w.rows * (size_t)sp_km_row_bytes(&w), take = side_by_side ? each : left;
        if ((uintptr_t)w.q % 16) // (the prefetch's alignment)
            continue;
        pf.p[i] = w.q;
        pf.n[i] = take < bytes ? take : bytes;
        left -= pf.n[i];
    }
    return pf;
}

// decode_rows fused (cb->fused, d->N <= kGraphRows): norm 1 (launched plainly: it follows a copy or starts a graph);
// q, k, v in one product (then their biases); RoPE, the cache's append and attention in one kernel; o_proj with its
// bias and the residual; norm 2; SwiGLU's gate and up products with the activation in one (GELU MLPs: the plain up
// product and activation; Mixtral: its router and experts, moe_cuda.h); down_proj with its bias and the residual
// into d->out, the positions advanced in its launch (d->advance; no kernel of their own). The same sums as
// decode_rows' plain kernels, each kernel after norm 1 a programmatic dependent of the one before it when
// cb->fused is 2 (it streams its weights while that one finishes).
static sp_status decode_rows_fused(sp_cuda_block *cb, decoder *d, sp_err *err)
{
    int N = d->N, pdl = cb->fused > 1;
    dacts *a = &d->a;
    sp_cuda *cu = cb->cu;
    static const int qkv_m[] = {MQ, MK, MV}, o_m[] = {MO}, gu_m[] = {MGATE, MUP};
    bool swiglu = !cb->moe && cb->k.mlp == SP_MLP_SWIGLU;
    sp_cuda_pf pf_qkv = prefetch_of(cb, qkv_m, 3, false), pf_o = prefetch_of(cb, o_m, 1, false);
    sp_cuda_pf pf_gu = prefetch_of(cb, gu_m, swiglu ? 2 : 0, true);
    // norm 1 launched plainly (after a copy, or first)
    TRY(norm_dep(cb, a->ln1, a->mean1, a->rstd1, d->in, cb->ln1_w, cb->ln1_b, N, 0, &pf_qkv, err));
    sp_cuda_dmul qkv = {{&cb->m[MQ], &cb->m[MK], &cb->m[MV]}, {a->q, a->k, a->v}, 3, 0, pdl, NULL, NULL, NULL, 0};
    TRY(sp_cuda_wmat_mul_fused(cu, &qkv, a->ln1, N, err));
    const float *bias[3] = {cb->bq, cb->bk, cb->bv};
    for (int i = 0; i < 3; i++)
        if (bias[i])
            TRY(bias_res(cb, qkv.Y[i], qkv.Y[i], bias[i], NULL, N, cb->m[MQ + i].w.rows, err));
    TRY(sp_cuda_rope_attn_decode(cu, a->att, a->q, a->k, a->v, d->kp, d->vp, cb->inv_freq, cb->slopes, a->probs,
                                 d->pos, N, cb->nh, cb->nkv, cb->hd, d->scap, pdl, &pf_o, err));
    sp_cuda_dmul o = {{&cb->m[MO]}, {a->h1}, 1, 0, pdl, cb->bo, d->in, NULL, 0};
    TRY(sp_cuda_wmat_mul_fused(cu, &o, a->att, N, err));
    const float *m = a->ln1;
    if (cb->ln2_w) {
        TRY(norm_dep(cb, a->ln2, a->mean2, a->rstd2, cb->k.parallel ? d->in : a->h1, cb->ln2_w, cb->ln2_b, N, pdl,
                     &pf_gu, err));
        m = a->ln2;
    }
    if (cb->moe) { // the router and experts as in a forward (moe_cuda.h), then the residual
        TRY(mlp_fwd(cb, a->y, m, N, a, err));
        TRY(bias_res(cb, d->out, a->y, cb->b_down, a->h1, N, cb->H, err));
        return d->advance ? set_pos(cu, d->pos, N, 1, 1, err) : SP_OK;
    }
    if (cb->k.mlp == SP_MLP_SWIGLU) {
        sp_cuda_dmul gu = {{&cb->m[MGATE], &cb->m[MUP]}, {a->act}, 2, 1, pdl, NULL, NULL, NULL, 0};
        TRY(sp_cuda_wmat_mul_fused(cu, &gu, m, N, err));
    } else {
        TRY(lin(cb, MUP, a->up, m, cb->b_up, N, err));
        TRY(sp_cuda_gelu_fwd(cu, a->act, a->up, (long)N * cb->FF, cb->k.mlp == SP_MLP_GELU_TANH, err));
    }
    sp_cuda_dmul down = {{&cb->m[MDOWN]}, {d->out}, 1, 0, pdl, cb->b_down, a->h1, d->advance ? d->pos : NULL, N};
    return sp_cuda_wmat_mul_fused(cu, &down, a->act, N, err); // (the positions advanced by it)
}

// One decode step of d's rows from d->in to d->out at the positions d->pos holds (then advanced when d->advance):
// the same launches whatever the positions, so a graph of them replays any step.
static sp_status decode_rows(sp_cuda_block *cb, decoder *d, sp_err *err)
{
    if (cb->fused && d->N <= kGraphRows)
        return decode_rows_fused(cb, d, err);
    int N = d->N;
    dacts *a = &d->a;
    cudaStream_t s = spk::stream_of(cb->cu);
    TRY(attn_in(cb, d->in, N, a, err));
    if (cb->inv_freq) {
        long pq = (long)N * cb->nh * (cb->hd / 2), pk = (long)N * cb->nkv * (cb->hd / 2);
        rope_pos_kernel<<<spk::grid_for(pq), spk::kThreads, 0, s>>>(a->q, cb->inv_freq, d->pos, cb->nh, cb->hd, pq);
        rope_pos_kernel<<<spk::grid_for(pk), spk::kThreads, 0, s>>>(a->k, cb->inv_freq, d->pos, cb->nkv, cb->hd, pk);
        TRY(spk::launched(err, "rope"));
    }
    // rotated above: the cache's append and attention
    TRY(sp_cuda_rope_attn_decode(cb->cu, a->att, a->q, a->k, a->v, d->kp, d->vp, NULL, cb->slopes, a->probs, d->pos,
                                 N, cb->nh, cb->nkv, cb->hd, d->scap, 0, NULL, err));
    TRY(attn_out_mlp(cb, d->out, d->in, N, a, err));
    return d->advance ? set_pos(cb->cu, d->pos, N, 1, 1, err) : SP_OK;
}

// Captures decode_rows into d->exec; on any failure nothing is left captured and d falls back to launches.
static void capture(sp_cuda_block *cb, decoder *d, void *ws)
{
    cudaStream_t s = spk::stream_of(cb->cu);
    cudaGraph_t g = NULL;
    sp_err scratch = {};
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        cudaGetLastError();
        d->graph_failed = 1;
        return;
    }
    sp_status st = decode_rows(cb, d, &scratch);
    cudaError_t e = cudaStreamEndCapture(s, &g);
    if (st == SP_OK && e == cudaSuccess && g)
        e = cudaGraphInstantiate(&d->exec, g, 0);
    if (g)
        cudaGraphDestroy(g);
    if (st != SP_OK || e != cudaSuccess) {
        cudaGetLastError(); // a capture that broke leaves no sticky error; clear the last one
        d->exec = NULL;
        d->graph_failed = 1;
        return;
    }
    d->exec_ws = ws;
    d->exec_fused = graph_key(cb);
    d->exec_in = d->in, d->exec_out = d->out;
}

static void drop_graph(decoder *d)
{
    if (d->exec)
        cudaGraphExecDestroy(d->exec);
    d->exec = NULL;
}

static sp_status decoder_alloc(sp_cuda_block *cb, decoder *d, int N, int scap, int advance, sp_err *err)
{
    memset(d, 0, sizeof *d);
    d->N = N, d->scap = scap, d->advance = advance;
    TRY(sp_cuda_alloc(cb->cu, &d->buf, decoder_layout(cb->s, cb->nh, d, NULL), err));
    decoder_layout(cb->s, cb->nh, d, (char *)d->buf);
    return SP_OK;
}

static void decoder_free(sp_cuda *cu, decoder *d)
{
    if (d->exec)
        cudaStreamSynchronize(spk::stream_of(cu)); // a replay may still run
    drop_graph(d);
    sp_cuda_free(cu, d->buf);
    memset(d, 0, sizeof *d);
}

// out = the step of d's rows from inp: a replayed graph from the second step on (B <= kGraphRows, graphs on). The
// step reads inp and writes out where they are, a graph too while they stay where they were when it was captured;
// once they move, the graph is captured again over d->xin and d->xout, and each step copies through those.
static sp_status decoder_run(sp_cuda_block *cb, decoder *d, float *out, const float *inp, sp_err *err)
{
    size_t io = (size_t)d->N * cb->H * sizeof(float);
    int graphs = cb->graphs && d->N <= kGraphRows && d->steps > 0 && !d->graph_failed;
    if (graphs && d->exec && (d->exec_in != inp || d->exec_out != out))
        d->io_moved = 1;
    int direct = !graphs || !d->io_moved;
    d->in = direct ? inp : d->xin;
    d->out = direct ? out : d->xout;
    if (!direct)
        TRY(sp_cuda_copy_d2d(cb->cu, d->xin, inp, io, err));
    if (graphs) {
        void *ws = NULL;
        TRY(sp_cuda_workspace(cb->cu, 0, &ws, err)); // where it is now (grows nothing)
        if (d->exec &&
            (ws != d->exec_ws || d->exec_fused != graph_key(cb) || d->exec_in != d->in || d->exec_out != d->out))
            drop_graph(d);
        if (!d->exec)
            capture(cb, d, ws);
    }
    if (graphs && d->exec)
        TRY(sp_cuda_error(err, (int)cudaGraphLaunch(d->exec, spk::stream_of(cb->cu)), "decode graph"));
    else
        TRY(decode_rows(cb, d, err));
    if (!direct)
        TRY(sp_cuda_copy_d2d(cb->cu, out, d->xout, io, err));
    d->steps++;
    return SP_OK;
}

static sp_status decode_step(sp_cuda_block *cb, float *out, const float *inp, sp_cuda_kv *kv, sp_err *err)
{
    TRY(decoder_run(cb, &kv->d, out, inp, err));
    kv->len++;
    return SP_OK;
}

// The tables of rows r0 .. r0 + B - 1 of a batch: kv's rows' caches and, when pos is non-NULL, its length.
static void kv_rows(const sp_cuda_kv *kv, float **kp, float **vp, int *pos)
{
    size_t stride = (size_t)kv->cap * kv->cb->nkv * kv->cb->hd;
    for (int b = 0; b < kv->B; b++) {
        kp[b] = kv->k + b * stride;
        vp[b] = kv->v + b * stride;
        if (pos)
            pos[b] = kv->len;
    }
}

extern "C" sp_status sp_cuda_block_decode_batch(sp_cuda_block *cb, float *out, const float *inp,
                                                sp_cuda_kv *const *kv, int n, sp_err *err)
{
    int N = 0, scap = 0;
    for (int i = 0; i < n; i++) {
        TRY(sp_block_check_step(cb->nkv, cb->hd, kv[i]->B, 1, kv[i]->len, NULL, err));
        if (kv[i]->cb != cb)
            return sp_errf(err, SP_ERR_ARG, "block: the KV cache belongs to another block");
        if (kv[i]->len >= kv[i]->cap)
            return sp_errf(err, SP_ERR_RANGE, "block: %d + 1 positions exceed the cache's %d", kv[i]->len,
                           kv[i]->cap);
        N += kv[i]->B;
        scap = kv[i]->cap > scap ? kv[i]->cap : scap;
    }
    if (n <= 0)
        return sp_errf(err, SP_ERR_ARG, "block: a batch of %d caches", n);
    decoder *d = &cb->bat;
    if (d->N != N || d->scap < scap) { // new buffers (and graph) for another number of rows or a longer cache
        TRY(sp_cuda_sync(cb->cu, err));
        scap = d->N == N && d->scap > scap ? d->scap : scap;
        decoder_free(cb->cu, d);
        free(cb->bat_host);
        cb->bat_host = malloc((size_t)N * (2 * sizeof(float *) + sizeof(int)));
        if (!cb->bat_host)
            return sp_errf(err, SP_ERR_NOMEM, "out of memory");
        TRY(decoder_alloc(cb, d, N, scap, 0, err));
    }
    float **kp = (float **)cb->bat_host, **vp = kp + N;
    int *pos = (int *)(void *)(vp + N);
    for (int i = 0, r = 0; i < n; r += kv[i++]->B)
        kv_rows(kv[i], kp + r, vp + r, pos + r);
    TRY(sp_cuda_upload(cb->cu, d->kp, cb->bat_host, (size_t)N * (2 * sizeof(float *) + sizeof(int)), err));
    TRY(decoder_run(cb, d, out, inp, err));
    for (int i = 0; i < n; i++) { // each cache's own positions follow
        kv[i]->len++;
        TRY(set_pos(cb->cu, kv[i]->d.pos, kv[i]->B, kv[i]->len, 0, err));
    }
    return SP_OK;
}

// ---------------------------------------------------------------------------------------------------------------
// caches

extern "C" sp_status sp_cuda_kv_new(sp_cuda_block *cb, sp_cuda_kv **out, int B, int cap, sp_cuda_budget *budget,
                                    sp_err *err)
{
    *out = NULL;
    if (B <= 0 || cap <= 0)
        return sp_errf(err, SP_ERR_ARG, "kv cache: bad batch %d or length %d", B, cap);
    sp_cuda_kv *kv = (sp_cuda_kv *)calloc(1, sizeof *kv);
    size_t tab = (size_t)B * (2 * sizeof(float *) + sizeof(int));
    void *host = malloc(tab);
    if (!kv || !host) {
        free(kv), free(host);
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    }
    kv->cb = cb, kv->B = B, kv->cap = cap;
    size_t cache = (size_t)B * cap * cb->nkv * cb->hd * sizeof(float);
    kv->bytes = kv_bytes(cb->s, cb->nh, B, cap);
    sp_status st = sp_cuda_budget_take(budget, kv->bytes, err);
    if (st != SP_OK) {
        free(kv), free(host);
        return st;
    }
    kv->budget = budget;
    st = sp_cuda_alloc(cb->cu, (void **)&kv->k, cache, err);
    if (st == SP_OK)
        st = sp_cuda_alloc(cb->cu, (void **)&kv->v, cache, err);
    if (st == SP_OK)
        st = decoder_alloc(cb, &kv->d, B, cap, 1, err);
    if (st == SP_OK) { // the rows' tables, positions 0
        float **kp = (float **)host, **vp = kp + B;
        kv_rows(kv, kp, vp, (int *)(void *)(vp + B));
        st = sp_cuda_upload(cb->cu, kv->d.kp, host, tab, err);
    }
    free(host);
    if (st != SP_OK) {
        sp_cuda_kv_free(kv);
        return sp_err_prefix(err, "kv cache of %d x %d positions: ", B, cap);
    }
    *out = kv;
    return SP_OK;
}

extern "C" void sp_cuda_kv_free(sp_cuda_kv *kv)
{
    if (!kv)
        return;
    sp_cuda *cu = kv->cb->cu;
    decoder_free(cu, &kv->d);
    sp_cuda_free(cu, kv->k);
    sp_cuda_free(cu, kv->v);
    sp_cuda_budget_give(kv->budget, kv->bytes);
    free(kv);
}

extern "C" sp_status sp_cuda_kv_reorder(sp_cuda_kv *kv, const int64_t *src, sp_err *err)
{
    for (int b = 0; b < kv->B; b++)
        if (src[b] < 0 || src[b] >= kv->B)
            return sp_errf(err, SP_ERR_ARG, "kv cache: row %d would take row %lld of %d", b, (long long)src[b], kv->B);
    if (kv->len == 0)
        return SP_OK;
    size_t row = (size_t)kv->cb->nkv * kv->cb->hd, used = (size_t)kv->len * row, stride = (size_t)kv->cap * row;
    void *ws = NULL;
    TRY(sp_cuda_workspace(kv->cb->cu, 2 * (size_t)kv->B * used * sizeof(float), &ws, err));
    cudaStream_t s = spk::stream_of(kv->cb->cu);
    float *tmp[2] = {(float *)ws, (float *)ws + (size_t)kv->B * used}, *cache[2] = {kv->k, kv->v};
    for (int c = 0; c < 2; c++) { // the used rows aside, then each row from its source
        cudaError_t e = cudaMemcpy2DAsync(tmp[c], used * sizeof(float), cache[c], stride * sizeof(float),
                                          used * sizeof(float), (size_t)kv->B, cudaMemcpyDeviceToDevice, s);
        for (int b = 0; e == cudaSuccess && b < kv->B; b++)
            e = cudaMemcpyAsync(cache[c] + b * stride, tmp[c] + (size_t)src[b] * used, used * sizeof(float),
                                cudaMemcpyDeviceToDevice, s);
        TRY(sp_cuda_error(err, (int)e, "kv cache reorder"));
    }
    return SP_OK;
}

extern "C" int sp_cuda_kv_len(const sp_cuda_kv *kv) { return kv->len; }
extern "C" int sp_cuda_kv_graphed(const sp_cuda_kv *kv) { return kv->d.exec != NULL; }

extern "C" void sp_cuda_kv_arrays(const sp_cuda_kv *kv, const float **k, const float **v)
{
    *k = kv->k;
    *v = kv->v;
}

extern "C" sp_status sp_cuda_kv_set_len(sp_cuda_kv *kv, int len, sp_err *err)
{
    if (len < 0 || len > kv->len)
        return sp_errf(err, SP_ERR_ARG, "kv cache: cannot roll back to %d of %d positions", len, kv->len);
    kv->len = len;
    return set_pos(kv->cb->cu, kv->d.pos, kv->B, len, 0, err);
}

// ---------------------------------------------------------------------------------------------------------------
// forward

static sp_status check_dims(const sp_cuda_block *cb, int B, int T, int pos0, const sp_cuda_kv *kv, sp_err *err)
{
    if (kv && kv->cb != cb)
        return sp_errf(err, SP_ERR_ARG, "block: the KV cache belongs to another block");
    sp_kv_cache shape = {kv ? kv->B : 0, kv ? kv->cap : 0, cb->nkv, cb->hd, kv ? kv->len : 0, NULL, NULL};
    return sp_block_check_step(cb->nkv, cb->hd, B, T, pos0, kv ? &shape : NULL, err);
}

// The attention's kept floats: probabilities [B, nh, T, S], or the flash kernels' log-sum-exp [B, nh, T].
static size_t probs_floats(const sp_cuda_block *cb, int B, int T, int S)
{
    return (size_t)B * cb->nh * T * (use_flash(cb) ? 1 : S);
}

extern "C" sp_status sp_cuda_block_forward(sp_cuda_block *cb, float *out, const float *inp, int B, int T, int pos0,
                                           sp_cuda_kv *kv, sp_err *err)
{
    TRY(check_dims(cb, B, T, pos0, kv, err));
    if (kv && T == 1)
        return decode_step(cb, out, inp, kv, err);
    size_t N = (size_t)B * T, pn = probs_floats(cb, B, T, (kv ? kv->len : 0) + T);
    int half = kv ? half_rows(cb, N) : half_own(cb, N);
    dacts a;
    TRY(block_ws(cb, acts_layout(cb->s, &a, N, pn, half, NULL), err));
    acts_layout(cb->s, &a, N, pn, half, (char *)cb->ws);
    return forward_acts(cb, out, inp, B, T, pos0, kv, &a, err);
}

extern "C" size_t sp_cuda_block_acts_bytes(const sp_cuda_block *cb, int B, int T)
{
    dacts a;
    size_t N = (size_t)B * T;
    return acts_layout(cb->s, &a, N, probs_floats(cb, B, T, T), half_own(cb, N), NULL);
}

extern "C" void sp_cuda_acts_free(sp_cuda_block *cb, sp_cuda_acts *k)
{
    sp_cuda_free(cb->cu, k->buf);
    memset(k, 0, sizeof *k);
}

extern "C" sp_status sp_cuda_block_forward_keep(sp_cuda_block *cb, float *out, const float *inp, int B, int T,
                                                int pos0, sp_cuda_acts *k, sp_err *err)
{
    TRY(check_dims(cb, B, T, pos0, NULL, err));
    dacts a;
    size_t N = (size_t)B * T, bytes = acts_layout(cb->s, &a, N, probs_floats(cb, B, T, T), half_own(cb, N), NULL);
    if (k->bytes < bytes) {
        TRY(sp_cuda_sync(cb->cu, err));
        sp_cuda_acts_free(cb, k);
        TRY(sp_cuda_alloc(cb->cu, &k->buf, bytes, err));
        k->bytes = bytes;
    }
    acts_layout(cb->s, &a, N, probs_floats(cb, B, T, T), half_own(cb, N), (char *)k->buf);
    TRY(forward_acts(cb, out, inp, B, T, pos0, NULL, &a, err));
    k->B = B, k->T = T, k->pos0 = pos0;
    return SP_OK;
}

// ---------------------------------------------------------------------------------------------------------------
// backward

// dX[N, cols] += dY[N, rows] W (block.c's lin_bwd without weight gradients).
static sp_status mul_t_acc(sp_cuda_block *cb, int which, float *dX, const float *dY, int N, float *half, sp_err *err)
{
    const sp_cuda_wmat *W = &cb->m[which];
    int rows = W->w.rows, cols = W->w.cols;
    if (W->w.type == SP_KM_F32)
        return sp_cuda_linear_dx(cb->cu, dX, dY, W->q, SP_CU_F32, N, cols, rows, err);
    if (W->w.type == SP_KM_BF16 || W->w.type == SP_KM_F16) { // dY in the weights' own 16 bits
        sp_cu_dtype t = W->w.type == SP_KM_F16 ? SP_CU_F16 : SP_CU_BF16;
        TRY(sp_cuda_f32_to(cb->cu, half, dY, (long)N * rows, t, err));
        return sp_cuda_linear_dx(cb->cu, dX, half, W->q, t, N, cols, rows, err);
    }
    long tile = (long)((64u << 20) / sizeof(float)) / cols; // int8 / NF4: 64 MB of decoded rows at a time
    tile = tile < 1 ? 1 : tile > rows ? rows : tile;
    void *ws = NULL;
    TRY(sp_cuda_workspace(cb->cu, (size_t)tile * cols * sizeof(float), &ws, err));
    for (int r0 = 0; r0 < rows; r0 += (int)tile) {
        int tr = rows - r0 < tile ? rows - r0 : (int)tile;
        TRY(sp_cuda_dequant(cb->cu, (float *)ws, W, r0, tr, err));
        sp_gemm_plan p = sp_cuda_plan_dx_tile(N, cols, rows, tr);
        TRY(sp_cuda_gemm(cb->cu, &p, ws, dY + r0, dX, SP_CU_F32, err));
    }
    return SP_OK;
}

static sp_status norm_bwd(sp_cuda_block *cb, float *dx, const float *dy, const float *x, const float *w,
                          const float *mean, const float *rstd, int N, sp_err *err)
{
    if (cb->k.norm == SP_NORM_RMS)
        return sp_cuda_rmsnorm_bwd(cb->cu, dx, NULL, dy, x, w, rstd, N, cb->H, err);
    return sp_cuda_layernorm_bwd(cb->cu, dx, NULL, NULL, dy, x, w, mean, rstd, N, cb->H, err);
}

// dx += mlp'(x)^T dy (block.c's mlp_backward).
static sp_status mlp_bwd(sp_cuda_block *cb, float *dx, const float *dy, const dacts *a, const dgrads *g, int N,
                         sp_err *err)
{
    if (cb->moe)
        return sp_cuda_moe_bwd(cb->moe, dx, dy, N, a->moe, g->dmoe, err);
    long n = (long)N * cb->FF;
    TRY(mul_t_acc(cb, MDOWN, g->dact, dy, N, g->half, err));
    if (cb->k.mlp == SP_MLP_SWIGLU) {
        TRY(sp_cuda_swiglu_bwd(cb->cu, g->dgate, g->dup, g->dact, a->gate, a->up, n, err));
        TRY(mul_t_acc(cb, MGATE, dx, g->dgate, N, g->half, err));
    } else {
        TRY(sp_cuda_gelu_bwd(cb->cu, g->dup, g->dact, a->up, n, cb->k.mlp == SP_MLP_GELU_TANH, err));
    }
    return mul_t_acc(cb, MUP, dx, g->dup, N, g->half, err);
}

// dX[N, cols] (+)= dYh W from a bf16 gradient (the bf16 path; acc 0: dX overwritten, nothing to clear first).
static sp_status mul_t_h(sp_cuda_block *cb, int which, float *dX, const void *dYh, int N, int acc, sp_err *err)
{
    return sp_cuda_wmat_mul_t_h(cb->cu, &cb->m[which], dYh, dX, N, acc, err);
}

// mul_t_h from an f32 gradient, rounded to bf16 in half first.
static sp_status mul_t_f(sp_cuda_block *cb, int which, float *dX, const float *dY, int N, float *half, int acc,
                         sp_err *err)
{
    TRY(sp_cuda_f32_to(cb->cu, half, dY, (long)N * cb->m[which].w.rows, SP_CU_BF16, err));
    return mul_t_h(cb, which, dX, half, N, acc, err);
}

// mlp_bwd on the bf16 path: dx (+)= mlp'(x)^T dy (acc 0: overwritten); the activation's gradients go to the
// products in bf16, in the storage of dgate and dup.
static sp_status mlp_bwd_h(sp_cuda_block *cb, float *dx, const float *dy, const dacts *a, const dgrads *g, int N,
                           int acc, sp_err *err)
{
    long n = (long)N * cb->FF;
    TRY(mul_t_f(cb, MDOWN, g->dact, dy, N, g->half, 0, err));
    if (cb->k.mlp == SP_MLP_SWIGLU) {
        TRY(sp_cuda_swiglu_bwd_h(cb->cu, g->dgate, g->dup, g->dact, a->gate, a->up, n, err));
        TRY(mul_t_h(cb, MGATE, dx, g->dgate, N, acc, err));
        acc = 1;
    } else {
        TRY(sp_cuda_gelu_bwd_h(cb->cu, g->dup, g->dact, a->up, n, cb->k.mlp == SP_MLP_GELU_TANH, err));
    }
    return mul_t_h(cb, MUP, dx, g->dup, N, acc, err);
}

// The q, k, v products' input gradient into dln1 (+= when acc), RoPE's backward rounded to bf16 on the way.
static sp_status qkv_bwd_h(sp_cuda_block *cb, const dgrads *g, int B, int T, int pos0, int acc, sp_err *err)
{
    int N = B * T;
    if (cb->inv_freq) {
        TRY(sp_cuda_rope_bwd_h(cb->cu, g->half, g->dq, cb->inv_freq, pos0, B, T, cb->nh, cb->hd, err));
        TRY(mul_t_h(cb, MQ, g->dln1, g->half, N, acc, err));
        TRY(sp_cuda_rope_bwd_h(cb->cu, g->half, g->dk, cb->inv_freq, pos0, B, T, cb->nkv, cb->hd, err));
        TRY(mul_t_h(cb, MK, g->dln1, g->half, N, 1, err));
    } else {
        TRY(mul_t_f(cb, MQ, g->dln1, g->dq, N, g->half, acc, err));
        TRY(mul_t_f(cb, MK, g->dln1, g->dk, N, g->half, 1, err));
    }
    return mul_t_f(cb, MV, g->dln1, g->dv, N, g->half, 1, err);
}

// A norm's backward on the bf16 path: dx = res + norm'(x)^T dy, and dxh = dx in bf16 when given.
static sp_status norm_bwd_res(sp_cuda_block *cb, float *dx, void *dxh, const float *res, const float *dy,
                              const float *x, const float *w, const float *mean, const float *rstd, int N, sp_err *err)
{
    return sp_cuda_norm_bwd_h(cb->cu, dx, dxh, res, dy, x, w, mean, rstd, N, cb->H, cb->k.norm == SP_NORM_RMS, err);
}

// backward_acts on the bf16 path (a forward that kept bf16 inputs, flash attention's log-sum-exp): every
// gradient a product takes is written in bf16 by the kernel before it, the first product into a buffer overwrites
// it, and flash attention writes the attention's gradients: nothing is cleared. The residual's gradient is never
// copied: each norm's backward adds its part to the one before (dout first) as it writes the next (the last into
// dinp), and norm 2's writes the o projection's bf16 input too.
static sp_status backward_acts_h(sp_cuda_block *cb, float *dinp, const float *dout, const float *inp, int B, int T,
                                 int pos0, const dacts *a, const dgrads *g, sp_err *err)
{
    int N = B * T;
    sp_cuda *cu = cb->cu;
    const float *res = dout; // the residual stream's gradient so far
    TRY(mlp_bwd_h(cb, cb->ln2_w ? g->dln2 : g->dln1, dout, a, g, N, 0, err));
    if (cb->ln2_w && !cb->k.parallel) {
        TRY(norm_bwd_res(cb, g->dh1, g->half, res, g->dln2, a->h1, cb->ln2_w, a->mean2, a->rstd2, N, err));
        res = g->dh1;
        TRY(mul_t_h(cb, MO, g->datt, g->half, N, 0, err));
    } else {
        TRY(mul_t_f(cb, MO, g->datt, res, N, g->half, 0, err));
    }
    if (a->pk) // the forward's packed operands; dq, dk, dv written: nothing to clear first
        TRY(sp_cuda_flash_bwd_packed(cu, g->dq, g->dk, g->dv, g->datt, a->att, a->probs, a->pk, cb->slopes, B, T,
                                     cb->nh, cb->nkv, cb->hd, 0, err));
    else
        TRY(sp_cuda_flash_bwd(cu, g->dq, g->dk, g->dv, g->datt, a->att, a->probs, a->q, a->k, a->v, cb->slopes, B, T,
                              0, cb->nh, cb->nkv, cb->hd, T, 0, err));
    TRY(qkv_bwd_h(cb, g, B, T, pos0, cb->ln2_w ? 0 : 1, err));
    if (cb->ln2_w && cb->k.parallel) {
        TRY(norm_bwd_res(cb, g->dh1, NULL, res, g->dln2, inp, cb->ln2_w, a->mean2, a->rstd2, N, err));
        res = g->dh1;
    }
    return norm_bwd_res(cb, dinp, NULL, res, g->dln1, inp, cb->ln1_w, a->mean1, a->rstd1, N, err);
}

// The backward over the activations of a forward without a cache (block.c's backward_acts); gbase: grads_layout.
static sp_status backward_acts(sp_cuda_block *cb, float *dinp, const float *dout, const float *inp, int B, int T,
                               int pos0, const dacts *a, char *gbase, sp_err *err)
{
    int N = B * T;
    sp_cuda *cu = cb->cu;
    dgrads g;
    size_t gbytes = grads_layout(cb->s, &g, (size_t)N, gbase);
    if (a->lnh)
        return backward_acts_h(cb, dinp, dout, inp, B, T, pos0, a, &g, err);
    TRY(sp_cuda_zero(cu, gbase, gbytes, err)); // every gradient buffer accumulates
    size_t nh1 = (size_t)N * cb->H * sizeof(float);
    TRY(sp_cuda_copy_d2d(cu, g.dh1, dout, nh1, err));
    float *dm = cb->ln2_w ? g.dln2 : g.dln1;
    TRY(mlp_bwd(cb, dm, dout, a, &g, N, err));
    if (cb->ln2_w && !cb->k.parallel)
        TRY(norm_bwd(cb, g.dh1, g.dln2, a->h1, cb->ln2_w, a->mean2, a->rstd2, N, err));
    TRY(mul_t_acc(cb, MO, g.datt, g.dh1, N, g.half, err));
    if (use_flash(cb))
        TRY(sp_cuda_flash_bwd(cu, g.dq, g.dk, g.dv, g.datt, a->att, a->probs, a->q, a->k, a->v, cb->slopes, B, T, 0,
                              cb->nh, cb->nkv, cb->hd, T, 1, err));
    else
        TRY(sp_cuda_attn_backward(cu, g.dq, g.dk, g.dv, g.datt, a->probs, a->q, a->k, a->v, B, T, 0, cb->nh, cb->nkv,
                                  cb->hd, T, err));
    float *dq = g.dq, *dk = g.dk;
    if (cb->inv_freq) { // RoPE is a rotation: back through its transpose
        TRY(sp_cuda_rope_bwd(cu, g.dqp, g.dq, cb->inv_freq, pos0, B, T, cb->nh, cb->hd, err));
        TRY(sp_cuda_rope_bwd(cu, g.dkp, g.dk, cb->inv_freq, pos0, B, T, cb->nkv, cb->hd, err));
        dq = g.dqp, dk = g.dkp;
    }
    TRY(mul_t_acc(cb, MQ, g.dln1, dq, N, g.half, err));
    TRY(mul_t_acc(cb, MK, g.dln1, dk, N, g.half, err));
    TRY(mul_t_acc(cb, MV, g.dln1, g.dv, N, g.half, err));
    if (cb->ln2_w && cb->k.parallel)
        TRY(norm_bwd(cb, g.dh1, g.dln2, inp, cb->ln2_w, a->mean2, a->rstd2, N, err));
    TRY(norm_bwd(cb, g.dh1, g.dln1, inp, cb->ln1_w, a->mean1, a->rstd1, N, err));
    return sp_cuda_copy_d2d(cu, dinp, g.dh1, nh1, err);
}

extern "C" sp_status sp_cuda_block_backward_kept(sp_cuda_block *cb, float *dinp, const float *dout, const float *inp,
                                                 const sp_cuda_acts *k, sp_err *err)
{
    if (!k || !k->buf)
        return sp_errf(err, SP_ERR_STATE, "block: no kept activations");
    dacts a;
    dgrads g;
    size_t N = (size_t)k->B * k->T;
    if (acts_layout(cb->s, &a, N, probs_floats(cb, k->B, k->T, k->T), half_own(cb, N), (char *)k->buf) > k->bytes)
        return sp_errf(err, SP_ERR_STATE, "block: kept activations are too small for [%d, %d]", k->B, k->T);
    TRY(block_ws(cb, grads_layout(cb->s, &g, N, NULL), err));
    return backward_acts(cb, dinp, dout, inp, k->B, k->T, k->pos0, &a, (char *)cb->ws, err);
}

extern "C" sp_status sp_cuda_block_backward(sp_cuda_block *cb, float *dinp, const float *dout, const float *inp,
                                            int B, int T, int pos0, sp_err *err)
{
    TRY(check_dims(cb, B, T, pos0, NULL, err));
    dacts a;
    dgrads g;
    size_t N = (size_t)B * T, pn = probs_floats(cb, B, T, T);
    size_t gbytes = grads_layout(cb->s, &g, N, NULL), abytes = acts_layout(cb->s, &a, N, pn, half_own(cb, N), NULL);
    TRY(block_ws(cb, gbytes + abytes, err));
    char *base = (char *)cb->ws;
    acts_layout(cb->s, &a, N, pn, half_own(cb, N), base + gbytes);
    TRY(forward_acts(cb, a.y, inp, B, T, pos0, NULL, &a, err)); // the output into a.y, which nothing reads after
    return backward_acts(cb, dinp, dout, inp, B, T, pos0, &a, base, err);
}
