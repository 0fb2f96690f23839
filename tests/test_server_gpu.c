/* test_server_gpu.c - a server with --device cuda against one on the CPU (in-process servers over loopback
 * websockets, the same RPCs to both): FORWARD and BACKWARD with deep prompts (recomputed, and from a FORWARD that
 * kept its activations on the device), a GPU server's kept activations against its recompute (the same bits; the
 * device budget charged and given back, dropped with the connection, the inputs on the host where the cap's quarter
 * is exceeded), an inference session (a prefill, decode steps, a roll back, beam search's hypo_ids) and a
 * prefill longer than --max-batch-tokens (chunks), for llama (GQA), bloom, falcon-7b and mixtral in f32: each answer
 * within 1e-4 of the CPU's, relative to its largest value. Then deep prompt tuning through a GPU server (llama,
 * mixtral): the client's trainer (its parts on the CPU) through a server of every block on the GPU, and through one
 * on the CPU: each step's loss within 1e-4 relative. And generation with the client's local parts on the GPU (the
 * `device` setting) through a CPU server: the CPU client's ids, greedy and beam search, with trained prompts too.
 * Without a usable GPU it reports itself skipped (exit 77). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "generate.h"
#include "parts.h"
#include "remote.h"
#include "rng.h"
#include "runtime.h"
#include "server.h"
#include "span.h"
#include "swarm.h"
#include "testutil.h"
#include "toytask.h"
#include "trainer.h"

#define TMO 60000
#define TOL 1e-4

static const char *const models[] = {"llama-gqa", "bloom", "falcon-7b", "mixtral"};
#define NMODELS ((int)(sizeof models / sizeof *models))

typedef struct pair {
    sp_server *s[2];  /* CPU, GPU */
    sp_remote *r[2];
    int n, H;         /* blocks, hidden size */
} pair;

/* A CPU server and a GPU server of every block of hf-tiny's name (max_batch_tokens, keep_bytes: 0 the default). */
static void pair_start(pair *p, const char *name, int max_batch_tokens, size_t keep_bytes)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/hf-tiny/%s", SEPAL_TEST_DATA, name);
    sp_config c;
    sp_err err = {0};
    ck_assert_msg(sp_config_load(&c, dir, &err) == SP_OK, "%s", err.msg);
    p->n = c.n_layers;
    p->H = c.hidden;
    for (int d = 0; d < 2; d++) {
        sp_server_opts o;
        sp_server_opts_default(&o);
        o.model_dir = dir;
        o.measure = d; /* the GPU's measured on the device */
        o.device = d ? 0 : -1;
        if (max_batch_tokens)
            o.max_batch_tokens = max_batch_tokens;
        if (keep_bytes)
            o.keep_bytes = keep_bytes;
        ck_assert_msg(sp_server_start(&p->s[d], &o, &err) == SP_OK, "%s", err.msg);
        ck_assert_msg(sp_remote_connect(&p->r[d], "127.0.0.1", sp_server_port(p->s[d]), 0, TMO, &err) == SP_OK,
                      "%s", err.msg);
    }
    ck_assert_str_eq(sp_server_device(p->s[0]), "cpu");
    ck_assert_msg(!strncmp(sp_server_device(p->s[1]), "cuda:0 ", 7), "%s", sp_server_device(p->s[1]));
    double rps, tps;
    sp_server_throughput(p->s[1], &rps, &tps);
    ck_assert_msg(rps > 0 && tps > 0, "measured on the device: %g steps/s, %g tokens/s", rps, tps);
}

static void pair_stop(pair *p)
{
    for (int d = 0; d < 2; d++) {
        sp_remote_close(p->r[d]);
        sp_server_stop(p->s[d]);
    }
}

/* The request to server d (0 CPU, 1 GPU): tensor k of its reply (nf floats, allocated). */
static float *one(pair *p, int d, sp_msg_type type, const char *meta, const sp_tensor_src *t, int n, int k, size_t nf,
                  const char *what)
{
    sp_reply rep;
    sp_err err = {0};
    ck_assert_msg(sp_remote_call(p->r[d], type, meta, t, n, &rep, TMO, &err) == SP_OK, "%s (%s): %s", what,
                  d ? "gpu" : "cpu", err.msg);
    ck_assert_int_gt(rep.msg.n_tensors, k);
    ck_assert_uint_eq(rep.msg.t[k].numel, nf);
    float *out = malloc(nf * sizeof(float));
    ck_assert_int_eq(sp_tensor_to_f32(&rep.msg.t[k], out, &err), SP_OK);
    sp_reply_clear(&rep);
    return out;
}

