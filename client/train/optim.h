/* optim.h - optimisers for the client's local parameters: AdamW (decoupled weight decay), a linear
 * warmup/decay schedule, gradient clipping by global norm, and fp16 mixed precision with dynamic loss
 * scaling over fp32 master parameters. The update runs on CUDA when a GPU is present (cuda/optim.cu), on the
 * CPU otherwise; both follow the same formulas (the CPU path is the specification). */
#ifndef SEPAL_OPTIM_H
#define SEPAL_OPTIM_H

#include <stdint.h>

#include "autograd.h"
#include "status.h"

typedef struct sp_adamw_opts {
    float lr, beta1, beta2, eps, weight_decay;
    int warmup_steps, total_steps; /* lr: linear 0 -> lr over warmup, then linear to 0 at total (0: constant) */
    float clip_norm;               /* clip the global grad norm to this (0: off) */
    int fp16;                      /* mixed precision: fp16 compute copies, dynamic loss scaling */
    float loss_scale, scale_growth, scale_backoff;
    int growth_interval;
    int device;                    /* -1 auto (CUDA if present), 0 CPU, 1 CUDA */
} sp_adamw_opts;

void sp_adamw_opts_default(sp_adamw_opts *o); /* lr 1e-3, betas 0.9/0.999, eps 1e-8, wd 0.01, scale 65536,
                                                 growth 2, backoff 0.5, interval 2000, device -1 */

typedef struct sp_optim sp_optim;

/* Parameters: leaves of a graph (their .grad is read, .data updated). */
sp_status sp_optim_new(sp_optim **out, sp_t **params, int n, const sp_adamw_opts *o, sp_err *err);
void sp_optim_free(sp_optim *opt);
/* The scale the loss must be multiplied by before backward (1 without fp16). */
float sp_optim_loss_scale(const sp_optim *opt);
/* Unscale, check for inf/nan (fp16: skip the step and back the scale off), clip, AdamW update, schedule,
 * zero the grads. *skipped = 1 when the step was skipped; *grad_norm gets the (unscaled) global norm. */
sp_status sp_optim_step(sp_optim *opt, int *skipped, float *grad_norm, sp_err *err);
float sp_optim_lr(const sp_optim *opt); /* the lr the next step uses */
int sp_optim_on_cuda(const sp_optim *opt);

/* The bare update, for tests comparing devices: one AdamW step on n values at step t (1-based). */
void sp_adamw_update_cpu(float *p, const float *g, float *m, float *v, int64_t n, float lr, float b1, float b2,
                         float eps, float wd, int t);

