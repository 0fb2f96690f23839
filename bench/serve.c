/* serve.c - what one server gives many users: concurrent inference sessions decoding through one sepal-server
 * process, with the server's batching of decode steps across sessions on and off (--no-batch) in the same run.
 *
 * For each mode a sepal-server serves blocks --blocks of --model in --dtype (default: blocks 0:4 of a
 * 7B-shaped checkpoint, `sepal model init --like llama-2-7b`, in int8); for each concurrency C (--sessions
 * 1,4,16,64) C client threads, each with its own websocket connection, open a session, prefill --prefill
 * positions, wait for the others, then decode --steps single positions each (random hidden states: the span's
 * cost does not depend on them). Figures per C: the aggregate tokens/s (C x steps / the time from the start
 * to the last step's answer), and the p50 / p99 of the per-step latency (request sent to answer read, as a
 * client sees it), and the server's CPU time per token (its utime + stime over the measure: what a token costs
 * whatever else runs on the machine), and the rows of the server's batched passes over the measures, on average
 * (its INFO's batches and batched_rows: C when every pass took all C sessions' steps). Ratios against the baseline
 * of the same run and mode: aggregate tokens/s / C = 1, and p99 step / the p50 step of C = 1 (goals at C = 16 with
 * batching: >= 8x and <= 3x).
 *
 * Both servers run from the start and the modes take turns, --reps times for each C, which goes first turning
 * each rep (a shared machine's load changes by the minute: each mode sees the same spells of it; and the first
 * measure after the other's ran slower); tokens/s and CPU time per token are the medians of the reps, the
 * latencies' quantiles are over all of them.
 *
 * --mix L1,L2,...: concurrent prefills instead: the C sessions, once all are open, each prefill one prompt of
 * L[i mod n] positions at once (no decode steps); the figures are then prompt tokens/s (their sum / the time from
 * the start to the last prefill's answer), the prefills' p50 / p99 latency and the server's CPU time per prompt
 * token. Mode `base` is a server from the binary --base BIN (another build, such as main's), batching on: with
 * `--modes batch,base` the two builds take turns the same way.
 *
 * --push C:D: each session's decode steps are pushed: each mode has a next server of its own (its build, batching
 * as it does) that serves blocks C:D, which the server under test reaches through a bench/linkem link of
 * --push-delay ms each way (default 5; the clients reach the server under test directly, and the next server
 * directly too, except in mode relay). Each step, the session's step that awaits its input goes to the next server
 * first, then its step with the push fields to the server under test; the latency is from that step's send to the
 * next server's answer (the token's critical path), so a pass of C sessions shows how long its pushes keep the next
 * servers waiting (`--modes batch,base --base` an older build: both servers of the base mode are of that build).
 * A push not acknowledged (a reply saying pushed 0) is counted and the step goes on client-driven. Mode relay
 * (this build) steps client-driven instead: the step to the server under test, its output by the client to the next
 * server, over a link of --push-delay ms each way of its own (as the push crosses one): `--modes batch,relay`
 * compares pushed steps with client-driven ones. The next server's passes are shown too (its INFO's batches and
 * batched_rows over the measures: C when each of its passes took all C sessions' steps).
 *
 * usage: bench_serve [--model DIR] [--blocks A:B] [--dtype int8] [--sessions 1,4,16,64] [--steps N]
 *                    [--prefill N] [--mix L1,L2,...] [--modes batch,nobatch,base] [--base BIN] [--threads N]
 *                    [--reps N] [--push C:D [--push-delay MS]]   (--modes: batch, nobatch, base, relay) */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../tests/serverproc.h"
#include "remote.h"
#include "rng.h"
#include "timeutil.h"

#define MAXC 8
#define TMO 600000

/* the modes: --no-batch, batching, batching in the --base build, batching with client-driven steps (--push) */
enum { M_NOBATCH, M_BATCH, M_BASE, M_RELAY };