/* The same request to both; tensor k of each reply (nf floats) compared: max |gpu - cpu| <= TOL max |cpu|. */
static void both(pair *p, sp_msg_type type, const char *meta, const sp_tensor_src *t, int n, int k, size_t nf,
                 float *cpu_out, const char *what)
{
    float *out[2];
    for (int d = 0; d < 2; d++)
        out[d] = one(p, d, type, meta, t, n, k, nf, what);
    double big = 0;
    for (size_t i = 0; i < nf; i++)
        big = fmax(big, fabs(out[0][i]));
    double diff = sp_max_abs_diff(out[0], out[1], nf);
    ck_assert_msg(diff <= TOL * big && isfinite(diff), "%s: max |gpu - cpu| %g over max |cpu| %g", what, diff, big);
    if (cpu_out)
        memcpy(cpu_out, out[0], nf * sizeof(float));
    free(out[0]);
    free(out[1]);
}

static sp_tensor_src t3(const float *x, int B, int T, int H)
{
    return (sp_tensor_src){.enc = SP_ENC_F32, .rank = 3, .shape = {B, T, H}, .f32 = x};
}

/* A FORWARD's and a BACKWARD's arguments over blocks [1, n) of p: x and grad_out [B, T, H], deep prompts
 * [n - 1, B, P, H] (random, from seed), and the metadata of a plain request, of one that keeps (id) and of one
 * from what it kept. */
typedef struct span_req {
    size_t N, NP;
    float *x, *g, *pr;
    sp_tensor_src fa[2], ba[3];
    char span[64], keep[96], from[96];
} span_req;

static void span_req_make(span_req *q, const pair *p, int B, int T, int P, int id, uint64_t seed)
{
    int nb = p->n - 1, H = p->H;
    q->N = (size_t)B * T * H, q->NP = (size_t)nb * B * P * H;
    q->x = malloc(q->N * 4), q->g = malloc(q->N * 4), q->pr = malloc(q->NP * 4);
    sp_rng r;
    sp_rng_seed(&r, seed);
    sp_rng_fill_normal(&r, q->x, (long)q->N, 1.0f);
    sp_rng_fill_normal(&r, q->g, (long)q->N, 1.0f);
    sp_rng_fill_normal(&r, q->pr, (long)q->NP, 0.5f);
    sp_tensor_src prompts = {.enc = SP_ENC_F32, .rank = 4, .shape = {nb, B, P, H}, .f32 = q->pr};
    q->fa[0] = t3(q->x, B, T, H), q->fa[1] = prompts;
    q->ba[0] = t3(q->x, B, T, H), q->ba[1] = t3(q->g, B, T, H), q->ba[2] = prompts;
    snprintf(q->span, sizeof q->span, "{\"start\":1,\"end\":%d}", p->n);
    snprintf(q->keep, sizeof q->keep, "{\"start\":1,\"end\":%d,\"keep\":%d}", p->n, id);
    snprintf(q->from, sizeof q->from, "{\"start\":1,\"end\":%d,\"kept\":%d}", p->n, id);
}

static void span_req_free(span_req *q) { free(q->x), free(q->g), free(q->pr); }

START_TEST(t_forward_backward)
{
    pair p;
    pair_start(&p, models[_i], 0, 0);
    span_req q;
    span_req_make(&q, &p, 2, 7, 3, 5, 7);
    both(&p, SP_MSG_FORWARD, q.span, q.fa, 2, 0, q.N, NULL, "forward");
    both(&p, SP_MSG_BACKWARD, q.span, q.ba, 3, 0, q.N, NULL, "backward (recomputed): grad_in");
    both(&p, SP_MSG_BACKWARD, q.span, q.ba, 3, 1, q.NP, NULL, "backward (recomputed): the prompts' gradient");
    both(&p, SP_MSG_FORWARD, q.keep, q.fa, 2, 0, q.N, NULL, "forward keeping its activations");
    both(&p, SP_MSG_BACKWARD, q.from, q.ba, 3, 0, q.N, NULL, "backward from the kept activations");
    span_req_free(&q);
    pair_stop(&p);
}
END_TEST

