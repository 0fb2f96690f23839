/* crt.c - ncursesw: start, stop, colours, grids to the screen; signals; the terminal put back after a crash. */
#define NCURSES_WIDECHAR 1
#include "crt.h"

#include <curses.h>
#include <errno.h>
#include <fcntl.h>
#include <langinfo.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <term.h>
#include <termios.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------------- */
/* signals */

static int g_wake_fd = -1;
static void (*g_on_int)(void);
static volatile sig_atomic_t g_int, g_term, g_hup, g_winch;

/* What a crash handler writes to put the terminal back (prepared while things are calm). */
static struct termios g_saved_tio;
static int g_saved_tio_ok, g_tty_fd = -1;
static char g_reset[256];
static size_t g_reset_len;
static volatile sig_atomic_t g_curses_on;
static int g_err_fd = -1, g_mem_fd = -1; /* the real stderr, and the memory file in its place */
static SCREEN *g_screen;

static void wake(void)
{
    if (g_wake_fd >= 0) {
        uint64_t one = 1;
        ssize_t w = write(g_wake_fd, &one, sizeof one);
        (void)w;
    }
}

static void on_signal(int sig)
{
    int saved = errno;
    switch (sig) {
    case SIGINT:
        g_int++;
        if (g_on_int)
            g_on_int();
        break;
    case SIGTERM: g_term = 1; break;
    case SIGHUP: g_hup = 1; break;
    case SIGWINCH: g_winch = 1; break;
    default: break;
    }
    wake();
    errno = saved;
}

/* Copies the memory file holding stderr to the real stderr (async-signal-safe: read/write/lseek). */
static void dump_stderr(void)
{
    if (g_mem_fd < 0 || g_err_fd < 0)
        return;
    off_t end = lseek(g_mem_fd, 0, SEEK_END);
    off_t from = end > (64 << 10) ? end - (64 << 10) : 0; /* the last 64 KB */
    lseek(g_mem_fd, from, SEEK_SET);
    char buf[4096];
    ssize_t n;
    while ((n = read(g_mem_fd, buf, sizeof buf)) > 0) {
        ssize_t w = write(g_err_fd, buf, (size_t)n);
        (void)w;
    }
}

