/* test_tokenizer.c - tokenizer.json loader, encoder and decoders against llama2.c's stories15M goldens. */
#include <check.h>
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"
#include "tokenizer.h"

#define GOLDEN SEPAL_TEST_DATA "/stories15M/golden.jsonl"
#define MAX_GOLDEN 16

typedef struct golden {
    char *prompt, *text;
    int *prompt_ids, n_prompt;
    int *gen_ids, n_gen;
} golden;

static golden g_lines[MAX_GOLDEN];
static int g_n;

static int *json_ints(const cJSON *arr, int *n)
{
    *n = cJSON_GetArraySize(arr);
    int *v = malloc(((size_t)*n + 1) * sizeof *v), i = 0;
    for (const cJSON *e = arr->child; e; e = e->next)
        v[i++] = e->valueint;
    return v;
}

/* Loads golden.jsonl once (one JSON object per line). */
static void load_golden(void)
{
    if (g_n)
        return;
    FILE *f = fopen(GOLDEN, "r");
    ck_assert_msg(f != NULL, "cannot open %s", GOLDEN);
    static char line[1 << 16];
    while (g_n < MAX_GOLDEN && fgets(line, sizeof line, f)) {
        cJSON *j = cJSON_Parse(line);
        ck_assert_msg(j != NULL, "%s: line %d is not JSON", GOLDEN, g_n + 1);
        golden *g = &g_lines[g_n++];
        g->prompt = strdup(cJSON_GetObjectItem(j, "prompt")->valuestring);
        g->text = strdup(cJSON_GetObjectItem(j, "text")->valuestring);
        g->prompt_ids = json_ints(cJSON_GetObjectItem(j, "prompt_ids"), &g->n_prompt);
        g->gen_ids = json_ints(cJSON_GetObjectItem(j, "gen_ids_full"), &g->n_gen);
        cJSON_Delete(j);
    }
    fclose(f);
    ck_assert_int_gt(g_n, 0);
}

static sp_tokenizer *load_stories(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer.json", SEPAL_STORIES15M_DIR);
    ck_assert_msg(access(path, R_OK) == 0, "%s is missing: run scripts/fetch-model.sh first", path);
    sp_tokenizer *t = NULL;
    sp_err err = {0};
    sp_status s = sp_tokenizer_load(&t, SEPAL_STORIES15M_DIR, &err);
    ck_assert_msg(s == SP_OK, "load failed: %s", err.msg);
    return t;
}

static char *decode(const sp_tokenizer *t, const int *ids, int n)
{
    char *s = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_tokenizer_decode(t, ids, n, &s, &err) == SP_OK, "decode: %s", err.msg);
    return s;
}

/* Streams ids through sp_detok (small pieces of output concatenated) plus the final flush. */
static char *stream_decode(const sp_tokenizer *t, const int *ids, int n)
{
    size_t cap = 64, len = 0;
    char *out = malloc(cap), buf[SP_DETOK_BUF];
    sp_detok d;
    sp_detok_init(&d, t);
    for (int i = 0; i <= n; i++) {
        size_t w = i < n ? sp_detok_push(&d, ids[i], buf, sizeof buf) : sp_detok_flush(&d, buf, sizeof buf);
        ck_assert_uint_lt(w, sizeof buf);
        ck_assert_uint_eq(strlen(buf), w);
        while (len + w + 1 > cap)
            out = realloc(out, cap *= 2);
        memcpy(out + len, buf, w);
        len += w;
    }
    out[len] = '\0';
    return out;
}

static void assert_ids(const int *got, int ngot, const int *want, int nwant, const char *what)
{
    char gs[2048] = "", ws[2048] = "";
    for (int i = 0; i < ngot && strlen(gs) < 2000; i++)
        snprintf(gs + strlen(gs), sizeof gs - strlen(gs), "%d ", got[i]);
    for (int i = 0; i < nwant && strlen(ws) < 2000; i++)
        snprintf(ws + strlen(ws), sizeof ws - strlen(ws), "%d ", want[i]);
    ck_assert_msg(ngot == nwant && memcmp(got, want, (size_t)nwant * sizeof *got) == 0,
                  "%s: got [%s] want [%s]", what, gs, ws);
}

/* ---------------------------------------------------------------------------------------------- */

