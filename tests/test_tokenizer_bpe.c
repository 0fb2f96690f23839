/* test_tokenizer_bpe.c - byte-level BPE (GPT-2 / Llama-3 style): GPT-2's own vocab against the ids of an
 * independent encoder (tests/data/gpt2/golden.json, from the npm package gpt-3-encoder@1.1.4 by
 * tools/gpt2_golden.js), and small synthetic tokenizers for the Llama-3 split, special tokens and options. */
#include <check.h>
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "tokenizer.h"

#define GPT2_GOLDEN SEPAL_TEST_DATA "/gpt2/golden.json"

static sp_tokenizer *load_dir(const char *dir)
{
    sp_tokenizer *t = NULL;
    sp_err err = {0};
    sp_status s = sp_tokenizer_load(&t, dir, &err);
    ck_assert_msg(s == SP_OK, "load %s failed: %s", dir, err.msg);
    return t;
}

static sp_tokenizer *load_gpt2(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer.json", SEPAL_GPT2_DIR);
    ck_assert_msg(access(path, R_OK) == 0, "%s is missing: run scripts/fetch-gpt2-tokenizer.sh first", path);
    return load_dir(SEPAL_GPT2_DIR);
}

static int *json_ints(const cJSON *arr, int *n)
{
    *n = cJSON_GetArraySize(arr);
    int *v = malloc(((size_t)*n + 1) * sizeof *v), i = 0;
    for (const cJSON *e = arr->child; e; e = e->next)
        v[i++] = e->valueint;
    return v;
}

static void assert_ids(const int *got, int ngot, const int *want, int nwant, const char *what)
{
    char gs[2048] = "", ws[2048] = "";
    for (int i = 0; i < ngot && strlen(gs) < 2000; i++)
        snprintf(gs + strlen(gs), sizeof gs - strlen(gs), "%d ", got[i]);
    for (int i = 0; i < nwant && strlen(ws) < 2000; i++)
        snprintf(ws + strlen(ws), sizeof ws - strlen(ws), "%d ", want[i]);
    ck_assert_msg(ngot == nwant && memcmp(got, want, (size_t)nwant * sizeof *got) == 0, "'%s': got [%s] want [%s]",
                  what, gs, ws);
}

static void expect_encode(const sp_tokenizer *t, const char *text, int add_special, const int *want, int nwant)
{
    int *ids = NULL, n = 0;
    sp_err err = {0};
    ck_assert_msg(sp_tokenizer_encode(t, text, add_special, &ids, &n, &err) == SP_OK, "encode: %s", err.msg);
    assert_ids(ids, n, want, nwant, text);
    free(ids);
}

#define EXPECT(t, text, add_special, ...)                                                                          \
    do {                                                                                                           \
        const int want_[] = {__VA_ARGS__};                                                                         \
        expect_encode(t, text, add_special, want_, (int)(sizeof want_ / sizeof want_[0]));                         \
    } while (0)

static char *decode(const sp_tokenizer *t, const int *ids, int n)
{
    char *s = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_tokenizer_decode(t, ids, n, &s, &err) == SP_OK, "decode: %s", err.msg);
    return s;
}

/* Whether b[0..n) is complete, valid UTF-8. */
static int valid_utf8(const unsigned char *b, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t need = b[i] < 0x80 ? 1 : b[i] >= 0xC2 && b[i] <= 0xDF ? 2 : b[i] >= 0xE0 && b[i] <= 0xEF ? 3
                    : b[i] >= 0xF0 && b[i] <= 0xF4 ? 4 : 0;
        if (need == 0 || i + need > n)
            return 0;
        for (size_t k = 1; k < need; k++)
            if ((b[i + k] & 0xC0) != 0x80)
                return 0;
        i += need;
    }
    return 1;
}

/* Streams ids through sp_detok; for valid UTF-8 text every chunk must be whole characters. *held counts the
 * pushes that produced nothing because a character was still incomplete. */
