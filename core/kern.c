/* kern.c - encoded weight matrices and their products: encoders, row decoders, the decode kernels in four
 * levels (scalar reference, AVX2+FMA, AVX2 with AVX-VNNI, AVX-512) behind one dispatch that SEPAL_ISA and
 * sp_kern_force cap, and the large products on sgemm. */
#include "kern.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blastune.h"
#include "half.h"
#include "log.h"
#include "opt.h"
#include "memtune.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define SP_X86 1
#else
#define SP_X86 0
#endif

#define Q8_BLOCK 32
#define NF4_BLOCK 64
#define GROUP 16       /* Q8 and NF4: rows interleaved 16 at a time */
#define GROUP_BLOCK 512 /* bytes of one block of a group: 16 rows x 32 int8, or x 64 nibbles */
#define MAXB SP_KERN_MAX_ROWS

static void q8_block(const float *x, int n, int8_t *out, float *scale, int lv);
static void f16_decode(const uint16_t *h, float *out, int n);

/* NF4's levels as integers (bitsandbytes' code book times 127, rounded): weight = level x the block's step. */
static const int8_t nf4_q[16] = {-127, -88, -67, -50, -36, -23, -12, 0, 10, 20, 31, 43, 56, 71, 92, 127};
/* ... and + 128, unsigned (VNNI's dpbusd multiplies unsigned bytes; the sum of x times 128 is taken off) */
static const uint8_t nf4_u[16] = {1, 40, 61, 78, 92, 105, 116, 128, 138, 148, 159, 171, 184, 199, 220, 255};

const float sp_nf4_levels[16] = {-127 / 127.0f, -88 / 127.0f, -67 / 127.0f, -50 / 127.0f, -36 / 127.0f, -23 / 127.0f,
                                 -12 / 127.0f,  0.0f,         10 / 127.0f,  20 / 127.0f,  31 / 127.0f,  43 / 127.0f,
                                 56 / 127.0f,   71 / 127.0f,  92 / 127.0f,  127 / 127.0f};

static const char *const wnames[SP_W__COUNT] = {"f32", "bf16", "int8", "nf4", "fp16"};

const char *sp_wtype_name(sp_wtype t) { return (unsigned)t < SP_W__COUNT ? wnames[t] : "?"; }

int sp_wtype_parse(const char *name, sp_wtype *t)
{
    for (int i = 0; i < SP_W__COUNT; i++)
        if (!strcmp(name, wnames[i])) {
            *t = (sp_wtype)i;
            return 0;
        }
    char canon[16];
    return sp_opt_alias(SP_WTYPE_ALIASES, name, canon, sizeof canon) ? -1 : sp_wtype_parse(canon, t);
}

static int grouped(sp_wtype t) { return t == SP_W_Q8 || t == SP_W_NF4; }

static int blocks_per_row(sp_wtype t, int cols)
{
    int b = t == SP_W_Q8 ? Q8_BLOCK : NF4_BLOCK;
    return (cols + b - 1) / b;
}

static size_t row_bytes(sp_wtype t, int cols)
{
    switch (t) {
    case SP_W_F32: return (size_t)cols * 4;
    case SP_W_BF16:
    case SP_W_F16: return (size_t)cols * 2;
    case SP_W_Q8: return (size_t)cols;
    case SP_W_NF4: return (size_t)blocks_per_row(t, cols) * (NF4_BLOCK / 2);
    default: return 0;
    }
}

