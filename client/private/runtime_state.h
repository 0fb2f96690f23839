/* runtime_state.h - the client runtime's state, private to client/ (the way ggml keeps its context in
 * ggml-impl.h): front ends see only `typedef struct sp_runtime sp_runtime` (runtime_types.h) and call functions
 * (runtime.h). This folder is on the include path of client/'s own files only; white-box tests name it
 * themselves (tests/CMakeLists.txt).
 *
 * The runtime's parts work on this struct: cancellation and the clock (runtime_cancel.c), the model's local
 * parts (model/parts.c), the swarm (swarm/: servers, discovery, routes, sessions, chains, a local swarm) and the
 * trainer (train/trainer.c); the life cycle (runtime.c) is above them all. This header includes nothing of
 * theirs, so none of them depends on another through it, nor on runtime.c.
 *
 * Servers: one entry per server id, never removed while the runtime lives (so an index stays valid); an
 * entry whose server left the view (or was superseded by a newer life at its address) is `gone`. Each failed
 * request bans its server and the earlier lives at its address (15 s, doubling while it keeps failing, cleared
 * by a success); when nothing listens at the address any more, every entry there is `down` (left out of
 * routes). Requests are retried (after 0, 1, 2, 4 ... 60 s) on a route that avoids banned servers, up to the
 * max_retries setting, and every retry is an SP_EV_RETRY event; when no server holds a block and none is
 * joining, a request fails at once.
 *
 * Threads: the server table, bans, pings, the route and the rng are under `lock`; network calls are made
 * without it. */
#ifndef SEPAL_RUNTIME_STATE_H
#define SEPAL_RUNTIME_STATE_H

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <sys/types.h>

#include "model.h"
#include "record.h"
#include "rng.h"
#include "runtime_events.h"
#include "runtime_types.h"
#include "swarmkey.h"
#include "view.h"

struct sp_tokenizer;
struct sp_pool;
struct sp_dht;

typedef struct sp_conn sp_conn; /* a shared connection to one server (swarm/servers.c) */

/* One direction of a server's link: the rates (Mbit/s) of its last large bulk messages (bytes that arrived after the
 * header over the time they took), a ring, kept across reconnects. */
typedef struct sp_link_rate {
    double win[4];
    int n;       /* measurements so far */
    double mbit; /* the link's rate: the median of win once it holds two (0: unknown). A sender or reader waiting
                    for a CPU lowers a measurement, a relay that held the message's start and then sent it in a burst
                    raises one (at 1 Gbit/s through linkem, on this loaded machine: up to 9.8x); the median of two or
                    more needs two such alike to move (one alone, a thread stalled for 7 ms on a loaded loopback
                    swarm made a 256 KiB reply read as 300 Mbit/s: wire auto then sent bf16 where f32's bits were
                    expected) */
} sp_link_rate;

typedef struct sp_server_entry {
    sp_server_record rec;  /* as announced (DHT), or filled from HELLO + INFO (connect HOST:PORT) */
    int from_dht;          /* found through the DHT view */
    int gone;              /* left the view (stale, expired) or stopped */
    sp_conn *conn;         /* opened on first use; NULL after a failure (the next use reconnects) */
    char last_word[512];   /* what the server said before it closed the last connection ("shutdown: ..."), kept
                              for a reconnect that fails: whichever thread saw the close, that is why ("": none) */
    double rtt;            /* client ping, seconds: the median of the last measurements (each the fastest of a
                              burst); < 0 unknown; INFINITY unreachable */
    double rtt_when;       /* sp_now_s() of the last measurement */
    double rtt_win[4];     /* the last measurements (a ring) */
    int rtt_n;             /* measurements so far */
    sp_link_rate link_down; /* its link toward the client: its large replies, as this client's transport measured them
                              (sp_remote_rx_mbit) */
    sp_link_rate link_up;  /* ... from the client: this client's large requests, as the server measured them and
                              said in its replies (rx_mbit; an older server says nothing: unknown) */
    double block_s;        /* seconds one of its blocks took in a greedy decode step, as this client saw it
                              (its hops' times less the ping, averaged); 0 unknown */
    double banned_until;   /* sp_runtime_now() until which routing avoids it */
    double busy_until;     /* ... avoids it for having refused a session as "overloaded" (not a failure) */
    int down;              /* its address refused connections after a failure (its process is gone): routing
                              leaves it out until it answers again or announces anew */
    int failures;          /* since the last success */
    long cache_total;      /* from INFO, for `servers` */
    char addr[80];         /* "HOST:PORT" it is announced at, where other servers push to it (HELLO's; "": rec's) */
    int refused_caps;      /* SP_CAP_* bits its record or HELLO said but it refused: it answered a request that
                              awaited its input with an error of ours (an older server). Never asked for again while
                              the entry (its process) lives */
    int no_push_to;        /* its push of a training pass did not reach this server (an index; -1: none), which then
                              answered the client: training's passes from it to that one are client-driven ... */
    double no_push_until;  /* ... until this sp_runtime_now() (SP_RT_NO_PUSH_S, doubling while it keeps missing) */
    double no_push_s;      /* the last such pause (0: none since a push from it arrived) */
    pid_t pid;             /* > 0: started by swarm up */
    char log[256];         /* its stderr, for swarm-started servers */
} sp_server_entry;

