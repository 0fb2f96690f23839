/* test_proto.c - the wire protocol: round trips of every message type and encoding, the Q8 scheme against
 * an independent computation, a table of malformed messages (each a mutation of a valid one) that must be
 * refused with a useful message, limits, and a hand-written byte vector that pins the layout documented in
 * share/doc/protocol.md. */
#include <cJSON.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "proto.h"
#include "rng.h"
#include "testutil.h"

#define MAXN 10000 /* largest tensor the round trips build */

/* ---------------------------------------------------------------------------------------------- */
/* helpers */

static void wr16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void wr32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void wr64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static float rdf32(const uint8_t *p)
{
    uint32_t u = rd32(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static int has(const char *s, const char *frag) { return !frag || strstr(s, frag) != NULL; }

/* Encodes and asserts success. */
static void enc_ok(sp_buf *b, sp_msg_type type, uint16_t flags, uint64_t rid, const char *meta, const sp_tensor_src *t,
                   int n)
{
    sp_err err = {0};
    sp_status s = sp_msg_encode(b, type, flags, rid, meta, t, n, &err);
    ck_assert_msg(s == SP_OK, "encode %s n=%d: %s", sp_msg_type_name(type), n, err.msg);
    ck_assert_ptr_eq(b->data, b->base + SP_BUF_HEADROOM);
}

/* ---------------------------------------------------------------------------------------------- */
/* names and sizes */

START_TEST(t_names_sizes)
{
    ck_assert_str_eq(sp_msg_type_name(SP_MSG_HELLO), "HELLO");
    ck_assert_str_eq(sp_msg_type_name(SP_MSG_INFERENCE_STEP), "INFERENCE_STEP");
    ck_assert_str_eq(sp_msg_type_name(SP_MSG_ERROR), "ERROR");
    ck_assert_str_eq(sp_msg_type_name(0), "?");
    ck_assert_str_eq(sp_msg_type_name(SP_MSG__END), "?");
    const char *names[] = {"f32", "f16", "bf16", "q8", "i64", "i32"};
    for (int e = 0; e < SP_ENC__END; e++) {
        ck_assert_str_eq(sp_encoding_name(e), names[e]);
        ck_assert_int_eq(sp_encoding_from_name(names[e]), e);
        ck_assert_int_eq(sp_encoding_is_float(e), e <= SP_ENC_Q8);
    }
    ck_assert_int_eq(sp_encoding_from_name("F32"), -1);
    ck_assert_int_eq(sp_encoding_from_name(NULL), -1);
    ck_assert_str_eq(sp_encoding_name(6), "?");
    int ok = 0;
    ck_assert_uint_eq(sp_encoding_bytes(SP_ENC_F32, 5, &ok), 20);
    ck_assert_int_eq(ok, 1);
    ck_assert_uint_eq(sp_encoding_bytes(SP_ENC_F16, 5, &ok), 10);
    ck_assert_uint_eq(sp_encoding_bytes(SP_ENC_BF16, 5, &ok), 10);
    ck_assert_uint_eq(sp_encoding_bytes(SP_ENC_I64, 5, &ok), 40);
    ck_assert_uint_eq(sp_encoding_bytes(SP_ENC_I32, 5, &ok), 20);
    ck_assert_uint_eq(sp_encoding_bytes(SP_ENC_Q8, 1, &ok), 5);
    ck_assert_uint_eq(sp_encoding_bytes(SP_ENC_Q8, 64, &ok), 68);
    ck_assert_uint_eq(sp_encoding_bytes(SP_ENC_Q8, 65, &ok), 73);
    ck_assert_uint_eq(sp_encoding_bytes(SP_ENC_Q8, 128, &ok), 136);
    ck_assert_uint_eq(sp_encoding_bytes(SP_ENC_F32, UINT64_MAX / 2, &ok), 0);
    ck_assert_int_eq(ok, 0);
    ck_assert_uint_eq(sp_encoding_bytes(SP_ENC_Q8, UINT64_MAX - 10, &ok), 0);
    ck_assert_int_eq(ok, 0);
    ck_assert_uint_eq(sp_encoding_bytes(99, 1, &ok), 0);
    ck_assert_int_eq(ok, 0);
    sp_proto_limits l = sp_proto_default_limits();
    ck_assert_uint_eq(l.max_message, 256ull << 20);
    ck_assert_uint_eq(l.max_meta, 64u << 10);
}
END_TEST

START_TEST(t_buf)
{
    sp_buf b = {0};
    sp_err err = {0};
    ck_assert_int_eq(sp_buf_append(&b, "abc", 3, &err), SP_OK);
    ck_assert_ptr_eq(b.data, b.base + SP_BUF_HEADROOM);
    ck_assert_uint_eq(b.len, 3);
    ck_assert_int_eq(sp_buf_reserve(&b, 1 << 20, &err), SP_OK);
    ck_assert_uint_ge(b.cap, 1 << 20);
    ck_assert_ptr_eq(b.data, b.base + SP_BUF_HEADROOM);
    ck_assert_int_eq(memcmp(b.data, "abc", 3), 0); /* reserve keeps existing bytes */
    ck_assert_uint_eq(b.len, 3);
    memset(b.base, 0xaa, SP_BUF_HEADROOM); /* the headroom is writable */
    for (int i = 0; i < 1000; i++)
        ck_assert_int_eq(sp_buf_append(&b, "0123456789", 10, &err), SP_OK);
    ck_assert_uint_eq(b.len, 10003);
    ck_assert_int_eq(memcmp(b.data + 9993, "0123456789", 10), 0);
    ck_assert_int_eq(sp_buf_append(&b, NULL, 0, &err), SP_OK);
    ck_assert_int_ne(sp_buf_append(&b, NULL, 5, &err), SP_OK);
    /* encoding into a used buffer resets it but keeps the headroom */
    enc_ok(&b, SP_MSG_PING, 0, 1, NULL, NULL, 0);
    ck_assert_uint_eq(b.len, SP_PROTO_HEADER_SIZE);
    sp_buf_free(&b);
    ck_assert_ptr_null(b.base);
    ck_assert_ptr_null(b.data);
    ck_assert_uint_eq(b.len + b.cap, 0);
    sp_buf_free(&b); /* twice is harmless */
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* round trips */

static float fdata[SP_PROTO_MAX_TENSORS][MAXN];
static int64_t i64data[SP_PROTO_MAX_TENSORS][MAXN];
static int32_t i32data[SP_PROTO_MAX_TENSORS][MAXN];
static float fout[MAXN];
static int64_t iout[MAXN];

static const sp_encoding ENCS[] = {SP_ENC_F32, SP_ENC_F16, SP_ENC_BF16, SP_ENC_Q8, SP_ENC_I64, SP_ENC_I32};

/* Q8 checked against a computation in double precision: the scale must be exactly absmax/127 rounded to
 * float, each code within rounding of x/scale, and the decoded value within half a step of x. */
static void check_q8(const float *x, const sp_tensor_view *t, const float *dec)
{
    const uint8_t *p = t->data;
    for (uint64_t b0 = 0; b0 < t->numel; b0 += 64) {
        uint64_t nb = t->numel - b0 < 64 ? t->numel - b0 : 64;
        double amax = 0;
        for (uint64_t j = 0; j < nb; j++)
            amax = fmax(amax, fabs((double)x[b0 + j]));
        float scale = rdf32(p);
        ck_assert_msg(scale == (float)(amax / 127.0), "block %llu: scale %.9g, expected %.9g", (unsigned long long)b0,
                      (double)scale, amax / 127.0);
        for (uint64_t j = 0; j < nb; j++) {
            int q = p[4 + j] < 128 ? p[4 + j] : p[4 + j] - 256;
            ck_assert_int_ge(q, -127);
            ck_assert_int_le(q, 127);
            double ideal = scale > 0 ? (double)x[b0 + j] / scale : 0;
            ck_assert_msg(fabs(q - ideal) <= 0.5 + 1e-4, "value %llu: code %d for %.6f", (unsigned long long)(b0 + j),
                          q, ideal);
            double e = fabs((double)dec[b0 + j] - (double)x[b0 + j]);
            ck_assert_msg(e <= amax / 127.0 / 2 * (1 + 1e-5), "value %llu: error %g > %g", (unsigned long long)(b0 + j),
                          e, amax / 127.0 / 2);
        }
        p += 4 + nb;
    }
}

/* Fills tensor i of a round trip: exactly representable values for f32/f16/bf16 (k/8, |k| <= 256),
 * random ones for q8 (with an all-zero first block in tensor 1), wide integers. */
static void fill_tensor(sp_tensor_src *t, int i, sp_encoding enc, int salt, sp_rng *r)
{
    memset(t, 0, sizeof *t);
    t->enc = enc;
    t->rank = 1 + (i + salt) % 4;
    uint64_t numel = 1;
    for (int k = 0; k < t->rank; k++) {
        t->shape[k] = 1 + (i * 7 + k * 3 + salt) % 5;
        if (k == 0 && enc == SP_ENC_Q8)
            t->shape[0] = 60 + (i * 5 + salt) % 19; /* around one block: full and short last blocks */
        numel *= (uint64_t)t->shape[k];
    }
    ck_assert_uint_le(numel, MAXN);
    for (uint64_t j = 0; j < numel; j++) {
        if (enc == SP_ENC_Q8)
            fdata[i][j] = (i == 1 && j < 64) ? 0.0f : (sp_rng_f32(r) * 2 - 1) * (float)(1 + i * 10);
        else
            fdata[i][j] = (float)((int)(sp_rng_u32(r) % 513) - 256) / 8.0f;
        i64data[i][j] = (int64_t)((uint64_t)sp_rng_u32(r) << 31) - (1ll << 61);
        i32data[i][j] = (int32_t)(sp_rng_u32(r) - 2147483648u);
    }
    t->f32 = sp_encoding_is_float(enc) ? fdata[i] : NULL;
    t->raw = enc == SP_ENC_I64 ? (const void *)i64data[i] : enc == SP_ENC_I32 ? (const void *)i32data[i] : NULL;
}

static void check_tensor(const sp_tensor_src *src, const sp_tensor_view *v, int i)
{
    sp_err err = {0};
    ck_assert_int_eq(v->enc, src->enc);
    ck_assert_int_eq(v->rank, src->rank);
    uint64_t numel = 1;
    for (int k = 0; k < SP_PROTO_MAX_RANK; k++) {
        ck_assert_int_eq(v->shape[k], k < src->rank ? src->shape[k] : 0);
        numel *= k < src->rank ? (uint64_t)src->shape[k] : 1;
    }
    ck_assert_uint_eq(v->numel, numel);
    ck_assert_uint_eq(v->nbytes, sp_encoding_bytes(src->enc, numel, NULL));
    ck_assert_int_eq(sp_tensor_all_finite(v), 1);
    if (!sp_encoding_is_float(src->enc)) {
        ck_assert_int_eq(sp_tensor_to_i64(v, iout, &err), SP_OK);
        for (uint64_t j = 0; j < numel; j++)
            ck_assert_int_eq(iout[j], src->enc == SP_ENC_I64 ? i64data[i][j] : i32data[i][j]);
        ck_assert_int_eq(sp_tensor_to_f32(v, fout, &err), SP_ERR_ARG);
        return;
    }
    ck_assert_int_eq(sp_tensor_to_f32(v, fout, &err), SP_OK);
    ck_assert_int_eq(sp_tensor_to_i64(v, iout, &err), SP_ERR_ARG);
    if (src->enc == SP_ENC_Q8)
        check_q8(src->f32, v, fout);
    else
        ck_assert_int_eq(memcmp(fout, src->f32, numel * sizeof(float)), 0);
}

/* Every type, every encoding (and a mix), 0..8 tensors, both flag values. */
START_TEST(t_roundtrip_all)
{
    sp_rng r;
    sp_rng_seed(&r, 1234);
    sp_buf b = {0};
    sp_tensor_src src[SP_PROTO_MAX_TENSORS];
    int cases = 0;
    for (int type = 1; type < SP_MSG__END; type++)
        for (int e = 0; e <= SP_ENC__END; e++) /* e == SP_ENC__END: mixed encodings */
            for (int n = 0; n <= SP_PROTO_MAX_TENSORS; n++) {
                for (int i = 0; i < n; i++)
                    fill_tensor(&src[i], i, e < SP_ENC__END ? ENCS[e] : ENCS[(i + type) % SP_ENC__END], type + n, &r);
                char meta[96];
                snprintf(meta, sizeof meta, "{\"type\":%d,\"n\":%d,\"name\":\"h\\u00e9llo \xe2\x9c\x93\"}", type, n);
                uint16_t flags = (uint16_t)((type + n) % 2 ? SP_MSG_F_REPLY : 0);
                uint64_t rid = ((uint64_t)type << 40) | ((uint64_t)e << 20) | (uint64_t)n;
                enc_ok(&b, (sp_msg_type)type, flags, rid, meta, src, n);
                sp_msg m;
                sp_err err = {0};
                uint64_t body = 0;
                ck_assert_int_eq(sp_msg_peek(b.data, b.len, NULL, &body, &err), SP_OK);
                ck_assert_uint_eq(body + SP_PROTO_HEADER_SIZE, b.len);
                ck_assert_msg(sp_msg_decode(&m, b.data, b.len, NULL, &err) == SP_OK, "decode: %s", err.msg);
                ck_assert_int_eq(m.major, SP_PROTO_MAJOR);
                ck_assert_int_eq(m.minor, SP_PROTO_MINOR);
                ck_assert_int_eq(m.type, type);
                ck_assert_int_eq(m.flags, flags);
                ck_assert_uint_eq(m.request_id, rid);
                ck_assert_int_eq(m.n_tensors, n);
                ck_assert(m.meta_len == strlen(meta) && !memcmp(m.meta_json, meta, m.meta_len)); /* as it was */
                for (int i = 0; i < n; i++)
                    check_tensor(&src[i], &m.t[i], i);
                sp_msg_clear(&m);
                ck_assert_ptr_null(m.meta_json);
                cases++;
            }
    ck_assert_int_eq(cases, (SP_MSG__END - 1) * 7 * 9);
    sp_buf_free(&b);
}
END_TEST

START_TEST(t_empty_meta_is_object)
{
    sp_buf b = {0};
    sp_msg m;
    sp_err err = {0};
    enc_ok(&b, SP_MSG_INFO, 0, 5, NULL, NULL, 0);
    ck_assert_uint_eq(b.len, SP_PROTO_HEADER_SIZE);
    ck_assert_int_eq(sp_msg_decode(&m, b.data, b.len, NULL, &err), SP_OK);
    ck_assert_int_eq(m.meta_len, 0);
    char *copy = sp_msg_meta_copy(&m); /* what a PING reply echoes */
    ck_assert_str_eq(copy, "");
    free(copy);
    sp_msg_clear(&m);
    /* for a typed decoder it is {}: every field absent */
    enc_ok(&b, SP_MSG_INFERENCE_CLOSE, 0, 5, NULL, NULL, 0);
    ck_assert_int_eq(sp_msg_decode(&m, b.data, b.len, NULL, &err), SP_OK);
    sp_close_req q;
    ck_assert_int_eq(sp_close_req_decode(&m, &q, &err), SP_ERR_FORMAT);
    ck_assert_str_eq(err.msg, "INFERENCE_CLOSE request: 'session' is missing");
    sp_msg_clear(&m);
    enc_ok(&b, SP_MSG_INFO, 0, 5, "", NULL, 0); /* "" is the same as NULL */
    ck_assert_uint_eq(b.len, SP_PROTO_HEADER_SIZE);
    enc_ok(&b, SP_MSG_INFO, 0, 5, " \t{ }\n ", NULL, 0); /* whitespace around the object is JSON */
    ck_assert_int_eq(sp_msg_decode(&m, b.data, b.len, NULL, &err), SP_OK);
    sp_msg_clear(&m);
    sp_buf_free(&b);
}
END_TEST

START_TEST(t_q8_edges)
{
    float x[130];
    for (int i = 0; i < 130; i++)
        x[i] = i < 64 ? 0.0f : (i % 2 ? 1.0f : -1.0f) * (float)(i - 63) / 66.0f;
    x[100] = -2.0f; /* absmax of block 1 is negative: code -127 */
    sp_tensor_src t = {SP_ENC_Q8, 2, {2, 65}, x, NULL};
    sp_buf b = {0};
    sp_msg m;
    sp_err err = {0};
    enc_ok(&b, SP_MSG_FORWARD, 0, 1, NULL, &t, 1);
    ck_assert_int_eq(sp_msg_decode(&m, b.data, b.len, NULL, &err), SP_OK);
    ck_assert_uint_eq(m.t[0].nbytes, 3 * 4 + 130);
    const uint8_t *p = m.t[0].data;
    ck_assert(rdf32(p) == 0.0f); /* all-zero block: scale 0, codes 0 */
    for (int j = 0; j < 64; j++)
        ck_assert_int_eq(p[4 + j], 0);
    ck_assert(rdf32(p + 68) == 2.0f / 127.0f);
    ck_assert_int_eq(p[68 + 4 + 100 - 64], 0x81); /* -127 */
    ck_assert_int_eq(sp_tensor_to_f32(&m.t[0], fout, &err), SP_OK);
    check_q8(x, &m.t[0], fout);
    ck_assert(fabsf(fout[100] + 2.0f) <= 1e-6f);
    ck_assert_int_eq(sp_tensor_all_finite(&m.t[0]), 1);
    sp_msg_clear(&m);

    /* NaN and Inf cannot be quantised: refused, and the buffer is left empty */
    for (int k = 0; k < 3; k++) {
        x[77] = k == 0 ? NAN : k == 1 ? INFINITY : -INFINITY;
        ck_assert_int_eq(sp_msg_encode(&b, SP_MSG_FORWARD, 0, 1, NULL, &t, 1, &err), SP_ERR_ARG);
        ck_assert_msg(has(err.msg, "tensor 0: non-finite value") && has(err.msg, "index 77"), "%s", err.msg);
        ck_assert_uint_eq(b.len, 0);
    }
    /* values too small for a normal scale still encode (to zeros) */
    float tiny[3] = {1e-44f, -1e-45f, 0};
    sp_tensor_src tt = {SP_ENC_Q8, 1, {3}, tiny, NULL};
    enc_ok(&b, SP_MSG_FORWARD, 0, 1, NULL, &tt, 1);
    ck_assert_int_eq(sp_msg_decode(&m, b.data, b.len, NULL, &err), SP_OK);
    ck_assert_int_eq(sp_tensor_to_f32(&m.t[0], fout, &err), SP_OK);
    for (int j = 0; j < 3; j++)
        ck_assert(fabsf(fout[j] - tiny[j]) <= 1e-44f);
    sp_msg_clear(&m);
    sp_buf_free(&b);
}
END_TEST

/* f16/bf16 rounding and non-finite values travel as they are; the receiver checks with all_finite. */
START_TEST(t_finite_and_conversions)
{
    float x[4] = {1.0f, 1e5f, 3.0f, 0.1f}; /* 1e5 overflows f16 to inf */
    sp_tensor_src t[4] = {{SP_ENC_F32, 1, {4}, x, NULL}, {SP_ENC_F16, 1, {4}, x, NULL}, {SP_ENC_BF16, 1, {4}, x, NULL},
                          {SP_ENC_Q8, 1, {4}, x, NULL}};
    sp_buf b = {0};
    sp_msg m;
    sp_err err = {0};
    enc_ok(&b, SP_MSG_FORWARD, 0, 1, NULL, t, 4);
    ck_assert_int_eq(sp_msg_decode(&m, b.data, b.len, NULL, &err), SP_OK);
    ck_assert_int_eq(sp_tensor_all_finite(&m.t[0]), 1);
    ck_assert_int_eq(sp_tensor_all_finite(&m.t[1]), 0);
    ck_assert_int_eq(sp_tensor_all_finite(&m.t[2]), 1);
    ck_assert_int_eq(sp_tensor_all_finite(&m.t[3]), 1);
    ck_assert_int_eq(sp_tensor_to_f32(&m.t[2], fout, &err), SP_OK);
    ck_assert(fout[3] == sp_bf16_to_f32(sp_f32_to_bf16(0.1f)));
    ck_assert_int_eq(sp_tensor_to_f32(&m.t[1], fout, &err), SP_OK);
    ck_assert(fout[3] == sp_f16_to_f32(sp_f32_to_f16(0.1f)));
    ck_assert(isinf(fout[1]));
    sp_msg_clear(&m);

    x[1] = NAN;
    enc_ok(&b, SP_MSG_FORWARD, 0, 1, NULL, t, 3);
    ck_assert_int_eq(sp_msg_decode(&m, b.data, b.len, NULL, &err), SP_OK);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(sp_tensor_all_finite(&m.t[i]), 0);
    sp_msg_clear(&m);

    /* a Q8 scale that is NaN (crafted by hand: our encoder never writes one) */
    x[1] = 2.0f;
    enc_ok(&b, SP_MSG_FORWARD, 0, 1, NULL, &t[3], 1);
    wr32(b.data + b.len - 8, 0x7fc00000u);
    ck_assert_int_eq(sp_msg_decode(&m, b.data, b.len, NULL, &err), SP_OK);
    ck_assert_int_eq(sp_tensor_all_finite(&m.t[0]), 0);
    sp_msg_clear(&m);

    /* integers: negative values survive both widths; all_finite is trivially true */
    int32_t i32[3] = {-1, INT32_MIN, INT32_MAX};
    int64_t i64[3] = {-1, INT64_MIN, INT64_MAX};
    sp_tensor_src it[2] = {{SP_ENC_I32, 1, {3}, NULL, i32}, {SP_ENC_I64, 1, {3}, NULL, i64}};
    enc_ok(&b, SP_MSG_INFERENCE_STEP, 0, 1, NULL, it, 2);
    ck_assert_int_eq(sp_msg_decode(&m, b.data, b.len, NULL, &err), SP_OK);
    ck_assert_int_eq(sp_tensor_to_i64(&m.t[0], iout, &err), SP_OK);
    ck_assert(iout[0] == -1 && iout[1] == INT32_MIN && iout[2] == INT32_MAX);
    ck_assert_int_eq(sp_tensor_to_i64(&m.t[1], iout, &err), SP_OK);
    ck_assert(iout[0] == -1 && iout[1] == INT64_MIN && iout[2] == INT64_MAX);
    ck_assert_int_eq(sp_tensor_all_finite(&m.t[0]), 1);
    ck_assert_int_eq(sp_tensor_to_f32(&m.t[0], fout, &err), SP_ERR_ARG);
    ck_assert(has(err.msg, "i32"));
    /* a hand-made inconsistent view is refused, not read past */
    sp_tensor_view bad = m.t[1];
    bad.numel = 1000;
    ck_assert_int_eq(sp_tensor_to_i64(&bad, iout, &err), SP_ERR_ARG);
    ck_assert_int_eq(sp_tensor_all_finite(&bad), 0);
    sp_msg_clear(&m);
    sp_buf_free(&b);
}
END_TEST

/* Numbers as the typed decoders read them: JSON numbers are doubles, so an integer field takes 3 and 3.0 and 3e0,
 * and refuses 3.5, "3", 1e300, null, [1], and anything outside its range (the error says which and why). */
START_TEST(t_meta_numbers)
{
    static const struct {
        const char *meta;
        int ok;
        int64_t start_from;
        const char *why;
    } cases[] = {
        {"{\"session\":3}", 1, -1, NULL},
        {"{\"session\":3,\"start_from_position\":7}", 1, 7, NULL},
        {"{\"session\":3,\"start_from_position\":7.0}", 1, 7, NULL},
        {"{\"session\":3,\"start_from_position\":7e0}", 1, 7, NULL},
        {"{\"session\":3,\"start_from_position\":-0}", 1, 0, NULL},
        {"{\"session\":3,\"start_from_position\":2147483647}", 1, 2147483647, NULL},
        {"{\"session\":3,\"start_from_position\":3.5}", 0, 0, "'start_from_position' must be an integer in "
                                                                  "0..2147483647, got 3.5"},
        {"{\"session\":3,\"start_from_position\":-1}", 0, 0, "got -1"},
        {"{\"session\":3,\"start_from_position\":2147483648}", 0, 0, "got 2147483648"},
        {"{\"session\":3,\"start_from_position\":1e300}", 0, 0, "got 1e300"},
        {"{\"session\":3,\"start_from_position\":\"3\"}", 0, 0, "must be an integer in 0..2147483647, got a string"},
        {"{\"session\":3,\"start_from_position\":null}", 0, 0, "must be an integer in 0..2147483647, got null"},
        {"{\"session\":3,\"start_from_position\":[1]}", 0, 0, "got an array"},
        {"{\"session\":9007199254740991}", 1, -1, NULL},
        {"{\"session\":9007199254740992}", 0, 0, "'session' must be an integer in 0..9007199254740991"},
        {"{\"session\":9007199254740993}", 0, 0, "got 9007199254740993"}, /* reads as 2^53 */
        {"{\"session\":-3}", 0, 0, "'session' must be an integer"},
        {"{\"session\":3,\"reply_encoding\":\"i64\"}", 0, 0, "'reply_encoding' names no float encoding: 'i64'"},
        {"{\"session\":3,\"reply_encoding\":7}", 0, 0, "'reply_encoding' must be a string, got a number"},
    };
    sp_buf b = {0};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        sp_msg m;
        sp_err err = {0};
        sp_step_req q;
        enc_ok(&b, SP_MSG_INFERENCE_STEP, 0, 1, cases[i].meta, NULL, 0);
        ck_assert_int_eq(sp_msg_decode(&m, b.data, b.len, NULL, &err), SP_OK);
        sp_status st = sp_step_req_decode(&m, &q, &err);
        if (cases[i].ok) {
            ck_assert_msg(st == SP_OK, "%s: %s", cases[i].meta, err.msg);
            ck_assert_int_eq(q.start_from_position, cases[i].start_from);
            ck_assert_int_eq(q.reply_encoding, -1);
        } else {
            ck_assert_msg(st == SP_ERR_FORMAT && strstr(err.msg, cases[i].why), "%s: %s", cases[i].meta, err.msg);
            ck_assert_msg(!strncmp(err.msg, "INFERENCE_STEP request: ", 24), "%s", err.msg);
        }
        sp_msg_clear(&m);
    }
    sp_buf_free(&b);
}
END_TEST

/* The metadata reader that works in place (no tree): strict JSON, and whatever it accepts cJSON parses too, with
 * the same values; the members are found at the top level only, the first of a repeated key. */
START_TEST(t_meta_reader)
{
    const char *good[] = {
        "{}", " {\"a\" : [ 1 , { \"b\" : [ ] } , \"x\" ] , \"c\":null } ", "{\"a\":-0,\"b\":1.5e-3,\"c\":2E+2}",
        "{\"s\":\"q\\\"b\\\\s\\/\\b\\f\\n\\r\\t\"}", "{\"u\":\"\\u00e9\\ud83d\\ude00\\u0041\"}",
        "\xef\xbb\xbf{\"bom\":true}", "{\"t\":true,\"f\":false,\"n\":null,\"o\":{\"p\":{}}}",
    };
    const char *bad[] = {
        "{\"a\":01}", "{\"a\":1.}", "{\"a\":.5}", "{\"a\":+1}", "{\"a\":1e}", "{\"a\":-}", "{\"a\":0x1}",
        "{\"a\":tru}", "{\"a\":nul}", "{\"a\":NaN}", "{\"a\":1,}", "{,}", "{\"a\"}", "{\"a\" 1}", "{a:1}",
        "{\"a\":[1,]}", "{\"a\":[1 2]}", "{\"a\":\"\x01\"}", "{\"a\":\"\\x\"}", "{\"a\":\"\\u12\"}",
        "{\"a\":\"\\ud800\"}", "{\"a\":\"\\udc00\"}", "{\"a\":\"\\ud800\\u0041\"}", "{\"a\":\"x}",
        "{\"a\":{}", "{\"a\":1}}", "{}{}", "{\"a\":[}", "{\"a\":]}", "\x0c{}", " ",
    };
    sp_buf b = {0};
    sp_msg m;
    sp_err err = {0};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        enc_ok(&b, SP_MSG_PING, 0, 1, good[i], NULL, 0);
        ck_assert_msg(sp_msg_decode(&m, b.data, b.len, NULL, &err) == SP_OK, "%s: %s", good[i], err.msg);
        cJSON *j = cJSON_ParseWithLength(m.meta_json, m.meta_len);
        ck_assert_msg(cJSON_IsObject(j), "cJSON refuses %s", good[i]);
        cJSON_Delete(j);
        sp_msg_clear(&m);
    }
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        ck_assert_msg(sp_msg_encode(&b, SP_MSG_PING, 0, 1, bad[i], NULL, 0, &err) == SP_ERR_ARG, "accepted %s", bad[i]);
    /* nesting as deep as cJSON takes (1000), and no deeper */
    for (int depth = 1000; depth <= 1001; depth++) {
        char *deep = malloc(2 * (size_t)depth + 16);
        size_t n = 0;
        n += (size_t)sprintf(deep, "{\"d\":");
        for (int k = 1; k < depth; k++)
            deep[n++] = '[';
        for (int k = 1; k < depth; k++)
            deep[n++] = ']';
        deep[n++] = '}';
        deep[n] = '\0';
        if (depth == 1000) {
            enc_ok(&b, SP_MSG_PING, 0, 1, deep, NULL, 0);
            ck_assert_int_eq(sp_msg_decode(&m, b.data, b.len, NULL, &err), SP_OK);
            cJSON *j = cJSON_ParseWithLength(m.meta_json, m.meta_len);
            ck_assert_ptr_nonnull(j);
            cJSON_Delete(j);
            sp_msg_clear(&m);
        } else {
            ck_assert_int_eq(sp_msg_encode(&b, SP_MSG_PING, 0, 1, deep, NULL, 0, &err), SP_ERR_ARG);
        }
        free(deep);
    }
    /* values read in place equal cJSON's; members are found at the top level only, the first of a repeated key,
     * escaped keys too; unknown keys (however nested) are skipped */
    const char *meta = "{\"o\":{\"end\":1,\"model\":\"in\"},\"start\":2,\"start\":3,\"end\":5,\"mod\\u0065l\":"
                       "\"a\\u00e9\\n\\\"z\",\"forward_tps\":125e-1,\"inference_rps\":0.1,\"x\":[{\"end\":9}],"
                       "\"transport\":{\"busy\":4,\"busy\":5,\"swarm_key\":true}}";
    enc_ok(&b, SP_MSG_INFO, SP_MSG_F_REPLY, 1, meta, NULL, 0);
    ck_assert_int_eq(sp_msg_decode(&m, b.data, b.len, NULL, &err), SP_OK);
    sp_info_reply a;
    ck_assert_msg(sp_info_reply_decode(&m, &a, &err) == SP_OK, "%s", err.msg);
    ck_assert_int_eq(a.start, 2); /* the first */
    ck_assert_int_eq(a.end, 5);   /* not the nested ones */
    ck_assert_str_eq(a.model, "a\xc3\xa9\n\"z");
    ck_assert(a.forward_tps == 12.5 && a.inference_rps == 0.1);
    ck_assert_int_eq(a.transport.busy, 4);
    ck_assert_int_eq(a.transport.swarm_key, 1);
    ck_assert_int_eq(a.transport.conns, -1); /* absent */
    ck_assert_int_eq(a.sessions, -1);
    ck_assert_str_eq(a.public_name, "");
    cJSON *j = cJSON_ParseWithLength(m.meta_json, m.meta_len);
    ck_assert(cJSON_GetObjectItemCaseSensitive(j, "inference_rps")->valuedouble == a.inference_rps);
    ck_assert(cJSON_GetObjectItemCaseSensitive(j, "forward_tps")->valuedouble == a.forward_tps);
    cJSON_Delete(j);
    sp_msg_clear(&m);
    sp_buf_free(&b);
}
END_TEST

#define SHAPE_JSON "{\"code\":\"shape\",\"message\":\"hidden: expected [1, 4, 288], got \\\"[1, 4]\\\"\"}"

START_TEST(t_error_reply)
{
    sp_buf b = {0};
    sp_msg m;
    sp_err err = {0};
    ck_assert_int_eq(sp_msg_encode_error(&b, 77, "shape", "hidden: expected [1, 4, 288], got \"[1, 4]\"", &err), SP_OK);
    ck_assert_int_eq(sp_msg_decode(&m, b.data, b.len, NULL, &err), SP_OK);
    ck_assert_int_eq(m.type, SP_MSG_ERROR);
    ck_assert_int_eq(m.flags, SP_MSG_F_REPLY);
    ck_assert_uint_eq(m.request_id, 77);
    ck_assert_int_eq(m.n_tensors, 0);
    sp_error_reply e;
    ck_assert_int_eq(sp_error_reply_decode(&m, &e, &err), SP_OK);
    ck_assert_str_eq(e.code, "shape");
    ck_assert_str_eq(e.message, "hidden: expected [1, 4, 288], got \"[1, 4]\"");
    ck_assert(m.meta_len == strlen(SHAPE_JSON) && !memcmp(m.meta_json, SHAPE_JSON, m.meta_len)); /* as before */
    sp_msg_clear(&m);
    /* invalid UTF-8 in the text (a file name, a peer's bytes) is replaced, so the reply still decodes */
    ck_assert_int_eq(sp_msg_encode_error(&b, 78, NULL, "bad \xff\xfe name \xc3\xa9", &err), SP_OK);
    ck_assert_int_eq(sp_msg_decode(&m, b.data, b.len, NULL, &err), SP_OK);
    ck_assert_int_eq(sp_error_reply_decode(&m, &e, &err), SP_OK);
    ck_assert_str_eq(e.code, "internal");
    ck_assert_str_eq(e.message, "bad ?? name \xc3\xa9");
    sp_msg_clear(&m);
    /* a message longer than the field is cut where a character starts (it still decodes) */
    char *big = malloc(3000);
    for (int i = 0; i < 2999; i += 3) /* U+2713, 3 bytes; 2046 = 682 x 3, so the 2047th byte starts a 4th */
        memcpy(big + i, "\xe2\x9c\x93", 3);
    big[2999] = '\0';
    ck_assert_int_eq(sp_msg_encode_error(&b, 79, "x", big, &err), SP_OK);
    ck_assert_int_eq(sp_msg_decode(&m, b.data, b.len, NULL, &err), SP_OK);
    ck_assert_int_eq(sp_error_reply_decode(&m, &e, &err), SP_OK);
    ck_assert_uint_eq(strlen(e.message), 2046);
    ck_assert(!memcmp(e.message, big, 2046));
    sp_msg_clear(&m);
    free(big);
    sp_buf_free(&b);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* typed metadata (one struct per message kind) */

/* The codec of the struct named (sp_meta_codecs: every struct with its message, encode and decode). */
static const sp_meta_codec *codec(const char *name)
{
    for (int i = 0; i < SP_META_CODECS; i++)
        if (!strcmp(sp_meta_codecs[i].name, name))
            return &sp_meta_codecs[i];
    ck_abort_msg("no codec %s", name);
    return NULL;
}

/* Values with every field set, and with every optional field absent (static: padding is zero, so memcmp works). */
static const sp_hello_req HELLO_REQ_FULL = {.version = "1.1", .client = "sepal 0.1.0"}, HELLO_REQ_MIN = {.version = ""};
static const sp_hello_reply HELLO_REPLY_FULL = {.version = "1.1", .server = "sepal-server 0.1.0", .model = "stories15M",
                                                .config = 0xfedcba9876543210ull, .dtype = "int8", .blocks = 6,
                                                .start = 2, .end = 6, .id = "00112233aabbccdd", .bulk_port = 65535,
                                                .bulk_token = UINT64_MAX, .caps = SP_CAPS_ALL},
                            HELLO_REPLY_MIN = {.model = "m", .start = 0, .end = 1};
static const sp_info_reply INFO_FULL = {
    .model = "stories15M", .architecture = "LlamaForCausalLM", .start = 1, .end = 3, .dtype = "nf4",
    .weight_bytes = 9007199254740991, .protocol = "1.1", .hidden_size = 288, .family = "llama", .kv_heads = 6,
    .head_dim = 48, .cache_bytes_per_token = 2304, .cache_bytes_total = 1 << 30, .cache_tokens_total = 8192,
    .cache_tokens_available = 0, .max_batch_tokens = 1024, .max_length = 2048, .inference_rps = 0.1,
    .forward_tps = 1e300, .public_name = "caf\xc3\xa9 \"\\\n\x01", .sessions = 0, .kept_bytes = 5, .requests = 9,
    .batches = 4, .batched_rows = 30, .batch_peak = 16, .queue_wait = 0.25, .max_queue_wait = 5,
    .passed_inference = 2, .passed_training = 3, .device = "cuda:0 NVIDIA H200", .transport = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 0}};
static const sp_info_reply INFO_MIN = {
    .model = "m", .start = 0, .end = 1, .weight_bytes = -1, .hidden_size = -1, .kv_heads = -1, .head_dim = -1,
    .cache_bytes_per_token = -1, .cache_bytes_total = -1, .cache_tokens_total = -1, .cache_tokens_available = -1,
    .max_batch_tokens = -1, .max_length = -1, .sessions = -1, .kept_bytes = -1, .requests = -1,
    .batches = -1, .batched_rows = -1, .batch_peak = -1, .passed_inference = -1, .passed_training = -1,
    .transport = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1}};
