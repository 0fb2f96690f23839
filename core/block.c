/* block.c - the transformer block of every family as one flat list of op calls; sp_block_kind (config.h)
 * switches the norm, the positions, the residual structure and the MLP. Loading is where the families'
 * checkpoints differ (tensor names, fused QKV). */
#include "block.h"

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtune.h"
#include "ops.h"
#include "trace.h"

sp_status sp_ws_reserve(sp_ws *ws, size_t nfloats, sp_err *err)
{
    if (ws->cap >= nfloats)
        return SP_OK;
    float *p = realloc(ws->buf, nfloats * sizeof(float));
    if (!p)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory: workspace of %zu floats", nfloats);
    ws->buf = p;
    ws->cap = nfloats;
    return SP_OK;
}

void sp_ws_free(sp_ws *ws)
{
    free(ws->buf);
    ws->buf = NULL;
    ws->cap = 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* weights */

enum { W_LN1W, W_LN1B, W_WQ, W_BQ, W_WK, W_BK, W_WV, W_BV, W_WO, W_BO, W_LN2W, W_LN2B,
       W_GATE, W_UP, W_BUP, W_DOWN, W_BDOWN, W_ROUTER, W__COUNT };

static int is_moe(const sp_block *b) { return b->k.mlp == SP_MLP_MOE; }
static int is_gelu(const sp_block *b) { return b->k.mlp == SP_MLP_GELU || b->k.mlp == SP_MLP_GELU_TANH; }

/* Floats of each weight tensor of b's kind (0: the family has none). */
static void weight_sizes(const sp_block *b, size_t n[W__COUNT])
{
    size_t H = (size_t)b->H, Q = (size_t)b->nh * b->hd, KV = (size_t)b->nkv * b->hd, FF = (size_t)b->FF;
    size_t E = is_moe(b) ? (size_t)b->k.n_experts : 1, ln = b->k.norm == SP_NORM_LAYER, two = b->k.norms == 2;
    size_t qb = (size_t)b->k.qkv_bias, mb = (size_t)(b->k.mlp_bias && is_gelu(b));
    size_t w[W__COUNT] = {
        [W_LN1W] = H,       [W_LN1B] = ln * H,  [W_WQ] = Q * H,           [W_BQ] = qb * Q,
        [W_WK] = KV * H,    [W_BK] = qb * KV,   [W_WV] = KV * H,          [W_BV] = qb * KV,
        [W_WO] = H * Q,     [W_BO] = (size_t)b->k.out_bias * H,           [W_LN2W] = two * H,
        [W_LN2B] = two * ln * H,                [W_GATE] = is_gelu(b) ? 0 : E * FF * H,
        [W_UP] = E * FF * H, [W_BUP] = mb * FF, [W_DOWN] = E * H * FF,    [W_BDOWN] = mb * H,
        [W_ROUTER] = is_moe(b) ? E * H : 0,
    };
    memcpy(n, w, sizeof w);
}

static float **weight_slot(sp_block *b, int i)
{
    float **slots[W__COUNT] = {&b->ln1_w, &b->ln1_b, &b->wq,   &b->bq,     &b->wk, &b->bk,   &b->wv,
                               &b->bv,    &b->wo,    &b->bo,   &b->ln2_w,  &b->ln2_b, &b->w_gate, &b->w_up,
                               &b->b_up,  &b->w_down, &b->b_down, &b->router};
    return slots[i];
}

/* ---------------------------------------------------------------------------------------------- */
/* the projection matrices as sp_qmat */

enum { M_Q, M_K, M_V, M_O, M_DENSE };
static int n_mats(const sp_block *b) { return M_DENSE + 3 * (is_moe(b) ? b->k.n_experts : 1); }
/* which: 0 gate, 1 up, 2 down */
static const sp_qmat *mlp_mat(const sp_block *b, int which, int e) { return &b->qm[M_DENSE + 3 * e + which]; }

/* f32 views of the block's matrices (its qm when they are not re-encoded). */
static sp_status make_views(sp_block *b, sp_err *err)
{
    b->nqm = n_mats(b);
    b->qm = calloc((size_t)b->nqm, sizeof *b->qm);
    if (!b->qm)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    int H = b->H, Q = b->nh * b->hd, KV = b->nkv * b->hd, FF = b->FF;
    b->qm[M_Q] = sp_qmat_f32(b->wq, Q, H);
    b->qm[M_K] = sp_qmat_f32(b->wk, KV, H);
    b->qm[M_V] = sp_qmat_f32(b->wv, KV, H);
    b->qm[M_O] = sp_qmat_f32(b->wo, H, Q);
    int E = is_moe(b) ? b->k.n_experts : 1;
    for (int e = 0; e < E; e++) {
        size_t off = (size_t)e * FF * H;
        if (b->w_gate)
            b->qm[M_DENSE + 3 * e] = sp_qmat_f32(b->w_gate + off, FF, H);
        b->qm[M_DENSE + 3 * e + 1] = sp_qmat_f32(b->w_up + off, FF, H);
        b->qm[M_DENSE + 3 * e + 2] = sp_qmat_f32(b->w_down + off, H, FF);
    }
    b->wtype = SP_W_F32;
    if (!b->pool)
        b->pool = sp_pool_default();
    return SP_OK;
}

sp_status sp_block_init(sp_block *b, const sp_config *cfg, const sp_rope *rope, sp_err *err)
{
    memset(b, 0, sizeof *b);
    if (cfg->arch == SP_ARCH_UNKNOWN)
        return sp_config_check_supported(cfg, err);
    b->arch = cfg->arch;
    b->k = cfg->blk;
    b->H = cfg->hidden;
    b->nh = cfg->n_heads;
    b->nkv = cfg->n_kv_heads;
    b->hd = cfg->head_dim;
    b->FF = cfg->intermediate;
    b->eps = cfg->norm_eps;
    b->rope = b->k.pos == SP_POS_ROPE ? rope : NULL;
    if (b->k.pos == SP_POS_ROPE && !rope)
        return sp_errf(err, SP_ERR_ARG, "block: a RoPE family needs its rope tables");
    size_t n[W__COUNT], total = 0;
    weight_sizes(b, n);
    for (int i = 0; i < W__COUNT; i++)
        total += n[i];
    b->mem = calloc(total, sizeof(float));
    b->alibi = b->k.pos == SP_POS_ALIBI ? malloc((size_t)b->nh * sizeof(float)) : NULL;
    if (!b->mem || (b->k.pos == SP_POS_ALIBI && !b->alibi)) {
        sp_block_free(b);
        return sp_errf(err, SP_ERR_NOMEM, "out of memory: block of %zu floats", total);
    }
    if (b->alibi)
        sp_alibi_slopes(b->alibi, b->nh);
    b->numel = total;
    float *p = b->mem;
    for (int i = 0; i < W__COUNT; i++) {
        *weight_slot(b, i) = n[i] ? p : NULL;
        p += n[i];
    }
    sp_status st = make_views(b, err);
    if (st)
        sp_block_free(b);
    return st;
}

static void free_early(sp_block *b)
{
    for (int i = 0; b->early && i < b->nqm; i++)
        sp_qmat_free(&b->early[i]);
    free(b->early);
    b->early = NULL;
}

void sp_block_free(sp_block *b)
{
    free_early(b);
    for (int i = 0; b->qm && i < b->nqm; i++)
        sp_qmat_free(&b->qm[i]);
    free(b->qm);
    free(b->mem);
    free(b->alibi);
    b->qm = NULL;
    b->nqm = 0;
    b->mem = b->alibi = NULL;
}

static int is_matrix(int slot) { return slot == W_WQ || slot == W_WK || slot == W_WV || slot == W_WO ||
                                        slot == W_GATE || slot == W_UP || slot == W_DOWN; }

sp_status sp_block_quantize(sp_block *b, sp_wtype t, sp_err *err)
{
    if (t == b->wtype)
        return SP_OK;
    if (b->wtype != SP_W_F32)
        return sp_errf(err, SP_ERR_STATE, "block: already encoded as %s", sp_wtype_name(b->wtype));
    sp_qmat *q = calloc((size_t)b->nqm, sizeof *q);
    if (!q)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < b->nqm; i++) {
        const sp_qmat *v = &b->qm[i];
        if (b->early && b->early_t == t && b->early[i].q) { /* encoded while loading */
            q[i] = b->early[i];
            b->early[i] = (sp_qmat){0};
            continue;
        }
        if (!v->q)
            continue;
        sp_status st = sp_qmat_encode(&q[i], t, (const float *)v->q, v->rows, v->cols, err);
        if (st) {
            for (int k = 0; k < i; k++)
                sp_qmat_free(&q[k]);
            free(q);
            return st;
        }
    }
    /* the rest (norms, biases, router) into a small allocation of its own; the f32 matrices go */
    size_t n[W__COUNT], keep = 0;
    weight_sizes(b, n);
    for (int i = 0; i < W__COUNT; i++)
        keep += is_matrix(i) ? 0 : n[i];
    float *mem = malloc((keep ? keep : 1) * sizeof(float)), *p = mem;
    if (!mem) {
        for (int k = 0; k < b->nqm; k++)
            sp_qmat_free(&q[k]);
        free(q);
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < W__COUNT; i++) {
        float **slot = weight_slot(b, i);
        if (is_matrix(i) || !n[i]) {
            *slot = NULL;
            continue;
        }
        memcpy(p, *slot, n[i] * sizeof(float));
        *slot = p;
        p += n[i];
    }
    free(b->mem);
    b->mem = mem;
    b->numel = keep;
    free(b->qm);
    b->qm = q;
    b->wtype = t;
    free_early(b);
    return SP_OK;
}

size_t sp_block_bytes(const sp_block *b)
{
    size_t bytes = b->numel * sizeof(float);
    if (b->wtype != SP_W_F32) /* the matrices live apart from mem */
        for (int i = 0; i < b->nqm; i++)
            bytes += b->qm[i].q ? sp_qmat_bytes(b->qm[i].type, b->qm[i].rows, b->qm[i].cols) : 0;
    return bytes;
}

/* out[N, Cout] = in[N, Cin] W^T (+ bias), through m (sp_qmat_mul: the engine's kernels and pool; an f32 m's
 * larger N on sgemm, split over the pool when OpenBLAS runs one thread), or the f32 tensor W without an m;
 * exact: the decode kernels for any N (each row's bits as alone). */
