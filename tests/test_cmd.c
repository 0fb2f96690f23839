/* test_cmd.c - the command layer, white-box, without processes or a network (and the helpers of common/ that
 * both front ends use: durations, the history file): every option table walked (no
 * holes, no row that contradicts the setting it takes its kind from, defaults valid and equal to the library's),
 * the option machinery (common/opt.h: lookup, values, the command-line walk, help in columns), lookup of commands
 * (names, aliases, prefixes, subcommands), splitting and quoting, parsing with its messages, values by index
 * (given, a setting's current value, a row's default), the settings, help text and its wrapping, Tab completion's
 * candidates, scripts (';', '#', the first failure, -k, --dry-run, positions in messages), and text tables
 * fitted to a width (the `servers` table's rule: the least important columns first) with a server's shown name.
 * Output is caught by a sink of the test's own. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "generate.h"
#include "paths.h"
#include "table.h"
#include "testutil.h"
#include "timeutil.h"
#include "trainer.h"

/* ---------------------------------------------------------------------------------------------- */
/* an app whose sink keeps what commands say */

typedef struct caught {
    char out[65536]; /* text */
    char err[8192];  /* errors, "WHERE: " before each when a script runs */
    size_t nout, nerr;
} caught;

static void catch_event(void *user, const sp_ui_event *ev)
{
    caught *c = user;
    if (ev->kind == SP_UI_TEXT && c->nout < sizeof c->out)
        c->nout += (size_t)snprintf(c->out + c->nout, sizeof c->out - c->nout, "%s", ev->text);
    else if (ev->kind == SP_UI_ERROR && c->nerr < sizeof c->err)
        c->nerr += (size_t)snprintf(c->err + c->nerr, sizeof c->err - c->nerr, "%s%s%s\n", ev->where ? ev->where : "",
                                    ev->where ? ": " : "", ev->text);
}

static sp_app app;
static caught got;

static void setup(void)
{
    memset(&got, 0, sizeof got);
    sp_app_init(&app, (sp_sink){.emit = catch_event, .user = &got});
}

static void teardown(void) { sp_app_free(&app); }

static void clear(void) { memset(&got, 0, sizeof got); }

/* Runs a line; its status. */
static int run(const char *line)
{
    clear();
    return sp_cmd_run_line(&app, line);
}

/* ---------------------------------------------------------------------------------------------- */
/* the tables */

/* One option table: its rows up to n, then the end; sound rows. */
static void check_table(const char *what, const sp_opt *opts, int n)
{
    ck_assert_msg(sp_opt_count(opts) == n, "%s: %d rows before the end, %d in the table (a hole?)", what,
                  sp_opt_count(opts), n);
    ck_assert_msg(n <= SP_MAX_OPTS, "%s: %d options, more than SP_MAX_OPTS", what, n);
    for (int i = 0; i < n; i++) {
        const sp_opt *o = &opts[i], *s = sp_opt_spec(o);
        char why[256];
        for (int j = 0; j < i; j++)
            ck_assert_msg(strcmp(opts[j].name, o->name), "%s: %s twice", what, o->name);
        ck_assert_msg(o->help && *o->help, "%s %s: no help", what, o->name);
        if (o->like) /* kind, range, choices, word and default are written once: in the row it is like */
            ck_assert_msg(o->kind == 0 && o->min == 0 && o->max == 0 && !o->choices && !o->def && !o->word,
                          "%s %s: a row like another says its own kind, range, choices or default", what, o->name);
        ck_assert_msg(!o->live || sp_setting_of(o->like) >= 0, "%s %s: live, but not like a setting", what, o->name);
        ck_assert_msg(s->kind != SP_OPT_CHOICE || (s->choices && *s->choices), "%s %s: no choices", what, o->name);
        ck_assert_msg(s->min <= s->max, "%s %s: an empty range", what, o->name);
        ck_assert_msg(!s->def || !sp_opt_check(s, s->def, why, sizeof why), "%s: its default: %s", what, why);
    }
}

static void check_cmds(const sp_cmd *table, const char *prefix)
{
    for (const sp_cmd *c = table; c->name; c++) {
        char what[96];
        snprintf(what, sizeof what, "%s%s", prefix, c->name);
        ck_assert_msg(c->fn || c->subs, "%s: neither a handler nor subcommands", what);
        ck_assert_msg(c->summary && *c->summary, "%s: no summary", what);
        ck_assert_msg(!c->opts || c->nopts > 0, "%s: opts without nopts (use SP_OPTS)", what);
        check_table(what, c->opts, c->nopts);
        if (c->subs) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s ", what);
            check_cmds(c->subs, sub);
        }
    }
}

START_TEST(t_tables)
{
    int ncmds = 0;
    for (const sp_cmd_group *g = sp_cmd_groups; g->cmds; g++) {
        check_cmds(g->cmds, "");
        for (const sp_cmd *c = g->cmds; c->name; c++)
            ncmds++;
    }
    ck_assert_int_ge(ncmds, 15);
    check_table("the settings", sp_settings, SP_SET_N);
    for (int k = 0; k < SP_SET_N; k++)
        ck_assert_msg(sp_settings[k].def, "setting %s: no default", sp_settings[k].name);
}
END_TEST

/* The command at path ("train", "model generate"). */
static const sp_cmd *cmd_of(const char *path)
{
    char first[32];
    snprintf(first, sizeof first, "%.*s", (int)strcspn(path, " "), path);
    const sp_cmd *c = sp_cmd_find(first, NULL, 0);
    if (c && strchr(path, ' '))
        c = sp_cmd_find_in(c->subs, strchr(path, ' ') + 1, NULL, 0);
    ck_assert_msg(c != NULL, "no command %s", path);
    return c;
}

