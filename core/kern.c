/* kern.c - encoded weight matrices and their products: encoders, row decoders, the decode kernels in three
 * levels (scalar reference, AVX2+FMA, AVX-512) behind one dispatch, and the large products on sgemm. */
#include "kern.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define SP_X86 1
#else
#define SP_X86 0
#endif

#define Q8_BLOCK 32
#define NF4_BLOCK 64
#define MAXB 8

const float sp_nf4_levels[16] = {-1.0f,
                                 -0.6961928009986877f,
                                 -0.5250730514526367f,
                                 -0.39491748809814453f,
                                 -0.28444138169288635f,
                                 -0.18477343022823334f,
                                 -0.09105003625154495f,
                                 0.0f,
                                 0.07958029955625534f,
                                 0.16093020141124725f,
                                 0.24611230194568634f,
                                 0.33791524171829224f,
                                 0.44070982933044434f,
                                 0.5626170039176941f,
                                 0.7229568362236023f,
                                 1.0f};

static const char *const wnames[SP_W__COUNT] = {"f32", "bf16", "int8", "nf4"};

const char *sp_wtype_name(sp_wtype t) { return (unsigned)t < SP_W__COUNT ? wnames[t] : "?"; }

int sp_wtype_parse(const char *name, sp_wtype *t)
{
    for (int i = 0; i < SP_W__COUNT; i++)
        if (!strcmp(name, wnames[i])) {
            *t = (sp_wtype)i;
            return 0;
        }
    if (!strcmp(name, "q8")) {
        *t = SP_W_Q8;
        return 0;
    }
    return -1;
}

static int blocks_per_row(sp_wtype t, int cols)
{
    int b = t == SP_W_Q8 ? Q8_BLOCK : NF4_BLOCK;
    return (cols + b - 1) / b;
}

static size_t row_bytes(sp_wtype t, int cols)
{
    switch (t) {
    case SP_W_F32: return (size_t)cols * 4;
    case SP_W_BF16: return (size_t)cols * 2;
    case SP_W_Q8: return (size_t)cols;
    case SP_W_NF4: return (size_t)blocks_per_row(t, cols) * (NF4_BLOCK / 2);
    default: return 0;
    }
}

size_t sp_qmat_bytes(sp_wtype t, int rows, int cols)
{
    size_t s = (t == SP_W_Q8 || t == SP_W_NF4) ? (size_t)rows * blocks_per_row(t, cols) * sizeof(float) : 0;
    return (size_t)rows * row_bytes(t, cols) + s;
}

sp_qmat sp_qmat_f32(const float *w, int rows, int cols)
{
    return (sp_qmat){.type = SP_W_F32, .rows = rows, .cols = cols, .q = (void *)w, .row_bytes = (size_t)cols * 4};
}

/* ---------------------------------------------------------------------------------------------- */
/* encoders */

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40); /* a quiet NaN stays a NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* roundf(v) clamped to [-127, 127], without the libm call (a tenth of the time of encoding a matrix): the
 * same value for every v (halves away from zero); NaN gives 0. */
static inline int8_t q8_round(float v)
{
    if (!(v == v))
        return 0;
    v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
    int i = (int)v;           /* towards zero, exact here */
    float f = v - (float)i;   /* exact: the fraction */
    return (int8_t)(i + (f >= 0.5f) - (f <= -0.5f));
}

