/* test_cuda_host.c - the CUDA kernels' arithmetic, run on the host (cuda_emul.c: the kernels' threads, strides and
 * reduction trees over kmath.h), against core's CPU reference ops on random and odd shapes; the GEMM plans against
 * sp_linear_*; the device weight layouts against sp_qmat_row; CUDA's errors as sepal's. Needs no GPU: this is what
 * verifies the numerics on machines without one (test_cuda runs the real kernels where a GPU is). Tolerances sit
 * beside each check: abs + rel |reference|, in units of f32 rounding, where the CPU's vectorised exp / erf (2 and 4
 * ulp) meet glibc's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block.h"
#include "block_cuda.h"
#include "cuda_backend.h"
#include "cuda_emul.h"
#include "half.h"
#include "kernels.h"
#include "kmath_moe.h"
#include "moe_cuda.h"
#include "ops.h"
#include "rng.h"
#include "rope.h"
#include "testrun.h"

static const int odd_C[] = {1, 7, 33, 257, 1000, 4097};
#define NSHAPES (int)(sizeof odd_C / sizeof odd_C[0])

#define ASSERT_CLOSE(a, b, n, abs_tol, rel_tol, what)                                                          \
    do {                                                                                                       \
        double e_ = emul_err((a), (b), (n), (abs_tol), (rel_tol));                                             \
        ck_assert_msg(e_ <= 1.0, "%s: error %.3g of the tolerance", (what), e_);                               \
    } while (0)

START_TEST(t_row_threads_and_trees)
{
    ck_assert_int_eq(sp_km_row_threads(1), 32);
    ck_assert_int_eq(sp_km_row_threads(256), 32);
    ck_assert_int_eq(sp_km_row_threads(257), 64);
    ck_assert_int_eq(sp_km_row_threads(4096), 512);
    ck_assert_int_eq(sp_km_row_threads(32000), 1024);
    ck_assert_int_eq(sp_km_row_threads(1 << 30), 1024);
    float a[64], m[64];
    for (int i = 0; i < 64; i++)
        a[i] = (float)i, m[i] = (float)((i * 37) % 64) - 20.0f;
    ck_assert_float_eq(sp_km_tree_sum(a, 64), 2016.0f);
    ck_assert_float_eq(sp_km_tree_max(m, 64), 43.0f);
    /* a thread without columns contributes the neutral element */
    float x[3] = {-5, -7, -6};
    ck_assert_float_eq(sp_km_max_part(x, 3, 40, 64), -INFINITY);
    ck_assert_float_eq(sp_km_sum_part(x, 3, 40, 64), 0.0f);
}
END_TEST

START_TEST(t_rmsnorm_vs_cpu)
{
    sp_rng r;
    sp_rng_seed(&r, 21);
    for (int k = 0; k < NSHAPES; k++) {
        int N = 5 + k, C = odd_C[k];
        size_t n = (size_t)N * C;
        float *x = emul_randn(&r, n, 2.0f), *w = emul_randn(&r, (size_t)C, 1.0f), *dy = emul_randn(&r, n, 1.0f);
        float *y0 = malloc(n * 4), *y1 = malloc(n * 4), *r0 = malloc((size_t)N * 4), *r1 = malloc((size_t)N * 4);
        sp_rmsnorm_forward(y0, r0, x, w, N, C, 1e-5f);
        emul_rmsnorm_fwd(y1, r1, x, w, N, C, 1e-5f);
        ASSERT_CLOSE(y1, y0, n, 1e-6, 1e-5, "rmsnorm forward");
        ASSERT_CLOSE(r1, r0, (size_t)N, 0, 1e-5, "rmsnorm rstd");
        /* backward, accumulating into gradients that hold something already */
        float *dx0 = emul_randn(&r, n, 1.0f), *dx1 = emul_dup(dx0, n);
        float *dw0 = emul_randn(&r, (size_t)C, 1.0f), *dw1 = emul_dup(dw0, (size_t)C);
        sp_rmsnorm_backward(dx0, dw0, dy, x, w, r0, N, C);
        emul_rmsnorm_bwd(dx1, dw1, dy, x, w, r0, N, C);
        ASSERT_CLOSE(dx1, dx0, n, 1e-5, 1e-5, "rmsnorm dinp");
        ASSERT_CLOSE(dw1, dw0, (size_t)C, 1e-5, 1e-5, "rmsnorm dw");
        free(x), free(w), free(dy), free(y0), free(y1), free(r0), free(r1), free(dx0), free(dx1), free(dw0), free(dw1);
    }
}
END_TEST

START_TEST(t_layernorm_vs_cpu)
{
    sp_rng r;
    sp_rng_seed(&r, 22);
    for (int k = 0; k < NSHAPES * 2; k++) {
        int N = 3 + k, C = odd_C[k % NSHAPES], affine = k < NSHAPES;
        size_t n = (size_t)N * C;
        float *x = emul_randn(&r, n, 3.0f), *dy = emul_randn(&r, n, 1.0f);
        for (size_t i = 0; i < n; i++)
            x[i] += 1.5f; /* a mean away from 0 */
        float *w = affine ? emul_randn(&r, (size_t)C, 1.0f) : NULL, *b = affine ? emul_randn(&r, (size_t)C, 1.0f) : NULL;
        float *y0 = malloc(n * 4), *y1 = malloc(n * 4);
        float *m0 = malloc((size_t)N * 4), *m1 = malloc((size_t)N * 4), *r0 = malloc((size_t)N * 4),
              *r1 = malloc((size_t)N * 4);
        sp_layernorm_forward(y0, m0, r0, x, w, b, N, C, 1e-5f);
        emul_layernorm_fwd(y1, m1, r1, x, w, b, N, C, 1e-5f);
        ASSERT_CLOSE(y1, y0, n, 1e-5, 1e-5, "layernorm forward");
        ASSERT_CLOSE(m1, m0, (size_t)N, 1e-6, 1e-5, "layernorm mean");
        ASSERT_CLOSE(r1, r0, (size_t)N, 0, 1e-5, "layernorm rstd");
        float *dx0 = emul_randn(&r, n, 1.0f), *dx1 = emul_dup(dx0, n);
        float *dw0 = emul_randn(&r, (size_t)C, 1.0f), *dw1 = emul_dup(dw0, (size_t)C);
        float *db0 = emul_randn(&r, (size_t)C, 1.0f), *db1 = emul_dup(db0, (size_t)C);
        sp_layernorm_backward(dx0, dw0, db0, dy, x, w, m0, r0, N, C);
        emul_layernorm_bwd(dx1, dw1, db1, dy, x, w, m0, r0, N, C);
        ASSERT_CLOSE(dx1, dx0, n, 1e-5, 1e-5, "layernorm dinp");
        ASSERT_CLOSE(dw1, dw0, (size_t)C, 1e-5, 1e-5, "layernorm dw");
        ASSERT_CLOSE(db1, db0, (size_t)C, 1e-5, 1e-5, "layernorm db");
        free(x), free(dy), free(w), free(b), free(y0), free(y1), free(m0), free(m1), free(r0), free(r1);
        free(dx0), free(dx1), free(dw0), free(dw1), free(db0), free(db1);
    }
}
END_TEST

