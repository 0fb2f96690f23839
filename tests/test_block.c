/* test_block.c - the block of every family and the whole-model runner against golden outputs (transformers'
 * own for llama-gqa, llama3-rope, bloom, falcon-new, mixtral; tools/hf_reference.py's, checked against
 * transformers', for bloom-bias, falcon-7b, falcon-bias, falcon-seq), the KV cache against a full forward, kept
 * activations against recomputation, and weight gradients against finite differences. */
#include <cblas.h>
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

/* Golden tensor block.I.WHAT of model (in, grad_out, ...). */
static float *golden_block(const char *model, const char *what, int i, size_t *numel)
{
    char name[64];
    snprintf(name, sizeof name, "block.%d.%s", i, what);
    return golden(model, name, numel);
}

static sp_model *load(const char *model, unsigned parts, int first, int last)
{
    sp_model *m = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_model_load(&m, tiny(model), parts, first, last, &err) == SP_OK, "%s", err.msg);
    return m;
}

/* Block 0 of the model, its matrices encoded in t (kern.h's sp_wtype; f32 as loaded). */
static sp_model *load_block0(const char *model, int t)
{
    sp_model *m = load(model, SP_LOAD_BLOCKS, 0, 1);
    sp_err err = {0};
    if (t != SP_W_F32)
        ck_assert_int_eq(sp_block_quantize(&m->blocks[0], (sp_wtype)t, &err), SP_OK);
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
        ck_assert_int_eq(sp_block_forward(&m->blocks[i], got, in, B, T, 0, NULL, &m->ws, &err), SP_OK);
        ck_assert_double_le(sp_max_abs_diff(got, out, n), 1e-4);
        ck_assert_int_eq(sp_block_backward(&m->blocks[i], got, gout, in, B, T, 0, NULL, &m->ws, &err), SP_OK);
        ck_assert_double_le(sp_max_abs_diff(got, gin, n), 1e-3);
        free(in), free(out), free(gout), free(gin), free(got);
    }
    sp_model_free(m);
}

/* Every golden checkpoint: llama (sharded GQA, llama3 RoPE), BLOOM (transformers' and with random biases and
 * LayerNorms, 6 heads), Falcon (new_decoder_architecture; 7B-style multi-query with one LayerNorm; biases with 2
 * KV groups of 4; the old sequential block), Mixtral. */
static const char *const families[] = {"llama-gqa", "llama3-rope", "bloom",      "bloom-bias", "falcon-new",
                                       "falcon-7b", "falcon-bias", "falcon-seq", "mixtral"};
#define NFAM ((int)(sizeof families / sizeof *families))

START_TEST(t_golden_blocks) { golden_blocks(families[_i]); }
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
    ck_assert_uint_le(np, 16);
    ck_assert_uint_le(no - np, 32);
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

START_TEST(t_golden_model) { golden_model(families[_i]); }
END_TEST

/* Decoding step by step through the cache (with a rollback in the middle) equals one full forward, for every
 * family: RoPE and ALiBi positions continue from the cache, and a rollback rewrites them. */
static void kv_cache_case(const char *model)
{
    sp_model *m = load(model, SP_LOAD_BLOCKS, 0, 2);
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
    ck_assert_int_eq(cache.kv[0].nkv, m->cfg.n_kv_heads); /* the cache is as wide as the family's KV heads */
    /* prefill 3, then 4 single steps; after the 2nd single step roll back one position and redo it, first with
     * other inputs (which the rollback must forget) */
    int chunks[] = {3, 1, 1, 1, 1}, pos = 0;
    float *buf = malloc((size_t)B * 3 * H * sizeof(float));
    for (int c = 0; c < 5; c++) {
        int t = chunks[c];
        for (int redo = 0; redo < (c == 2 ? 2 : 1); redo++) {
            if (redo)
                sp_model_cache_rewind(&cache, pos);
            for (int b = 0; b < B; b++)
                memcpy(buf + (size_t)b * t * H, x + ((size_t)b * T + pos) * H, (size_t)t * H * sizeof(float));
            if (c == 2 && !redo)
                sp_rng_fill_normal(&r, buf, (long)B * t * H, 1.0f);
            ck_assert_int_eq(sp_model_blocks(m, buf, B, t, pos, &cache, &err), SP_OK);
        }
        for (int b = 0; b < B; b++)
            memcpy(step + ((size_t)b * T + pos) * H, buf + (size_t)b * t * H, (size_t)t * H * sizeof(float));
        pos += t;
    }
    ck_assert_msg(sp_max_abs_diff(step, full, n) <= 1e-5, "%s: %g", model, sp_max_abs_diff(step, full, n));
    /* a step that does not continue the cache is refused, as is one past its capacity */
    ck_assert_int_eq(sp_model_blocks(m, buf, B, 1, 3, &cache, &err), SP_ERR_ARG);
    ck_assert_int_eq(sp_model_blocks(m, buf, B, 10, pos, &cache, &err), SP_ERR_RANGE);
    ck_assert_ptr_nonnull(strstr(err.msg, "cache"));
    sp_model_cache_free(&cache);
    free(x), free(full), free(step), free(buf);
    sp_model_free(m);
}

/* A long prefill's attention runs in units of query rows, each over only the keys its rows see (with OpenBLAS on
 * one thread, as the runtime runs it): a forward of 150 positions without a cache, and prefills of 100 then 50
 * through one (units of 64 rows and the rest, after a cached prefix), equal the positions stepped one at a time
 * through the cache (the pool's own attention). */
static void long_prefill_case(const char *model)
{
    sp_model *m = load(model, SP_LOAD_BLOCKS, 0, 2);
    sp_err err = {0};
    enum { T = 150 };
    int H = m->cfg.hidden, first = 100;
    size_t n = (size_t)T * H;
    sp_rng r;
    sp_rng_seed(&r, 11);
    float *x = malloc(n * sizeof(float)), *full = malloc(n * sizeof(float)), *chunked = malloc(n * sizeof(float)),
          *steps = malloc(n * sizeof(float));
    sp_rng_fill_normal(&r, x, (long)n, 1.0f);
    memcpy(full, x, n * sizeof(float));
    memcpy(chunked, x, n * sizeof(float));
    memcpy(steps, x, n * sizeof(float));
    int blas_was = openblas_get_num_threads();
    openblas_set_num_threads(1);
    ck_assert_int_eq(sp_model_blocks(m, full, 1, T, 0, NULL, &err), SP_OK);
    sp_model_cache a, b;
    ck_assert_int_eq(sp_model_cache_init(&a, m, 1, T, &err), SP_OK);
    ck_assert_int_eq(sp_model_cache_init(&b, m, 1, T, &err), SP_OK);
    ck_assert_int_eq(sp_model_blocks(m, chunked, 1, first, 0, &a, &err), SP_OK);
    ck_assert_int_eq(sp_model_blocks(m, chunked + (size_t)first * H, 1, T - first, first, &a, &err), SP_OK);
    for (int t = 0; t < T; t++)
        ck_assert_int_eq(sp_model_blocks(m, steps + (size_t)t * H, 1, 1, t, &b, &err), SP_OK);
    openblas_set_num_threads(blas_was);
    ck_assert_msg(sp_max_abs_diff(full, steps, n) <= 1e-5, "%s: full %g", model, sp_max_abs_diff(full, steps, n));
    ck_assert_msg(sp_max_abs_diff(chunked, steps, n) <= 1e-5, "%s: chunked %g", model,
                  sp_max_abs_diff(chunked, steps, n));
    sp_model_cache_free(&a);
    sp_model_cache_free(&b);
    free(x), free(full), free(chunked), free(steps);
    sp_model_free(m);
}

