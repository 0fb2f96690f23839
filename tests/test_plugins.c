/* test_plugins.c - the plugin host (loading, ABI checks, registry) and the shipped tasks, sst2 (on the
 * sentiment data of scripts/fetch-sentiment.sh) and causal_lm, with a fake tokenizer: BOS 1, byte b -> b + 3. */
#include "host.h"
#include "testutil.h"

#include <cJSON.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PLUGIN_DIR SEPAL_BIN_DIR "/plugins"
#define SST2_SO PLUGIN_DIR "/libsepal_sst2.so"
#define CLM_SO PLUGIN_DIR "/libsepal_causal_lm.so"
#define BAD_ABI_SO PLUGIN_DIR "/libsepal_test_bad_abi.so"
#define NO_SYMBOL_SO PLUGIN_DIR "/libsepal_test_no_symbol.so"
#define VOCAB 259
#define BOS 1
#define PAD 0

/* BOS, then each byte + 3; -1 when it does not fit (the tasks must offer enough room). */
static int fake_encode(void *ctx, const char *text, int32_t *ids, int cap)
{
    int n = (int)strlen(text) + 1;
    if (n > cap)
        return -1;
    ids[0] = BOS;
    for (int i = 1; i < n; i++)
        ids[i] = (unsigned char)text[i - 1] + 3;
    return n;
}

static const sepal_host host = {
    .abi = SEPAL_PLUGIN_ABI, .encode = fake_encode, .vocab = VOCAB, .pad_id = PAD, .bos_id = BOS, .eos_id = 2};

/* The text of row r of a batch (ids 1..last[r] minus 3). */
static void decode_row(const sepal_batch *b, int r, char *out, size_t cap)
{
    size_t n = 0;
    for (int j = 1; j <= b->last[r] && n + 1 < cap; j++)
        out[n++] = (char)(b->ids[(size_t)r * b->T + j] - 3);
    out[n] = 0;
}

static void require_sentiment_data(void)
{
    struct stat sb;
    ck_assert_msg(stat(SEPAL_SENTIMENT_DIR "/imdb.json", &sb) == 0,
                  "%s: no sentiment data; run scripts/fetch-sentiment.sh first", SEPAL_SENTIMENT_DIR);
}

static void *open_task(const sepal_task *t, const char *args)
{
    char err[512] = "";
    void *h = t->open(&host, args, err, sizeof err);
    ck_assert_msg(h != NULL, "%s: %s", t->name, err);
    return h;
}

static void *open_sst2(void)
{
    require_sentiment_data();
    return open_task(sp_sst2_task(), "data=" SEPAL_SENTIMENT_DIR);
}

/* ---- the host ----------------------------------------------------------------------------------------- */

START_TEST(t_load_sst2_so)
{
    sp_plugin_unload_all();
    const sepal_task *t = NULL;
    char err[512] = "";
    ck_assert_msg(sp_plugin_load(SST2_SO, &t, err, sizeof err) == 0, "%s", err);
    ck_assert_ptr_nonnull(t);
    ck_assert_ptr_ne(t, sp_sst2_task()); /* the module's own copy */
    ck_assert_str_eq(t->name, "sst2");
    ck_assert_int_eq(t->num_labels, 2);
    ck_assert_ptr_eq(sp_plugin_find("sst2"), t);
    ck_assert_int_eq(sp_plugin_count(), 1);
    ck_assert_str_eq(sp_plugin_origin(0), SST2_SO);
    const sepal_task *again = NULL;
    ck_assert_int_eq(sp_plugin_load(SST2_SO, &again, err, sizeof err), 0);
    ck_assert_ptr_eq(again, t);
    ck_assert_int_eq(sp_plugin_count(), 1);

    require_sentiment_data();
    void *h = open_task(t, "data=" SEPAL_SENTIMENT_DIR);
    ck_assert_int_eq(t->size(h, SEPAL_SPLIT_TRAIN), 2000);
    ck_assert_int_eq(t->size(h, SEPAL_SPLIT_VALID), 1000);
    t->close(h);
    sp_plugin_unload_all();
    ck_assert_int_eq(sp_plugin_count(), 0);
    ck_assert_ptr_null(sp_plugin_find("sst2"));
}
END_TEST