static void on_crash(int sig)
{
    if (g_curses_on) {
        g_curses_on = 0;
        if (g_reset_len) {
            ssize_t w = write(g_tty_fd, g_reset, g_reset_len);
            (void)w;
        }
        if (g_saved_tio_ok)
            tcsetattr(g_tty_fd, TCSANOW, &g_saved_tio);
        if (g_err_fd >= 0) {
            dup2(g_err_fd, 2);
            dump_stderr();
        }
        static const char msg[] = "sepal: crashed (the terminal was restored)\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

void tui_crt_signals(int wake_fd, void (*on_int)(void))
{
    g_wake_fd = wake_fd;
    g_on_int = on_int;
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: poll returns EINTR */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sigaction(SIGWINCH, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sc = {0};
    sc.sa_handler = on_crash;
    sigemptyset(&sc.sa_mask);
    sc.sa_flags = SA_RESETHAND;
    sigaction(SIGSEGV, &sc, NULL);
    sigaction(SIGBUS, &sc, NULL);
    sigaction(SIGFPE, &sc, NULL);
    sigaction(SIGILL, &sc, NULL);
    sigaction(SIGABRT, &sc, NULL);
}

void tui_crt_signals_off(void)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGWINCH, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        signal(sigs[i], SIG_DFL);
    g_wake_fd = -1;
    g_on_int = NULL;
}

tui_signals tui_crt_take_signals(void)
{
    tui_signals s = {.intr = g_int, .term = g_term, .hup = g_hup, .winch = g_winch};
    g_int = g_term = g_hup = g_winch = 0;
    return s;
}

void tui_crt_block_signals(void)
{
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGINT);
    sigaddset(&s, SIGTERM);
    sigaddset(&s, SIGHUP);
    sigaddset(&s, SIGWINCH);
    sigaddset(&s, SIGTSTP);
    sigaddset(&s, SIGCONT);
    sigaddset(&s, SIGQUIT);
    pthread_sigmask(SIG_BLOCK, &s, NULL);
}

/* ---------------------------------------------------------------------------------------------- */
/* colours */

typedef struct role_style {
    short fg;
    attr_t attr;   /* with colours */
    attr_t mono;   /* without */
} role_style;

static const role_style STYLES[R_NROLES] = {
    [R_TEXT] = {-1, 0, 0},
    [R_DIM] = {-1, A_DIM, A_DIM},
    [R_TITLE] = {COLOR_CYAN, A_BOLD, A_BOLD},
    [R_TITLE_FOCUS] = {COLOR_YELLOW, A_BOLD, A_BOLD},
    [R_BORDER] = {COLOR_CYAN, 0, 0},
    [R_HEADER] = {-1, A_BOLD, A_BOLD | A_UNDERLINE},
    [R_SEL] = {-1, A_REVERSE, A_REVERSE},
    [R_GOOD] = {COLOR_GREEN, 0, 0},
    [R_WARN] = {COLOR_YELLOW, 0, A_BOLD},
    [R_ERR] = {COLOR_RED, A_BOLD, A_BOLD},
    [R_ONLINE] = {COLOR_GREEN, 0, 0},
    [R_JOINING] = {COLOR_YELLOW, 0, 0},
    [R_UNREACH] = {COLOR_RED, 0, A_BOLD},
    [R_OFFLINE] = {-1, A_DIM, A_DIM},
    [R_PLOT] = {COLOR_CYAN, 0, 0},
    [R_PLOT2] = {COLOR_MAGENTA, 0, 0},
    [R_AXIS] = {-1, A_DIM, A_DIM},
    [R_BAR] = {COLOR_GREEN, 0, 0},
    [R_BAR_EMPTY] = {-1, A_DIM, A_DIM},
    [R_PROMPT] = {COLOR_CYAN, A_BOLD, A_BOLD},
    [R_GEN_PROMPT] = {-1, A_BOLD, A_BOLD},
    [R_KEY] = {COLOR_YELLOW, 0, A_BOLD},
    [R_STATUS] = {-1, 0, 0},
    [R_TOAST] = {COLOR_YELLOW, A_BOLD, A_BOLD},
};

static int g_color;

static void colours_init(int mono)
{
    g_color = !mono && has_colors() && start_color() == OK;
    if (!g_color)
        return;
    short bg = use_default_colors() == OK ? -1 : COLOR_BLACK;
    for (int r = 0; r < R_NROLES; r++) {
        short fg = STYLES[r].fg;
        if (fg < 0 && bg != -1)
            fg = COLOR_WHITE;
        init_pair((short)(r + 1), fg, bg);
    }
}

static attr_t cell_attr(const tui_cell *c, short *pair)
{
    int r = c->role < R_NROLES ? c->role : R_TEXT;
    attr_t a = g_color ? STYLES[r].attr : STYLES[r].mono;
    *pair = g_color ? (short)(r + 1) : 0;
    if (c->flags & TUI_BOLD)
        a |= A_BOLD;
    if (c->flags & TUI_REV)
        a |= A_REVERSE;
    if (c->flags & TUI_UNDER)
        a |= A_UNDERLINE;
    return a;
}

/* ---------------------------------------------------------------------------------------------- */
/* start, stop */

static void append_cap(const char *name)
{
    char *s = tigetstr((char *)name);
    if (!s || s == (char *)-1)
        return;
    size_t n = strlen(s);
    if (g_reset_len + n < sizeof g_reset) {
        memcpy(g_reset + g_reset_len, s, n);
        g_reset_len += n;
    }
}

static void stderr_to_memory(void)
{
    g_mem_fd = memfd_create("sepal-tui-stderr", MFD_CLOEXEC);
    if (g_mem_fd < 0)
        return;
    fflush(stderr);
    g_err_fd = fcntl(2, F_DUPFD_CLOEXEC, 3);
    if (g_err_fd < 0 || dup2(g_mem_fd, 2) < 0) {
        close(g_mem_fd);
        g_mem_fd = -1;
    }
}

static void stderr_back(void)
{
    if (g_err_fd < 0)
        return;
    fflush(stderr);
    dup2(g_err_fd, 2);
    dump_stderr();
    close(g_err_fd);
    g_err_fd = -1;
    if (g_mem_fd >= 0)
        close(g_mem_fd);
    g_mem_fd = -1;
}

int tui_crt_init(tui_crt *c, int mono)
{
    memset(c, 0, sizeof *c);
    const char *cs = nl_langinfo(CODESET);
    c->utf8 = cs && (!strcmp(cs, "UTF-8") || !strcmp(cs, "utf8"));
    g_tty_fd = isatty(0) ? 0 : 1;
    g_saved_tio_ok = tcgetattr(g_tty_fd, &g_saved_tio) == 0;
    const char *nc = getenv("NO_COLOR");
    if (nc && *nc)
        mono = 1;
    if (!(g_screen = newterm(NULL, stdout, stdin)))
        return -1;
    stderr_to_memory();
    cbreak();
    noecho();
    nonl();
    intrflush(stdscr, FALSE);
    keypad(stdscr, TRUE);
    nodelay(stdscr, TRUE);
    set_escdelay(25);
    curs_set(0);
    define_key("\033[Z", KEY_BTAB);
    colours_init(mono);
    c->color = g_color;
    g_reset_len = 0;
    append_cap("sgr0");
    append_cap("cnorm");
    append_cap("rmkx");
    append_cap("rmcup");
    /* the mouse, where the terminal reports it: clicks (at once: no click interval) and the wheel; a crash turns
     * the reports off with the rest */
    mmask_t want = BUTTON1_PRESSED | BUTTON4_PRESSED;
#ifdef BUTTON5_PRESSED
    want |= BUTTON5_PRESSED;
#endif
    if (mousemask(want, NULL)) {
        mouseinterval(0);
        static const char off[] = "\033[?1006l\033[?1000l";
        if (g_reset_len + sizeof off - 1 < sizeof g_reset) {
            memcpy(g_reset + g_reset_len, off, sizeof off - 1);
            g_reset_len += sizeof off - 1;
        }
    }
    g_curses_on = 1;
    c->rows = LINES;
    c->cols = COLS;
    erase();
    return 0;
}

void tui_crt_done(tui_crt *c)
{
    (void)c;
    if (!g_curses_on)
        return;
    g_curses_on = 0;
    curs_set(1);
    endwin();
    delscreen(g_screen);
    g_screen = NULL;
    if (g_saved_tio_ok)
        tcsetattr(g_tty_fd, TCSANOW, &g_saved_tio);
    stderr_back();
}

void tui_crt_resize(tui_crt *c)
{
    struct winsize ws;
    if (ioctl(1, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 && ws.ws_col > 0)
        resize_term(ws.ws_row, ws.ws_col);
    c->rows = LINES;
    c->cols = COLS;
    clearok(curscr, TRUE);
}

/* One cell of a grid onto the screen at (y, x). */
static void put_cell(const tui_cell *cell, int y, int x)
{
    short pair;
    attr_t a = cell_attr(cell, &pair);
    wchar_t wc[2] = {(wchar_t)cell->ch, 0};
    cchar_t cc;
    setcchar(&cc, wc, a, pair, NULL);
    mvadd_wch(y, x, &cc);
}

void tui_crt_blit_part(const tui_crt *c, const tui_cb *cb, int y0, int x0, int h, int w)
{
    (void)c;
    for (int i = y0; i < y0 + h && i < cb->h; i++)
        for (int j = x0; j < x0 + w && j < cb->w; j++) {
            const tui_cell *cell = &cb->c[(size_t)i * cb->w + j];
            if (cell->ch)
                put_cell(cell, i, j);
        }
}

void tui_crt_blit(const tui_crt *c, const tui_cb *cb, int y, int x)
{
    (void)c;
    for (int i = 0; i < cb->h; i++) {
        if (y + i < 0 || y + i >= LINES)
            continue;
        for (int j = 0; j < cb->w; j++) {
            const tui_cell *cell = &cb->c[(size_t)i * cb->w + j];
            if (cell->ch && x + j >= 0 && x + j < COLS)
                put_cell(cell, y + i, x + j);
        }
    }
}