START_TEST(t_kv_cache_matches_full) { kv_cache_case(families[_i]); long_prefill_case(families[_i]); }
END_TEST

/* A batch of decode steps (sp_block_decode_batch) of sequences at different positions, of 1 and 2 rows, gives
 * every row the bits its sequence gets stepped alone, its cache too, for f32 and int8 (and the other encodings):
 * a server's batch must not change what a session computes. So does a batch of short prefills and decode steps
 * (sp_block_step_batch: 1 to 8 positions, rows x positions within what the decode kernels take alone: 29 rows,
 * fewer for a MoE block). */
static void decode_batch_case(const char *model)
{
    sp_err err = {0};
    for (int t = SP_W_F32; t < SP_W__COUNT; t++) {
        sp_model *m = load_block0(model, t);
        sp_block *blk = &m->blocks[0];
        enum { NS = 7, CAP = 24 }; /* 10 rows: more than the plain product's decode kernels take */
        int H = m->cfg.hidden, rows[NS] = {1, 2, 1, 1, 2, 1, 2}, prefix[NS] = {0, 3, 7, 1, 5, 2, 9}, N = 0;
        int T[NS] = {3, 4, 2, 1, 1, 8, 2}, NT = 0; /* then a step of T[i] positions each (29 rows) */
        for (int i = 0; i < NS; i++) /* (fewer for a MoE block: its experts' rows count too) */
            while (T[i] > 1 && !sp_block_rows_exact(blk, rows[i] * T[i]))
                T[i]--;
        sp_kv_cache alone[NS], batch[NS], *kvp[NS];
        sp_rng r;
        sp_rng_seed(&r, 21 + (uint64_t)t);
        float *x = malloc((size_t)8 * 12 * H * sizeof(float)), *y = malloc((size_t)8 * 12 * H * sizeof(float));
        for (int i = 0; i < NS; i++) { /* each sequence's prefix, through both caches alike */
            ck_assert_int_eq(sp_kv_init(&alone[i], rows[i], CAP, m->cfg.n_kv_heads, m->cfg.head_dim, &err), SP_OK);
            ck_assert_int_eq(sp_kv_init(&batch[i], rows[i], CAP, m->cfg.n_kv_heads, m->cfg.head_dim, &err), SP_OK);
            kvp[i] = &batch[i];
            N += rows[i];
            NT += rows[i] * T[i];
            if (!prefix[i])
                continue;
            sp_rng_fill_normal(&r, x, (long)rows[i] * prefix[i] * H, 1.0f);
            ck_assert_int_eq(sp_block_forward(blk, y, x, rows[i], prefix[i], 0, &alone[i], &m->ws, &err), SP_OK);
            ck_assert_int_eq(sp_block_forward(blk, y, x, rows[i], prefix[i], 0, &batch[i], &m->ws, &err), SP_OK);
        }
        float *in = malloc((size_t)NT * H * sizeof(float)), *out = malloc((size_t)NT * H * sizeof(float));
        float *ref = malloc((size_t)NT * H * sizeof(float));
        int item_rows[NS];
        sp_ws ws = {0};
        for (int step = 0; step < 3; step++) {
            sp_rng_fill_normal(&r, in, (long)N * H, 1.0f);
            for (int i = 0, o = 0; i < NS; o += rows[i++])
                ck_assert_int_eq(sp_block_forward(blk, ref + (size_t)o * H, in + (size_t)o * H, rows[i], 1,
                                                  alone[i].len, &alone[i], &m->ws, &err), SP_OK);
            ck_assert_msg(sp_block_decode_batch(blk, out, in, kvp, NS, item_rows, &ws, &err) == SP_OK, "%s", err.msg);
            ck_assert_msg(!memcmp(out, ref, (size_t)N * H * sizeof(float)), "%s %s step %d: a batched row differs",
                          model, sp_wtype_name((sp_wtype)t), step);
        }
        sp_rng_fill_normal(&r, in, (long)NT * H, 1.0f); /* short prefills and decode steps in one pass */
        for (int i = 0, o = 0; i < NS; o += rows[i] * T[i], i++) {
            ck_assert(sp_block_rows_exact(blk, rows[i] * T[i]));
            ck_assert_int_eq(sp_block_forward(blk, ref + (size_t)o * H, in + (size_t)o * H, rows[i], T[i],
                                              alone[i].len, &alone[i], &m->ws, &err), SP_OK);
        }
        ck_assert_msg(sp_block_step_batch(blk, out, in, kvp, T, NS, item_rows, &ws, &err) == SP_OK, "%s", err.msg);
        ck_assert_msg(!memcmp(out, ref, (size_t)NT * H * sizeof(float)), "%s %s: a row of a batch of prefills differs",
                      model, sp_wtype_name((sp_wtype)t));
        /* more rows: exact only where every product runs in integers (int8, nf4 above the scalar level) */
        ck_assert_int_eq(sp_block_rows_exact(blk, SP_KERN_MAX_ROWS + 1),
                         (t == SP_W_Q8 || t == SP_W_NF4) && sp_kern_integer((sp_wtype)t));
        for (int i = 0; i < NS; i++) {
            size_t n = (size_t)rows[i] * CAP * m->cfg.n_kv_heads * m->cfg.head_dim;
            ck_assert_int_eq(batch[i].len, alone[i].len);
            ck_assert(!memcmp(batch[i].k, alone[i].k, n * sizeof(float)) &&
                      !memcmp(batch[i].v, alone[i].v, n * sizeof(float)));
        }
        /* a full cache is refused before anything changes */
        batch[2].len = CAP;
        ck_assert_int_eq(sp_block_decode_batch(blk, out, in, kvp, NS, item_rows, &ws, &err), SP_ERR_RANGE);
        ck_assert_int_eq(batch[0].len, alone[0].len);
        for (int i = 0; i < NS; i++)
            sp_kv_free(&alone[i]), sp_kv_free(&batch[i]);
        sp_ws_free(&ws);
        free(x), free(y), free(in), free(out), free(ref);
        sp_model_free(m);
    }
}

START_TEST(t_decode_batch_as_alone) { decode_batch_case(families[_i]); }
END_TEST

/* The sequences' steps [0, n) of a pass (their caches kv[], rows[] rows of T[] positions each, inputs in turn in
 * `in`): sp_block_step_batch gives every row and cache entry the bits the sequence gets stepped alone (the
 * same steps through the caches `alone`); out and ref: scratch of the pass's rows. */
