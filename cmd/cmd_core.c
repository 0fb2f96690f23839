/* cmd_core.c - the core commands: help, quit, set, show, echo, sleep. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "app.h"
#include "version.h"

static int width_of(const sp_app *app) { return app->width > 0 ? app->width : 100; }

static int cmd_help(sp_app *app, const sp_args *a)
{
    if (a->npos == 0) {
        sp_cmd_help(app, NULL, NULL, width_of(app));
        return 0;
    }
    char why[512], path[128];
    const sp_cmd *c = sp_cmd_find(a->pos[0], why, sizeof why);
    if (!c)
        return sp_app_error(app, "help: %s", why);
    snprintf(path, sizeof path, "%s", c->name);
    for (int i = 1; i < a->npos; i++) {
        if (!c->subs)
            return sp_app_error(app, "help: %s has no subcommands", path);
        const sp_cmd *s = sp_cmd_find_in(c->subs, a->pos[i], why, sizeof why);
        if (!s)
            return sp_app_error(app, "help: %s: %s", path, why);
        c = s;
        size_t n = strlen(path);
        snprintf(path + n, sizeof path - n, " %s", c->name);
    }
    sp_cmd_help(app, c, path, width_of(app));
    return 0;
}

static int cmd_quit(sp_app *app, const sp_args *a)
{
    (void)a;
    app->quit = 1;
    return 0;
}

static int cmd_echo(sp_app *app, const sp_args *a)
{
    for (int i = 0; i < a->npos; i++)
        sp_out(app, "%s%s", a->pos[i], i + 1 < a->npos ? " " : "");
    sp_out(app, "\n");
    return 0;
}

static int cmd_sleep(sp_app *app, const sp_args *a)
{
    char *end;
    errno = 0;
    double s = strtod(a->pos[0], &end);
    if (errno || end == a->pos[0] || *end || !isfinite(s) || s < 0 || s > 1e6)
        return sp_app_error(app, "sleep: expected seconds in [0, 1e6], got '%s'", a->pos[0]);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) { /* in slices, so that Ctrl-C stops it */
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double left = s - ((double)(now.tv_sec - t0.tv_sec) + (double)(now.tv_nsec - t0.tv_nsec) * 1e-9);
        if (left <= 0)
            return 0;
        if (sp_app_cancelled(app))
            return sp_app_error(app, "sleep: interrupted");
        double d = left < 0.05 ? left : 0.05;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)(d * 1e9)};
        nanosleep(&ts, NULL);
    }
}

static int cmd_set(sp_app *app, const sp_args *a)
{
    char why[512];
    int k = sp_app_setting(app, a->pos[0], why, sizeof why);
    if (k < 0 || sp_app_set(app, (sp_set)k, a->pos[1], why, sizeof why))
        return sp_app_error(app, "set: %s", why);
    return 0;
}

/* A string setting as `set` would read it back: in double quotes, with escapes. */
static void quoted(const char *s, char *buf, size_t cap)
{
    size_t n = 0;
    if (cap < 4)
        return;
    buf[n++] = '"';
    for (; *s && n + 4 < cap; s++) {
        if (*s == '"' || *s == '\\')
            buf[n++] = '\\', buf[n++] = *s;
        else if (*s == '\n' || *s == '\t')
            buf[n++] = '\\', buf[n++] = *s == '\n' ? 'n' : 't';
        else
            buf[n++] = *s;
    }
    buf[n++] = '"';
    buf[n] = 0;
}

static void show_setting(sp_app *app, sp_set k)
{
    const sp_opt *s = &sp_settings[k];
    char v[1100];
    if (s->kind == SP_OPT_STR || s->kind == SP_OPT_PATH)
        quoted(sp_app_get(app, k), v, sizeof v);
    else
        snprintf(v, sizeof v, "%s", sp_app_get(app, k));
    sp_out(app, "%-20s %-8s  %s\n", s->name, v, s->help ? s->help : "");
}

