/* test_failover.c - a failure costs a retry, not the result. Real sepal-server processes on loopback in one
 * DHT swarm, found by a client runtime through its own DHT node; the server a request uses is killed
 * (SIGKILL) or hung (SIGSTOP) in the middle of it:
 *  - generation (greedy from the prefill on, seeded sampling, beam search) gives the same tokens as every
 *    block run in this process, also when the replacement dies too while it replays the history;
 *  - a hung server stalls the generation for a bounded time (the step timeout) and frees the session when
 *    it wakes;
 *  - a FORWARD or BACKWARD whose server dies gives the same outputs and gradients as the run without
 *    failure (1e-5); so does the trainer (its losses and parameters, step after step), the server killed
 *    between two steps or inside one (after the FORWARD, before the BACKWARD), also pipelined;
 *  - with no server left for some blocks (and none joining), a clear error at once; a server that joins while the
 *    client retries is used; a server restarted at its address is tried once, its earlier lives never;
 *  - a saturated server (--max-queue-wait) refuses a new session: busy, not banned; the session goes to another
 *    server with the same tokens, and new routes leave it out while its record says so; alone, it is waited for
 *    (a retry each time), or the generation fails saying so.
 * White-box where a failure says why: it reads the runtime's server table and view (private/runtime_state.h). */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "generate.h"
#include "host.h"
#include "remote.h"
#include "rng.h"
#include "runtime.h"
#include "runtime_state.h"
#include "testutil.h"
#include "timeutil.h"
#include "trainer.h"
#include "view.h"

#define M15 SEPAL_STORIES15M_DIR
#define MAXP 8

static sp_test_proc procs[MAXP];
static int nprocs;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A sepal-server for blocks "a:b", joining the swarm of procs[0] (or starting it), announcing every period s,
 * at websocket port `port` (0: any), with the options extra (NULL-terminated; NULL: none). */
