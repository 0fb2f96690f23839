/* soak.c - a small swarm under steady use for a long time: does anything grow? `sepal swarm up` starts K
 * servers (a real swarm: DHT, announcements, pings); N clients (threads, each with a runtime of its own,
 * connected to the servers by address) generate 32 greedy tokens (checked against the reference text) and, one
 * turn in four at random, run a training step (FORWARD keeping activations, then BACKWARD, through a
 * max-throughput route); turns start 0-20 ms apart at random, so the clients never fall into lockstep. Their first
 * turn, in the warm-up, is a training step all at once (every FORWARD kept before any BACKWARD): a server's pool of
 * kept activations keeps the buffers of the most steps it has held at once, and that most is reached there.
 * Every interval it samples the servers' RSS, descriptors and threads (from /proc), the client process's RSS and
 * descriptors, and the p50/p99 of the decode steps and training steps of that interval, into a CSV; at the end it
 * draws the CSV as an SVG (RSS, descriptors and threads, latencies over time).
 *
 * usage: bench_soak [MODEL_DIR] [--seconds S] [--clients N] [--servers K] [--interval S] [--warmup S]
 *                   [--pace MS] [--csv FILE] [--svg FILE] [--check] [--inject-drift MS]
 * --pace: a pause after each client turn (a lighter load for long runs on a shared machine).
 * --inject-drift: the check's own test: after the warm-up every decode step sleeps MS x (the time since the warm-up
 * over the rest of the run) more, a drift as a leak would make it (--check must fail).
 * --check (CI): after the warm-up, the servers' RSS at the end is within max(2%, 8 MiB) of its level at the start
 * (the median of the first and of the last three samples), their descriptors within 2, and the decode p99 (the
 * median of the per-interval p99s of the second half against the first half) rises by less than 20% at equal
 * machine speed; no errors. The speed is a fixed loop timed at every sample (calib_ms in the CSV, with the load
 * average): on a shared machine other work slows the swarm and the loop alike, and only the swarm's own drift
 * should fail the check; the raw drift is printed too. A drift of 20% or more is then confirmed: twelve samples
 * more, against the first half again; it fails only when it stays (what the swarm's use grows does not shrink by
 * itself, a burst of other work on a shared machine passes: the per-interval p99s of a quiet 2-vCPU machine range
 * 10-22 ms around 14).
 * Exit 1 when a check fails. The servers run with their default limits. */
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "generate.h"
#include "memtune.h"
#include "rng.h"
#include "runtime.h"
#include "timeutil.h"

#define MAXCLIENTS 16
#define MAXROWS 100000

typedef struct opts {
    const char *model, *csv, *svg;
    double seconds, interval, warmup, pace, inject;
    int clients, servers, check;
} opts;

typedef struct lat {
    double *v;
    int n, cap;
} lat;

typedef struct row {
    double t, srv_rss, srv_fds, srv_threads, cli_rss, cli_fds;
    double step50, step99, train50, train99;
    double calib, load; /* the machine's speed now: ms of a fixed loop; the 1-minute load average */
    long tokens, trains, errors;
} row;

typedef struct soak {
    opts o;
    sp_runtime *up;        /* the runtime that started the swarm */
    char addrs[1024];      /* the servers, host:port,... */
    pid_t pids[16];
    int npids;
    char ref[1024];
    pthread_mutex_t mu;    /* the interval's samples */
    lat steps, trains;
    long tokens, ntrains, errors;
    atomic_int stop;
    double t0; /* the run's start */
    pthread_barrier_t together; /* the clients' warm-up training step */
} soak;

static void push(lat *l, double x)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 1024;
        double *v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v)
            return;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = x;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p)
{
    if (!n)
        return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[(int)(p * (n - 1) + 0.5)];
}

/* ---------------------------------------------------------------------------------------------- */
/* /proc */