static int cmd_show(sp_app *app, const sp_args *a)
{
    if (a->npos == 0) {
        for (int k = 0; k < SP_SET_N; k++)
            show_setting(app, (sp_set)k);
        return 0;
    }
    char why[512];
    int k = sp_app_setting(app, a->pos[0], why, sizeof why);
    if (k < 0)
        return sp_app_error(app, "show: %s", why);
    show_setting(app, (sp_set)k);
    return 0;
}

static int cmd_version(sp_app *app, const sp_args *a)
{
    (void)a;
    sp_out(app, "sepal %s\n", SEPAL_VERSION);
    return 0;
}

/* Tab completion: help COMMAND; set NAME VALUE; show NAME. */
static void complete_help(const sp_app *app, int npos, const char *prev, const char *word, sp_strlist *out)
{
    (void)app, (void)prev;
    if (npos == 0)
        sp_complete_commands(out, NULL, word, 0);
}

static void complete_set(const sp_app *app, int npos, const char *prev, const char *word, sp_strlist *out)
{
    int k = npos == 1 ? sp_app_setting(app, prev, NULL, 0) : -1;
    if (npos == 0)
        sp_complete_names(out, sp_settings, word);
    else if (k >= 0)
        sp_complete_value(out, &sp_settings[k], word);
}

static void complete_show(const sp_app *app, int npos, const char *prev, const char *word, sp_strlist *out)
{
    if (npos == 0)
        complete_set(app, npos, prev, word, out);
}

const sp_cmd sp_cmds_core[] = {
    {.name = "help", .aliases = "?", .args = "[COMMAND [SUBCOMMAND]]", .min_pos = 0, .max_pos = 2,
     .summary = "list the commands, or describe one with its options",
     .help = "Without an argument, lists every command with its summary. With a COMMAND (a name, an alias or a "
             "unique prefix), prints its usage, what it does, each option with its default and range, and examples.",
     .examples = "help generate\nhelp swarm up", .fn = cmd_help, .complete = complete_help},
    {.name = "quit", .aliases = "exit,q", .args = "", .max_pos = 0, .summary = "leave sepal (Ctrl-D too)",
     .help = "Ends the interactive session, or stops a script (-f, -c, stdin) without an error. Servers started by "
             "`swarm up` stop (each announces that it goes offline).",
     .fn = cmd_quit},
    {.name = "set", .args = "NAME VALUE", .min_pos = 2, .max_pos = 2, .summary = "change a setting (`show` lists them)",
     .help = "Sets a default of the generate and swarm commands, e.g. `set temperature 0.7`; a unique prefix of a "
             "name is enough (`set temp 0.7`). Numeric settings refuse values that are not numbers or are out of "
             "their range. Quote a value with blanks: `set stop \"\\n\\n\"`.",
     .examples = "set temperature 0.8\nset temp 0\nset seed random", .fn = cmd_set, .complete = complete_set},
    {.name = "show", .args = "[NAME]", .max_pos = 1, .summary = "print the settings with their values and help",
     .help = "Without an argument, prints every setting, its value and what it does; with NAME (or a unique "
             "prefix), that setting only. String values are printed quoted, the way `set` reads them.",
     .examples = "show\nshow max-new", .fn = cmd_show, .complete = complete_show},
    {.name = "echo", .args = "[ARGS...]", .max_pos = -1, .summary = "print the arguments, joined by spaces",
     .help = "Prints its arguments after quote removal, separated by single spaces; handy in scripts.",
     .examples = "echo hello world", .fn = cmd_echo},
    {.name = "sleep", .args = "SECONDS", .min_pos = 1, .max_pos = 1, .summary = "wait (fractions allowed)",
     .help = "Waits SECONDS seconds, e.g. `sleep 0.5` (Ctrl-C ends the wait).", .examples = "sleep 0.1",
     .fn = cmd_sleep},
    {.name = "version", .args = "", .max_pos = 0, .summary = "print the version", .examples = "version",
     .fn = cmd_version},
    {0},
};
