/* transport.c - websockets (libwebsockets 4.1.6) plus the bulk TCP channel. See transport.h for the model
 * and share/doc/transport.md for the lws hardening notes.
 *
 * Threads and ownership
 *   - Each server and each client owns one lws context and one service thread. Only that thread calls lws
 *     (except lws_cancel_service, which is documented as safe from anywhere). Other threads put messages on
 *     a queue under the object's mutex and wake the loop; LWS_CALLBACK_EVENT_WAIT_CANCELLED then asks for
 *     WRITEABLE callbacks, and each WRITEABLE sends one 64 KiB fragment.
 *   - A server's bulk sockets are served by one poll() thread with non-blocking sockets; senders queue on the
 *     socket and wake it through an eventfd, so a slow peer never blocks the caller or the other sockets.
 *   - A server connection ("conn") is shared by its two channels: it holds one reference for the live ws
 *     and one for an attached bulk socket. Whichever channel drops the last reference calls on_close and
 *     frees the conn, so on_close comes exactly once and after every on_message of that conn.
 *   - A client writes bulk messages from the sending thread (blocking) and reads them on a reader thread. */
#include <errno.h>
#include <fcntl.h>
#include <libwebsockets.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "timeutil.h"
#include "transport.h"

#define FRAG_SIZE (64u << 10)       /* ws fragment and lws rx/tx buffer size: the spike's best setting */
#define HDR SP_PROTO_HEADER_SIZE    /* 40 */
#define BULK_PREAMBLE 16            /* "SPBK", u32 status/zero, u64 token */
#define BULK_MAX_PENDING 64         /* bulk sockets that have not presented a token yet */
#define BULK_ATTACH_NS (5000000000ull) /* ... and how long they may take to do it */
#define BULK_READ_BUDGET (8u << 20) /* bytes read from one socket per poll round (fairness) */
#define DEFAULT_BULK_THRESHOLD (64u << 10)

_Static_assert(SP_BUF_HEADROOM >= LWS_PRE, "lws writes its frame header into the sp_buf headroom");

/* ---------------------------------------------------------------------------------------------- */
/* small helpers */

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t le32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* Moves b's contents out, leaving an empty buffer (ownership transfer). */
static sp_buf buf_take(sp_buf *b)
{
    sp_buf t = *b;
    *b = (sp_buf){0};
    return t;
}

/* lws logs through sp_log (warnings and errors only: its notices are chatty). */
static void lws_emit(int level, const char *line)
{
    char msg[256];
    snprintf(msg, sizeof msg, "%s", line);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    sp_log(level & LLL_ERR ? SP_LOG_ERROR : SP_LOG_WARN, "lws: %s", msg);
}

static pthread_once_t lws_log_once = PTHREAD_ONCE_INIT;
static void lws_log_init(void) { lws_set_log_level(LLL_ERR | LLL_WARN, lws_emit); }

static void resolve_opts(sp_transport_opts *dst, const sp_transport_opts *src)
{
    sp_transport_opts_default(dst);
    if (!src)
        return;
    if (src->host && *src->host)
        dst->host = src->host;
    dst->port = src->port;
    dst->bulk_port = src->bulk_port;
    if (src->max_message)
        dst->max_message = src->max_message < HDR ? HDR : src->max_message;
    if (src->bulk_threshold)
        dst->bulk_threshold = src->bulk_threshold;
    dst->idle_timeout_s = src->idle_timeout_s;
    dst->direct_recv = src->direct_recv;
}

static sp_proto_limits limits_for(const sp_transport_opts *o)
{
    sp_proto_limits l = {.max_message = o->max_message, .max_meta = SP_PROTO_DEFAULT_MAX_META};
    return l;
}

void sp_transport_opts_default(sp_transport_opts *o)
{
    *o = (sp_transport_opts){.host = "127.0.0.1",
                             .port = 0,
                             .bulk_port = 0,
                             .max_message = SP_PROTO_DEFAULT_MAX_MESSAGE,
                             .bulk_threshold = DEFAULT_BULK_THRESHOLD,
                             .idle_timeout_s = 0};
}

/* ---------------------------------------------------------------------------------------------- */
/* message queues (a FIFO of owned buffers; the owner's mutex protects it) */

typedef struct qnode {
    struct qnode *next;
    sp_buf buf;
} qnode;

typedef struct msgq {
    qnode *head, *tail;
} msgq;

/* Takes *msg (also on failure, when it is freed). */
static int msgq_push(msgq *q, sp_buf *msg)
{
    qnode *n = malloc(sizeof *n);
    if (!n) {
        sp_buf_free(msg);
        return -1;
    }
    n->next = NULL;
    n->buf = buf_take(msg);
    if (q->tail)
        q->tail->next = n;
    else
        q->head = n;
    q->tail = n;
    return 0;
}

static int msgq_pop(msgq *q, sp_buf *out)
{
    qnode *n = q->head;
    if (!n)
        return 0;
    q->head = n->next;
    if (!q->head)
        q->tail = NULL;
    *out = n->buf;
    free(n);
    return 1;
}

static void msgq_clear(msgq *q)
{
    sp_buf b;
    while (msgq_pop(q, &b))
        sp_buf_free(&b);
}

