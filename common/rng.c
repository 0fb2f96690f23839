#include "rng.h"

#include <fcntl.h>
#include <math.h>
#include <unistd.h>

#include "timeutil.h"

void sp_rng_seed(sp_rng *r, uint64_t seed)
{
    /* splitmix64 scramble so that small seeds give well-mixed states; state must be non-zero */
    uint64_t z = seed + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    r->state = z ? z : 0x2545F4914F6CDD1Dull;
}

uint32_t sp_rng_u32(sp_rng *r)
{
    r->state ^= r->state >> 12;
    r->state ^= r->state << 25;
    r->state ^= r->state >> 27;
    return (uint32_t)((r->state * 0x2545F4914F6CDD1Dull) >> 32);
}

float sp_rng_f32(sp_rng *r)
{
    return (float)(sp_rng_u32(r) >> 8) / 16777216.0f;
}

float sp_rng_normal(sp_rng *r)
{
    float u1 = sp_rng_f32(r), u2 = sp_rng_f32(r);
    if (u1 < 1e-12f)
        u1 = 1e-12f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2);
}

void sp_rng_fill_uniform(sp_rng *r, float *x, long n, float lo, float hi)
{
    for (long i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * sp_rng_f32(r);
}

void sp_rng_fill_normal(sp_rng *r, float *x, long n, float std)
{
    for (long i = 0; i < n; i++)
        x[i] = std * sp_rng_normal(r);
}

void sp_rng_fill_normal_fast(sp_rng *r, float *x, long n, float std)
{
    /* the sum of 4 uniforms on [0, 65535] has mean 2 x 65535 and variance 4 x (65536^2 - 1) / 12 */
    const float mean = 2.0f * 65535.0f, scale = std / (65536.0f * 0.57735026919f);
    for (long i = 0; i < n; i++) {
        uint32_t a = sp_rng_u32(r), b = sp_rng_u32(r);
        float s = (float)((a & 0xffff) + (a >> 16) + (b & 0xffff) + (b >> 16));
        x[i] = (s - mean) * scale;
    }
}

uint64_t sp_rng_fresh_seed(void)
{
    uint64_t s = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, &s, sizeof s) != (ssize_t)sizeof s)
        s = (uint64_t)sp_now_ns() ^ ((uint64_t)getpid() << 32);
    if (fd >= 0)
        close(fd);
    return s & 0x7fffffffffffffffull;
}
