/* dht_flood.c - a server under a sustained flood of malformed DHT datagrams (issue 22): does it stay in the swarm,
 * and do its sessions notice?
 *
 * Two sepal-server processes hold all 6 blocks (A starts the swarm, B joins through A; --update-period P) and a
 * client joins through B. Generation through A (16 greedy tokens, again and again) gives the baseline: ms per
 * token before the flood. Then R datagrams a second for S seconds go to A's DHT port: the datagram that crashes
 * OpenDHT 2.4.12 (reliability-anchors.md §4.4) and {"a": 5, ...} in turn. Every second: is A in the client's view,
 * how old is its record, did its DHT node restart; meanwhile the generation through A goes on (ms per token, and
 * any failure or text other than the baseline's). After the flood a new client joins through A's DHT node and
 * must find both servers. Then the same again with SEPAL_DHT_NO_FRONT=1 (the node without its UDP front, as
 * before issue 22) for the baseline seconds: the figures of both runs side by side, and the ratios.
 *
 * usage: bench_dht_flood [MODEL_DIR] [--seconds S] [--rate R] [--period P] [--baseline-seconds B]
 * Defaults: 300 s at 100/s, period 30 s (sepal-server's default), baseline 150 s. SEPAL_SERVER_BIN names the
 * server; the servers' logs go to $TMPDIR (kept with SEPAL_BENCH_KEEP_LOGS=1). Exit 1 unless, with the front,
 * A never left the view, its node never restarted, no generation failed, and the new client found both. */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dht.h"
#include "generate.h"
#include "memtune.h"
#include "runtime.h"
#include "timeutil.h"

#define MAX_GENS 100000
#define TOKENS 16

typedef struct opts {
    const char *model;
    double seconds, baseline_s;
    int rate, period;
} opts;

typedef struct server {
    pid_t pid;
    int port, dht_port;
} server;

/* What one run measured. */
typedef struct run {
    int front;
    double base_ms[MAX_GENS / 2], flood_ms[MAX_GENS / 2];
    int nbase, nflood, failures;
    int samples, visible;      /* seconds sampled, and those A was in the client's view */
    double oldest;             /* the oldest A's record got, seconds */
    int restarts;              /* A's DHT node restarts (its log's "DHT node died" lines) */
    int sent;
    long rss_kib[2];           /* A's server and DHT node at the end */
    int found_after;           /* servers a new client found through A's node after the flood */
} run;

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p)
{
    if (n <= 0)
        return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    int i = (int)ceil(p * n) - 1;
    return v[i < 0 ? 0 : i];
}

/* ---------------------------------------------------------------------------------------------- */
/* processes */

static void server_bin(char *out, size_t cap)
{
    const char *env = getenv("SEPAL_SERVER_BIN");
    if (env) {
        snprintf(out, cap, "%s", env);
        return;
    }
    char self[PATH_MAX - 32];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    self[n > 0 ? n : 0] = '\0';
    for (int i = 0; i < 2; i++) { /* build/bench/bench_dht_flood -> build */
        char *slash = strrchr(self, '/');
        if (slash)
            *slash = '\0';
    }
    snprintf(out, cap, "%s/server/sepal-server", self);
}