static int nf4_index(float v)
{
    int lo = 0, hi = 15; /* the nearest of the ascending levels: binary search on midpoints */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (v > 0.5f * (sp_nf4_levels[mid] + sp_nf4_levels[mid + 1]))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void encode_row(sp_qmat *m, int r, const float *w)
{
    int C = m->cols;
    uint8_t *dst = (uint8_t *)m->q + (size_t)r * m->row_bytes;
    if (m->type == SP_W_F32) {
        memcpy(dst, w, (size_t)C * 4);
    } else if (m->type == SP_W_BF16) {
        uint16_t *d = (uint16_t *)dst;
        for (int c = 0; c < C; c++)
            d[c] = f32_to_bf16(w[c]);
    } else if (m->type == SP_W_Q8) {
        int nb = blocks_per_row(SP_W_Q8, C);
        int8_t *d = (int8_t *)dst;
        for (int b = 0; b < nb; b++) {
            int c0 = b * Q8_BLOCK, c1 = c0 + Q8_BLOCK < C ? c0 + Q8_BLOCK : C;
            float amax = 0;
            for (int c = c0; c < c1; c++)
                amax = fabsf(w[c]) > amax ? fabsf(w[c]) : amax;
            float s = amax / 127.0f, inv = s > 0 ? 1.0f / s : 0;
            m->scale[(size_t)r * nb + b] = s;
            for (int c = c0; c < c1; c++)
                d[c] = q8_round(w[c] * inv);
        }
    } else if (m->type == SP_W_NF4) {
        int nb = blocks_per_row(SP_W_NF4, C);
        memset(dst, 0, m->row_bytes);
        for (int b = 0; b < nb; b++) {
            int c0 = b * NF4_BLOCK, c1 = c0 + NF4_BLOCK < C ? c0 + NF4_BLOCK : C;
            float amax = 0;
            for (int c = c0; c < c1; c++)
                amax = fabsf(w[c]) > amax ? fabsf(w[c]) : amax;
            m->scale[(size_t)r * nb + b] = amax;
            float inv = amax > 0 ? 1.0f / amax : 0;
            uint8_t *blk = dst + (size_t)b * (NF4_BLOCK / 2);
            for (int c = c0; c < c1; c++) {
                int k = c - c0, idx = nf4_index(w[c] * inv);
                if (k < NF4_BLOCK / 2)
                    blk[k] |= (uint8_t)idx;
                else
                    blk[k - NF4_BLOCK / 2] |= (uint8_t)(idx << 4);
            }
            if (c1 - c0 < NF4_BLOCK) /* a short last block: unused nibbles index level 7 (0.0) */
                for (int k = c1 - c0; k < NF4_BLOCK; k++) {
                    if (k < NF4_BLOCK / 2)
                        blk[k] |= 7;
                    else
                        blk[k - NF4_BLOCK / 2] |= 7 << 4;
                }
        }
    }
}

sp_status sp_qmat_encode(sp_qmat *m, sp_wtype t, const float *w, int rows, int cols, sp_err *err)
{
    memset(m, 0, sizeof *m);
    if ((unsigned)t >= SP_W__COUNT || rows < 0 || cols <= 0)
        return sp_errf(err, SP_ERR_ARG, "weights: bad encoding or shape [%d, %d]", rows, cols);
    m->type = t;
    m->rows = rows;
    m->cols = cols;
    m->row_bytes = row_bytes(t, cols);
    m->owned = 1;
    /* 64-byte alignment, and rows padded so that a kernel's 32-byte loads stay inside */
    size_t qb = ((size_t)rows * m->row_bytes + 64 + 63) & ~(size_t)63;
    m->q = aligned_alloc(64, qb ? qb : 64);
    int nb = (t == SP_W_Q8 || t == SP_W_NF4) ? blocks_per_row(t, cols) : 0;
    if (nb)
        m->scale = malloc((size_t)rows * nb * sizeof(float) + 1);
    if (!m->q || (nb && !m->scale)) {
        sp_qmat_free(m);
        return sp_errf(err, SP_ERR_NOMEM, "weights: out of memory for [%d, %d] %s", rows, cols, sp_wtype_name(t));
    }
    memset(m->q, 0, qb);
    for (int r = 0; r < rows; r++)
        encode_row(m, r, w + (size_t)r * cols);
    return SP_OK;
}

void sp_qmat_free(sp_qmat *m)
{
    if (m->owned) {
        free(m->q);
        free(m->scale);
    }
    memset(m, 0, sizeof *m);
}

void sp_qmat_row(const sp_qmat *m, int r, float *out)
{
    int C = m->cols;
    const uint8_t *src = (const uint8_t *)m->q + (size_t)r * m->row_bytes;
    switch (m->type) {
    case SP_W_F32: memcpy(out, src, (size_t)C * 4); break;
    case SP_W_BF16:
        for (int c = 0; c < C; c++)
            out[c] = bf16_to_f32(((const uint16_t *)src)[c]);
        break;
    case SP_W_Q8: {
        int nb = blocks_per_row(SP_W_Q8, C);
        for (int c = 0; c < C; c++)
            out[c] = (float)((const int8_t *)src)[c] * m->scale[(size_t)r * nb + c / Q8_BLOCK];
        break;
    }
    case SP_W_NF4: {
        int nb = blocks_per_row(SP_W_NF4, C);
        for (int c = 0; c < C; c++) {
            int b = c / NF4_BLOCK, k = c % NF4_BLOCK;
            uint8_t byte = src[(size_t)b * (NF4_BLOCK / 2) + (k % (NF4_BLOCK / 2))];
            int idx = k < NF4_BLOCK / 2 ? byte & 15 : byte >> 4;
            out[c] = sp_nf4_levels[idx] * m->scale[(size_t)r * nb + b];
        }
        break;
    }
    default: memset(out, 0, (size_t)C * 4);
    }
}

void sp_q8_quantize(const float *x, int n, int8_t *q, float *s)
{
    int nb = (n + Q8_BLOCK - 1) / Q8_BLOCK;
    for (int b = 0; b < nb; b++) {
        int c0 = b * Q8_BLOCK, c1 = c0 + Q8_BLOCK < n ? c0 + Q8_BLOCK : n;
        float amax = 0;
        for (int c = c0; c < c1; c++)
            amax = fabsf(x[c]) > amax ? fabsf(x[c]) : amax;
        float sc = amax / 127.0f, inv = sc > 0 ? 1.0f / sc : 0;
        s[b] = sc;
        for (int c = c0; c < c0 + Q8_BLOCK; c++)
            q[c] = c < c1 ? q8_round(x[c] * inv) : 0;
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* the scalar reference: out[b] = row r . X[b] for b < B (X rows ldx apart) */

static void dot_scalar(const sp_qmat *m, int r, const float *X, int B, int ldx, float *out)
{
    int C = m->cols;
    double acc[MAXB] = {0};
    const uint8_t *src = (const uint8_t *)m->q + (size_t)r * m->row_bytes;
    int nb = (m->type == SP_W_Q8 || m->type == SP_W_NF4) ? blocks_per_row(m->type, C) : 0;
    for (int c = 0; c < C; c++) {
        float w;
        switch (m->type) {
        case SP_W_F32: w = ((const float *)src)[c]; break;
        case SP_W_BF16: w = bf16_to_f32(((const uint16_t *)src)[c]); break;
        case SP_W_Q8: w = (float)((const int8_t *)src)[c] * m->scale[(size_t)r * nb + c / Q8_BLOCK]; break;
        default: {
            int b = c / NF4_BLOCK, k = c % NF4_BLOCK;
            uint8_t byte = src[(size_t)b * (NF4_BLOCK / 2) + (k % (NF4_BLOCK / 2))];
            w = sp_nf4_levels[k < NF4_BLOCK / 2 ? byte & 15 : byte >> 4] * m->scale[(size_t)r * nb + b];
        }
        }
        for (int b = 0; b < B; b++)
            acc[b] += (double)w * X[(size_t)b * ldx + c];
    }
    for (int b = 0; b < B; b++)
        out[b] = (float)acc[b];
}

/* The weights [c0, C) of a row that the vector loop leaves (fewer than a block), decoded one by one, dotted
 * with the B rows of X into out (added). */
static void dot_tail(const sp_qmat *m, int r, int c0, const float *X, int B, int ldx, float *out)
{
    int C = m->cols;
    if (c0 >= C)
        return;
    float w[NF4_BLOCK];
    const uint8_t *src = (const uint8_t *)m->q + (size_t)r * m->row_bytes;
    int nb = (m->type == SP_W_Q8 || m->type == SP_W_NF4) ? blocks_per_row(m->type, C) : 0;
    for (int c = c0; c < C; c++) {
        float v;
        if (m->type == SP_W_F32)
            v = ((const float *)src)[c];
        else if (m->type == SP_W_BF16)
            v = bf16_to_f32(((const uint16_t *)src)[c]);
        else if (m->type == SP_W_Q8)
            v = (float)((const int8_t *)src)[c] * m->scale[(size_t)r * nb + c / Q8_BLOCK];
        else {
            int b = c / NF4_BLOCK, k = c % NF4_BLOCK;
            uint8_t byte = src[(size_t)b * (NF4_BLOCK / 2) + (k % (NF4_BLOCK / 2))];
            v = sp_nf4_levels[k < NF4_BLOCK / 2 ? byte & 15 : byte >> 4] * m->scale[(size_t)r * nb + b];
        }
        w[c - c0] = v;
    }
    for (int b = 0; b < B; b++) {
        float s = 0;
        for (int c = c0; c < C; c++)
            s += w[c - c0] * X[(size_t)b * ldx + c];
        out[b] += s;
    }
}

/* Where the vector loop of a kernel of width W stops: whole blocks (Q8, NF4), else whole vectors. */
static int vec_end(const sp_qmat *m, int W)
{
    int C = m->cols;
    if (m->type == SP_W_Q8)
        return C / Q8_BLOCK * Q8_BLOCK;
    if (m->type == SP_W_NF4)
        return C / NF4_BLOCK * NF4_BLOCK;
    return C / W * W;
}

/* A kernel for one encoding at one level: LOAD(src, scale, c) gives the W weights at column c as a vector.
 * B == 1 keeps four accumulators in flight; otherwise each row of X has its own. */
#define DEFINE_DOT(NAME, TARGET, VEC, W, ZERO, FMA, LOADX, ADD, HSUM, LOAD)                                     \
    TARGET static void NAME(const sp_qmat *m, int r, const float *X, int B, int ldx, float *out)               \
    {                                                                                                          \
        const uint8_t *src = (const uint8_t *)m->q + (size_t)r * m->row_bytes;                                 \
        int nb = (m->type == SP_W_Q8 || m->type == SP_W_NF4) ? blocks_per_row(m->type, m->cols) : 0;          \
        const float *scale = nb ? m->scale + (size_t)r * nb : NULL;                                            \
        int cv = vec_end(m, W), c = 0;                                                                         \
        (void)scale;                                                                                           \
        if (B == 1) {                                                                                          \
            VEC a0 = ZERO(), a1 = ZERO(), a2 = ZERO(), a3 = ZERO();                                            \
            for (; c + 4 * W <= cv; c += 4 * W) {                                                              \
                a0 = FMA(LOAD(src, scale, c), LOADX(X + c), a0);                                               \
                a1 = FMA(LOAD(src, scale, c + W), LOADX(X + c + W), a1);                                       \
                a2 = FMA(LOAD(src, scale, c + 2 * W), LOADX(X + c + 2 * W), a2);                               \
                a3 = FMA(LOAD(src, scale, c + 3 * W), LOADX(X + c + 3 * W), a3);                               \
            }                                                                                                  \
            for (; c < cv; c += W)                                                                             \
                a0 = FMA(LOAD(src, scale, c), LOADX(X + c), a0);                                               \
            out[0] = HSUM(ADD(ADD(a0, a1), ADD(a2, a3)));                                                      \
        } else {                                                                                               \
            VEC acc[MAXB];                                                                                     \
            for (int b = 0; b < B; b++)                                                                        \
                acc[b] = ZERO();                                                                               \
            for (; c < cv; c += W) {                                                                           \
                VEC w = LOAD(src, scale, c);                                                                   \
                for (int b = 0; b < B; b++)                                                                    \
                    acc[b] = FMA(w, LOADX(X + (size_t)b * ldx + c), acc[b]);                                   \
            }                                                                                                  \
            for (int b = 0; b < B; b++)                                                                        \
                out[b] = HSUM(acc[b]);                                                                         \
        }                                                                                                      \
        dot_tail(m, r, cv, X, B, ldx, out);                                                                    \
    }

#define DEFINE_DOT_(...) DEFINE_DOT(__VA_ARGS__)

typedef void (*dot_fn)(const sp_qmat *m, int r, const float *X, int B, int ldx, float *out);

#if SP_X86
/* ---------------------------------------------------------------------------------------------- */
/* AVX2 + FMA: 8 weights a vector */

#define T2 __attribute__((target("avx2,fma")))

T2 static inline float hsum8(__m256 v)
{
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

T2 static inline __m256 ld8_f32(const uint8_t *src, const float *scale, int c)
{
    (void)scale;
    return _mm256_loadu_ps((const float *)src + c);
}

T2 static inline __m256 ld8_bf16(const uint8_t *src, const float *scale, int c)
{
    (void)scale;
    __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)src + c)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

T2 static inline __m256 ld8_q8(const uint8_t *src, const float *scale, int c)
{
    __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)src + c)));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(scale[c / Q8_BLOCK]));
}

