/* span_cuda.c - span.h on a CUDA device (sepal-server --device cuda[:N]): the span's blocks uploaded once
 * (cuda/block_cuda.h, in --dtype's encoding), a request's hidden states copied in once at the span's start and out
 * once at its end (inputs, prompts and gradients likewise), device KV caches charged to a budget of the device's
 * memory, and a mutex around every call that touches the device (one thread drives the context at a time). The
 * device arrays of a request come from one scratch buffer, grown to the largest request seen. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block_cuda.h"
#include "kernels.h"
#include "rng.h"
#include "span.h"
#include "timeutil.h"

struct span_dev {
    sp_cuda *cu;
    int gpu;
    int first, n;         /* s->m's blocks [first, first + n) */
    sp_cuda_block **blk;  /* n */
    size_t bytes;         /* the weights' device bytes */
    sp_cuda_budget budget; /* the sessions' KV caches */
    pthread_mutex_t lock;
    float *buf;           /* scratch for a request's arrays */
    size_t cap;           /* floats */
};

int sp_server_has_cuda(void) { return 1; }

sp_status sp_device_probe(int gpu, sp_err *err)
{
    char why[200] = "";
    int n = sp_cuda_device_count(why, (int)sizeof why);
    if (n <= 0)
        return sp_errf(err, SP_ERR_UNSUPPORTED, "no usable GPU (%s)", why[0] ? why : "no device");
    if (gpu >= n)
        return sp_errf(err, SP_ERR_ARG, "no device %d (%d GPU(s): cuda:0 .. cuda:%d)", gpu, n, n - 1);
    return SP_OK;
}

/* Takes the device for this thread (the runtime's current device is per thread: bound again unless GPU 0). */
static sp_status enter(span_dev *d, sp_err *err)
{
    pthread_mutex_lock(&d->lock);
    size_t f, t;
    sp_status st = d->gpu ? sp_cuda_meminfo(d->cu, &f, &t, err) : SP_OK;
    if (st)
        pthread_mutex_unlock(&d->lock);
    return st;
}

static sp_status leave(span_dev *d, sp_status st)
{
    pthread_mutex_unlock(&d->lock);
    return st;
}

/* At least `floats` of device scratch in *p (under the lock). */
static sp_status scratch(span_dev *d, size_t floats, float **p, sp_err *err)
{
    if (floats > d->cap) {
        sp_cuda_free(d->cu, d->buf);
        d->buf = NULL;
        d->cap = 0;
        sp_status st = sp_cuda_alloc(d->cu, (void **)&d->buf, (floats ? floats : 1) * sizeof(float), err);
        if (st)
            return st;
        d->cap = floats;
    }
    *p = d->buf;
    return SP_OK;
}

static sp_cuda_block *blk(const sp_server *s, int global) { return s->dev->blk[global - s->dev->first]; }

static void dev_free(span_dev *d)
{
    for (int i = 0; d->blk && i < d->n; i++)
        sp_cuda_block_free(d->blk[i]);
    free(d->blk);
    sp_cuda_free(d->cu, d->buf);
    sp_cuda_close(d->cu);
    pthread_mutex_destroy(&d->lock);
    free(d);
}

sp_status span_dev_open(sp_server *s, int gpu, sp_err *err)
{
    int n = s->m->last - s->m->first;
    for (int i = 0; i < n; i++) { /* a shape the device cannot run: refused before the GPU is touched */
        sp_status st = sp_cuda_block_supported(&s->m->blocks[i], err);
        if (st)
            return st;
    }
    span_dev *d = calloc(1, sizeof *d);
    if (!d)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&d->lock, NULL);
    d->gpu = gpu;
    d->first = s->m->first;
    sp_status st = sp_device_probe(gpu, err);
    if (!st)
        st = sp_cuda_open(&d->cu, gpu, err);
    if (!st && !(d->blk = calloc((size_t)(n ? n : 1), sizeof *d->blk)))
        st = sp_errf(err, SP_ERR_NOMEM, "out of memory");
    for (int i = 0; !st && i < n; i++) {
        st = sp_cuda_block_upload(d->cu, &d->blk[i], &s->m->blocks[i], err);
        d->n = i + !st;
        d->bytes += st ? 0 : sp_cuda_block_bytes(d->blk[i]);
    }
    size_t freeb = 0, total = 0;
    if (!st)
        st = sp_cuda_meminfo(d->cu, &freeb, &total, err);
    if (st) {
        dev_free(d);
        return st;
    }
    d->budget.limit = freeb - freeb / 8; /* an eighth left for the workspace and the requests' arrays */
    snprintf(s->device_name, sizeof s->device_name, "cuda:%d %s", gpu, sp_cuda_name(d->cu));
    s->dev = d;
    return SP_OK;
}

