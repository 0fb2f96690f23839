/* opt.h - one table type for every option sepal has: each command's options, the settings (`set`, `show`),
 * and the flags of the `sepal` and `sepal-server` programs. A row says once an option's name, kind, range or
 * choices, default and help; the parser (sp_opt_next), the value check (sp_opt_check), help (sp_opt_help) and
 * Tab completion all read that row. A row may take its kind, range, choices and default from another row
 * (`like`): a command's option from the setting that gives its default, so that both are checked alike.
 *
 * Code names a row by its index: an enum written beside its table, the rows given as `[GEN_TOP_K] = {...}`, so
 * a misspelt name does not compile (tests/test_cmd.c walks every table for holes and rows that contradict
 * their `like`). Nothing here allocates or prints: messages go into the caller's buffer, help lines to the
 * caller's function. Tables end with a row whose name is NULL. */
#ifndef SEPAL_OPT_H
#define SEPAL_OPT_H

#include <stddef.h>

typedef enum sp_opt_kind {
    SP_OPT_FLAG,   /* an option: no value; a setting: on or off (1, 0, yes, no, true, false) */
    SP_OPT_INT,    /* an integer in [min, max] (1e9 may be written so) */
    SP_OPT_NUM,    /* a number in [min, max] */
    SP_OPT_STR,    /* any text */
    SP_OPT_CHOICE, /* one of choices ("head|ptune|deep_ptune") */
    SP_OPT_PATH,   /* a file or directory (the command layer expands a leading ~ of an option's value) */
} sp_opt_kind;

/* min of a range that is open at 0: "(0, max]". */
#define SP_OPT_ABOVE0 1e-9

typedef struct sp_opt {
    const char *name; /* "--max-new-tokens"; a setting's: "max-new-tokens" */
    sp_opt_kind kind;
    const char *meta;          /* the value's name in help: "N" (NULL: "VALUE"; unused for flags and choices) */
    double min, max;           /* INT, NUM */
    const char *choices;       /* CHOICE: "a|b|c" */
    const char *aliases;       /* CHOICE: other names taken as a choice, "x=a|y=a|z=c" (help lists choices only) */
    const char *def;           /* the default, a valid value ("64"), or NULL (help may say it in words) */
    const char *help;          /* one line */
    const char *word;          /* a word valid besides the kind's values ("random"), or NULL */
    const char *short_name;    /* "-l", or NULL */
    const struct sp_opt *like; /* kind, range, choices, word and default are this row's (then unset here) */
    int live;                  /* with like: the default is that setting's current value, not its default */
    const char *section;       /* help: a heading over this row ("swarm:"), or NULL */
    int required;              /* every use gives it: no brackets in the synopsis; the command layer refuses
                                  a line without it */
} sp_opt;

/* The row that says o's kind, range, choices, word and default: o->like, else o. */
const sp_opt *sp_opt_spec(const sp_opt *o);
/* Rows before the NULL one. */
int sp_opt_count(const sp_opt *opts);

/* The row of opts called name: its long or its short name, else (prefixes) the one row whose long name starts
 * with name (for a name beginning "--", at least one character more). -1 when none (why: "unknown WHAT 'name'",
 * and " (did you mean --a?)" when a name is near), -2 when several (why: "ambiguous WHAT 'name': a, b"). what:
 * "option", "setting". */
int sp_opt_find(const sp_opt *opts, const char *name, int prefixes, const char *what, char *why, size_t cap);
/* Appends the names of the rows that start with prefix ("": all) to buf (", " between them) from *len on;
 * returns how many. */
int sp_opt_names(const sp_opt *opts, const char *prefix, char *buf, size_t cap, size_t *len);
/* Appends s to the list in buf from *len on (", " before it unless first), as much as fits. */
void sp_opt_list_add(char *buf, size_t cap, size_t *len, const char *s, int first);

/* Names close to a typo, as git and cargo suggest them: offered one at a time, the one or two nearest (an edit
 * distance where swapping two neighbours counts one) are kept, if they are near enough for the typo's length
 * (none for 1 character, 1 edit up to 3 characters, 2 up to 6, else 3; leading dashes not counted). */
typedef struct sp_similar {
    const char *typo;
    char best[2][64]; /* the nearest, ties in the order offered */
    int dist, n;
} sp_similar;
void sp_similar_init(sp_similar *s, const char *typo);
/* Offers name[0..len) (a name of a list such as "a,b" or "a|b" need not end there). */
void sp_similar_offer(sp_similar *s, const char *name, size_t len);
/* Appends " (did you mean A?)" or " (did you mean A or B?)" to buf from *len on, with before ("") or after
 * ("; `show` lists them") inside the parentheses; nothing when none is near. Returns how many it names. */
