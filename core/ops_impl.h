/* ops_impl.h - body of the ops, included twice by ops.c: REAL = float (SFX _f32) and double (_f64).
 * Not a public header. */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define FN(name) CAT(name, SFX)

/* ---------------------------------------------------------------------------------------------- */
/* embedding */

void FN(sp_embedding_forward)(REAL *out, const int32_t *ids, const REAL *table, int N, int C)
{
    for (int i = 0; i < N; i++)
        memcpy(out + (long)i * C, table + (long)ids[i] * C, (size_t)C * sizeof(REAL));
}

void FN(sp_embedding_backward)(REAL *dtable, const REAL *dout, const int32_t *ids, int N, int C)
{
    for (int i = 0; i < N; i++) {
        REAL *d = dtable + (long)ids[i] * C;
        const REAL *g = dout + (long)i * C;
        for (int c = 0; c < C; c++)
            d[c] += g[c];
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* RMSNorm: y = x * rstd * w, rstd = (mean(x^2) + eps)^-1/2 */

void FN(sp_rmsnorm_forward)(REAL *out, REAL *rstd, const REAL *inp, const REAL *w, int N, int C, float eps)
{
    for (int i = 0; i < N; i++) {
        const REAL *x = inp + (long)i * C;
        REAL *y = out + (long)i * C;
        REAL ss = 0;
        for (int c = 0; c < C; c++)
            ss += x[c] * x[c];
        REAL r = (REAL)1 / SQRT(ss / (REAL)C + (REAL)eps);
        for (int c = 0; c < C; c++)
            y[c] = x[c] * r * w[c];
        if (rstd)
            rstd[i] = r;
    }
}

void FN(sp_rmsnorm_backward)(REAL *dinp, REAL *dw, const REAL *dout, const REAL *inp, const REAL *w,
                             const REAL *rstd, int N, int C)
{
    for (int i = 0; i < N; i++) {
        const REAL *x = inp + (long)i * C, *dy = dout + (long)i * C;
        REAL r = rstd[i];
        /* dx_c = r * w_c * dy_c - r^3 / C * x_c * sum_k(dy_k w_k x_k) */
        REAL dot = 0;
        for (int c = 0; c < C; c++)
            dot += dy[c] * w[c] * x[c];
        REAL k = r * r * r * dot / (REAL)C;
        if (dinp) {
            REAL *dx = dinp + (long)i * C;
            for (int c = 0; c < C; c++)
                dx[c] += r * w[c] * dy[c] - k * x[c];
        }
        if (dw)
            for (int c = 0; c < C; c++)
                dw[c] += dy[c] * x[c] * r;
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* LayerNorm: y = (x - mean) * rstd * w + b */

void FN(sp_layernorm_forward)(REAL *out, REAL *mean, REAL *rstd, const REAL *inp, const REAL *w, const REAL *b,
                              int N, int C, float eps)
{
    for (int i = 0; i < N; i++) {
        const REAL *x = inp + (long)i * C;
        REAL *y = out + (long)i * C;
        REAL m = 0, v = 0;
        for (int c = 0; c < C; c++)
            m += x[c];
        m /= (REAL)C;
        for (int c = 0; c < C; c++)
            v += (x[c] - m) * (x[c] - m);
        REAL r = (REAL)1 / SQRT(v / (REAL)C + (REAL)eps);
        for (int c = 0; c < C; c++)
            y[c] = (x[c] - m) * r * (w ? w[c] : 1) + (b ? b[c] : 0);
        mean[i] = m;
        rstd[i] = r;
    }
}

void FN(sp_layernorm_backward)(REAL *dinp, REAL *dw, REAL *db, const REAL *dout, const REAL *inp, const REAL *w,
                               const REAL *mean, const REAL *rstd, int N, int C)
{
    for (int i = 0; i < N; i++) {
        const REAL *x = inp + (long)i * C, *dy = dout + (long)i * C;
        REAL m = mean[i], r = rstd[i];
        /* with xhat = (x - m) r and g = dy * w: dx = r * (g - mean(g) - xhat * mean(g * xhat)) */
        REAL gmean = 0, gxmean = 0;
        for (int c = 0; c < C; c++) {
            REAL g = dy[c] * (w ? w[c] : 1);
            gmean += g;
            gxmean += g * (x[c] - m) * r;
        }
        gmean /= (REAL)C;
        gxmean /= (REAL)C;
        for (int c = 0; c < C; c++) {
            REAL xhat = (x[c] - m) * r;
            if (dinp)
                dinp[(long)i * C + c] += r * (dy[c] * (w ? w[c] : 1) - gmean - xhat * gxmean);
            if (dw)
                dw[c] += dy[c] * xhat;
            if (db)
                db[c] += dy[c];
        }
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* linear: out[N,Cout] = inp[N,Cin] W[Cout,Cin]^T + bias[Cout] */

void FN(sp_linear_forward)(REAL *out, const REAL *inp, const REAL *W, const REAL *bias, int N, int Cin, int Cout)
{
    if (N == 1) /* decode: a matrix-vector product streams the weights once */
        GEMV(CblasRowMajor, CblasNoTrans, Cout, Cin, 1, W, Cin, inp, 1, 0, out, 1);
    else
        GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, N, Cout, Cin, 1, inp, Cin, W, Cin, 0, out, Cout);
    if (bias)
        for (int i = 0; i < N; i++)
            for (int o = 0; o < Cout; o++)
                out[(long)i * Cout + o] += bias[o];
}

void FN(sp_linear_backward)(REAL *dinp, REAL *dW, REAL *dbias, const REAL *dout, const REAL *inp, const REAL *W,
                            int N, int Cin, int Cout)
{
    if (dinp) /* dinp[N,Cin] += dout[N,Cout] W[Cout,Cin] */
        GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, Cin, Cout, 1, dout, Cout, W, Cin, 1, dinp, Cin);
    if (dW) /* dW[Cout,Cin] += dout^T inp */
        GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, Cout, Cin, N, 1, dout, Cout, inp, Cin, 1, dW, Cin);
    if (dbias)
        for (int i = 0; i < N; i++)
            for (int o = 0; o < Cout; o++)
                dbias[o] += dout[(long)i * Cout + o];
}

/* ---------------------------------------------------------------------------------------------- */
/* RoPE, rotate-half form (HF Llama): for i < hd/2, (x_i, x_{i+hd/2}) is rotated by angle pos * f_i.
 * cos/sin are [T, hd/2] for the positions of the T rows. In-place (out == inp) is allowed. */

void FN(sp_rope_forward)(REAL *out, const REAL *inp, const float *cos, const float *sin, int B, int T, int nh, int hd)
{
    int half = hd / 2;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *c = cos + (long)t * half, *s = sin + (long)t * half;
            for (int h = 0; h < nh; h++) {
                long base = (((long)b * T + t) * nh + h) * hd;
                for (int i = 0; i < half; i++) {
                    REAL x1 = inp[base + i], x2 = inp[base + i + half];
                    out[base + i] = x1 * (REAL)c[i] - x2 * (REAL)s[i];
                    out[base + i + half] = x2 * (REAL)c[i] + x1 * (REAL)s[i];
                }
            }
        }
}

void FN(sp_rope_backward)(REAL *dinp, const REAL *dout, const float *cos, const float *sin, int B, int T, int nh,
                          int hd)
{
    int half = hd / 2;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *c = cos + (long)t * half, *s = sin + (long)t * half;
            for (int h = 0; h < nh; h++) {
                long base = (((long)b * T + t) * nh + h) * hd;
                for (int i = 0; i < half; i++) {
                    REAL g1 = dout[base + i], g2 = dout[base + i + half];
                    dinp[base + i] += g1 * (REAL)c[i] + g2 * (REAL)s[i];
                    dinp[base + i + half] += g2 * (REAL)c[i] - g1 * (REAL)s[i];
                }
            }
        }
}

/* ---------------------------------------------------------------------------------------------- */
/* causal attention with GQA, a position offset and an optional KV cache (see sp_attn_dims) */

/* Softmax of row t over keys 0..past+t; the masked tail becomes 0. Rows SM_ROWS at a time: each row's maximum
 * and sum are its own chains, in key order as one row alone takes them, and the rows' chains interleave (a sum's
 * adds wait on each other; eight rows' do not), so every row has the bits it has alone. */
#ifndef SM_ROWS
#define SM_ROWS 8
#endif

static void FN(softmax_exp)(REAL *p, int n, REAL mx)
{
    for (int s = 0; s < n; s++)
        p[s] = VEXP(p[s] - mx);
}

static void FN(softmax_scale)(REAL *p, int n, int S, REAL sum)
{
    REAL inv = (REAL)1 / sum;
    for (int s = 0; s < n; s++)
        p[s] *= inv;
    for (int s = n; s < S; s++)
        p[s] = 0;
}

static void FN(masked_softmax_group)(REAL *P, int S, int n0)
{
    REAL mx[SM_ROWS], sum[SM_ROWS];
    for (int r = 0; r < SM_ROWS; r++)
        mx[r] = P[(long)r * S];
    for (int s = 1; s < n0; s++) /* every row has keys 0..n0-1; row r has n0 + r */
        #pragma GCC unroll 8
        for (int r = 0; r < SM_ROWS; r++)
            mx[r] = P[(long)r * S + s] > mx[r] ? P[(long)r * S + s] : mx[r];
    for (int r = 0; r < SM_ROWS; r++) {
        REAL *p = P + (long)r * S;
        for (int s = n0; s < n0 + r; s++)
            mx[r] = p[s] > mx[r] ? p[s] : mx[r];
        FN(softmax_exp)(p, n0 + r, mx[r]);
        sum[r] = 0;
    }
    for (int s = 0; s < n0; s++)
        #pragma GCC unroll 8
        for (int r = 0; r < SM_ROWS; r++)
            sum[r] += P[(long)r * S + s];
    for (int r = 0; r < SM_ROWS; r++) {
        REAL *p = P + (long)r * S;
        for (int s = n0; s < n0 + r; s++)
            sum[r] += p[s];
        FN(softmax_scale)(p, n0 + r, S, sum[r]);
    }
}

void FN(sp_masked_softmax)(REAL *P, int T, int S, int past)
{
    int t = 0;
    for (; t + SM_ROWS <= T; t += SM_ROWS)
        FN(masked_softmax_group)(P + (long)t * S, S, past + t + 1);
    for (; t < T; t++) {
        REAL *p = P + (long)t * S;
        int n = past + t + 1;
        REAL mx = p[0];
        for (int s = 1; s < n; s++)
            mx = p[s] > mx ? p[s] : mx;
        FN(softmax_exp)(p, n, mx);
        REAL sum = 0;
        for (int s = 0; s < n; s++)
            sum += p[s];
        FN(softmax_scale)(p, n, S, sum);
    }
}

/* + slope * (key position - query position) over the visible keys of each row (ALiBi). */
static void FN(alibi_rows)(REAL *P, int T, int S, int past, float slope)
{
    for (int t = 0; t < T; t++) {
        REAL *p = P + (long)t * S;
        int n = past + t + 1;
        for (int s = 0; s < n; s++)
            p[s] += (REAL)slope * (REAL)(s - (past + t));
    }
}

void FN(sp_attention_forward_rows)(REAL *out, REAL *probs, const REAL *q, const REAL *k, const REAL *v,
                                   const sp_attn_dims *d, int tq, long u0, long u1)
{
    int T = d->T, S = d->S, hd = d->hd, ldq = d->nh * hd, ldk = d->nkv * hd, group = d->nh / d->nkv;
    int nc = (T + tq - 1) / tq;
    REAL scale = (REAL)1 / SQRT((REAL)hd);
    for (long u = u0; u < u1; u++) {
        int b = (int)(u / nc / d->nh), h = (int)(u / nc % d->nh), t0 = (int)(u % nc) * tq;
        int n = T - t0 < tq ? T - t0 : tq;
        int Sc = d->past + t0 + n < S ? d->past + t0 + n : S; /* the keys these rows see (causal) */
        const REAL *Q = q + ((long)b * T + t0) * ldq + (long)h * hd;
        const REAL *K = k + (long)b * d->kv_cap * ldk + (long)(h / group) * hd;
        const REAL *Vv = v + (long)b * d->kv_cap * ldk + (long)(h / group) * hd;
        REAL *P = d->keep_probs ? probs + (((long)b * d->nh + h) * T + t0) * S : probs;
        REAL *O = out + ((long)b * T + t0) * ldq + (long)h * hd;
        GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, n, Sc, hd, scale, Q, ldq, K, ldk, 0, P, S);
        if (d->alibi)
            FN(alibi_rows)(P, n, S, d->past + t0, d->alibi[h]);
        FN(sp_masked_softmax)(P, n, S, d->past + t0);
        GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hd, Sc, 1, P, S, Vv, ldk, 0, O, ldq);
    }
}

