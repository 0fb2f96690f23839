/* block_cuda.c - the device block (cuda/block_cuda.h) at Llama-2-7B and Llama-2-70B shapes with random weights,
 * against the device's own limits measured in the same run (issue 27's benchmarks):
 *
 * 1. decode: one sequence, one token over a KV cache of 128 positions, graphs on: weight bytes read per second
 *    over the device-to-device copy bandwidth (bytes read + written by cudaMemcpy). Goal >= 0.8. bf16, and the
 *    7B block in int8, NF4 and fp16 (bytes of their encodings); the plain kernels, the fused ones, and the fused ones
 *    as programmatic dependent launches (sp_cuda_block_use_fused 0, 1, 2); int8 and NF4 also with the kernels before
 *    (sp_cuda_wmat_tune_light 0); bf16, int8 and NF4 also every shape of the fused kernels (rows a warp, warps a row:
 *    sp_cuda_wmat_tune; W streamed as L2's first to evict or not: sp_cuda_wmat_tune_stream) and L2 asked for 4-48
 *    MiB of each next product (sp_cuda_block_use_prefetch); bf16 the attention's keys a warp (sp_cuda_attn_tune).
 * 2. forward of 1024 tokens (no cache), and forward + backward to the input (kept activations): FLOP/s over the
 *    peak of a cuBLAS bf16 GEMM of the block's largest product ([1024, H] x [H, FF]). Goal >= 0.6. FLOPs: 2 per
 *    weight per token for each product (x3 forward + backward: the backward to the input only needs dX, one more
 *    product, so forward + backward is 2x the products) plus attention's 4 T^2 hd per head (x2.5 with backward).
 *
 * 3. Mixtral-8x7B's block (H 4096, 32 heads on 8, FF 14336, 8 experts, 2 a token) decode step as in 1, bf16, int8
 *    and NF4: the bytes a step reads (attention's four matrices, the router, and the two chosen experts' three
 *    matrices each) over the copy bandwidth, with the experts' products vectorised (the default) and one weight a
 *    lane (sp_cuda_block_use_moe_vec 0, the kernel before it: the baseline of the same run), plain kernels and
 *    fused+pdl; bf16 also the experts alone (router, routing and the two experts: sp_cuda_moe_fwd on one row).
 *
 * Prints the device and the ratios; without a GPU it says so and exits 0. Usage: bench_block_cuda [--quick |
 * --profile] (--quick: the 7B block only, Mixtral's in bf16 only, fewer repetitions; --profile: one of each kind of
 * work for ncu, see profile()). The blocks' random weights are drawn and encoded a matrix a thread (Mixtral's 1.4 G
 * weights on one core took 20 s on a 2-vCPU Xeon). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block.h"
#include "block_cuda.h"
#include "cuda_backend.h"
#include "cuda_timing.h"
#include "flash.h"
#include "gemm.h"
#include "kernels.h"
#include "moe_cuda.h"
#include "rng.h"

static sp_cuda *cu;
static sp_err err;

static void die(void)
{
    fprintf(stderr, "bench_block_cuda: %s\n", err.msg);
    exit(1);
}

#define TRY(call)                                                                                              \
    do {                                                                                                       \
        if ((call) != SP_OK)                                                                                   \
            die();                                                                                             \
    } while (0)

static double time_reps(void (*run)(void *ctx), void *ctx, int reps)
{
    return sp_bench_cuda_reps(cu, run, ctx, reps, "bench_block_cuda");
}

typedef struct { void *X, *W; float *Y; int N, in, out; } gemm_ctx;
static void run_gemm(void *p)
{
    gemm_ctx *c = p;
    TRY(sp_cuda_linear(cu, c->Y, c->X, c->W, SP_CU_BF16, c->N, c->in, c->out, 0, &err));
}

/* The peak of a bf16 GEMM [N, in] x [in, out] (fp32 accumulation), FLOP/s. */
static double gemm_peak(int N, int in, int out)
{
    gemm_ctx g = {.N = N, .in = in, .out = out};
    TRY(sp_cuda_alloc(cu, &g.X, (size_t)N * in * 2, &err));
    TRY(sp_cuda_alloc(cu, &g.W, (size_t)out * in * 2, &err));
    TRY(sp_cuda_alloc(cu, (void **)&g.Y, (size_t)N * out * sizeof(float), &err));
    TRY(sp_cuda_zero(cu, g.X, (size_t)N * in * 2, &err));
    TRY(sp_cuda_zero(cu, g.W, (size_t)out * in * 2, &err));
    double fl = 2.0 * N * in * out / time_reps(run_gemm, &g, 20);
    sp_cuda_free(cu, g.X), sp_cuda_free(cu, g.W), sp_cuda_free(cu, g.Y);
    return fl;
}

