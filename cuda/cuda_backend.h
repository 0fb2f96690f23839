/* cuda_backend.h - CUDA side of the engine. Every kernel here has a CPU reference in core/ops and a
 * Check test (tests/test_cuda.c) comparing the two; on a machine without a GPU the calls report
 * SP_ERR_UNSUPPORTED and the tests skip. */
#ifndef SEPAL_CUDA_BACKEND_H
#define SEPAL_CUDA_BACKEND_H

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable GPUs (0 when there is no driver or device); `why` gets the runtime's reason. */
int sp_cuda_device_count(char *why, int cap);
/* Device name of GPU 0, or "" */
void sp_cuda_device_name(char *name, int cap);

/* out[N,C] = inp * rsqrt(mean(inp^2) + eps) * w, host pointers (copies in and out). */
sp_status sp_cuda_rmsnorm_forward(float *out, const float *inp, const float *w, int N, int C, float eps, sp_err *err);

#ifdef __cplusplus
}
#endif
#endif
