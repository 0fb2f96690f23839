/* runtime.h - the client runtime: a model's local parts (embeddings, final norm, LM head, tokenizer), the
 * servers it knows (found through the DHT, started here, or connected by address), routes over them, and
 * inference sessions and training chains that survive the death of a server. It never prints: everything a
 * front end shows arrives as events.
 *
 * Servers: one entry per server id, never removed while the runtime lives (so an index stays valid); an
 * entry whose server left the view (or was superseded by a newer life at its address) is `gone`. Each failed
 * request bans its server and the earlier lives at its address (15 s, doubling while it keeps failing, cleared
 * by a success); when nothing listens at the address any more, every entry there is `down` (left out of
 * routes). Requests are retried (after 0, 1, 2, 4 ... 60 s) on a route that avoids banned servers, up to the
 * max_retries setting, and every retry is an SP_EV_RETRY event; when no server holds a block and none is
 * joining, a request fails at once.
 *
 * Threads: generation runs on the caller's thread; training runs one thread per sub-batch and microbatch.
 * The server table, bans and pings are under rt->lock; network calls are made without it. */
#ifndef SEPAL_RUNTIME_H
#define SEPAL_RUNTIME_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "generate.h"
#include "model.h"
#include "pipeline.h"
#include "record.h"
#include "remote.h"
#include "rng.h"
#include "tokenizer.h"

#define SP_RT_MAX_HOPS 64

typedef enum {
    SP_EV_INFO,     /* text: something happened (server started, model loaded) */
    SP_EV_PROGRESS, /* text: what, done/total: how far */
    SP_EV_TOKEN,    /* row, token, text: a generated token */
    SP_EV_ROUTE,    /* text: the chain a request uses; row 1: a re-route after a failure */
    SP_EV_SERVER,   /* row: server index, text: what happened to it (joined, state, left) */
    SP_EV_ERROR,    /* text: an error the runtime recovered from or reports */
    SP_EV_RETRY,    /* row: server index, text: a request failed there, the server is banned, a retry follows */
    SP_EV_STEP,     /* route, hop_s: a generation step went through route; hop_s[h]: seconds hop h took */
} sp_event_kind;

struct sp_route;

typedef struct sp_event {
    sp_event_kind kind;
    const char *text;
    double done, total;
    int row, token;
    const struct sp_route *route; /* SP_EV_ROUTE, SP_EV_STEP: the chain itself (NULL: none) */
    const double *hop_s;          /* SP_EV_STEP: seconds each hop took in the step */
} sp_event;

typedef void (*sp_event_fn)(const sp_event *ev, void *user);

typedef struct sp_conn sp_conn; /* a shared connection to one server (swarm/servers.c) */

typedef struct sp_server_entry {
    sp_server_record rec;  /* as announced (DHT), or filled from HELLO + INFO (connect HOST:PORT) */
    int from_dht;          /* found through the DHT view */
    int gone;              /* left the view (stale, expired) or stopped */
    sp_conn *conn;         /* opened on first use; NULL after a failure (the next use reconnects) */
    double rtt;            /* client ping, seconds: the median of the last measurements (each the fastest of a
                              burst); < 0 unknown; INFINITY unreachable */
    double rtt_when;       /* sp_now_s() of the last measurement */
    double rtt_win[4];     /* the last measurements (a ring) */
    int rtt_n;             /* measurements so far */
    double block_s;        /* seconds one of its blocks took in a greedy decode step, as this client saw it
                              (its hops' times less the ping, averaged); 0 unknown */
    double banned_until;   /* sp_now_s() until which routing avoids it */
    int down;              /* its address refused connections after a failure (its process is gone): routing
                              leaves it out until it answers again or announces anew */
    int failures;          /* since the last success */
    long cache_total;      /* from INFO, for `servers` */
    pid_t pid;             /* > 0: started by swarm up */
    char log[256];         /* its stderr, for swarm-started servers */
} sp_server_entry;

/* One server's part of a chain. */
typedef struct sp_hop {
    int server;            /* index into rt->servers */
    int start, end;        /* blocks [start, end) it runs for this chain */
    double latency;        /* expected seconds of this hop per step (routing's estimate) */
    uint64_t keep;         /* training: the id its FORWARD kept activations under (0: none) */
} sp_hop;

