/* test_cuda.c - the CUDA kernels on a GPU against their CPU references (core/ops, core/kern, client/train/optim).
 * Without a GPU the whole suite reports itself skipped (exit 77 for ctest) instead of passing silently; the kernels'
 * arithmetic is still checked on the host by test_cuda_host. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"
#include "cuda_emul.h"
#include "flash.h"
#include "fused.h"
#include "gemm.h"
#include "half.h"
#include "kernels.h"
#include "ops.h"
#include "optim.h"
#include "optim_cuda.h"
#include "rng.h"
#include "rope.h"
#include "testrun.h"

/* ---------------------------------------------------------------------------------------------- */
/* the block's kernels (cuda/kernels.cu, weights.cu, attn.cu, gemm.cu) against core's CPU references. The
 * tolerances are test_cuda_host's (where the same arithmetic runs on the host against the same references) times
 * 4: the device's expf / erff / cosf (2 ulp where glibc is within 1) and nvcc's FMA contraction. */

static sp_cuda *cu; /* opened by main */

static void *up_bytes(const void *h, size_t bytes)
{
    void *d = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_cuda_dup(cu, &d, h, bytes, &err) == SP_OK, "%s", err.msg);
    return d;
}

static float *up(const float *h, size_t n) { return up_bytes(h, n * sizeof(float)); }

/* A host copy of n device floats (after the stream's work: a kernel's fault fails the test here). */
static float *down(const float *d, size_t n)
{
    float *h = malloc((n ? n : 1) * sizeof(float));
    sp_err err = {0};
    ck_assert_msg(sp_cuda_sync(cu, &err) == SP_OK, "%s", err.msg);
    ck_assert_msg(sp_cuda_download(cu, h, d, n * sizeof(float), &err) == SP_OK, "%s", err.msg);
    return h;
}


#define CLOSE(a, b, n, abs_tol, rel_tol, what)                                                                 \
    do {                                                                                                       \
        double x_ = emul_err((a), (b), (n), 4 * (abs_tol), 4 * (rel_tol));                                     \
        ck_assert_msg(x_ <= 1.0, "%s: error %.3g of the tolerance", (what), x_);                               \
    } while (0)

static const int odd_C[] = {1, 7, 33, 257, 1000, 4097};

START_TEST(t_norms_gpu)
{
    sp_rng r;
    sp_rng_seed(&r, 41);
    for (int k = 0; k < 6; k++) {
        int N = 5 + k, C = odd_C[k];
        size_t n = (size_t)N * C;
        float *x = emul_randn(&r, n, 2.0f), *w = emul_randn(&r, (size_t)C, 1.0f), *b = emul_randn(&r, (size_t)C, 1.0f);
        float *dy = emul_randn(&r, n, 1.0f), *y0 = malloc(n * 4), *m0 = malloc((size_t)N * 4), *r0 = malloc((size_t)N * 4);
        float *dx0 = emul_randn(&r, n, 1.0f), *dw0 = emul_randn(&r, (size_t)C, 1.0f), *db0 = emul_randn(&r, (size_t)C, 1.0f);
        float *dx = up(dx0, n), *dw = up(dw0, (size_t)C), *db = up(db0, (size_t)C);
        float *dX = up(x, n), *dW = up(w, (size_t)C), *dB = up(b, (size_t)C), *dDY = up(dy, n), *dY = up(x, n);
        float *dM = up(m0, (size_t)N), *dR = up(r0, (size_t)N);
        /* RMSNorm (tolerances: test_cuda_host t_rmsnorm_vs_cpu) */
        sp_rmsnorm_forward(y0, r0, x, w, N, C, 1e-5f);
        OK(sp_cuda_rmsnorm_fwd(cu, dY, dR, dX, dW, N, C, 1e-5f, E));
        float *y1 = down(dY, n), *r1 = down(dR, (size_t)N);
        CLOSE(y1, y0, n, 1e-6, 1e-5, "rmsnorm forward");
        CLOSE(r1, r0, (size_t)N, 0, 1e-5, "rmsnorm rstd");
        sp_rmsnorm_backward(dx0, dw0, dy, x, w, r0, N, C);
        OK(sp_cuda_rmsnorm_bwd(cu, dx, dw, dDY, dX, dW, dR, N, C, E));
        float *dx1 = down(dx, n), *dw1 = down(dw, (size_t)C);
        CLOSE(dx1, dx0, n, 1e-5, 1e-5, "rmsnorm dinp");
        CLOSE(dw1, dw0, (size_t)C, 1e-5, 1e-5, "rmsnorm dw");
        free(y1), free(r1), free(dx1), free(dw1);
        /* LayerNorm, affine (t_layernorm_vs_cpu) */
        sp_layernorm_forward(y0, m0, r0, x, w, b, N, C, 1e-5f);
        OK(sp_cuda_layernorm_fwd(cu, dY, dM, dR, dX, dW, dB, N, C, 1e-5f, E));
        y1 = down(dY, n);
        float *m1 = down(dM, (size_t)N);
        CLOSE(y1, y0, n, 1e-5, 1e-5, "layernorm forward");
        CLOSE(m1, m0, (size_t)N, 1e-6, 1e-5, "layernorm mean");
        dx1 = down(dx, n), dw1 = down(dw, (size_t)C);
        float *db1 = down(db, (size_t)C);
        memcpy(dx0, dx1, n * 4), memcpy(dw0, dw1, (size_t)C * 4), memcpy(db0, db1, (size_t)C * 4);
        sp_layernorm_backward(dx0, dw0, db0, dy, x, w, m0, r0, N, C);
        OK(sp_cuda_layernorm_bwd(cu, dx, dw, db, dDY, dX, dW, dM, dR, N, C, E));
        free(dx1), free(dw1), free(db1);
        dx1 = down(dx, n), dw1 = down(dw, (size_t)C), db1 = down(db, (size_t)C);
        CLOSE(dx1, dx0, n, 1e-5, 1e-5, "layernorm dinp");
        CLOSE(dw1, dw0, (size_t)C, 1e-5, 1e-5, "layernorm dw");
        CLOSE(db1, db0, (size_t)C, 1e-5, 1e-5, "layernorm db");
        /* in place, no affine parameters */
        sp_layernorm_forward(y0, m0, r0, x, NULL, NULL, N, C, 1e-5f);
        OK(sp_cuda_layernorm_fwd(cu, dX, dM, dR, dX, NULL, NULL, N, C, 1e-5f, E));
        free(y1);
        y1 = down(dX, n);
        CLOSE(y1, y0, n, 1e-5, 1e-5, "layernorm in place");
        free(x), free(w), free(b), free(dy), free(y0), free(m0), free(r0), free(dx0), free(dw0), free(db0);
        free(y1), free(m1), free(dx1), free(dw1), free(db1);
        void *bufs[] = {dx, dw, db, dX, dW, dB, dDY, dY, dM, dR};
        for (int i = 0; i < 10; i++)
            sp_cuda_free(cu, bufs[i]);
    }
}
END_TEST

START_TEST(t_rope_gpu)
{
    sp_config cfg = {.head_dim = 128, .rope_theta = 500000.0, .rope_type = SP_ROPE_LLAMA3, .rope_factor = 8.0,
                     .rope_low_freq_factor = 1.0, .rope_high_freq_factor = 4.0, .rope_orig_max_pos = 8192};
    sp_rope rope;
    ck_assert_int_eq(sp_rope_init(&rope, &cfg, NULL), SP_OK);
    int B = 2, T = 5, nh = 3, hd = 128, half = 64, pos0 = 8190;
    size_t n = (size_t)B * T * nh * hd;
    sp_rng r;
    sp_rng_seed(&r, 42);
    float *cs = malloc((size_t)T * half * 4), *sn = malloc((size_t)T * half * 4);
    sp_rope_tables(&rope, pos0, T, cs, sn);
    float *x = emul_randn(&r, n, 1.0f), *y0 = malloc(n * 4), *d0 = emul_randn(&r, n, 1.0f);
    float *dX = up(x, n), *dD = up(d0, n), *dF = up(rope.inv_freq, (size_t)half);
    sp_rope_forward(y0, x, cs, sn, B, T, nh, hd);
    sp_rope_backward(d0, x, cs, sn, B, T, nh, hd);
    OK(sp_cuda_rope_bwd(cu, dD, dX, dF, pos0, B, T, nh, hd, E));
    OK(sp_cuda_rope_fwd(cu, dX, dX, dF, pos0, B, T, nh, hd, E)); /* in place */
    float *y1 = down(dX, n), *d1 = down(dD, n);
    CLOSE(y1, y0, n, 1e-6, 1e-6, "rope forward"); /* t_rope_vs_cpu */
    CLOSE(d1, d0, n, 1e-6, 1e-6, "rope backward");
    sp_err err = {0};
    ck_assert_int_eq(sp_cuda_rope_fwd(cu, dX, dX, dF, 0, B, T, nh, 7, &err), SP_ERR_ARG); /* odd head dim */
    free(cs), free(sn), free(x), free(y0), free(d0), free(y1), free(d1);
    sp_cuda_free(cu, dX), sp_cuda_free(cu, dD), sp_cuda_free(cu, dF);
}
END_TEST

/* ALiBi added to prefill scores on the device equals the host emulation, which t_attn_prefill_vs_cpu checks
 * against sp_attention_forward; exact (one product and one sum an element). */
START_TEST(t_alibi_gpu)
{
    int B = 2, nh = 6, T = 5, past = 3, S = past + T;
    size_t n = (size_t)B * nh * T * S;
    float slopes[6];
    sp_alibi_slopes(slopes, nh);
    sp_rng r;
    sp_rng_seed(&r, 43);
    float *p0 = emul_randn(&r, n, 1.0f), *dP = up(p0, n), *dS = up(slopes, 6);
    emul_alibi_add(p0, slopes, B, nh, T, S, past);
    OK(sp_cuda_alibi_add(cu, dP, dS, B, nh, T, S, past, E));
    float *p1 = down(dP, n);
    ck_assert_mem_eq(p1, p0, n * 4);
    free(p0), free(p1), sp_cuda_free(cu, dP), sp_cuda_free(cu, dS);
}
END_TEST

