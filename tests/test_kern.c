/* test_kern.c - the weight encodings and the decode kernels: every level (scalar, AVX2, AVX-512 where the CPU
 * has them) against a double-precision reference on odd shapes and batch sizes; the encoders' error bounds;
 * the large batches (int8 and nf4 in the decode kernels, the rest on sgemm, split over the pool); the thread pool (every part once, nested and concurrent calls inline,
 * idle workers asleep). */
#include <cblas.h>
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kern.h"
#include "pool.h"
#include "rng.h"
#include "testutil.h"

static float *randn(sp_rng *r, size_t n, float scale)
{
    float *x = malloc(n * sizeof(float));
    sp_rng_fill_normal(r, x, (long)n, scale);
    return x;
}

/* y[b][r] = sum_c decode(W)[r][c] * X[b][c] in double, and sum |w||x| for the tolerance */
static void reference(const sp_qmat *W, const float *X, int B, double *y, double *mag)
{
    float *row = malloc((size_t)W->cols * sizeof(float));
    for (int r = 0; r < W->rows; r++) {
        sp_qmat_row(W, r, row);
        for (int b = 0; b < B; b++) {
            double s = 0, m = 0;
            for (int c = 0; c < W->cols; c++) {
                s += (double)row[c] * X[(size_t)b * W->cols + c];
                m += fabs((double)row[c] * X[(size_t)b * W->cols + c]);
            }
            y[(size_t)b * W->rows + r] = s;
            mag[(size_t)b * W->rows + r] = m;
        }
    }
    free(row);
}

/* What the integer Q8 and NF4 paths compute: x quantised by blocks of 32 (sp_q8_quantize), each block's int8
 * products (NF4: its levels as integers) summed exactly and scaled by both steps, the short last block too. */
static void reference_int(const sp_qmat *W, const float *X, int B, double *y, double *mag)
{
    int C = W->cols, nb = (C + 31) / 32;
    int8_t *xq = malloc((size_t)nb * 32), *q = malloc((size_t)C);
    float *xs = malloc((size_t)nb * sizeof(float)), *row = malloc((size_t)C * sizeof(float));
    float *ws = malloc((size_t)nb * sizeof(float));
    for (int b = 0; b < B; b++) {
        sp_q8_quantize(X + (size_t)b * C, C, xq, xs);
        for (int r = 0; r < W->rows; r++) {
            sp_qmat_int_row(W, r, q, ws);
            double s = 0, m = 0;
            for (int blk = 0; blk < nb; blk++) {
                long acc = 0;
                for (int k = 0; k < 32 && blk * 32 + k < C; k++)
                    acc += (long)q[blk * 32 + k] * xq[blk * 32 + k];
                s += (double)acc * ws[blk] * xs[blk];
            }
            sp_qmat_row(W, r, row);
            for (int c = 0; c < C; c++)
                m += fabs((double)row[c] * X[(size_t)b * C + c]);
            y[(size_t)b * W->rows + r] = s;
            mag[(size_t)b * W->rows + r] = m;
        }
    }
    free(xq), free(xs), free(row), free(q), free(ws);
}

START_TEST(t_encode_bounds)
{
    sp_rng r;
    sp_rng_seed(&r, 1);
    int rows = 7, cols = 133;
    float *w = randn(&r, (size_t)rows * cols, 0.5f), *d = malloc((size_t)cols * sizeof(float));
    w[3] = 0; /* exact zeros stay zero */
    w[cols + 5] = 1e-30f;
    sp_err err = {0};
    for (int t = 0; t < SP_W__COUNT; t++) {
        sp_qmat m;
        ck_assert_int_eq(sp_qmat_encode(&m, (sp_wtype)t, w, rows, cols, &err), SP_OK);
        ck_assert_uint_eq(sp_qmat_bytes((sp_wtype)t, rows, cols) >= (size_t)rows * cols / 2, 1);
        double worst = 0;
        for (int i = 0; i < rows; i++) {
            sp_qmat_row(&m, i, d);
            for (int c = 0; c < cols; c++) {
                float x = w[(size_t)i * cols + c];
                double e = fabs((double)d[c] - x);
                if (t == SP_W_F32)
                    ck_assert_float_eq(d[c], x);
                else if (t == SP_W_BF16) /* round to nearest: half a unit of the 8-bit mantissa */
                    ck_assert_msg(e <= fabs(x) * (1.0 / 256) + 1e-38, "bf16 %g -> %g", x, d[c]);
                else if (t == SP_W_F16) /* half a unit of the 11-bit significand (subnormals: of 2^-24) */
                    ck_assert_msg(e <= fabs(x) * (1.0 / 2048) + ldexp(1, -25), "fp16 %g -> %g", x, d[c]);
                if (x == 0)
                    ck_assert_float_eq(d[c], 0);
                worst = e > worst ? e : worst;
            }
            if (t == SP_W_Q8) /* within half a step of the block's scale */
                for (int c = 0; c < cols; c++) {
                    int b0 = c / 32 * 32, b1 = b0 + 32 < cols ? b0 + 32 : cols;
                    float amax = 0;
                    for (int k = b0; k < b1; k++)
                        amax = fmaxf(amax, fabsf(w[(size_t)i * cols + k]));
                    ck_assert(fabs((double)d[c] - w[(size_t)i * cols + c]) <= amax / 127.0 * 0.5 + 1e-7);
                }
            if (t == SP_W_NF4) /* the nearest of the 16 levels times the block's absmax */
                for (int c = 0; c < cols; c++) {
                    int b0 = c / 64 * 64, b1 = b0 + 64 < cols ? b0 + 64 : cols;
                    float amax = 0;
                    for (int k = b0; k < b1; k++)
                        amax = fmaxf(amax, fabsf(w[(size_t)i * cols + k]));
                    double best = 1e30;
                    for (int l = 0; l < 16; l++)
                        best = fmin(best, fabs((double)sp_nf4_levels[l] * amax - w[(size_t)i * cols + c]));
                    ck_assert_msg(fabs(fabs((double)d[c] - w[(size_t)i * cols + c]) - best) < 1e-6 * (amax + 1),
                                  "nf4 not the nearest level at %d", c);
                }
        }
        printf("encode %-5s: max |error| %.3g (weights N(0, 0.5))\n", sp_wtype_name((sp_wtype)t), worst);
        sp_qmat_free(&m);
    }
    ck_assert_int_ne(sp_qmat_encode(&(sp_qmat){0}, SP_W__COUNT, w, rows, cols, &err), SP_OK);
    ck_assert_int_ne(sp_qmat_encode(&(sp_qmat){0}, SP_W_Q8, w, rows, 0, &err), SP_OK);
    sp_wtype t;
    ck_assert_int_eq(sp_wtype_parse("nf4", &t), 0);
    ck_assert_int_eq(t, SP_W_NF4);
    ck_assert_int_eq(sp_wtype_parse("int8", &t), 0);
    ck_assert_int_eq(t, SP_W_Q8);
    ck_assert_int_ne(sp_wtype_parse("int4", &t), 0);
    const char *alias[][2] = {{"q8", "int8"}, {"f16", "fp16"}, {"float16", "fp16"}}; /* SP_WTYPE_ALIASES */
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(sp_wtype_parse(alias[i][0], &t), 0);
        ck_assert_str_eq(sp_wtype_name(t), alias[i][1]);
    }
    ck_assert_int_ne(sp_wtype_parse("f1", &t), 0);
    ck_assert_int_ne(sp_wtype_parse("float", &t), 0);
    free(w);
    free(d);
}
END_TEST

