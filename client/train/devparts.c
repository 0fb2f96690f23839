/* devparts.c - the client's local parts of prompt tuning on a GPU (devparts.h): three autograd ops whose values
 * live on the device (the chain's input, the deep prompts, the head and its loss), the frozen parts uploaded once.
 * Every op's context owns the device buffers its backward needs and frees them with the node. */
#include "devparts.h"

#include "device.h"
#include "kern.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef SEPAL_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda_backend.h"
#include "gemm.h"
#include "kernels.h"
#endif

int sp_devparts_parse(const char *s, int *cuda, int *index, char *why, size_t cap)
{
    int gpu = -1;
    if (sp_device_parse(s, &gpu, NULL)) {
        snprintf(why, cap, "'%s' is not a device: cpu, cuda or cuda:N", s ? s : "");
        return -1;
    }
    *cuda = gpu >= 0;
    *index = gpu >= 0 ? gpu : 0;
    return 0;
}

int sp_device_usable(int index, char *why, size_t cap)
{
#ifdef SEPAL_HAVE_CUDA
    char buf[256] = "";
    int n = sp_cuda_device_count(buf, (int)sizeof buf);
    if (index < n)
        return 1;
    if (n > 0)
        snprintf(why, cap, "no GPU %d: this machine has %d", index, n);
    else
        snprintf(why, cap, "no usable GPU: %s", buf[0] ? buf : "none found");
#else
    (void)index;
    snprintf(why, cap, "this sepal was built without CUDA");
#endif
    return 0;
}

#ifndef SEPAL_HAVE_CUDA

sp_status sp_devparts_new(sp_devparts **out, const sp_model *m, int index, int classes, int P, sp_err *err)
{
    (void)m, (void)classes, (void)P;
    char why[128];
    *out = NULL;
    sp_device_usable(index, why, sizeof why);
    return sp_errf(err, SP_ERR_UNSUPPORTED, "%s", why);
}
void sp_devparts_free(sp_devparts *d) { (void)d; }
void sp_devparts_bind(sp_devparts *d, float *p, float *gp, float *dp, float *gdp, float *s, float *gs)
{
    (void)d, (void)p, (void)gp, (void)dp, (void)gdp, (void)s, (void)gs;
}
sp_status sp_devparts_sync(sp_devparts *d, sp_err *err)
{
    (void)d;
    return sp_errf(err, SP_ERR_UNSUPPORTED, "this sepal was built without CUDA");
}
sp_t *sp_devparts_input(sp_devparts *d, sp_graph *g, sp_t *prompts, const int32_t *ids, int B, int T, int train,
                        sp_err *err)
{
    (void)d, (void)g, (void)prompts, (void)ids, (void)B, (void)T, (void)train;
    sp_errf(err, SP_ERR_UNSUPPORTED, "this sepal was built without CUDA");
    return NULL;
}
sp_t *sp_devparts_deep(sp_devparts *d, sp_t *deep, int B, int train, sp_err *err)
{
    return sp_devparts_input(d, NULL, deep, NULL, B, 0, train, err);
}
sp_t *sp_devparts_head(sp_devparts *d, sp_t *h, sp_t *score, const sp_dev_batch *b, int loss, int train, sp_err *err)
{
    (void)h, (void)score, (void)b, (void)loss;
    return sp_devparts_input(d, NULL, NULL, NULL, 0, 0, train, err);
}
sp_status sp_devparts_embed(sp_devparts *d, float *x, const int32_t *ids, int B, int T, const float *shallow, int P,
                            sp_err *err)
{
    (void)d, (void)x, (void)ids, (void)B, (void)T, (void)shallow, (void)P;
    return sp_devparts_sync(NULL, err);
}
sp_status sp_devparts_logits(sp_devparts *d, float *logits, int32_t *best, const float *hidden, int n, sp_err *err)
{
    (void)d, (void)logits, (void)best, (void)hidden, (void)n;
    return sp_devparts_sync(NULL, err);
}

#else

