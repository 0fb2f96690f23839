// cuda_backend.cu - the device context, buffers, copies and the mapping of CUDA's errors (cuda_backend.h).
#include "cuda_backend.h"

#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <stdio.h>

#include <new>

#ifdef SEPAL_HAVE_CUBLAS
#include <cublas_v2.h>
#endif

struct sp_cuda {
    int device;
    cudaStream_t stream;
    void *cublas;      // cublasHandle_t when built with cuBLAS
    void *ws;          // workspace
    size_t ws_bytes;
    int *flag;         // one int: set by kernels on bad input
    char name[256];
};

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

static sp_status status_of(cudaError_t e)
{
    switch (e) {
    case cudaErrorMemoryAllocation: return SP_ERR_NOMEM;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidMemcpyDirection:
    case cudaErrorInvalidConfiguration: return SP_ERR_ARG;
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorNotSupported: return SP_ERR_UNSUPPORTED;
    default: return SP_ERR_STATE;
    }
}

extern "C" sp_status sp_cuda_error(sp_err *err, int code, const char *what)
{
    cudaError_t e = (cudaError_t)code;
    if (e == cudaSuccess)
        return SP_OK;
    return sp_errf(err, status_of(e), "cuda: %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

extern "C" sp_status sp_cublas_error(sp_err *err, int code, const char *what)
{
#ifdef SEPAL_HAVE_CUBLAS
    cublasStatus_t s = (cublasStatus_t)code;
    if (s == CUBLAS_STATUS_SUCCESS)
        return SP_OK;
    sp_status st = s == CUBLAS_STATUS_ALLOC_FAILED                                   ? SP_ERR_NOMEM
                   : s == CUBLAS_STATUS_INVALID_VALUE                                ? SP_ERR_ARG
                   : s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_ARCH_MISMATCH ||
                           s == CUBLAS_STATUS_NOT_INITIALIZED                        ? SP_ERR_UNSUPPORTED
                                                                                     : SP_ERR_STATE;
    return sp_errf(err, st, "cublas: %s: %s", what, cublasGetStatusString(s));
#else
    return code == 0 ? SP_OK : sp_errf(err, SP_ERR_UNSUPPORTED, "cublas: %s: not built with cuBLAS", what);
#endif
}

// Returns sp_cuda_error's status from the enclosing function when the call fails.
#define CU_TRY(call, what)                                                                                   \
    do {                                                                                                     \
        cudaError_t e_ = (call);                                                                             \
        if (e_ != cudaSuccess)                                                                               \
            return sp_cuda_error(err, (int)e_, what);                                                        \
    } while (0)

static sp_status open_parts(sp_cuda *cu, sp_err *err)
{
    char why[200];
    int n = sp_cuda_device_count(why, (int)sizeof why);
    if (n <= 0)
        return sp_errf(err, SP_ERR_UNSUPPORTED, "cuda: no usable GPU (%s)", why);
    if (cu->device < 0 || cu->device >= n)
        return sp_errf(err, SP_ERR_ARG, "cuda: no device %d (%d device(s): cuda:0 .. cuda:%d)", cu->device, n,
                       n - 1);
    cudaDeviceProp p;
    CU_TRY(cudaSetDevice(cu->device), "select device");
    CU_TRY(cudaGetDeviceProperties(&p, cu->device), "device properties");
    snprintf(cu->name, sizeof cu->name, "%s", p.name);
    CU_TRY(cudaStreamCreateWithFlags(&cu->stream, cudaStreamNonBlocking), "create stream");
    CU_TRY(cudaMalloc((void **)&cu->flag, sizeof(int)), "error flag");
    CU_TRY(cudaMemsetAsync(cu->flag, 0, sizeof(int), cu->stream), "error flag");
#ifdef SEPAL_HAVE_CUBLAS
    cublasHandle_t h = NULL;
    cublasStatus_t s = cublasCreate(&h);
    if (s != CUBLAS_STATUS_SUCCESS)
        return sp_cublas_error(err, (int)s, "create handle");
    cu->cublas = h;
    s = cublasSetStream(h, cu->stream);
    if (s == CUBLAS_STATUS_SUCCESS) // fp32 GEMMs stay fp32 (no TF32): results comparable with the CPU's
        s = cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
    if (s != CUBLAS_STATUS_SUCCESS)
        return sp_cublas_error(err, (int)s, "configure handle");
#endif
    return SP_OK;
}

extern "C" sp_status sp_cuda_open(sp_cuda **out, int device, sp_err *err)
{
    *out = NULL;
    sp_cuda *cu = new (std::nothrow) sp_cuda();
    if (!cu)
        return sp_errf(err, SP_ERR_NOMEM, "cuda: out of memory for the context");
    cu->device = device;
    sp_status st = open_parts(cu, err);
    if (st != SP_OK) {
        sp_cuda_close(cu);
        return st;
    }
    *out = cu;
    return SP_OK;
}

extern "C" void sp_cuda_close(sp_cuda *cu)
{
    if (!cu)
        return;
    if (cu->stream)
        cudaStreamSynchronize(cu->stream);
#ifdef SEPAL_HAVE_CUBLAS
    if (cu->cublas)
        cublasDestroy((cublasHandle_t)cu->cublas);
#endif
    cudaFree(cu->ws);
    cudaFree(cu->flag);
    if (cu->stream)
        cudaStreamDestroy(cu->stream);
    delete cu;
}

extern "C" sp_status sp_cuda_sync(sp_cuda *cu, sp_err *err)
{
    CU_TRY(cudaStreamSynchronize(cu->stream), "kernel");
    return SP_OK;
}

extern "C" void *sp_cuda_stream(const sp_cuda *cu) { return cu->stream; }
extern "C" void *sp_cuda_cublas(const sp_cuda *cu) { return cu->cublas; }
extern "C" const char *sp_cuda_name(const sp_cuda *cu) { return cu->name; }

extern "C" void sp_cuda_profile(int on)
{
    if (on ? cudaProfilerStart() : cudaProfilerStop())
        cudaGetLastError(); // no profiler: nothing to do, no error left behind
}

extern "C" sp_status sp_cuda_meminfo(sp_cuda *cu, size_t *free_bytes, size_t *total_bytes, sp_err *err)
{
    CU_TRY(cudaSetDevice(cu->device), "select device");
    CU_TRY(cudaMemGetInfo(free_bytes, total_bytes), "memory info");
    return SP_OK;
}

extern "C" sp_status sp_cuda_alloc(sp_cuda *cu, void **p, size_t bytes, sp_err *err)
{
    *p = NULL;
    if (bytes == 0)
        return sp_errf(err, SP_ERR_ARG, "cuda: allocation of 0 bytes");
    cudaError_t e = cudaMalloc(p, bytes);
    if (e != cudaSuccess) {
        *p = NULL;
        cudaGetLastError(); // an allocation failure is not sticky: clear it
        sp_cuda_error(err, (int)e, "allocate");
        return sp_err_prefix(err, "%zu bytes on %s: ", bytes, cu->name);
    }
    return SP_OK;
}

extern "C" void sp_cuda_free(sp_cuda *cu, void *p)
{
    (void)cu;
    if (p)
        cudaFree(p);
}

static sp_status copy(sp_cuda *cu, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, const char *what,
                      sp_err *err)
{
    if (bytes == 0)
        return SP_OK;
    CU_TRY(cudaMemcpyAsync(dst, src, bytes, kind, cu->stream), what);
    CU_TRY(cudaStreamSynchronize(cu->stream), what);
    return SP_OK;
}

extern "C" sp_status sp_cuda_upload(sp_cuda *cu, void *dst, const void *src, size_t bytes, sp_err *err)
{
    return copy(cu, dst, src, bytes, cudaMemcpyHostToDevice, "copy to the device", err);
}

extern "C" sp_status sp_cuda_download(sp_cuda *cu, void *dst, const void *src, size_t bytes, sp_err *err)
{
    return copy(cu, dst, src, bytes, cudaMemcpyDeviceToHost, "copy from the device", err);
}

extern "C" sp_status sp_cuda_copy_d2d(sp_cuda *cu, void *dst, const void *src, size_t bytes, sp_err *err)
{
    CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cu->stream), "copy on the device");
    return SP_OK;
}

