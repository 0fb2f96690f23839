/* announce.c - the server's record in the DHT, refreshed every period, and the pings to its successors
 * that clients' routing reads from it (Petals: up to 5 random servers inside the span's later blocks and up
 * to 5 holding the block after it, smoothed with an EMA of 0.2, forgotten after 5 minutes). */
#include "announce.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "remote.h"
#include "rng.h"
#include "timeutil.h"

#define MAX_PINGED 5
#define PING_TIMEOUT_MS 2000
#define PING_ALPHA 0.2
#define PING_TTL_S 300.0
#define MAX_PING_ENTRIES 64
#define PEER_CHECK_MS 10000 /* the longest the initial peers' pings are waited for (one goes unanswered in ~3 s) */
#define PEER_PROBE_MS 3000  /* a silent peer's websocket probe */

typedef struct ping_entry {
    char id[SP_SERVER_ID_LEN];
    double rtt, when;
} ping_entry;

struct sp_announce {
    sp_announce_opts o;
    sp_swarm_key key; /* o.key points here */
    sp_dht *dht;
    sp_view_slot views;    /* the DHT's callbacks reach the view through it; stopping empties it */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    sp_server_record rec;  /* what is published */
    int published;         /* rec was set at least once */
    int dirty;             /* publish at the next wake-up */
    int ping_soon;         /* a successor came online that we have no ping of: ping (and publish) now */
    double load_sent;      /* sp_now_s() when a change of saturation was last published */
    sp_announce_fill_fn fill;
    void *fill_user;
    ping_entry pings[MAX_PING_ENTRIES];
    int npings;
    sp_rng rng;
    int stop;
    pthread_t thread;
    int thread_started;
};

/* ---------------------------------------------------------------------------------------------- */
/* publishing */

static int ttl_of(double period) { return (int)ceil(4 * period) + 1; }

/* Puts r under every block key of its span and the model index (caller holds no lock). */
static void publish(sp_announce *a, const sp_server_record *r)
{
    char buf[SP_RECORD_MAX], key[SP_MODEL_PREFIX_MAX + 16];
    size_t len;
    sp_err err = {0};
    if (sp_record_encode(r, buf, sizeof buf, &len, &err) ||
        (a->o.key && sp_record_seal(buf, sizeof buf, &len, a->o.key, &err))) {
        sp_log(SP_LOG_ERROR, "announce: %s", err.msg);
        return;
    }
    int ttl = ttl_of(r->period);
    for (int b = r->start; b < r->end; b++) {
        sp_block_key(r->model, b, key, sizeof key);
        sp_dht_put(a->dht, key, r->id, ttl, buf, len);
    }
    sp_model_record m = {.config_hash = r->config_hash, .num_blocks = r->num_blocks, .hidden = a->o.hidden,
                         .timestamp = r->timestamp, .period = r->period};
    snprintf(m.model, sizeof m.model, "%s", r->model);
    snprintf(m.architecture, sizeof m.architecture, "%s", a->o.architecture ? a->o.architecture : "");
    if (!sp_model_record_encode(&m, buf, sizeof buf, &len, &err) &&
        (!a->o.key || !sp_record_seal(buf, sizeof buf, &len, a->o.key, &err)))
        sp_dht_put(a->dht, SP_MODELS_KEY, r->model, ttl, buf, len);
}

/* Stamps the record, copies it out under the lock, publishes outside it. */
static void publish_now(sp_announce *a)
{
    pthread_mutex_lock(&a->lock);
    a->rec.timestamp = sp_wall_s();
    a->rec.period = a->o.period;
    a->rec.npings = 0;
    double now = sp_now_s();
    for (int i = 0; i < a->npings && a->rec.npings < SP_RECORD_MAX_PINGS; i++)
        if (now - a->pings[i].when < PING_TTL_S)
            a->rec.pings[a->rec.npings++] = (sp_next_ping){.rtt = a->pings[i].rtt};
    for (int i = 0, k = 0; i < a->npings && k < a->rec.npings; i++)
        if (now - a->pings[i].when < PING_TTL_S)
            memcpy(a->rec.pings[k++].id, a->pings[i].id, SP_SERVER_ID_LEN);
    sp_server_record r = a->rec;
    a->dirty = 0;
    pthread_mutex_unlock(&a->lock);
    publish(a, &r);
}

/* ---------------------------------------------------------------------------------------------- */
/* pings to successors */

