/* optim.c - AdamW with a linear warmup/decay schedule, global-norm clipping and dynamic loss scaling over
 * fp32 master parameters. The CPU path below is the specification (see the conventions in optim.h); with
 * SEPAL_HAVE_CUDA the same step runs on the GPU through cuda/optim_cuda.h. */
#include "optim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devparts.h"
#include "half.h"

#ifdef SEPAL_HAVE_CUDA
#include "cuda_backend.h"
#include "optim_cuda.h"
#endif

struct sp_optim {
    sp_adamw_opts o;
    int n;
    sp_t **params;
    float **m, **v;  /* CPU moments (NULL entries on CUDA) */
    int *t;          /* per-parameter update count */
    int64_t *off;    /* offset of each parameter in the flat device buffers */
    int64_t total;
    int64_t sched;   /* updates applied: the schedule's step index */
    float scale;     /* loss scale (1 without fp16) */
    int growth_tracker;
    int on_cuda;
    int resident;    /* params and grads live on the device (sp_optim_make_resident) */
#ifdef SEPAL_HAVE_CUDA
    sp_cuda_adamw *cu;
#endif
};

void sp_adamw_opts_default(sp_adamw_opts *o)
{
    memset(o, 0, sizeof *o);
    o->lr = 1e-3f;
    o->beta1 = 0.9f;
    o->beta2 = 0.999f;
    o->eps = 1e-8f;
    o->weight_decay = 0.01f;
    o->warmup_steps = 0;
    o->total_steps = 0;
    o->clip_norm = 0.0f;
    o->fp16 = 0;
    o->loss_scale = 65536.0f;
    o->scale_growth = 2.0f;
    o->scale_backoff = 0.5f;
    o->growth_interval = 2000;
    o->device = -1;
}

/* ---------------------------------------------------------------------------------------------- */
/* bare pieces */

typedef struct {
    float decay, b1, c1, b2, c2, step, bc2s, eps;
} adamw_coefs;

static adamw_coefs coefs(float lr, float b1, float b2, float eps, float wd, int t)
{
    adamw_coefs c;
    c.decay = (float)(1.0 - (double)lr * (double)wd);
    c.b1 = b1;
    c.c1 = (float)(1.0 - (double)b1);
    c.b2 = b2;
    c.c2 = (float)(1.0 - (double)b2);
    c.step = (float)((double)lr / (1.0 - pow((double)b1, (double)t)));
    c.bc2s = (float)sqrt(1.0 - pow((double)b2, (double)t));
    c.eps = eps;
    return c;
}

/* One update; g is multiplied by gscale first (the clip coefficient; 1 is exact). Compiled as ISO C
 * (-std=c11), GCC does not contract a*b+c into an FMA, so every operation rounds like the CUDA kernel's. */
static void adamw_apply(float *p, const float *g, float *m, float *v, int64_t n, float gscale, const adamw_coefs *c)
{
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i] * gscale;
        float pi = p[i] * c->decay;
        float mi = c->b1 * m[i] + c->c1 * gi;
        float vi = c->b2 * v[i] + c->c2 * (gi * gi);
        float denom = sqrtf(vi) / c->bc2s + c->eps;
        p[i] = pi - c->step * (mi / denom);
        m[i] = mi;
        v[i] = vi;
    }
}

void sp_adamw_update_cpu(float *p, const float *g, float *m, float *v, int64_t n, float lr, float b1, float b2,
                         float eps, float wd, int t)
{
    adamw_coefs c = coefs(lr, b1, b2, eps, wd, t);
    adamw_apply(p, g, m, v, n, 1.0f, &c);
}

int sp_unscale_check_cpu(float *g, int64_t n, float inv_scale)
{
    int bad = 0;
    if (inv_scale != 1.0f)
        for (int64_t i = 0; i < n; i++)
            g[i] *= inv_scale;
    for (int64_t i = 0; i < n; i++)
        bad |= !isfinite(g[i]);
    return bad;
}

