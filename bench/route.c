/* route.c - what the lazy transitions of sp_route_min_latency buy: a min-latency route over a synthetic
 * swarm of 10,000 servers on 80 blocks (spans of 1..16 blocks, random inference rps, caches, client rtts,
 * ~10 known next pings each, 1% banned) against a straightforward Dijkstra over Petals' graph with every
 * transition edge built explicitly (every span ending at a boundary to every span holding its block,
 * ~10^7 edges), written here. The two costs must agree (else exit 1); prints the median times, the
 * ratio, and the time of a max-throughput route.
 *
 * usage: bench_route [--servers N] [--blocks L] [--reps R] [--seed S] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rng.h"
#include "routing.h"
#include "timeutil.h"

#define MAX_SPAN 16
#define NPINGS 10
#define NEED 2048 /* a session's positions: about half the servers lack the cache */

static double unif(sp_rng *r) { return sp_rng_u32(r) / 4294967296.0; }
static int pick(sp_rng *r, int n) { return (int)(sp_rng_u32(r) % (uint32_t)n); }

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *x, int n)
{
    qsort(x, (size_t)n, sizeof *x, cmp_d);
    return x[n / 2];
}

/* ---------------------------------------------------------------------------------------------- */
/* the synthetic swarm */

typedef struct swarm {
    int n, L;
    sp_route_span *s;
    sp_route_next *nx;
} swarm;

static double random_rtt(sp_rng *r)
{
    return unif(r) < 0.2 ? 1 + 11 * unif(r) : 0.005 + 0.5 * unif(r); /* some slower than the default */
}

static void swarm_make(swarm *w, int n, int L, uint64_t seed)
{
    sp_rng r;
    sp_rng_seed(&r, seed);
    w->n = n, w->L = L;
    w->s = calloc((size_t)n, sizeof *w->s);
    w->nx = calloc((size_t)n * NPINGS, sizeof *w->nx);
    int **holders = calloc((size_t)L, sizeof *holders), *nh = calloc((size_t)L, sizeof *nh);
    for (int b = 0; b < L; b++)
        holders[b] = malloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) {
        int len = 1 + pick(&r, MAX_SPAN < L ? MAX_SPAN : L), a = pick(&r, L - len + 1);
        double u = unif(&r);
        w->s[i] = (sp_route_span){.server = i, .start = a, .end = a + len,
                                  .inference_rps = u < 0.1 ? 0 : 20 + 980 * unif(&r),
                                  .throughput = 1 + 99 * unif(&r),
                                  .cache_tokens_left = pick(&r, 4) ? pick(&r, 2 * NEED) : -1,
                                  .client_rtt = pick(&r, 10) < 3 ? -1 : 0.01 + 0.4 * unif(&r),
                                  .banned = pick(&r, 100) == 0};
        for (int b = a; b < a + len; b++)
            holders[b][nh[b]++] = i;
    }
    for (int i = 0; i < n; i++) { /* mostly pings to likely successors (holders of its end block) */
        sp_route_next *nx = w->nx + (size_t)i * NPINGS;
        int e = w->s[i].end, m = 0;
        for (int p = 0; p < NPINGS; p++) {
            int to = e < L && pick(&r, 5) ? holders[e][pick(&r, nh[e])] : pick(&r, n);
            if (to != i)
                nx[m++] = (sp_route_next){.server = to, .rtt = random_rtt(&r)};
        }
        w->s[i].next = nx;
        w->s[i].nnext = m;
    }
    for (int b = 0; b < L; b++)
        free(holders[b]);
    free(holders);
    free(nh);
}

static void swarm_free(swarm *w)
{
    free(w->s);
    free(w->nx);
}

/* ---------------------------------------------------------------------------------------------- */
/* the baseline: Petals' graph, all edges built, then a plain Dijkstra. Spans not banned (the bench
 * checks every block has an unbanned span, so that is the router's selection too). */

typedef struct edge {
    int to;
    double w;
} edge;

typedef struct heap_item {
    double d;
    int node;
} heap_item;

static void push(heap_item *h, int *n, double d, int node)
{
    int i = (*n)++;
    while (i > 0 && h[(i - 1) / 2].d > d) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = (heap_item){d, node};
}