/* ---------------------------------------------------------------------------------------------- */
/* framing checks shared by both channels */

enum { RX_BAD = -1, RX_MORE = 0, RX_DONE = 1 };

/* Checks a complete 40-byte header; *total = 40 + body_len. On failure *code is the ws close status to use
 * (1009 for a message larger than the limit, 1002 for a malformed header). */
static int check_header(const uint8_t *h, const sp_proto_limits *lim, uint64_t *total, int *code, sp_err *err)
{
    uint64_t body = le64(h + 32);
    if (body > lim->max_message - HDR) {
        *code = LWS_CLOSE_STATUS_MESSAGE_TOO_LARGE;
        sp_errf(err, SP_ERR_RANGE, "message of %llu bytes exceeds max_message %llu",
                (unsigned long long)body + HDR, (unsigned long long)lim->max_message);
        return -1;
    }
    if (sp_msg_peek(h, HDR, lim, &body, err) != SP_OK) {
        *code = LWS_CLOSE_STATUS_PROTOCOL_ERR;
        return -1;
    }
    *total = HDR + body;
    return 0;
}

/* Sizes the buffer for the whole message at once: the header is checked against max_message first, and
 * malloc of a large block only reserves address space until the bytes arrive. */
static int reserve_message(sp_buf *b, uint64_t total, int *code, sp_err *err)
{
    if (total > SIZE_MAX || sp_buf_reserve(b, (size_t)total, err) != SP_OK) {
        *code = LWS_CLOSE_STATUS_UNEXPECTED_CONDITION;
        sp_errf(err, SP_ERR_NOMEM, "out of memory for a %llu-byte message", (unsigned long long)total);
        return -1;
    }
    return 0;
}

/* ws reassembly: ws frames give the message boundary, the header gives the size, and the two must agree. */
typedef struct rxasm {
    sp_buf buf;
    uint64_t want; /* 40 + body_len once the header is in, else 0 */
} rxasm;

static void rxasm_reset(rxasm *a)
{
    sp_buf_free(&a->buf);
    a->want = 0;
}

/* Appends up to the first 40 bytes and checks the header once they are all in. */
static int rxasm_header(rxasm *a, const uint8_t **p, size_t *n, const sp_proto_limits *lim, int *code, sp_err *err)
{
    size_t k = HDR - a->buf.len < *n ? HDR - a->buf.len : *n;
    if (sp_buf_append(&a->buf, *p, k, err) != SP_OK) {
        *code = LWS_CLOSE_STATUS_UNEXPECTED_CONDITION;
        return -1;
    }
    *p += k;
    *n -= k;
    if (a->buf.len < HDR)
        return 0;
    if (check_header(a->buf.data, lim, &a->want, code, err))
        return -1;
    return reserve_message(&a->buf, a->want, code, err);
}

/* Feeds one piece of a ws message. RX_DONE moves the complete message to *out. The cap is checked before
 * anything is buffered, so an oversize message costs at most one piece. */
static int rxasm_feed(rxasm *a, const uint8_t *p, size_t n, int final, const sp_proto_limits *lim, sp_buf *out,
                      int *code, sp_err *err)
{
    if (n > lim->max_message - a->buf.len) {
        *code = LWS_CLOSE_STATUS_MESSAGE_TOO_LARGE;
        sp_errf(err, SP_ERR_RANGE, "message exceeds max_message %llu", (unsigned long long)lim->max_message);
        return RX_BAD;
    }
    if (a->want == 0 && rxasm_header(a, &p, &n, lim, code, err))
        return RX_BAD;
    if (n) {
        if (n > a->want - a->buf.len) {
            *code = LWS_CLOSE_STATUS_PROTOCOL_ERR;
            sp_errf(err, SP_ERR_FORMAT, "message longer than the %llu bytes its header announces",
                    (unsigned long long)a->want);
            return RX_BAD;
        }
        memcpy(a->buf.data + a->buf.len, p, n);
        a->buf.len += n;
    }
    if (!final)
        return RX_MORE;
    if (a->want == 0 || a->buf.len != a->want) {
        *code = LWS_CLOSE_STATUS_PROTOCOL_ERR;
        sp_errf(err, SP_ERR_FORMAT, "message ends after %zu of %llu bytes", a->buf.len,
                (unsigned long long)(a->want ? a->want : HDR));
        return RX_BAD;
    }
    *out = buf_take(&a->buf);
    a->want = 0;
    return RX_DONE;
}

/* Stream reassembly (bulk sockets): read the header, then exactly body_len bytes straight into place. */
typedef struct rxstream {
    uint8_t hdr[HDR];
    size_t hlen;
    sp_buf buf;
    uint64_t want; /* 0 while reading the header */
} rxstream;

/* Where the next read should land and how much it may take. */
static void rxstream_target(rxstream *r, uint8_t **p, size_t *n)
{
    if (r->want == 0) {
        *p = r->hdr + r->hlen;
        *n = HDR - r->hlen;
    } else {
        *p = r->buf.data + r->buf.len;
        *n = (size_t)(r->want - r->buf.len);
    }
}

