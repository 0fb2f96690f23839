/* fuzz_proto.c - libFuzzer target for the wire protocol decoder (built and run by tests/fuzz/run.sh).
 *
 * Each input is taken as one message: sp_msg_peek and sp_msg_decode must never crash, leak or read outside
 * it, and must agree (a decoded message has a sound header of exactly its length, and metadata cJSON parses as an
 * object). A message that decodes has every tensor converted, and is then encoded again from what was decoded and
 * decoded once more: that must work too (except Q8 of non-finite values, which the encoder refuses by design), with
 * the same shapes. Every typed metadata decoder (proto.h) runs on it: each refuses it with a message or gives a
 * struct that encodes (within SP_META_CAP, ERROR aside) to metadata that decodes to the same struct, byte for byte.
 * Violations call abort(), which libFuzzer reports as a crash with the input saved.
 *
 * Built with -DFUZZ_PROTO_SEEDS instead, it is a small program that writes the seed corpus:
 *   fuzz_proto_seeds DIR   (tests/fuzz/run.sh --write-seeds regenerates tests/fuzz/corpus) */
#include <cJSON.h>
#include <stdalign.h>
#include <stddef.h>
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
    char *meta = sp_msg_meta_copy(m);
    check(meta != NULL);
    sp_buf b = {0};
    sp_err err = {0};
    sp_status s = sp_msg_encode(&b, m->type, m->flags, m->request_id, meta, src, m->n_tensors, &err);
    free(meta);
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

/* decode -> encode -> decode gives the same struct. */
static void typed_one(const sp_msg *m, const sp_meta_codec *c)
{
    static alignas(max_align_t) unsigned char a[4096], b[4096];
    static char json[16384];
    check(c->size <= sizeof a);
    sp_err err = {0};
    sp_status s = c->decode(m, a, &err);
    check(s == SP_OK || (s == SP_ERR_FORMAT && err.msg[0] && err.code == s));
    if (s)
        return;
    size_t cap = strcmp(c->name, "error_reply") ? SP_META_CAP : sizeof json;
    check(c->encode(a, json, cap, &err) == SP_OK);
    sp_buf buf = {0};
    check(sp_msg_encode(&buf, m->type, m->flags, 1, json, NULL, 0, &err) == SP_OK);
    sp_proto_limits big = {UINT64_MAX, UINT32_MAX};
    sp_msg m2;
    check(sp_msg_decode(&m2, buf.data, buf.len, &big, &err) == SP_OK);
    check(c->decode(&m2, b, &err) == SP_OK);
    check(memcmp(a, b, c->size) == 0);
    sp_msg_clear(&m2);
    sp_buf_free(&buf);
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
        check(m.meta_json == NULL && derr.msg[0] != '\0');
        /* a header refusal is the same from both */
        check(ps == SP_OK || (ps == ds && strcmp(perr.msg, derr.msg) == 0));
        sp_msg_clear(&m);
        return;
    }
    check(ps == SP_OK && body + SP_PROTO_HEADER_SIZE == size);
    cJSON *j = m.meta_len ? cJSON_ParseWithLength(m.meta_json, m.meta_len) : cJSON_CreateObject();
    check(cJSON_IsObject(j)); /* whatever our reader takes, cJSON takes */
    cJSON_Delete(j);
    values v = {0};
    convert_all(&m, &v, &derr);
    for (int i = 0; i < SP_META_CODECS; i++)
        typed_one(&m, &sp_meta_codecs[i]);
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

