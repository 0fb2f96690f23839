#include "half.h"

#include <math.h>
#include <string.h>

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
