/* cuda_backend.h - the CUDA device as sepal uses it: a context (one device, one stream, a cuBLAS handle, a
 * growable workspace and a small error-flag buffer), device buffers, copies, and CUDA's errors as sp_status.
 *
 * Every call returns an sp_status and fills err; nothing aborts. CUDA's codes map to sepal's (sp_cuda_error):
 * out of memory -> SP_ERR_NOMEM, an invalid argument -> SP_ERR_ARG, no driver / no device / no kernel image for
 * this GPU -> SP_ERR_UNSUPPORTED, anything else (a launch failure, an illegal address: the context is lost)
 * -> SP_ERR_STATE. On a machine without a usable GPU sp_cuda_open fails with SP_ERR_UNSUPPORTED and says why.
 *
 * Kernels (kernels.h) and GEMMs (gemm.h) are queued on the context's stream and return at once: a fault inside
 * one surfaces at the next sp_cuda_sync or copy out. Every kernel has a CPU reference in core/ and shares its
 * arithmetic with a host harness through kmath.h. */
#ifndef SEPAL_CUDA_BACKEND_H
#define SEPAL_CUDA_BACKEND_H

#include <stddef.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable GPUs (0 when there is no driver or device); `why` gets the runtime's reason. */
int sp_cuda_device_count(char *why, int cap);
/* Device name of GPU 0, or "" */
void sp_cuda_device_name(char *name, int cap);

/* CUDA runtime error `code` (a cudaError_t) from the step `what` as an sp_status and a message
 * "cuda: WHAT: <the runtime's text> (<its name>)". */
sp_status sp_cuda_error(sp_err *err, int code, const char *what);
/* The same for a cuBLAS status (a cublasStatus_t): "cublas: WHAT: <text>". */
sp_status sp_cublas_error(sp_err *err, int code, const char *what);

typedef struct sp_cuda sp_cuda;

/* Opens device `device` (0-based): a stream, a cuBLAS handle bound to it, no workspace yet. */
sp_status sp_cuda_open(sp_cuda **out, int device, sp_err *err);
/* Waits for the stream, then frees everything the context allocated (NULL: nothing). */
void sp_cuda_close(sp_cuda *cu);
/* Waits for everything queued; a fault of an earlier kernel is reported here. */
sp_status sp_cuda_sync(sp_cuda *cu, sp_err *err);
/* The context's stream (a cudaStream_t) and cuBLAS handle (a cublasHandle_t; NULL without cuBLAS). */
void *sp_cuda_stream(const sp_cuda *cu);
void *sp_cuda_cublas(const sp_cuda *cu);
/* The device's name and memory (free and total bytes now). */
const char *sp_cuda_name(const sp_cuda *cu);
/* The CUDA profiler's collection on (1) or off (0) for this process (a profiler started with its collection off,
 * e.g. ncu --profile-from-start off, sees only what runs between); nothing without a profiler. */
void sp_cuda_profile(int on);
sp_status sp_cuda_meminfo(sp_cuda *cu, size_t *free_bytes, size_t *total_bytes, sp_err *err);

/* Device buffers (bytes > 0; freeing NULL does nothing). */
sp_status sp_cuda_alloc(sp_cuda *cu, void **p, size_t bytes, sp_err *err);
void sp_cuda_free(sp_cuda *cu, void *p);
/* Copies on the context's stream; they return when the copy is done (host memory need not be pinned). */
sp_status sp_cuda_upload(sp_cuda *cu, void *dst, const void *src, size_t bytes, sp_err *err);
sp_status sp_cuda_download(sp_cuda *cu, void *dst, const void *src, size_t bytes, sp_err *err);
/* A device-to-device copy queued on the stream (returns at once). */
sp_status sp_cuda_copy_d2d(sp_cuda *cu, void *dst, const void *src, size_t bytes, sp_err *err);
/* A buffer of bytes holding a copy of src (sp_cuda_alloc + sp_cuda_upload; freed on failure). */
sp_status sp_cuda_dup(sp_cuda *cu, void **p, const void *src, size_t bytes, sp_err *err);
sp_status sp_cuda_zero(sp_cuda *cu, void *p, size_t bytes, sp_err *err);

/* The workspace: at least `bytes` of device scratch, grown (after a sync) when smaller; valid until the next
 * sp_cuda_workspace call. A kernel that needs scratch takes it from here; callers reserve once per shape. */
sp_status sp_cuda_workspace(sp_cuda *cu, size_t bytes, void **p, sp_err *err);

/* The context's error flag (one int on the device): kernels that meet bad input (a token id outside the
 * vocabulary) set it; sp_cuda_flag_take syncs, returns it in *flag and clears it. */
int *sp_cuda_flag(sp_cuda *cu);
sp_status sp_cuda_flag_take(sp_cuda *cu, int *flag, sp_err *err);

#ifdef __cplusplus
}
#endif
#endif
