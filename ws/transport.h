/* transport.h - message transport between sepal processes.
 *
 * Control path: websockets on libwebsockets 4.1.6 (binary messages, sent in fragments, reassembled with a
 * cap). Only the lws service thread ever calls lws; other threads queue messages and wake it with
 * lws_cancel_service(). Servers bind 127.0.0.1 unless told otherwise, with IPv6 disabled so that the
 * address really is the one bound (lws 4.1.6 otherwise listens on every interface).
 *
 * Bulk path: lws 4.1.6 receives large ws messages at ~60-250 MB/s (its ws parser goes byte by byte), so
 * each server also listens on a plain TCP "bulk" port. After the HELLO exchange a client attaches a bulk
 * socket to its ws connection with a one-time token; from then on either side sends messages of at least
 * bulk_threshold bytes over it. Framing on the bulk socket is the protocol's own header (sp_msg_peek gives
 * the body length). The two channels belong to one logical connection: closing either closes both.
 * Attaching: the client sends 16 bytes, "SPBK" + u32 0 + u64 token (little-endian); the server answers 16
 * bytes, "SPBK" + u32 status (0 accepted, 1 refused, 2 busy: too many sockets wait for their token, try again
 * with the same token) + u64 0, and closes a socket it does not accept. Messages on the two
 * channels are ordered per channel only (a small ws message may overtake a large bulk one).
 *
 * A "message" here is the complete byte string of one protocol message (proto.h); the transport checks
 * only its framing and size, the caller decodes it.
 *
 * A server bounds what one peer can make it hold (share/doc/transport.md, "Limits"):
 *   - connections: in total and per source address, and those that have not finished their handshake (the
 *     HTTP upgrade, the swarm key exchange, the first message), in total and per address. Over a cap a new
 *     connection is refused at once (an HTTP 503 and a close), never left waiting. The handshake has absolute
 *     deadlines (a trickle of bytes does not extend them); a ready connection with nothing in flight and no
 *     hold (the server's sessions) closes after idle_timeout_s.
 *   - memory: every message is charged to a budget from its header on (the declared size), until it is
 *     delivered (or, with app_releases, until sp_ws_server_release), and so is every queued reply until it
 *     is sent. Per connection, per source address and in total. A message that does not fit waits, its
 *     connection not read, for busy_timeout_s; then the peer gets ERROR "busy" and a close. Once admitted a
 *     message must arrive at min_rate or faster (plus 10 s). A message larger than the connection's share is
 *     refused at once, like one over max_message.
 *   - backpressure: a connection whose unsent output exceeds tx_bound is not read (lws_rx_flow_control; no
 *     POLLIN on its bulk socket) until it drains to half of it. A client does the same: it stops reading a
 *     server once rx_queue_max bytes wait for sp_ws_client_recv.
 *   - a swarm key (opts.key): the first exchange is a mutual HMAC-SHA256 challenge-response (AUTH messages,
 *     share/doc/protocol.md); until it completes a peer can send nothing else, and no message reaches
 *     on_message. A client with a key checks the server's proof inside sp_ws_client_connect. */
#ifndef SEPAL_TRANSPORT_H
#define SEPAL_TRANSPORT_H

#include <stdint.h>

#include "proto.h"
#include "status.h"
#include "swarmkey.h"

typedef struct sp_transport_opts {
    const char *host;        /* server: bind address (default "127.0.0.1"); client: unused */
    int port;                /* server: ws port, 0 = ephemeral */
    int bulk_port;           /* server: bulk TCP port, 0 = ephemeral, -1 = no bulk channel */
    uint64_t max_message;    /* largest message accepted on either channel (default 256 MiB; 0 = default) */
    uint64_t bulk_threshold; /* messages of at least this many bytes use the bulk channel (default 64 KiB;
                                0 = default) */
    int idle_timeout_s;      /* server: close a ready connection silent this long on both channels, with nothing
                                in flight and no hold (0 = never) */
    int direct_recv;         /* client: once the bulk channel is attached, sp_ws_client_recv reads it on the
                                caller's thread (no reader thread, no hand-off); for one receiving thread */
    const sp_swarm_key *key; /* both: the swarm key exchange comes first (NULL: none); the key is copied */
    const char *source;      /* client: the local address its sockets connect from, websocket and bulk (NULL or
                                "": the system's choice; tests make loopback peers of 127.0.0.2 ...); copied */

    /* server limits; 0 (or less) = the default */
    int max_conns;              /* connections at once (default min(4096, (RLIMIT_NOFILE - 64) / 2)) */
    int max_conns_per_ip;       /* from one address (default min(256, max_conns)) */
    int max_pending;            /* connections still in their handshake (default min(256, max_conns)) */
    int max_pending_per_ip;     /* ... from one address (default 64) */
    double handshake_timeout_s; /* the HTTP upgrade within this of the accept, the first message (after the swarm
                                   key exchange) within this of the upgrade (default 5) */
    int first_type;             /* the first message must be of this type (sp_msg_type; 0: any) */
    uint64_t rx_budget;         /* bytes of messages and replies held, in total (default max(2 x rx_budget_conn,
                                   512 MiB), at most a quarter of the machine's memory but never below
                                   rx_budget_conn) */
    uint64_t rx_budget_conn;    /* one connection's share (default max_message); caps its messages too */
    uint64_t rx_budget_ip;      /* one address's share (default max(rx_budget / 2, rx_budget_conn)) */
    uint64_t tx_bound;          /* unsent output over which a connection is not read (default 1 MiB) */
    double busy_timeout_s;      /* how long a message waits for budget before "busy" (default 10) */
    double min_rate;            /* bytes/s an admitted message must arrive at, after 10 s (default 64 KiB/s;
                                   < 0: no minimum) */
    int app_releases;           /* delivered messages stay charged until sp_ws_server_release */
    /* client */
    uint64_t rx_queue_max;      /* received bytes waiting for recv before the socket is not read (default 64 MiB) */
} sp_transport_opts;

