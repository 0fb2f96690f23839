/* paths.h - where sepal keeps things: the cache directory (models, data, measured throughput), the history. */
#ifndef SEPAL_PATHS_H
#define SEPAL_PATHS_H

#include <stddef.h>

/* $SEPAL_CACHE (a leading ~ or ~/ expanded, as shells do), else $XDG_CACHE_HOME/sepal, else
 * $HOME/.cache/sepal. */
void sp_cache_dir(char *buf, size_t cap);
/* path with a leading "~" or "~/" replaced by $HOME, into buf. */
void sp_expand_home(const char *path, char *buf, size_t cap);
/* The history of commands that the line REPL and the TUI's `:` line share: $SEPAL_HISTORY (a leading ~
 * expanded), else $HOME/.sepal_history; malloc'd, NULL without either (or out of memory). */
char *sp_history_path(void);

#endif