static double status_field(pid_t pid, const char *name)
{
    char path[64], line[256];
    snprintf(path, sizeof path, pid ? "/proc/%d/status" : "/proc/self/status", (int)pid);
    FILE *f = fopen(path, "r");
    double v = NAN;
    size_t n = strlen(name);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, name, n))
            v = atof(line + n);
    if (f)
        fclose(f);
    return v;
}

static double fds_of(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, pid ? "/proc/%d/fd" : "/proc/self/fd", (int)pid);
    DIR *d = opendir(path);
    int n = 0;
    while (d && readdir(d))
        n++;
    if (d)
        closedir(d);
    return n - 2;
}

/* ---------------------------------------------------------------------------------------------- */
/* the clients */

typedef struct client {
    soak *s;
    int index;
    sp_runtime *rt;
    int32_t ids[64];
    int n;
    double last;
    pthread_t th;
} client;

static int on_token(int row_, int token, const char *text, void *user)
{
    (void)row_, (void)token, (void)text;
    client *c = user;
    double t = sp_now_s(), since = t - c->s->t0 - c->s->o.warmup;
    if (c->s->o.inject > 0 && c->s->t0 > 0 && since > 0) { /* (t0 0: the reference text, before the run) */
        usleep((useconds_t)(c->s->o.inject * 1e3 * since / fmax(c->s->o.seconds - c->s->o.warmup, 1)));
        t = sp_now_s();
    }
    pthread_mutex_lock(&c->s->mu);
    push(&c->s->steps, t - c->last);
    c->s->tokens++;
    pthread_mutex_unlock(&c->s->mu);
    c->last = t;
    return 0;
}

static int generate(client *c, char *text, size_t cap)
{
    sp_lm_swarm sw;
    sp_lm lm = sp_lm_swarm_make(&sw, c->rt);
    sp_gen_opts g;
    sp_gen_opts_default(&g);
    g.max_new = 32;
    g.stop_at_eos = 0;
    const int32_t *ps[1] = {c->ids};
    sp_gen_result r;
    sp_err err = {0};
    c->last = sp_now_s();
    if (sp_generate(&lm, sp_runtime_tokenizer(c->rt), ps, &c->n, 1, &g, on_token, c, &r, &err)) {
        fprintf(stderr, "soak: client %d: %s\n", c->index, err.msg);
        return -1;
    }
    snprintf(text, cap, "%s", r.text[0]);
    sp_gen_result_free(&r);
    return 0;
}

/* FORWARD (keeping the activations) and BACKWARD of a [2, 32, H] batch through a training route; with together,
 * every client's FORWARD before any BACKWARD (the warm-up's step: see client_main). */
static int train_step(client *c, sp_rng *rng, pthread_barrier_t *together)
{
    int B = 2, T = 32, H = sp_runtime_config(c->rt)->hidden;
    size_t N = (size_t)B * T * H;
    float *x = malloc(N * sizeof *x), *g = malloc(N * sizeof *g), *bound = malloc(SP_RT_MAX_HOPS * N * sizeof *bound);
    sp_route route;
    sp_err err = {0};
    double t0 = sp_now_s();
    int ok = x && g && bound;
    if (ok) {
        sp_rng_fill_normal(rng, x, (long)N, 1.0f);
        sp_rng_fill_normal(rng, g, (long)N, 1.0f);
        ok = !sp_runtime_route_train(c->rt, &route, &err) &&
             !sp_runtime_forward(c->rt, &route, x, B, T, NULL, 0, bound, NULL, &err);
    }
    if (together) /* (reached whatever happened: the others wait for it) */
        pthread_barrier_wait(together);
    ok = ok && !sp_runtime_backward(c->rt, &route, g, B, T, NULL, 0, bound, NULL, NULL, &err);
    if (ok) {
        pthread_mutex_lock(&c->s->mu);
        push(&c->s->trains, sp_now_s() - t0);
        c->s->ntrains++;
        pthread_mutex_unlock(&c->s->mu);
    } else {
        fprintf(stderr, "soak: client %d: training: %s\n", c->index, x && g && bound ? err.msg : "out of memory");
    }
    free(x);
    free(g);
    free(bound);
    return ok ? 0 : -1;
}

