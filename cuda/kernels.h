/* kernels.h - the block's fused kernels on the device: norms, RoPE, ALiBi, activations, embedding, softmax and
 * cross-entropy, weight decoding (int8 / NF4 / bf16) and the decode products, decode attention over a KV cache.
 *
 * Every pointer is device memory; every call queues work on the context's stream and returns (a fault shows
 * at the next sync), except where it says it syncs. Each op computes what its CPU reference in core/ computes
 * (named beside it), with the arithmetic of kmath.h; the names, argument order and accumulate-into-gradients
 * convention are core/ops.h's (backward calls ADD into their gradients; NULL: not wanted). Shapes are
 * checked (SP_ERR_ARG). */
#ifndef SEPAL_CUDA_KERNELS_H
#define SEPAL_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "cuda_backend.h"
#include "kmath.h"

#ifdef __cplusplus
extern "C" {
#endif
#include "kern.h" /* a C header without linkage guards of its own */

/* Weights a decode step's norm or attention kernel asks L2 for while it runs, so that the product after it finds
 * them there while the memory would otherwise idle (sm_90 and later: cp.async.bulk.prefetch.L2, each block of the
 * kernel a share, asked before it waits for the kernel before it; elsewhere nothing): up to 3 ranges of device
 * memory, 16-byte aligned, each n rounded down to 16; a NULL p or an n of 0: none. A hint: no result changes. */
typedef struct sp_cuda_pf {
    const void *p[3];
    size_t n[3];
} sp_cuda_pf;

/* sp_rmsnorm_forward / _backward (rstd [N] may be NULL in the forward) */
sp_status sp_cuda_rmsnorm_fwd(sp_cuda *cu, float *out, float *rstd, const float *inp, const float *w, int N, int C,
                              float eps, sp_err *err);
/* The same, launched as a programmatic dependent of the stream's kernel before it when pdl (decode steps), asking
 * L2 for pf's weights (NULL: none) */
sp_status sp_cuda_rmsnorm_fwd_dep(sp_cuda *cu, float *out, float *rstd, const float *inp, const float *w, int N,
                                  int C, float eps, int pdl, const sp_cuda_pf *pf, sp_err *err);
sp_status sp_cuda_rmsnorm_bwd(sp_cuda *cu, float *dinp, float *dw, const float *dout, const float *inp,
                              const float *w, const float *rstd, int N, int C, sp_err *err);
/* sp_layernorm_forward / _backward (w, b may be NULL: ones, zeros) */
sp_status sp_cuda_layernorm_fwd(sp_cuda *cu, float *out, float *mean, float *rstd, const float *inp, const float *w,
                                const float *b, int N, int C, float eps, sp_err *err);
sp_status sp_cuda_layernorm_bwd(sp_cuda *cu, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                const float *w, const float *mean, const float *rstd, int N, int C, sp_err *err);

/* sp_rope_forward / _backward on x [B, T, nh, hd] at positions pos0 .. pos0 + T - 1; the angles come from
 * inv_freq [hd / 2] (sp_rope's, llama3 or linear scaling already applied, uploaded) instead of host tables.
 * out may equal inp. */
sp_status sp_cuda_rope_fwd(sp_cuda *cu, float *out, const float *inp, const float *inv_freq, int pos0, int B, int T,
                           int nh, int hd, sp_err *err);
sp_status sp_cuda_rope_bwd(sp_cuda *cu, float *dinp, const float *dout, const float *inv_freq, int pos0, int B, int T,
                           int nh, int hd, sp_err *err);
/* ALiBi (sp_attention_forward's alibi): scores [B, nh, T, S] of queries at past + t get slopes[h] * (s - (past + t))
 * over the visible keys s <= past + t. */
sp_status sp_cuda_alibi_add(sp_cuda *cu, float *scores, const float *slopes, int B, int nh, int T, int S, int past,
                            sp_err *err);

/* sp_swiglu_*, sp_gelu_* (tanh_approx 0) and sp_gelu_tanh_* (tanh_approx 1) over n elements */
sp_status sp_cuda_swiglu_fwd(sp_cuda *cu, float *out, const float *gate, const float *up, long n, sp_err *err);
sp_status sp_cuda_swiglu_bwd(sp_cuda *cu, float *dgate, float *dup, const float *dout, const float *gate,
                             const float *up, long n, sp_err *err);
sp_status sp_cuda_gelu_fwd(sp_cuda *cu, float *out, const float *inp, long n, int tanh_approx, sp_err *err);
sp_status sp_cuda_gelu_bwd(sp_cuda *cu, float *dinp, const float *dout, const float *inp, long n, int tanh_approx,
                           sp_err *err);

/* sp_embedding_forward from a [V, C] table; syncs, and an id outside [0, V) is SP_ERR_ARG (its row is zeros). */
sp_status sp_cuda_embedding_fwd(sp_cuda *cu, float *out, const int32_t *ids, const float *table, int V, int N, int C,
                                sp_err *err);
/* sp_softmax_forward over rows of C */
sp_status sp_cuda_softmax_fwd(sp_cuda *cu, float *out, const float *inp, int N, int C, sp_err *err);
/* sp_crossentropy_forward / _backward (a negative target: loss 0, no gradient); both sync, and a target >= V is
 * SP_ERR_ARG. */
sp_status sp_cuda_crossentropy_fwd(sp_cuda *cu, float *losses, const float *logits, const int32_t *targets, int N,
                                   int V, sp_err *err);
sp_status sp_cuda_crossentropy_bwd(sp_cuda *cu, float *dlogits, const float *dlosses, const float *logits,
                                   const int32_t *targets, int N, int V, sp_err *err);

/* A weight matrix on the device, in the encoding it had on the host (kern.h): f32, bf16, int8 (laid out row-major:
 * int8 [rows, cols] and scales [rows, ceil(cols / 32)]) or NF4 (kern.c's layout). */
typedef struct sp_cuda_wmat {
    sp_km_w w; /* type, shape, device pointers and NF4's levels, as the kernels take it */
    void *q;
    float *scale;
} sp_cuda_wmat;

/* Q8 matrix m's values and scales in the device layout (host memory: rows * cols int8, rows * ceil(cols / 32)). */
void sp_cuda_q8_rowmajor(const sp_qmat *m, int8_t *q, float *scales);
/* NF4 matrix m in the device layout (host memory): each row ceil(cols / 64) blocks of 32 bytes, the first half of
 * a block in the low nibbles (q: rows * that), and each block's step (scales: rows * ceil(cols / 64)); the
 * kernels' levels are kern.c's integers, so a weight decodes to the same float. */
sp_status sp_cuda_nf4_rowmajor(const sp_qmat *m, uint8_t *q, float *scales, sp_err *err);
/* The kernels' view of a matrix whose values q and scales live wherever the pointers say (host: tests). */
sp_km_w sp_cuda_km_w(sp_wtype type, int rows, int cols, const void *q, const float *scale);

sp_status sp_cuda_wmat_upload(sp_cuda *cu, sp_cuda_wmat *out, const sp_qmat *m, sp_err *err);
void sp_cuda_wmat_free(sp_cuda *cu, sp_cuda_wmat *w);
/* out [rows, cols] f32 = rows r0 .. r0 + rows - 1 decoded (sp_qmat_row). */
sp_status sp_cuda_dequant(sp_cuda *cu, float *out, const sp_cuda_wmat *w, int r0, int rows, sp_err *err);
/* The same rounded to bf16 (to nearest even; out: rows * cols uint16). */
sp_status sp_cuda_dequant_bf16(sp_cuda *cu, void *out, const sp_cuda_wmat *w, int r0, int rows, sp_err *err);
/* Y[B, rows] = X[B, cols] W^T (sp_qmat_mul). B <= 8: one fused decode kernel, W streamed once in 16-byte loads (the
 * one-weight-a-thread kernel where a row is not whole 16-byte chunks: kmath.h's sp_km_chunked), f32 arithmetic
 * on the decoded weights. Larger B: f32 W an f32 GEMM (cuBLAS); bf16 W a bf16 GEMM with fp32 accumulation, X
 * rounded to bf16 in the workspace; int8 / NF4 W up to 32 rows passes of the fused kernel, beyond that tiles of
 * rows decoded to bf16 in the workspace and bf16 GEMMs. Products through the workspace invalidate what the caller
 * held there. */
sp_status sp_cuda_wmat_mul(sp_cuda *cu, const sp_cuda_wmat *W, const float *X, float *Y, int B, sp_err *err);
/* Y[B, rows] = Xh W^T from X already rounded to bf16 (Xh [B, cols] uint16): the bf16 GEMMs of sp_cuda_wmat_mul's
 * path for more than 32 rows, without its cast (a fused kernel wrote Xh). bf16, int8 and NF4 W (int8 / NF4
 * decoded a tile of rows at a time in the workspace); SP_ERR_ARG for an f32 W. */
sp_status sp_cuda_wmat_mul_h(sp_cuda *cu, const sp_cuda_wmat *W, const void *Xh, float *Y, int B, sp_err *err);
/* dX[B, cols] += dYh[B, rows] W (acc 1), or = (acc 0: dX need not be cleared), from dY already rounded to bf16: the
 * bf16 GEMMs of sp_cuda_wmat_mul_t_acc without its cast; bf16, int8 and NF4 W as sp_cuda_wmat_mul_h. */
sp_status sp_cuda_wmat_mul_t_h(sp_cuda *cu, const sp_cuda_wmat *W, const void *dYh, float *dX, int B, int acc,
                               sp_err *err);

/* The decode step's fused products: sp_cuda_wmat_mul's fused kernels (B <= 8), the same sums to the bit, with more
 * done in the launch. n (1 to 3) matrices of one encoding and width over the same X: Y[i] [B, rows_i] = X W[i]^T
 * (q, k and v in one launch); swiglu 1 (n 2, W[0] the gate and W[1] the up projection, of one shape): Y[0] =
 * swiglu(X W[0]^T, X W[1]^T) (Y[1] unused); bias [rows] and res [B, rows] (n 1; NULL: none): Y[0] = (X W^T + bias)
 * + res, block.c's order. pdl 1: launched as a programmatic dependent of the stream's kernel before it (it starts
 * streaming W while that one finishes; only where the device and the build support it). SP_ERR_ARG otherwise.
 * All the fused kernels stream W as L2's first to evict (sp_cuda_wmat_tune_stream). pos [npos] (device memory;
 * NULL: none): each advanced by one once the products' input is in (a decode step's positions, which its attention
 * read before: the step's last launch advances them instead of a kernel of its own). */
typedef struct sp_cuda_dmul {
    const sp_cuda_wmat *W[3];
    float *Y[3];
    int n, swiglu, pdl;
    const float *bias, *res;
    int *pos, npos;
} sp_cuda_dmul;
sp_status sp_cuda_wmat_mul_fused(sp_cuda *cu, const sp_cuda_dmul *m, const float *X, int B, sp_err *err);
/* A decode step's experts (moe.cu): the products of sp_cuda_wmat_mul_fused's kernel for experts chosen on the device,
 * so that nothing waits for the host. For g < ng, e = used[g] (an expert; -1: none, the blocks of g do nothing),
 * its rows o = off[e] .. off[e + 1] - 1 of X [*, cols] (at most `rows` of them, rows <= 8) and its matrix W_e =
 * tab[3 e + which] (device memory: the experts' matrices, every one of W's encoding and shape; W is one of them,
 * on the host): Y[o ..] = X[o ..] W_e^T, streamed in 16-byte loads (L2's first to evict) as the dense products'
 * are, each row summed as sp_cuda_wmat_mul_fused sums it for `rows` rows of X; swiglu 1: Y = swiglu(X W_e^T,
 * X U_e^T) with U_e = tab[3 e + which + 1] (the up projection), the two products' sums also written to G and U
 * where not NULL (what a backward reads). SP_ERR_UNSUPPORTED where W's rows are not whole 16-byte chunks or X is not 16-byte
 * aligned (sp_km_chunked: every expert's matrix must be), SP_ERR_ARG for bad arguments. */
typedef struct sp_cuda_smul {
    const sp_km_w *tab;
    const int32_t *used, *off;
    int which, ng, rows, swiglu;
    float *Y, *G, *U;
} sp_cuda_smul;
sp_status sp_cuda_wmat_mul_slots(sp_cuda *cu, const sp_cuda_wmat *W, const sp_cuda_smul *m, const float *X,
                                 sp_err *err);
/* dX[B, cols] += dY[B, rows] W (sp_qmat_mul_t_acc: the input gradient through frozen weights): f32 W an f32 GEMM;
 * the others bf16 GEMMs with fp32 accumulation (dY rounded to bf16, int8 / NF4 decoded to bf16 a tile of rows at
 * a time), through the workspace. */
sp_status sp_cuda_wmat_mul_t_acc(sp_cuda *cu, const sp_cuda_wmat *W, const float *dY, float *dX, int B, sp_err *err);
/* Benchmarks and tests: the fused decode kernel's rows a warp (1, 2 or 4) and warps a row (1, 2 or 4), and the
 * rows of a decoded tile, instead of the products' own choice (0: their own). Process-wide; not for concurrent
 * use. */
void sp_cuda_wmat_tune(int rows_per_warp, int warps_per_row, int tile_rows);
/* The same for how the fused decode kernels stream W: as the lines L2 evicts first (1, and negative: the default)
 * or as any others (0). */
void sp_cuda_wmat_tune_stream(int evict_first);
/* The same for how the decode kernels (dense and experts') multiply int8 and NF4 weights with one row of X: a row's
 * values decoded as its product takes them (1; fewer registers a thread, so more blocks an SM) or all of a chunk's
 * rows decoded first (0, the kernels before); negative: the default, 1 unless SEPAL_DECODE_LIGHT=0 is in the
 * environment. The same bits either way. */
void sp_cuda_wmat_tune_light(int on);

/* Decode attention (sp_attention_forward with T = 1, past = len - 1): out, q [B, nh * hd]; the caches
 * [B, cap, nkv, hd] hold len positions (the step's own included); GQA / MQA by nh / nkv; slopes [nh] for ALiBi
 * or NULL. Scratch: B * nh * len floats of the workspace. */
sp_status sp_cuda_attn_decode(sp_cuda *cu, float *out, const float *q, const float *kc, const float *vc,
                              const float *slopes, int B, int nh, int nkv, int hd, int cap, int len, sp_err *err);
/* A decode step's attention from the step's projections (sp_attention_forward with T = 1 after RoPE and the cache's
 * append): row b's q [N, nh * hd], k and v [N, nkv * hd] at position pos[b] (device memory, so a graph replays any
 * step) rotated (inv_freq [hd / 2], or NULL: no RoPE), its key and value stored at pos[b] of the row's caches kp[b],
 * vp[b] ([cap, nkv * hd] each; device tables), and out [N, nh * hd] = attention over positions 0 .. pos[b] (ALiBi:
 * slopes [nh] or NULL). scratch: N * nh * cap floats. pdl: launched as a programmatic dependent (sp_cuda_dmul); pf:
 * weights asked of L2 meanwhile (NULL: none). */
sp_status sp_cuda_rope_attn_decode(sp_cuda *cu, float *out, const float *q, const float *k, const float *v,
                                   float *const *kp, float *const *vp, const float *inv_freq, const float *slopes,
                                   float *scratch, const int *pos, int N, int nh, int nkv, int hd, int cap, int pdl,
                                   const sp_cuda_pf *pf, sp_err *err);
/* Benchmarks and tests: the keys a warp of sp_cuda_rope_attn_decode scores at once (their loads in flight together;
 * 8 or 16, else the default 4). Each key's score is summed as alone, so any choice gives the same bits.
 * Process-wide; not for concurrent use. */
void sp_cuda_attn_tune(int keys);
/* Prefill / forward attention (sp_attention_forward with keep_probs): q, out [B, T, nh * hd]; the caches
 * [B, cap, nkv, hd] hold past + T positions (this step's appended); probs [B, nh, T, past + T] receives the
 * probabilities (kept for a backward). Scores and outputs through cuBLAS, a GEMM a head (GQA / MQA by nh / nkv),
 * then ALiBi (slopes [nh] or NULL) and the causal softmax by kernels. */
sp_status sp_cuda_attn_prefill(sp_cuda *cu, float *out, float *probs, const float *q, const float *kc, const float *vc,
                               const float *slopes, int B, int T, int past, int nh, int nkv, int hd, int cap,
                               sp_err *err);
/* The backward of sp_cuda_attn_prefill (sp_attention_backward): from dout [B, T, nh * hd] and the forward's probs,
 * ADDS into dq [B, T, nh * hd] and dk, dv (caches' layout [B, cap, nkv, hd]); any of the three may be NULL. Scratch:
 * B * nh * T * (past + T) floats of the workspace. */
sp_status sp_cuda_attn_backward(sp_cuda *cu, float *dq, float *dk, float *dv, const float *dout, const float *probs,
                                const float *q, const float *kc, const float *vc, int B, int T, int past, int nh,
                                int nkv, int hd, int cap, sp_err *err);
/* The causal softmax of scores [rows, S] in place, rows = B * nh * T (sp_km_causal_len keys each, zeros after). */
sp_status sp_cuda_causal_softmax(sp_cuda *cu, float *scores, long rows, int T, int S, int past, sp_err *err);
/* Appends a step's keys or values x [B, T, nkv * hd] to a cache [B, cap, nkv * hd] at positions len .. len + T - 1. */
sp_status sp_cuda_kv_append(sp_cuda *cu, float *cache, const float *x, int B, int T, int cap, int len, int row,
                            sp_err *err);
/* Deep prompts: h[b, t] += prompt[b, t0 + t] for the positions t0 + t < P of h [B, T, H] (prompt [B, P, H];
 * prompt.cu, the server's add_prompt on the device). */
sp_status sp_cuda_add_prompt(sp_cuda *cu, float *h, const float *prompt, int B, int T, int t0, int P, int H,
                             sp_err *err);

#ifdef __cplusplus
}
#endif
#endif
