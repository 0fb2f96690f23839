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
#define MAXB SP_KERN_MAX_ROWS

static int kern_level(void);
static void q8_block(const float *x, int n, int8_t *out, float *scale, int lv);

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
    if (t == SP_W_Q8) { /* groups of 16 rows, blocks of 32 columns (see the layout below) */
        size_t groups = ((size_t)rows + 15) / 16, nb = (size_t)blocks_per_row(t, cols);
        return groups * 16 * nb * (32 + sizeof(float));
    }
    size_t s = t == SP_W_NF4 ? (size_t)rows * blocks_per_row(t, cols) * sizeof(float) : 0;
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

/* Q8's layout: rows in groups of 16 (the last group padded with zero rows), each group's block b as eight
 * 64-byte pieces, piece k holding columns 4k..4k+3 of the block for the 16 rows in turn (4 bytes a row), each
 * value stored as its int8 value + 128 (the sign bit flipped: an unsigned byte, what VNNI's dpbusd wants);
 * the group's scales of block b as 16 floats (a row each). A short last block is padded with zeros. So one
 * 64-byte load gives 16 rows' next 4 weights: a product needs no horizontal sums. */
#define Q8_GROUP 16

static inline size_t q8_group_bytes(int nb) { return (size_t)nb * Q8_BLOCK * Q8_GROUP; }

static inline size_t q8_at(int nb, int r, int c)
{
    int k = (c % Q8_BLOCK) / 4;
    return (size_t)(r / Q8_GROUP) * q8_group_bytes(nb) + (size_t)(c / Q8_BLOCK) * Q8_BLOCK * Q8_GROUP +
           (size_t)k * 64 + (size_t)(r % Q8_GROUP) * 4 + (size_t)(c % 4);
}

static inline size_t q8_scale_at(int nb, int r, int b)
{
    return ((size_t)(r / Q8_GROUP) * nb + b) * Q8_GROUP + (size_t)(r % Q8_GROUP);
}

