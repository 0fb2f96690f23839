/* autograd.h - a tape over client tensors, with a PyTorch-style backward.
 *
 * Tensors are f32, row-major, up to 4 dims. A graph (sp_graph) owns every tensor made in it; leaves are
 * parameters (requires_grad) or constants. Each op records a node; sp_backward(t, grad) walks the nodes that
 * t depends on in reverse creation order and ACCUMULATES into .grad of every tensor that requires grad
 * (leaves and, on request, intermediates), exactly like torch.Tensor.backward:
 *   - any tensor can be the root; a non-scalar root needs an explicit grad of its shape (else SP_ERR_ARG);
 *   - several backward calls (two losses, a loss built outside the model) accumulate; zeroing is explicit
 *     (sp_zero_grad); the graph stays usable until sp_graph_clear (like retain_graph=True);
 *   - a hook (sp_graph_on_backward) runs after every backward call: the trainer uses it to count calls, and
 *     runs its post-backward work (unscale, clip, user hooks) once per step in sp_trainer_step. A backward
 *     that fails (bad root, a server error) does not run it.
 * The remote chain (runtime.h) is one op: forward keeps the hidden state at every span boundary; backward
 * calls the servers' BACKWARD in reverse span order and yields grads for the chain input and the deep prompts.
 *
 * Dimension names: B batch, T positions, P prompt length, H hidden, V vocab, C classes, L blocks. */
#ifndef SEPAL_AUTOGRAD_H
#define SEPAL_AUTOGRAD_H

#include <stdint.h>

#include "pipeline.h"
#include "status.h"

struct sp_runtime;
struct sp_route;
struct sp_model;
typedef struct sp_graph sp_graph;
typedef struct sp_node sp_node;

typedef struct sp_t {
    int ndim;
    int64_t shape[4];
    int64_t n;          /* elements */
    float *data;
    float *grad;        /* NULL until a backward reaches it; then accumulates */
    int requires_grad;  /* leaves: a parameter; ops: set if any input requires grad */
    int retain_grad;    /* keep .grad on a non-leaf too */
    sp_node *node;      /* the op that made it; NULL for leaves */
    sp_graph *g;
    const char *name;   /* optional, for messages */
} sp_t;

sp_graph *sp_graph_new(void);
void sp_graph_free(sp_graph *g);
/* Drops every non-leaf tensor and node (the next step builds a new graph); leaves and their grads stay. */
void sp_graph_clear(sp_graph *g);
void sp_graph_on_backward(sp_graph *g, void (*hook)(sp_graph *g, void *user), void *user);
/* Threads sharing a graph: after sp_graph_set_shared(g, 1), each thread holds sp_graph_lock(g) while it
 * builds ops or runs a backward, and the remote chain drops the lock while it waits for servers, so other
 * threads work meanwhile. Concurrent backward calls must reach disjoint nodes (they may share leaves). */
void sp_graph_set_shared(sp_graph *g, int on);
void sp_graph_lock(sp_graph *g);
void sp_graph_unlock(sp_graph *g);
/* How many leaves (kept), temporaries (inputs and op outputs, dropped by sp_graph_clear) and nodes g holds. */
void sp_graph_counts(const sp_graph *g, int *leaves, int *temps, int *nodes);

/* Leaves. data is copied (NULL: zeros). sp_leaf's live as long as the graph (parameters, frozen weights);
 * sp_input's until the next sp_graph_clear (a step's inputs, per-step copies of parameters). */
sp_t *sp_leaf(sp_graph *g, int ndim, const int64_t *shape, const float *data, int requires_grad, const char *name);
sp_t *sp_input(sp_graph *g, int ndim, const int64_t *shape, const float *data, int requires_grad, const char *name);
void sp_zero_grad(sp_t *t);

/* Backward from t. grad: NULL for a scalar t (1.0), else t->n values. */
sp_status sp_backward(sp_t *t, const float *grad, sp_err *err);

/* ---------------------------------------------------------------------------------------------- */
/* ops (NULL and err set on a shape mismatch or out of memory; a NULL input, i.e. a failed op, gives NULL and
 * keeps the message already in err, so calls can be nested) */

