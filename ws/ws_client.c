/* ws_client.c - one client connection's websocket side (libwebsockets 4.1.6) and the public sp_ws_client
 * API; its bulk socket is in bulk.c, the framing in frame.c (see transport_impl.h). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "timeutil.h"
#include "transport_impl.h"

/* ---------------------------------------------------------------------------------------------- */
/* the websocket side (service thread) */

/* Wakes a direct_recv caller polling the bulk socket (the condvar wakes the others). mu held. */
static void cli_poke_locked(sp_ws_client *c)
{
    if (c->wake_fd >= 0) {
        uint64_t one = 1;
        ssize_t w = write(c->wake_fd, &one, sizeof one);
        (void)w; /* a full counter still wakes the poller */
    }
}

/* The connection is over (either channel): wake waiters, and stop the bulk reader by shutting its socket
 * (closed only in sp_ws_client_close, after the reader is joined). mu held. */
static void cli_closed_locked(sp_ws_client *c, const char *why)
{
    if (c->state != C_CLOSED && why && !c->why[0])
        snprintf(c->why, sizeof c->why, "%.*s", (int)sizeof c->why - 1, why);
    c->state = C_CLOSED;
    /* The server sees the end at once. A direct_recv caller is woken by its eventfd and may still read what
     * arrived before the close (a server's last word: ERROR "shutdown"); a reader thread needs SHUT_RD to wake. */
    if (c->bulk_fd >= 0)
        shutdown(c->bulk_fd, c->wake_fd >= 0 ? SHUT_WR : SHUT_RDWR);
    pthread_cond_broadcast(&c->cv);
    cli_poke_locked(c);
}

/* Asks the service thread to close the ws (from another thread). */
void tp_cli_fail(sp_ws_client *c, const char *why)
{
    pthread_mutex_lock(&c->mu);
    cli_closed_locked(c, why);
    c->close_req = 1;
    pthread_mutex_unlock(&c->mu);
    lws_cancel_service(c->ctx);
}

void tp_cli_queue(sp_ws_client *c, sp_buf *msg)
{
    pthread_mutex_lock(&c->mu);
    if (tp_msgq_push(&c->rxq, msg) == 0) {
        pthread_cond_broadcast(&c->cv);
        cli_poke_locked(c);
    }
    if (!c->rx_full && c->rxq.bytes > c->o.rx_queue_max)
        c->rx_full = 1; /* the ws is not read (cli_flow), the bulk reader waits */
    pthread_mutex_unlock(&c->mu);
}

void tp_cli_taken_locked(sp_ws_client *c)
{
    if (c->rx_full && c->rxq.bytes <= c->o.rx_queue_max / 2) {
        c->rx_full = 0;
        pthread_cond_broadcast(&c->cv);
        lws_cancel_service(c->ctx); /* cli_wake turns reading back on */
    }
}

/* Reading the ws stops while rx_queue_max bytes wait for recv (service thread). */
static void cli_flow(sp_ws_client *c)
{
    pthread_mutex_lock(&c->mu);
    int off = c->rx_full;
    pthread_mutex_unlock(&c->mu);
    if (c->wsi && off != c->rx_off) {
        lws_rx_flow_control(c->wsi, !off);
        c->rx_off = off;
    }
}

static int cli_receive(sp_ws_client *c, struct lws *wsi, const void *in, size_t len)
{
    if (c->fail.failed)
        return 0;
    sp_buf msg;
    sp_err err = {0};
    int code = LWS_CLOSE_STATUS_UNACCEPTABLE_OPCODE;
    int r = RX_BAD;
    size_t used;
    if (!lws_frame_is_binary(wsi))
        sp_errf(&err, SP_ERR_FORMAT, "a text frame (binary messages only)");
    else
        r = tp_rxasm_feed(&c->rx, in, len, lws_is_final_fragment(wsi), &c->lim, NULL, NULL, &used, &msg, &code, &err);
    if (r == RX_BAD) {
        sp_log(SP_LOG_WARN, "transport: connection to %s:%d closed: %s", c->host, c->port, err.msg);
        pthread_mutex_lock(&c->mu);
        cli_closed_locked(c, err.msg);
        pthread_mutex_unlock(&c->mu);
        return tp_defer_close(wsi, &c->fail, code, err.msg);
    }
    if (r == RX_DONE) {
        tp_cli_queue(c, &msg);
        cli_flow(c);
    }
    return 0;
}