/* Weight (r, c) of a Q8 matrix. */
static inline float q8_weight(const sp_qmat *m, int r, int c)
{
    int nb = blocks_per_row(SP_W_Q8, m->cols);
    int8_t q = (int8_t)(((const uint8_t *)m->q)[q8_at(nb, r, c)] ^ 0x80);
    return (float)q * m->scale[q8_scale_at(nb, r, c / Q8_BLOCK)];
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
    uint8_t *dst = m->type == SP_W_Q8 ? (uint8_t *)m->q : (uint8_t *)m->q + (size_t)r * m->row_bytes;
    if (m->type == SP_W_F32) {
        memcpy(dst, w, (size_t)C * 4);
    } else if (m->type == SP_W_BF16) {
        uint16_t *d = (uint16_t *)dst;
        for (int c = 0; c < C; c++)
            d[c] = f32_to_bf16(w[c]);
    } else if (m->type == SP_W_Q8) {
        int nb = blocks_per_row(SP_W_Q8, C), lv = kern_level();
        for (int b = 0; b < nb; b++) {
            int c0 = b * Q8_BLOCK, c1 = c0 + Q8_BLOCK < C ? c0 + Q8_BLOCK : C;
            int8_t q[Q8_BLOCK];
            q8_block(w + c0, c1 - c0, q, &m->scale[q8_scale_at(nb, r, b)], lv);
            uint8_t *d = dst + q8_at(nb, r, c0);
            for (int k = 0; k < Q8_BLOCK / 4; k++) { /* 4 values a piece; the padding stays 0 (0x80) */
                uint32_t v;
                memcpy(&v, q + 4 * k, 4);
                v ^= 0x80808080u;
                memcpy(d + k * 64, &v, 4);
            }
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
    /* 64-byte alignment, and rows padded so that a kernel's 32-byte loads stay inside; Q8: whole groups of 16
     * rows, zeros (stored as 0x80) in the padding */
    int nb = (t == SP_W_Q8 || t == SP_W_NF4) ? blocks_per_row(t, cols) : 0;
    size_t srows = t == SP_W_Q8 ? ((size_t)rows + Q8_GROUP - 1) / Q8_GROUP * Q8_GROUP : (size_t)rows;
    size_t data = t == SP_W_Q8 ? srows / Q8_GROUP * q8_group_bytes(nb) : (size_t)rows * m->row_bytes;
    size_t qb = (data + 64 + 63) & ~(size_t)63;
    m->q = aligned_alloc(64, qb ? qb : 64);
    if (nb)
        m->scale = calloc(srows * nb + 1, sizeof(float));
    if (!m->q || (nb && !m->scale)) {
        sp_qmat_free(m);
        return sp_errf(err, SP_ERR_NOMEM, "weights: out of memory for [%d, %d] %s", rows, cols, sp_wtype_name(t));
    }
    memset(m->q, t == SP_W_Q8 ? 0x80 : 0, qb);
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
        const uint8_t *q = (const uint8_t *)m->q;
        for (int b = 0; b < nb; b++) {
            const uint8_t *d = q + q8_at(nb, r, b * Q8_BLOCK);
            float sc = m->scale[q8_scale_at(nb, r, b)];
            for (int c = b * Q8_BLOCK; c < C && c < (b + 1) * Q8_BLOCK; c++) {
                int k = c - b * Q8_BLOCK;
                out[c] = (float)(int8_t)(d[k / 4 * 64 + k % 4] ^ 0x80) * sc;
            }
        }
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

void sp_qmat_q8_row(const sp_qmat *m, int r, int8_t *q, float *scales)
{
    int C = m->cols, nb = blocks_per_row(SP_W_Q8, C);
    for (int c = 0; c < C; c++)
        q[c] = (int8_t)(((const uint8_t *)m->q)[q8_at(nb, r, c)] ^ 0x80);
    for (int b = 0; b < nb; b++)
        scales[b] = m->scale[q8_scale_at(nb, r, b)];
}

void sp_q8_quantize(const float *x, int n, int8_t *q, float *s)
{
    int nb = (n + Q8_BLOCK - 1) / Q8_BLOCK, lv = kern_level();
    for (int b = 0; b < nb; b++) {
        int c0 = b * Q8_BLOCK, c1 = c0 + Q8_BLOCK < n ? c0 + Q8_BLOCK : n;
        q8_block(x + c0, c1 - c0, q + c0, s + b, lv);
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
        case SP_W_Q8: w = q8_weight(m, r, c); break;
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
            v = q8_weight(m, r, c);
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

/* Where the vector loop of a kernel of width W stops: whole blocks (NF4), else whole vectors. */
static int vec_end(const sp_qmat *m, int W)
{
    int C = m->cols;
    if (m->type == SP_W_NF4)
        return C / NF4_BLOCK * NF4_BLOCK;
    return C / W * W;
}

/* A kernel for one encoding at one level: LOAD(src, scale, c) gives the W weights at column c as a vector.
 * Every row of X has four accumulators (columns c, c + W, c + 2W, c + 3W of each 4W run), summed the same way
 * whatever B is: a row's result never depends on the rows beside it (a batch of decode steps gives each step the
 * bits it gets alone). The rows go G at a time (G: what the level's registers hold), the weights loaded once for
 * the G of them; B == 1 runs a group of one. */
#define DEFINE_DOT(NAME, TARGET, VEC, W, ZERO, FMA, LOADX, ADD, HSUM, LOAD, G)                                  \
    TARGET static inline __attribute__((always_inline)) void NAME##_rows(const uint8_t *src, const float *scale,  \
                                                                          int cv, const float *X, int g, int gmax,  \
                                                                          int ldx, float *out)                      \
    {                                                                                                          \
        const float *xs[G];                                                                                    \
        VEC acc[G][4];                                                                                         \
        for (int k = 0; k < gmax; k++) {                                                                       \
            xs[k] = X + (size_t)(k < g ? k : 0) * ldx; /* past the rows: row 0 again, its result dropped */    \
            acc[k][0] = acc[k][1] = acc[k][2] = acc[k][3] = ZERO();                                            \
        }                                                                                                      \
        int c = 0;                                                                                             \
        for (; c + 4 * W <= cv; c += 4 * W) {                                                                  \
            VEC w0 = LOAD(src, scale, c), w1 = LOAD(src, scale, c + W), w2 = LOAD(src, scale, c + 2 * W);      \
            VEC w3 = LOAD(src, scale, c + 3 * W);                                                              \
            for (int k = 0; k < gmax; k++) {                                                                   \
                acc[k][0] = FMA(w0, LOADX(xs[k] + c), acc[k][0]);                                              \
                acc[k][1] = FMA(w1, LOADX(xs[k] + c + W), acc[k][1]);                                          \
                acc[k][2] = FMA(w2, LOADX(xs[k] + c + 2 * W), acc[k][2]);                                      \
                acc[k][3] = FMA(w3, LOADX(xs[k] + c + 3 * W), acc[k][3]);                                      \
            }                                                                                                  \
        }                                                                                                      \
        for (; c < cv; c += W) {                                                                               \
            VEC w0 = LOAD(src, scale, c);                                                                      \
            for (int k = 0; k < gmax; k++)                                                                     \
                acc[k][0] = FMA(w0, LOADX(xs[k] + c), acc[k][0]);                                              \
        }                                                                                                      \
        for (int k = 0; k < g; k++)                                                                            \
            out[k] = HSUM(ADD(ADD(acc[k][0], acc[k][1]), ADD(acc[k][2], acc[k][3])));                          \
    }                                                                                                          \
    TARGET static void NAME(const sp_qmat *m, int r, const float *X, int B, int ldx, float *out)               \
    {                                                                                                          \
        const uint8_t *src = (const uint8_t *)m->q + (size_t)r * m->row_bytes;                                 \
        int nb = m->type == SP_W_NF4 ? blocks_per_row(m->type, m->cols) : 0;                                 \
        const float *scale = nb ? m->scale + (size_t)r * nb : NULL;                                            \
        int cv = vec_end(m, W);                                                                                \
        if (B == 1)                                                                                            \
            NAME##_rows(src, scale, cv, X, 1, 1, ldx, out);                                                    \
        for (int b0 = 0; B > 1 && b0 < B; b0 += G)                                                             \
            NAME##_rows(src, scale, cv, X + (size_t)b0 * ldx, B - b0 < G ? B - b0 : G, G, ldx, out + b0);      \
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
DEFINE_DOT_(dot2_f32, T2, AVX2_ARGS, ld8_f32, 2)
DEFINE_DOT_(dot2_bf16, T2, AVX2_ARGS, ld8_bf16, 2)
DEFINE_DOT_(dot2_nf4, T2, AVX2_ARGS, ld8_nf4, 2)

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
DEFINE_DOT_(dot5_f32, T5, AVX512_ARGS, ld16_f32, 4)
DEFINE_DOT_(dot5_bf16, T5, AVX512_ARGS, ld16_bf16, 4)
DEFINE_DOT_(dot5_nf4, T5, AVX512_ARGS, ld16_nf4, 4)
#endif

/* ---------------------------------------------------------------------------------------------- */
/* Q8 quantisation of a block and the first maximum, vectorised (the same results as the scalar loops) */

/* One block of n <= 32 values -> out[32] (padded with zeros) and its scale, as sp_q8_quantize defines it. */
static void q8_block_scalar(const float *x, int n, int8_t *out, float *scale)
{
    float amax = 0;
    for (int c = 0; c < n; c++)
        amax = fabsf(x[c]) > amax ? fabsf(x[c]) : amax;
    float sc = amax / 127.0f, inv = sc > 0 ? 1.0f / sc : 0;
    *scale = sc;
    for (int c = 0; c < Q8_BLOCK; c++)
        out[c] = c < n ? q8_round(x[c] * inv) : 0;
}

static int first_max_scalar(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

#if SP_X86
/* A whole block without NaN or infinity in it or its inverse step (else 0: the scalar loop, whose clamps treat
 * NaN their own way): the same operations on 16 lanes; roundf's halves away from zero by truncation and the
 * exact fraction. */
T5 static int q8_block5(const float *x, int8_t *out, float *scale)
{
    __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    if (_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q) || _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q) || !(amax <= 3.4e38f))
        return 0;
    float sc = amax / 127.0f, inv = sc > 0 ? 1.0f / sc : 0;
    if (!(inv <= 3.4e38f)) /* a tiny block: 0 * inf is NaN there */
        return 0;
    *scale = sc;
    const __m512 vi = _mm512_set1_ps(inv), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    const __m512 half = _mm512_set1_ps(0.5f), mhalf = _mm512_set1_ps(-0.5f);
    const __m512i one = _mm512_set1_epi32(1);
    for (int h = 0; h < 2; h++) {
        __m512 v = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(h ? b : a, vi), lo), hi);
        __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC), f = _mm512_sub_ps(v, t);
        __m512i i = _mm512_cvttps_epi32(t);
        i = _mm512_mask_add_epi32(i, _mm512_cmp_ps_mask(f, half, _CMP_GE_OQ), i, one);
        i = _mm512_mask_sub_epi32(i, _mm512_cmp_ps_mask(f, mhalf, _CMP_LE_OQ), i, one);
        _mm_storeu_si128((__m128i *)(out + 16 * h), _mm512_cvtepi32_epi8(i));
    }
    return 1;
}

/* Each lane keeps its first maximum and where it was; the lowest index among the lanes holding the largest.
 * -1 if x holds a NaN (the scalar loop's answer then depends on where). */
T5 static int first_max5(const float *x, int n)
{
    __m512 best = _mm512_loadu_ps(x);
    __m512i bidx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), idx = bidx;
    const __m512i step = _mm512_set1_epi32(16);
    __mmask16 nan = _mm512_cmp_ps_mask(best, best, _CMP_UNORD_Q);
    int i = 16;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        idx = _mm512_add_epi32(idx, step);
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        __mmask16 gt = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ);
        best = _mm512_mask_mov_ps(best, gt, v);
        bidx = _mm512_mask_mov_epi32(bidx, gt, idx);
    }
    if (nan)
        return -1;
    float mv = _mm512_reduce_max_ps(best);
    __mmask16 at = _mm512_cmp_ps_mask(best, _mm512_set1_ps(mv), _CMP_EQ_OQ);
    int b = _mm512_reduce_min_epi32(_mm512_mask_mov_epi32(_mm512_set1_epi32(0x7fffffff), at, bidx));
    for (; i < n; i++) {
        if (x[i] != x[i])
            return -1;
        if (x[i] > mv)
            mv = x[i], b = i;
    }
    return b;
}
#endif

