/* blocksel.c - Petals' block selection: choose the weakest window, and the rebalancing simulation. */
#include "blocksel.h"

#include <stdlib.h>
#include <string.h>

#define EPS 1e-3
#define MAX_ROUNDS 1000 /* the simulation converges in a few; a bound, not a tuning */

static __thread const sp_blk_span *g_sort; /* qsort has no context argument: set around one qsort */

static int cmp_id(const void *a, const void *b)
{
    const sp_blk_span *x = &g_sort[*(const int *)a], *y = &g_sort[*(const int *)b];
    int c = strcmp(x->id ? x->id : "", y->id ? y->id : "");
    return c ? c : *(const int *)a - *(const int *)b;
}

/* Indices of s in id order. */
static int *order_by_id(const sp_blk_span *s, int n)
{
    int *o = malloc((size_t)(n > 0 ? n : 1) * sizeof *o);
    if (!o)
        return NULL;
    for (int i = 0; i < n; i++)
        o[i] = i;
    g_sort = s;
    qsort(o, (size_t)n, sizeof *o, cmp_id);
    g_sort = NULL;
    return o;
}

static void add_span(double *tp, int L, int start, int end, double v)
{
    for (int i = start < 0 ? 0 : start; i < end && i < L; i++)
        tp[i] += v;
}

void sp_blocksel_throughputs(const sp_blk_span *s, int n, int L, double *tp)
{
    memset(tp, 0, (size_t)L * sizeof *tp);
    int *o = order_by_id(s, n);
    for (int k = 0; k < n; k++) {
        const sp_blk_span *x = &s[o ? o[k] : k];
        add_span(tp, L, x->start, x->end, x->throughput);
    }
    free(o);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int sp_blocksel_best_start(const double *tp, int L, int k)
{
    if (k >= L)
        return 0;
    double *best = malloc((size_t)k * sizeof *best), *cur = malloc((size_t)k * sizeof *cur);
    int pick = 0;
    for (int i = 0; best && cur && i + k <= L; i++) {
        memcpy(cur, tp + i, (size_t)k * sizeof *cur);
        qsort(cur, (size_t)k, sizeof *cur, cmp_double);
        int better = i == 0;
        for (int j = 0; !better && j < k && cur[j] <= best[j]; j++)
            better = cur[j] < best[j];
        if (better) {
            memcpy(best, cur, (size_t)k * sizeof *best);
            pick = i;
        }
    }
    free(best);
    free(cur);
    return pick;
}

int sp_blocksel_choose(const sp_blk_span *s, int n, int L, int k)
{
    double *tp = malloc((size_t)L * sizeof *tp);
    if (!tp)
        return 0;
    sp_blocksel_throughputs(s, n, L, tp);
    int start = sp_blocksel_best_start(tp, L, k);
    free(tp);
    return start;
}

static double min_of(const double *tp, int L)
{
    double m = tp[0];
    for (int i = 1; i < L; i++)
        m = tp[i] < m ? tp[i] : m;
    return m;
}

/* Every server re-chooses greedily, in random order, until none moves (Petals' simulation). */
static void simulate(sp_blk_span *sp, int n, int L, double *tp, sp_rng *rng)
{
    int *order = malloc((size_t)(n > 0 ? n : 1) * sizeof *order);
    for (int round = 0, moved = 1; order && moved && round < MAX_ROUNDS; round++) {
        moved = 0;
        for (int i = 0; i < n; i++)
            order[i] = i;
        for (int i = n - 1; i > 0; i--) {
            int j = (int)(sp_rng_u32(rng) % (uint32_t)(i + 1)), t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        for (int q = 0; q < n; q++) {
            sp_blk_span *x = &sp[order[q]];
            int len = x->end - x->start;
            add_span(tp, L, x->start, x->end, -x->throughput * (1 + EPS));
            int ns = sp_blocksel_best_start(tp, L, len);
            add_span(tp, L, x->start, x->end, x->throughput * EPS);
            if (ns != x->start) {
                x->start = ns;
                x->end = ns + len;
                moved = 1;
            }
            add_span(tp, L, x->start, x->end, x->throughput);
        }
    }
    free(order);
}

int sp_blocksel_should_move(const sp_blk_span *s, int n, int me, int L, double balance_quality, sp_rng *rng)
{
    if (balance_quality > 1)
        return 1;
    double *tp = malloc((size_t)L * sizeof *tp);
    sp_blk_span *sp = malloc((size_t)(n > 0 ? n : 1) * sizeof *sp);
    int move = 0;
    if (!tp || !sp)
        goto out;
    memcpy(sp, s, (size_t)n * sizeof *sp);
    sp_blocksel_throughputs(sp, n, L, tp);
    double initial = min_of(tp, L);
    sp_blk_span *m = &sp[me];
    int len = m->end - m->start;
    add_span(tp, L, m->start, m->end, -m->throughput * (1 + EPS));
    if (initial > EPS && min_of(tp, L) <= 0) /* moving would open a gap */
        goto out;
    int ns = sp_blocksel_best_start(tp, L, len);
    if (ns == m->start)
        goto out;
    add_span(tp, L, m->start, m->end, m->throughput * EPS);
    m->start = ns;
    m->end = ns + len;
    add_span(tp, L, m->start, m->end, m->throughput);
    simulate(sp, n, L, tp, rng);
    double after = min_of(tp, L);
    if (after < initial || after < EPS)
        goto out;
    move = initial / after < balance_quality - EPS;
out:
    free(tp);
    free(sp);
    return move;
}
