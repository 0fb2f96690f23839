/* test_block.c - the Llama block and the whole-model runner against transformers' golden outputs, the
 * KV cache against a full forward, and weight gradients against finite differences. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block.h"
#include "model.h"
#include "rng.h"
#include "testutil.h"

static const char *tiny(const char *name)
{
    static char buf[4][512];
    static int i;
    char *p = buf[i++ % 4];
    snprintf(p, 512, "%s/hf-tiny/%s", SEPAL_TEST_DATA, name);
    return p;
}

/* Golden tensor as f32 (caller frees). */
static float *golden(const char *model, const char *name, size_t *numel)
{
    char path[600];
    snprintf(path, sizeof path, "%s/golden.safetensors", tiny(model));
    sp_safetensors *st = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_st_open(&st, path, &err) == SP_OK, "%s", err.msg);
    const sp_st_tensor *t = sp_st_get(st, name, &err);
    ck_assert_msg(t != NULL, "%s", err.msg);
    float *x = malloc(t->numel * sizeof(float));
    if (t->dtype == SP_I64) {
        for (uint64_t i = 0; i < t->numel; i++) {
            int64_t v;
            memcpy(&v, (const char *)t->data + 8 * i, 8);
            x[i] = (float)v;
        }
    } else {
        ck_assert_int_eq(sp_to_f32(x, t->data, t->dtype, t->numel, &err), SP_OK);
    }
    *numel = t->numel;
    sp_st_close(st);
    return x;
}

static sp_model *load(const char *model, unsigned parts, int first, int last)
{
    sp_model *m = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_model_load(&m, tiny(model), parts, first, last, &err) == SP_OK, "%s", err.msg);
    return m;
}

/* Every block maps golden in -> out and grad_out -> grad_in. */
static void golden_blocks(const char *model)
{
    sp_model *m = load(model, SP_LOAD_BLOCKS, 0, -1);
    sp_err err = {0};
    for (int i = 0; i < m->cfg.n_layers; i++) {
        char name[64];
        size_t n;
        snprintf(name, sizeof name, "block.%d.in", i);
        float *in = golden(model, name, &n);
        snprintf(name, sizeof name, "block.%d.out", i);
        float *out = golden(model, name, &n);
        snprintf(name, sizeof name, "block.%d.grad_out", i);
        float *gout = golden(model, name, &n);
        snprintf(name, sizeof name, "block.%d.grad_in", i);
        float *gin = golden(model, name, &n);
        float *got = malloc(n * sizeof(float));
        int T = 12, B = (int)(n / (size_t)T / (size_t)m->cfg.hidden);
        ck_assert_int_eq(sp_llama_block_forward(&m->blocks[i], got, in, B, T, 0, NULL, &m->ws, &err), SP_OK);
        ck_assert_double_le(sp_max_abs_diff(got, out, n), 1e-4);
        ck_assert_int_eq(sp_llama_block_backward(&m->blocks[i], got, gout, in, B, T, 0, NULL, &m->ws, &err), SP_OK);
        ck_assert_double_le(sp_max_abs_diff(got, gin, n), 1e-3);
        free(in), free(out), free(gout), free(gin), free(got);
    }
    sp_model_free(m);
}

START_TEST(t_golden_blocks_gqa) { golden_blocks("llama-gqa"); }
END_TEST
START_TEST(t_golden_blocks_llama3) { golden_blocks("llama3-rope"); }
END_TEST

