/* rpc.c - the server's request handlers: argument checks, the span computations, replies. Every bad
 * request gets an ERROR reply (share/doc/protocol.md lists the codes); nothing here ends the process. */
#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "server_impl.h"
#include "span.h"
#include "timeutil.h"
#include "trace.h"
#include "version.h"

typedef struct req {
    sp_server *s;
    uint64_t conn;
    sp_buf *msg; /* the request's bytes (m's views point into them): its buffer carries the answer back */
    sp_msg m;
    sp_encoding reply_enc;
    struct session *held; /* a session this request steps: released before its answer goes out (the client's
                           * next step may arrive at once, on another thread) */
} req;

static void let_go(req *r)
{
    if (r->held)
        session_release(r->s, r->held);
    r->held = NULL;
}

/* ---------------------------------------------------------------------------------------------- */
/* replies */

void sp_rpc_error(sp_server *s, uint64_t conn, uint64_t request_id, const char *code, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    sp_buf b = {0};
    sp_err err = {0};
    if (sp_msg_encode_error(&b, request_id, code, msg, &err) == SP_OK) {
        sp_mx_sent(&s->mx, b.len, 1);
        sp_ws_server_send(s->ws, conn, &b, NULL);
    }
    else
        sp_buf_free(&b);
    sp_log(SP_LOG_DEBUG, "request %llu: %s: %s", (unsigned long long)request_id, code, msg);
}

/* A testing aid: SEPAL_SERVER_FAULT="nan:K" or "error:K" makes this process answer every FORWARD, BACKWARD
 * and INFERENCE_STEP after its first K with non-finite values or an "internal" ERROR: a broken (or hostile)
 * server, real on the wire, for the client's fault-tolerance tests; "slow:MS" answers each of them MS
 * milliseconds late (a slow machine, so that a test can act while a generation streams). Unset: nothing
 * changes. */
static int fault_kind;        /* 0 none, 1 nan, 2 error, 3 slow */
static long fault_after;      /* nan, error: the requests answered right first; slow: the delay in ms */
static long fault_count;
static pthread_once_t fault_once = PTHREAD_ONCE_INIT;

static void fault_init(void)
{
    const char *f = getenv("SEPAL_SERVER_FAULT");
    if (!f || !*f)
        return;
    const char *colon = strchr(f, ':');
    fault_kind = !strncmp(f, "nan", 3) ? 1 : !strncmp(f, "error", 5) ? 2 : !strncmp(f, "slow", 4) ? 3 : 0;
    fault_after = colon ? atol(colon + 1) : 0;
    if (fault_kind == 3)
        sp_log(SP_LOG_WARN, "SEPAL_SERVER_FAULT=%s: answering compute requests %ld ms late", f, fault_after);
    else if (fault_kind)
        sp_log(SP_LOG_WARN, "SEPAL_SERVER_FAULT=%s: answering compute requests after the first %ld wrongly", f,
               fault_after);
}

/* 0: reply as usual; 1: the reply's first value was made NaN; 2: an ERROR is to be sent instead. */
static int fault_hit(req *r, const sp_tensor_src *t, int n)
{
    pthread_once(&fault_once, fault_init);
    if (!fault_kind || (r->m.type != SP_MSG_FORWARD && r->m.type != SP_MSG_BACKWARD &&
                        r->m.type != SP_MSG_INFERENCE_STEP))
        return 0;
    if (fault_kind == 3) {
        struct timespec d = {fault_after / 1000, (fault_after % 1000) * 1000000L};
        nanosleep(&d, NULL);
        return 0;
    }
    if (__atomic_fetch_add(&fault_count, 1, __ATOMIC_SEQ_CST) < fault_after)
        return 0;
    if (fault_kind == 2 || n < 1 || !t[0].f32)
        return 2;
    ((float *)t[0].f32)[0] = NAN; /* the replies' tensors are this handler's (or its session's) own buffers */
    return 1;
}

/* Encodes the answer, then lets go of the session it stepped (whose scratch the tensors may be in), then sends:
 * the client's next step may arrive at once, on another thread. */
static void reply(req *r, const char *meta, const sp_tensor_src *t, int n)
{
    sp_buf b = {0};
    sp_err err = {0};
    if (r->msg) { /* the request is read: its buffer takes the answer (no allocation, nothing to find) */
        b = *r->msg;
        memset(r->msg, 0, sizeof *r->msg);
        r->msg = NULL;
    }
    int fault = fault_hit(r, t, n);
    sp_status st = fault == 2 ? SP_OK : sp_msg_encode(&b, r->m.type, SP_MSG_F_REPLY, r->m.request_id, meta, t, n, &err);
    let_go(r);
    if (fault == 2 || st != SP_OK) {
        sp_buf_free(&b);
        if (fault == 2)
            sp_rpc_error(r->s, r->conn, r->m.request_id, "internal", "injected fault (SEPAL_SERVER_FAULT)");
        else
            sp_rpc_error(r->s, r->conn, r->m.request_id, "internal", "encoding the reply: %s", err.msg);
        return;
    }
    sp_mx_sent(&r->s->mx, b.len, 0);
    SP_TRACE(SP_TR_SRV_SEND);
    sp_ws_server_send(r->s->ws, r->conn, &b, NULL);
    SP_TRACE(SP_TR_SRV_SENT);
}

static sp_tensor_src tensor3(const req *r, const float *x, int B, int T, int H)
{
    return (sp_tensor_src){.enc = r->reply_enc, .rank = 3, .shape = {B, T, H}, .f32 = x};
}

/* ---------------------------------------------------------------------------------------------- */
/* argument checks: each returns -1 after sending the ERROR reply */

