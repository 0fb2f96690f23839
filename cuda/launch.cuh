// launch.cuh - internal to cuda/: grid sizes, the kernels' block reductions (kmath.h's trees, in shared memory)
// the launch-error check, and programmatic dependent launches (Hopper's griddepcontrol: a kernel launched as a
// dependent of the one before it starts while that one finishes, and waits for it before reading its output).
// Included by .cu files only.
#ifndef SEPAL_CUDA_LAUNCH_CUH
#define SEPAL_CUDA_LAUNCH_CUH

#include <utility>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda_backend.h"
#include "kernels.h"
#include "kmath.h"

namespace spk {

constexpr int kThreads = 256; // elementwise kernels' block size
constexpr long kMaxGrid = 65535;

// Blocks for n elements with grid-stride loops beyond kMaxGrid blocks.
inline int grid_for(long n)
{
    long b = (n + kThreads - 1) / kThreads;
    return (int)(b < 1 ? 1 : b < kMaxGrid ? b : kMaxGrid);
}

inline cudaStream_t stream_of(sp_cuda *cu) { return (cudaStream_t)sp_cuda_stream(cu); }

// The launch's error (a bad configuration shows at once; a fault inside the kernel at the next sync).
inline sp_status launched(sp_err *err, const char *what) { return sp_cuda_error(err, (int)cudaGetLastError(), what); }

// sp_km_tree_sum / sp_km_tree_max over the block's threads (blockDim.x a power of two <= 1024), every thread
// getting the result; sh holds blockDim.x floats and may be reused after the call.
__device__ inline float block_sum(float v, float *sh)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s)
            sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}

__device__ inline float block_max(float v, float *sh)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s)
            sh[threadIdx.x] = sh[threadIdx.x + s] > sh[threadIdx.x] ? sh[threadIdx.x + s] : sh[threadIdx.x];
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}

// Row blockIdx.x (of C) of a norm's backward to its input: dx = res + norm'(x)^T dy (RMSNorm when rms: w, rstd;
// LayerNorm: w or NULL, mean, rstd), kmath's arithmetic and trees; dxh = dx in bf16 when given. res may be dx (each
// thread reads it only where it writes: the gradient added in place). sh: blockDim.x floats of shared memory.
__device__ inline void norm_bwd_row(float *dx, __nv_bfloat16 *dxh, const float *res, const float *dy, const float *x,
                                    const float *w, const float *mean, const float *rstd, int C, int rms, float *sh)
{
    int tid = threadIdx.x, nt = blockDim.x;
    long off = (long)blockIdx.x * C;
    const float *xr = x + off, *g = dy + off;
    float r = rstd[blockIdx.x], m = 0.0f, k = 0.0f, gmean = 0.0f, gxmean = 0.0f;
    if (rms) {
        k = sp_km_rmsnorm_k(r, block_sum(sp_km_dot3_part(g, w, xr, C, tid, nt), sh), C);
    } else {
        float gs, gxs;
        m = mean[blockIdx.x];
        sp_km_layernorm_bwd_part(g, xr, w, m, r, C, tid, nt, &gs, &gxs);
        gmean = block_sum(gs, sh) / (float)C, gxmean = block_sum(gxs, sh) / (float)C;
    }
    for (int c = tid; c < C; c += nt) {
        float v = res[off + c];
        v += rms ? sp_km_rmsnorm_dx(xr[c], w[c], g[c], r, k)
                 : sp_km_layernorm_dx(xr[c], g[c], w ? w[c] : 1.0f, m, r, gmean, gxmean);
        dx[off + c] = v;
        if (dxh)
            dxh[off + c] = __float2bfloat16_rn(v);
    }
}

// Programmatic dependent launches. A kernel launched with pdl 1 (launch below) must call pdl_wait() in every block
// before it reads what an earlier kernel wrote or writes anything an earlier kernel reads; before that it may read
// only what no kernel writes (weights). pdl_trigger() lets the next kernel launch now (it still waits for this one
// to finish before reading). Both do nothing before sm_90 or where no launch asked for it.
__device__ __forceinline__ void pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// This block's share of pf's ranges asked of L2 (kernels.h's sp_cuda_pf; thread 0, in pieces of at most 1 MiB):
// weights, which no kernel writes, so before pdl_wait() too. Nothing before sm_90.
__device__ __forceinline__ void prefetch_share(const sp_cuda_pf &pf)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr size_t kPiece = 1u << 20;
    if (threadIdx.x != 0)
        return;
    for (int i = 0; i < 3; i++) {
        size_t n = pf.n[i] & ~(size_t)15;
        if (!pf.p[i] || !n)
            continue;
        size_t share = ((n + gridDim.x - 1) / gridDim.x + 15) & ~(size_t)15;
        size_t lo = (size_t)blockIdx.x * share, hi = lo + share < n ? lo + share : n;
        for (size_t at = lo; at < hi; at += kPiece) {
            unsigned len = (unsigned)(hi - at < kPiece ? hi - at : kPiece);
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"((const char *)pf.p[i] + at), "r"(len)
                         : "memory");
        }
    }
#else
    (void)pf;
#endif
}

// kernel<<<grid, block, shm, s>>>(args...), as a programmatic dependent of the stream's previous kernel when pdl.
template <typename... KArgs, typename... Args>
cudaError_t launch(bool pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t shm, cudaStream_t s,
                   Args &&...args)
{
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = shm, cfg.stream = s;
    cfg.attrs = pdl ? at : nullptr, cfg.numAttrs = pdl ? 1 : 0;
    cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
    if (e != cudaSuccess)
        cudaGetLastError(); // returned here; not left for the next launch's check
    return e;
}

// Whether kernel's machine code waits where pdl_wait() stands: built for sm_90 or later and running on such a
// device (a kernel built for older chips and run on Hopper would not wait: it must not be launched with pdl).
template <typename... KArgs> bool pdl_able(void (*kernel)(KArgs...))
{
    cudaFuncAttributes fa;
    int d = 0, major = 0;
    if (cudaGetDevice(&d) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) ||
        cudaFuncGetAttributes(&fa, kernel) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return major >= 9 && fa.binaryVersion >= 90;
}

} // namespace spk

// for (long i = ...; i < n; i += ...) over the grid's threads
#define SPK_GRID_LOOP(i, n)                                                                                  \
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long)gridDim.x * blockDim.x)

#endif
