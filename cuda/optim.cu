// optim.cu - AdamW, unscale/finite check and the global grad norm on the GPU (spec: client/optim.c).
// Per-element arithmetic uses the explicitly rounded intrinsics (__fmul_rn, ...) so nvcc cannot contract it
// into FMAs: each operation rounds exactly like the CPU loop, in the same order.
#include "optim_cuda.h"

#include "cuda_backend.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>

#include <new>

namespace {

constexpr int kThreads = 256;     // block size of every kernel here (a power of two)
constexpr int kRedBlocks = 1024;  // at most this many partial sums in the first reduction pass
constexpr int kMaxBlocks = 65535; // grid-stride loops beyond this

int blocks_for(int64_t n, int cap)
{
    int64_t b = (n + kThreads - 1) / kThreads;
    if (b < 1)
        b = 1;
    return (int)(b < cap ? b : cap);
}

struct Coefs {
    float decay, b1, c1, b2, c2, step, bc2s, eps;
};

// The same double-then-float scalars as coefs() in client/optim.c.
Coefs make_coefs(float lr, float b1, float b2, float eps, float wd, int t)
{
    Coefs c;
    c.decay = (float)(1.0 - (double)lr * (double)wd);
    c.b1 = b1;
    c.c1 = (float)(1.0 - (double)b1);
    c.b2 = b2;
    c.c2 = (float)(1.0 - (double)b2);
    c.step = (float)((double)lr / (1.0 - pow((double)b1, (double)t)));
    c.bc2s = (float)sqrt(1.0 - pow((double)b2, (double)t));
    c.eps = eps;
    return c;
}

__global__ void adamw_kernel(float *p, const float *g, float *m, float *v, int64_t n, float gscale, Coefs c)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float gi = __fmul_rn(g[i], gscale);
        float pi = __fmul_rn(p[i], c.decay);
        float mi = __fadd_rn(__fmul_rn(c.b1, m[i]), __fmul_rn(c.c1, gi));
        float vi = __fadd_rn(__fmul_rn(c.b2, v[i]), __fmul_rn(c.c2, __fmul_rn(gi, gi)));
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c.bc2s), c.eps);
        p[i] = __fsub_rn(pi, __fmul_rn(c.step, __fdiv_rn(mi, denom)));
        m[i] = mi;
        v[i] = vi;
    }
}

// Pass 1: each block scales (when asked) its grid-stride share, flags non-finite values and writes the sum
// of squares of its share (in double) to partial[blockIdx.x].
// The sum of every thread's acc into sh[0] (sh: blockDim.x values; blockDim.x a power of two), in a fixed order.
__device__ void block_sum(double *sh, double acc)
{
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
}

__global__ void unscale_sumsq_kernel(float *g, int64_t n, float inv_scale, int scale_it, double *partial, int *bad)
{
    __shared__ double sh[kThreads];
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    double acc = 0.0;
    int nonfinite = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float x = g[i];
        if (scale_it) {
            x = __fmul_rn(x, inv_scale);
            g[i] = x;
        }
        nonfinite |= !isfinite(x);
        acc += (double)x * (double)x;
    }
    if (nonfinite)
        *bad = 1;
    block_sum(sh, acc);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = sh[0];
}

// Pass 2: one block adds the partial sums (fixed order: the result is deterministic).
__global__ void sum_partials_kernel(const double *partial, int np, double *out)
{
    __shared__ double sh[kThreads];
    double acc = 0.0;
    for (int i = threadIdx.x; i < np; i += blockDim.x)
        acc += partial[i];
    block_sum(sh, acc);
    if (threadIdx.x == 0)
        *out = sh[0];
}

// Scratch for the reduction: partial sums, the result and the non-finite flag.
struct Scratch {
    double *partial = nullptr, *sum = nullptr;
    int *bad = nullptr;
    cudaError_t init()
    {
        cudaError_t e = cudaMalloc(&partial, kRedBlocks * sizeof(double));
        if (e == cudaSuccess)
            e = cudaMalloc(&sum, sizeof(double));
        if (e == cudaSuccess)
            e = cudaMalloc(&bad, sizeof(int));
        return e;
    }
    void release()
    {
        cudaFree(partial);
        cudaFree(sum);
        cudaFree(bad);
        partial = sum = nullptr;
        bad = nullptr;
    }
};

// Runs both passes on device grads d_g; fills found_inf / sumsq when non-NULL.
cudaError_t unscale_norm(Scratch &sc, float *d_g, int64_t n, float inv_scale, int *found_inf, double *sumsq)
{
    cudaError_t e = cudaMemset(sc.bad, 0, sizeof(int));
    int nb = blocks_for(n, kRedBlocks);
    if (e == cudaSuccess) {
        unscale_sumsq_kernel<<<nb, kThreads>>>(d_g, n, inv_scale, inv_scale != 1.0f, sc.partial, sc.bad);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) {
        sum_partials_kernel<<<1, kThreads>>>(sc.partial, nb, sc.sum);
        e = cudaGetLastError();
    }
    double s = 0.0;
    int bad = 0;
    if (e == cudaSuccess)
        e = cudaMemcpy(&s, sc.sum, sizeof s, cudaMemcpyDeviceToHost);
    if (e == cudaSuccess)
        e = cudaMemcpy(&bad, sc.bad, sizeof bad, cudaMemcpyDeviceToHost);
    if (e == cudaSuccess) {
        if (found_inf)
            *found_inf = bad;
        if (sumsq)
            *sumsq = s;
    }
    return e;
}

