/* pass.c - the compute floor of a server's batched decode pass (bench/serve's goal, without the network): blocks
 * of Llama-2-7B's shape (random weights) in int8, as `sepal-server --dtype int8` holds them, and one pass of n
 * sessions' decode steps over them (sp_block_decode_batch: 1 row each, its KV cache of --kv positions), for each
 * n of --sessions. Per n: the pass's wall time (the best of --reps) and its CPU time (the process's, per pass and
 * per token: what a token costs whatever else runs on the machine), and ratios against n = 1 of the same run:
 * tokens/s, and CPU per token. On C cores, a pass of n rows takes at least its CPU time / C: that bounds what n
 * sessions can get over one, whatever the server around the blocks does.
 *
 * usage: bench_pass [--blocks N] [--sessions 1,2,4,8,16] [--reps N] [--kv K] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "block.h"
#include "config.h"
#include "rng.h"
#include "rope.h"
#include "timeutil.h"

#define MAXN 8
#define MAXS 256

typedef struct opts {
    int blocks, sessions[MAXN], nsessions, reps, kv;
} opts;

static const char *const LLAMA7B = "{\"model_type\":\"llama\",\"rms_norm_eps\":1e-5,\"max_position_embeddings\":4096,"
                                   "\"hidden_size\":4096,\"num_hidden_layers\":1,\"vocab_size\":32000,"
                                   "\"intermediate_size\":11008,\"num_attention_heads\":32,\"num_key_value_heads\":32}";

static double cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int parse(int argc, char **argv, opts *o)
{
    *o = (opts){.blocks = 4, .sessions = {1, 2, 4, 8, 16}, .nsessions = 5, .reps = 10, .kv = 32};
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--blocks"))
            o->blocks = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps"))
            o->reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--kv"))
            o->kv = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--sessions")) {
            o->nsessions = 0;
            for (char *p = argv[i + 1], *e = p; *p && o->nsessions < MAXN; p = *e ? e + 1 : e)
                o->sessions[o->nsessions++] = (int)strtol(p, &e, 10);
        } else
            return -1;
    }
    for (int k = 0; k < o->nsessions; k++)
        if (o->sessions[k] < 1 || o->sessions[k] > MAXS)
            return -1;
    return argc % 2 == 1 && o->blocks >= 1 && o->reps >= 1 && o->kv >= 1 ? 0 : -1;
}

/* Block i of Llama-2-7B's shape, N(0, 0.02) weights, norm gains 1, in int8. */
static int make_block(sp_block *b, const sp_config *cfg, const sp_rope *rope, sp_rng *rng, sp_err *err)
{
    if (sp_block_init(b, cfg, rope, err))
        return -1;
    sp_rng_fill_normal(rng, b->mem, (long)b->numel, 0.02f);
    for (int c = 0; c < b->H; c++)
        b->ln1_w[c] = b->ln2_w[c] = 1.0f;
    return sp_block_quantize(b, SP_W_Q8, err) ? -1 : 0;
}

/* reps passes of n sessions over the blocks: the best wall time and the mean CPU time of a pass (seconds). */
static int measure(sp_block *blk, const opts *o, int n, float *x, float *y, double *wall, double *cpu, sp_err *err)
{
    sp_kv_cache *kv = calloc((size_t)o->blocks * n, sizeof *kv), *kvp[MAXS];
    int rows[MAXS], rc = kv ? 0 : -1;
    for (int i = 0; !rc && i < o->blocks * n; i++)
        if (sp_kv_init(&kv[i], 1, o->kv + o->reps, blk[0].nkv, blk[0].hd, err))
            rc = -1;
        else
            kv[i].len = o->kv;
    sp_ws ws = {0};
    double c0 = cpu_s();
    *wall = 1e30;
    for (int r = 0; !rc && r < o->reps; r++) {
        double t0 = sp_now_s();
        for (int i = 0; !rc && i < o->blocks; i++) {
            for (int s = 0; s < n; s++)
                kvp[s] = &kv[(size_t)i * n + s];
            rc = sp_block_decode_batch(&blk[i], y, i ? y : x, kvp, n, rows, &ws, err) ? -1 : 0;
        }
        double t = sp_now_s() - t0;
        *wall = t < *wall ? t : *wall;
    }
    *cpu = (cpu_s() - c0) / o->reps;
    for (int i = 0; kv && i < o->blocks * n; i++)
        sp_kv_free(&kv[i]);
    free(kv);
    sp_ws_free(&ws);
    return rc;
}

int main(int argc, char **argv)
{
    opts o;
    if (parse(argc, argv, &o))
        return fprintf(stderr, "usage: bench_pass [--blocks N] [--sessions 1,2,4,8,16] [--reps N] [--kv K]\n"), 2;
    sp_config cfg;
    sp_rope rope;
    sp_err err = {0};
    sp_rng rng;
    sp_rng_seed(&rng, 1);
    sp_block *blk = calloc((size_t)o.blocks, sizeof *blk);
    if (!blk || sp_config_parse(&cfg, LLAMA7B, "bench_pass", &err) || sp_rope_init(&rope, &cfg, &err))
        return fprintf(stderr, "bench_pass: %s\n", blk ? err.msg : "out of memory"), 1;
    for (int i = 0; i < o.blocks; i++)
        if (make_block(&blk[i], &cfg, &rope, &rng, &err))
            return fprintf(stderr, "bench_pass: %s\n", err.msg), 1;
    float *x = malloc((size_t)MAXS * cfg.hidden * sizeof(float)), *y = malloc((size_t)MAXS * cfg.hidden * sizeof(float));
    if (!x || !y)
        return fprintf(stderr, "bench_pass: out of memory\n"), 1;
    sp_rng_fill_normal(&rng, x, (long)MAXS * cfg.hidden, 1.0f);
    printf("bench_pass: %d Llama-2-7B-shaped blocks in int8, KV %d, best of %d passes\n", o.blocks, o.kv, o.reps);
    double wall1 = 0, cpu1 = 0;
    for (int k = 0; k < o.nsessions; k++) {
        int n = o.sessions[k];
        double wall, cpu;
        if (measure(blk, &o, n, x, y, &wall, &cpu, &err))
            return fprintf(stderr, "bench_pass: %s\n", err.msg), 1;
        if (!k)
            wall1 = wall / o.sessions[0], cpu1 = cpu / o.sessions[0];
        printf("%3d sessions: pass %7.1f ms, CPU %7.1f ms (%5.2f ms a token); tokens/s %5.2fx, CPU a token %4.2fx "
               "of the first\n", n, wall * 1e3, cpu * 1e3, cpu / n * 1e3, n * wall1 / wall, cpu / n / cpu1);
    }
    for (int i = 0; i < o.blocks; i++)
        sp_block_free(&blk[i]);
    free(blk), free(x), free(y);
    return 0;
}
