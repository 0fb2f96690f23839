/* transport_impl.h - internals shared by the transport's files (not a public header).
 *
 *   frame.c      the framing core both sides use: message queues, header checks, ws reassembly (rxasm),
 *                stream reassembly (rxstream), fragmenting sends, deferred closes, lws logging
 *   ws_server.c  the server's websocket side and the public sp_ws_server API
 *   ws_client.c  the client's websocket side and the public sp_ws_client API
 *   bulk.c       the bulk TCP channel: the server's poll() thread, the client's socket
 *
 * Threads and ownership
 *   - Each server and each client owns one lws context and one service thread. Only that thread calls lws
 *     (except lws_cancel_service, which is documented as safe from anywhere). Other threads put messages on
 *     a queue under the object's mutex and wake the loop; LWS_CALLBACK_EVENT_WAIT_CANCELLED then asks for
 *     WRITEABLE callbacks, and each WRITEABLE sends one 64 KiB fragment.
 *   - A server's bulk sockets are served by one poll() thread with non-blocking sockets; senders queue on the
 *     socket and wake it through an eventfd, so a slow peer never blocks the caller or the other sockets.
 *   - A server connection ("conn") is shared by its two channels: it holds one reference for the live ws
 *     and one for an attached bulk socket. Whichever channel drops the last reference calls on_close and
 *     frees the conn, so on_close comes exactly once and after every on_message of that conn.
 *   - A client writes bulk messages from the sending thread (blocking) and reads them on a reader thread. */
#ifndef SEPAL_TRANSPORT_IMPL_H
#define SEPAL_TRANSPORT_IMPL_H

#include <libwebsockets.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/socket.h>

#include "log.h"
#include "transport.h"

#define FRAG_SIZE (64u << 10)       /* ws fragment and lws rx/tx buffer size: the spike's best setting */
#define HDR SP_PROTO_HEADER_SIZE    /* 40 */
#define BULK_PREAMBLE 16            /* "SPBK", u32 status/zero, u64 token */
enum { BULK_ACCEPTED = 0, BULK_REFUSED = 1, BULK_BUSY = 2 }; /* the answer's status: BULK_BUSY when too many sockets
                                                                wait for their token (retry later, same token) */
#define BULK_MAX_PENDING 64         /* bulk sockets that have not presented a token yet (at most max_pending) */
#define BULK_PENDING_PER_IP 16      /* ... from one address (at most max_pending_per_ip); they have
                                       handshake_timeout_s to do it */
#define LISTEN_PAUSE_NS 100000000ull /* a listener that cannot accept (out of descriptors) rests this long */
#define BULK_READ_BUDGET (8u << 20) /* bytes read from one socket per poll round (fairness) */
#define DEFAULT_BULK_THRESHOLD (64u << 10)

_Static_assert(SP_BUF_HEADROOM >= LWS_PRE, "lws writes its frame header into the sp_buf headroom");

/* ---------------------------------------------------------------------------------------------- */
/* small helpers */

static inline uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static inline void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Moves b's contents out, leaving an empty buffer (ownership transfer). */
static inline sp_buf buf_take(sp_buf *b)
{
    sp_buf t = *b;
    *b = (sp_buf){0};
    return t;
}

/* lws logs through sp_log (warnings and errors only); idempotent. */
void tp_lws_log_init(void);
/* Fills dst with the defaults, then what src sets. */
void tp_resolve_opts(sp_transport_opts *dst, const sp_transport_opts *src);
sp_proto_limits tp_limits_for(const sp_transport_opts *o);
/* Grows *arr (elements of elem bytes) to hold need; -1 when out of memory. */
int tp_grow(void **arr, size_t *cap, size_t need, size_t elem);
/* CLOCK_MONOTONIC nanoseconds timeout_ms from now. */
uint64_t tp_deadline_after(int timeout_ms);
/* TCP_NODELAY (the kernel autotunes the buffers). */
void tp_tune_socket(int fd);
/* A non-blocking IPv4 socket listening on host:port ("0.0.0.0": every interface; port 0: any) with a queue of
 * backlog: its descriptor into *fd, the port it got into *bound. The error says "host:port: why" (the caller puts
 * what it is for first). */
