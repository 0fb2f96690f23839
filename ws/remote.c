/* remote.c - a request/reply connection to one server. Calls from several threads are in flight at once (a
 * client's concurrent sessions, which the server may batch), and several of one thread's (sp_remote_send, then
 * sp_remote_wait: a server's pushes of a pass): each registers its reply's waiter and sends under the lock, then waits
 * for the reply with its request id; one waiting call at a time reads the connection and hands the others' replies
 * over. */
#include "remote.h"
#include "trace.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "timeutil.h"
#include "log.h"
#include "transport.h"
#include "version.h"

static sp_log_limit g_bulk_log;

/* A call waiting for its reply. */
typedef struct waiter {
    uint64_t id;
    int done;       /* rep holds the reply */
    sp_reply *rep;
    struct waiter *next;
} waiter;

struct sp_remote {
    sp_ws_client *c;
    char host[256];
    int port;
    pthread_mutex_t lock; /* sends (one at a time: the bulk socket is written by the sender), ids, the waiters */
    pthread_cond_t cond;  /* a reply handed over, or the reader's place free */
    int reading;          /* a waiting call reads the connection for all */
    waiter *waiting;
    waiter *spare;        /* waiters of calls that ended, for the next calls (no allocation a call) */
    uint64_t next_id;
    sp_proto_limits limits;
    sp_remote_info info;
    const int *cancel;    /* sp_remote_set_cancel */
    const int *abort;     /* the call in progress's own (sp_remote_call_abortable) */
};

void sp_remote_set_cancel(sp_remote *r, const int *flag) { r->cancel = flag; }

static int cancelled(const sp_remote *r)
{
    return (r->cancel && __atomic_load_n(r->cancel, __ATOMIC_RELAXED)) ||
           (r->abort && __atomic_load_n(r->abort, __ATOMIC_RELAXED));
}

/* sp_ws_client_recv, in slices of 100 ms when the call can be cancelled. */
static sp_status recv_some(sp_remote *r, sp_buf *b, int timeout_ms, sp_err *err)
{
    if (!r->cancel && !r->abort)
        return sp_ws_client_recv(r->c, b, timeout_ms, err);
    double end = timeout_ms < 0 ? 0 : sp_now_s() + timeout_ms / 1e3;
    for (;;) {
        if (cancelled(r))
            return sp_errf(err, SP_ERR_CANCELLED, "cancelled while waiting for %s", r->host);
        int slice = 100;
        if (timeout_ms >= 0) {
            double left = end - sp_now_s();
            if (left <= 0) { /* a last look; a timeout names the whole wait, not this slice */
                sp_status st = sp_ws_client_recv(r->c, b, 0, err);
                if (st == SP_ERR_TIMEOUT)
                    sp_errf(err, st, "no reply from %s:%d within %d ms", r->host, r->port, timeout_ms);
                return st;
            }
            slice = left < 0.1 ? (int)(left * 1e3) + 1 : 100;
        }
        sp_status st = sp_ws_client_recv(r->c, b, slice, err);
        if (st != SP_ERR_TIMEOUT)
            return st;
    }
}

void sp_reply_clear(sp_reply *rep)
{
    sp_msg_clear(&rep->msg);
    sp_buf_free(&rep->buf);
    memset(rep, 0, sizeof *rep);
}

const char *sp_reply_error_code(const sp_reply *rep)
{
    return rep->msg.type == SP_MSG_ERROR && rep->error_code[0] ? rep->error_code : NULL;
}

/* Maps an ERROR reply to a status whose message carries the server's code and text (and keeps the code in rep). */
static sp_status error_status(sp_reply *rep, sp_err *err)
{
    sp_error_reply e;
    int ok = sp_error_reply_decode(&rep->msg, &e, NULL) == SP_OK;
    snprintf(rep->error_code, sizeof rep->error_code, "%s", ok ? e.code : "");
    const char *code = sp_reply_error_code(rep), *msg = ok ? e.message : NULL;
    sp_status st = SP_ERR_ARG;
    if (code && !strcmp(code, "out_of_cache"))
        st = SP_ERR_RANGE;
    else if (code && !strcmp(code, "version"))
        st = SP_ERR_UNSUPPORTED;
    else if (code && (!strcmp(code, "internal") || !strcmp(code, "timeout")))
        st = SP_ERR_IO;
    else if (code && !strcmp(code, "overloaded"))
        st = SP_ERR_BUSY;
    return sp_errf(err, st, "%s: %s", code ? code : "error", msg && *msg ? msg : "(no message)");
}

