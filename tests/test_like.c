/* test_like.c - `model init --like` (core/like.c): every model it knows, cut narrow and shallow, loads and runs
 * with finite logits and a tokenizer that round-trips text; all 32 layers of a Llama-2-7B shape keep their
 * activations finite; shards as transformers writes them, the same tensors whatever the shard size; values at the
 * init scale; deterministic per seed; bad options and a used directory refused, losing nothing; Ctrl-C leaves
 * nothing behind. */
#include <check.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "half.h"
#include "like.h"
#include "model.h"
#include "safetensors.h"
#include "testutil.h"
#include "tokenizer.h"

#define STORIES SEPAL_STORIES15M_DIR

static const char *const g_names[] = {"llama-2-7b", "llama-2-70b", "llama-3-8b", "mixtral-8x7b", "falcon-40b",
                                      "bloom-7b1"};

static char g_base[256]; /* each test's temp directory, removed after it */

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void setup(void) { snprintf(g_base, sizeof g_base, "%s", sp_test_tmpdir()); }
static void teardown(void) { nftw(g_base, remove_one, 16, FTW_DEPTH | FTW_PHYS); }

/* A fresh path (not created) under the test's temp directory. */
static const char *out_dir(const char *name)
{
    static char buf[4][4096];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s", g_base, name);
    return p;
}

static sp_like_opts small(const char *like)
{
    return (sp_like_opts){.like = like, .layers = 2, .hidden = 256, .dtype = SP_BF16, .seed = 1, .tokenizer = STORIES};
}

static int count_files(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    if (d)
        closedir(d);
    return d ? n : -1;
}

/* The model's logits for a few ids: all finite, not all equal, none huge; returns their RMS. */
static double check_logits(const char *dir)
{
    sp_err err = {0};
    sp_model *m = NULL;
    ck_assert_msg(!sp_model_load(&m, dir, SP_LOAD_ALL, 0, -1, &err), "%s", err.msg);
    const int32_t ids[6] = {1, 450, 4996, 17354, 1701, 29916};
    int V = m->cfg.vocab, T = 6;
    float *logits = malloc((size_t)T * V * sizeof(float));
    ck_assert_msg(!sp_model_forward(m, logits, ids, 1, T, 0, NULL, 0, &err), "%s", err.msg);
    double ss = 0, mx = 0;
    for (size_t i = 0; i < (size_t)T * V; i++) {
        ck_assert_msg(isfinite(logits[i]), "%s: logit %zu is %g", dir, i, logits[i]);
        ss += (double)logits[i] * logits[i];
        mx = fmax(mx, fabs(logits[i]));
    }
    double rms = sqrt(ss / ((double)T * V));
    ck_assert_msg(rms > 1e-3 && mx < 100, "%s: logits rms %g, max %g", dir, rms, mx);
    free(logits);
    sp_model_free(m);
    return rms;
}

static void check_tokenizer(const char *dir, int vocab)
{
    sp_err err = {0};
    sp_tokenizer *t = NULL;
    ck_assert_msg(!sp_tokenizer_load(&t, dir, &err), "%s", err.msg);
    ck_assert_int_eq(sp_tokenizer_vocab_size(t), vocab);
    const char *text = "Hello world, this is a test: 3.14 and caf\xC3\xA9!";
    int *ids = NULL, n = 0;
    char *back = NULL;
    ck_assert_msg(!sp_tokenizer_encode(t, text, 0, &ids, &n, &err), "%s", err.msg);
    ck_assert_int_gt(n, 0);
    ck_assert_msg(!sp_tokenizer_decode(t, ids, n, &back, &err), "%s", err.msg);
    ck_assert_str_eq(back, text);
    free(back);
    int last = vocab - 1; /* every id decodes */
    ck_assert_msg(!sp_tokenizer_decode(t, &last, 1, &back, &err), "%s", err.msg);
    free(back);
    free(ids);
    sp_tokenizer_free(t);
}

