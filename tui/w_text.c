/* w_text.c - a text stream, word-wrapped from its end at draw time (so a resize rewraps it). */
#include <stdlib.h>
#include <string.h>

#include "widgets.h"

static int cell_width(uint32_t cp)
{
    if (cp == '\t')
        return 1;
    int w = tui_cpwidth(cp);
    return w < 0 ? 1 : w;
}

/* Wraps the paragraph s[a, b) (no newline inside), keeping its last `keep` lines in ring[] (a ring of keep).
 * Returns how many lines it has in all. */
static long wrap_para(const char *s, size_t a, size_t b, int width, tui_line *ring, int keep)
{
    long count = 0;
    size_t pos = a;
    do {
        size_t start = pos, i = pos, brk = 0;
        int col = 0;
        while (i < b) {
            uint32_t cp;
            int len = tui_utf8_decode(s + i, b - i, &cp), w = cell_width(cp);
            if (col + w > width && col > 0)
                break;
            col += w;
            i += (size_t)len;
            if (cp == ' ')
                brk = i;
        }
        size_t end = i;
        if (i < b && brk > start)
            end = brk;
        ring[count % keep] = (tui_line){.off = start, .len = end - start};
        count++;
        pos = end;
    } while (pos < b);
    return count;
}

int tui_text_wrap(const char *s, size_t n, int width, tui_line *lines, int cap, int *more)
{
    *more = 0;
    if (cap <= 0 || width <= 0)
        return 0;
    tui_line *ring = malloc((size_t)cap * sizeof *ring);
    if (!ring)
        return 0;
    int end = cap; /* lines[end, cap) are filled, in order */
    size_t pb = n; /* the end of the paragraph being wrapped */
    for (;;) {
        size_t pa = pb;
        while (pa > 0 && s[pa - 1] != '\n')
            pa--;
        int need = end;
        long total = wrap_para(s, pa, pb, width, ring, need);
        int kept = total < need ? (int)total : need;
        for (int k = 0; k < kept; k++) /* the last `kept` lines of the ring, in order */
            lines[end - kept + k] = ring[(total - kept + k) % need];
        end -= kept;
        if (total > kept || (end == 0 && pa > 0)) {
            *more = 1;
            break;
        }
        if (pa == 0 || end == 0)
            break;
        pb = pa - 1; /* before the newline */
    }
    free(ring);
    int count = cap - end;
    memmove(lines, lines + end, (size_t)count * sizeof *lines);
    return count;
}

int tui_text_draw(tui_cb *cb, int y, int x, int h, int w, const char *s, size_t n, size_t mark, int *scrollp,
                  int role_a, int role_b)
{
    if (h <= 0 || w <= 0)
        return 0;
    int scroll = *scrollp < 0 ? 0 : *scrollp;
    if ((size_t)scroll > n + 1) /* no text has more lines than bytes (+ 1) */
        scroll = (int)n + 1;
    int cap = h + scroll, more;
    tui_line *l = malloc((size_t)cap * sizeof *l);
    if (!l)
        return 0;
    int count = tui_text_wrap(s, n, w, l, cap, &more);
    int first = count > h + scroll ? count - h - scroll : 0;
    if (count < cap) { /* the top was reached: show from it */
        first = 0;
        scroll = count > h ? count - h : 0;
    }
    *scrollp = scroll;
    int below = first + h < count;
    for (int i = 0; i < h && first + i < count; i++) {
        const tui_line *li = &l[first + i];
        size_t a = li->off, b = li->off + li->len;
        int col = 0;
        if (a < mark) {
            size_t e = b < mark ? b : mark;
            col = tui_cb_textn(cb, y + i, x, w, s + a, e - a, role_a, 0);
            a = e;
        }
        if (a < b)
            tui_cb_textn(cb, y + i, x + col, w - col, s + a, b - a, role_b, 0);
    }
    free(l);
    return below;
}