START_TEST(t_activations_gpu)
{
    size_t n = 1000003; /* more than one grid's worth of elements per thread is not needed, an odd tail is */
    sp_rng r;
    sp_rng_seed(&r, 44);
    float *x = emul_randn(&r, n, 4.0f), *u = emul_randn(&r, n, 1.0f), *dy = emul_randn(&r, n, 1.0f);
    float *y0 = malloc(n * 4), *a0 = emul_randn(&r, n, 1.0f), *b0 = emul_randn(&r, n, 1.0f);
    float *dX = up(x, n), *dU = up(u, n), *dDY = up(dy, n), *dY = up(y0, n), *dA = up(a0, n), *dB = up(b0, n);
    sp_swiglu_forward(y0, x, u, (long)n);
    OK(sp_cuda_swiglu_fwd(cu, dY, dX, dU, (long)n, E));
    float *y1 = down(dY, n);
    CLOSE(y1, y0, n, 1e-30, 5e-7, "swiglu"); /* t_activations_vs_cpu */
    free(y1);
    sp_swiglu_backward(a0, b0, dy, x, u, (long)n);
    OK(sp_cuda_swiglu_bwd(cu, dA, dB, dDY, dX, dU, (long)n, E));
    float *a1 = down(dA, n), *b1 = down(dB, n);
    CLOSE(a1, a0, n, 1e-6, 1e-6, "swiglu dgate");
    CLOSE(b1, b0, n, 1e-6, 1e-6, "swiglu dup");
    free(a1), free(b1);
    for (int tanh_approx = 0; tanh_approx < 2; tanh_approx++) {
        (tanh_approx ? sp_gelu_tanh_forward : sp_gelu_forward)(y0, x, (long)n);
        OK(sp_cuda_gelu_fwd(cu, dY, dX, (long)n, tanh_approx, E));
        y1 = down(dY, n);
        CLOSE(y1, y0, n, 1e-6, 1e-6, tanh_approx ? "gelu_tanh" : "gelu");
        free(y1);
        (tanh_approx ? sp_gelu_tanh_backward : sp_gelu_backward)(a0, dy, x, (long)n);
        OK(sp_cuda_gelu_bwd(cu, dA, dDY, dX, (long)n, tanh_approx, E));
        a1 = down(dA, n);
        CLOSE(a1, a0, n, 1e-6, 1e-6, tanh_approx ? "gelu_tanh backward" : "gelu backward");
        free(a1);
    }
    free(x), free(u), free(dy), free(y0), free(a0), free(b0);
    void *bufs[] = {dX, dU, dDY, dY, dA, dB};
    for (int i = 0; i < 6; i++)
        sp_cuda_free(cu, bufs[i]);
}
END_TEST

START_TEST(t_embedding_crossentropy_gpu)
{
    int V = 32000, N = 4, C = 33;
    sp_rng r;
    sp_rng_seed(&r, 45);
    float *table = emul_randn(&r, (size_t)V * C, 1.0f), *e0 = malloc((size_t)N * C * 4);
    int32_t ids[4] = {0, V - 1, 17, 17}, tg[4] = {3, V - 1, -1, 100};
    float *dT = up(table, (size_t)V * C), *dE = up(e0, (size_t)N * C);
    int32_t *dI = up_bytes(ids, sizeof ids), *dG = up_bytes(tg, sizeof tg);
    sp_embedding_forward(e0, ids, table, N, C);
    OK(sp_cuda_embedding_fwd(cu, dE, dI, dT, V, N, C, E));
    float *e1 = down(dE, (size_t)N * C);
    ck_assert_mem_eq(e1, e0, (size_t)N * C * 4); /* a copy */
    /* softmax and cross-entropy over the vocabulary (t_softmax_crossentropy_vs_cpu) */
    size_t n = (size_t)N * V;
    float *x = emul_randn(&r, n, 3.0f), *s0 = malloc(n * 4), *d0 = emul_randn(&r, n, 1.0f);
    float dl[4] = {0.25f, 1.0f, 3.0f, -0.5f}, l0[4];
    double rel = 5e-7 * sqrt((double)V) + 1e-6; /* t_softmax_crossentropy_vs_cpu's */
    float *dX = up(x, n), *dS = up(s0, n), *dD = up(d0, n), *dL = up(l0, 4), *dDL = up(dl, 4);
    sp_softmax_forward(s0, x, N, V);
    OK(sp_cuda_softmax_fwd(cu, dS, dX, N, V, E));
    float *s1 = down(dS, n);
    CLOSE(s1, s0, n, 1e-9, rel, "softmax");
    sp_crossentropy_forward(l0, x, tg, N, V);
    OK(sp_cuda_crossentropy_fwd(cu, dL, dX, dG, N, V, E));
    float *l1 = down(dL, 4);
    CLOSE(l1, l0, 4, 1e-5, rel, "cross-entropy");
    sp_crossentropy_backward(d0, dl, x, tg, N, V);
    OK(sp_cuda_crossentropy_bwd(cu, dD, dDL, dX, dG, N, V, E));
    float *d1 = down(dD, n);
    CLOSE(d1, d0, n, 1e-6, rel, "cross-entropy backward");
    /* ids and targets outside the vocabulary are errors, and the context stays usable */
    sp_err err = {0};
    ids[2] = V;
    sp_cuda_upload(cu, dI, ids, sizeof ids, &err);
    ck_assert_int_eq(sp_cuda_embedding_fwd(cu, dE, dI, dT, V, N, C, &err), SP_ERR_ARG);
    ck_assert_msg(strstr(err.msg, "outside the vocabulary") != NULL, "%s", err.msg);
    tg[0] = V;
    sp_cuda_upload(cu, dG, tg, sizeof tg, &err);
    ck_assert_int_eq(sp_cuda_crossentropy_fwd(cu, dL, dX, dG, N, V, &err), SP_ERR_ARG);
    OK(sp_cuda_softmax_fwd(cu, dS, dX, N, V, E));
    OK(sp_cuda_sync(cu, E));
    free(table), free(e0), free(e1), free(x), free(s0), free(d0), free(s1), free(l1), free(d1);
    void *bufs[] = {dT, dE, dI, dG, dX, dS, dD, dL, dDL};
    for (int i = 0; i < 9; i++)
        sp_cuda_free(cu, bufs[i]);
}
END_TEST

/* Y = X W^T in double from the decoded matrix dec [rows, C]: y0, and tol = sum |w x| times rel (1e-5: f32
 * accumulation of C terms; emul_gemm_tol(bf16): bf16 operands). */
static void wmat_ref(const float *dec, const float *x, float *y0, float *tol, int B, int rows, int C, double rel)
{
    for (int b = 0; b < B; b++)
        for (int i = 0; i < rows; i++) {
            double s = 0, a = 0;
            for (int c = 0; c < C; c++) {
                double p = (double)dec[(size_t)i * C + c] * x[(size_t)b * C + c];
                s += p, a += fabs(p);
            }
            y0[(size_t)b * rows + i] = (float)s;
            tol[(size_t)b * rows + i] = (float)(a * rel + 1e-30);
        }
}

/* The device's Y = X W^T against wmat_ref's within tol. */
static void wmat_check(sp_cuda_wmat *dw, const float *x, const float *y0, const float *tol, int B, const char *what)
{
    int rows = dw->w.rows, C = dw->w.cols;
    float *dXb = up(x, (size_t)B * C), *dYb = NULL;
    OK(sp_cuda_alloc(cu, (void **)&dYb, (size_t)B * rows * 4, E));
    OK(sp_cuda_wmat_mul(cu, dw, dXb, dYb, B, E));
    float *y1 = down(dYb, (size_t)B * rows);
    for (size_t i = 0; i < (size_t)B * rows; i++)
        ck_assert_msg(fabs((double)y1[i] - y0[i]) <= tol[i], "%s %s [%d, %d] B %d at %zu: %g vs %g", what,
                      sp_wtype_name((sp_wtype)dw->w.type), rows, C, B, i, (double)y1[i], (double)y0[i]);
    free(y1), sp_cuda_free(cu, dXb), sp_cuda_free(cu, dYb);
}

/* Whether the product of B rows runs in 16-bit GEMMs (kernels.h): B > 8, except f32 weights and int8 / NF4 up to
 * 32; fp16 weights' in fp16 (x rounded to fp16), the others' in bf16. */
static int wmat_bf16_path(sp_wtype t, int B)
{
    return B > 8 && t != SP_W_F32 && !((t == SP_W_Q8 || t == SP_W_NF4) && B <= 32);
}

static double wmat_gemm_tol(sp_wtype t) { return emul_gemm_tol(t == SP_W_F16 ? SP_CU_F16 : SP_CU_BF16); }

/* Every encoding uploaded, decoded (bit for bit sp_qmat_row's values, and those rounded to bf16) and multiplied:
 * B <= 8 by the fused decode kernel (the one-weight-a-thread kernel for widths of odd chunks; on 1001 x 1088 every
 * rows-a-warp and warps-a-row shape), B > 8 by GEMMs (tiles of 100 rows); against the decoded matrix times x in
 * double, within f32 rounding of sum |w x| (bf16 GEMMs: emul_gemm_tol(bf16) of it). */
START_TEST(t_weights_gpu)
{
    const int shapes[][2] = {{17, 33}, {300, 130}, {37, 192}, {1001, 1088}, {4096, 4096}};
    const int Bs[] = {1, 3, 8, 9, 33, 64}, big_Bs[] = {1, 8, 33};
    sp_rng r;
    sp_rng_seed(&r, 46);
    sp_cuda_wmat_tune(0, 0, 100);
    for (int t = 0; t < SP_W__COUNT; t++)
        for (int k = 0; k < 5; k++) {
            int rows = shapes[k][0], C = shapes[k][1];
            float *w = emul_randn(&r, (size_t)rows * C, 0.05f);
            sp_qmat m;
            ck_assert_int_eq(sp_qmat_encode(&m, (sp_wtype)t, w, rows, C, NULL), SP_OK);
            sp_cuda_wmat dw;
            OK(sp_cuda_wmat_upload(cu, &dw, &m, E));
            size_t n = (size_t)rows * C;
            float *dec = malloc(n * 4), *dDec = NULL;
            for (int i = 0; i < rows; i++)
                sp_qmat_row(&m, i, dec + (size_t)i * C);
            OK(sp_cuda_alloc(cu, (void **)&dDec, n * 4, E));
            OK(sp_cuda_dequant(cu, dDec, &dw, 0, rows, E));
            float *dec1 = down(dDec, n);
            ck_assert_mem_eq(dec1, dec, n * 4);
            OK(sp_cuda_dequant_bf16(cu, dDec, &dw, 0, rows, E));
            uint16_t *h1 = (uint16_t *)down(dDec, (n + 1) / 2);
            for (size_t i = 0; i < n; i++)
                ck_assert_msg(h1[i] == sp_f32_to_bf16(dec[i]), "%s bf16 decode at %zu", sp_wtype_name(m.type), i);
            free(h1);
            for (int j = 0; j < (k == 4 ? 3 : 6); j++) { /* 4096 x 4096: the reference in double costs */
                int B = k == 4 ? big_Bs[j] : Bs[j];
                double rel = wmat_bf16_path(m.type, B) ? wmat_gemm_tol(m.type) : 1e-5;
                float *x = emul_randn(&r, (size_t)B * C, 1.0f), *y0 = malloc((size_t)B * rows * 4);
                float *tol = malloc((size_t)B * rows * 4);
                wmat_ref(dec, x, y0, tol, B, rows, C, rel);
                wmat_check(&dw, x, y0, tol, B, "auto");
                for (int v = 0; k == 3 && B <= 8 && v < 9; v++) {
                    sp_cuda_wmat_tune(1 << (v / 3), 1 << (v % 3), 100);
                    wmat_check(&dw, x, y0, tol, B, "tuned");
                }
                sp_cuda_wmat_tune(0, 0, 100);
                free(x), free(y0), free(tol);
            }
            free(w), free(dec), free(dec1), sp_cuda_free(cu, dDec);
            sp_cuda_wmat_free(cu, &dw);
            sp_qmat_free(&m);
        }
    sp_cuda_wmat_tune(0, 0, 0);
}
END_TEST

