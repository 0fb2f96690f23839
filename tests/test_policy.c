/* test_policy.c - the failure policy of the client runtime (client/swarm/policy.c), on a clock the test moves
 * itself (sp_rt_clock: bans are measured on it, the pauses between retries advance it), so nothing sleeps:
 *  - a failure bans its server for ban_s (15 s by default) from the moment it failed; a failure while the ban
 *    lasts keeps that ban; each failure after a ban ran out doubles it (30, 60, 120 ... s); a success clears
 *    the ban and the count, so the next failure is banned 15 s again; routing avoids a banned server while
 *    another covers its blocks, and uses it again the moment its ban ends on that clock;
 *  - a server that refused a session as "overloaded" is busy, not failed: avoided for ban_s, never banned, its
 *    failures not counted; so is one whose record says its queue wait is over its bound, while it says so;
 *  - the pause before retry k is 0, 1, 2, 4 ... s, at most backoff_max_s (60 s by default);
 *  - a request whose server keeps failing (a real socket on loopback that refuses connections) is tried
 *    1 + max_retries times, with exactly those pauses between the tries, one retry event per failure, the
 *    last saying no retries are left, and an error naming the blocks and the retry count: for a training
 *    FORWARD (chain.c) and for a generation's sessions (session.c), with the default limit (8) and others. */
#include <arpa/inet.h>
#include <check.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "generate.h"
#include "runtime.h"
#include "swarm_impl.h"
#include "testutil.h"
#include "timeutil.h"

#define M15 SEPAL_STORIES15M_DIR
#define MAXEV 64

/* The test's clock, and what the runtime told the front end. */
static double clock_now;
static double slept[MAXEV];
static int nslept;
static char retry_text[MAXEV][512];
static int nretry;

static double fake_now(void *user)
{
    (void)user;
    return clock_now;
}

static void fake_sleep(void *user, double s)
{
    (void)user;
    ck_assert_msg(s >= 0, "a pause of %g s", s);
    if (nslept < MAXEV)
        slept[nslept++] = s;
    clock_now += s;
}

static const sp_rt_clock fake_clock = {fake_now, fake_sleep, NULL};

static void on_event(const sp_event *ev, void *user)
{
    (void)user;
    if (getenv("SEPAL_TEST_VERBOSE"))
        fprintf(stderr, "[t=%.2f] event %d: %s\n", clock_now, ev->kind, ev->text ? ev->text : "");
    if (ev->kind == SP_EV_RETRY && nretry < MAXEV)
        snprintf(retry_text[nretry++], sizeof retry_text[0], "%s", ev->text ? ev->text : "");
}

static sp_runtime *runtime(void)
{
    clock_now = 1000;
    nslept = nretry = 0;
    sp_runtime *rt = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_runtime_new(&rt, on_event, NULL, &err), SP_OK);
    sp_runtime_set_clock(rt, &fake_clock);
    return rt;
}

/* A server entry for blocks [start, end) at 127.0.0.1:port in state st, single-token steps at rps, its record
 * written at wall-clock time `written`. */
static int entry_at(sp_runtime *rt, const char *id, int port, int start, int end, double rps, sp_server_state st,
                    double written)
{
    sp_server_record r = {.port = port, .start = start, .end = end, .state = st, .num_blocks = end,
                          .inference_rps = rps, .forward_rps = 1000, .throughput = 1000, .cache_tokens_left = -1,
                          .timestamp = written};
    snprintf(r.id, sizeof r.id, "%s", id);
    snprintf(r.host, sizeof r.host, "127.0.0.1");
    pthread_mutex_lock(&rt->lock);
    int i = sp_rt_server_put(rt, &r, 0);
    if (i >= 0) /* measured: routing does not ping it first (these tests are about the policy) */
        rt->servers[i]->rtt = 0.001;
    pthread_mutex_unlock(&rt->lock);
    ck_assert_int_ge(i, 0);
    return i;
}

/* A server entry for blocks [start, end) at 127.0.0.1:port, ONLINE, single-token steps at rps. */
static int entry(sp_runtime *rt, const char *id, int port, int start, int end, double rps)
{
    return entry_at(rt, id, port, start, end, rps, SP_SERVER_ONLINE, 0);
}

/* The server the min-latency route over [0, 4) uses (one hop expected). */
static int routed_server(sp_runtime *rt)
{
    sp_route r;
    sp_err err = {0};
    ck_assert_msg(sp_runtime_route_inference(rt, 0, 4, 0, &r, &err) == SP_OK, "%s", err.msg);
    ck_assert_int_eq(r.nhops, 1);
    return r.hop[0].server;
}

