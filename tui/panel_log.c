/* panel_log.c - the log (runtime news, notices, warnings, errors, the commands typed and their output), newest at
 * the bottom, following unless scrolled up (by entries); an entry wider than the panel goes on in the rows under
 * it, indented, so nothing at its end is lost. */
#include <stdio.h>
#include <string.h>

#include "panels.h"
#include "widgets.h"

static int level_role(int level)
{
    switch (level) {
    case TUI_LOG_NOTICE: return R_DIM;
    case TUI_LOG_WARN: return R_WARN;
    case TUI_LOG_ERROR: return R_ERR;
    case TUI_LOG_CMD: return R_PROMPT;
    default: return R_TEXT;
    }
}

#define WRAP_MAX 64 /* rows of one entry at most (the last ones shown) */

/* The rows of an entry at width w: one when it fits, else its words wrapped at w - 2 (the rows after the first
 * are indented by 2); lines[] gets them when not NULL. */
static int entry_rows(const char *t, int w, tui_line *lines)
{
    tui_line tmp[WRAP_MAX];
    int more;
    if (w < 12 || tui_strwidth(t) <= w)
        return 1;
    int k = tui_text_wrap(t, strlen(t), w - 2, lines ? lines : tmp, WRAP_MAX, &more);
    return k > 0 ? k : 1;
}

/* The most the log can be scrolled (entries up from the end): with the entry at the bottom of the view that far
 * up, the entries from the oldest fill the `rows`; there the view shows the oldest at its top. */
static int max_scroll(const tui_state *st, int w, int rows)
{
    int n = st->log_n, used = 0, i = 0;
    for (; i < n && used < rows; i++) {
        const tui_logline *l = tui_state_log(st, i);
        used += entry_rows(l->text ? l->text : "", w, NULL);
    }
    return n - i > 0 ? n - i : 0;
}

/* Draws entry i with its first row at y (rows outside [1, h) left out); returns its rows. */
static int draw_entry(tui_cb *cb, const tui_state *st, int i, int y)
{
    const tui_logline *l = tui_state_log(st, i);
    const char *t = l->text ? l->text : "";
    int role = level_role(l->level), flags = l->level == TUI_LOG_CMD ? TUI_BOLD : 0;
    tui_line lines[WRAP_MAX];
    int nl = entry_rows(t, cb->w, lines);
    for (int r = 0; r < nl; r++, y++) {
        if (y < 1 || y >= cb->h)
            continue;
        if (nl == 1)
            tui_cb_text(cb, y, 0, cb->w, t, role, flags);
        else
            tui_cb_textn(cb, y, r ? 2 : 0, cb->w - (r ? 2 : 0), t + lines[r].off, lines[r].len, role, flags);
    }
    return nl;
}

void tui_draw_log(tui_cb *cb, const tui_state *st, tui_view *v, int focused)
{
    char right[96] = "";
    int n = st->log_n, rows = cb->h - 1, top = 0;
    if (v->log_scroll > 0) { /* clamped where the oldest entry is at the top (only when scrolled: the cost) */
        int most = max_scroll(st, cb->w, rows);
        top = v->log_scroll >= most;
        v->log_scroll = top ? most : v->log_scroll;
    }
    if (v->log_scroll < 0)
        v->log_scroll = 0;
    size_t k = 0;
    if (st->log_dropped)
        k += (size_t)snprintf(right + k, sizeof right - k, "%ld dropped  ", st->log_dropped);
    if (v->log_scroll)
        snprintf(right + k, sizeof right - k, "scrolled %d (End follows)", v->log_scroll);
    tui_draw_title(cb, 5, "Log", focused, right);
    if (top) { /* at the top: the oldest entries from the first row down */
        for (int i = 0, y = 1; i < n && y < cb->h; i++)
            y += draw_entry(cb, st, i, y);
        return;
    }
    /* from the bottom up: the newest entry shown last, each wrapped to the width */
    for (int i = n - 1 - v->log_scroll, y = cb->h; i >= 0 && y > 1; i--) {
        const tui_logline *l = tui_state_log(st, i);
        y -= entry_rows(l->text ? l->text : "", cb->w, NULL);
        draw_entry(cb, st, i, y);
    }
}
