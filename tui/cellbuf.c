/* cellbuf.c - the cell grid, its glyph sets and UTF-8 text into it. */
#include "cellbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wchar.h>

static const tui_glyphs G_UTF8 = {
    .h = 0x2500, .v = 0x2502, .tl = 0x250C, .tr = 0x2510, .bl = 0x2514, .br = 0x2518,
    .ltee = 0x251C, .rtee = 0x2524, .ttee = 0x252C, .btee = 0x2534,
    .state = {0x25CF /* ● */, 0x25D0 /* ◐ */, 0x2716 /* ✖ */, '_'},
    .full = 0x2588, .empty = 0x00B7, .left_part = 0x258C, .right_part = 0x2590,
    .eighth = {' ', 0x258F, 0x258E, 0x258D, 0x258C, 0x258B, 0x258A, 0x2589},
    .spark = {0x2581, 0x2582, 0x2583, 0x2584, 0x2585, 0x2586, 0x2587, 0x2588},
    .arrow = 0x25B6, .up = 0x25B2, .down = 0x25BC, .ellipsis = 0x2026, .check = 0x2713, .cross = 0x2717,
    .more = 0x25BC,
    .braille = 1,
};

static const tui_glyphs G_ASCII = {
    .h = '-', .v = '|', .tl = '+', .tr = '+', .bl = '+', .br = '+',
    .ltee = '+', .rtee = '+', .ttee = '+', .btee = '+',
    .state = {'#', 'J', '?', '_'},
    .full = '#', .empty = '.', .left_part = '+', .right_part = '+',
    .eighth = {' ', ' ', ' ', ' ', '+', '+', '+', '+'},
    .spark = {'_', '_', '.', '.', '-', '-', '=', '^'},
    .arrow = '>', .up = '^', .down = 'v', .ellipsis = '~', .check = '+', .cross = 'x', .more = 'v',
    .braille = 0,
};

const tui_glyphs *tui_glyphs_for(int utf8) { return utf8 ? &G_UTF8 : &G_ASCII; }

int tui_cb_resize(tui_cb *cb, int h, int w)
{
    if (h < 0)
        h = 0;
    if (w < 0)
        w = 0;
    if (h == cb->h && w == cb->w && (cb->c || !h || !w)) {
        tui_cb_clear(cb);
        return 0;
    }
    tui_cell *c = h && w ? malloc((size_t)h * (size_t)w * sizeof *c) : NULL;
    free(cb->c);
    cb->c = c;
    if (h && w && !c) {
        cb->h = cb->w = 0;
        return -1;
    }
    cb->h = h;
    cb->w = w;
    tui_cb_clear(cb);
    return 0;
}

void tui_cb_free(tui_cb *cb)
{
    free(cb->c);
    cb->c = NULL;
    cb->h = cb->w = 0;
}

void tui_cb_clear(tui_cb *cb)
{
    for (int i = 0; i < cb->h * cb->w; i++)
        cb->c[i] = (tui_cell){.ch = ' ', .role = R_TEXT};
}

/* A cell written over half of a wide character leaves a blank in the other half. */
static void unsplit(tui_cb *cb, int y, int x)
{
    tui_cell *row = cb->c + (size_t)y * cb->w;
    if (row[x].ch == 0 && x > 0)
        row[x - 1].ch = ' ';
    if (x + 1 < cb->w && row[x + 1].ch == 0)
        row[x + 1].ch = ' ';
}

void tui_cb_put(tui_cb *cb, int y, int x, uint32_t ch, int role, int flags)
{
    if (y < 0 || x < 0 || y >= cb->h || x >= cb->w)
        return;
    if (!cb->utf8 && ch > 0x7e)
        ch = '?';
    unsplit(cb, y, x);
    cb->c[(size_t)y * cb->w + x] = (tui_cell){.ch = ch, .role = (uint8_t)role, .flags = (uint8_t)flags};
}

void tui_cb_fill(tui_cb *cb, int y, int x, int h, int w, uint32_t ch, int role, int flags)
{
    for (int i = y; i < y + h; i++)
        for (int j = x; j < x + w; j++)
            tui_cb_put(cb, i, j, ch, role, flags);
}

void tui_cb_paint(tui_cb *cb, int y, int x, int h, int w, int role, int flags)
{
    for (int i = y < 0 ? 0 : y; i < y + h && i < cb->h; i++)
        for (int j = x < 0 ? 0 : x; j < x + w && j < cb->w; j++) {
            tui_cell *c = &cb->c[(size_t)i * cb->w + j];
            c->role = (uint8_t)role;
            c->flags |= (uint8_t)flags;
        }
}

