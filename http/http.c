/* http.c - the HTTP/1.1 server of http.h: the listener, a thread per connection, the strict request reader
 * and the answers (whole, or streamed in chunks). */
#include "http.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <unistd.h>

#include "timeutil.h"

struct sp_http {
    sp_http_opts o;
    int lfd, port;
    int stopfd;            /* an eventfd, readable once stopping (every poll of every thread watches it) */
    int stopping;          /* atomic */
    pthread_t listener;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int nconns;            /* connection threads alive */
};

struct sp_http_conn {
    sp_http *s;
    int fd;
    char peer[64];
    char *buf;             /* the head being read, and what came after it (the next pipelined request) */
    size_t len, cap;
    char *head, *path;     /* the head being parsed (a copy), the request's path */
    sp_http_req *req;
    char *body;
    int minor, keep;       /* the request's version; the connection goes on after this answer */
    int answered, streaming, broken;
};

const char *sp_http_reason(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}

static void limits_default(sp_http_limits *l)
{
    if (!l->max_line)
        l->max_line = 8192;
    if (!l->max_headers)
        l->max_headers = 64;
    if (l->max_headers > SP_HTTP_MAX_HEADERS)
        l->max_headers = SP_HTTP_MAX_HEADERS;
    if (!l->max_head)
        l->max_head = 32768;
    if (!l->max_body)
        l->max_body = 1 << 20;
    if (!l->request_timeout_ms)
        l->request_timeout_ms = 10000;
    if (!l->idle_timeout_ms)
        l->idle_timeout_ms = 30000;
    if (!l->write_timeout_ms)
        l->write_timeout_ms = 10000;
    if (!l->max_conns)
        l->max_conns = 64;
}

/* ---------------------------------------------------------------------------------------------- */
/* writing */

/* Sends all of p, waiting for room up to the write timeout each time none is left. 0, or -1 (peer gone). */
static int send_all(sp_http_conn *c, const char *p, size_t n)
{
    while (n && !c->broken) {
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        struct pollfd pf = {.fd = c->fd, .events = POLLOUT};
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) &&
            poll(&pf, 1, c->s->o.lim.write_timeout_ms) > 0 && !(pf.revents & (POLLERR | POLLHUP)))
            continue;
        c->broken = 1;
    }
    return c->broken ? -1 : 0;
}

/* The status line and headers of an answer; len < 0: streamed. */
static int send_head(sp_http_conn *c, int status, const char *ctype, const char *extra, long long len)
{
    char head[1024];
    int chunked = len < 0 && c->minor >= 1;
    if (len < 0 && !chunked)
        c->keep = 0; /* HTTP/1.0: the end of the stream is the end of the connection */
    int n = snprintf(head, sizeof head, "HTTP/1.1 %d %s\r\nServer: sepal\r\n%s%s%s", status, sp_http_reason(status),
                     ctype ? "Content-Type: " : "", ctype ? ctype : "", ctype ? "\r\n" : "");
    if (len >= 0)
        n += snprintf(head + n, sizeof head - (size_t)n, "Content-Length: %lld\r\n", len);
    else
        n += snprintf(head + n, sizeof head - (size_t)n, "Cache-Control: no-cache\r\n%s",
                      chunked ? "Transfer-Encoding: chunked\r\n" : "");
    n += snprintf(head + n, sizeof head - (size_t)n, "Connection: %s\r\n", c->keep ? "keep-alive" : "close");
    if (n >= (int)sizeof head - 2)
        return -1;
    if (send_all(c, head, (size_t)n) || (extra && send_all(c, extra, strlen(extra))))
        return -1;
    return send_all(c, "\r\n", 2);
}

int sp_http_respond(sp_http_conn *c, int status, const char *ctype, const char *extra, const char *body, size_t len)
{
    if (c->answered)
        return -1;
    c->answered = 1;
    if (send_head(c, status, ctype, extra, (long long)len) || send_all(c, body, len))
        return c->keep = 0, -1;
    return 0;
}

