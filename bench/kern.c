/* kern.c - the decode kernels on the matrices of a Llama-2-7B block (random weights): for each encoding, a
 * block's seven matvecs per token, as weight bytes/s over a streaming read of the same bytes measured in the
 * same run with the same compiler flags (the memory-bound ceiling), and tokens/s against f32 and against
 * OpenBLAS's sgemv on the f32 weights. Reps interleaved; medians.
 *
 * With --product R C B instead: one [R, C] product of B rows of X (a prefill's: B > SP_KERN_MAX_ROWS) in each
 * encoding (f32, bf16, fp16, int8, nf4), sp_qmat_mul at the current level (SEPAL_ISA), reps interleaved: the median and the fastest time, and
 * multiply-adds a second. (The README's [768, 288] x 128: stories15M's FFN, a 128-token prompt.)
 *
 * usage: bench_kern [--threads N] [--reps N] [--hidden H --ffn F | --product R C B] */
#include <cblas.h>
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blastune.h"
#include "kern.h"
#include "memtune.h"
#include "pool.h"
#include "rng.h"
#include "timeutil.h"

typedef struct shape {
    int rows, cols;
} shape;

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* A streaming read of n bytes split over the pool: the ceiling of a memory-bound matvec. */
typedef struct read_job {
    const float *p;
    size_t n; /* floats */
    double sums[64];
} read_job;

static void read_part_scalar(void *ctx, int i, int n)
{
    read_job *j = ctx;
    long lo, hi;
    sp_pool_split((long)j->n, i, n, 64, &lo, &hi);
    float a[8] = {0};
    for (long k = lo; k + 8 <= hi; k += 8)
        for (int q = 0; q < 8; q++)
            a[q] += j->p[k + q];
    j->sums[i] = a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}