/* The index of the option row called name of the command at path: what its handler names it by. */
static int k_of(const char *path, const char *name)
{
    int k = sp_opt_find(cmd_of(path)->opts, name, 0, "option", NULL, 0);
    ck_assert_msg(k >= 0, "%s has no %s", path, name);
    return k;
}

static const sp_opt *row_of(const char *path, const char *name) { return &cmd_of(path)->opts[k_of(path, name)]; }

static long long def_int(const char *path, const char *name)
{
    return sp_opt_int(sp_opt_spec(row_of(path, name))->def);
}

/* What help says the defaults are is what the library does without the option. */
START_TEST(t_defaults_are_the_libraries)
{
    sp_train_opts t;
    sp_train_opts_default(&t);
    ck_assert_int_eq(def_int("train", "--pre-seq-len"), t.pre_seq_len);
    ck_assert_int_eq(def_int("train", "--batch"), t.batch);
    ck_assert_int_eq(def_int("train", "--max-length"), t.max_length);
    ck_assert_int_eq(def_int("train", "--microbatches"), t.microbatches);
    ck_assert_int_eq(def_int("train", "--eval-batches"), t.eval_batches);
    ck_assert_int_eq(def_int("train", "--seed"), (long long)t.seed);
    ck_assert_int_eq(def_int("train", "--epochs"), t.epochs);
    ck_assert_int_eq(def_int("train", "--warmup"), t.warmup);
    ck_assert_int_eq(def_int("train", "--max-in-flight"), t.max_in_flight);
    ck_assert_int_eq(def_int("train", "--max-steps"), t.max_steps);
    ck_assert((float)sp_opt_num(row_of("train", "--lr")->def) == t.lr);
    ck_assert_int_eq(sp_opt_choice(row_of("train", "--tuning"), row_of("train", "--tuning")->def), (int)t.tuning);
    ck_assert_int_eq(sp_opt_choice(row_of("train", "--schedule"), row_of("train", "--schedule")->def), (int)t.schedule);
    sp_gen_opts g;
    sp_gen_opts_default(&g);
    ck_assert_int_eq(sp_opt_int(sp_settings[SP_SET_MAX_NEW_TOKENS].def), g.max_new);
    ck_assert_int_eq(def_int("model generate", "--max-new-tokens"), g.max_new);
    ck_assert_int_eq(def_int("model generate", "--min-new-tokens"), g.min_new);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* common/opt.h */

enum { T_PORT, T_NAME, T_FAST, T_MODE, T_RATE, T_N };
static const sp_opt tbl[] = {
    [T_PORT] = {"--port", SP_OPT_INT, "P", 0, 65535, .def = "0", .help = "a port; 0: any"},
    [T_NAME] = {"--name", SP_OPT_STR, "S", .help = "a name"},
    [T_FAST] = {"--fast", SP_OPT_FLAG, .short_name = "-f", .help = "go fast", .section = "\nspeed:"},
    [T_MODE] = {"--mode", SP_OPT_CHOICE, .choices = "a|bb|ccc", .def = "bb", .help = "one of three"},
    [T_RATE] = {"--rate", SP_OPT_NUM, "R", SP_OPT_ABOVE0, 1, .help = "a share"},
    [T_N] = {0},
};

START_TEST(t_opt_values)
{
    char why[256];
    ck_assert_int_eq(sp_opt_check(&tbl[T_PORT], "80", why, sizeof why), 0);
    ck_assert_int_eq(sp_opt_check(&tbl[T_PORT], "8e3", why, sizeof why), 0); /* a whole number, written so */
    ck_assert_int_eq(sp_opt_int("8e3"), 8000);
    ck_assert_int_eq(sp_opt_check(&tbl[T_PORT], "1.5", why, sizeof why), -1);
    ck_assert_str_eq(why, "--port: expected an integer in [0, 65535], got '1.5'");
    ck_assert_int_eq(sp_opt_check(&tbl[T_PORT], "65536", why, sizeof why), -1);
    ck_assert_int_eq(sp_opt_check(&tbl[T_RATE], "0", why, sizeof why), -1);
    ck_assert_str_eq(why, "--rate: expected a number in (0, 1], got '0'");
    ck_assert_int_eq(sp_opt_check(&tbl[T_MODE], "b", why, sizeof why), -1);
    ck_assert_str_eq(why, "--mode: 'b' is not one of a, bb, ccc");
    ck_assert_int_eq(sp_opt_choice(&tbl[T_MODE], "ccc"), 2);
    /* aliases: taken as their choice, not listed */
    static const sp_opt al = {"--dtype", SP_OPT_CHOICE, .choices = "f32|fp16|int8", .aliases = "f16=fp16|float16=fp16|q8=int8"};
    ck_assert_int_eq(sp_opt_choice(&al, "f16"), 1);
    ck_assert_int_eq(sp_opt_choice(&al, "float16"), 1);
    ck_assert_int_eq(sp_opt_choice(&al, "q8"), 2);
    ck_assert_int_eq(sp_opt_choice(&al, "f1"), -1); /* an alias's prefix is none */
    ck_assert_int_eq(sp_opt_choice(&al, "fp16=f16"), -1);
    ck_assert_int_eq(sp_opt_check(&al, "float16", why, sizeof why), 0);
    ck_assert_int_eq(sp_opt_check(&al, "f8", why, sizeof why), -1);
    ck_assert_msg(!strncmp(why, "--dtype: 'f8' is not one of f32, fp16, int8", 43), "%s", why);
    char name[16];
    ck_assert_int_eq(sp_opt_alias("f16=fp16|float16=fp16", "float16", name, sizeof name), 0);
    ck_assert_str_eq(name, "fp16");
    ck_assert_int_eq(sp_opt_alias("f16=fp16|float16=fp16", "float1", name, sizeof name), -1);
    ck_assert_int_eq(sp_opt_alias(NULL, "f16", name, sizeof name), -1);
    sp_opt_choice_name(&al, sp_opt_choice(&al, "float16"), name, sizeof name);
    ck_assert_str_eq(name, "fp16");
    sp_opt_choice_name(&al, 2, name, sizeof name);
    ck_assert_str_eq(name, "int8");
    sp_opt_choice_name(&al, 3, name, sizeof name);
    ck_assert_str_eq(name, "");
    sp_opt_choice_name(&al, -1, name, sizeof name);
    ck_assert_str_eq(name, "");
    ck_assert_int_eq(sp_opt_int("9000000000000000000"), 9000000000000000000LL); /* exact past 2^53 */
    ck_assert(sp_opt_on("yes") && sp_opt_on("on") && !sp_opt_on("off") && !sp_opt_on(NULL));
}
END_TEST

START_TEST(t_opt_find)
{
    char why[256];
    ck_assert_int_eq(sp_opt_find(tbl, "-f", 0, "option", why, sizeof why), T_FAST);
    ck_assert_int_eq(sp_opt_find(tbl, "--po", 0, "option", why, sizeof why), -1); /* prefixes off */
    ck_assert_str_eq(why, "unknown option '--po'");
    ck_assert_int_eq(sp_opt_find(tbl, "--po", 1, "option", why, sizeof why), T_PORT);
    ck_assert_int_eq(sp_opt_find(tbl, "--", 1, "option", why, sizeof why), -1); /* no name, no prefix */
    static const sp_opt two[] = {{"--top-k", .help = "k"}, {"--top-p", .help = "p"}, {0}};
    ck_assert_int_eq(sp_opt_find(two, "--top", 1, "option", why, sizeof why), -2);
    ck_assert_str_eq(why, "ambiguous option '--top': --top-k, --top-p");
    char list[128] = "";
    size_t len = 0;
    ck_assert_int_eq(sp_opt_similar(two, "--topk", NULL, list, sizeof list, &len), 1); /* the nearest only */
    ck_assert_str_eq(list, " (did you mean --top-k?)");
    len = 0;
    ck_assert_int_eq(sp_opt_similar(two, "--top-x", "; ok", list, sizeof list, &len), 2); /* a tie: both */
    ck_assert_str_eq(list, " (did you mean --top-k or --top-p?; ok)");
    ck_assert_int_eq(sp_opt_find(two, "--tpo-k", 1, "option", why, sizeof why), -1); /* a swap counts one */
    ck_assert_str_eq(why, "unknown option '--tpo-k' (did you mean --top-k?)");
    ck_assert_int_eq(sp_opt_find(two, "--bogus", 1, "option", why, sizeof why), -1); /* nothing near */
    ck_assert_str_eq(why, "unknown option '--bogus'");
}
END_TEST

START_TEST(t_opt_walk)
{
    char *argv[] = {"prog", "x", "--port=80", "--fast", "-5", "--mode", "a", "--", "--name", NULL};
    sp_opt_parser p = {.opts = tbl, .argc = 9, .argv = argv};
    int k;
    const char *v;
    char why[256];
    ck_assert_int_eq(sp_opt_next(&p, &k, &v, why, sizeof why), SP_OPT_WORD);
    ck_assert_str_eq(v, "x");
    ck_assert_int_eq(sp_opt_next(&p, &k, &v, why, sizeof why), SP_OPT_OPTION);
    ck_assert_int_eq(k, T_PORT);
    ck_assert_str_eq(v, "80");
    ck_assert_int_eq(sp_opt_next(&p, &k, &v, why, sizeof why), SP_OPT_OPTION);
    ck_assert_int_eq(k, T_FAST);
    ck_assert_int_eq(sp_opt_next(&p, &k, &v, why, sizeof why), SP_OPT_WORD); /* a negative number */
    ck_assert_str_eq(v, "-5");
    ck_assert_int_eq(sp_opt_next(&p, &k, &v, why, sizeof why), SP_OPT_OPTION);
    ck_assert_str_eq(v, "a");
    ck_assert_int_eq(sp_opt_next(&p, &k, &v, why, sizeof why), SP_OPT_WORD); /* after --: words */
    ck_assert_str_eq(v, "--name");
    ck_assert_int_eq(sp_opt_next(&p, &k, &v, why, sizeof why), SP_OPT_END);
    char *bad[] = {"prog", "--fast=1", "--bogus=2", "--port", NULL};
    p = (sp_opt_parser){.opts = tbl, .argc = 4, .argv = bad};
    ck_assert_int_eq(sp_opt_next(&p, &k, &v, why, sizeof why), SP_OPT_BAD);
    ck_assert_str_eq(why, "option '--fast' takes no value");
    ck_assert_int_eq(sp_opt_next(&p, &k, &v, why, sizeof why), SP_OPT_UNKNOWN);
    ck_assert_str_eq(v, "--bogus=2");
    ck_assert_int_eq(sp_opt_next(&p, &k, &v, why, sizeof why), SP_OPT_BAD);
    ck_assert_str_eq(why, "option '--port' needs a value (P)");
}
END_TEST

static void keep_line(void *user, const char *line)
{
    caught *c = user;
    c->nout += (size_t)snprintf(c->out + c->nout, sizeof c->out - c->nout, "%s\n", line);
}

START_TEST(t_opt_help)
{
    clear();
    sp_opt_help(tbl, 40, keep_line, &got);
    ck_assert_str_eq(got.out, "  --port P         a port; 0: any\n"
                              "                   (default 0)\n"
                              "                   [0, 65535]\n" /* a range stays whole */
                              "  --name S         a name\n"
                              "\n"
                              "speed:\n"
                              "  --fast, -f       go fast\n"
                              "  --mode a|bb|ccc  one of three (default\n"
                              "                   bb)\n"
                              "  --rate R         a share (0, 1]\n");
    clear();
    sp_opt_wrap("one two three\n\nfour", 9, 2, keep_line, &got);
    ck_assert_str_eq(got.out, "  one two\n  three\n  \n  four\n");
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* lookup, splitting, parsing */

START_TEST(t_lookup)
{
    char why[256];
    ck_assert_str_eq(sp_cmd_find("gen", why, sizeof why)->name, "generate"); /* an alias */
    ck_assert_str_eq(sp_cmd_find("?", why, sizeof why)->name, "help");
    ck_assert_str_eq(sp_cmd_find("gene", why, sizeof why)->name, "generate"); /* a unique prefix */
    ck_assert_ptr_null(sp_cmd_find("se", why, sizeof why));
    ck_assert_str_eq(why, "ambiguous command 'se': set, servers, serve");
    ck_assert_ptr_null(sp_cmd_find("xyzzy", why, sizeof why));
    ck_assert_str_eq(why, "unknown command 'xyzzy' (try 'help')");
    const sp_cmd *sw = sp_cmd_find("swarm", why, sizeof why);
    ck_assert_str_eq(sp_cmd_find_in(sw->subs, "u", why, sizeof why)->name, "up");
    ck_assert_ptr_null(sp_cmd_find_in(sw->subs, "x", why, sizeof why));
    ck_assert_str_eq(why, "unknown subcommand 'x' (one of: up, down)");
    /* a typo: the nearest name or two, as git says them */
    ck_assert_ptr_null(sp_cmd_find("genrate", why, sizeof why));
    ck_assert_str_eq(why, "unknown command 'genrate' (did you mean generate?)");
    ck_assert_ptr_null(sp_cmd_find("sevrers", why, sizeof why)); /* two swapped count one */
    ck_assert_str_eq(why, "unknown command 'sevrers' (did you mean servers?)");
    ck_assert_ptr_null(sp_cmd_find("exti", why, sizeof why)); /* an alias is a name too */
    ck_assert_str_eq(why, "unknown command 'exti' (did you mean exit?)");
    const sp_cmd *m = sp_cmd_find("model", why, sizeof why);
    ck_assert_ptr_null(sp_cmd_find_in(m->subs, "chek", why, sizeof why));
    ck_assert_str_eq(why, "unknown subcommand 'chek' (did you mean check?)");
}
END_TEST

START_TEST(t_split)
{
    int argc;
    char **argv, why[128];
    ck_assert_int_eq(sp_cmd_split("a \"b c\" 'd \\e' f\\ g \"x\\\"y\\n\" \"\"", &argc, &argv, why, sizeof why), 0);
    ck_assert_int_eq(argc, 6);
    ck_assert_str_eq(argv[0], "a");
    ck_assert_str_eq(argv[1], "b c");
    ck_assert_str_eq(argv[2], "d \\e"); /* single quotes: as it is */
    ck_assert_str_eq(argv[3], "f g");
    ck_assert_str_eq(argv[4], "x\"y\n");
    ck_assert_str_eq(argv[5], "");
    ck_assert_ptr_null(argv[6]);
    sp_cmd_free_argv(argc, argv);
    ck_assert_int_eq(sp_cmd_split("echo 'open", &argc, &argv, why, sizeof why), -1);
    ck_assert_str_eq(why, "unbalanced single (') quote");
    const char *line = "echo \"a;b\" 'c#d' e\\;f; next # comment";
    ck_assert_str_eq(sp_cmd_end(line), "; next # comment");
    ck_assert_str_eq(sp_cmd_end(sp_cmd_end(line) + 1), "# comment");
}
END_TEST

/* Parses line against the command it names; 0, or 1 (the message in got.err). */
static int parse(const char *line, sp_args *a)
{
    clear();
    int argc;
    char **argv, why[128];
    ck_assert_int_eq(sp_cmd_split(line, &argc, &argv, why, sizeof why), 0);
    const sp_cmd *c = sp_cmd_find(argv[0], NULL, 0);
    int skip = 0;
    if (c->subs && argc > 1)
        c = sp_cmd_find_in(c->subs, argv[++skip], NULL, 0);
    int rc = sp_args_parse(&app, c, c->name, argc - skip, argv + skip, a);
    sp_cmd_free_argv(argc, argv);
    return rc;
}

START_TEST(t_parse)
{
    sp_args a;
    ck_assert_int_eq(parse("generate --temp 0.5 hi --top-k=3", &a), 0); /* a prefix, anywhere, NAME=VALUE */
    ck_assert_int_eq(a.npos, 1);
    ck_assert_str_eq(a.pos[0], "hi");
    ck_assert(sp_arg_num(&app, &a, k_of("generate", "--temperature")) == 0.5);
    ck_assert_int_eq(sp_arg_int(&app, &a, k_of("generate", "--top-k")), 3);
    ck_assert(sp_arg_given(&a, k_of("generate", "--top-k")) && !sp_arg_given(&a, k_of("generate", "--top-p")));
    ck_assert_int_eq(sp_arg_int(&app, &a, 99), 0); /* no such row */
    sp_args_free(&a);
    ck_assert_int_eq(parse("generate -- --not-an-option", &a), 0);
    ck_assert_str_eq(a.pos[0], "--not-an-option");
    sp_args_free(&a);
    ck_assert_int_eq(parse("generate hi --t 1", &a), 1);
    ck_assert_str_eq(got.err, "generate: ambiguous option '--t': --temperature, --top-k, --top-p\n");
    ck_assert_int_eq(parse("generate hi --top-p 2", &a), 1);
    ck_assert_str_eq(got.err, "generate: --top-p: expected a number in (0, 1], got '2'\n");
    ck_assert_int_eq(parse("eval sst2 --lr 1", &a), 1);
    ck_assert_str_eq(got.err, "eval: '--lr' is an option of train, not of eval\n");
    ck_assert_int_eq(parse("generate hi --temprature 1", &a), 1); /* a typo: the nearest option, not all 13 */
    ck_assert_str_eq(got.err, "generate: unknown option '--temprature' (did you mean --temperature?)\n");
    ck_assert_int_eq(parse("train sst2 --tuning deep-ptune", &a), 1); /* a choice's too */
    ck_assert_str_eq(got.err, "train: --tuning: 'deep-ptune' is not one of head, ptune, deep_ptune (did you mean "
                              "deep_ptune?)\n");
    ck_assert_int_eq(parse("route --x", &a), 1);
    ck_assert_str_eq(got.err, "route: unknown option '--x' (it takes none)\n");
    ck_assert_int_eq(parse("swarm up --long", &a), 1);
    ck_assert_str_eq(got.err, "up: '--long' is an option of servers, not of up\n");
    ck_assert_int_eq(parse("generate hi --greedy=1", &a), 1);
    ck_assert_str_eq(got.err, "generate: option '--greedy' takes no value\n");
    ck_assert_int_eq(parse("generate hi --seed", &a), 1);
    ck_assert_str_eq(got.err, "generate: option '--seed' needs a value (S)\n");
    ck_assert_int_eq(parse("generate a b", &a), 1);
    ck_assert_str_eq(got.err,
                     "generate: unexpected argument 'b' (usage: generate PROMPT; quote arguments with blanks)\n");
    ck_assert_int_eq(parse("sleep", &a), 1);
    ck_assert_str_eq(got.err, "sleep: missing SECONDS (usage: sleep SECONDS)\n");
    ck_assert_int_eq(parse("servers -l", &a), 0); /* a short name */
    ck_assert(sp_arg_given(&a, k_of("servers", "--long")));
    sp_args_free(&a);
    setenv("HOME", "/home/someone", 1);
    ck_assert_int_eq(parse("load ~/m", &a), 0); /* paths: ~ expanded */
    ck_assert_str_eq(a.pos[0], "/home/someone/m");
    sp_args_free(&a);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* values and settings */

START_TEST(t_values)
{
    sp_args a;
    ck_assert_int_eq(parse("generate hi", &a), 0);
    ck_assert_int_eq(sp_arg_int(&app, &a, k_of("generate", "--max-new-tokens")), 64); /* the setting's default */
    sp_args_free(&a);
    ck_assert_int_eq(run("set max-new 7"), 0);
    ck_assert_int_eq(parse("generate hi", &a), 0);
    ck_assert_int_eq(sp_arg_int(&app, &a, k_of("generate", "--max-new-tokens")), 7); /* its current value */
    sp_args_free(&a);
    ck_assert_int_eq(parse("model generate d", &a), 1); /* a required option */
    ck_assert_str_eq(got.err, "generate: needs --prompt TEXT\n"); /* (the path parse() gives) */
    char syn[512];
    sp_cmd_synopsis(sp_cmd_find_in(sp_cmd_find("model", NULL, 0)->subs, "generate", NULL, 0), "model generate", 0,
                    1000, 0, syn, sizeof syn);
    ck_assert_ptr_nonnull(strstr(syn, "model generate DIR --prompt TEXT [--max-new-tokens N]")); /* no brackets */
    ck_assert_int_eq(parse("model generate d --prompt x", &a), 0);
    ck_assert_int_eq(sp_arg_int(&app, &a, k_of("model generate", "--max-new-tokens")),
                     64); /* like the setting: its default, not its value */
    ck_assert_int_eq(sp_arg_choice(&app, &a, k_of("model generate", "--dtype")), 0); /* f32 */
    sp_args_free(&a);
    /* the range is the setting's, for the option and the setting alike (both were 2^20 and 1e6) */
    ck_assert_int_eq(parse("generate hi --max-new-tokens 1048576", &a), 0);
    sp_args_free(&a);
    ck_assert_int_eq(parse("generate hi --max-new-tokens 1048577", &a), 1);
    ck_assert_int_eq(run("set max-new-tokens 1048577"), 1);
    ck_assert_str_eq(got.err, "set: max-new-tokens: expected an integer in [0, 1048576], got '1048577'\n");
    /* a seed: an integer repeats, random draws */
    ck_assert_int_eq(parse("generate hi --seed 42", &a), 0);
    ck_assert_int_eq(sp_arg_seed(&app, &a, k_of("generate", "--seed")), 42);
    sp_args_free(&a);
    ck_assert_int_eq(parse("generate hi --seed random", &a), 0);
    unsigned long long s1 = sp_arg_seed(&app, &a, k_of("generate", "--seed")),
                       s2 = sp_arg_seed(&app, &a, k_of("generate", "--seed"));
    ck_assert(s1 != s2);
    sp_args_free(&a);
    ck_assert_int_eq(run("set ignore-eos on"), 0);
    ck_assert_int_eq(parse("generate hi", &a), 0);
    ck_assert_int_eq(sp_arg_on(&app, &a, k_of("generate", "--ignore-eos")), 1); /* --ignore-eos: the setting's on */
    sp_args_free(&a);
}
END_TEST

START_TEST(t_settings)
{
    ck_assert_int_eq(run("set temp 0.7; show temperature"), 0);
    ck_assert_ptr_nonnull(strstr(got.out, "temperature          0.7 "));
    ck_assert_int_eq(run("set t 1"), 1);
    ck_assert_ptr_nonnull(strstr(got.err, "set: ambiguous setting 't': temperature, top-k, top-p, threads"));
    ck_assert_int_eq(run("set temprature 1"), 1);
    ck_assert_str_eq(got.err, "set: unknown setting 'temprature' (did you mean temperature?; `show` lists them)\n");
    ck_assert_int_eq(run("set zzzzzzzz 1"), 1);
    ck_assert_str_eq(got.err, "set: unknown setting 'zzzzzzzz' (`show` lists them)\n");
    ck_assert_int_eq(run("set beams 0"), 1);
    ck_assert_str_eq(got.err, "set: beams: expected an integer in [1, 64], got '0'\n");
    ck_assert_int_eq(run("set seed 7; set seed random"), 0);
    ck_assert_int_eq(run("set seed lucky"), 1);
    ck_assert_int_eq(run("set dtype int4"), 1);
    ck_assert_str_eq(got.err, "set: dtype: 'int4' is not one of f32, bf16, fp16, int8, nf4 (did you mean int8?)\n");
    ck_assert_int_eq(run("set dtype fp16; set dtype f32"), 0);
    ck_assert_int_eq(run("set dtype f16; show dtype"), 0); /* an alias (SP_WTYPE_ALIASES): the setting holds its name */
    ck_assert_msg(!strncmp(got.out, "dtype", 5) && strstr(got.out, " fp16 ") && !strstr(got.out, "f16 "), "%s", got.out);
    ck_assert_int_eq(run("set dtype q8; show dtype; set dtype f32"), 0);
    ck_assert_msg(strstr(got.out, " int8 "), "%s", got.out);
    ck_assert_int_eq(run("set dtype fp61"), 1);
    ck_assert_str_eq(got.err, "set: dtype: 'fp61' is not one of f32, bf16, fp16, int8, nf4 (did you mean fp16?)\n");
    ck_assert_int_eq(run("set dtype quarter"), 1); /* nothing near */
    ck_assert_str_eq(got.err, "set: dtype: 'quarter' is not one of f32, bf16, fp16, int8, nf4\n");
    ck_assert_int_eq(run("set seeed 1"), 1);
    ck_assert_str_eq(got.err, "set: unknown setting 'seeed' (did you mean seed?; `show` lists them)\n");
    ck_assert_int_eq(run("set ignore-eos maybe"), 1);
    ck_assert_str_eq(got.err, "set: ignore-eos: expected on or off, got 'maybe'\n");
    char big[700];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    char why[256];
    ck_assert_int_eq(sp_app_set(&app, SP_SET_STOP, big, why, sizeof why), -1);
    ck_assert_str_eq(why, "stop: value too long (at most 511 bytes)");
    ck_assert_int_eq(run("set stop \"a b\"; show stop"), 0);
    ck_assert_ptr_nonnull(strstr(got.out, "stop                 \"a b\""));
    ck_assert(sp_app_num(&app, SP_SET_TEMPERATURE) == 0.7);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* help */

START_TEST(t_help)
{
    app.width = 60;
    ck_assert_int_eq(run("help generate"), 0);
    ck_assert_ptr_nonnull(strstr(got.out, "usage: generate PROMPT [--max-new-tokens N]"));
    ck_assert_ptr_nonnull(strstr(got.out, "aliases: gen\n"));
    ck_assert_ptr_nonnull(strstr(got.out, "\noptions:\n  --max-new-tokens N "));
    ck_assert_ptr_nonnull(strstr(got.out, "max-new-tokens setting) [>= 0]"));
    ck_assert_ptr_nonnull(strstr(got.out, "\nexamples:\n  generate \"Once upon a time\""));
    int lines = 0;
    *strstr(got.out, "\nexamples:") = 0;   /* examples are lines to copy, never wrapped */
    for (char *l = got.out; *l; lines++) { /* wrapped at 60; a range never split */
        size_t n = strcspn(l, "\n");
        ck_assert_msg(n <= 60, "a line of %zu columns: %.*s", n, (int)n, l);
        ck_assert_msg(!(n > 3 && !strncmp(l + n - 3, " [0", 3)), "a split range: %.*s", (int)n, l);
        l += n + (l[n] == '\n');
    }
    ck_assert_int_gt(lines, 30);
    ck_assert_int_eq(run("help"), 0); /* the list: every command, a summary in the column after it */
    ck_assert_ptr_nonnull(strstr(got.out, "\ncore:\n  help             list the commands"));
    ck_assert_ptr_nonnull(strstr(got.out, "  model convert-llama2c\n                   convert a llama2.c"));
    ck_assert_ptr_nonnull(strstr(got.out, "(also: gen)"));
    ck_assert_int_eq(run("help swarm"), 0);
    ck_assert_ptr_nonnull(strstr(got.out, "usage: swarm up|down ...\n"));
    ck_assert_ptr_nonnull(strstr(got.out, "\nsubcommands (`help swarm NAME` says more):\n  swarm up N"));
    ck_assert_int_eq(run("help servers"), 0);
    ck_assert_ptr_nonnull(strstr(got.out, "  --long, -l  every field"));
    ck_assert_int_eq(run("help nope"), 1);
    ck_assert_str_eq(got.err, "help: unknown command 'nope' (try 'help')\n");
    char syn[256];
    sp_cmd_synopsis(sp_cmd_find("sleep", NULL, 0), "sleep", 0, 80, 4, syn, sizeof syn);
    ck_assert_str_eq(syn, "sleep SECONDS");
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* completion */

/* The candidates for the last word of line (after its last blank), ", "-joined. */
static const char *complete(const char *line, int *files)
{
    static char buf[4096];
    const char *word = strrchr(line, ' ') ? strrchr(line, ' ') + 1 : line;
    char before[256], why[64];
    snprintf(before, sizeof before, "%.*s", (int)(word - line), line);
    int argc = 0;
    char **argv = NULL;
    ck_assert_int_eq(sp_cmd_split(before, &argc, &argv, why, sizeof why), 0);
    sp_strlist l = {0};
    sp_cmd_complete(&app, argc, argv, word, &l, files);
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < l.n && n < sizeof buf; i++)
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%s", i ? ", " : "", l.v[i]);
    sp_strlist_free(&l);
    sp_cmd_free_argv(argc, argv);
    return buf;
}

START_TEST(t_complete)
{
    int files;
    ck_assert_str_eq(complete("ge", &files), "generate"); /* not gen: Tab would stop there */
    ck_assert_str_eq(complete("ex", &files), "exit"); /* an alias whose command is not named */
    ck_assert_str_eq(complete("q", &files), "quit");
    ck_assert_str_eq(complete("generate --to", &files), "--top-k, --top-p");
    ck_assert_str_eq(complete("train sst2 --tuning ", &files), "head, ptune, deep_ptune");
    ck_assert_str_eq(complete("generate x --seed ", &files), "random");
    ck_assert_str_eq(complete("swarm ", &files), "up, down");
    ck_assert_str_eq(complete("set dt", &files), "dtype");
    ck_assert_str_eq(complete("set dtype ", &files), "f32, bf16, fp16, int8, nf4");
    ck_assert_str_eq(complete("set ignore-eos o", &files), "on, off");
    ck_assert_str_eq(complete("show b", &files), "beams, blocks-per-server, blocked-servers");
    ck_assert_str_eq(complete("show beams ", &files), "");
    ck_assert_str_eq(complete("help mo", &files), "model, models");
    ck_assert_str_eq(complete("train ", &files), "sst2, causal_lm");
    ck_assert_int_eq(files, 0);
    const char *dir = sp_test_tmpdir();
    char path[512], line[600];
    snprintf(path, sizeof path, "%s/model-a", dir);
    fclose(fopen(path, "w"));
    snprintf(line, sizeof line, "load %s/mod", dir);
    snprintf(path, sizeof path, "%s/model-a", dir);
    ck_assert_str_eq(complete(line, &files), path); /* a path: file names */
    ck_assert_int_eq(files, 1);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* scripts */

START_TEST(t_script)
{
    ck_assert_int_eq(run("echo a; echo 'b;c' # echo d"), 0);
    ck_assert_str_eq(got.out, "a\nb;c\n");
    ck_assert_int_eq(run("echo x; bogus; echo y"), 1); /* the first failure ends the line */
    ck_assert_str_eq(got.out, "x\n");
    ck_assert_str_eq(got.err, "unknown command 'bogus' (try 'help')\n");
    app.keep_going = 1;
    ck_assert_int_eq(run("echo x; bogus; echo y"), 0); /* -k goes on; the failure is counted */
    ck_assert_str_eq(got.out, "x\ny\n");
    ck_assert_int_eq(app.failed, 1);
    app.keep_going = 0;
    app.dry_run = 1;
    ck_assert_int_eq(run("echo not run; generate hi --top-k 3"), 0); /* checked, not run */
    ck_assert_str_eq(got.out, "");
    ck_assert_int_eq(run("generate hi --top-k x"), 1);
    app.dry_run = 0;
    const char *p = sp_test_write_file("s.sepal", "# a script\necho one\n\necho two; nope\necho three\n", 44);
    clear();
    ck_assert_int_eq(sp_cmd_run_script(&app, p), 1);
    ck_assert_str_eq(got.out, "one\ntwo\n");
    char want[600];
    snprintf(want, sizeof want, "%s:4: unknown command 'nope' (try 'help')\n", p);
    ck_assert_str_eq(got.err, want);
    ck_assert_str_eq(app.where, "");
    clear();
    ck_assert_int_eq(sp_cmd_run_script(&app, "/nonexistent/x.sepal"), 1);
    ck_assert_str_eq(got.err, "/nonexistent/x.sepal: No such file or directory\n");
    ck_assert_int_eq(run("quit; echo after"), 0); /* quit ends the line */
    ck_assert_str_eq(got.out, "");
    ck_assert_int_eq(app.quit, 1);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* text tables (the `servers` table) */

/* The width of the widest line of text (characters, not bytes). */
static int widest(const char *text)
{
    int most = 0, w = 0;
    for (const char *p = text; *p; p++) {
        if (*p == '\n') {
            most = w > most ? w : most;
            w = 0;
        } else {
            w += ((unsigned char)*p & 0xC0) != 0x80;
        }
    }
    return w > most ? w : most;
}

START_TEST(t_text_table)
{
    static const sp_col cols[] = {
        {"id", 8, 8, 0, 100}, {"name", 4, 12, 0, 40}, {"blocks", 0, 0, 0, 95}, {"tok/s", 0, 0, 1, 80},
        {"version", 0, 0, 0, 10},
    };
    const char *cells[] = {
        "0123456789abcdef", "alice-with-a-long-name", "0:2", "10851", "0.1.0",
        "fedcba9876543210", sp_server_shown_name("", 1), "2:4", "7", "0.1.0",
        "00112233aabbccdd", sp_server_shown_name("", 0), "4:6", "12", "0.1.0",
        "99887766554433ee", "ünïcödé-näme-long", "6:8", "9", NULL,
    };
    /* no limit (not a terminal): every column, ids cut to 8 and names to 12, numbers right-aligned, no blanks at
     * the ends of lines */
    sp_table_out(&app, cols, 5, cells, 4, 0);
    ck_assert_str_eq(got.out, "id       name         blocks tok/s version\n"
                              "01234567 alice-with-a 0:2    10851 0.1.0\n"
                              "fedcba98 local        2:4        7 0.1.0\n"
                              "00112233 -            4:6       12 0.1.0\n"
                              "99887766 ünïcödé-näme 6:8        9\n");
    /* narrower: the name is cut (to 4 at the least), then the version goes, then the name, then tok/s ... */
    const int widths[] = {42, 41, 34, 33, 25, 21, 15, 12};
    const char *gone[] = {"", "alice-with-a ", "alice", "version", "name", "name", "tok/s", "0:2"};
    for (size_t i = 0; i < sizeof widths / sizeof *widths; i++) {
        clear();
        sp_table_out(&app, cols, 5, cells, 4, widths[i]);
        ck_assert_msg(widest(got.out) <= widths[i], "width %d: a line of %d\n%s", widths[i], widest(got.out), got.out);
        if (*gone[i])
            ck_assert_msg(!strstr(got.out, gone[i]), "width %d: %s still there\n%s", widths[i], gone[i], got.out);
        ck_assert_msg(strstr(got.out, "01234567") && (widths[i] < 15 || strstr(got.out, "0:2")),
                      "width %d: id and blocks\n%s", widths[i], got.out);
    }
    ck_assert_str_eq(got.out, "id\n01234567\nfedcba98\n00112233\n99887766\n"); /* 12: the id alone */
    clear();
    sp_table_out(&app, cols, 5, cells, 4, 30); /* no version; 8 + 4 + 6 + 5 + 3 blanks = 26: the name cut to 8 */
    ck_assert_str_eq(got.out, "id       name     blocks tok/s\n"
                              "01234567 alice-wi 0:2    10851\n"
                              "fedcba98 local    2:4        7\n"
                              "00112233 -        4:6       12\n"
                              "99887766 ünïcödé- 6:8        9\n");
    clear();
    sp_table_out(&app, cols, 5, cells, 4, 5); /* not even the id fits: every column rather than none */
    ck_assert(strstr(got.out, "version"));
    clear();
    sp_table_out(&app, cols, 5, cells, 0, 80); /* no rows: the titles */
    ck_assert_str_eq(got.out, "id name blocks tok/s version\n");
    /* the line front end asks its sink; without one the app's width counts (the TUI sets it) */
    app.width = 77;
    ck_assert_int_eq(sp_app_columns(&app), 77);
    app.width = 0;
    ck_assert_int_eq(sp_app_columns(&app), 0);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* the helpers both front ends use (common/) */

START_TEST(t_front_helpers)
{
    char d[32];
    const double s[] = {-1, 0.4, 59.4, 60, 3599.9, 3600, 7384, 1e14, 1e300};
    const char *want[] = {"?", "0s", "59s", "1m00s", "59m59s", "1h00m", "2h03m", "27777777777h46m", "?"};
    for (size_t i = 0; i < sizeof s / sizeof *s; i++) {
        sp_fmt_duration(s[i], d, sizeof d);
        ck_assert_str_eq(d, want[i]);
    }
    setenv("HOME", "/home/someone", 1);
    unsetenv("SEPAL_HISTORY");
    char *h = sp_history_path();
    ck_assert_str_eq(h, "/home/someone/.sepal_history");
    free(h);
    setenv("SEPAL_HISTORY", "~/h", 1);
    h = sp_history_path();
    ck_assert_str_eq(h, "/home/someone/h");
    free(h);
    unsetenv("SEPAL_HISTORY");
    unsetenv("HOME");
    ck_assert_ptr_null(sp_history_path());
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cmd");
    TCase *tc = tcase_create("cmd");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, t_tables);
    tcase_add_test(tc, t_defaults_are_the_libraries);
    tcase_add_test(tc, t_opt_values);
    tcase_add_test(tc, t_opt_find);
    tcase_add_test(tc, t_opt_walk);
    tcase_add_test(tc, t_opt_help);
    tcase_add_test(tc, t_lookup);
    tcase_add_test(tc, t_split);
    tcase_add_test(tc, t_parse);
    tcase_add_test(tc, t_values);
    tcase_add_test(tc, t_settings);
    tcase_add_test(tc, t_help);
    tcase_add_test(tc, t_complete);
    tcase_add_test(tc, t_script);
    tcase_add_test(tc, t_front_helpers);
    tcase_add_test(tc, t_text_table);
    suite_add_tcase(s, tc);
    return sp_test_run(s);
}
