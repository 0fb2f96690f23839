/* runtime.h - the client runtime, the one door the front ends use: a model's local parts (embeddings, final
 * norm, LM head, tokenizer), the servers it knows (found through the DHT, started here, or connected by
 * address), routes over them, and inference sessions and training chains that survive the death of a server.
 * It never prints: everything a front end shows arrives as events (runtime_events.h).
 *
 * The handle is opaque (runtime_types.h), as ggml's contexts are: front ends call functions and never read its
 * state or take its lock; what they show of it they get as copies (sp_runtime_servers, sp_runtime_settings,
 * sp_runtime_last_route). Its calls are declared by its parts, all included here: cancellation and the clock
 * (runtime_cancel.h), the model's local parts (model/parts.h), the swarm (swarm/swarm.h).
 *
 * Servers: one row per server id, never removed while the runtime lives (so an index stays valid); a row
 * whose server left the view is `gone`. */
#ifndef SEPAL_RUNTIME_H
#define SEPAL_RUNTIME_H

#include "parts.h"
#include "runtime_cancel.h"
#include "runtime_events.h"
#include "runtime_types.h"
#include "swarm.h"

/* ---------------------------------------------------------------------------------------------- */
/* life cycle */

/* A runtime whose events go to on_event(ev, user) (NULL: nowhere), with the default settings. */
sp_status sp_runtime_new(sp_runtime **out, sp_event_fn on_event, void *user, sp_err *err);
void sp_runtime_free(sp_runtime *rt); /* also stops a swarm it started and its DHT node */

/* Loads config, tokenizer (if present) and ONLY the local parts of the model in dir; a DHT view then
 * follows this model. */
sp_status sp_runtime_load(sp_runtime *rt, const char *dir, sp_err *err);

/* ---------------------------------------------------------------------------------------------- */
/* what front ends read, as copies taken under the runtime's lock (any thread) */

/* The server table, one row per server index (gone ones included): *out is malloc'd (the caller frees it;
 * NULL when there are none). Returns the number of rows, or -1 when out of memory. */
int sp_runtime_servers(sp_runtime *rt, sp_server_row **out);
/* How many servers the table holds (gone ones included). */
int sp_runtime_server_count(sp_runtime *rt);
/* The route sp_runtime_route computed last (nhops 0: none, or swarm down since). */
void sp_runtime_last_route(sp_runtime *rt, sp_route *out);

/* The settings; set replaces them all (get, change, set). Later requests use them. */
void sp_runtime_settings(sp_runtime *rt, sp_rt_settings *out);
void sp_runtime_set_settings(sp_runtime *rt, const sp_rt_settings *s);

/* Whether `swarm up` started the servers of the swarm it is in (swarm down stops them). */
int sp_runtime_swarm_started(const sp_runtime *rt);
/* Whether it is in a swarm through the DHT (sp_runtime_join, or swarm up). */
int sp_runtime_in_swarm(const sp_runtime *rt);
/* The DHT nodes it joined through ("host:port[,...]"), "" when in no swarm. */
const char *sp_runtime_initial_peers(const sp_runtime *rt);
/* The swarm key file in use (sp_runtime_set_swarm_key), "" for none. */
const char *sp_runtime_swarm_key_path(const sp_runtime *rt);

#endif
