/* kmath.h - the arithmetic of every CUDA kernel in cuda/kernels.cu, as functions the kernels and a host harness
 * (tests/test_cuda_host.c) share: compiled by nvcc they are __host__ __device__, by a C compiler plain static
 * inline C. The host harness runs them the way a kernel's threads do (the same thread counts, strides and
 * reduction trees) and checks the results against core/'s CPU reference ops, on this machine, without a GPU;
 * only the launches and the device's libm (expf, erff, cosf: within 2 ulp of glibc's) are left to the GPU tests.
 *
 * The specification is core/: ops_impl.h (norms, RoPE, activations, softmax, cross-entropy), rope.c (the
 * frequencies, llama3 scaling included, computed once on the host and uploaded), ops.c (ALiBi slopes) and
 * kern.h (the weight encodings; Q8 is re-laid out row-major for the GPU by sp_cuda_q8_rowmajor).
 *
 * Row kernels run one block of sp_km_row_threads(C) threads per row: thread tid of nt handles columns
 * tid, tid + nt, ...; its partial results are combined by the tree of sp_km_tree_sum / sp_km_tree_max (level s
 * adds a[i + s] into a[i] for i < s, s = nt/2 .. 1), which the device runs in shared memory in the same order. */
#ifndef SEPAL_CUDA_KMATH_H
#define SEPAL_CUDA_KMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define SP_HD static inline __host__ __device__
#else
#define SP_HD static inline
#endif

#define SP_KM_Q8_BLOCK 32   /* values per Q8 scale (kern.h) */
#define SP_KM_NF4_BLOCK 64  /* values per NF4 absmax (kern.h) */
#define SP_KM_MAX_THREADS 1024

/* ---------------------------------------------------------------------------------------------- */
/* block geometry and reductions */

/* Threads of the block that handles a row of C values: a power of two in [32, 1024], about C / 8. */
SP_HD int sp_km_row_threads(int C)
{
    int nt = 32;
    while (nt < SP_KM_MAX_THREADS && nt * 8 < C)
        nt *= 2;
    return nt;
}

/* a[0] = the sum of a[0..nt) in the kernels' tree order (nt a power of two); a is overwritten. */
SP_HD float sp_km_tree_sum(float *a, int nt)
{
    for (int s = nt / 2; s > 0; s >>= 1)
        for (int i = 0; i < s; i++)
            a[i] += a[i + s];
    return a[0];
}

SP_HD float sp_km_tree_max(float *a, int nt)
{
    for (int s = nt / 2; s > 0; s >>= 1)
        for (int i = 0; i < s; i++)
            a[i] = a[i + s] > a[i] ? a[i + s] : a[i];
    return a[0];
}

/* ---------------------------------------------------------------------------------------------- */
/* per-thread shares of a row's reductions (columns tid, tid + nt, ... of C) */

SP_HD float sp_km_sum_part(const float *x, int C, int tid, int nt)
{
    float s = 0.0f;
    for (int c = tid; c < C; c += nt)
        s += x[c];
    return s;
}

SP_HD float sp_km_sumsq_part(const float *x, int C, int tid, int nt)
{
    float s = 0.0f;
    for (int c = tid; c < C; c += nt)
        s += x[c] * x[c];
    return s;
}

/* sum of (x - m)^2 */
SP_HD float sp_km_sqdev_part(const float *x, float m, int C, int tid, int nt)
{
    float s = 0.0f;
    for (int c = tid; c < C; c += nt)
        s += (x[c] - m) * (x[c] - m);
    return s;
}

/* sum of a * b * w (w NULL: ones) */
SP_HD float sp_km_dot3_part(const float *a, const float *b, const float *w, int C, int tid, int nt)
{
    float s = 0.0f;
    for (int c = tid; c < C; c += nt)
        s += a[c] * b[c] * (w ? w[c] : 1.0f);
    return s;
}

/* max of x (-inf for a thread without columns; NaN never wins, as in the CPU loops) */
SP_HD float sp_km_max_part(const float *x, int C, int tid, int nt)
{
    float m = -INFINITY;
    for (int c = tid; c < C; c += nt)
        m = x[c] > m ? x[c] : m;
    return m;
}

