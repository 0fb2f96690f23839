/* test_routing.c - routes over server spans (client/swarm/routing.h). Min-latency: hand cases (one server,
 * the faster of two chains, the cache penalty, entering a span mid-way, a server used to its span's end,
 * a known slow ping not undercut by the default price, missing blocks, bans and unreachable servers
 * avoided unless they are the only cover, bad input), then an exhaustive search written here from the
 * cost model alone (every chain of spans, by DFS) against sp_route_min_latency on thousands of random
 * small swarms: equal costs, and hops that are a legal chain realising that cost. Max-throughput: the
 * choice frequencies follow the weights (chi-square, fixed seed), and on random swarms the hops cover
 * the range contiguously, each inside its span, avoided spans only where nothing else holds a block. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "routing.h"
#include "testutil.h"

#define MAXS 16

static sp_route_span mk(int server, int start, int end, double rps)
{
    return (sp_route_span){.server = server, .start = start, .end = end, .inference_rps = rps, .throughput = 0,
                           .cache_tokens_left = -1, .client_rtt = -1};
}

static int route(const sp_route_span *s, int n, int start, int end, long need, sp_route_hop *hops, double *cost,
                 int *missing)
{
    return sp_route_min_latency(s, n, start, end, need, hops, 64, cost, missing);
}

#define ENTRY (SP_ROUTE_UNKNOWN_DELAY + SP_ROUTE_OVERHEAD) /* unknown rtt, cache fine */
#define EXIT SP_ROUTE_UNKNOWN_DELAY

static void expect_hop(const sp_route_hop *h, int server, int start, int end)
{
    ck_assert_msg(h->server == server && h->start == start && h->end == end, "hop %d [%d,%d), want %d [%d,%d)",
                  h->server, h->start, h->end, server, start, end);
}

START_TEST(t_single_server)
{
    sp_route_span s[] = {mk(7, 0, 4, 100)};
    sp_route_hop h[8];
    double cost;
    int miss;
    ck_assert_int_eq(route(s, 1, 0, 4, 0, h, &cost, &miss), 1);
    expect_hop(&h[0], 7, 0, 4);
    ck_assert_double_eq_tol(cost, ENTRY + 4 / 100.0 + EXIT, 1e-12);
    ck_assert_double_eq_tol(h[0].latency, cost, 1e-12);
    ck_assert_int_eq(miss, -1);
    s[0].inference_rps = 0; /* unknown: 300 */
    ck_assert_int_eq(route(s, 1, 1, 3, 0, h, &cost, &miss), 1);
    expect_hop(&h[0], 7, 1, 3);
    ck_assert_double_eq_tol(cost, ENTRY + 2 / 300.0 + EXIT, 1e-12);
    s[0].client_rtt = 0.2; /* known: rtt / 2 on entry and exit */
    route(s, 1, 0, 4, 0, h, &cost, &miss);
    ck_assert_double_eq_tol(cost, 0.1 + SP_ROUTE_OVERHEAD + 4 / 300.0 + 0.1, 1e-12);
    s[0].client_rtt = 60; /* capped at 5 s */
    route(s, 1, 0, 4, 0, h, &cost, &miss);
    ck_assert_double_eq_tol(cost, 5 + SP_ROUTE_OVERHEAD + 4 / 300.0 + 5, 1e-12);
    ck_assert_int_eq(route(s, 1, 2, 2, 0, h, &cost, &miss), 0); /* empty range */
}
END_TEST

START_TEST(t_faster_chain_wins)
{
    sp_route_span s[] = {mk(0, 0, 2, 100), mk(1, 2, 4, 100), mk(2, 0, 4, 50)};
    sp_route_hop h[8];
    double cost;
    int miss;
    double chain = ENTRY + 0.02 + ENTRY + 0.02 + EXIT, whole = ENTRY + 4 / 50.0 + EXIT;
    ck_assert(whole < chain);
    ck_assert_int_eq(route(s, 3, 0, 4, 0, h, &cost, &miss), 1);
    expect_hop(&h[0], 2, 0, 4);
    ck_assert_double_eq_tol(cost, whole, 1e-12);
    s[2].inference_rps = 10; /* now the two-server chain is faster */
    ck_assert_int_eq(route(s, 3, 0, 4, 0, h, &cost, &miss), 2);
    expect_hop(&h[0], 0, 0, 2);
    expect_hop(&h[1], 1, 2, 4);
    ck_assert_double_eq_tol(cost, chain, 1e-12);
    ck_assert_double_eq_tol(h[0].latency, ENTRY + 0.02, 1e-12);
    ck_assert_double_eq_tol(h[1].latency, ENTRY + 0.02 + EXIT, 1e-12);
}
END_TEST

