/* test_generate.c - stories15M, converted by our own command, against llama2.c run.c's greedy generations
 * (tests/data/stories15M/golden.jsonl): prompt ids, every generated id (the BOS that stops run.c
 * included) and the printed text. Needs scripts/fetch-model.sh to have run. */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model.h"
#include "testutil.h"
#include "tokenizer.h"

static sp_model *model;
static sp_tokenizer *tok;

static void load_once(void)
{
    struct stat sb;
    ck_assert_msg(stat(SEPAL_STORIES15M_DIR "/model.safetensors", &sb) == 0,
                  "%s: no converted stories15M; run scripts/fetch-model.sh first", SEPAL_STORIES15M_DIR);
    sp_err err = {0};
    if (!model)
        ck_assert_msg(sp_model_load(&model, SEPAL_STORIES15M_DIR, SP_LOAD_ALL, 0, -1, &err) == SP_OK, "%s", err.msg);
    if (!tok)
        ck_assert_msg(sp_tokenizer_load(&tok, SEPAL_STORIES15M_DIR, &err) == SP_OK, "%s", err.msg);
}

static int json_ids(const cJSON *arr, int32_t *out, int cap)
{
    int n = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr)
    {
        ck_assert_int_lt(n, cap);
        out[n++] = (int32_t)v->valueint;
    }
    return n;
}

/* Checks golden line `line` (0-based). */
static void check_line(int line)
{
    load_once();
    FILE *f = fopen(SEPAL_TEST_DATA "/stories15M/golden.jsonl", "r");
    ck_assert_ptr_nonnull(f);
    char buf[1 << 16];
    for (int i = 0; i <= line; i++)
        ck_assert_ptr_nonnull(fgets(buf, sizeof buf, f));
    fclose(f);
    cJSON *g = cJSON_Parse(buf);
    ck_assert_ptr_nonnull(g);
    const char *prompt = cJSON_GetObjectItem(g, "prompt")->valuestring, *text = cJSON_GetObjectItem(g, "text")->valuestring;
    int32_t want_prompt[64], want_gen[512], got[512];
    int np = json_ids(cJSON_GetObjectItem(g, "prompt_ids"), want_prompt, 64);
    int ng = json_ids(cJSON_GetObjectItem(g, "gen_ids_full"), want_gen, 512);

    /* our tokenizer gives run.c's prompt ids */
    int *ids = NULL, n = 0;
    sp_err err = {0};
    ck_assert_int_eq(sp_tokenizer_encode(tok, prompt, 1, &ids, &n, &err), SP_OK);
    ck_assert_int_eq(n, np);
    for (int i = 0; i < n; i++)
        ck_assert_int_eq(ids[i], want_prompt[i]);

    /* greedy generation with a KV cache gives run.c's ids, including the BOS that ended its run */
    sp_sampler greedy = {0};
    int n_out = 0;
    ck_assert_int_eq(sp_model_generate(model, want_prompt, np, ng, &greedy, 0, got, &n_out, NULL, NULL, &err), SP_OK);
    ck_assert_int_eq(n_out, ng);
    for (int i = 0; i < ng; i++)
        ck_assert_msg(got[i] == want_gen[i], "line %d: id %d is %d, run.c %d", line, i, got[i], want_gen[i]);

    /* and the same text: run.c prints the prompt pieces, the continuation up to BOS, then a newline */
    int all[600], na = 0;
    for (int i = 0; i < np; i++)
        all[na++] = want_prompt[i];
    for (int i = 0; i < ng && got[i] != 1; i++)
        all[na++] = got[i];
    char *dec = NULL;
    ck_assert_int_eq(sp_tokenizer_decode(tok, all, na, &dec, &err), SP_OK);
    size_t tl = strlen(text);
    ck_assert_int_eq(text[tl - 1], '\n');
    ck_assert_int_eq(strlen(dec), tl - 1);
    ck_assert_int_eq(strncmp(dec, text, tl - 1), 0);
    free(dec);
    free(ids);
    cJSON_Delete(g);
}

START_TEST(t_golden_line) { check_line(_i); }
END_TEST

/* The cache's length limit is respected: a generation that would run past the context is refused. */
START_TEST(t_context_limit)
{
    load_once();
    int32_t prompt[2] = {1, 9038}, out[300];
    int n_out;
    sp_err err = {0};
    sp_sampler greedy = {0};
    ck_assert_int_eq(sp_model_generate(model, prompt, 2, 256, &greedy, 0, out, &n_out, NULL, NULL, &err), SP_ERR_RANGE);
    ck_assert_ptr_nonnull(strstr(err.msg, "context of 256"));
    ck_assert_int_eq(sp_model_generate(model, prompt, 2, 255, &greedy, 0, out, &n_out, NULL, NULL, &err), SP_OK);
    ck_assert_int_eq(n_out, 255);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("generate");
    TCase *tc = tcase_create("stories15M_vs_llama2c");
    tcase_add_loop_test(tc, t_golden_line, 0, 5);
    tcase_add_test(tc, t_context_limit);
    suite_add_tcase(s, tc);
    int rc = sp_test_run(s);
    sp_model_free(model);
    sp_tokenizer_free(tok);
    return rc;
}