static int bad(req *r, const char *code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(req *r, const char *code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    let_go(r);
    sp_rpc_error(r->s, r->conn, r->m.request_id, code, "%s", msg);
    return -1;
}

/* The request's metadata did not decode (its typed decoder's status st and message). */
static int bad_meta(req *r, sp_status st, const sp_err *e)
{
    return st ? bad(r, "bad_request", "%s", e->msg) : 0;
}

/* The span [a, b): a non-empty sub-span of the blocks held. */
static int span_check(req *r, int a, int b)
{
    const sp_model *m = r->s->m;
    if (a < m->first || b > m->last || a >= b)
        return bad(r, "blocks_not_served", "blocks %d:%d requested, this server holds %d:%d", a, b, m->first, m->last);
    return 0;
}

/* A float tensor of the given rank; its last dimension must be the hidden size. */
static int float_tensor(req *r, int idx, const char *name, int rank)
{
    if (idx >= r->m.n_tensors)
        return bad(r, "bad_request", "%s needs tensor %d (%s)", sp_msg_type_name(r->m.type), idx, name);
    const sp_tensor_view *t = &r->m.t[idx];
    if (!sp_encoding_is_float(t->enc))
        return bad(r, "dtype", "%s must be a float tensor, got %s", name, sp_encoding_name(t->enc));
    if (t->rank != rank || t->shape[rank - 1] != r->s->m->cfg.hidden)
        return bad(r, "shape", "%s must be %s with H = %d (got rank %d, last dim %lld)", name,
                   rank == 3 ? "[B, T, H]" : "[n, B, P, H]", r->s->m->cfg.hidden, t->rank,
                   (long long)t->shape[t->rank - 1]);
    if (!sp_tensor_all_finite(t))
        return bad(r, "non_finite", "%s holds NaN or infinite values", name);
    return 0;
}

/* f32 copy of tensor idx (after float_tensor checked it); NULL after an ERROR reply. */
static float *to_f32(req *r, int idx)
{
    const sp_tensor_view *t = &r->m.t[idx];
    float *x = malloc(t->numel * sizeof(float));
    sp_err err = {0};
    if (!x || sp_tensor_to_f32(t, x, &err) != SP_OK) {
        free(x);
        bad(r, "internal", "decoding tensor %d: %s", idx, x ? err.msg : "out of memory");
        return NULL;
    }
    return x;
}

/* hidden [B, T, H] at tensor idx. */
static float *hidden_arg(req *r, int idx, const char *name, int *B, int *T)
{
    if (float_tensor(r, idx, name, 3))
        return NULL;
    *B = (int)r->m.t[idx].shape[0];
    *T = (int)r->m.t[idx].shape[1];
    return to_f32(r, idx);
}

/* Optional deep prompts [n, B, P, H] at tensor idx, n = blocks of the span, P <= T. *P = 0 if absent. */
static int prompts_arg(req *r, int idx, int n, int B, int T, float **prompts, int *P)
{
    *prompts = NULL;
    *P = 0;
    if (idx >= r->m.n_tensors)
        return 0;
    if (float_tensor(r, idx, "prompts", 4))
        return -1;
    const int64_t *sh = r->m.t[idx].shape;
    if (sh[0] != n || sh[1] != B || sh[2] > T)
        return bad(r, "shape", "prompts must be [%d, %d, P <= %d, H], got [%lld, %lld, %lld, H]", n, B, T,
                   (long long)sh[0], (long long)sh[1], (long long)sh[2]);
    *P = (int)sh[2];
    *prompts = to_f32(r, idx);
    return *prompts ? 0 : -1;
}

/* The replies' encoding: the request's reply_encoding (a float encoding, the decoder checked), or -1 for that of
 * its hidden state at tensor hidden_idx. */
static void reply_encoding(req *r, int enc, int hidden_idx)
{
    if (enc >= 0)
        r->reply_enc = (sp_encoding)enc;
    else
        r->reply_enc = hidden_idx < r->m.n_tensors && sp_encoding_is_float(r->m.t[hidden_idx].enc)
                           ? r->m.t[hidden_idx].enc
                           : SP_ENC_F32;
}

/* FORWARD's or BACKWARD's metadata into q: decoded, its span checked against the blocks held, the replies'
 * encoding set. -1 after an ERROR reply. */
static int span_meta(req *r, sp_span_req *q)
{
    sp_err e = {0};
    int fwd = r->m.type == SP_MSG_FORWARD;
    if (bad_meta(r, fwd ? sp_forward_req_decode(&r->m, q, &e) : sp_backward_req_decode(&r->m, q, &e), &e))
        return -1;
    reply_encoding(r, q->reply_encoding, 0);
    return span_check(r, q->start, q->end);
}

/* A pass's request that awaits its input (q->await): the pushed tensor spliced into r's tensors at index `at`
 * (FORWARD's hidden 0, BACKWARD's grad_out 1), the push's message kept in *in (its views in *pm) until the request
 * is done; or the request parked until it comes (its buffer taken: no reply now). -1 when parked or after an ERROR
 * reply. */
static int await_input(req *r, const sp_span_req *q, int at, sp_buf *in, sp_msg *pm)
{
    sp_err err = {0};
    if (r->m.n_tensors < at || r->m.n_tensors >= SP_PROTO_MAX_TENSORS)
        return bad(r, "bad_request", "%s that awaits its input has %d tensors", sp_msg_type_name(r->m.type),
                   r->m.n_tensors);
    int rc = awaits_take(r->s, q->await, q->await_token, r->conn, r->msg, in, &err);
    if (rc < 0)
        return bad(r, "bad_request", "%s", err.msg);
    if (rc == 0) {
        r->msg = NULL;
        return -1;
    }
    if (sp_msg_decode(pm, in->data, in->len, &r->s->limits, &err) || pm->n_tensors < 1)
        return bad(r, "internal", "the pushed input: %s", err.msg[0] ? err.msg : "no tensor");
    memmove(&r->m.t[at + 1], &r->m.t[at], (size_t)(r->m.n_tensors - at) * sizeof *r->m.t);
    r->m.t[at] = pm->t[0];
    r->m.n_tensors++;
    reply_encoding(r, q->reply_encoding, 0);
    return 0;
}

/* A FORWARD's or BACKWARD's answer: first the push q asks for (the next server's input is the critical path, this
 * reply is not), then the reply, saying whether the push arrived. */
static void span_reply(req *r, const sp_span_req *q, const sp_tensor_src *out, int n)
{
    char meta[32];
    const char *m = NULL;
    if (q->push_port > 0) {
        sp_err perr = {0};
        sp_span_reply a = {.pushed = sp_span_push_send(r->s, q, &out[0], &perr) == SP_OK};
        if (a.pushed)
            __atomic_add_fetch(&r->s->pushes_out, 1, __ATOMIC_RELAXED);
        else
            sp_log(SP_LOG_INFO, "%s: push to %s:%d failed: %s", sp_msg_type_name(r->m.type), q->push_host,
                   q->push_port, perr.msg);
        if (sp_forward_reply_encode(&a, meta, sizeof meta, NULL) == SP_OK)
            m = meta;
    }
    reply(r, m, out, n);
}

/* ---------------------------------------------------------------------------------------------- */
/* span computation */

/* BLAS threads for a request of `tokens` positions: a decode step's matrix-vector products are too small to
 * pay for waking a second thread (and several servers on one machine share its cores), a training batch is
 * large enough to use them all. An inference step (step: a prefill too) runs OpenBLAS on one thread whatever
 * its size: the server's pool splits its large products and its attention (sp_qmat_mul, block.c), as
 * OpenBLAS's threads would, without their contending with the pool's for the cores. */
static void blas_threads_for(const sp_server *s, long tokens, int step)
{
    int want = step || tokens <= 8 ? 1 : s->blas_threads;
    if (openblas_get_num_threads() != want)
        openblas_set_num_threads(want);
}

/* hidden[b, t0 + t, :] += prompt[b, pos, :] for the positions of [t0, t0 + T) below P. */
static void add_prompt(float *h, const float *prompt, int B, int T, int t0, int P, int H)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T && t0 + t < P; t++) {
            float *dst = h + ((size_t)b * T + t) * H;
            const float *src = prompt + ((size_t)b * P + t0 + t) * H;
            for (int c = 0; c < H; c++)
                dst[c] += src[c];
        }
}

