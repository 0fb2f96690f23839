/* kern_cuda.c - the CUDA kernels' speed against the device's own limits, measured in the same run: the decode
 * product (sp_cuda_wmat_mul, 1, 4 and 8 rows of X) of Llama-2-7B- and 70B-shaped matrices in every encoding as
 * weight bytes/s (the encoded bytes: values and scales) over the device-to-device copy bandwidth (bytes read +
 * written per second by cudaMemcpy), and the products of a 1024-token layer in TFLOP/s: cuBLAS f32 and bf16 GEMMs
 * (the peak the others are measured against), sp_cuda_wmat_mul and sp_cuda_wmat_mul_t_acc in every encoding.
 * Each timed matrix rotates among copies of at least 256 MiB together, so that the L2 cache does not serve them.
 * With --sweep, also every rows-a-warp and warps-a-row shape of the fused decode kernel on two 7B matrices; with
 * --decode, the decode table alone. Prints the device; without a GPU it says so and exits 0.
 * Usage: bench_kern_cuda [--sweep | --decode] [reps] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"
#include "gemm.h"
#include "kernels.h"
#include "rng.h"
#include "timeutil.h"

static sp_cuda *cu;
static sp_rng rng;

static void die(const sp_err *err)
{
    fprintf(stderr, "bench_kern_cuda: %s\n", err->msg);
    exit(1);
}

#define TRY(call)                                                                                              \
    do {                                                                                                       \
        if ((call) != SP_OK)                                                                                   \
            die(&err);                                                                                         \
    } while (0)

/* Seconds one rep of what `run` queues takes: a warm-up rep, then reps of them, synced. run(ctx, i): rep i. */
typedef void (*rep_fn)(void *ctx, int i);
static double time_reps(rep_fn run, void *ctx, int reps)
{
    sp_err err = {0};
    run(ctx, 0);
    TRY(sp_cuda_sync(cu, &err));
    double t0 = sp_now_s();
    for (int i = 0; i < reps; i++)
        run(ctx, i);
    TRY(sp_cuda_sync(cu, &err));
    return (sp_now_s() - t0) / reps;
}

typedef struct { void *dst, *src; size_t bytes; } copy_ctx;
static void run_copy(void *p, int i)
{
    copy_ctx *c = p;
    sp_err err = {0};
    (void)i;
    TRY(sp_cuda_copy_d2d(cu, c->dst, c->src, c->bytes, &err));
}

static void *dev_random(size_t n)
{
    sp_err err = {0};
    float *h = malloc(n * sizeof(float));
    sp_rng_fill_normal_fast(&rng, h, (long)n, 0.02f);
    void *d = NULL;
    TRY(sp_cuda_dup(cu, &d, h, n * sizeof(float), &err));
    free(h);
    return d;
}

/* A [rows, cols] matrix of type t on the device, ncopies copies (views into two buffers): random rows encoded on the
 * host for a slab of at most 256 rows, repeated down the matrix by device copies (the products' speed does not
 * depend on the values, only on their encoding). */
enum { MAX_COPIES = 64, SLAB = 256 };
typedef struct {
    sp_cuda_wmat w[MAX_COPIES];
    int ncopies;
    void *q;
    float *s;
    size_t bytes; /* one copy's encoded bytes (sp_qmat_bytes) */
} wpool;

static void wpool_make(wpool *p, sp_wtype t, int rows, int cols, size_t min_bytes)
{
    sp_err err = {0};
    int sr = rows < SLAB ? rows : SLAB;
    float *h = malloc((size_t)sr * cols * sizeof(float));
    sp_rng_fill_normal_fast(&rng, h, (long)sr * cols, 0.02f);
    sp_qmat m;
    TRY(sp_qmat_encode(&m, t, h, sr, cols, &err));
    sp_cuda_wmat slab;
    TRY(sp_cuda_wmat_upload(cu, &slab, &m, &err));
    long rb = sp_km_row_bytes(&slab.w), ns = sp_km_row_scales(&slab.w);
    p->bytes = sp_qmat_bytes(t, rows, cols);
    p->ncopies = (int)((min_bytes + p->bytes - 1) / p->bytes);
    p->ncopies = p->ncopies < 1 ? 1 : p->ncopies > MAX_COPIES ? MAX_COPIES : p->ncopies;
    size_t qb = (size_t)rows * rb, sb = (size_t)rows * ns * sizeof(float);
    TRY(sp_cuda_alloc(cu, &p->q, qb * p->ncopies, &err));
    p->s = NULL;
    if (sb)
        TRY(sp_cuda_alloc(cu, (void **)&p->s, sb * p->ncopies, &err));
    for (int c = 0; c < p->ncopies; c++) {
        char *q = (char *)p->q + qb * c;
        float *s = sb ? p->s + (size_t)rows * ns * c : NULL;
        for (int r0 = 0; r0 < rows; r0 += sr) {
            int n = rows - r0 < sr ? rows - r0 : sr;
            TRY(sp_cuda_copy_d2d(cu, q + (size_t)r0 * rb, slab.q, (size_t)n * rb, &err));
            if (sb)
                TRY(sp_cuda_copy_d2d(cu, s + (size_t)r0 * ns, slab.scale, (size_t)n * ns * sizeof(float), &err));
        }
        memset(&p->w[c], 0, sizeof p->w[c]);
        p->w[c].q = q;
        p->w[c].scale = s;
        p->w[c].w = sp_cuda_km_w(t, rows, cols, q, s);
    }
    TRY(sp_cuda_sync(cu, &err));
    sp_cuda_wmat_free(cu, &slab);
    sp_qmat_free(&m);
    free(h);
}

