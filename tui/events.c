/* events.c - the UI's events, the bounded queue between the producers and the UI thread, and the events as
 * JSON lines for --record-events / --replay-events. */
#include "events.h"

#include "cellbuf.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

static const char *const KIND_NAMES[TE_NKINDS] = {
    "log", "out", "swarm", "app", "route", "hops", "retry", "gen_begin", "gen_text", "gen_end", "train_begin",
    "train_step", "train_eval", "train_end", "progress", "progress_end", "cmd_begin", "cmd_end", "quit", "ready",
    "plot", "serve",
};

const char *tui_ev_kind_name(tui_ev_kind k) { return k < TE_NKINDS ? KIND_NAMES[k] : "?"; }

tui_ev *tui_ev_new(tui_ev_kind kind)
{
    tui_ev *e = calloc(1, sizeof *e);
    if (e)
        e->kind = kind;
    return e;
}

void tui_swarm_free(tui_swarm *s)
{
    if (!s)
        return;
    free(s->s);
    free(s);
}

tui_swarm *tui_swarm_dup(const tui_swarm *s)
{
    tui_swarm *d = malloc(sizeof *d);
    if (!d)
        return NULL;
    *d = *s;
    d->s = s->n ? malloc((size_t)s->n * sizeof *d->s) : NULL;
    if (s->n && !d->s) {
        free(d);
        return NULL;
    }
    if (s->n)
        memcpy(d->s, s->s, (size_t)s->n * sizeof *d->s);
    return d;
}

static int same_num(double a, double b) { return a == b || (isnan(a) && isnan(b)); }

static int same_server(const tui_server *a, const tui_server *b)
{
    return a->idx == b->idx && !strcmp(a->id, b->id) && !strcmp(a->name, b->name) && !strcmp(a->host, b->host) &&
           a->port == b->port && a->start == b->start && a->end == b->end && a->state == b->state &&
           a->banned == b->banned && a->busy == b->busy && a->local == b->local && same_num(a->tput, b->tput) &&
           same_num(a->inf_rps, b->inf_rps) && same_num(a->fwd_rps, b->fwd_rps) && same_num(a->net_rps, b->net_rps) &&
           !strcmp(a->prec, b->prec) && a->cache == b->cache && a->npings == b->npings &&
           same_num(a->best_ping, b->best_ping) && same_num(a->rtt, b->rtt) && !strcmp(a->version, b->version);
}

int tui_swarm_same(const tui_swarm *a, const tui_swarm *b)
{
    if (!a || !b)
        return a == b;
    if (a->n != b->n || a->nblocks != b->nblocks || strcmp(a->model, b->model))
        return 0;
    for (int i = 0; i < a->n; i++)
        if (!same_server(&a->s[i], &b->s[i]))
            return 0;
    return 1;
}

void tui_ev_free(tui_ev *e)
{
    if (!e)
        return;
    free(e->text);
    free(e->what);
    free(e->unit);
    tui_swarm_free(e->swarm);
    free(e->hops);
    free(e);
}

