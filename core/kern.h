/* kern.h - weight matrices in the encodings servers hold blocks in, and the products with them: decode
 * matvecs (own kernels: scalar, AVX2, AVX2 + AVX-VNNI and AVX-512, chosen at run time), small batches, and
 * large products (prefill, training): int8 and nf4 in the decode kernels, f32 (and the rest) through sgemm.
 *
 * A matrix is [rows, cols] in the Hugging Face layout (out, in): y[r] = sum_c W[r][c] x[c].
 *   SP_W_F32   4 bytes a weight.
 *   SP_W_BF16  the upper half of each f32 (2 bytes), rounded to nearest even.
 *   SP_W_F16   IEEE half precision ("fp16"; 2 bytes: 11-bit significand, 5-bit exponent, largest finite 65504,
 *              subnormals from 2^-24), rounded to nearest even; a weight that is not finite or beyond 65504 in
 *              magnitude is refused (sp_qmat_encode), never made infinite. Closer to f32 than bf16 (2^-11
 *              relative, bf16's 2^-8) in a narrower range.
 *   SP_W_Q8    llama.cpp's Q8_0 idea: each row in blocks of 32 (the last one may be shorter), int8 values and
 *              one f32 scale per block (absmax / 127); 1.125 bytes a weight.
 *   SP_W_NF4   bitsandbytes' NF4 idea: each row in blocks of 64 (the last one may be shorter), 4-bit indices
 *              into 16 NormalFloat levels (bitsandbytes' code book rounded to multiples of 1/127, at most
 *              0.0045 from it, a tenth of the narrowest gap), one f32 step per block (absmax / 127): a weight
 *              is an int8 level (-127..127) times its step; 0.5625 bytes a weight.
 * Q8 and NF4 are stored interleaved, 16 rows at a time (kern.c), so that the kernels read 16 rows' weights in
 * one load; sp_qmat_row and sp_qmat_int_row read them.
 * Quantisation is deterministic (round to nearest; NF4: nearest level).
 *
 * The SIMD levels multiply SP_W_Q8 and SP_W_NF4 matrices in integers, as llama.cpp's Q8_0 x Q8_0 (and Q4_0 x
 * Q8_0) does: each vector x is quantised the same way (blocks of 32, absmax / 127; sp_q8_quantize), the int8
 * products of a block are summed exactly, and the block's sum is scaled by both scales in f32. A row's last,
 * shorter block too (x's short block quantised on its own; both padded with zeros). */
#ifndef SEPAL_KERN_H
#define SEPAL_KERN_H

#include <stddef.h>
#include <stdint.h>

#include "pool.h"
#include "status.h"

/* (SP_W_F16 last: the others keep their numbers, which the device's encodings and the options' choices follow) */
typedef enum { SP_W_F32, SP_W_BF16, SP_W_Q8, SP_W_NF4, SP_W_F16, SP_W__COUNT } sp_wtype;

typedef struct sp_qmat {
    sp_wtype type;
    int rows, cols;
    void *q;         /* values: f32, bf16 or fp16 (uint16), int8, or packed nibbles */
    float *scale;    /* Q8 / NF4: one per block, rows x blocks_per_row */
    size_t row_bytes;/* bytes of one row of q */
    int owned;       /* q and scale were allocated by sp_qmat_encode */
} sp_qmat;

const char *sp_wtype_name(sp_wtype t);        /* "f32", "bf16", "int8", "nf4", "fp16" */
/* 0, or -1 for an unknown name; besides the names, SP_WTYPE_ALIASES' (the options' choices take them too). */
int sp_wtype_parse(const char *name, sp_wtype *t);
#define SP_WTYPE_ALIASES "q8=int8|f16=fp16|float16=fp16"
/* Bytes a matrix of this shape takes (values and scales). */
size_t sp_qmat_bytes(sp_wtype t, int rows, int cols);

