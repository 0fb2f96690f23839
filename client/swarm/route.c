/* route.c - routes over the servers the runtime knows: the table becomes routing spans (swarm/routing.h,
 * pure functions), and the hops they return become sp_routes (stages of hops, runtime.h). Servers that
 * are gone, down (nothing listens at their address), not ONLINE, not allowed or blocked by the settings are
 * left out; banned and busy ones (sp_rt_busy) are used only where nothing else covers a block. Inference routes are priced as the
 * session will run them (relayed by the client, or pushed from server to server: the push setting), on measured
 * pings (an unknown one of the client's measured first; the servers' to each other from their records) and, once
 * seen, measured block times; a route over every block adds the client's own part of a step. */
#include "swarm_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "routing.h"
#include "timeutil.h"

/* ---------------------------------------------------------------------------------------------- */
/* routes as stages */

void sp_route_single_stage(sp_route *r, const sp_route *hops)
{
    *r = *hops;
    r->nstages = hops->nhops;
    for (int h = 0; h < hops->nhops; h++) {
        r->stage_start[h] = hops->hop[h].start;
        r->first[h] = h;
    }
    r->stage_start[r->nstages] = hops->nhops ? hops->hop[hops->nhops - 1].end : 0;
    r->first[r->nstages] = r->nhops;
}