/* sum of exp(x - mx) */
SP_HD float sp_km_sumexp_part(const float *x, float mx, int C, int tid, int nt)
{
    float s = 0.0f;
    for (int c = tid; c < C; c += nt)
        s += expf(x[c] - mx);
    return s;
}

/* ---------------------------------------------------------------------------------------------- */
/* RMSNorm and LayerNorm (ops_impl.h): per row statistics, then per element */

/* (ss / C + eps)^-1/2 from a sum of squares (RMSNorm) or of squared deviations (LayerNorm) */
SP_HD float sp_km_rstd(float ss, int C, float eps) { return 1.0f / sqrtf(ss / (float)C + eps); }

SP_HD float sp_km_rmsnorm(float x, float rstd, float w) { return x * rstd * w; }

/* dx = r w dy - k x with k = r^3 / C * sum(dy w x) */
SP_HD float sp_km_rmsnorm_k(float rstd, float dot, int C) { return rstd * rstd * rstd * dot / (float)C; }
SP_HD float sp_km_rmsnorm_dx(float x, float w, float dy, float rstd, float k) { return rstd * w * dy - k * x; }

SP_HD float sp_km_layernorm(float x, float mean, float rstd, float w, float b) { return (x - mean) * rstd * w + b; }

/* Thread tid's shares of sum(g) and sum(g xhat), g = dy w, xhat = (x - mean) rstd (w NULL: ones). */
SP_HD void sp_km_layernorm_bwd_part(const float *dy, const float *x, const float *w, float mean, float rstd, int C,
                                    int tid, int nt, float *g_sum, float *gx_sum)
{
    float g = 0.0f, gx = 0.0f;
    for (int c = tid; c < C; c += nt) {
        float gc = dy[c] * (w ? w[c] : 1.0f);
        g += gc;
        gx += gc * (x[c] - mean) * rstd;
    }
    *g_sum = g;
    *gx_sum = gx;
}

/* dx = rstd (dy w - mean(g) - xhat mean(g xhat)) */
SP_HD float sp_km_layernorm_dx(float x, float dy, float w, float mean, float rstd, float gmean, float gxmean)
{
    return rstd * (dy * w - gmean - (x - mean) * rstd * gxmean);
}

/* Weight gradients: column c summed over the N rows, in row order (one thread a column). xhat terms use the
 * row's statistics; mean NULL: RMSNorm (dw += dy x rstd); dy_only: the bias (db += dy). */
SP_HD float sp_km_norm_dw_col(const float *dout, const float *inp, const float *mean, const float *rstd, int N,
                              int C, int c, int dy_only)
{
    float s = 0.0f;
    for (int i = 0; i < N; i++) {
        float dy = dout[(long)i * C + c];
        if (dy_only)
            s += dy;
        else if (mean)
            s += dy * ((inp[(long)i * C + c] - mean[i]) * rstd[i]);
        else
            s += dy * inp[(long)i * C + c] * rstd[i];
    }
    return s;
}

/* ---------------------------------------------------------------------------------------------- */
/* RoPE, rotate-half (ops_impl.h): x [B, T, nh, hd]; pair e (of B*T*nh*hd/2) is (x[o], x[o + hd/2]) */

/* Pair e's first offset, its row's time index t and its frequency index i. */
SP_HD long sp_km_rope_pair(long e, int T, int nh, int hd, int *t, int *i)
{
    int half = hd / 2;
    long row = e / half; /* (b * T + t) * nh + h */
    *i = (int)(e % half);
    *t = (int)((row / nh) % T);
    return row * hd + *i;
}

/* The angle of position pos at frequency inv_freq, in f32 as sp_rope_tables computes it. */
SP_HD float sp_km_rope_angle(int pos, float inv_freq) { return (float)pos * inv_freq; }

/* Forward: (x1, x2) rotated by the angle with cosine c and sine s. Backward: its transpose, added to (d1, d2). */
SP_HD void sp_km_rope_fwd(float *y1, float *y2, float x1, float x2, float c, float s)
{
    *y1 = x1 * c - x2 * s;
    *y2 = x2 * c + x1 * s;
}

