/* main.c - entry point of `sepal`: the subcommands (`sepal model ...`) and the command front ends: the REPL,
 * -c, -f and commands from stdin. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app.h"
#include "cli.h"
#include "memtune.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: sepal [--repl] [-c COMMANDS]... [-f FILE]...\n"
               "       sepal <command> [args]\n"
               "\n"
               "front ends:\n"
               "  (no arguments)                       the REPL if stdin is a terminal, else commands from stdin\n"
               "  --repl                               the interactive REPL (after any -c / -f)\n"
               "  -c \"CMD; CMD\"                        run commands (several -c and -f run in order)\n"
               "  -f FILE                              run a script (- is stdin); `help` lists the commands\n"
               "\n"
               "commands:\n"
               "  model info DIR                       architecture, sizes, parameter count, dtype\n"
               "  model check DIR [--golden FILE]      run the model locally against golden outputs\n"
               "  model generate DIR --prompt TEXT [--max-new-tokens N] [--temperature T] [--seed S]\n"
               "  model convert-llama2c MODEL.bin TOKENIZER.bin OUTDIR\n"
               "  --version                            print the version\n"
               "\n"
               "exit status: 0 success, 1 a command failed, 2 usage error\n");
}

int cli_parse_int(const char *opt, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, "sepal: %s: expected an integer in [%ld, %ld], got '%s'\n", opt, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_float(const char *opt, const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || !isfinite(v)) {
        fprintf(stderr, "sepal: %s: expected a number, got '%s'\n", opt, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* Runs one -f argument: a file, or stdin for "-". */
static int run_script(sp_app *app, const char *path)
{
    if (!strcmp(path, "-"))
        return sp_cmd_run_file(app, stdin, "<stdin>");
    FILE *f = fopen(path, "r");
    if (!f)
        return sp_app_error(app, "%s: %s", path, strerror(errno));
    int rc = sp_cmd_run_file(app, f, path);
    fclose(f);
    return rc;
}

/* Checks the front-end options: 0, or -1 (message printed) on a usage error. */
static int check_options(int argc, char **argv, int *repl)
{
    *repl = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--repl")) {
            *repl = 1;
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
    return 0;
}

/* The front ends: -c and -f in order, then --repl; with no arguments the REPL or stdin. */
static int run_front_ends(int argc, char **argv)
{
    int repl;
    if (check_options(argc, argv, &repl)) {
        usage(stderr);
        return CLI_USAGE;
    }
    sp_app app;
    sp_app_init(&app);
    int rc = 0;
    for (int i = 1; i < argc && !rc && !app.quit; i++) {
        if (!strcmp(argv[i], "-c"))
            rc = sp_cmd_run_line(&app, argv[++i]);
        else if (!strcmp(argv[i], "-f"))
            rc = run_script(&app, argv[++i]);
    }
    if (argc == 1 && !isatty(STDIN_FILENO))
        rc = sp_cmd_run_file(&app, stdin, "<stdin>");
    else if ((argc == 1 || repl) && !rc && !app.quit)
        rc = sp_cmd_repl(&app);
    sp_app_free(&app);
    fflush(stdout);
    return rc ? CLI_FAIL : CLI_OK;
}

int main(int argc, char **argv)
{
    sp_memtune();
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help"))) {
        usage(stdout);
        return CLI_OK;
    }
    if (argc >= 2 && !strcmp(argv[1], "--version")) {
        printf("sepal 0.1.0\n");
        return CLI_OK;
    }
    if (argc >= 2 && !strcmp(argv[1], "model"))
        return cmd_model(argc - 2, argv + 2);
    return run_front_ends(argc, argv);
}
