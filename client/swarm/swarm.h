/* swarm.h - the client runtime's calls over the swarm (swarm/): servers found through the DHT, started here or
 * connected by address; routes over them; inference sessions and training chains that survive the death of a
 * server. Front ends reach them through runtime.h.
 *
 * Each failed request bans its server (15 s, doubling while it keeps failing, cleared by a success); requests
 * are retried (after 0, 1, 2, 4 ... 60 s) on a route that avoids banned servers, up to the max_retries setting,
 * and every retry is an SP_EV_RETRY event.
 *
 * Threads: generation runs on the caller's thread; training runs one thread per sub-batch and microbatch. */
#ifndef SEPAL_SWARM_H
#define SEPAL_SWARM_H

#include <stddef.h>
#include <stdint.h>

#include "generate.h"
#include "pipeline.h"
#include "record.h"
#include "runtime_types.h"
#include "status.h"

/* Uses the swarm key in path (swarmkey.h; NULL or "" forgets it) for the connections and the DHT view made from
 * now on. */
sp_status sp_runtime_set_swarm_key(sp_runtime *rt, const char *path, sp_err *err);

/* Connects to servers by address, "host:port[,host:port...]" (HELLO + INFO each), without the DHT. */
sp_status sp_runtime_connect(sp_runtime *rt, const char *addrs, sp_err *err);
/* Joins a swarm through DHT nodes "host:port[,...]": a DHT node of our own (a supervised child) that
 * announces nothing, and a live view of the loaded model's servers (and the swarm's models). */
sp_status sp_runtime_join(sp_runtime *rt, const char *initial_peers, sp_err *err);
/* Waits (at most timeout_ms) until the DHT view's lookups of every block key have come back once since it
 * started: what the swarm holds has arrived. 0, or -1 on a timeout or without a view. Not concurrently with
 * sp_runtime_load or leaving the swarm (they replace the view). */
int sp_runtime_wait_view(sp_runtime *rt, int timeout_ms);
/* Models announced in the swarm (needs sp_runtime_join); *out is malloc'd. */
int sp_runtime_models(sp_runtime *rt, sp_model_record **out);

/* Starts n local sepal-server processes on loopback as a real swarm (the first starts it, the others join
 * through its DHT node), each choosing its blocks (k each; k = 0: an even split), joins it, and waits until
 * they all serve. */
sp_status sp_runtime_swarm_up(sp_runtime *rt, int n, int k, sp_err *err);
/* The compute threads each server of the next sp_runtime_swarm_up gets (sepal-server --threads; 0, the
 * default: every CPU, each server's own). */
void sp_runtime_swarm_threads(sp_runtime *rt, int threads);
/* Stops the servers this runtime started (they announce OFFLINE) and leaves the swarm. */
void sp_runtime_swarm_down(sp_runtime *rt);
/* Refreshes every directly connected server's INFO; the DHT view refreshes by itself. */
void sp_runtime_refresh(sp_runtime *rt);

/* Inference route over [0, L) (min-latency, Petals' Dijkstra), kept as the runtime's last route
 * (sp_runtime_last_route), with an SP_EV_ROUTE event. */
sp_status sp_runtime_route(sp_runtime *rt, sp_err *err);
/* "0:2 127.0.0.1:4001 (0.6 ms) -> 2:4 ... + 1.1 ms local; 312 steps/s expected": each hop's expected time per
 * step, the client's own part (routes over every block), and the steps/s that all of it predicts */
void sp_runtime_route_text(sp_runtime *rt, const sp_route *r, char *buf, size_t cap);
/* Reports r as the route a request uses (SP_EV_ROUTE, row 0). */
void sp_runtime_note_route(sp_runtime *rt, const sp_route *r);
/* A min-latency route over [start, end) for sessions of cache_tokens positions / a max-throughput route
 * (training, random by throughput); both avoid banned servers where they can. */
sp_status sp_runtime_route_inference(sp_runtime *rt, int start, int end, long cache_tokens, sp_route *out, sp_err *err);
sp_status sp_runtime_route_train(sp_runtime *rt, sp_route *out, sp_err *err);

