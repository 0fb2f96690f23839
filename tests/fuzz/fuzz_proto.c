/* fuzz_proto.c - libFuzzer target for the wire protocol decoder (built and run by tests/fuzz/run.sh).
 *
 * Each input is taken as one message: sp_msg_peek and sp_msg_decode must never crash, leak or read outside
 * it, and must agree (a decoded message has a sound header of exactly its length). A message that decodes
 * has every tensor converted, and is then encoded again from what was decoded and decoded once more: that
 * must work too (except Q8 of non-finite values, which the encoder refuses by design), with the same
 * shapes. Violations call abort(), which libFuzzer reports as a crash with the input saved.
 *
 * Built with -DFUZZ_PROTO_SEEDS instead, it is a small program that writes the seed corpus:
 *   fuzz_proto_seeds DIR   (tests/fuzz/run.sh --write-seeds regenerates tests/fuzz/corpus) */
#include <cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

#ifndef FUZZ_PROTO_SEEDS

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

/* Decoded values of one message: floats for float encodings, integers (64- and 32-bit) otherwise. */
typedef struct {
    float *f[SP_PROTO_MAX_TENSORS];
    int64_t *i64[SP_PROTO_MAX_TENSORS];
    int32_t *i32[SP_PROTO_MAX_TENSORS];
} values;

static void values_free(values *v)
{
    for (int i = 0; i < SP_PROTO_MAX_TENSORS; i++) {
        free(v->f[i]);
        free(v->i64[i]);
        free(v->i32[i]);
    }
}

/* Converts every tensor; the view sizes are bounded by the input, so the buffers are small. */
static void convert_all(const sp_msg *m, values *v, sp_err *err)
{
    for (int i = 0; i < m->n_tensors; i++) {
        const sp_tensor_view *t = &m->t[i];
        check(t->numel <= t->nbytes && t->nbytes <= (uint64_t)SIZE_MAX / 8);
        size_t n = (size_t)t->numel;
        v->f[i] = malloc(n * sizeof(float) + 1);
        v->i64[i] = malloc(n * sizeof(int64_t) + 1);
        v->i32[i] = malloc(n * sizeof(int32_t) + 1);
        check(v->f[i] && v->i64[i] && v->i32[i]);
        sp_status sf = sp_tensor_to_f32(t, v->f[i], err), si = sp_tensor_to_i64(t, v->i64[i], err);
        check(sp_encoding_is_float(t->enc) ? sf == SP_OK && si == SP_ERR_ARG : sf == SP_ERR_ARG && si == SP_OK);
        (void)sp_tensor_all_finite(t);
        for (size_t k = 0; si == SP_OK && k < n; k++) {
            check(t->enc == SP_ENC_I64 || (v->i64[i][k] >= INT32_MIN && v->i64[i][k] <= INT32_MAX));
            v->i32[i][k] = (int32_t)v->i64[i][k];
        }
    }
}

/* Encodes the decoded message again and checks that it decodes to the same shapes. */
static void reencode(const sp_msg *m, const values *v)
{
    sp_tensor_src src[SP_PROTO_MAX_TENSORS];
    for (int i = 0; i < m->n_tensors; i++) {
        const sp_tensor_view *t = &m->t[i];
        src[i] = (sp_tensor_src){.enc = t->enc, .rank = t->rank};
        memcpy(src[i].shape, t->shape, sizeof src[i].shape);
        src[i].f32 = sp_encoding_is_float(t->enc) ? v->f[i] : NULL;
        src[i].raw = t->enc == SP_ENC_I64 ? (const void *)v->i64[i] : t->enc == SP_ENC_I32 ? (const void *)v->i32[i] : NULL;
    }
    char *meta = cJSON_PrintUnformatted(sp_msg_meta(m));
    check(meta != NULL);
    sp_buf b = {0};
    sp_err err = {0};
    sp_status s = sp_msg_encode(&b, m->type, m->flags, m->request_id, meta, src, m->n_tensors, &err);
    cJSON_free(meta);
    if (s == SP_ERR_ARG && strstr(err.msg, "non-finite value") && strstr(err.msg, "q8")) {
        sp_buf_free(&b);
        return;
    }
    check(s == SP_OK);
    sp_proto_limits big = {UINT64_MAX, UINT32_MAX};
    sp_msg m2;
    check(sp_msg_decode(&m2, b.data, b.len, &big, &err) == SP_OK);
    check(m2.type == m->type && m2.flags == m->flags && m2.request_id == m->request_id);
    check(m2.n_tensors == m->n_tensors);
    for (int i = 0; i < m->n_tensors; i++)
        check(m2.t[i].enc == m->t[i].enc && m2.t[i].numel == m->t[i].numel && m2.t[i].nbytes == m->t[i].nbytes &&
              memcmp(m2.t[i].shape, m->t[i].shape, sizeof m->t[i].shape) == 0);
    /* integers and f32 come back bit for bit */
    for (int i = 0; i < m->n_tensors; i++)
        if (m->t[i].enc == SP_ENC_F32 || m->t[i].enc == SP_ENC_I64 || m->t[i].enc == SP_ENC_I32)
            check(memcmp(m2.t[i].data, m->t[i].data, (size_t)m->t[i].nbytes) == 0);
    sp_msg_clear(&m2);
    sp_buf_free(&b);
}