START_TEST(t_cache_penalty)
{
    sp_route_span s[] = {mk(0, 0, 2, 100), mk(1, 2, 4, 100), mk(2, 0, 4, 1000)};
    s[2].cache_tokens_left = 100;
    sp_route_hop h[8];
    double cost;
    int miss;
    ck_assert_int_eq(route(s, 3, 0, 4, 100, h, &cost, &miss), 1); /* exactly enough */
    expect_hop(&h[0], 2, 0, 4);
    ck_assert_int_eq(route(s, 3, 0, 4, 101, h, &cost, &miss), 2); /* +10 s: the chain wins */
    expect_hop(&h[0], 0, 0, 2);
    s[0].cache_tokens_left = 0;
    s[1].cache_tokens_left = 0; /* every choice pays: the single penalty is the cheapest */
    ck_assert_int_eq(route(s, 3, 0, 4, 101, h, &cost, &miss), 1);
    ck_assert_double_eq_tol(cost, ENTRY + SP_ROUTE_NO_CACHE + 4 / 1000.0 + EXIT, 1e-12);
    ck_assert(sp_route_has_cache(&s[2], 0) && !sp_route_has_cache(&s[2], 101));
}
END_TEST

/* A server's announced queue wait is paid on entering it: a saturated server loses new sessions to an idle one. */
START_TEST(t_queue_wait)
{
    sp_route_span s[] = {mk(0, 0, 4, 100), mk(1, 0, 4, 80)};
    sp_route_hop h[8];
    double cost;
    int miss;
    ck_assert_int_eq(route(s, 2, 0, 4, 0, h, &cost, &miss), 1);
    expect_hop(&h[0], 0, 0, 4); /* the faster */
    s[0].queue_wait = 0.5;    /* busy: half a second in its queue */
    ck_assert_int_eq(route(s, 2, 0, 4, 0, h, &cost, &miss), 1);
    expect_hop(&h[0], 1, 0, 4);
    ck_assert_double_eq_tol(cost, ENTRY + 4 / 80.0 + EXIT, 1e-12);
    s[1].queue_wait = 0.6; /* both busy: the smaller wait plus its blocks */
    ck_assert_int_eq(route(s, 2, 0, 4, 0, h, &cost, &miss), 1);
    expect_hop(&h[0], 0, 0, 4);
    ck_assert_double_eq_tol(cost, ENTRY + 0.5 + 4 / 100.0 + EXIT, 1e-12);
    s[0].queue_wait = NAN; /* not a wait: none */
    route(s, 2, 0, 4, 0, h, &cost, &miss);
    ck_assert_double_eq_tol(cost, ENTRY + 4 / 100.0 + EXIT, 1e-12);
}
END_TEST

START_TEST(t_enter_mid_span)
{
    sp_route_span s[] = {mk(0, 0, 2, 1000), mk(1, 0, 4, 5)};
    sp_route_hop h[8];
    double cost;
    int miss;
    ck_assert_int_eq(route(s, 2, 0, 4, 0, h, &cost, &miss), 2); /* the slow one only for what it must do */
    expect_hop(&h[0], 0, 0, 2);
    expect_hop(&h[1], 1, 2, 4);
    ck_assert_double_eq_tol(cost, ENTRY + 0.002 + ENTRY + 2 / 5.0 + EXIT, 1e-12);
    ck_assert_int_eq(route(s, 2, 3, 4, 0, h, &cost, &miss), 1); /* a range starting inside a span */
    expect_hop(&h[0], 1, 3, 4);
}
END_TEST

START_TEST(t_used_to_span_end)
{
    /* Leaving the slow A at boundary 2 for B would be cheaper, but A is used to its end (3) first. */
    sp_route_span s[] = {mk(0, 0, 3, 10), mk(1, 2, 4, 1000)};
    sp_route_hop h[8];
    double cost;
    int miss;
    ck_assert_int_eq(route(s, 2, 0, 4, 0, h, &cost, &miss), 2);
    expect_hop(&h[0], 0, 0, 3);
    expect_hop(&h[1], 1, 3, 4);
    ck_assert_double_eq_tol(cost, ENTRY + 0.3 + ENTRY + 0.001 + EXIT, 1e-12);
}
END_TEST

