/* layout.h - the screen's geometry as a pure function of its size and a few choices (zoom, focus, how many
 * server rows the swarm would like). No curses and no data: the tests sweep it over every size.
 *
 * Tiers:
 *   >= 80x24        every panel: a header row, the swarm (coverage + servers), the route, generation and
 *                   training side by side, the log, the command row and the status row;
 *   >= 40x10        one panel at a time (the focused one), with tabs 1-5 in the header row;
 *   smaller         "terminal too small": only the status row and a message; the keys still work.
 * Zoom shows the zoomed panel alone at any size from 40x10. */
#ifndef SEPAL_TUI_LAYOUT_H
#define SEPAL_TUI_LAYOUT_H

enum { TUI_P_SWARM, TUI_P_ROUTE, TUI_P_GEN, TUI_P_TRAIN, TUI_P_LOG, TUI_NPANELS };
enum { TUI_TIER_SMALL, TUI_TIER_TABS, TUI_TIER_FULL };

#define TUI_MIN_COLS 40
#define TUI_MIN_ROWS 10
#define TUI_FULL_COLS 80
#define TUI_FULL_ROWS 24

typedef struct tui_rect {
    int y, x, h, w;
} tui_rect;

typedef struct tui_layout_opts {
    int zoom;       /* a panel shown alone, or -1 */
    int focus;      /* the focused panel (shown alone in the tabs tier) */
    int swarm_rows; /* server rows the swarm panel would like to show */
} tui_layout_opts;

typedef struct tui_layout {
    int tier, rows, cols;
    tui_rect header, cmd, status;    /* one row each (header and cmd empty when too small) */
    tui_rect panel[TUI_NPANELS];     /* h == 0: not shown; a panel's first row is its title */
    tui_rect vdiv;                   /* the vertical line between generation and training (h == 0: none) */
    tui_rect message;                /* too small: where the notice goes */
} tui_layout;

/* Minimum rows / columns of a shown panel (title included). */
int tui_panel_min_rows(int panel);
int tui_panel_min_cols(int panel);

void tui_layout_compute(int rows, int cols, const tui_layout_opts *o, tui_layout *out);

#endif