typedef struct opts {
    const char *model, *blocks, *dtype, *threads, *base;
    int sessions[MAXC], nsessions, steps, prefill, modes[2], nmodes, reps;
    int mix[MAXC], nmix; /* --mix: prefill lengths (0: decode steps are measured) */
    const char *push;    /* --push C:D: the next server's blocks (NULL: no push) */
    int push_delay;      /* ms each way between the server and the next one */
} opts;

/* Positions session i prefills, and the steps it takes after. */
static int prefill_of(const opts *o, int i) { return o->nmix ? o->mix[i % o->nmix] : o->prefill; }
static int steps_of(const opts *o) { return o->nmix ? 0 : o->steps; }

typedef struct run {
    const opts *o;
    int mode;
    pid_t pid, next_pid, link_pid; /* the server under test; --push: the next server, the link to it */
    int port, hidden, start, end, C;
    pthread_barrier_t ready;
    double *lat; /* [C, steps] seconds */
    int failed;
    int64_t passes, rows; /* the server's batched passes and their rows over the measures of one C (INFO) */
    int64_t npasses, nrows, npeak; /* --push: the next server's, and the most rows of one of its passes */
    int next_port, link_port; /* --push: the next server's port (the clients'), the link's to it (the pushes') */
    int unpushed;             /* atomic: steps whose push was not acknowledged */
} run;

typedef struct client {
    run *r;
    int i;
} client;

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The q-quantile of v[0..n) (sorted in place), nearest rank. */
static double quantile(double *v, int n, double q)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    int k = (int)(q * n + 0.5) - 1;
    return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

/* One call; 0 or -1 (the error printed). */
static int call(sp_remote *rm, sp_msg_type type, const char *meta, const sp_tensor_src *t, int n, sp_reply *rep)
{
    sp_err err = {0};
    if (sp_remote_call(rm, type, meta, t, n, rep, TMO, &err) == SP_OK)
        return 0;
    fprintf(stderr, "bench_serve: %s: %s\n", sp_msg_type_name(type), err.msg);
    return -1;
}

/* The session on the next server (--push) of L positions: its id, its push token into *token; 0 on failure. */
static uint64_t open_next(sp_remote *rb, int L, uint64_t *token)
{
    char meta[128];
    sp_info_reply i = {0};
    sp_err err = {0};
    sp_reply rep = {0};
    if (sp_remote_get_info(rb, &i, TMO, &err))
        return fprintf(stderr, "bench_serve: next server: %s\n", err.msg), 0;
    sp_open_req oq = {.start = i.start, .end = i.end, .max_length = L, .batch = 1};
    sp_open_reply a = {0};
    int ok = sp_open_req_encode(&oq, meta, sizeof meta, &err) == SP_OK &&
             !call(rb, SP_MSG_INFERENCE_OPEN, meta, NULL, 0, &rep) && sp_open_reply_decode(&rep.msg, &a, &err) == SP_OK;
    sp_reply_clear(&rep);
    *token = a.push_token;
    return ok ? a.session : 0;
}

/* The step's output (rep's tensor 0, [1, 1, H]) taken by the client to the next server's session nx; 0 or -1. */
static int relay_step(run *r, sp_remote *rb, uint64_t nx, const sp_reply *rep)
{
    char meta[256];
    sp_err err = {0};
    sp_step_req p = {.session = nx, .start_from_position = -1, .reply_encoding = -1};
    sp_reply prep;
    sp_tensor_src out = {.enc = SP_ENC_F32, .rank = 3, .shape = {1, 1, r->hidden}};
    float *h = malloc((size_t)r->hidden * sizeof *h);
    int ok = h && rep->msg.n_tensors == 1 && sp_tensor_to_f32(&rep->msg.t[0], h, &err) == SP_OK &&
             (out.f32 = h, 1) && sp_step_req_encode(&p, meta, sizeof meta, &err) == SP_OK &&
             !call(rb, SP_MSG_INFERENCE_STEP, meta, &out, 1, &prep);
    if (ok)
        sp_reply_clear(&prep);
    free(h);
    return ok ? 0 : -1;
}

