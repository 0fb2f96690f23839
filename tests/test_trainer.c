/* test_trainer.c - prompt tuning of stories15M on the sentiment task: for AFAB and 1F1B over microbatches
 * (of different sequence lengths), through in-process servers laid out in several ways, the loss and every
 * trainable gradient equal the single-process baseline (all blocks here, one microbatch) within 1e-5; every
 * parameter gets a gradient; a few steps lower the loss; saved parameters load back. Needs
 * scripts/fetch-model.sh and scripts/fetch-sentiment.sh. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "generate.h"
#include "host.h"
#include "proto.h"
#include "rng.h"
#include "safetensors.h"
#include "runtime.h"
#include "server.h"
#include "testutil.h"
#include "timeutil.h"
#include "trainer.h"

#define M15 SEPAL_STORIES15M_DIR

static sp_server *srv[8];
static int nsrv;

static void need_data(void)
{
    struct stat sb;
    ck_assert_msg(stat(M15 "/model.safetensors", &sb) == 0, "no stories15M: run scripts/fetch-model.sh first");
    ck_assert_msg(stat(SEPAL_SENTIMENT_DIR "/imdb.json", &sb) == 0,
                  "no sentiment data: run scripts/fetch-sentiment.sh first");
}

/* A runtime on stories15M connected to servers with the given spans. */
static sp_runtime *swarm(const int (*spans)[2], int n)
{
    need_data();
    sp_runtime *rt = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_runtime_new(&rt, NULL, NULL, &err), SP_OK);
    ck_assert_msg(sp_runtime_load(rt, M15, &err) == SP_OK, "%s", err.msg);
    sp_test_wire_f32(rt); /* the losses are compared with one process's to 1e-5 */
    char addrs[1024] = "";
    for (int i = 0; i < n; i++) {
        sp_server_opts o;
        sp_server_opts_default(&o);
        o.model_dir = M15;
        o.start = spans[i][0];
        o.end = spans[i][1];
        o.measure = 0;
        ck_assert_msg(sp_server_start(&srv[nsrv], &o, &err) == SP_OK, "%s", err.msg);
        snprintf(addrs + strlen(addrs), sizeof addrs - strlen(addrs), "%s127.0.0.1:%d", i ? "," : "",
                 sp_server_port(srv[nsrv++]));
    }
    ck_assert_msg(sp_runtime_connect(rt, addrs, &err) == SP_OK, "%s", err.msg);
    return rt;
}

static void teardown(sp_runtime *rt)
{
    sp_runtime_free(rt);
    while (nsrv > 0)
        sp_server_stop(srv[--nsrv]);
}

static const sepal_task *sst2(void)
{
    sp_plugin_register_builtins();
    const sepal_task *t = sp_plugin_find("sst2");
    ck_assert_ptr_nonnull(t);
    return t;
}

static sp_train_opts opts(sp_tuning tuning, sp_schedule sched, int micro)
{
    sp_train_opts o;
    sp_train_opts_default(&o);
    o.tuning = tuning;
    o.pre_seq_len = tuning == SP_TUNE_HEAD ? 0 : 4;
    o.max_length = 24;
    o.batch = 8;
    o.microbatches = micro;
    o.schedule = sched;
    o.seed = 9;
    o.device = 0;
    return o;
}

/* Loss and flattened gradients of one batch. */
static float *grads_of(sp_trainer *t, const int *idx, int n, float *loss, int64_t *total)
{
    sp_err err = {0};
    ck_assert_msg(sp_trainer_grads(t, idx, n, loss, &err) == SP_OK, "%s", err.msg);
    sp_t **p;
    int np = sp_trainer_params(t, &p);
    *total = 0;
    for (int i = 0; i < np; i++)
        *total += p[i]->n;
    float *g = calloc((size_t)*total, sizeof(float)), *q = g;
    for (int i = 0; i < np; i++) {
        ck_assert_msg(p[i]->grad != NULL, "%s got no gradient", p[i]->name);
        double norm = 0;
        for (int64_t k = 0; k < p[i]->n; k++)
            norm += (double)p[i]->grad[k] * p[i]->grad[k];
        ck_assert_msg(norm > 0, "%s has a zero gradient", p[i]->name);
        memcpy(q, p[i]->grad, (size_t)p[i]->n * sizeof(float));
        q += p[i]->n;
    }
    return g;
}