static const sp_forward_req FORWARD_FULL = {.start = 1, .end = 4, .keep = 7, .reply_encoding = SP_ENC_BF16},
                            FORWARD_MIN = {.start = 0, .end = 0, .keep = 0, .reply_encoding = -1};
static const sp_backward_req BACKWARD_FULL = {.start = 1, .end = 4, .keep = 9007199254740991, .reply_encoding = 3},
                             BACKWARD_MIN = {.start = 5, .end = 2, .keep = 0, .reply_encoding = -1};
static const sp_open_req OPEN_REQ = {.start = 0, .end = 2, .max_length = 0, .batch = 2147483647};
static const sp_open_reply OPEN_REPLY_FULL = {.session = 12, .max_length = 64, .push_token = 0xfedcba9876543210},
                           OPEN_REPLY_MIN = {.max_length = -1};
static const sp_step_req STEP_FULL = {.session = 3, .start_from_position = 0, .reply_encoding = SP_ENC_F32},
                         STEP_MIN = {.session = 3, .start_from_position = -1, .reply_encoding = -1},
                         STEP_PUSH = {.session = 3, .start_from_position = 7, .reply_encoding = -1, .step = 8,
                                      .await = 1, .push_host = "10.0.0.2", .push_port = 31337, .push_session = 4,
                                      .push_token = 1};