START_TEST(t_known_pings)
{
    /* A is faster than D, but A's known ping to B (2 s, so 1 s of delay) is slower than the default 0.15:
     * the default price must not undercut it. */
    sp_route_next a_to_b = {.server = 1, .rtt = 2.0};
    sp_route_span s[] = {mk(0, 0, 2, 1000), mk(1, 2, 4, 1000), mk(3, 0, 2, 100)};
    s[0].next = &a_to_b;
    s[0].nnext = 1;
    sp_route_hop h[8];
    double cost;
    int miss;
    ck_assert_int_eq(route(s, 3, 0, 4, 0, h, &cost, &miss), 2);
    expect_hop(&h[0], 3, 0, 2);
    ck_assert_double_eq_tol(cost, ENTRY + 0.02 + ENTRY + 0.002 + EXIT, 1e-12);
    a_to_b.rtt = 0.01; /* a fast known ping: A, at 0.005 s of delay */
    ck_assert_int_eq(route(s, 3, 0, 4, 0, h, &cost, &miss), 2);
    expect_hop(&h[0], 0, 0, 2);
    ck_assert_double_eq_tol(cost, ENTRY + 0.002 + 0.005 + SP_ROUTE_OVERHEAD + 0.002 + EXIT, 1e-12);
    a_to_b.rtt = -1; /* unknown: as if absent */
    route(s, 3, 0, 4, 0, h, &cost, &miss);
    ck_assert_double_eq_tol(cost, ENTRY + 0.002 + ENTRY + 0.002 + EXIT, 1e-12);
    sp_route_next two[] = {{.server = 1, .rtt = 4.0}, {.server = 1, .rtt = 0.01}}; /* the first known entry wins */
    s[0].next = two;
    s[0].nnext = 2;
    route(s, 3, 0, 4, 0, h, &cost, &miss);
    expect_hop(&h[0], 3, 0, 2);
}
END_TEST

START_TEST(t_missing_block)
{
    sp_route_span s[] = {mk(0, 0, 2, 100), mk(1, 3, 5, 100)};
    sp_route_hop h[8];
    double cost = 1;
    int miss;
    ck_assert_int_eq(route(s, 2, 0, 5, 0, h, &cost, &miss), -1);
    ck_assert_int_eq(miss, 2);
    ck_assert_double_eq(cost, 0);
    ck_assert_int_eq(route(s, 2, 3, 6, 0, h, &cost, &miss), -1);
    ck_assert_int_eq(miss, 5);
    ck_assert_int_eq(route(s, 0, 0, 1, 0, h, &cost, &miss), -1);
    ck_assert_int_eq(miss, 0);
    s[0].banned = 1; /* banned is not missing */
    ck_assert_int_eq(route(s, 2, 0, 2, 0, h, &cost, &miss), 1);
    int seed_miss;
    sp_rng r;
    sp_rng_seed(&r, 1);
    ck_assert_int_eq(sp_route_max_throughput(s, 2, 0, 5, &r, h, 8, &seed_miss), -1);
    ck_assert_int_eq(seed_miss, 2);
}
END_TEST

START_TEST(t_bans)
{
    sp_route_span s[] = {mk(0, 0, 4, 1000), mk(1, 0, 4, 10)};
    s[0].banned = 1;
    sp_route_hop h[8];
    double cost;
    int miss;
    ck_assert_int_eq(route(s, 2, 0, 4, 0, h, &cost, &miss), 1);
    expect_hop(&h[0], 1, 0, 4); /* avoided although faster */
    s[1].banned = 1;            /* every cover banned: bans ignored */
    ck_assert_int_eq(route(s, 2, 0, 4, 0, h, &cost, &miss), 1);
    expect_hop(&h[0], 0, 0, 4);
    ck_assert_double_eq_tol(cost, ENTRY + 0.004 + EXIT, 1e-12);
    /* banned A is the only cover of blocks 2..3: it takes part (whole), the others still do */
    sp_route_span t[] = {mk(0, 0, 4, 10), mk(1, 0, 2, 1000)};
    t[0].banned = 1;
    ck_assert_int_eq(route(t, 2, 0, 4, 0, h, &cost, &miss), 2);
    expect_hop(&h[0], 1, 0, 2);
    expect_hop(&h[1], 0, 2, 4);
}
END_TEST

