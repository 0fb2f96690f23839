/* table.h - what every front end shows alike: the text tables of the commands (`servers`), fitted to the
 * output's columns by the rule the TUI's tables follow (common/columns.h: the least important columns dropped
 * first), and the name a server goes by in a table, the same in the `servers` text and the TUI's swarm panel. */
#ifndef SEPAL_TABLE_H
#define SEPAL_TABLE_H

#include "app.h"
#include "columns.h"

/* A server's name in a table: its public name, else `local` when this app started it (`swarm up`), else `-`. */
const char *sp_server_shown_name(const char *name, int local);

/* Writes a text table through sp_out: the titles, then nrows rows of ncols cells (cells[r * ncols + c]; NULL is
 * empty), one blank between columns, no blanks at the ends of lines. A column is as wide as its widest cell
 * (its title included) within its limits: min_w, when not 0, is how narrow it may be cut when the lines do not
 * fit, max_w, when not 0, the most it shows of a cell. Lines longer than `width` (0: no limit) lose the columns
 * of the lowest priority first (sp_cols_fit). Widths count UTF-8 characters. */
void sp_table_out(sp_app *app, const sp_col *cols, int ncols, const char *const *cells, int nrows, int width);

#endif