sp_status tp_listen(const char *host, int port, int backlog, int *fd, int *bound, sp_err *err);
int tp_set_nonblock(int fd, int on);

/* ---------------------------------------------------------------------------------------------- */
/* message queues (a FIFO of owned buffers; the owner's mutex protects it) */

typedef struct qnode {
    struct qnode *next;
    sp_buf buf;
} qnode;

typedef struct msgq {
    qnode *head, *tail;
    uint64_t bytes; /* of the messages in it */
    qnode *spare;   /* nodes of popped messages, for the next pushes (no allocation per message) */
    int nspare;
} msgq;

#define MSGQ_SPARE 8 /* spare nodes a queue keeps */

/* Takes *msg (also on failure, when it is freed). */
int tp_msgq_push(msgq *q, sp_buf *msg);
/* As tp_msgq_push, first in the queue (the rest of a message whose beginning was sent already). */
int tp_msgq_push_front(msgq *q, sp_buf *msg);
int tp_msgq_pop(msgq *q, sp_buf *out);
/* Frees every message and the spare nodes; returns the messages' bytes. */
uint64_t tp_msgq_clear(msgq *q);

/* ---------------------------------------------------------------------------------------------- */
/* reassembly: ws messages (frames give the boundary) and streams (the header gives it) */

enum { RX_BAD = -1, RX_MORE = 0, RX_DONE = 1, RX_WAIT = 2 };

/* Admission of a message whose header just arrived (total = 40 + body_len): 1 go on (its buffer is
 * reserved), 0 wait (nothing past the header is taken; feed again later), -1 refuse (*code and err set). */
typedef int (*tp_admit_fn)(void *user, uint64_t total, int *code, sp_err *err);

typedef struct rxasm {
    sp_buf buf;
    uint64_t want;     /* 40 + body_len once the header is in, else 0 */
    int admitted;      /* want's bytes are reserved */
    uint64_t map_from; /* messages of at least this size get a mapping of their own (0: never) */
} rxasm;

void tp_rxasm_reset(rxasm *a);
/* Feeds one piece of a ws message (admit may be NULL: always admitted). RX_DONE moves the complete message
 * to *out; RX_WAIT: admit said wait, *used bytes of p were taken (the rest must be fed again, with final, once
 * the message may go on). The cap is checked before anything is buffered, so an oversize message costs at
 * most one piece. On RX_BAD *code is the ws close status to use (1009 too large, 1002 malformed). */
int tp_rxasm_feed(rxasm *a, const uint8_t *p, size_t n, int final, const sp_proto_limits *lim, tp_admit_fn admit,
                  void *au, size_t *used, sp_buf *out, int *code, sp_err *err);

typedef struct rxstream {
    uint8_t hdr[HDR];
    size_t hlen;
    sp_buf buf;
    uint64_t want;     /* 0 while reading the header (or waiting for its admission) */
    uint64_t map_from; /* as rxasm's */
} rxstream;

/* The timing of a bulk message being received, by a client or a server (bulk.c): t0 the read that completed its
 * header, or its admission (0: none in progress), queued the bytes already waiting in the socket then. */
typedef struct rx_pace {
    uint64_t t0;
    uint64_t queued;
} rx_pace;

/* Where the next read should land and how much it may take. */
void tp_rxstream_target(rxstream *r, uint8_t **p, size_t *n);
/* Accounts for got bytes read at tp_rxstream_target (admit may be NULL). RX_WAIT: the header is in and admit
 * said wait; call again with got = 0 to retry. */
int tp_rxstream_advance(rxstream *r, size_t got, const sp_proto_limits *lim, tp_admit_fn admit, void *au, sp_buf *out,
                        int *code, sp_err *err);

