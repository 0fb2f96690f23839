/* line.c - the line front end: its sink (stdout / stderr, colours, progress lines redrawn in place, notices
 * held while a generation's line is open), its signals, and the interactive loop on libedit. */
#include "line.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <histedit.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "paths.h"
#include "plot.h"
#include "timeutil.h"
#include "version.h"

/* ---------------------------------------------------------------------------------------------- */
/* the sink */

static struct {
    pthread_mutex_t lock;
    int init;
    int quiet;            /* sp_line_set_quiet */
    int tty_err, tty_out, color;
    int progress_shown;   /* a progress line is on stderr's current line (tty) */
    char progress_what[96];
    double progress_t0, progress_last, progress_done0;
    double progress_plain_last;
    double plain_every;   /* not a tty: a plain progress line every this many seconds (SEPAL_PROGRESS_INTERVAL) */
    int out_col0;         /* stdout is at the start of a line */
} L = {.lock = PTHREAD_MUTEX_INITIALIZER, .out_col0 = 1};

/* Notices and warnings that came while stdout was in the middle of a line (a generation's text): printed when
 * the line ends, never inside a word. */
#define HELD_MAX 32
static struct {
    int n, dropped;
    struct held {
        const char *color, *prefix;
        char *where, *text;
    } v[HELD_MAX];
} H;

static void line_init(void)
{
    if (L.init)
        return;
    L.init = 1;
    L.tty_err = isatty(STDERR_FILENO);
    L.tty_out = isatty(STDOUT_FILENO);
    const char *term = getenv("TERM"), *nc = getenv("NO_COLOR");
    L.color = L.tty_err && !(nc && *nc) && !(term && !strcmp(term, "dumb"));
    const char *pe = getenv("SEPAL_PROGRESS_INTERVAL");
    char *end = NULL;
    double every = pe && *pe ? strtod(pe, &end) : NAN;
    L.plain_every = end && !*end && isfinite(every) && every >= 0 ? every : 10;
}

static void line_ended(void);

/* A Ctrl-C during a command: the terminal echoed "^C" where the cursor was; the next output starts a line. */
static volatile sig_atomic_t g_caret;

static void after_caret(void)
{
    if (!g_caret)
        return;
    g_caret = 0;
    if (L.tty_out || L.tty_err) {
        fputc('\n', L.tty_out ? stdout : stderr);
        fflush(L.tty_out ? stdout : stderr);
        line_ended();
    }
}

#define C_RED "\033[31m"
#define C_YEL "\033[33m"
#define C_DIM "\033[2m"
#define C_OFF "\033[0m"

/* Clears a progress line from stderr before something else is written. */
static void clear_progress(void)
{
    if (L.progress_shown) {
        fputs("\r\033[K", stderr);
        L.progress_shown = 0;
    }
}

static void err_line(const char *color, const char *prefix, const char *where, const char *text);

/* Prints the held lines (stdout is at the start of a line). */
static void flush_held(void)
{
    int n = H.n, dropped = H.dropped;
    H.n = H.dropped = 0;
    for (int i = 0; i < n; i++) {
        err_line(H.v[i].color, H.v[i].prefix, H.v[i].where, H.v[i].text);
        free(H.v[i].where);
        free(H.v[i].text);
    }
    if (dropped) {
        char t[64];
        snprintf(t, sizeof t, "(%d more notice%s)", dropped, dropped == 1 ? "" : "s");
        err_line(C_DIM, "", NULL, t);
    }
}

/* stdout's line ended: what waited for it comes now. */
static void line_ended(void)
{
    L.out_col0 = 1;
    if (H.n || H.dropped)
        flush_held();
}

static void hold(const char *color, const char *prefix, const char *where, const char *text)
{
    struct held *h = H.n < HELD_MAX ? &H.v[H.n] : NULL;
    char *t = h ? strdup(text) : NULL, *w = h && where ? strdup(where) : NULL;
    if (!t || (where && !w)) {
        free(t);
        H.dropped++;
        return;
    }
    *h = (struct held){.color = color, .prefix = prefix, .where = w, .text = t};
    H.n++;
}

static void out_chunk(const char *s, size_t n)
{
    fwrite(s, 1, n, stdout);
    if (n)
        L.out_col0 = s[n - 1] == '\n';
}

