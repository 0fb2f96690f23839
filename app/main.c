/* main.c - the `sepal` program: picks a front end (the TUI on a terminal, the line REPL, -c / -f scripts,
 * commands from stdin, the `model` tools) over the one command layer (cmd/cmd.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app.h"
#include "kern.h"
#include "line.h"
#include "blastune.h"
#include "memtune.h"
#include "serve.h"
#include "tui.h"
#include "version.h"

/* sepal's flags, by index. */
enum {
    F_TUI, F_REPL, F_RECORD, F_REPLAY, F_CMD, F_FILE, F_QUIET, F_KEEP, F_VERSION, F_DRY, F_DUMP, F_EXAMPLES, F_HELP,
    F_NOPTS
};

static const sp_opt flags[] = {
    [F_TUI] = {"--tui", SP_OPT_FLAG,
               .help = "the TUI, running any -c / -f in it first (without a terminal: it says so, and they run "
                       "as without --tui)"},
    [F_REPL] = {"--repl", SP_OPT_FLAG, .help = "the interactive line REPL (after any -c / -f)"},
    [F_RECORD] = {"--record-events", SP_OPT_STR, "FILE",
                  .help = "(TUI) write every event the screen shows to FILE, as JSON lines"},
    [F_REPLAY] = {"--replay-events", SP_OPT_STR, "FILE",
                  .help = "(TUI) show a recorded FILE again (SEPAL_TUI_REPLAY_SPEED: 1 as recorded, 0 at once)"},
    [F_CMD] = {"-c", SP_OPT_STR, "\"CMD; CMD\"", .help = "run commands (several -c and -f run in order)"},
    [F_FILE] = {"-f", SP_OPT_STR, "FILE", .help = "run a script (- is stdin); `help` lists the commands"},
    [F_QUIET] = {"--quiet", SP_OPT_FLAG, .short_name = "-q", .help = "no progress lines or notices"},
    [F_KEEP] = {"--keep-going", SP_OPT_FLAG, .short_name = "-k",
                .help = "scripts go on after a failed command (the exit status is still 1)"},
    [F_VERSION] = {"--version", SP_OPT_FLAG, .help = "print the version"},
    [F_DRY] = {"--dry-run", SP_OPT_FLAG,
               .help = "check the commands of -c / -f (names, options, values) without running them"},
    [F_DUMP] = {"--dump-commands", SP_OPT_FLAG, .help = "every command with its options, one per line"},
    [F_EXAMPLES] = {"--dump-examples", SP_OPT_FLAG, .help = "every example of `help`, one per line"},
    [F_HELP] = {"--help", SP_OPT_FLAG, .short_name = "-h", .help = "this text"},
    [F_NOPTS] = {0},
};

static void print_line(void *user, const char *line) { fprintf(user, "%s\n", line); }

static void usage(FILE *f)
{
    fprintf(f, "usage: sepal [--tui|--repl] [--quiet] [--keep-going] [-c \"CMD; CMD\"]... [-f FILE]...\n"
               "       sepal [--record-events FILE] [--replay-events FILE]\n"
               "       sepal model info|check|generate|convert-llama2c|init ...\n"
               "       sepal serve [--http HOST:PORT] --model DIR --initial-peers HOST:PORT[,...] ...\n"
               "\n"
               "front ends:\n"
               "  (no arguments)        the TUI on a terminal, else commands from stdin\n");
    sp_opt_help(flags, 110, print_line, f);
    fprintf(f, "\n"
               "model tools (the same as the `model` command):\n"
               "  model info DIR                       architecture, sizes, parameter count, dtype\n"
               "  model check DIR [--golden FILE]      run the model locally against golden outputs\n"
               "  model generate DIR --prompt TEXT [--max-new-tokens N] [--temperature T] [--seed S]\n"
               "  model convert-llama2c MODEL.bin TOKENIZER.bin OUTDIR\n"
               "  model init OUTDIR --like NAME [--layers N]   a model of a real one's shape, random weights\n"
               "\n"
               "environment: SEPAL_CACHE (default $XDG_CACHE_HOME/sepal, else ~/.cache/sepal), SEPAL_HISTORY\n"
               "  (default ~/.sepal_history), SEPAL_SERVER_BIN (the sepal-server of `swarm up`), SEPAL_VERBOSE=1\n"
               "  (library warnings too), SEPAL_PROGRESS_INTERVAL (seconds between progress lines when stderr is\n"
               "  not a terminal; default 10), NO_COLOR, SEPAL_TUI_REPLAY_SPEED, SEPAL_ISA (scalar, avx2, avxvnni\n"
               "  or avx512: the highest kernel level used; a level this CPU lacks is refused), SEPAL_BLAS_CORE=keep\n"
               "  (OpenBLAS's own choice of kernels, even an older core's than this CPU runs)\n"
               "exit status: 0 success, 1 a command failed, 2 usage error or unsupported, 130/143 stopped by\n"
               "  SIGINT/SIGTERM (the TUI: 130 when Ctrl-C twice quits it)\n");
}

