/* failover.c - what a failure costs, and how fast a swarm is found.
 *
 * Stall: a local swarm of 4 servers (two for blocks 0:3, two for 3:6, as `swarm up 4 --blocks-per-server 3`
 * makes it) generates greedily; before token K the server of the hop holding the last block is killed
 * (SIGKILL) or hung (SIGSTOP). The step that meets the failure takes the stall: detection (a closed
 * connection at once, a hung one after the step timeout), ban, re-route, and the replay of the K positions'
 * history on the replacement. Baselines measured in the same run: the median of the other steps, and a
 * prefill of the same K positions through the same swarm (what the replay must redo). Each failure on a
 * fresh swarm, reps times; the texts must equal the run without failure (checked).
 *
 * Discovery: N DHT nodes (sepal-dht children, as every server runs) each announce one synthetic server record
 * for an 8-block span of an 80-block model, all joining through the first; then a client node joins through
 * the first and builds the live view every client keeps. Figures: time until the view holds all N records,
 * records per block key, and each node's resident memory.
 *
 * Restarted addresses: servers A and B hold every block; the request (greedy, beams, a training step) goes
 * through B, which is killed in the middle of it. B's address is fresh, or had four earlier lives (started,
 * announced, killed: their records still fresh in the DHT, as a server restarted on its port leaves them); the
 * stall of the step that meets the failure, restarted / fresh, in the same run (goal: <= 2).
 *
 * usage: bench_failover [MODEL_DIR] [--reps N] [--at K] [--nodes 5,50,100] [--skip-stall] [--skip-address]
 *                       [--skip-discovery] */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dht.h"
#include "generate.h"
#include "memtune.h"
#include "record.h"
#include "rng.h"
#include "../tests/serverproc.h"
#include "runtime.h"
#include "timeutil.h"
#include "view.h"

#define MAX_STEPS 256

typedef struct opts {
    const char *model;
    int reps, at, skip_stall, skip_discovery, skip_address;
    int nodes[8], nnodes;
} opts;

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    if (n <= 0)
        return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* ---------------------------------------------------------------------------------------------- */
/* stall */

typedef struct hit {
    sp_lm inner;
    sp_lm_swarm *sw;
    sp_runtime *rt;
    int at, sig, calls, block;
    pid_t victim;
    pid_t target;  /* > 0: the process to hit (else the server of h->block in the route, started by swarm up) */
    double step[MAX_STEPS];
    int nsteps;
    double stall;
    double exit_s; /* SIGTERM: seconds from the signal until the server has exited */
} hit;