static void ping_record(sp_announce *a, const char *id, double rtt)
{
    pthread_mutex_lock(&a->lock);
    int i = 0;
    while (i < a->npings && strcmp(a->pings[i].id, id))
        i++;
    if (i == a->npings) {
        if (a->npings == MAX_PING_ENTRIES) { /* replace the oldest */
            i = 0;
            for (int j = 1; j < a->npings; j++)
                if (a->pings[j].when < a->pings[i].when)
                    i = j;
        } else {
            a->npings++;
        }
        snprintf(a->pings[i].id, sizeof a->pings[i].id, "%s", id);
        a->pings[i].rtt = rtt;
    } else {
        a->pings[i].rtt = PING_ALPHA * rtt + (1 - PING_ALPHA) * a->pings[i].rtt;
    }
    a->pings[i].when = sp_now_s();
    pthread_mutex_unlock(&a->lock);
}

/* Round trip of one PING to r (connection set-up not counted); < 0 on failure. In a private swarm the
 * connection proves the key both ways first: a server without it is never pinged, so never routed through. */
static double ping_once(sp_announce *a, const sp_server_record *r)
{
    sp_remote *c = NULL;
    sp_remote_opts ro = {.no_bulk = 1, .key = a->o.key, .source = a->o.source};
    if (sp_remote_connect_opts(&c, r->host, r->port, &ro, PING_TIMEOUT_MS, NULL))
        return -1;
    sp_reply rep;
    double t0 = sp_now_s();
    sp_status st = sp_remote_call(c, SP_MSG_PING, NULL, NULL, 0, &rep, PING_TIMEOUT_MS, NULL);
    double rtt = sp_now_s() - t0;
    sp_reply_clear(&rep);
    sp_remote_close(c);
    return st ? -1 : rtt;
}

/* Up to MAX_PINGED random entries of cand[0..n) are pinged (cand is shuffled in place); none after
 * sp_announce_stop began (a server leaving does not wait for a round of pings, each up to PING_TIMEOUT_MS). */
static void ping_some(sp_announce *a, sp_server_record *cand, int n)
{
    for (int i = 0; i < n && i < MAX_PINGED && !__atomic_load_n(&a->stop, __ATOMIC_ACQUIRE); i++) {
        int j = i + (int)(sp_rng_u32(&a->rng) % (uint32_t)(n - i));
        sp_server_record t = cand[i];
        cand[i] = cand[j];
        cand[j] = t;
        double rtt = ping_once(a, &cand[i]);
        if (rtt >= 0)
            ping_record(a, cand[i].id, rtt);
    }
}

static void ping_successors(sp_announce *a)
{
    sp_server_record self, *all = NULL;
    sp_announce_record(a, &self);
    int n = sp_view_snapshot(a->views.view, &all);
    sp_server_record *inner = n ? malloc((size_t)n * sizeof *inner) : NULL, *next = n ? malloc((size_t)n * sizeof *next) : NULL;
    int ni = 0, nn = 0;
    for (int i = 0; inner && next && i < n; i++) {
        const sp_server_record *r = &all[i];
        if (!strcmp(r->id, self.id) || r->state != SP_SERVER_ONLINE)
            continue;
        if (r->start <= self.end && r->end > self.end)
            next[nn++] = *r;
        else if (r->end > self.start + 1 && r->start < self.end)
            inner[ni++] = *r;
    }
    ping_some(a, inner, ni);
    ping_some(a, next, nn);
    free(inner);
    free(next);
    free(all);
}

/* ---------------------------------------------------------------------------------------------- */
/* the refresh thread */

static int saturated(const sp_server_record *r) { return sp_record_saturated(r); }

/* The figures that change by themselves, from fill (and the device its blocks run on, where fill says one): taken
 * into the record every period (periodic), and between periods when the server became saturated or ceased to be (at
 * most once a second). 1 if that changed now. */
static int refill(sp_announce *a, sp_announce_fill_fn fill, void *user, int periodic)
{
    sp_server_record r;
    sp_announce_record(a, &r);
    int was = saturated(&r);
    fill(user, &r);
    double now = sp_now_s();
    int flipped = saturated(&r) != was && now - a->load_sent >= 1.0;
    if (periodic || flipped) {
        pthread_mutex_lock(&a->lock);
        a->rec.cache_tokens_left = r.cache_tokens_left;
        a->rec.queue_wait = r.queue_wait;
        a->rec.max_queue_wait = r.max_queue_wait;
        if (r.device[0])
            snprintf(a->rec.device, sizeof a->rec.device, "%s", r.device);
        pthread_mutex_unlock(&a->lock);
    }
    if (flipped)
        a->load_sent = now;
    return flipped;
}

