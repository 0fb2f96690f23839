/* runtime_events.c - events to the front end: built here, handed to its callback (runtime_events.h). */
#include "runtime_events.h"

#include <stdio.h>

void sp_events_emit(const sp_events *to, sp_event_kind kind, const char *text, double done, double total, int row)
{
    if (!to->fn)
        return;
    sp_event ev = {.kind = kind, .text = text, .done = done, .total = total, .row = row};
    to->fn(&ev, to->user);
}

void sp_events_emit_route(const sp_events *to, sp_event_kind kind, const char *text, int row, const struct sp_route *r,
                          const double *hop_s)
{
    if (!to->fn)
        return;
    sp_event ev = {.kind = kind, .text = text, .row = row, .route = r, .hop_s = hop_s};
    to->fn(&ev, to->user);
}

void sp_events_vemitf(const sp_events *to, sp_event_kind kind, int row, const char *fmt, va_list ap)
{
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    sp_events_emit(to, kind, buf, 0, 0, row);
}
