/* w_table.c - column widths by priority, the header row, scrolling. */
#include <string.h>

#include "widgets.h"

int tui_table_widths(const tui_col *cols, int n, int width, int *w)
{
    int shown = n, used = 0;
    for (int i = 0; i < n; i++) {
        w[i] = cols[i].min_w;
        used += cols[i].min_w + (i ? 1 : 0);
    }
    while (shown > 0 && used > width) { /* drop the lowest priority (the rightmost among equals) */
        int drop = -1;
        for (int i = 0; i < n; i++)
            if (w[i] && (drop < 0 || cols[i].prio <= cols[drop].prio))
                drop = i;
        used -= w[drop] + (shown > 1 ? 1 : 0);
        w[drop] = 0;
        shown--;
    }
    if (shown == 0)
        return 0;
    int spare = width - used, flex = -1;
    for (int i = 0; i < n && spare > 0; i++) {
        if (!w[i])
            continue;
        if (!cols[i].max_w) {
            if (flex < 0)
                flex = i;
            continue;
        }
        int add = cols[i].max_w - w[i];
        add = add > spare ? spare : add;
        if (add > 0) {
            w[i] += add;
            spare -= add;
        }
    }
    if (flex >= 0 && spare > 0)
        w[flex] += spare;
    return shown;
}

int tui_table_colx(const int *w, int n, int c)
{
    if (c < 0 || c >= n || !w[c])
        return -1;
    int x = 0, first = 1;
    for (int i = 0; i < c; i++)
        if (w[i]) {
            x += w[i] + 1;
            first = 0;
        }
    (void)first;
    return x;
}

void tui_table_header(tui_cb *cb, int y, int x, const tui_col *cols, int n, const int *w, int sort_col, int desc)
{
    const tui_glyphs *g = tui_cb_glyphs(cb);
    for (int i = 0; i < n; i++) {
        int cx = tui_table_colx(w, n, i);
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
