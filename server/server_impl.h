/* server_impl.h - internals shared by the server's files (not a public header). */
#ifndef SEPAL_SERVER_IMPL_H
#define SEPAL_SERVER_IMPL_H

#include <pthread.h>
#include <stdint.h>

#include "block.h"
#include "kept.h"
#include "metrics.h"
#include "model.h"
#include "proto.h"
#include "push.h"
#include "server.h"
#include "transport.h"

/* ---------------------------------------------------------------------------------------------- */
/* inference sessions */

typedef struct span_dev span_dev; /* span.h: the span's blocks on a GPU */
typedef struct span_dev_kept span_dev_kept; /* span.h: a FORWARD's activations kept on that GPU */

typedef struct session {
    uint64_t id, conn;
    int start, end;       /* global block indices [start, end) */
    int B, max_length;
    int len;              /* positions cached */
    long cost;            /* bytes charged to the budget: B * max_length * (end - start) * kv_bytes */
    double created, last_used;
    int busy;             /* a worker is stepping it */
    int closed;           /* freed once not busy */
    /* its rhythm in batched passes (sessions_answered): when its last step's pass answered (sp_now_ns; 0: none
     * yet), and how long its last two steps came after the answer before them (0: not known, or at once) */
    uint64_t answered_ns, turn_ns[2];
    sp_kv_cache *kv;      /* end - start caches (host blocks) */
    struct span_dev *dev; /* --device cuda: its device (span.h), and end - start device caches */
    struct sp_cuda_kv **dkv;
    int ndkv;
    float *scratch;       /* a decode step's hidden states, sized at open (B x H floats) */
    size_t scratch_floats;
    sp_ws ws;             /* a decode step's block workspace, sized at open for max_length: steps allocate nothing */
    uint64_t token;       /* what an INFERENCE_PUSH into it must carry (random, told to the client at open) */
    /* server-to-server push: a step that awaits its input (the request, its connection and step number), and an
     * input that came before its step; each holds one message at most (a newer one replaces it) */
    sp_buf pend, inbox;
    uint64_t pend_conn, pend_step, inbox_step;
    uint64_t pend_ns;     /* when pend was kept (sp_now_ns; 0: none): its push is due (sessions_expected reads it under
                           * the table's lock, the thread holding the session writes it: atomics) */
    struct session *next;
} session;

typedef struct session_table {
    pthread_mutex_t lock;
    session *head;
    uint64_t next_id;
    long budget, used; /* bytes of KV cache */
    long kv_bytes;     /* one position of one block: 2 * kv_heads * head_dim * 4 (the model's family decides) */
    int count;
} session_table;

/* ---------------------------------------------------------------------------------------------- */
/* activations a FORWARD kept for the BACKWARD that follows (saves recomputing the span's forward) */

typedef struct kept {
    uint64_t conn, id;
    int start, end, B, T, P;
    float *inputs; /* (end - start) x [B, T, H]: each block's input, its prompt added */
    sp_block_acts *acts; /* (end - start) blocks' activations (NULL: only the inputs were kept) */
    span_dev_kept *dev;  /* a GPU server's: inputs and activations on the device (inputs, acts NULL) */
    int nacts;
    size_t bytes;
    double created;
    struct kept *next;
} kept;

typedef struct kept_table {
    pthread_mutex_t lock;
    kept *head;
    size_t bytes, cap;
    /* activation buffers of used-up entries, for the next FORWARD's (fresh memory costs a page fault per
     * 4 KiB: ~10% of a training step); at most cap / 4 bytes */
    pthread_mutex_t pool_lock;
    sp_block_acts *pool;
    int npool, cappool;
    size_t pool_bytes;
} kept_table;

/* ---------------------------------------------------------------------------------------------- */
/* training's pushed passes (awaits.c): requests awaiting their pushed input, and inputs pushed before their request */

typedef struct await_entry {
    uint64_t id, token;
    sp_buf input;       /* the SPAN_PUSH message, once it came (len 0: not yet) */
    sp_buf pend;        /* the awaiting request, parked until its input comes (len 0: none) */
    uint64_t pend_conn;
    double created;
    struct await_entry *next;
} await_entry;