static int cli_writeable(sp_ws_client *c, struct lws *wsi)
{
    if (c->fail.failed)
        return tp_close_ws(wsi, c->fail.code, c->fail.why);
    pthread_mutex_lock(&c->mu);
    int close_req = c->close_req;
    if (!close_req && !c->tx.busy && tp_msgq_pop(&c->txq, &c->tx.cur)) {
        c->tx.busy = 1;
        c->tx.off = 0;
    }
    pthread_mutex_unlock(&c->mu);
    if (close_req)
        return tp_close_ws(wsi, LWS_CLOSE_STATUS_NORMAL, "closed");
    if (!c->tx.busy)
        return 0;
    int r = tp_send_fragment(wsi, &c->tx);
    if (r < 0)
        return -1;
    int more = 1;
    if (r == 1) {
        tp_tx_reset(&c->tx);
        pthread_mutex_lock(&c->mu);
        more = c->txq.head != NULL;
        pthread_mutex_unlock(&c->mu);
    }
    if (more)
        lws_callback_on_writable(wsi);
    return 0;
}

static void cli_wake(sp_ws_client *c)
{
    if (!c->wsi)
        return;
    pthread_mutex_lock(&c->mu);
    int need = c->close_req || c->txq.head;
    pthread_mutex_unlock(&c->mu);
    if (need)
        lws_callback_on_writable(c->wsi);
    cli_flow(c);
}

/* The server refused the upgrade: a connection cap answers 503 with its reason. */
static void cli_refused(sp_ws_client *c, struct lws *wsi, const char *in, size_t len)
{
    char why[160];
    unsigned status = wsi ? lws_http_client_http_response(wsi) : 0;
    if (status == 503)
        snprintf(why, sizeof why, "refused by the server (HTTP 503: it is at a connection cap)");
    else if (status)
        snprintf(why, sizeof why, "refused by the server (HTTP %u)", status);
    else
        snprintf(why, sizeof why, "%.*s", in && len ? (int)(len < 150 ? len : 150) : 17,
                 in && len ? in : "connection failed");
    pthread_mutex_lock(&c->mu);
    cli_closed_locked(c, why);
    pthread_mutex_unlock(&c->mu);
}

/* The server's close frame: status (big-endian u16) and reason, kept for the caller's error message. */
static void cli_peer_close(sp_ws_client *c, const uint8_t *in, size_t len)
{
    char why[160];
    if (in && len >= 2)
        snprintf(why, sizeof why, "closed by the server: %d %.*s", in[0] << 8 | in[1], (int)(len > 122 ? 120 : len - 2),
                 (const char *)in + 2);
    else
        snprintf(why, sizeof why, "closed by the server");
    pthread_mutex_lock(&c->mu);
    cli_closed_locked(c, why);
    pthread_mutex_unlock(&c->mu);
}

static int cli_ws_cb(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len)
{
    sp_ws_client *c = lws_context_user(lws_get_context(wsi));
    switch (reason) {
    case LWS_CALLBACK_CLIENT_ESTABLISHED:
        pthread_mutex_lock(&c->mu);
        if (c->state == C_CONNECTING)
            c->state = C_OPEN;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        return 0;
    case LWS_CALLBACK_CLIENT_CONNECTION_ERROR:
        cli_refused(c, wsi, in, len);
        c->wsi = NULL;
        return 0;
    case LWS_CALLBACK_CLIENT_RECEIVE:
        return cli_receive(c, wsi, in, len);
    case LWS_CALLBACK_CLIENT_WRITEABLE:
        return cli_writeable(c, wsi);
    case LWS_CALLBACK_EVENT_WAIT_CANCELLED:
        cli_wake(c);
        return 0;
    case LWS_CALLBACK_WS_PEER_INITIATED_CLOSE:
        cli_peer_close(c, in, len);
        return 0;
    case LWS_CALLBACK_CLIENT_CLOSED:
    case LWS_CALLBACK_CLOSED:
        pthread_mutex_lock(&c->mu);
        cli_closed_locked(c, "connection closed");
        pthread_mutex_unlock(&c->mu);
        c->wsi = NULL;
        return 0;
    default:
        return 0;
    }
}

static void *cli_svc_main(void *arg)
{
    sp_ws_client *c = arg;
    pthread_setname_np(pthread_self(), "sp-ws-cli");
    while (!atomic_load(&c->svc_stop))
        if (lws_service(c->ctx, 0) < 0) {
            pthread_mutex_lock(&c->mu);
            cli_closed_locked(c, "the lws service loop failed");
            pthread_mutex_unlock(&c->mu);
            break;
        }
    return NULL;
}

/* Waits on the client's condvar until abs_ns (CLOCK_MONOTONIC), or forever if abs_ns is 0.
 * Returns ETIMEDOUT when the time is up. mu held. */
static int cli_wait(sp_ws_client *c, uint64_t abs_ns)
{
    if (!abs_ns)
        return pthread_cond_wait(&c->cv, &c->mu);
    struct timespec ts = {.tv_sec = (time_t)(abs_ns / 1000000000ull), .tv_nsec = (long)(abs_ns % 1000000000ull)};
    return pthread_cond_timedwait(&c->cv, &c->mu, &ts);
}

