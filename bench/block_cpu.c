/* block_cpu.c - CPU throughput of one Llama block against baselines measured in the same run.
 *
 * 1. decode: one token over a KV cache of K positions. Decode streams every weight once, so the
 *    yardstick is a plain multithreaded memory READ over a buffer as large as the weights.
 * 2. forward: T tokens, no cache. The yardstick is cblas_sgemm on the block's seven projection
 *    shapes, i.e. what the block would take if everything but its GEMMs were free.
 *
 * Block and baseline reps alternate (A B A B ...) so that drift on a noisy shared VM (another build,
 * frequency changes) hits both sides alike and the ratios stay meaningful. */
#include <cblas.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block.h"
#include "config.h"
#include "rng.h"
#include "rope.h"
#include "timeutil.h"

typedef struct opts {
    int threads; /* 0: keep OpenBLAS's default */
    int H, FF, nh, T, K;
    int reps_decode, reps_forward;
} opts;

/* Everything the timed functions need; one instance lives in main. */
typedef struct bench {
    opts o;
    int nthreads;
    sp_block b;
    sp_rope rope;
    sp_ws ws;
    sp_kv_cache kv;
    float *x, *y;         /* block input/output, [T, H] */
    float *ga, *gc;       /* sgemm baseline operands: A [T, max in], C [T, max out] */
    uint64_t sink;        /* read-baseline sums, kept so the reads cannot be optimised away */
    sp_err err;
} bench;

typedef int (*timed_fn)(bench *c, double *secs);

/* ---------------------------------------------------------------------------------------------- */
/* options */

static int parse_int(const char *s, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v <= 0 || v > 1 << 20)
        return -1;
    *out = (int)v;
    return 0;
}

static int *opt_slot(opts *o, const char *name)
{
    static const char *names[] = {"--threads", "--hidden", "--ff",          "--heads",
                                  "--tokens",  "--kv",     "--reps-decode", "--reps-forward"};
    int *slots[] = {&o->threads, &o->H, &o->FF, &o->nh, &o->T, &o->K, &o->reps_decode, &o->reps_forward};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strcmp(name, names[i]) == 0)
            return slots[i];
    return NULL;
}

static int parse_args(int argc, char **argv, opts *o)
{
    *o = (opts){.threads = 0, .H = 4096, .FF = 11008, .nh = 32, .T = 1024, .K = 128,
                .reps_decode = 20, .reps_forward = 3};
    for (int i = 1; i < argc; i += 2) {
        int *slot = opt_slot(o, argv[i]);
        if (!slot || i + 1 >= argc || parse_int(argv[i + 1], slot)) {
            fprintf(stderr, "usage: %s [--threads N] [--hidden H] [--ff F] [--heads N] [--tokens T] [--kv K]\n"
                            "       [--reps-decode N] [--reps-forward N]   (bad or missing: %s)\n",
                    argv[0], argv[i]);
            return -1;
        }
    }
    if (o->H % o->nh || (o->H / o->nh) % 2 || o->H / o->nh / 2 > SP_ROPE_MAX_HALF) {
        fprintf(stderr, "hidden %d must split into %d heads of an even head_dim <= %d\n", o->H, o->nh,
                2 * SP_ROPE_MAX_HALF);
        return -1;
    }
    return 0;
}

/* A Llama-7B-shaped config (by default), filled by hand: no config.json needed. */
static void make_config(sp_config *cfg, const opts *o)
{
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->architecture, sizeof cfg->architecture, "LlamaForCausalLM");
    snprintf(cfg->model_type, sizeof cfg->model_type, "llama");
    snprintf(cfg->hidden_act, sizeof cfg->hidden_act, "silu");
    cfg->arch = SP_ARCH_LLAMA;
    cfg->hidden = o->H;
    cfg->intermediate = o->FF;
    cfg->n_layers = 1;
    cfg->n_heads = o->nh;
    cfg->n_kv_heads = o->nh;
    cfg->head_dim = o->H / o->nh;
    cfg->vocab = 32000;
    cfg->max_pos = 4096;
    cfg->norm_eps = 1e-5f;
    cfg->rope_theta = 10000.0;
    cfg->rope_type = SP_ROPE_DEFAULT;
    cfg->rope_factor = 1.0;
    cfg->bos_id = 1;
    cfg->eos_id = 2;
    cfg->dtype = SP_F32;
}

