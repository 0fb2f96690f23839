/* remote.h - one connection from a client to one server: HELLO (version check), the bulk channel,
 * and calls that send a request and wait for its reply. The client runtime's chains are built on this; servers
 * use it to ping their successors. */
#ifndef SEPAL_REMOTE_H
#define SEPAL_REMOTE_H

#include <stdint.h>

#include "proto.h"
#include "status.h"
#include "swarmkey.h"

typedef struct sp_remote sp_remote;

/* What the server said in its HELLO reply. */
typedef struct sp_remote_info {
    char model[256];
    uint64_t config_hash; /* of the model's config.json (0 if not said) */
    int num_blocks;       /* of the model (0 if not said) */
    int start, end;
    char version[16];     /* the protocol's */
    char server_version[16]; /* the server program's ("0.1.0"; "" if not said) */
    char dtype[16];       /* how it holds its blocks ("f32", "int8", ...; "" if not said) */
    char id[24];          /* the server's id in the swarm ("" if it has none) */
    int dht_port;         /* the UDP port of its DHT node (0 if it has none or did not say) */
    char addr[80];        /* "HOST:PORT" it is announced at ("" if it did not say) */
    int caps;             /* SP_CAP_* bits it said (0: none, or an older server) */
} sp_remote_info;

typedef struct sp_remote_opts {
    int no_bulk;             /* websocket only */
    const sp_swarm_key *key; /* a private swarm: the key exchange comes first (NULL: none) */
    const char *source;      /* the local address to connect from (NULL: the system's choice) */
} sp_remote_opts;

/* Connects (the swarm key exchange first, with a key), says HELLO, and attaches the bulk channel unless
 * no_bulk; when the server refuses the bulk socket the connection goes on over the websocket alone. */
sp_status sp_remote_connect_opts(sp_remote **out, const char *host, int port, const sp_remote_opts *o, int timeout_ms,
                                 sp_err *err);
/* sp_remote_connect_opts without a key. */
sp_status sp_remote_connect(sp_remote **out, const char *host, int port, int no_bulk, int timeout_ms, sp_err *err);
/* 0 once the connection is closed (by the server's idle timeout, say): calls on it fail at once. */
int sp_remote_is_open(const sp_remote *r);
/* A closed connection's last word: the error a server sent to no request before it closed (ERROR "shutdown"),
 * or SP_OK when it said nothing (or the connection is open). */
sp_status sp_remote_last_word(sp_remote *r, sp_err *err);
const sp_remote_info *sp_remote_hello(const sp_remote *r);
/* The server-to-client rate of the connection's last measured bulk message, Mbit/s (0: none yet), *seq counting
 * the measurements: see sp_ws_client_rx_mbit. Thread-safe. Messages under SP_REMOTE_RATE_MIN bytes are never
 * measured (a caller need not look after them). */
#define SP_REMOTE_RATE_MIN (32 * 1024)
double sp_remote_rx_mbit(sp_remote *r, uint64_t *seq);
void sp_remote_close(sp_remote *r);

/* What answers at host:port, for an address given as a DHT node that did not answer as one (--initial-peers):
 * a sepal-server's websocket port (HELLO says its DHT node: "use --initial-peers HOST:DHT"), one that refuses
 * this key, or nothing sepal knows. One line into why (cap bytes); probes for at most timeout_ms. */
void sp_remote_describe_port(const char *host, int port, const sp_swarm_key *key, int timeout_ms, char *why,
                             size_t cap);

/* A reply: the decoded message (views point into buf). Release with sp_reply_clear. */
typedef struct sp_reply {
    sp_buf buf;
    sp_msg msg;
    char error_code[32]; /* an ERROR reply's code (sp_reply_error_code) */
} sp_reply;

void sp_reply_clear(sp_reply *rep);

/* Sends a request and waits up to timeout_ms for its reply. Calls from several threads on one connection are in
 * flight at once (each waits for the reply with its own request id).
 * An ERROR reply becomes SP_ERR_ARG / SP_ERR_RANGE / ... with err->msg "CODE: message" and the reply is
 * still returned so the caller can read the code. */
sp_status sp_remote_call(sp_remote *r, sp_msg_type type, const char *meta, const sp_tensor_src *t, int n,
                         sp_reply *rep, int timeout_ms, sp_err *err);
/* sp_remote_call in two halves, for requests to be in flight at once from one thread (a server's pushes of a pass):
 * sp_remote_send sends the request and returns at once, its id in *id, the reply's place (rep) registered before it
 * goes out, so that a reply read by another call meanwhile is kept for it; sp_remote_wait(id) waits up to timeout_ms
 * for it, as sp_remote_call does (the same statuses, an ERROR reply's code in rep). After a send that returned SP_OK
 * the request MUST be waited for, once, before rep goes away and before the connection is closed: its registration
 * points into rep (a reply read for it by another call is written there). Other calls on the connection go on
 * meanwhile.
 * A send that failed registered nothing (*id 0, nothing to wait for; rep holds the server's last word when it said
 * one before it closed, else is empty). */
sp_status sp_remote_send(sp_remote *r, sp_msg_type type, const char *meta, const sp_tensor_src *t, int n,
                         sp_reply *rep, uint64_t *id, sp_err *err);
sp_status sp_remote_wait(sp_remote *r, uint64_t id, int timeout_ms, sp_err *err);
/* sp_remote_call that also gives up (SP_ERR_CANCELLED, the connection sound: a late reply is dropped) once *abort
 * is non-zero, looked at every 100 ms: the caller's thread ends a wait another thread no longer needs. */
sp_status sp_remote_call_abortable(sp_remote *r, sp_msg_type type, const char *meta, const sp_tensor_src *t, int n,
                                   sp_reply *rep, int timeout_ms, const int *abort, sp_err *err);
/* While waiting for a reply, a call looks at *flag every 100 ms and returns SP_ERR_CANCELLED once it is
 * non-zero (the reply, if it comes later, is dropped by the next call). NULL: never. */
void sp_remote_set_cancel(sp_remote *r, const int *flag);

/* INFO: the server's state, decoded (sp_info_reply_decode). */
sp_status sp_remote_get_info(sp_remote *r, sp_info_reply *out, int timeout_ms, sp_err *err);

/* Sends raw bytes as a request (for tests of malformed input) and waits for whatever reply comes. */
sp_status sp_remote_call_raw(sp_remote *r, const uint8_t *bytes, size_t len, sp_reply *rep, int timeout_ms, sp_err *err);

/* The error code string of an ERROR reply ("out_of_cache"), or NULL. */
const char *sp_reply_error_code(const sp_reply *rep);

#endif
