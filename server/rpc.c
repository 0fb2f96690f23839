/* rpc.c - the server's request handlers: argument checks, the span computations, replies. Every bad
 * request gets an ERROR reply (share/doc/protocol.md lists the codes); nothing here ends the process. */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "memtune.h"
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
    int acked;            /* an INFERENCE_PUSH acknowledged on arrival: no ERROR goes back (it is logged) */
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
    if (r->acked) /* (a push acknowledged already: its sender has its answer) */
        sp_log(SP_LOG_INFO, "a push acknowledged on arrival was dropped: %s: %s", code, msg);
    else
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
/* sp_server_opts.emulate_old: a request's push fields as an older server reads them (not at all: unknown keys). */
static void old_span_req(const sp_server *s, sp_span_req *q)
{
    if (s->o.emulate_old)
        q->await = q->await_token = 0;
    if (s->o.emulate_old == SP_SERVER_OLD_NOPUSH) {
        q->push_host[0] = '\0';
        q->push_port = 0;
        q->push_id = q->push_token = 0;
    }
}

static void old_step_req(const sp_server *s, sp_step_req *q)
{
    if (s->o.emulate_old)
        q->await = 0;
    if (s->o.emulate_old == SP_SERVER_OLD_NOPUSH) {
        q->push_host[0] = '\0';
        q->push_port = 0;
        q->push_session = q->push_token = q->step = 0;
    }
}