/* Accounts for got bytes read at rxstream_target. */
static int rxstream_advance(rxstream *r, size_t got, const sp_proto_limits *lim, sp_buf *out, int *code, sp_err *err)
{
    if (r->want == 0) {
        r->hlen += got;
        if (r->hlen < HDR)
            return RX_MORE;
        uint64_t total;
        if (check_header(r->hdr, lim, &total, code, err) || reserve_message(&r->buf, total, code, err))
            return RX_BAD;
        memcpy(r->buf.data, r->hdr, HDR);
        r->buf.len = HDR;
        r->hlen = 0;
        r->want = total;
    } else {
        r->buf.len += got;
    }
    if (r->buf.len < r->want)
        return RX_MORE;
    *out = buf_take(&r->buf);
    r->want = 0;
    return RX_DONE;
}

/* ---------------------------------------------------------------------------------------------- */
/* ws sending: one fragment per WRITEABLE callback */

typedef struct txstate {
    sp_buf cur;
    size_t off;
    int busy; /* cur is being sent (a message may be empty, so len cannot tell) */
} txstate;

/* Sends the next fragment of tx->cur. lws writes the frame header into the LWS_PRE bytes before the payload:
 * for fragment 0 that is the sp_buf headroom; for fragment k it is the tail of fragment k-1, already handed
 * to lws (sent or copied into its buffer list), which is saved and put back so the buffer stays intact.
 * Client-side lws_write masks the payload in place: harmless, the transport owns the buffer.
 * Returns 1 when the message is complete, 0 if more fragments remain, -1 on error. */
static int send_fragment(struct lws *wsi, txstate *tx)
{
    uint8_t empty[LWS_PRE + 1];
    sp_buf *b = &tx->cur;
    uint8_t *p = b->data ? b->data + tx->off : empty + LWS_PRE;
    size_t n = b->len - tx->off < FRAG_SIZE ? b->len - tx->off : FRAG_SIZE;
    int first = tx->off == 0, last = tx->off + n == b->len;
    uint8_t saved[LWS_PRE];
    if (!first)
        memcpy(saved, p - LWS_PRE, LWS_PRE);
    int w = lws_write(wsi, p, n, (enum lws_write_protocol)lws_write_ws_flags(LWS_WRITE_BINARY, first, last));
    if (!first)
        memcpy(p - LWS_PRE, saved, LWS_PRE);
    if (w < (int)n)
        return -1;
    tx->off += n;
    return last;
}

static void tx_reset(txstate *tx)
{
    sp_buf_free(&tx->cur);
    tx->off = 0;
    tx->busy = 0;
}

/* Closes a ws from inside its callback with a status and a short reason (at most 123 bytes on the wire). */
static int close_ws(struct lws *wsi, int code, const char *why)
{
    size_t n = strlen(why);
    lws_close_reason(wsi, (enum lws_close_status)code, (unsigned char *)why, n > 120 ? 120 : n);
    return -1;
}

/* A ws that must close because of what it received. The close happens in the next WRITEABLE callback, not by
 * returning -1 from RECEIVE: in 4.1.6 that can crash when the data came from the wsi's buffer list
 * (lws_service_do_ripe_rxflow uses the wsi after closing it; seen under ASan on the client side). Input that
 * arrives meanwhile is dropped. Service thread only. */
typedef struct rxfail {
    int failed, code;
    char why[121];
    int reply;      /* server: a protocol ERROR goes out before the close frame */
    uint64_t reqid; /* its request id: the failed message's, if its header got that far */
    const char *errcode; /* its code ("version", "malformed", ...: sp_msg_reject_code) */
} rxfail;

static int defer_close(struct lws *wsi, rxfail *f, int code, const char *why)
{
    if (!f->failed) {
        f->failed = 1;
        f->code = code;
        snprintf(f->why, sizeof f->why, "%.120s", why);
        lws_callback_on_writable(wsi);
    }
    return 0;
}

/* LWS_CALLBACK_HTTP_CONFIRM_UPGRADE: the upgrade header is read with lws_hdr_copy and `in` is never touched,
 * because 4.1.6 may pass a dangling pointer here (NN-2025-0102). Only "websocket" passes: h2c would reach
 * the h2 code with its known bugs. lws_hdr_copy returns -1/0 once the header table is gone. */