static const sp_step_reply STEP_REPLY = {.position = 9}, STEP_REPLY_PUSHED = {.position = 10, .pushed = 1},
                           STEP_REPLY_RATE = {.position = 11, .rx_mbit = 23.5};
static const sp_push_req PUSH_REQ = {.session = 4, .token = 0xffffffffffffffff, .step = 9007199254740991};
/* training's passes pushed: a FORWARD that awaits its input and pushes its output, a BACKWARD that only pushes */
static const sp_forward_req FORWARD_PUSH = {.start = 0, .end = 2, .keep = 3, .reply_encoding = -1, .await = 5,
                                            .await_token = 0x8000000000000001, .push_host = "10.0.0.3",
                                            .push_port = 1, .push_id = 9007199254740991, .push_token = 2};
static const sp_backward_req BACKWARD_PUSH = {.start = 2, .end = 4, .keep = 3, .reply_encoding = SP_ENC_Q8,
                                              .push_host = "h", .push_port = 65535, .push_id = 6, .push_token = 7};
static const sp_span_reply SPAN_REPLY_PUSHED = {.pushed = 1}, SPAN_REPLY = {.pushed = 0},
                           SPAN_REPLY_RATE = {.pushed = 1, .rx_mbit = 1000.25};
static const sp_span_push_req SPAN_PUSH_REQ = {.id = 1, .token = 0xffffffffffffffff};
static const sp_close_req CLOSE_REQ = {.session = 0};
static const sp_error_reply ERROR_FULL = {.code = "shape", .message = "hidden: expected [1, 4, 288]"},
                            ERROR_MIN = {.code = "x"};
