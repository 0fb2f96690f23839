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

#include "opt.h"

typedef struct sp_app sp_app; /* the application state: app.h */

/* Candidates of Tab completion: distinct strings. */
typedef struct sp_strlist {
    char **v;
    int n, cap;
} sp_strlist;
void sp_strlist_free(sp_strlist *l);
/* Adds s[0..len) if it starts with prefix and is not there yet. */
void sp_strlist_add(sp_strlist *l, const char *s, size_t len, const char *prefix);

#define SP_MAX_OPTS 40

/* What a command line became: positionals (paths expanded when the command says they are paths) and, per
 * option of the table (by its index), the value given (flags: "1"), or NULL. */
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
    const sp_opt *opts;         /* ends with {NULL}; may be NULL (SP_OPTS sets it and nopts) */
    int nopts;                  /* the rows of opts before its end (a {NULL} row earlier is a hole) */
    const struct sp_cmd *subs;  /* subcommands, ending with {NULL}; may be NULL */
    const char *summary;        /* one line for `help` */
    const char *help;           /* more, for `help NAME`; may be NULL */
    const char *examples;       /* example lines ("generate \"Hi\" --greedy\n..."), run by the README test */
    sp_cmd_fn fn;               /* NULL when subs says what to do */
    sp_cmd_fn check;            /* may be NULL: under --dry-run, what can be checked without running (a task's
                                   arguments), beyond the names, options and values every command gets */
    /* Tab completion of the positionals when they are not paths: adds the candidates for word, positional
     * npos (from 0), typed after prev (sp_complete_*); may be NULL. */
    void (*complete)(const sp_app *app, int npos, const char *prev, const char *word, sp_strlist *out);
} sp_cmd;

/* A command's option table: `.opts = T, .nopts = rows of T`. Each table is written with the index of every row
 * (`[GEN_TOP_K] = {"--top-k", ...}`) from an enum beside it, and handlers read values by that index. */
#define SP_OPTS(table) .opts = (table), .nopts = (int)(sizeof(table) / sizeof *(table)) - 1

/* Each command group (cmd/cmd_*.c) exports a table ending with {NULL}. */
extern const sp_cmd sp_cmds_core[];     /* help, quit, set, show, echo, sleep */
extern const sp_cmd sp_cmds_model[];    /* model info|check|generate|convert-llama2c|init */
extern const sp_cmd sp_cmds_swarm[];    /* load, swarm, connect, servers, models, route */
extern const sp_cmd sp_cmds_generate[]; /* generate */
extern const sp_cmd sp_cmds_train[];    /* train, eval, plugin */
extern const sp_cmd sp_cmds_serve[];    /* serve */

typedef struct sp_cmd_group {
    const char *title;
    const sp_cmd *cmds;
} sp_cmd_group;
extern const sp_cmd_group sp_cmd_groups[]; /* in the order `help` lists them, ending with {NULL, NULL} */

/* Every command of table, or (table NULL) of every group: SP_CMD_EACH(table, c) { ... c ... } */
#define SP_CMD_EACH(table, c)                                                                                      \
    for (const sp_cmd_group *g_ = sp_cmd_groups, *once_ = NULL; (table) ? !once_ : g_->cmds != NULL;             \
         (table) ? (void)(once_ = g_) : (void)g_++)                                                               \
        for (const sp_cmd *c = (table) ? (table) : g_->cmds; c->name; c++)

/* Looks a name up in a table (NULL: the top level): exact name or alias first, then a unique prefix. NULL
 * with a message in why: "unknown command 'genrate' (did you mean generate?)" (the one or two nearest names,
 * sp_similar), else "unknown command 'x' (try 'help')" or "unknown subcommand 'x' (one of: up, down)";
 * "ambiguous command 'se': servers, set". */
const sp_cmd *sp_cmd_find_in(const sp_cmd *table, const char *name, char *why, size_t cap);
const sp_cmd *sp_cmd_find(const char *name, char *why, size_t cap);

