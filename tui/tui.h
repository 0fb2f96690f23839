/* tui.h - the terminal UI of `sepal`: the swarm, the route, the generation, the training and the log on one
 * screen, and a `:` line that runs any command of the command layer (cmd/cmd.h).
 *
 * Threads: the UI thread alone calls curses. Commands run on a worker thread (one at a time, in order); a
 * feeder thread copies the runtime's server table into snapshots when it changes; a replay thread feeds a
 * recorded event file. All of them (and the runtime, through the app's sink) post events into one bounded
 * queue (events.h) and never wait for the UI. The UI thread sleeps in poll() on the terminal and the queue's
 * eventfd: no timer runs while nothing happens. It draws at most 30 frames a second, only the panels an event
 * changed, with one doupdate() a frame. */
#ifndef SEPAL_TUI_H
#define SEPAL_TUI_H

#include "app.h"

typedef struct tui_script {
    int file;         /* -f FILE, else -c LINE */
    const char *arg;
} tui_script;

typedef struct tui_opts {
    const tui_script *scripts; /* run first, in order, on the worker (stopping at the first failure) */
    int nscripts;
    const char *record;        /* --record-events FILE: every event the UI takes, as JSON lines */
    const char *replay;        /* --replay-events FILE: feed a recording back (SEPAL_TUI_REPLAY_SPEED: the pace,
                                  1 as recorded, 0 at once) */
} tui_opts;

/* Runs the TUI on the terminal (stdin and stdout) until the user quits; the app's sink is the TUI's meanwhile.
 * Returns the exit status: 0 (q, `quit`), 130 (quit with Ctrl-C), 143 / 129 (SIGTERM / SIGHUP), 1 if a file cannot
 * be opened (said on stderr); -1 if curses cannot use the terminal (said on stderr; nothing was run, the app is
 * as it was: the caller may use another front end). */
int tui_run(sp_app *app, const tui_opts *o);

#endif