/* Device buffers a and b [n] hold the same bits. */
static void same_bits(const float *a, const float *b, size_t n, const char *what, sp_wtype t, int rows, int C, int B)
{
    float *ha = down(a, n), *hb = down(b, n);
    size_t i = 0;
    while (i < n && memcmp(&ha[i], &hb[i], sizeof *ha) == 0)
        i++;
    ck_assert_msg(i == n, "%s %s [%d, %d] B %d at %zu: %.9g vs %.9g", what, sp_wtype_name(t), rows, C, B, i,
                  i < n ? (double)ha[i] : 0.0, i < n ? (double)hb[i] : 0.0);
    free(ha), free(hb);
}

/* A random [rows, C] matrix encoded in t, on the device. */
static void wmat_random(sp_cuda_wmat *dw, sp_rng *r, sp_wtype t, int rows, int C)
{
    float *w = emul_randn(r, (size_t)rows * C, 0.05f);
    sp_qmat m;
    ck_assert_int_eq(sp_qmat_encode(&m, t, w, rows, C, NULL), SP_OK);
    OK(sp_cuda_wmat_upload(cu, dw, &m, E));
    sp_qmat_free(&m);
    free(w);
}

/* One B and launch mode of t_weights_fused_gpu: the three fused forms against the plain products (dP: their
 * outputs) and kernels. */
static void fused_check(sp_cuda_wmat *dw, const int *hs, const float *dX, float *const *dP, float *const *dF,
                        const float *dBias, const float *dRes, int B, int pdl, sp_wtype t)
{
    int rows = hs[0], C = dw[0].w.cols;
    for (int i = 0; i < 3; i++)
        OK(sp_cuda_wmat_mul(cu, &dw[i], dX, dP[i], B, E));
    sp_cuda_dmul qkv = {{&dw[0], &dw[1], &dw[2]}, {dF[0], dF[1], dF[2]}, 3, 0, pdl, NULL, NULL, NULL, 0};
    OK(sp_cuda_wmat_mul_fused(cu, &qkv, dX, B, E));
    for (int i = 0; i < 3; i++)
        same_bits(dF[i], dP[i], (size_t)B * hs[i], "three segments", t, hs[i], C, B);
    sp_cuda_dmul gu = {{&dw[0], &dw[1]}, {dF[0]}, 2, 1, pdl, NULL, NULL, NULL, 0};
    OK(sp_cuda_wmat_mul_fused(cu, &gu, dX, B, E));
    OK(sp_cuda_swiglu_fwd(cu, dP[2], dP[0], dP[1], (long)B * rows, E));
    same_bits(dF[0], dP[2], (size_t)B * rows, "swiglu", t, rows, C, B);
    /* the decode step's positions advanced by the product (B of them, from 7 + b) */
    int pos0[8], *dPos = NULL, got[8];
    for (int b = 0; b < B; b++)
        pos0[b] = 7 + b;
    dPos = (int *)up_bytes(pos0, (size_t)B * sizeof(int));
    sp_cuda_dmul br = {{&dw[0]}, {dF[0]}, 1, 0, pdl, dBias, dRes, dPos, B};
    OK(sp_cuda_wmat_mul_fused(cu, &br, dX, B, E));
    OK(sp_cuda_sync(cu, E));
    OK(sp_cuda_download(cu, got, dPos, (size_t)B * sizeof(int), E));
    for (int b = 0; b < B; b++)
        ck_assert_msg(got[b] == pos0[b] + 1, "%s: position %d is %d after the product, not %d", sp_wtype_name(t), b,
                      got[b], pos0[b] + 1);
    sp_cuda_free(cu, dPos);
    float *y = down(dP[0], (size_t)B * rows), *bias = down(dBias, (size_t)rows), *res = down(dRes, (size_t)B * rows);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < rows; i++)
            y[(size_t)b * rows + i] = (y[(size_t)b * rows + i] + bias[i]) + res[(size_t)b * rows + i];
    float *dY = up(y, (size_t)B * rows);
    same_bits(dF[0], dY, (size_t)B * rows, "bias and residual", t, rows, C, B);
    free(y), free(bias), free(res), sp_cuda_free(cu, dY);
}

/* The decode step's fused products (sp_cuda_wmat_mul_fused) against the plain ones, which t_weights_gpu checks
 * against the CPU's: three matrices of two heights in one launch (against each alone), SwiGLU's gate and up
 * (against the two products and sp_cuda_swiglu_fwd), a bias and a residual (against the product plus them in
 * block.c's order on the host): the same bits, in every encoding, at odd widths and widths of whole chunks, 1, 3
 * and 8 rows, plain and dependent launches, on 1001 x 1088 every rows-a-warp and warps-a-row shape; int8 and NF4
 * products of one row with sp_cuda_wmat_tune_light 1 and 0 (the same bits at every shape); and what it refuses. */
START_TEST(t_weights_fused_gpu)
{
    const int shapes[][2] = {{17, 33}, {300, 128}, {1001, 1088}}, Bs[] = {1, 3, 8};
    sp_rng r;
    sp_rng_seed(&r, 52);
    for (int t = 0; t < SP_W__COUNT; t++)
        for (int k = 0; k < 3; k++) {
            int rows = shapes[k][0], C = shapes[k][1], hs[3] = {rows, rows, rows / 3 + 2};
            sp_cuda_wmat dw[3];
            float *dP[3], *dF[3];
            for (int i = 0; i < 3; i++) {
                wmat_random(&dw[i], &r, (sp_wtype)t, hs[i], C);
                OK(sp_cuda_alloc(cu, (void **)&dP[i], (size_t)8 * rows * 4, E));
                OK(sp_cuda_alloc(cu, (void **)&dF[i], (size_t)8 * rows * 4, E));
            }
            float *x = emul_randn(&r, (size_t)8 * C, 1.0f), *bias = emul_randn(&r, (size_t)rows, 1.0f);
            float *res = emul_randn(&r, (size_t)8 * rows, 1.0f);
            float *dX = up(x, (size_t)8 * C), *dBias = up(bias, (size_t)rows), *dRes = up(res, (size_t)8 * rows);
            for (int j = 0; j < 3; j++)
                for (int v = 0; v < (k == 2 ? 10 : 1); v++) {
                    if (v)
                        sp_cuda_wmat_tune(1 << ((v - 1) / 3), 1 << ((v - 1) % 3), 0);
                    for (int pdl = 0; pdl < 2; pdl++)
                        fused_check(dw, hs, dX, dP, dF, dBias, dRes, Bs[j], pdl, (sp_wtype)t);
                    sp_cuda_wmat_tune(0, 0, 0);
                }
            /* int8 and NF4 with one row of X: each row's values decoded as the product takes them (the default) or
             * all of a chunk's first (sp_cuda_wmat_tune_light 0), at every rows-a-warp and warps-a-row shape */
            for (int v = 0; (t == SP_W_Q8 || t == SP_W_NF4) && v < 9; v++) {
                sp_cuda_wmat_tune(1 << (v / 3), 1 << (v % 3), 0);
                OK(sp_cuda_wmat_mul(cu, &dw[0], dX, dP[0], 1, E));
                sp_cuda_wmat_tune_light(0);
                OK(sp_cuda_wmat_mul(cu, &dw[0], dX, dF[0], 1, E));
                sp_cuda_wmat_tune_light(-1);
                same_bits(dF[0], dP[0], (size_t)rows, "decoded a row at a time or not", (sp_wtype)t, rows, C, 1);
            }
            sp_cuda_wmat_tune(0, 0, 0);
            sp_err err = {0};
            /* gate and up of two heights */
            sp_cuda_dmul bad = {{&dw[0], &dw[2]}, {dF[0]}, 2, 1, 0, NULL, NULL, NULL, 0};
            ck_assert_int_eq(sp_cuda_wmat_mul_fused(cu, &bad, dX, 1, &err), SP_ERR_ARG);
            sp_cuda_dmul nine = {{&dw[0]}, {dF[0]}, 1, 0, 0, NULL, NULL, NULL, 0};
            ck_assert_int_eq(sp_cuda_wmat_mul_fused(cu, &nine, dX, 9, &err), SP_ERR_ARG);
            for (int i = 0; i < 3; i++) {
                sp_cuda_wmat_free(cu, &dw[i]);
                sp_cuda_free(cu, dP[i]), sp_cuda_free(cu, dF[i]);
            }
            free(x), free(bias), free(res);
            sp_cuda_free(cu, dX), sp_cuda_free(cu, dBias), sp_cuda_free(cu, dRes);
        }
}
END_TEST

/* The transposed product dX += dY W (sp_qmat_mul_t_acc) into a gradient that holds something: f32 weights an f32
 * GEMM (1e-5 of sum |dy w|), the others bf16 GEMMs (emul_gemm_tol(bf16) of it; int8 / NF4 tiles of 100 rows). */
START_TEST(t_weights_t_gpu)
{
    const int shapes[][2] = {{300, 130}, {1001, 1088}}, Bs[] = {1, 9, 64};
    sp_rng r;
    sp_rng_seed(&r, 51);
    sp_cuda_wmat_tune(0, 0, 100);
    for (int t = 0; t < SP_W__COUNT; t++)
        for (int k = 0; k < 2; k++)
            for (int j = 0; j < 3; j++) {
                int rows = shapes[k][0], C = shapes[k][1], B = Bs[j];
                float *w = emul_randn(&r, (size_t)rows * C, 0.05f), *dec = malloc((size_t)rows * C * 4);
                sp_qmat m;
                ck_assert_int_eq(sp_qmat_encode(&m, (sp_wtype)t, w, rows, C, NULL), SP_OK);
                for (int i = 0; i < rows; i++)
                    sp_qmat_row(&m, i, dec + (size_t)i * C);
                sp_cuda_wmat dw;
                OK(sp_cuda_wmat_upload(cu, &dw, &m, E));
                float *dy = emul_randn(&r, (size_t)B * rows, 1.0f), *dx0 = emul_randn(&r, (size_t)B * C, 1.0f);
                float *dY = up(dy, (size_t)B * rows), *dX = up(dx0, (size_t)B * C);
                sp_qmat_mul_t_acc(&m, dy, dx0, B, NULL);
                OK(sp_cuda_wmat_mul_t_acc(cu, &dw, dY, dX, B, E));
                float *dx1 = down(dX, (size_t)B * C);
                double rel = t == SP_W_F32 ? 1e-5 : wmat_gemm_tol((sp_wtype)t);
                double e = emul_mul_t_err(dx1, dx0, dy, dec, B, rows, C, rel);
                ck_assert_msg(e <= 1.0, "%s [%d, %d] B %d dX: error %.3g of the tolerance", sp_wtype_name(m.type), rows,
                              C, B, e);
                sp_err err = {0};
                ck_assert_int_eq(sp_cuda_wmat_mul_t_acc(cu, &dw, dY, dX, 0, &err), SP_ERR_ARG);
                ck_assert_int_eq(sp_cuda_dequant_bf16(cu, dX, &dw, rows - 1, 2, &err), SP_ERR_ARG);
                free(w), free(dec), free(dy), free(dx0), free(dx1), sp_cuda_free(cu, dY), sp_cuda_free(cu, dX);
                sp_cuda_wmat_free(cu, &dw);
                sp_qmat_free(&m);
            }
    sp_cuda_wmat_tune(0, 0, 0);
}
END_TEST

