/* chain.c - FORWARD / BACKWARD over the route for training. */
#include "swarm_impl.h"

#include <stdio.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------- */
/* forward / backward over the route (training) */

/* One FORWARD or BACKWARD on hop h. t: the tensors (hidden [, grad]); prompts: all blocks' deep prompts
 * [L, B, P, H] or NULL. Tensor 0 of the reply goes to out, tensor 1 (prompt grads) to gp (hop's slice). */
static sp_status call_span(sp_runtime *rt, int h, sp_msg_type type, const sp_tensor_src *t, int n,
                           const float *prompts, int P, float *out, float *gp, int B, int T, const char *keep_key,
                           uint64_t keep_id, sp_err *err)
{
    const sp_hop *hop = &rt->route[h];
    int H = rt->local->cfg.hidden, nb = hop->end - hop->start;
    char meta[128];
    if (keep_id)
        snprintf(meta, sizeof meta, "{\"start\":%d,\"end\":%d,\"%s\":%llu}", hop->start, hop->end, keep_key,
                 (unsigned long long)keep_id);
    else
        snprintf(meta, sizeof meta, "{\"start\":%d,\"end\":%d}", hop->start, hop->end);
    sp_tensor_src a[3];
    memcpy(a, t, (size_t)n * sizeof *t);
    if (prompts)
        a[n++] = (sp_tensor_src){.enc = SP_ENC_F32, .rank = 4, .shape = {nb, B, P, H},
                                 .f32 = prompts + (size_t)hop->start * B * P * H};
    sp_reply rep;
    sp_status st = sp_remote_call(sp_rt_hop_conn(rt, h), type, meta, a, n, &rep, CALL_TIMEOUT_MS, err);
    if (!st) {
        const sp_tensor_view *o = rep.msg.n_tensors ? &rep.msg.t[0] : NULL;
        const sp_tensor_view *g = rep.msg.n_tensors > 1 ? &rep.msg.t[1] : NULL;
        if (!o || o->rank != 3 || o->shape[0] != B || o->shape[1] != T || o->shape[2] != H)
            st = sp_errf(err, SP_ERR_FORMAT, "%s reply is not [%d, %d, %d]", sp_msg_type_name(type), B, T, H);
        else if (!sp_tensor_all_finite(o))
            st = sp_errf(err, SP_ERR_FORMAT, "%s reply holds non-finite values", sp_msg_type_name(type));
        else if (gp && (!g || g->numel != (uint64_t)nb * B * P * H))
            st = sp_errf(err, SP_ERR_FORMAT, "BACKWARD reply lacks the prompts' gradient [%d, %d, %d, %d]", nb, B, P, H);
        else
            st = sp_tensor_to_f32(o, out, err);
        if (!st && gp)
            st = sp_tensor_to_f32(g, gp + (size_t)hop->start * B * P * H, err);
    }
    sp_reply_clear(&rep);
    if (st)
        sp_err_prefix(err, "%s:%d (blocks %d:%d): ", rt->servers[hop->server].host, rt->servers[hop->server].port,
                      hop->start, hop->end);
    return st;
}

/* Registers a FORWARD that keeps activations: ids for its hops, found again by its boundaries. */
static struct sp_keep *keep_register(sp_runtime *rt, const float *boundaries)
{
    pthread_mutex_lock(&rt->keep_lock);
    struct sp_keep *k = &rt->keeps[rt->keep_next_slot++ % 64]; /* the oldest slot: its server entry ages out */
    k->boundaries = boundaries;
    k->nhops = rt->nroute;
    for (int h = 0; h < rt->nroute; h++)
        k->id[h] = ++rt->keep_next_id;
    pthread_mutex_unlock(&rt->keep_lock);
    return k;
}