static char *stream_decode(const sp_tokenizer *t, const int *ids, int n, int *held)
{
    size_t cap = 64, len = 0;
    char *out = malloc(cap), buf[SP_DETOK_BUF];
    sp_detok d;
    sp_detok_init(&d, t);
    for (int i = 0; i <= n; i++) {
        size_t w = i < n ? sp_detok_push(&d, ids[i], buf, sizeof buf) : sp_detok_flush(&d, buf, sizeof buf);
        ck_assert_uint_lt(w, sizeof buf);
        ck_assert_uint_eq(strlen(buf), w);
        ck_assert_msg(valid_utf8((const unsigned char *)buf, w), "chunk %d splits a UTF-8 character", i);
        if (i < n && w == 0 && d.npending > 0)
            (*held)++;
        while (len + w + 1 > cap)
            out = realloc(out, cap *= 2);
        memcpy(out + len, buf, w);
        len += w;
    }
    ck_assert_int_eq(d.npending, 0);
    out[len] = '\0';
    return out;
}

/* ---------------------------------------------------------------------------------------------- */
/* GPT-2 */

START_TEST(test_gpt2_golden)
{
    cJSON *root = sp_test_read_json(GPT2_GOLDEN);
    ck_assert_str_eq(cJSON_GetObjectItem(root, "package")->valuestring, "gpt-3-encoder@1.1.4");
    sp_tokenizer *t = load_gpt2();
    ck_assert_int_eq(sp_tokenizer_kind(t), SP_TOK_BYTE_BPE);
    ck_assert_int_eq(sp_tokenizer_vocab_size(t), 50257);
    int count = 0, held = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases"))
    {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        int nwant, *want = json_ints(cJSON_GetObjectItem(c, "ids"), &nwant);
        expect_encode(t, text, 1, want, nwant); /* GPT-2 adds no BOS */
        expect_encode(t, text, 0, want, nwant);
        char *back = decode(t, want, nwant);
        ck_assert_str_eq(back, text);
        char *streamed = stream_decode(t, want, nwant, &held);
        ck_assert_str_eq(streamed, text);
        free(streamed);
        free(back);
        free(want);
        count++;
    }
    ck_assert_int_ge(count, 40);
    ck_assert_int_gt(held, 0); /* some tokens end inside a character (emoji, CJK) */
    sp_tokenizer_free(t);
    cJSON_Delete(root);
}
END_TEST

START_TEST(test_gpt2_specials)
{
    sp_tokenizer *t = load_gpt2();
    ck_assert_int_eq(sp_tokenizer_bos(t), 50256); /* tokenizer_config.json: <|endoftext|>, add_bos_token false */
    ck_assert_int_eq(sp_tokenizer_eos(t), 50256);
    ck_assert_str_eq(sp_tokenizer_piece(t, 50256), "<|endoftext|>");
    ck_assert_str_eq(sp_tokenizer_piece(t, 220), "\xC4\xA0"); /* "Ġ" stands for the space byte */
    ck_assert_str_eq(sp_tokenizer_piece(t, 198), "\xC4\x8A"); /* "Ċ" for "\n" */
    EXPECT(t, "<|endoftext|>", 1, 50256);
    EXPECT(t, "Hello<|endoftext|>world", 0, 15496, 50256, 6894);
    EXPECT(t, "Hello world<|endoftext|><|endoftext|> Hello", 0, 15496, 995, 50256, 50256, 18435);
    /* not a whole special token: plain text */
    int *ids, n;
    sp_err err = {0};
    ck_assert(sp_tokenizer_encode(t, "<|endoftext|", 0, &ids, &n, &err) == SP_OK);
    ck_assert_int_gt(n, 1);
    for (int i = 0; i < n; i++)
        ck_assert_int_ne(ids[i], 50256);
    char *s = decode(t, ids, n);
    ck_assert_str_eq(s, "<|endoftext|");
    free(s);
    free(ids);
    /* special tokens decode to nothing; no leading space is dropped (unlike SentencePiece) */
    int seq[] = {50256, 18435, 50256, 995};
    s = decode(t, seq, 4);
    ck_assert_str_eq(s, " Hello world");
    free(s);
    int bad[] = {15496, 50257};
    s = NULL;
    ck_assert(sp_tokenizer_decode(t, bad, 2, &s, &err) == SP_ERR_RANGE);
    ck_assert_ptr_null(s);
    sp_tokenizer_free(t);
}
END_TEST

/* The id of a piece (a linear scan: test only). */
static int find_piece(const sp_tokenizer *t, const char *piece)
{
    for (int v = 0; v < sp_tokenizer_vocab_size(t); v++)
        if (sp_tokenizer_piece(t, v) && strcmp(sp_tokenizer_piece(t, v), piece) == 0)
            return v;
    ck_abort_msg("no piece '%s'", piece);
    return -1;
}

