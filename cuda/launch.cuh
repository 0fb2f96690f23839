// launch.cuh - internal to cuda/: grid sizes, the kernels' block reductions (kmath.h's trees, in shared memory)
// the launch-error check, and programmatic dependent launches (Hopper's griddepcontrol: a kernel launched as a
// dependent of the one before it starts while that one finishes, and waits for it before reading its output).
// Included by .cu files only.
#ifndef SEPAL_CUDA_LAUNCH_CUH
#define SEPAL_CUDA_LAUNCH_CUH

#include <utility>

#include <cuda_runtime.h>

#include "cuda_backend.h"
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