static void run_one(const uint8_t *data, size_t size, const sp_proto_limits *lim)
{
    sp_err perr = {0}, derr = {0};
    uint64_t body = 0;
    sp_status ps = sp_msg_peek(data, size, lim, &body, &perr);
    sp_msg m;
    sp_status ds = sp_msg_decode(&m, data, size, lim, &derr);
    check(sp_msg_reject_code(data, size, ds) != NULL);
    if (ds != SP_OK) {
        check(m.meta == NULL && derr.msg[0] != '\0');
        /* a header refusal is the same from both */
        check(ps == SP_OK || (ps == ds && strcmp(perr.msg, derr.msg) == 0));
        sp_msg_clear(&m);
        return;
    }
    check(ps == SP_OK && body + SP_PROTO_HEADER_SIZE == size && sp_msg_meta(&m) != NULL);
    values v = {0};
    convert_all(&m, &v, &derr);
    (void)sp_meta_str(&m, "code");
    int64_t x;
    (void)sp_meta_int(&m, "start", &x);
    reencode(&m, &v);
    values_free(&v);
    sp_msg_clear(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sp_proto_limits def = sp_proto_default_limits();
    sp_proto_limits tight = {512, 64}; /* the limit paths too */
    run_one(data, size, &def);
    run_one(data, size, &tight);
    return 0;
}

#else /* FUZZ_PROTO_SEEDS: write the seed corpus */

static int write_seed(const char *dir, const char *name, sp_msg_type type, uint16_t flags, const char *meta,
                      const sp_tensor_src *t, int n)
{
    sp_buf b = {0};
    sp_err err = {0};
    char path[1024];
    if (sp_msg_encode(&b, type, flags, 7, meta, t, n, &err) != SP_OK) {
        fprintf(stderr, "%s: %s\n", name, err.msg);
        return 1;
    }
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "wb");
    int bad = !fp || fwrite(b.data, 1, b.len, fp) != b.len;
    if (fp)
        bad |= fclose(fp) != 0;
    if (bad)
        fprintf(stderr, "%s: cannot write\n", path);
    sp_buf_free(&b);
    return bad;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    const char *d = argv[1];
    float x[80];
    for (int i = 0; i < 80; i++)
        x[i] = (float)(i % 9 - 4) * 0.375f;
    int64_t hypo[2] = {1, 0};
    int32_t ids[3] = {1, -1, 32000};
    sp_tensor_src hidden = {SP_ENC_F32, 3, {1, 2, 4}, x, NULL};
    sp_tensor_src prompts = {SP_ENC_F16, 4, {2, 1, 1, 4}, x, NULL};
    sp_tensor_src step[2] = {{SP_ENC_BF16, 3, {2, 1, 4}, x, NULL}, {SP_ENC_I64, 1, {2}, NULL, hypo}};
    sp_tensor_src q8 = {SP_ENC_Q8, 2, {1, 70}, x, NULL};
    sp_tensor_src back[4] = {hidden, {SP_ENC_F16, 3, {1, 2, 4}, x, NULL}, prompts, {SP_ENC_I32, 1, {3}, NULL, ids}};
    sp_tensor_src fwd[2] = {hidden, prompts};
    int bad = 0;
    bad |= write_seed(d, "hello.bin", SP_MSG_HELLO, 0, "{\"version\":\"1.0\",\"client\":\"sepal 0.1.0\"}", NULL, 0);
    bad |= write_seed(d, "info-reply.bin", SP_MSG_INFO, SP_MSG_F_REPLY,
                      "{\"model\":\"stories15M\",\"start\":0,\"end\":6,\"protocol\":\"1.0\",\"hidden_size\":288,"
                      "\"sessions\":[],\"inference_rps\":12.5}", NULL, 0);
    bad |= write_seed(d, "forward.bin", SP_MSG_FORWARD, 0, "{\"start\":0,\"end\":2}", fwd, 2);
    bad |= write_seed(d, "step.bin", SP_MSG_INFERENCE_STEP, 0, "{\"session\":3,\"start_from_position\":1}", step, 2);
    bad |= write_seed(d, "q8-reply.bin", SP_MSG_FORWARD, SP_MSG_F_REPLY, "{}", &q8, 1);
    bad |= write_seed(d, "backward.bin", SP_MSG_BACKWARD, 0, "{\"start\":1,\"end\":3,\"reply_encoding\":\"bf16\"}",
                      back, 4);
    bad |= write_seed(d, "error.bin", SP_MSG_ERROR, SP_MSG_F_REPLY,
                      "{\"code\":\"shape\",\"message\":\"hidden: expected [1, 2, 288]\"}", NULL, 0);
    bad |= write_seed(d, "ping.bin", SP_MSG_PING, 0, NULL, NULL, 0);
    return bad;
}

#endif