/* cuBLAS through the plans: f32, bf16 and fp16 operands (cast on the device), fp32 accumulation, within
 * emul_gemm_tol(t) of sum |x w| (t_gemm_plans_vs_cpu checks those bounds hold for the rounding alone). */
START_TEST(t_gemm_gpu)
{
    const int shapes[][3] = {{5, 33, 17}, {1024, 4096, 512}};
    sp_rng r;
    sp_rng_seed(&r, 47);
    for (int k = 0; k < 2; k++) {
        int N = shapes[k][0], in = shapes[k][1], out = shapes[k][2];
        float *X = emul_randn(&r, (size_t)N * in, 1.0f), *W = emul_randn(&r, (size_t)out * in, 1.0f);
        float *y0 = malloc((size_t)N * out * 4), *scale = malloc((size_t)N * out * 4);
        sp_linear_forward(y0, X, W, NULL, N, in, out);
        emul_linear_scale(scale, X, W, N, in, out);
        float *dX = up(X, (size_t)N * in), *dW = up(W, (size_t)out * in), *dY = NULL;
        void *hX = NULL, *hW = NULL;
        OK(sp_cuda_alloc(cu, (void **)&dY, (size_t)N * out * 4, E));
        OK(sp_cuda_alloc(cu, &hX, (size_t)N * in * 2, E));
        OK(sp_cuda_alloc(cu, &hW, (size_t)out * in * 2, E));
        for (int t = SP_CU_F32; t <= SP_CU_F16; t++) {
            if (t != SP_CU_F32) {
                OK(sp_cuda_f32_to(cu, hX, dX, (long)N * in, (sp_cu_dtype)t, E));
                OK(sp_cuda_f32_to(cu, hW, dW, (long)out * in, (sp_cu_dtype)t, E));
            }
            OK(sp_cuda_linear(cu, dY, t == SP_CU_F32 ? (void *)dX : hX, t == SP_CU_F32 ? (void *)dW : hW,
                              (sp_cu_dtype)t, N, in, out, 0, E));
            float *y1 = down(dY, (size_t)N * out);
            for (size_t i = 0; i < (size_t)N * out; i++)
                ck_assert_msg(fabs((double)y1[i] - y0[i]) <= emul_gemm_tol((sp_cu_dtype)t) * scale[i],
                              "dtype %d [%d, %d, %d] at %zu: %g vs %g", t, N, in, out, i, (double)y1[i], (double)y0[i]);
            free(y1);
        }
        /* backward in f32: dX += dY W, dW += dY^T X */
        float *g = emul_randn(&r, (size_t)N * out, 1.0f), *gx0 = calloc((size_t)N * in, 4), *gw0 = calloc((size_t)out * in, 4);
        float *dG = up(g, (size_t)N * out), *dGX = up(gx0, (size_t)N * in), *dGW = up(gw0, (size_t)out * in);
        sp_linear_backward(gx0, gw0, NULL, g, X, W, N, in, out);
        OK(sp_cuda_linear_dx(cu, dGX, dG, dW, SP_CU_F32, N, in, out, E));
        OK(sp_cuda_linear_dw(cu, dGW, dG, dX, SP_CU_F32, N, in, out, E));
        float *gx1 = down(dGX, (size_t)N * in), *gw1 = down(dGW, (size_t)out * in);
        CLOSE(gx1, gx0, (size_t)N * in, 1e-4 * sqrt((double)out), 1e-5, "linear dX");
        CLOSE(gw1, gw0, (size_t)out * in, 1e-4 * sqrt((double)N), 1e-5, "linear dW");
        free(X), free(W), free(y0), free(scale), free(g), free(gx0), free(gw0), free(gx1), free(gw1);
        void *bufs[] = {dX, dW, dY, hX, hW, dG, dGX, dGW};
        for (int i = 0; i < 8; i++)
            sp_cuda_free(cu, bufs[i]);
    }
}
END_TEST

/* Decode attention over a cache filled by sp_cuda_kv_append: MHA, GQA, MQA, with ALiBi, short and long. */
START_TEST(t_attn_decode_gpu)
{
    const int kvh[] = {8, 2, 1}, lens[] = {1, 300, 2049};
    float slopes[8];
    sp_alibi_slopes(slopes, 8);
    sp_rng r;
    sp_rng_seed(&r, 48);
    for (int a = 0; a < 3; a++)
        for (int l = 0; l < 3; l++) {
            int B = 2, nh = 8, nkv = kvh[a], hd = 128, len = lens[l], cap = len + 5, row = nkv * hd, al = l == 1;
            size_t nq = (size_t)B * nh * hd, nk = (size_t)B * cap * row;
            float *q = emul_randn(&r, nq, 1.0f), *kc = emul_randn(&r, nk, 1.0f), *vc = emul_randn(&r, nk, 1.0f);
            float *o0 = malloc(nq * 4), *probs = malloc((size_t)len * 4);
            sp_attn_dims d = {.B = B, .T = 1, .S = len, .past = len - 1, .nh = nh, .nkv = nkv, .hd = hd,
                              .kv_cap = cap, .alibi = al ? slopes : NULL};
            sp_attention_forward(o0, probs, q, kc, vc, &d);
            /* the cache on the device: the first len - 1 positions copied, the last appended as a step would */
            float *dK = up(kc, nk), *dV = up(vc, nk), *dQ = up(q, nq), *dO = NULL, *dS = up(slopes, 8);
            float *step = malloc((size_t)B * row * 4);
            for (int b = 0; b < B; b++)
                memcpy(step + (size_t)b * row, kc + ((size_t)b * cap + len - 1) * row, (size_t)row * 4);
            float *dStep = up(step, (size_t)B * row);
            OK(sp_cuda_zero(cu, dK, nk * 4, E));
            for (int b = 0; b < B; b++) /* positions 0 .. len - 2 of each row */
                OK(sp_cuda_upload(cu, dK + (size_t)b * cap * row, kc + (size_t)b * cap * row,
                                  (size_t)(len - 1) * row * 4, E));
            OK(sp_cuda_kv_append(cu, dK, dStep, B, 1, cap, len - 1, row, E));
            OK(sp_cuda_alloc(cu, (void **)&dO, nq * 4, E));
            OK(sp_cuda_attn_decode(cu, dO, dQ, dK, dV, al ? dS : NULL, B, nh, nkv, hd, cap, len, E));
            float *o1 = down(dO, nq);
            CLOSE(o1, o0, nq, 1e-5, 1e-5, "decode attention"); /* t_attn_decode_vs_cpu */
            sp_err err = {0};
            ck_assert_int_eq(sp_cuda_kv_append(cu, dK, dStep, B, 6, cap, len, row, &err), SP_ERR_ARG); /* overflow */
            free(q), free(kc), free(vc), free(o0), free(probs), free(step), free(o1);
            void *bufs[] = {dK, dV, dQ, dO, dS, dStep};
            for (int i = 0; i < 6; i++)
                sp_cuda_free(cu, bufs[i]);
        }
}
END_TEST

/* Prefill attention (cuBLAS scores and outputs, ALiBi, causal softmax): MHA without ALiBi and a short prefix, GQA
 * with ALiBi over a long prompt, MQA; probabilities and outputs (t_attn_prefill_vs_cpu's tolerances). */
START_TEST(t_attn_prefill_gpu)
{
    const int cases[][3] = {{8, 5, 3}, {2, 300, 0}, {1, 64, 17}}; /* kv heads, T, past */
    float slopes[8];
    sp_alibi_slopes(slopes, 8);
    sp_rng r;
    sp_rng_seed(&r, 49);
    for (int k = 0; k < 3; k++) {
        int B = 2, nh = 8, nkv = cases[k][0], T = cases[k][1], past = cases[k][2], hd = 64, cap = past + T + 3;
        const float *al = k == 1 ? slopes : NULL;
        emul_attn c;
        emul_attn_case(&c, &r, B, T, past, nh, nkv, hd, cap, al);
        float *dQ = up(c.q, c.nq), *dK = up(c.kc, c.nk), *dV = up(c.vc, c.nk), *dS = up(slopes, 8), *dO = NULL,
              *dP = NULL;
        OK(sp_cuda_alloc(cu, (void **)&dO, c.nq * 4, E));
        OK(sp_cuda_alloc(cu, (void **)&dP, c.np * 4, E));
        OK(sp_cuda_attn_prefill(cu, dO, dP, dQ, dK, dV, al ? dS : NULL, B, T, past, nh, nkv, hd, cap, E));
        float *o1 = down(dO, c.nq), *p1 = down(dP, c.np);
        CLOSE(p1, c.probs, c.np, 1e-6, 1e-5, "prefill probabilities");
        CLOSE(o1, c.out, c.nq, 1e-5, 1e-5, "prefill attention output");
        free(o1), free(p1);
        emul_attn_free(&c);
        void *bufs[] = {dQ, dK, dV, dS, dO, dP};
        for (int i = 0; i < 6; i++)
            sp_cuda_free(cu, bufs[i]);
    }
}
END_TEST

/* The attention backward on the device from the device's own forward: GQA over a prefix and MQA over a long prompt,
 * against sp_attention_backward from the CPU's probabilities (t_attn_backward_vs_cpu's tolerances). */
START_TEST(t_attn_backward_gpu)
{
    const int cases[][3] = {{2, 7, 9}, {1, 256, 0}}; /* kv heads, T, past */
    sp_rng r;
    sp_rng_seed(&r, 50);
    for (int k = 0; k < 2; k++) {
        int B = 2, nh = 8, nkv = cases[k][0], T = cases[k][1], past = cases[k][2], hd = 64, cap = past + T + 1;
        emul_attn c;
        emul_attn_case(&c, &r, B, T, past, nh, nkv, hd, cap, NULL);
        size_t nq = c.nq, nk = c.nk;
        float *g = emul_randn(&r, nq, 1.0f), *scratch = malloc((size_t)T * c.d.S * 4);
        float *dq0 = calloc(nq, 4), *dk0 = calloc(nk, 4), *dv0 = calloc(nk, 4);
        sp_attention_backward(dq0, dk0, dv0, scratch, g, c.probs, c.q, c.kc, c.vc, &c.d);
        float *dQ = up(c.q, nq), *dK = up(c.kc, nk), *dV = up(c.vc, nk), *dG = up(g, nq), *dO = NULL, *dP = NULL;
        float *gq = NULL, *gk = NULL, *gv = NULL;
        OK(sp_cuda_alloc(cu, (void **)&gq, nq * 4, E));
        OK(sp_cuda_alloc(cu, (void **)&gk, nk * 4, E));
        OK(sp_cuda_alloc(cu, (void **)&gv, nk * 4, E));
        OK(sp_cuda_zero(cu, gq, nq * 4, E));
        OK(sp_cuda_zero(cu, gk, nk * 4, E));
        OK(sp_cuda_zero(cu, gv, nk * 4, E));
        OK(sp_cuda_alloc(cu, (void **)&dO, nq * 4, E));
        OK(sp_cuda_alloc(cu, (void **)&dP, c.np * 4, E));
        OK(sp_cuda_attn_prefill(cu, dO, dP, dQ, dK, dV, NULL, B, T, past, nh, nkv, hd, cap, E));
        OK(sp_cuda_attn_backward(cu, gq, gk, gv, dG, dP, dQ, dK, dV, B, T, past, nh, nkv, hd, cap, E));
        float *dq1 = down(gq, nq), *dk1 = down(gk, nk), *dv1 = down(gv, nk);
        CLOSE(dq1, dq0, nq, 1e-5, 1e-5, "attention dq");
        CLOSE(dk1, dk0, nk, 1e-5, 1e-5, "attention dk");
        CLOSE(dv1, dv0, nk, 1e-5, 1e-5, "attention dv");
        free(g), free(scratch), free(dq0), free(dk0), free(dv0), free(dq1), free(dk1), free(dv1);
        emul_attn_free(&c);
        void *bufs[] = {dQ, dK, dV, dG, dO, dP, gq, gk, gv};
        for (int i = 0; i < 9; i++)
            sp_cuda_free(cu, bufs[i]);
    }
}
END_TEST

