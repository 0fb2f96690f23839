/* cuda_emul.c - see cuda_emul.h. Each function mirrors one kernel (cuda/kernels.cu, weights.cu, attn.cu): the
 * loops over blockIdx and threadIdx are the outer loops here. */
#include "cuda_emul.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "rng.h"

/* One block's reduction into result: part_expr for every tid < nt, combined by the kernels' tree (tree:
 * sp_km_tree_sum or sp_km_tree_max). */
#define EMUL_BLOCK(result, nt, tree, part_expr)                                                                \
    do {                                                                                                       \
        float sh_[SP_KM_MAX_THREADS];                                                                          \
        for (int tid = 0; tid < (nt); tid++)                                                                   \
            sh_[tid] = (part_expr);                                                                            \
        (result) = tree(sh_, (nt));                                                                            \
    } while (0)
#define EMUL_BLOCK_SUM(result, nt, part_expr) EMUL_BLOCK(result, nt, sp_km_tree_sum, part_expr)
#define EMUL_BLOCK_MAX(result, nt, part_expr) EMUL_BLOCK(result, nt, sp_km_tree_max, part_expr)

void emul_rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps)
{
    int nt = sp_km_row_threads(C);
    for (int row = 0; row < N; row++) {
        const float *x = inp + (long)row * C;
        float ss;
        EMUL_BLOCK_SUM(ss, nt, sp_km_sumsq_part(x, C, tid, nt));
        float r = sp_km_rstd(ss, C, eps);
        for (int c = 0; c < C; c++)
            out[(long)row * C + c] = sp_km_rmsnorm(x[c], r, w[c]);
        if (rstd)
            rstd[row] = r;
    }
}

void emul_rmsnorm_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w, const float *rstd,
                      int N, int C)
{
    int nt = sp_km_row_threads(C);
    for (int row = 0; dinp && row < N; row++) {
        long off = (long)row * C;
        float dot;
        EMUL_BLOCK_SUM(dot, nt, sp_km_dot3_part(dout + off, w, inp + off, C, tid, nt));
        float k = sp_km_rmsnorm_k(rstd[row], dot, C);
        for (int c = 0; c < C; c++)
            dinp[off + c] += sp_km_rmsnorm_dx(inp[off + c], w[c], dout[off + c], rstd[row], k);
    }
    for (int c = 0; dw && c < C; c++)
        dw[c] += sp_km_norm_dw_col(dout, inp, NULL, rstd, N, C, c, 0);
}

void emul_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b, int N,
                        int C, float eps)
{
    int nt = sp_km_row_threads(C);
    for (int row = 0; row < N; row++) {
        const float *x = inp + (long)row * C;
        float m, v;
        EMUL_BLOCK_SUM(m, nt, sp_km_sum_part(x, C, tid, nt));
        m /= (float)C;
        EMUL_BLOCK_SUM(v, nt, sp_km_sqdev_part(x, m, C, tid, nt));
        float r = sp_km_rstd(v, C, eps);
        for (int c = 0; c < C; c++)
            out[(long)row * C + c] = sp_km_layernorm(x[c], m, r, w ? w[c] : 1.0f, b ? b[c] : 0.0f);
        mean[row] = m;
        rstd[row] = r;
    }
}

void emul_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                        const float *mean, const float *rstd, int N, int C)
{
    int nt = sp_km_row_threads(C);
    for (int row = 0; dinp && row < N; row++) {
        long off = (long)row * C;
        float g[SP_KM_MAX_THREADS], gx[SP_KM_MAX_THREADS];
        for (int tid = 0; tid < nt; tid++)
            sp_km_layernorm_bwd_part(dout + off, inp + off, w, mean[row], rstd[row], C, tid, nt, &g[tid], &gx[tid]);
        float gmean = sp_km_tree_sum(g, nt) / (float)C, gxmean = sp_km_tree_sum(gx, nt) / (float)C;
        for (int c = 0; c < C; c++)
            dinp[off + c] += sp_km_layernorm_dx(inp[off + c], dout[off + c], w ? w[c] : 1.0f, mean[row], rstd[row],
                                                gmean, gxmean);
    }
    for (int c = 0; c < C; c++) {
        if (dw)
            dw[c] += sp_km_norm_dw_col(dout, inp, mean, rstd, N, C, c, 0);
        if (db)
            db[c] += sp_km_norm_dw_col(dout, inp, mean, rstd, N, C, c, 1);
    }
}