void FN(sp_attention_forward)(REAL *out, REAL *probs, const REAL *q, const REAL *k, const REAL *v,
                              const sp_attn_dims *d)
{
    FN(sp_attention_forward_rows)(out, probs, q, k, v, d, d->T, 0, (long)d->B * d->nh);
}

void FN(sp_attention_backward)(REAL *dq, REAL *dk, REAL *dv, REAL *scratch, const REAL *dout, const REAL *probs,
                               const REAL *q, const REAL *k, const REAL *v, const sp_attn_dims *d)
{
    int T = d->T, S = d->S, hd = d->hd, ldq = d->nh * hd, ldk = d->nkv * hd, group = d->nh / d->nkv;
    REAL scale = (REAL)1 / SQRT((REAL)hd);
    for (int b = 0; b < d->B; b++)
        for (int h = 0; h < d->nh; h++) {
            long qoff = (long)b * T * ldq + (long)h * hd, koff = (long)b * d->kv_cap * ldk + (long)(h / group) * hd;
            const REAL *P = probs + ((long)b * d->nh + h) * T * S, *dO = dout + qoff;
            REAL *dP = scratch;
            /* dP = dO V^T, dV += P^T dO */
            GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, T, S, hd, 1, dO, ldq, v + koff, ldk, 0, dP, S);
            if (dv)
                GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, S, hd, T, 1, P, S, dO, ldq, 1, dv + koff, ldk);
            /* softmax backward: dScore = P * (dP - sum(dP * P)), then the 1/sqrt(hd) scale */
            for (int t = 0; t < T; t++) {
                const REAL *p = P + (long)t * S;
                REAL *g = dP + (long)t * S, dot = 0;
                for (int s = 0; s < S; s++)
                    dot += g[s] * p[s];
                for (int s = 0; s < S; s++)
                    g[s] = p[s] * (g[s] - dot) * scale;
            }
            if (dq) /* dQ += dScore K */
                GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hd, S, 1, dP, S, k + koff, ldk, 1, dq + qoff, ldq);
            if (dk) /* dK += dScore^T Q */
                GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, S, hd, T, 1, dP, S, q + qoff, ldq, 1, dk + koff, ldk);
        }
}

