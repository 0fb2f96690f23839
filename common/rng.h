/* rng.h - deterministic xorshift64* generator for initialisation, sampling and test data. Never rand(). */
#ifndef SEPAL_RNG_H
#define SEPAL_RNG_H

#include <stdint.h>

typedef struct sp_rng {
    uint64_t state;
} sp_rng;

void sp_rng_seed(sp_rng *r, uint64_t seed);
uint32_t sp_rng_u32(sp_rng *r);
float sp_rng_f32(sp_rng *r);            /* uniform in [0, 1) */
float sp_rng_normal(sp_rng *r);         /* standard normal (Box-Muller) */
void sp_rng_fill_uniform(sp_rng *r, float *x, long n, float lo, float hi);
void sp_rng_fill_normal(sp_rng *r, float *x, long n, float std);
/* n values of nearly normal(0, std), fast: each the sum of four 16-bit uniforms (two draws; Irwin-Hall), centred
 * and scaled to std, so bounded at +-3.46 std, as a truncated-normal initialiser is. For filling large tensors
 * (`model init`), where Box-Muller's logarithm and cosine would cost more than writing them out. */
void sp_rng_fill_normal_fast(sp_rng *r, float *x, long n, float std);
/* A fresh seed for a run that was given none (from the kernel, else the clock and the pid), in [0, 2^63): a
 * value `--seed` accepts, so that printing it lets the run be repeated. */
uint64_t sp_rng_fresh_seed(void);
/* The largest seed the `--seed` options and the `seed` setting take: 2^63 - 1 (as their double bound, 2^63;
 * strtoll saturates there), so that every fresh seed is one. */
#define SP_RNG_SEED_MAX 9223372036854775807.0

#endif