static int check_tokens(req *r, int B, int T)
{
    if ((long)B * T > r->s->o.max_batch_tokens)
        return bad(r, "bad_request", "%d x %d = %ld tokens exceed this server's %d per request", B, T, (long)B * T,
                   r->s->o.max_batch_tokens);
    if (T > r->s->m->cfg.max_pos)
        return bad(r, "max_length", "%d positions exceed the model's context of %d", T, r->s->m->cfg.max_pos);
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* FORWARD, BACKWARD */

/* Runs blocks [start, end) on x [B, T, H] in place, adding the deep prompts and writing each block's input
 * (prompt added) to inputs[i] ((end - start) x [B, T, H]) when inputs is non-NULL, and its activations to
 * acts[i] when acts is non-NULL. */
static sp_status run_keeping(sp_server *s, int start, int end, float *x, int B, int T, const float *prompts, int P,
                             float *inputs, sp_block_acts *acts, sp_ws *ws, sp_err *err)
{
    if (s->dev) /* (acts: NULL there, the device recomputes) */
        return span_dev_forward(s, start, end, x, B, T, prompts, P, inputs, err);
    int H = s->m->cfg.hidden;
    size_t N = (size_t)B * T * H;
    for (int i = 0; i < end - start; i++) {
        if (prompts)
            add_prompt(x, prompts + (size_t)i * B * P * H, B, T, 0, P, H);
        if (inputs)
            memcpy(inputs + i * N, x, N * sizeof(float));
        const sp_block *blk = &s->m->blocks[start + i - s->m->first];
        sp_status st = acts ? sp_block_forward_keep(blk, x, x, B, T, 0, &acts[i], err)
                            : sp_block_forward(blk, x, x, B, T, 0, NULL, ws, err);
        if (st)
            return st;
    }
    return SP_OK;
}

/* Bytes of a kept entry for blocks [start, end) on [B, T]: the inputs, and with acts every activation. */
static size_t kept_size(sp_server *s, int start, int end, int B, int T, int acts)
{
    size_t n = (size_t)(end - start) * B * T * s->m->cfg.hidden;
    for (int i = start; acts && i < end; i++)
        n += sp_block_acts_floats(&s->m->blocks[i - s->m->first], B, T);
    return n * sizeof(float);
}

static void rpc_forward(req *r, sp_ws *ws)
{
    int B, T, P;
    float *h = NULL, *prompts = NULL, *inputs = NULL;
    sp_block_acts *acts = NULL;
    size_t bytes = 0;
    sp_span_req q = {0};
    sp_buf pin = {0};
    sp_msg pm = {0};
    if (span_meta(r, &q) || (q.await && await_input(r, &q, 0, &pin, &pm)) || !(h = hidden_arg(r, 0, "hidden", &B, &T)))
        goto done;
    int start = q.start, end = q.end;
    if (check_tokens(r, B, T) || prompts_arg(r, 1, end - start, B, T, &prompts, &P))
        goto done;
    size_t N = (size_t)B * T * r->s->m->cfg.hidden;
    /* a training client asks to keep each block's input for the BACKWARD that follows, and the activations
     * too when a quarter of the cap holds them (a few microbatches are in flight at once) */
    if (q.keep > 0 && r->s->o.keep_bytes > 0) {
        inputs = malloc((size_t)(end - start) * N * sizeof(float));
        bytes = kept_size(r->s, start, end, B, T, 1);
        if (inputs && !r->s->dev && bytes <= r->s->o.keep_bytes / 4 && (acts = calloc((size_t)(end - start), sizeof *acts)))
            for (int i = 0; i < end - start; i++)
                kept_acts_get(&r->s->kt, &acts[i]); /* last steps' buffers: no fresh pages */
        if (!acts)
            bytes = kept_size(r->s, start, end, B, T, 0);
    }
    sp_err err = {0};
    blas_threads_for(r->s, (long)B * T, 0);
    if (run_keeping(r->s, start, end, h, B, T, prompts, P, inputs, acts, ws, &err)) {
        bad(r, "internal", "forward: %s", err.msg);
        goto done;
    }
    /* kept before the reply goes out: the client may send the BACKWARD the moment it has the reply */
    kept *k = inputs ? calloc(1, sizeof *k) : NULL;
    if (k) {
        *k = (kept){.conn = r->conn, .id = q.keep, .start = start, .end = end, .B = B, .T = T, .P = P,
                    .inputs = inputs, .acts = acts, .nacts = acts ? end - start : 0, .bytes = bytes,
                    .created = sp_now_s()};
        kept_put(r->s, k);
        inputs = NULL;
        acts = NULL;
    }
    sp_tensor_src out = tensor3(r, h, B, T, r->s->m->cfg.hidden);
    span_reply(r, &q, &out, 1);
done:
    sp_buf_free(&pin);
    for (int i = 0; acts && i < q.end - q.start; i++)
        kept_acts_put(&r->s->kt, &acts[i]);
    free(acts);
    free(h);
    free(prompts);
    free(inputs);
}

/* Recomputes the span's forward keeping every block's input, then back-propagates grad_out through
 * the blocks in reverse; a block's prompt gradient is the gradient at its input's first P positions. */
static void rpc_backward(req *r, sp_ws *ws)
{
    int B, T, B2, T2, P;
    float *x = NULL, *g = NULL, *prompts = NULL, *inputs = NULL, *gp = NULL;
    kept *k = NULL;
    sp_span_req q;
    sp_buf pin = {0};
    sp_msg pm = {0};
    if (span_meta(r, &q) || (q.await && await_input(r, &q, 1, &pin, &pm)) || !(x = hidden_arg(r, 0, "hidden_in", &B, &T)) ||
        !(g = hidden_arg(r, 1, "grad_out", &B2, &T2)))
        goto done;
    int start = q.start, end = q.end;
    if (B2 != B || T2 != T) {
        bad(r, "shape", "grad_out [%d, %d, H] does not match hidden_in [%d, %d, H]", B2, T2, B, T);
        goto done;
    }
    if (check_tokens(r, B, T) || prompts_arg(r, 2, end - start, B, T, &prompts, &P))
        goto done;
    int n = end - start, H = r->s->m->cfg.hidden;
    size_t N = (size_t)B * T * H;
    k = q.keep > 0 ? kept_take(r->s, r->conn, q.keep, start, end, B, T, P) : NULL;
    if (k) { /* the FORWARD kept every block's input (and maybe activations): no recompute */
        inputs = k->inputs;
        k->inputs = NULL;
    } else {
        inputs = malloc((size_t)n * N * sizeof(float));
    }
    gp = prompts ? calloc((size_t)n * B * P * H, sizeof(float)) : NULL;
    if (!inputs || (prompts && !gp)) {
        bad(r, "internal", "out of memory");
        goto done;
    }
    sp_err err = {0};
    if (r->s->dev) { /* the whole backward on the device, the kept inputs (if any) copied in */
        if (span_dev_backward(r->s, start, end, g, x, k ? inputs : NULL, B, T, prompts, P, gp, &err)) {
            bad(r, "internal", "backward: %s", err.msg);
            goto done;
        }
        goto answer;
    }
    blas_threads_for(r->s, (long)B * T, 0);
    if (!k && run_keeping(r->s, start, end - 1, x, B, T, prompts, P, inputs, NULL, ws, &err)) {
        bad(r, "internal", "backward (recompute): %s", err.msg);
        goto done;
    }
    if (!k && prompts) /* the last block's input: the recompute above stops before it */
        add_prompt(x, prompts + (size_t)(n - 1) * B * P * H, B, T, 0, P, H);
    if (!k)
        memcpy(inputs + (n - 1) * N, x, N * sizeof(float));
    for (int i = n - 1; i >= 0; i--) {
        const sp_block *blk = &r->s->m->blocks[start + i - r->s->m->first];
        if (k && k->acts ? sp_block_backward_kept(blk, g, g, inputs + i * N, &k->acts[i], NULL, ws, &err)
                         : sp_block_backward(blk, g, g, inputs + i * N, B, T, 0, NULL, ws, &err)) {
            bad(r, "internal", "backward: %s", err.msg);
            goto done;
        }
        for (int b = 0; gp && b < B; b++)
            memcpy(gp + (((size_t)i * B + b) * P) * H, g + (size_t)b * T * H, (size_t)P * H * sizeof(float));
    }
answer:;
    sp_tensor_src out[2] = {tensor3(r, g, B, T, H),
                            {.enc = r->reply_enc, .rank = 4, .shape = {n, B, P, H}, .f32 = gp}};
    span_reply(r, &q, out, gp ? 2 : 1);
done:
    sp_buf_free(&pin);
    kept_free(&r->s->kt, k);
    free(x);
    free(g);
    free(prompts);
    free(inputs);
    free(gp);
}

/* ---------------------------------------------------------------------------------------------- */
/* inference sessions */

static void rpc_open(req *r)
{
    sp_open_req q;
    sp_err e = {0};
    if (bad_meta(r, sp_open_req_decode(&r->m, &q, &e), &e) || span_check(r, q.start, q.end))
        return;
    int64_t L = q.max_length, B = q.batch;
    if (L < 1 || L > r->s->o.max_length)
        return (void)bad(r, "max_length", "max_length %lld outside 1..%d", (long long)L, r->s->o.max_length);
    if (B < 1 || B * L > (int64_t)r->s->o.cache_tokens)
        return (void)bad(r, "out_of_cache", "out of cache: batch %lld x max_length %lld exceeds the server's %ld tokens",
                         (long long)B, (long long)L, r->s->o.cache_tokens);
    if (sp_server_saturated(r->s)) {
        __atomic_add_fetch(&r->s->mx.overloaded, 1, __ATOMIC_RELAXED);
        return (void)bad(r, "overloaded", "decode steps wait %.3g s in this server's queue, over its bound of %g s "
                         "(--max-queue-wait); new sessions go elsewhere, or wait", sp_server_queue_wait(r->s),
                         r->s->o.max_queue_wait_s);
    }
    uint64_t id, token;
    sp_err err = {0};
    if (session_open(r->s, r->conn, q.start, q.end, (int)B, (int)L, &id, &token, &err))
        return (void)bad(r, err.code == SP_ERR_RANGE ? "out_of_cache" : "internal", "%s", err.msg);
    /* buffers for its decode steps' messages (hidden [B, 1, H], hypo_ids [B]), whichever thread takes them */
    size_t numel[2] = {(size_t)B * r->s->m->cfg.hidden, 2 * (size_t)B};
    sp_buf_spare_seed(sp_msg_size_f32(256, numel, 2), 3);
    sp_open_reply a = {.session = id, .max_length = (int)L, .push_token = token};
    char meta[128];
    if (sp_open_reply_encode(&a, meta, sizeof meta, &err))
        return (void)bad(r, "internal", "%s", err.msg);
    reply(r, meta, NULL, 0);
}

static void rpc_close(req *r)
{
    sp_close_req q;
    sp_err err = {0};
    if (bad_meta(r, sp_close_req_decode(&r->m, &q, &err), &err))
        return;
    if (session_close(r->s, r->conn, q.session, &err))
        return (void)bad(r, "no_session", "%s", err.msg);
    reply(r, NULL, NULL, 0);
}

/* Reorders the batch of every cache of the session: row b takes old row hypo[b]. */
static int reorder_cache(req *r, session *x, int idx)
{
    const sp_tensor_view *t = &r->m.t[idx];
    if (t->enc != SP_ENC_I64 || t->rank != 1 || t->shape[0] != x->B)
        return bad(r, "shape", "hypo_ids must be an i64 tensor [%d]", x->B);
    int64_t small[64]; /* a beam search's few rows: no allocation per step */
    int64_t *hypo = x->B <= 64 ? small : malloc((size_t)x->B * sizeof *hypo);
    if (!hypo || sp_tensor_to_i64(t, hypo, NULL) != SP_OK) {
        if (hypo != small)
            free(hypo);
        return bad(r, "internal", "out of memory");
    }
    for (int b = 0; b < x->B; b++)
        if (hypo[b] < 0 || hypo[b] >= x->B) {
            int64_t v = hypo[b];
            if (hypo != small)
                free(hypo);
            return bad(r, "bad_request", "hypo_ids[%d] = %lld outside 0..%d", b, (long long)v, x->B - 1);
        }
    int rc = 0;
    sp_err err = {0};
    if (x->dev && span_dev_reorder(r->s, x, hypo, &err))
        rc = bad(r, "internal", "%s", err.msg);
    for (int i = 0; !x->dev && !rc && i < x->end - x->start; i++) {
        x->kv[i].len = x->len;
        if (sp_kv_reorder(&x->kv[i], hypo, &err))
            rc = bad(r, "internal", "%s", err.msg);
    }
    if (hypo != small)
        free(hypo);
    return rc;
}

/* Tensor roles in a step: 0 hidden (unless it awaits its hidden state: then none), then optional prompts (rank 4)
 * and hypo_ids (i64), in any order. */
static void step_roles(const req *r, int await, int *prompts_idx, int *hypo_idx)
{
    *prompts_idx = *hypo_idx = r->m.n_tensors; /* absent */
    for (int i = await ? 0 : 1; i < r->m.n_tensors; i++) {
        if (r->m.t[i].enc == SP_ENC_I64 || r->m.t[i].enc == SP_ENC_I32)
            *hypo_idx = i;
        else
            *prompts_idx = i;
    }
}

/* Runs the session's blocks on x [B, T, H] in place at positions len.., in chunks of at most max_batch_tokens
 * positions x batch (a long prefill); buf holds one chunk when T is over it (else it is unused). */
static sp_status step_blocks(req *r, session *x, float *h, float *buf, int B, int T, const float *prompts, int P,
                             sp_ws *ws, sp_err *err)
{
    if (x->dev)
        return span_dev_step(r->s, x, h, B, T, prompts, P, err);
    int H = r->s->m->cfg.hidden, chunk = r->s->o.max_batch_tokens / B > 0 ? r->s->o.max_batch_tokens / B : 1;
    for (int t0 = 0; t0 < T; t0 += chunk) {
        int tc = T - t0 < chunk ? T - t0 : chunk;
        float *cur = T <= chunk ? h : buf; /* a decode step runs on h itself */
        for (int b = 0; cur != h && b < B; b++)
            memcpy(cur + (size_t)b * tc * H, h + ((size_t)b * T + t0) * H, (size_t)tc * H * sizeof(float));
        for (int i = x->start; i < x->end; i++) {
            sp_kv_cache *kv = &x->kv[i - x->start];
            kv->len = x->len + t0;
            if (prompts)
                add_prompt(cur, prompts + (size_t)(i - x->start) * B * P * H, B, tc, t0, P, H);
            sp_status st = sp_block_forward(&r->s->m->blocks[i - r->s->m->first], cur, cur, B, tc, x->len + t0, kv, ws,
                                            err);
            if (st)
                return st;
        }
        for (int b = 0; cur != h && b < B; b++)
            memcpy(h + ((size_t)b * T + t0) * H, cur + (size_t)b * tc * H, (size_t)tc * H * sizeof(float));
    }
    return SP_OK;
}

/* A step's checks and what comes before its compute (roll back, hypo_ids' reorder) on the hidden state hid
 * [B, T, H] (checked: a float tensor of rank 3, last dimension H, finite): the request's own tensor 0, or a
 * push's. *B, *T and the prompts' tensor index *pi (n_tensors: none). -1 after an ERROR reply. */
static int step_prepare(req *r, const sp_step_req *q, session *x, const sp_tensor_view *hid, int *B, int *T, int *pi)
{
    int hi;
    step_roles(r, q->await > 0, pi, &hi);
    reply_encoding(r, q->reply_encoding, q->await > 0 ? r->m.n_tensors : 0);
    if (q->await > 0 && q->reply_encoding < 0)
        r->reply_enc = hid->enc;
    *B = (int)hid->shape[0];
    *T = (int)hid->shape[1];
    if (q->start_from_position >= 0) { /* roll back */
        if (q->start_from_position > x->len)
            return bad(r, "bad_request", "start_from_position %d outside 0..%d", q->start_from_position, x->len);
        x->len = q->start_from_position;
    }
    if (*B != x->B)
        return bad(r, "shape", "session %llu has batch %d, step has %d", (unsigned long long)x->id, x->B, *B);
    if (x->len + *T > x->max_length)
        return bad(r, "max_length", "%d cached + %d new positions exceed the session's max_length %d", x->len, *T,
                   x->max_length);
    if (*pi < r->m.n_tensors && x->len != 0)
        return bad(r, "bad_request", "prompts are only accepted at position 0 (session is at %d)", x->len);
    return hi < r->m.n_tensors ? reorder_cache(r, x, hi) : 0;
}

/* The reply of step q whose T positions of B rows are in h, the session advanced: first the push q asks for (the
 * next server's input is the critical path, this reply is not), then the reply. */
static void step_reply(req *r, const sp_step_req *q, session *x, const float *h, int B, int T)
{
    sp_err err = {0};
    x->len += T;
    sp_tensor_src out = tensor3(r, h, B, T, r->s->m->cfg.hidden);
    sp_step_reply a = {.position = x->len};
    if (q->push_port > 0) {
        sp_err perr = {0};
        a.pushed = sp_push_send(r->s, q, &out, &perr) == SP_OK;
        if (a.pushed)
            __atomic_add_fetch(&r->s->pushes_out, 1, __ATOMIC_RELAXED);
        else
            sp_log(SP_LOG_INFO, "session %llu: push to %s:%d failed: %s", (unsigned long long)x->id, q->push_host,
                   q->push_port, perr.msg);
    }
    char meta[64];
    if (sp_step_reply_encode(&a, meta, sizeof meta, &err))
        return (void)bad(r, "internal", "%s", err.msg);
    reply(r, meta, &out, 1);
}

/* A prepared step (step_prepare) on hid computed and answered. */
static void step_run(req *r, const sp_step_req *q, session *x, const sp_tensor_view *hid, int B, int T, int pi,
                     sp_ws *ws)
{
    int P;
    float *h = NULL, *prompts = NULL, *big = NULL;
    if (prompts_arg(r, pi, x->end - x->start, B, T, &prompts, &P))
        return;
    /* a decode step in the session's scratch; a prefill (and its chunk buffer) in memory of its own, let go after */
    int H = r->s->m->cfg.hidden, chunk = r->s->o.max_batch_tokens / B > 0 ? r->s->o.max_batch_tokens / B : 1;
    size_t n = (size_t)B * T * H, nbuf = T > chunk ? (size_t)B * chunk * H : 0;
    h = n + nbuf <= x->scratch_floats ? x->scratch : (big = malloc((n + nbuf) * sizeof(float)));
    sp_err err = {0};
    if (!h)
        bad(r, "internal", "out of memory");
    else if (sp_tensor_to_f32(hid, h, &err))
        bad(r, "internal", "decoding tensor 0: %s", err.msg);
    else {
        blas_threads_for(r->s, (long)B * T, 1);
        SP_TRACE(SP_TR_SRV_COMPUTE);
        if (step_blocks(r, x, h, h + n, B, T, prompts, P, T == 1 ? &x->ws : ws, &err)) { /* decode: the session's ws */
            bad(r, "internal", "step: %s", err.msg);
        } else {
            SP_TRACE(SP_TR_SRV_COMPUTED);
            step_reply(r, q, x, h, B, T);
        }
    }
    free(big);
    free(prompts);
}

/* The step q of session x on hid, checked, computed and answered. */
static void step_compute(req *r, const sp_step_req *q, session *x, const sp_tensor_view *hid, sp_ws *ws)
{
    int B, T, pi;
    if (!step_prepare(r, q, x, hid, &B, &T, &pi))
        step_run(r, q, x, hid, B, T, pi, ws);
}

/* Keeps the request of a step that awaits its input in x (the message is taken: no reply now). */
static void stash_step(req *r, session *x, uint64_t step)
{
    sp_buf_free(&x->pend);
    x->pend = *r->msg;
    memset(r->msg, 0, sizeof *r->msg);
    r->msg = NULL;
    x->pend_conn = r->conn;
    x->pend_step = step;
    if (x->inbox_step < step) /* an input of an earlier step: never used now */
        sp_buf_free(&x->inbox);
}

/* A step whose input comes by push: run now if it came already (the inbox), else kept until it comes. */
static void step_await(req *r, const sp_step_req *q, session *x, sp_ws *ws)
{
    if (!q->step)
        return (void)bad(r, "bad_request", "a step that awaits its input needs a step number");
    if (!x->inbox.len || x->inbox_step != q->step)
        return stash_step(r, x, q->step);
    sp_buf in = x->inbox;
    memset(&x->inbox, 0, sizeof x->inbox);
    sp_msg pm;
    sp_err err = {0};
    if (sp_msg_decode(&pm, in.data, in.len, &r->s->limits, &err) == SP_OK) {
        step_compute(r, q, x, &pm.t[0], ws);
        sp_msg_clear(&pm);
    } else {
        bad(r, "internal", "the pushed input: %s", err.msg);
    }
    sp_buf_free(&in);
}

/* A step (its metadata q decoded from r) run: one that awaits its input by push, or one with its own. */
static void step_decoded(req *r, const sp_step_req *q, sp_ws *ws)
{
    sp_err err = {0};
    if (q->await > 0 || q->push_port > 0)
        __atomic_store_n(&r->s->pushing, 1, __ATOMIC_RELAXED);
    session *x = q->await > 0 ? session_acquire_wait(r->s, r->conn, q->session, 0, &err)
                              : session_acquire(r->s, r->conn, q->session, &err);
    if (!x)
        return (void)bad(r, err.code == SP_ERR_STATE ? "busy" : "no_session", "%s", err.msg);
    r->held = x;
    if (q->await > 0) {
        step_await(r, q, x, ws);
    } else {
        session_drop_push(x); /* a step with its own input: whatever awaited or came early is superseded */
        if (!float_tensor(r, 0, "hidden", 3))
            step_compute(r, q, x, &r->m.t[0], ws);
    }
    let_go(r); /* (the answer went out already, unless a fault was injected) */
}

static void rpc_step(req *r, sp_ws *ws)
{
    sp_step_req q;
    sp_err err = {0};
    if (!bad_meta(r, sp_step_req_decode(&r->m, &q, &err), &err))
        step_decoded(r, &q, ws);
}

/* An empty reply (the acknowledgement of a push) in a buffer of its own: the request's holds the input. */
static void ack(req *r)
{
    sp_buf b = {0};
    if (sp_msg_encode(&b, r->m.type, SP_MSG_F_REPLY, r->m.request_id, NULL, NULL, 0, NULL) == SP_OK)
        sp_ws_server_send(r->s->ws, r->conn, &b, NULL);
    else
        sp_buf_free(&b);
}

/* The step that awaited the input of push r in session x (held by r) runs on it: its reply goes to its own
 * connection, and the session is let go before it does. */
static void run_pending(req *r, session *x, sp_ws *ws)
{
    req p = {.s = r->s, .conn = x->pend_conn, .held = x};
    sp_buf pb = x->pend;
    memset(&x->pend, 0, sizeof x->pend);
    x->pend_step = 0;
    r->held = NULL;
    sp_step_req q;
    sp_err err = {0};
    p.msg = &pb;
    if (sp_msg_decode(&p.m, pb.data, pb.len, &r->s->limits, &err) == SP_OK &&
        sp_step_req_decode(&p.m, &q, &err) == SP_OK)
        step_compute(&p, &q, x, &r->m.t[0], ws);
    else /* (it decoded when it came) */
        bad(&p, "internal", "the awaiting step: %s", err.msg);
    let_go(&p);
    sp_msg_clear(&p.m);
    sp_buf_free(&pb);
}

/* INFERENCE_PUSH: the input of a step of a session held here, from the server before this one in the session's
 * chain (it knows the session's token). Acknowledged at once; then the step that awaits it runs, or it waits for
 * that step. */
static void rpc_push(req *r, sp_ws *ws)
{
    sp_push_req q;
    sp_err err = {0};
    if (bad_meta(r, sp_push_req_decode(&r->m, &q, &err), &err) || float_tensor(r, 0, "hidden", 3))
        return;
    session *x = session_acquire_wait(r->s, 0, q.session, q.token, &err);
    if (!x)
        return (void)bad(r, err.code == SP_ERR_STATE ? "busy" : err.code == SP_ERR_ARG ? "forbidden" : "no_session",
                         "%s", err.msg);
    r->held = x;
    ack(r);
    __atomic_add_fetch(&r->s->pushes_in, 1, __ATOMIC_RELAXED);
    if (x->pend.len && x->pend_step == q.step) {
        run_pending(r, x, ws);
    } else if (!x->pend.len || x->pend_step < q.step) { /* its step comes later */
        sp_buf_free(&x->inbox);
        x->inbox = *r->msg;
        memset(r->msg, 0, sizeof *r->msg);
        r->msg = NULL;
        x->inbox_step = q.step;
    } /* else: the input of a step that was given up */
    let_go(r);
}

/* ---------------------------------------------------------------------------------------------- */
/* dispatch */

static int decode(req *r, sp_server *s, uint64_t conn, const sp_buf *msg)
{
    sp_err err = {0};
    memset(r, 0, sizeof *r);
    r->s = s;
    r->conn = conn;
    sp_status st = sp_msg_decode(&r->m, msg->data, msg->len, &s->limits, &err);
    if (st == SP_OK)
        return 0;
    sp_msg_header h = {0}; /* the request id, if the header got that far, so the client can match the error */
    sp_msg_header_read(msg->data, msg->len, &h);
    const char *code = sp_msg_reject_code(msg->data, msg->len, st);
    sp_rpc_error(s, conn, h.request_id, code, "%s", err.msg);
    if (!strcmp(code, "unknown_type")) /* a newer minor version's request: the connection stays usable */
        return -1;
    sp_ws_server_close(s->ws, conn); /* a peer that sends garbage loses its connection, nothing else */
    return -1;
}

/* SPAN_PUSH: the input of a FORWARD or BACKWARD that awaits it here (its id and token), from the server before this
 * one in the pass. Acknowledged at once (on the transport thread: nothing is computed); the request runs when a worker
 * takes it, with this input. */
void sp_rpc_span_push(sp_server *s, uint64_t conn, sp_buf *msg, uint64_t *pend_conn, sp_buf *pend)
{
    req r;
    if (decode(&r, s, conn, msg))
        return;
    sp_span_push_req q;
    sp_err err = {0};
    if (!bad_meta(&r, sp_span_push_req_decode(&r.m, &q, &err), &err) && !float_tensor(&r, 0, "hidden", 3)) {
        sp_status st = awaits_arrive(s, q.id, q.token, msg, pend_conn, pend, &err);
        if (st)
            bad(&r, st == SP_ERR_ARG ? "forbidden" : st == SP_ERR_RANGE ? "busy" : "bad_request", "%s", err.msg);
        else {
            ack(&r);
            __atomic_add_fetch(&s->pushes_in, 1, __ATOMIC_RELAXED);
        }
    }
    sp_msg_clear(&r.m);
}

/* A compute request runs its blocks as a batch of its own (metrics.h): its positions, B x T of its hidden states. */
static void count_batch(const req *r)
{
    int t = r->m.type;
    int kind = t == SP_MSG_INFERENCE_STEP ? SP_MX_TOK_INFERENCE : t == SP_MSG_FORWARD ? SP_MX_TOK_FORWARD
               : t == SP_MSG_BACKWARD                         ? SP_MX_TOK_BACKWARD
                                                              : -1;
    const sp_tensor_view *h = r->m.n_tensors > 0 ? &r->m.t[0] : NULL;
    if (kind >= 0 && h && h->rank > 0 && h->shape[h->rank - 1] > 0)
        sp_mx_batch(&r->s->mx, 1, kind, h->numel / (uint64_t)h->shape[h->rank - 1]);
}

void sp_rpc_handle(sp_server *s, uint64_t conn, sp_buf *msg, sp_ws *ws)
{
    req r;
    if (decode(&r, s, conn, msg))
        return;
    r.msg = msg;
    count_batch(&r);
    switch (r.m.type) {
    case SP_MSG_FORWARD: rpc_forward(&r, ws); break;
    case SP_MSG_BACKWARD: rpc_backward(&r, ws); break;
    case SP_MSG_INFERENCE_OPEN: rpc_open(&r); break;
    case SP_MSG_INFERENCE_STEP: rpc_step(&r, ws); break;
    case SP_MSG_INFERENCE_CLOSE: rpc_close(&r); break;
    case SP_MSG_INFERENCE_PUSH: rpc_push(&r, ws); break;
    default: bad(&r, "unknown_type", "%s is not a request this server serves", sp_msg_type_name(r.m.type));
    }
    sp_msg_clear(&r.m);
}

/* ---------------------------------------------------------------------------------------------- */
/* decode steps of many sessions as one pass */

/* One step taken in: where its rows are in the batch (-1: it runs alone after the pass; -2: answered already; -3:
 * it awaits its input by push, and runs as a step alone would, after the pass), its
 * shape (B rows of T positions: B x T rows in the batch) and prompts' index (step_prepare's). */
typedef struct bstep {
    int off, B, T, pi;
} bstep;

struct sp_step_batch {
    req *r;          /* the steps taken in, [cap] */
    sp_step_req *q;
    bstep *st;
    float *h;        /* the batched steps' hidden states, rows in order [rows, H] */
    size_t hcap;     /* floats */
    sp_kv_cache **kv;
    session **xs;    /* a pass's sessions, in order (--device cuda) */
    int *T;          /* the positions of each step of a pass */
    int *item_rows;
    int *group;      /* the steps of one span, in order */
    int cap;
    sp_ws ws;
};

sp_step_batch *sp_step_batch_new(void) { return calloc(1, sizeof(sp_step_batch)); }

void sp_step_batch_free(sp_step_batch *b)
{
    if (!b)
        return;
    free(b->r), free(b->q), free(b->st), free(b->h), free(b->kv), free(b->xs), free(b->T), free(b->item_rows), free(b->group);
    sp_ws_free(&b->ws);
    free(b);
}

/* *p grown to n items of size sz (kept when that fails); 0 or -1. */
static int grow(void *p, size_t n, size_t sz)
{
    void *q = n <= SIZE_MAX / sz ? realloc(*(void **)p, n * sz) : NULL;
    if (q)
        *(void **)p = q;
    return q ? 0 : -1;
}

/* Room for n steps, kept: a batch of that size allocates nothing the next time. */
static int batch_reserve(sp_step_batch *b, int n)
{
    if (n <= b->cap)
        return 0;
    size_t m = (size_t)n;
    if (grow(&b->r, m, sizeof *b->r) | grow(&b->q, m, sizeof *b->q) | grow(&b->st, m, sizeof *b->st) |
        grow(&b->kv, m, sizeof *b->kv) | grow(&b->xs, m, sizeof *b->xs) | grow(&b->T, m, sizeof *b->T) | grow(&b->item_rows, m, sizeof *b->item_rows) |
        grow(&b->group, m, sizeof *b->group))
        return -1;
    b->cap = n;
    return 0;
}

/* Takes step i in: decoded, its session held, checked and prepared. Off is set to its first row in h when it
 * joins the pass (its B x T rows copied there; *rows grows): a decode step or a short prefill whose rows alone run
 * in the decode kernels (sp_block_rows_exact: the pass gives it the bits it gets alone), without prompts, within
 * the budget; -1 when it runs alone (a longer prefill, prompts, a wide beam, no room left in the budget), -2 when
 * it was answered already (an ERROR). */
static void batch_take(sp_step_batch *b, sp_server *s, uint64_t conn, sp_buf *msg, int i, int *rows)
{
    req *r = &b->r[i];
    bstep *t = &b->st[i];
    sp_err err = {0};
    t->off = -2;
    if (decode(r, s, conn, msg))
        return;
    r->msg = msg;
    if (bad_meta(r, sp_step_req_decode(&r->m, &b->q[i], &err), &err))
        return;
    if (b->q[i].await > 0) /* its input comes by push: the step runs apart, after the pass */
        return (void)(t->off = -3);
    if (b->q[i].push_port > 0)
        __atomic_store_n(&s->pushing, 1, __ATOMIC_RELAXED);
    session *x = session_acquire(s, conn, b->q[i].session, &err);
    if (!x)
        return (void)bad(r, err.code == SP_ERR_STATE ? "busy" : "no_session", "%s", err.msg);
    r->held = x;
    session_drop_push(x); /* a step with its own input: whatever awaited or came early is superseded */
    if (float_tensor(r, 0, "hidden", 3) || step_prepare(r, &b->q[i], x, &r->m.t[0], &t->B, &t->T, &t->pi))
        return;
    t->off = -1;
    int n = t->B * t->T;
    size_t H = (size_t)s->m->cfg.hidden, need = (size_t)(*rows + n) * H;
    if (t->pi < r->m.n_tensors || !sp_block_rows_exact(&s->m->blocks[0], n) || *rows + n > s->o.max_batch_tokens ||
        (s->dev && t->T > 1)) /* the device's pass takes decode steps; its short prefills run one by one */
        return;
    if (need > b->hcap) {
        if (grow(&b->h, need * 2, sizeof(float)))
            return;
        b->hcap = need * 2;
    }
    if (sp_tensor_to_f32(&r->m.t[0], b->h + (size_t)*rows * H, &err))
        return (void)(bad(r, "internal", "decoding tensor 0: %s", err.msg), t->off = -2);
    t->off = *rows;
    *rows += n;
    if (t->T > 1)
        __atomic_add_fetch(&s->batched_prefills, 1, __ATOMIC_RELAXED);
}

/* The steps g[0..n) (all over one span, their rows contiguous in h) through the span's blocks as one pass, then
 * answered. */
static void batch_run_group(sp_step_batch *b, sp_server *s, const int *g, int n)
{
    session *x0 = b->r[g[0]].held;
    sp_err err = {0};
    sp_status st = SP_OK;
    int H = s->m->cfg.hidden;
    float *h = b->h + (size_t)b->st[g[0]].off * H;
    int nrows = 0;
    for (int k = 0; s->dev && k < n; k++)
        b->xs[k] = b->r[g[k]].held, nrows += b->st[g[k]].B;
    if (s->dev)
        st = span_dev_decode_batch(s, b->xs, n, h, nrows, &err);
    for (int i = x0->start; !s->dev && !st && i < x0->end; i++) {
        for (int k = 0; k < n; k++) {
            session *x = b->r[g[k]].held;
            b->kv[k] = &x->kv[i - x->start];
            b->kv[k]->len = x->len; /* (a roll back moves only x->len) */
            b->T[k] = b->st[g[k]].T;
        }
        st = sp_block_step_batch(&s->m->blocks[i - s->m->first], h, h, b->kv, b->T, n, b->item_rows, &b->ws, &err);
    }
    int rows = 0;
    for (int k = 0; k < n; k++)
        rows += b->st[g[k]].B * b->st[g[k]].T;
    SP_TRACE(SP_TR_SRV_COMPUTED);
    if (!st)
        sp_mx_batch(&s->mx, n, SP_MX_TOK_INFERENCE, (uint64_t)rows);
    for (int k = 0; k < n; k++) {
        req *r = &b->r[g[k]];
        if (st)
            bad(r, "internal", "step: %s", err.msg);
        else
            step_reply(r, &b->q[g[k]], r->held, b->h + (size_t)b->st[g[k]].off * H, b->st[g[k]].B, b->st[g[k]].T);
    }
}

/* The batched steps, a pass per span (sessions over other spans of the server's blocks run apart); a span's rows
 * sit together in h unless another span's come between (then its steps run one by one). */
static void batch_run(sp_step_batch *b, sp_server *s, int n)
{
    for (int i = 0; i < n; i++) {
        if (b->st[i].off < 0)
            continue;
        session *xi = b->r[i].held;
        int m = 0, contiguous = 1, next = b->st[i].off;
        for (int j = i; j < n; j++) {
            session *xj = b->st[j].off >= 0 ? b->r[j].held : NULL;
            if (!xj || xj->start != xi->start || xj->end != xi->end)
                continue;
            contiguous &= b->st[j].off == next;
            next = b->st[j].off + b->st[j].B * b->st[j].T;
            b->group[m++] = j;
        }
        for (int k = 0; !contiguous && k < m; k++)
            batch_run_group(b, s, &b->group[k], 1);
        if (contiguous)
            batch_run_group(b, s, b->group, m);
        for (int k = 0; k < m; k++)
            b->st[b->group[k]].off = -2;
    }
}

void sp_rpc_handle_steps(sp_server *s, const uint64_t *conns, sp_buf *const *msgs, int n, sp_step_batch *b, sp_ws *ws)
{
    if (batch_reserve(b, n)) { /* no room to batch: one at a time */
        for (int i = 0; i < n; i++)
            sp_rpc_handle(s, conns[i], msgs[i], ws);
        return;
    }
    int rows = 0;
    for (int i = 0; i < n; i++)
        batch_take(b, s, conns[i], msgs[i], i, &rows);
    blas_threads_for(s, 1, 1);
    SP_TRACE(SP_TR_SRV_COMPUTE);
    batch_run(b, s, n);
    for (int i = 0; i < n; i++) { /* longer prefills and the rest, after the pass: each alone */
        req *r = &b->r[i];
        if (b->st[i].off == -1 || b->st[i].off == -3)
            count_batch(r);
        if (b->st[i].off == -1)
            step_run(r, &b->q[i], r->held, &r->m.t[0], b->st[i].B, b->st[i].T, b->st[i].pi, ws);
        else if (b->st[i].off == -3)
            step_decoded(r, &b->q[i], ws);
        let_go(r);
        sp_msg_clear(&r->m);
    }
    __atomic_add_fetch(&s->batches, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&s->batched_rows, (uint64_t)rows, __ATOMIC_RELAXED);
    for (uint64_t old = __atomic_load_n(&s->batch_peak, __ATOMIC_RELAXED); (uint64_t)rows > old;)
        if (__atomic_compare_exchange_n(&s->batch_peak, &old, (uint64_t)rows, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            break;
}

static void rpc_hello(req *r)
{
    sp_hello_req q;
    sp_err err = {0};
    if (bad_meta(r, sp_hello_req_decode(&r->m, &q, &err), &err))
        return;
    if (q.version[0] && atoi(q.version) != SP_PROTO_MAJOR)
        return (void)bad(r, "version", "peer speaks protocol %s, this server speaks %s", q.version, SP_PROTO_VERSION);
    sp_server *s = r->s;
    sp_hello_reply a = {.version = SP_PROTO_VERSION, .server = "sepal-server " SEPAL_VERSION, .config = s->m->cfg.hash,
                        .blocks = s->m->cfg.n_layers, .start = s->m->first, .end = s->m->last,
                        .bulk_port = sp_server_public_bulk_port(s),
                        .bulk_token = sp_ws_server_bulk_token(s->ws, r->conn), .dht_port = s->o.dht_port};
    sp_meta_set(a.model, sizeof a.model, s->model_name);
    sp_meta_set(a.dtype, sizeof a.dtype, sp_server_dtype(s));
    sp_meta_set(a.id, sizeof a.id, s->o.id);
    snprintf(a.addr, sizeof a.addr, "%.63s:%d", s->o.public_host ? s->o.public_host : s->o.host ? s->o.host : "127.0.0.1",
             s->o.public_port > 0 ? s->o.public_port : sp_server_port(s));
    char meta[SP_META_CAP];
    if (sp_hello_reply_encode(&a, meta, sizeof meta, &err))
        return (void)bad(r, "internal", "%s", err.msg);
    reply(r, meta, NULL, 0);
}

/* INFO's "transport": connections and what the limits did (ws/transport.h, sp_ws_server_stats). */
static void info_transport(sp_info_transport *x, sp_server *s)
{
    sp_ws_server_stats t;
    sp_ws_server_stats_get(s->ws, &t);
    *x = (sp_info_transport){
        .conns = t.conns, .pending = t.pending, .accepted = (int64_t)t.accepted, .refused = (int64_t)t.refused,
        .refused_ip = (int64_t)t.refused_ip, .handshake_timeouts = (int64_t)t.handshake_timeouts,
        .idle_closed = (int64_t)t.idle_closed, .busy = (int64_t)t.busy, .slow = (int64_t)t.slow,
        .auth_failed = (int64_t)t.auth_failed, .waits = (int64_t)t.waits, .paused = (int64_t)t.paused,
        .delivered = (int64_t)t.delivered, .bulk_refused = (int64_t)t.bulk_refused,
        .bulk_timeouts = (int64_t)t.bulk_timeouts, .out_of_fds = (int64_t)t.out_of_fds,
        .budget_used = (int64_t)t.budget_used, .budget_peak = (int64_t)t.budget_peak,
        .budget = (int64_t)t.limits.rx_budget, .budget_conn = (int64_t)t.limits.rx_budget_conn,
        .swarm_key = s->o.key != NULL};
}

static void rpc_info(req *r)
{
    sp_server *s = r->s;
    sp_info_reply a = {
        .start = s->m->first, .end = s->m->last, .weight_bytes = (int64_t)sp_server_weight_bytes(s),
        .protocol = SP_PROTO_VERSION, .hidden_size = s->m->cfg.hidden, .kv_heads = s->m->cfg.n_kv_heads,
        .head_dim = s->m->cfg.head_dim, .cache_bytes_per_token = (int64_t)s->st.kv_bytes, /* one position, one block */
        .cache_bytes_total = (int64_t)s->st.budget, .cache_tokens_total = (int64_t)s->o.cache_tokens,
        .cache_tokens_available = (int64_t)sessions_tokens_available(s), .max_batch_tokens = s->o.max_batch_tokens,
        .max_length = s->o.max_length, .inference_rps = s->inference_rps, .forward_tps = s->forward_tps,
        .sessions = sp_server_sessions(s), .kept_bytes = (int64_t)sp_server_kept_bytes(s),
        .requests = (int64_t)sp_server_requests(s)};
    sp_server_batch_stats bs;
    sp_server_batch_stats_get(s, &bs);
    a.batches = (int64_t)bs.batches, a.batched_rows = (int64_t)bs.rows, a.batch_peak = (int64_t)bs.peak;
    a.queue_wait = bs.queue_wait_s;
    a.max_queue_wait = s->o.max_queue_wait_s;
    sp_meta_set(a.model, sizeof a.model, s->model_name);
    sp_meta_set(a.architecture, sizeof a.architecture, s->m->cfg.architecture);
    sp_meta_set(a.dtype, sizeof a.dtype, sp_server_dtype(s));
    sp_meta_set(a.family, sizeof a.family, sp_arch_name(s->m->cfg.arch));
    sp_meta_set(a.public_name, sizeof a.public_name, s->o.public_name);
    sp_meta_set(a.device, sizeof a.device, sp_server_device(s));
    info_transport(&a.transport, s);
    char meta[SP_META_CAP];
    sp_err err = {0};
    if (sp_info_reply_encode(&a, meta, sizeof meta, &err))
        return (void)bad(r, "internal", "%s", err.msg);
    reply(r, meta, NULL, 0);
}

int sp_rpc_handle_inline(sp_server *s, uint64_t conn, const sp_buf *msg)
{
    sp_msg_header h;
    if (!sp_msg_header_read(msg->data, msg->len, &h))
        return 0;
    int type = h.type;
    if (type != SP_MSG_HELLO && type != SP_MSG_INFO && type != SP_MSG_PING)
        return 0;
    req r;
    if (decode(&r, s, conn, msg))
        return 1;
    if (r.m.type == SP_MSG_HELLO)
        rpc_hello(&r);
    else if (r.m.type == SP_MSG_INFO)
        rpc_info(&r);
    else { /* PING: the reply echoes the metadata */
        char *meta = sp_msg_meta_copy(&r.m);
        if (meta)
            reply(&r, meta, NULL, 0);
        else
            bad(&r, "internal", "out of memory");
        free(meta);
    }
    sp_msg_clear(&r.m);
    return 1;
}
