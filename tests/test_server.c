/* test_server.c - sepal-server's RPCs over real websockets on loopback (servers run as threads in this
 * process; one test runs the real binary): forward/backward against transformers' golden outputs and the
 * local engine, deep prompts, inference sessions (decode == forward, rollback, hypo_ids, two clients),
 * cache budget, timeouts, bad input that must get an ERROR while the server keeps serving, and the largest
 * requests the span allows within a connection's default share (a smaller share given is refused at start). */
#include <cJSON.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "model.h"
#include "remote.h"
#include "rng.h"
#include "server.h"
#include "kept.h"
#include "push.h"
#include "testutil.h"
#include "timeutil.h"
#include "transport.h"

#define GQA SEPAL_TEST_DATA "/hf-tiny/llama-gqa"
#define H 64
#define TMO 20000

/* ---------------------------------------------------------------------------------------------- */
/* fixtures */

/* The defaults for a server of llama-gqa's blocks [a, b), its throughput not measured. */
static void gqa_opts(sp_server_opts *o, int a, int b)
{
    sp_server_opts_default(o);
    o->model_dir = GQA;
    o->start = a;
    o->end = b;
    o->measure = 0;
}

/* A server of options o, started (the test fails if it does not start). */
static sp_server *start_with(const sp_server_opts *o)
{
    sp_server *s = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_server_start(&s, o, &err) == SP_OK, "%s", err.msg);
    return s;
}

static sp_server *start_server(int a, int b, long cache_tokens, double step_timeout)
{
    sp_server_opts o;
    gqa_opts(&o, a, b);
    if (cache_tokens)
        o.cache_tokens = cache_tokens;
    if (step_timeout > 0)
        o.step_timeout_s = step_timeout;
    sp_server *s = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_server_start(&s, &o, &err) == SP_OK, "%s", err.msg);
    return s;
}

static sp_remote *connect_opts(sp_server *s, int no_bulk)
{
    sp_remote *r = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_remote_connect(&r, "127.0.0.1", sp_server_port(s), no_bulk, TMO, &err) == SP_OK, "%s", err.msg);
    return r;
}

static sp_remote *connect_to(sp_server *s) { return connect_opts(s, 0); }

static float *golden(const char *name, size_t *n)
{
    sp_safetensors *st = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_st_open(&st, GQA "/golden.safetensors", &err), SP_OK);
    const sp_st_tensor *t = sp_st_get(st, name, &err);
    ck_assert_ptr_nonnull(t);
    float *x = malloc(t->numel * sizeof(float));
    ck_assert_int_eq(sp_to_f32(x, t->data, t->dtype, t->numel, &err), SP_OK);
    *n = t->numel;
    sp_st_close(st);
    return x;
}

static sp_tensor_src t3(const float *x, int B, int T)
{
    return (sp_tensor_src){.enc = SP_ENC_F32, .rank = 3, .shape = {B, T, H}, .f32 = x};
}

/* Calls and expects success; copies tensor i of the reply to f32 (caller frees). */
static float *call_ok(sp_remote *r, sp_msg_type type, const char *meta, const sp_tensor_src *t, int n, int want_tensors,
                      sp_reply *rep)
{
    sp_err err = {0};
    ck_assert_msg(sp_remote_call(r, type, meta, t, n, rep, TMO, &err) == SP_OK, "%s: %s", sp_msg_type_name(type),
                  err.msg);
    ck_assert_int_eq(rep->msg.n_tensors, want_tensors);
    if (!want_tensors)
        return NULL;
    float *x = malloc(rep->msg.t[0].numel * sizeof(float));
    ck_assert_int_eq(sp_tensor_to_f32(&rep->msg.t[0], x, &err), SP_OK);
    return x;
}

/* Calls and expects an ERROR reply with `code`. */
static void call_err(sp_remote *r, sp_msg_type type, const char *meta, const sp_tensor_src *t, int n, const char *code)
{
    sp_reply rep;
    sp_err err = {0};
    ck_assert_int_ne(sp_remote_call(r, type, meta, t, n, &rep, TMO, &err), SP_OK);
    const char *got = sp_reply_error_code(&rep);
    ck_assert_msg(got && !strcmp(got, code), "expected %s, got %s (%s)", code, got ? got : "no reply", err.msg);
    sp_reply_clear(&rep);
}

/* The server still answers (the connection given, or a fresh one if r is NULL). */
static void still_serving(sp_server *s, sp_remote *r)
{
    sp_remote *own = r ? NULL : connect_to(s);
    sp_reply rep;
    call_ok(r ? r : own, SP_MSG_PING, "{\"x\":1}", NULL, 0, 0, &rep);
    ck_assert(rep.msg.meta_len == 7 && !memcmp(rep.msg.meta_json, "{\"x\":1}", 7)); /* echoed as it was */
    sp_reply_clear(&rep);
    sp_remote_close(own);
}

static sp_model *local_blocks(int a, int b)
{
    sp_model *m = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_model_load(&m, GQA, SP_LOAD_BLOCKS, a, b, &err), SP_OK);
    return m;
}

/* ---------------------------------------------------------------------------------------------- */
/* forward / backward */

START_TEST(t_forward_backward_golden)
{
    sp_server *s = start_server(1, 3, 0, 0);
    sp_remote *r = connect_to(s);
    ck_assert_int_eq(sp_remote_hello(r)->start, 1);
    ck_assert_int_eq(sp_remote_hello(r)->end, 3);
    size_t n;
    float *in = golden("block.1.in", &n), *out = golden("block.2.out", &n), *gout = golden("block.2.grad_out", &n);
    int B = 2, T = (int)(n / 2 / H);
    sp_reply rep;
    sp_tensor_src x = t3(in, B, T);
    float *got = call_ok(r, SP_MSG_FORWARD, "{\"start\":1,\"end\":3}", &x, 1, 1, &rep);
    ck_assert_double_le(sp_max_abs_diff(got, out, n), 1e-4); /* transformers' block.2.out */
    sp_reply_clear(&rep);
    free(got);
    /* backward: grad_in of block 1 for block 2's grad_out, expected from the local engine */
    sp_model *m = local_blocks(1, 3);
    sp_ws ws = {0};
    sp_err err = {0};
    float *mid = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
    ck_assert_int_eq(sp_block_forward(&m->blocks[0], mid, in, B, T, 0, NULL, &ws, &err), SP_OK);
    ck_assert_int_eq(sp_block_backward(&m->blocks[1], want, gout, mid, B, T, 0, NULL, &ws, &err), SP_OK);
    ck_assert_int_eq(sp_block_backward(&m->blocks[0], want, want, in, B, T, 0, NULL, &ws, &err), SP_OK);
    sp_tensor_src args[2] = {t3(in, B, T), t3(gout, B, T)};
    got = call_ok(r, SP_MSG_BACKWARD, "{\"start\":1,\"end\":3}", args, 2, 1, &rep);
    ck_assert_double_le(sp_max_abs_diff(got, want, n), 1e-5);
    sp_reply_clear(&rep);
    /* a sub-span: block 2 alone maps block.2.in to block.2.out */
    free(in);
    in = golden("block.2.in", &n);
    x = t3(in, B, T);
    free(got);
    got = call_ok(r, SP_MSG_FORWARD, "{\"start\":2,\"end\":3}", &x, 1, 1, &rep);
    ck_assert_double_le(sp_max_abs_diff(got, out, n), 1e-4);
    sp_reply_clear(&rep);
    free(in), free(out), free(gout), free(got), free(mid), free(want);
    sp_ws_free(&ws);
    sp_model_free(m);
    sp_remote_close(r);
    sp_server_stop(s);
}
END_TEST

/* Deep prompts: added to the first P positions entering each block; their gradients come back. */
START_TEST(t_deep_prompts)
{
    sp_server *s = start_server(0, 4, 0, 0);
    sp_remote *r = connect_to(s);
    int B = 2, T = 6, P = 3, nb = 2;
    sp_rng g;
    sp_rng_seed(&g, 3);
    size_t N = (size_t)B * T * H, NP = (size_t)nb * B * P * H;
    float *x = malloc(N * 4), *gout = malloc(N * 4), *pr = malloc(NP * 4);
    sp_rng_fill_normal(&g, x, (long)N, 1.0f);
    sp_rng_fill_normal(&g, gout, (long)N, 1.0f);
    sp_rng_fill_normal(&g, pr, (long)NP, 0.5f);
    /* local reference: blocks 1 and 2 with prompts added, and gradients by the chain rule */
    sp_model *m = local_blocks(1, 3);
    sp_ws ws = {0};
    sp_err err = {0};
    float *x0 = malloc(N * 4), *x1 = malloc(N * 4), *y = malloc(N * 4), *gin = malloc(N * 4), *gp = calloc(NP, 4);
    memcpy(x0, x, N * 4);
    for (int k = 0; k < 2; k++) {
        float *cur = k ? x1 : x0;
        if (k)
            ck_assert_int_eq(sp_block_forward(&m->blocks[0], x1, x0, B, T, 0, NULL, &ws, &err), SP_OK);
        for (int b = 0; b < B; b++)
            for (int p = 0; p < P; p++)
                for (int c = 0; c < H; c++)
                    cur[((size_t)b * T + p) * H + c] += pr[(((size_t)k * B + b) * P + p) * H + c];
    }
    ck_assert_int_eq(sp_block_forward(&m->blocks[1], y, x1, B, T, 0, NULL, &ws, &err), SP_OK);
    ck_assert_int_eq(sp_block_backward(&m->blocks[1], gin, gout, x1, B, T, 0, NULL, &ws, &err), SP_OK);
    for (int b = 0; b < B; b++)
        memcpy(gp + ((size_t)(1 * B + b) * P) * H, gin + (size_t)b * T * H, (size_t)P * H * 4);
    ck_assert_int_eq(sp_block_backward(&m->blocks[0], gin, gin, x0, B, T, 0, NULL, &ws, &err), SP_OK);
    for (int b = 0; b < B; b++)
        memcpy(gp + ((size_t)b * P) * H, gin + (size_t)b * T * H, (size_t)P * H * 4);
    sp_tensor_src prompts = {.enc = SP_ENC_F32, .rank = 4, .shape = {nb, B, P, H}, .f32 = pr};
    sp_tensor_src fa[2] = {t3(x, B, T), prompts};
    sp_reply rep;
    float *got = call_ok(r, SP_MSG_FORWARD, "{\"start\":1,\"end\":3}", fa, 2, 1, &rep);
    ck_assert_double_le(sp_max_abs_diff(got, y, N), 1e-5);
    sp_reply_clear(&rep);
    free(got);
    sp_tensor_src ba[3] = {t3(x, B, T), t3(gout, B, T), prompts};
    got = call_ok(r, SP_MSG_BACKWARD, "{\"start\":1,\"end\":3}", ba, 3, 2, &rep);
    ck_assert_double_le(sp_max_abs_diff(got, gin, N), 1e-5);
    float *gpr = malloc(NP * 4);
    ck_assert_int_eq(rep.msg.t[1].rank, 4);
    ck_assert_int_eq(sp_tensor_to_f32(&rep.msg.t[1], gpr, &err), SP_OK);
    ck_assert_double_le(sp_max_abs_diff(gpr, gp, NP), 1e-5);
    sp_reply_clear(&rep);
    /* prompts of the wrong block count are refused */
    float *pr3 = calloc(3 * NP / 2, 4); /* room for 3 blocks' prompts */
    sp_tensor_src bad = prompts;
    bad.shape[0] = 3;
    bad.f32 = pr3;
    sp_tensor_src fb[2] = {t3(x, B, T), bad};
    call_err(r, SP_MSG_FORWARD, "{\"start\":1,\"end\":3}", fb, 2, "shape");
    free(pr3);
    free(x), free(gout), free(pr), free(x0), free(x1), free(y), free(gin), free(gp), free(got), free(gpr);
    sp_ws_free(&ws);
    sp_model_free(m);
    sp_remote_close(r);
    sp_server_stop(s);
}
END_TEST

/* A FORWARD that keeps its activations lets the BACKWARD skip the recompute: same gradients (with deep
 * prompts), and an unknown or already used id just recomputes. */
/* keep_bytes: the server's cap for kept activations (0: default). With the default the FORWARD keeps every
 * block's activations (the BACKWARD recomputes nothing); with a small cap only the blocks' inputs (each
 * block's forward is recomputed inside its backward); the answers are the same either way. */
static void keep_kept(size_t keep_bytes)
{
    sp_server_opts o;
    gqa_opts(&o, 0, 4);
    if (keep_bytes)
        o.keep_bytes = keep_bytes;
    sp_server *s = NULL;
    sp_err err0 = {0};
    ck_assert_msg(sp_server_start(&s, &o, &err0) == SP_OK, "%s", err0.msg);
    sp_remote *r = connect_to(s);
    int B = 2, T = 5, P = 2, nb = 3;
    size_t N = (size_t)B * T * H, NP = (size_t)nb * B * P * H;
    sp_rng g;
    sp_rng_seed(&g, 21);
    float *x = malloc(N * 4), *gout = malloc(N * 4), *pr = malloc(NP * 4);
    sp_rng_fill_normal(&g, x, (long)N, 1.0f);
    sp_rng_fill_normal(&g, gout, (long)N, 1.0f);
    sp_rng_fill_normal(&g, pr, (long)NP, 0.5f);
    sp_tensor_src prompts = {.enc = SP_ENC_F32, .rank = 4, .shape = {nb, B, P, H}, .f32 = pr};
    sp_tensor_src fa[2] = {t3(x, B, T), prompts}, ba[3] = {t3(x, B, T), t3(gout, B, T), prompts};
    sp_reply rep;
    sp_err err = {0};
    /* reference: plain FORWARD + BACKWARD (recompute) */
    float *y0 = call_ok(r, SP_MSG_FORWARD, "{\"start\":1,\"end\":4}", fa, 2, 1, &rep);
    sp_reply_clear(&rep);
    float *g0 = call_ok(r, SP_MSG_BACKWARD, "{\"start\":1,\"end\":4}", ba, 3, 2, &rep);
    float *gp0 = malloc(NP * 4);
    ck_assert_int_eq(sp_tensor_to_f32(&rep.msg.t[1], gp0, &err), SP_OK);
    sp_reply_clear(&rep);
    /* kept: identical results */
    float *y1 = call_ok(r, SP_MSG_FORWARD, "{\"start\":1,\"end\":4,\"keep\":7}", fa, 2, 1, &rep);
    sp_reply_clear(&rep);
    ck_assert_mem_eq(y1, y0, N * 4);
    size_t inputs_only = (size_t)nb * N * 4;
    if (keep_bytes) /* inputs only */
        ck_assert_uint_eq(sp_server_kept_bytes(s), inputs_only);
    else /* and the activations, several times more */
        ck_assert_uint_gt(sp_server_kept_bytes(s), 3 * inputs_only);
    float *g1 = call_ok(r, SP_MSG_BACKWARD, "{\"start\":1,\"end\":4,\"kept\":7}", ba, 3, 2, &rep);
    float *gp1 = malloc(NP * 4);
    ck_assert_int_eq(sp_tensor_to_f32(&rep.msg.t[1], gp1, &err), SP_OK);
    sp_reply_clear(&rep);
    ck_assert_double_le(sp_max_abs_diff(g1, g0, N), 1e-6);
    ck_assert_double_le(sp_max_abs_diff(gp1, gp0, NP), 1e-6);
    /* again: the FORWARD now reuses the buffers the BACKWARD gave back; the same answer */
    free(call_ok(r, SP_MSG_FORWARD, "{\"start\":1,\"end\":4,\"keep\":9}", fa, 2, 1, &rep));
    sp_reply_clear(&rep);
    float *g9 = call_ok(r, SP_MSG_BACKWARD, "{\"start\":1,\"end\":4,\"kept\":9}", ba, 3, 2, &rep);
    sp_reply_clear(&rep);
    ck_assert_double_le(sp_max_abs_diff(g9, g0, N), 1e-6);
    free(g9);
    /* the id was used up, and an unknown one: both recompute, same answer */
    float *g2 = call_ok(r, SP_MSG_BACKWARD, "{\"start\":1,\"end\":4,\"kept\":7}", ba, 3, 2, &rep);
    sp_reply_clear(&rep);
    ck_assert_double_le(sp_max_abs_diff(g2, g0, N), 1e-6);
    /* a kept entry of another span does not match */
    free(call_ok(r, SP_MSG_FORWARD, "{\"start\":1,\"end\":4,\"keep\":8}", fa, 2, 1, &rep));
    sp_reply_clear(&rep);
    sp_tensor_src b2[2] = {t3(x, B, T), t3(gout, B, T)};
    float *g3 = call_ok(r, SP_MSG_BACKWARD, "{\"start\":2,\"end\":4,\"kept\":8}", b2, 2, 1, &rep);
    sp_reply_clear(&rep);
    ck_assert(isfinite(g3[0]));
    free(x), free(gout), free(pr), free(y0), free(g0), free(gp0), free(y1), free(g1), free(gp1), free(g2), free(g3);
    sp_remote_close(r);
    sp_server_stop(s); /* the unused entry 8 is freed with the server (ASan checks) */
}