int sp_http_stream_begin(sp_http_conn *c, int status, const char *ctype, const char *extra)
{
    if (c->answered)
        return -1;
    c->answered = c->streaming = 1;
    return send_head(c, status, ctype, extra, -1) ? (c->keep = 0, -1) : 0;
}

int sp_http_stream_write(sp_http_conn *c, const char *data, size_t len)
{
    if (!c->streaming)
        return -1;
    if (!len)
        return c->broken ? -1 : 0;
    if (c->minor == 0)
        return send_all(c, data, len);
    char size[32];
    int n = snprintf(size, sizeof size, "%zx\r\n", len);
    return send_all(c, size, (size_t)n) || send_all(c, data, len) || send_all(c, "\r\n", 2) ? -1 : 0;
}

int sp_http_stream_end(sp_http_conn *c)
{
    if (!c->streaming)
        return -1;
    c->streaming = 0;
    if (c->minor >= 1 && send_all(c, "0\r\n\r\n", 5))
        return c->keep = 0, -1;
    return c->broken ? -1 : 0;
}

int sp_http_peer_gone(sp_http_conn *c)
{
    if (c->broken)
        return 1;
    struct pollfd pf = {.fd = c->fd, .events = POLLIN | POLLRDHUP};
    if (poll(&pf, 1, 0) <= 0)
        return 0;
    if (pf.revents & (POLLRDHUP | POLLHUP | POLLERR))
        return 1;
    char b;
    return recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0; /* data: the next request, pipelined */
}

int sp_http_stopping(const sp_http_conn *c) { return __atomic_load_n(&c->s->stopping, __ATOMIC_ACQUIRE); }
const char *sp_http_peer(const sp_http_conn *c) { return c->peer; }

/* An error answered by the server itself; the connection closes after it. */
static void respond_error(sp_http_conn *c, int status, const char *msg)
{
    char body[1024];
    const char *ctype = "text/plain; charset=utf-8";
    size_t n = c->s->o.error_body ? c->s->o.error_body(status, msg, body, sizeof body, &ctype, c->s->o.user)
                                  : (size_t)snprintf(body, sizeof body, "%d %s: %s\n", status, sp_http_reason(status), msg);
    if (n >= sizeof body)
        n = sizeof body - 1;
    c->keep = 0;
    sp_http_respond(c, status, ctype, NULL, body, n);
}

/* ---------------------------------------------------------------------------------------------- */
/* reading */

typedef enum { RD_OK, RD_CLOSED, RD_TIMEOUT, RD_STOP } rd_result;

/* Waits until the socket is readable, at most until deadline (sp_now_s seconds): RD_OK, or why not. */
static rd_result wait_readable(sp_http_conn *c, double deadline)
{
    for (;;) {
        double left = deadline - sp_now_s();
        if (left <= 0)
            return RD_TIMEOUT;
        struct pollfd pf[2] = {{.fd = c->fd, .events = POLLIN}, {.fd = c->s->stopfd, .events = POLLIN}};
        int r = poll(pf, 2, (int)(left * 1000) + 1);
        if (r < 0 && errno != EINTR)
            return RD_CLOSED;
        if (r > 0 && pf[0].revents)
            return RD_OK;
        if (r > 0 && pf[1].revents)
            return RD_STOP;
    }
}

/* Reads more bytes into c->buf (room for at least one): RD_OK, or why not. */
static rd_result read_more(sp_http_conn *c, double deadline)
{
    rd_result r = wait_readable(c, deadline);
    if (r != RD_OK)
        return r;
    ssize_t n = recv(c->fd, c->buf + c->len, c->cap - c->len, MSG_DONTWAIT);
    if (n > 0) {
        c->len += (size_t)n;
        return RD_OK;
    }
    return n < 0 && (errno == EAGAIN || errno == EINTR) ? RD_OK : RD_CLOSED;
}

/* A request that cannot be answered normally: its status and message. */
typedef struct bad {
    int status;
    char msg[160];
} bad;