T2 static inline __m256 ld8_nf4(const uint8_t *src, const float *scale, int c)
{
    int b = c / NF4_BLOCK, k = c % NF4_BLOCK;
    __m256i idx = _mm256_cvtepu8_epi32(
        _mm_loadl_epi64((const __m128i *)(src + (size_t)b * (NF4_BLOCK / 2) + (k % (NF4_BLOCK / 2)))));
    if (k >= NF4_BLOCK / 2)
        idx = _mm256_srli_epi32(idx, 4);
    idx = _mm256_and_si256(idx, _mm256_set1_epi32(15));
    __m256 lo = _mm256_permutevar8x32_ps(_mm256_loadu_ps(sp_nf4_levels), idx);
    __m256 hi = _mm256_permutevar8x32_ps(_mm256_loadu_ps(sp_nf4_levels + 8), idx);
    __m256 sel = _mm256_castsi256_ps(_mm256_cmpgt_epi32(idx, _mm256_set1_epi32(7)));
    return _mm256_mul_ps(_mm256_blendv_ps(lo, hi, sel), _mm256_set1_ps(scale[b]));
}

#define AVX2_ARGS __m256, 8, _mm256_setzero_ps, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_add_ps, hsum8
DEFINE_DOT_(dot2_f32, T2, AVX2_ARGS, ld8_f32)
DEFINE_DOT_(dot2_bf16, T2, AVX2_ARGS, ld8_bf16)
DEFINE_DOT_(dot2_q8, T2, AVX2_ARGS, ld8_q8)
DEFINE_DOT_(dot2_nf4, T2, AVX2_ARGS, ld8_nf4)