struct sp_devparts {
    sp_cuda *cu;
    int index; /* the GPU: the current device of whichever thread (a pipelined microbatch's) runs an op */
    int H, V, L, C, P;
    float eps;
    float *table, *norm_w, *norm_b, *emb_w, *emb_b, *head; /* the frozen parts (norm_b: a LayerNorm's bias) */
    float *prompts, *gprompts, *deep, *gdeep, *score, *gscore; /* the optimizer's buffers */
    float *ones; /* nones ones: the batch sums' GEMM operand */
    int nones;
    pthread_mutex_t gen_lock; /* generation's calls (sp_devparts_embed, sp_devparts_logits) */
    void *gen;                /* their device scratch, gen_cap bytes */
    size_t gen_cap;
    float *gen_host;          /* sp_devparts_logits' host logits when the caller wants best alone */
    size_t gen_host_cap;      /* floats */
};

/* d's GPU as this thread's current device (a thread starts on GPU 0). */
static void on(const sp_devparts *d)
{
    cudaSetDevice(d->index);
}

static sp_status up(sp_cuda *cu, float **dst, const float *src, size_t n, sp_err *err)
{
    return src ? sp_cuda_dup(cu, (void **)dst, src, n * sizeof(float), err) : SP_OK;
}

/* A zeroed device buffer of n floats (or ints). */
static sp_status zalloc(sp_cuda *cu, void *p, size_t n, sp_err *err)
{
    sp_status st = sp_cuda_alloc(cu, (void **)p, (n ? n : 1) * sizeof(float), err);
    return st ? st : sp_cuda_zero(cu, *(void **)p, (n ? n : 1) * sizeof(float), err);
}

sp_status sp_devparts_new(sp_devparts **out, const sp_model *m, int index, int classes, int P, sp_err *err)
{
    *out = NULL;
    char why[300];
    if (!sp_device_usable(index, why, sizeof why))
        return sp_errf(err, SP_ERR_UNSUPPORTED, "%s", why);
    sp_devparts *d = calloc(1, sizeof *d);
    if (!d)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&d->gen_lock, NULL);
    const sp_config *c = &m->cfg;
    d->index = index;
    d->H = c->hidden, d->V = c->vocab, d->L = c->n_layers, d->C = classes, d->P = P, d->eps = c->norm_eps;
    size_t H = (size_t)d->H, VH = (size_t)d->V * H;
    sp_status st = sp_cuda_open(&d->cu, index, err);
    if (!st && (!m->embed || !m->norm || (classes == 0 && !m->lm_head)))
        st = sp_errf(err, SP_ERR_STATE, "model: the embeddings, the final norm or the LM head are not loaded");
    if (!st)
        st = up(d->cu, &d->table, m->embed, VH, err);
    if (!st)
        st = up(d->cu, &d->norm_w, m->norm, H, err);
    if (!st)
        st = up(d->cu, &d->norm_b, m->norm_b, H, err);
    if (!st)
        st = up(d->cu, &d->emb_w, m->embed_norm_w, H, err);
    if (!st)
        st = up(d->cu, &d->emb_b, m->embed_norm_b, H, err);
    if (!st && classes == 0)
        st = up(d->cu, &d->head, m->lm_head, VH, err);
    if (st) {
        sp_devparts_free(d);
        return sp_err_prefix(err, "device: ");
    }
    *out = d;
    return SP_OK;
}

void sp_devparts_free(sp_devparts *d)
{
    if (!d)
        return;
    void *bufs[] = {d->table, d->norm_w, d->norm_b, d->emb_w, d->emb_b, d->head, d->ones, d->gen};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        sp_cuda_free(d->cu, bufs[i]);
    sp_cuda_close(d->cu);
    pthread_mutex_destroy(&d->gen_lock);
    free(d->gen_host);
    free(d);
}

void sp_devparts_bind(sp_devparts *d, float *prompts, float *gprompts, float *deep, float *gdeep, float *score,
                      float *gscore)
{
    d->prompts = prompts, d->gprompts = gprompts, d->deep = deep, d->gdeep = gdeep;
    d->score = score, d->gscore = gscore;
}

