/* test_runtime.c - the client runtime against real servers on loopback (threads in this process):
 * only the local parts are read, routing, generation through the swarm equal to transformers' greedy
 * ids and to the local runner (greedy, seeded sampling, batches of different lengths, beam search),
 * forward/backward over the chain equal to the local engine, what front ends read (copies of the server rows,
 * the settings, the route), and clear errors. */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "devparts.h"
#include "generate.h"
#include "half.h"
#include "kern.h"
#include "pool.h"
#include "proto.h"
#include "remote.h"
#include "rng.h"
#include "runtime.h"
#include "server.h"
#include "testutil.h"

#define GQA SEPAL_TEST_DATA "/hf-tiny/llama-gqa"

static sp_server *srv[3];

/* workers_only: every step through the workers' queue (where they are batched), none run on arrival; await_bytes: the
 * pushed inputs it holds (0: the default); dtype: how it holds its blocks (kern.h's sp_wtype). */
static sp_server *start_as(int a, int b, int workers_only, size_t await_bytes, int dtype)
{
    sp_server_opts o;
    sp_server_opts_default(&o);
    o.dtype = dtype;
    o.model_dir = GQA;
    o.start = a;
    o.end = b;
    o.measure = 0;
    o.workers_only = workers_only;
    o.await_bytes = await_bytes;
    sp_server *s = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_server_start(&s, &o, &err) == SP_OK, "%s", err.msg);
    return s;
}

static sp_server *start_with(int a, int b, int workers_only, size_t await_bytes)
{
    return start_as(a, b, workers_only, await_bytes, SP_W_F32);
}

static sp_server *start(int a, int b, int workers_only) { return start_with(a, b, workers_only, 0); }

/* A runtime with llama-gqa loaded and connected to servers 0:2 and 2:4 (their blocks in dtype). */
static sp_runtime *swarm_runtime_as(int workers_only, int dtype)
{
    srv[0] = start_as(0, 2, workers_only, 0, dtype);
    srv[1] = start_as(2, 4, workers_only, 0, dtype);
    sp_runtime *rt = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_runtime_new(&rt, NULL, NULL, &err), SP_OK);
    ck_assert_msg(sp_runtime_load(rt, GQA, &err) == SP_OK, "%s", err.msg);
    char addrs[128];
    snprintf(addrs, sizeof addrs, "127.0.0.1:%d,127.0.0.1:%d", sp_server_port(srv[0]), sp_server_port(srv[1]));
    ck_assert_msg(sp_runtime_connect(rt, addrs, &err) == SP_OK, "%s", err.msg);
    ck_assert_int_eq(sp_test_route_hops(rt), 2);
    return rt;
}

static sp_runtime *swarm_runtime_opts(int workers_only) { return swarm_runtime_as(workers_only, SP_W_F32); }

static sp_runtime *swarm_runtime(void) { return swarm_runtime_opts(0); }

static void teardown(sp_runtime *rt)
{
    sp_runtime_free(rt);
    for (int i = 0; i < 3; i++) {
        sp_server_stop(srv[i]);
        srv[i] = NULL;
    }
}

static int32_t *golden_ids(const char *name, int *n)
{
    sp_safetensors *st = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_st_open(&st, GQA "/golden.safetensors", &err), SP_OK);
    const sp_st_tensor *t = sp_st_get(st, name, &err);
    int32_t *ids = malloc(t->numel * sizeof *ids);
    for (uint64_t i = 0; i < t->numel; i++) {
        int64_t v;
        memcpy(&v, (const char *)t->data + 8 * i, 8);
        ids[i] = (int32_t)v;
    }
    *n = (int)t->numel;
    sp_st_close(st);
    return ids;
}

START_TEST(t_local_parts_only)
{
    sp_runtime *rt = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_runtime_new(&rt, NULL, NULL, &err), SP_OK);
    ck_assert_int_eq(sp_runtime_load(rt, GQA, &err), SP_OK);
    sp_model *m = sp_runtime_model(rt);
    const sp_config *c = sp_runtime_config(rt);
    ck_assert_ptr_eq(c, &m->cfg);
    ck_assert_str_eq(sp_runtime_model_name(rt), "llama-gqa");
    /* untied: embeddings + head + final norm, nothing else; 3 of the 8 shards mapped */
    ck_assert_int_eq((long long)m->bytes_loaded, (2LL * c->vocab * c->hidden + c->hidden) * 4);
    ck_assert_int_eq(m->files_mapped, 3);
    ck_assert_int_eq(m->last - m->first, 0);
    ck_assert_ptr_null(sp_runtime_tokenizer(rt)); /* the tiny checkpoints have no tokenizer */
    /* tied: the head is the embedding, read once */
    ck_assert_int_eq(sp_runtime_load(rt, SEPAL_TEST_DATA "/hf-tiny/llama3-rope", &err), SP_OK);
    m = sp_runtime_model(rt);
    c = sp_runtime_config(rt);
    ck_assert_int_eq((long long)m->bytes_loaded, (1LL * c->vocab * c->hidden + c->hidden) * 4);
    ck_assert_ptr_eq(m->lm_head, m->embed);
    sp_runtime_free(rt);
}
END_TEST

/* Generation's local parts on a GPU (sp_runtime_set_gen_device, the `device` setting): a GPU that cannot run is
 * refused in words, before and after a load, and the CPU stays in use (the device's own runs: test_cuda_train's
 * t_gen_parts and test_server_gpu's t_generate_on_device). */
START_TEST(t_gen_device_refused)
{
    sp_runtime *rt = NULL;
    sp_err err = {0};
    char why[200];
    ck_assert_int_eq(sp_runtime_new(&rt, NULL, NULL, &err), SP_OK);
    ck_assert_int_eq(sp_runtime_gen_device(rt), -1);
    ck_assert_int_eq(sp_runtime_set_gen_device(rt, -2, &err), SP_ERR_ARG);
    if (sp_device_usable(0, why, sizeof why)) { /* a GPU here: what is refused is for the GPU suites */
        sp_runtime_free(rt);
        return;
    }
    for (int loaded = 0; loaded < 2; loaded++) {
        err = (sp_err){0};
        ck_assert_int_eq(sp_runtime_set_gen_device(rt, 0, &err), SP_ERR_UNSUPPORTED);
        ck_assert_msg(!strncmp(err.msg, "generation's local parts on cuda:0: ", 36) &&
                          (strstr(err.msg, "no usable GPU") || strstr(err.msg, "built without CUDA")),
                      "%s", err.msg);
        ck_assert_int_eq(sp_runtime_gen_device(rt), -1);
        ck_assert_int_eq(sp_runtime_load(rt, GQA, &err), SP_OK);
    }
    ck_assert_int_eq(sp_runtime_set_gen_device(rt, -1, &err), SP_OK);
    sp_runtime_free(rt);
}
END_TEST

START_TEST(t_greedy_matches_transformers)
{
    sp_runtime *rt = swarm_runtime();
    int np, no;
    int32_t *prompt = golden_ids("greedy.prompt", &np), *want = golden_ids("greedy.output", &no);
    sp_lm_swarm sw;
    sp_lm lm = sp_lm_swarm_make(&sw, rt);
    sp_gen_opts o;
    sp_gen_opts_default(&o);
    o.max_new = no - np;
    o.stop_at_eos = 0;
    sp_gen_result r;
    sp_err err = {0};
    const int32_t *ps[1] = {prompt};
    ck_assert_msg(sp_generate(&lm, NULL, ps, &np, 1, &o, NULL, NULL, &r, &err) == SP_OK, "%s", err.msg);
    ck_assert_int_eq(r.n[0], no - np);
    for (int i = 0; i < r.n[0]; i++)
        ck_assert_int_eq(r.ids[0][i], want[np + i]);
    ck_assert_double_gt(r.tokens_per_s, 0);
    /* the servers' sessions are closed afterwards */
    ck_assert_int_eq(sp_server_sessions(srv[0]) + sp_server_sessions(srv[1]), 0);
    sp_gen_result_free(&r);
    free(prompt), free(want);
    teardown(rt);
}
END_TEST

/* The same generation through the swarm and in one process: seeded sampling, batches of prompts of
 * different lengths, beam search. */
