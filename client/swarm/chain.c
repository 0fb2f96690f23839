/* chain.c - FORWARD / BACKWARD along a route for training, in stages (runtime.h's sp_route).
 *
 * The client keeps the hidden state entering each stage (the boundaries). A FORWARD asks each server to
 * keep its activations for the BACKWARD that follows (meta "keep"). When a hop fails, its server is banned
 * and its stage is routed anew (max-throughput over the stage's blocks) and run again from its boundary: a
 * forward simply goes on; a backward first re-runs the replacement's forward (to get the inputs of its
 * hops), then its backward. The servers compute the same functions, so loss and gradients are those of a
 * run without the failure. Hidden states and gradients travel in the `wire` setting's encoding both ways
 * (f32, f16, bf16 or q8; the replies in the request's), deep prompts in f32. */
#include "swarm_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One FORWARD or BACKWARD on hop: t the tensors (hidden [, grad]); prompts: all blocks' deep prompts
 * [L, B, P, H] or NULL. Tensor 0 of the reply goes to out, tensor 1 (prompt grads) to gp's slice of the
 * hop's blocks. *retry: the failure was the server's. */
static sp_status call_hop(sp_runtime *rt, const sp_hop *hop, sp_msg_type type, const sp_tensor_src *t, int n,
                          const float *prompts, int P, float *out, float *gp, int B, int T, uint64_t keep,
                          int *retry, sp_err *err)
{
    int H = rt->local->cfg.hidden, nb = hop->end - hop->start, bwd = type == SP_MSG_BACKWARD;
    char meta[128];
    sp_span_req q = {.start = hop->start, .end = hop->end, .keep = keep, .reply_encoding = -1};
    if (bwd) /* ("" for a span out of range: the server refuses it) */
        sp_backward_req_encode(&q, meta, sizeof meta, NULL);
    else
        sp_forward_req_encode(&q, meta, sizeof meta, NULL);
    sp_tensor_src a[3];
    memcpy(a, t, (size_t)n * sizeof *t);
    for (int i = 0; i < n; i++) /* hidden states and gradients in the wire setting's encoding (the reply too) */
        a[i].enc = (sp_encoding)rt->set.wire;
    if (prompts)
        a[n++] = (sp_tensor_src){.enc = SP_ENC_F32, .rank = 4, .shape = {nb, B, P, H},
                                 .f32 = prompts + (size_t)hop->start * B * P * H};
    int timeout = sp_rt_timeout_ms(rt, hop->server, nb, (long)B * T * (bwd ? 3 : 1), 0);
    sp_reply rep;
    sp_status st = sp_rt_call(rt, hop->server, type, meta, a, n, &rep, timeout, err);
    if (!st) {
        const sp_tensor_view *o = rep.msg.n_tensors ? &rep.msg.t[0] : NULL;
        const sp_tensor_view *g = rep.msg.n_tensors > 1 ? &rep.msg.t[1] : NULL;
        if (!o || o->rank != 3 || o->shape[0] != B || o->shape[1] != T || o->shape[2] != H)
            st = sp_errf(err, SP_ERR_FORMAT, "%s reply is not [%d, %d, %d]", sp_msg_type_name(type), B, T, H);
        else if (!sp_tensor_all_finite(o) || (gp && g && !sp_tensor_all_finite(g)))
            st = sp_errf(err, SP_ERR_FORMAT, "%s reply holds non-finite values", sp_msg_type_name(type));
        else if (gp && (!g || g->numel != (uint64_t)nb * B * P * H))
            st = sp_errf(err, SP_ERR_FORMAT, "BACKWARD reply lacks the prompts' gradient [%d, %d, %d, %d]", nb, B, P, H);
        else
            st = sp_tensor_to_f32(o, out, err);
        if (!st && gp)
            st = sp_tensor_to_f32(g, gp + (size_t)hop->start * B * P * H, err);
    }
    *retry = st && sp_rt_retryable(st, &rep);
    sp_reply_clear(&rep);
    if (st) {
        char label[160];
        sp_rt_server_label(rt, hop->server, label, sizeof label);
        sp_err_prefix(err, "%s (blocks %d:%d): ", label, hop->start, hop->end);
    } else {
        sp_rt_succeeded(rt, hop->server);
    }
    return st;
}

static uint64_t new_keep(sp_runtime *rt) { return __atomic_add_fetch(&rt->next_keep, 1, __ATOMIC_RELAXED); }

/* Stage s's hops forward over x [B, T, H] in place. keep: the servers keep activations (ids in the hops).
 * inputs (may be NULL): receives the input of each hop after the first (k-1 buffers of [B, T, H]). */