static heap_item pop(heap_item *h, int *n)
{
    heap_item top = h[0], last = h[--*n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && h[c + 1].d < h[c].d)
            c++;
        if (h[c].d >= last.d)
            break;
        h[i] = h[c];
        i = c;
    }
    h[i] = last;
    return top;
}

static double entry(const sp_route_span *x, double rtt, long need)
{
    return sp_route_delay(rtt) + SP_ROUTE_OVERHEAD + (sp_route_has_cache(x, need) ? 0 : SP_ROUTE_NO_CACHE);
}

static double ping(const sp_route_span *x, int to)
{
    for (int p = 0; p < x->nnext; p++)
        if (x->next[p].server == to && x->next[p].rtt >= 0)
            return x->next[p].rtt;
    return -1;
}

typedef struct baseline {
    double build_s, search_s, cost;
    long edges;
} baseline;

/* Over [0, L); node (span i, boundary b) = base[i] + b - start_i; node 0 the source, 1 the exit. */
static baseline baseline_route(const swarm *w, long need)
{
    double t0 = sp_now_s();
    int n = w->n, L = w->L, *base = malloc((size_t)n * sizeof(int)), nodes = 2;
    for (int i = 0; i < n; i++) {
        base[i] = nodes;
        nodes += w->s[i].banned ? 0 : w->s[i].end - w->s[i].start + 1;
    }
    long *deg = calloc((size_t)nodes + 1, sizeof(long)); /* counts, then CSR offsets */
    int **holding = calloc((size_t)L, sizeof *holding), *nhold = calloc((size_t)L, sizeof(int));
    for (int b = 0; b < L; b++)
        holding[b] = malloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) {
        const sp_route_span *x = &w->s[i];
        if (x->banned)
            continue;
        for (int b = x->start; b < x->end; b++)
            holding[b][nhold[b]++] = i;
    }
    for (int i = 0; i < n; i++) { /* degrees */
        const sp_route_span *x = &w->s[i];
        if (x->banned)
            continue;
        if (x->start == 0)
            deg[0]++;
        deg[base[i] + x->end - x->start] += x->end == L ? 1 : nhold[x->end];
        for (int b = x->start; b < x->end; b++)
            deg[base[i] + b - x->start]++;
    }
    long total = 0;
    for (int u = 0; u <= nodes; u++) {
        long d = deg[u];
        deg[u] = total;
        total += d;
    }
    edge *e = malloc((size_t)total * sizeof *e);
    long *fill = malloc((size_t)nodes * sizeof(long));
    memcpy(fill, deg, (size_t)nodes * sizeof(long));
    for (int i = 0; i < n; i++) {
        const sp_route_span *x = &w->s[i];
        if (x->banned)
            continue;
        if (x->start == 0)
            e[fill[0]++] = (edge){base[i], entry(x, x->client_rtt, need)};
        for (int b = x->start; b < x->end; b++)
            e[fill[base[i] + b - x->start]++] =
                (edge){base[i] + b - x->start + 1, 1 / (x->inference_rps > 0 ? x->inference_rps : 300)};
        int u = base[i] + x->end - x->start;
        if (x->end == L) {
            e[fill[u]++] = (edge){1, sp_route_delay(x->client_rtt)};
            continue;
        }
        for (int q = 0; q < nhold[x->end]; q++) { /* every span holding block end: all the pairs */
            const sp_route_span *t = &w->s[holding[x->end][q]];
            e[fill[u]++] = (edge){base[t->server] + x->end - t->start, entry(t, ping(x, t->server), need)};
        }
    }
    double t1 = sp_now_s();
    double *dist = malloc((size_t)nodes * sizeof *dist);
    heap_item *h = malloc((size_t)(total + 1) * sizeof *h);
    int hn = 0;
    for (int u = 0; u < nodes; u++)
        dist[u] = INFINITY;
    dist[0] = 0;
    push(h, &hn, 0, 0);
    while (hn > 0) {
        heap_item it = pop(h, &hn);
        if (it.d > dist[it.node])
            continue;
        if (it.node == 1)
            break;
        for (long k = deg[it.node]; k < deg[it.node + 1]; k++)
            if (it.d + e[k].w < dist[e[k].to]) {
                dist[e[k].to] = it.d + e[k].w;
                push(h, &hn, dist[e[k].to], e[k].to);
            }
    }
    baseline out = {.build_s = t1 - t0, .search_s = sp_now_s() - t1, .cost = dist[1], .edges = total};
    for (int b = 0; b < L; b++)
        free(holding[b]);
    free(holding), free(nhold), free(base), free(deg), free(e), free(fill), free(dist), free(h);
    return out;
}