static int confirm_upgrade(struct lws *wsi)
{
    char up[32];
    int n = lws_hdr_copy(wsi, up, (int)sizeof up, WSI_TOKEN_UPGRADE);
    if (n <= 0 || strcasecmp(up, "websocket") != 0)
        return -1;
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* server */

typedef struct bsock bsock;

typedef struct conn {
    uint64_t id;
    struct lws *wsi; /* mu; NULL once the ws channel is closed */
    int refs;        /* mu: 1 for the live ws + 1 for an attached bulk socket */
    int dead;        /* mu: sends fail; the other channel is being closed */
    int close_req;   /* mu: the service thread should close the ws */
    uint64_t token;  /* mu: outstanding bulk token, 0 = none */
    bsock *bulk;     /* mu */
    msgq txq;        /* mu: ws output */
    _Atomic uint64_t last_ns; /* last traffic on either channel (idle timeout) */
    /* service thread only */
    txstate tx;
    rxasm rx;
    rxfail fail;
} conn;

struct bsock {
    int fd;
    conn *c;   /* mu (written only by the bulk thread, which may read it unlocked) */
    int kill;  /* mu: close requested by another thread */
    msgq txq;  /* mu */
    /* bulk thread only */
    uint8_t pre[BULK_PREAMBLE];
    size_t prelen;
    uint64_t deadline_ns; /* for presenting the token */
    rxstream rx;
    sp_buf cur;
    size_t cur_off;
    int busy, dead;
};

struct sp_ws_server {
    sp_transport_opts o;
    char host[256];
    sp_proto_limits lim;
    sp_server_on_message on_message;
    sp_server_on_close on_close;
    void *user;
    struct lws_context *ctx;
    struct lws_protocols protocols[3];
    int port, bulk_port;
    pthread_t svc, bulk;
    int svc_started, bulk_started;
    atomic_int svc_stop, bulk_stop;

    pthread_mutex_t mu;
    int stopping;      /* mu */
    uint64_t next_id;  /* mu */
    conn **conns;      /* mu */
    size_t nconns, capconns;

    int listen_fd, wake_fd;
    bsock **socks; /* bulk thread only (and stop, after it is joined) */
    size_t nsocks, capsocks;
    struct lws **wake; /* service thread scratch for WAIT_CANCELLED */
    size_t capwake;
};

static int grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t nc = *cap ? *cap * 2 : 16;
    while (nc < need)
        nc *= 2;
    void *p = realloc(*arr, nc * elem);
    if (!p)
        return -1;
    *arr = p;
    *cap = nc;
    return 0;
}

/* mu held */
static conn *find_conn(sp_ws_server *s, uint64_t id)
{
    for (size_t i = 0; i < s->nconns; i++)
        if (s->conns[i]->id == id)
            return s->conns[i];
    return NULL;
}

/* mu held */
static void remove_conn(sp_ws_server *s, conn *c)
{
    for (size_t i = 0; i < s->nconns; i++)
        if (s->conns[i] == c) {
            s->conns[i] = s->conns[--s->nconns];
            return;
        }
}

static void wake_bulk(sp_ws_server *s)
{
    uint64_t one = 1;
    if (s->wake_fd >= 0 && write(s->wake_fd, &one, sizeof one) < 0 && errno != EAGAIN)
        sp_log(SP_LOG_WARN, "transport: bulk wake-up failed: %s", strerror(errno));
}

/* A channel lets go of c. The last one out reports the close and frees it: on_close is called exactly once,
 * after every on_message of the conn (each channel delivers only before it lets go). */
static void conn_release(sp_ws_server *s, conn *c, int last)
{
    if (!last)
        return;
    s->on_close(s->user, c->id);
    msgq_clear(&c->txq);
    free(c);
}

/* ---- ws side (service thread) ---- */

static int srv_established(sp_ws_server *s, struct lws *wsi, conn **pss)
{
    conn *c = calloc(1, sizeof *c);
    if (!c)
        return -1;
    c->wsi = wsi;
    c->refs = 1;
    atomic_store(&c->last_ns, sp_now_ns());
    pthread_mutex_lock(&s->mu);
    int ok = !s->stopping && grow((void **)&s->conns, &s->capconns, s->nconns + 1, sizeof *s->conns) == 0;
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
    tx_reset(&c->tx);
    rxasm_reset(&c->rx);
    pthread_mutex_lock(&s->mu);
    c->wsi = NULL;
    c->dead = 1;
    msgq_clear(&c->txq);
    int wake = c->bulk != NULL;
    if (c->bulk)
        c->bulk->kill = 1;
    int last = --c->refs == 0;
    if (last)
        remove_conn(s, c);
    pthread_mutex_unlock(&s->mu);
    if (wake)
        wake_bulk(s);
    conn_release(s, c, last);
}

static int srv_receive(sp_ws_server *s, struct lws *wsi, conn *c, const void *in, size_t len)
{
    if (!c)
        return -1;
    if (c->fail.failed)
        return 0;
    if (!lws_frame_is_binary(wsi)) {
        sp_log(SP_LOG_WARN, "transport: conn %llu closed: a text frame", (unsigned long long)c->id);
        return defer_close(wsi, &c->fail, LWS_CLOSE_STATUS_UNACCEPTABLE_OPCODE, "binary messages only");
    }
    sp_buf msg;
    sp_err err = {0};
    int code = 0;
    int r = rxasm_feed(&c->rx, in, len, lws_is_final_fragment(wsi), &s->lim, &msg, &code, &err);
    if (r == RX_BAD) {
        sp_log(SP_LOG_WARN, "transport: conn %llu closed: %s", (unsigned long long)c->id, err.msg);
        sp_msg_header h = {0};
        sp_msg_header_read(c->rx.buf.data, c->rx.buf.len, &h);
        c->fail.reply = 1;
        c->fail.reqid = h.request_id;
        c->fail.errcode = sp_msg_reject_code(c->rx.buf.data, c->rx.buf.len, err.code);
        return defer_close(wsi, &c->fail, code, err.msg);
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
            int r = send_fragment(wsi, &c->tx);
            tx_reset(&c->tx);
            if (r == 1) { /* the close frame follows in the next callback */
                lws_callback_on_writable(wsi);
                return 0;
            }
        } else {
            sp_buf_free(&b);
        }
    }
    return close_ws(wsi, c->fail.code, c->fail.why);
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
    if (!close_req && !c->tx.busy && msgq_pop(&c->txq, &c->tx.cur)) {
        c->tx.busy = 1;
        c->tx.off = 0;
    }
    pthread_mutex_unlock(&s->mu);
    if (close_req)
        return close_ws(wsi, LWS_CLOSE_STATUS_GOINGAWAY, "closed");
    if (!c->tx.busy)
        return 0;
    int r = send_fragment(wsi, &c->tx);
    if (r < 0)
        return -1;
    atomic_store(&c->last_ns, sp_now_ns());
    int more = 1;
    if (r == 1) {
        tx_reset(&c->tx);
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
    if (grow((void **)&s->wake, &s->capwake, s->nconns, sizeof *s->wake) == 0)
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
        return close_ws(wsi, LWS_CLOSE_STATUS_GOINGAWAY, "idle");
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
        return confirm_upgrade(wsi);
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
        return confirm_upgrade(wsi);
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

/* ---- bulk side (bulk thread) ---- */

/* Low latency for small messages; the kernel autotunes buffer sizes on its own (setting SO_RCVBUF would cap
 * them at net.core.rmem_max, 208 KiB by default, below what autotuning reaches). */
static void tune_socket(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static int set_nonblock(int fd, int on)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0)
        return -1;
    return fcntl(fd, F_SETFL, on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK);
}

