/* attack.c - see attack.h. */
#include "attack.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "proto.h"

#define CHUNK (64 << 10)
#define MAXCONNS 4096

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------------------------------------- */
/* raw websocket */

int sp_atk_connect(const char *src, int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET};
    struct timeval tv = {.tv_sec = 2};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (inet_pton(AF_INET, src, &a.sin_addr) != 1 || bind(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    return fd;
}

static int send_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

static int read_exact(int fd, uint8_t *p, size_t n)
{
    while (n) {
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

int sp_atk_upgrade(int fd)
{
    static const char req[] = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                              "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                              "Sec-WebSocket-Protocol: sepal\r\n\r\n";
    if (send_all(fd, req, sizeof req - 1))
        return 1;
    char resp[2048];
    size_t n = 0;
    while (n < sizeof resp - 1) {
        ssize_t r = recv(fd, resp + n, 1, 0); /* byte by byte: nothing after the blank line is ours to take */
        if (r <= 0)
            return 1;
        n += (size_t)r;
        resp[n] = '\0';
        if (n >= 4 && !memcmp(resp + n - 4, "\r\n\r\n", 4))
            break;
    }
    return strstr(resp, " 101 ") ? 0 : strstr(resp, " 503 ") ? 1 : -1;
}

/* A client frame header (masked) for a payload of len bytes; returns its size. */
size_t sp_atk_frame_header(uint8_t *h, int opcode, int fin, uint64_t len, const uint8_t mask[4])
{
    size_t k = 2;
    h[0] = (uint8_t)((fin ? 0x80 : 0) | opcode);
    if (len < 126) {
        h[1] = (uint8_t)(0x80 | len);
    } else if (len < 65536) {
        h[1] = 0x80 | 126;
        h[2] = (uint8_t)(len >> 8);
        h[3] = (uint8_t)len;
        k = 4;
    } else {
        h[1] = 0x80 | 127;
        for (int i = 0; i < 8; i++)
            h[2 + i] = (uint8_t)(len >> (56 - 8 * i));
        k = 10;
    }
    memcpy(h + k, mask, 4);
    return k + 4;
}

int sp_atk_send_masked(int fd, const uint8_t *p, size_t n, uint64_t at, const uint8_t mask[4])
{
    uint8_t buf[CHUNK];
    while (n) {
        size_t k = n < sizeof buf ? n : sizeof buf;
        for (size_t i = 0; i < k; i++)
            buf[i] = p[i] ^ mask[(at + i) & 3];
        if (send_all(fd, buf, k))
            return -1;
        p += k;
        n -= k;
        at += k;
    }
    return 0;
}

int sp_atk_send_msg(int fd, const uint8_t *p, size_t n)
{
    uint8_t mask[4] = {0x12, 0x34, 0x56, 0x78}, *b = malloc(n + 14);
    if (!b)
        return -1;
    size_t h = sp_atk_frame_header(b, 2, 1, n, mask);
    for (size_t i = 0; i < n; i++)
        b[h + i] = p[i] ^ mask[i & 3];
    int r = send_all(fd, b, h + n);
    free(b);
    return r;
}

/* A server frame from buf[0..len): its header size and payload length in *plen, or 0 if incomplete. */
static size_t parse_frame(const uint8_t *buf, size_t len, uint64_t *plen)
{
    if (len < 2)
        return 0;
    uint64_t l = buf[1] & 0x7f;
    size_t h = 2;
    if (l == 126) {
        if (len < 4)
            return 0;
        l = (uint64_t)buf[2] << 8 | buf[3];
        h = 4;
    } else if (l == 127) {
        if (len < 10)
            return 0;
        l = 0;
        for (int i = 0; i < 8; i++)
            l = l << 8 | buf[2 + i];
        h = 10;
    }
    *plen = l;
    return h;
}

int sp_atk_recv_msg(int fd, uint8_t **out, size_t *n)
{
    uint8_t *msg = NULL;
    size_t mlen = 0;
    for (;;) {
        uint8_t h[10];
        uint64_t plen = 0;
        if (read_exact(fd, h, 2))
            break;
        size_t need = (h[1] & 0x7f) == 126 ? 4 : (h[1] & 0x7f) == 127 ? 10 : 2;
        if (need > 2 && read_exact(fd, h + 2, need - 2))
            break;
        parse_frame(h, need, &plen);
        int op = h[0] & 0x0f, fin = h[0] & 0x80;
        if (op == 8 || plen > (1u << 30))
            break;
        uint8_t *m = realloc(msg, mlen + plen + 1);
        if (!m || read_exact(fd, m + mlen, plen)) {
            free(m ? m : msg);
            return -1;
        }
        msg = m;
        if (op == 9 || op == 10) /* ping / pong: not part of a message */
            continue;
        mlen += plen;
        if (fin) {
            *out = msg;
            *n = mlen;
            return 0;
        }
    }
    free(msg);
    return -1;
}

/* ---------------------------------------------------------------------------------------------- */
/* the attack thread */

enum { S_NONE, S_WAIT, S_ACTIVE, S_DONE };

typedef struct slot {
    int fd, state;
    double next_at;  /* S_WAIT: when to connect again; SLOWLORIS: the next byte */
    uint64_t pos;    /* bytes of the message (frame payload) sent */
    int partial;     /* FLOOD: bytes of the current request sent */
    int trickle;     /* SLOWLORIS: bytes trickled so far */
    double opened_at; /* BULK: when the connection was made */
} slot;

struct sp_atk {
    sp_atk_opts o;
    pthread_t th;
    atomic_int stop, drain, drained;
    pthread_mutex_t mu;
    sp_atk_stats st;
    slot *slots;
    uint8_t hello[256];
    size_t hello_len;
    uint8_t req[64]; /* FLOOD: one INFO request, framed and masked */
    size_t req_len;
    uint8_t msg_hdr[SP_PROTO_HEADER_SIZE];
    uint8_t *rx;     /* FLOOD drain: unparsed input */
    size_t rx_len, rx_cap;
};

static void bump(sp_atk *a, long *field, long d)
{
    pthread_mutex_lock(&a->mu);
    *field += d;
    pthread_mutex_unlock(&a->mu);
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* The server refused slot s (or the connect failed): its socket closed, a retry in 50 ms if it reconnects. */
static void slot_refused(sp_atk *a, slot *s)
{
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
    s->state = a->o.reconnect ? S_WAIT : S_DONE;
    s->next_at = now_s() + 0.05;
    bump(a, &a->st.refused, 1);
}

/* Opens slot i: TCP, then (but for SLOWLORIS) the upgrade and HELLO; S_ACTIVE, or S_WAIT after a refusal. */
static void slot_open(sp_atk *a, slot *s)
{
    s->pos = 0;
    s->partial = 0;
    s->trickle = 0;
    s->fd = sp_atk_connect(a->o.src, a->o.port);
    if (s->fd < 0) {
        slot_refused(a, s);
        return;
    }
    bump(a, &a->st.connects, 1);
    if (a->o.kind == SP_ATK_BULK) { /* part of "SPBK" + 0 + token, then nothing */
        s->opened_at = now_s();
        if (send(s->fd, "SPB", 3, MSG_NOSIGNAL) != 3) {
            slot_refused(a, s);
            return;
        }
    } else if (a->o.kind == SP_ATK_SLOWLORIS) {
        static const char start[] = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n";
        send_all(s->fd, start, sizeof start - 1);
        s->next_at = now_s() + 0.5;
    } else {
        uint8_t *rep = NULL;
        size_t n = 0;
        int up = sp_atk_upgrade(s->fd);
        if (up || sp_atk_send_msg(s->fd, a->hello, a->hello_len) || sp_atk_recv_msg(s->fd, &rep, &n) ||
            n < SP_PROTO_HEADER_SIZE || rep[8] != SP_MSG_HELLO) {
            free(rep);
            slot_refused(a, s);
            return;
        }
        free(rep);
        bump(a, &a->st.upgraded, 1);
    }
    fcntl(s->fd, F_SETFL, fcntl(s->fd, F_GETFL) | O_NONBLOCK);
    s->state = S_ACTIVE;
    bump(a, &a->st.open, 1);
}

static void slot_closed(sp_atk *a, slot *s)
{
    close(s->fd);
    s->fd = -1;
    bump(a, &a->st.open, -1);
    int at_once = a->o.kind == SP_ATK_BULK && now_s() - s->opened_at < 1.0;
    bump(a, at_once ? &a->st.refused : &a->st.closed, 1);
    s->state = a->o.reconnect ? S_WAIT : S_DONE;
    s->next_at = now_s() + 0.05;
}

/* HUGE, BUDGET: one frame, not final, whose payload starts with the message's header; send_bytes of its body. */
static void pump_message(sp_atk *a, slot *s)
{
    static const uint8_t mask[4] = {1, 2, 3, 4};
    uint64_t total = SP_PROTO_HEADER_SIZE + a->o.send_bytes;
    uint8_t buf[CHUNK + 14];
    while (s->pos < total) {
        size_t k = 0;
        if (s->pos == 0)
            k = sp_atk_frame_header(buf, 2, 0, a->o.msg_bytes, mask);
        size_t room = CHUNK, start = k;
        for (; k - start < room && s->pos + (k - start) < total; k++) {
            uint64_t at = s->pos + (k - start);
            buf[k] = (at < SP_PROTO_HEADER_SIZE ? a->msg_hdr[at] : 0) ^ mask[at & 3];
        }
        ssize_t w = send(s->fd, buf, k, MSG_NOSIGNAL);
        if (w <= 0)
            return;                        /* full: the server is not reading */
        if ((size_t)w < start) {           /* part of the frame header: rare; start over on this socket later */
            s->pos = total;
            return;
        }
        s->pos += (uint64_t)w - start;
        if ((size_t)w < k)
            return;
    }
}

/* FLOOD: INFO requests until the socket is full. */
static void pump_requests(sp_atk *a, slot *s)
{
    for (;;) {
        if (a->o.max_requests && !s->partial && a->st.sent >= a->o.max_requests) /* this thread alone writes it */
            return;
        ssize_t w = send(s->fd, a->req + s->partial, a->req_len - (size_t)s->partial, MSG_NOSIGNAL);
        if (w <= 0)
            return;
        s->partial += (int)w;
        if ((size_t)s->partial == a->req_len) {
            s->partial = 0;
            bump(a, &a->st.sent, 1);
        }
    }
}

/* SLOWLORIS: one more byte of an endless header section. */
static void trickle(sp_atk *a, slot *s)
{
    static const char line[] = "X-Slow: a\r\n";
    if (now_s() < s->next_at)
        return;
    char c = line[s->trickle++ % (int)(sizeof line - 1)];
    if (send(s->fd, &c, 1, MSG_NOSIGNAL) < 0 && errno != EAGAIN)
        slot_closed(a, s);
    s->next_at = now_s() + 0.5;
    (void)a;
}

/* Reads what the server sent: EOF (or a refusal) closes the slot. */
static void slot_read(sp_atk *a, slot *s)
{
    char buf[4096];
    for (;;) {
        ssize_t r = recv(s->fd, buf, sizeof buf, 0);
        if (r > 0)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EINTR))
            return;
        slot_closed(a, s);
        return;
    }
}

/* FLOOD drain: replies parsed out of the stream and counted. */
static void drain_read(sp_atk *a, slot *s)
{
    for (;;) {
        if (a->rx_cap - a->rx_len < CHUNK) {
            uint8_t *n = realloc(a->rx, a->rx_cap + 4 * CHUNK);
            if (!n)
                return;
            a->rx = n;
            a->rx_cap += 4 * CHUNK;
        }
        ssize_t r = recv(s->fd, a->rx + a->rx_len, a->rx_cap - a->rx_len, 0);
        if (r <= 0) {
            if (r == 0 || (errno != EAGAIN && errno != EINTR))
                slot_closed(a, s);
            break;
        }
        a->rx_len += (size_t)r;
    }
    size_t off = 0;
    for (;;) {
        uint64_t plen;
        size_t h = parse_frame(a->rx + off, a->rx_len - off, &plen);
        if (!h || a->rx_len - off < h + plen)
            break;
        const uint8_t *p = a->rx + off + h;
        int ok = (a->rx[off] & 0x8f) == 0x82 && plen >= SP_PROTO_HEADER_SIZE && p[8] == SP_MSG_INFO && (p[10] & 1);
        bump(a, ok ? &a->st.replies : &a->st.bad, 1);
        off += h + plen;
    }
    memmove(a->rx, a->rx + off, a->rx_len - off);
    a->rx_len -= off;
}

static void step(sp_atk *a, int n, struct pollfd *pfd)
{
    int draining = atomic_load(&a->drain);
    for (int i = 0; i < n; i++) {
        slot *s = &a->slots[i];
        if (s->state == S_WAIT && now_s() >= s->next_at)
            slot_open(a, s);
        if (s->state != S_ACTIVE)
            continue;
        short re = pfd[i].revents;
        if (a->o.kind == SP_ATK_FLOOD) {
            if (draining && (re & (POLLIN | POLLHUP | POLLERR)))
                drain_read(a, s);
            if (s->state == S_ACTIVE && (!draining || s->partial))
                pump_requests(a, s);
            continue;
        }
        if (re & (POLLIN | POLLHUP | POLLERR))
            slot_read(a, s);
        if (s->state != S_ACTIVE)
            continue;
        if (a->o.kind == SP_ATK_HUGE || a->o.kind == SP_ATK_BUDGET)
            pump_message(a, s);
        else if (a->o.kind == SP_ATK_SLOWLORIS)
            trickle(a, s);
    }
}

static void *atk_main(void *arg)
{
    sp_atk *a = arg;
    int n = a->o.conns;
    struct pollfd *pfd = calloc((size_t)n, sizeof *pfd);
    for (int i = 0; i < n && !atomic_load(&a->stop); i++)
        slot_open(a, &a->slots[i]);
    while (pfd && !atomic_load(&a->stop)) {
        for (int i = 0; i < n; i++) {
            slot *s = &a->slots[i];
            short ev = POLLIN;
            int more = !a->o.max_requests || s->partial || a->st.sent < a->o.max_requests;
            if ((a->o.kind == SP_ATK_FLOOD && more) ||
                ((a->o.kind == SP_ATK_HUGE || a->o.kind == SP_ATK_BUDGET) &&
                 s->pos < SP_PROTO_HEADER_SIZE + a->o.send_bytes))
                ev |= POLLOUT;
            pfd[i] = (struct pollfd){.fd = s->state == S_ACTIVE ? s->fd : -1, .events = ev};
        }
        poll(pfd, (nfds_t)n, 20);
        step(a, n, pfd);
        if (atomic_load(&a->drain)) {
            pthread_mutex_lock(&a->mu);
            int done = a->st.replies + a->st.bad >= a->st.sent && !a->slots[0].partial;
            pthread_mutex_unlock(&a->mu);
            if (done || a->slots[0].state != S_ACTIVE)
                atomic_store(&a->drained, 1);
        }
    }
    free(pfd);
    return NULL;
}

int sp_atk_start(sp_atk **out, const sp_atk_opts *o)
{
    *out = NULL;
    if (o->conns < 1 || o->conns > MAXCONNS)
        return fprintf(stderr, "attack: %d connections\n", o->conns), -1;
    sp_atk *a = calloc(1, sizeof *a);
    a->slots = a ? calloc((size_t)o->conns, sizeof *a->slots) : NULL;
    if (!a || !a->slots)
        return free(a), -1;
    a->o = *o;
    if (a->o.kind == SP_ATK_FLOOD)
        a->o.conns = 1;
    for (int i = 0; i < a->o.conns; i++)
        a->slots[i].fd = -1;
    pthread_mutex_init(&a->mu, NULL);
    sp_buf b = {0};
    sp_msg_encode(&b, SP_MSG_HELLO, 0, 1, "{\"version\":\"1.1\",\"client\":\"attack\"}", NULL, 0, NULL);
    memcpy(a->hello, b.data, b.len);
    a->hello_len = b.len;
    sp_msg_encode(&b, SP_MSG_INFO, 0, 7, NULL, NULL, 0, NULL);
    static const uint8_t mask[4] = {9, 8, 7, 6};
    size_t h = sp_atk_frame_header(a->req, 2, 1, b.len, mask);
    for (size_t i = 0; i < b.len; i++)
        a->req[h + i] = b.data[i] ^ mask[i & 3];
    a->req_len = h + b.len;
    sp_msg_encode(&b, SP_MSG_PING, 0, 99, NULL, NULL, 0, NULL); /* the big message's header: a PING */
    memcpy(a->msg_hdr, b.data, SP_PROTO_HEADER_SIZE);
    put64(a->msg_hdr + 32, a->o.msg_bytes - SP_PROTO_HEADER_SIZE);
    sp_buf_free(&b);
    if (pthread_create(&a->th, NULL, atk_main, a)) {
        free(a->slots);
        free(a);
        return -1;
    }
    *out = a;
    return 0;
}

void sp_atk_stats_get(sp_atk *a, sp_atk_stats *s)
{
    pthread_mutex_lock(&a->mu);
    *s = a->st;
    pthread_mutex_unlock(&a->mu);
}

void sp_atk_drain(sp_atk *a, double timeout_s)
{
    atomic_store(&a->drain, 1);
    double end = now_s() + timeout_s;
    long seen = -1;
    while (!atomic_load(&a->drained) && now_s() < end) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&a->mu);
        long got = a->st.replies + a->st.bad;
        pthread_mutex_unlock(&a->mu);
        if (got != seen) /* still coming: the kernel's buffers may have held a million requests */
            end = now_s() + timeout_s;
        seen = got;
    }
}