/* ---------------------------------------------------------------------------------------------- */

static int all_covered_unbanned(const swarm *w)
{
    for (int b = 0; b < w->L; b++) {
        int ok = 0;
        for (int i = 0; i < w->n && !ok; i++)
            ok = !w->s[i].banned && w->s[i].start <= b && b < w->s[i].end;
        if (!ok)
            return 0;
    }
    return 1;
}

int main(int argc, char **argv)
{
    int n = 10000, L = 80, reps = 21;
    uint64_t seed = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--servers"))
            n = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--blocks"))
            L = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seed"))
            seed = strtoull(argv[i + 1], NULL, 10);
        else {
            fprintf(stderr, "usage: bench_route [--servers N] [--blocks L] [--reps R] [--seed S]\n");
            return 2;
        }
    }
    if (n < 1 || L < 1 || reps < 1) {
        fprintf(stderr, "bench_route: --servers, --blocks and --reps must be positive\n");
        return 2;
    }
    printf("bench_route: %d servers over %d blocks (spans of 1..%d), %d known next pings each, %d reps\n", n, L,
           MAX_SPAN, NPINGS, reps);
    double *t = malloc((size_t)reps * sizeof *t), base_t[3], base_build[3], base_search[3];
    int rc = 0;
    for (int sw = 0; sw < 3; sw++) { /* three swarms: costs checked on each, times from the first */
        swarm w;
        swarm_make(&w, n, L, seed + (uint64_t)sw);
        if (!all_covered_unbanned(&w)) {
            fprintf(stderr, "bench_route: swarm %d leaves a block without an unbanned server; more servers\n", sw);
            swarm_free(&w);
            return 2;
        }
        for (long need = NEED; need >= 0; need -= NEED) {
            sp_route_hop hops[128];
            double cost = 0;
            int miss, nh = 0;
            for (int k = 0; k < (sw || need == 0 ? 1 : reps); k++) {
                double t0 = sp_now_s();
                nh = sp_route_min_latency(w.s, w.n, 0, L, need, hops, 128, &cost, &miss);
                t[k] = sp_now_s() - t0;
            }
            baseline b = baseline_route(&w, need);
            int same = nh > 0 && fabs(cost - b.cost) <= 1e-9 * fmax(1, b.cost);
            printf("swarm %d, session of %ld positions: %d hops, %.6f s/step (%.2f steps/s); all-pairs: %.6f s over %ld "
                   "edges: %s\n",
                   sw, need, nh, cost, 1 / cost, b.cost, b.edges, same ? "equal" : "DIFFERENT");
            if (!same)
                rc = 1;
            if (sw == 0 && need == NEED) {
                base_build[0] = b.build_s, base_search[0] = b.search_s, base_t[0] = b.build_s + b.search_s;
                for (int k = 1; k < 3; k++) {
                    b = baseline_route(&w, need);
                    base_build[k] = b.build_s, base_search[k] = b.search_s, base_t[k] = b.build_s + b.search_s;
                }
                double lib = median(t, reps), all = median(base_t, 3);
                printf("  min-latency, lazy transitions: %.3f ms (median of %d)\n", lib * 1e3, reps);
                printf("  all-pairs Dijkstra: %.3f ms (build %.3f + search %.3f, median of 3)\n", all * 1e3,
                       median(base_build, 3) * 1e3, median(base_search, 3) * 1e3);
                printf("  ratio: %.1fx\n", all / lib);
            }
        }
        if (sw == 0) {
            sp_rng r;
            sp_rng_seed(&r, seed);
            sp_route_hop hops[128];
            int miss, nh = 0;
            for (int k = 0; k < reps; k++) {
                double t0 = sp_now_s();
                nh = sp_route_max_throughput(w.s, w.n, 0, L, &r, hops, 128, &miss);
                t[k] = sp_now_s() - t0;
            }
            printf("  max-throughput: %.3f ms (median of %d; last route %d hops)\n", median(t, reps) * 1e3, reps, nh);
        }
        swarm_free(&w);
    }
    free(t);
    return rc;
}