size_t sp_qmat_bytes(sp_wtype t, int rows, int cols)
{
    if (grouped(t)) { /* groups of 16 rows, blocks of 32 (int8) or 64 (nf4) columns (see the layouts below) */
        size_t groups = ((size_t)rows + GROUP - 1) / GROUP, nb = (size_t)blocks_per_row(t, cols);
        return groups * nb * (GROUP_BLOCK + GROUP * sizeof(float));
    }
    return (size_t)rows * row_bytes(t, cols);
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

/* The grouped layouts, Q8's and NF4's: rows in groups of 16 (the last group padded with zero rows), each
 * group's block b as 512 bytes in eight 64-byte units, unit k holding the 16 rows in turn, 4 bytes a row, and
 * the group's steps (scales) of block b as 16 floats (a row each). So one 64-byte load gives 16 rows' next
 * weights and a product needs no horizontal sums.
 *   Q8: unit k holds columns 4k..4k+3 of the block (a block is 32 columns), each value stored as its int8
 *       value + 128 (the sign bit flipped: an unsigned byte, what VNNI's dpbusd wants).
 *   NF4: unit k holds columns 8k..8k+7 (a block is 64 columns): byte j of a row's 4 has column 8k + j in its
 *       low nibble and 8k + 4 + j in its high one; a nibble indexes nf4_q. So the low nibbles of a unit are a
 *       Q8 unit of 4 columns and the high nibbles the next one, each a table lookup (pshufb) away.
 * A short last block is padded with zeros (NF4: index 7, the level 0). */
static inline size_t group_at(int nb, int r) { return (size_t)(r / GROUP) * nb * GROUP_BLOCK; }

static inline size_t q8_at(int nb, int r, int c)
{
    int k = (c % Q8_BLOCK) / 4;
    return group_at(nb, r) + (size_t)(c / Q8_BLOCK) * GROUP_BLOCK + (size_t)k * 64 + (size_t)(r % GROUP) * 4 +
           (size_t)(c % 4);
}

/* The byte of NF4 weight (r, c); *shift: 0 for the low nibble, 4 for the high one. */
static inline size_t nf4_at(int nb, int r, int c, int *shift)
{
    int k = (c % NF4_BLOCK) / 8, j = c % 8;
    *shift = j < 4 ? 0 : 4;
    return group_at(nb, r) + (size_t)(c / NF4_BLOCK) * GROUP_BLOCK + (size_t)k * 64 + (size_t)(r % GROUP) * 4 +
           (size_t)(j & 3);
}

static inline size_t scale_at(int nb, int r, int b)
{
    return ((size_t)(r / GROUP) * nb + b) * GROUP + (size_t)(r % GROUP);
}

/* Weight (r, c) of a Q8 or NF4 matrix as an integer; its step is m->scale[scale_at(nb, r, c / block)]. */
static inline int int_weight(const sp_qmat *m, int nb, int r, int c)
{
    const uint8_t *q = (const uint8_t *)m->q;
    if (m->type == SP_W_Q8)
        return (int8_t)(q[q8_at(nb, r, c)] ^ 0x80);
    int sh;
    size_t at = nf4_at(nb, r, c, &sh);
    return nf4_q[(q[at] >> sh) & 15];
}

/* Weight (r, c) of a Q8 or NF4 matrix. */
static inline float grouped_weight(const sp_qmat *m, int r, int c)
{
    int nb = blocks_per_row(m->type, m->cols), blk = m->type == SP_W_Q8 ? Q8_BLOCK : NF4_BLOCK;
    return (float)int_weight(m, nb, r, c) * m->scale[scale_at(nb, r, c / blk)];
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


/* The nearest NF4 level of v (in units of the block's absmax): binary search on the midpoints. */
static int nf4_index(float v)
{
    int lo = 0, hi = 15;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (v > 0.5f * (sp_nf4_levels[mid] + sp_nf4_levels[mid + 1]))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void encode_q8(sp_qmat *m, int r, const float *w)
{
    int C = m->cols, nb = blocks_per_row(SP_W_Q8, C), lv = sp_kern_level();
    for (int b = 0; b < nb; b++) {
        int c0 = b * Q8_BLOCK, c1 = c0 + Q8_BLOCK < C ? c0 + Q8_BLOCK : C;
        int8_t q[Q8_BLOCK];
        q8_block(w + c0, c1 - c0, q, &m->scale[scale_at(nb, r, b)], lv);
        uint8_t *d = (uint8_t *)m->q + q8_at(nb, r, c0);
        for (int k = 0; k < Q8_BLOCK / 4; k++) { /* 4 values a unit; the padding stays 0 (0x80) */
            uint32_t v;
            memcpy(&v, q + 4 * k, 4);
            v ^= 0x80808080u;
            memcpy(d + k * 64, &v, 4);
        }
    }
}

static void encode_nf4(sp_qmat *m, int r, const float *w)
{
    int C = m->cols, nb = blocks_per_row(SP_W_NF4, C);
    uint8_t *q = (uint8_t *)m->q;
    for (int b = 0; b < nb; b++) {
        int c0 = b * NF4_BLOCK, c1 = c0 + NF4_BLOCK < C ? c0 + NF4_BLOCK : C;
        float amax = 0;
        for (int c = c0; c < c1; c++)
            amax = fabsf(w[c]) > amax ? fabsf(w[c]) : amax;
        m->scale[scale_at(nb, r, b)] = amax / 127.0f;
        float inv = amax > 0 ? 1.0f / amax : 0;
        for (int c = c0; c < c1; c++) { /* the padding stays index 7 (0x77) */
            int sh;
            size_t at = nf4_at(nb, r, c, &sh);
            q[at] = (uint8_t)((q[at] & ~(15 << sh)) | nf4_index(w[c] * inv) << sh);
        }
    }
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
    } else if (m->type == SP_W_F16) { /* (the range was checked: finite, at most 65504, no infinity made) */
        uint16_t *d = (uint16_t *)dst;
        for (int c = 0; c < C; c++)
            d[c] = sp_f32_to_f16(w[c]);
    } else if (m->type == SP_W_Q8) {
        encode_q8(m, r, w);
    } else if (m->type == SP_W_NF4) {
        encode_nf4(m, r, w);
    }
}

/* fp16 holds finite values up to 65504 in magnitude: 1 (and err says which weight) if w has another. A weight
 * from 65504 to 65520 would round to 65504, above it to infinity: both refused alike (a checkpoint holding one
 * is not an fp16 model; bf16 or f32 hold it). */
static int f16_out_of_range(const float *w, int rows, int cols, sp_err *err)
{
    size_t n = (size_t)rows * (size_t)cols;
    for (size_t i0 = 0; i0 < n; i0 += 4096) { /* a branch-free pass a run of 4096 (vectorised), then where */
        size_t i1 = n - i0 < 4096 ? n : i0 + 4096;
        int bad = 0;
        for (size_t i = i0; i < i1; i++)
            bad |= !(fabsf(w[i]) <= 65504.0f);
        for (size_t i = i0; bad && i < i1; i++)
            if (!(fabsf(w[i]) <= 65504.0f)) {
                sp_errf(err, SP_ERR_ARG, "weights: [%d, %d]: weight (%zu, %zu) = %g %s", rows, cols, i / (size_t)cols,
                        i % (size_t)cols, (double)w[i],
                        isfinite(w[i]) ? "is beyond fp16's largest finite value 65504 (keep the weights in bf16 or f32)"
                                       : "is not finite: fp16 holds finite weights only");
                return 1;
            }
    }
    return 0;
}

sp_status sp_qmat_encode(sp_qmat *m, sp_wtype t, const float *w, int rows, int cols, sp_err *err)
{
    memset(m, 0, sizeof *m);
    if ((unsigned)t >= SP_W__COUNT || rows < 0 || cols <= 0)
        return sp_errf(err, SP_ERR_ARG, "weights: bad encoding or shape [%d, %d]", rows, cols);
    if (t == SP_W_F16 && f16_out_of_range(w, rows, cols, err))
        return SP_ERR_ARG;
    m->type = t;
    m->rows = rows;
    m->cols = cols;
    m->row_bytes = row_bytes(t, cols);
    m->owned = 1;
    /* 64-byte alignment, and rows padded so that a kernel's 32-byte loads stay inside; Q8 and NF4: whole groups
     * of 16 rows, zeros (stored as 0x80, NF4 0x77) in the padding */
    int nb = grouped(t) ? blocks_per_row(t, cols) : 0;
    size_t srows = nb ? ((size_t)rows + GROUP - 1) / GROUP * GROUP : (size_t)rows;
    size_t data = nb ? srows / GROUP * nb * GROUP_BLOCK : (size_t)rows * m->row_bytes;
    size_t qb = (data + 64 + 63) & ~(size_t)63;
    m->q = sp_mem_alloc_weights(qb ? qb : 64);
    if (nb)
        m->scale = calloc(srows * nb + 1, sizeof(float));
    if (!m->q || (nb && !m->scale)) {
        sp_qmat_free(m);
        return sp_errf(err, SP_ERR_NOMEM, "weights: out of memory for [%d, %d] %s", rows, cols, sp_wtype_name(t));
    }
    memset(m->q, t == SP_W_Q8 ? 0x80 : t == SP_W_NF4 ? 0x77 : 0, qb);
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

/* Row r of a Q8 or NF4 matrix decoded a block at a time, as grouped_weight gives each weight (the tiles of
 * large products decode through this). */
static void grouped_row(const sp_qmat *m, int r, float *out)
{
    int C = m->cols, nf4 = m->type == SP_W_NF4, blk = nf4 ? NF4_BLOCK : Q8_BLOCK, nb = blocks_per_row(m->type, C);
    const uint8_t *row = (const uint8_t *)m->q + group_at(nb, r) + (size_t)(r % GROUP) * 4;
    float v[NF4_BLOCK];
    for (int b = 0; b < nb; b++) {
        const uint8_t *u = row + (size_t)b * GROUP_BLOCK;
        float st = m->scale[scale_at(nb, r, b)];
        for (int k = 0; k < 8; k++)
            for (int j = 0; j < 4; j++) {
                uint8_t q = u[k * 64 + j];
                if (nf4) {
                    v[8 * k + j] = (float)nf4_q[q & 15] * st;
                    v[8 * k + 4 + j] = (float)nf4_q[q >> 4] * st;
                } else {
                    v[4 * k + j] = (float)(int8_t)(q ^ 0x80) * st;
                }
            }
        int c0 = b * blk, n = C - c0 < blk ? C - c0 : blk;
        memcpy(out + c0, v, (size_t)n * sizeof(float));
    }
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
    case SP_W_F16: f16_decode((const uint16_t *)src, out, C); break;
    case SP_W_Q8:
    case SP_W_NF4: grouped_row(m, r, out); break;
    default: memset(out, 0, (size_t)C * 4);
    }
}

void sp_qmat_int_row(const sp_qmat *m, int r, int8_t *q, float *scales)
{
    int C = m->cols, nb = blocks_per_row(m->type, C), per = m->type == SP_W_Q8 ? 1 : NF4_BLOCK / Q8_BLOCK;
    for (int c = 0; c < C; c++)
        q[c] = (int8_t)int_weight(m, nb, r, c);
    for (int k = 0; k < (C + Q8_BLOCK - 1) / Q8_BLOCK; k++)
        scales[k] = m->scale[scale_at(nb, r, k / per)];
}

void sp_q8_quantize(const float *x, int n, int8_t *q, float *s)
{
    int nb = (n + Q8_BLOCK - 1) / Q8_BLOCK, lv = sp_kern_level();
    for (int b = 0; b < nb; b++) {
        int c0 = b * Q8_BLOCK, c1 = c0 + Q8_BLOCK < n ? c0 + Q8_BLOCK : n;
        q8_block(x + c0, c1 - c0, q + c0, s + b, lv);
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* the scalar reference: out[b] = row r . X[b] for b < B (X rows ldx apart) */

/* Weight (r, c) of any encoding, src its row (the grouped layouts ignore it). */
static inline float weight_at(const sp_qmat *m, const uint8_t *src, int r, int c)
{
    switch (m->type) {
    case SP_W_F32: return ((const float *)src)[c];
    case SP_W_BF16: return bf16_to_f32(((const uint16_t *)src)[c]);
    case SP_W_F16: return sp_f16_to_f32(((const uint16_t *)src)[c]);
    default: return grouped_weight(m, r, c);
    }
}

static void dot_scalar(const sp_qmat *m, int r, const float *X, int B, int ldx, float *out)
{
    double acc[MAXB] = {0};
    const uint8_t *src = (const uint8_t *)m->q + (size_t)r * m->row_bytes;
    for (int c = 0; c < m->cols; c++) {
        float w = weight_at(m, src, r, c);
        for (int b = 0; b < B; b++)
            acc[b] += (double)w * X[(size_t)b * ldx + c];
    }
    for (int b = 0; b < B; b++)
        out[b] = (float)acc[b];
}

/* The weights [c0, C) of a row that the vector loop leaves (fewer than a vector), dotted with the B rows of X
 * into out (added). */
static void dot_tail(const sp_qmat *m, int r, int c0, const float *X, int B, int ldx, float *out)
{
    const uint8_t *src = (const uint8_t *)m->q + (size_t)r * m->row_bytes;
    for (int b = 0; b < B; b++) {
        float s = 0;
        for (int c = c0; c < m->cols; c++)
            s += weight_at(m, src, r, c) * X[(size_t)b * ldx + c];
        out[b] += s;
    }
}

/* A kernel for one encoding at one level: LOAD(src, c) gives the W weights at column c as a vector.
 * Every row of X has four accumulators (columns c, c + W, c + 2W, c + 3W of each 4W run), summed the same way
 * whatever B is: a row's result never depends on the rows beside it (a batch of decode steps gives each step the
 * bits it gets alone). The rows go G at a time (G: what the level's registers hold), the weights loaded once for
 * the G of them; B == 1 runs a group of one. */
#define DEFINE_DOT(NAME, TARGET, VEC, W, ZERO, FMA, LOADX, ADD, HSUM, LOAD, ESZ, G)                                  \
    TARGET static inline __attribute__((always_inline)) void NAME##_rows(const uint8_t *src, int cv,            \
                                                                          const float *X, int g, int gmax,      \
                                                                          int ldx, float *out)                  \
    {                                                                                                          \
        const float *xs[G];                                                                                    \
        VEC acc[G][4];                                                                                         \
        for (int k = 0; k < gmax; k++) {                                                                       \
            xs[k] = X + (size_t)(k < g ? k : 0) * ldx; /* past the rows: row 0 again, its result dropped */    \
            acc[k][0] = acc[k][1] = acc[k][2] = acc[k][3] = ZERO();                                            \
        }                                                                                                      \
        int c = 0;                                                                                             \
        for (; c + 4 * W <= cv; c += 4 * W) {                                                                  \
            for (int l = 0; l < 4 * W * ESZ; l += 64)                                                          \
                __builtin_prefetch(src + (size_t)c * ESZ + DOT_AHEAD + l, 0, 3);                               \
            VEC w0 = LOAD(src, c), w1 = LOAD(src, c + W), w2 = LOAD(src, c + 2 * W), w3 = LOAD(src, c + 3 * W);  \
            for (int k = 0; k < gmax; k++) {                                                                   \
                acc[k][0] = FMA(w0, LOADX(xs[k] + c), acc[k][0]);                                              \
                acc[k][1] = FMA(w1, LOADX(xs[k] + c + W), acc[k][1]);                                          \
                acc[k][2] = FMA(w2, LOADX(xs[k] + c + 2 * W), acc[k][2]);                                      \
                acc[k][3] = FMA(w3, LOADX(xs[k] + c + 3 * W), acc[k][3]);                                      \
            }                                                                                                  \
        }                                                                                                      \
        for (; c < cv; c += W) {                                                                               \
            VEC w0 = LOAD(src, c);                                                                             \
            for (int k = 0; k < gmax; k++)                                                                     \
                acc[k][0] = FMA(w0, LOADX(xs[k] + c), acc[k][0]);                                              \
        }                                                                                                      \
        for (int k = 0; k < g; k++)                                                                            \
            out[k] = HSUM(ADD(ADD(acc[k][0], acc[k][1]), ADD(acc[k][2], acc[k][3])));                          \
    }                                                                                                          \
    TARGET static void NAME(const sp_qmat *m, int r, const float *X, int B, int ldx, float *out)               \
    {                                                                                                          \
        const uint8_t *src = (const uint8_t *)m->q + (size_t)r * m->row_bytes;                                 \
        int cv = m->cols / W * W;                                                                              \
        if (B == 1)                                                                                            \
            NAME##_rows(src, cv, X, 1, 1, ldx, out);                                                           \
        for (int b0 = 0; B > 1 && b0 < B; b0 += G)                                                             \
            NAME##_rows(src, cv, X + (size_t)b0 * ldx, B - b0 < G ? B - b0 : G, G, ldx, out + b0);             \
        _mm256_zeroupper(); /* GCC 12 leaves the vectors' upper halves dirty here (no vzeroupper of its own) */ \
        if (cv < m->cols)                                                                                      \
            dot_tail(m, r, cv, X, B, ldx, out);                                                                \
    }

#define DEFINE_DOT_(...) DEFINE_DOT(__VA_ARGS__)
/* How far ahead of its loads a row's dot product prefetches (bytes; ESZ a weight's): as the integer kernels'
 * QG_AHEAD. [8192, 4096] from DRAM, 1 thread (AMD EPYC Zen 5), one row: f32 5.0 -> 3.7-3.9 ms, bf16 2.0 -> 1.4 ms
 * at avx512; at avx2 f32 5.2 -> 3.9, bf16 2.5 -> 1.5. */
#define DOT_AHEAD 12288

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

T2 static inline __m256 ld8_f32(const uint8_t *src, int c) { return _mm256_loadu_ps((const float *)src + c); }

T2 static inline __m256 ld8_bf16(const uint8_t *src, int c)
{
    __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)src + c)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

/* fp16: F16C's vcvtph2ps (exact: every half is an f32 value). The AVX2 level does not ask the CPU for F16C (every
 * AVX2 CPU known has it); where it lacks it, fp16 runs the scalar kernel at this level (dot_for, f16_decode). */
#define T2H __attribute__((target("avx2,fma,f16c")))

T2H static inline __m256 ld8_f16(const uint8_t *src, int c)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)src + c)));
}