/* The fp16 value nearest x (ties to the even significand), computed in double: x's exponent's step (2^-24 below
 * 2^-14, the subnormals), x over it rounded half to even. */
static double nearest_f16(double x)
{
    double a = fabs(x), step = a < ldexp(1, -14) ? ldexp(1, -24) : ldexp(1, (int)floor(log2(a)) - 10);
    double q = a / step, f = floor(q), r = q - f;
    f += r > 0.5 || (r == 0.5 && fmod(f, 2) == 1);
    return copysign(f * step, x);
}

/* fp16 weights ("fp16", "f16", "float16"; value 4, after the others): each the nearest fp16 value, ties to even,
 * subnormals and 65504 included; a weight that is not finite or beyond 65504 refused, saying where and what. */
START_TEST(t_f16_encode)
{
    ck_assert_int_eq(SP_W_F16, 4); /* the others keep their numbers */
    ck_assert_str_eq(sp_wtype_name(SP_W_F16), "fp16");
    const char *names[] = {"fp16", "f16", "float16"};
    for (int i = 0; i < 3; i++) {
        sp_wtype t = SP_W_F32;
        ck_assert_int_eq(sp_wtype_parse(names[i], &t), 0);
        ck_assert_int_eq(t, SP_W_F16);
    }
    sp_wtype t;
    ck_assert_int_ne(sp_wtype_parse("half", &t), 0);
    ck_assert_uint_eq(sp_qmat_bytes(SP_W_F16, 3, 5), 30);
    const float u = 1.0f / 2048, s = 5.9604645e-8f; /* 2^-11; 2^-24, the smallest subnormal */
    float special[] = {0, -0.0f, 1, -1, 1 + u, 1 + 3 * u, 1 + u + u / 512, 65504, -65504, 65503, 65490,
                       6.1035156e-5f, 6.1035156e-5f - s / 2, s, s / 2, 3 * s / 2, s / 4, 1e-30f, 0.1f, -3.14159f, 1234.567f,
                       -0.000123f, 2047.5f, 2048.5f};
    int ns = (int)(sizeof special / sizeof *special), cols = 97, rows = 40;
    float *w = malloc((size_t)rows * cols * sizeof(float)), *d = malloc((size_t)cols * sizeof(float));
    sp_rng r;
    sp_rng_seed(&r, 21);
    for (int i = 0; i < rows * cols; i++) { /* magnitudes from 2^-27 to 2^15 */
        float e = (float)ldexp(1, -27 + (int)(sp_rng_u32(&r) % 43));
        w[i] = i < ns ? special[i] : fminf(fmaxf(sp_rng_normal(&r) * e, -65504), 65504);
    }
    sp_err err = {0};
    sp_qmat m;
    for (int lv = 0; lv < SP_ISA__COUNT; lv++) { /* (the row decoder is vectorised) */
        if (!sp_kern_supported(lv))
            continue;
        sp_kern_force(lv);
        ck_assert_msg(sp_qmat_encode(&m, SP_W_F16, w, rows, cols, &err) == SP_OK, "%s", err.msg);
        ck_assert_uint_eq(m.row_bytes, 2 * cols);
        for (int i = 0; i < rows; i++) {
            sp_qmat_row(&m, i, d);
            for (int c = 0; c < cols; c++) {
                float x = w[(size_t)i * cols + c];
                ck_assert_msg(d[c] == (float)nearest_f16(x) && signbit(d[c]) == signbit(x),
                              "%s: fp16 of %.9g is %.9g, not %.9g", sp_kern_level_name(lv), x, d[c], nearest_f16(x));
            }
        }
        sp_qmat_free(&m);
    }
    sp_kern_force(-1);
    ck_assert_float_eq(nearest_f16(1 + u), 1); /* (the reference's ties) */
    ck_assert_float_eq(nearest_f16(1 + 3 * u), 1 + 4 * u);
    ck_assert_float_eq(nearest_f16(3 * s / 2), 2 * s);
    /* out of range: where, what, nothing allocated; -65504 is in range, and bf16 holds 1e5 */
    const float bad[] = {1e5f, 65505, -7e4f, INFINITY, -INFINITY, NAN};
    float v[24];
    for (int i = 0; i < 24; i++)
        v[i] = 0.25f * (float)i;
    for (int k = 0; k < 6; k++) {
        v[8] = bad[k]; /* (1, 2) of [4, 6] */
        memset(&m, 0x55, sizeof m);
        ck_assert_int_eq(sp_qmat_encode(&m, SP_W_F16, v, 4, 6, &err), SP_ERR_ARG);
        ck_assert_ptr_null(m.q);
        char want[96];
        snprintf(want, sizeof want, "weights: [4, 6]: weight (1, 2) = %g ", (double)bad[k]);
        ck_assert_msg(strstr(err.msg, want) == err.msg, "%s", err.msg);
        ck_assert_msg(strstr(err.msg, isfinite(bad[k]) ? "beyond fp16's largest finite value 65504" : "is not finite"),
                      "%s", err.msg);
    }
    printf("fp16 refused: %s\n", err.msg);
    v[8] = 1e5f;
    ck_assert_int_eq(sp_qmat_encode(&m, SP_W_BF16, v, 4, 6, &err), SP_OK);
    sp_qmat_free(&m);
    v[8] = -65504;
    v[23] = 65504;
    ck_assert_int_eq(sp_qmat_encode(&m, SP_W_F16, v, 4, 6, &err), SP_OK);
    sp_qmat_row(&m, 3, d);
    ck_assert_float_eq(d[5], 65504);
    sp_qmat_free(&m);
    free(w), free(d);
}
END_TEST

#if defined(__x86_64__)
#include <cpuid.h>
static int cpu_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1);
}
#else
static int cpu_f16c(void) { return 0; }
#endif

/* fp16's kernels at every level are its f32 kernels on the decoded weights: the same loads converted exactly
 * (vcvtph2ps), the same accumulators and order, so the same bits, for 1 to 8 rows of X and a batch of 21 through
 * the decode kernels, widths around every vector size, with and without a tail; the scalar level (the reference)
 * too. An AVX2 CPU without F16C runs fp16 in the scalar kernel (the bits of the scalar level's f32). */
