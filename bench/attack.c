/* attack.c - what each attack of issue 17 costs a legitimate client: one sepal-server process, then phases of S
 * seconds each: no attack (the baseline, measured in the same run), and each attack of tests/attack.h from
 * 127.0.0.2, while a legitimate client on 127.0.0.1 keeps (a) opening a connection and asking INFO (HELLO, the
 * bulk channel, one request: the connect latency), and (b) generating 16 greedy tokens on a connection it keeps
 * (the latency of every decode step). Prints per phase: connect p50/p99, step p50/p99, failures (errors or a text
 * other than the baseline's), the server's RSS peak, and the p99s as ratios of the baseline's.
 *
 * usage: bench_attack [MODEL_DIR] [--seconds S] [--only NAME] [--defaults]
 * The server runs the model's blocks with a small budget (as test_attack: --max-batch-tokens 256 --cache-tokens
 * 1024 --input-budget 24 and short deadlines) unless --defaults, which leaves every limit at its default (then the
 * attacks declare messages sized to the default share). SEPAL_SERVER_BIN names the server binary.
 *
 * The "fds" phase runs against a second server whose descriptors run out on purpose, as test_attack's
 * t_fd_exhaustion: its open-file limit 128, its connection caps above it, the idle timeout long; 300 idle
 * websockets take its descriptors while 50 sockets keep knocking on its bulk port. The legitimate client's kept
 * connection (opened before) goes on generating; its new connections are refused at once (counted as failures:
 * "refused"), so connect p50/p99 there are of refusals. */
#include <cJSON.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../tests/attack.h"
#include "../tests/serverproc.h"
#include "generate.h"
#include "memtune.h"
#include "remote.h"
#include "runtime.h"
#include "timeutil.h"

#define MAXS 200000

typedef struct opts {
    const char *model;
    double seconds;
    const char *only;
    int defaults;
} opts;

typedef struct server {
    pid_t pid;
    int port, bulk_port;
} server;

/* ---------------------------------------------------------------------------------------------- */
/* the server process */

/* Starts the server: the small-budget limits unless --defaults; fd_limit > 0: its open-file limit that, and its
 * caps above it (the "fds" phase). */
static int start_server(const opts *o, server *s, int fd_limit)
{
    const char *small[] = {"--max-batch-tokens", "256", "--cache-tokens", "1024", "--input-budget", "24",
                           "--busy-timeout", "2", "--handshake-timeout", "2", "--idle-timeout", "3",
                           "--max-connections-per-ip", "64", "--max-handshakes-per-ip", "16", NULL};
    const char *above[] = {"--max-connections", "1000", "--max-connections-per-ip", "1000", "--max-handshakes", "1000",
                           "--max-handshakes-per-ip", "1000", "--idle-timeout", "60", NULL};
    const char *argv[48] = {"sepal-server", "--model", o->model, "--blocks", "0:", "--no-measure"};
    int n = 6;
    for (int i = 0; !o->defaults && small[i]; i++)
        argv[n++] = small[i];
    for (int i = 0; fd_limit > 0 && above[i]; i++) /* later flags win */
        argv[n++] = above[i];
    argv[n] = NULL;
    char line[1024];
    s->pid = sp_serverproc_start(NULL, argv, fd_limit, NULL, line, sizeof line);
    const char *b = strstr(line, "(bulk port ");
    s->port = sp_serverproc_port(line, "ws://");
    s->bulk_port = b ? atoi(b + strlen("(bulk port ")) : -1;
    if (s->port <= 0)
        fprintf(stderr, "bench: %s did not start\n", sp_serverproc_bin());
    return s->port > 0 ? 0 : -1;
}

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
    return n - 2;
}

/* ---------------------------------------------------------------------------------------------- */
/* the legitimate client */

typedef struct sample {
    double *v;
    int n;
} sample;

