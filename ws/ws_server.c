/* ws_server.c - the server's websocket side (libwebsockets 4.1.6) and the public sp_ws_server API; the bulk
 * channel's thread is in bulk.c, the limits' bookkeeping in limits.c, the swarm key exchange in auth.c, the
 * framing both sides share in frame.c (see transport_impl.h).
 *
 * The server listens itself (lws has no listener: CONTEXT_PORT_NO_LISTEN_SERVER) and lws polls that socket
 * as a raw file: each accepted socket passes the connection caps before lws sees it, and is handed over with
 * lws_adopt_descriptor_vhost_via_info, its conn as the wsi's opaque pointer. A conn therefore lives from the
 * accept to LWS_CALLBACK_WSI_DESTROY (which lws sends to protocols[0] for every wsi), through the phases
 * HTTP (upgrading), WS (the swarm key exchange and the first message due) and READY. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "timeutil.h"
#include "transport_impl.h"

sp_log_limit tp_log_refused, tp_log_failed;
static sp_log_limit g_fd_log;

static uint64_t secs_ns(double s) { return (uint64_t)(s * 1e9); }

/* ---------------------------------------------------------------------------------------------- */
/* connections: the end of one */

int tp_conn_let_go(conn *c)
{
    int last = --c->refs == 0;
    if (last) /* held until tp_conn_release takes the lock: a worker releasing its last message (sp_ws_server_release)
               * in between would free c under it otherwise */
        c->pins++;
    return last;
}

/* Frees c once both channels are gone and nothing is pinned (mu held). */
static void conn_free_if_done(sp_ws_server *s, conn *c)
{
    if (c->refs || c->pins || c == s->adopting)
        return;
    tp_conn_remove(s, c);
    src_entry *e = c->src;
    c->src = NULL;
    tp_src_put(s, e);
    free(c);
}

void tp_conn_release(sp_ws_server *s, conn *c, int last)
{
    if (!last)
        return;
    pthread_mutex_lock(&s->mu);
    c->pins--; /* the pin tp_conn_let_go took, taken over under the lock */
    if (c->src)
        c->src->conns--;
    s->live--;
    int report = c->opened && !c->reported;
    c->reported = 1;
    if (report)
        c->pins++; /* c stays while on_close runs: a worker releasing its last message cannot free it meanwhile */
    else
        conn_free_if_done(s, c);
    pthread_mutex_unlock(&s->mu);
    if (!report)
        return;
    s->on_close(s->user, c->id); /* exactly once, after every on_message (each channel delivers only before it
                                  * lets go) */
    pthread_mutex_lock(&s->mu);
    c->pins--;
    conn_free_if_done(s, c);
    pthread_mutex_unlock(&s->mu);
}

static void stash_free(conn *c)
{
    while (c->stash) {
        piece *p = c->stash;
        c->stash = p->next;
        free(p);
    }
    c->stash_tail = NULL;
    c->stash_bytes = 0;
}

/* Leaves the handshake's counts (mu held). */
static void leave_pending(sp_ws_server *s, conn *c)
{
    if (!c->pending_counted)
        return;
    c->pending_counted = 0;
    if (c->src)
        c->src->pending--;
    s->pending--;
}

/* The ws channel is gone (LWS_CALLBACK_WSI_DESTROY, or a failed adoption); the bulk socket goes too. */
static void srv_ws_gone(sp_ws_server *s, conn *c)
{
    if (c->ws_gone)
        return;
    c->ws_gone = 1;
    stash_free(c);
    tp_tx_reset(&c->tx);
    tp_rxasm_reset(&c->rx);
    pthread_mutex_lock(&s->mu);
    tp_charge(s, c, -(int64_t)c->ws_reserved, -(int64_t)(tp_msgq_clear(&c->txq) + c->tx_charge));
    c->ws_reserved = c->tx_charge = 0;
    if (c->wait_ns)
        s->waiting--;
    c->wait_ns = 0;
    c->wsi = NULL;
    c->dead = 1;
    leave_pending(s, c);
    int wake = c->bulk != NULL;
    if (c->bulk)
        c->bulk->kill = 1;
    int last = tp_conn_let_go(c);
    pthread_mutex_unlock(&s->mu);
    if (wake)
        tp_wake_bulk(s);
    tp_conn_release(s, c, last);
}

/* ---------------------------------------------------------------------------------------------- */
/* accepting: the caps come before lws sees a socket */