static void pass_as_alone(const char *what, sp_model *m, sp_kv_cache **kv, sp_kv_cache *alone, const int *rows,
                          const int *T, int n, const float *in, float *out, float *ref, sp_ws *ws)
{
    sp_block *blk = &m->blocks[0];
    sp_err err = {0};
    int H = m->cfg.hidden, item_rows[8], N = 0;
    for (int i = 0; i < n; N += rows[i] * T[i], i++) {
        ck_assert(sp_block_rows_exact(blk, rows[i] * T[i]));
        ck_assert_int_eq(sp_block_forward(blk, ref + (size_t)N * H, in + (size_t)N * H, rows[i], T[i], alone[i].len,
                                          &alone[i], &m->ws, &err), SP_OK);
    }
    ck_assert_msg(sp_block_step_batch(blk, out, in, kv, T, n, item_rows, ws, &err) == SP_OK, "%s", err.msg);
    ck_assert_msg(!memcmp(out, ref, (size_t)N * H * sizeof(float)), "%s: a row of the pass differs from alone", what);
    for (int i = 0; i < n; i++) {
        size_t c = (size_t)rows[i] * kv[i]->cap * m->cfg.n_kv_heads * m->cfg.head_dim;
        ck_assert_int_eq(kv[i]->len, alone[i].len);
        ck_assert_msg(!memcmp(kv[i]->k, alone[i].k, c * sizeof(float)) && !memcmp(kv[i]->v, alone[i].v, c * sizeof(float)),
                      "%s: sequence %d's cache differs from alone", what, i);
    }
}

/* Prefills of any length in one pass with decode steps (a server's batch on int8 and nf4 weights): at every
 * kernel level that multiplies them in integers, each sequence gets the bits it gets alone (its long prefill's
 * products in the integer kernels alone too, its attention over its own cache, the prefill's split over the
 * pool), over two passes where sequences join and leave; at a level that does not (scalar), a step of more than
 * SP_KERN_MAX_ROWS rows is not exact and the pass refuses it. */
static void long_prefills_case(const char *model)
{
    sp_err err = {0};
    for (int t = SP_W_Q8; t <= SP_W_NF4; t++) {
        sp_model *m = load_block0(model, t);
        sp_block *blk = &m->blocks[0];
        enum { NS = 4, CAP = 80 };
        int H = m->cfg.hidden, rows[NS] = {1, 2, 1, 1}, T1[NS] = {37, 12, 1, 20}, T2[NS] = {1, 1, 30, 0};
        size_t most = (size_t)H * 96; /* the first pass: 82 rows */
        float *in = malloc(most * sizeof(float)), *out = malloc(most * sizeof(float)), *ref = malloc(most * sizeof(float));
        for (int lv = SP_ISA__COUNT - 1; lv >= 0; lv--) { /* (the best level at most lv: each this CPU runs) */
            sp_kern_force(lv);
            char what[96];
            snprintf(what, sizeof what, "%s %s level %s", model, sp_wtype_name((sp_wtype)t),
                     sp_kern_level_name(sp_kern_level()));
            sp_kv_cache alone[NS], batch[NS], *kvp[NS];
            for (int i = 0; i < NS; i++) {
                ck_assert_int_eq(sp_kv_init(&alone[i], rows[i], CAP, m->cfg.n_kv_heads, m->cfg.head_dim, &err), SP_OK);
                ck_assert_int_eq(sp_kv_init(&batch[i], rows[i], CAP, m->cfg.n_kv_heads, m->cfg.head_dim, &err), SP_OK);
                kvp[i] = &batch[i];
            }
            sp_rng r;
            sp_rng_seed(&r, 31 + (uint64_t)lv);
            sp_rng_fill_normal(&r, in, (long)most, 1.0f);
            if (!sp_kern_integer((sp_wtype)t)) {
                ck_assert(!sp_block_rows_exact(blk, SP_KERN_MAX_ROWS + 1));
                ck_assert_int_eq(sp_block_step_batch(blk, out, in, kvp, T1, NS, (int[NS]){0}, &m->ws, &err), SP_ERR_ARG);
                ck_assert_int_eq(batch[0].len, 0);
            } else {
                sp_ws ws = {0};
                pass_as_alone(what, m, kvp, alone, rows, T1, NS, in, out, ref, &ws); /* 4 join: prefills, a decode */
                /* then decode steps, a long prefill of a joining sequence (2: its first step was a decode step),
                 * 3 gone */
                pass_as_alone(what, m, kvp, alone, rows, T2, NS - 1, in, out, ref, &ws);
                sp_ws_free(&ws);
            }
            for (int i = 0; i < NS; i++)
                sp_kv_free(&alone[i]), sp_kv_free(&batch[i]);
        }
        sp_kern_force(-1);
        free(in), free(out), free(ref);
        sp_model_free(m);
    }
}

START_TEST(t_long_prefills_as_alone) { long_prefills_case(families[_i]); }
END_TEST

/* The weight tensors of a block (NULL: the family has none) and their sizes: they are carved from mem in this
 * order, so each ends where the next present one starts. */
#define NW 18
static int block_tensors(sp_block *b, float **t, size_t *size)
{
    float *all[NW] = {b->ln1_w, b->ln1_b, b->wq, b->bq, b->wk, b->bk, b->wv, b->bv, b->wo,
                      b->bo, b->ln2_w, b->ln2_b, b->w_gate, b->w_up, b->b_up, b->w_down, b->b_down, b->router};
    int n = 0;
    for (int i = 0; i < NW; i++)
        if (all[i])
            t[n++] = all[i];
    for (int i = 0; i < n; i++)
        size[i] = (size_t)((i + 1 < n ? t[i + 1] : b->mem + b->numel) - t[i]);
    return n;
}

/* Weight gradients of a block (f32) against central differences on a few entries of every tensor. */
static void weight_grads_case(const char *model)
{
    sp_model *m = load(model, SP_LOAD_BLOCKS, 0, 1);
    sp_block *b = &m->blocks[0], g;
    sp_err err = {0};
    ck_assert_int_eq(sp_block_init(&g, &m->cfg, &m->rope, &err), SP_OK);
    int B = 1, T = 5, H = b->H;
    size_t n = (size_t)B * T * H;
    sp_rng r;
    sp_rng_seed(&r, 11);
    float *x = malloc(n * sizeof(float)), *G = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    float *dx = malloc(n * sizeof(float));
    sp_rng_fill_normal(&r, x, (long)n, 1.0f);
    sp_rng_fill_normal(&r, G, (long)n, 1.0f);
    ck_assert_int_eq(sp_block_backward(b, dx, G, x, B, T, 3, &g, &m->ws, &err), SP_OK);
    float *params[NW], *grads[NW];
    size_t size[NW], gsize[NW];
    int np = block_tensors(b, params, size);
    ck_assert_int_eq(block_tensors(&g, grads, gsize), np);
    for (int p = 0; p < np; p++) {
        for (int k = 0; k < 4; k++) {
            long idx = (long)(sp_rng_u32(&r) % (uint32_t)size[p]);
            float keep = params[p][idx], h = 1e-2f;
            double l[2];
            for (int s = 0; s < 2; s++) {
                params[p][idx] = keep + (s ? -h : h);
                ck_assert_int_eq(sp_block_forward(b, y, x, B, T, 3, NULL, &m->ws, &err), SP_OK);
                l[s] = 0;
                for (size_t i = 0; i < n; i++)
                    l[s] += (double)y[i] * G[i];
            }
            params[p][idx] = keep;
            double num = (l[0] - l[1]) / (2.0 * h);
            ck_assert_msg(fabs(num - grads[p][idx]) <= 2e-3 * fmax(1.0, fabs(num)),
                          "%s: tensor %d idx %ld: fd %g vs %g", model, p, idx, num, grads[p][idx]);
        }
    }
    sp_block_free(&g);
    free(x), free(G), free(y), free(dx);
    sp_model_free(m);
}