/* ---------------------------------------------------------------------------------------------- */
/* statistics */

typedef struct stats {
    double med, min;
} stats;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static stats summarize(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    stats s = {.min = v[0], .med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2])};
    return s;
}

/* One warm-up of each, then `reps` alternating pairs; ta/tb get the per-rep seconds. */
static int alternate(bench *c, timed_fn fa, timed_fn fb, int reps, double *ta, double *tb)
{
    double warm;
    if (fa(c, &warm) || fb(c, &warm))
        return -1;
    for (int r = 0; r < reps; r++)
        if (fa(c, &ta[r]) || fb(c, &tb[r]))
            return -1;
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* read-bandwidth baseline */

typedef struct read_job {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
} read_job;

/* Integer adds (no FP latency chain) into 8 independent accumulators: the loop vectorises and the
 * only limit left is how fast memory delivers the bytes. */
static void *read_worker(void *arg)
{
    read_job *j = arg;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    size_t i = 0;
    for (; i + 8 <= j->n; i += 8) {
        a0 += j->p[i];
        a1 += j->p[i + 1];
        a2 += j->p[i + 2];
        a3 += j->p[i + 3];
        a4 += j->p[i + 4];
        a5 += j->p[i + 5];
        a6 += j->p[i + 6];
        a7 += j->p[i + 7];
    }
    for (; i < j->n; i++)
        a0 += j->p[i];
    j->sum = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
    return NULL;
}

#define MAX_READ_THREADS 256

/* Reads the block's own weight memory with nthreads threads (the caller takes slice 0, as the
 * caller of a BLAS call does), like a decode step has to. */
static int read_once(bench *c, double *secs)
{
    int nt = c->nthreads;
    size_t words = c->b.numel * sizeof(float) / sizeof(uint64_t);
    read_job jobs[MAX_READ_THREADS];
    pthread_t tid[MAX_READ_THREADS];
    for (int k = 0; k < nt; k++)
        jobs[k] = (read_job){(const uint64_t *)c->b.mem + words * k / nt, words * (k + 1) / nt - words * k / nt, 0};
    double t0 = sp_now_s();
    int started = 1;
    for (; started < nt; started++)
        if (pthread_create(&tid[started], NULL, read_worker, &jobs[started]))
            break;
    read_worker(&jobs[0]);
    for (int k = 1; k < started; k++)
        pthread_join(tid[k], NULL);
    *secs = sp_now_s() - t0;
    if (started < nt) {
        snprintf(c->err.msg, sizeof c->err.msg, "read baseline: pthread_create failed");
        return -1;
    }
    for (int k = 0; k < nt; k++)
        c->sink += jobs[k].sum;
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* decode */

/* One new token at position K over a cache rolled back to K positions. */
static int decode_once(bench *c, double *secs)
{
    c->kv.len = c->o.K;
    double t0 = sp_now_s();
    sp_status s = sp_block_forward(&c->b, c->y, c->x, 1, 1, c->o.K, &c->kv, &c->ws, &c->err);
    *secs = sp_now_s() - t0;
    return s ? -1 : 0;
}

/* Fills the cache with K positions by one prefill forward, as a real session would. */
static int prefill_cache(bench *c)
{
    if (sp_kv_init(&c->kv, 1, c->o.K + 1, c->b.nkv, c->b.hd, &c->err))
        return -1;
    return sp_block_forward(&c->b, c->y, c->x, 1, c->o.K, 0, &c->kv, &c->ws, &c->err) ? -1 : 0;
}

static int run_decode(bench *c)
{
    if (prefill_cache(c))
        return -1;
    int n = c->o.reps_decode;
    double *ta = malloc(2 * (size_t)n * sizeof(double)), *tb = ta ? ta + n : NULL;
    if (!ta || alternate(c, decode_once, read_once, n, ta, tb)) {
        free(ta);
        return -1;
    }
    stats sb = summarize(ta, n), sr = summarize(tb, n);
    free(ta);
    double bytes = (double)c->b.numel * sizeof(float);
    printf("decode (1 token over %d cached): block median %.2f ms, min %.2f ms; read %.1f MB median %.2f ms, "
           "min %.2f ms\n",
           c->o.K, sb.med * 1e3, sb.min * 1e3, bytes / 1e6, sr.med * 1e3, sr.min * 1e3);
    printf("decode: %.2f ms/token, %.2f GB/s weights; read baseline %.2f GB/s; ratio %.2f (goal >= 0.75)"
           " [best-of: %.2f]\n",
           sb.med * 1e3, bytes / sb.med / 1e9, bytes / sr.med / 1e9, sr.med / sb.med, sr.min / sb.min);
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* forward */

static int forward_once(bench *c, double *secs)
{
    double t0 = sp_now_s();
    sp_status s = sp_block_forward(&c->b, c->y, c->x, 1, c->o.T, 0, NULL, &c->ws, &c->err);
    *secs = sp_now_s() - t0;
    return s ? -1 : 0;
}

/* The block's seven projections as bare GEMMs: C[T, out] = A[T, in] W[out, in]^T. */
static int sgemm_once(bench *c, double *secs)
{
    const sp_block *b = &c->b;
    int T = c->o.T, H = b->H, Q = b->nh * b->hd, KV = b->nkv * b->hd, FF = b->FF;
    const float *W[7] = {b->wq, b->wk, b->wv, b->wo, b->w_gate, b->w_up, b->w_down};
    int in[7] = {H, H, H, Q, H, H, FF}, out[7] = {Q, KV, KV, H, FF, FF, H};
    double t0 = sp_now_s();
    for (int i = 0; i < 7; i++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, out[i], in[i], 1.0f, c->ga, in[i], W[i], in[i],
                    0.0f, c->gc, out[i]);
    *secs = sp_now_s() - t0;
    return 0;
}

static double linear_flops(const sp_block *b, int T)
{
    double H = b->H, Q = (double)b->nh * b->hd, KV = (double)b->nkv * b->hd, FF = b->FF;
    return 2.0 * T * (H * Q + 2 * H * KV + Q * H + 3 * H * FF);
}

/* Causal: QK^T and PV each take 2 * hd flops per (head, query, visible key), ~T^2/2 pairs. */
static double attention_flops(const sp_block *b, int T)
{
    return 2.0 * 2.0 * b->nh * b->hd * (double)T * T / 2.0;
}

static void print_forward(const bench *c, stats sb, stats sg)
{
    double lin = linear_flops(&c->b, c->o.T), att = attention_flops(&c->b, c->o.T);
    printf("forward (%d tokens, no cache): block median %.4g s, min %.4g s; sgemm x7 median %.4g s, min %.4g s; "
           "linear %.1f GFLOP, attention %.1f GFLOP\n",
           c->o.T, sb.med, sb.min, sg.med, sg.min, lin / 1e9, att / 1e9);
    printf("forward%d: %.4g s, %.1f GFLOP/s linear (%.1f with attention); sgemm baseline %.1f GFLOP/s; "
           "ratio %.2f (goal >= 0.70), with attention %.2f [best-of: %.2f]\n",
           c->o.T, sb.med, lin / sb.med / 1e9, (lin + att) / sb.med / 1e9, lin / sg.med / 1e9, sg.med / sb.med,
           (lin + att) / lin * sg.med / sb.med, sg.min / sb.min);
}

static int alloc_gemm_operands(bench *c, sp_rng *rng)
{
    const sp_block *b = &c->b;
    size_t T = (size_t)c->o.T, Q = (size_t)b->nh * b->hd, FF = (size_t)b->FF, H = (size_t)b->H;
    size_t wide = FF > Q ? FF : Q;
    wide = wide > H ? wide : H;
    c->ga = malloc(T * wide * sizeof(float));
    c->gc = malloc(T * wide * sizeof(float));
    if (!c->ga || !c->gc) {
        snprintf(c->err.msg, sizeof c->err.msg, "out of memory: sgemm operands of %zu floats", 2 * T * wide);
        return -1;
    }
    sp_rng_fill_normal(rng, c->ga, (long)(T * wide), 1.0f);
    return 0;
}

static int run_forward(bench *c, sp_rng *rng)
{
    if (alloc_gemm_operands(c, rng))
        return -1;
    int n = c->o.reps_forward;
    double *ta = malloc(2 * (size_t)n * sizeof(double)), *tb = ta ? ta + n : NULL;
    if (!ta || alternate(c, forward_once, sgemm_once, n, ta, tb)) {
        free(ta);
        return -1;
    }
    print_forward(c, summarize(ta, n), summarize(tb, n));
    free(ta);
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* setup */

/* Random N(0, 0.02) projections; the RMSNorm gains are 1 as in a trained model's neighbourhood, so
 * activations keep a realistic scale (no denormals skewing the timing). */
static void fill_weights(sp_block *b, sp_rng *rng)
{
    sp_rng_fill_normal(rng, b->mem, (long)b->numel, 0.02f);
    for (int i = 0; i < b->H; i++)
        b->ln1_w[i] = b->ln2_w[i] = 1.0f;
}

static int setup(bench *c, sp_rng *rng)
{
    sp_config cfg;
    make_config(&cfg, &c->o);
    if (sp_rope_init(&c->rope, &cfg, &c->err) || sp_block_init(&c->b, &cfg, &c->rope, &c->err))
        return -1;
    fill_weights(&c->b, rng);
    int T = c->o.T > c->o.K ? c->o.T : c->o.K;
    c->x = malloc((size_t)T * c->o.H * sizeof(float));
    c->y = malloc((size_t)T * c->o.H * sizeof(float));
    if (!c->x || !c->y) {
        snprintf(c->err.msg, sizeof c->err.msg, "out of memory: activations of %d x %d", T, c->o.H);
        return -1;
    }
    sp_rng_fill_normal(rng, c->x, (long)T * c->o.H, 1.0f);
    return 0;
}

static void teardown(bench *c)
{
    sp_block_free(&c->b);
    sp_kv_free(&c->kv);
    sp_ws_free(&c->ws);
    free(c->x);
    free(c->y);
    free(c->ga);
    free(c->gc);
}

int main(int argc, char **argv)
{
    static bench c; /* zeroed: teardown is safe whatever failed */
    if (parse_args(argc, argv, &c.o))
        return 2;
    if (c.o.threads)
        openblas_set_num_threads(c.o.threads);
    c.nthreads = openblas_get_num_threads();
    if (c.nthreads < 1 || c.nthreads > MAX_READ_THREADS) {
        fprintf(stderr, "thread count %d out of range 1..%d\n", c.nthreads, MAX_READ_THREADS);
        return 2;
    }
    sp_rng rng;
    sp_rng_seed(&rng, 1234);
    double t0 = sp_now_s();
    int rc = setup(&c, &rng);
    if (!rc)
        printf("block: hidden %d, ff %d, heads %d x %d, %.1f MB f32 weights; %d threads; setup %.1f s\n", c.o.H,
               c.o.FF, c.o.nh, c.b.hd, (double)c.b.numel * 4 / 1e6, c.nthreads, sp_now_s() - t0);
    if (!rc)
        rc = run_decode(&c);
    if (!rc)
        rc = run_forward(&c, &rng);
    if (rc)
        fprintf(stderr, "bench_block_cpu: %s\n", c.err.msg[0] ? c.err.msg : "out of memory");
    teardown(&c);
    return rc ? 1 : 0;
}
