/* routing.c - min-latency (Dijkstra) and max-throughput routes over server spans.
 *
 * Petals' min-latency graph has a node (span, block boundary) for every boundary a span touches inside
 * the range, and an exit; compute edges join a span's consecutive boundaries. Two things keep it small
 * here without changing any distance:
 *
 *   - the chain of a span is folded: a node inside a span has no edge out but the compute edge, so the
 *     graph keeps one node per span (its last boundary in the range); entering the span at boundary b
 *     relaxes that node with the entry edge plus the blocks b .. end - 1, added one by one.
 *   - the transitions at a boundary b go from every span ending at b to every span holding block b: all
 *     pairs would be ~10^7 edges for 10,000 servers over 80 blocks. They are relaxed lazily instead, and
 *     exactly. A switch cur -> t without a known ping costs default(t) = 0.15 + 0.018 (+ 10 without
 *     cache) whoever cur is. Dijkstra settles the spans ending at b in order of distance, so the first
 *     one settled WITHOUT a known ping to t makes t the best default-priced offer there is; no later one
 *     can beat it. So each boundary keeps a list of "pending" targets: the first span settled at b
 *     relaxes every target it has no known ping to and drops it from the list; the targets it knows a
 *     ping to stay pending for the next span settled at b, and so on. After the first, each span scans
 *     only what is still pending (at most its predecessors' known pings). Every span also relaxes its
 *     own known pings explicitly, at their real cost. A known ping slower than the default is never
 *     undercut (as a single virtual node per boundary would): the span that knows it does not offer the
 *     default price for that target; only spans with no ping to it do, as in the all-pairs graph.
 *
 * So every edge of Petals' graph is either relaxed or dominated by one that was: the distances are the
 * all-pairs graph's, in O((N + P) log N) for N spans and P known pings, plus the blocks of each entry
 * (bench/route.c checks against an all-pairs Dijkstra on 10,000 servers, tests/test_routing.c against
 * exhaustive search). */
#include "routing.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double sp_route_delay(double rtt)
{
    if (!(rtt >= 0)) /* < 0 or NaN: unknown */
        return SP_ROUTE_UNKNOWN_DELAY;
    return rtt / 2 < SP_ROUTE_MAX_DELAY ? rtt / 2 : SP_ROUTE_MAX_DELAY; /* INFINITY (unreachable): 5 s */
}

double sp_route_relay_delay(double rtt)
{
    if (!(rtt >= 0))
        return 2 * SP_ROUTE_UNKNOWN_DELAY;
    return rtt < 2 * SP_ROUTE_MAX_DELAY ? rtt : 2 * SP_ROUTE_MAX_DELAY;
}

int sp_route_has_cache(const sp_route_span *s, long cache_tokens)
{
    return cache_tokens <= 0 || s->cache_tokens_left < 0 || cache_tokens <= s->cache_tokens_left;
}

static double block_cost(const sp_route_span *s)
{
    if (s->block_s > 0 && isfinite(s->block_s))
        return s->block_s;
    return 1.0 / (s->inference_rps > 0 ? s->inference_rps : SP_ROUTE_DEFAULT_RPS);
}

static int imin(int a, int b) { return a < b ? a : b; }
static int imax(int a, int b) { return a > b ? a : b; }

/* ---------------------------------------------------------------------------------------------- */
/* which spans take part */

static int meets(const sp_route_span *x, int start, int end)
{
    return x->start < x->end && x->start < end && x->end > start;
}

static int unreachable(const sp_route_span *x)
{
    return isinf(x->client_rtt) && x->client_rtt > 0;
}

static int avoided(const sp_route_span *x)
{
    return x->banned || unreachable(x);
}

/* Fills sel (room for n) with the spans taking part: those meeting [start, end), avoided ones only where
 * they hold a block nothing else holds. Returns their number (-2: out of memory), *missing the first
 * block no span at all holds (-1: none). O(n + L) with difference arrays. */
