/* columns.h - a table's columns fitted to a width, the one rule for every table sepal draws (the TUI's swarm
 * panel, the `servers` command's text): columns of the lowest priority are dropped first until the rest fit at
 * their minimum width, then the spare width goes to each column up to its maximum, in column order, and what is
 * left to the flexible column. Pure arithmetic: no drawing, no allocation. */
#ifndef SEPAL_COLUMNS_H
#define SEPAL_COLUMNS_H

typedef struct sp_col {
    const char *title;
    int min_w, max_w; /* max_w 0: the flexible column, which takes the width left over */
    int right;        /* right-aligned */
    int prio;         /* columns of the lowest priority are dropped first when the table is too narrow */
} sp_col;

/* Widths of n columns in `width` cells, one blank between shown columns: drops columns, lowest priority first
 * (the later of equal ones first), until the rest fit at their minimum, then hands the spare width out up to
 * each column's max_w in column order, and what is left to the flexible column. w[i] 0: dropped. Returns
 * how many are shown. */
int sp_cols_fit(const sp_col *cols, int n, int width, int *w);
/* Column c's offset from the table's left edge (-1 if dropped). */
int sp_cols_x(const int *w, int n, int c);

#endif