START_TEST(t_keep_kept) { keep_kept(0); }
END_TEST

START_TEST(t_keep_kept_inputs_only) { keep_kept((size_t)3 * 2 * 5 * H * 4 * 4); /* 4x the inputs */ }
END_TEST

/* kept_plan, what a FORWARD asking to keep keeps: nothing without a cap; the activations where they take at most a
 * quarter of it, on a GPU server only where the device budget has room for them, else the inputs alone; each at its
 * boundary (a GPU server's own runs are test_server_gpu's t_kept_on_device). */
START_TEST(t_kept_plan)
{
    size_t cap = 4000;
    ck_assert_int_eq(kept_plan(0, 0, 1, 0), KEEP_NONE);
    ck_assert_int_eq(kept_plan(0, 1, 1, cap), KEEP_NONE);
    ck_assert_int_eq(kept_plan(cap, 0, 1000, 0), KEEP_ACTS);
    ck_assert_int_eq(kept_plan(cap, 0, 1001, 0), KEEP_INPUTS);
    ck_assert_int_eq(kept_plan(cap, 1, 1000, 1000), KEEP_DEVICE);
    ck_assert_int_eq(kept_plan(cap, 1, 1000, 999), KEEP_INPUTS); /* the device budget's room */
    ck_assert_int_eq(kept_plan(cap, 1, 1001, 1u << 30), KEEP_INPUTS); /* over the cap's quarter */
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* inference sessions */

static uint64_t open_session(sp_remote *r, int a, int b, int L, int B)
{
    char meta[128];
    sp_open_req q = {.start = a, .end = b, .max_length = L, .batch = B};
    ck_assert_int_eq(sp_open_req_encode(&q, meta, sizeof meta, NULL), SP_OK);
    sp_reply rep;
    call_ok(r, SP_MSG_INFERENCE_OPEN, meta, NULL, 0, 0, &rep);
    sp_open_reply got = {0};
    ck_assert_int_eq(sp_open_reply_decode(&rep.msg, &got, NULL), SP_OK);
    ck_assert(got.session > 0 && got.max_length == L);
    sp_reply_clear(&rep);
    return got.session;
}

/* {"session": id}: the metadata of an INFERENCE_CLOSE, and of an INFERENCE_STEP that rolls nothing back. */
static const char *session_meta(char *meta, size_t cap, uint64_t id)
{
    sp_close_req q = {.session = id};
    ck_assert_int_eq(sp_close_req_encode(&q, meta, cap, NULL), SP_OK);
    return meta;
}

/* One step of T positions: x [B, T, H] in, output written to y. Extra tensors (hypo_ids) optional. */
static void step(sp_remote *r, uint64_t id, const float *x, int B, int T, float *y, int from, const sp_tensor_src *extra)
{
    char meta[128];
    sp_step_req q = {.session = id, .start_from_position = from, .reply_encoding = -1};
    ck_assert_int_eq(sp_step_req_encode(&q, meta, sizeof meta, NULL), SP_OK);
    sp_tensor_src a[2] = {t3(x, B, T)};
    if (extra)
        a[1] = *extra;
    sp_reply rep;
    float *out = call_ok(r, SP_MSG_INFERENCE_STEP, meta, a, extra ? 2 : 1, 1, &rep);
    memcpy(y, out, (size_t)B * T * H * 4);
    free(out);
    sp_reply_clear(&rep);
}

/* Rows [t0, t0+T) of every sequence of x [B, Tall, H]. */
static void slice(float *dst, const float *x, int B, int Tall, int t0, int T)
{
    for (int b = 0; b < B; b++)
        memcpy(dst + (size_t)b * T * H, x + ((size_t)b * Tall + t0) * H, (size_t)T * H * 4);
}

/* A session on [a, b) of L positions, batch B: its id, and its push token into *token. */
static uint64_t open_pushable(sp_remote *r, int a, int b, int L, int B, uint64_t *token)
{
    char meta[128];
    sp_open_req q = {.start = a, .end = b, .max_length = L, .batch = B};
    ck_assert_int_eq(sp_open_req_encode(&q, meta, sizeof meta, NULL), SP_OK);
    sp_reply rep;
    call_ok(r, SP_MSG_INFERENCE_OPEN, meta, NULL, 0, 0, &rep);
    sp_open_reply got = {0};
    ck_assert_int_eq(sp_open_reply_decode(&rep.msg, &got, NULL), SP_OK);
    sp_reply_clear(&rep);
    *token = got.push_token;
    return got.session;
}

/* An awaiting step on its own thread (its call blocks until the push comes). */
typedef struct await_call {
    sp_remote *r;
    sp_msg_type type; /* 0: INFERENCE_STEP */
    char meta[512];
    sp_status st;
    char code[32]; /* the ERROR's code, if it failed with one */
    float out[2 * 3 * H];
    int n;
    pthread_t th;
} await_call;

static void *await_main(void *arg)
{
    await_call *a = arg;
    sp_reply rep;
    a->st = sp_remote_call(a->r, a->type ? a->type : SP_MSG_INFERENCE_STEP, a->meta, NULL, 0, &rep, TMO, NULL);
    a->n = a->st ? 0 : (int)rep.msg.t[0].numel;
    snprintf(a->code, sizeof a->code, "%s", a->st && sp_reply_error_code(&rep) ? sp_reply_error_code(&rep) : "");
    if (!a->st && a->n <= (int)(sizeof a->out / sizeof *a->out))
        sp_tensor_to_f32(&rep.msg.t[0], a->out, NULL);
    sp_reply_clear(&rep);
    return NULL;
}

/* Server-to-server push: server 1 pushes each step's output into server 2's session (the client asks, with the
 * session's token), server 2 answers the step that awaited it, whichever came first: the same outputs as two plain
 * steps. A push with a wrong token is refused (forbidden), one into no session too, and neither touches the
 * session; a token is random per session. */
START_TEST(t_push)
{
    sp_server *s1 = start_server(0, 2, 0, 0), *s2 = start_server(2, 4, 0, 0);
    sp_remote *r1 = connect_to(s1), *r2 = connect_to(s2);
    int B = 2, T = 3;
    size_t N = (size_t)B * T * H;
    sp_rng g;
    sp_rng_seed(&g, 11);
    float x[2 * 3 * H], mid[2 * 3 * H], want[2 * 3 * H];
    sp_rng_fill_normal(&g, x, (long)N, 1.0f);
    uint64_t t1, t2, tk3, i1 = open_pushable(r1, 0, 2, 8, B, &t1), i2 = open_pushable(r2, 2, 4, 8, B, &t2);
    uint64_t i3 = open_pushable(r1, 0, 2, 8, B, &tk3), i4 = open_pushable(r2, 2, 4, 8, B, &t1);
    ck_assert(t2 && tk3 && t1 && t2 != t1);
    step(r1, i3, x, B, T, mid, 0, NULL); /* the plain steps, in sessions of their own */
    step(r2, i4, mid, B, T, want, 0, NULL);
    for (int k = 0; k < 2; k++) { /* k 0: the push comes first (it waits); 1: the awaiting step first */
        sp_step_req q = {.session = i1, .start_from_position = 0, .reply_encoding = -1, .step = 1 + (uint64_t)k,
                         .push_host = "127.0.0.1", .push_port = sp_server_port(s2), .push_session = i2,
                         .push_token = t2};
        sp_step_req w = {.session = i2, .start_from_position = 0, .reply_encoding = -1, .step = 1 + (uint64_t)k,
                         .await = 1};
        await_call a = {.r = r2};
        ck_assert_int_eq(sp_step_req_encode(&w, a.meta, sizeof a.meta, NULL), SP_OK);
        if (k == 1) {
            ck_assert_int_eq(pthread_create(&a.th, NULL, await_main, &a), 0);
            nanosleep(&(struct timespec){0, 100 * 1000000L}, NULL);
        }
        char meta[512];
        ck_assert_int_eq(sp_step_req_encode(&q, meta, sizeof meta, NULL), SP_OK);
        sp_tensor_src tx = t3(x, B, T);
        sp_reply rep;
        free(call_ok(r1, SP_MSG_INFERENCE_STEP, meta, &tx, 1, 1, &rep));
        sp_step_reply sr = {0};
        ck_assert_int_eq(sp_step_reply_decode(&rep.msg, &sr, NULL), SP_OK);
        ck_assert_msg(sr.pushed == 1 && sr.position == T, "pushed %d, position %d", sr.pushed, sr.position);
        sp_reply_clear(&rep);
        if (k == 0)
            await_main(&a);
        else
            pthread_join(a.th, NULL);
        ck_assert_msg(a.st == SP_OK && a.n == (int)N, "the awaiting step: status %d, %d values", a.st, a.n);
        ck_assert_double_le(sp_max_abs_diff(a.out, want, N), 1e-5);
    }
    /* refused: a wrong token, a session that does not exist */
    char meta[128];
    sp_push_req p = {.session = i2, .token = t2 ^ 1, .step = 9};
    ck_assert_int_eq(sp_push_req_encode(&p, meta, sizeof meta, NULL), SP_OK);
    sp_tensor_src tx = t3(mid, B, T);
    call_err(r1, SP_MSG_INFERENCE_PUSH, meta, &tx, 1, "forbidden");
    p = (sp_push_req){.session = 999, .token = t2, .step = 9};
    ck_assert_int_eq(sp_push_req_encode(&p, meta, sizeof meta, NULL), SP_OK);
    call_err(r1, SP_MSG_INFERENCE_PUSH, meta, &tx, 1, "no_session");
    still_serving(s2, r2);
    sp_remote_close(r1);
    sp_remote_close(r2);
    sp_server_stop(s1);
    sp_server_stop(s2);
}
END_TEST

/* What a test waits for in server s's held pushed inputs and awaiting requests: (change) its bytes are no longer
 * `before`; else they are back to none, at least `expired` dropped at the step timeout so far. */
typedef struct held_wait {
    sp_server *s;
    int change;
    size_t before;
    uint64_t expired;
} held_wait;

static int held_reached(void *u)
{
    held_wait *w = u;
    sp_server_awaits aw;
    sp_server_awaits_get(w->s, &aw);
    return w->change ? aw.held != w->before : aw.expired >= w->expired && aw.held == 0;
}

/* An awaiting FORWARD of blocks 2:4 under (id, token) on its own thread, to server s through r, started and met
 * there: its call blocks until its input is pushed; s's held bytes changed (it parked, or took an input held). */
static void await_forward(await_call *a, sp_server *s, sp_remote *r, uint64_t id, uint64_t token)
{
    *a = (await_call){.r = r, .type = SP_MSG_FORWARD};
    sp_forward_req w = {.start = 2, .end = 4, .reply_encoding = -1, .await = id, .await_token = token};
    ck_assert_int_eq(sp_forward_req_encode(&w, a->meta, sizeof a->meta, NULL), SP_OK);
    sp_server_awaits aw;
    sp_server_awaits_get(s, &aw);
    held_wait c = {.s = s, .change = 1, .before = aw.held};
    ck_assert_int_eq(pthread_create(&a->th, NULL, await_main, a), 0);
    ck_assert_msg(sp_test_wait_for(held_reached, &c, 20), "the awaiting FORWARD %llu did not reach the server",
                  (unsigned long long)id);
}

/* SPAN_PUSH of x [B, T, H] for the request awaiting (id, token) through r: "" acknowledged, else the ERROR code
 * expected. */
static void span_push(sp_remote *r, uint64_t id, uint64_t token, const float *x, int B, int T, const char *code)
{
    char meta[128];
    sp_span_push_req p = {.id = id, .token = token};
    ck_assert_int_eq(sp_span_push_req_encode(&p, meta, sizeof meta, NULL), SP_OK);
    sp_tensor_src tx = t3(x, B, T);
    if (*code)
        call_err(r, SP_MSG_SPAN_PUSH, meta, &tx, 1, code);
    else
    {
        sp_reply rep;
        free(call_ok(r, SP_MSG_SPAN_PUSH, meta, &tx, 1, 0, &rep));
        sp_reply_clear(&rep);
    }
}

/* Training's passes pushed (SPAN_PUSH): server 1's FORWARD pushes its output to server 2's FORWARD that awaits it
 * (an id and the client's token), the reply saying so: the same output as two plain FORWARDs, whether the push or
 * the request came first. Refused: a push under another token than that of the request awaiting its id (forbidden),
 * a second input for an id (bad_request); an input pushed early under another token is not used (the request waits
 * for its own). */
START_TEST(t_span_push)
{
    sp_server *s1 = start_server(0, 2, 0, 0), *s2 = start_server(2, 4, 0, 0);
    sp_remote *r1 = connect_to(s1), *r2 = connect_to(s2), *r3 = connect_to(s2);
    int B = 2, T = 3;
    size_t N = (size_t)B * T * H;
    sp_rng g;
    sp_rng_seed(&g, 12);
    float x[2 * 3 * H];
    sp_rng_fill_normal(&g, x, (long)N, 1.0f);
    char meta[512];
    sp_forward_req f = {.start = 0, .end = 2, .reply_encoding = -1};
    ck_assert_int_eq(sp_forward_req_encode(&f, meta, sizeof meta, NULL), SP_OK);
    sp_tensor_src tx = t3(x, B, T);
    sp_reply rep;
    float *mid = call_ok(r1, SP_MSG_FORWARD, meta, &tx, 1, 1, &rep);
    sp_reply_clear(&rep);
    f = (sp_forward_req){.start = 2, .end = 4, .reply_encoding = -1};
    ck_assert_int_eq(sp_forward_req_encode(&f, meta, sizeof meta, NULL), SP_OK);
    sp_tensor_src tm = t3(mid, B, T);
    float *want = call_ok(r2, SP_MSG_FORWARD, meta, &tm, 1, 1, &rep);
    sp_reply_clear(&rep);
    for (int k = 0; k < 2; k++) { /* k 0: the push comes first (it waits); 1: the awaiting request first */
        uint64_t id = 10 + (uint64_t)k, token = 0xabcdef0123456789ull + (uint64_t)k;
        sp_forward_req q = {.start = 0, .end = 2, .reply_encoding = -1, .push_host = "127.0.0.1",
                            .push_port = sp_server_port(s2), .push_id = id, .push_token = token};
        await_call a;
        if (k == 1)
            await_forward(&a, s2, r2, id, token);
        ck_assert_int_eq(sp_forward_req_encode(&q, meta, sizeof meta, NULL), SP_OK);
        free(call_ok(r1, SP_MSG_FORWARD, meta, &tx, 1, 1, &rep));
        sp_forward_reply fr = {0};
        ck_assert_int_eq(sp_forward_reply_decode(&rep.msg, &fr, NULL), SP_OK);
        ck_assert_msg(fr.pushed == 1, "the FORWARD's push was not acknowledged");
        sp_reply_clear(&rep);
        if (k == 0)
            await_forward(&a, s2, r2, id, token);
        pthread_join(a.th, NULL);
        ck_assert_msg(a.st == SP_OK && a.n == (int)N, "the awaiting FORWARD: status %d, %d values", a.st, a.n);
        ck_assert_msg(!memcmp(a.out, want, N * sizeof(float)), "pushed FORWARD differs from the plain one");
    }
    await_call a;
    await_forward(&a, s2, r2, 20, 7);
    span_push(r3, 20, 8, mid, B, T, "forbidden");
    span_push(r3, 20, 7, mid, B, T, "");
    pthread_join(a.th, NULL);
    ck_assert_msg(a.st == SP_OK && !memcmp(a.out, want, N * sizeof(float)), "the awaiting FORWARD: status %d", a.st);
    span_push(r3, 21, 7, mid, B, T, "");
    span_push(r3, 21, 7, mid, B, T, "bad_request");
    span_push(r3, 22, 1, x, B, T, ""); /* early, under another token: not the request's */
    await_forward(&a, s2, r2, 22, 2);
    span_push(r3, 22, 2, mid, B, T, "");
    pthread_join(a.th, NULL);
    ck_assert_msg(a.st == SP_OK && !memcmp(a.out, want, N * sizeof(float)), "the awaiting FORWARD: status %d", a.st);
    uint64_t in, out;
    sp_server_pushes(s2, &in, &out);
    ck_assert_int_eq((int)in, 6); /* 2 from server 1, 4 acknowledged here */
    free(mid);
    free(want);
    still_serving(s2, r2);
    sp_remote_close(r1);
    sp_remote_close(r2);
    sp_remote_close(r3);
    sp_server_stop(s1);
    sp_server_stop(s2);
}
END_TEST

/* Training's pushed inputs held for their requests, and requests parked for their inputs, are bounded in bytes
 * (await_bytes; by default half the kept budget + 64 MiB) and in time (the step timeout): a push over the cap is
 * refused, "busy", saying the bytes held and the cap, and counted; an input nobody claims and a request whose input
 * never comes are dropped at the step timeout (the request answered "timeout"), counted, their bytes free again: the
 * push refused before is taken. */
START_TEST(t_span_push_held)
{
    sp_server_opts o;
    gqa_opts(&o, 2, 4);
    o.await_bytes = 48 << 10;
    o.step_timeout_s = 1;
    sp_server *s = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_server_start(&s, &o, &err) == SP_OK, "%s", err.msg);
    sp_remote *r = connect_to(s), *r2 = connect_to(s);
    int B = 4, T = 32; /* 32 KiB a push */
    float *x = calloc((size_t)B * T * H, sizeof(float));
    span_push(r, 1, 11, x, B, T, "");
    await_call a;
    await_forward(&a, s, r2, 2, 12);
    sp_server_awaits aw;
    sp_server_awaits_get(s, &aw);
    ck_assert_uint_eq(aw.cap, 48 << 10);
    ck_assert_uint_gt(aw.held, 32 << 10);
    ck_assert_uint_eq(aw.refused, 0);
    char meta[128];
    sp_span_push_req p = {.id = 3, .token = 13};
    ck_assert_int_eq(sp_span_push_req_encode(&p, meta, sizeof meta, NULL), SP_OK);
    sp_tensor_src tx = t3(x, B, T);
    sp_reply rep;
    ck_assert_int_ne(sp_remote_call(r, SP_MSG_SPAN_PUSH, meta, &tx, 1, &rep, TMO, &err), SP_OK);
    ck_assert_str_eq(sp_reply_error_code(&rep), "busy");
    printf("refused at the cap: %s\n", err.msg);
    ck_assert_msg(strstr(err.msg, "would go over its cap of 49152"), "%s", err.msg);
    sp_reply_clear(&rep);
    sp_server_awaits_get(s, &aw);
    ck_assert_uint_eq(aw.refused, 1);
    held_wait w = {.s = s, .expired = 2}; /* the input and the parked request */
    ck_assert_msg(sp_test_wait_for(held_reached, &w, 20), "nothing dropped at the step timeout");
    pthread_join(a.th, NULL);
    ck_assert_msg(a.st != SP_OK && !strcmp(a.code, "timeout"), "the awaiting FORWARD: status %d, code '%s'", a.st,
                  a.code);
    span_push(r, 3, 13, x, B, T, ""); /* room again */
    sp_server_awaits_get(s, &aw);
    ck_assert_uint_eq(aw.expired, 2);
    ck_assert_uint_gt(aw.held, 32 << 10);
    free(x);
    still_serving(s, r);
    sp_remote_close(r);
    sp_remote_close(r2);
    sp_server_stop(s);
}
END_TEST