void sp_transport_opts_default(sp_transport_opts *o);

/* ---------------------------------------------------------------------------------------------- */
/* server */

typedef struct sp_ws_server sp_ws_server;

/* msg is a complete message; the callee owns its contents (sp_buf_free when done, or move the struct:
 * `mine = *msg`; the sp_buf itself is the transport's). Called on a transport thread (the lws thread for ws
 * messages, the bulk thread for bulk ones): queue the work, do not compute here. conn ids start at 1 and are
 * never reused within a server's lifetime. */
typedef void (*sp_server_on_message)(void *user, uint64_t conn, sp_buf *msg);
/* The connection is gone (peer closed, error, idle timeout, sp_ws_server_close, or sp_ws_server_stop).
 * Called once per conn, after its last on_message. Callbacks must not call sp_ws_server_stop. */
typedef void (*sp_server_on_close)(void *user, uint64_t conn);

sp_status sp_ws_server_start(sp_ws_server **out, const sp_transport_opts *o, sp_server_on_message on_message,
                             sp_server_on_close on_close, void *user, sp_err *err);
int sp_ws_server_port(const sp_ws_server *s);
int sp_ws_server_bulk_port(const sp_ws_server *s); /* -1 if none */
/* A one-time token that attaches a bulk socket to conn (send it to the client in the HELLO reply); a new call
 * replaces an unused one. 0 if conn is gone, already has a bulk socket, or the server has no bulk port. */
uint64_t sp_ws_server_bulk_token(sp_ws_server *s, uint64_t conn);
/* Thread-safe. Takes ownership of msg in every case. SP_ERR_CLOSED if conn is gone. */
sp_status sp_ws_server_send(sp_ws_server *s, uint64_t conn, sp_buf *msg, sp_err *err);
/* Thread-safe: closes a connection (on_close follows). */
void sp_ws_server_close(sp_ws_server *s, uint64_t conn);
/* Closes every connection (on_close for each, from this thread), stops the threads, frees s. */
void sp_ws_server_stop(sp_ws_server *s);
/* With app_releases: the app is done with a message of `bytes` bytes of conn (after on_close too); its charge
 * goes back to the budget. Thread-safe. */
void sp_ws_server_release(sp_ws_server *s, uint64_t conn, uint64_t bytes);
/* Holds (delta > 0) or lets go of (delta < 0) conn: a held connection is not closed for being idle (the server
 * holds one per open session). Thread-safe. */
void sp_ws_server_hold(sp_ws_server *s, uint64_t conn, int delta);
/* A key of conn's source address (the peer: every connection from one address has the same, and two addresses
 * differ but by a 2^-64 chance): 0 if conn is gone. Thread-safe. */
uint64_t sp_ws_server_peer(sp_ws_server *s, uint64_t conn);

/* The rate, in Mbit/s, at which conn's last measured bulk message arrived, if it was not taken before (0: none since
 * the last take, or conn is gone): measured as a client measures the server's (sp_ws_client_rx_mbit), from the
 * message's admission on, each measurement taken once. It is there before the message is delivered, so the
 * handler of a large message that takes it gets that message's own (or a later one's, where more came meanwhile).
 * Thread-safe. */
double sp_ws_server_rx_take(sp_ws_server *s, uint64_t conn);

