/* wlayout.c - host side of the device weight layouts (kernels.h): Q8 and NF4 re-laid out row-major, the kernels' view of
 * a matrix. Plain C, so that the host harness (tests/test_cuda_host.c) and the uploads share it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

_Static_assert(SP_KM_F32 == (int)SP_W_F32 && SP_KM_BF16 == (int)SP_W_BF16 && SP_KM_Q8 == (int)SP_W_Q8 &&
                   SP_KM_NF4 == (int)SP_W_NF4 && SP_KM_F16 == (int)SP_W_F16,
               "kmath.h's weight types follow sp_wtype");

void sp_cuda_q8_rowmajor(const sp_qmat *m, int8_t *q, float *scales)
{
    int nb = sp_km_blocks(m->cols, SP_KM_Q8_BLOCK);
    for (int r = 0; r < m->rows; r++)
        sp_qmat_int_row(m, r, q + (size_t)r * m->cols, scales + (size_t)r * nb);
}

/* NF4's level i as the integer kern.c multiplies by the block's step (sp_nf4_levels are those over 127). */
static int nf4_level(int i) { return (int)lrintf(sp_nf4_levels[i] * 127.0f); }

sp_status sp_cuda_nf4_rowmajor(const sp_qmat *m, uint8_t *q, float *scales, sp_err *err)
{
    int C = m->cols, nb = sp_km_blocks(C, SP_KM_NF4_BLOCK), half = SP_KM_NF4_BLOCK / 2;
    int8_t *v = malloc((size_t)C);
    float *s = malloc((size_t)sp_km_blocks(C, SP_KM_Q8_BLOCK) * sizeof(float));
    uint8_t idx[256];
    if (!v || !s) {
        free(v);
        free(s);
        return sp_errf(err, SP_ERR_NOMEM, "cuda: out of host memory re-laying an nf4 matrix");
    }
    memset(idx, 7, sizeof idx); /* (every value sp_qmat_int_row gives is one of the 16 levels) */
    for (int i = 0; i < 16; i++)
        idx[(uint8_t)(int8_t)nf4_level(i)] = (uint8_t)i;
    for (int r = 0; r < m->rows; r++) {
        uint8_t *row = q + (size_t)r * nb * half;
        sp_qmat_int_row(m, r, v, s); /* levels as integers; the step of each 32 columns, a block's twice */
        memset(row, 0, (size_t)nb * half);
        for (int c = 0; c < C; c++) {
            int b = c / SP_KM_NF4_BLOCK, k = c % SP_KM_NF4_BLOCK, i = idx[(uint8_t)v[c]];
            row[b * half + k % half] |= (uint8_t)(k < half ? i : i << 4);
        }
        for (int b = 0; b < nb; b++)
            scales[(size_t)r * nb + b] = s[2 * b];
    }
    free(v);
    free(s);
    return SP_OK;
}

sp_km_w sp_cuda_km_w(sp_wtype type, int rows, int cols, const void *q, const float *scale)
{
    sp_km_w w;
    memset(&w, 0, sizeof w);
    w.type = (int)type;
    w.rows = rows;
    w.cols = cols;
    w.q = q;
    w.scale = scale;
    for (int i = 0; i < 16; i++) /* weight = level x the block's step, in integers as kern.c has them */
        w.levels[i] = (float)nf4_level(i);
    return w;
}