START_TEST(t_swarm_equals_local)
{
    sp_runtime *rt = swarm_runtime();
    sp_model *full = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_model_load(&full, GQA, SP_LOAD_ALL, 0, -1, &err), SP_OK);
    sp_lm_local loc;
    sp_lm_swarm sw;
    sp_lm lm_local = sp_lm_local_make(&loc, full), lm_swarm = sp_lm_swarm_make(&sw, rt);
    /* a generation's begin builds the greedy head's screen (not its prompt's first step) */
    ck_assert_int_eq(full->head_screen_state, 0);
    ck_assert_int_eq(lm_local.begin(lm_local.ctx, 1, 8, &err), SP_OK);
    ck_assert_int_eq(full->head_screen_state, 1);
    lm_local.end(lm_local.ctx);
    int32_t p0[5] = {1, 17, 99, 3, 250}, p1[2] = {1, 400}, p2[7] = {1, 5, 6, 7, 8, 9, 10};
    const int32_t *ps[3] = {p0, p1, p2};
    int lens[3] = {5, 2, 7};
    struct {
        float temperature;
        int top_k;
        float top_p, rep;
        int beams, n;
    } cases[] = {
        {0, 0, 1, 1, 1, 3},       /* greedy, batch of 3 different lengths */
        {0.8f, 40, 0.9f, 1.3f, 1, 3}, /* seeded sampling with every filter */
        {1.0f, 0, 1, 1, 1, 1},
        {0, 0, 1, 1, 4, 1},       /* beam search, 4 beams */
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        sp_gen_opts o;
        sp_gen_opts_default(&o);
        o.max_new = 12;
        o.stop_at_eos = 0;
        o.beams = cases[c].beams;
        o.sample.temperature = cases[c].temperature;
        o.sample.top_k = cases[c].top_k;
        o.sample.top_p = cases[c].top_p;
        o.sample.repetition_penalty = cases[c].rep;
        o.sample.seed = 42;
        sp_gen_result a, b;
        ck_assert_msg(sp_generate(&lm_local, NULL, ps, lens, cases[c].n, &o, NULL, NULL, &a, &err) == SP_OK, "%s", err.msg);
        ck_assert_msg(sp_generate(&lm_swarm, NULL, ps, lens, cases[c].n, &o, NULL, NULL, &b, &err) == SP_OK, "%s", err.msg);
        for (int i = 0; i < cases[c].n; i++) {
            ck_assert_int_eq(a.n[i], b.n[i]);
            ck_assert_int_eq(a.n[i], 12);
            for (int t = 0; t < a.n[i]; t++)
                ck_assert_msg(a.ids[i][t] == b.ids[i][t], "case %zu row %d pos %d: %d vs %d", c, i, t, a.ids[i][t],
                              b.ids[i][t]);
        }
        if (cases[c].n == 3) { /* each row of a batch equals that prompt generated alone */
            for (int i = 0; i < 3 && cases[c].temperature == 0; i++) {
                sp_gen_result one;
                ck_assert_int_eq(sp_generate(&lm_local, NULL, &ps[i], &lens[i], 1, &o, NULL, NULL, &one, &err), SP_OK);
                for (int t = 0; t < one.n[0]; t++)
                    ck_assert_int_eq(one.ids[0][t], a.ids[i][t]);
                sp_gen_result_free(&one);
            }
        }
        if (cases[c].beams > 1)
            ck_assert_float_eq_tol(a.best_score, b.best_score, 1e-5);
        sp_gen_result_free(&a);
        sp_gen_result_free(&b);
    }
    /* a different seed gives a different sample */
    sp_gen_opts o;
    sp_gen_opts_default(&o);
    o.max_new = 12;
    o.stop_at_eos = 0;
    o.sample.temperature = 1.0f;
    sp_gen_result x, y;
    o.sample.seed = 1;
    ck_assert_int_eq(sp_generate(&lm_swarm, NULL, ps, lens, 1, &o, NULL, NULL, &x, &err), SP_OK);
    o.sample.seed = 2;
    ck_assert_int_eq(sp_generate(&lm_swarm, NULL, ps, lens, 1, &o, NULL, NULL, &y, &err), SP_OK);
    ck_assert(memcmp(x.ids[0], y.ids[0], 12 * sizeof(int32_t)) != 0);
    sp_gen_result_free(&x);
    sp_gen_result_free(&y);
    sp_model_free(full);
    teardown(rt);
}
END_TEST

/* Concurrent generations of one runtime (its sessions share a connection to each server, their calls in flight at
 * once) get the tokens each gets alone, greedy and seeded sampling, while the servers batch their steps: prompts
 * and lengths differ, three join once the first has made some tokens, all leave when done. In f32 (_i 0) the
 * prompts are short (their prefills join passes up to 8 rows); in int8 and nf4 (_i 1, 2) three of them are 13 to
 * 21 tokens long, and their prefills join the passes too (the servers count them). */
typedef struct gen_job {
    sp_runtime *rt;
    const int32_t *prompt;
    int len, max_new, wait_for, seed;
    float temperature;
    int *progress; /* tokens made by all jobs (atomic) */
    sp_gen_result res;
    int ok;
} gen_job;

static int count_token(int row, int token, const char *text, void *user)
{
    (void)row, (void)token, (void)text;
    __atomic_add_fetch(((gen_job *)user)->progress, 1, __ATOMIC_SEQ_CST);
    return 0;
}

static void *gen_main(void *p)
{
    gen_job *j = p;
    while (__atomic_load_n(j->progress, __ATOMIC_SEQ_CST) < j->wait_for)
        usleep(1000);
    sp_lm_swarm sw;
    sp_lm lm = sp_lm_swarm_make(&sw, j->rt);
    sp_gen_opts o;
    sp_gen_opts_default(&o);
    o.max_new = j->max_new;
    o.stop_at_eos = 0;
    o.sample.temperature = j->temperature;
    o.sample.top_p = j->temperature > 0 ? 0.9f : 1;
    o.sample.seed = (uint64_t)j->seed;
    sp_err err = {0};
    j->ok = sp_generate(&lm, NULL, &j->prompt, &j->len, 1, &o, count_token, j, &j->res, &err) == SP_OK;
    return NULL;
}

START_TEST(t_concurrent_generations_batched)
{
    setenv("SEPAL_SERVER_FAULT", "slow:3", 1); /* answers 3 ms late: the others' steps come meanwhile */
    int dtypes[] = {SP_W_F32, SP_W_Q8, SP_W_NF4}, any = _i > 0;
    sp_runtime *rt = swarm_runtime_as(1, dtypes[_i]);
    static const int32_t p0[5] = {1, 17, 99, 3, 250}, p1[2] = {1, 400}, p2[7] = {1, 5, 6, 7, 8, 9, 10}, p3[3] = {1, 8, 9},
                         pl[21] = {1, 31, 77, 5, 120, 64, 9, 300, 42, 18, 210, 7, 55, 91, 13, 160, 8, 270, 33, 2, 150};
    enum { NJ = 5 };
    int progress = 0;
    gen_job j[NJ] = {{.prompt = any ? pl : p0, .len = any ? 21 : 5, .max_new = 16},
                     {.prompt = p1, .len = 2, .max_new = 10, .temperature = 0.8f, .seed = 3},
                     {.prompt = any ? pl + 4 : p2, .len = any ? 13 : 7, .max_new = 12, .wait_for = 4},
                     {.prompt = p3, .len = 3, .max_new = 8, .temperature = 1.0f, .seed = 11, .wait_for = 8},
                     {.prompt = any ? pl + 2 : p0, .len = any ? 17 : 5, .max_new = 6, .temperature = 0.8f, .seed = 5,
                      .wait_for = 12}};
    sp_gen_result together[NJ];
    for (int pass = 0; pass < 2; pass++) { /* at once, then one by one */
        pthread_t th[NJ];
        progress = pass ? 1 << 20 : 0;
        for (int i = 0; i < NJ; i++) {
            if (pass)
                together[i] = j[i].res;
            j[i].rt = rt, j[i].progress = &progress, j[i].ok = 0;
            pthread_create(&th[i], NULL, gen_main, &j[i]);
            if (pass)
                pthread_join(th[i], NULL);
        }
        for (int i = 0; !pass && i < NJ; i++)
            pthread_join(th[i], NULL);
        for (int i = 0; i < NJ; i++)
            ck_assert_msg(j[i].ok, "generation %d (pass %d) failed", i, pass);
        if (pass)
            continue;
        sp_server_batch_stats b0, b1;
        sp_server_batch_stats_get(srv[0], &b0);
        sp_server_batch_stats_get(srv[1], &b1);
        ck_assert_msg(b0.peak >= 2 || b1.peak >= 2, "no pass of two sessions: %llu and %llu rows at most",
                      (unsigned long long)b0.peak, (unsigned long long)b1.peak);
        ck_assert_msg(b0.long_prefills == (any ? 3u : 0u) && b1.long_prefills == (any ? 3u : 0u),
                      "long prefills through the passes: %llu and %llu", (unsigned long long)b0.long_prefills,
                      (unsigned long long)b1.long_prefills);
    }
    for (int i = 0; i < NJ; i++) {
        ck_assert_int_eq(together[i].n[0], j[i].max_new);
        ck_assert_int_eq(j[i].res.n[0], j[i].max_new);
        for (int t = 0; t < j[i].max_new; t++)
            ck_assert_msg(together[i].ids[0][t] == j[i].res.ids[0][t], "generation %d token %d: %d at once, %d alone",
                          i, t, together[i].ids[0][t], j[i].res.ids[0][t]);
        sp_gen_result_free(&together[i]);
        sp_gen_result_free(&j[i].res);
    }
    teardown(rt);
    unsetenv("SEPAL_SERVER_FAULT");
}
END_TEST

