/* view.c - the live view: values from listens and lookups, checked and merged per server, swept when
 * stale. Changes are collected under the lock and reported after it is released. */
#include "view.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "timeutil.h"

#define MAX_CHANGES 64
#define MAX_NONCES 512 /* sealed values told apart when counting those this view cannot open */

typedef struct change {
    sp_view_change what;
    sp_server_record r, prev;
} change;

/* A server superseded by a newer life at its address: records of its id are refused until they would be
 * stale anyway (older copies of them stay in the DHT for a while; one must not bring the dead life back). */
typedef struct tomb {
    char id[SP_SERVER_ID_LEN];
    double until; /* wall clock */
} tomb;

#define MAX_TOMBS 256

struct sp_view {
    sp_dht *dht;
    sp_view_opts o;
    char model[SP_MODEL_PREFIX_MAX];
    pthread_mutex_t lock;
    pthread_cond_t cond;
    sp_server_record *recs; /* sorted by id */
    int nrecs, caprecs;
    sp_model_record *models;
    int nmodels, capmodels;
    tomb tombs[MAX_TOMBS]; /* a ring: the oldest goes first */
    int ntombs;
    sp_view_stats stats;
    int has_key;
    sp_swarm_key key;
    uint8_t nonces[MAX_NONCES][SP_AEAD_NONCE_BYTES]; /* of the unreadable values counted (a ring) */
    int nnonces;
    int round_pending;      /* gets of the current round not finished */
    int round_started;      /* rounds started so far */
    int round_done;         /* the value of round_started when a round last finished */
    int stop;
    int refresh_now;
    pthread_t thread;
    int thread_started;
};

/* ---------------------------------------------------------------------------------------------- */
/* the table */

static int find(const sp_view *v, const char *id)
{
    for (int i = 0; i < v->nrecs; i++)
        if (!strcmp(v->recs[i].id, id))
            return i;
    return -1;
}

/* The record of another server at r's address (a ws port: JOINING records may have none yet), or -1. */
static int find_addr(const sp_view *v, const sp_server_record *r)
{
    for (int i = 0; r->port > 0 && i < v->nrecs; i++)
        if (v->recs[i].port == r->port && !strcmp(v->recs[i].host, r->host) && strcmp(v->recs[i].id, r->id))
            return i;
    return -1;
}

/* Record i was superseded: its id is refused from now on, until its records would be stale. */
static void bury(sp_view *v, int i, double now)
{
    tomb *t = &v->tombs[v->ntombs++ % MAX_TOMBS];
    snprintf(t->id, sizeof t->id, "%s", v->recs[i].id);
    t->until = now + 3 * v->recs[i].period;
}

static int buried(const sp_view *v, const char *id, double now)
{
    int n = v->ntombs < MAX_TOMBS ? v->ntombs : MAX_TOMBS;
    for (int k = 0; k < n; k++)
        if (v->tombs[k].until >= now && !strcmp(v->tombs[k].id, id))
            return 1;
    return 0;
}

static void remove_at(sp_view *v, int i)
{
    memmove(&v->recs[i], &v->recs[i + 1], (size_t)(v->nrecs - i - 1) * sizeof *v->recs);
    v->nrecs--;
}

static int insert(sp_view *v, const sp_server_record *r)
{
    if (v->nrecs == v->caprecs) {
        int cap = v->caprecs ? 2 * v->caprecs : 16;
        sp_server_record *n = realloc(v->recs, (size_t)cap * sizeof *n);
        if (!n)
            return -1;
        v->recs = n;
        v->caprecs = cap;
    }
    int i = 0;
    while (i < v->nrecs && strcmp(v->recs[i].id, r->id) < 0)
        i++;
    memmove(&v->recs[i + 1], &v->recs[i], (size_t)(v->nrecs - i) * sizeof *v->recs);
    v->recs[i] = *r;
    v->nrecs++;
    return i;
}

static void add_change(change *ch, int *n, sp_view_change what, const sp_server_record *r, const sp_server_record *prev)
{
    if (*n >= MAX_CHANGES)
        return;
    ch[*n].what = what;
    ch[*n].r = *r;
    if (prev)
        ch[*n].prev = *prev;
    else
        memset(&ch[*n].prev, 0, sizeof ch[*n].prev);
    (*n)++;
}