static void out_text(const char *s)
{
    clear_progress();
    after_caret();
    const char *nl = strrchr(s, '\n');
    if (nl && (H.n || H.dropped)) { /* the line ends inside s: the held lines after it, then the rest */
        out_chunk(s, (size_t)(nl + 1 - s));
        fflush(stdout);
        line_ended();
        s = nl + 1;
    }
    out_chunk(s, strlen(s));
    fflush(stdout);
}

/* A notice or warning: now, or when stdout's line ends (a generation's text is not cut by it). */
static void note_line(const char *color, const char *prefix, const char *where, const char *text)
{
    if (L.out_col0)
        err_line(color, prefix, where, text);
    else
        hold(color, prefix, where, text);
}

/* stderr lines: stdout first, so both keep their order in one pipe; a line of stdout left open is ended. */
static void err_line(const char *color, const char *prefix, const char *where, const char *text)
{
    fflush(stdout);
    clear_progress();
    after_caret();
    if (!L.out_col0 && L.tty_out && L.tty_err) { /* both on the terminal: do not glue it to the text */
        fputc('\n', stdout);
        fflush(stdout);
        line_ended();
    }
    fprintf(stderr, "%s%s%s%s%s%s\n", L.color && color ? color : "", prefix, where ? where : "", where ? ": " : "",
            text, L.color && color ? C_OFF : "");
    fflush(stderr);
}

static void show_progress(const sp_ui_event *ev)
{
    double now = sp_now_s();
    if (strcmp(L.progress_what, ev->what ? ev->what : "")) { /* new work */
        snprintf(L.progress_what, sizeof L.progress_what, "%s", ev->what ? ev->what : "");
        L.progress_t0 = now;
        L.progress_done0 = ev->done;
        L.progress_last = 0;
        L.progress_plain_last = now;
    }
    int last = ev->total > 0 && ev->done >= ev->total;
    double el = now - L.progress_t0, rate = el > 0 ? (ev->done - L.progress_done0) / el : 0;
    char eta[32] = "", line[256];
    if (rate > 0 && ev->total > 0 && !last) {
        char d[16];
        sp_fmt_duration((ev->total - ev->done) / rate, d, sizeof d);
        snprintf(eta, sizeof eta, ", ETA %s", d);
    }
    const char *unit = ev->unit ? ev->unit : "";
    if (ev->total > 0)
        snprintf(line, sizeof line, "%s: %.0f/%.0f%s%s", L.progress_what, ev->done, ev->total, *unit ? " " : "", unit);
    else
        snprintf(line, sizeof line, "%s: %.0f%s%s", L.progress_what, ev->done, *unit ? " " : "", unit);
    size_t n = strlen(line);
    if (rate > 0 && n < sizeof line)
        n += (size_t)snprintf(line + n, sizeof line - n, " (%.1f%s%s/s%s)", rate, *unit ? " " : "", unit, eta);
    if (last && n < sizeof line) {
        char d[16];
        sp_fmt_duration(el, d, sizeof d);
        if (el < 10)
            snprintf(line + n, sizeof line - n, " in %.1fs", el);
        else
            snprintf(line + n, sizeof line - n, " in %s", d);
    }
    if (L.tty_err) {
        if (!last && now - L.progress_last < 0.1)
            return; /* at most 10 redraws a second */
        L.progress_last = now;
        fflush(stdout);
        fprintf(stderr, "\r\033[K%s%s%s", L.color ? C_DIM : "", line, L.color ? C_OFF : "");
        L.progress_shown = 1;
        if (last) {
            fputc('\n', stderr);
            L.progress_shown = 0;
        }
        fflush(stderr);
    } else if ((last && el >= L.plain_every / 5) || now - L.progress_plain_last >= L.plain_every) {
        /* plain lines: every 10 s, and the end of work that took 2 s or more */
        L.progress_plain_last = now;
        fflush(stdout);
        fprintf(stderr, "%s\n", line);
    }
    if (last)
        L.progress_what[0] = 0;
}