START_TEST(t_load_causal_lm_so)
{
    sp_plugin_unload_all();
    const sepal_task *t = NULL;
    char err[512] = "";
    ck_assert_msg(sp_plugin_load(CLM_SO, &t, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(t->name, "causal_lm");
    ck_assert_int_eq(t->num_labels, 0);
    const char *f = sp_test_write_file("text.txt", "hello plugin world", 18);
    char args[600];
    snprintf(args, sizeof args, "file=%s length=8 valid=0", f);
    void *h = open_task(t, args);
    ck_assert_int_eq(t->size(h, SEPAL_SPLIT_TRAIN), 3); /* 18 bytes in chunks of 7 */
    t->close(h);
    /* the module's sepal_plugin_check_args came with it: the arguments alone, nothing opened */
    ck_assert_int_eq(sp_plugin_check_args(t, args, err, sizeof err), 0);
    ck_assert_int_eq(sp_plugin_check_args(t, "file=/nonexistent/corpus.txt", err, sizeof err), -1);
    ck_assert_str_eq(err, "causal_lm: cannot read /nonexistent/corpus.txt: No such file or directory");
}
END_TEST

START_TEST(t_bad_abi)
{
    sp_plugin_unload_all();
    const sepal_task *t = (const sepal_task *)&host;
    char err[512] = "", want[512];
    ck_assert_int_eq(sp_plugin_load(BAD_ABI_SO, &t, err, sizeof err), -1);
    ck_assert_ptr_null(t);
    snprintf(want, sizeof want, "plugin %s was built for plugin ABI 7, this sepal speaks %u", BAD_ABI_SO,
             (unsigned)SEPAL_PLUGIN_ABI);
    ck_assert_str_eq(err, want);
    ck_assert_int_eq(sp_plugin_count(), 0);
    ck_assert_ptr_null(sp_plugin_find("bad_abi"));
}
END_TEST

START_TEST(t_missing_and_no_symbol)
{
    const sepal_task *t = NULL;
    char err[512] = "";
    ck_assert_int_eq(sp_plugin_load(PLUGIN_DIR "/no-such-plugin.so", &t, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, PLUGIN_DIR "/no-such-plugin.so"));
    ck_assert_ptr_nonnull(strstr(err, "No such file"));
    ck_assert_int_eq(sp_plugin_load(NO_SYMBOL_SO, &t, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, NO_SYMBOL_SO));
    ck_assert_ptr_nonnull(strstr(err, "not a sepal plugin"));
    ck_assert_ptr_nonnull(strstr(err, SEPAL_PLUGIN_SYMBOL));
    const char *junk = sp_test_write_file("junk.so", "not an ELF file", 15);
    ck_assert_int_eq(sp_plugin_load(junk, &t, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "cannot load plugin"));
    ck_assert_int_eq(sp_plugin_load("", &t, err, sizeof err), -1);
    ck_assert_int_eq(sp_plugin_count(), 0);
}
END_TEST

START_TEST(t_check)
{
    sepal_task t = *sp_sst2_task();
    char err[256];
    ck_assert_int_eq(sp_plugin_check(&t, "task x", err, sizeof err), 0);
    t.batch = NULL;
    ck_assert_int_eq(sp_plugin_check(&t, "task x", err, sizeof err), -1);
    ck_assert_str_eq(err, "task x lacks the required callback batch");
    t = *sp_sst2_task();
    t.num_labels = -1;
    ck_assert_int_eq(sp_plugin_check(&t, "task x", err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "num_labels"));
    t = *sp_sst2_task();
    t.metrics_get = NULL;
    ck_assert_int_eq(sp_plugin_check(&t, "task x", err, sizeof err), -1);
    t = *sp_sst2_task();
    t.abi = 2;
    ck_assert_int_eq(sp_plugin_register(&t, NULL), -1);
    ck_assert_int_eq(sp_plugin_check(NULL, "task x", err, sizeof err), -1);
}
END_TEST

START_TEST(t_builtins)
{
    sp_plugin_unload_all();
    ck_assert_int_eq(sp_plugin_register_builtins(), 0);
    ck_assert_int_eq(sp_plugin_count(), 2);
    ck_assert_ptr_eq(sp_plugin_find("sst2"), sp_sst2_task());
    ck_assert_ptr_eq(sp_plugin_find("causal_lm"), sp_causal_lm_task());
    ck_assert_str_eq(sp_plugin_origin(1), "built-in");
    ck_assert_ptr_null(sp_plugin_find("nope"));
    ck_assert_ptr_null(sp_plugin_at(2));
    /* a loaded task replaces the built-in one of the same name */
    const sepal_task *t = NULL;
    char err[512] = "";
    ck_assert_msg(sp_plugin_load(SST2_SO, &t, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(sp_plugin_count(), 2);
    ck_assert_ptr_eq(sp_plugin_find("sst2"), t);
    ck_assert_int_eq(sp_plugin_register_builtins(), 0); /* and back */
    ck_assert_ptr_eq(sp_plugin_find("sst2"), sp_sst2_task());
    /* the built-in checks of arguments, without a tokenizer or anything opened */
    ck_assert_int_eq(sp_plugin_check_args(sp_causal_lm_task(), "file=/nonexistent", err, sizeof err), -1);
    ck_assert_str_eq(err, "causal_lm: cannot read /nonexistent: No such file or directory");
    ck_assert_int_eq(sp_plugin_check_args(sp_causal_lm_task(), "file=/tmp", err, sizeof err), -1);
    ck_assert_str_eq(err, "causal_lm: cannot read /tmp: Is a directory");
    ck_assert_int_eq(sp_plugin_check_args(sp_causal_lm_task(), "", err, sizeof err), -1);
    ck_assert_str_eq(err, "causal_lm: no text file: pass file=PATH");
    ck_assert_int_eq(sp_plugin_check_args(sp_causal_lm_task(), "file=/etc/hostname lenght=8", err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "bad argument lenght=8"));
    ck_assert_int_eq(sp_plugin_check_args(sp_sst2_task(), "data=/nonexistent", err, sizeof err), -1);
    ck_assert_str_eq(err, "no sentiment data in /nonexistent: run scripts/fetch-sentiment.sh");
    ck_assert_int_eq(sp_plugin_check_args(sp_sst2_task(), "dat=x", err, sizeof err), -1);
    ck_assert_str_eq(err, "sst2: unknown argument dat=x (it takes data=DIR)");
    char args[600];
    snprintf(args, sizeof args, "data=%s", SEPAL_SENTIMENT_DIR);
    ck_assert_msg(sp_plugin_check_args(sp_sst2_task(), args, err, sizeof err) == 0, "%s", err);
    sp_plugin_unload_all();
}
END_TEST

/* ---- sst2 --------------------------------------------------------------------------------------------- */

static cJSON *read_json(const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", SEPAL_SENTIMENT_DIR, name);
    cJSON *j = sp_test_read_json(path);
    ck_assert_msg(cJSON_IsArray(j), "%s", path);
    return j;
}

/* Compares examples [base, base + 1000) of split with the JSON file's entries, stripped. */
static void check_split_against(const sepal_task *t, void *h, int split, int base, const char *file)
{
    cJSON *j = read_json(file);
    ck_assert_int_eq(cJSON_GetArraySize(j), 1001);
    int idx[50];
    char err[256], text[2048], want[2048];
    for (int i0 = 0; i0 < 1000; i0 += 50) {
        for (int k = 0; k < 50; k++)
            idx[k] = base + i0 + k;
        sepal_batch b;
        ck_assert_msg(t->batch(h, split, idx, 50, 4096, &b, err, sizeof err) == 0, "%s", err);
        for (int k = 0; k < 50; k++) {
            const cJSON *e = cJSON_GetArrayItem(j, i0 + k);
            const char *s = cJSON_GetObjectItem(e, "text")->valuestring;
            while (isspace((unsigned char)*s))
                s++;
            snprintf(want, sizeof want, "%s", s);
            for (size_t n = strlen(want); n && isspace((unsigned char)want[n - 1]); n--)
                want[n - 1] = 0;
            decode_row(&b, k, text, sizeof text);
            ck_assert_str_eq(text, want);
            ck_assert_msg(text[0] && !isspace((unsigned char)text[strlen(text) - 1]), "%s: %s", file, text);
            ck_assert_int_eq(b.labels[k], cJSON_GetObjectItem(e, "class")->valueint);
        }
    }
    cJSON_Delete(j);
}

START_TEST(t_sst2_data)
{
    const sepal_task *t = sp_sst2_task();
    void *h = open_sst2();
    ck_assert_int_eq(t->size(h, SEPAL_SPLIT_TRAIN), 2000);
    ck_assert_int_eq(t->size(h, SEPAL_SPLIT_VALID), 1000);
    int idx[1] = {0};
    sepal_batch b;
    char err[256], text[512];
    ck_assert_int_eq(t->batch(h, SEPAL_SPLIT_TRAIN, idx, 1, 512, &b, err, sizeof err), 0);
    decode_row(&b, 0, text, sizeof text);
    ck_assert_str_eq(text, "So there is no way for me to plug it in here in the US unless I go by a converter.");
    ck_assert_int_eq(b.labels[0], 0);
    ck_assert_int_eq(t->batch(h, SEPAL_SPLIT_VALID, idx, 1, 512, &b, err, sizeof err), 0);
    decode_row(&b, 0, text, sizeof text);
    ck_assert_str_eq(text, "A very, very, very slow-moving, aimless movie about a distressed, drifting young man.");
    check_split_against(t, h, SEPAL_SPLIT_TRAIN, 0, "amazon.json");
    check_split_against(t, h, SEPAL_SPLIT_TRAIN, 1000, "yelp.json");
    check_split_against(t, h, SEPAL_SPLIT_VALID, 0, "imdb.json");
    t->close(h);
}
END_TEST

START_TEST(t_sst2_batch)
{
    const sepal_task *t = sp_sst2_task();
    void *h = open_sst2();
    /* amazon 0..2: "So there is ..." (82 bytes), "Good case, Excellent value." (27), "Great for the jawbone." (22) */
    int idx[3] = {0, 1, 2}, len[3] = {82, 27, 22};
    sepal_batch b;
    char err[256];
    ck_assert_msg(t->batch(h, SEPAL_SPLIT_TRAIN, idx, 3, 1000, &b, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(b.B, 3);
    ck_assert_int_eq(b.T, 83);
    ck_assert_ptr_null(b.targets);
    ck_assert_ptr_null(b.values);
    for (int r = 0; r < 3; r++) {
        ck_assert_int_eq(b.last[r], len[r]);
        ck_assert_int_eq(b.ids[r * b.T], BOS);
        ck_assert_int_eq(b.ids[r * b.T + len[r]], '.' + 3);
        for (int j = len[r] + 1; j < b.T; j++)
            ck_assert_int_eq(b.ids[r * b.T + j], PAD);
    }
    ck_assert_int_eq(b.labels[0], 0);
    ck_assert_int_eq(b.labels[1], 1);
    ck_assert_int_eq(b.labels[2], 1);
    /* truncation to max_length */
    ck_assert_int_eq(t->batch(h, SEPAL_SPLIT_TRAIN, idx, 3, 5, &b, err, sizeof err), 0);
    ck_assert_int_eq(b.T, 5);
    const int32_t want[5] = {BOS, 'G' + 3, 'o' + 3, 'o' + 3, 'd' + 3};
    for (int j = 0; j < 5; j++)
        ck_assert_int_eq(b.ids[5 + j], want[j]);
    for (int r = 0; r < 3; r++)
        ck_assert_int_eq(b.last[r], 4);
    /* errors */
    int bad[2] = {0, 2000};
    ck_assert_int_eq(t->batch(h, SEPAL_SPLIT_TRAIN, bad, 2, 8, &b, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "2000"));
    ck_assert_int_eq(t->batch(h, 2, idx, 1, 8, &b, err, sizeof err), -1);
    ck_assert_int_eq(t->batch(h, SEPAL_SPLIT_TRAIN, idx, 1, 0, &b, err, sizeof err), -1);
    ck_assert_int_eq(t->size(h, 5), -1);
    t->close(h);
}
END_TEST

START_TEST(t_sst2_open_errors)
{
    const sepal_task *t = sp_sst2_task();
    char err[512] = "";
    ck_assert_ptr_null(t->open(&host, "data=/nonexistent/sepal-sentiment", err, sizeof err));
    ck_assert_str_eq(err, "no sentiment data in /nonexistent/sepal-sentiment: run scripts/fetch-sentiment.sh");
    const char *dir = sp_test_tmpdir();
    char args[512], want[600];
    snprintf(args, sizeof args, "  data=%s  ", dir);
    ck_assert_ptr_null(t->open(&host, args, err, sizeof err));
    snprintf(want, sizeof want, "no sentiment data in %s: run scripts/fetch-sentiment.sh", dir);
    ck_assert_str_eq(err, want);
    ck_assert_ptr_null(t->open(&host, "colour=blue", err, sizeof err));
    ck_assert_ptr_nonnull(strstr(err, "colour=blue"));
    /* a corrupt file */
    char path[600];
    snprintf(path, sizeof path, "%s/amazon.json", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("[{\"text\": \"fine\", \"class\": 3}]", f);
    fclose(f);
    ck_assert_ptr_null(t->open(&host, args, err, sizeof err));
    ck_assert_ptr_nonnull(strstr(err, "entry 0"));
}
END_TEST

START_TEST(t_sst2_metrics)
{
    const sepal_task *t = sp_sst2_task();
    void *h = open_sst2();
    char out[128];
    t->metrics_reset(h);
    ck_assert_int_eq(t->metrics_get(h, out, sizeof out), 0);
    ck_assert_str_eq(out, "accuracy=n/a n=0");
    int32_t labels[4] = {0, 1, 1, 0};
    const float logits[8] = {2, 1, 0, 3, 5, -1, 0.5f, 0.4f}; /* predicts 0, 1, 0, 0 */
    sepal_batch b = {.B = 4, .T = 1, .labels = labels};
    t->metrics_add(h, logits, &b);
    ck_assert_int_eq(t->metrics_get(h, out, sizeof out), 0);
    ck_assert_str_eq(out, "accuracy=0.7500 n=4");
    t->metrics_add(h, logits, &b);
    ck_assert_int_eq(t->metrics_get(h, out, sizeof out), 0);
    ck_assert_str_eq(out, "accuracy=0.7500 n=8");
    ck_assert_int_eq(t->metrics_get(h, out, 5), -1);
    t->metrics_reset(h);
    ck_assert_int_eq(t->metrics_get(h, out, sizeof out), 0);
    ck_assert_str_eq(out, "accuracy=n/a n=0");
    t->close(h);
}
END_TEST

/* ---- causal_lm ---------------------------------------------------------------------------------------- */

#define TEXT40 "0123456789abcdefghijABCDEFGHIJklmnopqrst"

static void *open_clm(const char *extra)
{
    const char *f = sp_test_write_file("corpus.txt", TEXT40, 40);
    ck_assert_ptr_nonnull(f);
    char args[700];
    snprintf(args, sizeof args, "file=%s %s", f, extra);
    return open_task(sp_causal_lm_task(), args);
}

/* Row r of b is BOS then TEXT40[start..start+n) and targets are the ids shifted by one from skip on. */
static void check_row(const sepal_batch *b, int r, int start, int n, int skip)
{
    const int32_t *ids = b->ids + (size_t)r * b->T, *tg = b->targets + (size_t)r * b->T;
    ck_assert_int_eq(ids[0], BOS);
    for (int j = 1; j <= n; j++)
        ck_assert_int_eq(ids[j], TEXT40[start + j - 1] + 3);
    ck_assert_int_eq(b->last[r], n);
    for (int j = 0; j < b->T; j++) {
        int32_t want = j < n && j >= skip ? ids[j + 1] : -1;
        ck_assert_msg(tg[j] == want, "row %d target %d: %d, want %d", r, j, tg[j], want);
        if (j > n)
            ck_assert_int_eq(ids[j], PAD);
    }
}

START_TEST(t_clm_chunks)
{
    const sepal_task *t = sp_causal_lm_task();
    void *h = open_clm("length=8"); /* 40 tokens in chunks of 7: 6 chunks, 1 (10 %) for validation */
    ck_assert_int_eq(t->size(h, SEPAL_SPLIT_TRAIN), 5);
    ck_assert_int_eq(t->size(h, SEPAL_SPLIT_VALID), 1);
    int idx[2] = {0, 1};
    sepal_batch b;
    char err[256];
    ck_assert_msg(t->batch(h, SEPAL_SPLIT_TRAIN, idx, 2, 64, &b, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(b.B, 2);
    ck_assert_int_eq(b.T, 8);
    ck_assert_ptr_null(b.labels);
    check_row(&b, 0, 0, 7, 0);
    check_row(&b, 1, 7, 7, 0);
    ck_assert_int_eq(b.targets[0], '0' + 3);
    ck_assert_int_eq(b.targets[7], -1);
    /* the validation chunk is the last 5 tokens; a mixed batch pads the short row */
    ck_assert_int_eq(t->batch(h, SEPAL_SPLIT_VALID, idx, 1, 64, &b, err, sizeof err), 0);
    ck_assert_int_eq(b.T, 6);
    check_row(&b, 0, 35, 5, 0);
    int mix[2] = {4, 0};
    ck_assert_int_eq(t->batch(h, SEPAL_SPLIT_TRAIN, mix, 2, 64, &b, err, sizeof err), 0);
    check_row(&b, 0, 28, 7, 0);
    /* truncation */
    ck_assert_int_eq(t->batch(h, SEPAL_SPLIT_TRAIN, idx, 2, 4, &b, err, sizeof err), 0);
    ck_assert_int_eq(b.T, 4);
    check_row(&b, 1, 7, 3, 0);
    ck_assert_int_eq(t->batch(h, SEPAL_SPLIT_VALID, idx + 1, 1, 64, &b, err, sizeof err), -1);
    t->close(h);
}
END_TEST

START_TEST(t_clm_stride_and_split)
{
    const sepal_task *t = sp_causal_lm_task();
    /* stride 3 over chunks of 7: starts 0, 3, ..., 33 (the one reaching the end); 12 chunks, 4 validation */
    void *h = open_clm("length=8 stride=3 valid=0.3");
    ck_assert_int_eq(t->size(h, SEPAL_SPLIT_TRAIN), 8);
    ck_assert_int_eq(t->size(h, SEPAL_SPLIT_VALID), 4);
    int idx[2] = {0, 1};
    sepal_batch b;
    char err[256];
    ck_assert_int_eq(t->batch(h, SEPAL_SPLIT_TRAIN, idx, 2, 64, &b, err, sizeof err), 0);
    check_row(&b, 0, 0, 7, 0);
    check_row(&b, 1, 3, 7, 4); /* tokens 3..6 were predicted by chunk 0 */
    int lastv[1] = {3};
    ck_assert_int_eq(t->batch(h, SEPAL_SPLIT_VALID, lastv, 1, 64, &b, err, sizeof err), 0);
    check_row(&b, 0, 33, 7, 4);
    t->close(h);
    h = open_clm("valid=0 length=8");
    ck_assert_int_eq(t->size(h, SEPAL_SPLIT_TRAIN), 6);
    ck_assert_int_eq(t->size(h, SEPAL_SPLIT_VALID), 0);
    t->close(h);
}
END_TEST

START_TEST(t_clm_open_errors)
{
    const sepal_task *t = sp_causal_lm_task();
    char err[512] = "", args[700];
    ck_assert_ptr_null(t->open(&host, "", err, sizeof err));
    ck_assert_ptr_nonnull(strstr(err, "file=PATH"));
    ck_assert_ptr_null(t->open(&host, "file=/nonexistent/corpus.txt", err, sizeof err));
    ck_assert_ptr_nonnull(strstr(err, "/nonexistent/corpus.txt"));
    const char *f = sp_test_write_file("empty.txt", "", 0);
    snprintf(args, sizeof args, "file=%s", f);
    ck_assert_ptr_null(t->open(&host, args, err, sizeof err));
    ck_assert_ptr_nonnull(strstr(err, "empty"));
    f = sp_test_write_file("t.txt", "abc", 3);
    const char *bad[] = {"valid=1", "valid=x", "length=1", "stride=0", "length=4 stride=9", "speed=3"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(args, sizeof args, "file=%s %s", f, bad[i]);
        ck_assert_msg(t->open(&host, args, err, sizeof err) == NULL, "%s accepted", bad[i]);
    }
}
END_TEST

START_TEST(t_clm_perplexity)
{
    const sepal_task *t = sp_causal_lm_task();
    void *h = open_clm("length=8");
    int idx[2] = {0, 1};
    sepal_batch b;
    char err[256], out[128];
    ck_assert_int_eq(t->batch(h, SEPAL_SPLIT_TRAIN, idx, 2, 64, &b, err, sizeof err), 0);
    size_t n = (size_t)b.B * b.T * VOCAB;
    float *logits = calloc(n, sizeof *logits);
    for (size_t i = 0; i < n; i++)
        logits[i] = 3.25f; /* uniform */
    t->metrics_reset(h);
    t->metrics_add(h, logits, &b);
    ck_assert_int_eq(t->metrics_get(h, out, sizeof out), 0);
    double loss, ppl;
    long long tokens;
    ck_assert_int_eq(sscanf(out, "loss=%lf perplexity=%lf tokens=%lld", &loss, &ppl, &tokens), 3);
    ck_assert_double_eq_tol(loss, log((double)VOCAB), 1e-4);
    ck_assert_double_eq_tol(ppl, VOCAB, 1e-2);
    ck_assert_int_eq(tokens, 14);
    /* all mass on the targets: loss 0, perplexity 1 */
    for (size_t i = 0; i < (size_t)b.B * b.T; i++)
        if (b.targets[i] >= 0)
            logits[i * VOCAB + (size_t)b.targets[i]] = 100;
    t->metrics_reset(h);
    t->metrics_add(h, logits, &b);
    ck_assert_int_eq(t->metrics_get(h, out, sizeof out), 0);
    ck_assert_int_eq(sscanf(out, "loss=%lf perplexity=%lf tokens=%lld", &loss, &ppl, &tokens), 3);
    ck_assert_double_eq_tol(ppl, 1.0, 1e-4);
    free(logits);
    t->close(h);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("plugins");
    TCase *host_tc = tcase_create("host");
    tcase_add_test(host_tc, t_load_sst2_so);
    tcase_add_test(host_tc, t_load_causal_lm_so);
    tcase_add_test(host_tc, t_bad_abi);
    tcase_add_test(host_tc, t_missing_and_no_symbol);
    tcase_add_test(host_tc, t_check);
    tcase_add_test(host_tc, t_builtins);
    suite_add_tcase(s, host_tc);
    TCase *sst2 = tcase_create("sst2");
    tcase_add_test(sst2, t_sst2_data);
    tcase_add_test(sst2, t_sst2_batch);
    tcase_add_test(sst2, t_sst2_open_errors);
    tcase_add_test(sst2, t_sst2_metrics);
    suite_add_tcase(s, sst2);
    TCase *clm = tcase_create("causal_lm");
    tcase_add_test(clm, t_clm_chunks);
    tcase_add_test(clm, t_clm_stride_and_split);
    tcase_add_test(clm, t_clm_open_errors);
    tcase_add_test(clm, t_clm_perplexity);
    suite_add_tcase(s, clm);
    int rc = sp_test_run(s);
    sp_plugin_unload_all();
    return rc;
}