/* ---------------------------------------------------------------------------------------------- */
/* ws sending and closing (service thread) */

typedef struct txstate {
    sp_buf cur;
    size_t off;
    int busy; /* cur is being sent (a message may be empty, so len cannot tell) */
} txstate;

/* Sends the next fragment of tx->cur: 1 when the message is complete, 0 if more remain, -1 on error. */
int tp_send_fragment(struct lws *wsi, txstate *tx);
void tp_tx_reset(txstate *tx);
/* Closes a ws from inside its callback with a status and a short reason; returns -1 (return it to lws). */
int tp_close_ws(struct lws *wsi, int code, const char *why);

/* A ws that must close because of what it received. The close happens in the next WRITEABLE callback, not by
 * returning -1 from RECEIVE: in 4.1.6 that can crash when the data came from the wsi's buffer list
 * (lws_service_do_ripe_rxflow uses the wsi after closing it; seen under ASan on the client side). Input that
 * arrives meanwhile is dropped. Service thread only. */
typedef struct rxfail {
    int failed, code;
    char why[121];
    int reply;           /* server: a protocol ERROR goes out before the close frame */
    uint64_t reqid;      /* its request id: the failed message's, if its header got that far */
    const char *errcode; /* its code ("version", "malformed", ...: sp_msg_reject_code) */
} rxfail;

/* Records the first failure and asks for a WRITEABLE callback; returns 0. */
int tp_defer_close(struct lws *wsi, rxfail *f, int code, const char *why);
/* LWS_CALLBACK_HTTP_CONFIRM_UPGRADE without touching `in` (NN-2025-0102); 0 only for "websocket". */
int tp_confirm_upgrade(struct lws *wsi);

/* ---------------------------------------------------------------------------------------------- */
/* server */

#define PREAUTH_MAX 4096       /* bytes of a message before the handshake is complete */
#define SWEEP_US 100000        /* the service thread's sweep: deadlines, idle, waits */
#define MSG_GRACE_NS 10000000000ull /* an admitted message has this long plus size / min_rate to arrive */
#define MAP_FROM (1u << 20)    /* received messages this large get their own mapping: freed, they leave the RSS */

/* A source address and what it holds (mu). IPv4 as IPv4-mapped IPv6. */
typedef struct src_entry {
    uint8_t addr[16];
    char name[48];
    int conns, pending, bulk_pending;
    uint64_t used; /* budget bytes */
} src_entry;

enum { PH_HTTP, PH_WS, PH_READY };   /* accepted (upgrading), upgraded (first message due), ready */
enum { AUTH_NONE, AUTH_CHALLENGED, AUTH_DONE };

/* A piece of ws input held while its message waits for budget (lws may deliver what it had read). */
typedef struct piece {
    struct piece *next;
    int final;
    size_t len;
    uint8_t data[];
} piece;

typedef struct bsock bsock;
typedef struct sp_ws_server sp_ws_server;