void tui_ev_free_list(tui_ev *e)
{
    while (e) {
        tui_ev *next = e->next;
        tui_ev_free(e);
        e = next;
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* the queue */

int tui_queue_init(tui_queue *q, int cap, int with_eventfd)
{
    memset(q, 0, sizeof *q);
    q->cap = cap > 0 ? cap : 1;
    q->efd = -1;
    if (with_eventfd && (q->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
        return -1;
    pthread_mutex_init(&q->lock, NULL);
    return 0;
}

void tui_queue_destroy(tui_queue *q)
{
    tui_ev_free_list(q->head);
    q->head = q->tail = NULL;
    if (q->efd >= 0)
        close(q->efd);
    q->efd = -1;
    pthread_mutex_destroy(&q->lock);
}

static int coalesced(tui_ev_kind k)
{
    return k == TE_SWARM || k == TE_APP || k == TE_HOPS || k == TE_PROGRESS || k == TE_SERVE;
}
static int is_stream(tui_ev_kind k) { return k == TE_OUT || k == TE_GEN_TEXT; }

#define STREAM_MAX (16u << 20) /* bytes of queued stream text beyond which even streams are dropped */

/* A queued event that e replaces (same kind; progress: same task), or NULL. */
static tui_ev *replaced_by(tui_queue *q, const tui_ev *e)
{
    for (tui_ev *p = q->head; p; p = p->next)
        if (p->kind == e->kind &&
            (e->kind != TE_PROGRESS || !strcmp(p->what ? p->what : "", e->what ? e->what : "")))
            return p;
    return NULL;
}

/* Appends e's text to the tail (a piece of the same stream); 0 if it did, -1 out of memory. */
static int merge_stream(tui_ev *tail, const tui_ev *e)
{
    size_t a = tail->text ? strlen(tail->text) : 0, b = e->text ? strlen(e->text) : 0;
    char *t = realloc(tail->text, a + b + 1);
    if (!t)
        return -1;
    memcpy(t + a, e->text ? e->text : "", b + 1);
    tail->text = t;
    tail->n += e->n;
    return 0;
}

/* Under the lock: queues e, merges it into a queued event, or drops it (counted). */
static void push_locked(tui_queue *q, tui_ev *e, int *was_empty)
{
    *was_empty = q->head == NULL;
    tui_ev *old = coalesced(e->kind) ? replaced_by(q, e) : NULL;
    if (old) { /* the newer state takes the older one's place */
        tui_ev *next = old->next;
        tui_ev tmp = *old;
        *old = *e;
        old->next = next;
        *e = tmp;
        e->next = NULL;
        tui_ev_free(e);
        return;
    }
    size_t bytes = is_stream(e->kind) && e->text ? strlen(e->text) : 0;
    if (is_stream(e->kind) && q->tail && q->tail->kind == e->kind && q->stream_bytes + bytes <= STREAM_MAX) {
        if (!merge_stream(q->tail, e)) {
            q->stream_bytes += bytes;
            tui_ev_free(e);
            return;
        }
    }
    int full = e->kind == TE_LOG ? q->len >= q->cap
             : is_stream(e->kind) ? q->stream_bytes + bytes > STREAM_MAX
             : q->len >= 2 * q->cap;
    if (full) {
        q->dropped++;
        tui_ev_free(e);
        return;
    }
    e->next = NULL;
    if (q->tail)
        q->tail->next = e;
    else
        q->head = e;
    q->tail = e;
    q->len++;
    q->stream_bytes += bytes;
}

void tui_queue_push(tui_queue *q, tui_ev *e)
{
    if (!e)
        return;
    int was_empty;
    pthread_mutex_lock(&q->lock);
    push_locked(q, e, &was_empty);
    int wake = was_empty && q->head != NULL;
    if (wake)
        q->wakes++;
    pthread_mutex_unlock(&q->lock);
    if (wake && q->efd >= 0) {
        uint64_t one = 1;
        ssize_t w = write(q->efd, &one, sizeof one);
        (void)w;
    }
}

tui_ev *tui_queue_take(tui_queue *q, long *dropped)
{
    if (q->efd >= 0) { /* first: a push after the take below finds the queue empty and wakes us again */
        uint64_t v;
        while (read(q->efd, &v, sizeof v) < 0 && errno == EINTR)
            ;
    }
    pthread_mutex_lock(&q->lock);
    tui_ev *list = q->head;
    q->head = q->tail = NULL;
    q->len = 0;
    q->stream_bytes = 0;
    if (dropped)
        *dropped = q->dropped;
    q->dropped = 0;
    pthread_mutex_unlock(&q->lock);
    return list;
}

/* ---------------------------------------------------------------------------------------------- */
/* JSON lines */

#define UNREACHABLE_S 1e9 /* an infinite ping in JSON */

static void add_num(cJSON *o, const char *k, double v)
{
    if (isinf(v))
        v = v > 0 ? UNREACHABLE_S : -UNREACHABLE_S;
    if (v != 0 && !isnan(v))
        cJSON_AddNumberToObject(o, k, v);
}

static void add_str(cJSON *o, const char *k, const char *v)
{
    if (v && *v)
        cJSON_AddStringToObject(o, k, v);
}

static cJSON *swarm_json(const tui_swarm *s)
{
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_CreateArray();
    add_str(o, "model", s->model);
    add_num(o, "nblocks", s->nblocks);
    for (int i = 0; i < s->n; i++) {
        const tui_server *v = &s->s[i];
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "idx", v->idx);
        add_str(j, "id", v->id);
        add_str(j, "name", v->name);
        add_str(j, "host", v->host);
        add_num(j, "port", v->port);
        add_num(j, "start", v->start);
        add_num(j, "end", v->end);
        add_num(j, "state", v->state);
        add_num(j, "banned", v->banned);
        add_num(j, "busy", v->busy);
        add_num(j, "local", v->local);
        add_num(j, "tput", v->tput);
        add_num(j, "inf_rps", v->inf_rps);
        add_num(j, "fwd_rps", v->fwd_rps);
        add_num(j, "net_rps", v->net_rps);
        add_str(j, "prec", v->prec);
        cJSON_AddNumberToObject(j, "cache", (double)v->cache);
        add_num(j, "npings", v->npings);
        cJSON_AddNumberToObject(j, "best_ping", v->best_ping);
        cJSON_AddNumberToObject(j, "rtt", isinf(v->rtt) ? UNREACHABLE_S : v->rtt);
        add_str(j, "version", v->version);
        cJSON_AddItemToArray(arr, j);
    }
    cJSON_AddItemToObject(o, "servers", arr);
    return o;
}

char *tui_ev_to_json(const tui_ev *e, double t0)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddNumberToObject(o, "t", round((e->t - t0) * 1e6) / 1e6);
    cJSON_AddStringToObject(o, "k", tui_ev_kind_name(e->kind));
    add_num(o, "level", e->level);
    add_num(o, "i", e->i);
    add_num(o, "n", e->n);
    add_num(o, "epoch", e->epoch);
    add_num(o, "step", e->step);
    add_num(o, "total", e->total);
    add_num(o, "a", e->a);
    add_num(o, "b", e->b);
    add_num(o, "c", e->c);
    if (e->text)
        cJSON_AddStringToObject(o, "text", e->text);
    add_str(o, "what", e->what);
    add_str(o, "unit", e->unit);
    if (e->swarm)
        cJSON_AddItemToObject(o, "swarm", swarm_json(e->swarm));
    if (e->hops) {
        cJSON *arr = cJSON_CreateArray();
        for (int i = 0; i < e->nhops; i++) {
            cJSON *h = cJSON_CreateObject();
            cJSON_AddNumberToObject(h, "server", e->hops[i].server);
            cJSON_AddNumberToObject(h, "start", e->hops[i].start);
            cJSON_AddNumberToObject(h, "end", e->hops[i].end);
            cJSON_AddNumberToObject(h, "latency", e->hops[i].latency);
            cJSON_AddItemToArray(arr, h);
        }
        cJSON_AddItemToObject(o, "hops", arr);
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static double num(const cJSON *o, const char *k, double def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) ? v->valuedouble : def;
}

/* A count field: finite and within int range, else def. */
static int inum(const cJSON *o, const char *k, int def)
{
    double v = num(o, k, def);
    return v >= -2e9 && v <= 2e9 ? (int)v : def;
}

static void str(const cJSON *o, const char *k, char *out, size_t cap)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    snprintf(out, cap, "%s", cJSON_IsString(v) ? v->valuestring : "");
}

static char *dupstr(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? strdup(v->valuestring) : NULL;
}

static tui_swarm *swarm_from(const cJSON *o)
{
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "servers");
    int n = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : 0;
    if (n > 100000)
        return NULL;
    tui_swarm *s = calloc(1, sizeof *s);
    if (!s || (n && !(s->s = calloc((size_t)n, sizeof *s->s)))) {
        free(s);
        return NULL;
    }
    str(o, "model", s->model, sizeof s->model);
    s->nblocks = inum(o, "nblocks", 0);
    if (s->nblocks < 0 || s->nblocks > 100000)
        s->nblocks = 0;
    const cJSON *j;
    cJSON_ArrayForEach(j, arr)
    {
        tui_server *v = &s->s[s->n++];
        v->idx = inum(j, "idx", -1);
        str(j, "id", v->id, sizeof v->id);
        str(j, "name", v->name, sizeof v->name);
        str(j, "host", v->host, sizeof v->host);
        v->port = inum(j, "port", 0);
        v->start = inum(j, "start", 0);
        v->end = inum(j, "end", 0);
        v->state = inum(j, "state", 0);
        if (v->state < 0 || v->state > 3)
            v->state = TUI_ST_OFFLINE;
        v->banned = inum(j, "banned", 0);
        v->busy = inum(j, "busy", 0);
        v->local = inum(j, "local", 0);
        v->tput = num(j, "tput", 0);
        v->inf_rps = num(j, "inf_rps", 0);
        v->fwd_rps = num(j, "fwd_rps", 0);
        v->net_rps = num(j, "net_rps", 0);
        str(j, "prec", v->prec, sizeof v->prec);
        v->cache = (long)num(j, "cache", -1);
        v->npings = inum(j, "npings", 0);
        v->best_ping = num(j, "best_ping", -1);
        v->rtt = num(j, "rtt", -1);
        if (v->rtt >= UNREACHABLE_S)
            v->rtt = INFINITY;
        str(j, "version", v->version, sizeof v->version);
    }
    return s;
}

static int kind_of(const char *name)
{
    for (int k = 0; k < TE_NKINDS; k++)
        if (!strcmp(name, KIND_NAMES[k]))
            return k;
    return -1;
}

tui_ev *tui_ev_from_json(const char *line, char *why, size_t cap)
{
    cJSON *o = cJSON_Parse(line);
    const cJSON *k = o ? cJSON_GetObjectItemCaseSensitive(o, "k") : NULL;
    int kind = cJSON_IsString(k) ? kind_of(k->valuestring) : -1;
    if (kind < 0) {
        snprintf(why, cap, o ? "no known event kind (\"k\")" : "not JSON");
        cJSON_Delete(o);
        return NULL;
    }
    tui_ev *e = tui_ev_new((tui_ev_kind)kind);
    if (!e) {
        cJSON_Delete(o);
        snprintf(why, cap, "out of memory");
        return NULL;
    }
    e->t = num(o, "t", 0);
    e->level = inum(o, "level", 0);
    e->i = inum(o, "i", 0);
    e->n = inum(o, "n", 0);
    e->epoch = inum(o, "epoch", 0);
    e->step = inum(o, "step", 0);
    e->total = inum(o, "total", 0);
    e->a = num(o, "a", 0);
    e->b = num(o, "b", 0);
    e->c = num(o, "c", 0);
    e->text = dupstr(o, "text");
    e->what = dupstr(o, "what");
    e->unit = dupstr(o, "unit");
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(o, "swarm");
    if (cJSON_IsObject(sw))
        e->swarm = swarm_from(sw);
    const cJSON *hops = cJSON_GetObjectItemCaseSensitive(o, "hops"), *h;
    int nh = cJSON_IsArray(hops) ? cJSON_GetArraySize(hops) : 0;
    if (nh > 0 && nh <= 4096 && (e->hops = calloc((size_t)nh, sizeof *e->hops))) {
        cJSON_ArrayForEach(h, hops)
        {
            tui_hop *p = &e->hops[e->nhops++];
            p->server = inum(h, "server", -1);
            p->start = inum(h, "start", 0);
            p->end = inum(h, "end", 0);
            p->latency = num(h, "latency", 0);
        }
    }
    cJSON_Delete(o);
    if ((kind == TE_SWARM && !e->swarm)) {
        snprintf(why, cap, "a swarm event without a valid \"swarm\"");
        tui_ev_free(e);
        return NULL;
    }
    return e;
}