static void count_error(soak *s)
{
    pthread_mutex_lock(&s->mu);
    s->errors++;
    pthread_mutex_unlock(&s->mu);
}

static void *client_main(void *arg)
{
    client *c = arg;
    sp_rng rng;
    sp_rng_seed(&rng, 1000 + (uint64_t)c->index);
    /* the warm-up's first turn: a training step of every client at once, all FORWARDs kept before any BACKWARD,
     * so that each server's pool of kept activations holds what the clients' steps can ever keep at once (it keeps
     * the buffers of the most steps it held together: 3 clients x 2 blocks x 1.16 MiB a server here); met by
     * chance after the warm-up, that most would show as growth */
    if (train_step(c, &rng, &c->s->together))
        count_error(c->s);
    while (!atomic_load(&c->s->stop)) {
        /* one turn in four trains, at random, and turns start 0-20 ms apart: the clients never fall into
         * lockstep, so how often a decode step meets another client's training step stays the same all along */
        usleep(sp_rng_u32(&rng) % 20000);
        char text[1024];
        int bad = sp_rng_u32(&rng) % 4 == 0 ? train_step(c, &rng, NULL)
                                             : generate(c, text, sizeof text) || strcmp(text, c->s->ref);
        if (bad)
            count_error(c->s);
        if (c->s->o.pace > 0)
            usleep((useconds_t)(c->s->o.pace * 1e6));
    }
    return NULL;
}

