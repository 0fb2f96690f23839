/* kern_cuda.c - the CUDA kernels' speed against the device's own limits, measured in the same run: the decode
 * product of Llama-2-7B-shaped matrices (bs 1) in every encoding as weight bytes/s over the device-to-device copy
 * bandwidth (bytes read + written per second by cudaMemcpy), and cuBLAS f32 / bf16 GEMMs of a 1024-token linear
 * layer in TFLOP/s (the bf16 one over the f32 one). Prints the device; without a GPU it says so and exits 0.
 * Usage: bench_kern_cuda [reps] */
#include <stdio.h>
#include <stdlib.h>

#include "cuda_backend.h"
#include "cuda_timing.h"
#include "gemm.h"
#include "kernels.h"
#include "rng.h"

static sp_cuda *cu;

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

static double time_reps(void (*run)(void *ctx), void *ctx, int reps)
{
    return sp_bench_cuda_reps(cu, run, ctx, reps, "bench_kern_cuda");
}

typedef struct { sp_cuda_wmat w; float *x, *y; } mul_ctx;
static void run_mul(void *p)
{
    mul_ctx *c = p;
    sp_err err = {0};
    TRY(sp_cuda_wmat_mul(cu, &c->w, c->x, c->y, 1, &err));
}

typedef struct { void *X, *W; float *Y; sp_cu_dtype t; int N, in, out; } gemm_ctx;
static void run_gemm(void *p)
{
    gemm_ctx *c = p;
    sp_err err = {0};
    TRY(sp_cuda_linear(cu, c->Y, c->X, c->W, c->t, c->N, c->in, c->out, 0, &err));
}

static void *dev_random(size_t n, sp_rng *r)
{
    sp_err err = {0};
    float *h = malloc(n * sizeof(float));
    sp_rng_fill_normal_fast(r, h, (long)n, 0.02f);
    void *d = NULL;
    TRY(sp_cuda_dup(cu, &d, h, n * sizeof(float), &err));
    free(h);
    return d;
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 50;
    sp_err err = {0};
    char why[256];
    if (sp_cuda_device_count(why, sizeof why) <= 0) {
        printf("bench_kern_cuda: no usable GPU (%s)\n", why);
        return 0;
    }
    TRY(sp_cuda_open(&cu, 0, &err));
    printf("device: %s\n", sp_cuda_name(cu));
    sp_rng r;
    sp_rng_seed(&r, 1);
    double copy_bw = sp_bench_cuda_copy_bw(cu, "bench_kern_cuda");
    printf("device-to-device copy: %.0f GB/s (read + written)\n", copy_bw / 1e9);
    /* decode: one token through a 7B block's largest matrices (gate/up [11008, 4096]) */
    int rows = 11008, cols = 4096;
    float *hw = malloc((size_t)rows * cols * sizeof(float));
    sp_rng_fill_normal_fast(&r, hw, (long)rows * cols, 0.02f);
    mul_ctx mc;
    mc.x = dev_random((size_t)cols, &r);
    TRY(sp_cuda_alloc(cu, (void **)&mc.y, (size_t)rows * sizeof(float), &err));
    for (int t = 0; t < SP_W__COUNT; t++) {
        sp_qmat m;
        TRY(sp_qmat_encode(&m, (sp_wtype)t, hw, rows, cols, &err));
        TRY(sp_cuda_wmat_upload(cu, &mc.w, &m, &err));
        size_t bytes = sp_qmat_bytes((sp_wtype)t, rows, cols);
        double s = time_reps(run_mul, &mc, reps), bw = bytes / s;
        printf("decode product [%d, %d] %-4s: %8.1f us, %6.0f GB/s of weights, %.2f of copy\n", rows, cols,
               sp_wtype_name((sp_wtype)t), s * 1e6, bw / 1e9, bw / copy_bw);
        sp_cuda_wmat_free(cu, &mc.w);
        sp_qmat_free(&m);
    }
    free(hw);
    sp_cuda_free(cu, mc.x), sp_cuda_free(cu, mc.y);
    /* prefill: a 1024-token linear layer [4096 -> 11008], f32 and bf16 (fp32 accumulation) */
    gemm_ctx g = {.N = 1024, .in = 4096, .out = 11008};
    float *X = dev_random((size_t)g.N * g.in, &r), *W = dev_random((size_t)g.out * g.in, &r);
    TRY(sp_cuda_alloc(cu, (void **)&g.Y, (size_t)g.N * g.out * sizeof(float), &err));
    double flop = 2.0 * g.N * g.in * g.out, f32 = 0;
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
        printf("gemm %d x %d x %d %s: %.1f TFLOP/s%s", g.N, g.in, g.out, t == SP_CU_F32 ? "f32 " : "bf16",
               fl / 1e12, t == SP_CU_F32 ? "\n" : "");
        if (t == SP_CU_F32)
            f32 = fl;
        else
            printf(", %.2fx f32\n", fl / f32);
        if (t == SP_CU_BF16)
            sp_cuda_free(cu, g.X), sp_cuda_free(cu, g.W);
    }
    sp_cuda_free(cu, X), sp_cuda_free(cu, W), sp_cuda_free(cu, g.Y);
    sp_cuda_close(cu);
    return 0;
}