static void lin(const sp_block *b, const sp_qmat *m, const float *W, float *out, const float *in, const float *bias,
                int N, int Cin, int Cout, int exact)
{
    if (m->q) {
        if (exact)
            sp_qmat_mul_rows(m, in, out, N, b->pool);
        else
            sp_qmat_mul(m, in, out, N, b->pool);
        for (int i = 0; bias && i < N; i++)
            for (int c = 0; c < Cout; c++)
                out[(size_t)i * Cout + c] += bias[c];
        return;
    }
    sp_linear_forward(out, in, W, bias, N, Cin, Cout);
}

/* The backward of lin: dinp += dout W, dW and dbias accumulated when asked (dW needs the f32 tensor W). */
static void lin_bwd(const sp_qmat *m, const float *W, float *dinp, float *dW, float *dbias, const float *dout,
                    const float *inp, int N, int Cin, int Cout, sp_pool *pool)
{
    if (W) {
        sp_linear_backward(dinp, dW, dbias, dout, inp, W, N, Cin, Cout);
        return;
    }
    sp_qmat_mul_t_acc(m, dout, dinp, N, pool);
    for (int i = 0; dbias && i < N; i++)
        for (int c = 0; c < Cout; c++)
            dbias[c] += dout[(size_t)i * Cout + c];
}

/* lin over the rows of a pass: a merged batch of training requests (items, a->exact unset) gets each item's
 * product as lin gives it alone (an encoded matrix's tiles decoded once for all of them); otherwise lin itself. */
typedef struct acts acts;
static void lin_a(const sp_block *b, const sp_qmat *m, const float *W, float *out, const float *in, const float *bias,
                  int N, int Cin, int Cout, const acts *a);
static void lin_bwd_a(const sp_qmat *m, const float *W, float *dinp, float *dW, float *dbias, const float *dout,
                      const float *inp, int N, int Cin, int Cout, const sp_block *b, const acts *a);

/* ---------------------------------------------------------------------------------------------- */
/* loading: the families' tensor names */

/* "model.layers.3." (llama, mixtral), "transformer.h.3." (falcon, bloom) or "h.3." (BLOOM's own checkpoints,
 * saved from BloomModel). */
static void block_prefix(const sp_block *b, sp_safetensors *st, int layer, char *buf, size_t cap)
{
    if (b->arch == SP_ARCH_LLAMA || b->arch == SP_ARCH_MIXTRAL) {
        snprintf(buf, cap, "model.layers.%d.", layer);
        return;
    }
    snprintf(buf, cap, "transformer.h.%d.input_layernorm.weight", layer);
    if (b->arch == SP_ARCH_BLOOM && !sp_st_has(st, buf))
        snprintf(buf, cap, "h.%d.", layer);
    else
        snprintf(buf, cap, "transformer.h.%d.", layer);
}

/* Reads prefix + name into dst, checking its shape [d0] or [d0, d1]; the checkpoint's pages of it go back (the
 * block holds its own copy). */
static sp_status read_t(sp_safetensors *st, const char *prefix, const char *name, float *dst, int64_t d0, int64_t d1,
                        sp_err *err)
{
    char full[320];
    int64_t shape[2] = {d0, d1};
    snprintf(full, sizeof full, "%s%s", prefix, name);
    sp_status s = sp_st_read_f32(st, full, dst, d1 ? 2 : 1, shape, err);
    sp_st_release(st, full);
    return s;
}

/* A norm's weight (and bias for LayerNorm) under `name`. */
static sp_status read_norm(const sp_block *b, sp_safetensors *st, const char *prefix, const char *name, float *w,
                           float *bias, sp_err *err)
{
    char n[96];
    snprintf(n, sizeof n, "%s.weight", name);
    sp_status s = read_t(st, prefix, n, w, b->H, 0, err);
    snprintf(n, sizeof n, "%s.bias", name);
    return s || !bias ? s : read_t(st, prefix, n, bias, b->H, 0, err);
}

/* Loading encoded (b->early): the matrix whose f32 view starts at w, encoded now, and its f32 pages given back
 * (nothing reads them again: sp_block_quantize takes the encoding). Nothing for other tensors. */
static sp_status settle(sp_block *b, const float *w, sp_err *err)
{
    for (int i = 0; b->early && i < b->nqm; i++) {
        const sp_qmat *v = &b->qm[i];
        if (v->q != w || b->early[i].q)
            continue;
        sp_status s = sp_qmat_encode(&b->early[i], b->early_t, w, v->rows, v->cols, err);
        if (!s)
            sp_mem_release(w, (size_t)v->rows * (size_t)v->cols * sizeof(float));
        return s;
    }
    return SP_OK;
}

/* A linear layer's weight [out, in] and its bias [out] when the block has one. */
static sp_status read_linear(sp_block *b, sp_safetensors *st, const char *prefix, const char *name, float *w,
                             float *bias, int64_t out, int64_t in, sp_err *err)
{
    char n[96];
    snprintf(n, sizeof n, "%s.weight", name);
    sp_status s = read_t(st, prefix, n, w, out, in, err);
    if (!s && (s = settle(b, w, err))) /* (a weight its encoding cannot hold: which tensor) */
        sp_err_prefix(err, "%s%s: ", prefix, n);
    snprintf(n, sizeof n, "%s.bias", name);
    return s || !bias ? s : read_t(st, prefix, n, bias, out, 0, err);
}

/* Fused query_key_value [nkv * (g + 2) * hd, H] with g = nh / nkv: per KV group, g query heads, its key head,
 * its value head (BLOOM and Falcon's MHA: g = 1, [nh, 3, hd]; Falcon-7B: one group, [nh + 2, hd]). Row r of
 * the fused weight (and bias) goes to its q, k or v row. */
static sp_status read_fused_qkv(sp_block *b, sp_safetensors *st, const char *prefix, sp_err *err)
{
    int g = b->nh / b->nkv, hd = b->hd, H = b->H, R = b->nkv * (g + 2) * hd;
    float *tmp = malloc((size_t)R * H * sizeof(float)), *tb = b->bq ? malloc((size_t)R * sizeof(float)) : NULL;
    sp_status s = tmp && (tb || !b->bq) ? SP_OK : sp_errf(err, SP_ERR_NOMEM, "out of memory loading query_key_value");
    if (!s)
        s = read_linear(b, st, prefix, "self_attention.query_key_value", tmp, tb, R, H, err);
    for (int r = 0; !s && r < R; r++) {
        int grp = r / ((g + 2) * hd), j = (r / hd) % (g + 2), i = r % hd;
        float *w = j < g ? b->wq : j == g ? b->wk : b->wv, *bias = j < g ? b->bq : j == g ? b->bk : b->bv;
        int row = j < g ? (grp * g + j) * hd + i : grp * hd + i;
        memcpy(w + (size_t)row * H, tmp + (size_t)r * H, (size_t)H * sizeof(float));
        if (tb)
            bias[row] = tb[r];
    }
    free(tmp);
    free(tb);
    const float *qkv[3] = {b->wq, b->wk, b->wv};
    for (int i = 0; !s && i < 3; i++)
        if ((s = settle(b, qkv[i], err)))
            sp_err_prefix(err, "%sself_attention.query_key_value.weight: ", prefix);
    return s;
}

static sp_status read_attention(sp_block *b, sp_safetensors *st, const char *prefix, sp_err *err)
{
    int64_t H = b->H, Q = (int64_t)b->nh * b->hd, KV = (int64_t)b->nkv * b->hd;
    if (b->k.qkv == SP_QKV_FUSED) {
        sp_status s = read_fused_qkv(b, st, prefix, err);
        return s ? s : read_linear(b, st, prefix, "self_attention.dense", b->wo, b->bo, H, Q, err);
    }
    sp_status s = read_linear(b, st, prefix, "self_attn.q_proj", b->wq, b->bq, Q, H, err);
    if (!s)
        s = read_linear(b, st, prefix, "self_attn.k_proj", b->wk, b->bk, KV, H, err);
    if (!s)
        s = read_linear(b, st, prefix, "self_attn.v_proj", b->wv, b->bv, KV, H, err);
    return s ? s : read_linear(b, st, prefix, "self_attn.o_proj", b->wo, b->bo, H, Q, err);
}

static sp_status read_mlp(sp_block *b, sp_safetensors *st, const char *prefix, sp_err *err)
{
    int64_t H = b->H, FF = b->FF;
    if (is_gelu(b)) {
        sp_status s = read_linear(b, st, prefix, "mlp.dense_h_to_4h", b->w_up, b->b_up, FF, H, err);
        return s ? s : read_linear(b, st, prefix, "mlp.dense_4h_to_h", b->w_down, b->b_down, H, FF, err);
    }
    if (!is_moe(b)) {
        sp_status s = read_linear(b, st, prefix, "mlp.gate_proj", b->w_gate, NULL, FF, H, err);
        if (!s)
            s = read_linear(b, st, prefix, "mlp.up_proj", b->w_up, NULL, FF, H, err);
        return s ? s : read_linear(b, st, prefix, "mlp.down_proj", b->w_down, NULL, H, FF, err);
    }
    sp_status s = read_linear(b, st, prefix, "block_sparse_moe.gate", b->router, NULL, b->k.n_experts, H, err);
    for (int e = 0; !s && e < b->k.n_experts; e++) { /* w1: gate, w3: up, w2: down */
        char n[3][64];
        for (int j = 0; j < 3; j++)
            snprintf(n[j], sizeof n[j], "block_sparse_moe.experts.%d.w%d", e, j + 1);
        size_t o = (size_t)e * FF * H;
        s = read_linear(b, st, prefix, n[0], b->w_gate + o, NULL, FF, H, err);
        if (!s)
            s = read_linear(b, st, prefix, n[2], b->w_up + o, NULL, FF, H, err);
        if (!s)
            s = read_linear(b, st, prefix, n[1], b->w_down + o, NULL, H, FF, err);
    }
    return s;
}

sp_status sp_block_load(sp_block *b, sp_safetensors *st, int layer, sp_err *err)
{
    char prefix[96];
    block_prefix(b, st, layer, prefix, sizeof prefix);
    /* norm names: Falcon's parallel block with two norms calls them ln_attn / ln_mlp */
    int falcon2 = b->arch == SP_ARCH_FALCON && b->k.parallel && b->k.norms == 2;
    sp_status s = read_norm(b, st, prefix, falcon2 ? "ln_attn" : "input_layernorm", b->ln1_w, b->ln1_b, err);
    if (!s && b->ln2_w)
        s = read_norm(b, st, prefix, falcon2 ? "ln_mlp" : "post_attention_layernorm", b->ln2_w, b->ln2_b, err);
    if (!s)
        s = read_attention(b, st, prefix, err);
    return s ? s : read_mlp(b, st, prefix, err);
}