/* Starts sepal-server (peer_dht 0: a new swarm; its stderr to log) and reads its serving line for the ports. */
static int start_server(const opts *o, int peer_dht, int front, const char *log, server *s)
{
    char bin[PATH_MAX], period[16], peers[64];
    server_bin(bin, sizeof bin);
    snprintf(period, sizeof period, "%d", o->period);
    snprintf(peers, sizeof peers, "127.0.0.1:%d", peer_dht);
    int pfd[2];
    if (pipe(pfd))
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(pfd[1], 1);
        close(pfd[0]);
        close(pfd[1]);
        if (!freopen(log, "w", stderr))
            _exit(126);
        if (!front)
            setenv("SEPAL_DHT_NO_FRONT", "1", 1);
        execl(bin, "sepal-server", "--model", o->model, "--blocks", "0:6", "--no-measure", "--update-period", period,
              peer_dht ? "--initial-peers" : "--new-swarm", peer_dht ? peers : NULL, (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    char line[1024];
    size_t n = 0;
    double t0 = sp_now_s();
    while (n < sizeof line - 1 && sp_now_s() - t0 < 60) {
        struct pollfd p = {.fd = pfd[0], .events = POLLIN};
        if (poll(&p, 1, 200) <= 0)
            continue;
        if (read(pfd[0], line + n, 1) <= 0)
            break;
        if (line[n++] == '\n')
            break;
    }
    close(pfd[0]);
    line[n] = '\0';
    const char *ws = strstr(line, "ws://"), *dht = strstr(line, "DHT ");
    const char *c1 = ws ? strchr(ws + 5, ':') : NULL, *c2 = dht ? strchr(dht + 4, ':') : NULL;
    *s = (server){.pid = pid, .port = c1 ? atoi(c1 + 1) : -1, .dht_port = c2 ? atoi(c2 + 1) : -1};
    if (s->port > 0 && s->dht_port > 0)
        return 0;
    fprintf(stderr, "bench: %s did not start (%s)\n", bin, line);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

static void stop_server(server *s)
{
    if (s->pid > 0) {
        kill(s->pid, SIGKILL);
        waitpid(s->pid, NULL, 0);
    }
    s->pid = 0;
}

/* The DHT node of a server: its child named sepal-dht. */
static pid_t dht_child(pid_t parent)
{
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)parent, (int)parent);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    for (char *save = NULL, *t = strtok_r(buf, " \n", &save); t; t = strtok_r(NULL, " \n", &save)) {
        char comm[64] = "";
        snprintf(path, sizeof path, "/proc/%s/comm", t);
        FILE *c = fopen(path, "r");
        if (c && fgets(comm, sizeof comm, c) && !strncmp(comm, "sepal-dht", 9)) {
            fclose(c);
            return (pid_t)atoi(t);
        }
        if (c)
            fclose(c);
    }
    return -1;
}

/* Lines of a log holding text. */
static int count_lines(const char *log, const char *text)
{
    FILE *f = fopen(log, "r");
    char line[1024];
    int n = 0;
    while (f && fgets(line, sizeof line, f))
        n += strstr(line, text) != NULL;
    if (f)
        fclose(f);
    return n;
}

static long rss_kib(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6))
            kib = atol(line + 6);
    if (f)
        fclose(f);
    return kib;
}

/* ---------------------------------------------------------------------------------------------- */
/* the client, the flood */

static sp_runtime *client(const opts *o, int dht_port)
{
    sp_runtime *rt = NULL;
    sp_err err = {0};
    char peers[64];
    snprintf(peers, sizeof peers, "127.0.0.1:%d", dht_port);
    if (sp_runtime_new(&rt, NULL, NULL, &err) == SP_OK) {
        rt->set.update_period_s = o->period; /* as often as the servers announce */
        if (sp_runtime_load(rt, o->model, &err) == SP_OK && sp_runtime_join(rt, peers, &err) == SP_OK)
            return rt;
    }
    fprintf(stderr, "bench: client: %s\n", err.msg);
    sp_runtime_free(rt);
    return NULL;
}

/* The server at port in the client's view, ONLINE: its record's age in seconds, or -1. */
static double record_age(sp_runtime *rt, int port)
{
    double age = -1;
    pthread_mutex_lock(&rt->lock);
    for (int i = 0; i < rt->nservers; i++) {
        const sp_server_entry *e = rt->servers[i];
        if (e->from_dht && !e->gone && e->rec.port == port && e->rec.state == SP_SERVER_ONLINE)
            age = sp_wall_s() - e->rec.timestamp;
    }
    pthread_mutex_unlock(&rt->lock);
    return age;
}

static int online(sp_runtime *rt)
{
    int n = 0;
    pthread_mutex_lock(&rt->lock);
    for (int i = 0; i < rt->nservers; i++)
        n += rt->servers[i]->from_dht && !rt->servers[i]->gone && rt->servers[i]->rec.state == SP_SERVER_ONLINE;
    pthread_mutex_unlock(&rt->lock);
    return n;
}

/* 16 greedy tokens through the swarm: ms per token, or -1 on failure; ids into out (TOKENS). */
static double generate(sp_runtime *rt, int32_t *out)
{
    static const int32_t prompt[] = {1, 9038, 2501, 263, 931}; /* <s> Once upon a time */
    const int32_t *pp = prompt;
    int len = 5;
    sp_gen_opts g;
    sp_gen_opts_default(&g);
    g.max_new = TOKENS;
    g.stop_at_eos = 0;
    sp_lm_swarm s;
    sp_lm lm = sp_lm_swarm_make(&s, rt);
    sp_gen_result r;
    sp_err err = {0};
    double t0 = sp_now_s();
    if (sp_generate(&lm, NULL, &pp, &len, 1, &g, NULL, NULL, &r, &err))
        return -1;
    double ms = (sp_now_s() - t0) * 1000.0 / TOKENS;
    int ok = r.n[0] == TOKENS;
    if (ok)
        memcpy(out, r.ids[0], TOKENS * sizeof *out);
    sp_gen_result_free(&r);
    return ok ? ms : -1;
}

