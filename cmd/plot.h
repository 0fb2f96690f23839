/* plot.h - runs' curves (`plot FILE...`, sink.h's sp_ui_plot) as a text plot, for the line front end: one marker
 * per run (*, o, +, x, #, @, %, &) on a grid of width x height characters with the y range at the left and the
 * steps under it, then a legend line per run (its first, last and best values). The TUI draws the same runs in
 * its training panel. */
#ifndef SEPAL_PLOT_H
#define SEPAL_PLOT_H

#include "sink.h"

/* The plot's text, lines ended by \n (malloc'd; NULL when out of memory). */
char *sp_plot_text(const sp_ui_plot *p);

#endif