sp_status sp_block_load_encoded(sp_block *b, sp_safetensors *st, int layer, sp_wtype t, sp_err *err)
{
    if (t != SP_W_F32 && t != b->wtype && !(b->early = calloc((size_t)b->nqm, sizeof *b->early)))
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    b->early_t = t;
    sp_status s = sp_block_load(b, st, layer, err);
    return s ? s : sp_block_quantize(b, t, err);
}

/* ---------------------------------------------------------------------------------------------- */
/* KV cache */

sp_status sp_kv_init(sp_kv_cache *kv, int B, int cap, int nkv, int hd, sp_err *err)
{
    memset(kv, 0, sizeof *kv);
    size_t n = (size_t)B * cap * nkv * hd;
    kv->k = calloc(n, sizeof(float));
    kv->v = calloc(n, sizeof(float));
    if (!kv->k || !kv->v) {
        sp_kv_free(kv);
        return sp_errf(err, SP_ERR_NOMEM, "out of memory: KV cache of %d x %d positions", B, cap);
    }
    kv->B = B;
    kv->cap = cap;
    kv->nkv = nkv;
    kv->hd = hd;
    return SP_OK;
}

void sp_kv_free(sp_kv_cache *kv)
{
    free(kv->k);
    free(kv->v);
    kv->k = kv->v = NULL;
}

sp_status sp_rows_gather(float *rows, size_t stride, size_t used, const int64_t *src, int B, sp_err *err)
{
    int small_need[64];
    unsigned char small_done[64];
    int *need = B <= 64 ? small_need : malloc((size_t)B * sizeof *need);
    unsigned char *done = B <= 64 ? small_done : malloc((size_t)B);
    if (!need || !done) {
        if (need != small_need)
            free(need);
        if (done != small_done)
            free(done);
        return sp_errf(err, SP_ERR_NOMEM, "out of memory reordering %d rows", B);
    }
    for (int b = 0; b < B; b++)
        need[b] = 0, done[b] = src[b] == b; /* a row that stays is done */
    for (int b = 0; b < B; b++)
        if (src[b] != b)
            need[src[b]]++; /* rows still to write that read row src[b] */
    /* rows no row still to write reads: written from their source, which then has one reader fewer */
    for (int progress = 1; progress;) {
        progress = 0;
        for (int b = 0; b < B; b++)
            if (!done[b] && need[b] == 0) {
                memcpy(rows + (size_t)b * stride, rows + (size_t)src[b] * stride, used * sizeof(float));
                done[b] = 1;
                need[src[b]]--;
                progress = 1;
            }
    }
    /* what is left reads only what is left, once each: cycles, rotated a piece at a time through the stack */
    float tmp[1024];
    for (int b = 0; b < B; b++) {
        if (done[b])
            continue;
        for (size_t o = 0; o < used; o += 1024) {
            size_t n = used - o < 1024 ? used - o : 1024;
            memcpy(tmp, rows + (size_t)b * stride + o, n * sizeof(float));
            int cur = b;
            for (; src[cur] != b; cur = (int)src[cur])
                memcpy(rows + (size_t)cur * stride + o, rows + (size_t)src[cur] * stride + o, n * sizeof(float));
            memcpy(rows + (size_t)cur * stride + o, tmp, n * sizeof(float));
        }
        int cur = b;
        do {
            done[cur] = 1;
            cur = (int)src[cur];
        } while (cur != b);
    }
    if (need != small_need)
        free(need);
    if (done != small_done)
        free(done);
    return SP_OK;
}

sp_status sp_kv_reorder(sp_kv_cache *kv, const int64_t *src, sp_err *err)
{
    size_t row = (size_t)kv->cap * kv->nkv * kv->hd, used = (size_t)kv->len * kv->nkv * kv->hd;
    sp_status st = sp_rows_gather(kv->k, row, used, src, kv->B, err);
    return st ? st : sp_rows_gather(kv->v, row, used, src, kv->B, err);
}



/* ---------------------------------------------------------------------------------------------- */
/* activations */

/* Activations of one forward pass; the backward needs all of them. R = rows through the MLP: the tokens
 * (dense), or one per (token, chosen expert) pair ("slots", grouped by expert) for a MoE block. */
struct acts {
    float *cos, *sin;            /* [T, hd/2] (RoPE) */
    float *ln1, *mean1, *rstd1;  /* [N, H], [N], [N] */
    float *q, *k, *v;            /* [N, nh*hd], [N, nkv*hd] x2 (after RoPE) */
    float *probs;                /* [B, nh, T, S] or [T, S] */
    float *att;                  /* [N, nh*hd] */
    float *h1;                   /* x + attention output [N, H] */
    float *ln2, *mean2, *rstd2;  /* [N, H], [N], [N]; absent when the MLP shares n1 */
    float *gate, *up, *act;      /* [R, FF]: SwiGLU gate/up/product; GELU: up = pre-activation */
    float *rlog, *rw;            /* MoE: router logits [N, E], weights of the chosen experts [N, K] */
    float *xs, *ys;              /* MoE: each slot's input row and its expert's (unweighted) output [N*K, H] */
    int32_t *ridx, *slot, *off;  /* MoE: chosen experts [N, K]; slot -> n*K + k [N*K]; expert e's slots start
                                    at off[e] [E + 1] */
    int exact;                   /* a batch of decode steps: the products in the decode kernels whatever N is */
    const int *item_rows;        /* ... its sequences' rows, in order (NULL: one item of N rows); without exact,
                                    merged training requests' rows: each item's products as it gets them alone */
    int nitems;
};

static int split_items(const acts *a) { return a->item_rows && !a->exact; }

static void lin_a(const sp_block *b, const sp_qmat *m, const float *W, float *out, const float *in, const float *bias,
                  int N, int Cin, int Cout, const acts *a)
{
    if (!split_items(a))
        return lin(b, m, W, out, in, bias, N, Cin, Cout, a->exact);
    if (W) { /* f32: sgemm (or the decode kernels) item by item */
        for (int i = 0, r = 0; i < a->nitems; r += a->item_rows[i++])
            lin(b, m, W, out + (size_t)r * Cout, in + (size_t)r * Cin, bias, a->item_rows[i], Cin, Cout, 0);
        return;
    }
    sp_qmat_mul_items(m, in, out, a->item_rows, a->nitems, b->pool);
    for (int i = 0; bias && i < N; i++)
        for (int c = 0; c < Cout; c++)
            out[(size_t)i * Cout + c] += bias[c];
}

/* lin_bwd over a pass's rows; merged items (split_items: no weight gradients there) item by item as in lin_a. */
static void lin_bwd_a(const sp_qmat *m, const float *W, float *dinp, float *dW, float *dbias, const float *dout,
                      const float *inp, int N, int Cin, int Cout, const sp_block *b, const acts *a)
{
    if (!split_items(a))
        return lin_bwd(m, W, dinp, dW, dbias, dout, inp, N, Cin, Cout, b->pool);
    if (!W)
        return sp_qmat_mul_t_acc_items(m, dout, dinp, a->item_rows, a->nitems, b->pool);
    for (int i = 0, r = 0; i < a->nitems; r += a->item_rows[i++])
        lin_bwd(m, W, dinp + (size_t)r * Cin, NULL, NULL, dout + (size_t)r * Cout, NULL, a->item_rows[i], Cin, Cout,
                b->pool);
}

static size_t mlp_rows(const sp_block *b, size_t N) { return is_moe(b) ? N * (size_t)b->k.top_k : N; }

/* Inference steps over a KV cache of at most this many positions (decode, beams, small steps) attend on the
 * engine's pool in the own kernels (no BLAS); longer ones, and every pass without a cache (training's forward
 * and backward, which must agree bit for bit), through sgemm. The probs buffer is sized for it whenever T is
 * this short. */
#define POOL_ATTN_T 8

static int pool_attention(const sp_attn_dims *d) { return !d->keep_probs && d->T <= POOL_ATTN_T; }

static int attn_chunks(const sp_attn_dims *d);

/* Query rows of a prefill's attention unit without keep_probs: each unit's sgemms cover only the keys its rows
 * see (causal), so a long prompt's scores cost about half of a whole head's [T, S] (stories15M, 532 tokens, 1
 * thread, avx2: 1.11x the prefill's tokens/s of whole heads; 32 rows the same, 96 and 128 less). */
#define ATTN_UNIT_ROWS 64

/* A prefill's attention (sp_attention_forward's sgemms) split over the pool: its parts (one a thread, at most
 * one a unit) and the query rows of a unit (tq): a whole head with keep_probs; without, ATTN_UNIT_ROWS, fewer
 * (a multiple of 16) where the parts' scratches of [tq, S] probs would take more than 16M floats together
 * (64 MB). */
static int attn_rows_plan(const sp_block *b, const sp_attn_dims *d, int *tq)
{
    long n = sp_pool_threads(b->pool), S = d->S > 0 ? d->S : 1, rows = (16L << 20) / (n * S);
    *tq = d->keep_probs || rows >= d->T ? d->T : rows >= 16 ? (int)(rows & ~15L) : 16;
    if (!d->keep_probs && *tq > ATTN_UNIT_ROWS)
        *tq = ATTN_UNIT_ROWS;
    long units = (long)d->B * d->nh * ((d->T + *tq - 1) / *tq);
    return (int)(n < units ? n : units);
}

/* Floats of the attention's probs buffer: with pool attention, each chunk's partial result per row and head
 * (m, l, o[hd]); a prefill's scratch of probs for each of its parts. */
static size_t probs_floats(const sp_block *b, const sp_attn_dims *d)
{
    int tq, parts = attn_rows_plan(b, d, &tq);
    size_t n = d->keep_probs ? (size_t)sp_attention_probs_size(d) : (size_t)parts * tq * d->S;
    n = n > (size_t)sp_attention_probs_size(d) ? n : (size_t)sp_attention_probs_size(d);
    size_t all = (size_t)d->B * d->nh * d->T * (size_t)attn_chunks(d) * (size_t)(d->hd + 2);
    return pool_attention(d) && all > n ? all : n;
}

/* Floats the activation buffers take for N rows of at most T positions each (RoPE's tables); with base non-NULL,
 * points a's buffers into base (the MoE's index arrays too: int32 values in float-sized slots of the same memory). */
