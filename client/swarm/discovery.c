/* discovery.c - the client in the DHT: a node of its own (a supervised child, dht/dht.h) that announces
 * nothing, a live view of the loaded model's servers (dht/view.h) whose changes become server entries and
 * events, and a pinger that measures the round trip to the servers routing will choose between (Petals:
 * up to 3 of the first block's, of middle blocks' and of the last block's servers per round): each
 * measurement is the fastest of a burst of pings, and a server's ping is the median of its last four, renewed
 * every 2 s while no request runs. */
#include "swarm_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dht.h"
#include "timeutil.h"
#include "view.h"

#define PEER_CHECK_MS 10000 /* the longest the peers' DHT pings are waited for (one goes unanswered in ~3 s) */
#define PEER_PROBE_MS 3000  /* a silent peer's websocket probe */

#define PINGS_PER_GROUP 3
#define PING_BURST 3      /* pings per measurement: the fastest counts (the first may open the connection) */
#define PING_WINDOW 4     /* the estimate: the median of the last measurements, so start-up is soon forgotten */
#define PING_REFRESH_S 2  /* while no request runs, measurements older than this (or the update period) renew */
#define PING_TIMEOUT_MS 2000
#define FIRST_ROUND_MS 5000 /* the longest a join or a load waits for the view's first round of gets */

/* ---------------------------------------------------------------------------------------------- */
/* the view's changes become entries */

static void on_change(void *user, sp_view_change what, const sp_server_record *r, const sp_server_record *prev)
{
    sp_runtime *rt = user;
    pthread_mutex_lock(&rt->lock);
    int i = -1;
    if (what == SP_VIEW_GONE) {
        for (int k = 0; k < rt->nservers; k++)
            if (!strcmp(rt->servers[k]->rec.id, r->id)) {
                rt->servers[k]->gone = 1;
                i = k;
            }
    } else {
        i = sp_rt_server_put(rt, r, 1);
    }
    pthread_mutex_unlock(&rt->lock);
    if (i < 0)
        return;
    const char *name = r->name[0] ? r->name : r->id;
    if (what == SP_VIEW_NEW && r->port > 0)
        sp_rt_emitf(rt, SP_EV_SERVER, i, "server %s joined: blocks %d:%d at %s:%d (%s)", name, r->start, r->end,
                    r->host, r->port, sp_server_state_name(r->state));
    else if (what == SP_VIEW_NEW) /* JOINING before its port is bound: it is loading */
        sp_rt_emitf(rt, SP_EV_SERVER, i, "server %s joined: blocks %d:%d on %s (%s, loading)", name, r->start,
                    r->end, r->host, sp_server_state_name(r->state));
    else if (what == SP_VIEW_GONE && strcmp(prev->id, r->id)) /* a restart at its address */
        sp_rt_emitf(rt, SP_EV_SERVER, i, "server %s at %s:%d was restarted: %s runs there now", name, r->host,
                    r->port, prev->name[0] ? prev->name : prev->id);
    else if (what == SP_VIEW_GONE)
        sp_rt_emitf(rt, SP_EV_SERVER, i, "server %s left (no announcement for %.0f s)", name, 3 * r->period);
    else if (prev->state != r->state || prev->start != r->start || prev->end != r->end)
        sp_rt_emitf(rt, SP_EV_SERVER, i, "server %s: blocks %d:%d at %s:%d, %s", name, r->start, r->end, r->host,
                    r->port, sp_server_state_name(r->state));
    if (what != SP_VIEW_CHANGED || prev->state != r->state)
        pthread_cond_broadcast(&rt->pinger_cond); /* ping newcomers soon */
}

static void on_value(void *user, const char *key, const uint8_t *data, size_t len, int expired)
{
    sp_runtime *rt = user;
    sp_view_slot_on_value(&rt->views, key, data, len, expired);
}

static void on_get_done(void *user, const char *key, int ok)
{
    sp_runtime *rt = user;
    sp_view_slot_on_get_done(&rt->views, key, ok);
}

static void on_dht_event(void *user, const char *text) { sp_rt_emit(user, SP_EV_INFO, text, 0, 0, 0); }

