/* test_cuda_train.c - prompt tuning with the client's local parts and the optimizer on the GPU (train --device
 * cuda, client/train/devparts.h) against the same run on the CPU: the loss of every step within 1e-4 relative
 * (f32), and the trained parameters within 1e-3 of their largest value (AdamW's first steps move a weight by
 * about lr whatever its gradient's size, so a gradient near zero may round either way), for a causal LM and for
 * classes, shallow and deep prompts and a head alone, RMSNorm (Llama, GQA) and LayerNorm with BLOOM's embedding
 * norm, two microbatches, clipping and fp16 loss scaling; and generation's local parts on the device against the
 * CPU's (the chain's input, the logits, the greedy choice). The blocks run in this process (the trainer's local baseline, as
 * test_trainer's), so the test needs no swarm and no cache: the models are tests/data/hf-tiny's, the data a
 * task of toytask.h (random ids of seeded lengths). Without a GPU, asking for one is refused in words
 * ("no usable GPU: ...") and the suite reports itself skipped (exit 77). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"
#include "devparts.h"
#include "kern.h"
#include "rng.h"
#include "runtime.h"
#include "testutil.h"
#include "toytask.h"
#include "trainer.h"

#define TINY SEPAL_TEST_DATA "/hf-tiny/"

/* ---------------------------------------------------------------------------------------------- */

typedef struct run_case {
    const char *model;
    const sepal_task *task;
    sp_tuning tuning;
    int fp16;
} run_case;

static sp_train_opts opts_of(const run_case *c, int device)
{
    sp_train_opts o;
    sp_train_opts_default(&o);
    o.tuning = c->tuning;
    o.pre_seq_len = c->tuning == SP_TUNE_HEAD ? 0 : 3;
    o.batch = 6;
    o.max_length = 12;
    o.microbatches = 2;
    o.warmup = 0;
    o.lr = 5e-2f;
    o.clip_norm = 0.5f; /* the steps below clip: the device's norm decides as the CPU's does */
    o.fp16 = c->fp16;
    o.seed = 7;
    o.device = device;
    return o;
}

/* STEPS optimizer steps of c on device (0 CPU, 1 GPU): each step's loss, then the trained parameters (malloc'd,
 * *n values). */
#define STEPS 4
static float *train_steps(sp_runtime *rt, sp_model *blocks, const run_case *c, int device, float *loss, int64_t *n)
{
    sp_train_opts o = opts_of(c, device);
    sp_trainer *t = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_trainer_new(&t, rt, blocks, c->task, "", &o, &err) == SP_OK, "%s: %s", c->model, err.msg);
    int idx[STEPS][6] = {{0, 5, 9, 13, 2, 17}, {1, 4, 8, 20, 11, 3}, {6, 7, 10, 12, 14, 15}, {16, 18, 19, 21, 22, 23}};
    for (int s = 0; s < STEPS; s++)
        ck_assert_msg(sp_trainer_step(t, idx[s], 6, &loss[s], &err) == SP_OK, "%s step %d: %s", c->model, s, err.msg);
    sp_t **params;
    int np = sp_trainer_params(t, &params);
    ck_assert_int_gt(np, 0);
    *n = 0;
    for (int i = 0; i < np; i++)
        *n += params[i]->n;
    float *out = malloc((size_t)*n * sizeof *out), *w = out;
    for (int i = 0; i < np; i++, w += params[i - 1]->n)
        memcpy(w, params[i]->data, (size_t)params[i]->n * sizeof *w);
    sp_trainer_free(t);
    return out;
}

