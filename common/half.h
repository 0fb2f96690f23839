/* half.h - scalar f16 / bf16 <-> f32 conversions (IEEE binary16 and bfloat16), round to nearest even. */
#ifndef SEPAL_HALF_H
#define SEPAL_HALF_H

#include <stdint.h>

float sp_f16_to_f32(uint16_t h);
uint16_t sp_f32_to_f16(float f);  /* round to nearest even, overflow to inf */
float sp_bf16_to_f32(uint16_t h);
uint16_t sp_f32_to_bf16(float f); /* round to nearest even, NaN preserved */

#endif
