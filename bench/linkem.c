/* linkem.c - a link emulator for tests and benches: TCP relays that add a one-way delay and a rate limit in each
 * direction, in user space (this kernel has no netem). One process runs any number of links; each link is a
 * listening address and the address it leads to:
 *
 *   linkem [--delay MS[/MS]] [--rate MBIT[/MBIT]] --listen HOST:PORT --to HOST:PORT [--delay ...]
 *          [--from HOST [--delay ...] [--rate ...]]... [--listen ...]...
 *
 * Options before the first --listen are every link's defaults; after one, they are that link's. A pair A/B is
 * "toward --to / back"; one value is both ways. `--from HOST` (after a --listen) gives the connections that come
 * from that source address a path of their own (its own wires, starting as the link's), which the --delay and
 * --rate after it set: so one server's link can be slow from the client and fast from the other servers (each
 * connecting from an address of its own, `sepal-server --source-address`). Each link prints `linkem: HOST:PORT ->
 * HOST:PORT, ...` on stdout once it listens (port 0: the port it got), and each --from a line `linkem:   from HOST,
 * ...`, then `linkem: ready`; on SIGTERM or SIGINT it closes everything, prints each link's counts on stderr and
 * exits 0.
 *
 * The model, per link and direction: a wire of `rate` bits/s (shared by the link's connections, first come first
 * served) followed by `delay`. Bytes are read as they arrive, timestamped, cut into segments of about a
 * millisecond of the rate (1460 B to 64 KiB), and each segment is released to the far side when its last bit has
 * crossed the wire and the delay has passed (timestamps per segment, slept on with ppoll's nanoseconds, so delays
 * do not add up over writes). A FIN travels the same way (half-close: the far side sees EOF after the data before
 * it), a reset at once. The TCP handshake's round trip is kept: no byte of a new connection reaches the far side
 * before 2 x delay toward + delay back after the connect. Memory is bounded: each direction of a connection holds
 * at most --buffer bytes (default 4096 KiB) in flight, then stops reading (TCP backpressure on the sender), so an
 * unlimited rate is capped at buffer / delay; at most --max-conns connections a link (default 1024). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "opt.h"
#include "timeutil.h"

#define READ_MAX (64 << 10)
#define SEG_MIN 1460
#define SEG_MAX (64 << 10)

typedef struct seg {
    struct seg *next;
    uint64_t release;      /* ns (CLOCK_MONOTONIC) when it may reach the far side */
    uint32_t len, off;     /* bytes, bytes written so far */
    int eof;               /* a FIN, no data */
    unsigned char data[];
} seg;

typedef struct wire {      /* one direction of a link */
    uint64_t delay_ns;
    double rate;           /* bytes/s; 0: unlimited */
    uint64_t free_at;      /* ns: when the wire has sent what it was given */
    uint64_t bytes;        /* delivered */
} wire;

typedef struct flow {      /* one direction of a connection: read from in, written to out */
    int in, out;
    wire *w;
    seg *head, *tail;
    size_t queued;         /* bytes of its segments */
    int eof_read, eof_sent;
    uint64_t not_before;   /* the handshake's round trip (toward --to only) */
} flow;

typedef struct emu_link emu_link;

#define MAX_FROM 8

typedef struct path {      /* the wires of the connections from one source address (from[0]: any other) */
    char from[64];         /* the source address as given; "" for the link's own path */
    struct sockaddr_storage addr;
    wire up, down;
    unsigned long accepted;
} path;

typedef struct conn {
    struct conn *next;
    emu_link *l;
    path *p;
    int a, b;              /* the accepted socket, the one to --to */
    int connecting;
    flow up, down;         /* up: a -> b (toward --to), down: b -> a */
} conn;

struct emu_link {
    char listen_spec[256], to_spec[256];
    struct sockaddr_storage to;
    socklen_t to_len;
    int fd;
    path path[MAX_FROM + 1]; /* [0]: connections from any address not named by a --from */
    int npaths;
    size_t buffer;
    int max_conns, nconns;
    unsigned long accepted, refused, failed;
};

typedef struct relay {
    emu_link *links;
    int nlinks;
    conn *conns;
} relay;

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) { (void)sig, g_stop = 1; }

/* ---------------------------------------------------------------------------------------------- */
/* options */