static size_t acts_layout_n(acts *a, const sp_block *b, size_t N, int T, size_t probs_n, float *base)
{
    if (base)
        a->exact = 0, a->item_rows = NULL, a->nitems = 0;
    size_t H = (size_t)b->H, Q = (size_t)b->nh * b->hd, KV = (size_t)b->nkv * b->hd;
    size_t FF = (size_t)b->FF, half = b->rope ? (size_t)b->hd / 2 : 0, R = mlp_rows(b, N);
    size_t two = b->ln2_w != NULL, moe = is_moe(b), E = moe ? (size_t)b->k.n_experts : 0, NK = moe ? R : 0;
    size_t sizes[] = {T * half, T * half, N * H, N, N, N * Q, N * KV, N * KV, probs_n,
                      N * Q, N * H, two * N * H, two * N, two * N, is_gelu(b) ? 0 : R * FF, R * FF, R * FF,
                      N * E, NK, NK * H, NK * H};
    float **ptrs[] = {&a->cos, &a->sin, &a->ln1, &a->mean1, &a->rstd1, &a->q, &a->k, &a->v, &a->probs,
                      &a->att, &a->h1, &a->ln2, &a->mean2, &a->rstd2, &a->gate, &a->up, &a->act,
                      &a->rlog, &a->rw, &a->xs, &a->ys};
    size_t isizes[] = {NK, NK, moe ? E + 1 : 0};
    int32_t **iptrs[] = {&a->ridx, &a->slot, &a->off};
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        if (base)
            *ptrs[i] = sizes[i] ? base + total : NULL;
        total += (sizes[i] + 15) & ~(size_t)15; /* keep every buffer 64-byte aligned relative to base */
    }
    for (size_t i = 0; i < sizeof isizes / sizeof *isizes; i++) {
        if (base)
            *iptrs[i] = isizes[i] ? (int32_t *)(void *)(base + total) : NULL;
        total += (isizes[i] + 15) & ~(size_t)15;
    }
    return total;
}

static size_t acts_layout(acts *a, const sp_block *b, int B, int T, const sp_attn_dims *ad, float *base)
{
    return acts_layout_n(a, b, (size_t)B * T, T, probs_floats(b, ad), base);
}

/* Carves the activation buffers out of ws, after `extra` floats kept for the caller. */
static sp_status acts_alloc(acts *a, const sp_block *b, int B, int T, const sp_attn_dims *ad, sp_ws *ws,
                            size_t extra, sp_err *err)
{
    sp_status s = sp_ws_reserve(ws, extra + acts_layout(a, b, B, T, ad, NULL), err);
    if (s)
        return s;
    acts_layout(a, b, B, T, ad, ws->buf + extra);
    return SP_OK;
}

sp_status sp_block_check_step(int nkv, int hd, int B, int T, int pos0, const sp_kv_cache *kv, sp_err *err)
{
    if (B <= 0 || T <= 0 || pos0 < 0)
        return sp_errf(err, SP_ERR_ARG, "block: bad batch %d / length %d / position %d", B, T, pos0);
    if (kv) {
        if (kv->B != B || kv->nkv != nkv || kv->hd != hd)
            return sp_errf(err, SP_ERR_ARG, "block: KV cache holds batch %d, step has %d", kv->B, B);
        if (pos0 != kv->len)
            return sp_errf(err, SP_ERR_ARG, "block: step at position %d but the cache holds %d", pos0, kv->len);
        if (kv->len + T > kv->cap)
            return sp_errf(err, SP_ERR_RANGE, "block: %d + %d positions exceed the cache's %d", kv->len, T, kv->cap);
    }
    return SP_OK;
}

static sp_status check_dims(const sp_block *b, int B, int T, int pos0, const sp_kv_cache *kv, sp_err *err)
{
    return sp_block_check_step(b->nkv, b->hd, B, T, pos0, kv, err);
}

static sp_attn_dims attn_dims(const sp_block *b, int B, int T, const sp_kv_cache *kv, int keep)
{
    sp_attn_dims d = {.B = B, .T = T, .nh = b->nh, .nkv = b->nkv, .hd = b->hd, .keep_probs = keep, .alibi = b->alibi};
    d.past = kv ? kv->len : 0;
    d.S = d.past + T;
    d.kv_cap = kv ? kv->cap : T;
    return d;
}

/* ---------------------------------------------------------------------------------------------- */
/* forward */

/* A prefill's row-wise work (norms, RoPE, residuals) on the pool: rows [lo, hi) a part, at least 4096 values a
 * part; each row computed as on one thread (the same bits). */
typedef struct rows_job {
    const sp_block *b;
    float *out, *mean, *rstd, *k;
    const float *x, *w, *bias, *cos, *sin;
    long rows;
    int T; /* RoPE: positions a sequence (row r is position r % T) */
} rows_job;

static void run_rows(const sp_block *b, sp_pool_fn fn, rows_job *j, long row_values)
{
    long rows = j->rows, parts = rows * row_values / 4096;
    sp_pool_run_parts(b->pool, fn, j, (int)(parts < 1 ? 1 : parts > rows ? rows : parts > 4096 ? 4096 : parts));
}

static void norm_part(void *ctx, int i, int n)
{
    const rows_job *j = ctx;
    const sp_block *b = j->b;
    long lo, hi, H = b->H;
    sp_pool_split(j->rows, i, n, 1, &lo, &hi);
    float *rstd = j->rstd ? j->rstd + lo : NULL;
    if (b->k.norm == SP_NORM_RMS)
        sp_rmsnorm_forward(j->out + lo * H, rstd, j->x + lo * H, j->w, (int)(hi - lo), b->H, b->eps);
    else
        sp_layernorm_forward(j->out + lo * H, j->mean + lo, rstd, j->x + lo * H, j->w, j->bias, (int)(hi - lo), b->H,
                             b->eps);
}

static void norm_forward(const sp_block *b, float *out, float *mean, float *rstd, const float *x, const float *w,
                         const float *bias, int N)
{
    rows_job j = {.b = b, .out = out, .mean = mean, .rstd = rstd, .x = x, .w = w, .bias = bias, .rows = N};
    run_rows(b, norm_part, &j, b->H);
}

/* out[N, H] += x[N, H] (a residual) */
static void add_part(void *ctx, int i, int n)
{
    const rows_job *j = ctx;
    long lo, hi;
    sp_pool_split(j->rows * j->b->H, i, n, 16, &lo, &hi);
    for (long k = lo; k < hi; k++)
        j->out[k] += j->x[k];
}

static void residual(const sp_block *b, float *out, const float *x, int N)
{
    rows_job j = {.b = b, .out = out, .x = x, .rows = N};
    run_rows(b, add_part, &j, b->H);
}

/* RoPE on the q rows (out) and k rows (k) of rows [lo, hi) of B sequences of T positions */
static void rope_part(void *ctx, int i, int n)
{
    const rows_job *j = ctx;
    const sp_block *b = j->b;
    long lo, hi, half = b->hd / 2;
    sp_pool_split(j->rows, i, n, 1, &lo, &hi);
    for (long r = lo; r < hi; r++) {
        long t = r % j->T;
        sp_rope_forward(j->out + r * b->nh * b->hd, j->out + r * b->nh * b->hd, j->cos + t * half, j->sin + t * half,
                        1, 1, b->nh, b->hd);
        sp_rope_forward(j->k + r * b->nkv * b->hd, j->k + r * b->nkv * b->hd, j->cos + t * half, j->sin + t * half,
                        1, 1, b->nkv, b->hd);
    }
}

/* Copies the step's k/v rows [B, T, nkv*hd] into the cache at positions len..len+T. */
static void kv_append(sp_kv_cache *kv, const float *k, const float *v, int B, int T)
{
    size_t row = (size_t)kv->nkv * kv->hd;
    for (int b = 0; b < B; b++) {
        size_t dst = ((size_t)b * kv->cap + kv->len) * row, src = (size_t)b * T * row;
        memcpy(kv->k + dst, k + src, (size_t)T * row * sizeof(float));
        memcpy(kv->v + dst, v + src, (size_t)T * row * sizeof(float));
    }
}

/* The experts' weights: gate/up [FF, H] and down [H, FF] of expert e (dense blocks: e = 0), and their
 * gradients' (NULL when not asked for). */
static const float *expert_w(const float *w, int e, const sp_block *b)
{
    return w ? w + (size_t)e * b->FF * b->H : NULL;
}

static float *expert_g(float *g, int e, const sp_block *b) { return g ? g + (size_t)e * b->FF * b->H : NULL; }

/* MoE: route each token to its top-k experts, run every expert on its tokens (grouped: one GEMM per expert),
 * y[n] = sum_k w[n, k] * expert_k(x[n]), summed in expert order as transformers does. */
static void moe_forward(const sp_block *b, float *y, const float *x, int N, acts *a)
{
    int H = b->H, FF = b->FF, E = b->k.n_experts, K = b->k.top_k;
    if (!a->item_rows) /* the router stays f32; a batch's items one at a time (sgemm's bits follow its rows) */
        sp_linear_forward(a->rlog, x, b->router, NULL, N, H, E);
    for (int i = 0, r = 0; a->item_rows && i < a->nitems; r += a->item_rows[i++])
        sp_linear_forward(a->rlog + (size_t)r * E, x + (size_t)r * H, b->router, NULL, a->item_rows[i], H, E);
    sp_moe_route_forward(a->rw, a->ridx, a->rlog, N, E, K);
    memset(a->off, 0, (size_t)(E + 1) * sizeof *a->off); /* counting sort of the (token, k) pairs by expert */
    for (int i = 0; i < N * K; i++)
        a->off[a->ridx[i] + 1]++;
    for (int e = 0; e < E; e++)
        a->off[e + 1] += a->off[e];
    for (int e = 0, s = 0; e < E; e++)
        for (int i = 0; i < N * K; i++)
            if (a->ridx[i] == e)
                a->slot[s++] = i;
    for (int s = 0; s < N * K; s++)
        memcpy(a->xs + (size_t)s * H, x + (size_t)(a->slot[s] / K) * H, (size_t)H * sizeof(float));
    memset(y, 0, (size_t)N * H * sizeof(float));
    for (int e = 0; e < E; e++) {
        int o = a->off[e], cnt = a->off[e + 1] - o;
        if (!cnt)
            continue;
        size_t of = (size_t)o * FF, oh = (size_t)o * H;
        lin(b, mlp_mat(b, 0, e), expert_w(b->w_gate, e, b), a->gate + of, a->xs + oh, NULL, cnt, H, FF, a->exact);
        lin(b, mlp_mat(b, 1, e), expert_w(b->w_up, e, b), a->up + of, a->xs + oh, NULL, cnt, H, FF, a->exact);
        sp_swiglu_forward(a->act + of, a->gate + of, a->up + of, (long)cnt * FF);
        lin(b, mlp_mat(b, 2, e), expert_w(b->w_down, e, b), a->ys + oh, a->act + of, NULL, cnt, FF, H, a->exact);
        for (int s = o; s < o + cnt; s++) {
            float w = a->rw[a->slot[s]], *dst = y + (size_t)(a->slot[s] / K) * H;
            const float *src = a->ys + (size_t)s * H;
            for (int c = 0; c < H; c++)
                dst[c] += w * src[c];
        }
    }
}

