/* test_http.c - the HTTP/1.1 server (http/http.h) over real loopback sockets: answers, keep-alive, pipelined
 * requests in order, streamed (chunked) answers, HTTP/1.0, Expect: 100-continue, and the hostile side: malformed
 * request lines and headers, lines, heads and bodies over their limits, a Transfer-Encoding, a missing Host, a
 * slowloris trickle (408 at the deadline while another client is served), the connection cap (503), a peer that
 * leaves mid-answer, and stopping with a handler at work. After each abuse the server still answers. */
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <unistd.h>

#include "http.h"
#include "testutil.h"
#include "timeutil.h"

/* ---------------------------------------------------------------------------------------------- */
/* the server under test: /echo answers the body, /stream three pieces, /wait streams until stopped or the
 * peer leaves */

static int g_saw_gone, g_saw_stop;

static void handler(sp_http_conn *c, const sp_http_req *r, void *user)
{
    (void)user;
    if (!strcmp(r->path, "/echo")) {
        char extra[128];
        snprintf(extra, sizeof extra, "X-Method: %s\r\nX-Target: %s\r\n", r->method, r->target);
        sp_http_respond(c, 200, "text/plain", extra, r->body, r->body_len);
    } else if (!strcmp(r->path, "/stream")) {
        sp_http_stream_begin(c, 200, "text/event-stream", NULL);
        sp_http_stream_write(c, "data: one\n\n", 11);
        sp_http_stream_write(c, "data: two\n\n", 11);
        sp_http_stream_write(c, "data: [DONE]\n\n", 14);
        sp_http_stream_end(c);
    } else if (!strcmp(r->path, "/wait")) {
        sp_http_stream_begin(c, 200, "text/event-stream", NULL);
        sp_http_stream_write(c, "data: started\n\n", 15);
        for (;;) {
            if (sp_http_peer_gone(c)) {
                __atomic_store_n(&g_saw_gone, 1, __ATOMIC_SEQ_CST);
                break;
            }
            if (sp_http_stopping(c)) {
                sp_http_stream_write(c, "data: stopping\n\n", 16);
                __atomic_store_n(&g_saw_stop, 1, __ATOMIC_SEQ_CST);
                break;
            }
            usleep(10000);
        }
    } else {
        sp_http_respond(c, 404, "text/plain", NULL, "no\n", 3);
    }
}

static size_t error_body(int status, const char *msg, char *buf, size_t cap, const char **ctype, void *user)
{
    (void)user;
    *ctype = "application/json";
    return (size_t)snprintf(buf, cap, "{\"error\":{\"code\":%d,\"message\":\"%s\"}}", status, msg);
}

static sp_http *start(const sp_http_limits *lim)
{
    sp_http_opts o = {.host = "127.0.0.1", .port = 0, .handler = handler, .error_body = error_body};
    if (lim)
        o.lim = *lim;
    sp_http *s = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_http_start(&s, &o, &err) == SP_OK, "%s", err.msg);
    ck_assert_int_gt(sp_http_port(s), 0);
    return s;
}

/* ---------------------------------------------------------------------------------------------- */
/* a raw client */

static int dial(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static void put(int fd, const char *s) { ck_assert_int_eq(send(fd, s, strlen(s), MSG_NOSIGNAL), (ssize_t)strlen(s)); }

/* Everything the server sends until it closes or nothing comes for quiet_ms (malloc'd). */
static char *drain(int fd, int quiet_ms)
{
    size_t cap = 1 << 16, len = 0;
    char *b = malloc(cap + 1);
    for (;;) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, quiet_ms) <= 0)
            break;
        ssize_t n = recv(fd, b + len, cap - len, 0);
        if (n <= 0)
            break;
        len += (size_t)n;
        if (len == cap)
            break;
    }
    b[len] = 0;
    return b;
}

/* 1 when the server has closed fd (a read sees the end within ms). */
static int closed_by_server(int fd, int ms)
{
    char tmp[4096];
    double end = sp_now_s() + ms / 1000.0;
    while (sp_now_s() < end) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, 50) > 0) {
            ssize_t n = recv(fd, tmp, sizeof tmp, 0);
            if (n <= 0)
                return 1;
        }
    }
    return 0;
}

static int count(const char *s, const char *what)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, what)); p += strlen(what))
        n++;
    return n;
}