/* One seed per typed metadata struct (proto.h), its fields set, written by its encoder. */
static int typed_seeds(const char *d, const sp_tensor_src *step)
{
    char m[SP_META_CAP];
    int bad = 0;
    sp_hello_reply hr = {.version = "1.1", .server = "sepal-server 0.1.0", .model = "stories15M",
                         .config = 0x0123456789abcdefull, .dtype = "f32", .blocks = 6, .start = 2, .end = 4,
                         .id = "00112233aabbccdd", .bulk_port = 4002, .bulk_token = 18446744073709551615ull};
    bad |= sp_hello_reply_encode(&hr, m, sizeof m, NULL) ||
           write_seed(d, "hello-reply.bin", SP_MSG_HELLO, SP_MSG_F_REPLY, m, NULL, 0);
    sp_info_reply ir = {.model = "stories15M", .architecture = "LlamaForCausalLM", .start = 0, .end = 6,
                        .dtype = "f32", .weight_bytes = 12345678, .protocol = "1.1", .hidden_size = 288,
                        .family = "llama", .kv_heads = 6, .head_dim = 48, .cache_bytes_per_token = 2304,
                        .cache_bytes_total = 1 << 20, .cache_tokens_total = 8192, .cache_tokens_available = 4096,
                        .max_batch_tokens = 1024, .max_length = 2048, .inference_rps = 123.25, .forward_tps = 4567.5,
                        .public_name = "n\xc3\xa9", .sessions = 1, .kept_bytes = 0, .requests = 7,
                        .transport = {.budget = 1 << 30, .swarm_key = 1}};
    bad |= sp_info_reply_encode(&ir, m, sizeof m, NULL) ||
           write_seed(d, "info-reply-full.bin", SP_MSG_INFO, SP_MSG_F_REPLY, m, NULL, 0);
    sp_forward_req fq = {.start = 0, .end = 2, .keep = 5, .reply_encoding = SP_ENC_Q8};
    bad |= sp_forward_req_encode(&fq, m, sizeof m, NULL) ||
           write_seed(d, "forward-keep.bin", SP_MSG_FORWARD, 0, m, step, 1);
    sp_backward_req bq = {.start = 0, .end = 2, .keep = 5, .reply_encoding = -1};
    bad |= sp_backward_req_encode(&bq, m, sizeof m, NULL) ||
           write_seed(d, "backward-kept.bin", SP_MSG_BACKWARD, 0, m, NULL, 0);
    sp_open_req oq = {.start = 0, .end = 6, .max_length = 64, .batch = 2};
    bad |= sp_open_req_encode(&oq, m, sizeof m, NULL) ||
           write_seed(d, "open.bin", SP_MSG_INFERENCE_OPEN, 0, m, NULL, 0);
    sp_open_reply orp = {.session = 3, .max_length = 64};
    bad |= sp_open_reply_encode(&orp, m, sizeof m, NULL) ||
           write_seed(d, "open-reply.bin", SP_MSG_INFERENCE_OPEN, SP_MSG_F_REPLY, m, NULL, 0);
    sp_step_reply sr = {.position = 9};
    bad |= sp_step_reply_encode(&sr, m, sizeof m, NULL) ||
           write_seed(d, "step-reply.bin", SP_MSG_INFERENCE_STEP, SP_MSG_F_REPLY, m, step, 1);
    sp_close_req cq = {.session = 3};
    bad |= sp_close_req_encode(&cq, m, sizeof m, NULL) ||
           write_seed(d, "close.bin", SP_MSG_INFERENCE_CLOSE, 0, m, NULL, 0);
    sp_auth_hello ah = {.swarm = "0011223344556677"};
    memset(ah.nonce, 0xa5, sizeof ah.nonce);
    bad |= sp_auth_hello_encode(&ah, m, sizeof m, NULL) || write_seed(d, "auth-hello.bin", SP_MSG_AUTH, 0, m, NULL, 0);
    sp_auth_challenge ac;
    memset(ac.nonce, 0x5a, sizeof ac.nonce);
    memset(ac.proof, 0x3c, sizeof ac.proof);
    bad |= sp_auth_challenge_encode(&ac, m, sizeof m, NULL) ||
           write_seed(d, "auth-challenge.bin", SP_MSG_AUTH, SP_MSG_F_REPLY, m, NULL, 0);
    sp_auth_proof ap;
    memset(ap.proof, 0xc3, sizeof ap.proof);
    bad |= sp_auth_proof_encode(&ap, m, sizeof m, NULL) || write_seed(d, "auth-proof.bin", SP_MSG_AUTH, 0, m, NULL, 0);
    sp_auth_verdict av = {.ok = 1};
    bad |= sp_auth_verdict_encode(&av, m, sizeof m, NULL) ||
           write_seed(d, "auth-verdict.bin", SP_MSG_AUTH, SP_MSG_F_REPLY, m, NULL, 0);
    /* what the decoders treat apart: escapes, -0, a subnormal, repeated keys (the first counts), unknown ones */
    bad |= write_seed(d, "info-reply-edge.bin", SP_MSG_INFO, SP_MSG_F_REPLY,
                      "{\"model\":\"m\\u0001\\n\\\"\\u00e9\",\"start\":0,\"end\":1,\"inference_rps\":-0,"
                      "\"forward_tps\":1e-320,\"start\":5,\"x\":[{\"end\":0}],\"transport\":{\"busy\":1,\"busy\":2}}",
                      NULL, 0);
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
    return bad | typed_seeds(d, step);
}

#endif