void span_dev_close(sp_server *s)
{
    if (s->dev)
        dev_free(s->dev);
    s->dev = NULL;
}

size_t span_dev_weight_bytes(const sp_server *s) { return s->dev ? s->dev->bytes : 0; }

/* count blocks from start on dx [B, T, H] (device), prompts dp (n x [B, P, H]) added, inputs to din when non-NULL,
 * activations to acts[i] when acts is non-NULL. */
static sp_status run_blocks(sp_server *s, int start, int count, float *dx, int B, int T, const float *dp, int P,
                            float *din, sp_cuda_acts *acts, sp_err *err)
{
    int H = s->m->cfg.hidden;
    size_t N = (size_t)B * T * H;
    sp_status st = SP_OK;
    for (int i = 0; !st && i < count; i++) {
        if (dp)
            st = sp_cuda_add_prompt(s->dev->cu, dx, dp + (size_t)i * B * P * H, B, T, 0, P, H, err);
        if (!st && din)
            st = sp_cuda_copy_d2d(s->dev->cu, din + i * N, dx, N * sizeof(float), err);
        if (!st)
            st = acts ? sp_cuda_block_forward_keep(blk(s, start + i), dx, dx, B, T, 0, &acts[i], err)
                      : sp_cuda_block_forward(blk(s, start + i), dx, dx, B, T, 0, NULL, err);
    }
    return st;
}

/* x [B, T, H] and the prompts (n x [B, P, H], NULL: none) uploaded into scratch: *dx, *dp (under the lock). */
static sp_status upload_span_input(span_dev *d, const float *x, size_t N, const float *prompts, size_t np,
                                   size_t extra, float **dx, float **dp, sp_err *err)
{
    sp_status st = scratch(d, N + np + extra, dx, err);
    *dp = prompts ? *dx + N : NULL;
    if (!st)
        st = sp_cuda_upload(d->cu, *dx, x, N * sizeof(float), err);
    if (!st && prompts)
        st = sp_cuda_upload(d->cu, *dp, prompts, np * sizeof(float), err);
    return st;
}

sp_status span_dev_forward(sp_server *s, int start, int end, float *x, int B, int T, const float *prompts, int P,
                           float *inputs, sp_err *err)
{
    span_dev *d = s->dev;
    int n = end - start, H = s->m->cfg.hidden;
    size_t N = (size_t)B * T * H, ni = inputs ? (size_t)n * N : 0, np = prompts ? (size_t)n * B * P * H : 0;
    float *dx = NULL, *dp = NULL;
    sp_status st = enter(d, err);
    if (st)
        return st;
    st = upload_span_input(d, x, N, prompts, np, ni, &dx, &dp, err);
    float *din = inputs ? dx + N + np : NULL;
    if (!st)
        st = run_blocks(s, start, n, dx, B, T, dp, P, din, NULL, err);
    if (!st)
        st = sp_cuda_download(d->cu, x, dx, N * sizeof(float), err);
    if (!st && din)
        st = sp_cuda_download(d->cu, inputs, din, ni * sizeof(float), err);
    return leave(d, st);
}

struct span_dev_kept {
    span_dev *d;
    int start, n;       /* blocks [start, start + n) */
    float *in;          /* n x [B, T, H]: each block's input, its prompt added */
    sp_cuda_acts *acts; /* n */
    size_t bytes;       /* charged to d->budget */
};

size_t span_dev_kept_bytes(const sp_server *s, int start, int end, int B, int T)
{
    size_t n = (size_t)(end - start) * B * T * s->m->cfg.hidden * sizeof(float);
    for (int i = start; i < end; i++)
        n += sp_cuda_block_acts_bytes(blk(s, i), B, T);
    return n;
}

size_t span_dev_room(const sp_server *s)
{
    span_dev *d = s->dev;
    pthread_mutex_lock(&d->lock);
    size_t room = d->budget.used < d->budget.limit ? d->budget.limit - d->budget.used : 0;
    pthread_mutex_unlock(&d->lock);
    return room;
}

size_t span_dev_budget_used(const sp_server *s)
{
    span_dev *d = s->dev;
    pthread_mutex_lock(&d->lock);
    size_t used = d->budget.used;
    pthread_mutex_unlock(&d->lock);
    return used;
}

size_t span_dev_kept_size(const span_dev_kept *k) { return k ? k->bytes : 0; }