/* A character split across tokens is held back until complete; an unfinished one comes out on flush. */
START_TEST(test_gpt2_stream_partial_utf8)
{
    sp_tokenizer *t = load_gpt2();
    const char *texts[] = {"\xF0\x9F\x98\x80", "\xE6\x97\xA5\xE6\x9C\xAC", "a\xF0\x9F\x8E\x89" "b"};
    for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++) {
        int *ids, n, held = 0;
        sp_err err = {0};
        ck_assert(sp_tokenizer_encode(t, texts[k], 0, &ids, &n, &err) == SP_OK);
        char *s = stream_decode(t, ids, n, &held);
        ck_assert_str_eq(s, texts[k]);
        free(s);
        free(ids);
    }
    /* the 4 byte tokens of 😀 (F0 9F 98 80: "ð", "Ł", "ĺ", "Ģ" in the GPT-2 table), one at a time */
    static const char *const byte_pieces[] = {"\xC3\xB0", "\xC5\x81", "\xC4\xBA", "\xC4\xA2"};
    char out[SP_DETOK_BUF];
    sp_detok d;
    sp_detok_init(&d, t);
    for (int i = 0; i < 4; i++) {
        size_t w = sp_detok_push(&d, find_piece(t, byte_pieces[i]), out, sizeof out);
        ck_assert_uint_eq(w, i < 3 ? 0 : 4);
    }
    ck_assert_str_eq(out, "\xF0\x9F\x98\x80");
    /* an unfinished character at the end comes out on flush */
    ck_assert_uint_eq(sp_detok_push(&d, find_piece(t, byte_pieces[0]), out, sizeof out), 0);
    ck_assert_uint_eq(sp_detok_flush(&d, out, sizeof out), 1);
    ck_assert_int_eq((unsigned char)out[0], 0xF0);
    sp_tokenizer_free(t);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* synthetic byte-level tokenizers */

/* The GPT-2 byte -> character table (a fact of the format), as UTF-8. */
static void byte_char(unsigned b, char out[4])
{
    unsigned cp = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174 ? b
                : b <= 32 ? 0x100 + b : b <= 160 ? 0x121 + (b - 127) : 0x143;
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = '\0';
    } else {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = '\0';
    }
}

/* The Llama-3 split regex as it is written inside tokenizer.json (JSON-escaped). */
#define LLAMA3_RE                                                                                                  \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?"                          \
    "[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+"

/* Extra pieces after the 256 byte pieces (id = byte value), and the merges that build them. */
static const char *const EXTRA[] = {"12", "123", "34", "45", "\xC4\x8A\xC4\x8A" /* ĊĊ */, "IT", "'S", "(h",
                                    "\xC4\xA0w" /* Ġw */, "\xC4\xA0wo", "hello", "\xC4\xA0\xC4\xA0" /* ĠĠ */};
static const char *const MERGES[] = {"1 2", "3 4", "12 3", "4 5", "\xC4\x8A \xC4\x8A", "I T", "' S", "( h",
                                     "\xC4\xA0 w", "\xC4\xA0w o", "\xC4\xA0 \xC4\xA0"};
enum { ID_12 = 256, ID_123, ID_34, ID_45, ID_NLNL, ID_IT, ID_QS, ID_PH, ID_SPW, ID_SPWO, ID_HELLO, ID_SPSP,
       ID_S, ID_SLONG, ID_BOS };