START_TEST(t_unreachable)
{
    sp_route_span s[] = {mk(0, 0, 4, 1000), mk(1, 0, 4, 10)};
    s[0].client_rtt = INFINITY;
    sp_route_hop h[8];
    double cost;
    int miss;
    ck_assert_int_eq(route(s, 2, 0, 4, 0, h, &cost, &miss), 1);
    expect_hop(&h[0], 1, 0, 4);
    ck_assert_int_eq(route(s, 1, 0, 4, 0, h, &cost, &miss), 1); /* the only cover: used, at 5 s each way */
    expect_hop(&h[0], 0, 0, 4);
    ck_assert_double_eq_tol(cost, 5 + SP_ROUTE_OVERHEAD + 0.004 + 5, 1e-12);
    sp_rng r;
    sp_rng_seed(&r, 3);
    for (int i = 0; i < 200; i++) {
        ck_assert_int_eq(sp_route_max_throughput(s, 2, 0, 4, &r, h, 8, &miss), 1);
        ck_assert_int_eq(h[0].server, 1);
    }
}
END_TEST

START_TEST(t_bad_input)
{
    sp_route_span s[] = {mk(0, 0, 1, 100), mk(1, 1, 2, 100), mk(2, 2, 3, 100)};
    sp_route_hop h[8];
    double cost;
    int miss;
    ck_assert_int_eq(sp_route_min_latency(s, 3, 0, 3, 0, h, 2, &cost, &miss), -1); /* needs 3 hops */
    ck_assert_int_eq(miss, -1);
    ck_assert_int_eq(sp_route_min_latency(s, 3, 0, 3, 0, h, 3, &cost, &miss), 3);
    sp_rng r;
    sp_rng_seed(&r, 1);
    ck_assert_int_eq(sp_route_max_throughput(s, 3, 0, 3, &r, h, 2, &miss), -1);
    ck_assert_int_eq(miss, -1);
    s[2].server = 0; /* repeated server index */
    ck_assert_int_eq(sp_route_min_latency(s, 3, 0, 3, 0, h, 8, &cost, &miss), -1);
    ck_assert_int_eq(miss, -1);
    s[2].server = -4;
    ck_assert_int_eq(sp_route_min_latency(s, 3, 0, 3, 0, h, 8, &cost, &miss), -1);
    ck_assert_double_eq(sp_route_delay(NAN), SP_ROUTE_UNKNOWN_DELAY);
    ck_assert_double_eq(sp_route_delay(INFINITY), SP_ROUTE_MAX_DELAY);
}
END_TEST

/* The relayed model: each span entered costs the client's whole round trip to it (unknown: 0.3 s) plus the
 * overhead, the servers' next pings do not count, the exit is free; measured seconds per block beat the rate. */
START_TEST(t_relayed)
{
    const sp_route_model m = {.relayed = 1, .overhead = 0.0003};
    sp_route_span s[] = {mk(0, 0, 4, 1000), mk(1, 0, 2, 1000), mk(2, 2, 4, 1000)};
    sp_route_hop h[8];
    double cost;
    int miss;
    s[0].client_rtt = 0.002;
    ck_assert_int_eq(sp_route_min_latency_model(s, 1, 0, 4, 0, &m, h, 8, &cost, &miss), 1);
    ck_assert_double_eq_tol(cost, 0.002 + 0.0003 + 4 / 1000.0, 1e-12);
    ck_assert_double_eq_tol(h[0].latency, cost, 1e-12);
    s[0].client_rtt = -1; /* unknown: a round trip of 2 x 0.15 s */
    sp_route_min_latency_model(s, 1, 0, 4, 0, &m, h, 8, &cost, &miss);
    ck_assert_double_eq_tol(cost, 0.3 + 0.0003 + 4 / 1000.0, 1e-12);
    s[0].block_s = 0.01; /* measured: 10 ms a block */
    sp_route_min_latency_model(s, 1, 0, 4, 0, &m, h, 8, &cost, &miss);
    ck_assert_double_eq_tol(cost, 0.3 + 0.0003 + 0.04, 1e-12);
    /* two hops: two round trips from the client; 1's next ping to 2 (slow) plays no part */
    sp_route_next slow = {.server = 2, .rtt = 4};
    s[1].client_rtt = 0.001, s[2].client_rtt = 0.004;
    s[1].next = &slow, s[1].nnext = 1;
    ck_assert_int_eq(sp_route_min_latency_model(s + 1, 2, 0, 4, 0, &m, h, 8, &cost, &miss), 2);
    ck_assert_double_eq_tol(cost, 0.001 + 0.0003 + 0.002 + 0.004 + 0.0003 + 0.002, 1e-12);
    ck_assert_double_eq_tol(h[0].latency, 0.001 + 0.0003 + 0.002, 1e-12);
    ck_assert_double_eq_tol(h[1].latency, 0.004 + 0.0003 + 0.002, 1e-12);
    /* Petals' model prices the same chain with the slow ping: 2 s for the switch */
    ck_assert_int_eq(sp_route_min_latency(s + 1, 2, 0, 4, 0, h, 8, &cost, &miss), 2);
    ck_assert_double_eq_tol(cost, 0.0005 + 0.018 + 0.002 + 2 + 0.018 + 0.002 + 0.002, 1e-12);
    /* one server for all blocks beats two round trips once its rtt is the smaller sum */
    s[0].block_s = 0, s[0].client_rtt = 0.004;
    ck_assert_int_eq(sp_route_min_latency_model(s, 3, 0, 4, 0, &m, h, 8, &cost, &miss), 1);
    ck_assert_int_eq(h[0].server, 0);
    s[0].client_rtt = 0.006;
    ck_assert_int_eq(sp_route_min_latency_model(s, 3, 0, 4, 0, &m, h, 8, &cost, &miss), 2);
    ck_assert_double_eq(sp_route_relay_delay(INFINITY), 10);
    ck_assert_double_eq(sp_route_relay_delay(NAN), 0.3);
}
END_TEST

