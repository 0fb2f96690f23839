#include "dtype.h"

#include <math.h>
#include <string.h>

static const struct {
    const char *name;
    size_t size;
    int is_float;
} dtypes[SP_DTYPE__COUNT] = {
    [SP_F32] = {"F32", 4, 1}, [SP_F16] = {"F16", 2, 1}, [SP_BF16] = {"BF16", 2, 1},
    [SP_F64] = {"F64", 8, 1}, [SP_I8] = {"I8", 1, 0},   [SP_U8] = {"U8", 1, 0},
    [SP_I32] = {"I32", 4, 0}, [SP_I64] = {"I64", 8, 0},
};

size_t sp_dtype_size(sp_dtype t) { return (unsigned)t < SP_DTYPE__COUNT ? dtypes[t].size : 0; }
const char *sp_dtype_name(sp_dtype t) { return (unsigned)t < SP_DTYPE__COUNT ? dtypes[t].name : "?"; }
int sp_dtype_is_float(sp_dtype t) { return (unsigned)t < SP_DTYPE__COUNT && dtypes[t].is_float; }

int sp_dtype_from_name(const char *name, sp_dtype *out)
{
    for (int i = 0; i < SP_DTYPE__COUNT; i++) {
        if (strcmp(name, dtypes[i].name) == 0) {
            *out = (sp_dtype)i;
            return 0;
        }
    }
    return -1;
}

/* n 16-bit values at p (unaligned, little-endian) widened by to_f32. */
static void halves_to_f32(float *dst, const unsigned char *p, size_t n, float (*to_f32)(uint16_t))
{
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        dst[i] = to_f32(h);
    }
}

sp_status sp_to_f32(float *dst, const void *src, sp_dtype t, size_t n, sp_err *err)
{
    const unsigned char *p = src;
    switch (t) {
    case SP_F32:
        memcpy(dst, src, n * 4);
        return SP_OK;
    case SP_F16:
        halves_to_f32(dst, p, n, sp_f16_to_f32);
        return SP_OK;
    case SP_BF16:
        halves_to_f32(dst, p, n, sp_bf16_to_f32);
        return SP_OK;
    case SP_F64:
        for (size_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, p + 8 * i, 8);
            dst[i] = (float)d;
        }
        return SP_OK;
    default:
        return sp_errf(err, SP_ERR_UNSUPPORTED, "cannot convert dtype %s to F32", sp_dtype_name(t));
    }
}

sp_status sp_from_f32(void *dst, const float *src, sp_dtype t, size_t n, sp_err *err)
{
    unsigned char *p = dst;
    switch (t) {
    case SP_F32:
        memcpy(dst, src, n * 4);
        return SP_OK;
    case SP_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = sp_f32_to_f16(src[i]);
            memcpy(p + 2 * i, &h, 2);
        }
        return SP_OK;
    case SP_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = sp_f32_to_bf16(src[i]);
            memcpy(p + 2 * i, &h, 2);
        }
        return SP_OK;
    default:
        return sp_errf(err, SP_ERR_UNSUPPORTED, "cannot convert F32 to dtype %s", sp_dtype_name(t));
    }
}