int tui_utf8_decode(const char *str, size_t n, uint32_t *cp)
{
    const unsigned char *s = (const unsigned char *)str;
    if (!n) {
        *cp = 0;
        return 0;
    }
    unsigned c = s[0];
    int len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 1) {
        *cp = c;
        return 1;
    }
    if (!len || (size_t)len > n) {
        *cp = 0xFFFD;
        return 1;
    }
    uint32_t v = c & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) { /* a truncated sequence: one U+FFFD for what there is of it */
            *cp = 0xFFFD;
            return i;
        }
        v = v << 6 | (s[i] & 0x3F);
    }
    static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < least[len] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) { /* overlong, too big, surrogate */
        *cp = 0xFFFD;
        return len;
    }
    *cp = v;
    return len;
}

int tui_utf8_encode(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

int tui_cpwidth(uint32_t cp)
{
    if (cp < 0x20 || (cp >= 0x7F && cp < 0xA0))
        return 0;
    if (cp < 0x7F)
        return 1;
    int w = wcwidth((wchar_t)cp);
    return w < 0 ? -1 : w > 2 ? 2 : w;
}

int tui_strwidth(const char *s)
{
    size_t n = strlen(s);
    int w = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += (size_t)tui_utf8_decode(s + i, n - i, &cp);
        int cw = tui_cpwidth(cp);
        w += cw < 0 ? 1 : cw;
    }
    return w;
}

int tui_cb_textn(tui_cb *cb, int y, int x, int maxw, const char *s, size_t n, int role, int flags)
{
    int col = 0;
    if (maxw < 0 || x + maxw > cb->w)
        maxw = cb->w - x;
    for (size_t i = 0; i < n && col < maxw;) {
        uint32_t cp;
        i += (size_t)tui_utf8_decode(s + i, n - i, &cp);
        if (cp == '\t')
            cp = ' ';
        int w;
        if (!cb->utf8) {
            w = cp < 0x20 || cp == 0x7F ? 0 : 1;
            if (cp > 0x7E)
                cp = '?';
        } else {
            w = tui_cpwidth(cp);
            if (w < 0) {
                cp = 0xFFFD;
                w = 1;
            }
        }
        if (!w)
            continue;
        if (col + w > maxw)
            break;
        tui_cb_put(cb, y, x + col, cp, role, flags);
        if (w == 2 && y >= 0 && y < cb->h && x + col + 1 >= 0 && x + col + 1 < cb->w) {
            unsplit(cb, y, x + col + 1);
            cb->c[(size_t)y * cb->w + x + col + 1] = (tui_cell){.ch = 0, .role = (uint8_t)role, .flags = (uint8_t)flags};
        } else if (w == 2 && x + col + 1 >= cb->w && y >= 0 && y < cb->h && x + col >= 0 && x + col < cb->w) {
            cb->c[(size_t)y * cb->w + x + col].ch = ' '; /* no room for its right half */
        }
        col += w;
    }
    return col;
}

int tui_cb_text(tui_cb *cb, int y, int x, int maxw, const char *s, int role, int flags)
{
    return tui_cb_textn(cb, y, x, maxw, s, strlen(s), role, flags);
}

int tui_cb_printf(tui_cb *cb, int y, int x, int maxw, int role, int flags, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return tui_cb_text(cb, y, x, maxw, buf, role, flags);
}

int tui_cb_text_right(tui_cb *cb, int y, int xend, int maxw, const char *s, int role, int flags)
{
    int w = cb->utf8 ? tui_strwidth(s) : (int)strlen(s);
    if (w > maxw)
        w = maxw;
    tui_cb_text(cb, y, xend - w, w, s, role, flags);
    return xend - w;
}

void tui_cb_blit(tui_cb *cb, int y, int x, const tui_cb *src)
{
    for (int i = 0; i < src->h; i++) {
        if (y + i < 0 || y + i >= cb->h)
            continue;
        for (int j = 0; j < src->w; j++)
            if (x + j >= 0 && x + j < cb->w)
                cb->c[(size_t)(y + i) * cb->w + x + j] = src->c[(size_t)i * src->w + j];
    }
}

void tui_cb_row(const tui_cb *cb, int y, char *out, size_t cap)
{
    size_t n = 0;
    if (!cap)
        return;
    for (int x = 0; y >= 0 && y < cb->h && x < cb->w; x++) {
        uint32_t ch = cb->c[(size_t)y * cb->w + x].ch;
        if (!ch)
            continue;
        char b[4];
        int k = tui_utf8_encode(ch, b);
        if (n + (size_t)k + 1 > cap)
            break;
        memcpy(out + n, b, (size_t)k);
        n += (size_t)k;
    }
    out[n] = 0;
}