/* Concurrent greedy generations pushed from server to server (`push on`, servers 0:1 -> 1:3 -> 3:4, every step
 * through the workers' queue): the next servers batch the pushed steps as the first batches the steps it gets from
 * the clients. Each generation's tokens are those it gets alone (pushed, one after another) and client-driven
 * (`push off`, all at once); at once and pushed, every step the next servers took in was pushed (their pushes in), ran
 * in a pass (their batched rows, as many: the prompts are short, and each prefill joins the pass), and they ran them
 * in fewer passes than steps. */
START_TEST(t_concurrent_generations_pushed)
{
    setenv("SEPAL_SERVER_FAULT", "slow:3", 1); /* answers 3 ms late: the others' steps come meanwhile */
    srv[0] = start(0, 1, 1);
    srv[1] = start(1, 3, 1);
    srv[2] = start(3, 4, 1);
    sp_runtime *rt = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_runtime_new(&rt, NULL, NULL, &err), SP_OK);
    ck_assert_msg(sp_runtime_load(rt, GQA, &err) == SP_OK, "%s", err.msg);
    char addrs[128];
    snprintf(addrs, sizeof addrs, "127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", sp_server_port(srv[0]),
             sp_server_port(srv[1]), sp_server_port(srv[2]));
    ck_assert_msg(sp_runtime_connect(rt, addrs, &err) == SP_OK, "%s", err.msg);
    static const int32_t p0[5] = {1, 17, 99, 3, 250}, p1[1] = {1}, p2[7] = {1, 5, 6, 7, 8, 9, 10}, p3[3] = {1, 8, 9};
    enum { NJ = 4, NEW = 10 };
    const int32_t *ps[NJ] = {p0, p1, p2, p3};
    const int lens[NJ] = {5, 1, 7, 3};
    sp_gen_result res[3][NJ]; /* pushed at once, pushed alone, client-driven at once */
    for (int k = 0; k < 3; k++) {
        sp_rt_settings set;
        sp_runtime_settings(rt, &set);
        set.push = k < 2 ? SP_PUSH_ON : SP_PUSH_OFF;
        sp_runtime_set_settings(rt, &set);
        uint64_t in0[3], in1[3], out;
        sp_server_batch_stats b0[3], b1[3];
        for (int i = 1; i < 3; i++)
            sp_server_pushes(srv[i], &in0[i], &out), sp_server_batch_stats_get(srv[i], &b0[i]);
        int progress = 0;
        gen_job j[NJ];
        pthread_t th[NJ];
        for (int i = 0; i < NJ; i++) {
            j[i] = (gen_job){.rt = rt, .prompt = ps[i], .len = lens[i], .max_new = NEW, .progress = &progress};
            pthread_create(&th[i], NULL, gen_main, &j[i]);
            if (k == 1)
                pthread_join(th[i], NULL);
        }
        for (int i = 0; k != 1 && i < NJ; i++)
            pthread_join(th[i], NULL);
        for (int i = 0; i < NJ; i++) {
            ck_assert_msg(j[i].ok, "generation %d (run %d) failed", i, k);
            ck_assert_int_eq(j[i].res.n[0], NEW);
            res[k][i] = j[i].res;
        }
        for (int i = 1; k == 0 && i < 3; i++) {
            sp_server_pushes(srv[i], &in1[i], &out);
            sp_server_batch_stats_get(srv[i], &b1[i]);
            unsigned long long steps = in1[i] - in0[i], rows = b1[i].rows - b0[i].rows,
                               passes = b1[i].batches - b0[i].batches;
            printf("next server %d: %llu pushed steps, %llu rows in %llu passes, the most %llu\n", i, steps, rows,
                   passes, (unsigned long long)b1[i].peak);
            ck_assert_msg(steps >= NJ * (NEW - 1) && rows == steps + 12 && passes < steps,
                          "next server %d: %llu pushed steps, %llu rows through passes (%d prompt positions), in "
                          "%llu passes", i, steps, rows, 5 + 1 + 7 + 3, passes);
        }
    }
    for (int i = 0; i < NJ; i++) {
        for (int t = 0; t < NEW; t++) {
            ck_assert_msg(res[0][i].ids[0][t] == res[1][i].ids[0][t] && res[0][i].ids[0][t] == res[2][i].ids[0][t],
                          "generation %d token %d: %d pushed at once, %d pushed alone, %d client-driven", i, t,
                          res[0][i].ids[0][t], res[1][i].ids[0][t], res[2][i].ids[0][t]);
        }
        for (int k = 0; k < 3; k++)
            sp_gen_result_free(&res[k][i]);
    }
    teardown(rt);
    unsetenv("SEPAL_SERVER_FAULT");
}
END_TEST

/* Beam search must beat or tie greedy on its own score: check beams = 1 vs 4 local. */
START_TEST(t_beams_score_at_least_greedy)
{
    sp_model *full = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_model_load(&full, GQA, SP_LOAD_ALL, 0, -1, &err), SP_OK);
    sp_lm_local loc;
    sp_lm lm = sp_lm_local_make(&loc, full);
    int32_t p[3] = {1, 33, 77};
    const int32_t *ps[1] = {p};
    int len = 3;
    sp_gen_opts o;
    sp_gen_opts_default(&o);
    o.max_new = 8;
    o.stop_at_eos = 0;
    sp_gen_result g, b;
    ck_assert_int_eq(sp_generate(&lm, NULL, ps, &len, 1, &o, NULL, NULL, &g, &err), SP_OK);
    o.beams = 4;
    ck_assert_int_eq(sp_generate(&lm, NULL, ps, &len, 1, &o, NULL, NULL, &b, &err), SP_OK);
    /* score greedy's sequence with the model: sum of log-probs / length */
    sp_model_cache cache;
    ck_assert_int_eq(sp_model_cache_init(&cache, full, 1, 16, &err), SP_OK);
    float *logits = malloc((size_t)full->cfg.vocab * 4), *lp = malloc((size_t)full->cfg.vocab * 4);
    ck_assert_int_eq(sp_model_forward(full, logits, p, 1, 3, 0, &cache, 1, &err), SP_OK);
    double sum = 0;
    for (int i = 0; i < g.n[0]; i++) {
        sp_log_softmax(lp, logits, full->cfg.vocab);
        sum += lp[g.ids[0][i]];
        ck_assert_int_eq(sp_model_forward(full, logits, &g.ids[0][i], 1, 1, 3 + i, &cache, 1, &err), SP_OK);
    }
    ck_assert_double_ge(b.best_score, sum / g.n[0] - 1e-5);
    free(logits), free(lp);
    sp_model_cache_free(&cache);
    sp_gen_result_free(&g);
    sp_gen_result_free(&b);
    sp_model_free(full);
}
END_TEST

/* Max |a - b| over max |b|. */
static double rel_err(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs(b[i]));
    return sp_max_abs_diff(a, b, n) / (m > 0 ? m : 1);
}

/* FORWARD and BACKWARD over a 2-server route equal the local engine's blocks, in each wire encoding of the
 * hidden states and gradients (the `wire` setting: requests and replies): f32 within 1e-5, f16, bf16 and q8
 * within their rounding compounded over the two hops (relative to the largest value: 2e-3, 1.5e-2, 5e-2). */