START_TEST(t_weight_grads_fd) { weight_grads_case(families[_i]); }
END_TEST

/* Forward keeping the activations, then backward from them: the same output, input gradient and weight
 * gradients as the recomputing backward, bit for bit (the same operations in the same order); a kept buffer
 * is reused for a smaller batch; a backward without kept activations is refused. */
static void kept_case(const char *model)
{
    sp_model *m = load(model, SP_LOAD_BLOCKS, 0, 1);
    sp_block *b = &m->blocks[0], g1, g2;
    sp_err err = {0};
    ck_assert_int_eq(sp_block_init(&g1, &m->cfg, &m->rope, &err), SP_OK);
    ck_assert_int_eq(sp_block_init(&g2, &m->cfg, &m->rope, &err), SP_OK);
    sp_block_acts k = {0};
    sp_rng r;
    sp_rng_seed(&r, 5);
    for (int round = 0; round < 2; round++) {
        int B = round ? 1 : 2, T = round ? 4 : 7, H = b->H, pos0 = round ? 0 : 2;
        size_t n = (size_t)B * T * H;
        float *x = malloc(n * sizeof(float)), *G = malloc(n * sizeof(float)), *y1 = malloc(n * sizeof(float));
        float *y2 = malloc(n * sizeof(float)), *d1 = malloc(n * sizeof(float)), *d2 = malloc(n * sizeof(float));
        sp_rng_fill_normal(&r, x, (long)n, 1.0f);
        sp_rng_fill_normal(&r, G, (long)n, 1.0f);
        ck_assert_int_eq(sp_block_forward(b, y1, x, B, T, pos0, NULL, &m->ws, &err), SP_OK);
        ck_assert_int_eq(sp_block_forward_keep(b, y2, x, B, T, pos0, &k, &err), SP_OK);
        ck_assert_int_eq(memcmp(y1, y2, n * sizeof(float)), 0);
        ck_assert_uint_ge(k.cap, sp_block_acts_floats(b, B, T));
        ck_assert_int_eq(sp_block_backward(b, d1, G, x, B, T, pos0, &g1, &m->ws, &err), SP_OK);
        ck_assert_int_eq(sp_block_backward_kept(b, d2, G, x, &k, &g2, &m->ws, &err), SP_OK);
        ck_assert_int_eq(memcmp(d1, d2, n * sizeof(float)), 0);
        ck_assert_int_eq(memcmp(g1.mem, g2.mem, b->numel * sizeof(float)), 0); /* every weight gradient */
        /* the backward leaves the kept activations as they were: a second one gives the same */
        ck_assert_int_eq(sp_block_backward_kept(b, d1, G, x, &k, NULL, &m->ws, &err), SP_OK);
        ck_assert_int_eq(memcmp(d1, d2, n * sizeof(float)), 0);
        double dn = 0;
        for (size_t i = 0; i < n; i++)
            dn += fabs(d2[i]);
        ck_assert(dn > 0);
        free(x), free(G), free(y1), free(y2), free(d1), free(d2);
    }
    sp_block_acts none = {0};
    float z[64] = {0};
    ck_assert_int_eq(sp_block_backward_kept(b, z, z, z, &none, NULL, &m->ws, &err), SP_ERR_STATE);
    sp_block_acts_free(&k);
    ck_assert_ptr_null(k.buf);
    sp_block_free(&g1);
    sp_block_free(&g2);
    sp_model_free(m);
}

START_TEST(t_kept_activations) { kept_case(families[_i]); }
END_TEST

/* A server-style load reads only its blocks' tensors, and maps only the shards that hold them; a client-style
 * load only the local parts (BLOOM: with its embedding LayerNorm and ln_f's bias; tied heads read once). */
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
    for (int f = 2; f < NFAM; f++) {
        full = load(families[f], SP_LOAD_ALL, 0, -1);
        blocks = load(families[f], SP_LOAD_BLOCKS, 1, 2);
        local = load(families[f], SP_LOAD_EMBED | SP_LOAD_HEAD, 0, 0);
        const sp_config *c = &full->cfg;
        ck_assert_int_eq((long long)full->bytes_loaded, sp_config_total_params(c) * 4);
        ck_assert_int_eq((long long)blocks->bytes_loaded, sp_config_block_params(c) * 4);
        long long emb = (long long)c->vocab * c->hidden;
        long long norm = c->blk.norm == SP_NORM_LAYER ? 2 * c->hidden : c->hidden;
        long long want = emb * (c->tie_embeddings ? 1 : 2) + norm + (c->embed_norm ? 2 * c->hidden : 0);
        ck_assert_int_eq((long long)local->bytes_loaded, want * 4);
        ck_assert_int_eq(local->head_is_embed, c->tie_embeddings);
        ck_assert_int_eq(local->embed_norm_w != NULL, c->arch == SP_ARCH_BLOOM);
        sp_model_free(full), sp_model_free(blocks), sp_model_free(local);
    }
}
END_TEST

/* BLOOM's own checkpoints name tensors without "transformer." (saved from BloomModel): the same model. */
START_TEST(t_bloom_unprefixed_names)
{
    const char *dir = sp_test_tmpdir();
    char path[600];
    sp_safetensors *st = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_st_open(&st, tiny("bloom-bias"), &err), SP_OK);
    int n = sp_st_count(st);
    sp_st_wtensor *w = calloc((size_t)n, sizeof *w);
    char (*names)[128] = calloc((size_t)n, sizeof *names);
    for (int i = 0; i < n; i++) {
        const sp_st_tensor *t = sp_st_get(st, sp_st_name(st, i), &err);
        ck_assert_ptr_nonnull(t);
        ck_assert_ptr_nonnull(strstr(t->name, "transformer."));
        snprintf(names[i], sizeof names[i], "%s", t->name + strlen("transformer."));
        w[i] = (sp_st_wtensor){.name = names[i], .dtype = t->dtype, .ndim = t->ndim, .data = t->data};
        memcpy(w[i].shape, t->shape, sizeof t->shape);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ck_assert_int_eq(sp_st_write(path, w, n, NULL, &err), SP_OK);
    sp_st_close(st);
    free(w), free(names);
    char cmd[1400];
    const char *src = tiny("bloom-bias");
    snprintf(cmd, sizeof cmd, "cp '%s/config.json' '%s/golden.safetensors' '%s/'", src, src, dir);
    ck_assert_int_eq(system(cmd), 0);
    sp_model *a = load("bloom-bias", SP_LOAD_ALL, 0, -1), *b = NULL;
    ck_assert_msg(sp_model_load(&b, dir, SP_LOAD_ALL, 0, -1, &err) == SP_OK, "%s", err.msg);
    int32_t ids[6] = {5, 77, 300, 2, 9, 411};
    float *la = malloc(6 * 512 * sizeof(float)), *lb = malloc(6 * 512 * sizeof(float));
    ck_assert_int_eq(sp_model_forward(a, la, ids, 1, 6, 0, NULL, 0, &err), SP_OK);
    ck_assert_int_eq(sp_model_forward(b, lb, ids, 1, 6, 0, NULL, 0, &err), SP_OK);
    ck_assert_int_eq(memcmp(la, lb, 6 * 512 * sizeof(float)), 0);
    free(la), free(lb);
    sp_model_free(a), sp_model_free(b);
}
END_TEST