static int client_init(soak *s, client *c, int index)
{
    sp_err err = {0};
    int *raw = NULL;
    c->s = s;
    c->index = index;
    if (sp_runtime_new(&c->rt, NULL, NULL, &err) || sp_runtime_load(c->rt, s->o.model, &err) ||
        sp_runtime_connect(c->rt, s->addrs, &err) ||
        sp_tokenizer_encode(sp_runtime_tokenizer(c->rt), "Once upon a time", 1, &raw, &c->n, &err))
        return fprintf(stderr, "soak: client %d: %s\n", index, err.msg), -1;
    for (int i = 0; i < c->n && i < 64; i++)
        c->ids[i] = raw[i];
    free(raw);
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* sampling */

/* Milliseconds of a fixed single-threaded loop: how much of a core the machine gives us right now (a shared
 * machine's other work slows the swarm and this loop alike). */
static double calibrate(void)
{
    double t0 = sp_now_s();
    volatile uint64_t x = 88172645463325252ull;
    for (int i = 0; i < 3000000; i++) {
        uint64_t v = x;
        v ^= v << 13;
        v ^= v >> 7;
        v ^= v << 17;
        x = v;
    }
    return (sp_now_s() - t0) * 1e3;
}

static double loadavg(void)
{
    FILE *f = fopen("/proc/loadavg", "r");
    double l = NAN;
    if (f && fscanf(f, "%lf", &l) != 1)
        l = NAN;
    if (f)
        fclose(f);
    return l;
}

static void sample(soak *s, row *r, double t0)
{
    r->t = sp_now_s() - t0;
    r->srv_rss = r->srv_fds = r->srv_threads = 0;
    for (int i = 0; i < s->npids; i++) {
        r->srv_rss += status_field(s->pids[i], "VmRSS:") / 1024.0;
        r->srv_fds += fds_of(s->pids[i]);
        r->srv_threads += status_field(s->pids[i], "Threads:");
    }
    r->cli_rss = status_field(0, "VmRSS:") / 1024.0;
    r->cli_fds = fds_of(0);
    r->calib = calibrate();
    r->load = loadavg();
    pthread_mutex_lock(&s->mu);
    r->step50 = pct(s->steps.v, s->steps.n, 0.5) * 1e3;
    r->step99 = pct(s->steps.v, s->steps.n, 0.99) * 1e3;
    r->train50 = pct(s->trains.v, s->trains.n, 0.5) * 1e3;
    r->train99 = pct(s->trains.v, s->trains.n, 0.99) * 1e3;
    r->tokens = s->tokens;
    r->trains = s->ntrains;
    r->errors = s->errors;
    s->steps.n = s->trains.n = 0;
    s->tokens = s->ntrains = s->errors = 0;
    pthread_mutex_unlock(&s->mu);
}

static void write_row(FILE *f, const row *r)
{
    fprintf(f, "%.1f,%.2f,%.0f,%.0f,%.2f,%.0f,%.3f,%.3f,%.2f,%.2f,%ld,%ld,%ld,%.2f,%.2f\n", r->t, r->srv_rss,
            r->srv_fds, r->srv_threads, r->cli_rss, r->cli_fds, r->step50, r->step99, r->train50, r->train99, r->tokens,
            r->trains, r->errors, r->calib, r->load);
    fflush(f);
}

/* ---------------------------------------------------------------------------------------------- */
/* the plot: three panels over time, as SVG */

typedef struct series {
    const char *name, *color;
    size_t off; /* of a double in row */
} series;

static void panel(FILE *f, const row *rows, int n, int y0, const char *title, const series *ss, int ns)
{
    const int W = 900, H = 200, L = 70, R = 20;
    double tmax = n ? rows[n - 1].t : 1, vmax = 0;
    for (int k = 0; k < ns; k++)
        for (int i = 0; i < n; i++) {
            double v = *(const double *)((const char *)&rows[i] + ss[k].off);
            if (isfinite(v) && v > vmax)
                vmax = v;
        }
    vmax = vmax > 0 ? vmax * 1.1 : 1;
    fprintf(f, "<text x='%d' y='%d' font-size='14'>%s</text>\n", L, y0 - 6, title);
    fprintf(f, "<rect x='%d' y='%d' width='%d' height='%d' fill='none' stroke='#888'/>\n", L, y0, W - L - R, H);
    for (int g = 0; g <= 4; g++) {
        double v = vmax * g / 4;
        int y = y0 + H - (int)(H * g / 4);
        fprintf(f, "<text x='%d' y='%d' font-size='11' text-anchor='end'>%.4g</text>\n", L - 4, y + 4, v);
        fprintf(f, "<line x1='%d' y1='%d' x2='%d' y2='%d' stroke='#ddd'/>\n", L, y, W - R, y);
    }
    fprintf(f, "<text x='%d' y='%d' font-size='11' text-anchor='end'>%.0f s</text>\n", W - R, y0 + H + 14, tmax);
    for (int k = 0; k < ns; k++) {
        fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='1.5' points='", ss[k].color);
        for (int i = 0; i < n; i++) {
            double v = *(const double *)((const char *)&rows[i] + ss[k].off);
            if (isfinite(v))
                fprintf(f, "%.1f,%.1f ", L + (W - L - R) * rows[i].t / (tmax > 0 ? tmax : 1),
                        y0 + H - H * v / vmax);
        }
        fprintf(f, "'/>\n<text x='%d' y='%d' font-size='12' fill='%s'>%s</text>\n", L + 10 + 170 * k, y0 + 16,
                ss[k].color, ss[k].name);
    }
}

static void write_svg(const char *path, const row *rows, int n, const opts *o)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return;
    fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='900' height='1060' font-family='sans-serif'>\n"
               "<rect width='100%%' height='100%%' fill='white'/>\n"
               "<text x='70' y='24' font-size='16'>sepal soak: %d servers, %d clients, %.0f s</text>\n",
            o->servers, o->clients, o->seconds);
    series rss[] = {{"servers RSS (MiB)", "#c0392b", offsetof(row, srv_rss)},
                    {"client RSS (MiB)", "#2980b9", offsetof(row, cli_rss)}};
    series fds[] = {{"server fds", "#8e44ad", offsetof(row, srv_fds)},
                    {"server threads", "#27ae60", offsetof(row, srv_threads)},
                    {"client fds", "#d35400", offsetof(row, cli_fds)}};
    series lat_[] = {{"step p50 (ms)", "#16a085", offsetof(row, step50)},
                     {"step p99 (ms)", "#c0392b", offsetof(row, step99)}};
    series tr[] = {{"train step p50 (ms)", "#16a085", offsetof(row, train50)},
                   {"train step p99 (ms)", "#c0392b", offsetof(row, train99)}};
    panel(f, rows, n, 60, "memory", rss, 2);
    panel(f, rows, n, 310, "descriptors and threads", fds, 3);
    panel(f, rows, n, 560, "decode step latency", lat_, 2);
    panel(f, rows, n, 810, "training step latency (FORWARD + BACKWARD, [2, 32])", tr, 2);
    fprintf(f, "</svg>\n");
    fclose(f);
}

