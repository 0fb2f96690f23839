/* test_families.c - every model family through a swarm of two real sepal-server processes on loopback (each
 * holding half of the blocks), against independent references:
 *   - greedy generation equals the golden greedy.output (transformers' for bloom, falcon-new, mixtral, llama-gqa;
 *     tools/hf_reference.py's for bloom-bias, falcon-7b, falcon-bias, falcon-seq);
 *   - beam search and a rollback (start_from_position) equal the local single-process runner, and the rolled-back
 *     logits equal a fresh run of the final sequence;
 *   - generation with shallow + deep prompts equals a slow local reference (BLOOM: the embedding LayerNorm after
 *     the prompts);
 *   - deep prompt tuning: loss and every gradient through the swarm (pipelined) equal the single-process
 *     computation, which equals finite differences of its own loss; steps through the swarm lower the loss;
 *   - the servers' KV budget follows the family: --cache-bytes holds bytes / (span x 2 x kv_heads x head_dim x 4)
 *     positions. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "generate.h"
#include "remote.h"
#include "rng.h"
#include "runtime.h"
#include "testutil.h"
#include "trainer.h"

static const char *const fams[] = {"bloom",      "bloom-bias", "falcon-new", "falcon-7b",
                                   "falcon-bias", "falcon-seq", "mixtral",    "llama-gqa"};
#define NFAM ((int)(sizeof fams / sizeof *fams))
#define CACHE_BYTES 1048576L

/* Two servers splitting the model, a runtime connected to them, and the whole model in this process. */
typedef struct fixture {
    char dir[512];
    sp_test_proc p[2];
    int split, L;
    sp_runtime *rt;
    sp_model *full;
} fixture;

static void up(fixture *f, const char *name)
{
    memset(f, 0, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "%s/hf-tiny/%s", SEPAL_TEST_DATA, name);
    sp_err err = {0};
    ck_assert_msg(sp_model_load(&f->full, f->dir, SP_LOAD_ALL, 0, -1, &err) == SP_OK, "%s", err.msg);
    f->L = f->full->cfg.n_layers;
    f->split = f->L / 2;
    char spans[2][32], cb[32], addrs[128];
    snprintf(spans[0], sizeof spans[0], "0:%d", f->split);
    snprintf(spans[1], sizeof spans[1], "%d:%d", f->split, f->L);
    snprintf(cb, sizeof cb, "%ld", CACHE_BYTES);
    for (int i = 0; i < 2; i++) {
        const char *args[] = {"--model", f->dir, "--no-measure", "--blocks", spans[i], "--cache-bytes", cb, NULL};
        ck_assert_msg(sp_test_server_start(&f->p[i], args) == 0, "%s: server %s did not start", name, spans[i]);
    }
    ck_assert_int_eq(sp_runtime_new(&f->rt, NULL, NULL, &err), SP_OK);
    ck_assert_msg(sp_runtime_load(f->rt, f->dir, &err) == SP_OK, "%s", err.msg);
    snprintf(addrs, sizeof addrs, "127.0.0.1:%d,127.0.0.1:%d", f->p[0].port, f->p[1].port);
    ck_assert_msg(sp_runtime_connect(f->rt, addrs, &err) == SP_OK, "%s", err.msg);
    ck_assert_int_eq(sp_test_route_hops(f->rt), 2);
}

static void down(fixture *f)
{
    sp_runtime_free(f->rt);
    for (int i = 0; i < 2; i++)
        sp_test_proc_signal(&f->p[i], SIGTERM);
    sp_model_free(f->full);
}

static int32_t *golden_ids(const fixture *f, const char *name, int *n)
{
    char path[600];
    snprintf(path, sizeof path, "%s/golden.safetensors", f->dir);
    sp_safetensors *st = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_st_open(&st, path, &err), SP_OK);
    const sp_st_tensor *t = sp_st_get(st, name, &err);
    ck_assert_ptr_nonnull(t);
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

/* ---------------------------------------------------------------------------------------------- */
/* generation */

