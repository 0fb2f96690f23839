/* test_config.c - config.json parsing: real HF configs, both RoPE spellings, missing fields. */
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "testutil.h"

static const char *LLAMA_V4 =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"hidden_size\":64,"
    "\"intermediate_size\":160,\"num_hidden_layers\":3,\"num_attention_heads\":8,\"num_key_value_heads\":2,"
    "\"head_dim\":8,\"vocab_size\":512,\"max_position_embeddings\":512,\"rms_norm_eps\":1e-5,\"rope_theta\":500000.0,"
    "\"rope_scaling\":{\"factor\":8.0,\"high_freq_factor\":4.0,\"low_freq_factor\":1.0,"
    "\"original_max_position_embeddings\":64,\"rope_type\":\"llama3\"},\"tie_word_embeddings\":true}";

START_TEST(t_real_configs)
{
    char dir[512];
    sp_config c;
    sp_err err = {0};
    snprintf(dir, sizeof dir, "%s/hf-tiny/llama-gqa", SEPAL_TEST_DATA);
    ck_assert_msg(sp_config_load(&c, dir, &err) == SP_OK, "%s", err.msg);
    ck_assert_int_eq(c.arch, SP_ARCH_LLAMA);
    ck_assert_int_eq(c.hidden, 64);
    ck_assert_int_eq(c.n_heads, 4);
    ck_assert_int_eq(c.n_kv_heads, 2);
    ck_assert_int_eq(c.head_dim, 16);
    ck_assert_int_eq(c.tie_embeddings, 0);
    ck_assert_int_eq(c.rope_type, SP_ROPE_DEFAULT);
    ck_assert_double_eq(c.rope_theta, 10000.0);
    snprintf(dir, sizeof dir, "%s/hf-tiny/bloom/config.json", SEPAL_TEST_DATA);
    ck_assert_int_eq(sp_config_load(&c, dir, &err), SP_OK); /* common fields under BLOOM's names */
    ck_assert_int_eq(c.arch, SP_ARCH_BLOOM);
    ck_assert_int_eq(c.n_heads, 4);
    ck_assert_int_eq(c.n_layers, 3);
}
END_TEST

/* transformers 5's rope_parameters and the older rope_theta + rope_scaling give the same config. */
START_TEST(t_rope_both_spellings)
{
    char path[512];
    sp_config v5, v4;
    sp_err err = {0};
    snprintf(path, sizeof path, "%s/hf-tiny/llama3-rope", SEPAL_TEST_DATA);
    ck_assert_int_eq(sp_config_load(&v5, path, &err), SP_OK);
    ck_assert_int_eq(sp_config_parse(&v4, LLAMA_V4, "v4", &err), SP_OK);
    ck_assert_int_eq(v5.rope_type, SP_ROPE_LLAMA3);
    ck_assert_int_eq(v4.rope_type, SP_ROPE_LLAMA3);
    ck_assert_double_eq(v5.rope_theta, 500000.0);
    ck_assert_double_eq(v4.rope_theta, v5.rope_theta);
    ck_assert_double_eq(v4.rope_factor, v5.rope_factor);
    ck_assert_double_eq(v4.rope_low_freq_factor, v5.rope_low_freq_factor);
    ck_assert_double_eq(v4.rope_high_freq_factor, v5.rope_high_freq_factor);
    ck_assert_int_eq(v4.rope_orig_max_pos, v5.rope_orig_max_pos);
}
END_TEST

/* Removing any required field gives an error naming the file and the field. */
START_TEST(t_missing_fields)
{
    const char *fields[] = {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                            "vocab_size", "rms_norm_eps"};
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
        char json[2048], key[64];
        snprintf(key, sizeof key, "\"%s\":", fields[i]);
        snprintf(json, sizeof json, "%s", LLAMA_V4);
        char *p = strstr(json, key);
        ck_assert_ptr_nonnull(p);
        memcpy(p + 1, "unused_", 7); /* rename the key */
        sp_config c;
        sp_err err = {0};
        ck_assert_int_eq(sp_config_parse(&c, json, "cfg.json", &err), SP_ERR_FORMAT);
        ck_assert_msg(strstr(err.msg, "cfg.json") && strstr(err.msg, fields[i]), "%s", err.msg);
    }
}
END_TEST

START_TEST(t_bad_values)
{
    sp_config c;
    sp_err err = {0};
    ck_assert_int_eq(sp_config_parse(&c, "[1,2]", "a.json", &err), SP_ERR_FORMAT);
    ck_assert_int_eq(sp_config_parse(&c, "{\"hidden_size\": 4", "b.json", &err), SP_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "b.json"));
    char json[2048];
    snprintf(json, sizeof json, "%s", LLAMA_V4);
    memcpy(strstr(json, "\"num_key_value_heads\":2") + 22, "3", 1); /* 8 heads on 3 kv heads */
    ck_assert_int_eq(sp_config_parse(&c, json, "gqa.json", &err), SP_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "num_key_value_heads"));
    snprintf(json, sizeof json, "%s", LLAMA_V4);
    memcpy(strstr(json, "\"llama3\""), "\"yarn\"  ", 8);
    ck_assert_int_eq(sp_config_parse(&c, json, "yarn.json", &err), SP_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.msg, "yarn"));
    ck_assert_int_eq(sp_config_load(&c, "/nonexistent/config.json", &err), SP_ERR_IO);
    ck_assert_ptr_nonnull(strstr(err.msg, "/nonexistent/config.json"));
}
END_TEST

START_TEST(t_param_count)
{
    char dir[512];
    sp_config c;
    snprintf(dir, sizeof dir, "%s/hf-tiny/llama-gqa", SEPAL_TEST_DATA);
    ck_assert_int_eq(sp_config_load(&c, dir, NULL), SP_OK);
    ck_assert_int_eq(sp_config_total_params(&c), 250432); /* the index's metadata.total_parameters */
}
END_TEST

static Suite *config_suite(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("config");
    tcase_add_test(tc, t_real_configs);
    tcase_add_test(tc, t_rope_both_spellings);
    tcase_add_test(tc, t_missing_fields);
    tcase_add_test(tc, t_bad_values);
    tcase_add_test(tc, t_param_count);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return sp_test_run(config_suite()); }
