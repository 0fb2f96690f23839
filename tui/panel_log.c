/* panel_log.c - the log (runtime news, notices, warnings, errors, the commands typed and their output), newest at
 * the bottom, following unless scrolled up; and the title rows of every panel. */
#include <stdio.h>
#include <string.h>

#include "panels.h"
#include "widgets.h"

void tui_draw_title(tui_cb *cb, int num, const char *name, int focused, const char *right)
{
    const tui_glyphs *g = tui_cb_glyphs(cb);
    if (cb->h < 1)
        return;
    tui_cb_fill(cb, 0, 0, 1, cb->w, g->h, R_BORDER, 0);
    char t[64];
    int role = focused ? R_TITLE_FOCUS : R_TITLE;
    int x = 0;
    if (focused)
        tui_cb_put(cb, 0, x, g->arrow, role, TUI_BOLD);
    x = 1;
    snprintf(t, sizeof t, " %d %s ", num, name);
    x += tui_cb_text(cb, 0, x, cb->w - x, t, role, focused ? TUI_BOLD | TUI_REV : TUI_BOLD);
    if (right && *right) {
        char r[160];
        snprintf(r, sizeof r, " %s ", right);
        int rw = tui_strwidth(r);
        if (x + 2 + rw < cb->w)
            tui_cb_text(cb, 0, cb->w - 1 - rw, rw, r, R_DIM, 0);
    }
}

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

void tui_draw_panel(int panel, tui_cb *cb, const tui_state *st, tui_view *v, int focused)
{
    switch (panel) {
    case TUI_P_SWARM: tui_draw_swarm(cb, st, v, focused); break;
    case TUI_P_ROUTE: tui_draw_route(cb, st, v, focused); break;
    case TUI_P_GEN: tui_draw_gen(cb, st, v, focused); break;
    case TUI_P_TRAIN: tui_draw_train(cb, st, v, focused); break;
    case TUI_P_LOG: tui_draw_log(cb, st, v, focused); break;
    default: break;
    }
}