void emul_rope(float *out, const float *inp, const float *inv_freq, int pos0, int B, int T, int nh, int hd,
               int backward)
{
    long pairs = (long)B * T * nh * (hd / 2);
    for (long e = 0; e < pairs; e++)
        sp_km_rope_apply(out, inp, inv_freq, pos0, T, nh, hd, e, backward);
}

void emul_alibi_add(float *scores, const float *slopes, int B, int nh, int T, int S, int past)
{
    long n = (long)B * nh * T * S;
    for (long e = 0; e < n; e++) {
        int h, s, qpos;
        if (sp_km_score_at(e, nh, T, S, past, &h, &s, &qpos))
            scores[e] += sp_km_alibi(slopes[h], s, qpos);
    }
}

void emul_causal_softmax(float *scores, long rows, int T, int S, int past)
{
    int nt = sp_km_row_threads(S);
    for (long row = 0; row < rows; row++) {
        float *p = scores + row * S, mx, sum;
        int n = sp_km_causal_len(row, T, past);
        EMUL_BLOCK_MAX(mx, nt, sp_km_max_part(p, n, tid, nt));
        EMUL_BLOCK_SUM(sum, nt, sp_km_sumexp_part(p, mx, n, tid, nt));
        float inv = 1.0f / sum;
        for (int s = 0; s < S; s++)
            p[s] = s < n ? sp_km_attn_prob(p[s], mx, inv) : 0.0f;
    }
}

/* sp_cuda_attn's per_head: plan p once per head, A, B, C at the head's offsets of kinds ao, bo, co. */
static void emul_per_head(const sp_gemm_plan *p, const float *a, int ao, const float *b, int bo, float *c, int co,
                          int B, int T, int S, int nh, int nkv, int hd, int cap)
{
    for (int bh = 0; c && bh < B * nh; bh++)
        emul_gemm(p, a + sp_km_head_off(ao, bh, nh, nkv, T, S, hd, cap),
                  b + sp_km_head_off(bo, bh, nh, nkv, T, S, hd, cap), c + sp_km_head_off(co, bh, nh, nkv, T, S, hd, cap));
}

enum { Q = SP_KM_OFF_Q, KV = SP_KM_OFF_KV, TS = SP_KM_OFF_TS };

void emul_attn_prefill(float *out, float *probs, const float *q, const float *kc, const float *vc, const float *slopes,
                       int B, int T, int past, int nh, int nkv, int hd, int cap)
{
    int S = past + T, ldq = nh * hd, ldk = nkv * hd;
    sp_gemm_plan ps = sp_gemm_plan_scores(T, S, hd, ldq, ldk, 1.0f / sqrtf((float)hd));
    sp_gemm_plan po = sp_gemm_plan_attn_out(T, S, hd, ldk, ldq, 0);
    emul_per_head(&ps, kc, KV, q, Q, probs, TS, B, T, S, nh, nkv, hd, cap);
    if (slopes)
        emul_alibi_add(probs, slopes, B, nh, T, S, past);
    emul_causal_softmax(probs, (long)B * nh * T, T, S, past);
    emul_per_head(&po, vc, KV, probs, TS, out, Q, B, T, S, nh, nkv, hd, cap);
}