static void check_greedy(fixture *f)
{
    int np, no;
    int32_t *prompt = golden_ids(f, "greedy.prompt", &np), *want = golden_ids(f, "greedy.output", &no);
    sp_lm_swarm sw;
    sp_lm lm = sp_lm_swarm_make(&sw, f->rt);
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
        ck_assert_msg(r.ids[0][i] == want[np + i], "%s: greedy id %d: %d, golden %d", f->dir, i, r.ids[0][i],
                      want[np + i]);
    sp_gen_result_free(&r);
    free(prompt), free(want);
}

static void check_beams(fixture *f)
{
    sp_lm_local loc;
    sp_lm_swarm sw;
    sp_lm lm_local = sp_lm_local_make(&loc, f->full), lm_swarm = sp_lm_swarm_make(&sw, f->rt);
    int32_t p[4] = {7, 301, 45, 128};
    const int32_t *ps[1] = {p};
    int len = 4;
    sp_gen_opts o;
    sp_gen_opts_default(&o);
    o.max_new = 10;
    o.stop_at_eos = 0;
    o.beams = 4;
    sp_gen_result a, b;
    sp_err err = {0};
    ck_assert_msg(sp_generate(&lm_local, NULL, ps, &len, 1, &o, NULL, NULL, &a, &err) == SP_OK, "%s", err.msg);
    ck_assert_msg(sp_generate(&lm_swarm, NULL, ps, &len, 1, &o, NULL, NULL, &b, &err) == SP_OK, "%s", err.msg);
    ck_assert_int_eq(a.n[0], b.n[0]);
    for (int t = 0; t < a.n[0]; t++)
        ck_assert_msg(a.ids[0][t] == b.ids[0][t], "%s: beam id %d: local %d, swarm %d", f->dir, t, a.ids[0][t],
                      b.ids[0][t]);
    ck_assert_float_eq_tol(a.best_score, b.best_score, 1e-5);
    sp_gen_result_free(&a);
    sp_gen_result_free(&b);
}

/* One forward of ids [B, T] on lm: last-position logits [B, V]. */
static void lm_step(const sp_lm *lm, const int32_t *ids, int B, int T, float *logits)
{
    sp_err err = {0};
    ck_assert_msg(lm->forward(lm->ctx, ids, B, T, logits, &err) == SP_OK, "%s", err.msg);
}

/* A batch of 2: a prefill of 5, three single steps, a rollback to 6 positions and two other tokens, and a step
 * after that; swarm and local agree at every step, and the rolled-back logits equal a fresh run of the same ids
 * (the servers overwrite their caches from the position they are told to start from). */
