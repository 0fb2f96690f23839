/* dtype.h - storage dtypes and conversions. Compute is always f32; f16/bf16 are storage formats. */
#ifndef SEPAL_DTYPE_H
#define SEPAL_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "half.h"
#include "status.h"

typedef enum {
    SP_F32,
    SP_F16,
    SP_BF16,
    SP_F64,
    SP_I8,
    SP_U8,
    SP_I32,
    SP_I64,
    SP_DTYPE__COUNT
} sp_dtype;

size_t sp_dtype_size(sp_dtype t);
const char *sp_dtype_name(sp_dtype t);                   /* safetensors spelling: "F32", "BF16", ... */
int sp_dtype_from_name(const char *name, sp_dtype *out); /* 0 on success, -1 if unknown */
int sp_dtype_is_float(sp_dtype t);


/* Converts n elements of a float dtype (F32/F16/BF16/F64) to f32. */
sp_status sp_to_f32(float *dst, const void *src, sp_dtype t, size_t n, sp_err *err);
/* Converts n f32 values to a float storage dtype (F32/F16/BF16). */
sp_status sp_from_f32(void *dst, const float *src, sp_dtype t, size_t n, sp_err *err);

#endif
