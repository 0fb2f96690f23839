/* main.c - the `sepal` program: picks a front end (the TUI on a terminal, the line REPL, -c / -f scripts,
 * commands from stdin, the `model` tools) over the one command layer (cmd/cmd.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app.h"
#include "line.h"
#include "memtune.h"
#include "tui.h"
#include "version.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: sepal [--tui|--repl] [--quiet] [--keep-going] [-c \"CMD; CMD\"]... [-f FILE]...\n"
               "       sepal [--record-events FILE] [--replay-events FILE]\n"
               "       sepal model info|check|generate|convert-llama2c ...\n"
               "\n"
               "front ends:\n"
               "  (no arguments)        the TUI on a terminal, else commands from stdin\n"
               "  --tui                 the TUI, running any -c / -f in it first (without a terminal: as --repl)\n"
               "  --repl                the interactive line REPL (after any -c / -f)\n"
               "  --record-events FILE  (TUI) write every event the screen shows to FILE, as JSON lines\n"
               "  --replay-events FILE  (TUI) show a recorded FILE again (SEPAL_TUI_REPLAY_SPEED: 1 as recorded,\n"
               "                        0 at once)\n"
               "  -c \"CMD; CMD\"         run commands (several -c and -f run in order)\n"
               "  -f FILE               run a script (- is stdin); `help` lists the commands\n"
               "  -q, --quiet           no progress lines or notices\n"
               "  -k, --keep-going      scripts go on after a failed command (the exit status is still 1)\n"
               "  --version             print the version\n"
               "  --dry-run             check the commands of -c / -f (names, options, values) without running them\n"
               "  --dump-commands       every command with its options, one per line\n"
               "  --dump-examples       every example of `help`, one per line\n"
               "\n"
               "model tools (the same as the `model` command):\n"
               "  model info DIR                       architecture, sizes, parameter count, dtype\n"
               "  model check DIR [--golden FILE]      run the model locally against golden outputs\n"
               "  model generate DIR --prompt TEXT [--max-new-tokens N] [--temperature T] [--seed S]\n"
               "  model convert-llama2c MODEL.bin TOKENIZER.bin OUTDIR\n"
               "\n"
               "environment: SEPAL_CACHE (default $XDG_CACHE_HOME/sepal, else ~/.cache/sepal), SEPAL_HISTORY\n"
               "  (default ~/.sepal_history), SEPAL_SERVER_BIN (the sepal-server of `swarm up`), SEPAL_VERBOSE=1\n"
               "  (library warnings too), SEPAL_PROGRESS_INTERVAL (seconds between progress lines when stderr is\n"
               "  not a terminal; default 10), NO_COLOR, SEPAL_TUI_REPLAY_SPEED\n"
               "exit status: 0 success, 1 a command failed, 2 usage error or unsupported, 130/143 stopped by\n"
               "  SIGINT/SIGTERM (the TUI: 130 when Ctrl-C twice quits it)\n");
}

/* Runs one -f argument: a file, or stdin for "-". */
static int run_script(sp_app *app, const char *path)
{
    if (!strcmp(path, "-"))
        return sp_cmd_run_file(app, stdin, "<stdin>");
    char *p = sp_expand_tilde(path);
    FILE *f = p ? fopen(p, "r") : NULL;
    if (!f) {
        int rc = sp_app_error(app, "%s: %s", path, strerror(errno));
        free(p);
        return rc;
    }
    int rc = sp_cmd_run_file(app, f, path);
    fclose(f);
    free(p);
    return rc;
}

typedef struct front {
    int repl, tui, quiet, dump, examples, dry, keep;
    const char *record, *replay;
} front;

/* Checks the front-end options: 0, or -1 (message printed) on a usage error. */
static int check_options(int argc, char **argv, front *fe)
{
    memset(fe, 0, sizeof *fe);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--repl")) {
            fe->repl = 1;
        } else if (!strcmp(argv[i], "--tui")) {
            fe->tui = 1;
        } else if (!strcmp(argv[i], "--record-events") || !strcmp(argv[i], "--replay-events")) {
            if (++i == argc) {
                fprintf(stderr, "sepal: %s needs a file\n", argv[i - 1]);
                return -1;
            }
            if (!strcmp(argv[i - 1], "--record-events"))
                fe->record = argv[i];
            else
                fe->replay = argv[i];
        } else if (!strcmp(argv[i], "-q") || !strcmp(argv[i], "--quiet")) {
            fe->quiet = 1;
        } else if (!strcmp(argv[i], "--dump-commands")) {
            fe->dump = 1;
        } else if (!strcmp(argv[i], "--dump-examples")) {
            fe->examples = 1;
        } else if (!strcmp(argv[i], "--dry-run")) {
            fe->dry = 1;
        } else if (!strcmp(argv[i], "-k") || !strcmp(argv[i], "--keep-going")) {
            fe->keep = 1;
        } else if (!strcmp(argv[i], "-c") || !strcmp(argv[i], "-f")) {
            if (++i == argc) {
                fprintf(stderr, "sepal: %s needs an argument\n", argv[i - 1]);
                return -1;
            }
        } else {
            fprintf(stderr, "sepal: unknown %s '%s'\n", argv[i][0] == '-' ? "option" : "command", argv[i]);
            return -1;
        }
    }
    if (fe->repl && (fe->tui || fe->record || fe->replay)) {
        fprintf(stderr, "sepal: --repl is the line front end; --tui, --record-events and --replay-events are the TUI's\n");
        return -1;
    }
    return 0;
}