typedef struct await_table {
    pthread_mutex_t lock;
    await_entry *head;
    size_t bytes, cap; /* of the inputs and parked requests held */
    uint64_t expired;  /* inputs and parked requests dropped at the step timeout (sp_server_awaits_get) */
    uint64_t refused;  /* pushes refused at the cap */
} await_table;

/* ---------------------------------------------------------------------------------------------- */
/* work queue: inference first, then forward/backward; within a priority, round-robin over the clients (peers, by
 * source address), each client's requests first come, first served */

/* What a training request must share with others to run in one pass with them (rpc.c, sp_rpc_span_key). */
typedef struct sp_span_key {
    int type;         /* SP_MSG_FORWARD or SP_MSG_BACKWARD */
    int start, end;   /* its span */
    int T, P;         /* positions, deep prompts' length (0: none) */
    int rows;         /* B x T */
} sp_span_key;

typedef struct task {
    uint64_t conn;
    uint64_t peer;   /* its connection's source address (sp_ws_server_peer): the client it is fair between */
    uint64_t session; /* the session whose input it brings: an INFERENCE_STEP's with its own input, or an
                       * INFERENCE_PUSH's (sp_rpc_step_session; 0: none read, or a step that awaits its input) */
    sp_buf msg;      /* the raw request */
    int prio;        /* 0 inference, 1 training */
    int step;        /* an INFERENCE_STEP (its time feeds step_ns) */
    int merges;      /* a FORWARD or BACKWARD that may share a pass with others of its key */
    sp_span_key key;
    uint64_t len;    /* the request's bytes, given back to the input budget when done */
    int acked;       /* an INFERENCE_PUSH acknowledged on arrival (sp_rpc_push_ack) */
    uint64_t queued_ns; /* when it entered the queue (sp_now_ns) */
    uint64_t passed;    /* tasks of other clients taken from the queue while it waited (lock held) */
    struct task *next;
} task;

#define PEERS_SEEN 64

typedef struct task_queue {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    task *head[2], *tail[2];
    uint64_t rr[2];  /* the peer whose turn came last, per priority: the next turn goes to the next peer after it */
    task *spare; /* handled tasks, for the next requests (no allocation per request) */
    int nspare;
    int stop;
    /* the clients whose tasks were taken last (PEERS_SEEN, the oldest replaced): per priority, the most tasks of
     * other clients taken from the queue while one of theirs waited (how fair the turns were, as the server took
     * them: INFO tells a client its own, sp_server_passed), in the window that began at since_ns and in the one
     * before it (window_ns long); lock held */
    struct peer_seen {
        uint64_t peer, passed[2], before[2], since_ns;
    } seen[PEERS_SEEN];
    int seen_next;
    uint64_t window_ns;
} task_queue;

/* ---------------------------------------------------------------------------------------------- */