static void wpool_free(wpool *p)
{
    sp_cuda_free(cu, p->q);
    sp_cuda_free(cu, p->s);
}

typedef struct { wpool *p; float *x, *y; int B, t; } mul_ctx;
static void run_mul(void *v, int i)
{
    mul_ctx *c = v;
    sp_err err = {0};
    if (c->t)
        TRY(sp_cuda_wmat_mul_t_acc(cu, &c->p->w[i % c->p->ncopies], c->x, c->y, c->B, &err));
    else
        TRY(sp_cuda_wmat_mul(cu, &c->p->w[i % c->p->ncopies], c->x, c->y, c->B, &err));
}

static const int shapes[][2] = {{11008, 4096}, {4096, 4096}, {4096, 11008}, {28672, 8192}, {8192, 28672}, {8192, 8192}};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])
static const size_t kRotate = (size_t)256 << 20;

/* The decode table: every shape, encoding and 1, 4, 8 rows of X. */
static void decode_table(double copy_bw, int reps, float *x, float *y)
{
    printf("\ndecode product (sp_cuda_wmat_mul): weight bytes/s over copy\n");
    printf("%-15s %-5s %26s %26s %26s\n", "shape", "type", "B=1 us  GB/s ratio", "B=4 us  GB/s ratio",
           "B=8 us  GB/s ratio");
    for (int k = 0; k < NSHAPES; k++)
        for (int t = 0; t < SP_W__COUNT; t++) {
            wpool p;
            wpool_make(&p, (sp_wtype)t, shapes[k][0], shapes[k][1], kRotate);
            char sh[32];
            snprintf(sh, sizeof sh, "[%d, %d]", shapes[k][0], shapes[k][1]);
            printf("%-15s %-5s", sh, sp_wtype_name((sp_wtype)t));
            const int Bs[] = {1, 4, 8};
            for (int j = 0; j < 3; j++) {
                mul_ctx c = {&p, x, y, Bs[j], 0};
                double s = time_reps(run_mul, &c, reps), bw = p.bytes / s;
                printf("   %8.1f %5.0f %5.2f", s * 1e6, bw / 1e9, bw / copy_bw);
            }
            if (t == SP_W_Q8 || t == SP_W_NF4) { /* B = 1 with all of a chunk's rows decoded first (before) */
                mul_ctx c = {&p, x, y, 1, 0};
                sp_cuda_wmat_tune_light(0);
                double s = time_reps(run_mul, &c, reps), bw = p.bytes / s;
                sp_cuda_wmat_tune_light(-1);
                printf("   (B=1 decoded first: %8.1f %5.2f)", s * 1e6, bw / copy_bw);
            }
            printf("\n");
            fflush(stdout);
            wpool_free(&p);
        }
}

/* Every rows-a-warp (R) and warps-a-row (ks) shape of the fused kernel, B = 1 and 8, ratio to copy. */
static void sweep(double copy_bw, int reps, float *x, float *y)
{
    printf("\nfused decode kernel shapes (ratio to copy; R rows a warp, ks warps a row)\n");
    printf("%-15s %-5s %2s   R1k1  R1k2  R1k4  R2k1  R2k2  R2k4  R4k1  R4k2  R4k4  auto\n", "shape", "type", "B");
    for (int k = 0; k < 3; k += 2)
        for (int t = 0; t < SP_W__COUNT; t++) {
            wpool p;
            wpool_make(&p, (sp_wtype)t, shapes[k][0], shapes[k][1], kRotate);
            for (int B = 1; B <= 8; B += 7) {
                char sh[32];
                snprintf(sh, sizeof sh, "[%d, %d]", shapes[k][0], shapes[k][1]);
                printf("%-15s %-5s %2d ", sh, sp_wtype_name((sp_wtype)t), B);
                for (int v = 0; v <= 9; v++) {
                    sp_cuda_wmat_tune(v < 9 ? 1 << (v / 3) : 0, v < 9 ? 1 << (v % 3) : 0, 0);
                    mul_ctx c = {&p, x, y, B, 0};
                    printf(" %5.2f", p.bytes / time_reps(run_mul, &c, reps) / copy_bw);
                }
                printf("\n");
                fflush(stdout);
            }
            wpool_free(&p);
        }
    sp_cuda_wmat_tune(0, 0, 0);
}

typedef struct { void *X, *W; float *Y; sp_cu_dtype t; int N, in, out; } gemm_ctx;
static void run_gemm(void *p, int i)
{
    gemm_ctx *c = p;
    sp_err err = {0};
    (void)i;
    TRY(sp_cuda_linear(cu, c->Y, c->X, c->W, c->t, c->N, c->in, c->out, 0, &err));
}

