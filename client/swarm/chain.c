/* chain.c - FORWARD / BACKWARD along a route for training, in stages (runtime.h's sp_route).
 *
 * The client keeps the hidden state entering each stage (the boundaries). A FORWARD asks each server to
 * keep its activations for the BACKWARD that follows (meta "keep"). When a hop fails, its server is banned
 * and its stage is routed anew (max-throughput over the stage's blocks) and run again from its boundary: a
 * forward simply goes on; a backward first re-runs the replacement's forward (to get the inputs of its
 * hops), then its backward. The servers compute the same functions, so loss and gradients are those of a
 * run without the failure. Hidden states and gradients travel in the `wire` setting's encoding both ways
 * (f32, f16, bf16 or q8, or auto's choice for the hop's measured link, sp_rt_wire: each direction by its own rate),
 * deep prompts in f32.
 *
 * Where the push setting allows it (sp_rt_train_pushable), a pass goes from server to server: FORWARD client ->
 * first server -> ... -> last -> client, BACKWARD the other way. Every hop's request goes out at once, on a thread of
 * its own (in a pipelined step, each once the microbatch's turn on its stage came): the first with its input, the
 * others awaiting it under an id and a random token that the hop before them pushes to (SPAN_PUSH). The client still
 * gets every hop's output (the boundaries, a retry's start). Where a hop fails or a push does not arrive, the pass
 * goes on client-driven from that hop, as above, and pushes between the two servers pause for a while (push_missed).
 * Only servers that say they can take pushed passes (SP_CAP_SPAN_PUSH) get them; one that refuses to await its input
 * all the same (an older server) is remembered, and the pass goes on client-driven from it. */
#include "swarm_impl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rng.h"

/* What a hop of a pushed pass adds to its request (call_hop): the id and token its input comes by (await 0: it
 * is in the request), the server its output goes to (next -1: none) with that one's id and token, more time for
 * the wait (extra_ms), the flag that ends it (abort) and the pass's wire encoding (enc: one for all its hops, as
 * each server pushes in the encoding its input came in); back: whether the push arrived (pushed), and whether the
 * server refused to await its input (refused: an ERROR of ours, which an older server gives). */
typedef struct hop_push {
    uint64_t await, await_token;
    int next;
    uint64_t push_id, push_token;
    int extra_ms;
    const int *abort;
    sp_encoding enc;
    int pushed, refused;
} hop_push;

static void push_meta(sp_runtime *rt, sp_span_req *q, const hop_push *pp)
{
    q->await = pp->await;
    q->await_token = pp->await_token;
    if (pp->next >= 0) {
        sp_rt_push_addr(rt, pp->next, q->push_host, sizeof q->push_host, &q->push_port);
        q->push_id = pp->push_id;
        q->push_token = pp->push_token;
    }
}

/* One FORWARD or BACKWARD on hop: t the tensors (hidden [, grad]; a hop of a pushed pass lacks what it awaits);
 * prompts: all blocks' deep prompts [L, B, P, H] or NULL. Tensor 0 of the reply goes to out, tensor 1 (prompt
 * grads) to gp's slice of the hop's blocks. pp: a pushed pass's hop, or NULL. *retry: the failure was the
 * server's. */