START_TEST(t_sessions_two_servers)
{
    sp_server *s1 = start_server(0, 2, 0, 0), *s2 = start_server(2, 4, 0, 0);
    sp_remote *r1 = connect_to(s1), *r2 = connect_to(s2);
    int B = 2, T = 8;
    size_t N = (size_t)B * T * H;
    sp_rng g;
    sp_rng_seed(&g, 9);
    float *x = malloc(N * 4), *full = malloc(N * 4), *dec = malloc(N * 4), *a = malloc(N * 4), *b = malloc(N * 4);
    sp_rng_fill_normal(&g, x, (long)N, 1.0f);
    /* one FORWARD over the whole sequence through both servers */
    sp_reply rep;
    sp_tensor_src tx = t3(x, B, T);
    float *mid = call_ok(r1, SP_MSG_FORWARD, "{\"start\":0,\"end\":2}", &tx, 1, 1, &rep);
    sp_reply_clear(&rep);
    tx = t3(mid, B, T);
    float *out = call_ok(r2, SP_MSG_FORWARD, "{\"start\":2,\"end\":4}", &tx, 1, 1, &rep);
    memcpy(full, out, N * 4);
    sp_reply_clear(&rep);
    free(mid), free(out);
    /* the same positions decoded through sessions: a prefill of 3, then one position at a time */
    uint64_t i1 = open_session(r1, 0, 2, 16, B), i2 = open_session(r2, 2, 4, 16, B);
    ck_assert_int_eq(sp_server_sessions(s1), 1);
    int pos = 0;
    while (pos < T) {
        int t = pos == 0 ? 3 : 1;
        slice(a, x, B, T, pos, t);
        step(r1, i1, a, B, t, b, -1, NULL);
        step(r2, i2, b, B, t, a, -1, NULL);
        for (int k = 0; k < B; k++)
            memcpy(dec + ((size_t)k * T + pos) * H, a + (size_t)k * t * H, (size_t)t * H * 4);
        pos += t;
    }
    ck_assert_double_le(sp_max_abs_diff(dec, full, N), 1e-4);
    /* rollback: replay positions 5..7 with start_from_position 5 gives the same outputs */
    slice(a, x, B, T, 5, 3);
    step(r1, i1, a, B, 3, b, 5, NULL);
    step(r2, i2, b, B, 3, a, 5, NULL);
    slice(b, full, B, T, 5, 3);
    ck_assert_double_le(sp_max_abs_diff(a, b, (size_t)B * 3 * H), 1e-4);
    /* past max_length is refused, and so is a batch change */
    float *big = calloc((size_t)B * 9 * H, 4);
    sp_tensor_src tb = t3(big, B, 9);
    char meta[64];
    session_meta(meta, sizeof meta, i1);
    call_err(r1, SP_MSG_INFERENCE_STEP, meta, &tb, 1, "max_length");
    tb = t3(big, 1, 1);
    call_err(r1, SP_MSG_INFERENCE_STEP, meta, &tb, 1, "shape");
    /* close; stepping a closed session fails */
    call_ok(r1, SP_MSG_INFERENCE_CLOSE, meta, NULL, 0, 0, &rep);
    sp_reply_clear(&rep);
    ck_assert_int_eq(sp_server_sessions(s1), 0);
    tb = t3(big, B, 1);
    call_err(r1, SP_MSG_INFERENCE_STEP, meta, &tb, 1, "no_session");
    free(x), free(full), free(dec), free(a), free(b), free(big);
    sp_remote_close(r1), sp_remote_close(r2);
    sp_server_stop(s1), sp_server_stop(s2);
}
END_TEST

/* hypo_ids: after reordering the cache batch, row b continues the sequence of old row hypo[b]. */
START_TEST(t_hypo_ids)
{
    sp_server *s = start_server(0, 4, 0, 0);
    sp_remote *r = connect_to(s);
    int B = 3, T = 4;
    size_t N = (size_t)B * T * H;
    sp_rng g;
    sp_rng_seed(&g, 5);
    float *x = malloc(N * 4), *y = malloc(N * 4), *nx = malloc((size_t)B * H * 4), *got = malloc((size_t)B * H * 4);
    sp_rng_fill_normal(&g, x, (long)N, 1.0f);
    sp_rng_fill_normal(&g, nx, B * H, 1.0f);
    uint64_t id = open_session(r, 0, 4, 8, B);
    step(r, id, x, B, T, y, -1, NULL);
    int64_t hypo[3] = {2, 2, 0};
    sp_tensor_src th = {.enc = SP_ENC_I64, .rank = 1, .shape = {3}, .raw = hypo};
    step(r, id, nx, B, 1, got, -1, &th);
    /* reference: a fresh session fed the reordered prefixes */
    float *x2 = malloc((size_t)B * (T + 1) * H * 4), *y2 = malloc((size_t)B * (T + 1) * H * 4);
    for (int b = 0; b < B; b++) {
        memcpy(x2 + (size_t)b * (T + 1) * H, x + (size_t)hypo[b] * T * H, (size_t)T * H * 4);
        memcpy(x2 + ((size_t)b * (T + 1) + T) * H, nx + (size_t)b * H, H * 4);
    }
    uint64_t id2 = open_session(r, 0, 4, 8, B);
    step(r, id2, x2, B, T + 1, y2, -1, NULL);
    for (int b = 0; b < B; b++)
        ck_assert_double_le(sp_max_abs_diff(got + (size_t)b * H, y2 + ((size_t)b * (T + 1) + T) * H, H), 1e-4);
    int64_t badh[3] = {0, 3, 1};
    th.raw = badh;
    sp_tensor_src a[2] = {t3(nx, B, 1), th};
    char meta[64];
    call_err(r, SP_MSG_INFERENCE_STEP, session_meta(meta, sizeof meta, id), a, 2, "bad_request");
    free(x), free(y), free(nx), free(got), free(x2), free(y2);
    sp_remote_close(r);
    sp_server_stop(s);
}
END_TEST

/* Two clients decode at once on one server; each gets what it gets alone. */
typedef struct client_job {
    sp_server *s;
    int seed;
    double err;
} client_job;

static void *client_thread(void *p)
{
    client_job *j = p;
    sp_remote *r = NULL;
    sp_err err = {0};
    if (sp_remote_connect(&r, "127.0.0.1", sp_server_port(j->s), 0, TMO, &err)) {
        j->err = 1e9;
        return NULL;
    }
    int B = 1, T = 6;
    float x[6 * H], y[6 * H], full[6 * H];
    sp_rng g;
    sp_rng_seed(&g, (uint64_t)j->seed);
    sp_rng_fill_normal(&g, x, T * H, 1.0f);
    sp_reply rep;
    sp_tensor_src tx = t3(x, B, T);
    j->err = 1e9;
    if (sp_remote_call(r, SP_MSG_FORWARD, "{\"start\":0,\"end\":4}", &tx, 1, &rep, TMO, &err) == SP_OK &&
        sp_tensor_to_f32(&rep.msg.t[0], full, &err) == SP_OK) {
        sp_reply_clear(&rep);
        if (sp_remote_call(r, SP_MSG_INFERENCE_OPEN, "{\"start\":0,\"end\":4,\"max_length\":6,\"batch\":1}", NULL, 0,
                           &rep, TMO, &err) == SP_OK) {
            sp_open_reply a = {0};
            int ok = sp_open_reply_decode(&rep.msg, &a, &err) == SP_OK;
            sp_reply_clear(&rep);
            for (int t = 0; ok && t < T; t++) {
                char meta[64];
                sp_step_req q = {.session = a.session, .start_from_position = -1, .reply_encoding = -1};
                sp_tensor_src ts = t3(x + t * H, 1, 1);
                ok = sp_step_req_encode(&q, meta, sizeof meta, &err) == SP_OK &&
                     sp_remote_call(r, SP_MSG_INFERENCE_STEP, meta, &ts, 1, &rep, TMO, &err) == SP_OK &&
                     sp_tensor_to_f32(&rep.msg.t[0], y + t * H, &err) == SP_OK;
                sp_reply_clear(&rep);
            }
            if (ok)
                j->err = sp_max_abs_diff(y, full, (size_t)T * H);
        }
    } else {
        sp_reply_clear(&rep);
    }
    sp_remote_close(r);
    return NULL;
}

