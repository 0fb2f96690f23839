/* cli.h - the `sepal` program's subcommands (the REPL command table comes with the client issue). */
#ifndef SEPAL_CLI_H
#define SEPAL_CLI_H

/* Exit statuses: 0 ok, 1 failure (a check failed, bad input), 2 usage or unsupported. */
enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2 };

int cmd_model(int argc, char **argv);

/* Option helpers: parse "--name VALUE" pairs; they print a message and return -1 on bad values. */
int cli_parse_int(const char *opt, const char *s, long lo, long hi, long *out);
int cli_parse_float(const char *opt, const char *s, double *out);

#endif
