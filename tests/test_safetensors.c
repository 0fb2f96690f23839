/* test_safetensors.c - the reader on real HF files (single and sharded) and on every kind of bad file:
 * a clear error naming the file (and tensor), never a crash. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"
#include "testutil.h"

/* Builds a safetensors file from a JSON header and `ndata` bytes of data (pattern 0..255). */
static const char *make_st(const char *name, const char *header, size_t ndata)
{
    size_t hl = strlen(header);
    unsigned char *buf = malloc(8 + hl + ndata + 1);
    uint64_t h = hl;
    memcpy(buf, &h, 8);
    memcpy(buf + 8, header, hl);
    for (size_t i = 0; i < ndata; i++)
        buf[8 + hl + i] = (unsigned char)i;
    const char *p = sp_test_write_file(name, buf, 8 + hl + ndata);
    free(buf);
    ck_assert_ptr_nonnull(p);
    return p;
}

/* Opening (and, if it opens, reading tensor `tensor`) fails with `code` and a message containing
 * every given fragment. */
static void expect_error(const char *path, const char *tensor, sp_status code, const char *frag1, const char *frag2)
{
    sp_safetensors *st = NULL;
    sp_err err = {0};
    sp_status s = sp_st_open(&st, path, &err);
    if (s == SP_OK && tensor) {
        float buf[64];
        int64_t shape[1] = {2};
        s = sp_st_read_f32(st, tensor, buf, 1, shape, &err);
    }
    sp_st_close(st);
    ck_assert_msg(s == code, "status %d (%s), expected %d", s, err.msg, code);
    ck_assert_msg(strstr(err.msg, frag1) != NULL, "'%s' lacks '%s'", err.msg, frag1);
    if (frag2)
        ck_assert_msg(strstr(err.msg, frag2) != NULL, "'%s' lacks '%s'", err.msg, frag2);
}

START_TEST(t_roundtrip_writer_reader)
{
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t h[2] = {0x3c00, 0xc000}; /* f16 1.0, -2.0 */
    sp_st_wtensor t[2] = {{"a", SP_F32, 2, {2, 3}, a}, {"b.half", SP_F16, 1, {2}, h}};
    const char *dir = sp_test_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/x.safetensors", dir);
    sp_err err = {0};
    ck_assert_int_eq(sp_st_write(path, t, 2, "{\"format\":\"pt\"}", &err), SP_OK);
    sp_safetensors *st = NULL;
    ck_assert_int_eq(sp_st_open(&st, path, &err), SP_OK);
    ck_assert_int_eq(sp_st_count(st), 2);
    float out[6];
    int64_t s23[2] = {2, 3}, s2[1] = {2}, s32[2] = {3, 2};
    ck_assert_int_eq(sp_st_read_f32(st, "a", out, 2, s23, &err), SP_OK);
    ck_assert_mem_eq(out, a, sizeof a);
    ck_assert_int_eq(sp_st_read_f32(st, "b.half", out, 1, s2, &err), SP_OK);
    ck_assert_float_eq(out[0], 1.0f);
    ck_assert_float_eq(out[1], -2.0f);
    /* a wrong expected shape names file, tensor and both shapes */
    ck_assert_int_eq(sp_st_read_f32(st, "a", out, 2, s32, &err), SP_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "'a' has shape [2,3], expected [3,2]"));
    ck_assert_ptr_nonnull(strstr(err.msg, path));
    sp_st_close(st);
}
END_TEST

START_TEST(t_sharded_lazy)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/hf-tiny/llama-gqa", SEPAL_TEST_DATA);
    sp_safetensors *st = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_st_open(&st, dir, &err), SP_OK);
    ck_assert_int_eq(sp_st_count(st), 3 + 4 * 9);
    ck_assert_int_eq(sp_st_files_mapped(st), 0); /* nothing read until asked */
    const sp_st_tensor *t = sp_st_get(st, "model.layers.1.mlp.up_proj.weight", &err);
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(sp_st_files_mapped(st), 1);
    ck_assert_int_eq(t->shape[0], 176);
    ck_assert_int_eq(t->shape[1], 64);
    ck_assert_int_eq((long long)sp_st_bytes_read(st), 176 * 64 * 4);
    ck_assert_ptr_nonnull(strstr(t->file, "model-00004-of-00008.safetensors"));
    ck_assert_ptr_null(sp_st_get(st, "model.layers.9.mlp.up_proj.weight", &err));
    ck_assert_int_eq(err.code, SP_ERR_NOTFOUND);
    ck_assert_ptr_nonnull(strstr(err.msg, "'model.layers.9.mlp.up_proj.weight' not found"));
    sp_st_close(st);
}
END_TEST