double sp_sumsq_cpu(const float *g, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += (double)g[i] * (double)g[i];
    return s;
}

float sp_clip_coef(float norm, float max_norm)
{
    if (!(max_norm > 0.0f))
        return 1.0f;
    float c = max_norm / (norm + 1e-6f);
    return c < 1.0f ? c : 1.0f;
}

float sp_clip_grad_norm(sp_t **params, int n, float max_norm)
{
    double ss = 0.0;
    for (int i = 0; i < n; i++)
        if (params[i] && params[i]->grad)
            ss += sp_sumsq_cpu(params[i]->grad, params[i]->n);
    float norm = (float)sqrt(ss);
    float c = sp_clip_coef(norm, max_norm);
    if (c < 1.0f)
        for (int i = 0; i < n; i++)
            if (params[i] && params[i]->grad)
                for (int64_t k = 0; k < params[i]->n; k++)
                    params[i]->grad[k] *= c;
    return norm;
}

/* ---------------------------------------------------------------------------------------------- */
/* the optimiser */

static int finite_pos(float x)
{
    return isfinite(x) && x > 0.0f;
}

static sp_status check_opts(const sp_adamw_opts *o, sp_err *err)
{
    if (!isfinite(o->lr) || o->lr < 0.0f)
        return sp_errf(err, SP_ERR_ARG, "optim: lr must be finite and >= 0 (got %g)", (double)o->lr);
    if (!(o->beta1 >= 0.0f && o->beta1 < 1.0f) || !(o->beta2 >= 0.0f && o->beta2 < 1.0f))
        return sp_errf(err, SP_ERR_ARG, "optim: betas must be in [0, 1) (got %g, %g)", (double)o->beta1,
                       (double)o->beta2);
    if (!isfinite(o->eps) || o->eps < 0.0f)
        return sp_errf(err, SP_ERR_ARG, "optim: eps must be finite and >= 0 (got %g)", (double)o->eps);
    if (!isfinite(o->weight_decay) || o->weight_decay < 0.0f)
        return sp_errf(err, SP_ERR_ARG, "optim: weight_decay must be finite and >= 0 (got %g)",
                       (double)o->weight_decay);
    if (o->warmup_steps < 0 || o->total_steps < 0)
        return sp_errf(err, SP_ERR_ARG, "optim: warmup_steps and total_steps must be >= 0 (got %d, %d)",
                       o->warmup_steps, o->total_steps);
    if (!isfinite(o->clip_norm) || o->clip_norm < 0.0f)
        return sp_errf(err, SP_ERR_ARG, "optim: clip_norm must be finite and >= 0 (got %g)", (double)o->clip_norm);
    if (o->fp16) {
        if (!finite_pos(o->loss_scale))
            return sp_errf(err, SP_ERR_ARG, "optim: loss_scale must be finite and > 0 (got %g)",
                           (double)o->loss_scale);
        if (!isfinite(o->scale_growth) || o->scale_growth < 1.0f)
            return sp_errf(err, SP_ERR_ARG, "optim: scale_growth must be >= 1 (got %g)", (double)o->scale_growth);
        if (!(o->scale_backoff > 0.0f && o->scale_backoff <= 1.0f))
            return sp_errf(err, SP_ERR_ARG, "optim: scale_backoff must be in (0, 1] (got %g)",
                           (double)o->scale_backoff);
        if (o->growth_interval < 1)
            return sp_errf(err, SP_ERR_ARG, "optim: growth_interval must be >= 1 (got %d)", o->growth_interval);
    }
    if (o->device < -1 || o->device > 1)
        return sp_errf(err, SP_ERR_ARG, "optim: device must be -1 (auto), 0 (CPU) or 1 (CUDA) (got %d)", o->device);
    return SP_OK;
}