/* ---------------------------------------------------------------------------------------------------------
 * Conventions (the CPU code is the specification; cuda/optim.cu does the same float operations in the same
 * order, without FMA contraction, so the two agree to the last bit except for the order of the global-norm sum):
 *
 * AdamW, per parameter, as torch.optim.AdamW (amsgrad off, maximize off):
 *     t += 1
 *     p  = p * (1 - lr*wd)                                  decoupled weight decay, with the scheduled lr
 *     m  = b1*m + (1-b1)*g
 *     v  = b2*v + (1-b2)*g*g
 *     p  = p - (lr / (1 - b1^t)) * (m / (sqrt(v) / sqrt(1 - b2^t) + eps))
 *   i.e. p -= lr * mhat / (sqrt(vhat) + eps) with mhat = m/(1-b1^t), vhat = v/(1-b2^t), arranged like torch.
 *   The scalar factors (1 - lr*wd, lr/(1-b1^t), sqrt(1-b2^t), 1-b1, 1-b2) are computed in double, then
 *   rounded to float; the per-element work is float. A parameter whose .grad is NULL at a step is left
 *   alone (no decay, no moment update, its t does not advance), as torch does for grad None.
 *
 * Schedule (transformers' get_linear_schedule_with_warmup convention): s = the number of updates applied
 * so far (0-based; skipped steps do not count). The step with index s uses
 *     lr * s / warmup                                       for s < warmup
 *     lr * max(0, total - s) / max(1, total - warmup)       for s >= warmup, when total > 0
 *     lr                                                    for s >= warmup, when total == 0
 *   So with warmup > 0 the first update uses lr 0 (moments still advance), exactly like transformers.
 *
 * Clipping (torch.nn.utils.clip_grad_norm_): norm = sqrt(sum over all grads of g^2) (summed in double, then
 *   rounded to float); coef = clip / (norm + 1e-6) (float); when coef < 1 every grad is multiplied by coef.
 *   The reported grad_norm is the norm before clipping (after unscaling).
 *
 * Non-finite grads / dynamic loss scaling (torch.cuda.amp.GradScaler): with fp16 the grads are first
 *   multiplied by 1/scale. If any grad is inf or nan the update is skipped (params, moments, t and the
 *   schedule untouched), *skipped = 1, *grad_norm = INFINITY, the grads are zeroed, scale *= backoff and the
 *   growth counter resets; otherwise after growth_interval consecutive applied steps scale *= growth.
 *   Without fp16 a non-finite grad also skips the step (the scale stays 1) rather than poisoning the params.
 *
 * CUDA: the master params, grads, m and v live in device buffers. Each step uploads .data and .grad (so
 * host edits of .data between steps are honoured), runs the kernels (unscale + finite check + sum of squares
 * in one reduction, then the clipped AdamW update) and downloads .data, so the host sp_t mirrors the device
 * after every step. m and v stay on the device. */

/* Whether the optimizer can run on CUDA here: 1, or 0 with why ("no usable GPU: ...", "this sepal was built
 * without CUDA"). A device 1 (CUDA) optimizer where it cannot: "CUDA was asked for, but no usable GPU: ...". */
int sp_optim_cuda_usable(char *why, size_t cap);

/* Number of parameters, and a parameter's step count (0 before its first update). */
int sp_optim_nparams(const sp_optim *opt);
int sp_optim_param_steps(const sp_optim *opt, int idx);
/* An fp16 copy (IEEE binary16, round to nearest even) of parameter idx's fp32 master values, for compute:
 * dst has room for params[idx]->n values. SP_ERR_ARG for a bad idx. */
sp_status sp_optim_fp16_copy(const sp_optim *opt, int idx, uint16_t *dst);

/* torch.nn.utils.clip_grad_norm_ over the params' grads (NULL grads ignored): returns the global norm before
 * clipping and scales the grads in place when it exceeds max_norm (max_norm <= 0: only measures). */
float sp_clip_grad_norm(sp_t **params, int n, float max_norm);
/* The clip coefficient applied to grads with global norm `norm` (1 when no clipping is due). */
float sp_clip_coef(float norm, float max_norm);
/* Bare pieces of a step, for the device tests: g *= inv_scale (skipped when inv_scale == 1), returns 1 if any
 * result is inf/nan; and the sum of squares in double. */
int sp_unscale_check_cpu(float *g, int64_t n, float inv_scale);
double sp_sumsq_cpu(const float *g, int64_t n);


/* Resident on the device (the client's local parts on the GPU, devparts.h): the params' values are uploaded now and
 * stay in the CUDA buffers, the grads are written there by the device's ops (the host .grad is not read), a step
 * updates every parameter and zeroes the device grads, and nothing is copied back until sp_optim_to_host.
 * SP_ERR_STATE for an optimizer on the CPU. */
sp_status sp_optim_make_resident(sp_optim *opt, sp_err *err);
/* Param idx's values (grad 0) or gradient (grad 1) on the device; NULL on the CPU. */
float *sp_optim_device_buf(sp_optim *opt, int idx, int grad);
/* The params' host .data to the device (after the host changed them: a load), and back (resident only). */
sp_status sp_optim_to_device(sp_optim *opt, sp_err *err);
sp_status sp_optim_to_host(sp_optim *opt, sp_err *err);

#endif
