/* runtime.h - the client runtime: a model's local parts (embeddings, final norm, LM head, tokenizer), the
 * servers it knows, the route (chain of servers covering blocks [0, L)), inference sessions along the
 * route, and forward/backward over it. It never prints: everything a front end shows arrives as events. */
#ifndef SEPAL_RUNTIME_H
#define SEPAL_RUNTIME_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "generate.h"
#include "model.h"
#include "pipeline.h"
#include "remote.h"
#include "tokenizer.h"

#define SP_RT_MAX_SERVERS 64

typedef enum {
    SP_EV_INFO,     /* text: something happened (server started, model loaded) */
    SP_EV_PROGRESS, /* text: what, done/total: how far */
    SP_EV_TOKEN,    /* row, token, text: a generated token */
    SP_EV_ROUTE,    /* text: the chain the next request uses */
    SP_EV_SERVER,   /* row: server index, text: its new state */
    SP_EV_ERROR,    /* text: an error the runtime recovered from or reports */
} sp_event_kind;

typedef struct sp_event {
    sp_event_kind kind;
    const char *text;
    double done, total;
    int row, token;
} sp_event;

typedef void (*sp_event_fn)(const sp_event *ev, void *user);

typedef struct sp_server_entry {
    char host[64];
    int port;
    sp_remote *conn;
    int start, end;
    double inference_rps, forward_tps;
    long cache_left, cache_total;
    char state[16]; /* "online", "unreachable" */
    pid_t pid;      /* > 0: started by swarm up */
    char log[256];  /* its stderr, for swarm-started servers */
} sp_server_entry;

typedef struct sp_hop {
    int server, start, end;
} sp_hop;

typedef struct sp_runtime {
    sp_event_fn on_event;
    void *user;
    char model_dir[4096];
    sp_model *local;  /* embeddings + final norm + head only */
    sp_tokenizer *tok; /* NULL if the model has none */
    sp_server_entry servers[SP_RT_MAX_SERVERS];
    int nservers;
    sp_hop route[SP_RT_MAX_SERVERS];
    int nroute;
    char server_bin[4096];
    /* FORWARDs whose servers keep activations for the BACKWARD that follows: boundaries -> per-hop ids */
    pthread_mutex_t keep_lock;
    struct sp_keep {
        const float *boundaries;
        uint64_t id[SP_RT_MAX_SERVERS];
        int nhops;
    } keeps[64];
    int keep_next_slot;
    uint64_t keep_next_id;
} sp_runtime;

sp_status sp_runtime_new(sp_runtime **out, sp_event_fn on_event, void *user, sp_err *err);
void sp_runtime_free(sp_runtime *rt); /* also stops a swarm it started */

/* Loads config, tokenizer (if present) and ONLY the local parts of the model in dir. */
sp_status sp_runtime_load(sp_runtime *rt, const char *dir, sp_err *err);
/* Connects to "host:port[,host:port...]" (HELLO + INFO each) and recomputes the route. */
sp_status sp_runtime_connect(sp_runtime *rt, const char *addrs, sp_err *err);
/* Starts n local sepal-server processes on free loopback ports splitting the loaded model (k blocks each,
 * k = 0: an even split), waits until all serve, connects to them. */
sp_status sp_runtime_swarm_up(sp_runtime *rt, int n, int k, sp_err *err);
/* Stops the servers this runtime started and forgets every server. */
void sp_runtime_swarm_down(sp_runtime *rt);
/* Refreshes every server's INFO (throughput, cache left, state). */
void sp_runtime_refresh(sp_runtime *rt);
/* Chooses the chain covering [0, L): from each position the reachable server reaching furthest. */
sp_status sp_runtime_route(sp_runtime *rt, sp_err *err);
/* "0:2 127.0.0.1:4001 -> 2:4 127.0.0.1:4002 -> ..." */
void sp_runtime_route_text(const sp_runtime *rt, char *buf, size_t cap);

/* The swarm as an LM for sp_generate: inference sessions along the route, hidden states of every step
 * kept per hop (the history a replacement server would be replayed). */
typedef struct sp_lm_swarm {
    sp_runtime *rt;
    /* trained prompts (sp_lm_swarm_prompts): shallow [P, H] before the first token, deep [L, P, H] added by
     * the servers to the first P positions entering each block; P extra positions of every session */
    const float *shallow, *deep;
    int P;
    int B, max_length, pos, nhops;
    uint64_t session[SP_RT_MAX_SERVERS];
    float *history[SP_RT_MAX_SERVERS]; /* [B, max_length, H] entering each hop */
    int64_t *hypo;                     /* pending cache reorder, sent with the next step */
} sp_lm_swarm;

sp_lm sp_lm_swarm_make(sp_lm_swarm *s, sp_runtime *rt);
/* Generation with trained prompts (trainer.h's ptune / deep_ptune, as Petals' inference with prompts): the
 * first step feeds shallow [P, H] before the tokens (NULL: zeros) and sends deep [L, P, H] (NULL: none) to
 * every hop; the arrays must outlive the generation. Updates lm's max_pos (P positions fewer). */
void sp_lm_swarm_prompts(sp_lm_swarm *s, sp_lm *lm, const float *shallow, const float *deep, int P);

/* FORWARD / BACKWARD over the route for training: hidden [B, T, H] in place; boundaries receives the
 * hidden state entering each hop (nroute x [B, T, H]) for the backward. prompts (may be NULL) are the deep
 * prompts [L, B, P, H] of all L blocks (each hop gets its slice, added to the first P positions entering each
 * of its blocks); grad_prompts (may be NULL; [L, B, P, H]) receives their gradients. tk (may be NULL): a
 * pipelined microbatch's ticket; every hop then waits for its turn on that stage (pipeline.h). */
sp_status sp_runtime_forward(sp_runtime *rt, float *hidden, int B, int T, const float *prompts, int P,
                             float *boundaries, const sp_pipe_ticket *tk, sp_err *err);
sp_status sp_runtime_backward(sp_runtime *rt, float *grad, int B, int T, const float *prompts, int P,
                              const float *boundaries, float *grad_prompts, const sp_pipe_ticket *tk, sp_err *err);

#endif