static double ban_left(sp_runtime *rt, int i) { return rt->servers[i]->banned_until - clock_now; }

START_TEST(t_defaults)
{
    sp_runtime *rt = runtime();
    ck_assert_double_eq(rt->set.ban_s, 15);
    ck_assert_double_eq(rt->set.backoff_max_s, 60);
    ck_assert_int_eq(rt->set.max_retries, 8);
    ck_assert_double_eq(sp_runtime_now(rt), 1000);
    sp_runtime_set_clock(rt, NULL); /* the runtime's own clock is the monotonic one */
    ck_assert(fabs(sp_runtime_now(rt) - sp_now_s()) < 1);
    sp_runtime_free(rt);
}
END_TEST

/* 15 s from the failure; kept while it lasts; doubled after each ban that ran out; routing follows it. */
START_TEST(t_ban_doubles)
{
    sp_runtime *rt = runtime();
    int a = entry(rt, "aaaaaaaaaaaaaaaa", 4001, 0, 4, 200), b = entry(rt, "bbbbbbbbbbbbbbbb", 4002, 0, 4, 50);
    ck_assert_int_eq(routed_server(rt), a); /* the faster one */
    sp_err why = {0};
    snprintf(why.msg, sizeof why.msg, "connection refused");
    sp_rt_failed(rt, a, 0, &why);
    ck_assert_double_eq_tol(ban_left(rt, a), 15, 1e-9);
    ck_assert_int_eq(rt->servers[a]->failures, 1);
    ck_assert_int_eq(nretry, 1);
    ck_assert_msg(strstr(retry_text[0], "127.0.0.1:4001 (blocks 0:4) failed: connection refused; banned for 15 s; "
                                        "retry 1 of 8 now"),
                  "%s", retry_text[0]);
    ck_assert_int_eq(routed_server(rt), b);
    clock_now += 10; /* a failure while banned: the ban stays as it was */
    sp_rt_failed(rt, a, 1, &why);
    ck_assert_double_eq_tol(ban_left(rt, a), 5, 1e-9);
    ck_assert_int_eq(rt->servers[a]->failures, 1);
    ck_assert_msg(strstr(retry_text[1], "banned for 5 s; retry 2 of 8 in 1 s"), "%s", retry_text[1]);
    clock_now += 4.9;
    ck_assert_int_eq(routed_server(rt), b);
    clock_now += 0.2; /* the ban is over: the faster server again */
    ck_assert_int_eq(routed_server(rt), a);
    double want = 15;
    for (int k = 1; k <= 12; k++) { /* every failure after a ban ran out: twice the last ban */
        want *= 2;
        sp_rt_failed(rt, a, 0, &why);
        ck_assert_msg(fabs(ban_left(rt, a) - want) < 1e-6, "failure %d: banned %.1f s, want %.0f", k + 1,
                      ban_left(rt, a), want);
        ck_assert_int_eq(rt->servers[a]->failures, k + 1);
        char s[64];
        snprintf(s, sizeof s, "banned for %.0f s", want);
        ck_assert_msg(strstr(retry_text[nretry - 1], s), "%s", retry_text[nretry - 1]);
        ck_assert_int_eq(routed_server(rt), b);
        clock_now += want - 0.01;
        ck_assert_int_eq(routed_server(rt), b);
        clock_now += 0.02;
        ck_assert_int_eq(routed_server(rt), a);
    }
    /* banned servers are still the route where nothing else covers the blocks */
    sp_rt_failed(rt, a, 0, &why);
    sp_rt_failed(rt, b, 0, &why);
    ck_assert_int_eq(routed_server(rt), a);
    sp_runtime_free(rt);
}
END_TEST