/* Refuses an accepted socket at once: a 503 saying why (one non-blocking send), then the close. */
static void refuse_fd(int fd, const char *why)
{
    char resp[400];
    int n = snprintf(resp, sizeof resp,
                     "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: text/plain\r\n"
                     "Content-Length: %zu\r\n\r\n%s\n", strlen(why) + 1, why);
    ssize_t w = send(fd, resp, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w;
    close(fd);
}

/* The caps for a new connection from addr: NULL and a new conn in *out, or why it is refused (mu held). */
static const char *gate(sp_ws_server *s, const uint8_t addr[16], conn **out)
{
    const sp_transport_opts *o = &s->o;
    src_entry *e = s->stopping ? NULL : tp_src_get(s, addr);
    const char *why = NULL;
    int per_ip = 0;
    if (!e)
        why = s->stopping ? "the server is stopping" : "out of memory";
    else if (s->live >= o->max_conns)
        why = "the server has all the connections it takes";
    else if ((per_ip = e->conns >= o->max_conns_per_ip))
        why = "too many connections from this address";
    else if (s->pending >= o->max_pending)
        why = "too many connections in their handshake";
    else if ((per_ip = e->pending >= o->max_pending_per_ip))
        why = "too many connections in their handshake from this address";
    conn *c = why ? NULL : calloc(1, sizeof *c);
    if (!why && c) {
        c->id = ++s->next_id;
        c->src = e;
        c->refs = 1;
        c->phase = PH_HTTP;
        c->accepted_ns = sp_now_ns();
        c->pending_counted = 1;
        c->rx.map_from = MAP_FROM;
        atomic_store(&c->last_ns, c->accepted_ns);
        if (tp_conn_insert(s, c)) {
            free(c);
            c = NULL;
        }
    }
    if (!why && !c)
        why = "out of memory";
    if (why) {
        s->st.refused++;
        s->st.refused_ip += per_ip;
        tp_src_put(s, e);
        return why;
    }
    e->conns++;
    e->pending++;
    s->live++;
    s->pending++;
    s->st.accepted++;
    *out = c;
    return NULL;
}

/* Hands an accepted socket to lws with its conn; lws closes the socket when it cannot take it. */
static void adopt(sp_ws_server *s, conn *c, int fd)
{
    lws_adopt_desc_t d = {.vh = s->vh, .type = LWS_ADOPT_SOCKET | LWS_ADOPT_HTTP, .opaque = c};
    d.fd.sockfd = fd;
    s->adopting = c; /* a failed adoption may report WSI_DESTROY from inside the call: c must outlive it */
    struct lws *w = lws_adopt_descriptor_vhost_via_info(&d);
    s->adopting = NULL;
    if (w) {
        pthread_mutex_lock(&s->mu);
        c->wsi = w;
        pthread_mutex_unlock(&s->mu);
    } else if (c->ws_gone) { /* WSI_DESTROY came during the call: the free it put off */
        pthread_mutex_lock(&s->mu);
        conn_free_if_done(s, c);
        pthread_mutex_unlock(&s->mu);
    } else { /* lws never made a wsi (and closed the socket) */
        srv_ws_gone(s, c);
    }
}

static void refuse_no_fd(int fd) { refuse_fd(fd, "the server is out of file descriptors"); }

/* Out of descriptors: what waits is refused with the spare descriptor's help (tp_shed), so the backlog does not
 * fill with connections nobody answers. */
static void shed(sp_ws_server *s)
{
    int e = errno, n = tp_shed(s->ws_fd, &s->spare_fd, refuse_no_fd);
    pthread_mutex_lock(&s->mu);
    s->st.out_of_fds += n > 0 ? (uint64_t)n : 0;
    pthread_mutex_unlock(&s->mu);
    sp_log_limited(&g_fd_log, SP_LOG_WARN, "transport: out of file descriptors (%s): refusing connections",
                   strerror(e));
    if (n < 0 && s->ws_listen_wsi && !s->ws_listen_rest_ns) { /* nothing could be done: rest (the sweep wakes it) */
        s->ws_listen_rest_ns = sp_now_ns() + LISTEN_PAUSE_NS;
        lws_rx_flow_control(s->ws_listen_wsi, 0);
    }
}

/* LWS_CALLBACK_RAW_RX_FILE on the listening socket: takes what is waiting (a bounded batch per turn). */
static void srv_accept(sp_ws_server *s)
{
    for (int k = 0; k < 64; k++) {
        struct sockaddr_storage sa;
        socklen_t sl = sizeof sa;
        int fd = tp_accept(s->ws_fd, (struct sockaddr *)&sa, &sl);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE)
                shed(s);
            return; /* EAGAIN, or a transient error the next POLLIN retries */
        }
        uint8_t addr[16];
        tp_addr_of((struct sockaddr *)&sa, addr);
        conn *c = NULL;
        pthread_mutex_lock(&s->mu);
        const char *why = gate(s, addr, &c);
        pthread_mutex_unlock(&s->mu);
        if (why) {
            char name[48];
            tp_src_name(addr, name, sizeof name);
            sp_log_limited(&tp_log_refused, SP_LOG_WARN, "transport: refused a connection from %s: %s", name, why);
            refuse_fd(fd, why);
            continue;
        }
        tp_tune_socket(fd);
        adopt(s, c, fd);
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* failures */

/* Closes c for what it did: an ERROR err_code/why to reqid (err_code NULL: none), then the close frame with
 * status code. Service thread. */
static int srv_refuse(conn *c, int code, const char *err_code, uint64_t reqid, const char *why)
{
    if (c->fail.failed || !c->wsi)
        return 0;
    c->fail.reply = err_code != NULL;
    c->fail.reqid = reqid;
    c->fail.errcode = err_code;
    tp_defer_close(c->wsi, &c->fail, code, why);
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

/* ---------------------------------------------------------------------------------------------- */
/* receiving: admission, waiting, delivery */

typedef struct admit_ctx {
    sp_ws_server *s;
    conn *c;
} admit_ctx;

/* tp_admit_fn for the ws channel. */
static int ws_admit(void *u, uint64_t total, int *code, sp_err *err)
{
    admit_ctx *a = u;
    sp_ws_server *s = a->s;
    conn *c = a->c;
    uint64_t now = sp_now_ns();
    pthread_mutex_lock(&s->mu);
    int preauth = c->phase != PH_READY && (s->has_key || s->o.first_type); /* a handshake is declared */
    int r = preauth && total > PREAUTH_MAX ? -2 : tp_admit(s, c, total);
    uint64_t share = s->o.rx_budget_conn;
    if (r == 1) {
        c->ws_reserved = total;
        c->ws_deadline_ns = s->o.min_rate > 0 ? now + MSG_GRACE_NS + secs_ns((double)total / s->o.min_rate) : 0;
    }
    if (r == 0 && !c->wait_ns) {
        c->wait_ns = now;
        s->waiting++;
        s->st.waits++;
    } else if (r != 0 && c->wait_ns) {
        c->wait_ns = 0;
        s->waiting--;
    }
    pthread_mutex_unlock(&s->mu);
    if (r == -2) {
        *code = LWS_CLOSE_STATUS_POLICY_VIOLATION;
        sp_errf(err, SP_ERR_RANGE, "a %llu-byte message before the handshake is complete (at most %d)",
                (unsigned long long)total, PREAUTH_MAX);
    } else if (r < 0) {
        *code = LWS_CLOSE_STATUS_MESSAGE_TOO_LARGE;
        sp_errf(err, SP_ERR_RANGE, "message of %llu bytes exceeds this connection's budget of %llu bytes (max_message)",
                (unsigned long long)total, (unsigned long long)share);
    }
    return r < 0 ? -1 : r;
}

static int stash_add(conn *c, const uint8_t *p, size_t n, int final, int front)
{
    if (c->stash_bytes + n > 16 * FRAG_SIZE) /* lws delivers at most what it had read: this is not that */
        return -1;
    piece *x = malloc(sizeof *x + n);
    if (!x)
        return -1;
    x->final = final;
    x->len = n;
    if (n)
        memcpy(x->data, p, n);
    x->next = NULL;
    if (front) {
        x->next = c->stash;
        c->stash = x;
        if (!c->stash_tail)
            c->stash_tail = x;
    } else {
        if (c->stash_tail)
            c->stash_tail->next = x;
        else
            c->stash = x;
        c->stash_tail = x;
    }
    c->stash_bytes += n;
    return 0;
}

static void srv_flow(sp_ws_server *s, conn *c);

/* Feeds one piece of ws input (service thread). from_stash: a piece taken off the front of the stash (what
 * is left of it goes back there). */
static void srv_feed(sp_ws_server *s, conn *c, const uint8_t *p, size_t n, int final, int from_stash)
{
    admit_ctx ac = {s, c};
    size_t used = 0;
    sp_buf msg;
    sp_err err = {0};
    int code = 0;
    int r = tp_rxasm_feed(&c->rx, p, n, final, &s->lim, ws_admit, &ac, &used, &msg, &code, &err);
    if (r == RX_WAIT) {
        if ((n - used || final) && stash_add(c, p + used, n - used, final, from_stash))
            srv_refuse(c, LWS_CLOSE_STATUS_UNEXPECTED_CONDITION, "internal", 0, "out of memory holding input");
        srv_flow(s, c);
        return;
    }
    if (r == RX_BAD) {
        sp_log_limited(&tp_log_failed, SP_LOG_WARN, "transport: conn %llu closed: %s", (unsigned long long)c->id, err.msg);
        sp_msg_header h = {0};
        sp_msg_header_read(c->rx.buf.data, c->rx.buf.len, &h);
        const char *ec = sp_msg_reject_code(c->rx.buf.data, c->rx.buf.len, err.code);
        pthread_mutex_lock(&s->mu);
        tp_charge(s, c, -(int64_t)c->ws_reserved, 0);
        c->ws_reserved = 0;
        pthread_mutex_unlock(&s->mu);
        srv_refuse(c, code, ec, h.request_id, err.msg);
        return;
    }
    atomic_store(&c->last_ns, sp_now_ns());
    if (r == RX_DONE) {
        c->ws_reserved = 0; /* the charge goes with the message */
        c->ws_deadline_ns = 0;
        tp_deliver(s, c, &msg, 1);
    }
}

/* Input held for a waiting message is fed again (service thread); reading resumes once none is left. */
static void srv_retry(sp_ws_server *s, conn *c)
{
    if (c->fail.failed)
        return;
    if (c->rx.want && !c->rx.admitted)
        srv_feed(s, c, NULL, 0, 0, 1); /* only asks for admission again */
    while (c->stash && !c->wait_ns && !c->fail.failed) {
        piece *x = c->stash;
        c->stash = x->next;
        if (!c->stash)
            c->stash_tail = NULL;
        c->stash_bytes -= x->len;
        srv_feed(s, c, x->data, x->len, x->final, 1);
        free(x);
    }
    srv_flow(s, c);
}

static int srv_receive(sp_ws_server *s, struct lws *wsi, conn *c, const void *in, size_t len)
{
    if (!c)
        return -1;
    if (c->fail.failed)
        return 0;
    if (!lws_frame_is_binary(wsi)) {
        sp_log_limited(&tp_log_failed, SP_LOG_WARN, "transport: conn %llu closed: a text frame", (unsigned long long)c->id);
        return srv_refuse(c, LWS_CLOSE_STATUS_UNACCEPTABLE_OPCODE, NULL, 0, "binary messages only");
    }
    int final = lws_is_final_fragment(wsi);
    if (c->wait_ns || c->stash) { /* behind a message that waits: held in order */
        if (stash_add(c, in, len, final, 0))
            srv_refuse(c, LWS_CLOSE_STATUS_POLICY_VIOLATION, "bad_request", 0, "input while paused");
        return 0;
    }
    srv_feed(s, c, in, len, final, 0);
    srv_flow(s, c);
    return 0;
}

/* The handshake's gates for a message that came before c was READY (service thread): the swarm key exchange,
 * then the first message's type. 1 if msg goes on to on_message. */
static int srv_gate_first(sp_ws_server *s, conn *c, const sp_buf *msg)
{
    sp_msg_header h = {0};
    sp_msg_header_read(msg->data, msg->len, &h);
    if (h.type == SP_MSG_AUTH || (s->has_key && c->auth != AUTH_DONE)) {
        tp_auth_server(s, c, msg);
        return 0;
    }
    if (s->o.first_type && h.type != s->o.first_type) {
        char why[120];
        snprintf(why, sizeof why, "the first message must be %s (got %s)", sp_msg_type_name(s->o.first_type),
                 sp_msg_type_name(h.type));
        srv_refuse(c, LWS_CLOSE_STATUS_POLICY_VIOLATION, "bad_request", h.request_id, why);
        return 0;
    }
    pthread_mutex_lock(&s->mu);
    c->phase = PH_READY;
    leave_pending(s, c);
    pthread_mutex_unlock(&s->mu);
    return 1;
}

void tp_deliver(sp_ws_server *s, conn *c, sp_buf *msg, int ws)
{
    int64_t len = (int64_t)msg->len;
    pthread_mutex_lock(&s->mu);
    int ready = c->phase == PH_READY; /* only the service thread changes it; a bulk socket needs a token from
                                         a HELLO reply, so bulk messages come once it is READY */
    pthread_mutex_unlock(&s->mu);
    int go = ready || (ws && srv_gate_first(s, c, msg));
    pthread_mutex_lock(&s->mu);
    if (go && s->o.app_releases)
        c->pins++;
    else
        tp_charge(s, c, -len, 0);
    s->st.delivered += go;
    pthread_mutex_unlock(&s->mu);
    if (go)
        s->on_message(s->user, c->id, msg);
    else
        sp_buf_free(msg);
}

/* ---------------------------------------------------------------------------------------------- */
/* flow control and sending */

/* Reading stops while a message waits for budget (or input is held) and while the unsent output is over
 * tx_bound; a message's min_rate clock stops while the server is the one not reading. Service thread. */
static void srv_flow(sp_ws_server *s, conn *c)
{
    uint64_t now = sp_now_ns();
    pthread_mutex_lock(&s->mu);
    int out_full = c->out_full, ws = c->phase != PH_HTTP && c->wsi;
    if (out_full && !c->paused_ns)
        c->paused_ns = now;
    if (!out_full && c->paused_ns) {
        uint64_t d = now > c->paused_ns ? now - c->paused_ns : 0;
        if (c->ws_deadline_ns)
            c->ws_deadline_ns += d;
        if (c->bulk && c->bulk->msg_deadline_ns)
            c->bulk->msg_deadline_ns += d;
        c->paused_ns = 0;
    }
    pthread_mutex_unlock(&s->mu);
    int off = c->wait_ns || c->stash || out_full || c->fail.failed;
    if (ws && off != c->rx_off) {
        lws_rx_flow_control(c->wsi, !off);
        c->rx_off = off;
    }
}

/* One fragment per callback, then ask again: lws sends at most one packet per WRITEABLE anyway, and the
 * loop stays responsive to the other connections. */
static int srv_writeable(sp_ws_server *s, struct lws *wsi, conn *c)
{
    if (!c)
        return -1;
    pthread_mutex_lock(&s->mu);
    int close_req = c->close_req && !c->fail.failed;
    if (!close_req && !c->fail.failed && !c->tx.busy && tp_msgq_pop(&c->txq, &c->tx.cur)) {
        c->tx.busy = 1;
        c->tx.off = 0;
        c->tx_charge = c->tx.cur.len;
    }
    pthread_mutex_unlock(&s->mu);
    if (c->fail.failed)
        return srv_fail_writeable(wsi, c);
    if (close_req)
        return tp_close_ws(wsi, LWS_CLOSE_STATUS_GOINGAWAY, c->close_why ? c->close_why : "closed");
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
        tp_charge(s, c, 0, -(int64_t)c->tx_charge);
        c->tx_charge = 0;
        more = c->txq.head != NULL;
        pthread_mutex_unlock(&s->mu);
        srv_flow(s, c);
    }
    if (more)
        lws_callback_on_writable(wsi);
    return 0;
}

/* LWS_CALLBACK_EVENT_WAIT_CANCELLED: other threads flagged conns (output queued, a close asked for, the flow
 * control to change), or freed budget that waiting messages may take. A conn whose ws
 * is live cannot be freed but on this thread, so the ids taken under the lock stay valid outside it. */
static void srv_wake(sp_ws_server *s)
{
    pthread_mutex_lock(&s->mu);
    size_t n = 0;
    int retry = s->waiting > 0;
    size_t need = s->nwakeq + (retry ? s->nconns : 0);
    if (tp_grow((void **)&s->scratch, &s->capscratch, need, sizeof *s->scratch) == 0) {
        for (size_t i = 0; i < s->nwakeq; i++) {
            conn *c = tp_find_conn(s, s->wakeq[i]);
            if (c)
                c->flagged = 0;
            if (c && c->wsi)
                s->scratch[n++] = c->id;
        }
        s->nwakeq = 0;
        for (size_t i = 0; retry && i < s->nconns; i++)
            if (s->conns[i]->wait_ns && s->conns[i]->wsi)
                s->scratch[n++] = s->conns[i]->id;
    }
    pthread_mutex_unlock(&s->mu);
    for (size_t i = 0; i < n; i++) {
        pthread_mutex_lock(&s->mu);
        conn *c = tp_find_conn(s, s->scratch[i]);
        struct lws *w = c ? c->wsi : NULL; /* live ws: c cannot be freed but on this thread */
        int writable = w && (c->close_req || c->txq.head);
        pthread_mutex_unlock(&s->mu);
        if (!w)
            continue;
        if (writable)
            lws_callback_on_writable(c->wsi);
        if (c->wait_ns || c->stash)
            srv_retry(s, c);
        else
            srv_flow(s, c);
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* the sweep: deadlines, idle connections, waits (service thread, every SWEEP_US) */

enum { ACT_KILL = 1, ACT_HANDSHAKE, ACT_IDLE, ACT_BUSY, ACT_SLOW, ACT_RETRY };

/* What the sweep does to c now (mu held). */
static int sweep_one(sp_ws_server *s, conn *c, uint64_t now, uint64_t *reqid)
{
    const sp_transport_opts *o = &s->o;
    uint64_t hs = secs_ns(o->handshake_timeout_s), busy = secs_ns(o->busy_timeout_s);
    bsock *b = c->bulk;
    /* times another thread wrote may be later than now: compare, never subtract */
    if (c->phase == PH_HTTP && now > c->accepted_ns + hs)
        return ACT_KILL;
    if (c->phase == PH_WS && now > c->upgraded_ns + hs)
        return ACT_HANDSHAKE;
    if ((c->wait_ns && now > c->wait_ns + busy) || (b && b->wait_ns && now > b->wait_ns + busy)) {
        /* the waiting message's request id, from its header (the service thread's own state, or the bulk's) */
        *reqid = !c->wait_ns ? b->wait_reqid : c->rx.buf.len >= HDR ? le64(c->rx.buf.data + 16) : 0;
        return ACT_BUSY;
    }
    if (!c->out_full && ((c->ws_deadline_ns && now > c->ws_deadline_ns) ||
                         (b && b->msg_deadline_ns && now > b->msg_deadline_ns)))
        return ACT_SLOW;
    if (c->phase == PH_READY && o->idle_timeout_s > 0 && !c->holds && !c->in_bytes && !c->out_bytes && !c->pins &&
        now > atomic_load(&c->last_ns) + secs_ns(o->idle_timeout_s))
        return ACT_IDLE;
    return c->wait_ns && s->waiting ? ACT_RETRY : 0;
}

static void sweep_act(sp_ws_server *s, conn *c, int act, uint64_t reqid)
{
    static const char *const what[] = {"", "handshake timeout", "handshake timeout", "idle", "busy", "too slow", ""};
    char why[160], who[48];
    pthread_mutex_lock(&s->mu);
    snprintf(who, sizeof who, "%s", c->src ? c->src->name : "?");
    pthread_mutex_unlock(&s->mu);
    if (act != ACT_RETRY && act != ACT_IDLE)
        sp_log_limited(&tp_log_failed, SP_LOG_WARN, "transport: conn %llu from %s closed: %s", (unsigned long long)c->id,
                       who, what[act]);
    switch (act) {
    case ACT_KILL: /* not a websocket yet: no close frame to send */
        pthread_mutex_lock(&s->mu);
        c->closing = 1;
        pthread_mutex_unlock(&s->mu);
        lws_set_timeout(c->wsi, PENDING_TIMEOUT_USER_OK, LWS_TO_KILL_ASYNC);
        break;
    case ACT_HANDSHAKE:
        snprintf(why, sizeof why, "the %s did not come within %.3g s of the upgrade",
                 s->has_key && c->auth != AUTH_DONE ? "swarm key exchange" : "first message", s->o.handshake_timeout_s);
        srv_refuse(c, LWS_CLOSE_STATUS_POLICY_VIOLATION, "timeout", 0, why);
        break;
    case ACT_BUSY:
        snprintf(why, sizeof why, "no room for the message within %.3g s (the server's input budget is in use)",
                 s->o.busy_timeout_s);
        srv_refuse(c, 1013 /* try again later */, "busy", reqid, why);
        break;
    case ACT_SLOW:
        snprintf(why, sizeof why, "a message arrived slower than %.0f bytes/s", s->o.min_rate);
        srv_refuse(c, LWS_CLOSE_STATUS_POLICY_VIOLATION, "timeout", 0, why);
        break;
    case ACT_IDLE:
        pthread_mutex_lock(&s->mu);
        c->close_req = c->closing = 1;
        c->close_why = "idle";
        pthread_mutex_unlock(&s->mu);
        lws_callback_on_writable(c->wsi);
        break;
    case ACT_RETRY:
        srv_retry(s, c);
        break;
    }
    if (act != ACT_RETRY && act != ACT_KILL && act != ACT_IDLE) {
        srv_flow(s, c);
        lws_callback_on_writable(c->wsi);
    }
}

/* Large drops of the budget give memory back to the system (glibc keeps freed heap otherwise). */
static void maybe_trim(sp_ws_server *s, uint64_t now)
{
    pthread_mutex_lock(&s->mu);
    int trim = s->trim_mark > s->used + (4ull << 20) && now > s->last_trim_ns + 1000000000ull;
    if (trim) {
        s->trim_mark = s->used;
        s->last_trim_ns = now;
    }
    pthread_mutex_unlock(&s->mu);
#if defined(__GLIBC__)
    if (trim)
        malloc_trim(0);
#endif
}

static void srv_sweep(lws_sorted_usec_list_t *sul)
{
    sp_ws_server *s = lws_container_of(sul, sp_ws_server, sweep);
    uint64_t now = sp_now_ns();
    pthread_mutex_lock(&s->mu);
    size_t n = 0;
    if (tp_grow((void **)&s->scratch, &s->capscratch, 3 * s->nconns, sizeof *s->scratch) == 0)
        for (size_t i = 0; i < s->nconns; i++) {
            conn *c = s->conns[i];
            uint64_t reqid = 0;
            int act = c->wsi && !c->fail.failed && !c->closing ? sweep_one(s, c, now, &reqid) : 0;
            if (!act)
                continue;
            s->st.handshake_timeouts += act == ACT_KILL || act == ACT_HANDSHAKE;
            s->st.busy += act == ACT_BUSY;
            s->st.slow += act == ACT_SLOW;
            s->st.idle_closed += act == ACT_IDLE;
            s->scratch[n++] = c->id;
            s->scratch[n++] = (uint64_t)act;
            s->scratch[n++] = reqid;
        }
    pthread_mutex_unlock(&s->mu);
    for (size_t i = 0; i < n; i += 3) {
        pthread_mutex_lock(&s->mu);
        conn *c = tp_find_conn(s, s->scratch[i]);
        struct lws *w = c ? c->wsi : NULL;
        pthread_mutex_unlock(&s->mu);
        if (w)
            sweep_act(s, c, (int)s->scratch[i + 1], s->scratch[i + 2]);
    }
    maybe_trim(s, now);
    tp_spare_retake(&s->spare_fd);
    if (s->ws_listen_rest_ns && now >= s->ws_listen_rest_ns) { /* the listener's rest is over */
        s->ws_listen_rest_ns = 0;
        lws_rx_flow_control(s->ws_listen_wsi, 1);
    }
    sp_log_limited_flush(&tp_log_refused);
    sp_log_limited_flush(&tp_log_failed);
    sp_log_limited_flush(&g_fd_log);
    if (!atomic_load(&s->svc_stop))
        lws_sul_schedule(s->ctx, 0, &s->sweep, srv_sweep, SWEEP_US);
}

/* ---------------------------------------------------------------------------------------------- */
/* lws callbacks */

static int srv_established(sp_ws_server *s, struct lws *wsi, conn **pss)
{
    conn *c = lws_get_opaque_user_data(wsi);
    if (!c || !pss)
        return -1;
    *pss = c;
    pthread_mutex_lock(&s->mu);
    c->phase = PH_WS;
    c->opened = 1;
    c->upgraded_ns = sp_now_ns();
    atomic_store(&c->last_ns, c->upgraded_ns);
    pthread_mutex_unlock(&s->mu);
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
    case LWS_CALLBACK_EVENT_WAIT_CANCELLED:
        srv_wake(s);
        return 0;
    default: /* the conn ends at WSI_DESTROY, which lws sends to protocols[0] */
        return 0;
    }
}

/* The first protocol serves plain HTTP: 404 for everything, and a ws that did not ask for "sepal" (lws
 * binds those to protocol 0) is refused during the handshake. Every wsi's end comes here too. */
static int srv_http_cb(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len)
{
    (void)user;
    (void)in;
    (void)len;
    switch (reason) {
    case LWS_CALLBACK_HTTP_CONFIRM_UPGRADE:
        return tp_confirm_upgrade(wsi);
    case LWS_CALLBACK_HTTP:
        lws_return_http_status(wsi, HTTP_STATUS_NOT_FOUND, NULL);
        return -1;
    case LWS_CALLBACK_WSI_DESTROY: {
        conn *c = lws_get_opaque_user_data(wsi);
        if (c)
            srv_ws_gone(lws_context_user(lws_get_context(wsi)), c);
        return 0;
    }
    case LWS_CALLBACK_FILTER_PROTOCOL_CONNECTION: /* refused before the 101 */
    case LWS_CALLBACK_HTTP_BODY:
    case LWS_CALLBACK_ESTABLISHED:
    case LWS_CALLBACK_RECEIVE:
        return -1;
    default:
        return 0;
    }
}

/* The listening socket, polled by lws as a raw file. */
static int srv_listen_cb(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len)
{
    (void)user;
    (void)in;
    (void)len;
    if (reason == LWS_CALLBACK_RAW_RX_FILE)
        srv_accept(lws_context_user(lws_get_context(wsi)));
    return 0;
}

static void *srv_svc_main(void *arg)
{
    sp_ws_server *s = arg;
    pthread_setname_np(pthread_self(), "sp-ws-srv");
    while (!atomic_load(&s->svc_stop))
        if (lws_service(s->ctx, 0) < 0) {
            sp_log(SP_LOG_ERROR, "transport: the lws service loop failed; the server stops serving ws");
            break;
        }
    return NULL;
}

/* ---------------------------------------------------------------------------------------------- */
/* setup */

/* The websocket listener on host:port (IPv4; "0.0.0.0" for every interface). */
static sp_status ws_listen(sp_ws_server *s, sp_err *err)
{
    sp_status st = tp_listen(s->host, s->o.port, 512, &s->ws_fd, &s->port, err);
    if (st) {
        sp_err_prefix(err, "cannot listen on ");
        return st;
    }
    s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    return SP_OK;
}

/* Hardening for 4.1.6 (reliability-anchors §3.4): our own IPv4 listener (the bind address is the one asked for),
 * no extensions, small header limits, a header pool larger than the handshakes allowed at once (so a connection
 * that passed the caps gets one at once), lws's own timeouts behind ours, TCP keepalive. */
static sp_status srv_create_context(sp_ws_server *s, sp_err *err)
{
    s->protocols[0] = (struct lws_protocols){.name = "http", .callback = srv_http_cb};
    s->protocols[1] = (struct lws_protocols){.name = "sepal",
                                             .callback = srv_ws_cb,
                                             .per_session_data_size = sizeof(conn *),
                                             .rx_buffer_size = FRAG_SIZE,
                                             .tx_packet_size = FRAG_SIZE};
    s->protocols[2] = (struct lws_protocols){.name = "sepal-listen", .callback = srv_listen_cb};
    struct lws_context_creation_info info;
    memset(&info, 0, sizeof info);
    info.port = CONTEXT_PORT_NO_LISTEN_SERVER;
    info.protocols = s->protocols;
    info.extensions = NULL;
    info.options = LWS_SERVER_OPTION_DISABLE_IPV6 | LWS_SERVER_OPTION_SKIP_SERVER_CANONICAL_NAME;
    info.user = s;
    info.vhost_name = "sepal";
    info.server_string = "sepal";
    info.pt_serv_buf_size = FRAG_SIZE;
    info.max_http_header_data = 1024;
    info.max_http_header_pool = (unsigned short)(s->o.max_pending + 16 < 65535 ? s->o.max_pending + 16 : 65535);
    info.timeout_secs = 10;
    info.timeout_secs_ah_idle = 10;
    info.ka_time = 60;
    info.ka_probes = 3;
    info.ka_interval = 10;
    s->ctx = lws_create_context(&info);
    s->vh = s->ctx ? lws_get_vhost_by_name(s->ctx, "sepal") : NULL;
    if (!s->vh)
        return sp_errf(err, SP_ERR_IO, "cannot start the websocket server (lws context)");
    lws_sock_file_fd_type fd = {.filefd = s->ws_fd};
    s->ws_listen_wsi = lws_adopt_descriptor_vhost(s->vh, LWS_ADOPT_RAW_FILE_DESC, fd, "sepal-listen", NULL);
    if (!s->ws_listen_wsi)
        return sp_errf(err, SP_ERR_IO, "cannot poll the listening socket");
    s->ws_fd_owned_by_lws = 1;
    lws_sul_schedule(s->ctx, 0, &s->sweep, srv_sweep, SWEEP_US);
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
    tp_resolve_limits(s);
    if (s->o.key) {
        s->key = *s->o.key;
        s->has_key = 1;
    }
    s->o.key = NULL;
    s->lim = tp_limits_for(&s->o);
    if (s->lim.max_message > s->o.rx_budget_conn) /* a message its connection's share cannot hold: refused at once */
        s->lim.max_message = s->o.rx_budget_conn;
    s->on_message = on_message;
    s->on_close = on_close;
    s->user = user;
    s->listen_fd = s->wake_fd = s->ws_fd = s->spare_fd = s->bulk_spare_fd = -1;
    s->bulk_port = -1;
    pthread_mutex_init(&s->mu, NULL);
    sp_status st = SP_OK;
    if (s->o.port < 0 || s->o.port > 65535 || s->o.bulk_port < -1 || s->o.bulk_port > 65535)
        st = sp_errf(err, SP_ERR_ARG, "bad port %d / bulk port %d", s->o.port, s->o.bulk_port);
    if (!st)
        st = ws_listen(s, err);
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

/* ---------------------------------------------------------------------------------------------- */
/* the API */

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
    conn *c = tp_find_conn(s, id);
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
    int wake_b = 0, fail = 0, bad = 0, direct = 0;
    uint64_t len = msg->len;
    pthread_mutex_lock(&s->mu);
    conn *c = s->stopping ? NULL : tp_find_conn(s, id);
    if (!c || c->dead)
        fail = 1;
    else if (c->bulk && msg->len >= s->o.bulk_threshold && tp_bulk_send_direct(s, c, msg))
        direct = 1; /* sent (or its rest queued and charged); c not touched again: the lock was let go meanwhile,
                     * and the bulk sweep may have closed its socket and freed it since */
    else if (c->bulk && msg->len >= s->o.bulk_threshold)
        bad = tp_msgq_push(&c->bulk->txq, msg), wake_b = !bad;
    else if (!(bad = tp_msgq_push(&c->txq, msg)))
        tp_flag(s, c);
    if (!fail && !bad && !direct)
        tp_charge(s, c, 0, (int64_t)len);
    pthread_mutex_unlock(&s->mu);
    if (fail) {
        sp_buf_free(msg);
        return sp_errf(err, SP_ERR_CLOSED, "connection %llu is closed", (unsigned long long)id);
    }
    if (bad)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory queueing a message");
    if (wake_b && !tp_on_bulk_thread(s))
        tp_wake_bulk(s);
    return SP_OK;
}

void sp_ws_server_close(sp_ws_server *s, uint64_t id)
{
    if (!s)
        return;
    int wake_b = 0;
    pthread_mutex_lock(&s->mu);
    conn *c = s->stopping ? NULL : tp_find_conn(s, id);
    if (c) {
        c->dead = 1;
        if (c->wsi) {
            c->close_req = 1;
            tp_flag(s, c);
        }
        if (c->bulk)
            wake_b = c->bulk->kill = 1;
    }
    pthread_mutex_unlock(&s->mu);
    if (wake_b)
        tp_wake_bulk(s);
}

void sp_ws_server_release(sp_ws_server *s, uint64_t id, uint64_t bytes)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    conn *c = tp_find_conn(s, id);
    if (c && c->pins > 0) {
        c->pins--;
        tp_charge(s, c, -(int64_t)bytes, 0);
        conn_free_if_done(s, c);
    }
    pthread_mutex_unlock(&s->mu);
}

void sp_ws_server_hold(sp_ws_server *s, uint64_t id, int delta)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    conn *c = tp_find_conn(s, id);
    if (c)
        c->holds = c->holds + delta < 0 ? 0 : c->holds + delta;
    pthread_mutex_unlock(&s->mu);
}