typedef struct conn {
    uint64_t id;
    struct lws *wsi; /* mu; NULL once the ws channel is closed */
    int refs;        /* mu: 1 for the live ws + 1 for an attached bulk socket */
    int dead;        /* mu: sends fail; the other channel is being closed */
    int close_req;   /* mu: the service thread should close the ws */
    uint64_t token;  /* mu: outstanding bulk token, 0 = none */
    bsock *bulk;     /* mu */
    msgq txq;        /* mu: ws output */
    _Atomic uint64_t last_ns; /* last traffic on either channel (idle timeout) */
    /* mu: limits */
    src_entry *src;
    int phase;               /* PH_*; READY is final */
    int opened;              /* the websocket was established: on_close is due */
    int reported;            /* on_close was called */
    int pending_counted;     /* counted in the handshake caps (until READY or the end) */
    uint64_t in_bytes;       /* charged: messages being received or delivered and not yet released */
    uint64_t out_bytes;      /* charged: output queued and not yet sent */
    int pins;                /* delivered messages not yet released (app_releases); a closed conn stays until 0 */
    int holds;               /* sp_ws_server_hold */
    int out_full;            /* out_bytes went over tx_bound (cleared at half of it) */
    int flagged;             /* queued on s->wakeq */
    size_t slot;             /* index in s->conns */
    uint64_t accepted_ns, upgraded_ns;
    const char *close_why;   /* with close_req: the close frame's reason */
    int closing;             /* the sweep closed it (idle, handshake): not counted again */
    double rx_mbit;          /* the arrival rate of its last measured bulk message, not yet taken (0: none;
                                sp_ws_server_rx_take) */
    /* service thread only */
    txstate tx;
    rxasm rx;
    rxfail fail;
    int auth;                /* AUTH_* */
    uint8_t nonce_s[32], nonce_c[32];
    uint64_t auth_reqid;
    uint64_t ws_reserved;    /* charged for the ws message being received */
    uint64_t ws_deadline_ns; /* ... by when it must be complete */
    piece *stash, *stash_tail; /* waiting input */
    size_t stash_bytes;
    uint64_t wait_ns;        /* 0, or since when the ws message waits for budget */
    uint64_t paused_ns;      /* 0, or since when reading is paused for unsent output */
    int rx_off;              /* lws rx flow control is off */
    int ws_gone;             /* the ws channel let go of the conn */
    uint64_t tx_charge;      /* charge of the message being sent (tx.cur) */
} conn;

struct bsock {
    int fd;
    sp_ws_server *server;
    conn *c;   /* mu (written only by the bulk thread, which may read it unlocked) */
    int kill;  /* mu: close requested by another thread */
    msgq txq;  /* mu */
    int direct; /* mu: another thread writes a message on fd now (tp_bulk_send_direct): the bulk thread neither
                 * writes nor closes the socket meanwhile */
    src_entry *src; /* mu: counted in its bulk_pending until attached */
    /* bulk thread only */
    uint8_t pre[BULK_PREAMBLE];
    size_t prelen;
    uint64_t deadline_ns; /* for presenting the token */
    rxstream rx;
    rx_pace pace;             /* the timing of the message in rx */
    sp_buf cur;
    size_t cur_off;
    int busy, dead;           /* busy: set and cleared under mu (tp_bulk_send_direct reads it) */
    uint64_t reserved;        /* charged for the message being received */
    uint64_t msg_deadline_ns; /* ... by when it must be complete (mu: the sweep reads it) */
    uint64_t wait_ns;         /* mu: 0, or since when its message waits for budget */
    uint64_t wait_reqid;      /* mu: that message's request id */
    uint64_t tx_charge;       /* charge of the message being sent (cur) */
};

struct sp_ws_server {
    sp_transport_opts o;
    char host[256];
    sp_proto_limits lim;
    sp_server_on_message on_message;
    sp_server_on_close on_close;
    void *user;
    struct lws_context *ctx;
    struct lws_vhost *vh;
    struct lws_protocols protocols[4];
    int port, bulk_port;
    pthread_t svc, bulk;
    int svc_started, bulk_started;
    atomic_int svc_stop, bulk_stop;
    int has_key;
    sp_swarm_key key;

    pthread_mutex_t mu;
    int stopping;      /* mu */
    uint64_t next_id;  /* mu */
    conn **conns;      /* mu: every conn, zombies (closed, pinned) included */
    size_t nconns, capconns;
    uint64_t *ids;     /* mu: open-addressing index id -> slot + 1 (0 empty), capids a power of two */
    size_t capids;
    uint64_t *wakeq;   /* mu: ids the service thread should look at */
    size_t nwakeq, capwakeq;
    src_entry **srcs;  /* mu */
    size_t nsrcs, capsrcs;
    int live, pending; /* mu: open connections (not zombies), and those in their handshake */
    int waiting;       /* mu: messages waiting for budget (either channel) */
    uint64_t used;     /* mu: budget bytes charged */
    sp_ws_server_stats st; /* mu: counters */

