/* test_optim.c - the CPU optimiser (the specification): AdamW against an independent double-precision loop
 * written from the torch.optim.AdamW formulas, the warmup/decay schedule, global-norm clipping, dynamic loss
 * scaling, a small quadratic that must converge, and the fp16 compute copy. Parameters are sp_t leaves built
 * by hand (only .ndim/.shape/.n/.data/.grad matter to the optimiser). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "optim.h"
#include "testutil.h"

static sp_t *mk_param(int64_t n, const float *init)
{
    sp_t *t = calloc(1, sizeof *t);
    t->ndim = 1;
    t->shape[0] = n;
    t->n = n;
    t->data = calloc((size_t)n, sizeof(float));
    t->grad = calloc((size_t)n, sizeof(float));
    t->requires_grad = 1;
    if (init)
        memcpy(t->data, init, (size_t)n * sizeof(float));
    return t;
}

static void free_param(sp_t *t)
{
    free(t->data);
    free(t->grad);
    free(t);
}

static sp_adamw_opts cpu_opts(void)
{
    sp_adamw_opts o;
    sp_adamw_opts_default(&o);
    o.device = 0;
    return o;
}

/* One AdamW step in double, straight from the formulas (torch.optim.AdamW). */
static void ref_adamw(double *p, double *m, double *v, const double *g, int n, double lr, double b1, double b2,
                      double eps, double wd, int t)
{
    for (int i = 0; i < n; i++) {
        p[i] -= lr * wd * p[i];
        m[i] = b1 * m[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
        double mhat = m[i] / (1 - pow(b1, t));
        double vhat = v[i] / (1 - pow(b2, t));
        p[i] -= lr * mhat / (sqrt(vhat) + eps);
    }
}

/* A deterministic gradient for element i at step s. */
static double grad_at(int i, int s)
{
    return 0.3 * sin(1.7 * i + 0.9 * s) + 0.05 * (i - 2);
}

START_TEST(t_adamw_matches_reference)
{
    enum { N0 = 3, N1 = 2, N = N0 + N1, STEPS = 6 };
    float init[N] = {0.5f, -1.25f, 2.0f, 0.1f, -0.75f};
    sp_t *a = mk_param(N0, init), *b = mk_param(N1, init + N0);
    sp_t *ps[2] = {a, b};
    sp_adamw_opts o = cpu_opts();
    o.lr = 1e-2f;
    o.weight_decay = 0.1f;
    sp_optim *opt = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_optim_new(&opt, ps, 2, &o, &err) == SP_OK, "%s", err.msg);
    ck_assert_int_eq(sp_optim_on_cuda(opt), 0);
    ck_assert_float_eq(sp_optim_loss_scale(opt), 1.0f);

    double p[N], m[N] = {0}, v[N] = {0}, g[N];
    for (int i = 0; i < N; i++)
        p[i] = init[i];
    /* the bare update, on a copy */
    float bp[N], bg[N], bm[N] = {0}, bv[N] = {0};
    memcpy(bp, init, sizeof bp);
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < N; i++) {
            g[i] = (float)grad_at(i, s);
            bg[i] = (float)g[i];
        }
        memcpy(a->grad, bg, N0 * sizeof(float));
        memcpy(b->grad, bg + N0, N1 * sizeof(float));
        int skipped = -1;
        float norm = 0;
        ck_assert_msg(sp_optim_step(opt, &skipped, &norm, &err) == SP_OK, "%s", err.msg);
        ck_assert_int_eq(skipped, 0);
        double ss = 0;
        for (int i = 0; i < N; i++)
            ss += g[i] * g[i];
        ck_assert_double_eq_tol(norm, sqrt(ss), 1e-6);
        ref_adamw(p, m, v, g, N, o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, s + 1);
        sp_adamw_update_cpu(bp, bg, bm, bv, N, o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, s + 1);
        for (int i = 0; i < N; i++) {
            float got = i < N0 ? a->data[i] : b->data[i - N0];
            ck_assert_msg(fabs(got - p[i]) <= 1e-6 * (1 + fabs(p[i])), "step %d elem %d: %.9g vs %.9g", s, i,
                          (double)got, p[i]);
            ck_assert_msg(fabs(bp[i] - p[i]) <= 1e-6 * (1 + fabs(p[i])), "bare step %d elem %d", s, i);
            ck_assert_double_eq_tol(bm[i], m[i], 1e-7);
            ck_assert_double_eq_tol(bv[i], v[i], 1e-8);
        }
        /* grads are zeroed by the step */
        for (int i = 0; i < N0; i++)
            ck_assert_float_eq(a->grad[i], 0.0f);
    }
    ck_assert_int_eq(sp_optim_param_steps(opt, 0), STEPS);
    ck_assert_int_eq(sp_optim_param_steps(opt, 1), STEPS);
    sp_optim_free(opt);
    free_param(a);
    free_param(b);
}
END_TEST