START_TEST(t_f16_kernels)
{
    static const int cols_list[] = {1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 100, 129, 300, 1000, 4099};
    sp_rng r;
    sp_rng_seed(&r, 22);
    sp_err err = {0};
    int rows = 19, Bmax = 21, levels = 0;
    for (int lv = 0; lv < SP_ISA__COUNT; lv++) {
        if (!sp_kern_supported(lv))
            continue;
        levels++;
        for (size_t ci = 0; ci < sizeof cols_list / sizeof *cols_list; ci++) {
            int cols = cols_list[ci];
            float *w = randn(&r, (size_t)rows * cols, 0.1f), *X = randn(&r, (size_t)Bmax * cols, 1.0f);
            float *dec = malloc((size_t)rows * cols * sizeof(float));
            float *y16 = malloc((size_t)Bmax * rows * sizeof(float)), *y32 = malloc((size_t)Bmax * rows * sizeof(float));
            sp_qmat h;
            ck_assert_int_eq(sp_qmat_encode(&h, SP_W_F16, w, rows, cols, &err), SP_OK);
            for (int i = 0; i < rows; i++)
                sp_qmat_row(&h, i, dec + (size_t)i * cols);
            sp_qmat f = sp_qmat_f32(dec, rows, cols);
            int plain = lv == SP_ISA_SCALAR || lv == SP_ISA_AVX512 || cpu_f16c();
            for (int B = 1; B <= Bmax; B += B < 8 ? 1 : 13) {
                sp_kern_force(plain ? lv : SP_ISA_SCALAR);
                if (B <= SP_KERN_MAX_ROWS)
                    sp_qmat_mul(&f, X, y32, B, NULL);
                else
                    sp_qmat_mul_rows(&f, X, y32, B, NULL);
                float d32 = sp_qmat_dot(&f, rows - 1, X);
                sp_kern_force(lv);
                if (B <= SP_KERN_MAX_ROWS)
                    sp_qmat_mul(&h, X, y16, B, NULL);
                else
                    sp_qmat_mul_rows(&h, X, y16, B, NULL);
                ck_assert_msg(!memcmp(y16, y32, (size_t)B * rows * sizeof(float)),
                              "%s fp16 [%d x %d] B=%d: not the bits of f32's kernel on the decoded weights",
                              sp_kern_level_name(lv), rows, cols, B);
                float d16 = sp_qmat_dot(&h, rows - 1, X);
                ck_assert_msg(!memcmp(&d16, &d32, sizeof d16), "%s fp16 [%d x %d] dot: %.9g vs %.9g",
                              sp_kern_level_name(lv), rows, cols, d16, d32);
            }
            sp_qmat_free(&h);
            free(w), free(X), free(dec), free(y16), free(y32);
        }
    }
    sp_kern_force(-1);
    printf("fp16 kernels: %d levels, each with its f32 kernel's bits\n", levels);
    ck_assert_int_gt(levels, 0);
}
END_TEST

/* Every level's kernels against the double reference, for shapes around every vector and block size. */
START_TEST(t_kernels_levels)
{
    static const int cols_list[] = {1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 96, 127, 128, 129, 288, 300, 1000};
    sp_rng r;
    sp_rng_seed(&r, 2);
    sp_err err = {0};
    sp_pool *pool = sp_pool_new(2);
    int best = sp_kern_level();
    char kern[128];
    sp_kern_describe(kern, sizeof kern);
    printf("kernels: this CPU runs %s\n", kern);
    for (int lv = 0; lv <= best; lv++) {
        if (!sp_kern_supported(lv))
            continue;
        sp_kern_force(lv);
        ck_assert_int_eq(sp_kern_level(), lv);
        for (size_t ci = 0; ci < sizeof cols_list / sizeof *cols_list; ci++) {
            int cols = cols_list[ci], rows = 37;
            float *w = randn(&r, (size_t)rows * cols, 1.0f);
            for (int t = 0; t < SP_W__COUNT; t++) {
                sp_qmat m;
                ck_assert_int_eq(sp_qmat_encode(&m, (sp_wtype)t, w, rows, cols, &err), SP_OK);
                for (int B = 1; B <= 8; B += (B < 3 ? 1 : 5)) {
                    float *X = randn(&r, (size_t)B * cols, 1.0f), *Y = malloc((size_t)B * rows * sizeof(float));
                    double *ref = malloc((size_t)B * rows * sizeof(double)), *mag = malloc((size_t)B * rows * sizeof(double));
                    int integer = sp_kern_integer((sp_wtype)t);
                    if (integer)
                        reference_int(&m, X, B, ref, mag);
                    else
                        reference(&m, X, B, ref, mag);
                    sp_qmat_mul(&m, X, Y, B, pool);
                    for (int i = 0; i < B * rows; i++)
                        ck_assert_msg(fabs(Y[i] - ref[i]) <= 1e-5 * mag[i] + 1e-6,
                                      "%s %s [%d x %d] B=%d: %g vs %g", sp_kern_level_name(lv),
                                      sp_wtype_name((sp_wtype)t), rows, cols, B, Y[i], ref[i]);
                    if (!integer)
                        ck_assert(fabs(sp_qmat_dot(&m, 5, X) - ref[5]) <= 1e-5 * mag[5] + 1e-6);
                    free(X), free(Y), free(ref), free(mag);
                }
                sp_qmat_free(&m);
            }
            free(w);
        }
    }
    sp_kern_force(-1);
    ck_assert_int_eq(sp_kern_level(), best);
    sp_pool_free(pool);
}
END_TEST

#if defined(__x86_64__) && SEPAL_KERN_OPTIMISED
/* XINUSE (xgetbv with ecx 1): bit 2, the YMM registers' upper halves, bit 6, ZMM0-15's upper halves: set while
 * they hold something, clear after a vzeroupper (where the CPU tracks it). */
static unsigned xinuse(void)
{
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(1));
    return lo;
}
#define UPPER_DIRTY ((1u << 2) | (1u << 6))

/* Whether this CPU says when the upper halves are dirty: xgetbv 1 exists (CPUID 0xD.1 EAX bit 2), an AVX write
 * sets bit 2 and a vzeroupper clears it. */
static int xinuse_tracks(void)
{
    unsigned a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0xd), "c"(1));
    if (!(a & 4) || sp_kern_level() < 1)
        return 0;
    __asm__ volatile("vpcmpeqd %%ymm0, %%ymm0, %%ymm0" ::: "xmm0");
    unsigned dirty = xinuse();
    __asm__ volatile("vzeroupper" ::: "xmm0");
    return (dirty & 4) && !(xinuse() & UPPER_DIRTY);
}
#endif

/* The vector kernels return with the vectors' upper halves clean (vzeroupper): on Intel the SSE code after them
 * (the callers', compiled for the baseline) runs several times slower while they are dirty. GCC 12 left them dirty
 * after the f32/bf16 dot products: stories15M f32 decoded at a third of its speed on an Intel Xeon (Emerald
 * Rapids), a quarter of its time in the empty tail after each row's dot product. */