int sp_route_replace_stage(sp_route *r, int s, const sp_route *repl)
{
    int a = r->first[s], b = r->first[s + 1], k = repl->nhops, delta = k - (b - a);
    if (r->nhops + delta > SP_RT_MAX_HOPS)
        return -1;
    memmove(&r->hop[a + k], &r->hop[b], (size_t)(r->nhops - b) * sizeof r->hop[0]);
    for (int i = 0; i < k; i++) {
        r->hop[a + i] = repl->hop[i];
        r->hop[a + i].keep = 0;
    }
    r->nhops += delta;
    for (int t = s + 1; t <= r->nstages; t++)
        r->first[t] += delta;
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* the table as routing spans */

/* 1 if server e is named in list ("id,host:port,name,..."; an id may be given by a prefix of 4+ digits). */
static int listed(const char *list, const sp_server_entry *e)
{
    char buf[1024], addr[96];
    snprintf(buf, sizeof buf, "%s", list);
    snprintf(addr, sizeof addr, "%s:%d", e->rec.host, e->rec.port);
    for (char *save = NULL, *t = strtok_r(buf, ", ", &save); t; t = strtok_r(NULL, ", ", &save))
        if (!strcmp(t, addr) || (e->rec.name[0] && !strcmp(t, e->rec.name)) ||
            (strlen(t) >= 4 && !strncmp(e->rec.id, t, strlen(t))))
            return 1;
    return 0;
}

/* Not gone, not down, allowed and not blocked by the settings. */
static int eligible(const sp_runtime *rt, const sp_server_entry *e)
{
    return !e->gone && !e->down && (!rt->set.allowed[0] || listed(rt->set.allowed, e)) &&
           !(rt->set.blocked[0] && listed(rt->set.blocked, e));
}

static int usable(const sp_runtime *rt, const sp_server_entry *e)
{
    return eligible(rt, e) && e->rec.state == SP_SERVER_ONLINE;
}

int sp_rt_joining(sp_runtime *rt, int start, int end, int *missing, char *who, size_t cap)
{
    int ok = 1;
    *missing = -1;
    who[0] = '\0';
    pthread_mutex_lock(&rt->lock);
    for (int b = start; b < end && ok; b++) {
        int online = 0, joiner = -1;
        for (int i = 0; i < rt->nservers && !online; i++) {
            const sp_server_entry *e = rt->servers[i];
            if (!eligible(rt, e) || e->rec.start > b || b >= e->rec.end)
                continue;
            online = e->rec.state == SP_SERVER_ONLINE;
            if (e->rec.state == SP_SERVER_JOINING && joiner < 0)
                joiner = i;
        }
        if (online)
            continue;
        if (*missing < 0)
            *missing = b;
        ok = joiner >= 0;
        if (ok && !who[0]) {
            const sp_server_record *r = &rt->servers[joiner]->rec;
            snprintf(who, cap, "server %s (blocks %d:%d) is joining", r->name[0] ? r->name : r->id, r->start, r->end);
        }
    }
    pthread_mutex_unlock(&rt->lock);
    return ok;
}

/* The index of the server with this id, or -1; caller holds rt->lock. */
static int find_id(const sp_runtime *rt, const char *id)
{
    for (int i = 0; i < rt->nservers; i++)
        if (!strcmp(rt->servers[i]->rec.id, id))
            return i;
    return -1;
}

/* Routing spans of the usable servers, their next pings in nexts (room for SP_RECORD_MAX_PINGS each);
 * caller holds rt->lock. */
static int make_spans(sp_runtime *rt, sp_route_span *sp, sp_route_next *nexts)
{
    double now = sp_runtime_now(rt);
    int n = 0;
    for (int i = 0; i < rt->nservers; i++) {
        const sp_server_entry *e = rt->servers[i];
        if (!usable(rt, e))
            continue;
        sp_route_next *nx = nexts + (size_t)n * SP_RECORD_MAX_PINGS;
        int nn = 0;
        for (int p = 0; p < e->rec.npings; p++) {
            int to = find_id(rt, e->rec.pings[p].id);
            if (to >= 0)
                nx[nn++] = (sp_route_next){.server = to, .rtt = e->rec.pings[p].rtt};
        }
        sp_route_span *s = &sp[n++];
        *s = (sp_route_span){.server = i, .start = e->rec.start, .end = e->rec.end,
                             .inference_rps = e->rec.inference_rps, .block_s = e->block_s,
                             .throughput = e->rec.throughput,
                             .cache_tokens_left = e->rec.cache_tokens_left, .queue_wait = e->rec.queue_wait,
                             .client_rtt = e->rtt,
                             .banned = e->banned_until > now || sp_rt_busy(e, now), .next = nx, .nnext = nn};
    }
    return n;
}

/* How the session's steps will travel: relayed by the client (each hop costs the client's round trip to its
 * server, which the ping measures whole: the websocket, the server's loop), or pushed from server to server
 * (client -> first, each server's measured link to the next from its record, last -> client). */
static const sp_route_model RELAYED = {.relayed = 1, .overhead = 0};
static const sp_route_model PUSHED = {.relayed = 0, .overhead = 0, .guess_switch = 1};

/* The spans of sp[0..k) whose servers can take pushed steps (sp_rt_can), into out; their count. Caller holds
 * rt->lock. */
static int pushable_spans(const sp_runtime *rt, const sp_route_span *sp, int k, sp_route_span *out)
{
    int n = 0;
    for (int i = 0; i < k; i++)
        if (sp_rt_can(rt, sp[i].server, SP_CAP_STEP_PUSH))
            out[n++] = sp[i];
    return n;
}

/* The min-latency route as the session will run it (*pushed says how): push off relayed, on pushed; auto the
 * cheaper of the two where the pushed one's servers are far enough for a push to pay (their pings from the client
 * average 1 ms or more), else relayed. A pushed chain is sought among the servers that can take pushed steps: where
 * the cheapest chain over all servers has one that cannot (an older server), the cheapest over those that can is
 * priced instead, and where none covers the blocks, the route is relayed. Caller holds rt->lock. */
static int route_inference(sp_runtime *rt, const sp_route_span *sp, int k, int start, int end, long cache,
                           sp_route_hop *hops, double *cost, int *missing, int *pushed)
{
    int mode = rt->set.push, nh = -1;
    *pushed = 0;
    if (mode != SP_PUSH_OFF) {
        nh = sp_route_min_latency_model(sp, k, start, end, cache, &PUSHED, hops, SP_RT_MAX_HOPS, cost, missing);
        int srv[SP_RT_MAX_HOPS], can = nh >= 0;
        for (int h = 0; h < nh; h++)
            can = can && sp_rt_can(rt, hops[h].server, SP_CAP_STEP_PUSH);
        if (!can && nh >= 2) { /* the cheapest pushed chain of servers that can push */
            sp_route_span *capable = malloc((size_t)(k > 0 ? k : 1) * sizeof *capable);
            int missing2 = -1, kc = capable ? pushable_spans(rt, sp, k, capable) : 0;
            nh = kc ? sp_route_min_latency_model(capable, kc, start, end, cache, &PUSHED, hops, SP_RT_MAX_HOPS, cost,
                                                 &missing2)
                    : -1;
            can = nh >= 2;
            free(capable);
        }
        for (int h = 0; h < nh; h++)
            srv[h] = hops[h].server;
        if (can && nh >= 2 && mode == SP_PUSH_AUTO && sp_rt_pings_call_for_push(rt, srv, nh)) {
            sp_route_hop rh[SP_RT_MAX_HOPS];
            double rc;
            int rmissing = -1, rn = sp_route_min_latency_model(sp, k, start, end, cache, &RELAYED, rh, SP_RT_MAX_HOPS,
                                                               &rc, &rmissing);
            if (rn < 0 || *cost < rc)
                return *pushed = 1, nh;
        } else if (can && (mode == SP_PUSH_ON || nh < 2)) {
            *pushed = nh >= 2;
            return nh;
        }
    }
    return sp_route_min_latency_model(sp, k, start, end, cache, &RELAYED, hops, SP_RT_MAX_HOPS, cost, missing);
}

/* Routing over the table: min-latency (inference) when train is 0, else max-throughput. */
static int route_table(sp_runtime *rt, int train, int start, int end, long cache, sp_route_hop *hops, double *cost,
                       int *missing, int *pushed)
{
    pthread_mutex_lock(&rt->lock);
    size_t n = (size_t)rt->nservers + 1;
    sp_route_span *sp = malloc(n * sizeof *sp);
    sp_route_next *nx = malloc(n * SP_RECORD_MAX_PINGS * sizeof *nx);
    int nh = -2;
    *cost = 0;
    *pushed = 0;
    if (sp && nx) {
        int k = make_spans(rt, sp, nx);
        nh = train ? sp_route_max_throughput(sp, k, start, end, &rt->rng, hops, SP_RT_MAX_HOPS, missing)
                   : route_inference(rt, sp, k, start, end, cache, hops, cost, missing, pushed);
    }
    pthread_mutex_unlock(&rt->lock);
    free(sp);
    free(nx);
    return nh;
}

static void to_route(sp_route *out, const sp_route_hop *hops, int n, double cost, int pushed)
{
    sp_route flat = {.nhops = n, .cost = cost, .pushed = pushed};
    for (int h = 0; h < n; h++)
        flat.hop[h] = (sp_hop){.server = hops[h].server, .start = hops[h].start, .end = hops[h].end,
                               .latency = hops[h].latency};
    sp_route_single_stage(out, &flat);
}

static sp_status no_route(sp_runtime *rt, int missing, int start, int end, sp_err *err)
{
    if (missing < 0)
        return sp_errf(err, SP_ERR_RANGE, "a chain over blocks %d:%d needs more than %d hops", start, end,
                       SP_RT_MAX_HOPS);
    int L = rt->local ? rt->local->cfg.n_layers : end;
    return sp_errf(err, SP_ERR_NOTFOUND, "no online server holds block %d (of 0..%d)", missing, L - 1);
}

static sp_status routed(sp_runtime *rt, int nh, const sp_route_hop *hops, double cost, int pushed, int missing,
                        int start, int end, sp_route *out, sp_err *err)
{
    if (nh == -2)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    if (nh < 0)
        return no_route(rt, missing, start, end, err);
    to_route(out, hops, nh, cost, pushed);
    return SP_OK;
}

/* Servers on hops whose ping is unknown (never measured, or forgotten): their number, into srv. */
static int unmeasured(sp_runtime *rt, const sp_route_hop *hops, int nh, int *srv)
{
    int n = 0;
    pthread_mutex_lock(&rt->lock);
    for (int h = 0; h < nh; h++)
        if (rt->servers[hops[h].server]->rtt < 0)
            srv[n++] = hops[h].server;
    pthread_mutex_unlock(&rt->lock);
    return n;
}

/* The client's own part of a decode step: as measured in generations, else one pass of the head (3 tries, the
 * fastest) as a first guess. */
static double local_step(sp_runtime *rt)
{
    pthread_mutex_lock(&rt->lock);
    double s = rt->local_step_s;
    pthread_mutex_unlock(&rt->lock);
    if (s > 0 || !rt->local)
        return s;
    int H = rt->local->cfg.hidden;
    int32_t id = rt->local->cfg.bos_id > 0 ? rt->local->cfg.bos_id : 1;
    float *x = malloc((size_t)H * sizeof *x);
    double best = INFINITY;
    for (int k = 0; x && k < 3; k++) { /* a token's embedding as the hidden state: a head's usual work */
        double t0 = sp_now_s();
        if (sp_model_embed(rt->local, x, &id, 1, NULL) || sp_model_head_argmax(rt->local, &id, x, 1, NULL))
            break;
        best = fmin(best, sp_now_s() - t0);
    }
    free(x);
    if (!isfinite(best))
        return 0;
    pthread_mutex_lock(&rt->lock);
    if (rt->local_step_s <= 0)
        rt->local_step_s = best;
    s = rt->local_step_s;
    pthread_mutex_unlock(&rt->lock);
    return s;
}

sp_status sp_runtime_route_inference(sp_runtime *rt, int start, int end, long cache_tokens, sp_route *out, sp_err *err)
{
    sp_route_hop hops[SP_RT_MAX_HOPS];
    double cost;
    int missing = -1, nh = -1, pushed = 0, srv[SP_RT_MAX_HOPS];
    /* a ping unknown to routing costs a guess (0.3 s): the servers the route would use are measured first, and
     * the route made again on what was measured (a few rounds at most); a pushed chain's price hangs on the
     * client's pings to the servers it could start and end at, not only those of the route: those are measured
     * first */
    if (rt->set.push != SP_PUSH_OFF)
        sp_rt_ping_unknown(rt);
    for (int round = 0, n = 1; round < 3 && n > 0; round++) {
        nh = route_table(rt, 0, start, end, cache_tokens, hops, &cost, &missing, &pushed);
        n = nh > 0 ? unmeasured(rt, hops, nh, srv) : 0;
        for (int k = 0; k < n; k++)
            sp_rt_ping(rt, srv[k]);
    }
    sp_status st = routed(rt, nh, hops, cost, pushed, missing, start, end, out, err);
    int L = rt->local ? rt->local->cfg.n_layers : -1;
    if (!st && start == 0 && end == L) { /* a whole step: the client's part comes on top */
        out->local = local_step(rt);
        out->cost += out->local;
    }
    return st;
}

sp_status sp_rt_route_span_train(sp_runtime *rt, int start, int end, sp_route *out, sp_err *err)
{
    sp_route_hop hops[SP_RT_MAX_HOPS];
    double cost;
    int missing = -1, pushed = 0, nh = route_table(rt, 1, start, end, 0, hops, &cost, &missing, &pushed);
    return routed(rt, nh, hops, cost, 0, missing, start, end, out, err);
}

sp_status sp_runtime_route_train(sp_runtime *rt, sp_route *out, sp_err *err)
{
    if (!rt->local)
        return sp_errf(err, SP_ERR_STATE, "no model loaded");
    int L = rt->local->cfg.n_layers;
    for (int attempt = 0;; attempt++) { /* no server for a block: wait only for one that is joining */
        sp_err rerr = {0};
        sp_status st = sp_rt_route_span_train(rt, 0, L, out, &rerr);
        if (st != SP_ERR_NOTFOUND) {
            if (st && err)
                *err = rerr;
            return st;
        }
        if (attempt >= rt->set.max_retries) {
            if (err)
                *err = rerr;
            sp_err_prefix(err, "no server could run blocks 0:%d (%d retries): ", L, rt->set.max_retries);
            return SP_ERR_NOTFOUND;
        }
        sp_err why = {0};
        if (!sp_rt_no_server(rt, 0, L, attempt + 1, &why)) { /* nobody holds a block, nobody is joining */
            if (err)
                *err = why;
            sp_err_prefix(err, "no server could run blocks 0:%d: ", L);
            return SP_ERR_NOTFOUND;
        }
        if (sp_rt_sleep(rt, sp_rt_backoff(rt, attempt + 1)))
            return sp_errf(err, SP_ERR_CANCELLED, "cancelled");
    }
}

sp_status sp_runtime_route(sp_runtime *rt, sp_err *err)
{
    if (!rt->local)
        return sp_errf(err, SP_ERR_STATE, "no model loaded");
    sp_route r;
    sp_status st = sp_runtime_route_inference(rt, 0, rt->local->cfg.n_layers, 0, &r, err);
    if (st)
        return st;
    pthread_mutex_lock(&rt->lock);
    rt->route = r;
    pthread_mutex_unlock(&rt->lock);
    sp_runtime_note_route(rt, &r);
    return SP_OK;
}

void sp_runtime_note_route(sp_runtime *rt, const sp_route *r)
{
    char text[2048];
    sp_runtime_route_text(rt, r, text, sizeof text);
    sp_rt_emit_route(rt, SP_EV_ROUTE, text, 0, r, NULL);
}

void sp_runtime_route_text(sp_runtime *rt, const sp_route *r, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < r->nhops && n < cap; i++) {
        const sp_hop *h = &r->hop[i];
        char label[160];
        sp_rt_server_label(rt, h->server, label, sizeof label);
        n += (size_t)snprintf(buf + n, cap - n, "%s%d:%d %s", i ? " -> " : "", h->start, h->end, label);
        if (n < cap && h->latency > 0)
            n += (size_t)snprintf(buf + n, cap - n, " (%.*f ms)", h->latency < 0.01 ? 2 : 1, h->latency * 1e3);
    }
    if (n < cap && r->local > 0)
        n += (size_t)snprintf(buf + n, cap - n, " + %.*f ms local", r->local < 0.01 ? 2 : 1, r->local * 1e3);
    if (n < cap && r->cost > 0)
        n += (size_t)snprintf(buf + n, cap - n, "; %.0f steps/s expected", 1.0 / r->cost);
    if (n < cap && r->pushed)
        snprintf(buf + n, cap - n, ", pushed");
}

