/* dht_flood.c - a server under a sustained flood of malformed DHT datagrams (issue 22): does it stay in the swarm,
 * and do its sessions notice?
 *
 * `swarm up 2 --blocks-per-server 6`: two sepal-server processes each hold all 6 blocks (A starts the swarm, B
 * joins through A; both announce every 30 s, their default), and the client is in the swarm through A. Generation
 * through A (16 greedy tokens, again and again) gives the baseline: ms per token before the flood. Then R datagrams a second for S seconds go to A's DHT port: the datagram that crashes
 * OpenDHT 2.4.12 (reliability-anchors.md §4.4) and {"a": 5, ...} in turn. Every second: is A in the client's view,
 * how old is its record, did its DHT node restart; meanwhile the generation through A goes on (ms per token, and
 * any failure or text other than the baseline's). After the flood a new client joins through A's DHT node and
 * must find both servers. Then the same again with SEPAL_DHT_NO_FRONT=1 (the node without its UDP front, as
 * before issue 22) for the baseline seconds: the figures of both runs side by side, and the ratios.
 *
 * usage: bench_dht_flood [MODEL_DIR] [--seconds S] [--rate R] [--baseline-seconds B]
 * Defaults: 300 s at 100/s, baseline 150 s. SEPAL_SERVER_BIN names the server. Exit 1 unless, with the front, A
 * never left the view, its node never restarted, no generation failed, and the new client found both. */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../tests/attack.h"
#include "generate.h"
#include "memtune.h"
#include "runtime.h"
#include "timeutil.h"

#define MAX_GENS 100000
#define TOKENS 16