/* Replaces the view (NULL: none); entries found through the old one become gone. */
static void set_view(sp_runtime *rt, sp_view *v)
{
    sp_view *old = sp_view_slot_swap(&rt->views, v);
    sp_view_free(old);
    if (!old)
        return;
    pthread_mutex_lock(&rt->lock);
    for (int i = 0; i < rt->nservers; i++)
        if (rt->servers[i]->from_dht)
            rt->servers[i]->gone = 1;
    pthread_mutex_unlock(&rt->lock);
}

/* Sealed records the view found and this runtime's key cannot open (it has none, or another swarm's): said
 * before any generation, so that "no servers" comes with its reason (issue 22). */
static void say_unreadable(sp_runtime *rt)
{
    sp_view_stats vs;
    sp_view_slot_stats(&rt->views, &vs);
    int n = rt->local ? vs.unreadable : vs.unreadable_index;
    const char *where = rt->local ? "under this model" : "in this swarm", *s = n == 1 ? "" : "s";
    if (n > 0 && rt->has_key)
        sp_rt_emitf(rt, SP_EV_ERROR, 0, "%d record%s %s cannot be read with this swarm key (they are sealed for swarm "
                    "%s; this key's swarm is %s)", n, s, where, vs.unreadable_swarm, rt->key.id_hex);
    else if (n > 0)
        sp_rt_emitf(rt, SP_EV_ERROR, 0, "%d record%s %s cannot be read without a swarm key (a private swarm, %s: "
                    "connect --swarm-key FILE)", n, s, where, vs.unreadable_swarm);
}

static sp_status follow_model(sp_runtime *rt, sp_err *err)
{
    if (!rt->dht)
        return SP_OK;
    set_view(rt, NULL);
    sp_view_opts o = {.model = rt->local ? rt->model_prefix : NULL,
                      .config_hash = rt->local ? rt->local->cfg.hash : 0,
                      .num_blocks = rt->local ? rt->local->cfg.n_layers : 0,
                      .refresh_s = rt->set.update_period_s, .on_change = on_change, .user = rt,
                      .key = rt->has_key ? &rt->key : NULL};
    sp_view *v = NULL;
    sp_status st = sp_view_new(&v, rt->dht, &o, err);
    if (st)
        return st;
    set_view(rt, v);
    /* the first round of gets (a few ms on a LAN): the next command finds the servers there already, as a
     * Petals client waits for its first update before it routes */
    sp_view_wait_round(v, FIRST_ROUND_MS);
    return SP_OK;
}

int sp_runtime_wait_view(sp_runtime *rt, int timeout_ms)
{
    pthread_mutex_lock(&rt->views.lock);
    sp_view *v = rt->views.view; /* only load and leave replace it, not concurrently (swarm.h) */
    pthread_mutex_unlock(&rt->views.lock);
    return v ? sp_view_wait_round(v, timeout_ms) : -1;
}

sp_status sp_rt_view_follow_model(sp_runtime *rt, sp_err *err)
{
    sp_status st = follow_model(rt, err);
    if (!st)
        say_unreadable(rt);
    return st;
}

/* ---------------------------------------------------------------------------------------------- */
/* pings */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of the entry's window; caller holds rt->lock. */
static double window_median(const sp_server_entry *e)
{
    int n = e->rtt_n < PING_WINDOW ? e->rtt_n : PING_WINDOW;
    double w[PING_WINDOW];
    memcpy(w, e->rtt_win, (size_t)n * sizeof *w);
    qsort(w, (size_t)n, sizeof *w, cmp_double);
    return n % 2 ? w[n / 2] : 0.5 * (w[n / 2 - 1] + w[n / 2]);
}

void sp_rt_ping(sp_runtime *rt, int i)
{
    double best = INFINITY;
    sp_status st = SP_OK;
    for (int k = 0; k < PING_BURST && !st; k++) {
        sp_reply rep;
        sp_err err = {0};
        double t0 = sp_now_s();
        st = sp_rt_call(rt, i, SP_MSG_PING, NULL, NULL, 0, &rep, PING_TIMEOUT_MS, &err);
        double rtt = sp_now_s() - t0;
        sp_reply_clear(&rep);
        if (!st && rtt < best)
            best = rtt;
    }
    if (st == SP_ERR_IO || st == SP_ERR_CLOSED)
        sp_rt_probe_down(rt, i); /* nothing listens there: its process is gone */
    pthread_mutex_lock(&rt->lock);
    sp_server_entry *e = rt->servers[i];
    if (st) {
        e->rtt = INFINITY;
    } else {
        e->rtt_win[e->rtt_n++ % PING_WINDOW] = best;
        e->rtt = window_median(e);
        e->down = 0; /* it answered, as itself (sp_rt_call checks the id) */
    }
    e->rtt_when = sp_now_s();
    pthread_mutex_unlock(&rt->lock);
}