/* One block as q8_block_scalar gives it, on the vector unit when the level allows. */
static void q8_block(const float *x, int n, int8_t *out, float *scale, int lv)
{
#if SP_X86
    if (lv >= 2 && n == Q8_BLOCK && q8_block5(x, out, scale))
        return;
#endif
    (void)lv;
    q8_block_scalar(x, n, out, scale);
}

int sp_argmax(const float *x, int n)
{
    if (n <= 0)
        return 0;
#if SP_X86
    if (n >= 16 && kern_level() >= 2) {
        int b = first_max5(x, n);
        if (b >= 0)
            return b;
    }
#endif
    return first_max_scalar(x, n);
}

/* ---------------------------------------------------------------------------------------------- */
/* Q8 in integers, a group of 16 rows at a time: X quantised (XQ rows of nb * 32 bytes, XS rows of nb scales,
 * XC rows of nb corrections -128 * the block's sum of XQ); out[b * 16 + l] = row 16 g + l . X[b]. */

typedef void (*q8g_fn)(const sp_qmat *m, int g, const int8_t *XQ, const float *XS, const int32_t *XC, int B,
                       float *out);

static inline int32_t load_i32(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

#if SP_X86
/* AVX2: the stored bytes' sign bit flipped back (signed weights), |w| times x with w's sign (maddubs), pairs
 * summed (madd): 8 rows a vector, two halves a group. */
T2 static void q8g_avx2(const sp_qmat *m, int g, const int8_t *XQ, const float *XS, const int32_t *XC, int B,
                        float *out)
{
    (void)XC;
    int nb = blocks_per_row(SP_W_Q8, m->cols);
    const uint8_t *w = (const uint8_t *)m->q + (size_t)g * q8_group_bytes(nb);
    const float *sc = m->scale + (size_t)g * nb * Q8_GROUP;
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    __m256 acc[MAXB][2];
    for (int b = 0; b < B; b++)
        acc[b][0] = acc[b][1] = _mm256_setzero_ps();
    for (int blk = 0; blk < nb; blk++, w += Q8_BLOCK * Q8_GROUP, sc += Q8_GROUP)
        for (int h = 0; h < 2; h++) {
            __m256i d[MAXB];
            for (int b = 0; b < B; b++)
                d[b] = _mm256_setzero_si256();
            for (int k = 0; k < 8; k++) {
                __m256i ws = _mm256_xor_si256(_mm256_load_si256((const __m256i *)(w + k * 64 + h * 32)), flip);
                __m256i wa = _mm256_sign_epi8(ws, ws);
                for (int b = 0; b < B; b++) {
                    __m256i x = _mm256_set1_epi32(load_i32(XQ + (size_t)b * nb * Q8_BLOCK + blk * Q8_BLOCK + 4 * k));
                    __m256i p = _mm256_maddubs_epi16(wa, _mm256_sign_epi8(x, ws)); /* 2 x 127 x 127 fits */
                    d[b] = _mm256_add_epi32(d[b], _mm256_madd_epi16(p, ones));
                }
            }
            __m256 s = _mm256_loadu_ps(sc + h * 8);
            for (int b = 0; b < B; b++)
                acc[b][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d[b]),
                                            _mm256_mul_ps(s, _mm256_set1_ps(XS[(size_t)b * nb + blk])), acc[b][h]);
        }
    for (int b = 0; b < B; b++) {
        _mm256_storeu_ps(out + b * 16, acc[b][0]);
        _mm256_storeu_ps(out + b * 16 + 8, acc[b][1]);
    }
}

