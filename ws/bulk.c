/* bulk.c - the bulk channel: a plain TCP socket beside each websocket for large messages (lws 4.1.6 parses
 * received ws payloads a byte at a time). The server serves its bulk sockets from one poll() thread; a client
 * writes from the sending thread and reads on a reader thread, or with direct_recv on the caller's thread.
 * Attaching: "SPBK" + u32 0 + u64 token from the client, "SPBK" + u32 status + u64 0 back (transport.h). */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "timeutil.h"
#include "trace.h"
#include "transport_impl.h"

/* ---------------------------------------------------------------------------------------------- */
/* the arrival rate of large messages, either side */

/* After a read on fd went into rs (want_before: rs->want before it; st: what tp_rxstream_advance said; out: the
 * message when it is RX_DONE): once the header of a message large enough to be measured is in (and admitted, on a
 * server), the clock starts and the bytes already waiting are noted; when the message is complete, its rate over the
 * bytes that arrived meanwhile, in Mbit/s, is returned. 0: no measurement (none complete, or too few such bytes). */
static double rx_pace_note(rx_pace *p, int fd, const rxstream *rs, uint64_t want_before, int st, const sp_buf *out)
{
    if (st == RX_DONE) {
        uint64_t t0 = p->t0, body = out->len > HDR ? out->len - HDR : 0;
        p->t0 = 0;
        uint64_t paced = body > p->queued ? body - p->queued : 0, dt = t0 ? sp_now_ns() - t0 : 0;
        if (!t0 || paced < SP_RX_PACE_MIN || !dt)
            return 0;
        return (double)paced * 8e3 / (double)dt; /* bits per ns * 1e3 = Mbit/s */
    }
    if (!want_before && rs->want >= HDR + SP_RX_PACE_MIN) { /* (smaller ones, decode steps: not a syscall) */
        int q = 0;
        p->t0 = sp_now_ns();
        p->queued = ioctl(fd, FIONREAD, &q) == 0 && q > 0 ? (uint64_t)q : 0;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* server: the bulk thread */

static __thread const sp_ws_server *tl_bulk_thread_of; /* set in the bulk thread: the server it serves */

int tp_on_bulk_thread(const sp_ws_server *s) { return tl_bulk_thread_of == s; }

void tp_wake_bulk(sp_ws_server *s)
{
    uint64_t one = 1;
    if (s->wake_fd >= 0 && write(s->wake_fd, &one, sizeof one) < 0 && errno != EAGAIN)
        sp_log(SP_LOG_WARN, "transport: bulk wake-up failed: %s", strerror(errno));
}

static sp_log_limit g_bulk_log, g_bulk_fd_log;

/* A bulk socket turned away before its preamble is read: the answer the client's handshake reads ("SPBK" + status:
 * BULK_REFUSED or BULK_BUSY), one non-blocking send, then the close. */
static void bulk_answer_fd(int fd, uint32_t status)
{
    uint8_t no[BULK_PREAMBLE] = {'S', 'P', 'B', 'K'};
    put_le32(no + 4, status);
    ssize_t w = send(fd, no, sizeof no, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w;
    close(fd);
}

static void bulk_refuse_fd(int fd) { bulk_answer_fd(fd, BULK_REFUSED); }

/* accept failed: out of descriptors, what waits is refused with the spare's help; when even that cannot be
 * done, or another error persists, the listener rests LISTEN_PAUSE_NS (it is level-triggered: polled again at
 * once, it would spin). */
static void bulk_accept_failed(sp_ws_server *s, int e)
{
    if (e == EAGAIN || e == EWOULDBLOCK || e == EINTR || e == ECONNABORTED)
        return;
    int n = -1;
    if (e == EMFILE || e == ENFILE) {
        n = tp_shed(s->listen_fd, &s->bulk_spare_fd, bulk_refuse_fd);
        pthread_mutex_lock(&s->mu);
        s->st.out_of_fds += n > 0 ? (uint64_t)n : 0;
        s->st.bulk_refused += n > 0 ? (uint64_t)n : 0;
        pthread_mutex_unlock(&s->mu);
        sp_log_limited(&g_bulk_fd_log, SP_LOG_WARN, "transport: out of file descriptors (%s): refusing bulk sockets",
                       strerror(e));
    } else {
        sp_log_limited(&g_bulk_fd_log, SP_LOG_WARN, "transport: bulk accept: %s", strerror(e));
    }
    if (n < 0)
        s->bulk_listen_rest_ns = sp_now_ns() + LISTEN_PAUSE_NS;
}

/* What a fresh (non-blocking) socket has sent of its preamble, without waiting: the bytes into pre, their count;
 * -1 when the peer closed or failed first. */
static int bulk_read_preamble(int fd, uint8_t pre[BULK_PREAMBLE])
{
    size_t got = 0;
    while (got < BULK_PREAMBLE) {
        ssize_t r = recv(fd, pre + got, BULK_PREAMBLE - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return (int)got;
}

static void bulk_attach(sp_ws_server *s, bsock *b);

/* A new bulk socket is read at once: a client sends its token as soon as it is connected, so one whose preamble is
 * already there is attached (or refused) here and never waits. One whose preamble is not all there waits for it,
 * as a ws connection for its upgrade: at most min(BULK_MAX_PENDING, max_pending) such, min(BULK_PENDING_PER_IP,
 * max_pending_per_ip) from one address, each for handshake_timeout_s; over a cap it is answered BULK_BUSY and
 * closed at once (the client tries again shortly with the same token). Before, every socket of an accept round
 * (up to 64) counted as waiting until the next poll round read it, so 64 sessions opened at once from one address
 * had all sent their tokens and still 18 of them were refused (bench_serve --sessions 64). */
static void bulk_accept(sp_ws_server *s)
{
    int cap = s->o.max_pending < BULK_MAX_PENDING ? s->o.max_pending : BULK_MAX_PENDING;
    int cap_ip = s->o.max_pending_per_ip < BULK_PENDING_PER_IP ? s->o.max_pending_per_ip : BULK_PENDING_PER_IP;
    uint64_t deadline = (uint64_t)(s->o.handshake_timeout_s * 1e9);
    for (int k = 0; k < 64; k++) {
        struct sockaddr_storage sa;
        socklen_t sl = sizeof sa;
        int fd = tp_accept(s->listen_fd, (struct sockaddr *)&sa, &sl);
        if (fd < 0) {
            bulk_accept_failed(s, errno);
            return;
        }
        uint8_t addr[16], pre[BULK_PREAMBLE];
        tp_addr_of((struct sockaddr *)&sa, addr);
        int got = bulk_read_preamble(fd, pre);
        if (got < 0) { /* gone before it said anything useful */
            close(fd);
            continue;
        }
        int waits = got < BULK_PREAMBLE, pending = 0;
        for (size_t i = 0; waits && i < s->nsocks; i++)
            pending += s->socks[i]->c == NULL && s->socks[i]->src != NULL;
        bsock *b = calloc(1, sizeof *b);
        pthread_mutex_lock(&s->mu);
        src_entry *e = b && waits ? tp_src_get(s, addr) : NULL;
        int from_ip = e ? e->bulk_pending : 0;
        int busy = waits && (pending >= cap || from_ip >= cap_ip);
        int ok = b && (!waits || (e && !busy)) &&
                 !tp_grow((void **)&s->socks, &s->capsocks, s->nsocks + 1, sizeof *s->socks);
        if (ok && e) {
            e->bulk_pending++;
            b->src = e;
        } else if (!ok) {
            s->st.refused++;
            s->st.bulk_refused++;
            tp_src_put(s, e);
        }
        pthread_mutex_unlock(&s->mu);
        if (!ok) {
            char name[48];
            tp_src_name(addr, name, sizeof name);
            if (busy)
                sp_log_limited(&g_bulk_log, SP_LOG_WARN, "transport: bulk socket from %s told to retry: %d from it "
                               "(%d in all) waiting for their token", name, from_ip, pending);
            else
                sp_log_limited(&g_bulk_log, SP_LOG_WARN, "transport: refused a bulk socket from %s: out of memory",
                               name);
            free(b);
            bulk_answer_fd(fd, busy ? BULK_BUSY : BULK_REFUSED);
            continue;
        }
        tp_tune_socket(fd);
        b->fd = fd;
        b->server = s;
        b->rx.map_from = MAP_FROM;
        b->deadline_ns = sp_now_ns() + deadline;
        memcpy(b->pre, pre, (size_t)got);
        b->prelen = (size_t)got;
        s->socks[s->nsocks++] = b; /* (polled from the next round on; the sweep closes it if it is refused now) */
        if (!waits)
            bulk_attach(s, b);
    }
}

/* The preamble is complete: bind the socket to the conn holding the token (one use), and answer "SPBK" + status
 * (BULK_ACCEPTED, or BULK_REFUSED: a bad preamble, an unknown or used token) + 8 zero bytes. The answer goes
 * straight out: the socket is fresh, nothing else can be queued on it yet, and 16 bytes always fit its buffer. */
static void bulk_attach(sp_ws_server *s, bsock *b)
{
    uint64_t token = le64(b->pre + 8);
    conn *c = NULL;
    if (memcmp(b->pre, "SPBK", 4) == 0 && le32(b->pre + 4) == 0 && token != 0) {
        pthread_mutex_lock(&s->mu);
        for (size_t i = 0; i < s->nconns && !c; i++) {
            conn *x = s->conns[i];
            if (x->token == token && !x->dead && !x->bulk)
                c = x;
        }
        if (c) {
            c->token = 0;
            c->bulk = b;
            c->refs++;
            b->c = c;
            if (b->src) { /* (one attached as it was accepted never waited) */
                b->src->bulk_pending--;
                tp_src_put(s, b->src);
                b->src = NULL;
            }
        }
        pthread_mutex_unlock(&s->mu);
    }
    if (!c) {
        pthread_mutex_lock(&s->mu);
        s->st.bulk_refused++;
        pthread_mutex_unlock(&s->mu);
    }
    uint8_t ack[BULK_PREAMBLE] = {'S', 'P', 'B', 'K'};
    put_le32(ack + 4, c ? BULK_ACCEPTED : BULK_REFUSED);
    if (send(b->fd, ack, sizeof ack, MSG_NOSIGNAL) != (ssize_t)sizeof ack || !c) {
        if (!c)
            sp_log_limited(&g_bulk_log, SP_LOG_WARN, "transport: bulk socket refused: bad preamble or unknown/used token");
        b->dead = 1;
        return;
    }
    atomic_store(&c->last_ns, sp_now_ns());
}

/* tp_admit_fn for a bulk socket (bulk thread). */
static int bulk_admit(void *u, uint64_t total, int *code, sp_err *err)
{
    bsock *b = u;
    conn *c = b->c;
    sp_ws_server *s = b->server;
    uint64_t now = sp_now_ns();
    pthread_mutex_lock(&s->mu);
    int r = tp_admit(s, c, total);
    uint64_t share = s->o.rx_budget_conn;
    if (r == 1) {
        b->reserved = total;
        b->msg_deadline_ns = s->o.min_rate > 0 ? now + MSG_GRACE_NS + (uint64_t)((double)total / s->o.min_rate * 1e9) : 0;
    }
    if (r == 0 && !b->wait_ns) {
        b->wait_ns = now;
        b->wait_reqid = le64(b->rx.hdr + 16);
        s->waiting++;
        s->st.waits++;
    } else if (r != 0 && b->wait_ns) {
        b->wait_ns = 0;
        s->waiting--;
    }
    pthread_mutex_unlock(&s->mu);
    if (r < 0) {
        *code = LWS_CLOSE_STATUS_MESSAGE_TOO_LARGE;
        sp_errf(err, SP_ERR_RANGE, "message of %llu bytes exceeds this connection's budget of %llu bytes",
                (unsigned long long)total, (unsigned long long)share);
    }
    return r;
}

/* A message of an attached socket: RX_WAIT leaves the socket unread until there is budget for it. */
static int bulk_take(sp_ws_server *s, bsock *b, size_t got)
{
    sp_buf msg;
    sp_err err = {0};
    int code = 0;
    uint64_t want_before = b->rx.want;
    int st = tp_rxstream_advance(&b->rx, got, &s->lim, bulk_admit, b, &msg, &code, &err);
    double mbit = rx_pace_note(&b->pace, b->fd, &b->rx, want_before, st, &msg);
    if (got)
        atomic_store(&b->c->last_ns, sp_now_ns());
    if (st == RX_BAD) {
        sp_log_limited(&g_bulk_log, SP_LOG_WARN, "transport: conn %llu bulk socket closed: %s",
                       (unsigned long long)b->c->id, err.msg);
        b->dead = 1;
    } else if (st == RX_DONE) {
        pthread_mutex_lock(&s->mu);
        b->reserved = 0; /* the charge goes with the message */
        b->msg_deadline_ns = 0;
        if (mbit > 0) /* before the delivery: a reply to this message finds it */
            b->c->rx_mbit = mbit;
        pthread_mutex_unlock(&s->mu);
        tp_deliver(s, b->c, &msg, 0);
    }
    return st;
}

/* Reads what is there (up to a budget) and delivers complete messages under the ws conn's id. */
static void bulk_read(sp_ws_server *s, bsock *b)
{
    if (b->c && b->rx.hlen == HDR && !b->rx.want && bulk_take(s, b, 0) == RX_WAIT)
        return; /* still no room */
    size_t budget = BULK_READ_BUDGET;
    while (budget && !b->dead) {
        uint8_t *p;
        size_t n;
        if (!b->c) {
            p = b->pre + b->prelen;
            n = BULK_PREAMBLE - b->prelen;
        } else {
            tp_rxstream_target(&b->rx, &p, &n);
        }
        ssize_t r = recv(b->fd, p, n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (r <= 0) {
            b->dead = 1; /* EOF or error */
            return;
        }
        budget -= (size_t)r < budget ? (size_t)r : budget;
        if (!b->c) {
            b->prelen += (size_t)r;
            if (b->prelen == BULK_PREAMBLE)
                bulk_attach(s, b);
        } else if (bulk_take(s, b, (size_t)r) == RX_WAIT) {
            return;
        }
    }
}

/* Writes queued output until the socket is full (none while another thread writes directly). */
static void bulk_write(sp_ws_server *s, bsock *b)
{
    while (!b->dead) {
        if (!b->busy) {
            pthread_mutex_lock(&s->mu);
            b->busy = !b->direct && tp_msgq_pop(&b->txq, &b->cur);
            b->tx_charge = b->busy ? b->cur.len : 0;
            pthread_mutex_unlock(&s->mu);
            if (!b->busy)
                return;
            b->cur_off = 0;
        }
        size_t left = b->cur.len - b->cur_off;
        ssize_t w = left ? send(b->fd, b->cur.data + b->cur_off, left, MSG_NOSIGNAL) : 0;
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (w < 0) {
            b->dead = 1;
            return;
        }
        b->cur_off += (size_t)w;
        if (b->cur_off == b->cur.len) {
            sp_buf_free(&b->cur);
            pthread_mutex_lock(&s->mu);
            b->busy = 0;
            if (b->c)
                tp_charge(s, b->c, 0, -(int64_t)b->tx_charge);
            b->tx_charge = 0;
            pthread_mutex_unlock(&s->mu);
            if (b->c)
                atomic_store(&b->c->last_ns, sp_now_ns());
        }
    }
}

/* Writes msg on c's bulk socket from the calling thread, when the socket has nothing queued or being written and
 * msg is small (mu held on entry; held again on return): 1 if msg was taken (sent whole, or what the socket did
 * not take queued first for the bulk thread), 0 if the caller queues it; after 1, c and its socket may be gone (mu
 * was let go: the sweep closes a dead socket once no one writes on it), and the caller does not touch them. A reply
 * sent from a worker thus goes out at once instead of after the bulk thread's wake-up (one hand-off between threads
 * less a hop). */
int tp_bulk_send_direct(sp_ws_server *s, conn *c, sp_buf *msg)
{
    bsock *b = c->bulk;
    if (!b || b->busy || b->direct || b->kill || b->txq.head || msg->len > TP_DIRECT_MAX || tp_on_bulk_thread(s))
        return 0;
    b->direct = 1;
    pthread_mutex_unlock(&s->mu);
    size_t off = 0;
    int failed = 0;
    while (off < msg->len) {
        ssize_t w = send(b->fd, msg->data + off, msg->len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            failed = errno != EAGAIN && errno != EWOULDBLOCK;
            break;
        }
        off += (size_t)w;
    }
    uint64_t rest = msg->len - off;
    if (!rest)
        atomic_store(&c->last_ns, sp_now_ns());
    if (off > 0 && rest) { /* the rest, first in the queue */
        memmove(msg->data, msg->data + off, rest);
        msg->len = rest;
    }
    if (!rest)
        sp_buf_free(msg);
    pthread_mutex_lock(&s->mu);
    b->direct = 0;
    if (failed)
        b->kill = 1;
    if (rest && !failed && !tp_msgq_push_front(&b->txq, msg))
        tp_charge(s, c, 0, (int64_t)rest);
    sp_buf_free(msg); /* (taken by the queue, or not to be sent) */
    int wake = failed || b->txq.head;
    pthread_mutex_unlock(&s->mu);
    if (wake)
        tp_wake_bulk(s);
    pthread_mutex_lock(&s->mu);
    return 1;
}

/* Closes a bulk socket; an attached conn loses its ws too (one logical connection). */
void tp_bulk_close(sp_ws_server *s, bsock *b)
{
    conn *c = b->c;
    int last = 0;
    pthread_mutex_lock(&s->mu);
    uint64_t out = tp_msgq_clear(&b->txq) + b->tx_charge;
    if (c) {
        tp_charge(s, c, -(int64_t)b->reserved, -(int64_t)out);
        if (b->wait_ns)
            s->waiting--;
        c->bulk = NULL;
        c->dead = 1;
        if (c->wsi) {
            c->close_req = 1;
            tp_flag(s, c);
        }
        last = tp_conn_let_go(c);
        b->c = NULL;
    }
    if (b->src) {
        b->src->bulk_pending--;
        tp_src_put(s, b->src);
        b->src = NULL;
    }
    pthread_mutex_unlock(&s->mu);
    close(b->fd);
    sp_buf_free(&b->rx.buf);
    sp_buf_free(&b->cur);
    free(b);
    if (c)
        tp_conn_release(s, c, last);
}

/* Fills the pollfd array: the wake-up eventfd, the listener, then every socket (POLLOUT only with output
 * pending). Kill requests from other threads are picked up here. Returns the poll timeout in ms. */
static int bulk_prepare(sp_ws_server *s, struct pollfd *pfd)
{
    uint64_t now = sp_now_ns(), next = now + 1000000000ull;
    if (s->bulk_listen_rest_ns && now >= s->bulk_listen_rest_ns)
        s->bulk_listen_rest_ns = 0;
    if (s->bulk_listen_rest_ns) /* resting after accept failed: not polled until then */
        next = s->bulk_listen_rest_ns;
    pfd[0] = (struct pollfd){.fd = s->wake_fd, .events = POLLIN};
    pfd[1] = (struct pollfd){.fd = s->bulk_listen_rest_ns ? -1 : s->listen_fd, .events = POLLIN};
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->nsocks; i++) {
        bsock *b = s->socks[i];
        if (b->kill)
            b->dead = 1;
        /* not read while its message waits for budget, or its conn's output is over tx_bound */
        short ev = b->wait_ns || (b->c && b->c->out_full) ? 0 : POLLIN;
        if ((b->busy || b->txq.head) && !b->direct) /* (the direct writer wakes this thread when it is done) */
            ev |= POLLOUT;
        if (b->wait_ns && s->waiting) /* budget may have been freed: look again soon */
            next = now + 20000000ull < next ? now + 20000000ull : next;
        pfd[2 + i] = (struct pollfd){.fd = b->fd, .events = ev};
        if (!b->c && b->deadline_ns < next)
            next = b->deadline_ns;
    }
    pthread_mutex_unlock(&s->mu);
    return next <= now ? 0 : (int)((next - now) / 1000000 + 1);
}

/* Closes dead sockets and those that did not present a token in time. */
static void bulk_sweep(sp_ws_server *s)
{
    uint64_t now = sp_now_ns();
    for (size_t i = 0; i < s->nsocks;) {
        bsock *b = s->socks[i];
        if (!b->c && !b->dead && now > b->deadline_ns) {
            b->dead = 1;
            pthread_mutex_lock(&s->mu);
            s->st.bulk_timeouts++;
            char who[48];
            snprintf(who, sizeof who, "%s", b->src ? b->src->name : "?");
            pthread_mutex_unlock(&s->mu);
            sp_log_limited(&g_bulk_log, SP_LOG_WARN, "transport: bulk socket from %s closed: no token within %.3g s",
                           who, s->o.handshake_timeout_s);
        }
        /* decided under mu, and marked killed there, so that no direct writer starts on it before tp_bulk_close
         * unlinks it (tp_bulk_send_direct refuses a killed socket); one on its fd now: closed at a later sweep */
        pthread_mutex_lock(&s->mu);
        int closing = b->dead && !b->direct;
        if (closing)
            b->kill = 1;
        pthread_mutex_unlock(&s->mu);
        if (closing) {
            s->socks[i] = s->socks[--s->nsocks];
            tp_bulk_close(s, b);
        } else {
            i++;
        }
    }
}

void *tp_bulk_main(void *arg)
{
    sp_ws_server *s = arg;
    pthread_setname_np(pthread_self(), "sp-bulk-srv");
    tl_bulk_thread_of = s;
    struct pollfd *pfd = NULL;
    size_t cap = 0;
    while (!atomic_load(&s->bulk_stop)) {
        size_t n = 2 + s->nsocks;
        if (tp_grow((void **)&pfd, &cap, n, sizeof *pfd)) {
            sp_log(SP_LOG_ERROR, "transport: out of memory in the bulk thread");
            poll(NULL, 0, 100);
            continue;
        }
        int timeout = bulk_prepare(s, pfd);
        if (poll(pfd, (nfds_t)n, timeout) < 0 && errno != EINTR)
            break;
        if (pfd[0].revents & POLLIN) {
            uint64_t v;
            if (read(s->wake_fd, &v, sizeof v) < 0 && errno != EAGAIN)
                break;
        }
        size_t polled = n - 2; /* sockets accepted below are polled next round */
        if (pfd[1].revents & POLLIN)
            bulk_accept(s);
        for (size_t i = 0; i < polled; i++) {
            bsock *b = s->socks[i];
            short re = pfd[2 + i].revents;
            int was_read = 0;
            if (re & POLLIN)
                SP_TRACE(SP_TR_SRV_WOKE);
            if (!b->dead && ((re & (POLLIN | POLLHUP | POLLERR)) || b->wait_ns))
                bulk_read(s, b), was_read = 1;
            /* a reply the app sent from this thread while it read (an inline request) goes out now, not after
             * another round of poll */
            if (!b->dead && ((re & POLLOUT) || was_read))
                bulk_write(s, b);
        }
        bulk_sweep(s);
        sp_log_limited_flush(&g_bulk_log);
        sp_log_limited_flush(&g_bulk_fd_log);
        tp_spare_retake(&s->bulk_spare_fd); /* if it was lost while shedding: taken back when one is free */
    }
    free(pfd);
    return NULL;
}

/* Binds the bulk listener on host:port (IPv4; "0.0.0.0" for every interface). */
sp_status tp_bulk_listen(sp_ws_server *s, sp_err *err)
{
    sp_status st = tp_listen(s->host, s->o.bulk_port, 64, &s->listen_fd, &s->bulk_port, err);
    if (st) {
        sp_err_prefix(err, "bulk listener ");
        return st;
    }
    s->bulk_spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    return SP_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* client: the bulk socket */

/* Binds fd (of family fam) to the numeric address source, any port: where its connection comes from. -1 with
 * errno set. */
static int bind_source(int fd, int fam, const char *source)
{
    struct addrinfo hints = {.ai_family = fam, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST}, *ai = NULL;
    if (getaddrinfo(source, NULL, &hints, &ai) || !ai) {
        errno = EADDRNOTAVAIL;
        return -1;
    }
    int rc = bind(fd, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
    return rc;
}

/* Connects a TCP socket (from source unless "") with a deadline (non-blocking connect + poll), left in blocking mode. */
static int tcp_connect(const char *host, int port, const char *source, int timeout_ms, sp_err *err)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai, *a;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &ai), fd = -1, e = ECONNREFUSED;
    if (rc) {
        sp_errf(err, SP_ERR_IO, "bulk channel %s:%d: %s", host, port, gai_strerror(rc));
        return -1;
    }
    for (a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        if (source[0] && bind_source(fd, a->ai_family, source)) {
            e = errno;
            close(fd);
            fd = -1;
            continue;
        }
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0)
            break;
        if (errno == EINPROGRESS) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            socklen_t sl = sizeof e;
            int pr = poll(&p, 1, timeout_ms);
            if (pr == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &sl) == 0 && e == 0)
                break;
            if (pr == 0)
                e = ETIMEDOUT;
        } else {
            e = errno;
        }
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0)
        sp_errf(err, e == ETIMEDOUT ? SP_ERR_TIMEOUT : SP_ERR_IO, "bulk channel %s:%d: %s", host, port, strerror(e));
    else
        tp_set_nonblock(fd, 0);
    return fd;
}

static int write_all(int fd, const uint8_t *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Reads exactly n bytes, waiting at most until the deadline (blocking socket; poll gives the timeout). */
static int read_all_timed(int fd, uint8_t *p, size_t n, int timeout_ms)
{
    uint64_t end = sp_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (n) {
        uint64_t now = sp_now_ns();
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int left = now >= end ? 0 : (int)((end - now) / 1000000 + 1);
        if (poll(&pf, 1, left) != 1)
            return -1;
        ssize_t r = recv(fd, p, n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* Presents the token and waits for the server's verdict, until end_ns. *busy: the server answered BULK_BUSY (too
 * many sockets waiting for their token there: the token is still good, try again shortly). */
static sp_status bulk_handshake(sp_ws_client *c, int fd, int bulk_port, uint64_t token, uint64_t end_ns, int *busy,
                                sp_err *err)
{
    uint8_t pre[BULK_PREAMBLE] = {'S', 'P', 'B', 'K'}, ack[BULK_PREAMBLE];
    put_le64(pre + 8, token);
    *busy = 0;
    if (write_all(fd, pre, sizeof pre))
        return sp_errf(err, SP_ERR_IO, "bulk channel %s:%d: %s", c->host, bulk_port, strerror(errno));
    uint64_t now = sp_now_ns();
    int left = now >= end_ns ? 0 : (int)((end_ns - now + 999999) / 1000000);
    if (read_all_timed(fd, ack, sizeof ack, left))
        return sp_errf(err, SP_ERR_IO, "bulk channel %s:%d: no answer to the token", c->host, bulk_port);
    uint32_t status = le32(ack + 4);
    if (memcmp(ack, "SPBK", 4) == 0 && status == BULK_BUSY) {
        *busy = 1;
        return sp_errf(err, SP_ERR_BUSY, "bulk channel %s:%d: server busy (too many bulk sockets waiting for their "
                       "token)", c->host, bulk_port);
    }
    if (memcmp(ack, "SPBK", 4) != 0 || status != BULK_ACCEPTED)
        return sp_errf(err, SP_ERR_STATE, "bulk channel %s:%d: token refused", c->host, bulk_port);
    return SP_OK;
}

/* Connects and presents the token; answered busy, closes and tries again after a pause (5 ms doubling up to
 * 200 ms, drawn between half and all of it so that clients told so together spread out) while end_ns leaves
 * BULK_RETRY_ROOM_NS for the try after it. Returns the attached socket, or -1 with err set: SP_ERR_BUSY when the
 * server was still busy at the deadline (also when the last try ran out of time), else the last try's error. */
#define BULK_RETRY_ROOM_NS 50000000ull
static int bulk_open(sp_ws_client *c, int bulk_port, uint64_t token, uint64_t end_ns, sp_err *err /* not NULL */)
{
    uint64_t pause_ns = 5000000, seed = token ^ sp_now_ns();
    for (int tries = 1;; tries++) {
        uint64_t now = sp_now_ns();
        int left = now >= end_ns ? 0 : (int)((end_ns - now + 999999) / 1000000), busy = 0;
        int fd = tcp_connect(c->host, bulk_port, c->source, left, err);
        sp_status st = fd < 0 ? err->code : SP_OK;
        if (fd >= 0) {
            tp_tune_socket(fd);
            if (!(st = bulk_handshake(c, fd, bulk_port, token, end_ns, &busy, err)))
                return fd;
            close(fd);
        }
        int out_of_time = (st == SP_ERR_TIMEOUT || st == SP_ERR_IO) && sp_now_ns() >= end_ns;
        pthread_mutex_lock(&c->mu);
        int open = c->state == C_OPEN;
        pthread_mutex_unlock(&c->mu);
        uint64_t wait = 0;
        if (busy) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            wait = pause_ns / 2 + (seed >> 33) % (pause_ns / 2 + 1);
            pause_ns = pause_ns * 2 < 200000000ull ? pause_ns * 2 : 200000000ull;
        }
        if (open && tries > 1 && (busy || out_of_time) && sp_now_ns() + wait + BULK_RETRY_ROOM_NS > end_ns)
            sp_errf(err, SP_ERR_BUSY, "bulk channel %s:%d: server still busy after %d tries (too many bulk sockets "
                    "waiting for their token there)", c->host, bulk_port, tries);
        if (!busy || !open || sp_now_ns() + wait + BULK_RETRY_ROOM_NS > end_ns)
            return -1;
        struct timespec ts = {(time_t)(wait / 1000000000ull), (long)(wait % 1000000000ull)};
        while (nanosleep(&ts, &ts) && errno == EINTR)
            ;
    }
}

/* rx_pace_note on a client's bulk socket: its measurement becomes c's (sp_ws_client_rx_mbit). */
static void rx_pace_after(sp_ws_client *c, rx_pace *p, int fd, const rxstream *rs, uint64_t want_before, int st,
                          const sp_buf *out)
{
    double mbit = rx_pace_note(p, fd, rs, want_before, st, out);
    if (mbit <= 0)
        return;
    pthread_mutex_lock(&c->mu);
    c->rx_mbit = mbit;
    c->rx_seq++;
    pthread_mutex_unlock(&c->mu);
}

double sp_ws_client_rx_mbit(sp_ws_client *c, uint64_t *seq)
{
    pthread_mutex_lock(&c->mu);
    double r = c->rx_mbit;
    if (seq)
        *seq = c->rx_seq;
    pthread_mutex_unlock(&c->mu);
    return r;
}

/* Reads messages from the bulk socket until it ends; then the whole connection is over. */
static void *cli_reader_main(void *arg)
{
    sp_ws_client *c = arg;
    pthread_setname_np(pthread_self(), "sp-bulk-cli");
    int fd = c->bulk_fd; /* set before this thread started, never changed afterwards */
    rxstream rs = {0};
    rx_pace pace = {0};
    sp_err err = {0};
    const char *why = "bulk channel closed";
    for (;;) {
        uint8_t *p;
        size_t n;
        tp_rxstream_target(&rs, &p, &n);
        ssize_t r = recv(fd, p, n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        sp_buf msg;
        int code = 0;
        uint64_t want = rs.want;
        int st = tp_rxstream_advance(&rs, (size_t)r, &c->lim, NULL, NULL, &msg, &code, &err);
        rx_pace_after(c, &pace, fd, &rs, want, st, &msg);
        if (st == RX_BAD) {
            sp_log(SP_LOG_WARN, "transport: bulk channel to %s:%d closed: %s", c->host, c->port, err.msg);
            why = err.msg;
            break;
        }
        if (st == RX_DONE) { /* then no more reading while rx_queue_max bytes wait for recv */
            tp_cli_queue(c, &msg);
            pthread_mutex_lock(&c->mu);
            while (c->rx_full && c->state == C_OPEN)
                pthread_cond_wait(&c->cv, &c->mu);
            pthread_mutex_unlock(&c->mu);
        }
    }
    sp_buf_free(&rs.buf);
    tp_cli_fail(c, why);
    return NULL;
}

sp_status sp_ws_client_attach_bulk(sp_ws_client *c, int bulk_port, uint64_t token, int timeout_ms, sp_err *err)
{
    if (!c || bulk_port <= 0 || bulk_port > 65535)
        return sp_errf(err, SP_ERR_ARG, "sp_ws_client_attach_bulk: bad bulk port %d", bulk_port);
    pthread_mutex_lock(&c->mu);
    sp_status st = c->state != C_OPEN ? SP_ERR_CLOSED : c->bulk_fd >= 0 || c->attaching ? SP_ERR_STATE : SP_OK;
    c->attaching = st == SP_OK;
    pthread_mutex_unlock(&c->mu);
    if (st)
        return sp_errf(err, st, "bulk channel %s:%d: %s", c->host, bulk_port,
                       st == SP_ERR_CLOSED ? "connection is closed" : "already attached");
    sp_err oe = {0};
    int fd = bulk_open(c, bulk_port, token, tp_deadline_after(timeout_ms < 0 ? 60000 : timeout_ms), &oe);
    if (fd < 0) {
        st = oe.code ? oe.code : SP_ERR_IO;
        if (err)
            *err = oe;
    }
    pthread_mutex_lock(&c->mu);
    c->attaching = 0;
    if (!st && c->state != C_OPEN)
        st = sp_errf(err, SP_ERR_CLOSED, "bulk channel %s:%d: connection closed meanwhile", c->host, bulk_port);
    if (!st)
        c->bulk_fd = fd;
    pthread_mutex_unlock(&c->mu);
    if (st) {
        if (fd >= 0)
            close(fd);
        return st;
    }
    if (c->o.direct_recv && c->wake_fd >= 0)
        return SP_OK; /* sp_ws_client_recv reads the bulk socket itself */
    if (pthread_create(&c->reader, NULL, cli_reader_main, c)) {
        tp_cli_fail(c, "cannot start the bulk reader");
        return sp_errf(err, SP_ERR_NOMEM, "bulk channel %s:%d: cannot start the reader thread", c->host, bulk_port);
    }
    c->reader_started = 1;
    return SP_OK;
}

/* Bulk write from the sending thread (blocking; the server always drains its sockets). */
sp_status tp_cli_bulk_send(sp_ws_client *c, int fd, sp_buf *msg, sp_err *err)
{
    pthread_mutex_lock(&c->bulk_wmu);
    int bad = write_all(fd, msg->data, msg->len);
    pthread_mutex_unlock(&c->bulk_wmu);
    sp_buf_free(msg);
    if (bad) {
        tp_cli_fail(c, "bulk channel write failed");
        return sp_errf(err, SP_ERR_CLOSED, "connection to %s:%d: bulk channel closed", c->host, c->port);
    }
    return SP_OK;
}

/* Milliseconds left until abs_ns (0 = no deadline: -1). */
static int ms_left(uint64_t abs_ns)
{
    if (!abs_ns)
        return -1;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    uint64_t t = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
    return t >= abs_ns ? 0 : (int)((abs_ns - t + 999999) / 1000000);
}

/* direct_recv with the bulk socket attached: the caller polls the bulk socket and the wake eventfd itself, and
 * reassembles bulk messages on its own thread; websocket messages still come through rxq. */
/* The connection is closed: a whole message the server sent before it closed is still delivered (what the
 * socket holds, without waiting), then SP_ERR_CLOSED. */
static sp_status drain_closed(sp_ws_client *c, sp_buf *out, const char *why, sp_err *err)
{
    for (int fd = c->bulk_fd; fd >= 0;) {
        uint8_t *dst;
        size_t want;
        tp_rxstream_target(&c->drs, &dst, &want);
        ssize_t n = recv(fd, dst, want, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        sp_err e2 = {0};
        int code = 0;
        int st = tp_rxstream_advance(&c->drs, (size_t)n, &c->lim, NULL, NULL, out, &code, &e2);
        if (st == RX_BAD)
            break;
        if (st == RX_DONE)
            return SP_OK;
    }
    return sp_errf(err, SP_ERR_CLOSED, "connection to %s:%d closed (%s)", c->host, c->port, why);
}

sp_status tp_cli_recv_direct(sp_ws_client *c, sp_buf *out, int timeout_ms, sp_err *err)
{
    uint64_t until = timeout_ms < 0 ? 0 : tp_deadline_after(timeout_ms);
    for (;;) {
        pthread_mutex_lock(&c->mu);
        int got = tp_msgq_pop(&c->rxq, out), open = c->state == C_OPEN;
        if (got)
            tp_cli_taken_locked(c);
        char why[sizeof c->why];
        snprintf(why, sizeof why, "%s", c->why);
        pthread_mutex_unlock(&c->mu);
        if (got)
            return SP_OK;
        if (!open)
            return drain_closed(c, out, why, err);
        struct pollfd p[2] = {{.fd = c->bulk_fd, .events = POLLIN}, {.fd = c->wake_fd, .events = POLLIN}};
        int r = poll(p, 2, timeout_ms == 0 ? 0 : ms_left(until));
        if (r == 0)
            return sp_errf(err, SP_ERR_TIMEOUT, "no message from %s:%d within %d ms", c->host, c->port, timeout_ms);
        if (r < 0 && errno != EINTR)
            return sp_errf(err, SP_ERR_IO, "poll: %s", strerror(errno));
        if (r < 0)
            continue;
        if (p[1].revents) {
            uint64_t v;
            ssize_t n = read(c->wake_fd, &v, sizeof v);
            (void)n;
        }
        if (!(p[0].revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        uint8_t *dst;
        size_t want;
        tp_rxstream_target(&c->drs, &dst, &want);
        ssize_t n = recv(c->bulk_fd, dst, want, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n <= 0) {
            tp_cli_fail(c, "bulk channel closed");
            continue;
        }
        sp_err e2 = {0};
        int code = 0;
        uint64_t want_before = c->drs.want;
        int st = tp_rxstream_advance(&c->drs, (size_t)n, &c->lim, NULL, NULL, out, &code, &e2);
        rx_pace_after(c, &c->dpace, c->bulk_fd, &c->drs, want_before, st, out);
        if (st == RX_BAD) {
            sp_log(SP_LOG_WARN, "transport: bulk channel to %s:%d closed: %s", c->host, c->port, e2.msg);
            tp_cli_fail(c, e2.msg);
        } else if (st == RX_DONE) {
            return SP_OK;
        }
    }
}