/* A first step worked by hand (torch.optim.AdamW gives the same): p = 1, g = 0.5, lr = 0.1, wd = 0.1:
 * decay 1 -> 0.99; m = 0.05, v = 0.00025, mhat = 0.5, sqrt(vhat) = 0.5; p = 0.99 - 0.1 * 0.5 / (0.5 + 1e-8). */
START_TEST(t_adamw_first_step_by_hand)
{
    float one = 1.0f;
    sp_t *a = mk_param(1, &one);
    sp_adamw_opts o = cpu_opts();
    o.lr = 0.1f;
    o.weight_decay = 0.1f;
    sp_optim *opt = NULL;
    ck_assert_int_eq(sp_optim_new(&opt, &a, 1, &o, NULL), SP_OK);
    a->grad[0] = 0.5f;
    ck_assert_int_eq(sp_optim_step(opt, NULL, NULL, NULL), SP_OK);
    ck_assert_double_eq_tol(a->data[0], 0.89, 1e-7);
    /* a negative grad of another size moves it up by ~lr (the first Adam step is lr * sign(g)) */
    a->grad[0] = -3.0f;
    ck_assert_int_eq(sp_optim_step(opt, NULL, NULL, NULL), SP_OK);
    /* by the formulas: p = 0.89 * 0.99; m = 0.9*0.05 - 0.3 = -0.255, v = 0.999*0.00025 + 0.009 */
    double m = -0.255 / (1 - 0.81), v = (0.999 * 0.00025 + 0.001 * 9.0) / (1 - 0.999 * 0.999);
    double want = 0.89 * 0.99 - 0.1 * m / (sqrt(v) + 1e-8);
    ck_assert_double_eq_tol(a->data[0], want, 1e-6);
    sp_optim_free(opt);
    free_param(a);
}
END_TEST

START_TEST(t_schedule)
{
    float z = 1.0f;
    sp_t *a = mk_param(1, &z);
    sp_adamw_opts o = cpu_opts();
    o.lr = 1.0f;
    o.weight_decay = 0.5f;
    o.warmup_steps = 4;
    o.total_steps = 12;
    sp_optim *opt = NULL;
    ck_assert_int_eq(sp_optim_new(&opt, &a, 1, &o, NULL), SP_OK);
    /* transformers' convention: the update with 0-based index s uses lr * s / warmup, then decays. */
    const double want[15] = {0, 0.25, 0.5, 0.75, 1.0, 7.0 / 8, 6.0 / 8, 5.0 / 8, 4.0 / 8, 3.0 / 8, 2.0 / 8, 1.0 / 8,
                             0, 0, 0};
    for (int s = 0; s < 15; s++) {
        ck_assert_msg(fabs(sp_optim_lr(opt) - want[s]) < 1e-7, "step %d: lr %g, want %g", s, (double)sp_optim_lr(opt),
                      want[s]);
        /* zero grad: the update is only the decay p *= 1 - lr * wd, which shows the lr actually used */
        double before = a->data[0];
        a->grad[0] = 0.0f;
        ck_assert_int_eq(sp_optim_step(opt, NULL, NULL, NULL), SP_OK);
        ck_assert_double_eq_tol(a->data[0], before * (1 - want[s] * 0.5), 1e-7);
    }
    sp_optim_free(opt);

    /* no warmup, no total: constant */
    o.warmup_steps = 0;
    o.total_steps = 0;
    ck_assert_int_eq(sp_optim_new(&opt, &a, 1, &o, NULL), SP_OK);
    for (int s = 0; s < 3; s++) {
        ck_assert_float_eq(sp_optim_lr(opt), 1.0f);
        ck_assert_int_eq(sp_optim_step(opt, NULL, NULL, NULL), SP_OK);
    }
    sp_optim_free(opt);
    /* warmup only: ramps then stays */
    o.warmup_steps = 2;
    ck_assert_int_eq(sp_optim_new(&opt, &a, 1, &o, NULL), SP_OK);
    const float ramp[4] = {0.0f, 0.5f, 1.0f, 1.0f};
    for (int s = 0; s < 4; s++) {
        ck_assert_float_eq_tol(sp_optim_lr(opt), ramp[s], 1e-7f);
        ck_assert_int_eq(sp_optim_step(opt, NULL, NULL, NULL), SP_OK);
    }
    sp_optim_free(opt);
    /* no warmup, decay over 4: 1, .75, .5, .25, 0 */
    o.warmup_steps = 0;
    o.total_steps = 4;
    ck_assert_int_eq(sp_optim_new(&opt, &a, 1, &o, NULL), SP_OK);
    for (int s = 0; s < 6; s++) {
        ck_assert_float_eq_tol(sp_optim_lr(opt), s < 4 ? 1.0f - 0.25f * (float)s : 0.0f, 1e-7f);
        ck_assert_int_eq(sp_optim_step(opt, NULL, NULL, NULL), SP_OK);
    }
    sp_optim_free(opt);
    free_param(a);
}
END_TEST