START_TEST(t_truncated)
{
    expect_error(sp_test_write_file("empty.safetensors", "", 0), NULL, SP_ERR_FORMAT, "empty.safetensors",
                 "truncated");
    expect_error(sp_test_write_file("short.safetensors", "abc", 3), NULL, SP_ERR_FORMAT, "short.safetensors",
                 "truncated");
    /* header length larger than the file */
    unsigned char big[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}'};
    expect_error(sp_test_write_file("hlen.safetensors", big, 10), NULL, SP_ERR_FORMAT, "hlen.safetensors",
                 "runs past the file");
    /* data section shorter than the offsets claim (file cut in the middle of a tensor) */
    expect_error(make_st("cut.safetensors", "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 5),
                 NULL, SP_ERR_FORMAT, "cut.safetensors", "'x'");
}
END_TEST

START_TEST(t_corrupt_header)
{
    expect_error(make_st("json.safetensors", "{\"x\":{\"dtype\":", 0), NULL, SP_ERR_FORMAT, "json.safetensors",
                 "not a JSON object");
    expect_error(make_st("noshape.safetensors", "{\"x\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8), NULL,
                 SP_ERR_FORMAT, "noshape.safetensors", "'x'");
    expect_error(make_st("neg.safetensors", "{\"x\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8),
                 NULL, SP_ERR_FORMAT, "neg.safetensors", "bad shape");
    /* offsets that do not match dtype x shape */
    expect_error(make_st("size.safetensors", "{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8),
                 NULL, SP_ERR_FORMAT, "size.safetensors", "needs 12");
    /* end before begin */
    expect_error(make_st("rev.safetensors", "{\"x\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8),
                 NULL, SP_ERR_FORMAT, "rev.safetensors", "'x'");
    /* shape product overflows 64 bits */
    expect_error(make_st("ovf.safetensors",
                         "{\"x\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,8]}}",
                         8),
                 NULL, SP_ERR_FORMAT, "ovf.safetensors", "overflows");
}
END_TEST

START_TEST(t_overlap)
{
    expect_error(make_st("overlap.safetensors",
                         "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                         12),
                 NULL, SP_ERR_FORMAT, "overlap.safetensors", "overlap");
}
END_TEST

START_TEST(t_unknown_dtype)
{
    expect_error(make_st("dtype.safetensors", "{\"x\":{\"dtype\":\"F8_E9M9\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2),
                 NULL, SP_ERR_UNSUPPORTED, "dtype.safetensors", "unknown dtype 'F8_E9M9'");
    /* a known dtype that cannot be read as float */
    expect_error(make_st("int.safetensors", "{\"x\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8), "x",
                 SP_ERR_UNSUPPORTED, "int.safetensors", "'x'");
}
END_TEST

START_TEST(t_missing_tensor_and_file)
{
    expect_error(make_st("one.safetensors", "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8),
                 "y", SP_ERR_NOTFOUND, "one.safetensors", "'y' not found");
    expect_error("/nonexistent/dir/model.safetensors", NULL, SP_ERR_IO, "/nonexistent/dir/model.safetensors", NULL);
    const char *dir = sp_test_tmpdir();
    expect_error(dir, NULL, SP_ERR_NOTFOUND, dir, "no model.safetensors");
}
END_TEST

/* An index that names a shard which is missing, or a tensor its shard does not hold. */
START_TEST(t_bad_index)
{
    const char *dir = sp_test_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"weight_map\":{\"x\":\"shard-1.safetensors\",\"y\":\"shard-2.safetensors\"}}", f);
    fclose(f);
    snprintf(path, sizeof path, "%s/shard-1.safetensors", dir);
    const char *one = make_st("s1.safetensors", "{\"z\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    ck_assert_int_eq(rename(one, path), 0);
    expect_error(dir, "y", SP_ERR_IO, "shard-2.safetensors", NULL);
    expect_error(dir, "x", SP_ERR_NOTFOUND, "shard-1.safetensors", "'x' listed in the index is missing");
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    f = fopen(path, "w");
    fputs("{\"weight_map\":{\"x\":\"../escape.safetensors\"}}", f);
    fclose(f);
    expect_error(dir, NULL, SP_ERR_FORMAT, "bad shard name", NULL);
}
END_TEST

static Suite *st_suite(void)
{
    Suite *s = suite_create("safetensors");
    TCase *tc = tcase_create("reader");
    tcase_add_test(tc, t_roundtrip_writer_reader);
    tcase_add_test(tc, t_sharded_lazy);
    tcase_add_test(tc, t_truncated);
    tcase_add_test(tc, t_corrupt_header);
    tcase_add_test(tc, t_overlap);
    tcase_add_test(tc, t_unknown_dtype);
    tcase_add_test(tc, t_missing_tensor_and_file);
    tcase_add_test(tc, t_bad_index);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return sp_test_run(st_suite()); }
