/* block.c - Llama block forward/backward as a flat list of op calls. */
#include "block.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

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

sp_status sp_llama_block_init(sp_llama_block *b, const sp_config *cfg, const sp_rope *rope, sp_err *err)
{
    memset(b, 0, sizeof *b);
    b->H = cfg->hidden;
    b->nh = cfg->n_heads;
    b->nkv = cfg->n_kv_heads;
    b->hd = cfg->head_dim;
    b->FF = cfg->intermediate;
    b->eps = cfg->norm_eps;
    b->rope = rope;
    size_t H = (size_t)b->H, Q = (size_t)b->nh * b->hd, KV = (size_t)b->nkv * b->hd, FF = (size_t)b->FF;
    size_t sizes[9] = {H, Q * H, KV * H, KV * H, H * Q, H, FF * H, FF * H, H * FF};
    float **ptrs[9] = {&b->attn_norm, &b->wq, &b->wk, &b->wv, &b->wo, &b->ffn_norm, &b->w_gate, &b->w_up, &b->w_down};
    size_t total = 0;
    for (int i = 0; i < 9; i++)
        total += sizes[i];
    b->mem = calloc(total, sizeof(float));
    if (!b->mem)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory: block of %zu floats", total);
    b->numel = total;
    float *p = b->mem;
    for (int i = 0; i < 9; i++) {
        *ptrs[i] = p;
        p += sizes[i];
    }
    return SP_OK;
}

void sp_llama_block_free(sp_llama_block *b)
{
    free(b->mem);
    b->mem = NULL;
}