static double grads_norm(sp_t **ps, int n)
{
    double ss = 0;
    for (int k = 0; k < n; k++)
        for (int64_t i = 0; i < ps[k]->n; i++)
            ss += (double)ps[k]->grad[i] * ps[k]->grad[i];
    return sqrt(ss);
}

START_TEST(t_clip_grad_norm)
{
    sp_t *a = mk_param(2, NULL), *b = mk_param(1, NULL);
    sp_t *ps[2] = {a, b};
    a->grad[0] = 3.0f, a->grad[1] = 0.0f, b->grad[0] = 4.0f;
    /* no clipping due: only measured */
    ck_assert_float_eq_tol(sp_clip_grad_norm(ps, 2, 10.0f), 5.0f, 1e-6f);
    ck_assert_double_eq_tol(grads_norm(ps, 2), 5.0, 1e-6);
    /* clip to 1: norm before 5, after 1 (torch: coef = 1 / (5 + 1e-6)) */
    ck_assert_float_eq_tol(sp_clip_grad_norm(ps, 2, 1.0f), 5.0f, 1e-6f);
    ck_assert_double_eq_tol(grads_norm(ps, 2), 1.0, 1e-6);
    ck_assert_float_eq_tol(a->grad[0], 0.6f, 1e-6f);
    ck_assert_float_eq_tol(b->grad[0], 0.8f, 1e-6f);
    ck_assert_float_eq(sp_clip_coef(0.5f, 1.0f), 1.0f);
    ck_assert_float_eq(sp_clip_coef(100.0f, 0.0f), 1.0f);
    ck_assert_float_eq_tol(sp_clip_coef(4.0f, 1.0f), 0.25f, 1e-7f);

    /* through the optimiser: grad_norm reports the norm before clipping, the update uses clipped grads.
     * eps = 1 makes the first Adam step depend on the grad's size, so clipping shows in the params. */
    sp_adamw_opts o = cpu_opts();
    o.lr = 0.1f;
    o.weight_decay = 0.0f;
    o.eps = 1.0f;
    o.clip_norm = 1.0f;
    sp_optim *opt = NULL;
    ck_assert_int_eq(sp_optim_new(&opt, ps, 2, &o, NULL), SP_OK);
    a->grad[0] = 3.0f, a->grad[1] = 0.0f, b->grad[0] = 4.0f;
    float norm = 0;
    ck_assert_int_eq(sp_optim_step(opt, NULL, &norm, NULL), SP_OK);
    ck_assert_float_eq_tol(norm, 5.0f, 1e-6f);
    double p[3] = {0, 0, 0}, m[3] = {0}, v[3] = {0}, g[3] = {3 / (5 + 1e-6), 0, 4 / (5 + 1e-6)};
    ref_adamw(p, m, v, g, 3, 0.1, o.beta1, o.beta2, 1.0, 0.0, 1);
    ck_assert_double_eq_tol(a->data[0], p[0], 1e-7);
    ck_assert_double_eq_tol(a->data[1], p[1], 1e-7);
    ck_assert_double_eq_tol(b->data[0], p[2], 1e-7);
    ck_assert_double_lt(fabs(a->data[0]), 0.1 * 3 / 4.0); /* unclipped it would be 0.1 * 3 / 4 */
    sp_optim_free(opt);
    free_param(a);
    free_param(b);
}
END_TEST