static void check_rollback(fixture *f)
{
    int V = f->full->cfg.vocab;
    sp_lm_local loc, fresh;
    sp_lm_swarm sw;
    sp_lm lms[2] = {sp_lm_local_make(&loc, f->full), sp_lm_swarm_make(&sw, f->rt)};
    sp_lm lf = sp_lm_local_make(&fresh, f->full);
    int32_t pre[10] = {11, 200, 31, 4, 99, 17, 5, 250, 8, 77}, steps[3][2] = {{40, 41}, {42, 43}, {44, 45}};
    int32_t other[2][2] = {{300, 301}, {302, 303}}, after[2] = {60, 61};
    float *lg[2], *want = malloc((size_t)2 * V * sizeof(float));
    sp_err err = {0};
    for (int k = 0; k < 2; k++) {
        lg[k] = malloc((size_t)2 * V * sizeof(float));
        ck_assert_msg(lms[k].begin(lms[k].ctx, 2, 16, &err) == SP_OK, "%s", err.msg);
    }
    float *cmp = malloc((size_t)2 * V * sizeof(float));
    for (int phase = 0; phase < 6; phase++) {
        for (int k = 0; k < 2; k++) {
            const sp_lm *lm = &lms[k];
            if (phase == 0)
                lm_step(lm, pre, 2, 5, lg[k]);
            else if (phase <= 3)
                lm_step(lm, steps[phase - 1], 2, 1, lg[k]);
            else if (phase == 4) { /* back to 6 positions: the prefill and the first step */
                ck_assert_msg(lm->rewind(lm->ctx, 6, &err) == SP_OK, "%s", err.msg);
                int32_t ids[4] = {other[0][0], other[0][1], other[1][0], other[1][1]};
                lm_step(lm, ids, 2, 2, lg[k]);
            } else {
                lm_step(lm, after, 2, 1, lg[k]);
            }
        }
        double d = sp_max_abs_diff(lg[0], lg[1], (size_t)2 * V);
        ck_assert_msg(d <= 1e-4, "%s: phase %d: local and swarm differ by %g", f->dir, phase, d);
        if (phase < 4)
            continue;
        /* fresh: [pre, step 0, other (, after)] in one prefill */
        int T = phase == 4 ? 8 : 9;
        int32_t ids[18];
        for (int b = 0; b < 2; b++) {
            int32_t *r = ids + b * T;
            memcpy(r, pre + b * 5, 5 * sizeof *r);
            r[5] = steps[0][b];
            r[6] = other[b][0];
            r[7] = other[b][1];
            if (T == 9)
                r[8] = after[b];
        }
        ck_assert_int_eq(lf.begin(lf.ctx, 2, 16, &err), SP_OK);
        lm_step(&lf, ids, 2, T, want);
        lf.end(lf.ctx);
        ck_assert_msg(sp_max_abs_diff(lg[1], want, (size_t)2 * V) <= 1e-4, "%s: phase %d: rolled back %g from fresh",
                      f->dir, phase, sp_max_abs_diff(lg[1], want, (size_t)2 * V));
    }
    /* rolling forward is refused */
    ck_assert_int_eq(lms[1].rewind(lms[1].ctx, 12, &err), SP_ERR_ARG);
    for (int k = 0; k < 2; k++) {
        lms[k].end(lms[k].ctx);
        free(lg[k]);
    }
    free(want), free(cmp);
}

/* Greedy with prompts, the slow way: [shallow ++ embed(ids)] through the family's embedding norm, every block
 * in this process with the deep prompts added to its first P input positions, no cache. */
static void reference_greedy(sp_model *m, const float *shallow, const float *deep, int P, int32_t *ids, int n, int k)
{
    int H = m->cfg.hidden, V = m->cfg.vocab;
    sp_err err = {0};
    sp_ws ws = {0};
    for (int s = 0; s < k; s++, n++) {
        float *x = malloc((size_t)(P + n) * H * sizeof(float)), *logits = malloc((size_t)V * sizeof(float));
        memcpy(x, shallow, (size_t)P * H * sizeof(float));
        ck_assert_int_eq(sp_model_embed(m, x + (size_t)P * H, ids, n, &err), SP_OK);
        sp_model_embed_norm(m, x, P + n);
        for (int l = 0; l < m->cfg.n_layers; l++) {
            for (size_t i = 0; i < (size_t)P * H; i++)
                x[i] += deep[(size_t)l * P * H + i];
            ck_assert_int_eq(sp_block_forward(&m->blocks[l], x, x, 1, P + n, 0, NULL, &ws, &err), SP_OK);
        }
        ck_assert_int_eq(sp_model_head(m, logits, x + (size_t)(P + n - 1) * H, 1, &err), SP_OK);
        int best = 0;
        for (int v = 1; v < V; v++)
            best = logits[v] > logits[best] ? v : best;
        ids[n] = best;
        free(x), free(logits);
    }
    sp_ws_free(&ws);
}

