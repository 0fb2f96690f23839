/* ops.h - the CPU reference ops, as forward/backward pairs (llm.c style: outputs, then inputs, then
 * weights, then dimensions). Compute is f32 (`_f32`); every op also exists in double (`_f64`) so the
 * tests can check each backward against central finite differences in double precision.
 *
 * Conventions
 * - N = rows (tokens, B*T), C = channels, V = vocab, B = batch, T = new positions, S = key positions,
 *   nh = query heads, nkv = key/value heads (GQA: nh % nkv == 0), hd = head dim.
 * - Every backward ACCUMULATES (+=) into its gradient outputs, so gradients can be summed over
 *   microbatches; zero them first. A NULL gradient pointer means "not needed".
 * - Matrices use the Hugging Face layout: a linear weight W is [out, in] and y = x W^T + b. */
#ifndef SEPAL_OPS_H
#define SEPAL_OPS_H

#include <stdint.h>
#include <string.h>

/* exp for the f32 elementwise loops (SwiGLU, softmax): Cody-Waite range reduction and Cephes' degree-6
 * polynomial; within 2 ulp of exp over [-87, 88] (test_ops checks it against exp in double). Results below
 * 2^-126 are 0 (x < -87.68: never a subnormal, which costs ~100 cycles an operation on x86) and above
 * 2^127.5 +inf (x > 88.37). No calls and no branches, so the compiler can vectorise the loops using it.
 * The clamps' constants matter: the compiler may compute both sides of a clamp for every lane, and
 * exp(-88) = 0, exp(88.7) = inf keep subnormals out of those (g / (1 + exp(88)) would be one). */
static inline float sp_expf_vec(float x)
{
    x = x < -88.0f ? -88.0f : x; /* k = -127: 2^k below flushes to 0 */
    x = x > 88.7f ? 88.7f : x;   /* k = 128: +inf */
    float kf = x * 1.44269504088896341f + 12582912.0f; /* round(x / ln 2) by the 1.5 * 2^23 trick: */
    uint32_t kb;                                         /* kf's bits are 0x4B400000 + k */
    memcpy(&kb, &kf, sizeof kb);
    float k = kf - 12582912.0f;
    float r = x - k * 0.693359375f; /* ln 2 in two parts */
    r = r - k * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    uint32_t e = (kb - 0x4B400000u + 127u) << 23; /* 2^k; unsigned, so defined even for NaN (p is NaN then) */
    float s;
    memcpy(&s, &e, sizeof s);
    return p * s;
}

/* erf for the f32 GELU loops, odd in x: |x| < 1: x * P(x^2), P of degree 6; 1 <= |x| < 4: 1 - exp(Q(|x| - 2.5)),
 * Q of degree 8 fitting log(erfc) (both least-squares fits on Chebyshev nodes, made for this file); |x| >= 4: +-1
 * (erf(4) rounds to 1 in f32). Within 2 ulp of 1 near +-1 and 4 ulp relative for |x| < 1 (test_ops checks it
 * against erf in double). Branch-free like sp_expf_vec: both sides are computed and one is selected, so the
 * loops using it vectorise (glibc's erff is a call of ~12 ns an element). */
static inline float sp_erff_vec(float x)
{
    float a = x < 0.0f ? -x : x;
    float s = a < 1.0f ? a : 1.0f, z = s * s;
    float p = 7.933493885e-05f;
    p = p * z - 8.034846650e-04f;
    p = p * z + 5.191218377e-03f;
    p = p * z - 2.685539945e-02f;
    p = p * z + 1.128362573e-01f;
    p = p * z - 3.761262988e-01f;
    p = p * z + 1.128379167e+00f;
    float t = (a < 4.0f ? a : 4.0f) - 2.5f;
    float q = 1.614061655e-06f;
    q = q * t - 1.330939039e-05f;
    q = q * t + 7.739442559e-05f;
    q = q * t - 4.201445675e-04f;
    q = q * t + 2.165160310e-03f;
    q = q * t - 1.085851701e-02f;
    q = q * t - 9.438936403e-01f;
    q = q * t - 5.352680681e+00f;
    q = q * t - 7.806815277e+00f;
    float r = a < 1.0f ? s * p : 1.0f - sp_expf_vec(q);
    return x < 0.0f ? -r : r;
}