SP_HD void sp_km_rope_bwd(float *d1, float *d2, float g1, float g2, float c, float s)
{
    *d1 += g1 * c + g2 * s;
    *d2 += g2 * c - g1 * s;
}

/* Pair e of RoPE over x [B, T, nh, hd] at positions pos0 ..: out = rotated inp (forward), or out += the
 * transposed rotation of inp (backward: inp is the output's gradient). The angle in f32, its cosine and sine by
 * the compiler's cosf / sinf (the device's within 2 ulp of glibc's). */
SP_HD void sp_km_rope_apply(float *out, const float *inp, const float *inv_freq, int pos0, int T, int nh, int hd,
                            long e, int backward)
{
    int t, i;
    long o = sp_km_rope_pair(e, T, nh, hd, &t, &i), o2 = o + hd / 2;
    float a = sp_km_rope_angle(pos0 + t, inv_freq[i]), c = cosf(a), s = sinf(a);
    if (backward)
        sp_km_rope_bwd(&out[o], &out[o2], inp[o], inp[o2], c, s);
    else
        sp_km_rope_fwd(&out[o], &out[o2], inp[o], inp[o2], c, s);
}

/* ---------------------------------------------------------------------------------------------- */
/* ALiBi: the score of query position qpos for key position kpos gets slope * (kpos - qpos) (ops.h) */

SP_HD float sp_km_alibi(float slope, int kpos, int qpos) { return slope * (float)(kpos - qpos); }

/* Element e of scores [B, nh, T, S] (query t at position past + t): its head and whether key s is visible. */
SP_HD int sp_km_score_at(long e, int nh, int T, int S, int past, int *h, int *s, int *qpos)
{
    *s = (int)(e % S);
    long row = e / S; /* (b * nh + h) * T + t */
    int t = (int)(row % T);
    *h = (int)((row / T) % nh);
    *qpos = past + t;
    return *s <= *qpos;
}

/* ---------------------------------------------------------------------------------------------- */
/* activations (ops_impl.h; the device's expf and erff where the CPU has its vectorised ones) */

SP_HD float sp_km_sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

SP_HD float sp_km_swiglu(float g, float u) { return g * sp_km_sigmoid(g) * u; }

SP_HD void sp_km_swiglu_bwd(float *dg, float *du, float dy, float g, float u)
{
    float sg = sp_km_sigmoid(g);
    *du += dy * (g * sg);
    *dg += dy * u * sg * (1.0f + g * (1.0f - sg));
}

#define SP_KM_SQRT1_2 0.70710678118654752440f
#define SP_KM_INV_SQRT_2PI 0.39894228040143267794f
#define SP_KM_GELU_K 0.79788456080286535588f /* sqrt(2/pi) */

SP_HD float sp_km_gelu(float x) { return 0.5f * x * (1.0f + erff(x * SP_KM_SQRT1_2)); }

SP_HD float sp_km_gelu_grad(float x)
{
    float cdf = 0.5f * (1.0f + erff(x * SP_KM_SQRT1_2));
    return cdf + x * SP_KM_INV_SQRT_2PI * expf(-0.5f * x * x);
}

/* x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): 0.5 x (1 + tanh(u)) */
SP_HD float sp_km_gelu_tanh(float x)
{
    return x / (1.0f + expf(-2.0f * SP_KM_GELU_K * (x + 0.044715f * x * x * x)));
}

/* s + 2 x (1 - s) s u', 1 - s = e s with e = exp(-2u) kept finite (see ops_impl.h) */
SP_HD float sp_km_gelu_tanh_grad(float x)
{
    float u = SP_KM_GELU_K * (x + 0.044715f * x * x * x), m = -2.0f * u;
    float e = expf(m < 80.0f ? m : 80.0f), s = 1.0f / (1.0f + e);
    float du = SP_KM_GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
    return s + 2.0f * x * (e * s) * s * du;
}

/* ---------------------------------------------------------------------------------------------- */
/* embedding, softmax, cross-entropy */

/* Element e of out [N, C]: element e % C of the row of a [V, C] table for token ids[e / C]; 0 (and *bad = 1) for
 * an id outside [0, V). */
