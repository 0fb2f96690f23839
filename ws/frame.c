/* frame.c - the framing core both sides of the transport use (transport_impl.h): message queues, header
 * checks, ws and stream reassembly with the size cap, fragmenting sends, deferred closes, lws logging. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "transport_impl.h"

/* ---------------------------------------------------------------------------------------------- */
/* options and logging */

/* lws logs through sp_log (warnings and errors only: its notices are chatty). */
static void lws_emit(int level, const char *line)
{
    char msg[256];
    snprintf(msg, sizeof msg, "%s", line);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    static sp_log_limit lim; /* a peer can make lws complain: at most a few lines per window */
    sp_log_limited(&lim, level & LLL_ERR ? SP_LOG_ERROR : SP_LOG_WARN, "lws: %s", msg);
}

static pthread_once_t lws_log_once = PTHREAD_ONCE_INIT;
static void lws_log_setup(void) { lws_set_log_level(LLL_ERR | LLL_WARN, lws_emit); }
void tp_lws_log_init(void) { pthread_once(&lws_log_once, lws_log_setup); }

void tp_resolve_opts(sp_transport_opts *dst, const sp_transport_opts *src)
{
    sp_transport_opts_default(dst);
    if (!src)
        return;
    sp_transport_opts d = *dst;
    *dst = *src; /* the limits: 0 stays "the default", resolved by the server at start */
    dst->host = src->host && *src->host ? src->host : d.host;
    dst->max_message = !src->max_message ? d.max_message : src->max_message < HDR ? HDR : src->max_message;
    dst->bulk_threshold = src->bulk_threshold ? src->bulk_threshold : d.bulk_threshold;
    dst->rx_queue_max = src->rx_queue_max ? src->rx_queue_max : d.rx_queue_max;
}

sp_proto_limits tp_limits_for(const sp_transport_opts *o)
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
                             .idle_timeout_s = 0,
                             .rx_queue_max = 64ull << 20};
}

/* ---------------------------------------------------------------------------------------------- */
/* message queues (a FIFO of owned buffers; the owner's mutex protects it) */

/* Takes *msg (also on failure, when it is freed). */
/* A node holding *msg (taken; freed when no node can be had: NULL). */
static qnode *node_of(msgq *q, sp_buf *msg)
{
    qnode *n = q->spare;
    if (n) {
        q->spare = n->next;
        q->nspare--;
    } else {
        n = malloc(sizeof *n);
    }
    if (!n) {
        sp_buf_free(msg);
        return NULL;
    }
    n->next = NULL;
    n->buf = buf_take(msg);
    q->bytes += n->buf.len;
    return n;
}

int tp_msgq_push(msgq *q, sp_buf *msg)
{
    qnode *n = node_of(q, msg);
    if (!n)
        return -1;
    if (q->tail)
        q->tail->next = n;
    else
        q->head = n;
    q->tail = n;
    return 0;
}

int tp_msgq_push_front(msgq *q, sp_buf *msg)
{
    qnode *n = node_of(q, msg);
    if (!n)
        return -1;
    n->next = q->head;
    q->head = n;
    if (!q->tail)
        q->tail = n;
    return 0;
}

int tp_msgq_pop(msgq *q, sp_buf *out)
{
    qnode *n = q->head;
    if (!n)
        return 0;
    q->head = n->next;
    if (!q->head)
        q->tail = NULL;
    *out = n->buf;
    q->bytes -= n->buf.len;
    if (q->nspare < MSGQ_SPARE) {
        n->next = q->spare;
        q->spare = n;
        q->nspare++;
    } else {
        free(n);
    }
    return 1;
}

uint64_t tp_msgq_clear(msgq *q)
{
    uint64_t n = q->bytes;
    sp_buf b;
    while (tp_msgq_pop(q, &b))
        sp_buf_free(&b);
    while (q->spare) {
        qnode *x = q->spare;
        q->spare = x->next;
        free(x);
    }
    q->nspare = 0;
    return n;
}

/* ---------------------------------------------------------------------------------------------- */
/* framing checks shared by both channels */

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
 * a large block only reserves address space until the bytes arrive. */
static int reserve_message(sp_buf *b, uint64_t total, uint64_t map_from, int *code, sp_err *err)
{
    if (total > SIZE_MAX || (map_from && total >= map_from ? sp_buf_reserve_mapped(b, (size_t)total, err)
                                                           : sp_buf_reserve(b, (size_t)total, err)) != SP_OK) {
        *code = LWS_CLOSE_STATUS_UNEXPECTED_CONDITION;
        sp_errf(err, SP_ERR_NOMEM, "out of memory for a %llu-byte message", (unsigned long long)total);
        return -1;
    }
    return 0;
}

void tp_rxasm_reset(rxasm *a)
{
    sp_buf_free(&a->buf);
    a->want = 0;
    a->admitted = 0;
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
    return check_header(a->buf.data, lim, &a->want, code, err);
}