/* A pipelined step: every server (stage) did its items in its schedule's order, one at a time; head-only
 * training sends no BACKWARD, so only the forwards ran. Later steps must not make the graph keep more:
 * a step's inputs and per-step copies go with it. peak: the most stages ever busy at once. */
static void check_trace(sp_trainer *t, int M, sp_tuning tuning, int L, const int *idx, int *peak)
{
    const sp_pipe *p = sp_trainer_last_pipe(t);
    if (M == 1) {
        ck_assert_ptr_null(p);
        return;
    }
    ck_assert_ptr_nonnull(p);
    const sp_route *route = sp_trainer_last_route(t); /* the step's route: its stages cover [0, L) in order */
    ck_assert_ptr_nonnull(route);
    int S = route->nstages;
    ck_assert_int_eq(sp_pipe_stages(p), S);
    ck_assert_int_eq(route->stage_start[0], 0);
    ck_assert_int_eq(route->stage_start[S], L);
    for (int s = 0; s < S; s++)
        ck_assert_int_lt(route->stage_start[s], route->stage_start[s + 1]);
    for (int s = 0; s < S; s++) {
        int o[128], k = 0;
        sp_pipe_item tr[128];
        int no = sp_pipe_order(p, s, o), nt = sp_pipe_trace(p, s, tr, 128);
        ck_assert_int_eq(nt, tuning == SP_TUNE_HEAD ? M : 2 * M);
        for (int i = 0; i < no; i++) {
            if (tuning == SP_TUNE_HEAD && (o[i] & 1))
                continue;
            ck_assert_msg(tr[k].backward == (o[i] & 1) && tr[k].mb == o[i] >> 1,
                          "stage %d: item %d was %s%d, its order says %s%d", s, k, tr[k].backward ? "B" : "F", tr[k].mb,
                          o[i] & 1 ? "B" : "F", o[i] >> 1);
            if (k)
                ck_assert(tr[k].t_enter >= tr[k - 1].t_leave);
            k++;
        }
    }
    int bp = sp_pipe_peak_busy(p);
    *peak = bp > *peak ? bp : *peak;
    sp_t **params;
    ck_assert_int_gt(sp_trainer_params(t, &params), 0);
    int l0, t0, n0, l1, t1, n1;
    sp_graph_counts(params[0]->g, &l0, &t0, &n0);
    float loss;
    sp_err err = {0};
    for (int r = 0; r < 2; r++)
        ck_assert_msg(sp_trainer_grads(t, idx, 8, &loss, &err) == SP_OK, "%s", err.msg);
    sp_graph_counts(params[0]->g, &l1, &t1, &n1);
    ck_assert_int_eq(l1, l0);
    ck_assert_int_eq(t1, 0);
    ck_assert_int_eq(n1, 0);
}

