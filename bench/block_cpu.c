/* block_cpu.c - CPU throughput of one transformer block of each family, at realistic shapes with random
 * weights, against baselines measured in the same run.
 *
 * 1. decode: one token over a KV cache of K positions. Decode streams every weight it uses and the cache once,
 *    so the yardstick is a plain multithreaded memory READ of as many bytes: all of a dense block's weights (for
 *    a MoE block, the attention, the router and the top-k experts the token actually goes through) and the K
 *    cached positions' keys and values (--kv K, default 128: 4 MB at Llama-2-7B's shape; at 4000, 131 MB).
 * 2. forward: T tokens, no cache. The yardstick is cblas_sgemm on the block's projection shapes (for a MoE
 *    block, each expert's GEMMs on T * top_k / experts rows, what an even routing gives), i.e. what the block
 *    would take if everything but its GEMMs were free.
 *
 * Families (--family, default llama; `all` runs each in turn and prints a table):
 *   llama     Llama-2-7B      H 4096, FF 11008, 32 heads (MHA), RMSNorm, RoPE, SwiGLU
 *   bloom     BLOOM-7b1       H 4096, 32 heads, ALiBi, fused QKV, LayerNorm, GELU (tanh), biases
 *   falcon    Falcon-40B      H 8192, 128 heads on 8 KV heads, parallel attention + MLP, 2 LayerNorms, GELU
 *   falcon7b  Falcon-7B       H 4544, 71 heads on 1 KV head (multi-query), 1 LayerNorm, FF 18176
 *   mixtral   Mixtral-8x7B    H 4096, 32 heads on 8 KV heads, 8 SwiGLU experts of FF 14336, top-2
 * The block is built from a config.json text, through the same family parsing as a real checkpoint.
 *
 * --dtype bf16|fp16|int8|nf4 adds a third part: after the f32 figures, the same block re-encoded as a server
 * holds it (sp_block_quantize) decodes again, against a read of as many bytes as its encoded weights take,
 * and against the f32 decode of the same run (tokens/s; goal for int8 >= 3x).
 *
 * --idle-ms MS adds to each decode figure the same step taken after MS ms asleep (as a swarm server's blocks run:
 * a step, then idle while the other servers and the links take theirs), against a step right after another, in
 * pairs: whether a machine runs a burst after idling slower than a loop (caches, TLB, the host's scheduling of an
 * idle vCPU), which no change to the blocks can help.
 *
 * Block and baseline reps alternate (A B A B ...) so that drift on a noisy shared VM (another build,
 * frequency changes) hits both sides alike and the ratios stay meaningful. */
#include <cblas.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "blastune.h"
#include "block.h"
#include "config.h"
#include "kern.h"
#include "rng.h"
#include "rope.h"
#include "timeutil.h"

typedef struct opts {
    int threads; /* 0: keep OpenBLAS's default */
    int H, FF, nh, nkv, experts, T, K;
    int reps_decode, reps_forward;
    int idle_ms; /* --idle-ms: also decode after this long asleep, against back to back */
    const char *family;
    sp_wtype dtype; /* SP_W_F32: no encoded part */
} opts;

/* A family at a realistic shape: its config.json, the family's fields plus the shape's under the family's
 * names (NULL: the family has no such field). */
typedef struct preset {
    const char *name, *model, *json;
    const char *k_ff, *k_nh, *k_nkv, *k_experts;
    int H, FF, nh, nkv, experts;
} preset;