START_TEST(t_every_model)
{
    const char *name = g_names[_i];
    const char *dir = out_dir(name);
    sp_like_opts o = small(name);
    sp_like_result r;
    sp_err err = {0};
    ck_assert_msg(!sp_like_init(dir, &o, &r, &err), "%s", err.msg);
    sp_config c;
    ck_assert_msg(!sp_config_load(&c, dir, &err), "%s", err.msg);
    ck_assert_int_eq(c.n_layers, 2);
    ck_assert_int_eq(c.hidden, 256);
    ck_assert_int_eq(c.vocab, sp_like_vocab(name));
    ck_assert_int_eq(r.vocab, c.vocab);
    ck_assert_int_eq(c.dtype, SP_BF16);
    ck_assert_int_eq(r.params, sp_config_total_params(&c));
    /* the published shapes that stay when the width is cut: heads, KV heads, experts */
    static const int heads[] = {32, 64, 32, 32, 128, 32}, kv[] = {32, 8, 8, 8, 8, 32};
    ck_assert_int_eq(c.n_heads, heads[_i]);
    ck_assert_int_eq(c.n_kv_heads, kv[_i]);
    ck_assert_int_eq(c.head_dim, 256 / heads[_i]);
    if (c.arch == SP_ARCH_MIXTRAL)
        ck_assert(c.blk.n_experts == 8 && c.blk.top_k == 2);
    ck_assert_int_eq(r.synthetic_tokenizer, c.vocab != 32000);
    check_tokenizer(dir, c.vocab);
    check_logits(dir);
}
END_TEST

/* 32 layers of a Llama-2-7B shape (narrow): activations stay finite, logits at a sane scale. */
START_TEST(t_depth)
{
    const char *dir = out_dir("deep");
    sp_like_opts o = small("llama-2-7b");
    o.layers = 0; /* all 32 */
    sp_like_result r;
    sp_err err = {0};
    ck_assert_msg(!sp_like_init(dir, &o, &r, &err), "%s", err.msg);
    ck_assert_int_eq(r.layers, 32);
    double rms = check_logits(dir);
    ck_assert_msg(rms > 0.05 && rms < 20, "logits rms %g after 32 layers", rms);
}
END_TEST

/* The file a tensor lives in, from the index. */
static const char *weight_file(const cJSON *idx, const char *name)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(idx, "weight_map"), name);
    return cJSON_IsString(f) ? f->valuestring : NULL;
}

/* Shards as transformers writes them; the same tensors in one file and in many; another seed differs. */
START_TEST(t_shards)
{
    const char *one = out_dir("one"), *many = out_dir("many"), *other = out_dir("other");
    sp_like_opts o = small("mixtral-8x7b");
    sp_like_result r1, r2, r3;
    sp_err err = {0};
    ck_assert_msg(!sp_like_init(one, &o, &r1, &err), "%s", err.msg);
    o.shard_bytes = 4000000; /* 4 MB: a 32000 x 256 embedding (16.4 MB) alone in its shard */
    ck_assert_msg(!sp_like_init(many, &o, &r2, &err), "%s", err.msg);
    o.seed = 2;
    o.shard_bytes = 0;
    ck_assert_msg(!sp_like_init(other, &o, &r3, &err), "%s", err.msg);
    ck_assert_int_eq(r1.shards, 1);
    ck_assert_int_gt(r2.shards, 3);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", one);
    ck_assert_int_eq(access(path, R_OK), 0);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", many);
    cJSON *idx = sp_test_read_json(path);
    ck_assert_ptr_nonnull(idx);
    const cJSON *total = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(idx, "metadata"),
                                                          "total_size");
    ck_assert(cJSON_IsNumber(total) && (uint64_t)total->valuedouble == r2.bytes && r2.bytes == r1.bytes);
    for (int s = 1; s <= r2.shards; s++) { /* each shard at most 4 MB unless one tensor alone is larger */
        struct stat sb;
        snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", many, s, r2.shards);
        ck_assert_msg(stat(path, &sb) == 0, "%s", path);
        sp_safetensors *st = NULL;
        ck_assert_msg(!sp_st_open(&st, path, &err), "%s", err.msg);
        ck_assert_msg(sb.st_size <= 4000000 + 8192 || sp_st_count(st) == 1, "%s: %lld bytes, %d tensors", path,
                      (long long)sb.st_size, sp_st_count(st));
        sp_st_close(st);
    }
    sp_safetensors *a = NULL, *b = NULL, *c = NULL;
    ck_assert(!sp_st_open(&a, one, &err) && !sp_st_open(&b, many, &err) && !sp_st_open(&c, other, &err));
    ck_assert_int_eq(sp_st_count(a), sp_st_count(b));
    int differ = 0;
    for (int i = 0; i < sp_st_count(a); i++) {
        const char *name = sp_st_name(a, i);
        const sp_st_tensor *ta = sp_st_get(a, name, &err), *tb = sp_st_get(b, name, &err);
        const sp_st_tensor *tc = sp_st_get(c, name, &err);
        ck_assert_msg(ta && tb && tc, "%s", name);
        ck_assert_ptr_nonnull(weight_file(idx, name));
        ck_assert_msg(ta->nbytes == tb->nbytes && !memcmp(ta->data, tb->data, ta->nbytes), "%s differs", name);
        differ += memcmp(ta->data, tc->data, ta->nbytes) != 0;
    }
    ck_assert_int_gt(differ, sp_st_count(a) / 2); /* the weights differ with the seed; norms (ones) do not */
    sp_st_close(a);
    sp_st_close(b);
    sp_st_close(c);
    cJSON_Delete(idx);
}
END_TEST