static void check_prompts(fixture *f)
{
    int H = f->full->cfg.hidden, L = f->L, P = 3;
    sp_rng r;
    sp_rng_seed(&r, 21);
    float *sh = malloc((size_t)P * H * sizeof(float)), *dp = malloc((size_t)L * P * H * sizeof(float));
    sp_rng_fill_normal(&r, sh, (long)P * H, 1.0f);
    sp_rng_fill_normal(&r, dp, (long)L * P * H, 0.5f);
    int32_t want[16] = {9, 120, 33, 480};
    reference_greedy(f->full, sh, dp, P, want, 4, 6);
    sp_lm_swarm sw;
    sp_lm lm = sp_lm_swarm_make(&sw, f->rt);
    sp_lm_swarm_prompts(&sw, &lm, sh, dp, P);
    sp_gen_opts o;
    sp_gen_opts_default(&o);
    o.max_new = 6;
    o.stop_at_eos = 0;
    sp_gen_result res;
    sp_err err = {0};
    const int32_t *ps[1] = {want};
    int len = 4;
    ck_assert_msg(sp_generate(&lm, NULL, ps, &len, 1, &o, NULL, NULL, &res, &err) == SP_OK, "%s", err.msg);
    for (int i = 0; i < 6; i++)
        ck_assert_msg(res.ids[0][i] == want[4 + i], "%s: with prompts, id %d: swarm %d, reference %d", f->dir, i,
                      res.ids[0][i], want[4 + i]);
    sp_gen_result_free(&res);
    free(sh), free(dp);
}

/* ---------------------------------------------------------------------------------------------- */
/* deep prompt tuning on token ids (the tiny checkpoints have no tokenizer): a 2-class task over rows of
 * different lengths */

typedef struct rand_task {
    int vocab;
    sepal_batch b;
} rand_task;

static void *task_open(const sepal_host *host, const char *args, char *e, size_t cap)
{
    (void)args, (void)e, (void)cap;
    rand_task *t = calloc(1, sizeof *t);
    if (t)
        t->vocab = host->vocab;
    return t;
}

static void task_free_batch(rand_task *t)
{
    free(t->b.ids), free(t->b.last), free(t->b.labels);
    memset(&t->b, 0, sizeof t->b);
}

static void task_close(void *p)
{
    task_free_batch(p);
    free(p);
}

static int task_size(void *p, int split)
{
    (void)p;
    return split == SEPAL_SPLIT_TRAIN ? 64 : 16;
}

static int task_batch(void *p, int split, const int *idx, int n, int max_length, sepal_batch *out, char *e, size_t cap)
{
    (void)split, (void)e, (void)cap;
    rand_task *t = p;
    task_free_batch(t);
    int T = 0;
    for (int i = 0; i < n; i++) {
        int len = 4 + idx[i] % 6;
        T = len > T ? len : T;
    }
    T = T < max_length ? T : max_length;
    t->b = (sepal_batch){.B = n, .T = T, .ids = calloc((size_t)n * T, sizeof(int32_t)),
                         .last = malloc((size_t)n * sizeof(int32_t)), .labels = malloc((size_t)n * sizeof(int32_t))};
    if (!t->b.ids || !t->b.last || !t->b.labels)
        return -1;
    for (int i = 0; i < n; i++) {
        int len = 4 + idx[i] % 6;
        len = len < T ? len : T;
        for (int k = 0; k < len; k++) { /* right-padded with 0 */
            uint32_t hash = (uint32_t)idx[i] * 2654435761u + (uint32_t)k * 40503u;
            t->b.ids[i * T + k] = 3 + (int32_t)(hash % (uint32_t)(t->vocab - 3));
        }
        t->b.last[i] = len - 1;
        t->b.labels[i] = idx[i] % 2;
    }
    *out = t->b;
    return 0;
}

static const sepal_task rand2 = {.abi = SEPAL_PLUGIN_ABI, .name = "rand2", .description = "test task",
                                 .num_labels = 2, .open = task_open, .close = task_close, .size = task_size,
                                 .batch = task_batch};

static sp_train_opts train_opts(int micro)
{
    sp_train_opts o;
    sp_train_opts_default(&o);
    o.tuning = SP_TUNE_DEEP;
    o.pre_seq_len = 3;
    o.max_length = 12;
    o.batch = 6;
    o.microbatches = micro;
    o.schedule = SP_SCHED_1F1B;
    o.seed = 9;
    o.device = 0;
    o.lr = 5e-2f;
    o.warmup = 0;
    return o;
}