static void add(sample *s, double x)
{
    if (s->n < MAXS)
        s->v[s->n++] = x;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(sample *s, double p)
{
    if (!s->n)
        return -1;
    qsort(s->v, (size_t)s->n, sizeof *s->v, cmp_d);
    int i = (int)(p * (s->n - 1) + 0.5);
    return s->v[i];
}

typedef struct legit {
    const opts *o;
    server *srv;
    sp_runtime *rt;
    int32_t ids[64];
    int n;
    char ref[1024];
    double last;
    sample connects, steps;
    int failures;
    int time_refusals; /* connects: refused attempts are timed too */
    atomic_int stop;
} legit;

static int on_token(int row, int token, const char *text, void *user)
{
    (void)row, (void)token, (void)text;
    legit *l = user;
    double t = sp_now_s();
    add(&l->steps, t - l->last);
    l->last = t;
    return 0;
}

/* One generation on the kept connection: 0 and its text, or -1. */
static int generate(legit *l, char *text, size_t cap)
{
    sp_lm_swarm sw;
    sp_lm lm = sp_lm_swarm_make(&sw, l->rt);
    sp_gen_opts g;
    sp_gen_opts_default(&g);
    g.max_new = 16;
    const int32_t *ps[1] = {l->ids};
    sp_gen_result r;
    sp_err err = {0};
    l->last = sp_now_s();
    if (sp_generate(&lm, sp_runtime_tokenizer(l->rt), ps, &l->n, 1, &g, on_token, l, &r, &err))
        return -1;
    snprintf(text, cap, "%s", r.text[0]);
    sp_gen_result_free(&r);
    return 0;
}

/* A fresh connection: HELLO, the bulk channel, one INFO. */
static int connect_once(legit *l, double *dt)
{
    double t0 = sp_now_s();
    sp_remote *r = NULL;
    sp_reply rep;
    int ok = sp_remote_connect(&r, "127.0.0.1", l->srv->port, 0, 10000, NULL) == SP_OK &&
             sp_remote_call(r, SP_MSG_INFO, NULL, NULL, 0, &rep, 10000, NULL) == SP_OK;
    if (r && ok)
        sp_reply_clear(&rep);
    sp_remote_close(r);
    *dt = sp_now_s() - t0;
    return ok ? 0 : -1;
}

static void *legit_main(void *arg)
{
    legit *l = arg;
    while (!atomic_load(&l->stop)) {
        double dt;
        if (connect_once(l, &dt) == 0) {
            add(&l->connects, dt);
        } else {
            l->failures++;
            if (l->time_refusals)
                add(&l->connects, dt);
        }
        char text[1024];
        if (generate(l, text, sizeof text) || strcmp(text, l->ref))
            l->failures++;
        struct timespec ts = {0, 20 * 1000000L}; /* a client's pace, not a load generator's */
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* ---------------------------------------------------------------------------------------------- */
/* phases */

typedef struct phase {
    const char *name;
    int attack; /* 0: none */
    sp_atk_opts ao;
    int attack2; /* a second attack at once (on the bulk port if its kind is BULK) */
    sp_atk_opts ao2;
    int fds;     /* against the server whose descriptors run out */
    double c50, c99, s50, s99;
    int connects, steps, failures;
    double rss_peak_mib, rss_after_mib;
} phase;

static void run_phase(const opts *o, server *srv, legit *l, phase *ph)
{
    l->connects.n = l->steps.n = 0;
    l->failures = 0;
    atomic_store(&l->stop, 0);
    sp_atk *a = NULL, *a2 = NULL;
    if (ph->attack) {
        ph->ao.src = ph->ao2.src = "127.0.0.2";
        ph->ao.port = ph->ao.kind == SP_ATK_BULK ? srv->bulk_port : srv->port;
        ph->ao2.port = ph->ao2.kind == SP_ATK_BULK ? srv->bulk_port : srv->port;
        if (sp_atk_start(&a, &ph->ao))
            return;
        double t0 = sp_now_s(); /* let it take hold */
        while (ph->attack2 && sp_now_s() - t0 < 1.5)
            usleep(20000);
        if (ph->attack2 && sp_atk_start(&a2, &ph->ao2)) {
            sp_atk_stop(a);
            return;
        }
        t0 = sp_now_s();
        while (sp_now_s() - t0 < 1.5)
            usleep(20000);
    }
    long peak = rss_kb(srv->pid);
    pthread_t th;
    pthread_create(&th, NULL, legit_main, l);
    double end = sp_now_s() + o->seconds;
    while (sp_now_s() < end) {
        long kb = rss_kb(srv->pid);
        peak = kb > peak ? kb : peak;
        usleep(20000);
    }
    atomic_store(&l->stop, 1);
    pthread_join(th, NULL);
    if (a && ph->ao.kind == SP_ATK_FLOOD)
        sp_atk_drain(a, 30);
    sp_atk_stop(a2);
    sp_atk_stop(a);
    ph->connects = l->connects.n;
    ph->steps = l->steps.n;
    ph->failures = l->failures;
    ph->c50 = pct(&l->connects, 0.5) * 1e3;
    ph->c99 = pct(&l->connects, 0.99) * 1e3;
    ph->s50 = pct(&l->steps, 0.5) * 1e3;
    ph->s99 = pct(&l->steps, 0.99) * 1e3;
    ph->rss_peak_mib = peak / 1024.0;
    /* the server settles before the next phase: the attacker's connections go */
    for (int i = 0; i < 300 && nfds(srv->pid) > 16; i++)
        usleep(20000);
    usleep(500000);
    ph->rss_after_mib = rss_kb(srv->pid) / 1024.0;
}

/* "1.23ms", or "-" when there was no sample (the client never got through). */
static void ms(char *b, double v)
{
    if (v < 0)
        snprintf(b, 16, "-");
    else
        snprintf(b, 16, "%.2fms", v);
}

static void ratio(char *b, double v, double base)
{
    if (v < 0 || base <= 0)
        snprintf(b, 16, "-");
    else
        snprintf(b, 16, "%.2fx", v / base);
}

/* The "fds" phase: a server of its own (open-file limit 128, caps above it), a kept connection to it opened
 * before the attack, new connections timed whether refused or not. */
static int run_fds_phase(const opts *o, const legit *base, phase *ph)
{
    server srv2;
    if (start_server(o, &srv2, 128))
        return -1;
    legit l2 = *base;
    l2.srv = &srv2;
    l2.rt = NULL;
    l2.time_refusals = 1;
    sp_err err = {0};
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", srv2.port);
    int bad = sp_runtime_new(&l2.rt, NULL, NULL, &err) || sp_runtime_load(l2.rt, o->model, &err) ||
              sp_runtime_connect(l2.rt, addr, &err);
    if (bad)
        fprintf(stderr, "bench: the fds phase's server: %s\n", err.msg);
    else
        run_phase(o, &srv2, &l2, ph);
    sp_runtime_free(l2.rt);
    kill(srv2.pid, SIGTERM);
    waitpid(srv2.pid, NULL, 0);
    return bad ? -1 : 0;
}

static int parse(int argc, char **argv, opts *o)
{
    const char *home = getenv("HOME");
    static char def[PATH_MAX];
    snprintf(def, sizeof def, "%s/.cache/sepal/models/stories15M", home ? home : ".");
    *o = (opts){.model = def, .seconds = 10};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            o->seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            o->only = argv[++i];
        else if (!strcmp(argv[i], "--defaults"))
            o->defaults = 1;
        else if (argv[i][0] != '-')
            o->model = argv[i];
        else
            return fprintf(stderr, "usage: bench_attack [MODEL_DIR] [--seconds S] [--only NAME] [--defaults]\n"), -1;
    }
    return o->seconds > 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    opts o;
    if (parse(argc, argv, &o))
        return 2;
    sp_memtune();
    signal(SIGPIPE, SIG_IGN);
    server srv;
    if (start_server(&o, &srv, 0))
        return 1;
    legit l = {.o = &o, .srv = &srv};
    l.connects.v = malloc(MAXS * sizeof(double));
    l.steps.v = malloc(MAXS * sizeof(double));
    sp_err err = {0};
    int *raw = NULL;
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", srv.port);
    if (sp_runtime_new(&l.rt, NULL, NULL, &err) || sp_runtime_load(l.rt, o.model, &err) ||
        sp_runtime_connect(l.rt, addr, &err) ||
        sp_tokenizer_encode(sp_runtime_tokenizer(l.rt), "Once upon a time", 1, &raw, &l.n, &err))
        return fprintf(stderr, "bench: %s\n", err.msg), 1;
    for (int i = 0; i < l.n && i < 64; i++)
        l.ids[i] = raw[i];
    free(raw);
    if (generate(&l, l.ref, sizeof l.ref))
        return fprintf(stderr, "bench: the reference generation failed\n"), 1;
    /* message sizes: what a connection may hold is 8 MiB with the small budget, 64 MiB (stories15M) by default */
    uint64_t share = o.defaults ? 64ull << 20 : 8ull << 20;
    phase ph[] = {
        {.name = "none"},
        {.name = "huge", 1, {.kind = SP_ATK_HUGE, .conns = 6, .msg_bytes = 200ull << 20, .send_bytes = 8ull << 20,
                             .reconnect = 1}},
        {.name = "budget", 1, {.kind = SP_ATK_BUDGET, .conns = 8, .msg_bytes = share - (512 << 10),
                               .send_bytes = share - (1 << 20), .reconnect = 1}},
        {.name = "flood", 1, {.kind = SP_ATK_FLOOD, .conns = 1, .max_requests = 200000}}, /* drained in the time */
        {.name = "slowloris", 1, {.kind = SP_ATK_SLOWLORIS, .conns = 200, .reconnect = 1}},
        {.name = "idle", 1, {.kind = SP_ATK_IDLE, .conns = 2000}},
        {.name = "bulk", 1, {.kind = SP_ATK_BULK, .conns = 200, .reconnect = 1}},
        {.name = "fds", 1, {.kind = SP_ATK_IDLE, .conns = 300}, 1, {.kind = SP_ATK_BULK, .conns = 50, .reconnect = 1},
         .fds = 1},
    };
    int nph = (int)(sizeof ph / sizeof *ph);
    printf("bench_attack: %s, blocks 0:, %s limits, %.0f s per phase; legitimate client on 127.0.0.1, attacker on "
           "127.0.0.2\n", o.model, o.defaults ? "default" : "small-budget", o.seconds);
    printf("%-10s %8s %9s %9s %8s %8s %8s %6s %9s %9s %8s %8s\n", "attack", "connects", "conn p50", "conn p99",
           "steps", "step p50", "step p99", "fails", "RSS peak", "RSS after", "conn x", "step x");
    for (int i = 0; i < nph; i++) {
        if (o.only && i && strcmp(o.only, ph[i].name))
            continue;
        if (ph[i].fds) {
            if (run_fds_phase(&o, &l, &ph[i]))
                continue;
        } else {
            run_phase(&o, &srv, &l, &ph[i]);
        }
        char c50[16], c99[16], s50[16], s99[16], cx[16], sx[16];
        ms(c50, ph[i].c50), ms(c99, ph[i].c99), ms(s50, ph[i].s50), ms(s99, ph[i].s99);
        ratio(cx, ph[i].c99, ph[0].c99), ratio(sx, ph[i].s99, ph[0].s99);
        printf("%-10s %8d %9s %9s %8d %8s %8s %6d %6.1fMiB %6.1fMiB %8s %8s\n", ph[i].name, ph[i].connects, c50, c99,
               ph[i].steps, s50, s99, ph[i].failures, ph[i].rss_peak_mib, ph[i].rss_after_mib, cx, sx);
        fflush(stdout);
    }
    printf("(p99 ratios against the no-attack phase of this run; RSS peak of the server process; \"fds\": a server "
           "of its own whose descriptors run out, its new connections refused at once (the failures), timed too)\n");
    sp_runtime_free(l.rt);
    kill(srv.pid, SIGTERM);
    waitpid(srv.pid, NULL, 0);
    free(l.connects.v);
    free(l.steps.v);
    return 0;
}