/* The waiter of request id, or NULL; lock held. */
static waiter *waiter_of(sp_remote *r, uint64_t id)
{
    waiter *w = r->waiting;
    while (w && w->id != id)
        w = w->next;
    return w;
}

/* A message read (b, decoded as m) to its call; lock held. An ERROR addressed to no request (the server's last word,
 * "shutdown") answers every waiting call, a copy each; a reply nobody waits for (a call that gave up) is dropped. */
static void hand_over(sp_remote *r, sp_buf *b, sp_msg *m)
{
    for (waiter *w = r->waiting; w && m->type == SP_MSG_ERROR && m->request_id == 0; w = w->next) {
        if (w->done)
            continue;
        sp_buf c = {0};
        if (sp_buf_append(&c, b->data, b->len, NULL) == SP_OK &&
            sp_msg_decode(&w->rep->msg, c.data, c.len, &r->limits, NULL) == SP_OK) {
            w->rep->buf = c;
            w->done = 1;
        } else {
            sp_buf_free(&c);
        }
    }
    waiter *w = m->request_id ? waiter_of(r, m->request_id) : NULL;
    if (w && !w->done) {
        w->rep->buf = *b;
        w->rep->msg = *m;
        w->done = 1;
        memset(b, 0, sizeof *b);
    } else {
        sp_msg_clear(m);
    }
    sp_buf_free(b);
    pthread_cond_broadcast(&r->cond);
}

/* Reads one message for whoever waits for it (the lock let go meanwhile; held again on return); SP_OK when one was
 * handed over, else the read's status. */
static sp_status read_one(sp_remote *r, int timeout_ms, sp_err *err)
{
    r->reading = 1;
    pthread_mutex_unlock(&r->lock);
    sp_buf b = {0};
    sp_msg m;
    sp_status st = recv_some(r, &b, timeout_ms, err);
    SP_TRACE(SP_TR_READ);
    if (!st && (st = sp_msg_decode(&m, b.data, b.len, &r->limits, err)))
        sp_err_prefix(err, "reply from %s: ", r->host);
    pthread_mutex_lock(&r->lock);
    r->reading = 0;
    if (st)
        sp_buf_free(&b);
    else
        hand_over(r, &b, &m);
    pthread_cond_broadcast(&r->cond);
    return st;
}

/* A waiter for request `id`'s reply into rep, linked into r->waiting (lock held), so that a reply read before its
 * call waits is handed over, not dropped. The waiter comes from r->spare (allocated the first time), not from a
 * stack: r->waiting outlives the frame in the compiler's eyes (gcc 13's -Wdangling-pointer), though it is unlinked
 * before the call returns; back to r->spare after (unlist). NULL when out of memory. */
static waiter *enlist(sp_remote *r, uint64_t id, sp_reply *rep)
{
    waiter *w = r->spare;
    if (w)
        r->spare = w->next;
    else if (!(w = malloc(sizeof *w)))
        return NULL;
    *w = (waiter){.id = id, .rep = rep, .next = r->waiting};
    r->waiting = w;
    return w;
}

/* w out of r->waiting, back to r->spare; whether its reply came (lock held). */
static int unlist(sp_remote *r, waiter *w)
{
    for (waiter **p = &r->waiting; *p; p = &(*p)->next)
        if (*p == w) {
            *p = w->next;
            break;
        }
    int done = w->done;
    w->next = r->spare;
    r->spare = w;
    return done;
}

/* Waits (lock held) for the reply of waiter w (enlisted): reading the connection when no other call does, else for
 * the reader to hand it over; w unlisted after. */