/* The weights of the block's matrices. */
static double mats_params(const sp_block *b)
{
    double params = 0;
    for (int i = 0; i < b->nqm; i++)
        params += (double)b->qm[i].rows * b->qm[i].cols;
    return params;
}

static void bench_forward_path(const char *name, const sp_block *b, int T, int reps, double peak, int flash);

/* Matrices of a block drawn and encoded by threads: the next matrix to take, and the first error. */
typedef struct {
    sp_block *b;
    sp_wtype t;
    int next, failed;
    pthread_mutex_t mu;
    sp_err err;
} fill_jobs;

/* Takes matrices until none is left: N(0, 0.02) weights (a seed a matrix), then encoded in t into b->early, which
 * sp_block_quantize takes as the loader's early encodings. */
static void *fill_worker(void *p)
{
    fill_jobs *j = p;
    for (;;) {
        pthread_mutex_lock(&j->mu);
        int i = j->next++;
        pthread_mutex_unlock(&j->mu);
        if (i >= j->b->nqm)
            return NULL;
        sp_qmat *m = &j->b->qm[i];
        if (!m->q)
            continue;
        sp_rng r;
        sp_rng_seed(&r, 5 + (uint64_t)i);
        sp_rng_fill_normal_fast(&r, m->q, (long)m->rows * m->cols, 0.02f);
        sp_err e = {0};
        if (j->t != SP_W_F32 && sp_qmat_encode(&j->b->early[i], j->t, m->q, m->rows, m->cols, &e) != SP_OK) {
            pthread_mutex_lock(&j->mu);
            if (!j->failed++)
                j->err = e;
            pthread_mutex_unlock(&j->mu);
        }
    }
}

/* The block of config json with random N(0, 0.02) matrices (and router), norm gains 1, encoded in t. */
static void make_block_json(sp_block *b, sp_config *cfg, sp_rope *rope, const char *json, sp_wtype t)
{
    TRY(sp_config_parse(cfg, json, "bench", &err));
    TRY(sp_rope_init(rope, cfg, &err));
    TRY(sp_block_init(b, cfg, rope, &err));
    fill_jobs j = {.b = b, .t = t};
    pthread_mutex_init(&j.mu, NULL);
    if (t != SP_W_F32 && !(b->early = calloc((size_t)b->nqm, sizeof *b->early))) {
        snprintf(err.msg, sizeof err.msg, "out of memory");
        die();
    }
    b->early_t = t;
    pthread_t th[16];
    int n = 0;
    while (n < 16 && n < b->nqm && pthread_create(&th[n], NULL, fill_worker, &j) == 0)
        n++;
    fill_worker(&j); /* this thread too (all of them if none started) */
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&j.mu);
    if (j.failed) {
        err = j.err;
        die();
    }
    if (b->router) {
        sp_rng r;
        sp_rng_seed(&r, 4);
        sp_rng_fill_normal_fast(&r, b->router, (long)b->k.n_experts * b->H, 0.02f);
    }
    for (int i = 0; i < b->H; i++) {
        b->ln1_w[i] = 1.0f;
        if (b->ln2_w)
            b->ln2_w[i] = 1.0f;
    }
    TRY(sp_block_quantize(b, t, &err));
}

/* A Llama-2-shaped block, random N(0, 0.02) weights, norm gains 1, encoded in t. */
static void make_block(sp_block *b, sp_config *cfg, sp_rope *rope, int H, int FF, int nh, int nkv, sp_wtype t)
{
    char json[512];
    snprintf(json, sizeof json,
             "{\"model_type\":\"llama\",\"hidden_size\":%d,\"intermediate_size\":%d,\"num_attention_heads\":%d,"
             "\"num_key_value_heads\":%d,\"num_hidden_layers\":1,\"vocab_size\":32000,\"rms_norm_eps\":1e-5,"
             "\"max_position_embeddings\":4096}",
             H, FF, nh, nkv);
    make_block_json(b, cfg, rope, json, t);
}

static float *dev_randn(size_t n, float sd)
{
    float *h = malloc(n * sizeof(float));
    sp_rng r;
    sp_rng_seed(&r, 3);
    sp_rng_fill_normal_fast(&r, h, (long)n, sd);
    void *d = NULL;
    TRY(sp_cuda_dup(cu, &d, h, n * sizeof(float), &err));
    free(h);
    return d;
}