/* y[N, H] = mlp(x[N, H]). */
/* The MLP's activation on the pool, in parts of at least 4096 values (an element-wise function: the same
 * values whichever thread computes them). */
typedef struct act_job {
    int kind; /* an sp_mlp_kind */
    float *out;
    const float *x, *up;
    long n;
} act_job;

static void act_part(void *ctx, int i, int n)
{
    const act_job *j = ctx;
    long lo, hi;
    sp_pool_split(j->n, i, n, 16, &lo, &hi);
    if (j->kind == SP_MLP_SWIGLU)
        sp_swiglu_forward(j->out + lo, j->x + lo, j->up + lo, hi - lo);
    else if (j->kind == SP_MLP_GELU)
        sp_gelu_forward(j->out + lo, j->x + lo, hi - lo);
    else
        sp_gelu_tanh_forward(j->out + lo, j->x + lo, hi - lo);
}

static void activation(const sp_block *b, int kind, float *out, const float *x, const float *up, long n)
{
    act_job j = {kind, out, x, up, n};
    long parts = n / 4096;
    sp_pool_run_parts(b->pool, act_part, &j, (int)(parts < 1 ? 1 : parts > 4096 ? 4096 : parts));
}

static void mlp_forward(const sp_block *b, float *y, const float *x, int N, acts *a)
{
    int H = b->H, FF = b->FF;
    long n = (long)N * FF;
    switch (b->k.mlp) {
    case SP_MLP_SWIGLU:
        lin_a(b, mlp_mat(b, 0, 0), b->w_gate, a->gate, x, NULL, N, H, FF, a);
        lin_a(b, mlp_mat(b, 1, 0), b->w_up, a->up, x, NULL, N, H, FF, a);
        activation(b, SP_MLP_SWIGLU, a->act, a->gate, a->up, n);
        lin_a(b, mlp_mat(b, 2, 0), b->w_down, y, a->act, NULL, N, FF, H, a);
        break;
    case SP_MLP_GELU:
    case SP_MLP_GELU_TANH:
        lin_a(b, mlp_mat(b, 1, 0), b->w_up, a->up, x, b->b_up, N, H, FF, a);
        activation(b, b->k.mlp, a->act, a->up, NULL, n);
        lin_a(b, mlp_mat(b, 2, 0), b->w_down, y, a->act, b->b_down, N, FF, H, a);
        break;
    case SP_MLP_MOE:
        moe_forward(b, y, x, N, a);
        break;
    }
}

/* Attention of a short step on the pool, split over the keys (as flash-decoding does): the cached positions in
 * chunks, each (sequence, chunk) a unit of work that runs every head of its rows over its keys and values only,
 * ATTN_BLOCK positions at a time with an online softmax (scores on the stack; no [heads, S] buffer): one part
 * reads a contiguous run of the cache, all heads of a block of positions while they are in cache (a head at a
 * time over the whole cache would read one 512-byte slice of every row, a page each). A chunk leaves, per (row,
 * head), its scores' max m, the sum l of exp(score - m) and o = sum exp(score - m) v; a second job combines the
 * chunks: out = sum e^(m_c - M) o_c / sum e^(m_c - M) l_c with M the largest m_c. Chunks: at least 64 positions
 * each, and at most 64 / (B T) of them (at least 1), so that the chunks' records (B T heads (hd + 2) floats a
 * chunk) stay within 64 heads' worth. The same arithmetic as sp_attention_forward (scale, ALiBi, causal mask:
 * row t of the step sees past + t + 1 keys, max-subtracted softmax), summed in another order. */
#define ATTN_BLOCK 256
#define ATTN_MIN_CHUNK 64
#define ATTN_ROWS_CHUNKS 64

static int attn_chunks(const sp_attn_dims *d)
{
    int by_len = (d->S + ATTN_MIN_CHUNK - 1) / ATTN_MIN_CHUNK, by_rows = ATTN_ROWS_CHUNKS / (d->B * d->T);
    int c = by_len < by_rows ? by_len : by_rows;
    return c < 1 ? 1 : c;
}

typedef struct attn_job {
    const sp_attn_dims *d;
    float *out, *part; /* part [B, chunks, T, nh, hd + 2]: m, l, o */
    const float *q, *k, *v;
    int chunk, chunks;
} attn_job;

static void attn_chunk_part(void *ctx, int i, int n)
{
    const attn_job *j = ctx;
    const sp_attn_dims *d = j->d;
    int T = d->T, hd = d->hd, nh = d->nh, ldq = nh * hd, ldk = d->nkv * hd, group = nh / d->nkv;
    float scale = 1.0f / sqrtf((float)hd), P[ATTN_BLOCK];
    long lo, hi;
    sp_pool_split((long)d->B * j->chunks, i, n, 1, &lo, &hi);
    for (long u = lo; u < hi; u++) {
        int b = (int)(u / j->chunks), c = (int)(u % j->chunks), s0 = c * j->chunk;
        int s1 = s0 + j->chunk < d->S ? s0 + j->chunk : d->S;
        float *recs = j->part + ((size_t)b * j->chunks + c) * T * nh * (size_t)(hd + 2);
        for (int r = 0; r < T * nh; r++) {
            float *rec = recs + (size_t)r * (hd + 2);
            rec[0] = -INFINITY, rec[1] = 0;
            memset(rec + 2, 0, (size_t)hd * sizeof(float));
        }
        for (int sb = s0; sb < s1; sb += ATTN_BLOCK)
            for (int t = 0; t < T; t++) {
                int vis = d->past + t + 1, e = sb + ATTN_BLOCK < s1 ? sb + ATTN_BLOCK : s1;
                e = e < vis ? e : vis;
                if (e <= sb)
                    continue; /* the block is past this row's keys */
                int m = e - sb;
                for (int h = 0; h < nh; h++) {
                    float *rec = recs + ((size_t)t * nh + h) * (hd + 2), *o = rec + 2;
                    size_t kv_off = (size_t)b * d->kv_cap * ldk + (size_t)sb * ldk + (size_t)(h / group) * hd;
                    const float *Q = j->q + ((size_t)b * T + t) * ldq + (size_t)h * hd;
                    sp_f32_dot_rows(j->k + kv_off, (size_t)ldk, m, hd, Q, scale, P);
                    if (d->alibi)
                        for (int s = 0; s < m; s++)
                            P[s] += d->alibi[h] * (float)(sb + s - (d->past + t));
                    float mx = rec[0], sum = 0;
                    for (int s = 0; s < m; s++)
                        mx = P[s] > mx ? P[s] : mx;
                    if (rec[1] > 0 && mx > rec[0]) { /* a larger max: what is summed so far scales down */
                        float f = expf(rec[0] - mx);
                        rec[1] *= f;
                        for (int k = 0; k < hd; k++)
                            o[k] *= f;
                    }
                    for (int s = 0; s < m; s++) {
                        P[s] = expf(P[s] - mx);
                        sum += P[s];
                    }
                    rec[0] = mx;
                    rec[1] += sum;
                    sp_f32_axpy_rows(j->v + kv_off, (size_t)ldk, m, hd, P, o);
                }
            }
    }
}

static void attn_combine_part(void *ctx, int i, int n)
{
    const attn_job *j = ctx;
    const sp_attn_dims *d = j->d;
    int T = d->T, hd = d->hd, nh = d->nh;
    long lo, hi;
    sp_pool_split((long)d->B * T * nh, i, n, 1, &lo, &hi);
    for (long u = lo; u < hi; u++) {
        int b = (int)(u / ((long)T * nh)), t = (int)(u / nh % T), h = (int)(u % nh);
        size_t stride = (size_t)T * nh * (hd + 2);
        const float *rec0 = j->part + (((size_t)b * j->chunks * T + t) * nh + h) * (size_t)(hd + 2);
        float M = -INFINITY, L = 0;
        for (int c = 0; c < j->chunks; c++)
            M = rec0[c * stride] > M ? rec0[c * stride] : M;
        float *O = j->out + ((size_t)b * T + t) * nh * hd + (size_t)h * hd;
        memset(O, 0, (size_t)hd * sizeof(float));
        for (int c = 0; c < j->chunks; c++) {
            const float *rec = rec0 + c * stride;
            if (rec[1] <= 0)
                continue;
            float w = expf(rec[0] - M);
            L += w * rec[1];
            for (int k = 0; k < hd; k++)
                O[k] += w * rec[2 + k];
        }
        float inv = 1.0f / L;
        for (int k = 0; k < hd; k++)
            O[k] *= inv;
    }
}

typedef struct attn_rows_job {
    const sp_attn_dims *d;
    float *out, *probs;
    const float *q, *k, *v;
    int tq;
} attn_rows_job;

/* Part i of n of a prefill's attention: its units, with the i-th [tq, S] scratch of probs (or the units' own
 * slices of probs with keep_probs). */
static void attn_rows_part(void *ctx, int i, int n)
{
    const attn_rows_job *j = ctx;
    const sp_attn_dims *d = j->d;
    long lo, hi;
    sp_pool_split((long)d->B * d->nh * ((d->T + j->tq - 1) / j->tq), i, n, 1, &lo, &hi);
    float *probs = j->probs + (d->keep_probs ? 0 : (size_t)i * j->tq * d->S);
    sp_attention_forward_rows(j->out, probs, j->q, j->k, j->v, d, j->tq, lo, hi);
}

static void attention(const sp_block *b, float *out, float *probs, const float *q, const float *k, const float *v,
                      const sp_attn_dims *d, int cached)
{
    if (!cached || !pool_attention(d)) {
        attn_rows_job j = {d, out, probs, q, k, v, d->T};
        int parts = openblas_get_num_threads() == 1 ? attn_rows_plan(b, d, &j.tq) : 1;
        if (parts == 1 && j.tq == d->T)
            sp_attention_forward(out, probs, q, k, v, d);
        else
            sp_pool_run_parts(b->pool, attn_rows_part, &j, parts);
        return;
    }
    int chunks = attn_chunks(d), chunk = (d->S + chunks - 1) / chunks;
    attn_job j = {d, out, probs, q, k, v, chunk, chunks};
    /* parts when there is enough to do (64K multiply-adds of scores and values a part) */
    long units = (long)d->B * chunks, work = (long)d->B * d->nh * d->T * (long)d->S * d->hd * 2 / 65536;
    sp_pool_run_parts(b->pool, attn_chunk_part, &j, (int)(work < 1 ? 1 : work < units ? work : units));
    long rows = (long)d->B * d->T * d->nh, cwork = rows * chunks * d->hd / 65536;
    sp_pool_run_parts(b->pool, attn_combine_part, &j, (int)(cwork < 1 ? 1 : cwork < rows ? cwork : rows));
}

