/* span.h - where a server's span of blocks runs: the seam between the host and a GPU (sepal-server --device).
 *
 * --device cpu (the default): the blocks stay in core/block.c's host memory and rpc.c, session.c and throughput.c
 * run them as they always did; s->dev is NULL and nothing here is called but the parse and the name.
 * --device cuda[:N]: span_dev_open uploads the span's blocks to GPU N in their encoding (cuda/block_cuda.h), and
 * every computation of the span goes through the span_dev_* calls below: a request's hidden states are copied to
 * the device once at the span's start and back once at its end, KV caches are device caches (sp_cuda_kv) charged to
 * a device budget, and one mutex serialises the device work (the block API is not thread-safe). Built without
 * CUDA, span_dev_open fails with "built without CUDA". Host arrays in and out; shapes as in rpc.c. */
#ifndef SEPAL_SERVER_SPAN_H
#define SEPAL_SERVER_SPAN_H

#include <stdint.h>

#include "server_impl.h"

/* Uploads the span (s->m's blocks) to GPU gpu and sets s->dev: SP_ERR_UNSUPPORTED "no usable GPU (...)" without one,
 * or naming what does not run there (Mixtral's experts); nothing is left allocated on failure. */
sp_status span_dev_open(sp_server *s, int gpu, sp_err *err);
void span_dev_close(sp_server *s);
/* "cpu", or "cuda:N NAME" (the record and `servers` show it). */
const char *span_device(const sp_server *s);
/* Device bytes of the span's weights. */
size_t span_dev_weight_bytes(const sp_server *s);

/* rpc.c's run_keeping: blocks [start, end) on x [B, T, H] in place, deep prompts added, each block's input (prompt
 * added) written to inputs ((end - start) x [B, T, H]) when non-NULL. */
sp_status span_dev_forward(sp_server *s, int start, int end, float *x, int B, int T, const float *prompts, int P,
                           float *inputs, sp_err *err);

/* A FORWARD's activations kept on the device for its BACKWARD (server_impl.h's kept entry holds it): each block's input (prompt
 * added) and what sp_cuda_block_forward_keep keeps, their bytes charged to the device's budget (the KV caches'),
 * given back when freed. The device bytes such an entry of blocks [start, end) on
 * [B, T] takes; what the device's budget has room for now. */
size_t span_dev_kept_bytes(const sp_server *s, int start, int end, int B, int T);
size_t span_dev_room(const sp_server *s);
/* The device budget's bytes held now (the sessions' caches and the kept entries). */
size_t span_dev_budget_used(const sp_server *s);
/* span_dev_forward keeping every block's input and activations on the device in *out. SP_ERR_NOMEM, nothing run
 * that shows and nothing kept (x as it was), when the budget or the device has no room: the caller falls back. */
sp_status span_dev_forward_keep(sp_server *s, int start, int end, float *x, int B, int T, const float *prompts, int P,
                                span_dev_kept **out, sp_err *err);
/* Frees an entry (NULL: nothing), its bytes given back to the budget; the bytes it holds. */
void span_dev_kept_free(span_dev_kept *k);
size_t span_dev_kept_size(const span_dev_kept *k);

/* The backward through blocks [start, end): g [B, T, H] (the gradient at the span's output) becomes the gradient
 * at its input; from dk (its FORWARD's inputs and activations on the device, of [start, end) on [B, T]) when
 * non-NULL, else from inputs (each block's input on the host), else recomputed from x, the span's input (the
 * same bits each way); gp ((end - start) x [B, P, H], NULL without prompts) gets each block's prompt gradient. */
sp_status span_dev_backward(sp_server *s, int start, int end, float *g, const float *x, const float *inputs,
                            const span_dev_kept *dk, int B, int T, const float *prompts, int P, float *gp,
                            sp_err *err);

/* A session's device caches (x->dkv, one per block of [start, end), B x max_length each; x->dev set), and their
 * release (nothing without them). */
sp_status span_dev_kv_open(sp_server *s, session *x, int start, int end, int B, int max_length, sp_err *err);
void span_dev_kv_free(session *x);
/* rpc.c's step_blocks: the session's blocks on h [B, T, H] in place at positions x->len.. (the caches rolled back
 * to x->len first), prompts added at positions < P. */
sp_status span_dev_step(sp_server *s, session *x, float *h, int B, int T, const float *prompts, int P, sp_err *err);
/* Beam search's reorder of every cache of x (rolled back to x->len first): row b takes old row hypo[b]. */
sp_status span_dev_reorder(sp_server *s, session *x, const int64_t *hypo, sp_err *err);
/* Decode steps of n sessions over one span in one pass (sp_cuda_block_decode_batch): h [rows, H], session k's
 * xs[k]->B rows in order, each at its x->len. */
sp_status span_dev_decode_batch(sp_server *s, session *const *xs, int n, float *h, int rows, sp_err *err);
/* throughput.c's figures measured on the device: steps/s of one position at KV length past, tokens/s of a T-token
 * forward; 0 when a step fails. */
void span_dev_measure(sp_server *s, int T, int past, double *rps, double *tps);

#endif