static void check_case(const run_case *c)
{
    char dir[512];
    snprintf(dir, sizeof dir, TINY "%s", c->model);
    sp_runtime *rt = NULL;
    sp_model *blocks = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_runtime_new(&rt, NULL, NULL, &err), SP_OK);
    ck_assert_msg(sp_runtime_load(rt, dir, &err) == SP_OK, "%s", err.msg);
    ck_assert_msg(sp_model_load(&blocks, dir, SP_LOAD_BLOCKS, 0, -1, &err) == SP_OK, "%s", err.msg);
    float lc[STEPS], lg[STEPS];
    int64_t nc, ng;
    float *pc = train_steps(rt, blocks, c, 0, lc, &nc), *pg = train_steps(rt, blocks, c, 1, lg, &ng);
    for (int s = 0; s < STEPS; s++) {
        printf("%s %s tuning %d fp16 %d step %d: loss cpu %.7f gpu %.7f\n", c->model, c->task->name, (int)c->tuning,
               c->fp16, s, (double)lc[s], (double)lg[s]);
        ck_assert_msg(isfinite(lc[s]) && lc[s] > 0, "step %d: loss %g", s, (double)lc[s]);
        ck_assert_msg(fabsf(lg[s] - lc[s]) <= 1e-4f * fabsf(lc[s]), "%s step %d: loss %.7f on the GPU, %.7f on the CPU",
                      c->model, s, (double)lg[s], (double)lc[s]);
    }
    ck_assert_msg(lc[STEPS - 1] != lc[0], "the steps changed nothing");
    ck_assert_int_eq(ng, nc);
    double scale = 0;
    for (int64_t k = 0; k < nc; k++)
        scale = fmax(scale, fabs(pc[k]));
    double worst = sp_max_abs_diff(pg, pc, (size_t)nc);
    ck_assert_msg(worst <= 1e-3 * scale, "%s: trained parameters differ by %g (largest %g)", c->model, worst, scale);
    free(pc), free(pg);
    sp_model_free(blocks);
    sp_runtime_free(rt);
}

START_TEST(t_llama_deep_classes)
{
    check_case(&(run_case){"llama-gqa", &toy_cls, SP_TUNE_DEEP, 0});
}
END_TEST

START_TEST(t_llama_ptune_lm_fp16)
{
    check_case(&(run_case){"llama-gqa", &toy_lm, SP_TUNE_PTUNE, 1});
}
END_TEST

START_TEST(t_bloom_deep_lm)
{
    check_case(&(run_case){"bloom", &toy_lm, SP_TUNE_DEEP, 0});
}
END_TEST

START_TEST(t_bloom_head_classes)
{
    check_case(&(run_case){"bloom", &toy_cls, SP_TUNE_HEAD, 0});
}
END_TEST

/* Generation's local parts on the device (sp_devparts_embed, sp_devparts_logits; the `device` setting's generate)
 * against the CPU's: the chain's input of ids after shallow prompts, through BLOOM's embedding norm, within 1e-5 of
 * its largest value; the logits within 1e-4 (cuBLAS's f32 product against the CPU's), each row's best the first
 * maximum of the device's logits, and best alone (no logits asked for) the same. */