static sp_status await_reply(sp_remote *r, waiter *w, int timeout_ms, sp_err *err)
{
    sp_reply *rep = w->rep;
    double end = timeout_ms < 0 ? 0 : sp_now_s() + timeout_ms / 1e3;
    sp_status st = SP_OK;
    while (!w->done && !st) {
        double left = timeout_ms < 0 ? 1e9 : end - sp_now_s();
        if (!r->reading) {
            st = read_one(r, timeout_ms < 0 ? -1 : left > 0 ? (int)(left * 1e3) + 1 : 0, err);
            if (st == SP_ERR_TIMEOUT && !w->done && left > 0) /* (another's reply came first) */
                st = SP_OK;
            if (st == SP_ERR_TIMEOUT && !w->done)
                sp_errf(err, st, "no reply from %s:%d within %d ms", r->host, r->port, timeout_ms);
        } else if (cancelled(r)) {
            st = sp_errf(err, SP_ERR_CANCELLED, "cancelled while waiting for %s", r->host);
        } else if (left <= 0) {
            st = sp_errf(err, SP_ERR_TIMEOUT, "no reply from %s:%d within %d ms", r->host, r->port, timeout_ms);
        } else { /* the reader hands the reply over, or leaves its place */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            long ns = ts.tv_nsec + (left < 0.1 ? (long)(left * 1e9) : 100000000L);
            ts.tv_sec += ns / 1000000000L;
            ts.tv_nsec = ns % 1000000000L;
            pthread_cond_timedwait(&r->cond, &r->lock, &ts);
        }
    }
    if (unlist(r, w))
        return rep->msg.type == SP_MSG_ERROR ? error_status(rep, err) : SP_OK;
    return st;
}

/* The connection is closed: if the server said why before it closed (an ERROR addressed to no request, e.g.
 * "shutdown"), that is the answer. */
static sp_status why_closed(sp_remote *r, sp_reply *rep, sp_status st, sp_err *err)
{
    sp_buf b = {0};
    sp_err e2 = {0};
    while (sp_ws_client_recv(r->c, &b, 0, &e2) == SP_OK) {
        sp_msg m;
        if (sp_msg_decode(&m, b.data, b.len, &r->limits, &e2) == SP_OK) {
            if (m.type == SP_MSG_ERROR && m.request_id == 0) {
                rep->buf = b;
                rep->msg = m;
                return error_status(rep, err);
            }
            sp_msg_clear(&m);
        }
        sp_buf_free(&b);
    }
    return st;
}

sp_status sp_remote_last_word(sp_remote *r, sp_err *err)
{
    if (!r || sp_ws_client_is_open(r->c))
        return SP_OK;
    pthread_mutex_lock(&r->lock);
    sp_reply rep = {0};
    sp_status st = r->reading ? SP_OK : why_closed(r, &rep, SP_OK, err);
    sp_reply_clear(&rep);
    pthread_mutex_unlock(&r->lock);
    return st;
}

/* Sends b (consumed) as request id, its reply's waiter enlisted first (into *wp); lock held. On failure nothing is
 * left enlisted (*wp NULL), rep holds the server's last word if it said one. */
static sp_status send_enlisted(sp_remote *r, sp_buf *b, uint64_t id, sp_reply *rep, waiter **wp, sp_err *err)
{
    memset(rep, 0, sizeof *rep);
    *wp = NULL;
    waiter *w = enlist(r, id, rep);
    if (!w) {
        sp_buf_free(b);
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    }
    sp_status st = sp_ws_client_send(r->c, b, err);
    SP_TRACE(SP_TR_WRITTEN);
    if (st) {
        unlist(r, w);
        memset(rep, 0, sizeof *rep);
        if (st == SP_ERR_CLOSED && !r->reading) /* (a reader takes the last word to the calls waiting) */
            return why_closed(r, rep, st, err);
        return st;
    }
    *wp = w;
    return SP_OK;
}

/* The request in b (built with status st) sent and its reply waited for, with r->lock held; b is consumed. */
static sp_status send_built(sp_remote *r, sp_buf *b, sp_status st, uint64_t id, sp_reply *rep, int timeout_ms,
                            sp_err *err)
{
    if (st) {
        sp_buf_free(b);
        memset(rep, 0, sizeof *rep);
        return st;
    }
    waiter *w;
    st = send_enlisted(r, b, id, rep, &w, err);
    return st ? st : await_reply(r, w, timeout_ms, err);
}

sp_status sp_remote_send(sp_remote *r, sp_msg_type type, const char *meta, const sp_tensor_src *t, int n,
                         sp_reply *rep, uint64_t *id, sp_err *err)
{
    pthread_mutex_lock(&r->lock);
    *id = r->next_id++;
    sp_buf b = {0};
    waiter *w = NULL;
    sp_status st = sp_msg_encode(&b, type, 0, *id, meta, t, n, err);
    if (st) {
        sp_buf_free(&b);
        memset(rep, 0, sizeof *rep);
    } else {
        st = send_enlisted(r, &b, *id, rep, &w, err);
    }
    pthread_mutex_unlock(&r->lock);
    if (st)
        *id = 0;
    return st;
}

