/* test_tui.c - the TUI without a terminal: the layout over every size from 40x10 to 300x100 (and below: too
 * small), the widgets drawn into cell grids and read back as strings in both glyph sets (span and coverage bars,
 * nice and log ticks, plots with min-max bucketing and a hysteresis scale, progress bars, sparklines, table
 * columns and stable sorting, word-wrapped text with wide characters and invalid UTF-8), the `:` line (editing,
 * completion, history), the key table and its generated help, the event queue (coalescing, streams, dropped
 * logs, one eventfd write per empty->non-empty edge), events as JSON lines, the UI state built from events,
 * whole panels, rows of figures fitted to narrow widths, the validation curve's plot, a re-route in the route
 * panel, the mouse (event -> action -> view), and issue 22's edges: the status row naming the command Ctrl-C
 * stopped, the quit question whole at every width, the queue under the panels, long log lines wrapped, and the
 * Train panel before its first step. */
#include <locale.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmdline.h"
#include "events.h"
#include "keys.h"
#include "layout.h"
#include "panels.h"
#include "state.h"
#include "testutil.h"
#include "widgets.h"

static char row_buf[4096];

/* Row y of cb as UTF-8 (a static buffer). */
static const char *row(const tui_cb *cb, int y)
{
    tui_cb_row(cb, y, row_buf, sizeof row_buf);
    return row_buf;
}

static tui_cb grid(int h, int w, int utf8)
{
    tui_cb cb = {.utf8 = utf8};
    ck_assert_int_eq(tui_cb_resize(&cb, h, w), 0);
    return cb;
}

/* ---------------------------------------------------------------------------------------------- */
/* layout */

static int overlap(const tui_rect *a, const tui_rect *b)
{
    if (!a->h || !a->w || !b->h || !b->w)
        return 0;
    return a->y < b->y + b->h && b->y < a->y + a->h && a->x < b->x + b->w && b->x < a->x + a->w;
}

static void check_layout(int rows, int cols, const tui_layout_opts *o)
{
    tui_layout l;
    tui_layout_compute(rows, cols, o, &l);
    if (rows < TUI_MIN_ROWS || cols < TUI_MIN_COLS) {
        ck_assert_int_eq(l.tier, TUI_TIER_SMALL);
        for (int p = 0; p < TUI_NPANELS; p++)
            ck_assert_int_eq(l.panel[p].h, 0);
        if (rows >= 1 && cols >= 1) {
            ck_assert_int_eq(l.status.y, rows - 1);
            ck_assert_int_eq(l.message.h, rows - 1);
        }
        return;
    }
    ck_assert_msg(l.tier != TUI_TIER_SMALL, "%dx%d", cols, rows);
    ck_assert_int_eq(l.status.y, rows - 1);
    ck_assert_int_eq(l.status.w, cols);
    ck_assert_int_eq(l.cmd.y, rows - 2);
    ck_assert_int_eq(l.header.y, 0);
    tui_rect all[TUI_NPANELS + 1];
    int n = 0, shown = 0;
    for (int p = 0; p < TUI_NPANELS; p++) {
        const tui_rect *r = &l.panel[p];
        if (!r->h)
            continue;
        shown++;
        ck_assert_msg(r->y >= 1 && r->x >= 0 && r->y + r->h <= rows - 2 && r->x + r->w <= cols,
                      "%dx%d panel %d at %d,%d %dx%d", cols, rows, p, r->x, r->y, r->w, r->h);
        ck_assert_msg(r->h >= tui_panel_min_rows(p) && r->w >= tui_panel_min_cols(p), "%dx%d panel %d is %dx%d",
                      cols, rows, p, r->w, r->h);
        all[n++] = *r;
    }
    if (l.vdiv.h)
        all[n++] = l.vdiv;
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            ck_assert_msg(!overlap(&all[i], &all[j]), "%dx%d: rects %d and %d overlap", cols, rows, i, j);
    int zoom = o->zoom;
    if (zoom >= 0) {
        ck_assert_int_eq(shown, 1);
        ck_assert_int_gt(l.panel[zoom].h, 0);
    } else if (rows >= TUI_FULL_ROWS && cols >= TUI_FULL_COLS) {
        ck_assert_int_eq(l.tier, TUI_TIER_FULL);
        ck_assert_int_eq(shown, TUI_NPANELS);
    } else {
        ck_assert_int_eq(l.tier, TUI_TIER_TABS);
        ck_assert_int_eq(shown, 1);
        ck_assert_int_gt(l.panel[o->focus].h, 0);
    }
}

START_TEST(t_layout_sweep)
{
    for (int rows = 1; rows <= 100; rows++)
        for (int cols = 1; cols <= 300; cols++) {
            int focus = (rows + cols) % TUI_NPANELS;
            for (int z = -1; z < TUI_NPANELS; z++) { /* every zoom, a few servers */
                tui_layout_opts o = {.zoom = z, .focus = focus, .swarm_rows = 3};
                check_layout(rows, cols, &o);
            }
            for (int sr = 0; sr <= 40; sr += 40) { /* no servers, many */
                tui_layout_opts o = {.zoom = -1, .focus = focus, .swarm_rows = sr};
                check_layout(rows, cols, &o);
            }
        }
}
END_TEST