/* ---------------------------------------------------------------------------------------------- */
/* AVX-512: 16 weights a vector */

#define T5 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

T5 static inline float hsum16(__m512 v) { return _mm512_reduce_add_ps(v); }

T5 static inline __m512 ld16_f32(const uint8_t *src, const float *scale, int c)
{
    (void)scale;
    return _mm512_loadu_ps((const float *)src + c);
}

T5 static inline __m512 ld16_bf16(const uint8_t *src, const float *scale, int c)
{
    (void)scale;
    __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)src + c)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}

T5 static inline __m512 ld16_q8(const uint8_t *src, const float *scale, int c)
{
    __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((const int8_t *)src + c)));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(scale[c / Q8_BLOCK]));
}

T5 static inline __m512 ld16_nf4(const uint8_t *src, const float *scale, int c)
{
    int b = c / NF4_BLOCK, k = c % NF4_BLOCK;
    __m512i idx = _mm512_cvtepu8_epi32(
        _mm_loadu_si128((const __m128i *)(src + (size_t)b * (NF4_BLOCK / 2) + (k % (NF4_BLOCK / 2)))));
    if (k >= NF4_BLOCK / 2)
        idx = _mm512_srli_epi32(idx, 4);
    idx = _mm512_and_si512(idx, _mm512_set1_epi32(15));
    __m512 w = _mm512_permutexvar_ps(idx, _mm512_loadu_ps(sp_nf4_levels));
    return _mm512_mul_ps(w, _mm512_set1_ps(scale[b]));
}