static int select_spans(const sp_route_span *s, int n, int start, int end, int *sel, int *missing)
{
    int L = end - start, k = 0;
    int *all = calloc((size_t)L + 1, sizeof *all), *own = calloc((size_t)L + 1, sizeof *own);
    int *unc = calloc((size_t)L + 1, sizeof *unc); /* unc[b]: blocks before b held by no unavoided span */
    if (!all || !own || !unc) {
        free(all), free(own), free(unc);
        return -2;
    }
    for (int j = 0; j < n; j++) {
        if (!meets(&s[j], start, end))
            continue;
        int lo = imax(s[j].start, start) - start, hi = imin(s[j].end, end) - start;
        all[lo]++, all[hi]--;
        if (!avoided(&s[j]))
            own[lo]++, own[hi]--;
    }
    *missing = -1;
    for (int b = 0, ca = 0, co = 0; b < L; b++) {
        ca += all[b], co += own[b];
        if (!ca && *missing < 0)
            *missing = start + b;
        unc[b + 1] = unc[b] + !co;
    }
    for (int j = 0; j < n; j++) {
        if (!meets(&s[j], start, end))
            continue;
        int lo = imax(s[j].start, start) - start, hi = imin(s[j].end, end) - start;
        if (!avoided(&s[j]) || unc[hi] > unc[lo])
            sel[k++] = j;
    }
    free(all), free(own), free(unc);
    return k;
}

/* ---------------------------------------------------------------------------------------------- */
/* a binary heap of (dist, node) with lazy deletion */

typedef struct heap_item {
    double d;
    int node;
} heap_item;

typedef struct heap {
    heap_item *a;
    int n, cap;
} heap;