static void bulk_accept(sp_ws_server *s)
{
    for (;;) {
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return; /* EAGAIN, or a transient error that the next POLLIN retries */
        size_t pending = 0;
        for (size_t i = 0; i < s->nsocks; i++)
            pending += s->socks[i]->c == NULL;
        bsock *b = pending < BULK_MAX_PENDING ? calloc(1, sizeof *b) : NULL;
        if (!b || grow((void **)&s->socks, &s->capsocks, s->nsocks + 1, sizeof *s->socks)) {
            free(b);
            close(fd);
            continue;
        }
        tune_socket(fd);
        b->fd = fd;
        b->deadline_ns = sp_now_ns() + BULK_ATTACH_NS;
        s->socks[s->nsocks++] = b;
    }
}

/* The preamble is complete: bind the socket to the conn holding the token (one use), and answer
 * "SPBK" + status (0 accepted, 1 refused) + 8 zero bytes. The answer goes straight out: the socket is fresh,
 * nothing else can be queued on it yet, and 16 bytes always fit its buffer. */
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
        }
        pthread_mutex_unlock(&s->mu);
    }
    uint8_t ack[BULK_PREAMBLE] = {'S', 'P', 'B', 'K'};
    put_le32(ack + 4, c ? 0 : 1);
    if (send(b->fd, ack, sizeof ack, MSG_NOSIGNAL) != (ssize_t)sizeof ack || !c) {
        if (!c)
            sp_log(SP_LOG_WARN, "transport: bulk socket refused: bad preamble or unknown/used token");
        b->dead = 1;
        return;
    }
    atomic_store(&c->last_ns, sp_now_ns());
}

/* Reads what is there (up to a budget) and delivers complete messages under the ws conn's id. */
static void bulk_read(sp_ws_server *s, bsock *b)
{
    size_t budget = BULK_READ_BUDGET;
    while (budget && !b->dead) {
        uint8_t *p;
        size_t n;
        if (!b->c) {
            p = b->pre + b->prelen;
            n = BULK_PREAMBLE - b->prelen;
        } else {
            rxstream_target(&b->rx, &p, &n);
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
            continue;
        }
        sp_buf msg;
        sp_err err = {0};
        int code = 0;
        int st = rxstream_advance(&b->rx, (size_t)r, &s->lim, &msg, &code, &err);
        atomic_store(&b->c->last_ns, sp_now_ns());
        if (st == RX_BAD) {
            sp_log(SP_LOG_WARN, "transport: conn %llu bulk socket closed: %s", (unsigned long long)b->c->id, err.msg);
            b->dead = 1;
        } else if (st == RX_DONE) {
            s->on_message(s->user, b->c->id, &msg);
        }
    }
}

/* Writes queued output until the socket is full. */
static void bulk_write(sp_ws_server *s, bsock *b)
{
    while (!b->dead) {
        if (!b->busy) {
            pthread_mutex_lock(&s->mu);
            b->busy = msgq_pop(&b->txq, &b->cur);
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
            b->busy = 0;
            if (b->c)
                atomic_store(&b->c->last_ns, sp_now_ns());
        }
    }
}

/* Closes a bulk socket; an attached conn loses its ws too (one logical connection). */
static void bulk_close(sp_ws_server *s, bsock *b)
{
    conn *c = b->c;
    int last = 0, cancel = 0;
    pthread_mutex_lock(&s->mu);
    if (c) {
        c->bulk = NULL;
        c->dead = 1;
        if (c->wsi) {
            c->close_req = 1;
            cancel = 1;
        }
        last = --c->refs == 0;
        if (last)
            remove_conn(s, c);
        b->c = NULL;
    }
    msgq_clear(&b->txq);
    pthread_mutex_unlock(&s->mu);
    close(b->fd);
    sp_buf_free(&b->rx.buf);
    sp_buf_free(&b->cur);
    free(b);
    if (cancel)
        lws_cancel_service(s->ctx);
    if (c)
        conn_release(s, c, last);
}