/* The pushed model: client -> first server, the first's measured link to the next, the last back to the client.
 * Two candidates for the second span at the same distance from the client: the one the first server reaches in
 * 5 ms wins over the one 40 ms away, which relaying could not tell apart; a switch with no known ping costs the
 * client's one-way delay to the target. */
START_TEST(t_pushed)
{
    const sp_route_model m = {.relayed = 0, .overhead = 0, .guess_switch = 1};
    sp_route_span s[] = {mk(0, 0, 2, 1000), mk(1, 2, 4, 1000), mk(2, 2, 4, 1000)};
    sp_route_next pings[] = {{.server = 1, .rtt = 0.080}, {.server = 2, .rtt = 0.010}};
    sp_route_hop h[8];
    double cost;
    int miss;
    s[0].client_rtt = s[1].client_rtt = s[2].client_rtt = 0.050;
    s[0].next = pings, s[0].nnext = 2;
    ck_assert_int_eq(sp_route_min_latency_model(s, 3, 0, 4, 0, &m, h, 8, &cost, &miss), 2);
    ck_assert_int_eq(h[1].server, 2);
    ck_assert_double_eq_tol(cost, 0.025 + 0.002 + 0.005 + 0.002 + 0.025, 1e-12);
    pings[1].rtt = 0.120; /* now 1 is the near one */
    sp_route_min_latency_model(s, 3, 0, 4, 0, &m, h, 8, &cost, &miss);
    ck_assert_int_eq(h[1].server, 1);
    s[0].nnext = 0; /* no pings known: each switch guessed at the target's client delay */
    s[2].client_rtt = 0.030;
    sp_route_min_latency_model(s, 3, 0, 4, 0, &m, h, 8, &cost, &miss);
    ck_assert_int_eq(h[1].server, 2);
    ck_assert_double_eq_tol(cost, 0.025 + 0.002 + 0.015 + 0.002 + 0.015, 1e-12);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* the exhaustive reference: the cost model of routing.h, written again from its comment */

typedef struct swarm {
    int n, L, start, end;
    long need;
    sp_route_span s[MAXS];
    sp_route_next nx[MAXS][2 * MAXS];
    double ping[MAXS][MAXS]; /* ping[i][j] by array index: the first known entry, or -1 */
    int usable[MAXS];
} swarm;

static double unif(sp_rng *r) { return sp_rng_u32(r) / 4294967296.0; }
static int pick(sp_rng *r, int n) { return (int)(sp_rng_u32(r) % (uint32_t)n); }

static double random_rtt(sp_rng *r)
{
    double u = unif(r);
    return u < 0.3 ? -1 : u < 0.35 ? INFINITY : u < 0.45 ? 8 + 20 * unif(r) : 0.6 * unif(r);
}

static void random_swarm(swarm *w, sp_rng *r)
{
    memset(w, 0, sizeof *w);
    w->n = 1 + pick(r, 8);
    if (pick(r, 2) && w->n < 4)
        w->n += 4;
    w->L = 1 + pick(r, 6);
    w->start = pick(r, w->L);
    w->end = w->start + 1 + pick(r, w->L - w->start);
    w->need = pick(r, 3) ? pick(r, 200) : 0;
    int sparse = pick(r, 2); /* server indices the router maps by a table, or by binary search */
    for (int i = 0; i < w->n; i++) {
        sp_route_span *x = &w->s[i];
        int a = pick(r, w->L), b = a + 1 + pick(r, pick(r, 2) && w->L - a > 2 ? 2 : w->L - a); /* short ones often */
        double u = unif(r);
        *x = (sp_route_span){.server = sparse ? 1000003 + 7919 * i : 3 * i + 1, /* not the array index */
                             .start = a, .end = b,
                             .inference_rps = u < 0.2 ? 0 : u < 0.25 ? -3 : 5 + 1000 * unif(r),
                             .throughput = pick(r, 4) ? 1 + 99 * unif(r) : 0,
                             .cache_tokens_left = pick(r, 4) ? pick(r, 250) : -1,
                             .client_rtt = unif(r) < 0.1 ? INFINITY : random_rtt(r),
                             .banned = unif(r) < 0.15};
        if (pick(r, 4) == 0) /* measured by the caller */
            x->block_s = 0.01 * unif(r);
        if (x->client_rtt == INFINITY && x->banned && pick(r, 2))
            x->banned = 0;
    }
    for (int i = 0; i < w->n; i++) {
        for (int j = 0; j < w->n; j++)
            w->ping[i][j] = -1;
        int m = 0;
        for (int j = 0; j < w->n; j++) {
            if (unif(r) < 0.4) {
                double rtt = random_rtt(r);
                w->nx[i][m++] = (sp_route_next){.server = w->s[j].server, .rtt = rtt};
                if (w->ping[i][j] < 0 && rtt >= 0)
                    w->ping[i][j] = rtt;
            }
            if (unif(r) < 0.1) { /* a repeated entry: counts only if none known before */
                double rtt = random_rtt(r);
                w->nx[i][m++] = (sp_route_next){.server = w->s[j].server, .rtt = rtt};
                if (w->ping[i][j] < 0 && rtt >= 0)
                    w->ping[i][j] = rtt;
            }
        }
        if (pick(r, 8) == 0)
            w->nx[i][m++] = (sp_route_next){.server = 999, .rtt = 0.001}; /* a server not in the table */
        w->s[i].next = w->nx[i];
        w->s[i].nnext = m;
    }
}

static int is_avoided(const sp_route_span *x) { return x->banned || x->client_rtt == INFINITY; }
static int holds(const sp_route_span *x, int b) { return x->start <= b && b < x->end; }

/* Marks the usable spans; returns the first block nothing holds, or -1. */
static int ref_usable(swarm *w)
{
    int missing = -1;
    for (int i = 0; i < w->n; i++)
        w->usable[i] = 0;
    for (int b = w->start; b < w->end; b++) {
        int plain = 0, any = 0;
        for (int i = 0; i < w->n; i++) {
            plain |= holds(&w->s[i], b) && !is_avoided(&w->s[i]);
            any |= holds(&w->s[i], b);
        }
        if (!any && missing < 0)
            missing = b;
        for (int i = 0; i < w->n; i++)
            if (holds(&w->s[i], b) && (!is_avoided(&w->s[i]) || !plain))
                w->usable[i] = 1;
    }
    return missing;
}

/* The model the reference prices chains with: Petals' (servers pass steps on), or relayed by the client. */
static sp_route_model ref_model = {.relayed = 0, .overhead = 0.018};

static double delay(double rtt) { return !(rtt >= 0) ? 0.15 : fmin(rtt / 2, 5); }
static double rps_cost(const sp_route_span *x)
{
    return x->block_s > 0 ? x->block_s : 1 / (x->inference_rps > 0 ? x->inference_rps : 300);
}

/* Entering span j after a hop of this rtt (Petals: a known ping, or the client's for the first; relayed: the
 * client's round trip to j, whatever rtt says). */
static double enter(const swarm *w, int j, double rtt)
{
    const sp_route_span *x = &w->s[j];
    int cache = w->need <= 0 || x->cache_tokens_left < 0 || w->need <= x->cache_tokens_left;
    if (!(rtt >= 0) && ref_model.guess_switch) /* pushed: an unknown switch guessed from the client's link */
        rtt = x->client_rtt;
    double d = ref_model.relayed ? (!(x->client_rtt >= 0) ? 0.3 : fmin(x->client_rtt, 10)) : delay(rtt);
    return d + ref_model.overhead + (cache ? 0 : 10);
}

static double leave(const sp_route_span *x) { return ref_model.relayed ? 0 : delay(x->client_rtt); }

/* Every chain from span i entered at block e with cost c so far. */
static void dfs(const swarm *w, int i, int e, double c, double *best)
{
    const sp_route_span *x = &w->s[i];
    int hi = x->end < w->end ? x->end : w->end;
    c += (hi - e) * rps_cost(x);
    if (x->end >= w->end) {
        *best = fmin(*best, c + leave(x));
        return;
    }
    for (int j = 0; j < w->n; j++)
        if (j != i && w->usable[j] && holds(&w->s[j], x->end))
            dfs(w, j, x->end, c + enter(w, j, w->ping[i][j]), best);
}

static int index_of(const swarm *w, int server)
{
    for (int i = 0; i < w->n; i++)
        if (w->s[i].server == server)
            return i;
    return -1;
}

/* The cost of the hops under the model, checking they form a legal chain. */
static double chain_cost(const swarm *w, const sp_route_hop *h, int nh)
{
    double total = 0;
    ck_assert_int_ge(nh, 1);
    for (int k = 0, prev = -1; k < nh; k++) {
        int i = index_of(w, h[k].server);
        ck_assert_int_ge(i, 0);
        const sp_route_span *x = &w->s[i];
        ck_assert(w->usable[i]);
        ck_assert_int_eq(h[k].start, k ? h[k - 1].end : w->start);
        ck_assert(x->start <= h[k].start && h[k].start < h[k].end && h[k].end <= x->end);
        ck_assert_int_eq(h[k].end, x->end < w->end ? x->end : w->end); /* used to its span's end */
        double c = enter(w, i, k ? w->ping[prev][i] : x->client_rtt);
        for (int b = h[k].start; b < h[k].end; b++)
            c += rps_cost(x);
        if (k == nh - 1) {
            ck_assert_int_eq(h[k].end, w->end);
            c += leave(x);
        }
        ck_assert_msg(fabs(c - h[k].latency) < 1e-9, "hop %d latency %.12f, want %.12f", k, h[k].latency, c);
        total += c;
        prev = i;
    }
    return total;
}

/* Random swarms routed under model m (NULL: sp_route_min_latency, Petals'), against the reference's DFS. */
static void exhaustive(const sp_route_model *m, int iterations)
{
    ref_model = m ? *m : (sp_route_model){.relayed = 0, .overhead = 0.018};
    sp_rng r;
    sp_rng_seed(&r, 20261124);
    int routed = 0, missed = 0, multi = 0, avoided_used = 0;
    for (int it = 0; it < iterations; it++) {
        swarm w;
        random_swarm(&w, &r);
        int want_missing = ref_usable(&w);
        sp_route_hop h[64];
        double cost;
        int miss, nh = m ? sp_route_min_latency_model(w.s, w.n, w.start, w.end, w.need, m, h, 64, &cost, &miss)
                         : sp_route_min_latency(w.s, w.n, w.start, w.end, w.need, h, 64, &cost, &miss);
        if (want_missing >= 0) {
            ck_assert_msg(nh == -1 && miss == want_missing, "case %d: %d, missing %d, want -1, %d", it, nh, miss,
                          want_missing);
            missed++;
            continue;
        }
        double best = INFINITY;
        for (int i = 0; i < w.n; i++)
            if (w.usable[i] && holds(&w.s[i], w.start))
                dfs(&w, i, w.start, enter(&w, i, w.s[i].client_rtt), &best);
        ck_assert_msg(nh >= 1 && miss == -1, "case %d: %d hops", it, nh);
        ck_assert_msg(fabs(cost - best) < 1e-9, "case %d: cost %.12f, exhaustive %.12f", it, cost, best);
        ck_assert_msg(fabs(chain_cost(&w, h, nh) - cost) < 1e-9, "case %d: hops do not realise the cost", it);
        routed++;
        multi += nh > 1;
        for (int k = 0; k < nh; k++)
            avoided_used += is_avoided(&w.s[index_of(&w, h[k].server)]);
    }
    printf("exhaustive (%s): %d routed (%d over several servers, %d hops on avoided spans), %d missing\n",
           ref_model.relayed ? "relayed" : ref_model.guess_switch ? "pushed" : "Petals'", routed, multi, avoided_used, missed);
    /* the random cases reach every kind of outcome */
    ck_assert_int_gt(routed, iterations * 2 / 3);
    ck_assert_int_gt(missed, iterations / 12);
    ck_assert_int_gt(multi, iterations / 12);
    ck_assert_int_gt(avoided_used, iterations / 20);
}

START_TEST(t_exhaustive) { exhaustive(NULL, 60000); }
END_TEST

/* The relayed model (the client makes a round trip to each server of the chain): the same search. */
START_TEST(t_exhaustive_relayed)
{
    sp_route_model m = {.relayed = 1, .overhead = 0.0003};
    exhaustive(&m, 30000);
}
END_TEST

/* The pushed model (servers pass steps on; a switch without a known ping guessed from the client's): the same. */
START_TEST(t_exhaustive_pushed)
{
    sp_route_model m = {.relayed = 0, .overhead = 0, .guess_switch = 1};
    exhaustive(&m, 30000);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* max-throughput */

START_TEST(t_throughput_frequencies)
{
    /* weights 1, 2, 3, 4 (throughput 0: the span length), 4e-6 (unreachable); banned: never */
    sp_route_span s[6];
    double tp[] = {1, 2, 3, 0, 4, 100};
    for (int i = 0; i < 6; i++) {
        s[i] = mk(i, 0, 4, 100);
        s[i].throughput = tp[i];
    }
    s[4].client_rtt = INFINITY;
    s[5].banned = 1;
    sp_rng r;
    sp_rng_seed(&r, 42);
    enum { N = 40000 };
    int count[6] = {0};
    sp_route_hop h[8];
    for (int t = 0; t < N; t++) {
        int miss;
        ck_assert_int_eq(sp_route_max_throughput(s, 6, 0, 4, &r, h, 8, &miss), 1);
        expect_hop(&h[0], h[0].server, 0, 4);
        count[h[0].server]++;
    }
    double chi2 = 0, wsum = 1 + 2 + 3 + 4 + 4e-6;
    for (int i = 0; i < 4; i++) {
        double e = N * (i + 1) / wsum;
        chi2 += (count[i] - e) * (count[i] - e) / e;
    }
    ck_assert_msg(chi2 < 16.27, "chi-square %.2f over 3 degrees of freedom (p = 0.001 at 16.27)", chi2);
    ck_assert_int_le(count[4], 1); /* expected 0.016 */
    ck_assert_int_eq(count[5], 0);
}
END_TEST

START_TEST(t_throughput_walks)
{
    sp_rng r, rr;
    sp_rng_seed(&r, 7);
    sp_rng_seed(&rr, 8);
    int walked = 0;
    for (int it = 0; it < 20000; it++) {
        swarm w;
        random_swarm(&w, &r);
        int want_missing = ref_usable(&w), miss;
        sp_route_hop h[64];
        int nh = sp_route_max_throughput(w.s, w.n, w.start, w.end, &rr, h, 64, &miss);
        if (want_missing >= 0) {
            ck_assert_int_eq(nh, -1);
            ck_assert_int_eq(miss, want_missing);
            continue;
        }
        ck_assert_int_ge(nh, 1);
        for (int k = 0; k < nh; k++) {
            int i = index_of(&w, h[k].server);
            ck_assert_int_ge(i, 0);
            ck_assert(w.usable[i]); /* an avoided span only where a block has no other cover */
            ck_assert_int_eq(h[k].start, k ? h[k - 1].end : w.start);
            ck_assert(holds(&w.s[i], h[k].start));
            ck_assert_int_eq(h[k].end, w.s[i].end < w.end ? w.s[i].end : w.end);
        }
        ck_assert_int_eq(h[nh - 1].end, w.end);
        walked++;
    }
    ck_assert_int_gt(walked, 10000);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("routing");
    TCase *tc = tcase_create("min_latency");
    tcase_set_timeout(tc, 60); /* the exhaustive searches take seconds on a busy machine */
    tcase_add_test(tc, t_single_server);
    tcase_add_test(tc, t_faster_chain_wins);
    tcase_add_test(tc, t_cache_penalty);
    tcase_add_test(tc, t_queue_wait);
    tcase_add_test(tc, t_enter_mid_span);
    tcase_add_test(tc, t_used_to_span_end);
    tcase_add_test(tc, t_known_pings);
    tcase_add_test(tc, t_missing_block);
    tcase_add_test(tc, t_bans);
    tcase_add_test(tc, t_unreachable);
    tcase_add_test(tc, t_bad_input);
    tcase_add_test(tc, t_relayed);
    tcase_add_test(tc, t_pushed);
    tcase_add_test(tc, t_exhaustive);
    tcase_add_test(tc, t_exhaustive_relayed);
    tcase_add_test(tc, t_exhaustive_pushed);
    suite_add_tcase(s, tc);
    TCase *mt = tcase_create("max_throughput");
    tcase_add_test(mt, t_throughput_frequencies);
    tcase_add_test(mt, t_throughput_walks);
    suite_add_tcase(s, mt);
    return sp_test_run(s);
}