static int fail(bad *b, int status, const char *fmt, const char *arg)
{
    b->status = status;
    snprintf(b->msg, sizeof b->msg, fmt, arg);
    return -1;
}

static int is_tchar(unsigned char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

/* The request line "METHOD TARGET HTTP/1.x" (NUL-terminated, in place). */
static int parse_request_line(char *line, sp_http_req *r, bad *b)
{
    char *sp1 = strchr(line, ' '), *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
    if (!sp1 || !sp2 || strchr(sp2 + 1, ' ') || sp1 == line || sp2 == sp1 + 1)
        return fail(b, 400, "malformed request line", NULL);
    *sp1 = *sp2 = 0;
    for (char *p = line; *p; p++)
        if (!is_tchar((unsigned char)*p))
            return fail(b, 400, "malformed method", NULL);
    const char *v = sp2 + 1;
    if (strncmp(v, "HTTP/", 5) || !(v[5] >= '0' && v[5] <= '9') || v[6] != '.' || !(v[7] >= '0' && v[7] <= '9') || v[8])
        return fail(b, 400, "malformed HTTP version", NULL);
    if (v[5] != '1')
        return fail(b, 505, "only HTTP/1.0 and HTTP/1.1 are served (got %s)", v);
    r->minor = v[7] - '0';
    r->method = line;
    r->target = sp1 + 1;
    for (const char *p = r->target; *p; p++)
        if ((unsigned char)*p <= ' ' || *p == 0x7f)
            return fail(b, 400, "malformed request target", NULL);
    if (r->target[0] != '/')
        return fail(b, 400, "the request target must be a path (got %.60s)", r->target);
    return 0;
}

/* One header line "Name: value" (in place). */
static int parse_header(char *line, sp_http_req *r, int max, bad *b)
{
    if (line[0] == ' ' || line[0] == '\t')
        return fail(b, 400, "folded header lines are not accepted", NULL);
    char *colon = strchr(line, ':');
    if (!colon || colon == line)
        return fail(b, 400, "malformed header line", NULL);
    for (char *p = line; p < colon; p++)
        if (!is_tchar((unsigned char)*p))
            return fail(b, 400, "malformed header name", NULL);
    if (r->nheaders >= max)
        return fail(b, 431, "more than %s headers", max == 64 ? "64" : "the allowed");
    *colon = 0;
    char *v = colon + 1, *e = v + strlen(v);
    while (*v == ' ' || *v == '\t')
        v++;
    while (e > v && (e[-1] == ' ' || e[-1] == '\t'))
        *--e = 0;
    for (const char *p = v; *p; p++)
        if (((unsigned char)*p < ' ' && *p != '\t') || *p == 0x7f)
            return fail(b, 400, "control character in header %s", line);
    r->headers[r->nheaders++] = (sp_http_header){line, v};
    return 0;
}

const char *sp_http_header_get(const sp_http_req *r, const char *name)
{
    for (int i = 0; i < r->nheaders; i++)
        if (!strcasecmp(r->headers[i].name, name))
            return r->headers[i].value;
    return NULL;
}

/* The head in c->buf[0..head) (ending in its blank line): lines split and parsed in place. */
static int parse_head(sp_http_conn *c, size_t head, sp_http_req *r, bad *b)
{
    const sp_http_limits *L = &c->s->o.lim;
    char *p = c->head, *end = c->head + head;
    int first = 1;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *e = nl;
        if (e > p && e[-1] == '\r')
            e--;
        *e = 0;
        if (memchr(p, '\r', (size_t)(e - p)) || strlen(p) != (size_t)(e - p))
            return fail(b, 400, "a bare CR or a NUL in the head", NULL);
        if (first && parse_request_line(p, r, b))
            return -1;
        if (!first && *p && parse_header(p, r, L->max_headers, b))
            return -1;
        first = 0;
        p = nl + 1;
    }
    return 0;
}