typedef struct {
    sp_cuda_block *cb;
    sp_cuda_kv *kv;
    sp_cuda_acts acts;
    float *x, *y, *d;
    int T, K; /* forward tokens; decode: cache positions before the step */
} run_ctx;

static void run_decode(void *p)
{
    run_ctx *c = p;
    TRY(sp_cuda_kv_set_len(c->kv, c->K, &err));
    TRY(sp_cuda_block_forward(c->cb, c->y, c->x, 1, 1, c->K, c->kv, &err));
}

static void run_forward(void *p)
{
    run_ctx *c = p;
    TRY(sp_cuda_block_forward(c->cb, c->y, c->x, 1, c->T, 0, NULL, &err));
}

static void run_fwd_bwd(void *p)
{
    run_ctx *c = p;
    TRY(sp_cuda_block_forward_keep(c->cb, c->y, c->x, 1, c->T, 0, &c->acts, &err));
    TRY(sp_cuda_block_backward_kept(c->cb, c->d, c->y, c->x, &c->acts, &err));
}

/* The block's products alone (sp_cuda_wmat_mul on one row), for the share of a decode step they take. */
typedef struct {
    sp_cuda_wmat m[8];
    int n;
    float *x, *y;
} prod_ctx;

static void run_products(void *p)
{
    prod_ctx *c = p;
    for (int i = 0; i < c->n; i++)
        TRY(sp_cuda_wmat_mul(cu, &c->m[i], c->x, c->y, 1, &err));
}

static double time_products(const sp_block *b, int reps)
{
    prod_ctx c = {.n = b->nqm < 8 ? b->nqm : 8};
    int widest = b->FF > b->H ? b->FF : b->H;
    widest = widest > b->nh * b->hd ? widest : b->nh * b->hd;
    c.x = dev_randn((size_t)widest, 1.0f);
    TRY(sp_cuda_alloc(cu, (void **)&c.y, (size_t)widest * sizeof(float), &err));
    for (int i = 0; i < c.n; i++)
        TRY(sp_cuda_wmat_upload(cu, &c.m[i], &b->qm[i], &err));
    double s = time_reps(run_products, &c, reps);
    for (int i = 0; i < c.n; i++)
        sp_cuda_wmat_free(cu, &c.m[i]);
    sp_cuda_free(cu, c.x), sp_cuda_free(cu, c.y);
    return s;
}

/* b on the device with a cache of K positions filled by a prefill: a decode step's context (run_decode). */
static run_ctx decode_ctx(const sp_block *b, int K)
{
    run_ctx c = {.K = K};
    TRY(sp_cuda_block_upload(cu, &c.cb, b, &err));
    TRY(sp_cuda_kv_new(c.cb, &c.kv, 1, K + 1, NULL, &err));
    c.x = dev_randn((size_t)K * b->H, 1.0f);
    TRY(sp_cuda_alloc(cu, (void **)&c.y, (size_t)K * b->H * sizeof(float), &err));
    TRY(sp_cuda_block_forward(c.cb, c.y, c.x, 1, K, 0, c.kv, &err)); /* the cache's K positions */
    return c;
}

/* A decode step of c at fused+pdl after a process-wide setting changed (the kernels' tuning): one step at level 1
 * (another graph's level) and one at 2 capture the graph anew with it; then reps of them timed. */
static double time_recaptured(run_ctx *c, int reps)
{
    sp_cuda_block_use_fused(c->cb, 1);
    run_decode(c);
    sp_cuda_block_use_fused(c->cb, 2);
    run_decode(c);
    return time_reps(run_decode, c, reps);
}

/* Decode of one token at KV length K: steps/s and weight bytes/s over copy, for each sp_cuda_block_use_fused level
 * (the plain kernels first: the baseline of the same run). sweep 1: the products' shapes (rows a warp, warps a row,
 * W evicted first or not) and L2 asked for the next product's weights (sp_cuda_block_use_prefetch) too; 2: and the
 * attention's keys a warp. */