/* ---------------------------------------------------------------------------------------------- */
/* activations */

void FN(sp_swiglu_forward)(REAL *out, const REAL *gate, const REAL *up, long n)
{
    for (long i = 0; i < n; i++) {
        REAL g = gate[i];
        out[i] = g / ((REAL)1 + VEXP(-g)) * up[i];
    }
}

void FN(sp_swiglu_backward)(REAL *dgate, REAL *dup, const REAL *dout, const REAL *gate, const REAL *up, long n)
{
    if (dup && dgate) /* one loop each way, without branches: they vectorise */
        for (long i = 0; i < n; i++) {
            REAL g = gate[i], sg = (REAL)1 / ((REAL)1 + VEXP(-g));
            dup[i] += dout[i] * (g * sg);
            dgate[i] += dout[i] * up[i] * sg * ((REAL)1 + g * ((REAL)1 - sg)); /* d silu / dg */
        }
    else
        for (long i = 0; i < n; i++) {
            REAL g = gate[i], sg = (REAL)1 / ((REAL)1 + VEXP(-g)), silu = g * sg;
            if (dup)
                dup[i] += dout[i] * silu;
            if (dgate)
                dgate[i] += dout[i] * up[i] * sg * ((REAL)1 + g * ((REAL)1 - sg));
        }
}

