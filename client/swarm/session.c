/* session.c - the swarm as an LM for generation: inference sessions along a min-latency route, and their
 * recovery (Petals' design, reference/petals-internals.md §5.5, without its bugs).
 *
 * Every hop keeps the history of the hidden states that entered it, [B, max_length, H], reordered whenever
 * beam search reorders the caches. When a hop fails (its server died, hung past the step timeout, or
 * answered with an error or non-finite values), the server is banned, the hop's blocks are routed anew
 * (one or more replacement hops), and each replacement session is `fresh`: its first step sends the whole
 * history from position 0 (with the deep prompts, if any) and gets the full-length output, which is also
 * the history of the next fresh hop; the first hop after them that had already stepped gets only the new
 * positions. The output is the same as without the failure. A failure of a replacement during that replay
 * is handled the same way, up to the max_retries setting. */
#include "swarm_impl.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devparts.h"
#include "timeutil.h"
#include "trace.h"

/* ---------------------------------------------------------------------------------------------- */
/* sessions of hops */

static void close_session(sp_lm_swarm *s, int h, int timeout_ms)
{
    if (!s->session[h])
        return;
    char meta[64];
    sp_close_req q = {.session = s->session[h]};
    sp_close_req_encode(&q, meta, sizeof meta, NULL);
    sp_reply rep;
    sp_rt_call(s->rt, s->route.hop[h].server, SP_MSG_INFERENCE_CLOSE, meta, NULL, 0, &rep, timeout_ms, NULL);
    sp_reply_clear(&rep);
    s->session[h] = 0;
}

/* fn(s, h, arg) for every hop h of n at once: hops 1.. on threads of their own (one that cannot start runs on the
 * caller after), hop 0 on the caller; returns when every one is done. A request to every server of a route
 * (opening, closing its session) then costs one round trip over far links, not one per hop. */
typedef void (*hop_fn)(sp_lm_swarm *s, int h, void *arg);
typedef struct hop_thread {
    sp_lm_swarm *s;
    int h, started;
    hop_fn fn;
    void *arg;
    pthread_t th;
} hop_thread;

static void *hop_thread_main(void *a)
{
    hop_thread *t = a;
    t->fn(t->s, t->h, t->arg);
    return NULL;
}

static void each_hop_at_once(sp_lm_swarm *s, int n, hop_fn fn, void *arg)
{
    hop_thread t[SP_RT_MAX_HOPS];
    for (int h = 1; h < n; h++) {
        t[h] = (hop_thread){.s = s, .h = h, .fn = fn, .arg = arg};
        t[h].started = pthread_create(&t[h].th, NULL, hop_thread_main, &t[h]) == 0;
    }
    if (n > 0)
        fn(s, 0, arg);
    for (int h = 1; h < n; h++) {
        if (t[h].started)
            pthread_join(t[h].th, NULL);
        else
            fn(s, h, arg);
    }
}

static void close_one(sp_lm_swarm *s, int h, void *arg) { close_session(s, h, *(const int *)arg); }

/* Every hop's session closed (at once: each close waits up to 2 s for its reply) and its history freed. */
static void free_hops(sp_lm_swarm *s)
{
    int timeout_ms = 2000;
    each_hop_at_once(s, s->route.nhops, close_one, &timeout_ms);
    for (int h = 0; h < s->route.nhops; h++) {
        free(s->history[h]);
        s->history[h] = NULL;
    }
    s->route.nhops = 0;
    s->hypo = NULL;
}

/* INFERENCE_OPEN for hop (B rows, max_length positions): the session id into *id, its push token into *token. */
static sp_status open_session(sp_lm_swarm *s, const sp_hop *hop, uint64_t *id, uint64_t *token, sp_reply *rep,
                              sp_err *err)
{
    sp_runtime *rt = s->rt;
    char meta[160];
    sp_open_req q = {.start = hop->start, .end = hop->end, .max_length = s->max_length, .batch = s->B};
    sp_open_reply a = {0};
    sp_open_req_encode(&q, meta, sizeof meta, NULL); /* (out of range: "", which the server refuses) */
    sp_status st = sp_rt_call(rt, hop->server, SP_MSG_INFERENCE_OPEN, meta, NULL, 0, rep,
                              sp_rt_timeout_ms(rt, hop->server, 0, 0, 1) + 5000, err);
    if (!st)
        st = sp_open_reply_decode(&rep->msg, &a, err);
    *id = a.session;
    *token = st ? 0 : a.push_token;
    if (st) {
        char label[160];
        sp_rt_server_label(rt, hop->server, label, sizeof label);
        sp_err_prefix(err, "%s (blocks %d:%d): ", label, hop->start, hop->end);
    }
    return st;
}

static float *new_history(const sp_lm_swarm *s)
{
    return malloc((size_t)s->B * s->max_length * (size_t)s->rt->local->cfg.hidden * sizeof(float));
}

typedef struct opened { /* a hop's INFERENCE_OPEN: how it went */
    sp_status st;
    sp_reply rep;
    sp_err err;
} opened;

static void open_one(sp_lm_swarm *s, int h, void *arg)
{
    opened *o = (opened *)arg + h;
    o->st = open_session(s, &s->route.hop[h], &s->session[h], &s->token[h], &o->rep, &o->err);
}

/* A history and a session on every hop of s->route, the sessions opened at once (one round trip over far links, not
 * one a hop). The first hop (in route order) that failed: its index into *failed (else -1), its reply into rep (an
 * ERROR's code: sp_rt_retryable) and its error into err; the sessions the other hops opened stay in s->session,
 * which free_hops closes. */