#define AVX512_ARGS __m512, 16, _mm512_setzero_ps, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_add_ps, hsum16
DEFINE_DOT_(dot5_f32, T5, AVX512_ARGS, ld16_f32)
DEFINE_DOT_(dot5_bf16, T5, AVX512_ARGS, ld16_bf16)
DEFINE_DOT_(dot5_q8, T5, AVX512_ARGS, ld16_q8)
DEFINE_DOT_(dot5_nf4, T5, AVX512_ARGS, ld16_nf4)
#endif

/* ---------------------------------------------------------------------------------------------- */
/* Q8 in integers: X quantised (XQ rows of nb * 32 bytes, XS rows of nb scales); the row's blocks [0, nfull)
 * here, the rest (a full block left over, the short last one) in f32 by dot_tail. */

typedef void (*q8i_fn)(const sp_qmat *m, int r, const int8_t *XQ, const float *XS, const float *X, int B, int ldx,
                       float *out);

#if SP_X86
T2 static void q8i_avx2(const sp_qmat *m, int r, const int8_t *XQ, const float *XS, const float *X, int B, int ldx,
                        float *out)
{
    int C = m->cols, nb = blocks_per_row(SP_W_Q8, C), nfull = C / Q8_BLOCK;
    const int8_t *w = (const int8_t *)m->q + (size_t)r * m->row_bytes;
    const float *ws = m->scale + (size_t)r * nb;
    __m256 acc[MAXB];
    const __m256i ones = _mm256_set1_epi16(1);
    for (int b = 0; b < B; b++)
        acc[b] = _mm256_setzero_ps();
    for (int blk = 0; blk < nfull; blk++) {
        __m256i wv = _mm256_loadu_si256((const __m256i *)(w + blk * Q8_BLOCK));
        __m256i wa = _mm256_sign_epi8(wv, wv);
        for (int b = 0; b < B; b++) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)(XQ + (size_t)b * nb * Q8_BLOCK + blk * Q8_BLOCK));
            __m256i p16 = _mm256_maddubs_epi16(wa, _mm256_sign_epi8(xv, wv)); /* |127 x 127| x 2 fits in s16 */
            __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
            acc[b] = _mm256_fmadd_ps(p, _mm256_set1_ps(ws[blk] * XS[(size_t)b * nb + blk]), acc[b]);
        }
    }
    for (int b = 0; b < B; b++)
        out[b] = hsum8(acc[b]);
    dot_tail(m, r, nfull * Q8_BLOCK, X, B, ldx, out);
}

#define T5V __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

