/* routing.h - routes over server spans, as pure functions (no network, no state): Petals' min-latency route
 * for inference sessions and its max-throughput route for training (reference/petals-internals.md §4.4,
 * §4.5, §9.6), over arrays the runtime builds from what it knows of the servers.
 *
 * Min-latency cost of a chain, in expected seconds per step: entering server p (at the chain's first
 * block, or at a block boundary after another server's span ended) costs delay(rtt) + 0.018 s, plus 10 s
 * when p lacks cache for the session; each block costs 1 / inference_rps; leaving the last server costs
 * delay(its client rtt). delay(rtt) = 0.15 s when unknown, else min(rtt / 2, 5 s). The rtt of a switch is
 * what the previous server announced for the next (its next pings), of the entry and the exit the
 * client's own ping. A server is used to the end of its span before the chain moves on.
 *
 * Bans (Petals): a banned span is left out unless some block of the range has no other cover. */
#ifndef SEPAL_ROUTING_H
#define SEPAL_ROUTING_H

#include "rng.h"

#define SP_ROUTE_DEFAULT_RPS 300.0
#define SP_ROUTE_OVERHEAD 0.018
#define SP_ROUTE_UNKNOWN_DELAY 0.15
#define SP_ROUTE_NO_CACHE 10.0

/* A server's announced round trip to another server (its next pings). */
typedef struct sp_route_next {
    int server; /* the other's caller index */
    double rtt; /* seconds */
} sp_route_next;

typedef struct sp_route_span {
    int server;             /* caller's index (unique per span), returned in hops */
    int start, end;         /* blocks [start, end) served */
    double inference_rps;   /* per-block single-token steps/s; <= 0: unknown (SP_ROUTE_DEFAULT_RPS) */
    double throughput;      /* tokens/s per block; max-throughput routing's weight (<= 0: span length) */
    long cache_tokens_left; /* positions a session over this span can still get; < 0: unknown */
    double client_rtt;      /* seconds; < 0: unknown; INFINITY: unreachable */
    int banned;
    const sp_route_next *next; /* its next pings (may be NULL) */
    int nnext;
} sp_route_span;

typedef struct sp_route_hop {
    int server, start, end;
    double latency; /* expected seconds of this hop per step: its entry, its blocks (and the exit, last hop) */
} sp_route_hop;

/* The min-latency route over [start, end) for sessions needing cache_tokens positions (0: no need).
 * Returns the number of hops (<= max_hops) with *cost the expected seconds per step, or -1 with *missing
 * the first block no span covers (-1 when the route would need more than max_hops hops). */
int sp_route_min_latency(const sp_route_span *s, int n, int start, int end, long cache_tokens, sp_route_hop *hops,
                         int max_hops, double *cost, int *missing);

/* A max-throughput route over [start, end) (training, forward): from each position one of the spans
 * holding it, at random with probability proportional to its throughput (times 1e-6 when unreachable),
 * clipped to [position, end). Returns the number of hops or -1 (*missing as above). */
int sp_route_max_throughput(const sp_route_span *s, int n, int start, int end, sp_rng *rng, sp_route_hop *hops,
                            int max_hops, int *missing);

/* The pieces of the cost model, for tests and the router's callers. */
double sp_route_delay(double rtt);
int sp_route_has_cache(const sp_route_span *s, long cache_tokens);

#endif
