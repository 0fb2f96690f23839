/* test_sampler.c - token selection: greedy, temperature, top-k, top-p, repetition penalty, seeds. The
 * sampled frequencies are compared with the softmax computed here in double precision. */
#include <math.h>
#include <string.h>

#include "sampler.h"
#include "testutil.h"

#define V 6

static const float base[V] = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, 3.0f};

static int next(sp_sample_opts *o, sp_sampler2 *s)
{
    float l[V];
    memcpy(l, base, sizeof l);
    return sp_sampler2_next(s, l, NULL, 0);
}

/* Frequencies of n draws. */
static void histogram(sp_sample_opts *o, int n, double *freq)
{
    sp_sampler2 s;
    ck_assert_int_eq(sp_sampler2_init(&s, o, V), 0);
    memset(freq, 0, V * sizeof *freq);
    for (int i = 0; i < n; i++)
        freq[next(o, &s)] += 1.0 / n;
    sp_sampler2_free(&s);
}

START_TEST(t_greedy_and_degenerate_filters)
{
    sp_sample_opts o;
    sp_sample_opts_default(&o);
    sp_sampler2 s;
    ck_assert_int_eq(sp_sampler2_init(&s, &o, V), 0);
    ck_assert_int_eq(next(&o, &s), 5); /* temperature 0: the argmax */
    sp_sampler2_free(&s);
    o.temperature = 1.0f;
    o.top_k = 1; /* top-1 sampling is greedy */
    double f[V];
    histogram(&o, 500, f);
    ck_assert_double_eq_tol(f[5], 1.0, 1e-9);
    o.top_k = 0;
    o.top_p = 0.01f; /* a tiny nucleus holds only the best token */
    histogram(&o, 500, f);
    ck_assert_double_eq_tol(f[5], 1.0, 1e-9);
}
END_TEST

START_TEST(t_frequencies_match_softmax)
{
    sp_sample_opts o;
    sp_sample_opts_default(&o);
    o.temperature = 0.7f;
    o.seed = 11;
    double f[V], p[V], sum = 0;
    for (int i = 0; i < V; i++)
        sum += p[i] = exp(base[i] / 0.7);
    histogram(&o, 200000, f);
    for (int i = 0; i < V; i++)
        ck_assert_msg(fabs(f[i] - p[i] / sum) < 0.006, "token %d: %f vs %f", i, f[i], p[i] / sum);
    /* top-k 2: only the two best, renormalised */
    o.top_k = 2;
    histogram(&o, 100000, f);
    double p5 = p[5] / (p[5] + p[0]);
    ck_assert(fabs(f[5] - p5) < 0.01 && fabs(f[0] - (1 - p5)) < 0.01);
    for (int i = 1; i < 5; i++)
        ck_assert_double_eq(f[i], 0.0);
    /* top-p: the smallest prefix reaching p; here tokens 5 and 0 hold < 0.95, so token 1 joins */
    o.top_k = 0;
    o.top_p = 0.95f;
    double cum = (p[5] + p[0]) / sum;
    ck_assert(cum < 0.95 && cum + p[1] / sum >= 0.95);
    histogram(&o, 100000, f);
    ck_assert(f[1] > 0.01 && f[2] == 0 && f[3] == 0 && f[4] == 0);
}
END_TEST

START_TEST(t_seed_reproducible)
{
    sp_sample_opts o;
    sp_sample_opts_default(&o);
    o.temperature = 1.0f;
    o.seed = 3;
    sp_sampler2 a, b, c;
    sp_sampler2_init(&a, &o, V);
    sp_sampler2_init(&b, &o, V);
    o.seed = 4;
    sp_sampler2_init(&c, &o, V);
    int same = 1, differ = 0;
    for (int i = 0; i < 50; i++) {
        int x = next(&o, &a), y = next(&o, &b), z = next(&o, &c);
        same &= x == y;
        differ |= x != z;
    }
    ck_assert(same && differ);
    sp_sampler2_free(&a), sp_sampler2_free(&b), sp_sampler2_free(&c);
}
END_TEST

START_TEST(t_repetition_penalty)
{
    float l[V];
    memcpy(l, base, sizeof l);
    int32_t ctx[4] = {5, 4, 5, 99}; /* 5 twice (penalised once), 4 negative, 99 out of range (ignored) */
    sp_repetition_penalty(l, V, ctx, 4, 2.0f);
    ck_assert_float_eq(l[5], 1.5f);  /* positive: divided */
    ck_assert_float_eq(l[4], -2.0f); /* negative: multiplied */
    ck_assert_float_eq(l[0], 2.0f);  /* unseen: unchanged */
    /* greedy now prefers token 0 over the penalised 5 */
    sp_sample_opts o;
    sp_sample_opts_default(&o);
    o.repetition_penalty = 2.0f;
    sp_sampler2 s;
    sp_sampler2_init(&s, &o, V);
    memcpy(l, base, sizeof l);
    ck_assert_int_eq(sp_sampler2_next(&s, l, ctx, 1), 0);
    sp_sampler2_free(&s);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sampler");
    TCase *tc = tcase_create("sampler");
    tcase_add_test(tc, t_greedy_and_degenerate_filters);
    tcase_add_test(tc, t_frequencies_match_softmax);
    tcase_add_test(tc, t_seed_reproducible);
    tcase_add_test(tc, t_repetition_penalty);
    suite_add_tcase(s, tc);
    return sp_test_run(s);
}