static sp_status cli_init(sp_ws_client *c, const char *host, int port, const sp_transport_opts *o)
{
    tp_resolve_opts(&c->o, o);
    c->lim = tp_limits_for(&c->o);
    snprintf(c->host, sizeof c->host, "%s", host);
    snprintf(c->source, sizeof c->source, "%s", o && o->source ? o->source : "");
    c->o.source = NULL;
    c->port = port;
    c->bulk_fd = -1;
    c->wake_fd = c->o.direct_recv ? eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC) : -1;
    c->state = C_CONNECTING;
    if (c->o.key) {
        c->key = *c->o.key;
        c->has_key = 1;
    }
    c->o.key = NULL;
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->bulk_wmu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    return SP_OK;
}

/* A client context: no listener, no extensions (the 4.1.6 client extension-list overflow), same buffers. */
static sp_status cli_create_context(sp_ws_client *c, int timeout_ms, sp_err *err)
{
    c->protocols[0] = (struct lws_protocols){.name = "sepal",
                                             .callback = cli_ws_cb,
                                             .rx_buffer_size = FRAG_SIZE,
                                             .tx_packet_size = FRAG_SIZE};
    struct lws_context_creation_info info;
    memset(&info, 0, sizeof info);
    info.port = CONTEXT_PORT_NO_LISTEN;
    info.protocols = c->protocols;
    info.extensions = NULL;
    info.options = LWS_SERVER_OPTION_SKIP_SERVER_CANONICAL_NAME;
    info.user = c;
    info.pt_serv_buf_size = FRAG_SIZE;
    /* The caller's deadline is enforced by cli_handshake; lws's own timeouts only need to be no shorter. */
    unsigned secs = timeout_ms < 0 ? 0 : (unsigned)(timeout_ms / 1000 + 1);
    info.timeout_secs = secs && secs < 5 ? 5 : secs; /* 0 = lws's default */
    info.connect_timeout_secs = info.timeout_secs;
    c->ctx = lws_create_context(&info);
    if (!c->ctx)
        return sp_errf(err, SP_ERR_NOMEM, "connecting to %s:%d: cannot create the lws context", c->host, c->port);
    return SP_OK;
}

/* Starts the connection, then the service thread, and waits for the handshake or its failure. */
static sp_status cli_handshake(sp_ws_client *c, int timeout_ms, sp_err *err)
{
    struct lws_client_connect_info ci;
    memset(&ci, 0, sizeof ci);
    ci.context = c->ctx;
    ci.address = c->host;
    ci.port = c->port;
    ci.path = "/";
    ci.host = c->host;
    ci.origin = c->host;
    ci.protocol = "sepal";
    ci.pwsi = &c->wsi;
    ci.iface = c->source[0] ? c->source : NULL;
    struct lws *w = lws_client_connect_via_info(&ci);
    if (pthread_create(&c->svc, NULL, cli_svc_main, c))
        return sp_errf(err, SP_ERR_NOMEM, "connecting to %s:%d: cannot start the transport thread", c->host, c->port);
    c->svc_started = 1;
    uint64_t until = tp_deadline_after(timeout_ms < 0 ? 0 : timeout_ms);
    pthread_mutex_lock(&c->mu);
    if (!w)
        cli_closed_locked(c, "connection failed (cannot resolve or reach the host)");
    int timed_out = 0;
    while (c->state == C_CONNECTING && !timed_out)
        timed_out = cli_wait(c, timeout_ms < 0 ? 0 : until) == ETIMEDOUT;
    int state = c->state;
    char why[sizeof c->why];
    snprintf(why, sizeof why, "%s", c->why);
    pthread_mutex_unlock(&c->mu);
    if (state == C_OPEN)
        return SP_OK;
    if (state == C_CONNECTING)
        return sp_errf(err, SP_ERR_TIMEOUT, "connecting to %s:%d: no answer within %d ms", c->host, c->port,
                       timeout_ms);
    return sp_errf(err, SP_ERR_IO, "connecting to %s:%d: %s", c->host, c->port, why);
}

sp_status sp_ws_client_connect(sp_ws_client **out, const char *host, int port, const sp_transport_opts *o,
                               int timeout_ms, sp_err *err)
{
    if (!out || !host || !*host || port <= 0 || port > 65535)
        return sp_errf(err, SP_ERR_ARG, "sp_ws_client_connect: bad host or port %d", port);
    *out = NULL;
    tp_lws_log_init();
    sp_ws_client *c = calloc(1, sizeof *c);
    if (!c)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    cli_init(c, host, port, o);
    uint64_t t0 = sp_now_ns();
    sp_status st = cli_create_context(c, timeout_ms, err);
    if (!st)
        st = cli_handshake(c, timeout_ms, err);
    if (!st && c->has_key) { /* the rest of the caller's time */
        int spent = (int)((sp_now_ns() - t0) / 1000000);
        st = tp_auth_client(c, timeout_ms < 0 ? -1 : spent < timeout_ms ? timeout_ms - spent : 1, err);
    }
    if (st) {
        sp_ws_client_close(c);
        return st;
    }
    *out = c;
    return SP_OK;
}