/* Causal attention geometry. Keys/values for batch b, position s, kv head g live at
 * k + ((b * kv_cap + s) * nkv + g) * hd, so a KV cache [B, kv_cap, nkv, hd] is used in place.
 * Query t (0..T-1) is at absolute position past + t and sees keys 0..past + t (S = past + T). */
typedef struct sp_attn_dims {
    int B, T, S, past, nh, nkv, hd, kv_cap;
    int keep_probs; /* 1: probs is [B, nh, T, S] and kept for backward; 0: probs is one [T, S] scratch */
    const float *alibi; /* ALiBi slopes [nh] (NULL: none): head h's score of query position i for key position
                           j gets + alibi[h] * (j - i), the bias BLOOM adds (slope * j there: the same after the
                           softmax, which ignores a per-row constant, and exact for any position offset) */
} sp_attn_dims;

/* ALiBi slopes for nh heads as BLOOM computes them: for the largest power of two n <= nh, 2^(-8i/n),
 * i = 1..n; the remaining heads take every other slope of 2n heads, 2^(-4i/n), i = 1, 3, 5, ... */
void sp_alibi_slopes(float *slopes, int nh);

/* Mixture-of-experts routing (Mixtral): the router's logits [N, E] -> for each row the K experts of highest
 * softmax probability (idx [N, K], in decreasing order; ties: the lower index) and their weights renormalised
 * to sum to 1 (w [N, K]): p_k / sum of the chosen p. w is the softmax over the chosen logits alone, so
 * the backward (selection held fixed, as autograd through topk does) is dlogits[n, e_k] += w_k (dw_k -
 * sum_j w_j dw_j), zero for the experts not chosen. */

#define SP_OPS_DECLARE(REAL, SFX)                                                                               \
    void sp_embedding_forward##SFX(REAL *out, const int32_t *ids, const REAL *table, int N, int C);            \
    void sp_embedding_backward##SFX(REAL *dtable, const REAL *dout, const int32_t *ids, int N, int C);         \
    void sp_rmsnorm_forward##SFX(REAL *out, REAL *rstd, const REAL *inp, const REAL *w, int N, int C,          \
                                 float eps);                                                                    \
    void sp_rmsnorm_backward##SFX(REAL *dinp, REAL *dw, const REAL *dout, const REAL *inp, const REAL *w,      \
                                  const REAL *rstd, int N, int C);                                              \
    void sp_layernorm_forward##SFX(REAL *out, REAL *mean, REAL *rstd, const REAL *inp, const REAL *w,          \
                                   const REAL *b, int N, int C, float eps);                                    \
    void sp_layernorm_backward##SFX(REAL *dinp, REAL *dw, REAL *db, const REAL *dout, const REAL *inp,         \
                                    const REAL *w, const REAL *mean, const REAL *rstd, int N, int C);           \
    void sp_linear_forward##SFX(REAL *out, const REAL *inp, const REAL *W, const REAL *bias, int N, int Cin,     \
                                int Cout);                                                                         \
    void sp_linear_backward##SFX(REAL *dinp, REAL *dW, REAL *dbias, const REAL *dout, const REAL *inp,         \
                                 const REAL *W, int N, int Cin, int Cout);                                           \
    void sp_rope_forward##SFX(REAL *out, const REAL *inp, const float *cos, const float *sin, int B, int T,     \
                              int nh, int hd);                                                                  \
    void sp_rope_backward##SFX(REAL *dinp, const REAL *dout, const float *cos, const float *sin, int B, int T, \
                               int nh, int hd);                                                                 \
    void sp_attention_forward##SFX(REAL *out, REAL *probs, const REAL *q, const REAL *k, const REAL *v,        \
                                   const sp_attn_dims *d);                                                      \
    void sp_attention_forward_rows##SFX(REAL *out, REAL *probs, const REAL *q, const REAL *k, const REAL *v,   \
                                        const sp_attn_dims *d, int tq, long u0, long u1);                       \
    void sp_masked_softmax##SFX(REAL *P, int T, int S, int past);                                              \
    void sp_attention_backward##SFX(REAL *dq, REAL *dk, REAL *dv, REAL *scratch, const REAL *dout,             \
                                    const REAL *probs, const REAL *q, const REAL *k, const REAL *v,            \
                                    const sp_attn_dims *d);                                                     \
    void sp_swiglu_forward##SFX(REAL *out, const REAL *gate, const REAL *up, long n);                          \
    void sp_swiglu_backward##SFX(REAL *dgate, REAL *dup, const REAL *dout, const REAL *gate, const REAL *up,   \
                                 long n);                                                                       \
    void sp_gelu_forward##SFX(REAL *out, const REAL *inp, long n);                                             \
    void sp_gelu_backward##SFX(REAL *dinp, const REAL *dout, const REAL *inp, long n);                         \
    void sp_gelu_tanh_forward##SFX(REAL *out, const REAL *inp, long n);                                        \
    void sp_gelu_tanh_backward##SFX(REAL *dinp, const REAL *dout, const REAL *inp, long n);                    \
    void sp_softmax_forward##SFX(REAL *out, const REAL *inp, int N, int C);                                    \
    void sp_softmax_backward##SFX(REAL *dinp, const REAL *dout, const REAL *out, int N, int C);                \
    void sp_moe_route_forward##SFX(REAL *w, int32_t *idx, const REAL *logits, int N, int E, int K);             \
    void sp_moe_route_backward##SFX(REAL *dlogits, const REAL *dw, const REAL *w, const int32_t *idx, int N,    \
                                    int E, int K);                                                              \
    void sp_crossentropy_forward##SFX(REAL *losses, const REAL *logits, const int32_t *targets, int N, int V); \
    void sp_crossentropy_backward##SFX(REAL *dlogits, const REAL *dlosses, const REAL *logits,                 \
                                       const int32_t *targets, int N, int V);

