/* routing.h - routes over server spans, as pure functions (no network, no globals, no threads): Petals'
 * min-latency route for inference sessions and its max-throughput route for training
 * (reference/petals-internals.md §4.4, §4.5, §9.6), over arrays the runtime builds from what it knows of
 * the servers.
 *
 * Min-latency cost of a chain, in expected seconds per step: entering server p (at the chain's first
 * block, or at a block boundary after another server's span ended) costs delay(rtt) + 0.018 s, plus 10 s
 * when p lacks cache for the session; each block costs 1 / inference_rps; leaving the last server costs
 * delay(its client rtt). delay(rtt) = 0.15 s when unknown (< 0 or NaN), else min(rtt / 2, 5 s). The rtt
 * of a switch is what the previous server announced for the next (its next pings), of the entry and the
 * exit the client's own ping. A server may be entered in the middle of its span, but is used to the end of
 * its span before the chain moves on (Petals: keeps the graph small).
 *
 * That is Petals' model, where a server passes its output on to the next. A client that relays every hop itself
 * (sepal's sessions: each step is a round trip from the client to each server in turn) uses the relayed model
 * (sp_route_model): entering a span costs the client's whole round trip to that server plus the model's
 * overhead (unknown: 2 x 0.15 s; unreachable: 2 x 5 s), the servers' next pings play no part, and the exit
 * costs nothing. A client whose servers push (sepal's `set push`) prices chains with Petals' model, without its
 * overhead and guessing an unknown switch from the client's ping (guess_switch). Either way a span's blocks cost its measured seconds per block when the caller knows them
 * (block_s), else 1 / inference_rps.
 *
 * Entering a span also costs the wait its server announces for its queue (queue_wait): a saturated server's
 * steps wait, and new sessions go elsewhere while another holds the blocks.
 *
 * Which spans take part (both routes): a span that is banned, or that the client cannot reach
 * (client_rtt == +INFINITY), is "avoided": left out unless it holds some block of the range that no
 * other span holds (Petals' "drop banned peers unless that would leave the block with no servers").
 * An avoided span let in this way takes part whole, at its ordinary cost (an unreachable entry costs
 * delay(inf) = 5 s; max-throughput weights it 1e-6). */
#ifndef SEPAL_ROUTING_H
#define SEPAL_ROUTING_H

#include "rng.h"

#define SP_ROUTE_DEFAULT_RPS 300.0
#define SP_ROUTE_OVERHEAD 0.018
#define SP_ROUTE_UNKNOWN_DELAY 0.15
#define SP_ROUTE_MAX_DELAY 5.0
#define SP_ROUTE_NO_CACHE 10.0
#define SP_ROUTE_UNREACHABLE_WEIGHT 1e-6

/* A server's announced round trip to another server (one of its next pings). */
typedef struct sp_route_next {
    int server; /* the other's caller index */
    double rtt; /* seconds; < 0 or NaN: unknown (as if absent) */
} sp_route_next;

typedef struct sp_route_span {
    int server;             /* caller's index, >= 0 and unique per span; returned in hops */
    int start, end;         /* blocks [start, end) served */
    double inference_rps;   /* per-block single-token steps/s; <= 0: unknown (SP_ROUTE_DEFAULT_RPS) */
    double block_s;         /* seconds a block of it takes in a single-token step, as the caller measured
                               them; <= 0: unknown (1 / inference_rps) */
    double throughput;      /* tokens/s per block; max-throughput routing's weight (<= 0: span length) */
    long cache_tokens_left; /* positions a session over this whole span can still get; < 0: unknown */
    double queue_wait;      /* seconds its steps wait in its queue now (its load; entering it costs that too);
                               <= 0 or not finite: none */
    double client_rtt;      /* seconds; < 0: unknown; INFINITY: unreachable (avoided) */
    int banned;             /* avoided */
    const sp_route_next *next; /* its next pings (may be NULL); ping(this -> x) is the rtt of the first
                                  entry naming x with a known rtt, else unknown */
    int nnext;
} sp_route_span;

/* How a step travels along the chain (the min-latency cost model; see above). */
typedef struct sp_route_model {
    int relayed;     /* 0: Petals' (servers pass the step on); 1: the client relays every hop */
    double overhead; /* seconds per span entered besides the round trips (Petals: SP_ROUTE_OVERHEAD) */
    int guess_switch; /* not relayed: a switch with no known ping costs delay(the target's client rtt), the link
                         from the client standing in for the one from the previous server (0: Petals' 0.15 s) */
} sp_route_model;

typedef struct sp_route_hop {
    int server, start, end; /* blocks [start, end) on that server */
    double latency; /* expected seconds of this hop per step: its entry edge and its blocks (the last hop
                       also the exit); the hops' latencies sum to the route's cost */
} sp_route_hop;

/* The min-latency route over blocks [start, end) for a session needing cache_tokens positions (<= 0: no
 * need): Dijkstra over Petals' graph, exact, in O((N + P) log N) for N spans and P known pings (not
 * over all pairs of spans at each boundary; see routing.c). s is read only; hops has room for max_hops.
 * Returns the number of hops (0 when end <= start) with *cost the expected seconds per step (1/cost is
 * steps/s) and *missing = -1. Returns -1 with *missing the first block of the range that no span holds,
 * or with *missing = -1 when the route needs more than max_hops hops or a server index is negative or
 * repeated; -2 when out of memory. *cost is 0 on failure. */
int sp_route_min_latency(const sp_route_span *s, int n, int start, int end, long cache_tokens, sp_route_hop *hops,
                         int max_hops, double *cost, int *missing);
/* The same under another cost model m (sp_route_min_latency: Petals', {0, SP_ROUTE_OVERHEAD}). */
int sp_route_min_latency_model(const sp_route_span *s, int n, int start, int end, long cache_tokens,
                               const sp_route_model *m, sp_route_hop *hops, int max_hops, double *cost, int *missing);

/* A max-throughput route over [start, end) (training, forward; Petals' greedy walk): from each position
 * one of the spans holding it, drawn from rng with probability proportional to its weight = throughput
 * (span length when throughput is not a positive finite number), times SP_ROUTE_UNREACHABLE_WEIGHT when
 * unreachable; the hop is the span clipped to [position, end) and the walk goes on from the span's end.
 * hops[].latency is 0. Returns the number of hops, -1 (*missing as above) or -2 (out of memory). */
int sp_route_max_throughput(const sp_route_span *s, int n, int start, int end, sp_rng *rng, sp_route_hop *hops,
                            int max_hops, int *missing);

/* The pieces of the cost model, for tests and the router's callers. */
double sp_route_delay(double rtt);
double sp_route_relay_delay(double rtt); /* the relayed model's: the whole round trip (see above) */
int sp_route_has_cache(const sp_route_span *s, long cache_tokens);

#endif
