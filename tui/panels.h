/* panels.h - each panel draws the UI state (state.h) into its own cell grid, sized to its rectangle: a title row
 * (number, name, focus mark, what it shows on the right), then its content. The chrome (header row, command
 * row, status row, help overlay, confirm box, "terminal too small") draws the same way. No curses here. */
#ifndef SEPAL_TUI_PANELS_H
#define SEPAL_TUI_PANELS_H

#include "cellbuf.h"
#include "keys.h"
#include "layout.h"
#include "state.h"
#include "widgets.h"

/* Swarm table columns (sort keys). */
enum { TUI_COL_STATE, TUI_COL_ID, TUI_COL_NAME, TUI_COL_TPUT, TUI_COL_INF, TUI_COL_FWD, TUI_COL_NET, TUI_COL_PREC,
       TUI_COL_CACHE, TUI_COL_PING, TUI_COL_VERSION, TUI_COL_SPAN, TUI_NCOLS };

/* What the user chose to see: focus, zoom, sorting, selection and scrolling (kept across frames). */
typedef struct tui_view {
    int focus, zoom;            /* panels; zoom -1: none */
    int sort_col, sort_desc;    /* swarm */
    int swarm_sel, swarm_top;   /* selected row and first row shown */
    int log_scroll, gen_scroll; /* lines up from the end; 0 follows */
    int train_series;           /* 0 loss, 1 validation metric */
    int train_logy;             /* loss on a log axis */
    int paused;
    tui_plot_scale loss_scale, val_scale;
} tui_view;

void tui_view_init(tui_view *v);

/* What the keys and the mouse do to the view (view.c; no curses): focus (next, previous, 1-5), zoom, scrolling
 * and selection in the focused panel (a page: its height less 3), sorting, the training's series and log axis.
 * Returns what to redraw (TUI_D_*); 0 for an action that is not the view's (quit, help, the : line ...). */
unsigned tui_view_apply(tui_view *v, const tui_state *st, const tui_layout *l, tui_action a);

/* A mouse event, as the loop gets it from curses. */
enum { TUI_MOUSE_NONE, TUI_MOUSE_CLICK, TUI_MOUSE_WHEEL_UP, TUI_MOUSE_WHEEL_DOWN };
/* What it does on screen l: a click on a panel, or on its tab in the header, focuses it (TUI_A_FOCUS1 + panel);
 * the wheel scrolls the focused panel a line (TUI_A_UP / TUI_A_DOWN; the loop takes 3); anything else, and any
 * event on a screen too small, nothing. */
tui_action tui_mouse_action(const tui_layout *l, const tui_view *v, int kind, int y, int x);
#define TUI_WHEEL_LINES 3

/* The swarm's rows in display order (sorted as the view says, stable); order[] gets snapshot indices. Returns
 * the count. */
int tui_swarm_order(const tui_swarm *s, int sort_col, int desc, int *order, int cap);
const char *tui_col_name(int col);

/* panel_swarm.c: a server's colour (its state's; a busy one's the warning colour), for the panels that name it. */
int tui_server_role(const tui_server *s);
void tui_draw_swarm(tui_cb *cb, const tui_state *st, tui_view *v, int focused);
void tui_draw_route(tui_cb *cb, const tui_state *st, tui_view *v, int focused);
void tui_draw_gen(tui_cb *cb, const tui_state *st, tui_view *v, int focused);
void tui_draw_train(tui_cb *cb, const tui_state *st, tui_view *v, int focused);
void tui_draw_log(tui_cb *cb, const tui_state *st, tui_view *v, int focused);

/* A panel's title row: "─1 Swarm ──── right ─" (focused: marked and bold; chrome.c). */
void tui_draw_title(tui_cb *cb, int num, const char *name, int focused, const char *right);

/* The header row: program, model, blocks, servers, coverage, speed, training; in the tabs tier the tabs. */
void tui_draw_header(tui_cb *cb, const tui_state *st, const tui_view *v, int tabs);
/* The panel whose tab the header shows at column x (tabs tier, or a zoomed panel) of a cols-wide screen, or -1. */
int tui_tab_at(int cols, int x);
/* The status row: mode, then the UI's message, the command running, the last error, or how the last command
 * ended, naming it ("stopped by Ctrl-C: generate ..."; before any: the focused panel), and key hints; asking
 * whether to quit, the choices, in the longest form that fits, and the command running; test mode adds the
 * frame number. */
typedef struct tui_status_info {
    const char *mode;     /* "NORMAL", "COMMAND", "HELP", "QUIT?" */
    const char *flash;    /* a message of the UI itself ("press Ctrl-C again to quit"), or NULL */
    long frame;           /* >= 0: shown as f=N (test mode) */
    int ascii_note;       /* say once that the locale is not UTF-8 */
    int confirm;          /* the quit question is asked: its choices take the row */
} tui_status_info;
void tui_draw_status(tui_cb *cb, const tui_state *st, const tui_view *v, const tui_status_info *si);
/* The command row when no command is being typed: the commands queued (the first of them, how many more, and
 * that Ctrl-C clears them), progress bars, else a hint. */
void tui_draw_cmdrow(tui_cb *cb, const tui_state *st);
/* "terminal too small (40x10 needed)" in the middle of cb. */
void tui_draw_too_small(tui_cb *cb, int rows, int cols);
/* A box with a title and lines of text, centred in cb (help, confirm); first: the first line shown (paging).
 * Returns where it is. */
tui_rect tui_draw_box(tui_cb *cb, const char *title, const char *const *lines, int n, int first, const char *footer);
/* The quit question while a command runs: what runs, whether to quit, and the choices, wrapped to fit cb (the
 * command, then the blank line, left out where it would not fit), centred. Returns where it is. */
tui_rect tui_draw_confirm(tui_cb *cb, const char *running);

/* "1.2 ms", "850 us", "3.1 s", "-" */
void tui_fmt_secs(double s, char *buf, size_t cap);
/* "1.2k", "12", "3.4M" */
void tui_fmt_count(double v, char *buf, size_t cap);

#endif