/* Bad shapes and impossible allocations are errors that leave the context usable. */
START_TEST(t_errors_gpu)
{
    sp_err err = {0};
    void *p = NULL;
    ck_assert_int_eq(sp_cuda_alloc(cu, &p, (size_t)1 << 62, &err), SP_ERR_NOMEM);
    ck_assert_ptr_null(p);
    ck_assert_int_eq(sp_cuda_rmsnorm_fwd(cu, NULL, NULL, NULL, NULL, 0, 5, 1e-5f, &err), SP_ERR_ARG);
    ck_assert_int_eq(sp_cuda_attn_decode(cu, NULL, NULL, NULL, NULL, NULL, 1, 6, 4, 8, 10, 3, &err), SP_ERR_ARG);
    ck_assert_int_eq(sp_cuda_attn_decode(cu, NULL, NULL, NULL, NULL, NULL, 1, 8, 4, 8, 10, 11, &err), SP_ERR_ARG);
    sp_gemm_plan bad = sp_gemm_plan_linear(4, 8, 8, 0);
    bad.lda = 2;
    ck_assert_int_eq(sp_cuda_gemm(cu, &bad, NULL, NULL, NULL, SP_CU_F32, &err), SP_ERR_ARG);
    size_t fr = 0, tot = 0;
    OK(sp_cuda_meminfo(cu, &fr, &tot, E));
    ck_assert(fr > 0 && fr <= tot);
    OK(sp_cuda_alloc(cu, &p, 1024, E));
    OK(sp_cuda_zero(cu, p, 1024, E));
    OK(sp_cuda_sync(cu, E));
    sp_cuda_free(cu, p);
}
END_TEST
/* ---------------------------------------------------------------------------------------------- */
/* optimiser kernels (cuda/optim.cu) against the CPU specification (client/train/optim.c) */

enum { BIG = 1000003 }; /* not a multiple of the block size */

/* max over i of |a - b| / (|b| + floor) */
static double max_rel_diff(const float *a, const float *b, size_t n, double floor)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]) / (fabs((double)b[i]) + floor);
        if (!(d <= worst)) /* also catches nan */
            worst = isnan(d) ? INFINITY : d;
    }
    return worst;
}


START_TEST(t_adamw_update_matches_cpu)
{
    sp_rng r;
    sp_rng_seed(&r, 11);
    size_t n = BIG;
    float *p = emul_randn(&r, n, 1.0f), *m = emul_randn(&r, n, 0.01f), *v = emul_randn(&r, n, 0.001f);
    for (size_t i = 0; i < n; i++)
        v[i] = v[i] * v[i]; /* second moments are >= 0 */
    float *pc = emul_dup(p, n), *mc = emul_dup(m, n), *vc = emul_dup(v, n);
    sp_err err = {0};
    for (int t = 1; t <= 5; t++) {
        float *g = emul_randn(&r, n, 0.1f);
        sp_adamw_update_cpu(pc, g, mc, vc, (int64_t)n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, t);
        ck_assert_msg(sp_cuda_adamw_update(p, g, m, v, (int64_t)n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, t, &err) == SP_OK,
                      "%s", err.msg);
        free(g);
        ck_assert_double_le(max_rel_diff(p, pc, n, 1e-9), 1e-6);
        ck_assert_double_le(max_rel_diff(m, mc, n, 1e-12), 1e-6);
        ck_assert_double_le(max_rel_diff(v, vc, n, 1e-15), 1e-6);
    }
    free(p), free(m), free(v), free(pc), free(mc), free(vc);
}
END_TEST

START_TEST(t_unscale_check_matches_cpu)
{
    sp_rng r;
    sp_rng_seed(&r, 12);
    size_t n = BIG;
    float *g = emul_randn(&r, n, 1000.0f), *gc = emul_dup(g, n);
    sp_err err = {0};
    int found = -1;
    ck_assert_msg(sp_cuda_unscale_check(g, (int64_t)n, 1.0f / 1024.0f, &found, &err) == SP_OK, "%s", err.msg);
    ck_assert_int_eq(found, sp_unscale_check_cpu(gc, (int64_t)n, 1.0f / 1024.0f));
    ck_assert_int_eq(found, 0);
    ck_assert_mem_eq(g, gc, n * sizeof(float));
    /* inf in the last element (the tail of the last block), nan in the first, huge values that overflow */
    float keep = g[n - 1];
    g[n - 1] = INFINITY;
    ck_assert_int_eq(sp_cuda_unscale_check(g, (int64_t)n, 1.0f, &found, &err), SP_OK);
    ck_assert_int_eq(found, 1);
    g[n - 1] = keep;
    g[0] = NAN;
    ck_assert_int_eq(sp_cuda_unscale_check(g, (int64_t)n, 0.5f, &found, &err), SP_OK);
    ck_assert_int_eq(found, 1);
    g[0] = 1.0f;
    g[n / 2] = 3e38f;
    ck_assert_int_eq(sp_cuda_unscale_check(g, (int64_t)n, 1.0f, &found, &err), SP_OK);
    ck_assert_int_eq(found, 0);
    ck_assert_int_eq(sp_cuda_unscale_check(g, 7, 4.0f, &found, &err), SP_OK); /* a small n: one partial block */
    ck_assert_int_eq(found, 0);
    g[n / 2] = 3e38f;
    ck_assert_int_eq(sp_cuda_unscale_check(g, (int64_t)n, 4.0f, &found, &err), SP_OK);
    ck_assert_int_eq(found, 1);
    free(g), free(gc);
}
END_TEST

START_TEST(t_sumsq_matches_cpu)
{
    sp_rng r;
    sp_rng_seed(&r, 13);
    const size_t sizes[] = {1, 255, 257, 4099, BIG};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        float *g = emul_randn(&r, n, 0.5f);
        double gpu = -1, cpu = sp_sumsq_cpu(g, (int64_t)n);
        sp_err err = {0};
        ck_assert_msg(sp_cuda_sumsq(g, (int64_t)n, &gpu, &err) == SP_OK, "%s", err.msg);
        ck_assert_msg(fabs(gpu - cpu) <= 1e-9 * cpu, "n %zu: %.17g vs %.17g", n, gpu, cpu);
        ck_assert_double_le(fabs(sqrt(gpu) - sqrt(cpu)), 1e-6 * sqrt(cpu));
        free(g);
    }
}
END_TEST

static sp_t *mk_leaf(float *data, int64_t n)
{
    sp_t *t = calloc(1, sizeof *t);
    t->ndim = 1;
    t->shape[0] = n;
    t->n = n;
    t->data = data;
    t->grad = calloc((size_t)n, sizeof(float));
    t->requires_grad = 1;
    return t;
}

START_TEST(t_optim_step_matches_cpu)
{
    enum { NP = 3 };
    const int64_t sizes[NP] = {BIG, 257, 1};
    sp_rng r;
    sp_rng_seed(&r, 14);
    sp_t *cp[NP], *gp[NP];
    for (int k = 0; k < NP; k++) {
        float *d = emul_randn(&r, (size_t)sizes[k], 1.0f);
        cp[k] = mk_leaf(d, sizes[k]);
        gp[k] = mk_leaf(emul_dup(d, (size_t)sizes[k]), sizes[k]);
    }
    sp_adamw_opts o;
    sp_adamw_opts_default(&o);
    o.lr = 1e-2f;
    o.weight_decay = 0.01f;
    o.warmup_steps = 2;
    o.total_steps = 10;
    o.clip_norm = 300.0f; /* sd 0.2 over 1e6 values: norm ~200 (kept); sd 1: ~1000 (clipped) */
    o.fp16 = 1;
    o.loss_scale = 65536.0f;
    o.growth_interval = 2;
    sp_optim *oc = NULL, *og = NULL;
    sp_err err = {0};
    o.device = 0;
    ck_assert_msg(sp_optim_new(&oc, cp, NP, &o, &err) == SP_OK, "%s", err.msg);
    o.device = 1;
    ck_assert_msg(sp_optim_new(&og, gp, NP, &o, &err) == SP_OK, "%s", err.msg);
    ck_assert_int_eq(sp_optim_on_cuda(og), 1);
    ck_assert_int_eq(sp_optim_on_cuda(oc), 0);
    for (int s = 0; s < 8; s++) {
        float scale = sp_optim_loss_scale(oc);
        ck_assert_float_eq(scale, sp_optim_loss_scale(og));
        ck_assert_float_eq(sp_optim_lr(oc), sp_optim_lr(og));
        for (int k = 0; k < NP; k++) {
            /* step 5: the scalar parameter gets no grad (left alone on both) */
            int none = s == 5 && k == 2;
            float *g = emul_randn(&r, (size_t)sizes[k], s == 2 ? 1.0f : 0.2f); /* step 2: clipped */
            for (int64_t i = 0; i < sizes[k]; i++)
                g[i] *= scale;
            if (s == 4 && k == 1)
                g[100] = INFINITY; /* overflow: skipped, scale backs off */
            if (none) {
                free(cp[k]->grad), free(gp[k]->grad);
                cp[k]->grad = gp[k]->grad = NULL;
            } else {
                if (!cp[k]->grad)
                    cp[k]->grad = calloc((size_t)sizes[k], sizeof(float)), gp[k]->grad = calloc((size_t)sizes[k], 4);
                memcpy(cp[k]->grad, g, (size_t)sizes[k] * sizeof(float));
                memcpy(gp[k]->grad, g, (size_t)sizes[k] * sizeof(float));
            }
            free(g);
        }
        int sk_c = -1, sk_g = -1;
        float n_c = -1, n_g = -1;
        ck_assert_msg(sp_optim_step(oc, &sk_c, &n_c, &err) == SP_OK, "%s", err.msg);
        ck_assert_msg(sp_optim_step(og, &sk_g, &n_g, &err) == SP_OK, "%s", err.msg);
        ck_assert_int_eq(sk_c, sk_g);
        ck_assert_int_eq(sk_c, s == 4);
        if (sk_c)
            ck_assert(isinf(n_c) && isinf(n_g));
        else
            ck_assert_msg(fabs((double)n_c - n_g) <= 1e-6 * n_c, "step %d: norm %.9g vs %.9g", s, (double)n_c,
                          (double)n_g);
        for (int k = 0; k < NP; k++) {
            double d = max_rel_diff(gp[k]->data, cp[k]->data, (size_t)sizes[k], 1e-9);
            ck_assert_msg(d <= 1e-6, "step %d param %d: rel diff %g", s, k, d);
            ck_assert_int_eq(sp_optim_param_steps(oc, k), sp_optim_param_steps(og, k));
            if (gp[k]->grad)
                ck_assert_float_eq(gp[k]->grad[sizes[k] - 1], 0.0f); /* zeroed */
        }
    }
    ck_assert_int_eq(sp_optim_param_steps(og, 0), 7);
    ck_assert_int_eq(sp_optim_param_steps(og, 2), 6);
    ck_assert_float_eq(sp_optim_loss_scale(oc), sp_optim_loss_scale(og));
    uint16_t *h = malloc((size_t)sizes[1] * 2);
    ck_assert_int_eq(sp_optim_fp16_copy(og, 1, h), SP_OK);
    ck_assert_uint_eq(h[7], sp_f32_to_f16(gp[1]->data[7]));
    free(h);
    sp_optim_free(oc);
    sp_optim_free(og);
    for (int k = 0; k < NP; k++) {
        free(cp[k]->data), free(cp[k]->grad), free(cp[k]);
        free(gp[k]->data), free(gp[k]->grad), free(gp[k]);
    }
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* flash attention (cuda/flash.cu) and the fused bf16 kernels (cuda/fused.cu) against the CPU. The flash kernels
 * round q, k, v, dout and the probabilities to bf16 before their products (2^-9 relative each, f32 accumulation):
 * max |device - cpu| over max |cpu| within 1e-2, the device block's bf16 tolerance (test_cuda_block). */
static const double tol_flash = 1e-2;

/* n bf16 values of device memory as floats */
static float *down_bf16(const void *d, size_t n)
{
    uint16_t *h = malloc((n ? n : 1) * 2);
    sp_err err = {0};
    ck_assert_msg(sp_cuda_sync(cu, &err) == SP_OK, "%s", err.msg);
    ck_assert_msg(sp_cuda_download(cu, h, d, n * 2, &err) == SP_OK, "%s", err.msg);
    float *f = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++)
        f[i] = sp_bf16_to_f32(h[i]);
    free(h);
    return f;
}