sp_status sp_remote_wait(sp_remote *r, uint64_t id, int timeout_ms, sp_err *err)
{
    pthread_mutex_lock(&r->lock);
    waiter *w = id ? waiter_of(r, id) : NULL;
    sp_status st = w ? await_reply(r, w, timeout_ms, err)
                     : sp_errf(err, SP_ERR_ARG, "no request %llu in flight on %s:%d", (unsigned long long)id, r->host,
                               r->port);
    pthread_mutex_unlock(&r->lock);
    return st;
}

sp_status sp_remote_call_abortable(sp_remote *r, sp_msg_type type, const char *meta, const sp_tensor_src *t, int n,
                                   sp_reply *rep, int timeout_ms, const int *abort, sp_err *err)
{
    pthread_mutex_lock(&r->lock);
    uint64_t id = r->next_id++;
    r->abort = abort;
    sp_buf b = {0};
    sp_status st = send_built(r, &b, sp_msg_encode(&b, type, 0, id, meta, t, n, err), id, rep, timeout_ms, err);
    r->abort = NULL;
    pthread_mutex_unlock(&r->lock);
    return st;
}

sp_status sp_remote_call(sp_remote *r, sp_msg_type type, const char *meta, const sp_tensor_src *t, int n,
                         sp_reply *rep, int timeout_ms, sp_err *err)
{
    return sp_remote_call_abortable(r, type, meta, t, n, rep, timeout_ms, NULL, err);
}

sp_status sp_remote_get_info(sp_remote *r, sp_info_reply *out, int timeout_ms, sp_err *err)
{
    sp_reply rep;
    sp_status st = sp_remote_call(r, SP_MSG_INFO, NULL, NULL, 0, &rep, timeout_ms, err);
    if (!st)
        st = sp_info_reply_decode(&rep.msg, out, err);
    sp_reply_clear(&rep);
    return st;
}

sp_status sp_remote_call_raw(sp_remote *r, const uint8_t *bytes, size_t len, sp_reply *rep, int timeout_ms, sp_err *err)
{
    pthread_mutex_lock(&r->lock);
    sp_buf b = {0};
    sp_status st = sp_buf_append(&b, bytes, len, err);
    uint64_t id = 0;
    for (int i = 7; len >= 24 && i >= 0; i--)
        id = id << 8 | bytes[16 + i];
    st = send_built(r, &b, st, id, rep, timeout_ms, err);
    pthread_mutex_unlock(&r->lock);
    return st;
}

/* What the server said in its HELLO reply, into r->info. */
static void keep_hello(sp_remote *r, const sp_hello_reply *h)
{
    const char *sp = strrchr(h->server, ' '); /* "sepal-server 0.1.0" */
    snprintf(r->info.model, sizeof r->info.model, "%s", h->model);
    snprintf(r->info.version, sizeof r->info.version, "%s", h->version);
    snprintf(r->info.dtype, sizeof r->info.dtype, "%s", h->dtype);
    snprintf(r->info.server_version, sizeof r->info.server_version, "%s", sp ? sp + 1 : "");
    snprintf(r->info.id, sizeof r->info.id, "%s", h->id);
    r->info.num_blocks = h->blocks;
    r->info.config_hash = h->config;
    r->info.start = h->start;
    r->info.end = h->end;
    r->info.dht_port = h->dht_port;
    snprintf(r->info.addr, sizeof r->info.addr, "%s", h->addr);
    r->info.caps = h->caps;
}

static sp_status hello(sp_remote *r, int no_bulk, int port, int timeout_ms, sp_err *err)
{
    sp_reply rep;
    sp_hello_req q = {.version = SP_PROTO_VERSION, .client = "sepal " SEPAL_VERSION};
    char meta[256];
    sp_hello_reply h;
    sp_status st = sp_hello_req_encode(&q, meta, sizeof meta, err);
    if (!st)
        st = sp_remote_call(r, SP_MSG_HELLO, meta, NULL, 0, &rep, timeout_ms, err);
    else
        memset(&rep, 0, sizeof rep);
    if (!st)
        st = sp_hello_reply_decode(&rep.msg, &h, err);
    if (st) {
        sp_reply_clear(&rep);
        sp_err_prefix(err, "%s:%d: HELLO: ", r->host, port);
        return st;
    }
    keep_hello(r, &h);
    if (!no_bulk && h.bulk_port > 0 && h.bulk_token) {
        sp_err berr = {0};
        sp_status bst = sp_ws_client_attach_bulk(r->c, h.bulk_port, h.bulk_token, timeout_ms, &berr);
        if (bst && sp_ws_client_is_open(r->c)) /* slower, but served */
            sp_log_limited(&g_bulk_log, SP_LOG_WARN, "%s:%d: no bulk channel (%s); using the websocket alone",
                           r->host, port, berr.msg);
        else if (bst)
            st = sp_errf(err, bst, "%s", berr.msg);
    }
    sp_reply_clear(&rep);
    return st;
}

