/* events.h - what the runtime, the commands and the worker tell the UI thread, and the queue that carries it.
 *
 * The queue is bounded and never makes a producer wait for room: state arrives as whole snapshots, and a newer
 * snapshot replaces an older one still queued (the swarm, the route, the hops' timings, the app's model, a
 * progress bar per task); streams (generated text, command output) are appended, joined to a queued piece of
 * the same stream; log lines beyond the queue's capacity are dropped and counted (the log says how many).
 * The consumer sleeps on an eventfd that a producer writes only when the queue goes from empty to non-empty,
 * and takes everything at once.
 *
 * Events are plain data (owned strings and arrays) so that they can be recorded to a file as JSON lines and
 * replayed (--record-events / --replay-events). */
#ifndef SEPAL_TUI_EVENTS_H
#define SEPAL_TUI_EVENTS_H

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>

typedef enum tui_ev_kind {
    TE_LOG,          /* level, text: a line for the log (notices, warnings, errors, runtime news) */
    TE_OUT,          /* text: command output (stream) */
    TE_SWARM,        /* swarm: a snapshot of the servers (coalesced) */
    TE_APP,          /* text: model name; n: blocks; a: hidden; b: vocab; what: architecture (coalesced) */
    TE_ROUTE,        /* hops: the chain a request uses; i: 1 for a re-route; a: expected s/step (coalesced) */
    TE_HOPS,         /* hops (measured): each hop's time in the last step (coalesced) */
    TE_RETRY,        /* i: server index; text: what failed, the ban, the retry; b: s until the retry */
    TE_GEN_BEGIN,    /* text: the prompt (NULL: token ids) */
    TE_GEN_TEXT,     /* text: the continuation's next piece (stream); n: tokens in it */
    TE_GEN_END,      /* n: new tokens; i: prompt tokens; a: prefill s; b: decode s; c: first token s; what: stop */
    TE_TRAIN_BEGIN,  /* text: what is trained */
    TE_TRAIN_STEP,   /* epoch, step, total; a: loss; b: lr; c: tokens/s */
    TE_TRAIN_EVAL,   /* epoch; text: the validation metrics ("accuracy=0.75 loss=0.5 n=128") */
    TE_TRAIN_END,    /* text: how it ended */
    TE_PROGRESS,     /* what, unit; a: done; b: total (coalesced per what) */
    TE_PROGRESS_END, /* what */
    TE_CMD_BEGIN,    /* text: the command line */
    TE_CMD_END,      /* i: status; n: 1 if it was cancelled */
    TE_QUIT,         /* the `quit` command ran */
    TE_READY,        /* the scripts given on the command line have run (the `:` line opens) */
    TE_PLOT,         /* `plot`: what the metric; text: each run as "# NAME" then "X Y" lines */
    TE_SERVE,        /* `serve`'s requests: i active, n waiting, step served, total failed, a tok/s, epoch 1 when
                        stopped; what: its URL; unit: the last error; text: a line per request (coalesced) */
    TE_NKINDS
} tui_ev_kind;

enum { TUI_LOG_INFO, TUI_LOG_NOTICE, TUI_LOG_WARN, TUI_LOG_ERROR, TUI_LOG_CMD };

/* A server as the swarm panel shows it. */
typedef struct tui_server {
    int idx;                 /* the runtime's server index (routes name servers by it) */
    char id[20], name[64], host[64];
    int port, start, end;
    int state;               /* TUI_ST_* (cellbuf.h) */
    int banned, local;       /* routing avoids it now; started by swarm up */
    int busy;                /* it refused a session as overloaded lately, or says its queue wait is over its bound */
    double tput, inf_rps, fwd_rps, net_rps;
    char prec[24];
    long cache;              /* tokens left, -1 unknown */
    int npings;
    double best_ping;        /* its best ping to a successor, s (-1: none) */
    double rtt;              /* this app's ping to it, s (-1 unknown, inf unreachable) */
    char version[16];
} tui_server;

typedef struct tui_swarm {
    char model[96];
    int nblocks;
    int n;
    tui_server *s;
} tui_swarm;

typedef struct tui_hop {
    int server, start, end;
    double latency;          /* TE_ROUTE: expected s per step; TE_HOPS: measured s in the last step */
} tui_hop;

typedef struct tui_ev {
    tui_ev_kind kind;
    double t;                /* monotonic seconds when it happened (replay: re-based) */
    int level, i, n, epoch, step, total;
    double a, b, c;
    char *text, *what, *unit;
    tui_swarm *swarm;
    int nhops;
    tui_hop *hops;
    struct tui_ev *next;
} tui_ev;

tui_ev *tui_ev_new(tui_ev_kind kind);
void tui_ev_free(tui_ev *e);            /* one event */
void tui_ev_free_list(tui_ev *e);       /* a list (next) */
void tui_swarm_free(tui_swarm *s);
tui_swarm *tui_swarm_dup(const tui_swarm *s);
/* 1 if the two snapshots would draw the same. */
int tui_swarm_same(const tui_swarm *a, const tui_swarm *b);
const char *tui_ev_kind_name(tui_ev_kind k);

/* ---- the queue ---- */
typedef struct tui_queue {
    pthread_mutex_t lock;
    tui_ev *head, *tail;
    int len, cap;            /* events queued; capacity for log lines (others get twice that) */
    size_t stream_bytes;     /* text of stream events queued */
    long dropped;            /* events dropped since the consumer last looked */
    int efd;                 /* eventfd; -1 if none (tests) */
    long wakes;              /* eventfd writes, for the tests */
} tui_queue;

int tui_queue_init(tui_queue *q, int cap, int with_eventfd); /* 0, or -1 */
void tui_queue_destroy(tui_queue *q);
/* Takes ownership of e (freed if dropped or merged). Never waits for room. */
void tui_queue_push(tui_queue *q, tui_ev *e);
/* Everything queued, oldest first (the caller frees it); *dropped: events dropped since the last take. Reads
 * the eventfd so that the next push wakes the consumer again. */
tui_ev *tui_queue_take(tui_queue *q, long *dropped);

/* ---- recording ---- */
/* One event as a JSON line (no newline), t relative to t0. malloc'd. */
char *tui_ev_to_json(const tui_ev *e, double t0);
/* Parses a line written by tui_ev_to_json (NULL if it is not one; why says what is wrong). */
tui_ev *tui_ev_from_json(const char *line, char *why, size_t cap);

#endif
