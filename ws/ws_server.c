/* ws_server.c - the server's websocket side (libwebsockets 4.1.6) and the public sp_ws_server API; the bulk
 * channel's thread is in bulk.c, the framing both share in frame.c (see transport_impl.h). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include "log.h"
#include "timeutil.h"
#include "transport_impl.h"

/* ---------------------------------------------------------------------------------------------- */
/* connections */

/* mu held */
static conn *find_conn(sp_ws_server *s, uint64_t id)
{
    for (size_t i = 0; i < s->nconns; i++)
        if (s->conns[i]->id == id)
            return s->conns[i];
    return NULL;
}

/* mu held */
void tp_remove_conn(sp_ws_server *s, conn *c)
{
    for (size_t i = 0; i < s->nconns; i++)
        if (s->conns[i] == c) {
            s->conns[i] = s->conns[--s->nconns];
            return;
        }
}

/* A channel lets go of c. The last one out reports the close and frees it: on_close is called exactly once,
 * after every on_message of the conn (each channel delivers only before it lets go). */
void tp_conn_release(sp_ws_server *s, conn *c, int last)
{
    if (!last)
        return;
    s->on_close(s->user, c->id);
    tp_msgq_clear(&c->txq);
    free(c);
}

/* ---------------------------------------------------------------------------------------------- */
/* the websocket side (service thread) */

static int srv_established(sp_ws_server *s, struct lws *wsi, conn **pss)
{
    conn *c = calloc(1, sizeof *c);
    if (!c)
        return -1;
    c->wsi = wsi;
    c->refs = 1;
    atomic_store(&c->last_ns, sp_now_ns());
    pthread_mutex_lock(&s->mu);
    int ok = !s->stopping && tp_grow((void **)&s->conns, &s->capconns, s->nconns + 1, sizeof *s->conns) == 0;
    if (ok) {
        c->id = ++s->next_id;
        s->conns[s->nconns++] = c;
    }
    pthread_mutex_unlock(&s->mu);
    if (!ok) {
        free(c);
        return -1;
    }
    *pss = c;
    if (s->o.idle_timeout_s > 0)
        lws_set_timer_usecs(wsi, LWS_USEC_PER_SEC);
    return 0;
}

/* LWS_CALLBACK_CLOSED: the ws channel is gone; the bulk socket (if any) goes too. */
static void srv_ws_gone(sp_ws_server *s, conn **pss)
{
    conn *c = *pss;
    if (!c)
        return;
    *pss = NULL;
    /* ws-only state goes first: once our reference is dropped the bulk thread may free c */
    tp_tx_reset(&c->tx);
    tp_rxasm_reset(&c->rx);
    pthread_mutex_lock(&s->mu);
    c->wsi = NULL;
    c->dead = 1;
    tp_msgq_clear(&c->txq);
    int wake = c->bulk != NULL;
    if (c->bulk)
        c->bulk->kill = 1;
    int last = --c->refs == 0;
    if (last)
        tp_remove_conn(s, c);
    pthread_mutex_unlock(&s->mu);
    if (wake)
        tp_wake_bulk(s);
    tp_conn_release(s, c, last);
}

static int srv_receive(sp_ws_server *s, struct lws *wsi, conn *c, const void *in, size_t len)
{
    if (!c)
        return -1;
    if (c->fail.failed)
        return 0;
    if (!lws_frame_is_binary(wsi)) {
        sp_log(SP_LOG_WARN, "transport: conn %llu closed: a text frame", (unsigned long long)c->id);
        return tp_defer_close(wsi, &c->fail, LWS_CLOSE_STATUS_UNACCEPTABLE_OPCODE, "binary messages only");
    }
    sp_buf msg;
    sp_err err = {0};
    int code = 0;
    int r = tp_rxasm_feed(&c->rx, in, len, lws_is_final_fragment(wsi), &s->lim, &msg, &code, &err);
    if (r == RX_BAD) {
        sp_log(SP_LOG_WARN, "transport: conn %llu closed: %s", (unsigned long long)c->id, err.msg);
        sp_msg_header h = {0};
        sp_msg_header_read(c->rx.buf.data, c->rx.buf.len, &h);
        c->fail.reply = 1;
        c->fail.reqid = h.request_id;
        c->fail.errcode = sp_msg_reject_code(c->rx.buf.data, c->rx.buf.len, err.code);
        return tp_defer_close(wsi, &c->fail, code, err.msg);
    }
    atomic_store(&c->last_ns, sp_now_ns());
    if (r == RX_DONE)
        s->on_message(s->user, c->id, &msg);
    return 0;
}

/* After bad input: an ERROR message {"code": errcode, "message": why} for the failed request, unless another
 * message is half sent (its frames cannot be interrupted), then the close frame with the same reason. */