static sp_test_proc *server_with(const char *blocks, int port, const char *period, const char *const *extra)
{
    char peers[64], ports[16];
    snprintf(peers, sizeof peers, "127.0.0.1:%d", nprocs ? procs[0].dht_port : 0);
    snprintf(ports, sizeof ports, "%d", port);
    const char *args[20] = {"--model", M15, "--no-measure", "--update-period", period, "--blocks", blocks,
                            "--port", ports, "--dht-port", "0"};
    int n = 11;
    if (nprocs) {
        args[n++] = "--initial-peers";
        args[n++] = peers;
    } else {
        args[n++] = "--new-swarm";
    }
    for (int i = 0; extra && extra[i] && n < 19; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    ck_assert_int_lt(nprocs, MAXP);
    sp_test_proc p;
    ck_assert_msg(sp_test_server_start(&p, args) == 0, "server %s did not start", blocks);
    procs[nprocs] = p; /* whole, once started (another thread may look) */
    __atomic_add_fetch(&nprocs, 1, __ATOMIC_SEQ_CST);
    return &procs[nprocs - 1];
}

static sp_test_proc *server_at(const char *blocks, int port, const char *period)
{
    return server_with(blocks, port, period, NULL);
}

/* A sepal-server for blocks "a:b" on any port, announcing every second. */
static sp_test_proc *server(const char *blocks) { return server_at(blocks, 0, "1"); }

static void stop_all(void)
{
    for (int i = 0; i < nprocs; i++) {
        if (procs[i].pid > 0)
            kill(procs[i].pid, SIGCONT);
        sp_test_proc_signal(&procs[i], SIGKILL);
    }
    nprocs = 0;
}

/* The process serving at port (NULL if none of ours). */
static sp_test_proc *proc_at(int port)
{
    for (int i = 0; i < nprocs; i++)
        if (procs[i].port == port && procs[i].pid > 0)
            return &procs[i];
    return NULL;
}

/* ---------------------------------------------------------------------------------------------- */
/* what the test does to the servers, from inside the generation */

typedef struct fault {
    sp_runtime *rt;
    sp_lm_swarm *sw;
    sp_lm inner;
    int at;            /* forward call (0: the prefill) before which the server is hit */
    int block;         /* the server of the hop holding this block */
    int sig;           /* SIGKILL or SIGSTOP */
    int calls;
    int port_hit;      /* the port of the server hit */
    double stall;      /* seconds the forward call that met the failure took */
    double normal;     /* the longest of the other forward calls */
    int kill_replacement; /* also kill the first replacement when it is routed (a second failure) */
    int port_second;   /* the replacement killed */
    int reroutes;      /* SP_EV_ROUTE re-route events */
    int retries;       /* SP_EV_RETRY events */
    int port_now;      /* after the last forward call: the server of F.block */
    int unblock;       /* clear the blocked-servers setting at the first retry */
    sp_test_load *halt; /* load on a server (sp_test_load) halted at the first retry */
    char last_retry[512];
    double exit_s;     /* SIGTERM: seconds from the signal to the server's exit */
    int exit_status;   /* SIGTERM/SIGKILL: the server's wait status */
    int refusals;      /* SP_EV_SERVER events of a server that does not take pushed inputs */
} fault;

static fault F;

static int port_of_hop(sp_runtime *rt, const sp_route *r, int block)
{
    sp_server_row e;
    for (int h = 0; h < r->nhops; h++)
        if (r->hop[h].start <= block && block < r->hop[h].end)
            return sp_test_server_row(rt, r->hop[h].server, &e) ? e.rec.port : -1;
    return -1;
}

static void on_event(const sp_event *ev, void *user)
{
    (void)user;
    if (getenv("SEPAL_TEST_VERBOSE"))
        fprintf(stderr, "[%.2f] event %d/%d: %s\n", sp_now_s(), ev->kind, ev->row, ev->text ? ev->text : "");
    if (ev->kind == SP_EV_RETRY) {
        F.retries++;
        if (F.halt)
            sp_test_load_halt(F.halt);
        if (F.unblock && F.rt) { /* the healthy servers become usable for the replacement */
            sp_rt_settings set;
            sp_runtime_settings(F.rt, &set);
            set.blocked[0] = '\0';
            sp_runtime_set_settings(F.rt, &set);
        }
        snprintf(F.last_retry, sizeof F.last_retry, "%s", ev->text);
    }
    if (ev->kind == SP_EV_SERVER && ev->text && strstr(ev->text, "does not take pushed inputs")) {
        F.refusals++;
        printf("event: %s\n", ev->text);
    }
    if (ev->kind != SP_EV_ROUTE || ev->row != 1)
        return;
    F.reroutes++;
    if (F.kill_replacement && !F.port_second && F.sw) { /* the first fresh hop: a replacement about to replay */
        for (int h = 0; h < F.sw->route.nhops; h++)
            if (F.sw->fresh[h]) {
                sp_server_row e;
                int port = sp_test_server_row(F.rt, F.sw->route.hop[h].server, &e) ? e.rec.port : -1;
                sp_test_proc *p = proc_at(port);
                ck_assert_msg(p != NULL, "replacement at port %d is not ours", port);
                F.port_second = port;
                sp_test_proc_signal(p, SIGKILL);
                break;
            }
    }
}

static sp_status f_begin(void *ctx, int B, int max_length, sp_err *err)
{
    (void)ctx;
    return F.inner.begin(F.inner.ctx, B, max_length, err);
}

/* Before forward call F.calls: the server of F.block hit when it is F.at (1 if so). */
static int f_hit(void)
{
    int hit = F.calls++ == F.at;
    if (hit) {
        F.port_hit = port_of_hop(F.rt, &F.sw->route, F.block);
        sp_test_proc *p = proc_at(F.port_hit);
        ck_assert_msg(p != NULL, "the server of block %d (port %d) is not ours", F.block, F.port_hit);
        double t_sig = sp_now_s();
        if (F.sig == SIGSTOP)
            kill(p->pid, SIGSTOP);
        else
            F.exit_status = sp_test_proc_signal(p, F.sig); /* (SIGTERM and SIGKILL: returns once it has exited) */
        F.exit_s = sp_now_s() - t_sig;
    }
    return hit;
}

static void f_took(int hit, double dt)
{
    F.port_now = port_of_hop(F.rt, &F.sw->route, F.block);
    if (hit)
        F.stall = dt;
    else if (F.calls > 1 && dt > F.normal)
        F.normal = dt;
}

static sp_status f_forward(void *ctx, const int32_t *ids, int B, int T, float *logits, sp_err *err)
{
    (void)ctx;
    int hit = f_hit();
    double t0 = sp_now_s();
    sp_status st = F.inner.forward(F.inner.ctx, ids, B, T, logits, err);
    f_took(hit, sp_now_s() - t0);
    return st;
}

/* greedy steps (the head's exact argmax) */
static sp_status f_forward_argmax(void *ctx, const int32_t *ids, int B, int T, int32_t *best, sp_err *err)
{
    (void)ctx;
    int hit = f_hit();
    double t0 = sp_now_s();
    sp_status st = F.inner.forward_argmax(F.inner.ctx, ids, B, T, best, err);
    f_took(hit, sp_now_s() - t0);
    return st;
}

static sp_status f_reorder(void *ctx, const int64_t *src, int B, sp_err *err)
{
    (void)ctx;
    return F.inner.reorder(F.inner.ctx, src, B, err);
}

static void f_end(void *ctx)
{
    (void)ctx;
    F.inner.end(F.inner.ctx);
}

/* The swarm LM of rt, hit as F says. */
static sp_lm faulty_lm(sp_runtime *rt, sp_lm_swarm *sw)
{
    F.rt = rt;
    F.sw = sw;
    F.inner = sp_lm_swarm_make(sw, rt);
    F.calls = 0;
    sp_lm lm = F.inner;
    lm.ctx = &F;
    lm.begin = f_begin;
    lm.forward = f_forward;
    lm.forward_argmax = f_forward_argmax;
    lm.reorder = f_reorder;
    lm.end = f_end;
    return lm;
}

/* ---------------------------------------------------------------------------------------------- */

typedef struct want_n {
    sp_runtime *rt;
    int n;
} want_n;

static int has_online(void *u)
{
    want_n *w = u;
    return sp_test_count_online(w->rt) >= w->n;
}

/* Inference steps pushed from server to server even on loopback (the push setting's auto would not): the failures
 * below hit pushed steps. */
static void push_on(sp_runtime *rt)
{
    sp_rt_settings set;
    sp_runtime_settings(rt, &set);
    set.push = SP_PUSH_ON;
    sp_runtime_set_settings(rt, &set);
}

/* Blocks the servers in list ("" none). */
static void block_servers(sp_runtime *rt, const char *list)
{
    sp_rt_settings set;
    sp_runtime_settings(rt, &set);
    snprintf(set.blocked, sizeof set.blocked, "%s", list);
    sp_runtime_set_settings(rt, &set);
}

/* A client of procs[0]'s swarm that has found n servers online. */
static sp_runtime *client(int n)
{
    sp_runtime *rt = NULL;
    sp_err err = {0};
    char peers[64];
    snprintf(peers, sizeof peers, "127.0.0.1:%d", procs[0].dht_port);
    ck_assert_int_eq(sp_runtime_new(&rt, on_event, NULL, &err), SP_OK);
    sp_test_update_period(rt, 1);
    sp_test_wire_f32(rt); /* outputs compared with the run without a failure to 1e-5 */
    push_on(rt);
    ck_assert_msg(sp_runtime_load(rt, M15, &err) == SP_OK, "%s", err.msg);
    ck_assert_msg(sp_runtime_join(rt, peers, &err) == SP_OK, "%s", err.msg);
    want_n w = {rt, n};
    ck_assert_msg(sp_test_wait_for(has_online, &w, 20), "found %d of %d servers", sp_test_count_online(rt), n);
    return rt;
}

/* Servers for the spans (the first starts the swarm), and a client that has found them all. */
static sp_runtime *swarm(const char *const *spans, int n)
{
    memset(&F, 0, sizeof F);
    for (int i = 0; i < n; i++)
        server(spans[i]);
    return client(n);
}

static const int32_t PROMPT[] = {1, 9038, 2501, 263, 931, 29892, 727, 471}; /* <s> Once upon a time, there was */
#define PROMPT_LEN 8

static void gen_opts(sp_gen_opts *o, int mode)
{
    sp_gen_opts_default(o);
    o->max_new = 16;
    o->stop_at_eos = 0;
    o->sample.seed = 7;
    if (mode == 1) { /* seeded sampling */
        o->sample.temperature = 0.9f;
        o->sample.top_p = 0.95f;
    } else if (mode == 2) {
        o->beams = 3;
    }
}

/* What every block run in this process gives. */
static void reference(const sp_gen_opts *o, sp_gen_result *out)
{
    sp_err err = {0};
    sp_model *all = NULL;
    ck_assert_int_eq(sp_model_load(&all, M15, SP_LOAD_ALL, 0, -1, &err), SP_OK);
    sp_lm_local loc;
    sp_lm lm = sp_lm_local_make(&loc, all);
    const int32_t *pp = PROMPT;
    int len = PROMPT_LEN;
    ck_assert_msg(sp_generate(&lm, NULL, &pp, &len, 1, o, NULL, NULL, out, &err) == SP_OK, "%s", err.msg);
    sp_model_free(all);
}

static void same_tokens(const sp_gen_result *a, const sp_gen_result *b)
{
    ck_assert_int_eq(a->n[0], b->n[0]);
    for (int t = 0; t < a->n[0]; t++)
        ck_assert_msg(a->ids[0][t] == b->ids[0][t], "token %d: %d vs %d without the failure", t, a->ids[0][t],
                      b->ids[0][t]);
}

/* Generates (mode: gen_opts') through rt, hit as F says: the tokens must be those of the reference (want, got:
 * both results, the caller frees them; sw: the swarm LM it ran). */
static void generate_same(sp_runtime *rt, int mode, sp_lm_swarm *sw, sp_gen_result *want, sp_gen_result *got)
{
    sp_gen_opts o;
    gen_opts(&o, mode);
    reference(&o, want);
    sp_lm lm = faulty_lm(rt, sw);
    sp_err err = {0};
    const int32_t *pp = PROMPT;
    int len = PROMPT_LEN;
    ck_assert_msg(sp_generate(&lm, NULL, &pp, &len, 1, &o, NULL, NULL, got, &err) == SP_OK, "%s", err.msg);
    same_tokens(got, want);
}

/* Generates with the server of block F.block hit before forward call F.at; the tokens must be those of the
 * reference. */
static void generate_through_failure(sp_runtime *rt, int mode)
{
    sp_gen_result want, got;
    sp_lm_swarm sw;
    generate_same(rt, mode, &sw, &want, &got);
    ck_assert_msg(F.port_hit > 0, "no server was hit");
    ck_assert_msg(sw.retries >= 1, "no failure was met");
    ck_assert_int_ge(F.reroutes, 1);
    if (mode == 2)
        ck_assert_float_eq_tol(got.best_score, want.best_score, 1e-4);
    printf("failover (mode %d, hit before call %d): %d retries; the step took %.3f s (others at most %.3f s)\n",
           mode, F.at, sw.retries, F.stall, F.normal);
    sp_gen_result_free(&want);
    sp_gen_result_free(&got);
}

static const char *const SPANS[] = {"0:6", "0:3", "3:6", "0:3", "3:6"};

START_TEST(t_kill_greedy_decode)
{
    sp_runtime *rt = swarm(SPANS, 5);
    F.at = 5, F.block = 4, F.sig = SIGKILL;
    generate_through_failure(rt, 0);
    sp_runtime_free(rt);
    stop_all();
}
END_TEST

START_TEST(t_kill_greedy_prefill)
{
    sp_runtime *rt = swarm(SPANS, 5);
    F.at = 0, F.block = 0, F.sig = SIGKILL;
    generate_through_failure(rt, 0);
    sp_runtime_free(rt);
    stop_all();
}
END_TEST

START_TEST(t_kill_sampling)
{
    sp_runtime *rt = swarm(SPANS, 5);
    F.at = 7, F.block = 2, F.sig = SIGKILL;
    generate_through_failure(rt, 1);
    sp_runtime_free(rt);
    stop_all();
}
END_TEST

START_TEST(t_kill_beams)
{
    sp_runtime *rt = swarm(SPANS, 5);
    F.at = 6, F.block = 5, F.sig = SIGKILL; /* beams have reordered the caches by then */
    generate_through_failure(rt, 2);
    sp_runtime_free(rt);
    stop_all();
}
END_TEST

/* A server stopped with SIGTERM mid-generation tells its session why before it goes ("shutting down"), the
 * client routes around it at once, and the tokens are the same. */
START_TEST(t_term_server_in_use)
{
    sp_runtime *rt = swarm(SPANS, 5);
    F.at = 5, F.block = 4, F.sig = SIGTERM;
    generate_through_failure(rt, 0);
    if (!strstr(F.last_retry, "shutdown: the server is shutting down"))
        for (int i = 0; i < nprocs; i++) {
            FILE *f = fopen(procs[i].log, "r");
            char line[512];
            while (f && fgets(line, sizeof line, f))
                fprintf(stderr, "  server %d| %s", procs[i].port, line);
            if (f)
                fclose(f);
        }
    ck_assert_msg(strstr(F.last_retry, "shutdown: the server is shutting down"), "the client was not told why: %s",
                  F.last_retry);
    /* it shut down on its own, all the way (how fast is bench_failover's figure: goal 200 ms) */
    fprintf(stderr, "SIGTERM in use: the server exited %.3f s after the signal\n", F.exit_s);
    ck_assert_msg(WIFEXITED(F.exit_status) && WEXITSTATUS(F.exit_status) == 0,
                  "the server did not exit cleanly after SIGTERM (wait status 0x%x)", F.exit_status);
    sp_runtime_free(rt);
    stop_all();
}
END_TEST

/* The replacement dies too, while it replays the history. */
START_TEST(t_second_failure_in_recovery)
{
    sp_runtime *rt = swarm(SPANS, 5);
    F.at = 4, F.block = 1, F.sig = SIGKILL, F.kill_replacement = 1;
    generate_through_failure(rt, 0);
    ck_assert_msg(F.port_second > 0 && F.port_second != F.port_hit, "the replacement was not killed");
    ck_assert_int_ge(F.reroutes, 2);
    sp_runtime_free(rt);
    stop_all();
}
END_TEST

static int sessions_of(int port)
{
    sp_remote *r = NULL;
    sp_err err = {0};
    if (sp_remote_connect(&r, "127.0.0.1", port, 1, 2000, &err))
        return -1;
    sp_info_reply a;
    int n = sp_remote_get_info(r, &a, 2000, &err) ? -1 : a.sessions;
    sp_remote_close(r);
    return n;
}

static int no_sessions(void *u) { return sessions_of(*(int *)u) == 0; }

/* A hung server: the step times out, the replacement replays, the tokens are the same; once the server
 * wakes it frees the session the client gave up. */
START_TEST(t_hung_server)
{
    sp_runtime *rt = swarm(SPANS, 5);
    F.at = 6, F.block = 3, F.sig = SIGSTOP;
    generate_through_failure(rt, 0);
    sp_test_proc *p = proc_at(F.port_hit);
    ck_assert_ptr_nonnull(p);
    /* the step's own timeout (2 s and 20 expected step times) gave up on it, not the connection */
    fprintf(stderr, "hung server: the step took %.2f s; %s\n", F.stall, F.last_retry);
    ck_assert_msg(strstr(F.last_retry, "no reply from") && strstr(F.last_retry, " ms; banned"),
                  "the hung server was not given up on by the step timeout: %s", F.last_retry);
    kill(p->pid, SIGCONT);
    ck_assert_msg(sp_test_wait_for(no_sessions, &F.port_hit, 10), "the woken server still holds %d sessions",
                  sessions_of(F.port_hit));
    sp_runtime_free(rt);
    stop_all();
}
END_TEST

/* A route's sessions are opened at once (over far links one round trip, not one a hop): with the first hop's
 * server hung, the second hop's server holds the generation's session while the first's OPEN still waits; woken,
 * the first answers and the tokens are the reference's. */
typedef struct gen_thread {
    sp_runtime *rt;
    sp_gen_opts o;
    sp_gen_result got;
    sp_status st;
    sp_err err;
} gen_thread;

static void *gen_main(void *arg)
{
    gen_thread *g = arg;
    sp_lm_swarm sw;
    sp_lm lm = sp_lm_swarm_make(&sw, g->rt);
    const int32_t *pp = PROMPT;
    int len = PROMPT_LEN;
    g->st = sp_generate(&lm, NULL, &pp, &len, 1, &g->o, NULL, NULL, &g->got, &g->err);
    return NULL;
}

static int holds_session(void *u) { return sessions_of(*(int *)u) == 1; }

START_TEST(t_sessions_opened_at_once)
{
    static const char *const spans[] = {"3:6", "0:3"}; /* (the DHT's first node is the second hop's server) */
    sp_runtime *rt = swarm(spans, 2);
    gen_thread g = {.rt = rt};
    gen_opts(&g.o, 0);
    sp_gen_result want;
    reference(&g.o, &want);
    kill(procs[1].pid, SIGSTOP); /* blocks 0:3: the first hop */
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, gen_main, &g), 0);
    /* the first hop's OPEN waits at least 5 s for its hung server: the second's came at the same time */
    int second = procs[0].port, opened = sp_test_wait_for(holds_session, &second, 3);
    int first_sessions = -1;
    kill(procs[1].pid, SIGCONT);
    pthread_join(th, NULL);
    first_sessions = sessions_of(procs[1].port);
    ck_assert_msg(opened, "the second hop's server got no session while the first hop's server was hung: the "
                          "sessions were opened one after another");
    ck_assert_msg(g.st == SP_OK, "%s", g.err.msg);
    same_tokens(&g.got, &want);
    printf("sessions at once: the second hop's session was open while the first's server hung; after the "
           "generation the first holds %d\n", first_sessions);
    sp_gen_result_free(&want);
    sp_gen_result_free(&g.got);
    sp_runtime_free(rt);
    stop_all();
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* training chains */