START_TEST(t_forward_backward_over_route)
{
    sp_runtime *rt = swarm_runtime();
    sp_model *blocks = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_model_load(&blocks, GQA, SP_LOAD_BLOCKS, 0, -1, &err), SP_OK);
    int B = 2, T = 5, H = 64;
    size_t N = (size_t)B * T * H;
    sp_rng r;
    sp_rng_seed(&r, 4);
    float *x = malloc(N * 4), *y = malloc(N * 4), *g0 = malloc(N * 4), *g = malloc(N * 4), *gl = malloc(N * 4);
    float *bound = malloc(2 * N * 4), *acts = malloc(4 * N * 4), *out = malloc(N * 4);
    sp_rng_fill_normal(&r, x, (long)N, 1.0f);
    sp_rng_fill_normal(&r, g0, (long)N, 1.0f);
    /* local: the 4 blocks in a row, keeping each input, and back */
    sp_ws ws = {0};
    memcpy(acts, x, N * 4);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(sp_block_forward(&blocks->blocks[i], acts + (i + 1) * N, acts + i * N, B, T, 0, NULL, &ws, &err), SP_OK);
    ck_assert_int_eq(sp_block_forward(&blocks->blocks[3], out, acts + 3 * N, B, T, 0, NULL, &ws, &err), SP_OK);
    memcpy(gl, g0, N * 4);
    for (int i = 3; i >= 0; i--)
        ck_assert_int_eq(sp_block_backward(&blocks->blocks[i], gl, gl, acts + i * N, B, T, 0, NULL, &ws, &err), SP_OK);
    const struct { int enc; double tol; } wire[] = {{SP_ENC_F32, 1e-5}, {SP_ENC_F16, 2e-3}, {SP_ENC_BF16, 1.5e-2},
                                                     {SP_ENC_Q8, 5e-2}};
    for (int w = 0; w < 4; w++) {
        sp_rt_settings set;
        sp_runtime_settings(rt, &set);
        set.wire = wire[w].enc;
        sp_runtime_set_settings(rt, &set);
        sp_route route;
        ck_assert_int_eq(sp_runtime_route_train(rt, &route, &err), SP_OK);
        ck_assert_int_eq(route.nstages, 2);
        memcpy(y, x, N * 4);
        memcpy(g, g0, N * 4);
        ck_assert_int_eq(sp_runtime_forward(rt, &route, y, B, T, NULL, 0, bound, NULL, &err), SP_OK);
        ck_assert_int_eq(sp_runtime_backward(rt, &route, g, B, T, NULL, 0, bound, NULL, NULL, &err), SP_OK);
        double ey = rel_err(y, out, N), eg = rel_err(g, gl, N);
        printf("wire %s: output error %.2e, gradient error %.2e (relative to the largest value)\n",
               sp_encoding_name(wire[w].enc), ey, eg);
        ck_assert_double_le(ey, wire[w].tol);
        ck_assert_double_le(eg, wire[w].tol);
        if (w > 0) /* the encoding was used: not exact */
            ck_assert_double_gt(ey, 1e-6);
    }
    free(x), free(y), free(g0), free(g), free(gl), free(bound), free(acts), free(out);
    sp_ws_free(&ws);
    sp_model_free(blocks);
    teardown(rt);
}
END_TEST

/* Training's passes pushed from server to server (`push on`) and client-driven (`push off`) over three servers
 * (0:1, 1:3, 3:4) with deep prompts: in f32 the same outputs, input gradients and prompt gradients, bit for bit;
 * pushed, every FORWARD went 0:1 -> 1:3 -> 3:4 and every BACKWARD back (the servers' push counts), client-driven
 * none; in q8 the pushed pass is within the encoding's error of f32's (the pushes carry the wire's encoding). */
/* A runtime with llama-gqa loaded and connected to servers 0:1, 1:3 (holding await_bytes of pushed inputs, 0: the
 * default) and 3:4, its events to fn. */
static sp_runtime *three_servers(size_t await_bytes, sp_event_fn fn)
{
    srv[0] = start(0, 1, 0);
    srv[1] = start_with(1, 3, 0, await_bytes);
    srv[2] = start(3, 4, 0);
    sp_runtime *rt = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_runtime_new(&rt, fn, NULL, &err), SP_OK);
    ck_assert_msg(sp_runtime_load(rt, GQA, &err) == SP_OK, "%s", err.msg);
    char addrs[128];
    snprintf(addrs, sizeof addrs, "127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", sp_server_port(srv[0]),
             sp_server_port(srv[1]), sp_server_port(srv[2]));
    ck_assert_msg(sp_runtime_connect(rt, addrs, &err) == SP_OK, "%s", err.msg);
    return rt;
}