/* Asks admit for a message whose header is in; reserves its buffer once admitted. */
static int rxasm_admit(rxasm *a, tp_admit_fn admit, void *au, int *code, sp_err *err)
{
    int r = admit ? admit(au, a->want, code, err) : 1;
    if (r <= 0)
        return r < 0 ? RX_BAD : RX_WAIT;
    if (reserve_message(&a->buf, a->want, a->map_from, code, err))
        return RX_BAD;
    a->admitted = 1;
    return RX_MORE;
}

int tp_rxasm_feed(rxasm *a, const uint8_t *p, size_t n, int final, const sp_proto_limits *lim, tp_admit_fn admit,
                  void *au, size_t *used, sp_buf *out, int *code, sp_err *err)
{
    size_t n0 = n;
    *used = 0;
    if (n > lim->max_message - a->buf.len) {
        *code = LWS_CLOSE_STATUS_MESSAGE_TOO_LARGE;
        sp_errf(err, SP_ERR_RANGE, "message exceeds max_message %llu", (unsigned long long)lim->max_message);
        return RX_BAD;
    }
    if (a->want == 0 && rxasm_header(a, &p, &n, lim, code, err))
        return RX_BAD;
    if (a->want && !a->admitted) {
        int r = rxasm_admit(a, admit, au, code, err);
        if (r == RX_WAIT)
            *used = n0 - n;
        if (r != RX_MORE)
            return r;
    }
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
    *used = n0;
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
    a->admitted = 0;
    return RX_DONE;
}

/* Where the next read should land and how much it may take. */
void tp_rxstream_target(rxstream *r, uint8_t **p, size_t *n)
{
    if (r->want == 0) {
        *p = r->hdr + r->hlen;
        *n = HDR - r->hlen;
    } else {
        *p = r->buf.data + r->buf.len;
        *n = (size_t)(r->want - r->buf.len);
    }
}

int tp_rxstream_advance(rxstream *r, size_t got, const sp_proto_limits *lim, tp_admit_fn admit, void *au, sp_buf *out,
                        int *code, sp_err *err)
{
    if (r->want == 0) {
        r->hlen += got;
        if (r->hlen < HDR)
            return RX_MORE;
        uint64_t total;
        if (check_header(r->hdr, lim, &total, code, err))
            return RX_BAD;
        int a = admit ? admit(au, total, code, err) : 1;
        if (a <= 0)
            return a < 0 ? RX_BAD : RX_WAIT; /* hlen stays at 40: called again with got = 0 */
        if (reserve_message(&r->buf, total, r->map_from, code, err))
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

/* Sends the next fragment of tx->cur. lws writes the frame header into the LWS_PRE bytes before the payload:
 * for fragment 0 that is the sp_buf headroom; for fragment k it is the tail of fragment k-1, already handed
 * to lws (sent or copied into its buffer list), which is saved and put back so the buffer stays intact.
 * Client-side lws_write masks the payload in place: harmless, the transport owns the buffer.
 * Returns 1 when the message is complete, 0 if more fragments remain, -1 on error. */
int tp_send_fragment(struct lws *wsi, txstate *tx)
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

void tp_tx_reset(txstate *tx)
{
    sp_buf_free(&tx->cur);
    tx->off = 0;
    tx->busy = 0;
}

/* Closes a ws from inside its callback with a status and a short reason (at most 123 bytes on the wire). */
int tp_close_ws(struct lws *wsi, int code, const char *why)
{
    size_t n = strlen(why);
    lws_close_reason(wsi, (enum lws_close_status)code, (unsigned char *)why, n > 120 ? 120 : n);
    return -1;
}

int tp_defer_close(struct lws *wsi, rxfail *f, int code, const char *why)
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
int tp_confirm_upgrade(struct lws *wsi)
{
    char up[32];
    int n = lws_hdr_copy(wsi, up, (int)sizeof up, WSI_TOKEN_UPGRADE);
    if (n <= 0 || strcasecmp(up, "websocket") != 0)
        return -1;
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* odds and ends */

int tp_grow(void **arr, size_t *cap, size_t need, size_t elem)
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

uint64_t tp_deadline_after(int timeout_ms)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec + (uint64_t)timeout_ms * 1000000ull;
}

/* Low latency for small messages; the kernel autotunes buffer sizes on its own (setting SO_RCVBUF would cap
 * them at net.core.rmem_max, 208 KiB by default, below what autotuning reaches). */
void tp_tune_socket(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

sp_status tp_listen(const char *host, int port, int backlog, int *fd, int *bound, sp_err *err)
{
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &ai);
    if (rc)
        return sp_errf(err, SP_ERR_ARG, "%s:%d: %s", host, port, gai_strerror(rc));
    int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
    if (s >= 0)
        setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (s < 0 || bind(s, ai->ai_addr, ai->ai_addrlen) || listen(s, backlog)) {
        int e = errno;
        freeaddrinfo(ai);
        if (s >= 0)
            close(s);
        return sp_errf(err, SP_ERR_IO, "%s:%d: %s", host, port, strerror(e));
    }
    freeaddrinfo(ai);
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    getsockname(s, (struct sockaddr *)&sa, &sl);
    *fd = s;
    *bound = ntohs(sa.sin_port);
    return SP_OK;
}

int tp_set_nonblock(int fd, int on)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0)
        return -1;
    return fcntl(fd, F_SETFL, on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK);
}