/* ---------------------------------------------------------------------------------------------- */
/* training's passes: relayed or pushed */

/* A ping as a link's price: unknown (< 0, NaN) as routing's unknown delay both ways. */
static double ping_price(double rtt) { return rtt >= 0 ? rtt : 2 * SP_ROUTE_UNKNOWN_DELAY; }

double sp_rt_train_price(const sp_runtime *rt, const int *srv, int n, int pushed)
{
    double c = 0;
    if (!pushed) {
        for (int h = 0; h < n; h++)
            c += ping_price(rt->servers[srv[h]]->rtt);
        return c;
    }
    c = ping_price(rt->servers[srv[0]]->rtt) / 2 + ping_price(rt->servers[srv[n - 1]]->rtt) / 2;
    for (int h = 0; h + 1 < n; h++) {
        const sp_server_entry *e = rt->servers[srv[h]];
        double link = -1;
        for (int p = 0; p < e->rec.npings && link < 0; p++)
            if (find_id(rt, e->rec.pings[p].id) == srv[h + 1] && e->rec.pings[p].rtt >= 0)
                link = e->rec.pings[p].rtt;
        c += ping_price(link >= 0 ? link : rt->servers[srv[h + 1]]->rtt) / 2;
    }
    return c;
}

/* 1 while server a's training pushes to server b are paused (a push from a did not reach b lately: SP_RT_NO_PUSH_S).
 * Caller holds rt->lock. */