static void report(sp_view *v, const change *ch, int n)
{
    for (int i = 0; v->o.on_change && i < n; i++)
        v->o.on_change(v->o.user, ch[i].what, &ch[i].r, ch[i].what == SP_VIEW_NEW ? NULL : &ch[i].prev);
}

static void note_drop(sp_view *v, const char *key, const char *why)
{
    v->stats.dropped++;
    size_t n = (size_t)snprintf(v->stats.last_drop, sizeof v->stats.last_drop, "%.60s: ", key);
    if (n < sizeof v->stats.last_drop)
        snprintf(v->stats.last_drop + n, sizeof v->stats.last_drop - n, "%.190s", why);
}

/* A sealed value this view cannot open (no key, or sealed for another swarm): counted once per sealing (the
 * same sealed record goes under every block key of its server's span). */
static void note_unreadable(sp_view *v, const char *swarm, const uint8_t *nonce, int index)
{
    for (int i = 0; i < v->nnonces && i < MAX_NONCES; i++)
        if (!memcmp(v->nonces[i], nonce, SP_AEAD_NONCE_BYTES))
            return;
    memcpy(v->nonces[v->nnonces++ % MAX_NONCES], nonce, SP_AEAD_NONCE_BYTES);
    if (index)
        v->stats.unreadable_index++;
    else
        v->stats.unreadable++;
    snprintf(v->stats.unreadable_swarm, sizeof v->stats.unreadable_swarm, "%s", swarm);
}

/* The JSON of a value into *data: an open swarm's values are the JSON itself, a private swarm's are sealed
 * (record.h) and opened into buf. -1 when this view cannot use the value (counted, unless it expired). */
static int open_value(sp_view *v, const char *key, int index, const uint8_t **data, size_t *len, char *buf, size_t cap,
                      int expired)
{
    char swarm[2 * SP_SWARM_ID_BYTES + 1];
    uint8_t nonce[SP_AEAD_NONCE_BYTES];
    int sealed = sp_record_is_sealed(*data, *len, swarm, nonce);
    sp_err err = {0};
    if (!sealed && !v->has_key)
        return 0;
    if (sealed && v->has_key && !sp_record_unseal(*data, *len, &v->key, buf, cap, len, &err)) {
        *data = (const uint8_t *)buf;
        return 0;
    }
    if (expired)
        return -1;
    if (!sealed)
        note_drop(v, key, "not sealed (a record of an open swarm, not of this private one)");
    else if (!v->has_key || strcmp(swarm, v->key.id_hex))
        note_unreadable(v, swarm, nonce, index);
    else
        note_drop(v, key, err.msg);
    return -1;
}

static void take_record(sp_view *v, const char *key, int block, const uint8_t *data, size_t len, int expired,
                        change *ch, int *nch)
{
    sp_server_record r;
    sp_err err = {0};
    char plain[SP_RECORD_MAX + 2];
    if (open_value(v, key, 0, &data, &len, plain, sizeof plain, expired))
        return;
    sp_record_expect x = {.model = v->model, .config_hash = v->o.config_hash, .num_blocks = v->o.num_blocks,
                          .block = block, .now = sp_wall_s()};
    if (sp_record_decode(&r, data, len, &x, &err)) {
        if (!expired)
            note_drop(v, key, err.msg);
        return;
    }
    int i = find(v, r.id);
    if (expired) { /* only the value we hold expiring means the server is gone */
        if (i >= 0 && v->recs[i].timestamp == r.timestamp) {
            add_change(ch, nch, SP_VIEW_GONE, &v->recs[i], &v->recs[i]);
            remove_at(v, i);
        }
        return;
    }
    if (sp_record_is_stale(&r, x.now) || (i >= 0 && v->recs[i].timestamp >= r.timestamp))
        return;
    if (buried(v, r.id, x.now)) {
        v->stats.superseded++;
        return;
    }
    /* one server per address: the newest life of a restarted server supersedes the records of its earlier
     * ones (their processes are gone; the address now answers as the new one) */
    for (int j; (j = find_addr(v, &r)) >= 0;) {
        if (v->recs[j].timestamp >= r.timestamp) {
            v->stats.superseded++;
            return;
        }
        add_change(ch, nch, SP_VIEW_GONE, &v->recs[j], &r);
        bury(v, j, x.now);
        remove_at(v, j);
        v->stats.superseded++;
        i = find(v, r.id);
    }
    v->stats.accepted++;
    if (i >= 0) {
        sp_server_record prev = v->recs[i];
        v->recs[i] = r;
        add_change(ch, nch, SP_VIEW_CHANGED, &r, &prev);
    } else if (insert(v, &r) >= 0) {
        add_change(ch, nch, SP_VIEW_NEW, &r, NULL);
    }
}