typedef struct flood {
    int port, rate;
    double seconds;
    int sent;
} flood;

static void *flooding(void *u)
{
    flood *f = u;
    static const unsigned char crash[] = {0x83, 0xa1, 'e', 0x90, 0xa1, 't', 0xc4, 0x04, 0, 0, 0, 2, 0xa1, 'y', 0xa1, 'e'};
    static const unsigned char not_map[] = {0x84, 0xa1, 'a', 0x05, 0xa1, 'q', 0xa4, 'p', 'i', 'n', 'g',
                                            0xa1, 't', 0x07, 0xa1, 'y', 0xa1, 'q'};
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)f->port)};
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    double t0 = sp_now_s();
    for (long i = 0; i < (long)(f->seconds * f->rate); i++) {
        double wait = t0 + (double)i / f->rate - sp_now_s();
        if (wait > 0)
            sleep_s(wait);
        const unsigned char *d = i % 2 ? not_map : crash;
        size_t n = i % 2 ? sizeof not_map : sizeof crash;
        f->sent += sendto(fd, d, n, 0, (struct sockaddr *)&to, sizeof to) == (ssize_t)n;
    }
    close(fd);
    return NULL;
}

/* Once a second while the flood lasts: is A in the client's view, how old is its record. */
typedef struct sampler {
    sp_runtime *rt;
    int port;
    volatile int stop;
    run *r;
} sampler;

static void *sampling(void *u)
{
    sampler *s = u;
    for (double next = sp_now_s(); !s->stop; next += 1.0) {
        double age = record_age(s->rt, s->port);
        s->r->samples++;
        s->r->visible += age >= 0;
        s->r->oldest = fmax(s->r->oldest, age);
        while (!s->stop && sp_now_s() < next + 1.0)
            sleep_s(0.05);
    }
    return NULL;
}

/* ---------------------------------------------------------------------------------------------- */
/* one run */

static int wait_online(sp_runtime *rt, int n, double timeout_s)
{
    for (double end = sp_now_s() + timeout_s; sp_now_s() < end; sleep_s(0.05))
        if (online(rt) >= n)
            return 0;
    return -1;
}

static int run_once(const opts *o, int front, double seconds, run *r)
{
    server a, b;
    memset(r, 0, sizeof *r);
    r->front = front;
    char log_a[256], log_b[256];
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(log_a, sizeof log_a, "%s/bench-dht-flood-%d-a.log", tmp, (int)getpid());
    snprintf(log_b, sizeof log_b, "%s/bench-dht-flood-%d-b.log", tmp, (int)getpid());
    if (start_server(o, 0, front, log_a, &a))
        return -1;
    if (start_server(o, a.dht_port, front, log_b, &b)) {
        stop_server(&a);
        return -1;
    }
    sp_runtime *rt = client(o, b.dht_port);
    int rc = rt && !wait_online(rt, 2, 60) ? 0 : -1;
    int32_t want[TOKENS], got[TOKENS];
    if (!rc) {
        snprintf(rt->set.allowed, sizeof rt->set.allowed, "127.0.0.1:%d", a.port); /* generate through A */
        rc = generate(rt, want) < 0 ? -1 : 0;
    }
    for (double end = sp_now_s() + 10; !rc && sp_now_s() < end && r->nbase < MAX_GENS / 2;) /* the baseline */
        r->base_ms[r->nbase++] = generate(rt, got);
    if (rc) {
        fprintf(stderr, "bench: the swarm did not come up\n");
        goto out;
    }
    flood f = {.port = a.dht_port, .rate = o->rate, .seconds = seconds};
    sampler smp = {.rt = rt, .port = a.port, .r = r};
    pthread_t th, ts;
    pthread_create(&th, NULL, flooding, &f);
    pthread_create(&ts, NULL, sampling, &smp);
    double t0 = sp_now_s();
    while (sp_now_s() - t0 < seconds) {
        double ms = generate(rt, got);
        if (ms < 0 || memcmp(got, want, sizeof want))
            r->failures++;
        else if (r->nflood < MAX_GENS / 2)
            r->flood_ms[r->nflood++] = ms;
        if (ms < 0)
            sleep_s(0.2);
    }
    pthread_join(th, NULL);
    smp.stop = 1;
    pthread_join(ts, NULL);
    r->sent = f.sent;
    r->restarts = count_lines(log_a, "DHT node died");
    r->rss_kib[0] = rss_kib(a.pid);
    r->rss_kib[1] = rss_kib(dht_child(a.pid));
    sp_runtime *late = client(o, a.dht_port);
    if (late && !wait_online(late, 2, 15))
        r->found_after = 2;
    else if (late)
        r->found_after = online(late);
    sp_runtime_free(late);
out:
    sp_runtime_free(rt);
    stop_server(&b);
    stop_server(&a);
    if (!getenv("SEPAL_BENCH_KEEP_LOGS")) {
        unlink(log_a);
        unlink(log_b);
    }
    return rc;
}