static void bench_decode(const char *name, const sp_block *b, int K, double copy_bw, int reps, int sweep)
{
    static const char *const level[] = {"plain", "fused", "fused+pdl"};
    run_ctx c = decode_ctx(b, K);
    double bytes = (double)sp_cuda_block_bytes(c.cb);
    for (int f = 0; f < 3; f++) {
        sp_cuda_block_use_fused(c.cb, f);
        run_decode(&c); /* plain the first time; the next is captured */
        double s = time_reps(run_decode, &c, reps);
        printf("%s %-4s decode %-9s (KV %d, graph %s): %7.1f us/step, %6.0f steps/s, %5.0f GB/s of weights, %.2f of "
               "copy\n",
               name, sp_wtype_name(b->wtype), level[f], K, sp_cuda_kv_graphed(c.kv) ? "yes" : "no", s * 1e6, 1 / s,
               bytes / s / 1e9, bytes / s / copy_bw);
    }
    if (b->wtype == SP_W_Q8 || b->wtype == SP_W_NF4) { /* fused+pdl, the products' values decoded as before */
        sp_cuda_wmat_tune_light(0);
        double s = time_recaptured(&c, reps);
        sp_cuda_wmat_tune_light(-1);
        printf("%s %-4s decode fused+pdl with all of a chunk's rows decoded first (sp_cuda_wmat_tune_light 0, the "
               "kernel before): %7.1f us/step, %.2f of copy\n", name, sp_wtype_name(b->wtype), s * 1e6,
               bytes / s / copy_bw);
    }
    for (int v = 0; sweep && v < 9 * 2; v++) { /* fused+pdl: rows a warp, warps a row, W evicted first from L2 */
        int R = 1 << (v / 3 % 3), ks = 1 << (v % 3), ef = v / 9;
        sp_cuda_wmat_tune(R, ks, 0);
        sp_cuda_wmat_tune_stream(ef);
        double s = time_recaptured(&c, reps);
        printf("%s %-4s   fused+pdl with R %d, ks %d, evict first %d: %7.1f us/step, %.2f of copy\n", name,
               sp_wtype_name(b->wtype), R, ks, ef, s * 1e6, bytes / s / copy_bw);
    }
    sp_cuda_wmat_tune(0, 0, 0);
    sp_cuda_wmat_tune_stream(-1);
    for (int keys = 4; sweep > 1 && keys <= 16; keys *= 2) { /* fused+pdl: the attention's keys a warp at once */
        sp_cuda_attn_tune(keys);
        double s = time_recaptured(&c, reps);
        printf("%s %-4s   fused+pdl with the attention's %d keys a warp: %7.1f us/step, %.2f of copy\n", name,
               sp_wtype_name(b->wtype), keys, s * 1e6, bytes / s / copy_bw);
    }
    sp_cuda_attn_tune(0);
    static const int mibs[] = {4, 8, 16, 32, 48};
    for (int i = 0; sweep && i < 5; i++) { /* fused+pdl: the norms and attention ask L2 for the next product's */
        sp_cuda_block_use_prefetch(c.cb, mibs[i]);
        double s = time_recaptured(&c, reps);
        printf("%s %-4s   fused+pdl with L2 asked for %2d MiB of each next product: %7.1f us/step, %.2f of copy\n",
               name, sp_wtype_name(b->wtype), mibs[i], s * 1e6, bytes / s / copy_bw);
    }
    sp_cuda_block_use_prefetch(c.cb, 0);
    sp_cuda_kv_free(c.kv);
    sp_cuda_free(cu, c.x), sp_cuda_free(cu, c.y);
    sp_cuda_block_free(c.cb);
    double sp = time_products(b, reps);
    printf("%s %-4s   of which its %d products alone (sp_cuda_wmat_mul, 1 row): %7.1f us, %.2f of copy\n", name,
           sp_wtype_name(b->wtype), b->nqm, sp * 1e6, bytes / sp / copy_bw);
}

/* The bytes a Mixtral decode step of one row reads: attention's four matrices, the router, and the top-k experts'
 * three matrices each (every expert's alike). */
static double moe_step_bytes(const sp_block *b)
{
    double bytes = (double)b->k.n_experts * b->H * sizeof(float);
    for (int i = 0; i < 4; i++)
        bytes += (double)sp_qmat_bytes(b->qm[i].type, b->qm[i].rows, b->qm[i].cols);
    for (int i = 4; i < 7; i++)
        bytes += (double)b->k.top_k * sp_qmat_bytes(b->qm[i].type, b->qm[i].rows, b->qm[i].cols);
    return bytes;
}

typedef struct {
    sp_cuda_moe *m;
    float *x, *y;
    void *acts;
} moe_ctx;

static void run_moe(void *p)
{
    moe_ctx *c = p;
    TRY(sp_cuda_moe_fwd(c->m, c->y, c->x, 1, c->acts, &err));
}

/* Mixtral's decode step of one row at KV length K: the experts' products one weight a lane (the baseline) and
 * vectorised, each with the plain kernels and fused+pdl; bytes read over copy. With experts_alone, the same for
 * sp_cuda_moe_fwd of one row alone (the router and the two experts' matrices). */
