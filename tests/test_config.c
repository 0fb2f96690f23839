/* test_config.c - config.json parsing: real HF configs of every family, both RoPE spellings, missing fields,
 * the Falcon variants and the settings we refuse. */
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
    /* transformers' parameter counts of the golden checkpoints (golden-summary.json) */
    static const struct {
        const char *dir;
        long long params;
    } want[] = {{"llama-gqa", 250432}, {"llama3-rope", 156096}, {"bloom", 182976}, {"falcon-new", 168832},
                {"mixtral", 287552}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        char dir[512];
        sp_config c;
        snprintf(dir, sizeof dir, "%s/hf-tiny/%s", SEPAL_TEST_DATA, want[i].dir);
        ck_assert_int_eq(sp_config_load(&c, dir, NULL), SP_OK);
        long long got = sp_config_total_params(&c);
        ck_assert_msg(got == want[i].params, "%s: %lld parameters", want[i].dir, got);
    }
}
END_TEST

static sp_config parse_ok(const char *json)
{
    sp_config c;
    sp_err err = {0};
    ck_assert_msg(sp_config_parse(&c, json, "cfg.json", &err) == SP_OK, "%s", err.msg);
    return c;
}

static void parse_fails(const char *json, sp_status code, const char *needle)
{
    sp_config c;
    sp_err err = {0};
    ck_assert_int_eq(sp_config_parse(&c, json, "cfg.json", &err), code);
    ck_assert_msg(strstr(err.msg, needle) && strstr(err.msg, "cfg.json"), "'%s' lacks '%s'", err.msg, needle);
}

#define FALCON(extra) "{\"model_type\":\"falcon\",\"hidden_size\":64,\"num_hidden_layers\":2," \
                      "\"num_attention_heads\":8,\"vocab_size\":512" extra "}"
#define MIXTRAL(extra) "{\"model_type\":\"mixtral\",\"hidden_size\":64,\"intermediate_size\":128," \
                       "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2," \
                       "\"vocab_size\":512,\"rms_norm_eps\":1e-5,\"max_position_embeddings\":32768" extra "}"

/* The families' blocks as their configs describe them. */
START_TEST(t_families)
{
    char dir[512];
    sp_config c;
    sp_err err = {0};
    snprintf(dir, sizeof dir, "%s/hf-tiny/bloom", SEPAL_TEST_DATA);
    ck_assert_int_eq(sp_config_load(&c, dir, &err), SP_OK);
    ck_assert_int_eq(c.n_kv_heads, 4);
    ck_assert_int_eq(c.intermediate, 256);
    ck_assert_int_eq(c.blk.pos, SP_POS_ALIBI);
    ck_assert_int_eq(c.blk.norm, SP_NORM_LAYER);
    ck_assert_int_eq(c.blk.mlp, SP_MLP_GELU_TANH);
    ck_assert(c.embed_norm && c.tie_embeddings && c.blk.qkv_bias && c.blk.mlp_bias && !c.blk.parallel);
    ck_assert_int_eq(sp_config_kv_bytes_per_token(&c), 2 * 4 * 16 * 4);
    snprintf(dir, sizeof dir, "%s/hf-tiny/falcon-new", SEPAL_TEST_DATA);
    ck_assert_int_eq(sp_config_load(&c, dir, &err), SP_OK);
    ck_assert(c.blk.parallel && c.blk.norms == 2 && c.n_kv_heads == 2 && !c.blk.qkv_bias && !c.embed_norm);
    ck_assert_int_eq(c.blk.mlp, SP_MLP_GELU);
    snprintf(dir, sizeof dir, "%s/hf-tiny/mixtral", SEPAL_TEST_DATA);
    ck_assert_int_eq(sp_config_load(&c, dir, &err), SP_OK);
    ck_assert(c.blk.mlp == SP_MLP_MOE && c.blk.n_experts == 4 && c.blk.top_k == 2 && !c.tie_embeddings);
    ck_assert_int_eq(c.rope_theta, 1e6);
    ck_assert_int_eq(sp_config_block_active_params(&c), sp_config_block_params(&c) - 2LL * 3 * 64 * 128);
    /* Falcon-7B: multi-query (FalconConfig's default), one LayerNorm, parallel */
    c = parse_ok(FALCON(""));
    ck_assert(c.n_kv_heads == 1 && c.blk.norms == 1 && c.blk.parallel && c.tie_embeddings);
    ck_assert_int_eq(c.intermediate, 256);
    ck_assert_int_eq(sp_config_kv_bytes_per_token(&c), 2 * 1 * 8 * 4);
    char desc[128];
    sp_config_attention_desc(&c, desc, sizeof desc);
    ck_assert_str_eq(desc, "multi-query (8 heads of 8 on 1 KV head), RoPE");
    /* 40B: grouped; Falcon2: new architecture with one LayerNorm; the old MHA, sequential block */
    c = parse_ok(FALCON(",\"new_decoder_architecture\":true,\"num_kv_heads\":2,\"bias\":true"));
    ck_assert(c.n_kv_heads == 2 && c.blk.norms == 2 && c.blk.qkv_bias && c.blk.out_bias && c.blk.mlp_bias);
    c = parse_ok(FALCON(",\"new_decoder_architecture\":true,\"num_kv_heads\":2,\"num_ln_in_parallel_attn\":1"));
    ck_assert_int_eq(c.blk.norms, 1);
    c = parse_ok(FALCON(",\"multi_query\":false,\"parallel_attn\":false,\"activation\":\"gelu_new\""));
    ck_assert(c.n_kv_heads == 8 && c.blk.norms == 2 && !c.blk.parallel && c.blk.mlp == SP_MLP_GELU_TANH);
    /* the family comes from model_type; without one, from the architecture's name */
    c = parse_ok("{\"architectures\":[\"BloomForCausalLM\"],\"hidden_size\":64,\"n_layer\":2,\"n_head\":4,"
                 "\"vocab_size\":512}");
    ck_assert_int_eq(c.arch, SP_ARCH_BLOOM);
    c = parse_ok("{\"architectures\":[\"GPT2LMHeadModel\"],\"model_type\":\"gpt2\",\"n_embd\":64,\"n_layer\":2,"
                 "\"n_head\":4,\"vocab_size\":512}");
    ck_assert_int_eq(c.arch, SP_ARCH_UNKNOWN);
    ck_assert_int_eq(sp_config_check_supported(&c, &err), SP_ERR_UNSUPPORTED);
    ck_assert_str_eq(err.msg, "unsupported architecture: gpt2 (supported: llama, bloom, falcon, mixtral)");
}
END_TEST