/* Full-model logits and greedy decoding with a KV cache. */
static void golden_model(const char *model)
{
    sp_model *m = load(model, SP_LOAD_ALL, 0, -1);
    sp_err err = {0};
    size_t n, nl, np, no;
    float *idsf = golden(model, "input_ids", &n), *want = golden(model, "logits", &nl);
    int32_t ids[64];
    for (size_t i = 0; i < n; i++)
        ids[i] = (int32_t)idsf[i];
    float *got = malloc(nl * sizeof(float));
    ck_assert_int_eq(sp_model_forward(m, got, ids, 2, (int)n / 2, 0, NULL, 0, &err), SP_OK);
    ck_assert_double_le(sp_max_abs_diff(got, want, nl), 1e-4);
    float *pf = golden(model, "greedy.prompt", &np), *of = golden(model, "greedy.output", &no);
    int32_t prompt[16], out[32];
    for (size_t i = 0; i < np; i++)
        prompt[i] = (int32_t)pf[i];
    int n_out = 0;
    sp_sampler greedy = {0};
    ck_assert_int_eq(sp_model_generate(m, prompt, (int)np, (int)(no - np), &greedy, 0, out, &n_out, NULL, NULL, &err),
                     SP_OK);
    ck_assert_int_eq(n_out, (int)(no - np));
    for (int i = 0; i < n_out; i++)
        ck_assert_int_eq(out[i], (int32_t)of[np + (size_t)i]);
    free(idsf), free(want), free(got), free(pf), free(of);
    sp_model_free(m);
}

START_TEST(t_golden_model_gqa) { golden_model("llama-gqa"); }
END_TEST
START_TEST(t_golden_model_llama3) { golden_model("llama3-rope"); }
END_TEST

/* Decoding step by step through the cache (with a rollback in the middle) equals one full forward. */
START_TEST(t_kv_cache_matches_full)
{
    sp_model *m = load("llama-gqa", SP_LOAD_BLOCKS, 1, 3);
    sp_err err = {0};
    int B = 2, T = 7, H = m->cfg.hidden;
    size_t n = (size_t)B * T * H;
    sp_rng r;
    sp_rng_seed(&r, 7);
    float *x = malloc(n * sizeof(float)), *full = malloc(n * sizeof(float)), *step = malloc(n * sizeof(float));
    sp_rng_fill_normal(&r, x, (long)n, 1.0f);
    memcpy(full, x, n * sizeof(float));
    ck_assert_int_eq(sp_model_blocks(m, full, B, T, 0, NULL, &err), SP_OK);
    sp_model_cache cache;
    ck_assert_int_eq(sp_model_cache_init(&cache, m, B, 16, &err), SP_OK);
    /* prefill 3, then 4 single steps; after the 2nd single step roll back one position and redo it */
    int chunks[] = {3, 1, 1, 1, 1}, pos = 0;
    float *buf = malloc((size_t)B * 3 * H * sizeof(float));
    for (int c = 0; c < 5; c++) {
        int t = chunks[c];
        for (int redo = 0; redo < (c == 2 ? 2 : 1); redo++) {
            if (redo)
                sp_model_cache_rewind(&cache, pos);
            for (int b = 0; b < B; b++)
                memcpy(buf + (size_t)b * t * H, x + ((size_t)b * T + pos) * H, (size_t)t * H * sizeof(float));
            ck_assert_int_eq(sp_model_blocks(m, buf, B, t, pos, &cache, &err), SP_OK);
        }
        for (int b = 0; b < B; b++)
            memcpy(step + ((size_t)b * T + pos) * H, buf + (size_t)b * t * H, (size_t)t * H * sizeof(float));
        pos += t;
    }
    ck_assert_double_le(sp_max_abs_diff(step, full, n), 1e-5);
    /* a step that does not continue the cache is refused, as is one past its capacity */
    ck_assert_int_eq(sp_model_blocks(m, buf, B, 1, 3, &cache, &err), SP_ERR_ARG);
    ck_assert_int_eq(sp_model_blocks(m, buf, B, 10, pos, &cache, &err), SP_ERR_RANGE);
    ck_assert_ptr_nonnull(strstr(err.msg, "cache"));
    sp_model_cache_free(&cache);
    free(x), free(full), free(step), free(buf);
    sp_model_free(m);
}
END_TEST