/* A terminal the TUI can draw on: stdin and stdout are one, and TERM is not missing or dumb. */
static int tui_terminal(void)
{
    const char *term = getenv("TERM");
    return isatty(STDIN_FILENO) && isatty(STDOUT_FILENO) && term && *term && strcmp(term, "dumb");
}

/* The TUI, with the -c / -f of the command line run in it first. */
static int run_tui(sp_app *app, int argc, char **argv, const front *fe)
{
    tui_script *s = calloc((size_t)argc, sizeof *s);
    int n = 0;
    for (int i = 1; s && i < argc; i++) {
        if (!strcmp(argv[i], "-c") || !strcmp(argv[i], "-f")) {
            s[n].file = argv[i][1] == 'f';
            s[n++].arg = argv[++i];
        } else if (!strcmp(argv[i], "--record-events") || !strcmp(argv[i], "--replay-events")) {
            i++;
        }
    }
    tui_opts o = {.scripts = s, .nscripts = n, .record = fe->record, .replay = fe->replay};
    int rc = s ? tui_run(app, &o) : 1;
    free(s);
    return rc;
}

/* The front ends: -c and -f in order, then --repl; with no arguments the REPL or stdin. */
static int run_front_ends(int argc, char **argv)
{
    front fe;
    if (check_options(argc, argv, &fe)) {
        usage(stderr);
        return 2;
    }
    sp_app app;
    sp_app_init(&app, sp_line_sink());
    app.quiet = fe.quiet;
    sp_line_set_quiet(fe.quiet);
    if (fe.dump || fe.examples) {
        if (fe.dump)
            sp_cmd_dump(&app);
        else
            sp_cmd_dump_examples(&app);
        return 0;
    }
    app.dry_run = fe.dry;
    app.keep_going = fe.keep;
    int scripts = 0;
    for (int i = 1; i < argc; i++)
        scripts += !strcmp(argv[i], "-c") || !strcmp(argv[i], "-f");
    if ((fe.record || fe.replay) && !tui_terminal()) {
        fprintf(stderr, "sepal: --record-events and --replay-events need the TUI, on a terminal\n");
        return 2;
    }
    if (!fe.repl && !fe.dry && (fe.tui || fe.record || fe.replay || !scripts) && tui_terminal()) {
        int rc = run_tui(&app, argc, argv, &fe);
        if (rc != -1) {
            sp_app_free(&app); /* stops the servers of swarm up (each announces OFFLINE) */
            return rc;
        }
        fe.repl = 1; /* curses cannot use this terminal: the line front end */
    }
    if (fe.tui)
        fe.repl = 1; /* no terminal: the line front end, as --repl */
    int interactive = !scripts && isatty(STDIN_FILENO);
    sp_line_signals(&app, interactive || fe.repl);
    int rc = 0;
    for (int i = 1; i < argc && !rc && !app.quit; i++) {
        if (!strcmp(argv[i], "-c"))
            rc = sp_cmd_run_line(&app, argv[++i]);
        else if (!strcmp(argv[i], "-f"))
            rc = run_script(&app, argv[++i]);
        if (sp_line_exit_status())
            break;
    }
    if (!scripts && !fe.repl && !isatty(STDIN_FILENO) && !sp_line_exit_status())
        rc = sp_cmd_run_file(&app, stdin, "<stdin>");
    else if ((!scripts || fe.repl) && !app.quit && !sp_line_exit_status()) /* like python -i: after a failure too */
        rc = sp_line_repl(&app);
    sp_app_free(&app); /* stops the servers of swarm up (each announces OFFLINE) */
    fflush(stdout);
    int sig = sp_line_exit_status();
    return sig ? sig : rc || app.failed ? 1 : 0;
}

/* `sepal model ...`: the model command through the same layer; its exit status (0, 1, 2). */
static int run_model_tool(int argc, char **argv)
{
    sp_app app;
    sp_app_init(&app, sp_line_sink());
    sp_line_signals(&app, 0);
    char why[512];
    const sp_cmd *m = sp_cmd_find("model", why, sizeof why);
    if (argc < 3) {
        char syn[1024];
        sp_cmd_synopsis(m, "sepal model", 100, 12, syn, sizeof syn);
        fprintf(stderr, "usage: %s\n", syn);
        return 2;
    }
    const sp_cmd *sub = sp_cmd_find_in(m->subs, argv[2], why, sizeof why);
    if (!sub) {
        fprintf(stderr, "sepal: model: %s\n", why);
        return 2;
    }
    char path[64];
    snprintf(path, sizeof path, "model %s", sub->name);
    sp_args a;
    if (sp_args_parse(&app, sub, path, argc - 2, argv + 2, &a))
        return 2;
    int rc = sub->fn(&app, &a);
    sp_args_free(&a);
    sp_app_free(&app);
    int sig = sp_line_exit_status();
    return sig ? sig : rc;
}

int main(int argc, char **argv)
{
    sp_memtune();
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help"))) {
        usage(stdout);
        return 0;
    }
    if (argc >= 2 && !strcmp(argv[1], "--version")) {
        printf("sepal %s\n", SEPAL_VERSION);
        return 0;
    }
    if (argc >= 2 && !strcmp(argv[1], "model"))
        return run_model_tool(argc, argv);
    return run_front_ends(argc, argv);
}