sp_status sp_remote_connect(sp_remote **out, const char *host, int port, int no_bulk, int timeout_ms, sp_err *err)
{
    sp_remote_opts o = {.no_bulk = no_bulk};
    return sp_remote_connect_opts(out, host, port, &o, timeout_ms, err);
}

int sp_remote_is_open(const sp_remote *r) { return r && sp_ws_client_is_open(r->c); }

sp_status sp_remote_connect_opts(sp_remote **out, const char *host, int port, const sp_remote_opts *ro, int timeout_ms,
                                 sp_err *err)
{
    int no_bulk = ro && ro->no_bulk;
    *out = NULL;
    sp_remote *r = calloc(1, sizeof *r);
    if (!r)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    snprintf(r->host, sizeof r->host, "%s", host);
    r->port = port;
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->cond, NULL);
    r->next_id = 1;
    r->limits = sp_proto_default_limits();
    sp_transport_opts o;
    sp_transport_opts_default(&o);
    o.bulk_threshold = 1; /* once attached, every request goes out over the bulk socket from this thread, */
    o.direct_recv = 1;    /* and replies are read on it by this thread: no hand-offs (calls are serialised) */
    o.key = ro ? ro->key : NULL;
    o.source = ro ? ro->source : NULL;
    sp_status st = sp_ws_client_connect(&r->c, host, port, &o, timeout_ms, err);
    if (!st)
        st = hello(r, no_bulk, port, timeout_ms, err);
    if (st) {
        sp_remote_close(r);
        return st;
    }
    *out = r;
    return SP_OK;
}

const sp_remote_info *sp_remote_hello(const sp_remote *r) { return &r->info; }

_Static_assert(SP_REMOTE_RATE_MIN == SP_RX_PACE_MIN, "remote.h's bound is the transport's");

double sp_remote_rx_mbit(sp_remote *r, uint64_t *seq) { return sp_ws_client_rx_mbit(r->c, seq); }

void sp_remote_close(sp_remote *r)
{
    if (!r)
        return;
    if (r->c)
        sp_ws_client_close(r->c);
    while (r->spare) {
        waiter *w = r->spare;
        r->spare = w->next;
        free(w);
    }
    pthread_mutex_destroy(&r->lock);
    pthread_cond_destroy(&r->cond);
    free(r);
}

void sp_remote_describe_port(const char *host, int port, const sp_swarm_key *key, int timeout_ms, char *why,
                             size_t cap)
{
    sp_remote *r = NULL;
    sp_err e = {0};
    sp_remote_opts ro = {.no_bulk = 1, .key = key};
    if (!sp_remote_connect_opts(&r, host, port, &ro, timeout_ms, &e)) {
        const sp_remote_info *i = sp_remote_hello(r);
        if (i->dht_port > 0)
            snprintf(why, cap, "%s:%d is the websocket port of a sepal-server (blocks %d:%d of %s); its DHT node is "
                     "%s:%d: use --initial-peers %s:%d", host, port, i->start, i->end, i->model, host, i->dht_port,
                     host, i->dht_port);
        else
            snprintf(why, cap, "%s:%d is the websocket port of a sepal-server that runs no DHT node (it was started "
                     "without --new-swarm or --initial-peers)", host, port);
        sp_remote_close(r);
    } else if (strstr(e.msg, "unauthorized") || strstr(e.msg, "swarm key")) {
        snprintf(why, cap, "%s:%d is the websocket port of a sepal-server, not a DHT node (and it refused this "
                 "connection: %.200s)", host, port, e.msg);
    } else {
        snprintf(why, cap, "%s:%d does not answer as a DHT node of a sepal swarm (no reply to a DHT ping; a server "
                 "prints its DHT address on its serving line: \"DHT HOST:PORT\")", host, port);
    }
}
