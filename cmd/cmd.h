/* cmd.h - the command layer every front end shares (the line REPL, scripts, -c, and the TUI's `:` line).
 *
 * A command is a row of a table: its name, aliases, positional arguments, and one option table that drives
 * the parser, `help`, Tab completion and the check that the README documents every option. Subcommands
 * (`swarm up`, `model info`) are tables of their own. Handlers get their arguments parsed and checked
 * (each invalid option names the option, the value and the valid range) and write only through the app's
 * sink (sink.h), never to stdout, so the TUI can show what they say. */
#ifndef SEPAL_CMD_H
#define SEPAL_CMD_H

#include <stddef.h>
#include <stdio.h>

typedef struct sp_app sp_app; /* the application state: app.h */

typedef enum sp_opt_kind {
    SP_OPT_FLAG,   /* no value */
    SP_OPT_INT,    /* an integer in [min, max] */
    SP_OPT_NUM,    /* a number in [min, max] */
    SP_OPT_STR,    /* any text */
    SP_OPT_CHOICE, /* one of choices ("head|ptune|deep_ptune") */
    SP_OPT_PATH,   /* a file or directory: a leading ~ or ~/ is expanded */
} sp_opt_kind;

typedef struct sp_opt {
    const char *name;    /* "--max-new-tokens" */
    sp_opt_kind kind;
    const char *meta;    /* "N" (NULL for flags) */
    double min, max;     /* SP_OPT_INT / SP_OPT_NUM */
    const char *choices; /* SP_OPT_CHOICE: "a|b|c" */
    const char *setting; /* the setting that gives its default (`set`), or NULL */
    const char *def;     /* the default when there is no setting (for help), or NULL */
    const char *help;    /* one line */
} sp_opt;

#define SP_MAX_OPTS 40

/* What a command line became: positionals (paths expanded when the command says they are paths) and, per
 * option of the table, the value given (flags: "1"), or NULL. */
typedef struct sp_args {
    const struct sp_cmd *cmd;
    const char *path;        /* "swarm up": the command as named */
    int npos;
    char **pos;
    char *val[SP_MAX_OPTS];  /* owned */
    char **argv_owned;       /* the positionals' storage */
} sp_args;

/* A handler returns 0 on success; on failure it has said why (sp_app_error) and returns non-zero. */
typedef int (*sp_cmd_fn)(sp_app *app, const sp_args *a);

typedef struct sp_cmd {
    const char *name;           /* "generate" */
    const char *aliases;        /* comma-separated, may be NULL: "gen" */
    const char *args;           /* synopsis of the positionals: "PROMPT", "[COMMAND]", "" */
    int min_pos, max_pos;       /* how many positionals (max_pos -1: any) */
    int pos_paths;              /* the positionals are paths (~ expanded) */
    const sp_opt *opts;         /* ends with {NULL}; may be NULL */
    const struct sp_cmd *subs;  /* subcommands, ending with {NULL}; may be NULL */
    const char *summary;        /* one line for `help` */
    const char *help;           /* more, for `help NAME`; may be NULL */
    const char *examples;       /* example lines ("generate \"Hi\" --greedy\n..."), run by the README test */
    sp_cmd_fn fn;               /* NULL when subs says what to do */
    const char *short_opts;     /* short names of options, "-l --long[,-x --other]"; may be NULL */
} sp_cmd;

/* Each command group (repl/cmd_*.c) exports a table ending with {NULL}. */
extern const sp_cmd sp_cmds_core[];     /* help, quit, set, show, echo, sleep */
extern const sp_cmd sp_cmds_model[];    /* model info|check|generate|convert-llama2c */
extern const sp_cmd sp_cmds_swarm[];    /* load, swarm, connect, servers, models, route */
extern const sp_cmd sp_cmds_generate[]; /* generate */
extern const sp_cmd sp_cmds_train[];    /* train, eval, plugin */

typedef struct sp_cmd_group {
    const char *title;
    const sp_cmd *cmds;
} sp_cmd_group;
extern const sp_cmd_group sp_cmd_groups[]; /* in the order `help` lists them, ending with {NULL, NULL} */

