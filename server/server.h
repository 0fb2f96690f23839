/* server.h - a swarm server: holds blocks [start, end) of a model and serves FORWARD, BACKWARD and
 * INFERENCE sessions over the transport (ws/transport.h), per the protocol in share/doc/protocol.md.
 * It never changes weights. Library form, so tests can run servers as threads; sepal-server's main()
 * wraps it. */
#ifndef SEPAL_SERVER_H
#define SEPAL_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "device.h" /* --device: sp_device_parse */
#include "metrics.h"
#include "status.h"
#include "swarmkey.h"

/* What one peer can make the server hold (ws/transport.h has the details); 0 = the default, sized from the span
 * and the machine at start (sp_server_limits_get says what they came to). */
typedef struct sp_server_limits {
    int max_conns, max_conns_per_ip;      /* connections at once, in total and from one address */
    int max_pending, max_pending_per_ip;  /* ... still in their handshake (upgrade, swarm key, HELLO) */
    double handshake_timeout_s;           /* for the upgrade, and again for HELLO (default 5) */
    double idle_timeout_s;                /* a connection without sessions, silent this long, closes (default 120;
                                             < 0: never) */
    uint64_t input_budget;                /* bytes of requests and replies held, in total */
    uint64_t input_budget_conn;           /* ... for one connection (default: the largest request the span accepts);
                                             also the largest message accepted */
    uint64_t input_budget_ip;             /* ... for one address (default half of the total) */
    uint64_t output_bound;                /* unsent replies over which a connection is not read (default 1 MiB) */
    double busy_timeout_s;                /* a request waits this long for budget, then "busy" (default 10) */
    double min_rate;                      /* bytes/s a request must arrive at (default 64 KiB/s; < 0: none) */
} sp_server_limits;

typedef struct sp_server_opts {
    const char *model_dir;
    int start, end;            /* blocks held; end = -1: to the last block */
    const char *host;          /* bind address, default 127.0.0.1 */
    int port;                  /* ws port, 0 = ephemeral */
    int bulk_port;             /* bulk TCP port, 0 = ephemeral, -1 = none */
    const char *public_host;   /* the host it is announced at (--announce; NULL: host), where peers push to it */
    int public_port;           /* the ws port it is announced at (0: the one it listens on) */
    int public_bulk_port;      /* the bulk port HELLO tells clients (a relay's or a port forward's: --announce);
                                  0: the one it listens on */
    int threads;               /* compute threads (the engine's pool, and OpenBLAS for large products); 0: the CPUs
                                  this process may run on */
    int workers;               /* request worker threads (default 1) */
    int workers_only;          /* every request goes through a worker, even a short step (tests; default 0) */
    int no_batch;              /* decode steps of different sessions run one by one, not as one pass (default 0) */
    double gather_wait_s;      /* the most a pass waits for the steps that are due (tests; 0: a quarter of a recent
                                  pass, at most 5 ms) */
    double passed_window_s;    /* INFO's passed_inference and passed_training: the most in this window and the one
                                  before it (tests; 0: 60 s) */
    double max_queue_wait_s;   /* new inference sessions are refused (ERROR "overloaded") while the queue wait
                                  (sp_server_queue_wait) is over it; 0: never (default 5) */
    int dtype;                 /* sp_wtype the blocks are held in (kern.h; default f32) */
    int device;                /* where the blocks run: -1 the host (default), N: CUDA GPU N (span.h) */
    int max_batch_tokens;      /* B*T per task (default 2048); forward/backward above it are refused */
    long cache_tokens;         /* KV budget in token positions over the whole span (default 8192) */
    long cache_bytes;          /* KV budget in bytes instead (0: cache_tokens decides). One position of one block
                                  takes 2 x kv_heads x head_dim x 4 bytes, so the positions it holds depend on the
                                  family: a multi-query block (Falcon-7B) fits heads times more than a multi-head
                                  one of the same width (BLOOM), a grouped one (Llama-70B, Mixtral) heads/kv_heads */
    int max_length;            /* largest session max_length accepted (default: the model's context) */
    const char *public_name;
    const char *id;            /* the server's id in the swarm (16 hex digits; NULL: none), said in HELLO */
    int dht_port;              /* the UDP port of its DHT node (0: none), said in HELLO */
    double step_timeout_s;     /* a session idle this long is closed (default 300) */
    double session_timeout_s;  /* a session older than this is closed (default 1800) */
    int measure;               /* measure throughput at start (default 1); 0 reports 0 */
    const char *throughput_cache; /* file caching measured throughput (default $SEPAL_CACHE/throughput.json) */
    uint64_t max_message;      /* transport cap (default 0: the connection's budget, limits.input_budget_conn) */
    size_t keep_bytes;         /* activations kept between FORWARD and BACKWARD (default 512 MiB; 0: never) */
    size_t await_bytes;        /* training's pushed inputs and the requests that await them, held at once (0, the
                                  default: half of keep_bytes + 64 MiB); a push over it is refused ("busy") */
    const sp_swarm_key *key;   /* a private swarm's key: peers must prove it first (NULL: anyone may connect) */
    const char *source_address; /* where its pushes to other servers connect from (NULL: the system's choice) */
    int emulate_old;           /* a testing aid (SEPAL_SERVER_OLD of sepal-server): 0 none; SP_SERVER_OLD_NOPUSH
                                  behaves as a server before push: it says no capabilities (HELLO, record), gives no
                                  push token, reads requests without their await and push fields (an awaiting one
                                  then lacks its input: bad_request), answers INFERENCE_PUSH and SPAN_PUSH as
                                  unknown types and says no request's rate (rx_mbit); SP_SERVER_OLD_AWAIT says it can push but reads requests without
                                  their await fields (what a client meets where a record says more than its server
                                  does) */
    sp_server_limits limits;
} sp_server_opts;

