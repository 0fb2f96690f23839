/* runtime_events.h - what the client runtime tells its front end: every event (a notice, progress, a token, a
 * route, a server's news, an error, a retry, a step's timing) goes to one callback, on the thread of the work
 * that caused it. The runtime never prints.
 *
 * sp_events is where they go (a callback and its user pointer); the sp_events_* calls build an event and hand it
 * over. They know nothing of the runtime: its files emit through sp_rt_emit* (private/runtime_state.h). */
#ifndef SEPAL_RUNTIME_EVENTS_H
#define SEPAL_RUNTIME_EVENTS_H

#include <stdarg.h>

typedef enum {
    SP_EV_INFO,     /* text: something happened (server started, model loaded) */
    SP_EV_PROGRESS, /* text: what, done/total: how far */
    SP_EV_TOKEN,    /* row, token, text: a generated token */
    SP_EV_ROUTE,    /* text: the chain a request uses; row 1: a re-route after a failure */
    SP_EV_SERVER,   /* row: server index, text: what happened to it (joined, state, left) */
    SP_EV_ERROR,    /* text: an error the runtime recovered from or reports */
    SP_EV_RETRY,    /* row: server index, text: a request failed there, the server is banned, a retry follows */
    SP_EV_STEP,     /* route, hop_s: a generation step went through route; hop_s[h]: seconds hop h took */
} sp_event_kind;

struct sp_route;

typedef struct sp_event {
    sp_event_kind kind;
    const char *text;
    double done, total;
    int row, token;
    const struct sp_route *route; /* SP_EV_ROUTE, SP_EV_STEP: the chain itself (NULL: none) */
    const double *hop_s;          /* SP_EV_STEP: seconds each hop took in the step */
} sp_event;

/* Called for every event; ev and what it points to live only during the call. */
typedef void (*sp_event_fn)(const sp_event *ev, void *user);

typedef struct sp_events {
    sp_event_fn fn; /* NULL: events go nowhere */
    void *user;
} sp_events;

/* An event of kind with text, done/total (progress) and row. */
void sp_events_emit(const sp_events *to, sp_event_kind kind, const char *text, double done, double total, int row);
/* An event about a route (SP_EV_ROUTE, SP_EV_STEP) that carries the route and, for a step, its hops' times. */
void sp_events_emit_route(const sp_events *to, sp_event_kind kind, const char *text, int row, const struct sp_route *r,
                          const double *hop_s);
/* An event whose text is formatted (up to 511 bytes). */
void sp_events_vemitf(const sp_events *to, sp_event_kind kind, int row, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));

#endif