/* RoPE of every scaling (default, linear, llama3 with Llama 3.1's constants) at a small and a large offset,
 * against sp_rope_tables + sp_rope_forward / _backward. */
START_TEST(t_rope_vs_cpu)
{
    const sp_rope_type types[] = {SP_ROPE_DEFAULT, SP_ROPE_LINEAR, SP_ROPE_LLAMA3};
    const int hds[] = {8, 64, 128}, pos0s[] = {0, 5, 8190};
    sp_rng r;
    sp_rng_seed(&r, 23);
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < 3; j++) {
            sp_config cfg = {.head_dim = hds[k], .rope_theta = 500000.0, .rope_type = types[j], .rope_factor = 8.0,
                             .rope_low_freq_factor = 1.0, .rope_high_freq_factor = 4.0, .rope_orig_max_pos = 8192};
            sp_rope rope;
            ck_assert_int_eq(sp_rope_init(&rope, &cfg, NULL), SP_OK);
            int B = 2, T = 3, nh = 3, hd = hds[k], half = hd / 2, pos0 = pos0s[j];
            size_t n = (size_t)B * T * nh * hd;
            float *cs = malloc((size_t)T * half * 4), *sn = malloc((size_t)T * half * 4);
            sp_rope_tables(&rope, pos0, T, cs, sn);
            float *x = emul_randn(&r, n, 1.0f), *y0 = malloc(n * 4), *y1 = malloc(n * 4);
            sp_rope_forward(y0, x, cs, sn, B, T, nh, hd);
            emul_rope(y1, x, rope.inv_freq, pos0, B, T, nh, hd, 0);
            ASSERT_CLOSE(y1, y0, n, 1e-6, 1e-6, "rope forward");
            float *d0 = emul_randn(&r, n, 1.0f), *d1 = emul_dup(d0, n);
            sp_rope_backward(d0, x, cs, sn, B, T, nh, hd);
            emul_rope(d1, x, rope.inv_freq, pos0, B, T, nh, hd, 1);
            ASSERT_CLOSE(d1, d0, n, 1e-6, 1e-6, "rope backward");
            emul_rope(x, x, rope.inv_freq, pos0, B, T, nh, hd, 0); /* in place */
            ASSERT_CLOSE(x, y0, n, 1e-6, 1e-6, "rope in place");
            free(cs), free(sn), free(x), free(y0), free(y1), free(d0), free(d1);
        }
}
END_TEST

/* Prefill attention as the GPU path composes it (a GEMM a head for the scores, the ALiBi and causal-softmax
 * kernels, a GEMM a head for P V), against sp_attention_forward: MHA, GQA and MQA, with and without ALiBi, with
 * and without a cached prefix; probabilities and outputs. */
START_TEST(t_attn_prefill_vs_cpu)
{
    const int kvh[] = {6, 3, 1}, pasts[] = {0, 3};
    sp_rng r;
    sp_rng_seed(&r, 24);
    float slopes[6];
    sp_alibi_slopes(slopes, 6);
    for (int a = 0; a < 3; a++)
        for (int k = 0; k < 4; k++) {
            int B = 2, nh = 6, nkv = kvh[a], hd = 16, T = 5, past = pasts[k % 2];
            const float *al = k >= 2 ? slopes : NULL;
            emul_attn c;
            emul_attn_case(&c, &r, B, T, past, nh, nkv, hd, past + T + 2, al);
            float *p1 = malloc(c.np * 4), *o1 = malloc(c.nq * 4);
            emul_attn_prefill(o1, p1, c.q, c.kc, c.vc, al, B, T, past, nh, nkv, hd, c.d.kv_cap);
            ASSERT_CLOSE(p1, c.probs, c.np, 1e-6, 1e-5, "prefill probabilities");
            ASSERT_CLOSE(o1, c.out, c.nq, 1e-5, 1e-5, "prefill attention output");
            free(p1), free(o1);
            emul_attn_free(&c);
        }
}
END_TEST

/* The attention backward as the device composes it (GEMMs a head for dP, dV, dQ, dK; the softmax backward by rows)
 * against sp_attention_backward, from the same probabilities: MHA, GQA and MQA, a cached prefix or none; all three
 * gradients added into what they held. */
START_TEST(t_attn_backward_vs_cpu)
{
    const int kvh[] = {6, 3, 1}, pasts[] = {0, 4};
    sp_rng r;
    sp_rng_seed(&r, 31);
    for (int a = 0; a < 3; a++)
        for (int k = 0; k < 2; k++) {
            int B = 2, nh = 6, nkv = kvh[a], hd = 16, T = 5, past = pasts[k];
            emul_attn c;
            emul_attn_case(&c, &r, B, T, past, nh, nkv, hd, past + T + 1, NULL);
            size_t nq = c.nq, nk = c.nk;
            float *dout = emul_randn(&r, nq, 1.0f), *scratch = malloc((size_t)T * c.d.S * 4);
            float *dq0 = emul_randn(&r, nq, 1.0f), *dk0 = emul_randn(&r, nk, 1.0f), *dv0 = emul_randn(&r, nk, 1.0f);
            float *dq1 = emul_dup(dq0, nq), *dk1 = emul_dup(dk0, nk), *dv1 = emul_dup(dv0, nk);
            sp_attention_backward(dq0, dk0, dv0, scratch, dout, c.probs, c.q, c.kc, c.vc, &c.d);
            emul_attn_backward(dq1, dk1, dv1, dout, c.probs, c.q, c.kc, c.vc, B, T, past, nh, nkv, hd, c.d.kv_cap);
            ASSERT_CLOSE(dq1, dq0, nq, 1e-5, 1e-5, "attention dq");
            ASSERT_CLOSE(dk1, dk0, nk, 1e-5, 1e-5, "attention dk");
            ASSERT_CLOSE(dv1, dv0, nk, 1e-5, 1e-5, "attention dv");
            free(dout), free(scratch), free(dq0), free(dk0), free(dv0), free(dq1), free(dk1), free(dv1);
            emul_attn_free(&c);
        }
}
END_TEST

