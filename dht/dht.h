/* dht.h - a DHT node (OpenDHT 2.4.12) run in a child process, `sepal-dht`, that this process supervises.
 *
 * Debian's OpenDHT 2.4.12 segfaults on one malformed UDP datagram (../shared/reference/reliability-anchors.md
 * §4.4), so the node never runs inside a server or a client, and in the child a UDP front (front.h) checks every
 * datagram before the node sees it: malformed ones are dropped and counted (sp_dht_refused). A crash of the
 * child all the same costs a restart (same UDP port, the same bootstrap peers, every listen and every
 * publication re-issued), not a session.
 *
 * Keys are strings ("stories15M.3", "_sepal.models"), hashed to 160-bit ids by the child. A publication is
 * (key, slot) -> bytes: publishing again under the same (key, slot) replaces what this node published there
 * before (a fresh DHT value, the previous one withdrawn), so listeners see every update. The node keeps its
 * publications announced while it runs (OpenDHT's permanent puts): a value published while the swarm was
 * small moves to the nodes closest to its key as they join (a one-shot put stays where it first landed and,
 * among 40+ nodes, is often never found). Values live in the DHT for their TTL after the node stops
 * announcing them (a power of two of seconds, 1 s .. 65536 s, registered as value types by every sepal
 * node), so a node that dies takes its values with it within that time.
 * Values larger than SP_DHT_MAX_VALUE are neither stored nor delivered.
 *
 * Threads: callbacks run on this module's reader thread, one at a time. They may call sp_dht_listen / get /
 * put / bootstrap (these only queue a command for the child and never block on the network), but not
 * sp_dht_stop. */
#ifndef SEPAL_DHT_H
#define SEPAL_DHT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "status.h"

#define SP_DHT_MAX_VALUE 16384    /* bytes */
#define SP_DHT_NETWORK 0x5E9A1u   /* DHT network id of sepal swarms: other OpenDHT networks are ignored */
#define SP_DHT_MAX_KEY 200        /* bytes of a key, no whitespace */

typedef struct sp_dht sp_dht;

/* A value of key arrived (from a listen or a get), or expired (listen only: its TTL ran out). data is
 * valid during the call. */
typedef void (*sp_dht_value_fn)(void *user, const char *key, const uint8_t *data, size_t len, int expired);
/* A get of key finished (ok: at least one node answered). */
typedef void (*sp_dht_done_fn)(void *user, const char *key, int ok);
/* Something the user should know: "DHT node died (signal 11); restarted on 127.0.0.1:4001", "DHT node: refused
 * 12 datagrams (...)" (at most once a minute). */
typedef void (*sp_dht_event_fn)(void *user, const char *text);

typedef struct sp_dht_opts {
    const char *helper;    /* path of sepal-dht; NULL: $SEPAL_DHT_BIN, else next to the running binary, else
                              ../dht/sepal-dht from it (the build tree) */
    const char *bind;      /* IPv4 address to bind (default "127.0.0.1"); only that address is bound */
    int port;              /* UDP port; 0 = any free one (then kept across restarts) */
    const char *bootstrap; /* "HOST:PORT[,HOST:PORT...]" to join, or NULL/"" to start a new swarm */
    uint32_t network;      /* 0: SP_DHT_NETWORK */
    sp_dht_value_fn on_value;
    sp_dht_done_fn on_get_done;
    sp_dht_event_fn on_event;
    void *user;
} sp_dht_opts;

/* Starts the child and returns once its node runs (bound, bootstrap requested). SP_ERR_IO when the port is
 * taken or the helper cannot run (the message says which). */
sp_status sp_dht_start(sp_dht **out, const sp_dht_opts *o, sp_err *err);
/* Stops the child (waits for it) and the supervisor; NULL is fine. */
void sp_dht_stop(sp_dht *d);

int sp_dht_port(const sp_dht *d);       /* the bound UDP port */
pid_t sp_dht_pid(const sp_dht *d);      /* the current child, for tests that kill it; -1 between restarts */
int sp_dht_restarts(const sp_dht *d);   /* how many times the child was restarted */
uint64_t sp_dht_refused(const sp_dht *d); /* datagrams the front refused (over restarts; reported within 20 ms) */
int sp_dht_good_nodes(const sp_dht *d); /* peers the node knows as good (reported within 20 ms of a change) */
/* Waits until the node knows at least one good peer (up to timeout_ms): 0, or -1. */
int sp_dht_wait_peers(sp_dht *d, int timeout_ms);

/* The peers given to join through that did not answer a ping: waits until each answered, or its ping went
 * unanswered (about 3 s), up to timeout_ms; writes "HOST:PORT[,HOST:PORT...]" of the silent ones to out (cap
 * bytes) and returns how many there are (0: every peer answered). */
int sp_dht_silent_peers(sp_dht *d, int timeout_ms, char *out, size_t cap);
/* Adds a peer to join through (now and after restarts). */
void sp_dht_bootstrap(sp_dht *d, const char *host, int port);
/* Delivers the current values of key and every later one (and expirations) through on_value, also after
 * restarts of the child. Listening twice to one key is one listen. */
void sp_dht_listen(sp_dht *d, const char *key);
/* One lookup: the values found go to on_value (expired = 0), then on_get_done. */
void sp_dht_get(sp_dht *d, const char *key);
/* Publishes data under (key, slot) for ttl_s seconds (see above); republished after restarts of the child. */
void sp_dht_put(sp_dht *d, const char *key, const char *slot, int ttl_s, const void *data, size_t len);
/* Waits until every put issued so far was acknowledged by the DHT or failed (up to timeout_ms);
 * SP_ERR_TIMEOUT otherwise. For the OFFLINE announcement before a clean exit. */
sp_status sp_dht_flush(sp_dht *d, int timeout_ms, sp_err *err);

#endif