static int srv_fail_writeable(struct lws *wsi, conn *c)
{
    if (c->fail.reply && !c->tx.busy) {
        c->fail.reply = 0;
        sp_buf b = {0};
        if (sp_msg_encode_error(&b, c->fail.reqid, c->fail.errcode, c->fail.why, NULL) == SP_OK) {
            c->tx.cur = b;
            c->tx.off = 0;
            c->tx.busy = 1;
            int r = tp_send_fragment(wsi, &c->tx);
            tp_tx_reset(&c->tx);
            if (r == 1) { /* the close frame follows in the next callback */
                lws_callback_on_writable(wsi);
                return 0;
            }
        } else {
            sp_buf_free(&b);
        }
    }
    return tp_close_ws(wsi, c->fail.code, c->fail.why);
}

/* One fragment per callback, then ask again: lws sends at most one packet per WRITEABLE anyway, and the
 * loop stays responsive to the other connections. */
static int srv_writeable(sp_ws_server *s, struct lws *wsi, conn *c)
{
    if (!c)
        return -1;
    if (c->fail.failed)
        return srv_fail_writeable(wsi, c);
    pthread_mutex_lock(&s->mu);
    int close_req = c->close_req;
    if (!close_req && !c->tx.busy && tp_msgq_pop(&c->txq, &c->tx.cur)) {
        c->tx.busy = 1;
        c->tx.off = 0;
    }
    pthread_mutex_unlock(&s->mu);
    if (close_req)
        return tp_close_ws(wsi, LWS_CLOSE_STATUS_GOINGAWAY, "closed");
    if (!c->tx.busy)
        return 0;
    int r = tp_send_fragment(wsi, &c->tx);
    if (r < 0)
        return -1;
    atomic_store(&c->last_ns, sp_now_ns());
    int more = 1;
    if (r == 1) {
        tp_tx_reset(&c->tx);
        pthread_mutex_lock(&s->mu);
        more = c->txq.head != NULL;
        pthread_mutex_unlock(&s->mu);
    }
    if (more)
        lws_callback_on_writable(wsi);
    return 0;
}

/* LWS_CALLBACK_EVENT_WAIT_CANCELLED: another thread queued output or asked for a close. The wsi list is
 * copied under the lock and lws is called outside it (wsis are freed only on this thread). */
static void srv_wake(sp_ws_server *s)
{
    size_t n = 0;
    pthread_mutex_lock(&s->mu);
    if (tp_grow((void **)&s->wake, &s->capwake, s->nconns, sizeof *s->wake) == 0)
        for (size_t i = 0; i < s->nconns; i++) {
            conn *c = s->conns[i];
            if (c->wsi && (c->close_req || c->txq.head))
                s->wake[n++] = c->wsi;
        }
    pthread_mutex_unlock(&s->mu);
    for (size_t i = 0; i < n; i++)
        lws_callback_on_writable(s->wake[i]);
}

/* Idle check once a second (only armed when idle_timeout_s > 0). */
static int srv_timer(sp_ws_server *s, struct lws *wsi, conn *c)
{
    if (!c)
        return 0;
    uint64_t idle_ns = (uint64_t)s->o.idle_timeout_s * 1000000000ull;
    if (sp_now_ns() - atomic_load(&c->last_ns) > idle_ns) {
        sp_log(SP_LOG_INFO, "transport: conn %llu idle for %d s, closing", (unsigned long long)c->id,
               s->o.idle_timeout_s);
        return tp_close_ws(wsi, LWS_CLOSE_STATUS_GOINGAWAY, "idle");
    }
    lws_set_timer_usecs(wsi, LWS_USEC_PER_SEC);
    return 0;
}

static int srv_ws_cb(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len)
{
    sp_ws_server *s = lws_context_user(lws_get_context(wsi));
    conn **pss = user;
    switch (reason) {
    case LWS_CALLBACK_HTTP_CONFIRM_UPGRADE:
        return tp_confirm_upgrade(wsi);
    case LWS_CALLBACK_ESTABLISHED:
        return srv_established(s, wsi, pss);
    case LWS_CALLBACK_RECEIVE:
        return srv_receive(s, wsi, pss ? *pss : NULL, in, len);
    case LWS_CALLBACK_SERVER_WRITEABLE:
        return srv_writeable(s, wsi, pss ? *pss : NULL);
    case LWS_CALLBACK_TIMER:
        return srv_timer(s, wsi, pss ? *pss : NULL);
    case LWS_CALLBACK_EVENT_WAIT_CANCELLED:
        srv_wake(s);
        return 0;
    case LWS_CALLBACK_CLOSED:
    case LWS_CALLBACK_WSI_DESTROY: /* CLOSED normally came first and cleared *pss */
        if (pss)
            srv_ws_gone(s, pss);
        return 0;
    default:
        return 0;
    }
}