static int push_paused(const sp_runtime *rt, int a, int b, double now)
{
    const sp_server_entry *e = rt->servers[a];
    return e->no_push_until > now && e->no_push_to == b;
}

int sp_rt_train_pushable(sp_runtime *rt, const sp_route *r)
{
    int mode = rt->set.push, n = r->nhops, srv[SP_RT_MAX_HOPS], ok = 1;
    if (mode == SP_PUSH_OFF || n < 2 || n != r->nstages)
        return 0;
    double now = sp_runtime_now(rt);
    pthread_mutex_lock(&rt->lock);
    for (int h = 0; ok && h < n; h++) {
        srv[h] = r->hop[h].server;
        ok = sp_rt_can(rt, srv[h], SP_CAP_SPAN_PUSH) &&
             (!h || (!push_paused(rt, srv[h - 1], srv[h], now) && !push_paused(rt, srv[h], srv[h - 1], now)));
        for (int g = 0; ok && g < h; g++)
            ok = srv[g] != srv[h] && !sp_rt_same_addr(rt->servers[srv[g]], rt->servers[srv[h]]);
    }
    int unknown[SP_RT_MAX_HOPS], nu = 0;
    for (int h = 0; ok && mode == SP_PUSH_AUTO && h < n; h++)
        if (rt->servers[srv[h]]->rtt < 0)
            unknown[nu++] = srv[h];
    pthread_mutex_unlock(&rt->lock);
    if (!ok || mode != SP_PUSH_AUTO)
        return ok;
    for (int k = 0; k < nu; k++) /* priced on measured links: a ping not known yet is measured first */
        sp_rt_ping(rt, unknown[k]);
    pthread_mutex_lock(&rt->lock);
    ok = sp_rt_pings_call_for_push(rt, srv, n) && sp_rt_train_price(rt, srv, n, 1) < sp_rt_train_price(rt, srv, n, 0);
    pthread_mutex_unlock(&rt->lock);
    return ok;
}