/* Compares a swarm layout x schedule with the local baseline. */
static void check_layout(const int (*spans)[2], int n, sp_tuning tuning)
{
    sp_runtime *rt = swarm(spans, n);
    sp_model *all = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_model_load(&all, M15, SP_LOAD_BLOCKS, 0, -1, &err), SP_OK);
    int idx[8] = {3, 100, 7, 1500, 42, 999, 12, 640}; /* sentences of different lengths */
    sp_train_opts base = opts(tuning, SP_SCHED_AFAB, 1);
    sp_trainer *local = NULL;
    ck_assert_msg(sp_trainer_new(&local, rt, all, sst2(), "", &base, &err) == SP_OK, "%s", err.msg);
    float l0;
    int64_t n0;
    float *g0 = grads_of(local, idx, 8, &l0, &n0);
    ck_assert(isfinite(l0) && l0 > 0);
    struct {
        sp_schedule s;
        int m;
    } cases[] = {{SP_SCHED_AFAB, 1}, {SP_SCHED_AFAB, 4}, {SP_SCHED_1F1B, 4}, {SP_SCHED_1F1B, 3}};
    int peak = 0;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        sp_train_opts o = opts(tuning, cases[c].s, cases[c].m);
        sp_trainer *t = NULL;
        ck_assert_msg(sp_trainer_new(&t, rt, NULL, sst2(), "", &o, &err) == SP_OK, "%s", err.msg);
        float l;
        int64_t nn;
        float *g = grads_of(t, idx, 8, &l, &nn);
        ck_assert_int_eq(nn, n0);
        ck_assert_msg(fabsf(l - l0) <= 1e-5f * fmaxf(1.0f, fabsf(l0)), "case %zu: loss %.7f vs %.7f", c, l, l0);
        double worst = sp_max_abs_diff(g, g0, (size_t)n0), scale = 0;
        for (int64_t k = 0; k < n0; k++)
            scale = fmax(scale, fabs(g0[k]));
        ck_assert_msg(worst <= 1e-5 * fmax(1.0, scale), "case %zu: grads differ by %g (max |g| %g)", c, worst, scale);
        check_trace(t, cases[c].m, tuning, sp_runtime_config(rt)->n_layers, idx, &peak);
        free(g);
        sp_trainer_free(t);
    }
    if (sp_test_route_hops(rt) > 1) /* the servers worked at the same time on different microbatches */
        ck_assert_msg(peak >= 2, "no two stages were ever busy at once (peak %d)", peak);
    /* every activation a FORWARD kept went with its BACKWARD; evaluation keeps none */
    for (int i = 0; i < nsrv; i++)
        ck_assert_msg(sp_server_kept_bytes(srv[i]) == 0, "server %d keeps %zu bytes", i, sp_server_kept_bytes(srv[i]));
    sp_train_opts eo = opts(tuning, SP_SCHED_1F1B, 1);
    eo.eval_batches = 2;
    sp_trainer *ev = NULL;
    char metrics[256];
    ck_assert_msg(sp_trainer_new(&ev, rt, NULL, sst2(), "", &eo, &err) == SP_OK, "%s", err.msg);
    ck_assert_msg(sp_trainer_eval(ev, metrics, sizeof metrics, &err) == SP_OK, "%s", err.msg);
    ck_assert_msg(strstr(metrics, "accuracy="), "%s", metrics);
    for (int i = 0; i < nsrv; i++)
        ck_assert_msg(sp_server_kept_bytes(srv[i]) == 0, "after eval, server %d keeps %zu bytes", i,
                      sp_server_kept_bytes(srv[i]));
    sp_trainer_free(ev);
    free(g0);
    sp_trainer_free(local);
    sp_model_free(all);
    teardown(rt);
}

START_TEST(t_three_servers_deep)
{
    const int spans[3][2] = {{0, 2}, {2, 4}, {4, 6}};
    check_layout(spans, 3, SP_TUNE_DEEP);
}
END_TEST

START_TEST(t_one_server_ptune)
{
    const int spans[1][2] = {{0, 6}};
    check_layout(spans, 1, SP_TUNE_PTUNE);
}
END_TEST

START_TEST(t_more_servers_than_blocks_head)
{
    const int spans[7][2] = {{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 5}, {5, 6}, {0, 3}};
    check_layout(spans, 7, SP_TUNE_HEAD);
}
END_TEST