START_TEST(test_golden_encode)
{
    load_golden();
    sp_tokenizer *t = load_stories();
    ck_assert_int_eq(sp_tokenizer_vocab_size(t), 32000);
    ck_assert_int_eq(sp_tokenizer_bos(t), 1);
    ck_assert_int_eq(sp_tokenizer_eos(t), 2);
    ck_assert_int_eq(sp_tokenizer_kind(t), SP_TOK_SPM_BPE);
    for (int i = 0; i < g_n; i++) {
        int *ids, n;
        sp_err err = {0};
        ck_assert(sp_tokenizer_encode(t, g_lines[i].prompt, 1, &ids, &n, &err) == SP_OK);
        assert_ids(ids, n, g_lines[i].prompt_ids, g_lines[i].n_prompt, g_lines[i].prompt);
        free(ids);
        /* without specials: the same minus BOS */
        ck_assert(sp_tokenizer_encode(t, g_lines[i].prompt, 0, &ids, &n, &err) == SP_OK);
        assert_ids(ids, n, g_lines[i].prompt_ids + 1, g_lines[i].n_prompt - 1, g_lines[i].prompt);
        free(ids);
    }
    sp_tokenizer_free(t);
}
END_TEST

/* Ids that Hugging Face `tokenizers` itself produced from our converted tokenizer.json (an independent
 * reference for the exported file and for our encoder: spaces, tabs, newlines, CJK, byte fallback). */
START_TEST(test_hf_tokenizers_ids)
{
    FILE *f = fopen(SEPAL_TEST_DATA "/stories15M/hf_tokenizers_ids.json", "r");
    ck_assert_ptr_nonnull(f);
    char buf[8192];
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = '\0';
    cJSON *root = cJSON_Parse(buf);
    ck_assert_ptr_nonnull(root);
    sp_tokenizer *t = load_stories();
    const cJSON *c;
    int count = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases"))
    {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        int nwant, *want = json_ints(cJSON_GetObjectItem(c, "ids"), &nwant), *ids, n;
        sp_err err = {0};
        ck_assert(sp_tokenizer_encode(t, text, 1, &ids, &n, &err) == SP_OK);
        assert_ids(ids, n, want, nwant, text);
        free(ids);
        free(want);
        count++;
    }
    ck_assert_int_eq(count, 5);
    sp_tokenizer_free(t);
    cJSON_Delete(root);
}
END_TEST

START_TEST(test_golden_decode)
{
    load_golden();
    sp_tokenizer *t = load_stories();
    for (int i = 0; i < g_n; i++) {
        golden *g = &g_lines[i];
        int n = g->n_prompt + g->n_gen;
        int *all = malloc((size_t)n * sizeof *all);
        memcpy(all, g->prompt_ids, (size_t)g->n_prompt * sizeof *all);
        memcpy(all + g->n_prompt, g->gen_ids, (size_t)g->n_gen * sizeof *all);
        char *prompt = decode(t, g->prompt_ids, g->n_prompt);
        ck_assert_str_eq(prompt, g->prompt);
        /* run.c prints the prompt, the continuation, then "\n" */
        char *full = decode(t, all, n);
        size_t pl = strlen(g->prompt);
        ck_assert_uint_ge(strlen(full), pl);
        ck_assert_int_eq(strncmp(full, g->text, pl), 0);
        char want[8192];
        snprintf(want, sizeof want, "%s\n", full + pl);
        ck_assert_str_eq(want, g->text + pl);
        char *streamed = stream_decode(t, all, n);
        ck_assert_str_eq(streamed, full);
        free(streamed);
        free(full);
        free(prompt);
        free(all);
    }
    sp_tokenizer_free(t);
}
END_TEST

