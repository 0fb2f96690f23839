/* session.c - the swarm as an LM for generation: inference sessions along the route. */
#include "swarm_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------- */
/* the swarm as an LM: sessions along the route */

static void swarm_close_sessions(sp_lm_swarm *s)
{
    for (int h = 0; h < s->nhops; h++) {
        if (s->session[h]) {
            char meta[64];
            snprintf(meta, sizeof meta, "{\"session\":%llu}", (unsigned long long)s->session[h]);
            sp_reply rep;
            sp_remote_call(sp_rt_hop_conn(s->rt, h), SP_MSG_INFERENCE_CLOSE, meta, NULL, 0, &rep, 5000, NULL);
            sp_reply_clear(&rep);
        }
        free(s->history[h]);
        s->history[h] = NULL;
        s->session[h] = 0;
    }
    free(s->hypo);
    s->hypo = NULL;
    s->nhops = 0;
}

static sp_status swarm_begin(void *ctx, int B, int max_length, sp_err *err)
{
    sp_lm_swarm *s = ctx;
    sp_runtime *rt = s->rt;
    if (!rt->nroute && sp_runtime_route(rt, err))
        return err ? err->code : SP_ERR_NOTFOUND;
    s->B = B;
    s->max_length = max_length + s->P; /* the prompts take the first P positions */
    max_length = s->max_length;
    s->pos = 0;
    s->nhops = rt->nroute;
    size_t H = (size_t)rt->local->cfg.hidden;
    for (int h = 0; h < s->nhops; h++) {
        char meta[160];
        snprintf(meta, sizeof meta, "{\"start\":%d,\"end\":%d,\"max_length\":%d,\"batch\":%d}", rt->route[h].start,
                 rt->route[h].end, max_length, B);
        sp_reply rep;
        sp_status st = sp_remote_call(sp_rt_hop_conn(rt, h), SP_MSG_INFERENCE_OPEN, meta, NULL, 0, &rep, CALL_TIMEOUT_MS, err);
        int64_t id = 0;
        if (!st && !sp_meta_int(&rep.msg, "session", &id))
            st = sp_errf(err, SP_ERR_FORMAT, "INFERENCE_OPEN reply without a session id");
        sp_reply_clear(&rep);
        s->session[h] = (uint64_t)id;
        s->history[h] = st ? NULL : malloc((size_t)B * max_length * H * sizeof(float));
        if (!st && !s->history[h])
            st = sp_errf(err, SP_ERR_NOMEM, "out of memory");
        if (st) {
            s->nhops = h + 1;
            swarm_close_sessions(s);
            return sp_err_prefix(err, "%s:%d: ", rt->servers[rt->route[h].server].host,
                                 rt->servers[rt->route[h].server].port);
        }
    }
    return SP_OK;
}

/* Appends x [B, T, H] to the history of hop h at positions pos.. */
static void keep_history(sp_lm_swarm *s, int h, const float *x, int T)
{
    size_t H = (size_t)s->rt->local->cfg.hidden;
    for (int b = 0; b < s->B; b++)
        memcpy(s->history[h] + ((size_t)b * s->max_length + s->pos) * H, x + (size_t)b * T * H, T * H * sizeof(float));
}

/* One INFERENCE_STEP on hop h: x [B, T, H] in place; deep: the hop's deep prompts [n, B, P, H] or NULL. */
static sp_status step_hop(sp_lm_swarm *s, int h, float *x, int T, const float *deep, sp_err *err)
{
    sp_runtime *rt = s->rt;
    int H = rt->local->cfg.hidden, nb = rt->route[h].end - rt->route[h].start;
    char meta[96];
    snprintf(meta, sizeof meta, "{\"session\":%llu}", (unsigned long long)s->session[h]);
    sp_tensor_src t[3] = {{.enc = SP_ENC_F32, .rank = 3, .shape = {s->B, T, H}, .f32 = x}};
    int n = 1;
    if (deep)
        t[n++] = (sp_tensor_src){.enc = SP_ENC_F32, .rank = 4, .shape = {nb, s->B, s->P, H}, .f32 = deep};
    if (s->hypo)
        t[n++] = (sp_tensor_src){.enc = SP_ENC_I64, .rank = 1, .shape = {s->B}, .raw = s->hypo};
    sp_reply rep;
    sp_status st = sp_remote_call(sp_rt_hop_conn(rt, h), SP_MSG_INFERENCE_STEP, meta, t, n, &rep, CALL_TIMEOUT_MS, err);
    if (!st) {
        const sp_tensor_view *o = rep.msg.n_tensors ? &rep.msg.t[0] : NULL;
        if (!o || o->rank != 3 || o->shape[0] != s->B || o->shape[1] != T || o->shape[2] != H)
            st = sp_errf(err, SP_ERR_FORMAT, "step reply is not [%d, %d, %d]", s->B, T, H);
        else if (!sp_tensor_all_finite(o))
            st = sp_errf(err, SP_ERR_FORMAT, "step reply holds non-finite values");
        else
            st = sp_tensor_to_f32(o, x, err);
    }
    sp_reply_clear(&rep);
    if (st)
        sp_err_prefix(err, "%s:%d (blocks %d:%d): ", rt->servers[rt->route[h].server].host,
                      rt->servers[rt->route[h].server].port, rt->route[h].start, rt->route[h].end);
    return st;
}