void emul_attn_backward(float *dq, float *dk, float *dv, const float *dout, const float *probs, const float *q,
                        const float *kc, const float *vc, int B, int T, int past, int nh, int nkv, int hd, int cap)
{
    int S = past + T, ldq = nh * hd, ldk = nkv * hd, rows = B * nh * T, nt = sp_km_row_threads(S);
    float *dp = calloc((size_t)rows * S, sizeof(float)), scale = 1.0f / sqrtf((float)hd);
    sp_gemm_plan pdp = sp_gemm_plan_scores(T, S, hd, ldq, ldk, 1.0f);
    sp_gemm_plan pkv = sp_gemm_plan_attn_kv_grad(T, S, hd, ldq, ldk);
    sp_gemm_plan pq = sp_gemm_plan_attn_out(T, S, hd, ldk, ldq, 1);
    emul_per_head(&pdp, vc, KV, dout, Q, dp, TS, B, T, S, nh, nkv, hd, cap);
    emul_per_head(&pkv, dout, Q, probs, TS, dv, KV, B, T, S, nh, nkv, hd, cap);
    for (int row = 0; row < rows; row++) {
        float *g = dp + (long)row * S, dot;
        const float *p = probs + (long)row * S;
        EMUL_BLOCK_SUM(dot, nt, sp_km_dot3_part(g, p, NULL, S, tid, nt));
        for (int s = 0; s < S; s++)
            g[s] = sp_km_softmax_bwd(p[s], g[s], dot, scale);
    }
    emul_per_head(&pq, kc, KV, dp, TS, dq, Q, B, T, S, nh, nkv, hd, cap);
    emul_per_head(&pkv, q, Q, dp, TS, dk, KV, B, T, S, nh, nkv, hd, cap);
    free(dp);
}

void emul_softmax(float *out, const float *inp, int N, int C)
{
    int nt = sp_km_row_threads(C);
    for (int row = 0; row < N; row++) {
        const float *x = inp + (long)row * C;
        float mx, sum;
        EMUL_BLOCK_MAX(mx, nt, sp_km_max_part(x, C, tid, nt));
        EMUL_BLOCK_SUM(sum, nt, sp_km_sumexp_part(x, mx, C, tid, nt));
        for (int c = 0; c < C; c++)
            out[(long)row * C + c] = sp_km_softmax(x[c], mx, sum);
    }
}

int emul_crossentropy(float *losses, float *dlogits, const float *dlosses, const float *logits, const int32_t *targets,
                      int N, int V)
{
    int nt = sp_km_row_threads(V), bad = 0;
    for (int row = 0; row < N; row++) {
        int t = targets[row];
        if (t < 0 || t >= V) {
            bad |= t >= V;
            if (losses)
                losses[row] = 0.0f;
            continue;
        }
        const float *x = logits + (long)row * V;
        float mx, sum;
        EMUL_BLOCK_MAX(mx, nt, sp_km_max_part(x, V, tid, nt));
        EMUL_BLOCK_SUM(sum, nt, sp_km_sumexp_part(x, mx, V, tid, nt));
        if (losses)
            losses[row] = sp_km_ce_loss(mx, sum, x[t]);
        else
            for (int c = 0; c < V; c++)
                dlogits[(long)row * V + c] += sp_km_ce_grad(dlosses[row], x[c], mx, sum, c == t);
    }
    return bad;
}

int emul_embedding(float *out, const int32_t *ids, const float *table, int V, int N, int C)
{
    int bad = 0;
    for (long e = 0; e < (long)N * C; e++)
        out[e] = sp_km_embed(table, ids, V, C, e, &bad);
    return bad;
}

void emul_wmat_mul(const sp_km_w *w, const float *X, float *Y, int B)
{
    int nt = sp_km_row_threads(w->cols);
    for (int r = 0; r < w->rows; r++)
        for (int b = 0; b < B; b++)
            EMUL_BLOCK_SUM(Y[(long)b * w->rows + r], nt, sp_km_w_dot_part(w, r, X + (long)b * w->cols, tid, nt));
}

/* Lane `lane` of warp part k: its chunks' sum for row r and x. */
static float emul_lane_sum(const sp_km_w *w, int r, const float *x, int k, int ks, int lane)
{
    long rb = sp_km_row_bytes(w);
    int nchunks = (int)(rb / SP_KM_CHUNK), ns = sp_km_row_scales(w), pv = sp_km_piece_vals(w->type);
    int np = sp_km_chunk_vals(w->type) / pv;
    float acc = 0.0f, wv[SP_KM_PIECE];
    for (int j = k * 32 + lane; j < nchunks; j += 32 * ks) {
        uint32_t v[4];
        memcpy(v, (const uint8_t *)w->q + r * rb + (long)j * SP_KM_CHUNK, sizeof v);
        float s = ns ? w->scale[(long)r * ns + sp_km_chunk_block(j)] : 0.0f;
        for (int p = 0; p < np; p++) {
            for (int t = 0; t < pv; t++)
                wv[t] = sp_km_piece_val(w->type, v, p, t, w->levels);
            acc += sp_km_piece_dot(w->type, wv, x + sp_km_piece_col(w->type, j, p), pv, s);
        }
    }
    return acc;
}