sp_status sp_devparts_sync(sp_devparts *d, sp_err *err)
{
    on(d);
    return sp_cuda_sync(d->cu, err);
}

/* g[n] += the sum over rows r < B of x[r * ld .. r * ld + n) (a batch's gradient into its parameter's), as one
 * product with a column of ones. */
static sp_status batch_sum(sp_devparts *d, float *g, const float *x, int B, int n, int ld, sp_err *err)
{
    if (B > d->nones) {
        float *one = malloc((size_t)B * sizeof *one);
        if (!one)
            return sp_errf(err, SP_ERR_NOMEM, "out of memory");
        for (int i = 0; i < B; i++)
            one[i] = 1.0f;
        sp_cuda_free(d->cu, d->ones);
        d->nones = 0;
        sp_status st = up(d->cu, &d->ones, one, (size_t)B, err);
        free(one);
        if (st)
            return st;
        d->nones = B;
    }
    sp_gemm_plan p = {0, 0, n, 1, B, ld, B, n, 1.0f, 1.0f}; /* column-major g[n, 1] += x[n, B] ones[B, 1] */
    return sp_cuda_gemm(d->cu, &p, x, d->ones, g, SP_CU_F32, err);
}

/* A host copy of n device floats (malloc'd), or NULL with err set. */
static float *to_host(sp_cuda *cu, const float *x, size_t n, sp_err *err)
{
    float *h = malloc((n ? n : 1) * sizeof *h);
    if (!h)
        sp_errf(err, SP_ERR_NOMEM, "out of memory");
    else if (sp_cuda_download(cu, h, x, n * sizeof *h, err)) {
        free(h);
        h = NULL;
    }
    return h;
}

/* ---------------------------------------------------------------------------------------------- */
/* the chain's input: prompts ++ embeddings, BLOOM's embedding norm */

typedef struct in_ctx {
    sp_devparts *d;
    int B, S;
    float *x, *mean, *rstd; /* the norm's input and statistics (NULL without an embedding norm) */
} in_ctx;

static void in_free(void *p)
{
    in_ctx *c = p;
    if (!c)
        return;
    sp_cuda_free(c->d->cu, c->x);
    sp_cuda_free(c->d->cu, c->mean);
    sp_cuda_free(c->d->cu, c->rstd);
    free(c);
}

static sp_status in_backward(void *p, const float *gout, float **gin, sp_err *err)
{
    in_ctx *c = p;
    sp_devparts *d = c->d;
    on(d);
    size_t n = (size_t)c->B * c->S * d->H;
    float *dx = NULL, *dpre = NULL;
    (void)gin; /* the prompts' gradient is the device's */
    sp_status st = sp_cuda_dup(d->cu, (void **)&dx, gout, n * sizeof(float), err);
    if (!st && c->x && !(st = zalloc(d->cu, &dpre, n, err)))
        st = sp_cuda_layernorm_bwd(d->cu, dpre, NULL, NULL, dx, c->x, d->emb_w, c->mean, c->rstd, c->B * c->S, d->H,
                                   err);
    if (!st && d->P > 0)
        st = batch_sum(d, d->gprompts, dpre ? dpre : dx, c->B, d->P * d->H, c->S * d->H, err);
    if (!st)
        st = sp_cuda_sync(d->cu, err);
    sp_cuda_free(d->cu, dx);
    sp_cuda_free(d->cu, dpre);
    return st;
}

static const sp_ext_fn in_fn = {in_backward, in_free};