START_TEST(t_loss_scaling)
{
    enum { N = 4 };
    float init[N] = {1.0f, -2.0f, 0.5f, 3.0f};
    const float g[N] = {0.25f, -0.5f, 0.125f, 1.0f};
    sp_t *a = mk_param(N, init), *r = mk_param(N, init); /* fp16-scaled vs plain reference */
    sp_adamw_opts o = cpu_opts();
    o.lr = 0.01f;
    sp_adamw_opts of = o;
    of.fp16 = 1;
    of.loss_scale = 1024.0f;
    of.growth_interval = 3;
    of.scale_growth = 2.0f;
    of.scale_backoff = 0.5f;
    sp_optim *opt = NULL, *ref = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_optim_new(&opt, &a, 1, &of, &err) == SP_OK, "%s", err.msg);
    ck_assert_int_eq(sp_optim_new(&ref, &r, 1, &o, NULL), SP_OK);
    ck_assert_float_eq(sp_optim_loss_scale(opt), 1024.0f);
    ck_assert_float_eq(sp_optim_loss_scale(ref), 1.0f);

    /* one clean step: scaled grads unscale exactly (a power of two), so the result equals the plain one */
    int skipped = -1;
    float norm = 0;
    for (int i = 0; i < N; i++)
        a->grad[i] = g[i] * sp_optim_loss_scale(opt), r->grad[i] = g[i];
    ck_assert_int_eq(sp_optim_step(opt, &skipped, &norm, NULL), SP_OK);
    ck_assert_int_eq(sp_optim_step(ref, NULL, NULL, NULL), SP_OK);
    ck_assert_int_eq(skipped, 0);
    ck_assert_float_eq_tol(norm, sqrtf(0.0625f + 0.25f + 0.015625f + 1.0f), 1e-6f);
    ck_assert_mem_eq(a->data, r->data, N * sizeof(float));

    /* an inf grad: skipped, params unchanged, grads zeroed, scale halved, schedule and t not advanced */
    float before[N];
    memcpy(before, a->data, sizeof before);
    float lr_before = sp_optim_lr(opt);
    for (int i = 0; i < N; i++)
        a->grad[i] = g[i] * sp_optim_loss_scale(opt);
    a->grad[2] = INFINITY;
    ck_assert_int_eq(sp_optim_step(opt, &skipped, &norm, NULL), SP_OK);
    ck_assert_int_eq(skipped, 1);
    ck_assert(isinf(norm));
    ck_assert_mem_eq(a->data, before, sizeof before);
    for (int i = 0; i < N; i++)
        ck_assert_float_eq(a->grad[i], 0.0f);
    ck_assert_float_eq(sp_optim_loss_scale(opt), 512.0f);
    ck_assert_int_eq(sp_optim_param_steps(opt, 0), 1);
    ck_assert_float_eq(sp_optim_lr(opt), lr_before);

    /* a nan does the same */
    a->grad[0] = NAN;
    ck_assert_int_eq(sp_optim_step(opt, &skipped, NULL, NULL), SP_OK);
    ck_assert_int_eq(skipped, 1);
    ck_assert_mem_eq(a->data, before, sizeof before);
    ck_assert_float_eq(sp_optim_loss_scale(opt), 256.0f);

    /* growth after growth_interval (3) clean steps; an overflow in between resets the counter */
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < N; i++)
            a->grad[i] = g[i] * sp_optim_loss_scale(opt), r->grad[i] = g[i];
        ck_assert_int_eq(sp_optim_step(opt, &skipped, NULL, NULL), SP_OK);
        ck_assert_int_eq(sp_optim_step(ref, NULL, NULL, NULL), SP_OK);
        ck_assert_int_eq(skipped, 0);
        ck_assert_float_eq(sp_optim_loss_scale(opt), 256.0f);
    }
    a->grad[1] = -INFINITY;
    ck_assert_int_eq(sp_optim_step(opt, &skipped, NULL, NULL), SP_OK);
    ck_assert_int_eq(skipped, 1);
    ck_assert_float_eq(sp_optim_loss_scale(opt), 128.0f);
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < N; i++)
            a->grad[i] = g[i] * sp_optim_loss_scale(opt), r->grad[i] = g[i];
        ck_assert_int_eq(sp_optim_step(opt, &skipped, NULL, NULL), SP_OK);
        ck_assert_int_eq(sp_optim_step(ref, NULL, NULL, NULL), SP_OK);
        ck_assert_int_eq(skipped, 0);
        ck_assert_float_eq(sp_optim_loss_scale(opt), k < 2 ? 128.0f : 256.0f);
    }
    /* the skipped steps left no trace: same params and step count as the plain optimiser */
    ck_assert_mem_eq(a->data, r->data, N * sizeof(float));
    ck_assert_int_eq(sp_optim_param_steps(opt, 0), sp_optim_param_steps(ref, 0));
    sp_optim_free(opt);
    sp_optim_free(ref);

    /* without fp16 a non-finite grad also skips (scale stays 1) */
    ck_assert_int_eq(sp_optim_new(&ref, &r, 1, &o, NULL), SP_OK);
    memcpy(before, r->data, sizeof before);
    r->grad[3] = NAN;
    ck_assert_int_eq(sp_optim_step(ref, &skipped, NULL, NULL), SP_OK);
    ck_assert_int_eq(skipped, 1);
    ck_assert_mem_eq(r->data, before, sizeof before);
    ck_assert_float_eq(sp_optim_loss_scale(ref), 1.0f);
    sp_optim_free(ref);
    free_param(a);
    free_param(r);
}
END_TEST