/* The swarm as an LM for sp_generate: inference sessions along a min-latency route. Every step's input of
 * each hop is kept as its history, so a hop whose server fails is replaced (banned, re-routed over its
 * blocks) and the replacement rebuilds its cache from that history in one step: the output is the same as
 * without the failure. */
typedef struct sp_lm_swarm {
    sp_runtime *rt;
    /* trained prompts (sp_lm_swarm_prompts): shallow [P, H] before the first token, deep [L, P, H] added by
     * the servers to the first P positions entering each block; P extra positions of every session */
    const float *shallow, *deep;
    int P;
    int B, max_length, pos;
    sp_route route;
    uint64_t session[SP_RT_MAX_HOPS];
    float *history[SP_RT_MAX_HOPS]; /* [B, max_length, H] entering each hop */
    int fresh[SP_RT_MAX_HOPS];      /* the hop's session has not stepped yet (a replacement: it replays) */
    int64_t *hypo;                  /* pending cache reorder, sent with the next step (NULL: none; else hypo_buf) */
    int64_t *hypo_buf;              /* [B], sized at begin */
    int retries;                    /* failures recovered from so far */
    double hop_s[SP_RT_MAX_HOPS];   /* seconds each hop took in the last step (SP_EV_STEP) */
    int active;                     /* begun, counted in rt->active until its end */
    double t_step, net_s;           /* the last step's start (0: none yet) and its seconds on the hops: the rest
                                     * of the time between two decode steps is the client's own part */
    float *step_buf;                /* a decode step's hidden states, last positions and retry copy ([3, B, H]):
                                     * sized at begin, so steps allocate nothing */
    uint64_t token[SP_RT_MAX_HOPS]; /* each hop's push token (INFERENCE_OPEN's; 0: it takes no pushes) */
    uint64_t step_no;               /* steps so far (the step number pushes carry) */
    int no_push;                    /* a push failed in this session: its steps are client-driven from then on */
    float *push_out;                /* the awaiting hops' outputs of a pushed step, [nhops - 1, B, T, H] */
    size_t push_out_floats;
} sp_lm_swarm;

sp_lm sp_lm_swarm_make(sp_lm_swarm *s, sp_runtime *rt);
/* Generation with trained prompts (trainer.h's ptune / deep_ptune, as Petals' inference with prompts): the
 * first step feeds shallow [P, H] before the tokens (NULL: zeros) and sends deep [L, P, H] (NULL: none) to
 * every hop; the arrays must outlive the generation. Updates lm's max_pos (P positions fewer). */
void sp_lm_swarm_prompts(sp_lm_swarm *s, sp_lm *lm, const float *shallow, const float *deep, int P);

/* FORWARD / BACKWARD along route (training). hidden [B, T, H] in place; boundaries receives the hidden
 * state entering each stage (route->nstages x [B, T, H]) for the backward. prompts (may be NULL) are the deep
 * prompts [L, B, P, H] of all L blocks (each hop gets its slice, added to the first P positions entering each
 * of its blocks); grad_prompts (may be NULL; [L, B, P, H]) receives their gradients. tk (may be NULL): a
 * pipelined microbatch's ticket; every stage then waits for its turn (pipeline.h). A failed hop is replaced
 * and its stage run again from its boundary (the backward re-runs the stage's forward there first), so the
 * results equal those of a run without the failure. The route is updated in place (replacements, keep ids);
 * pass the same one to the backward. */
sp_status sp_runtime_forward(sp_runtime *rt, sp_route *route, float *hidden, int B, int T, const float *prompts,
                             int P, float *boundaries, const sp_pipe_ticket *tk, sp_err *err);
sp_status sp_runtime_backward(sp_runtime *rt, sp_route *route, float *grad, int B, int T, const float *prompts,
                              int P, const float *boundaries, float *grad_prompts, const sp_pipe_ticket *tk,
                              sp_err *err);

#endif
