/* flash.h - flash attention on the device (issue 27): the no-cache forward and the prefill (causal, GQA / MQA,
 * ALiBi, past positions from a cache) and its backward to the input, on bf16 tensor cores (mma.sync m16n8k16,
 * fp32 accumulation) with the online softmax: no scores in device memory. It computes what sp_cuda_attn_prefill /
 * sp_cuda_attn_backward compute (the CPU's sp_attention_forward / _backward) with q, k, v, dout rounded to bf16 and
 * the probabilities rounded to bf16 before their products (2^-9 relative each); the rest in f32.
 *
 * Shapes are kernels.h's: q, out, dout [B, T, nh * hd]; the caches (or a forward's own keys and values, cap = T)
 * [B, cap, nkv * hd] holding past + T positions, query t at position past + t seeing keys 0 .. past + t; slopes
 * [nh] for ALiBi or NULL. Head sizes up to 128 (sp_cuda_flash_ok); smaller ones run zero-padded to 64 or 128. The
 * operands are packed to bf16 in the context's workspace first (invalidating what the caller held there).
 * Deterministic: every output element is written by one thread, no atomics. */
#ifndef SEPAL_CUDA_FLASH_H
#define SEPAL_CUDA_FLASH_H

#include "cuda_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the flash kernels take heads of hd values (1 <= hd <= 128). */
int sp_cuda_flash_ok(int hd);

/* The forward: out [B, T, nh * hd] f32 and / or outh (the same in bf16, a product's input); either may be NULL.
 * lse [B, nh, T] receives each row's log2-sum-exp2 of its scaled scores (the backward's input; NULL: not kept). */
sp_status sp_cuda_flash_fwd(sp_cuda *cu, float *out, void *outh, float *lse, const float *q, const float *kc,
                            const float *vc, const float *slopes, int B, int T, int past, int nh, int nkv, int hd,
                            int cap, sp_err *err);

/* The backward from the forward's out and lse into dq [B, T, nh * hd] and dk, dv (the caches' layout
 * [B, cap, nkv * hd], positions 0 .. past + T - 1): added into them when acc, else written (every element of dq,
 * and of dk and dv at positions 0 .. past + T - 1; nothing to clear first). dS recomputed from lse
 * (FlashAttention-2's backward): one kernel a query tile for dq, one a key tile and query head for dk, dv (GQA's
 * heads summed after). */
sp_status sp_cuda_flash_bwd(sp_cuda *cu, float *dq, float *dk, float *dv, const float *dout, const float *out,
                            const float *lse, const float *q, const float *kc, const float *vc, const float *slopes,
                            int B, int T, int past, int nh, int nkv, int hd, int cap, int acc, sp_err *err);

/* The no-cache forward and its backward (a training forward: past 0, its own keys and values) over operands
 * packed once: sp_cuda_flash_pack writes q, k and v (f32 [B, T, heads * hd]) as the kernels take them, RoPE at
 * positions pos0 .. applied to q and k on the way when inv_freq is given (sp_cuda_rope_fwd's rotation, then the
 * bf16 rounding), into `packed` (sp_cuda_flash_packed_bytes); the forward and the backward then read them there
 * (nothing packed again: the forward keeps them for the backward) and compute what sp_cuda_flash_fwd /
 * sp_cuda_flash_bwd compute over the rotated q, k. dk, dv: [B, T, nkv * hd]. */
size_t sp_cuda_flash_packed_bytes(int B, int T, int nh, int nkv, int hd);
sp_status sp_cuda_flash_pack(sp_cuda *cu, void *packed, const float *q, const float *k, const float *v,
                             const float *inv_freq, int pos0, int B, int T, int nh, int nkv, int hd, sp_err *err);
sp_status sp_cuda_flash_fwd_packed(sp_cuda *cu, float *out, void *outh, float *lse, const void *packed,
                                   const float *slopes, int B, int T, int nh, int nkv, int hd, sp_err *err);
sp_status sp_cuda_flash_bwd_packed(sp_cuda *cu, float *dq, float *dk, float *dv, const float *dout, const float *out,
                                   const float *lse, const void *packed, const float *slopes, int B, int T, int nh,
                                   int nkv, int hd, int acc, sp_err *err);

/* How the backward runs, a mask: bit SP_CUDA_FLASH_PIPE_DKV: the dk / dv kernel streams its next query tile into a
 * second set of shared buffers while a tile's products run; bit SP_CUDA_FLASH_PIPE_DQ: the dq kernel its next key
 * and value tiles (both: the same bits either way, the same sums in the same order; a pipelined kernel takes six
 * tiles of shared memory instead of four and runs only where two such blocks fit on an SM: H100 / H200, not an
 * A100); bit SP_CUDA_FLASH_DQ_STORED: the dk / dv kernel stores each dS^T tile (bf16, as its products take it) in the
 * workspace and dq is one product a tile from them (dS K) instead of recomputing the scores (dq within the
 * tolerance of the other way, dk and dv the same bits; B * nh * T * S * 2 bytes of workspace, else the recompute
 * beyond 256 MB). Process-wide; the default is SP_CUDA_FLASH_PIPE_DEFAULT, or the environment's SEPAL_FLASH_PIPE
 * (0..7) read at the first backward; sp_cuda_flash_set_pipeline(-1) goes back to that. */
#define SP_CUDA_FLASH_PIPE_DKV 1
#define SP_CUDA_FLASH_PIPE_DQ 2
#define SP_CUDA_FLASH_DQ_STORED 4
#define SP_CUDA_FLASH_PIPE_DEFAULT (SP_CUDA_FLASH_PIPE_DKV | SP_CUDA_FLASH_DQ_STORED)
void sp_cuda_flash_set_pipeline(int mask);
int sp_cuda_flash_pipeline(void); /* the mask in force */

#ifdef __cplusplus
}
#endif
#endif