sp_status sp_ws_client_send(sp_ws_client *c, sp_buf *msg, sp_err *err)
{
    if (!c || !msg) {
        if (msg)
            sp_buf_free(msg);
        return sp_errf(err, SP_ERR_ARG, "sp_ws_client_send: NULL argument");
    }
    pthread_mutex_lock(&c->mu);
    if (c->state != C_OPEN) {
        pthread_mutex_unlock(&c->mu);
        sp_buf_free(msg);
        return sp_errf(err, SP_ERR_CLOSED, "connection to %s:%d is closed", c->host, c->port);
    }
    if (c->bulk_fd >= 0 && msg->len >= c->o.bulk_threshold) {
        int fd = c->bulk_fd;
        pthread_mutex_unlock(&c->mu);
        return tp_cli_bulk_send(c, fd, msg, err);
    }
    int bad = tp_msgq_push(&c->txq, msg);
    pthread_mutex_unlock(&c->mu);
    if (bad)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory queueing a message");
    lws_cancel_service(c->ctx);
    return SP_OK;
}

sp_status sp_ws_client_recv(sp_ws_client *c, sp_buf *out, int timeout_ms, sp_err *err)
{
    if (!c || !out)
        return sp_errf(err, SP_ERR_ARG, "sp_ws_client_recv: NULL argument");
    pthread_mutex_lock(&c->mu);
    int direct = c->wake_fd >= 0 && c->bulk_fd >= 0;
    pthread_mutex_unlock(&c->mu);
    if (direct)
        return tp_cli_recv_direct(c, out, timeout_ms, err);
    uint64_t until = timeout_ms < 0 ? 0 : tp_deadline_after(timeout_ms);
    sp_status st = SP_OK;
    pthread_mutex_lock(&c->mu);
    while (!c->rxq.head && c->state == C_OPEN && st == SP_OK)
        if (timeout_ms == 0 || cli_wait(c, until) == ETIMEDOUT)
            st = SP_ERR_TIMEOUT;
    if (tp_msgq_pop(&c->rxq, out)) {
        st = SP_OK;
        tp_cli_taken_locked(c);
    } else if (c->state != C_OPEN)
        st = SP_ERR_CLOSED;
    char why[sizeof c->why];
    snprintf(why, sizeof why, "%s", c->why);
    pthread_mutex_unlock(&c->mu);
    if (st == SP_ERR_TIMEOUT)
        return sp_errf(err, st, "no message from %s:%d within %d ms", c->host, c->port, timeout_ms);
    if (st == SP_ERR_CLOSED)
        return sp_errf(err, st, "connection to %s:%d closed (%s)", c->host, c->port, why);
    return SP_OK;
}

uint64_t sp_ws_client_queued(sp_ws_client *c, int *paused)
{
    pthread_mutex_lock(&c->mu);
    uint64_t n = c->rxq.bytes;
    if (paused)
        *paused = c->rx_full;
    pthread_mutex_unlock(&c->mu);
    return n;
}

int sp_ws_client_is_open(const sp_ws_client *c)
{
    if (!c)
        return 0;
    sp_ws_client *m = (sp_ws_client *)c; /* the mutex is not part of the logical state */
    pthread_mutex_lock(&m->mu);
    int open = m->state == C_OPEN;
    pthread_mutex_unlock(&m->mu);
    return open;
}

/* The reader is stopped first (it may call lws_cancel_service), then the service thread, then the context
 * is destroyed from this thread (which closes the ws). */
void sp_ws_client_close(sp_ws_client *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    cli_closed_locked(c, "closed locally");
    pthread_mutex_unlock(&c->mu);
    if (c->reader_started)
        pthread_join(c->reader, NULL);
    if (c->svc_started) {
        atomic_store(&c->svc_stop, 1);
        lws_cancel_service(c->ctx);
        pthread_join(c->svc, NULL);
    }
    if (c->ctx)
        lws_context_destroy(c->ctx);
    if (c->bulk_fd >= 0)
        close(c->bulk_fd);
    if (c->wake_fd >= 0)
        close(c->wake_fd);
    sp_buf_free(&c->drs.buf);
    tp_msgq_clear(&c->txq);
    tp_msgq_clear(&c->rxq);
    tp_tx_reset(&c->tx);
    tp_rxasm_reset(&c->rx);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->bulk_wmu);
    pthread_mutex_destroy(&c->mu);
    free(c);
}