/* Decode attention (one new position over the cache) for MHA, GQA and MQA, with and without ALiBi. */
START_TEST(t_attn_decode_vs_cpu)
{
    const int kvh[] = {8, 2, 1}, lens[] = {1, 7, 300};
    sp_rng r;
    sp_rng_seed(&r, 25);
    float slopes[8];
    sp_alibi_slopes(slopes, 8);
    for (int a = 0; a < 3; a++)
        for (int l = 0; l < 3; l++)
            for (int al = 0; al < 2; al++) {
                int B = 2, nh = 8, nkv = kvh[a], hd = 32, len = lens[l], cap = len + 5;
                size_t nq = (size_t)B * nh * hd, nk = (size_t)B * cap * nkv * hd;
                float *q = emul_randn(&r, nq, 1.0f), *kc = emul_randn(&r, nk, 1.0f), *vc = emul_randn(&r, nk, 1.0f);
                float *o0 = malloc(nq * 4), *o1 = malloc(nq * 4), *probs = malloc((size_t)len * 4);
                sp_attn_dims d = {.B = B, .T = 1, .S = len, .past = len - 1, .nh = nh, .nkv = nkv, .hd = hd,
                                  .kv_cap = cap, .alibi = al ? slopes : NULL};
                sp_attention_forward(o0, probs, q, kc, vc, &d);
                emul_attn_decode(o1, q, kc, vc, al ? slopes : NULL, B, nh, nkv, hd, cap, len);
                ASSERT_CLOSE(o1, o0, nq, 1e-5, 1e-5, "decode attention");
                free(q), free(kc), free(vc), free(o0), free(o1), free(probs);
            }
}
END_TEST

/* Inputs for the activations: a wide normal spread, then the edges (0, tiny, the saturating and clamped ends). */
static float *act_inputs(sp_rng *r, size_t n)
{
    float *x = emul_randn(r, n, 4.0f);
    const float edge[] = {0.0f, 1e-7f, -1e-7f, 1e-3f, -1e-3f, 9.0f, -9.0f, 30.0f, -30.0f, 87.0f, -87.0f, 100.0f, -100.0f};
    memcpy(x, edge, sizeof edge);
    return x;
}

START_TEST(t_activations_vs_cpu)
{
    size_t n = 20011;
    sp_rng r;
    sp_rng_seed(&r, 26);
    float *x = act_inputs(&r, n), *u = emul_randn(&r, n, 1.0f), *dy = emul_randn(&r, n, 1.0f);
    float *y0 = malloc(n * 4), *y1 = malloc(n * 4);
    float *a0 = emul_randn(&r, n, 1.0f), *a1 = emul_dup(a0, n), *b0 = emul_randn(&r, n, 1.0f), *b1 = emul_dup(b0, n);
    /* SwiGLU: relative 4 ulp (the CPU's exp is within 2 ulp, the division and products add rounding) */
    sp_swiglu_forward(y0, x, u, (long)n);
    for (size_t i = 0; i < n; i++)
        y1[i] = sp_km_swiglu(x[i], u[i]);
    ASSERT_CLOSE(y1, y0, n, 1e-30, 5e-7, "swiglu");
    sp_swiglu_backward(a0, b0, dy, x, u, (long)n);
    for (size_t i = 0; i < n; i++)
        sp_km_swiglu_bwd(&a1[i], &b1[i], dy[i], x[i], u[i]);
    ASSERT_CLOSE(a1, a0, n, 1e-6, 1e-6, "swiglu dgate");
    ASSERT_CLOSE(b1, b0, n, 1e-6, 1e-6, "swiglu dup");
    /* GELU (erf): 1 + erf(x / sqrt 2) cancels for x << 0, so an absolute 1e-6 there (the CPU's erf: 4 ulp of 1) */
    for (int tanh_approx = 0; tanh_approx < 2; tanh_approx++) {
        (tanh_approx ? sp_gelu_tanh_forward : sp_gelu_forward)(y0, x, (long)n);
        for (size_t i = 0; i < n; i++)
            y1[i] = tanh_approx ? sp_km_gelu_tanh(x[i]) : sp_km_gelu(x[i]);
        ASSERT_CLOSE(y1, y0, n, 1e-6, 1e-6, tanh_approx ? "gelu_tanh" : "gelu");
        memcpy(a1, a0, n * 4);
        (tanh_approx ? sp_gelu_tanh_backward : sp_gelu_backward)(a0, dy, x, (long)n);
        for (size_t i = 0; i < n; i++)
            a1[i] += dy[i] * (tanh_approx ? sp_km_gelu_tanh_grad(x[i]) : sp_km_gelu_grad(x[i]));
        ASSERT_CLOSE(a1, a0, n, 1e-6, 1e-6, tanh_approx ? "gelu_tanh backward" : "gelu backward");
    }
    free(x), free(u), free(dy), free(y0), free(y1), free(a0), free(a1), free(b0), free(b1);
}
END_TEST

START_TEST(t_embedding_vs_cpu)
{
    int V = 50, N = 9, C = 33;
    sp_rng r;
    sp_rng_seed(&r, 27);
    float *table = emul_randn(&r, (size_t)V * C, 1.0f), *y0 = malloc((size_t)N * C * 4), *y1 = malloc((size_t)N * C * 4);
    int32_t ids[9] = {0, 49, 3, 3, 17, 0, 48, 1, 2};
    sp_embedding_forward(y0, ids, table, N, C);
    ck_assert_int_eq(emul_embedding(y1, ids, table, V, N, C), 0);
    ck_assert_mem_eq(y1, y0, (size_t)N * C * 4);
    ids[4] = 50; /* outside the vocabulary: flagged, its row zeros, the others intact */
    ck_assert_int_eq(emul_embedding(y1, ids, table, V, N, C), 1);
    ck_assert_float_eq(y1[4 * C], 0.0f);
    ck_assert_mem_eq(y1 + 5 * C, y0 + 5 * C, (size_t)4 * C * 4);
    ids[4] = -1;
    ck_assert_int_eq(emul_embedding(y1, ids, table, V, N, C), 1);
    free(table), free(y0), free(y1);
}
END_TEST