/* A pushed step (--push): the step that awaits its input to the next server's session nx first, then q (its push
 * fields set) with t to the server; 0 once the next server answered, -1 on failure. Unacknowledged pushes: the
 * output taken to the next server by the client. */
static int pushed_step(run *r, sp_remote *rm, sp_remote *rb, sp_step_req *q, uint64_t nx, const sp_tensor_src *t)
{
    char meta[512], wmeta[256];
    sp_err err = {0};
    sp_reply rep = {0}, wrep;
    uint64_t wid = 0;
    sp_step_req w = {.session = nx, .start_from_position = -1, .reply_encoding = -1, .step = q->step, .await = 1};
    if (sp_step_req_encode(&w, wmeta, sizeof wmeta, &err) || sp_step_req_encode(q, meta, sizeof meta, &err) ||
        sp_remote_send(rb, SP_MSG_INFERENCE_STEP, wmeta, NULL, 0, &wrep, &wid, &err))
        return fprintf(stderr, "bench_serve: next server: %s\n", err.msg), -1;
    int ok = !call(rm, SP_MSG_INFERENCE_STEP, meta, t, 1, &rep);
    sp_step_reply a = {0};
    ok = ok && sp_step_reply_decode(&rep.msg, &a, &err) == SP_OK && rep.msg.n_tensors == 1;
    if (ok && !a.pushed) { /* client-driven: its own input supersedes the awaiting step */
        __atomic_add_fetch(&r->unpushed, 1, __ATOMIC_RELAXED);
        ok = !relay_step(r, rb, nx, &rep);
        sp_remote_wait(rb, wid, 5000, &err); /* (superseded) */
        sp_reply_clear(&wrep);
        sp_reply_clear(&rep);
        return ok ? 0 : -1;
    }
    sp_reply_clear(&rep);
    sp_status st = sp_remote_wait(rb, wid, TMO, &err);
    sp_reply_clear(&wrep);
    if (st)
        fprintf(stderr, "bench_serve: the awaiting step: %s\n", err.msg);
    return ok && !st ? 0 : -1;
}