START_TEST(t_steps_lower_loss_and_save_load)
{
    const int spans[2][2] = {{0, 3}, {3, 6}};
    sp_runtime *rt = swarm(spans, 2);
    sp_train_opts o = opts(SP_TUNE_DEEP, SP_SCHED_1F1B, 2);
    o.lr = 1e-2f;
    o.warmup = 0;
    sp_trainer *t = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_trainer_new(&t, rt, NULL, sst2(), "", &o, &err), SP_OK);
    int idx[8] = {0, 1, 2, 3, 1000, 1001, 1002, 1003};
    float first = 0, last = 0;
    for (int s = 0; s < 8; s++) { /* the same batch: its loss must fall */
        float l;
        ck_assert_msg(sp_trainer_step(t, idx, 8, &l, &err) == SP_OK, "%s", err.msg);
        if (s == 0)
            first = l;
        last = l;
    }
    ck_assert_msg(last < 0.7f * first, "loss %.4f -> %.4f", first, last);
    char path[512];
    snprintf(path, sizeof path, "%s/p.safetensors", sp_test_tmpdir());
    ck_assert_int_eq(sp_trainer_save(t, path, &err), SP_OK);
    sp_trainer *u = NULL;
    o.seed = 12345; /* other initial values, then the saved ones */
    ck_assert_int_eq(sp_trainer_new(&u, rt, NULL, sst2(), "", &o, &err), SP_OK);
    ck_assert_int_eq(sp_trainer_load(u, path, &err), SP_OK);
    sp_t **pt, **pu;
    int n = sp_trainer_params(t, &pt);
    ck_assert_int_eq(sp_trainer_params(u, &pu), n);
    for (int i = 0; i < n; i++)
        ck_assert_mem_eq(pt[i]->data, pu[i]->data, (size_t)pt[i]->n * sizeof(float));
    char m1[256], m2[256];
    o.eval_batches = 2;
    ck_assert_int_eq(sp_trainer_eval(t, m1, sizeof m1, &err), SP_OK);
    ck_assert_int_eq(sp_trainer_eval(u, m2, sizeof m2, &err), SP_OK);
    ck_assert_str_eq(m1, m2);
    ck_assert_ptr_nonnull(strstr(m1, "accuracy="));
    /* loading a file of another shape fails clearly */
    o.pre_seq_len = 5;
    sp_trainer *w = NULL;
    ck_assert_int_eq(sp_trainer_new(&w, rt, NULL, sst2(), "", &o, &err), SP_OK);
    ck_assert_int_ne(sp_trainer_load(w, path, &err), SP_OK);
    ck_assert_ptr_nonnull(strstr(err.msg, "prompts"));
    sp_trainer_free(w);
    sp_trainer_free(u);
    sp_trainer_free(t);
    teardown(rt);
}
END_TEST

/* A task whose loss calls host->backward itself (plugin.h allows it) and returns NULL: the trainer's
 * post-backward work (the prompts' reduction) still runs once, and the gradients equal the default path. */
static sepal_task self_backward_task;
static sepal_tensor *self_backward_loss(void *task, const sepal_host *host, sepal_tensor *logits, const sepal_batch *b)
{
    (void)task;
    sepal_tensor *l = host->cross_entropy(host->ctx, logits, b->labels);
    ck_assert_ptr_nonnull(l);
    ck_assert_int_eq(host->backward(host->ctx, l, NULL), 0);
    return NULL;
}

START_TEST(t_task_calls_backward_itself)
{
    const int spans[2][2] = {{0, 3}, {3, 6}};
    sp_runtime *rt = swarm(spans, 2);
    self_backward_task = *sst2();
    self_backward_task.name = "sst2-self-backward";
    self_backward_task.loss = self_backward_loss;
    sp_train_opts o = opts(SP_TUNE_DEEP, SP_SCHED_AFAB, 1);
    sp_trainer *a = NULL, *b = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_trainer_new(&a, rt, NULL, sst2(), "", &o, &err), SP_OK);
    ck_assert_int_eq(sp_trainer_new(&b, rt, NULL, &self_backward_task, "", &o, &err), SP_OK);
    int idx[8] = {5, 6, 7, 8, 1200, 1201, 1202, 1203};
    float la, lb;
    int64_t na, nb;
    float *ga = grads_of(a, idx, 8, &la, &na), *gb = grads_of(b, idx, 8, &lb, &nb);
    ck_assert_int_eq(na, nb);
    ck_assert_double_le(sp_max_abs_diff(ga, gb, (size_t)na), 1e-6);
    /* and a step with it updates the parameters like the default path */
    float s1, s2;
    ck_assert_int_eq(sp_trainer_step(a, idx, 8, &s1, &err), SP_OK);
    ck_assert_int_eq(sp_trainer_step(b, idx, 8, &s2, &err), SP_OK);
    sp_t **pa, **pb;
    int n = sp_trainer_params(a, &pa);
    sp_trainer_params(b, &pb);
    for (int i = 0; i < n; i++)
        ck_assert_double_le(sp_max_abs_diff(pa[i]->data, pb[i]->data, (size_t)pa[i]->n), 1e-6);
    free(ga), free(gb);
    sp_trainer_free(a);
    sp_trainer_free(b);
    teardown(rt);
}
END_TEST