#define AVX2_ARGS __m256, 8, _mm256_setzero_ps, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_add_ps, hsum8
DEFINE_DOT_(dot2_f32, T2, AVX2_ARGS, ld8_f32, 4, 2)
DEFINE_DOT_(dot2_bf16, T2, AVX2_ARGS, ld8_bf16, 2, 2)
DEFINE_DOT_(dot2_f16, T2H, AVX2_ARGS, ld8_f16, 2, 2)

/* A row of fp16 to f32, 8 at a time (the tiles of the large products decode through it). */
T2H static void f16_decode2(const uint16_t *h, float *out, int n)
{
    int c = 0;
    for (; c + 8 <= n; c += 8)
        _mm256_storeu_ps(out + c, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + c))));
    _mm256_zeroupper(); /* (before the scalar tail, as the dot kernels) */
    for (; c < n; c++)
        out[c] = sp_f16_to_f32(h[c]);
}

/* ---------------------------------------------------------------------------------------------- */
/* AVX-512: 16 weights a vector */

#define T5 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

T5 static inline float hsum16(__m512 v) { return _mm512_reduce_add_ps(v); }

T5 static inline __m512 ld16_f32(const uint8_t *src, int c) { return _mm512_loadu_ps((const float *)src + c); }

T5 static inline __m512 ld16_bf16(const uint8_t *src, int c)
{
    __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)src + c)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}

/* fp16: AVX512F's vcvtph2ps (no F16C needed) */
T5 static inline __m512 ld16_f16(const uint8_t *src, int c)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)src + c)));
}

#define AVX512_ARGS __m512, 16, _mm512_setzero_ps, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_add_ps, hsum16
DEFINE_DOT_(dot5_f32, T5, AVX512_ARGS, ld16_f32, 4, 4)
DEFINE_DOT_(dot5_bf16, T5, AVX512_ARGS, ld16_bf16, 2, 4)
DEFINE_DOT_(dot5_f16, T5, AVX512_ARGS, ld16_f16, 2, 4)

T5 static void f16_decode5(const uint16_t *h, float *out, int n)
{
    int c = 0;
    for (; c + 16 <= n; c += 16)
        _mm512_storeu_ps(out + c, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + c))));
    _mm256_zeroupper();
    for (; c < n; c++)
        out[c] = sp_f16_to_f32(h[c]);
}
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

/* The step of a whole block whose absmax is amax, and its inverse, as the scalar loop computes them; 0 when the
 * vector loops must leave the block to it (NaN or infinity in the block or the inverse: its clamps treat NaN
 * their own way, and 0 * inf is NaN in a tiny block). */
static inline int q8_step(float amax, float *sc, float *inv)
{
    if (!(amax <= 3.4e38f))
        return 0;
    *sc = amax / 127.0f;
    *inv = *sc > 0 ? 1.0f / *sc : 0;
    return *inv <= 3.4e38f;
}

#if SP_X86
/* A whole block without NaN or infinity (else 0: the scalar loop): the same operations on 16 lanes; roundf's
 * halves away from zero by truncation and the exact fraction. */
T5 static int q8_block5(const float *x, int8_t *out, float *scale)
{
    __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b))), sc, inv;
    if (_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q) || _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q) || !q8_step(amax, &sc, &inv))
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