static const preset presets[] = {
    {"llama", "Llama-2-7B", "\"model_type\":\"llama\",\"rms_norm_eps\":1e-5,\"max_position_embeddings\":4096",
     "intermediate_size", "num_attention_heads", "num_key_value_heads", NULL, 4096, 11008, 32, 32, 0},
    {"bloom", "BLOOM-7b1", "\"model_type\":\"bloom\",\"layer_norm_epsilon\":1e-5", NULL, "n_head", NULL, NULL,
     4096, 16384, 32, 32, 0},
    {"falcon", "Falcon-40B",
     "\"model_type\":\"falcon\",\"new_decoder_architecture\":true,\"parallel_attn\":true,\"bias\":false",
     "ffn_hidden_size", "num_attention_heads", "num_kv_heads", NULL, 8192, 32768, 128, 8, 0},
    {"falcon7b", "Falcon-7B", "\"model_type\":\"falcon\",\"multi_query\":true,\"parallel_attn\":true,\"bias\":false",
     "ffn_hidden_size", "num_attention_heads", NULL, NULL, 4544, 18176, 71, 1, 0},
    {"mixtral", "Mixtral-8x7B",
     "\"model_type\":\"mixtral\",\"num_experts_per_tok\":2,\"rms_norm_eps\":1e-5,"
     "\"max_position_embeddings\":32768,\"rope_theta\":1e6",
     "intermediate_size", "num_attention_heads", "num_key_value_heads", "num_local_experts", 4096, 14336, 32, 8, 8},
};
#define NPRESETS ((int)(sizeof presets / sizeof *presets))

/* Everything the timed functions need; one instance lives in main. */
typedef struct bench {
    opts o;
    const preset *pre;
    sp_config cfg;
    int nthreads;
    sp_block b;
    sp_rope rope;
    sp_ws ws;
    sp_kv_cache kv;
    float *x, *y;         /* block input/output, [T, H] */
    float *ga, *gc;       /* sgemm baseline operands: A [T, max in], C [T, max out] */
    size_t decode_bytes;  /* weight bytes one decode step reads (a MoE block: the experts it uses) */
    const void *rd;       /* what the read baseline reads: the block's f32 weights, or rdbuf */
    void *rdbuf;          /* as many bytes as the encoded weights a decode step reads */
    int kv_ready;
    uint64_t sink;        /* read-baseline sums, kept so the reads cannot be optimised away */
    sp_err err;
} bench;

typedef int (*timed_fn)(bench *c, double *secs);

/* Figures of one family, for the table `--family all` prints. */
typedef struct result {
    const preset *pre;
    double mb, decode_ms, decode_gbs, read_gbs, decode_ratio, fwd_s, fwd_gflops, sgemm_gflops, fwd_ratio;
    double q_mb, q_ms, q_ratio, q_speedup; /* --dtype: encoded MB, decode ms, / its read, f32 ms / its ms */
} result;

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
    static const char *names[] = {"--threads", "--hidden", "--ff",   "--heads",       "--kv-heads",
                                  "--experts", "--tokens", "--kv",   "--reps-decode", "--reps-forward", "--idle-ms"};
    int *slots[] = {&o->threads, &o->H, &o->FF, &o->nh, &o->nkv, &o->experts, &o->T, &o->K, &o->reps_decode,
                    &o->reps_forward, &o->idle_ms};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strcmp(name, names[i]) == 0)
            return slots[i];
    return NULL;
}

static void usage(const char *argv0, const char *bad)
{
    fprintf(stderr, "usage: %s [--family llama|bloom|falcon|falcon7b|mixtral|all] [--dtype bf16|fp16|int8|nf4]\n"
                    "       [--threads N] [--hidden H]\n"
                    "       [--ff F] [--heads N] [--kv-heads N] [--experts E] [--tokens T] [--kv K]\n"
                    "       [--reps-decode N] [--reps-forward N] [--idle-ms MS]   (bad or missing: %s)\n",
            argv0, bad);
}

