/* swarm_impl.h - internals shared by the client runtime's files (not a public header). */
#ifndef SEPAL_SWARM_IMPL_H
#define SEPAL_SWARM_IMPL_H

#include "runtime.h"

#define CALL_TIMEOUT_MS 120000

/* Events to the front end (runtime.c). */
void sp_rt_emit(sp_runtime *rt, sp_event_kind kind, const char *text, double done, double total, int row);
void sp_rt_emitf(sp_runtime *rt, sp_event_kind kind, int row, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* The connection of route hop h. */
static inline sp_remote *sp_rt_hop_conn(sp_runtime *rt, int h) { return rt->servers[rt->route[h].server].conn; }

#endif