/* A success clears the ban and the count: the next failure is a first one again. */
START_TEST(t_success_clears)
{
    sp_runtime *rt = runtime();
    int a = entry(rt, "aaaaaaaaaaaaaaaa", 4001, 0, 4, 200), b = entry(rt, "bbbbbbbbbbbbbbbb", 4002, 0, 4, 50);
    (void)b;
    sp_rt_failed(rt, a, 0, NULL);
    clock_now += 16;
    sp_rt_failed(rt, a, 0, NULL);
    clock_now += 31;
    sp_rt_failed(rt, a, 0, NULL);
    ck_assert_double_eq_tol(ban_left(rt, a), 60, 1e-9);
    ck_assert_int_eq(rt->servers[a]->failures, 3);
    ck_assert_int_ne(routed_server(rt), a);
    sp_rt_succeeded(rt, a); /* while banned (another client's request got through, say): usable at once */
    ck_assert_int_eq(rt->servers[a]->failures, 0);
    ck_assert(rt->servers[a]->banned_until <= clock_now);
    ck_assert_int_eq(routed_server(rt), a);
    sp_rt_failed(rt, a, 0, NULL);
    ck_assert_double_eq_tol(ban_left(rt, a), 15, 1e-9);
    ck_assert_int_eq(rt->servers[a]->failures, 1);
    ck_assert_msg(strstr(retry_text[nretry - 1], "failed: ?; banned for 15 s"), "%s", retry_text[nretry - 1]);
    /* the first ban is the ban setting; it doubles the same way */
    rt->set.ban_s = 2;
    sp_rt_succeeded(rt, a);
    for (int k = 0; k < 4; k++) {
        sp_rt_failed(rt, a, 0, NULL);
        ck_assert_double_eq_tol(ban_left(rt, a), 2 << k, 1e-9);
        clock_now += (2 << k) + 0.5;
    }
    sp_runtime_free(rt);
}
END_TEST

/* A server that refused a session as "overloaded" (SP_ERR_BUSY) is busy, not failed: no ban, no failure counted, the
 * event says so; routing prefers the others for ban_s (not doubled), uses it where nothing else covers the blocks,
 * and uses it again once that time is over. A record saying its queue wait is over its bound (max_queue_wait) keeps
 * it out of routes as long as it says so, though it is the faster. */
START_TEST(t_busy_not_banned)
{
    sp_runtime *rt = runtime();
    int a = entry(rt, "aaaaaaaaaaaaaaaa", 4001, 0, 4, 200), b = entry(rt, "bbbbbbbbbbbbbbbb", 4002, 0, 4, 50);
    ck_assert_int_eq(routed_server(rt), a);
    sp_err why = {.code = SP_ERR_BUSY};
    snprintf(why.msg, sizeof why.msg, "overloaded: decode steps wait 2 s");
    for (int k = 0; k < 3; k++) {
        sp_rt_failed(rt, a, k, &why);
        ck_assert_int_eq(rt->servers[a]->failures, 0);
        ck_assert(rt->servers[a]->banned_until <= clock_now);
        ck_assert_double_eq_tol(rt->servers[a]->busy_until - clock_now, 15, 1e-9);
        ck_assert_msg(strstr(retry_text[nretry - 1], "127.0.0.1:4001 (blocks 0:4) is busy: overloaded: decode steps "
                                                     "wait 2 s; other servers first for 15 s; retry"),
                      "%s", retry_text[nretry - 1]);
        ck_assert_int_eq(routed_server(rt), b);
        clock_now += 14.9;
        ck_assert_int_eq(routed_server(rt), b);
        clock_now += 0.2;
        ck_assert_int_eq(routed_server(rt), a);
    }
    sp_rt_failed(rt, a, 0, &why); /* busy, and b banned: a is what covers the blocks */
    sp_rt_failed(rt, b, 0, NULL);
    ck_assert_int_eq(routed_server(rt), a);
    sp_rt_succeeded(rt, b);
    clock_now += 16;
    pthread_mutex_lock(&rt->lock); /* its record: saturated (though its wait and blocks cost less than b's blocks) */
    rt->servers[a]->rec.queue_wait = 0.03;
    rt->servers[a]->rec.max_queue_wait = 0.02;
    pthread_mutex_unlock(&rt->lock);
    ck_assert_int_eq(routed_server(rt), b);
    clock_now += 1000;
    ck_assert_int_eq(routed_server(rt), b);
    pthread_mutex_lock(&rt->lock); /* no longer */
    rt->servers[a]->rec.queue_wait = 0.01;
    pthread_mutex_unlock(&rt->lock);
    ck_assert_int_eq(routed_server(rt), a);
    sp_runtime_free(rt);
}
END_TEST

/* A failure bans the earlier lives of the server at the same address with it (a server restarted there got a new
 * id; the records of its earlier lives may still look online): the retry goes to another address. A newer life
 * there is not banned by an older one's failure. */