START_TEST(t_errors)
{
    need_data();
    sp_runtime *rt = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_runtime_new(&rt, NULL, NULL, &err), SP_OK);
    sp_train_opts o = opts(SP_TUNE_DEEP, SP_SCHED_AFAB, 1);
    sp_trainer *t = NULL;
    ck_assert_int_ne(sp_trainer_new(&t, rt, NULL, sst2(), "", &o, &err), SP_OK);
    ck_assert_ptr_nonnull(strstr(err.msg, "no model loaded"));
    ck_assert_int_eq(sp_runtime_load(rt, M15, &err), SP_OK);
    ck_assert_int_ne(sp_trainer_new(&t, rt, NULL, sst2(), "", &o, &err), SP_OK);
    ck_assert_ptr_nonnull(strstr(err.msg, "no servers"));
    /* the task's arguments come before the swarm: a bad one is said first, once named */
    ck_assert_int_ne(sp_trainer_new(&t, rt, NULL, sst2(), "data=/nonexistent", &o, &err), SP_OK);
    ck_assert_str_eq(err.msg, "task sst2: no sentiment data in /nonexistent: run scripts/fetch-sentiment.sh");
    sp_model *all = NULL;
    ck_assert_int_eq(sp_model_load(&all, M15, SP_LOAD_BLOCKS, 0, -1, &err), SP_OK);
    ck_assert_int_ne(sp_trainer_new(&t, rt, all, sst2(), "data=/nonexistent", &o, &err), SP_OK);
    ck_assert_ptr_nonnull(strstr(err.msg, "/nonexistent"));
    o.max_length = 300; /* + P past the context of 256 */
    ck_assert_int_ne(sp_trainer_new(&t, rt, all, sst2(), "", &o, &err), SP_OK);
    ck_assert_ptr_nonnull(strstr(err.msg, "context"));
    sp_model_free(all);
    sp_runtime_free(rt);
}
END_TEST

/* A server dies between steps: the pipelined step (4 microbatches over 3 servers) fails with a message
 * naming that server, every microbatch thread returns (no wait for a turn that will not come), the
 * parameters are untouched, and once the route is rebuilt over a replacement the step works again. */
START_TEST(t_dead_server_mid_pipeline)
{
    const int spans[3][2] = {{0, 2}, {2, 4}, {4, 6}};
    sp_runtime *rt = swarm(spans, 3);
    sp_train_opts o = opts(SP_TUNE_DEEP, SP_SCHED_1F1B, 4);
    sp_trainer *t = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_trainer_new(&t, rt, NULL, sst2(), "", &o, &err) == SP_OK, "%s", err.msg);
    int idx[8] = {3, 100, 7, 1500, 42, 999, 12, 640};
    float loss;
    ck_assert_msg(sp_trainer_step(t, idx, 8, &loss, &err) == SP_OK, "%s", err.msg);
    sp_t **p;
    int np = sp_trainer_params(t, &p);
    float *before = malloc((size_t)p[0]->n * sizeof(float));
    memcpy(before, p[0]->data, (size_t)p[0]->n * sizeof(float));
    char port[16];
    snprintf(port, sizeof port, ":%d", sp_server_port(srv[1]));
    sp_server_stop(srv[1]); /* blocks 2:4 */
    srv[1] = NULL;
    sp_rt_settings set;
    sp_runtime_settings(rt, &set);
    set.max_retries = 1; /* no other server holds 2:4: one retry, then the error */
    sp_runtime_set_settings(rt, &set);
    double t0 = sp_now_s();
    ck_assert_int_ne(sp_trainer_step(t, idx, 8, &loss, &err), SP_OK);
    ck_assert_msg(sp_now_s() - t0 < 60, "the failed step took %.1f s", sp_now_s() - t0);
    ck_assert_msg(strstr(err.msg, port) && strstr(err.msg, "microbatch"), "%s", err.msg);
    ck_assert_int_eq(memcmp(before, p[0]->data, (size_t)p[0]->n * sizeof(float)), 0);
    /* a replacement for blocks 2:4; the route is rebuilt over the servers that answer */
    sp_server_opts so;
    sp_server_opts_default(&so);
    so.model_dir = M15;
    so.start = 2;
    so.end = 4;
    so.measure = 0;
    ck_assert_msg(sp_server_start(&srv[1], &so, &err) == SP_OK, "%s", err.msg);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", sp_server_port(srv[1]));
    ck_assert_msg(sp_runtime_connect(rt, addr, &err) == SP_OK, "%s", err.msg);
    sp_runtime_refresh(rt);
    ck_assert_msg(sp_runtime_route(rt, &err) == SP_OK, "%s", err.msg);
    ck_assert_msg(sp_trainer_step(t, idx, 8, &loss, &err) == SP_OK, "%s", err.msg);
    ck_assert(isfinite(loss));
    (void)np;
    free(before);
    sp_trainer_free(t);
    teardown(rt);
}
END_TEST