static const sp_auth_hello AUTH_HELLO_FULL = {.nonce = {1, 2, 3, [31] = 0xff}, .swarm = "0011223344556677"},
                           AUTH_HELLO_MIN = {.nonce = {0}};
static const sp_auth_challenge AUTH_CHALLENGE = {.nonce = {[0] = 0xab}, .proof = {[31] = 0xcd}};
static const sp_auth_proof AUTH_PROOF = {.proof = {[5] = 0x10}};
static const sp_auth_verdict AUTH_VERDICT_OK = {.ok = 1}, AUTH_VERDICT_NO = {.ok = 0};

static const struct {
    const char *codec;
    const void *v;
} VALUES[] = {
    {"hello_req", &HELLO_REQ_FULL},   {"hello_req", &HELLO_REQ_MIN},   {"hello_reply", &HELLO_REPLY_FULL},
    {"hello_reply", &HELLO_REPLY_MIN}, {"info_reply", &INFO_FULL},      {"info_reply", &INFO_MIN},
    {"forward_req", &FORWARD_FULL},   {"forward_req", &FORWARD_MIN},   {"backward_req", &BACKWARD_FULL},
    {"backward_req", &BACKWARD_MIN},  {"open_req", &OPEN_REQ},         {"open_reply", &OPEN_REPLY_FULL},
    {"open_reply", &OPEN_REPLY_MIN},  {"step_req", &STEP_FULL},        {"step_req", &STEP_MIN},
    {"step_req", &STEP_PUSH},         {"step_reply", &STEP_REPLY_PUSHED}, {"push_req", &PUSH_REQ},
    {"step_reply", &STEP_REPLY},      {"step_reply", &STEP_REPLY_RATE}, {"close_req", &CLOSE_REQ},       {"error_reply", &ERROR_FULL},
    {"error_reply", &ERROR_MIN},            {"auth_hello", &AUTH_HELLO_FULL}, {"auth_hello", &AUTH_HELLO_MIN},
    {"auth_challenge", &AUTH_CHALLENGE}, {"auth_proof", &AUTH_PROOF},  {"auth_verdict", &AUTH_VERDICT_OK},
    {"auth_verdict", &AUTH_VERDICT_NO}, {"forward_req", &FORWARD_PUSH},    {"backward_req", &BACKWARD_PUSH},
    {"forward_reply", &SPAN_REPLY_PUSHED}, {"forward_reply", &SPAN_REPLY}, {"backward_reply", &SPAN_REPLY_PUSHED},
    {"backward_reply", &SPAN_REPLY_RATE}, {"span_push_req", &SPAN_PUSH_REQ},
};

/* meta as the metadata of codec c's message, decoded by it into out: its status (err says why). */
static sp_status typed_decode(const char *name, const char *meta, void *out, sp_err *err)
{
    const sp_meta_codec *c = codec(name);
    sp_buf b = {0};
    sp_msg m;
    enc_ok(&b, c->type, c->flags, 1, meta, NULL, 0);
    ck_assert_int_eq(sp_msg_decode(&m, b.data, b.len, NULL, err), SP_OK);
    sp_status st = c->decode(&m, out, err);
    sp_msg_clear(&m);
    sp_buf_free(&b);
    return st;
}

/* Every struct, full and with its optional fields absent: encode -> message -> decode gives it back, byte for byte;
 * and every codec is used. */
START_TEST(t_typed_roundtrip)
{
    int used[SP_META_CODECS] = {0};
    static _Alignas(max_align_t) unsigned char got[4096];
    static char json[16384];
    for (size_t i = 0; i < sizeof VALUES / sizeof *VALUES; i++) {
        const sp_meta_codec *c = codec(VALUES[i].codec);
        sp_err err = {0};
        ck_assert_msg(c->encode(VALUES[i].v, json, sizeof json, &err) == SP_OK, "%s: %s", c->name, err.msg);
        memset(got, 0x55, sizeof got);
        ck_assert_msg(typed_decode(VALUES[i].codec, json, got, &err) == SP_OK, "%s %s: %s", c->name, json, err.msg);
        ck_assert_msg(!memcmp(got, VALUES[i].v, c->size), "%s: %s decodes to something else", c->name, json);
        used[c - sp_meta_codecs] = 1;
    }
    for (int c = 0; c < SP_META_CODECS; c++)
        ck_assert_msg(used[c], "%s has no round trip", sp_meta_codecs[c].name);
}
END_TEST

/* The text each encoder writes is the text the hand-built metadata of 1.1 was (the wire stays as it was), and
 * the minimal values leave their optional fields out. */