/* Matrices ~ normal(0, 0.02) (bounded at 3.47 std), norms 1, biases 0; f32 and bf16 of one seed agree. */
START_TEST(t_values)
{
    const char *bf = out_dir("bf16"), *f32 = out_dir("f32");
    sp_like_opts o = small("bloom-7b1");
    sp_like_result r;
    sp_err err = {0};
    ck_assert_msg(!sp_like_init(bf, &o, &r, &err), "%s", err.msg);
    o.dtype = SP_F32;
    ck_assert_msg(!sp_like_init(f32, &o, &r, &err), "%s", err.msg);
    sp_safetensors *a = NULL, *b = NULL;
    ck_assert(!sp_st_open(&a, bf, &err) && !sp_st_open(&b, f32, &err));
    const sp_st_tensor *q = sp_st_get(b, "transformer.h.1.self_attention.query_key_value.weight", &err);
    const sp_st_tensor *qb = sp_st_get(a, "transformer.h.1.self_attention.query_key_value.weight", &err);
    ck_assert(q && qb && q->dtype == SP_F32 && qb->dtype == SP_BF16 && q->numel == 768 * 256);
    double sum = 0, ss = 0, mx = 0;
    const float *x = q->data;
    const uint16_t *h = qb->data;
    for (uint64_t i = 0; i < q->numel; i++) {
        sum += x[i];
        ss += (double)x[i] * x[i];
        mx = fmax(mx, fabs(x[i]));
        ck_assert_uint_eq(h[i], sp_f32_to_bf16(x[i]));
    }
    double mean = sum / (double)q->numel, sd = sqrt(ss / (double)q->numel - mean * mean);
    ck_assert_msg(fabs(mean) < 1e-3 && fabs(sd - 0.02) < 0.0005 && mx <= 0.02 * 3.4642 && mx > 0.02 * 3,
                  "mean %g, std %g, max %g", mean, sd, mx);
    static const char *const ones[] = {"transformer.h.0.input_layernorm.weight", "transformer.ln_f.weight",
                                       "transformer.word_embeddings_layernorm.weight"};
    static const char *const zeros[] = {"transformer.h.0.input_layernorm.bias",
                                        "transformer.h.1.mlp.dense_4h_to_h.bias",
                                        "transformer.h.0.self_attention.query_key_value.bias"};
    for (int k = 0; k < 3; k++) {
        const sp_st_tensor *t1 = sp_st_get(b, ones[k], &err), *t0 = sp_st_get(b, zeros[k], &err);
        ck_assert_msg(t1 && t0, "%s", err.msg);
        for (uint64_t i = 0; i < t1->numel; i++)
            ck_assert(((const float *)t1->data)[i] == 1.0f);
        for (uint64_t i = 0; i < t0->numel; i++)
            ck_assert(((const float *)t0->data)[i] == 0.0f);
    }
    ck_assert(!sp_st_has(b, "lm_head.weight")); /* BLOOM ties its head to the embeddings */
    sp_st_close(a);
    sp_st_close(b);
}
END_TEST