static void print_run(const run *r, double seconds, int rate)
{
    double b50 = pct((double *)r->base_ms, r->nbase, 0.5), b99 = pct((double *)r->base_ms, r->nbase, 0.99);
    double f50 = pct((double *)r->flood_ms, r->nflood, 0.5), f99 = pct((double *)r->flood_ms, r->nflood, 0.99);
    double fmax_ms = pct((double *)r->flood_ms, r->nflood, 1.0);
    printf("%-9s %6.0f s x %3d/s (%6d sent): A in the view %5.1f%% of %d samples (record at most %5.1f s old), "
           "DHT node restarts %d\n", r->front ? "front" : "no front", seconds, rate, r->sent,
           r->samples ? 100.0 * r->visible / r->samples : 0, r->samples, r->oldest, r->restarts);
    printf("%-9s ms/token through A: before p50 %.2f p99 %.2f (%d runs), during p50 %.2f p99 %.2f max %.1f (%d "
           "runs), p99 ratio %.2f; %d failed or differed; after: a new client found %d of 2 servers through A's node; "
           "RSS: server %ld KiB, DHT node %ld KiB\n", "", b50, b99, r->nbase, f50, f99, fmax_ms, r->nflood, f99 / b99,
           r->failures, r->found_after, r->rss_kib[0], r->rss_kib[1]);
}

int main(int argc, char **argv)
{
    sp_memtune();
    signal(SIGPIPE, SIG_IGN);
    opts o = {.seconds = 300, .baseline_s = 150, .rate = 100, .period = 30};
    static char model[PATH_MAX];
    const char *cache = getenv("SEPAL_CACHE"), *home = getenv("HOME");
    if (cache)
        snprintf(model, sizeof model, "%s/models/stories15M", cache);
    else
        snprintf(model, sizeof model, "%s/.cache/sepal/models/stories15M", home ? home : ".");
    o.model = model;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            o.seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--baseline-seconds") && i + 1 < argc)
            o.baseline_s = atof(argv[++i]);
        else if (!strcmp(argv[i], "--rate") && i + 1 < argc)
            o.rate = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--period") && i + 1 < argc)
            o.period = atoi(argv[++i]);
        else if (argv[i][0] != '-')
            o.model = argv[i];
        else {
            fprintf(stderr, "usage: bench_dht_flood [MODEL_DIR] [--seconds S] [--rate R] [--period P] "
                            "[--baseline-seconds B]\n");
            return 2;
        }
    }
    if (o.seconds <= 0 || o.rate <= 0 || o.period <= 0) {
        fprintf(stderr, "bench: --seconds, --rate and --period must be positive\n");
        return 2;
    }
    static run with, without;
    printf("dht_flood: %s, servers announcing every %d s; the flood: the crash datagram and {\"a\": 5} in turn\n",
           o.model, o.period);
    if (run_once(&o, 1, o.seconds, &with))
        return 1;
    print_run(&with, o.seconds, o.rate);
    fflush(stdout);
    if (o.baseline_s > 0) {
        if (run_once(&o, 0, o.baseline_s, &without))
            return 1;
        print_run(&without, o.baseline_s, o.rate);
        printf("ratio: A in the view %.1f%% with the front, %.1f%% without\n",
               with.samples ? 100.0 * with.visible / with.samples : 0,
               without.samples ? 100.0 * without.visible / without.samples : 0);
    }
    return with.visible == with.samples && with.restarts == 0 && with.failures == 0 && with.found_after == 2 ? 0 : 1;
}