static int parse_args(int argc, char **argv, opts *o)
{
    *o = (opts){.T = 1024, .K = 128, .reps_decode = 20, .reps_forward = 3, .family = "llama"};
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 < argc && strcmp(argv[i], "--family") == 0) {
            o->family = argv[i + 1];
            continue;
        }
        if (i + 1 < argc && strcmp(argv[i], "--dtype") == 0) {
            if (sp_wtype_parse(argv[i + 1], &o->dtype)) {
                usage(argv[0], argv[i + 1]);
                return -1;
            }
            continue;
        }
        int *slot = opt_slot(o, argv[i]);
        if (!slot || i + 1 >= argc || parse_int(argv[i + 1], slot)) {
            usage(argv[0], argv[i]);
            return -1;
        }
    }
    int known = strcmp(o->family, "all") == 0;
    for (int i = 0; i < NPRESETS; i++)
        known |= strcmp(o->family, presets[i].name) == 0;
    if (!known) {
        usage(argv[0], o->family);
        return -1;
    }
    return 0;
}

/* The family's config at its preset shape, with the shape options given on top. */
static int make_config(bench *c)
{
    const preset *p = c->pre;
    int v[4] = {c->o.FF ? c->o.FF : p->FF, c->o.nh ? c->o.nh : p->nh, c->o.nkv ? c->o.nkv : p->nkv,
                c->o.experts ? c->o.experts : p->experts};
    const char *k[4] = {p->k_ff, p->k_nh, p->k_nkv, p->k_experts};
    char json[1024];
    int n = snprintf(json, sizeof json, "{%s,\"hidden_size\":%d,\"num_hidden_layers\":1,\"vocab_size\":32000",
                     p->json, c->o.H ? c->o.H : p->H);
    for (int i = 0; i < 4; i++)
        if (k[i])
            n += snprintf(json + n, sizeof json - (size_t)n, ",\"%s\":%d", k[i], v[i]);
    snprintf(json + n, sizeof json - (size_t)n, "}");
    return sp_config_parse(&c->cfg, json, p->model, &c->err) ? -1 : 0;
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
    const uint64_t *p[3]; /* the weights, then the cache's keys and values */
    size_t n[3];
    uint64_t sum;
} read_job;

/* Integer adds (no FP latency chain) into 8 independent accumulators: the loop vectorises and the
 * only limit left is how fast memory delivers the bytes. */
static void *read_worker(void *arg)
{
    read_job *j = arg;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    for (int s = 0; s < 3; s++) {
        const uint64_t *p = j->p[s];
        size_t i = 0, n = j->n[s];
        for (; i + 8 <= n; i += 8) {
            a0 += p[i];
            a1 += p[i + 1];
            a2 += p[i + 2];
            a3 += p[i + 3];
            a4 += p[i + 4];
            a5 += p[i + 5];
            a6 += p[i + 6];
            a7 += p[i + 7];
        }
        for (; i < n; i++)
            a0 += p[i];
    }
    j->sum = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
    return NULL;
}

/* Bytes of the KV cache a decode step over K positions reads: keys and values, K positions each. */
static size_t kv_bytes(const bench *c) { return c->kv_ready ? (size_t)c->o.K * c->b.nkv * c->b.hd * sizeof(float) : 0; }

#define MAX_READ_THREADS 256

/* Reads decode_bytes of the block's own weight memory and the K positions of its KV cache (keys and values)
 * with nthreads threads (the caller takes slice 0, as the caller of a BLAS call does), like a decode step has
 * to. */
static int read_once(bench *c, double *secs)
{
    int nt = c->nthreads;
    const uint64_t *base[3] = {c->rd, (const uint64_t *)(const void *)c->kv.k, (const uint64_t *)(const void *)c->kv.v};
    size_t kvw = kv_bytes(c) / sizeof(uint64_t), words[3] = {c->decode_bytes / sizeof(uint64_t), kvw, kvw};
    read_job jobs[MAX_READ_THREADS];
    pthread_t tid[MAX_READ_THREADS];
    for (int k = 0; k < nt; k++) {
        jobs[k].sum = 0;
        for (int s = 0; s < 3; s++) {
            jobs[k].p[s] = base[s] ? base[s] + words[s] * k / nt : NULL;
            jobs[k].n[s] = base[s] ? words[s] * (k + 1) / nt - words[s] * k / nt : 0;
        }
    }
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
    if (c->kv_ready++)
        return 0; /* (the encoded block decodes over the f32 block's cache) */
    if (sp_kv_init(&c->kv, 1, c->o.K + 1, c->b.nkv, c->b.hd, &c->err))
        return -1;
    return sp_block_forward(&c->b, c->y, c->x, 1, c->o.K, 0, &c->kv, &c->ws, &c->err) ? -1 : 0;
}