struct sp_server {
    sp_server_opts o;
    char model_dir[4096];
    char model_name[256];
    sp_model *m; /* blocks [m->first, m->last) only */
    span_dev *dev;         /* --device cuda: the span on the GPU (span.h); NULL: on the host */
    char device_name[160]; /* "cuda:N NAME" */
    sp_ws_server *ws;
    sp_proto_limits limits;
    task_queue q;
    pthread_t *workers;
    int nworkers;
    session_table st;
    kept_table kt;
    await_table aw;
    pthread_t reaper;
    pthread_mutex_t reaper_lock;
    pthread_cond_t reaper_cond;
    int reaper_stop, reaper_started;
    double inference_rps, forward_tps;
    int inline_steps; /* short inference steps run on the transport thread (no hand-off to a worker) */
    uint64_t step_ns; /* atomic: recent INFERENCE_STEPs' handling time (a moving average, seeded from the measured
                       * speed): steps run inline while it is under 1 ms, whatever a stale measurement said */
    int blas_threads; /* OpenBLAS threads for large requests (its setting at start) */
    sp_ws inline_ws;  /* scratch of the inline steps */
    pthread_mutex_t inline_lock; /* one inline step at a time (ws and bulk threads may both try) */
    pthread_mutex_t stats_lock;
    uint64_t requests;
    /* batched decode steps (rpc.c, server.c): one pass at a time; sizes and times are atomics */
    pthread_mutex_t batch_lock;
    uint64_t batches, batched_rows, batch_peak; /* passes, rows through them, the most rows in one */
    uint64_t batched_prefills; /* steps of several positions (prefills) that ran in a pass */
    uint64_t batched_long;     /* ... of more than SP_KERN_MAX_ROWS rows (int8 and nf4 spans) */
    uint64_t waited_out;       /* passes that began at the end of their wait, an expected step missing */
    uint64_t batch_ns;       /* recent passes' time (a moving average) */
    uint64_t queue_wait_ns;  /* recent steps' wait in the queue (a moving average): the announced load */
    uint64_t waited_at_ns;   /* when the last step was taken from the queue (sp_now_ns) */
    sp_server_metrics mx; /* --metrics (metrics.h) */
    pthread_mutex_t mx_lock;
    sp_swarm_key key; /* o.key points here */
    int pushing;      /* a step asked for a push: steps go to the workers (a push waits for its acknowledgement) */
    pthread_mutex_t push_lock; /* the table of connections pushes go out on (push.c) */
    struct push_conn *push_conns;
    int npush_conns;
    uint64_t pushes_in, pushes_out; /* atomic: sp_server_pushes */
    uint64_t pushes_in_flight, pushes_in_flight_peak; /* atomic: pushes sent and not yet acknowledged (or given up):
                                                        now, and the most at once (sp_server_pushes_in_flight_peak) */
};

/* server.c: for the client (source address) of connection conn, the most requests of other clients taken from
 * the queue while one of its own waited, over the last one to two windows (opts.passed_window_s): inference [0],
 * training [1] (0: none seen; INFO's passed_inference and passed_training). */
void sp_server_passed(sp_server *s, uint64_t conn, uint64_t passed[2]);
/* server.c: tasks waiting in the queue now. */
int queue_length(task_queue *q);

/* rpc.c: runs one request on a worker (ws = that worker's scratch) and sends the reply, in msg's buffer (which is
 * then taken: *msg is left empty; its length must be read before, for the budget). */
void sp_rpc_handle(sp_server *s, uint64_t conn, sp_buf *msg, sp_ws *ws);
/* rpc.c: sp_rpc_handle of a request that may be an INFERENCE_PUSH acknowledged on its arrival (acked: then it is not
 * acknowledged again, and what fails after is logged, not answered: sp_rpc_push_ack). */
void sp_rpc_handle_task(sp_server *s, uint64_t conn, sp_buf *msg, int acked, sp_ws *ws);
/* rpc.c: an INFERENCE_PUSH acknowledged on its arrival (the transport thread), where it would be taken (its metadata,
 * its input: a finite float [B, T, H]; a session held here with that push token): 1. Else 0: nothing is answered
 * (its worker answers it, as without). A pass that waits for the pushes of the sessions it expects thus holds
 * none's acknowledgement: the server before, which awaits its pass's acknowledgements before its next pass, sends
 * the pushes of that one meanwhile. */
int sp_rpc_push_ack(sp_server *s, uint64_t conn, const sp_buf *msg);
/* rpc.c: INFERENCE_STEPs and INFERENCE_PUSHes taken from the queue together (msgs[i] from connection conns[i]; each
 * buffer taken as sp_rpc_handle takes it): the decode steps and prefills whose rows (batch x positions) alone run in
 * the decode kernels (sp_block_rows_exact: up to SP_KERN_MAX_ROWS, any number on int8 and nf4 weights multiplied in
 * integers), at most max_batch_tokens rows in all, run as one pass over the span's blocks (block.h,
 * sp_block_step_batch: each session gets the bits it gets alone), the rest (longer prefills of f32 or bf16 weights,
 * prompts, wide beams) one by one after it. A push whose step awaits it here (stashed), and a step that awaits its
 * input that came already, join the pass as a step with its own input would; a push or an awaiting step whose other
 * half has not come is kept in its session (rpc_push, step_await). b: the worker's buffers, kept. ids[i]: the
 * session whose step msgs[i] brought to its blocks (0: none: it kept a half, or failed before). Returns how many of
 * msgs did more than keep a half (0: no blocks ran, nothing was answered but acknowledgements: not a pass). */
