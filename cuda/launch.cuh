// launch.cuh - internal to cuda/: grid sizes, the kernels' block reductions (kmath.h's trees, in shared memory)
// and the launch-error check. Included by .cu files only.
#ifndef SEPAL_CUDA_LAUNCH_CUH
#define SEPAL_CUDA_LAUNCH_CUH

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

} // namespace spk

// for (long i = ...; i < n; i += ...) over the grid's threads
#define SPK_GRID_LOOP(i, n)                                                                                  \
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long)gridDim.x * blockDim.x)

#endif