static void take_model(sp_view *v, const uint8_t *data, size_t len, int expired)
{
    sp_model_record m;
    sp_err err = {0};
    char plain[SP_RECORD_MAX + 2];
    if (expired)
        return; /* model entries go when stale */
    if (open_value(v, SP_MODELS_KEY, 1, &data, &len, plain, sizeof plain, 0))
        return;
    if (sp_model_record_decode(&m, data, len, sp_wall_s(), &err)) {
        note_drop(v, SP_MODELS_KEY, err.msg);
        return;
    }
    for (int i = 0; i < v->nmodels; i++)
        if (!strcmp(v->models[i].model, m.model)) {
            if (m.timestamp > v->models[i].timestamp)
                v->models[i] = m;
            return;
        }
    if (v->nmodels == v->capmodels) {
        int cap = v->capmodels ? 2 * v->capmodels : 8;
        sp_model_record *n = realloc(v->models, (size_t)cap * sizeof *n);
        if (!n)
            return;
        v->models = n;
        v->capmodels = cap;
    }
    v->models[v->nmodels++] = m;
}

/* The block index of "<model>.<i>" for our model, or -1. */
static int key_block(const sp_view *v, const char *key)
{
    size_t n = strlen(v->model);
    if (!v->model[0] || strncmp(key, v->model, n) || key[n] != '.')
        return -1;
    char *end;
    errno = 0;
    long b = strtol(key + n + 1, &end, 10);
    if (errno || *end || end == key + n + 1 || b < 0 || b >= v->o.num_blocks)
        return -1;
    return (int)b;
}

void sp_view_on_value(sp_view *v, const char *key, const uint8_t *data, size_t len, int expired)
{
    change ch[MAX_CHANGES];
    int nch = 0;
    pthread_mutex_lock(&v->lock);
    if (!strcmp(key, SP_MODELS_KEY)) {
        take_model(v, data, len, expired);
    } else {
        int block = key_block(v, key);
        if (block >= 0)
            take_record(v, key, block, data, len, expired, ch, &nch);
    }
    pthread_mutex_unlock(&v->lock);
    report(v, ch, nch);
}

/* ---------------------------------------------------------------------------------------------- */
/* lookups and sweeping */

void sp_view_on_get_done(sp_view *v, const char *key, int ok)
{
    (void)ok;
    pthread_mutex_lock(&v->lock);
    if ((key_block(v, key) >= 0 || !strcmp(key, SP_MODELS_KEY)) && v->round_pending > 0 && --v->round_pending == 0) {
        v->stats.rounds++;
        v->round_done = v->round_started;
        pthread_cond_broadcast(&v->cond);
    }
    pthread_mutex_unlock(&v->lock);
}

static void start_round(sp_view *v)
{
    char key[SP_MODEL_PREFIX_MAX + 16];
    int L = v->model[0] ? v->o.num_blocks : 0;
    pthread_mutex_lock(&v->lock);
    v->round_pending = L + 1;
    v->round_started++;
    pthread_mutex_unlock(&v->lock);
    sp_dht_get(v->dht, SP_MODELS_KEY);
    for (int i = 0; i < L; i++) {
        sp_block_key(v->model, i, key, sizeof key);
        sp_dht_get(v->dht, key);
    }
}