/* FORWARD then BACKWARD over a training route through the swarm; victim: 0 none, 1 the hop holding
 * block 4 dies before the forward, 2 before the backward (it kept the activations). */
static int chain_run(sp_runtime *rt, const float *x, const float *g0, const float *prompts, int B, int T, int P,
                     float *y, float *g, float *gp, int victim)
{
    int H = sp_runtime_config(rt)->hidden, L = sp_runtime_config(rt)->n_layers;
    size_t N = (size_t)B * T * H;
    sp_route route;
    sp_err err = {0};
    ck_assert_msg(sp_runtime_route_train(rt, &route, &err) == SP_OK, "%s", err.msg);
    float *bound = malloc((size_t)route.nstages * N * sizeof(float));
    memcpy(y, x, N * sizeof(float));
    memcpy(g, g0, N * sizeof(float));
    memset(gp, 0, (size_t)L * B * P * H * sizeof(float));
    if (victim == 1) {
        F.port_hit = port_of_hop(rt, &route, 4);
        ck_assert_ptr_nonnull(proc_at(F.port_hit));
        sp_test_proc_signal(proc_at(F.port_hit), SIGKILL);
    }
    ck_assert_msg(sp_runtime_forward(rt, &route, y, B, T, prompts, P, bound, NULL, &err) == SP_OK, "%s", err.msg);
    if (victim == 2) {
        F.port_hit = port_of_hop(rt, &route, 4);
        ck_assert_ptr_nonnull(proc_at(F.port_hit));
        sp_test_proc_signal(proc_at(F.port_hit), SIGKILL);
    }
    ck_assert_msg(sp_runtime_backward(rt, &route, g, B, T, prompts, P, bound, gp, NULL, &err) == SP_OK, "%s", err.msg);
    free(bound);
    return route.nstages;
}