START_TEST(t_unsupported_architecture)
{
    sp_model *m = NULL;
    sp_err err = {0};
    const char *dir = sp_test_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("{\"architectures\":[\"GPT2LMHeadModel\"],\"model_type\":\"gpt2\",\"n_embd\":64,\"n_layer\":2,"
          "\"n_head\":4,\"vocab_size\":512}", f);
    fclose(f);
    ck_assert_int_eq(sp_model_load(&m, dir, SP_LOAD_ALL, 0, -1, &err), SP_ERR_UNSUPPORTED);
    ck_assert_str_eq(err.msg, "unsupported architecture: gpt2 (supported: llama, bloom, falcon, mixtral)");
    ck_assert_ptr_null(m);
    ck_assert_int_eq(sp_model_load(&m, tiny("llama-gqa"), SP_LOAD_BLOCKS, 3, 9, &err), SP_ERR_ARG);
}
END_TEST

/* Blocks re-encoded (bf16, int8, nf4, fp16): forward and the backward to the input equal an f32 block holding the
 * decoded weights (the encoding is the only difference); decoding with a KV cache equals the full forward
 * (int8 and nf4 products quantise their input, as llama.cpp's Q8_0 and Q4_0 do: a looser bound); weight
 * gradients are refused; the bytes shrink. */
static void encoded_case(const char *model)
{
    sp_err err = {0};
    for (int t = SP_W_BF16; t < SP_W__COUNT; t++) {
        sp_model *q = load(model, SP_LOAD_BLOCKS, 0, -1), *ref = load(model, SP_LOAD_BLOCKS, 0, -1);
        for (int i = 0; i < q->cfg.n_layers; i++) {
            sp_block *bq = &q->blocks[i], *br = &ref->blocks[i];
            size_t before = sp_block_bytes(bq);
            ck_assert_int_eq(sp_block_quantize(bq, (sp_wtype)t, &err), SP_OK);
            ck_assert_int_eq(bq->wtype, t);
            ck_assert_msg(sp_block_bytes(bq) < before, "%s %s: %zu bytes, f32 %zu", model, sp_wtype_name((sp_wtype)t),
                          sp_block_bytes(bq), before);
            ck_assert_int_eq(bq->nqm, br->nqm);
            for (int k = 0; k < bq->nqm; k++) /* the reference holds the decoded weights */
                for (int r = 0; bq->qm[k].q && r < bq->qm[k].rows; r++)
                    sp_qmat_row(&bq->qm[k], r, (float *)br->qm[k].q + (size_t)r * br->qm[k].cols);
            size_t n;
            float *in = golden_block(model, "in", i, &n), *gout = golden_block(model, "grad_out", i, &n);
            float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
            int H = q->cfg.hidden, T = 12, B = (int)(n / (size_t)T / (size_t)H);
            ck_assert_int_eq(sp_block_forward(bq, a, in, B, T, 0, NULL, &q->ws, &err), SP_OK);
            ck_assert_int_eq(sp_block_forward(br, b, in, B, T, 0, NULL, &ref->ws, &err), SP_OK);
            /* int8 and nf4 products (any number of rows) quantise their input where the level runs them in
             * integers */
            int integer = sp_kern_integer((sp_wtype)t);
            double big = 0;
            for (size_t k = 0; k < n; k++)
                big = fmax(big, fabs((double)b[k]));
            double otol = integer ? 2e-2 * big : 1e-4;
            ck_assert_msg(sp_max_abs_diff(a, b, n) <= otol, "%s %s block %d out: %g", model,
                          sp_wtype_name((sp_wtype)t), i, sp_max_abs_diff(a, b, n));
            ck_assert_int_eq(sp_block_backward(bq, a, gout, in, B, T, 0, NULL, &q->ws, &err), SP_OK);
            ck_assert_int_eq(sp_block_backward(br, b, gout, in, B, T, 0, NULL, &ref->ws, &err), SP_OK);
            big = 0;
            for (size_t k = 0; k < n; k++)
                big = fmax(big, fabs((double)b[k]));
            ck_assert_msg(sp_max_abs_diff(a, b, n) <= (otol > 1e-4 ? 5e-2 * big : 1e-3), "%s %s block %d grad_in: %g",
                          model, sp_wtype_name((sp_wtype)t), i, sp_max_abs_diff(a, b, n));
            /* decode one position at a time through a cache, row 0 of the batch */
            sp_kv_cache kv;
            ck_assert_int_eq(sp_kv_init(&kv, 1, T, q->cfg.n_kv_heads, q->cfg.head_dim, &err), SP_OK);
            ck_assert_int_eq(sp_block_forward(br, b, in, 1, T, 0, NULL, &ref->ws, &err), SP_OK);
            double worst = 0, scale = 0;
            for (int p = 0; p < T; p++) {
                float *x = a + (size_t)p * H;
                ck_assert_int_eq(sp_block_forward(bq, x, in + (size_t)p * H, 1, 1, p, &kv, &q->ws, &err), SP_OK);
                for (int c = 0; c < H; c++) {
                    worst = fmax(worst, fabs((double)x[c] - b[(size_t)p * H + c]));
                    scale = fmax(scale, fabs((double)b[(size_t)p * H + c]));
                }
            }
            double tol = integer ? 2e-2 * scale : 1e-4;
            ck_assert_msg(worst <= tol, "%s %s block %d decode vs full: %g (scale %g)", model,
                          sp_wtype_name((sp_wtype)t), i, worst, scale);
            sp_kv_free(&kv);
            sp_block grads;
            ck_assert_int_eq(sp_block_init(&grads, &q->cfg, &q->rope, &err), SP_OK);
            ck_assert_int_eq(sp_block_backward(bq, a, gout, in, B, T, 0, &grads, &q->ws, &err), SP_ERR_UNSUPPORTED);
            sp_block_free(&grads);
            free(in), free(gout), free(a), free(b);
        }
        sp_model_free(q);
        sp_model_free(ref);
    }
}

START_TEST(t_encoded_blocks) { encoded_case(families[_i]); }
END_TEST

