/* wire.c - transport throughput and latency on loopback, against plain TCP measured in the same run.
 *
 * 1. raw TCP: a client thread writes an N MiB message, an echo thread reads all of it and writes it back
 *    (store and forward, like the transport), over one 127.0.0.1 socket.
 * 2. sp_ws: the same messages client -> server -> echoed back, over the websocket only.
 * 3. sp_ws + bulk: the same with the bulk channel attached (messages >= 64 KiB take the TCP side channel).
 * 4. round-trip time of a small message (1232 B: the 1-token hidden state of a 288-dim model in f32 plus
 *    header) over the websocket, median and p99, with raw TCP for reference.
 *
 * Reps alternate A B C A B C ... so that drift on a noisy shared VM hits every path alike; each figure is
 * the median over reps. MB/s counts both directions (2 x bytes per round trip). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "timeutil.h"
#include "transport.h"

typedef struct opts {
    int size_mib, msgs, reps, rtt, small;
} opts;

/* ---------------------------------------------------------------------------------------------- */
/* options */

static int parse_args(int argc, char **argv, opts *o)
{
    *o = (opts){.size_mib = 16, .msgs = 4, .reps = 5, .rtt = 1000, .small = 1232};
    static const char *names[] = {"--size-mib", "--msgs", "--reps", "--rtt", "--small"};
    int *slots[] = {&o->size_mib, &o->msgs, &o->reps, &o->rtt, &o->small};
    for (int i = 1; i < argc; i += 2) {
        int *slot = NULL;
        for (size_t k = 0; k < sizeof names / sizeof *names; k++)
            if (strcmp(argv[i], names[k]) == 0)
                slot = slots[k];
        char *end = NULL;
        long v = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
        if (!slot || !end || *end || v <= 0 || v > 1 << 20) {
            fprintf(stderr, "usage: %s [--size-mib N] [--msgs N] [--reps N] [--rtt N] [--small BYTES]   (bad: %s)\n",
                    argv[0], argv[i]);
            return -1;
        }
        *slot = (int)v;
    }
    if (o->small < SP_PROTO_HEADER_SIZE)
        o->small = SP_PROTO_HEADER_SIZE;
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* messages */

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* A valid header (PING, no metadata, no tensors) followed by pseudo-random bytes. */
static int make_msg(sp_buf *b, size_t total)
{
    if (sp_buf_reserve(b, total, NULL))
        return -1;
    memset(b->data, 0, SP_PROTO_HEADER_SIZE);
    memcpy(b->data, "SEPL", 4);
    b->data[4] = SP_PROTO_MAJOR;
    b->data[8] = SP_MSG_PING;
    put64(b->data + 32, total - SP_PROTO_HEADER_SIZE);
    uint64_t x = 88172645463325252ull;
    for (size_t i = SP_PROTO_HEADER_SIZE; i < total; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        b->data[i] = (uint8_t)x;
    }
    b->len = total;
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---------------------------------------------------------------------------------------------- */
/* raw TCP */

static int write_full(int fd, const uint8_t *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int read_full(int fd, uint8_t *p, size_t n)
{
    while (n) {
        ssize_t r = recv(fd, p, n, 0);
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

typedef struct raw_echo {
    int fd;
    size_t big, small;
} raw_echo;

/* Echo thread: reads a 1-byte kind (0 big, 1 small), then the message, and sends it back. */
static void *raw_echo_main(void *arg)
{
    raw_echo *e = arg;
    uint8_t *buf = malloc(e->big > e->small ? e->big : e->small);
    uint8_t kind;
    while (buf && read_full(e->fd, &kind, 1) == 0) {
        size_t n = kind ? e->small : e->big;
        if (read_full(e->fd, buf, n) || write_full(e->fd, buf, n))
            break;
    }
    free(buf);
    return NULL;
}

/* A connected pair of TCP sockets on 127.0.0.1 (client side in fds[0], server side in fds[1]). */
static int tcp_pair(int fds[2])
{
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof a;
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 1) || getsockname(l, (struct sockaddr *)&a, &sl))
        return -1;
    fds[0] = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fds[0], (struct sockaddr *)&a, sizeof a))
        return -1;
    fds[1] = accept(l, NULL, NULL);
    close(l);
    setsockopt(fds[0], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fds[1], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fds[1] < 0 ? -1 : 0;
}

static int raw_round(int fd, uint8_t kind, uint8_t *buf, size_t n)
{
    return write_full(fd, &kind, 1) || write_full(fd, buf, n) || read_full(fd, buf, n) ? -1 : 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* sp_ws */

static sp_ws_server *g_server; /* set before any client connects */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_last_conn;

static void on_message(void *user, uint64_t conn, sp_buf *msg)
{
    pthread_mutex_lock(&g_mu);
    g_last_conn = conn;
    pthread_mutex_unlock(&g_mu);
    sp_ws_server_send(g_server, conn, msg, NULL);
}

static void on_close(void *user, uint64_t conn) {}

/* One round trip; *b is sent and replaced by the echo. */
static int ws_round(sp_ws_client *c, sp_buf *b, sp_err *err)
{
    if (sp_ws_client_send(c, b, err))
        return -1;
    return sp_ws_client_recv(c, b, 60000, err) ? -1 : 0;
}

/* bulk 0: websocket only; 1: the bulk channel for messages >= 64 KiB; 2: every message over the bulk channel
 * and replies read on it by the caller (sp_remote's mode: bulk_threshold 1, direct_recv). */
static sp_ws_client *ws_connect(int bulk, sp_err *err)
{
    sp_ws_client *c = NULL;
    sp_transport_opts to;
    sp_transport_opts_default(&to);
    if (bulk == 2)
        to.bulk_threshold = 1, to.direct_recv = 1;
    if (sp_ws_client_connect(&c, "127.0.0.1", sp_ws_server_port(g_server), &to, 5000, err))
        return NULL;
    if (!bulk)
        return c;
    sp_buf b = {0};
    if (make_msg(&b, 64) || ws_round(c, &b, err)) { /* the server learns our conn id */
        sp_buf_free(&b);
        sp_ws_client_close(c);
        return NULL;
    }
    sp_buf_free(&b);
    pthread_mutex_lock(&g_mu);
    uint64_t conn = g_last_conn;
    pthread_mutex_unlock(&g_mu);
    uint64_t token = sp_ws_server_bulk_token(g_server, conn);
    if (sp_ws_client_attach_bulk(c, sp_ws_server_bulk_port(g_server), token, 5000, err)) {
        sp_ws_client_close(c);
        return NULL;
    }
    return c;
}

/* ---------------------------------------------------------------------------------------------- */
/* the runs */

typedef struct paths {
    int raw_fd;
    uint8_t *raw_buf;
    int echo_started;
    sp_ws_client *ws, *bulk, *direct;
    sp_buf ws_buf, bulk_buf; /* travel back and forth: the echo of one round is the next message */
    sp_err err;
} paths;

/* Seconds for o->msgs round trips of the big message on path k (0 raw, 1 ws, 2 bulk); < 0 on failure. */
static double timed_rep(paths *p, const opts *o, int k)
{
    size_t n = (size_t)o->size_mib << 20;
    uint64_t t0 = sp_now_ns();
    for (int i = 0; i < o->msgs; i++) {
        int bad = k == 0   ? raw_round(p->raw_fd, 0, p->raw_buf, n)
                  : k == 1 ? ws_round(p->ws, &p->ws_buf, &p->err)
                           : ws_round(p->bulk, &p->bulk_buf, &p->err);
        if (bad)
            return -1;
    }
    return (double)(sp_now_ns() - t0) / 1e9;
}

static int run_throughput(paths *p, const opts *o, double mbs[3])
{
    double *t[3];
    for (int k = 0; k < 3; k++)
        t[k] = calloc((size_t)o->reps, sizeof(double));
    int bad = 0;
    for (int r = 0; r < o->reps && !bad; r++)
        for (int k = 0; k < 3 && !bad; k++) {
            double s = timed_rep(p, o, k);
            bad = s < 0;
            t[k][r] = 2.0 * o->msgs * ((double)o->size_mib * 1048576.0) / s / 1e6;
        }
    for (int k = 0; k < 3; k++) {
        mbs[k] = bad ? 0 : median(t[k], o->reps);
        free(t[k]);
    }
    return bad ? -1 : 0;
}

/* Small-message round trips: median and p99 in microseconds, after 100 warm-up rounds. */
static int run_rtt(paths *p, const opts *o, double ws[2], double raw[2], double direct[2])
{
    double *ts = calloc((size_t)o->rtt, sizeof(double)), *tr = calloc((size_t)o->rtt, sizeof(double));
    double *td = calloc((size_t)o->rtt, sizeof(double));
    sp_buf b = {0}, d = {0};
    int bad = !ts || !tr || !td || make_msg(&b, (size_t)o->small) || make_msg(&d, (size_t)o->small);
    for (int i = -100; i < o->rtt && !bad; i++) {
        uint64_t t0 = sp_now_ns();
        bad = ws_round(p->ws, &b, &p->err);
        uint64_t t1 = sp_now_ns();
        bad = bad || raw_round(p->raw_fd, 1, p->raw_buf, (size_t)o->small);
        uint64_t t2 = sp_now_ns();
        bad = bad || ws_round(p->direct, &d, &p->err);
        uint64_t t3 = sp_now_ns();
        if (i >= 0) {
            ts[i] = (double)(t1 - t0) / 1e3;
            tr[i] = (double)(t2 - t1) / 1e3;
            td[i] = (double)(t3 - t2) / 1e3;
        }
    }
    if (!bad) {
        ws[0] = median(ts, o->rtt);
        ws[1] = ts[(size_t)((o->rtt - 1) * 0.99)];
        raw[0] = median(tr, o->rtt);
        raw[1] = tr[(size_t)((o->rtt - 1) * 0.99)];
        direct[0] = median(td, o->rtt);
        direct[1] = td[(size_t)((o->rtt - 1) * 0.99)];
    }
    sp_buf_free(&b);
    sp_buf_free(&d);
    free(ts);
    free(tr);
    free(td);
    return bad ? -1 : 0;
}

/* The big buffers must still hold the original bytes after all the echoes. */
static int verify(const paths *p, const opts *o)
{
    sp_buf ref = {0};
    size_t n = (size_t)o->size_mib << 20;
    int ok = make_msg(&ref, n) == 0 && p->ws_buf.len == n && p->bulk_buf.len == n &&
             memcmp(ref.data, p->ws_buf.data, n) == 0 && memcmp(ref.data, p->bulk_buf.data, n) == 0 &&
             memcmp(ref.data, p->raw_buf, n) == 0;
    sp_buf_free(&ref);
    return ok ? 0 : -1;
}

static int setup(paths *p, const opts *o, raw_echo *re, pthread_t *th, int fds[2])
{
    size_t n = (size_t)o->size_mib << 20;
    sp_err err = {0};
    sp_transport_opts so;
    sp_transport_opts_default(&so);
    so.bulk_threshold = 1; /* replies go back on the channel a client attached (as sepal-server does) */
    if (sp_ws_server_start(&g_server, &so, on_message, on_close, NULL, &err)) {
        fprintf(stderr, "wire: %s\n", err.msg);
        return -1;
    }
    if (tcp_pair(fds) || !(p->raw_buf = malloc(n)) || make_msg(&p->ws_buf, n) || make_msg(&p->bulk_buf, n)) {
        fprintf(stderr, "wire: setup failed\n");
        return -1;
    }
    memcpy(p->raw_buf, p->ws_buf.data, n);
    p->raw_fd = fds[0];
    *re = (raw_echo){.fd = fds[1], .big = n, .small = (size_t)o->small};
    if (pthread_create(th, NULL, raw_echo_main, re))
        return -1;
    p->echo_started = 1;
    p->ws = ws_connect(0, &p->err);
    p->bulk = p->ws ? ws_connect(1, &p->err) : NULL;
    p->direct = p->bulk ? ws_connect(2, &p->err) : NULL;
    if (!p->direct) {
        fprintf(stderr, "wire: %s\n", p->err.msg);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    opts o;
    if (parse_args(argc, argv, &o))
        return 2;
    paths p = {0};
    raw_echo re;
    pthread_t th;
    int fds[2] = {-1, -1}, rc = 1;
    double mbs[3], ws[2], raw[2], direct[2];
    if (setup(&p, &o, &re, &th, fds) == 0) {
        printf("wire: loopback, %d MiB messages echoed, %d round trips per rep, %d reps (A B C alternating, "
               "median)\n", o.size_mib, o.msgs, o.reps);
        fflush(stdout);
        if (run_throughput(&p, &o, mbs) || run_rtt(&p, &o, ws, raw, direct) || verify(&p, &o)) {
            fprintf(stderr, "wire: run failed: %s\n", p.err.msg[0] ? p.err.msg : "echo differs");
        } else {
            printf("  raw TCP          %8.1f MB/s\n", mbs[0]);
            printf("  sp_ws (ws only)  %8.1f MB/s   ws/raw   %.3f\n", mbs[1], mbs[1] / mbs[0]);
            printf("  sp_ws + bulk     %8.1f MB/s   bulk/raw %.3f   (goal >= 0.5)\n", mbs[2], mbs[2] / mbs[0]);
            printf("small message RTT, %d B, %d round trips:\n", o.small, o.rtt);
            printf("  sp_ws            median %7.1f us   p99 %7.1f us\n", ws[0], ws[1]);
            printf("  sp_ws + bulk, direct (sp_remote's mode) median %7.1f us   p99 %7.1f us\n", direct[0], direct[1]);
            printf("  raw TCP          median %7.1f us   p99 %7.1f us\n", raw[0], raw[1]);
            printf("  ratios to raw TCP (medians): ws only %.2f, bulk direct %.2f   (goal <= 2)\n", ws[0] / raw[0],
                   direct[0] / raw[0]);
            rc = 0;
        }
    }
    sp_ws_client_close(p.ws);
    sp_ws_client_close(p.bulk);
    sp_ws_client_close(p.direct);
    sp_ws_server_stop(g_server);
    if (fds[0] >= 0)
        shutdown(fds[0], SHUT_RDWR);
    if (p.echo_started)
        pthread_join(th, NULL);
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    free(p.raw_buf);
    sp_buf_free(&p.ws_buf);
    sp_buf_free(&p.bulk_buf);
    return rc;
}