/* got (nf floats) equal to want's to the bit; got freed. */
static void same_bits(float *got, const float *want, size_t nf, const char *what)
{
    size_t i = 0;
    while (i < nf && !memcmp(&got[i], &want[i], sizeof(float)))
        i++;
    ck_assert_msg(i == nf, "%s: [%zu] %.9g, recomputed %.9g", what, i, i < nf ? (double)got[i] : 0.0,
                  i < nf ? (double)want[i] : 0.0);
    free(got);
}

/* Waits (up to 20 s, polling: a taken entry is freed after its reply went out, a closed connection's once the
 * server sees the close) until the GPU server's kept bytes and device budget are held and used. */
static void settles_at(sp_server *s, size_t held, size_t used, const char *what)
{
    size_t kb = sp_server_kept_bytes(s), ub = span_dev_budget_used(s);
    for (int k = 0; (kb != held || ub != used) && k < 400; k++) {
        usleep(50000);
        kb = sp_server_kept_bytes(s), ub = span_dev_budget_used(s);
    }
    ck_assert_msg(kb == held && ub == used, "%s: %zu bytes kept (want %zu), the device budget's %zu used (want %zu)",
                  what, kb, held, ub, used);
}

/* A GPU server's FORWARD with keep holds its blocks' inputs and activations on the device, charged to the device's
 * budget; its BACKWARD from them gives the recomputed backward's bits (grad_in and the prompts' gradient) and hands
 * the bytes back; an entry whose connection closes is dropped with them. With a cap whose quarter the activations
 * exceed (keep_bytes 4x the inputs) the inputs are kept on the host (the budget untouched), the same bits again. */
START_TEST(t_kept_on_device)
{
    static const int which[] = {0, 3}; /* llama (GQA) and mixtral (the experts' activations) */
    const char *model = models[which[_i]];
    int B = 2, T = 9, P = 3;
    for (int capped = 0; capped < 2; capped++) {
        pair p;
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/hf-tiny/%s", SEPAL_TEST_DATA, model);
        sp_config c;
        sp_err err = {0};
        ck_assert_msg(sp_config_load(&c, dir, &err) == SP_OK, "%s", err.msg);
        size_t N = (size_t)B * T * c.hidden, inputs = (size_t)(c.n_layers - 1) * N * sizeof(float);
        pair_start(&p, model, 0, capped ? 4 * inputs : 0);
        span_req q;
        span_req_make(&q, &p, B, T, P, 11, 17);
        size_t NP = q.NP;
        sp_tensor_src *fa = q.fa, *ba = q.ba;
        const char *span = q.span, *keep = q.keep, *from = q.from;
        sp_server *s = p.s[1];
        size_t used0 = span_dev_budget_used(s), dev = span_dev_kept_bytes(s, 1, p.n, B, T);
        ck_assert_uint_gt(dev, inputs);
        float *g0 = one(&p, 1, SP_MSG_BACKWARD, span, ba, 3, 0, N, "backward (recomputed)");
        float *gp0 = one(&p, 1, SP_MSG_BACKWARD, span, ba, 3, 1, NP, "backward (recomputed)");
        free(one(&p, 1, SP_MSG_FORWARD, keep, fa, 2, 0, N, "forward keeping"));
        settles_at(s, capped ? inputs : dev, capped ? used0 : used0 + dev, "kept"); /* (at once: kept, then replied) */
        same_bits(one(&p, 1, SP_MSG_BACKWARD, from, ba, 3, 0, N, "backward from kept"), g0, N,
                  capped ? "grad_in from the inputs kept on the host" : "grad_in from the device's activations");
        settles_at(s, 0, used0, "the entry taken");
        free(one(&p, 1, SP_MSG_FORWARD, keep, fa, 2, 0, N, "forward keeping"));
        same_bits(one(&p, 1, SP_MSG_BACKWARD, from, ba, 3, 1, NP, "backward from kept"), gp0, NP,
                  "the prompts' gradient from what was kept");
        /* a kept entry of a connection that closes is dropped, its device bytes given back */
        sp_remote *r2 = NULL;
        ck_assert_int_eq(sp_remote_connect(&r2, "127.0.0.1", sp_server_port(s), 0, TMO, &err), SP_OK);
        sp_remote *r1 = p.r[1];
        p.r[1] = r2;
        free(one(&p, 1, SP_MSG_FORWARD, keep, fa, 2, 0, N, "forward keeping (second connection)"));
        p.r[1] = r1;
        settles_at(s, capped ? inputs : dev, capped ? used0 : used0 + dev, "kept for the second connection");
        sp_remote_close(r2);
        settles_at(s, 0, used0, "the second connection closed");
        span_req_free(&q);
        free(g0), free(gp0);
        pair_stop(&p);
    }
}
END_TEST