static void runtime_event(const sp_event *e)
{
    switch (e->kind) {
    case SP_EV_PROGRESS: {
        sp_ui_event p = {.kind = SP_UI_PROGRESS, .what = e->text, .done = e->done, .total = e->total, .unit = ""};
        show_progress(&p);
        break;
    }
    case SP_EV_TOKEN:
    case SP_EV_STEP:
        break; /* generate streams its tokens itself */
    case SP_EV_ERROR:
    case SP_EV_RETRY:
        note_line(C_YEL, "sepal: ", NULL, e->text);
        break;
    case SP_EV_ROUTE: /* the route command prints the route; a re-route is news */
        if (e->row) {
            char t[2100];
            snprintf(t, sizeof t, "re-routed: %s", e->text);
            note_line(C_DIM, "", NULL, t);
        }
        break;
    default:
        note_line(C_DIM, "", NULL, e->text);
    }
}

static void gen_end(const sp_ui_event *ev)
{
    const sp_ui_gen *g = ev->gen;
    if (g_caret) /* the newline after "^C" ends the text */
        after_caret();
    else
        out_text("\n"); /* the text ends with a newline, as run.c's does (also after one of its own) */
    flush_held(); /* what came during the generation, before its figures */
    char t[512];
    int n = snprintf(t, sizeof t, "%d prompt token%s in %.3f s (%.0f tok/s), %d new in %.3f s (%.1f tok/s)",
                     g->prompt_tokens, g->prompt_tokens == 1 ? "" : "s", g->prefill_s,
                     g->prefill_s > 0 ? g->prompt_tokens / g->prefill_s : 0,
                     g->new_tokens, g->decode_s, g->decode_s > 0 ? g->new_tokens / g->decode_s : 0);
    if (g->first_token_s > 0 && n < (int)sizeof t)
        n += snprintf(t + n, sizeof t - n, ", first after %.3f s", g->first_token_s);
    if (n < (int)sizeof t)
        n += snprintf(t + n, sizeof t - n, "; stop: %s", sp_gen_stop_name(g->stop));
    if (g->sampled && n < (int)sizeof t)
        snprintf(t + n, sizeof t - n, "; seed %llu", g->seed);
    err_line(C_DIM, "sepal: ", NULL, t);
}

static void train_event(const sp_train_event *e)
{
    char t[640];
    if (e->eval_total > 0 && L.quiet) {
        return;
    } else if (e->eval_total > 0) {
        sp_ui_event p = {.kind = SP_UI_PROGRESS, .what = "validation", .done = e->eval_done, .total = e->eval_total,
                         .unit = "batches"};
        show_progress(&p);
    } else if (e->metrics) {
        snprintf(t, sizeof t, "epoch %d: validation %s\n", e->epoch, e->metrics);
        out_text(t);
    } else {
        snprintf(t, sizeof t, "epoch %d step %d/%d: loss %.4f lr %.2e (%.0f tok/s)\n", e->epoch, e->step,
                 e->steps_total, e->loss, e->lr, e->tokens_per_s);
        out_text(t);
        if (L.tty_err && !L.quiet) { /* a line below the steps: how far, how fast, how long still */
            sp_ui_event p = {.kind = SP_UI_PROGRESS, .what = "training", .done = e->step, .total = e->steps_total,
                             .unit = "steps"};
            show_progress(&p);
        }
    }
}

static void line_emit(void *user, const sp_ui_event *ev)
{
    (void)user;
    pthread_mutex_lock(&L.lock);
    line_init();
    switch (ev->kind) {
    case SP_UI_TEXT: out_text(ev->text); break;
    case SP_UI_NOTICE: note_line(C_DIM, "", NULL, ev->text); break;
    case SP_UI_WARN: note_line(C_YEL, "sepal: warning: ", ev->where, ev->text); break;
    case SP_UI_ERROR: err_line(C_RED, "sepal: ", ev->where, ev->text); break;
    case SP_UI_PROGRESS: show_progress(ev); break;
    case SP_UI_PROGRESS_END:
        clear_progress();
        L.progress_what[0] = 0;
        break;
    case SP_UI_GEN_BEGIN:
        if (ev->text)
            out_text(ev->text);
        break;
    case SP_UI_GEN_TEXT: out_text(ev->text); break;
    case SP_UI_GEN_END: gen_end(ev); break;
    case SP_UI_TRAIN: train_event(ev->train); break;
    case SP_UI_TRAIN_BEGIN:
        if (!L.quiet)
            err_line(C_DIM, "", NULL, ev->text);
        break;
    case SP_UI_TRAIN_END: break; /* the command says how it ended */
    case SP_UI_RUNTIME: runtime_event(ev->rt); break;
    case SP_UI_LINE: break;  /* scripts run quietly */
    case SP_UI_SERVE: break; /* the log lines of each request say it here */
    case SP_UI_PLOT: {
        char *text = sp_plot_text(ev->plot);
        out_text(text ? text : "plot: out of memory\n");
        free(text);
        break;
    }
    }
    pthread_mutex_unlock(&L.lock);
}