cudaError_t launch_adamw(float *p, const float *g, float *m, float *v, int64_t n, float gscale, const Coefs &c)
{
    if (n <= 0)
        return cudaSuccess;
    adamw_kernel<<<blocks_for(n, kMaxBlocks), kThreads>>>(p, g, m, v, n, gscale, c);
    return cudaGetLastError();
}

} // namespace

struct sp_cuda_adamw {
    int64_t n;
    float *p, *g, *m, *v;
    Scratch sc;
};

extern "C" void sp_cuda_adamw_free(sp_cuda_adamw *s)
{
    if (!s)
        return;
    cudaFree(s->p);
    cudaFree(s->g);
    cudaFree(s->m);
    cudaFree(s->v);
    s->sc.release();
    delete s;
}

extern "C" sp_status sp_cuda_adamw_new(sp_cuda_adamw **out, int64_t n, sp_err *err)
{
    *out = nullptr;
    if (n < 0)
        return sp_errf(err, SP_ERR_ARG, "cuda adamw: negative size");
    sp_cuda_adamw *s = new (std::nothrow) sp_cuda_adamw();
    if (!s)
        return sp_errf(err, SP_ERR_NOMEM, "cuda adamw: out of memory");
    s->n = n;
    size_t nb = (size_t)(n > 0 ? n : 1) * sizeof(float);
    cudaError_t e = cudaMalloc(&s->p, nb);
    if (e == cudaSuccess)
        e = cudaMalloc(&s->g, nb);
    if (e == cudaSuccess)
        e = cudaMalloc(&s->m, nb);
    if (e == cudaSuccess)
        e = cudaMalloc(&s->v, nb);
    if (e == cudaSuccess)
        e = cudaMemset(s->m, 0, nb);
    if (e == cudaSuccess)
        e = cudaMemset(s->v, 0, nb);
    if (e == cudaSuccess)
        e = cudaMemset(s->g, 0, nb);
    if (e == cudaSuccess)
        e = s->sc.init();
    if (e != cudaSuccess) {
        sp_cuda_adamw_free(s);
        return sp_cuda_error(err, (int)e, "adamw state");
    }
    *out = s;
    return SP_OK;
}

static bool in_range(const sp_cuda_adamw *s, int64_t off, int64_t n)
{
    return s && off >= 0 && n >= 0 && off <= s->n && n <= s->n - off;
}

extern "C" sp_status sp_cuda_adamw_upload(sp_cuda_adamw *s, int64_t off, int64_t n, const float *p, const float *g,
                                          sp_err *err)
{
    if (!in_range(s, off, n))
        return sp_errf(err, SP_ERR_ARG, "cuda adamw upload: range [%lld, +%lld) outside the buffers", (long long)off,
                       (long long)n);
    if (n == 0)
        return SP_OK;
    size_t nb = (size_t)n * sizeof(float);
    cudaError_t e = cudaMemcpy(s->p + off, p, nb, cudaMemcpyHostToDevice);
    if (e == cudaSuccess)
        e = g ? cudaMemcpy(s->g + off, g, nb, cudaMemcpyHostToDevice) : cudaMemset(s->g + off, 0, nb);
    return e == cudaSuccess ? SP_OK : sp_cuda_error(err, (int)e, "adamw upload");
}

extern "C" sp_status sp_cuda_adamw_unscale_norm(sp_cuda_adamw *s, float inv_scale, int *found_inf, double *sumsq,
                                                sp_err *err)
{
    if (!s)
        return sp_errf(err, SP_ERR_ARG, "cuda adamw: NULL state");
    cudaError_t e = unscale_norm(s->sc, s->g, s->n, inv_scale, found_inf, sumsq);
    return e == cudaSuccess ? SP_OK : sp_cuda_error(err, (int)e, "unscale / norm");
}

extern "C" sp_status sp_cuda_adamw_apply(sp_cuda_adamw *s, int64_t off, int64_t n, float gscale, float lr, float b1,
                                         float b2, float eps, float wd, int t, sp_err *err)
{
    if (!in_range(s, off, n) || t < 1)
        return sp_errf(err, SP_ERR_ARG, "cuda adamw apply: bad range or step");
    Coefs c = make_coefs(lr, b1, b2, eps, wd, t);
    cudaError_t e = launch_adamw(s->p + off, s->g + off, s->m + off, s->v + off, n, gscale, c);
    return e == cudaSuccess ? SP_OK : sp_cuda_error(err, (int)e, "adamw update");
}