/* Greedy continuation of ids with prompts, the slow way: every step runs the whole sequence through all
 * blocks in this process (no KV cache, no server): [shallow ++ embed(ids)], deep prompts added to the first P
 * positions entering every block, the last position's logits. */
static void reference_greedy(sp_model *all, sp_model *local, const float *shallow, const float *deep, int P,
                             int32_t *ids, int n, int new_tokens)
{
    int H = local->cfg.hidden, L = local->cfg.n_layers, V = local->cfg.vocab;
    sp_err err = {0};
    for (int k = 0; k < new_tokens; k++, n++) {
        sp_graph *g = sp_graph_new();
        float *x = calloc((size_t)(P + n) * H, sizeof(float)), *logits = malloc((size_t)V * sizeof(float));
        memcpy(x, shallow, (size_t)P * H * sizeof(float));
        ck_assert_int_eq(sp_model_embed(local, x + (size_t)P * H, ids, n, &err), SP_OK);
        int64_t xs[3] = {1, P + n, H}, ds[4] = {L, 1, P, H};
        sp_t *xt = sp_input(g, 3, xs, x, 0, "x"), *dt = deep ? sp_input(g, 4, ds, deep, 0, "deep") : NULL;
        sp_t *h = sp_local_chain(all, xt, dt, &err);
        ck_assert_msg(h != NULL, "%s", err.msg);
        ck_assert_int_eq(sp_model_head(local, logits, h->data + (size_t)(P + n - 1) * H, 1, &err), SP_OK);
        int best = 0;
        for (int v = 1; v < V; v++)
            best = logits[v] > logits[best] ? v : best;
        ids[n] = best;
        free(x), free(logits);
        sp_graph_free(g);
    }
}

/* Generation through the swarm with trained prompts (a file in train --save's format): the same tokens as
 * the slow reference; the prompts change the continuation; files without prompts or of another width fail. */