/* Writes a byte-level tokenizer.json with the given pre_tokenizer / post_processor JSON and model options. */
static const char *write_byte_level(const char *pre, const char *post, int ignore_merges)
{
    cJSON *root = cJSON_CreateObject(), *model = cJSON_CreateObject(), *vocab = cJSON_CreateObject();
    cJSON *merges = cJSON_CreateArray(), *added = cJSON_CreateArray();
    for (unsigned b = 0; b < 256; b++) {
        char ch[4];
        byte_char(b, ch);
        cJSON_AddNumberToObject(vocab, ch, b);
    }
    int id = 256;
    for (size_t i = 0; i < sizeof EXTRA / sizeof EXTRA[0]; i++)
        cJSON_AddNumberToObject(vocab, EXTRA[i], id++);
    for (size_t i = 0; i < sizeof MERGES / sizeof MERGES[0]; i++)
        cJSON_AddItemToArray(merges, cJSON_CreateString(MERGES[i]));
    const char *specials[] = {"<|s|>", "<|s|>>", "<|bos|>"};
    for (int i = 0; i < 3; i++) {
        cJSON *a = cJSON_CreateObject();
        cJSON_AddNumberToObject(a, "id", id++);
        cJSON_AddStringToObject(a, "content", specials[i]);
        cJSON_AddBoolToObject(a, "special", 1);
        cJSON_AddItemToArray(added, a);
    }
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", merges);
    cJSON_AddBoolToObject(model, "ignore_merges", ignore_merges);
    cJSON_AddItemToObject(root, "added_tokens", added);
    cJSON *pre_json = cJSON_Parse(pre), *post_json = post ? cJSON_Parse(post) : cJSON_CreateNull();
    ck_assert_msg(pre_json && post_json, "bad test JSON");
    cJSON_AddItemToObject(root, "pre_tokenizer", pre_json);
    cJSON_AddItemToObject(root, "post_processor", post_json);
    cJSON_AddItemToObject(root, "decoder", cJSON_Parse("{\"type\":\"ByteLevel\"}"));
    cJSON_AddItemToObject(root, "model", model);
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    const char *path = sp_test_write_file("tokenizer.json", json, strlen(json));
    free(json);
    ck_assert_ptr_nonnull(path);
    static char dir[512];
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = '\0';
    return dir;
}

static const char LLAMA3_PRE[] =
    "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"" LLAMA3_RE "\"},"
    "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
    "\"trim_offsets\":true,\"use_regex\":false}]}";
static const char GPT2_PRE[] = "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}";
static const char BOS_POST[] =
    "{\"type\":\"Sequence\",\"processors\":[{\"type\":\"ByteLevel\"},{\"type\":\"TemplateProcessing\","
    "\"single\":[{\"SpecialToken\":{\"id\":\"<|bos|>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],"
    "\"special_tokens\":{\"<|bos|>\":{\"id\":\"<|bos|>\",\"ids\":[270],\"tokens\":[\"<|bos|>\"]}}}]}";

START_TEST(test_llama3_split)
{
    sp_tokenizer *t = load_dir(write_byte_level(LLAMA3_PRE, BOS_POST, 0));
    ck_assert_int_eq(sp_tokenizer_kind(t), SP_TOK_BYTE_BPE);
    ck_assert_int_eq(sp_tokenizer_bos(t), ID_BOS);
    EXPECT(t, "12345", 0, ID_123, ID_45);      /* \p{N}{1,3}: "123" "45" */
    EXPECT(t, "12345", 1, ID_BOS, ID_123, ID_45); /* the template's BOS */
    EXPECT(t, "1234567", 0, ID_123, ID_45, '6', '7');
    EXPECT(t, "a\n\nb", 0, 'a', ID_NLNL, 'b'); /* \s*[\r\n]+ keeps "\n\n" together */
    EXPECT(t, "IT'S", 0, ID_IT, ID_QS);        /* (?i:'s) */
    EXPECT(t, "(hello", 0, ID_PH, 'e', 'l', 'l', 'o'); /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    EXPECT(t, " wo", 0, ID_SPWO);
    EXPECT(t, "x  wo", 0, 'x', ' ', ID_SPWO);   /* \s+(?!\S) leaves the last space to the word */
    EXPECT(t, "x<|s|>>y<|s|>", 0, 'x', ID_SLONG, 'y', ID_S); /* longest special token */
    EXPECT(t, "<|bos|>12", 1, ID_BOS, ID_BOS, ID_12);
    EXPECT(t, "", 1, ID_BOS);
    int seq[] = {ID_BOS, ID_123, ID_SLONG, ID_45, ID_NLNL, ID_SPWO};
    char *s = decode(t, seq, 6);
    ck_assert_str_eq(s, "12345\n\n wo");
    free(s);
    sp_tokenizer_free(t);
}
END_TEST

START_TEST(test_gpt2_split_synthetic)
{
    sp_tokenizer *t = load_dir(write_byte_level(GPT2_PRE, NULL, 0));
    ck_assert_int_eq(sp_tokenizer_bos(t), -1);
    EXPECT(t, "12345", 1, ID_12, ID_34, '5'); /* one pre-token: merges by rank "1 2", "3 4" (then no "12 34") */
    EXPECT(t, "a\n\nb", 0, 'a', '\n', '\n', 'b');
    EXPECT(t, "IT'S", 0, ID_IT, '\'', 'S'); /* 's is case-sensitive in GPT-2 */
    EXPECT(t, "(hello", 0, '(', 'h', 'e', 'l', 'l', 'o');
    EXPECT(t, "   wo", 0, ID_SPSP, ID_SPWO);
    EXPECT(t, "x   ", 0, 'x', ID_SPSP, ' '); /* trailing spaces: one pre-token, merged "ĠĠ" then "Ġ" */
    sp_tokenizer_free(t);
}
END_TEST