START_TEST(t_gen_parts)
{
    static const char *const names[] = {"llama-gqa", "bloom"};
    char dir[1024];
    snprintf(dir, sizeof dir, TINY "%s", names[_i]);
    sp_model *m = NULL;
    sp_devparts *d = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_model_load(&m, dir, SP_LOAD_EMBED | SP_LOAD_HEAD, 0, 0, &err) == SP_OK, "%s", err.msg);
    ck_assert_msg(sp_devparts_new(&d, m, 0, 0, 0, &err) == SP_OK, "%s", err.msg);
    enum { B = 2, T = 5, P = 3, S = P + T };
    int H = m->cfg.hidden, V = m->cfg.vocab;
    size_t n = (size_t)B * S * H;
    int32_t ids[B * T], best[B], alone[B];
    for (int i = 0; i < B * T; i++)
        ids[i] = (i * 37 + 5) % V;
    sp_rng r;
    sp_rng_seed(&r, 5);
    float *sh = malloc((size_t)P * H * sizeof(float)), *emb = malloc((size_t)B * T * H * sizeof(float));
    float *want = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    float *lw = malloc((size_t)B * V * sizeof(float)), *lg = malloc((size_t)B * V * sizeof(float));
    sp_rng_fill_normal(&r, sh, (long)P * H, 0.5f);
    ck_assert_int_eq(sp_model_embed(m, emb, ids, B * T, &err), SP_OK);
    for (int b = 0; b < B; b++) {
        memcpy(want + (size_t)b * S * H, sh, (size_t)P * H * sizeof(float));
        memcpy(want + ((size_t)b * S + P) * H, emb + (size_t)b * T * H, (size_t)T * H * sizeof(float));
    }
    sp_model_embed_norm(m, want, B * S);
    ck_assert_msg(sp_devparts_embed(d, got, ids, B, T, sh, P, &err) == SP_OK, "%s", err.msg);
    double big = 0;
    for (size_t i = 0; i < n; i++)
        big = fmax(big, fabs(want[i]));
    double e = sp_max_abs_diff(got, want, n);
    ck_assert_msg(e <= 1e-5 * big, "%s: the chain's input %g from the CPU's (largest %g)", names[_i], e, big);
    ck_assert_int_eq(sp_model_head(m, lw, want, B, &err), SP_OK); /* rows of the input stand for the chain's output */
    ck_assert_msg(sp_devparts_logits(d, lg, best, want, B, &err) == SP_OK, "%s", err.msg);
    big = 0;
    for (size_t i = 0; i < (size_t)B * V; i++)
        big = fmax(big, fabs(lw[i]));
    e = sp_max_abs_diff(lg, lw, (size_t)B * V);
    ck_assert_msg(e <= 1e-4 * big, "%s: logits %g from the CPU's (largest %g)", names[_i], e, big);
    ck_assert_msg(sp_devparts_logits(d, NULL, alone, want, B, &err) == SP_OK, "%s", err.msg);
    for (int b = 0; b < B; b++) {
        ck_assert_int_eq(best[b], sp_argmax(lg + (size_t)b * V, V));
        ck_assert_int_eq(alone[b], best[b]);
    }
    free(sh), free(emb), free(want), free(got), free(lw), free(lg);
    sp_devparts_free(d);
    sp_model_free(m);
}
END_TEST

/* Without a GPU: the trainer refuses device 1 in words, and changes nothing (its error only). */
static int refused_without_gpu(void)
{
    sp_runtime *rt = NULL;
    sp_model *blocks = NULL;
    sp_err err = {0};
    if (sp_runtime_new(&rt, NULL, NULL, &err) || sp_runtime_load(rt, TINY "llama-gqa", &err) ||
        sp_model_load(&blocks, TINY "llama-gqa", SP_LOAD_BLOCKS, 0, -1, &err)) {
        fprintf(stderr, "test_cuda_train: %s\n", err.msg);
        return 1;
    }
    run_case c = {"llama-gqa", &toy_cls, SP_TUNE_DEEP, 0};
    sp_train_opts o = opts_of(&c, 1);
    sp_trainer *t = NULL;
    sp_status st = sp_trainer_new(&t, rt, blocks, &toy_cls, "", &o, &err);
    int ok = st == SP_ERR_UNSUPPORTED && !t && !strncmp(err.msg, "no usable GPU: ", 15);
    printf("test_cuda_train: device 1 without a GPU: %s (%s)\n", err.msg, ok ? "refused as it should" : "WRONG");
    sp_model_free(blocks);
    sp_runtime_free(rt);
    return !ok;
}

int main(void)
{
    char why[256];
    if (!sp_device_usable(0, why, sizeof why)) {
        if (refused_without_gpu())
            return 1;
        printf("test_cuda_train: skipped: %s\n", why);
        return 77;
    }
    setenv("CK_FORK", "no", 1); /* a CUDA context made before fork() is unusable in the child */
    Suite *s = suite_create("cuda_train");
    TCase *tc = tcase_create("local_parts_gpu_vs_cpu");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, t_llama_deep_classes);
    tcase_add_test(tc, t_llama_ptune_lm_fp16);
    tcase_add_test(tc, t_bloom_deep_lm);
    tcase_add_test(tc, t_bloom_head_classes);
    tcase_add_loop_test(tc, t_gen_parts, 0, 2);
    suite_add_tcase(s, tc);
    return sp_test_run(s);
}
