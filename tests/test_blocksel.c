/* test_blocksel.c - Petals' block selection and rebalancing (server/blocksel.h): hand cases (an empty swarm,
 * servers started one after another filling the model, a departed server's gap, the least-served window
 * under redundancy, should_move for a balanced swarm, for a gap this server would close, for a move that
 * would open a gap, by balance quality, always above 1), and properties over random swarms against
 * references written here from Petals' block_selection.py: per-block sums in id order whatever the array
 * order, the chosen window lexicographically smallest by brute force, and should_move's answer equal to a
 * transcription of should_choose_other_blocks driven by the same rng, never moving when the simulated
 * minimum would fall. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blocksel.h"
#include "testutil.h"

#define EPS 1e-3
#define MAXN 16
#define MAXL 16

static sp_blk_span sp(int start, int end, double tp, const char *id)
{
    return (sp_blk_span){.start = start, .end = end, .throughput = tp, .id = id};
}

START_TEST(t_empty_swarm)
{
    ck_assert_int_eq(sp_blocksel_choose(NULL, 0, 12, 4), 0);
    ck_assert_int_eq(sp_blocksel_choose(NULL, 0, 12, 12), 0);
    ck_assert_int_eq(sp_blocksel_choose(NULL, 0, 12, 20), 0);
    double tp[3] = {1, 1, 1};
    sp_blocksel_throughputs(NULL, 0, 3, tp);
    ck_assert(tp[0] == 0 && tp[1] == 0 && tp[2] == 0);
}
END_TEST

START_TEST(t_fill_one_after_another)
{
    static const char *ids[] = {"d", "a", "c", "b"};
    sp_blk_span s[4];
    for (int i = 0; i < 4; i++) { /* four servers of 3 blocks fill 12 blocks without overlap */
        int start = sp_blocksel_choose(s, i, 12, 3);
        ck_assert_int_eq(start, 3 * i);
        s[i] = sp(start, start + 3, 1 + i, ids[i]);
    }
    double tp[12];
    sp_blocksel_throughputs(s, 4, 12, tp);
    for (int b = 0; b < 12; b++)
        ck_assert_double_eq(tp[b], 1 + b / 3);
    /* the weakest window now: the first server's */
    ck_assert_int_eq(sp_blocksel_choose(s, 4, 12, 3), 0);
}
END_TEST

START_TEST(t_gap_of_departed)
{
    sp_blk_span s[] = {sp(0, 4, 5, "a"), sp(8, 12, 5, "c")}; /* "b" at [4, 8) left */
    ck_assert_int_eq(sp_blocksel_choose(s, 2, 12, 4), 4);
    ck_assert_int_eq(sp_blocksel_choose(s, 2, 12, 2), 4); /* ties inside the gap: the smallest start */
    ck_assert_int_eq(sp_blocksel_choose(s, 2, 12, 6), 2); /* [2,8), [3,9), [4,10): {0,0,0,0,5,5}: the smallest start */
}
END_TEST

START_TEST(t_least_served_window)
{
    /* 8 blocks, every block held; block 5 the weakest, then the tie on the bottleneck is broken by the
     * second smallest value */
    sp_blk_span s[] = {sp(0, 8, 2, "a"), sp(0, 4, 3, "b"), sp(6, 8, 1, "c"), sp(4, 5, 0.5, "d")};
    double tp[8];
    sp_blocksel_throughputs(s, 4, 8, tp);
    double want[8] = {5, 5, 5, 5, 2.5, 2, 3, 3};
    for (int b = 0; b < 8; b++)
        ck_assert_double_eq(tp[b], want[b]);
    ck_assert_int_eq(sp_blocksel_choose(s, 4, 8, 1), 5);
    ck_assert_int_eq(sp_blocksel_choose(s, 4, 8, 2), 4); /* {2, 2.5} < {2, 3} */
    ck_assert_int_eq(sp_blocksel_choose(s, 4, 8, 3), 4);
    ck_assert_int_eq(sp_blocksel_best_start(tp, 8, 0), 0);
}
END_TEST