/* Whether pid has exited (a zombie not yet reaped by the runtime, or gone). */
static int exited(pid_t pid)
{
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

static pid_t pid_of_block(sp_runtime *rt, const sp_route *r, int block)
{
    pid_t pid = -1;
    sp_server_row *rows = NULL;
    int n = sp_runtime_servers(rt, &rows);
    for (int h = 0; h < r->nhops; h++)
        if (r->hop[h].start <= block && block < r->hop[h].end && r->hop[h].server < n)
            pid = rows[r->hop[h].server].pid;
    free(rows);
    return pid;
}

static sp_status h_begin(void *ctx, int B, int max_length, sp_err *err)
{
    hit *h = ctx;
    return h->inner.begin(h->inner.ctx, B, max_length, err);
}

/* Before a forward call: the server in use hit when the call is h->at (1 if so). */
static int h_hit(hit *h)
{
    int now = h->calls++ == h->at && h->sig;
    if (now) {
        h->victim = h->target > 0 ? h->target : pid_of_block(h->rt, &h->sw->route, h->block);
        if (h->victim > 0) {
            double t_sig = sp_now_s();
            kill(h->victim, h->sig);
            if (h->target > 0) /* ours: reaped at once, so that its port is closed as the client goes on */
                waitpid(h->victim, NULL, 0);
            if (h->sig == SIGTERM) { /* its exit, timed before the client goes on (as a user waits for it) */
                while (!exited(h->victim) && sp_now_s() - t_sig < 10)
                    sleep_s(0.0005);
                h->exit_s = sp_now_s() - t_sig;
            }
        }
    }
    return now;
}

static void h_took(hit *h, int now, double dt)
{
    if (now) {
        h->stall = dt;
        if (getenv("SEPAL_BENCH_VERBOSE"))
            fprintf(stderr, "  [%.3f] the step that met the failure took %.3f s\n", sp_now_s(), dt);
    }
    else if (h->calls > 1 && h->nsteps < MAX_STEPS) /* decode steps only */
        h->step[h->nsteps++] = dt;
}

static sp_status h_forward(void *ctx, const int32_t *ids, int B, int T, float *logits, sp_err *err)
{
    hit *h = ctx;
    int now = h_hit(h);
    double t0 = sp_now_s();
    sp_status st = h->inner.forward(h->inner.ctx, ids, B, T, logits, err);
    h_took(h, now, sp_now_s() - t0);
    return st;
}

/* greedy steps (the head's exact argmax) */
static sp_status h_forward_argmax(void *ctx, const int32_t *ids, int B, int T, int32_t *best, sp_err *err)
{
    hit *h = ctx;
    int now = h_hit(h);
    double t0 = sp_now_s();
    sp_status st = h->inner.forward_argmax(h->inner.ctx, ids, B, T, best, err);
    h_took(h, now, sp_now_s() - t0);
    return st;
}

static sp_status h_reorder(void *ctx, const int64_t *src, int B, sp_err *err)
{
    hit *h = ctx;
    return h->inner.reorder(h->inner.ctx, src, B, err);
}

static void h_end(void *ctx)
{
    hit *h = ctx;
    h->inner.end(h->inner.ctx);
}

static const int32_t PROMPT[] = {1, 9038, 2501, 263, 931, 29892, 727, 471}; /* <s> Once upon a time, there was */
#define PROMPT_LEN 8

static int generate_beams(sp_runtime *rt, hit *h, int max_new, int beams, sp_gen_result *out)
{
    sp_gen_opts o;
    sp_gen_opts_default(&o);
    o.max_new = max_new;
    o.stop_at_eos = 0;
    o.beams = beams;
    sp_lm_swarm sw;
    h->rt = rt;
    h->sw = &sw;
    h->inner = sp_lm_swarm_make(&sw, rt);
    sp_lm lm = h->inner;
    lm.ctx = h;
    lm.begin = h_begin;
    lm.forward = h_forward;
    lm.forward_argmax = h_forward_argmax;
    lm.reorder = h_reorder;
    lm.end = h_end;
    const int32_t *pp = PROMPT;
    int len = PROMPT_LEN;
    sp_err err = {0};
    if (sp_generate(&lm, NULL, &pp, &len, 1, &o, NULL, NULL, out, &err))
        return fprintf(stderr, "bench: generate: %s\n", err.msg), -1;
    return 0;
}

static int generate(sp_runtime *rt, hit *h, int max_new, sp_gen_result *out)
{
    return generate_beams(rt, h, max_new, 1, out);
}

/* Time of a prefill of n positions (ids) through the swarm: one forward call of a fresh session. */
static double prefill_time(sp_runtime *rt, const int32_t *ids, int n)
{
    sp_lm_swarm sw;
    sp_lm lm = sp_lm_swarm_make(&sw, rt);
    sp_err err = {0};
    float *logits = malloc((size_t)lm.vocab * sizeof(float));
    double dt = -1;
    if (logits && !lm.begin(lm.ctx, 1, n + 1, &err)) {
        double t0 = sp_now_s();
        if (!lm.forward(lm.ctx, ids, 1, n, logits, &err))
            dt = sp_now_s() - t0;
        lm.end(lm.ctx);
    }
    free(logits);
    return dt;
}

static sp_runtime *unblock_rt; /* its blocked-servers setting is cleared at the first retry */

static void on_event(const sp_event *ev, void *user)
{
    (void)user;
    if (getenv("SEPAL_BENCH_VERBOSE") && ev->text)
        fprintf(stderr, "  [%.3f] event: %s\n", sp_now_s(), ev->text);
    if (ev->kind == SP_EV_RETRY && unblock_rt) {
        sp_rt_settings set;
        sp_runtime_settings(unblock_rt, &set);
        set.blocked[0] = '\0';
        sp_runtime_set_settings(unblock_rt, &set);
        unblock_rt = NULL;
    }
}

/* Servers of the swarm holding block b. */
static int holders(sp_runtime *rt, int b)
{
    int n = 0;
    sp_server_row *rows = NULL;
    int m = sp_runtime_servers(rt, &rows);
    for (int i = 0; i < m; i++) {
        const sp_server_row *e = &rows[i];
        n += !e->gone && e->rec.state == SP_SERVER_ONLINE && e->rec.start <= b && b < e->rec.end;
    }
    free(rows);
    return n;
}

/* Four servers that choose their blocks: two for 0:3, two for 3:6 as a rule, but the choice follows measured
 * throughputs, and on a busy machine three may take the same half. Then a failure of the last block's only
 * holder measures the swarm's rebalancing, not a failover: such a swarm is started again. */
static sp_runtime *local_swarm(const char *model)
{
    for (int attempt = 0; attempt < 5; attempt++) {
        sp_runtime *rt = NULL;
        sp_err err = {0};
        if (sp_runtime_new(&rt, on_event, NULL, &err) || sp_runtime_load(rt, model, &err) ||
            sp_runtime_swarm_up(rt, 4, 3, &err)) {
            fprintf(stderr, "bench: %s\n", err.msg);
            sp_runtime_free(rt);
            return NULL;
        }
        if (holders(rt, 0) >= 2 && holders(rt, 5) >= 2)
            return rt;
        fprintf(stderr, "bench: the servers chose an uneven split (block 0: %d, block 5: %d servers); again\n",
                holders(rt, 0), holders(rt, 5));
        sp_runtime_swarm_down(rt);
        sp_runtime_free(rt);
    }
    fprintf(stderr, "bench: no even split of the blocks in 5 tries\n");
    return NULL;
}

/* One failure of kind sig on a fresh swarm: its stall, the median step, and the prefill of the same length. */
static int stall_once(const opts *o, int sig, const sp_gen_result *want, double *stall, double *step, double *prefill,
                      double *exit_s)
{
    sp_runtime *rt = local_swarm(o->model);
    if (!rt)
        return -1;
    hit h = {.at = o->at, .sig = sig, .block = 5};
    sp_gen_result got;
    int rc = generate(rt, &h, want->n[0], &got);
    if (!rc) {
        if (got.n[0] != want->n[0] || memcmp(got.ids[0], want->ids[0], (size_t)want->n[0] * sizeof(int32_t))) {
            fprintf(stderr, "bench: the text after the failure differs from the one without\n");
            rc = -1;
        }
        sp_gen_result_free(&got);
    }
    if (h.victim > 0 && sig == SIGSTOP)
        kill(h.victim, SIGCONT);
    *stall = h.stall;
    *exit_s = h.exit_s;
    *step = median(h.step, h.nsteps);
    /* the replay: the prompt and the first `at` new tokens (the step that meets the failure feeds the last) */
    int32_t ids[PROMPT_LEN + 256];
    memcpy(ids, PROMPT, sizeof PROMPT);
    memcpy(ids + PROMPT_LEN, want->ids[0], (size_t)o->at * sizeof(int32_t));
    *prefill = prefill_time(rt, ids, PROMPT_LEN + o->at);
    sp_runtime_swarm_down(rt);
    sp_runtime_free(rt);
    return rc;
}

static int bench_stall(const opts *o)
{
    /* the text without failure, on a swarm of its own */
    sp_runtime *rt = local_swarm(o->model);
    if (!rt)
        return 1;
    hit h0 = {.at = -1};
    sp_gen_result want;
    int max_new = o->at + 24;
    if (generate(rt, &h0, max_new, &want))
        return 1;
    sp_runtime_swarm_down(rt);
    sp_runtime_free(rt);
    printf("stall: stories15M, 4 servers (blocks 0:3 twice, 3:6 twice), greedy, the server of blocks 3:6 in use "
           "hit before token %d\n", o->at);
    static const int sigs[3] = {SIGKILL, SIGSTOP, SIGTERM};
    static const char *const names[3] = {"killed (SIGKILL)", "hung (SIGSTOP)", "stopped (SIGTERM)"};
    for (int k = 0; k < 3; k++) {
        double st[16], sp[16], pf[16], ex[16];
        int n = 0;
        for (int r = 0; r < o->reps && r < 16; r++) {
            if (stall_once(o, sigs[k], &want, &st[n], &sp[n], &pf[n], &ex[n]))
                return 1;
            n++;
        }
        if (sigs[k] == SIGTERM) {
            double mex = median(ex, n);
            qsort(ex, (size_t)n, sizeof *ex, cmp_d);
            printf("  %-17s the server in use exited %.3f s after SIGTERM (min %.3f, max %.3f over %d; goal "
                   "<= 0.2 s)\n", names[k], mex, ex[0], ex[n - 1], n);
        }
        double ms = median(st, n), mstep = median(sp, n), mpf = median(pf, n);
        qsort(st, (size_t)n, sizeof *st, cmp_d);
        printf("  %-17s stall %.3f s (min %.3f, max %.3f over %d); a normal step %.4f s; a prefill of the %d "
               "positions through the swarm %.4f s\n", names[k], ms, st[0], st[n - 1], n, mstep, PROMPT_LEN + o->at, mpf);
        printf("  %-17s stall - replay = %.3f s (goal for a kill: <= 2 s); stall / normal step = %.0fx\n", "", ms - mpf,
               mstep > 0 ? ms / mstep : 0);
    }
    printf("  a hung server is given up after the step timeout: 2 s + 20 expected step times by default\n");
    sp_gen_result_free(&want);
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* restarted addresses */

typedef struct proc {
    pid_t pid;
    int port, dht_port;
} proc;

/* sepal-server --blocks 0:L at ws port `port` (0: any), announcing every 30 s, joining peers (NULL: a new swarm);
 * returns once it serves (its serving line read). 0, or -1. */
static int spawn(const char *model, int L, int port, const char *peers, proc *p)
{
    char blocks[32], ports[16], line[1024];
    snprintf(blocks, sizeof blocks, "0:%d", L);
    snprintf(ports, sizeof ports, "%d", port);
    const char *argv[20] = {"sepal-server", "--model", model, "--blocks", blocks, "--no-measure", "--update-period",
                            "30", "--port", ports, "--dht-port", "0", peers ? "--initial-peers" : "--new-swarm",
                            peers, NULL};
    p->pid = sp_serverproc_start(NULL, argv, 0, NULL, line, sizeof line);
    p->port = sp_serverproc_port(line, "ws://");
    p->dht_port = sp_serverproc_port(line, "DHT ");
    if (p->port <= 0 || p->dht_port <= 0)
        return fprintf(stderr, "bench: %s did not start: %s\n", sp_serverproc_bin(), line), -1;
    return 0;
}

static void stop(proc *p)
{
    if (p->pid > 0) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, NULL, 0);
    }
    p->pid = 0;
}