START_TEST(t_upper_state_clean)
{
#if defined(__x86_64__) && !SEPAL_KERN_OPTIMISED
    printf("t_upper_state_clean: skipped (not a Release or RelWithDebInfo build: GCC places vzeroupper from -O2)\n");
#elif defined(__x86_64__)
    if (!xinuse_tracks()) {
        printf("t_upper_state_clean: skipped (this CPU does not say whether the upper halves are in use)\n");
        return;
    }
    sp_rng r;
    sp_rng_seed(&r, 9);
    sp_err err = {0};
    int best = sp_kern_level(), checked = 0;
    for (int lv = 1; lv <= best; lv++) {
        if (!sp_kern_supported(lv))
            continue;
        sp_kern_force(lv);
        for (int cols = 288; cols <= 300; cols += 12) /* no tail, a tail */
            for (int t = 0; t < SP_W__COUNT; t++) {
                int rows = 40;
                float *w = randn(&r, (size_t)rows * cols, 1.0f), *X = randn(&r, (size_t)4 * cols, 1.0f);
                float *Y = malloc((size_t)4 * rows * sizeof(float)), *dX = calloc((size_t)4 * cols, sizeof(float));
                sp_qmat m, s8;
                ck_assert_int_eq(sp_qmat_encode(&m, (sp_wtype)t, w, rows, cols, &err), SP_OK);
                ck_assert_int_eq(sp_qmat_encode(&s8, SP_W_Q8, w, rows, cols, &err), SP_OK);
                for (int B = 1; B <= 4; B += 3) {
                    sp_qmat_mul(&m, X, Y, B, NULL);
                    unsigned u = xinuse();
                    ck_assert_msg(!(u & UPPER_DIRTY), "%s %s [%d x %d] B=%d: sp_qmat_mul returned with the upper halves "
                                  "dirty (xinuse %#x)", sp_kern_level_name(lv), sp_wtype_name((sp_wtype)t), rows, cols, B, u);
                    sp_qmat_mul_rows(&m, X, Y, B, NULL);
                    ck_assert_msg(!(xinuse() & UPPER_DIRTY), "%s %s B=%d: sp_qmat_mul_rows", sp_kern_level_name(lv),
                                  sp_wtype_name((sp_wtype)t), B);
                    sp_qmat_mul_t_acc(&m, Y, dX, B, NULL);
                    ck_assert_msg(!(xinuse() & UPPER_DIRTY), "%s %s B=%d: sp_qmat_mul_t_acc", sp_kern_level_name(lv),
                                  sp_wtype_name((sp_wtype)t), B);
                    checked++;
                }
                float *approx = malloc((size_t)rows * sizeof(float));
                sp_qmat_argmax(&m, &s8, X, approx, NULL);
                free(approx);
                ck_assert_msg(!(xinuse() & UPPER_DIRTY), "%s %s: sp_qmat_argmax", sp_kern_level_name(lv),
                              sp_wtype_name((sp_wtype)t));
                sp_f32_dot_rows(w, (size_t)cols, rows, cols, X, 0.5f, Y);
                ck_assert_msg(!(xinuse() & UPPER_DIRTY), "%s: sp_f32_dot_rows", sp_kern_level_name(lv));
                sp_f32_axpy_rows(w, (size_t)cols, rows, cols, X, dX);
                ck_assert_msg(!(xinuse() & UPPER_DIRTY), "%s: sp_f32_axpy_rows", sp_kern_level_name(lv));
                sp_qmat_free(&m), sp_qmat_free(&s8);
                free(w), free(X), free(Y), free(dX);
            }
    }
    sp_kern_force(-1);
    ck_assert_int_gt(checked, 0);
#endif
}
END_TEST

/* Attention's products over cached rows (sp_f32_dot_rows: scaled q . k for every key; sp_f32_axpy_rows: the
 * probability-weighted sum of value rows, added to y) against double sums, at every level, on head sizes that
 * are not a multiple of any vector width and rows further apart than they are long (a KV cache's stride);
 * nothing outside the rows' columns or y's is read or written. */
START_TEST(t_attention_rows)
{
    static const int cols_list[] = {1, 5, 8, 16, 20, 36, 48, 64, 65, 100, 128, 130, 200, 256, 257};
    static const int rows_list[] = {1, 2, 7, 33, 300};
    sp_rng r;
    sp_rng_seed(&r, 11);
    int best = sp_kern_level();
    for (int lv = 0; lv <= best; lv++) {
        if (!sp_kern_supported(lv))
            continue;
        sp_kern_force(lv);
        for (size_t ci = 0; ci < sizeof cols_list / sizeof *cols_list; ci++)
            for (size_t ri = 0; ri < sizeof rows_list / sizeof *rows_list; ri++) {
                int cols = cols_list[ci], rows = rows_list[ri];
                size_t ld = (size_t)cols * 3 + 1;
                float *W = randn(&r, (size_t)rows * ld, 1.0f), *x = randn(&r, (size_t)cols, 1.0f);
                float *p = randn(&r, (size_t)rows, 1.0f), *y = randn(&r, (size_t)cols + 2, 1.0f);
                float *s = malloc(((size_t)rows + 1) * sizeof(float)), *y0 = malloc(((size_t)cols + 2) * sizeof(float));
                memcpy(y0, y, ((size_t)cols + 2) * sizeof(float));
                for (int k = 0; k < rows * (int)ld; k++) /* what lies between the rows must not count */
                    if ((size_t)k % ld >= (size_t)cols)
                        W[k] = NAN;
                s[rows] = 12345.0f;
                sp_f32_dot_rows(W, ld, rows, cols, x, 0.125f, s);
                sp_f32_axpy_rows(W, ld, rows, cols, p, y + 1);
                ck_assert(s[rows] == 12345.0f);
                ck_assert(y[0] == y0[0] && y[cols + 1] == y0[cols + 1]);
                for (int i = 0; i < rows; i++) {
                    double ref = 0, mag = 0;
                    for (int c = 0; c < cols; c++)
                        ref += (double)W[(size_t)i * ld + c] * x[c], mag += fabs((double)W[(size_t)i * ld + c] * x[c]);
                    ck_assert_msg(fabs(s[i] - 0.125 * ref) <= 0.125 * (1e-5 * mag + 1e-6),
                                  "%s dot [%d x %d] row %d: %g vs %g", sp_kern_level_name(lv), rows, cols, i, s[i],
                                  0.125 * ref);
                }
                for (int c = 0; c < cols; c++) {
                    double ref = y0[c + 1], mag = fabs(ref);
                    for (int i = 0; i < rows; i++)
                        ref += (double)p[i] * W[(size_t)i * ld + c], mag += fabs((double)p[i] * W[(size_t)i * ld + c]);
                    ck_assert_msg(fabs(y[c + 1] - ref) <= 1e-5 * mag + 1e-6, "%s axpy [%d x %d] col %d: %g vs %g",
                                  sp_kern_level_name(lv), rows, cols, c, y[c + 1], ref);
                }
                free(W), free(x), free(p), free(y), free(s), free(y0);
            }
    }
    sp_kern_force(-1);
}
END_TEST