/* Frees k's device memory and gives its bytes back (the lock held). */
static void kept_release(span_dev_kept *k)
{
    span_dev *d = k->d;
    for (int i = 0; k->acts && i < k->n; i++)
        sp_cuda_acts_free(d->blk[k->start - d->first + i], &k->acts[i]);
    sp_cuda_free(d->cu, k->in);
    sp_cuda_budget_give(&d->budget, k->bytes);
    free(k->acts);
    free(k);
}

void span_dev_kept_free(span_dev_kept *k)
{
    if (!k)
        return;
    sp_err err = {0};
    if (enter(k->d, &err)) /* (as span_dev_kv_free: freed all the same) */
        pthread_mutex_lock(&k->d->lock);
    span_dev *d = k->d;
    kept_release(k);
    leave(d, SP_OK);
}

/* A kept entry of blocks [start, end) on [B, T], its bytes charged and its inputs allocated (the lock held). */
static sp_status kept_new(sp_server *s, int start, int end, int B, int T, span_dev_kept **out, sp_err *err)
{
    span_dev *d = s->dev;
    int n = end - start;
    size_t bytes = span_dev_kept_bytes(s, start, end, B, T);
    span_dev_kept *k = calloc(1, sizeof *k);
    sp_cuda_acts *acts = calloc((size_t)n, sizeof *acts);
    sp_status st = !k || !acts ? sp_errf(err, SP_ERR_NOMEM, "out of memory") : SP_OK;
    if (!st)
        st = sp_cuda_budget_take(&d->budget, bytes, err);
    if (st) {
        free(k), free(acts);
        return st;
    }
    *k = (span_dev_kept){.d = d, .start = start, .n = n, .acts = acts, .bytes = bytes};
    st = sp_cuda_alloc(d->cu, (void **)&k->in, (size_t)n * B * T * s->m->cfg.hidden * sizeof(float), err);
    if (st) {
        kept_release(k);
        return st;
    }
    *out = k;
    return SP_OK;
}

sp_status span_dev_forward_keep(sp_server *s, int start, int end, float *x, int B, int T, const float *prompts, int P,
                                span_dev_kept **out, sp_err *err)
{
    span_dev *d = s->dev;
    int n = end - start, H = s->m->cfg.hidden;
    size_t N = (size_t)B * T * H, np = prompts ? (size_t)n * B * P * H : 0;
    float *dx = NULL, *dp = NULL;
    span_dev_kept *k = NULL;
    *out = NULL;
    sp_status st = enter(d, err);
    if (st)
        return st;
    st = kept_new(s, start, end, B, T, &k, err);
    if (!st)
        st = upload_span_input(d, x, N, prompts, np, 0, &dx, &dp, err);
    if (!st)
        st = run_blocks(s, start, n, dx, B, T, dp, P, k->in, k->acts, err);
    if (!st)
        st = sp_cuda_download(d->cu, x, dx, N * sizeof(float), err);
    if (st && k)
        kept_release(k);
    else
        *out = k;
    return leave(d, st);
}

sp_status span_dev_backward(sp_server *s, int start, int end, float *g, const float *x, const float *inputs,
                            const span_dev_kept *dk, int B, int T, const float *prompts, int P, float *gp,
                            sp_err *err)
{
    span_dev *d = s->dev;
    int n = end - start, H = s->m->cfg.hidden;
    size_t N = (size_t)B * T * H, np = prompts ? (size_t)n * B * P * H : 0, nin = dk ? 0 : (size_t)n * N;
    float *dg = NULL;
    sp_status st = enter(d, err);
    if (st)
        return st;
    st = scratch(d, 2 * N + nin + 2 * np, &dg, err);
    float *dx = dg + N, *dp = prompts ? dx + N : NULL, *dgp = dp ? dp + np : NULL;
    float *din = dk ? dk->in : dx + N + 2 * np;
    if (!st && !dk && inputs) /* the FORWARD kept every block's input on the host */
        st = sp_cuda_upload(d->cu, din, inputs, (size_t)n * N * sizeof(float), err);
    if (!st && !dk && !inputs) { /* recomputed: the span's forward up to its last block's input */
        st = sp_cuda_upload(d->cu, dx, x, N * sizeof(float), err);
        if (!st && dp)
            st = sp_cuda_upload(d->cu, dp, prompts, np * sizeof(float), err);
        if (!st)
            st = run_blocks(s, start, n - 1, dx, B, T, dp, P, din, NULL, err);
        if (!st && dp)
            st = sp_cuda_add_prompt(d->cu, dx, dp + (size_t)(n - 1) * B * P * H, B, T, 0, P, H, err);
        if (!st)
            st = sp_cuda_copy_d2d(d->cu, din + (size_t)(n - 1) * N, dx, N * sizeof(float), err);
    }
    if (!st)
        st = sp_cuda_upload(d->cu, dg, g, N * sizeof(float), err);
    for (int i = n - 1; !st && i >= 0; i--) {
        st = dk ? sp_cuda_block_backward_kept(blk(s, start + i), dg, dg, din + (size_t)i * N, &dk->acts[i], err)
                : sp_cuda_block_backward(blk(s, start + i), dg, dg, din + (size_t)i * N, B, T, 0, err);
        for (int b = 0; !st && dgp && b < B; b++) /* the prompt's gradient: the block input's first P positions */
            st = sp_cuda_copy_d2d(d->cu, dgp + (((size_t)i * B + b) * P) * H, dg + (size_t)b * T * H,
                                  (size_t)P * H * sizeof(float), err);
    }
    if (!st)
        st = sp_cuda_download(d->cu, g, dg, N * sizeof(float), err);
    if (!st && dgp)
        st = sp_cuda_download(d->cu, gp, dgp, np * sizeof(float), err);
    return leave(d, st);
}