/* A session: open, prefill, wait for the others, `steps` single steps timed, close. */
static void *client_main(void *p)
{
    client *c = p;
    run *r = c->r;
    const opts *o = r->o;
    int H = r->hidden, P = prefill_of(o, c->i), S = steps_of(o), L = P + S;
    sp_remote *rm = NULL;
    sp_err err = {0};
    float *x = malloc((size_t)L * H * sizeof(float));
    sp_rng g;
    sp_rng_seed(&g, 100 + (uint64_t)c->i);
    sp_rng_fill_normal(&g, x, (long)L * H, 1.0f);
    int ok = x && sp_remote_connect(&rm, "127.0.0.1", r->port, 0, TMO, &err) == SP_OK;
    sp_remote *rb = NULL;
    uint64_t nx = 0, token = 0;
    if (ok && o->push) /* (relay: the client reaches the next server over a link, as the pushes do: no bulk channel,
                        * which would go around it) */
        ok = sp_remote_connect(&rb, "127.0.0.1", r->mode == M_RELAY ? r->link_port : r->next_port, r->mode == M_RELAY,
                               TMO, &err) == SP_OK &&
             (nx = open_next(rb, L, &token)) != 0;
    if (!ok)
        fprintf(stderr, "bench_serve: connect: %s\n", err.msg);
    char meta[128];
    sp_reply rep = {0};
    sp_open_req oq = {.start = r->start, .end = r->end, .max_length = L, .batch = 1};
    sp_open_reply a = {0};
    ok = ok && sp_open_req_encode(&oq, meta, sizeof meta, &err) == SP_OK &&
         !call(rm, SP_MSG_INFERENCE_OPEN, meta, NULL, 0, &rep) && sp_open_reply_decode(&rep.msg, &a, &err) == SP_OK;
    sp_reply_clear(&rep);
    sp_step_req q = {.start_from_position = -1, .reply_encoding = -1};
    q.session = a.session;
    ok = ok && sp_step_req_encode(&q, meta, sizeof meta, &err) == SP_OK;
    sp_tensor_src t = {.enc = SP_ENC_F32, .rank = 3, .shape = {1, P, H}, .f32 = x};
    if (o->nmix) /* the prefills are what is measured: all at once */
        pthread_barrier_wait(&r->ready);
    double t0 = sp_now_s();
    ok = ok && !call(rm, SP_MSG_INFERENCE_STEP, meta, &t, 1, &rep);
    if (o->nmix)
        r->lat[c->i] = sp_now_s() - t0;
    sp_reply_clear(&rep);
    if (!o->nmix)
        pthread_barrier_wait(&r->ready);
    sp_step_req pq = {.session = a.session, .start_from_position = -1, .reply_encoding = -1,
                      .push_host = "127.0.0.1", .push_port = r->link_port, .push_session = nx, .push_token = token};
    for (int s = 0; ok && s < S; s++) {
        t = (sp_tensor_src){.enc = SP_ENC_F32, .rank = 3, .shape = {1, 1, H}, .f32 = x + (size_t)(P + s) * H};
        t0 = sp_now_s();
        pq.step = (uint64_t)s + 1;
        if (o->push && r->mode == M_RELAY) {
            ok = !call(rm, SP_MSG_INFERENCE_STEP, meta, &t, 1, &rep) && !relay_step(r, rb, nx, &rep);
            r->lat[(size_t)c->i * S + s] = sp_now_s() - t0;
            sp_reply_clear(&rep);
            continue;
        }
        if (o->push) {
            ok = !pushed_step(r, rm, rb, &pq, nx, &t);
            r->lat[(size_t)c->i * S + s] = sp_now_s() - t0;
            continue;
        }
        ok = !call(rm, SP_MSG_INFERENCE_STEP, meta, &t, 1, &rep);
        r->lat[(size_t)c->i * S + s] = sp_now_s() - t0;
        sp_reply_clear(&rep);
    }
    if (!ok)
        __atomic_store_n(&r->failed, 1, __ATOMIC_RELAXED);
    if (rm && a.session) {
        sp_close_req cq = {.session = a.session};
        if (sp_close_req_encode(&cq, meta, sizeof meta, &err) == SP_OK && !call(rm, SP_MSG_INFERENCE_CLOSE, meta, NULL, 0, &rep))
            sp_reply_clear(&rep);
    }
    if (rb && nx) {
        sp_close_req cq = {.session = nx};
        if (sp_close_req_encode(&cq, meta, sizeof meta, &err) == SP_OK && !call(rb, SP_MSG_INFERENCE_CLOSE, meta, NULL, 0, &rep))
            sp_reply_clear(&rep);
    }
    sp_remote_close(rb);
    sp_remote_close(rm);
    free(x);
    return NULL;
}

static int server_info(int port, sp_info_reply *a);

/* C sessions at once: its tokens/s and server CPU s/token into tps[rep], cpu[rep], its latencies appended to lat
 * (*nlat of them so far); 0 or -1. */