START_TEST(t_softmax_crossentropy_vs_cpu)
{
    const int Vs[] = {1, 7, 1000, 32000};
    sp_rng r;
    sp_rng_seed(&r, 28);
    for (int k = 0; k < 4; k++) {
        int N = 4, V = Vs[k];
        size_t n = (size_t)N * V;
        float *x = emul_randn(&r, n, 3.0f), *y0 = malloc(n * 4), *y1 = malloc(n * 4);
        int32_t tg[4] = {0, V - 1, -1, V / 2};
        float dl[4] = {0.25f, 1.0f, 3.0f, -0.5f}, l0[4], l1[4];
        /* the sums of V exponentials differ by a few sqrt(V) ulp (the CPU adds them in sequence, the kernel by tree) */
        double rel = 5e-7 * sqrt((double)V) + 1e-6;
        sp_softmax_forward(y0, x, N, V);
        emul_softmax(y1, x, N, V);
        ASSERT_CLOSE(y1, y0, n, 1e-9, rel, "softmax");
        sp_crossentropy_forward(l0, x, tg, N, V);
        ck_assert_int_eq(emul_crossentropy(l1, NULL, NULL, x, tg, N, V), 0);
        ASSERT_CLOSE(l1, l0, 4, 1e-5, rel, "cross-entropy");
        ck_assert_float_eq(l1[2], 0.0f); /* ignored target */
        float *d0 = emul_randn(&r, n, 1.0f), *d1 = emul_dup(d0, n);
        sp_crossentropy_backward(d0, dl, x, tg, N, V);
        ck_assert_int_eq(emul_crossentropy(NULL, d1, dl, x, tg, N, V), 0);
        ASSERT_CLOSE(d1, d0, n, 1e-6, rel, "cross-entropy backward");
        tg[1] = V; /* outside the vocabulary: the kernel's flag */
        ck_assert_int_eq(emul_crossentropy(l1, NULL, NULL, x, tg, N, V), 1);
        free(x), free(y0), free(y1), free(d0), free(d1);
    }
}
END_TEST

/* kmath's fp16 decoding (the host's, from the bits; the device runs cvt.f32.f16, exact as well) gives every one of
 * the 65536 halves the value common/half.c gives it: normals, subnormals, zeros, infinities, NaNs (as NaNs). */
START_TEST(t_f16_all_values)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float a = sp_km_f16((uint16_t)h), b = sp_f16_to_f32((uint16_t)h);
        if (isnan(b)) {
            ck_assert_msg(isnan(a), "half 0x%04x: %g, not a NaN", h, (double)a);
            continue;
        }
        ck_assert_msg(memcmp(&a, &b, sizeof a) == 0, "half 0x%04x: %a against %a", h, (double)a, (double)b);
    }
}
END_TEST

/* The device layouts decode to sp_qmat_row's values bit for bit, every encoding and odd shapes; the decode
 * product equals the scalar CPU kernels' within f32 rounding of sum |w x|. */
START_TEST(t_weights_vs_cpu)
{
    const int cols[] = {1, 31, 33, 64, 65, 100, 130};
    sp_rng r;
    sp_rng_seed(&r, 29);
    sp_kern_force(0); /* the scalar level: decoded weights times f32 x, as the device computes them */
    for (int t = 0; t < SP_W__COUNT; t++)
        for (int k = 0; k < 7; k++) {
            int rows = 17 + k, C = cols[k], nb8 = sp_km_blocks(C, SP_KM_Q8_BLOCK);
            float *w = emul_randn(&r, (size_t)rows * C, 0.05f);
            sp_qmat m;
            ck_assert_int_eq(sp_qmat_encode(&m, (sp_wtype)t, w, rows, C, NULL), SP_OK);
            int8_t *q8 = malloc((size_t)rows * C);
            float *s8 = malloc((size_t)rows * nb8 * 4);
            uint8_t *q4 = NULL;
            sp_km_w kw;
            if (t == SP_W_Q8) {
                sp_cuda_q8_rowmajor(&m, q8, s8);
                kw = sp_cuda_km_w(m.type, rows, C, q8, s8);
            } else if (t == SP_W_NF4) { /* 32 bytes a block of 64 (q8 may be smaller); a step a block */
                q4 = malloc((size_t)rows * sp_km_blocks(C, SP_KM_NF4_BLOCK) * (SP_KM_NF4_BLOCK / 2));
                ck_assert_int_eq(sp_cuda_nf4_rowmajor(&m, q4, s8, NULL), SP_OK);
                kw = sp_cuda_km_w(m.type, rows, C, q4, s8);
            } else {
                kw = sp_cuda_km_w(m.type, rows, C, m.q, m.scale);
            }
            float *row = malloc((size_t)C * 4);
            for (int i = 0; i < rows; i++) {
                sp_qmat_row(&m, i, row);
                for (int c = 0; c < C; c++)
                    ck_assert_msg(sp_km_w_at(&kw, i, c) == row[c], "%s [%d, %d] at (%d, %d)",
                                  sp_wtype_name(m.type), rows, C, i, c);
            }
            for (int B = 1; B <= 8; B += 7) {
                float *x = emul_randn(&r, (size_t)B * C, 1.0f), *y0 = malloc((size_t)B * rows * 4),
                      *y1 = malloc((size_t)B * rows * 4);
                sp_qmat_mul(&m, x, y0, B, NULL);
                emul_wmat_mul(&kw, x, y1, B);
                ASSERT_CLOSE(y1, y0, (size_t)B * rows, 1e-5 * sqrt((double)C) * 0.05, 1e-5, "decode product");
                free(x), free(y0), free(y1);
            }
            free(row), free(q8), free(q4), free(s8), free(w);
            sp_qmat_free(&m);
        }
    sp_kern_force(-1);
}
END_TEST

/* A host matrix in the device layout (kw: the kernels' view of it; the buffers freed by wmat_host_free). */
typedef struct { sp_qmat m; sp_km_w kw; void *q; float *s; } wmat_host;

