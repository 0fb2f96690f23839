/* test_ops.c - every op's backward against central finite differences in double precision, and the
 * f32 compute path against the f64 one. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "rng.h"
#include "rope.h"
#include "testutil.h"

/* ---------------------------------------------------------------------------------------------- */
/* harness: L(x) = sum(out(x) * G); the op's backward gives dL/dx; compare with (L(x+h) - L(x-h)) / 2h */

typedef double (*loss_fn)(void *ctx);

static sp_rng rng;

static double *rand_vec(long n, double scale)
{
    double *x = malloc((size_t)n * sizeof(double));
    for (long i = 0; i < n; i++)
        x[i] = scale * (2.0 * sp_rng_f32(&rng) - 1.0);
    return x;
}

static double *zeros(long n) { return calloc((size_t)n, sizeof(double)); }

static double dot(const double *a, const double *b, long n)
{
    double s = 0;
    for (long i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* Max relative error of analytic gradient `g` of x[0..n) against finite differences. */
static double fd_check(loss_fn f, void *ctx, double *x, const double *g, long n)
{
    const double h = 1e-5;
    double worst = 0;
    for (long i = 0; i < n; i++) {
        double keep = x[i];
        x[i] = keep + h;
        double lp = f(ctx);
        x[i] = keep - h;
        double lm = f(ctx);
        x[i] = keep;
        double num = (lp - lm) / (2 * h);
        double rel = fabs(num - g[i]) / fmax(1.0, fabs(num) + fabs(g[i]));
        worst = fmax(worst, rel);
    }
    return worst;
}

#define FD_TOL 1e-7

/* f32 instantiation vs f64 on the same inputs */
static float *to_f32(const double *x, long n)
{
    float *y = malloc((size_t)n * sizeof(float));
    for (long i = 0; i < n; i++)
        y[i] = (float)x[i];
    return y;
}

static double max_diff_fd(const float *a, const double *b, long n)
{
    double m = 0;
    for (long i = 0; i < n; i++)
        m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

/* ---------------------------------------------------------------------------------------------- */
/* rmsnorm */

typedef struct {
    int N, C;
    double *x, *w, *G, *out, *rstd;
} norm_ctx;

static double rms_loss(void *p)
{
    norm_ctx *c = p;
    sp_rmsnorm_forward_f64(c->out, c->rstd, c->x, c->w, c->N, c->C, 1e-5f);
    return dot(c->out, c->G, (long)c->N * c->C);
}

/* The vectorisable exp of the f32 loops: within 2 ulp of exp (in double) over [-87, 88], and the f32 SwiGLU
 * and softmax built on it stay within a few ulp of their f64 twins (which use libm's exp). */
START_TEST(t_expf_vec)
{
    double worst = 0;
    for (double x = -87.0; x <= 88.0; x += 0.0009765625 * 3.14159) {
        double want = exp((double)(float)x), got = sp_expf_vec((float)x);
        double rel = fabs(got - want) / want;
        worst = rel > worst ? rel : worst;
    }
    const double ulp = 1.1920929e-7; /* 2^-23: one ulp relative, at most */
    ck_assert_msg(worst <= 2 * ulp, "sp_expf_vec: relative error %g, more than 2 ulp (%g)", worst, 2 * ulp);
    ck_assert_float_eq(sp_expf_vec(0.0f), 1.0f);
    ck_assert(sp_expf_vec(-1000.0f) < 1e-37f && sp_expf_vec(-1000.0f) >= 0.0f); /* clamped, not garbage */
    ck_assert(sp_expf_vec(1000.0f) > 1e38f);
    ck_assert(isnan(sp_expf_vec(NAN)));
    long n = 4099;
    float *g = malloc(n * sizeof(float)), *u = malloc(n * sizeof(float)), *o = malloc(n * sizeof(float));
    double *gd = malloc(n * sizeof(double)), *ud = malloc(n * sizeof(double)), *od = malloc(n * sizeof(double));
    sp_rng r;
    sp_rng_seed(&r, 3);
    for (long i = 0; i < n; i++) {
        g[i] = (float)(sp_rng_normal(&r) * 6.0);
        u[i] = (float)sp_rng_normal(&r);
        gd[i] = g[i];
        ud[i] = u[i];
    }
    sp_swiglu_forward_f32(o, g, u, n);
    sp_swiglu_forward_f64(od, gd, ud, n);
    for (long i = 0; i < n; i++)
        ck_assert_msg(fabs(o[i] - od[i]) <= 1e-6 * fmax(1.0, fabs(od[i])), "swiglu[%ld]: %g vs %g", i, o[i], od[i]);
    free(g), free(u), free(o), free(gd), free(ud), free(od);
}
END_TEST

/* The vectorisable erf of the f32 GELU: within 4 ulp (relative) of erf in double below 1, within 2 ulp of 1 (absolute)
 * above; odd; exactly +-1 far out; and the f32 GELUs (erf and tanh forms) within a few ulp of their f64 twins. */
START_TEST(t_erff_vec)
{
    const double ulp = 1.1920929e-7;
    double worst_rel = 0, worst_abs = 0;
    for (double x = 1e-6; x <= 6.0; x *= 1.0001) {
        float xf = (float)x;
        double want = erf((double)xf), got = sp_erff_vec(xf);
        if (xf < 1.0f)
            worst_rel = fmax(worst_rel, fabs(got - want) / want);
        else
            worst_abs = fmax(worst_abs, fabs(got - want));
        ck_assert_float_eq(sp_erff_vec(-xf), -sp_erff_vec(xf));
    }
    ck_assert_msg(worst_rel <= 4 * ulp, "sp_erff_vec: relative error %g below 1", worst_rel);
    ck_assert_msg(worst_abs <= 2 * ulp, "sp_erff_vec: error %g above 1", worst_abs);
    ck_assert_float_eq(sp_erff_vec(0.0f), 0.0f);
    ck_assert_float_eq(sp_erff_vec(100.0f), 1.0f);
    ck_assert_float_eq(sp_erff_vec(-1e30f), -1.0f);
    long n = 4099;
    float *x = malloc(n * sizeof(float)), *o = malloc(n * sizeof(float)), *g = malloc(n * sizeof(float));
    double *xd = malloc(n * sizeof(double)), *od = malloc(n * sizeof(double)), *gd = malloc(n * sizeof(double));
    sp_rng r;
    sp_rng_seed(&r, 4);
    for (long i = 0; i < n; i++)
        xd[i] = x[i] = (float)(sp_rng_normal(&r) * 4.0);
    for (int tanh_form = 0; tanh_form < 2; tanh_form++) {
        memset(g, 0, n * sizeof(float));
        memset(gd, 0, n * sizeof(double));
        double ones[1] = {1.0};
        float onef[1] = {1.0f};
        (tanh_form ? sp_gelu_tanh_forward_f32 : sp_gelu_forward_f32)(o, x, n);
        (tanh_form ? sp_gelu_tanh_forward_f64 : sp_gelu_forward_f64)(od, xd, n);
        for (long i = 0; i < n; i++) {
            ck_assert_msg(fabs(o[i] - od[i]) <= 4 * ulp * fmax(1.0, fabs(od[i])), "gelu %d [%ld]: %g vs %g", tanh_form,
                          i, o[i], od[i]);
            (tanh_form ? sp_gelu_tanh_backward_f32 : sp_gelu_backward_f32)(g + i, onef, x + i, 1);
            (tanh_form ? sp_gelu_tanh_backward_f64 : sp_gelu_backward_f64)(gd + i, ones, xd + i, 1);
            ck_assert_msg(fabs(g[i] - gd[i]) <= 8 * ulp * fmax(1.0, fabs(gd[i])), "gelu' %d [%ld]: %.9g vs %.9g (x %g)",
                          tanh_form, i, g[i], gd[i], xd[i]);
        }
    }
    free(x), free(o), free(g), free(xd), free(od), free(gd);
}
END_TEST

START_TEST(t_rmsnorm)
{
    norm_ctx c = {.N = 3, .C = 7};
    long n = (long)c.N * c.C;
    c.x = rand_vec(n, 1.5);
    c.w = rand_vec(c.C, 1.0);
    c.G = rand_vec(n, 1.0);
    c.out = zeros(n);
    c.rstd = zeros(c.N);
    double *dx = zeros(n), *dw = zeros(c.C);
    rms_loss(&c);
    sp_rmsnorm_backward_f64(dx, dw, c.G, c.x, c.w, c.rstd, c.N, c.C);
    ck_assert_double_le(fd_check(rms_loss, &c, c.x, dx, n), FD_TOL);
    ck_assert_double_le(fd_check(rms_loss, &c, c.w, dw, c.C), FD_TOL);
    /* f32 path agrees with f64 */
    float *xf = to_f32(c.x, n), *wf = to_f32(c.w, c.C), *of = malloc(n * sizeof(float));
    sp_rmsnorm_forward(of, NULL, xf, wf, c.N, c.C, 1e-5f);
    rms_loss(&c);
    ck_assert_double_le(max_diff_fd(of, c.out, n), 1e-5);
    free(xf), free(wf), free(of), free(c.x), free(c.w), free(c.G), free(c.out), free(c.rstd), free(dx), free(dw);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* layernorm */

typedef struct {
    int N, C;
    double *x, *w, *b, *G, *out, *mean, *rstd;
} ln_ctx;

static double ln_loss(void *p)
{
    ln_ctx *c = p;
    sp_layernorm_forward_f64(c->out, c->mean, c->rstd, c->x, c->w, c->b, c->N, c->C, 1e-5f);
    return dot(c->out, c->G, (long)c->N * c->C);
}

START_TEST(t_layernorm)
{
    ln_ctx c = {.N = 4, .C = 6};
    long n = (long)c.N * c.C;
    c.x = rand_vec(n, 2.0);
    c.w = rand_vec(c.C, 1.0);
    c.b = rand_vec(c.C, 1.0);
    c.G = rand_vec(n, 1.0);
    c.out = zeros(n);
    c.mean = zeros(c.N);
    c.rstd = zeros(c.N);
    double *dx = zeros(n), *dw = zeros(c.C), *db = zeros(c.C);
    ln_loss(&c);
    sp_layernorm_backward_f64(dx, dw, db, c.G, c.x, c.w, c.mean, c.rstd, c.N, c.C);
    ck_assert_double_le(fd_check(ln_loss, &c, c.x, dx, n), FD_TOL);
    ck_assert_double_le(fd_check(ln_loss, &c, c.w, dw, c.C), FD_TOL);
    ck_assert_double_le(fd_check(ln_loss, &c, c.b, db, c.C), FD_TOL);
    free(c.x), free(c.w), free(c.b), free(c.G), free(c.out), free(c.mean), free(c.rstd), free(dx), free(dw), free(db);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* linear */

typedef struct {
    int N, I, O;
    double *x, *W, *b, *G, *out;
} lin_ctx;

static double lin_loss(void *p)
{
    lin_ctx *c = p;
    sp_linear_forward_f64(c->out, c->x, c->W, c->b, c->N, c->I, c->O);
    return dot(c->out, c->G, (long)c->N * c->O);
}

static void linear_case(int N)
{
    lin_ctx c = {.N = N, .I = 5, .O = 4};
    c.x = rand_vec((long)N * c.I, 1.0);
    c.W = rand_vec((long)c.O * c.I, 1.0);
    c.b = rand_vec(c.O, 1.0);
    c.G = rand_vec((long)N * c.O, 1.0);
    c.out = zeros((long)N * c.O);
    double *dx = zeros((long)N * c.I), *dW = zeros((long)c.O * c.I), *db = zeros(c.O);
    sp_linear_backward_f64(dx, dW, db, c.G, c.x, c.W, N, c.I, c.O);
    ck_assert_double_le(fd_check(lin_loss, &c, c.x, dx, (long)N * c.I), FD_TOL);
    ck_assert_double_le(fd_check(lin_loss, &c, c.W, dW, (long)c.O * c.I), FD_TOL);
    ck_assert_double_le(fd_check(lin_loss, &c, c.b, db, c.O), FD_TOL);
    free(c.x), free(c.W), free(c.b), free(c.G), free(c.out), free(dx), free(dW), free(db);
}

START_TEST(t_linear)
{
    linear_case(3);
    linear_case(1); /* the matrix-vector path */
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* rope */

typedef struct {
    int B, T, nh, hd;
    float *cos, *sin;
    double *x, *G, *out;
} rope_ctx;

static double rope_loss(void *p)
{
    rope_ctx *c = p;
    sp_rope_forward_f64(c->out, c->x, c->cos, c->sin, c->B, c->T, c->nh, c->hd);
    return dot(c->out, c->G, (long)c->B * c->T * c->nh * c->hd);
}

START_TEST(t_rope)
{
    rope_ctx c = {.B = 2, .T = 3, .nh = 2, .hd = 8};
    sp_config cfg = {.head_dim = 8, .rope_theta = 10000.0};
    sp_rope r;
    ck_assert_int_eq(sp_rope_init(&r, &cfg, NULL), SP_OK);
    c.cos = malloc(c.T * 4 * sizeof(float));
    c.sin = malloc(c.T * 4 * sizeof(float));
    sp_rope_tables(&r, 5, c.T, c.cos, c.sin);
    long n = (long)c.B * c.T * c.nh * c.hd;
    c.x = rand_vec(n, 1.0);
    c.G = rand_vec(n, 1.0);
    c.out = zeros(n);
    double *dx = zeros(n);
    sp_rope_backward_f64(dx, c.G, c.cos, c.sin, c.B, c.T, c.nh, c.hd);
    ck_assert_double_le(fd_check(rope_loss, &c, c.x, dx, n), FD_TOL);
    /* a rotation keeps the norm, and in-place equals out-of-place */
    rope_loss(&c);
    ck_assert_double_eq_tol(dot(c.out, c.out, n), dot(c.x, c.x, n), 1e-6 * dot(c.x, c.x, n)); /* f32 cos/sin */
    double *y = malloc(n * sizeof(double));
    memcpy(y, c.x, n * sizeof(double));
    sp_rope_forward_f64(y, y, c.cos, c.sin, c.B, c.T, c.nh, c.hd);
    for (long i = 0; i < n; i++)
        ck_assert_double_eq(y[i], c.out[i]);
    free(y), free(c.cos), free(c.sin), free(c.x), free(c.G), free(c.out), free(dx);
}
END_TEST

START_TEST(t_rope_llama3_frequencies)
{
    /* llama3 scaling: high frequencies untouched, low ones divided by factor, the band between smooth */
    sp_config cfg = {.head_dim = 64, .rope_theta = 500000.0, .rope_type = SP_ROPE_LLAMA3, .rope_factor = 8.0,
                     .rope_low_freq_factor = 1.0, .rope_high_freq_factor = 4.0, .rope_orig_max_pos = 64};
    sp_config plain = cfg;
    plain.rope_type = SP_ROPE_DEFAULT;
    sp_rope a, b;
    ck_assert_int_eq(sp_rope_init(&a, &cfg, NULL), SP_OK);
    ck_assert_int_eq(sp_rope_init(&b, &plain, NULL), SP_OK);
    int kept = 0, divided = 0, between = 0;
    for (int i = 0; i < 32; i++) {
        double wavelen = 2 * M_PI / b.inv_freq[i];
        if (wavelen < 64 / 4.0) {
            ck_assert_float_eq(a.inv_freq[i], b.inv_freq[i]);
            kept++;
        } else if (wavelen > 64 / 1.0) {
            ck_assert_float_eq_tol(a.inv_freq[i], b.inv_freq[i] / 8.0f, 1e-12);
            divided++;
        } else {
            ck_assert(a.inv_freq[i] < b.inv_freq[i] && a.inv_freq[i] > b.inv_freq[i] / 8.0f);
            between++;
        }
    }
    ck_assert(kept > 0 && divided > 0 && between > 0);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* attention */

typedef struct {
    sp_attn_dims d;
    double *q, *k, *v, *G, *out, *probs;
} att_ctx;

static double att_loss(void *p)
{
    att_ctx *c = p;
    sp_attention_forward_f64(c->out, c->probs, c->q, c->k, c->v, &c->d);
    return dot(c->out, c->G, (long)c->d.B * c->d.T * c->d.nh * c->d.hd);
}

/* GQA (4 query heads on 2 kv heads), a cached prefix (past 2) and a cache wider than used. */
static void attention_case(int past)
{
    att_ctx c = {.d = {.B = 2, .T = 3, .past = past, .nh = 4, .nkv = 2, .hd = 4, .keep_probs = 1}};
    c.d.S = past + c.d.T;
    c.d.kv_cap = c.d.S + 2;
    long nq = (long)c.d.B * c.d.T * c.d.nh * c.d.hd, nk = (long)c.d.B * c.d.kv_cap * c.d.nkv * c.d.hd;
    c.q = rand_vec(nq, 1.5);
    c.k = rand_vec(nk, 1.5);
    c.v = rand_vec(nk, 1.5);
    c.G = rand_vec(nq, 1.0);
    c.out = zeros(nq);
    c.probs = zeros(sp_attention_probs_size(&c.d));
    double *dq = zeros(nq), *dk = zeros(nk), *dv = zeros(nk), *scratch = zeros(sp_attention_scratch_size(&c.d));
    att_loss(&c);
    sp_attention_backward_f64(dq, dk, dv, scratch, c.G, c.probs, c.q, c.k, c.v, &c.d);
    ck_assert_double_le(fd_check(att_loss, &c, c.q, dq, nq), FD_TOL);
    ck_assert_double_le(fd_check(att_loss, &c, c.k, dk, nk), FD_TOL);
    ck_assert_double_le(fd_check(att_loss, &c, c.v, dv, nk), FD_TOL);
    /* causality: the first query of batch 0 sees keys 0..past only */
    for (int s = past + 1; s < c.d.S; s++)
        ck_assert_double_eq(c.probs[s], 0.0);
    free(c.q), free(c.k), free(c.v), free(c.G), free(c.out), free(c.probs), free(dq), free(dk), free(dv), free(scratch);
}

START_TEST(t_attention) { attention_case(0); attention_case(2); }
END_TEST

/* ALiBi: the backward (the bias is a constant of the scores) against finite differences with a cached prefix,
 * and the forward against the scores written out: head h's score of query i for key j is
 * q_i . k_j / sqrt(hd) + slope_h * (j - i) for j <= i. */
START_TEST(t_attention_alibi)
{
    float slopes[3] = {0.5f, 0.125f, 0.03125f};
    att_ctx c = {.d = {.B = 2, .T = 3, .past = 2, .nh = 3, .nkv = 3, .hd = 4, .keep_probs = 1, .alibi = slopes}};
    c.d.S = c.d.past + c.d.T;
    c.d.kv_cap = c.d.S;
    long nq = (long)c.d.B * c.d.T * c.d.nh * c.d.hd, nk = (long)c.d.B * c.d.kv_cap * c.d.nkv * c.d.hd;
    c.q = rand_vec(nq, 1.5);
    c.k = rand_vec(nk, 1.5);
    c.v = rand_vec(nk, 1.5);
    c.G = rand_vec(nq, 1.0);
    c.out = zeros(nq);
    c.probs = zeros(sp_attention_probs_size(&c.d));
    double *dq = zeros(nq), *dk = zeros(nk), *dv = zeros(nk), *scratch = zeros(sp_attention_scratch_size(&c.d));
    att_loss(&c);
    sp_attention_backward_f64(dq, dk, dv, scratch, c.G, c.probs, c.q, c.k, c.v, &c.d);
    ck_assert_double_le(fd_check(att_loss, &c, c.q, dq, nq), FD_TOL);
    ck_assert_double_le(fd_check(att_loss, &c, c.k, dk, nk), FD_TOL);
    ck_assert_double_le(fd_check(att_loss, &c, c.v, dv, nk), FD_TOL);
    int hd = c.d.hd, nh = c.d.nh, S = c.d.S, T = c.d.T;
    for (int b = 0; b < c.d.B; b++)
        for (int h = 0; h < nh; h++)
            for (int t = 0; t < T; t++) {
                int i = c.d.past + t;
                double sc[8], mx = -1e300, sum = 0;
                for (int j = 0; j <= i; j++) {
                    double d = 0;
                    for (int e = 0; e < hd; e++)
                        d += c.q[((b * T + t) * nh + h) * hd + e] * c.k[((b * S + j) * nh + h) * hd + e];
                    sc[j] = d / 2.0 + slopes[h] * (double)(j - i);
                    mx = fmax(mx, sc[j]);
                }
                for (int j = 0; j <= i; j++)
                    sum += exp(sc[j] - mx);
                const double *p = c.probs + (((long)b * nh + h) * T + t) * S;
                for (int j = 0; j < S; j++)
                    ck_assert_double_eq_tol(p[j], j <= i ? exp(sc[j] - mx) / sum : 0.0, 1e-12);
            }
    free(c.q), free(c.k), free(c.v), free(c.G), free(c.out), free(c.probs), free(dq), free(dk), free(dv), free(scratch);
}
END_TEST

/* The attention in units of tq query rows (sp_attention_forward_rows, what a prefill splits over the pool) equals
 * the whole forward: GQA, ALiBi, a cached prefix, 37 rows in units of 16 (the last one shorter), the units run
 * in three ranges as three threads would take them; with keep_probs every unit's probs in place, without it
 * each range's [tq, S] scratch of its own. Within 1e-12 (OpenBLAS's kernels may round an element by where
 * it lies in a call). */
START_TEST(t_attention_rows)
{
    float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
    for (int keep = 0; keep <= 1; keep++)
        for (int al = 0; al <= 1; al++) {
            sp_attn_dims d = {.B = 2, .T = 37, .past = 5, .nh = 4, .nkv = 2, .hd = 8, .keep_probs = keep,
                              .alibi = al ? slopes : NULL};
            d.S = d.past + d.T;
            d.kv_cap = d.S + 3;
            long nq = (long)d.B * d.T * d.nh * d.hd, nk = (long)d.B * d.kv_cap * d.nkv * d.hd;
            int tq = 16, nc = (d.T + tq - 1) / tq;
            long units = (long)d.B * d.nh * nc, np = keep ? sp_attention_probs_size(&d) : 3L * tq * d.S;
            double *q = rand_vec(nq, 1.5), *k = rand_vec(nk, 1.5), *v = rand_vec(nk, 1.5);
            double *o0 = zeros(nq), *o1 = zeros(nq), *p0 = zeros(sp_attention_probs_size(&d)), *p1 = zeros(np);
            sp_attention_forward_f64(o0, p0, q, k, v, &d);
            long cut[4] = {0, units / 3, 2 * units / 3, units};
            for (int i = 0; i < 3; i++)
                sp_attention_forward_rows_f64(o1, p1 + (keep ? 0 : (long)i * tq * d.S), q, k, v, &d, tq, cut[i],
                                              cut[i + 1]);
            for (long i = 0; i < nq; i++)
                ck_assert_msg(fabs(o1[i] - o0[i]) <= 1e-12 * (1 + fabs(o0[i])), "keep %d alibi %d: out[%ld] %g vs %g",
                              keep, al, i, o1[i], o0[i]);
            for (long i = 0; keep && i < np; i++)
                ck_assert_msg(fabs(p1[i] - p0[i]) <= 1e-12, "alibi %d: probs[%ld] %g vs %g", al, i, p1[i], p0[i]);
            free(q), free(k), free(v), free(o0), free(o1), free(p0), free(p1);
        }
}
END_TEST

/* The attention's softmax of 21 rows (two groups of 8 and 5 more) after a cached prefix of 3: every row has the
 * bits it gets alone, and is a softmax of its visible keys (a double reference) with its masked tail 0. */
START_TEST(t_masked_softmax_rows_as_alone)
{
    int T = 21, past = 3, S = past + T + 2;
    float *P = malloc((size_t)T * S * sizeof(float)), *one = malloc((size_t)S * sizeof(float));
    double *x = rand_vec((long)T * S, 4.0);
    for (long i = 0; i < (long)T * S; i++)
        P[i] = (float)x[i];
    sp_masked_softmax(P, T, S, past);
    for (int t = 0; t < T; t++) {
        int n = past + t + 1;
        double mx = -INFINITY, sum = 0;
        for (int s = 0; s < S; s++)
            one[s] = (float)x[(long)t * S + s];
        sp_masked_softmax(one, 1, S, past + t);
        ck_assert_msg(!memcmp(one, P + (long)t * S, (size_t)S * sizeof(float)), "row %d differs from the row alone", t);
        for (int s = 0; s < n; s++)
            mx = fmax(mx, (float)x[(long)t * S + s]);
        for (int s = 0; s < n; s++)
            sum += exp((float)x[(long)t * S + s] - mx);
        for (int s = 0; s < S; s++) {
            double want = s < n ? exp((float)x[(long)t * S + s] - mx) / sum : 0;
            ck_assert_msg(fabs(P[(long)t * S + s] - want) <= 1e-6, "row %d key %d: %g vs %g", t, s, P[(long)t * S + s],
                          want);
        }
    }
    free(P), free(one), free(x);
}
END_TEST

/* BLOOM's slopes: powers of two of heads get 2^(-8i/n); other counts add every other slope of 2n heads. */
START_TEST(t_alibi_slopes)
{
    float s4[4], s6[6], s8[8];
    sp_alibi_slopes(s4, 4);
    sp_alibi_slopes(s6, 6);
    sp_alibi_slopes(s8, 8);
    const float w4[4] = {0.25f, 0.0625f, 0.015625f, 0.00390625f};
    for (int i = 0; i < 4; i++) {
        ck_assert_float_eq(s4[i], w4[i]);
        ck_assert_float_eq(s6[i], w4[i]);
    }
    ck_assert_float_eq(s6[4], 0.5f);   /* 2^(-4/4 * 1) */
    ck_assert_float_eq(s6[5], 0.125f); /* 2^(-4/4 * 3) */
    for (int i = 0; i < 8; i++)
        ck_assert_double_eq_tol(s8[i], pow(2.0, -(i + 1.0)), 1e-9);
}
END_TEST

/* MoE routing: the chosen experts are the top-k of the softmax, in order, their weights the renormalised
 * probabilities; the backward (choice fixed) against finite differences. */
typedef struct {
    int N, E, K;
    double *logits, *w, *G;
    int32_t *idx;
} route_ctx;

static double route_loss(void *p)
{
    route_ctx *c = p;
    sp_moe_route_forward_f64(c->w, c->idx, c->logits, c->N, c->E, c->K);
    return dot(c->w, c->G, (long)c->N * c->K);
}

START_TEST(t_moe_route)
{
    route_ctx c = {.N = 4, .E = 6, .K = 3};
    long nl = (long)c.N * c.E, nw = (long)c.N * c.K;
    c.logits = rand_vec(nl, 3.0);
    c.G = rand_vec(nw, 1.0);
    c.w = zeros(nw);
    c.idx = calloc((size_t)nw, sizeof(int32_t));
    route_loss(&c);
    for (int n = 0; n < c.N; n++) {
        const double *x = c.logits + n * c.E;
        double wsum = 0, z = 0;
        for (int k = 0; k < c.K; k++)
            z += exp(x[c.idx[n * c.K + k]]);
        for (int k = 0; k < c.K; k++) {
            int e = c.idx[n * c.K + k];
            if (k) /* decreasing */
                ck_assert(x[e] < x[c.idx[n * c.K + k - 1]]);
            int above = 0; /* exactly k logits are larger */
            for (int j = 0; j < c.E; j++)
                above += x[j] > x[e];
            ck_assert_int_eq(above, k);
            ck_assert_double_eq_tol(c.w[n * c.K + k], exp(x[e]) / z, 1e-12);
            wsum += c.w[n * c.K + k];
        }
        ck_assert_double_eq_tol(wsum, 1.0, 1e-12);
    }
    double *dl = zeros(nl);
    sp_moe_route_backward_f64(dl, c.G, c.w, c.idx, c.N, c.E, c.K);
    ck_assert_double_le(fd_check(route_loss, &c, c.logits, dl, nl), FD_TOL);
    /* f32 agrees */
    float *lf = to_f32(c.logits, nl), *wf = malloc((size_t)nw * sizeof(float));
    int32_t *idxf = malloc((size_t)nw * sizeof(int32_t));
    sp_moe_route_forward_f32(wf, idxf, lf, c.N, c.E, c.K);
    ck_assert_int_eq(memcmp(idxf, c.idx, (size_t)nw * sizeof(int32_t)), 0);
    ck_assert_double_le(max_diff_fd(wf, c.w, nw), 1e-6);
    free(lf), free(wf), free(idxf), free(dl);
    free(c.logits), free(c.G), free(c.w), free(c.idx);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* elementwise activations, softmax, cross-entropy */

typedef struct {
    long n;
    int which;
    double *a, *b, *G, *out;
} act_ctx;

static double act_loss(void *p)
{
    act_ctx *c = p;
    if (c->which == 0)
        sp_swiglu_forward_f64(c->out, c->a, c->b, c->n);
    else if (c->which == 1)
        sp_gelu_forward_f64(c->out, c->a, c->n);
    else if (c->which == 2)
        sp_gelu_tanh_forward_f64(c->out, c->a, c->n);
    else
        sp_softmax_forward_f64(c->out, c->a, 3, (int)(c->n / 3));
    return dot(c->out, c->G, c->n);
}

START_TEST(t_activations)
{
    for (int which = 0; which < 4; which++) {
        act_ctx c = {.n = 12, .which = which};
        c.a = rand_vec(c.n, 3.0);
        c.b = rand_vec(c.n, 2.0);
        c.G = rand_vec(c.n, 1.0);
        c.out = zeros(c.n);
        double *da = zeros(c.n), *db = zeros(c.n);
        act_loss(&c);
        if (which == 0)
            sp_swiglu_backward_f64(da, db, c.G, c.a, c.b, c.n);
        else if (which == 1)
            sp_gelu_backward_f64(da, c.G, c.a, c.n);
        else if (which == 2)
            sp_gelu_tanh_backward_f64(da, c.G, c.a, c.n);
        else
            sp_softmax_backward_f64(da, c.G, c.out, 3, 4);
        ck_assert_msg(fd_check(act_loss, &c, c.a, da, c.n) <= FD_TOL, "activation %d", which);
        if (which == 0)
            ck_assert_double_le(fd_check(act_loss, &c, c.b, db, c.n), FD_TOL);
        free(c.a), free(c.b), free(c.G), free(c.out), free(da), free(db);
    }
}
END_TEST

START_TEST(t_gelu_values)
{
    /* known values: gelu(1) = 0.8413447460685429, gelu(-1) = -0.15865525393145707 */
    double x[2] = {1.0, -1.0}, y[2];
    sp_gelu_forward_f64(y, x, 2);
    ck_assert_double_eq_tol(y[0], 0.8413447460685429, 1e-12);
    ck_assert_double_eq_tol(y[1], -0.15865525393145707, 1e-12);
}
END_TEST

typedef struct {
    int N, V;
    int32_t *t;
    double *logits, *dl, *losses;
} ce_ctx;

static double ce_loss(void *p)
{
    ce_ctx *c = p;
    sp_crossentropy_forward_f64(c->losses, c->logits, c->t, c->N, c->V);
    return dot(c->losses, c->dl, c->N);
}

START_TEST(t_crossentropy)
{
    int32_t targets[4] = {2, 0, -1, 4}; /* -1 is ignored */
    ce_ctx c = {.N = 4, .V = 5, .t = targets};
    c.logits = rand_vec(20, 3.0);
    c.dl = rand_vec(4, 1.0);
    c.losses = zeros(4);
    double *dlogits = zeros(20);
    ce_loss(&c);
    ck_assert_double_eq(c.losses[2], 0.0);
    /* loss of a row = -log softmax[target] */
    double mx = -1e300, sum = 0;
    for (int i = 0; i < 5; i++)
        mx = fmax(mx, c.logits[i]);
    for (int i = 0; i < 5; i++)
        sum += exp(c.logits[i] - mx);
    ck_assert_double_eq_tol(c.losses[0], -(c.logits[2] - mx - log(sum)), 1e-12);
    sp_crossentropy_backward_f64(dlogits, c.dl, c.logits, c.t, c.N, c.V);
    ck_assert_double_le(fd_check(ce_loss, &c, c.logits, dlogits, 20), FD_TOL);
    free(c.logits), free(c.dl), free(c.losses), free(dlogits);
}
END_TEST

START_TEST(t_embedding)
{
    int32_t ids[5] = {3, 0, 3, 1, 2};
    double *table = rand_vec(4 * 3, 1.0), *G = rand_vec(5 * 3, 1.0), out[15], *dt = zeros(12);
    sp_embedding_forward_f64(out, ids, table, 5, 3);
    for (int i = 0; i < 5; i++)
        for (int c = 0; c < 3; c++)
            ck_assert_double_eq(out[i * 3 + c], table[ids[i] * 3 + c]);
    sp_embedding_backward_f64(dt, G, ids, 5, 3);
    for (int c = 0; c < 3; c++) /* row 3 appears twice: its gradient is the sum */
        ck_assert_double_eq_tol(dt[3 * 3 + c], G[0 * 3 + c] + G[2 * 3 + c], 1e-15);
    free(table), free(G), free(dt);
}
END_TEST

static Suite *ops_suite(void)
{
    Suite *s = suite_create("ops");
    TCase *tc = tcase_create("backward_vs_finite_differences");
    tcase_add_test(tc, t_embedding);
    tcase_add_test(tc, t_rmsnorm);
    tcase_add_test(tc, t_layernorm);
    tcase_add_test(tc, t_linear);
    tcase_add_test(tc, t_rope);
    tcase_add_test(tc, t_rope_llama3_frequencies);
    tcase_add_test(tc, t_attention);
    tcase_add_test(tc, t_attention_alibi);
    tcase_add_test(tc, t_attention_rows);
    tcase_add_test(tc, t_masked_softmax_rows_as_alone);
    tcase_add_test(tc, t_alibi_slopes);
    tcase_add_test(tc, t_moe_route);
    tcase_add_test(tc, t_activations);
    tcase_add_test(tc, t_gelu_values);
    tcase_add_test(tc, t_crossentropy);
    tcase_add_test(tc, t_expf_vec);
    tcase_add_test(tc, t_erff_vec);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    sp_rng_seed(&rng, 1234);
    return sp_test_run(ops_suite());
}
