/* route.c - the chain of servers covering blocks [0, L). */
#include "swarm_impl.h"

#include <stdio.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------- */
/* route */

sp_status sp_runtime_route(sp_runtime *rt, sp_err *err)
{
    if (!rt->local)
        return sp_errf(err, SP_ERR_STATE, "no model loaded");
    int L = rt->local->cfg.n_layers, pos = 0;
    rt->nroute = 0;
    while (pos < L) {
        int best = -1;
        for (int i = 0; i < rt->nservers; i++) {
            const sp_server_entry *e = &rt->servers[i];
            if (strcmp(e->state, "online") || e->start > pos || e->end <= pos)
                continue;
            if (best < 0 || e->end > rt->servers[best].end ||
                (e->end == rt->servers[best].end && e->inference_rps > rt->servers[best].inference_rps))
                best = i;
        }
        if (best < 0)
            return sp_errf(err, SP_ERR_NOTFOUND, "no online server holds block %d (of 0..%d)", pos, L - 1);
        rt->route[rt->nroute++] = (sp_hop){best, pos, rt->servers[best].end};
        pos = rt->servers[best].end;
    }
    char text[1024];
    sp_runtime_route_text(rt, text, sizeof text);
    sp_rt_emit(rt, SP_EV_ROUTE, text, 0, 0, 0);
    return SP_OK;
}

void sp_runtime_route_text(const sp_runtime *rt, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < rt->nroute && n < cap; i++) {
        const sp_hop *h = &rt->route[i];
        const sp_server_entry *e = &rt->servers[h->server];
        n += (size_t)snprintf(buf + n, cap - n, "%s%d:%d %s:%d", i ? " -> " : "", h->start, h->end, e->host, e->port);
    }
}