START_TEST(t_kill_training)
{
    sp_runtime *rt = swarm(SPANS, 5);
    int B = 2, T = 6, P = 2, H = sp_runtime_config(rt)->hidden, L = sp_runtime_config(rt)->n_layers;
    size_t N = (size_t)B * T * H, NP = (size_t)L * B * P * H;
    sp_rng r;
    sp_rng_seed(&r, 11);
    float *x = malloc(N * 4), *g0 = malloc(N * 4), *prompts = malloc(NP * 4);
    sp_rng_fill_normal(&r, x, (long)N, 1.0f);
    sp_rng_fill_normal(&r, g0, (long)N, 1.0f);
    sp_rng_fill_normal(&r, prompts, (long)NP, 0.1f);
    float *y[3], *g[3], *gp[3];
    for (int v = 0; v < 3; v++) {
        y[v] = malloc(N * 4), g[v] = malloc(N * 4), gp[v] = malloc(NP * 4);
        int before = F.retries;
        uint64_t pushed = rt->passes_pushed;
        int stages = chain_run(rt, x, g0, prompts, B, T, P, y[v], g[v], gp[v], v);
        if (v)
            ck_assert_msg(F.retries > before, "victim %d: no failure was met", v);
        /* push on: over 2 servers or more (the route is drawn by throughput) both passes went pushed, the failure
         * met in the first (victim 1) or in the second (2) */
        printf("training passes, victim %d: %d stages, %d passes pushed\n", v, stages, (int)(rt->passes_pushed - pushed));
        if (stages > 1)
            ck_assert_int_eq((int)(rt->passes_pushed - pushed), 2);
    }
    for (int v = 1; v < 3; v++) {
        ck_assert_msg(sp_max_abs_diff(y[v], y[0], N) <= 1e-5, "outputs differ by %g", sp_max_abs_diff(y[v], y[0], N));
        ck_assert_msg(sp_max_abs_diff(g[v], g[0], N) <= 1e-5, "input grads differ by %g", sp_max_abs_diff(g[v], g[0], N));
        ck_assert_msg(sp_max_abs_diff(gp[v], gp[0], NP) <= 1e-5, "prompt grads differ by %g",
                      sp_max_abs_diff(gp[v], gp[0], NP));
    }
    double gn = 0;
    for (size_t i = 0; i < NP; i++)
        gn += fabs(gp[0][i]);
    ck_assert_msg(gn > 0, "prompt gradients are all zero");
    for (int v = 0; v < 3; v++)
        free(y[v]), free(g[v]), free(gp[v]);
    free(x), free(g0), free(prompts);
    sp_runtime_free(rt);
    stop_all();
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* mixed versions: servers that cannot take pushed inputs */

/* Pushed steps (n_steps) and passes (n_passes) that one generation and one FORWARD + BACKWARD with push on sent, and
 * the refusals told meanwhile: the text is one process's, the passes' outputs and gradients those of push off, bit
 * for bit. */
static void push_through(sp_runtime *rt, int *n_steps, int *n_passes, int *refusals)
{
    sp_gen_result want, got;
    sp_lm_swarm sw;
    uint64_t steps = rt->steps_pushed, passes = rt->passes_pushed;
    int before = F.refusals;
    F.at = -1; /* no server hit */
    generate_same(rt, 0, &sw, &want, &got);
    sp_gen_result_free(&want);
    sp_gen_result_free(&got);
    int B = 2, T = 5, P = 2, H = sp_runtime_config(rt)->hidden, L = sp_runtime_config(rt)->n_layers;
    size_t N = (size_t)B * T * H, NP = (size_t)L * B * P * H;
    sp_rng r;
    sp_rng_seed(&r, 5);
    float *x = malloc(N * 4), *g0 = malloc(N * 4), *prompts = malloc(NP * 4), *y[2], *g[2], *gp[2];
    sp_rng_fill_normal(&r, x, (long)N, 1.0f);
    sp_rng_fill_normal(&r, g0, (long)N, 1.0f);
    sp_rng_fill_normal(&r, prompts, (long)NP, 0.1f);
    for (int k = 0; k < 2; k++) { /* k 0: push on; 1: off */
        y[k] = malloc(N * 4), g[k] = malloc(N * 4), gp[k] = malloc(NP * 4);
        sp_rt_settings set;
        sp_runtime_settings(rt, &set);
        set.push = k ? SP_PUSH_OFF : SP_PUSH_ON;
        sp_runtime_set_settings(rt, &set);
        ck_assert_int_eq(chain_run(rt, x, g0, prompts, B, T, P, y[k], g[k], gp[k], 0), 3);
        if (!k)
            *n_passes = (int)(rt->passes_pushed - passes);
    }
    push_on(rt);
    ck_assert_msg(!memcmp(y[0], y[1], N * 4), "pushed forward differs from client-driven");
    ck_assert_msg(!memcmp(g[0], g[1], N * 4), "pushed backward differs from client-driven");
    ck_assert_msg(!memcmp(gp[0], gp[1], NP * 4), "pushed prompt gradients differ from client-driven");
    *n_steps = (int)(rt->steps_pushed - steps);
    *refusals = F.refusals - before;
    for (int k = 0; k < 2; k++)
        free(y[k]), free(g[k]), free(gp[k]);
    free(x), free(g0), free(prompts);
}

/* A swarm of new servers and older ones (SEPAL_SERVER_OLD), push on: blocks 0:2 and 4:6 on new servers, 2:4 either
 * on a server from before push (it says no capabilities) or on one that says it can but refuses requests that await
 * their input (bad_request), the other one blocked. Through the first, nothing is pushed and nothing refused; through
 * the second, the first step and the first FORWARD are pushed, refused, go on client-driven and are remembered: no
 * push through it after that. Every generation gives one process's text, every pass push off's bits. */
START_TEST(t_push_older_servers)
{
    memset(&F, 0, sizeof F);
    server("0:2");
    setenv("SEPAL_SERVER_OLD", "nopush", 1);
    int old = server("2:4")->port;
    setenv("SEPAL_SERVER_OLD", "await", 1);
    int liar = server("2:4")->port;
    unsetenv("SEPAL_SERVER_OLD");
    server("4:6");
    sp_runtime *rt = client(4);
    for (int k = 0; k < 2; k++) { /* k 0: through the server from before push; 1: through the one that refuses */
        char blocked[32];
        snprintf(blocked, sizeof blocked, "127.0.0.1:%d", k ? old : liar);
        block_servers(rt, blocked);
        for (int round = 0; round < 2; round++) {
            int steps, passes, refusals;
            push_through(rt, &steps, &passes, &refusals);
            printf("push through %s, round %d: %d steps and %d passes pushed, %d refusals\n",
                   k ? "a server that refuses awaits" : "a server from before push", round, steps, passes, refusals);
            int first = k && !round;
            ck_assert_int_eq(steps, first);
            ck_assert_int_eq(passes, first);
            ck_assert_int_eq(refusals, 2 * first);
        }
    }
    sp_server_row e;
    ck_assert_int_ge(sp_test_server_at(rt, liar, 1, &e), 0);
    ck_assert_int_eq(e.rec.caps, SP_CAPS_ALL);
    ck_assert_int_eq(e.refused_caps, SP_CAPS_ALL); /* steps and passes: remembered */
    ck_assert_int_ge(sp_test_server_at(rt, old, 1, &e), 0);
    ck_assert_int_eq(e.rec.caps, 0);
    sp_runtime_free(rt);
    stop_all();
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* the trainer: prompt tuning (sst2, deep prompts) through the swarm, its server of blocks 3:6 killed between two
 * steps (the next FORWARD meets the dead server) or inside a step, after its FORWARD kept the activations and
 * before its BACKWARD (in the task's loss): every step's loss, and the parameters after every step, equal those
 * of the same run without the failure (1e-5). The replacement is blocked until the first retry, so the route
 * of the run without failure, and of the failed step, is the one through the victim. */

#define TR_STEPS 3

static sepal_task kill_task;  /* sst2, with a loss that kills the victim at its kill_at-th call */
static int loss_calls, kill_at = -1;
static sp_test_proc *victim;

static sepal_tensor *kill_loss(void *task, const sepal_host *host, sepal_tensor *logits, const sepal_batch *b)
{
    (void)task;
    if (__atomic_fetch_add(&loss_calls, 1, __ATOMIC_SEQ_CST) == kill_at && victim) {
        F.port_hit = victim->port;
        sp_test_proc_signal(victim, SIGKILL);
    }
    return host->cross_entropy(host->ctx, logits, b->labels); /* what the trainer does for sst2 */
}

static void trainer_opts(sp_train_opts *o, int micro)
{
    sp_train_opts_default(o);
    o->tuning = SP_TUNE_DEEP;
    o->pre_seq_len = 4;
    o->max_length = 24;
    o->batch = 8;
    o->microbatches = micro;
    o->schedule = SP_SCHED_1F1B;
    o->seed = 21;
    o->device = 0;
}

/* TR_STEPS steps; losses into loss, the flattened parameters after each step into params[s] (malloc'd).
 * between: the victim is killed after step 1 (before step 2's FORWARD); in_step: at the loss call kill_at. */
static int64_t train_steps(sp_runtime *rt, int micro, int between, float *loss, float **params)
{
    sp_plugin_register_builtins();
    const sepal_task *sst2 = sp_plugin_find("sst2");
    ck_assert_ptr_nonnull(sst2);
    kill_task = *sst2;
    kill_task.loss = kill_loss;
    loss_calls = 0;
    sp_train_opts o;
    trainer_opts(&o, micro);
    sp_trainer *t = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_trainer_new(&t, rt, NULL, &kill_task, "", &o, &err) == SP_OK, "%s", err.msg);
    int64_t total = 0;
    for (int s = 0; s < TR_STEPS; s++) {
        if (between && s == 2 && victim) {
            F.port_hit = victim->port;
            sp_test_proc_signal(victim, SIGKILL);
            /* the replacement is usable from now on: a ping may find the victim down before step 2 meets it
             * (on a slow machine), and then no retry comes to unblock it */
            pthread_mutex_lock(&rt->lock);
            rt->set.blocked[0] = '\0';
            pthread_mutex_unlock(&rt->lock);
        }
        int idx[8];
        for (int i = 0; i < 8; i++)
            idx[i] = (17 + 131 * (s * 8 + i)) % 2000;
        ck_assert_msg(sp_trainer_step(t, idx, 8, &loss[s], &err) == SP_OK, "step %d: %s", s, err.msg);
        sp_t **p;
        int np = sp_trainer_params(t, &p);
        total = 0;
        for (int i = 0; i < np; i++)
            total += p[i]->n;
        float *q = params[s] = malloc((size_t)total * sizeof(float));
        for (int i = 0; i < np; i++, q += p[i - 1]->n)
            memcpy(q, p[i]->data, (size_t)p[i]->n * sizeof(float));
    }
    sp_trainer_free(t);
    return total;
}

static void trainer_through_failure(int micro, int between)
{
    FILE *f = fopen(SEPAL_SENTIMENT_DIR "/imdb.json", "r");
    ck_assert_msg(f != NULL, "no sentiment data: run scripts/fetch-sentiment.sh first");
    fclose(f);
    const char *spans[] = {"0:3", "3:6", "3:6"};
    sp_runtime *rt = swarm(spans, 3);
    victim = &procs[1];
    char blocked[64];
    snprintf(blocked, sizeof blocked, "127.0.0.1:%d", procs[2].port);
    block_servers(rt, blocked); /* the replacement */
    float want[TR_STEPS], got[TR_STEPS], *pw[TR_STEPS], *pg[TR_STEPS];
    kill_at = -1;
    int64_t n = train_steps(rt, micro, 0, want, pw); /* without failure, through the victim */
    ck_assert_int_eq(F.retries, 0);
    F.rt = rt;
    F.unblock = 1; /* the replacement becomes usable at the first retry */
    kill_at = between ? -1 : micro; /* the first microbatch of step 1, between its FORWARD and BACKWARD */
    uint64_t pushed = rt->passes_pushed;
    int64_t n2 = train_steps(rt, micro, between, got, pg);
    ck_assert_int_eq(n2, n);
    ck_assert_msg(rt->passes_pushed > pushed, "no pass was pushed"); /* push on: the failure met a pushed pass */
    ck_assert_msg(F.port_hit == procs[1].port && procs[1].pid == 0, "the victim was not killed");
    if (between && !F.retries) {
        /* no request reached the dead victim (one would have failed): its ping found it down first, or the
         * training route (random by throughput, the replacement unblocked at the kill) chose the replacement */
        int down = 0;
        pthread_mutex_lock(&rt->lock);
        for (int i = 0; i < rt->nservers; i++)
            down |= rt->servers[i]->rec.port == procs[1].port && rt->servers[i]->down;
        pthread_mutex_unlock(&rt->lock);
        printf("killed between steps: no request met the victim (%s)\n",
               down ? "a ping found it down first" : "the route chose the replacement");
    } else {
        ck_assert_msg(F.retries >= 1, "no failure was met");
        ck_assert_msg(strstr(F.last_retry, ":") && F.reroutes >= 1, "no re-route: %s", F.last_retry);
        char port[16];
        snprintf(port, sizeof port, ":%d", procs[1].port);
        ck_assert_msg(strstr(F.last_retry, port), "the retry does not name the victim: %s", F.last_retry);
    }
    for (int s = 0; s < TR_STEPS; s++) {
        ck_assert_msg(isfinite(want[s]) && want[s] > 0, "step %d: loss %g", s, want[s]);
        ck_assert_msg(fabsf(got[s] - want[s]) <= 1e-5f * fmaxf(1.0f, fabsf(want[s])),
                      "step %d: loss %.7f through the failure, %.7f without", s, got[s], want[s]);
        double d = sp_max_abs_diff(pg[s], pw[s], (size_t)n);
        ck_assert_msg(d <= 1e-5, "step %d: parameters differ by %g from the run without failure", s, d);
        if (s)
            ck_assert_msg(sp_max_abs_diff(pw[s], pw[s - 1], (size_t)n) > 1e-4, "step %d changed nothing", s);
        printf("trainer, %d microbatch(es), victim killed %s: step %d loss %.6f (without failure %.6f), "
               "parameters within %g\n", micro, between ? "between steps" : "inside step 1", s, got[s], want[s], d);
    }
    for (int s = 0; s < TR_STEPS; s++) /* (after the loop: step s compares with step s - 1's) */
        free(pw[s]), free(pg[s]);
    printf("trainer: %d retries, %d re-routes; last retry: %s\n", F.retries, F.reroutes, F.last_retry);
    victim = NULL;
    sp_runtime_free(rt);
    stop_all();
}

START_TEST(t_kill_trainer_between_steps) { trainer_through_failure(1, 1); }
END_TEST

START_TEST(t_kill_trainer_in_step) { trainer_through_failure(1, 0); }
END_TEST

START_TEST(t_kill_trainer_pipelined) { trainer_through_failure(2, 0); }
END_TEST

/* ---------------------------------------------------------------------------------------------- */

/* The policy's pauses, counted (the clock is the real one). */
static double slept_s;

static double real_now(void *user)
{
    (void)user;
    return sp_now_s();
}

static void counted_sleep(void *user, double s)
{
    (void)user;
    slept_s += s;
    sleep_ms((int)(s * 1000));
}

static const sp_rt_clock counted_clock = {real_now, counted_sleep, NULL};

/* Generates greedily through rt (F says whom to hit): the status, the error in err. */
static sp_status generate_status(sp_runtime *rt, sp_err *err)
{
    sp_gen_opts o;
    gen_opts(&o, 0);
    sp_lm_swarm sw;
    sp_lm lm = faulty_lm(rt, &sw);
    const int32_t *pp = PROMPT;
    int len = PROMPT_LEN;
    sp_gen_result got;
    sp_status st = sp_generate(&lm, NULL, &pp, &len, 1, &o, NULL, NULL, &got, err);
    if (!st)
        sp_gen_result_free(&got);
    return st;
}

/* Nobody holds blocks 3:6 any more (their only server killed, its record still fresh in the DHT) and nobody is
 * joining: the generation fails at once, without a pause, naming the dead server and saying that no other holds
 * the blocks; so does the next one, before its first token, with no retry at all. */
START_TEST(t_no_server_left)
{
    const char *spans[] = {"0:3", "3:6"};
    sp_runtime *rt = swarm(spans, 2);
    rt->clock = &counted_clock;
    slept_s = 0;
    F.at = 3, F.block = 4, F.sig = SIGKILL;
    sp_err err = {0};
    ck_assert_int_eq(generate_status(rt, &err), SP_ERR_NOTFOUND);
    printf("no server left: %s (%d retry event, %.1f s of pauses)\n", err.msg, F.retries, slept_s);
    char dead[96];
    snprintf(dead, sizeof dead, "no server could run blocks 3:6: 127.0.0.1:%d (blocks 3:6): ", F.port_hit);
    ck_assert_msg(strstr(err.msg, dead) &&
                      strstr(err.msg, "; no other server holds block 3 (of 0..5), and none is joining"),
                  "unclear error: %s", err.msg);
    ck_assert_int_eq(F.retries, 1); /* the failure itself */
    ck_assert_msg(slept_s == 0, "it paused %.1f s", slept_s);
    memset(&err, 0, sizeof err);
    F.at = -1;
    ck_assert_int_eq(generate_status(rt, &err), SP_ERR_NOTFOUND);
    printf("the next generation: %s\n", err.msg);
    ck_assert_msg(strstr(err.msg, "no server could run blocks 0:6: no online server holds block 3"), "%s", err.msg);
    ck_assert_int_eq(F.retries, 1);
    ck_assert_int_eq(F.calls, 0); /* no token was asked for */
    ck_assert_msg(slept_s == 0, "it paused %.1f s", slept_s);
    sp_runtime_free(rt);
    stop_all();
}
END_TEST

/* Entries of rt at 127.0.0.1:port: all of them (gone ones too), and those in the view (not gone). */
static int entries_at(sp_runtime *rt, int port, int *in_view)
{
    int n = 0;
    *in_view = 0;
    pthread_mutex_lock(&rt->lock);
    for (int i = 0; i < rt->nservers; i++)
        if (rt->servers[i]->rec.port == port) {
            n++;
            *in_view += !rt->servers[i]->gone;
        }
    pthread_mutex_unlock(&rt->lock);
    return n;
}

typedef struct lives {
    sp_runtime *rt;
    int port, n;
} lives;

static int seen_lives(void *u)
{
    lives *l = u;
    int in_view;
    return entries_at(l->rt, l->port, &in_view) >= l->n;
}

/* A server restarted at the same address gets a new id; the records of its earlier lives (killed, still fresh
 * in the DHT: announced every 30 s, stale after 90 s) must not stand for it. One server on port A, then a server
 * on port B started and killed (SIGKILL) four times and started a fifth time; a client joins: it holds one
 * record at B, the newest. The generation goes through B (A is blocked until the first retry), B is killed
 * in the middle of it, and the retry goes straight to A: one retry event, no pause, the same tokens. */
START_TEST(t_restarted_address)
{
    memset(&F, 0, sizeof F);
    server("0:6");
    int port_a = procs[0].port;
    sp_runtime *watch = client(1); /* sees each life announce itself before it is killed */
    sp_test_proc *b = server_at("0:6", 0, "30");
    int port_b = b->port;
    for (int k = 1; k <= 4; k++) {
        lives l = {watch, port_b, k};
        ck_assert_msg(sp_test_wait_for(seen_lives, &l, 20), "life %d at port %d never announced", k, port_b);
        sp_test_proc_signal(b, SIGKILL);
        b = server_at("0:6", port_b, "30");
        ck_assert_int_eq(b->port, port_b);
    }
    lives l = {watch, port_b, 5};
    ck_assert_msg(sp_test_wait_for(seen_lives, &l, 20), "the fifth life at port %d never announced", port_b);
    sp_runtime_free(watch);
    sp_runtime *rt = client(2);
    memset(&F, 0, sizeof F);
    sp_runtime_wait_view(rt, 5000); /* every record the DHT holds has arrived */
    int in_view, all = entries_at(rt, port_b, &in_view);
    printf("restarted address: %d records of port %d seen, %d in the view\n", all, port_b, in_view);
    ck_assert_msg(in_view == 1, "%d records at port %d in the view (one per address wanted)", in_view, port_b);
    rt->clock = &counted_clock;
    slept_s = 0;
    snprintf(rt->set.blocked, sizeof rt->set.blocked, "127.0.0.1:%d", port_a);
    F.unblock = 1;
    F.at = 5, F.block = 0, F.sig = SIGKILL;
    sp_gen_opts o;
    gen_opts(&o, 0);
    sp_gen_result want, got;
    reference(&o, &want);
    sp_lm_swarm sw;
    sp_lm lm = faulty_lm(rt, &sw);
    sp_err err = {0};
    const int32_t *pp = PROMPT;
    int len = PROMPT_LEN;
    ck_assert_msg(sp_generate(&lm, NULL, &pp, &len, 1, &o, NULL, NULL, &got, &err) == SP_OK, "%s", err.msg);
    printf("restarted address: the step that met the kill took %.3f s (others at most %.3f s); %d retry event(s), "
           "%.1f s of pauses; last: %s\n", F.stall, F.normal, F.retries, slept_s, F.last_retry);
    ck_assert_int_eq(F.port_hit, port_b);
    same_tokens(&got, &want);
    ck_assert_int_eq(F.retries, 1);
    ck_assert_msg(slept_s == 0, "it paused %.1f s", slept_s);
    ck_assert_int_eq(F.port_now, port_a);
    pthread_mutex_lock(&rt->lock);
    for (int i = 0; i < rt->nservers; i++)
        if (rt->servers[i]->rec.port == port_b)
            ck_assert_msg(rt->servers[i]->gone || rt->servers[i]->down, "a record at port %d is still usable", port_b);
    pthread_mutex_unlock(&rt->lock);
    sp_gen_result_free(&want);
    sp_gen_result_free(&got);
    sp_runtime_free(rt);
    stop_all();
}
END_TEST

/* The thread that starts a server must outlive it: the server's death signal (PR_SET_PDEATHSIG) follows
 * the thread that forked it. */
static int late_done;

static void *late_server(void *arg)
{
    server(arg);
    while (!__atomic_load_n(&late_done, __ATOMIC_SEQ_CST))
        sleep_ms(10);
    return NULL;
}

static int joining_at(void *u)
{
    sp_runtime *rt = u;
    int n = 0;
    pthread_mutex_lock(&rt->lock);
    for (int i = 0; i < rt->nservers; i++)
        n += !rt->servers[i]->gone && rt->servers[i]->rec.state == SP_SERVER_JOINING && rt->servers[i]->rec.start == 3;
    pthread_mutex_unlock(&rt->lock);
    return n > 0;
}

/* Blocks 3:6 lose their server while another is joining for them (announced, still loading): the client waits
 * for it, saying so at each retry, and the generation goes on there. */
START_TEST(t_server_joins_later)
{
    const char *spans[] = {"0:3", "3:6"};
    sp_runtime *rt = swarm(spans, 2);
    F.at = 3, F.block = 4, F.sig = SIGKILL;
    pthread_t th;
    int joined = 0;
    setenv("SEPAL_SERVER_LOAD_DELAY", "5", 1); /* it stays JOINING for 5 s */
    sp_gen_opts o;
    gen_opts(&o, 0);
    sp_gen_result want, got;
    reference(&o, &want);
    sp_lm_swarm sw;
    sp_lm lm = faulty_lm(rt, &sw);
    sp_err err = {0};
    const int32_t *pp = PROMPT;
    int len = PROMPT_LEN;
    /* the new server announces itself JOINING, then loads for 5 s; the kill happens inside the generation, and
     * the retries (0, 1, 2, 4 s apart) wait for it */
    joined = !pthread_create(&th, NULL, late_server, (void *)"3:6");
    ck_assert(joined);
    ck_assert_msg(sp_test_wait_for(joining_at, rt, 20), "the client never saw the server joining");
    unsetenv("SEPAL_SERVER_LOAD_DELAY");
    sp_status st = sp_generate(&lm, NULL, &pp, &len, 1, &o, NULL, NULL, &got, &err);
    printf("a server joining: %s\n", F.last_retry);
    ck_assert_msg(strstr(F.last_retry, "no online server holds block 3 (of 0..5) yet; server ") &&
                      strstr(F.last_retry, "(blocks 3:6) is joining; retry "), "retry event: %s", F.last_retry);
    int port = F.port_now;
    ck_assert_msg(st == SP_OK, "%s", err.msg);
    same_tokens(&got, &want);
    ck_assert_int_eq(nprocs, 3);
    ck_assert_msg(port == procs[2].port, "blocks 3:6 ran at port %d, not on the server that joined (%d)", port,
                  procs[2].port);
    sp_gen_result_free(&want);
    sp_gen_result_free(&got);
    sp_runtime_free(rt);
    stop_all();
    __atomic_store_n(&late_done, 1, __ATOMIC_SEQ_CST);
    pthread_join(th, NULL);
}
END_TEST

/* Training's route at the start of a step: with nobody for blocks 3:6 it fails at once, saying so; with a server
 * joining for them it waits (a retry event each try, saying who joins) and routes through it. */
START_TEST(t_train_route_waits_for_joining)
{
    const char *spans[] = {"0:3"};
    sp_runtime *rt = swarm(spans, 1);
    sp_route r;
    sp_err err = {0};
    double t0 = sp_now_s();
    ck_assert_int_eq(sp_runtime_route_train(rt, &r, &err), SP_ERR_NOTFOUND);
    printf("training, nobody for 3:6: %s (%.3f s)\n", err.msg, sp_now_s() - t0);
    ck_assert_msg(strstr(err.msg, "no server could run blocks 0:6: no online server holds block 3 (of 0..5), and none "
                                  "is joining"), "%s", err.msg);
    ck_assert_int_eq(F.retries, 0);
    setenv("SEPAL_SERVER_LOAD_DELAY", "3", 1); /* it stays JOINING for 3 s */
    pthread_t th;
    ck_assert(!pthread_create(&th, NULL, late_server, (void *)"3:6"));
    ck_assert_msg(sp_test_wait_for(joining_at, rt, 20), "the client never saw the server joining");
    unsetenv("SEPAL_SERVER_LOAD_DELAY");
    memset(&err, 0, sizeof err);
    ck_assert_msg(sp_runtime_route_train(rt, &r, &err) == SP_OK, "%s", err.msg);
    printf("training, a server joining for 3:6: %d retry events, the last: %s\n", F.retries, F.last_retry);
    ck_assert_int_ge(F.retries, 1);
    ck_assert_msg(strstr(F.last_retry, "no online server holds block 3 (of 0..5) yet; server ") &&
                      strstr(F.last_retry, "(blocks 3:6) is joining; retry "), "retry event: %s", F.last_retry);
    ck_assert_int_eq(port_of_hop(rt, &r, 4), procs[1].port);
    sp_runtime_free(rt);
    stop_all();
    __atomic_store_n(&late_done, 1, __ATOMIC_SEQ_CST);
    pthread_join(th, NULL);
    __atomic_store_n(&late_done, 0, __ATOMIC_SEQ_CST);
}
END_TEST

/* A server that answers with non-finite values, or with ERROR replies, to valid requests (a broken or hostile
 * server: SEPAL_SERVER_FAULT makes a real sepal-server do it from its 4th compute request on) is banned like
 * a dead one, and the generation gives the same tokens elsewhere. One hop over all blocks is the cheapest
 * route, so the broken 0:6 server is the one used first. */
static void broken_server(const char *spec, const char *why)
{
    memset(&F, 0, sizeof F);
    setenv("SEPAL_SERVER_FAULT", spec, 1);
    server("0:6");
    unsetenv("SEPAL_SERVER_FAULT");
    server("0:3");
    server("3:6");
    sp_runtime *rt = NULL;
    sp_err err = {0};
    char peers[64];
    snprintf(peers, sizeof peers, "127.0.0.1:%d", procs[0].dht_port);
    ck_assert_int_eq(sp_runtime_new(&rt, on_event, NULL, &err), SP_OK);
    sp_test_update_period(rt, 1);
    sp_test_wire_f32(rt); /* outputs compared with the run without a failure to 1e-5 */
    push_on(rt);
    ck_assert_msg(sp_runtime_load(rt, M15, &err) == SP_OK, "%s", err.msg);
    ck_assert_msg(sp_runtime_join(rt, peers, &err) == SP_OK, "%s", err.msg);
    want_n w = {rt, 3};
    ck_assert_msg(sp_test_wait_for(has_online, &w, 20), "found %d of 3 servers", sp_test_count_online(rt));
    /* the broken server is the only one usable until it fails (a route by pings could skip it on a loaded
     * machine); then the others take over */
    char blocked[64];
    snprintf(blocked, sizeof blocked, "127.0.0.1:%d,127.0.0.1:%d", procs[1].port, procs[2].port);
    block_servers(rt, blocked);
    F.unblock = 1;
    sp_gen_opts o;
    gen_opts(&o, 0);
    sp_gen_result want, got;
    reference(&o, &want);
    F.at = -1; /* nobody is killed: the server breaks by itself */
    sp_lm_swarm sw;
    sp_lm lm = faulty_lm(rt, &sw);
    const int32_t *pp = PROMPT;
    int len = PROMPT_LEN;
    ck_assert_msg(sp_generate(&lm, NULL, &pp, &len, 1, &o, NULL, NULL, &got, &err) == SP_OK, "%s", err.msg);
    same_tokens(&got, &want);
    ck_assert_msg(sw.retries >= 1, "the broken server was never met (route: %d hops)", sw.route.nhops);
    ck_assert_msg(strstr(F.last_retry, why), "retry event does not say why: %s", F.last_retry);
    char port[16];
    snprintf(port, sizeof port, ":%d", procs[0].port);
    ck_assert_msg(strstr(F.last_retry, port), "retry event does not name the broken server: %s", F.last_retry);
    printf("broken server (%s): %s\n", spec, F.last_retry);
    sp_server_row e;
    ck_assert_int_ge(sp_test_server_at(rt, procs[0].port, 0, &e), 0);
    ck_assert_msg(e.banned_until > sp_runtime_now(rt), "the broken server is not banned");
    sp_gen_result_free(&want);
    sp_gen_result_free(&got);
    sp_runtime_free(rt);
    stop_all();
}

START_TEST(t_server_answers_nan) { broken_server("nan:3", "non-finite"); }
END_TEST

START_TEST(t_server_answers_error) { broken_server("error:3", "injected fault"); }
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* a saturated server (--max-queue-wait): busy, not failed */

/* A server of blocks 0:6 that refuses new sessions while its steps wait over 1 ms in its queue, its answers 20 ms
 * late (SEPAL_SERVER_FAULT=slow:20), and the load that saturates it (3 sessions stepping without pause: each step
 * waits for the pass before it, tens of ms), started once its INFO says so. */
static sp_test_proc *saturated_server(sp_test_load **load)
{
    setenv("SEPAL_SERVER_FAULT", "slow:20", 1);
    const char *extra[] = {"--max-queue-wait", "0.001", NULL};
    sp_test_proc *p = server_with("0:6", 0, "1", extra);
    unsetenv("SEPAL_SERVER_FAULT");
    sp_config cfg;
    sp_err err = {0};
    ck_assert_int_eq(sp_config_load(&cfg, M15, &err), SP_OK);
    *load = sp_test_load_start(p->port, 3, 0, 6, cfg.hidden);
    sp_remote *r = NULL;
    ck_assert_msg(sp_remote_connect(&r, "127.0.0.1", p->port, 1, 20000, &err) == SP_OK, "%s", err.msg);
    sp_info_reply info = {0};
    for (int k = 0; k < 3000 && !(info.queue_wait > info.max_queue_wait && info.max_queue_wait > 0); k++) {
        ck_assert_int_eq(sp_remote_get_info(r, &info, 20000, &err), SP_OK);
        sleep_ms(10);
    }
    ck_assert_msg(info.queue_wait > info.max_queue_wait, "never saturated: queue wait %.6f s, bound %g s",
                  info.queue_wait, info.max_queue_wait);
    sp_remote_close(r);
    return p;
}

/* Greedy through rt, the tokens those of the reference. */
static void generate_as_reference(sp_runtime *rt)
{
    sp_gen_result want, got;
    F.at = -1, F.block = 0; /* nobody is hit; F.port_now: the server of block 0 */
    sp_lm_swarm sw;
    generate_same(rt, 0, &sw, &want, &got);
    sp_gen_result_free(&want);
    sp_gen_result_free(&got);
}

/* S1 saturated (refusing new sessions), S2 idle, both of blocks 0:6. The client sees S2 blocked until the first
 * retry, so it opens on S1: refused ("overloaded"), S1 is busy (not banned, no failure counted), and the session
 * lands on S2 with the reference's tokens. Then, S1's record saying it is saturated, a new generation goes to S2
 * without a refusal. */
START_TEST(t_busy_server_routed_around)
{
    memset(&F, 0, sizeof F);
    sp_test_load *load;
    sp_test_proc *s1 = saturated_server(&load);
    sp_test_proc *s2 = server("0:6");
    int p1 = s1->port, p2 = s2->port;
    sp_runtime *rt = client(2);
    char blocked[64];
    snprintf(blocked, sizeof blocked, "127.0.0.1:%d", p2);
    block_servers(rt, blocked);
    F.unblock = 1;
    generate_as_reference(rt);
    printf("busy server: %d retry event(s); last: %s\n", F.retries, F.last_retry);
    ck_assert_int_eq(F.retries, 1);
    char who[160];
    snprintf(who, sizeof who, "127.0.0.1:%d (blocks 0:6) is busy: overloaded: decode steps wait ", p1);
    ck_assert_msg(strstr(F.last_retry, who) && strstr(F.last_retry, "; other servers first for 15 s; retry 1 of 8"),
                  "%s", F.last_retry);
    ck_assert_int_eq(F.port_now, p2);
    sp_server_row e;
    ck_assert_int_ge(sp_test_server_at(rt, p1, 1, &e), 0);
    ck_assert_msg(e.failures == 0 && e.banned_until == 0 && e.busy_until > 0, "S1: %d failures, banned until %.1f",
                  e.failures, e.banned_until);
    /* its record says it is saturated (published when that began): routing leaves it out, busy or not */
    pthread_mutex_lock(&rt->lock);
    for (int i = 0; i < rt->nservers; i++)
        rt->servers[i]->busy_until = 0;
    pthread_mutex_unlock(&rt->lock);
    for (int k = 0; k < 2000; k++) {
        ck_assert_int_ge(sp_test_server_at(rt, p1, 1, &e), 0);
        if (e.rec.max_queue_wait > 0 && e.rec.queue_wait > e.rec.max_queue_wait)
            break;
        sleep_ms(10);
    }
    ck_assert_msg(e.rec.queue_wait > e.rec.max_queue_wait, "S1's record: queue wait %g s, bound %g s",
                  e.rec.queue_wait, e.rec.max_queue_wait);
    F.retries = 0;
    generate_as_reference(rt);
    ck_assert_int_eq(F.retries, 0);
    ck_assert_int_eq(F.port_now, p2);
    sp_test_load_stop(load);
    sp_runtime_free(rt);
    stop_all();
}
END_TEST

/* The only server of the blocks saturated: the client waits and retries, each retry an event ("is busy ...; retry K
 * of N in S s"); with 2 retries it fails saying so; with the default 8, the load ends at the first retry and a
 * later one opens the session there (the server's queue wait forgets the load once nothing waits), with the
 * reference's tokens. */
START_TEST(t_busy_single_server)
{
    memset(&F, 0, sizeof F);
    sp_test_load *load;
    sp_test_proc *s1 = saturated_server(&load);
    sp_runtime *rt = client(1);
    rt->set.max_retries = 2;
    rt->clock = &counted_clock;
    slept_s = 0;
    sp_err err = {0};
    ck_assert_int_eq(generate_status(rt, &err), SP_ERR_BUSY);
    printf("busy single server: %s (%d retry events, %.1f s of pauses)\n", err.msg, F.retries, slept_s);
    char who[160];
    snprintf(who, sizeof who, "no server could run blocks 0:6 (2 retries): 127.0.0.1:%d (blocks 0:6): overloaded: ",
             s1->port);
    ck_assert_msg(strstr(err.msg, who), "%s", err.msg);
    ck_assert_int_eq(F.retries, 3);
    ck_assert_msg(strstr(F.last_retry, "is busy: ") && strstr(F.last_retry, "no retries left (2)"), "%s",
                  F.last_retry);
    rt->set.max_retries = 8;
    F.retries = 0;
    F.halt = load;
    generate_as_reference(rt);
    printf("busy single server, its load gone: %d retry events, %.1f s of pauses; last: %s\n", F.retries, slept_s,
           F.last_retry);
    ck_assert_int_ge(F.retries, 1);
    ck_assert_int_eq(F.port_now, s1->port);
    sp_test_load_stop(load);
    sp_runtime_free(rt);
    stop_all();
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("failover");
    TCase *tc = tcase_create("generation");
    tcase_set_timeout(tc, 180);
    tcase_add_test(tc, t_kill_greedy_decode);
    tcase_add_test(tc, t_term_server_in_use);
    tcase_add_test(tc, t_kill_greedy_prefill);
    tcase_add_test(tc, t_kill_sampling);
    tcase_add_test(tc, t_kill_beams);
    tcase_add_test(tc, t_second_failure_in_recovery);
    tcase_add_test(tc, t_hung_server);
    tcase_add_test(tc, t_sessions_opened_at_once);
    tcase_add_test(tc, t_server_answers_nan);
    tcase_add_test(tc, t_server_answers_error);
    suite_add_tcase(s, tc);
    TCase *tt = tcase_create("training");
    tcase_set_timeout(tt, 180);
    tcase_add_test(tt, t_kill_training);
    tcase_add_test(tt, t_kill_trainer_between_steps);
    tcase_add_test(tt, t_kill_trainer_in_step);
    tcase_add_test(tt, t_kill_trainer_pipelined);
    suite_add_tcase(s, tt);
    TCase *tp = tcase_create("push");
    tcase_set_timeout(tp, 180);
    tcase_add_test(tp, t_push_older_servers);
    suite_add_tcase(s, tp);
    TCase *te = tcase_create("swarm");
    tcase_set_timeout(te, 180);
    tcase_add_test(te, t_no_server_left);
    tcase_add_test(te, t_server_joins_later);
    tcase_add_test(te, t_train_route_waits_for_joining);
    tcase_add_test(te, t_restarted_address);
    tcase_add_test(te, t_busy_server_routed_around);
    tcase_add_test(te, t_busy_single_server);
    suite_add_tcase(s, te);
    return s;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    return sp_test_run(suite());
}