static sp_status stage_forward(sp_runtime *rt, sp_route *r, int s, float *x, int B, int T, const float *prompts, int P,
                               int keep, float **inputs, int *bad, int *retry, sp_err *err)
{
    size_t N = (size_t)B * T * rt->local->cfg.hidden;
    for (int h = r->first[s]; h < r->first[s + 1]; h++) {
        sp_hop *hop = &r->hop[h];
        if (inputs && h > r->first[s])
            memcpy(inputs[h - r->first[s] - 1], x, N * sizeof(float));
        hop->keep = keep ? new_keep(rt) : 0;
        sp_tensor_src t = {.enc = SP_ENC_F32, .rank = 3, .shape = {B, T, rt->local->cfg.hidden}, .f32 = x};
        sp_status st = call_hop(rt, hop, SP_MSG_FORWARD, &t, 1, prompts, P, x, NULL, B, T, hop->keep, retry, err);
        if (st) {
            hop->keep = 0;
            *bad = hop->server;
            return st;
        }
    }
    return SP_OK;
}

/* Stage s's backward: in [B, T, H] entered it, grad [B, T, H] in place. With one hop that kept its
 * activations, one BACKWARD; otherwise (a replaced stage) the inputs of its hops are computed again first,
 * and each server's BACKWARD recomputes its forward. */
static sp_status stage_backward(sp_runtime *rt, sp_route *r, int s, const float *in, float *grad, int B, int T,
                                const float *prompts, int P, float *gp, int *bad, int *retry, sp_err *err)
{
    int H = rt->local->cfg.hidden, a = r->first[s], k = r->first[s + 1] - a;
    size_t N = (size_t)B * T * H;
    float **inputs = calloc((size_t)k, sizeof *inputs), *x = NULL;
    sp_status st = inputs ? SP_OK : sp_errf(err, SP_ERR_NOMEM, "out of memory");
    int single = k == 1 && r->hop[a].keep;
    if (!st && !single) {
        x = malloc(N * sizeof(float));
        for (int j = 1; x && j < k; j++)
            if (!(inputs[j] = malloc(N * sizeof(float))))
                break;
        if (!x || (k > 1 && !inputs[k - 1]))
            st = sp_errf(err, SP_ERR_NOMEM, "out of memory");
        if (!st && k > 1) { /* the inputs of hops 1..k-1: the stage's forward again, minus its last hop */
            memcpy(x, in, N * sizeof(float));
            for (int j = 0; j < k - 1 && !st; j++) {
                sp_tensor_src t = {.enc = SP_ENC_F32, .rank = 3, .shape = {B, T, H}, .f32 = x};
                st = call_hop(rt, &r->hop[a + j], SP_MSG_FORWARD, &t, 1, prompts, P, x, NULL, B, T, 0, retry, err);
                if (st)
                    *bad = r->hop[a + j].server;
                else
                    memcpy(inputs[j + 1], x, N * sizeof(float));
            }
        }
        for (int j = 0; j < k; j++)
            r->hop[a + j].keep = 0; /* a recomputed backward uses no kept activations */
    }
    inputs[0] = (float *)in;
    for (int j = k - 1; j >= 0 && !st; j--) {
        sp_hop *hop = &r->hop[a + j];
        sp_tensor_src t[2] = {{.enc = SP_ENC_F32, .rank = 3, .shape = {B, T, H}, .f32 = inputs[j]},
                              {.enc = SP_ENC_F32, .rank = 3, .shape = {B, T, H}, .f32 = grad}};
        st = call_hop(rt, hop, SP_MSG_BACKWARD, t, 2, prompts, P, grad, prompts ? gp : NULL, B, T, hop->keep, retry, err);
        hop->keep = 0;
        if (st)
            *bad = hop->server;
    }
    for (int j = 1; inputs && j < k; j++)
        free(inputs[j]);
    free(inputs);
    free(x);
    return st;
}

/* After a failure of stage s on server bad: ban it, wait out the backoff of `attempt`, route the stage's
 * blocks anew. 0: try again; else the error to give up with (err kept). */
static sp_status recover_stage(sp_runtime *rt, sp_route *r, int s, int bad, int attempt, sp_err *err)
{
    sp_rt_failed(rt, bad, attempt, err);
    for (;; attempt++) {
        if (attempt >= rt->set.max_retries) {
            if (err)
                sp_err_prefix(err, "no server could run blocks %d:%d (%d retries): ", r->stage_start[s],
                              r->stage_start[s + 1], rt->set.max_retries);
            return err && err->code ? err->code : SP_ERR_IO;
        }
        if (sp_rt_sleep(rt, sp_rt_backoff(rt, attempt + 1)))
            return sp_errf(err, SP_ERR_CANCELLED, "cancelled");
        sp_route repl;
        sp_err rerr = {0};
        sp_status st = sp_rt_route_span_train(rt, r->stage_start[s], r->stage_start[s + 1], &repl, &rerr);
        if (!st && sp_route_replace_stage(r, s, &repl))
            st = sp_errf(&rerr, SP_ERR_RANGE, "a route of more than %d hops", SP_RT_MAX_HOPS);
        if (!st) {
            char text[2048];
            sp_runtime_route_text(rt, r, text, sizeof text);
            sp_rt_emit_route(rt, SP_EV_ROUTE, text, 1, r, NULL);
            return SP_OK;
        }
        if (st != SP_ERR_NOTFOUND) { /* no route for other reasons: give up */
            if (err)
                *err = rerr;
            return st;
        }
        /* no server for a block: wait only for one that is joining */
        if (!sp_rt_no_server(rt, r->stage_start[s], r->stage_start[s + 1], attempt + 1, err)) {
            if (err)
                sp_err_prefix(err, "no server could run blocks %d:%d: ", r->stage_start[s], r->stage_start[s + 1]);
            return SP_ERR_NOTFOUND;
        }
    }
}