/* ---------------------------------------------------------------------------------------------- */
/* the check */

static double median_of(const row *rows, int from, int to, size_t off)
{
    double *v = malloc((size_t)(to > from ? to - from : 1) * sizeof *v), m;
    int n = 0;
    for (int i = from; v && i < to; i++) {
        double x = *(const double *)((const char *)&rows[i] + off);
        if (isfinite(x))
            v[n++] = x;
    }
    m = v ? pct(v, n, 0.5) : NAN;
    free(v);
    return m;
}

/* The decode p99's drift from the samples [a0, a1) to [b0, b1): the median of the per-interval p99s, as measured
 * (*raw) and at the machine speed of the first (the smaller of the two: a drift is both; a loop that got faster
 * while the p99, made of wake-ups and hand-offs more than of arithmetic, held still is no drift, a p99 that grew
 * with a slower machine is none either). */
static double p99_drift(const row *rows, int a0, int a1, int b0, int b1, double *raw, double *p0, double *p1,
                        double *c0, double *c1)
{
    *p0 = median_of(rows, a0, a1, offsetof(row, step99)), *p1 = median_of(rows, b0, b1, offsetof(row, step99));
    *c0 = median_of(rows, a0, a1, offsetof(row, calib)), *c1 = median_of(rows, b0, b1, offsetof(row, calib));
    *raw = (*p1 - *p0) / *p0;
    return fmin(*raw, (*p1 * *c0 / *c1 - *p0) / *p0);
}

static int first_after_warmup(const row *rows, int n, const opts *o)
{
    int w = 0;
    while (w < n && rows[w].t < o->warmup)
        w++;
    return w;
}

/* Whether the run's p99 drifted (the second half against the first): then main samples on for the confirmation. */
static int p99_suspect(const row *rows, int n, const opts *o)
{
    int w = first_after_warmup(rows, n, o), mid = w + (n - w) / 2;
    double raw, p0, p1, c0, c1;
    return n - w >= 6 && !(p99_drift(rows, w, mid, mid, n, &raw, &p0, &p1, &c0, &c1) < 0.2);
}