/* --idle-ms: pairs of (asleep idle_ms, a step; a step right after it); the medians and their ratio. */
static int decode_idle(bench *c)
{
    int n = c->o.reps_decode;
    double *ta = malloc(2 * (size_t)n * sizeof(double)), *tb = ta ? ta + n : NULL;
    if (!ta)
        return -1;
    struct timespec ts = {.tv_sec = c->o.idle_ms / 1000, .tv_nsec = (long)(c->o.idle_ms % 1000) * 1000000L};
    for (int r = 0; r < n; r++) {
        nanosleep(&ts, NULL);
        if (decode_once(c, &ta[r]) || decode_once(c, &tb[r])) {
            free(ta);
            return -1;
        }
    }
    stats si = summarize(ta, n), sb = summarize(tb, n);
    free(ta);
    printf("decode after %d ms asleep: median %.2f ms, min %.2f; right after a step: median %.2f ms, min %.2f; "
           "ratio %.3f\n", c->o.idle_ms, si.med * 1e3, si.min * 1e3, sb.med * 1e3, sb.min * 1e3, si.med / sb.med);
    return 0;
}

static int run_decode(bench *c, result *res)
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
    double bytes = (double)c->decode_bytes + 2.0 * (double)kv_bytes(c);
    printf("decode (1 token over %d cached): block median %.2f ms, min %.2f ms; read %.1f MB (weights%s %.1f + KV "
           "cache %.1f) median %.2f ms, min %.2f ms\n",
           c->o.K, sb.med * 1e3, sb.min * 1e3, bytes / 1e6, c->cfg.blk.mlp == SP_MLP_MOE ? ", the experts used," : "",
           (double)c->decode_bytes / 1e6, 2.0 * (double)kv_bytes(c) / 1e6, sr.med * 1e3, sr.min * 1e3);
    printf("decode: %.2f ms/token, %.2f GB/s weights and cache; read baseline %.2f GB/s; ratio %.2f (goal >= 0.85)"
           " [best-of: %.2f]\n",
           sb.med * 1e3, bytes / sb.med / 1e9, bytes / sr.med / 1e9, sr.med / sb.med, sr.min / sb.min);
    if (c->o.idle_ms > 0 && decode_idle(c))
        return -1;
    res->decode_ms = sb.med * 1e3;
    res->decode_gbs = bytes / sb.med / 1e9;
    res->read_gbs = bytes / sr.med / 1e9;
    res->decode_ratio = sr.med / sb.med;
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

/* The block's projections as bare GEMMs C[rows, out] = A[rows, in] W[out, in]^T: q, k, v, o, then the MLP's
 * (each expert's on T * top_k / experts rows for a MoE block). Returns the count (at most max). */
typedef struct gemm {
    const float *W;
    int rows, in, out;
} gemm;