/* rows of table [V, H] at ids [N] -> [N, H] (ids shaped by the caller: reshape after). */
sp_t *sp_embedding(sp_t *table, const int32_t *ids, int64_t N, sp_err *err);
/* [B, P, H] ++ [B, T, H] along positions -> [B, P + T, H]. */
sp_t *sp_concat_pos(sp_t *a, sp_t *b, sp_err *err);
/* x [B, T, H] -> x[:, from:to, :]. */
sp_t *sp_slice_pos(sp_t *x, int64_t from, int64_t to, sp_err *err);
/* Same data, new shape (element count must match). */
sp_t *sp_reshape(sp_t *x, int ndim, const int64_t *shape, sp_err *err);
/* x [.., H] rmsnorm with weight [H]. */
sp_t *sp_rmsnorm(sp_t *x, sp_t *w, float eps, sp_err *err);
/* x [.., H] layernorm with weight [H] and bias [H] (b may be NULL). */
sp_t *sp_layernorm(sp_t *x, sp_t *w, sp_t *b, float eps, sp_err *err);
/* x [.., I] @ W[O, I]^T + b[O] (b may be NULL) -> [.., O]. */
sp_t *sp_linear(sp_t *x, sp_t *W, sp_t *b, sp_err *err);
/* x [B, T, H] -> [B, H]: row b's position idx[b] (-T <= idx[b] < T; negative counts from the end). */
sp_t *sp_pool_index(sp_t *x, const int64_t *idx, sp_err *err);
sp_t *sp_add(sp_t *a, sp_t *b, sp_err *err);   /* same shapes */
sp_t *sp_scale(sp_t *a, float s, sp_err *err);
/* Mean losses: scalars (ndim 0, n 1). Cross-entropy ignores targets < 0 and averages over the others (all
 * ignored: 0, no gradient). */
sp_t *sp_cross_entropy(sp_t *logits, const int32_t *targets, sp_err *err); /* logits [N, C] */
sp_t *sp_mse(sp_t *pred, const float *target, sp_err *err);
sp_t *sp_bce_logits(sp_t *logits, const float *target, sp_err *err);
/* An op of g computed elsewhere (the client's local parts on a GPU, devparts.h): out [shape] holds data (copied;
 * NULL: zeros) and requires grad if a or b does (either may be NULL; they keep the backward's reach). Its
 * backward calls fn->backward(ctx, gout, gin, err) with gin[0], gin[1] the gradient slots of a and b (NULL where
 * one needs none: ADD into them); the graph calls fn->free(ctx) when it drops the node (also when this fails). */
typedef struct sp_ext_fn {
    sp_status (*backward)(void *ctx, const float *gout, float **gin, sp_err *err);
    void (*free)(void *ctx);
} sp_ext_fn;
sp_t *sp_external(sp_graph *g, int ndim, const int64_t *shape, const float *data, sp_t *a, sp_t *b,
                  const sp_ext_fn *fn, void *ctx, sp_err *err);
/* The remote chain through the swarm: x [B, T, H] through every block; deep prompts [L, B, P, H] (NULL: none;
 * P <= T). The batch runs as sub-batches of max(1, 1024 / T) rows, concurrently (one thread each), forward
 * and backward, each over its own max-throughput route; the result equals the unsplit computation. Servers
 * that fail are replaced (runtime.h), in the forward and in the backward. */
sp_t *sp_remote_chain(struct sp_runtime *rt, sp_t *x, sp_t *deep_prompts, sp_err *err);
/* The same for microbatch mb of a pipelined step over route (every sub-batch uses it): every stage of its
 * forward and of its backward waits for its turn on that stage of pipe (pipeline.h; pipe's stages are the
 * route's stages). route NULL, pipe NULL: as sp_remote_chain. */
sp_t *sp_remote_chain_mb(struct sp_runtime *rt, sp_t *x, sp_t *deep_prompts, const struct sp_route *route,
                         sp_pipe *pipe, int mb, sp_err *err);
/* The same op in this process over the blocks m holds (weights frozen), with the same prompt semantics
 * (deep prompts [nblocks, B, P, H]): the single-process baseline the swarm is compared with. m must outlive
 * the graph's backward calls. */
sp_t *sp_local_chain(struct sp_model *m, sp_t *x, sp_t *deep_prompts, sp_err *err);

#endif