/* The first step with prompts: [B, P + T, H] = shallow prompts then the tokens' embeddings in place of x
 * (x [B, T, H] embedded); deep prompts broadcast over the batch, [L, B, P, H]. */
static sp_status with_prompts(sp_lm_swarm *s, float **x, int B, int T, float **deep, sp_err *err)
{
    size_t H = (size_t)s->rt->local->cfg.hidden, P = (size_t)s->P, L = (size_t)s->rt->local->cfg.n_layers;
    float *y = calloc((size_t)B * (P + T) * H, sizeof(float));
    *deep = s->deep ? malloc(L * B * P * H * sizeof(float)) : NULL;
    if (!y || (s->deep && !*deep)) {
        free(y);
        free(*deep);
        *deep = NULL;
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    }
    for (int b = 0; b < B; b++) {
        if (s->shallow)
            memcpy(y + (size_t)b * (P + T) * H, s->shallow, P * H * sizeof(float));
        memcpy(y + ((size_t)b * (P + T) + P) * H, *x + (size_t)b * T * H, T * H * sizeof(float));
    }
    for (size_t l = 0; *deep && l < L; l++)
        for (int b = 0; b < B; b++)
            memcpy(*deep + (l * B + b) * P * H, s->deep + l * P * H, P * H * sizeof(float));
    free(*x);
    *x = y;
    return SP_OK;
}

static sp_status swarm_forward(void *ctx, const int32_t *ids, int B, int T, float *logits, sp_err *err)
{
    sp_lm_swarm *s = ctx;
    sp_runtime *rt = s->rt;
    int H = rt->local->cfg.hidden, V = rt->local->cfg.vocab;
    float *x = malloc((size_t)B * T * H * sizeof(float)), *last = malloc((size_t)B * H * sizeof(float));
    float *deep = NULL;
    sp_status st = x && last ? sp_model_embed(rt->local, x, ids, B * T, err) : sp_errf(err, SP_ERR_NOMEM, "out of memory");
    if (!st && s->pos == 0 && s->P > 0) {
        st = with_prompts(s, &x, B, T, &deep, err);
        T += s->P;
    }
    for (int h = 0; !st && h < s->nhops; h++) {
        keep_history(s, h, x, T);
        size_t off = (size_t)rt->route[h].start * B * s->P * H;
        st = step_hop(s, h, x, T, deep ? deep + off : NULL, err);
    }
    free(deep);
    free(s->hypo); /* the reorder went out with this step to every hop */
    s->hypo = NULL;
    for (int b = 0; !st && b < B; b++)
        memcpy(last + (size_t)b * H, x + ((size_t)b * T + T - 1) * H, (size_t)H * sizeof(float));
    if (!st)
        st = sp_model_head(rt->local, logits, last, B, err);
    if (!st)
        s->pos += T;
    free(x);
    free(last);
    (void)V;
    return st;
}

/* The servers reorder with the next step (hypo_ids); the history is reordered here, now. */
static sp_status swarm_reorder(void *ctx, const int64_t *src, int B, sp_err *err)
{
    sp_lm_swarm *s = ctx;
    size_t H = (size_t)s->rt->local->cfg.hidden, row = (size_t)s->max_length * H;
    int64_t *composed = malloc((size_t)B * sizeof *composed);
    float *tmp = malloc((size_t)B * row * sizeof(float));
    if (!composed || !tmp) {
        free(composed);
        free(tmp);
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    }
    for (int b = 0; b < B; b++) /* two reorders before a step compose */
        composed[b] = s->hypo ? s->hypo[src[b]] : src[b];
    for (int h = 0; h < s->nhops; h++) {
        memcpy(tmp, s->history[h], (size_t)B * row * sizeof(float));
        for (int b = 0; b < B; b++)
            memcpy(s->history[h] + b * row, tmp + src[b] * row, (size_t)s->pos * H * sizeof(float));
    }
    free(tmp);
    free(s->hypo);
    s->hypo = composed;
    return SP_OK;
}

static void swarm_end(void *ctx) { swarm_close_sessions(ctx); }

void sp_lm_swarm_prompts(sp_lm_swarm *s, sp_lm *lm, const float *shallow, const float *deep, int P)
{
    s->shallow = shallow;
    s->deep = deep;
    s->P = P > 0 ? P : 0;
    lm->max_pos = s->rt->local->cfg.max_pos - s->P;
}

sp_lm sp_lm_swarm_make(sp_lm_swarm *s, sp_runtime *rt)
{
    memset(s, 0, sizeof *s);
    s->rt = rt;
    return (sp_lm){.ctx = s, .vocab = rt->local->cfg.vocab, .max_pos = rt->local->cfg.max_pos, .begin = swarm_begin,
                   .forward = swarm_forward, .reorder = swarm_reorder, .end = swarm_end};
}

