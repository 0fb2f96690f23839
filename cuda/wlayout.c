/* wlayout.c - host side of the device weight layouts (kernels.h): Q8 re-laid out row-major, the kernels' view of
 * a matrix. Plain C, so that the host harness (tests/test_cuda_host.c) and the uploads share it. */
#include <string.h>

#include "kernels.h"

_Static_assert(SP_KM_F32 == (int)SP_W_F32 && SP_KM_BF16 == (int)SP_W_BF16 && SP_KM_Q8 == (int)SP_W_Q8 &&
                   SP_KM_NF4 == (int)SP_W_NF4,
               "kmath.h's weight types follow sp_wtype");

void sp_cuda_q8_rowmajor(const sp_qmat *m, int8_t *q, float *scales)
{
    int nb = sp_km_blocks(m->cols, SP_KM_Q8_BLOCK);
    for (int r = 0; r < m->rows; r++)
        sp_qmat_q8_row(m, r, q + (size_t)r * m->cols, scales + (size_t)r * nb);
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
    memcpy(w.levels, sp_nf4_levels, sizeof w.levels);
    return w;
}
