/* model_dev.h - `model check --device cuda[:N]`: a loaded model's blocks on a GPU (cuda/block_cuda.h, in the blocks'
 * encoding), driven on host arrays for cmd_model.c's checks: a block's forward and backward to its input, and every
 * block in turn (with device KV caches for greedy decoding). The embeddings and the head stay on the host.
 * In a build without CUDA, or without a usable GPU, opening says why (SP_ERR_UNSUPPORTED). */
#ifndef SEPAL_CMD_MODEL_DEV_H
#define SEPAL_CMD_MODEL_DEV_H

#include "model.h"
#include "status.h"

typedef struct sp_mdev sp_mdev;

/* Uploads every block of m (loaded with all its blocks) to GPU gpu; m must outlive d. */
sp_status sp_mdev_open(sp_mdev **out, const sp_model *m, int gpu, sp_err *err);
void sp_mdev_close(sp_mdev *d); /* NULL: nothing */
/* The device, "cuda:N NAME". */
const char *sp_mdev_name(const sp_mdev *d);
/* Block i: out[B, T, H] = block(in) at positions 0 .. T - 1, no cache (sp_block_forward). */
sp_status sp_mdev_forward(sp_mdev *d, int i, float *out, const float *in, int B, int T, sp_err *err);
/* Block i: dinp[B, T, H] = d(out . dout)/d(in), the forward recomputed (sp_block_backward without weights). */
sp_status sp_mdev_backward(sp_mdev *d, int i, float *dinp, const float *dout, const float *in, int B, int T,
                           sp_err *err);
/* Fresh KV caches of B rows of cap positions for every block (the old ones freed). */
sp_status sp_mdev_caches(sp_mdev *d, int B, int cap, sp_err *err);
/* Every block in turn, in place on hidden[B, T, H] at positions pos0 .. (sp_model_blocks): through the caches (pos0
 * their length, which grows by T) when cached, else without any. */
sp_status sp_mdev_blocks(sp_mdev *d, float *hidden, int B, int T, int pos0, int cached, sp_err *err);

#endif