/* Where the head ends (after its blank line) in buf[0..len), or 0 while it has not; leading blank lines (allowed
 * before a request) are dropped first. Checks the line limits on what has come. */
static size_t find_head(sp_http_conn *c, int *status)
{
    const sp_http_limits *L = &c->s->o.lim;
    size_t skip = 0;
    while (skip < c->len && (c->buf[skip] == '\r' || c->buf[skip] == '\n'))
        skip++;
    if (skip) {
        memmove(c->buf, c->buf + skip, c->len - skip);
        c->len -= skip;
    }
    size_t start = 0;
    for (int line = 0; start < c->len; line++) {
        char *nl = memchr(c->buf + start, '\n', c->len - start);
        size_t llen = (nl ? (size_t)(nl - c->buf) : c->len) - start;
        if (llen > L->max_line) {
            *status = line ? 431 : 414;
            return 0;
        }
        if (!nl)
            return 0;
        if (llen == 0 || (llen == 1 && c->buf[start] == '\r'))
            return (size_t)(nl - c->buf) + 1;
        start = (size_t)(nl - c->buf) + 1;
    }
    return 0;
}

/* The body's length from the headers: 0, or -1 (b says why). */
static int body_length(const sp_http_req *r, const sp_http_limits *L, size_t *n, bad *b)
{
    *n = 0;
    if (sp_http_header_get(r, "Transfer-Encoding"))
        return fail(b, 501, "Transfer-Encoding is not supported: send the body with a Content-Length", NULL);
    int seen = 0;
    for (int i = 0; i < r->nheaders; i++) {
        if (strcasecmp(r->headers[i].name, "Content-Length"))
            continue;
        const char *v = r->headers[i].value;
        if (!*v || strspn(v, "0123456789") != strlen(v) || strlen(v) > 15)
            return fail(b, 400, "malformed Content-Length '%.40s'", v);
        size_t k = (size_t)strtoull(v, NULL, 10);
        if (seen && k != *n)
            return fail(b, 400, "two different Content-Lengths", NULL);
        *n = k;
        seen = 1;
    }
    if (*n > L->max_body) {
        char lim[32];
        snprintf(lim, sizeof lim, "%zu", L->max_body);
        return fail(b, 413, "the body is larger than %s bytes", lim);
    }
    return 0;
}

/* The next request of the connection into r (its strings point into c's buffers): 1, 0 when the connection
 * ends quietly (closed, idle, stopping), or -1 with b filled (answer b->status and close). */