/* W as an f32 matrix that refers to w (not copied, not owned). */
sp_qmat sp_qmat_f32(const float *w, int rows, int cols);
/* Encodes w [rows, cols] (f32) in type t into a new matrix. SP_W_F16: a weight that is not finite or beyond
 * 65504 in magnitude is an SP_ERR_ARG ("weights: [4, 6] to fp16: weight (1, 2) = 100000 is beyond fp16's range
 * (finite, at most 65504 in magnitude)"), nothing allocated. */
sp_status sp_qmat_encode(sp_qmat *m, sp_wtype t, const float *w, int rows, int cols, sp_err *err);
void sp_qmat_free(sp_qmat *m);
/* Row r, decoded to f32 (out: cols floats). */
void sp_qmat_row(const sp_qmat *m, int r, float *out);
/* Row r of an SP_W_Q8 or SP_W_NF4 matrix as the integer kernels see it: q [cols] int8 values (NF4: its levels
 * as integers), scales [ceil(cols / 32)] the step of each 32 columns (NF4: its block's, twice) (tests). */
void sp_qmat_int_row(const sp_qmat *m, int r, int8_t *q, float *scales);

/* The most rows of X the decode kernels take at once; sp_qmat_mul runs them up to here. */
#define SP_KERN_MAX_ROWS 8

/* Y[B, rows] = X[B, cols] W^T. B <= SP_KERN_MAX_ROWS, and any B of an SP_W_Q8 or SP_W_NF4 W at a level that
 * multiplies it in integers, runs the decode kernels (W read once for SP_KERN_MAX_ROWS rows of X, each row's bits
 * as alone), split over the pool by rows. A larger B of the others runs sgemm, on W's rows (f32) or on tiles of
 * them decoded to f32: split over the pool by rows of W, one part a thread, when OpenBLAS runs one thread
 * (openblas_set_num_threads(1): each part's sgemm on its own thread); one sgemm on the calling thread (and
 * OpenBLAS's) otherwise. The split changes Y's bits only where OpenBLAS's own threads change them: its AVX-512
 * sgemm (Cooperlake, SkylakeX) gives every element the same bits in any part; its Haswell sgemm's last bits
 * depend on where an element lies in the call, as they do on its thread count. */
void sp_qmat_mul(const sp_qmat *W, const float *X, float *Y, int B, sp_pool *pool);
/* Y = X W^T in the decode kernels for any B (a batch of decode steps): row b of Y has the bits that
 * sp_qmat_mul(W, X + b * cols, .., 1, ..) gives it alone, whatever the other rows are; W is read from memory
 * once for SP_KERN_MAX_ROWS rows at a time and from the caches for the rest. */
void sp_qmat_mul_rows(const sp_qmat *W, const float *X, float *Y, int B, sp_pool *pool);
/* Greedy decoding's argmax without every row in f32: S is W's SP_W_Q8 encoding, W an f32 matrix (the LM head).
 * Returns the first r maximising the f32 product W[r] . x exactly as sp_qmat_mul(W, x, .., 1, ..) computes it;
 * -1 when the screen cannot decide (a non-finite value, a row too long): compute all rows then. approx
 * (rows floats) is scratch. S's product (sp_qmat_mul) is within sum_b s_b (|x|_1,b + n_b max|x|_b) / 2 of
 * the exact one (s_b: the row's scale of block b of n_b columns; half a step for each weight, and for the
 * input when the integer kernels quantise it), widened for floating-point rounding; only the rows whose
 * upper bound reaches the highest lower bound are computed in f32 (few: the rest is never read). */
int sp_qmat_argmax(const sp_qmat *W, const sp_qmat *S, const float *x, float *approx, sp_pool *pool);
/* dX[B, cols] += dY[B, rows] W (the input gradient through W, weights frozen). */
void sp_qmat_mul_t_acc(const sp_qmat *W, const float *dY, float *dX, int B, sp_pool *pool);
/* A batch of n items (a server's merged training requests), rows[i] rows each, in order in X and Y (dY, dX): item
 * i's rows get the bits sp_qmat_mul (sp_qmat_mul_t_acc) gives it alone, whatever the other items (sgemm's bits
 * follow how many rows it multiplies, so each item is its own product); an encoded W's tiles are decoded once for
 * all the items that go through sgemm, and read from the caches for the rest. */
