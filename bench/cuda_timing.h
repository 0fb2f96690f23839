/* cuda_timing.h - what the CUDA benchmarks (kern_cuda.c, block_cuda.c) share: timing queued device work, and the
 * device-to-device copy bandwidth their ratios are taken against. A failure prints "PROG: message" and exits 1
 * (benchmarks only). */
#ifndef SEPAL_BENCH_CUDA_TIMING_H
#define SEPAL_BENCH_CUDA_TIMING_H

#include <stdio.h>
#include <stdlib.h>

#include "cuda_backend.h"
#include "timeutil.h"

static inline void sp_bench_cuda_check(sp_status st, const sp_err *err, const char *prog)
{
    if (st == SP_OK)
        return;
    fprintf(stderr, "%s: %s\n", prog, err->msg);
    exit(1);
}

/* Seconds one rep of what run queues takes: a warm-up rep, then reps of them, synced. */
static inline double sp_bench_cuda_reps(sp_cuda *cu, void (*run)(void *ctx), void *ctx, int reps, const char *prog)
{
    sp_err err = {0};
    run(ctx);
    sp_bench_cuda_check(sp_cuda_sync(cu, &err), &err, prog);
    double t0 = sp_now_s();
    for (int i = 0; i < reps; i++)
        run(ctx);
    sp_bench_cuda_check(sp_cuda_sync(cu, &err), &err, prog);
    return (sp_now_s() - t0) / reps;
}

typedef struct sp_bench_copy {
    sp_cuda *cu;
    void *dst, *src;
    size_t bytes;
    const char *prog;
} sp_bench_copy;

static inline void sp_bench_copy_once(void *p)
{
    sp_bench_copy *c = p;
    sp_err err = {0};
    sp_bench_cuda_check(sp_cuda_copy_d2d(c->cu, c->dst, c->src, c->bytes, &err), &err, c->prog);
}

/* Bytes read + written per second by device-to-device copies of 1 GiB (10 reps). */
static inline double sp_bench_cuda_copy_bw(sp_cuda *cu, const char *prog)
{
    sp_err err = {0};
    sp_bench_copy c = {cu, NULL, NULL, (size_t)1 << 30, prog};
    sp_bench_cuda_check(sp_cuda_alloc(cu, &c.dst, c.bytes, &err), &err, prog);
    sp_bench_cuda_check(sp_cuda_alloc(cu, &c.src, c.bytes, &err), &err, prog);
    double bw = 2.0 * c.bytes / sp_bench_cuda_reps(cu, sp_bench_copy_once, &c, 10, prog);
    sp_cuda_free(cu, c.dst);
    sp_cuda_free(cu, c.src);
    return bw;
}

#endif