/* A 1024-token layer [4096 -> 11008]: cuBLAS f32 and bf16 (the peak), then the weight products in every encoding,
 * forward (Y = X W^T) and to the input (dX += dY W), as TFLOP/s and over the bf16 peak. */
static void gemm_table(int reps)
{
    sp_err err = {0};
    gemm_ctx g = {.N = 1024, .in = 4096, .out = 11008};
    float *X = dev_random((size_t)g.N * g.in), *W = dev_random((size_t)g.out * g.in);
    TRY(sp_cuda_alloc(cu, (void **)&g.Y, (size_t)g.N * g.out * sizeof(float), &err));
    double flop = 2.0 * g.N * g.in * g.out, f32 = 0, bf16 = 0;
    printf("\nproducts of a %d-token layer [%d -> %d]\n", g.N, g.in, g.out);
    for (int t = SP_CU_F32; t <= SP_CU_BF16; t++) {
        g.t = (sp_cu_dtype)t;
        g.X = X, g.W = W;
        if (t == SP_CU_BF16) {
            TRY(sp_cuda_alloc(cu, &g.X, (size_t)g.N * g.in * 2, &err));
            TRY(sp_cuda_alloc(cu, &g.W, (size_t)g.out * g.in * 2, &err));
            TRY(sp_cuda_f32_to(cu, g.X, X, (long)g.N * g.in, SP_CU_BF16, &err));
            TRY(sp_cuda_f32_to(cu, g.W, W, (long)g.out * g.in, SP_CU_BF16, &err));
        }
        double fl = flop / time_reps(run_gemm, &g, reps / 5 + 1);
        printf("cublas gemm %s: %6.1f TFLOP/s\n", t == SP_CU_F32 ? "f32 " : "bf16", fl / 1e12);
        *(t == SP_CU_F32 ? &f32 : &bf16) = fl;
        if (t == SP_CU_BF16)
            sp_cuda_free(cu, g.X), sp_cuda_free(cu, g.W);
    }
    printf("bf16 over f32: %.2fx\n", bf16 / f32);
    float *dX = NULL;
    TRY(sp_cuda_alloc(cu, (void **)&dX, (size_t)g.N * g.in * sizeof(float), &err));
    for (int t = 0; t < SP_W__COUNT; t++) {
        wpool p;
        wpool_make(&p, (sp_wtype)t, g.out, g.in, 0);
        mul_ctx fw = {&p, X, g.Y, g.N, 0}, bw = {&p, g.Y, dX, g.N, 1};
        double a = flop / time_reps(run_mul, &fw, reps / 5 + 1), b = flop / time_reps(run_mul, &bw, reps / 5 + 1);
        printf("wmat %-4s: Y = X W^T %6.1f TFLOP/s (%.2f of bf16 cublas), dX += dY W %6.1f TFLOP/s (%.2f)\n",
               sp_wtype_name((sp_wtype)t), a / 1e12, a / bf16, b / 1e12, b / bf16);
        wpool_free(&p);
    }
    sp_cuda_free(cu, dX), sp_cuda_free(cu, X), sp_cuda_free(cu, W), sp_cuda_free(cu, g.Y);
}

int main(int argc, char **argv)
{
    int do_sweep = argc > 1 && strcmp(argv[1], "--sweep") == 0, only_decode = argc > 1 && !strcmp(argv[1], "--decode");
    int opt = do_sweep || only_decode, reps = argc > 1 + opt ? atoi(argv[1 + opt]) : 50;
    reps = reps < 1 ? 1 : reps;
    sp_err err = {0};
    char why[256];
    if (sp_cuda_device_count(why, sizeof why) <= 0) {
        printf("bench_kern_cuda: no usable GPU (%s)\n", why);
        return 0;
    }
    TRY(sp_cuda_open(&cu, 0, &err));
    printf("device: %s\n", sp_cuda_name(cu));
    sp_rng_seed(&rng, 1);
    copy_ctx cc = {.bytes = (size_t)1 << 30};
    TRY(sp_cuda_alloc(cu, &cc.dst, cc.bytes, &err));
    TRY(sp_cuda_alloc(cu, &cc.src, cc.bytes, &err));
    double copy_bw = 2.0 * cc.bytes / time_reps(run_copy, &cc, 10);
    printf("device-to-device copy: %.0f GB/s (read + written)\n", copy_bw / 1e9);
    sp_cuda_free(cu, cc.dst), sp_cuda_free(cu, cc.src);
    float *x = dev_random((size_t)8 * 28672), *y = NULL;
    TRY(sp_cuda_alloc(cu, (void **)&y, (size_t)8 * 28672 * sizeof(float), &err));
    if (do_sweep)
        sweep(copy_bw, reps, x, y);
    decode_table(copy_bw, reps, x, y);
    sp_cuda_free(cu, x), sp_cuda_free(cu, y);
    if (!only_decode)
        gemm_table(reps);
    sp_cuda_close(cu);
    return 0;
}