#define FLASH_CLOSE(a, b, n, what, k)                                                                          \
    do {                                                                                                       \
        double e_ = emul_rel_err((a), (b), (n));                                                               \
        ck_assert_msg(e_ <= tol_flash, "%s (case %d): error %.3g > %.3g", (what), (k), e_, tol_flash);         \
    } while (0)

/* The forward (f32 and bf16 outputs) and the backward (added into random gradients, and written over NaNs; at every
 * mask of flash.h: the pipelines the plain kernels' bits, dq from stored dS within the tolerance too; the default
 * twice: the same bits) of the flash kernels against
 * sp_attention_forward / _backward: T not a multiple of the 64-row tile, head sizes 64 and 128 and odd ones padded
 * (18, 100), MHA, GQA, MQA, ALiBi, past positions from a cache, one query. */
START_TEST(t_flash_gpu)
{
    const int cases[][7] = {/* B, T, past, nh, nkv, hd, alibi */
                            {2, 70, 0, 4, 4, 64, 0},  {1, 130, 0, 8, 2, 128, 1}, {2, 33, 40, 6, 1, 18, 0},
                            {1, 200, 0, 2, 1, 100, 1}, {1, 1, 5, 2, 2, 64, 0},    {1, 64, 64, 3, 3, 128, 1}};
    sp_rng r;
    sp_rng_seed(&r, 61);
    for (int k = 0; k < (int)(sizeof cases / sizeof *cases); k++) {
        int B = cases[k][0], T = cases[k][1], past = cases[k][2], nh = cases[k][3], nkv = cases[k][4];
        int hd = cases[k][5], cap = past + T + 3;
        float slopes[8];
        sp_alibi_slopes(slopes, nh);
        const float *al = cases[k][6] ? slopes : NULL;
        emul_attn c;
        emul_attn_case(&c, &r, B, T, past, nh, nkv, hd, cap, al);
        size_t nq = c.nq, nk = c.nk, nl = (size_t)B * nh * T;
        float *dQ = up(c.q, nq), *dK = up(c.kc, nk), *dV = up(c.vc, nk), *dS = up(slopes, (size_t)nh);
        float *dO = NULL, *dL = NULL;
        void *dOh = NULL;
        OK(sp_cuda_alloc(cu, (void **)&dO, nq * 4, E));
        OK(sp_cuda_alloc(cu, &dOh, nq * 2, E));
        OK(sp_cuda_alloc(cu, (void **)&dL, nl * 4, E));
        OK(sp_cuda_flash_fwd(cu, dO, dOh, dL, dQ, dK, dV, al ? dS : NULL, B, T, past, nh, nkv, hd, cap, E));
        float *o1 = down(dO, nq), *oh = down_bf16(dOh, nq);
        FLASH_CLOSE(o1, c.out, nq, "flash forward", k);
        for (size_t i = 0; i < nq; i++)
            ck_assert_msg(sp_f32_to_bf16(o1[i]) == sp_f32_to_bf16(oh[i]), "flash bf16 output %zu (case %d)", i, k);
        /* backward, from the device's own forward, at every mask: added into random gradients (acc 1; twice at the
         * default: the same bits) and written over NaNs (acc 0) */
        size_t nn[3] = {nq, nk, nk}, nmax = nq > nk ? nq : nk;
        float *g = emul_randn(&r, nq, 1.0f), *scratch = malloc((size_t)T * c.d.S * 4), *nan = malloc(nmax * 4);
        float *start[3], *want[2][3], *got[8][2][3], *dg[3], *nank = malloc(nk * 4);
        for (size_t i = 0; i < nmax; i++)
            nan[i] = NAN;
        for (size_t i = 0; i < nk; i++) /* cache rows past past + T are not the backward's: zeros, as the CPU's */
            nank[i] = (int)(i / ((size_t)nkv * hd) % (size_t)cap) < past + T ? NAN : 0.0f;
        for (int i = 0; i < 3; i++) {
            start[i] = emul_randn(&r, nn[i], 0.1f);
            want[0][i] = calloc(nn[i], 4);
            want[1][i] = malloc(nn[i] * 4);
            memcpy(want[1][i], start[i], nn[i] * 4);
            dg[i] = up(start[i], nn[i]);
        }
        float *dG = up(g, nq);
        sp_attention_backward(want[0][0], want[0][1], want[0][2], scratch, g, c.probs, c.q, c.kc, c.vc, &c.d);
        sp_attention_backward(want[1][0], want[1][1], want[1][2], scratch, g, c.probs, c.q, c.kc, c.vc, &c.d);
        for (int mask = 0; mask < 8; mask++) {
            sp_cuda_flash_set_pipeline(mask);
            for (int acc = 0; acc < 2; acc++) {
                for (int i = 0; i < 3; i++)
                    OK(sp_cuda_upload(cu, dg[i], acc ? start[i] : i ? nank : nan, nn[i] * 4, E));
                OK(sp_cuda_flash_bwd(cu, dg[0], dg[1], dg[2], dG, dO, dL, dQ, dK, dV, al ? dS : NULL, B, T, past, nh,
                                     nkv, hd, cap, acc, E));
                for (int i = 0; i < 3; i++) {
                    char what[64];
                    snprintf(what, sizeof what, "flash d%c (acc %d, mask %d)", "qkv"[i], acc, mask);
                    got[mask][acc][i] = down(dg[i], nn[i]);
                    FLASH_CLOSE(got[mask][acc][i], want[acc][i], nn[i], what, k);
                    /* the pipelines: the plain kernels' bits; dq from stored dS: mask 4's */
                    int ref = i == 0 ? mask & SP_CUDA_FLASH_DQ_STORED : 0;
                    ck_assert_msg(memcmp(got[mask][acc][i], got[ref][acc][i], nn[i] * 4) == 0,
                                  "flash d%c (acc %d): mask %d differs from mask %d (case %d)", "qkv"[i], acc, mask,
                                  ref, k);
                }
            }
        }
        sp_cuda_flash_set_pipeline(-1);
        int def = sp_cuda_flash_pipeline();
        for (int run = 0; run < 2; run++) { /* the default from the same start twice: its mask's bits */
            for (int i = 0; i < 3; i++)
                OK(sp_cuda_upload(cu, dg[i], start[i], nn[i] * 4, E));
            OK(sp_cuda_flash_bwd(cu, dg[0], dg[1], dg[2], dG, dO, dL, dQ, dK, dV, al ? dS : NULL, B, T, past, nh, nkv,
                                 hd, cap, 1, E));
            for (int i = 0; i < 3; i++) {
                float *again = down(dg[i], nn[i]);
                ck_assert_msg(memcmp(again, got[def][1][i], nn[i] * 4) == 0,
                              "flash d%c: the default (mask %d) not deterministic (case %d)", "qkv"[i], def, k);
                free(again);
            }
        }
        for (int i = 0; i < 3; i++) {
            for (int mask = 0; mask < 8; mask++)
                free(got[mask][0][i]), free(got[mask][1][i]);
            free(start[i]), free(want[0][i]), free(want[1][i]);
            sp_cuda_free(cu, dg[i]);
        }
        free(nan), free(nank);
        sp_cuda_free(cu, dG);
        free(o1), free(oh), free(g), free(scratch);
        emul_attn_free(&c);
        void *bufs[] = {dQ, dK, dV, dS, dO, dOh, dL};
        for (int i = 0; i < (int)(sizeof bufs / sizeof *bufs); i++)
            sp_cuda_free(cu, bufs[i]);
    }
}
END_TEST

/* The fused kernels: their f32 side (the residual, the norm's statistics, the biased GELU input) equals the
 * unfused CPU ops, and their bf16 outputs are the CPU results rounded (2^-8 relative, 4 x 1.1e-3). */