/* The first maximum of y[0..n) (greedy's choice). */
static int first_max(const float *y, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (y[i] > y[b])
            b = i;
    return b;
}

/* sp_qmat_argmax (greedy's screen through the Q8 encoding) finds the argmax of the f32 product exactly: every
 * level, odd shapes, exact ties (the first wins) and near ties, one large row among many close ones; non-finite
 * input or a screen that is not Q8 of the same shape: -1 (the caller computes every row). */
START_TEST(t_argmax_screen)
{
    static const int shapes[][2] = {{1, 7}, {37, 1}, {37, 31}, {37, 33}, {1000, 288}, {500, 300}, {64, 1000}};
    sp_rng r;
    sp_rng_seed(&r, 7);
    sp_err err = {0};
    sp_pool *pool = sp_pool_new(2);
    int top = sp_kern_level(), decided = 0, trials = 0;
    for (int lv = 0; lv <= top; lv++) {
        if (!sp_kern_supported(lv))
            continue;
        sp_kern_force(lv);
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
            int rows = shapes[si][0], cols = shapes[si][1];
            float *w = randn(&r, (size_t)rows * cols, 0.1f);
            int r0 = rows / 2;
            if (rows > 3) { /* r0 + 1 a copy of r0, r0 + 2 one ulp away in one weight */
                memcpy(w + (size_t)(r0 + 1) * cols, w + (size_t)r0 * cols, (size_t)cols * sizeof(float));
                memcpy(w + (size_t)(r0 + 2) * cols, w + (size_t)r0 * cols, (size_t)cols * sizeof(float));
                w[(size_t)(r0 + 2) * cols] = nextafterf(w[(size_t)(r0 + 2) * cols], 1.0f);
            }
            sp_qmat W = sp_qmat_f32(w, rows, cols), S, B16;
            ck_assert_int_eq(sp_qmat_encode(&S, SP_W_Q8, w, rows, cols, &err), SP_OK);
            ck_assert_int_eq(sp_qmat_encode(&B16, SP_W_BF16, w, rows, cols, &err), SP_OK);
            float *y = malloc((size_t)rows * sizeof(float)), *scratch = malloc((size_t)rows * sizeof(float));
            for (int k = 0; k < 40; k++) {
                float *x = randn(&r, (size_t)cols, 1.0f);
                if (k % 4 == 1 && rows > 3) /* x along row r0: r0 and its copies lead, by a hair */
                    for (int c = 0; c < cols; c++)
                        x[c] = w[(size_t)r0 * cols + c] * 10.0f;
                if (k % 4 == 2) /* every row close: a small common part dominates */
                    for (int c = 0; c < cols; c++)
                        x[c] *= 1e-3f;
                sp_qmat_mul(&W, x, y, 1, pool);
                int want = first_max(y, rows), got = sp_qmat_argmax(&W, &S, x, scratch, pool);
                trials++;
                decided += got >= 0;
                ck_assert_msg(got == want, "%s [%d x %d] trial %d: %d, the f32 product's first maximum is %d",
                              sp_kern_level_name(lv), rows, cols, k, got, want);
                if (k == 0) {
                    ck_assert_int_eq(sp_qmat_argmax(&W, &B16, x, scratch, pool), -1);
                    ck_assert_int_eq(sp_qmat_argmax(&S, &S, x, scratch, pool), -1);
                    x[cols / 2] = NAN;
                    ck_assert_int_eq(sp_qmat_argmax(&W, &S, x, scratch, pool), -1);
                    x[cols / 2] = INFINITY;
                    ck_assert_int_eq(sp_qmat_argmax(&W, &S, x, scratch, pool), -1);
                }
                free(x);
            }
            if (rows > 3) { /* the tie itself: r0 before its copy */
                float *x = malloc((size_t)cols * sizeof(float));
                for (int c = 0; c < cols; c++)
                    x[c] = w[(size_t)r0 * cols + c];
                sp_qmat_mul(&W, x, y, 1, pool);
                int want = first_max(y, rows);
                ck_assert_int_eq(sp_qmat_argmax(&W, &S, x, scratch, pool), want);
                ck_assert_int_ne(want, r0 + 1);
                free(x);
            }
            free(y), free(scratch), free(w);
            sp_qmat_free(&S);
            sp_qmat_free(&B16);
        }
    }
    sp_kern_force(-1);
    ck_assert_int_eq(decided, trials); /* finite input: the screen always decides */
    sp_pool_free(pool);
}
END_TEST

/* sp_argmax and Q8 quantisation on the vector unit give exactly what the scalar loops give: the first maximum
 * among ties and -0/+0, NaN anywhere, short arrays; every rounding half, infinities, NaN, zero blocks. */