START_TEST(test_byte_level_options)
{
    /* ignore_merges: a pre-token that is a piece is taken whole, with no merges needed */
    sp_tokenizer *t = load_dir(write_byte_level(GPT2_PRE, NULL, 1));
    EXPECT(t, "hello", 0, ID_HELLO);
    EXPECT(t, "hello hello", 0, ID_HELLO, ' ', 'h', 'e', 'l', 'l', 'o');
    sp_tokenizer_free(t);
    /* add_prefix_space: each stretch between special tokens gets a leading space */
    t = load_dir(write_byte_level("{\"type\":\"ByteLevel\",\"add_prefix_space\":true}", NULL, 0));
    EXPECT(t, "wo", 0, ID_SPWO);
    EXPECT(t, "wo<|s|>wo", 0, ID_SPWO, ID_S, ID_SPWO);
    EXPECT(t, " wo", 0, ID_SPWO);
    int seq[] = {ID_SPWO};
    char *s = decode(t, seq, 1);
    ck_assert_str_eq(s, " wo");
    free(s);
    sp_tokenizer_free(t);
    /* tokenizer_config.json overrides the template */
    const char *dir = write_byte_level(LLAMA3_PRE, BOS_POST, 0);
    char path[600];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"add_bos_token\":false,\"bos_token\":\"<|bos|>\",\"eos_token\":\"<|s|>\"}", f);
    fclose(f);
    t = load_dir(dir);
    ck_assert_int_eq(sp_tokenizer_eos(t), ID_S);
    EXPECT(t, "12", 1, ID_12);
    sp_tokenizer_free(t);
}
END_TEST

static void expect_load_error(const char *dir, const char *needle)
{
    sp_tokenizer *t = (sp_tokenizer *)1;
    sp_err err = {0};
    ck_assert(sp_tokenizer_load(&t, dir, &err) != SP_OK);
    ck_assert_ptr_null(t);
    ck_assert_msg(strstr(err.msg, needle) != NULL, "error '%s' should mention '%s'", err.msg, needle);
    ck_assert_msg(strstr(err.msg, "tokenizer.json") != NULL, "error '%s' should name the file", err.msg);
}

START_TEST(test_byte_level_bad_input)
{
    expect_load_error(write_byte_level("{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
                                       "{\"Regex\":\"\\\\w+\"}},{\"type\":\"ByteLevel\",\"use_regex\":false}]}",
                                       NULL, 0),
                      "Split pre_tokenizer pattern");
    expect_load_error(write_byte_level("{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\"},"
                                       "{\"type\":\"ByteLevel\"}]}",
                                       NULL, 0),
                      "Digits");
    expect_load_error(write_byte_level("{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"ByteLevel\"},"
                                       "{\"type\":\"ByteLevel\"}]}",
                                       NULL, 0),
                      "more than one");
    /* a vocab without the byte pieces cannot encode every text */
    const char *json = "{\"pre_tokenizer\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\","
                       "\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a b\"]}}";
    const char *path = sp_test_write_file("tokenizer.json", json, strlen(json));
    char dir[512];
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = '\0';
    expect_load_error(dir, "byte 0x00");
}
END_TEST

static Suite *bpe_suite(void)
{
    Suite *s = suite_create("tokenizer_bpe");
    TCase *tc = tcase_create("gpt2");
    tcase_add_test(tc, test_gpt2_golden);
    tcase_add_test(tc, test_gpt2_specials);
    tcase_add_test(tc, test_gpt2_stream_partial_utf8);
    suite_add_tcase(s, tc);
    TCase *syn = tcase_create("synthetic");
    tcase_add_test(syn, test_llama3_split);
    tcase_add_test(syn, test_gpt2_split_synthetic);
    tcase_add_test(syn, test_byte_level_options);
    tcase_add_test(syn, test_byte_level_bad_input);
    suite_add_tcase(s, syn);
    return s;
}

int main(void) { return sp_test_run(bpe_suite()); }