static void sweep(sp_view *v)
{
    change ch[MAX_CHANGES];
    int nch = 0;
    double now = sp_wall_s();
    pthread_mutex_lock(&v->lock);
    for (int i = v->nrecs - 1; i >= 0; i--)
        if (sp_record_is_stale(&v->recs[i], now)) {
            add_change(ch, &nch, SP_VIEW_GONE, &v->recs[i], &v->recs[i]);
            remove_at(v, i);
        }
    for (int i = v->nmodels - 1; i >= 0; i--)
        if (v->models[i].timestamp + 3 * v->models[i].period < now) {
            v->models[i] = v->models[v->nmodels - 1];
            v->nmodels--;
        }
    pthread_mutex_unlock(&v->lock);
    report(v, ch, nch);
}

static void *view_main(void *arg)
{
    sp_view *v = arg;
    double next = sp_now_s() + v->o.refresh_s;
    pthread_mutex_lock(&v->lock);
    while (!v->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 250 * 1000000L; /* sweep four times a second: a stale record goes within 250 ms */
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&v->cond, &v->lock, &ts);
        if (v->stop)
            break;
        int refresh = v->refresh_now || sp_now_s() >= next;
        v->refresh_now = 0;
        pthread_mutex_unlock(&v->lock);
        if (refresh) {
            start_round(v);
            next = sp_now_s() + v->o.refresh_s;
        }
        sweep(v);
        pthread_mutex_lock(&v->lock);
    }
    pthread_mutex_unlock(&v->lock);
    return NULL;
}

void sp_view_refresh(sp_view *v)
{
    pthread_mutex_lock(&v->lock);
    v->refresh_now = 1;
    pthread_cond_broadcast(&v->cond);
    pthread_mutex_unlock(&v->lock);
}

int sp_view_wait_round(sp_view *v, int timeout_ms)
{
    double deadline = sp_now_s() + timeout_ms / 1000.0;
    pthread_mutex_lock(&v->lock);
    int s0 = v->round_started; /* wait for a round started after this */
    v->refresh_now = 1;
    pthread_cond_broadcast(&v->cond);
    while (v->round_done <= s0 && !v->stop) {
        double left = deadline - sp_now_s();
        if (left <= 0)
            break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long ns = ts.tv_nsec + (long)((left < 0.2 ? left : 0.2) * 1e9);
        ts.tv_sec += ns / 1000000000L;
        ts.tv_nsec = ns % 1000000000L;
        pthread_cond_timedwait(&v->cond, &v->lock, &ts);
    }
    int ok = v->round_done > s0;
    pthread_mutex_unlock(&v->lock);
    return ok ? 0 : -1;
}

/* ---------------------------------------------------------------------------------------------- */
/* life cycle and reading */

sp_status sp_view_new(sp_view **out, sp_dht *dht, const sp_view_opts *o, sp_err *err)
{
    *out = NULL;
    if (o->model && (o->num_blocks <= 0 || strlen(o->model) >= SP_MODEL_PREFIX_MAX))
        return sp_errf(err, SP_ERR_ARG, "view: model '%s' with %d blocks", o->model, o->num_blocks);
    sp_view *v = calloc(1, sizeof *v);
    if (!v)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    v->dht = dht;
    v->o = *o;
    if (o->key) {
        v->key = *o->key;
        v->has_key = 1;
    }
    v->o.key = NULL;
    if (v->o.refresh_s <= 0)
        v->o.refresh_s = 30;
    snprintf(v->model, sizeof v->model, "%s", o->model ? o->model : "");
    v->o.model = v->model;
    pthread_mutex_init(&v->lock, NULL);
    pthread_cond_init(&v->cond, NULL);
    char key[SP_MODEL_PREFIX_MAX + 16];
    sp_dht_listen(dht, SP_MODELS_KEY);
    for (int i = 0; v->model[0] && i < o->num_blocks; i++) {
        sp_block_key(v->model, i, key, sizeof key);
        sp_dht_listen(dht, key);
    }
    start_round(v);
    if (pthread_create(&v->thread, NULL, view_main, v)) {
        sp_view_free(v);
        return sp_errf(err, SP_ERR_IO, "view: cannot start its thread");
    }
    v->thread_started = 1;
    *out = v;
    return SP_OK;
}