__attribute__((target("avx512f"))) static void read_part(void *ctx, int i, int n)
{
    read_job *j = ctx;
    long lo, hi;
    sp_pool_split((long)j->n, i, n, 64, &lo, &hi);
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    long k = lo;
    for (; k + 64 <= hi; k += 64) {
        a0 = _mm512_add_ps(a0, _mm512_loadu_ps(j->p + k));
        a1 = _mm512_add_ps(a1, _mm512_loadu_ps(j->p + k + 16));
        a2 = _mm512_add_ps(a2, _mm512_loadu_ps(j->p + k + 32));
        a3 = _mm512_add_ps(a3, _mm512_loadu_ps(j->p + k + 48));
    }
    j->sums[i] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

/* --product: W [R, C] random, X [B, C]; every encoding's product timed in turn, reps times. */
static int product(int R, int C, int B, int reps, sp_pool *pool)
{
    sp_rng r;
    sp_rng_seed(&r, 1);
    float *w = malloc((size_t)R * C * sizeof(float)), *x = malloc((size_t)B * C * sizeof(float));
    float *y = malloc((size_t)B * R * sizeof(float));
    sp_rng_fill_normal(&r, w, (long)R * C, 0.02f);
    sp_rng_fill_normal(&r, x, (long)B * C, 1.0f);
    enum { NT = SP_W__COUNT };
    sp_wtype types[NT] = {SP_W_F32, SP_W_BF16, SP_W_F16, SP_W_Q8, SP_W_NF4}; /* (every encoding, 2-byte ones together) */
    sp_qmat m[NT];
    sp_err err = {0};
    for (int t = 0; t < NT; t++)
        if (t == 0)
            m[t] = sp_qmat_f32(w, R, C);
        else if (sp_qmat_encode(&m[t], types[t], w, R, C, &err))
            return fprintf(stderr, "bench_kern: %s\n", err.msg), 1;
    char kern[128];
    sp_kern_describe(kern, sizeof kern);
    printf("bench_kern: [%d, %d] x %d rows, %d thread%s, %s, %d reps\n", R, C, B, sp_pool_threads(pool),
           sp_pool_threads(pool) == 1 ? "" : "s", kern, reps);
    double t[NT][100];
    for (int rep = 0; rep < reps; rep++)
        for (int k = 0; k < NT; k++) {
            double t0 = sp_now_s();
            sp_qmat_mul(&m[k], x, y, B, pool);
            t[k][rep] = sp_now_s() - t0;
        }
    for (int k = 0; k < NT; k++) {
        double med = median(t[k], reps), best = t[k][0]; /* median sorted t[k] */
        printf("  %-5s median %8.1f us, fastest %8.1f us, %.2f G multiply-adds/s\n", sp_wtype_name(types[k]),
               med * 1e6, best * 1e6, (double)R * C * B / best / 1e9);
    }
    for (int k = 1; k < NT; k++)
        sp_qmat_free(&m[k]);
    free(w), free(x), free(y);
    return 0;
}

int main(int argc, char **argv)
{
    sp_blas_tune(argv); /* as the sepal program does: OpenBLAS's kernels for this CPU */
    int threads = 0, reps = 7, H = 4096, F = 11008, pr = 0, pc = 0, pb = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--hidden") && i + 1 < argc)
            H = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ffn") && i + 1 < argc)
            F = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--product") && i + 3 < argc)
            pr = atoi(argv[i + 1]), pc = atoi(argv[i + 2]), pb = atoi(argv[i + 3]), i += 3;
        else
            return fprintf(stderr, "usage: bench_kern [--threads N] [--reps N] [--hidden H --ffn F | --product R C B]\n"), 2;
    }
    if (pr && (pr < 1 || pc < 1 || pb < 1 || (double)pr * pc > 1e9 || (double)pb * pc > 1e9))
        return fprintf(stderr, "bench_kern: --product R C B needs positive sizes (got %d %d %d)\n", pr, pc, pb), 2;
    if (reps < 1 || reps > 100)
        reps = 7;
    sp_err err = {0};
    if (sp_kern_check_env(&err))
        return fprintf(stderr, "bench_kern: %s\n", err.msg), 2;
    sp_pool *pool = sp_pool_new(threads);
    threads = sp_pool_threads(pool);
    openblas_set_num_threads(threads);
    if (pr) {
        int rc = product(pr, pc, pb, reps, pool);
        sp_pool_free(pool);
        return rc;
    }
    /* q, k, v, o: [H, H]; gate, up: [F, H]; down: [H, F] */
    shape sh[7] = {{H, H}, {H, H}, {H, H}, {H, H}, {F, H}, {F, H}, {H, F}};
    sp_rng r;
    sp_rng_seed(&r, 1);
    sp_qmat m[SP_W__COUNT][7];
    float *wf[7];
    size_t params = 0;
    for (int k = 0; k < 7; k++) {
        size_t n = (size_t)sh[k].rows * sh[k].cols;
        wf[k] = sp_mem_alloc_weights(n * sizeof(float)); /* as the loader holds f32 weights (memtune.h) */
        sp_rng_fill_normal(&r, wf[k], (long)n, 0.02f);
        params += n;
        for (int t = 0; t < SP_W__COUNT; t++)
            if (t == SP_W_F32)
                m[t][k] = sp_qmat_f32(wf[k], sh[k].rows, sh[k].cols);
            else if (sp_qmat_encode(&m[t][k], (sp_wtype)t, wf[k], sh[k].rows, sh[k].cols, &err))
                return fprintf(stderr, "bench_kern: %s\n", err.msg), 1;
    }
    float *x = malloc((size_t)F * sizeof(float)), *y = malloc((size_t)F * sizeof(float));
    sp_rng_fill_normal(&r, x, F, 1.0f);
    /* a buffer as large as the f32 block, for the read ceiling */
    float *big = malloc(params * sizeof(float));
    for (size_t i = 0; i < params; i++)
        big[i] = 1e-3f * (float)(i & 1023);
    char kern[128];
    sp_kern_describe(kern, sizeof kern);
    printf("bench_kern: a Llama-2-7B-shaped block (H %d, FFN %d: %.1fM weights), %d thread%s, %s, %d reps\n", H, F,
           params / 1e6, threads, threads == 1 ? "" : "s", kern, reps);
    double t_read[100], t_blas[100], t_k[SP_W__COUNT][100];
    for (int rep = 0; rep < reps; rep++) {
        double t0 = sp_now_s();
        read_job rj = {.p = big, .n = params};
        sp_pool_run(pool, sp_kern_level() >= SP_ISA_AVX512 ? read_part : read_part_scalar, &rj);
        t_read[rep] = sp_now_s() - t0;
        t0 = sp_now_s();
        for (int k = 0; k < 7; k++)
            cblas_sgemv(CblasRowMajor, CblasNoTrans, sh[k].rows, sh[k].cols, 1.0f, wf[k], sh[k].cols, x, 1, 0.0f, y, 1);
        t_blas[rep] = sp_now_s() - t0;
        for (int t = 0; t < SP_W__COUNT; t++) {
            t0 = sp_now_s();
            for (int k = 0; k < 7; k++)
                sp_qmat_mul(&m[t][k], x, y, 1, pool);
            t_k[t][rep] = sp_now_s() - t0;
        }
    }
    double read_s = median(t_read, reps), blas_s = median(t_blas, reps);
    double read_bw = params * 4.0 / read_s;
    printf("  streaming read of %.0f MB: %.2f GB/s (the ceiling)\n", params * 4.0 / 1e6, read_bw / 1e9);
    printf("  OpenBLAS sgemv f32: %.2f ms a token, %.2f GB/s = %.2f of the read\n", blas_s * 1e3,
           params * 4.0 / blas_s / 1e9, params * 4.0 / blas_s / read_bw);
    double f32_s = median(t_k[SP_W_F32], reps);
    for (int t = 0; t < SP_W__COUNT; t++) {
        double s = median(t_k[t], reps);
        size_t bytes = 0;
        for (int k = 0; k < 7; k++)
            bytes += sp_qmat_bytes((sp_wtype)t, sh[k].rows, sh[k].cols);
        printf("  %-5s %7.2f ms a token (%6.1f tok/s), %6.0f MB, %5.2f GB/s = %.2f of the read; x%.2f f32, x%.2f "
               "sgemv\n",
               sp_wtype_name((sp_wtype)t), s * 1e3, 1 / s, bytes / 1e6, bytes / s / 1e9, bytes / s / read_bw,
               f32_s / s, blas_s / s);
    }
    for (int k = 0; k < 7; k++) {
        for (int t = 1; t < SP_W__COUNT; t++)
            sp_qmat_free(&m[t][k]);
        free(wf[k]);
    }
    free(big), free(x), free(y);
    sp_pool_free(pool);
    return 0;
}