/* A chain over blocks [0, L) in stages: stage s runs blocks [stage_start[s], stage_start[s+1]) and is
 * served by hops first[s] .. first[s+1]-1. A route starts with one hop per stage; when a server fails,
 * its stage is served by the replacement's hops (several if no one server covers it), so the stages
 * (the pipeline's) stay put. */
typedef struct sp_route {
    int nstages;
    int stage_start[SP_RT_MAX_HOPS + 1];
    int first[SP_RT_MAX_HOPS + 1];
    int nhops;
    sp_hop hop[SP_RT_MAX_HOPS];
    double cost;           /* expected seconds per inference step (min-latency routes), else 0: the hops' round
                              trips from the client and their blocks, and for a route over every block the
                              client's own part too (local) */
    double local;          /* of which the client's own part */
} sp_route;

/* Settings of the runtime (front ends' `set`). */
typedef struct sp_rt_settings {
    int max_retries;         /* retries of one request after failures (default 8) */
    double step_timeout_s;   /* per request; 0: derived from the expected time (a few s for a decode step) */
    double ban_s;            /* first ban (default 15 s; doubles on repeated failures) */
    double backoff_max_s;    /* longest pause between retries (default 60 s) */
    char allowed[1024];      /* "id,id,host:port,..." only these (empty: all) */
    char blocked[1024];      /* never these */
    double update_period_s;  /* lookups of every block key (a DHT listen can miss a value: OpenDHT places it on
                                the nodes closest to the key when it starts) and pings (default 10 s) */
} sp_rt_settings;

/* The clock of the failure policy: bans are measured on now(), the pauses between retries are sleep()s. The
 * runtime's own (rt->clock NULL) is the monotonic clock and real sleeps; a test sets one that it moves itself,
 * to check the policy without waiting. */
typedef struct sp_rt_clock {
    double (*now)(void *user);
    void (*sleep)(void *user, double s);
    void *user;
} sp_rt_clock;

typedef struct sp_runtime {
    sp_event_fn on_event;
    void *user;
    char model_dir[4096];
    char model_prefix[SP_MODEL_PREFIX_MAX];
    sp_model *local;       /* embeddings + final norm + head only */
    int head_dtype;        /* sp_wtype of the local LM head (sp_runtime_set_head_dtype; f32: the mapping) */
    struct sp_pool *pool;  /* the local parts' compute threads (sp_runtime_set_threads; NULL: the engine's default) */
    int threads;           /* 0: every CPU the process may run on */
    sp_tokenizer *tok;     /* NULL if the model has none */
    sp_rt_settings set;

    pthread_mutex_t lock;  /* servers, bans, pings, route, rng */
    sp_server_entry **servers;
    int nservers, capservers;
    sp_route route;        /* the last inference route computed (route, servers) */
    sp_rng rng;            /* training routes */
    uint64_t next_keep;

    /* discovery (swarm/discovery.c) */
    struct sp_dht *dht;
    struct sp_view *view;
    pthread_mutex_t view_lock; /* the DHT's callbacks use view under it */
    char initial_peers[1024];
    pthread_t pinger;
    int pinger_started, pinger_stop;
    pthread_cond_t pinger_cond;

    /* a local swarm (swarm/local.c) */
    char server_bin[4096];
    int swarm_started;     /* swarm up ran and its servers are ours */

    const sp_rt_clock *clock; /* NULL: sp_now_s and real sleeps (see sp_rt_clock) */
    double local_step_s;   /* the client's own part of a greedy decode step (embedding, head, generation loop,
                              front end), measured; 0 unknown */
    int active;            /* sessions and training requests in progress (atomic): pings wait while > 0 */
    int cancel;            /* sp_runtime_cancel: the work in progress stops (atomic) */
    int cancel_waits;      /* ... and its network waits and back-offs end now (atomic) */
    int finish_steps;      /* sp_runtime_finish_steps: a first cancel lets the step in flight finish (atomic) */
    /* a private swarm (sp_runtime_set_swarm_key): every connection proves the key both ways, records without
     * its tag are dropped, and swarm up starts its servers with it */
    int has_key;
    sp_swarm_key key;
    char key_path[4096];
} sp_runtime;