/* The same on 8 lanes: a comparison's all-ones lanes (-1) subtracted add one. */
T2 static int q8_block2(const float *x, int8_t *out, float *scale)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 v[4], m = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_loadu_ps(x + 8 * k);
        m = _mm256_max_ps(m, _mm256_and_ps(v[k], absmask));
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v[k], v[k], _CMP_UNORD_Q));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float amax = _mm_cvtss_f32(m4), sc, inv;
    if (_mm256_movemask_ps(nan) || !q8_step(amax, &sc, &inv))
        return 0;
    *scale = sc;
    const __m256 vi = _mm256_set1_ps(inv), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    const __m256 half = _mm256_set1_ps(0.5f), mhalf = _mm256_set1_ps(-0.5f);
    __m256i q[4];
    for (int k = 0; k < 4; k++) {
        __m256 a = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v[k], vi), lo), hi);
        __m256 t = _mm256_round_ps(a, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC), f = _mm256_sub_ps(a, t);
        __m256i i = _mm256_cvttps_epi32(t);
        i = _mm256_sub_epi32(i, _mm256_castps_si256(_mm256_cmp_ps(f, half, _CMP_GE_OQ)));
        q[k] = _mm256_add_epi32(i, _mm256_castps_si256(_mm256_cmp_ps(f, mhalf, _CMP_LE_OQ)));
    }
    /* packs work within 128-bit lanes: 4-byte runs come out as 0 8 16 24 4 12 20 28; the permute orders them */
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)out, p);
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

/* The same on 8 lanes, two vectors a step (two independent chains). */
T2 static int first_max2(const float *x, int n)
{
    __m256 b0 = _mm256_loadu_ps(x), b1 = _mm256_loadu_ps(x + 8);
    __m256i i0 = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), i1 = _mm256_add_epi32(i0, _mm256_set1_epi32(8));
    __m256i x0 = i0, x1 = i1;
    const __m256i step = _mm256_set1_epi32(16);
    __m256 nan = _mm256_or_ps(_mm256_cmp_ps(b0, b0, _CMP_UNORD_Q), _mm256_cmp_ps(b1, b1, _CMP_UNORD_Q));
    int i = 16;
    for (; i + 16 <= n; i += 16) {
        __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        x0 = _mm256_add_epi32(x0, step);
        x1 = _mm256_add_epi32(x1, step);
        nan = _mm256_or_ps(nan, _mm256_or_ps(_mm256_cmp_ps(v0, v0, _CMP_UNORD_Q), _mm256_cmp_ps(v1, v1, _CMP_UNORD_Q)));
        __m256 g0 = _mm256_cmp_ps(v0, b0, _CMP_GT_OQ), g1 = _mm256_cmp_ps(v1, b1, _CMP_GT_OQ);
        b0 = _mm256_blendv_ps(b0, v0, g0);
        b1 = _mm256_blendv_ps(b1, v1, g1);
        i0 = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(i0), _mm256_castsi256_ps(x0), g0));
        i1 = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(i1), _mm256_castsi256_ps(x1), g1));
    }
    if (_mm256_movemask_ps(nan))
        return -1;
    float lane[16];
    int at[16];
    _mm256_storeu_ps(lane, b0);
    _mm256_storeu_ps(lane + 8, b1);
    _mm256_storeu_si256((__m256i *)at, i0);
    _mm256_storeu_si256((__m256i *)(at + 8), i1);
    float mv = lane[0];
    int b = at[0];
    for (int k = 1; k < 16; k++) /* the largest, the lowest index among equals */
        if (lane[k] > mv || (lane[k] == mv && at[k] < b))
            mv = lane[k], b = at[k];
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
    if (n == Q8_BLOCK && lv >= SP_ISA_AVX512 && q8_block5(x, out, scale))
        return;
    if (n == Q8_BLOCK && lv >= SP_ISA_AVX2 && lv < SP_ISA_AVX512 && q8_block2(x, out, scale))
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
    int lv = sp_kern_level(), b = -1;
    if (n >= 16 && lv >= SP_ISA_AVX512)
        b = first_max5(x, n);
    else if (n >= 16 && lv >= SP_ISA_AVX2)
        b = first_max2(x, n);
    if (b >= 0)
        return b;
#endif
    return first_max_scalar(x, n);
}

/* ---------------------------------------------------------------------------------------------- */
/* Q8 and NF4 in integers, a group of 16 rows at a time: X quantised by blocks of 32 columns (XQ rows of nx * 32
 * bytes, XS rows of nx scales, XC rows of nx corrections -128 * the block's sum of XQ; nx = ceil(cols / 32));
 * out[b * 16 + l] = row 16 g + l . X[b]. A block of X meets 8 units of Q8 (4 columns each) or 4 of NF4 (8
 * columns each: two sets of 4); each set of 4 columns of 16 rows meets X's 4 values broadcast. */

typedef void (*qg_fn)(const sp_qmat *m, int g, const int8_t *XQ, const float *XS, const int32_t *XC, int B,
                      float *out);

static inline int32_t load_i32(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

#if SP_X86
#define INLINE inline __attribute__((always_inline))

/* A group kernel's body compiled four times: NF4 or Q8 (its unit loops unrolled, every chain in a register),
 * B == 1 or any B. */
#define QG_SPECIALISE(BODY, ...)                                                                               \
    do {                                                                                                       \
        if (m->type == SP_W_NF4)                                                                               \
            B == 1 ? BODY(__VA_ARGS__, 1, 1, out) : BODY(__VA_ARGS__, B, 1, out);                             \
        else                                                                                                   \
            B == 1 ? BODY(__VA_ARGS__, 1, 0, out) : BODY(__VA_ARGS__, B, 0, out);                             \
    } while (0)

/* Six times: B == MAXB too (a prefill's rows, 8 at a time). With B known the accumulators stay in registers:
 * at AVX-512 (32 of them) 2.3-2.6x the speed of B variable, whose accumulators lived on the stack; at AVX-VNNI
 * 1.4x. AVX2's, which would need twice as many, keeps its f32 accumulators in memory instead (qg2_body).
 * (A [768, 288] int8 / nf4 product of 128 rows, 1 thread, AMD EPYC Zen 5.) */
#define QG_SPECIALISE_MAXB(BODY, ...)                                                                          \
    do {                                                                                                       \
        if (B == MAXB && m->type == SP_W_NF4)                                                                  \
            BODY(__VA_ARGS__, MAXB, 1, out);                                                                   \
        else if (B == MAXB)                                                                                    \
            BODY(__VA_ARGS__, MAXB, 0, out);                                                                   \
        else                                                                                                   \
            QG_SPECIALISE(BODY, __VA_ARGS__);                                                                  \
    } while (0)

/* Where X's block xb starts in a group's weights, and the group's 16 steps for it. */
static INLINE const uint8_t *qg_units(const sp_qmat *m, int nb, int g, int xb)
{
    int nf4 = m->type == SP_W_NF4;
    return (const uint8_t *)m->q + group_at(nb, g * GROUP) + (size_t)(nf4 ? xb / 2 : xb) * GROUP_BLOCK +
           (size_t)(nf4 ? xb % 2 : 0) * (GROUP_BLOCK / 2);
}

static INLINE const float *qg_steps(const sp_qmat *m, int nb, int g, int xb)
{
    return m->scale + ((size_t)g * nb + (size_t)(m->type == SP_W_NF4 ? xb / 2 : xb)) * GROUP;
}

/* Ahead of block xb of a group: the group's weights and steps QG_AHEAD bytes of weights on (past a group's end
 * the next group's first: a thread's part runs its groups in order), into L1. The hardware prefetcher follows the
 * demand and lags it: with several rows of X a block's products take long enough that memory's latency shows, and
 * one row's stream ran below a plain read. [16384, 4096] from DRAM, 1 thread, avx512 (AMD EPYC Zen 5): int8 x 8
 * rows 90 -> 287 GMAC/s (219 when it sat in L3), x 1 row 1.69 -> 1.52 ms, nf4 x 1 row 1.27 -> 0.65 ms; at
 * avxvnni x 1 row int8 2.9 -> 1.6 ms. 4 KB ahead gave 167 GMAC/s (x 8 rows), 8 KB 245, 12 KB 276, 16 KB 278. */
#define QG_AHEAD 12288
static INLINE void qg_prefetch(const sp_qmat *m, int nb, int g, int xb)
{
    int nf4 = m->type == SP_W_NF4, bytes = nf4 ? GROUP_BLOCK / 2 : GROUP_BLOCK;
    const char *u = (const char *)qg_units(m, nb, g, xb) + QG_AHEAD;
    for (int l = 0; l < bytes; l += 64)
        __builtin_prefetch(u + l, 0, 3);
    if (!nf4 || xb % 2 == 0) /* (a block's 16 steps: 64 bytes to its 512 of weights) */
        __builtin_prefetch(qg_steps(m, nb, g, xb) + QG_AHEAD / GROUP_BLOCK * GROUP, 0, 3);
}

/* AVX2: half h (8 rows) of the unit at u as signed weights, w[0] its first 4 columns, NF4's w[1] the next 4. */
T2 static INLINE void unit2_s8(const uint8_t *u, int h, int nf4, __m256i *w)
{
    __m256i v = _mm256_load_si256((const __m256i *)(u + 32 * h));
    if (nf4) {
        const __m256i lo = _mm256_set1_epi8(15);
        const __m256i tbl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)nf4_q));
        w[0] = _mm256_shuffle_epi8(tbl, _mm256_and_si256(v, lo));
        w[1] = _mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_srli_epi16(v, 4), lo));
    } else {
        w[0] = _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80));
    }
}

