/* main.c - entry point of `sepal`: dispatches subcommands. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: sepal <command> [args]\n"
               "\n"
               "commands:\n"
               "  model info DIR                       architecture, sizes, parameter count, dtype\n"
               "  model check DIR [--golden FILE]      run the model locally against golden outputs\n"
               "  model generate DIR --prompt TEXT [--max-new-tokens N] [--temperature T] [--seed S]\n"
               "  model convert-llama2c MODEL.bin TOKENIZER.bin OUTDIR\n"
               "  --version                            print the version\n");
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

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CLI_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return CLI_OK;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("sepal 0.1.0\n");
        return CLI_OK;
    }
    if (!strcmp(argv[1], "model"))
        return cmd_model(argc - 2, argv + 2);
    fprintf(stderr, "sepal: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return CLI_USAGE;
}
