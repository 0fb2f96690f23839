/* blastune.h - OpenBLAS's kernels for this CPU, where its CPU table is older than the CPU. */
#ifndef SEPAL_BLASTUNE_H
#define SEPAL_BLASTUNE_H

/* OpenBLAS picks its kernels once, as it loads, from the CPU's family and model; a CPU newer than its table gets an
 * old core's (Debian 12's 0.3.21 on an Intel Xeon of family 6 model 207, Emerald Rapids: "Prescott", SSE3), and
 * every large product (a prompt's pass, training) runs at a fraction of the speed: stories15M f32 prefill ~1400
 * tok/s against ~3700 with its Haswell kernels (1 thread). Where OpenBLAS chose a core without AVX2 on a CPU that
 * has AVX2 and FMA (or AVX-512), this sets OPENBLAS_CORETYPE to the core of what the CPU has (SkylakeX with AVX-512
 * F/BW/VL/DQ, else Haswell; Haswell where SEPAL_ISA says avx2 or avxvnni) and runs the program again (execv of its
 * own file, /proc/self/exe's target, argv as given), so that OpenBLAS reads it as it loads; `sepal` and
 * `sepal-server` call it first thing. A coretype set already (by the user, or this on the first run) is left
 * alone; where the exec fails the program goes on with OpenBLAS's choice. Returns only then (or at once when there
 * is nothing to do). SEPAL_BLAS_CORE=keep turns it off. */
void sp_blas_tune(char **argv);

/* The core OpenBLAS runs ("Haswell", "SkylakeX", "Prescott", ...), or "" when it does not say. */
const char *sp_blas_core(void);

/* The core sp_blas_tune would ask for on this CPU given OpenBLAS's choice `core` (NULL: it keeps `core`). */
const char *sp_blas_core_wanted(const char *core);

#endif