void emul_wmat_vec(const sp_km_w *w, const float *X, float *Y, int B, int ks)
{
    for (int r = 0; r < w->rows; r++)
        for (int b = 0; b < B; b++) {
            float y = 0.0f;
            for (int k = 0; k < ks; k++) {
                float lane[32], next[32];
                for (int l = 0; l < 32; l++)
                    lane[l] = emul_lane_sum(w, r, X + (long)b * w->cols, k, ks, l);
                for (int o = 16; o > 0; o >>= 1) { /* __shfl_xor_sync's butterfly */
                    for (int l = 0; l < 32; l++)
                        next[l] = lane[l] + lane[l ^ o];
                    memcpy(lane, next, sizeof lane);
                }
                y += lane[0];
            }
            Y[(long)b * w->rows + r] = y;
        }
}

void emul_wmat_gemm_bf16(const sp_km_w *w, const float *A, float *C, int B, int tile, int dx)
{
    int rows = w->rows, cols = w->cols;
    long na = (long)B * (dx ? rows : cols);
    float *a = emul_dup(A, (size_t)na), *wt = malloc((size_t)tile * cols * sizeof(float));
    emul_round(a, (size_t)na, SP_CU_BF16);
    for (int r0 = 0; r0 < rows; r0 += tile) {
        int tr = rows - r0 < tile ? rows - r0 : tile;
        for (int r = 0; r < tr; r++)
            for (int c = 0; c < cols; c++)
                wt[(long)r * cols + c] = sp_km_w_at(w, r0 + r, c);
        emul_round(wt, (size_t)tr * cols, SP_CU_BF16);
        sp_gemm_plan p = dx ? sp_gemm_plan_linear_dx_tile(B, cols, tr, rows) : sp_gemm_plan_linear_tile(B, cols, tr, rows);
        emul_gemm(&p, wt, dx ? a + r0 : a, dx ? C : C + r0);
    }
    free(a), free(wt);
}

void emul_attn_decode(float *out, const float *q, const float *kc, const float *vc, const float *slopes, int B, int nh,
                      int nkv, int hd, int cap, int len)
{
    int nt = sp_km_row_threads(len);
    float *p = malloc((size_t)len * sizeof(float));
    for (int bh = 0; bh < B * nh; bh++) {
        int h;
        long ldk = (long)nkv * hd, kv0 = sp_km_attn_block(bh, nh, nkv, hd, cap, &h);
        float scale = 1.0f / sqrtf((float)hd), slope = slopes ? slopes[h] : 0.0f, mx, sum;
        for (int s = 0; s < len; s++)
            p[s] = sp_km_attn_score(q + (long)bh * hd, kc + kv0 + s * ldk, hd, scale, slope, s, len - 1);
        EMUL_BLOCK_MAX(mx, nt, sp_km_max_part(p, len, tid, nt));
        EMUL_BLOCK_SUM(sum, nt, sp_km_sumexp_part(p, mx, len, tid, nt));
        float inv = 1.0f / sum;
        for (int s = 0; s < len; s++)
            p[s] = sp_km_attn_prob(p[s], mx, inv);
        for (int j = 0; j < hd; j++)
            out[(long)bh * hd + j] = sp_km_attn_out(p, vc + kv0, ldk, len, j);
    }
    free(p);
}

void emul_gemm(const sp_gemm_plan *p, const float *A, const float *B, float *C)
{
    for (int j = 0; j < p->n; j++)
        for (int i = 0; i < p->m; i++) {
            double s = 0;
            for (int l = 0; l < p->k; l++) {
                double a = p->ta ? A[(long)i * p->lda + l] : A[(long)l * p->lda + i];
                double b = p->tb ? B[(long)l * p->ldb + j] : B[(long)j * p->ldb + l];
                s += a * b;
            }
            float *c = &C[(long)j * p->ldc + i];
            *c = (float)((double)p->alpha * s + (p->beta != 0.0f ? (double)p->beta * *c : 0.0));
        }
}