sp_status span_dev_kv_open(sp_server *s, session *x, int start, int end, int B, int max_length, sp_err *err)
{
    span_dev *d = s->dev;
    sp_status st = enter(d, err);
    if (st)
        return st;
    x->dev = d;
    x->ndkv = end - start;
    if (!(x->dkv = calloc((size_t)(end - start), sizeof *x->dkv)))
        st = sp_errf(err, SP_ERR_NOMEM, "out of memory");
    for (int i = start; !st && i < end; i++)
        st = sp_cuda_kv_new(blk(s, i), &x->dkv[i - start], B, max_length, &d->budget, err);
    leave(d, SP_OK);
    if (st)
        span_dev_kv_free(x);
    return st;
}

void span_dev_kv_free(session *x)
{
    span_dev *d = x->dev;
    if (!d)
        return;
    sp_err err = {0};
    if (enter(d, &err)) /* (another thread's binding fails only with a lost context: freed all the same) */
        pthread_mutex_lock(&d->lock);
    for (int i = 0; x->dkv && i < x->ndkv; i++)
        sp_cuda_kv_free(x->dkv[i]);
    leave(d, SP_OK);
    free(x->dkv);
    x->dkv = NULL;
    x->dev = NULL;
}

/* Every cache of x back to x->len (a roll back moves only x->len). */
static sp_status rewind_caches(session *x, int len, sp_err *err)
{
    sp_status st = SP_OK;
    for (int i = 0; !st && i < x->ndkv; i++)
        st = sp_cuda_kv_set_len(x->dkv[i], len, err);
    return st;
}

sp_status span_dev_step(sp_server *s, session *x, float *h, int B, int T, const float *prompts, int P, sp_err *err)
{
    span_dev *d = s->dev;
    int H = s->m->cfg.hidden, n = x->end - x->start;
    int chunk = s->o.max_batch_tokens / B > 0 ? s->o.max_batch_tokens / B : 1;
    size_t N = (size_t)B * T * H, np = prompts ? (size_t)n * B * P * H : 0, nc = T > chunk ? (size_t)B * chunk * H : 0;
    float *dh = NULL;
    sp_status st = enter(d, err);
    if (st)
        return st;
    st = scratch(d, N + np + nc, &dh, err);
    float *dp = prompts ? dh + N : NULL, *dc = dh + N + np;
    if (!st)
        st = sp_cuda_upload(d->cu, dh, h, N * sizeof(float), err);
    if (!st && dp)
        st = sp_cuda_upload(d->cu, dp, prompts, np * sizeof(float), err);
    for (int t0 = 0; !st && t0 < T; t0 += chunk) { /* a long prefill in chunks of max_batch_tokens rows */
        int tc = T - t0 < chunk ? T - t0 : chunk;
        float *cur = T <= chunk ? dh : dc;
        for (int b = 0; !st && cur != dh && b < B; b++)
            st = sp_cuda_copy_d2d(d->cu, cur + (size_t)b * tc * H, dh + ((size_t)b * T + t0) * H,
                                  (size_t)tc * H * sizeof(float), err);
        if (!st)
            st = rewind_caches(x, x->len + t0, err);
        for (int i = 0; !st && i < n; i++) {
            if (dp)
                st = sp_cuda_add_prompt(d->cu, cur, dp + (size_t)i * B * P * H, B, tc, t0, P, H, err);
            if (!st)
                st = sp_cuda_block_forward(blk(s, x->start + i), cur, cur, B, tc, x->len + t0, x->dkv[i], err);
        }
        for (int b = 0; !st && cur != dh && b < B; b++)
            st = sp_cuda_copy_d2d(d->cu, dh + ((size_t)b * T + t0) * H, cur + (size_t)b * tc * H,
                                  (size_t)tc * H * sizeof(float), err);
    }
    if (!st)
        st = sp_cuda_download(d->cu, h, dh, N * sizeof(float), err);
    return leave(d, st);
}

