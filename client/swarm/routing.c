/* routing.c - min-latency (Dijkstra) and max-throughput routes over server spans.
 *
 * The graph of the min-latency route has a node (span, block boundary) for every boundary a span touches
 * inside the range; compute edges join a span's consecutive boundaries. The transitions at a boundary b go
 * from every span ending at b to every span holding block b: all pairs would be ~10^7 edges for 10,000
 * servers. They are relaxed lazily and exactly instead: a switch without a known ping costs the same
 * 0.15 s + 0.018 s + the target's penalty whoever it comes from, so only the first span to reach b (the
 * closest, in Dijkstra's order) needs to relax those targets; a target it has a known ping to stays
 * "pending" for the next span to reach b, and every span also relaxes its own (at most 16) known pings. */
#include "routing.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double sp_route_delay(double rtt)
{
    if (rtt < 0)
        return SP_ROUTE_UNKNOWN_DELAY;
    return rtt / 2 < 5 ? rtt / 2 : 5; /* INFINITY (unreachable) costs 5 s */
}

int sp_route_has_cache(const sp_route_span *s, long cache_tokens)
{
    return cache_tokens <= 0 || s->cache_tokens_left < 0 || cache_tokens <= s->cache_tokens_left;
}

static double entry_cost(const sp_route_span *s, double rtt, long cache)
{
    return sp_route_delay(rtt) + SP_ROUTE_OVERHEAD + (sp_route_has_cache(s, cache) ? 0 : SP_ROUTE_NO_CACHE);
}

static double block_cost(const sp_route_span *s)
{
    return 1.0 / (s->inference_rps > 0 ? s->inference_rps : SP_ROUTE_DEFAULT_RPS);
}

/* ---------------------------------------------------------------------------------------------- */
/* which spans take part: those meeting [start, end), banned ones only where a block has no other cover */

static int *select_spans(const sp_route_span *s, int n, int start, int end, int *nsel)
{
    int L = end - start, k = 0;
    char *cover = calloc((size_t)L, 1);
    int *sel = malloc((size_t)(n > 0 ? n : 1) * sizeof *sel);
    if (!cover || !sel) {
        free(cover);
        free(sel);
        return NULL;
    }
    for (int j = 0; j < n; j++)
        if (!s[j].banned)
            for (int b = s[j].start > start ? s[j].start : start; b < s[j].end && b < end; b++)
                cover[b - start] = 1;
    for (int j = 0; j < n; j++) {
        if (s[j].end <= start || s[j].start >= end || s[j].start >= s[j].end)
            continue;
        int take = !s[j].banned;
        for (int b = s[j].start > start ? s[j].start : start; !take && b < s[j].end && b < end; b++)
            take = !cover[b - start];
        if (take)
            sel[k++] = j;
    }
    free(cover);
    *nsel = k;
    return sel;
}