struct sp_runtime {
    sp_events events;      /* where the events go (the front end's callback) */
    char model_dir[4096];
    char model_prefix[SP_MODEL_PREFIX_MAX];
    sp_model *local;       /* embeddings + final norm + head only (model/parts.c) */
    int head_dtype;        /* sp_wtype of the local LM head (sp_runtime_set_head_dtype; f32: the mapping) */
    int gen_device;        /* generation's local parts on this GPU (sp_runtime_set_gen_device; -1: the CPU) */
    struct sp_devparts *gen_dev; /* ... there, for the loaded model (NULL: on the CPU) */
    struct sp_pool *pool;  /* the local parts' compute threads (sp_runtime_set_threads; NULL: the engine's default) */
    int threads;           /* 0: every CPU the process may run on */
    struct sp_tokenizer *tok; /* NULL if the model has none */
    sp_rt_settings set;

    pthread_mutex_t lock;  /* servers, bans, pings, route, rng */
    sp_server_entry **servers;
    int nservers, capservers;
    sp_route route;        /* the last inference route computed (route, servers) */
    sp_rng rng;            /* training routes */
    uint64_t next_keep;
    uint64_t passes_pushed; /* atomic: training's FORWARDs and BACKWARDs sent pushed (chain.c), for tests */
    uint64_t steps_pushed;  /* atomic: generation steps sent pushed (session.c), for tests */

    /* discovery (swarm/discovery.c) */
    struct sp_dht *dht;
    sp_view_slot views;    /* the view of the loaded model's servers, as the DHT's callbacks reach it */
    char initial_peers[1024];
    pthread_t pinger;
    int pinger_started, pinger_stop;
    pthread_cond_t pinger_cond;

    /* a local swarm (swarm/local.c) */
    char server_bin[4096];
    int swarm_started;     /* swarm up ran and its servers are ours */
    int swarm_threads;     /* swarm up's servers' --threads (0: theirs, every CPU) */

    const sp_rt_clock *clock; /* NULL: sp_now_s and real sleeps (see sp_rt_clock) */
    double local_step_s;   /* the client's own part of a greedy decode step (embedding, head, generation loop,
                              front end), measured; 0 unknown */
    int active;            /* sessions and training requests in progress (atomic): pings wait while > 0 */
    int cancel;            /* sp_runtime_cancel: the work in progress stops (atomic) */
    int cancel_waits;      /* ... and its network waits and back-offs end now (atomic) */
    int finish_steps;      /* sp_runtime_finish_steps: a first cancel lets the step in flight finish (atomic) */
    /* a private swarm (sp_runtime_set_swarm_key): every connection proves the key both ways, records
     * are read only sealed with it, and swarm up starts its servers with it */
    int has_key;
    sp_swarm_key key;
    char key_path[4096];
};

/* ---------------------------------------------------------------------------------------------- */
/* events to the front end (runtime_events.h), from any of the runtime's threads */

static inline void sp_rt_emit(sp_runtime *rt, sp_event_kind kind, const char *text, double done, double total, int row)
{
    sp_events_emit(&rt->events, kind, text, done, total, row);
}

static inline void sp_rt_emit_route(sp_runtime *rt, sp_event_kind kind, const char *text, int row, const sp_route *r,
                                    const double *hop_s)
{
    sp_events_emit_route(&rt->events, kind, text, row, r, hop_s);
}

__attribute__((format(printf, 4, 5))) static inline void sp_rt_emitf(sp_runtime *rt, sp_event_kind kind, int row,
                                                                   const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sp_events_vemitf(&rt->events, kind, row, fmt, ap);
    va_end(ap);
}

/* ---------------------------------------------------------------------------------------------- */
/* the model's local parts (model/parts.c), for the life cycle (runtime.c) */

/* Loads config, tokenizer (if present) and only the local parts of the model in dir, in place of those loaded
 * before (which stay if this fails), with progress and an SP_EV_INFO saying what was loaded. */
sp_status sp_rt_parts_load(sp_runtime *rt, const char *dir, sp_err *err);
/* Frees them and the compute threads. */
void sp_rt_parts_free(sp_runtime *rt);

#endif