/* Weight gradients of a block (f32) against central differences on a few entries of every tensor. */
START_TEST(t_weight_grads_fd)
{
    sp_model *m = load("llama3-rope", SP_LOAD_BLOCKS, 0, 1);
    sp_llama_block *b = &m->blocks[0], g;
    sp_err err = {0};
    ck_assert_int_eq(sp_llama_block_init(&g, &m->cfg, &m->rope, &err), SP_OK);
    int B = 1, T = 5, H = b->H;
    size_t n = (size_t)B * T * H;
    sp_rng r;
    sp_rng_seed(&r, 11);
    float *x = malloc(n * sizeof(float)), *G = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    float *dx = malloc(n * sizeof(float));
    sp_rng_fill_normal(&r, x, (long)n, 1.0f);
    sp_rng_fill_normal(&r, G, (long)n, 1.0f);
    ck_assert_int_eq(sp_llama_block_backward(b, dx, G, x, B, T, 3, &g, &m->ws, &err), SP_OK);
    float *params[] = {b->attn_norm, b->wq, b->wk, b->wv, b->wo, b->ffn_norm, b->w_gate, b->w_up, b->w_down};
    float *grads[] = {g.attn_norm, g.wq, g.wk, g.wv, g.wo, g.ffn_norm, g.w_gate, g.w_up, g.w_down};
    for (int p = 0; p < 9; p++) {
        for (int k = 0; k < 4; k++) {
            long idx = (long)(sp_rng_u32(&r) % 64u);
            float keep = params[p][idx], h = 1e-2f;
            double l[2];
            for (int s = 0; s < 2; s++) {
                params[p][idx] = keep + (s ? -h : h);
                ck_assert_int_eq(sp_llama_block_forward(b, y, x, B, T, 3, NULL, &m->ws, &err), SP_OK);
                l[s] = 0;
                for (size_t i = 0; i < n; i++)
                    l[s] += (double)y[i] * G[i];
            }
            params[p][idx] = keep;
            double num = (l[0] - l[1]) / (2.0 * h);
            ck_assert_msg(fabs(num - grads[p][idx]) <= 2e-3 * fmax(1.0, fabs(num)), "tensor %d idx %ld: fd %g vs %g", p,
                          idx, num, grads[p][idx]);
        }
    }
    sp_llama_block_free(&g);
    free(x), free(G), free(y), free(dx);
    sp_model_free(m);
}
END_TEST

/* Forward keeping the activations, then backward from them: the same output, input gradient and weight
 * gradients as the recomputing backward, bit for bit (the same operations in the same order); a kept buffer
 * is reused for a smaller batch; a backward without kept activations is refused. */
START_TEST(t_kept_activations)
{
    sp_model *m = load("llama-gqa", SP_LOAD_BLOCKS, 0, 1);
    sp_llama_block *b = &m->blocks[0], g1, g2;
    sp_err err = {0};
    ck_assert_int_eq(sp_llama_block_init(&g1, &m->cfg, &m->rope, &err), SP_OK);
    ck_assert_int_eq(sp_llama_block_init(&g2, &m->cfg, &m->rope, &err), SP_OK);
    sp_block_acts k = {0};
    sp_rng r;
    sp_rng_seed(&r, 5);
    for (int round = 0; round < 2; round++) {
        int B = round ? 1 : 2, T = round ? 4 : 7, H = b->H, pos0 = round ? 0 : 2;
        size_t n = (size_t)B * T * H, nw = (size_t)b->H * b->nh * b->hd;
        float *x = malloc(n * sizeof(float)), *G = malloc(n * sizeof(float)), *y1 = malloc(n * sizeof(float));
        float *y2 = malloc(n * sizeof(float)), *d1 = malloc(n * sizeof(float)), *d2 = malloc(n * sizeof(float));
        sp_rng_fill_normal(&r, x, (long)n, 1.0f);
        sp_rng_fill_normal(&r, G, (long)n, 1.0f);
        ck_assert_int_eq(sp_llama_block_forward(b, y1, x, B, T, pos0, NULL, &m->ws, &err), SP_OK);
        ck_assert_int_eq(sp_llama_block_forward_keep(b, y2, x, B, T, pos0, &k, &err), SP_OK);
        ck_assert_int_eq(memcmp(y1, y2, n * sizeof(float)), 0);
        ck_assert_uint_ge(k.cap, sp_llama_block_acts_floats(b, B, T));
        ck_assert_int_eq(sp_llama_block_backward(b, d1, G, x, B, T, pos0, &g1, &m->ws, &err), SP_OK);
        ck_assert_int_eq(sp_llama_block_backward_kept(b, d2, G, x, &k, &g2, &m->ws, &err), SP_OK);
        ck_assert_int_eq(memcmp(d1, d2, n * sizeof(float)), 0);
        ck_assert_int_eq(memcmp(g1.wq, g2.wq, nw * sizeof(float)), 0);
        /* the backward leaves the kept activations as they were: a second one gives the same */
        ck_assert_int_eq(sp_llama_block_backward_kept(b, d1, G, x, &k, NULL, &m->ws, &err), SP_OK);
        ck_assert_int_eq(memcmp(d1, d2, n * sizeof(float)), 0);
        ck_assert_int_eq(memcmp(g1.w_down, g2.w_down, (size_t)b->H * b->FF * sizeof(float)), 0);
        ck_assert_int_eq(memcmp(g1.attn_norm, g2.attn_norm, (size_t)b->H * sizeof(float)), 0);
        double dn = 0;
        for (size_t i = 0; i < n; i++)
            dn += fabs(d2[i]);
        ck_assert(dn > 0);
        free(x), free(G), free(y1), free(y2), free(d1), free(d2);
    }
    sp_block_acts none = {0};
    float z[64] = {0};
    ck_assert_int_eq(sp_llama_block_backward_kept(b, z, z, z, &none, NULL, &m->ws, &err), SP_ERR_STATE);
    sp_block_acts_free(&k);
    ck_assert_ptr_null(k.buf);
    sp_llama_block_free(&g1);
    sp_llama_block_free(&g2);
    sp_model_free(m);
}
END_TEST