static int gemm_list(const sp_block *b, int T, gemm *g, int max)
{
    int H = b->H, Q = b->nh * b->hd, KV = b->nkv * b->hd, FF = b->FF, n = 0;
    gemm attn[4] = {{b->wq, T, H, Q}, {b->wk, T, H, KV}, {b->wv, T, H, KV}, {b->wo, T, Q, H}};
    for (int i = 0; i < 4 && n < max; i++)
        g[n++] = attn[i];
    int E = b->k.mlp == SP_MLP_MOE ? b->k.n_experts : 1, rows = b->k.mlp == SP_MLP_MOE ? T * b->k.top_k / E : T;
    for (int e = 0; e < E && n + 3 <= max; e++) {
        size_t o = (size_t)e * FF * H;
        if (b->w_gate)
            g[n++] = (gemm){b->w_gate + o, rows, H, FF};
        g[n++] = (gemm){b->w_up + o, rows, H, FF};
        g[n++] = (gemm){b->w_down + o, rows, FF, H};
    }
    return n;
}

#define MAX_GEMMS 64

static int sgemm_once(bench *c, double *secs)
{
    gemm g[MAX_GEMMS];
    int n = gemm_list(&c->b, c->o.T, g, MAX_GEMMS);
    double t0 = sp_now_s();
    for (int i = 0; i < n; i++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g[i].rows, g[i].out, g[i].in, 1.0f, c->ga, g[i].in,
                    g[i].W, g[i].in, 0.0f, c->gc, g[i].out);
    *secs = sp_now_s() - t0;
    return 0;
}

static double linear_flops(const sp_block *b, int T)
{
    gemm g[MAX_GEMMS];
    int n = gemm_list(b, T, g, MAX_GEMMS);
    double f = 0;
    for (int i = 0; i < n; i++)
        f += 2.0 * g[i].rows * (double)g[i].in * g[i].out;
    return f;
}

/* Causal: QK^T and PV each take 2 * hd flops per (head, query, visible key), ~T^2/2 pairs. */
static double attention_flops(const sp_block *b, int T)
{
    return 2.0 * 2.0 * b->nh * b->hd * (double)T * T / 2.0;
}