sp_t *sp_devparts_input(sp_devparts *d, sp_graph *g, sp_t *prompts, const int32_t *ids, int B, int T, int train,
                        sp_err *err)
{
    on(d);
    int H = d->H, P = d->P, S = P + T;
    size_t n = (size_t)B * S * H;
    in_ctx *c = calloc(1, sizeof *c);
    int32_t *dids = NULL;
    float *emb = NULL, *x = NULL, *y = NULL, *host = NULL;
    if (!c) {
        sp_errf(err, SP_ERR_NOMEM, "out of memory");
        return NULL;
    }
    *c = (in_ctx){.d = d, .B = B, .S = S};
    sp_status st = sp_cuda_dup(d->cu, (void **)&dids, ids, (size_t)B * T * sizeof *ids, err);
    if (!st && !(st = sp_cuda_alloc(d->cu, (void **)&emb, (size_t)B * T * H * sizeof(float), err)))
        st = sp_cuda_embedding_fwd(d->cu, emb, dids, d->table, d->V, B * T, H, err);
    if (!st)
        st = sp_cuda_alloc(d->cu, (void **)&x, n * sizeof(float), err);
    for (int b = 0; !st && b < B; b++) {
        float *row = x + (size_t)b * S * H;
        if (P > 0)
            st = sp_cuda_copy_d2d(d->cu, row, d->prompts, (size_t)P * H * sizeof(float), err);
        if (!st)
            st = sp_cuda_copy_d2d(d->cu, row + (size_t)P * H, emb + (size_t)b * T * H, (size_t)T * H * sizeof(float),
                                  err);
    }
    if (!st && d->emb_w && !(st = sp_cuda_alloc(d->cu, (void **)&y, n * sizeof(float), err)) &&
        !(st = zalloc(d->cu, &c->mean, (size_t)B * S, err)) && !(st = zalloc(d->cu, &c->rstd, (size_t)B * S, err)))
        st = sp_cuda_layernorm_fwd(d->cu, y, c->mean, c->rstd, x, d->emb_w, d->emb_b, B * S, H, d->eps, err);
    if (!st)
        host = to_host(d->cu, y ? y : x, n, err);
    sp_cuda_free(d->cu, dids);
    sp_cuda_free(d->cu, emb);
    sp_cuda_free(d->cu, y);
    if (d->emb_w)
        c->x = x; /* the norm's backward needs its input */
    else
        sp_cuda_free(d->cu, x);
    int64_t shape[3] = {B, S, H};
    sp_t *o = host ? sp_external(g, 3, shape, host, train ? prompts : NULL, NULL, &in_fn, c, err) : (in_free(c), NULL);
    free(host);
    return o;
}

/* ---------------------------------------------------------------------------------------------- */
/* the deep prompts over the batch */

typedef struct deep_ctx {
    sp_devparts *d;
    int B;
} deep_ctx;

static sp_status deep_backward(void *p, const float *gout, float **gin, sp_err *err)
{
    deep_ctx *c = p;
    sp_devparts *d = c->d;
    on(d);
    size_t PH = (size_t)d->P * d->H, n = (size_t)d->L * c->B * PH;
    float *dg = NULL;
    (void)gin;
    sp_status st = sp_cuda_dup(d->cu, (void **)&dg, gout, n * sizeof(float), err);
    for (int l = 0; !st && l < d->L; l++)
        st = batch_sum(d, d->gdeep + l * PH, dg + l * c->B * PH, c->B, (int)PH, (int)PH, err);
    if (!st)
        st = sp_cuda_sync(d->cu, err);
    sp_cuda_free(d->cu, dg);
    return st;
}

static const sp_ext_fn deep_fn = {deep_backward, free};

sp_t *sp_devparts_deep(sp_devparts *d, sp_t *deep, int B, int train, sp_err *err)
{
    on(d);
    size_t PH = (size_t)d->P * d->H, n = (size_t)d->L * B * PH;
    float *rep = NULL, *host = NULL;
    deep_ctx *c = malloc(sizeof *c);
    sp_status st = c ? sp_cuda_alloc(d->cu, (void **)&rep, n * sizeof(float), err)
                     : sp_errf(err, SP_ERR_NOMEM, "out of memory");
    for (int l = 0; !st && l < d->L; l++)
        for (int b = 0; !st && b < B; b++)
            st = sp_cuda_copy_d2d(d->cu, rep + ((size_t)l * B + b) * PH, d->deep + l * PH, PH * sizeof(float), err);
    if (!st)
        host = to_host(d->cu, rep, n, err);
    sp_cuda_free(d->cu, rep);
    if (!host) {
        free(c);
        return NULL;
    }
    *c = (deep_ctx){.d = d, .B = B};
    int64_t shape[4] = {d->L, B, d->P, d->H};
    sp_t *o = sp_external(deep->g, 4, shape, host, train ? deep : NULL, NULL, &deep_fn, c, err);
    free(host);
    return o;
}