/* Norm 1 and the q, k, v projections of N rows (RoPE and the attention come after). */
static void attn_in(const sp_block *b, const float *inp, int N, acts *a)
{
    int H = b->H, Q = b->nh * b->hd, KV = b->nkv * b->hd;
    norm_forward(b, a->ln1, a->mean1, a->rstd1, inp, b->ln1_w, b->ln1_b, N);
    lin_a(b, &b->qm[M_Q], b->wq, a->q, a->ln1, b->bq, N, H, Q, a);
    lin_a(b, &b->qm[M_K], b->wk, a->k, a->ln1, b->bk, N, H, KV, a);
    lin_a(b, &b->qm[M_V], b->wv, a->v, a->ln1, b->bv, N, H, KV, a);
}

/* RoPE on B sequences' q and k rows (T positions each from pos0; ALiBi goes into the scores instead), then their
 * attention: over the cache (this step appended first) or over the step itself. q, k, v, att: the rows' own. */
static void attn_mid(const sp_block *b, float *att, float *q, float *k, const float *v, int B, int T, int pos0,
                     sp_kv_cache *kv, const sp_attn_dims *ad, acts *a)
{
    if (b->rope) {
        sp_rope_tables(b->rope, pos0, T, a->cos, a->sin);
        rows_job j = {.b = b, .out = q, .k = k, .cos = a->cos, .sin = a->sin, .rows = (long)B * T, .T = T};
        run_rows(b, rope_part, &j, (long)(b->nh + b->nkv) * b->hd);
    }
    const float *K = k, *V = v;
    if (kv) { /* append this step, attend over the whole cached prefix */
        kv_append(kv, k, v, B, T);
        K = kv->k;
        V = kv->v;
    }
    attention(b, att, a->probs, q, K, V, ad, kv != NULL);
}

/* The attention's output projection and residual (h1 = x + att Wo^T + bo), then the MLP on n2(h1) (sequential)
 * or n2(x) (parallel; n1(x) itself with one norm) and its residual, over N rows. */
static void attn_out_mlp(const sp_block *b, float *out, const float *inp, int N, acts *a)
{
    int H = b->H, Q = b->nh * b->hd;
    lin_a(b, &b->qm[M_O], b->wo, a->h1, a->att, b->bo, N, Q, H, a);
    residual(b, a->h1, inp, N);
    const float *m = a->ln1;
    if (b->ln2_w) {
        norm_forward(b, a->ln2, a->mean2, a->rstd2, b->k.parallel ? inp : a->h1, b->ln2_w, b->ln2_b, N);
        m = a->ln2;
    }
    mlp_forward(b, out, m, N, a);
    residual(b, out, a->h1, N);
}

/* The forward pass proper; fills `a`. */
static void forward_acts(const sp_block *b, float *out, const float *inp, int B, int T, int pos0, sp_kv_cache *kv,
                         const sp_attn_dims *ad, acts *a)
{
    attn_in(b, inp, B * T, a);
    attn_mid(b, a->att, a->q, a->k, a->v, B, T, pos0, kv, ad, a);
    attn_out_mlp(b, out, inp, B * T, a);
    if (kv)
        kv->len += T;
}

size_t sp_block_ws_floats(const sp_block *b, int B, int T, int cap)
{
    sp_attn_dims ad = attn_dims(b, B, T, NULL, 0);
    ad.S = cap > T ? cap : T;
    ad.past = ad.S - T;
    ad.kv_cap = ad.S;
    acts a;
    return acts_layout(&a, b, B, T, &ad, NULL);
}

sp_status sp_block_forward(const sp_block *b, float *out, const float *inp, int B, int T, int pos0, sp_kv_cache *kv,
                           sp_ws *ws, sp_err *err)
{
    sp_status s = check_dims(b, B, T, pos0, kv, err);
    if (s)
        return s;
    sp_attn_dims ad = attn_dims(b, B, T, kv, 0);
    acts a;
    if (kv && (s = sp_ws_reserve(ws, sp_block_ws_floats(b, B, T, kv->cap > ad.S ? kv->cap : ad.S), err)))
        return s; /* room for the cache's whole length at once: the decode steps that follow reserve nothing more */
    s = acts_alloc(&a, b, B, T, &ad, ws, 0, err);
    if (s)
        return s;
    SP_TRACE(SP_TR_BLOCK);
    forward_acts(b, out, inp, B, T, pos0, kv, &ad, &a);
    SP_TRACE(SP_TR_BLOCK_DONE);
    return SP_OK;
}

/* 1 if every product of the block runs in integers at the current kernel level (int8 or nf4 matrices there): the
 * decode kernels at any number of rows, alone as in a batch (kern.h, sp_qmat_mul). */
static int rows_any(const sp_block *b)
{
    for (int i = 0; i < b->nqm; i++)
        if (b->qm[i].q && !sp_kern_integer(b->qm[i].type))
            return 0;
    return b->nqm > 0;
}

/* The item rows, the most positions and the largest attention buffer of a batch of steps (T[i] positions each, T
 * NULL: 1); an error for an item whose cache has no room or holds rows of another shape, or of too many rows. */
static sp_status batch_dims(const sp_block *b, sp_kv_cache *const *kv, const int *T, int n, int *rows, int *item_rows,
                            int *tmax, size_t *probs_n, sp_err *err)
{
    *rows = 0;
    *probs_n = 0;
    *tmax = 1;
    for (int i = 0; i < n; i++) {
        int t = T ? T[i] : 1;
        sp_status s = check_dims(b, kv[i]->B, t, kv[i]->len, kv[i], err);
        if (s)
            return s;
        if ((long)kv[i]->B * t > SP_KERN_MAX_ROWS && !rows_any(b))
            return sp_errf(err, SP_ERR_ARG, "block: a batched step of %d x %d rows (at most %d in %s weights)",
                           kv[i]->B, t, SP_KERN_MAX_ROWS, sp_wtype_name(b->wtype));
        sp_attn_dims ad = attn_dims(b, kv[i]->B, t, kv[i], 0);
        ad.S = kv[i]->cap; /* the cache's whole length: later steps need no more */
        size_t p = probs_floats(b, &ad);
        *probs_n = p > *probs_n ? p : *probs_n;
        *tmax = t > *tmax ? t : *tmax;
        item_rows[i] = kv[i]->B * t;
        *rows += item_rows[i];
    }
    return SP_OK;
}

int sp_block_rows_exact(const sp_block *b, int rows)
{
    return rows > 0 && (mlp_rows(b, (size_t)rows) <= SP_KERN_MAX_ROWS || rows_any(b));
}

sp_status sp_block_step_batch(const sp_block *b, float *out, const float *inp, sp_kv_cache *const *kv, const int *T,
                              int n, int *item_rows, sp_ws *ws, sp_err *err)
{
    int N, tmax;
    size_t probs_n;
    sp_status s = batch_dims(b, kv, T, n, &N, item_rows, &tmax, &probs_n, err);
    if (s)
        return s;
    acts a;
    if ((s = sp_ws_reserve(ws, acts_layout_n(&a, b, (size_t)N, tmax, probs_n, NULL), err)))
        return s;
    acts_layout_n(&a, b, (size_t)N, tmax, probs_n, ws->buf);
    a.exact = 1;
    a.item_rows = item_rows;
    a.nitems = n;
    SP_TRACE(SP_TR_BLOCK);
    attn_in(b, inp, N, &a);
    size_t Q = (size_t)b->nh * b->hd, KV = (size_t)b->nkv * b->hd;
    for (int i = 0, r = 0; i < n; r += item_rows[i++]) { /* each sequence over its own cache, at its position */
        int t = T ? T[i] : 1;
        sp_attn_dims ad = attn_dims(b, kv[i]->B, t, kv[i], 0);
        attn_mid(b, a.att + r * Q, a.q + r * Q, a.k + r * KV, a.v + r * KV, kv[i]->B, t, kv[i]->len, kv[i], &ad, &a);
    }
    attn_out_mlp(b, out, inp, N, &a);
    for (int i = 0; i < n; i++)
        kv[i]->len += T ? T[i] : 1;
    SP_TRACE(SP_TR_BLOCK_DONE);
    return SP_OK;
}

sp_status sp_block_decode_batch(const sp_block *b, float *out, const float *inp, sp_kv_cache *const *kv, int n,
                                int *item_rows, sp_ws *ws, sp_err *err)
{
    return sp_block_step_batch(b, out, inp, kv, NULL, n, item_rows, ws, err);
}

/* ---------------------------------------------------------------------------------------------- */
/* backward */

/* Gradient buffers a backward needs in front of the activations. */
typedef struct grads {
    float *out;                   /* the recomputed forward's output (unused) [N, H] */
    float *dh1, *dln1, *dln2;     /* [N, H]; dh1 ends as the input's gradient */
    float *datt, *dq, *dk, *dv;   /* [N, Q], [N, Q], [N, KV] x2 */
    float *dq_pre, *dk_pre;       /* before RoPE */
    float *scratch;               /* attention: one [T, S] */
    float *dact, *dgate, *dup;    /* [R, FF] */
    float *dys, *dxs, *dw, *dlog; /* MoE: [NK, H] x2, [N, K], [N, E] */
} grads;

static size_t grads_layout(grads *g, const sp_block *b, int B, int T, const sp_attn_dims *ad, float *base)
{
    size_t N = (size_t)B * T, H = (size_t)b->H, Q = (size_t)b->nh * b->hd, KV = (size_t)b->nkv * b->hd;
    size_t FF = (size_t)b->FF, R = mlp_rows(b, N), moe = is_moe(b), NK = moe ? R : 0;
    size_t E = moe ? (size_t)b->k.n_experts : 0, rope = b->rope != NULL;
    size_t sizes[] = {N * H, N * H, N * H, N * H, N * Q, N * Q, N * KV, N * KV, rope * N * Q, rope * N * KV,
                      (size_t)sp_attention_scratch_size(ad), R * FF, is_gelu(b) ? 0 : R * FF, R * FF, NK * H, NK * H,
                      NK, N * E};
    float **ptrs[] = {&g->out, &g->dh1, &g->dln1, &g->dln2, &g->datt, &g->dq, &g->dk, &g->dv, &g->dq_pre,
                      &g->dk_pre, &g->scratch, &g->dact, &g->dgate, &g->dup, &g->dys, &g->dxs, &g->dw, &g->dlog};
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        if (base)
            *ptrs[i] = sizes[i] ? base + total : NULL;
        total += (sizes[i] + 15) & ~(size_t)15;
    }
    return total;
}