START_TEST(t_quadratic_converges)
{
    enum { N = 6 };
    const float target[N] = {1.0f, -2.0f, 0.5f, 3.0f, -0.25f, 0.0f};
    sp_t *a = mk_param(N, NULL);
    sp_adamw_opts o = cpu_opts();
    o.lr = 0.1f;
    o.weight_decay = 0.0f;
    o.warmup_steps = 10;
    o.total_steps = 200;
    o.clip_norm = 10.0f;
    o.fp16 = 1;
    o.loss_scale = 256.0f;
    o.growth_interval = 50;
    sp_optim *opt = NULL;
    ck_assert_int_eq(sp_optim_new(&opt, &a, 1, &o, NULL), SP_OK);
    double loss0 = 0, loss = 0;
    for (int i = 0; i < N; i++)
        loss0 += (double)target[i] * target[i];
    for (int s = 0; s < 200; s++) {
        float sc = sp_optim_loss_scale(opt);
        for (int i = 0; i < N; i++)
            a->grad[i] = 2.0f * (a->data[i] - target[i]) * sc; /* d/dp sum((p - t)^2), scaled */
        int skipped = 0;
        ck_assert_int_eq(sp_optim_step(opt, &skipped, NULL, NULL), SP_OK);
        ck_assert_int_eq(skipped, 0);
    }
    for (int i = 0; i < N; i++)
        loss += ((double)a->data[i] - target[i]) * ((double)a->data[i] - target[i]);
    ck_assert_msg(loss < 1e-4 * loss0, "loss %g (from %g)", loss, loss0);
    for (int i = 0; i < N; i++)
        ck_assert_double_eq_tol(a->data[i], target[i], 1e-2);
    ck_assert_float_eq(sp_optim_loss_scale(opt), 256.0f * 16.0f); /* grew every 50 clean steps */
    sp_optim_free(opt);
    free_param(a);
}
END_TEST