/* One request on a fresh connection; the whole answer (the server closes: Connection: close). */
static char *once(int port, const char *req)
{
    int fd = dial(port);
    put(fd, req);
    char *out = drain(fd, 2000);
    close(fd);
    return out;
}

static void still_serves(int port)
{
    char *out = once(port, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello");
    ck_assert_msg(strstr(out, "HTTP/1.1 200 OK\r\n") && strstr(out, "\r\n\r\nhello"), "%s", out);
    free(out);
}

/* ---------------------------------------------------------------------------------------------- */

START_TEST(t_answers_keepalive_pipelining)
{
    sp_http *s = start(NULL);
    int port = sp_http_port(s), fd = dial(port);
    put(fd, "GET /echo?x=1 HTTP/1.1\r\nHost: a\r\n\r\n");
    char *out = drain(fd, 300);
    ck_assert_msg(strstr(out, "HTTP/1.1 200 OK\r\n"), "%s", out);
    ck_assert_msg(strstr(out, "X-Target: /echo?x=1\r\n") && strstr(out, "Content-Length: 0\r\n"), "%s", out);
    ck_assert_msg(strstr(out, "Connection: keep-alive\r\n"), "%s", out);
    free(out);
    /* the same connection: three requests in one write, answered in order */
    put(fd, "POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc"
            "POST /echo HTTP/1.1\r\nhost: a\r\ncontent-length: 3\r\n\r\ndef"
            "GET /nope HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    out = drain(fd, 2000);
    char *a = strstr(out, "\r\n\r\nabc"), *d = strstr(out, "\r\n\r\ndef"), *n = strstr(out, "HTTP/1.1 404");
    ck_assert_msg(a && d && n && a < d && d < n, "%s", out);
    ck_assert_int_eq(count(out, "HTTP/1.1 "), 3);
    free(out);
    ck_assert(closed_by_server(fd, 1000)); /* Connection: close */
    close(fd);
    /* HTTP/1.0: closed after the answer unless keep-alive is asked; a streamed answer ends by closing */
    out = once(port, "GET /echo HTTP/1.0\r\n\r\n");
    ck_assert_msg(strstr(out, "Connection: close\r\n"), "%s", out);
    free(out);
    out = once(port, "GET /stream HTTP/1.0\r\n\r\n");
    ck_assert_msg(strstr(out, "\r\n\r\ndata: one\n\ndata: two\n\ndata: [DONE]\n\n") && !strstr(out, "chunked"), "%s",
                  out);
    free(out);
    sp_http_stop(s);
}
END_TEST

START_TEST(t_stream_chunked)
{
    sp_http *s = start(NULL);
    int fd = dial(sp_http_port(s));
    put(fd, "GET /stream HTTP/1.1\r\nHost: a\r\n\r\n");
    char *out = drain(fd, 500);
    ck_assert_msg(strstr(out, "Transfer-Encoding: chunked\r\n") && strstr(out, "Content-Type: text/event-stream\r\n"),
                  "%s", out);
    ck_assert_msg(strstr(out, "\r\n\r\nb\r\ndata: one\n\n\r\nb\r\ndata: two\n\n\r\ne\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"),
                  "%s", out);
    free(out);
    /* and the connection goes on */
    put(fd, "GET /echo HTTP/1.1\r\nHost: a\r\n\r\n");
    out = drain(fd, 500);
    ck_assert_msg(strstr(out, "HTTP/1.1 200 OK"), "%s", out);
    free(out);
    close(fd);
    sp_http_stop(s);
}
END_TEST

START_TEST(t_expect_continue)
{
    sp_http *s = start(NULL);
    int fd = dial(sp_http_port(s));
    put(fd, "POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n");
    char *out = drain(fd, 500);
    ck_assert_str_eq(out, "HTTP/1.1 100 Continue\r\n\r\n");
    free(out);
    put(fd, "body");
    out = drain(fd, 500);
    ck_assert_msg(strstr(out, "HTTP/1.1 200 OK") && strstr(out, "\r\n\r\nbody"), "%s", out);
    free(out);
    close(fd);
    sp_http_stop(s);
}
END_TEST

/* Each malformed request gets its status (in the owner's error body) and a closed connection. */
START_TEST(t_malformed)
{
    sp_http_limits lim = {.max_line = 256, .max_headers = 8, .max_head = 1024, .max_body = 100};
    sp_http *s = start(&lim);
    int port = sp_http_port(s);
    char longline[600];
    memset(longline, 'a', sizeof longline - 1);
    longline[sizeof longline - 1] = 0;
    char req[4096];
    struct {
        const char *req;
        int status;
    } cases[] = {
        {"GARBAGE\r\n\r\n", 400},
        {"GET  /echo HTTP/1.1\r\nHost: a\r\n\r\n", 400},
        {"GET echo HTTP/1.1\r\nHost: a\r\n\r\n", 400},
        {"GET /echo HTTP/1.1 extra\r\nHost: a\r\n\r\n", 400},
        {"G(T /echo HTTP/1.1\r\nHost: a\r\n\r\n", 400},
        {"GET /echo HTTP/2.0\r\nHost: a\r\n\r\n", 505},
        {"GET /echo HTTQ/1.1\r\nHost: a\r\n\r\n", 400},
        {"GET /echo HTTP/1.1\r\n\r\n", 400},                              /* no Host */
        {"GET /echo HTTP/1.1\r\nHost: a\r\nBad Name: x\r\n\r\n", 400},      /* a space in a name */
        {"GET /echo HTTP/1.1\r\nHost: a\r\nNoColon\r\n\r\n", 400},
        {"GET /echo HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n", 400},
        {"GET /echo HTTP/1.1\r\nHost: a\rb\r\n\r\n", 400},                  /* a bare CR */
        {"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", 400},
        {"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 1x\r\n\r\n", 400},
        {"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400},
        {"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 101\r\n\r\n", 413}, /* over max_body: not read */
        {"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n", 400},
        {"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", 501},
        {"POST /echo HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\nContent-Length: 1\r\n\r\nx", 417},
        {"GET /a1 HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\nE: 1\r\nF: 1\r\nG: 1\r\nH: 1\r\n\r\n", 431},
        {NULL, 414}, /* a request line over max_line */
        {NULL, 431}, /* a header line over max_line */
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n; i++) {
        if (i == n - 2)
            snprintf(req, sizeof req, "GET /%s HTTP/1.1\r\nHost: a\r\n\r\n", longline);
        else if (i == n - 1)
            snprintf(req, sizeof req, "GET / HTTP/1.1\r\nHost: a\r\nX: %s\r\n\r\n", longline);
        else
            snprintf(req, sizeof req, "%s", cases[i].req);
        int fd = dial(port);
        put(fd, req);
        char *out = drain(fd, 2000);
        char want[64], body[64];
        snprintf(want, sizeof want, "HTTP/1.1 %d ", cases[i].status);
        snprintf(body, sizeof body, "{\"error\":{\"code\":%d,", cases[i].status);
        ck_assert_msg(!strncmp(out, want, strlen(want)) && strstr(out, body) && strstr(out, "Connection: close"),
                      "case %d: %.60s -> %s", i, req, out);
        free(out);
        ck_assert_msg(closed_by_server(fd, 1000), "case %d: connection left open", i);
        close(fd);
    }
    still_serves(port);
    sp_http_stop(s);
}
END_TEST

typedef struct trickle {
    int port;
    char *out;
} trickle;

/* Sends a request head a byte every 50 ms, never finishing. */
static void *slowloris(void *arg)
{
    trickle *t = arg;
    int fd = dial(t->port);
    const char *head = "GET /echo HTTP/1.1\r\nHost: a\r\nX-Long: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    for (const char *p = head; *p; p++) {
        if (send(fd, p, 1, MSG_NOSIGNAL) != 1)
            break;
        usleep(50000);
    }
    t->out = drain(fd, 2000);
    close(fd);
    return NULL;
}

START_TEST(t_slowloris)
{
    sp_http_limits lim = {.request_timeout_ms = 1000, .idle_timeout_ms = 600};
    sp_http *s = start(&lim);
    int port = sp_http_port(s);
    trickle t[4];
    pthread_t th[4];
    double t0 = sp_now_s();
    for (int i = 0; i < 4; i++) {
        t[i] = (trickle){.port = port};
        pthread_create(&th[i], NULL, slowloris, &t[i]);
    }
    usleep(200000);
    still_serves(port); /* served meanwhile */
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        ck_assert_msg(!strncmp(t[i].out, "HTTP/1.1 408 ", 13), "%s", t[i].out);
        free(t[i].out);
    }
    /* ended at the request deadline (1 s), not when the trickle would have ended (~4 s) */
    ck_assert_double_lt(sp_now_s() - t0, 3.9);
    /* an idle keep-alive connection is closed after idle_timeout, quietly */
    int fd = dial(port);
    put(fd, "GET /echo HTTP/1.1\r\nHost: a\r\n\r\n");
    char *out = drain(fd, 200);
    ck_assert_msg(strstr(out, "200 OK"), "%s", out);
    free(out);
    ck_assert(closed_by_server(fd, 3000));
    close(fd);
    still_serves(port);
    sp_http_stop(s);
}
END_TEST

START_TEST(t_connection_cap)
{
    sp_http_limits lim = {.max_conns = 2};
    sp_http *s = start(&lim);
    int port = sp_http_port(s);
    int a = dial(port), b = dial(port);
    put(a, "GET /echo HTTP/1.1\r\nHost: a\r\n\r\n");
    put(b, "GET /echo HTTP/1.1\r\nHost: a\r\n\r\n");
    free(drain(a, 300));
    free(drain(b, 300));
    ck_assert_int_eq(sp_http_conns(s), 2);
    char *out = once(port, "GET /echo HTTP/1.1\r\nHost: a\r\n\r\n");
    ck_assert_msg(!strncmp(out, "HTTP/1.1 503 ", 13) && strstr(out, "too many connections"), "%s", out);
    free(out);
    close(a);
    close(b);
    for (int i = 0; i < 100 && sp_http_conns(s) > 0; i++)
        usleep(20000);
    ck_assert_int_eq(sp_http_conns(s), 0);
    still_serves(port);
    sp_http_stop(s);
}
END_TEST

START_TEST(t_peer_gone_and_stop)
{
    sp_http *s = start(NULL);
    int port = sp_http_port(s);
    /* a peer that leaves mid-stream: the handler sees it */
    int fd = dial(port);
    put(fd, "GET /wait HTTP/1.1\r\nHost: a\r\n\r\n");
    char *out = drain(fd, 300);
    ck_assert_msg(strstr(out, "data: started"), "%s", out);
    free(out);
    close(fd);
    for (int i = 0; i < 200 && !__atomic_load_n(&g_saw_gone, __ATOMIC_SEQ_CST); i++)
        usleep(10000);
    ck_assert(g_saw_gone);
    /* stopping with a handler at work and an idle connection: the handler says so and ends, stop returns */
    fd = dial(port);
    int idle = dial(port);
    put(fd, "GET /wait HTTP/1.1\r\nHost: a\r\n\r\n");
    free(drain(fd, 300));
    sp_http_stop(s);
    ck_assert(g_saw_stop);
    out = drain(fd, 1000);
    ck_assert_msg(strstr(out, "data: stopping") && strstr(out, "0\r\n\r\n"), "%s", out);
    free(out);
    ck_assert(closed_by_server(fd, 1000));
    ck_assert(closed_by_server(idle, 1000));
    close(fd);
    close(idle);
    /* the port is free again */
    int probe = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ck_assert_int_ne(connect(probe, (struct sockaddr *)&a, sizeof a), 0);
    close(probe);
}
END_TEST

START_TEST(t_listen_errors)
{
    sp_http *s = start(NULL), *t = NULL;
    sp_http_opts o = {.host = "127.0.0.1", .port = sp_http_port(s), .handler = handler};
    sp_err err = {0};
    ck_assert_int_ne(sp_http_start(&t, &o, &err), SP_OK);
    ck_assert_msg(strstr(err.msg, "cannot listen on 127.0.0.1:") && strstr(err.msg, "Address already in use"), "%s",
                  err.msg);
    o.host = "no.such.host.invalid";
    o.port = 0;
    ck_assert_int_ne(sp_http_start(&t, &o, &err), SP_OK);
    ck_assert_msg(strstr(err.msg, "cannot listen on no.such.host.invalid:0"), "%s", err.msg);
    sp_http_stop(s);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("http");
    TCase *tc = tcase_create("http");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, t_answers_keepalive_pipelining);
    tcase_add_test(tc, t_stream_chunked);
    tcase_add_test(tc, t_expect_continue);
    tcase_add_test(tc, t_malformed);
    tcase_add_test(tc, t_slowloris);
    tcase_add_test(tc, t_connection_cap);
    tcase_add_test(tc, t_peer_gone_and_stop);
    tcase_add_test(tc, t_listen_errors);
    suite_add_tcase(s, tc);
    return sp_test_run(s);
}