enum { SP_SERVER_OLD_NOPUSH = 1, SP_SERVER_OLD_AWAIT = 2 };

/* Whether CUDA GPU gpu can be used at all (nothing started): SP_ERR_UNSUPPORTED "no usable GPU (WHY)" (no driver, no
 * device, a build without CUDA) or SP_ERR_ARG "no device N (...)". */
sp_status sp_device_probe(int gpu, sp_err *err);
/* 1 in a build of the server library with CUDA (sepal-server-cuda's), 0 without (sepal-server's). */
int sp_server_has_cuda(void);

/* The defaults: those of sepal-server's option table (opts.h), and what no option sets. */
void sp_server_opts_default(sp_server_opts *o);

typedef struct sp_server sp_server;

sp_status sp_server_start(sp_server **out, const sp_server_opts *o, sp_err *err);
int sp_server_port(const sp_server *s);
/* The blocks served, [start, end). */
void sp_server_span(const sp_server *s, int *start, int *end);
/* Positions a new session over the whole span can still get from the KV budget. */
long sp_server_cache_left(sp_server *s);
int sp_server_bulk_port(const sp_server *s);
/* The bulk port clients are told (opts.public_bulk_port when it listens on one, else that one; -1: none). */
int sp_server_public_bulk_port(const sp_server *s);
/* Where the blocks run: "cpu", or "cuda:N NAME" (--device). */
const char *sp_server_device(const sp_server *s);
/* The encoding the blocks are held in ("f32", "bf16", "int8", "nf4", "fp16"), and their bytes. */
const char *sp_server_dtype(const sp_server *s);
size_t sp_server_weight_bytes(const sp_server *s);
/* Measured (or cached) throughput: single-token inference steps/s over the span, 1024-token forward tok/s. */
void sp_server_throughput(const sp_server *s, double *inference_rps, double *forward_tps);
/* Sessions open now, and requests served so far. */
int sp_server_sessions(sp_server *s);
/* INFERENCE_PUSH messages taken into a session here (in), and pushes this server delivered (out). */
void sp_server_pushes(sp_server *s, uint64_t *in, uint64_t *out);
/* The most pushes this server had in flight at once (sent, their acknowledgements not yet come): a pass of decode
 * steps sends all its pushes before it awaits any. */
uint64_t sp_server_pushes_in_flight_peak(sp_server *s);
/* Training's pushed inputs and awaiting requests (SPAN_PUSH, sp_server_opts.await_bytes): bytes held now, the cap,
 * those dropped unclaimed at the step timeout so far, and pushes refused at the cap so far. */
typedef struct sp_server_awaits {
    size_t held, cap;
    uint64_t expired, refused;
} sp_server_awaits;
void sp_server_awaits_get(sp_server *s, sp_server_awaits *out);
/* What it says it can do (HELLO's and its record's caps): SP_CAP_* bits of ws/proto.h. */
int sp_server_caps(const sp_server *s);
/* Decode steps batched across sessions: passes run, rows through them, the most rows in one pass, and the queue
 * wait (sp_server_queue_wait: the load announced and told in INFO). */
typedef struct sp_server_batch_stats {
    uint64_t batches, rows, peak;
    uint64_t prefills;      /* steps of several positions (prefills) that ran through a pass */
    uint64_t long_prefills; /* ... of them, those of more than SP_KERN_MAX_ROWS rows (int8 and nf4 spans) */
    uint64_t waited_out;    /* passes that began at the end of their wait, a step expected in them missing */
    double queue_wait_s;
} sp_server_batch_stats;
void sp_server_batch_stats_get(sp_server *s, sp_server_batch_stats *out);
uint64_t sp_server_requests(sp_server *s);
/* The server's load, in seconds: the recent decode steps' wait in the queue (a moving average), or the wait so far of
 * the oldest step still queued when that is longer; 0 once nothing waits and no step has been taken
 * from the queue for 2 s and two passes (the average would otherwise keep an old load). */
double sp_server_queue_wait(sp_server *s);
/* 1 while the queue wait is over opts.max_queue_wait_s (when set): new inference sessions are refused. */
int sp_server_saturated(sp_server *s);
/* Bytes of activations kept now for BACKWARDs to come (FORWARD with meta "keep"). */
size_t sp_server_kept_bytes(sp_server *s);
/* Tells every connection with an open session that the server is shutting down (an ERROR "shutdown" its
 * client takes as the answer to what it waits for), before the connections close. */
void sp_server_goodbye(sp_server *s);
/* The limits in force, defaults resolved. */
void sp_server_limits_get(sp_server *s, sp_server_limits *out);
/* The largest request (bytes on the wire, f32) the span's limits accept: BACKWARD of max_batch_tokens positions
 * with deep prompts, or an INFERENCE_STEP prefill of cache_tokens positions with prompts. */
uint64_t sp_server_largest_request(int hidden, int nblocks, int max_batch_tokens, long cache_tokens);
/* Its metrics in Prometheus' text format (metrics.h), with what the program adds (x may be NULL); malloc'd, NULL
 * when out of memory. Scrapes should come from one thread (tokens_per_second is since the previous one). */
char *sp_server_metrics_text(sp_server *s, const sp_mx_extra *x);
void sp_server_stop(sp_server *s);

#endif