START_TEST(t_ban_address)
{
    sp_runtime *rt = runtime();
    int old1 = entry_at(rt, "b1b1b1b1b1b1b1b1", 4002, 0, 4, 400, SP_SERVER_ONLINE, 100);
    int old2 = entry_at(rt, "b2b2b2b2b2b2b2b2", 4002, 0, 4, 400, SP_SERVER_ONLINE, 200);
    int live = entry_at(rt, "b3b3b3b3b3b3b3b3", 4002, 0, 4, 400, SP_SERVER_ONLINE, 300);
    int a = entry(rt, "aaaaaaaaaaaaaaaa", 4001, 0, 4, 50); /* slower: routing prefers the lives at 4002 */
    int r = routed_server(rt);
    ck_assert_msg(r != a, "routed to the slow server");
    sp_rt_failed(rt, live, 0, NULL);
    ck_assert_double_eq_tol(ban_left(rt, live), 15, 1e-9);
    ck_assert_double_eq_tol(ban_left(rt, old1), 15, 1e-9);
    ck_assert_double_eq_tol(ban_left(rt, old2), 15, 1e-9);
    ck_assert_int_eq(routed_server(rt), a); /* not an earlier life at the banned address */
    sp_rt_succeeded(rt, live);
    ck_assert_int_eq(routed_server(rt), live);
    /* an older life's failure leaves the newer one alone */
    sp_rt_succeeded(rt, old1);
    sp_rt_succeeded(rt, old2);
    sp_rt_failed(rt, old1, 0, NULL);
    ck_assert(ban_left(rt, live) <= 0);
    ck_assert_double_eq_tol(ban_left(rt, old1), 15, 1e-9);
    sp_runtime_free(rt);
}
END_TEST

