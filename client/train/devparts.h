/* devparts.h - the client's local parts of prompt tuning on a GPU (train --device cuda, the `device` setting):
 * the embeddings, BLOOM's embedding norm, the final norm, the LM head or the classification head, the shallow and
 * deep prompts, with the parameters and their gradients in the CUDA optimizer's buffers (optim.h's resident mode).
 *
 * Each piece is one autograd op (sp_external) whose values live on the device; what crosses to the host is what
 * the swarm sends and receives at the span boundaries: the chain's input [B, P + T, H] and the deep prompts
 * [L, B, P, H] going out (their gradients coming back), the chain's output [B, P + T, H] coming in (its gradient
 * going out); plus the ids and targets in, the per-row losses out (B x T floats at most), and the logits out only
 * where a validation's metrics need them. The arithmetic is the CPU path's (trainer.c's graph), op by op, with the
 * kernels of cuda/kernels.h and cuBLAS's f32 products; only the order of the products' sums differs.
 *
 * Not thread-safe: the trainer runs these ops under its graph's lock (generation's two calls below lock). Without CUDA (a build without nvcc) only
 * sp_devparts_parse and sp_device_usable do anything; sp_devparts_new says why it cannot. */
#ifndef SEPAL_DEVPARTS_H
#define SEPAL_DEVPARTS_H

#include <stddef.h>
#include <stdint.h>

#include "autograd.h"
#include "model.h"
#include "status.h"

/* "cpu", "cuda" (GPU 0) or "cuda:N" (common/device.h): *cuda 0 or 1, *index N; -1 and why ("'gpu' is not a
 * device: cpu, cuda or cuda:N") for anything else. */
int sp_devparts_parse(const char *s, int *cuda, int *index, char *why, size_t cap);
/* 1 when GPU index can run sepal's kernels here; else 0 and why: "no usable GPU: <the CUDA runtime's reason>",
 * "no GPU N: this machine has K" or "this sepal was built without CUDA". */
int sp_device_usable(int index, char *why, size_t cap);

typedef struct sp_devparts sp_devparts;

/* Opens GPU index and uploads the frozen parts of m that training uses: the embeddings, BLOOM's embedding norm,
 * the final norm, and the LM head when classes == 0 (a causal LM). P prompt positions, L blocks. */
sp_status sp_devparts_new(sp_devparts **out, const sp_model *m, int index, int classes, int P, sp_err *err);
void sp_devparts_free(sp_devparts *d);
/* The trainable parameters' device buffers (values and gradients; NULL: not trained): [P, H], [L, P, H],
 * [C, H]. The gradients accumulate there; sp_devparts_sync waits for them before an optimizer step. */
void sp_devparts_bind(sp_devparts *d, float *prompts, float *gprompts, float *deep, float *gdeep, float *score,
                      float *gscore);
sp_status sp_devparts_sync(sp_devparts *d, sp_err *err);

/* The chain's input [B, P + T, H] of g: the prompts, then the embeddings of ids [B, T], through BLOOM's
 * embedding norm. train: its backward sums the gradient's prompt rows into the prompts' (prompts, the leaf, keeps
 * the backward's reach; NULL when P is 0). */
sp_t *sp_devparts_input(sp_devparts *d, sp_graph *g, sp_t *prompts, const int32_t *ids, int B, int T, int train,
                        sp_err *err);
/* The deep prompts replicated over the batch, [L, B, P, H]; train: the backward sums over the batch. */
sp_t *sp_devparts_deep(sp_devparts *d, sp_t *deep, int B, int train, sp_err *err);

/* What the head needs of a batch: B rows of T positions; targets: the next tokens [B * T] (a causal LM) or the
 * labels [B] (classes), negative: ignored; last [B]: the position each row is pooled at (classes). */
typedef struct sp_dev_batch {
    int B, T;
    const int32_t *targets, *last;
} sp_dev_batch;

/* From the chain's output h [B, P + T, H]: the positions after the prompts, the final norm, then the LM head
 * (logits [B * T, V]) or the pooled row through the classification head score [C, H] (logits [B, C]). loss 1: the
 * mean cross-entropy over b->targets as a scalar (the logits stay on the device); 0: the logits. train: its
 * backward gives h its gradient and adds the head's into the score's device gradient. */
sp_t *sp_devparts_head(sp_devparts *d, sp_t *h, sp_t *score, const sp_dev_batch *b, int loss, int train,
                       sp_err *err);

/* Generation's local parts on the device (the `device` setting's cuda[:N], parts.h's sp_runtime_set_gen_device): no
 * graph, host arrays in and out, one call at a time (a lock of their own; d's scratch grows to the largest call).
 * sp_devparts_new with classes 0 and P 0 opens what they use.
 * x [B, P + T, H] = each row's P positions of shallow ([P, H], NULL: zeros), then the embeddings of ids [B, T],
 * through BLOOM's embedding norm: sp_model_embed, the prompts, sp_model_embed_norm on the CPU. */
sp_status sp_devparts_embed(sp_devparts *d, float *x, const int32_t *ids, int B, int T, const float *shallow, int P,
                            sp_err *err);
/* logits [n, V] of hidden [n, H] through the final norm and the f32 LM head (sp_model_head with an f32 head); best
 * (NULL: not wanted) each row's first maximum of them (sp_argmax); logits NULL: best alone (kept in d's scratch). */
sp_status sp_devparts_logits(sp_devparts *d, float *logits, int32_t *best, const float *hidden, int n, sp_err *err);

#endif
