/* columns.c - a table's columns fitted to a width (columns.h). */
#include "columns.h"

int sp_cols_fit(const sp_col *cols, int n, int width, int *w)
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

int sp_cols_x(const int *w, int n, int c)
{
    if (c < 0 || c >= n || !w[c])
        return -1;
    int x = 0;
    for (int i = 0; i < c; i++)
        if (w[i])
            x += w[i] + 1;
    return x;
}