static void *announce_main(void *arg)
{
    sp_announce *a = arg;
    pthread_setname_np(pthread_self(), "sp-announce");
    double next = sp_now_s() + (a->o.period < 1 ? a->o.period : 1); /* the first pings soon after start */
    pthread_mutex_lock(&a->lock);
    while (!a->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&a->cond, &a->lock, &ts);
        int due = a->published && (a->dirty || a->ping_soon || sp_now_s() >= next);
        int periodic = sp_now_s() >= next, ping_soon = a->ping_soon;
        a->ping_soon = 0;
        if (a->stop || !a->published || (!due && !a->fill))
            continue;
        sp_announce_fill_fn fill = a->fill;
        void *fu = a->fill_user;
        pthread_mutex_unlock(&a->lock);
        int flipped = fill && refill(a, fill, fu, periodic);
        if (periodic) {
            ping_successors(a);
            next = sp_now_s() + a->o.period;
        } else if (ping_soon) {
            ping_successors(a);
        } else if (!due && !flipped) {
            pthread_mutex_lock(&a->lock);
            continue;
        }
        publish_now(a);
        pthread_mutex_lock(&a->lock);
    }
    pthread_mutex_unlock(&a->lock);
    return NULL;
}

/* ---------------------------------------------------------------------------------------------- */
/* life cycle */

/* A server that holds blocks after ours came online and we have not pinged it yet: routes through us would
 * price the switch to it as unknown (Petals' 0.15 s) until the next period, so ping now. */
static void on_change(void *user, sp_view_change what, const sp_server_record *r, const sp_server_record *prev)
{
    sp_announce *a = user;
    if (what == SP_VIEW_GONE || r->state != SP_SERVER_ONLINE || (prev && prev->state == SP_SERVER_ONLINE))
        return;
    pthread_mutex_lock(&a->lock);
    int succ = strcmp(r->id, a->rec.id) && r->end > a->rec.start + 1 && r->start <= a->rec.end;
    for (int i = 0; succ && i < a->npings; i++)
        if (!strcmp(a->pings[i].id, r->id))
            succ = 0;
    if (succ && a->published && a->rec.state == SP_SERVER_ONLINE) {
        a->ping_soon = 1;
        pthread_cond_broadcast(&a->cond);
    }
    pthread_mutex_unlock(&a->lock);
}

static void on_event(void *user, const char *text)
{
    (void)user;
    sp_log(SP_LOG_WARN, "%s", text);
}

sp_status sp_announce_start(sp_announce **out, const sp_announce_opts *o, sp_err *err)
{
    *out = NULL;
    sp_announce *a = calloc(1, sizeof *a);
    if (!a)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    a->o = *o;
    if (o->key) {
        a->key = *o->key;
        a->o.key = &a->key;
    }
    if (a->o.period <= 0)
        a->o.period = 30;
    a->rec = o->base;
    a->rec.period = a->o.period;
    pthread_mutex_init(&a->lock, NULL);
    sp_view_slot_init(&a->views);
    pthread_cond_init(&a->cond, NULL);
    sp_rng_seed(&a->rng, sp_now_ns() ^ (uint64_t)getpid());
    sp_dht_opts d = {.bind = o->dht_bind, .port = o->dht_port, .bootstrap = o->initial_peers,
                     .on_value = sp_view_slot_on_value, .on_get_done = sp_view_slot_on_get_done, .on_event = on_event,
                     .user = &a->views};
    sp_status st = sp_dht_start(&a->dht, &d, err);
    if (!st) {
        snprintf(a->rec.dht, sizeof a->rec.dht, "%s:%d", o->dht_bind ? o->dht_bind : "127.0.0.1", sp_dht_port(a->dht));
        sp_view_opts vo = {.model = o->base.model, .config_hash = o->base.config_hash,
                           .num_blocks = o->base.num_blocks, .refresh_s = a->o.period,
                           .on_change = on_change, .user = a, .key = a->o.key};
        sp_view *v = NULL;
        st = sp_view_new(&v, a->dht, &vo, err);
        sp_view_slot_swap(&a->views, v);
    }
    if (!st && pthread_create(&a->thread, NULL, announce_main, a))
        st = sp_errf(err, SP_ERR_IO, "announce: cannot start its thread");
    a->thread_started = !st;
    if (st) {
        sp_announce_stop(a);
        return st;
    }
    *out = a;
    return SP_OK;
}

/* Why host:port, which did not answer a DHT ping, is no DHT node: a sepal-server's websocket port (its HELLO
 * names its DHT port), a server that refuses us, or nothing that answers. */