void sp_view_free(sp_view *v)
{
    if (!v)
        return;
    pthread_mutex_lock(&v->lock);
    v->stop = 1;
    pthread_cond_broadcast(&v->cond);
    pthread_mutex_unlock(&v->lock);
    if (v->thread_started)
        pthread_join(v->thread, NULL);
    pthread_mutex_destroy(&v->lock);
    pthread_cond_destroy(&v->cond);
    free(v->recs);
    free(v->models);
    free(v);
}

int sp_view_snapshot(sp_view *v, sp_server_record **out)
{
    double now = sp_wall_s();
    pthread_mutex_lock(&v->lock);
    sp_server_record *a = v->nrecs ? malloc((size_t)v->nrecs * sizeof *a) : NULL;
    int n = 0;
    for (int i = 0; a && i < v->nrecs; i++)
        if (!sp_record_is_stale(&v->recs[i], now))
            a[n++] = v->recs[i];
    pthread_mutex_unlock(&v->lock);
    *out = a;
    return n;
}

int sp_view_get(sp_view *v, const char *id, sp_server_record *out)
{
    pthread_mutex_lock(&v->lock);
    int i = find(v, id);
    if (i >= 0)
        *out = v->recs[i];
    pthread_mutex_unlock(&v->lock);
    return i >= 0;
}

static int model_cmp(const void *a, const void *b)
{
    return strcmp(((const sp_model_record *)a)->model, ((const sp_model_record *)b)->model);
}

int sp_view_models(sp_view *v, sp_model_record **out)
{
    pthread_mutex_lock(&v->lock);
    int n = v->nmodels;
    sp_model_record *a = n ? malloc((size_t)n * sizeof *a) : NULL;
    if (a)
        memcpy(a, v->models, (size_t)n * sizeof *a);
    pthread_mutex_unlock(&v->lock);
    if (a)
        qsort(a, (size_t)n, sizeof *a, model_cmp);
    *out = a;
    return a ? n : 0;
}

void sp_view_stats_get(sp_view *v, sp_view_stats *s)
{
    pthread_mutex_lock(&v->lock);
    *s = v->stats;
    pthread_mutex_unlock(&v->lock);
}

/* ---------------------------------------------------------------------------------------------- */
/* the slot */

void sp_view_slot_init(sp_view_slot *s)
{
    pthread_mutex_init(&s->lock, NULL);
    s->view = NULL;
}

void sp_view_slot_destroy(sp_view_slot *s)
{
    sp_view_free(sp_view_slot_swap(s, NULL));
    pthread_mutex_destroy(&s->lock);
}

sp_view *sp_view_slot_swap(sp_view_slot *s, sp_view *v)
{
    pthread_mutex_lock(&s->lock);
    sp_view *old = s->view;
    s->view = v;
    pthread_mutex_unlock(&s->lock);
    return old;
}

void sp_view_slot_on_value(void *slot, const char *key, const uint8_t *data, size_t len, int expired)
{
    sp_view_slot *s = slot;
    pthread_mutex_lock(&s->lock);
    if (s->view)
        sp_view_on_value(s->view, key, data, len, expired);
    pthread_mutex_unlock(&s->lock);
}

void sp_view_slot_on_get_done(void *slot, const char *key, int ok)
{
    sp_view_slot *s = slot;
    pthread_mutex_lock(&s->lock);
    if (s->view)
        sp_view_on_get_done(s->view, key, ok);
    pthread_mutex_unlock(&s->lock);
}

void sp_view_slot_stats(sp_view_slot *s, sp_view_stats *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&s->lock);
    if (s->view)
        sp_view_stats_get(s->view, out);
    pthread_mutex_unlock(&s->lock);
}

int sp_view_slot_models(sp_view_slot *s, sp_model_record **out)
{
    *out = NULL;
    pthread_mutex_lock(&s->lock);
    int n = s->view ? sp_view_models(s->view, out) : 0;
    pthread_mutex_unlock(&s->lock);
    return n;
}