/* d + the 8 rows' sums of the pairs of products of u (unsigned bytes) and v (signed): maddubs (2 x 127 x 127
 * fits in 16 bits), pairs summed (madd). w x as |x| times w with x's sign, or |w| times x with w's sign. */
T2 static INLINE __m256i mac2(__m256i d, __m256i u, __m256i v)
{
    __m256i p = _mm256_maddubs_epi16(u, v);
    return _mm256_add_epi32(d, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

/* B == 1: both halves at once (X's broadcasts shared), |x| taken once for both. Else a half (8 rows of W) at a
 * time for every row of X: the rows' sums in registers (d; with B == MAXB known, every one), the weights'
 * magnitudes taken once a unit for all of them, and the f32 accumulators in out (loaded, fused, stored once a
 * block: 16 of them spilled). Each block's sum is exact, and its f32 step the same in both: the same bits. */
T2 static INLINE void qg2_body(const sp_qmat *m, int g, const int8_t *XQ, const float *XS, int B, int nf4, float *out)
{
    int nb = blocks_per_row(m->type, m->cols), nx = (m->cols + 31) / 32;
    int units = nf4 ? 4 : 8, sets = nf4 ? 2 : 1;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    if (B > 1)
        memset(out, 0, (size_t)B * GROUP * sizeof *out);
    for (int xb = 0; xb < nx; xb++) {
        const uint8_t *u = qg_units(m, nb, g, xb);
        qg_prefetch(m, nb, g, xb);
        const float *st = qg_steps(m, nb, g, xb);
        if (B == 1) {
            const int8_t *xq = XQ + (size_t)xb * 32;
            __m256i d0 = _mm256_setzero_si256(), d1 = _mm256_setzero_si256();
            #pragma GCC unroll 8
            for (int k = 0; k < units; k++) {
                __m256i w0[2], w1[2];
                unit2_s8(u + k * 64, 0, nf4, w0);
                unit2_s8(u + k * 64, 1, nf4, w1);
                for (int s = 0; s < sets; s++) {
                    __m256i x = _mm256_set1_epi32(load_i32(xq + (k * sets + s) * 4)), xa = _mm256_abs_epi8(x);
                    d0 = mac2(d0, xa, _mm256_sign_epi8(w0[s], x));
                    d1 = mac2(d1, xa, _mm256_sign_epi8(w1[s], x));
                }
            }
            __m256 xs = _mm256_set1_ps(XS[xb]);
            acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), _mm256_mul_ps(_mm256_loadu_ps(st), xs), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1), _mm256_mul_ps(_mm256_loadu_ps(st + 8), xs), acc1);
            continue;
        }
        for (int h = 0; h < 2; h++) {
            __m256i d[MAXB];
            for (int b = 0; b < B; b++)
                d[b] = _mm256_setzero_si256();
            #pragma GCC unroll 8
            for (int k = 0; k < units; k++) {
                __m256i w[2];
                unit2_s8(u + k * 64, h, nf4, w);
                for (int s = 0; s < sets; s++) {
                    __m256i wa = _mm256_abs_epi8(w[s]);
                    for (int b = 0; b < B; b++) {
                        __m256i x = _mm256_set1_epi32(load_i32(XQ + ((size_t)b * nx + xb) * 32 + (k * sets + s) * 4));
                        d[b] = mac2(d[b], wa, _mm256_sign_epi8(x, w[s]));
                    }
                }
            }
            __m256 sv = _mm256_loadu_ps(st + 8 * h);
            for (int b = 0; b < B; b++) {
                float *o = out + b * GROUP + 8 * h;
                __m256 f = _mm256_mul_ps(sv, _mm256_set1_ps(XS[(size_t)b * nx + xb]));
                _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_cvtepi32_ps(d[b]), f, _mm256_loadu_ps(o)));
            }
        }
    }
    if (B == 1) {
        _mm256_storeu_ps(out, acc0);
        _mm256_storeu_ps(out + 8, acc1);
    }
}

/* B > MAXB (a prefill's rows, up to QG2_ROWS): the weights of a half-block (8 rows, 32 columns: 8 sets of 4)
 * decoded once for every row of X, one row's sum in a register at a time (qg2_body's B <= MAXB keeps all rows'
 * sums in registers, and GCC spilled them). The [768, 288] product of 128 rows, 1 thread, AMD EPYC Zen 5: int8
 * 387-409 -> 307-323 us, nf4 390-418 -> 317-330. A half-block's weights are loaded at once, before its rows'
 * products: from memory they came too late (nf4 [4096, 4096] x 16 rows 1.1-1.3x slower) until prefetched
 * (0.8x; 2 blocks on first, now qg_prefetch's 12 KB as every group kernel: the same time, [4096, 4096] x 16 and
 * [768, 288] x 128, 1 thread, avx2). Each block's sum is exact and meets the same f32 steps in the same order: the bits
 * of qg2_body's. */
T2 static INLINE void qg2_many(const sp_qmat *m, int g, const int8_t *XQ, const float *XS, int B, int nf4, float *out)
{
    int nb = blocks_per_row(m->type, m->cols), nx = (m->cols + 31) / 32;
    int units = nf4 ? 4 : 8, sets = nf4 ? 2 : 1;
    memset(out, 0, (size_t)B * GROUP * sizeof *out);
    for (int xb = 0; xb < nx; xb++) {
        const uint8_t *u = qg_units(m, nb, g, xb);
        const float *st = qg_steps(m, nb, g, xb);
        qg_prefetch(m, nb, g, xb); /* from memory the weights would come too late */
        for (int h = 0; h < 2; h++) {
            __m256i w[8], wa[8]; /* signed, and their magnitudes */
            #pragma GCC unroll 8
            for (int k = 0; k < units; k++)
                unit2_s8(u + k * 64, h, nf4, w + k * sets);
            #pragma GCC unroll 8
            for (int v = 0; v < 8; v++)
                wa[v] = _mm256_abs_epi8(w[v]);
            __m256 sv = _mm256_loadu_ps(st + 8 * h);
            for (int b = 0; b < B; b++) {
                const int8_t *xq = XQ + ((size_t)b * nx + xb) * 32;
                __m256i d = _mm256_setzero_si256();
                #pragma GCC unroll 8
                for (int v = 0; v < 8; v++)
                    d = mac2(d, wa[v], _mm256_sign_epi8(_mm256_set1_epi32(load_i32(xq + v * 4)), w[v]));
                float *o = out + b * GROUP + 8 * h;
                __m256 f = _mm256_mul_ps(sv, _mm256_set1_ps(XS[(size_t)b * nx + xb]));
                _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), f, _mm256_loadu_ps(o)));
            }
        }
    }
}

T2 static void qg_avx2(const sp_qmat *m, int g, const int8_t *XQ, const float *XS, const int32_t *XC, int B,
                       float *out)
{
    (void)XC;
    if (B <= MAXB)
        QG_SPECIALISE_MAXB(qg2_body, m, g, XQ, XS);
    else if (m->type == SP_W_NF4)
        qg2_many(m, g, XQ, XS, B, 1, out);
    else
        qg2_many(m, g, XQ, XS, B, 0, out);
}

/* AVX-VNNI (256 bits): dpbusd of the unsigned stored bytes (Q8) or looked-up levels + 128 (NF4) with x
 * broadcast 4 bytes at a time; starting from -128 * sum(x) (XC) leaves sum(w x), exact in int32. */
#define TV __attribute__((target("avx2,fma,avxvnni")))

TV static INLINE void unit2_u8(const uint8_t *u, int h, int nf4, __m256i *w)
{
    __m256i v = _mm256_load_si256((const __m256i *)(u + 32 * h));
    if (nf4) {
        const __m256i lo = _mm256_set1_epi8(15);
        const __m256i tbl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)nf4_u));
        w[0] = _mm256_shuffle_epi8(tbl, _mm256_and_si256(v, lo));
        w[1] = _mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_srli_epi16(v, 4), lo));
    } else {
        w[0] = v;
    }
}