static void refused(const char *dir, sp_like_opts o, sp_status want, const char *msg)
{
    sp_like_result r;
    sp_err err = {0};
    ck_assert_int_eq(sp_like_init(dir, &o, &r, &err), want);
    ck_assert_msg(strstr(err.msg, msg) != NULL, "'%s' lacks '%s'", err.msg, msg);
}

/* Bad options and a directory in use: a clear error, nothing written or lost. */
START_TEST(t_refused)
{
    const char *used = out_dir("used"), *none = out_dir("none");
    ck_assert_int_eq(mkdir(used, 0755), 0);
    char keep[4096];
    snprintf(keep, sizeof keep, "%s/keep.txt", used);
    FILE *f = fopen(keep, "w");
    fputs("mine", f);
    fclose(f);
    refused(used, small("llama-2-7b"), SP_ERR_ARG, "not empty");
    ck_assert_int_eq(count_files(used), 1);
    sp_like_opts o = small("gpt-5");
    refused(none, o, SP_ERR_ARG, "--like gpt-5: not a model we know (" SP_LIKE_NAMES ")");
    o = small("llama-2-7b");
    o.layers = 33;
    refused(none, o, SP_ERR_ARG, "--layers 33: llama-2-7b has 32 layers");
    o = small("falcon-40b");
    o.hidden = 192; /* 128 heads do not divide it */
    refused(none, o, SP_ERR_ARG, "--hidden 192: falcon-40b's width");
    o = small("llama-2-7b");
    o.hidden = 8192;
    refused(none, o, SP_ERR_ARG, "up to 4096");
    ck_assert_int_eq(count_files(none), -1); /* never created */
    uint64_t b = 0;
    ck_assert(!sp_like_parse_size("5GB", &b, NULL) && b == 5000000000ull);
    ck_assert(!sp_like_parse_size("2GiB", &b, NULL) && b == 2147483648ull);
    ck_assert(!sp_like_parse_size("500mb", &b, NULL) && b == 500000000ull);
    ck_assert(!sp_like_parse_size("4096", &b, NULL) && b == 4096);
    sp_err err = {0};
    ck_assert_int_eq(sp_like_parse_size("5 apples", &b, &err), SP_ERR_ARG);
    ck_assert_str_eq(err.msg, "--shard-size: expected a size such as 5GB, 500MB or 2GiB, got '5 apples'");
    ck_assert_int_eq(sp_like_parse_size("0", &b, NULL), SP_ERR_ARG);
    ck_assert_int_eq(sp_like_parse_size("-1GB", &b, NULL), SP_ERR_ARG);
}
END_TEST

typedef struct cancel_at {
    int flag;
    uint64_t at;
    int calls;
} cancel_at;

static void cancel_progress(void *user, uint64_t done, uint64_t total)
{
    cancel_at *c = user;
    (void)total;
    c->calls++;
    if (done >= c->at)
        c->flag = 1;
}

/* Ctrl-C in the middle: SP_ERR_CANCELLED, and the directory it made is gone (one it found empty stays, empty). */
START_TEST(t_cancel)
{
    const char *made = out_dir("made"), *empty = out_dir("empty");
    ck_assert_int_eq(mkdir(empty, 0755), 0);
    const char *dirs[2] = {made, empty};
    for (int k = 0; k < 2; k++) {
        cancel_at c = {.at = 70u << 20};
        sp_like_opts o = small("llama-2-70b");
        o.layers = 0; /* 80 layers: about 180 MB */
        o.shard_bytes = 50000000;
        o.cancel = &c.flag;
        o.progress = cancel_progress;
        o.user = &c;
        sp_like_result r;
        sp_err err = {0};
        ck_assert_int_eq(sp_like_init(dirs[k], &o, &r, &err), SP_ERR_CANCELLED);
        ck_assert_str_eq(err.msg, "model init: interrupted");
        ck_assert_int_gt(c.calls, 1);
        ck_assert_int_eq(count_files(dirs[k]), k == 0 ? -1 : 0);
    }
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("like");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_loop_test(tc, t_every_model, 0, (int)(sizeof g_names / sizeof *g_names));
    tcase_add_test(tc, t_depth);
    tcase_add_test(tc, t_shards);
    tcase_add_test(tc, t_values);
    tcase_add_test(tc, t_refused);
    tcase_add_test(tc, t_cancel);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return sp_test_run(suite()); }