static int heap_push(heap *h, double d, int node)
{
    if (h->n == h->cap) {
        int cap = h->cap ? 2 * h->cap : 1024;
        heap_item *a = realloc(h->a, (size_t)cap * sizeof *a);
        if (!a)
            return -2;
        h->a = a;
        h->cap = cap;
    }
    int i = h->n++;
    while (i > 0 && h->a[(i - 1) / 2].d > d) {
        h->a[i] = h->a[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->a[i] = (heap_item){d, node};
    return 0;
}

static heap_item heap_pop(heap *h)
{
    heap_item top = h->a[0], last = h->a[--h->n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && h->a[c + 1].d < h->a[c].d)
            c++;
        if (h->a[c].d >= last.d)
            break;
        h->a[i] = h->a[c];
        i = c;
    }
    h->a[i] = last;
    return top;
}

/* ---------------------------------------------------------------------------------------------- */
/* the min-latency graph */

/* Petals' node (span, boundary b) for b inside a span has one way out, the compute edge to b + 1, unless
 * it is the span's last boundary hi (the exit, or the switches at the span's end). So the chain is folded:
 * node i stands for (graph span i, hi[i]), and entering span i at boundary b relaxes node i directly with
 * the entry and the compute edges of blocks b .. hi - 1, added one by one as Dijkstra would add them
 * along the chain. Node k is the exit. */
typedef struct graph {
    const sp_route_model *m;
    const sp_route_span *s;
    const int *sel; /* graph span i is s[sel[i]] */
    int k, start, end;
    long cache;
    int *lo, *hi;     /* graph span i holds boundaries lo[i] .. hi[i] of the range */
    double *bc, *pen; /* its cost per block, its cache penalty (read often: kept apart from the spans) */
    int *pbeg, *ptgt; /* its known pings: to graph spans ptgt[pbeg[i] .. pbeg[i+1]), first known per target */
    double *prtt;
    int *bbeg, *blist, *blen; /* boundary b: pending targets (graph spans holding block b), blist[bbeg[b]..] */
    double *dist;     /* node i: (span i, hi[i]); node k: the exit */
    int *from, *entry; /* the best way into node i: from node from[i] (-1: the client), entering at entry[i] */
    heap h;
} graph;

static void graph_free(graph *g)
{
    free(g->lo), free(g->hi), free(g->bc), free(g->pen), free(g->pbeg), free(g->ptgt), free(g->prtt);
    free(g->bbeg), free(g->blist), free(g->blen), free(g->dist), free(g->from), free(g->entry), free(g->h.a);
}

typedef struct server_key {
    int server, span;
} server_key;

static int cmp_key(const void *a, const void *b)
{
    const server_key *x = a, *y = b;
    return (x->server > y->server) - (x->server < y->server);
}

/* Caller's server index -> graph span: a direct table when the indices are dense (the runtime's are
 * array indices), else a sorted array searched by halves. */
typedef struct server_map {
    int *table, size; /* table[server], -1 */
    server_key *keys;
    int k;
} server_map;

static int map_find(const server_map *m, int server)
{
    if (m->table)
        return server >= 0 && server < m->size ? m->table[server] : -1;
    server_key key = {.server = server}, *f = bsearch(&key, m->keys, (size_t)m->k, sizeof *m->keys, cmp_key);
    return f ? f->span : -1;
}

/* 0, -1 (a server index negative or repeated) or -2. */
static int map_build(server_map *m, const graph *g)
{
    int maxs = -1;
    m->k = g->k;
    for (int i = 0; i < g->k; i++) {
        int srv = g->s[g->sel[i]].server;
        if (srv < 0)
            return -1;
        maxs = srv > maxs ? srv : maxs;
    }
    if (maxs < 4 * g->k + 1024) {
        m->size = maxs + 1;
        m->table = malloc((size_t)(m->size > 0 ? m->size : 1) * sizeof(int));
        if (!m->table)
            return -2;
        for (int i = 0; i < m->size; i++)
            m->table[i] = -1;
        for (int i = 0; i < g->k; i++) {
            int *slot = &m->table[g->s[g->sel[i]].server];
            if (*slot >= 0)
                return -1;
            *slot = i;
        }
        return 0;
    }
    m->keys = malloc((size_t)(g->k > 0 ? g->k : 1) * sizeof *m->keys);
    if (!m->keys)
        return -2;
    for (int i = 0; i < g->k; i++)
        m->keys[i] = (server_key){g->s[g->sel[i]].server, i};
    qsort(m->keys, (size_t)g->k, sizeof *m->keys, cmp_key);
    for (int i = 1; i < g->k; i++)
        if (m->keys[i].server == m->keys[i - 1].server)
            return -1;
    return 0;
}

/* Resolves the spans' next pings to graph spans, the first known entry per target. 0, -1 or -2. */
static int graph_pings(graph *g)
{
    server_map m = {0};
    int k = g->k, total = 0, rc = map_build(&m, g);
    for (int i = 0; i < k; i++)
        total += g->s[g->sel[i]].nnext > 0 ? g->s[g->sel[i]].nnext : 0;
    g->pbeg = malloc(((size_t)k + 1) * sizeof(int));
    g->ptgt = malloc((size_t)(total > 0 ? total : 1) * sizeof(int));
    g->prtt = malloc((size_t)(total > 0 ? total : 1) * sizeof(double));
    if (!rc && (!g->pbeg || !g->ptgt || !g->prtt))
        rc = -2;
    for (int i = 0, n = 0; !rc && i < k; i++) {
        const sp_route_span *x = &g->s[g->sel[i]];
        g->pbeg[i] = n;
        for (int p = 0; p < x->nnext && !g->m->relayed; p++) { /* relayed: servers' pings play no part */
            int t = x->next[p].rtt >= 0 ? map_find(&m, x->next[p].server) : -1, dup = 0;
            for (int q = g->pbeg[i]; q < n && !dup; q++)
                dup = g->ptgt[q] == t;
            if (t >= 0 && t != i && !dup) {
                g->ptgt[n] = t;
                g->prtt[n++] = x->next[p].rtt;
            }
        }
        g->pbeg[i + 1] = n;
    }
    free(m.table);
    free(m.keys);
    return rc;
}

/* The spans' bounds and costs, the spans holding each inner boundary's block, the pings. 0, -1 or -2. */
static int graph_build(graph *g)
{
    int k = g->k, L = g->end - g->start;
    size_t nk = (size_t)k + 1;
    g->lo = malloc(nk * sizeof(int));
    g->hi = malloc(nk * sizeof(int));
    g->bc = malloc(nk * sizeof(double));
    g->pen = malloc(nk * sizeof(double));
    g->dist = malloc(nk * sizeof(double));
    g->from = malloc(nk * sizeof(int));
    g->entry = malloc(nk * sizeof(int));
    g->bbeg = calloc((size_t)L + 1, sizeof(int));
    g->blen = calloc((size_t)L + 1, sizeof(int));
    if (!g->lo || !g->hi || !g->bc || !g->pen || !g->dist || !g->from || !g->entry || !g->bbeg || !g->blen)
        return -2;
    for (int i = 0; i < k; i++) {
        const sp_route_span *x = &g->s[g->sel[i]];
        g->lo[i] = imax(x->start, g->start);
        g->hi[i] = imin(x->end, g->end);
        g->bc[i] = block_cost(x);
        g->pen[i] = (sp_route_has_cache(x, g->cache) ? 0 : SP_ROUTE_NO_CACHE) +
                    (x->queue_wait > 0 && isfinite(x->queue_wait) ? x->queue_wait : 0);
        for (int b = imax(g->lo[i], g->start + 1); b < g->hi[i]; b++)
            g->blen[b - g->start]++; /* holds block b, b an inner boundary: a switch target at b */
    }
    for (int b = 0; b < L; b++)
        g->bbeg[b + 1] = g->bbeg[b] + g->blen[b];
    g->blist = malloc((size_t)(g->bbeg[L] > 0 ? g->bbeg[L] : 1) * sizeof(int));
    if (!g->blist)
        return -2;
    memset(g->blen, 0, (size_t)L * sizeof(int));
    for (int i = 0; i < k; i++)
        for (int b = imax(g->lo[i], g->start + 1); b < g->hi[i]; b++)
            g->blist[g->bbeg[b - g->start] + g->blen[b - g->start]++] = i;
    for (int i = 0; i <= k; i++) {
        g->dist[i] = INFINITY;
        g->from[i] = g->entry[i] = -1;
    }
    return graph_pings(g);
}

static int relax(graph *g, int node, double d, int from, int entry)
{
    if (d >= g->dist[node])
        return 0;
    g->dist[node] = d;
    g->from[node] = from;
    g->entry[node] = entry;
    return heap_push(&g->h, d, node);
}

/* Span t entered at boundary b at distance d (its entry edge included): its blocks b .. hi - 1. */
static int enter_span(graph *g, int t, int b, double d, int from)
{
    for (int j = b; j < g->hi[t]; j++)
        d += g->bc[t];
    return relax(g, t, d, from, b);
}

/* Petals' model: the entry edge into graph span t after a hop of this rtt (the client's or a known ping; < 0:
 * unknown). */
static double entry_at(const graph *g, int t, double rtt)
{
    return sp_route_delay(rtt) + g->m->overhead + g->pen[t];
}

/* The relayed model: entering graph span t costs the client's round trip to it, whatever came before. */
static double relay_entry(const graph *g, int t)
{
    return sp_route_relay_delay(g->s[g->sel[t]].client_rtt) + g->m->overhead + g->pen[t];
}

/* The entry into graph span t from the client (the chain's first span). */
static double first_entry(const graph *g, int t)
{
    return g->m->relayed ? relay_entry(g, t) : entry_at(g, t, g->s[g->sel[t]].client_rtt);
}

/* Leaving graph span t, the chain's last, back to the client. */
static double exit_cost(const graph *g, int t)
{
    return g->m->relayed ? 0 : sp_route_delay(g->s[g->sel[t]].client_rtt);
}

/* A switch into graph span t from a span without a known ping to it (Petals: an unknown rtt; guess_switch: the
 * client's rtt to t). */
static double switch_price(const graph *g, int t)
{
    if (g->m->relayed)
        return relay_entry(g, t);
    return entry_at(g, t, g->m->guess_switch ? g->s[g->sel[t]].client_rtt : -1);
}

/* The known ping of graph span i to graph span t, or -1. */
static double known_ping(const graph *g, int i, int t)
{
    for (int p = g->pbeg[i]; p < g->pbeg[i + 1]; p++)
        if (g->ptgt[p] == t)
            return g->prtt[p];
    return -1;
}

/* Graph span i, settled at boundary b (its span's end) at distance d, switches to the spans holding
 * block b: the default price to the pending targets it has no ping to (they leave the list), its known
 * pings at their own price. 0 or -2. */
static int transitions(graph *g, int i, int b, double d)
{
    int *list = g->blist + g->bbeg[b - g->start], *len = &g->blen[b - g->start], keep = 0;
    for (int p = 0; p < *len; p++) {
        int t = list[p];
        if (known_ping(g, i, t) >= 0)
            list[keep++] = t;
        else if (enter_span(g, t, b, d + switch_price(g, t), i))
            return -2;
    }
    *len = keep;
    for (int p = g->pbeg[i]; p < g->pbeg[i + 1]; p++) {
        int t = g->ptgt[p];
        if (g->lo[t] <= b && b < g->hi[t] && enter_span(g, t, b, d + entry_at(g, t, g->prtt[p]), i))
            return -2;
    }
    return 0;
}

/* Dijkstra from the entry edges until the exit is settled. 0 or -2. */
static int dijkstra(graph *g)
{
    for (int i = 0; i < g->k; i++)
        if (g->lo[i] == g->start && enter_span(g, i, g->start, first_entry(g, i), -1))
            return -2;
    while (g->h.n > 0) {
        heap_item it = heap_pop(&g->h);
        int i = it.node;
        if (it.d > g->dist[i])
            continue; /* a stale entry */
        if (i == g->k)
            return 0;
        const sp_route_span *x = &g->s[g->sel[i]];
        if (g->hi[i] == g->end && relax(g, g->k, it.d + exit_cost(g, i), i, -1))
            return -2;
        if (g->hi[i] == x->end && x->end < g->end && transitions(g, i, x->end, it.d))
            return -2;
    }
    return 0;
}

/* The path to the exit as hops; a span is on it at most once (its end comes after its predecessor's).
 * Each hop's latency is the distance gained since the previous hop (the last hop's includes the exit).
 * Returns the number of hops, -1 (more than max_hops) or -2. */
static int path_hops(const graph *g, sp_route_hop *hops, int max_hops)
{
    int len = 0;
    for (int i = g->from[g->k]; i >= 0; i = g->from[i])
        len++;
    if (len > max_hops)
        return -1;
    for (int i = g->from[g->k], h = len - 1; i >= 0; i = g->from[i], h--) {
        double before = g->from[i] >= 0 ? g->dist[g->from[i]] : 0;
        double after = h == len - 1 ? g->dist[g->k] : g->dist[i];
        hops[h] = (sp_route_hop){.server = g->s[g->sel[i]].server, .start = g->entry[i], .end = g->hi[i],
                                 .latency = after - before};
    }
    return len;
}

int sp_route_min_latency(const sp_route_span *s, int n, int start, int end, long cache_tokens, sp_route_hop *hops,
                         int max_hops, double *cost, int *missing)
{
    static const sp_route_model petals = {.relayed = 0, .overhead = SP_ROUTE_OVERHEAD};
    return sp_route_min_latency_model(s, n, start, end, cache_tokens, &petals, hops, max_hops, cost, missing);
}

int sp_route_min_latency_model(const sp_route_span *s, int n, int start, int end, long cache_tokens,
                               const sp_route_model *m, sp_route_hop *hops, int max_hops, double *cost, int *missing)
{
    *missing = -1;
    *cost = 0;
    if (end <= start)
        return 0;
    int *sel = malloc((size_t)(n > 0 ? n : 1) * sizeof *sel);
    if (!sel)
        return -2;
    int k = select_spans(s, n, start, end, sel, missing);
    if (k < 0 || *missing >= 0) {
        free(sel);
        return k < 0 ? k : -1;
    }
    graph g = {.m = m, .s = s, .sel = sel, .k = k, .start = start, .end = end, .cache = cache_tokens};
    int nh = graph_build(&g);
    if (!nh)
        nh = dijkstra(&g);
    if (!nh)
        nh = isfinite(g.dist[g.k]) ? path_hops(&g, hops, max_hops) : -1;
    if (nh >= 0)
        *cost = g.dist[g.k];
    graph_free(&g);
    free(sel);
    return nh;
}

/* ---------------------------------------------------------------------------------------------- */

static double weight(const sp_route_span *x)
{
    double w = isfinite(x->throughput) && x->throughput > 0 ? x->throughput : x->end - x->start;
    return unreachable(x) ? w * SP_ROUTE_UNREACHABLE_WEIGHT : w;
}

int sp_route_max_throughput(const sp_route_span *s, int n, int start, int end, sp_rng *rng, sp_route_hop *hops,
                            int max_hops, int *missing)
{
    *missing = -1;
    if (end <= start)
        return 0;
    int *sel = malloc((size_t)(n > 0 ? n : 1) * sizeof *sel), *cand = malloc((size_t)(n > 0 ? n : 1) * sizeof *cand);
    double *w = malloc((size_t)(n > 0 ? n : 1) * sizeof *w);
    int k = sel && cand && w ? select_spans(s, n, start, end, sel, missing) : -2, nh = 0;
    if (k < 0 || *missing >= 0)
        nh = k < 0 ? k : -1;
    for (int pos = start; nh >= 0 && pos < end;) {
        if (nh == max_hops) {
            nh = -1;
            break;
        }
        double total = 0;
        int nc = 0;
        for (int i = 0; i < k; i++) {
            const sp_route_span *x = &s[sel[i]];
            if (x->start <= pos && pos < x->end) {
                w[nc] = weight(x);
                total += w[nc];
                cand[nc++] = sel[i];
            }
        }
        double r = (double)sp_rng_u32(rng) / 4294967296.0 * total;
        int pick = nc - 1; /* nc > 0: every block is held; rounding can leave r past the last weight */
        for (int c = 0; c < nc - 1; c++)
            if ((r -= w[c]) < 0) {
                pick = c;
                break;
            }
        const sp_route_span *x = &s[cand[pick]];
        hops[nh++] = (sp_route_hop){.server = x->server, .start = pos, .end = imin(x->end, end)};
        pos = x->end;
    }
    free(sel), free(cand), free(w);
    return nh;
}