/* The first protocol serves plain HTTP: 404 for everything, and a ws that did not ask for "sepal" (lws
 * binds those to protocol 0) is refused during the handshake. */
static int srv_http_cb(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len)
{
    switch (reason) {
    case LWS_CALLBACK_HTTP_CONFIRM_UPGRADE:
        return tp_confirm_upgrade(wsi);
    case LWS_CALLBACK_HTTP:
        lws_return_http_status(wsi, HTTP_STATUS_NOT_FOUND, NULL);
        return -1;
    case LWS_CALLBACK_FILTER_PROTOCOL_CONNECTION: /* refused before the 101 */
    case LWS_CALLBACK_HTTP_BODY:
    case LWS_CALLBACK_ESTABLISHED:
    case LWS_CALLBACK_RECEIVE:
        return -1;
    default:
        return 0;
    }
}

static void *srv_svc_main(void *arg)
{
    sp_ws_server *s = arg;
    while (!atomic_load(&s->svc_stop))
        if (lws_service(s->ctx, 0) < 0) {
            sp_log(SP_LOG_ERROR, "transport: the lws service loop failed; the server stops serving ws");
            break;
        }
    return NULL;
}

/* ---------------------------------------------------------------------------------------------- */
/* setup and the API */

/* Hardening for 4.1.6 (reliability-anchors §3.4): IPv4 only so the bind address is the one asked for, no
 * extensions, small header limits, handshake/idle timeouts, TCP keepalive. */
static sp_status srv_create_context(sp_ws_server *s, sp_err *err)
{
    s->protocols[0] = (struct lws_protocols){.name = "http", .callback = srv_http_cb};
    s->protocols[1] = (struct lws_protocols){.name = "sepal",
                                             .callback = srv_ws_cb,
                                             .per_session_data_size = sizeof(conn *),
                                             .rx_buffer_size = FRAG_SIZE,
                                             .tx_packet_size = FRAG_SIZE};
    struct lws_context_creation_info info;
    memset(&info, 0, sizeof info);
    info.port = s->o.port;
    info.iface = strcmp(s->host, "0.0.0.0") == 0 ? NULL : s->host;
    info.protocols = s->protocols;
    info.extensions = NULL;
    info.options = LWS_SERVER_OPTION_DISABLE_IPV6 | LWS_SERVER_OPTION_SKIP_SERVER_CANONICAL_NAME;
    info.user = s;
    info.vhost_name = "sepal";
    info.server_string = "sepal";
    info.pt_serv_buf_size = FRAG_SIZE;
    info.max_http_header_data = 1024;
    info.max_http_header_pool = 32;
    info.timeout_secs = 10;
    info.timeout_secs_ah_idle = 10;
    info.ka_time = 60;
    info.ka_probes = 3;
    info.ka_interval = 10;
    s->ctx = lws_create_context(&info);
    if (!s->ctx)
        return sp_errf(err, SP_ERR_IO, "cannot listen on %s:%d (address in use, or not local?)", s->host, s->o.port);
    struct lws_vhost *vh = lws_get_vhost_by_name(s->ctx, "sepal");
    s->port = vh ? lws_get_vhost_listen_port(vh) : -1;
    if (s->port <= 0)
        return sp_errf(err, SP_ERR_IO, "cannot listen on %s:%d", s->host, s->o.port);
    return SP_OK;
}

static sp_status srv_start_threads(sp_ws_server *s, sp_err *err)
{
    if (pthread_create(&s->svc, NULL, srv_svc_main, s))
        return sp_errf(err, SP_ERR_NOMEM, "cannot start the transport thread");
    s->svc_started = 1;
    if (s->listen_fd >= 0) {
        if (pthread_create(&s->bulk, NULL, tp_bulk_main, s))
            return sp_errf(err, SP_ERR_NOMEM, "cannot start the bulk thread");
        s->bulk_started = 1;
    }
    return SP_OK;
}