#define T5V __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

/* AVX-512 VNNI: dpbusd of the stored (unsigned, w + 128) bytes with x broadcast 4 bytes at a time gives the 16
 * rows' sums of (w + 128) x; starting from -128 * sum(x) (XC) leaves sum(w x), exact in int32. Two chains
 * of four products per block (dpbusd's latency). */
T5V static void q8g_vnni(const sp_qmat *m, int g, const int8_t *XQ, const float *XS, const int32_t *XC, int B,
                         float *out)
{
    int nb = blocks_per_row(SP_W_Q8, m->cols);
    const uint8_t *w = (const uint8_t *)m->q + (size_t)g * q8_group_bytes(nb);
    const float *sc = m->scale + (size_t)g * nb * Q8_GROUP;
    __m512 acc[MAXB];
    for (int b = 0; b < B; b++)
        acc[b] = _mm512_setzero_ps();
    if (B == 1) {
        for (int blk = 0; blk < nb; blk++, w += Q8_BLOCK * Q8_GROUP, sc += Q8_GROUP) {
            const int8_t *xq = XQ + blk * Q8_BLOCK;
            __m512i d0 = _mm512_set1_epi32(XC[blk]), d1 = _mm512_setzero_si512();
            for (int k = 0; k < 4; k++) {
                d0 = _mm512_dpbusd_epi32(d0, _mm512_load_si512((const void *)(w + k * 64)),
                                         _mm512_set1_epi32(load_i32(xq + 4 * k)));
                d1 = _mm512_dpbusd_epi32(d1, _mm512_load_si512((const void *)(w + (k + 4) * 64)),
                                         _mm512_set1_epi32(load_i32(xq + 4 * (k + 4))));
            }
            __m512 f = _mm512_cvtepi32_ps(_mm512_add_epi32(d0, d1));
            acc[0] = _mm512_fmadd_ps(f, _mm512_mul_ps(_mm512_loadu_ps(sc), _mm512_set1_ps(XS[blk])), acc[0]);
        }
        _mm512_storeu_ps(out, acc[0]);
        return;
    }
    for (int blk = 0; blk < nb; blk++, w += Q8_BLOCK * Q8_GROUP, sc += Q8_GROUP) {
        __m512i d[MAXB];
        for (int b = 0; b < B; b++)
            d[b] = _mm512_set1_epi32(XC[(size_t)b * nb + blk]);
        for (int k = 0; k < 8; k++) {
            __m512i wv = _mm512_load_si512((const void *)(w + k * 64));
            for (int b = 0; b < B; b++)
                d[b] = _mm512_dpbusd_epi32(d[b], wv,
                                           _mm512_set1_epi32(load_i32(XQ + (size_t)b * nb * Q8_BLOCK + blk * Q8_BLOCK + 4 * k)));
        }
        __m512 s = _mm512_loadu_ps(sc);
        for (int b = 0; b < B; b++)
            acc[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[b]), _mm512_mul_ps(s, _mm512_set1_ps(XS[(size_t)b * nb + blk])),
                                     acc[b]);
    }
    for (int b = 0; b < B; b++)
        _mm512_storeu_ps(out + b * 16, acc[b]);
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

