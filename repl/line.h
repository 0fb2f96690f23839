/* line.h - the line front end: the sink that prints (results on stdout; notices, errors and progress on
 * stderr, coloured on a terminal unless NO_COLOR or TERM=dumb), the interactive REPL on libedit, and the
 * signal handling of both (Ctrl-C stops the command, not the program). */
#ifndef SEPAL_LINE_H
#define SEPAL_LINE_H

#include "app.h"

/* The sink of the line front end (its state is static: one per process). */
sp_sink sp_line_sink(void);
/* --quiet: what the sink draws itself is quiet too (training's progress line, what is trained); the app
 * drops notices and progress events before they reach it (sp_emit). */
void sp_line_set_quiet(int quiet);

/* Signals: SIGINT and SIGTERM cancel the command in progress (sp_app_cancel); at the REPL's prompt Ctrl-C
 * clears the line. A second one while the first is being honoured leaves at once (the history saved; the
 * servers of `swarm up` stop: they die with this process). For scripts (interactive 0) either signal also
 * ends the script; sp_line_exit_status then says 130 / 143. */
void sp_line_signals(sp_app *app, int interactive);
/* 0 if no signal stopped the program, else 128 + the signal. */
int sp_line_exit_status(void);

/* The interactive loop (prompt "sepal> ", history in $SEPAL_HISTORY or ~/.sepal_history, Tab completion of
 * commands, subcommands, options, settings, tasks and file names). Ends on Ctrl-D or `quit`; returns 0. */
int sp_line_repl(sp_app *app);

#endif
