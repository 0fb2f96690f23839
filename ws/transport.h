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
 * bytes, "SPBK" + u32 status (0 accepted, 1 refused) + u64 0, and closes a refused socket. Messages on the two
 * channels are ordered per channel only (a small ws message may overtake a large bulk one).
 *
 * A "message" here is the complete byte string of one protocol message (proto.h); the transport checks
 * only its framing and size, the caller decodes it. */
#ifndef SEPAL_TRANSPORT_H
#define SEPAL_TRANSPORT_H

#include <stdint.h>

#include "proto.h"
#include "status.h"

typedef struct sp_transport_opts {
    const char *host;        /* server: bind address (default "127.0.0.1"); client: unused */
    int port;                /* server: ws port, 0 = ephemeral */
    int bulk_port;           /* server: bulk TCP port, 0 = ephemeral, -1 = no bulk channel */
    uint64_t max_message;    /* largest message accepted on either channel (default 256 MiB; 0 = default) */
    uint64_t bulk_threshold; /* messages of at least this many bytes use the bulk channel (default 64 KiB;
                                0 = default) */
    int idle_timeout_s;      /* server: close connections silent this long on both channels (0 = never) */
    int direct_recv;         /* client: once the bulk channel is attached, sp_ws_client_recv reads it on the
                                caller's thread (no reader thread, no hand-off); for one receiving thread */
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

/* ---------------------------------------------------------------------------------------------- */
/* client: one connection to one server */

typedef struct sp_ws_client sp_ws_client;

/* Connects a websocket to host:port (blocking, up to timeout_ms; -1 = lws's limits). SP_ERR_IO names host:port
 * when the server refuses or cannot be reached, SP_ERR_TIMEOUT when the handshake does not finish in time. */
sp_status sp_ws_client_connect(sp_ws_client **out, const char *host, int port, const sp_transport_opts *o,
                               int timeout_ms, sp_err *err);
/* Opens the bulk socket to host:bulk_port and presents token (blocking). SP_ERR_STATE if the server refuses
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
void sp_ws_client_close(sp_ws_client *c);

#endif