static sp_status call_hop(sp_runtime *rt, const sp_hop *hop, sp_msg_type type, const sp_tensor_src *t, int n,
                          const float *prompts, int P, float *out, float *gp, int B, int T, uint64_t keep,
                          hop_push *pp, int *retry, sp_err *err)
{
    int H = rt->local->cfg.hidden, nb = hop->end - hop->start, bwd = type == SP_MSG_BACKWARD;
    char meta[768];
    sp_span_req q = {.start = hop->start, .end = hop->end, .keep = keep, .reply_encoding = -1};
    sp_encoding back, enc = pp ? pp->enc : sp_rt_wire(rt, &hop->server, 1, T, &back);
    if (pp)
        push_meta(rt, &q, pp);
    else if (back != enc) /* (the same: left out, the request's own) */
        q.reply_encoding = back;
    if (bwd) /* ("" for a span out of range: the server refuses it) */
        sp_backward_req_encode(&q, meta, sizeof meta, NULL);
    else
        sp_forward_req_encode(&q, meta, sizeof meta, NULL);
    sp_tensor_src a[3];
    memcpy(a, t, (size_t)n * sizeof *t);
    for (int i = 0; i < n; i++) /* hidden states and gradients in the wire setting's encoding (the reply too) */
        a[i].enc = enc;
    if (prompts)
        a[n++] = (sp_tensor_src){.enc = SP_ENC_F32, .rank = 4, .shape = {nb, B, P, H},
                                 .f32 = prompts + (size_t)hop->start * B * P * H};
    int timeout = sp_rt_timeout_ms(rt, hop->server, nb, (long)B * T * (bwd ? 3 : 1), 0);
    sp_reply rep;
    sp_status st = pp ? sp_rt_call_abortable(rt, hop->server, type, meta, a, n, &rep, timeout + pp->extra_ms,
                                             pp->abort, err)
                      : sp_rt_call(rt, hop->server, type, meta, a, n, &rep, timeout, err);
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
        sp_span_reply sr = {0};
        if (pp)
            pp->pushed = !st &&
                         (bwd ? sp_backward_reply_decode(&rep.msg, &sr, NULL)
                              : sp_forward_reply_decode(&rep.msg, &sr, NULL)) == SP_OK &&
                         sr.pushed == 1;
    }
    *retry = st && sp_rt_retryable(st, &rep);
    if (pp && pp->await && st && !*retry && sp_reply_error_code(&rep))
        pp->refused = 1;
    sp_reply_clear(&rep);
    if (st && !(pp && pp->refused)) { /* (a refusal is not an error: the pass goes on client-driven) */
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
        sp_status st = call_hop(rt, hop, SP_MSG_FORWARD, &t, 1, prompts, P, x, NULL, B, T, hop->keep, NULL, retry, err);
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
                st = call_hop(rt, &r->hop[a + j], SP_MSG_FORWARD, &t, 1, prompts, P, x, NULL, B, T, 0, NULL, retry, err);
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
        st = call_hop(rt, hop, SP_MSG_BACKWARD, t, 2, prompts, P, grad, prompts ? gp : NULL, B, T, hop->keep, NULL, retry, err);
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

/* ---------------------------------------------------------------------------------------------- */
/* pushed passes: FORWARD client -> first server -> next ... -> last -> client, BACKWARD the other way */

/* One hop of a pushed pass (the route's stage s, one hop a stage): its call runs on a thread of its own. */
typedef struct pass_hop {
    sp_runtime *rt;
    sp_route *r;
    const sp_pipe_ticket *tk;
    int s, bwd, B, T, P;
    const float *prompts;
    const float *in;   /* FORWARD: the input (NULL: it awaits it); BACKWARD: hidden_in */
    const float *grad; /* BACKWARD: grad_out (NULL: it awaits it) */
    float *out, *gp;   /* its output [B, T, H]; BACKWARD: the prompts' gradients (all blocks', its slice written) */
    hop_push pp;
    int *aborts, pos, n; /* its place in the pass; when it fails or its push does not arrive, the flags of the hops
                          * after it are set: they stop waiting */
    int retry;
    sp_status st;
    sp_err err;
    pthread_t th;
    int started;
} pass_hop;

static void *pass_main(void *arg)
{
    pass_hop *w = arg;
    const sp_hop *hop = &w->r->hop[w->s];
    sp_tensor_src t[2];
    int n = 0, H = w->rt->local->cfg.hidden;
    if (w->in)
        t[n++] = (sp_tensor_src){.enc = SP_ENC_F32, .rank = 3, .shape = {w->B, w->T, H}, .f32 = w->in};
    if (w->grad)
        t[n++] = (sp_tensor_src){.enc = SP_ENC_F32, .rank = 3, .shape = {w->B, w->T, H}, .f32 = w->grad};
    w->st = call_hop(w->rt, hop, w->bwd ? SP_MSG_BACKWARD : SP_MSG_FORWARD, t, n, w->prompts, w->P, w->out,
                     w->bwd && w->prompts ? w->gp : NULL, w->B, w->T, hop->keep, &w->pp, &w->retry, &w->err);
    for (int k = w->pos + 1; k < w->n && (w->st || (w->pp.next >= 0 && !w->pp.pushed)); k++)
        __atomic_store_n(&w->aborts[k], 1, __ATOMIC_RELAXED);
    gate_leave(w->tk, w->s, w->bwd); /* (failed too: a stage run again after it runs outside the pipe's order) */
    return NULL;
}

/* The ids and tokens a pass's hops await their inputs by: ids count up (they need not be secret), tokens are
 * random. */
static void pass_keys(sp_runtime *rt, uint64_t *id, uint64_t *token, int n)
{
    for (int h = 0; h < n; h++) {
        id[h] = __atomic_add_fetch(&rt->next_keep, 1, __ATOMIC_RELAXED);
        while (!(token[h] = sp_rng_fresh_seed()))
            ;
    }
}

/* Runs a pushed pass over the route's stages in order ord[0..n) (ord[0] gets its input from the client, each pushes
 * to the next), each entering its stage's gate before its request goes out: w[i] set up by the caller but for the
 * push fields. Returns the position i in ord from which the pass goes on client-driven (n: every hop answered and
 * every push arrived), with *failed (1: ord[i] itself failed; 0: the push into it did not arrive; -1: it refused to
 * await its input, an older server, told so by sp_rt_refused_await), *bad and *retry as stage_forward's, or the
 * pipe's error in *st. */
static int run_pass(sp_runtime *rt, pass_hop *w, const int *ord, int n, int *failed, int *bad, int *retry,
                    sp_status *st, sp_err *err)
{
    uint64_t id[SP_RT_MAX_HOPS], token[SP_RT_MAX_HOPS];
    int aborts[SP_RT_MAX_HOPS] = {0}, before = 0, from = n, srv[SP_RT_MAX_HOPS] = {0};
    pass_keys(rt, id, token, n);
    for (int i = 0; i < n; i++)
        srv[i] = w[ord[i]].r->hop[w[ord[i]].s].server;
    sp_encoding enc = sp_rt_wire(rt, srv, n, w[0].T, NULL);
    for (int i = 0; i < n && !*st; i++) {
        pass_hop *x = &w[ord[i]];
        const sp_hop *hop = &x->r->hop[x->s];
        x->aborts = aborts;
        x->pos = i;
        x->n = n;
        x->pp = (hop_push){.await = i ? id[i] : 0, .await_token = i ? token[i] : 0,
                           .next = i + 1 < n ? x->r->hop[ord[i + 1]].server : -1,
                           .push_id = i + 1 < n ? id[i + 1] : 0, .push_token = i + 1 < n ? token[i + 1] : 0,
                           .extra_ms = before, .abort = &aborts[i], .enc = enc};
        before += sp_rt_timeout_ms(rt, hop->server, hop->end - hop->start, (long)x->B * x->T * (x->bwd ? 3 : 1), 0) +
                  2000;
        if ((*st = gate_enter(x->r, x->tk, x->s, x->bwd, err)) || pthread_create(&x->th, NULL, pass_main, x)) {
            if (!*st)
                *st = sp_errf(err, SP_ERR_NOMEM, "could not start a thread");
            for (int k = 0; k < n; k++)
                __atomic_store_n(&aborts[k], 1, __ATOMIC_RELAXED);
            break;
        }
        x->started = 1;
    }
    if (!*st)
        __atomic_add_fetch(&rt->passes_pushed, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < n; i++) {
        pass_hop *x = &w[ord[i]];
        if (x->started)
            pthread_join(x->th, NULL);
        if (from < n || *st)
            continue;
        if (x->st && x->pp.refused) {
            from = i;
            *failed = -1;
            sp_rt_refused_await(rt, x->r->hop[x->s].server, SP_CAP_SPAN_PUSH, &x->err);
        } else if (i && !w[ord[i - 1]].pp.pushed) { /* (its server may have pushed and failed to answer: the same) */
            from = i;
            *failed = 0;
        } else if (x->st) {
            from = i;
            *failed = 1;
            *bad = x->r->hop[x->s].server;
            *retry = x->retry;
            *st = x->st;
            if (err)
                *err = x->err;
        } else {
            sp_rt_succeeded(rt, x->r->hop[x->s].server);
        }
    }
    return from;
}

/* After a pushed pass stopped at stage s because the push from stage p did not arrive: where s then answered the
 * client, p cannot push to it now (an address it cannot reach, a server holding too many pushed inputs, ...), and
 * training's passes between them go client-driven for a while (SP_RT_NO_PUSH_S, doubled each time it misses again,
 * up to SP_RT_NO_PUSH_MAX_S), saying so; then they are pushed again. */
static void push_missed(sp_runtime *rt, const sp_route *r, int p, int s, int into)
{
    if (r->hop[s].server != into || r->hop[p].server < 0)
        return;
    int i = r->hop[p].server;
    double now = sp_runtime_now(rt);
    pthread_mutex_lock(&rt->lock);
    sp_server_entry *e = rt->servers[i];
    if (e->no_push_until > now && e->no_push_to == into) { /* told already (another pass of the same pause) */
        pthread_mutex_unlock(&rt->lock);
        return;
    }
    double pause = e->no_push_s > 0 ? fmin(2 * e->no_push_s, SP_RT_NO_PUSH_MAX_S) : SP_RT_NO_PUSH_S;
    e->no_push_s = pause;
    e->no_push_to = into;
    e->no_push_until = now + pause;
    pthread_mutex_unlock(&rt->lock);
    char label[160], next[160];
    sp_rt_server_label(rt, i, label, sizeof label);
    sp_rt_server_label(rt, into, next, sizeof next);
    sp_rt_emitf(rt, SP_EV_SERVER, i, "%s could not push to the next server (%s): training's passes between them are "
                "client-driven for %.0f s", label, next, pause);
}

/* After a pass whose every push arrived: its servers' next pauses (push_missed) start from SP_RT_NO_PUSH_S again. */
static void push_arrived(sp_runtime *rt, const sp_route *r)
{
    double now = sp_runtime_now(rt);
    pthread_mutex_lock(&rt->lock);
    for (int h = 0; h < r->nhops; h++) {
        sp_server_entry *e = r->hop[h].server >= 0 ? rt->servers[r->hop[h].server] : NULL;
        if (e && e->no_push_until <= now)
            e->no_push_s = 0;
    }
    pthread_mutex_unlock(&rt->lock);
}

/* A pushed FORWARD of hidden [B, T, H] (in place) over the route's stages, boundaries as forward's (or NULL): see
 * run_pass. *from: the stage it goes on from client-driven (nstages: none), hidden then holding that stage's input;
 * an error with *retry is that stage's failure, to recover from. */
static sp_status forward_pushed(sp_runtime *rt, sp_route *r, float *hidden, int B, int T, const float *prompts,
                                int P, float *boundaries, const sp_pipe_ticket *tk, int *from, int *failed, int *bad,
                                int *retry, sp_err *err)
{
    int n = r->nstages, ord[SP_RT_MAX_HOPS];
    size_t N = (size_t)B * T * rt->local->cfg.hidden;
    /* the last stage's output at 0, and without boundaries, stage s's input at s */
    float *buf = malloc((boundaries ? 1 : (size_t)n) * N * sizeof(float));
    *from = 0;
    if (!buf)
        return SP_OK; /* client-driven */
    pass_hop w[SP_RT_MAX_HOPS];
    for (int s = 0; s < n; s++) {
        r->hop[s].keep = boundaries ? new_keep(rt) : 0;
        w[s] = (pass_hop){.rt = rt, .r = r, .tk = tk, .s = s, .B = B, .T = T, .P = P, .prompts = prompts,
                          .in = s ? NULL : hidden,
                          .out = s + 1 == n ? buf : boundaries ? boundaries + (s + 1) * N : buf + (s + 1) * N};
        ord[s] = s;
    }
    if (boundaries)
        memcpy(boundaries, hidden, N * sizeof(float));
    sp_status st = SP_OK;
    *from = run_pass(rt, w, ord, n, failed, bad, retry, &st, err);
    if (*from == n)
        memcpy(hidden, buf, N * sizeof(float));
    else if (*from > 0)
        memcpy(hidden, boundaries ? boundaries + *from * N : buf + *from * N, N * sizeof(float));
    for (int s = *from; s < n; s++)
        r->hop[s].keep = 0; /* kept again when run again */
    free(buf);
    return st;
}

/* A pushed BACKWARD of grad [B, T, H] (in place) over the route's stages, from the last: see run_pass. *from: the
 * stage it goes on from client-driven (-1: none), grad then holding that stage's grad_out. */
static sp_status backward_pushed(sp_runtime *rt, sp_route *r, float *grad, int B, int T, const float *prompts, int P,
                                 const float *boundaries, float *gp, const sp_pipe_ticket *tk, int *from, int *failed,
                                 int *bad, int *retry, sp_err *err)
{
    int n = r->nstages, ord[SP_RT_MAX_HOPS];
    size_t N = (size_t)B * T * rt->local->cfg.hidden;
    float *buf = malloc((size_t)n * N * sizeof(float)); /* stage s's grad_in at s */
    *from = n - 1;
    if (!buf)
        return SP_OK;
    pass_hop w[SP_RT_MAX_HOPS];
    for (int s = 0; s < n; s++) {
        w[s] = (pass_hop){.rt = rt, .r = r, .tk = tk, .s = s, .bwd = 1, .B = B, .T = T, .P = P, .prompts = prompts,
                          .in = boundaries + s * N, .grad = s == n - 1 ? grad : NULL, .out = buf + s * N, .gp = gp};
        ord[s] = n - 1 - s;
    }
    sp_status st = SP_OK;
    int i = run_pass(rt, w, ord, n, failed, bad, retry, &st, err);
    *from = i == n ? -1 : ord[i];
    if (*from < 0)
        memcpy(grad, buf, N * sizeof(float));
    else if (*from < n - 1)
        memcpy(grad, buf + (*from + 1) * N, N * sizeof(float));
    for (int k = 0; k < n && k <= i; k++)
        if (k < i || *failed)
            r->hop[ord[k]].keep = 0; /* used (or maybe: a failed hop's); a stage whose input did not come keeps it */
    free(buf);
    return st;
}

/* Before a FORWARD's or BACKWARD's stages run client-driven: a pushed pass where the route and the setting allow it,
 * then its recovery where a stage failed (see forward_pushed; *attempt 1 then, else 0). *missed: the stage a push
 * did not reach (-1: none), *into its server then. */
static sp_status pushed_first(sp_runtime *rt, sp_route *route, int bwd, float *x, int B, int T, const float *prompts,
                              int P, float *boundaries, float *gp, const sp_pipe_ticket *tk, int *from, int *attempt,
                              int *missed, int *into, sp_err *err)
{
    int failed = 0, bad = -1, retry = 0;
    *attempt = 0;
    sp_status st = bwd ? backward_pushed(rt, route, x, B, T, prompts, P, boundaries, gp, tk, from, &failed, &bad,
                                         &retry, err)
                       : forward_pushed(rt, route, x, B, T, prompts, P, boundaries, tk, from, &failed, &bad, &retry,
                                        err);
    *missed = -1;
    if (st && retry) {
        *attempt = 1;
        return recover_stage(rt, route, *from, bad, 0, err);
    }
    if (!st && !failed && *from >= 0 && *from < route->nstages) {
        *missed = *from;
        *into = route->hop[*from].server;
    } else if (!st && (bwd ? *from < 0 : *from == route->nstages)) {
        push_arrived(rt, route);
    }
    return st;
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
    int s0 = 0, pushed = sp_rt_train_pushable(rt, route), missed = -1, into = -1, attempt0 = 0;
    if (pushed) /* (its stages entered the pipe's gates: the rest runs outside them) */
        st = pushed_first(rt, route, 0, hidden, B, T, prompts, P, boundaries, NULL, tk, &s0, &attempt0, &missed, &into,
                          err);
    for (int s = s0; s < route->nstages && !st; s++) {
        float *in = boundaries ? boundaries + s * N : tmp;
        memcpy(in, hidden, N * sizeof(float));
        if (!pushed && (st = gate_enter(route, tk, s, 0, err)))
            break;
        for (int attempt = s == s0 ? attempt0 : 0;; attempt++) {
            int bad = -1, retry = 0;
            st = stage_forward(rt, route, s, hidden, B, T, prompts, P, boundaries != NULL, NULL, &bad, &retry, err);
            if (!st || !retry || (st = recover_stage(rt, route, s, bad, attempt, err)))
                break;
            memcpy(hidden, in, N * sizeof(float));
        }
        if (!pushed)
            gate_leave(tk, s, 0);
        if (!st && s == missed && s > 0)
            push_missed(rt, route, s - 1, s, into);
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
    int s0 = route->nstages - 1, pushed = sp_rt_train_pushable(rt, route), missed = -1, into = -1, attempt0 = 0;
    if (pushed)
        st = pushed_first(rt, route, 1, grad, B, T, prompts, P, (float *)boundaries, grad_prompts, tk, &s0, &attempt0,
                          &missed, &into, err);
    for (int s = s0; s >= 0 && !st; s--) {
        memcpy(gin, grad, N * sizeof(float));
        if (!pushed && (st = gate_enter(route, tk, s, 1, err)))
            break;
        for (int attempt = s == s0 ? attempt0 : 0;; attempt++) {
            int bad = -1, retry = 0;
            st = stage_backward(rt, route, s, boundaries + s * N, grad, B, T, prompts, P, grad_prompts, &bad, &retry,
                                err);
            if (!st || !retry || (st = recover_stage(rt, route, s, bad, attempt, err)))
                break;
            memcpy(grad, gin, N * sizeof(float));
        }
        if (!pushed)
            gate_leave(tk, s, 1);
        if (!st && s == missed && s + 1 < route->nstages)
            push_missed(rt, route, s + 1, s, into);
    }
    free(gin);
    return st;
}