static void wmat_host_make(wmat_host *h, sp_wtype t, sp_rng *r, int rows, int C)
{
    float *w = emul_randn(r, (size_t)rows * C, 0.05f);
    sp_err e_ = {0};
    ck_assert_msg(sp_qmat_encode(&h->m, t, w, rows, C, &e_) == SP_OK, "%s", e_.msg);
    free(w);
    h->q = NULL, h->s = NULL;
    if (t == SP_W_Q8) {
        h->q = malloc((size_t)rows * C);
        h->s = malloc((size_t)rows * sp_km_blocks(C, SP_KM_Q8_BLOCK) * 4);
        sp_cuda_q8_rowmajor(&h->m, h->q, h->s);
    } else if (t == SP_W_NF4) {
        h->q = malloc((size_t)rows * sp_km_blocks(C, SP_KM_NF4_BLOCK) * (SP_KM_NF4_BLOCK / 2));
        h->s = malloc((size_t)rows * sp_km_blocks(C, SP_KM_NF4_BLOCK) * 4);
        ck_assert_int_eq(sp_cuda_nf4_rowmajor(&h->m, h->q, h->s, NULL), SP_OK);
    }
    h->kw = sp_cuda_km_w(t, rows, C, h->q ? h->q : h->m.q, h->q ? h->s : h->m.scale);
}

static void wmat_host_free(wmat_host *h)
{
    free(h->q), free(h->s);
    sp_qmat_free(&h->m);
}

/* The vectorised decode kernel's arithmetic (16-byte chunks, lanes' sums, the butterfly, ks warps a row) equals
 * the scalar CPU kernels' within f32 rounding, every encoding, 1 to 8 rows of x; widths that are not whole chunks
 * are left to the one-weight-a-thread kernel. */
START_TEST(t_wmat_vec_vs_cpu)
{
    const int cols[] = {64, 192, 2112};
    sp_rng r;
    sp_rng_seed(&r, 31);
    sp_kern_force(0);
    for (int t = 0; t < SP_W__COUNT; t++)
        for (int k = 0; k < 3; k++) {
            int rows = 5 + 4 * k, C = cols[k];
            wmat_host h;
            wmat_host_make(&h, (sp_wtype)t, &r, rows, C);
            ck_assert_int_eq(sp_km_chunked(&h.kw), 1);
            for (int B = 1; B <= 8; B += B < 3 ? 2 : 5) /* 1, 3, 8 */
                for (int ks = 1; ks <= 4; ks *= 2) {
                    float *x = emul_randn(&r, (size_t)B * C, 1.0f), *y0 = malloc((size_t)B * rows * 4),
                          *y1 = malloc((size_t)B * rows * 4);
                    sp_qmat_mul(&h.m, x, y0, B, NULL);
                    emul_wmat_vec(&h.kw, x, y1, B, ks);
                    ASSERT_CLOSE(y1, y0, (size_t)B * rows, 1e-5 * sqrt((double)C) * 0.05, 1e-5, "chunked product");
                    free(x), free(y0), free(y1);
                }
            wmat_host_free(&h);
        }
    sp_kern_force(-1);
    /* not whole chunks: f32 33 columns, bf16 and fp16 36, int8 40, NF4 96 (a block and a half) */
    const int odd[SP_W__COUNT] = {[SP_W_F32] = 33, [SP_W_BF16] = 36, [SP_W_Q8] = 40, [SP_W_NF4] = 96, [SP_W_F16] = 36};
    for (int t = 0; t < SP_W__COUNT; t++) {
        wmat_host h;
        wmat_host_make(&h, (sp_wtype)t, &r, 3, odd[t]);
        ck_assert_int_eq(sp_km_chunked(&h.kw), 0);
        wmat_host_free(&h);
    }
}
END_TEST

/* B > 8 through bf16 GEMMs (tiles of 7 rows decoded and rounded to bf16, X or dY rounded to bf16): the tile plans
 * compute sp_qmat_mul and sp_qmat_mul_t_acc within emul_gemm_tol(bf16) of sum |a w| (what test_cuda allows). */
START_TEST(t_wmat_gemm_plans_vs_cpu)
{
    int rows = 23, C = 40, B = 12;
    sp_rng r;
    sp_rng_seed(&r, 32);
    sp_kern_force(0); /* the scalar level: decoded weights times f32 x (the integer levels quantise x at any B) */
    for (int t = SP_W_BF16; t < SP_W__COUNT; t++) {
        wmat_host h;
        wmat_host_make(&h, (sp_wtype)t, &r, rows, C);
        float *dec = malloc((size_t)rows * C * 4);
        for (int i = 0; i < rows; i++)
            sp_qmat_row(&h.m, i, dec + (size_t)i * C);
        float *x = emul_randn(&r, (size_t)B * C, 1.0f), *y0 = malloc((size_t)B * rows * 4),
              *y1 = malloc((size_t)B * rows * 4), *scale = malloc((size_t)B * rows * 4);
        sp_qmat_mul(&h.m, x, y0, B, NULL);
        emul_linear_scale(scale, x, dec, B, C, rows);
        emul_wmat_gemm_bf16(&h.kw, x, y1, B, 7, 0);
        for (int i = 0; i < B * rows; i++)
            ck_assert_msg(fabs((double)y1[i] - y0[i]) <= emul_gemm_tol(SP_CU_BF16) * scale[i], "%s Y at %d: %g vs %g",
                          sp_wtype_name(h.m.type), i, (double)y1[i], (double)y0[i]);
        /* dX += dY W, into a gradient that holds something */
        float *dy = emul_randn(&r, (size_t)B * rows, 1.0f), *dx0 = emul_randn(&r, (size_t)B * C, 1.0f);
        float *dx1 = emul_dup(dx0, (size_t)B * C);
        sp_qmat_mul_t_acc(&h.m, dy, dx0, B, NULL);
        emul_wmat_gemm_bf16(&h.kw, dy, dx1, B, 7, 1);
        double e = emul_mul_t_err(dx1, dx0, dy, dec, B, rows, C, emul_gemm_tol(SP_CU_BF16));
        ck_assert_msg(e <= 1.0, "%s dX: error %.3g of the tolerance", sp_wtype_name(h.m.type), e);
        free(dec), free(x), free(y0), free(y1), free(scale), free(dy), free(dx0), free(dx1);
        wmat_host_free(&h);
    }
    sp_kern_force(-1);
}
END_TEST

/* The GEMM plans, run by a column-major product as cuBLAS runs them, compute sp_linear_forward / _backward;
 * with operands rounded to bf16 / fp16 they stay within emul_gemm_tol of the f32 result, which the GPU test uses. */
static double worst_rel(const float *a, const float *ref, const float *scale, size_t n)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - ref[i]) / ((double)scale[i] + 1e-30);
        worst = e > worst ? e : worst;
    }
    return worst;
}