static int kern_level(void) { return sp_kern_level(); }

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
    /* Q8: its f32 products are the integer kernels' fallback only (a scratch that could not grow) */
    static const dot_fn l2[SP_W__COUNT] = {dot5_f32, dot5_bf16, dot_scalar, dot5_nf4};
    static const dot_fn l1[SP_W__COUNT] = {dot2_f32, dot2_bf16, dot_scalar, dot2_nf4};
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
/* attention's products over cached rows (keys, values), on the calling thread */

static void dot_rows_scalar(const float *W, size_t ldw, int rows, int cols, const float *x, float scale, float *y)
{
    for (int r = 0; r < rows; r++) {
        const float *w = W + (size_t)r * ldw;
        float s = 0;
        for (int c = 0; c < cols; c++)
            s += w[c] * x[c];
        y[r] = s * scale;
    }
}

static void axpy_rows_scalar(const float *W, size_t ldw, int rows, int cols, const float *p, float *y, int c)
{
    for (int r = 0; r < rows; r++) {
        const float *w = W + (size_t)r * ldw;
        for (int k = c; k < cols; k++)
            y[k] += p[r] * w[k];
    }
}

#if SP_X86
/* Keys: four rows at a time (four independent sums, x read once for them), the columns a vector at a time, the
 * last ones under a mask (AVX-512) or one by one (AVX2). A decode step runs this over every cached position of
 * every head: it is the longest loop of long-context attention. */