extern "C" sp_status sp_cuda_adamw_download(sp_cuda_adamw *s, int64_t off, int64_t n, float *p, sp_err *err)
{
    if (!in_range(s, off, n))
        return sp_errf(err, SP_ERR_ARG, "cuda adamw download: range outside the buffers");
    if (n == 0)
        return SP_OK;
    cudaError_t e = cudaMemcpy(p, s->p + off, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost);
    return e == cudaSuccess ? SP_OK : sp_cuda_error(err, (int)e, "adamw download");
}

extern "C" float *sp_cuda_adamw_params(sp_cuda_adamw *s)
{
    return s ? s->p : nullptr;
}

extern "C" float *sp_cuda_adamw_grads(sp_cuda_adamw *s)
{
    return s ? s->g : nullptr;
}

extern "C" sp_status sp_cuda_adamw_zero_grads(sp_cuda_adamw *s, sp_err *err)
{
    if (!s)
        return sp_errf(err, SP_ERR_ARG, "cuda adamw: NULL state");
    cudaError_t e = cudaMemset(s->g, 0, (size_t)(s->n > 0 ? s->n : 1) * sizeof(float));
    if (e == cudaSuccess)
        e = cudaDeviceSynchronize();
    return e == cudaSuccess ? SP_OK : sp_cuda_error(err, (int)e, "adamw zero grads");
}

/* ---------------------------------------------------------------------------------------------- */
/* bare operations on host arrays */

extern "C" sp_status sp_cuda_adamw_update(float *p, const float *g, float *m, float *v, int64_t n, float lr, float b1,
                                          float b2, float eps, float wd, int t, sp_err *err)
{
    if (n < 0 || t < 1)
        return sp_errf(err, SP_ERR_ARG, "cuda adamw update: bad size or step");
    if (n == 0)
        return SP_OK;
    size_t nb = (size_t)n * sizeof(float);
    float *d[4] = {nullptr, nullptr, nullptr, nullptr};
    const float *h[4] = {p, g, m, v};
    cudaError_t e = cudaSuccess;
    for (int k = 0; k < 4 && e == cudaSuccess; k++) {
        e = cudaMalloc(&d[k], nb);
        if (e == cudaSuccess)
            e = cudaMemcpy(d[k], h[k], nb, cudaMemcpyHostToDevice);
    }
    if (e == cudaSuccess)
        e = launch_adamw(d[0], d[1], d[2], d[3], n, 1.0f, make_coefs(lr, b1, b2, eps, wd, t));
    if (e == cudaSuccess)
        e = cudaMemcpy(p, d[0], nb, cudaMemcpyDeviceToHost);
    if (e == cudaSuccess)
        e = cudaMemcpy(m, d[2], nb, cudaMemcpyDeviceToHost);
    if (e == cudaSuccess)
        e = cudaMemcpy(v, d[3], nb, cudaMemcpyDeviceToHost);
    for (int k = 0; k < 4; k++)
        cudaFree(d[k]);
    return e == cudaSuccess ? SP_OK : sp_cuda_error(err, (int)e, "adamw update");
}

// Copies g in, runs the reduction (optionally scaling), copies g back when it changed.
static sp_status host_reduce(float *g, int64_t n, float inv_scale, int *found_inf, double *sumsq, const char *what,
                             sp_err *err)
{
    if (n < 0)
        return sp_errf(err, SP_ERR_ARG, "cuda %s: negative size", what);
    size_t nb = (size_t)(n > 0 ? n : 1) * sizeof(float);
    float *d_g = nullptr;
    Scratch sc;
    cudaError_t e = sc.init();
    if (e == cudaSuccess)
        e = cudaMalloc(&d_g, nb);
    if (e == cudaSuccess && n > 0)
        e = cudaMemcpy(d_g, g, (size_t)n * sizeof(float), cudaMemcpyHostToDevice);
    if (e == cudaSuccess)
        e = unscale_norm(sc, d_g, n, inv_scale, found_inf, sumsq);
    if (e == cudaSuccess && n > 0 && inv_scale != 1.0f)
        e = cudaMemcpy(g, d_g, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost);
    cudaFree(d_g);
    sc.release();
    return e == cudaSuccess ? SP_OK : sp_cuda_error(err, (int)e, what);
}

extern "C" sp_status sp_cuda_unscale_check(float *g, int64_t n, float inv_scale, int *found_inf, sp_err *err)
{
    return host_reduce(g, n, inv_scale, found_inf, nullptr, "unscale_check", err);
}

extern "C" sp_status sp_cuda_sumsq(const float *g, int64_t n, double *sumsq, sp_err *err)
{
    // inv_scale 1: the buffer is only read, so casting away const for the shared helper is safe.
    return host_reduce(const_cast<float *>(g), n, 1.0f, nullptr, sumsq, "sumsq", err);
}