/* The columns tables fit, as psql decides: on a terminal $COLUMNS when it is set, else the terminal's width; not
 * a terminal (a file, a pipe): no limit. */
static int line_columns(void *user)
{
    (void)user;
    line_init();
    if (!L.tty_out)
        return 0;
    const char *env = getenv("COLUMNS");
    char *end = NULL;
    long c = env && *env ? strtol(env, &end, 10) : 0;
    if (end && !*end && c > 0 && c < 100000)
        return (int)c;
    struct winsize ws;
    return !ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) && ws.ws_col > 0 ? ws.ws_col : 0;
}

sp_sink sp_line_sink(void) { return (sp_sink){.emit = line_emit, .user = NULL, .columns = line_columns}; }

void sp_line_set_quiet(int quiet)
{
    pthread_mutex_lock(&L.lock);
    L.quiet = quiet;
    pthread_mutex_unlock(&L.lock);
}

/* ---------------------------------------------------------------------------------------------- */
/* signals */

static sp_app *g_app;
static volatile sig_atomic_t g_running;   /* a command runs */
static volatile sig_atomic_t g_signals;   /* signals during the current command */
static volatile sig_atomic_t g_stop_sig;  /* the signal that ends the program (scripts, SIGTERM), 0 */
static volatile sig_atomic_t g_prompt_int;/* Ctrl-C at the prompt */
static int g_interactive;
static int g_emergency[2] = {-1, -1};     /* a second signal: the emergency thread leaves at once */

static void on_signal(int sig)
{
    int saved = errno;
    if (!g_interactive || sig == SIGTERM)
        g_stop_sig = sig;
    if (g_running || !g_interactive) {
        if (g_app)
            sp_app_cancel(g_app);
        if (g_running && g_interactive)
            g_caret = 1;
        if (++g_signals >= 2 && g_emergency[1] >= 0) {
            char c = (char)sig;
            ssize_t w = write(g_emergency[1], &c, 1);
            (void)w;
        }
    } else {
        g_prompt_int = 1;
        if (sig == SIGTERM && g_app)
            sp_app_cancel(g_app);
    }
    errno = saved;
}

/* History, for the emergency exit. */
static History *g_hist;
static char *g_hist_path;
static void history_save(History *h, const char *path);

static void *emergency_main(void *arg)
{
    (void)arg;
    char c;
    while (read(g_emergency[0], &c, 1) < 0 && errno == EINTR)
        ;
    static const char msg[] = "\nsepal: leaving now (a second signal); local servers stop with this process\n";
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)w;
    if (g_hist)
        history_save(g_hist, g_hist_path);
    _exit(128 + (c ? c : SIGINT)); /* servers of swarm up get SIGTERM (PR_SET_PDEATHSIG) and announce OFFLINE */
}

void sp_line_signals(sp_app *app, int interactive)
{
    g_app = app;
    g_interactive = interactive;
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: a blocking read returns EINTR */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (g_emergency[0] < 0 && pipe2(g_emergency, O_CLOEXEC) == 0) {
        pthread_t th;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old); /* signals go to the main thread */
        if (pthread_create(&th, &at, emergency_main, NULL)) {
            close(g_emergency[0]);
            close(g_emergency[1]);
            g_emergency[0] = g_emergency[1] = -1;
        }
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_attr_destroy(&at);
    }
}

int sp_line_exit_status(void) { return g_stop_sig ? 128 + g_stop_sig : 0; }