TV static INLINE void qgv_body(const sp_qmat *m, int g, const int8_t *XQ, const float *XS, const int32_t *XC, int B,
                               int nf4, float *out)
{
    int nb = blocks_per_row(m->type, m->cols), nx = (m->cols + 31) / 32;
    int units = nf4 ? 4 : 8, sets = nf4 ? 2 : 1;
    __m256 acc[MAXB][2];
    for (int b = 0; b < B; b++)
        acc[b][0] = acc[b][1] = _mm256_setzero_ps();
    for (int xb = 0; xb < nx; xb++) {
        const uint8_t *u = qg_units(m, nb, g, xb);
        qg_prefetch(m, nb, g, xb);
        const float *st = qg_steps(m, nb, g, xb);
        if (B == 1) { /* both halves at once, two chains each (dpbusd's latency, not its rate, bounds one) */
            const int8_t *xq = XQ + (size_t)xb * 32;
            __m256i d[2][2] = {{_mm256_set1_epi32(XC[xb]), _mm256_setzero_si256()},
                               {_mm256_set1_epi32(XC[xb]), _mm256_setzero_si256()}};
            #pragma GCC unroll 8
            for (int k = 0; k < units; k++) {
                __m256i w0[2], w1[2];
                unit2_u8(u + k * 64, 0, nf4, w0);
                unit2_u8(u + k * 64, 1, nf4, w1);
                for (int s = 0; s < sets; s++) {
                    __m256i x = _mm256_set1_epi32(load_i32(xq + (k * sets + s) * 4));
                    int c = nf4 ? s : k & 1;
                    d[0][c] = _mm256_dpbusd_avx_epi32(d[0][c], w0[s], x);
                    d[1][c] = _mm256_dpbusd_avx_epi32(d[1][c], w1[s], x);
                }
            }
            __m256 xs = _mm256_set1_ps(XS[xb]);
            for (int h = 0; h < 2; h++)
                acc[0][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(d[h][0], d[h][1])),
                                            _mm256_mul_ps(_mm256_loadu_ps(st + 8 * h), xs), acc[0][h]);
            continue;
        }
        for (int h = 0; h < 2; h++) {
            __m256i d[MAXB];
            for (int b = 0; b < B; b++)
                d[b] = _mm256_set1_epi32(XC[(size_t)b * nx + xb]);
            #pragma GCC unroll 8
            for (int k = 0; k < units; k++) {
                __m256i w[2];
                unit2_u8(u + k * 64, h, nf4, w);
                for (int s = 0; s < sets; s++)
                    for (int b = 0; b < B; b++) {
                        const int8_t *xq = XQ + ((size_t)b * nx + xb) * 32 + (k * sets + s) * 4;
                        d[b] = _mm256_dpbusd_avx_epi32(d[b], w[s], _mm256_set1_epi32(load_i32(xq)));
                    }
            }
            __m256 sv = _mm256_loadu_ps(st + 8 * h);
            for (int b = 0; b < B; b++)
                acc[b][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d[b]),
                                            _mm256_mul_ps(sv, _mm256_set1_ps(XS[(size_t)b * nx + xb])), acc[b][h]);
        }
    }
    for (int b = 0; b < B; b++) {
        _mm256_storeu_ps(out + b * 16, acc[b][0]);
        _mm256_storeu_ps(out + b * 16 + 8, acc[b][1]);
    }
}

TV static void qg_avxvnni(const sp_qmat *m, int g, const int8_t *XQ, const float *XS, const int32_t *XC, int B,
                          float *out)
{
    QG_SPECIALISE_MAXB(qgv_body, m, g, XQ, XS, XC);
}

/* AVX-512 VNNI: the same on all 16 rows of a unit at once. B == 1 keeps four chains (dpbusd's latency). */
#define T5V __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

T5V static INLINE void unit5_u8(const uint8_t *u, int nf4, __m512i *w)
{
    __m512i v = _mm512_load_si512((const void *)u);
    if (nf4) {
        const __m512i lo = _mm512_set1_epi8(15);
        const __m512i tbl = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)nf4_u));
        w[0] = _mm512_shuffle_epi8(tbl, _mm512_and_si512(v, lo));
        w[1] = _mm512_shuffle_epi8(tbl, _mm512_and_si512(_mm512_srli_epi16(v, 4), lo));
    } else {
        w[0] = v;
    }
}

T5V static INLINE void qg5_body(const sp_qmat *m, int g, const int8_t *XQ, const float *XS, const int32_t *XC, int B,
                                int nf4, float *out)
{
    int nb = blocks_per_row(m->type, m->cols), nx = (m->cols + 31) / 32;
    int units = nf4 ? 4 : 8, sets = nf4 ? 2 : 1;
    __m512 acc[MAXB];
    for (int b = 0; b < B; b++)
        acc[b] = _mm512_setzero_ps();
    for (int xb = 0; xb < nx; xb++) {
        const uint8_t *u = qg_units(m, nb, g, xb);
        qg_prefetch(m, nb, g, xb);
        __m512 sv = _mm512_loadu_ps(qg_steps(m, nb, g, xb));
        __m512i d[MAXB][4];
        for (int b = 0; b < B; b++) {
            d[b][0] = _mm512_set1_epi32(XC[(size_t)b * nx + xb]);
            d[b][1] = d[b][2] = d[b][3] = _mm512_setzero_si512();
        }
        #pragma GCC unroll 8
        for (int k = 0; k < units; k++) {
            __m512i w[2];
            unit5_u8(u + k * 64, nf4, w);
            for (int s = 0; s < sets; s++)
                for (int b = 0; b < B; b++) {
                    int c = (k * sets + s) * 4, chain = B == 1 ? (nf4 ? (k & 1) * 2 + s : k & 3) : 0;
                    d[b][chain] = _mm512_dpbusd_epi32(d[b][chain], w[s],
                                                      _mm512_set1_epi32(load_i32(XQ + ((size_t)b * nx + xb) * 32 + c)));
                }
        }
        for (int b = 0; b < B; b++) {
            __m512 f = _mm512_cvtepi32_ps(
                _mm512_add_epi32(_mm512_add_epi32(d[b][0], d[b][1]), _mm512_add_epi32(d[b][2], d[b][3])));
            acc[b] = _mm512_fmadd_ps(f, _mm512_mul_ps(sv, _mm512_set1_ps(XS[(size_t)b * nx + xb])), acc[b]);
        }
    }
    for (int b = 0; b < B; b++)
        _mm512_storeu_ps(out + b * 16, acc[b]);
}

T5V static void qg_vnni512(const sp_qmat *m, int g, const int8_t *XQ, const float *XS, const int32_t *XC, int B,
                           float *out)
{
    QG_SPECIALISE_MAXB(qg5_body, m, g, XQ, XS, XC);
}
#endif

/* ---------------------------------------------------------------------------------------------- */
/* dispatch: the levels this CPU has, SEPAL_ISA's cap (read once), sp_kern_force's */

static const char *const isa_names[SP_ISA__COUNT] = {"scalar", "avx2", "avxvnni", "avx512"};
static int supported_mask = -1, has_vnni512, has_f16c, env_cap = SP_ISA__COUNT - 1, forced = -1, env_checked;
static pthread_once_t detect_once = PTHREAD_ONCE_INIT;

static int best_at_most(int cap)
{
    for (int lv = cap < SP_ISA__COUNT ? cap : SP_ISA__COUNT - 1; lv > 0; lv--)
        if (supported_mask >> lv & 1)
            return lv;
    return SP_ISA_SCALAR;
}

/* What SEPAL_ISA (NAME) asks: SP_OK and *lv its level when this CPU runs it, else the error that says why. */
static sp_status env_level(const char *name, int *lv, sp_err *err)
{
    *lv = sp_kern_level_parse(name);
    if (*lv < 0)
        return sp_errf(err, SP_ERR_ARG, "SEPAL_ISA=%s: not a kernel level (scalar, avx2, avxvnni, avx512)", name);
    if (supported_mask >> *lv & 1)
        return SP_OK;
    char have[64] = "";
    for (int k = 0; k < SP_ISA__COUNT; k++)
        if (supported_mask >> k & 1)
            snprintf(have + strlen(have), sizeof have - strlen(have), "%s%s", *have ? ", " : "", isa_names[k]);
    return sp_errf(err, SP_ERR_UNSUPPORTED, "SEPAL_ISA=%s: this CPU does not run %s kernels (it runs %s)", name,
                   name, have);
}

/* SEPAL_ISA caps the level; one unknown is ignored, one this CPU lacks gives the best level below it, each said
 * once (unless sp_kern_check_env came first: the programs refuse both at start, saying why). */