START_TEST(t_gemm_plans_vs_cpu)
{
    int N = 5, in = 33, out = 17;
    sp_rng r;
    sp_rng_seed(&r, 30);
    float *X = emul_randn(&r, (size_t)N * in, 1.0f), *W = emul_randn(&r, (size_t)out * in, 1.0f);
    float *dY = emul_randn(&r, (size_t)N * out, 1.0f);
    float *y0 = malloc((size_t)N * out * 4), *y1 = malloc((size_t)N * out * 4), *scale = malloc((size_t)N * out * 4);
    sp_linear_forward(y0, X, W, NULL, N, in, out);
    emul_linear_scale(scale, X, W, N, in, out);
    for (int t = SP_CU_F32; t <= SP_CU_F16; t++) {
        float *Xr = emul_dup(X, (size_t)N * in), *Wr = emul_dup(W, (size_t)out * in);
        emul_round(Xr, (size_t)N * in, (sp_cu_dtype)t);
        emul_round(Wr, (size_t)out * in, (sp_cu_dtype)t);
        sp_gemm_plan p = sp_gemm_plan_linear(N, in, out, 0);
        emul_gemm(&p, Wr, Xr, y1);
        double e = worst_rel(y1, y0, scale, (size_t)N * out);
        ck_assert_msg(e <= emul_gemm_tol((sp_cu_dtype)t), "dtype %d: %g", t, e);
        if (t == SP_CU_BF16) /* the tolerance is not loose enough to pass anything: bf16 is outside fp16's */
            ck_assert_double_gt(e, emul_gemm_tol(SP_CU_F16));
        free(Xr), free(Wr);
    }
    /* accumulate: Y += X W^T */
    memcpy(y1, y0, (size_t)N * out * 4);
    sp_gemm_plan p = sp_gemm_plan_linear(N, in, out, 1);
    emul_gemm(&p, W, X, y1);
    for (int i = 0; i < N * out; i++)
        ck_assert_float_eq_tol(y1[i], 2.0f * y0[i], 1e-4f * (1.0f + scale[i]));
    /* backward: dX += dY W, dW += dY^T X */
    float *dx0 = emul_randn(&r, (size_t)N * in, 1.0f), *dx1 = emul_dup(dx0, (size_t)N * in);
    float *dw0 = emul_randn(&r, (size_t)out * in, 1.0f), *dw1 = emul_dup(dw0, (size_t)out * in);
    sp_linear_backward(dx0, dw0, NULL, dY, X, W, N, in, out);
    p = sp_gemm_plan_linear_dx(N, in, out);
    emul_gemm(&p, W, dY, dx1);
    p = sp_gemm_plan_linear_dw(N, in, out);
    emul_gemm(&p, X, dY, dw1);
    ASSERT_CLOSE(dx1, dx0, (size_t)N * in, 1e-5, 1e-5, "linear dX");
    ASSERT_CLOSE(dw1, dw0, (size_t)out * in, 1e-5, 1e-5, "linear dW");
    free(X), free(W), free(dY), free(y0), free(y1), free(scale), free(dx0), free(dx1), free(dw0), free(dw1);
}
END_TEST

