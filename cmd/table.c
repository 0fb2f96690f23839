/* table.c - text tables fitted to a width, and a server's name in a table (table.h). */
#include "table.h"

#include <stdlib.h>
#include <string.h>

const char *sp_server_shown_name(const char *name, int local)
{
    return name && name[0] ? name : local ? "local" : "-";
}

/* Characters of UTF-8 text (continuation bytes not counted). */
static int u8_chars(const char *s)
{
    int n = 0;
    for (; s && *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* Bytes of the first `chars` characters of s. */
static size_t u8_prefix(const char *s, int chars)
{
    size_t i = 0;
    for (; s[i]; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80 && chars-- == 0)
            break;
    return i;
}

/* Appends cell s, cut or padded to w characters (padded on the left when right-aligned). */
static char *put_cell(char *at, const char *s, int w, int right)
{
    s = s ? s : "";
    int n = u8_chars(s);
    n = n < w ? n : w;
    if (right)
        for (int i = n; i < w; i++)
            *at++ = ' ';
    size_t b = u8_prefix(s, n);
    memcpy(at, s, b);
    at += b;
    if (!right)
        for (int i = n; i < w; i++)
            *at++ = ' ';
    return at;
}

/* One line: the shown columns of a row (titles when cells is NULL), trailing blanks removed. */
static void put_line(sp_app *app, const sp_col *cols, int ncols, const char *const *cells, const int *w, char *buf)
{
    char *at = buf;
    for (int c = 0, first = 1; c < ncols; c++) {
        if (!w[c])
            continue;
        if (!first)
            *at++ = ' ';
        first = 0;
        at = put_cell(at, cells ? cells[c] : cols[c].title, w[c], cols[c].right);
    }
    while (at > buf && at[-1] == ' ')
        at--;
    *at = 0;
    sp_out(app, "%s\n", buf);
}

void sp_table_out(sp_app *app, const sp_col *cols, int ncols, const char *const *cells, int nrows, int width)
{
    sp_col *fit = calloc((size_t)ncols, sizeof *fit);
    int *w = calloc((size_t)ncols, sizeof *w);
    size_t bytes = 1;
    for (int c = 0; fit && w && c < ncols; c++) {
        int cw = u8_chars(cols[c].title);
        for (int r = 0; r < nrows; r++) {
            const char *s = cells[(size_t)r * (size_t)ncols + (size_t)c];
            int k = u8_chars(s);
            cw = k > cw ? k : cw;
            bytes += s ? strlen(s) : 0;
        }
        int hi = cols[c].max_w && cols[c].max_w < cw ? cols[c].max_w : cw;
        fit[c] = cols[c];
        fit[c].max_w = hi;
        fit[c].min_w = cols[c].min_w && cols[c].min_w < hi ? cols[c].min_w : hi;
        bytes += strlen(cols[c].title) + (size_t)hi + 1;
    }
    char *buf = fit && w ? malloc(bytes) : NULL;
    if (!buf) {
        sp_app_error(app, "out of memory");
    } else {
        if (!sp_cols_fit(fit, ncols, width > 0 ? width : 1 << 20, w)) /* not one column fits: all of them */
            sp_cols_fit(fit, ncols, 1 << 20, w);
        put_line(app, cols, ncols, NULL, w, buf);
        for (int r = 0; r < nrows; r++)
            put_line(app, cols, ncols, cells + (size_t)r * (size_t)ncols, w, buf);
    }
    free(buf);
    free(fit);
    free(w);
}