START_TEST(t_fused_gpu)
{
    sp_rng r;
    sp_rng_seed(&r, 62);
    for (int k = 0; k < 4; k++) {
        int N = 3 + k, C = odd_C[k + 2];
        size_t n = (size_t)N * C;
        float *y = emul_randn(&r, n, 1.0f), *res = emul_randn(&r, n, 1.0f), *bias = emul_randn(&r, (size_t)C, 1.0f);
        float *w = emul_randn(&r, (size_t)C, 1.0f), *b = emul_randn(&r, (size_t)C, 1.0f);
        float *h0 = malloc(n * 4), *o0 = malloc(n * 4), *m0 = malloc((size_t)N * 4), *r0 = malloc((size_t)N * 4);
        for (size_t i = 0; i < n; i++)
            h0[i] = y[i] + bias[i % C] + res[i];
        float *dY = up(y, n), *dRes = up(res, n), *dBias = up(bias, (size_t)C), *dW = up(w, (size_t)C);
        float *dB = up(b, (size_t)C), *dH = up(y, n), *dM = up(y, (size_t)N), *dR = up(y, (size_t)N);
        void *dOut = NULL;
        OK(sp_cuda_alloc(cu, &dOut, n * 2, E));
        /* RMSNorm after the residual (block.c: bias, then residual) */
        sp_rmsnorm_forward(o0, r0, h0, w, N, C, 1e-5f);
        OK(sp_cuda_norm_h(cu, dOut, NULL, dR, dH, dY, dBias, dRes, dW, NULL, N, C, 1e-5f, 1, E));
        float *h1 = down(dH, n), *o1 = down_bf16(dOut, n), *r1 = down(dR, (size_t)N);
        ck_assert_mem_eq(h1, h0, n * 4);
        CLOSE(o1, o0, n, 1e-6, 1.1e-3, "fused rmsnorm");
        CLOSE(r1, r0, (size_t)N, 0, 1e-5, "fused rmsnorm rstd");
        free(o1), free(r1);
        /* LayerNorm of the input alone */
        sp_layernorm_forward(o0, m0, r0, y, w, b, N, C, 1e-5f);
        OK(sp_cuda_norm_h(cu, dOut, dM, dR, NULL, dY, NULL, NULL, dW, dB, N, C, 1e-5f, 0, E));
        float *m1 = down(dM, (size_t)N);
        o1 = down_bf16(dOut, n), r1 = down(dR, (size_t)N);
        CLOSE(o1, o0, n, 1e-6, 1.1e-3, "fused layernorm");
        CLOSE(m1, m0, (size_t)N, 1e-6, 1e-5, "fused layernorm mean");
        CLOSE(r1, r0, (size_t)N, 0, 1e-5, "fused layernorm rstd");
        free(o1), free(r1), free(m1);
        /* SwiGLU, and GELU-tanh / GELU of the biased input (kept in place) */
        sp_swiglu_forward(o0, y, res, (long)n);
        OK(sp_cuda_swiglu_h(cu, dOut, dY, dRes, (long)n, E));
        o1 = down_bf16(dOut, n);
        CLOSE(o1, o0, n, 1e-6, 1.1e-3, "fused swiglu");
        free(o1);
        for (int t = 0; t < 2; t++) {
            for (size_t i = 0; i < n; i++)
                h0[i] = y[i] + bias[i % C];
            (t ? sp_gelu_tanh_forward : sp_gelu_forward)(o0, h0, (long)n);
            float *dU = up(y, n);
            OK(sp_cuda_gelu_h(cu, dOut, dU, dBias, (long)n, C, t, E));
            float *u1 = down(dU, n);
            o1 = down_bf16(dOut, n);
            ck_assert_mem_eq(u1, h0, n * 4);
            CLOSE(o1, o0, n, 1e-6, 1.1e-3, "fused gelu");
            free(o1), free(u1);
            sp_cuda_free(cu, dU);
        }
        free(y), free(res), free(bias), free(w), free(b), free(h0), free(o0), free(m0), free(r0), free(h1);
        void *bufs[] = {dY, dRes, dBias, dW, dB, dH, dM, dR, dOut};
        for (int i = 0; i < 9; i++)
            sp_cuda_free(cu, bufs[i]);
    }
}
END_TEST

/* 1 when bf16 values h[n] are the device f32 values f[n] rounded (the fused twins of a kernel: the same kmath). */
static int rounded_from(const void *dh, const float *df, size_t n)
{
    float *h = down_bf16(dh, n), *f = down(df, n);
    int same = 1;
    for (size_t i = 0; i < n && same; i++)
        same = sp_f32_to_bf16(h[i]) == sp_f32_to_bf16(f[i]);
    free(h), free(f);
    return same;
}

/* The packed forward and backward (flash.h: q, k, v packed once, RoPE applied on the way) give what the packing
 * ones give from the same operands (rotated first by sp_cuda_rope_fwd where RoPE runs): without RoPE the same bits,
 * with it within the tolerance (the rotation's f32 may round to bf16 apart); GQA, MQA, ALiBi, a padded head size,
 * positions from pos0; bad shapes refused. */
START_TEST(t_flash_packed_gpu)
{
    const int cases[][8] = {/* B, T, nh, nkv, hd, rope, alibi, pos0 */
                            {2, 70, 4, 2, 64, 1, 0, 3}, {1, 130, 3, 3, 100, 0, 1, 0}, {1, 200, 8, 1, 128, 1, 0, 0},
                            {2, 40, 2, 2, 64, 0, 0, 0}};
    sp_rng r;
    sp_rng_seed(&r, 65);
    for (int k = 0; k < (int)(sizeof cases / sizeof *cases); k++) {
        int B = cases[k][0], T = cases[k][1], nh = cases[k][2], nkv = cases[k][3], hd = cases[k][4];
        int rope = cases[k][5], pos0 = cases[k][7];
        size_t nq = (size_t)B * T * nh * hd, nk = (size_t)B * T * nkv * hd, nl = (size_t)B * nh * T;
        float slopes[8], freq[64];
        sp_alibi_slopes(slopes, nh);
        for (int i = 0; i < hd / 2; i++)
            freq[i] = powf(10000.0f, -2.0f * (float)i / (float)hd);
        float *q = emul_randn(&r, nq, 1.0f), *kk = emul_randn(&r, nk, 1.0f), *v = emul_randn(&r, nk, 1.0f);
        float *g = emul_randn(&r, nq, 1.0f);
        float *dQ = up(q, nq), *dK = up(kk, nk), *dV = up(v, nk), *dG = up(g, nq), *dF = up(freq, (size_t)hd / 2);
        float *dS = cases[k][6] ? up(slopes, (size_t)nh) : NULL, *f = rope ? dF : NULL;
        float *qr = up(q, nq), *kr = up(kk, nk);
        if (rope) {
            OK(sp_cuda_rope_fwd(cu, qr, dQ, dF, pos0, B, T, nh, hd, E));
            OK(sp_cuda_rope_fwd(cu, kr, dK, dF, pos0, B, T, nkv, hd, E));
        }
        float *o[2], *l[2], *gq[2], *gk[2], *gv[2];
        void *oh[2], *pk = NULL;
        for (int i = 0; i < 2; i++) {
            OK(sp_cuda_alloc(cu, (void **)&o[i], nq * 4, E));
            OK(sp_cuda_alloc(cu, &oh[i], nq * 2, E));
            OK(sp_cuda_alloc(cu, (void **)&l[i], nl * 4, E));
            OK(sp_cuda_alloc(cu, (void **)&gq[i], nq * 4, E));
            OK(sp_cuda_alloc(cu, (void **)&gk[i], nk * 4, E));
            OK(sp_cuda_alloc(cu, (void **)&gv[i], nk * 4, E));
        }
        OK(sp_cuda_alloc(cu, &pk, sp_cuda_flash_packed_bytes(B, T, nh, nkv, hd), E));
        OK(sp_cuda_flash_fwd(cu, o[0], oh[0], l[0], qr, kr, dV, dS, B, T, 0, nh, nkv, hd, T, E));
        OK(sp_cuda_flash_bwd(cu, gq[0], gk[0], gv[0], dG, o[0], l[0], qr, kr, dV, dS, B, T, 0, nh, nkv, hd, T, 0, E));
        OK(sp_cuda_flash_pack(cu, pk, dQ, dK, dV, f, pos0, B, T, nh, nkv, hd, E));
        OK(sp_cuda_flash_fwd_packed(cu, o[1], oh[1], l[1], pk, dS, B, T, nh, nkv, hd, E));
        OK(sp_cuda_flash_bwd_packed(cu, gq[1], gk[1], gv[1], dG, o[1], l[1], pk, dS, B, T, nh, nkv, hd, 0, E));
        float *bufs[2][5];
        for (int i = 0; i < 2; i++) {
            bufs[i][0] = down(o[i], nq), bufs[i][1] = down(l[i], nl), bufs[i][2] = down(gq[i], nq);
            bufs[i][3] = down(gk[i], nk), bufs[i][4] = down(gv[i], nk);
        }
        size_t ns[5] = {nq, nl, nq, nk, nk};
        const char *what[5] = {"output", "lse", "dq", "dk", "dv"};
        for (int j = 0; j < 5; j++) {
            if (!rope)
                ck_assert_msg(memcmp(bufs[0][j], bufs[1][j], ns[j] * 4) == 0, "packed flash %s (case %d): not the "
                              "same bits", what[j], k);
            else
                FLASH_CLOSE(bufs[1][j], bufs[0][j], ns[j], what[j], k);
            free(bufs[0][j]), free(bufs[1][j]);
        }
        ck_assert_msg(rounded_from(oh[1], o[1], nq), "packed flash bf16 output (case %d)", k);
        sp_err err = {0};
        ck_assert_int_eq(sp_cuda_flash_pack(cu, pk, dQ, dK, dV, f, pos0, B, T, nh, nkv, 129, &err), SP_ERR_ARG);
        ck_assert_int_eq(sp_cuda_flash_pack(cu, pk, dQ, dK, dV, dF, 0, B, T, nh, nkv, 63, &err), SP_ERR_ARG);
        ck_assert_int_eq(sp_cuda_flash_fwd_packed(cu, o[1], NULL, l[1], pk, dS, B, T, nh, nh + 1, hd, &err),
                         SP_ERR_ARG);
        free(q), free(kk), free(v), free(g);
        for (int i = 0; i < 2; i++) {
            void *d[] = {o[i], oh[i], l[i], gq[i], gk[i], gv[i]};
            for (int j = 0; j < 6; j++)
                sp_cuda_free(cu, d[j]);
        }
        void *d[] = {dQ, dK, dV, dG, dF, dS, qr, kr, pk};
        for (int j = 0; j < 9; j++)
            sp_cuda_free(cu, d[j]);
    }
}
END_TEST

/* The backward's fused twins give the bf16 rounding of what the f32 kernels add into zeros: SwiGLU, GELU, GELU-tanh
 * and RoPE (llama3 frequencies at positions past 8190); the norms' backward on the residual what the f32 kernels
 * add into it (RMSNorm, LayerNorm; in place too) and its bf16 rounding; shape errors are refused. */