static void bench_moe_decode(const char *name, const sp_block *b, int K, double copy_bw, int reps, int experts_alone)
{
    static const char *const kernel[] = {"a lane", "vectorised"};
    run_ctx c = decode_ctx(b, K);
    double bytes = moe_step_bytes(b), s[2][2];
    for (int v = 0; v < 2; v++)
        for (int f = 0; f < 2; f++) {
            sp_cuda_block_use_moe_vec(c.cb, v);
            sp_cuda_block_use_fused(c.cb, 2 * f);
            run_decode(&c); /* captured anew for these settings */
            s[v][f] = time_reps(run_decode, &c, reps);
            printf("%s %-4s decode %-9s experts %-10s (KV %d, graph %s): %7.1f us/step, %5.0f GB/s read, %.2f of "
                   "copy\n",
                   name, sp_wtype_name(b->wtype), f ? "fused+pdl" : "plain", kernel[v], K,
                   sp_cuda_kv_graphed(c.kv) ? "yes" : "no", s[v][f] * 1e6, bytes / s[v][f] / 1e9,
                   bytes / s[v][f] / copy_bw);
        }
    printf("%s %-4s   vectorised experts: %.2fx the steps/s of a lane's (fused+pdl), %.2fx (plain); %.0f MB read a "
           "step\n",
           name, sp_wtype_name(b->wtype), s[0][1] / s[1][1], s[0][0] / s[1][0], bytes / 1e6);
    sp_cuda_kv_free(c.kv);
    sp_cuda_free(cu, c.x), sp_cuda_free(cu, c.y);
    sp_cuda_block_free(c.cb);
    if (!experts_alone)
        return;
    moe_ctx m = {0};
    TRY(sp_cuda_moe_upload(cu, &m.m, b, &err));
    sp_moe_dims d = sp_cuda_moe_dims(b);
    m.x = dev_randn((size_t)b->H, 1.0f);
    TRY(sp_cuda_alloc(cu, (void **)&m.y, (size_t)b->H * sizeof(float), &err));
    TRY(sp_cuda_alloc(cu, &m.acts, sp_cuda_moe_acts_bytes(&d, 1), &err));
    double eb = (double)b->k.n_experts * b->H * sizeof(float), se[2];
    for (int i = 4; i < 7; i++)
        eb += (double)b->k.top_k * sp_qmat_bytes(b->qm[i].type, b->qm[i].rows, b->qm[i].cols);
    for (int v = 0; v < 2; v++) {
        sp_cuda_moe_use_vec(m.m, v);
        se[v] = time_reps(run_moe, &m, reps);
        printf("%s %-4s   the experts alone (router, routing, %d experts), %-10s: %7.1f us, %.2f of copy\n", name,
               sp_wtype_name(b->wtype), b->k.top_k, kernel[v], se[v] * 1e6, eb / se[v] / copy_bw);
    }
    printf("%s %-4s   the experts alone: vectorised %.2fx a lane's\n", name, sp_wtype_name(b->wtype), se[0] / se[1]);
    sp_cuda_free(cu, m.x), sp_cuda_free(cu, m.y), sp_cuda_free(cu, m.acts);
    sp_cuda_moe_free(m.m);
}

/* The forward's products alone at T rows from bf16 inputs (sp_cuda_wmat_mul_h), for the breakdown. */
typedef struct {
    sp_cuda_wmat m[8];
    int n, T;
    void *xh;
    float *y;
} gemms_ctx;

static void run_gemms(void *p)
{
    gemms_ctx *c = p;
    for (int i = 0; i < c->n; i++)
        TRY(sp_cuda_wmat_mul_h(cu, &c->m[i], c->xh, c->y, c->T, &err));
}

static double time_gemms(const sp_block *b, int T, int reps)
{
    gemms_ctx c = {.n = b->nqm < 8 ? b->nqm : 8, .T = T};
    size_t widest = (size_t)(b->FF > b->H ? b->FF : b->H) * T;
    float *x = dev_randn(widest, 1.0f);
    TRY(sp_cuda_alloc(cu, &c.xh, widest * 2, &err));
    TRY(sp_cuda_f32_to(cu, c.xh, x, (long)widest, SP_CU_BF16, &err));
    TRY(sp_cuda_alloc(cu, (void **)&c.y, widest * sizeof(float), &err));
    for (int i = 0; i < c.n; i++)
        TRY(sp_cuda_wmat_upload(cu, &c.m[i], &b->qm[i], &err));
    double s = time_reps(run_gemms, &c, reps);
    for (int i = 0; i < c.n; i++)
        sp_cuda_wmat_free(cu, &c.m[i]);
    sp_cuda_free(cu, x), sp_cuda_free(cu, c.xh), sp_cuda_free(cu, c.y);
    return s;
}