sp_status span_dev_reorder(sp_server *s, session *x, const int64_t *hypo, sp_err *err)
{
    span_dev *d = s->dev;
    sp_status st = enter(d, err);
    if (st)
        return st;
    st = rewind_caches(x, x->len, err);
    for (int i = 0; !st && i < x->ndkv; i++)
        st = sp_cuda_kv_reorder(x->dkv[i], hypo, err);
    return leave(d, st);
}

sp_status span_dev_decode_batch(sp_server *s, session *const *xs, int n, float *h, int rows, sp_err *err)
{
    span_dev *d = s->dev;
    int H = s->m->cfg.hidden;
    size_t N = (size_t)rows * H;
    sp_cuda_kv **kv = malloc((size_t)n * sizeof *kv);
    if (!kv)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    float *dh = NULL;
    sp_status st = enter(d, err);
    if (st)
        return free(kv), st;
    st = scratch(d, N, &dh, err);
    for (int k = 0; !st && k < n; k++)
        st = rewind_caches(xs[k], xs[k]->len, err);
    if (!st)
        st = sp_cuda_upload(d->cu, dh, h, N * sizeof(float), err);
    for (int i = xs[0]->start; !st && i < xs[0]->end; i++) {
        for (int k = 0; k < n; k++)
            kv[k] = xs[k]->dkv[i - xs[k]->start];
        st = sp_cuda_block_decode_batch(blk(s, i), dh, dh, kv, n, err);
    }
    if (!st)
        st = sp_cuda_download(d->cu, h, dh, N * sizeof(float), err);
    free(kv);
    return leave(d, st);
}

/* One step as a server runs it: the row in, every block, the row out. */
static int measure_step(sp_server *s, float *x, float *dx, int T, int pos0, sp_cuda_kv **kv, sp_err *err)
{
    span_dev *d = s->dev;
    size_t N = (size_t)T * s->m->cfg.hidden;
    sp_status st = sp_cuda_upload(d->cu, dx, x, N * sizeof(float), err);
    for (int i = 0; !st && i < d->n; i++)
        st = sp_cuda_block_forward(d->blk[i], dx, dx, 1, T, pos0, kv ? kv[i] : NULL, err);
    if (!st)
        st = sp_cuda_download(d->cu, x, dx, N * sizeof(float), err);
    return st ? -1 : 0;
}

void span_dev_measure(sp_server *s, int T, int past, double *rps, double *tps)
{
    span_dev *d = s->dev;
    int H = s->m->cfg.hidden, ok = 1;
    sp_err err = {0};
    float *x = calloc((size_t)T * H, sizeof(float)), *dx = NULL;
    sp_cuda_kv **kv = calloc((size_t)(d->n ? d->n : 1), sizeof *kv);
    *rps = *tps = 0;
    if (!x || !kv || enter(d, &err)) {
        free(x);
        free(kv);
        return;
    }
    sp_rng r;
    sp_rng_seed(&r, 1);
    sp_rng_fill_normal(&r, x, (long)T * H, 1.0f);
    ok = !scratch(d, (size_t)T * H, &dx, &err) && !measure_step(s, x, dx, T, 0, NULL, &err); /* warm-up */
    double t0 = sp_now_s();
    ok = ok && !measure_step(s, x, dx, T, 0, NULL, &err);
    if (ok)
        *tps = T / (sp_now_s() - t0);
    for (int i = 0; ok && i < d->n; i++)
        ok = !sp_cuda_kv_new(d->blk[i], &kv[i], 1, past + 1, NULL, &err);
    ok = ok && !measure_step(s, x, dx, past, 0, kv, &err); /* the cache filled to past positions */
    int steps = 0;
    t0 = sp_now_s();
    while (ok && (steps < 3 || sp_now_s() - t0 < 0.5) && steps < 10000) {
        for (int i = 0; ok && i < d->n; i++)
            ok = !sp_cuda_kv_set_len(kv[i], past, &err);
        ok = ok && !measure_step(s, x, dx, 1, past, kv, &err);
        steps++;
    }
    if (ok)
        *rps = steps / (sp_now_s() - t0);
    else
        *rps = *tps = 0;
    for (int i = 0; i < d->n; i++)
        sp_cuda_kv_free(kv[i]);
    leave(d, SP_OK);
    free(kv);
    free(x);
}