void FN(sp_gelu_forward)(REAL *out, const REAL *inp, long n)
{
    for (long i = 0; i < n; i++)
        out[i] = (REAL)0.5 * inp[i] * ((REAL)1 + VERF(inp[i] * (REAL)0.70710678118654752440));
}

void FN(sp_gelu_backward)(REAL *dinp, const REAL *dout, const REAL *inp, long n)
{
    for (long i = 0; i < n; i++) {
        REAL x = inp[i];
        REAL cdf = (REAL)0.5 * ((REAL)1 + VERF(x * (REAL)0.70710678118654752440));
        REAL pdf = (REAL)0.39894228040143267794 * VEXP((REAL)-0.5 * x * x);
        dinp[i] += dout[i] * (cdf + x * pdf);
    }
}

/* The tanh approximation: 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3), which the
 * vectorised exp computes without tanh's call. */
#define GELU_K ((REAL)0.79788456080286535588) /* sqrt(2/pi) */
void FN(sp_gelu_tanh_forward)(REAL *out, const REAL *inp, long n)
{
    for (long i = 0; i < n; i++) {
        REAL x = inp[i];
        out[i] = x / ((REAL)1 + VEXP((REAL)-2 * GELU_K * (x + (REAL)0.044715 * x * x * x)));
    }
}

void FN(sp_gelu_tanh_backward)(REAL *dinp, const REAL *dout, const REAL *inp, long n)
{
    /* d/dx x s(2u) = s + 2 x s (1 - s) u', with 1 - s = e s (e = exp(-2u)): no cancellation where s nears 1;
     * e is kept finite (exponent <= 80) so that e s stays a number where s underflows */
    for (long i = 0; i < n; i++) {
        REAL x = inp[i], u = GELU_K * (x + (REAL)0.044715 * x * x * x), m = (REAL)-2 * u;
        REAL e = VEXP(m < (REAL)80 ? m : (REAL)80), s = (REAL)1 / ((REAL)1 + e);
        REAL du = GELU_K * ((REAL)1 + (REAL)3 * (REAL)0.044715 * x * x);
        dinp[i] += dout[i] * (s + (REAL)2 * x * (e * s) * s * du);
    }
}
#undef GELU_K