sp_status sp_ws_server_start(sp_ws_server **out, const sp_transport_opts *o, sp_server_on_message on_message,
                             sp_server_on_close on_close, void *user, sp_err *err)
{
    if (!out || !on_message || !on_close)
        return sp_errf(err, SP_ERR_ARG, "sp_ws_server_start: NULL argument");
    *out = NULL;
    tp_lws_log_init();
    sp_ws_server *s = calloc(1, sizeof *s);
    if (!s)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    tp_resolve_opts(&s->o, o);
    snprintf(s->host, sizeof s->host, "%s", s->o.host);
    s->o.host = s->host;
    s->lim = tp_limits_for(&s->o);
    s->on_message = on_message;
    s->on_close = on_close;
    s->user = user;
    s->listen_fd = s->wake_fd = -1;
    s->bulk_port = -1;
    pthread_mutex_init(&s->mu, NULL);
    sp_status st = SP_OK;
    if (s->o.port < 0 || s->o.port > 65535 || s->o.bulk_port < -1 || s->o.bulk_port > 65535)
        st = sp_errf(err, SP_ERR_ARG, "bad port %d / bulk port %d", s->o.port, s->o.bulk_port);
    if (!st && s->o.bulk_port >= 0) {
        st = tp_bulk_listen(s, err);
        s->wake_fd = st ? -1 : eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (!st && s->wake_fd < 0)
            st = sp_errf(err, SP_ERR_IO, "eventfd: %s", strerror(errno));
    }
    if (!st)
        st = srv_create_context(s, err);
    if (!st)
        st = srv_start_threads(s, err);
    if (st) {
        sp_ws_server_stop(s);
        return st;
    }
    *out = s;
    return SP_OK;
}

int sp_ws_server_port(const sp_ws_server *s) { return s ? s->port : -1; }
int sp_ws_server_bulk_port(const sp_ws_server *s) { return s ? s->bulk_port : -1; }

uint64_t sp_ws_server_bulk_token(sp_ws_server *s, uint64_t id)
{
    uint64_t t = 0;
    if (!s || s->listen_fd < 0)
        return 0;
    while (t == 0)
        if (getrandom(&t, sizeof t, 0) != (ssize_t)sizeof t)
            return 0;
    pthread_mutex_lock(&s->mu);
    conn *c = find_conn(s, id);
    if (c && !c->dead && !c->bulk && !s->stopping)
        c->token = t;
    else
        t = 0;
    pthread_mutex_unlock(&s->mu);
    return t;
}

sp_status sp_ws_server_send(sp_ws_server *s, uint64_t id, sp_buf *msg, sp_err *err)
{
    if (!s || !msg) {
        if (msg)
            sp_buf_free(msg);
        return sp_errf(err, SP_ERR_ARG, "sp_ws_server_send: NULL argument");
    }
    int wake_ws = 0, wake_b = 0, fail = 0;
    pthread_mutex_lock(&s->mu);
    conn *c = s->stopping ? NULL : find_conn(s, id);
    if (!c || c->dead)
        fail = 1;
    else if (c->bulk && msg->len >= s->o.bulk_threshold)
        wake_b = tp_msgq_push(&c->bulk->txq, msg) == 0;
    else
        wake_ws = tp_msgq_push(&c->txq, msg) == 0;
    pthread_mutex_unlock(&s->mu);
    if (fail) {
        sp_buf_free(msg);
        return sp_errf(err, SP_ERR_CLOSED, "connection %llu is closed", (unsigned long long)id);
    }
    if (wake_ws)
        lws_cancel_service(s->ctx);
    else if (wake_b)
        tp_wake_bulk(s);
    else
        return sp_errf(err, SP_ERR_NOMEM, "out of memory queueing a message");
    return SP_OK;
}

void sp_ws_server_close(sp_ws_server *s, uint64_t id)
{
    if (!s)
        return;
    int wake_ws = 0, wake_b = 0;
    pthread_mutex_lock(&s->mu);
    conn *c = s->stopping ? NULL : find_conn(s, id);
    if (c) {
        c->dead = 1;
        if (c->wsi)
            wake_ws = c->close_req = 1;
        if (c->bulk)
            wake_b = c->bulk->kill = 1;
    }
    pthread_mutex_unlock(&s->mu);
    if (wake_ws)
        lws_cancel_service(s->ctx);
    if (wake_b)
        tp_wake_bulk(s);
}

/* Order matters: new sends are refused first; the bulk thread stops before the lws context goes away (it
 * calls lws_cancel_service); destroying the context closes every ws, which reports on_close. */
void sp_ws_server_stop(sp_ws_server *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_mutex_unlock(&s->mu);
    if (s->bulk_started) {
        atomic_store(&s->bulk_stop, 1);
        tp_wake_bulk(s);
        pthread_join(s->bulk, NULL);
    }
    while (s->nsocks)
        tp_bulk_close(s, s->socks[--s->nsocks]);
    if (s->svc_started) {
        atomic_store(&s->svc_stop, 1);
        lws_cancel_service(s->ctx);
        pthread_join(s->svc, NULL);
    }
    if (s->ctx)
        lws_context_destroy(s->ctx);
    /* Nothing should be left; anything that is (a ws lws never reported closed) is reported and freed. */
    while (s->nconns) {
        conn *c = s->conns[--s->nconns];
        tp_tx_reset(&c->tx);
        tp_rxasm_reset(&c->rx);
        tp_conn_release(s, c, 1);
    }
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    if (s->wake_fd >= 0)
        close(s->wake_fd);
    free(s->conns);
    free(s->socks);
    free(s->wake);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