/* Attention alone at T positions (no cache): the flash kernels, or the cuBLAS path with its probabilities. */
typedef struct {
    float *q, *k, *v, *out, *probs, *lse, *dq, *dk, *dv;
    int T, nh, nkv, hd, flash, bwd;
} attn_ctx;

static void run_attn(void *p)
{
    attn_ctx *a = p;
    if (a->flash && !a->bwd)
        TRY(sp_cuda_flash_fwd(cu, a->out, NULL, a->lse, a->q, a->k, a->v, NULL, 1, a->T, 0, a->nh, a->nkv, a->hd, a->T,
                              &err));
    else if (a->flash)
        TRY(sp_cuda_flash_bwd(cu, a->dq, a->dk, a->dv, a->out, a->out, a->lse, a->q, a->k, a->v, NULL, 1, a->T, 0,
                              a->nh, a->nkv, a->hd, a->T, 0, &err)); /* written, as the block's backward does */
    else if (!a->bwd)
        TRY(sp_cuda_attn_prefill(cu, a->out, a->probs, a->q, a->k, a->v, NULL, 1, a->T, 0, a->nh, a->nkv, a->hd, a->T,
                                 &err));
    else
        TRY(sp_cuda_attn_backward(cu, a->dq, a->dk, a->dv, a->out, a->probs, a->q, a->k, a->v, 1, a->T, 0, a->nh,
                                  a->nkv, a->hd, a->T, &err));
}

/* Seconds of the attention forward [0] and backward [1], flash or not. */
static void time_attn(const sp_block *b, int T, int flash, int reps, double s[2])
{
    size_t nq = (size_t)T * b->nh * b->hd, nk = (size_t)T * b->nkv * b->hd;
    attn_ctx a = {.T = T, .nh = b->nh, .nkv = b->nkv, .hd = b->hd, .flash = flash};
    a.q = dev_randn(nq, 1.0f), a.k = dev_randn(nk, 1.0f), a.v = dev_randn(nk, 1.0f), a.out = dev_randn(nq, 1.0f);
    a.dq = dev_randn(nq, 1.0f), a.dk = dev_randn(nk, 1.0f), a.dv = dev_randn(nk, 1.0f);
    TRY(sp_cuda_alloc(cu, (void **)&a.lse, (size_t)b->nh * T * sizeof(float), &err));
    TRY(sp_cuda_alloc(cu, (void **)&a.probs, flash ? 4 : (size_t)b->nh * T * T * sizeof(float), &err));
    run_attn(&a); /* lse / probs for the backward */
    s[0] = time_reps(run_attn, &a, reps);
    a.bwd = 1;
    s[1] = time_reps(run_attn, &a, reps);
    float *bufs[] = {a.q, a.k, a.v, a.out, a.dq, a.dk, a.dv, a.lse, a.probs};
    for (int i = 0; i < 9; i++)
        sp_cuda_free(cu, bufs[i]);
}

/* 1024-token forward and forward + backward: FLOP/s over the GEMM peak, tokens/s; flash attention and the fused
 * bf16 path (the default), then the cuBLAS attention and f32 element-wise kernels (flash off) in the same run; and
 * where the forward's time goes: its products alone (from bf16 inputs) and its attention alone. */