START_TEST(t_two_clients)
{
    sp_server *s = start_server(0, 4, 0, 0);
    client_job j[2] = {{s, 1, 0}, {s, 2, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, client_thread, &j[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    ck_assert_double_le(j[0].err, 1e-4);
    ck_assert_double_le(j[1].err, 1e-4);
    /* both connections closed: their sessions are freed */
    for (int k = 0; k < 100 && sp_server_sessions(s); k++)
        usleep(20000);
    ck_assert_int_eq(sp_server_sessions(s), 0);
    sp_server_stop(s);
}
END_TEST

/* Sessions decoding at once on one server, their steps batched: each gets the bits it gets alone. A job opens a
 * session (rows B) once `after` steps of the others are done (joining mid-way), prefills, steps `steps` times and
 * leaves (a close, or its connection dropped), its outputs kept. Three jobs share one connection (their calls in
 * flight at once, as a client's concurrent sessions are). */
typedef struct batch_job {
    sp_server *s;
    sp_remote *shared; /* a connection other jobs use at once (NULL: its own) */
    int seed, B, prefill, steps, after, drop;
    int *done; /* steps done by all jobs (atomic) */
    float *out; /* [B, prefill + steps, H] in step order */
    int ok;
} batch_job;

static void *batch_client(void *p)
{
    batch_job *j = p;
    int B = j->B, L = j->prefill + j->steps;
    while (__atomic_load_n(j->done, __ATOMIC_SEQ_CST) < j->after)
        usleep(1000);
    sp_remote *r = j->shared;
    sp_err err = {0};
    if (!r && sp_remote_connect(&r, "127.0.0.1", sp_server_port(j->s), 0, TMO, &err))
        return NULL;
    float *x = malloc((size_t)B * L * H * 4);
    sp_rng g;
    sp_rng_seed(&g, (uint64_t)j->seed);
    sp_rng_fill_normal(&g, x, (long)B * L * H, 1.0f);
    char meta[128];
    sp_open_req oq = {.start = 0, .end = 4, .max_length = L, .batch = B};
    sp_reply rep;
    sp_open_reply a = {0};
    int ok = sp_open_req_encode(&oq, meta, sizeof meta, &err) == SP_OK &&
             sp_remote_call(r, SP_MSG_INFERENCE_OPEN, meta, NULL, 0, &rep, TMO, &err) == SP_OK &&
             sp_open_reply_decode(&rep.msg, &a, &err) == SP_OK;
    sp_reply_clear(&rep);
    float *y = j->out;
    for (int pos = 0; ok && pos < L;) {
        int T = pos ? 1 : j->prefill;
        float *in = malloc((size_t)B * T * H * 4);
        slice(in, x, B, L, pos, T);
        sp_step_req q = {.session = a.session, .start_from_position = -1, .reply_encoding = -1};
        sp_tensor_src ts = t3(in, B, T);
        ok = sp_step_req_encode(&q, meta, sizeof meta, &err) == SP_OK &&
             sp_remote_call(r, SP_MSG_INFERENCE_STEP, meta, &ts, 1, &rep, TMO, &err) == SP_OK &&
             sp_tensor_to_f32(&rep.msg.t[0], y, &err) == SP_OK;
        sp_reply_clear(&rep);
        free(in);
        y += (size_t)B * T * H;
        pos += T;
        __atomic_add_fetch(j->done, 1, __ATOMIC_SEQ_CST);
    }
    if (ok && !j->drop) {
        sp_close_req cq = {.session = a.session};
        ok = sp_close_req_encode(&cq, meta, sizeof meta, &err) == SP_OK &&
             sp_remote_call(r, SP_MSG_INFERENCE_CLOSE, meta, NULL, 0, &rep, TMO, &err) == SP_OK;
        sp_reply_clear(&rep);
    }
    j->ok = ok;
    if (!j->shared)
        sp_remote_close(r);
    free(x);
    return NULL;
}

/* A server of blocks 0:4 whose steps all go through the workers' queue (where they are batched), its answers
 * SEPAL_SERVER_FAULT=slow (ms) late so that the steps that come meanwhile queue up; max_batch_tokens 0: the
 * default; max_queue_wait: its --max-queue-wait (0: none); no_batch: --no-batch (each step alone). */
static sp_server *start_batching_as(int dtype, const char *slow, int max_batch_tokens, double max_queue_wait,
                                    int no_batch)
{
    setenv("SEPAL_SERVER_FAULT", slow, 1);
    sp_server_opts o;
    gqa_opts(&o, 0, 4);
    o.dtype = dtype;
    o.workers_only = 1;
    o.max_queue_wait_s = max_queue_wait;
    o.no_batch = no_batch;
    if (max_batch_tokens) {
        o.max_batch_tokens = max_batch_tokens;
        o.cache_tokens = 31 * 64;
    }
    sp_server *s = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_server_start(&s, &o, &err) == SP_OK, "%s", err.msg);
    return s;
}

static sp_server *start_batching(const char *slow, int max_batch_tokens, double max_queue_wait, int no_batch)
{
    return start_batching_as(SP_W_F32, slow, max_batch_tokens, max_queue_wait, no_batch);
}

/* Sessions stepping at once, in f32, int8 and nf4 weights (_i: 0, 1, 2): each gets the bits it gets alone on a
 * --no-batch server. In f32 the short prefills (up to 8 rows) joined passes and the longer ones ran apart; in int8
 * and nf4 (products in integers at every row count) prefills of up to 64 rows joined them: 21, 10, 33 and 12 rows,
 * with decode steps and one another (the most rows in a pass at least the longest's), and one of 70 ran apart. */
START_TEST(t_batched_sessions_as_alone)
{
    int dtypes[] = {SP_W_F32, SP_W_Q8, SP_W_NF4}, dt = dtypes[_i], any = dt != SP_W_F32;
    sp_server *s = start_batching_as(dt, "slow:4", 0, 0, 0), *unbatched = start_batching_as(dt, "slow:4", 0, 0, 1);
    enum { NJ = 7 };
    int done = 0;
    batch_job j[NJ] = {{.seed = 1, .B = 1, .prefill = any ? 21 : 3, .steps = 14},
                       {.seed = 2, .B = 2, .prefill = 5, .steps = 9, .drop = 1},
                       {.seed = 3, .B = 1, .prefill = 1, .steps = 6},
                       {.seed = 4, .B = 1, .prefill = any ? 33 : 7, .steps = 10, .after = 8},
                       {.seed = 5, .B = 3, .prefill = 2, .steps = 8, .after = 15},
                       {.seed = 6, .B = 1, .prefill = any ? 12 : 4, .steps = 5, .after = 30, .drop = 1},
                       {.seed = 7, .B = 1, .prefill = any ? 70 : 9, .steps = 4, .after = 10}};
    float *together[NJ];
    sp_remote *shared = connect_to(s);
    j[0].shared = j[2].shared = j[3].shared = shared;
    for (int pass = 0; pass < 2; pass++) { /* all at once, then each alone on a --no-batch server */
        pthread_t th[NJ];
        done = 1000 * (pass == 1);
        for (int i = 0; i < NJ; i++) {
            size_t n = (size_t)j[i].B * (j[i].prefill + j[i].steps) * H;
            if (pass == 1)
                together[i] = j[i].out, j[i].shared = NULL;
            j[i].s = pass ? unbatched : s, j[i].done = &done, j[i].ok = 0, j[i].out = calloc(n, 4);
            pthread_create(&th[i], NULL, batch_client, &j[i]);
            if (pass == 1)
                pthread_join(th[i], NULL);
        }
        for (int i = 0; pass == 0 && i < NJ; i++)
            pthread_join(th[i], NULL);
        for (int i = 0; i < NJ; i++)
            ck_assert_msg(j[i].ok, "job %d (pass %d) failed", i, pass);
        sp_server_batch_stats bs;
        sp_server_batch_stats_get(s, &bs);
        if (pass == 0) /* the steps did meet in passes of several sessions; the prefills went through them */
            ck_assert_msg(bs.peak >= (any ? 33u : 3u) && bs.prefills >= (any ? 5u : 4u) &&
                              bs.long_prefills == (any ? 4u : 0u),
                          "%s: %llu passes, %llu rows, the most %llu; %llu prefills (%llu long)", sp_wtype_name(dt),
                          (unsigned long long)bs.batches, (unsigned long long)bs.rows, (unsigned long long)bs.peak,
                          (unsigned long long)bs.prefills, (unsigned long long)bs.long_prefills);
    }
    for (int i = 0; i < NJ; i++) {
        size_t n = (size_t)j[i].B * (j[i].prefill + j[i].steps) * H;
        ck_assert_msg(!memcmp(together[i], j[i].out, n * 4), "%s job %d: its outputs in a batch differ from alone",
                      sp_wtype_name(dt), i);
        free(together[i]), free(j[i].out);
    }
    sp_remote_close(shared);
    for (int k = 0; k < 100 && sp_server_sessions(s); k++)
        usleep(20000);
    ck_assert_int_eq(sp_server_sessions(s), 0);
    sp_server_batch_stats bs;
    sp_server_batch_stats_get(unbatched, &bs);
    ck_assert_int_eq(bs.batches, 0);
    sp_server_stop(s);
    sp_server_stop(unbatched);
    unsetenv("SEPAL_SERVER_FAULT");
}
END_TEST

/* A server of blocks 0:4 whose steps all go through the workers' queue, a pass waiting up to wait_s for the steps of
 * the sessions in rhythm with the passes (sp_server_opts.gather_wait_s). */
static sp_server *start_gathering(double wait_s)
{
    sp_server_opts o;
    gqa_opts(&o, 0, 4);
    o.workers_only = 1;
    o.gather_wait_s = wait_s;
    return start_with(&o);
}

/* One session's first step, then (after the go barrier) its steps in rounds: each round after the others' (the
 * round barrier), its step sent delay_us later. */
typedef struct rhythm_job {
    sp_remote *r;
    uint64_t id;
    int rounds, delay_us, ok;
    pthread_barrier_t *go, *round;
} rhythm_job;

static void *rhythm_client(void *p)
{
    rhythm_job *j = p;
    float x[H] = {0};
    char meta[128];
    sp_err err = {0};
    sp_step_req q = {.session = j->id, .start_from_position = -1, .reply_encoding = -1};
    int ok = sp_step_req_encode(&q, meta, sizeof meta, &err) == SP_OK;
    for (int k = -1; k < j->rounds; k++) {
        if (k == 0) /* (twice: the first steps are done; the rounds begin) */
            pthread_barrier_wait(j->go), pthread_barrier_wait(j->go);
        if (k >= 0)
            pthread_barrier_wait(j->round);
        if (k >= 0 && j->delay_us)
            usleep((useconds_t)j->delay_us);
        sp_reply rep;
        sp_tensor_src t = t3(x, 1, 1);
        ok = ok && sp_remote_call(j->r, SP_MSG_INFERENCE_STEP, meta, &t, 1, &rep, TMO, &err) == SP_OK;
        if (ok)
            sp_reply_clear(&rep);
    }
    j->ok = ok;
    return NULL;
}

/* The server's batch counters once rows rows went through its passes (a pass counts just after its answers go). */
static sp_server_batch_stats batch_stats_at(sp_server *s, uint64_t rows)
{
    sp_server_batch_stats bs;
    for (int k = 0; k < 500; k++) {
        sp_server_batch_stats_get(s, &bs);
        if (bs.rows >= rows)
            break;
        usleep(10000);
    }
    return bs;
}

/* A pass waits for the sessions whose steps are due. Four sessions step once, then in rounds, the fourth's step sent
 * 30 ms after the others' every round (a client busy elsewhere, or one whose step missed a pass): every round is one
 * pass of four (the gather waits up to 2 s here; at most 5 ms by default), and none waits in vain. Passes that do
 * not wait for due steps took 18 passes for the 6 rounds (the late step always alone; in 16 sessions on 2 vCPUs,
 * waiting for as many steps as the last pass had, one late step made the later rounds 15 + 1). */
START_TEST(t_batch_waits_for_due_steps)
{
    enum { N = 4, ROUNDS = 6 };
    sp_server *s = start_gathering(2.0);
    rhythm_job j[N];
    pthread_barrier_t go, round;
    pthread_barrier_init(&go, NULL, N + 1);
    pthread_barrier_init(&round, NULL, N);
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        j[i] = (rhythm_job){.r = connect_to(s), .rounds = ROUNDS, .delay_us = i == N - 1 ? 30000 : 0, .go = &go,
                            .round = &round};
        j[i].id = open_session(j[i].r, 0, 4, 1 + ROUNDS, 1);
        pthread_create(&th[i], NULL, rhythm_client, &j[i]);
    }
    pthread_barrier_wait(&go);
    sp_server_batch_stats b0 = batch_stats_at(s, N), b1;
    pthread_barrier_wait(&go);
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        ck_assert_msg(j[i].ok, "session %d failed", i);
        sp_remote_close(j[i].r);
    }
    b1 = batch_stats_at(s, N + N * ROUNDS);
    ck_assert_msg(b1.batches - b0.batches == ROUNDS && b1.rows - b0.rows == N * ROUNDS,
                  "%d rounds of %d sessions took %llu passes (%llu rows)", ROUNDS, N,
                  (unsigned long long)(b1.batches - b0.batches), (unsigned long long)(b1.rows - b0.rows));
    ck_assert_int_eq(b1.waited_out, b0.waited_out);
    pthread_barrier_destroy(&go);
    pthread_barrier_destroy(&round);
    sp_server_stop(s);
}
END_TEST

/* ... and not for a session that stopped stepping: one session steps once and idles (open), another then steps five
 * times: the first of its passes waits its 2 s for the idle one's step (due at once: its turn is not known yet),
 * the later ones do not (a second overdue, it is no longer expected). */
START_TEST(t_batch_not_waiting_for_idle)
{
    sp_server *s = start_gathering(2.0);
    sp_remote *idle = connect_to(s), *r = connect_to(s);
    uint64_t a = open_session(idle, 0, 4, 4, 1), b = open_session(r, 0, 4, 8, 1);
    float x[H] = {0}, y[H];
    step(idle, a, x, 1, 1, y, -1, NULL);
    for (int k = 0; k < 5; k++)
        step(r, b, x, 1, 1, y, -1, NULL);
    sp_server_batch_stats bs = batch_stats_at(s, 6);
    ck_assert_int_eq(bs.batches, 6);
    ck_assert_msg(bs.waited_out <= 1, "%llu passes waited for an idle session", (unsigned long long)bs.waited_out);
    sp_remote_close(idle);
    sp_remote_close(r);
    sp_server_stop(s);
}
END_TEST

/* sp_remote_send then sp_remote_wait: one thread's requests in flight at once on one connection, waited for in
 * another order than sent (the last first: its wait reads the earlier replies and keeps them for their requests,
 * registered when they went out), each its own reply (PINGs echo their metadata); an ERROR reply says its code as a
 * call's does; a request never sent is not waited for. */
START_TEST(t_remote_send_wait)
{
    sp_server *s = start_server(0, 2, 0, 0);
    sp_remote *r = connect_to(s);
    enum { N = 5 };
    sp_reply rep[N];
    uint64_t id[N];
    char meta[N][32];
    sp_err err = {0};
    for (int i = 0; i < N; i++) {
        snprintf(meta[i], sizeof meta[i], "{\"n\":%d}", i);
        sp_msg_type type = i == 2 ? SP_MSG_INFERENCE_STEP : SP_MSG_PING; /* (no session: an ERROR) */
        ck_assert_msg(sp_remote_send(r, type, meta[i], NULL, 0, &rep[i], &id[i], &err) == SP_OK, "%s", err.msg);
        ck_assert(id[i] != 0);
    }
    for (int i = N - 1; i >= 0; i--) {
        sp_status st = sp_remote_wait(r, id[i], TMO, &err);
        if (i == 2) {
            ck_assert_int_ne(st, SP_OK);
            ck_assert_ptr_nonnull(sp_reply_error_code(&rep[i]));
        } else {
            ck_assert_msg(st == SP_OK, "request %d: %s", i, err.msg);
            ck_assert(rep[i].msg.meta_len == strlen(meta[i]) && !memcmp(rep[i].msg.meta_json, meta[i], strlen(meta[i])));
        }
        sp_reply_clear(&rep[i]);
    }
    ck_assert_int_eq(sp_remote_wait(r, id[0], 100, &err), SP_ERR_ARG); /* waited for already */
    still_serving(s, r);
    sp_remote_close(r);
    sp_server_stop(s);
}
END_TEST

/* A server's pushes to more next servers at once than it keeps connections for (8): all ten sent before any is
 * awaited (sp_push_begin, as a pass does), all ten acknowledged (sp_push_finish), none of the connections closed or
 * replaced under a push in flight: each next server took its push (its count), and ten were in flight at once. */
START_TEST(t_push_conns_in_flight)
{
    enum { N = 10 };
    sp_server *s = start_server(0, 2, 0, 0), *next[N];
    sp_remote *rs[N];
    sp_push_pending *p = calloc(N, sizeof *p);
    float x[H];
    for (int i = 0; i < H; i++)
        x[i] = (float)i / H;
    sp_tensor_src t = t3(x, 1, 1);
    for (int round = 0; round < 2; round++) { /* the second: over the connections kept, and one of its own */
        for (int i = 0; i < N; i++) {
            uint64_t token;
            if (!round)
                next[i] = start_server(2, 4, 0, 0);
            rs[i] = connect_to(next[i]); /* (open while the session is: a connection's sessions close with it) */
            sp_step_req q = {.push_host = "127.0.0.1", .push_port = sp_server_port(next[i]), .step = 1};
            q.push_session = open_pushable(rs[i], 2, 4, 2, 1, &token);
            q.push_token = token;
            sp_push_begin(s, &q, &t, &p[i]);
        }
        for (int i = 0; i < N; i++) {
            sp_err err = {0};
            ck_assert_msg(sp_push_finish(s, &p[i], &err) == SP_OK, "round %d, push %d: %s", round, i, err.msg);
            uint64_t in, out;
            sp_server_pushes(next[i], &in, &out);
            ck_assert_int_eq((int)in, round + 1);
            sp_remote_close(rs[i]);
        }
        ck_assert_int_eq((int)sp_server_pushes_in_flight_peak(s), N);
    }
    for (int i = 0; i < N; i++)
        sp_server_stop(next[i]);
    free(p);
    sp_server_stop(s);
}
END_TEST

/* A session over blocks 0:2 of server 1 whose outputs server 1 pushes to its session over 2:4 on the next server (q's
 * push fields): its first step plain (the client takes the output on), then rounds of pushed steps, each after the
 * others' (the round barrier). Each round its step that awaits the input goes to the next server first
 * (sp_remote_send), then the pushed step to server 1, then the awaiting step's reply is waited for; a session whose
 * push is to fail (fails) takes the output on itself instead, as a client does when the reply says pushed 0. */
enum { PUSH_ROUNDS = 3 };
typedef struct push_job {
    sp_remote *r, *r2;          /* to server 1, to the next server */
    uint64_t id, next;          /* the sessions there */
    sp_step_req q;              /* the push fields */
    int fails;
    const float *x;             /* [1 + PUSH_ROUNDS, H]: the steps' inputs */
    float out[(1 + PUSH_ROUNDS) * H], out2[(1 + PUSH_ROUNDS) * H]; /* server 1's outputs, the next server's */
    int pushed[1 + PUSH_ROUNDS], ok;
    char why[160];
    pthread_barrier_t *round;
} push_job;