    int ws_fd;         /* our listening socket (lws polls it as a raw file) */
    struct lws *ws_listen_wsi; /* ... its wsi (service thread) */
    uint64_t ws_listen_rest_ns; /* service thread: not polled until then (rx flow control; 0: it is) */
    int ws_fd_owned_by_lws; /* ... and closes it with the context */
    int spare_fd;      /* held open to be given up when accept runs out of descriptors */
    conn *adopting;    /* service thread: the conn being handed to lws */
    lws_sorted_usec_list_t sweep;
    uint64_t last_trim_ns, trim_mark; /* malloc_trim after a large drop of the budget */

    int listen_fd, wake_fd;
    int bulk_spare_fd;             /* bulk thread: the bulk listener's own spare descriptor */
    uint64_t bulk_listen_rest_ns;  /* bulk thread: the listener is not polled until then (0: it is) */
    bsock **socks; /* bulk thread only (and stop, after it is joined) */
    size_t nsocks, capsocks;
    uint64_t *scratch; /* service thread: ids taken off wakeq */
    size_t capscratch;
};

/* ws_server.c: rate-limited logs of refused and failed peers (the sweep flushes their counts) */
extern sp_log_limit tp_log_refused, tp_log_failed;

/* limits.c (mu held unless said): the connection table, sources, the budget */
conn *tp_find_conn(sp_ws_server *s, uint64_t id);
int tp_conn_insert(sp_ws_server *s, conn *c);   /* -1 when out of memory */
void tp_conn_remove(sp_ws_server *s, conn *c);
src_entry *tp_src_get(sp_ws_server *s, const uint8_t addr[16]); /* found or added; NULL when out of memory */
void tp_src_put(sp_ws_server *s, src_entry *e);                 /* drops it once it holds nothing */
void tp_src_name(const uint8_t addr[16], char *out, size_t cap);
void tp_addr_of(const struct sockaddr *sa, uint8_t addr[16]);
/* Charges din / dout bytes (negative: releases) to c, its source and the total; wakes waiters on a release
 * and flags the flow control on crossings of tx_bound. */
void tp_charge(sp_ws_server *s, conn *c, int64_t din, int64_t dout);
/* Room for a message of total bytes on c: 1 (charged), 0 (wait), -1 (larger than c's share can ever hold). */
int tp_admit(sp_ws_server *s, conn *c, uint64_t total);
/* Asks the service thread to look at c (flow control, a failure to act on). */
void tp_flag(sp_ws_server *s, conn *c);
/* Resolves the limits' defaults into s->o. */
void tp_resolve_limits(sp_ws_server *s);
/* Descriptors of the listeners (either thread; mu not held). accept4 (non-blocking, close-on-exec) on a listener;
 * every accept of both goes through here, under one process-wide lock that tp_shed holds too. */
int tp_accept(int lfd, struct sockaddr *sa, socklen_t *sl);
/* Out of descriptors on listener lfd: the spare descriptor *spare is given up so that what waits in the backlog
 * can be accepted and refused (refuse answers and closes it; at most 64), then taken back. Returns how many were
 * refused, or -1 when none could be for want of a descriptor (the spare was lost and cannot be had again yet):
 * the caller rests the listener LISTEN_PAUSE_NS rather than poll it again at once (level-triggered, it would
 * spin). */
int tp_shed(int lfd, int *spare, void (*refuse)(int fd));
/* A spare lost to another thread, taken back when a descriptor is free (no-op while it is held). */
void tp_spare_retake(int *spare);

/* ws_server.c */
/* A channel lets go of c (mu not held): the last one out reports the close; the conn is freed once nothing
 * is pinned either. */
/* Drops a channel's reference to c (mu held): 1 when it was the last, c then pinned until tp_conn_release (called
 * with that result once mu is let go) takes the pin over. */