/* Blocks in fp16 against the f32 blocks themselves (not their decoded weights): fp16 rounds each weight to an
 * 11-bit significand, at most 2^-11 of it away (subnormals, below 6.1e-5: 2^-25 at most), so each product is within
 * 2^-11 sum |w x| of f32's, the errors of a block's chained products (q, k, v -> o; up, gate -> down) adding up:
 * the forward within 4 x 2^-11 of the output's largest value, the backward to the input within 8 x 2^-11 of its
 * largest (twice as many products), and both at least 4 times closer than bf16 (8 bits: 2^-8, 8 times coarser). */
static void f16_case(const char *model)
{
    sp_err err = {0};
    sp_model *ref = load(model, SP_LOAD_BLOCKS, 0, -1), *h = load(model, SP_LOAD_BLOCKS, 0, -1);
    sp_model *bf = load(model, SP_LOAD_BLOCKS, 0, -1);
    double worst[2][2] = {{0}}; /* [fp16, bf16][forward, backward], relative to the largest */
    for (int i = 0; i < ref->cfg.n_layers; i++) {
        ck_assert_int_eq(sp_block_quantize(&h->blocks[i], SP_W_F16, &err), SP_OK);
        ck_assert_int_eq(sp_block_quantize(&bf->blocks[i], SP_W_BF16, &err), SP_OK);
        ck_assert_uint_eq(sp_block_bytes(&h->blocks[i]), sp_block_bytes(&bf->blocks[i])); /* 2 bytes a weight both */
        size_t n;
        float *in = golden_block(model, "in", i, &n), *gout = golden_block(model, "grad_out", i, &n);
        float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
        int H = ref->cfg.hidden, T = 12, B = (int)(n / (size_t)T / (size_t)H);
        for (int pass = 0; pass < 2; pass++) { /* forward, backward to the input */
            if (pass == 0)
                ck_assert_int_eq(sp_block_forward(&ref->blocks[i], b, in, B, T, 0, NULL, &ref->ws, &err), SP_OK);
            else
                ck_assert_int_eq(sp_block_backward(&ref->blocks[i], b, gout, in, B, T, 0, NULL, &ref->ws, &err), SP_OK);
            double big = 0;
            for (size_t k = 0; k < n; k++)
                big = fmax(big, fabs((double)b[k]));
            for (int e = 0; e < 2; e++) {
                sp_model *m = e ? bf : h;
                if (pass == 0)
                    ck_assert_int_eq(sp_block_forward(&m->blocks[i], a, in, B, T, 0, NULL, &m->ws, &err), SP_OK);
                else
                    ck_assert_int_eq(sp_block_backward(&m->blocks[i], a, gout, in, B, T, 0, NULL, &m->ws, &err), SP_OK);
                worst[e][pass] = fmax(worst[e][pass], sp_max_abs_diff(a, b, n) / big);
            }
        }
        free(in), free(gout), free(a), free(b);
    }
    printf("%s: fp16 blocks vs f32: forward %.2e, backward %.2e of the largest (bf16: %.2e, %.2e)\n", model,
           worst[0][0], worst[0][1], worst[1][0], worst[1][1]);
    const double u = 1.0 / 2048; /* 2^-11 */
    ck_assert_msg(worst[0][0] <= 4 * u, "%s fp16 forward: %.3g of the largest", model, worst[0][0]);
    ck_assert_msg(worst[0][1] <= 8 * u, "%s fp16 backward: %.3g of the largest", model, worst[0][1]);
    ck_assert_msg(worst[0][0] > 0, "%s: the fp16 blocks gave f32's bits (not encoded?)", model);
    for (int pass = 0; pass < 2; pass++)
        ck_assert_msg(worst[0][pass] * 4 <= worst[1][pass], "%s %s: fp16 %.3g, not 4 times closer than bf16 %.3g",
                      model, pass ? "backward" : "forward", worst[0][pass], worst[1][pass]);
    sp_model_free(ref), sp_model_free(h), sp_model_free(bf);
}

START_TEST(t_f16_blocks) { f16_case(families[_i]); }
END_TEST

/* Blocks encoded as they are read (sp_model_load_encoded: each matrix encoded and its f32 pages given back at once)
 * hold the very bytes of blocks read in f32 and encoded after: every matrix, norm, bias and router. */
static void loaded_encoded_case(const char *model)
{
    sp_err err = {0};
    for (int t = SP_W_BF16; t < SP_W__COUNT; t++) {
        sp_model *ref = load(model, SP_LOAD_BLOCKS, 0, -1), *m = NULL;
        ck_assert_msg(!sp_model_load_encoded(&m, tiny(model), SP_LOAD_BLOCKS, 0, -1, (sp_wtype)t, &err), "%s", err.msg);
        ck_assert_int_eq(m->bytes_loaded, ref->bytes_loaded); /* what was read, as f32 */
        for (int i = 0; i < m->cfg.n_layers; i++) {
            sp_block *b = &m->blocks[i], *r = &ref->blocks[i];
            ck_assert_int_eq(sp_block_quantize(r, (sp_wtype)t, &err), SP_OK);
            ck_assert(b->wtype == (sp_wtype)t && b->early == NULL && b->nqm == r->nqm && b->numel == r->numel);
            ck_assert_msg(!memcmp(b->mem, r->mem, b->numel * sizeof(float)), "%s block %d: norms, biases", model, i);
            for (int k = 0; k < b->nqm; k++) { /* every row decoded: the same values, bit for bit */
                const sp_qmat *x = &b->qm[k], *y = &r->qm[k];
                ck_assert(!x->q == !y->q && x->rows == y->rows && x->cols == y->cols && x->type == y->type);
                float *u = malloc((size_t)x->cols * sizeof(float)), *v = malloc((size_t)x->cols * sizeof(float));
                for (int row = 0; x->q && row < x->rows; row++) {
                    sp_qmat_row(x, row, u);
                    sp_qmat_row(y, row, v);
                    ck_assert_msg(!memcmp(u, v, (size_t)x->cols * sizeof(float)), "%s %s block %d matrix %d row %d",
                                  model, sp_wtype_name((sp_wtype)t), i, k, row);
                }
                free(u), free(v);
            }
        }
        sp_model_free(m);
        sp_model_free(ref);
    }
}

START_TEST(t_loaded_encoded) { loaded_encoded_case(families[_i]); }
END_TEST

/* In-place row gathers (beam search's cache reorders) equal a gather through a copy: permutations with long
 * cycles, repeated and dropped rows, rows that stay; rows longer than the stack piece. */
/* Inference steps of up to 8 positions attend on the pool in the own kernels, in chunks of cached positions (and
 * blocks of 256 within a chunk, softmax online):
 * against the sgemm attention of one full forward without a cache, on blocks long enough to be split (600
 * cached positions), with head sizes no vector width divides, MHA, GQA, multi-query and ALiBi, on a pool of
 * 3 threads, at every kernel level. Steps of 1 and of 5 positions, two sequences. The full forward of two
 * sequences on the pool with OpenBLAS on one thread (products and attention split over the pool) against the
 * same. */