static void read_env(void)
{
    const char *e = getenv("SEPAL_ISA");
    int lv;
    sp_err err = {0};
    if (!e || !*e)
        return;
    if (env_level(e, &lv, &err) != SP_OK && !__atomic_load_n(&env_checked, __ATOMIC_RELAXED))
        sp_log(SP_LOG_WARN, "%s", err.msg);
    if (lv >= 0)
        env_cap = lv;
}

static void detect(void)
{
    int mask = 1;
#if SP_X86
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    unsigned a, b, c, d; /* AVX-VNNI: CPUID leaf 7 subleaf 1, EAX bit 4 (gcc 12 has no name for it) */
    int avxvnni = __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 4 & 1);
    has_f16c = avx2 && __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1); /* F16C: leaf 1, ECX bit 29 */
    mask |= avx2 << SP_ISA_AVX2 | (avx2 && avxvnni) << SP_ISA_AVXVNNI | avx512 << SP_ISA_AVX512;
    has_vnni512 = avx512 && __builtin_cpu_supports("avx512vnni");
#endif
    supported_mask = mask;
    read_env();
}

static void detect_init(void) { pthread_once(&detect_once, detect); }

int sp_kern_supported(int level)
{
    detect_init();
    return level >= 0 && level < SP_ISA__COUNT && (supported_mask >> level & 1);
}

int sp_kern_level(void)
{
    detect_init();
    int f = __atomic_load_n(&forced, __ATOMIC_RELAXED);
    return best_at_most(f >= 0 && f < env_cap ? f : env_cap);
}

void sp_kern_force(int level) { __atomic_store_n(&forced, level, __ATOMIC_RELAXED); }

sp_status sp_kern_check_env(sp_err *err)
{
    __atomic_store_n(&env_checked, 1, __ATOMIC_RELAXED); /* the caller says it: no warning as well */
    detect_init();
    const char *e = getenv("SEPAL_ISA");
    int lv;
    return e && *e ? env_level(e, &lv, err) : SP_OK;
}

const char *sp_kern_level_name(int level)
{
    return level >= 0 && level < SP_ISA__COUNT ? isa_names[level] : "?";
}

int sp_kern_level_parse(const char *name)
{
    for (int lv = 0; lv < SP_ISA__COUNT; lv++)
        if (!strcmp(name, isa_names[lv]))
            return lv;
    return -1;
}

static dot_fn dot_for(const sp_qmat *m)
{
#if SP_X86
    /* Q8 and NF4: their f32 products are the integer kernels' fallback only (a scratch that could not grow) */
    static const dot_fn l5[SP_W__COUNT] = {[SP_W_F32] = dot5_f32, [SP_W_BF16] = dot5_bf16, [SP_W_Q8] = dot_scalar,
                                           [SP_W_NF4] = dot_scalar, [SP_W_F16] = dot5_f16};
    static const dot_fn l2[SP_W__COUNT] = {[SP_W_F32] = dot2_f32, [SP_W_BF16] = dot2_bf16, [SP_W_Q8] = dot_scalar,
                                           [SP_W_NF4] = dot_scalar, [SP_W_F16] = dot2_f16};
    int lv = sp_kern_level();
    if (lv >= SP_ISA_AVX512)
        return l5[m->type];
    if (lv >= SP_ISA_AVX2 && m->type == SP_W_F16 && !has_f16c) /* (the level does not ask for F16C) */
        return dot_scalar;
    if (lv >= SP_ISA_AVX2)
        return l2[m->type];
#endif
    (void)m;
    return dot_scalar;
}

/* The most rows of X a group kernel takes in one call: AVX2's (qg2_many) decodes a group's weights once for all
 * of them and keeps one row's sums in registers at a time, so it takes more (QG2_ROWS) than the others (MAXB):
 * 8 -> 32 took the [768, 288] x 128 product from 354-358 to 318-324 us (int8; 128: no faster). */
#define QG2_ROWS 32

static int qg_rows(qg_fn f)
{
#if SP_X86
    if (f == qg_avx2)
        return QG2_ROWS;
#endif
    (void)f;
    return MAXB;
}

static qg_fn qg_for(sp_wtype t)
{
#if SP_X86
    int lv = sp_kern_level();
    if (grouped(t) && lv >= SP_ISA_AVX512 && has_vnni512)
        return qg_vnni512;
    if (grouped(t) && lv >= SP_ISA_AVXVNNI && sp_kern_supported(SP_ISA_AVXVNNI))
        return qg_avxvnni;
    if (grouped(t) && lv >= SP_ISA_AVX2)
        return qg_avx2;
#endif
    (void)t;
    return NULL;
}

const char *sp_kern_int_name(sp_wtype t)
{
    qg_fn f = qg_for(t);
#if SP_X86
    if (f == qg_vnni512)
        return "avx512 vpdpbusd";
    if (f == qg_avxvnni)
        return "avx-vnni vpdpbusd";
    if (f == qg_avx2)
        return "avx2 vpmaddubsw";
#endif
    (void)f;
    return NULL;
}

void sp_kern_describe(char *buf, size_t n)
{
    const char *q8 = sp_kern_int_name(SP_W_Q8), *nf4 = sp_kern_int_name(SP_W_NF4);
    int in = q8 && nf4;
    snprintf(buf, n, "%s kernels (int8 and nf4 %s%s), OpenBLAS %s", isa_names[sp_kern_level()],
             in ? "in integers: " : "in f32", in ? q8 : "", sp_blas_core());
}