/* n: the run's samples; nc more after them: the confirmation (0 when none ran) */
static int check(const row *rows, int n, int nc, const opts *o)
{
    int w = first_after_warmup(rows, n, o);
    if (n - w < 6)
        return fprintf(stderr, "soak: too few samples after the warm-up (%d)\n", n - w), 1;
    long errors = 0;
    for (int i = 0; i < n + nc; i++)
        errors += rows[i].errors;
    double rss0 = median_of(rows, w, w + 3, offsetof(row, srv_rss)), rss1 = median_of(rows, n - 3, n, offsetof(row, srv_rss));
    double fd0 = median_of(rows, w, w + 3, offsetof(row, srv_fds)), fd1 = median_of(rows, n - 3, n, offsetof(row, srv_fds));
    int mid = w + (n - w) / 2;
    double raw, p0, p1, c0, c1, drift = p99_drift(rows, w, mid, mid, n, &raw, &p0, &p1, &c0, &c1);
    double rss_room = fmax(0.02 * rss0, 8.0);
    int bad = 0;
    printf("check: servers' RSS %.1f -> %.1f MiB (allowed +%.1f), fds %.0f -> %.0f (allowed +-2), decode p99 %.2f -> "
           "%.2f ms (%+.0f%%; the machine's speed %.2f -> %.2f ms a loop: %+.0f%% at equal speed, allowed +20%%), "
           "%ld errors\n", rss0, rss1, rss_room, fd0, fd1, p0, p1, raw * 100, c0, c1, drift * 100, errors);
    if (nc) {
        /* a drift the swarm makes stays (what grows with use does not shrink by itself): the confirmation's
         * samples against the first half again; a burst of other work on a shared machine passes */
        double d2 = p99_drift(rows, w, mid, n, n + nc, &raw, &p0, &p1, &c0, &c1);
        printf("check: the confirmation (%d samples more): decode p99 %.2f -> %.2f ms (%+.0f%%; the machine's speed "
               "%.2f -> %.2f ms a loop: %+.0f%% at equal speed, allowed +20%%)\n", nc, p0, p1, raw * 100, c0, c1,
               d2 * 100);
        fd1 = median_of(rows, n + nc - 3, n + nc, offsetof(row, srv_fds));
        rss1 = median_of(rows, n + nc - 3, n + nc, offsetof(row, srv_rss));
        printf("check: at the confirmation's end: servers' RSS %.1f MiB, fds %.0f\n", rss1, fd1);
        drift = d2; /* the first drifted, or no confirmation would have run: both did when this one did */
    }
    if (rss1 > rss0 + rss_room)
        bad = fprintf(stderr, "soak: the servers' RSS grew\n") > 0;
    if (fabs(fd1 - fd0) > 2)
        bad = fprintf(stderr, "soak: the servers' descriptors changed\n") > 0;
    if (!(drift < 0.2))
        bad = fprintf(stderr, "soak: the decode p99 drifted%s\n", nc ? " and stayed up in the confirmation" : "") > 0;
    if (errors)
        bad = fprintf(stderr, "soak: %ld errors\n", errors) > 0;
    return bad;
}

/* ---------------------------------------------------------------------------------------------- */

static int parse(int argc, char **argv, opts *o)
{
    const char *home = getenv("HOME");
    static char def[PATH_MAX];
    snprintf(def, sizeof def, "%s/.cache/sepal/models/stories15M", home ? home : ".");
    *o = (opts){.model = def, .seconds = 120, .interval = 5, .warmup = 20, .clients = 3, .servers = 3,
                .csv = "soak.csv", .svg = "soak.svg"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--check"))
            o->check = 1;
        else if (v && !strcmp(a, "--seconds"))
            o->seconds = atof(v), i++;
        else if (v && !strcmp(a, "--interval"))
            o->interval = atof(v), i++;
        else if (v && !strcmp(a, "--warmup"))
            o->warmup = atof(v), i++;
        else if (v && !strcmp(a, "--pace"))
            o->pace = atof(v) / 1000, i++;
        else if (v && !strcmp(a, "--inject-drift"))
            o->inject = atof(v), i++;
        else if (v && !strcmp(a, "--clients"))
            o->clients = atoi(v), i++;
        else if (v && !strcmp(a, "--servers"))
            o->servers = atoi(v), i++;
        else if (v && !strcmp(a, "--csv"))
            o->csv = v, i++;
        else if (v && !strcmp(a, "--svg"))
            o->svg = v, i++;
        else if (a[0] != '-')
            o->model = a;
        else
            return -1;
    }
    return o->seconds > 0 && o->interval > 0 && o->clients >= 1 && o->clients <= MAXCLIENTS && o->servers >= 1 &&
                   o->servers <= 16 ? 0 : -1;
}