/* Fills the pollfd array: the wake-up eventfd, the listener, then every socket (POLLOUT only with output
 * pending). Kill requests from other threads are picked up here. Returns the poll timeout in ms. */
static int bulk_prepare(sp_ws_server *s, struct pollfd *pfd)
{
    uint64_t now = sp_now_ns(), next = now + 1000000000ull;
    pfd[0] = (struct pollfd){.fd = s->wake_fd, .events = POLLIN};
    pfd[1] = (struct pollfd){.fd = s->listen_fd, .events = POLLIN};
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->nsocks; i++) {
        bsock *b = s->socks[i];
        if (b->kill)
            b->dead = 1;
        short ev = POLLIN;
        if (b->busy || b->txq.head)
            ev |= POLLOUT;
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
        if (!b->c && now > b->deadline_ns)
            b->dead = 1;
        if (b->dead) {
            s->socks[i] = s->socks[--s->nsocks];
            bulk_close(s, b);
        } else {
            i++;
        }
    }
}

static void *bulk_main(void *arg)
{
    sp_ws_server *s = arg;
    struct pollfd *pfd = NULL;
    size_t cap = 0;
    while (!atomic_load(&s->bulk_stop)) {
        size_t n = 2 + s->nsocks;
        if (grow((void **)&pfd, &cap, n, sizeof *pfd)) {
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
            if (!b->dead && (re & (POLLIN | POLLHUP | POLLERR)))
                bulk_read(s, b);
            if (!b->dead && (re & POLLOUT))
                bulk_write(s, b);
        }
        bulk_sweep(s);
    }
    free(pfd);
    return NULL;
}

/* ---- setup ---- */

/* Binds the bulk listener on host:port (IPv4; "0.0.0.0" for every interface). */
static sp_status bulk_listen(sp_ws_server *s, sp_err *err)
{
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai;
    char port[16];
    snprintf(port, sizeof port, "%d", s->o.bulk_port);
    int rc = getaddrinfo(s->host, port, &hints, &ai);
    if (rc)
        return sp_errf(err, SP_ERR_ARG, "bulk listener %s:%d: %s", s->host, s->o.bulk_port, gai_strerror(rc));
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 64)) {
        int e = errno;
        freeaddrinfo(ai);
        if (fd >= 0)
            close(fd);
        return sp_errf(err, SP_ERR_IO, "bulk listener %s:%d: %s", s->host, s->o.bulk_port, strerror(e));
    }
    freeaddrinfo(ai);
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    s->listen_fd = fd;
    s->bulk_port = ntohs(sa.sin_port);
    return SP_OK;
}

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
        if (pthread_create(&s->bulk, NULL, bulk_main, s))
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
    pthread_once(&lws_log_once, lws_log_init);
    sp_ws_server *s = calloc(1, sizeof *s);
    if (!s)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    resolve_opts(&s->o, o);
    snprintf(s->host, sizeof s->host, "%s", s->o.host);
    s->o.host = s->host;
    s->lim = limits_for(&s->o);
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
        st = bulk_listen(s, err);
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
        wake_b = msgq_push(&c->bulk->txq, msg) == 0;
    else
        wake_ws = msgq_push(&c->txq, msg) == 0;
    pthread_mutex_unlock(&s->mu);
    if (fail) {
        sp_buf_free(msg);
        return sp_errf(err, SP_ERR_CLOSED, "connection %llu is closed", (unsigned long long)id);
    }
    if (wake_ws)
        lws_cancel_service(s->ctx);
    else if (wake_b)
        wake_bulk(s);
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
        wake_bulk(s);
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
        wake_bulk(s);
        pthread_join(s->bulk, NULL);
    }
    while (s->nsocks)
        bulk_close(s, s->socks[--s->nsocks]);
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
        tx_reset(&c->tx);
        rxasm_reset(&c->rx);
        conn_release(s, c, 1);
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

/* ---------------------------------------------------------------------------------------------- */
/* client */

enum { C_CONNECTING, C_OPEN, C_CLOSED };

struct sp_ws_client {
    sp_transport_opts o;
    sp_proto_limits lim;
    char host[256];
    int port;
    struct lws_context *ctx;
    struct lws_protocols protocols[2];
    pthread_t svc, reader;
    int svc_started, reader_started;
    atomic_int svc_stop;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state;        /* mu */
    int close_req;    /* mu */
    char why[200];    /* mu: why it closed or failed */
    msgq txq, rxq;    /* mu */
    int bulk_fd;      /* mu (set once by attach) */
    int attaching;    /* mu */
    pthread_mutex_t bulk_wmu; /* serialises writers on the bulk socket */
    int wake_fd;      /* direct_recv: an eventfd poked whenever rxq or state changes, -1 otherwise */
    rxstream drs;     /* direct_recv: the caller's reassembly of bulk messages */

    /* service thread only */
    struct lws *wsi;
    txstate tx;
    rxasm rx;
    rxfail fail;
};

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
    if (c->bulk_fd >= 0)
        shutdown(c->bulk_fd, SHUT_RDWR);
    pthread_cond_broadcast(&c->cv);
    cli_poke_locked(c);
}