sp_status sp_llama_block_load(sp_llama_block *b, sp_safetensors *st, int layer, sp_err *err)
{
    int64_t H = b->H, Q = (int64_t)b->nh * b->hd, KV = (int64_t)b->nkv * b->hd, FF = b->FF;
    struct {
        const char *name;
        float *dst;
        int ndim;
        int64_t shape[2];
    } t[] = {
        {"input_layernorm.weight", b->attn_norm, 1, {H}},
        {"self_attn.q_proj.weight", b->wq, 2, {Q, H}},
        {"self_attn.k_proj.weight", b->wk, 2, {KV, H}},
        {"self_attn.v_proj.weight", b->wv, 2, {KV, H}},
        {"self_attn.o_proj.weight", b->wo, 2, {H, Q}},
        {"post_attention_layernorm.weight", b->ffn_norm, 1, {H}},
        {"mlp.gate_proj.weight", b->w_gate, 2, {FF, H}},
        {"mlp.up_proj.weight", b->w_up, 2, {FF, H}},
        {"mlp.down_proj.weight", b->w_down, 2, {H, FF}},
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        char name[256];
        snprintf(name, sizeof name, "model.layers.%d.%s", layer, t[i].name);
        sp_status s = sp_st_read_f32(st, name, t[i].dst, t[i].ndim, t[i].shape, err);
        if (s)
            return s;
    }
    return SP_OK;
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

sp_status sp_kv_reorder(sp_kv_cache *kv, const int64_t *src, sp_err *err)
{
    size_t row = (size_t)kv->cap * kv->nkv * kv->hd, used = (size_t)kv->len * kv->nkv * kv->hd;
    float *tmp = malloc((size_t)kv->B * row * sizeof(float));
    if (!tmp)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory reordering a KV cache");
    for (int pass = 0; pass < 2; pass++) {
        float *c = pass ? kv->v : kv->k;
        memcpy(tmp, c, (size_t)kv->B * row * sizeof(float));
        for (int b = 0; b < kv->B; b++)
            memcpy(c + b * row, tmp + src[b] * row, used * sizeof(float));
    }
    free(tmp);
    return SP_OK;
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

/* ---------------------------------------------------------------------------------------------- */
/* forward */

/* Activations of one forward pass; the backward needs all of them. */
typedef struct acts {
    float *cos, *sin;        /* [T, hd/2] */
    float *ln1, *rstd1;      /* [N, H], [N] */
    float *q, *k, *v;        /* [N, nh*hd], [N, nkv*hd] x2 (after RoPE) */
    float *probs;            /* [B, nh, T, S] or [T, S] */
    float *att;              /* [N, nh*hd] */
    float *h1, *ln2, *rstd2; /* [N, H], [N, H], [N] */
    float *gate, *up, *act;  /* [N, FF] */
} acts;

/* Floats the activation buffers take; with base non-NULL, points a's buffers into base. */
static size_t acts_layout(acts *a, const sp_llama_block *b, int B, int T, const sp_attn_dims *ad, float *base)
{
    size_t N = (size_t)B * T, H = (size_t)b->H, Q = (size_t)b->nh * b->hd, KV = (size_t)b->nkv * b->hd;
    size_t FF = (size_t)b->FF, half = (size_t)b->hd / 2;
    size_t sizes[] = {T * half, T * half, N * H, N, N * Q, N * KV, N * KV, (size_t)sp_attention_probs_size(ad),
                      N * Q, N * H, N * H, N, N * FF, N * FF, N * FF};
    float **ptrs[] = {&a->cos, &a->sin, &a->ln1, &a->rstd1, &a->q, &a->k, &a->v, &a->probs,
                      &a->att, &a->h1, &a->ln2, &a->rstd2, &a->gate, &a->up, &a->act};
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        if (base)
            *ptrs[i] = base + total;
        total += (sizes[i] + 15) & ~(size_t)15; /* keep every buffer 64-byte aligned relative to base */
    }
    return total;
}

/* Carves the activation buffers out of ws, after `extra` floats kept for the caller. */
static sp_status acts_alloc(acts *a, const sp_llama_block *b, int B, int T, const sp_attn_dims *ad, sp_ws *ws,
                            size_t extra, sp_err *err)
{
    sp_status s = sp_ws_reserve(ws, extra + acts_layout(a, b, B, T, ad, NULL), err);
    if (s)
        return s;
    acts_layout(a, b, B, T, ad, ws->buf + extra);
    return SP_OK;
}

static sp_status check_dims(const sp_llama_block *b, int B, int T, int pos0, const sp_kv_cache *kv, sp_err *err)
{
    if (B <= 0 || T <= 0 || pos0 < 0)
        return sp_errf(err, SP_ERR_ARG, "block: bad batch %d / length %d / position %d", B, T, pos0);
    if (kv) {
        if (kv->B != B || kv->nkv != b->nkv || kv->hd != b->hd)
            return sp_errf(err, SP_ERR_ARG, "block: KV cache holds batch %d, step has %d", kv->B, B);
        if (pos0 != kv->len)
            return sp_errf(err, SP_ERR_ARG, "block: step at position %d but the cache holds %d", pos0, kv->len);
        if (kv->len + T > kv->cap)
            return sp_errf(err, SP_ERR_RANGE, "block: %d + %d positions exceed the cache's %d", kv->len, T, kv->cap);
    }
    return SP_OK;
}

/* The forward pass proper; fills `a`. */
static void forward_acts(const sp_llama_block *b, float *out, const float *inp, int B, int T, int pos0,
                         sp_kv_cache *kv, const sp_attn_dims *ad, acts *a)
{
    int N = B * T, H = b->H, Q = b->nh * b->hd, KV = b->nkv * b->hd, FF = b->FF;
    sp_rope_tables(b->rope, pos0, T, a->cos, a->sin);
    /* attention: rmsnorm, q/k/v projections, RoPE on q and k */
    sp_rmsnorm_forward(a->ln1, a->rstd1, inp, b->attn_norm, N, H, b->eps);
    sp_linear_forward(a->q, a->ln1, b->wq, NULL, N, H, Q);
    sp_linear_forward(a->k, a->ln1, b->wk, NULL, N, H, KV);
    sp_linear_forward(a->v, a->ln1, b->wv, NULL, N, H, KV);
    sp_rope_forward(a->q, a->q, a->cos, a->sin, B, T, b->nh, b->hd);
    sp_rope_forward(a->k, a->k, a->cos, a->sin, B, T, b->nkv, b->hd);
    const float *K = a->k, *V = a->v;
    if (kv) { /* append this step, attend over the whole cached prefix */
        kv_append(kv, a->k, a->v, B, T);
        K = kv->k;
        V = kv->v;
    }
    sp_attention_forward(a->att, a->probs, a->q, K, V, ad);
    /* residual: h1 = x + att Wo^T */
    sp_linear_forward(a->h1, a->att, b->wo, NULL, N, Q, H);
    for (long i = 0; i < (long)N * H; i++)
        a->h1[i] += inp[i];
    /* MLP: rmsnorm, SwiGLU, down projection, residual */
    sp_rmsnorm_forward(a->ln2, a->rstd2, a->h1, b->ffn_norm, N, H, b->eps);
    sp_linear_forward(a->gate, a->ln2, b->w_gate, NULL, N, H, FF);
    sp_linear_forward(a->up, a->ln2, b->w_up, NULL, N, H, FF);
    sp_swiglu_forward(a->act, a->gate, a->up, (long)N * FF);
    sp_linear_forward(out, a->act, b->w_down, NULL, N, FF, H);
    for (long i = 0; i < (long)N * H; i++)
        out[i] += a->h1[i];
    if (kv)
        kv->len += T;
}

static sp_attn_dims attn_dims(const sp_llama_block *b, int B, int T, const sp_kv_cache *kv, int keep)
{
    sp_attn_dims d = {.B = B, .T = T, .nh = b->nh, .nkv = b->nkv, .hd = b->hd, .keep_probs = keep};
    d.past = kv ? kv->len : 0;
    d.S = d.past + T;
    d.kv_cap = kv ? kv->cap : T;
    return d;
}

sp_status sp_llama_block_forward(const sp_llama_block *b, float *out, const float *inp, int B, int T, int pos0,
                                 sp_kv_cache *kv, sp_ws *ws, sp_err *err)
{
    sp_status s = check_dims(b, B, T, pos0, kv, err);
    if (s)
        return s;
    sp_attn_dims ad = attn_dims(b, B, T, kv, 0);
    acts a;
    s = acts_alloc(&a, b, B, T, &ad, ws, 0, err);
    if (s)
        return s;
    forward_acts(b, out, inp, B, T, pos0, kv, &ad, &a);
    return SP_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* backward */

/* Floats of the gradient buffers a backward needs in front of the activations: dh1, dln, the output copy,
 * dact, dgate, dup, datt, dq, dk, dv, dq/dk before RoPE, and the attention scratch. */
static size_t grads_size(const sp_llama_block *b, int B, int T, const sp_attn_dims *ad)
{
    size_t N = (size_t)B * T, H = (size_t)b->H, Q = (size_t)b->nh * b->hd, KV = (size_t)b->nkv * b->hd;
    size_t FF = (size_t)b->FF;
    return 3 * N * H + 3 * N * FF + 3 * N * Q + 3 * N * KV + (size_t)sp_attention_scratch_size(ad);
}

/* The backward proper over the activations of a forward; gbuf: grads_size() floats. */
static void backward_acts(const sp_llama_block *b, float *dinp, const float *dout, const float *inp, int B, int T,
                          const sp_attn_dims *adp, const acts *ap, sp_llama_block *g, float *gbuf)
{
    size_t N = (size_t)B * T, H = (size_t)b->H, Q = (size_t)b->nh * b->hd, KV = (size_t)b->nkv * b->hd;
    size_t FF = (size_t)b->FF;
    sp_attn_dims ad = *adp;
    acts a = *ap;
    float *dh1 = gbuf, *dln = dh1 + N * H, *outbuf = dln + N * H, *dact = outbuf + N * H;
    float *dgate = dact + N * FF, *dup = dgate + N * FF, *datt = dup + N * FF, *dq = datt + N * Q;
    float *dk = dq + N * Q, *dv = dk + N * KV, *dq_pre = dv + N * KV, *dk_pre = dq_pre + N * Q;
    float *scratch = dk_pre + N * KV;
    memset(gbuf, 0, grads_size(b, B, T, &ad) * sizeof(float)); /* every gradient buffer below accumulates */

    /* out = h1 + act Wdown^T */
    memcpy(dh1, dout, N * H * sizeof(float));
    sp_linear_backward(dact, g ? g->w_down : NULL, NULL, dout, a.act, b->w_down, (int)N, (int)FF, (int)H);
    sp_swiglu_backward(dgate, dup, dact, a.gate, a.up, (long)(N * FF));
    sp_linear_backward(dln, g ? g->w_gate : NULL, NULL, dgate, a.ln2, b->w_gate, (int)N, (int)H, (int)FF);
    sp_linear_backward(dln, g ? g->w_up : NULL, NULL, dup, a.ln2, b->w_up, (int)N, (int)H, (int)FF);
    sp_rmsnorm_backward(dh1, g ? g->ffn_norm : NULL, dln, a.h1, b->ffn_norm, a.rstd2, (int)N, (int)H);
    /* h1 = x + att Wo^T */
    sp_linear_backward(datt, g ? g->wo : NULL, NULL, dh1, a.att, b->wo, (int)N, (int)Q, (int)H);
    sp_attention_backward(dq, dk, dv, scratch, datt, a.probs, a.q, a.k, a.v, &ad);
    /* RoPE is a rotation: back-propagate through its transpose */
    memset(dln, 0, N * H * sizeof(float));
    sp_rope_backward(dq_pre, dq, a.cos, a.sin, B, T, b->nh, b->hd);
    sp_rope_backward(dk_pre, dk, a.cos, a.sin, B, T, b->nkv, b->hd);
    sp_linear_backward(dln, g ? g->wq : NULL, NULL, dq_pre, a.ln1, b->wq, (int)N, (int)H, (int)Q);
    sp_linear_backward(dln, g ? g->wk : NULL, NULL, dk_pre, a.ln1, b->wk, (int)N, (int)H, (int)KV);
    sp_linear_backward(dln, g ? g->wv : NULL, NULL, dv, a.ln1, b->wv, (int)N, (int)H, (int)KV);
    /* x feeds both the residual (dh1) and the first rmsnorm */
    sp_rmsnorm_backward(dh1, g ? g->attn_norm : NULL, dln, inp, b->attn_norm, a.rstd1, (int)N, (int)H);
    memcpy(dinp, dh1, N * H * sizeof(float));
}

sp_status sp_llama_block_backward(const sp_llama_block *b, float *dinp, const float *dout, const float *inp, int B,
                                  int T, int pos0, sp_llama_block *g, sp_ws *ws, sp_err *err)
{
    sp_status s = check_dims(b, B, T, pos0, NULL, err);
    if (s)
        return s;
    sp_attn_dims ad = attn_dims(b, B, T, NULL, 1);
    size_t gsz = grads_size(b, B, T, &ad);
    acts a;
    s = acts_alloc(&a, b, B, T, &ad, ws, gsz, err);
    if (s)
        return s;
    forward_acts(b, ws->buf + 2 * (size_t)B * T * b->H, inp, B, T, pos0, NULL, &ad, &a); /* into the output copy */
    backward_acts(b, dinp, dout, inp, B, T, &ad, &a, g, ws->buf);
    return SP_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* forward keeping the activations, backward from them */

size_t sp_llama_block_acts_floats(const sp_llama_block *b, int B, int T)
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

sp_status sp_llama_block_forward_keep(const sp_llama_block *b, float *out, const float *inp, int B, int T, int pos0,
                                      sp_block_acts *k, sp_err *err)
{
    sp_status s = check_dims(b, B, T, pos0, NULL, err);
    if (s)
        return s;
    sp_attn_dims ad = attn_dims(b, B, T, NULL, 1);
    acts a;
    size_t n = acts_layout(&a, b, B, T, &ad, NULL);
    if (k->cap < n) {
        float *p = realloc(k->buf, n * sizeof(float));
        if (!p)
            return sp_errf(err, SP_ERR_NOMEM, "block: out of memory keeping %zu activations", n);
        k->buf = p;
        k->cap = n;
    }
    acts_layout(&a, b, B, T, &ad, k->buf);
    forward_acts(b, out, inp, B, T, pos0, NULL, &ad, &a);
    k->B = B;
    k->T = T;
    k->pos0 = pos0;
    return SP_OK;
}

sp_status sp_llama_block_backward_kept(const sp_llama_block *b, float *dinp, const float *dout, const float *inp,
                                       const sp_block_acts *k, sp_llama_block *g, sp_ws *ws, sp_err *err)
{
    if (!k || !k->buf)
        return sp_errf(err, SP_ERR_STATE, "block: no kept activations");
    sp_attn_dims ad = attn_dims(b, k->B, k->T, NULL, 1);
    acts a;
    if (acts_layout(&a, b, k->B, k->T, &ad, NULL) > k->cap)
        return sp_errf(err, SP_ERR_STATE, "block: kept activations are too small for [%d, %d]", k->B, k->T);
    acts_layout(&a, b, k->B, k->T, &ad, k->buf);
    sp_status s = sp_ws_reserve(ws, grads_size(b, k->B, k->T, &ad), err);
    if (s)
        return s;
    backward_acts(b, dinp, dout, inp, k->B, k->T, &ad, &a, g, ws->buf);
    return SP_OK;
}
