/* panel_log.c - the log (runtime news, notices, warnings, errors, the commands typed and their output), newest at
 * the bottom, following unless scrolled up. */
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

void tui_draw_log(tui_cb *cb, const tui_state *st, tui_view *v, int focused)
{
    char right[96] = "";
    int n = st->log_n, rows = cb->h - 1;
    if (v->log_scroll > n - rows)
        v->log_scroll = n - rows > 0 ? n - rows : 0;
    if (v->log_scroll < 0)
        v->log_scroll = 0;
    size_t k = 0;
    if (st->log_dropped)
        k += (size_t)snprintf(right + k, sizeof right - k, "%ld dropped  ", st->log_dropped);
    if (v->log_scroll)
        snprintf(right + k, sizeof right - k, "scrolled %d (End follows)", v->log_scroll);
    tui_draw_title(cb, 5, "Log", focused, right);
    if (rows < 1)
        return;
    int first = n - rows - v->log_scroll;
    if (first < 0)
        first = 0;
    for (int r = 0; r < rows && first + r < n; r++) {
        const tui_logline *l = tui_state_log(st, first + r);
        int role = level_role(l->level);
        tui_cb_text(cb, 1 + r, 0, cb->w, l->text ? l->text : "", role, l->level == TUI_LOG_CMD ? TUI_BOLD : 0);
    }
}