START_TEST(t_fp16_copy)
{
    float init[5] = {1.0f, -0.5f, 65504.0f, 1e-8f, 0.1f};
    sp_t *a = mk_param(5, init);
    sp_adamw_opts o = cpu_opts();
    o.fp16 = 1;
    sp_optim *opt = NULL;
    ck_assert_int_eq(sp_optim_new(&opt, &a, 1, &o, NULL), SP_OK);
    ck_assert_int_eq(sp_optim_nparams(opt), 1);
    uint16_t h[5];
    ck_assert_int_eq(sp_optim_fp16_copy(opt, 0, h), SP_OK);
    ck_assert_uint_eq(h[0], 0x3C00);
    ck_assert_uint_eq(h[1], 0xB800);
    ck_assert_uint_eq(h[2], 0x7BFF);
    for (int i = 0; i < 5; i++)
        ck_assert_uint_eq(h[i], sp_f32_to_f16(init[i]));
    ck_assert_float_eq_tol(sp_f16_to_f32(h[4]), 0.1f, 1e-4f);
    ck_assert_int_eq(sp_optim_fp16_copy(opt, 1, h), SP_ERR_ARG);
    ck_assert_int_eq(sp_optim_fp16_copy(opt, -1, h), SP_ERR_ARG);
    sp_optim_free(opt);
    free_param(a);
}
END_TEST

START_TEST(t_null_grad_and_args)
{
    float init[2] = {1.0f, 2.0f};
    sp_t *a = mk_param(2, init), *b = mk_param(2, init);
    free(b->grad);
    b->grad = NULL; /* never reached by a backward: left alone, like torch's grad None */
    sp_t *ps[2] = {a, b};
    sp_adamw_opts o = cpu_opts();
    sp_optim *opt = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_optim_new(&opt, ps, 2, &o, &err), SP_OK);
    a->grad[0] = 1.0f, a->grad[1] = -1.0f;
    ck_assert_int_eq(sp_optim_step(opt, NULL, NULL, &err), SP_OK);
    ck_assert_float_ne(a->data[0], 1.0f);
    ck_assert_mem_eq(b->data, init, sizeof init);
    ck_assert_int_eq(sp_optim_param_steps(opt, 0), 1);
    ck_assert_int_eq(sp_optim_param_steps(opt, 1), 0);
    sp_optim_free(opt);

    sp_adamw_opts bad = o;
    bad.lr = -1.0f;
    ck_assert_int_eq(sp_optim_new(&opt, ps, 2, &bad, &err), SP_ERR_ARG);
    ck_assert_ptr_null(opt);
    bad = o;
    bad.beta1 = 1.0f;
    ck_assert_int_eq(sp_optim_new(&opt, ps, 2, &bad, &err), SP_ERR_ARG);
    bad = o;
    bad.fp16 = 1;
    bad.loss_scale = 0.0f;
    ck_assert_int_eq(sp_optim_new(&opt, ps, 2, &bad, &err), SP_ERR_ARG);
    bad = o;
    bad.device = 2;
    ck_assert_int_eq(sp_optim_new(&opt, ps, 2, &bad, &err), SP_ERR_ARG);
    sp_t nodata = {0};
    nodata.n = 3;
    sp_t *pn = &nodata;
    ck_assert_int_eq(sp_optim_new(&opt, &pn, 1, &o, &err), SP_ERR_ARG);

    /* device 1: CUDA if there is a GPU, else SP_ERR_UNSUPPORTED; auto (-1) agrees with it */
    o.device = 1;
    sp_status st = sp_optim_new(&opt, ps, 2, &o, &err);
    int have_gpu = st == SP_OK;
    if (st == SP_OK) {
        ck_assert_int_eq(sp_optim_on_cuda(opt), 1);
        sp_optim_free(opt);
    } else {
        ck_assert_int_eq(st, SP_ERR_UNSUPPORTED);
    }
    o.device = -1;
    ck_assert_int_eq(sp_optim_new(&opt, ps, 2, &o, &err), SP_OK);
    ck_assert_int_eq(sp_optim_on_cuda(opt), have_gpu);
    sp_optim_free(opt);
    sp_optim_free(NULL);
    free_param(a);
    free_param(b);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("optim");
    TCase *tc = tcase_create("cpu");
    tcase_add_test(tc, t_adamw_matches_reference);
    tcase_add_test(tc, t_adamw_first_step_by_hand);
    tcase_add_test(tc, t_schedule);
    tcase_add_test(tc, t_clip_grad_norm);
    tcase_add_test(tc, t_loss_scaling);
    tcase_add_test(tc, t_quadratic_converges);
    tcase_add_test(tc, t_fp16_copy);
    tcase_add_test(tc, t_null_grad_and_args);
    suite_add_tcase(s, tc);
    return sp_test_run(s);
}