/* CUDA's and cuBLAS's codes become sepal's statuses with the runtime's words (no GPU needed: cudart's tables). */
START_TEST(t_errors_mapped)
{
    sp_err err = {0};
    ck_assert_int_eq(sp_cuda_error(&err, 0, "x"), SP_OK);
    ck_assert_int_eq(sp_cuda_error(&err, 2, "allocate"), SP_ERR_NOMEM); /* cudaErrorMemoryAllocation */
    ck_assert_msg(strstr(err.msg, "cuda: allocate: ") == err.msg && strstr(err.msg, "cudaErrorMemoryAllocation"), "%s",
                  err.msg);
    ck_assert_int_eq(sp_cuda_error(&err, 1, "x"), SP_ERR_ARG);           /* cudaErrorInvalidValue */
    ck_assert_int_eq(sp_cuda_error(&err, 35, "x"), SP_ERR_UNSUPPORTED);  /* cudaErrorInsufficientDriver */
    ck_assert_int_eq(sp_cuda_error(&err, 100, "x"), SP_ERR_UNSUPPORTED); /* cudaErrorNoDevice */
    ck_assert_int_eq(sp_cuda_error(&err, 209, "x"), SP_ERR_UNSUPPORTED); /* cudaErrorNoKernelImageForDevice */
    ck_assert_int_eq(sp_cuda_error(&err, 700, "kernel"), SP_ERR_STATE);  /* cudaErrorIllegalAddress */
    ck_assert_msg(strstr(err.msg, "cudaErrorIllegalAddress") != NULL, "%s", err.msg);
    ck_assert_int_eq(sp_cublas_error(&err, 0, "x"), SP_OK);
    ck_assert_int_eq(sp_cublas_error(&err, 3, "gemm"), SP_ERR_NOMEM); /* CUBLAS_STATUS_ALLOC_FAILED */
    ck_assert_msg(strstr(err.msg, "cublas: gemm: ") == err.msg, "%s", err.msg);
    ck_assert_int_eq(sp_cublas_error(&err, 7, "x"), SP_ERR_ARG); /* CUBLAS_STATUS_INVALID_VALUE */
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* the device block's host-side planning (cuda/block.cu): what runs, what a cache costs, the budget, and the
 * backward's tiled product with int8 / NF4 weights */

static void block_of(sp_block *b, sp_rope *rope, const char *json)
{
    sp_config cfg;
    sp_err err = {0};
    ck_assert_msg(sp_config_parse(&cfg, json, "test", &err) == SP_OK, "%s", err.msg);
    if (cfg.blk.pos == SP_POS_ROPE)
        ck_assert_int_eq(sp_rope_init(rope, &cfg, &err), SP_OK);
    ck_assert_msg(sp_block_init(b, &cfg, rope, &err) == SP_OK, "%s", err.msg);
}

/* fp16 blocks go on the device like the others (sp_cuda_block_supported: what a server's --device checks before
 * the GPU is touched). */
START_TEST(t_f16_supported)
{
    sp_block b;
    sp_rope rope;
    sp_err err = {0};
    block_of(&b, &rope, "{\"model_type\":\"llama\",\"hidden_size\":64,\"num_attention_heads\":4,"
                        "\"num_key_value_heads\":2,\"intermediate_size\":96,\"num_hidden_layers\":1,"
                        "\"vocab_size\":64,\"rms_norm_eps\":1e-5}");
    ck_assert_msg(sp_block_quantize(&b, SP_W_F16, &err) == SP_OK, "%s", err.msg);
    ck_assert_msg(sp_cuda_block_supported(&b, &err) == SP_OK, "%s", err.msg);
    sp_block_free(&b);
}
END_TEST

/* The experts' routing (kmath_moe.h, what moe.cu's kernels run) against core's sp_moe_route_forward / _backward,
 * ties included, and the grouping by expert as block.c's counting sort makes it: slots ordered by (expert, pair),
 * and the used experts in order. */
START_TEST(t_moe_routing_vs_cpu)
{
    static const int shapes[][3] = {{5, 2, 7}, {8, 2, 9}, {4, 4, 3}, {6, 1, 5}, {16, 3, 4}, {8, 2, 1}}; /* ne, nk, nt */
    sp_rng r;
    sp_rng_seed(&r, 31);
    for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++) {
        int ne = shapes[c][0], nk = shapes[c][1], nt = shapes[c][2], npairs = nt * nk;
        float *lg = emul_randn(&r, (size_t)nt * ne, 1.0f), *dw = emul_randn(&r, (size_t)npairs, 1.0f);
        for (int n = 0; n < nt; n += 2) /* ties: the lower expert wins, as on the CPU */
            lg[n * ne + ne - 1] = lg[n * ne];
        float *w = calloc((size_t)npairs, 4), *wc = calloc((size_t)npairs, 4), *dl = calloc((size_t)nt * ne, 4);
        float *dlc = calloc((size_t)nt * ne, 4);
        int32_t *idx = calloc((size_t)npairs, 4), *idxc = calloc((size_t)npairs, 4);
        sp_moe_route_forward(wc, idxc, lg, nt, ne, nk);
        sp_moe_route_backward(dlc, dw, wc, idxc, nt, ne, nk);
        for (int n = 0; n < nt; n++) {
            sp_km_moe_route(w + n * nk, idx + n * nk, lg + n * ne, ne, nk);
            sp_km_moe_route_bwd(dl + n * ne, dw + n * nk, w + n * nk, idx + n * nk, ne, nk);
        }
        ck_assert_msg(!memcmp(idx, idxc, (size_t)npairs * 4) && !memcmp(w, wc, (size_t)npairs * 4),
                      "E %d K %d: the routing differs from the CPU's", ne, nk);
        ck_assert_msg(!memcmp(dl, dlc, (size_t)nt * ne * 4), "E %d K %d: the routing's backward differs", ne, nk);
        int *seen = calloc((size_t)npairs, sizeof *seen), prev_e = -1, prev_i = -1;
        for (int s = 0; s < npairs; s++) { /* slot s's pair: the s-th in (expert, pair) order */
            int i = -1;
            for (int j = 0; j < npairs; j++)
                i = sp_km_moe_slot(idx, npairs, j) == s ? j : i;
            ck_assert_msg(i >= 0 && !seen[i]++, "E %d K %d: slot %d has no pair of its own", ne, nk, s);
            ck_assert_msg(idx[i] > prev_e || (idx[i] == prev_e && i > prev_i), "E %d K %d: slot %d out of order", ne,
                          nk, s);
            ck_assert_int_ge(s, sp_km_moe_first(idx, npairs, idx[i]));
            ck_assert_int_lt(s, sp_km_moe_first(idx, npairs, idx[i] + 1));
            prev_e = idx[i], prev_i = i;
        }
        ck_assert_int_eq(sp_km_moe_first(idx, npairs, 0), 0);
        ck_assert_int_eq(sp_km_moe_first(idx, npairs, ne), npairs);
        /* the experts with slots in order (a decode step's blocks of products: at most min(E, NK) of them), then -1 */
        int g = 0;
        for (int e = 0; e < ne; e++)
            if (sp_km_moe_first(idx, npairs, e + 1) > sp_km_moe_first(idx, npairs, e))
                ck_assert_msg(sp_km_moe_used(idx, npairs, ne, g++) == e, "E %d K %d: used expert %d is not %d", ne, nk,
                              g - 1, e);
        ck_assert_int_le(g, npairs < ne ? npairs : ne);
        for (; g <= ne; g++)
            ck_assert_int_eq(sp_km_moe_used(idx, npairs, ne, g), -1);
        for (int n = 0; n < nt; n++) /* a token's choices come in expert order */
            for (int j = 0, after = -1; j < nk; j++) {
                int k = sp_km_moe_next(idx + n * nk, nk, after);
                ck_assert_msg(k >= 0 && idx[n * nk + k] > after, "token %d: choice %d of %d out of order", n, j, nk);
                after = idx[n * nk + k];
            }
        free(lg), free(dw), free(w), free(wc), free(dl), free(dlc), free(idx), free(idxc), free(seen);
    }
}
END_TEST