/* Asks the service thread to close the ws (from another thread). */
static void cli_fail(sp_ws_client *c, const char *why)
{
    pthread_mutex_lock(&c->mu);
    cli_closed_locked(c, why);
    c->close_req = 1;
    pthread_mutex_unlock(&c->mu);
    lws_cancel_service(c->ctx);
}

static int cli_receive(sp_ws_client *c, struct lws *wsi, const void *in, size_t len)
{
    if (c->fail.failed)
        return 0;
    sp_buf msg;
    sp_err err = {0};
    int code = LWS_CLOSE_STATUS_UNACCEPTABLE_OPCODE;
    int r = RX_BAD;
    if (!lws_frame_is_binary(wsi))
        sp_errf(&err, SP_ERR_FORMAT, "a text frame (binary messages only)");
    else
        r = rxasm_feed(&c->rx, in, len, lws_is_final_fragment(wsi), &c->lim, &msg, &code, &err);
    if (r == RX_BAD) {
        sp_log(SP_LOG_WARN, "transport: connection to %s:%d closed: %s", c->host, c->port, err.msg);
        pthread_mutex_lock(&c->mu);
        cli_closed_locked(c, err.msg);
        pthread_mutex_unlock(&c->mu);
        return defer_close(wsi, &c->fail, code, err.msg);
    }
    if (r == RX_DONE) {
        pthread_mutex_lock(&c->mu);
        if (msgq_push(&c->rxq, &msg) == 0) {
            pthread_cond_signal(&c->cv);
            cli_poke_locked(c);
        }
        pthread_mutex_unlock(&c->mu);
    }
    return 0;
}

static int cli_writeable(sp_ws_client *c, struct lws *wsi)
{
    if (c->fail.failed)
        return close_ws(wsi, c->fail.code, c->fail.why);
    pthread_mutex_lock(&c->mu);
    int close_req = c->close_req;
    if (!close_req && !c->tx.busy && msgq_pop(&c->txq, &c->tx.cur)) {
        c->tx.busy = 1;
        c->tx.off = 0;
    }
    pthread_mutex_unlock(&c->mu);
    if (close_req)
        return close_ws(wsi, LWS_CLOSE_STATUS_NORMAL, "closed");
    if (!c->tx.busy)
        return 0;
    int r = send_fragment(wsi, &c->tx);
    if (r < 0)
        return -1;
    int more = 1;
    if (r == 1) {
        tx_reset(&c->tx);
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
        pthread_mutex_lock(&c->mu);
        cli_closed_locked(c, in && len ? (const char *)in : "connection failed");
        pthread_mutex_unlock(&c->mu);
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

static uint64_t deadline_after(int timeout_ms)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec + (uint64_t)timeout_ms * 1000000ull;
}

static sp_status cli_init(sp_ws_client *c, const char *host, int port, const sp_transport_opts *o)
{
    resolve_opts(&c->o, o);
    c->lim = limits_for(&c->o);
    snprintf(c->host, sizeof c->host, "%s", host);
    c->port = port;
    c->bulk_fd = -1;
    c->wake_fd = c->o.direct_recv ? eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC) : -1;
    c->state = C_CONNECTING;
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
    struct lws *w = lws_client_connect_via_info(&ci);
    if (pthread_create(&c->svc, NULL, cli_svc_main, c))
        return sp_errf(err, SP_ERR_NOMEM, "connecting to %s:%d: cannot start the transport thread", c->host, c->port);
    c->svc_started = 1;
    uint64_t until = deadline_after(timeout_ms < 0 ? 0 : timeout_ms);
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
    pthread_once(&lws_log_once, lws_log_init);
    sp_ws_client *c = calloc(1, sizeof *c);
    if (!c)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    cli_init(c, host, port, o);
    sp_status st = cli_create_context(c, timeout_ms, err);
    if (!st)
        st = cli_handshake(c, timeout_ms, err);
    if (st) {
        sp_ws_client_close(c);
        return st;
    }
    *out = c;
    return SP_OK;
}

/* ---- client bulk channel ---- */

/* Connects a TCP socket with a deadline (non-blocking connect + poll), left in blocking mode. */
static int tcp_connect(const char *host, int port, int timeout_ms, sp_err *err)
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
        set_nonblock(fd, 0);
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

/* Presents the token and waits for the server's verdict. */
static sp_status bulk_handshake(sp_ws_client *c, int fd, int bulk_port, uint64_t token, int timeout_ms, sp_err *err)
{
    uint8_t pre[BULK_PREAMBLE] = {'S', 'P', 'B', 'K'}, ack[BULK_PREAMBLE];
    put_le64(pre + 8, token);
    if (write_all(fd, pre, sizeof pre))
        return sp_errf(err, SP_ERR_IO, "bulk channel %s:%d: %s", c->host, bulk_port, strerror(errno));
    if (read_all_timed(fd, ack, sizeof ack, timeout_ms < 0 ? 60000 : timeout_ms))
        return sp_errf(err, SP_ERR_IO, "bulk channel %s:%d: no answer to the token", c->host, bulk_port);
    if (memcmp(ack, "SPBK", 4) != 0 || le32(ack + 4) != 0)
        return sp_errf(err, SP_ERR_STATE, "bulk channel %s:%d: token refused", c->host, bulk_port);
    return SP_OK;
}