/* Stage s of a pipelined microbatch waits for its turn (pipeline.h). */
static sp_status gate_enter(const sp_route *r, const sp_pipe_ticket *tk, int s, int bwd, sp_err *err)
{
    if (!tk || !tk->pipe)
        return SP_OK;
    if (sp_pipe_stages(tk->pipe) != r->nstages)
        return sp_errf(err, SP_ERR_STATE, "pipeline of %d stages over a route of %d stages", sp_pipe_stages(tk->pipe),
                       r->nstages);
    return sp_pipe_enter(tk->pipe, s, bwd, tk->mb, err);
}

static void gate_leave(const sp_pipe_ticket *tk, int s, int bwd)
{
    if (tk && tk->pipe)
        sp_pipe_leave(tk->pipe, s, bwd, tk->mb, tk->nsub);
}

/* FORWARD over the route (see runtime.h); counted in rt->active meanwhile. */
static sp_status forward(sp_runtime *rt, sp_route *route, float *hidden, int B, int T, const float *prompts, int P,
                         float *boundaries, const sp_pipe_ticket *tk, sp_err *err);
static sp_status backward(sp_runtime *rt, sp_route *route, float *grad, int B, int T, const float *prompts, int P,
                          const float *boundaries, float *grad_prompts, const sp_pipe_ticket *tk, sp_err *err);

sp_status sp_runtime_forward(sp_runtime *rt, sp_route *route, float *hidden, int B, int T, const float *prompts,
                             int P, float *boundaries, const sp_pipe_ticket *tk, sp_err *err)
{
    __atomic_add_fetch(&rt->active, 1, __ATOMIC_RELAXED);
    sp_status st = forward(rt, route, hidden, B, T, prompts, P, boundaries, tk, err);
    __atomic_sub_fetch(&rt->active, 1, __ATOMIC_RELAXED);
    return st;
}

sp_status sp_runtime_backward(sp_runtime *rt, sp_route *route, float *grad, int B, int T, const float *prompts,
                              int P, const float *boundaries, float *grad_prompts, const sp_pipe_ticket *tk,
                              sp_err *err)
{
    __atomic_add_fetch(&rt->active, 1, __ATOMIC_RELAXED);
    sp_status st = backward(rt, route, grad, B, T, prompts, P, boundaries, grad_prompts, tk, err);
    __atomic_sub_fetch(&rt->active, 1, __ATOMIC_RELAXED);
    return st;
}

static sp_status forward(sp_runtime *rt, sp_route *route, float *hidden, int B, int T, const float *prompts, int P,
                         float *boundaries, const sp_pipe_ticket *tk, sp_err *err)
{
    size_t N = (size_t)B * T * rt->local->cfg.hidden;
    float *tmp = boundaries ? NULL : malloc(N * sizeof(float)); /* the stage's input, for a retry */
    if (!boundaries && !tmp)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    sp_status st = SP_OK;
    for (int s = 0; s < route->nstages && !st; s++) {
        float *in = boundaries ? boundaries + s * N : tmp;
        memcpy(in, hidden, N * sizeof(float));
        if ((st = gate_enter(route, tk, s, 0, err)))
            break;
        for (int attempt = 0;; attempt++) {
            int bad = -1, retry = 0;
            st = stage_forward(rt, route, s, hidden, B, T, prompts, P, boundaries != NULL, NULL, &bad, &retry, err);
            if (!st || !retry || (st = recover_stage(rt, route, s, bad, attempt, err)))
                break;
            memcpy(hidden, in, N * sizeof(float));
        }
        gate_leave(tk, s, 0);
    }
    free(tmp);
    return st;
}

static sp_status backward(sp_runtime *rt, sp_route *route, float *grad, int B, int T, const float *prompts, int P,
                          const float *boundaries, float *grad_prompts, const sp_pipe_ticket *tk, sp_err *err)
{
    size_t N = (size_t)B * T * rt->local->cfg.hidden;
    float *gin = malloc(N * sizeof(float)); /* the stage's incoming gradient, for a retry */
    if (!gin)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    sp_status st = SP_OK;
    for (int s = route->nstages - 1; s >= 0 && !st; s--) {
        memcpy(gin, grad, N * sizeof(float));
        if ((st = gate_enter(route, tk, s, 1, err)))
            break;
        for (int attempt = 0;; attempt++) {
            int bad = -1, retry = 0;
            st = stage_backward(rt, route, s, boundaries + s * N, grad, B, T, prompts, P, grad_prompts, &bad, &retry,
                                err);
            if (!st || !retry || (st = recover_stage(rt, route, s, bad, attempt, err)))
                break;
            memcpy(grad, gin, N * sizeof(float));
        }
        gate_leave(tk, s, 1);
    }
    free(gin);
    return st;
}