double sp_ws_server_rx_take(sp_ws_server *s, uint64_t id)
{
    if (!s)
        return 0;
    pthread_mutex_lock(&s->mu);
    conn *c = tp_find_conn(s, id);
    double r = c ? c->rx_mbit : 0;
    if (c)
        c->rx_mbit = 0;
    pthread_mutex_unlock(&s->mu);
    return r;
}

uint64_t sp_ws_server_peer(sp_ws_server *s, uint64_t id)
{
    if (!s)
        return 0;
    uint8_t addr[16] = {0};
    pthread_mutex_lock(&s->mu);
    conn *c = tp_find_conn(s, id);
    int found = c != NULL;
    if (c && c->src)
        memcpy(addr, c->src->addr, sizeof addr);
    pthread_mutex_unlock(&s->mu);
    uint64_t key = 14695981039346656037ull; /* FNV-1a of the 16 bytes (IPv4 as IPv4-mapped IPv6) */
    for (int i = 0; i < 16; i++)
        key = (key ^ addr[i]) * 1099511628211ull;
    return found ? (key ? key : 1) : 0;
}

void sp_ws_server_stats_get(sp_ws_server *s, sp_ws_server_stats *st)
{
    pthread_mutex_lock(&s->mu);
    *st = s->st;
    st->limits = s->o;
    st->conns = s->live;
    st->pending = s->pending;
    st->budget_used = s->used;
    pthread_mutex_unlock(&s->mu);
}