START_TEST(t_generate_with_prompts)
{
    const int spans[3][2] = {{0, 2}, {2, 4}, {4, 6}};
    sp_runtime *rt = swarm(spans, 3);
    sp_model *all = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_model_load(&all, M15, SP_LOAD_BLOCKS, 0, -1, &err), SP_OK);
    /* shallow prompts: the embeddings of a real text (random vectors barely move a model this sure of its
     * stories); deep prompts: random */
    int H = sp_runtime_config(rt)->hidden, L = sp_runtime_config(rt)->n_layers, P, *pid;
    ck_assert_int_eq(sp_tokenizer_encode(sp_runtime_tokenizer(rt), "The big dog barked at the cat.", 0, &pid, &P, &err), SP_OK);
    float *sh = malloc((size_t)P * H * sizeof(float)), *dp = malloc((size_t)L * P * H * sizeof(float));
    int32_t *pid32 = malloc((size_t)P * sizeof *pid32);
    for (int i = 0; i < P; i++)
        pid32[i] = pid[i];
    ck_assert_int_eq(sp_model_embed(sp_runtime_model(rt), sh, pid32, P, &err), SP_OK);
    free(pid), free(pid32);
    sp_rng r;
    sp_rng_seed(&r, 77);
    sp_rng_fill_normal(&r, dp, (long)L * P * H, 0.5f);
    const char *dir = sp_test_tmpdir();
    char path[512], bad[512];
    snprintf(path, sizeof path, "%s/prompts.safetensors", dir);
    snprintf(bad, sizeof bad, "%s/head.safetensors", dir);
    for (int deep = 0; deep < 2; deep++) {
        sp_st_wtensor w[2] = {{.name = "prompts", .dtype = SP_F32, .ndim = 2, .shape = {P, H}, .data = sh},
                              {.name = "deep_prompts", .dtype = SP_F32, .ndim = 3, .shape = {L, P, H}, .data = dp}};
        ck_assert_int_eq(sp_st_write(path, w, deep ? 2 : 1, NULL, &err), SP_OK);
        float *s2 = NULL, *d2 = NULL;
        int P2 = 0;
        ck_assert_msg(sp_prompts_load(path, L, H, &s2, &d2, &P2, &err) == SP_OK, "%s", err.msg);
        ck_assert_int_eq(P2, P);
        ck_assert(deep ? d2 != NULL : d2 == NULL);
        int32_t prompt[3] = {450, 11203, 471}; /* three ordinary tokens, no BOS */
        int32_t want[3 + 10], plain[3 + 10];
        memcpy(want, prompt, sizeof prompt);
        reference_greedy(all, sp_runtime_model(rt), s2, d2, P, want, 3, 10);
        sp_lm_swarm sw;
        sp_lm lm = sp_lm_swarm_make(&sw, rt);
        sp_lm_swarm_prompts(&sw, &lm, s2, d2, P);
        ck_assert_int_eq(lm.max_pos, sp_runtime_config(rt)->max_pos - P);
        sp_gen_opts o;
        sp_gen_opts_default(&o);
        o.max_new = 10;
        o.eos_id = -1;
        sp_gen_result res;
        const int32_t *ps[1] = {prompt};
        int n = 3;
        ck_assert_msg(sp_generate(&lm, NULL, ps, &n, 1, &o, NULL, NULL, &res, &err) == SP_OK, "%s", err.msg);
        ck_assert_int_eq(res.n[0], 10);
        for (int i = 0; i < 10; i++)
            ck_assert_msg(res.ids[0][i] == want[3 + i], "deep %d, token %d: %d, reference %d", deep, i, res.ids[0][i],
                          want[3 + i]);
        sp_gen_result_free(&res);
        /* without prompts the continuation differs */
        sp_lm plain_lm = sp_lm_swarm_make(&sw, rt);
        ck_assert_int_eq(sp_generate(&plain_lm, NULL, ps, &n, 1, &o, NULL, NULL, &res, &err), SP_OK);
        memcpy(plain, prompt, sizeof prompt);
        memcpy(plain + 3, res.ids[0], 10 * sizeof(int32_t));
        ck_assert_msg(memcmp(plain, want, sizeof want), "deep %d: the prompts did not change the continuation", deep);
        sp_gen_result_free(&res);
        free(s2), free(d2);
    }
    /* a head-only file, and prompts of another width */
    float score[2 * 288] = {0};
    sp_st_wtensor w = {.name = "score.weight", .dtype = SP_F32, .ndim = 2, .shape = {2, H}, .data = score};
    ck_assert_int_eq(sp_st_write(bad, &w, 1, NULL, &err), SP_OK);
    float *s2, *d2;
    int P2;
    ck_assert_int_eq(sp_prompts_load(bad, L, H, &s2, &d2, &P2, &err), SP_ERR_NOTFOUND);
    ck_assert(strstr(err.msg, "no prompts"));
    ck_assert_int_eq(sp_prompts_load(path, L, H + 1, &s2, &d2, &P2, &err), SP_ERR_ARG);
    ck_assert_int_eq(sp_prompts_load("/nonexistent/p.safetensors", L, H, &s2, &d2, &P2, &err) != SP_OK, 1);
    free(sh), free(dp);
    sp_model_free(all);
    teardown(rt);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("trainer");
    TCase *tc = tcase_create("trainer");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, t_three_servers_deep);
    tcase_add_test(tc, t_one_server_ptune);
    tcase_add_test(tc, t_more_servers_than_blocks_head);
    tcase_add_test(tc, t_steps_lower_loss_and_save_load);
    tcase_add_test(tc, t_task_calls_backward_itself);
    tcase_add_test(tc, t_errors);
    tcase_add_test(tc, t_generate_with_prompts);
    tcase_add_test(tc, t_dead_server_mid_pipeline);
    suite_add_tcase(s, tc);
    return sp_test_run(s);
}