typedef struct opts {
    const char *model;
    double seconds, baseline_s;
    int rate;
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
    long sent;
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
/* the swarm */

/* swarm up 2 with every block on each server; A: the server the client joined through (its entry index). */
static sp_runtime *swarm(const opts *o, int front, int *a)
{
    sp_runtime *rt = NULL;
    sp_err err = {0};
    if (front)
        unsetenv("SEPAL_DHT_NO_FRONT");
    else
        setenv("SEPAL_DHT_NO_FRONT", "1", 1); /* the servers' DHT nodes inherit it */
    if (sp_runtime_new(&rt, NULL, NULL, &err) || sp_runtime_load(rt, o->model, &err) ||
        sp_runtime_swarm_up(rt, 2, 6, &err)) {
        fprintf(stderr, "bench: %s\n", err.msg);
        sp_runtime_free(rt);
        return NULL;
    }
    *a = -1;
    sp_server_row *rows = NULL;
    int n = sp_runtime_servers(rt, &rows);
    for (int i = 0; i < n; i++)
        if (rows[i].pid > 0 && !strcmp(rows[i].rec.dht, sp_runtime_initial_peers(rt)))
            *a = i;
    free(rows);
    return rt;
}

/* ---------------------------------------------------------------------------------------------- */
/* the client, the flood */

/* A new client that joins through the DHT node at peers. */
static sp_runtime *client(const opts *o, const char *peers)
{
    sp_runtime *rt = NULL;
    sp_err err = {0};
    if (sp_runtime_new(&rt, NULL, NULL, &err) == SP_OK) {
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
    sp_server_row *rows = NULL;
    int n = sp_runtime_servers(rt, &rows);
    for (int i = 0; i < n; i++) {
        const sp_server_row *e = &rows[i];
        if (e->from_dht && !e->gone && e->rec.port == port && e->rec.state == SP_SERVER_ONLINE)
            age = sp_wall_s() - e->rec.timestamp;
    }
    free(rows);
    return age;
}

static int online(sp_runtime *rt)
{
    int n = 0;
    sp_server_row *rows = NULL;
    int m = sp_runtime_servers(rt, &rows);
    for (int i = 0; i < m; i++)
        n += rows[i].from_dht && !rows[i].gone && rows[i].rec.state == SP_SERVER_ONLINE;
    free(rows);
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
    long sent;
} flood;

static void *flooding(void *u)
{
    flood *f = u;
    f->sent = sp_atk_dht_flood(f->port, f->rate, f->seconds);
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
    memset(r, 0, sizeof *r);
    r->front = front;
    int a = -1;
    sp_runtime *rt = swarm(o, front, &a);
    if (!rt || a < 0) {
        fprintf(stderr, "bench: the swarm did not come up\n");
        sp_runtime_free(rt);
        return -1;
    }
    sp_server_row *rows = NULL;
    int nrows = sp_runtime_servers(rt, &rows);
    sp_server_record ra = a < nrows ? rows[a].rec : (sp_server_record){0};
    char log[sizeof rows->log], peers[sizeof ra.dht];
    snprintf(log, sizeof log, "%s", a < nrows ? rows[a].log : "");
    free(rows);
    snprintf(peers, sizeof peers, "%s", ra.dht);
    sp_rt_settings set;
    sp_runtime_settings(rt, &set);
    snprintf(set.allowed, sizeof set.allowed, "%s:%d", ra.host, ra.port); /* generate through A */
    sp_runtime_set_settings(rt, &set);
    int32_t want[TOKENS], got[TOKENS];
    int rc = generate(rt, want) < 0 ? -1 : 0;
    for (double end = sp_now_s() + 10; !rc && sp_now_s() < end && r->nbase < MAX_GENS / 2;) /* the baseline */
        r->base_ms[r->nbase++] = generate(rt, got);
    if (rc) {
        fprintf(stderr, "bench: no generation through A\n");
        goto out;
    }
    const char *colon = strrchr(peers, ':');
    flood f = {.port = colon ? atoi(colon + 1) : 0, .rate = o->rate, .seconds = seconds};
    sampler smp = {.rt = rt, .port = ra.port, .r = r};
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
    r->restarts = sp_atk_count_lines(log, "DHT node died");
    sp_runtime *late = client(o, peers);
    if (late && !wait_online(late, 2, 15))
        r->found_after = 2;
    else if (late)
        r->found_after = online(late);
    sp_runtime_free(late);
out:
    sp_runtime_swarm_down(rt);
    sp_runtime_free(rt);
    return rc;
}

static void print_run(const run *r, double seconds, int rate)
{
    double b50 = pct((double *)r->base_ms, r->nbase, 0.5), b99 = pct((double *)r->base_ms, r->nbase, 0.99);
    double f50 = pct((double *)r->flood_ms, r->nflood, 0.5), f99 = pct((double *)r->flood_ms, r->nflood, 0.99);
    double fmax_ms = pct((double *)r->flood_ms, r->nflood, 1.0);
    printf("%-9s %6.0f s x %3d/s (%6ld sent): A in the view %5.1f%% of %d samples (record at most %5.1f s old), "
           "DHT node restarts %d\n", r->front ? "front" : "no front", seconds, rate, r->sent,
           r->samples ? 100.0 * r->visible / r->samples : 0, r->samples, r->oldest, r->restarts);
    printf("%-9s ms/token through A: before p50 %.2f p99 %.2f (%d runs), during p50 %.2f p99 %.2f max %.1f (%d "
           "runs), p99 ratio %.2f; %d failed or differed; after: a new client found %d of 2 servers through A's node\n",
           "", b50, b99, r->nbase, f50, f99, fmax_ms, r->nflood, f99 / b99, r->failures, r->found_after);
}

int main(int argc, char **argv)
{
    sp_memtune();
    signal(SIGPIPE, SIG_IGN);
    opts o = {.seconds = 300, .baseline_s = 150, .rate = 100};
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
        else if (argv[i][0] != '-')
            o.model = argv[i];
        else {
            fprintf(stderr, "usage: bench_dht_flood [MODEL_DIR] [--seconds S] [--rate R] [--baseline-seconds B]\n");
            return 2;
        }
    }
    if (o.seconds <= 0 || o.rate <= 0) {
        fprintf(stderr, "bench: --seconds and --rate must be positive\n");
        return 2;
    }
    static run with, without;
    printf("dht_flood: %s, servers announcing every 30 s; the flood: the crash datagram and {\"a\": 5} in turn\n",
           o.model);
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
