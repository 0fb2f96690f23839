/* pipeline.h - the servers of the route as pipeline stages: per-stage orders of forward and backward work
 * for M microbatches (AFAB or 1F1B, with a bound on microbatches in flight), and the turnstiles that make
 * every stage follow its order while the microbatches run concurrently, one thread each.
 *
 * A stage's order lists items (F or B of microbatch m). A thread that wants to run item (dir, m) on stage s
 * enters when that item is the stage's current one and leaves when its request is answered; the item is
 * done (and the stage moves on) when all of its sub-batches have left. So microbatch m+1 can run on stage 0
 * while m runs on stage 1: the stages overlap, and each stage works in its schedule's order, like the
 * per-stage instruction lists of a pipeline engine (DeepSpeed's PipeSchedule, Megatron's 1F1B).
 *
 *   1F1B, stage s of S: w = min(S - 1 - s, M, K - 1) warm-up forwards, then (F, B) pairs, then cool-down Bs.
 *   AFAB: groups of K microbatches (K = M when unbounded): every forward of the group, then its backwards.
 * K is the bound on microbatches in flight (0: none): no stage holds activations of more than K of them.
 *
 * A microbatch whose backward never reaches a stage (the loss does not depend on it, or the task already
 * ran its backward) is finished with sp_pipe_finish, which skips its remaining items. A failure aborts the
 * pipe: every waiter returns SP_ERR_STATE, so no thread waits for a microbatch that will not come. */
#ifndef SEPAL_PIPELINE_H
#define SEPAL_PIPELINE_H

#include "status.h"

typedef enum { SP_PIPE_AFAB, SP_PIPE_1F1B } sp_pipe_kind;

typedef struct sp_pipe sp_pipe;

/* What a microbatch's chain op carries to the hops: its pipe, microbatch index and sub-batch count. */
typedef struct sp_pipe_ticket {
    sp_pipe *pipe;
    int mb, nsub;
} sp_pipe_ticket;

/* One done item of a stage, in the order it was done. */
typedef struct sp_pipe_item {
    int backward, mb;
    double t_enter, t_leave; /* first enter, last leave (sp_now_s) */
} sp_pipe_item;

sp_pipe *sp_pipe_new(int stages, int M, sp_pipe_kind kind, int max_in_flight);
void sp_pipe_free(sp_pipe *p);
int sp_pipe_stages(const sp_pipe *p);

/* The order of stage s into out[2M]: item i is backward = out[i] & 1 of microbatch out[i] >> 1. Returns 2M. */
int sp_pipe_order(const sp_pipe *p, int s, int *out);

/* Waits until (backward, mb) is stage s's current item, then enters it. SP_ERR_STATE if the pipe was aborted
 * (err says so), SP_ERR_ARG for an item that is not in the order. */
sp_status sp_pipe_enter(sp_pipe *p, int s, int backward, int mb, sp_err *err);
/* One of the item's nsub sub-batches is done. */
void sp_pipe_leave(sp_pipe *p, int s, int backward, int mb, int nsub);
/* Waits (without entering) until (backward, mb) is stage s's current item: a microbatch waits for its turn
 * on stage 0 before it builds anything, so the bound on microbatches in flight holds on the client too. */
sp_status sp_pipe_wait_turn(sp_pipe *p, int s, int backward, int mb, sp_err *err);
/* Microbatch mb is done: its items not yet done are skipped. */
void sp_pipe_finish(sp_pipe *p, int mb);
void sp_pipe_abort(sp_pipe *p);

/* What happened: the done items of stage s (up to cap) and the count; the most stages busy at one time. */
int sp_pipe_trace(const sp_pipe *p, int s, sp_pipe_item *out, int cap);
int sp_pipe_peak_busy(const sp_pipe *p);

#endif