/* One call of a step to r whose output goes to y [H] (its reply's pushed flag to *pushed); 0 on failure. */
static int push_step(sp_remote *r, const sp_step_req *q, const float *x, float *y, int *pushed)
{
    char meta[512];
    sp_reply rep;
    sp_tensor_src t = t3(x, 1, 1);
    sp_step_reply sr = {0};
    if (sp_step_req_encode(q, meta, sizeof meta, NULL) ||
        sp_remote_call(r, SP_MSG_INFERENCE_STEP, meta, x ? &t : NULL, x ? 1 : 0, &rep, TMO, NULL))
        return 0;
    int ok = rep.msg.n_tensors == 1 && rep.msg.t[0].numel == H && !sp_step_reply_decode(&rep.msg, &sr, NULL) &&
             !sp_tensor_to_f32(&rep.msg.t[0], y, NULL);
    if (pushed)
        *pushed = sr.pushed;
    sp_reply_clear(&rep);
    return ok;
}

static void *push_client(void *p)
{
    push_job *j = p;
    sp_step_req plain = {.session = j->id, .start_from_position = -1, .reply_encoding = -1};
    sp_step_req plain2 = {.session = j->next, .start_from_position = -1, .reply_encoding = -1};
    int ok = push_step(j->r, &plain, j->x, j->out, NULL) && push_step(j->r2, &plain2, j->out, j->out2, NULL);
    for (int k = 1; k <= PUSH_ROUNDS; k++) {
        pthread_barrier_wait(j->round);
        if (!ok)
            continue;
        sp_step_req q = j->q, w = {.session = j->next, .start_from_position = -1, .reply_encoding = -1, .step = k,
                                   .await = 1};
        q.step = (uint64_t)k;
        char meta[256];
        sp_reply rep;
        uint64_t id = 0;
        sp_err err = {0};
        if (!j->fails && (sp_step_req_encode(&w, meta, sizeof meta, NULL) ||
                          sp_remote_send(j->r2, SP_MSG_INFERENCE_STEP, meta, NULL, 0, &rep, &id, &err))) {
            snprintf(j->why, sizeof j->why, "round %d: the awaiting step: %.120s", k, err.msg);
            ok = 0;
            continue;
        }
        ok = push_step(j->r, &q, j->x + k * H, j->out + k * H, &j->pushed[k]);
        if (j->fails) { /* client-driven */
            ok = ok && push_step(j->r2, &plain2, j->out + k * H, j->out2 + k * H, NULL);
        } else {
            sp_status st = sp_remote_wait(j->r2, id, TMO, &err); /* (waited for whatever the push did) */
            ok = ok && !st && rep.msg.n_tensors == 1 && rep.msg.t[0].numel == H &&
                 !sp_tensor_to_f32(&rep.msg.t[0], j->out2 + k * H, NULL);
            sp_reply_clear(&rep);
        }
        if (!ok)
            snprintf(j->why, sizeof j->why, "round %d: %.120s", k, err.msg[0] ? err.msg : "a step failed");
    }
    j->ok = ok;
    return NULL;
}

/* Four sessions over blocks 0:2 whose outputs are pushed to their sessions over 2:4 on another server, in rounds (a
 * pass of four, once the sessions' rhythm is known: see t_batch_waits_for_due_steps): the pass sends all four
 * pushes before it awaits their acknowledgements (the server had four in flight at once), and every session's
 * outputs, server 1's and the next server's, are those of the same steps client-driven on servers that run them
 * alone. The next server batches the pushed steps as server 1 batches its own: every step it ran went through a
 * pass (its batched rows: the four sessions' first steps and every round's), in fewer passes than steps. With `fail`, session 2 pushes under a wrong token (the next
 * server refuses it: ERROR forbidden) and session 3 to a server that stopped: their replies say pushed 0 (the
 * others' still 1; three went out together), and their clients take the outputs on themselves. */
START_TEST(t_batch_pushes_pipelined)
{
    enum { N = 4, R = PUSH_ROUNDS };
    int fail = _i;
    sp_server_opts o;
    gqa_opts(&o, 0, 2);
    o.workers_only = 1;
    o.gather_wait_s = 0.5;
    sp_server *s1 = start_with(&o), *alone = start_server(0, 2, 0, 0);
    gqa_opts(&o, 2, 4);
    o.workers_only = 1;
    sp_server *s2 = start_with(&o), *alone2 = start_server(2, 4, 0, 0);
    sp_server *dead = start_server(2, 4, 0, 0);
    int dead_port = sp_server_port(dead);
    sp_server_stop(dead);
    sp_remote *ra = connect_to(alone), *r2 = connect_to(alone2);
    sp_rng g;
    sp_rng_seed(&g, 21);
    static float x[N][(1 + R) * H], mid[N][(1 + R) * H], want[N][(1 + R) * H];
    for (int i = 0; i < N; i++) { /* the same steps client-driven, each alone */
        sp_rng_fill_normal(&g, x[i], (1 + R) * H, 1.0f);
        uint64_t a = open_session(ra, 0, 2, 1 + R, 1), b = open_session(r2, 2, 4, 1 + R, 1);
        for (int k = 0; k <= R; k++) {
            step(ra, a, x[i] + k * H, 1, 1, mid[i] + k * H, -1, NULL);
            step(r2, b, mid[i] + k * H, 1, 1, want[i] + k * H, -1, NULL);
        }
    }
    static push_job j[N];
    pthread_t th[N];
    pthread_barrier_t round;
    pthread_barrier_init(&round, NULL, N);
    for (int i = 0; i < N; i++) {
        uint64_t token, t1;
        j[i] = (push_job){.r = connect_to(s1), .r2 = connect_to(s2), .x = x[i], .round = &round,
                          .fails = fail && i >= 2};
        j[i].id = open_pushable(j[i].r, 0, 2, 1 + R, 1, &t1);
        j[i].next = open_pushable(j[i].r2, 2, 4, 1 + R, 1, &token);
        j[i].q = (sp_step_req){.session = j[i].id, .start_from_position = -1, .reply_encoding = -1,
                               .push_host = "127.0.0.1", .push_port = sp_server_port(s2), .push_session = j[i].next,
                               .push_token = fail && i == 2 ? token ^ 1 : token};
        if (fail && i == 3)
            j[i].q.push_port = dead_port;
    }
    for (int i = 0; i < N; i++)
        pthread_create(&th[i], NULL, push_client, &j[i]);
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        ck_assert_msg(j[i].ok, "session %d failed: %s", i, j[i].why);
        for (int k = 1; k <= R; k++)
            ck_assert_msg(j[i].pushed[k] == !j[i].fails, "session %d, round %d: pushed %d", i, k, j[i].pushed[k]);
        ck_assert_msg(!memcmp(j[i].out, mid[i], sizeof j[i].out), "session %d: server 1's outputs differ from alone", i);
        ck_assert_msg(!memcmp(j[i].out2, want[i], sizeof j[i].out2), "session %d: the next server's outputs differ", i);
        sp_remote_close(j[i].r);
        sp_remote_close(j[i].r2);
    }
    uint64_t in, out;
    sp_server_pushes(s1, &in, &out);
    ck_assert_int_eq((int)out, (fail ? 2 : N) * R);
    sp_server_batch_stats bs = batch_stats_at(s1, N * (1 + R));
    ck_assert_msg((int)sp_server_pushes_in_flight_peak(s1) == (fail ? 2 : N) + fail, /* (the dead one never went out) */
                  "at most %d pushes were in flight at once (%llu passes of %llu rows, the most %llu)",
                  (int)sp_server_pushes_in_flight_peak(s1), (unsigned long long)bs.batches,
                  (unsigned long long)bs.rows, (unsigned long long)bs.peak);
    sp_server_batch_stats b2 = batch_stats_at(s2, N * (1 + R));
    ck_assert_msg(b2.rows == N * (1 + R) && b2.batches < b2.rows, "the next server ran %llu of %d steps in %llu passes",
                  (unsigned long long)b2.rows, N * (1 + R), (unsigned long long)b2.batches);
    still_serving(s2, NULL);
    pthread_barrier_destroy(&round);
    sp_remote_close(ra);
    sp_remote_close(r2);
    sp_server_stop(s1);
    sp_server_stop(s2);
    sp_server_stop(alone);
    sp_server_stop(alone2);
}
END_TEST

/* The pushes of a pass of the server before come back to back, but not all at once: a next server whose sessions have
 * their steps that await a push kept here, new sessions (no rhythm of theirs known), waits for the other pushes once
 * the first came (up to its gather wait, 0.5 s here) and runs the four steps in one pass (its batched rows and
 * passes), each with the bits of the same step alone; and it acknowledges the first push at once, not after its
 * wait (a server before awaits its pass's acknowledgements before its next pass, whose pushes the wait may be for).
 * The test is the server before: it sends the four steps that await their inputs, then a plain step of a fifth
 * session (its answer: the four were taken and kept; then it is closed), then the first push, and once that is
 * acknowledged, 100 ms later, the other three. */
START_TEST(t_push_batch_awaited)
{
    enum { N = 4 };
    sp_server_opts o;
    gqa_opts(&o, 2, 4);
    o.workers_only = 1;
    o.gather_wait_s = 0.5;
    sp_server *s2 = start_with(&o), *alone = start_server(2, 4, 0, 0);
    sp_remote *r = connect_to(s2), *ra = connect_to(alone);
    sp_rng g;
    sp_rng_seed(&g, 5);
    static float x[N + 1][H], want[N][H], y[H];
    uint64_t id[N], tok[N], wid[N], pid[N];
    sp_reply wrep[N], prep[N];
    char meta[256];
    sp_err err = {0};
    for (int i = 0; i <= N; i++)
        sp_rng_fill_normal(&g, x[i], H, 1.0f);
    for (int i = 0; i < N; i++) {
        id[i] = open_pushable(r, 2, 4, 4, 1, &tok[i]);
        step(ra, open_session(ra, 2, 4, 4, 1), x[i], 1, 1, want[i], -1, NULL);
    }
    for (int i = 0; i < N; i++) {
        sp_step_req w = {.session = id[i], .start_from_position = -1, .reply_encoding = -1, .step = 1, .await = 1};
        ck_assert_int_eq(sp_step_req_encode(&w, meta, sizeof meta, NULL), SP_OK);
        ck_assert_msg(sp_remote_send(r, SP_MSG_INFERENCE_STEP, meta, NULL, 0, &wrep[i], &wid[i], &err) == SP_OK, "%s",
                      err.msg);
    }
    uint64_t extra = open_session(r, 2, 4, 4, 1);
    step(r, extra, x[N], 1, 1, y, -1, NULL);
    sp_reply rep;
    call_ok(r, SP_MSG_INFERENCE_CLOSE, session_meta(meta, sizeof meta, extra), NULL, 0, 0, &rep);
    sp_reply_clear(&rep);
    sp_server_batch_stats b0 = batch_stats_at(s2, 1), b1;
    for (int i = 0; i < N; i++) {
        sp_push_req p = {.session = id[i], .token = tok[i], .step = 1};
        sp_tensor_src t = t3(x[i], 1, 1);
        ck_assert_int_eq(sp_push_req_encode(&p, meta, sizeof meta, NULL), SP_OK);
        ck_assert_msg(sp_remote_send(r, SP_MSG_INFERENCE_PUSH, meta, &t, 1, &prep[i], &pid[i], &err) == SP_OK, "%s",
                      err.msg);
        if (i > 0)
            continue;
        ck_assert_msg(sp_remote_wait(r, pid[i], TMO, &err) == SP_OK && !sp_reply_error_code(&prep[i]), "push %d: %s",
                      i, err.msg);
        sp_reply_clear(&prep[i]);
        nanosleep(&(struct timespec){0, 100 * 1000000L}, NULL);
    }
    for (int i = 0; i < N; i++) {
        ck_assert_msg(i == 0 || (sp_remote_wait(r, pid[i], TMO, &err) == SP_OK && !sp_reply_error_code(&prep[i])),
                      "push %d: %s", i, err.msg);
        if (i > 0)
            sp_reply_clear(&prep[i]);
        ck_assert_msg(sp_remote_wait(r, wid[i], TMO, &err) == SP_OK && wrep[i].msg.n_tensors == 1 &&
                          wrep[i].msg.t[0].numel == H,
                      "step %d: %s", i, err.msg);
        ck_assert_int_eq(sp_tensor_to_f32(&wrep[i].msg.t[0], y, NULL), SP_OK);
        ck_assert_msg(!memcmp(y, want[i], sizeof y), "session %d: its output differs from the step alone", i);
        sp_reply_clear(&wrep[i]);
    }
    b1 = batch_stats_at(s2, b0.rows + N);
    ck_assert_msg(b1.batches - b0.batches == 1 && b1.rows - b0.rows == N,
                  "the next server ran the %d pushed steps as %llu rows in %llu passes", N,
                  (unsigned long long)(b1.rows - b0.rows), (unsigned long long)(b1.batches - b0.batches));
    sp_remote_close(r);
    sp_remote_close(ra);
    sp_server_stop(s2);
    sp_server_stop(alone);
}
END_TEST

/* One connection, four threads stepping a session each: the calls are in flight at once (sp_remote hands each reply
 * to its caller), so the server sees their steps together and batches them. */
/* One client's training: steps of FORWARD then BACKWARD over blocks 1:4 (B rows of T positions, deep prompts of
 * P when P > 0, the FORWARD asked to keep its activations when keep is set), random inputs of its seed; the
 * answers (outputs, input gradients, prompts' gradients) of every step in out. */
typedef struct train_job {
    sp_server *s;
    int seed, B, T, P, keep, steps;
    pthread_barrier_t *go;
    float *out; /* steps x (y [B, T, H], g [B, T, H], gp [3, B, P, H]) */
    int ok;
} train_job;

static size_t train_step_floats(const train_job *j)
{
    return (size_t)j->B * j->T * H * 2 + (size_t)3 * j->B * j->P * H;
}

/* One call's tensor k into dst (its numel floats); 0, or -1. */
static int train_call(sp_remote *r, sp_msg_type type, const char *meta, const sp_tensor_src *t, int n, float *dst,
                      int want)
{
    sp_reply rep;
    sp_err err = {0};
    int ok = sp_remote_call(r, type, meta, t, n, &rep, TMO, &err) == SP_OK && rep.msg.n_tensors == want;
    for (int k = 0; ok && k < want; k++) {
        ok = sp_tensor_to_f32(&rep.msg.t[k], dst, &err) == SP_OK;
        dst += rep.msg.t[k].numel;
    }
    if (!ok)
        fprintf(stderr, "train_call %s: %s\n", sp_msg_type_name(type), err.msg);
    sp_reply_clear(&rep);
    return ok ? 0 : -1;
}

static void *train_client(void *p)
{
    train_job *j = p;
    sp_remote *r = NULL;
    sp_err err = {0};
    if (sp_remote_connect(&r, "127.0.0.1", sp_server_port(j->s), 0, TMO, &err) != SP_OK)
        return NULL;
    size_t N = (size_t)j->B * j->T * H, NP = (size_t)3 * j->B * j->P * H;
    float *x = malloc(N * 4), *g = malloc(N * 4), *pr = j->P ? malloc(NP * 4) : NULL;
    sp_rng rng;
    sp_rng_seed(&rng, (uint64_t)j->seed);
    int ok = 1;
    if (j->go)
        pthread_barrier_wait(j->go);
    for (int st = 0; ok && st < j->steps; st++) {
        float *o = j->out + (size_t)st * train_step_floats(j);
        sp_rng_fill_normal(&rng, x, (long)N, 1.0f);
        sp_rng_fill_normal(&rng, g, (long)N, 1.0f);
        if (pr)
            sp_rng_fill_normal(&rng, pr, (long)NP, 0.5f);
        sp_tensor_src prompts = {.enc = SP_ENC_F32, .rank = 4, .shape = {3, j->B, j->P, H}, .f32 = pr};
        sp_tensor_src fa[2] = {t3(x, j->B, j->T), prompts}, ba[3] = {t3(x, j->B, j->T), t3(g, j->B, j->T), prompts};
        char fm[96], bm[96];
        snprintf(fm, sizeof fm, "{\"start\":1,\"end\":4,\"keep\":%d}", j->keep ? 100 + st : 0);
        snprintf(bm, sizeof bm, "{\"start\":1,\"end\":4,\"kept\":%d}", j->keep ? 100 + st : 0);
        ok = !train_call(r, SP_MSG_FORWARD, fm, fa, pr ? 2 : 1, o, 1) &&
             !train_call(r, SP_MSG_BACKWARD, bm, ba, pr ? 3 : 2, o + N, pr ? 2 : 1);
    }
    j->ok = ok;
    free(x), free(g), free(pr);
    sp_remote_close(r);
    return NULL;
}