static int span_meta(req *r, sp_span_req *q)
{
    sp_err e = {0};
    int fwd = r->m.type == SP_MSG_FORWARD;
    if (bad_meta(r, fwd ? sp_forward_req_decode(&r->m, q, &e) : sp_backward_req_decode(&r->m, q, &e), &e))
        return -1;
    old_span_req(r->s, q);
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

/* The arrival rate of r's connection's last large bulk message, if not yet told (sp_ws_server_rx_take), for a reply
 * to a request large enough to have been measured (a decode step's: not even the look; a server emulating one from
 * before push, older than this too: none). */
static double rx_rate(const req *r)
{
    if (r->s->o.emulate_old == SP_SERVER_OLD_NOPUSH || !r->msg || r->msg->len < SP_PROTO_HEADER_SIZE + SP_RX_PACE_MIN)
        return 0;
    return sp_ws_server_rx_take(r->s->ws, r->conn);
}

/* A FORWARD's or BACKWARD's answer: first the push q asks for (the next server's input is the critical path, this
 * reply is not), then the reply, saying whether the push arrived and how fast the request came. */
static void span_reply(req *r, const sp_span_req *q, const sp_tensor_src *out, int n)
{
    char meta[96];
    const char *m = NULL;
    sp_span_reply a = {.rx_mbit = rx_rate(r)};
    if (q->push_port > 0) {
        sp_err perr = {0};
        a.pushed = sp_span_push_send(r->s, q, &out[0], &perr) == SP_OK;
        if (a.pushed)
            __atomic_add_fetch(&r->s->pushes_out, 1, __ATOMIC_RELAXED);
        else
            sp_log(SP_LOG_INFO, "%s: push to %s:%d failed: %s", sp_msg_type_name(r->m.type), q->push_host,
                   q->push_port, perr.msg);
    }
    if ((q->push_port > 0 || a.rx_mbit > 0) && sp_forward_reply_encode(&a, meta, sizeof meta, NULL) == SP_OK)
        m = meta;
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
/* FORWARD, BACKWARD: one request, or several of different clients merged into one pass (same span, positions
 * and deep prompts' length; each item's results as alone: block.h, sp_block_forward_items). One that awaits its
 * input pushed by another server or pushes its output runs as a pass of one (sp_rpc_span_key). */

/* A FORWARD's or BACKWARD's arguments, decoded and checked: hidden (hidden_in) and grad_out [B, T, H] as f32, the
 * deep prompts [n, B, P, H] (NULL, P 0: none); its kept entry (BACKWARD) and where its rows start in a pass; the
 * pushed input's message when it awaited one (q.await: await_input). */
typedef struct span_args {
    req *r;           /* the request (its caller's) */
    sp_span_req q;
    int B, T, P, b0;
    float *h, *g, *prompts;
    kept *k;
    int keep_acts; /* FORWARD: its activations are kept too (a quarter of the keep cap holds them) */
    int keep_dev;  /* FORWARD on a GPU server: its inputs and activations kept on the device (kept_plan) */
    sp_buf pin;    /* the SPAN_PUSH that brought its input (pm's views point into it) */
    sp_msg pm;
} span_args;

/* Decodes and checks r's arguments into a, its pushed input spliced in when it awaits one; -1 after an ERROR reply,
 * or when the request is parked until its input is pushed (r->msg taken: no reply now). */
static int span_args_parse(span_args *a, req *r)
{
    int fwd = r->m.type == SP_MSG_FORWARD, B2, T2;
    memset(a, 0, sizeof *a);
    a->r = r;
    req *x = r;
    if (span_meta(x, &a->q) || (a->q.await && await_input(x, &a->q, fwd ? 0 : 1, &a->pin, &a->pm)) ||
        !(a->h = hidden_arg(x, 0, fwd ? "hidden" : "hidden_in", &a->B, &a->T)))
        return -1;
    if (!fwd && !(a->g = hidden_arg(x, 1, "grad_out", &B2, &T2)))
        return -1;
    if (!fwd && (B2 != a->B || T2 != a->T))
        return bad(x, "shape", "grad_out [%d, %d, H] does not match hidden_in [%d, %d, H]", B2, T2, a->B, a->T);
    return check_tokens(x, a->B, a->T) ||
                   prompts_arg(x, fwd ? 1 : 2, a->q.end - a->q.start, a->B, a->T, &a->prompts, &a->P)
               ? -1
               : 0;
}

static void span_args_free(sp_server *s, span_args *a)
{
    kept_free(&s->kt, a->k);
    free(a->h), free(a->g), free(a->prompts);
    sp_buf_free(&a->pin);
    memset(a, 0, sizeof *a);
}

/* A pass over blocks [start, end) of n requests (a[0..n), parsed, of one span, T and P): their rows [B, T, H] one
 * after the other, each item's rows (rows: NULL for a single request, which runs as ever), its deep prompts
 * [nb, B, P, H] (NULL: none). */
typedef struct span_pass {
    sp_server *s;
    span_args *a;
    int n, start, end, B, T, P, H, nb;
    int *rows;
    float *x, *g, *prompts; /* (g: the BACKWARD's gradient) */
} span_pass;

/* A pass's buffer q of n bytes freed; a merged pass's (sized by what it merged) has its pages given back to the kernel
 * first: freed alone it joins the top of the worker's heap, an arena of that thread's own, which stays resident
 * (malloc_trim gives back only the main arena's top, sp_memtune's trim threshold keeps the others'; a 7 MiB buffer
 * freed in a thread stayed, released first it did not). */
static void pass_buf_free(const span_pass *p, void *q, size_t n)
{
    if (q && p->n > 1)
        sp_mem_release(q, n);
    free(q);
}

/* A merged pass's activations freed, their pages given back first (as pass_buf_free). */
static void acts_free_released(sp_block_acts *k)
{
    if (k->buf)
        sp_mem_release(k->buf, k->cap * sizeof(float));
    sp_block_acts_free(k);
}

static void pass_free(span_pass *p)
{
    size_t N = (size_t)p->B * p->T * p->H * sizeof(float);
    if (p->n > 1) {
        pass_buf_free(p, p->x, N), pass_buf_free(p, p->g, N);
        pass_buf_free(p, p->prompts, (size_t)p->nb * p->B * p->P * p->H * sizeof(float));
    }
    free(p->rows);
}

/* dst [nb, B, P, H] = the requests' prompts (each [nb, B_i, P, H]) side by side in each block. */
static void join_prompts(const span_pass *p, float *dst)
{
    size_t PH = (size_t)p->P * p->H;
    for (int i = 0; i < p->nb; i++)
        for (int j = 0; j < p->n; j++)
            memcpy(dst + ((size_t)i * p->B + p->a[j].b0) * PH, p->a[j].prompts + (size_t)i * p->a[j].B * PH,
                   (size_t)p->a[j].B * PH * sizeof(float));
}

/* The pass's buffers: a single request's own, or the requests' joined; -1 when out of memory. */
static int pass_init(span_pass *p, sp_server *s, span_args *a, int n)
{
    *p = (span_pass){.s = s, .a = a, .n = n, .start = a[0].q.start, .end = a[0].q.end, .T = a[0].T, .P = a[0].P,
                     .H = s->m->cfg.hidden, .nb = a[0].q.end - a[0].q.start};
    for (int j = 0; j < n; j++)
        a[j].b0 = p->B, p->B += a[j].B;
    if (n == 1) {
        p->x = a[0].h, p->g = a[0].g, p->prompts = a[0].prompts;
        return 0;
    }
    size_t N = (size_t)p->B * p->T * p->H;
    p->rows = malloc((size_t)n * sizeof *p->rows);
    p->x = malloc(N * sizeof(float));
    p->g = a[0].g ? malloc(N * sizeof(float)) : NULL;
    p->prompts = p->P ? malloc((size_t)p->nb * p->B * p->P * p->H * sizeof(float)) : NULL;
    if (!p->rows || !p->x || (a[0].g && !p->g) || (p->P && !p->prompts))
        return -1;
    for (int j = 0; j < n; j++) {
        size_t off = (size_t)a[j].b0 * p->T * p->H, len = (size_t)a[j].B * p->T * p->H * sizeof(float);
        p->rows[j] = a[j].B * p->T;
        memcpy(p->x + off, a[j].h, len);
        if (p->g)
            memcpy(p->g + off, a[j].g, len);
    }
    if (p->P)
        join_prompts(p, p->prompts);
    return 0;
}

/* Runs blocks [start, end) of the pass on x [B, T, H] in place, adding the deep prompts and writing each block's
 * input (prompt added) to inputs[i] ((end - start) x [B, T, H]) when inputs is non-NULL, and its activations to
 * acts[i] when acts is non-NULL. */
static sp_status run_keeping(const span_pass *p, int start, int end, float *x, float *inputs, sp_block_acts *acts,
                             sp_ws *ws, sp_err *err)
{
    sp_server *s = p->s;
    int B = p->B, T = p->T, P = p->P, H = p->H;
    if (s->dev) /* (a single request; acts: NULL there, the device recomputes) */
        return span_dev_forward(s, start, end, x, B, T, p->prompts, P, inputs, err);
    size_t N = (size_t)B * T * H;
    for (int i = 0; i < end - start; i++) {
        if (p->prompts)
            add_prompt(x, p->prompts + (size_t)(start - p->start + i) * B * P * H, B, T, 0, P, H);
        if (inputs)
            memcpy(inputs + i * N, x, N * sizeof(float));
        const sp_block *blk = &s->m->blocks[start + i - s->m->first];
        sp_block_acts *k = acts ? &acts[i] : NULL;
        sp_status st = p->rows ? sp_block_forward_items(blk, x, x, B, T, 0, p->rows, p->n, k, ws, err)
                       : k     ? sp_block_forward_keep(blk, x, x, B, T, 0, k, err)
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

/* Every request of the pass gets an ERROR reply. */
static void pass_fail(span_pass *p, const char *what, const sp_err *err)
{
    for (int j = 0; j < p->n; j++)
        bad(p->a[j].r, "internal", "%s: %s", what, err->msg);
}

/* The answers: request j's rows of out [B, T, H], and for a BACKWARD its prompts' gradients gp[j]; pushed first
 * where a request asks for it (span_reply: only a pass of one, sp_rpc_span_key keeps such requests alone). */
static void pass_reply(span_pass *p, const float *out, float *const *gp)
{
    for (int j = 0; j < p->n; j++) {
        req *r = p->a[j].r;
        sp_tensor_src t[2] = {tensor3(r, out + (size_t)p->a[j].b0 * p->T * p->H, p->a[j].B, p->T, p->H),
                              {.enc = r->reply_enc, .rank = 4, .shape = {p->nb, p->a[j].B, p->P, p->H},
                               .f32 = gp ? gp[j] : NULL}};
        span_reply(r, &p->a[j].q, t, gp && gp[j] ? 2 : 1);
    }
}

/* FORWARD: whether each request keeps its blocks' inputs (and activations) for its BACKWARD; 1 if any keeps
 * activations (the pass then keeps them all, and each takes its slice). */
static int plan_keep(span_pass *p, int *any_inputs)
{
    sp_server *s = p->s;
    int any = 0;
    *any_inputs = 0;
    for (int j = 0; j < p->n; j++) {
        span_args *a = &p->a[j];
        if (a->q.keep <= 0)
            continue;
        size_t bytes = s->dev ? span_dev_kept_bytes(s, p->start, p->end, a->B, p->T)
                              : kept_size(s, p->start, p->end, a->B, p->T, 1);
        kept_where w = kept_plan(s->o.keep_bytes, s->dev != NULL, bytes, s->dev ? span_dev_room(s) : 0);
        *any_inputs |= w != KEEP_NONE;
        a->keep_acts = w == KEEP_ACTS;
        a->keep_dev = w == KEEP_DEVICE;
        any |= a->keep_acts;
    }
    return any;
}

/* Request j's kept entry: its rows of each block's inputs (and activations) of the pass; a single request's
 * buffers themselves (*inputs, *acts taken). NULL when out of memory (its BACKWARD then recomputes). */
static kept *keep_entry(span_pass *p, int j, float **inputs, sp_block_acts **acts)
{
    span_args *a = &p->a[j];
    size_t N = (size_t)p->B * p->T * p->H, Nj = (size_t)a->B * p->T * p->H;
    kept *k = calloc(1, sizeof *k);
    float *in = !k ? NULL : p->n == 1 ? *inputs : malloc((size_t)p->nb * Nj * sizeof(float));
    if (!in) {
        free(k);
        return NULL;
    }
    sp_block_acts *ka = NULL;
    if (p->n == 1) {
        *inputs = NULL;
        ka = a->keep_acts ? *acts : NULL;
        *acts = a->keep_acts ? NULL : *acts;
    }
    for (int i = 0; p->n > 1 && i < p->nb; i++)
        memcpy(in + i * Nj, *inputs + i * N + (size_t)a->b0 * p->T * p->H, Nj * sizeof(float));
    if (p->n > 1 && a->keep_acts && (ka = calloc((size_t)p->nb, sizeof *ka)))
        for (int i = 0; i < p->nb; i++) {
            sp_err err = {0};
            kept_acts_get(&p->s->kt, &ka[i]);
            if (sp_block_acts_slice(&p->s->m->blocks[p->start + i - p->s->m->first], &ka[i], &(*acts)[i], a->b0,
                                    a->B, &err) == SP_OK)
                continue;
            for (int u = 0; u <= i; u++)
                kept_acts_put(&p->s->kt, &ka[u]);
            free(ka);
            ka = NULL;
            break;
        }
    *k = (kept){.conn = a->r->conn, .id = a->q.keep, .start = p->start, .end = p->end, .B = a->B, .T = p->T,
                .P = p->P, .inputs = in, .acts = ka, .nacts = ka ? p->nb : 0,
                .bytes = kept_size(p->s, p->start, p->end, a->B, p->T, ka != NULL), .created = sp_now_s()};
    return k;
}

/* A GPU server's FORWARD keeping its inputs and activations on the device (a pass of one, kept_plan's KEEP_DEVICE):
 * 1 when it is answered (kept and replied, or failed), 0 when the device had no room after all (nothing kept, x as
 * it was: the caller keeps the inputs on the host instead). */
static int forward_dev_kept(span_pass *p)
{
    span_args *a = &p->a[0];
    span_dev_kept *dk = NULL;
    sp_err err = {0};
    sp_status st = span_dev_forward_keep(p->s, p->start, p->end, p->x, p->B, p->T, p->prompts, p->P, &dk, &err);
    if (st == SP_ERR_NOMEM)
        return 0;
    if (st) {
        pass_fail(p, "forward", &err);
        return 1;
    }
    kept *k = calloc(1, sizeof *k);
    if (k) { /* kept before the reply goes out, as pass_forward's */
        *k = (kept){.conn = a->r->conn, .id = a->q.keep, .start = p->start, .end = p->end, .B = a->B, .T = p->T,
                    .P = p->P, .dev = dk, .bytes = span_dev_kept_size(dk), .created = sp_now_s()};
        kept_put(p->s, k);
    } else {
        span_dev_kept_free(dk); /* (its BACKWARD recomputes) */
    }
    pass_reply(p, p->x, NULL);
    return 1;
}

static void pass_forward(span_pass *p, sp_ws *ws)
{
    int any_inputs, any_acts = plan_keep(p, &any_inputs);
    if (p->n == 1 && p->a[0].keep_dev && forward_dev_kept(p))
        return;
    size_t N = (size_t)p->B * p->T * p->H;
    float *inputs = any_inputs ? malloc((size_t)p->nb * N * sizeof(float)) : NULL;
    sp_block_acts *acts = any_acts && inputs ? calloc((size_t)p->nb, sizeof *acts) : NULL;
    for (int i = 0; acts && p->n == 1 && i < p->nb; i++)
        kept_acts_get(&p->s->kt, &acts[i]); /* last steps' buffers: no fresh pages */
    sp_err err = {0};
    blas_threads_for(p->s, (long)p->B * p->T, 0);
    if (run_keeping(p, p->start, p->end, p->x, inputs, acts, ws, &err)) {
        pass_fail(p, "forward", &err);
        goto done;
    }
    /* kept before the replies go out: a client may send its BACKWARD the moment it has its reply */
    for (int j = 0; inputs && j < p->n; j++) {
        kept *k = p->a[j].q.keep > 0 ? keep_entry(p, j, &inputs, &acts) : NULL;
        if (k)
            kept_put(p->s, k);
    }
    pass_reply(p, p->x, NULL);
done: /* (a pass's own buffers are freed: the pool keeps buffers of a request's size, which the FORWARDs to come reuse) */
    for (int i = 0; acts && i < p->nb; i++)
        if (p->n == 1)
            kept_acts_put(&p->s->kt, &acts[i]);
        else
            acts_free_released(&acts[i]);
    free(acts);
    pass_buf_free(p, inputs, (size_t)p->nb * N * sizeof(float));
    if (p->n > 1)
        sp_mem_trim(); /* a merged pass's sizes vary with what it merged: no holes left for other sizes to split */
}

/* Request j's rows of each block's inputs kept by its FORWARD, into the pass's inputs (nb x [B, T, H]). */
static void join_inputs(const span_pass *p, float *inputs)
{
    size_t N = (size_t)p->B * p->T * p->H;
    for (int j = 0; j < p->n; j++) {
        size_t Nj = (size_t)p->a[j].B * p->T * p->H;
        for (int i = 0; i < p->nb; i++)
            memcpy(inputs + i * N + (size_t)p->a[j].b0 * p->T * p->H, p->a[j].k->inputs + i * Nj, Nj * sizeof(float));
    }
}

/* Block i's backward over the pass (g in place): from the kept activations when every request has them (joined into
 * *joined for several), else recomputing. */
static sp_status backward_block(span_pass *p, int i, const float *in, int acts, const sp_block_acts **parts,
                                sp_block_acts *joined, sp_ws *ws, sp_err *err)
{
    const sp_block *blk = &p->s->m->blocks[p->start + i - p->s->m->first];
    const sp_block_acts *k = acts ? &p->a[0].k->acts[i] : NULL;
    for (int j = 0; acts && p->n > 1; j++) {
        if (j == p->n) {
            sp_status st = sp_block_acts_join(blk, joined, parts, p->n, err);
            if (st)
                return st;
            k = joined;
            break;
        }
        parts[j] = &p->a[j].k->acts[i];
    }
    if (p->rows)
        return sp_block_backward_items(blk, p->g, p->g, in, p->B, p->T, 0, p->rows, p->n, k, ws, err);
    return k ? sp_block_backward_kept(blk, p->g, p->g, in, k, NULL, ws, err)
             : sp_block_backward(blk, p->g, p->g, in, p->B, p->T, 0, NULL, ws, err);
}

/* Block i's gradient at the first P positions of request j's rows: its prompts' gradient there. */
static void prompt_grads(const span_pass *p, int i, float *const *gp)
{
    for (int j = 0; gp && j < p->n; j++)
        for (int b = 0; b < p->a[j].B; b++)
            memcpy(gp[j] + (((size_t)i * p->a[j].B + b) * p->P) * p->H,
                   p->g + (size_t)(p->a[j].b0 + b) * p->T * p->H, (size_t)p->P * p->H * sizeof(float));
}

/* The pass's kept entries given back once its backward has read them, before the replies: a client that has its
 * answer finds their bytes free (sp_server_kept_bytes). */
static void pass_release_kept(span_pass *p)
{
    for (int j = 0; j < p->n; j++) {
        kept_free(&p->s->kt, p->a[j].k);
        p->a[j].k = NULL;
    }
}

/* Recomputes the span's forward keeping every block's input, then back-propagates grad_out through the blocks in
 * reverse; a block's prompt gradient is the gradient at its input's first P positions. With every request's
 * kept entry (its FORWARD's inputs, maybe activations) nothing is recomputed. */
static void pass_backward(span_pass *p, sp_ws *ws)
{
    sp_server *s = p->s;
    int kept_all = 1, acts_all = 1;
    for (int j = 0; j < p->n; j++) {
        span_args *a = &p->a[j];
        a->k = a->q.keep > 0 ? kept_take(s, a->r->conn, a->q.keep, p->start, p->end, a->B, p->T, p->P) : NULL;
        kept_all &= a->k != NULL;
        acts_all &= a->k && a->k->acts;
    }
    size_t N = (size_t)p->B * p->T * p->H;
    float *inputs = NULL, **gp = p->P ? calloc((size_t)p->n, sizeof *gp) : NULL;
    const sp_block_acts **parts = calloc((size_t)p->n, sizeof *parts);
    sp_block_acts joined = {0};
    sp_err err = {0};
    const span_dev_kept *dk = kept_all && p->n == 1 ? p->a[0].k->dev : NULL; /* (a GPU server's: no host inputs) */
    if (kept_all && p->n == 1)
        inputs = p->a[0].k->inputs, p->a[0].k->inputs = NULL;
    else
        inputs = malloc((size_t)p->nb * N * sizeof(float));
    int ok = (inputs || dk) && parts && (!p->P || gp);
    for (int j = 0; ok && gp && j < p->n; j++)
        ok = (gp[j] = calloc((size_t)p->nb * p->a[j].B * p->P * p->H, sizeof(float))) != NULL;
    if (!ok) {
        pass_fail(p, "backward", &(sp_err){.msg = "out of memory"});
        goto done;
    }
    if (kept_all && p->n > 1)
        join_inputs(p, inputs);
    if (s->dev) { /* (a single request) the whole backward on the device: from the activations kept there, or the
                   * inputs kept on the host copied in, or recomputed */
        if (span_dev_backward(s, p->start, p->end, p->g, p->x, kept_all ? inputs : NULL, dk, p->B, p->T, p->prompts,
                              p->P, gp ? gp[0] : NULL, &err)) {
            pass_fail(p, "backward", &err);
            goto done;
        }
        goto answer;
    }
    blas_threads_for(s, (long)p->B * p->T, 0);
    if (!kept_all && run_keeping(p, p->start, p->end - 1, p->x, inputs, NULL, ws, &err)) {
        pass_fail(p, "backward (recompute)", &err);
        goto done;
    }
    if (!kept_all && p->prompts) /* the last block's input: the recompute above stops before it */
        add_prompt(p->x, p->prompts + (size_t)(p->nb - 1) * p->B * p->P * p->H, p->B, p->T, 0, p->P, p->H);
    if (!kept_all)
        memcpy(inputs + (p->nb - 1) * N, p->x, N * sizeof(float));
    for (int i = p->nb - 1; i >= 0; i--) {
        if (backward_block(p, i, inputs + i * N, acts_all, parts, &joined, ws, &err)) {
            pass_fail(p, "backward", &err);
            goto done;
        }
        prompt_grads(p, i, gp);
    }
answer:
    pass_release_kept(p);
    pass_reply(p, p->g, gp);
done:
    acts_free_released(&joined); /* (of the pass's size: not for the pool) */
    for (int j = 0; gp && j < p->n; j++)
        free(gp[j]);
    free(gp);
    free(parts);
    pass_buf_free(p, inputs, (size_t)p->nb * N * sizeof(float));
    if (p->n > 1)
        sp_mem_trim(); /* as pass_forward */
}

/* Runs a[0..n) (parsed, of one span, T and P) as one pass, answers each and frees them. */
static void run_pass(sp_server *s, span_args *a, int n, sp_ws *ws)
{
    span_pass p;
    if (pass_init(&p, s, a, n))
        pass_fail(&p, a[0].r->m.type == SP_MSG_FORWARD ? "forward" : "backward", &(sp_err){.msg = "out of memory"});
    else if (a[0].r->m.type == SP_MSG_FORWARD)
        pass_forward(&p, ws);
    else
        pass_backward(&p, ws);
    pass_free(&p);
    for (int j = 0; j < n; j++)
        span_args_free(s, &a[j]);
    if (n > 1 && ws->buf) /* the workspace grew to the pass's size: its pages given back too (scratch) */
        sp_mem_release(ws->buf, ws->cap * sizeof(float));
}

/* FORWARD or BACKWARD alone (one that awaits its pushed input is parked here until it comes: span_args_parse). */
static void rpc_span(req *r, sp_ws *ws)
{
    span_args a;
    if (span_args_parse(&a, r))
        span_args_free(r->s, &a);
    else
        run_pass(r->s, &a, 1, ws);
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
    sp_open_reply a = {.session = id, .max_length = (int)L,
                       .push_token = r->s->o.emulate_old == SP_SERVER_OLD_NOPUSH ? 0 : token};
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

/* The push step q asks for of its output h (B rows of T positions) sent, into p (sp_push_begin: p is finished by
 * step_answer). */
static void step_push_begin(req *r, const sp_step_req *q, const float *h, int B, int T, sp_push_pending *p)
{
    sp_tensor_src out = tensor3(r, h, B, T, r->s->m->cfg.hidden);
    SP_TRACE(SP_TR_SRV_PUSH);
    sp_push_begin(r->s, q, &out, p);
}

/* The reply of step q whose T positions of B rows are in h, the session advanced: first its push p (begun by
 * step_push_begin; NULL: none asked) is acknowledged (the next server's input is the critical path, this reply is
 * not), then the reply, saying whether the push arrived. */
static void step_answer(req *r, const sp_step_req *q, session *x, const float *h, int B, int T, sp_push_pending *p)
{
    sp_err err = {0};
    x->len += T;
    sp_tensor_src out = tensor3(r, h, B, T, r->s->m->cfg.hidden);
    sp_step_reply a = {.position = x->len, .rx_mbit = rx_rate(r)};
    if (p) {
        sp_err perr = {0};
        a.pushed = sp_push_finish(r->s, p, &perr) == SP_OK;
        SP_TRACE(SP_TR_SRV_PUSHED);
        if (a.pushed)
            __atomic_add_fetch(&r->s->pushes_out, 1, __ATOMIC_RELAXED);
        else
            sp_log(SP_LOG_INFO, "session %llu: push to %s:%d failed: %s", (unsigned long long)x->id, q->push_host,
                   q->push_port, perr.msg);
    }
    char meta[128];
    if (sp_step_reply_encode(&a, meta, sizeof meta, &err))
        return (void)bad(r, "internal", "%s", err.msg);
    reply(r, meta, &out, 1);
}

/* A step's push (when q asks for one) and reply: step_answer of a push of its own. */
static void step_reply(req *r, const sp_step_req *q, session *x, const float *h, int B, int T)
{
    sp_push_pending p;
    if (q->push_port > 0)
        step_push_begin(r, q, h, B, T, &p);
    step_answer(r, q, x, h, B, T, q->push_port > 0 ? &p : NULL);
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
    __atomic_store_n(&x->pend_ns, sp_now_ns(), __ATOMIC_RELAXED);
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
    if (!bad_meta(r, sp_step_req_decode(&r->m, &q, &err), &err)) {
        old_step_req(r->s, &q);
        step_decoded(r, &q, ws);
    }
}

/* An empty reply (the acknowledgement of a push) in a buffer of its own: the request's holds the input. */
static void ack(req *r)
{
    if (r->acked)
        return;
    sp_buf b = {0};
    if (sp_msg_encode(&b, r->m.type, SP_MSG_F_REPLY, r->m.request_id, NULL, NULL, 0, NULL) == SP_OK)
        sp_ws_server_send(r->s->ws, r->conn, &b, NULL);
    else
        sp_buf_free(&b);
}

/* Push r's message (the input of step `step`) kept in x's inbox for its step, which comes later; the input of a
 * step that was given up (x awaits a later one) is dropped. */
static void keep_push(session *x, req *r, uint64_t step)
{
    if (x->pend.len && x->pend_step >= step)
        return;
    sp_buf_free(&x->inbox);
    x->inbox = *r->msg;
    memset(r->msg, 0, sizeof *r->msg);
    r->msg = NULL;
    x->inbox_step = step;
}

/* The step that awaited the input of push r in session x (held by r) runs on it: its reply goes to its own
 * connection, and the session is let go before it does. */
static void run_pending(req *r, session *x, sp_ws *ws)
{
    req p = {.s = r->s, .conn = x->pend_conn, .held = x};
    sp_buf pb = x->pend;
    memset(&x->pend, 0, sizeof x->pend);
    x->pend_step = 0;
    __atomic_store_n(&x->pend_ns, 0, __ATOMIC_RELAXED);
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
    } else {
        keep_push(x, r, q.step);
    }
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
    if (s->o.emulate_old == SP_SERVER_OLD_NOPUSH)
        bad(&r, "unknown_type", "%s is not a request this server serves", sp_msg_type_name(r.m.type));
    else if (!bad_meta(&r, sp_span_push_req_decode(&r.m, &q, &err), &err) && !float_tensor(&r, 0, "hidden", 3)) {
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

int sp_rpc_push_ack(sp_server *s, uint64_t conn, const sp_buf *msg)
{
    sp_msg m;
    sp_push_req q;
    sp_err err = {0};
    if (s->o.emulate_old == SP_SERVER_OLD_NOPUSH || sp_msg_decode(&m, msg->data, msg->len, &s->limits, &err) ||
        m.type != SP_MSG_INFERENCE_PUSH)
        return 0;
    const sp_tensor_view *t = &m.t[0];
    int ok = sp_push_req_decode(&m, &q, &err) == SP_OK && m.n_tensors > 0 && sp_encoding_is_float(t->enc) &&
             t->rank == 3 && t->shape[2] == s->m->cfg.hidden && sp_tensor_all_finite(t) &&
             session_push_ok(s, q.session, q.token);
    if (ok)
        ack(&(req){.s = s, .conn = conn, .m = m});
    sp_msg_clear(&m);
    return ok;
}

void sp_rpc_handle(sp_server *s, uint64_t conn, sp_buf *msg, sp_ws *ws) { sp_rpc_handle_task(s, conn, msg, 0, ws); }

void sp_rpc_handle_task(sp_server *s, uint64_t conn, sp_buf *msg, int acked, sp_ws *ws)
{
    req r;
    if (decode(&r, s, conn, msg))
        return;
    r.msg = msg;
    r.acked = acked && r.m.type == SP_MSG_INFERENCE_PUSH;
    count_batch(&r);
    switch (r.m.type) {
    case SP_MSG_FORWARD:
    case SP_MSG_BACKWARD: rpc_span(&r, ws); break;
    case SP_MSG_INFERENCE_OPEN: rpc_open(&r); break;
    case SP_MSG_INFERENCE_STEP: rpc_step(&r, ws); break;
    case SP_MSG_INFERENCE_CLOSE: rpc_close(&r); break;
    case SP_MSG_INFERENCE_PUSH:
        if (s->o.emulate_old != SP_SERVER_OLD_NOPUSH) {
            rpc_push(&r, ws);
            break;
        }
        __attribute__((fallthrough)); /* a type an older server does not know */
    default: bad(&r, "unknown_type", "%s is not a request this server serves", sp_msg_type_name(r.m.type));
    }
    sp_msg_clear(&r.m);
}

/* ---------------------------------------------------------------------------------------------- */
/* decode steps of many sessions as one pass */

/* One step taken in: where its rows are in the batch (-1: it runs alone after the pass; -2: answered already, or
 * a half of a pushed step kept; -3: a push or a step that awaits its input whose session was held when it was
 * taken: it runs as alone (rpc_push, step_decoded), after the pass), its shape (B rows of T positions: B x T rows
 * in the batch) and prompts' index (step_prepare's), its input (NULL: the step's own tensor 0, else a push's: the
 * one taken in with it, or the one its session kept), and whether it only kept a half of a pushed step. */
typedef struct bstep {
    int off, B, T, pi, kept;
    const sp_tensor_view *in;
} bstep;

struct sp_step_batch {
    req *r;          /* the steps taken in, [cap] (a push's: the step that awaited it) */
    req *pr;         /* the pushes taken in (or, for a step that awaited its input, the push its session kept) */
    sp_buf *own;     /* the message of a step that awaited its input, or of the push its session kept: the batch's */
    sp_step_req *q;
    bstep *st;
    float *h;        /* the batched steps' hidden states, rows in order [rows, H] */
    size_t hcap;     /* floats */
    sp_kv_cache **kv;
    session **xs;    /* a pass's sessions, in order (--device cuda) */
    int *T;          /* the positions of each step of a pass */
    int *item_rows;
    int *group;      /* the steps of one span, in order */
    sp_push_pending *pp; /* a pass's pushes in flight, its steps' in order */
    int cap;
    sp_ws ws;
};

sp_step_batch *sp_step_batch_new(void) { return calloc(1, sizeof(sp_step_batch)); }

void sp_step_batch_free(sp_step_batch *b)
{
    if (!b)
        return;
    free(b->r), free(b->pr), free(b->own), free(b->q), free(b->st), free(b->h), free(b->kv), free(b->xs), free(b->T), free(b->item_rows), free(b->group), free(b->pp);
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
    if (grow(&b->r, m, sizeof *b->r) | grow(&b->pr, m, sizeof *b->pr) | grow(&b->own, m, sizeof *b->own) |
        grow(&b->q, m, sizeof *b->q) | grow(&b->st, m, sizeof *b->st) |
        grow(&b->kv, m, sizeof *b->kv) | grow(&b->xs, m, sizeof *b->xs) | grow(&b->T, m, sizeof *b->T) | grow(&b->item_rows, m, sizeof *b->item_rows) |
        grow(&b->group, m, sizeof *b->group) | grow(&b->pp, m, sizeof *b->pp))
        return -1;
    b->cap = n;
    return 0;
}

/* Takes step i in: decoded, its session held, checked and prepared. Off is set to its first row in h when it
 * joins the pass (its B x T rows copied there; *rows grows): a decode step or a prefill whose rows alone run in
 * the decode kernels (sp_block_rows_exact: up to SP_KERN_MAX_ROWS, up to PASS_MAX_STEP_ROWS where every product
 * runs in integers: int8 and nf4; the pass gives it the bits it gets alone), without prompts, within the budget; -1 when
 * it runs alone (a longer prefill of other weights, prompts, a wide beam, no room left in the budget), -2 when it
 * was answered already (an ERROR). */
/* The longest step (rows: batch x positions) that joins a pass of int8/nf4 blocks. A product of 64 rows already
 * reads each weight once for many rows and binds on its arithmetic (bench/serve --mix: prefills of 128 to 512
 * positions cost the same CPU a token merged or alone), while every step of the pass waits for the longest one's
 * rows: longer prefills run after the pass, alone. */
#define PASS_MAX_STEP_ROWS 64

/* Step i (its session held by b->r[i], its input hid) prepared (step_prepare), and into the pass when it may join
 * it (see batch_take). */
static void batch_join(sp_step_batch *b, sp_server *s, int i, const sp_tensor_view *hid, int *rows)
{
    req *r = &b->r[i];
    bstep *t = &b->st[i];
    sp_err err = {0};
    if (step_prepare(r, &b->q[i], r->held, hid, &t->B, &t->T, &t->pi))
        return;
    t->off = -1;
    int n = t->B * t->T;
    size_t H = (size_t)s->m->cfg.hidden, need = (size_t)(*rows + n) * H;
    if (t->pi < r->m.n_tensors || !sp_block_rows_exact(&s->m->blocks[0], n) || n > PASS_MAX_STEP_ROWS ||
        *rows + n > s->o.max_batch_tokens ||
        (s->dev && t->T > 1)) /* the device's pass takes decode steps; its short prefills run one by one */
        return;
    if (need > b->hcap) {
        if (grow(&b->h, need * 2, sizeof(float)))
            return;
        b->hcap = need * 2;
    }
    if (sp_tensor_to_f32(hid, b->h + (size_t)*rows * H, &err))
        return (void)(bad(r, "internal", "decoding tensor 0: %s", err.msg), t->off = -2);
    t->off = *rows;
    *rows += n;
    if (t->T > 1)
        __atomic_add_fetch(&s->batched_prefills, 1, __ATOMIC_RELAXED);
    if (n > SP_KERN_MAX_ROWS)
        __atomic_add_fetch(&s->batched_long, 1, __ATOMIC_RELAXED);
}

/* Push i (decoded in b->r[i]) taken in as rpc_push takes it (checked, its session's token, acknowledged at once):
 * where its step awaits it here, that step (b->r[i] now, its message the batch's) joins the pass on its input (its
 * push in b->pr[i]); else it is kept for its step, or dropped (a step given up). Its session held: -3, as alone after
 * the pass. */
static void batch_take_push(sp_step_batch *b, sp_server *s, int i, int *rows)
{
    req *p = &b->pr[i], *r = &b->r[i];
    bstep *t = &b->st[i];
    *p = *r;
    *r = (req){.s = s};
    sp_push_req q;
    sp_err err = {0};
    if (bad_meta(p, sp_push_req_decode(&p->m, &q, &err), &err) || float_tensor(p, 0, "hidden", 3))
        return;
    session *x = session_acquire_within(s, 0, q.session, q.token, 0, &err);
    if (!x && err.code == SP_ERR_STATE)
        return (void)(t->off = -3);
    if (!x)
        return (void)bad(p, err.code == SP_ERR_ARG ? "forbidden" : "no_session", "%s", err.msg);
    p->held = x;
    ack(p);
    __atomic_add_fetch(&s->pushes_in, 1, __ATOMIC_RELAXED);
    if (x->pend.len && x->pend_step == q.step) { /* its step awaits it: the step joins the pass on it */
        b->own[i] = x->pend;
        memset(&x->pend, 0, sizeof x->pend);
        x->pend_step = 0;
        __atomic_store_n(&x->pend_ns, 0, __ATOMIC_RELAXED);
        *r = (req){.s = s, .conn = x->pend_conn, .held = x, .msg = &b->own[i]};
        p->held = NULL;
        if (sp_msg_decode(&r->m, b->own[i].data, b->own[i].len, &s->limits, &err) != SP_OK ||
            sp_step_req_decode(&r->m, &b->q[i], &err) != SP_OK) /* (it decoded when it came) */
            return (void)bad(r, "internal", "the awaiting step: %s", err.msg);
        t->in = &p->m.t[0];
        return batch_join(b, s, i, t->in, rows);
    }
    keep_push(x, p, q.step);
    t->kept = 1;
    let_go(p);
}

/* Step i (decoded, b->q[i]) that awaits its input by push, taken in as step_decoded takes it: where its push came
 * already (its session keeps it), it joins the pass on that input (the push's message the batch's, decoded in
 * b->pr[i]); else its session keeps it for the push. Its session held: -3, as alone after the pass. */
static void batch_take_await(sp_step_batch *b, sp_server *s, int i, int *rows)
{
    req *r = &b->r[i];
    bstep *t = &b->st[i];
    const sp_step_req *q = &b->q[i];
    sp_err err = {0};
    __atomic_store_n(&s->pushing, 1, __ATOMIC_RELAXED);
    session *x = session_acquire_within(s, r->conn, q->session, 0, 0, &err);
    if (!x && err.code == SP_ERR_STATE)
        return (void)(t->off = -3);
    if (!x)
        return (void)bad(r, "no_session", "%s", err.msg);
    r->held = x;
    if (!q->step)
        return (void)bad(r, "bad_request", "a step that awaits its input needs a step number");
    if (!x->inbox.len || x->inbox_step != q->step) {
        stash_step(r, x, q->step);
        t->kept = 1;
        return let_go(r);
    }
    b->own[i] = x->inbox;
    memset(&x->inbox, 0, sizeof x->inbox);
    b->pr[i] = (req){.s = s};
    if (sp_msg_decode(&b->pr[i].m, b->own[i].data, b->own[i].len, &s->limits, &err) != SP_OK)
        return (void)bad(r, "internal", "the pushed input: %s", err.msg);
    t->in = &b->pr[i].m.t[0];
    batch_join(b, s, i, t->in, rows);
}

static void batch_take(sp_step_batch *b, sp_server *s, uint64_t conn, sp_buf *msg, int acked, int i, int *rows)
{
    req *r = &b->r[i];
    bstep *t = &b->st[i];
    sp_err err = {0};
    *t = (bstep){.off = -2};
    b->pr[i] = (req){.s = s};
    b->own[i] = (sp_buf){0};
    if (decode(r, s, conn, msg))
        return;
    r->msg = msg;
    r->acked = acked && r->m.type == SP_MSG_INFERENCE_PUSH;
    if (r->m.type == SP_MSG_INFERENCE_PUSH && s->o.emulate_old != SP_SERVER_OLD_NOPUSH)
        return batch_take_push(b, s, i, rows);
    if (r->m.type != SP_MSG_INFERENCE_STEP) /* (the queue gives steps and pushes only): as alone, after the pass */
        return (void)(t->off = -3);
    if (bad_meta(r, sp_step_req_decode(&r->m, &b->q[i], &err), &err))
        return;
    old_step_req(s, &b->q[i]);
    if (b->q[i].await > 0) /* its input comes by push */
        return batch_take_await(b, s, i, rows);
    if (b->q[i].push_port > 0)
        __atomic_store_n(&s->pushing, 1, __ATOMIC_RELAXED);
    session *x = session_acquire(s, conn, b->q[i].session, &err);
    if (!x)
        return (void)bad(r, err.code == SP_ERR_STATE ? "busy" : "no_session", "%s", err.msg);
    r->held = x;
    session_drop_push(x); /* a step with its own input: whatever awaited or came early is superseded */
    if (!float_tensor(r, 0, "hidden", 3))
        batch_join(b, s, i, &r->m.t[0], rows);
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
    /* the pushes first, all sent before any is awaited: their acknowledgements come back meanwhile (a pass of N
     * pushed sessions waits about one round trip to the next servers, not N); then each step's acknowledgement and
     * reply, in order */
    for (int k = 0; !st && k < n; k++) {
        bstep *t = &b->st[g[k]];
        if (b->q[g[k]].push_port > 0)
            step_push_begin(&b->r[g[k]], &b->q[g[k]], b->h + (size_t)t->off * H, t->B, t->T, &b->pp[k]);
    }
    for (int k = 0; k < n; k++) {
        req *r = &b->r[g[k]];
        bstep *t = &b->st[g[k]];
        if (st)
            bad(r, "internal", "step: %s", err.msg);
        else
            step_answer(r, &b->q[g[k]], r->held, b->h + (size_t)t->off * H, t->B, t->T,
                        b->q[g[k]].push_port > 0 ? &b->pp[k] : NULL);
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

/* Entry i of a batch handled as alone, after the pass: a push (rpc_push) or a step (step_decoded) whose session was
 * held when it was taken, or a request of another type. */
static void batch_alone(sp_step_batch *b, int i, sp_ws *ws)
{
    req *r = b->pr[i].m.type == SP_MSG_INFERENCE_PUSH ? &b->pr[i] : &b->r[i]; /* (batch_take_push moved it there) */
    if (r->m.type == SP_MSG_INFERENCE_PUSH)
        rpc_push(r, ws);
    else if (r->m.type == SP_MSG_INFERENCE_STEP)
        count_batch(r), step_decoded(r, &b->q[i], ws);
    else
        bad(r, "unknown_type", "%s is not a request this server serves", sp_msg_type_name(r->m.type));
}

int sp_rpc_handle_steps(sp_server *s, const uint64_t *conns, sp_buf *const *msgs, const int *acked, int n,
                        sp_step_batch *b, sp_ws *ws, uint64_t *ids)
{
    if (batch_reserve(b, n)) { /* no room to batch: one at a time */
        for (int i = 0; i < n; i++)
            ids[i] = 0, sp_rpc_handle_task(s, conns[i], msgs[i], acked[i], ws);
        return n;
    }
    int rows = 0, halves = 0;
    for (int i = 0; i < n; i++)
        batch_take(b, s, conns[i], msgs[i], acked[i], i, &rows);
    for (int i = 0; i < n; i++) {
        halves += b->st[i].kept;
        ids[i] = b->st[i].off >= -1 ? b->q[i].session : 0;
    }
    blas_threads_for(s, 1, 1);
    SP_TRACE(SP_TR_SRV_COMPUTE);
    batch_run(b, s, n);
    for (int i = 0; i < n; i++) { /* longer prefills and the rest, after the pass: each alone */
        req *r = &b->r[i];
        if (b->st[i].off == -1) {
            sp_mx_batch(&s->mx, 1, SP_MX_TOK_INFERENCE, (uint64_t)b->st[i].B * b->st[i].T);
            step_run(r, &b->q[i], r->held, b->st[i].in ? b->st[i].in : &r->m.t[0], b->st[i].B, b->st[i].T,
                     b->st[i].pi, ws);
        }
        if (b->st[i].off != -3)
            let_go(r);
    }
    for (int i = 0; i < n; i++) { /* those whose sessions were held, after every other let its session go */
        if (b->st[i].off == -3)
            batch_alone(b, i, ws);
        let_go(&b->r[i]);
        let_go(&b->pr[i]);
        sp_msg_clear(&b->r[i].m);
        sp_msg_clear(&b->pr[i].m);
        sp_buf_free(&b->own[i]);
    }
    if (halves == n) /* no blocks ran: halves of pushed steps kept, acknowledged */
        return 0;
    __atomic_add_fetch(&s->batches, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&s->batched_rows, (uint64_t)rows, __ATOMIC_RELAXED);
    for (uint64_t old = __atomic_load_n(&s->batch_peak, __ATOMIC_RELAXED); (uint64_t)rows > old;)
        if (__atomic_compare_exchange_n(&s->batch_peak, &old, (uint64_t)rows, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            break;
    return n - halves;
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
                        .bulk_token = sp_ws_server_bulk_token(s->ws, r->conn), .dht_port = s->o.dht_port,
                        .caps = sp_server_caps(s)};
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
    uint64_t passed[2];
    sp_server_passed(s, r->conn, passed);
    a.passed_inference = (int64_t)passed[0], a.passed_training = (int64_t)passed[1];
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

/* ---------------------------------------------------------------------------------------------- */
/* training's FORWARDs and BACKWARDs of several clients as one pass */

/* Whether q awaits a pushed input or asks for its output to be pushed (any of the push fields): such a request runs
 * as a pass of its own, where await_input and span_reply handle it. */
static int span_pushes(const sp_span_req *q)
{
    return q->await || q->await_token || q->push_host[0] || q->push_port || q->push_id || q->push_token;
}

int sp_rpc_span_key(const sp_server *s, const sp_buf *msg, sp_span_key *k)
{
    sp_msg m;
    sp_span_req q;
    sp_err err = {0};
    if (s->dev || s->o.no_batch || s->m->blocks[0].k.mlp == SP_MLP_MOE ||
        sp_msg_decode(&m, msg->data, msg->len, &s->limits, &err))
        return -1;
    int fwd = m.type == SP_MSG_FORWARD, pi = fwd ? 1 : 2;
    int ok = (fwd || m.type == SP_MSG_BACKWARD) &&
             (fwd ? sp_forward_req_decode(&m, &q, &err) : sp_backward_req_decode(&m, &q, &err)) == SP_OK &&
             !span_pushes(&q) && m.n_tensors > 0 && m.t[0].rank == 3;
    /* more rows than the decode kernels take: alone it runs every product in sgemm, on all the BLAS threads, as
     * in a pass (blas_threads_for) */
    if (ok && m.t[0].shape[0] * m.t[0].shape[1] > SP_KERN_MAX_ROWS && m.t[0].shape[0] * m.t[0].shape[1] <= INT_MAX)
        *k = (sp_span_key){.type = m.type, .start = q.start, .end = q.end, .T = (int)m.t[0].shape[1],
                           .P = m.n_tensors > pi && m.t[pi].rank == 4 ? (int)m.t[pi].shape[2] : 0,
                           .rows = (int)(m.t[0].shape[0] * m.t[0].shape[1])};
    else
        ok = 0;
    sp_msg_clear(&m);
    return ok ? 0 : -1;
}

uint64_t sp_rpc_step_session(const sp_server *s, const sp_buf *msg)
{
    sp_msg m;
    sp_step_req q;
    sp_push_req p;
    sp_err err = {0};
    uint64_t id = 0;
    if (sp_msg_decode(&m, msg->data, msg->len, &s->limits, &err) != SP_OK)
        return 0;
    if (m.type == SP_MSG_INFERENCE_STEP && sp_step_req_decode(&m, &q, &err) == SP_OK)
        id = q.await > 0 && !s->o.emulate_old ? 0 : q.session;
    else if (m.type == SP_MSG_INFERENCE_PUSH && sp_push_req_decode(&m, &p, &err) == SP_OK)
        id = p.session;
    sp_msg_clear(&m);
    return id;
}

/* Whether two parsed requests may share a pass: the same span, positions and prompts' length. */
static int same_pass(const span_args *a, const span_args *b)
{
    return a->q.start == b->q.start && a->q.end == b->q.end && a->T == b->T && a->P == b->P;
}

void sp_rpc_handle_spans(sp_server *s, const uint64_t *conns, sp_buf *const *msgs, int n, sp_ws *ws)
{
    req *rs = calloc((size_t)n, sizeof *rs);
    span_args *a = calloc((size_t)n, sizeof *a);
    if (!rs || !a) { /* one by one */
        free(rs), free(a);
        for (int i = 0; i < n; i++)
            sp_rpc_handle(s, conns[i], msgs[i], ws);
        return;
    }
    int m = 0;
    uint64_t rows = 0;
    for (int i = 0; i < n; i++) {
        if (decode(&rs[i], s, conns[i], msgs[i]))
            continue;
        rs[i].msg = msgs[i];
        if (span_args_parse(&a[m], &rs[i])) { /* (answered: an ERROR) */
            span_args_free(s, &a[m]);
            continue;
        }
        if (m && !same_pass(&a[0], &a[m])) { /* (keys say they match: should one not, it runs alone) */
            count_batch(&rs[i]);
            run_pass(s, &a[m], 1, ws);
            continue;
        }
        rows += (uint64_t)a[m].B * a[m].T;
        m++;
    }
    if (m)
        sp_mx_batch(&s->mx, m, a[0].r->m.type == SP_MSG_FORWARD ? SP_MX_TOK_FORWARD : SP_MX_TOK_BACKWARD, rows);
    if (m)
        run_pass(s, a, m, ws);
    for (int i = 0; i < n; i++)
        sp_msg_clear(&rs[i].m);
    free(rs), free(a);
}