START_TEST(t_backoff)
{
    sp_runtime *rt = runtime();
    const double want[] = {0, 1, 2, 4, 8, 16, 32, 60, 60, 60, 60};
    for (int k = 1; k <= 11; k++)
        ck_assert_msg(sp_rt_backoff(rt, k) == want[k - 1], "before retry %d: %g s, want %g", k, sp_rt_backoff(rt, k),
                      want[k - 1]);
    ck_assert_double_eq(sp_rt_backoff(rt, 1000), 60);
    rt->set.backoff_max_s = 5;
    const double capped[] = {0, 1, 2, 4, 5, 5};
    for (int k = 1; k <= 6; k++)
        ck_assert_double_eq(sp_rt_backoff(rt, k), capped[k - 1]);
    /* the retry events say when the retry comes */
    rt->set.backoff_max_s = 60;
    int a = entry(rt, "aaaaaaaaaaaaaaaa", 4001, 0, 4, 200);
    for (int k = 0; k < 8; k++) {
        sp_rt_failed(rt, a, k, NULL);
        char s[64];
        if (k == 0)
            snprintf(s, sizeof s, "retry 1 of 8 now");
        else
            snprintf(s, sizeof s, "retry %d of 8 in %.0f s", k + 1, want[k]);
        ck_assert_msg(strstr(retry_text[k], s), "failure %d: %s", k, retry_text[k]);
    }
    sp_rt_failed(rt, a, 8, NULL);
    ck_assert_msg(strstr(retry_text[8], "no retries left (8)"), "%s", retry_text[8]);
    sp_runtime_free(rt);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* the retry limit, through the real request loops */

/* A loopback port bound but not listening: every connection to it is refused. */
static int refusing_port(int *fd)
{
    *fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(*fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(bind(*fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t len = sizeof a;
    ck_assert_int_eq(getsockname(*fd, (struct sockaddr *)&a, &len), 0);
    return ntohs(a.sin_port);
}

/* A loopback port that accepts connections and hangs up at once (a thread does it until the socket closes):
 * a server that listens but fails every request. */
static void *hang_up(void *arg)
{
    int fd = *(int *)arg, c;
    while ((c = accept(fd, NULL, NULL)) >= 0)
        close(c);
    return NULL;
}

static int hanging_up_port(int *fd, pthread_t *th)
{
    int port = refusing_port(fd);
    ck_assert_int_eq(listen(*fd, 16), 0);
    ck_assert_int_eq(pthread_create(th, NULL, hang_up, fd), 0);
    return port;
}

static void hanging_up_close(int fd, pthread_t th)
{
    shutdown(fd, SHUT_RDWR); /* accept() returns */
    pthread_join(th, NULL);
    close(fd);
}

/* A runtime with stories15M's local parts and one server for all its blocks (state st) at port. */
static sp_runtime *swarm_at(int port, sp_server_state st)
{
    sp_runtime *rt = runtime();
    sp_err err = {0};
    ck_assert_msg(sp_runtime_load(rt, M15, &err) == SP_OK, "%s (run scripts/fetch-model.sh)", err.msg);
    entry_at(rt, "dddddddddddddddd", port, 0, rt->local->cfg.n_layers, 200, st, 0);
    return rt;
}

/* One server for all blocks that fails every request but still listens; *max: the retries (< 0: the default's,
 * which it is set to). */
static sp_runtime *dead_swarm(int *max, int *fd, pthread_t *th, int *port)
{
    *port = hanging_up_port(fd, th);
    sp_runtime *rt = swarm_at(*port, SP_SERVER_ONLINE);
    if (*max >= 0)
        rt->set.max_retries = *max;
    else
        *max = rt->set.max_retries;
    return rt;
}

/* 1 + max tries, the pauses 0, 1, 2, 4 ... between them, one event per failure, the last without a retry. */
static void check_tries(int max, int port)
{
    ck_assert_int_eq(nretry, max + 1);
    ck_assert_int_eq(nslept, max);
    double total = 0;
    for (int k = 0; k < max; k++) {
        double want = k == 0 ? 0 : fmin(pow(2, k - 1), 60);
        ck_assert_msg(slept[k] == want, "pause before retry %d: %g s, want %g", k + 1, slept[k], want);
        total += want;
    }
    ck_assert_double_eq_tol(clock_now, 1000 + total, 1e-9);
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    for (int k = 0; k < max; k++) {
        char s[32];
        snprintf(s, sizeof s, "retry %d of %d", k + 1, max);
        ck_assert_msg(strstr(retry_text[k], s) && strstr(retry_text[k], addr), "event %d: %s", k, retry_text[k]);
    }
    char last[48];
    snprintf(last, sizeof last, "no retries left (%d)", max);
    ck_assert_msg(strstr(retry_text[max], last), "last event: %s", retry_text[max]);
}

static void forward_until_limit(int max)
{
    int fd, port;
    pthread_t th;
    sp_runtime *rt = dead_swarm(&max, &fd, &th, &port);
    int B = 1, T = 3, H = rt->local->cfg.hidden, L = rt->local->cfg.n_layers;
    float *x = calloc((size_t)B * T * H, sizeof(float));
    sp_route route;
    sp_err err = {0};
    ck_assert_msg(sp_runtime_route_train(rt, &route, &err) == SP_OK, "%s", err.msg);
    ck_assert_int_ne(sp_runtime_forward(rt, &route, x, B, T, NULL, 0, NULL, NULL, &err), SP_OK);
    char s[64];
    snprintf(s, sizeof s, "no server could run blocks 0:%d (%d retries)", L, max);
    ck_assert_msg(strstr(err.msg, s), "error: %s", err.msg);
    check_tries(max, port);
    /* the server stayed banned 15 s from its first failure: the tries came within the ban */
    if (clock_now < 1015)
        ck_assert_double_eq_tol(rt->servers[0]->banned_until, 1015, 1e-9);
    printf("training FORWARD, max_retries %d: %s\n", max, err.msg);
    free(x);
    hanging_up_close(fd, th);
    sp_runtime_free(rt);
}

START_TEST(t_retry_limit_training)
{
    forward_until_limit(-1); /* the default: 8 retries, 0 + 1 + 2 + 4 + 8 + 16 + 32 + 60 s of pauses */
    forward_until_limit(3);
    forward_until_limit(0);
}
END_TEST

/* A greedy generation of 4 tokens through rt: its status, the error in err. */
static sp_status generate4(sp_runtime *rt, sp_err *err)
{
    sp_lm_swarm sw;
    sp_lm lm = sp_lm_swarm_make(&sw, rt);
    sp_gen_opts o;
    sp_gen_opts_default(&o);
    o.max_new = 4;
    int32_t prompt[] = {1, 9038, 2501};
    const int32_t *pp = prompt;
    int len = 3;
    sp_gen_result got;
    sp_status st = sp_generate(&lm, NULL, &pp, &len, 1, &o, NULL, NULL, &got, err);
    if (!st)
        sp_gen_result_free(&got);
    return st;
}

static void generate_until_limit(int max)
{
    int fd, port;
    pthread_t th;
    sp_runtime *rt = dead_swarm(&max, &fd, &th, &port);
    sp_err err = {0};
    ck_assert_int_ne(generate4(rt, &err), SP_OK);
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    ck_assert_msg(strstr(err.msg, addr), "error does not name the server: %s", err.msg);
    check_tries(max, port);
    printf("generation, max_retries %d: %s\n", max, err.msg);
    hanging_up_close(fd, th);
    sp_runtime_free(rt);
}

START_TEST(t_retry_limit_generation)
{
    generate_until_limit(-1);
    generate_until_limit(2);
}
END_TEST

/* A server whose address refuses connections (its process is gone) holds nothing: with no other server for its
 * blocks and none joining, a request fails after its first try, without a pause, saying so; the server is down. */
START_TEST(t_dead_address_fails_fast)
{
    for (int training = 0; training < 2; training++) {
        int fd, port = refusing_port(&fd);
        sp_runtime *rt = swarm_at(port, SP_SERVER_ONLINE);
        int L = rt->local->cfg.n_layers;
        sp_err err = {0};
        sp_status st;
        if (training) {
            float *x = calloc((size_t)3 * rt->local->cfg.hidden, sizeof(float));
            sp_route route;
            ck_assert_msg(sp_runtime_route_train(rt, &route, &err) == SP_OK, "%s", err.msg);
            st = sp_runtime_forward(rt, &route, x, 1, 3, NULL, 0, NULL, NULL, &err);
            free(x);
        } else {
            st = generate4(rt, &err);
        }
        printf("%s, the only server's address refuses connections: %s\n", training ? "training" : "generation",
               err.msg);
        ck_assert_int_eq(st, SP_ERR_NOTFOUND);
        char want[96], addr[32];
        snprintf(addr, sizeof addr, "127.0.0.1:%d (blocks 0:%d): ", port, L);
        ck_assert_msg(strstr(err.msg, addr), "the error does not name the server: %s", err.msg);
        snprintf(want, sizeof want, "; no other server holds block 0 (of 0..%d), and none is joining", L - 1);
        ck_assert_msg(strstr(err.msg, want), "error: %s", err.msg);
        ck_assert_msg(clock_now == 1000, "it waited %g s", clock_now - 1000);
        ck_assert_int_eq(nretry, 1);
        ck_assert_msg(strstr(retry_text[0], "nothing listens there now"), "%s", retry_text[0]);
        ck_assert(rt->servers[0]->down);
        close(fd);
        sp_runtime_free(rt);
    }
}
END_TEST

/* No online server for the blocks, but one is joining: each retry says so and when it comes, the pauses are the
 * policy's, and the retries end with an error naming the blocks and the count. */
START_TEST(t_waits_for_joining)
{
    int fd, port = refusing_port(&fd);
    sp_runtime *rt = swarm_at(port, SP_SERVER_JOINING);
    rt->set.max_retries = 4;
    int L = rt->local->cfg.n_layers;
    sp_err err = {0};
    ck_assert_int_eq(generate4(rt, &err), SP_ERR_NOTFOUND);
    printf("generation waiting for a joining server: %s\n", err.msg);
    ck_assert_int_eq(nretry, 5);
    const double pause[] = {0, 1, 2, 4};
    for (int k = 0; k < 4; k++) {
        char s[160];
        snprintf(s, sizeof s, "no online server holds block 0 (of 0..%d) yet; server dddddddddddddddd (blocks 0:%d) "
                 "is joining; retry %d of 4 %s", L - 1, L, k + 1, k ? "in" : "now");
        ck_assert_msg(strstr(retry_text[k], s), "event %d: %s", k, retry_text[k]);
        ck_assert_double_eq(slept[k], pause[k]);
    }
    ck_assert_msg(strstr(retry_text[4], "no retries left (4)"), "%s", retry_text[4]);
    char want[96];
    snprintf(want, sizeof want, "no server could run blocks 0:%d (4 retries)", L);
    ck_assert_msg(strstr(err.msg, want), "error: %s", err.msg);
    close(fd);
    sp_runtime_free(rt);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("policy");
    TCase *tc = tcase_create("bans");
    tcase_add_test(tc, t_defaults);
    tcase_add_test(tc, t_ban_doubles);
    tcase_add_test(tc, t_busy_not_banned);
    tcase_add_test(tc, t_success_clears);
    tcase_add_test(tc, t_ban_address);
    tcase_add_test(tc, t_backoff);
    suite_add_tcase(s, tc);
    TCase *tr = tcase_create("retries");
    tcase_set_timeout(tr, 60);
    tcase_add_test(tr, t_retry_limit_training);
    tcase_add_test(tr, t_retry_limit_generation);
    tcase_add_test(tr, t_dead_address_fails_fast);
    tcase_add_test(tr, t_waits_for_joining);
    suite_add_tcase(s, tr);
    return s;
}

int main(void) { return sp_test_run(suite()); }