/* ---------------------------------------------------------------------------------------------- */
/* the head: the positions after the prompts, the final norm, the LM head or the pooled row's classes, the loss */

typedef struct head_ctx {
    sp_devparts *d;
    int B, T, N, out, loss, count; /* N rows of out logits; count: targets not ignored */
    int *pos;                      /* classes: each row's pooled position */
    float *xs, *y, *mean, *rstd, *pooled, *logits;
    int32_t *tg;
} head_ctx;

static void head_free(void *p)
{
    head_ctx *c = p;
    if (!c)
        return;
    void *bufs[] = {c->xs, c->y, c->mean, c->rstd, c->pooled, c->logits, c->tg};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        sp_cuda_free(c->d->cu, bufs[i]);
    free(c->pos);
    free(c);
}

/* The final norm's forward (rows of xs into y) or backward (dy into dxs). */
static sp_status final_norm(head_ctx *c, float *dxs, const float *dy, sp_err *err)
{
    sp_devparts *d = c->d;
    int N = c->B * c->T;
    if (d->norm_b)
        return dxs ? sp_cuda_layernorm_bwd(d->cu, dxs, NULL, NULL, dy, c->xs, d->norm_w, c->mean, c->rstd, N, d->H, err)
                   : sp_cuda_layernorm_fwd(d->cu, c->y, c->mean, c->rstd, c->xs, d->norm_w, d->norm_b, N, d->H, d->eps,
                                           err);
    return dxs ? sp_cuda_rmsnorm_bwd(d->cu, dxs, NULL, dy, c->xs, d->norm_w, c->rstd, N, d->H, err)
               : sp_cuda_rmsnorm_fwd(d->cu, c->y, c->rstd, c->xs, d->norm_w, N, d->H, d->eps, err);
}

/* dlogits of the backward: the loss's (gout / count a row, through the cross-entropy) or the logits' own. */
static sp_status head_dlogits(head_ctx *c, float *dl, const float *gout, sp_err *err)
{
    sp_devparts *d = c->d;
    if (!c->loss)
        return sp_cuda_upload(d->cu, dl, gout, (size_t)c->N * c->out * sizeof(float), err);
    float *w = malloc((size_t)c->N * sizeof *w), *dw = NULL;
    if (!w)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < c->N; i++)
        w[i] = gout[0] / (float)c->count; /* trainer.c's cross-entropy backward */
    sp_status st = up(d->cu, &dw, w, (size_t)c->N, err);
    if (!st)
        st = sp_cuda_crossentropy_bwd(d->cu, dl, dw, c->logits, c->tg, c->N, c->out, err);
    sp_cuda_free(d->cu, dw);
    free(w);
    return st;
}