static uint64_t open_both(pair *p, int L, int B, uint64_t *ids)
{
    char meta[128];
    sp_open_req q = {.start = 0, .end = p->n, .max_length = L, .batch = B};
    ck_assert_int_eq(sp_open_req_encode(&q, meta, sizeof meta, NULL), SP_OK);
    for (int d = 0; d < 2; d++) {
        sp_reply rep;
        sp_err err = {0};
        ck_assert_msg(sp_remote_call(p->r[d], SP_MSG_INFERENCE_OPEN, meta, NULL, 0, &rep, TMO, &err) == SP_OK, "%s",
                      err.msg);
        sp_open_reply a;
        ck_assert_int_eq(sp_open_reply_decode(&rep.msg, &a, &err), SP_OK);
        ids[d] = a.session;
        sp_reply_clear(&rep);
    }
    return ids[0] == ids[1];
}

/* A step of x [B, T, H] in both servers' sessions (the same id on both: fresh servers count alike). */
static void step_both(pair *p, uint64_t id, const float *x, int B, int T, int from, const sp_tensor_src *extra,
                      const char *what)
{
    char meta[128];
    sp_step_req q = {.session = id, .start_from_position = from, .reply_encoding = -1};
    ck_assert_int_eq(sp_step_req_encode(&q, meta, sizeof meta, NULL), SP_OK);
    sp_tensor_src a[2] = {t3(x, B, T, p->H)};
    if (extra)
        a[1] = *extra;
    both(p, SP_MSG_INFERENCE_STEP, meta, a, extra ? 2 : 1, 0, (size_t)B * T * p->H, NULL, what);
}

static void sessions(int model, int max_batch_tokens, int T)
{
    pair p;
    pair_start(&p, models[model], max_batch_tokens, 0);
    int B = 3, H = p.H;
    float *x = malloc((size_t)B * T * H * 4);
    sp_rng r;
    sp_rng_seed(&r, 11);
    sp_rng_fill_normal(&r, x, (long)B * T * H, 1.0f);
    uint64_t ids[2];
    ck_assert(open_both(&p, T + 8, B, ids));
    step_both(&p, ids[0], x, B, T, -1, NULL, "prefill");
    for (int k = 0; k < 3; k++) {
        sp_rng_fill_normal(&r, x, (long)B * H, 1.0f);
        step_both(&p, ids[0], x, B, 1, -1, NULL, "decode step");
    }
    step_both(&p, ids[0], x, B, 1, T + 1, NULL, "a step after rolling back by two");
    int64_t hypo[3] = {2, 2, 0};
    sp_tensor_src th = {.enc = SP_ENC_I64, .rank = 1, .shape = {3}, .raw = hypo};
    step_both(&p, ids[0], x, B, 1, -1, &th, "a step with hypo_ids");
    step_both(&p, ids[0], x, B, 1, -1, NULL, "the step after the reorder");
    free(x);
    pair_stop(&p);
}

START_TEST(t_session) { sessions(_i, 0, 5); }
END_TEST

START_TEST(t_long_prefill_chunks) { sessions(0, 12, 9); /* 3 x 9 rows over 12 a chunk: 4 positions each */ }
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* generation's local parts on the GPU (the `device` setting) through a CPU server */