/* Server entries of rt in the view at port (not gone), and all (earlier lives seen). */
static int lives_at(sp_runtime *rt, int port, int *seen)
{
    int n = 0;
    *seen = 0;
    sp_server_row *rows = NULL;
    int m = sp_runtime_servers(rt, &rows);
    for (int i = 0; i < m; i++)
        if (rows[i].rec.port == port) {
            (*seen)++;
            n += !rows[i].gone && rows[i].rec.state == SP_SERVER_ONLINE;
        }
    free(rows);
    return n;
}

/* A client of the swarm through peer that sees ONLINE servers at ports a and b. */
static sp_runtime *joined(const char *model, const char *peer, int a, int b)
{
    sp_runtime *rt = NULL;
    sp_err err = {0};
    if (sp_runtime_new(&rt, on_event, NULL, &err) || sp_runtime_load(rt, model, &err) ||
        sp_runtime_join(rt, peer, &err)) {
        fprintf(stderr, "bench: %s\n", err.msg);
        sp_runtime_free(rt);
        return NULL;
    }
    int seen;
    for (double end = sp_now_s() + 20; sp_now_s() < end; sleep_s(0.01))
        if (lives_at(rt, a, &seen) && lives_at(rt, b, &seen))
            return rt;
    fprintf(stderr, "bench: the client did not find both servers\n");
    sp_runtime_free(rt);
    return NULL;
}