/* Reads messages from the bulk socket until it ends; then the whole connection is over. */
static void *cli_reader_main(void *arg)
{
    sp_ws_client *c = arg;
    int fd = c->bulk_fd; /* set before this thread started, never changed afterwards */
    rxstream rs = {0};
    sp_err err = {0};
    const char *why = "bulk channel closed";
    for (;;) {
        uint8_t *p;
        size_t n;
        rxstream_target(&rs, &p, &n);
        ssize_t r = recv(fd, p, n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        sp_buf msg;
        int code = 0;
        int st = rxstream_advance(&rs, (size_t)r, &c->lim, &msg, &code, &err);
        if (st == RX_BAD) {
            sp_log(SP_LOG_WARN, "transport: bulk channel to %s:%d closed: %s", c->host, c->port, err.msg);
            why = err.msg;
            break;
        }
        if (st == RX_DONE) {
            pthread_mutex_lock(&c->mu);
            if (msgq_push(&c->rxq, &msg) == 0)
                pthread_cond_signal(&c->cv);
            pthread_mutex_unlock(&c->mu);
        }
    }
    sp_buf_free(&rs.buf);
    cli_fail(c, why);
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
    int fd = tcp_connect(c->host, bulk_port, timeout_ms < 0 ? 60000 : timeout_ms, err);
    if (fd >= 0) {
        tune_socket(fd);
        st = bulk_handshake(c, fd, bulk_port, token, timeout_ms, err);
    } else {
        st = err ? err->code : SP_ERR_IO;
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
        cli_fail(c, "cannot start the bulk reader");
        return sp_errf(err, SP_ERR_NOMEM, "bulk channel %s:%d: cannot start the reader thread", c->host, bulk_port);
    }
    c->reader_started = 1;
    return SP_OK;
}

/* Bulk write from the sending thread (blocking; the server always drains its sockets). */
static sp_status cli_bulk_send(sp_ws_client *c, int fd, sp_buf *msg, sp_err *err)
{
    pthread_mutex_lock(&c->bulk_wmu);
    int bad = write_all(fd, msg->data, msg->len);
    pthread_mutex_unlock(&c->bulk_wmu);
    sp_buf_free(msg);
    if (bad) {
        cli_fail(c, "bulk channel write failed");
        return sp_errf(err, SP_ERR_CLOSED, "connection to %s:%d: bulk channel closed", c->host, c->port);
    }
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
        return cli_bulk_send(c, fd, msg, err);
    }
    int bad = msgq_push(&c->txq, msg);
    pthread_mutex_unlock(&c->mu);
    if (bad)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory queueing a message");
    lws_cancel_service(c->ctx);
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
static sp_status cli_recv_direct(sp_ws_client *c, sp_buf *out, int timeout_ms, sp_err *err)
{
    uint64_t until = timeout_ms < 0 ? 0 : deadline_after(timeout_ms);
    for (;;) {
        pthread_mutex_lock(&c->mu);
        int got = msgq_pop(&c->rxq, out), open = c->state == C_OPEN;
        char why[sizeof c->why];
        snprintf(why, sizeof why, "%s", c->why);
        pthread_mutex_unlock(&c->mu);
        if (got)
            return SP_OK;
        if (!open)
            return sp_errf(err, SP_ERR_CLOSED, "connection to %s:%d closed (%s)", c->host, c->port, why);
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
        rxstream_target(&c->drs, &dst, &want);
        ssize_t n = recv(c->bulk_fd, dst, want, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n <= 0) {
            cli_fail(c, "bulk channel closed");
            continue;
        }
        sp_err e2 = {0};
        int code = 0;
        int st = rxstream_advance(&c->drs, (size_t)n, &c->lim, out, &code, &e2);
        if (st == RX_BAD) {
            sp_log(SP_LOG_WARN, "transport: bulk channel to %s:%d closed: %s", c->host, c->port, e2.msg);
            cli_fail(c, e2.msg);
        } else if (st == RX_DONE) {
            return SP_OK;
        }
    }
}

sp_status sp_ws_client_recv(sp_ws_client *c, sp_buf *out, int timeout_ms, sp_err *err)
{
    if (!c || !out)
        return sp_errf(err, SP_ERR_ARG, "sp_ws_client_recv: NULL argument");
    pthread_mutex_lock(&c->mu);
    int direct = c->wake_fd >= 0 && c->bulk_fd >= 0;
    pthread_mutex_unlock(&c->mu);
    if (direct)
        return cli_recv_direct(c, out, timeout_ms, err);
    uint64_t until = timeout_ms < 0 ? 0 : deadline_after(timeout_ms);
    sp_status st = SP_OK;
    pthread_mutex_lock(&c->mu);
    while (!c->rxq.head && c->state == C_OPEN && st == SP_OK)
        if (timeout_ms == 0 || cli_wait(c, until) == ETIMEDOUT)
            st = SP_ERR_TIMEOUT;
    if (msgq_pop(&c->rxq, out))
        st = SP_OK;
    else if (c->state != C_OPEN)
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
    msgq_clear(&c->txq);
    msgq_clear(&c->rxq);
    tx_reset(&c->tx);
    rxasm_reset(&c->rx);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->bulk_wmu);
    pthread_mutex_destroy(&c->mu);
    free(c);
}