static sp_status head_backward(void *p, const float *gout, float **gin, sp_err *err)
{
    head_ctx *c = p;
    sp_devparts *d = c->d;
    on(d);
    int H = d->H, BT = c->B * c->T, S = d->P + c->T;
    if (c->loss && !c->count)
        return SP_OK; /* nothing counted: no gradient */
    float *dl = NULL, *din = NULL, *dy = NULL, *dxs = NULL, *host = NULL;
    const float *W = d->C ? d->score : d->head;
    sp_status st = zalloc(d->cu, &dl, (size_t)c->N * c->out, err);
    if (!st)
        st = head_dlogits(c, dl, gout, err);
    if (!st && !(st = zalloc(d->cu, &din, (size_t)c->N * H, err)))
        st = sp_cuda_linear_dx(d->cu, din, dl, W, SP_CU_F32, c->N, H, c->out, err);
    if (!st && d->C && d->gscore)
        st = sp_cuda_linear_dw(d->cu, d->gscore, dl, c->pooled, SP_CU_F32, c->N, H, c->out, err);
    if (!gin[0]) /* h needs no gradient (a head alone): the score's was all */
        goto done;
    if (!st && d->C && !(st = zalloc(d->cu, &dy, (size_t)BT * H, err)))
        for (int b = 0; !st && b < c->B; b++)
            st = sp_cuda_copy_d2d(d->cu, dy + ((size_t)b * c->T + c->pos[b]) * H, din + (size_t)b * H,
                                  (size_t)H * sizeof(float), err);
    if (!st && !(st = zalloc(d->cu, &dxs, (size_t)BT * H, err)))
        st = final_norm(c, dxs, d->C ? dy : din, err);
    if (!st && !(host = to_host(d->cu, dxs, (size_t)BT * H, err)))
        st = err && err->code ? err->code : SP_ERR_NOMEM;
    for (int b = 0; host && b < c->B; b++) /* h's gradient: the positions after the prompts */
        for (size_t k = 0; k < (size_t)c->T * H; k++)
            gin[0][((size_t)b * S + d->P) * H + k] += host[(size_t)b * c->T * H + k];
    free(host);
done:
    if (!st && !gin[0])
        st = sp_cuda_sync(d->cu, err);
    void *bufs[] = {dl, din, dy, dxs};
    for (size_t i = 0; i < 4; i++)
        sp_cuda_free(d->cu, bufs[i]);
    return st;
}

static const sp_ext_fn head_fn = {head_backward, head_free};

/* xs: the positions after the prompts; y: their final norm; classes: pooled, each row's position pos[b]. */
static sp_status head_rows(head_ctx *c, const float *h, const sp_dev_batch *b, sp_err *err)
{
    sp_devparts *d = c->d;
    int H = d->H, S = d->P + c->T, BT = c->B * c->T;
    float *hd = NULL;
    sp_status st = sp_cuda_dup(d->cu, (void **)&hd, h, (size_t)c->B * S * H * sizeof(float), err);
    if (!st)
        st = sp_cuda_alloc(d->cu, (void **)&c->xs, (size_t)BT * H * sizeof(float), err);
    for (int r = 0; !st && r < c->B; r++)
        st = sp_cuda_copy_d2d(d->cu, c->xs + (size_t)r * c->T * H, hd + ((size_t)r * S + d->P) * H,
                              (size_t)c->T * H * sizeof(float), err);
    if (!st && !(st = sp_cuda_alloc(d->cu, (void **)&c->y, (size_t)BT * H * sizeof(float), err)) &&
        !(st = zalloc(d->cu, &c->mean, (size_t)BT, err)) && !(st = zalloc(d->cu, &c->rstd, (size_t)BT, err)))
        st = final_norm(c, NULL, NULL, err);
    sp_cuda_free(d->cu, hd);
    if (st || !d->C)
        return st;
    if (!(c->pos = malloc((size_t)c->B * sizeof *c->pos)))
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    st = sp_cuda_alloc(d->cu, (void **)&c->pooled, (size_t)c->B * H * sizeof(float), err);
    for (int r = 0; !st && r < c->B; r++) {
        int i = b->last[r] < 0 ? b->last[r] + c->T : b->last[r];
        if (i < 0 || i >= c->T)
            return sp_errf(err, SP_ERR_ARG, "row %d's pooled position %d is outside its %d positions", r, b->last[r],
                           c->T);
        c->pos[r] = i;
        st = sp_cuda_copy_d2d(d->cu, c->pooled + (size_t)r * H, c->y + ((size_t)r * c->T + i) * H,
                              (size_t)H * sizeof(float), err);
    }
    return st;
}