T2 static void dot_rows2(const float *W, size_t ldw, int rows, int cols, const float *x, float scale, float *y)
{
    int cv = cols & ~7, r = 0;
    for (; r + 4 <= rows; r += 4) {
        const float *w0 = W + (size_t)r * ldw, *w1 = w0 + ldw, *w2 = w1 + ldw, *w3 = w2 + ldw;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        for (int c = 0; c < cv; c += 8) {
            __m256 xv = _mm256_loadu_ps(x + c);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + c), xv, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + c), xv, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + c), xv, a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + c), xv, a3);
        }
        float s[4] = {hsum8(a0), hsum8(a1), hsum8(a2), hsum8(a3)};
        for (int c = cv; c < cols; c++) {
            s[0] += w0[c] * x[c];
            s[1] += w1[c] * x[c];
            s[2] += w2[c] * x[c];
            s[3] += w3[c] * x[c];
        }
        for (int k = 0; k < 4; k++)
            y[r + k] = s[k] * scale;
    }
    for (; r < rows; r++) {
        const float *w = W + (size_t)r * ldw;
        __m256 a = _mm256_setzero_ps();
        for (int c = 0; c < cv; c += 8)
            a = _mm256_fmadd_ps(_mm256_loadu_ps(w + c), _mm256_loadu_ps(x + c), a);
        float s = hsum8(a);
        for (int c = cv; c < cols; c++)
            s += w[c] * x[c];
        y[r] = s * scale;
    }
}

T5 static void dot_rows5(const float *W, size_t ldw, int rows, int cols, const float *x, float scale, float *y)
{
    int cv = cols & ~15, r = 0;
    __mmask16 mt = (__mmask16)((1u << (cols - cv)) - 1);
    for (; r + 4 <= rows; r += 4) {
        const float *w0 = W + (size_t)r * ldw, *w1 = w0 + ldw, *w2 = w1 + ldw, *w3 = w2 + ldw;
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
        for (int c = 0; c < cv; c += 16) {
            __m512 xv = _mm512_loadu_ps(x + c);
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w0 + c), xv, a0);
            a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w1 + c), xv, a1);
            a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w2 + c), xv, a2);
            a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w3 + c), xv, a3);
        }
        if (mt) {
            __m512 xv = _mm512_maskz_loadu_ps(mt, x + cv);
            a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mt, w0 + cv), xv, a0);
            a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mt, w1 + cv), xv, a1);
            a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mt, w2 + cv), xv, a2);
            a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mt, w3 + cv), xv, a3);
        }
        y[r] = _mm512_reduce_add_ps(a0) * scale;
        y[r + 1] = _mm512_reduce_add_ps(a1) * scale;
        y[r + 2] = _mm512_reduce_add_ps(a2) * scale;
        y[r + 3] = _mm512_reduce_add_ps(a3) * scale;
    }
    for (; r < rows; r++) {
        const float *w = W + (size_t)r * ldw;
        __m512 a = _mm512_setzero_ps();
        for (int c = 0; c < cv; c += 16)
            a = _mm512_fmadd_ps(_mm512_loadu_ps(w + c), _mm512_loadu_ps(x + c), a);
        if (mt)
            a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mt, w + cv), _mm512_maskz_loadu_ps(mt, x + cv), a);
        y[r] = _mm512_reduce_add_ps(a) * scale;
    }
}

/* Values: columns in chunks of 8 vectors (128 with AVX-512: a whole head of 128 in registers), each chunk's sums held
 * in registers over every row; then one vector at a time; the rest scalar. */
T2 static void axpy_rows2(const float *W, size_t ldw, int rows, int cols, const float *p, float *y)
{
    int c = 0;
    for (; c + 64 <= cols; c += 64) {
        __m256 a[8];
        for (int k = 0; k < 8; k++)
            a[k] = _mm256_loadu_ps(y + c + 8 * k);
        for (int r = 0; r < rows; r++) {
            const float *w = W + (size_t)r * ldw + c;
            __m256 pr = _mm256_set1_ps(p[r]);
            for (int k = 0; k < 8; k++)
                a[k] = _mm256_fmadd_ps(pr, _mm256_loadu_ps(w + 8 * k), a[k]);
        }
        for (int k = 0; k < 8; k++)
            _mm256_storeu_ps(y + c + 8 * k, a[k]);
    }
    for (; c + 8 <= cols; c += 8) {
        __m256 a = _mm256_loadu_ps(y + c);
        for (int r = 0; r < rows; r++)
            a = _mm256_fmadd_ps(_mm256_set1_ps(p[r]), _mm256_loadu_ps(W + (size_t)r * ldw + c), a);
        _mm256_storeu_ps(y + c, a);
    }
    axpy_rows_scalar(W, ldw, rows, cols, p, y, c);
}