static void bench_forward(const char *name, const sp_block *b, int T, int reps)
{
    double peak = gemm_peak(T, b->H, b->FF);
    printf("%s %-4s bf16 GEMM peak [%d x %d x %d]: %.0f TFLOP/s\n", name, sp_wtype_name(b->wtype), T, b->H, b->FF,
           peak / 1e12);
    for (int flash = 1; flash >= 0; flash--)
        bench_forward_path(name, b, T, reps, peak, flash);
    double attn = 4.0 * T * (double)T * b->hd * b->nh / 2, sg = time_gemms(b, T, reps), sa[2], so[2];
    time_attn(b, T, 1, reps, sa);
    time_attn(b, T, 0, reps, so);
    printf("%s %-4s   its products alone (bf16 inputs): %.3f ms, %.2f of the GEMM peak\n", name,
           sp_wtype_name(b->wtype), sg * 1e3, (2.0 * T * (double)mats_params(b)) / sg / peak);
    printf("%s %-4s   attention alone, flash: forward %.3f ms (%.0f TFLOP/s), backward %.3f ms (%.0f TFLOP/s); "
           "cuBLAS path: forward %.3f ms, backward %.3f ms\n",
           name, sp_wtype_name(b->wtype), sa[0] * 1e3, attn / sa[0] / 1e12, sa[1] * 1e3, 2.5 * attn / sa[1] / 1e12,
           so[0] * 1e3, so[1] * 1e3);
    /* the flash backward at each mask (flash.h: 0 plain, +1 the dk / dv kernel's query tiles streamed, +2 the dq
     * kernel's key tiles, +4 dq from the stored dS tiles (+2 then has no effect)); the default's figure is the line
     * above */
    printf("%s %-4s   flash backward by mask (default %d):", name, sp_wtype_name(b->wtype), sp_cuda_flash_pipeline());
    for (int mask = 0; mask < 8; mask++) {
        double sp[2];
        sp_cuda_flash_set_pipeline(mask);
        time_attn(b, T, 1, reps, sp);
        printf(" %d: %.3f ms (%.0f TFLOP/s)%s", mask, sp[1] * 1e3, 2.5 * attn / sp[1] / 1e12, mask < 7 ? "," : "\n");
    }
    sp_cuda_flash_set_pipeline(-1);
}

/* One path's forward and forward + backward (flash: sp_cuda_block_use_flash). */
static void bench_forward_path(const char *name, const sp_block *b, int T, int reps, double peak, int flash)
{
    run_ctx c = {.T = T};
    TRY(sp_cuda_block_upload(cu, &c.cb, b, &err));
    sp_cuda_block_use_flash(c.cb, flash);
    size_t n = (size_t)T * b->H;
    c.x = dev_randn(n, 1.0f);
    TRY(sp_cuda_alloc(cu, (void **)&c.y, n * sizeof(float), &err));
    TRY(sp_cuda_alloc(cu, (void **)&c.d, n * sizeof(float), &err));
    double params = mats_params(b);
    double attn = 4.0 * T * (double)T * b->hd * b->nh / 2; /* causal: half the scores */
    double fwd = 2.0 * params * T + attn, both = 2 * (2.0 * params * T) + 3 * attn;
    double sf = time_reps(run_forward, &c, reps), sb = time_reps(run_fwd_bwd, &c, reps);
    const char *path = flash ? "flash" : "cuBLAS attention";
    printf("%s %-4s forward %d tokens (%s): %8.2f ms, %8.0f tok/s, %6.1f TFLOP/s, %.2f of the GEMM peak\n", name,
           sp_wtype_name(b->wtype), T, path, sf * 1e3, T / sf, fwd / sf / 1e12, fwd / sf / peak);
    printf("%s %-4s forward+backward %d tokens (%s): %8.2f ms, %6.1f TFLOP/s, %.2f of the GEMM peak\n", name,
           sp_wtype_name(b->wtype), T, path, sb * 1e3, both / sb / 1e12, both / sb / peak);
    sp_cuda_acts_free(c.cb, &c.acts);
    sp_cuda_free(cu, c.x), sp_cuda_free(cu, c.y), sp_cuda_free(cu, c.d);
    sp_cuda_block_free(c.cb);
}

static const char kMixtral[] = /* Mixtral-8x7B's shapes */
    "{\"model_type\":\"mixtral\",\"hidden_size\":4096,\"intermediate_size\":14336,\"num_attention_heads\":32,"
    "\"num_key_value_heads\":8,\"num_local_experts\":8,\"num_experts_per_tok\":2,\"num_hidden_layers\":1,"
    "\"vocab_size\":32000,\"rms_norm_eps\":1e-5,\"max_position_embeddings\":4096}";

/* --profile: each kind of work once more after a warm run, between the CUDA profiler's start and stop (so that
 * ncu --profile-from-start off sees only those launches, once each): the 7B block's decode step at KV 128 in bf16,
 * int8, NF4 and fp16 (the default fused kernels, graphs off: each kernel a launch of its own), then its bf16 forward
 * + backward of 1024 tokens (the default flash backward mask); a Mixtral-8x7B decode step in bf16 (its experts'
 * vectorised products). */