void sp_qmat_mul_items(const sp_qmat *W, const float *X, float *Y, const int *rows, int n, sp_pool *pool);
void sp_qmat_mul_t_acc_items(const sp_qmat *W, const float *dY, float *dX, const int *rows, int n, sp_pool *pool);

/* Kernel levels, lowest first: the scalar reference; AVX2 + FMA (int8 and nf4 with vpmaddubsw; fp16 with F16C's
 * vcvtph2ps where the CPU has F16C, else fp16 in the scalar kernel: every AVX2 CPU known has it, but the level
 * does not ask for it); AVX2 with AVX-VNNI (int8 and nf4 with 256-bit vpdpbusd); AVX-512 (F, BW, VL, DQ; fp16
 * with AVX512F's vcvtph2ps; int8 and nf4 with vpdpbusd where the CPU has AVX512-VNNI). */
typedef enum { SP_ISA_SCALAR, SP_ISA_AVX2, SP_ISA_AVXVNNI, SP_ISA_AVX512, SP_ISA__COUNT } sp_isa;

/* Which kernels run: the best level this CPU has, at most what SEPAL_ISA names (scalar, avx2, avxvnni or avx512;
 * read once: a name this CPU lacks gives the best level below it, an unknown one is ignored, each with a
 * warning) or sp_kern_force set. */
int sp_kern_level(void);
/* SEPAL_ISA unset, or a level this CPU runs: SP_OK. Else SP_ERR_ARG ("SEPAL_ISA=avx9: not a kernel level
 * (scalar, avx2, avxvnni, avx512)") or SP_ERR_UNSUPPORTED ("SEPAL_ISA=avx512: this CPU does not run avx512
 * kernels (it runs scalar, avx2)"). The programs call it at start and refuse to run on an error. */
sp_status sp_kern_check_env(sp_err *err);
/* 1 if this CPU runs the level. */
int sp_kern_supported(int level);
/* Tests and benchmarks: use the best supported level at most this one (-1: the best again, SEPAL_ISA's cap). */
void sp_kern_force(int level);
/* The level's name ("scalar", "avx2", "avxvnni", "avx512"); its number for a name, or -1. */
const char *sp_kern_level_name(int level);
int sp_kern_level_parse(const char *name);

/* 1 if products with SP_W_Q8 or SP_W_NF4 matrices run in integers at the current level (x quantised; see
 * above); sp_kern_int_name says with what ("avx2 vpmaddubsw", ...; NULL: in f32). */
int sp_kern_integer(sp_wtype t);
const char *sp_kern_int_name(sp_wtype t);
/* What runs now, for the programs' reports: "avx2 kernels (int8 and nf4 in integers: avx2 vpmaddubsw), OpenBLAS
 * Haswell" (the last: the core of the large products' sgemm, blastune.h). */
void sp_kern_describe(char *buf, size_t n);
/* One row's dot product with x in the current level's f32 kernel (tests). */
float sp_qmat_dot(const sp_qmat *m, int r, const float *x);

/* Attention over cached rows (W: rows of cols floats, ldw floats apart; keys or values), on the calling
 * thread in the current level's kernels: y[r] = scale * (x . W[r]) for every row, and y[c] += sum_r p[r] W[r][c]. */
void sp_f32_dot_rows(const float *W, size_t ldw, int rows, int cols, const float *x, float scale, float *y);
void sp_f32_axpy_rows(const float *W, size_t ldw, int rows, int cols, const float *p, float *y);
/* The first maximum of x[0..n) (greedy's choice; NaN never wins), vectorised where the CPU allows. */
int sp_argmax(const float *x, int n);

/* x [n] -> q [blocks of 32, the last one padded with zeros] and s [ceil(n / 32)]: how Q8 products quantise x. */
void sp_q8_quantize(const float *x, int n, int8_t *q, float *s);

/* The 16 NF4 levels (ascending, in [-1, 1]): bitsandbytes' code book rounded to multiples of 1/127. */
extern const float sp_nf4_levels[16];

#endif
