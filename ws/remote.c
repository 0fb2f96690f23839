/* remote.c - a synchronous request/reply connection to one server. */
#include "remote.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "timeutil.h"
#include "log.h"
#include "transport.h"
#include "version.h"

static sp_log_limit g_bulk_log;

struct sp_remote {
    sp_ws_client *c;
    char host[256];
    int port;
    pthread_mutex_t lock; /* one call at a time */
    uint64_t next_id;
    sp_proto_limits limits;
    sp_remote_info info;
    const int *cancel;    /* sp_remote_set_cancel */
};

void sp_remote_set_cancel(sp_remote *r, const int *flag) { r->cancel = flag; }

static int cancelled(const sp_remote *r) { return r->cancel && __atomic_load_n(r->cancel, __ATOMIC_RELAXED); }

/* sp_ws_client_recv, in slices of 100 ms when the call can be cancelled. */
static sp_status recv_some(sp_remote *r, sp_buf *b, int timeout_ms, sp_err *err)
{
    if (!r->cancel)
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
    return sp_errf(err, st, "%s: %s", code ? code : "error", msg && *msg ? msg : "(no message)");
}

/* Waits for the reply to request `id`; replies to other (abandoned, timed-out) requests are dropped. */
static sp_status wait_reply(sp_remote *r, uint64_t id, sp_reply *rep, int timeout_ms, sp_err *err)
{
    for (;;) {
        sp_buf b = {0};
        sp_status st = recv_some(r, &b, timeout_ms, err);
        if (st)
            return st;
        sp_msg m;
        st = sp_msg_decode(&m, b.data, b.len, &r->limits, err);
        if (st) {
            sp_buf_free(&b);
            return sp_err_prefix(err, "reply from %s: ", r->host);
        }
        if (m.request_id == id || (m.type == SP_MSG_ERROR && m.request_id == 0)) {
            rep->buf = b;
            rep->msg = m;
            return m.type == SP_MSG_ERROR ? error_status(rep, err) : SP_OK;
        }
        sp_msg_clear(&m);
        sp_buf_free(&b);
    }
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
    sp_status st = why_closed(r, &rep, SP_OK, err);
    sp_reply_clear(&rep);
    pthread_mutex_unlock(&r->lock);
    return st;
}

static sp_status send_and_wait(sp_remote *r, sp_buf *b, uint64_t id, sp_reply *rep, int timeout_ms, sp_err *err)
{
    memset(rep, 0, sizeof *rep);
    sp_status st = sp_ws_client_send(r->c, b, err);
    if (st == SP_ERR_CLOSED)
        return why_closed(r, rep, st, err);
    return st ? st : wait_reply(r, id, rep, timeout_ms, err);
}

/* The request in b (built with status st) sent and its reply waited for, with r->lock held; b is consumed. */
static sp_status send_built(sp_remote *r, sp_buf *b, sp_status st, uint64_t id, sp_reply *rep, int timeout_ms,
                            sp_err *err)
{
    if (!st)
        return send_and_wait(r, b, id, rep, timeout_ms, err);
    sp_buf_free(b);
    memset(rep, 0, sizeof *rep);
    return st;
}

sp_status sp_remote_call(sp_remote *r, sp_msg_type type, const char *meta, const sp_tensor_src *t, int n,
                         sp_reply *rep, int timeout_ms, sp_err *err)
{
    pthread_mutex_lock(&r->lock);
    uint64_t id = r->next_id++;
    sp_buf b = {0};
    sp_status st = send_built(r, &b, sp_msg_encode(&b, type, 0, id, meta, t, n, err), id, rep, timeout_ms, err);
    pthread_mutex_unlock(&r->lock);
    return st;
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
    r->next_id = 1;
    r->limits = sp_proto_default_limits();
    sp_transport_opts o;
    sp_transport_opts_default(&o);
    o.bulk_threshold = 1; /* once attached, every request goes out over the bulk socket from this thread, */
    o.direct_recv = 1;    /* and replies are read on it by this thread: no hand-offs (calls are serialised) */
    o.key = ro ? ro->key : NULL;
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

void sp_remote_close(sp_remote *r)
{
    if (!r)
        return;
    if (r->c)
        sp_ws_client_close(r->c);
    pthread_mutex_destroy(&r->lock);
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
