/* layout.c - terminal size -> panel rectangles (see layout.h for the tiers). */
#include "layout.h"

#include <string.h>

static const int MIN_ROWS[TUI_NPANELS] = {5, 3, 5, 6, 3};
static const int MIN_COLS[TUI_NPANELS] = {30, 30, 20, 24, 30};

int tui_panel_min_rows(int p) { return p >= 0 && p < TUI_NPANELS ? MIN_ROWS[p] : 0; }
int tui_panel_min_cols(int p) { return p >= 0 && p < TUI_NPANELS ? MIN_COLS[p] : 0; }

static int clamp(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

static tui_rect rect(int y, int x, int h, int w) { return (tui_rect){.y = y, .x = x, .h = h, .w = w}; }

/* Every panel: header, swarm, route, generation | training, log, command row, status row. */
static void full(int rows, int cols, int swarm_rows, tui_layout *l)
{
    int body = rows - 3, y = 1;
    int log_h = clamp(body / 5, 4, 14);
    int route_h = body >= 40 ? 5 : body >= 30 ? 4 : 3;
    int rest = body - log_h - route_h;             /* swarm + the generation/training row */
    int gt_min = body >= 30 ? 10 : 8;
    int swarm_max = rest - gt_min;                 /* >= 6 at 80x24 */
    int swarm_h = clamp(swarm_rows + 3, MIN_ROWS[TUI_P_SWARM], swarm_max); /* title, coverage, column heads */
    int gt_h = rest - swarm_h;
    l->panel[TUI_P_SWARM] = rect(y, 0, swarm_h, cols);
    y += swarm_h;
    l->panel[TUI_P_ROUTE] = rect(y, 0, route_h, cols);
    y += route_h;
    int gen_w = cols >= 160 ? (cols - 1) * 2 / 5 : (cols - 1) / 2;
    l->panel[TUI_P_GEN] = rect(y, 0, gt_h, gen_w);
    l->vdiv = rect(y, gen_w, gt_h, 1);
    l->panel[TUI_P_TRAIN] = rect(y, gen_w + 1, gt_h, cols - gen_w - 1);
    y += gt_h;
    l->panel[TUI_P_LOG] = rect(y, 0, log_h, cols);
}

void tui_layout_compute(int rows, int cols, const tui_layout_opts *o, tui_layout *l)
{
    memset(l, 0, sizeof *l);
    l->rows = rows > 0 ? rows : 0;
    l->cols = cols > 0 ? cols : 0;
    if (rows < TUI_MIN_ROWS || cols < TUI_MIN_COLS) {
        l->tier = TUI_TIER_SMALL;
        if (rows >= 1 && cols >= 1) {
            l->status = rect(rows - 1, 0, 1, cols);
            l->message = rect(0, 0, rows - 1, cols);
        }
        return;
    }
    l->header = rect(0, 0, 1, cols);
    l->cmd = rect(rows - 2, 0, 1, cols);
    l->status = rect(rows - 1, 0, 1, cols);
    int zoom = o && o->zoom >= 0 && o->zoom < TUI_NPANELS ? o->zoom : -1;
    if (zoom < 0 && rows >= TUI_FULL_ROWS && cols >= TUI_FULL_COLS) {
        l->tier = TUI_TIER_FULL;
        full(rows, cols, o ? o->swarm_rows : 0, l);
        return;
    }
    l->tier = zoom >= 0 && rows >= TUI_FULL_ROWS && cols >= TUI_FULL_COLS ? TUI_TIER_FULL : TUI_TIER_TABS;
    int p = zoom >= 0 ? zoom : o && o->focus >= 0 && o->focus < TUI_NPANELS ? o->focus : TUI_P_SWARM;
    l->panel[p] = rect(1, 0, rows - 3, cols);
}