START_TEST(t_vector_scalar_same)
{
    sp_rng r;
    sp_rng_seed(&r, 11);
    sp_err err = {0};
    int top = sp_kern_level();
    for (int n = 1; n <= 300; n += (n < 40 ? 1 : 37)) {
        float *x = randn(&r, (size_t)n, 1.0f);
        for (int k = 0; k < 12; k++) {
            if (k == 1) /* ties everywhere: a few distinct values */
                for (int i = 0; i < n; i++)
                    x[i] = (float)((i * 7) % 3);
            if (k == 2)
                for (int i = 0; i < n; i++)
                    x[i] = i % 2 ? -0.0f : 0.0f;
            if (k >= 3 && k < 6)
                x[(k * 13) % n] = NAN;
            if (k == 6)
                x[n - 1] = INFINITY;
            if (k == 7)
                x[0] = -INFINITY;
            sp_kern_force(0);
            int want = sp_argmax(x, n);
            int scalar = 0;
            for (int i = 1; i < n; i++)
                scalar = x[i] > x[scalar] ? i : scalar;
            ck_assert_int_eq(want, scalar);
            for (int lv = 1; lv <= top; lv++) {
                if (!sp_kern_supported(lv))
                    continue;
                sp_kern_force(lv);
                ck_assert_msg(sp_argmax(x, n) == want, "%s n %d case %d: %d vs %d", sp_kern_level_name(lv), n, k,
                              sp_argmax(x, n), want);
            }
            sp_kern_force(-1);
        }
        free(x);
    }
    /* quantisation: halves (amax 127: the step is 1), random, non-finite, zero */
    int n = 32 * 6 + 5, nb = (n + 31) / 32;
    float *x = randn(&r, (size_t)n, 3.0f);
    int8_t *q0 = malloc((size_t)nb * 32), *q1 = malloc((size_t)nb * 32);
    float *s0 = malloc((size_t)nb * sizeof(float)), *s1 = malloc((size_t)nb * sizeof(float));
    for (int k = 0; k < 6; k++) {
        if (k == 1)
            for (int i = 0; i < n; i++)
                x[i] = i % 32 == 0 ? 127.0f : (float)(i % 255 - 127) + (i % 2 ? 0.5f : -0.5f);
        if (k == 2)
            x[40] = INFINITY, x[80] = -INFINITY, x[130] = NAN;
        if (k == 3)
            memset(x, 0, (size_t)n * sizeof(float));
        if (k == 4)
            for (int i = 0; i < n; i++)
                x[i] = (float)(i % 9) * 1e-40f; /* subnormals */
        sp_qmat m0, m1;
        sp_kern_force(0);
        sp_q8_quantize(x, n, q0, s0);
        ck_assert_int_eq(sp_qmat_encode(&m0, SP_W_Q8, x, 1, n, &err), SP_OK);
        for (int lv = 1; lv <= top; lv++) {
            if (!sp_kern_supported(lv))
                continue;
            sp_kern_force(lv);
            sp_q8_quantize(x, n, q1, s1);
            ck_assert_msg(!memcmp(q0, q1, (size_t)nb * 32) && !memcmp(s0, s1, (size_t)nb * sizeof(float)),
                          "quantise case %d: %s differs from scalar", k, sp_kern_level_name(lv));
            ck_assert_int_eq(sp_qmat_encode(&m1, SP_W_Q8, x, 1, n, &err), SP_OK);
            ck_assert(!memcmp(m0.q, m1.q, sp_qmat_bytes(SP_W_Q8, 1, n) - (size_t)16 * nb * sizeof(float)));
            ck_assert(!memcmp(m0.scale, m1.scale, (size_t)16 * nb * sizeof(float)));
            sp_qmat_free(&m1);
        }
        sp_kern_force(-1);
        sp_qmat_free(&m0);
    }
    free(x), free(q0), free(q1), free(s0), free(s1);
}
END_TEST

/* dX[b] = 1 + sum_r dY[b][r] decode(W)[r] in double, against what sp_qmat_mul_t_acc added to ones. */
static void check_t_acc(const sp_qmat *m, const float *dY, int B)
{
    int rows = m->rows, cols = m->cols;
    float *dX = malloc((size_t)B * cols * sizeof(float)), *row = malloc((size_t)cols * sizeof(float));
    double *want = calloc((size_t)B * cols, sizeof(double));
    for (int i = 0; i < B * cols; i++)
        dX[i] = 1.0f; /* accumulates onto what is there */
    sp_qmat_mul_t_acc(m, dY, dX, B, sp_pool_default());
    for (int i = 0; i < rows; i++) {
        sp_qmat_row(m, i, row);
        for (int b = 0; b < B; b++)
            for (int c = 0; c < cols; c++)
                want[(size_t)b * cols + c] += (double)dY[(size_t)b * rows + i] * row[c];
    }
    for (int i = 0; i < B * cols; i++)
        ck_assert_msg(fabs(dX[i] - 1.0 - want[i]) <= 1e-4 * (1 + fabs(want[i])), "%s: dX %g vs %g",
                      sp_wtype_name(m->type), dX[i] - 1.0, want[i]);
    free(dX), free(row), free(want);
}

/* Batches above 8 (a prefill), at every level, on a pool of 2 threads with OpenBLAS on one (sgemm split over the
 * pool by rows of W: 300 rows, parts of 144 and 156) and on OpenBLAS's own threads: int8 and nf4 where the level
 * runs them in integers have the decode kernels' bits (sp_qmat_mul_rows, each row as alone) and their
 * reference's; the others (sgemm, on decoded tiles but f32) are within the f32 reference's tolerance. The input
 * gradient too. */
START_TEST(t_large_batches)
{
    sp_rng r;
    sp_rng_seed(&r, 3);
    sp_err err = {0};
    int rows = 300, cols = 129, B = 21, best = sp_kern_level(), blas_was = openblas_get_num_threads();
    float *w = randn(&r, (size_t)rows * cols, 0.3f), *X = randn(&r, (size_t)B * cols, 1.0f);
    float *dY = randn(&r, (size_t)B * rows, 1.0f);
    float *Y = malloc((size_t)B * rows * sizeof(float)), *Yr = malloc((size_t)B * rows * sizeof(float));
    double *ref = malloc((size_t)B * rows * sizeof(double)), *mag = malloc((size_t)B * rows * sizeof(double));
    sp_pool *pool = sp_pool_new(2);
    for (int lv = 0; lv <= best; lv++) {
        if (!sp_kern_supported(lv))
            continue;
        sp_kern_force(lv);
        for (int t = 0; t < SP_W__COUNT; t++) {
            sp_qmat m;
            ck_assert_int_eq(sp_qmat_encode(&m, (sp_wtype)t, w, rows, cols, &err), SP_OK);
            int integer = sp_kern_integer((sp_wtype)t);
            (integer ? reference_int : reference)(&m, X, B, ref, mag);
            sp_qmat_mul_rows(&m, X, Yr, B, pool);
            for (int blas = 1; blas <= 2; blas++) {
                openblas_set_num_threads(blas);
                sp_qmat_mul(&m, X, Y, B, pool);
                for (int i = 0; i < B * rows; i++)
                    ck_assert_msg(fabs(Y[i] - ref[i]) <= 1e-5 * mag[i] + 1e-6, "%s %s, OpenBLAS %d: [%d] %g vs %g",
                                  sp_kern_level_name(lv), sp_wtype_name((sp_wtype)t), blas, i, Y[i], ref[i]);
                ck_assert_msg(!integer || !memcmp(Y, Yr, (size_t)B * rows * sizeof(float)),
                              "%s %s: not the decode kernels' bits", sp_kern_level_name(lv), sp_wtype_name((sp_wtype)t));
            }
            check_t_acc(&m, dY, B);
            sp_qmat_free(&m);
        }
    }
    sp_kern_force(-1);
    openblas_set_num_threads(blas_was);
    sp_pool_free(pool);
    free(w), free(X), free(dY), free(Y), free(Yr), free(ref), free(mag);
}
END_TEST

/* A batch's rows in the decode kernels (sp_qmat_mul_rows, any B) have the bits each row gets alone (B = 1), for
 * every encoding and kernel level, the column tails included: a decode step's result must not depend on its
 * batch-mates. So does the plain product of any B where it runs in integers (int8 and nf4 above the scalar
 * level: a server's pass of long prefills relies on it); elsewhere its larger B goes through sgemm. */