typedef struct sp_step_batch sp_step_batch;
sp_step_batch *sp_step_batch_new(void);
void sp_step_batch_free(sp_step_batch *b);
int sp_rpc_handle_steps(sp_server *s, const uint64_t *conns, sp_buf *const *msgs, const int *acked, int n,
                        sp_step_batch *b, sp_ws *ws, uint64_t *ids);
/* rpc.c: a SPAN_PUSH, answered on the transport thread (it computes nothing): its message is taken, and the request
 * it unparks (if any) comes back in *pend with its connection *pend_conn, for the queue. */
void sp_rpc_span_push(sp_server *s, uint64_t conn, sp_buf *msg, uint64_t *pend_conn, sp_buf *pend);
/* rpc.c: the key of a FORWARD or BACKWARD that may run in a pass with others (0), or -1 (it runs alone: not such a
 * request, --no-batch, a span on a GPU or of MoE blocks, at most SP_KERN_MAX_ROWS rows, one that awaits a pushed
 * input or pushes its output (any of the push fields: awaits.c), or a message that does not decode, which its
 * handler then answers). Decodes only the header, metadata and shapes (the transport thread). */
int sp_rpc_span_key(const sp_server *s, const sp_buf *msg, sp_span_key *k);
/* rpc.c: the session whose step's input msg brings: an INFERENCE_STEP's with its own, an INFERENCE_PUSH's; 0 for a
 * step that awaits its input (its push brings it), another type, or a message that does not decode (its handler then
 * answers it). Decodes only the header and metadata (the transport thread). */
uint64_t sp_rpc_step_session(const sp_server *s, const sp_buf *msg);
/* rpc.c: FORWARDs (or BACKWARDs) of one key taken from the queue together (msgs[i] from connection conns[i], each
 * buffer taken as sp_rpc_handle takes it) as one pass over their span's blocks: each gets the bits it gets alone
 * (block.h, sp_block_forward_items) and its own reply; one that fails its checks gets its ERROR and the others
 * go on. None of them awaits a pushed input or pushes its output (their key is -1: they run alone, through
 * sp_rpc_handle). */