/* Server A (all blocks) and server B (all blocks; its port had `lives` earlier lives: started, seen announced
 * by a watching client, killed), then a client that joined after; B is the route (A blocked until the first
 * retry). */
static sp_runtime *address_swarm(const char *model, int lives, proc *a, proc *b)
{
    sp_config cfg;
    sp_err err = {0};
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", model);
    if (sp_config_load(&cfg, path, &err))
        return fprintf(stderr, "bench: %s\n", err.msg), NULL;
    char peer[64];
    if (spawn(model, cfg.n_layers, 0, NULL, a))
        return NULL;
    snprintf(peer, sizeof peer, "127.0.0.1:%d", a->dht_port);
    int port = 0;
    sp_runtime *watch = lives ? joined(model, peer, a->port, a->port) : NULL;
    for (int k = 0; k <= lives; k++) {
        if (spawn(model, cfg.n_layers, port, peer, b))
            return NULL;
        port = b->port;
        int seen = 0;
        for (double end = sp_now_s() + 20; watch && seen <= k && sp_now_s() < end; sleep_s(0.01))
            lives_at(watch, port, &seen);
        if (k < lives)
            stop(b);
    }
    sp_runtime_free(watch);
    sp_runtime *rt = joined(model, peer, a->port, b->port);
    if (rt) {
        sp_runtime_wait_view(rt, 5000); /* whatever the DHT holds has arrived */
        sp_rt_settings set;
        sp_runtime_settings(rt, &set);
        snprintf(set.blocked, sizeof set.blocked, "127.0.0.1:%d", a->port);
        sp_runtime_set_settings(rt, &set);
        unblock_rt = rt;
    }
    return rt;
}

