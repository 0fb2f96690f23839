/* view.h - a live view of one model's servers in the swarm.
 *
 * It listens to every block key of the model and to the model index (pushes arrive within milliseconds),
 * and looks every key up again each refresh period, because a listen misses what was published while the
 * DHT child was being restarted. Per server it keeps the newest valid record; records that fail
 * sp_record_decode are counted and dropped, and a record goes once it is stale (three of its writer's
 * periods old) or its value expired from the DHT. Per address (host and ws port) it keeps one server: a
 * server restarted there gets a new id, and its newest record supersedes those of its earlier lives (they
 * go at once, and older copies of them that the DHT still returns are refused until they would be stale).
 * Servers (announcing, choosing blocks) and clients (routing) use the same
 * view.
 *
 * Threads: sp_view_on_value / sp_view_on_get_done run on the sp_dht reader thread; the view's own thread
 * refreshes and sweeps; on_change runs on either of them, never under the view's lock (it may call
 * sp_view_snapshot). Everything else may be called from any thread. */
#ifndef SEPAL_VIEW_H
#define SEPAL_VIEW_H

#include <pthread.h>
#include <stdint.h>

#include "dht.h"
#include "record.h"

typedef enum { SP_VIEW_NEW, SP_VIEW_CHANGED, SP_VIEW_GONE } sp_view_change;

/* A server appeared, announced something new (prev: what it announced before), or went: stale, expired (prev:
 * r itself), or superseded by a newer life at its address (prev: the newer one's record, another id). */
typedef void (*sp_view_fn)(void *user, sp_view_change what, const sp_server_record *r, const sp_server_record *prev);

typedef struct sp_view_opts {
    const char *model;    /* prefix (sp_model_prefix) */
    uint64_t config_hash; /* 0: accept any */
    int num_blocks;
    double refresh_s;     /* full lookups every refresh_s seconds (default 30) */
    sp_view_fn on_change;
    void *user;
    const sp_swarm_key *key; /* a private swarm: only records sealed with it count (NULL: none; copied) */
} sp_view_opts;

typedef struct sp_view sp_view;

typedef struct sp_view_stats {
    uint64_t accepted;   /* values taken (new records or newer ones) */
    uint64_t dropped;    /* values refused (malformed, oversized, inconsistent, other model) */
    uint64_t superseded; /* records of a server's earlier life at an address, removed or refused */
    char last_drop[256]; /* why the last one was refused */
    int rounds;          /* full lookup rounds finished */
    int unreadable;      /* sealed records under the model's block keys this view cannot open, since it started */
    int unreadable_index;/* ... under the model index */
    char unreadable_swarm[2 * SP_SWARM_ID_BYTES + 1]; /* the swarm the last of them was sealed for */
} sp_view_stats;

/* Starts listening (through dht) and the first lookup round. */
sp_status sp_view_new(sp_view **out, sp_dht *dht, const sp_view_opts *o, sp_err *err);
void sp_view_free(sp_view *v);

/* The owner's sp_dht callbacks forward here; keys of other models are ignored. */
void sp_view_on_value(sp_view *v, const char *key, const uint8_t *data, size_t len, int expired);
void sp_view_on_get_done(sp_view *v, const char *key, int ok);

/* Starts a lookup round now (and restarts the period). */
void sp_view_refresh(sp_view *v);
/* Waits until a lookup round that started after this call's start finished: 0, or -1 after timeout_ms. */
int sp_view_wait_round(sp_view *v, int timeout_ms);

/* The current records (newest per server, not stale), sorted by id; *out is malloc'd (NULL when 0). */
int sp_view_snapshot(sp_view *v, sp_server_record **out);
/* One record by server id: 1 if found. */
int sp_view_get(sp_view *v, const char *id, sp_server_record *out);
/* Models announced in the swarm (newest per model, not stale), sorted by name; *out is malloc'd. */
int sp_view_models(sp_view *v, sp_model_record **out);
void sp_view_stats_get(sp_view *v, sp_view_stats *s);

/* ---------------------------------------------------------------------------------------------- */
/* A view slot: where an owner's sp_dht callbacks find its current view (or none), under a lock of the slot's
 * own, so the owner may replace or stop the view while the DHT's reader thread delivers values. Servers
 * (announcing) and clients (a view per loaded model) hold one each. */
typedef struct sp_view_slot {
    pthread_mutex_t lock;
    sp_view *view; /* NULL: none (the callbacks drop what comes) */
} sp_view_slot;

void sp_view_slot_init(sp_view_slot *s);
/* Frees the view it holds and the lock; after the callbacks stopped (sp_dht_stop) or before they started. */
void sp_view_slot_destroy(sp_view_slot *s);
/* Puts v (NULL: none) in the slot and returns the view it held, which no callback uses any more: the caller
 * frees it. */
sp_view *sp_view_slot_swap(sp_view_slot *s, sp_view *v);
/* sp_dht's on_value and on_get_done with the slot as user (or forwarded to with it): to the view held, if any. */
void sp_view_slot_on_value(void *slot, const char *key, const uint8_t *data, size_t len, int expired);
void sp_view_slot_on_get_done(void *slot, const char *key, int ok);
/* sp_view_stats_get of the view held (all zero when there is none). */
void sp_view_slot_stats(sp_view_slot *s, sp_view_stats *out);
/* sp_view_models of the view held; 0 with *out NULL when there is none. */
int sp_view_slot_models(sp_view_slot *s, sp_model_record **out);

#endif