/* A server-style load reads only its blocks' tensors, and maps only the shards that hold them. */
START_TEST(t_partial_load_reads_only_its_part)
{
    sp_model *full = load("llama-gqa", SP_LOAD_ALL, 0, -1), *blocks = load("llama-gqa", SP_LOAD_BLOCKS, 1, 2);
    sp_model *local = load("llama-gqa", SP_LOAD_EMBED | SP_LOAD_HEAD, 0, 0);
    long long per_block = sp_config_block_params(&full->cfg) * 4;
    ck_assert_int_eq((long long)blocks->bytes_loaded, per_block);
    ck_assert_ptr_null(blocks->embed);
    ck_assert_int_eq((long long)local->bytes_loaded, 2LL * full->cfg.vocab * full->cfg.hidden * 4 + full->cfg.hidden * 4);
    ck_assert_int_eq(local->last - local->first, 0);
    ck_assert_int_eq((long long)full->bytes_loaded, sp_config_total_params(&full->cfg) * 4);
    sp_model_free(full), sp_model_free(blocks), sp_model_free(local);
}
END_TEST

START_TEST(t_unsupported_architecture)
{
    sp_model *m = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_model_load(&m, tiny("bloom"), SP_LOAD_ALL, 0, -1, &err), SP_ERR_UNSUPPORTED);
    ck_assert_str_eq(err.msg, "unsupported architecture: BloomForCausalLM");
    ck_assert_ptr_null(m);
    ck_assert_int_eq(sp_model_load(&m, tiny("llama-gqa"), SP_LOAD_BLOCKS, 3, 9, &err), SP_ERR_ARG);
}
END_TEST

static Suite *block_suite(void)
{
    Suite *s = suite_create("block");
    TCase *tc = tcase_create("llama");
    tcase_add_test(tc, t_golden_blocks_gqa);
    tcase_add_test(tc, t_golden_blocks_llama3);
    tcase_add_test(tc, t_golden_model_gqa);
    tcase_add_test(tc, t_golden_model_llama3);
    tcase_add_test(tc, t_kv_cache_matches_full);
    tcase_add_test(tc, t_weight_grads_fd);
    tcase_add_test(tc, t_kept_activations);
    tcase_add_test(tc, t_partial_load_reads_only_its_part);
    tcase_add_test(tc, t_unsupported_architecture);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return sp_test_run(block_suite()); }