START_TEST(t_block_plan)
{
    static const char *dense[] = {
        "{\"model_type\":\"llama\",\"hidden_size\":108,\"num_attention_heads\":6,\"num_key_value_heads\":2,"
        "\"intermediate_size\":170,\"num_hidden_layers\":1,\"vocab_size\":64,\"rms_norm_eps\":1e-5}",
        "{\"model_type\":\"bloom\",\"hidden_size\":84,\"n_head\":7,\"num_hidden_layers\":1,\"vocab_size\":64,"
        "\"layer_norm_epsilon\":1e-5}",
        "{\"model_type\":\"falcon\",\"multi_query\":true,\"parallel_attn\":true,\"hidden_size\":88,"
        "\"num_attention_heads\":4,\"num_hidden_layers\":1,\"vocab_size\":64}",
    };
    sp_block b;
    sp_rope rope;
    sp_err err = {0};
    for (int i = 0; i < 3; i++) {
        block_of(&b, &rope, dense[i]);
        ck_assert_msg(sp_cuda_block_supported(&b, &err) == SP_OK, "%s", err.msg);
        /* a cache: its keys and values, and more (the decode step's buffers), growing with rows and length */
        size_t kv = 2 * (size_t)3 * 40 * b.nkv * b.hd * sizeof(float), n = sp_cuda_kv_bytes(&b, 3, 40);
        ck_assert_uint_gt(n, kv);
        ck_assert_uint_lt(n, 3 * kv + (size_t)3 * 20 * (b.H + b.FF) * sizeof(float));
        ck_assert_uint_lt(n, sp_cuda_kv_bytes(&b, 3, 41));
        ck_assert_uint_lt(n, sp_cuda_kv_bytes(&b, 4, 40));
        sp_block_free(&b);
    }
    block_of(&b, &rope, "{\"model_type\":\"mixtral\",\"hidden_size\":64,\"num_attention_heads\":4,"
                        "\"num_key_value_heads\":2,\"intermediate_size\":96,\"num_local_experts\":4,"
                        "\"num_experts_per_tok\":2,\"num_hidden_layers\":1,\"vocab_size\":64,"
                        "\"rms_norm_eps\":1e-5}");
    ck_assert_msg(sp_cuda_block_supported(&b, &err) == SP_OK, "%s", err.msg);
    /* a cache of 3 rows also holds its decode step's experts: 6 slots of gate, up and SwiGLU rows */
    sp_moe_dims md = sp_cuda_moe_dims(&b);
    ck_assert_int_eq(md.experts, 4);
    ck_assert_int_eq(md.topk, 2);
    ck_assert_int_eq(md.FF, 96);
    size_t slots = sp_cuda_moe_acts_bytes(&md, 3);
    ck_assert_uint_ge(slots, (size_t)6 * (3 * 96 + 2 * 64) * sizeof(float));
    ck_assert_uint_gt(sp_cuda_kv_bytes(&b, 3, 40), slots + 2 * (size_t)3 * 40 * b.nkv * b.hd * sizeof(float));
    ck_assert_uint_ge(sp_cuda_moe_grads_bytes(&md, 3), (size_t)6 * (3 * 96 + 2 * 64) * sizeof(float));
    sp_block_free(&b);
    /* the budget: what fits is charged, what does not is refused with nothing charged; giving back frees it */
    sp_cuda_budget bu = {.limit = 1000000};
    ck_assert_int_eq(sp_cuda_budget_take(&bu, 600000, &err), SP_OK);
    ck_assert_int_eq(sp_cuda_budget_take(&bu, 400001, &err), SP_ERR_NOMEM);
    ck_assert_str_eq(err.msg, "kv cache: 0.4 MB more would exceed the budget (0.6 of 1.0 MB held)");
    ck_assert_int_eq(sp_cuda_budget_take(&bu, (size_t)-1, &err), SP_ERR_NOMEM); /* no wrap-around */
    ck_assert_uint_eq(bu.used, 600000);
    ck_assert_int_eq(sp_cuda_budget_take(&bu, 400000, &err), SP_OK);
    ck_assert_uint_eq(bu.used, 1000000);
    sp_cuda_budget_give(&bu, 600000);
    ck_assert_uint_eq(bu.used, 400000);
    ck_assert_int_eq(sp_cuda_budget_take(NULL, (size_t)-1, &err), SP_OK); /* no budget: anything */
}
END_TEST

/* dX += dY W through tiles of decoded rows (the plans block.cu runs on cuBLAS) equals sp_linear_backward's. */
START_TEST(t_block_dx_tiles_vs_cpu)
{
    int N = 5, in = 37, out = 103, tiles[] = {1, 7, 40, 103};
    sp_rng r;
    sp_rng_seed(&r, 77);
    float *W = emul_randn(&r, (size_t)out * in, 1.0f), *dY = emul_randn(&r, (size_t)N * out, 1.0f);
    float *dX0 = emul_randn(&r, (size_t)N * in, 1.0f), *want = emul_dup(dX0, (size_t)N * in);
    sp_linear_backward(want, NULL, NULL, dY, NULL, W, N, in, out);
    for (int k = 0; k < 4; k++) {
        float *dX = emul_dup(dX0, (size_t)N * in);
        for (int r0 = 0; r0 < out; r0 += tiles[k]) {
            int tr = out - r0 < tiles[k] ? out - r0 : tiles[k];
            sp_gemm_plan p = sp_cuda_plan_dx_tile(N, in, out, tr);
            emul_gemm(&p, W + (size_t)r0 * in, dY + r0, dX);
        }
        ASSERT_CLOSE(dX, want, (size_t)N * in, 1e-5, 1e-5, "tiled dX");
        free(dX);
    }
    free(W), free(dY), free(dX0), free(want);
}
END_TEST

/* Without a GPU, opening the device is an error that says why (no abort); with one, a missing index is. */
START_TEST(t_open_device)
{
    char why[256];
    sp_err err = {0};
    sp_cuda *cu = NULL;
    int n = sp_cuda_device_count(why, sizeof why);
    if (n <= 0) {
        ck_assert_int_eq(sp_cuda_open(&cu, 0, &err), SP_ERR_UNSUPPORTED);
        ck_assert_ptr_null(cu);
        ck_assert_msg(strstr(err.msg, "cuda: no usable GPU (") == err.msg, "%s", err.msg);
        printf("test_cuda_host: %s\n", err.msg);
        return;
    }
    ck_assert_int_eq(sp_cuda_open(&cu, n, &err), SP_ERR_ARG);
    ck_assert_ptr_null(cu);
    ck_assert_msg(strstr(err.msg, "no device") != NULL, "%s", err.msg);
    ck_assert_int_eq(sp_cuda_open(&cu, 0, &err), SP_OK);
    sp_cuda_close(cu);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cuda_host");
    TCase *tc = tcase_create("kernel_math_vs_cpu");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, t_row_threads_and_trees);
    tcase_add_test(tc, t_rmsnorm_vs_cpu);
    tcase_add_test(tc, t_layernorm_vs_cpu);
    tcase_add_test(tc, t_rope_vs_cpu);
    tcase_add_test(tc, t_attn_prefill_vs_cpu);
    tcase_add_test(tc, t_attn_backward_vs_cpu);
    tcase_add_test(tc, t_attn_decode_vs_cpu);
    tcase_add_test(tc, t_activations_vs_cpu);
    tcase_add_test(tc, t_embedding_vs_cpu);
    tcase_add_test(tc, t_softmax_crossentropy_vs_cpu);
    tcase_add_test(tc, t_f16_all_values);
    tcase_add_test(tc, t_weights_vs_cpu);
    tcase_add_test(tc, t_wmat_vec_vs_cpu);
    tcase_add_test(tc, t_wmat_gemm_plans_vs_cpu);
    tcase_add_test(tc, t_gemm_plans_vs_cpu);
    tcase_add_test(tc, t_block_dx_tiles_vs_cpu);
    tcase_add_test(tc, t_block_plan);
    tcase_add_test(tc, t_moe_routing_vs_cpu);
    tcase_add_test(tc, t_f16_supported);
    suite_add_tcase(s, tc);
    TCase *te = tcase_create("errors");
    tcase_add_test(te, t_errors_mapped);
    tcase_add_test(te, t_open_device);
    suite_add_tcase(s, te);
    return sp_test_run(s);
}