static void profile(void)
{
    sp_wtype types[] = {SP_W_BF16, SP_W_Q8, SP_W_NF4, SP_W_F16, SP_W_BF16};
    for (int t = 0; t < 5; t++) {
        sp_block b;
        sp_config cfg;
        sp_rope rope;
        if (t < 4)
            make_block(&b, &cfg, &rope, 4096, 11008, 32, 32, types[t]);
        else
            make_block_json(&b, &cfg, &rope, kMixtral, types[t]);
        run_ctx c = {.K = 128, .T = 1024};
        TRY(sp_cuda_block_upload(cu, &c.cb, &b, &err));
        sp_cuda_block_use_graphs(c.cb, 0);
        TRY(sp_cuda_kv_new(c.cb, &c.kv, 1, c.K + 1, NULL, &err));
        size_t n = (size_t)c.T * b.H;
        c.x = dev_randn(n, 1.0f);
        TRY(sp_cuda_alloc(cu, (void **)&c.y, n * sizeof(float), &err));
        TRY(sp_cuda_alloc(cu, (void **)&c.d, n * sizeof(float), &err));
        TRY(sp_cuda_block_forward(c.cb, c.y, c.x, 1, c.K, 0, c.kv, &err));
        run_decode(&c);
        if (t == 0)
            run_fwd_bwd(&c);
        TRY(sp_cuda_sync(cu, &err));
        printf("profile: %s %s decode step%s\n", t < 4 ? "7B" : "Mixtral-8x7B", sp_wtype_name(b.wtype),
               t == 0 ? ", forward + backward" : "");
        sp_cuda_profile(1);
        run_decode(&c);
        if (t == 0)
            run_fwd_bwd(&c);
        TRY(sp_cuda_sync(cu, &err));
        sp_cuda_profile(0);
        sp_cuda_acts_free(c.cb, &c.acts);
        sp_cuda_kv_free(c.kv);
        sp_cuda_free(cu, c.x), sp_cuda_free(cu, c.y), sp_cuda_free(cu, c.d);
        sp_cuda_block_free(c.cb);
        sp_block_free(&b);
    }
}

int main(int argc, char **argv)
{
    int quick = argc > 1 && strcmp(argv[1], "--quick") == 0, prof = argc > 1 && strcmp(argv[1], "--profile") == 0;
    setvbuf(stdout, NULL, _IOLBF, 0); /* a run cut short by a timeout keeps what it printed */
    char why[256];
    if (sp_cuda_device_count(why, sizeof why) <= 0) {
        printf("bench_block_cuda: no usable GPU (%s)\n", why);
        return 0;
    }
    TRY(sp_cuda_open(&cu, 0, &err));
    printf("device: %s\n", sp_cuda_name(cu));
    if (prof) {
        profile();
        sp_cuda_close(cu);
        return 0;
    }
    double copy_bw = sp_bench_cuda_copy_bw(cu, "bench_block_cuda");
    printf("device-to-device copy: %.0f GB/s (read + written)\n", copy_bw / 1e9);
    struct {
        const char *name;
        int H, FF, nh, nkv;
    } shapes[] = {{"llama-2-7b", 4096, 11008, 32, 32}, {"llama-2-70b", 8192, 28672, 64, 8}};
    for (int s = 0; s < (quick ? 1 : 2); s++) {
        sp_wtype types[] = {SP_W_BF16, SP_W_Q8, SP_W_NF4, SP_W_F16};
        for (int t = 0; t < (s == 0 ? 4 : 1); t++) {
            sp_block b;
            sp_config cfg;
            sp_rope rope;
            make_block(&b, &cfg, &rope, shapes[s].H, shapes[s].FF, shapes[s].nh, shapes[s].nkv, types[t]);
            /* the shapes swept for bf16 at both sizes, for int8 and NF4 at 7B (what their products want is not
             * known: their one-row products ran at 0.56 and 0.27 of copy on the H200 with bf16's shape) */
            int sweep = quick ? 0 : t == 0 ? 2 : t < 3 ? 1 : 0;
            bench_decode(shapes[s].name, &b, 128, copy_bw, quick ? 20 : 100, sweep);
            if (t == 0)
                bench_forward(shapes[s].name, &b, 1024, quick ? 2 : 5);
            sp_block_free(&b);
        }
    }
    sp_wtype moe_types[] = {SP_W_BF16, SP_W_Q8, SP_W_NF4};
    for (int t = 0; t < (quick ? 1 : 3); t++) {
        sp_block b;
        sp_config cfg;
        sp_rope rope;
        make_block_json(&b, &cfg, &rope, kMixtral, moe_types[t]);
        bench_moe_decode("mixtral-8x7b", &b, 128, copy_bw, quick ? 20 : 100, t == 0);
        sp_block_free(&b);
    }
    sp_cuda_close(cu);
    return 0;
}