START_TEST(t_fused_bwd_gpu)
{
    sp_rng r;
    sp_rng_seed(&r, 64);
    int B = 2, T = 5, nh = 3, hd = 128;
    long n = (long)B * T * nh * hd;
    float *g = emul_randn(&r, (size_t)n, 1.0f), *x = emul_randn(&r, (size_t)n, 1.0f), *u = emul_randn(&r, (size_t)n, 1.0f);
    float *dG = up(g, (size_t)n), *dX = up(x, (size_t)n), *dU = up(u, (size_t)n), *f1 = NULL, *f2 = NULL;
    void *h1 = NULL, *h2 = NULL;
    OK(sp_cuda_alloc(cu, (void **)&f1, (size_t)n * 4, E));
    OK(sp_cuda_alloc(cu, (void **)&f2, (size_t)n * 4, E));
    OK(sp_cuda_alloc(cu, &h1, (size_t)n * 2, E));
    OK(sp_cuda_alloc(cu, &h2, (size_t)n * 2, E));
    OK(sp_cuda_zero(cu, f1, (size_t)n * 4, E));
    OK(sp_cuda_zero(cu, f2, (size_t)n * 4, E));
    OK(sp_cuda_swiglu_bwd(cu, f1, f2, dG, dX, dU, n, E));
    OK(sp_cuda_swiglu_bwd_h(cu, h1, h2, dG, dX, dU, n, E));
    ck_assert_msg(rounded_from(h1, f1, (size_t)n) && rounded_from(h2, f2, (size_t)n), "fused swiglu backward");
    for (int t = 0; t < 2; t++) {
        OK(sp_cuda_zero(cu, f1, (size_t)n * 4, E));
        OK(sp_cuda_gelu_bwd(cu, f1, dG, dX, n, t, E));
        OK(sp_cuda_gelu_bwd_h(cu, h1, dG, dX, n, t, E));
        ck_assert_msg(rounded_from(h1, f1, (size_t)n), "fused gelu backward (tanh %d)", t);
    }
    sp_config cfg = {.head_dim = 128, .rope_theta = 500000.0, .rope_type = SP_ROPE_LLAMA3, .rope_factor = 8.0,
                     .rope_low_freq_factor = 1.0, .rope_high_freq_factor = 4.0, .rope_orig_max_pos = 8192};
    sp_rope rope;
    ck_assert_int_eq(sp_rope_init(&rope, &cfg, NULL), SP_OK);
    float *dF = up(rope.inv_freq, (size_t)hd / 2);
    OK(sp_cuda_zero(cu, f1, (size_t)n * 4, E));
    OK(sp_cuda_rope_bwd(cu, f1, dG, dF, 8190, B, T, nh, hd, E));
    OK(sp_cuda_rope_bwd_h(cu, h1, dG, dF, 8190, B, T, nh, hd, E));
    ck_assert_msg(rounded_from(h1, f1, (size_t)n), "fused rope backward");
    /* a norm's backward on the residual (3 rows of 1000 of the buffers' 3840 values): res + what the f32 kernel
     * adds, written out of place and in place, and its bf16 rounding */
    int N = 3, C = 1000;
    float *dM = NULL, *dR = NULL, *dW = up(u, (size_t)C), *want = NULL, *got = NULL;
    OK(sp_cuda_alloc(cu, (void **)&dM, (size_t)N * 4, E));
    OK(sp_cuda_alloc(cu, (void **)&dR, (size_t)N * 4, E));
    for (int rms = 1; rms >= 0; rms--) {
        if (rms)
            OK(sp_cuda_rmsnorm_fwd(cu, f2, dR, dX, dW, N, C, 1e-5f, E));
        else
            OK(sp_cuda_layernorm_fwd(cu, f2, dM, dR, dX, dW, NULL, N, C, 1e-5f, E));
        OK(sp_cuda_upload(cu, f1, u, (size_t)N * C * 4, E)); /* the residual's gradient so far */
        if (rms)
            OK(sp_cuda_rmsnorm_bwd(cu, f1, NULL, dG, dX, dW, dR, N, C, E));
        else
            OK(sp_cuda_layernorm_bwd(cu, f1, NULL, NULL, dG, dX, dW, dM, dR, N, C, E));
        want = down(f1, (size_t)N * C);
        OK(sp_cuda_upload(cu, f1, u, (size_t)N * C * 4, E));
        OK(sp_cuda_norm_bwd_h(cu, f2, h1, f1, dG, dX, dW, dM, dR, N, C, rms, E)); /* out of place */
        got = down(f2, (size_t)N * C);
        CLOSE(got, want, (size_t)N * C, 1e-6, 1e-6, "fused norm backward");
        ck_assert_msg(rounded_from(h1, f2, (size_t)N * C), "fused norm backward's bf16 (rms %d)", rms);
        free(got);
        OK(sp_cuda_norm_bwd_h(cu, f1, NULL, f1, dG, dX, dW, dM, dR, N, C, rms, E)); /* in place */
        got = down(f1, (size_t)N * C);
        float *again = down(f2, (size_t)N * C);
        ck_assert_msg(memcmp(got, again, (size_t)N * C * 4) == 0, "fused norm backward in place (rms %d)", rms);
        free(got), free(again), free(want);
    }
    sp_err err = {0};
    ck_assert_int_eq(sp_cuda_norm_bwd_h(cu, f1, NULL, f1, dG, dX, NULL, dM, dR, N, C, 1, &err), SP_ERR_ARG);
    sp_cuda_free(cu, dM), sp_cuda_free(cu, dR), sp_cuda_free(cu, dW);
    ck_assert_int_eq(sp_cuda_rope_bwd_h(cu, h1, dG, dF, 0, B, T, nh, 7, &err), SP_ERR_ARG); /* odd head dim */
    ck_assert_int_eq(sp_cuda_swiglu_bwd_h(cu, h1, h2, dG, dX, dU, 0, &err), SP_ERR_ARG);
    free(g), free(x), free(u);
    void *bufs[] = {dG, dX, dU, f1, f2, h1, h2, dF};
    for (int i = 0; i < 8; i++)
        sp_cuda_free(cu, bufs[i]);
}
END_TEST

/* sp_cuda_wmat_mul_h from X rounded to bf16 gives the bits sp_cuda_wmat_mul's GEMM path gives from X (beyond 32
 * rows: the same cast and GEMMs), and sp_cuda_wmat_mul_t_h those of sp_cuda_wmat_mul_t_acc; an f32 matrix is
 * refused. */
START_TEST(t_wmat_mul_h_gpu)
{
    sp_rng r;
    sp_rng_seed(&r, 63);
    int rows = 300, C = 130, B = 40;
    float *w = emul_randn(&r, (size_t)rows * C, 0.05f), *x = emul_randn(&r, (size_t)B * C, 1.0f);
    uint16_t *xh = malloc((size_t)B * C * 2);
    for (int i = 0; i < B * C; i++)
        xh[i] = sp_f32_to_bf16(x[i]);
    float *dX = up(x, (size_t)B * C), *dY = NULL, *dY2 = NULL, *dT = NULL, *dT2 = NULL;
    void *dXh = up_bytes(xh, (size_t)B * C * 2), *dYh = NULL;
    OK(sp_cuda_alloc(cu, (void **)&dY, (size_t)B * rows * 4, E));
    OK(sp_cuda_alloc(cu, (void **)&dY2, (size_t)B * rows * 4, E));
    OK(sp_cuda_alloc(cu, (void **)&dT, (size_t)B * C * 4, E));
    OK(sp_cuda_alloc(cu, (void **)&dT2, (size_t)B * C * 4, E));
    OK(sp_cuda_alloc(cu, &dYh, (size_t)B * rows * 2, E));
    for (int t = 0; t < SP_W__COUNT; t++) {
        sp_qmat m;
        ck_assert_int_eq(sp_qmat_encode(&m, (sp_wtype)t, w, rows, C, NULL), SP_OK);
        sp_cuda_wmat dw;
        OK(sp_cuda_wmat_upload(cu, &dw, &m, E));
        sp_err err = {0};
        if (t == SP_W_F32 || t == SP_W_F16) { /* bf16 inputs: not an f32 or fp16 matrix's */
            ck_assert_int_eq(sp_cuda_wmat_mul_h(cu, &dw, dXh, dY, B, &err), SP_ERR_ARG);
            ck_assert_int_eq(sp_cuda_wmat_mul_t_h(cu, &dw, dXh, dY, B, 1, &err), SP_ERR_ARG);
        } else {
            OK(sp_cuda_wmat_mul(cu, &dw, dX, dY, B, E));
            OK(sp_cuda_wmat_mul_h(cu, &dw, dXh, dY2, B, E));
            float *y1 = down(dY, (size_t)B * rows), *y2 = down(dY2, (size_t)B * rows);
            ck_assert_mem_eq(y1, y2, (size_t)B * rows * 4);
            /* transposed: dX += dY W from Y's rows (f32, cast inside) and from them in bf16; acc 0 overwrites */
            OK(sp_cuda_f32_to(cu, dYh, dY, (long)B * rows, SP_CU_BF16, E));
            OK(sp_cuda_copy_d2d(cu, dT, dX, (size_t)B * C * 4, E));
            OK(sp_cuda_copy_d2d(cu, dT2, dX, (size_t)B * C * 4, E));
            OK(sp_cuda_wmat_mul_t_acc(cu, &dw, dY, dT, B, E));
            OK(sp_cuda_wmat_mul_t_h(cu, &dw, dYh, dT2, B, 1, E));
            float *t1 = down(dT, (size_t)B * C), *t2 = down(dT2, (size_t)B * C);
            ck_assert_mem_eq(t1, t2, (size_t)B * C * 4);
            free(t1), free(t2);
            OK(sp_cuda_zero(cu, dT, (size_t)B * C * 4, E));
            OK(sp_cuda_wmat_mul_t_h(cu, &dw, dYh, dT, B, 1, E));
            OK(sp_cuda_wmat_mul_t_h(cu, &dw, dYh, dT2, B, 0, E)); /* over the last result */
            t1 = down(dT, (size_t)B * C), t2 = down(dT2, (size_t)B * C);
            /* cuBLAS may pick another kernel for beta 0: the same sums, maybe in another order */
            ck_assert_double_le(emul_rel_err(t2, t1, (size_t)B * C), 1e-5);
            free(y1), free(y2), free(t1), free(t2);
        }
        sp_cuda_wmat_free(cu, &dw);
        sp_qmat_free(&m);
    }
    free(w), free(x), free(xh);
    sp_cuda_free(cu, dX), sp_cuda_free(cu, dXh), sp_cuda_free(cu, dY), sp_cuda_free(cu, dY2);
    sp_cuda_free(cu, dT), sp_cuda_free(cu, dT2), sp_cuda_free(cu, dYh);
}
END_TEST

int main(void)
{
    int rc = emul_open_gpu("test_cuda", &cu);
    if (rc)
        return rc;
    Suite *s = suite_create("cuda");
    TCase *tk = tcase_create("block_kernels_vs_cpu");
    tcase_set_timeout(tk, 300);
    tcase_add_test(tk, t_norms_gpu);
    tcase_add_test(tk, t_rope_gpu);
    tcase_add_test(tk, t_alibi_gpu);
    tcase_add_test(tk, t_activations_gpu);
    tcase_add_test(tk, t_embedding_crossentropy_gpu);
    tcase_add_test(tk, t_gemm_gpu);
    tcase_add_test(tk, t_attn_decode_gpu);
    tcase_add_test(tk, t_attn_prefill_gpu);
    tcase_add_test(tk, t_attn_backward_gpu);
    tcase_add_test(tk, t_flash_gpu);
    tcase_add_test(tk, t_flash_packed_gpu);
    tcase_add_test(tk, t_fused_gpu);
    tcase_add_test(tk, t_wmat_mul_h_gpu);
    tcase_add_test(tk, t_fused_bwd_gpu);
    tcase_add_test(tk, t_errors_gpu);
    suite_add_tcase(s, tk);
    TCase *tw = tcase_create("weights_vs_cpu"); /* its own case: scripts/gpu-check.sh runs it under memcheck */
    tcase_set_timeout(tw, 300);
    tcase_add_test(tw, t_weights_gpu);
    tcase_add_test(tw, t_weights_t_gpu);
    tcase_add_test(tw, t_weights_fused_gpu);
    suite_add_tcase(s, tw);
    TCase *tc = tcase_create("optimiser_vs_cpu");
    tcase_add_test(tc, t_adamw_update_matches_cpu);
    tcase_add_test(tc, t_unscale_check_matches_cpu);
    tcase_add_test(tc, t_sumsq_matches_cpu);
    tcase_add_test(tc, t_optim_step_matches_cpu);
    suite_add_tcase(s, tc);
    rc = sp_test_run(s);
    sp_cuda_close(cu);
    return rc;
}