static sp_status open_sessions(sp_lm_swarm *s, int *failed, sp_reply *rep, sp_err *err)
{
    int n = s->route.nhops;
    *failed = -1;
    for (int h = 0; h < n; h++) {
        s->fresh[h] = 0;
        s->session[h] = 0;
        s->history[h] = NULL;
    }
    for (int h = 0; h < n; h++) {
        if (!(s->history[h] = new_history(s))) {
            *failed = h;
            return sp_errf(err, SP_ERR_NOMEM, "out of memory");
        }
    }
    opened o[SP_RT_MAX_HOPS];
    memset(o, 0, sizeof o);
    each_hop_at_once(s, n, open_one, o);
    sp_status st = SP_OK;
    for (int h = 0; h < n; h++) {
        if (o[h].st && !st) {
            st = o[h].st;
            *failed = h;
            *rep = o[h].rep;
            if (err)
                *err = o[h].err;
        } else {
            sp_reply_clear(&o[h].rep);
        }
    }
    return st;
}

/* Replaces hop h by a new route over its blocks, with sessions open on every new hop, or changes nothing
 * (a server that fails to open a session is banned: *failed names it, -1 if the failure was not a server's).
 * The new hops are fresh; the first inherits h's history (what entered those blocks). The failed hop's
 * session is closed when its server is alive (it answered with an error); a dead or hung one frees it when
 * its connection closes. */