/* 8 new tokens after a fixed prompt through the CPU server at port, the client's local parts on GPU 0 (set before
 * the load: the load puts them there) or on the CPU; greedy (beams 1: the argmax path) or beam search (2: the
 * logits); with trained prompts when P > 0. */
static void generate_through(const char *dir, int port, int gpu, int beams, const float *sh, const float *deep, int P,
                             sp_gen_result *out)
{
    sp_runtime *rt = NULL;
    sp_err err = {0};
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    ck_assert_int_eq(sp_runtime_new(&rt, NULL, NULL, &err), SP_OK);
    ck_assert_msg(sp_runtime_set_gen_device(rt, gpu ? 0 : -1, &err) == SP_OK, "%s", err.msg);
    ck_assert_msg(sp_runtime_load(rt, dir, &err) == SP_OK, "%s", err.msg);
    ck_assert_int_eq(sp_runtime_gen_device(rt), gpu ? 0 : -1);
    ck_assert_msg(sp_runtime_connect(rt, addr, &err) == SP_OK, "%s", err.msg);
    sp_lm_swarm sw;
    sp_lm lm = sp_lm_swarm_make(&sw, rt);
    if (P)
        sp_lm_swarm_prompts(&sw, &lm, sh, deep, P);
    sp_gen_opts o;
    sp_gen_opts_default(&o);
    o.max_new = 8;
    o.beams = beams;
    o.stop_at_eos = 0;
    o.sample.temperature = 0;
    static const int32_t prompt[] = {1, 15, 27, 4, 9};
    const int32_t *pp = prompt;
    int len = 5;
    ck_assert_msg(sp_generate(&lm, NULL, &pp, &len, 1, &o, NULL, NULL, out, &err) == SP_OK, "%s", err.msg);
    sp_runtime_free(rt);
}

/* The same ids with the client's local parts on the GPU as on the CPU, through one CPU server of every block:
 * llama (GQA) and BLOOM (its embedding norm), each greedy and with beam search, without and with trained prompts
 * (shallow and deep, P 3). */
START_TEST(t_generate_on_device)
{
    static const char *const gen_models[] = {"llama-gqa", "bloom"};
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/hf-tiny/%s", SEPAL_TEST_DATA, gen_models[_i]);
    sp_config c;
    sp_err err = {0};
    ck_assert_msg(sp_config_load(&c, dir, &err) == SP_OK, "%s", err.msg);
    sp_server_opts so;
    sp_server_opts_default(&so);
    so.model_dir = dir;
    so.measure = 0;
    sp_server *s = NULL;
    ck_assert_msg(sp_server_start(&s, &so, &err) == SP_OK, "%s", err.msg);
    enum { P = 3 };
    float *sh = malloc((size_t)P * c.hidden * sizeof(float)), *deep = malloc((size_t)c.n_layers * P * c.hidden * 4);
    sp_rng r;
    sp_rng_seed(&r, 23);
    sp_rng_fill_normal(&r, sh, (long)P * c.hidden, 0.5f);
    sp_rng_fill_normal(&r, deep, (long)c.n_layers * P * c.hidden, 0.5f);
    for (int k = 0; k < 4; k++) {
        int beams = k % 2 ? 2 : 1, p = k < 2 ? 0 : P;
        sp_gen_result want, got;
        generate_through(dir, sp_server_port(s), 0, beams, sh, deep, p, &want);
        generate_through(dir, sp_server_port(s), 1, beams, sh, deep, p, &got);
        ck_assert_int_eq(got.n[0], want.n[0]);
        for (int t = 0; t < want.n[0]; t++)
            ck_assert_msg(got.ids[0][t] == want.ids[0][t], "%s, beams %d, P %d: token %d is %d, %d on the CPU",
                          gen_models[_i], beams, p, t, got.ids[0][t], want.ids[0][t]);
        sp_gen_result_free(&want);
        sp_gen_result_free(&got);
    }
    free(sh), free(deep);
    sp_server_stop(s);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* deep prompt tuning through a GPU server */

#define STEPS 4

/* STEPS deep prompt-tuning steps of toytask's classes (P 3, two microbatches; the client's parts and optimizer on
 * the CPU) through one server of every block of model, on the GPU (gpu 1) or the CPU (0): each step's loss. */
static void train_through(const char *model, int gpu, float *loss)
{
    char dir[1024], addr[64];
    snprintf(dir, sizeof dir, "%s/hf-tiny/%s", SEPAL_TEST_DATA, model);
    sp_server_opts o;
    sp_server_opts_default(&o);
    o.model_dir = dir;
    o.measure = 0;
    o.device = gpu ? 0 : -1;
    sp_server *s = NULL;
    sp_runtime *rt = NULL;
    sp_trainer *t = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_server_start(&s, &o, &err) == SP_OK, "%s: %s", model, err.msg);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", sp_server_port(s));
    ck_assert_int_eq(sp_runtime_new(&rt, NULL, NULL, &err), SP_OK);
    ck_assert_msg(sp_runtime_load(rt, dir, &err) == SP_OK, "%s", err.msg);
    ck_assert_msg(sp_runtime_connect(rt, addr, &err) == SP_OK, "%s", err.msg);
    sp_train_opts to;
    sp_train_opts_default(&to);
    to.tuning = SP_TUNE_DEEP;
    to.pre_seq_len = 3;
    to.batch = 6;
    to.max_length = 12;
    to.microbatches = 2;
    to.warmup = 0;
    to.lr = 5e-2f;
    to.seed = 7;
    to.device = 0;
    ck_assert_msg(sp_trainer_new(&t, rt, NULL, &toy_cls, "", &to, &err) == SP_OK, "%s: %s", model, err.msg);
    int idx[STEPS][6] = {{0, 5, 9, 13, 2, 17}, {1, 4, 8, 20, 11, 3}, {6, 7, 10, 12, 14, 15}, {16, 18, 19, 21, 22, 23}};
    for (int k = 0; k < STEPS; k++)
        ck_assert_msg(sp_trainer_step(t, idx[k], 6, &loss[k], &err) == SP_OK, "%s through the %s server, step %d: %s",
                      model, gpu ? "GPU" : "CPU", k, err.msg);
    sp_trainer_free(t);
    sp_runtime_free(rt);
    sp_server_stop(s);
}

