/* test_cuda.c - CUDA kernels against their CPU references. Without a GPU every test reports itself
 * skipped (exit 77 for ctest) instead of passing silently. */
#include <stdio.h>
#include <stdlib.h>

#include "cuda_backend.h"
#include "ops.h"
#include "rng.h"
#include "testutil.h"

START_TEST(t_rmsnorm_matches_cpu)
{
    int N = 37, C = 1000;
    sp_rng r;
    sp_rng_seed(&r, 5);
    float *x = malloc((size_t)N * C * 4), *w = malloc((size_t)C * 4);
    float *cpu = malloc((size_t)N * C * 4), *gpu = malloc((size_t)N * C * 4);
    sp_rng_fill_normal(&r, x, (long)N * C, 2.0f);
    sp_rng_fill_normal(&r, w, C, 1.0f);
    sp_rmsnorm_forward(cpu, NULL, x, w, N, C, 1e-5f);
    sp_err err = {0};
    ck_assert_msg(sp_cuda_rmsnorm_forward(gpu, x, w, N, C, 1e-5f, &err) == SP_OK, "%s", err.msg);
    ck_assert_double_le(sp_max_abs_diff(cpu, gpu, (size_t)N * C), 1e-5);
    free(x), free(w), free(cpu), free(gpu);
}
END_TEST

int main(void)
{
    char why[256];
    if (sp_cuda_device_count(why, sizeof why) <= 0) {
        printf("test_cuda: skipped: no usable GPU (%s)\n", why);
        return 77;
    }
    char name[256];
    sp_cuda_device_name(name, sizeof name);
    printf("test_cuda: running on %s\n", name);
    setenv("CK_FORK", "no", 1); /* a CUDA context made before fork() is unusable in the child */
    Suite *s = suite_create("cuda");
    TCase *tc = tcase_create("kernels_vs_cpu");
    tcase_add_test(tc, t_rmsnorm_matches_cpu);
    suite_add_tcase(s, tc);
    return sp_test_run(s);
}