/* Training's FORWARDs and BACKWARDs of several clients that wait together run as one pass (same span, positions and
 * prompts' length): each client's outputs and gradients, step by step, have the bits they get alone on a --no-batch
 * server, whether the FORWARD kept its activations or not (a pass of both recomputes for all); one of other
 * positions runs apart. The metrics count the merged passes. */
START_TEST(t_merged_training_as_alone)
{
    sp_server *s = start_batching("slow:30", 0, 0, 0), *alone = start_batching("slow:30", 0, 0, 1);
    enum { NJ = 5 };
    train_job j[NJ] = {{.seed = 1, .B = 2, .T = 6, .P = 2, .keep = 1, .steps = 4},
                       {.seed = 2, .B = 3, .T = 6, .P = 2, .keep = 1, .steps = 4},
                       {.seed = 3, .B = 2, .T = 6, .P = 2, .keep = 0, .steps = 4},
                       {.seed = 4, .B = 1, .T = 6, .P = 2, .keep = 1, .steps = 3},
                       {.seed = 5, .B = 1, .T = 12, .P = 0, .keep = 1, .steps = 3}};
    float *together[NJ];
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, NJ);
    for (int pass = 0; pass < 2; pass++) { /* all at once, then each alone on the --no-batch server */
        pthread_t th[NJ];
        for (int i = 0; i < NJ; i++) {
            if (pass == 1)
                together[i] = j[i].out;
            j[i].s = pass ? alone : s, j[i].go = pass ? NULL : &go, j[i].ok = 0;
            j[i].out = calloc((size_t)j[i].steps * train_step_floats(&j[i]), 4);
            pthread_create(&th[i], NULL, train_client, &j[i]);
            if (pass == 1)
                pthread_join(th[i], NULL);
        }
        for (int i = 0; pass == 0 && i < NJ; i++)
            pthread_join(th[i], NULL);
        for (int i = 0; i < NJ; i++)
            ck_assert_msg(j[i].ok, "client %d (pass %d) failed", i, pass);
    }
    for (int i = 0; i < NJ; i++) {
        size_t n = (size_t)j[i].steps * train_step_floats(&j[i]);
        ck_assert_msg(!memcmp(together[i], j[i].out, n * 4), "client %d: merged answers differ from alone", i);
        free(together[i]), free(j[i].out);
    }
    char *text = sp_server_metrics_text(s, NULL);
    long fwd = 0, bwd = 0, reqs = 0;
    const char *f = strstr(text, "sepal_batched_passes_total{kind=\"forward\"} ");
    const char *b = strstr(text, "sepal_batched_passes_total{kind=\"backward\"} ");
    const char *q = strstr(text, "sepal_batched_requests_total{kind=\"forward\"} ");
    ck_assert(f && b && q);
    sscanf(f + strlen("sepal_batched_passes_total{kind=\"forward\"} "), "%ld", &fwd);
    sscanf(b + strlen("sepal_batched_passes_total{kind=\"backward\"} "), "%ld", &bwd);
    sscanf(q + strlen("sepal_batched_requests_total{kind=\"forward\"} "), "%ld", &reqs);
    ck_assert_msg(fwd >= 1 && bwd >= 1 && reqs >= 2 * fwd, "merged passes: %ld forward (%ld requests), %ld backward",
                  fwd, reqs, bwd);
    free(text);
    text = sp_server_metrics_text(alone, NULL);
    ck_assert_ptr_nonnull(strstr(text, "sepal_batched_passes_total{kind=\"forward\"} 0\n"));
    free(text);
    pthread_barrier_destroy(&go);
    sp_server_stop(s);
    sp_server_stop(alone);
    unsetenv("SEPAL_SERVER_FAULT");
}
END_TEST

