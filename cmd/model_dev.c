/* model_dev.c - a model's blocks on a GPU for `model check --device` (model_dev.h): the host arrays go to the device
 * before a pass and come back after it; without CUDA every call says why. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devparts.h"
#include "model_dev.h"

#ifndef SEPAL_HAVE_CUDA /* opening fails, so nothing else is ever called */

sp_status sp_mdev_open(sp_mdev **out, const sp_model *m, int gpu, sp_err *err)
{
    (void)m;
    char why[128];
    *out = NULL;
    sp_device_usable(gpu, why, sizeof why);
    return sp_errf(err, SP_ERR_UNSUPPORTED, "%s", why);
}

static sp_status no_cuda(sp_err *err) { return sp_errf(err, SP_ERR_UNSUPPORTED, "this sepal was built without CUDA"); }

void sp_mdev_close(sp_mdev *d) { (void)d; }
const char *sp_mdev_name(const sp_mdev *d) { return d ? "" : ""; }
sp_status sp_mdev_forward(sp_mdev *d, int i, float *out, const float *in, int B, int T, sp_err *err)
{
    (void)d, (void)i, (void)out, (void)in, (void)B, (void)T;
    return no_cuda(err);
}
sp_status sp_mdev_backward(sp_mdev *d, int i, float *dinp, const float *dout, const float *in, int B, int T,
                           sp_err *err)
{
    (void)d, (void)i, (void)dinp, (void)dout, (void)in, (void)B, (void)T;
    return no_cuda(err);
}
sp_status sp_mdev_caches(sp_mdev *d, int B, int cap, sp_err *err)
{
    (void)d, (void)B, (void)cap;
    return no_cuda(err);
}
sp_status sp_mdev_blocks(sp_mdev *d, float *hidden, int B, int T, int pos0, int cached, sp_err *err)
{
    (void)d, (void)hidden, (void)B, (void)T, (void)pos0, (void)cached;
    return no_cuda(err);
}

#else

#include "block_cuda.h"
#include "cuda_backend.h"

struct sp_mdev {
    sp_cuda *cu;
    int n, H;
    sp_cuda_block **blk;
    sp_cuda_kv **kv; /* [n], NULL until sp_mdev_caches */
    float *x, *y;    /* device buffers of cap floats each */
    size_t cap;
    char name[160];
};

static void free_caches(sp_mdev *d)
{
    for (int i = 0; d->kv && i < d->n; i++)
        sp_cuda_kv_free(d->kv[i]);
    free(d->kv);
    d->kv = NULL;
}

void sp_mdev_close(sp_mdev *d)
{
    if (!d)
        return;
    free_caches(d);
    for (int i = 0; d->blk && i < d->n; i++)
        sp_cuda_block_free(d->blk[i]);
    free(d->blk);
    sp_cuda_free(d->cu, d->x);
    sp_cuda_free(d->cu, d->y);
    sp_cuda_close(d->cu);
    free(d);
}

sp_status sp_mdev_open(sp_mdev **out, const sp_model *m, int gpu, sp_err *err)
{
    char why[160];
    *out = NULL;
    if (!sp_device_usable(gpu, why, sizeof why))
        return sp_errf(err, SP_ERR_UNSUPPORTED, "%s", why);
    sp_mdev *d = calloc(1, sizeof *d);
    if (!d)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    d->H = m->cfg.hidden;
    sp_status st = sp_cuda_open(&d->cu, gpu, err);
    if (!st && !(d->blk = calloc((size_t)m->cfg.n_layers + 1, sizeof *d->blk)))
        st = sp_errf(err, SP_ERR_NOMEM, "out of memory");
    for (int i = 0; !st && i < m->cfg.n_layers; i++) {
        st = sp_cuda_block_upload(d->cu, &d->blk[i], &m->blocks[i], err);
        d->n = i + !st;
    }
    if (st) {
        sp_mdev_close(d);
        return st;
    }
    snprintf(d->name, sizeof d->name, "cuda:%d %s", gpu, sp_cuda_name(d->cu));
    *out = d;
    return SP_OK;
}

const char *sp_mdev_name(const sp_mdev *d) { return d->name; }

/* Device buffers x and y of at least n floats each. */
static sp_status room(sp_mdev *d, size_t n, sp_err *err)
{
    if (n <= d->cap)
        return SP_OK;
    sp_status st = sp_cuda_sync(d->cu, err);
    sp_cuda_free(d->cu, d->x);
    sp_cuda_free(d->cu, d->y);
    d->x = d->y = NULL;
    d->cap = 0;
    if (!st)
        st = sp_cuda_alloc(d->cu, (void **)&d->x, n * sizeof(float), err);
    if (!st)
        st = sp_cuda_alloc(d->cu, (void **)&d->y, n * sizeof(float), err);
    d->cap = st ? 0 : n;
    return st;
}

/* Block i's input in[n floats] to d->x (x and y of at least n floats). */
static sp_status stage(sp_mdev *d, int i, const float *in, size_t n, sp_err *err)
{
    sp_status st = i >= 0 && i < d->n ? SP_OK : sp_errf(err, SP_ERR_ARG, "model check: no block %d of %d", i, d->n);
    if (!st)
        st = room(d, n, err);
    return st ? st : sp_cuda_upload(d->cu, d->x, in, n * sizeof(float), err);
}

sp_status sp_mdev_forward(sp_mdev *d, int i, float *out, const float *in, int B, int T, sp_err *err)
{
    size_t n = (size_t)B * T * d->H;
    sp_status st = stage(d, i, in, n, err);
    if (!st)
        st = sp_cuda_block_forward(d->blk[i], d->y, d->x, B, T, 0, NULL, err);
    return st ? st : sp_cuda_download(d->cu, out, d->y, n * sizeof(float), err);
}

sp_status sp_mdev_backward(sp_mdev *d, int i, float *dinp, const float *dout, const float *in, int B, int T,
                           sp_err *err)
{
    size_t n = (size_t)B * T * d->H;
    sp_status st = stage(d, i, in, n, err);
    if (!st)
        st = sp_cuda_upload(d->cu, d->y, dout, n * sizeof(float), err);
    if (!st)
        st = sp_cuda_block_backward(d->blk[i], d->y, d->y, d->x, B, T, 0, err);
    return st ? st : sp_cuda_download(d->cu, dinp, d->y, n * sizeof(float), err);
}

sp_status sp_mdev_caches(sp_mdev *d, int B, int cap, sp_err *err)
{
    free_caches(d);
    if (!(d->kv = calloc((size_t)d->n + 1, sizeof *d->kv)))
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < d->n; i++) {
        sp_status st = sp_cuda_kv_new(d->blk[i], &d->kv[i], B, cap, NULL, err);
        if (st) {
            free_caches(d);
            return st;
        }
    }
    return SP_OK;
}

sp_status sp_mdev_blocks(sp_mdev *d, float *hidden, int B, int T, int pos0, int cached, sp_err *err)
{
    size_t n = (size_t)B * T * d->H;
    if (cached && !d->kv)
        return sp_errf(err, SP_ERR_STATE, "model check: no device caches");
    sp_status st = stage(d, 0, hidden, n, err);
    for (int i = 0; !st && i < d->n; i++)
        st = sp_cuda_block_forward(d->blk[i], d->x, d->x, B, T, pos0, cached ? d->kv[i] : NULL, err);
    return st ? st : sp_cuda_download(d->cu, hidden, d->x, n * sizeof(float), err);
}

#endif