static int measure(run *r, int C, double *tps, double *cpu, double *lat, int *nlat)
{
    const opts *o = r->o;
    r->C = C;
    r->failed = 0;
    r->lat = lat + *nlat;
    client *cs = calloc((size_t)C, sizeof *cs);
    pthread_t *th = calloc((size_t)C, sizeof *th);
    if (!cs || !th)
        return free(cs), free(th), -1;
    pthread_barrier_init(&r->ready, NULL, (unsigned)C + 1);
    for (int i = 0; i < C; i++) {
        cs[i] = (client){r, i};
        pthread_create(&th[i], NULL, client_main, &cs[i]);
    }
    pthread_barrier_wait(&r->ready); /* every session open (and prefilled, when steps are measured) */
    double t0 = sp_now_s(), c0 = sp_serverproc_cpu_s(r->pid);
    sp_info_reply i0 = {0}, i1 = {0}, n0 = {0}, n1 = {0}; /* (the passes of the measure: its first may have gone
                                                           * before i0) */
    int info = !server_info(r->port, &i0), ninfo = o->push && !server_info(r->next_port, &n0);
    for (int i = 0; i < C; i++)
        pthread_join(th[i], NULL);
    double wall = sp_now_s() - t0;
    if (info && !server_info(r->port, &i1))
        r->passes += i1.batches - i0.batches, r->rows += i1.batched_rows - i0.batched_rows;
    if (ninfo && !server_info(r->next_port, &n1)) {
        r->npasses += n1.batches - n0.batches, r->nrows += n1.batched_rows - n0.batched_rows;
        r->npeak = n1.batch_peak; /* (the next server's most since it started: every C so far) */
    }
    pthread_barrier_destroy(&r->ready);
    int n = 0;
    for (int i = 0; i < C; i++)
        n += o->nmix ? prefill_of(o, i) : o->steps;
    *tps = n / wall;
    *cpu = (sp_serverproc_cpu_s(r->pid) - c0) / n; /* (the closes after the last step are in it too: small) */
    *nlat += o->nmix ? C : n;
    free(cs), free(th);
    return r->failed ? -1 : 0;
}

static double median(double *v, int n) { return quantile(v, n, 0.5); }

/* sepal-server for this mode (M_*) over blocks; its pid, or -1 (*port set). */
static pid_t spawn(const opts *o, int mode, const char *blocks, int *port)
{
    char line[1024], cache[32];
    int most = 0, longest = 0;
    for (int i = 0; i < o->nsessions; i++)
        most = o->sessions[i] > most ? o->sessions[i] : most;
    for (int i = 0; i < most; i++)
        longest = prefill_of(o, i) > longest ? prefill_of(o, i) : longest;
    snprintf(cache, sizeof cache, "%d", most * (longest + steps_of(o)));
    const char *argv[24] = {"sepal-server", "--model", o->model, "--blocks", blocks, "--dtype", o->dtype,
                            "--no-measure", "--cache-tokens", cache, "--max-length", "4096",
                            "--max-queue-wait", "0"}; /* every session is let in: throughput, not admission */
    int k = 14;
    if (o->threads)
        argv[k++] = "--threads", argv[k++] = o->threads;
    if (mode == M_NOBATCH)
        argv[k++] = "--no-batch";
    argv[k] = NULL;
    const char *bin = mode == M_BASE ? o->base : sp_serverproc_bin();
    pid_t pid = sp_serverproc_start(bin, argv, 0, NULL, line, sizeof line);
    *port = sp_serverproc_port(line, "ws://");
    if (pid <= 0 || *port <= 0) {
        fprintf(stderr, "bench_serve: %s did not start: %s\n", bin, line);
        if (pid > 0)
            kill(pid, SIGKILL), waitpid(pid, NULL, 0);
        return -1;
    }
    return pid;
}

/* The INFO of the server at port into a; 0 or -1. */
static int server_info(int port, sp_info_reply *a)
{
    sp_remote *rm = NULL;
    sp_err err = {0};
    if (sp_remote_connect(&rm, "127.0.0.1", port, 0, TMO, &err))
        return fprintf(stderr, "bench_serve: %s\n", err.msg), -1;
    sp_reply rep;
    int rc = call(rm, SP_MSG_INFO, NULL, NULL, 0, &rep) || sp_info_reply_decode(&rep.msg, a, &err) ? -1 : 0;
    sp_reply_clear(&rep);
    sp_remote_close(rm);
    return rc;
}