/* Waits until no thread writes on a bulk socket directly (tp_bulk_send_direct): with stopping set none starts. */
static void wait_direct_writers(sp_ws_server *s)
{
    for (int busy = 1; busy;) {
        busy = 0;
        pthread_mutex_lock(&s->mu);
        for (size_t i = 0; i < s->nsocks; i++)
            busy |= s->socks[i]->direct;
        pthread_mutex_unlock(&s->mu);
        if (busy)
            nanosleep(&(struct timespec){0, 1000000L}, NULL);
    }
}

/* Order matters: new sends are refused first; the bulk thread stops, and direct writers finish, before the bulk
 * sockets close; the bulk thread stops before the lws context goes away (it calls lws_cancel_service); destroying
 * the context closes every ws, which reports on_close. */
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
    wait_direct_writers(s);
    while (s->nsocks)
        tp_bulk_close(s, s->socks[--s->nsocks]);
    if (s->svc_started) {
        atomic_store(&s->svc_stop, 1);
        lws_cancel_service(s->ctx);
        pthread_join(s->svc, NULL);
    }
    if (s->ctx)
        lws_context_destroy(s->ctx); /* WSI_DESTROY for every wsi: each conn lets go of its ws */
    /* Nothing should be left but conns pinned by messages the app never released; they are freed here. */
    while (s->nconns) {
        conn *c = s->conns[s->nconns - 1];
        stash_free(c);
        tp_tx_reset(&c->tx);
        tp_rxasm_reset(&c->rx);
        tp_msgq_clear(&c->txq);
        int report = c->opened && !c->reported;
        if (report)
            s->on_close(s->user, c->id);
        tp_conn_remove(s, c);
        free(c);
    }
    for (size_t i = 0; i < s->nsrcs; i++)
        free(s->srcs[i]);
    if (s->ws_fd >= 0 && !s->ws_fd_owned_by_lws)
        close(s->ws_fd);
    if (s->spare_fd >= 0)
        close(s->spare_fd);
    if (s->bulk_spare_fd >= 0)
        close(s->bulk_spare_fd);
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    if (s->wake_fd >= 0)
        close(s->wake_fd);
    free(s->conns);
    free(s->ids);
    free(s->wakeq);
    free(s->srcs);
    free(s->socks);
    free(s->scratch);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