/* The first block of [start, end) no selected span covers, or -1. */
static int first_missing(const sp_route_span *s, const int *sel, int k, int start, int end)
{
    for (int b = start; b < end; b++) {
        int ok = 0;
        for (int i = 0; i < k && !ok; i++)
            ok = s[sel[i]].start <= b && b < s[sel[i]].end;
        if (!ok)
            return b;
    }
    return -1;
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
            return -1;
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

typedef struct graph {
    const sp_route_span *s;
    const int *sel;   /* node spans: graph span i is s[sel[i]] */
    int k, start, end;
    long cache;
    int *base, *lo;   /* graph span i: nodes base[i] .. base[i] + hi - lo for boundaries lo .. hi */
    int nodes;        /* the exit node is `nodes` */
    int *span_of;     /* node -> graph span */
    int *bstart, *blist, *blen; /* boundary b: graph spans holding block b, at blist[bstart[b - start]] */
    int *gidx;        /* caller server index -> graph span, -1 */
    int maxserver;
    double *dist;
    int *prev;
    heap h;
} graph;

static void graph_free(graph *g)
{
    free(g->base), free(g->lo), free(g->span_of), free(g->bstart), free(g->blist), free(g->blen);
    free(g->gidx), free(g->dist), free(g->prev), free(g->h.a);
}

static int graph_build(graph *g)
{
    int k = g->k, L = g->end - g->start;
    g->base = malloc((size_t)k * sizeof(int));
    g->lo = malloc((size_t)k * sizeof(int));
    g->bstart = calloc((size_t)L + 1, sizeof(int));
    g->blen = calloc((size_t)L + 1, sizeof(int));
    if (!g->base || !g->lo || !g->bstart || !g->blen)
        return -1;
    g->maxserver = 0;
    for (int i = 0; i < k; i++) {
        const sp_route_span *s = &g->s[g->sel[i]];
        g->lo[i] = s->start > g->start ? s->start : g->start;
        int hi = s->end < g->end ? s->end : g->end;
        g->base[i] = g->nodes;
        g->nodes += hi - g->lo[i] + 1;
        for (int b = g->lo[i] > g->start ? g->lo[i] : g->start + 1; b < hi; b++)
            g->blen[b - g->start]++; /* holds block b, b a boundary inside the range */
        if (s->server > g->maxserver)
            g->maxserver = s->server;
    }
    for (int b = 0; b < L; b++)
        g->bstart[b + 1] = g->bstart[b] + g->blen[b];
    g->blist = malloc((size_t)(g->bstart[L] > 0 ? g->bstart[L] : 1) * sizeof(int));
    g->span_of = malloc((size_t)g->nodes * sizeof(int));
    g->gidx = malloc((size_t)(g->maxserver + 1) * sizeof(int));
    g->dist = malloc((size_t)(g->nodes + 1) * sizeof(double));
    g->prev = malloc((size_t)(g->nodes + 1) * sizeof(int));
    if (!g->blist || !g->span_of || !g->gidx || !g->dist || !g->prev)
        return -1;
    memset(g->blen, 0, (size_t)L * sizeof(int));
    for (int i = 0; i <= g->maxserver; i++)
        g->gidx[i] = -1;
    for (int i = 0; i < k; i++) {
        const sp_route_span *s = &g->s[g->sel[i]];
        int hi = s->end < g->end ? s->end : g->end;
        for (int b = g->lo[i]; b <= hi; b++)
            g->span_of[g->base[i] + b - g->lo[i]] = i;
        for (int b = g->lo[i] > g->start ? g->lo[i] : g->start + 1; b < hi; b++)
            g->blist[g->bstart[b - g->start] + g->blen[b - g->start]++] = i;
        if (s->server >= 0)
            g->gidx[s->server] = i;
    }
    for (int i = 0; i <= g->nodes; i++) {
        g->dist[i] = INFINITY;
        g->prev[i] = -2;
    }
    return 0;
}

static int relax(graph *g, int node, double d, int from)
{
    if (d >= g->dist[node])
        return 0;
    g->dist[node] = d;
    g->prev[node] = from;
    return heap_push(&g->h, d, node);
}

static int node_at(const graph *g, int i, int b) { return g->base[i] + b - g->lo[i]; }

/* The known ping of graph span i to graph span t, or -1. */
static double known_ping(const graph *g, int i, int t)
{
    const sp_route_span *s = &g->s[g->sel[i]];
    int server = g->s[g->sel[t]].server;
    for (int p = 0; p < s->nnext; p++)
        if (s->next[p].server == server)
            return s->next[p].rtt;
    return -1;
}

/* Graph span i reached boundary b (its span's end) at distance d: switches to the spans holding block b. */
static int transitions(graph *g, int i, int b, double d, int from)
{
    int *list = g->blist + g->bstart[b - g->start], *len = &g->blen[b - g->start], keep = 0;
    for (int p = 0; p < *len; p++) { /* the pending targets: the default switch unless i knows a ping */
        int t = list[p];
        if (known_ping(g, i, t) >= 0)
            list[keep++] = t;
        else if (relax(g, node_at(g, t, b), d + entry_cost(&g->s[g->sel[t]], -1, g->cache), from))
            return -1;
    }
    *len = keep;
    const sp_route_span *s = &g->s[g->sel[i]];
    for (int p = 0; p < s->nnext; p++) { /* its own known pings, to every target holding block b */
        int srv = s->next[p].server, t = srv >= 0 && srv <= g->maxserver ? g->gidx[srv] : -1;
        if (t < 0 || t == i)
            continue;
        const sp_route_span *ts = &g->s[g->sel[t]];
        if (ts->start <= b && b < ts->end &&
            relax(g, node_at(g, t, b), d + entry_cost(ts, s->next[p].rtt, g->cache), from))
            return -1;
    }
    return 0;
}

static int dijkstra(graph *g)
{
    for (int i = 0; i < g->k; i++) {
        const sp_route_span *s = &g->s[g->sel[i]];
        if (s->start <= g->start && g->start < s->end &&
            relax(g, node_at(g, i, g->start), entry_cost(s, s->client_rtt, g->cache), -1))
            return -1;
    }
    while (g->h.n > 0) {
        heap_item it = heap_pop(&g->h);
        int u = it.node;
        if (it.d > g->dist[u])
            continue;
        if (u == g->nodes)
            return 0;
        int i = g->span_of[u], b = g->lo[i] + u - g->base[i];
        const sp_route_span *s = &g->s[g->sel[i]];
        int hi = s->end < g->end ? s->end : g->end;
        if (b < hi && relax(g, u + 1, it.d + block_cost(s), u))
            return -1;
        if (b == g->end && relax(g, g->nodes, it.d + sp_route_delay(s->client_rtt), u))
            return -1;
        if (b == s->end && b > g->start && b < g->end && transitions(g, i, b, it.d, u))
            return -1;
    }
    return 0;
}

/* The path to the exit as hops (consecutive nodes of one span merge). */
static int path_hops(const graph *g, sp_route_hop *hops, int max_hops)
{
    int len = 0;
    for (int u = g->prev[g->nodes]; u >= 0; u = g->prev[u])
        len++;
    int *path = malloc((size_t)(len > 0 ? len : 1) * sizeof *path), k = len, nh = 0;
    if (!path)
        return -1;
    for (int u = g->prev[g->nodes]; u >= 0; u = g->prev[u])
        path[--k] = u;
    double before = 0;
    for (int p = 0; p < len;) {
        int i = g->span_of[path[p]], q = p;
        while (q + 1 < len && g->span_of[path[q + 1]] == i)
            q++;
        if (nh == max_hops) {
            free(path);
            return -1;
        }
        int b0 = g->lo[i] + path[p] - g->base[i], b1 = g->lo[i] + path[q] - g->base[i];
        double after = q + 1 < len ? g->dist[path[q]] : g->dist[g->nodes];
        hops[nh++] = (sp_route_hop){.server = g->s[g->sel[i]].server, .start = b0, .end = b1, .latency = after - before};
        before = after;
        p = q + 1;
    }
    free(path);
    return nh;
}

int sp_route_min_latency(const sp_route_span *s, int n, int start, int end, long cache_tokens, sp_route_hop *hops,
                         int max_hops, double *cost, int *missing)
{
    *missing = -1;
    *cost = 0;
    if (end <= start)
        return 0;
    int k = 0, *sel = select_spans(s, n, start, end, &k);
    if (!sel)
        return -1;
    int miss = first_missing(s, sel, k, start, end);
    if (miss >= 0) {
        free(sel);
        *missing = miss;
        return -1;
    }
    graph g = {.s = s, .sel = sel, .k = k, .start = start, .end = end, .cache = cache_tokens};
    int nh = -1;
    if (!graph_build(&g) && !dijkstra(&g) && isfinite(g.dist[g.nodes])) {
        nh = path_hops(&g, hops, max_hops);
        *cost = g.dist[g.nodes];
    }
    graph_free(&g);
    free(sel);
    return nh;
}

/* ---------------------------------------------------------------------------------------------- */

int sp_route_max_throughput(const sp_route_span *s, int n, int start, int end, sp_rng *rng, sp_route_hop *hops,
                            int max_hops, int *missing)
{
    *missing = -1;
    int k = 0, *sel = select_spans(s, n, start, end, &k), nh = 0;
    double *w = malloc((size_t)(k > 0 ? k : 1) * sizeof *w);
    if (!sel || !w) {
        free(sel);
        free(w);
        return -1;
    }
    for (int pos = start; pos < end;) {
        double total = 0;
        for (int i = 0; i < k; i++) {
            const sp_route_span *x = &s[sel[i]];
            w[i] = 0;
            if (x->start <= pos && pos < x->end)
                w[i] = (x->throughput > 0 ? x->throughput : x->end - x->start) * (isinf(x->client_rtt) ? 1e-6 : 1);
            total += w[i];
        }
        if (total <= 0 || nh == max_hops) {
            *missing = total <= 0 ? pos : -1;
            nh = -1;
            break;
        }
        double r = sp_rng_f32(rng) * total;
        int pick = -1;
        for (int i = 0; i < k; i++)
            if (w[i] > 0) {
                pick = i;
                if ((r -= w[i]) < 0)
                    break;
            }
        const sp_route_span *x = &s[sel[pick]];
        hops[nh++] = (sp_route_hop){.server = x->server, .start = pos, .end = x->end < end ? x->end : end};
        pos = x->end;
    }
    free(sel);
    free(w);
    return nh;
}