void sp_optim_free(sp_optim *opt)
{
    if (!opt)
        return;
#ifdef SEPAL_HAVE_CUDA
    sp_cuda_adamw_free(opt->cu);
#endif
    if (opt->m)
        for (int i = 0; i < opt->n; i++)
            free(opt->m[i]);
    if (opt->v)
        for (int i = 0; i < opt->n; i++)
            free(opt->v[i]);
    free(opt->m);
    free(opt->v);
    free(opt->t);
    free(opt->off);
    free(opt->params);
    free(opt);
}

int sp_optim_cuda_usable(char *why, size_t cap)
{
    return sp_device_usable(0, why, cap);
}

/* Picks the device: 1 = CUDA, 0 = CPU. */
static sp_status pick_device(int want, int *cuda, sp_err *err)
{
    char why[300];
    *cuda = want != 0 && sp_optim_cuda_usable(why, sizeof why);
    if (want == 1 && !*cuda)
        return sp_errf(err, SP_ERR_UNSUPPORTED, "CUDA was asked for, but %s", why);
    return SP_OK;
}

sp_status sp_optim_new(sp_optim **out, sp_t **params, int n, const sp_adamw_opts *o, sp_err *err)
{
    *out = NULL;
    sp_adamw_opts def;
    if (!o) {
        sp_adamw_opts_default(&def);
        o = &def;
    }
    if (n < 0 || (n > 0 && !params))
        return sp_errf(err, SP_ERR_ARG, "optim: bad parameter list (n = %d)", n);
    sp_status st = check_opts(o, err);
    if (st != SP_OK)
        return st;
    for (int i = 0; i < n; i++) {
        const sp_t *p = params[i];
        if (!p || p->n < 0 || (p->n > 0 && !p->data))
            return sp_errf(err, SP_ERR_ARG, "optim: parameter %d (%s) has no data", i,
                           p && p->name ? p->name : "unnamed");
    }
    int cuda = 0;
    if ((st = pick_device(o->device, &cuda, err)) != SP_OK)
        return st;

    sp_optim *opt = calloc(1, sizeof *opt);
    if (!opt)
        return sp_errf(err, SP_ERR_NOMEM, "optim: out of memory");
    opt->o = *o;
    opt->n = n;
    opt->scale = o->fp16 ? o->loss_scale : 1.0f;
    opt->on_cuda = cuda;
    size_t cnt = n > 0 ? (size_t)n : 1;
    opt->params = calloc(cnt, sizeof *opt->params);
    opt->m = calloc(cnt, sizeof *opt->m);
    opt->v = calloc(cnt, sizeof *opt->v);
    opt->t = calloc(cnt, sizeof *opt->t);
    opt->off = calloc(cnt, sizeof *opt->off);
    if (!opt->params || !opt->m || !opt->v || !opt->t || !opt->off) {
        sp_optim_free(opt);
        return sp_errf(err, SP_ERR_NOMEM, "optim: out of memory");
    }
    for (int i = 0; i < n; i++) {
        opt->params[i] = params[i];
        opt->off[i] = opt->total;
        opt->total += params[i]->n;
        if (!cuda) {
            size_t nb = (size_t)(params[i]->n > 0 ? params[i]->n : 1) * sizeof(float);
            opt->m[i] = calloc(1, nb);
            opt->v[i] = calloc(1, nb);
            if (!opt->m[i] || !opt->v[i]) {
                sp_optim_free(opt);
                return sp_errf(err, SP_ERR_NOMEM, "optim: out of memory for the moments of parameter %d", i);
            }
        }
    }
#ifdef SEPAL_HAVE_CUDA
    if (cuda && (st = sp_cuda_adamw_new(&opt->cu, opt->total, err)) != SP_OK) {
        sp_optim_free(opt);
        sp_err_prefix(err, "optim: ");
        return st;
    }
#endif
    *out = opt;
    return SP_OK;
}

float sp_optim_loss_scale(const sp_optim *opt)
{
    return opt->scale;
}

int sp_optim_on_cuda(const sp_optim *opt)
{
    return opt->on_cuda;
}