START_TEST(test_byte_fallback_roundtrip)
{
    static const char *const texts[] = {"ꙮ ♞ 🙂 ₿", "naïve café 🙂", "日本 ✓ é", "tabs\tand\nnewlines\r\n", "  two  spaces  ",
                                        "\xF0\x9F\x98\x80\xE2\x9C\x93 x", "<s> is not special </s>"};
    sp_tokenizer *t = load_stories();
    for (size_t k = 0; k < sizeof texts / sizeof *texts; k++) {
        int *ids, n, bytes = 0;
        sp_err err = {0};
        ck_assert(sp_tokenizer_encode(t, texts[k], 1, &ids, &n, &err) == SP_OK);
        ck_assert_int_eq(ids[0], 1);
        for (int i = 1; i < n; i++) {
            ck_assert_int_gt(ids[i], 2); /* nothing special, no <unk> */
            bytes += ids[i] < 259;
        }
        if (k <= 1)
            ck_assert_msg(bytes > 0, "'%s' should need byte fallback", texts[k]);
        char *back = decode(t, ids, n);
        ck_assert_str_eq(back, texts[k]);
        char *streamed = stream_decode(t, ids, n);
        ck_assert_str_eq(streamed, texts[k]);
        free(streamed);
        free(back);
        free(ids);
    }
    sp_tokenizer_free(t);
}
END_TEST

START_TEST(test_empty_and_specials)
{
    sp_tokenizer *t = load_stories();
    int *ids, n;
    sp_err err = {0};
    ck_assert(sp_tokenizer_encode(t, "", 1, &ids, &n, &err) == SP_OK);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(ids[0], 1);
    free(ids);
    ck_assert(sp_tokenizer_encode(t, "", 0, &ids, &n, &err) == SP_OK);
    ck_assert_int_eq(n, 0);
    free(ids);
    int specials[] = {1, 0, 2, 1};
    char *s = decode(t, specials, 4);
    ck_assert_str_eq(s, "");
    free(s);
    ck_assert_str_eq(sp_tokenizer_piece(t, 13), "<0x0A>");
    ck_assert_str_eq(sp_tokenizer_piece(t, 29871), "\xE2\x96\x81");
    ck_assert_ptr_null(sp_tokenizer_piece(t, 32000));
    ck_assert_ptr_null(sp_tokenizer_piece(t, -1));
    int bad[] = {1, 32000};
    s = NULL;
    ck_assert(sp_tokenizer_decode(t, bad, 2, &s, &err) == SP_ERR_RANGE);
    ck_assert_ptr_null(s);
    /* the leading space is dropped after BOS (and at the start), kept elsewhere */
    int once[] = {9038, 9038, 1, 9038}; /* "▁Once" */
    s = decode(t, once, 4);
    ck_assert_str_eq(s, "Once OnceOnce");
    free(s);
    sp_tokenizer_free(t);
}
END_TEST