sp_status sp_runtime_new(sp_runtime **out, sp_event_fn on_event, void *user, sp_err *err);

/* Cancellation, the one path for Ctrl-C: sp_runtime_cancel (async-signal-safe: it only sets a flag) makes
 * the work in progress stop soon: a pending network wait returns SP_ERR_CANCELLED within 100 ms, retries and
 * their back-off end, `swarm up` stops starting servers, generation stops between tokens and training after
 * the step in flight (the callers check sp_runtime_cancelled; see sp_runtime_finish_steps). Nothing is banned
 * for it, and the swarm and the sessions of later requests are unaffected. The flag stays set until
 * sp_runtime_cancel_clear (the front end clears it before each command). */
void sp_runtime_cancel(sp_runtime *rt);
void sp_runtime_cancel_clear(sp_runtime *rt);
int sp_runtime_cancelled(const sp_runtime *rt);
/* Seconds on the clock bans are measured on (rt->clock's, else sp_now_s): compare banned_until with it. */
double sp_runtime_now(const sp_runtime *rt);
/* While on (training's steps), a first sp_runtime_cancel only asks the work to stop: the step in flight
 * finishes, its network waits and retries running as usual, and the caller stops after it; a second cancel
 * (or one when off) ends the waits too. Turning it off after a cancel ends them as well. */
void sp_runtime_finish_steps(sp_runtime *rt, int on);
/* Whether network waits and back-offs must end now (what the connections' waits check). */
int sp_runtime_waits_cancelled(const sp_runtime *rt);
void sp_runtime_free(sp_runtime *rt); /* also stops a swarm it started and its DHT node */

/* Loads config, tokenizer (if present) and ONLY the local parts of the model in dir; a DHT view then
 * follows this model. */
sp_status sp_runtime_load(sp_runtime *rt, const char *dir, sp_err *err);

/* Uses the swarm key in path (swarmkey.h; NULL or "" forgets it) for the connections and the DHT view made from
 * now on. */
sp_status sp_runtime_set_swarm_key(sp_runtime *rt, const char *path, sp_err *err);

/* Connects to servers by address, "host:port[,host:port...]" (HELLO + INFO each), without the DHT. */
sp_status sp_runtime_connect(sp_runtime *rt, const char *addrs, sp_err *err);
/* Joins a swarm through DHT nodes "host:port[,...]": a DHT node of our own (a supervised child) that
 * announces nothing, and a live view of the loaded model's servers (and the swarm's models). */
sp_status sp_runtime_join(sp_runtime *rt, const char *initial_peers, sp_err *err);
/* Models announced in the swarm (needs sp_runtime_join); *out is malloc'd. */
int sp_runtime_models(sp_runtime *rt, sp_model_record **out);
/* Encodes the local LM head in t (f32, bf16, int8, nf4) for generation, now if a model is loaded and at every
 * later load; f32 (the default) uses the checkpoint's tensor in place. Training always uses the f32 head. */
sp_status sp_runtime_set_head_dtype(sp_runtime *rt, int t, sp_err *err);

/* The client's compute threads (the LM head, training's products): n, or 0 for every CPU the process may run
 * on; applies to the loaded model and later loads. */
sp_status sp_runtime_set_threads(sp_runtime *rt, int n, sp_err *err);

/* Starts n local sepal-server processes on loopback as a real swarm (the first starts it, the others join
 * through its DHT node), each choosing its blocks (k each; k = 0: an even split), joins it, and waits until
 * they all serve. */
sp_status sp_runtime_swarm_up(sp_runtime *rt, int n, int k, sp_err *err);
/* Stops the servers this runtime started (they announce OFFLINE) and leaves the swarm. */
void sp_runtime_swarm_down(sp_runtime *rt);
/* Refreshes every directly connected server's INFO; the DHT view refreshes by itself. */
void sp_runtime_refresh(sp_runtime *rt);

/* Inference route over [0, L) (min-latency, Petals' Dijkstra) into rt->route, with an SP_EV_ROUTE event. */
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