/* Looks a name up in a table (NULL: the top level): exact name or alias first, then a unique prefix. NULL
 * with a message in why ("unknown command 'x' (try 'help')", "ambiguous command 'se': servers, set"). */
const sp_cmd *sp_cmd_find_in(const sp_cmd *table, const char *name, char *why, size_t cap);
const sp_cmd *sp_cmd_find(const char *name, char *why, size_t cap);

/* Parses argv (argv[0]: the command's name as typed) against c: options anywhere, `--` ends them. 0, or 1
 * after an error message (one per problem: the option, the value, what is valid). */
int sp_args_parse(sp_app *app, const sp_cmd *c, const char *path, int argc, char **argv, sp_args *a);
void sp_args_free(sp_args *a);
/* An option's value: given, else its setting's, else NULL (flags: non-NULL when given). */
const char *sp_arg(const sp_app *app, const sp_args *a, const char *opt);
int sp_arg_given(const sp_args *a, const char *opt);
/* Numeric values, already range-checked by sp_args_parse (def when absent). */
long long sp_arg_int(const sp_app *app, const sp_args *a, const char *opt, long long def);
double sp_arg_num(const sp_app *app, const sp_args *a, const char *opt, double def);
/* A choice's index in its choices (def when absent). */
int sp_arg_choice(const sp_app *app, const sp_args *a, const char *opt, int def);

/* Runs one line: commands separated by ';' (outside quotes); '#' starts a comment. Arguments are split on
 * whitespace with "double" / 'single' quotes and backslash escapes. Stops at the first failing command (or a
 * cancelled one). Returns 0 if all succeeded. */
int sp_cmd_run_line(sp_app *app, const char *line);
/* Runs every line of f (a script or a non-tty stdin); stops at the first failure (messages are prefixed
 * "NAME:LINE: "), when a command sets app->quit, or when the app is cancelled. */
int sp_cmd_run_file(sp_app *app, FILE *f, const char *name);
/* Splits a line into argv (malloc'd, NULL-terminated; free with sp_cmd_free_argv). Inside "double quotes"
 * \" \\ \n \t are escapes (another backslash stays); outside quotes a backslash takes the next character
 * as it is; 'single quotes' take everything literally. -1 on unbalanced quotes (why set). */
int sp_cmd_split(const char *line, int *argc, char ***argv, char *why, size_t cap);
void sp_cmd_free_argv(int argc, char **argv);
/* The end of the command that starts at p: the first ';' or '#' outside quotes and escapes, or the end. */
const char *sp_cmd_end(const char *p);

/* "~" and "~/x" -> $HOME, "$HOME/x"; anything else copied (common/paths.c sp_expand_home, malloc'd: NULL when
 * out of memory). */
char *sp_expand_tilde(const char *path);

/* Help text. The synopsis of c ("generate PROMPT [--max-new-tokens N] ...") wrapped at width columns, each
 * continuation line indented by indent. */
void sp_cmd_synopsis(const sp_cmd *c, const char *path, int width, int indent, char *buf, size_t cap);
/* `help` (c NULL: every command) into the app's sink, wrapped at width columns. */
void sp_cmd_help(sp_app *app, const sp_cmd *c, const char *path, int width);

/* Tab completion: the candidates for the word being typed, given the words before it on its command
 * (prior[0..nprior)). *files: the candidates are file names (no space after a directory). */
typedef struct sp_strlist {
    char **v;
    int n, cap;
} sp_strlist;
void sp_strlist_free(sp_strlist *l);
void sp_strlist_add(sp_strlist *l, const char *s, size_t len, const char *prefix);
void sp_cmd_complete(const sp_app *app, int nprior, char **prior, const char *word, sp_strlist *out, int *files);

/* Every command with its options, one per line ("generate --max-new-tokens ..."): for the README check. */
void sp_cmd_dump(sp_app *app);
/* Every example line of every command's help. */
void sp_cmd_dump_examples(sp_app *app);

#endif