/* Starts the swarm and records the servers' pids and addresses. */
static int start_swarm(soak *s)
{
    sp_err err = {0};
    if (sp_runtime_new(&s->up, NULL, NULL, &err) || sp_runtime_load(s->up, s->o.model, &err) ||
        sp_runtime_swarm_up(s->up, s->o.servers, 0, &err))
        return fprintf(stderr, "soak: swarm up: %s\n", err.msg), -1;
    size_t k = 0;
    sp_server_row *rows = NULL;
    int n = sp_runtime_servers(s->up, &rows);
    for (int i = 0; i < n && s->npids < 16; i++) {
        const sp_server_row *e = &rows[i];
        if (e->pid <= 0 || e->gone)
            continue;
        s->pids[s->npids++] = e->pid;
        k += (size_t)snprintf(s->addrs + k, sizeof s->addrs - k, "%s%s:%d", k ? "," : "", e->rec.host, e->rec.port);
    }
    free(rows);
    return s->npids == s->o.servers ? 0 : -1;
}

int main(int argc, char **argv)
{
    static soak s;
    if (parse(argc, argv, &s.o))
        return fprintf(stderr, "usage: bench_soak [MODEL_DIR] [--seconds S] [--clients N] [--servers K] "
                               "[--interval S] [--warmup S] [--pace MS] [--csv FILE] [--svg FILE] [--check]\n"
                               "                  [--inject-drift MS]\n"), 2;
    sp_memtune();
    signal(SIGPIPE, SIG_IGN);
    pthread_mutex_init(&s.mu, NULL);
    if (start_swarm(&s))
        return 1;
    static client cl[MAXCLIENTS];
    for (int i = 0; i < s.o.clients; i++)
        if (client_init(&s, &cl[i], i))
            return 1;
    if (generate(&cl[0], s.ref, sizeof s.ref))
        return 1;
    FILE *csv = fopen(s.o.csv, "w");
    if (!csv)
        return fprintf(stderr, "soak: cannot write %s\n", s.o.csv), 1;
    fprintf(csv, "t_s,servers_rss_mib,servers_fds,servers_threads,client_rss_mib,client_fds,step_p50_ms,step_p99_ms,"
                 "train_p50_ms,train_p99_ms,tokens,train_steps,errors,calib_ms,loadavg\n");
    printf("soak: %d servers (%s), %d clients, %.0f s, a sample every %.0f s into %s\n", s.o.servers, s.addrs,
           s.o.clients, s.o.seconds, s.o.interval, s.o.csv);
    s.steps.n = s.trains.n = 0;
    s.tokens = s.ntrains = s.errors = 0;
    double t0 = s.t0 = sp_now_s();
    pthread_barrier_init(&s.together, NULL, (unsigned)s.o.clients);
    for (int i = 0; i < s.o.clients; i++)
        pthread_create(&cl[i].th, NULL, client_main, &cl[i]);
    static row rows[MAXROWS];
    int n = 0;
    double next = t0 + s.o.interval;
    for (; sp_now_s() < t0 + s.o.seconds && n < MAXROWS; next += s.o.interval) {
        while (sp_now_s() < next)
            usleep(20000);
        sample(&s, &rows[n], t0);
        write_row(csv, &rows[n]);
        n++;
    }
    /* --check and the p99 up by 20%: twelve samples more, the confirmation (see check) */
    int nc = 0;
    if (s.o.check && p99_suspect(rows, n, &s.o)) {
        printf("soak: the decode p99 rose by 20%% or more: %.0f s more to confirm it\n", 12 * s.o.interval);
        for (; nc < 12 && n + nc < MAXROWS; nc++, next += s.o.interval) {
            while (sp_now_s() < next)
                usleep(20000);
            sample(&s, &rows[n + nc], t0);
            write_row(csv, &rows[n + nc]);
        }
    }
    atomic_store(&s.stop, 1);
    for (int i = 0; i < s.o.clients; i++) {
        pthread_join(cl[i].th, NULL);
        sp_runtime_free(cl[i].rt);
    }
    pthread_barrier_destroy(&s.together);
    fclose(csv);
    write_svg(s.o.svg, rows, n + nc, &s.o);
    printf("soak: %d samples in %s, plot in %s\n", n + nc, s.o.csv, s.o.svg);
    int rc = s.o.check ? check(rows, n, nc, &s.o) : 0;
    sp_runtime_free(s.up); /* stops the swarm */
    free(s.steps.v);
    free(s.trains.v);
    return rc;
}