/* The mean cross-entropy of the logits over c->tg (the host's reduction: a sum in double over the rows). */
static sp_status head_loss(head_ctx *c, const int32_t *targets, float *loss, sp_err *err)
{
    sp_devparts *d = c->d;
    float *dl = NULL, *host = NULL;
    for (int i = 0; i < c->N; i++) {
        if (targets[i] >= c->out)
            return sp_errf(err, SP_ERR_ARG, "cross-entropy: target %d of row %d is not below %d classes", targets[i],
                           i, c->out);
        c->count += targets[i] >= 0;
    }
    sp_status st = sp_cuda_dup(d->cu, (void **)&c->tg, targets, (size_t)c->N * sizeof *targets, err);
    if (!st && !(st = zalloc(d->cu, &dl, (size_t)c->N, err)))
        st = sp_cuda_crossentropy_fwd(d->cu, dl, c->logits, c->tg, c->N, c->out, err);
    if (!st && !(host = to_host(d->cu, dl, (size_t)c->N, err)))
        st = err && err->code ? err->code : SP_ERR_NOMEM;
    double sum = 0;
    for (int i = 0; host && i < c->N; i++)
        sum += host[i];
    *loss = c->count ? (float)(sum / (double)c->count) : 0.0f;
    free(host);
    sp_cuda_free(d->cu, dl);
    return st;
}

sp_t *sp_devparts_head(sp_devparts *d, sp_t *h, sp_t *score, const sp_dev_batch *b, int loss, int train,
                       sp_err *err)
{
    on(d);
    head_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        sp_errf(err, SP_ERR_NOMEM, "out of memory");
        return NULL;
    }
    *c = (head_ctx){.d = d, .B = b->B, .T = b->T, .loss = loss};
    c->N = d->C ? b->B : b->B * b->T;
    c->out = d->C ? d->C : d->V;
    sp_status st = head_rows(c, h->data, b, err);
    if (!st)
        st = sp_cuda_alloc(d->cu, (void **)&c->logits, (size_t)c->N * c->out * sizeof(float), err);
    if (!st)
        st = sp_cuda_linear(d->cu, c->logits, d->C ? c->pooled : c->y, d->C ? d->score : d->head, SP_CU_F32, c->N,
                            d->H, c->out, 0, err);
    float value = 0, *host = NULL;
    if (!st && loss)
        st = head_loss(c, b->targets, &value, err);
    else if (!st && !(host = to_host(d->cu, c->logits, (size_t)c->N * c->out, err)))
        st = err && err->code ? err->code : SP_ERR_NOMEM;
    if (st) {
        free(host);
        head_free(c);
        return NULL;
    }
    int64_t shape[2] = {c->N, c->out};
    sp_t *o = sp_external(h->g, loss ? 0 : 2, shape, loss ? &value : host, train ? h : NULL, train ? score : NULL,
                          &head_fn, c, err);
    free(host);
    return o;
}

/* ---------------------------------------------------------------------------------------------- */
/* generation: the chain's input, the logits (no graph) */

/* At least `bytes` of generation scratch in d->gen (gen_lock held): contents not kept. */
static sp_status gen_scratch(sp_devparts *d, size_t bytes, sp_err *err)
{
    if (bytes <= d->gen_cap)
        return SP_OK;
    sp_cuda_free(d->cu, d->gen);
    d->gen = NULL;
    d->gen_cap = 0;
    sp_status st = sp_cuda_alloc(d->cu, &d->gen, bytes, err);
    if (!st)
        d->gen_cap = bytes;
    return st;
}

/* Carves n device arrays of the given float counts (256-byte aligned) out of d->gen, grown to hold them. */
static sp_status gen_carve(sp_devparts *d, float **p[], const size_t *floats, int n, sp_err *err)
{
    size_t off[8], total = 0;
    for (int i = 0; i < n; i++) {
        off[i] = total;
        total += (floats[i] * sizeof(float) + 255) & ~(size_t)255;
    }
    sp_status st = gen_scratch(d, total ? total : 1, err);
    for (int i = 0; !st && i < n; i++)
        *p[i] = (float *)((char *)d->gen + off[i]);
    return st;
}