/* The span's hidden size and blocks, from INFO. */
static int span_of(run *r)
{
    sp_info_reply a = {0};
    int rc = server_info(r->port, &a);
    r->hidden = a.hidden_size, r->start = a.start, r->end = a.end;
    return rc;
}

static int parse(int argc, char **argv, opts *o)
{
    static char model[4096];
    snprintf(model, sizeof model, "%s/.cache/sepal/models/llama-2-7b-like-8l", getenv("HOME") ? getenv("HOME") : ".");
    *o = (opts){.model = model, .blocks = "0:4", .dtype = "int8", .sessions = {1, 4, 16, 64}, .nsessions = 4,
                .steps = 12, .prefill = 8, .modes = {1, 0}, .nmodes = 2, .reps = 3, .push_delay = 5};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            return fprintf(stderr, "bench_serve: %s needs a value\n", a), -1;
        i++;
        if (!strcmp(a, "--model"))
            o->model = v;
        else if (!strcmp(a, "--blocks"))
            o->blocks = v;
        else if (!strcmp(a, "--dtype"))
            o->dtype = v;
        else if (!strcmp(a, "--threads"))
            o->threads = v;
        else if (!strcmp(a, "--steps"))
            o->steps = atoi(v);
        else if (!strcmp(a, "--reps"))
            o->reps = atoi(v);
        else if (!strcmp(a, "--prefill"))
            o->prefill = atoi(v);
        else if (!strcmp(a, "--base"))
            o->base = v;
        else if (!strcmp(a, "--push"))
            o->push = v;
        else if (!strcmp(a, "--push-delay"))
            o->push_delay = atoi(v);
        else if (!strcmp(a, "--mix")) {
            o->nmix = 0;
            for (const char *p = v; *p && o->nmix < MAXC; p = strchr(p, ',') ? strchr(p, ',') + 1 : "")
                if ((o->mix[o->nmix++] = atoi(p)) < 1)
                    return fprintf(stderr, "bench_serve: --mix wants lengths >= 1\n"), -1;
        } else if (!strcmp(a, "--sessions")) {
            o->nsessions = 0;
            for (const char *p = v; *p && o->nsessions < MAXC; p = strchr(p, ',') ? strchr(p, ',') + 1 : "")
                o->sessions[o->nsessions++] = atoi(p);
        } else if (!strcmp(a, "--modes")) {
            o->nmodes = 0;
            char buf[64];
            snprintf(buf, sizeof buf, "%s", v);
            for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && o->nmodes < 2; t = strtok_r(NULL, ",", &save))
                if (!strcmp(t, "batch") || !strcmp(t, "nobatch") || !strcmp(t, "base") || !strcmp(t, "relay"))
                    o->modes[o->nmodes++] = !strcmp(t, "batch")  ? M_BATCH
                                            : !strcmp(t, "base") ? M_BASE
                                            : !strcmp(t, "relay") ? M_RELAY
                                                                  : M_NOBATCH;
        } else
            return fprintf(stderr, "bench_serve: unknown option %s\n", a), -1;
    }
    for (int i = 0; i < o->nsessions; i++)
        if (o->sessions[i] < 1)
            return fprintf(stderr, "bench_serve: --sessions wants counts >= 1\n"), -1;
    int ok = o->steps >= 1 && o->prefill >= 1 && o->nmodes && o->reps >= 1 && o->reps <= 16 && o->push_delay >= 0 &&
             (!o->push || !o->nmix);
    for (int m = 0; m < o->nmodes; m++)
        ok &= (o->modes[m] != M_BASE || o->base) && (o->modes[m] != M_RELAY || o->push);
    return ok ? 0
              : (fprintf(stderr, "bench_serve: bad arguments (--reps 1..16; mode base needs --base BIN, mode relay "
                                 "--push; --push measures decode steps, not --mix)\n"),
                 -1);
}

