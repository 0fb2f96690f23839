/* test_jinja.c - the chat templates' engine (serve/jinja.h) against Jinja2 itself: real models' templates
 * (the .jinja files of tests/data/chat_templates: Llama-2, Llama-3, Llama-3.1 with tools, ChatML/Qwen, Mistral v0.1 and v0.3,
 * Zephyr, Gemma, Phi-3, and features.jinja for the rest of the subset) over the conversations of cases.json, each
 * output equal to golden.json's (scripts/golden-chat-templates.py renders it with python3-jinja2 as transformers
 * does), raise_exception's messages the same; bad templates refused with messages that name the line and the
 * fault; and every prefix and thousands of seeded mutations of the real templates render or fail cleanly (run
 * under ASan this is the fuzzing). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja.h"
#include "rng.h"
#include "testutil.h"

#define DIR SEPAL_TEST_DATA "/chat_templates/"

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    ck_assert(s && fread(s, 1, (size_t)n, f) == (size_t)n);
    s[n] = 0;
    fclose(f);
    return s;
}

static cJSON *load_json(const char *path)
{
    char *s = slurp(path);
    cJSON *j = cJSON_Parse(s);
    ck_assert_msg(j, "%s: not JSON", path);
    free(s);
    return j;
}

/* The context of a case: its vars, messages, bos_token, eos_token, add_generation_prompt. */
static cJSON *context(const cJSON *c, int gen)
{
    const cJSON *vars = cJSON_GetObjectItemCaseSensitive(c, "vars");
    cJSON *ctx = vars ? cJSON_Duplicate(vars, 1) : cJSON_CreateObject();
    cJSON_AddItemToObject(ctx, "messages", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(c, "messages"), 1));
    cJSON_AddStringToObject(ctx, "bos_token", "<s>");
    cJSON_AddStringToObject(ctx, "eos_token", "</s>");
    cJSON_AddBoolToObject(ctx, "add_generation_prompt", gen);
    return ctx;
}

static const cJSON *find_case(const cJSON *cases, const char *name)
{
    const cJSON *c;
    cJSON_ArrayForEach(c, cases)
    {
        if (!strcmp(cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring, name))
            return c;
    }
    ck_abort_msg("no case '%s'", name);
    return NULL;
}

START_TEST(t_golden)
{
    cJSON *golden = load_json(DIR "golden.json"), *cases = load_json(DIR "cases.json");
    const cJSON *g;
    int n = 0, raised = 0, failed = 0;
    cJSON_ArrayForEach(g, golden)
    {
        const char *tname = cJSON_GetObjectItemCaseSensitive(g, "template")->valuestring;
        const char *cname = cJSON_GetObjectItemCaseSensitive(g, "case")->valuestring;
        int gen = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(g, "add_generation_prompt"));
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(g, "output");
        const cJSON *raise = cJSON_GetObjectItemCaseSensitive(g, "raised");
        char path[512];
        snprintf(path, sizeof path, DIR "%s", tname);
        char *src = slurp(path), *out = NULL;
        cJSON *ctx = context(find_case(cases, cname), gen);
        sp_err err = {0};
        sp_status st = sp_jinja_render(src, ctx, &out, &err);
        if (want) {
            ck_assert_msg(!st, "%s / %s / gen %d: %s", tname, cname, gen, err.msg);
            ck_assert_msg(!strcmp(out, want->valuestring), "%s / %s / gen %d:\n--- got\n%s\n--- want\n%s", tname,
                          cname, gen, out, want->valuestring);
        } else if (raise) {
            char msg[600];
            snprintf(msg, sizeof msg, "chat template: raise_exception: %s", raise->valuestring);
            ck_assert_msg(st && !strcmp(err.msg, msg), "%s / %s: '%s', want '%s'", tname, cname, err.msg, msg);
            raised++;
        } else { /* Python met a type error: so must the engine */
            ck_assert_msg(st && !strncmp(err.msg, "chat template line ", 19), "%s / %s: rendered '%s' (%s)", tname,
                          cname, out ? out : "", err.msg);
            failed++;
        }
        free(out);
        free(src);
        cJSON_Delete(ctx);
        n++;
    }
    ck_assert_int_ge(n, 100);
    ck_assert_int_gt(raised, 10);
    ck_assert_int_gt(failed, 1);
    cJSON_Delete(golden);
    cJSON_Delete(cases);
}
END_TEST