/* Runs a line as one command of the REPL: cancel cleared before, signals counted during. */
static void run_interactive(sp_app *app, const char *line)
{
    sp_app_cancel_clear(app);
    g_signals = 0;
    g_running = 1;
    sp_cmd_run_line(app, line);
    g_running = 0;
    if (sp_app_cancelled(app) && !g_stop_sig)
        sp_app_cancel_clear(app);
}

/* ---------------------------------------------------------------------------------------------- */
/* completion in the line editor */

static size_t word_start(const char *b, size_t cur)
{
    size_t i = cur;
    while (i > 0 && b[i - 1] != ';' && !(isspace((unsigned char)b[i - 1]) && !(i >= 2 && b[i - 2] == '\\')))
        i--;
    return i;
}

static void insert_escaped(EditLine *el, const char *s)
{
    char buf[8192];
    size_t n = 0;
    for (; *s && n + 3 < sizeof buf; s++) {
        if (strchr(" \t\\'\";#", *s))
            buf[n++] = '\\';
        buf[n++] = *s;
    }
    buf[n] = 0;
    el_insertstr(el, buf);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void show_candidates(EditLine *el, const sp_strlist *l, size_t skip)
{
    int cols = 80;
    el_get(el, EL_GETTC, "co", &cols);
    size_t width = 0;
    for (int i = 0; i < l->n; i++)
        width = strlen(l->v[i]) - skip > width ? strlen(l->v[i]) - skip : width;
    int per_row = cols > 0 && (size_t)cols > width + 2 ? (int)((size_t)cols / (width + 2)) : 1;
    fputc('\n', stdout);
    for (int i = 0; i < l->n; i++)
        printf("%-*s%s", (int)(width + 2), l->v[i] + skip, (i + 1) % per_row && i + 1 < l->n ? "" : "\n");
    fflush(stdout);
}

static size_t common_prefix(const sp_strlist *l)
{
    size_t n = strlen(l->v[0]);
    for (int i = 1; i < l->n; i++)
        for (size_t j = 0; j < n; j++)
            if (l->v[i][j] != l->v[0][j]) {
                n = j;
                break;
            }
    return n;
}

static unsigned char complete_from(EditLine *el, sp_strlist *l, const char *word, int files)
{
    size_t wlen = strlen(word);
    if (!l->n)
        return CC_REFRESH_BEEP;
    qsort(l->v, (size_t)l->n, sizeof *l->v, cmp_str);
    size_t common = common_prefix(l);
    if (l->n == 1) {
        insert_escaped(el, l->v[0] + wlen);
        if (!files || !common || l->v[0][common - 1] != '/')
            el_insertstr(el, " ");
        return CC_REFRESH;
    }
    if (common > wlen) {
        char *extra = strndup(l->v[0] + wlen, common - wlen);
        if (extra)
            insert_escaped(el, extra);
        free(extra);
        return CC_REFRESH;
    }
    const char *slash = files ? strrchr(word, '/') : NULL;
    show_candidates(el, l, slash ? (size_t)(slash - word) + 1 : 0);
    return CC_REDISPLAY;
}

static char *unescape(const char *begin, const char *end)
{
    char *s = malloc((size_t)(end - begin) + 1), *o = s;
    for (const char *p = begin; s && p < end; p++)
        *o++ = *p == '\\' && p + 1 < end ? *++p : *p;
    if (s)
        *o = 0;
    return s;
}

static unsigned char complete(EditLine *el, int ch)
{
    (void)ch;
    const LineInfo *li = el_line(el);
    size_t cur = (size_t)(li->cursor - li->buffer), ws = word_start(li->buffer, cur), seg = ws;
    while (seg > 0 && li->buffer[seg - 1] != ';')
        seg--;
    char *before = strndup(li->buffer + seg, ws - seg), *word = unescape(li->buffer + ws, li->cursor);
    char why[64];
    int argc = 0, files = 0;
    char **argv = NULL;
    unsigned char rc = CC_REFRESH_BEEP;
    sp_app *app = NULL;
    el_get(el, EL_CLIENTDATA, &app);
    if (before && word && app && !sp_cmd_split(before, &argc, &argv, why, sizeof why)) {
        sp_strlist l = {0};
        sp_cmd_complete(app, argc, argv, word, &l, &files);
        rc = complete_from(el, &l, word, files);
        sp_strlist_free(&l);
    }
    sp_cmd_free_argv(argc, argv);
    free(before);
    free(word);
    return rc;
}

/* ---------------------------------------------------------------------------------------------- */
/* history: one command per line, plain text */

#define HISTORY_MAX 1000

static void history_load(History *h, const char *path)
{
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f)
        return;
    HistEvent ev;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) >= 0) {
        line[strcspn(line, "\r\n")] = 0;
        if (*line)
            history(h, &ev, H_ENTER, line);
    }
    free(line);
    fclose(f);
}