/* Loss and the flattened gradients of every trainable tensor. */
static float *grads_of(sp_trainer *t, const int *idx, int n, float *loss, int64_t *total)
{
    sp_err err = {0};
    ck_assert_msg(sp_trainer_grads(t, idx, n, loss, &err) == SP_OK, "%s", err.msg);
    sp_t **p;
    int np = sp_trainer_params(t, &p);
    *total = 0;
    for (int i = 0; i < np; i++)
        *total += p[i]->n;
    float *g = malloc((size_t)*total * sizeof(float)), *q = g;
    for (int i = 0; i < np; i++) {
        ck_assert_msg(p[i]->grad != NULL, "%s got no gradient", p[i]->name);
        memcpy(q, p[i]->grad, (size_t)p[i]->n * sizeof(float));
        q += p[i]->n;
    }
    return g;
}

/* The single-process gradient against central differences of its own loss, on a few entries of each trainable
 * tensor (shallow prompts: through BLOOM's embedding LayerNorm; deep prompts: through every block, a MoE block's
 * router included; the head: through the final norm). */
static void check_fd(fixture *f, sp_trainer *t, const int *idx, int n, const float *g)
{
    sp_t **p;
    int np = sp_trainer_params(t, &p);
    sp_rng r;
    sp_rng_seed(&r, 3);
    const float *gp = g;
    /* a MoE model's loss is smooth only between changes of some token's chosen experts: a smaller step keeps
     * every choice (the error from f32 rounding grows as h shrinks, but stays ~1e-5 here) */
    float h = f->full->cfg.blk.mlp == SP_MLP_MOE ? 1e-3f : 3e-3f;
    for (int i = 0; i < np; i++, gp += p[i - 1]->n) {
        double worst = 0, scale = 1e-3;
        for (int k = 0; k < 4; k++) {
            int64_t j = (int64_t)(sp_rng_u32(&r) % (uint32_t)p[i]->n);
            float keep = p[i]->data[j], l[2];
            sp_err err = {0};
            for (int s = 0; s < 2; s++) {
                p[i]->data[j] = keep + (s ? -h : h);
                ck_assert_msg(sp_trainer_grads(t, idx, n, &l[s], &err) == SP_OK, "%s", err.msg);
            }
            p[i]->data[j] = keep;
            double num = ((double)l[0] - l[1]) / (2.0 * h);
            scale = fmax(scale, fabs(num));
            worst = fmax(worst, fabs(num - gp[j]));
        }
        ck_assert_msg(worst <= 2e-2 * scale, "%s: %s: gradient differs from finite differences by %g (scale %g)",
                      f->dir, p[i]->name, worst, scale);
    }
}

static void check_training(fixture *f)
{
    int idx[6] = {3, 10, 7, 22, 41, 16}; /* rows of 4..9 tokens */
    sp_train_opts lo = train_opts(1), so = train_opts(2);
    sp_trainer *local = NULL, *swarm = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_trainer_new(&local, f->rt, f->full, &rand2, "", &lo, &err) == SP_OK, "%s", err.msg);
    ck_assert_msg(sp_trainer_new(&swarm, f->rt, NULL, &rand2, "", &so, &err) == SP_OK, "%s", err.msg);
    float l0, l1;
    int64_t n0, n1;
    float *g0 = grads_of(local, idx, 6, &l0, &n0), *g1 = grads_of(swarm, idx, 6, &l1, &n1);
    ck_assert_int_eq(n0, n1);
    ck_assert(isfinite(l0) && l0 > 0);
    ck_assert_msg(fabsf(l1 - l0) <= 1e-5f * fmaxf(1.0f, l0), "%s: loss %.7f through the swarm, %.7f here", f->dir, l1,
                  l0);
    double scale = 0;
    for (int64_t k = 0; k < n0; k++)
        scale = fmax(scale, fabs(g0[k]));
    ck_assert_msg(sp_max_abs_diff(g0, g1, (size_t)n0) <= 1e-5 * fmax(1.0, scale), "%s: gradients differ by %g",
                  f->dir, sp_max_abs_diff(g0, g1, (size_t)n0));
    check_fd(f, local, idx, 6, g0);
    /* training through the swarm runs: a few optimizer steps on this batch lower its loss (comparing the
     * parameters with the local run's after AdamW steps would not work: AdamW's step is +-lr for any gradient
     * above eps, so rounding-level differences in a near-zero gradient flip whole steps) */
    float first = 0, last = 0;
    for (int s = 0; s < 4; s++) {
        ck_assert_msg(sp_trainer_step(swarm, idx, 6, &last, &err) == SP_OK, "%s", err.msg);
        first = s ? first : last;
    }
    ck_assert_msg(last < first, "%s: the loss went from %g to %g in 4 steps", f->dir, first, last);
    free(g0), free(g1);
    sp_trainer_free(local);
    sp_trainer_free(swarm);
}