/* The limits in force (defaults resolved) and what they did. */
typedef struct sp_ws_server_stats {
    sp_transport_opts limits;    /* host and key pointers not meaningful */
    int conns, pending;          /* now: connections, and those in their handshake */
    uint64_t accepted;           /* connections taken */
    uint64_t refused;            /* refused at once over a connection cap (all of them) */
    uint64_t refused_ip;         /* ... of them, over a per-address cap */
    uint64_t handshake_timeouts; /* closed for not finishing the upgrade or the first message in time */
    uint64_t idle_closed;        /* closed for being idle */
    uint64_t busy;               /* messages that waited for budget past busy_timeout_s ("busy" + close) */
    uint64_t slow;               /* messages that arrived slower than min_rate (close) */
    uint64_t auth_failed;        /* connections that failed the swarm key exchange or skipped it */
    uint64_t waits;              /* messages that had to wait for budget */
    uint64_t paused;             /* times a connection was not read because of its unsent output */
    uint64_t budget_used, budget_peak; /* bytes charged now, and the most at once */
    uint64_t delivered;          /* messages delivered to on_message */
    uint64_t bulk_refused;       /* bulk sockets turned away: answered busy over a cap (the client retries), or
                                    refused (a bad or unknown token, no descriptor) */
    uint64_t bulk_timeouts;      /* bulk sockets closed for not presenting a token in time */
    uint64_t out_of_fds;         /* connections (either port) refused at once because descriptors ran out */
} sp_ws_server_stats;
void sp_ws_server_stats_get(sp_ws_server *s, sp_ws_server_stats *st);

/* ---------------------------------------------------------------------------------------------- */
/* client: one connection to one server */

typedef struct sp_ws_client sp_ws_client;

/* Connects a websocket to host:port (blocking, up to timeout_ms; -1 = lws's limits), and with opts->key runs
 * the swarm key exchange. SP_ERR_IO names host:port when the server refuses (a connection cap: "HTTP 503") or
 * cannot be reached, SP_ERR_TIMEOUT when the handshake does not finish in time, SP_ERR_STATE when the swarm
 * key exchange fails (the message says which side lacks the key or holds another). */
sp_status sp_ws_client_connect(sp_ws_client **out, const char *host, int port, const sp_transport_opts *o,
                               int timeout_ms, sp_err *err);
/* Opens the bulk socket to host:bulk_port and presents token (blocking, up to timeout_ms in all; -1: 60 s). A
 * server that answers busy is tried again with the same token after a pause (5 ms doubling up to 200 ms, with
 * jitter) while the timeout allows; SP_ERR_BUSY if it was still busy then. SP_ERR_STATE if the server refuses
 * the token (the ws connection stays usable) or a bulk socket is already attached. */
sp_status sp_ws_client_attach_bulk(sp_ws_client *c, int bulk_port, uint64_t token, int timeout_ms, sp_err *err);
/* Thread-safe. Takes ownership of msg in every case (*msg is left empty). SP_ERR_CLOSED once the connection
 * is gone. ws messages are queued; a bulk message is written before this returns. */
sp_status sp_ws_client_send(sp_ws_client *c, sp_buf *msg, sp_err *err);
/* Next complete message from either channel, in arrival order per channel, moved into *out (whatever *out
 * held is overwritten, not freed). SP_ERR_TIMEOUT when none came within timeout_ms (-1 = wait forever,
 * 0 = poll), SP_ERR_CLOSED once closed and drained. */
sp_status sp_ws_client_recv(sp_ws_client *c, sp_buf *out, int timeout_ms, sp_err *err);
int sp_ws_client_is_open(const sp_ws_client *c);
/* Bytes received and not yet taken by recv; *paused (may be NULL): 1 while the client does not read for that. */
uint64_t sp_ws_client_queued(sp_ws_client *c, int *paused);
/* The rate, in Mbit/s, at which the last measured bulk message from the server arrived (0: none measured yet),
 * *seq (may be NULL) counting the measurements. Passive, on what the server sends anyway: a message on the bulk
 * socket is timed from the read that completes its header to the read that completes it, and the bytes that were
 * already waiting in the socket at the start (FIONREAD) are left out, so a late reader does not make the link look
 * faster than it is (bulk.c's rx_pace). Messages with fewer than SP_RX_PACE_MIN such bytes are not measured (on
 * loopback a whole message is usually waiting: no measurement at all). A descheduled sender or reader makes a
 * measurement lower than the link's rate; a relay that held the message's start and then sent it in a burst, higher.
 * Thread-safe. */
#define SP_RX_PACE_MIN (32 * 1024)
double sp_ws_client_rx_mbit(sp_ws_client *c, uint64_t *seq);
void sp_ws_client_close(sp_ws_client *c);

#endif