void sp_atk_stop(sp_atk *a)
{
    if (!a)
        return;
    atomic_store(&a->stop, 1);
    pthread_join(a->th, NULL);
    for (int i = 0; i < a->o.conns; i++)
        if (a->slots[i].fd >= 0)
            close(a->slots[i].fd);
    pthread_mutex_destroy(&a->mu);
    free(a->rx);
    free(a->slots);
    free(a);
}

/* ---------------------------------------------------------------------------------------------- */
/* a DHT flood */

long sp_atk_dht_flood(int port, int rate, double seconds)
{
    static const unsigned char crash[] = {0x83, 0xa1, 'e', 0x90, 0xa1, 't', 0xc4, 0x04, 0, 0, 0, 2, 0xa1, 'y', 0xa1, 'e'};
    static const unsigned char not_map[] = {0x84, 0xa1, 'a', 0x05, 0xa1, 'q', 0xa4, 'p', 'i', 'n', 'g',
                                            0xa1, 't', 0x07, 0xa1, 'y', 0xa1, 'q'};
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long sent = 0, total = (long)(seconds * rate);
    for (long i = 0; fd >= 0 && i < total; i++) {
        double due = (double)i / rate;
        struct timespec at = {t0.tv_sec + (time_t)due, t0.tv_nsec + (long)((due - (double)(time_t)due) * 1e9)};
        if (at.tv_nsec >= 1000000000L) {
            at.tv_sec++;
            at.tv_nsec -= 1000000000L;
        }
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL);
        const unsigned char *d = i % 2 ? not_map : crash;
        size_t n = i % 2 ? sizeof not_map : sizeof crash;
        sent += sendto(fd, d, n, 0, (struct sockaddr *)&to, sizeof to) == (ssize_t)n;
    }
    if (fd >= 0)
        close(fd);
    return sent;
}

int sp_atk_count_lines(const char *path, const char *text)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    int n = 0;
    while (f && fgets(line, sizeof line, f))
        n += strstr(line, text) != NULL;
    if (f)
        fclose(f);
    return n;
}
