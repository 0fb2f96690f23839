/* announce.h - a server's presence in the swarm: its DHT node (a supervised child, dht/dht.h), the live view
 * of the model's other servers (dht/view.h), and its own record, published under every block key of its
 * span and in the model index: at once on every change, and again every period with fresh figures (cache
 * left, smoothed pings to the servers likely to follow it in a chain). sp_announce_stop publishes OFFLINE
 * and waits (briefly) for it to be stored before the node goes.
 *
 * Threads: one thread of its own (refresh and pings); every call is thread-safe. */
#ifndef SEPAL_ANNOUNCE_H
#define SEPAL_ANNOUNCE_H

#include "record.h"
#include "view.h"

typedef struct sp_announce_opts {
    const char *dht_bind;      /* address of the DHT node (the server's --host) */
    int dht_port;              /* UDP port (0: any) */
    const char *initial_peers; /* "HOST:PORT[,...]" of DHT nodes to join, NULL: a new swarm */
    double period;             /* seconds between refreshes (default 30) */
    int hidden;                /* the model's hidden size (model index) */
    const char *architecture;
    sp_server_record base;     /* id, name, host, model, config_hash, num_blocks, dtype, quant, version */
    const sp_swarm_key *key;   /* a private swarm: records are sealed with it, only sealed ones read, and the
                                  pings prove the key (NULL: none; copied) */
    const char *source;        /* the local address the pings connect from (NULL: the system's choice) */
} sp_announce_opts;

typedef struct sp_announce sp_announce;

/* Fills the figures that change by themselves (cache left, queue wait and its bound); called from the refresh
 * thread, every period, and every 200 ms to see whether the server became saturated (queue wait over its bound) or
 * ceased to be: then the record goes out at once (at most once a second), so that routing stops (or resumes) sending
 * new sessions there. */
typedef void (*sp_announce_fill_fn)(void *user, sp_server_record *r);

sp_status sp_announce_start(sp_announce **out, const sp_announce_opts *o, sp_err *err);
void sp_announce_set_fill(sp_announce *a, sp_announce_fill_fn fn, void *user);
/* Sets the span, state, address, throughput, load figures, capabilities and device (when r says one) of r (other
 * fields are the announcer's) and publishes at once. */
void sp_announce_update(sp_announce *a, const sp_server_record *r);
/* A copy of the record as last published. */
void sp_announce_record(sp_announce *a, sp_server_record *r);
sp_view *sp_announce_view(sp_announce *a);
sp_dht *sp_announce_dht(sp_announce *a);
int sp_announce_dht_port(const sp_announce *a);
pid_t sp_announce_dht_pid(const sp_announce *a);
/* Whether the initial peers answer as DHT nodes (a ping each, a few seconds at most). SP_ERR_ARG when none does,
 * saying why for each: a sepal-server's websocket port is named as such, with the DHT port its HELLO gives
 * ("127.0.0.1:4001 is the websocket port of a sepal-server (blocks 0:3 of stories15M); its DHT node is
 * 127.0.0.1:4002: use --initial-peers 127.0.0.1:4002"); when some answer, the others are logged as warnings. */
sp_status sp_announce_check_peers(sp_announce *a, sp_err *err);
/* Publishes OFFLINE (waits up to 1 s for it to be stored), stops the node; NULL is fine. */
void sp_announce_stop(sp_announce *a);

#endif
