/* w_span.c - a server's span over all blocks, and the swarm's coverage per block. */
#include "widgets.h"

void tui_spanbar(tui_cb *cb, int y, int x, int w, int start, int end, int nblocks, int role)
{
    const tui_glyphs *g = tui_cb_glyphs(cb);
    for (int i = 0; i < w; i++) {
        if (nblocks <= 0) {
            tui_cb_put(cb, y, x + i, g->empty, R_BAR_EMPTY, 0);
            continue;
        }
        /* cell i covers [a, b) in blocks; the span covers [lo, hi) of it */
        double a = (double)i * nblocks / w, b = (double)(i + 1) * nblocks / w;
        double lo = start > a ? start : a, hi = end < b ? end : b;
        double f = hi > lo ? (hi - lo) / (b - a) : 0;
        if (f >= 0.999)
            tui_cb_put(cb, y, x + i, g->full, role, 0);
        else if (f > 0.001)
            tui_cb_put(cb, y, x + i, lo > a + 1e-9 ? g->right_part : g->left_part, role, 0);
        else
            tui_cb_put(cb, y, x + i, g->empty, R_BAR_EMPTY, 0);
    }
}

void tui_coverage(tui_cb *cb, int y, int x, int w, const int *count, int nblocks)
{
    for (int i = 0; i < w; i++) {
        if (nblocks <= 0) {
            tui_cb_put(cb, y, x + i, ' ', R_DIM, 0);
            continue;
        }
        int b0 = (int)((long)i * nblocks / w), b1 = (int)((long)(i + 1) * nblocks / w);
        if (b1 <= b0)
            b1 = b0 + 1;
        int least = count[b0];
        for (int b = b0 + 1; b < b1 && b < nblocks; b++)
            least = count[b] < least ? count[b] : least;
        if (least <= 0)
            tui_cb_put(cb, y, x + i, '!', R_ERR, TUI_BOLD);
        else
            tui_cb_put(cb, y, x + i, least > 9 ? '+' : (uint32_t)('0' + least), least > 1 ? R_GOOD : R_ONLINE, 0);
    }
}