START_TEST(t_layout_80x24)
{
    tui_layout l;
    tui_layout_opts o = {.zoom = -1, .focus = 0, .swarm_rows = 3};
    tui_layout_compute(24, 80, &o, &l);
    ck_assert_int_eq(l.tier, TUI_TIER_FULL);
    ck_assert_int_ge(l.panel[TUI_P_SWARM].h, 6); /* title, coverage, heads and the 3 servers */
    ck_assert_int_eq(l.panel[TUI_P_GEN].y, l.panel[TUI_P_TRAIN].y); /* side by side */
    ck_assert_int_ge(l.panel[TUI_P_TRAIN].h, 8);                   /* room for a plot */
    ck_assert_int_eq(l.panel[TUI_P_GEN].w + 1 + l.panel[TUI_P_TRAIN].w, 80);
    /* many servers: the swarm grows, but generation and training keep their rows */
    o.swarm_rows = 100;
    tui_layout_compute(24, 80, &o, &l);
    ck_assert_int_ge(l.panel[TUI_P_GEN].h, 8);
    tui_layout_compute(100, 300, &o, &l);
    ck_assert_int_gt(l.panel[TUI_P_SWARM].h, 40);
    /* 79 columns: one panel at a time */
    tui_layout_compute(24, 79, &o, &l);
    ck_assert_int_eq(l.tier, TUI_TIER_TABS);
    tui_layout_compute(9, 80, &o, &l);
    ck_assert_int_eq(l.tier, TUI_TIER_SMALL);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* the cell grid */

START_TEST(t_cellbuf_text)
{
    tui_cb cb = grid(3, 10, 1);
    ck_assert_int_eq(tui_cb_text(&cb, 0, 0, 10, "héllo wörld!", R_TEXT, 0), 10); /* clipped at the width */
    ck_assert_str_eq(row(&cb, 0), "héllo wörl");
    ck_assert_int_eq(tui_cb_text(&cb, 1, 0, 10, "日本x", R_TEXT, 0), 5); /* wide characters take two cells */
    ck_assert_str_eq(row(&cb, 1), "日本x     ");
    ck_assert_int_eq(cb.c[1 * 10 + 1].ch, 0); /* the right half */
    tui_cb_text(&cb, 2, 0, 10, "a\xff" "b\xe2\x82" "c\td", R_TEXT, 0); /* invalid bytes, a tab */
    ck_assert_str_eq(row(&cb, 2), "a\xef\xbf\xbd" "b\xef\xbf\xbd" "c d   ");
    tui_cb_text(&cb, 1, 1, 1, "z", R_TEXT, 0); /* over half of a wide char: the other half is blanked */
    ck_assert_str_eq(row(&cb, 1), " z本x     ");
    tui_cb_text(&cb, 0, 9, 5, "日", R_TEXT, 0); /* no room for a wide char in the last column */
    ck_assert_str_eq(row(&cb, 0), "héllo wörl");
    tui_cb_free(&cb);
    tui_cb a = grid(1, 8, 0); /* ASCII mode: nothing outside ASCII reaches the terminal */
    tui_cb_text(&a, 0, 0, 8, "héllo→", R_TEXT, 0);
    ck_assert_str_eq(row(&a, 0), "h?llo?  ");
    tui_cb_put(&a, 0, 7, 0x2588, R_TEXT, 0);
    ck_assert_str_eq(row(&a, 0), "h?llo? ?");
    tui_cb_free(&a);
    ck_assert_int_eq(tui_strwidth("日本 ok"), 7);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* bars */

START_TEST(t_spanbar)
{
    tui_cb cb = grid(4, 16, 1);
    tui_spanbar(&cb, 0, 0, 16, 0, 10, 32, R_ONLINE);
    ck_assert_str_eq(row(&cb, 0), "█████···········");
    tui_spanbar(&cb, 1, 0, 16, 31, 32, 32, R_ONLINE);
    ck_assert_str_eq(row(&cb, 1), "···············▐");
    tui_spanbar(&cb, 2, 0, 16, 0, 32, 32, R_ONLINE);
    ck_assert_str_eq(row(&cb, 2), "████████████████");
    tui_spanbar(&cb, 3, 0, 16, 2, 4, 6, R_ONLINE); /* fewer blocks than cells: partial cells at both ends */
    ck_assert_str_eq(row(&cb, 3), "·····▐████▌·····");
    ck_assert_int_eq(cb.c[3 * 16 + 6].role, R_ONLINE);
    ck_assert_int_eq(cb.c[3 * 16 + 0].role, R_BAR_EMPTY);
    tui_cb_free(&cb);
    tui_cb a = grid(2, 16, 0);
    tui_spanbar(&a, 0, 0, 16, 0, 10, 32, R_ONLINE);
    ck_assert_str_eq(row(&a, 0), "#####...........");
    tui_spanbar(&a, 1, 0, 16, 2, 4, 6, R_ONLINE);
    ck_assert_str_eq(row(&a, 1), ".....+####+.....");
    tui_cb_free(&a);
}
END_TEST

START_TEST(t_coverage)
{
    tui_cb cb = grid(2, 8, 1);
    int counts[4] = {1, 1, 0, 12};
    tui_coverage(&cb, 0, 0, 4, counts, 4);
    ck_assert_str_eq(row(&cb, 0), "11!+    ");
    ck_assert_int_eq(cb.c[2].role, R_ERR);
    int many[16] = {2, 2, 2, 2, 2, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3};
    tui_coverage(&cb, 1, 0, 8, many, 16); /* each cell the fewest of its two blocks */
    ck_assert_str_eq(row(&cb, 1), "22122223");
    tui_cb_free(&cb);
}
END_TEST

START_TEST(t_progress_and_spark)
{
    tui_cb cb = grid(4, 12, 1);
    tui_progress(&cb, 0, 0, 12, 0, R_BAR);
    ck_assert_str_eq(row(&cb, 0), "[          ]");
    tui_progress(&cb, 1, 0, 12, 0.54, R_BAR);
    ck_assert_str_eq(row(&cb, 1), "[█████▍    ]");
    tui_progress(&cb, 2, 0, 12, 1, R_BAR);
    ck_assert_str_eq(row(&cb, 2), "[██████████]");
    double v[5] = {0, 1, 2, 4, 8};
    tui_spark(&cb, 3, 0, 12, v, 5, R_PLOT);
    ck_assert_str_eq(row(&cb, 3), " ▂▃▅█       "); /* levels of 1/8, 2/8, 4/8, 8/8 of 8 */
    tui_cb_free(&cb);
    tui_cb a = grid(2, 12, 0);
    tui_progress(&a, 0, 0, 12, 0.54, R_BAR);
    ck_assert_str_eq(row(&a, 0), "[#####     ]");
    tui_progress(&a, 1, 0, 12, 0.56, R_BAR); /* 5.6 cells: the half shows */
    ck_assert_str_eq(row(&a, 1), "[#####+    ]");
    tui_cb_free(&a);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* ticks and plots */

START_TEST(t_ticks)
{
    tui_axis ax;
    ck_assert_int_eq(tui_nice_ticks(0.8, 2.3, 5, &ax), 5);
    ck_assert_double_eq_tol(ax.step, 0.5, 1e-12);
    ck_assert_double_eq_tol(ax.lo, 0.5, 1e-12);
    ck_assert_double_eq_tol(ax.hi, 2.5, 1e-12);
    ck_assert_int_eq(tui_nice_ticks(0.8, 2.3, 4, &ax), 4); /* fewer rows: a bigger step */
    ck_assert_double_eq_tol(ax.step, 1, 1e-12);
    ck_assert_double_eq_tol(ax.lo, 0, 1e-12);
    ck_assert_double_eq_tol(ax.hi, 3, 1e-12);
    tui_nice_ticks(0, 97, 5, &ax); /* 25s: 0 25 50 75 100 */
    ck_assert_double_eq_tol(ax.step, 25, 1e-9);
    ck_assert_int_eq(ax.n, 5);
    tui_nice_ticks(3, 3, 5, &ax); /* a constant series: a range around it */
    ck_assert(ax.lo < 3 && ax.hi > 3);
    tui_nice_ticks(0, 0, 5, &ax);
    ck_assert(ax.lo < 0 && ax.hi > 0);
    for (double lo = 1e-6; lo < 1e6; lo *= 3.7) /* any range: at most max ticks, covering it */
        for (int m = 2; m <= 6; m++) {
            tui_nice_ticks(lo, lo * 2.9, m, &ax);
            ck_assert_int_le(ax.n, m);
            ck_assert_int_ge(ax.n, 2);
            ck_assert(ax.lo <= lo * (1 + 1e-9) && ax.hi >= lo * 2.9 * (1 - 1e-9));
        }
    ck_assert_int_eq(tui_log_ticks(1e-4, 1e-2, 5, &ax), 3); /* 1-2-5 would be 7: decades */
    ck_assert_double_eq_tol(ax.tick[0], 1e-4, 1e-12);
    ck_assert_double_eq_tol(ax.tick[2], 1e-2, 1e-12);
    ck_assert_int_eq(tui_log_ticks(0.8, 2.3, 5, &ax), 4); /* 0.5 1 2 5 */
    ck_assert_double_eq_tol(ax.tick[0], 0.5, 1e-12);
    ck_assert_double_eq_tol(ax.tick[3], 5, 1e-12);
    char b[16];
    tui_tick_label(1e-4, b, sizeof b);
    ck_assert_str_eq(b, "1e-4");
    tui_tick_label(2.5, b, sizeof b);
    ck_assert_str_eq(b, "2.5");
    tui_tick_label(2500000, b, sizeof b);
    ck_assert_str_eq(b, "2.5e6");
    tui_tick_label(0.1 + 0.2 - 0.3, b, sizeof b);
    ck_assert_str_eq(b, "0");
}
END_TEST

/* The cells of rows [y0, y1) of column x holding any plot dot. */
static int plotted(const tui_cb *cb, int y, int x)
{
    uint32_t c = cb->c[y * cb->w + x].ch;
    return (c > 0x2800 && c <= 0x28FF) || c == '.' || c == ':' || c == '\'';
}

START_TEST(t_plot)
{
    double xs[40], ys[40];
    for (int i = 0; i < 40; i++) {
        xs[i] = i + 1;
        ys[i] = 2.3 - 1.5 * i / 39.0; /* falling from 2.3 to 0.8 */
    }
    tui_cb cb = grid(8, 40, 1);
    tui_plot_opts o = {.xunit = "step", .role = R_PLOT};
    tui_plot(&cb, 0, 0, 8, 40, xs, ys, 40, &o, NULL);
    /* gutter: labels right-aligned before the axis; the axis; x labels 1 .. 40 with the unit */
    int ax = -1;
    for (int x = 0; x < 10 && ax < 0; x++)
        if (cb.c[0 * 40 + x].ch == 0x2502)
            ax = x;
    ck_assert_int_gt(ax, 0);
    ck_assert_int_eq(cb.c[6 * 40 + ax].ch, 0x2514); /* └ */
    ck_assert(strstr(row(&cb, 0), "2.5") != NULL);  /* the top tick */
    ck_assert(strstr(row(&cb, 5), "0.5") != NULL);  /* the bottom tick (range 0.5 .. 2.5) */
    ck_assert(strstr(row(&cb, 7), "1") && strstr(row(&cb, 7), "step") && strstr(row(&cb, 7), "40"));
    /* a falling line: the first column's dots are above the last column's */
    int first_top = -1, last_top = -1;
    for (int y = 0; y < 6; y++) {
        if (first_top < 0 && plotted(&cb, y, ax + 1))
            first_top = y;
        if (last_top < 0 && plotted(&cb, y, 39))
            last_top = y;
    }
    ck_assert_int_ge(first_top, 0);
    ck_assert_int_gt(last_top, first_top);
    /* every column between has dots (a line, not points) */
    for (int x = ax + 1; x < 40; x++) {
        int any = 0;
        for (int y = 0; y < 6; y++)
            any |= plotted(&cb, y, x);
        ck_assert_msg(any, "column %d empty", x);
    }
    tui_cb_free(&cb);
    /* min-max bucketing: 1000 points alternating 0 and 1 in a 20-cell plot: each column spans the range */
    static double bx[1000], by[1000];
    for (int i = 0; i < 1000; i++) {
        bx[i] = i;
        by[i] = i % 2;
    }
    tui_cb b2 = grid(6, 30, 1);
    tui_plot(&b2, 0, 0, 6, 30, bx, by, 1000, &o, NULL);
    int ax2 = -1;
    for (int x = 0; x < 10 && ax2 < 0; x++)
        if (b2.c[x].ch == 0x2502)
            ax2 = x;
    for (int x = ax2 + 1; x < 30; x++) { /* the data reach within a tick of the top and bottom of the range */
        int top = -1, bot = -1;
        for (int y = 0; y < 4; y++)
            if (plotted(&b2, y, x)) {
                if (top < 0)
                    top = y;
                bot = y;
            }
        ck_assert_msg(top >= 0 && top <= 1 && bot >= 2, "column %d: %d..%d", x, top, bot);
    }
    tui_cb_free(&b2);
    /* ASCII: the same plot with . : ' and +-| axes */
    tui_cb a = grid(8, 40, 0);
    tui_plot(&a, 0, 0, 8, 40, xs, ys, 40, &o, NULL);
    for (int y = 0; y < 8; y++)
        for (int x = 0; x < 40; x++)
            ck_assert_int_lt(a.c[y * 40 + x].ch, 0x7f);
    ck_assert(strchr(row(&a, 6), '+') && strchr(row(&a, 6), '-'));
    tui_cb_free(&a);
    /* log scale: ticks of 1-2-5 */
    tui_cb l = grid(8, 40, 1);
    o.logy = 1;
    tui_plot(&l, 0, 0, 8, 40, xs, ys, 40, &o, NULL);
    ck_assert(strstr(row(&l, 0), "5") != NULL);
    ck_assert(strstr(row(&l, 5), "0.5") != NULL);
    tui_cb_free(&l);
    /* no data: the axes, no labels, no crash */
    tui_cb e = grid(6, 20, 1);
    o.logy = 0;
    tui_plot(&e, 0, 0, 6, 20, NULL, NULL, 0, &o, NULL);
    tui_cb_free(&e);
}
END_TEST

START_TEST(t_plot_hysteresis)
{
    tui_plot_scale sc = {0};
    tui_plot_opts o = {.role = R_PLOT};
    double xs[2] = {0, 1}, wide[2] = {0, 10}, narrow[2] = {4, 5}, high[2] = {0, 20};
    tui_cb cb = grid(6, 30, 1);
    tui_plot(&cb, 0, 0, 6, 30, xs, wide, 2, &o, &sc);
    double lo = sc.lo, hi = sc.hi;
    for (int i = 0; i < 4; i++) { /* fits in half: the scale holds for 4 updates */
        tui_plot(&cb, 0, 0, 6, 30, xs, narrow, 2, &o, &sc);
        ck_assert_double_eq(sc.lo, lo);
        ck_assert_double_eq(sc.hi, hi);
    }
    tui_plot(&cb, 0, 0, 6, 30, xs, narrow, 2, &o, &sc); /* the 5th: it shrinks */
    ck_assert(sc.hi < hi && sc.lo > lo);
    tui_plot(&cb, 0, 0, 6, 30, xs, high, 2, &o, &sc); /* data outside: it grows at once */
    ck_assert(sc.hi >= 20);
    tui_cb_free(&cb);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* tables */

START_TEST(t_table_widths)
{
    static const tui_col cols[] = {
        {"a", 10, 10, 0, 100}, {"b", 10, 14, 0, 50}, {"c", 10, 10, 1, 20}, {"d", 10, 10, 0, 60}, {"bar", 20, 0, 0, 90},
    };
    int w[5];
    ck_assert_int_eq(sp_cols_fit(cols, 5, 120, w), 5); /* all, b to its max, the bar takes the rest */
    ck_assert_int_eq(w[1], 14);
    ck_assert_int_eq(w[4], 120 - 10 - 14 - 10 - 10 - 4);
    ck_assert_int_eq(sp_cols_fit(cols, 5, 80, w), 5); /* 60 + 4 blanks: all fit at their minimum */
    ck_assert_int_eq(w[2], 10);
    ck_assert_int_eq(sp_cols_fit(cols, 5, 60, w), 4); /* c (priority 20) goes first */
    ck_assert_int_eq(w[2], 0);
    ck_assert_int_eq(sp_cols_fit(cols, 5, 45, w), 3); /* then b */
    ck_assert_int_eq(w[1], 0);
    ck_assert_int_eq(sp_cols_x(w, 5, 3), 11);
    ck_assert_int_eq(sp_cols_x(w, 5, 1), -1);
    ck_assert_int_eq(sp_cols_fit(cols, 5, 5, w), 0);
    /* scrolling keeps the selection in view, moving as little as possible */
    ck_assert_int_eq(tui_table_scroll(0, 0, 5, 20), 0);
    ck_assert_int_eq(tui_table_scroll(7, 0, 5, 20), 3);
    ck_assert_int_eq(tui_table_scroll(4, 3, 5, 20), 3);
    ck_assert_int_eq(tui_table_scroll(2, 3, 5, 20), 2);
    ck_assert_int_eq(tui_table_scroll(19, 0, 5, 20), 15);
    ck_assert_int_eq(tui_table_scroll(3, 10, 5, 4), 0);
}
END_TEST

START_TEST(t_fields)
{
    char buf[128];
    const tui_field f[] = {{"68.5 tok/s", "68.5t/s", 5}, {"first 11.6ms", "1st 11.6ms", 3}, {"stop: length", NULL, 4},
                           {"", NULL, 9}};
    /* room: full forms, two blanks apart (the empty field left out) */
    ck_assert_int_eq(tui_fields_join(f, 4, 80, buf, sizeof buf), 38);
    ck_assert_str_eq(buf, "68.5 tok/s  first 11.6ms  stop: length");
    ck_assert_int_eq(tui_fields_join(f, 4, 38, buf, sizeof buf), 38); /* exactly */
    /* less: compact forms, then one blank */
    ck_assert_int_eq(tui_fields_join(f, 4, 37, buf, sizeof buf), 33);
    ck_assert_str_eq(buf, "68.5t/s  1st 11.6ms  stop: length");
    ck_assert_int_eq(tui_fields_join(f, 4, 31, buf, sizeof buf), 31);
    ck_assert_str_eq(buf, "68.5t/s 1st 11.6ms stop: length");
    /* less: the lowest priority (the first token) goes, the order stays; full forms again when they fit */
    ck_assert_int_eq(tui_fields_join(f, 4, 30, buf, sizeof buf), 24);
    ck_assert_str_eq(buf, "68.5 tok/s  stop: length");
    ck_assert_int_eq(tui_fields_join(f, 4, 12, buf, sizeof buf), 10);
    ck_assert_str_eq(buf, "68.5 tok/s");
    /* one left, too wide: cut to the width when drawn */
    ck_assert_int_eq(tui_fields_join(f, 4, 5, buf, sizeof buf), 5);
    tui_cb cb = grid(1, 5, 1);
    ck_assert_int_eq(tui_fields(&cb, 0, 0, 5, f, 4, R_TEXT), 5);
    ck_assert_str_eq(row(&cb, 0), "68.5t");
    tui_cb_free(&cb);
    /* equal priorities: the later goes first */
    const tui_field g[] = {{"aaaa", NULL, 1}, {"bbbb", NULL, 1}, {"cccc", NULL, 2}};
    ck_assert_int_eq(tui_fields_join(g, 3, 10, buf, sizeof buf), 10);
    ck_assert_str_eq(buf, "aaaa  cccc");
    /* nothing to show */
    const tui_field none[] = {{NULL, NULL, 1}, {"", NULL, 1}};
    ck_assert_int_eq(tui_fields_join(none, 2, 10, buf, sizeof buf), 0);
    ck_assert_str_eq(buf, "");
}
END_TEST

static tui_swarm *three_servers(void)
{
    tui_swarm *s = calloc(1, sizeof *s);
    s->n = 3;
    s->nblocks = 6;
    snprintf(s->model, sizeof s->model, "stories15M");
    s->s = calloc(3, sizeof *s->s);
    const char *ids[3] = {"aaaa1111", "bbbb2222", "cccc3333"};
    for (int i = 0; i < 3; i++) {
        tui_server *v = &s->s[i];
        v->idx = i;
        snprintf(v->id, sizeof v->id, "%s", ids[i]);
        snprintf(v->prec, sizeof v->prec, "f32");
        snprintf(v->version, sizeof v->version, "0.1.0");
        v->start = 2 * i;
        v->end = 2 * i + 2;
        v->tput = 1000; /* equal: sorting by it keeps this order */
        v->cache = 8192;
        v->best_ping = 0.001;
        v->npings = 1;
        v->rtt = 0.0005;
        v->state = TUI_ST_ONLINE;
    }
    return s;
}

START_TEST(t_swarm_sort_stable)
{
    tui_swarm *s = three_servers();
    int order[3];
    tui_swarm_order(s, TUI_COL_TPUT, 0, order, 3);
    ck_assert(order[0] == 0 && order[1] == 1 && order[2] == 2);
    tui_swarm_order(s, TUI_COL_TPUT, 1, order, 3); /* reversed, ties still in snapshot order */
    ck_assert(order[0] == 0 && order[1] == 1 && order[2] == 2);
    s->s[1].tput = 5000;
    tui_swarm_order(s, TUI_COL_TPUT, 1, order, 3);
    ck_assert(order[0] == 1 && order[1] == 0 && order[2] == 2);
    tui_swarm_order(s, TUI_COL_ID, 1, order, 3);
    ck_assert(order[0] == 2 && order[1] == 1 && order[2] == 0);
    tui_swarm_free(s);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* text */

START_TEST(t_text_wrap)
{
    tui_line l[8];
    int more;
    const char *s = "hello world foo";
    int n = tui_text_wrap(s, strlen(s), 10, l, 8, &more);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(more, 0);
    ck_assert_int_eq((int)l[0].len, 6); /* "hello " */
    ck_assert_int_eq((int)l[1].off, 6);
    s = "abcdefghijklmnop"; /* no space: cut at the width */
    n = tui_text_wrap(s, strlen(s), 5, l, 8, &more);
    ck_assert_int_eq(n, 4);
    ck_assert_int_eq((int)l[3].len, 1);
    s = "one\n\ntwo\n"; /* paragraphs; an empty last line after the final newline */
    n = tui_text_wrap(s, strlen(s), 10, l, 8, &more);
    ck_assert_int_eq(n, 4);
    ck_assert_int_eq((int)l[1].len, 0);
    ck_assert_int_eq((int)l[3].len, 0);
    n = tui_text_wrap(s, strlen(s), 10, l, 2, &more); /* only the end */
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(more, 1);
    ck_assert_int_eq((int)l[0].off, 5);
    tui_cb cb = grid(3, 6, 1);
    const char *w = "日本語のテキスト"; /* 16 columns of wide characters in 6: 3 a row */
    int zero = 0, one = 1, far = 1 << 20;
    int below = tui_text_draw(&cb, 0, 0, 3, 6, w, strlen(w), 0, &zero, R_TEXT, R_TEXT);
    ck_assert_int_eq(below, 0);
    ck_assert_str_eq(row(&cb, 0), "日本語");
    ck_assert_str_eq(row(&cb, 1), "のテキ");
    ck_assert_str_eq(row(&cb, 2), "スト  ");
    tui_cb_clear(&cb);
    const char *p = "Prompt: and the rest of it";
    below = tui_text_draw(&cb, 0, 0, 3, 6, p, strlen(p), 7, &one, R_GEN_PROMPT, R_TEXT); /* scrolled up a line */
    ck_assert_int_eq(below, 1);
    ck_assert_int_eq(one, 1);
    tui_cb_clear(&cb);
    tui_text_draw(&cb, 0, 0, 3, 6, p, strlen(p), 7, &far, R_GEN_PROMPT, R_TEXT); /* Home: clamped to the top */
    ck_assert_int_eq(far, 2);
    ck_assert_str_eq(row(&cb, 0), "Prompt");
    tui_cb_free(&cb);
    tui_cb big = grid(4, 20, 1); /* a long text: only its end is wrapped */
    size_t L = 200000;
    char *t = malloc(L + 1);
    for (size_t i = 0; i < L; i++)
        t[i] = i % 7 == 6 ? ' ' : 'a' + (char)(i % 7);
    memcpy(t + L - 4, "END.", 4);
    t[L] = 0;
    tui_text_draw(&big, 0, 0, 4, 20, t, L, 0, &zero, R_TEXT, R_TEXT);
    ck_assert(strstr(row(&big, 3), "END.") != NULL);
    free(t);
    tui_cb_free(&big);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* the `:` line */

static void fake_complete(void *ctx, const char *line, size_t cursor, sp_strlist *out, size_t *ws, int *files)
{
    (void)ctx;
    (void)files;
    static const char *const words[] = {"generate", "servers", "set", "show", "swarm", NULL};
    size_t start = *ws;
    char word[64];
    snprintf(word, sizeof word, "%.*s", (int)(cursor - start), line + start);
    for (int i = 0; words[i]; i++)
        sp_strlist_add(out, words[i], strlen(words[i]), word);
}

static void type(tui_cmdline *c, const char *s)
{
    for (; *s; s++)
        ck_assert_int_eq(tui_cmdline_key(c, TUI_A_NONE, (unsigned char)*s), TUI_CL_CHANGED);
}

START_TEST(t_cmdline)
{
    tui_cmdline c;
    tui_cmdline_init(&c, fake_complete, NULL);
    tui_cmdline_open(&c);
    type(&c, "ge");
    tui_cmdline_key(&c, TUI_A_CMD_COMPLETE, -1); /* unique: completed, with a space */
    ck_assert_str_eq(c.buf, "generate ");
    type(&c, "x");
    ck_assert_int_eq(tui_cmdline_key(&c, TUI_A_CMD_RUN, -1), TUI_CL_RUN);
    ck_assert_str_eq(c.buf, "generate x"); /* what is shown runs */
    tui_cmdline_open(&c);
    type(&c, "s");
    tui_cmdline_key(&c, TUI_A_CMD_COMPLETE, -1); /* ambiguous: the candidates are listed */
    ck_assert_str_eq(c.buf, "s");
    ck_assert(strstr(c.msg, "servers") && strstr(c.msg, "swarm"));
    tui_cmdline_key(&c, TUI_A_CMD_COMPLETE, -1); /* Tab again: the first, then the next */
    ck_assert_str_eq(c.buf, "servers");
    tui_cmdline_key(&c, TUI_A_CMD_COMPLETE, -1);
    ck_assert_str_eq(c.buf, "set");
    tui_cmdline_open(&c);
    type(&c, "se");
    tui_cmdline_key(&c, TUI_A_CMD_COMPLETE, -1); /* servers, set: common prefix "se" = typed: listed */
    ck_assert_str_eq(c.buf, "se");
    tui_cmdline_key(&c, TUI_A_CMD_KILL_BOL, -1);
    type(&c, "g");
    tui_cmdline_key(&c, TUI_A_CMD_COMPLETE, -1);
    tui_cmdline_key(&c, TUI_A_CMD_KILL_WORD, -1);
    ck_assert_str_eq(c.buf, "");
    /* history: Up walks back, Down returns to the line being typed */
    type(&c, "draft");
    tui_cmdline_key(&c, TUI_A_CMD_PREV, -1);
    ck_assert_str_eq(c.buf, "generate x");
    tui_cmdline_key(&c, TUI_A_CMD_NEXT, -1);
    ck_assert_str_eq(c.buf, "draft");
    /* editing: left, insert, delete, a multibyte character */
    tui_cmdline_key(&c, TUI_A_CMD_BOL, -1);
    tui_cmdline_key(&c, TUI_A_CMD_DEL, -1);
    tui_cmdline_key(&c, TUI_A_NONE, 0x00E9); /* é */
    ck_assert_str_eq(c.buf, "éraft");
    tui_cmdline_key(&c, TUI_A_CMD_LEFT, -1);
    tui_cmdline_key(&c, TUI_A_CMD_DEL, -1);
    ck_assert_str_eq(c.buf, "raft");
    tui_cmdline_key(&c, TUI_A_CMD_EOL, -1);
    tui_cmdline_key(&c, TUI_A_CMD_BS, -1);
    ck_assert_str_eq(c.buf, "raf");
    ck_assert_int_eq(tui_cmdline_key(&c, TUI_A_NONE, 7), TUI_CL_NONE); /* control characters are not text */
    ck_assert_int_eq(tui_cmdline_key(&c, TUI_A_CMD_CANCEL, -1), TUI_CL_CANCEL);
    ck_assert_int_eq(c.nhist, 2); /* a cancelled line is kept in the history */
    tui_cmdline_add_history(&c, "raf"); /* not twice */
    ck_assert_int_eq(c.nhist, 2);
    const char *dir = sp_test_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/hist", dir);
    tui_cmdline_save(&c, path);
    tui_cmdline d;
    tui_cmdline_init(&d, NULL, NULL);
    tui_cmdline_load(&d, path);
    ck_assert_int_eq(d.nhist, 2);
    ck_assert_str_eq(d.hist[1], "raf");
    tui_cmdline_open(&d);
    ck_assert_int_eq(tui_cmdline_key(&d, TUI_A_CMD_BS, -1), TUI_CL_CANCEL); /* backspace on nothing leaves */
    tui_cmdline_free(&d);
    tui_cmdline_free(&c);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* keys */

START_TEST(t_keys)
{
    for (int i = 0; i < tui_nkeys; i++) {
        const tui_key *a = &tui_keys[i];
        ck_assert_msg(a->name && *a->name && a->help && *a->help, "entry %d", i);
        for (int j = i + 1; j < tui_nkeys; j++)
            ck_assert_msg(!(a->ctx == tui_keys[j].ctx && a->key == tui_keys[j].key), "%s twice in %s", a->name,
                          tui_ctx_name(a->ctx));
    }
    char **lines;
    int n = tui_help_lines(&lines);
    ck_assert_int_gt(n, 20);
    for (int i = 0; i < tui_nkeys; i++) { /* every visible binding is in the help, with its key's name */
        const tui_key *k = &tui_keys[i];
        if (!(k->flags & TUI_KEY_VISIBLE) || k->ctx == TUI_CTX_CONFIRM)
            continue;
        int found = 0;
        for (int j = 0; j < n && !found; j++)
            found = strstr(lines[j], k->help) && strstr(lines[j], k->name);
        ck_assert_msg(found, "help lacks %s (%s)", k->name, k->help);
    }
    for (int j = 0; j < n; j++)
        free(lines[j]);
    free(lines);
    /* the panel's context first; text keys of the line are not global keys */
    ck_assert_int_eq(tui_key_action(TUI_CTX_SWARM | TUI_CTX_GLOBAL, 's'), TUI_A_SORT);
    ck_assert_int_eq(tui_key_action(TUI_CTX_SCROLL | TUI_CTX_GLOBAL, 's'), TUI_A_NONE);
    ck_assert_int_eq(tui_key_action(TUI_CTX_GLOBAL, '\t'), TUI_A_FOCUS_NEXT);
    ck_assert_int_eq(tui_key_action(TUI_CTX_CMD, '\t'), TUI_A_CMD_COMPLETE);
    ck_assert_int_eq(tui_key_action(TUI_CTX_CMD, 'q'), TUI_A_NONE);
    ck_assert_int_eq(tui_key_action(TUI_CTX_GLOBAL, 'q'), TUI_A_QUIT);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* the queue and events */

static tui_ev *ev(tui_ev_kind k, const char *text)
{
    tui_ev *e = tui_ev_new(k);
    e->text = text ? strdup(text) : NULL;
    return e;
}

static uint64_t efd_value(int fd)
{
    uint64_t v = 0;
    if (read(fd, &v, sizeof v) != (ssize_t)sizeof v)
        return 0;
    return v;
}

START_TEST(t_queue)
{
    tui_queue q;
    ck_assert_int_eq(tui_queue_init(&q, 4, 1), 0);
    tui_ev *s1 = tui_ev_new(TE_SWARM), *s2 = tui_ev_new(TE_SWARM);
    s1->swarm = three_servers();
    s2->swarm = three_servers();
    s2->swarm->n = 2;
    tui_queue_push(&q, s1);
    tui_queue_push(&q, ev(TE_LOG, "a"));
    tui_queue_push(&q, s2); /* replaces s1, in its place */
    tui_ev *p1 = tui_ev_new(TE_PROGRESS), *p2 = tui_ev_new(TE_PROGRESS), *p3 = tui_ev_new(TE_PROGRESS);
    p1->what = strdup("loading");
    p2->what = strdup("starting servers");
    p3->what = strdup("loading");
    p3->a = 2;
    tui_queue_push(&q, p1);
    tui_queue_push(&q, p2);
    tui_queue_push(&q, p3); /* per task */
    tui_queue_push(&q, ev(TE_GEN_TEXT, "Once"));
    tui_queue_push(&q, ev(TE_GEN_TEXT, " upon")); /* a stream: joined */
    ck_assert_int_eq(q.wakes, 1);
    ck_assert_int_eq((int)efd_value(q.efd), 1); /* one write for the empty->non-empty edge */
    long dropped;
    tui_ev *l = tui_queue_take(&q, &dropped);
    ck_assert_int_eq(dropped, 0);
    ck_assert_int_eq(l->kind, TE_SWARM);
    ck_assert_int_eq(l->swarm->n, 2);
    ck_assert_int_eq(l->next->kind, TE_LOG);
    ck_assert_str_eq(l->next->next->what, "loading");
    ck_assert_double_eq(l->next->next->a, 2);
    ck_assert_str_eq(l->next->next->next->what, "starting servers");
    tui_ev *g = l->next->next->next->next;
    ck_assert_str_eq(g->text, "Once upon");
    ck_assert_ptr_null(g->next);
    tui_ev_free_list(l);
    /* logs beyond the capacity are dropped and counted; other events get twice the room */
    for (int i = 0; i < 10; i++)
        tui_queue_push(&q, ev(TE_LOG, "x"));
    tui_queue_push(&q, ev(TE_CMD_END, NULL));
    ck_assert_int_eq(q.wakes, 2);
    l = tui_queue_take(&q, &dropped);
    ck_assert_int_eq(dropped, 6);
    int n = 0;
    for (tui_ev *e = l; e; e = e->next)
        n++;
    ck_assert_int_eq(n, 5);
    tui_ev_free_list(l);
    l = tui_queue_take(&q, &dropped); /* nothing: no wake was pending */
    ck_assert_ptr_null(l);
    ck_assert_int_eq((int)efd_value(q.efd), 0);
    tui_queue_destroy(&q);
}
END_TEST

START_TEST(t_events_json)
{
    tui_ev *e = ev(TE_GEN_END, NULL);
    e->t = 12.5;
    e->n = 40;
    e->a = 0.25;
    e->what = strdup("eos");
    char *j = tui_ev_to_json(e, 2.5);
    char why[128];
    tui_ev *b = tui_ev_from_json(j, why, sizeof why);
    ck_assert_ptr_nonnull(b);
    ck_assert_int_eq(b->kind, TE_GEN_END);
    ck_assert_double_eq_tol(b->t, 10, 1e-9);
    ck_assert_int_eq(b->n, 40);
    ck_assert_double_eq(b->a, 0.25);
    ck_assert_str_eq(b->what, "eos");
    free(j);
    tui_ev_free(b);
    tui_ev_free(e);
    e = tui_ev_new(TE_SWARM);
    e->swarm = three_servers();
    e->swarm->s[2].rtt = INFINITY;
    e->swarm->s[1].state = TUI_ST_OFFLINE;
    j = tui_ev_to_json(e, 0);
    b = tui_ev_from_json(j, why, sizeof why);
    ck_assert_ptr_nonnull(b);
    ck_assert(tui_swarm_same(e->swarm, b->swarm));
    ck_assert(isinf(b->swarm->s[2].rtt));
    free(j);
    tui_ev_free(b);
    tui_ev_free(e);
    e = tui_ev_new(TE_ROUTE);
    e->nhops = 2;
    e->hops = calloc(2, sizeof *e->hops);
    e->hops[1] = (tui_hop){.server = 3, .start = 2, .end = 6, .latency = 0.004};
    j = tui_ev_to_json(e, 0);
    b = tui_ev_from_json(j, why, sizeof why);
    ck_assert_int_eq(b->nhops, 2);
    ck_assert_int_eq(b->hops[1].server, 3);
    ck_assert_double_eq(b->hops[1].latency, 0.004);
    free(j);
    tui_ev_free(b);
    tui_ev_free(e);
    ck_assert_ptr_null(tui_ev_from_json("{\"k\":\"nope\"}", why, sizeof why));
    ck_assert_ptr_null(tui_ev_from_json("not json", why, sizeof why));
    ck_assert_ptr_null(tui_ev_from_json("{\"k\":\"swarm\"}", why, sizeof why));
    b = tui_ev_from_json("{\"k\":\"log\",\"i\":1e300,\"text\":\"x\"}", why, sizeof why); /* out of range: 0 */
    ck_assert_int_eq(b->i, 0);
    tui_ev_free(b);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* state and panels */

static void apply(tui_state *st, tui_ev *e, double t)
{
    e->t = t;
    tui_state_apply(st, e);
    tui_ev_free(e);
}

/* A fresh state and view that have seen three_servers() at t = 1, server `offline` (or none: -1) offline. */
static void with_swarm(tui_state *st, tui_view *v, int offline)
{
    tui_state_init(st);
    tui_view_init(v);
    tui_ev *e = tui_ev_new(TE_SWARM);
    e->swarm = three_servers();
    if (offline >= 0)
        e->swarm->s[offline].state = TUI_ST_OFFLINE;
    apply(st, e, 1);
}

START_TEST(t_state)
{
    tui_state st;
    ck_assert_int_eq(tui_state_init(&st), 0);
    apply(&st, ev(TE_GEN_BEGIN, "Once"), 10);
    for (int i = 0; i < 11; i++) { /* 11 tokens, one every 20 ms: 50 tok/s */
        tui_ev *e = ev(TE_GEN_TEXT, " x");
        e->n = 1;
        apply(&st, e, 10.1 + 0.02 * i);
    }
    ck_assert_double_eq_tol(st.gen_tps, 50, 1e-6);
    ck_assert_double_eq_tol(st.gen_ttft, 0.1, 1e-9);
    ck_assert_int_eq((int)st.gen_mark, 4);
    tui_ev *end = ev(TE_GEN_END, NULL);
    end->what = strdup("length");
    end->n = 11;
    end->b = 0.2;
    end->c = 0.09;
    apply(&st, end, 10.4);
    ck_assert_str_eq(st.gen_stop, "length");
    ck_assert_double_eq_tol(st.gen_ttft, 0.09, 1e-9);
    ck_assert(!st.gen_active);
    apply(&st, ev(TE_TRAIN_BEGIN, "training"), 20);
    for (int s = 1; s <= 4; s++) {
        tui_ev *e = ev(TE_TRAIN_STEP, NULL);
        e->step = s;
        e->total = 8;
        e->a = 1.0 / s;
        apply(&st, e, 20 + s * 0.5);
    }
    ck_assert_int_eq(st.loss_s.n, 4);
    ck_assert_double_eq_tol(st.step_rate, 2, 1e-9);
    ck_assert_double_eq_tol(st.eta_s, 2, 1e-9);
    apply(&st, ev(TE_TRAIN_EVAL, "loss=0.5 accuracy=0.75 n=16"), 23);
    ck_assert_str_eq(st.val_name, "accuracy");
    ck_assert_double_eq(st.val_last, 0.75);
    ck_assert_int_eq(st.val_s.n, 1);
    char name[32];
    double v;
    ck_assert_int_eq(tui_metric_pick("perplexity=12.5 n=3", name, sizeof name, &v), 0);
    ck_assert_str_eq(name, "perplexity");
    ck_assert_int_eq(tui_metric_pick("nothing here", name, sizeof name, &v), -1);
    /* command output: whole lines to the log, a partial one when the command ends */
    apply(&st, ev(TE_CMD_BEGIN, "servers"), 30);
    apply(&st, ev(TE_OUT, "id name\nabc "), 30);
    apply(&st, ev(TE_OUT, "x\npart"), 30);
    apply(&st, ev(TE_CMD_END, NULL), 31);
    ck_assert_str_eq(tui_state_log(&st, st.log_n - 4)->text, ":servers");
    ck_assert_str_eq(tui_state_log(&st, st.log_n - 3)->text, "id name");
    ck_assert_str_eq(tui_state_log(&st, st.log_n - 2)->text, "abc x");
    ck_assert_str_eq(tui_state_log(&st, st.log_n - 1)->text, "part");
    for (int i = 0; i < TUI_LOG_LINES + 10; i++) /* the log is a ring */
        apply(&st, ev(TE_LOG, "line"), 40);
    ck_assert_int_eq(st.log_n, TUI_LOG_LINES);
    tui_ev *err = ev(TE_LOG, "generate: no model loaded");
    err->level = TUI_LOG_ERROR;
    apply(&st, err, 41);
    ck_assert_str_eq(st.toast, "generate: no model loaded");
    /* progress bars per task, gone at the end */
    tui_ev *p = ev(TE_PROGRESS, NULL);
    p->what = strdup("starting servers");
    p->a = 1;
    p->b = 3;
    apply(&st, p, 50);
    ck_assert(st.bars[0].active);
    p = ev(TE_PROGRESS, NULL);
    p->what = strdup("starting servers");
    p->a = 3;
    p->b = 3;
    apply(&st, p, 51);
    ck_assert(!st.bars[0].active);
    tui_state_free(&st);
}
END_TEST

static int screen_has(const tui_cb *cb, const char *needle)
{
    for (int y = 0; y < cb->h; y++)
        if (strstr(row(cb, y), needle))
            return 1;
    return 0;
}

START_TEST(t_panels)
{
    tui_state st;
    tui_view v;
    with_swarm(&st, &v, 2);
    tui_cb cb = grid(8, 100, 1);
    tui_draw_swarm(&cb, &st, &v, 1);
    for (int y = 0; getenv("SEPAL_TEST_VERBOSE") && y < cb.h; y++)
        printf("%s\n", row(&cb, y));
    ck_assert(screen_has(&cb, "1 Swarm"));
    ck_assert(screen_has(&cb, "2/3 online"));
    ck_assert(screen_has(&cb, "● aaaa1111"));
    ck_assert(screen_has(&cb, "_ cccc3333")); /* its state: offline */
    ck_assert(screen_has(&cb, "0:2") && screen_has(&cb, "4:6"));
    ck_assert(screen_has(&cb, "11111111111!!!!! gap")); /* coverage: blocks 4:6 lost their server */
    ck_assert(screen_has(&cb, "gap"));
    tui_cb_free(&cb);
    /* the route, with each hop's measured time */
    tui_ev *e = tui_ev_new(TE_ROUTE);
    e->nhops = 2;
    e->hops = calloc(2, sizeof *e->hops);
    e->hops[0] = (tui_hop){.server = 0, .start = 0, .end = 2, .latency = 0.002};
    e->hops[1] = (tui_hop){.server = 1, .start = 2, .end = 6, .latency = 0.003};
    apply(&st, e, 2);
    e = tui_ev_new(TE_HOPS);
    e->nhops = 2;
    e->hops = calloc(2, sizeof *e->hops);
    e->hops[0] = (tui_hop){.server = 0, .start = 0, .end = 2, .latency = 0.0012};
    e->hops[1] = (tui_hop){.server = 1, .start = 2, .end = 6, .latency = 0.0031};
    apply(&st, e, 3);
    e = ev(TE_RETRY, "127.0.0.1:4001 (blocks 2:4) failed: closed; banned for 15 s; retry 1 of 8");
    e->i = 1;
    apply(&st, e, 4);
    tui_cb r = grid(4, 100, 1);
    tui_draw_route(&r, &st, &v, 0);
    for (int y = 0; getenv("SEPAL_TEST_VERBOSE") && y < r.h; y++)
        printf("%s\n", row(&r, y));
    ck_assert(screen_has(&r, "you ▶ aaaa1111[0:2) 1.20ms ▶ bbbb2222[2:6) 3.10ms"));
    ck_assert(screen_has(&r, "retry: 127.0.0.1:4001"));
    ck_assert(screen_has(&r, "retries 1"));
    tui_cb_free(&r);
    /* progress bars in the command row: loading, starting servers */
    e = tui_ev_new(TE_PROGRESS);
    e->what = strdup("starting servers");
    e->a = 1;
    e->b = 3;
    apply(&st, e, 5);
    tui_cb c = grid(1, 100, 1);
    tui_draw_cmdrow(&c, &st);
    ck_assert(screen_has(&c, "starting servers [█████") && screen_has(&c, "1/3"));
    tui_cb_free(&c);
    /* generation: prompt, text, figures */
    apply(&st, ev(TE_GEN_BEGIN, "Once upon a time"), 10);
    for (int i = 0; i < 60; i++) {
        e = ev(TE_GEN_TEXT, " word");
        e->n = 1;
        apply(&st, e, 10.1 + i * 0.05);
    }
    e = ev(TE_GEN_END, NULL);
    e->what = strdup("eos");
    e->n = 60;
    e->b = 3;
    apply(&st, e, 13.2);
    tui_cb g = grid(8, 50, 1);
    tui_draw_gen(&g, &st, &v, 0);
    for (int y = 0; getenv("SEPAL_TEST_VERBOSE") && y < g.h; y++)
        printf("%s\n", row(&g, y));
    ck_assert(screen_has(&g, "3 Generate"));
    ck_assert(screen_has(&g, "20.0 tok/s") && screen_has(&g, "stop: eos"));
    ck_assert(screen_has(&g, "word word"));
    ck_assert_int_eq(g.c[7 * 50].ch >= 0x2581 && g.c[7 * 50].ch <= 0x2588, 1); /* the sparkline */
    tui_cb_free(&g);
    /* training: the plot, the figures, the progress bar */
    apply(&st, ev(TE_TRAIN_BEGIN, "training sst2"), 20);
    for (int i = 1; i <= 20; i++) {
        e = ev(TE_TRAIN_STEP, NULL);
        e->step = i;
        e->total = 40;
        e->a = 2.0 / i;
        e->b = 1e-3;
        apply(&st, e, 20 + i * 0.25);
    }
    tui_cb tr = grid(12, 50, 1);
    tui_draw_train(&tr, &st, &v, 1);
    for (int y = 0; getenv("SEPAL_TEST_VERBOSE") && y < tr.h; y++)
        printf("%s\n", row(&tr, y));
    ck_assert(screen_has(&tr, "4 Train"));
    ck_assert(screen_has(&tr, "step 20/40  loss 0.1  lr 0.001"));
    ck_assert(screen_has(&tr, "] 50%  ETA 5s  4 st/s")); /* the rates beside the progress bar */
    ck_assert(screen_has(&tr, "step") && screen_has(&tr, "20"));
    tui_cb_free(&tr);
    /* too small */
    tui_cb s = grid(5, 30, 1);
    tui_draw_too_small(&s, 6, 30);
    ck_assert(screen_has(&s, "too small"));
    tui_cb_free(&s);
    tui_state_free(&st);
}
END_TEST

/* The columns (from x0, in rows [y0, y1)) that hold plot dots. */
static int dot_rows(const tui_cb *cb, int x, int y0, int y1, int *top)
{
    int n = 0;
    *top = -1;
    for (int y = y0; y < y1; y++)
        if (plotted(cb, y, x)) {
            if (*top < 0)
                *top = y;
            n++;
        }
    return n;
}

/* A training run of 40 steps with a validation accuracy after each of 4 epochs: 0.25, 0.5, 0.625, 0.875. */
static void train_run(tui_state *st)
{
    static const double acc[4] = {0.25, 0.5, 0.625, 0.875};
    apply(st, ev(TE_TRAIN_BEGIN, "training sst2"), 20);
    for (int i = 1; i <= 40; i++) {
        tui_ev *e = ev(TE_TRAIN_STEP, NULL);
        e->step = i;
        e->total = 40;
        e->a = 2.0 / i;
        e->b = 5e-4;
        e->c = 1900;
        apply(st, e, 20 + i * 0.1326); /* 7.54 steps/s */
        if (i % 10 == 0) {
            char m[64];
            snprintf(m, sizeof m, "accuracy=%.3f loss=0.8 n=32", acc[i / 10 - 1]);
            apply(st, ev(TE_TRAIN_EVAL, m), 20 + i * 0.1326);
        }
    }
    apply(st, ev(TE_TRAIN_END, "done"), 26);
}

/* The validation curve, where it is drawn: beside the loss (wide), alone after ] (narrow), under the loss (tall).
 * Accuracy has a fixed axis 0 .. 1, so each point's row is known: 0.25 lower than 0.875. */
START_TEST(t_train_validation_plot)
{
    tui_state st;
    tui_state_init(&st);
    tui_view v;
    tui_view_init(&v);
    train_run(&st);
    ck_assert_int_eq(st.val_s.n, 4);
    /* wide (80 columns: 80x24 zoomed): side by side, the right one is the accuracy's */
    tui_cb w = grid(16, 80, 1);
    tui_draw_train(&w, &st, &v, 1);
    for (int y = 0; getenv("SEPAL_TEST_VERBOSE") && y < w.h; y++)
        printf("%s\n", row(&w, y));
    ck_assert(strstr(row(&w, 0), "loss | accuracy  ended"));
    int lw = 80 * 3 / 5, ax = -1; /* the right plot's y axis */
    for (int x = lw + 1; x < lw + 8 && ax < 0; x++)
        if (w.c[1 * 80 + x].ch == 0x2502)
            ax = x;
    ck_assert_int_gt(ax, lw);
    ck_assert(strstr(row(&w, 1), "1│") != NULL);                /* the top tick of 0 .. 1 */
    ck_assert(strstr(row(&w, 13), "accuracy") != NULL);         /* the x unit under it */
    ck_assert_int_eq(w.c[12 * 80 + ax].ch, 0x2514);            /* its corner */
    int first = -1, last = -1;                                 /* rising: the last point above the first */
    ck_assert_int_gt(dot_rows(&w, ax + 1, 1, 12, &first), 0);
    ck_assert_int_gt(dot_rows(&w, 79, 1, 12, &last), 0);
    ck_assert_int_lt(last, first);
    for (int x = ax + 1; x < 80; x++) { /* a line: every column has dots */
        int t;
        ck_assert_msg(dot_rows(&w, x, 1, 12, &t) > 0, "validation column %d empty", x);
    }
    /* the figures: the metric and the rates */
    ck_assert(screen_has(&w, "step 40/40  loss 0.05  acc 0.875  lr 5e-4"));
    ck_assert(screen_has(&w, "] 100%  done  7.54 st/s  1.9k tok/s"));
    tui_cb_free(&w);
    /* narrow (50x12, as at 100x30): the loss, and the title says ] shows the accuracy */
    tui_cb n = grid(12, 50, 1);
    tui_draw_train(&n, &st, &v, 0);
    ck_assert(strstr(row(&n, 0), "loss  (]: accuracy)  ended"));
    ck_assert(!screen_has(&n, "accuracy ") || strstr(row(&n, 0), "accuracy"));
    tui_cb_free(&n);
    v.train_series = 1; /* ] */
    n = grid(12, 50, 1);
    tui_draw_train(&n, &st, &v, 0);
    for (int y = 0; getenv("SEPAL_TEST_VERBOSE") && y < n.h; y++)
        printf("%s\n", row(&n, y));
    ck_assert(strstr(row(&n, 0), "accuracy  (]: loss)  ended"));
    ck_assert(strstr(row(&n, 1), "1│") && strstr(row(&n, 9), "accuracy")); /* 0 .. 1, the unit */
    ck_assert(strstr(row(&n, 7), "0│")); /* the bottom tick */
    int nax = -1;
    for (int x = 0; x < 8 && nax < 0; x++)
        if (n.c[1 * 50 + x].ch == 0x2502)
            nax = x;
    ck_assert_int_gt(nax, 0);
    ck_assert_int_gt(dot_rows(&n, nax + 1, 1, 8, &first), 0);
    ck_assert_int_gt(dot_rows(&n, 49, 1, 8, &last), 0);
    ck_assert_int_lt(last, first);
    /* the points' rows: the plot's 7 rows hold 28 dot rows for 0 .. 1: 0.25 near the bottom, 0.875 near the top */
    ck_assert_int_ge(first, 5);
    ck_assert_int_le(last, 2);
    tui_cb_free(&n);
    /* tall (50x20): the loss above, the accuracy under it */
    v.train_series = 0;
    tui_cb t = grid(20, 50, 1);
    tui_draw_train(&t, &st, &v, 0);
    for (int y = 0; getenv("SEPAL_TEST_VERBOSE") && y < t.h; y++)
        printf("%s\n", row(&t, y));
    ck_assert(strstr(row(&t, 0), "loss | accuracy  ended"));
    int units = 0, y_loss = -1, y_acc = -1;
    for (int y = 1; y < 18; y++) {
        if (strstr(row(&t, y), "step") && strstr(row(&t, y), "40"))
            y_loss = y, units++;
        if (strstr(row(&t, y), "accuracy"))
            y_acc = y, units++;
    }
    ck_assert_int_eq(units, 2);
    ck_assert_int_lt(y_loss, y_acc);
    ck_assert_int_gt(dot_rows(&t, 49, y_loss + 1, y_acc, &last), 0); /* the accuracy's points under the loss */
    tui_cb_free(&t);
    tui_state_free(&st);
}
END_TEST

/* At 80x24 the generation and training panels are 39 and 40 columns: their figures fit, compact, not cut. */
START_TEST(t_narrow_figures)
{
    tui_state st;
    tui_state_init(&st);
    tui_view v;
    tui_view_init(&v);
    tui_layout l;
    tui_layout_opts o = {.zoom = -1, .focus = 0, .swarm_rows = 3};
    tui_layout_compute(24, 80, &o, &l);
    const tui_rect *gr = &l.panel[TUI_P_GEN], *tr = &l.panel[TUI_P_TRAIN];
    apply(&st, ev(TE_GEN_BEGIN, "Once upon a time"), 10);
    for (int i = 0; i < 90; i++) {
        tui_ev *e = ev(TE_GEN_TEXT, " word");
        e->n = 1;
        apply(&st, e, 10.01 + i * 0.0146);
    }
    tui_ev *e = ev(TE_GEN_END, NULL);
    e->what = strdup("length");
    e->n = 90;
    e->b = 1.315;
    e->c = 0.0116;
    apply(&st, e, 11.4);
    tui_cb g = grid(gr->h, gr->w, 1);
    tui_draw_gen(&g, &st, &v, 0);
    ck_assert_msg(strstr(row(&g, g.h - 1), "68.4 tok/s  first 11.6ms  stop: length"), "%s", row(&g, g.h - 1));
    tui_cb_free(&g);
    /* narrower: compact forms, one blank, then the first token dropped; the stop reason stays */
    static const char *const want[][2] = {{"33", "68.4t/s  1st 11.6ms  stop: length"},
                                          {"31", "68.4t/s 1st 11.6ms stop: length"},
                                          {"24", "68.4 tok/s  stop: length"}};
    for (int i = 0; i < 3; i++) {
        g = grid(gr->h, atoi(want[i][0]), 1);
        tui_draw_gen(&g, &st, &v, 0);
        ck_assert_msg(strstr(row(&g, g.h - 1), want[i][1]) == row_buf, "%s", row(&g, g.h - 1));
        tui_cb_free(&g);
    }
    g = grid(gr->h, 30, 1); /* room left: the sparkline (tokens in each second) before the figures */
    tui_draw_gen(&g, &st, &v, 0);
    ck_assert_msg(strstr(row(&g, g.h - 1), "68.4 tok/s  stop: length") == row_buf + strlen("█▃") + 4, "%s",
                  row(&g, g.h - 1));
    ck_assert(g.c[(g.h - 1) * 30].ch == 0x2588 && g.c[(g.h - 1) * 30 + 1].ch == 0x2583);
    tui_cb_free(&g);
    train_run(&st);
    tui_cb t = grid(tr->h, tr->w, 1);
    tui_draw_train(&t, &st, &v, 0);
    for (int y = 0; getenv("SEPAL_TEST_VERBOSE") && y < t.h; y++)
        printf("%s\n", row(&t, y));
    ck_assert_msg(strstr(row(&t, 0), "loss  (]: acc)  ended"), "%s", row(&t, 0));
    ck_assert_msg(strstr(row(&t, t.h - 2), "40/40  loss 0.05  acc 0.875  lr 5e-4"), "%s", row(&t, t.h - 2));
    ck_assert_msg(strstr(row(&t, t.h - 1), "] 100%  done  7.54st/s  1.9kt/s"), "%s", row(&t, t.h - 1));
    tui_cb_free(&t);
    /* a short panel, one row of figures: the learning rate and tokens/s go before the metric and steps/s */
    t = grid(5, tr->w, 1);
    tui_draw_train(&t, &st, &v, 0);
    ck_assert_msg(strstr(row(&t, 4), "40/40  loss 0.05  acc 0.875  7.54st/s ") == row_buf, "%s", row(&t, 4));
    tui_cb_free(&t);
    tui_state_free(&st);
}
END_TEST

/* A re-route (TE_ROUTE with i set): the new chain, a note in the route panel, the title's count, the log. */
START_TEST(t_route_reroute)
{
    tui_state st;
    tui_view v;
    with_swarm(&st, &v, -1);
    tui_ev *e = tui_ev_new(TE_ROUTE); /* the first route: no note */
    e->nhops = 2;
    e->hops = calloc(2, sizeof *e->hops);
    e->hops[0] = (tui_hop){.server = 0, .start = 0, .end = 3, .latency = 0.002};
    e->hops[1] = (tui_hop){.server = 1, .start = 3, .end = 6, .latency = 0.003};
    e->text = strdup("0:3 aaaa1111 -> 3:6 bbbb2222");
    apply(&st, e, 2);
    ck_assert_int_eq(st.nnotes, 0);
    ck_assert_int_eq(st.reroutes, 0);
    e = ev(TE_RETRY, "bbbb2222 (blocks 3:6) failed: closed; banned for 15 s; retry 1 of 8");
    e->i = 1;
    apply(&st, e, 3);
    e = tui_ev_new(TE_ROUTE); /* the re-route: blocks 3:6 on the third server */
    e->i = 1;
    e->nhops = 2;
    e->hops = calloc(2, sizeof *e->hops);
    e->hops[0] = (tui_hop){.server = 0, .start = 0, .end = 3, .latency = 0.002};
    e->hops[1] = (tui_hop){.server = 2, .start = 3, .end = 6, .latency = 0.004};
    e->a = 0.01;
    e->text = strdup("0:3 aaaa1111 -> 3:6 cccc3333; 100 steps/s expected");
    apply(&st, e, 4);
    ck_assert_int_eq(st.reroutes, 1);
    ck_assert_int_eq(st.retries, 1);
    ck_assert_int_eq(st.nnotes, 2);
    tui_cb r = grid(5, 100, 1);
    tui_draw_route(&r, &st, &v, 0);
    for (int y = 0; getenv("SEPAL_TEST_VERBOSE") && y < r.h; y++)
        printf("%s\n", row(&r, y));
    ck_assert(strstr(row(&r, 0), "retries 1  re-routes 1"));
    ck_assert(strstr(row(&r, 1), "you ▶ aaaa1111[0:3) ~2.00ms ▶ cccc3333[3:6) ~4.00ms   2 hops, ~100 steps/s"));
    ck_assert(!screen_has(&r, "bbbb2222[")); /* the old hop is gone from the chain */
    /* newest first: the re-route, then the retry that caused it */
    ck_assert(strstr(row(&r, 2), "re-routed: 0:3 aaaa1111 -> 3:6 cccc3333; 100 steps/s expected ") == row_buf);
    ck_assert(strncmp(row(&r, 3), "retry: bbbb2222 (blocks 3:6) failed", 35) == 0);
    /* its roles: the re-route a warning, the retry an error */
    ck_assert_int_eq(r.c[2 * 100].role, R_WARN);
    ck_assert_int_eq(r.c[3 * 100].role, R_ERR);
    tui_cb_free(&r);
    /* the log says so */
    ck_assert_str_eq(tui_state_log(&st, st.log_n - 1)->text, "re-routed");
    /* narrow and tall (a zoomed panel): a long note goes on in the rows under it, indented, the ban included */
    tui_cb z = grid(12, 40, 1);
    tui_draw_route(&z, &st, &v, 1);
    for (int y = 0; getenv("SEPAL_TEST_VERBOSE") && y < z.h; y++)
        printf("%s\n", row(&z, y));
    int ry = -1, ban = -1;
    for (int y = 1; y < z.h; y++) {
        if (ry < 0 && strncmp(row(&z, y), "retry: bbbb2222 (blocks 3:6)", 28) == 0)
            ry = y;
        if (ry >= 0 && y > ry && strstr(row(&z, y), "banned for 15 s"))
            ban = y;
    }
    ck_assert_int_gt(ry, 0);
    ck_assert_int_gt(ban, ry);
    ck_assert(strncmp(row(&z, ban), "  ", 2) == 0 && row_buf[2] != ' ');
    ck_assert_int_eq(z.c[ry * 40].role, R_ERR);
    tui_cb_free(&z);
    /* a short panel: the chain and the newest note only */
    tui_cb s = grid(3, 100, 1);
    tui_draw_route(&s, &st, &v, 0);
    ck_assert(strstr(row(&s, 2), "re-routed: "));
    tui_cb_free(&s);
    tui_state_free(&st);
}
END_TEST

/* The mouse, through the same path as the loop: an event -> an action -> the view. */
START_TEST(t_mouse)
{
    tui_state st;
    tui_view v;
    with_swarm(&st, &v, -1);
    for (int i = 0; i < 50; i++)
        apply(&st, ev(TE_LOG, "a line"), 2);
    tui_layout l;
    tui_layout_opts o = {.zoom = -1, .focus = 0, .swarm_rows = 3};
    tui_layout_compute(30, 100, &o, &l);
    /* a click in a panel focuses it, wherever in it */
    const tui_rect *g = &l.panel[TUI_P_GEN], *lg = &l.panel[TUI_P_LOG];
    ck_assert_int_eq(tui_mouse_action(&l, &v, TUI_MOUSE_CLICK, g->y + 2, g->x + 5), TUI_A_FOCUS3);
    ck_assert_int_eq(tui_mouse_action(&l, &v, TUI_MOUSE_CLICK, g->y, g->x + g->w - 1), TUI_A_FOCUS3); /* title */
    ck_assert_uint_eq(tui_view_apply(&v, &st, &l, TUI_A_FOCUS3), TUI_D_ALL);
    ck_assert_int_eq(v.focus, TUI_P_GEN);
    ck_assert_int_eq(tui_mouse_action(&l, &v, TUI_MOUSE_CLICK, l.vdiv.y + 1, l.vdiv.x), TUI_A_NONE); /* the rule */
    ck_assert_int_eq(tui_mouse_action(&l, &v, TUI_MOUSE_CLICK, 0, 10), TUI_A_NONE);     /* the header: no tabs */
    ck_assert_int_eq(tui_mouse_action(&l, &v, TUI_MOUSE_CLICK, 29, 10), TUI_A_NONE);    /* the status row */
    ck_assert_int_eq(tui_mouse_action(&l, &v, TUI_MOUSE_CLICK, 30, 10), TUI_A_NONE);    /* off the screen */
    ck_assert_int_eq(tui_mouse_action(&l, &v, TUI_MOUSE_NONE, g->y + 2, g->x + 5), TUI_A_NONE);
    /* the wheel scrolls the focused panel: the log, 3 lines a notch, up and back down */
    tui_action a = tui_mouse_action(&l, &v, TUI_MOUSE_CLICK, lg->y + 1, 3);
    ck_assert_int_eq(a, TUI_A_FOCUS5);
    tui_view_apply(&v, &st, &l, a);
    a = tui_mouse_action(&l, &v, TUI_MOUSE_WHEEL_UP, g->y + 2, g->x + 5); /* wherever the pointer is */
    ck_assert_int_eq(a, TUI_A_UP);
    for (int i = 0; i < TUI_WHEEL_LINES; i++)
        ck_assert_uint_eq(tui_view_apply(&v, &st, &l, a), TUI_D_PANEL(TUI_P_LOG));
    ck_assert_int_eq(v.log_scroll, 3);
    tui_cb cb = grid(lg->h, lg->w, 1);
    tui_draw_log(&cb, &st, &v, 1);
    ck_assert(strstr(row(&cb, 0), "scrolled 3 (End follows)"));
    tui_cb_free(&cb);
    a = tui_mouse_action(&l, &v, TUI_MOUSE_WHEEL_DOWN, 5, 5);
    ck_assert_int_eq(a, TUI_A_DOWN);
    tui_view_apply(&v, &st, &l, a);
    ck_assert_int_eq(v.log_scroll, 2);
    /* ... and the swarm's selection */
    tui_view_apply(&v, &st, &l, tui_mouse_action(&l, &v, TUI_MOUSE_CLICK, l.panel[TUI_P_SWARM].y + 3, 50));
    ck_assert_int_eq(v.focus, TUI_P_SWARM);
    for (int i = 0; i < TUI_WHEEL_LINES; i++)
        tui_view_apply(&v, &st, &l, tui_mouse_action(&l, &v, TUI_MOUSE_WHEEL_DOWN, 5, 5));
    ck_assert_int_eq(v.swarm_sel, 2); /* the last of 3 */
    /* tabs (60x16, and 45 columns where they are letters): a click on a tab, as the header draws it */
    static const int widths[2] = {60, 45};
    for (int k = 0; k < 2; k++) {
        int cols = widths[k];
        tui_layout_compute(16, cols, &o, &l);
        ck_assert_int_eq(l.tier, TUI_TIER_TABS);
        tui_cb h = grid(1, cols, 1);
        tui_draw_header(&h, &st, &v, 1);
        const char *r = row(&h, 0), *tab = strstr(r, cols >= 60 ? "4 Train" : "4 T");
        ck_assert_ptr_nonnull(tab);
        int x4 = (int)(tab - r);
        ck_assert_int_eq(tui_mouse_action(&l, &v, TUI_MOUSE_CLICK, 0, x4), TUI_A_FOCUS4);
        ck_assert_int_eq(tui_mouse_action(&l, &v, TUI_MOUSE_CLICK, 0, x4 + 2), TUI_A_FOCUS4);
        ck_assert_int_eq(tui_mouse_action(&l, &v, TUI_MOUSE_CLICK, 0, x4 - 1), TUI_A_NONE); /* between tabs */
        ck_assert_int_eq(tui_mouse_action(&l, &v, TUI_MOUSE_CLICK, 0, 1), TUI_A_FOCUS1);
        ck_assert_int_eq(tui_mouse_action(&l, &v, TUI_MOUSE_CLICK, 0, 0), TUI_A_NONE);
        ck_assert_int_eq(tui_mouse_action(&l, &v, TUI_MOUSE_CLICK, 0, cols - 1), TUI_A_NONE);
        ck_assert_int_eq(tui_mouse_action(&l, &v, TUI_MOUSE_CLICK, 5, 5), TUI_A_FOCUS1); /* the panel shown */
        tui_cb_free(&h);
    }
    /* zoomed at 100x30: the tabs switch the zoomed panel */
    v.focus = TUI_P_GEN;
    tui_view_apply(&v, &st, &l, TUI_A_ZOOM);
    ck_assert_int_eq(v.zoom, TUI_P_GEN);
    o.zoom = v.zoom;
    tui_layout_compute(30, 100, &o, &l);
    a = tui_mouse_action(&l, &v, TUI_MOUSE_CLICK, 0, 2);
    ck_assert_int_eq(a, TUI_A_FOCUS1);
    tui_view_apply(&v, &st, &l, a);
    ck_assert_int_eq(v.zoom, TUI_P_SWARM);
    /* too small: nothing */
    tui_layout_compute(8, 30, &o, &l);
    ck_assert_int_eq(tui_mouse_action(&l, &v, TUI_MOUSE_CLICK, 2, 2), TUI_A_NONE);
    ck_assert_int_eq(tui_mouse_action(&l, &v, TUI_MOUSE_WHEEL_UP, 2, 2), TUI_A_NONE);
    tui_state_free(&st);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* rough edges (issue 22): the status row after Ctrl-C, the quit question at every width, the queue, the log's
 * long lines, the Train panel before its first step */

/* Row y of cb without the blanks at its end. */
static const char *rowt(const tui_cb *cb, int y)
{
    row(cb, y);
    size_t n = strlen(row_buf);
    while (n && row_buf[n - 1] == ' ')
        row_buf[--n] = 0;
    return row_buf;
}

static void status_at(tui_cb *cb, const tui_state *st, const tui_view *v, const char *mode, int confirm)
{
    tui_status_info si = {.mode = mode, .frame = -1, .confirm = confirm};
    tui_cb_fill(cb, 0, 0, 1, cb->w, ' ', R_TEXT, 0);
    tui_draw_status(cb, st, v, &si);
}

START_TEST(t_status_and_confirm)
{
    tui_state st;
    tui_view v;
    with_swarm(&st, &v, -1);
    tui_cb c = grid(1, 100, 1);
    status_at(&c, &st, &v, "NORMAL", 0);
    ck_assert_msg(strstr(row(&c, 0), " NORMAL  focus: Swarm"), "%s", row(&c, 0));
    /* a generation stopped by Ctrl-C: the status row names it (the swarm is fine) */
    apply(&st, ev(TE_CMD_BEGIN, "generate 'Lily and Tom' --max-new-tokens 250"), 2);
    tui_ev *e = ev(TE_CMD_END, NULL);
    e->n = 1;
    e->i = 1;
    apply(&st, e, 3);
    status_at(&c, &st, &v, "NORMAL", 0);
    ck_assert_msg(strstr(row(&c, 0), " NORMAL  stopped by Ctrl-C: generate 'Lily and Tom' --max-new-tokens 250"), "%s",
                  row(&c, 0));
    ck_assert(!strstr(row(&c, 0), "Swarm"));
    apply(&st, ev(TE_CMD_BEGIN, "route"), 4);
    apply(&st, ev(TE_CMD_END, NULL), 5);
    status_at(&c, &st, &v, "NORMAL", 0);
    ck_assert_msg(strstr(row(&c, 0), " NORMAL  done: route "), "%s", row(&c, 0));
    tui_cb_free(&c);
    /* the quit question while training runs: its choices in the status row at every width, whole */
    apply(&st, ev(TE_CMD_BEGIN, "train sst2 --tuning ptune --pre-seq-len 4 --batch 4 --max-length 32 --max-steps 400"),
          6);
    static const char *const choices[] = {"y quits (the command is stopped first), n or Esc stays",
                                          "y quits, n or Esc stays", "y quits, n stays", "y/n"};
    for (int w = 16; w <= 120; w++) { /* (" QUIT? ", the choices, a blank each side) */
        c = grid(1, w, 1);
        status_at(&c, &st, &v, "QUIT?", 1);
        int k = 0;
        while (k < 4 && !strstr(row(&c, 0), choices[k]))
            k++;
        ck_assert_msg(k < 4, "width %d: no choices in '%s'", w, row(&c, 0));
        ck_assert_msg(k == 0 || w < 80, "width %d: '%s' (the longest form fits)", w, row(&c, 0));
        ck_assert_msg(w < 100 || strstr(row(&c, 0), "running: train sst2"), "width %d: %s", w, row(&c, 0));
        tui_cb_free(&c);
    }
    /* ... and in the box: the question and the choices, each line whole inside the box, at every size */
    for (int h = 5; h <= 30; h += 5)
        for (int w = 14; w <= 100; w += 3) {
            c = grid(h, w, 1);
            tui_rect r = tui_draw_confirm(&c, st.cmd_line);
            ck_assert_msg(r.w > 0 && r.x + r.w <= w && r.y + r.h <= h, "%dx%d: the box outside", w, h);
            int k = 0;
            while (k < 4 && !screen_has(&c, choices[k]))
                k++;
            ck_assert_msg(k < 4 && k > 0, "%dx%d: no choices in the box", w, h);
            ck_assert_msg(screen_has(&c, "Quit"), "%dx%d: no question", w, h);
            for (int y = r.y + 1; y < r.y + r.h - 1; y++) /* a line cut at the border would leave none there */
                ck_assert_msg(c.c[y * w + r.x + r.w - 2].ch == ' ', "%dx%d: row %d cut: %s", w, h, y, row(&c, y));
            tui_cb_free(&c);
        }
    c = grid(30, 100, 1);
    tui_draw_confirm(&c, st.cmd_line);
    for (int y = 0; getenv("SEPAL_TEST_VERBOSE") && y < c.h; y++)
        printf("%s\n", row(&c, y));
    ck_assert(screen_has(&c, "`train sst2 --tuning ptune") && screen_has(&c, "--max-le...` is running."));
    tui_cb_free(&c);
    tui_state_free(&st);
}
END_TEST

START_TEST(t_queue_row)
{
    tui_state st;
    tui_state_init(&st);
    ck_assert_uint_eq(tui_state_queue(&st, 2, "generate \"Tom had a red kite\""), TUI_D_CMD);
    ck_assert_uint_eq(tui_state_queue(&st, 2, "generate \"Tom had a red kite\""), 0);
    tui_cb c = grid(1, 100, 1);
    tui_draw_cmdrow(&c, &st);
    ck_assert_str_eq(rowt(&c, 0), "queued: generate \"Tom had a red kite\"  (+1 more; Ctrl-C clears)");
    tui_cb_free(&c);
    c = grid(1, 45, 1); /* the command is cut, what Ctrl-C does is not */
    tui_draw_cmdrow(&c, &st);
    ck_assert_str_eq(rowt(&c, 0), "queued: generate \"T  (+1 more; Ctrl-C clears)");
    tui_cb_free(&c);
    c = grid(1, 30, 1);
    tui_draw_cmdrow(&c, &st);
    ck_assert_str_eq(rowt(&c, 0), "2 queued");
    tui_cb_free(&c);
    ck_assert_uint_eq(tui_state_queue(&st, 0, ""), TUI_D_CMD);
    c = grid(1, 100, 1);
    tui_draw_cmdrow(&c, &st);
    ck_assert(!strstr(row(&c, 0), "queued"));
    tui_cb_free(&c);
    tui_state_free(&st);
}
END_TEST

START_TEST(t_log_wrap)
{
    tui_state st;
    tui_view v;
    tui_state_init(&st);
    tui_view_init(&v);
    char fits[101], lng[300];
    memset(fits, 'x', 100);
    fits[100] = 0;
    snprintf(lng, sizeof lng, "%s", "5 prompt tokens in 0.019 s, 90 new in 0.187 s (480.3 tok/s), first after 0.020 s; "
                                    "stop: length; seed 9123456789012345678");
    apply(&st, ev(TE_LOG, "the oldest"), 1);
    apply(&st, ev(TE_LOG, fits), 2);
    apply(&st, ev(TE_LOG, lng), 3);
    tui_cb c = grid(5, 100, 1);
    tui_draw_log(&c, &st, &v, 0);
    for (int y = 0; getenv("SEPAL_TEST_VERBOSE") && y < c.h; y++)
        printf("%s\n", row(&c, y));
    ck_assert_str_eq(rowt(&c, 1), "the oldest");
    ck_assert_str_eq(rowt(&c, 2), fits); /* as wide as the panel: one row */
    ck_assert(!strncmp(row(&c, 3), "5 prompt tokens", 15));
    ck_assert_msg(!strncmp(row(&c, 4), "  ", 2) && strstr(row(&c, 4), "seed 9123456789012345678"), "%s", row(&c, 4));
    tui_cb_free(&c);
    /* scrolled to the top: the oldest entry in the first row, not further */
    c = grid(3, 40, 1);
    v.log_scroll = 1000;
    tui_draw_log(&c, &st, &v, 0);
    ck_assert_str_eq(rowt(&c, 1), "the oldest");
    ck_assert_str_eq(rowt(&c, 2), "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"); /* the next, wrapped at 38 */
    ck_assert_int_eq(v.log_scroll, 1);
    v.log_scroll = 0; /* following: the newest entry's last rows */
    tui_draw_log(&c, &st, &v, 0);
    ck_assert_msg(strstr(row(&c, 2), "9123456789012345678"), "%s", row(&c, 2));
    tui_cb_free(&c);
    tui_state_free(&st);
}
END_TEST

START_TEST(t_train_before_first_step)
{
    tui_state st;
    tui_view v;
    tui_state_init(&st);
    tui_view_init(&v);
    tui_cb c = grid(8, 50, 1);
    apply(&st, ev(TE_TRAIN_BEGIN, "training sst2 with deep_ptune (P 8), batch 8"), 1);
    tui_draw_train(&c, &st, &v, 0);
    ck_assert(screen_has(&c, "no training yet"));
    ck_assert(screen_has(&c, "starting: training sst2 with deep_ptune"));
    ck_assert(!screen_has(&c, "step 0/0") && !screen_has(&c, "loss 0") && !screen_has(&c, "lr 0"));
    tui_cb_free(&c);
    apply(&st, ev(TE_TRAIN_END, "stopped before its first step"), 2);
    c = grid(8, 100, 1);
    tui_draw_train(&c, &st, &v, 0);
    ck_assert(screen_has(&c, "no training yet"));
    ck_assert(screen_has(&c, "the last run ended before its first step: stopped before its first step"));
    tui_cb_free(&c);
    apply(&st, ev(TE_TRAIN_BEGIN, "training"), 3);
    tui_ev *e = ev(TE_TRAIN_STEP, NULL);
    e->step = 1;
    e->total = 40;
    e->a = 0.7;
    e->b = 1e-3;
    apply(&st, e, 4);
    c = grid(8, 50, 1);
    tui_draw_train(&c, &st, &v, 0);
    ck_assert(!screen_has(&c, "no training yet"));
    ck_assert(screen_has(&c, "step 1/40"));
    tui_cb_free(&c);
    tui_state_free(&st);
}
END_TEST

int main(void)
{
    setlocale(LC_CTYPE, "C.UTF-8"); /* wide characters' widths, as on a UTF-8 terminal */
    Suite *s = suite_create("tui");
    TCase *tc = tcase_create("tui");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, t_layout_sweep);
    tcase_add_test(tc, t_layout_80x24);
    tcase_add_test(tc, t_cellbuf_text);
    tcase_add_test(tc, t_spanbar);
    tcase_add_test(tc, t_coverage);
    tcase_add_test(tc, t_progress_and_spark);
    tcase_add_test(tc, t_ticks);
    tcase_add_test(tc, t_plot);
    tcase_add_test(tc, t_plot_hysteresis);
    tcase_add_test(tc, t_table_widths);
    tcase_add_test(tc, t_fields);
    tcase_add_test(tc, t_swarm_sort_stable);
    tcase_add_test(tc, t_text_wrap);
    tcase_add_test(tc, t_cmdline);
    tcase_add_test(tc, t_keys);
    tcase_add_test(tc, t_queue);
    tcase_add_test(tc, t_events_json);
    tcase_add_test(tc, t_state);
    tcase_add_test(tc, t_panels);
    tcase_add_test(tc, t_train_validation_plot);
    tcase_add_test(tc, t_narrow_figures);
    tcase_add_test(tc, t_route_reroute);
    tcase_add_test(tc, t_mouse);
    tcase_add_test(tc, t_status_and_confirm);
    tcase_add_test(tc, t_queue_row);
    tcase_add_test(tc, t_log_wrap);
    tcase_add_test(tc, t_train_before_first_step);
    suite_add_tcase(s, tc);
    return sp_test_run(s);
}
