/* widgets.h - what the panels are made of, drawn into a cell grid (cellbuf.h) at a position, never on the
 * terminal: a table with column priorities, span and coverage bars, a braille line plot with auto-scaled nice
 * ticks, a progress bar, a sparkline, a row of figures fitted to its width and a wrapped text stream. Each draws
 * with the grid's glyph set (UTF-8 or ASCII) and roles, and clips to the width it is given. */
#ifndef SEPAL_TUI_WIDGETS_H
#define SEPAL_TUI_WIDGETS_H

#include <stddef.h>

#include "cellbuf.h"
#include "columns.h"

/* ---- table ---- */
/* A column: title, minimum and maximum width, alignment, priority; common/columns.h fits them to a width
 * (sp_cols_fit: the lowest priority dropped first) and places them (sp_cols_x), as for the `servers` text. */
typedef sp_col tui_col;
/* The header row: titles, and the sort column marked with an up / down glyph. */
void tui_table_header(tui_cb *cb, int y, int x, const tui_col *cols, int n, const int *w, int sort_col, int desc);
/* The first row to show so that the selection stays visible (scrolling as little as possible). */
int tui_table_scroll(int sel, int top, int visible, int nrows);

/* ---- span and coverage bars ---- */
/* Blocks [start, end) of nblocks in w cells: cell i covers blocks [i*n/w, (i+1)*n/w); full when the span covers
 * it, a half glyph when the span covers part of it (on that side), empty otherwise. */
void tui_spanbar(tui_cb *cb, int y, int x, int w, int start, int end, int nblocks, int role);
/* Servers per block in w cells: the fewest of the blocks a cell covers, as a digit ('+' above 9); a block no
 * one serves is '!' in the error role. */
void tui_coverage(tui_cb *cb, int y, int x, int w, const int *count, int nblocks);

/* ---- plot ---- */
#define TUI_MAX_TICKS 16
typedef struct tui_axis {
    double lo, hi;  /* the axis range (values, also for a log axis) */
    double step;    /* between ticks (log: in decades) */
    int n;
    double tick[TUI_MAX_TICKS];
    int log;
} tui_axis;
/* Nice ticks over [lo, hi]: a step of 1, 2, 2.5 or 5 x 10^k giving at most max_ticks ticks (at least 2), the
 * range widened to whole steps. A zero-width range is widened around its value. Returns the tick count. */
int tui_nice_ticks(double lo, double hi, int max_ticks, tui_axis *ax);
/* Log ticks over [lo, hi] (both > 0): powers of ten (with 2 and 5 times them when few decades), the range
 * widened to ticks. */
int tui_log_ticks(double lo, double hi, int max_ticks, tui_axis *ax);
/* A tick label: %.3g, with exponents shortened ("1e-04" -> "1e-4"). */
void tui_tick_label(double v, char *buf, size_t cap);

/* The y range a plot shows, kept between frames: it grows at once to take in new data, and shrinks only after
 * 5 updates in a row where the data would fit in half of it (hysteresis: the axis does not jump). */
typedef struct tui_plot_scale {
    double lo, hi;
    int shrink, valid;
} tui_plot_scale;

typedef struct tui_plot_opts {
    const char *xunit; /* under the x axis, centred ("step") */
    int logy;          /* log y axis (values <= 0 are left out) */
    int fixed;         /* y range [fixed_lo, fixed_hi] whatever the data */
    double fixed_lo, fixed_hi;
    int role;          /* of the line */
} tui_plot_opts;

/* A line plot of (xs[i], ys[i]), i < n (xs increasing) in the rectangle: y tick labels in a left gutter, the
 * axes, x labels (first, unit, last). With more points than dot columns, each column shows the min-max of its
 * points as a vertical run, so spikes stay visible; consecutive columns are joined by vertical runs, so the
 * curve reads as a line. scale may be NULL (no hysteresis). */
void tui_plot(tui_cb *cb, int y, int x, int h, int w, const double *xs, const double *ys, int n,
              const tui_plot_opts *o, tui_plot_scale *scale);
/* Several lines on one pair of axes (the y range and the steps of all of them), each in its role (a cell two
 * lines cross shows the later one's). */
typedef struct tui_plot_line {
    const double *xs, *ys;
    int n, role;
} tui_plot_line;
void tui_plot_lines(tui_cb *cb, int y, int x, int h, int w, const tui_plot_line *lines, int nlines,
                    const tui_plot_opts *o, tui_plot_scale *scale);

/* ---- bars ---- */
/* [█████▍    ] frac of the width w (brackets included), in eighths of a cell in UTF-8 mode. */
void tui_progress(tui_cb *cb, int y, int x, int w, double frac, int role);
/* One row of levels for the last w values (of n), scaled to their maximum. */
void tui_spark(tui_cb *cb, int y, int x, int w, const double *v, int n, int role);

/* ---- a row of figures ---- */
typedef struct tui_field {
    const char *full;    /* "68.5 tok/s"; NULL or "": left out */
    const char *compact; /* a shorter form ("68.5t/s"), or NULL: the full one */
    int prio;            /* the lowest priority is dropped first (the later of equal ones first) */
} tui_field;
/* The fields (at most 16) in order, joined to fit `width` columns: in full forms two blanks apart; else in
 * compact forms; else one blank apart; else without the field of the lowest priority, and so on (a last one
 * too wide is cut). The row into buf; returns its width (0: nothing). */
int tui_fields_join(const tui_field *f, int n, int width, char *buf, size_t cap);
/* Draws that row at (y, x); returns the columns used. */
int tui_fields(tui_cb *cb, int y, int x, int width, const tui_field *f, int n, int role);

/* ---- text ---- */
typedef struct tui_line {
    size_t off, len; /* bytes of the text */
} tui_line;
/* Word-wraps the end of s[0..n) to width columns: the last `cap` lines into lines[] (in order); returns how
 * many. *more is set when lines above them exist. Only the last paragraphs are looked at, so the cost does not
 * grow with the text. */
int tui_text_wrap(const char *s, size_t n, int width, tui_line *lines, int cap, int *more);
/* Draws s wrapped into h x w, *scroll lines up from the end (0: following the end; clamped to the text's top);
 * bytes before `mark` in role_a, the rest in role_b. Returns 1 if there is text below the view (scrolled up), so
 * the caller can say so. */
int tui_text_draw(tui_cb *cb, int y, int x, int h, int w, const char *s, size_t n, size_t mark, int *scroll,
                  int role_a, int role_b);

#endif
