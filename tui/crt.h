/* crt.h - the only code that talks to the terminal: ncursesw set-up and teardown, the colour schemes (roles to
 * colours, or to attributes alone with NO_COLOR / no colours), copying cell grids to the screen, and the
 * signals. Only the UI thread calls it.
 *
 * Signals are ours, installed before initscr (so ncurses installs none for them): SIGINT, SIGTERM, SIGHUP and
 * SIGWINCH set a flag and wake the loop through its eventfd; a crash (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT)
 * puts the terminal back (saved termios, leave the alternate screen, cursor on) with async-signal-safe calls,
 * then dies of the same signal. While curses runs, stderr goes to a memory file, copied to the real stderr at
 * the end (or at a crash). */
#ifndef SEPAL_TUI_CRT_H
#define SEPAL_TUI_CRT_H

#include <signal.h>

#include "cellbuf.h"

typedef struct tui_crt {
    int utf8, color, rows, cols;
} tui_crt;

/* Before initscr: the handlers. wake_fd is written (8 bytes, an eventfd) on each signal; on_int (may be NULL) is
 * called from the SIGINT handler itself (it must be async-signal-safe: it cancels the command running). */
void tui_crt_signals(int wake_fd, void (*on_int)(void));
/* Puts every handler of tui_crt_signals back to the default (SIGPIPE stays ignored). */
void tui_crt_signals_off(void);
/* Signals seen since the last call (and clears them). */
typedef struct tui_signals {
    int intr, term, hup, winch;
} tui_signals;
tui_signals tui_crt_take_signals(void);
/* Blocks the signals the UI thread handles in the calling thread (and the threads it starts): for workers. */
void tui_crt_block_signals(void);

/* Starts curses on the terminal; mono forces attributes only. 0, or -1 (the terminal cannot be used). */
int tui_crt_init(tui_crt *c, int mono);
/* Ends curses and puts the terminal back; then copies what went to stderr meanwhile to stderr. */
void tui_crt_done(tui_crt *c);
/* The terminal's size now (after a SIGWINCH): resizes curses' screen. */
void tui_crt_resize(tui_crt *c);
/* Copies a grid to the screen at (y, x), clipped. */
void tui_crt_blit(const tui_crt *c, const tui_cb *cb, int y, int x);
/* Copies rows/columns [y0, y0+h) x [x0, x0+w) of a screen-sized grid. */
void tui_crt_blit_part(const tui_crt *c, const tui_cb *cb, int y0, int x0, int h, int w);

#endif