START_TEST(t_typed_wire_text)
{
    static const struct {
        const char *codec;
        const void *v;
        const char *json;
    } cases[] = {
        {"hello_req", &HELLO_REQ_FULL, "{\"version\":\"1.1\",\"client\":\"sepal 0.1.0\"}"},
        {"hello_req", &HELLO_REQ_MIN, "{}"},
        {"hello_reply", &HELLO_REPLY_FULL,
         "{\"version\":\"1.1\",\"server\":\"sepal-server 0.1.0\",\"model\":\"stories15M\",\"config\":\"fedcba9876543210\","
         "\"dtype\":\"int8\",\"blocks\":6,\"start\":2,\"end\":6,\"id\":\"00112233aabbccdd\",\"bulk_port\":65535,"
         "\"bulk_token\":\"18446744073709551615\",\"caps\":3}"},
        {"hello_reply", &HELLO_REPLY_MIN, "{\"model\":\"m\",\"start\":0,\"end\":1}"},
        {"info_reply", &INFO_MIN, "{\"model\":\"m\",\"start\":0,\"end\":1,\"transport\":{}}"},
        {"forward_req", &FORWARD_FULL, "{\"start\":1,\"end\":4,\"keep\":7,\"reply_encoding\":\"bf16\"}"},
        {"forward_req", &FORWARD_MIN, "{\"start\":0,\"end\":0}"},
        {"backward_req", &BACKWARD_FULL, "{\"start\":1,\"end\":4,\"kept\":9007199254740991,\"reply_encoding\":\"q8\"}"},
        {"open_req", &OPEN_REQ, "{\"start\":0,\"end\":2,\"max_length\":0,\"batch\":2147483647}"},
        {"open_reply", &OPEN_REPLY_FULL, "{\"session\":12,\"max_length\":64,\"push_token\":\"fedcba9876543210\"}"},
        {"step_req", &STEP_FULL, "{\"session\":3,\"start_from_position\":0,\"reply_encoding\":\"f32\"}"},
        {"step_req", &STEP_MIN, "{\"session\":3}"},
        {"step_req", &STEP_PUSH, "{\"session\":3,\"start_from_position\":7,\"step\":8,\"await\":true,"
                                 "\"push_host\":\"10.0.0.2\",\"push_port\":31337,\"push_session\":4,"
                                 "\"push_token\":\"0000000000000001\"}"},
        {"step_reply", &STEP_REPLY_PUSHED, "{\"position\":10,\"pushed\":true}"},
        {"push_req", &PUSH_REQ, "{\"session\":4,\"token\":\"ffffffffffffffff\",\"step\":9007199254740991}"},
        {"step_reply", &STEP_REPLY, "{\"position\":9}"},
        {"step_reply", &STEP_REPLY_RATE, "{\"position\":11,\"rx_mbit\":23.5}"},
        {"close_req", &CLOSE_REQ, "{\"session\":0}"},
        {"error_reply", &ERROR_FULL, "{\"code\":\"shape\",\"message\":\"hidden: expected [1, 4, 288]\"}"},
        {"auth_hello", &AUTH_HELLO_MIN,
         "{\"nonce\":\"0000000000000000000000000000000000000000000000000000000000000000\"}"},
        {"auth_verdict", &AUTH_VERDICT_OK, "{\"ok\":true}"},
    };
    char json[SP_META_CAP];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        sp_err err = {0};
        ck_assert_int_eq(codec(cases[i].codec)->encode(cases[i].v, json, sizeof json, &err), SP_OK);
        ck_assert_str_eq(json, cases[i].json);
    }
    /* INFO as cJSON printed it: keys in its order, numbers as it wrote them, strings escaped as it escaped them */
    sp_err err = {0};
    ck_assert_int_eq(sp_info_reply_encode(&INFO_FULL, json, sizeof json, &err), SP_OK);
    ck_assert_str_eq(json, "{\"model\":\"stories15M\",\"architecture\":\"LlamaForCausalLM\",\"start\":1,\"end\":3,"
                           "\"dtype\":\"nf4\",\"weight_bytes\":9007199254740991,\"protocol\":\"1.1\",\"hidden_size\":288,"
                           "\"family\":\"llama\",\"kv_heads\":6,\"head_dim\":48,\"cache_bytes_per_token\":2304,"
                           "\"cache_bytes_total\":1073741824,\"cache_tokens_total\":8192,\"cache_tokens_available\":0,"
                           "\"max_batch_tokens\":1024,\"max_length\":2048,\"inference_rps\":0.1,\"forward_tps\":1e+300,"
                           "\"public_name\":\"caf\xc3\xa9 \\\"\\\\\\n\\u0001\",\"sessions\":0,\"kept_bytes\":5,"
                           "\"requests\":9,\"batches\":4,\"batched_rows\":30,\"batch_peak\":16,\"queue_wait\":0.25,"
                           "\"max_queue_wait\":5,\"passed_inference\":2,\"passed_training\":3,\"device\":\"cuda:0 NVIDIA H200\","
           "\"transport\":{\"conns\":1,\"pending\":2,\"accepted\":3,\"refused\":4,"
                           "\"refused_ip\":5,\"handshake_timeouts\":6,\"idle_closed\":7,\"busy\":8,\"slow\":9,"
                           "\"auth_failed\":10,\"waits\":11,\"paused\":12,\"delivered\":13,\"bulk_refused\":14,"
                           "\"bulk_timeouts\":15,\"out_of_fds\":16,\"budget_used\":17,\"budget_peak\":18,\"budget\":19,"
                           "\"budget_conn\":20,\"swarm_key\":false}}");
    cJSON *j = cJSON_Parse(json); /* and cJSON reads the same values back */
    ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(j, "public_name")->valuestring, INFO_FULL.public_name);
    ck_assert(cJSON_GetObjectItemCaseSensitive(j, "forward_tps")->valuedouble == 1e300);
    cJSON_Delete(j);
}
END_TEST

/* Malformed metadata: each gets SP_ERR_FORMAT and a message that names the message and the field, never a crash. */
START_TEST(t_typed_malformed)
{
    static const struct {
        const char *codec, *meta, *why;
    } cases[] = {
        /* missing required fields */
        {"forward_req", "{\"end\":2}", "FORWARD request: 'start' is missing"},
        {"backward_req", "{\"start\":0}", "BACKWARD request: 'end' is missing"},
        {"open_req", "{\"start\":0,\"end\":2,\"max_length\":8}", "INFERENCE_OPEN request: 'batch' is missing"},
        {"open_reply", "{\"max_length\":8}", "INFERENCE_OPEN reply: 'session' is missing"},
        {"step_reply", "{}", "INFERENCE_STEP reply: 'position' is missing"},
        {"hello_reply", "{\"start\":0,\"end\":2}", "HELLO reply: 'model' is missing"},
        {"info_reply", "{\"model\":\"m\",\"start\":0}", "INFO reply: 'end' is missing"},
        {"error_reply", "{\"message\":\"x\"}", "ERROR: 'code' is missing"},
        {"auth_hello", "{\"swarm\":\"00\"}", "AUTH request: 'nonce' is missing"},
        {"auth_challenge", "{\"nonce\":\"" "0000000000000000000000000000000000000000000000000000000000000000\"}",
         "AUTH challenge: 'proof' is missing"},
        {"auth_verdict", "{}", "AUTH verdict: 'ok' is missing"},
        /* wrong types */
        {"forward_req", "{\"start\":\"0\",\"end\":2}", "'start' must be an integer in 0..2147483647, got a string"},
        {"forward_req", "{\"start\":0,\"end\":2,\"keep\":true}", "'keep' must be an integer in 0..9007199254740991, "
                                                               "got true"},
        {"hello_req", "{\"version\":1.1}", "HELLO request: 'version' must be a string, got a number"},
        {"hello_reply", "{\"model\":[],\"start\":0,\"end\":1}", "'model' must be a string, got an array"},
        {"info_reply", "{\"model\":\"m\",\"start\":0,\"end\":1,\"transport\":[]}",
         "'transport' must be an object, got an array"},
        {"info_reply", "{\"model\":\"m\",\"start\":0,\"end\":1,\"transport\":{\"busy\":\"1\"}}",
         "INFO reply: 'transport.busy' must be an integer"},
        {"info_reply", "{\"model\":\"m\",\"start\":0,\"end\":1,\"transport\":{\"swarm_key\":1}}",
         "'transport.swarm_key' must be true or false, got a number"},
        {"auth_verdict", "{\"ok\":\"true\"}", "'ok' must be true or false, got a string"},
        {"error_reply", "{\"code\":null}", "'code' must be a string, got null"},
        /* out of range */
        {"forward_req", "{\"start\":-1,\"end\":2}", "'start' must be an integer in 0..2147483647, got -1"},
        {"open_req", "{\"start\":0,\"end\":2,\"max_length\":8,\"batch\":-2}", "'batch' must be an integer"},
        {"hello_reply", "{\"model\":\"m\",\"start\":0,\"end\":1,\"bulk_port\":65536}",
         "'bulk_port' must be an integer in -1..65535, got 65536"},
        {"hello_reply", "{\"model\":\"m\",\"start\":0,\"end\":1,\"blocks\":0}", "'blocks' must be an integer in 1..1048576"},
        {"hello_reply", "{\"model\":\"m\",\"start\":3,\"end\":3}", "HELLO reply: the span 3:3 holds no block"},
        {"hello_reply", "{\"model\":\"m\",\"start\":0,\"end\":1,\"caps\":-1}",
         "'caps' must be an integer in 0..2147483647"},
        {"hello_reply", "{\"model\":\"m\",\"start\":0,\"end\":7,\"blocks\":6}", "not inside the model's 6 blocks"},
        {"info_reply", "{\"model\":\"m\",\"start\":0,\"end\":1,\"inference_rps\":-1}",
         "'inference_rps' must be a finite number >= 0, got -1"},
        {"info_reply", "{\"model\":\"m\",\"start\":0,\"end\":1,\"forward_tps\":1e999}", "'forward_tps' must be a finite"},
        {"step_reply", "{\"position\":1.5}", "'position' must be an integer in 0..2147483647, got 1.5"},
        /* an int member's count: no more than an int holds (the fuzzer's 199e9, once converted out of range) */
        {"info_reply", "{\"model\":\"m\",\"start\":0,\"end\":1,\"head_dim\":199e9}",
         "'head_dim' must be an integer in 0..2147483647, got 199e9"},
        /* strings: too long, empty where not allowed, NUL, bad digits */
        {"error_reply", "{\"code\":\"0123456789012345678901234567890123\"}", "'code' is 34 bytes long, at most 31 allowed"},
        {"error_reply", "{\"code\":\"\"}", "ERROR: 'code' must not be empty"},
        {"hello_req", "{\"client\":\"a\\u0000b\"}", "'client' holds a NUL character"},
        {"hello_reply", "{\"model\":\"m\",\"start\":0,\"end\":1,\"config\":\"12345678901234567\"}",
         "'config' must be a string of 1..16 hex digits"},
        {"hello_reply", "{\"model\":\"m\",\"start\":0,\"end\":1,\"config\":\"xyz\"}", "'config' must be a string of 1..16"},
        {"hello_reply", "{\"model\":\"m\",\"start\":0,\"end\":1,\"bulk_token\":\"18446744073709551616\"}",
         "'bulk_token' must be a string of decimal digits that fit 64 bits"},
        {"hello_reply", "{\"model\":\"m\",\"start\":0,\"end\":1,\"bulk_token\":\"-1\"}", "'bulk_token' must be"},
        {"auth_proof", "{\"proof\":\"00\"}", "AUTH proof: 'proof' must be 64 hex digits, got \"00\""},
        {"auth_proof", "{\"proof\":\"" "000000000000000000000000000000000000000000000000000000000000000g\"}",
         "'proof' must be 64 hex digits"},
        {"forward_req", "{\"start\":0,\"end\":2,\"reply_encoding\":\"f8\"}", "'reply_encoding' names no float encoding"},
    };
    static _Alignas(max_align_t) unsigned char got[4096];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        sp_err err = {0};
        sp_status st = typed_decode(cases[i].codec, cases[i].meta, got, &err);
        ck_assert_msg(st == SP_ERR_FORMAT && err.code == st && strstr(err.msg, cases[i].why), "%s: %d '%s'",
                      cases[i].meta, st, err.msg);
    }
}
END_TEST

/* What every decoder tolerates as before: unknown keys, and a repeated key (its first value); and what it refuses:
 * another message's metadata (type or direction), and text that never passed sp_msg_decode. */