START_TEST(t_forward_backward_pushed)
{
    sp_runtime *rt = three_servers(0, NULL);
    sp_err err = {0};
    int B = 2, T = 5, H = 64, P = 2, L = 4;
    size_t N = (size_t)B * T * H, NP = (size_t)L * B * P * H;
    sp_rng r;
    sp_rng_seed(&r, 7);
    float *x = malloc(N * 4), *g0 = malloc(N * 4), *prompts = malloc(NP * 4), *y[3], *g[3], *gp[3];
    float *bound = malloc(3 * N * 4);
    sp_rng_fill_normal(&r, x, (long)N, 1.0f);
    sp_rng_fill_normal(&r, g0, (long)N, 1.0f);
    sp_rng_fill_normal(&r, prompts, (long)NP, 0.1f);
    const struct { int push, wire; } run[3] = {{SP_PUSH_OFF, SP_ENC_F32}, {SP_PUSH_ON, SP_ENC_F32}, {SP_PUSH_ON, SP_ENC_Q8}};
    for (int k = 0; k < 3; k++) {
        sp_rt_settings set;
        sp_runtime_settings(rt, &set);
        set.push = run[k].push;
        set.wire = run[k].wire;
        sp_runtime_set_settings(rt, &set);
        uint64_t in0[3], out0[3], in1, out1;
        for (int i = 0; i < 3; i++)
            sp_server_pushes(srv[i], &in0[i], &out0[i]);
        y[k] = malloc(N * 4), g[k] = malloc(N * 4), gp[k] = calloc(NP, 4);
        for (int rep = 0; rep < 2; rep++) { /* twice: the second pass's pushes go over kept connections */
            sp_route route;
            ck_assert_int_eq(sp_runtime_route_train(rt, &route, &err), SP_OK);
            ck_assert_int_eq(route.nstages, 3);
            memcpy(y[k], x, N * 4);
            memcpy(g[k], g0, N * 4);
            ck_assert_msg(sp_runtime_forward(rt, &route, y[k], B, T, prompts, P, bound, NULL, &err) == SP_OK, "%s",
                          err.msg);
            ck_assert_msg(sp_runtime_backward(rt, &route, g[k], B, T, prompts, P, bound, gp[k], NULL, &err) == SP_OK,
                          "%s", err.msg);
        }
        for (int i = 0; i < 3; i++) { /* each pass: 2 pushes out, from the first (forward) and last (backward) 1 */
            sp_server_pushes(srv[i], &in1, &out1);
            int want = run[k].push == SP_PUSH_ON ? 2 * (i == 1 ? 2 : 1) : 0;
            ck_assert_int_eq((int)(out1 - out0[i]), want);
            ck_assert_int_eq((int)(in1 - in0[i]), want);
        }
    }
    ck_assert_msg(!memcmp(y[0], y[1], N * 4), "pushed forward differs from client-driven");
    ck_assert_msg(!memcmp(g[0], g[1], N * 4), "pushed backward differs from client-driven");
    ck_assert_msg(!memcmp(gp[0], gp[1], NP * 4), "pushed prompt gradients differ from client-driven");
    double ey = rel_err(y[2], y[0], N), eg = rel_err(g[2], g[0], N);
    printf("pushed q8: output error %.2e, gradient error %.2e\n", ey, eg);
    ck_assert_double_le(ey, 5e-2);
    ck_assert_double_le(eg, 5e-2);
    ck_assert_double_gt(ey, 1e-6);
    for (int k = 0; k < 3; k++)
        free(y[k]), free(g[k]), free(gp[k]);
    free(x), free(g0), free(prompts), free(bound);
    teardown(rt);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* a push that did not arrive pauses pushes for a while */

static double fake_t;
static double fake_now(void *u)
{
    (void)u;
    return fake_t;
}
static void fake_sleep(void *u, double s)
{
    (void)u;
    fake_t += s;
}
static const sp_rt_clock FAKE_CLOCK = {fake_now, fake_sleep, NULL};

static int missed_events;
static void count_missed(const sp_event *ev, void *user)
{
    (void)user;
    if (ev->kind == SP_EV_SERVER && ev->text && strstr(ev->text, "could not push to the next server")) {
        missed_events++;
        printf("event: %s\n", ev->text);
    }
}

/* One FORWARD and BACKWARD over a training route of 3 stages through rt: y, g the output and input gradient; the
 * pushes each server took in over it (in[3]). */
static void pass_counted(sp_runtime *rt, const float *x, const float *g0, float *y, float *g, int B, int T,
                         uint64_t in[3])
{
    size_t N = (size_t)B * T * 64;
    uint64_t in0[3], out;
    for (int i = 0; i < 3; i++)
        sp_server_pushes(srv[i], &in0[i], &out);
    float *bound = malloc(3 * N * 4);
    sp_route route;
    sp_err err = {0};
    ck_assert_int_eq(sp_runtime_route_train(rt, &route, &err), SP_OK);
    ck_assert_int_eq(route.nstages, 3);
    memcpy(y, x, N * 4);
    memcpy(g, g0, N * 4);
    ck_assert_msg(sp_runtime_forward(rt, &route, y, B, T, NULL, 0, bound, NULL, &err) == SP_OK, "%s", err.msg);
    ck_assert_msg(sp_runtime_backward(rt, &route, g, B, T, NULL, 0, bound, NULL, NULL, &err) == SP_OK, "%s", err.msg);
    for (int i = 0; i < 3; i++) {
        sp_server_pushes(srv[i], &in[i], &out);
        in[i] -= in0[i];
    }
    free(bound);
}

/* A training push between two servers that did not arrive pauses pushes between them for a while (SP_RT_NO_PUSH_S
 * on the runtime's clock, a fake one here), not for good. Server 1:3 holds few pushed inputs (await_bytes), and an
 * input of the test's own fills them, so 0:1's push into it is refused ("busy"): the pass goes on client-driven, with
 * push off's bits, saying so once; the next pass is client-driven (nothing pushed, nothing said); once the test's
 * input is taken, the pause is not over yet: still client-driven; once the clock passed it, passes are pushed again
 * (1:3 takes two pushes, from 0:1 forward and 3:4 backward), the same bits. */
START_TEST(t_push_pause_expires)
{
    missed_events = 0;
    sp_runtime *rt = three_servers(8 << 10, count_missed);
    fake_t = 1000;
    sp_runtime_set_clock(rt, &FAKE_CLOCK);
    int B = 2, T = 5, H = 64;
    size_t N = (size_t)B * T * H;
    sp_rng r;
    sp_rng_seed(&r, 9);
    float *x = malloc(N * 4), *g0 = malloc(N * 4), *y0 = malloc(N * 4), *g = malloc(N * 4), *y = malloc(N * 4),
          *gx = malloc(N * 4), junk[24 * 64] = {0};
    sp_rng_fill_normal(&r, x, (long)N, 1.0f);
    sp_rng_fill_normal(&r, g0, (long)N, 1.0f);
    uint64_t in[3];
    sp_rt_settings set;
    sp_runtime_settings(rt, &set);
    set.push = SP_PUSH_OFF;
    sp_runtime_set_settings(rt, &set);
    pass_counted(rt, x, g0, y0, gx, B, T, in); /* the bits to get */
    set.push = SP_PUSH_ON;
    sp_runtime_set_settings(rt, &set);
    /* 1:3's pushed inputs filled (6 of its 8 KiB) by an input no request claims yet */
    sp_remote *rm = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_remote_connect(&rm, "127.0.0.1", sp_server_port(srv[1]), 1, 20000, &err), SP_OK);
    char meta[256];
    sp_span_push_req p = {.id = 1u << 30, .token = 77};
    ck_assert_int_eq(sp_span_push_req_encode(&p, meta, sizeof meta, NULL), SP_OK);
    sp_tensor_src tj = {.enc = SP_ENC_F32, .rank = 3, .shape = {1, 24, H}, .f32 = junk};
    sp_reply rep;
    ck_assert_msg(sp_remote_call(rm, SP_MSG_SPAN_PUSH, meta, &tj, 1, &rep, 20000, &err) == SP_OK, "%s", err.msg);
    sp_reply_clear(&rep);
    for (int k = 0; k < 4; k++) { /* 0: refused; 1: paused; 2: the input taken, still paused; 3: the pause over */
        if (k == 2) { /* the request that claims the test's input */
            sp_forward_req q = {.start = 1, .end = 3, .reply_encoding = -1, .await = 1u << 30, .await_token = 77};
            ck_assert_int_eq(sp_forward_req_encode(&q, meta, sizeof meta, NULL), SP_OK);
            ck_assert_msg(sp_remote_call(rm, SP_MSG_FORWARD, meta, NULL, 0, &rep, 20000, &err) == SP_OK, "%s",
                          err.msg);
            sp_reply_clear(&rep);
        }
        if (k == 3)
            fake_t += SP_RT_NO_PUSH_S + 1;
        pass_counted(rt, x, g0, y, g, B, T, in);
        sp_server_awaits aw;
        sp_server_awaits_get(srv[1], &aw);
        printf("pass %d: pushes in %d %d %d, 1:3 refused %d\n", k, (int)in[0], (int)in[1], (int)in[2],
               (int)aw.refused);
        ck_assert_msg(!memcmp(y, y0, N * 4) && !memcmp(g, gx, N * 4), "pass %d differs from push off's", k);
        ck_assert_int_eq(aw.refused, 1);
        int want = k == 3 ? 2 : 0; /* pushed again: 0:1's FORWARD and 3:4's BACKWARD into 1:3 */
        ck_assert_int_eq((int)in[1], want);
        ck_assert_int_eq(missed_events, 1);
    }
    sp_remote_close(rm);
    free(x), free(g0), free(y0), free(g), free(y), free(gx);
    teardown(rt);
}
END_TEST

/* The inference tests' prompt and the token after it. */
static int32_t session_prompt[6] = {1, 17, 99, 3, 250, 8}, session_next = 77;

/* Logits of an inference session in encoding wire (the setting): the 6-token prefill into logits[0..V), one decode
 * step into logits[V..2V). */
static void session_in(sp_runtime *rt, int wire, float *logits, int V)
{
    sp_rt_settings set;
    sp_runtime_settings(rt, &set);
    set.wire = wire;
    sp_runtime_set_settings(rt, &set);
    sp_err err = {0};
    sp_lm_swarm sw;
    sp_lm ls = sp_lm_swarm_make(&sw, rt);
    ck_assert_msg(ls.begin(ls.ctx, 1, 16, &err) == SP_OK, "%s", err.msg);
    ck_assert_msg(ls.forward(ls.ctx, session_prompt, 1, 6, logits, &err) == SP_OK, "%s", err.msg);
    ck_assert_msg(ls.forward(ls.ctx, &session_next, 1, 1, logits + V, &err) == SP_OK, "%s", err.msg);
    ls.end(ls.ctx);
}

/* Inference steps in each wire encoding (the `wire` setting covers them: the step's input, the reply): the logits
 * of a prompt and of a decode step through the swarm's 2 servers against one process's, f32 within 1e-4 of the
 * largest, the others within their rounding (2e-3, 2e-2, 6e-2) and not exact (the encoding was used). */
START_TEST(t_inference_wire)
{
    sp_runtime *rt = swarm_runtime();
    sp_model *full = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_model_load(&full, GQA, SP_LOAD_ALL, 0, -1, &err), SP_OK);
    int V = full->cfg.vocab;
    float *want = malloc(2 * (size_t)V * 4), *got = malloc(2 * (size_t)V * 4);
    sp_lm_local loc;
    sp_lm lm = sp_lm_local_make(&loc, full);
    ck_assert_int_eq(lm.begin(lm.ctx, 1, 16, &err), SP_OK);
    ck_assert_int_eq(lm.forward(lm.ctx, session_prompt, 1, 6, want, &err), SP_OK);
    ck_assert_int_eq(lm.forward(lm.ctx, &session_next, 1, 1, want + V, &err), SP_OK);
    lm.end(lm.ctx);
    const struct { int enc; double tol; } wire[] = {{SP_ENC_F32, 1e-4}, {SP_ENC_F16, 2e-3}, {SP_ENC_BF16, 2e-2},
                                                     {SP_ENC_Q8, 6e-2}};
    for (int w = 0; w < 4; w++) {
        session_in(rt, wire[w].enc, got, V);
        double e = rel_err(got, want, 2 * (size_t)V);
        printf("wire %s: inference logits error %.2e (relative to the largest)\n", sp_encoding_name(wire[w].enc), e);
        ck_assert_double_le(e, wire[w].tol);
        if (w > 0)
            ck_assert_double_gt(e, 1e-6);
    }
    free(want), free(got);
    sp_model_free(full);
    teardown(rt);
}
END_TEST

/* The local LM head in another encoding (the `dtype` setting): set before a load it applies at the load, set
 * after it re-encodes; logits stay close to f32's (bounds from the encodings' precision), f32 again is exact. */
