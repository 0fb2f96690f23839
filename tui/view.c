/* view.c - what the keys and the mouse do to the view (focus, zoom, scrolling, sorting), without curses: the loop
 * in tui.c turns keys and mouse events into actions, and the tests call these directly. */
#include <string.h>

#include "panels.h"

static int shown_panel(const tui_view *v) { return v->zoom >= 0 ? v->zoom : v->focus; }

static int page_rows(const tui_layout *l, int p)
{
    int h = l ? l->panel[p].h - 3 : 1;
    return h > 1 ? h : 1;
}

static unsigned scroll(tui_view *v, const tui_state *st, const tui_layout *l, tui_action a)
{
    int p = shown_panel(v), page = page_rows(l, p);
    int *sc = p == TUI_P_LOG ? &v->log_scroll : p == TUI_P_GEN ? &v->gen_scroll : NULL;
    if (p == TUI_P_SWARM) {
        int n = st && st->swarm ? st->swarm->n : 0, *s = &v->swarm_sel;
        *s += a == TUI_A_UP ? -1 : a == TUI_A_DOWN ? 1 : a == TUI_A_PGUP ? -page : a == TUI_A_PGDN ? page : 0;
        if (a == TUI_A_HOME)
            *s = 0;
        if (a == TUI_A_END)
            *s = n - 1;
        *s = *s >= n ? n - 1 : *s;
        *s = *s < 0 ? 0 : *s;
    } else if (sc) {
        *sc += a == TUI_A_UP ? 1 : a == TUI_A_DOWN ? -1 : a == TUI_A_PGUP ? page : a == TUI_A_PGDN ? -page : 0;
        if (a == TUI_A_HOME)
            *sc = 1 << 20; /* clamped when drawn */
        if (a == TUI_A_END)
            *sc = 0;
        *sc = *sc < 0 ? 0 : *sc;
    }
    return TUI_D_PANEL(p);
}

unsigned tui_view_apply(tui_view *v, const tui_state *st, const tui_layout *l, tui_action a)
{
    switch (a) {
    case TUI_A_FOCUS_NEXT:
    case TUI_A_FOCUS_PREV:
        v->focus = (v->focus + (a == TUI_A_FOCUS_NEXT ? 1 : TUI_NPANELS - 1)) % TUI_NPANELS;
        if (v->zoom >= 0)
            v->zoom = v->focus;
        return TUI_D_ALL;
    case TUI_A_FOCUS1:
    case TUI_A_FOCUS2:
    case TUI_A_FOCUS3:
    case TUI_A_FOCUS4:
    case TUI_A_FOCUS5:
        v->focus = (int)(a - TUI_A_FOCUS1);
        if (v->zoom >= 0)
            v->zoom = v->focus;
        return TUI_D_ALL;
    case TUI_A_ZOOM: v->zoom = v->zoom >= 0 ? -1 : v->focus; return TUI_D_ALL;
    case TUI_A_UP:
    case TUI_A_DOWN:
    case TUI_A_PGUP:
    case TUI_A_PGDN:
    case TUI_A_HOME:
    case TUI_A_END: return scroll(v, st, l, a);
    case TUI_A_SORT: v->sort_col = (v->sort_col + 1) % TUI_NCOLS; return TUI_D_PANEL(TUI_P_SWARM);
    case TUI_A_SORT_REV: v->sort_desc = !v->sort_desc; return TUI_D_PANEL(TUI_P_SWARM);
    case TUI_A_SERIES: v->train_series = !v->train_series; return TUI_D_PANEL(TUI_P_TRAIN);
    case TUI_A_LOGY:
        v->train_logy = !v->train_logy;
        v->loss_scale.valid = 0;
        return TUI_D_PANEL(TUI_P_TRAIN);
    default: return 0;
    }
}

tui_action tui_mouse_action(const tui_layout *l, const tui_view *v, int kind, int y, int x)
{
    if (!l || l->tier == TUI_TIER_SMALL || y < 0 || x < 0 || y >= l->rows || x >= l->cols)
        return TUI_A_NONE;
    if (kind == TUI_MOUSE_WHEEL_UP)
        return TUI_A_UP;
    if (kind == TUI_MOUSE_WHEEL_DOWN)
        return TUI_A_DOWN;
    if (kind != TUI_MOUSE_CLICK)
        return TUI_A_NONE;
    if (y == l->header.y && l->header.h && (l->tier == TUI_TIER_TABS || v->zoom >= 0)) {
        int p = tui_tab_at(l->cols, x);
        return p >= 0 ? (tui_action)(TUI_A_FOCUS1 + p) : TUI_A_NONE;
    }
    for (int p = 0; p < TUI_NPANELS; p++) {
        const tui_rect *r = &l->panel[p];
        if (r->h && y >= r->y && y < r->y + r->h && x >= r->x && x < r->x + r->w)
            return (tui_action)(TUI_A_FOCUS1 + p);
    }
    return TUI_A_NONE;
}