/* What we refuse, each with the file and the setting named. */
START_TEST(t_family_errors)
{
    parse_fails(FALCON(",\"alibi\":true"), SP_ERR_UNSUPPORTED, "alibi");
    parse_fails(FALCON(",\"new_decoder_architecture\":true,\"num_kv_heads\":2,\"parallel_attn\":false"),
                SP_ERR_UNSUPPORTED, "parallel_attn");
    parse_fails(FALCON(",\"num_ln_in_parallel_attn\":2"), SP_ERR_UNSUPPORTED, "num_ln_in_parallel_attn");
    parse_fails(FALCON(",\"num_ln_in_parallel_attn\":3"), SP_ERR_FORMAT, "num_ln_in_parallel_attn");
    parse_fails(FALCON(",\"activation\":\"relu\""), SP_ERR_UNSUPPORTED, "relu");
    parse_fails(FALCON(",\"multi_query\":false,\"num_kv_heads\":2"), SP_ERR_FORMAT, "num_kv_heads");
    parse_fails(FALCON(",\"new_decoder_architecture\":true,\"num_kv_heads\":3"), SP_ERR_FORMAT, "num_kv_heads");
    parse_fails("{\"model_type\":\"bloom\",\"hidden_size\":64,\"n_layer\":2,\"n_head\":5,\"vocab_size\":512}",
                SP_ERR_FORMAT, "num_attention_heads");
    parse_fails("{\"model_type\":\"bloom\",\"hidden_size\":64,\"n_layer\":2,\"n_head\":4,\"vocab_size\":512,"
                "\"apply_residual_connection_post_layernorm\":true}",
                SP_ERR_UNSUPPORTED, "apply_residual_connection_post_layernorm");
    parse_fails(MIXTRAL(""), SP_ERR_FORMAT, "num_local_experts");
    parse_fails(MIXTRAL(",\"num_local_experts\":4,\"num_experts_per_tok\":5"), SP_ERR_FORMAT, "num_experts_per_tok");
    parse_fails(MIXTRAL(",\"num_local_experts\":8,\"num_experts_per_tok\":2,\"sliding_window\":4096"),
                SP_ERR_UNSUPPORTED, "sliding_window");
    sp_config c = parse_ok(MIXTRAL(",\"num_local_experts\":8,\"num_experts_per_tok\":2,\"sliding_window\":null"));
    ck_assert_int_eq(c.blk.n_experts, 8);
    c = parse_ok(MIXTRAL(",\"num_local_experts\":8,\"num_experts_per_tok\":2,\"sliding_window\":32768"));
    ck_assert_int_eq(c.blk.top_k, 2);
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
    tcase_add_test(tc, t_families);
    tcase_add_test(tc, t_family_errors);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return sp_test_run(config_suite()); }