START_TEST(t_deep_ptune_losses)
{
    static const char *const tuned[] = {"llama-gqa", "mixtral"};
    const char *m = tuned[_i];
    float lc[STEPS], lg[STEPS];
    train_through(m, 0, lc);
    train_through(m, 1, lg);
    for (int k = 0; k < STEPS; k++) {
        printf("%s deep_ptune step %d: loss through the CPU server %.7f, the GPU server %.7f\n", m, k, (double)lc[k],
               (double)lg[k]);
        ck_assert_msg(isfinite(lc[k]) && lc[k] > 0, "%s step %d: loss %g", m, k, (double)lc[k]);
        ck_assert_msg(fabsf(lg[k] - lc[k]) <= 1e-4f * fabsf(lc[k]),
                      "%s step %d: loss %.7f through the GPU server, %.7f through the CPU server (relative %.2g > 1e-4)",
                      m, k, (double)lg[k], (double)lc[k], fabs((double)lg[k] - lc[k]) / fabs((double)lc[k]));
    }
    ck_assert_msg(lc[STEPS - 1] != lc[0], "%s: the steps changed nothing", m);
}
END_TEST

int main(void)
{
    sp_err err = {0};
    if (sp_device_probe(0, &err)) {
        printf("test_server_gpu: skipped: %s\n", err.msg);
        return 77;
    }
    /* the probe made a CUDA context: a child forked after it cannot use the GPU (the first H200 run: every case but
     * the first two failed with cudaErrorInitializationError), so the cases run in this process */
    setenv("CK_FORK", "no", 1);
    Suite *s = suite_create("server_gpu");
    TCase *tc = tcase_create("gpu_vs_cpu");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, t_forward_backward, 0, NMODELS);
    tcase_add_loop_test(tc, t_kept_on_device, 0, 2);
    tcase_add_loop_test(tc, t_session, 0, NMODELS);
    tcase_add_test(tc, t_long_prefill_chunks);
    tcase_add_loop_test(tc, t_deep_ptune_losses, 0, 2);
    tcase_add_loop_test(tc, t_generate_on_device, 0, 2);
    suite_add_tcase(s, tc);
    return sp_test_run(s);
}