static void print_forward(const bench *c, stats sb, stats sg, result *res)
{
    double lin = linear_flops(&c->b, c->o.T), att = attention_flops(&c->b, c->o.T);
    printf("forward (%d tokens, no cache): block median %.4g s, min %.4g s; sgemm median %.4g s, min %.4g s; "
           "linear %.1f GFLOP, attention %.1f GFLOP\n",
           c->o.T, sb.med, sb.min, sg.med, sg.min, lin / 1e9, att / 1e9);
    printf("forward%d: %.4g s, %.1f GFLOP/s linear (%.1f with attention); sgemm baseline %.1f GFLOP/s; "
           "ratio %.2f (goal >= 0.80), with attention %.2f [best-of: %.2f]\n",
           c->o.T, sb.med, lin / sb.med / 1e9, (lin + att) / sb.med / 1e9, lin / sg.med / 1e9, sg.med / sb.med,
           (lin + att) / lin * sg.med / sb.med, sg.min / sb.min);
    res->fwd_s = sb.med;
    res->fwd_gflops = lin / sb.med / 1e9;
    res->sgemm_gflops = lin / sg.med / 1e9;
    res->fwd_ratio = sg.med / sb.med;
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

static int run_forward(bench *c, sp_rng *rng, result *res)
{
    if (alloc_gemm_operands(c, rng))
        return -1;
    int n = c->o.reps_forward;
    double *ta = malloc(2 * (size_t)n * sizeof(double)), *tb = ta ? ta + n : NULL;
    if (!ta || alternate(c, forward_once, sgemm_once, n, ta, tb)) {
        free(ta);
        return -1;
    }
    print_forward(c, summarize(ta, n), summarize(tb, n), res);
    free(ta);
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* setup */

/* Random N(0, 0.02) weights (biases and the router included); the norm gains are 1 and LayerNorm shifts 0 as
 * in a trained model's neighbourhood, so activations keep a realistic scale (no denormals skewing the
 * timing). */
static void fill_weights(sp_block *b, sp_rng *rng)
{
    sp_rng_fill_normal(rng, b->mem, (long)b->numel, 0.02f);
    for (int i = 0; i < b->H; i++) {
        b->ln1_w[i] = 1.0f;
        if (b->ln1_b)
            b->ln1_b[i] = 0.0f;
        if (b->ln2_w)
            b->ln2_w[i] = 1.0f;
        if (b->ln2_b)
            b->ln2_b[i] = 0.0f;
    }
}

static int setup(bench *c, sp_rng *rng)
{
    if (make_config(c))
        return -1;
    if ((c->cfg.blk.pos == SP_POS_ROPE && sp_rope_init(&c->rope, &c->cfg, &c->err)) ||
        sp_block_init(&c->b, &c->cfg, &c->rope, &c->err))
        return -1;
    fill_weights(&c->b, rng);
    /* a decode step reads every weight but the experts the token does not use; the read baseline reads as many
     * bytes (the first decode_bytes of the block's memory: which bytes does not matter to the bandwidth) */
    c->decode_bytes = (size_t)sp_config_block_active_params(&c->cfg) * sizeof(float);
    c->rd = c->b.mem;
    int T = c->o.T > c->o.K ? c->o.T : c->o.K, H = c->cfg.hidden;
    c->x = malloc((size_t)T * H * sizeof(float));
    c->y = malloc((size_t)T * H * sizeof(float));
    if (!c->x || !c->y) {
        snprintf(c->err.msg, sizeof c->err.msg, "out of memory: activations of %d x %d", T, H);
        return -1;
    }
    sp_rng_fill_normal(rng, c->x, (long)T * H, 1.0f);
    return 0;
}

static void teardown(bench *c)
{
    sp_block_free(&c->b);
    sp_kv_free(&c->kv);
    free(c->rdbuf);
    sp_ws_free(&c->ws);
    free(c->x);
    free(c->y);
    free(c->ga);
    free(c->gc);
    opts o = c->o;
    int nt = c->nthreads;
    memset(c, 0, sizeof *c);
    c->o = o;
    c->nthreads = nt;
}

/* The block re-encoded in o.dtype (its f32 matrices go), decoding over the same cache: against a read of as
 * many bytes as the encoded weights a step reads, and against the f32 decode measured before. */
static int run_encoded(bench *c, result *res)
{
    size_t f32_bytes = sp_block_bytes(&c->b);
    double t0 = sp_now_s();
    if (sp_block_quantize(&c->b, c->o.dtype, &c->err))
        return -1;
    double enc_s = sp_now_s() - t0;
    size_t q_bytes = sp_block_bytes(&c->b);
    /* a MoE step reads the encoded bytes of what it uses: the same share of the whole as in f32 */
    c->decode_bytes = (size_t)((double)c->decode_bytes * (double)q_bytes / (double)f32_bytes) & ~(size_t)7;
    c->rdbuf = malloc(c->decode_bytes + 8);
    if (!c->rdbuf)
        return -1;
    memset(c->rdbuf, 1, c->decode_bytes + 8);
    c->rd = c->rdbuf;
    const char *name = sp_wtype_name(c->o.dtype);
    printf("%s: the block re-encoded in %.1f s, %.1f MB (%.2f of f32)\n", name, enc_s, (double)q_bytes / 1e6,
           (double)q_bytes / (double)f32_bytes);
    result q = *res;
    if (run_decode(c, &q))
        return -1;
    res->q_mb = (double)q_bytes / 1e6;
    res->q_ms = q.decode_ms;
    res->q_ratio = q.decode_ratio;
    res->q_speedup = res->decode_ms / q.decode_ms;
    printf("%s decode: %.2f ms/token vs f32 %.2f ms/token: %.2fx the tokens/s%s\n", name, q.decode_ms,
           res->decode_ms, res->q_speedup, c->o.dtype == SP_W_Q8 ? " (goal >= 3)" : "");
    return 0;
}

/* One family: setup, decode, forward; its figures into res. */
static int run_family(bench *c, const preset *p, result *res)
{
    sp_rng rng;
    sp_rng_seed(&rng, 1234);
    c->pre = p;
    *res = (result){.pre = p};
    double t0 = sp_now_s();
    int rc = setup(c, &rng);
    if (!rc) {
        char attn[160];
        sp_config_attention_desc(&c->cfg, attn, sizeof attn);
        res->mb = (double)c->b.numel * 4 / 1e6;
        char kern[128];
        sp_kern_describe(kern, sizeof kern);
        printf("%s block (%s): hidden %d, ff %d%s, %s; %.1f MB f32 weights; %d threads; %s; setup %.1f s\n",
               p->model, p->name, c->cfg.hidden, c->cfg.intermediate, c->cfg.blk.mlp == SP_MLP_MOE ? " per expert" : "",
               attn, res->mb, c->nthreads, kern, sp_now_s() - t0);
        if (c->cfg.blk.mlp == SP_MLP_MOE)
            printf("experts: %d, %d per token: a decode step reads %.1f MB of the %.1f MB\n", c->cfg.blk.n_experts,
                   c->cfg.blk.top_k, (double)c->decode_bytes / 1e6, res->mb);
    }
    if (!rc)
        rc = run_decode(c, res);
    if (!rc)
        rc = run_forward(c, &rng, res);
    if (!rc && c->o.dtype != SP_W_F32)
        rc = run_encoded(c, res);
    if (rc)
        fprintf(stderr, "bench_block_cpu: %s: %s\n", p->name, c->err.msg[0] ? c->err.msg : "out of memory");
    teardown(c);
    return rc;
}

int main(int argc, char **argv)
{
    sp_blas_tune(argv); /* as the sepal program does: OpenBLAS's kernels for this CPU */
    static bench c; /* zeroed: teardown is safe whatever failed */
    if (parse_args(argc, argv, &c.o))
        return 2;
    if (sp_kern_check_env(&c.err)) {
        fprintf(stderr, "bench_block_cpu: %s\n", c.err.msg);
        return 2;
    }
    if (c.o.threads)
        openblas_set_num_threads(c.o.threads);
    c.nthreads = openblas_get_num_threads();
    if (c.nthreads < 1 || c.nthreads > MAX_READ_THREADS) {
        fprintf(stderr, "thread count %d out of range 1..%d\n", c.nthreads, MAX_READ_THREADS);
        return 2;
    }
    result res[NPRESETS];
    int n = 0, rc = 0;
    for (int i = 0; i < NPRESETS && !rc; i++) {
        if (strcmp(c.o.family, "all") && strcmp(c.o.family, presets[i].name))
            continue;
        if (n)
            printf("\n");
        rc = run_family(&c, &presets[i], &res[n++]);
    }
    if (!rc && n > 1) {
        printf("\n%-13s %9s %9s %9s %9s %7s %9s %9s %7s\n", "block", "MB", "decode", "GB/s", "read", "ratio",
               "fwd GF/s", "sgemm", "ratio");
        for (int i = 0; i < n; i++)
            printf("%-13s %9.0f %7.1fms %9.2f %9.2f %7.2f %9.1f %9.1f %7.2f\n", res[i].pre->model, res[i].mb,
                   res[i].decode_ms, res[i].decode_gbs, res[i].read_gbs, res[i].decode_ratio, res[i].fwd_gflops,
                   res[i].sgemm_gflops, res[i].fwd_ratio);
        if (c.o.dtype != SP_W_F32) {
            printf("\n%-13s %9s %9s %7s %9s\n", "block", sp_wtype_name(c.o.dtype), "decode", "ratio", "vs f32");
            for (int i = 0; i < n; i++)
                printf("%-13s %7.0fMB %7.1fms %7.2f %8.2fx\n", res[i].pre->model, res[i].q_mb, res[i].q_ms,
                       res[i].q_ratio, res[i].q_speedup);
        }
    }
    return rc ? 1 : 0;
}