static int read_request(sp_http_conn *c, sp_http_req *r, bad *b)
{
    const sp_http_limits *L = &c->s->o.lim;
    memset(r, 0, sizeof *r);
    int status = 0, started = c->len > 0; /* a pipelined request has begun already */
    double deadline = sp_now_s() + (started ? L->request_timeout_ms : L->idle_timeout_ms) / 1000.0;
    size_t head;
    while (!(head = find_head(c, &status))) {
        if (status)
            return fail(b, status, status == 414 ? "the request line is too long" : "a header line is too long", NULL);
        if (c->len >= L->max_head)
            return fail(b, 431, "the request head is too large", NULL);
        rd_result rd = read_more(c, deadline);
        if (rd == RD_TIMEOUT && started)
            return fail(b, 408, "the request did not arrive in time", NULL);
        if (rd != RD_OK)
            return 0;
        if (!started && c->len) {
            started = 1;
            deadline = sp_now_s() + L->request_timeout_ms / 1000.0;
        }
    }
    memcpy(c->head, c->buf, head); /* parsed in a copy: c->buf goes on holding what follows */
    c->head[head] = 0;
    if (parse_head(c, head, r, b))
        return -1;
    size_t plen = strcspn(r->target, "?");
    memcpy(c->path, r->target, plen);
    c->path[plen] = 0;
    r->path = c->path;
    if (r->minor >= 1 && !sp_http_header_get(r, "Host"))
        return fail(b, 400, "HTTP/1.1 requests need a Host header", NULL);
    const char *conn = sp_http_header_get(r, "Connection");
    c->minor = r->minor;
    c->keep = r->minor >= 1 ? !(conn && strcasestr(conn, "close")) : conn && strcasestr(conn, "keep-alive");
    size_t n;
    if (body_length(r, L, &n, b))
        return -1;
    const char *expect = sp_http_header_get(r, "Expect");
    if (expect && strcasecmp(expect, "100-continue"))
        return fail(b, 417, "unsupported Expect '%.40s'", expect);
    size_t have = c->len - head < n ? c->len - head : n;
    if (expect && have < n && send_all(c, "HTTP/1.1 100 Continue\r\n\r\n", 25))
        return 0;
    free(c->body);
    if (!(c->body = malloc(n + 1)))
        return fail(b, 500, "out of memory", NULL);
    memcpy(c->body, c->buf + head, have);
    c->len -= head + have; /* what follows the body: the next request */
    memmove(c->buf, c->buf + head + have, c->len);
    while (have < n) {
        rd_result rd = wait_readable(c, deadline);
        ssize_t k = rd == RD_OK ? recv(c->fd, c->body + have, n - have, MSG_DONTWAIT) : -1;
        if (rd == RD_TIMEOUT)
            return fail(b, 408, "the request body did not arrive in time", NULL);
        if (rd != RD_OK || k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
            return 0;
        if (k > 0)
            have += (size_t)k;
    }
    c->body[n] = 0;
    r->body = c->body;
    r->body_len = n;
    return 1;
}

/* ---------------------------------------------------------------------------------------------- */
/* connections */

static void conn_done(sp_http *s)
{
    pthread_mutex_lock(&s->mu);
    s->nconns--;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void conn_free(sp_http_conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    free(c->buf);
    free(c->head);
    free(c->path);
    free(c->body);
    free(c->req);
    free(c);
}

static void *conn_main(void *arg)
{
    sp_http_conn *c = arg;
    sp_http *s = c->s;
    for (int go = 1; go;) {
        bad b = {0};
        int got = read_request(c, c->req, &b);
        if (got < 0)
            respond_error(c, b.status, b.msg);
        if (got <= 0)
            break;
        c->answered = c->streaming = 0;
        s->o.handler(c, c->req, s->o.user);
        if (c->streaming)
            sp_http_stream_end(c);
        if (!c->answered)
            respond_error(c, 500, "the handler gave no answer");
        go = c->keep && !c->broken && !sp_http_stopping(c);
    }
    conn_free(c);
    conn_done(s);
    return NULL;
}

/* A connection over the cap: 503 at once (without waiting for its request), then closed. */
static void refuse(sp_http *s, int fd)
{
    sp_http_conn c = {.s = s, .fd = fd, .minor = 1};
    respond_error(&c, 503, "too many connections");
    close(fd);
}

static sp_http_conn *conn_new(sp_http *s, int fd, const struct sockaddr_storage *sa)
{
    sp_http_conn *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->s = s;
    c->fd = fd;
    c->cap = s->o.lim.max_head + 1;
    c->buf = malloc(c->cap);
    c->head = malloc(c->cap + 1);
    c->path = malloc(s->o.lim.max_line + 1);
    c->req = malloc(sizeof *c->req);
    if (!c->buf || !c->head || !c->path || !c->req) {
        c->fd = -1;
        conn_free(c);
        return NULL;
    }
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (sa->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
        port = ntohs(in->sin_port);
    } else if (sa->ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
        port = ntohs(in6->sin6_port);
    }
    snprintf(c->peer, sizeof c->peer, "%s:%d", host, port);
    return c;
}

/* A detached thread with every signal blocked (they go to the owner's thread). */
static int spawn(void *(*fn)(void *), void *arg, pthread_t *joinable)
{
    pthread_attr_t at;
    pthread_attr_init(&at);
    if (!joinable)
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    pthread_t th;
    int rc = pthread_create(joinable ? joinable : &th, &at, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&at);
    return rc;
}

static void accept_one(sp_http *s)
{
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    int fd = accept4(s->lfd, (struct sockaddr *)&sa, &sl, SOCK_CLOEXEC);
    if (fd < 0)
        return; /* (EMFILE and the like: the listener goes on; the peer waits in the backlog) */
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* each streamed piece goes out at once */
    pthread_mutex_lock(&s->mu);
    int full = s->nconns >= s->o.lim.max_conns;
    if (!full)
        s->nconns++;
    pthread_mutex_unlock(&s->mu);
    if (full)
        return refuse(s, fd);
    sp_http_conn *c = conn_new(s, fd, &sa);
    if (!c || spawn(conn_main, c, NULL)) {
        if (c)
            conn_free(c);
        else
            close(fd);
        conn_done(s);
    }
}

static void *listen_main(void *arg)
{
    sp_http *s = arg;
    while (!__atomic_load_n(&s->stopping, __ATOMIC_ACQUIRE)) {
        struct pollfd pf[2] = {{.fd = s->lfd, .events = POLLIN}, {.fd = s->stopfd, .events = POLLIN}};
        if (poll(pf, 2, -1) <= 0 || pf[1].revents)
            continue;
        if (pf[0].revents & POLLIN)
            accept_one(s);
    }
    return NULL;
}

static sp_status bind_listen(sp_http *s, const char *host, int port, sp_err *err)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &ai);
    if (rc)
        return sp_errf(err, SP_ERR_ARG, "cannot listen on %s:%d: %s", host, port, gai_strerror(rc));
    int e = 0;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0), one = 1;
        if (fd < 0) {
            e = errno;
            continue;
        }
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 128) == 0) {
            struct sockaddr_storage sa;
            socklen_t sl = sizeof sa;
            getsockname(fd, (struct sockaddr *)&sa, &sl);
            s->port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                                     : ((struct sockaddr_in *)&sa)->sin_port);
            s->lfd = fd;
            freeaddrinfo(ai);
            return SP_OK;
        }
        e = errno;
        close(fd);
    }
    freeaddrinfo(ai);
    return sp_errf(err, SP_ERR_IO, "cannot listen on %s:%d: %s", host, port, strerror(e));
}

