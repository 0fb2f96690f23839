/* test_proto.c - the wire protocol: round trips of every message type and encoding, the Q8 scheme against
 * an independent computation, a table of malformed messages (each a mutation of a valid one) that must be
 * refused with a useful message, limits, and a hand-written byte vector that pins the layout documented in
 * share/doc/protocol.md. */
#include <cJSON.h>
#include <math.h>
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
                int64_t v = 0;
                ck_assert_int_eq(sp_meta_int(&m, "type", &v), 1);
                ck_assert_int_eq(v, type);
                ck_assert_str_eq(sp_meta_str(&m, "name"), "h\xc3\xa9llo \xe2\x9c\x93");
                for (int i = 0; i < n; i++)
                    check_tensor(&src[i], &m.t[i], i);
                sp_msg_clear(&m);
                ck_assert_ptr_null(m.meta);
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
    ck_assert_ptr_null(m.meta); /* no tree until asked for */
    ck_assert(cJSON_IsObject(sp_msg_meta(&m)));
    ck_assert_ptr_null(m.meta->child);
    ck_assert_ptr_null(sp_meta_str(&m, "x"));
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

START_TEST(t_meta_helpers)
{
    const char *meta = "{\"a\":3,\"b\":3.5,\"c\":\"3\",\"d\":1e300,\"e\":-7,\"f\":9223372036854775808,"
                       "\"g\":-9223372036854775808,\"h\":null,\"i\":[1]}";
    sp_buf b = {0};
    sp_msg m;
    sp_err err = {0};
    enc_ok(&b, SP_MSG_PING, 0, 1, meta, NULL, 0);
    ck_assert_int_eq(sp_msg_decode(&m, b.data, b.len, NULL, &err), SP_OK);
    int64_t v = 0;
    ck_assert_int_eq(sp_meta_int(&m, "a", &v), 1);
    ck_assert_int_eq(v, 3);
    ck_assert_int_eq(sp_meta_int(&m, "e", &v), 1);
    ck_assert_int_eq(v, -7);
    ck_assert_int_eq(sp_meta_int(&m, "g", &v), 1);
    ck_assert(v == INT64_MIN);
    const char *not_int[] = {"b", "c", "d", "f", "h", "i", "missing"};
    for (int i = 0; i < 7; i++) {
        v = 5;
        ck_assert_msg(sp_meta_int(&m, not_int[i], &v) == 0, "%s", not_int[i]);
        ck_assert_int_eq(v, -1);
    }
    ck_assert_str_eq(sp_meta_str(&m, "c"), "3");
    ck_assert_ptr_null(sp_meta_str(&m, "a"));
    ck_assert_ptr_null(sp_meta_str(&m, "missing"));
    ck_assert_ptr_null(sp_meta_str(NULL, "a"));
    ck_assert_int_eq(sp_meta_int(NULL, "a", &v), 0);
    sp_msg_clear(&m);
    sp_msg_clear(&m); /* twice is harmless */
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
        ck_assert_msg(cJSON_IsObject(sp_msg_meta(&m)), "cJSON refuses %s", good[i]);
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
            ck_assert_ptr_nonnull(sp_msg_meta(&m));
            sp_msg_clear(&m);
        } else {
            ck_assert_int_eq(sp_msg_encode(&b, SP_MSG_PING, 0, 1, deep, NULL, 0, &err), SP_ERR_ARG);
        }
        free(deep);
    }
    /* values read in place equal cJSON's */
    const char *meta = "{\"o\":{\"k\":1,\"s\":\"in\"},\"k\":2,\"k\":3,\"s\":\"a\\u00e9\\n\\\"z\",\"x\":-12.5e1,"
                       "\"big\":123456789012345678,\"l\":\"0123456789abcdef\",\"e\\u0073c\":7}";
    enc_ok(&b, SP_MSG_PING, 0, 1, meta, NULL, 0);
    ck_assert_int_eq(sp_msg_decode(&m, b.data, b.len, NULL, &err), SP_OK);
    int64_t v = 0;
    double d = 0;
    char s[16];
    ck_assert_int_eq(sp_meta_int(&m, "k", &v), 1);
    ck_assert_int_eq(v, 2); /* the first, and not the nested one */
    ck_assert_int_eq(sp_meta_int(&m, "esc", &v), 1); /* an escaped key */
    ck_assert_int_eq(v, 7);
    ck_assert_int_eq(sp_meta_num(&m, "x", &d), 1);
    ck_assert(d == -125.0);
    ck_assert_int_eq(sp_meta_num(&m, "s", &d), 0);
    ck_assert(d == 0);
    ck_assert_int_eq(sp_meta_int(&m, "big", &v), 1);
    ck_assert(v == (int64_t)123456789012345678.0); /* the double cJSON gives */
    ck_assert_int_eq(sp_meta_strcpy(&m, "s", s, sizeof s), 1);
    ck_assert_str_eq(s, "a\xc3\xa9\n\"z");
    ck_assert_int_eq(sp_meta_strcpy(&m, "l", s, sizeof s), 0); /* 16 bytes do not fit 15 + NUL */
    ck_assert_str_eq(s, "");
    ck_assert_int_eq(sp_meta_strcpy(&m, "k", s, sizeof s), 0);
    ck_assert_int_eq(sp_meta_strcpy(&m, "missing", s, sizeof s), 0);
    ck_assert_ptr_null(m.meta); /* none of the above built a tree */
    ck_assert_str_eq(sp_meta_str(&m, "s"), "a\xc3\xa9\n\"z");
    ck_assert_str_eq(sp_meta_str(&m, "l"), "0123456789abcdef");
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(sp_msg_meta(&m), "big");
    ck_assert(k && k->valuedouble == 123456789012345678.0);
    sp_msg_clear(&m);
    sp_buf_free(&b);
}
END_TEST

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
    ck_assert_str_eq(sp_meta_str(&m, "code"), "shape");
    ck_assert_str_eq(sp_meta_str(&m, "message"), "hidden: expected [1, 4, 288], got \"[1, 4]\"");
    sp_msg_clear(&m);
    /* invalid UTF-8 in the text (a file name, a peer's bytes) is replaced, so the reply still decodes */
    ck_assert_int_eq(sp_msg_encode_error(&b, 78, NULL, "bad \xff\xfe name \xc3\xa9", &err), SP_OK);
    ck_assert_int_eq(sp_msg_decode(&m, b.data, b.len, NULL, &err), SP_OK);
    ck_assert_str_eq(sp_meta_str(&m, "code"), "internal");
    ck_assert_str_eq(sp_meta_str(&m, "message"), "bad ?? name \xc3\xa9");
    sp_msg_clear(&m);
    sp_buf_free(&b);
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
        ck_assert_msg(m.meta == NULL && m.n_tensors == 0, "%s: decode left state behind", mu->name);
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
        ck_assert_ptr_null(m.meta);
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
    int64_t x = 0;
    ck_assert_int_eq(sp_meta_int(&m, "x", &x), 1);
    ck_assert_int_eq(x, 1);
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
    tcase_add_test(tc, t_meta_helpers);
    tcase_add_test(tc, t_meta_reader);
    tcase_add_test(tc, t_error_reply);
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