START_TEST(t_head_dtype)
{
    sp_err err = {0};
    sp_runtime *ref = NULL, *rt = NULL;
    ck_assert_int_eq(sp_runtime_new(&ref, NULL, NULL, &err), SP_OK);
    ck_assert_int_eq(sp_runtime_new(&rt, NULL, NULL, &err), SP_OK);
    ck_assert_msg(sp_runtime_load(ref, GQA, &err) == SP_OK, "%s", err.msg);
    ck_assert_int_eq(sp_runtime_set_head_dtype(rt, SP_W_Q8, &err), SP_OK);
    ck_assert_msg(sp_runtime_load(rt, GQA, &err) == SP_OK, "%s", err.msg);
    ck_assert_int_eq(sp_runtime_model(rt)->head_q.type, SP_W_Q8);
    ck_assert_int_eq(sp_runtime_head_dtype(rt), SP_W_Q8);
    ck_assert_int_eq(sp_runtime_model(ref)->head_q.type, SP_W_F32);
    int H = sp_runtime_config(ref)->hidden, V = sp_runtime_config(ref)->vocab, N = 3;
    float *x = malloc(sizeof(float) * N * H), *want = malloc(sizeof(float) * N * V), *got = malloc(sizeof(float) * N * V);
    sp_rng rng;
    sp_rng_seed(&rng, 11);
    for (int i = 0; i < N * H; i++)
        x[i] = sp_rng_normal(&rng);
    ck_assert_int_eq(sp_model_head(sp_runtime_model(ref), want, x, N, &err), SP_OK);
    /* fp16: an 11-bit significand to bf16's 8, so 8 times closer (0.01 / 8), and closer than bf16 here */
    const struct { sp_wtype t; double tol; } cases[] = {
        {SP_W_Q8, 0.03}, {SP_W_BF16, 0.01}, {SP_W_NF4, 0.25}, {SP_W_F16, 0.00125}};
    double worst[SP_W__COUNT] = {0};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        ck_assert_int_eq(sp_runtime_set_head_dtype(rt, cases[c].t, &err), SP_OK);
        ck_assert_int_eq(sp_runtime_model(rt)->head_q.type, cases[c].t);
        ck_assert_int_eq(sp_model_head(sp_runtime_model(rt), got, x, N, &err), SP_OK);
        for (int n = 0; n < N; n++) {
            const float *w = want + (size_t)n * V, *g = got + (size_t)n * V;
            double ss = 0, es = 0;
            int am = 0, gm = 0;
            for (int v = 0; v < V; v++) {
                ss += (double)w[v] * w[v];
                es += ((double)g[v] - w[v]) * ((double)g[v] - w[v]);
                am = w[v] > w[am] ? v : am;
                gm = g[v] > g[gm] ? v : gm;
            }
            double rel = sqrt(es / ss);
            worst[cases[c].t] = fmax(worst[cases[c].t], rel);
            ck_assert_msg(rel < cases[c].tol, "%s: relative error %.4f of the logits (bound %.3g)",
                          sp_wtype_name(cases[c].t), rel, cases[c].tol);
            ck_assert_msg(rel > 0 || cases[c].t == SP_W_F32, "%s: the head was not re-encoded", sp_wtype_name(cases[c].t));
            /* the chosen token is the best one, or one within the error of it */
            ck_assert_msg(w[am] - w[gm] <= 3 * rel * sqrt(ss / V), "%s: argmax %d (%.4f) vs %d (%.4f)",
                          sp_wtype_name(cases[c].t), gm, w[gm], am, w[am]);
        }
        printf("head in %s: logits' relative error %.2e\n", sp_wtype_name(cases[c].t), worst[cases[c].t]);
    }
    ck_assert_msg(worst[SP_W_F16] < worst[SP_W_BF16] / 4, "fp16 head (%.2e) not closer to f32 than bf16 (%.2e)",
                  worst[SP_W_F16], worst[SP_W_BF16]);
    ck_assert_int_eq(sp_runtime_set_head_dtype(rt, SP_W_F32, &err), SP_OK);
    ck_assert_int_eq(sp_model_head(sp_runtime_model(rt), got, x, N, &err), SP_OK);
    ck_assert_msg(!memcmp(got, want, sizeof(float) * N * V), "f32 again is not f32's logits");
    ck_assert_int_ne(sp_runtime_set_head_dtype(rt, 99, &err), SP_OK);
    ck_assert_ptr_nonnull(strstr(err.msg, "expected f32, bf16, int8, nf4 or fp16"));
    free(x);
    free(want);
    free(got);
    sp_runtime_free(rt);
    sp_runtime_free(ref);
}
END_TEST

/* The `threads` setting: the local parts get a pool of their own (1 thread here), the head's logits are the
 * same bits as on the default pool (each row is one thread's dot product), 0 goes back to the default. */
START_TEST(t_threads)
{
    sp_err err = {0};
    sp_runtime *rt = NULL;
    ck_assert_int_eq(sp_runtime_new(&rt, NULL, NULL, &err), SP_OK);
    ck_assert_int_eq(sp_runtime_set_threads(rt, 1, &err), SP_OK); /* before the load: applied at it */
    ck_assert_msg(sp_runtime_load(rt, GQA, &err) == SP_OK, "%s", err.msg);
    sp_model *m = sp_runtime_model(rt);
    ck_assert_ptr_nonnull(m->pool);
    ck_assert_int_eq(sp_pool_threads(m->pool), 1);
    ck_assert_int_eq(sp_runtime_threads(rt), 1);
    int H = sp_runtime_config(rt)->hidden, V = sp_runtime_config(rt)->vocab;
    float *x = malloc(sizeof(float) * 2 * H), *a = malloc(sizeof(float) * 2 * V), *b = malloc(sizeof(float) * 2 * V);
    sp_rng rng;
    sp_rng_seed(&rng, 5);
    for (int i = 0; i < 2 * H; i++)
        x[i] = sp_rng_normal(&rng);
    ck_assert_int_eq(sp_model_head(m, a, x, 2, &err), SP_OK);
    ck_assert_int_eq(sp_runtime_set_threads(rt, 0, &err), SP_OK);
    ck_assert_ptr_null(m->pool);
    ck_assert_int_eq(sp_runtime_threads(rt), 0);
    ck_assert_int_eq(sp_model_head(m, b, x, 2, &err), SP_OK);
    ck_assert_msg(!memcmp(a, b, sizeof(float) * 2 * V), "1 thread and the default pool differ");
    ck_assert_int_eq(sp_runtime_set_threads(rt, 2, &err), SP_OK);
    ck_assert_int_eq(sp_pool_threads(m->pool), 2);
    ck_assert_int_ne(sp_runtime_set_threads(rt, 300, &err), SP_OK);
    ck_assert_ptr_nonnull(strstr(err.msg, "expected 0 (every CPU) to 256"));
    ck_assert_int_eq(sp_pool_threads(m->pool), 2); /* the pool in use stays */
    free(x);
    free(a);
    free(b);
    sp_runtime_free(rt);
}
END_TEST

/* Cancellation: a first cancel while steps are to finish leaves the waits alone; a second one, a cancel
 * outside such steps, or their end after a cancel, ends the waits too; clearing resets both. */
START_TEST(t_cancel_finish_steps)
{
    sp_runtime *rt = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_runtime_new(&rt, NULL, NULL, &err), SP_OK);
    sp_runtime_cancel(rt);
    ck_assert(sp_runtime_cancelled(rt) && sp_runtime_waits_cancelled(rt));
    sp_runtime_cancel_clear(rt);
    ck_assert(!sp_runtime_cancelled(rt) && !sp_runtime_waits_cancelled(rt));
    sp_runtime_finish_steps(rt, 1);
    sp_runtime_cancel(rt);
    ck_assert(sp_runtime_cancelled(rt));
    ck_assert_msg(!sp_runtime_waits_cancelled(rt), "the first cancel lets the step finish");
    sp_runtime_cancel(rt);
    ck_assert_msg(sp_runtime_waits_cancelled(rt), "a second cancel ends the waits");
    sp_runtime_cancel_clear(rt);
    sp_runtime_cancel(rt);
    ck_assert(!sp_runtime_waits_cancelled(rt));
    sp_runtime_finish_steps(rt, 0);
    ck_assert_msg(sp_runtime_waits_cancelled(rt), "the step over, nothing is waited for");
    sp_runtime_cancel_clear(rt);
    sp_runtime_finish_steps(rt, 1);
    sp_runtime_finish_steps(rt, 0);
    ck_assert(!sp_runtime_cancelled(rt) && !sp_runtime_waits_cancelled(rt));
    sp_runtime_free(rt);
}
END_TEST

/* What front ends read of the opaque runtime comes as copies: the server rows (each server once, in the table's
 * order; a copy the runtime does not see changed), the settings (the defaults; set replaces them), the last
 * route; nothing of a swarm before one is joined or started. */