static void stop_servers(run *runs, int n)
{
    for (int m = 0; m < n; m++) {
        pid_t pids[3] = {runs[m].pid, runs[m].next_pid, runs[m].link_pid};
        for (int k = 0; k < 3; k++)
            if (pids[k] > 0) {
                kill(pids[k], SIGTERM);
                waitpid(pids[k], NULL, 0);
            }
    }
}

/* --push: mode's next server (blocks o->push; the mode's build and batching) and a linkem link of o->push_delay ms to
 * it; their pids into pids[0..2), the ports into next_port and link_port; 0 or -1. */
static int spawn_next(const opts *o, int mode, pid_t *pids, int *next_port, int *link_port)
{
    if ((pids[0] = spawn(o, mode, o->push, next_port)) < 0)
        return -1;
    char linkem[4096], listen_to[64], delay[16], line[1024];
    ssize_t n = readlink("/proc/self/exe", linkem, sizeof linkem - 16);
    linkem[n > 0 ? n : 0] = '\0';
    char *slash = strrchr(linkem, '/');
    snprintf(slash ? slash + 1 : linkem, 16, "linkem");
    snprintf(listen_to, sizeof listen_to, "127.0.0.1:%d", *next_port);
    snprintf(delay, sizeof delay, "%d", o->push_delay);
    const char *argv[] = {"linkem", "--delay", delay, "--listen", "127.0.0.1:0", "--to", listen_to, NULL};
    pids[1] = sp_serverproc_start(linkem, argv, 0, NULL, line, sizeof line);
    *link_port = sp_serverproc_port(line, "linkem: ");
    if (pids[1] <= 0 || *link_port <= 0)
        return fprintf(stderr, "bench_serve: %s did not start: %s\n", linkem, line), -1;
    return 0;
}