START_TEST(t_rows_as_alone)
{
    sp_rng r;
    sp_rng_seed(&r, 11);
    sp_err err = {0};
    int rows = 45, cols = 200, Bmax = 64; /* 200: whole vectors and a tail at every level, Q8's short block */
    float *w = randn(&r, (size_t)rows * cols, 0.3f), *X = randn(&r, (size_t)Bmax * cols, 1.0f);
    float *Y = malloc((size_t)Bmax * rows * sizeof(float)), *one = malloc((size_t)rows * sizeof(float));
    for (int lv = SP_ISA__COUNT - 1; lv >= 0; lv--) { /* (the best level at most lv: each this CPU runs) */
        sp_kern_force(lv);
        for (int t = 0; t < SP_W__COUNT; t++) {
            sp_qmat m;
            ck_assert_int_eq(sp_qmat_encode(&m, (sp_wtype)t, w, rows, cols, &err), SP_OK);
            int Bs[] = {2, 3, 5, 8, 9, 16, 21, 37, 64}, plain = sp_kern_integer((sp_wtype)t);
            ck_assert_int_eq(plain, (t == SP_W_Q8 || t == SP_W_NF4) && sp_kern_level() > SP_ISA_SCALAR);
            for (size_t k = 0; k < sizeof Bs / sizeof *Bs; k++) {
                int B = Bs[k];
                if (B <= SP_KERN_MAX_ROWS || plain) /* the plain product runs the same kernels here */
                    sp_qmat_mul(&m, X, Y, B, sp_pool_default());
                else
                    sp_qmat_mul_rows(&m, X, Y, B, sp_pool_default());
                for (int b = 0; b < B; b++) {
                    sp_qmat_mul(&m, X + (size_t)b * cols, one, 1, sp_pool_default());
                    ck_assert_msg(!memcmp(one, Y + (size_t)b * rows, (size_t)rows * sizeof(float)),
                                  "%s level %d: row %d of %d differs from the row alone", sp_wtype_name((sp_wtype)t),
                                  lv, b, B);
                }
            }
            sp_qmat_free(&m);
        }
    }
    sp_kern_force(-1);
    free(w), free(X), free(Y), free(one);
}
END_TEST

/* A prefill's X quantised over the pool (parts of at least 16K values: 3 here, on a pool of 2 threads) and its
 * rows in the decode kernels 8 at a time: each row of Y has the bits it gets alone, at every level that runs
 * int8 and nf4 in integers. */