/* dx += norm'(x)^T dy; weight (and bias) gradients into gw, gb when non-NULL. */
static void norm_backward(const sp_block *b, float *dx, float *gw, float *gb, const float *dy, const float *x,
                          const float *w, const float *mean, const float *rstd, int N)
{
    if (b->k.norm == SP_NORM_RMS)
        sp_rmsnorm_backward(dx, gw, dy, x, w, rstd, N, b->H);
    else
        sp_layernorm_backward(dx, gw, gb, dy, x, w, mean, rstd, N, b->H);
}

#define GRAD(t) (gw ? gw->t : NULL)

/* MoE backward: each slot's gradient is its weight times the token's; the routing weights' gradient
 * dw[n, k] = dy[n] . expert_k(x[n]) goes through the renormalised softmax to the router logits. */
static void moe_backward(const sp_block *b, float *dx, sp_block *gw, const float *dy, const float *x, const acts *a,
                         const grads *g, int N)
{
    int H = b->H, FF = b->FF, E = b->k.n_experts, K = b->k.top_k;
    for (int s = 0; s < N * K; s++) {
        const float *d = dy + (size_t)(a->slot[s] / K) * H, *ys = a->ys + (size_t)s * H;
        float w = a->rw[a->slot[s]], dot = 0, *dys = g->dys + (size_t)s * H;
        for (int c = 0; c < H; c++) {
            dot += d[c] * ys[c];
            dys[c] = w * d[c];
        }
        g->dw[a->slot[s]] = dot;
    }
    sp_moe_route_backward(g->dlog, g->dw, a->rw, a->ridx, N, E, K);
    sp_linear_backward(dx, GRAD(router), NULL, g->dlog, x, b->router, N, H, E);
    for (int e = 0; e < E; e++) {
        int o = a->off[e], cnt = a->off[e + 1] - o;
        if (!cnt)
            continue;
        size_t of = (size_t)o * FF, oh = (size_t)o * H;
        lin_bwd(mlp_mat(b, 2, e), expert_w(b->w_down, e, b), g->dact + of, expert_g(GRAD(w_down), e, b), NULL,
                g->dys + oh, a->act + of, cnt, FF, H, b->pool);
        sp_swiglu_backward(g->dgate + of, g->dup + of, g->dact + of, a->gate + of, a->up + of, (long)cnt * FF);
        lin_bwd(mlp_mat(b, 0, e), expert_w(b->w_gate, e, b), g->dxs + oh, expert_g(GRAD(w_gate), e, b), NULL,
                g->dgate + of, a->xs + oh, cnt, H, FF, b->pool);
        lin_bwd(mlp_mat(b, 1, e), expert_w(b->w_up, e, b), g->dxs + oh, expert_g(GRAD(w_up), e, b), NULL,
                g->dup + of, a->xs + oh, cnt, H, FF, b->pool);
    }
    for (int s = 0; s < N * K; s++) { /* scatter the slots' input gradients back to their tokens */
        float *d = dx + (size_t)(a->slot[s] / K) * H;
        const float *src = g->dxs + (size_t)s * H;
        for (int c = 0; c < H; c++)
            d[c] += src[c];
    }
}

/* dx += mlp'(x)^T dy. */
static void mlp_backward(const sp_block *b, float *dx, sp_block *gw, const float *dy, const float *x, const acts *a,
                         const grads *g, int N)
{
    int H = b->H, FF = b->FF;
    long n = (long)N * FF;
    switch (b->k.mlp) {
    case SP_MLP_SWIGLU:
        lin_bwd_a(mlp_mat(b, 2, 0), b->w_down, g->dact, GRAD(w_down), NULL, dy, a->act, N, FF, H, b, a);
        sp_swiglu_backward(g->dgate, g->dup, g->dact, a->gate, a->up, n);
        lin_bwd_a(mlp_mat(b, 0, 0), b->w_gate, dx, GRAD(w_gate), NULL, g->dgate, x, N, H, FF, b, a);
        lin_bwd_a(mlp_mat(b, 1, 0), b->w_up, dx, GRAD(w_up), NULL, g->dup, x, N, H, FF, b, a);
        break;
    case SP_MLP_GELU:
    case SP_MLP_GELU_TANH:
        lin_bwd_a(mlp_mat(b, 2, 0), b->w_down, g->dact, GRAD(w_down), GRAD(b_down), dy, a->act, N, FF, H, b, a);
        if (b->k.mlp == SP_MLP_GELU)
            sp_gelu_backward(g->dup, g->dact, a->up, n);
        else
            sp_gelu_tanh_backward(g->dup, g->dact, a->up, n);
        lin_bwd_a(mlp_mat(b, 1, 0), b->w_up, dx, GRAD(w_up), GRAD(b_up), g->dup, x, N, H, FF, b, a);
        break;
    case SP_MLP_MOE:
        moe_backward(b, dx, gw, dy, x, a, g, N);
        break;
    }
}

/* The backward proper over the activations of a forward; gbuf: grads_layout() floats. */
static void backward_acts(const sp_block *b, float *dinp, const float *dout, const float *inp, int B, int T,
                          const sp_attn_dims *adp, const acts *ap, sp_block *gw, float *gbuf)
{
    int N = B * T, H = b->H, Q = b->nh * b->hd, KV = b->nkv * b->hd;
    sp_attn_dims ad = *adp;
    acts a = *ap;
    grads g;
    size_t total = grads_layout(&g, b, B, T, &ad, gbuf);
    memset(gbuf, 0, total * sizeof(float)); /* every gradient buffer below accumulates */

    /* out = h1 + mlp(m): h1 gets dout, the MLP's input its share (into dln1 directly when it shares n1) */
    memcpy(g.dh1, dout, (size_t)N * H * sizeof(float));
    mlp_backward(b, b->ln2_w ? g.dln2 : g.dln1, gw, dout, b->ln2_w ? a.ln2 : a.ln1, &a, &g, N);
    if (b->ln2_w && !b->k.parallel) /* sequential: n2 is of h1 */
        norm_backward(b, g.dh1, GRAD(ln2_w), GRAD(ln2_b), g.dln2, a.h1, b->ln2_w, a.mean2, a.rstd2, N);
    /* h1 = x + att Wo^T + bo */
    lin_bwd_a(&b->qm[M_O], b->wo, g.datt, GRAD(wo), GRAD(bo), g.dh1, a.att, N, Q, H, b, &a);
    sp_attention_backward(g.dq, g.dk, g.dv, g.scratch, g.datt, a.probs, a.q, a.k, a.v, &ad);
    float *dq = g.dq, *dk = g.dk;
    if (b->rope) { /* RoPE is a rotation: back-propagate through its transpose */
        sp_rope_backward(g.dq_pre, g.dq, a.cos, a.sin, B, T, b->nh, b->hd);
        sp_rope_backward(g.dk_pre, g.dk, a.cos, a.sin, B, T, b->nkv, b->hd);
        dq = g.dq_pre;
        dk = g.dk_pre;
    }
    lin_bwd_a(&b->qm[M_Q], b->wq, g.dln1, GRAD(wq), GRAD(bq), dq, a.ln1, N, H, Q, b, &a);
    lin_bwd_a(&b->qm[M_K], b->wk, g.dln1, GRAD(wk), GRAD(bk), dk, a.ln1, N, H, KV, b, &a);
    lin_bwd_a(&b->qm[M_V], b->wv, g.dln1, GRAD(wv), GRAD(bv), g.dv, a.ln1, N, H, KV, b, &a);
    /* x feeds the residual (dh1), n1, and in a parallel block with two norms n2 */
    if (b->ln2_w && b->k.parallel)
        norm_backward(b, g.dh1, GRAD(ln2_w), GRAD(ln2_b), g.dln2, inp, b->ln2_w, a.mean2, a.rstd2, N);
    norm_backward(b, g.dh1, GRAD(ln1_w), GRAD(ln1_b), g.dln1, inp, b->ln1_w, a.mean1, a.rstd1, N);
    memcpy(dinp, g.dh1, (size_t)N * H * sizeof(float));
}

#undef GRAD

/* Merged training requests (sp_block_forward_items): item_rows[0..n) in order, each a whole number of sequences
 * (multiples of T) adding up to B x T; MoE blocks route a batch's rows together, so they take none. */
static sp_status check_items(const sp_block *b, int B, int T, const int *item_rows, int n, sp_err *err)
{
    if (!item_rows)
        return SP_OK;
    if (is_moe(b))
        return sp_errf(err, SP_ERR_UNSUPPORTED, "block: a mixture of experts does not run merged requests");
    long sum = 0;
    for (int i = 0; i < n; i++) {
        if (item_rows[i] <= 0 || item_rows[i] % T)
            return sp_errf(err, SP_ERR_ARG, "block: item %d of %d rows is not a number of sequences of %d", i,
                           item_rows[i], T);
        sum += item_rows[i];
    }
    if (sum != (long)B * T)
        return sp_errf(err, SP_ERR_ARG, "block: items of %ld rows in all, not %d x %d", sum, B, T);
    return SP_OK;
}

static void set_items(acts *a, const int *item_rows, int n)
{
    a->item_rows = item_rows;
    a->nitems = item_rows ? n : 0;
}

/* sp_block_backward, or sp_block_backward_items when item_rows is set (gw NULL then). */
static sp_status backward_recompute(const sp_block *b, float *dinp, const float *dout, const float *inp, int B, int T,
                                    int pos0, const int *item_rows, int n, sp_block *gw, sp_ws *ws, sp_err *err)
{
    sp_status s = check_dims(b, B, T, pos0, NULL, err);
    if (s || (s = check_items(b, B, T, item_rows, n, err)))
        return s;
    if (gw && b->wtype != SP_W_F32)
        return sp_errf(err, SP_ERR_UNSUPPORTED, "block: weight gradients need f32 weights, not %s",
                       sp_wtype_name(b->wtype));
    sp_attn_dims ad = attn_dims(b, B, T, NULL, 1);
    grads g;
    size_t gsz = grads_layout(&g, b, B, T, &ad, NULL);
    acts a;
    s = acts_alloc(&a, b, B, T, &ad, ws, gsz, err);
    if (s)
        return s;
    set_items(&a, item_rows, n);
    forward_acts(b, ws->buf, inp, B, T, pos0, NULL, &ad, &a); /* into grads' `out`, which nothing reads */
    backward_acts(b, dinp, dout, inp, B, T, &ad, &a, gw, ws->buf);
    return SP_OK;
}