void sp_rt_forget_pings(sp_runtime *rt)
{
    pthread_mutex_lock(&rt->lock);
    for (int i = 0; i < rt->nservers; i++)
        if (!isinf(rt->servers[i]->rtt)) {
            rt->servers[i]->rtt = -1;
            rt->servers[i]->rtt_n = 0;
        }
    pthread_mutex_unlock(&rt->lock);
}

/* Servers of the first block, of middle blocks and of the last block whose round trip is unknown, or (unless
 * unknown_only, and while no request runs: a ping would wait behind its steps, and delay them) older than
 * PING_REFRESH_S or the update period: up to PINGS_PER_GROUP of each. */
static int ping_candidates(sp_runtime *rt, int *out, int cap, int unknown_only)
{
    int L = rt->local ? rt->local->cfg.n_layers : 0, n = 0, count[3] = {0, 0, 0};
    int idle = !unknown_only && !__atomic_load_n(&rt->active, __ATOMIC_RELAXED);
    double now = sp_now_s(), period = fmin(rt->set.update_period_s, PING_REFRESH_S);
    pthread_mutex_lock(&rt->lock);
    for (int i = 0; i < rt->nservers && n < cap && L > 0; i++) {
        const sp_server_entry *e = rt->servers[i];
        if (e->gone || e->rec.state != SP_SERVER_ONLINE || (e->rtt >= 0 && (!idle || now - e->rtt_when < period)))
            continue;
        int g = e->rec.start == 0 ? 0 : e->rec.end == L ? 2 : 1;
        if (count[g] < PINGS_PER_GROUP) {
            count[g]++;
            out[n++] = i;
        }
    }
    pthread_mutex_unlock(&rt->lock);
    return n;
}

static void *pinger_main(void *arg)
{
    sp_runtime *rt = arg;
    pthread_setname_np(pthread_self(), "sp-ping-cli");
    pthread_mutex_lock(&rt->lock);
    while (!rt->pinger_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 2;
        pthread_cond_timedwait(&rt->pinger_cond, &rt->lock, &ts);
        if (rt->pinger_stop)
            break;
        pthread_mutex_unlock(&rt->lock);
        sp_rt_reap_local(rt);
        int cand[3 * PINGS_PER_GROUP];
        int n = ping_candidates(rt, cand, 3 * PINGS_PER_GROUP, 0);
        for (int k = 0; k < n && !rt->pinger_stop; k++)
            sp_rt_ping(rt, cand[k]);
        pthread_mutex_lock(&rt->lock);
    }
    pthread_mutex_unlock(&rt->lock);
    return NULL;
}

void sp_rt_ping_unknown(sp_runtime *rt)
{
    int cand[3 * PINGS_PER_GROUP];
    int n = ping_candidates(rt, cand, 3 * PINGS_PER_GROUP, 1);
    for (int k = 0; k < n; k++)
        sp_rt_ping(rt, cand[k]);
}

/* ---------------------------------------------------------------------------------------------- */
/* joining and leaving */

/* 127.0.0.1 when every peer is on loopback (so the node is not reachable from elsewhere), else all. */
static const char *bind_for(const char *peers)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", peers);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
        if (strncmp(t, "127.", 4) && strncmp(t, "localhost:", 10))
            return "0.0.0.0";
    return "127.0.0.1";
}

/* With nothing found through peers: an error when none of them answered as a DHT node, saying what each one
 * is instead (sepal-server's own check of its --initial-peers; a silent peer is declared in about 3 s). */