void sp_rpc_handle_spans(sp_server *s, const uint64_t *conns, sp_buf *const *msgs, int n, sp_ws *ws);
/* rpc.c: requests answered on the transport thread (HELLO, INFO, PING); 1 if handled. */
int sp_rpc_handle_inline(sp_server *s, uint64_t conn, const sp_buf *msg);
/* Sends an ERROR reply. */
void sp_rpc_error(sp_server *s, uint64_t conn, uint64_t request_id, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* session.c */
void sessions_init(session_table *t, long budget, long kv_bytes);
void sessions_destroy(session_table *t);
/* Opens a session (fails with SP_ERR_RANGE "out of cache" if the budget does not allow it): its id and push token. */
sp_status session_open(sp_server *s, uint64_t conn, int start, int end, int B, int max_length, uint64_t *id,
                       uint64_t *token, sp_err *err);
/* Takes a session for stepping (marks it busy); NULL if unknown, not this connection's, or busy. */
session *session_acquire(sp_server *s, uint64_t conn, uint64_t id, sp_err *err);
/* As session_acquire, but waits (up to 5 s) while another worker holds it: a step that awaits its input and the
 * push that brings it may come at once. conn 0: any connection's session, if token is its push token (else NULL
 * with SP_ERR_ARG "wrong push token ..."). */
session *session_acquire_wait(sp_server *s, uint64_t conn, uint64_t id, uint64_t token, sp_err *err);
/* Whether session id is held here with push token `token` (a push into it would be taken). */
int session_push_ok(sp_server *s, uint64_t id, uint64_t token);
/* As session_acquire_wait, but waits at most wait_us microseconds (0: not at all): NULL with SP_ERR_STATE while it
 * is held (a batched pass takes a pushed step's session so, and runs the step apart, after the pass, where busy). */
session *session_acquire_within(sp_server *s, uint64_t conn, uint64_t id, uint64_t token, int wait_us, sp_err *err);
/* Frees the session's awaiting step and early input (a step that brings its own input supersedes them). */
void session_drop_push(session *x);
void session_release(sp_server *s, session *x);
sp_status session_close(sp_server *s, uint64_t conn, uint64_t id, sp_err *err);
void sessions_close_conn(sp_server *s, uint64_t conn);
/* The steps of sessions ids[0..n) (0: none) were answered by one pass at now, tasks[i] the request that brought step
 * i's input (its own step, or the push into it, or the step that found its pushed input here): each session's answer
 * time, and how long that input came after its previous answer (its turn: the client's own work, or a chain of other
 * servers, between two steps). */
void sessions_answered(sp_server *s, task *const *tasks, const uint64_t *ids, int n, uint64_t now);
/* The sessions a pass gathering from now until deadline waits for (up to max ids into ids; their count): those
 * whose next step is due by the deadline (their last answer plus the shorter of their last two turns) and at most
 * late_ns overdue (a session that stopped stepping is not waited for). */
int sessions_expected(sp_server *s, uint64_t now, uint64_t deadline, uint64_t late_ns, int awaiting, uint64_t *ids,
                      int max);
/* Closes sessions idle past the step timeout or older than the session timeout; returns how many. */
int sessions_reap(sp_server *s, double now);
long sessions_tokens_available(sp_server *s);

/* kept.c */
void kept_init(kept_table *t, size_t cap);
void kept_destroy(kept_table *t);
/* Stores x (takes ownership), evicting the oldest entries beyond the cap. */
void kept_put(sp_server *s, kept *x);
/* Removes and returns the entry for this request, or NULL (then the caller recomputes). */
kept *kept_take(sp_server *s, uint64_t conn, uint64_t id, int start, int end, int B, int T, int P);
void kept_drop(sp_server *s, uint64_t conn, double older_than);
void kept_free(kept_table *t, kept *x);
/* An activation buffer from the pool (zeroed struct if none), and back. */
void kept_acts_get(kept_table *t, sp_block_acts *a);
void kept_acts_put(kept_table *t, sp_block_acts *a);

/* awaits.c */
void awaits_init(await_table *t, size_t cap);
void awaits_destroy(await_table *t);
/* A SPAN_PUSH's message (input, taken on success) for the request awaiting id with token: kept for it, and when that
 * request is parked, it comes back in *pend (with its connection *conn) for the queue. SP_ERR_ARG: a request awaits
 * id with another token; SP_ERR_STATE: its input came already; SP_ERR_RANGE: over the cap. */
sp_status awaits_arrive(sp_server *s, uint64_t id, uint64_t token, sp_buf *input, uint64_t *conn, sp_buf *pend,
                        sp_err *err);
/* A request (its message req, from conn) that awaits id with token: 1 with its input in *input (the entry done); 0
 * parked (req taken) until the input comes; -1 with err (another request awaits id, out of memory). */
int awaits_take(sp_server *s, uint64_t id, uint64_t token, uint64_t conn, sp_buf *req, sp_buf *input, sp_err *err);
/* Drops the entries created before older_than (a parked request gets ERROR `timeout`) and the parked requests of
 * connection conn (UINT64_MAX: none), which closed. */
void awaits_expire(sp_server *s, double older_than, uint64_t conn);

/* push.c (a step's push: push.h): training's passes' SPAN_PUSH of out (a FORWARD's output, a BACKWARD's grad_in)
 * to the request that awaits q's push_id at q's push_host:push_port, with its token, as sp_push_send. */
sp_status sp_span_push_send(sp_server *s, const sp_span_req *q, const sp_tensor_src *out, sp_err *err);
void sp_push_close_all(sp_server *s);

/* throughput.c */
void sp_throughput_measure(sp_server *s);

#endif