SP_HD float sp_km_embed(const float *table, const int32_t *ids, int V, int C, long e, int *bad)
{
    int32_t id = ids[e / C];
    if (id < 0 || id >= V) {
        *bad = 1;
        return 0.0f;
    }
    return table[(long)id * C + e % C];
}

SP_HD float sp_km_softmax(float x, float mx, float sum) { return expf(x - mx) / sum; }

/* logsumexp - x[target] */
SP_HD float sp_km_ce_loss(float mx, float sum, float x_target) { return logf(sum) + mx - x_target; }

SP_HD float sp_km_ce_grad(float dloss, float x, float mx, float sum, int is_target)
{
    return dloss * (expf(x - mx) / sum - (is_target ? 1.0f : 0.0f));
}

/* ---------------------------------------------------------------------------------------------- */
/* weights: f32, bf16, fp16 (IEEE half), Q8 (row-major int8 [rows, cols], scales [rows, ceil(cols / 32)]) and NF4
 * (row-major: each row ceil(cols / 64) blocks of 32 bytes, the first half of a block in the low nibbles; each
 * block's step [rows, ceil(cols / 64)]). kern.c interleaves both 16 rows at a time; wlayout.c re-lays them for the
 * device. */

enum { SP_KM_F32, SP_KM_BF16, SP_KM_Q8, SP_KM_NF4, SP_KM_F16 }; /* the order of sp_wtype (kern.h) */

typedef struct sp_km_w {
    int type, rows, cols;
    const void *q;       /* values */
    const float *scale;  /* Q8 / NF4 */
    float levels[16];    /* NF4's levels as kern.c's integers (sp_nf4_levels x 127), carried by value */
} sp_km_w;

