// cuda_backend.cu - device query and the first kernels (CPU references live in core/ops.c).
#include "cuda_backend.h"

#include <cuda_runtime.h>
#include <stdio.h>

static sp_status cuda_fail(sp_err *err, cudaError_t e, const char *what)
{
    return sp_errf(err, SP_ERR_UNSUPPORTED, "cuda: %s: %s", what, cudaGetErrorString(e));
}

extern "C" int sp_cuda_device_count(char *why, int cap)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        if (why)
            snprintf(why, (size_t)cap, "%s", cudaGetErrorString(e));
        return 0;
    }
    if (why)
        snprintf(why, (size_t)cap, "%d device(s)", n);
    return n;
}

extern "C" void sp_cuda_device_name(char *name, int cap)
{
    cudaDeviceProp p;
    if (sp_cuda_device_count(NULL, 0) > 0 && cudaGetDeviceProperties(&p, 0) == cudaSuccess)
        snprintf(name, (size_t)cap, "%s", p.name);
    else if (cap > 0)
        name[0] = '\0';
}

// One block per row; a shared-memory tree reduction of the sum of squares.
__global__ void rmsnorm_kernel(float *out, const float *inp, const float *w, int C, float eps)
{
    extern __shared__ float partial[];
    const float *x = inp + (size_t)blockIdx.x * C;
    float *y = out + (size_t)blockIdx.x * C;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        ss += x[i] * x[i];
    partial[threadIdx.x] = ss;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
    float rstd = rsqrtf(partial[0] / (float)C + eps);
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        y[i] = x[i] * rstd * w[i];
}

extern "C" sp_status sp_cuda_rmsnorm_forward(float *out, const float *inp, const float *w, int N, int C, float eps,
                                             sp_err *err)
{
    float *d_in = NULL, *d_out = NULL, *d_w = NULL;
    size_t nb = (size_t)N * C * sizeof(float);
    cudaError_t e = cudaMalloc(&d_in, nb);
    if (e == cudaSuccess)
        e = cudaMalloc(&d_out, nb);
    if (e == cudaSuccess)
        e = cudaMalloc(&d_w, (size_t)C * sizeof(float));
    if (e == cudaSuccess)
        e = cudaMemcpy(d_in, inp, nb, cudaMemcpyHostToDevice);
    if (e == cudaSuccess)
        e = cudaMemcpy(d_w, w, (size_t)C * sizeof(float), cudaMemcpyHostToDevice);
    if (e == cudaSuccess) {
        const int threads = 256;
        rmsnorm_kernel<<<N, threads, threads * sizeof(float)>>>(d_out, d_in, d_w, C, eps);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess)
        e = cudaMemcpy(out, d_out, nb, cudaMemcpyDeviceToHost);
    cudaFree(d_in);
    cudaFree(d_out);
    cudaFree(d_w);
    return e == cudaSuccess ? SP_OK : cuda_fail(err, e, "rmsnorm_forward");
}