void emul_linear_scale(float *scale, const float *X, const float *W, int N, int in, int out)
{
    for (int i = 0; i < N; i++)
        for (int o = 0; o < out; o++) {
            double s = 0;
            for (int c = 0; c < in; c++)
                s += fabs((double)X[(size_t)i * in + c] * W[(size_t)o * in + c]);
            scale[(size_t)i * out + o] = (float)s;
        }
}

void emul_round(float *x, size_t n, sp_cu_dtype t)
{
    for (size_t i = 0; t != SP_CU_F32 && i < n; i++)
        x[i] = t == SP_CU_BF16 ? sp_bf16_to_f32(sp_f32_to_bf16(x[i])) : sp_f16_to_f32(sp_f32_to_f16(x[i]));
}

double emul_gemm_tol(sp_cu_dtype t)
{
    return (t == SP_CU_BF16 ? 0x1p-7 : t == SP_CU_F16 ? 0x1p-10 : 0.0) + 0x1p-16;
}

double emul_mul_t_err(const float *a, const float *ref, const float *dy, const float *dec, int B, int rows, int C,
                      double rel)
{
    double worst = 0;
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++) {
            double s = 0;
            for (int i = 0; i < rows; i++)
                s += fabs((double)dy[(size_t)b * rows + i] * dec[(size_t)i * C + c]);
            size_t e = (size_t)b * C + c;
            double d = fabs((double)a[e] - ref[e]) / (rel * s + 1e-6 * fabs((double)ref[e]) + 1e-30);
            if (!(d <= worst))
                worst = isnan(d) ? INFINITY : d;
        }
    return worst;
}

double emul_err(const float *a, const float *b, size_t n, double abs_tol, double rel_tol)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]) / (abs_tol + rel_tol * fabs((double)b[i]));
        if (!(d <= worst))
            worst = isnan(d) ? INFINITY : d;
    }
    return worst;
}

double emul_rel_err(const float *a, const float *b, size_t n)
{
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        double x = fabs((double)a[i] - (double)b[i]);
        d = x > d || isnan(x) ? x : d;
        m = fabs((double)b[i]) > m ? fabs((double)b[i]) : m;
    }
    return isnan(d) ? INFINITY : d / (m > 0 ? m : 1);
}

float *emul_randn(sp_rng *r, size_t n, float sd)
{
    float *x = malloc((n ? n : 1) * sizeof(float));
    sp_rng_fill_normal(r, x, (long)n, sd);
    return x;
}

float *emul_dup(const float *x, size_t n)
{
    float *y = malloc((n ? n : 1) * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

void emul_attn_case(emul_attn *c, sp_rng *r, int B, int T, int past, int nh, int nkv, int hd, int cap,
                    const float *alibi)
{
    sp_attn_dims d = {.B = B, .T = T, .S = past + T, .past = past, .nh = nh, .nkv = nkv, .hd = hd, .kv_cap = cap,
                      .keep_probs = 1, .alibi = alibi};
    c->d = d;
    c->nq = (size_t)B * T * nh * hd, c->nk = (size_t)B * cap * nkv * hd, c->np = (size_t)B * nh * T * d.S;
    c->q = emul_randn(r, c->nq, 1.0f), c->kc = emul_randn(r, c->nk, 1.0f), c->vc = emul_randn(r, c->nk, 1.0f);
    c->out = malloc(c->nq * sizeof(float)), c->probs = malloc(c->np * sizeof(float));
    sp_attention_forward(c->out, c->probs, c->q, c->kc, c->vc, &c->d);
}

void emul_attn_free(emul_attn *c)
{
    free(c->q), free(c->kc), free(c->vc), free(c->out), free(c->probs);
}

int emul_open_gpu(const char *suite, sp_cuda **cu)
{
    char why[256];
    if (sp_cuda_device_count(why, sizeof why) <= 0) {
        printf("%s: skipped: no usable GPU (%s)\n", suite, why);
        return 77;
    }
    setenv("CK_FORK", "no", 1);
    sp_err err = {0};
    if (sp_cuda_open(cu, 0, &err) != SP_OK) {
        fprintf(stderr, "%s: %s\n", suite, err.msg);
        return 1;
    }
    printf("%s: running on %s\n", suite, sp_cuda_name(*cu));
    return 0;
}