sp_status sp_http_start(sp_http **out, const sp_http_opts *o, sp_err *err)
{
    *out = NULL;
    if (!o->handler)
        return sp_errf(err, SP_ERR_ARG, "http: no handler");
    sp_http *s = calloc(1, sizeof *s);
    if (!s)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    s->o = *o;
    limits_default(&s->o.lim);
    s->lfd = -1;
    s->stopfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    sp_status st = s->stopfd < 0 ? sp_errf(err, SP_ERR_IO, "eventfd: %s", strerror(errno))
                                 : bind_listen(s, o->host ? o->host : "127.0.0.1", o->port, err);
    if (!st && spawn(listen_main, s, &s->listener))
        st = sp_errf(err, SP_ERR_IO, "cannot start the listener thread");
    if (st) {
        if (s->lfd >= 0)
            close(s->lfd);
        if (s->stopfd >= 0)
            close(s->stopfd);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        free(s);
        return st;
    }
    *out = s;
    return SP_OK;
}

int sp_http_port(const sp_http *s) { return s->port; }

int sp_http_conns(sp_http *s)
{
    pthread_mutex_lock(&s->mu);
    int n = s->nconns;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void sp_http_stop(sp_http *s)
{
    if (!s)
        return;
    __atomic_store_n(&s->stopping, 1, __ATOMIC_RELEASE);
    uint64_t one = 1;
    ssize_t w = write(s->stopfd, &one, sizeof one); /* wakes every poll: the listener and the idle connections */
    (void)w;
    pthread_join(s->listener, NULL);
    close(s->lfd);
    pthread_mutex_lock(&s->mu);
    while (s->nconns > 0)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    close(s->stopfd);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}
