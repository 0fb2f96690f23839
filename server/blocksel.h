/* blocksel.h - which blocks a server should hold (Petals' block selection and rebalancing,
 * reference/petals-internals.md §6.4), as pure functions over the swarm's spans.
 *
 * The swarm's throughput at block i is the sum of the throughputs of the servers holding i; a server
 * chooses the k blocks whose sorted throughputs are lexicographically smallest (the weakest spot first),
 * and moves when, after it and then every other server (in random order) re-chose greedily, the swarm's
 * bottleneck would rise by more than 1/balance_quality. */
#ifndef SEPAL_BLOCKSEL_H
#define SEPAL_BLOCKSEL_H

#include "rng.h"

typedef struct sp_blk_span {
    int start, end;     /* blocks held, [start, end) */
    double throughput;  /* tokens/s it offers per block */
    const char *id;     /* servers are summed in id order, so every server computes the same floats */
} sp_blk_span;

/* tp[i], i < L: the summed throughput of the spans holding block i (callers pass JOINING and ONLINE
 * servers only; spans are clipped to [0, L)). Spans are added in id order (ties: array order), so every
 * server computes the same floats whatever order its view lists them in. */
void sp_blocksel_throughputs(const sp_blk_span *s, int n, int L, double *tp);
/* The start of the best k blocks: the window of tp whose sorted values are lexicographically smallest
 * (the lowest bottleneck, then the lowest second value, ...); ties go to the smallest start. 0 when
 * k <= 0 or k >= L. */
int sp_blocksel_best_start(const double *tp, int L, int k);
/* Where a new server of k blocks should start, given the others' spans (best_start of their tp). 0 when
 * L <= 0 or out of memory. */
int sp_blocksel_choose(const sp_blk_span *s, int n, int L, int k);
/* 1 if server `me` (an index into s) should move, else 0: Petals' should_choose_other_blocks with its
 * eps = 1e-3 tricks. Spans are clipped to [0, L); rng shuffles the simulated servers (all of them,
 * me included, every round); s is not modified. A balance_quality above 1 always moves; an `me` out of
 * range, an empty span of me or an allocation failure never does. 0 whenever the simulated swarm's
 * minimum throughput would end below its initial one or below eps. */
int sp_blocksel_should_move(const sp_blk_span *s, int n, int me, int L, double balance_quality, sp_rng *rng);

#endif