T5 static void axpy_rows5(const float *W, size_t ldw, int rows, int cols, const float *p, float *y)
{
    int c = 0;
    for (; c + 128 <= cols; c += 128) {
        __m512 a[8];
        for (int k = 0; k < 8; k++)
            a[k] = _mm512_loadu_ps(y + c + 16 * k);
        for (int r = 0; r < rows; r++) {
            const float *w = W + (size_t)r * ldw + c;
            __m512 pr = _mm512_set1_ps(p[r]);
            for (int k = 0; k < 8; k++)
                a[k] = _mm512_fmadd_ps(pr, _mm512_loadu_ps(w + 16 * k), a[k]);
        }
        for (int k = 0; k < 8; k++)
            _mm512_storeu_ps(y + c + 16 * k, a[k]);
    }
    for (; c + 16 <= cols; c += 16) {
        __m512 a = _mm512_loadu_ps(y + c);
        for (int r = 0; r < rows; r++)
            a = _mm512_fmadd_ps(_mm512_set1_ps(p[r]), _mm512_loadu_ps(W + (size_t)r * ldw + c), a);
        _mm512_storeu_ps(y + c, a);
    }
    if (c < cols) { /* the last columns under a mask */
        __mmask16 mk = (__mmask16)((1u << (cols - c)) - 1);
        __m512 a = _mm512_maskz_loadu_ps(mk, y + c);
        for (int r = 0; r < rows; r++)
            a = _mm512_fmadd_ps(_mm512_set1_ps(p[r]), _mm512_maskz_loadu_ps(mk, W + (size_t)r * ldw + c), a);
        _mm512_mask_storeu_ps(y + c, mk, a);
    }
}
#endif

void sp_f32_dot_rows(const float *W, size_t ldw, int rows, int cols, const float *x, float scale, float *y)
{
#if SP_X86
    int lv = sp_kern_level();
    if (lv >= 2) {
        dot_rows5(W, ldw, rows, cols, x, scale, y);
        return;
    }
    if (lv == 1) {
        dot_rows2(W, ldw, rows, cols, x, scale, y);
        return;
    }
#endif
    dot_rows_scalar(W, ldw, rows, cols, x, scale, y);
}

void sp_f32_axpy_rows(const float *W, size_t ldw, int rows, int cols, const float *p, float *y)
{
#if SP_X86
    int lv = sp_kern_level();
    if (lv >= 2) {
        axpy_rows5(W, ldw, rows, cols, p, y);
        return;
    }
    if (lv == 1) {
        axpy_rows2(W, ldw, rows, cols, p, y);
        return;
    }
#endif
    axpy_rows_scalar(W, ldw, rows, cols, p, y, 0);
}

/* ---------------------------------------------------------------------------------------------- */
/* products */

typedef struct mul_job {
    const sp_qmat *W;
    const float *X;
    float *Y;
    int B;
    dot_fn dot;
    q8g_fn q8g;        /* Q8 in integers (then XQ, XS, XC hold X quantised) */
    const int8_t *XQ;
    const float *XS;
    const int32_t *XC;
} mul_job;

/* Rows [lo, hi) of W (whole groups of 16 for the integer kernels) times every row of X, MAXB rows of X at a time:
 * a group's or a row's weights come from memory once and from the caches for the next rows of X. */