/* What the command line asks: the flags given (by index; -c and -f: the last) and every -c / -f in order. */
typedef struct front {
    const char *val[F_NOPTS];
    tui_script *scripts;
    int nscripts;
} front;

/* Reads the command line: 0, or -1 after a one-line message on a usage error ("unknown option '--quite' (did
 * you mean --quiet?)"). */
static int read_flags(int argc, char **argv, front *fe)
{
    memset(fe, 0, sizeof *fe);
    fe->scripts = calloc((size_t)argc, sizeof *fe->scripts);
    sp_opt_parser p = {.opts = flags, .argc = argc, .argv = argv};
    int k = -1;
    const char *v = NULL;
    char why[512];
    for (sp_opt_got got; fe->scripts && (got = sp_opt_next(&p, &k, &v, why, sizeof why)) != SP_OPT_END;) {
        if (got == SP_OPT_WORD) {
            char cwhy[256];
            if (sp_cmd_find(v, cwhy, sizeof cwhy)) /* `sepal generate hi`: a command, without -c */
                fprintf(stderr, "sepal: '%s' is a command: run it with -c (sepal -c \"%s ...\")\n", v, v);
            else
                fprintf(stderr, "sepal: unexpected argument '%s' (commands run with -c \"CMD\" or -f FILE)\n", v);
            return -1;
        }
        if (got != SP_OPT_OPTION) {
            fprintf(stderr, "sepal: %s\n", why);
            return -1;
        }
        fe->val[k] = v;
        if (k == F_CMD || k == F_FILE)
            fe->scripts[fe->nscripts++] = (tui_script){.file = k == F_FILE, .arg = v};
    }
    if (fe->val[F_REPL] && (fe->val[F_TUI] || fe->val[F_RECORD] || fe->val[F_REPLAY])) {
        fprintf(stderr, "sepal: --repl is the line front end; --tui, --record-events and --replay-events are the TUI's\n");
        return -1;
    }
    return fe->scripts ? 0 : -1;
}

/* Why the TUI cannot draw here ("stdout is not a terminal"), or NULL: stdin and stdout are a terminal, and TERM
 * is not missing or dumb. */
static const char *no_tui_terminal(void)
{
    const char *term = getenv("TERM");
    if (!isatty(STDOUT_FILENO))
        return "stdout is not a terminal";
    if (!isatty(STDIN_FILENO))
        return "stdin is not a terminal";
    if (!term || !*term)
        return "TERM is not set";
    return strcmp(term, "dumb") ? NULL : "TERM is dumb";
}

static int tui_terminal(void) { return !no_tui_terminal(); }

/* The TUI, with the -c / -f of the command line run in it first. */
static int run_tui(sp_app *app, const front *fe)
{
    tui_opts o = {.scripts = fe->scripts, .nscripts = fe->nscripts, .record = fe->val[F_RECORD],
                  .replay = fe->val[F_REPLAY]};
    return tui_run(app, &o);
}

/* -c and -f in order on the line front end: 0, or the first failure's status (the last one's with -k). */
static int run_scripts(sp_app *app, const front *fe)
{
    int rc = 0;
    for (int i = 0; i < fe->nscripts && !rc && !app->quit && !sp_line_exit_status(); i++) {
        const tui_script *s = &fe->scripts[i];
        rc = s->file ? sp_cmd_run_script(app, s->arg) : sp_cmd_run_line(app, s->arg);
    }
    return rc;
}