START_TEST(t_one_connection_many_sessions)
{
    sp_server *s = start_batching("slow:10", 0, 0, 0);
    sp_remote *shared = connect_to(s);
    int done = 0;
    batch_job j[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        j[i] = (batch_job){.s = s, .shared = shared, .seed = 40 + i, .B = 1, .prefill = 2, .steps = 6, .done = &done};
        j[i].out = calloc((size_t)8 * H, 4);
        pthread_create(&th[i], NULL, batch_client, &j[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        ck_assert(j[i].ok);
        free(j[i].out);
    }
    sp_server_batch_stats bs;
    sp_server_batch_stats_get(s, &bs);
    ck_assert_msg(bs.peak >= 2, "one connection's sessions never met in a pass (%llu passes)",
                  (unsigned long long)bs.batches);
    sp_remote_close(shared);
    sp_server_stop(s);
    unsetenv("SEPAL_SERVER_FAULT");
}
END_TEST

/* Fairness between clients (peers: source addresses), a real sepal-server process: client A, from 127.0.0.2, opens
 * 30 sessions, each on a connection of its own, and pipelines a step of each (the protocol allows requests in flight at once),
 * sending each session's next step as its answer comes, so some 26 of its steps always wait; client B, from
 * 127.0.0.1, steps one session. Passes hold 4 rows (--max-batch-tokens 4). The server counts, for each request it
 * takes from the queue, the requests of other clients it took while that one waited, and INFO tells B the most
 * of its own (passed_inference): with turns round-robin over the peers, B's step is the next one taken after it
 * comes, or the one after (the turn was B's last), so at most 1 of A's passes it; by connection B would have one
 * turn in 31 (some 30 of A's), first come, first served it would wait behind A's queue (some 26). A count of what
 * the server took, not of the answers A's threads happen to read meanwhile, nor a time. */
enum { FAIR_CONNS = 30, FAIR_PER = 1 };

typedef struct greedy_client {
    int port;
    int stop, done, ready; /* atomics: stop sending; A's answers; connections with every first step sent */
} greedy_client;

static void raw_send(sp_ws_client *c, sp_msg_type type, uint64_t id, const char *meta, const sp_tensor_src *t, int n)
{
    sp_buf b = {0};
    sp_err err = {0};
    ck_assert_int_eq(sp_msg_encode(&b, type, 0, id, meta, t, n, &err), SP_OK);
    ck_assert_int_eq(sp_ws_client_send(c, &b, &err), SP_OK);
}

/* The next answer's request id (it must not be an ERROR); its metadata into meta when asked. */
static uint64_t raw_answer(sp_ws_client *c, char *meta, size_t cap)
{
    sp_buf b = {0};
    sp_msg m;
    sp_err err = {0};
    ck_assert_msg(sp_ws_client_recv(c, &b, TMO, &err) == SP_OK, "%s", err.msg);
    ck_assert_int_eq(sp_msg_decode(&m, b.data, b.len, NULL, &err), SP_OK);
    ck_assert_msg(m.type != SP_MSG_ERROR, "an ERROR: %.*s", (int)m.meta_len, m.meta_json);
    if (meta)
        snprintf(meta, cap, "%.*s", (int)m.meta_len, m.meta_json);
    uint64_t id = m.request_id;
    sp_msg_clear(&m);
    sp_buf_free(&b);
    return id;
}

/* A raw connection to port from the local address source, past its HELLO. */
static sp_ws_client *raw_connect(int port, const char *source)
{
    sp_ws_client *c = NULL;
    sp_err err = {0};
    sp_transport_opts to;
    sp_transport_opts_default(&to);
    to.source = source;
    ck_assert_msg(sp_ws_client_connect(&c, "127.0.0.1", port, &to, TMO, &err) == SP_OK, "%s", err.msg);
    char meta[256];
    sp_hello_req hq = {.version = SP_PROTO_VERSION, .client = "test"};
    ck_assert_int_eq(sp_hello_req_encode(&hq, meta, sizeof meta, NULL), SP_OK);
    raw_send(c, SP_MSG_HELLO, 1, meta, NULL, 0);
    raw_answer(c, NULL, 0);
    return c;
}

static void raw_step(sp_ws_client *c, uint64_t session, int k)
{
    float x[H];
    for (int i = 0; i < H; i++)
        x[i] = (float)(i % 7) * 0.1f;
    sp_tensor_src t = t3(x, 1, 1);
    char meta[128];
    sp_step_req q = {.session = session, .start_from_position = -1, .reply_encoding = -1};
    ck_assert_int_eq(sp_step_req_encode(&q, meta, sizeof meta, NULL), SP_OK);
    raw_send(c, SP_MSG_INFERENCE_STEP, 1000 + (uint64_t)k, meta, &t, 1);
}

/* One of A's connections: its FAIR_PER sessions opened, then stepped, each step sent as the last one's answer
 * comes, 60 steps a session or until told to stop. */
static void *greedy_conn(void *p)
{
    greedy_client *a = p;
    sp_ws_client *c = raw_connect(a->port, "127.0.0.2");
    uint64_t session[FAIR_PER];
    char meta[256];
    for (int k = 0; k < FAIR_PER; k++) {
        sp_open_req oq = {.start = 0, .end = 4, .max_length = 64, .batch = 1};
        ck_assert_int_eq(sp_open_req_encode(&oq, meta, sizeof meta, NULL), SP_OK);
        raw_send(c, SP_MSG_INFERENCE_OPEN, 2, meta, NULL, 0);
        raw_answer(c, meta, sizeof meta);
        cJSON *j = cJSON_Parse(meta);
        session[k] = (uint64_t)cJSON_GetObjectItem(j, "session")->valuedouble;
        cJSON_Delete(j);
    }
    int pos[FAIR_PER] = {0}, inflight = 0;
    for (int k = 0; k < FAIR_PER; k++, inflight++) /* every session's first step at once */
        raw_step(c, session[k], k);
    __atomic_add_fetch(&a->ready, 1, __ATOMIC_SEQ_CST);
    while (inflight) {
        int k = (int)(raw_answer(c, NULL, 0) - 1000);
        inflight--;
        __atomic_add_fetch(&a->done, 1, __ATOMIC_SEQ_CST);
        if (++pos[k] >= 60 || __atomic_load_n(&a->stop, __ATOMIC_SEQ_CST))
            continue;
        raw_step(c, session[k], k);
        inflight++;
    }
    sp_ws_client_close(c);
    return NULL;
}

/* A fairness test's swarm: a server whose answers come 3 ms late (SEPAL_SERVER_FAULT=slow:3: A's requests queue up)
 * and passes hold max_batch_tokens rows; B from 127.0.0.1 with a session open; then A's FAIR_CONNS connections
 * from 127.0.0.2 each running fn, until every one of them has its first requests in. */
typedef struct fair_run {
    sp_test_proc p;
    greedy_client a;
    pthread_t th[FAIR_CONNS];
    sp_remote *b;
    uint64_t id;
} fair_run;

static void fair_start(fair_run *f, const char *max_batch_tokens, void *(*fn)(void *))
{
    setenv("SEPAL_SERVER_FAULT", "slow:3", 1);
    const char *args[] = {"--model", GQA, "--blocks", "0:4", "--no-measure", "--max-batch-tokens", max_batch_tokens,
                          NULL};
    ck_assert_int_eq(sp_test_server_start(&f->p, args), 0);
    unsetenv("SEPAL_SERVER_FAULT");
    f->a = (greedy_client){.port = f->p.port};
    sp_err err = {0};
    f->b = NULL; /* B's session first: its opening waits for none of A's */
    ck_assert_msg(sp_remote_connect(&f->b, "127.0.0.1", f->p.port, 0, TMO, &err) == SP_OK, "%s", err.msg);
    f->id = open_session(f->b, 0, 4, 16, 1);
    for (int i = 0; i < FAIR_CONNS; i++)
        pthread_create(&f->th[i], NULL, fn, &f->a);
    while (__atomic_load_n(&f->a.ready, __ATOMIC_SEQ_CST) < FAIR_CONNS)
        usleep(1000);
    usleep(30000); /* A's queue fills */
}

/* A told to stop and its connections joined. */
static void fair_stop_a(fair_run *f)
{
    __atomic_store_n(&f->a.stop, 1, __ATOMIC_SEQ_CST);
    for (int i = 0; i < FAIR_CONNS; i++)
        pthread_join(f->th[i], NULL);
}

static void fair_end(fair_run *f)
{
    sp_remote_close(f->b);
    sp_test_proc_signal(&f->p, SIGTERM);
}

START_TEST(t_fair_between_clients)
{
    fair_run f; /* passes of 4 steps take 12 ms or more */
    fair_start(&f, "4", greedy_conn);
    float x[H] = {0}, y[H];
    for (int i = 0; i < 6; i++)
        step(f.b, f.id, x, 1, 1, y, -1, NULL);
    sp_info_reply info;
    ck_assert_int_eq(sp_remote_get_info(f.b, &info, TMO, NULL), SP_OK);
    int taken = __atomic_load_n(&f.a.done, __ATOMIC_SEQ_CST);
    fair_stop_a(&f);
    fprintf(stderr, "fairness: at most %lld of A's steps taken while one of B's waited (A: %d answered)\n",
            (long long)info.passed_inference, taken);
    ck_assert_msg(info.batch_peak >= 4, "A's steps did not fill a pass (the most rows %lld)", (long long)info.batch_peak);
    ck_assert_msg(info.passed_inference <= 1, "B's step waited while %lld of A's were taken",
                  (long long)info.passed_inference);
    fair_end(&f);
}
END_TEST

/* Training's FORWARDs merge by turns too. A client from 127.0.0.2 keeps a FORWARD of 12 rows in flight on each of
 * 30 connections; passes hold 2 of them (--max-batch-tokens 24) and take 6 ms or more (slow:3 per answer); a
 * client from 127.0.0.1 sends one FORWARD at a time: its request is the next taken after it comes, or the one after
 * (turns by client), so at most 1 of A's is taken while it waits (the server's count, INFO's passed_training), where
 * by connection some 29 would, first come, first served some 28. An inference step meanwhile goes before all of
 * them: none of A's is taken while it waits (passed_inference; a pass being gathered takes no more once inference
 * waits). Counts of what the server took, not of answers read, nor a time. */
static void raw_forward(sp_ws_client *c, uint64_t id)
{
    static float x[12 * H];
    for (int i = 0; i < 12 * H; i++)
        x[i] = (float)(i % 5) * 0.1f;
    sp_tensor_src t = t3(x, 1, 12);
    raw_send(c, SP_MSG_FORWARD, id, "{\"start\":0,\"end\":4}", &t, 1);
}

static void *greedy_trainer(void *p)
{
    greedy_client *a = p;
    sp_ws_client *c = raw_connect(a->port, "127.0.0.2");
    raw_forward(c, 1000);
    __atomic_add_fetch(&a->ready, 1, __ATOMIC_SEQ_CST);
    for (int k = 1; k < 60; k++) {
        raw_answer(c, NULL, 0);
        __atomic_add_fetch(&a->done, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&a->stop, __ATOMIC_SEQ_CST))
            break;
        raw_forward(c, 1000 + (uint64_t)k);
    }
    sp_ws_client_close(c);
    return NULL;
}

START_TEST(t_fair_training_merges)
{
    fair_run f;
    fair_start(&f, "24", greedy_trainer);
    float *x = calloc(12 * H, 4), y[H];
    for (int i = 0; i < 6; i++) {
        sp_reply rep;
        sp_tensor_src t = t3(x, 1, 12);
        free(call_ok(f.b, SP_MSG_FORWARD, "{\"start\":0,\"end\":4}", &t, 1, 1, &rep));
        sp_reply_clear(&rep);
        step(f.b, f.id, x, 1, 1, y, -1, NULL); /* inference first: before every FORWARD waiting */
    }
    sp_info_reply info;
    ck_assert_int_eq(sp_remote_get_info(f.b, &info, TMO, NULL), SP_OK);
    int taken = __atomic_load_n(&f.a.done, __ATOMIC_SEQ_CST);
    fair_stop_a(&f);
    fprintf(stderr, "training fairness: at most %lld of A's FORWARDs taken while one of B's waited, %lld while a "
            "step waited (A: %d answered)\n", (long long)info.passed_training, (long long)info.passed_inference, taken);
    ck_assert_msg(info.passed_training <= 1, "B's FORWARD waited while %lld of A's were taken",
                  (long long)info.passed_training);
    ck_assert_msg(info.passed_inference == 0, "B's step waited while %lld of A's FORWARDs were taken",
                  (long long)info.passed_inference);
    free(x);
    fair_end(&f);
}
END_TEST

/* INFO's passed_* are a recent window's most (here 0.5 s and the one before it; 60 s by default), not a lifetime's: a
 * server whose answers come 300 ms late; client A (127.0.0.2) has a step in the works and another waiting, then
 * B's FORWARD comes: A's waiting step is taken before it (inference first), so B is told 1 once its answer came;
 * two windows later, with nothing taken since, 0. */
static uint64_t raw_open(sp_ws_client *c)
{
    char meta[256];
    sp_open_req oq = {.start = 0, .end = 4, .max_length = 8, .batch = 1};
    ck_assert_int_eq(sp_open_req_encode(&oq, meta, sizeof meta, NULL), SP_OK);
    raw_send(c, SP_MSG_INFERENCE_OPEN, 2, meta, NULL, 0);
    raw_answer(c, meta, sizeof meta);
    cJSON *j = cJSON_Parse(meta);
    uint64_t id = (uint64_t)cJSON_GetObjectItem(j, "session")->valuedouble;
    cJSON_Delete(j);
    return id;
}

START_TEST(t_passed_recent_window)
{
    setenv("SEPAL_SERVER_FAULT", "slow:300", 1);
    sp_server_opts o;
    gqa_opts(&o, 0, 4);
    o.workers_only = 1;
    o.passed_window_s = 0.5;
    sp_server *s = start_with(&o);
    sp_ws_client *a = raw_connect(sp_server_port(s), "127.0.0.2"), *b = raw_connect(sp_server_port(s), "127.0.0.1");
    uint64_t s1 = raw_open(a), s2 = raw_open(a);
    raw_step(a, s1, 0);
    usleep(50000); /* (a worker has it) */
    raw_step(a, s2, 1);
    raw_forward(b, 7);
    raw_answer(b, NULL, 0);
    sp_remote *r = connect_to(s); /* (B's address) */
    sp_info_reply info;
    ck_assert_int_eq(sp_remote_get_info(r, &info, TMO, NULL), SP_OK);
    ck_assert_msg(info.passed_training == 1, "B's FORWARD passed by %lld", (long long)info.passed_training);
    usleep(1100000);
    ck_assert_int_eq(sp_remote_get_info(r, &info, TMO, NULL), SP_OK);
    ck_assert_msg(info.passed_training == 0, "two windows later: %lld", (long long)info.passed_training);
    for (int k = 0; k < 2; k++)
        raw_answer(a, NULL, 0);
    sp_remote_close(r);
    sp_ws_client_close(a);
    sp_ws_client_close(b);
    sp_server_stop(s);
    unsetenv("SEPAL_SERVER_FAULT");
}
END_TEST

/* The queue wait's bound (--max-queue-wait): three sessions step without pause on a server whose answers come 20 ms
 * late each, so that steps wait for the pass before theirs (tens of ms, over a bound of 1 ms): a new session is
 * refused with ERROR "overloaded" (and counted), the running ones go on; once their steps stop, nothing waits, and a
 * session opens again. Conditions polled for, never a time asserted. */
static int saturated(void *s) { return sp_server_saturated(s); }
static int unsaturated(void *s) { return !sp_server_saturated(s); }

START_TEST(t_queue_wait_bound)
{
    sp_server *s = start_batching("slow:20", 0, 0.001, 0);
    sp_test_load *l = sp_test_load_start(sp_server_port(s), 3, 0, 4, H);
    ck_assert_msg(sp_test_wait_for(saturated, s, 30), "the queue wait never passed 1 ms: %.6f s",
                  sp_server_queue_wait(s));
    sp_remote *r = connect_to(s);
    call_err(r, SP_MSG_INFERENCE_OPEN, "{\"start\":0,\"end\":4,\"max_length\":8,\"batch\":1}", NULL, 0, "overloaded");
    sp_info_reply info;
    ck_assert_int_eq(sp_remote_get_info(r, &info, TMO, NULL), SP_OK);
    ck_assert_double_eq(info.max_queue_wait, 0.001);
    ck_assert_str_eq(info.device, "cpu"); /* what `servers` shows of a server connected by address */
    int before = sp_test_load_steps(l);
    while (sp_test_load_steps(l) < before + 6) /* the running sessions go on */
        usleep(1000);
    char *text = sp_server_metrics_text(s, NULL);
    ck_assert_ptr_nonnull(strstr(text, "\nsepal_sessions_refused_overloaded_total 1\n"));
    free(text);
    sp_test_load_stop(l);
    ck_assert_msg(sp_test_wait_for(unsaturated, s, 30), "still saturated: %.6f s", sp_server_queue_wait(s));
    open_session(r, 0, 4, 8, 1);
    sp_remote_close(r);
    sp_server_stop(s);
    unsetenv("SEPAL_SERVER_FAULT");
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* cache budget, timeouts, info */

START_TEST(t_cache_budget_and_info)
{
    sp_server *s = start_server(0, 2, 100, 0); /* 100 positions over the span */
    sp_remote *r = connect_to(s);
    sp_reply rep;
    sp_info_reply info;
    ck_assert_int_eq(sp_remote_get_info(r, &info, TMO, NULL), SP_OK);
    ck_assert_int_eq(info.cache_tokens_available, 100);
    ck_assert_int_eq(info.hidden_size, H);
    ck_assert_int_eq(info.start, 0);
    ck_assert_str_eq(info.protocol, "1.1");
    uint64_t id = open_session(r, 0, 2, 60, 1);
    call_err(r, SP_MSG_INFERENCE_OPEN, "{\"start\":0,\"end\":2,\"max_length\":50,\"batch\":1}", NULL, 0, "out_of_cache");
    ck_assert_int_eq(sp_remote_get_info(r, &info, TMO, NULL), SP_OK);
    ck_assert_int_eq(info.cache_tokens_available, 40);
    /* a session on one block of the two costs half as much: 80 positions fit in the 40 left x 2 */
    uint64_t id2 = open_session(r, 1, 2, 80, 1);
    ck_assert_int_eq(sp_server_sessions(s), 2);
    char meta[64];
    call_ok(r, SP_MSG_INFERENCE_CLOSE, session_meta(meta, sizeof meta, id), NULL, 0, 0, &rep);
    sp_reply_clear(&rep);
    (void)id2;
    /* closing the connection frees the other */
    sp_remote_close(r);
    for (int k = 0; k < 100 && sp_server_sessions(s); k++)
        usleep(20000);
    ck_assert_int_eq(sp_server_sessions(s), 0);
    sp_server_stop(s);
}
END_TEST

START_TEST(t_step_timeout)
{
    sp_server *s = start_server(0, 1, 0, 1.0); /* sessions idle for 1 s are closed */
    sp_remote *r = connect_to(s);
    uint64_t id = open_session(r, 0, 1, 8, 1);
    ck_assert_int_eq(sp_server_sessions(s), 1);
    for (int k = 0; k < 150 && sp_server_sessions(s); k++)
        usleep(20000);
    ck_assert_int_eq(sp_server_sessions(s), 0);
    float x[H] = {0};
    sp_tensor_src tx = t3(x, 1, 1);
    char meta[64];
    call_err(r, SP_MSG_INFERENCE_STEP, session_meta(meta, sizeof meta, id), &tx, 1, "no_session");
    sp_remote_close(r);
    sp_server_stop(s);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* bad input */

START_TEST(t_bad_requests)
{
    sp_server *s = start_server(1, 3, 0, 0);
    sp_remote *r = connect_to(s);
    float x[2 * 4 * H];
    for (int i = 0; i < 2 * 4 * H; i++)
        x[i] = (float)(i % 7) * 0.1f;
    sp_tensor_src good = t3(x, 2, 4);
    const char *span = "{\"start\":1,\"end\":3}";
    /* wrong hidden size */
    sp_tensor_src t = good;
    t.shape[2] = 32;
    call_err(r, SP_MSG_FORWARD, span, &t, 1, "shape");
    /* wrong dtype: integers where floats belong */
    int64_t ids[8] = {0};
    t = (sp_tensor_src){.enc = SP_ENC_I64, .rank = 3, .shape = {2, 4, 1}, .raw = ids};
    call_err(r, SP_MSG_FORWARD, span, &t, 1, "dtype");
    /* blocks not served, and no span at all */
    call_err(r, SP_MSG_FORWARD, "{\"start\":0,\"end\":2}", &good, 1, "blocks_not_served");
    call_err(r, SP_MSG_FORWARD, "{\"start\":2,\"end\":2}", &good, 1, "blocks_not_served");
    call_err(r, SP_MSG_FORWARD, NULL, &good, 1, "bad_request");
    call_err(r, SP_MSG_FORWARD, span, NULL, 0, "bad_request");
    /* NaN payload: refused (documented), the server keeps serving */
    x[5] = NAN;
    call_err(r, SP_MSG_FORWARD, span, &good, 1, "non_finite");
    x[5] = INFINITY;
    call_err(r, SP_MSG_FORWARD, span, &good, 1, "non_finite");
    x[5] = 0;
    /* an ERROR or a reply type is not a request */
    call_err(r, SP_MSG_ERROR, NULL, NULL, 0, "unknown_type");
    /* backward with mismatched grad */
    sp_tensor_src bw[2] = {good, t3(x, 1, 4)};
    call_err(r, SP_MSG_BACKWARD, span, bw, 2, "shape");
    /* sessions: bad max_length, a session that is not ours */
    call_err(r, SP_MSG_INFERENCE_OPEN, "{\"start\":1,\"end\":3,\"max_length\":0,\"batch\":1}", NULL, 0, "max_length");
    call_err(r, SP_MSG_INFERENCE_OPEN, "{\"start\":1,\"end\":3,\"max_length\":100000,\"batch\":1}", NULL, 0,
             "max_length");
    call_err(r, SP_MSG_INFERENCE_STEP, "{\"session\":999}", &good, 1, "no_session");
    call_err(r, SP_MSG_INFERENCE_CLOSE, "{\"session\":999}", NULL, 0, "no_session");
    still_serving(s, r);
    sp_remote_close(r);
    sp_server_stop(s);
}
END_TEST

/* Malformed bytes cost the sender its connection, nobody else anything. (Sent over the websocket, whose frames
 * bound a message: on the bulk TCP stream a truncated message is indistinguishable from a slow one.) */
START_TEST(t_malformed_messages)
{
    sp_server *s = start_server(1, 3, 0, 0);
    sp_remote *bystander = connect_to(s);
    float x[4 * H] = {0};
    sp_tensor_src good = t3(x, 1, 4);
    sp_buf msg = {0};
    sp_err err = {0};
    ck_assert_int_eq(sp_msg_encode(&msg, SP_MSG_FORWARD, 0, 77, "{\"start\":1,\"end\":3}", &good, 1, &err), SP_OK);
    struct {
        const char *what;
        size_t len;
        int byte;
        uint8_t value;
        const char *code;
    } cases[] = {
        {"truncated", 100, -1, 0, "malformed"},
        {"bad magic", 0, 0, 'X', "malformed"},
        {"major version 2", 0, 4, 2, "version"},
        {"unknown type", 0, 8, 200, "unknown_type"},
        {"body length off", 0, 32, 0xff, "malformed"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        sp_remote *r = connect_opts(s, 1); /* websocket only: its frames bound each message */
        uint8_t *bytes = malloc(msg.len);
        memcpy(bytes, msg.data, msg.len);
        size_t len = cases[i].len ? cases[i].len : msg.len;
        if (cases[i].byte >= 0)
            bytes[cases[i].byte] = cases[i].value;
        sp_reply rep;
        sp_remote_call_raw(r, bytes, len, &rep, TMO, &err);
        const char *code = sp_reply_error_code(&rep);
        ck_assert_msg(code && !strcmp(code, cases[i].code), "%s: got %s", cases[i].what, code ? code : err.msg);
        sp_reply_clear(&rep);
        free(bytes);
        sp_remote_close(r);
    }
    /* a header announcing a message past the cap (2^40 bytes): that connection is closed, nothing else */
    {
        sp_remote *r = connect_opts(s, 1); /* websocket only: its frames bound each message */
        uint8_t bytes[64];
        memcpy(bytes, msg.data, 64);
        memset(bytes + 32, 0, 8);
        bytes[37] = 1; /* body_len = 2^40 */
        sp_reply rep;
        ck_assert_int_ne(sp_remote_call_raw(r, bytes, sizeof bytes, &rep, 5000, &err), SP_OK);
        const char *code = sp_reply_error_code(&rep);
        ck_assert_msg(code && !strcmp(code, "malformed"), "oversized: %s", code ? code : err.msg);
        sp_error_reply e;
        ck_assert_int_eq(sp_error_reply_decode(&rep.msg, &e, NULL), SP_OK);
        ck_assert_ptr_nonnull(strstr(e.message, "exceeds max_message"));
        sp_reply_clear(&rep);
        sp_remote_close(r);
    }
    still_serving(s, bystander);
    still_serving(s, NULL);
    sp_buf_free(&msg);
    sp_remote_close(bystander);
    sp_server_stop(s);
}
END_TEST

/* Reply encodings: f16, bf16 and q8 replies are close to the f32 one. */
START_TEST(t_reply_encodings)
{
    sp_server *s = start_server(0, 1, 0, 0);
    sp_remote *r = connect_to(s);
    size_t n;
    float *in = golden("block.0.in", &n);
    sp_tensor_src x = t3(in, 2, (int)(n / 2 / H));
    sp_reply rep;
    float *ref = call_ok(r, SP_MSG_FORWARD, "{\"start\":0,\"end\":1}", &x, 1, 1, &rep);
    sp_reply_clear(&rep);
    double maxabs = 0;
    for (size_t i = 0; i < n; i++)
        maxabs = fmax(maxabs, fabs(ref[i]));
    const char *encs[] = {"f16", "bf16", "q8"};
    double tol[] = {maxabs / 1024, maxabs / 128, maxabs / 127};
    for (int e = 0; e < 3; e++) {
        char meta[96];
        sp_forward_req q = {.start = 0, .end = 1, .reply_encoding = sp_encoding_from_name(encs[e])};
        ck_assert_int_eq(sp_forward_req_encode(&q, meta, sizeof meta, NULL), SP_OK);
        float *got = call_ok(r, SP_MSG_FORWARD, meta, &x, 1, 1, &rep);
        ck_assert_int_eq(rep.msg.t[0].enc, sp_encoding_from_name(encs[e]));
        ck_assert_msg(sp_max_abs_diff(got, ref, n) <= tol[e], "%s: %g", encs[e], sp_max_abs_diff(got, ref, n));
        ck_assert_double_gt(sp_max_abs_diff(got, ref, n), 0); /* it really was re-encoded */
        sp_reply_clear(&rep);
        free(got);
    }
    call_err(r, SP_MSG_FORWARD, "{\"start\":0,\"end\":1,\"reply_encoding\":\"f8\"}", &x, 1, "bad_request");
    free(in), free(ref);
    sp_remote_close(r);
    sp_server_stop(s);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* the real binary */

/* The throughput cache: a measurement is stored with the load it ran under and when; a calm, recent entry is
 * used as is; one taken on an overloaded machine, a week old, or without those fields is measured again. */
static sp_server *start_measured(const char *cache)
{
    sp_server_opts o;
    gqa_opts(&o, 0, 2);
    o.measure = 1;
    o.throughput_cache = cache;
    return start_with(&o);
}

static cJSON *read_json(const char *path)
{
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    ck_assert_msg(cJSON_IsObject(j) && j->child, "%s: not a JSON object with an entry", path);
    return j;
}

/* Rewrites the file's one entry; a field < -1e299 is left out. */
static void write_entry(const char *path, const char *key, double rps, double load, double at)
{
    cJSON *root = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(root, key);
    cJSON_AddNumberToObject(e, "inference_rps", rps);
    cJSON_AddNumberToObject(e, "forward_tps", 54321);
    if (load > -1e299)
        cJSON_AddNumberToObject(e, "load_per_cpu", load);
    if (at > -1e299)
        cJSON_AddNumberToObject(e, "measured_at", at);
    char *text = cJSON_Print(root);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
    free(text);
    cJSON_Delete(root);
}

static double rps_of(const char *cache)
{
    sp_server *s = start_measured(cache);
    double inf = 0, fwd = 0;
    sp_server_throughput(s, &inf, &fwd);
    sp_server_stop(s);
    return inf;
}

START_TEST(t_throughput_cache)
{
    char dir[] = "/tmp/sepal-tput-XXXXXX", path[64], key[4096];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/throughput.json", dir);
    double measured = rps_of(path);
    ck_assert(measured > 0);
    cJSON *j = read_json(path);
    snprintf(key, sizeof key, "%s", j->child->string);
    const cJSON *e = j->child, *load = cJSON_GetObjectItem(e, "load_per_cpu"), *at = cJSON_GetObjectItem(e, "measured_at");
    ck_assert_msg(cJSON_IsNumber(load) && load->valuedouble >= 0, "no load_per_cpu in the entry");
    ck_assert_msg(cJSON_IsNumber(at) && fabs(at->valuedouble - (double)time(NULL)) < 60, "no measured_at in the entry");
    ck_assert_double_eq_tol(cJSON_GetObjectItem(e, "inference_rps")->valuedouble, measured, 1e-6 * measured);
    cJSON_Delete(j);
    double now = (double)time(NULL);
    write_entry(path, key, 12345, 0.1, now); /* calm and recent: used */
    ck_assert_double_eq(rps_of(path), 12345);
    const struct { double load, at; const char *what; } stale[] = {
        {5.0, now, "overloaded"}, {0.1, now - 8 * 86400.0, "a week old"}, {-1e300, -1e300, "an old entry"}};
    for (size_t i = 0; i < sizeof stale / sizeof *stale; i++) {
        write_entry(path, key, 1.0, stale[i].load, stale[i].at);
        double got = rps_of(path);
        ck_assert_msg(got != 1.0 && got > 0, "%s entry was used (%.1f steps/s)", stale[i].what, got);
        j = read_json(path);
        double stored = cJSON_GetObjectItem(j->child, "inference_rps")->valuedouble;
        ck_assert_msg(fabs(stored - got) <= 1e-9 * got, "%s: not stored again (%.17g in the file, %.17g measured)", stale[i].what,
                      stored, got);
        cJSON_Delete(j);
    }
    unlink(path);
    rmdir(dir);
}
END_TEST

/* The largest request of each kind the span accepts fits a connection's share with the default limits (sized by
 * sp_server_largest_request): a step that fills the cache with deep prompts on every block ((1 + blocks) x
 * cache-tokens positions), and a BACKWARD of max-batch-tokens positions with its prompts ((2 + blocks) x ...). */
static sp_info_transport transport_of(sp_remote *r)
{
    sp_info_reply a;
    ck_assert_int_eq(sp_remote_get_info(r, &a, TMO, NULL), SP_OK);
    return a.transport;
}
#define transport_number(r, name) ((double)transport_of(r).name)

START_TEST(t_largest_requests)
{
    sp_server_opts o;
    gqa_opts(&o, 0, 4);
    o.cache_tokens = 4096;
    o.max_batch_tokens = 2048;
    sp_server *s = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_server_start(&s, &o, &err) == SP_OK, "%s", err.msg);
    sp_remote *r = connect_to(s);
    int nb = 4, L = 256, B = 4096 / L; /* the model's context, and the batch that fills the cache with it */
    double share = transport_number(r, budget_conn);
    uint64_t step_bytes = (uint64_t)(1 + nb) * B * L * H * 4, bwd_bytes = (uint64_t)(2 + nb) * 2048 * H * 4;
    printf("largest requests: step %.2f MiB, backward %.2f MiB, a connection's share %.2f MiB\n",
           step_bytes / 1048576.0, bwd_bytes / 1048576.0, share / 1048576.0);
    ck_assert_double_eq(share, (double)((sp_server_largest_request(H, nb, 2048, 4096) + (1u << 20) - 1) >> 20 << 20));
    /* the share is the step's tensors, the rest of a message at most, rounded up to whole MiB */
    ck_assert_msg(share - (double)step_bytes <= (1u << 20) + SP_PROTO_DEFAULT_MAX_META + 1024,
                  "the step is not the largest request the share is sized for");
    size_t N = (size_t)B * L * H, NP = (size_t)nb * N;
    float *x = calloc(N, 4), *pr = calloc(NP, 4), *y = malloc(N * 4);
    for (size_t i = 0; i < N; i++)
        x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    uint64_t id = open_session(r, 0, nb, L, B);
    sp_tensor_src prompts = {.enc = SP_ENC_F32, .rank = 4, .shape = {nb, B, L, H}, .f32 = pr};
    step(r, id, x, B, L, y, -1, &prompts);
    for (size_t i = 0; i < N; i += 997)
        ck_assert(isfinite(y[i]));
    int Bb = 2048 / L; /* BACKWARD: max-batch-tokens positions, hidden in, grad out and prompts */
    sp_tensor_src bp = {.enc = SP_ENC_F32, .rank = 4, .shape = {nb, Bb, L, H}, .f32 = pr};
    sp_tensor_src ba[3] = {t3(x, Bb, L), t3(x, Bb, L), bp};
    sp_reply rep;
    free(call_ok(r, SP_MSG_BACKWARD, "{\"start\":0,\"end\":4}", ba, 3, 2, &rep));
    ck_assert_int_eq(rep.msg.t[1].rank, 4);
    sp_reply_clear(&rep);
    ck_assert_double_eq(transport_number(r, busy), 0);
    free(x), free(pr), free(y);
    sp_remote_close(r);
    sp_server_stop(s);
}
END_TEST

/* A share below the largest request is refused at start, saying why and what to change; the smallest one that
 * holds it starts (the default rounds the request up to whole MiB: 10 MiB of positions here, plus the header,
 * metadata and descriptors). */
START_TEST(t_binary_small_budget)
{
    const char *small[] = {"--model", GQA, "--blocks", "0:4", "--no-measure", "--input-budget-per-conn", "10", NULL};
    sp_test_proc p;
    ck_assert_int_ne(sp_test_server_start(&p, small), 0);
    FILE *f = fopen(p.log, "r");
    char log[2048] = "";
    size_t n = f ? fread(log, 1, sizeof log - 1, f) : 0;
    log[n] = '\0';
    if (f)
        fclose(f);
    ck_assert_msg(strstr(log, "the input budget per connection (10.0 MiB) is below the largest request this span "
                              "accepts (10.1 MiB: (2 + 4 blocks) x 2048 max-batch-tokens, or (1 + blocks) x 8192 "
                              "cache-tokens, x hidden 64 x 4 bytes); raise it or lower --max-batch-tokens / "
                              "--cache-tokens"), "%s", log);
    const char *enough[] = {"--model", GQA, "--blocks", "0:4", "--no-measure", "--input-budget-per-conn", "11", NULL};
    ck_assert_int_eq(sp_test_server_start(&p, enough), 0);
    sp_remote *r = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_remote_connect(&r, "127.0.0.1", p.port, 0, TMO, &err) == SP_OK, "%s", err.msg);
    ck_assert_double_eq(transport_number(r, budget_conn), 11 << 20);
    sp_remote_close(r);
    sp_test_proc_signal(&p, SIGTERM);
}
END_TEST

START_TEST(t_binary_serves_and_stops)
{
    int out[2];
    ck_assert_int_eq(pipe(out), 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(out[1], 1);
        close(out[0]);
        execl(SEPAL_BIN_DIR "/server/sepal-server", "sepal-server", "--model", GQA, "--blocks", "2:", "--no-measure",
              (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    char line[512] = "";
    FILE *f = fdopen(out[0], "r");
    ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
    const char *p = strstr(line, "ws://127.0.0.1:");
    ck_assert_msg(p != NULL, "%s", line);
    int port = atoi(p + strlen("ws://127.0.0.1:"));
    ck_assert_msg(strstr(line, "serving blocks 2:4 of ") != NULL, "--blocks 2: is printed as the real span: %s", line);
    sp_remote *r = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_remote_connect(&r, "127.0.0.1", port, 0, TMO, &err) == SP_OK, "%s", err.msg);
    ck_assert_int_eq(sp_remote_hello(r)->start, 2);
    ck_assert_int_eq(sp_remote_hello(r)->end, 4);
    sp_remote_close(r);
    kill(pid, SIGTERM);
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    fclose(f);
}
END_TEST

/* A server's peak memory stays within its weights, its KV budget and 32 MB, with the whole budget in use:
 * sessions that fill it, each prefilled to its full length and stepped once more (issue 14). Not under ASan,
 * whose shadow memory and quarantine are not the server's. */
START_TEST(t_binary_memory_bound)
{
#if defined(__SANITIZE_ADDRESS__)
    fprintf(stderr, "t_binary_memory_bound: skipped under ASan\n");
#else
    enum { TOKENS = 65536, B = 32, L = 256 }; /* 8 sessions of 32 x 256 positions fill the budget */
    const char *args[] = {"--model", GQA, "--blocks", "0:4", "--no-measure", "--cache-tokens", "65536", NULL};
    sp_test_proc p;
    ck_assert_int_eq(sp_test_server_start(&p, args), 0);
    sp_remote *r = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_remote_connect(&r, "127.0.0.1", p.port, 0, TMO, &err) == SP_OK, "%s", err.msg);
    sp_info_reply info;
    ck_assert_int_eq(sp_remote_get_info(r, &info, TMO, NULL), SP_OK);
    int64_t per = info.cache_bytes_per_token, avail = info.cache_tokens_available, wbytes = info.weight_bytes;
    ck_assert(per > 0); /* one position, one block */
    ck_assert(avail == TOKENS);
    ck_assert(wbytes > 0);
    double weights = (double)wbytes;
    double kv = (double)TOKENS * (double)per * 4;
    float *x = malloc((size_t)B * L * H * sizeof(float)), *y = malloc((size_t)B * L * H * sizeof(float));
    ck_assert(x && y);
    sp_rng rng;
    sp_rng_seed(&rng, 7);
    sp_rng_fill_normal(&rng, x, (long)B * L * H, 1.0f);
    for (int i = 0; i < TOKENS / (B * L); i++) {
        uint64_t id = open_session(r, 0, 4, L, B);
        step(r, id, x, B, L - 1, y, -1, NULL);
        step(r, id, x, B, 1, y, -1, NULL);
    }
    call_err(r, SP_MSG_INFERENCE_OPEN, "{\"start\":0,\"end\":4,\"max_length\":1,\"batch\":1}", NULL, 0,
             "out_of_cache");
    char path[64], buf[2048];
    snprintf(path, sizeof path, "/proc/%d/status", (int)p.pid);
    FILE *st = fopen(path, "r");
    ck_assert_ptr_nonnull(st);
    size_t n = fread(buf, 1, sizeof buf - 1, st);
    fclose(st);
    buf[n] = '\0';
    const char *hwm = strstr(buf, "VmHWM:");
    ck_assert_ptr_nonnull(hwm);
    double peak = atof(hwm + strlen("VmHWM:")) * 1024;
    fprintf(stderr, "server peak RSS %.1f MB: weights %.1f MB + KV budget %.1f MB (all in use) + %.1f MB\n",
            peak / 1e6, weights / 1e6, kv / 1e6, (peak - weights - kv) / 1e6);
    ck_assert_msg(peak <= weights + kv + 32.0 * 1048576, "peak RSS %.1f MB > weights %.1f + KV %.1f + 32 MiB",
                  peak / 1e6, weights / 1e6, kv / 1e6);
    sp_remote_close(r);
    free(x);
    free(y);
    sp_test_proc_signal(&p, SIGTERM);
#endif
}
END_TEST

START_TEST(t_binary_bad_arguments)
{
    const char *cases[][6] = {
        {"--model", GQA, NULL},                                    /* no blocks */
        {"--model", GQA, "--blocks", "3:2", NULL},                 /* empty span */
        {"--model", GQA, "--blocks", "0:9", "--no-measure", NULL}, /* past the model */
        {"--model", "/nonexistent", "--blocks", "0:1", NULL},
        {"--model", GQA, "--blocks", "0:1", "--port", "x"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            const char *argv[8] = {"sepal-server"};
            for (int k = 0; k < 6 && cases[i][k]; k++)
                argv[k + 1] = cases[i][k];
            int dn = open("/dev/null", 1);
            dup2(dn, 2);
            execv(SEPAL_BIN_DIR "/server/sepal-server", (char *const *)argv);
            _exit(127);
        }
        int status;
        waitpid(pid, &status, 0);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 127, "case %zu", i);
    }
}
END_TEST

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    Suite *s = suite_create("server");
    TCase *tc = tcase_create("rpc");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, t_forward_backward_golden);
    tcase_add_test(tc, t_deep_prompts);
    tcase_add_test(tc, t_keep_kept);
    tcase_add_test(tc, t_keep_kept_inputs_only);
    tcase_add_test(tc, t_kept_plan);
    tcase_add_test(tc, t_sessions_two_servers);
    tcase_add_test(tc, t_push);
    tcase_add_test(tc, t_span_push);
    tcase_add_test(tc, t_span_push_held);
    tcase_add_test(tc, t_hypo_ids);
    tcase_add_test(tc, t_two_clients);
    tcase_add_loop_test(tc, t_batched_sessions_as_alone, 0, 3);
    tcase_add_test(tc, t_batch_waits_for_due_steps);
    tcase_add_test(tc, t_batch_not_waiting_for_idle);
    tcase_add_test(tc, t_remote_send_wait);
    tcase_add_test(tc, t_push_conns_in_flight);
    tcase_add_loop_test(tc, t_batch_pushes_pipelined, 0, 2);
    tcase_add_test(tc, t_push_batch_awaited);
    tcase_add_test(tc, t_merged_training_as_alone);
    tcase_add_test(tc, t_fair_between_clients);
    tcase_add_test(tc, t_fair_training_merges);
    tcase_add_test(tc, t_passed_recent_window);
    tcase_add_test(tc, t_queue_wait_bound);
    tcase_add_test(tc, t_one_connection_many_sessions);
    tcase_add_test(tc, t_cache_budget_and_info);
    tcase_add_test(tc, t_step_timeout);
    tcase_add_test(tc, t_bad_requests);
    tcase_add_test(tc, t_malformed_messages);
    tcase_add_test(tc, t_reply_encodings);
    tcase_add_test(tc, t_throughput_cache);
    tcase_add_test(tc, t_binary_serves_and_stops);
    tcase_add_test(tc, t_binary_bad_arguments);
    tcase_add_test(tc, t_binary_memory_bound);
    tcase_add_test(tc, t_largest_requests);
    tcase_add_test(tc, t_binary_small_budget);
    suite_add_tcase(s, tc);
    return sp_test_run(s);
}
