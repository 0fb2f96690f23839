/* test_dtype.c - f16/bf16 conversions: exact values, rounding, specials, and names. */
#include <math.h>
#include <stdint.h>

#include "dtype.h"
#include "rng.h"
#include "testutil.h"

START_TEST(t_f16_values)
{
    ck_assert_uint_eq(sp_f32_to_f16(1.0f), 0x3c00);
    ck_assert_uint_eq(sp_f32_to_f16(-2.0f), 0xc000);
    ck_assert_uint_eq(sp_f32_to_f16(65504.0f), 0x7bff);   /* largest finite */
    ck_assert_uint_eq(sp_f32_to_f16(65520.0f), 0x7c00);   /* rounds to inf */
    ck_assert_uint_eq(sp_f32_to_f16(5.9604645e-8f), 0x0001); /* smallest subnormal */
    ck_assert_uint_eq(sp_f32_to_f16(1.0f + 1.0f / 2048), 0x3c00); /* tie to even: down */
    ck_assert_uint_eq(sp_f32_to_f16(1.0f + 3.0f / 2048), 0x3c02); /* tie to even: up */
    ck_assert(isnan(sp_f16_to_f32(sp_f32_to_f16(NAN))));
    ck_assert(isinf(sp_f16_to_f32(0xfc00)) && sp_f16_to_f32(0xfc00) < 0);
    ck_assert_float_eq(sp_f16_to_f32(0x0001), 5.9604645e-8f);
    ck_assert_float_eq(sp_f16_to_f32(0x3555), 0.333251953125f);
}
END_TEST

START_TEST(t_f16_roundtrip_all)
{
    /* every finite f16 survives f16 -> f32 -> f16 */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00)
            continue;
        ck_assert_uint_eq(sp_f32_to_f16(sp_f16_to_f32((uint16_t)h)), h);
    }
}
END_TEST

START_TEST(t_bf16)
{
    ck_assert_uint_eq(sp_f32_to_bf16(1.0f), 0x3f80);
    ck_assert_float_eq(sp_bf16_to_f32(0x3f80), 1.0f);
    ck_assert_uint_eq(sp_f32_to_bf16(1.00390625f), 0x3f80); /* halfway: to even */
    ck_assert_uint_eq(sp_f32_to_bf16(1.01171875f), 0x3f82);
    ck_assert(isnan(sp_bf16_to_f32(sp_f32_to_bf16(NAN))));
    sp_rng r;
    sp_rng_seed(&r, 3);
    for (int i = 0; i < 10000; i++) { /* relative error <= 2^-9 */
        float x = sp_rng_normal(&r) * 100.0f;
        float y = sp_bf16_to_f32(sp_f32_to_bf16(x));
        ck_assert_float_le(fabsf(x - y), fabsf(x) / 256.0f);
    }
}
END_TEST

START_TEST(t_names_and_convert)
{
    sp_dtype t;
    ck_assert_int_eq(sp_dtype_from_name("BF16", &t), 0);
    ck_assert_int_eq(t, SP_BF16);
    ck_assert_int_eq(sp_dtype_from_name("Q4_K", &t), -1);
    ck_assert_uint_eq(sp_dtype_size(SP_I64), 8);
    float src[3] = {0.5f, -1.25f, 3.0f}, dst[3];
    uint16_t half[3];
    sp_err err = {0};
    ck_assert_int_eq(sp_from_f32(half, src, SP_F16, 3, &err), SP_OK);
    ck_assert_int_eq(sp_to_f32(dst, half, SP_F16, 3, &err), SP_OK);
    ck_assert_mem_eq(dst, src, sizeof src);
    ck_assert_int_eq(sp_to_f32(dst, half, SP_I32, 3, &err), SP_ERR_UNSUPPORTED);
}
END_TEST

static Suite *dtype_suite(void)
{
    Suite *s = suite_create("dtype");
    TCase *tc = tcase_create("dtype");
    tcase_add_test(tc, t_f16_values);
    tcase_add_test(tc, t_f16_roundtrip_all);
    tcase_add_test(tc, t_bf16);
    tcase_add_test(tc, t_names_and_convert);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return sp_test_run(dtype_suite()); }