/* The front ends: -c and -f in order, then --repl; with no arguments the TUI, the REPL or stdin. */
static int run_front_ends(sp_app *app, const front *fe)
{
    int repl = fe->val[F_REPL] != NULL, scripts = fe->nscripts, tui = fe->val[F_TUI] != NULL;
    int tui_only = fe->val[F_RECORD] || fe->val[F_REPLAY];
    if (tui_only && !tui_terminal()) {
        fprintf(stderr, "sepal: --record-events and --replay-events need the TUI, on a terminal\n");
        return 2;
    }
    if (!repl && !app->dry_run && (tui || tui_only || !scripts) && tui_terminal()) {
        int rc = run_tui(app, fe);
        if (rc != -1)
            return rc;
        repl = 1; /* curses cannot use this terminal: the line front end */
    } else if (tui && !repl && !app->dry_run) { /* no terminal: say so, then what runs instead (as without --tui) */
        fprintf(stderr, "sepal: --tui needs a terminal (%s): %s without it\n", no_tui_terminal(),
                scripts ? "running the -c / -f commands" : "reading commands from stdin");
    }
    int interactive = !scripts && isatty(STDIN_FILENO);
    sp_line_signals(app, interactive || repl);
    int rc = run_scripts(app, fe);
    if (!scripts && !repl && !isatty(STDIN_FILENO) && !sp_line_exit_status())
        rc = sp_cmd_run_file(app, stdin, "<stdin>");
    else if ((!scripts || repl) && !app->quit && !sp_line_exit_status()) /* like python -i: after a failure too */
        rc = sp_line_repl(app);
    int sig = sp_line_exit_status();
    return sig ? sig : rc || app->failed ? 1 : 0;
}

/* sepal's flags, then the front end they ask for; the exit status. */
static int run_app(int argc, char **argv)
{
    front fe;
    if (read_flags(argc, argv, &fe)) { /* what was wrong, and where to look: not the whole help */
        fprintf(stderr, "Try 'sepal --help' for more information.\n");
        free(fe.scripts);
        return 2;
    }
    if (fe.val[F_HELP] || fe.val[F_VERSION]) {
        if (fe.val[F_HELP])
            usage(stdout);
        else
            printf("sepal %s\n", SEPAL_VERSION);
        free(fe.scripts);
        return 0;
    }
    sp_app app;
    sp_app_init(&app, sp_line_sink());
    app.serve = sp_serve_run;
    app.quiet = fe.val[F_QUIET] != NULL;
    sp_line_set_quiet(app.quiet);
    app.dry_run = fe.val[F_DRY] != NULL;
    app.keep_going = fe.val[F_KEEP] != NULL;
    int rc = 0;
    if (fe.val[F_DUMP])
        sp_cmd_dump(&app);
    else if (fe.val[F_EXAMPLES])
        sp_cmd_dump_examples(&app);
    else
        rc = run_front_ends(&app, &fe);
    sp_app_free(&app); /* stops the servers of swarm up (each announces OFFLINE) */
    fflush(stdout);
    free(fe.scripts);
    return rc;
}

/* `sepal model ...` and `sepal serve ...`: that command through the same layer; its exit status (0, 1, 2; 130 / 143
 * when SIGINT / SIGTERM stopped it). */
static int run_tool(int argc, char **argv)
{
    sp_app app;
    sp_app_init(&app, sp_line_sink());
    app.serve = sp_serve_run;
    sp_line_signals(&app, 0);
    char why[512], path[64];
    const sp_cmd *c = sp_cmd_find(argv[1], why, sizeof why), *sub = c;
    int skip = 1;
    if (c->subs && argc < 3) {
        char syn[1024];
        sp_cmd_synopsis(c, "sepal model", 7, 100, 12, syn, sizeof syn);
        fprintf(stderr, "usage: %s\n", syn);
        return 2;
    }
    if (c->subs && !(sub = sp_cmd_find_in(c->subs, argv[2], why, sizeof why))) {
        fprintf(stderr, "sepal: %s: %s\n", c->name, why);
        return 2;
    }
    skip += c->subs != NULL;
    snprintf(path, sizeof path, "%s%s%s", c->name, c->subs ? " " : "", c->subs ? sub->name : "");
    sp_args a;
    if (sp_args_parse(&app, sub, path, argc - skip, argv + skip, &a))
        return 2;
    int rc = sub->fn(&app, &a);
    sp_args_free(&a);
    sp_app_free(&app);
    int sig = sp_line_exit_status();
    return sig ? sig : rc;
}

int main(int argc, char **argv)
{
    sp_blas_tune(argv); /* first: it may run the program again */
    sp_memtune();
    sp_err err = {0};
    if (sp_kern_check_env(&err)) {
        fprintf(stderr, "sepal: %s\n", err.msg);
        return 2;
    }
    if (argc >= 2 && !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (argc >= 2 && (!strcmp(argv[1], "model") || !strcmp(argv[1], "serve")))
        return run_tool(argc, argv);
    return run_app(argc, argv);
}