/* One FORWARD + BACKWARD of a [2, 16] batch along route: seconds, or -1. */
static double train_step(sp_runtime *rt, sp_route *route, const float *x, const float *g0, float *y, float *g,
                         float *bound)
{
    int B = 2, T = 16;
    size_t N = (size_t)B * T * sp_runtime_config(rt)->hidden;
    memcpy(y, x, N * sizeof(float));
    memcpy(g, g0, N * sizeof(float));
    sp_err err = {0};
    double t0 = sp_now_s();
    if (sp_runtime_forward(rt, route, y, B, T, NULL, 0, bound, NULL, &err) ||
        sp_runtime_backward(rt, route, g, B, T, NULL, 0, bound, NULL, NULL, &err))
        return fprintf(stderr, "bench: training step: %s\n", err.msg), -1;
    return sp_now_s() - t0;
}

/* Training through B: the median of 3 steps (*normal_s), then B killed and the step that meets it (*stall: its
 * time, the normal step's work, the failure and the re-run on A). */
static int address_train(sp_runtime *rt, proc *b, double *stall, double *normal_s)
{
    int B = 2, T = 16, L = sp_runtime_config(rt)->n_layers;
    size_t N = (size_t)B * T * sp_runtime_config(rt)->hidden;
    float *x = malloc(N * 4), *g0 = malloc(N * 4), *y = malloc(N * 4), *g = malloc(N * 4);
    float *bound = malloc((size_t)L * N * 4);
    sp_rng r;
    sp_rng_seed(&r, 5);
    sp_rng_fill_normal(&r, x, (long)N, 1.0f);
    sp_rng_fill_normal(&r, g0, (long)N, 1.0f);
    sp_route route;
    sp_err err = {0};
    double normal[3];
    int rc = sp_runtime_route_train(rt, &route, &err) ? -1 : 0;
    for (int k = 0; !rc && k < 3; k++)
        rc = (normal[k] = train_step(rt, &route, x, g0, y, g, bound)) < 0 ? -1 : 0;
    if (!rc) {
        stop(b);
        *stall = train_step(rt, &route, x, g0, y, g, bound);
        rc = *stall < 0 ? -1 : 0;
        *normal_s = median(normal, 3);
    }
    free(x), free(g0), free(y), free(g), free(bound);
    return rc;
}