/* A bad template's message, whole. */
static const struct {
    const char *src, *msg;
} BAD[] = {
    {"{{ x", "chat template line 1: a tag opened here is not closed with }}"},
    {"a\n{% if x %}b", "chat template line 2: missing {% endif %}"},
    {"{% for m in messages %}\n{{ m }}\n{% endif %}", "chat template line 3: {% endif %} where {% endfor %} was expected"},
    {"{% for m in messages %}{{ m }}", "chat template line 1: missing {% endfor %}"},
    {"a\n{% endif %}", "chat template line 2: {% endif %} without its opening tag"},
    {"{% if x %}{% else %}{% elif y %}{% endif %}", "chat template line 1: {% elif %} where {% endif %} was expected"},
    {"\n\n{{ x|frobnicate }}", "chat template line 3: unknown filter 'frobnicate'"},
    {"{{ x is frobbed }}", "chat template line 1: unknown test 'frobbed'"},
    {"{{ frob(1) }}", "chat template line 1: unknown function 'frob'"},
    {"{{ 'a'.frob() }}", "chat template line 1: unknown method 'frob'"},
    {"{% include 'x.jinja' %}", "chat template line 1: unsupported tag {% include %}"},
    {"{{ 1 + }}", "chat template line 1: unexpected 'end of expression'"},
    {"{{ (1 }}", "chat template line 1: expected ')', found 'the end'"},
    {"{{ 1 2 }}", "chat template line 1: unexpected '2' after an expression"},
    {"{{ 'abc }}", "chat template line 1: a tag opened here is not closed with }}"},
    {"{{ 1 @ 2 }}", "chat template line 1: unexpected character '@'"},
    {"{{ 1 / 0 }}", "chat template line 1: division by zero"},
    {"{{ 'a' - 1 }}", "chat template line 1: '-' of values that are not numbers"},
    {"{{ messages + 'x' }}", "chat template line 1: '+' of values that are not numbers"},
    {"{{ 1 < 'a' }}", "chat template line 1: '<' of values that cannot be ordered"},
    {"{% for x in 3 %}{% endfor %}", "chat template line 1: for: cannot iterate this value"},
    {"{% for in messages %}{% endfor %}", "chat template line 1: for: expected a name"},
    {"{% set ns.x = 1 %}", "chat template line 1: set ns.x: no namespace ns"},
    {"{% raw %}abc", "chat template line 1: {% raw %} without {% endraw %}"},
    {"{{ raise_exception('No tools here') }}", "chat template: raise_exception: No tools here"},
    {"{{ range(100000000)|length }}", "chat template line 1: range of more than 100000 numbers"},
    {"{{ 'x' * 100000000 }}", "chat template line 1: the output would pass 16 MiB"},
    {"{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", "chat template line 1: macros nested too deep"},
};

START_TEST(t_errors)
{
    cJSON *ctx = cJSON_Parse("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"x\":1}");
    for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
        char *out = NULL;
        sp_err err = {0};
        sp_status st = sp_jinja_render(BAD[i].src, ctx, &out, &err);
        ck_assert_msg(st == SP_ERR_UNSUPPORTED && !out, "'%s' rendered '%s'", BAD[i].src, out ? out : "");
        ck_assert_msg(!strcmp(err.msg, BAD[i].msg), "'%s': '%s', want '%s'", BAD[i].src, err.msg, BAD[i].msg);
    }
    cJSON_Delete(ctx);
}
END_TEST

/* Deep nesting refused, not a stack overflow. */
START_TEST(t_deep)
{
    size_t n = 100000;
    char *src = malloc(2 * n + 16);
    memcpy(src, "{{ ", 3);
    memset(src + 3, '(', n);
    memcpy(src + 3 + n, "1 }}", 5);
    char *out = NULL;
    sp_err err = {0};
    ck_assert_int_ne(sp_jinja_render(src, NULL, &out, &err), SP_OK);
    ck_assert_str_eq(err.msg, "chat template line 1: expressions nested too deep");
    size_t k = 0;
    for (int i = 0; i < 2000; i++)
        k += (size_t)sprintf(src + k, "{%% if x %%}");
    ck_assert_int_ne(sp_jinja_render(src, NULL, &out, &err), SP_OK);
    ck_assert_str_eq(err.msg, "chat template line 1: blocks nested too deep");
    free(src);
}
END_TEST

static const char *const TEMPLATES[] = {"llama2.jinja",  "llama3.jinja", "llama3.1-tools.jinja", "chatml.jinja",
                                        "mistral.jinja", "mistral-v3.jinja", "zephyr.jinja",     "gemma.jinja",
                                        "phi3.jinja",    "features.jinja"};

/* Renders src: fine or a clean error, never a crash (ASan watches the rest). */
static void render_any(const char *src, const cJSON *ctx, int *ok, int *bad)
{
    char *out = NULL;
    sp_err err = {0};
    if (sp_jinja_render(src, ctx, &out, &err) == SP_OK) {
        ck_assert(out != NULL);
        ++*ok;
    } else {
        ck_assert_msg(!strncmp(err.msg, "chat template", 13), "'%s'", err.msg);
        ck_assert(out == NULL);
        ++*bad;
    }
    free(out);
}

START_TEST(t_fuzz)
{
    cJSON *cases = load_json(DIR "cases.json");
    cJSON *ctx = context(find_case(cases, "system and turns"), 1);
    static const char pieces[] = "{}%#-+()[]'\".|~,:=<>*/ \n\\aeilnorstx0";
    sp_rng rng;
    sp_rng_seed(&rng, 25);
    int ok = 0, bad = 0;
    for (size_t t = 0; t < sizeof TEMPLATES / sizeof *TEMPLATES; t++) {
        char path[512];
        snprintf(path, sizeof path, DIR "%s", TEMPLATES[t]);
        char *src = slurp(path);
        size_t n = strlen(src);
        char *buf = malloc(n + 1);
        for (size_t k = 0; k <= n; k += 1 + n / 400) { /* prefixes */
            memcpy(buf, src, k);
            buf[k] = 0;
            render_any(buf, ctx, &ok, &bad);
        }
        for (int i = 0; i < 400; i++) { /* a few bytes changed */
            memcpy(buf, src, n + 1);
            for (int j = 1 + (int)(sp_rng_u32(&rng) % 3); j > 0; j--)
                buf[sp_rng_u32(&rng) % n] = pieces[sp_rng_u32(&rng) % (sizeof pieces - 1)];
            render_any(buf, ctx, &ok, &bad);
        }
        free(buf);
        free(src);
    }
    ck_assert_int_gt(ok, 100);
    ck_assert_int_gt(bad, 100);
    cJSON_Delete(ctx);
    cJSON_Delete(cases);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("jinja");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, t_golden);
    tcase_add_test(tc, t_errors);
    tcase_add_test(tc, t_deep);
    tcase_add_test(tc, t_fuzz);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return sp_test_run(suite()); }