static sp_status replace_hop(sp_lm_swarm *s, int h, int server_alive, int *failed, sp_err *err)
{
    sp_runtime *rt = s->rt;
    sp_hop old = s->route.hop[h];
    sp_route r = {0};
    *failed = -1;
    sp_status st = sp_runtime_route_inference(rt, old.start, old.end, s->max_length, &r, err);
    int k = st ? 0 : r.nhops, n = s->route.nhops;
    if (!st && n - 1 + k > SP_RT_MAX_HOPS)
        st = sp_errf(err, SP_ERR_RANGE, "a route of more than %d hops", SP_RT_MAX_HOPS);
    uint64_t ids[SP_RT_MAX_HOPS] = {0}, tokens[SP_RT_MAX_HOPS] = {0};
    float *hist[SP_RT_MAX_HOPS] = {0};
    for (int i = 0; i < k && !st; i++) {
        sp_reply rep;
        st = open_session(s, &r.hop[i], &ids[i], &tokens[i], &rep, err);
        if (st && sp_rt_retryable(st, &rep))
            *failed = r.hop[i].server;
        sp_reply_clear(&rep);
        if (!st && i > 0 && !(hist[i] = new_history(s)))
            st = sp_errf(err, SP_ERR_NOMEM, "out of memory");
    }
    if (st) { /* nothing changes: close what was opened */
        for (int i = 0; i < k; i++) {
            if (ids[i]) {
                char meta[64];
                sp_close_req q = {.session = ids[i]};
                sp_close_req_encode(&q, meta, sizeof meta, NULL);
                sp_reply rep;
                sp_rt_call(rt, r.hop[i].server, SP_MSG_INFERENCE_CLOSE, meta, NULL, 0, &rep, 1000, NULL);
                sp_reply_clear(&rep);
            }
            free(hist[i]);
        }
        return st;
    }
    if (server_alive)
        close_session(s, h, 1000);
    hist[0] = s->history[h];
    memmove(&s->route.hop[h + k], &s->route.hop[h + 1], (size_t)(n - h - 1) * sizeof s->route.hop[0]);
    memmove(&s->session[h + k], &s->session[h + 1], (size_t)(n - h - 1) * sizeof s->session[0]);
    memmove(&s->token[h + k], &s->token[h + 1], (size_t)(n - h - 1) * sizeof s->token[0]);
    memmove(&s->history[h + k], &s->history[h + 1], (size_t)(n - h - 1) * sizeof s->history[0]);
    memmove(&s->fresh[h + k], &s->fresh[h + 1], (size_t)(n - h - 1) * sizeof s->fresh[0]);
    s->route.nhops = n - 1 + k;
    for (int i = 0; i < k; i++) {
        s->route.hop[h + i] = r.hop[i];
        s->session[h + i] = ids[i];
        s->token[h + i] = tokens[i];
        s->history[h + i] = hist[i];
        s->fresh[h + i] = 1;
    }
    s->route.cost = s->route.local; /* what the new chain predicts */
    for (int i = 0; i < s->route.nhops; i++)
        s->route.cost += s->route.hop[i].latency;
    char text[2048];
    sp_runtime_route_text(rt, &s->route, text, sizeof text);
    sp_rt_emit_route(rt, SP_EV_ROUTE, text, 1, &s->route, NULL);
    return SP_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* begin / end */

static sp_status swarm_begin(void *ctx, int B, int max_length, sp_err *err)
{
    sp_lm_swarm *s = ctx;
    sp_runtime *rt = s->rt;
    int L = rt->local->cfg.n_layers;
    s->B = B;
    s->max_length = max_length + s->P; /* the prompts take the first P positions */
    s->pos = 0;
    s->retries = 0;
    s->no_push = 0;
    sp_model_head_prepare(rt->local); /* (the greedy head's screen: here, not in the prompt's time) */
    sp_err last = {0}; /* the last server's failure */
    for (int attempt = 0;; attempt++) {
        sp_status st = sp_runtime_route_inference(rt, 0, L, s->max_length, &s->route, err);
        if (st == SP_ERR_NOTFOUND && err) /* no server for a block: what to say is the last failure */
            *err = last;
        int failed = -1;
        sp_reply rep = {0};
        if (!st)
            st = open_sessions(s, &failed, &rep, err);
        if (!st) {
            /* buffers for the decode steps' messages (hidden [B, 1, H], hypo_ids [B]) out and back on every hop */
            size_t numel[2] = {(size_t)B * rt->local->cfg.hidden, 2 * (size_t)B};
            sp_buf_spare_seed(sp_msg_size_f32(256, numel, 2), 2 + 2 * s->route.nhops);
            free(s->step_buf);
            free(s->hypo_buf);
            s->step_buf = malloc((size_t)3 * B * rt->local->cfg.hidden * sizeof(float));
            s->hypo_buf = malloc((size_t)B * sizeof *s->hypo_buf);
            if (!s->step_buf || !s->hypo_buf) {
                free_hops(s);
                return sp_errf(err, SP_ERR_NOMEM, "out of memory");
            }
            sp_runtime_note_route(rt, &s->route);
            s->t_step = 0;
            if (!s->active)
                __atomic_add_fetch(&rt->active, 1, __ATOMIC_RELAXED);
            s->active = 1;
            return SP_OK;
        }
        int retry = failed < 0 ? st == SP_ERR_NOTFOUND && sp_rt_no_server(rt, 0, L, attempt, err) /* joining? */
                               : sp_rt_retryable(st, &rep);
        if (failed >= 0) {
            if (retry)
                sp_rt_failed(rt, s->route.hop[failed].server, attempt, err);
            if (err)
                last = *err;
            /* (s->route.nhops stays: every hop got a history, and those after the failed one may hold a session) */
        } else {
            s->route.nhops = 0;
        }
        sp_reply_clear(&rep);
        free_hops(s);
        if (retry && attempt >= rt->set.max_retries)
            sp_err_prefix(err, "no server could run blocks 0:%d (%d retries): ", L, rt->set.max_retries);
        else if (!retry && failed < 0 && st == SP_ERR_NOTFOUND) /* nobody holds a block, nobody is joining */
            sp_err_prefix(err, "no server could run blocks 0:%d: ", L);
        if (!retry || attempt >= rt->set.max_retries)
            return st;
        if (sp_rt_sleep(rt, sp_rt_backoff(rt, attempt + 1)))
            return sp_errf(err, SP_ERR_CANCELLED, "cancelled");
    }
}

static void swarm_end(void *ctx)
{
    SP_TRACE_FLUSH();
    sp_lm_swarm *s = ctx;
    if (s->active)
        __atomic_sub_fetch(&s->rt->active, 1, __ATOMIC_RELAXED);
    s->active = 0;
    free_hops(s);
    free(s->step_buf);
    free(s->hypo_buf);
    free(s->push_out);
    s->step_buf = NULL;
    s->hypo_buf = NULL;
    s->push_out = NULL;
    s->push_out_floats = 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* steps */

/* Rows [B, from..to) of a history as one [B, to - from, H] buffer. */
static float *gather(const sp_lm_swarm *s, const float *hist, int from, int to)
{
    size_t H = (size_t)s->rt->local->cfg.hidden, T = (size_t)(to - from);
    float *x = malloc((size_t)s->B * T * H * sizeof(float));
    for (int b = 0; x && b < s->B; b++)
        memcpy(x + b * T * H, hist + ((size_t)b * s->max_length + from) * H, T * H * sizeof(float));
    return x;
}

/* Writes x [B, T, H] into hist at positions from..from+T. */
static void scatter(const sp_lm_swarm *s, float *hist, const float *x, int from, int T)
{
    size_t H = (size_t)s->rt->local->cfg.hidden;
    for (int b = 0; b < s->B; b++)
        memcpy(hist + ((size_t)b * s->max_length + from) * H, x + (size_t)b * T * H, (size_t)T * H * sizeof(float));
}

/* What a step of a pushed chain adds (step_call): its number, whether its input comes by push (await), the hop
 * its output goes to (next, -1: none), more time for the wait (extra_ms), the flag that ends the wait (abort);
 * back: whether the push arrived (pushed), and whether the server refused to await its input (refused: an ERROR
 * of ours, which an older server gives). */
typedef struct push_args {
    uint64_t step;
    int await, next, extra_ms;
    const int *abort;
    int pushed, refused;
} push_args;

/* Fills q's push fields from pa: the next hop's announced address, session and token. */
static void push_fields(sp_lm_swarm *s, sp_step_req *q, const push_args *pa)
{
    q->step = pa->step;
    q->await = pa->await != 0;
    if (pa->next < 0)
        return;
    sp_rt_push_addr(s->rt, s->route.hop[pa->next].server, q->push_host, sizeof q->push_host, &q->push_port);
    q->push_session = s->session[pa->next];
    q->push_token = s->token[pa->next];
}

/* The encoding of hop h's step of T positions (sp_rt_wire): over its own link, each direction by its rate (its
 * reply's into *back), or a pushed chain's over all of its servers' links (the pushes after it and every hop's reply
 * come in the encoding the first hop's input came in: *back the same). */
static sp_encoding step_wire(sp_lm_swarm *s, int h, const push_args *pa, int T, sp_encoding *back)
{
    int srv[SP_RT_MAX_HOPS], n = 0;
    for (int k = pa ? 0 : h; k < (pa ? s->route.nhops : h + 1); k++)
        srv[n++] = s->route.hop[k].server;
    sp_encoding enc = sp_rt_wire(s->rt, srv, n, T, pa ? NULL : back);
    if (pa)
        *back = enc;
    return enc;
}

/* One INFERENCE_STEP of hop h on x [B, T, H] (in place; with pa->await, x only receives the output) at positions
 * from..from+T; deep: [n, B, P, H] of its blocks or NULL; hypo: the cache reorder or NULL; pa: a pushed chain's
 * step, or NULL. *alive: the server answered (with an error, maybe). */
static sp_status step_call(sp_lm_swarm *s, int h, float *x, int from, int T, const float *deep, const int64_t *hypo,
                           push_args *pa, int *alive, sp_err *err)
{
    sp_runtime *rt = s->rt;
    const sp_hop *hop = &s->route.hop[h];
    int H = rt->local->cfg.hidden, nb = hop->end - hop->start;
    char meta[640]; /* every step says where it starts (Petals' start_from_position): a rollback is a lower one */
    sp_step_req q = {.session = s->session[h], .start_from_position = from, .reply_encoding = -1};
    sp_encoding back, enc = step_wire(s, h, pa, T, &back);
    if (pa)
        push_fields(s, &q, pa);
    else if (back != enc) /* (the same: left out, the request's own) */
        q.reply_encoding = back;
    sp_step_req_encode(&q, meta, sizeof meta, NULL); /* (out of range: "", which the server refuses) */
    sp_tensor_src t[3];
    int n = 0;
    if (!pa || !pa->await) /* in the wire setting's encoding, the reply (and the pushes after it) too */
        t[n++] = (sp_tensor_src){.enc = enc, .rank = 3, .shape = {s->B, T, H}, .f32 = x};
    if (deep)
        t[n++] = (sp_tensor_src){.enc = SP_ENC_F32, .rank = 4, .shape = {nb, s->B, s->P, H}, .f32 = deep};
    if (hypo)
        t[n++] = (sp_tensor_src){.enc = SP_ENC_I64, .rank = 1, .shape = {s->B}, .raw = hypo};
    int timeout = T * s->B > 64 ? sp_rt_timeout_ms(rt, hop->server, nb, (long)s->B * T, 0)
                                : sp_rt_timeout_ms(rt, hop->server, nb, s->B, 1);
    sp_reply rep;
    SP_TRACE(SP_TR_SEND);
    sp_status st = sp_rt_call_abortable(rt, hop->server, SP_MSG_INFERENCE_STEP, meta, t, n, &rep,
                                        timeout + (pa ? pa->extra_ms : 0), pa ? pa->abort : NULL, err);
    SP_TRACE(SP_TR_REPLY);
    *alive = !st || rep.msg.type == SP_MSG_ERROR;
    if (!st) {
        const sp_tensor_view *o = rep.msg.n_tensors ? &rep.msg.t[0] : NULL;
        sp_step_reply a = {0};
        if (!o || o->rank != 3 || o->shape[0] != s->B || o->shape[1] != T || o->shape[2] != H)
            st = sp_errf(err, SP_ERR_FORMAT, "step reply is not [%d, %d, %d]", s->B, T, H);
        else if (!sp_tensor_all_finite(o))
            st = sp_errf(err, SP_ERR_FORMAT, "step reply holds non-finite values");
        else
            st = sp_tensor_to_f32(o, x, err);
        if (pa)
            pa->pushed = !st && sp_step_reply_decode(&rep.msg, &a, NULL) == SP_OK && a.pushed == 1;
    } else if (!sp_rt_retryable(st, &rep)) {
        *alive = -1; /* our request is at fault: no retry */
        if (pa && pa->await && sp_reply_error_code(&rep))
            pa->refused = 1;
    }
    sp_reply_clear(&rep);
    return st;
}

/* The deep prompts [n, B, P, H] of hop h's blocks, out of all blocks' [L, B, P, H] (NULL: none). */
static const float *hop_deep(const sp_lm_swarm *s, const float *deep, int h)
{
    size_t H = (size_t)s->rt->local->cfg.hidden;
    return deep ? deep + (size_t)s->route.hop[h].start * s->B * s->P * H : NULL;
}

/* The trained deep prompts of hop h's blocks broadcast over the batch, [n, B, P, H], for a replay from
 * position 0 (malloc'd; NULL: none, or out of memory: *err says which). */
static float *replay_deep(const sp_lm_swarm *s, int h, sp_status *st, sp_err *err)
{
    *st = SP_OK;
    if (!s->deep || s->P <= 0)
        return NULL;
    size_t H = (size_t)s->rt->local->cfg.hidden, P = (size_t)s->P, nb = (size_t)(s->route.hop[h].end - s->route.hop[h].start);
    float *d = malloc(nb * s->B * P * H * sizeof(float));
    if (!d) {
        *st = sp_errf(err, SP_ERR_NOMEM, "out of memory");
        return NULL;
    }
    for (size_t l = 0; l < nb; l++)
        for (int b = 0; b < s->B; b++)
            memcpy(d + (l * s->B + b) * P * H, s->deep + (s->route.hop[h].start + l) * P * H, P * H * sizeof(float));
    return d;
}

/* Runs hop h for the new positions [pos, pos+T): cur [B, T, H] in, out in place. A fresh hop replays its
 * whole history [0, pos+T) instead, and passes the full output on as the next fresh hop's history. */
static sp_status run_hop(sp_lm_swarm *s, int h, float *cur, int T, const float *deep, int *alive, sp_err *err)
{
    scatter(s, s->history[h], cur, s->pos, T);
    if (!s->fresh[h]) {
        const float *d = s->pos == 0 ? hop_deep(s, deep, h) : NULL;
        return step_call(s, h, cur, s->pos, T, d, s->hypo, NULL, alive, err);
    }
    int full = s->pos + T;
    sp_status st;
    float *d = replay_deep(s, h, &st, err);
    float *x = st ? NULL : gather(s, s->history[h], 0, full);
    if (!x) {
        free(d);
        return st ? st : sp_errf(err, SP_ERR_NOMEM, "out of memory");
    }
    /* from position 0: the deep prompts go with it (the history is already in beam order: no hypo_ids) */
    st = step_call(s, h, x, 0, full, d, NULL, NULL, alive, err);
    free(d);
    if (!st) {
        if (h + 1 < s->route.nhops && s->fresh[h + 1])
            scatter(s, s->history[h + 1], x, 0, full);
        size_t H = (size_t)s->rt->local->cfg.hidden;
        for (int b = 0; b < s->B; b++)
            memcpy(cur + (size_t)b * T * H, x + ((size_t)b * full + s->pos) * H, (size_t)T * H * sizeof(float));
        s->fresh[h] = 0;
    }
    free(x);
    return st;
}

/* A running average of a step's time with sample x (avg <= 0: none yet): a sample is worth a tenth, and counts
 * as at most three times the average (one stalled step, a busy moment, moves it little). */
static double average(double avg, double x)
{
    return avg > 0 ? 0.9 * avg + 0.1 * fmin(x, 3 * avg) : x;
}

/* A greedy decode step took hop_s on hop: what its server's blocks took, less the round trip (its ping), is
 * averaged into the server's block_s, what routing prices its blocks at from then on. */
static void learn_block_s(sp_runtime *rt, const sp_hop *hop, double hop_s)
{
    pthread_mutex_lock(&rt->lock);
    sp_server_entry *e = rt->servers[hop->server];
    if (e->rtt >= 0 && isfinite(e->rtt)) {
        double b = fmax(hop_s - e->rtt, 0) / (hop->end - hop->start);
        e->block_s = average(e->block_s, b);
    }
    pthread_mutex_unlock(&rt->lock);
}

/* The client's own part of greedy decode steps: from one step's start to the next's, less the first one's time
 * on the hops (the embedding, the head, the generation loop and its front end), averaged into rt->local_step_s
 * (what routes over every block add to their cost). now: this step's start. */
static void learn_local(sp_lm_swarm *s, double now)
{
    if (s->t_step <= 0)
        return;
    double local = fmax(now - s->t_step - s->net_s, 0);
    pthread_mutex_lock(&s->rt->lock);
    s->rt->local_step_s = average(s->rt->local_step_s, local);
    pthread_mutex_unlock(&s->rt->lock);
}

/* Hop h failed with st (err says how; alive as step_call set it): its server is banned and the hop's blocks routed
 * anew (replace_hop), retrying until a replacement is in place (SP_OK: run hop h again) or the retries
 * (*attempt, counted over the step) run out, or waiting cannot help (that status). */
static sp_status recover(sp_lm_swarm *s, int h, int alive, int *attempt, sp_status st, sp_err *err)
{
    sp_runtime *rt = s->rt;
    int server = s->route.hop[h].server;
    char label[160];
    sp_rt_server_label(rt, server, label, sizeof label);
    sp_err_prefix(err, "%s (blocks %d:%d): ", label, s->route.hop[h].start, s->route.hop[h].end);
    if (alive < 0)
        return st; /* any server would refuse this request */
    sp_rt_failed(rt, server, *attempt, err);
    /* retry until a replacement works or the retries run out; a failed replacement counts too */
    for (;;) {
        if ((*attempt)++ >= rt->set.max_retries) {
            sp_err_prefix(err, "no server could run blocks %d:%d (%d retries): ", s->route.hop[h].start,
                          s->route.hop[h].end, rt->set.max_retries);
            return st;
        }
        s->retries++;
        if (sp_rt_sleep(rt, sp_rt_backoff(rt, *attempt)))
            return sp_errf(err, SP_ERR_CANCELLED, "cancelled");
        sp_err rerr = {0};
        int bad = -1;
        st = replace_hop(s, h, alive, &bad, &rerr);
        if (!st)
            return SP_OK;
        if (st != SP_ERR_NOTFOUND || bad >= 0) /* (no server for a block: err keeps the last failure) */
            *err = rerr;
        if (bad >= 0) {
            sp_rt_failed(rt, bad, *attempt, err);
        } else if (st != SP_ERR_NOTFOUND) { /* not a server's failure, nor a block without servers */
            return st;
        } else if (!sp_rt_no_server(rt, s->route.hop[h].start, s->route.hop[h].end, *attempt, err)) {
            sp_err_prefix(err, "no server could run blocks %d:%d: ", s->route.hop[h].start, s->route.hop[h].end);
            return st; /* nobody holds a block, and nobody is joining: waiting cannot help */
        }
    }
}

/* cur [B, T, H] through hops h.. (client-driven: the client sends each hop its input), recovering from failures.
 * in: room for [B, T, H] (the input of the hop being run, for a retry). */
static sp_status run_hops_from(sp_lm_swarm *s, int h, float *cur, int T, const float *deep, float *in, int *attempt,
                               sp_err *err)
{
    sp_runtime *rt = s->rt;
    size_t N = (size_t)s->B * T * rt->local->cfg.hidden;
    while (h < s->route.nhops) {
        memcpy(in, cur, N * sizeof(float));
        int alive = 1, server = s->route.hop[h].server;
        double t0 = sp_now_s();
        int fresh = s->fresh[h];
        sp_status st = run_hop(s, h, cur, T, deep, &alive, err);
        if (!st) {
            s->hop_s[h] = sp_now_s() - t0;
            sp_rt_succeeded(rt, server);
            if (T == 1 && s->B == 1 && !fresh)
                learn_block_s(rt, &s->route.hop[h], s->hop_s[h]);
            h++;
            continue;
        }
        if ((st = recover(s, h, alive, attempt, st, err)))
            return st;
        memcpy(cur, in, N * sizeof(float));
    }
    return SP_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* pushed steps: client -> first server -> next server ... -> last server -> client */

/* 1 if this step can go from server to server: the setting (auto: the route was priced and chosen pushed, see
 * route_inference in route.c), no push failed in this session, two hops or more, none of them replaying, each says
 * it can (SP_CAP_STEP_PUSH) and took pushes at open, no server twice (its calls would wait for each other). */
static int pushable(sp_lm_swarm *s)
{
    int mode = s->rt->set.push;
    if (mode == SP_PUSH_OFF || s->no_push || s->route.nhops < 2)
        return 0;
    int ok = 1;
    pthread_mutex_lock(&s->rt->lock);
    for (int h = 0; ok && h < s->route.nhops; h++) {
        const sp_server_entry *e = s->rt->servers[s->route.hop[h].server];
        ok = !s->fresh[h] && s->token[h] && sp_rt_can(s->rt, s->route.hop[h].server, SP_CAP_STEP_PUSH);
        for (int g = 0; ok && g < h; g++)
            ok = s->route.hop[g].server != s->route.hop[h].server &&
                 !sp_rt_same_addr(s->rt->servers[s->route.hop[g].server], e);
    }
    ok = ok && (mode == SP_PUSH_ON || s->route.pushed);
    pthread_mutex_unlock(&s->rt->lock);
    return ok;
}

/* One awaiting hop of a pushed step: its call runs on a thread of its own. */
typedef struct await_hop {
    sp_lm_swarm *s;
    int h, T, alive;
    const float *deep;
    float *out; /* [B, T, H]: its output */
    push_args pa;
    sp_status st;
    sp_err err;
    pthread_t th;
    int started, joined;
} await_hop;

static void *await_main(void *arg)
{
    await_hop *w = arg;
    w->st = step_call(w->s, w->h, w->out, w->s->pos, w->T, w->deep, w->s->hypo, &w->pa, &w->alive, &w->err);
    return NULL;
}

static void await_join(await_hop *w)
{
    if (w->started && !w->joined)
        pthread_join(w->th, NULL);
    w->joined = 1;
}

/* Starts the awaiting calls of hops 1.. of a pushed step (pos.., T positions): each waits as long as the hops
 * before it may take (their timeouts, and a push's 2 s each), and pushes on to the next hop. -1 if a thread
 * could not start (the started ones are told to stop: w[0].pa.abort). */
static int await_start(sp_lm_swarm *s, await_hop *w, int T, const float *deep, int *abort, uint64_t step)
{
    size_t N = (size_t)s->B * T * s->rt->local->cfg.hidden;
    int n = s->route.nhops, before = 0;
    for (int h = 1; h < n; h++) {
        const sp_hop *p = &s->route.hop[h - 1];
        before += (T * s->B > 64 ? sp_rt_timeout_ms(s->rt, p->server, p->end - p->start, (long)s->B * T, 0)
                                 : sp_rt_timeout_ms(s->rt, p->server, p->end - p->start, s->B, 1)) + 2000;
        w[h] = (await_hop){.s = s, .h = h, .T = T, .out = s->push_out + (h - 1) * N,
                           .deep = s->pos == 0 ? hop_deep(s, deep, h) : NULL,
                           .pa = {.step = step, .await = 1, .next = h + 1 < n ? h + 1 : -1, .extra_ms = before,
                                  .abort = abort}};
        if (pthread_create(&w[h].th, NULL, await_main, &w[h])) {
            __atomic_store_n(abort, 1, __ATOMIC_RELAXED);
            for (int g = 1; g < h; g++)
                await_join(&w[g]);
            return -1;
        }
        w[h].started = 1;
    }
    return 0;
}

/* The replies of a pushed step in chain order, into the histories (what entered each hop) and cur (the last
 * hop's output). 0 if every hop answered and pushed on; else the hop to go on from client-driven, cur then
 * holding its input: *failed says whether that hop itself failed (else the push into it did, or it refused to await
 * its input: then it is told so, sp_rt_refused_await, and *refused set), *alive and err how. */
static int await_collect(sp_lm_swarm *s, await_hop *w, float *cur, int T, int pushed0, int *failed, int *refused,
                         int *alive, sp_status *st, sp_err *err)
{
    size_t N = (size_t)s->B * T * s->rt->local->cfg.hidden;
    double t_prev = sp_now_s();
    for (int h = 1; h < s->route.nhops; h++) {
        scatter(s, s->history[h], cur, s->pos, T);
        if (!(h == 1 ? pushed0 : w[h - 1].pa.pushed)) {
            *failed = 0;
            return h;
        }
        await_join(&w[h]);
        if (w[h].st && w[h].pa.refused) { /* an older server: client-driven from it, as a push that did not arrive */
            sp_rt_refused_await(s->rt, s->route.hop[h].server, SP_CAP_STEP_PUSH, &w[h].err);
            *failed = 0;
            *refused = 1;
            return h;
        }
        if (w[h].st) {
            *failed = 1;
            *alive = w[h].alive;
            *st = w[h].st;
            if (err)
                *err = w[h].err;
            return h;
        }
        memcpy(cur, w[h].out, N * sizeof(float));
        double now = sp_now_s();
        s->hop_s[h] = now - t_prev;
        t_prev = now;
        sp_rt_succeeded(s->rt, s->route.hop[h].server);
    }
    return 0;
}

/* A pushed step of cur [B, T, H]: hop 0 gets the input and each hop pushes its output to the next, while the
 * client awaits every hop's output (the next hop's history) on threads. Where a hop fails, or a push does not
 * arrive, the rest of the step is client-driven from there, as run_hops_from: the hops after it replay their
 * history (their state is not known), the failed one is replaced, and pushes stop for the session when a push
 * did not arrive at a server that then answered the client; a server that refused to await its input (an older
 * server) is remembered (sp_rt_refused_await), and the step goes on client-driven from it. *done: the step ran this
 * way (0: it could not start; nothing was sent). */
static sp_status run_pushed(sp_lm_swarm *s, float *cur, int T, const float *deep, float *in, int *attempt, int *done,
                            sp_err *err)
{
    size_t N = (size_t)s->B * T * s->rt->local->cfg.hidden, need = (size_t)(s->route.nhops - 1) * N;
    *done = 0;
    if (s->push_out_floats < need) {
        float *p = realloc(s->push_out, need * sizeof(float));
        if (!p)
            return SP_OK;
        s->push_out = p;
        s->push_out_floats = need;
    }
    await_hop w[SP_RT_MAX_HOPS];
    int abort = 0;
    uint64_t step = ++s->step_no;
    if (await_start(s, w, T, deep, &abort, step))
        return SP_OK;
    *done = 1;
    __atomic_add_fetch(&s->rt->steps_pushed, 1, __ATOMIC_RELAXED);
    memcpy(in, cur, N * sizeof(float));
    scatter(s, s->history[0], cur, s->pos, T);
    push_args pa = {.step = step, .next = 1};
    int alive = 1, failed = 1, refused = 0, from = 0;
    double t0 = sp_now_s();
    sp_status st = step_call(s, 0, cur, s->pos, T, s->pos == 0 ? hop_deep(s, deep, 0) : NULL, s->hypo, &pa, &alive,
                             err);
    s->hop_s[0] = sp_now_s() - t0;
    if (!st) {
        sp_rt_succeeded(s->rt, s->route.hop[0].server);
        from = await_collect(s, w, cur, T, pa.pushed, &failed, &refused, &alive, &st, err);
    } else {
        memcpy(cur, in, N * sizeof(float));
    }
    __atomic_store_n(&abort, 1, __ATOMIC_RELAXED);
    for (int h = 1; h < s->route.nhops; h++)
        await_join(&w[h]);
    if (!st && !from) /* every hop answered, every push arrived */
        return SP_OK;
    for (int h = from + failed; h < s->route.nhops; h++)
        s->fresh[h] = 1; /* it may have stepped, or not: it replays */
    if (failed && (st = recover(s, from, alive, attempt, st, err)))
        return st;
    int into = s->route.hop[from].server; /* (when its push did not arrive) */
    memcpy(in, cur, N * sizeof(float));
    st = run_hops_from(s, from, cur, T, deep, in, attempt, err);
    if (!st && !failed && !refused && s->route.hop[from].server == into) { /* alive, but the push could not reach it */
        s->no_push = 1;
        char label[160];
        sp_rt_server_label(s->rt, s->route.hop[from - 1].server, label, sizeof label);
        sp_rt_emitf(s->rt, SP_EV_SERVER, s->route.hop[from - 1].server,
                    "%s could not push to the next server: this generation's steps are client-driven", label);
    }
    return st;
}

/* cur [B, T, H] through every hop, recovering from failures: pushed from server to server where it can be, else
 * client-driven. deep: all blocks' deep prompts [L, B, P, H] of a first step, or NULL. in: room for [B, T, H]
 * (the input of the hop being run, for a retry), or NULL. */
static sp_status run_hops(sp_lm_swarm *s, float *cur, int T, const float *deep, float *in, sp_err *err)
{
    sp_runtime *rt = s->rt;
    size_t N = (size_t)s->B * T * rt->local->cfg.hidden;
    float *own = in ? NULL : malloc(N * sizeof(float));
    if (!in && !(in = own))
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    int attempt = 0, done = 0;
    sp_status st = pushable(s) ? run_pushed(s, cur, T, deep, in, &attempt, &done, err) : SP_OK;
    if (!done)
        st = run_hops_from(s, 0, cur, T, deep, in, &attempt, err);
    if (!st)
        sp_rt_emit_route(rt, SP_EV_STEP, NULL, 0, &s->route, s->hop_s);
    free(own);
    return st;
}

/* The first step's deep prompts broadcast over the batch, [L, B, P, H] (NULL without deep prompts). */
static sp_status deep_rows(sp_lm_swarm *s, int B, float **deep, sp_err *err)
{
    size_t H = (size_t)s->rt->local->cfg.hidden, P = (size_t)s->P, L = (size_t)s->rt->local->cfg.n_layers;
    *deep = s->deep ? malloc(L * B * P * H * sizeof(float)) : NULL;
    if (s->deep && !*deep)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    for (size_t l = 0; *deep && l < L; l++)
        for (int b = 0; b < B; b++)
            memcpy(*deep + (l * B + b) * P * H, s->deep + l * P * H, P * H * sizeof(float));
    return SP_OK;
}

/* The first step with prompts: [B, P + T, H] = shallow prompts then the tokens' embeddings in place of x
 * (x [B, T, H] embedded); deep prompts broadcast over the batch (deep_rows). */
static sp_status with_prompts(sp_lm_swarm *s, float **x, int B, int T, float **deep, sp_err *err)
{
    size_t H = (size_t)s->rt->local->cfg.hidden, P = (size_t)s->P;
    float *y = calloc((size_t)B * (P + T) * H, sizeof(float));
    sp_status st = y ? deep_rows(s, B, deep, err) : sp_errf(err, SP_ERR_NOMEM, "out of memory");
    if (st) {
        free(y);
        return st;
    }
    for (int b = 0; b < B; b++) {
        if (s->shallow)
            memcpy(y + (size_t)b * (P + T) * H, s->shallow, P * H * sizeof(float));
        memcpy(y + ((size_t)b * (P + T) + P) * H, *x + (size_t)b * T * H, T * H * sizeof(float));
    }
    free(*x);
    *x = y;
    return SP_OK;
}

/* The chain's input x of ids [B, T] (room for [B, P + T, H] where dev): the shallow prompts of a first step with
 * prompts (P > 0), the embeddings, BLOOM's embedding norm; on the CPU, or on the GPU of dev (the `device`
 * setting: devparts.h, one upload of the ids and one download of x); *deep as deep_rows. */
static sp_status chain_input(sp_lm_swarm *s, struct sp_devparts *dev, float **x, const int32_t *ids, int B, int T,
                             int P, float **deep, sp_err *err)
{
    sp_model *m = s->rt->local;
    if (dev) {
        sp_status st = P ? deep_rows(s, B, deep, err) : SP_OK;
        return st ? st : sp_devparts_embed(dev, *x, ids, B, T, s->shallow, P, err);
    }
    sp_status st = sp_model_embed(m, *x, ids, B * T, err);
    if (!st && P)
        st = with_prompts(s, x, B, T, deep, err);
    if (!st) /* BLOOM's embedding LayerNorm, after the shallow prompts */
        sp_model_embed_norm(m, *x, B * (P + T));
    return st;
}

/* One step through the chain, ending in the local head: logits[B, V] of each row's last position, or (logits
 * NULL) each row's greedy choice best[B] through the head's exact argmax (sp_model_head_argmax). */
static sp_status swarm_step(void *ctx, const int32_t *ids, int B, int T, float *logits, int32_t *best, sp_err *err)
{
    sp_lm_swarm *s = ctx;
    sp_runtime *rt = s->rt;
    int H = rt->local->cfg.hidden;
    /* a decode step in the buffer sized at begin; a prefill (maybe with prompts) in memory of its own */
    int decode = T == 1 && B == s->B && s->step_buf && !(s->pos == 0 && s->P > 0);
    SP_TRACE(SP_TR_STEP);
    double now = sp_now_s();
    if (decode && B == 1)
        learn_local(s, now);
    s->t_step = decode && B == 1 ? now : 0;
    size_t BH = (size_t)B * H;
    struct sp_devparts *dev = rt->gen_dev; /* the local parts on a GPU (NULL: the CPU) */
    int P = s->pos == 0 && s->P > 0 ? s->P : 0;
    float *x = decode ? s->step_buf : malloc((size_t)B * (T + (dev ? P : 0)) * H * sizeof(float));
    float *last = decode ? s->step_buf + BH : malloc(BH * sizeof(float)), *in = decode ? s->step_buf + 2 * BH : NULL;
    float *deep = NULL;
    sp_status st = x && last ? chain_input(s, dev, &x, ids, B, T, P, &deep, err)
                             : sp_errf(err, SP_ERR_NOMEM, "out of memory");
    T += P;
    double t_hops = sp_now_s();
    SP_TRACE(SP_TR_HOPS);
    if (!st)
        st = run_hops(s, x, T, deep, in, err);
    s->net_s = sp_now_s() - t_hops;
    SP_TRACE(SP_TR_HOPS_DONE);
    free(deep);
    s->hypo = NULL; /* the reorder went out with this step to every hop */
    for (int b = 0; !st && b < B; b++)
        memcpy(last + (size_t)b * H, x + ((size_t)b * T + T - 1) * H, (size_t)H * sizeof(float));
    if (!st && dev)
        st = sp_devparts_logits(dev, logits, logits ? NULL : best, last, B, err);
    else if (!st && logits)
        st = sp_model_head(rt->local, logits, last, B, err);
    else if (!st)
        st = sp_model_head_argmax(rt->local, best, last, B, err);
    SP_TRACE(SP_TR_HEAD_DONE);
    if (!st)
        s->pos += T;
    if (!decode) {
        free(x);
        free(last);
    }
    return st;
}

static sp_status swarm_forward(void *ctx, const int32_t *ids, int B, int T, float *logits, sp_err *err)
{
    return swarm_step(ctx, ids, B, T, logits, NULL, err);
}

static sp_status swarm_forward_argmax(void *ctx, const int32_t *ids, int B, int T, int32_t *best, sp_err *err)
{
    return swarm_step(ctx, ids, B, T, NULL, best, err);
}

/* The servers reorder with the next step (hypo_ids); the history is reordered here, now, in place. */
static sp_status swarm_reorder(void *ctx, const int64_t *src, int B, sp_err *err)
{
    sp_lm_swarm *s = ctx;
    size_t H = (size_t)s->rt->local->cfg.hidden, row = (size_t)s->max_length * H;
    if (B != s->B || !s->hypo_buf)
        return sp_errf(err, SP_ERR_ARG, "reorder of %d rows in a sequence batch of %d", B, s->B);
    for (int b = 0; b < B; b++)
        if (src[b] < 0 || src[b] >= B)
            return sp_errf(err, SP_ERR_ARG, "reorder: row %d from %lld, outside 0..%d", b, (long long)src[b], B - 1);
    sp_status st = SP_OK;
    for (int h = 0; !st && h < s->route.nhops; h++)
        st = sp_rows_gather(s->history[h], row, (size_t)s->pos * H, src, B, err);
    if (st)
        return st;
    /* two reorders before a step compose: new row b is row hypo[src[b]] of the servers' caches */
    int64_t small[64], *old = s->hypo && B <= 64 ? small : NULL;
    if (s->hypo && !old && !(old = malloc((size_t)B * sizeof *old)))
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    if (old)
        memcpy(old, s->hypo, (size_t)B * sizeof *old);
    for (int b = 0; b < B; b++)
        s->hypo_buf[b] = old ? old[src[b]] : src[b];
    if (old != small)
        free(old);
    s->hypo = s->hypo_buf;
    return SP_OK;
}

/* Back to `pos` token positions (the prompts' P come on top): the next step of every hop starts there; a hop
 * that replays (fresh) sends its history up to there. Back to 0, the prompts go again with the next step. */
static sp_status swarm_rewind(void *ctx, int pos, sp_err *err)
{
    sp_lm_swarm *s = ctx;
    int to = pos > 0 ? pos + s->P : 0;
    if (pos < 0 || to > s->pos)
        return sp_errf(err, SP_ERR_ARG, "rewind to %d: only %d positions so far", pos,
                       s->pos > s->P ? s->pos - s->P : 0);
    s->pos = to;
    return SP_OK;
}

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
                   .forward = swarm_forward, .forward_argmax = swarm_forward_argmax, .reorder = swarm_reorder,
                   .rewind = swarm_rewind, .end = swarm_end};
}
