/* cmd.h - the REPL's command table and runner. Every command (interactive, `-c "a; b"`, `-f FILE`, or
 * lines from a non-tty stdin) goes through sp_cmd_run_line; help and tab completion come from the table. */
#ifndef SEPAL_CMD_H
#define SEPAL_CMD_H

#include <stdio.h>

typedef struct sp_app sp_app; /* the application state: app.h */

/* A handler returns 0 on success; on failure it has printed a message (sp_app_error) and returns non-zero. */
typedef int (*sp_cmd_fn)(sp_app *app, int argc, char **argv);

typedef struct sp_cmd {
    const char *name;    /* "generate" */
    const char *aliases; /* comma-separated, may be NULL: "gen,g" */
    const char *args;    /* synopsis of the arguments: "PROMPT [--max-new-tokens N] ..." */
    const char *summary; /* one line for `help` */
    const char *help;    /* longer text for `help NAME`, may be NULL */
    sp_cmd_fn fn;        /* argv[0] is the command name as typed */
} sp_cmd;

/* Each command group (repl/cmd_*.c) exports a table ending with {0}; sp_cmd_groups (cmd.c) lists them.
 * repl/cmd_weak.c holds weak empty tables so that the program links before a group exists. */
extern const sp_cmd sp_cmds_core[];     /* help, quit, set, show, echo, sleep */
extern const sp_cmd sp_cmds_model[];    /* load, model ... */
extern const sp_cmd sp_cmds_swarm[];    /* swarm, connect, servers, route */
extern const sp_cmd sp_cmds_generate[]; /* generate */
extern const sp_cmd sp_cmds_train[];    /* train, eval, plugin */

/* The groups in the order `help` lists them (repl/cmd.c), terminated by {NULL, NULL}. */
typedef struct sp_cmd_group {
    const char *title; /* "core" */
    const sp_cmd *cmds;
} sp_cmd_group;
extern const sp_cmd_group sp_cmd_groups[];

/* Looks a name up: exact name or alias first, then a unique prefix of a name. NULL with a message in
 * why ("unknown command 'x' (try 'help')" / "ambiguous command 'se': servers, set") otherwise; why may be
 * NULL. */
const sp_cmd *sp_cmd_find(const char *name, char *why, size_t cap);
/* Runs one line: commands separated by ';' (outside quotes); '#' starts a comment. Arguments are split on
 * whitespace with "double" / 'single' quotes and backslash escapes. Stops at the first failing command.
 * Returns 0 if all succeeded. */
int sp_cmd_run_line(sp_app *app, const char *line);
/* Runs every line of f (a script or a non-tty stdin); stops at the first failure (messages are prefixed
 * "NAME:LINE: ") or when a command sets app->quit. */
int sp_cmd_run_file(sp_app *app, FILE *f, const char *name);
/* The interactive loop (libedit: prompt "sepal> ", history in $SEPAL_HISTORY or ~/.sepal_history, tab
 * completion of command names and aliases, of settings after set/show, of files elsewhere). Ends on
 * Ctrl-D or `quit`; returns 0. */
int sp_cmd_repl(sp_app *app);
/* Splits a line into argv (malloc'd, NULL-terminated; free with sp_cmd_free_argv). Inside "double quotes"
 * \" \\ \n \t are escapes (another backslash stays); outside quotes a backslash takes the next character
 * as it is; 'single quotes' take everything literally. -1 on unbalanced quotes (why set). */
int sp_cmd_split(const char *line, int *argc, char ***argv, char *why, size_t cap);
void sp_cmd_free_argv(int argc, char **argv);

#endif
