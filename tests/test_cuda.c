/* test_cuda.c - CUDA kernels against their CPU references. Without a GPU every test reports itself
 * skipped (exit 77 for ctest) instead of passing silently. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"
#include "half.h"
#include "ops.h"
#include "optim.h"
#include "optim_cuda.h"
#include "rng.h"
#include "testutil.h"

START_TEST(t_rmsnorm_matches_cpu)
{
    int N = 37, C = 1000;
    sp_rng r;
    sp_rng_seed(&r, 5);
    float *x = malloc((size_t)N * C * 4), *w = malloc((size_t)C * 4);
    float *cpu = malloc((size_t)N * C * 4), *gpu = malloc((size_t)N * C * 4);
    sp_rng_fill_normal(&r, x, (long)N * C, 2.0f);
    sp_rng_fill_normal(&r, w, C, 1.0f);
    sp_rmsnorm_forward(cpu, NULL, x, w, N, C, 1e-5f);
    sp_err err = {0};
    ck_assert_msg(sp_cuda_rmsnorm_forward(gpu, x, w, N, C, 1e-5f, &err) == SP_OK, "%s", err.msg);
    ck_assert_double_le(sp_max_abs_diff(cpu, gpu, (size_t)N * C), 1e-5);
    free(x), free(w), free(cpu), free(gpu);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* optimiser kernels (cuda/optim.cu) against the CPU specification (client/train/optim.c) */

enum { BIG = 1000003 }; /* not a multiple of the block size */

/* max over i of |a - b| / (|b| + floor) */
static double max_rel_diff(const float *a, const float *b, size_t n, double floor)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]) / (fabs((double)b[i]) + floor);
        if (!(d <= worst)) /* also catches nan */
            worst = isnan(d) ? INFINITY : d;
    }
    return worst;
}

static float *rnd(sp_rng *r, size_t n, float sd)
{
    float *x = malloc(n * sizeof(float));
    sp_rng_fill_normal(r, x, (long)n, sd);
    return x;
}