/* Parses argv (argv[0]: the command's name as typed) against c: options anywhere, `--` ends them. 0, or 1
 * after an error message (one per problem: the option, the value, what is valid). */
int sp_args_parse(sp_app *app, const sp_cmd *c, const char *path, int argc, char **argv, sp_args *a);
void sp_args_free(sp_args *a);
/* An option's value, by its index k in the command's table: given, else (SP_SETTING) its setting's current
 * value, else its default; NULL when none. */
const char *sp_arg(const sp_app *app, const sp_args *a, int k);
int sp_arg_given(const sp_args *a, int k);
/* The value as a number (checked by sp_args_parse; 0 when none), a choice's index (-1 when none), a flag or an
 * on/off setting (1 or 0). */
long long sp_arg_int(const sp_app *app, const sp_args *a, int k);
double sp_arg_num(const sp_app *app, const sp_args *a, int k);
int sp_arg_choice(const sp_app *app, const sp_args *a, int k);
int sp_arg_on(const sp_app *app, const sp_args *a, int k);
/* A seed option (its setting's kind: an integer, or `random`): the integer, or a fresh seed. */
unsigned long long sp_arg_seed(const sp_app *app, const sp_args *a, int k);
/* One warning for the options of ks[0..n) that were given but do nothing here: "--top-p, --seed have no effect
 * WHY" (nothing when none was given). */
void sp_args_warn_unused(sp_app *app, const sp_args *a, const int *ks, int n, const char *why);

/* Runs one line: commands separated by ';' (outside quotes); '#' starts a comment. Arguments are split on
 * whitespace with "double" / 'single' quotes and backslash escapes. Stops at the first failing command (or a
 * cancelled one). Returns 0 if all succeeded. */
int sp_cmd_run_line(sp_app *app, const char *line);
/* Runs every line of f (a script or a non-tty stdin); stops at the first failure (messages are prefixed
 * "NAME:LINE: "), when a command sets app->quit, or when the app is cancelled. */
int sp_cmd_run_file(sp_app *app, FILE *f, const char *name);
/* Runs the script at path (a leading ~ expanded; "-" is stdin) as sp_cmd_run_file does; one it cannot open is
 * an error ("PATH: No such file or directory"). */
int sp_cmd_run_script(sp_app *app, const char *path);
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

/* Help text. The synopsis of c ("generate PROMPT [--max-new-tokens N] ...") for a line where it starts at
 * column at ("usage: " before it: 7), wrapped at width columns, each continuation line indented by indent. */
void sp_cmd_synopsis(const sp_cmd *c, const char *path, int at, int width, int indent, char *buf, size_t cap);
/* `help` (c NULL: every command) into the app's sink, wrapped at width columns. */
void sp_cmd_help(sp_app *app, const sp_cmd *c, const char *path, int width);

/* Tab completion: the candidates for the word being typed, given the words before it on its command
 * (prior[0..nprior)). *files: the candidates are file names (no space after a directory). */
void sp_cmd_complete(const sp_app *app, int nprior, char **prior, const char *word, sp_strlist *out, int *files);
/* For the commands' completion hooks: the names of table's commands (NULL: every command; aliases too, those of
 * a command whose name does not start with word: "ex" gives exit, "ge" generate alone), the choices "a|b|c", the
 * names of opts' rows, that start with word. */
void sp_complete_commands(sp_strlist *out, const sp_cmd *table, const char *word, int aliases);
void sp_complete_choices(sp_strlist *out, const char *choices, const char *word);
void sp_complete_names(sp_strlist *out, const sp_opt *opts, const char *word);
/* The values of o that start with word: its choices, on and off for an on/off setting, its word. */
void sp_complete_value(sp_strlist *out, const sp_opt *o, const char *word);

/* Every command with its options, one per line ("generate --max-new-tokens ..."): for the README check. */
void sp_cmd_dump(sp_app *app);
/* Every example line of every command's help. */
void sp_cmd_dump_examples(sp_app *app);

#endif