T5V static void q8i_vnni(const sp_qmat *m, int r, const int8_t *XQ, const float *XS, const float *X, int B, int ldx,
                         float *out)
{
    int C = m->cols, nb = blocks_per_row(SP_W_Q8, C), nfull = C / Q8_BLOCK, blk = 0;
    const int8_t *w = (const int8_t *)m->q + (size_t)r * m->row_bytes;
    const float *ws = m->scale + (size_t)r * nb;
    __m512 acc[MAXB];
    const __m512i zero = _mm512_setzero_si512();
    for (int b = 0; b < B; b++)
        acc[b] = _mm512_setzero_ps();
    for (; blk + 2 <= nfull; blk += 2) { /* two blocks a vector: lanes 0-7 the first, 8-15 the second */
        __m512i wv = _mm512_loadu_si512((const void *)(w + blk * Q8_BLOCK));
        __mmask64 neg = _mm512_movepi8_mask(wv);
        __m512i wa = _mm512_abs_epi8(wv);
        __m512 wsv = _mm512_insertf32x8(_mm512_set1_ps(ws[blk]), _mm256_set1_ps(ws[blk + 1]), 1);
        for (int b = 0; b < B; b++) {
            const int8_t *xq = XQ + (size_t)b * nb * Q8_BLOCK + blk * Q8_BLOCK;
            const float *xs = XS + (size_t)b * nb + blk;
            __m512i xv = _mm512_loadu_si512((const void *)xq);
            __m512i sx = _mm512_mask_sub_epi8(xv, neg, zero, xv); /* x times the sign of w */
            __m512i d = _mm512_dpbusd_epi32(zero, wa, sx);
            __m512 xsv = _mm512_insertf32x8(_mm512_set1_ps(xs[0]), _mm256_set1_ps(xs[1]), 1);
            acc[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(wsv, xsv), acc[b]);
        }
    }
    for (int b = 0; b < B; b++)
        out[b] = _mm512_reduce_add_ps(acc[b]);
    if (blk < nfull) { /* one full block left: 8 lanes */
        __m256i wv = _mm256_loadu_si256((const __m256i *)(w + blk * Q8_BLOCK));
        __m256i wa = _mm256_abs_epi8(wv);
        __mmask32 neg = _mm256_movepi8_mask(wv);
        for (int b = 0; b < B; b++) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)(XQ + (size_t)b * nb * Q8_BLOCK + blk * Q8_BLOCK));
            __m256i sx = _mm256_mask_sub_epi8(xv, neg, _mm256_setzero_si256(), xv);
            __m256i d = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wa, sx);
            out[b] += hsum8(_mm256_cvtepi32_ps(d)) * ws[blk] * XS[(size_t)b * nb + blk];
        }
        blk++;
    }
    dot_tail(m, r, nfull * Q8_BLOCK, X, B, ldx, out);
}
#endif

static int has_vnni = -1;

/* ---------------------------------------------------------------------------------------------- */
/* dispatch */

static int best_level = -1, forced = -1;

static int detect(void)
{
#if SP_X86
    __builtin_cpu_init();
    has_vnni = __builtin_cpu_supports("avx512vnni");
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return 2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return 1;
#endif
    return 0;
}

int sp_kern_level(void)
{
    int best = __atomic_load_n(&best_level, __ATOMIC_RELAXED);
    if (best < 0) {
        best = detect();
        __atomic_store_n(&best_level, best, __ATOMIC_RELAXED);
    }
    int f = __atomic_load_n(&forced, __ATOMIC_RELAXED);
    return f >= 0 && f < best ? f : best;
}

void sp_kern_force(int level) { __atomic_store_n(&forced, level, __ATOMIC_RELAXED); }

const char *sp_kern_level_name(int level) { return level >= 2 ? "avx512" : level == 1 ? "avx2" : "scalar"; }

static dot_fn dot_for(const sp_qmat *m)
{
#if SP_X86
    static const dot_fn l2[SP_W__COUNT] = {dot5_f32, dot5_bf16, dot5_q8, dot5_nf4};
    static const dot_fn l1[SP_W__COUNT] = {dot2_f32, dot2_bf16, dot2_q8, dot2_nf4};
    int lv = sp_kern_level();
    if (lv >= 2)
        return l2[m->type];
    if (lv == 1)
        return l1[m->type];
#endif
    (void)m;
    return dot_scalar;
}

float sp_qmat_dot(const sp_qmat *m, int r, const float *x)
{
    float out;
    dot_for(m)(m, r, x, 1, m->cols, &out);
    return out;
}

/* ---------------------------------------------------------------------------------------------- */
/* products */