static void mul_part(void *ctx, int i, int n)
{
    mul_job *j = ctx;
    long lo, hi, R = j->W->rows;
    int nb = blocks_per_row(SP_W_Q8, j->W->cols);
    sp_pool_split(R, i, n, Q8_GROUP, &lo, &hi);
    if (j->q8g) { /* whole groups of 16 rows (lo is a multiple of 16) */
        float out[MAXB * Q8_GROUP];
        for (long r0 = lo; r0 < hi; r0 += Q8_GROUP) {
            int nr = hi - r0 < Q8_GROUP ? (int)(hi - r0) : Q8_GROUP;
            for (int b0 = 0; b0 < j->B; b0 += MAXB) {
                int bn = j->B - b0 < MAXB ? j->B - b0 : MAXB;
                size_t xb = (size_t)b0 * nb;
                j->q8g(j->W, (int)(r0 / Q8_GROUP), j->XQ + xb * Q8_BLOCK, j->XS + xb, j->XC + xb, bn, out);
                for (int b = 0; b < bn; b++)
                    memcpy(j->Y + (size_t)(b0 + b) * R + r0, out + b * Q8_GROUP, (size_t)nr * sizeof(float));
            }
        }
        return;
    }
    float out[MAXB];
    for (long r = lo; r < hi; r++)
        for (int b0 = 0; b0 < j->B; b0 += MAXB) {
            int bn = j->B - b0 < MAXB ? j->B - b0 : MAXB;
            j->dot(j->W, (int)r, j->X + (size_t)b0 * j->W->cols, bn, j->W->cols, out);
            for (int b = 0; b < bn; b++)
                j->Y[(size_t)(b0 + b) * R + r] = out[b];
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

static q8g_fn q8g_for(void);
int sp_kern_q8_integer(void) { return q8g_for() != NULL; }

static q8g_fn q8g_for(void)
{
#if SP_X86
    int lv = sp_kern_level();
    if (lv >= 2 && has_vnni > 0)
        return q8g_vnni;
    if (lv >= 1)
        return q8g_avx2;
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

/* Y = X W^T in the decode kernels, any B: each row of Y as B == 1 computes it. */
static void mul_kernels(const sp_qmat *W, const float *X, float *Y, int B, sp_pool *pool)
{
    mul_job j = {W, X, Y, B, dot_for(W), NULL, NULL, NULL, NULL};
    if (W->type == SP_W_Q8 && (j.q8g = q8g_for())) {
        int nb = blocks_per_row(SP_W_Q8, W->cols);
        size_t qbytes = ((size_t)B * nb * Q8_BLOCK + 63) & ~(size_t)63, n = (size_t)B * nb;
        uint8_t *buf = scratch_get(qbytes + n * (sizeof(float) + sizeof(int32_t)));
        if (buf) {
            int8_t *xq = (int8_t *)buf;
            float *xs = (float *)(buf + qbytes);
            int32_t *xc = (int32_t *)(xs + n);
            for (int b = 0; b < B; b++)
                sp_q8_quantize(X + (size_t)b * W->cols, W->cols, xq + (size_t)b * nb * Q8_BLOCK, xs + (size_t)b * nb);
            for (size_t k = 0; k < n; k++) { /* -128 * each block's sum: what the stored offset adds */
                int32_t sum = 0;
                for (int c = 0; c < Q8_BLOCK; c++)
                    sum += xq[k * Q8_BLOCK + (size_t)c];
                xc[k] = -128 * sum;
            }
            j.XQ = xq;
            j.XS = xs;
            j.XC = xc;
        } else {
            j.q8g = NULL; /* no room: the f32 kernel */
        }
    }
    sp_pool_run_parts(pool, mul_part, &j, mul_parts(W, pool));
}

void sp_qmat_mul_rows(const sp_qmat *W, const float *X, float *Y, int B, sp_pool *pool)
{
    if (B > 0 && W->rows > 0)
        mul_kernels(W, X, Y, B, pool);
}

void sp_qmat_mul(const sp_qmat *W, const float *X, float *Y, int B, sp_pool *pool)
{
    if (B <= 0 || W->rows <= 0)
        return;
    if (B <= MAXB) {
        mul_kernels(W, X, Y, B, pool);
        return;
    }
    if (W->type == SP_W_F32) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, W->rows, W->cols, 1.0f, X, W->cols,
                    (const float *)W->q, W->cols, 0.0f, Y, W->rows);
        return;
    }
    float *tile = malloc((size_t)TILE_ROWS * W->cols * sizeof(float));
    if (!tile) { /* no room for a tile: the decode kernels */
        mul_kernels(W, X, Y, B, pool);
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
    for (int r0 = 0; r0 < R; r0 += Q8_GROUP) { /* approx[r] becomes the row's upper bound */
        const float *sc = S->scale + (size_t)r0 * nb; /* the group's scales, block by block (16 a block) */
        float bound[Q8_GROUP] = {0};
        for (int b = 0; b < nb; b++)
            for (int l = 0; l < Q8_GROUP; l++)
                bound[l] += sc[b * Q8_GROUP + l] * K[b];
        for (int l = 0; l < Q8_GROUP && r0 + l < R; l++) {
            float a = approx[r0 + l], bd = bound[l] + fabsf(a) * 1e-5f;
            chk += (a + bd) * 0.0f; /* NaN if anything is not finite */
            lo = a - bd > lo ? a - bd : lo;
            approx[r0 + l] = a + bd;
        }
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