START_TEST(t_prefill_rows_as_alone)
{
    sp_rng r;
    sp_rng_seed(&r, 17);
    sp_err err = {0};
    int rows = 40, cols = 300, B = 170; /* 51000 values of X: 3 parts of rows 56, 56, 58 */
    float *w = randn(&r, (size_t)rows * cols, 0.3f), *X = randn(&r, (size_t)B * cols, 1.0f);
    float *Y = malloc((size_t)B * rows * sizeof(float)), *one = malloc((size_t)rows * sizeof(float));
    sp_pool *pool = sp_pool_new(2);
    for (int lv = SP_ISA__COUNT - 1; lv >= 0; lv--) {
        sp_kern_force(lv);
        for (int t = SP_W_Q8; t <= SP_W_NF4; t++) {
            sp_qmat m;
            ck_assert_int_eq(sp_qmat_encode(&m, (sp_wtype)t, w, rows, cols, &err), SP_OK);
            sp_qmat_mul_rows(&m, X, Y, B, pool);
            for (int b = 0; b < B; b++) {
                sp_qmat_mul(&m, X + (size_t)b * cols, one, 1, pool);
                ck_assert_msg(!memcmp(one, Y + (size_t)b * rows, (size_t)rows * sizeof(float)),
                              "%s level %d: row %d of %d differs from the row alone", sp_wtype_name((sp_wtype)t), lv,
                              b, B);
            }
            sp_qmat_free(&m);
        }
    }
    sp_kern_force(-1);
    sp_pool_free(pool);
    free(w), free(X), free(Y), free(one);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* the pool */

typedef struct count_job {
    int hits[64];
    int n_seen;
    sp_pool *pool;
    int nested;
} count_job;

static void count_part(void *ctx, int i, int n)
{
    count_job *j = ctx;
    __atomic_add_fetch(&j->hits[i], 1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&j->n_seen, n, __ATOMIC_SEQ_CST);
    if (j->nested && i == 0) { /* a call from inside a job runs inline, whole */
        count_job inner = {0};
        sp_pool_run(j->pool, count_part, &inner);
        ck_assert_int_eq(inner.n_seen, 1);
        ck_assert_int_eq(inner.hits[0], 1);
    }
}

START_TEST(t_pool_parts)
{
    sp_pool *p = sp_pool_new(3);
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(sp_pool_threads(p), 3);
    for (int k = 0; k < 2000; k++) {
        count_job j = {.pool = p, .nested = k % 7 == 0};
        sp_pool_run(p, count_part, &j);
        ck_assert_int_eq(j.n_seen, 3);
        for (int i = 0; i < 3; i++)
            ck_assert_int_eq(j.hits[i], 1);
        if (k == 1000)
            sp_pool_set_spin(p, 0); /* workers sleep at once: still every part once */
    }
    sp_pool_free(p);
    ck_assert_int_ge(sp_cpu_count(), 1);
    long lo, hi, total = 0;
    for (int i = 0; i < 5; i++) {
        sp_pool_split(1003, i, 5, 16, &lo, &hi);
        ck_assert(lo % 16 == 0 || lo == 1003);
        total += hi - lo;
    }
    ck_assert_int_eq(total, 1003);
}
END_TEST

typedef struct many_job {
    int hits[600];
    int n_seen;
} many_job;

static void many_part(void *ctx, int i, int n)
{
    many_job *j = ctx;
    __atomic_add_fetch(&j->hits[i], 1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&j->n_seen, n, __ATOMIC_SEQ_CST);
}

/* More parts than threads: each part once, whichever thread takes it; workers asleep or busy elsewhere take
 * none and the job still ends (the caller takes what is left). */
START_TEST(t_pool_many_parts)
{
    for (int threads = 1; threads <= 3; threads++) {
        sp_pool *p = sp_pool_new(threads);
        ck_assert_ptr_nonnull(p);
        for (int k = 0; k < 3000; k++) {
            int parts = 1 + (k * 37) % 599;
            if (k == 1500)
                sp_pool_set_spin(p, 0);
            many_job j = {0};
            sp_pool_run_parts(p, many_part, &j, parts);
            int want = threads == 1 ? 1 : parts; /* one thread runs the job whole, as one part */
            ck_assert_int_eq(j.n_seen, want);
            for (int i = 0; i < 600; i++)
                ck_assert_int_eq(j.hits[i], i < want ? 1 : 0);
        }
        sp_pool_free(p);
    }
}
END_TEST

static void *concurrent_caller(void *arg)
{
    sp_pool *p = arg;
    for (int k = 0; k < 3000; k++) {
        count_job j = {.pool = p};
        sp_pool_run(p, count_part, &j);
        int sum = 0;
        for (int i = 0; i < j.n_seen; i++) {
            ck_assert_int_eq(j.hits[i], 1);
            sum += j.hits[i];
        }
        ck_assert_int_eq(sum, j.n_seen); /* the pool's threads, or 1 when another job held it */
    }
    return NULL;
}

START_TEST(t_pool_concurrent)
{
    sp_pool *p = sp_pool_new(2);
    pthread_t a, b;
    pthread_create(&a, NULL, concurrent_caller, p);
    pthread_create(&b, NULL, concurrent_caller, p);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    sp_pool_free(p);
}
END_TEST

static long cpu_ticks(void)
{
    FILE *f = fopen("/proc/self/stat", "r");
    char buf[1024];
    long ut = 0, st = 0;
    if (f && fgets(buf, sizeof buf, f)) {
        char *p = strrchr(buf, ')');
        /* fields after the command: state ppid ... utime(14) stime(15) */
        if (p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %ld %ld", &ut, &st) == 2) {
        }
    }
    if (f)
        fclose(f);
    return ut + st;
}

static void spin_part(void *ctx, int i, int n)
{
    (void)i, (void)n;
    volatile double *x = ctx;
    for (int k = 0; k < 1000; k++)
        *x += 1e-9;
}

/* An idle pool gives its cores back: after a burst of jobs, a second of nothing costs (almost) no CPU. */
/* A busy machine for real: this process on one CPU with a thread that never sleeps. The pool's caller waits for
 * the CPU half the time (its run delay), so the pool finds itself contended (and stops spinning), and every job
 * still runs every part once. Skipped where the kernel keeps no run delay (/proc/thread-self/schedstat). */
static volatile int hog_stop;
static void *hog_main(void *arg)
{
    (void)arg;
    volatile unsigned long n = 0;
    while (!hog_stop)
        n++;
    return NULL;
}

START_TEST(t_pool_contended)
{
    if (access("/proc/thread-self/schedstat", R_OK) != 0) {
        printf("pool contention: skipped (no /proc/thread-self/schedstat)\n");
        return;
    }
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu() >= 0 ? sched_getcpu() : 0, &one);
    ck_assert_int_eq(sched_setaffinity(0, sizeof one, &one), 0); /* this thread, and the threads it creates */
    sp_pool *p = sp_pool_new(2);
    ck_assert_ptr_nonnull(p);
    ck_assert_uint_eq(sp_pool_contended(p), 0);
    pthread_t hog;
    hog_stop = 0;
    ck_assert_int_eq(pthread_create(&hog, NULL, hog_main, NULL), 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long jobs = 0, ns;
    do { /* ~1 s of jobs, every part counted */
        count_job j = {.pool = p};
        sp_pool_run(p, count_part, &j);
        ck_assert_int_eq(j.n_seen, 2);
        ck_assert_int_eq(j.hits[0], 1);
        ck_assert_int_eq(j.hits[1], 1);
        jobs++;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        ns = (t1.tv_sec - t0.tv_sec) * 1000000000L + (t1.tv_nsec - t0.tv_nsec);
    } while (ns < 1000000000L || (!sp_pool_contended(p) && ns < 10000000000L)); /* 1 s, up to 10 when loaded */
    hog_stop = 1;
    pthread_join(hog, NULL);
    printf("pool contention: %lu times found contended over %ld jobs sharing one CPU with a busy thread\n",
           (unsigned long)sp_pool_contended(p), jobs);
    ck_assert_uint_ge(sp_pool_contended(p), 1);
    sp_pool_free(p);
}
END_TEST

/* The same on every CPU the machine has: one busy thread per CPU beside the pool, so more threads run than there
 * are CPUs (what the pool asks /proc/loadavg before it believes its run delay) and the pool still finds itself
 * contended. Skipped where the process may not run on every CPU (the run delay decides alone there: above). */
START_TEST(t_pool_contended_everywhere)
{
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (access("/proc/thread-self/schedstat", R_OK) != 0 || access("/proc/loadavg", R_OK) != 0 ||
        online < 1 || sp_cpu_count() < online || online > 64) {
        printf("pool contention on every CPU: skipped (no schedstat or loadavg, or fewer CPUs than online)\n");
        return;
    }
    sp_pool *p = sp_pool_new(2);
    ck_assert_ptr_nonnull(p);
    pthread_t hogs[64];
    hog_stop = 0;
    for (long i = 0; i < online; i++)
        ck_assert_int_eq(pthread_create(&hogs[i], NULL, hog_main, NULL), 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long jobs = 0, ns;
    do {
        count_job j = {.pool = p};
        sp_pool_run(p, count_part, &j);
        ck_assert_int_eq(j.n_seen, 2);
        jobs++;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        ns = (t1.tv_sec - t0.tv_sec) * 1000000000L + (t1.tv_nsec - t0.tv_nsec);
    } while (ns < 1000000000L || (!sp_pool_contended(p) && ns < 10000000000L)); /* 1 s, up to 10 when loaded */
    hog_stop = 1;
    for (long i = 0; i < online; i++)
        pthread_join(hogs[i], NULL);
    printf("pool contention: %lu times found contended over %ld jobs beside %ld busy threads on %ld CPUs\n",
           (unsigned long)sp_pool_contended(p), jobs, online, online);
    ck_assert_uint_ge(sp_pool_contended(p), 1);
    sp_pool_free(p);
}
END_TEST

START_TEST(t_pool_idle)
{
    sp_pool *p = sp_pool_new(2);
    volatile double x = 0;
    for (int k = 0; k < 5000; k++)
        sp_pool_run(p, spin_part, (void *)&x);
    long t0 = cpu_ticks();
    struct timespec ts = {1, 0};
    nanosleep(&ts, NULL);
    long used = cpu_ticks() - t0;
    printf("pool: %ld CPU ticks in 1 s idle (%ld ticks/s)\n", used, sysconf(_SC_CLK_TCK));
    ck_assert_msg(used <= 5, "an idle pool used %ld ticks in 1 s", used);
    sp_pool_free(p);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("kern");
    TCase *tc = tcase_create("kern");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, t_encode_bounds);
    tcase_add_test(tc, t_f16_encode);
    tcase_add_test(tc, t_f16_kernels);
    tcase_add_test(tc, t_kernels_levels);
    tcase_add_test(tc, t_attention_rows);
    tcase_add_test(tc, t_upper_state_clean);
    tcase_add_test(tc, t_argmax_screen);
    tcase_add_test(tc, t_vector_scalar_same);
    tcase_add_test(tc, t_large_batches);
    tcase_add_test(tc, t_rows_as_alone);
    tcase_add_test(tc, t_prefill_rows_as_alone);
    tcase_add_test(tc, t_pool_parts);
    tcase_add_test(tc, t_pool_many_parts);
    tcase_add_test(tc, t_pool_concurrent);
    tcase_add_test(tc, t_pool_idle);
    tcase_add_test(tc, t_pool_contended);
    tcase_add_test(tc, t_pool_contended_everywhere);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return sp_test_run(suite()); }