typedef struct mul_job {
    const sp_qmat *W;
    const float *X;
    float *Y;
    int B;
    dot_fn dot;
    q8i_fn q8i;        /* Q8 in integers (then XQ, XS hold X quantised) */
    const int8_t *XQ;
    const float *XS;
} mul_job;

static void mul_part(void *ctx, int i, int n)
{
    mul_job *j = ctx;
    long lo, hi;
    sp_pool_split(j->W->rows, i, n, 16, &lo, &hi);
    float out[MAXB];
    for (long r = lo; r < hi; r++) {
        if (j->q8i)
            j->q8i(j->W, (int)r, j->XQ, j->XS, j->X, j->B, j->W->cols, out);
        else
            j->dot(j->W, (int)r, j->X, j->B, j->W->cols, out);
        for (int b = 0; b < j->B; b++)
            j->Y[(size_t)b * j->W->rows + r] = out[b];
    }
}

/* A per-thread scratch for X quantised (grown, kept, freed when the thread ends): no allocation a token. */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

typedef struct scratch {
    void *p;
    size_t cap;
} scratch;

static void scratch_free(void *s)
{
    if (s)
        free(((scratch *)s)->p);
    free(s);
}

static void scratch_init(void) { pthread_key_create(&scratch_key, scratch_free); }

static void *scratch_get(size_t n)
{
    pthread_once(&scratch_once, scratch_init);
    scratch *s = pthread_getspecific(scratch_key);
    if (!s) {
        if (!(s = calloc(1, sizeof *s)))
            return NULL;
        pthread_setspecific(scratch_key, s);
    }
    if (s->cap < n) {
        void *p = realloc(s->p, n);
        if (!p)
            return NULL;
        s->p = p;
        s->cap = n;
    }
    return s->p;
}

static q8i_fn q8i_for(void);
int sp_kern_q8_integer(void) { return q8i_for() != NULL; }

static q8i_fn q8i_for(void)
{
#if SP_X86
    int lv = sp_kern_level();
    if (lv >= 2 && has_vnni > 0)
        return q8i_vnni;
    if (lv >= 1)
        return q8i_avx2;
#endif
    return NULL;
}

#define TILE_ROWS 256

/* Parts of a product for the pool: about 64K weights each (a part a preempted thread holds is what the
 * others may wait for), at least one per thread, at most one per 16 rows. */
static int mul_parts(const sp_qmat *W, sp_pool *pool)
{
    long units = (W->rows + 15) / 16, want = (long)W->rows * W->cols / 65536, n = sp_pool_threads(pool);
    if (want < n)
        want = n;
    return (int)(want < units ? want : units);
}

void sp_qmat_mul(const sp_qmat *W, const float *X, float *Y, int B, sp_pool *pool)
{
    if (B <= 0 || W->rows <= 0)
        return;
    if (B <= MAXB) {
        mul_job j = {W, X, Y, B, dot_for(W), NULL, NULL, NULL};
        if (W->type == SP_W_Q8 && (j.q8i = q8i_for())) {
            int nb = blocks_per_row(SP_W_Q8, W->cols);
            size_t qbytes = ((size_t)B * nb * Q8_BLOCK + 63) & ~(size_t)63;
            uint8_t *buf = scratch_get(qbytes + (size_t)B * nb * sizeof(float));
            if (buf) {
                j.XQ = (const int8_t *)buf;
                j.XS = (const float *)(buf + qbytes);
                for (int b = 0; b < B; b++)
                    sp_q8_quantize(X + (size_t)b * W->cols, W->cols, (int8_t *)buf + (size_t)b * nb * Q8_BLOCK,
                                   (float *)(buf + qbytes) + (size_t)b * nb);
            } else {
                j.q8i = NULL; /* no room: the f32 kernel */
            }
        }
        sp_pool_run_parts(pool, mul_part, &j, mul_parts(W, pool));
        return;
    }
    if (W->type == SP_W_F32) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, W->rows, W->cols, 1.0f, X, W->cols,
                    (const float *)W->q, W->cols, 0.0f, Y, W->rows);
        return;
    }
    float *tile = malloc((size_t)TILE_ROWS * W->cols * sizeof(float));
    if (!tile) { /* no room for a tile: the decode kernels, B rows at a time */
        for (int b0 = 0; b0 < B; b0 += MAXB) {
            int nb = B - b0 < MAXB ? B - b0 : MAXB;
            float *tmp = malloc((size_t)nb * W->rows * sizeof(float));
            if (!tmp)
                return;
            mul_job j = {W, X + (size_t)b0 * W->cols, tmp, nb, dot_for(W), NULL, NULL, NULL};
            sp_pool_run_parts(pool, mul_part, &j, mul_parts(W, pool));
            for (int b = 0; b < nb; b++)
                memcpy(Y + (size_t)(b0 + b) * W->rows, tmp + (size_t)b * W->rows, (size_t)W->rows * sizeof(float));
            free(tmp);
        }
        return;
    }
    for (int r0 = 0; r0 < W->rows; r0 += TILE_ROWS) {
        int nr = W->rows - r0 < TILE_ROWS ? W->rows - r0 : TILE_ROWS;
        for (int r = 0; r < nr; r++)
            sp_qmat_row(W, r0 + r, tile + (size_t)r * W->cols);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, nr, W->cols, 1.0f, X, W->cols, tile, W->cols, 0.0f,
                    Y + r0, W->rows);
    }
    free(tile);
}

