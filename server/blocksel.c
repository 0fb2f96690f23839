/* blocksel.c - Petals' block selection (server/block_selection.py): choose the weakest window, and the
 * rebalancing simulation of should_choose_other_blocks, with its eps = 1e-3 tricks: a server taking itself
 * out subtracts its throughput * (1 + eps), so that rounding never leaves a trace of it that would make its
 * own place look better served than it is, and adds throughput * eps back before moving. */
#include "blocksel.h"

#include <stdlib.h>
#include <string.h>

#define EPS 1e-3
#define MAX_ROUNDS 1000 /* the simulation converges in a few; a bound, not a tuning */

static int cmp_id(const void *a, const void *b)
{
    const sp_blk_span *x = *(const sp_blk_span *const *)a, *y = *(const sp_blk_span *const *)b;
    int c = strcmp(x->id ? x->id : "", y->id ? y->id : "");
    return c ? c : (x > y) - (x < y); /* equal ids: array order (pointers into one array) */
}

/* Pointers to the spans of s in id order, or NULL when out of memory. */
static const sp_blk_span **order_by_id(const sp_blk_span *s, int n)
{
    const sp_blk_span **o = malloc((size_t)(n > 0 ? n : 1) * sizeof *o);
    if (!o)
        return NULL;
    for (int i = 0; i < n; i++)
        o[i] = &s[i];
    qsort(o, (size_t)n, sizeof *o, cmp_id);
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
    const sp_blk_span **o = order_by_id(s, n);
    for (int k = 0; k < n; k++) {
        const sp_blk_span *x = o ? o[k] : &s[k]; /* out of memory: the sums in array order */
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
    if (k <= 0 || k >= L)
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
    if (L <= 0)
        return 0;
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

/* Every server re-chooses greedily, in random order (a Fisher-Yates shuffle from rng each round), until
 * none moves (Petals' simulation). 0, or -1 when out of memory. */
static int simulate(sp_blk_span *sp, int n, int L, double *tp, sp_rng *rng)
{
    int *order = malloc((size_t)(n > 0 ? n : 1) * sizeof *order);
    if (!order)
        return -1;
    for (int round = 0, moved = 1; moved && round < MAX_ROUNDS; round++) {
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
            if (len <= 0)
                continue; /* holds nothing of [0, L): not a span Petals would see */
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
    return 0;
}

int sp_blocksel_should_move(const sp_blk_span *s, int n, int me, int L, double balance_quality, sp_rng *rng)
{
    if (balance_quality > 1)
        return 1;
    if (me < 0 || me >= n || L <= 0)
        return 0;
    double *tp = malloc((size_t)L * sizeof *tp);
    sp_blk_span *sp = malloc((size_t)n * sizeof *sp);
    int move = 0;
    if (!tp || !sp)
        goto out;
    for (int i = 0; i < n; i++) { /* spans clipped to [0, L), as Petals' compute_spans does */
        sp[i] = s[i];
        sp[i].start = sp[i].start > 0 ? sp[i].start : 0;
        sp[i].end = sp[i].end < L ? sp[i].end : L;
    }
    sp_blocksel_throughputs(sp, n, L, tp);
    double initial = min_of(tp, L);
    sp_blk_span *m = &sp[me];
    int len = m->end - m->start;
    if (len <= 0)
        goto out;
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
    if (simulate(sp, n, L, tp, rng))
        goto out;
    double after = min_of(tp, L);
    if (after < initial || after < EPS)
        goto out;
    move = initial / after < balance_quality - EPS;
out:
    free(tp);
    free(sp);
    return move;
}
