/* optim_cuda.h - the device side of client/optim: AdamW state in flat device buffers (params, grads, m, v),
 * a fused unscale + finite check + sum-of-squares reduction, and the clipped AdamW update. The float
 * operations and their order are those of client/optim.c (no FMA contraction), so CPU and GPU agree.
 * A CUDA failure comes back as sp_cuda_error maps it (cuda_backend.h), with the runtime's reason:
 * SP_ERR_UNSUPPORTED without a GPU, SP_ERR_NOMEM when the device's memory runs out, and so on. */
#ifndef SEPAL_OPTIM_CUDA_H
#define SEPAL_OPTIM_CUDA_H

#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sp_cuda_adamw sp_cuda_adamw;

/* Device buffers for n values each of params, grads, m and v (m, v zeroed). */
sp_status sp_cuda_adamw_new(sp_cuda_adamw **out, int64_t n, sp_err *err);
void sp_cuda_adamw_free(sp_cuda_adamw *s);
/* Copies n param values (and grads; g NULL: zeros) in at offset off. */
sp_status sp_cuda_adamw_upload(sp_cuda_adamw *s, int64_t off, int64_t n, const float *p, const float *g, sp_err *err);
/* Over the whole grad buffer: g *= inv_scale (not done when inv_scale == 1); *found_inf = 1 if any result is
 * inf/nan; *sumsq = sum of g^2 in double (a deterministic two-pass reduction). */
sp_status sp_cuda_adamw_unscale_norm(sp_cuda_adamw *s, float inv_scale, int *found_inf, double *sumsq, sp_err *err);
/* AdamW on [off, off + n) at step t (1-based), each grad multiplied by gscale (the clip coefficient) first. */
sp_status sp_cuda_adamw_apply(sp_cuda_adamw *s, int64_t off, int64_t n, float gscale, float lr, float b1, float b2,
                              float eps, float wd, int t, sp_err *err);
/* Copies n param values at offset off out to p. */
sp_status sp_cuda_adamw_download(sp_cuda_adamw *s, int64_t off, int64_t n, float *p, sp_err *err);

/* The device buffers of the params and the grads (the client's local parts on the GPU write the grads there and
 * read the params, client/train/devparts.h). */
float *sp_cuda_adamw_params(sp_cuda_adamw *s);
float *sp_cuda_adamw_grads(sp_cuda_adamw *s);
/* Zeroes the whole grad buffer and waits for everything queued on the device (the updates included). */
sp_status sp_cuda_adamw_zero_grads(sp_cuda_adamw *s, sp_err *err);

/* Bare operations on host arrays (copied in and out), the counterparts of sp_adamw_update_cpu,
 * sp_unscale_check_cpu and sp_sumsq_cpu. */
sp_status sp_cuda_adamw_update(float *p, const float *g, float *m, float *v, int64_t n, float lr, float b1, float b2,
                               float eps, float wd, int t, sp_err *err);
sp_status sp_cuda_unscale_check(float *g, int64_t n, float inv_scale, int *found_inf, sp_err *err);
sp_status sp_cuda_sumsq(const float *g, int64_t n, double *sumsq, sp_err *err);

#ifdef __cplusplus
}
#endif
#endif