START_TEST(t_pool_attention)
{
    static const char *cfgs[] = {
        "{\"model_type\":\"llama\",\"hidden_size\":256,\"num_attention_heads\":4,\"num_key_value_heads\":4,"
        "\"intermediate_size\":384,\"num_hidden_layers\":1,\"vocab_size\":64,\"rms_norm_eps\":1e-5,"
        "\"max_position_embeddings\":4096}",
        "{\"model_type\":\"llama\",\"hidden_size\":320,\"num_attention_heads\":8,\"num_key_value_heads\":2,"
        "\"intermediate_size\":384,\"num_hidden_layers\":1,\"vocab_size\":64,\"rms_norm_eps\":1e-5,"
        "\"max_position_embeddings\":4096}",
        "{\"model_type\":\"bloom\",\"hidden_size\":260,\"n_head\":4,\"layer_norm_epsilon\":1e-5,"
        "\"num_hidden_layers\":1,\"vocab_size\":64}",
        "{\"model_type\":\"falcon\",\"multi_query\":true,\"parallel_attn\":true,\"bias\":false,"
        "\"hidden_size\":288,\"num_attention_heads\":8,\"ffn_hidden_size\":384,\"num_hidden_layers\":1,"
        "\"vocab_size\":64}",
    };
    int P0 = 600, steps[] = {1, 1, 5, 1}, T = P0 + 8, cap = T;
    sp_pool *pool = sp_pool_new(3), *one = sp_pool_new(1);
    ck_assert_ptr_nonnull(pool);
    ck_assert_ptr_nonnull(one);
    int best = sp_kern_level();
    for (int B = 2; B <= 8; B += 6) /* 2 sequences: ~10 chunks; 8: one chunk of 600 (blocks of 256 positions) */
    for (size_t ci = 0; ci < sizeof cfgs / sizeof *cfgs; ci++) {
        sp_config cfg;
        sp_rope rope;
        sp_block b;
        sp_err err = {0};
        ck_assert_msg(sp_config_parse(&cfg, cfgs[ci], "test", &err) == SP_OK, "%s", err.msg);
        ck_assert_int_eq(cfg.blk.pos != SP_POS_ROPE || sp_rope_init(&rope, &cfg, &err) == SP_OK, 1);
        ck_assert_int_eq(sp_block_init(&b, &cfg, &rope, &err), SP_OK);
        b.pool = pool;
        sp_rng r;
        sp_rng_seed(&r, 21 + ci);
        sp_rng_fill_normal(&r, b.mem, (long)b.numel, 0.05f);
        int H = cfg.hidden;
        size_t n = (size_t)B * T * H;
        float *x = malloc(n * sizeof(float)), *full = malloc(n * sizeof(float)), *buf = malloc(n * sizeof(float));
        sp_rng_fill_normal(&r, x, (long)n, 1.0f);
        sp_ws ws = {0};
        ck_assert_int_eq(sp_block_forward(&b, full, x, B, T, 0, NULL, &ws, &err), SP_OK);
        /* the pool's parts (the MLP's activation in 4096-value parts, the norms', RoPE's and residuals' rows, the
         * matrices' rows) change nothing: the same forward on one thread is the same to the bit */
        b.pool = one;
        ck_assert_int_eq(sp_block_forward(&b, buf, x, B, T, 0, NULL, &ws, &err), SP_OK);
        ck_assert_msg(memcmp(buf, full, n * sizeof(float)) == 0, "config %zu: 1 thread vs 3 differ", ci);
        b.pool = pool;
        /* with OpenBLAS on one thread the pool splits the prefill's products (by rows of W) and its attention (by
         * heads, a scratch of probs each): within rounding of OpenBLAS's own threads (its Haswell sgemm's last
         * bits depend on where an element lies in a call); 2 sequences (8 take the time of 4 more) */
        if (B == 2) {
            int blas_was = openblas_get_num_threads();
            openblas_set_num_threads(1);
            ck_assert_int_eq(sp_block_forward(&b, buf, x, B, T, 0, NULL, &ws, &err), SP_OK);
            openblas_set_num_threads(blas_was);
            double split_worst = 0, split_scale = 1;
            for (size_t i = 0; i < n; i++) {
                split_worst = fmax(split_worst, fabs((double)buf[i] - full[i]));
                split_scale = fmax(split_scale, fabs((double)full[i]));
            }
            ck_assert_msg(split_worst <= 1e-5 * split_scale, "config %zu: split over the pool: %g", ci, split_worst);
        }
        for (int lv = 0; lv <= best; lv++) {
            if (!sp_kern_supported(lv))
                continue;
            sp_kern_force(lv);
            sp_kv_cache kv;
            ck_assert_int_eq(sp_kv_init(&kv, B, cap, b.nkv, b.hd, &err), SP_OK);
            int pos = 0;
            for (int s = -1; s < (int)(sizeof steps / sizeof *steps); s++) {
                int t = s < 0 ? P0 : steps[s]; /* the prefill (sgemm), then the short steps (the pool) */
                for (int q = 0; q < B; q++)
                    memcpy(buf + (size_t)q * t * H, x + ((size_t)q * T + pos) * H, (size_t)t * H * sizeof(float));
                ck_assert_int_eq(sp_block_forward(&b, buf, buf, B, t, pos, &kv, &ws, &err), SP_OK);
                double worst = 0, scale = 0;
                for (int q = 0; q < B; q++)
                    for (size_t i = 0; i < (size_t)t * H; i++) {
                        double want = full[((size_t)q * T + pos) * H + i], d = fabs(buf[(size_t)q * t * H + i] - want);
                        worst = d > worst ? d : worst;
                        scale = fabs(want) > scale ? fabs(want) : scale;
                    }
                ck_assert_msg(worst <= 2e-5 * (scale > 1 ? scale : 1),
                              "B %d config %zu %s: step of %d at %d: %g (scale %g)", B, ci, sp_kern_level_name(lv),
                              t, pos, worst, scale);
                pos += t;
            }
            sp_kv_free(&kv);
        }
        sp_kern_force(-1);
        sp_ws_free(&ws);
        free(x), free(full), free(buf);
        sp_block_free(&b);
    }
    sp_pool_free(pool);
    sp_pool_free(one);
}
END_TEST

START_TEST(t_rows_gather)
{
    sp_rng rng;
    sp_rng_seed(&rng, 7);
    for (int trial = 0; trial < 400; trial++) {
        int B = 1 + trial % 9;
        size_t used = trial % 3 == 0 ? 2500 : 1 + trial % 37, stride = used + trial % 5;
        int64_t src[9];
        for (int b = 0; b < B; b++)
            src[b] = trial % 4 == 0 ? (b + 1) % B : (int64_t)(sp_rng_f32(&rng) * B) % B; /* a cycle, or anything */
        float *rows = malloc((size_t)B * stride * sizeof(float)), *want = malloc((size_t)B * stride * sizeof(float));
        for (size_t i = 0; i < (size_t)B * stride; i++)
            rows[i] = (float)i;
        memcpy(want, rows, (size_t)B * stride * sizeof(float));
        for (int b = 0; b < B; b++)
            memcpy(want + (size_t)b * stride, rows + (size_t)src[b] * stride, used * sizeof(float));
        sp_err err = {0};
        ck_assert_int_eq(sp_rows_gather(rows, stride, used, src, B, &err), SP_OK);
        ck_assert_msg(memcmp(rows, want, (size_t)B * stride * sizeof(float)) == 0, "trial %d (B %d)", trial, B);
        free(rows), free(want);
    }
}
END_TEST

