/* test_attack.c - one hostile peer against a real sepal-server process (stories15M, blocks 0:6, a small budget),
 * from 127.0.0.2 as another host would be, while a legitimate client on 127.0.0.1 connects and generates: the
 * attacks of issue 17 (ws/transport.h, "A server bounds what one peer can make it hold").
 *
 * For each attack: the server's RSS stays under its budget plus a fixed margin, it stays up, fresh legitimate
 * clients get the reference greedy text while the attack bites (five of them, one at least within 2 s: connect +
 * 8 tokens), and
 * once the attacker is gone the server's RSS and descriptors come back within 10% of what they were. The INFO
 * flood also checks that the flooding connection gets every reply once it reads. Under ASan the allocator's
 * quarantine keeps freed memory, so there the RSS bounds are not checked (everything else is). */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "attack.h"
#include "generate.h"
#include "log.h"
#include "remote.h"
#include "runtime.h"
#include "serverproc.h"
#include "testutil.h"
#include "timeutil.h"

#define M15 SEPAL_STORIES15M_DIR
#define ATTACKER "127.0.0.2"
#define DEADLINE_S 2.0   /* the issue's: a legitimate client is served within 2 s during an attack */
#define BUDGET_MIB 24    /* --input-budget of the server under attack */
#define MARGIN_MIB 64    /* lws's buffers per connection, the kernel's accounting, the allocator's slack */
#define PROMPT "Once upon a time"
#define NEW_TOKENS 8
#define ATTEMPTS 5       /* each must get the reference text; one at least within DEADLINE_S */

#if defined(__SANITIZE_ADDRESS__)
#define CHECK_RSS 0
#else
#define CHECK_RSS 1
#endif

/* The server under attack: a request of the span is at most 8 MiB ((1 + 6) x 1024 positions x 288 x 4, and the
 * metadata), a connection's share; the whole budget 24 MiB (12 per address); short deadlines so the test does not
 * wait long. */
static const char *const SERVER_ARGS[] = {"--model", M15, "--blocks", "0:6", "--no-measure",
                                          "--max-batch-tokens", "256", "--cache-tokens", "1024",
                                          "--input-budget", "24", "--busy-timeout", "2", "--handshake-timeout", "2",
                                          "--idle-timeout", "3", "--max-connections-per-ip", "64",
                                          "--max-handshakes-per-ip", "16", NULL};

typedef struct fixture {
    sp_test_proc p;
    char ref[1024];
    long base_rss_kb;
    int base_fds;
    pthread_t sampler;
    atomic_int stop;
    atomic_long peak_kb;
    atomic_int peak_fds;
} fixture;

/* ---------------------------------------------------------------------------------------------- */
/* the server process */

static long rss_kb(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6))
            kb = atol(line + 6);
    if (f)
        fclose(f);
    return kb;
}

static int nfds(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    int n = 0;
    while (d && readdir(d))
        n++;
    if (d)
        closedir(d);
    return n - 2; /* . and .. */
}