/* The keep ids of the FORWARD that filled these boundaries (copied out and forgotten), or 0 if none. */
static int keep_lookup(sp_runtime *rt, const float *boundaries, uint64_t *ids)
{
    int n = 0;
    pthread_mutex_lock(&rt->keep_lock);
    for (int i = 0; i < 64; i++)
        if (rt->keeps[i].boundaries == boundaries && rt->keeps[i].nhops == rt->nroute) {
            n = rt->keeps[i].nhops;
            memcpy(ids, rt->keeps[i].id, (size_t)n * sizeof *ids);
            rt->keeps[i].boundaries = NULL;
            break;
        }
    pthread_mutex_unlock(&rt->keep_lock);
    return n;
}

/* Hop h of a pipelined microbatch waits for its turn on that stage (pipeline.h); call_span then leave. */
static sp_status gated_call(sp_runtime *rt, const sp_pipe_ticket *tk, int h, sp_msg_type type, const sp_tensor_src *t,
                            int n, const float *prompts, int P, float *out, float *gp, int B, int T,
                            const char *keep_key, uint64_t keep_id, sp_err *err)
{
    int bwd = type == SP_MSG_BACKWARD;
    if (tk && tk->pipe) {
        if (sp_pipe_stages(tk->pipe) != rt->nroute)
            return sp_errf(err, SP_ERR_STATE, "pipeline of %d stages over a route of %d hops", sp_pipe_stages(tk->pipe),
                           rt->nroute);
        sp_status st = sp_pipe_enter(tk->pipe, h, bwd, tk->mb, err);
        if (st)
            return st;
    }
    sp_status st = call_span(rt, h, type, t, n, prompts, P, out, gp, B, T, keep_key, keep_id, err);
    if (tk && tk->pipe)
        sp_pipe_leave(tk->pipe, h, bwd, tk->mb, tk->nsub);
    return st;
}

sp_status sp_runtime_forward(sp_runtime *rt, float *hidden, int B, int T, const float *prompts, int P,
                             float *boundaries, const sp_pipe_ticket *tk, sp_err *err)
{
    if (!rt->nroute && sp_runtime_route(rt, err))
        return err ? err->code : SP_ERR_NOTFOUND;
    int H = rt->local->cfg.hidden;
    size_t N = (size_t)B * T * H;
    uint64_t ids[SP_RT_MAX_SERVERS] = {0};
    if (boundaries) { /* a backward will follow: the servers keep what it needs */
        struct sp_keep *k = keep_register(rt, boundaries);
        memcpy(ids, k->id, (size_t)rt->nroute * sizeof *ids);
    }
    for (int h = 0; h < rt->nroute; h++) {
        if (boundaries)
            memcpy(boundaries + h * N, hidden, N * sizeof(float));
        sp_tensor_src t = {.enc = SP_ENC_F32, .rank = 3, .shape = {B, T, H}, .f32 = hidden};
        sp_status st = gated_call(rt, tk, h, SP_MSG_FORWARD, &t, 1, prompts, P, hidden, NULL, B, T, "keep", ids[h], err);
        if (st)
            return st;
    }
    return SP_OK;
}

sp_status sp_runtime_backward(sp_runtime *rt, float *grad, int B, int T, const float *prompts, int P,
                              const float *boundaries, float *grad_prompts, const sp_pipe_ticket *tk, sp_err *err)
{
    int H = rt->local->cfg.hidden;
    size_t N = (size_t)B * T * H;
    uint64_t ids[SP_RT_MAX_SERVERS] = {0};
    keep_lookup(rt, boundaries, ids); /* none: the servers recompute their forward */
    for (int h = rt->nroute - 1; h >= 0; h--) {
        sp_tensor_src t[2] = {{.enc = SP_ENC_F32, .rank = 3, .shape = {B, T, H}, .f32 = boundaries + h * N},
                              {.enc = SP_ENC_F32, .rank = 3, .shape = {B, T, H}, .f32 = grad}};
        sp_status st = gated_call(rt, tk, h, SP_MSG_BACKWARD, t, 2, prompts, P, grad, prompts ? grad_prompts : NULL, B,
                                  T, "kept", ids[h], err);
        if (st)
            return st;
    }
    return SP_OK;
}