/* Merged training requests (a server's FORWARDs and BACKWARDs of several clients in one pass): each item's output,
 * kept activations and input gradient have the bits it gets alone, in every weight type, for items of more rows
 * than the decode kernels take (sgemm) and of fewer (the decode kernels) in one pass. */
static void items_case(const char *model)
{
    sp_err err = {0};
    for (int t = SP_W_F32; t < SP_W__COUNT; t++) {
        sp_model *m = load_block0(model, t);
        sp_block *blk = &m->blocks[0];
        enum { NI = 4 };
        int H = m->cfg.hidden, nb[NI] = {1, 3, 2, 1}, T = t % 2 ? 4 : 12, B = 0, rows[NI];
        for (int i = 0; i < NI; i++)
            B += nb[i], rows[i] = nb[i] * T;
        size_t n = (size_t)B * T * H;
        float *x = malloc(n * sizeof(float)), *G = malloc(n * sizeof(float)), *ref = malloc(n * sizeof(float));
        float *dref = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float)), *d = malloc(n * sizeof(float));
        sp_rng r;
        sp_rng_seed(&r, 77 + (uint64_t)t);
        sp_rng_fill_normal(&r, x, (long)n, 1.0f);
        sp_rng_fill_normal(&r, G, (long)n, 1.0f);
        sp_block_acts alone[NI] = {{0}}, all = {0}, part = {0};
        const sp_block_acts *parts[NI];
        if (blk->k.mlp == SP_MLP_MOE) { /* its router groups the rows: refused, nothing computed */
            ck_assert_int_eq(sp_block_forward_items(blk, out, x, B, T, 0, rows, NI, NULL, &m->ws, &err),
                             SP_ERR_UNSUPPORTED);
            free(x), free(G), free(ref), free(dref), free(out), free(d);
            sp_model_free(m);
            return;
        }
        for (int i = 0, o = 0; i < NI; o += rows[i++]) { /* each item alone */
            size_t off = (size_t)o * H;
            ck_assert_int_eq(sp_block_forward(blk, ref + off, x + off, nb[i], T, 0, NULL, &m->ws, &err), SP_OK);
            ck_assert_int_eq(sp_block_forward_keep(blk, out, x + off, nb[i], T, 0, &alone[i], &err), SP_OK);
            ck_assert_int_eq(sp_block_backward(blk, dref + off, G + off, x + off, nb[i], T, 0, NULL, &m->ws, &err),
                             SP_OK);
            parts[i] = &alone[i];
        }
        const char *w = sp_wtype_name((sp_wtype)t);
        ck_assert_msg(sp_block_forward_items(blk, out, x, B, T, 0, rows, NI, NULL, &m->ws, &err) == SP_OK, "%s",
                      err.msg);
        ck_assert_msg(!memcmp(out, ref, n * sizeof(float)), "%s %s: a merged forward's row differs", model, w);
        memset(out, 0, n * sizeof(float));
        ck_assert_int_eq(sp_block_forward_items(blk, out, x, B, T, 0, rows, NI, &all, &m->ws, &err), SP_OK);
        ck_assert_msg(!memcmp(out, ref, n * sizeof(float)), "%s %s: a merged forward (kept) differs", model, w);
        for (int i = 0, b0 = 0, o = 0; i < NI; b0 += nb[i], o += rows[i++]) { /* each item's slice, as kept alone */
            ck_assert_int_eq(sp_block_acts_slice(blk, &part, &all, b0, nb[i], &err), SP_OK);
            size_t off = (size_t)o * H;
            ck_assert_int_eq(sp_block_backward_kept(blk, d + off, G + off, x + off, &part, NULL, &m->ws, &err), SP_OK);
        }
        ck_assert_msg(!memcmp(d, dref, n * sizeof(float)), "%s %s: a sliced item's backward differs", model, w);
        memset(d, 0, n * sizeof(float));
        ck_assert_int_eq(sp_block_backward_items(blk, d, G, x, B, T, 0, rows, NI, NULL, &m->ws, &err), SP_OK);
        ck_assert_msg(!memcmp(d, dref, n * sizeof(float)), "%s %s: a merged backward differs", model, w);
        memset(d, 0, n * sizeof(float));
        ck_assert_int_eq(sp_block_acts_join(blk, &all, parts, NI, &err), SP_OK);
        ck_assert_int_eq(sp_block_backward_items(blk, d, G, x, B, T, 0, rows, NI, &all, &m->ws, &err), SP_OK);
        ck_assert_msg(!memcmp(d, dref, n * sizeof(float)), "%s %s: a merged backward (joined) differs", model, w);
        rows[0]++; /* items that are not whole sequences are refused */
        ck_assert_int_eq(sp_block_forward_items(blk, out, x, B, T, 0, rows, NI, NULL, &m->ws, &err), SP_ERR_ARG);
        for (int i = 0; i < NI; i++)
            sp_block_acts_free(&alone[i]);
        sp_block_acts_free(&all), sp_block_acts_free(&part);
        free(x), free(G), free(ref), free(dref), free(out), free(d);
        sp_model_free(m);
    }
}

START_TEST(t_items_as_alone) { items_case(families[_i]); }
END_TEST

static Suite *block_suite(void)
{
    Suite *s = suite_create("block");
    TCase *tc = tcase_create("families");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, t_golden_blocks, 0, NFAM);
    tcase_add_loop_test(tc, t_golden_model, 0, NFAM);
    tcase_add_loop_test(tc, t_kv_cache_matches_full, 0, NFAM);
    tcase_add_loop_test(tc, t_decode_batch_as_alone, 0, NFAM);
    tcase_add_loop_test(tc, t_long_prefills_as_alone, 0, NFAM);
    tcase_add_loop_test(tc, t_weight_grads_fd, 0, NFAM);
    tcase_add_loop_test(tc, t_kept_activations, 0, NFAM);
    tcase_add_loop_test(tc, t_items_as_alone, 0, NFAM);
    tcase_add_loop_test(tc, t_encoded_blocks, 0, NFAM);
    tcase_add_loop_test(tc, t_f16_blocks, 0, NFAM);
    tcase_add_loop_test(tc, t_loaded_encoded, 0, NFAM);
    tcase_add_test(tc, t_partial_load_reads_only_its_part);
    tcase_add_test(tc, t_bloom_unprefixed_names);
    tcase_add_test(tc, t_unsupported_architecture);
    tcase_add_test(tc, t_rows_gather);
    suite_add_tcase(s, tc);
    /* every kernel level the CPU has, 4 configurations, 600 positions: 46 s alone under ASan on an idle Intel
     * Xeon (3 levels), past 60 s in CI beside another suite */
    TCase *pool = tcase_create("pool");
    tcase_set_timeout(pool, 280);
    tcase_add_test(pool, t_pool_attention);
    suite_add_tcase(s, pool);
    return s;
}

int main(void) { return sp_test_run(block_suite()); }