int main(int argc, char **argv)
{
    opts o;
    if (parse(argc, argv, &o))
        return 2;
    static const char *const names[] = {"batching off (--no-batch)", "batching on", "batching on, --base build",
                                        "batching on, client-driven steps"};
    if (o.nmix) {
        printf("bench_serve: %s blocks %s, %s, concurrent prefills of", o.model, o.blocks, o.dtype);
        for (int i = 0; i < o.nmix; i++)
            printf("%s%d", i ? "," : " ", o.mix[i]);
        printf(" positions (session i: the (i mod %d)th), %d reps, modes in turn\n", o.nmix, o.reps);
    } else {
        printf("bench_serve: %s blocks %s, %s, %d prefill + %d steps a session, %d reps, modes in turn\n", o.model,
               o.blocks, o.dtype, o.prefill, o.steps, o.reps);
    }
    if (o.push)
        printf("bench_serve: each step pushed to a next server of blocks %s over a link of %d ms each way (the latency:"
               " to the next server's answer)\n", o.push, o.push_delay);
    run runs[2] = {{.o = &o}, {.o = &o}};
    for (int m = 0; m < o.nmodes; m++) {
        runs[m].mode = o.modes[m];
        int mode = o.modes[m] == M_RELAY ? M_BATCH : o.modes[m];
        pid_t pids[2] = {-1, -1};
        int rc = o.push ? spawn_next(&o, mode, pids, &runs[m].next_port, &runs[m].link_port) : 0;
        runs[m].next_pid = pids[0], runs[m].link_pid = pids[1];
        if (rc || (runs[m].pid = spawn(&o, mode, o.blocks, &runs[m].port)) < 0 || span_of(&runs[m])) {
            stop_servers(runs, o.nmodes);
            return 1;
        }
    }
    int most = 0, rc = 0;
    for (int i = 0; i < o.nsessions; i++)
        most = o.sessions[i] > most ? o.sessions[i] : most;
    double *lat[2], tps[2][MAXC][16], cpu[2][MAXC][16], base_tps[2] = {0}, base_p50[2] = {0}, p50s[2][MAXC];
    char rows[2][MAXC][200];
    for (int m = 0; m < o.nmodes; m++)
        lat[m] = calloc((size_t)most * (o.nmix ? 1 : o.steps) * o.reps, sizeof(double));
    for (int i = 0; i < o.nsessions && !rc; i++) {
        int C = o.sessions[i], nlat[2] = {0, 0};
        for (int m = 0; m < 2; m++)
            runs[m].passes = runs[m].rows = runs[m].npasses = runs[m].nrows = 0;
        for (int k = 0; k < o.reps && !rc; k++) /* the modes' order turns each rep (the first one after a pause ran slower) */
            for (int t = 0; t < o.nmodes && !rc; t++) {
                int m = (t + k) % o.nmodes;
                rc = measure(&runs[m], C, &tps[m][i][k], &cpu[m][i][k], lat[m], &nlat[m]);
            }
        for (int m = 0; m < o.nmodes && !rc; m++) {
            double t = median(tps[m][i], o.reps), c = median(cpu[m][i], o.reps);
            double p50 = quantile(lat[m], nlat[m], 0.50), p99 = quantile(lat[m], nlat[m], 0.99);
            if (i == 0)
                base_tps[m] = t, base_p50[m] = p50;
            p50s[m][i] = p50;
            char per[16] = "-";
            if (runs[m].passes > 0)
                snprintf(per, sizeof per, "%.1f", (double)runs[m].rows / (double)runs[m].passes);
            char nper[32] = "";
            if (o.push && runs[m].npasses > 0)
                snprintf(nper, sizeof nper, " %9.1f %9lld", (double)runs[m].nrows / (double)runs[m].npasses,
                         (long long)runs[m].npeak);
            else if (o.push)
                snprintf(nper, sizeof nper, " %9s %9lld", "-", (long long)runs[m].npeak);
            snprintf(rows[m][i], sizeof rows[m][i], "%9d %11.2f %9.1f %9.1f %11.1f %11.2fx %13.2fx %11s%s", C, t,
                     1e3 * p50, 1e3 * p99, 1e3 * c, t / base_tps[m], p99 / base_p50[m], per, nper);
        }
        printf("(%d sessions measured)\n", C);
        fflush(stdout);
    }
    for (int m = 0; m < o.nmodes && !rc; m++) {
        printf("\n%s:\n%9s %11s %9s %9s %11s %12s %14s %11s%s\n", names[o.modes[m]], "sessions",
               o.nmix ? "prompt tok/s" : "tokens/s", "p50 ms", "p99 ms", "CPU ms/tok", "tok/s vs 1st", "p99 vs 1st p50",
               "rows/pass", o.push ? " next r/p next peak" : "");
        for (int i = 0; i < o.nsessions; i++)
            printf("%s\n", rows[m][i]);
    }
    int on = o.modes[0] == M_BATCH ? 0 : 1; /* which of runs is batching's (this build's) */
    const char *vs = o.modes[1 - on] == M_BASE    ? "this build / --base"
                     : o.modes[1 - on] == M_RELAY ? "pushed / client-driven"
                                                  : "batching on / off";
    for (int i = 0; !rc && o.nmodes == 2 && i < o.nsessions; i++) {
        double c0 = median(cpu[on][i], o.reps), c1 = median(cpu[1 - on][i], o.reps);
        printf("%d sessions: %s: %.2fx tokens/s, %.2fx CPU per token", o.sessions[i], vs,
               median(tps[on][i], o.reps) / median(tps[1 - on][i], o.reps), c1 > 0 ? c0 / c1 : 0);
        if (o.push)
            printf(", %.2fx p50 step (to the next server's answer)", p50s[on][i] / p50s[1 - on][i]);
        printf("\n");
    }
    for (int m = 0; o.push && m < o.nmodes; m++)
        if (o.modes[m] != M_RELAY)
            printf("%s: %d steps' pushes not acknowledged (client-driven)\n", names[o.modes[m]], runs[m].unpushed);
    stop_servers(runs, o.nmodes);
    for (int m = 0; m < o.nmodes; m++)
        free(lat[m]);
    return rc;
}