static void history_save(History *h, const char *path)
{
    FILE *f = path ? fopen(path, "w") : NULL;
    if (!f)
        return;
    HistEvent ev;
    for (int rc = history(h, &ev, H_LAST); rc != -1; rc = history(h, &ev, H_PREV))
        fprintf(f, "%s\n", ev.str);
    fclose(f);
}

/* ---------------------------------------------------------------------------------------------- */
/* the loop */

static char *prompt(EditLine *el)
{
    (void)el;
    return (char *)"sepal> ";
}

static EditLine *editor_new(sp_app *app, History *h)
{
    EditLine *el = el_init("sepal", stdin, stdout, stderr);
    if (!el)
        return NULL;
    el_set(el, EL_EDITOR, "emacs");
    el_set(el, EL_SIGNAL, 0); /* our handler sees Ctrl-C; el_gets returns with EINTR */
    el_set(el, EL_PROMPT, prompt);
    el_set(el, EL_HIST, history, h);
    el_set(el, EL_CLIENTDATA, app);
    el_wset(el, EL_ADDFN, L"sepal-complete", L"complete a command, option, setting or file name", complete);
    el_set(el, EL_BIND, "^I", "sepal-complete", NULL);
    el_source(el, NULL); /* ~/.editrc */
    return el;
}

/* One line from the editor without its newline (malloc'd); NULL at the end of input. Ctrl-C clears the line
 * and prompts again. */
static char *read_line(EditLine *el, sp_app *app)
{
    for (;;) {
        int n = 0;
        errno = 0;
        g_prompt_int = 0;
        const char *s = el_gets(el, &n);
        if (g_stop_sig || app->quit)
            return NULL;
        if (s && n > 0 && !g_prompt_int)
            return strndup(s, strcspn(s, "\r\n"));
        if (g_prompt_int || (n < 0 && errno == EINTR)) { /* Ctrl-C at the prompt: a fresh, empty line */
            fputs("^C\n", stdout);
            fflush(stdout);
            el_reset(el);
            continue;
        }
        return NULL;
    }
}

int sp_line_repl(sp_app *app)
{
    HistEvent ev;
    History *h = history_init();
    char *path = sp_history_path();
    EditLine *el = h ? editor_new(app, h) : NULL;
    if (!el) {
        if (h)
            history_end(h);
        free(path);
        return sp_app_error(app, "cannot start the line editor");
    }
    history(h, &ev, H_SETSIZE, HISTORY_MAX);
    history(h, &ev, H_SETUNIQUE, 1);
    history_load(h, path);
    g_hist = h;
    g_hist_path = path;
    app->interactive = 1;
    line_init();
    if (isatty(STDOUT_FILENO)) {
        fprintf(stdout, "%ssepal %s%s - `help` lists the commands, Ctrl-C stops one, Ctrl-D leaves\n",
                L.color ? C_DIM : "", SEPAL_VERSION, L.color ? C_OFF : "");
        fflush(stdout);
    }
    for (char *line; !app->quit && !g_stop_sig && (line = read_line(el, app));) {
        if (line[strspn(line, " \t")])
            history(h, &ev, H_ENTER, line);
        run_interactive(app, line);
        fflush(stdout);
        free(line);
    }
    if (!app->quit && isatty(STDOUT_FILENO))
        fputc('\n', stdout); /* Ctrl-D: end the prompt's line */
    g_hist = NULL;
    history_save(h, path);
    el_end(el);
    history_end(h);
    free(path);
    return 0;
}