/* One run of mode (0 greedy, 1 beams, 2 training) through B on a fresh swarm whose B address had `lives` earlier
 * lives; B killed before token o->at (before a training step). */
static int address_once(const opts *o, int mode, int lives, double *stall, double *normal_s)
{
    proc a = {0}, b = {0};
    sp_runtime *rt = address_swarm(o->model, lives, &a, &b);
    int rc = rt ? 0 : -1;
    if (!rc && mode == 2) {
        rc = address_train(rt, &b, stall, normal_s);
    } else if (!rc) {
        hit h = {.at = o->at, .sig = SIGKILL, .target = b.pid};
        sp_gen_result got;
        rc = generate_beams(rt, &h, o->at + 8, mode ? 3 : 1, &got);
        if (!rc)
            sp_gen_result_free(&got);
        b.pid = 0; /* killed and reaped by the hit */
        *stall = h.stall;
        *normal_s = median(h.step, h.nsteps);
    }
    unblock_rt = NULL;
    sp_runtime_free(rt);
    stop(&a);
    stop(&b);
    return rc;
}

static int bench_address(const opts *o)
{
    printf("restarted addresses: server A and server B (each all blocks, records every 30 s); the request goes "
           "through B (A blocked until the first retry) and B is killed (SIGKILL) before token %d (training: before "
           "a FORWARD+BACKWARD of [2, 16]); B's address fresh, or with 4 earlier lives (started, announced, killed) "
           "whose records are still fresh in the DHT; %d runs each, medians\n", o->at, o->reps);
    static const char *const names[3] = {"greedy", "beams (3)", "training"};
    for (int mode = 0; mode < 3; mode++) {
        double st[2][16], nm[32];
        int n = o->reps < 16 ? o->reps : 16;
        for (int r = 0; r < n; r++) /* interleaved: fresh, restarted, fresh, ... */
            for (int lives = 0; lives < 2; lives++)
                if (address_once(o, mode, lives ? 4 : 0, &st[lives][r], &nm[lives * n + r]))
                    return 1;
        double fresh = median(st[0], n), restarted = median(st[1], n), normal = median(nm, 2 * n);
        printf("  %-10s the step that met the kill: fresh address %.3f s (%.3f..%.3f), restarted address %.3f s "
               "(%.3f..%.3f), a normal step %.4f s; restarted / fresh: median %.2f, worst %.2f (goal <= 2)\n",
               names[mode], fresh, st[0][0], st[0][n - 1], restarted, st[1][0], st[1][n - 1], normal,
               fresh > 0 ? restarted / fresh : 0, st[0][n - 1] > 0 ? st[1][n - 1] / st[0][n - 1] : 0);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* discovery */

#define DISC_BLOCKS 80
#define DISC_SPAN 8
#define DISC_MODEL "bench-model"
#define DISC_HASH 0x5e9a15e9a15e9a1ull

typedef struct disc_node {
    sp_dht *d;
} disc_node;

static void fake_record(sp_server_record *r, int i)
{
    memset(r, 0, sizeof *r);
    snprintf(r->id, sizeof r->id, "%016x", 0x1000 + i);
    snprintf(r->name, sizeof r->name, "node%d", i);
    snprintf(r->host, sizeof r->host, "127.0.0.1");
    r->port = 20000 + i;
    snprintf(r->model, sizeof r->model, DISC_MODEL);
    r->config_hash = DISC_HASH;
    r->num_blocks = DISC_BLOCKS;
    r->start = (i * DISC_SPAN) % DISC_BLOCKS;
    r->end = r->start + DISC_SPAN;
    r->state = SP_SERVER_ONLINE;
    r->throughput = 1000 + i;
    r->inference_rps = 100;
    r->forward_rps = 1000;
    r->network_rps = 1000;
    snprintf(r->dtype, sizeof r->dtype, "f32");
    snprintf(r->quant, sizeof r->quant, "none");
    r->cache_tokens_left = 8192;
    snprintf(r->version, sizeof r->version, "bench");
    r->timestamp = sp_wall_s();
    r->period = 60;
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

static int bench_discovery(int n)
{
    disc_node *nodes = calloc((size_t)n, sizeof *nodes);
    sp_err err = {0};
    char peers[64] = "";
    double t0 = sp_now_s();
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        sp_dht_opts o = {.bind = "127.0.0.1", .bootstrap = i ? peers : NULL};
        if (sp_dht_start(&nodes[i].d, &o, &err)) {
            fprintf(stderr, "bench: DHT node %d: %s\n", i, err.msg);
            rc = 1;
            break;
        }
        if (!i)
            snprintf(peers, sizeof peers, "127.0.0.1:%d", sp_dht_port(nodes[0].d));
        sp_server_record r;
        fake_record(&r, i);
        char buf[SP_RECORD_MAX], key[128];
        size_t len;
        if (sp_record_encode(&r, buf, sizeof buf, &len, &err)) {
            fprintf(stderr, "bench: %s\n", err.msg);
            rc = 1;
            break;
        }
        for (int b = r.start; b < r.end; b++) {
            sp_block_key(r.model, b, key, sizeof key);
            sp_dht_put(nodes[i].d, key, r.id, 512, buf, len);
        }
    }
    double started = sp_now_s() - t0;
    int acked = 0;
    for (int i = 0; i < n && !rc; i++)
        acked += sp_dht_flush(nodes[i].d, 20000, &err) == SP_OK;
    double published = sp_now_s() - t0;
    /* the client: a node that announces nothing, and the view */
    sp_view_slot cv;
    sp_view_slot_init(&cv);
    sp_dht *cd = NULL;
    double tc = sp_now_s(), seen_all = -1, seen_half = -1;
    int seen = 0;
    if (!rc) {
        sp_dht_opts o = {.bind = "127.0.0.1", .bootstrap = peers, .on_value = sp_view_slot_on_value,
                         .on_get_done = sp_view_slot_on_get_done, .user = &cv};
        sp_view_opts vo = {.model = DISC_MODEL, .config_hash = DISC_HASH, .num_blocks = DISC_BLOCKS, .refresh_s = 30};
        sp_view *v = NULL;
        if (sp_dht_start(&cd, &o, &err) || sp_view_new(&v, cd, &vo, &err)) {
            fprintf(stderr, "bench: client: %s\n", err.msg);
            rc = 1;
        }
        sp_view_slot_swap(&cv, v);
        while (!rc && sp_now_s() - tc < 60) {
            sp_server_record *all = NULL;
            seen = sp_view_snapshot(v, &all);
            free(all);
            if (seen_half < 0 && seen * 2 >= n)
                seen_half = sp_now_s() - tc;
            if (seen >= n) {
                seen_all = sp_now_s() - tc;
                break;
            }
            sleep_s(0.01);
        }
        /* records per block key, from what the client sees */
        sp_server_record *all = NULL;
        int m = v ? sp_view_snapshot(v, &all) : 0;
        int per[DISC_BLOCKS] = {0}, lo = 1 << 30, hi = 0;
        long sum = 0;
        for (int i = 0; i < m; i++)
            for (int b = all[i].start; b < all[i].end; b++)
                per[b]++;
        for (int b = 0; b < DISC_BLOCKS; b++) {
            lo = per[b] < lo ? per[b] : lo;
            hi = per[b] > hi ? per[b] : hi;
            sum += per[b];
        }
        free(all);
        long rsum = 0, rmax = 0;
        int nr = 0;
        for (int i = 0; i < n; i++) {
            long k = rss_kib(sp_dht_pid(nodes[i].d));
            if (k > 0) {
                nr++;
                rsum += k;
                rmax = k > rmax ? k : rmax;
            }
        }
        printf("  %3d nodes: started in %.2f s, %d/%d publications acknowledged after %.2f s; the client saw "
               "%d/%d records: half after %.2f s, all after %s%.2f s\n",
               n, started, acked, n, published, seen, n, seen_half, seen_all < 0 ? "(not all) " : "",
               seen_all < 0 ? sp_now_s() - tc : seen_all);
        printf("             records per block key %d..%d (mean %.1f); node RSS mean %.1f MiB, max %.1f MiB\n", lo,
               hi, (double)sum / DISC_BLOCKS, nr ? (double)rsum / nr / 1024 : 0, (double)rmax / 1024);
        if (seen_all < 0) {
            rc = 1;
            sp_server_record *got = NULL;
            int g = sp_view_snapshot(v, &got);
            printf("             missing:");
            for (int i = 0; i < n; i++) {
                sp_server_record r;
                fake_record(&r, i);
                int found = 0;
                for (int k = 0; k < g && !found; k++)
                    found = !strcmp(got[k].id, r.id);
                if (!found)
                    printf(" node %d (blocks %d:%d)", i, r.start, r.end);
            }
            printf("\n");
            free(got);
        }
        sp_view_free(sp_view_slot_swap(&cv, NULL));
        sp_dht_stop(cd);
    }
    for (int i = 0; i < n; i++)
        sp_dht_stop(nodes[i].d);
    sp_view_slot_destroy(&cv);
    free(nodes);
    return rc;
}

/* ---------------------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    sp_memtune();
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);
    opts o = {.reps = 3, .at = 32, .nodes = {5, 50, 100}, .nnodes = 3};
    const char *home = getenv("HOME");
    static char def[4096];
    snprintf(def, sizeof def, "%s/.cache/sepal/models/stories15M", home ? home : ".");
    o.model = def;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            o.reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--at") && i + 1 < argc)
            o.at = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--skip-stall"))
            o.skip_stall = 1;
        else if (!strcmp(argv[i], "--skip-discovery"))
            o.skip_discovery = 1;
        else if (!strcmp(argv[i], "--skip-address"))
            o.skip_address = 1;
        else if (!strcmp(argv[i], "--nodes") && i + 1 < argc) {
            o.nnodes = 0;
            for (char *save = NULL, *t = strtok_r(argv[++i], ",", &save); t && o.nnodes < 8;
                 t = strtok_r(NULL, ",", &save))
                o.nodes[o.nnodes++] = atoi(t);
        } else if (argv[i][0] != '-')
            o.model = argv[i];
        else
            return fprintf(stderr, "usage: bench_failover [MODEL_DIR] [--reps N] [--at K] [--nodes 5,50,100] "
                                   "[--skip-stall] [--skip-address] [--skip-discovery]\n"), 2;
    }
    if (o.reps < 1 || o.reps > 16 || o.at < 1 || o.at > 200)
        return fprintf(stderr, "bench_failover: --reps 1..16, --at 1..200\n"), 2;
    int rc = 0;
    if (!o.skip_stall)
        rc |= bench_stall(&o);
    if (!o.skip_address)
        rc |= bench_address(&o);
    if (!o.skip_discovery) {
        printf("discovery: N DHT nodes each announcing an 8-block span of an 80-block model, all joined through "
               "the first; a client joins through the first\n");
        for (int i = 0; i < o.nnodes; i++)
            if (o.nodes[i] > 0 && o.nodes[i] <= 512)
                rc |= bench_discovery(o.nodes[i]);
    }
    return rc;
}