START_TEST(t_should_move_cases)
{
    sp_rng r;
    sp_rng_seed(&r, 5);
    /* balanced: two copies of each half */
    sp_blk_span bal[] = {sp(0, 4, 1, "a"), sp(4, 8, 1, "b"), sp(0, 4, 1, "c"), sp(4, 8, 1, "d")};
    for (int me = 0; me < 4; me++)
        ck_assert_int_eq(sp_blocksel_should_move(bal, 4, me, 8, 0.75, &r), 0);
    /* "b" and "d" left [4, 8) empty: either of the others moving closes the gap */
    sp_blk_span gap[] = {sp(0, 4, 1, "a"), sp(0, 4, 1, "c")};
    ck_assert_int_eq(sp_blocksel_should_move(gap, 2, 1, 8, 0.75, &r), 1);
    ck_assert_int_eq(sp_blocksel_should_move(gap, 2, 0, 8, 0.75, &r), 1);
    ck_assert(gap[1].start == 0 && gap[1].end == 4); /* s is not modified */
    /* "d" left, but "b" still holds [4, 8): nothing to gain */
    ck_assert_int_eq(sp_blocksel_should_move(bal, 3, 2, 8, 0.75, &r), 0);
    /* "b" alone on [4, 8): moving would open a gap */
    ck_assert_int_eq(sp_blocksel_should_move(bal, 2, 1, 8, 0.75, &r), 0);
    ck_assert_int_eq(sp_blocksel_should_move(bal, 2, 0, 8, 0.75, &r), 0);
    /* a small gain: min 3 -> 3.2 is quality 0.9375, enough only for a demanding balance_quality */
    sp_blk_span q[] = {sp(0, 1, 3, "a"), sp(1, 2, 0.5, "b"), sp(1, 2, 3.2, "c")};
    ck_assert_int_eq(sp_blocksel_should_move(q, 3, 1, 2, 0.75, &r), 0);
    ck_assert_int_eq(sp_blocksel_should_move(q, 3, 1, 2, 0.95, &r), 1);
    ck_assert_int_eq(sp_blocksel_should_move(q, 3, 0, 2, 0.95, &r), 0); /* a is where it is best */
    /* a quality above 1 always moves */
    ck_assert_int_eq(sp_blocksel_should_move(bal, 4, 0, 8, 1.01, &r), 1);
    ck_assert_int_eq(sp_blocksel_should_move(bal, 2, 1, 8, 2, &r), 1);
    /* bad me */
    ck_assert_int_eq(sp_blocksel_should_move(bal, 4, 4, 8, 0.75, &r), 0);
    ck_assert_int_eq(sp_blocksel_should_move(bal, 4, -1, 8, 0.75, &r), 0);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* references, from Petals' server/block_selection.py */

static void ref_throughputs(const sp_blk_span *s, int n, int L, double *tp)
{
    int o[MAXN];
    for (int i = 0; i < n; i++) { /* insertion sort by id, stable */
        int j = i;
        while (j > 0 && strcmp(s[o[j - 1]].id, s[i].id) > 0) {
            o[j] = o[j - 1];
            j--;
        }
        o[j] = i;
    }
    for (int b = 0; b < L; b++)
        tp[b] = 0;
    for (int k = 0; k < n; k++)
        for (int b = s[o[k]].start; b < s[o[k]].end; b++)
            tp[b] += s[o[k]].throughput;
}

static void sorted_window(const double *tp, int i, int k, double *out)
{
    for (int a = 0; a < k; a++) {
        int j = a;
        while (j > 0 && out[j - 1] > tp[i + a]) {
            out[j] = out[j - 1];
            j--;
        }
        out[j] = tp[i + a];
    }
}

/* < 0, 0, > 0 as the sorted windows at i and j compare */
static int cmp_windows(const double *tp, int i, int j, int k)
{
    double a[MAXL], b[MAXL];
    sorted_window(tp, i, k, a);
    sorted_window(tp, j, k, b);
    for (int t = 0; t < k; t++)
        if (a[t] != b[t])
            return a[t] < b[t] ? -1 : 1;
    return 0;
}

/* min((sorted(tp[i:i+k]), i) for i in range(L - k + 1))[-1] */
static int ref_best_start(const double *tp, int L, int k)
{
    int best = 0;
    for (int i = 1; i + k <= L; i++)
        if (cmp_windows(tp, i, best, k) < 0)
            best = i;
    return best;
}

static double min_tp(const double *tp, int L)
{
    double m = tp[0];
    for (int b = 1; b < L; b++)
        m = tp[b] < m ? tp[b] : m;
    return m;
}

static void sub(double *tp, int a, int b, double v)
{
    for (int i = a; i < b; i++)
        tp[i] += v;
}

/* should_choose_other_blocks; *initial, *after: the minima it compares (after = -1 when it stopped before
 * simulating). The shuffle is numpy's Fisher-Yates, drawn from rng the way blocksel.c draws it. */
static int ref_should_move(const sp_blk_span *s0, int n, int me, int L, double quality, sp_rng *rng, double *initial,
                           double *after)
{
    sp_blk_span s[MAXN];
    double tp[MAXL];
    memcpy(s, s0, (size_t)n * sizeof *s);
    *after = -1;
    ref_throughputs(s, n, L, tp);
    *initial = min_tp(tp, L);
    sp_blk_span *m = &s[me];
    int len = m->end - m->start;
    sub(tp, m->start, m->end, -m->throughput * (1 + EPS));
    if (*initial > EPS && min_tp(tp, L) <= 0)
        return 0;
    int ns = ref_best_start(tp, L, len);
    if (ns == m->start)
        return 0;
    sub(tp, m->start, m->end, m->throughput * EPS);
    m->start = ns, m->end = ns + len;
    sub(tp, m->start, m->end, m->throughput);
    for (int moved = 1, round = 0; moved && round < 1000; round++) {
        int order[MAXN];
        for (int i = 0; i < n; i++)
            order[i] = i;
        for (int i = n - 1; i > 0; i--) {
            int j = (int)(sp_rng_u32(rng) % (uint32_t)(i + 1)), t = order[i];
            order[i] = order[j], order[j] = t;
        }
        moved = 0;
        for (int q = 0; q < n; q++) {
            sp_blk_span *x = &s[order[q]];
            int xl = x->end - x->start;
            sub(tp, x->start, x->end, -x->throughput * (1 + EPS));
            int xs = ref_best_start(tp, L, xl);
            sub(tp, x->start, x->end, x->throughput * EPS);
            if (xs != x->start) {
                x->start = xs, x->end = xs + xl;
                moved = 1;
            }
            sub(tp, x->start, x->end, x->throughput);
        }
    }
    *after = min_tp(tp, L);
    if (*after < *initial || *after < EPS)
        return 0;
    return *initial / *after < quality - EPS;
}

typedef struct swarm {
    int n, L;
    sp_blk_span s[MAXN];
    char ids[MAXN][16];
} swarm;

static int pick(sp_rng *r, int n) { return (int)(sp_rng_u32(r) % (uint32_t)n); }

static void random_swarm(swarm *w, sp_rng *r)
{
    static const double levels[] = {1, 2, 3, 0.5, 5};
    w->L = 1 + pick(r, MAXL);
    w->n = pick(r, 13);
    int discrete = pick(r, 2);
    for (int i = 0; i < w->n; i++) {
        snprintf(w->ids[i], sizeof w->ids[i], "peer%08x", sp_rng_u32(r));
        int a = pick(r, w->L), len = 1 + pick(r, pick(r, 3) ? (w->L - a < 4 ? w->L - a : 4) : w->L - a);
        double tp = discrete ? levels[pick(r, 5)] : 0.1 + 10 * sp_rng_f32(r);
        w->s[i] = sp(a, a + len, tp, w->ids[i]);
    }
}

START_TEST(t_throughputs_in_id_order)
{
    sp_rng r;
    sp_rng_seed(&r, 11);
    for (int it = 0; it < 3000; it++) {
        swarm w;
        random_swarm(&w, &r);
        double a[MAXL], b[MAXL], c[MAXL];
        sp_blocksel_throughputs(w.s, w.n, w.L, a);
        ref_throughputs(w.s, w.n, w.L, b);
        for (int i = w.n - 1; i > 0; i--) { /* another view's order: the same floats, bit for bit */
            int j = pick(&r, i + 1);
            sp_blk_span t = w.s[i];
            w.s[i] = w.s[j], w.s[j] = t;
        }
        sp_blocksel_throughputs(w.s, w.n, w.L, c);
        ck_assert(!memcmp(a, b, (size_t)w.L * sizeof *a));
        ck_assert(!memcmp(a, c, (size_t)w.L * sizeof *a));
    }
}
END_TEST

START_TEST(t_choose_is_lexicographic_min)
{
    sp_rng r;
    sp_rng_seed(&r, 12);
    for (int it = 0; it < 5000; it++) {
        swarm w;
        random_swarm(&w, &r);
        int k = 1 + pick(&r, w.L);
        double tp[MAXL];
        sp_blocksel_throughputs(w.s, w.n, w.L, tp);
        int got = sp_blocksel_choose(w.s, w.n, w.L, k);
        ck_assert_int_eq(got, ref_best_start(tp, w.L, k));
        for (int i = 0; i + k <= w.L; i++) { /* brute force: no window is smaller, none equal before it */
            int c = cmp_windows(tp, got, i, k);
            ck_assert_msg(c < 0 || (c == 0 && got <= i), "case %d: window %d beats the chosen %d", it, i, got);
        }
    }
}
END_TEST

START_TEST(t_should_move_matches_petals)
{
    static const double qualities[] = {0.5, 0.75, 0.9, 1.0};
    sp_rng r;
    sp_rng_seed(&r, 13);
    int moves = 0, stays = 0;
    for (int it = 0; it < 4000; it++) {
        swarm w;
        random_swarm(&w, &r);
        if (w.n == 0)
            continue;
        int me = pick(&r, w.n);
        double q = qualities[pick(&r, 4)], initial, after;
        sp_rng a, b;
        sp_rng_seed(&a, (uint64_t)it + 1);
        b = a;
        int got = sp_blocksel_should_move(w.s, w.n, me, w.L, q, &a);
        int want = ref_should_move(w.s, w.n, me, w.L, q, &b, &initial, &after);
        ck_assert_msg(got == want, "case %d: should_move %d, Petals %d", it, got, want);
        if (got) { /* never a move that lowers the swarm's minimum */
            ck_assert(after >= initial && after >= EPS);
            moves++;
        } else {
            stays++;
        }
    }
    ck_assert_int_gt(moves, 200);
    ck_assert_int_gt(stays, 200);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("blocksel");
    TCase *tc = tcase_create("blocksel");
    tcase_add_test(tc, t_empty_swarm);
    tcase_add_test(tc, t_fill_one_after_another);
    tcase_add_test(tc, t_gap_of_departed);
    tcase_add_test(tc, t_least_served_window);
    tcase_add_test(tc, t_should_move_cases);
    tcase_add_test(tc, t_throughputs_in_id_order);
    tcase_add_test(tc, t_choose_is_lexicographic_min);
    tcase_add_test(tc, t_should_move_matches_petals);
    suite_add_tcase(s, tc);
    return sp_test_run(s);
}
