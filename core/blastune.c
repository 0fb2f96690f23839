/* blastune.c - OpenBLAS's kernels for this CPU (blastune.h). */
#include "blastune.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

char *openblas_get_corename(void);

const char *sp_blas_core(void)
{
    const char *c = openblas_get_corename();
    return c ? c : "";
}

const char *sp_blas_core_wanted(const char *core)
{
#if defined(__x86_64__)
    /* OpenBLAS's cores with AVX2 kernels (its names, as openblas_get_corename says them): any of these is kept */
    static const char *const strong[] = {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"};
    for (size_t i = 0; i < sizeof strong / sizeof *strong; i++)
        if (core && !strcasecmp(core, strong[i]))
            return NULL;
    __builtin_cpu_init();
    const char *isa = getenv("SEPAL_ISA"); /* a machine without AVX-512 emulated (kern.h): its core */
    int no512 = isa && (!strcmp(isa, "avx2") || !strcmp(isa, "avxvnni"));
    if (!no512 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return "Haswell";
#else
    (void)core;
#endif
    return NULL;
}

void sp_blas_tune(char **argv)
{
    const char *keep = getenv("SEPAL_BLAS_CORE");
    if (getenv("OPENBLAS_CORETYPE") || (keep && !strcmp(keep, "keep")) || !argv || !argv[0])
        return;
    const char *want = sp_blas_core_wanted(sp_blas_core());
    if (!want)
        return;
    /* the program's own path, not /proc/self/exe: the name ps, top and pgrep show is the exec'd file's */
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0 || (size_t)n >= sizeof self - 1 || setenv("OPENBLAS_CORETYPE", want, 1))
        return;
    self[n] = 0;
    execv(self, argv);
    /* (no exec: this run keeps OpenBLAS's choice, and says so where the figures come from) */
    fprintf(stderr, "%s: OpenBLAS runs its %s kernels on this CPU (%s would be faster; run again with "
                    "OPENBLAS_CORETYPE=%s)\n", argv[0], sp_blas_core(), want, want);
    unsetenv("OPENBLAS_CORETYPE");
}
