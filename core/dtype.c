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

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float sp_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t sp_f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a quiet NaN */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float sp_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0) { /* zero / subnormal: man * 2^-24 */
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    if (exp == 31) /* inf / NaN */
        return bits_f32(sign | 0x7f800000u | (man << 13));
    return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t sp_f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t au = u & 0x7fffffffu;
    if (au > 0x7f800000u) /* NaN */
        return sign | 0x7e00;
    if (au >= 0x477ff000u) /* rounds to >= 65520: inf */
        return sign | 0x7c00;
    if (au < 0x38800000u) { /* below smallest normal 2^-14: subnormal, round to nearest even */
        float a = bits_f32(au);
        float scaled = a * 16777216.0f; /* a / 2^-24 */
        return sign | (uint16_t)lrintf(scaled);
    }
    uint32_t r = au + 0xfffu + ((au >> 13) & 1u);
    return sign | (uint16_t)((r - 0x38000000u) >> 13);
}

sp_status sp_to_f32(float *dst, const void *src, sp_dtype t, size_t n, sp_err *err)
{
    const unsigned char *p = src;
    switch (t) {
    case SP_F32:
        memcpy(dst, src, n * 4);
        return SP_OK;
    case SP_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = sp_f16_to_f32(h);
        }
        return SP_OK;
    case SP_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = sp_bf16_to_f32(h);
        }
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
