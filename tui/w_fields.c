/* w_fields.c - a row of figures that fits its width: compact forms, then fewer blanks, then fewer figures. */
#include <stdio.h>
#include <string.h>

#include "widgets.h"

#define MAXF 16

static const char *form(const tui_field *f, int compact)
{
    return compact && f->compact && *f->compact ? f->compact : f->full;
}

/* The row with the fields of mask in a form and blanks apart (into buf if not NULL); returns its width. */
static int join(const tui_field *f, int n, unsigned mask, int compact, int sep, char *buf, size_t cap)
{
    int w = 0, k = 0;
    size_t len = 0;
    if (buf && cap)
        buf[0] = 0;
    for (int i = 0; i < n; i++) {
        if (!(mask & (1u << i)))
            continue;
        const char *s = form(&f[i], compact);
        w += (k ? sep : 0) + tui_strwidth(s);
        if (buf && len < cap)
            len += (size_t)snprintf(buf + len, cap - len, "%*s%s", k ? sep : 0, "", s);
        k++;
    }
    return w;
}

int tui_fields_join(const tui_field *f, int n, int width, char *buf, size_t cap)
{
    if (n > MAXF)
        n = MAXF;
    unsigned mask = 0;
    for (int i = 0; i < n; i++)
        if (f[i].full && *f[i].full)
            mask |= 1u << i;
    static const int stages[3][2] = {{0, 2}, {1, 2}, {1, 1}}; /* {compact, blanks} */
    while (mask) {
        for (int s = 0; s < 3; s++)
            if (join(f, n, mask, stages[s][0], stages[s][1], NULL, 0) <= width) {
                join(f, n, mask, stages[s][0], stages[s][1], buf, cap);
                return join(f, n, mask, stages[s][0], stages[s][1], NULL, 0);
            }
        if (!(mask & (mask - 1)))
            break; /* one left, and too wide: shown cut */
        int drop = -1; /* the lowest priority, the later of equal ones */
        for (int i = 0; i < n; i++)
            if ((mask & (1u << i)) && (drop < 0 || f[i].prio <= f[drop].prio))
                drop = i;
        mask &= ~(1u << drop);
    }
    if (!mask) {
        if (buf && cap)
            buf[0] = 0;
        return 0;
    }
    join(f, n, mask, 1, 1, buf, cap);
    int w = join(f, n, mask, 1, 1, NULL, 0);
    return w < width ? w : width;
}

int tui_fields(tui_cb *cb, int y, int x, int width, const tui_field *f, int n, int role)
{
    char buf[512];
    tui_fields_join(f, n, width, buf, sizeof buf);
    return tui_cb_text(cb, y, x, width, buf, role, 0);
}