sp_status sp_announce_check_peers(sp_announce *a, sp_err *err)
{
    char silent[1024], why[1536] = "";
    int quiet = a->o.initial_peers ? sp_dht_silent_peers(a->dht, PEER_CHECK_MS, silent, sizeof silent) : 0, given = 1;
    if (!quiet)
        return SP_OK;
    for (const char *c = a->o.initial_peers; *c; c++)
        given += *c == ',';
    size_t at = 0;
    for (char *save = NULL, *t = strtok_r(silent, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char one[512], *colon = strrchr(t, ':');
        if (!colon)
            continue;
        *colon = '\0';
        sp_remote_describe_port(t, atoi(colon + 1), a->o.key, PEER_PROBE_MS, one, sizeof one);
        if (quiet < given) /* the swarm is joined through the others */
            sp_log(SP_LOG_WARN, "--initial-peers: %s", one);
        else if (at < sizeof why)
            at += (size_t)snprintf(why + at, sizeof why - at, "%s%s", at ? "; " : "", one);
    }
    return quiet < given ? SP_OK : sp_errf(err, SP_ERR_ARG, "--initial-peers %s: %s", a->o.initial_peers, why);
}

void sp_announce_set_fill(sp_announce *a, sp_announce_fill_fn fn, void *user)
{
    pthread_mutex_lock(&a->lock);
    a->fill = fn;
    a->fill_user = user;
    pthread_mutex_unlock(&a->lock);
}

void sp_announce_update(sp_announce *a, const sp_server_record *r)
{
    pthread_mutex_lock(&a->lock);
    sp_server_record *m = &a->rec;
    if (r->state == SP_SERVER_ONLINE && (m->state != SP_SERVER_ONLINE || m->start != r->start || m->end != r->end))
        a->ping_soon = 1; /* (re)started serving: price the switches from us now, not a period later */
    m->start = r->start;
    m->end = r->end;
    m->state = r->state;
    m->port = r->port;
    m->throughput = r->throughput;
    m->inference_rps = r->inference_rps;
    m->forward_rps = r->forward_rps;
    m->network_rps = r->network_rps;
    m->cache_tokens_left = r->cache_tokens_left;
    m->queue_wait = r->queue_wait;
    m->max_queue_wait = r->max_queue_wait;
    m->caps = r->caps;
    if (r->device[0]) /* (an update without one keeps what it said) */
        snprintf(m->device, sizeof m->device, "%s", r->device);
    a->published = 1;
    pthread_mutex_unlock(&a->lock);
    publish_now(a);
}

void sp_announce_record(sp_announce *a, sp_server_record *r)
{
    pthread_mutex_lock(&a->lock);
    *r = a->rec;
    pthread_mutex_unlock(&a->lock);
}

sp_view *sp_announce_view(sp_announce *a) { return a->views.view; }
sp_dht *sp_announce_dht(sp_announce *a) { return a->dht; }
int sp_announce_dht_port(const sp_announce *a) { return sp_dht_port(a->dht); }
pid_t sp_announce_dht_pid(const sp_announce *a) { return sp_dht_pid(a->dht); }

void sp_announce_stop(sp_announce *a)
{
    if (!a)
        return;
    if (a->thread_started) {
        pthread_mutex_lock(&a->lock);
        __atomic_store_n(&a->stop, 1, __ATOMIC_RELEASE); /* ping_some reads it without the lock */
        pthread_cond_broadcast(&a->cond);
        pthread_mutex_unlock(&a->lock);
        pthread_join(a->thread, NULL);
    }
    if (a->dht && a->published) {
        pthread_mutex_lock(&a->lock);
        a->rec.state = SP_SERVER_OFFLINE;
        pthread_mutex_unlock(&a->lock);
        publish_now(a);
        sp_err err = {0};
        /* best effort, returning once stored (a few ms here); the cap only matters on a slow machine: 100 ms lost
         * the OFFLINE record under ASan (test_swarm), and 400 keeps an exit well inside test_failover's 2 s */
        if (sp_dht_flush(a->dht, 400, &err))
            sp_log(SP_LOG_WARN, "announcing OFFLINE: %s", err.msg);
    }
    sp_view_free(sp_view_slot_swap(&a->views, NULL)); /* no callback uses the view after this */
    sp_dht_stop(a->dht);
    pthread_mutex_destroy(&a->lock);
    sp_view_slot_destroy(&a->views);
    pthread_cond_destroy(&a->cond);
    free(a);
}