START_TEST(test_incomplete_utf8_held_back)
{
    sp_tokenizer *t = load_stories();
    ck_assert_str_eq(sp_tokenizer_piece(t, 0xE2 + 3), "<0xE2>");
    char out[SP_DETOK_BUF];
    sp_detok d;
    sp_detok_init(&d, t);
    ck_assert_uint_eq(sp_detok_push(&d, 1, out, sizeof out), 0);
    ck_assert_uint_eq(sp_detok_push(&d, 0xE2 + 3, out, sizeof out), 0); /* ✓ = E2 9C 93 */
    ck_assert_str_eq(out, "");
    ck_assert_uint_eq(sp_detok_push(&d, 0x9C + 3, out, sizeof out), 0);
    ck_assert_uint_eq(sp_detok_push(&d, 0x93 + 3, out, sizeof out), 3);
    ck_assert_str_eq(out, "\xE2\x9C\x93");
    /* an incomplete sequence followed by text: passed through as it is */
    ck_assert_uint_eq(sp_detok_push(&d, 0xC3 + 3, out, sizeof out), 0);
    ck_assert_uint_eq(sp_detok_push(&d, 9038, out, sizeof out), 6);
    ck_assert_str_eq(out, "\xC3 Once");
    /* dangling at the end of the stream: flush hands it out */
    ck_assert_uint_eq(sp_detok_push(&d, 0xF0 + 3, out, sizeof out), 0);
    ck_assert_uint_eq(sp_detok_flush(&d, out, sizeof out), 1);
    ck_assert_str_eq(out, "\xF0");
    /* a small cap truncates but stays NUL-terminated when there is room */
    sp_detok_init(&d, t);
    ck_assert_uint_eq(sp_detok_push(&d, 9038, out, 3), 3);
    ck_assert_int_eq(memcmp(out, "Onc", 3), 0);
    sp_tokenizer_free(t);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* synthetic tokenizers and bad input */

static const char *write_dir(const char *tok_json, const char *cfg_json)
{
    const char *dir = sp_test_tmpdir();
    ck_assert_ptr_nonnull(dir);
    char path[512];
    if (tok_json) {
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        FILE *f = fopen(path, "w");
        fputs(tok_json, f);
        fclose(f);
    }
    if (cfg_json) {
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        FILE *f = fopen(path, "w");
        fputs(cfg_json, f);
        fclose(f);
    }
    return dir;
}

static void expect_load_error(const char *dir, const char *needle)
{
    sp_tokenizer *t = (sp_tokenizer *)1;
    sp_err err = {0};
    ck_assert(sp_tokenizer_load(&t, dir, &err) != SP_OK);
    ck_assert_ptr_null(t);
    ck_assert_msg(strstr(err.msg, needle) != NULL, "error '%s' should mention '%s'", err.msg, needle);
}

#define TINY_HEAD                                                                                                \
    "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true},{\"id\":1,\"content\":\"<s>\","    \
    "\"special\":true}],\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\","        \
    "\"prepend\":\"\xE2\x96\x81\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":"         \
    "\"\xE2\x96\x81\"}]},\"pre_tokenizer\":null,\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\","         \
    "\"fuse_unk\":true,\"byte_fallback\":false,\"vocab\":{\"<unk>\":0,\"<s>\":1,\"\xE2\x96\x81\":2,\"a\":3,"  \
    "\"b\":4,\"c\":5,\"ab\":6,\"bc\":7,\"abc\":8,\"\xE2\x96\x81" "a\":9},"

START_TEST(test_synthetic_merges)
{
    /* "b c" ranks before "a b": "abc" -> a,bc -> (no "a bc" merge) ; merges in both spellings */
    const char *dir = write_dir(TINY_HEAD "\"merges\":[[\"b\",\"c\"],\"a b\",\"ab c\"]}}", NULL);
    sp_tokenizer *t = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_tokenizer_load(&t, dir, &err) == SP_OK, "%s", err.msg);
    ck_assert_int_eq(sp_tokenizer_bos(t), 1);
    ck_assert_int_eq(sp_tokenizer_eos(t), -1);
    int *ids, n;
    ck_assert(sp_tokenizer_encode(t, "abc", 1, &ids, &n, &err) == SP_OK);
    int want1[] = {1, 2, 3, 7};
    assert_ids(ids, n, want1, 4, "abc");
    free(ids);
    /* leftmost wins between equal-rank pairs; unknown characters fuse into one <unk> */
    ck_assert(sp_tokenizer_encode(t, "bcbc xyz", 0, &ids, &n, &err) == SP_OK);
    int want2[] = {2, 7, 7, 2, 0};
    assert_ids(ids, n, want2, 5, "bcbc xyz");
    free(ids);
    sp_tokenizer_free(t);

    /* tokenizer_config.json switches BOS off */
    dir = write_dir(TINY_HEAD "\"merges\":[]}}", "{\"add_bos_token\":false,\"bos_token\":{\"content\":\"<s>\"}}");
    ck_assert_msg(sp_tokenizer_load(&t, dir, &err) == SP_OK, "%s", err.msg);
    ck_assert(sp_tokenizer_encode(t, "ab", 1, &ids, &n, &err) == SP_OK);
    int want3[] = {2, 3, 4};
    assert_ids(ids, n, want3, 3, "ab");
    free(ids);
    sp_tokenizer_free(t);
}
END_TEST

/* The vocab and the merges are read in place by the tokenizer's own small JSON reader (not cJSON): its string
 * escapes must decode as JSON says: \uXXXX (with surrogate pairs), \" \\ \/ \n \t; a merge may hold them too. */