extern "C" sp_status sp_cuda_dup(sp_cuda *cu, void **p, const void *src, size_t bytes, sp_err *err)
{
    sp_status st = sp_cuda_alloc(cu, p, bytes, err);
    if (st == SP_OK && (st = sp_cuda_upload(cu, *p, src, bytes, err)) != SP_OK) {
        sp_cuda_free(cu, *p);
        *p = NULL;
    }
    return st;
}

extern "C" sp_status sp_cuda_zero(sp_cuda *cu, void *p, size_t bytes, sp_err *err)
{
    CU_TRY(cudaMemsetAsync(p, 0, bytes, cu->stream), "clear");
    return SP_OK;
}

extern "C" sp_status sp_cuda_workspace(sp_cuda *cu, size_t bytes, void **p, sp_err *err)
{
    if (bytes > cu->ws_bytes) {
        CU_TRY(cudaStreamSynchronize(cu->stream), "workspace"); // queued kernels may still use the old one
        cudaFree(cu->ws);
        cu->ws = NULL;
        cu->ws_bytes = 0;
        sp_status st = sp_cuda_alloc(cu, &cu->ws, bytes, err);
        if (st != SP_OK)
            return sp_err_prefix(err, "workspace: ");
        cu->ws_bytes = bytes;
    }
    *p = cu->ws;
    return SP_OK;
}

extern "C" int *sp_cuda_flag(sp_cuda *cu) { return cu->flag; }

extern "C" sp_status sp_cuda_flag_take(sp_cuda *cu, int *flag, sp_err *err)
{
    sp_status st = sp_cuda_download(cu, flag, cu->flag, sizeof(int), err);
    if (st == SP_OK)
        st = sp_cuda_zero(cu, cu->flag, sizeof(int), err);
    return st;
}
