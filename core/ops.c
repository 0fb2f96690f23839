/* ops.c - instantiates the CPU reference ops for float (compute) and double (finite-difference tests). */
#define SP_OPS_NO_SHORT_NAMES
#include "ops.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

long sp_attention_probs_size(const sp_attn_dims *d)
{
    return d->keep_probs ? (long)d->B * d->nh * d->T * d->S : (long)d->T * d->S;
}

long sp_attention_scratch_size(const sp_attn_dims *d) { return (long)d->T * d->S; }

void sp_alibi_slopes(float *slopes, int nh)
{
    int n = 1;
    while (n * 2 <= nh)
        n *= 2;
    for (int i = 0; i < n; i++)
        slopes[i] = (float)pow(2.0, -8.0 * (i + 1) / n);
    for (int i = 0; i < nh - n; i++)
        slopes[n + i] = (float)pow(2.0, -4.0 * (2 * i + 1) / n);
}

#define REAL float
#define SFX _f32
#define GEMM cblas_sgemm
#define GEMV cblas_sgemv
#define SQRT sqrtf
#define EXP expf
#define VEXP sp_expf_vec
#define LOG logf
#define VERF sp_erff_vec
#include "ops_impl.h"
#undef REAL
#undef SFX
#undef GEMM
#undef GEMV
#undef SQRT
#undef EXP
#undef VEXP
#undef LOG
#undef VERF

#define REAL double
#define SFX _f64
#define GEMM cblas_dgemm
#define GEMV cblas_dgemv
#define SQRT sqrt
#define EXP exp
#define VEXP exp
#define LOG log
#define VERF erf
#include "ops_impl.h"