static sp_status no_peer_answers(sp_runtime *rt, const char *peers, sp_err *err)
{
    char silent[1024], why[1536] = "";
    int quiet = sp_dht_silent_peers(rt->dht, PEER_CHECK_MS, silent, sizeof silent), given = 1;
    for (const char *c = peers; *c; c++)
        given += *c == ',';
    if (quiet < given)
        return SP_OK;
    size_t at = 0;
    for (char *save = NULL, *t = strtok_r(silent, ",", &save); t && at < sizeof why; t = strtok_r(NULL, ",", &save)) {
        char *colon = strrchr(t, ':');
        if (!colon)
            continue;
        *colon = '\0';
        at += (size_t)snprintf(why + at, sizeof why - at, "%s", at ? "; " : "");
        if (at < sizeof why)
            sp_remote_describe_port(t, atoi(colon + 1), rt->has_key ? &rt->key : NULL, PEER_PROBE_MS, why + at,
                                    sizeof why - at);
        at += strlen(why + at);
    }
    return sp_errf(err, SP_ERR_ARG, "--initial-peers %s: %s", peers, why);
}

sp_status sp_runtime_join(sp_runtime *rt, const char *initial_peers, sp_err *err)
{
    if (rt->dht)
        return sp_errf(err, SP_ERR_STATE, "already in a swarm (joined through %s)", rt->initial_peers);
    sp_dht_opts o = {.bind = bind_for(initial_peers), .bootstrap = initial_peers, .on_value = on_value,
                     .on_get_done = on_get_done, .on_event = on_dht_event, .user = rt};
    sp_status st = sp_dht_start(&rt->dht, &o, err);
    if (st)
        return sp_err_prefix(err, "joining the swarm through %s: ", initial_peers);
    snprintf(rt->initial_peers, sizeof rt->initial_peers, "%s", initial_peers);
    st = follow_model(rt, err);
    if (!st && !rt->pinger_started) {
        rt->pinger_stop = 0;
        rt->pinger_started = !pthread_create(&rt->pinger, NULL, pinger_main, rt);
    }
    if (st) {
        sp_rt_leave(rt);
        return st;
    }
    int n = 0;
    pthread_mutex_lock(&rt->lock);
    for (int i = 0; i < rt->nservers; i++)
        n += rt->servers[i]->from_dht && !rt->servers[i]->gone;
    pthread_mutex_unlock(&rt->lock);
    if (!n && (st = no_peer_answers(rt, initial_peers, err))) { /* a websocket port given for a DHT node, say */
        sp_rt_leave(rt);
        return st;
    }
    sp_rt_emitf(rt, SP_EV_INFO, 0, "joined the swarm through %s (DHT node on %s:%d): %d server%s seen%s", initial_peers,
                o.bind, sp_dht_port(rt->dht), n, n == 1 ? "" : "s", rt->local ? "" : " (load a model to see its servers)");
    say_unreadable(rt);
    return SP_OK;
}

void sp_rt_leave(sp_runtime *rt)
{
    if (rt->pinger_started) {
        pthread_mutex_lock(&rt->lock);
        rt->pinger_stop = 1;
        pthread_cond_broadcast(&rt->pinger_cond);
        pthread_mutex_unlock(&rt->lock);
        pthread_join(rt->pinger, NULL);
        rt->pinger_started = 0;
    }
    set_view(rt, NULL);
    sp_dht_stop(rt->dht);
    rt->dht = NULL;
    rt->initial_peers[0] = '\0';
}

int sp_runtime_models(sp_runtime *rt, sp_model_record **out)
{
    return sp_view_slot_models(&rt->views, out);
}

int sp_rt_wait_server(sp_runtime *rt, int port, double timeout_s)
{
    double end = sp_now_s() + timeout_s;
    for (;;) {
        pthread_mutex_lock(&rt->lock);
        int found = -1;
        for (int i = 0; i < rt->nservers && found < 0; i++) {
            const sp_server_entry *e = rt->servers[i];
            if (!e->gone && e->from_dht && e->rec.port == port && e->rec.state == SP_SERVER_ONLINE)
                found = i;
        }
        pthread_mutex_unlock(&rt->lock);
        if (found >= 0 || sp_now_s() > end)
            return found;
        if (sp_rt_sleep(rt, 0.01))
            return -1;
    }
}