SP_OPS_DECLARE(float, _f32)
SP_OPS_DECLARE(double, _f64)

/* sp_attention_forward_rows: units u0 <= u < u1 of sp_attention_forward, a unit tq query rows (the last one of a
 * head may be shorter) of one (batch, head) pair: u = (b * nh + h) * ceil(T / tq) + t / tq. probs: the whole
 * [B, nh, T, S] with keep_probs, else a [tq, S] scratch of the caller's. With tq == T a unit is a head, with the
 * bits sp_attention_forward gives it (which runs every unit so). Disjoint ranges may run on several threads at
 * once, each with a scratch of its own. */

/* sp_masked_softmax: the attention's softmax of T rows of P (S apart), row t over keys 0..past+t, its masked tail
 * set to 0; every row with the bits it gets alone (T = 1, past + t), whichever rows it is given with. */

/* Floats in sp_attention_forward's probs buffer (keep_probs decides) and in the backward's scratch
 * (one [T, S] matrix). Causal masking needs d->S == d->past + d->T. */
long sp_attention_probs_size(const sp_attn_dims *d);
long sp_attention_scratch_size(const sp_attn_dims *d);

/* Short names for the f32 compute path (ops.c instantiates both precisions and opts out). */
#ifndef SP_OPS_NO_SHORT_NAMES
#define sp_embedding_forward sp_embedding_forward_f32
#define sp_embedding_backward sp_embedding_backward_f32
#define sp_rmsnorm_forward sp_rmsnorm_forward_f32
#define sp_rmsnorm_backward sp_rmsnorm_backward_f32
#define sp_layernorm_forward sp_layernorm_forward_f32
#define sp_layernorm_backward sp_layernorm_backward_f32
#define sp_linear_forward sp_linear_forward_f32
#define sp_linear_backward sp_linear_backward_f32
#define sp_rope_forward sp_rope_forward_f32
#define sp_rope_backward sp_rope_backward_f32
#define sp_attention_forward sp_attention_forward_f32
#define sp_attention_forward_rows sp_attention_forward_rows_f32
#define sp_attention_backward sp_attention_backward_f32
#define sp_masked_softmax sp_masked_softmax_f32
#define sp_swiglu_forward sp_swiglu_forward_f32
#define sp_swiglu_backward sp_swiglu_backward_f32
#define sp_gelu_forward sp_gelu_forward_f32
#define sp_gelu_backward sp_gelu_backward_f32
#define sp_gelu_tanh_forward sp_gelu_tanh_forward_f32
#define sp_gelu_tanh_backward sp_gelu_tanh_backward_f32
#define sp_softmax_forward sp_softmax_forward_f32
#define sp_softmax_backward sp_softmax_backward_f32
#define sp_moe_route_forward sp_moe_route_forward_f32
#define sp_moe_route_backward sp_moe_route_backward_f32
#define sp_crossentropy_forward sp_crossentropy_forward_f32
#define sp_crossentropy_backward sp_crossentropy_backward_f32
#endif

#endif
