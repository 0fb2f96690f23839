/* w_bar.c - progress bar and sparkline. */
#include <math.h>

#include "widgets.h"

void tui_progress(tui_cb *cb, int y, int x, int w, double frac, int role)
{
    const tui_glyphs *g = tui_cb_glyphs(cb);
    if (w < 3)
        return;
    if (!(frac >= 0))
        frac = 0;
    if (frac > 1)
        frac = 1;
    int inner = w - 2;
    tui_cb_put(cb, y, x, '[', R_DIM, 0);
    tui_cb_put(cb, y, x + w - 1, ']', R_DIM, 0);
    int eighths = (int)floor(frac * inner * 8 + 1e-9);
    for (int i = 0; i < inner; i++) {
        int e = eighths - i * 8;
        if (e >= 8)
            tui_cb_put(cb, y, x + 1 + i, g->full, role, 0);
        else if (e > 0 && g->eighth[e] != ' ')
            tui_cb_put(cb, y, x + 1 + i, g->eighth[e], role, 0);
        else
            tui_cb_put(cb, y, x + 1 + i, ' ', R_BAR_EMPTY, 0);
    }
}

void tui_spark(tui_cb *cb, int y, int x, int w, const double *v, int n, int role)
{
    const tui_glyphs *g = tui_cb_glyphs(cb);
    int first = n > w ? n - w : 0;
    double max = 0;
    for (int i = first; i < n; i++)
        max = isfinite(v[i]) && v[i] > max ? v[i] : max;
    for (int i = first; i < n; i++) {
        double f = max > 0 && isfinite(v[i]) && v[i] > 0 ? v[i] / max : 0;
        int lvl = (int)lround(f * 7);
        tui_cb_put(cb, y, x + (i - first), f > 0 ? g->spark[lvl < 0 ? 0 : lvl > 7 ? 7 : lvl] : ' ', role, 0);
    }
}