static float *dup_f(const float *x, size_t n)
{
    float *y = malloc(n * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

START_TEST(t_adamw_update_matches_cpu)
{
    sp_rng r;
    sp_rng_seed(&r, 11);
    size_t n = BIG;
    float *p = rnd(&r, n, 1.0f), *m = rnd(&r, n, 0.01f), *v = rnd(&r, n, 0.001f);
    for (size_t i = 0; i < n; i++)
        v[i] = v[i] * v[i]; /* second moments are >= 0 */
    float *pc = dup_f(p, n), *mc = dup_f(m, n), *vc = dup_f(v, n);
    sp_err err = {0};
    for (int t = 1; t <= 5; t++) {
        float *g = rnd(&r, n, 0.1f);
        sp_adamw_update_cpu(pc, g, mc, vc, (int64_t)n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, t);
        ck_assert_msg(sp_cuda_adamw_update(p, g, m, v, (int64_t)n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, t, &err) == SP_OK,
                      "%s", err.msg);
        free(g);
        ck_assert_double_le(max_rel_diff(p, pc, n, 1e-9), 1e-6);
        ck_assert_double_le(max_rel_diff(m, mc, n, 1e-12), 1e-6);
        ck_assert_double_le(max_rel_diff(v, vc, n, 1e-15), 1e-6);
    }
    free(p), free(m), free(v), free(pc), free(mc), free(vc);
}
END_TEST

START_TEST(t_unscale_check_matches_cpu)
{
    sp_rng r;
    sp_rng_seed(&r, 12);
    size_t n = BIG;
    float *g = rnd(&r, n, 1000.0f), *gc = dup_f(g, n);
    sp_err err = {0};
    int found = -1;
    ck_assert_msg(sp_cuda_unscale_check(g, (int64_t)n, 1.0f / 1024.0f, &found, &err) == SP_OK, "%s", err.msg);
    ck_assert_int_eq(found, sp_unscale_check_cpu(gc, (int64_t)n, 1.0f / 1024.0f));
    ck_assert_int_eq(found, 0);
    ck_assert_mem_eq(g, gc, n * sizeof(float));
    /* inf in the last element (the tail of the last block), nan in the first, huge values that overflow */
    float keep = g[n - 1];
    g[n - 1] = INFINITY;
    ck_assert_int_eq(sp_cuda_unscale_check(g, (int64_t)n, 1.0f, &found, &err), SP_OK);
    ck_assert_int_eq(found, 1);
    g[n - 1] = keep;
    g[0] = NAN;
    ck_assert_int_eq(sp_cuda_unscale_check(g, (int64_t)n, 0.5f, &found, &err), SP_OK);
    ck_assert_int_eq(found, 1);
    g[0] = 1.0f;
    g[n / 2] = 3e38f;
    ck_assert_int_eq(sp_cuda_unscale_check(g, (int64_t)n, 1.0f, &found, &err), SP_OK);
    ck_assert_int_eq(found, 0);
    ck_assert_int_eq(sp_cuda_unscale_check(g, 7, 4.0f, &found, &err), SP_OK); /* a small n: one partial block */
    ck_assert_int_eq(found, 0);
    g[n / 2] = 3e38f;
    ck_assert_int_eq(sp_cuda_unscale_check(g, (int64_t)n, 4.0f, &found, &err), SP_OK);
    ck_assert_int_eq(found, 1);
    free(g), free(gc);
}
END_TEST

START_TEST(t_sumsq_matches_cpu)
{
    sp_rng r;
    sp_rng_seed(&r, 13);
    const size_t sizes[] = {1, 255, 257, 4099, BIG};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        float *g = rnd(&r, n, 0.5f);
        double gpu = -1, cpu = sp_sumsq_cpu(g, (int64_t)n);
        sp_err err = {0};
        ck_assert_msg(sp_cuda_sumsq(g, (int64_t)n, &gpu, &err) == SP_OK, "%s", err.msg);
        ck_assert_msg(fabs(gpu - cpu) <= 1e-9 * cpu, "n %zu: %.17g vs %.17g", n, gpu, cpu);
        ck_assert_double_le(fabs(sqrt(gpu) - sqrt(cpu)), 1e-6 * sqrt(cpu));
        free(g);
    }
}
END_TEST

static sp_t *mk_leaf(float *data, int64_t n)
{
    sp_t *t = calloc(1, sizeof *t);
    t->ndim = 1;
    t->shape[0] = n;
    t->n = n;
    t->data = data;
    t->grad = calloc((size_t)n, sizeof(float));
    t->requires_grad = 1;
    return t;
}

START_TEST(t_optim_step_matches_cpu)
{
    enum { NP = 3 };
    const int64_t sizes[NP] = {BIG, 257, 1};
    sp_rng r;
    sp_rng_seed(&r, 14);
    sp_t *cp[NP], *gp[NP];
    for (int k = 0; k < NP; k++) {
        float *d = rnd(&r, (size_t)sizes[k], 1.0f);
        cp[k] = mk_leaf(d, sizes[k]);
        gp[k] = mk_leaf(dup_f(d, (size_t)sizes[k]), sizes[k]);
    }
    sp_adamw_opts o;
    sp_adamw_opts_default(&o);
    o.lr = 1e-2f;
    o.weight_decay = 0.01f;
    o.warmup_steps = 2;
    o.total_steps = 10;
    o.clip_norm = 300.0f; /* sd 0.2 over 1e6 values: norm ~200 (kept); sd 1: ~1000 (clipped) */
    o.fp16 = 1;
    o.loss_scale = 65536.0f;
    o.growth_interval = 2;
    sp_optim *oc = NULL, *og = NULL;
    sp_err err = {0};
    o.device = 0;
    ck_assert_msg(sp_optim_new(&oc, cp, NP, &o, &err) == SP_OK, "%s", err.msg);
    o.device = 1;
    ck_assert_msg(sp_optim_new(&og, gp, NP, &o, &err) == SP_OK, "%s", err.msg);
    ck_assert_int_eq(sp_optim_on_cuda(og), 1);
    ck_assert_int_eq(sp_optim_on_cuda(oc), 0);
    for (int s = 0; s < 8; s++) {
        float scale = sp_optim_loss_scale(oc);
        ck_assert_float_eq(scale, sp_optim_loss_scale(og));
        ck_assert_float_eq(sp_optim_lr(oc), sp_optim_lr(og));
        for (int k = 0; k < NP; k++) {
            /* step 5: the scalar parameter gets no grad (left alone on both) */
            int none = s == 5 && k == 2;
            float *g = rnd(&r, (size_t)sizes[k], s == 2 ? 1.0f : 0.2f); /* step 2: clipped */
            for (int64_t i = 0; i < sizes[k]; i++)
                g[i] *= scale;
            if (s == 4 && k == 1)
                g[100] = INFINITY; /* overflow: skipped, scale backs off */
            if (none) {
                free(cp[k]->grad), free(gp[k]->grad);
                cp[k]->grad = gp[k]->grad = NULL;
            } else {
                if (!cp[k]->grad)
                    cp[k]->grad = calloc((size_t)sizes[k], sizeof(float)), gp[k]->grad = calloc((size_t)sizes[k], 4);
                memcpy(cp[k]->grad, g, (size_t)sizes[k] * sizeof(float));
                memcpy(gp[k]->grad, g, (size_t)sizes[k] * sizeof(float));
            }
            free(g);
        }
        int sk_c = -1, sk_g = -1;
        float n_c = -1, n_g = -1;
        ck_assert_msg(sp_optim_step(oc, &sk_c, &n_c, &err) == SP_OK, "%s", err.msg);
        ck_assert_msg(sp_optim_step(og, &sk_g, &n_g, &err) == SP_OK, "%s", err.msg);
        ck_assert_int_eq(sk_c, sk_g);
        ck_assert_int_eq(sk_c, s == 4);
        if (sk_c)
            ck_assert(isinf(n_c) && isinf(n_g));
        else
            ck_assert_msg(fabs((double)n_c - n_g) <= 1e-6 * n_c, "step %d: norm %.9g vs %.9g", s, (double)n_c,
                          (double)n_g);
        for (int k = 0; k < NP; k++) {
            double d = max_rel_diff(gp[k]->data, cp[k]->data, (size_t)sizes[k], 1e-9);
            ck_assert_msg(d <= 1e-6, "step %d param %d: rel diff %g", s, k, d);
            ck_assert_int_eq(sp_optim_param_steps(oc, k), sp_optim_param_steps(og, k));
            if (gp[k]->grad)
                ck_assert_float_eq(gp[k]->grad[sizes[k] - 1], 0.0f); /* zeroed */
        }
    }
    ck_assert_int_eq(sp_optim_param_steps(og, 0), 7);
    ck_assert_int_eq(sp_optim_param_steps(og, 2), 6);
    ck_assert_float_eq(sp_optim_loss_scale(oc), sp_optim_loss_scale(og));
    uint16_t *h = malloc((size_t)sizes[1] * 2);
    ck_assert_int_eq(sp_optim_fp16_copy(og, 1, h), SP_OK);
    ck_assert_uint_eq(h[7], sp_f32_to_f16(gp[1]->data[7]));
    free(h);
    sp_optim_free(oc);
    sp_optim_free(og);
    for (int k = 0; k < NP; k++) {
        free(cp[k]->data), free(cp[k]->grad), free(cp[k]);
        free(gp[k]->data), free(gp[k]->grad), free(gp[k]);
    }
}
END_TEST

int main(void)
{
    char why[256];
    if (sp_cuda_device_count(why, sizeof why) <= 0) {
        printf("test_cuda: skipped: no usable GPU (%s)\n", why);
        return 77;
    }
    char name[256];
    sp_cuda_device_name(name, sizeof name);
    printf("test_cuda: running on %s\n", name);
    setenv("CK_FORK", "no", 1); /* a CUDA context made before fork() is unusable in the child */
    Suite *s = suite_create("cuda");
    TCase *tc = tcase_create("kernels_vs_cpu");
    tcase_add_test(tc, t_rmsnorm_matches_cpu);
    tcase_add_test(tc, t_adamw_update_matches_cpu);
    tcase_add_test(tc, t_unscale_check_matches_cpu);
    tcase_add_test(tc, t_sumsq_matches_cpu);
    tcase_add_test(tc, t_optim_step_matches_cpu);
    suite_add_tcase(s, tc);
    return sp_test_run(s);
}