enum { L_LISTEN, L_TO, L_FROM, L_DELAY, L_RATE, L_BUFFER, L_MAX_CONNS, L_HELP, L_NOPTS };
static const sp_opt linkem_opts[] = {
    [L_LISTEN] = {"--listen", SP_OPT_STR, "HOST:PORT", .help = "a new link: the address it listens on (port 0: any)"},
    [L_TO] = {"--to", SP_OPT_STR, "HOST:PORT", .help = "where the link leads"},
    [L_FROM] = {"--from", SP_OPT_STR, "HOST",
                .help = "the link's connections from this source address: the --delay and --rate after it are theirs"},
    [L_DELAY] = {"--delay", SP_OPT_STR, "MS[/MS]", .def = "0",
                 .help = "one-way delay toward --to [/ back], milliseconds (fractions allowed)"},
    [L_RATE] = {"--rate", SP_OPT_STR, "MBIT[/MBIT]", .def = "0",
                .help = "rate toward --to [/ back], Mbit/s, shared by the link's connections; 0: unlimited"},
    [L_BUFFER] = {"--buffer", SP_OPT_INT, "KIB", 4, 1 << 20, .def = "4096",
                  .help = "bytes one direction of a connection holds in flight, KiB"},
    [L_MAX_CONNS] = {"--max-conns", SP_OPT_INT, "N", 1, 1 << 16, .def = "1024",
                     .help = "connections a link carries at once (more are closed at once)"},
    [L_HELP] = {"--help", SP_OPT_FLAG, .short_name = "-h", .help = "this text"},
    [L_NOPTS] = {0},
};

static void print_line(void *user, const char *line) { fprintf(user, "%s\n", line); }

/* "A" or "A/B" (non-negative numbers) into both / each; -1 when malformed. */
static int parse_pair(const char *v, double *fwd, double *back)
{
    char *end = NULL;
    *fwd = strtod(v, &end);
    if (end == v || *fwd < 0)
        return -1;
    *back = *fwd;
    if (*end == '/') {
        const char *b = end + 1;
        *back = strtod(b, &end);
        if (end == b || *back < 0)
            return -1;
    }
    return *end ? -1 : 0;
}

/* A numeric HOST (no port) into an address. */
static int resolve_host(const char *host, struct sockaddr_storage *ss, socklen_t *len)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST}, *ai = NULL;
    if (getaddrinfo(host, NULL, &hints, &ai) || !ai)
        return -1;
    memcpy(ss, ai->ai_addr, ai->ai_addrlen);
    *len = ai->ai_addrlen;
    freeaddrinfo(ai);
    return 0;
}

/* HOST:PORT (the last colon; [v6]:PORT too) into an address. */
static int resolve(const char *spec, int passive, struct sockaddr_storage *ss, socklen_t *len)
{
    char host[256];
    const char *colon = strrchr(spec, ':');
    if (!colon || colon == spec || (size_t)(colon - spec) >= sizeof host)
        return -1;
    memcpy(host, spec, (size_t)(colon - spec));
    host[colon - spec] = '\0';
    char *h = host;
    if (h[0] == '[' && h[strlen(h) - 1] == ']')
        h[strlen(h) - 1] = '\0', h++;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = passive ? AI_PASSIVE : 0}, *ai = NULL;
    if (getaddrinfo(h, colon + 1, &hints, &ai) || !ai)
        return -1;
    memcpy(ss, ai->ai_addr, ai->ai_addrlen);
    *len = ai->ai_addrlen;
    freeaddrinfo(ai);
    return 0;
}

/* Applies option k's value v to link l, its delays and rates to its last path (the link's own, or the last
 * --from's). -1 after a message. */
static int apply(emu_link *l, int k, const char *v)
{
    double a, b;
    path *p = &l->path[l->npaths - 1];
    if (k == L_DELAY || k == L_RATE) {
        if (parse_pair(v, &a, &b)) {
            fprintf(stderr, "linkem: %s: expected a number or A/B, got '%s'\n", linkem_opts[k].name, v);
            return -1;
        }
        if (k == L_DELAY)
            p->up.delay_ns = (uint64_t)(a * 1e6), p->down.delay_ns = (uint64_t)(b * 1e6);
        else
            p->up.rate = a * 1e6 / 8, p->down.rate = b * 1e6 / 8;
    } else if (k == L_FROM) {
        struct sockaddr_storage ss;
        socklen_t len;
        if (l->npaths > MAX_FROM || strlen(v) >= sizeof p->from || resolve_host(v, &ss, &len)) {
            fprintf(stderr, "linkem: --from %s: %s\n", v,
                    l->npaths > MAX_FROM ? "more than 8 --from on one link" : "not an address");
            return -1;
        }
        p[1] = (path){.addr = ss, .up = l->path[0].up, .down = l->path[0].down}; /* as the link's own */
        snprintf(p[1].from, sizeof p[1].from, "%s", v);
        l->npaths++;
    } else if (k == L_BUFFER) {
        l->buffer = (size_t)sp_opt_int(v) << 10;
    } else if (k == L_MAX_CONNS) {
        l->max_conns = (int)sp_opt_int(v);
    } else if (k == L_LISTEN) {
        snprintf(l->listen_spec, sizeof l->listen_spec, "%s", v);
    } else if (k == L_TO) {
        snprintf(l->to_spec, sizeof l->to_spec, "%s", v);
    }
    return 0;
}