START_TEST(t_front_end_copies)
{
    sp_runtime *rt = swarm_runtime();
    sp_server_row *rows = NULL;
    ck_assert_int_eq(sp_runtime_servers(rt, &rows), 2);
    ck_assert_int_eq(sp_runtime_server_count(rt), 2);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(rows[i].rec.port, sp_server_port(srv[i]));
        ck_assert_int_eq(rows[i].rec.start, 2 * i);
        ck_assert_int_eq(rows[i].rec.end, 2 * i + 2);
        ck_assert_int_eq(rows[i].rec.state, SP_SERVER_ONLINE);
        ck_assert(!rows[i].gone && !rows[i].from_dht && rows[i].pid == 0 && rows[i].failures == 0);
        ck_assert_double_le(rows[i].banned_until, sp_runtime_now(rt));
        ck_assert_int_gt(rows[i].cache_total, 0); /* from INFO */
    }
    rows[0].rec.port = 1, rows[0].gone = 1;
    free(rows);
    ck_assert_int_eq(sp_runtime_servers(rt, &rows), 2);
    ck_assert_int_eq(rows[0].rec.port, sp_server_port(srv[0]));
    ck_assert(!rows[0].gone);
    free(rows);
    sp_route r;
    sp_runtime_last_route(rt, &r);
    ck_assert_int_eq(r.nhops, 2);
    ck_assert_int_eq(r.hop[0].server, 0);
    ck_assert_int_eq(r.hop[1].start, 2);
    sp_rt_settings set;
    sp_runtime_settings(rt, &set);
    ck_assert_int_eq(set.max_retries, 8);
    ck_assert_double_eq(set.ban_s, 15);
    ck_assert_double_eq(set.backoff_max_s, 60);
    ck_assert_double_eq(set.update_period_s, 10);
    ck_assert_str_eq(set.blocked, "");
    set.max_retries = 3;
    snprintf(set.blocked, sizeof set.blocked, "127.0.0.1:%d", sp_server_port(srv[1]));
    sp_runtime_set_settings(rt, &set);
    memset(&set, 0, sizeof set);
    sp_runtime_settings(rt, &set);
    ck_assert_int_eq(set.max_retries, 3);
    ck_assert_double_eq(set.ban_s, 15);
    sp_err err = {0};
    ck_assert_int_ne(sp_runtime_route(rt, &err), SP_OK); /* the routes see it: 2:4 is blocked */
    ck_assert_ptr_nonnull(strstr(err.msg, "no online server holds block 2"));
    ck_assert(!sp_runtime_in_swarm(rt) && !sp_runtime_swarm_started(rt));
    ck_assert_str_eq(sp_runtime_swarm_key_path(rt), "");
    teardown(rt);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* wire auto: the encoding by the link the client measured */

#define AUTO_B 8
#define AUTO_T 128 /* [8, 128, 64] in f32: 262 KB a message, ~87 ms at 24 Mbit/s */
#define AUTO_N ((size_t)AUTO_B * AUTO_T * 64)

/* A FORWARD of x over the training route in encoding wire (the setting), into y. */
static void forward_in(sp_runtime *rt, int wire, const float *x, float *y)
{
    sp_rt_settings set;
    sp_runtime_settings(rt, &set);
    set.wire = wire;
    sp_runtime_set_settings(rt, &set);
    sp_route route;
    sp_err err = {0};
    ck_assert_int_eq(sp_runtime_route_train(rt, &route, &err), SP_OK);
    memcpy(y, x, AUTO_N * 4);
    ck_assert_msg(sp_runtime_forward(rt, &route, y, AUTO_B, AUTO_T, NULL, 0, NULL, NULL, &err) == SP_OK, "%s",
                  err.msg);
}

/* Three FORWARDs in wire auto (the first measures the links), then one each in auto, f32 and bf16 (where: what the
 * lines printed call the links): each server's row says auto sends want there, having measured its link in [lo, hi]
 * Mbit/s (want f32: or nothing), and auto's output is want's bit for bit, not the other's. */
static void wire_auto_check(sp_runtime *rt, const char *where, double lo, double hi, int want)
{
    sp_rng r;
    sp_rng_seed(&r, 11);
    float *x = malloc(AUTO_N * 4), *ya = malloc(AUTO_N * 4), *yf = malloc(AUTO_N * 4), *yb = malloc(AUTO_N * 4);
    sp_rng_fill_normal(&r, x, (long)AUTO_N, 1.0f);
    for (int k = 0; k < 3; k++)
        forward_in(rt, SP_WIRE_AUTO, x, ya);
    for (int i = 0; i < 2; i++) {
        sp_server_row row;
        ck_assert(sp_test_server_row(rt, i, &row));
        printf("wire auto %s: server %d measured %.1f Mbit/s back, %.1f toward it (0: nothing), sends %s\n", where, i,
               row.link_mbit, row.link_up_mbit, sp_encoding_name(row.wire_auto));
        ck_assert_msg((want == SP_ENC_F32 && row.link_mbit == 0) || (row.link_mbit >= lo && row.link_mbit <= hi),
                      "measured %.1f Mbit/s", row.link_mbit);
        ck_assert_int_eq(row.wire_auto, want);
    }
    forward_in(rt, SP_WIRE_AUTO, x, ya);
    forward_in(rt, SP_ENC_F32, x, yf);
    forward_in(rt, SP_ENC_BF16, x, yb);
    int f32_same = !memcmp(ya, yf, AUTO_N * 4), bf16_same = !memcmp(ya, yb, AUTO_N * 4);
    ck_assert_msg(want == SP_ENC_F32 ? f32_same && !bf16_same : bf16_same && !f32_same, "wire auto did not send %s",
                  sp_encoding_name(want));
    free(x), free(ya), free(yf), free(yb);
}

/* A runtime with llama-gqa loaded and connected to nsrv servers (2: blocks 0:2 and 2:4; 1: blocks 0:4; old: as
 * servers from before push, sp_server_opts.emulate_old), each one's websocket and bulk ports behind a bench/linkem
 * relay of 1 ms each way and rate ("MBIT[/MBIT]": toward the server / back), its link in *link. */
static sp_runtime *relayed_runtime(int nsrv, int old, const char *rate, sp_test_proc *link)
{
    sp_server_opts o;
    sp_server_opts_default(&o);
    o.model_dir = GQA;
    o.measure = 0;
    o.emulate_old = old ? SP_SERVER_OLD_NOPUSH : 0;
    sp_err err = {0};
    char spec[4][2][32];
    const char *args[6 + 4 * 4 + 1] = {"--delay", "1", "--rate", rate};
    int na = 4;
    for (int i = 0; i < nsrv; i++) {
        int relay[2] = {sp_test_free_port(), sp_test_free_port()};
        o.start = nsrv == 1 ? 0 : 2 * i, o.end = nsrv == 1 ? 4 : 2 * i + 2;
        o.public_bulk_port = relay[1]; /* HELLO sends clients through the relay */
        ck_assert_msg(sp_server_start(&srv[i], &o, &err) == SP_OK, "%s", err.msg);
        for (int j = 0; j < 2; j++) {
            snprintf(spec[2 * i + j][0], sizeof spec[0][0], "127.0.0.1:%d", relay[j]);
            snprintf(spec[2 * i + j][1], sizeof spec[0][1], "127.0.0.1:%d",
                     j ? sp_server_bulk_port(srv[i]) : sp_server_port(srv[i]));
            const char *pair[4] = {"--listen", spec[2 * i + j][0], "--to", spec[2 * i + j][1]};
            memcpy(args + na, pair, sizeof pair);
            na += 4;
        }
    }
    args[na] = NULL;
    ck_assert_int_eq(sp_test_linkem_start(link, args), 0);
    sp_runtime *rt = NULL;
    ck_assert_int_eq(sp_runtime_new(&rt, NULL, NULL, &err), SP_OK);
    ck_assert_msg(sp_runtime_load(rt, GQA, &err) == SP_OK, "%s", err.msg);
    char addrs[128];
    snprintf(addrs, sizeof addrs, "%s%s%s", spec[0][0], nsrv > 1 ? "," : "", nsrv > 1 ? spec[2][0] : "");
    ck_assert_msg(sp_runtime_connect(rt, addrs, &err) == SP_OK, "%s", err.msg);
    return rt;
}

/* wire auto behind links of 24 Mbit/s (bench/linkem relays for each server's websocket and bulk ports, 1 ms each
 * way): the client's measured rate of each link is within a factor of 2 of 24 Mbit/s, auto sends bf16 there, and
 * does (its output is bf16's, bit for bit, not f32's); an inference session's prefill goes in bf16 too, its decode
 * step in f32. */