/* n fp16 values to f32 in the current level's loop (the same values at every level: the conversion is exact). */
static void f16_decode(const uint16_t *h, float *out, int n)
{
#if SP_X86
    int lv = sp_kern_level();
    if (lv >= SP_ISA_AVX512) {
        f16_decode5(h, out, n);
        return;
    }
    if (lv >= SP_ISA_AVX2 && has_f16c) {
        f16_decode2(h, out, n);
        return;
    }
#endif
    for (int c = 0; c < n; c++)
        out[c] = sp_f16_to_f32(h[c]);
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
    if (lv >= SP_ISA_AVX512) {
        dot_rows5(W, ldw, rows, cols, x, scale, y);
        return;
    }
    if (lv >= SP_ISA_AVX2) {
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
    if (lv >= SP_ISA_AVX512) {
        axpy_rows5(W, ldw, rows, cols, p, y);
        return;
    }
    if (lv >= SP_ISA_AVX2) {
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
    qg_fn qg;          /* Q8 / NF4 in integers (then XQ, XS, XC hold X quantised) */
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
    int nx = (j->W->cols + Q8_BLOCK - 1) / Q8_BLOCK; /* X's blocks a row, quantised (quantize_x) */
    sp_pool_split(R, i, n, GROUP, &lo, &hi);
    if (j->qg) { /* whole groups of 16 rows (lo is a multiple of 16) */
        float out[QG2_ROWS * GROUP];
        int rows = qg_rows(j->qg);
        for (long r0 = lo; r0 < hi; r0 += GROUP) {
            int nr = hi - r0 < GROUP ? (int)(hi - r0) : GROUP;
            for (int b0 = 0; b0 < j->B; b0 += rows) {
                int bn = j->B - b0 < rows ? j->B - b0 : rows;
                size_t xb = (size_t)b0 * nx;
                j->qg(j->W, (int)(r0 / GROUP), j->XQ + xb * Q8_BLOCK, j->XS + xb, j->XC + xb, bn, out);
                for (int b = 0; b < bn; b++)
                    memcpy(j->Y + (size_t)(b0 + b) * R + r0, out + b * GROUP, (size_t)nr * sizeof(float));
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


int sp_kern_integer(sp_wtype t) { return qg_for(t) != NULL; }

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

/* Rows [lo, hi) of X (part i of n) quantised into j's XQ, XS and XC (each row on its own: any split, the same). */
static void quantize_part(void *ctx, int i, int n)
{
    mul_job *j = ctx;
    int C = j->W->cols, nx = (C + Q8_BLOCK - 1) / Q8_BLOCK;
    long lo, hi;
    sp_pool_split(j->B, i, n, 1, &lo, &hi);
    int8_t *xq = (int8_t *)j->XQ;
    float *xs = (float *)j->XS;
    int32_t *xc = (int32_t *)j->XC;
    for (long b = lo; b < hi; b++)
        sp_q8_quantize(j->X + (size_t)b * C, C, xq + (size_t)b * nx * Q8_BLOCK, xs + (size_t)b * nx);
    for (size_t k = (size_t)lo * nx; k < (size_t)hi * nx; k++) { /* -128 * each block's sum: the stored offset's */
        int32_t sum = 0;
        for (int c = 0; c < Q8_BLOCK; c++)
            sum += xq[k * Q8_BLOCK + (size_t)c];
        xc[k] = -128 * sum;
    }
}

/* X [B, cols] quantised into the calling thread's scratch for the integer kernels, split over the pool in parts
 * of at least 16K values (a prefill's): 0, or -1 without room. */
static int quantize_x(mul_job *j, sp_pool *pool)
{
    int C = j->W->cols, nx = (C + Q8_BLOCK - 1) / Q8_BLOCK, B = j->B;
    size_t qbytes = ((size_t)B * nx * Q8_BLOCK + 63) & ~(size_t)63, n = (size_t)B * nx;
    uint8_t *buf = scratch_get(qbytes + n * (sizeof(float) + sizeof(int32_t)));
    if (!buf)
        return -1;
    j->XQ = (int8_t *)buf;
    j->XS = (float *)(buf + qbytes);
    j->XC = (int32_t *)(j->XS + n);
    long parts = (long)B * C / 16384;
    sp_pool_run_parts(pool, quantize_part, j, (int)(parts < 1 ? 1 : parts > B ? B : parts));
    return 0;
}

/* Y = X W^T in the decode kernels, any B: each row of Y as B == 1 computes it. */
static void mul_kernels(const sp_qmat *W, const float *X, float *Y, int B, sp_pool *pool)
{
    mul_job j = {W, X, Y, B, dot_for(W), qg_for(W->type), NULL, NULL, NULL};
    if (j.qg && quantize_x(&j, pool))
        j.qg = NULL; /* no room: the f32 kernel */
    sp_pool_run_parts(pool, mul_part, &j, mul_parts(W, pool));
}

void sp_qmat_mul_rows(const sp_qmat *W, const float *X, float *Y, int B, sp_pool *pool)
{
    if (B > 0 && W->rows > 0)
        mul_kernels(W, X, Y, B, pool);
}

/* Rows [lo, hi) of W (part i of n, in multiples of 16) times every row of X through sgemm on the calling
 * thread: f32 weights as they are, others decoded TILE_ROWS rows at a time into a tile of this part's. */
static void gemm_part(void *ctx, int i, int n)
{
    mul_job *j = ctx;
    const sp_qmat *W = j->W;
    long lo, hi;
    sp_pool_split(W->rows, i, n, 16, &lo, &hi);
    float *tile = W->type == SP_W_F32 ? NULL : malloc((size_t)TILE_ROWS * W->cols * sizeof(float));
    for (long r0 = lo; r0 < hi; r0 += TILE_ROWS) {
        int nr = hi - r0 < TILE_ROWS ? (int)(hi - r0) : TILE_ROWS;
        const float *w = (const float *)W->q + (size_t)r0 * W->cols;
        if (tile) {
            for (int r = 0; r < nr; r++)
                sp_qmat_row(W, (int)r0 + r, tile + (size_t)r * W->cols);
            w = tile;
        } else if (W->type != SP_W_F32) { /* no room for a tile: each row's f32 dot products */
            for (int b = 0; b < j->B; b++)
                for (int r = 0; r < nr; r++)
                    j->Y[(size_t)b * W->rows + r0 + r] = sp_qmat_dot(W, (int)r0 + r, j->X + (size_t)b * W->cols);
            continue;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->B, nr, W->cols, 1.0f, j->X, W->cols, w, W->cols, 0.0f,
                    j->Y + r0, W->rows);
    }
    free(tile);
}

/* Parts of a large product for the pool: one per thread (about 64 rows of W at least each), and only while
 * OpenBLAS runs on the calling thread alone: its own threads would contend with the pool's for the cores. */
static int gemm_parts(const sp_qmat *W, sp_pool *pool)
{
    int n = sp_pool_threads(pool), units = (W->rows + 63) / 64;
    if (n <= 1 || openblas_get_num_threads() != 1)
        return 1;
    return n < units ? n : units;
}

void sp_qmat_mul(const sp_qmat *W, const float *X, float *Y, int B, sp_pool *pool)
{
    if (B <= 0 || W->rows <= 0)
        return;
    if (B <= MAXB || qg_for(W->type)) { /* Q8 and NF4 in integers: the decode kernels at any B */
        mul_kernels(W, X, Y, B, pool);
        return;
    }
    mul_job j = {W, X, Y, B, NULL, NULL, NULL, NULL, NULL};
    int parts = gemm_parts(W, pool);
    if (parts == 1)
        gemm_part(&j, 0, 1);
    else
        sp_pool_run_parts(pool, gemm_part, &j, parts);
}

/* Whether item rows of rows go through sgemm on decoded tiles, from row 0 on the calling thread, in sp_qmat_mul
 * (fwd) or sp_qmat_mul_t_acc: the way mul_items shares the tiles. (Forward, int8 and nf4 in integers run the
 * decode kernels at any B, and a product split over the pool tiles each part's rows: both run alone.) */
static int tiled(const sp_qmat *W, int rows, int fwd, sp_pool *pool)
{
    if (W->type == SP_W_F32)
        return 0;
    return !fwd || (rows > MAXB && !qg_for(W->type) && gemm_parts(W, pool) == 1);
}

/* The items' products, each as alone: those on decoded tiles share each tile (decoded once), the rest one by one.
 * fwd: Y = X W^T (sp_qmat_mul); else dX += dY W (sp_qmat_mul_t_acc). */
static void mul_items(const sp_qmat *W, const float *in, float *out, const int *rows, int n, int fwd, sp_pool *pool)
{
    int cin = fwd ? W->cols : W->rows, cout = fwd ? W->rows : W->cols, ntiled = 0;
    for (int i = 0, r = 0; i < n; r += rows[i++]) {
        if (tiled(W, rows[i], fwd, pool)) {
            ntiled++;
            continue;
        }
        if (fwd)
            sp_qmat_mul(W, in + (size_t)r * cin, out + (size_t)r * cout, rows[i], pool);
        else
            sp_qmat_mul_t_acc(W, in + (size_t)r * cin, out + (size_t)r * cout, rows[i], pool);
    }
    float *tile = ntiled ? malloc((size_t)TILE_ROWS * W->cols * sizeof(float)) : NULL;
    for (int i = 0, r = 0; ntiled && !tile && i < n; r += rows[i++]) /* no room for a tile: one by one */
        if (tiled(W, rows[i], fwd, pool) && fwd)
            sp_qmat_mul(W, in + (size_t)r * cin, out + (size_t)r * cout, rows[i], pool);
        else if (tiled(W, rows[i], fwd, pool))
            sp_qmat_mul_t_acc(W, in + (size_t)r * cin, out + (size_t)r * cout, rows[i], pool);
    for (int r0 = 0; tile && r0 < W->rows; r0 += TILE_ROWS) {
        int nr = W->rows - r0 < TILE_ROWS ? W->rows - r0 : TILE_ROWS;
        for (int r = 0; r < nr; r++)
            sp_qmat_row(W, r0 + r, tile + (size_t)r * W->cols);
        for (int i = 0, r = 0; i < n; r += rows[i++]) { /* the very calls sp_qmat_mul(_t_acc) makes alone */
            if (!tiled(W, rows[i], fwd, pool))
                continue;
            const float *x = in + (size_t)r * cin;
            float *y = out + (size_t)r * cout;
            if (fwd)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows[i], nr, W->cols, 1.0f, x, W->cols, tile,
                            W->cols, 0.0f, y + r0, W->rows);
            else
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows[i], W->cols, nr, 1.0f, x + r0, W->rows,
                            tile, W->cols, 1.0f, y, W->cols);
        }
    }
    free(tile);
}

void sp_qmat_mul_items(const sp_qmat *W, const float *X, float *Y, const int *rows, int n, sp_pool *pool)
{
    if (W->rows > 0)
        mul_items(W, X, Y, rows, n, 1, pool);
}

void sp_qmat_mul_t_acc_items(const sp_qmat *W, const float *dY, float *dX, const int *rows, int n, sp_pool *pool)
{
    if (W->rows > 0)
        mul_items(W, dY, dX, rows, n, 0, pool);
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
    for (int r0 = 0; r0 < R; r0 += GROUP) { /* approx[r] becomes the row's upper bound */
        const float *sc = S->scale + (size_t)r0 * nb; /* the group's scales, block by block (16 a block) */
        float bound[GROUP] = {0};
        for (int b = 0; b < nb; b++)
            for (int l = 0; l < GROUP; l++)
                bound[l] += sc[b * GROUP + l] * K[b];
        for (int l = 0; l < GROUP && r0 + l < R; l++) {
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