/* ---------------------------------------------------------------------------------------------- */
/* softmax and cross-entropy */

void FN(sp_softmax_forward)(REAL *out, const REAL *inp, int N, int C)
{
    for (int i = 0; i < N; i++) {
        const REAL *x = inp + (long)i * C;
        REAL *y = out + (long)i * C, mx = x[0], sum = 0;
        for (int c = 1; c < C; c++)
            mx = x[c] > mx ? x[c] : mx;
        for (int c = 0; c < C; c++) {
            y[c] = EXP(x[c] - mx);
            sum += y[c];
        }
        for (int c = 0; c < C; c++)
            y[c] /= sum;
    }
}

void FN(sp_softmax_backward)(REAL *dinp, const REAL *dout, const REAL *out, int N, int C)
{
    for (int i = 0; i < N; i++) {
        const REAL *y = out + (long)i * C, *dy = dout + (long)i * C;
        REAL dot = 0;
        for (int c = 0; c < C; c++)
            dot += dy[c] * y[c];
        for (int c = 0; c < C; c++)
            dinp[(long)i * C + c] += y[c] * (dy[c] - dot);
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* mixture-of-experts routing */

void FN(sp_moe_route_forward)(REAL *w, int32_t *idx, const REAL *logits, int N, int E, int K)
{
    for (int n = 0; n < N; n++) {
        const REAL *x = logits + (long)n * E;
        REAL *wn = w + (long)n * K;
        int32_t *in = idx + (long)n * K;
        REAL mx = x[0], sum = 0;
        for (int e = 1; e < E; e++)
            mx = x[e] > mx ? x[e] : mx;
        for (int e = 0; e < E; e++)
            sum += EXP(x[e] - mx);
        /* the K largest, in order (E is small: a selection pass per pick) */
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k; j++)
                    taken |= in[j] == e;
                if (!taken && (best < 0 || x[e] > x[best]))
                    best = e;
            }
            in[k] = best;
            wn[k] = EXP(x[best] - mx) / sum; /* the softmax probability, as transformers computes it */
        }
        REAL tot = 0;
        for (int k = 0; k < K; k++)
            tot += wn[k];
        for (int k = 0; k < K; k++)
            wn[k] /= tot;
    }
}

void FN(sp_moe_route_backward)(REAL *dlogits, const REAL *dw, const REAL *w, const int32_t *idx, int N, int E,
                               int K)
{
    for (int n = 0; n < N; n++) {
        const REAL *wn = w + (long)n * K, *gn = dw + (long)n * K;
        REAL dot = 0;
        for (int k = 0; k < K; k++)
            dot += wn[k] * gn[k];
        for (int k = 0; k < K; k++)
            dlogits[(long)n * E + idx[(long)n * K + k]] += wn[k] * (gn[k] - dot);
    }
}

/* losses[i] = logsumexp(logits[i]) - logits[i][targets[i]]; a negative target is ignored (loss 0). */
void FN(sp_crossentropy_forward)(REAL *losses, const REAL *logits, const int32_t *targets, int N, int V)
{
    for (int i = 0; i < N; i++) {
        const REAL *x = logits + (long)i * V;
        if (targets[i] < 0) {
            losses[i] = 0;
            continue;
        }
        REAL mx = x[0], sum = 0;
        for (int c = 1; c < V; c++)
            mx = x[c] > mx ? x[c] : mx;
        for (int c = 0; c < V; c++)
            sum += EXP(x[c] - mx);
        losses[i] = LOG(sum) + mx - x[targets[i]];
    }
}

void FN(sp_crossentropy_backward)(REAL *dlogits, const REAL *dlosses, const REAL *logits, const int32_t *targets,
                                  int N, int V)
{
    for (int i = 0; i < N; i++) {
        if (targets[i] < 0)
            continue;
        const REAL *x = logits + (long)i * V;
        REAL *dx = dlogits + (long)i * V, mx = x[0], sum = 0;
        for (int c = 1; c < V; c++)
            mx = x[c] > mx ? x[c] : mx;
        for (int c = 0; c < V; c++)
            sum += EXP(x[c] - mx);
        for (int c = 0; c < V; c++)
            dx[c] += dlosses[i] * (EXP(x[c] - mx) / sum - (c == targets[i]));
    }
}

#undef FN
#undef CAT
#undef CAT_