static void *sampler_main(void *arg)
{
    fixture *f = arg;
    while (!atomic_load(&f->stop)) {
        long kb = rss_kb(f->p.pid);
        int fds = nfds(f->p.pid);
        if (kb > atomic_load(&f->peak_kb))
            atomic_store(&f->peak_kb, kb);
        if (fds > atomic_load(&f->peak_fds))
            atomic_store(&f->peak_fds, fds);
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* The server's INFO "transport" counters (-1 each if they cannot be read); counter(f, busy) is one of them. */
static sp_info_transport transport_of(fixture *f)
{
    sp_remote *r = NULL;
    sp_info_reply a;
    if (sp_remote_connect(&r, "127.0.0.1", f->p.port, 1, 5000, NULL) || sp_remote_get_info(r, &a, 5000, NULL))
        memset(&a.transport, 0xff, sizeof a.transport); /* every counter -1 */
    sp_remote_close(r);
    return a.transport;
}
#define counter(f, name) ((double)transport_of(f).name)

/* ---------------------------------------------------------------------------------------------- */
/* the legitimate client */

/* A fresh client: loads the local parts, then (timed) connects and generates NEW_TOKENS greedy tokens. Returns
 * the seconds from the connect to the last token, or -1 with the error in text. */
static double legit(int port, char *text, size_t cap)
{
    sp_runtime *rt = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_runtime_new(&rt, NULL, NULL, &err), SP_OK);
    ck_assert_msg(sp_runtime_load(rt, M15, &err) == SP_OK, "%s", err.msg);
    int *ids = NULL, n = 0;
    ck_assert_int_eq(sp_tokenizer_encode(sp_runtime_tokenizer(rt), PROMPT, 1, &ids, &n, &err), SP_OK);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    double t0 = sp_now_s(), dt = -1;
    sp_lm_swarm sw;
    sp_gen_result r = {0};
    sp_gen_opts o;
    sp_gen_opts_default(&o);
    o.max_new = NEW_TOKENS;
    const int32_t *ps[1] = {ids};
    if (sp_runtime_connect(rt, addr, &err) == SP_OK) {
        sp_lm lm = sp_lm_swarm_make(&sw, rt);
        if (sp_generate(&lm, sp_runtime_tokenizer(rt), ps, &n, 1, &o, NULL, NULL, &r, &err) == SP_OK) {
            dt = sp_now_s() - t0;
            snprintf(text, cap, "%s", r.text[0]);
        }
    }
    if (dt < 0)
        snprintf(text, cap, "%s", err.msg);
    sp_gen_result_free(&r);
    free(ids);
    sp_runtime_free(rt);
    return dt;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The machine is shared (a load average of 20 on its 2 cores has been seen): of ATTEMPTS fresh clients every one
 * must get the reference text, and one at least within the deadline (before this issue, slowloris left none
 * served in 10 s). The median is printed, not demanded: over 3 runs of each build at load 8-15 (200 clients) the
 * plain build's median client took 0.047 s (none over 2 s, the slowest 1.81 s), but under ASan the INFO flood's
 * median was 1.995 s in one run of four (its clients 0.39-3.23 s; 0.27-0.68 s in the others). Not a first-connect
 * cost (the fixture warms the server with two generations; a client's load is not timed), nor the paused flooder
 * (per-thread CPU: the service thread, which answers INFO inline, works only on the flood's first burst and when
 * the flooder reads again); the shared machine's load, which moves within a run, is what is left. */
static void served(int port, const char *ref, const char *name)
{
    double t[ATTEMPTS];
    for (int i = 0; i < ATTEMPTS; i++) {
        char text[1024];
        double dt = legit(port, text, sizeof text);
        fprintf(stderr, "%s: legitimate client served in %.3f s\n", name, dt);
        ck_assert_msg(dt >= 0, "%s: the legitimate client failed: %s", name, text);
        ck_assert_msg(!strcmp(text, ref), "%s: got \"%s\", expected \"%s\"", name, text, ref);
        t[i] = dt;
    }
    qsort(t, ATTEMPTS, sizeof *t, cmp_double);
    fprintf(stderr, "%s: legitimate clients served in %.3f s at best, %.3f s at the median\n", name, t[0],
            t[ATTEMPTS / 2]);
    ck_assert_msg(t[0] <= DEADLINE_S, "%s: the legitimate client took %.2f s at best", name, t[0]);
}

/* ---------------------------------------------------------------------------------------------- */
/* the fixture */

typedef struct settle_arg {
    fixture *f;
    long rss_kb;
    int fds;
} settle_arg;

static int settled(void *u)
{
    settle_arg *s = u;
    long kb = rss_kb(s->f->p.pid);
    int fds = nfds(s->f->p.pid);
    int ok = (!CHECK_RSS || kb <= s->rss_kb) && fds <= s->fds;
    return ok;
}

static void start(fixture *f)
{
    memset(f, 0, sizeof *f);
    ck_assert_msg(sp_test_server_start(&f->p, (const char *const *)SERVER_ARGS) == 0, "the server did not start");
    double dt = legit(f->p.port, f->ref, sizeof f->ref); /* the reference text, and a warm server */
    ck_assert_msg(dt >= 0, "the reference generation failed: %s", f->ref);
    ck_assert_int_gt((int)strlen(f->ref), 10);
    dt = legit(f->p.port, f->ref, sizeof f->ref);
    ck_assert(dt >= 0);
    /* the client's connection closes: wait until the descriptors are back to the server's own */
    int fds = nfds(f->p.pid), stable = 0;
    for (int i = 0; i < 200 && stable < 10; i++) {
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
        int now = nfds(f->p.pid);
        stable = now == fds ? stable + 1 : 0;
        fds = now;
    }
    f->base_fds = fds;
    f->base_rss_kb = rss_kb(f->p.pid);
    atomic_store(&f->peak_kb, f->base_rss_kb);
    atomic_store(&f->peak_fds, f->base_fds);
    pthread_create(&f->sampler, NULL, sampler_main, f);
    fprintf(stderr, "server: RSS %.1f MiB, %d fds; reference: \"%s\"\n", f->base_rss_kb / 1024.0, f->base_fds, f->ref);
}

typedef struct atk_wait {
    fixture *f;
    sp_atk *a;
    int (*ok)(fixture *f, const sp_atk_stats *s);
} atk_wait;

static int biting(void *u)
{
    atk_wait *w = u;
    sp_atk_stats s;
    sp_atk_stats_get(w->a, &s);
    return w->ok(w->f, &s);
}

/* Runs an attack until ok says it bites; meanwhile and then the legitimate client is served; after the attack
 * the server comes back. after (may be NULL) runs before the attacker stops. */
static void attack_case(const char *name, sp_atk_opts ao, int (*ok)(fixture *, const sp_atk_stats *),
                        void (*after)(fixture *, sp_atk *))
{
    fixture f;
    start(&f);
    ao.src = ATTACKER;
    ao.port = ao.kind == SP_ATK_BULK ? f.p.bulk_port : f.p.port;
    sp_atk *a = NULL;
    ck_assert_int_eq(sp_atk_start(&a, &ao), 0);
    atk_wait w = {&f, a, ok};
    ck_assert_msg(sp_test_wait_for(biting, &w, 30), "%s: the attack never took hold", name);
    served(f.p.port, f.ref, name);
    ck_assert_msg(kill(f.p.pid, 0) == 0, "%s: the server died", name);
    if (after)
        after(&f, a);
    sp_atk_stats s;
    sp_atk_stats_get(a, &s);
    sp_atk_stop(a);
    long peak = atomic_load(&f.peak_kb);
    fprintf(stderr, "%s: attacker %ld connections, %ld refused, %ld upgraded, %ld closed by the server; server RSS "
            "peak %.1f MiB (base %.1f, budget %d)\n", name, s.connects, s.refused, s.upgraded, s.closed, peak / 1024.0,
            f.base_rss_kb / 1024.0, BUDGET_MIB);
    if (CHECK_RSS)
        ck_assert_msg(peak <= f.base_rss_kb + (BUDGET_MIB + MARGIN_MIB) * 1024L,
                      "%s: RSS peaked at %.1f MiB, base %.1f + budget %d + margin %d", name, peak / 1024.0,
                      f.base_rss_kb / 1024.0, BUDGET_MIB, MARGIN_MIB);
    settle_arg sa = {&f, (long)(f.base_rss_kb * 1.1), (int)ceil(f.base_fds * 1.1)};
    int back = sp_test_wait_for(settled, &sa, 30);
    long kb = rss_kb(f.p.pid);
    int fds = nfds(f.p.pid);
    fprintf(stderr, "%s: after the attack RSS %.1f MiB, %d fds\n", name, kb / 1024.0, fds);
    ck_assert_msg(back, "%s: after the attack RSS %.1f MiB (base %.1f), %d fds (base %d)", name, kb / 1024.0,
                  f.base_rss_kb / 1024.0, fds, f.base_fds);
    ck_assert_msg(kill(f.p.pid, 0) == 0, "%s: the server died", name);
    atomic_store(&f.stop, 1);
    pthread_join(f.sampler, NULL);
    sp_test_proc_signal(&f.p, SIGTERM);
}

/* ---------------------------------------------------------------------------------------------- */
/* the attacks */

/* Six connections each declare 200 MiB and send 8 MiB of it: more than a connection may hold, refused at once
 * (the first measurement: 32 MB -> 1.26 GB before). */
static int huge_ok(fixture *f, const sp_atk_stats *s)
{
    (void)f;
    return s->closed >= 12;
}

START_TEST(t_huge_messages)
{
    sp_atk_opts o = {.kind = SP_ATK_HUGE, .conns = 6, .msg_bytes = 200ull << 20, .send_bytes = 8ull << 20,
                     .reconnect = 1};
    attack_case("huge messages", o, huge_ok, NULL);
}
END_TEST

/* Eight connections each declare 7.5 MiB (what one may hold: 8 MiB) and send 7 MiB of it, then wait: together
 * more than the budget. One address's share admits one; the others wait, unread, and get "busy" and a close. */
static int budget_ok(fixture *f, const sp_atk_stats *s)
{
    return s->upgraded >= 8 && counter(f, busy) >= 2;
}

START_TEST(t_budget)
{
    sp_atk_opts o = {.kind = SP_ATK_BUDGET, .conns = 8, .msg_bytes = 7680ull << 10, .send_bytes = 7ull << 20,
                     .reconnect = 1};
    attack_case("budget", o, budget_ok, NULL);
}
END_TEST

/* One connection sends INFO requests and never reads the replies (the issue: 1.9 GB in 20 s): once its unsent
 * replies pass the output bound it is not read. When it reads at last, every request it sent has its reply. */
static int flood_ok(fixture *f, const sp_atk_stats *s)
{
    return s->sent > 1000 && counter(f, paused) >= 1;
}

static void flood_after(fixture *f, sp_atk *a)
{
    (void)f;
    sp_atk_drain(a, 20); /* 20 s without a reply: it stopped */
    sp_atk_stats s;
    sp_atk_stats_get(a, &s);
    fprintf(stderr, "flood: %ld requests sent, %ld replies read, %ld bad\n", s.sent, s.replies, s.bad);
    ck_assert_int_eq(s.bad, 0);
    ck_assert_int_eq(s.closed, 0);
    ck_assert_int_eq(s.replies, s.sent);
}

START_TEST(t_flood_without_reading)
{
    /* 200k requests: 160 MB of replies, that the server would hold without the output bound (the kernel's
     * autotuned buffers could take 10^6 requests unbounded, more than a loaded machine drains in the time) */
    sp_atk_opts o = {.kind = SP_ATK_FLOOD, .conns = 1, .max_requests = 200000};
    attack_case("INFO flood", o, flood_ok, flood_after);
}
END_TEST

/* 200 sockets send part of an HTTP upgrade, a byte every 500 ms, and reconnect when closed (the issue: 0 of 9
 * new clients got in). 16 from an address may be in their handshake; the rest are refused at once, and none
 * outlives the 2 s handshake deadline however it trickles. */
static int slowloris_ok(fixture *f, const sp_atk_stats *s)
{
    return s->connects >= 400 && counter(f, handshake_timeouts) >= 16;
}

START_TEST(t_slowloris)
{
    sp_atk_opts o = {.kind = SP_ATK_SLOWLORIS, .conns = 200, .reconnect = 1};
    attack_case("slowloris", o, slowloris_ok, NULL);
}
END_TEST

/* Up to 2000 websocket connections complete HELLO and idle (the issue: no cap, no idle timeout, an fd flood):
 * 64 from an address are taken, the rest refused at once; the idle ones close after 3 s. */
static int idle_ok(fixture *f, const sp_atk_stats *s)
{
    (void)f;
    return s->upgraded >= 64 && s->refused >= 100;
}

static int idle_closed(void *u)
{
    sp_atk *a = u;
    sp_atk_stats s;
    sp_atk_stats_get(a, &s);
    return s.closed >= 64;
}

static void idle_after(fixture *f, sp_atk *a)
{
    ck_assert_msg(sp_test_wait_for(idle_closed, a, 30), "idle connections were not closed");
    ck_assert_int_ge(counter(f, idle_closed), 64);
}

START_TEST(t_idle_connections)
{
    long want = 2000, fdmax = sysconf(_SC_OPEN_MAX) - 200;
    sp_atk_opts o = {.kind = SP_ATK_IDLE, .conns = (int)(want < fdmax ? want : fdmax)};
    attack_case("idle connections", o, idle_ok, idle_after);
}
END_TEST

/* 200 sockets connect to the bulk port, send 3 bytes of the attach preamble and wait, reconnecting when closed:
 * 16 from an address may wait for their token (BULK_PENDING_PER_IP), the rest are answered busy and closed at once
 * (counted in bulk_refused), and those waiting are closed at the 2 s handshake deadline; so the bulk port holds at
 * most 16 of the server's descriptors for the attacker. */
static int bulk_ok(fixture *f, const sp_atk_stats *s)
{
    return s->refused >= 100 && s->closed >= 16 && counter(f, bulk_timeouts) >= 16;
}

static void bulk_after(fixture *f, sp_atk *a)
{
    (void)a;
    int peak = atomic_load(&f->peak_fds);
    double refused = counter(f, bulk_refused);
    fprintf(stderr, "bulk port: server fds peak %d (base %d), %.0f bulk sockets refused\n", peak, f->base_fds, refused);
    ck_assert_double_ge(refused, 100);
    /* the attacker's 16 waiting sockets, a legitimate client's two, the counters' connection, a refusal in flight */
    ck_assert_msg(peak <= f->base_fds + 16 + 8, "the server held %d descriptors (base %d)", peak, f->base_fds);
}

START_TEST(t_bulk_port)
{
    sp_atk_opts o = {.kind = SP_ATK_BULK, .conns = 200, .reconnect = 1};
    attack_case("bulk port", o, bulk_ok, bulk_after);
}
END_TEST

/* The server's descriptors run out (its open-file limit lowered to 96 and its caps set above it on purpose):
 * each connection it cannot take, on the ws port or the bulk port, is refused at once with the listener's spare
 * descriptor (before, a bulk socket was left unanswered in the backlog while the bulk thread spun on its
 * level-triggered listener), the log says so a few times rather than once per connection (the issue: 34k lines),
 * and it serves again once the attacker is gone. */
/* BULK_PROBES sockets from the attacker's address present a token to the bulk port; 2 s later each must have had
 * its answer: the refusal ("SPBK" + 1) or the close. Returns how many had; *cpu gets the server's CPU seconds
 * over those 2 s. */
#define BULK_PROBES 8
static int bulk_probes(fixture *f, int bulk_port, double *cpu)
{
    int fds[BULK_PROBES], answered = 0;
    uint8_t pre[16] = {'S', 'P', 'B', 'K', 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8};
    double c0 = sp_serverproc_cpu_s(f->p.pid);
    for (int i = 0; i < BULK_PROBES; i++) {
        fds[i] = sp_atk_connect(ATTACKER, bulk_port); /* the kernel completes it: the backlog has room */
        ck_assert_msg(fds[i] >= 0, "no TCP connection to the bulk port");
        ck_assert_int_eq((int)send(fds[i], pre, sizeof pre, MSG_NOSIGNAL), (int)sizeof pre);
    }
    struct timespec ts = {2, 0};
    nanosleep(&ts, NULL);
    *cpu = sp_serverproc_cpu_s(f->p.pid) - c0;
    for (int i = 0; i < BULK_PROBES; i++) {
        uint8_t ack[16];
        ssize_t r = recv(fds[i], ack, sizeof ack, MSG_DONTWAIT);
        answered += r == 0 || (r < 0 && errno == ECONNRESET) ||
                    (r == (ssize_t)sizeof ack && !memcmp(ack, "SPBK", 4) && ack[4] == 1);
        close(fds[i]);
    }
    return answered;
}

static int fds_back(void *u)
{
    settle_arg *s = u;
    return nfds(s->f->p.pid) <= s->fds;
}

START_TEST(t_fd_exhaustion)
{
    const char *args[40];
    int n = 0;
    for (; SERVER_ARGS[n]; n++)
        args[n] = SERVER_ARGS[n];
    /* (and the idle connections stay while the bulk port is probed: they would give their descriptors back) */
    const char *more[] = {"--max-connections", "1000", "--max-connections-per-ip", "1000", "--max-handshakes", "1000",
                          "--max-handshakes-per-ip", "1000", "--idle-timeout", "60", NULL};
    for (int i = 0; more[i]; i++)
        args[n++] = more[i];
    args[n] = NULL;
    struct rlimit old, low;
    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &old), 0);
    low = old;
    low.rlim_cur = 96; /* the server inherits it at the fork */
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
    fixture f;
    memset(&f, 0, sizeof f);
    int started = sp_test_server_start(&f.p, args);
    setrlimit(RLIMIT_NOFILE, &old);
    ck_assert_int_eq(started, 0);
    char ref[1024];
    ck_assert(legit(f.p.port, ref, sizeof ref) >= 0);
    int base = nfds(f.p.pid);
    sp_atk_opts o = {.kind = SP_ATK_IDLE, .src = ATTACKER, .port = f.p.port, .conns = 300};
    sp_atk *a = NULL;
    ck_assert_int_eq(sp_atk_start(&a, &o), 0);
    atk_wait w = {&f, a, idle_ok};
    ck_assert_msg(sp_test_wait_for(biting, &w, 30), "the descriptors never ran out");
    sp_atk_stats st;
    sp_atk_stats_get(a, &st);
    double cpu = -1;
    int answered = bulk_probes(&f, f.p.bulk_port, &cpu);
    int lines = sp_atk_count_lines(f.p.log, "out of file descriptors (Too many open files): refusing connections");
    int bulk_lines = sp_atk_count_lines(f.p.log, "out of file descriptors (Too many open files): refusing bulk sockets");
    fprintf(stderr, "fd exhaustion: %ld upgraded, %ld refused; %d of %d bulk sockets answered at once, server CPU "
            "%.2f s in those 2 s; %d + %d log lines about it\n", st.upgraded, st.refused, answered, BULK_PROBES, cpu,
            lines, bulk_lines);
    ck_assert_int_ge(lines, 1);
    ck_assert_int_le(lines, 2 * SP_LOG_BURST);
    ck_assert_int_eq(answered, BULK_PROBES);
    ck_assert_int_ge(bulk_lines, 1);
    ck_assert_int_le(bulk_lines, 2 * SP_LOG_BURST);
    /* a generous bound: a thread spinning on the listener would use a whole core; this server has nothing to do */
    ck_assert_msg(cpu >= 0 && cpu < 1.0, "the server used %.2f s of CPU in 2 s with nothing to do", cpu);
    ck_assert(kill(f.p.pid, 0) == 0);
    sp_atk_stop(a);
    settle_arg sa = {&f, 0, base + 1};
    ck_assert_msg(sp_test_wait_for(fds_back, &sa, 30), "descriptors: %d, base %d", nfds(f.p.pid), base);
    /* the server's count of the sockets it refused for want of a descriptor (no connection could ask before) */
    ck_assert_double_ge(counter(&f, out_of_fds), BULK_PROBES);
    ck_assert_double_ge(counter(&f, bulk_refused), BULK_PROBES);
    served(f.p.port, ref, "after the descriptors ran out");
    sp_test_proc_signal(&f.p, SIGTERM);
}
END_TEST

static Suite *attack_suite(void)
{
    Suite *s = suite_create("attack");
    TCase *tc = tcase_create("attack");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, t_huge_messages);
    tcase_add_test(tc, t_budget);
    tcase_add_test(tc, t_flood_without_reading);
    tcase_add_test(tc, t_slowloris);
    tcase_add_test(tc, t_idle_connections);
    tcase_add_test(tc, t_bulk_port);
    tcase_add_test(tc, t_fd_exhaustion);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return sp_test_run(attack_suite()); }