/* ---------------------------------------------------------------------------------------------- */
/* the KV budget */

/* Each server's positions are CACHE_BYTES / (its span x the family's bytes per position), INFO says the family's
 * KV geometry, a session of all its positions opens and one more position is refused. */
static void check_cache(fixture *f)
{
    const sp_config *c = &f->full->cfg;
    long kv = 2L * c->n_kv_heads * c->head_dim * 4;
    ck_assert_int_eq(sp_config_kv_bytes_per_token(c), kv);
    for (int i = 0; i < 2; i++) {
        int a = i ? f->split : 0, b = i ? f->L : f->split;
        long want = CACHE_BYTES / ((b - a) * kv);
        sp_remote *r = NULL;
        sp_err err = {0};
        ck_assert_msg(sp_remote_connect(&r, "127.0.0.1", f->p[i].port, 1, 5000, &err) == SP_OK, "%s", err.msg);
        sp_info_reply info;
        ck_assert_msg(sp_remote_get_info(r, &info, 5000, &err) == SP_OK, "%s", err.msg);
        ck_assert_int_eq(info.cache_tokens_total, want);
        ck_assert_int_eq(info.kv_heads, c->n_kv_heads);
        ck_assert_int_eq(info.head_dim, c->head_dim);
        ck_assert_int_eq(info.cache_bytes_per_token, kv);
        ck_assert_str_eq(info.family, sp_arch_name(c->arch));
        sp_reply rep;
        char meta[160];
        long L = want < c->max_pos ? want : c->max_pos; /* a session's max_length is capped by the context */
        sp_open_req q = {.start = a, .end = b, .max_length = (int)L, .batch = (int)(want / L)};
        ck_assert_int_eq(sp_open_req_encode(&q, meta, sizeof meta, &err), SP_OK);
        ck_assert_msg(sp_remote_call(r, SP_MSG_INFERENCE_OPEN, meta, NULL, 0, &rep, 5000, &err) == SP_OK, "%s: %s",
                      meta, err.msg);
        sp_reply_clear(&rep);
        long left = want - (want / L) * L;
        q = (sp_open_req){.start = a, .end = b, .max_length = (int)(left + 1), .batch = 1};
        ck_assert_int_eq(sp_open_req_encode(&q, meta, sizeof meta, &err), SP_OK);
        ck_assert_int_ne(sp_remote_call(r, SP_MSG_INFERENCE_OPEN, meta, NULL, 0, &rep, 5000, &err), SP_OK);
        ck_assert_str_eq(sp_reply_error_code(&rep), "out_of_cache");
        sp_reply_clear(&rep);
        sp_remote_close(r);
    }
}

START_TEST(t_family_swarm)
{
    fixture f;
    up(&f, fams[_i]);
    check_cache(&f);
    check_greedy(&f);
    check_beams(&f);
    check_rollback(&f);
    check_prompts(&f);
    check_training(&f);
    down(&f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("families");
    TCase *tc = tcase_create("swarm");
    tcase_set_timeout(tc, 180);
    tcase_add_loop_test(tc, t_family_swarm, 0, NFAM);
    suite_add_tcase(s, tc);
    return sp_test_run(s);
}