SP_HD float sp_km_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* An IEEE half's value (exact: every half is a float). The device's cvt; the host's from the bits. */
SP_HD float sp_km_f16(uint16_t h)
{
#ifdef __CUDA_ARCH__
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    if (e == 0x1fu) /* inf, NaN */
        u = sign | 0x7f800000u | (m << 13);
    else if (e) /* normal: the exponent rebiased from 15 to 127 */
        u = sign | ((e + 112u) << 23) | (m << 13);
    else if (m) { /* subnormal: m 2^-24, exact in a float */
        float f = (float)m * 5.9604644775390625e-8f;
        memcpy(&u, &f, sizeof u);
        u |= sign;
    } else
        u = sign;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

SP_HD int sp_km_blocks(int cols, int block) { return (cols + block - 1) / block; }

/* Weight (r, c), decoded to f32 exactly as sp_qmat_row decodes it. */
SP_HD float sp_km_w_at(const sp_km_w *w, int r, int c)
{
    switch (w->type) {
    case SP_KM_BF16: return sp_km_bf16(((const uint16_t *)w->q)[(long)r * w->cols + c]);
    case SP_KM_F16: return sp_km_f16(((const uint16_t *)w->q)[(long)r * w->cols + c]);
    case SP_KM_Q8: {
        int nb = sp_km_blocks(w->cols, SP_KM_Q8_BLOCK);
        return (float)((const int8_t *)w->q)[(long)r * w->cols + c] * w->scale[(long)r * nb + c / SP_KM_Q8_BLOCK];
    }
    case SP_KM_NF4: {
        int nb = sp_km_blocks(w->cols, SP_KM_NF4_BLOCK), b = c / SP_KM_NF4_BLOCK, k = c % SP_KM_NF4_BLOCK;
        const uint8_t *row = (const uint8_t *)w->q + (long)r * nb * (SP_KM_NF4_BLOCK / 2);
        uint8_t byte = row[b * (SP_KM_NF4_BLOCK / 2) + k % (SP_KM_NF4_BLOCK / 2)];
        int idx = k < SP_KM_NF4_BLOCK / 2 ? byte & 15 : byte >> 4;
        return w->levels[idx] * w->scale[(long)r * nb + b];
    }
    default: return ((const float *)w->q)[(long)r * w->cols + c];
    }
}

/* Thread tid's share of row r . x (the decode product; x has cols values). */
SP_HD float sp_km_w_dot_part(const sp_km_w *w, int r, const float *x, int tid, int nt)
{
    float s = 0.0f;
    for (int c = tid; c < w->cols; c += nt)
        s += sp_km_w_at(w, r, c) * x[c];
    return s;
}

/* Bytes of one row of values in the device layout, and its scales (Q8 / NF4; 0 for f32 and bf16). */
SP_HD long sp_km_row_bytes(const sp_km_w *w)
{
    switch (w->type) {
    case SP_KM_BF16:
    case SP_KM_F16: return 2L * w->cols;
    case SP_KM_Q8: return w->cols;
    case SP_KM_NF4: return (long)sp_km_blocks(w->cols, SP_KM_NF4_BLOCK) * (SP_KM_NF4_BLOCK / 2);
    default: return 4L * w->cols;
    }
}

SP_HD int sp_km_row_scales(const sp_km_w *w)
{
    return w->type == SP_KM_Q8    ? sp_km_blocks(w->cols, SP_KM_Q8_BLOCK)
           : w->type == SP_KM_NF4 ? sp_km_blocks(w->cols, SP_KM_NF4_BLOCK)
                                  : 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* the vectorised decode product (weights.cu): a row read in chunks of 16 bytes, chunk j of a row by lane j % 32
 * of warp part (j / 32) % ks (ks warps share a row), each lane summing its chunks in order, the lanes' sums
 * combined by the butterfly of __shfl_xor_sync (offsets 16 .. 1: lane l adds lane l ^ o's value to its own) and
 * the ks parts' in part order. A chunk holds 4 f32, 8 bf16 or fp16, 16 int8 weights, or 32 NF4 weights (half of a
 * block: byte t holds weight 16h + t in its low nibble and 32 + 16h + t in its high one, h = j % 2). Its values
 * are taken in pieces of at most 16 (NF4: the low nibbles, then the high ones), whose columns are consecutive;
 * a piece's sum of value times x is added to the lane's sum, times the block's scale for Q8 and NF4. */

#define SP_KM_CHUNK 16   /* bytes */
#define SP_KM_PIECE 16   /* values, at most */

SP_HD int sp_km_chunk_vals(int type)
{
    return type == SP_KM_F32 ? 4 : type == SP_KM_BF16 || type == SP_KM_F16 ? 8 : type == SP_KM_Q8 ? 16 : 32;
}
SP_HD int sp_km_piece_vals(int type) { return type == SP_KM_NF4 ? 16 : sp_km_chunk_vals(type); }

/* 1 if w can be read in whole chunks: rows of whole chunks (NF4: whole blocks; Q8: whole scale blocks or halves),
 * the values 16-byte aligned. Other matrices take the one-weight-a-thread kernel. */
SP_HD int sp_km_chunked(const sp_km_w *w)
{
    int per = w->type == SP_KM_NF4 ? SP_KM_NF4_BLOCK : sp_km_chunk_vals(w->type);
    return w->cols % per == 0 && ((uintptr_t)w->q % SP_KM_CHUNK) == 0;
}

/* The first column of piece p of chunk j (its values' columns follow it), and the chunk's scale block (Q8 and
 * NF4: two chunks a block). */
SP_HD int sp_km_piece_col(int type, int j, int p)
{
    if (type == SP_KM_NF4)
        return (j >> 1) * SP_KM_NF4_BLOCK + p * (SP_KM_NF4_BLOCK / 2) + (j & 1) * 16;
    return j * sp_km_chunk_vals(type);
}

SP_HD int sp_km_chunk_block(int j) { return j >> 1; }

/* Value t of piece p of a chunk (its bytes as 4 little-endian words v): f32, bf16 and fp16 the weight; Q8 the int8
 * value and NF4 the level (lut: the 16 levels as floats), to be scaled by the block's scale. */
SP_HD float sp_km_piece_val(int type, const uint32_t *v, int p, int t, const float *lut)
{
    switch (type) {
    case SP_KM_BF16: {
        uint32_t u = (t & 1) ? (v[t >> 1] & 0xffff0000u) : (v[t >> 1] << 16);
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
    }
    case SP_KM_F16: return sp_km_f16((uint16_t)((t & 1) ? v[t >> 1] >> 16 : v[t >> 1] & 0xffffu));
    case SP_KM_Q8:
#ifdef __CUDA_ARCH__ /* the byte, offset by 128, as the low bits of 2^23: exact, and no int-to-float conversion */
        return __int_as_float((int)__byte_perm(v[t >> 2] ^ 0x80808080u, 0x4B000000u, 0x7540u | (t & 3))) -
               8388736.0f;
#else
        return (float)(int8_t)(uint8_t)(v[t >> 2] >> (8 * (t & 3)));
#endif
    case SP_KM_NF4: return lut[(v[t >> 2] >> (8 * (t & 3) + 4 * p)) & 15];
    default: {
        float f;
        memcpy(&f, &v[t], sizeof f);
        return f;
    }
    }
}

/* A piece's share of a lane's sum: sum of wv[t] xs[t] over its n values, times the block's scale s for Q8 and
 * NF4. */
SP_HD float sp_km_piece_dot(int type, const float *wv, const float *xs, int n, float s)
{
    float d = 0.0f;
    for (int t = 0; t < n; t++)
        d += wv[t] * xs[t];
    return type == SP_KM_Q8 || type == SP_KM_NF4 ? d * s : d;
}

/* ---------------------------------------------------------------------------------------------- */
/* decode attention: one query position (at qpos = len - 1) of head h over len cached keys of kv head
 * h / (nh / nkv); cache rows [B, cap, nkv, hd] as sp_kv_cache holds them */

/* Block bh (of B * nh, one a query head of a batch row): its head h (the ALiBi slope's index) and the offset of
 * its kv head's position 0 in the cache; key position s is at kv0 + s * nkv * hd. */
SP_HD long sp_km_attn_block(int bh, int nh, int nkv, int hd, int cap, int *h)
{
    int b = bh / nh, g = (bh % nh) / (nh / nkv);
    *h = bh % nh;
    return ((long)b * cap * nkv + g) * hd;
}

/* Block bh's first query (and output) row in q [B, T, nh, hd]: rows nh * hd floats apart. */
SP_HD long sp_km_attn_qoff(int bh, int nh, int T, int hd) { return (long)(bh / nh) * T * nh * hd + (long)(bh % nh) * hd; }

/* Where head bh's operand of a per-head attention GEMM starts: its query rows in [B, T, nh, hd], its kv head's rows
 * in a cache [B, cap, nkv, hd], or its [T, S] block of scores [B, nh, T, S]. */
enum { SP_KM_OFF_Q, SP_KM_OFF_KV, SP_KM_OFF_TS };

SP_HD long sp_km_head_off(int which, int bh, int nh, int nkv, int T, int S, int hd, int cap)
{
    int h;
    if (which == SP_KM_OFF_KV)
        return sp_km_attn_block(bh, nh, nkv, hd, cap, &h);
    return which == SP_KM_OFF_Q ? sp_km_attn_qoff(bh, nh, T, hd) : (long)bh * T * S;
}

/* Scaled score of key s: scale q . k_s + ALiBi (slope 0: none). */
SP_HD float sp_km_attn_score(const float *q, const float *k, int hd, float scale, float slope, int s, int qpos)
{
    float d = 0.0f;
    for (int j = 0; j < hd; j++)
        d += q[j] * k[j];
    return d * scale + sp_km_alibi(slope, s, qpos);
}

/* Keys row `row` of prefill scores [B, nh, T, S] sees: its query (t = row % T) is at past + t. */
SP_HD int sp_km_causal_len(long row, int T, int past) { return past + (int)(row % T) + 1; }

/* A normalised probability: exp(score - max) / sum, as the CPU's masked softmax: times 1 / sum. */
SP_HD float sp_km_attn_prob(float score, float mx, float inv_sum) { return expf(score - mx) * inv_sum; }

/* The softmax backward of one probability (ops_impl.h's attention backward): p (g - sum(g p)) scale. */
SP_HD float sp_km_softmax_bwd(float p, float g, float dot, float scale) { return p * (g - dot) * scale; }

/* Output element j: sum over s of p[s] v_s[j] (p normalised), in key order. */
SP_HD float sp_km_attn_out(const float *p, const float *v, long ldv, int len, int j)
{
    float o = 0.0f;
    for (int s = 0; s < len; s++)
        o += p[s] * v[(long)s * ldv + j];
    return o;
}

#endif