int sp_optim_nparams(const sp_optim *opt)
{
    return opt->n;
}

int sp_optim_param_steps(const sp_optim *opt, int idx)
{
    return idx >= 0 && idx < opt->n ? opt->t[idx] : 0;
}

float sp_optim_lr(const sp_optim *opt)
{
    const sp_adamw_opts *o = &opt->o;
    double s = (double)opt->sched, lr = (double)o->lr;
    if (o->warmup_steps > 0 && opt->sched < o->warmup_steps)
        return (float)(lr * s / (double)o->warmup_steps);
    if (o->total_steps <= 0)
        return o->lr;
    double left = (double)o->total_steps - s;
    double span = (double)(o->total_steps - o->warmup_steps);
    if (span < 1.0)
        span = 1.0;
    return (float)(lr * (left > 0.0 ? left : 0.0) / span);
}

sp_status sp_optim_fp16_copy(const sp_optim *opt, int idx, uint16_t *dst)
{
    if (!opt || idx < 0 || idx >= opt->n || !dst)
        return SP_ERR_ARG;
    const sp_t *p = opt->params[idx];
    for (int64_t i = 0; i < p->n; i++)
        dst[i] = sp_f32_to_f16(p->data[i]);
    return SP_OK;
}

static void zero_grads(sp_optim *opt)
{
    for (int i = 0; i < opt->n; i++)
        if (opt->params[i]->grad && opt->params[i]->n > 0)
            memset(opt->params[i]->grad, 0, (size_t)opt->params[i]->n * sizeof(float));
}

/* The scaler's bookkeeping after a step (GradScaler.update). */
static void scale_update(sp_optim *opt, int found_inf)
{
    if (!opt->o.fp16)
        return;
    if (found_inf) {
        opt->scale *= opt->o.scale_backoff;
        opt->growth_tracker = 0;
    } else if (++opt->growth_tracker >= opt->o.growth_interval) {
        opt->scale *= opt->o.scale_growth;
        opt->growth_tracker = 0;
    }
}

static float inv_scale(const sp_optim *opt)
{
    return opt->o.fp16 ? (float)(1.0 / (double)opt->scale) : 1.0f;
}

static sp_status step_cpu(sp_optim *opt, int *found_inf, float *norm, float lr)
{
    float inv = inv_scale(opt);
    int bad = 0;
    for (int i = 0; i < opt->n; i++)
        if (opt->params[i]->grad)
            bad |= sp_unscale_check_cpu(opt->params[i]->grad, opt->params[i]->n, inv);
    *found_inf = bad;
    if (bad)
        return SP_OK;
    double ss = 0.0;
    for (int i = 0; i < opt->n; i++)
        if (opt->params[i]->grad)
            ss += sp_sumsq_cpu(opt->params[i]->grad, opt->params[i]->n);
    *norm = (float)sqrt(ss);
    float gscale = sp_clip_coef(*norm, opt->o.clip_norm);
    for (int i = 0; i < opt->n; i++) {
        sp_t *p = opt->params[i];
        if (!p->grad)
            continue;
        opt->t[i]++;
        adamw_coefs c = coefs(lr, opt->o.beta1, opt->o.beta2, opt->o.eps, opt->o.weight_decay, opt->t[i]);
        adamw_apply(p->data, p->grad, opt->m[i], opt->v[i], p->n, gscale, &c);
    }
    return SP_OK;
}