static emu_link *add_link(relay *r, const emu_link *dflt)
{
    emu_link *ls = realloc(r->links, (size_t)(r->nlinks + 1) * sizeof *ls);
    if (!ls)
        return NULL;
    r->links = ls;
    ls[r->nlinks] = *dflt;
    return &ls[r->nlinks++];
}

/* 0 to run, 1 to exit 0 (--help), 2 after a usage error. */
static int parse_args(int argc, char **argv, relay *r)
{
    emu_link dflt = {.fd = -1, .npaths = 1};
    for (int k = 0; k < L_NOPTS; k++)
        if (linkem_opts[k].def)
            apply(&dflt, k, linkem_opts[k].def);
    sp_opt_parser p = {.opts = linkem_opts, .argc = argc, .argv = argv};
    int k = -1;
    const char *v = NULL;
    char why[512];
    emu_link *cur = &dflt;
    for (sp_opt_got got; (got = sp_opt_next(&p, &k, &v, why, sizeof why)) != SP_OPT_END;) {
        if (got != SP_OPT_OPTION) {
            fprintf(stderr, "linkem: %s (--help lists the options)\n", got == SP_OPT_BAD ? why : "unknown option");
            return 2;
        }
        if (k == L_HELP) {
            printf("usage: linkem [options] --listen HOST:PORT --to HOST:PORT [options] [--listen ...]...\n\n");
            sp_opt_help(linkem_opts, 110, print_line, stdout);
            return 1;
        }
        if (k == L_LISTEN && !(cur = add_link(r, &dflt)))
            return fprintf(stderr, "linkem: out of memory\n"), 2;
        if ((k == L_TO || k == L_FROM) && cur == &dflt)
            return fprintf(stderr, "linkem: %s comes after its --listen\n", linkem_opts[k].name), 2;
        if (apply(cur, k, v))
            return 2;
    }
    for (int i = 0; i < r->nlinks; i++)
        if (!r->links[i].to_spec[0])
            return fprintf(stderr, "linkem: --listen %s has no --to\n", r->links[i].listen_spec), 2;
    if (!r->nlinks)
        return fprintf(stderr, "linkem: give at least one --listen HOST:PORT --to HOST:PORT\n"), 2;
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* sockets */

static void set_nodelay_nonblock(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

static void addr_str(const struct sockaddr_storage *ss, char *buf, size_t cap)
{
    char h[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *s = (const void *)ss;
        inet_ntop(AF_INET, &s->sin_addr, h, sizeof h);
        port = ntohs(s->sin_port);
        snprintf(buf, cap, "%s:%d", h, port);
    } else {
        const struct sockaddr_in6 *s = (const void *)ss;
        inet_ntop(AF_INET6, &s->sin6_addr, h, sizeof h);
        port = ntohs(s->sin6_port);
        snprintf(buf, cap, "[%s]:%d", h, port);
    }
}

/* The link's line, then one a --from. */
static void describe(const emu_link *l, const char *bound)
{
    for (int i = 0; i < l->npaths; i++) {
        const path *p = &l->path[i];
        char ru[32] = "unlimited", rd[32] = "unlimited", head[600];
        if (p->up.rate > 0)
            snprintf(ru, sizeof ru, "%g Mbit/s", p->up.rate * 8 / 1e6);
        if (p->down.rate > 0)
            snprintf(rd, sizeof rd, "%g Mbit/s", p->down.rate * 8 / 1e6);
        if (i)
            snprintf(head, sizeof head, "  from %s", p->from);
        else
            snprintf(head, sizeof head, "%s -> %s", bound, l->to_spec);
        printf("linkem: %s, delay %g ms / %g ms, rate %s / %s (toward / back)\n", head, (double)p->up.delay_ns / 1e6,
               (double)p->down.delay_ns / 1e6, ru, rd);
    }
}

static int open_link(emu_link *l)
{
    struct sockaddr_storage ss;
    socklen_t len = 0;
    if (resolve(l->listen_spec, 1, &ss, &len) || resolve(l->to_spec, 0, &l->to, &l->to_len)) {
        fprintf(stderr, "linkem: cannot resolve %s\n", len ? l->to_spec : l->listen_spec);
        return -1;
    }
    int one = 1;
    l->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (l->fd < 0 || setsockopt(l->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
        bind(l->fd, (struct sockaddr *)&ss, len) || listen(l->fd, 128)) {
        fprintf(stderr, "linkem: cannot listen on %s: %s\n", l->listen_spec, strerror(errno));
        return -1;
    }
    len = sizeof ss;
    getsockname(l->fd, (struct sockaddr *)&ss, &len);
    char bound[300];
    addr_str(&ss, bound, sizeof bound);
    describe(l, bound);
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* flows */

static size_t seg_size(const wire *w)
{
    double s = w->rate > 0 ? w->rate / 1000 : SEG_MAX; /* a millisecond of the wire */
    return s < SEG_MIN ? SEG_MIN : s > SEG_MAX ? SEG_MAX : (size_t)s;
}

/* Queues n bytes (or, n 0, a FIN) read at now: each segment leaves the wire when its last bit has (the wire is
 * shared: it starts when the wire is free) and arrives delay later. */
static int enqueue(flow *f, const unsigned char *p, size_t n, uint64_t now)
{
    size_t step = seg_size(f->w);
    do {
        size_t len = n < step ? n : step;
        seg *s = malloc(sizeof *s + len);
        if (!s)
            return -1;
        *s = (seg){.len = (uint32_t)len, .eof = n == 0};
        memcpy(s->data, p, len);
        uint64_t start = f->w->free_at > now ? f->w->free_at : now;
        uint64_t sent = f->w->rate > 0 ? start + (uint64_t)((double)len / f->w->rate * 1e9) : now;
        if (f->w->rate > 0)
            f->w->free_at = sent;
        s->release = sent + f->w->delay_ns;
        if (s->release < f->not_before)
            s->release = f->not_before;
        if (f->tail && s->release < f->tail->release)
            s->release = f->tail->release; /* in order */
        if (f->tail)
            f->tail->next = s;
        else
            f->head = s;
        f->tail = s;
        f->queued += len;
        p += len;
        n -= len;
    } while (n > 0);
    return 0;
}

static void flow_free(flow *f)
{
    while (f->head) {
        seg *s = f->head;
        f->head = s->next;
        free(s);
    }
    f->tail = NULL;
    f->queued = 0;
}

/* Reads what fits from f->in; -1 on an error (reset). */
static int flow_read(flow *f, size_t cap, uint64_t now)
{
    static unsigned char buf[READ_MAX];
    size_t room = cap > f->queued ? cap - f->queued : 0;
    if (room == 0)
        return 0; /* full (polled for a hang-up only): not an EOF */
    ssize_t n = recv(f->in, buf, room < sizeof buf ? room : sizeof buf, 0);
    if (n < 0)
        return errno == EAGAIN || errno == EINTR ? 0 : -1;
    if (n == 0)
        f->eof_read = 1;
    return enqueue(f, buf, (size_t)n, now);
}

/* Writes the released segments to f->out; -1 on an error. */
static int flow_write(flow *f, uint64_t now)
{
    while (f->head && f->head->release <= now) {
        seg *s = f->head;
        if (s->eof) {
            shutdown(f->out, SHUT_WR);
            f->eof_sent = 1;
        } else {
            ssize_t n = send(f->out, s->data + s->off, s->len - s->off, MSG_NOSIGNAL);
            if (n < 0)
                return errno == EAGAIN || errno == EINTR ? 0 : -1;
            s->off += (uint32_t)n;
            f->w->bytes += (uint64_t)n;
            if (s->off < s->len)
                return 0;
        }
        f->head = s->next;
        if (!f->head)
            f->tail = NULL;
        f->queued -= s->len;
        free(s);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* connections */

static void conn_close(relay *r, conn *c, int reset)
{
    struct linger lg = {1, 0};
    for (int i = 0; i < 2; i++) {
        int fd = i ? c->b : c->a;
        if (fd >= 0 && reset)
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        if (fd >= 0)
            close(fd);
    }
    flow_free(&c->up);
    flow_free(&c->down);
    for (conn **p = &r->conns; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    c->l->nconns--;
    free(c);
}

/* The path of a connection from address ss: its --from's, else the link's own. */
static path *path_of(emu_link *l, const struct sockaddr_storage *ss)
{
    for (int i = 1; i < l->npaths; i++) {
        const struct sockaddr_storage *f = &l->path[i].addr;
        if (f->ss_family != ss->ss_family)
            continue;
        if (ss->ss_family == AF_INET &&
            ((const struct sockaddr_in *)f)->sin_addr.s_addr == ((const struct sockaddr_in *)ss)->sin_addr.s_addr)
            return &l->path[i];
        if (ss->ss_family == AF_INET6 && !memcmp(&((const struct sockaddr_in6 *)f)->sin6_addr,
                                                 &((const struct sockaddr_in6 *)ss)->sin6_addr, sizeof(struct in6_addr)))
            return &l->path[i];
    }
    return &l->path[0];
}

static void accept_one(relay *r, emu_link *l, uint64_t now)
{
    struct sockaddr_storage peer = {0};
    socklen_t plen = sizeof peer;
    int a = accept4(l->fd, (struct sockaddr *)&peer, &plen, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (a < 0)
        return;
    if (l->nconns >= l->max_conns) {
        l->refused++;
        close(a);
        return;
    }
    int b = socket(l->to.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    conn *c = b >= 0 ? calloc(1, sizeof *c) : NULL;
    if (!c || (connect(b, (struct sockaddr *)&l->to, l->to_len) && errno != EINPROGRESS)) {
        l->failed++;
        free(c);
        close(a);
        if (b >= 0)
            close(b);
        return;
    }
    set_nodelay_nonblock(a);
    set_nodelay_nonblock(b);
    path *p = path_of(l, &peer);
    *c = (conn){.next = r->conns, .l = l, .p = p, .a = a, .b = b, .connecting = 1};
    /* SYN toward, SYN-ACK back, then the first data toward */
    c->up = (flow){.in = a, .out = b, .w = &p->up, .not_before = now + 2 * p->up.delay_ns + p->down.delay_ns};
    c->down = (flow){.in = b, .out = a, .w = &p->down};
    p->accepted++;
    r->conns = c;
    l->nconns++;
    l->accepted++;
}

/* After poll: the connect's outcome, reads, writes; returns 0, or -1 when c must be reset, 1 when it is done. */
static int conn_step(conn *c, short ra, short rb, uint64_t now)
{
    if (c->connecting && rb) {
        int e = 0;
        socklen_t el = sizeof e;
        getsockopt(c->b, SOL_SOCKET, SO_ERROR, &e, &el);
        if (e) {
            c->l->failed++;
            return -1;
        }
        c->connecting = 0;
        rb &= ~POLLOUT;
    }
    if ((ra | rb) & POLLERR)
        return -1; /* a reset (or another error) on either side: reset the other */
    size_t cap = c->l->buffer;
    if ((ra & (POLLIN | POLLHUP | POLLERR)) && !c->up.eof_read && flow_read(&c->up, cap, now))
        return -1;
    if (!c->connecting && (rb & (POLLIN | POLLHUP | POLLERR)) && !c->down.eof_read && flow_read(&c->down, cap, now))
        return -1;
    if (!c->connecting && flow_write(&c->up, now))
        return -1;
    if (flow_write(&c->down, now))
        return -1;
    return c->up.eof_sent && c->down.eof_sent ? 1 : 0;
}

static short want_read(const flow *f, size_t cap, int can)
{
    return can && !f->eof_read && f->queued < cap ? POLLIN : 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* the loop */

/* The pollfds: the links' listening sockets, then two per connection in list order; *wait_ns: to the next
 * release (UINT64_MAX: none). The number of pollfds, or -1. */
static int build_poll(relay *r, struct pollfd **pfd, int *cap, uint64_t now, uint64_t *wait_ns)
{
    int n = r->nlinks;
    for (conn *c = r->conns; c; c = c->next)
        n += 2;
    if (n > *cap) {
        struct pollfd *p = realloc(*pfd, (size_t)n * sizeof *p);
        if (!p)
            return -1;
        *pfd = p;
        *cap = n;
    }
    for (int k = 0; k < r->nlinks; k++) /* over the cap too: such a connection is accepted and closed */
        (*pfd)[k] = (struct pollfd){.fd = r->links[k].fd, .events = POLLIN};
    *wait_ns = UINT64_MAX;
    int i = r->nlinks;
    for (conn *c = r->conns; c; c = c->next, i += 2) {
        short ea = want_read(&c->up, c->l->buffer, 1), eb = want_read(&c->down, c->l->buffer, !c->connecting);
        if (c->connecting)
            eb |= POLLOUT;
        const seg *h[2] = {c->connecting ? NULL : c->up.head, c->down.head};
        for (int d = 0; d < 2; d++) {
            if (!h[d])
                continue;
            if (h[d]->release <= now)
                *(d ? &ea : &eb) |= POLLOUT; /* due: wait until its socket takes it */
            else if (h[d]->release - now < *wait_ns)
                *wait_ns = h[d]->release - now;
        }
        /* a socket with nothing to wait for is left out (-1): a hang-up poll cannot mask would spin */
        (*pfd)[i] = (struct pollfd){.fd = ea ? c->a : -1, .events = ea};
        (*pfd)[i + 1] = (struct pollfd){.fd = eb ? c->b : -1, .events = eb};
    }
    return n;
}

/* The connections in the order build_poll listed them, then new ones (they join the next round). */
static void service(relay *r, const struct pollfd *pfd, int n, uint64_t now)
{
    int i = r->nlinks;
    for (conn *c = r->conns, *next; c && i + 1 < n; c = next, i += 2) {
        next = c->next;
        int st = conn_step(c, pfd[i].revents, pfd[i + 1].revents, now);
        if (st)
            conn_close(r, c, st < 0);
    }
    for (int k = 0; k < r->nlinks; k++)
        for (int j = 0; j < 16 && (pfd[k].revents & POLLIN); j++) /* a burst of connects at once */
            accept_one(r, &r->links[k], now);
}

static int run(relay *r)
{
    sigset_t block, during;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigprocmask(SIG_BLOCK, &block, &during); /* the signals arrive only inside ppoll: no wake-up is lost */
    sigdelset(&during, SIGINT);
    sigdelset(&during, SIGTERM);
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    struct pollfd *pfd = NULL;
    int cap = 0;
    while (!g_stop) {
        uint64_t wait_ns;
        int n = build_poll(r, &pfd, &cap, sp_now_ns(), &wait_ns);
        if (n < 0)
            break;
        struct timespec ts = {(time_t)(wait_ns / 1000000000u), (long)(wait_ns % 1000000000u)};
        int got = ppoll(pfd, (nfds_t)n, wait_ns == UINT64_MAX ? NULL : &ts, &during);
        if (got < 0 && errno != EINTR)
            break;
        if (got < 0)
            continue;
        service(r, pfd, n, sp_now_ns());
    }
    free(pfd);
    return g_stop ? 0 : 1;
}

static void shut(relay *r)
{
    while (r->conns)
        conn_close(r, r->conns, 1);
    for (int i = 0; i < r->nlinks; i++) {
        emu_link *l = &r->links[i];
        fprintf(stderr, "linkem: %s -> %s: %lu connections (%lu refused, %lu failed to connect), %llu bytes toward, "
                "%llu back\n", l->listen_spec, l->to_spec, l->accepted, l->refused, l->failed,
                (unsigned long long)l->path[0].up.bytes, (unsigned long long)l->path[0].down.bytes);
        for (int k = 1; k < l->npaths; k++)
            fprintf(stderr, "linkem:   from %s: %lu connections, %llu bytes toward, %llu back\n", l->path[k].from,
                    l->path[k].accepted, (unsigned long long)l->path[k].up.bytes,
                    (unsigned long long)l->path[k].down.bytes);
        if (l->fd >= 0)
            close(l->fd);
    }
    free(r->links);
}

int main(int argc, char **argv)
{
    relay r = {0};
    int rc = parse_args(argc, argv, &r);
    if (rc) {
        free(r.links);
        return rc == 1 ? 0 : rc;
    }
    for (int i = 0; !rc && i < r.nlinks; i++)
        rc = open_link(&r.links[i]) ? 1 : 0;
    if (!rc) {
        printf("linkem: ready\n");
        fflush(stdout);
        rc = run(&r);
    }
    shut(&r);
    return rc;
}