int sp_qmat_argmax(const sp_qmat *W, const sp_qmat *S, const float *x, float *approx, sp_pool *pool)
{
    enum { MAXNB = 1024 };
    int R = W->rows, C = W->cols, nb = blocks_per_row(SP_W_Q8, C);
    if (W->type != SP_W_F32 || S->type != SP_W_Q8 || S->rows != R || S->cols != C || nb > MAXNB || R <= 0)
        return -1;
    /* per block of x: what one unit of the weights' scale may cost, |x|_1 / 2 (weights rounded to half a step)
     * + n max|x| / 2 (x rounded to half of its step max|x| / 127, times weights up to 127 steps), widened by
     * 4% for the rounding of the three products (the exact one's relative error is below 2.2e-3 of
     * 127 s |x|_1 for rows up to 16K: 1.2e-7 * C) */
    float K[MAXNB];
    for (int b = 0; b < nb; b++) {
        int c0 = b * Q8_BLOCK, c1 = c0 + Q8_BLOCK < C ? c0 + Q8_BLOCK : C;
        float l1 = 0, mx = 0;
        for (int c = c0; c < c1; c++) {
            float a = fabsf(x[c]);
            l1 += a;
            mx = a > mx ? a : mx;
        }
        K[b] = (l1 + (float)(c1 - c0) * mx) * (0.52f + 1.2e-7f * (float)C * 127.0f);
    }
    sp_qmat_mul(S, x, approx, 1, pool);
    float lo = -INFINITY, chk = 0;
    for (int r = 0; r < R; r++) { /* approx[r] becomes the row's upper bound */
        const float *sc = S->scale + (size_t)r * nb;
        float bound = 0;
        for (int b = 0; b < nb; b++)
            bound += sc[b] * K[b];
        float a = approx[r];
        bound += fabsf(a) * 1e-5f;
        chk += (a + bound) * 0.0f; /* NaN if anything is not finite */
        lo = a - bound > lo ? a - bound : lo;
        approx[r] = a + bound;
    }
    if (chk != 0.0f || !(lo > -INFINITY))
        return -1;
    dot_fn dot = dot_for(W);
    int best = -1;
    float bv = 0;
    for (int r = 0; r < R; r++) {
        if (!(approx[r] >= lo))
            continue;
        float e;
        dot(W, r, x, 1, C, &e);
        if (e != e)
            return -1;
        if (best < 0 || e > bv)
            best = r, bv = e;
    }
    return best;
}

void sp_qmat_mul_t_acc(const sp_qmat *W, const float *dY, float *dX, int B, sp_pool *pool)
{
    (void)pool;
    if (B <= 0 || W->rows <= 0)
        return;
    if (W->type == SP_W_F32) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, W->cols, W->rows, 1.0f, dY, W->rows,
                    (const float *)W->q, W->cols, 1.0f, dX, W->cols);
        return;
    }
    float *tile = malloc((size_t)TILE_ROWS * W->cols * sizeof(float));
    for (int r0 = 0; r0 < W->rows; r0 += TILE_ROWS) {
        int nr = W->rows - r0 < TILE_ROWS ? W->rows - r0 : TILE_ROWS;
        if (!tile) { /* row by row */
            float *row = malloc((size_t)W->cols * sizeof(float));
            for (int r = 0; row && r < nr; r++) {
                sp_qmat_row(W, r0 + r, row);
                for (int b = 0; b < B; b++)
                    cblas_saxpy(W->cols, dY[(size_t)b * W->rows + r0 + r], row, 1, dX + (size_t)b * W->cols, 1);
            }
            free(row);
            continue;
        }
        for (int r = 0; r < nr; r++)
            sp_qmat_row(W, r0 + r, tile + (size_t)r * W->cols);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, W->cols, nr, 1.0f, dY + r0, W->rows, tile, W->cols,
                    1.0f, dX, W->cols);
    }
    free(tile);
}