START_TEST(t_typed_message_checks)
{
    sp_err err = {0};
    sp_open_req q;
    ck_assert_int_eq(typed_decode("open_req", "{\"x\":{\"batch\":-1},\"start\":0,\"end\":2,\"max_length\":8,\"batch\":2,"
                                              "\"batch\":-5,\"later\":[1,2]}", &q, &err), SP_OK);
    ck_assert(q.start == 0 && q.end == 2 && q.max_length == 8 && q.batch == 2);
    /* a request decoder refuses the reply of its type, and the other way round, and other types */
    sp_buf b = {0};
    sp_msg m;
    static _Alignas(max_align_t) unsigned char got[4096];
    for (int c = 0; c < SP_META_CODECS; c++)
        for (int flags = 0; flags <= 1; flags++)
            for (int type = 1; type < SP_MSG__END; type++) {
                const sp_meta_codec *k = &sp_meta_codecs[c];
                int mine = type == (int)k->type && flags == k->flags;
                enc_ok(&b, (sp_msg_type)type, (uint16_t)flags, 1, NULL, NULL, 0);
                ck_assert_int_eq(sp_msg_decode(&m, b.data, b.len, NULL, &err), SP_OK);
                err.msg[0] = '\0';
                sp_status st = k->decode(&m, got, &err);
                if (mine) /* {} is this struct's: it decodes, or lacks a field */
                    ck_assert_msg(st == SP_OK || strstr(err.msg, "is missing"), "%s: %s", k->name, err.msg);
                else
                    ck_assert_msg(st == SP_ERR_FORMAT && strstr(err.msg, "expected the ") &&
                                  strstr(err.msg, sp_msg_type_name(type)), "%s: %s", k->name, err.msg);
                sp_msg_clear(&m);
            }
    sp_buf_free(&b);
    ck_assert_int_eq(sp_close_req_decode(NULL, (sp_close_req *)got, &err), SP_ERR_ARG);
    /* text that never passed sp_msg_decode (a hand-made sp_msg): an error, never a read past it */
    static const char *garbage[] = {"", "{", "{\"", "{\"session\"", "{\"session\":", "{\"session\":1", "{\"a\":[1,",
                                    "{\"session\":1,", "]", "{\"session\" 1}", "{\"session\":\"1", "{\"a\":{\"b\":",
                                    "{\"ok\":tru", "{\"code\":\"x\\", "nul"};
    for (size_t i = 0; i < sizeof garbage / sizeof *garbage; i++)
        for (int c = 0; c < SP_META_CODECS; c++) {
            const sp_meta_codec *k = &sp_meta_codecs[c];
            size_t n = strlen(garbage[i]);
            char *exact = malloc(n ? n : 1); /* nothing after it: ASan sees a read past its end */
            memcpy(exact, garbage[i], n);
            sp_msg hand = {.type = k->type, .flags = k->flags, .meta_json = exact, .meta_len = (uint32_t)n};
            sp_status st = k->decode(&hand, got, &err);
            ck_assert_msg(st == SP_ERR_FORMAT || (n == 0 && st == SP_OK), "%s on '%s': %d (%s)", k->name,
                          garbage[i], st, err.msg);
            free(exact);
        }
}
END_TEST

/* The encoders refuse what a decoder would refuse (SP_ERR_ARG), and a buffer too small (SP_ERR_RANGE), leaving "". */
START_TEST(t_typed_encode_rejects)
{
    char json[SP_META_CAP];
    sp_err err = {0};
    sp_forward_req f = {.start = -1, .end = 2, .reply_encoding = -1};
    ck_assert_int_eq(sp_forward_req_encode(&f, json, sizeof json, &err), SP_ERR_ARG);
    ck_assert_str_eq(err.msg, "FORWARD request: 'start' is -1, outside 0..2147483647");
    ck_assert_str_eq(json, "");
    f = (sp_forward_req){.start = 0, .end = 2, .reply_encoding = SP_ENC_I64};
    ck_assert_int_eq(sp_forward_req_encode(&f, json, sizeof json, &err), SP_ERR_ARG);
    ck_assert_str_eq(err.msg, "FORWARD request: 'reply_encoding' 4 is not a float encoding");
    f = (sp_forward_req){.start = 0, .end = 2, .keep = 9007199254740992ull, .reply_encoding = -1};
    ck_assert_int_eq(sp_forward_req_encode(&f, json, sizeof json, &err), SP_ERR_ARG); /* never rounded */
    sp_hello_reply h = HELLO_REPLY_MIN;
    h.end = 0;
    ck_assert_int_eq(sp_hello_reply_encode(&h, json, sizeof json, &err), SP_ERR_ARG);
    ck_assert_str_eq(err.msg, "HELLO reply: the span 0:0 holds no block");
    h = HELLO_REPLY_MIN;
    h.model[0] = '\0';
    ck_assert_int_eq(sp_hello_reply_encode(&h, json, sizeof json, &err), SP_ERR_ARG);
    h = HELLO_REPLY_MIN;
    memcpy(h.model, "\xff", 2);
    ck_assert_int_eq(sp_hello_reply_encode(&h, json, sizeof json, &err), SP_ERR_ARG);
    ck_assert_str_eq(err.msg, "HELLO reply: 'model' is not valid UTF-8");
    memset(h.id, 'a', sizeof h.id); /* no NUL */
    h.model[0] = 'm';
    ck_assert_int_eq(sp_hello_reply_encode(&h, json, sizeof json, &err), SP_ERR_ARG);
    sp_info_reply info = INFO_MIN;
    info.inference_rps = NAN;
    ck_assert_int_eq(sp_info_reply_encode(&info, json, sizeof json, &err), SP_ERR_ARG);
    info.inference_rps = -2;
    ck_assert_int_eq(sp_info_reply_encode(&info, json, sizeof json, &err), SP_ERR_ARG);
    ck_assert_int_eq(sp_step_reply_encode(&STEP_REPLY, json, 14, &err), SP_ERR_RANGE); /* {"position":9} + NUL */
    ck_assert_str_eq(json, "");
    ck_assert_int_eq(sp_step_reply_encode(&STEP_REPLY, json, 15, &err), SP_OK);
    ck_assert_int_eq(sp_step_reply_encode(NULL, json, sizeof json, &err), SP_ERR_ARG);
}
END_TEST

/* SP_META_CAP holds every struct at its longest, every string byte escaped (ERROR aside); sp_meta_set cuts where a
 * character starts and mends invalid UTF-8. */
START_TEST(t_typed_cap_and_set)
{
    static sp_info_reply info;
    static sp_hello_reply hello;
    static char json[SP_META_CAP];
    info = INFO_FULL;
    hello = HELLO_REPLY_FULL;
    char *strs[] = {info.model, info.architecture, info.dtype, info.protocol, info.family, info.public_name,
                    hello.version, hello.server, hello.model, hello.dtype, hello.id};
    size_t caps[] = {sizeof info.model, sizeof info.architecture, sizeof info.dtype, sizeof info.protocol,
                     sizeof info.family, sizeof info.public_name, sizeof hello.version, sizeof hello.server,
                     sizeof hello.model, sizeof hello.dtype, sizeof hello.id};
    for (int i = 0; i < 11; i++) {
        memset(strs[i], 0x01, caps[i] - 1); /* each escaped as \u0001 */
        strs[i][caps[i] - 1] = '\0';
    }
    info.weight_bytes = info.kept_bytes = info.requests = -1 + 9007199254740992; /* the longest numbers */
    sp_err err = {0};
    ck_assert_msg(sp_info_reply_encode(&info, json, sizeof json, &err) == SP_OK, "%s", err.msg);
    ck_assert_msg(sp_hello_reply_encode(&hello, json, sizeof json, &err) == SP_OK, "%s", err.msg);
    char f[8];
    sp_meta_set(f, sizeof f, "abcd\xe2\x9c\x93z"); /* 4 + 3 bytes fit 7, the z does not */
    ck_assert_str_eq(f, "abcd\xe2\x9c\x93");
    sp_meta_set(f, sizeof f, "abcde\xe2\x9c\x93"); /* the check mark does not fit: cut before it */
    ck_assert_str_eq(f, "abcde");
    sp_meta_set(f, sizeof f, "a\xff" "b");
    ck_assert_str_eq(f, "a?b");
    sp_meta_set(f, sizeof f, NULL);
    ck_assert_str_eq(f, "");
}
END_TEST