int sp_similar_say(const sp_similar *s, const char *after, char *buf, size_t cap, size_t *len);
/* The rows of opts near name (their long names), said as sp_similar_say says them. */
int sp_opt_similar(const sp_opt *opts, const char *name, const char *after, char *buf, size_t cap, size_t *len);

/* Whether value is valid for o: 0, or -1 with why, which names the option ("--top-p: expected a number in
 * (0, 1], got '2'", "--tuning: 'x' is not one of head, ptune, deep_ptune", "--dtype: 'int4' is not one of f32,
 * bf16, fp16, int8, nf4 (did you mean int8?)"). */
int sp_opt_check(const sp_opt *o, const char *value, char *why, size_t cap);
/* A choice's index in o's choices (an alias: its choice's), or -1. */
int sp_opt_choice(const sp_opt *o, const char *value);
/* What v stands for in aliases ("x=a|y=b": x stands for a) into buf: 0, or -1 when v is none of them. */
int sp_opt_alias(const char *aliases, const char *v, char *buf, size_t cap);
/* Choice i of o's into buf ("" when there is none): the name an alias stands for. */
void sp_opt_choice_name(const sp_opt *o, int i, char *buf, size_t cap);
/* 1 for "1", "on", "yes", "true"; 0 otherwise (NULL too). */
int sp_opt_on(const char *value);
/* A checked value as a number: integers exact up to 2^63 (strtoll), else strtod. */
long long sp_opt_int(const char *value);
double sp_opt_num(const char *value);

/* Walking a command line (getopt's job, over a table): options anywhere, `--opt value` or `--opt=value`, `--`
 * ends them; a word that is not an option ("x", "-", "-5", "-.5") comes back as a word. */
typedef struct sp_opt_parser {
    const sp_opt *opts;
    int argc;
    char **argv;     /* argv[0] (the command's name) is skipped */
    int prefixes;    /* a unique prefix of a long name is enough */
    int i, dashdash; /* the parser's own: start them at 0 */
} sp_opt_parser;

typedef enum sp_opt_got {
    SP_OPT_END,     /* nothing left */
    SP_OPT_OPTION,  /* *k: the row; *value: its value ("1" for a flag), already checked */
    SP_OPT_WORD,    /* *value: a word that is not an option */
    SP_OPT_UNKNOWN, /* *value: the word (NAME or NAME=VALUE) whose name is no option's (why: "unknown option 'NAME'") */
    SP_OPT_BAD,     /* why: an ambiguous name, a missing or an invalid value, a value for a flag */
} sp_opt_got;

sp_opt_got sp_opt_next(sp_opt_parser *p, int *k, const char **value, char *why, size_t cap);

/* What help says of an option, in two columns: the head ("--max-new-tokens N", "--long, -l", "--tuning
 * head|ptune|deep_ptune") and the text: its help, its default ("(default 64)", "(default: the top-k setting)")
 * and its range ("[0, 100]", "(0, 1]", "[>= 0]"). */
void sp_opt_head(const sp_opt *o, char *buf, size_t cap);
void sp_opt_text(const sp_opt *o, char *buf, size_t cap);
/* The synopsis of one option: "[--greedy]", "[--top-k K]", "[--tuning head|ptune|deep_ptune]", a required one
 * "--prompt TEXT". */
void sp_opt_synopsis(const sp_opt *o, char *buf, size_t cap);

/* Every row of opts as help shows it, a line at a time (without its newline) to line(): the heads in a column
 * as wide as the widest (at most 30), each text wrapped at width beside it (a head too wide for the column
 * stands on a line of its own); a section's heading before its first row. */
typedef void (*sp_opt_line_fn)(void *user, const char *line);
void sp_opt_help(const sp_opt *opts, int width, sp_opt_line_fn line, void *user);
/* A row of two columns: "  head", then text wrapped at width from column col on (a head too wide for the
 * first column, 2 + its length + 2 > col, stands on a line of its own). */
void sp_opt_columns(const char *head, int col, const char *text, int width, sp_opt_line_fn line, void *user);
/* text wrapped at width, every line indented by indent (the first too), to line(); '\n' breaks a line. */
void sp_opt_wrap(const char *text, int width, int indent, sp_opt_line_fn line, void *user);

#endif