#ifdef SEPAL_HAVE_CUDA
static sp_status step_cuda(sp_optim *opt, int *found_inf, float *norm, float lr, sp_err *err)
{
    sp_status st;
    for (int i = 0; i < opt->n && !opt->resident; i++) {
        sp_t *p = opt->params[i];
        if ((st = sp_cuda_adamw_upload(opt->cu, opt->off[i], p->n, p->data, p->grad, err)) != SP_OK)
            return st;
    }
    double ss = 0.0;
    if ((st = sp_cuda_adamw_unscale_norm(opt->cu, inv_scale(opt), found_inf, &ss, err)) != SP_OK)
        return st;
    if (*found_inf)
        return SP_OK;
    *norm = (float)sqrt(ss);
    float gscale = sp_clip_coef(*norm, opt->o.clip_norm);
    for (int i = 0; i < opt->n; i++) {
        sp_t *p = opt->params[i];
        if (!p->grad && !opt->resident) /* resident: every parameter's gradient is the device's */
            continue;
        st = sp_cuda_adamw_apply(opt->cu, opt->off[i], p->n, gscale, lr, opt->o.beta1, opt->o.beta2, opt->o.eps,
                                 opt->o.weight_decay, opt->t[i] + 1, err);
        if (st == SP_OK && !opt->resident)
            st = sp_cuda_adamw_download(opt->cu, opt->off[i], p->n, p->data, err);
        if (st != SP_OK)
            return st;
        opt->t[i]++;
    }
    return SP_OK;
}
#endif

sp_status sp_optim_step(sp_optim *opt, int *skipped, float *grad_norm, sp_err *err)
{
    if (skipped)
        *skipped = 0;
    if (grad_norm)
        *grad_norm = 0.0f;
    if (!opt)
        return sp_errf(err, SP_ERR_ARG, "optim: NULL optimiser");
    float lr = sp_optim_lr(opt), norm = 0.0f;
    int found_inf = 0;
    sp_status st = SP_OK;
#ifdef SEPAL_HAVE_CUDA
    if (opt->on_cuda)
        st = step_cuda(opt, &found_inf, &norm, lr, err);
    else
#endif
        st = step_cpu(opt, &found_inf, &norm, lr);
    if (st != SP_OK) {
        sp_err_prefix(err, "optim step: ");
        return st;
    }
    if (found_inf)
        norm = INFINITY;
    else
        opt->sched++;
    scale_update(opt, found_inf);
    zero_grads(opt);
#ifdef SEPAL_HAVE_CUDA
    if (opt->resident && (st = sp_cuda_adamw_zero_grads(opt->cu, err)) != SP_OK)
        return st;
#endif
    if (skipped)
        *skipped = found_inf;
    if (grad_norm)
        *grad_norm = norm;
    return SP_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* resident on the device */

sp_status sp_optim_make_resident(sp_optim *opt, sp_err *err)
{
    if (!opt->on_cuda)
        return sp_errf(err, SP_ERR_STATE, "optim: the parameters stay on the host without CUDA");
    opt->resident = 1;
    return sp_optim_to_device(opt, err);
}

float *sp_optim_device_buf(sp_optim *opt, int idx, int grad)
{
#ifdef SEPAL_HAVE_CUDA
    if (opt->on_cuda && idx >= 0 && idx < opt->n)
        return (grad ? sp_cuda_adamw_grads(opt->cu) : sp_cuda_adamw_params(opt->cu)) + opt->off[idx];
#else
    (void)grad;
#endif
    (void)opt, (void)idx;
    return NULL;
}

sp_status sp_optim_to_device(sp_optim *opt, sp_err *err)
{
    sp_status st = SP_OK;
#ifdef SEPAL_HAVE_CUDA
    for (int i = 0; opt->on_cuda && !st && i < opt->n; i++)
        st = sp_cuda_adamw_upload(opt->cu, opt->off[i], opt->params[i]->n, opt->params[i]->data, NULL, err);
#else
    (void)opt, (void)err;
#endif
    return st;
}

sp_status sp_optim_to_host(sp_optim *opt, sp_err *err)
{
    sp_status st = SP_OK;
#ifdef SEPAL_HAVE_CUDA
    for (int i = 0; opt->resident && !st && i < opt->n; i++)
        st = sp_cuda_adamw_download(opt->cu, opt->off[i], opt->params[i]->n, opt->params[i]->data, err);
#else
    (void)opt, (void)err;
#endif
    return st;
}
