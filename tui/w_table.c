/* w_table.c - a table's header row and scrolling (the widths: common/columns.h). */
#include <string.h>

#include "widgets.h"

void tui_table_header(tui_cb *cb, int y, int x, const tui_col *cols, int n, const int *w, int sort_col, int desc)
{
    const tui_glyphs *g = tui_cb_glyphs(cb);
    for (int i = 0; i < n; i++) {
        int cx = sp_cols_x(w, n, i);
        if (cx < 0)
            continue;
        int tw = tui_strwidth(cols[i].title) + (i == sort_col ? 1 : 0);
        int at = cols[i].right && tw < w[i] ? x + cx + w[i] - tw : x + cx;
        int k = tui_cb_text(cb, y, at, w[i] - (at - x - cx), cols[i].title, R_HEADER, TUI_BOLD);
        if (i == sort_col && at + k < x + cx + w[i])
            tui_cb_put(cb, y, at + k, desc ? g->down : g->up, R_HEADER, TUI_BOLD);
    }
}

int tui_table_scroll(int sel, int top, int visible, int nrows)
{
    if (visible <= 0 || nrows <= 0)
        return 0;
    if (sel < 0)
        sel = 0;
    if (sel >= nrows)
        sel = nrows - 1;
    if (sel < top)
        top = sel;
    if (sel >= top + visible)
        top = sel - visible + 1;
    if (top > nrows - visible)
        top = nrows - visible;
    return top < 0 ? 0 : top;
}