START_TEST(t_wire_auto_slow_link)
{
    sp_test_proc link;
    sp_runtime *rt = relayed_runtime(2, 0, "24", &link);
    wire_auto_check(rt, "behind 24 Mbit/s", 12, 48, SP_ENC_BF16);
    /* an inference session there: its prefill in bf16 (bf16's logits, bit for bit), its decode step in f32 (not) */
    int V = 512; /* llama-gqa's vocabulary */
    float *la = malloc(2 * (size_t)V * 4), *lb = malloc(2 * (size_t)V * 4);
    session_in(rt, SP_WIRE_AUTO, la, V);
    session_in(rt, SP_ENC_BF16, lb, V);
    ck_assert_msg(!memcmp(la, lb, (size_t)V * 4), "wire auto's prefill was not in bf16");
    ck_assert_msg(memcmp(la + V, lb + V, (size_t)V * 4), "wire auto's decode step was not in f32");
    free(la), free(lb);
    sp_test_proc_signal(&link, SIGTERM);
    teardown(rt);
}
END_TEST

/* wire auto over an asymmetric link: one server (blocks 0:4) behind a relay of 24 Mbit/s toward it and no limit back.
 * The server measures the client's requests (its replies' rx_mbit) within a factor of 2 of 24 Mbit/s, the client
 * the replies at 300 Mbit/s or more (or not at all), so auto sends bf16 and asks for f32 back: the FORWARD's output is
 * f32's on the input rounded to bf16, bit for bit (neither f32's nor bf16's both ways); an inference session's
 * prefill logits are neither f32's nor bf16's both ways. _i 1: an older server, which says nothing of the requests'
 * rate: the rate back stands in, and auto sends f32 both ways (f32's output, bit for bit). */
START_TEST(t_wire_auto_asymmetric)
{
    sp_test_proc link;
    sp_runtime *rt = relayed_runtime(1, _i, "24/0", &link);
    sp_rng r;
    sp_rng_seed(&r, 12);
    float *x = malloc(AUTO_N * 4), *xb = malloc(AUTO_N * 4), *ya = malloc(AUTO_N * 4), *yr = malloc(AUTO_N * 4),
          *yb = malloc(AUTO_N * 4);
    sp_rng_fill_normal(&r, x, (long)AUTO_N, 1.0f);
    for (size_t k = 0; k < AUTO_N; k++)
        xb[k] = _i ? x[k] : sp_bf16_to_f32(sp_f32_to_bf16(x[k])); /* what auto's output must be f32's of */
    for (int k = 0; k < 3; k++) /* (the first measures the link) */
        forward_in(rt, SP_WIRE_AUTO, x, ya);
    sp_server_row row;
    ck_assert(sp_test_server_row(rt, 0, &row));
    printf("wire auto over 24 Mbit/s up, unlimited down%s: measured %.1f Mbit/s up, %.1f down (0: nothing), sends "
           "%s, asks for %s back\n", _i ? " (an older server)" : "", row.link_up_mbit, row.link_mbit,
           sp_encoding_name(row.wire_auto), sp_encoding_name(row.wire_auto_back));
    ck_assert_msg(_i ? row.link_up_mbit == 0 : row.link_up_mbit >= 12 && row.link_up_mbit <= 48,
                  "measured %.1f Mbit/s up", row.link_up_mbit);
    ck_assert_msg(row.link_mbit == 0 || row.link_mbit >= SP_WIRE_AUTO_MBIT, "measured %.1f Mbit/s down", row.link_mbit);
    ck_assert_int_eq(row.wire_auto, _i ? SP_ENC_F32 : SP_ENC_BF16);
    ck_assert_int_eq(row.wire_auto_back, SP_ENC_F32);
    forward_in(rt, SP_WIRE_AUTO, x, ya);
    forward_in(rt, SP_ENC_F32, xb, yr);
    forward_in(rt, SP_ENC_BF16, x, yb);
    ck_assert_msg(!memcmp(ya, yr, AUTO_N * 4), "wire auto did not send %s and ask for f32 back", _i ? "f32" : "bf16");
    ck_assert_msg(memcmp(ya, yb, AUTO_N * 4), "wire auto asked for bf16 back");
    int V = 512;
    float *la = malloc(2 * (size_t)V * 4), *lf = malloc(2 * (size_t)V * 4), *lb = malloc(2 * (size_t)V * 4);
    session_in(rt, SP_WIRE_AUTO, la, V);
    session_in(rt, SP_ENC_F32, lf, V);
    session_in(rt, SP_ENC_BF16, lb, V);
    ck_assert_msg(_i ? !memcmp(la, lf, (size_t)V * 4) : memcmp(la, lf, (size_t)V * 4) && memcmp(la, lb, (size_t)V * 4),
                  "wire auto's prefill went the wrong way");
    free(x), free(xb), free(ya), free(yr), free(yb), free(la), free(lf), free(lb);
    sp_test_proc_signal(&link, SIGTERM);
    teardown(rt);
}
END_TEST

/* wire auto on plain loopback: nothing measured below 300 Mbit/s, auto sends f32 and its output is f32's. */
START_TEST(t_wire_auto_loopback)
{
    sp_runtime *rt = swarm_runtime();
    wire_auto_check(rt, "on loopback", SP_WIRE_AUTO_MBIT, INFINITY, SP_ENC_F32);
    teardown(rt);
}
END_TEST

START_TEST(t_errors)
{
    sp_runtime *rt = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_runtime_new(&rt, NULL, NULL, &err), SP_OK);
    ck_assert_int_ne(sp_runtime_swarm_up(rt, 2, 0, &err), SP_OK); /* nothing loaded */
    ck_assert_ptr_nonnull(strstr(err.msg, "no model loaded"));
    ck_assert_int_eq(sp_runtime_load(rt, GQA, &err), SP_OK);
    ck_assert_int_ne(sp_runtime_connect(rt, "127.0.0.1:1", &err), SP_OK);
    ck_assert_ptr_nonnull(strstr(err.msg, "127.0.0.1:1"));
    ck_assert_int_ne(sp_runtime_connect(rt, "nonsense", &err), SP_OK);
    ck_assert_ptr_nonnull(strstr(err.msg, "HOST:PORT"));
    /* a route with a hole: only blocks 0:2 served */
    srv[0] = start(0, 2, 0);
    char a[64];
    snprintf(a, sizeof a, "127.0.0.1:%d", sp_server_port(srv[0]));
    ck_assert_int_eq(sp_runtime_connect(rt, a, &err), SP_OK); /* servers may join later: a notice, no error */
    ck_assert_int_ne(sp_runtime_route(rt, &err), SP_OK);
    ck_assert_ptr_nonnull(strstr(err.msg, "no online server holds block 2"));
    ck_assert_int_ne(sp_runtime_swarm_up(rt, 9, 0, &err), SP_OK); /* more servers than blocks */
    teardown(rt);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("runtime");
    TCase *tc = tcase_create("runtime");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, t_local_parts_only);
    tcase_add_test(tc, t_gen_device_refused);
    tcase_add_test(tc, t_cancel_finish_steps);
    tcase_add_test(tc, t_greedy_matches_transformers);
    tcase_add_test(tc, t_swarm_equals_local);
    tcase_add_loop_test(tc, t_concurrent_generations_batched, 0, 3);
    tcase_add_test(tc, t_beams_score_at_least_greedy);
    tcase_add_test(tc, t_forward_backward_over_route);
    tcase_add_test(tc, t_forward_backward_pushed);
    tcase_add_test(tc, t_inference_wire);
    tcase_add_test(tc, t_head_dtype);
    tcase_add_test(tc, t_threads);
    tcase_add_test(tc, t_front_end_copies);
    tcase_add_test(tc, t_errors);
    suite_add_tcase(s, tc);
    TCase *tw = tcase_create("wire"); /* (CK_RUN_CASE=wire: these alone) */
    tcase_set_timeout(tw, 120);
    tcase_add_test(tw, t_wire_auto_slow_link);
    tcase_add_loop_test(tw, t_wire_auto_asymmetric, 0, 2);
    tcase_add_test(tw, t_wire_auto_loopback);
    suite_add_tcase(s, tw);
    TCase *tp = tcase_create("push");
    tcase_set_timeout(tp, 120);
    tcase_add_test(tp, t_push_pause_expires);
    tcase_add_test(tp, t_concurrent_generations_pushed);
    suite_add_tcase(s, tp);
    return sp_test_run(s);
}