sp_status sp_block_backward(const sp_block *b, float *dinp, const float *dout, const float *inp, int B, int T,
                            int pos0, sp_block *gw, sp_ws *ws, sp_err *err)
{
    return backward_recompute(b, dinp, dout, inp, B, T, pos0, NULL, 0, gw, ws, err);
}

/* ---------------------------------------------------------------------------------------------- */
/* forward keeping the activations, backward from them */

size_t sp_block_acts_floats(const sp_block *b, int B, int T)
{
    acts a;
    sp_attn_dims ad = attn_dims(b, B, T, NULL, 1);
    return acts_layout(&a, b, B, T, &ad, NULL);
}

void sp_block_acts_free(sp_block_acts *k)
{
    free(k->buf);
    memset(k, 0, sizeof *k);
}

/* sp_block_forward_keep, with items when item_rows is set. */
static sp_status forward_keep(const sp_block *b, float *out, const float *inp, int B, int T, int pos0,
                              const int *item_rows, int n, sp_block_acts *k, sp_err *err)
{
    sp_status s = check_dims(b, B, T, pos0, NULL, err);
    if (s || (s = check_items(b, B, T, item_rows, n, err)))
        return s;
    sp_attn_dims ad = attn_dims(b, B, T, NULL, 1);
    acts a;
    size_t need = acts_layout(&a, b, B, T, &ad, NULL);
    if (k->cap < need) {
        float *p = realloc(k->buf, need * sizeof(float));
        if (!p)
            return sp_errf(err, SP_ERR_NOMEM, "block: out of memory keeping %zu activations", need);
        k->buf = p;
        k->cap = need;
    }
    acts_layout(&a, b, B, T, &ad, k->buf);
    set_items(&a, item_rows, n);
    forward_acts(b, out, inp, B, T, pos0, NULL, &ad, &a);
    k->B = B;
    k->T = T;
    k->pos0 = pos0;
    return SP_OK;
}

sp_status sp_block_forward_keep(const sp_block *b, float *out, const float *inp, int B, int T, int pos0,
                                sp_block_acts *k, sp_err *err)
{
    return forward_keep(b, out, inp, B, T, pos0, NULL, 0, k, err);
}

/* sp_block_backward_kept, with items when item_rows is set (gw NULL then). */
static sp_status backward_kept(const sp_block *b, float *dinp, const float *dout, const float *inp,
                               const sp_block_acts *k, const int *item_rows, int n, sp_block *gw, sp_ws *ws,
                               sp_err *err)
{
    if (!k || !k->buf)
        return sp_errf(err, SP_ERR_STATE, "block: no kept activations");
    if (gw && b->wtype != SP_W_F32)
        return sp_errf(err, SP_ERR_UNSUPPORTED, "block: weight gradients need f32 weights, not %s",
                       sp_wtype_name(b->wtype));
    sp_status s = check_items(b, k->B, k->T, item_rows, n, err);
    if (s)
        return s;
    sp_attn_dims ad = attn_dims(b, k->B, k->T, NULL, 1);
    acts a;
    if (acts_layout(&a, b, k->B, k->T, &ad, NULL) > k->cap)
        return sp_errf(err, SP_ERR_STATE, "block: kept activations are too small for [%d, %d]", k->B, k->T);
    acts_layout(&a, b, k->B, k->T, &ad, k->buf);
    set_items(&a, item_rows, n);
    grads g;
    if ((s = sp_ws_reserve(ws, grads_layout(&g, b, k->B, k->T, &ad, NULL), err)))
        return s;
    backward_acts(b, dinp, dout, inp, k->B, k->T, &ad, &a, gw, ws->buf);
    return SP_OK;
}

sp_status sp_block_backward_kept(const sp_block *b, float *dinp, const float *dout, const float *inp,
                                 const sp_block_acts *k, sp_block *gw, sp_ws *ws, sp_err *err)
{
    return backward_kept(b, dinp, dout, inp, k, NULL, 0, gw, ws, err);
}

/* ---------------------------------------------------------------------------------------------- */
/* merged training requests */

sp_status sp_block_forward_items(const sp_block *b, float *out, const float *inp, int B, int T, int pos0,
                                 const int *item_rows, int n, sp_block_acts *k, sp_ws *ws, sp_err *err)
{
    if (k)
        return forward_keep(b, out, inp, B, T, pos0, item_rows, n, k, err);
    sp_status s = check_dims(b, B, T, pos0, NULL, err);
    if (s || (s = check_items(b, B, T, item_rows, n, err)))
        return s;
    sp_attn_dims ad = attn_dims(b, B, T, NULL, 0);
    acts a;
    if ((s = acts_alloc(&a, b, B, T, &ad, ws, 0, err)))
        return s;
    set_items(&a, item_rows, n);
    forward_acts(b, out, inp, B, T, pos0, NULL, &ad, &a);
    return SP_OK;
}

sp_status sp_block_backward_items(const sp_block *b, float *dinp, const float *dout, const float *inp, int B, int T,
                                  int pos0, const int *item_rows, int n, const sp_block_acts *k, sp_ws *ws,
                                  sp_err *err)
{
    if (!k)
        return backward_recompute(b, dinp, dout, inp, B, T, pos0, item_rows, n, NULL, ws, err);
    if (k->B != B || k->T != T)
        return sp_errf(err, SP_ERR_ARG, "block: kept activations of [%d, %d] for a backward of [%d, %d]", k->B, k->T,
                       B, T);
    return backward_kept(b, dinp, dout, inp, k, item_rows, n, NULL, ws, err);
}

/* Copies sequences [sb0, sb0 + nb) (of T positions) of every activation buffer of src to sequences db0.. of dst
 * (probs: [B, heads, T, T]; RoPE's tables, shared, whole). */
static void acts_rows_copy(const sp_block *b, acts *dst, int db0, const acts *src, int sb0, int nb, int T)
{
    size_t N = (size_t)nb * T, H = (size_t)b->H, Q = (size_t)b->nh * b->hd, KV = (size_t)b->nkv * b->hd;
    size_t FF = (size_t)b->FF, P = (size_t)b->nh * T * T, half = b->rope ? (size_t)b->hd / 2 : 0;
    struct { float *d; const float *s; size_t w; } c[] = {
        {dst->ln1, src->ln1, H}, {dst->mean1, src->mean1, 1}, {dst->rstd1, src->rstd1, 1}, {dst->q, src->q, Q},
        {dst->k, src->k, KV}, {dst->v, src->v, KV}, {dst->att, src->att, Q}, {dst->h1, src->h1, H},
        {dst->ln2, src->ln2, H}, {dst->mean2, src->mean2, 1}, {dst->rstd2, src->rstd2, 1},
        {dst->gate, src->gate, FF}, {dst->up, src->up, FF}, {dst->act, src->act, FF}};
    for (size_t i = 0; i < sizeof c / sizeof *c; i++)
        if (c[i].d && c[i].s)
            memcpy(c[i].d + (size_t)db0 * T * c[i].w, c[i].s + (size_t)sb0 * T * c[i].w, N * c[i].w * sizeof(float));
    memcpy(dst->probs + (size_t)db0 * P, src->probs + (size_t)sb0 * P, (size_t)nb * P * sizeof(float));
    if (half) {
        memcpy(dst->cos, src->cos, (size_t)T * half * sizeof(float));
        memcpy(dst->sin, src->sin, (size_t)T * half * sizeof(float));
    }
}

/* Points a at k's buffer laid out for [B, T] (grown to that first when grow is set): 0, or -1. */
static int acts_of(const sp_block *b, acts *a, sp_block_acts *k, int B, int T, int grow)
{
    sp_attn_dims ad = attn_dims(b, B, T, NULL, 1);
    size_t need = acts_layout(a, b, B, T, &ad, NULL);
    if (grow && k->cap < need) {
        float *p = realloc(k->buf, need * sizeof(float));
        if (!p)
            return -1;
        k->buf = p;
        k->cap = need;
    }
    if (!k->buf || k->cap < need)
        return -1;
    acts_layout(a, b, B, T, &ad, k->buf);
    return 0;
}

sp_status sp_block_acts_slice(const sp_block *b, sp_block_acts *dst, const sp_block_acts *src, int b0, int nb,
                              sp_err *err)
{
    if (is_moe(b) || b0 < 0 || nb < 1 || b0 + nb > src->B)
        return sp_errf(err, SP_ERR_ARG, "block: no slice [%d, %d) of kept activations of %d sequences", b0, b0 + nb,
                       src->B);
    acts s, d;
    if (acts_of(b, &s, (sp_block_acts *)src, src->B, src->T, 0) || acts_of(b, &d, dst, nb, src->T, 1))
        return sp_errf(err, SP_ERR_NOMEM, "block: out of memory slicing kept activations");
    acts_rows_copy(b, &d, 0, &s, b0, nb, src->T);
    dst->B = nb, dst->T = src->T, dst->pos0 = src->pos0;
    return SP_OK;
}

sp_status sp_block_acts_join(const sp_block *b, sp_block_acts *dst, const sp_block_acts *const *parts, int n,
                             sp_err *err)
{
    if (is_moe(b) || n < 1)
        return sp_errf(err, SP_ERR_ARG, "block: no kept activations to join");
    int B = 0, T = parts[0]->T;
    for (int i = 0; i < n; i++) {
        if (parts[i]->T != T || parts[i]->pos0 != parts[0]->pos0 || !parts[i]->buf)
            return sp_errf(err, SP_ERR_ARG, "block: kept activations of other lengths or positions do not join");
        B += parts[i]->B;
    }
    acts d, s;
    if (acts_of(b, &d, dst, B, T, 1))
        return sp_errf(err, SP_ERR_NOMEM, "block: out of memory joining kept activations");
    for (int i = 0, b0 = 0; i < n; b0 += parts[i++]->B) {
        if (acts_of(b, &s, (sp_block_acts *)parts[i], parts[i]->B, T, 0))
            return sp_errf(err, SP_ERR_STATE, "block: kept activations too small for [%d, %d]", parts[i]->B, T);
        acts_rows_copy(b, &d, b0, &s, 0, parts[i]->B, T);
    }
    dst->B = B, dst->T = T, dst->pos0 = parts[0]->pos0;
    return SP_OK;
}