START_TEST(test_json_escapes)
{
    const char *dir = write_dir("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"\\u0041\":0,\"b\":1,\"Ab\":2,"
                                "\"q\\\"\\\\\\/\":3,\"\\ud83d\\ude00\":4,\"\\u00e9\\n\\t\":5,\"x\":6},"
                                "\"merges\":[\"\\u0041 b\"]},\"added_tokens\":[]}",
                                NULL);
    sp_tokenizer *t = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_tokenizer_load(&t, dir, &err) == SP_OK, "%s", err.msg);
    ck_assert_str_eq(sp_tokenizer_piece(t, 0), "A");
    ck_assert_str_eq(sp_tokenizer_piece(t, 2), "Ab");
    ck_assert_str_eq(sp_tokenizer_piece(t, 3), "q\"\\/");
    ck_assert_str_eq(sp_tokenizer_piece(t, 4), "\xF0\x9F\x98\x80");
    ck_assert_str_eq(sp_tokenizer_piece(t, 5), "\xC3\xA9\n\t");
    int *ids, n;
    ck_assert(sp_tokenizer_encode(t, "Ab", 0, &ids, &n, &err) == SP_OK);
    int want[] = {2}; /* the escaped merge "A b" applies */
    assert_ids(ids, n, want, 1, "Ab");
    free(ids);
    sp_tokenizer_free(t);
    /* malformed strings in the vocab: each is an error naming the file */
    expect_load_error(write_dir("{\"model\":{\"vocab\":{\"\\x41\":0}}}", NULL), "tokenizer.json");
    expect_load_error(write_dir("{\"model\":{\"vocab\":{\"\\udc00\":0}}}", NULL), "tokenizer.json");
    expect_load_error(write_dir("{\"model\":{\"vocab\":{\"\\ud83d\":0}}}", NULL), "tokenizer.json");
    expect_load_error(write_dir("{\"model\":{\"vocab\":{\"a\":0,\"b}}}", NULL), "tokenizer.json");
    expect_load_error(write_dir("{\"model\":{\"vocab\":{\"a\" 0}}}", NULL), "tokenizer.json");
    expect_load_error(write_dir("{\"model\":{\"vocab\":{\"a\":0},\"merges\":[\"a a\",]}}", NULL), "tokenizer.json");
}
END_TEST

START_TEST(test_bad_input)
{
    expect_load_error(write_dir(NULL, NULL), "tokenizer.json");
    expect_load_error(write_dir("{\"model\": {\"vocab\": {\"a\": 0,", NULL), "tokenizer.json");
    expect_load_error(write_dir("[1, 2]", NULL), "tokenizer.json");
    expect_load_error(write_dir("{\"model\":{\"type\":\"BPE\"}}", NULL), "vocab");
    expect_load_error(write_dir("{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}", NULL), "WordPiece");
    expect_load_error(write_dir("{\"model\":{\"vocab\":{\"a\":-1}}}", NULL), "tokenizer.json");
    expect_load_error(write_dir("{\"model\":{\"vocab\":{\"a\":0,\"b\":0}}}", NULL), "tokenizer.json");
    expect_load_error(write_dir(TINY_HEAD "\"merges\":[[\"a\",\"x\"]]}}", NULL), "merge 0");
    expect_load_error(write_dir(TINY_HEAD "\"merges\":[[\"c\",\"a\"]]}}", NULL), "merge 0");
    expect_load_error(write_dir(TINY_HEAD "\"merges\":[]}}", "{\"add_bos_token\": tru"), "tokenizer_config.json");
    expect_load_error(write_dir("{\"pre_tokenizer\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\","
                                "\"vocab\":{\"a\":0},\"merges\":[]}}",
                                NULL),
                      "byte-level");
    char missing[512];
    snprintf(missing, sizeof missing, "%s/does-not-exist", sp_test_tmpdir());
    expect_load_error(missing, "does-not-exist/tokenizer.json");
}
END_TEST

static Suite *tokenizer_suite(void)
{
    Suite *s = suite_create("tokenizer");
    TCase *tc = tcase_create("stories15M");
    tcase_add_test(tc, test_golden_encode);
    tcase_add_test(tc, test_golden_decode);
    tcase_add_test(tc, test_hf_tokenizers_ids);
    tcase_add_test(tc, test_byte_fallback_roundtrip);
    tcase_add_test(tc, test_empty_and_specials);
    tcase_add_test(tc, test_incomplete_utf8_held_back);
    suite_add_tcase(s, tc);
    TCase *syn = tcase_create("synthetic");
    tcase_add_test(syn, test_synthetic_merges);
    tcase_add_test(syn, test_json_escapes);
    tcase_add_test(syn, test_bad_input);
    suite_add_tcase(s, syn);
    return s;
}

int main(void) { return sp_test_run(tokenizer_suite()); }