static sp_status gen_embed(sp_devparts *d, float *x, const int32_t *ids, int B, int T, const float *shallow, int P,
                           sp_err *err)
{
    int H = d->H, S = P + T;
    size_t n = (size_t)B * S * H;
    float *dids, *emb, *dx, *y, *mean, *rstd, *sh;
    float **p[] = {&dids, &emb, &dx, &y, &mean, &rstd, &sh};
    size_t floats[] = {(size_t)B * T, (size_t)B * T * H, n, d->emb_w ? n : 0, (size_t)B * S, (size_t)B * S,
                       (size_t)P * H};
    sp_status st = gen_carve(d, p, floats, 7, err);
    if (!st)
        st = sp_cuda_upload(d->cu, dids, ids, (size_t)B * T * sizeof *ids, err);
    if (!st)
        st = sp_cuda_embedding_fwd(d->cu, emb, (const int32_t *)(void *)dids, d->table, d->V, B * T, H, err);
    if (!st && P > 0)
        st = shallow ? sp_cuda_upload(d->cu, sh, shallow, (size_t)P * H * sizeof(float), err)
                     : sp_cuda_zero(d->cu, sh, (size_t)P * H * sizeof(float), err);
    for (int b = 0; !st && b < B; b++) {
        float *row = dx + (size_t)b * S * H;
        if (P > 0)
            st = sp_cuda_copy_d2d(d->cu, row, sh, (size_t)P * H * sizeof(float), err);
        if (!st)
            st = sp_cuda_copy_d2d(d->cu, row + (size_t)P * H, emb + (size_t)b * T * H, (size_t)T * H * sizeof(float),
                                  err);
    }
    if (!st && d->emb_w)
        st = sp_cuda_layernorm_fwd(d->cu, y, mean, rstd, dx, d->emb_w, d->emb_b, B * S, H, d->eps, err);
    if (!st)
        st = sp_cuda_download(d->cu, x, d->emb_w ? y : dx, n * sizeof(float), err);
    return st;
}

sp_status sp_devparts_embed(sp_devparts *d, float *x, const int32_t *ids, int B, int T, const float *shallow, int P,
                            sp_err *err)
{
    pthread_mutex_lock(&d->gen_lock);
    on(d);
    sp_status st = gen_embed(d, x, ids, B, T, shallow, P, err);
    pthread_mutex_unlock(&d->gen_lock);
    return st;
}

static sp_status gen_logits(sp_devparts *d, float *logits, int32_t *best, const float *hidden, int n, sp_err *err)
{
    int H = d->H, V = d->V;
    float *dh, *y, *mean, *rstd, *dl;
    float **p[] = {&dh, &y, &mean, &rstd, &dl};
    size_t floats[] = {(size_t)n * H, (size_t)n * H, (size_t)n, (size_t)n, (size_t)n * V};
    if (!logits && (size_t)n * V > d->gen_host_cap) {
        free(d->gen_host);
        d->gen_host_cap = 0;
        if (!(d->gen_host = malloc((size_t)n * V * sizeof(float))))
            return sp_errf(err, SP_ERR_NOMEM, "out of memory");
        d->gen_host_cap = (size_t)n * V;
    }
    float *out = logits ? logits : d->gen_host;
    sp_status st = gen_carve(d, p, floats, 5, err);
    if (!st)
        st = sp_cuda_upload(d->cu, dh, hidden, (size_t)n * H * sizeof(float), err);
    if (!st)
        st = d->norm_b ? sp_cuda_layernorm_fwd(d->cu, y, mean, rstd, dh, d->norm_w, d->norm_b, n, H, d->eps, err)
                       : sp_cuda_rmsnorm_fwd(d->cu, y, rstd, dh, d->norm_w, n, H, d->eps, err);
    if (!st)
        st = sp_cuda_linear(d->cu, dl, y, d->head, SP_CU_F32, n, H, V, 0, err);
    if (!st)
        st = sp_cuda_download(d->cu, out, dl, (size_t)n * V * sizeof(float), err);
    for (int i = 0; !st && best && i < n; i++)
        best[i] = sp_argmax(out + (size_t)i * V, V);
    return st;
}

sp_status sp_devparts_logits(sp_devparts *d, float *logits, int32_t *best, const float *hidden, int n, sp_err *err)
{
    pthread_mutex_lock(&d->gen_lock);
    on(d);
    sp_status st = d->head ? gen_logits(d, logits, best, hidden, n, err)
                           : sp_errf(err, SP_ERR_STATE, "device: no LM head on the device (opened for classes)");
    pthread_mutex_unlock(&d->gen_lock);
    return st;
}

#endif