int tp_conn_let_go(conn *c);
void tp_conn_release(sp_ws_server *s, conn *c, int last);
/* Delivers a complete message of c (ws: from the service thread, else the bulk thread): the handshake's
 * gates, then on_message. */
void tp_deliver(sp_ws_server *s, conn *c, sp_buf *msg, int ws);

/* bulk.c (server side) */
sp_status tp_bulk_listen(sp_ws_server *s, sp_err *err);
void *tp_bulk_main(void *arg);
void tp_bulk_close(sp_ws_server *s, bsock *b);
void tp_wake_bulk(sp_ws_server *s);
/* Messages up to this size may be written by the sending thread itself (tp_bulk_send_direct). */
#define TP_DIRECT_MAX (64 * 1024)
int tp_bulk_send_direct(sp_ws_server *s, conn *c, sp_buf *msg);
/* Whether the caller is s's bulk thread (which writes what it queued before it polls again: no wake-up). */
int tp_on_bulk_thread(const sp_ws_server *s);

/* auth.c: the swarm key exchange, server side (service thread): handles an AUTH message (or refuses a
 * message that came before the exchange finished). 0 while it goes on or once done, -1 after c was failed. */
int tp_auth_server(sp_ws_server *s, conn *c, const sp_buf *msg);

/* ---------------------------------------------------------------------------------------------- */
/* client */

enum { C_CONNECTING, C_OPEN, C_CLOSED };

struct sp_ws_client {
    sp_transport_opts o;
    sp_proto_limits lim;
    char host[256];
    char source[64]; /* the local address it connects from (o.source; "": any) */
    int port;
    struct lws_context *ctx;
    struct lws_protocols protocols[2];
    pthread_t svc, reader;
    int svc_started, reader_started;
    atomic_int svc_stop;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state;        /* mu */
    int close_req;    /* mu */
    char why[200];    /* mu: why it closed or failed */
    msgq txq, rxq;    /* mu */
    int bulk_fd;      /* mu (set once by attach) */
    int attaching;    /* mu */
    pthread_mutex_t bulk_wmu; /* serialises writers on the bulk socket */
    int wake_fd;      /* direct_recv: an eventfd poked whenever rxq or state changes, -1 otherwise */
    rxstream drs;     /* direct_recv: the caller's reassembly of bulk messages */
    rx_pace dpace;    /* ... and its timing */
    int rx_full;      /* mu: rxq went over rx_queue_max: the ws is not read, the bulk reader waits */
    double rx_mbit;   /* mu: the last measured arrival rate of a bulk message (sp_ws_client_rx_mbit) */
    uint64_t rx_seq;  /* mu: measurements so far */
    int has_key;
    sp_swarm_key key;

    /* service thread only */
    struct lws *wsi;
    txstate tx;
    rxasm rx;
    rxfail fail;
    int rx_off;       /* lws rx flow control is off (rx_full) */
};

/* ws_client.c: asks the service thread to close the ws (from another thread). */
void tp_cli_fail(sp_ws_client *c, const char *why);
/* ws_client.c: a message for the caller (any thread; mu not held): queued, waiters woken, and reading paused
 * while rx_queue_max bytes wait. */
void tp_cli_queue(sp_ws_client *c, sp_buf *msg);
/* ws_client.c: a message was taken off rxq (mu held): resumes reading once below half of rx_queue_max. */
void tp_cli_taken_locked(sp_ws_client *c);

/* auth.c: the swarm key exchange, client side (the connecting thread, once the ws is open). */
sp_status tp_auth_client(sp_ws_client *c, int timeout_ms, sp_err *err);

/* bulk.c (client side) */
sp_status tp_cli_bulk_send(sp_ws_client *c, int fd, sp_buf *msg, sp_err *err);
sp_status tp_cli_recv_direct(sp_ws_client *c, sp_buf *out, int timeout_ms, sp_err *err);

#endif