/* The encoder refuses what the decoder would refuse, and leaves the buffer empty. */
START_TEST(t_encode_rejects)
{
    float x[4] = {1, 2, 3, 4};
    int64_t ids[2] = {0, 1};
    sp_buf b = {0};
    sp_err err = {0};
    struct {
        sp_tensor_src t;
        const char *frag;
    } bad[] = {
        {{SP_ENC_F32, 0, {4}, x, NULL}, "rank 0"},
        {{SP_ENC_F32, 5, {1, 1, 1, 4}, x, NULL}, "rank 5"},
        {{SP_ENC_F32, 2, {0, 4}, x, NULL}, "dimension 0 is 0"},
        {{SP_ENC_F32, 2, {4, -1}, x, NULL}, "dimension 1 is -1"},
        {{SP_ENC_F32, 2, {INT64_MAX, INT64_MAX}, x, NULL}, "more than 2^64"},
        {{(sp_encoding)9, 1, {4}, x, NULL}, "unknown encoding 9"},
        {{SP_ENC_F16, 1, {4}, NULL, NULL}, "no f32 data"},
        {{SP_ENC_I64, 1, {2}, x, NULL}, "no raw data"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sp_tensor_src two[2] = {{SP_ENC_I64, 1, {2}, NULL, ids}, bad[i].t};
        b.len = 99;
        ck_assert_int_eq(sp_msg_encode(&b, SP_MSG_FORWARD, 0, 1, NULL, two, 2, &err), SP_ERR_ARG);
        ck_assert_msg(has(err.msg, "tensor 1: ") && has(err.msg, bad[i].frag), "case %zu: '%s'", i, err.msg);
        ck_assert_uint_eq(b.len, 0);
    }
    const char *metas[] = {"{", "[1,2]", "{\"a\":\"\xff\"}", "{} x", "nul"};
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(sp_msg_encode(&b, SP_MSG_PING, 0, 1, metas[i], NULL, 0, &err), SP_ERR_ARG);
        ck_assert_msg(has(err.msg, "metadata"), "%s", err.msg);
    }
    ck_assert_int_eq(sp_msg_encode(&b, (sp_msg_type)0, 0, 1, NULL, NULL, 0, &err), SP_ERR_ARG);
    ck_assert_int_eq(sp_msg_encode(&b, SP_MSG__END, 0, 1, NULL, NULL, 0, &err), SP_ERR_ARG);
    ck_assert_int_eq(sp_msg_encode(&b, SP_MSG_PING, 2, 1, NULL, NULL, 0, &err), SP_ERR_ARG);
    ck_assert_int_eq(sp_msg_encode(&b, SP_MSG_PING, 0, 1, NULL, NULL, 9, &err), SP_ERR_ARG);
    ck_assert_int_eq(sp_msg_encode(&b, SP_MSG_PING, 0, 1, NULL, NULL, -1, &err), SP_ERR_ARG);
    ck_assert_int_eq(sp_msg_encode(&b, SP_MSG_PING, 0, 1, NULL, NULL, 1, &err), SP_ERR_ARG);
    ck_assert_int_eq(sp_msg_encode(NULL, SP_MSG_PING, 0, 1, NULL, NULL, 0, &err), SP_ERR_ARG);
    sp_buf_free(&b);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* malformed messages: a table of mutations of one valid FORWARD message */

/* The base: meta {"start":0,"end":4} (19 bytes), tensor 0 f32 [2, 3], tensor 1 f32 [4]. */
#define BASE_META "{\"start\":0,\"end\":4}"
#define META_OFF 40
#define D0 (META_OFF + 19)
#define D1 (D0 + 48)
#define PAY (D1 + 48)
#define BASE_LEN (PAY + 24 + 16)

static size_t base_message(uint8_t *out)
{
    static const float a[6] = {1, 2, 3, 4, 5, 6}, c[4] = {-1, -2, -3, -4};
    sp_tensor_src t[2] = {{SP_ENC_F32, 2, {2, 3}, a, NULL}, {SP_ENC_F32, 1, {4}, c, NULL}};
    sp_buf b = {0};
    enc_ok(&b, SP_MSG_FORWARD, 0, 42, BASE_META, t, 2);
    ck_assert_uint_eq(b.len, BASE_LEN);
    memcpy(out, b.data, b.len);
    sp_buf_free(&b);
    return BASE_LEN;
}

typedef enum { M_U8, M_U16, M_U32, M_U64, M_META, M_APPEND, M_CUT } mut_kind;

typedef struct {
    const char *name;
    mut_kind kind;
    size_t off;      /* field offset (M_U*) */
    uint64_t val;    /* new value (M_U*), bytes appended / cut (M_APPEND / M_CUT) */
    const char *txt; /* new 19-byte metadata (M_META) */
    int fix_body;    /* M_APPEND / M_CUT: also adjust body_len */
    int hdr;         /* a header check: sp_msg_peek must refuse it the same way */
    sp_status code;
    const char *frag1, *frag2;
} mutation;

#define SHAPE(d, k) ((d) + 8 + 8 * (k))
#define BYTELEN(d) ((d) + 40)
#define NEG(x) ((uint64_t) - (int64_t)(x))

static const mutation MUTATIONS[] = {
    {"bad magic", M_U32, 0, 0x4c504554u, NULL, 0, 1, SP_ERR_FORMAT, "bad magic 0x4c504554", "SEPL"},
    {"major version 2", M_U16, 4, 2, NULL, 0, 1, SP_ERR_UNSUPPORTED, "peer speaks protocol 2.1, we speak 1.1", NULL},
    {"major version 0", M_U16, 4, 0, NULL, 0, 1, SP_ERR_UNSUPPORTED, "protocol 0.1", NULL},
    {"unknown type 42", M_U16, 8, 42, NULL, 0, 1, SP_ERR_UNSUPPORTED, "unknown message type 42", NULL},
    {"type 0", M_U16, 8, 0, NULL, 0, 1, SP_ERR_UNSUPPORTED, "unknown message type 0", NULL},
    {"unknown flag bit", M_U16, 10, 0x8001, NULL, 0, 1, SP_ERR_FORMAT, "unknown flag bits 0x8000", NULL},
    {"n_tensors 9", M_U32, 12, 9, NULL, 0, 1, SP_ERR_FORMAT, "9 tensors, at most 8", NULL},
    {"n_tensors 2^31", M_U32, 12, 1u << 31, NULL, 0, 1, SP_ERR_FORMAT, "2147483648 tensors", NULL},
    {"n_tensors 3", M_U32, 12, 3, NULL, 0, 1, SP_ERR_FORMAT, "and 3 descriptors", NULL},
    {"n_tensors 1", M_U32, 12, 1, NULL, 0, 0, SP_ERR_FORMAT, "trailing data", NULL},
    {"header reserved", M_U32, 28, 1, NULL, 0, 1, SP_ERR_FORMAT, "header reserved field is 1", NULL},
    {"meta_len past body", M_U32, 24, 1000, NULL, 0, 1, SP_ERR_FORMAT, "cannot hold 1000 bytes of metadata", NULL},
    {"meta_len over max_meta", M_U32, 24, 70000, NULL, 0, 1, SP_ERR_RANGE, "metadata of 70000 bytes", "65536"},
    {"meta_len 2^32-1", M_U32, 24, UINT32_MAX, NULL, 0, 1, SP_ERR_RANGE, "4294967295", NULL},
    {"meta_len 18", M_U32, 24, 18, NULL, 0, 0, SP_ERR_UNSUPPORTED, "tensor 0: unknown encoding 125", NULL},
    {"meta not JSON", M_META, 0, 0, "{\"start\":0 \"end\":4}", 0, 0, SP_ERR_FORMAT, "not valid JSON", NULL},
    {"meta JSON array", M_META, 0, 0, "[0,1,2,3,4,5,6,7,8]", 0, 0, SP_ERR_FORMAT, "not an object", NULL},
    {"meta JSON string", M_META, 0, 0, "\"start:0, end:4...\"", 0, 0, SP_ERR_FORMAT, "not an object", NULL},
    {"meta invalid UTF-8", M_META, 0, 0, "{\"st\xffrt\":0,\"end\":4}", 0, 0, SP_ERR_FORMAT, "not valid UTF-8",
     "byte 4"},
    {"meta overlong UTF-8", M_META, 0, 0, "{\"s\xc0\xafrt\":0,\"end\":4}", 0, 0, SP_ERR_FORMAT, "UTF-8", NULL},
    {"meta UTF-16 surrogate", M_META, 0, 0, "{\"\xed\xa0\x80rt\":0,\"end\":4}", 0, 0, SP_ERR_FORMAT, "UTF-8",
     NULL},
    {"meta NUL byte", M_META, 0, 0, "{\"start\":0}\0\"end\":4", 0, 0, SP_ERR_FORMAT, "UTF-8", NULL},
    {"meta trailing text", M_META, 0, 0, "{\"start\":0,\"e\":4}xy", 0, 0, SP_ERR_FORMAT, "not valid JSON", NULL},
    {"meta truncated UTF-8", M_META, 0, 0, "{\"start\":0,\"end\":4\xe2", 0, 0, SP_ERR_FORMAT, "UTF-8", "byte 18"},
    {"body_len 2^40", M_U64, 32, 1ull << 40, NULL, 0, 1, SP_ERR_RANGE, "40 + 1099511627776 bytes exceeds the limit",
     NULL},
    {"body_len 2^64-1", M_U64, 32, UINT64_MAX, NULL, 0, 1, SP_ERR_RANGE, "exceeds the limit", NULL},
    {"body_len +1", M_U64, 32, BASE_LEN - 40 + 1, NULL, 0, 0, SP_ERR_FORMAT,
     "body length 156 does not match the 155 bytes after the header", NULL},
    {"body_len -1", M_U64, 32, BASE_LEN - 40 - 1, NULL, 0, 0, SP_ERR_FORMAT, "body length 154 does not match", NULL},
    {"body_len 0", M_U64, 32, 0, NULL, 0, 1, SP_ERR_FORMAT, "body of 0 bytes cannot hold", NULL},
    {"rank 0", M_U8, D1 + 1, 0, NULL, 0, 0, SP_ERR_FORMAT, "tensor 1: rank 0, must be 1..4", NULL},
    {"rank 5", M_U8, D1 + 1, 5, NULL, 0, 0, SP_ERR_FORMAT, "tensor 1: rank 5", NULL},
    {"rank 255", M_U8, D0 + 1, 255, NULL, 0, 0, SP_ERR_FORMAT, "tensor 0: rank 255", NULL},
    {"rank 2 with unused dim 0", M_U8, D1 + 1, 2, NULL, 0, 0, SP_ERR_FORMAT, "tensor 1: dimension 1 is 0", NULL},
    {"zero dim", M_U64, SHAPE(D1, 0), 0, NULL, 0, 0, SP_ERR_FORMAT, "tensor 1: dimension 0 is 0, must be >= 1", NULL},
    {"negative dim", M_U64, SHAPE(D0, 1), NEG(3), NULL, 0, 0, SP_ERR_FORMAT, "tensor 0: dimension 1 is -3", NULL},
    {"most negative dim", M_U64, SHAPE(D0, 0), 1ull << 63, NULL, 0, 0, SP_ERR_FORMAT, "-9223372036854775808", NULL},
    {"unused dim set", M_U64, SHAPE(D1, 2), 1, NULL, 0, 0, SP_ERR_FORMAT, "tensor 1: unused dimension 2", NULL},
    {"dims product overflows", M_U64, SHAPE(D0, 0), INT64_MAX, NULL, 0, 0, SP_ERR_FORMAT,
     "tensor 0: shape [9223372036854775807, 3] has more than 2^64 elements", NULL},
    {"dims product over the limit", M_U64, SHAPE(D1, 0), 1ull << 40, NULL, 0, 0, SP_ERR_RANGE,
     "tensor 1: 1099511627776 elements exceed the message limit", NULL},
    {"byte_len mismatch", M_U64, BYTELEN(D1), 100, NULL, 0, 0, SP_ERR_FORMAT,
     "tensor 1: byte length 100 does not match 4 x f32 = 16", NULL},
    {"byte_len 2^64-1", M_U64, BYTELEN(D0), UINT64_MAX, NULL, 0, 0, SP_ERR_FORMAT,
     "tensor 0: byte length 18446744073709551615 does not match 6 x f32 = 24", NULL},
    {"encoding changed", M_U8, D1, SP_ENC_F16, NULL, 0, 0, SP_ERR_FORMAT, "byte length 16 does not match 4 x f16 = 8",
     NULL},
    {"encoding q8 changed", M_U8, D1, SP_ENC_Q8, NULL, 0, 0, SP_ERR_FORMAT, "4 x q8 = 8", NULL},
    {"unknown encoding", M_U8, D1, 6, NULL, 0, 0, SP_ERR_UNSUPPORTED, "tensor 1: unknown encoding 6", NULL},
    {"unknown encoding 255", M_U8, D0, 255, NULL, 0, 0, SP_ERR_UNSUPPORTED, "tensor 0: unknown encoding 255", NULL},
    {"descriptor reserved u16", M_U16, D1 + 2, 1, NULL, 0, 0, SP_ERR_FORMAT, "tensor 1: descriptor reserved", NULL},
    {"descriptor reserved u32", M_U32, D0 + 4, 7, NULL, 0, 0, SP_ERR_FORMAT, "are 0 and 7, must be 0", NULL},
    {"trailing garbage", M_APPEND, 0, 5, NULL, 0, 0, SP_ERR_FORMAT, "body length 155 does not match the 160", NULL},
    {"trailing garbage in body", M_APPEND, 0, 5, NULL, 1, 0, SP_ERR_FORMAT,
     "5 bytes of trailing data after the last tensor payload", NULL},
    {"short payload", M_CUT, 0, 4, NULL, 1, 0, SP_ERR_FORMAT,
     "tensor 1: payload of 16 bytes runs past the end of the message (12 bytes left)", NULL},
    {"payloads cut off", M_CUT, 0, 40, NULL, 1, 0, SP_ERR_FORMAT, "tensor 0: payload of 24 bytes", NULL},
    {"descriptors cut off", M_CUT, 0, 41, NULL, 1, 1, SP_ERR_FORMAT, "cannot hold 19 bytes of metadata and 2", NULL},
};

static size_t apply(const mutation *mu, uint8_t *buf)
{
    size_t len = base_message(buf);
    switch (mu->kind) {
    case M_U8: buf[mu->off] = (uint8_t)mu->val; break;
    case M_U16: wr16(buf + mu->off, (uint16_t)mu->val); break;
    case M_U32: wr32(buf + mu->off, (uint32_t)mu->val); break;
    case M_U64: wr64(buf + mu->off, mu->val); break;
    case M_META: memcpy(buf + META_OFF, mu->txt, 19); break;
    case M_APPEND:
        memset(buf + len, 0x5a, mu->val);
        len += mu->val;
        break;
    case M_CUT: len -= mu->val; break;
    }
    if (mu->fix_body)
        wr64(buf + 32, len - 40);
    return len;
}

START_TEST(t_malformed_table)
{
    const size_t n = sizeof MUTATIONS / sizeof MUTATIONS[0];
    uint8_t buf[BASE_LEN + 64];
    for (size_t i = 0; i < n; i++) {
        const mutation *mu = &MUTATIONS[i];
        size_t len = apply(mu, buf);
        /* an exact-size heap copy, so that ASan sees any read past the end */
        uint8_t *msg = malloc(len);
        memcpy(msg, buf, len);
        sp_msg m;
        memset(&m, 0x7f, sizeof m);
        sp_err err = {0}, perr = {0};
        sp_status s = sp_msg_decode(&m, msg, len, NULL, &err);
        ck_assert_msg(s == mu->code, "%s: status %d (%s), expected %d", mu->name, s, err.msg, mu->code);
        ck_assert_int_eq(err.code, s);
        ck_assert_msg(has(err.msg, mu->frag1) && has(err.msg, mu->frag2), "%s: message '%s'", mu->name, err.msg);
        ck_assert_msg(m.meta_json == NULL && m.n_tensors == 0, "%s: decode left state behind", mu->name);
        sp_msg_clear(&m);
        /* peek agrees: the same refusal for a header fault, acceptance otherwise */
        uint64_t body = 0;
        sp_status ps = sp_msg_peek(msg, len, NULL, &body, &perr);
        if (mu->hdr) {
            ck_assert_msg(ps == s && strcmp(perr.msg, err.msg) == 0, "%s: peek %d '%s' vs decode %d '%s'", mu->name, ps,
                          perr.msg, s, err.msg);
        } else {
            ck_assert_msg(ps == SP_OK, "%s: peek refused a sound header: %s", mu->name, perr.msg);
        }
        printf("  %-28s -> %s\n", mu->name, err.msg);
        free(msg);
    }
}
END_TEST

/* What a server should answer each refusal with. */
START_TEST(t_reject_codes)
{
    uint8_t buf[BASE_LEN + 64];
    size_t len = base_message(buf);
    ck_assert_str_eq(sp_msg_reject_code(buf, len, SP_ERR_FORMAT), "malformed");
    ck_assert_str_eq(sp_msg_reject_code(buf, len, SP_ERR_NOMEM), "internal");
    ck_assert_str_eq(sp_msg_reject_code(buf, 10, SP_ERR_FORMAT), "malformed");
    wr16(buf + 4, 2);
    ck_assert_str_eq(sp_msg_reject_code(buf, len, SP_ERR_UNSUPPORTED), "version");
    wr16(buf + 4, 1);
    wr16(buf + 8, 99);
    ck_assert_str_eq(sp_msg_reject_code(buf, len, SP_ERR_UNSUPPORTED), "unknown_type");
    wr32(buf, 0);
    ck_assert_str_eq(sp_msg_reject_code(buf, len, SP_ERR_FORMAT), "malformed");
    /* the request id of a message that failed to decode is still readable */
    sp_msg_header h;
    len = base_message(buf);
    wr64(buf + 32, 1);
    ck_assert_int_eq(sp_msg_header_read(buf, len, &h), 1);
    ck_assert_uint_eq(h.request_id, 42);
    ck_assert_int_eq(h.type, SP_MSG_FORWARD);
    ck_assert_int_eq(sp_msg_header_read(buf, 39, &h), 0);
}
END_TEST

/* Every proper prefix of a valid message is refused (and ASan sees no read past it). */
START_TEST(t_truncated_every_length)
{
    uint8_t buf[BASE_LEN + 64];
    size_t len = base_message(buf);
    for (size_t cut = 0; cut < len; cut++) {
        uint8_t *msg = malloc(cut ? cut : 1);
        memcpy(msg, buf, cut);
        sp_msg m;
        sp_err err = {0};
        sp_status s = sp_msg_decode(&m, msg, cut, NULL, &err);
        ck_assert_msg(s != SP_OK, "prefix of %zu bytes accepted", cut);
        ck_assert_ptr_null(m.meta_json);
        if (cut < 40)
            ck_assert_msg(has(err.msg, "truncated header"), "%zu: %s", cut, err.msg);
        else
            ck_assert_msg(has(err.msg, "does not match the"), "%zu: %s", cut, err.msg);
        uint64_t body = 0;
        ck_assert_int_eq(sp_msg_peek(msg, cut, NULL, &body, &err) == SP_OK, cut >= 40);
        free(msg);
    }
    sp_msg m;
    sp_err err = {0};
    ck_assert_int_eq(sp_msg_decode(&m, NULL, 0, NULL, &err), SP_ERR_FORMAT);
    ck_assert_int_eq(sp_msg_decode(&m, buf, len, NULL, &err), SP_OK);
    sp_msg_clear(&m);
}
END_TEST

START_TEST(t_limits)
{
    uint8_t buf[BASE_LEN + 64];
    size_t len = base_message(buf);
    sp_msg m;
    sp_err err = {0};
    uint64_t body = 0;
    sp_proto_limits l = {len, 19};
    ck_assert_int_eq(sp_msg_decode(&m, buf, len, &l, &err), SP_OK); /* exactly at both limits */
    sp_msg_clear(&m);
    l.max_message = len - 1;
    ck_assert_int_eq(sp_msg_decode(&m, buf, len, &l, &err), SP_ERR_RANGE);
    ck_assert_msg(has(err.msg, "exceeds the limit of 194"), "%s", err.msg);
    ck_assert_int_eq(sp_msg_peek(buf, len, &l, &body, &err), SP_ERR_RANGE);
    l.max_message = 10; /* below the header size: everything is refused, nothing wraps around */
    ck_assert_int_eq(sp_msg_peek(buf, len, &l, &body, &err), SP_ERR_RANGE);
    l.max_message = len;
    l.max_meta = 18;
    ck_assert_int_eq(sp_msg_decode(&m, buf, len, &l, &err), SP_ERR_RANGE);
    ck_assert_msg(has(err.msg, "metadata of 19 bytes exceeds the limit of 18"), "%s", err.msg);
    ck_assert_int_eq(sp_msg_peek(buf, len, &l, &body, &err), SP_ERR_RANGE);
    /* the element count is held to max_message too (before any multiplication by a width) */
    l.max_message = UINT64_MAX;
    l.max_meta = UINT32_MAX;
    wr64(buf + SHAPE(D1, 0), 1ull << 62);
    ck_assert_int_eq(sp_msg_decode(&m, buf, len, &l, &err), SP_ERR_FORMAT);
    ck_assert_msg(has(err.msg, "tensor 1: 4611686018427387904 x f32 overflows 64 bits"), "%s", err.msg);
    /* peek fills body_len only on success */
    len = base_message(buf);
    ck_assert_int_eq(sp_msg_peek(buf, 40, NULL, &body, &err), SP_OK);
    ck_assert_uint_eq(body, len - 40);
    ck_assert_int_eq(sp_msg_peek(buf, 40, NULL, NULL, &err), SP_OK);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* the byte layout, pinned by hand (share/doc/protocol.md, "Example") */

static const uint8_t GOLDEN[] = {
    /* header */
    0x53, 0x45, 0x50, 0x4c,                         /* magic "SEPL" */
    0x01, 0x00, 0x01, 0x00,                         /* version 1.1 */
    0x08, 0x00, 0x00, 0x00,                         /* type 8 = PING, flags 0 */
    0x02, 0x00, 0x00, 0x00,                         /* n_tensors 2 */
    0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, /* request_id 0x0102030405060708 */
    0x07, 0x00, 0x00, 0x00,                         /* meta_len 7 */
    0x00, 0x00, 0x00, 0x00,                         /* reserved */
    0x71, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* body_len 113 = 7 + 2*48 + 4 + 6 */
    /* metadata */
    0x7b, 0x22, 0x78, 0x22, 0x3a, 0x31, 0x7d, /* {"x":1} */
    /* descriptor 0: f16, rank 2, shape [1, 2], 4 bytes */
    0x01, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* encoding, rank, reserved u16, reserved u32 */
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* shape[0] = 1 */
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* shape[1] = 2 */
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* shape[2] unused */
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* shape[3] unused */
    0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* byte_len 4 */
    /* descriptor 1: q8, rank 1, shape [2], 4 + 2 bytes */
    0x03, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x06, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    /* payload 0: f16 1.0, -2.0 */
    0x00, 0x3c, 0x00, 0xc0,
    /* payload 1: q8 block: scale 1/127 (f32 0x3c010204), codes 127, -32 */
    0x04, 0x02, 0x01, 0x3c, 0x7f, 0xe0,
};

START_TEST(t_golden_bytes)
{
    sp_msg m;
    sp_err err = {0};
    ck_assert_uint_eq(sizeof GOLDEN, 153);
    ck_assert_msg(sp_msg_decode(&m, GOLDEN, sizeof GOLDEN, NULL, &err) == SP_OK, "%s", err.msg);
    ck_assert_int_eq(m.major, 1);
    ck_assert_int_eq(m.minor, 1);
    ck_assert_int_eq(m.type, SP_MSG_PING);
    ck_assert_int_eq(m.flags, 0);
    ck_assert_uint_eq(m.request_id, 0x0102030405060708ull);
    ck_assert_int_eq(m.n_tensors, 2);
    ck_assert(m.meta_len == 7 && !memcmp(m.meta_json, "{\"x\":1}", 7));
    ck_assert_int_eq(m.t[0].enc, SP_ENC_F16);
    ck_assert_int_eq(m.t[0].rank, 2);
    ck_assert_int_eq(m.t[0].shape[0], 1);
    ck_assert_int_eq(m.t[0].shape[1], 2);
    ck_assert_uint_eq(m.t[0].numel, 2);
    ck_assert_ptr_eq(m.t[0].data, GOLDEN + 40 + 7 + 96);
    float f[2];
    ck_assert_int_eq(sp_tensor_to_f32(&m.t[0], f, &err), SP_OK);
    ck_assert(f[0] == 1.0f && f[1] == -2.0f);
    ck_assert_int_eq(m.t[1].enc, SP_ENC_Q8);
    ck_assert_uint_eq(m.t[1].nbytes, 6);
    ck_assert_int_eq(sp_tensor_to_f32(&m.t[1], f, &err), SP_OK);
    ck_assert(f[0] == 127.0f * (1.0f / 127.0f) && f[1] == -32.0f * (1.0f / 127.0f));
    sp_msg_clear(&m);

    /* and the encoder writes exactly these bytes */
    float h[2] = {1.0f, -2.0f}, q[2] = {1.0f, -0.25f};
    sp_tensor_src t[2] = {{SP_ENC_F16, 2, {1, 2}, h, NULL}, {SP_ENC_Q8, 1, {2, 99, 99, 99}, q, NULL}};
    sp_buf b = {0};
    enc_ok(&b, SP_MSG_PING, 0, 0x0102030405060708ull, "{\"x\":1}", t, 2);
    ck_assert_uint_eq(b.len, sizeof GOLDEN);
    for (size_t i = 0; i < sizeof GOLDEN; i++)
        ck_assert_msg(b.data[i] == GOLDEN[i], "byte %zu: 0x%02x, expected 0x%02x", i, b.data[i], GOLDEN[i]);
    sp_buf_free(&b);
}
END_TEST

static Suite *proto_suite(void)
{
    Suite *s = suite_create("proto");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, t_names_sizes);
    tcase_add_test(tc, t_buf);
    tcase_add_test(tc, t_roundtrip_all);
    tcase_add_test(tc, t_empty_meta_is_object);
    tcase_add_test(tc, t_q8_edges);
    tcase_add_test(tc, t_finite_and_conversions);
    tcase_add_test(tc, t_meta_numbers);
    tcase_add_test(tc, t_meta_reader);
    tcase_add_test(tc, t_error_reply);
    tcase_add_test(tc, t_typed_roundtrip);
    tcase_add_test(tc, t_typed_wire_text);
    tcase_add_test(tc, t_typed_malformed);
    tcase_add_test(tc, t_typed_message_checks);
    tcase_add_test(tc, t_typed_encode_rejects);
    tcase_add_test(tc, t_typed_cap_and_set);
    tcase_add_test(tc, t_encode_rejects);
    tcase_add_test(tc, t_malformed_table);
    tcase_add_test(tc, t_reject_codes);
    tcase_add_test(tc, t_truncated_every_length);
    tcase_add_test(tc, t_limits);
    tcase_add_test(tc, t_golden_bytes);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return sp_test_run(proto_suite()); }
