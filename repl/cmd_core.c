/* cmd_core.c - the core commands: help, quit, set, show, echo, sleep. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "app.h"

#define SYNOPSIS_WIDTH 32

/* ---------------------------------------------------------------------------------------------- */
/* help */

/* "exit,q" as "exit, q". */
static void print_aliases(const char *aliases)
{
    for (const char *p = aliases; *p; p++) {
        if (*p == ',')
            fputs(", ", stdout);
        else
            putchar(*p);
    }
}

static void help_line(const sp_cmd *c)
{
    char syn[256];
    int n = snprintf(syn, sizeof syn, "%s%s%s", c->name, c->args && *c->args ? " " : "", c->args ? c->args : "");
    if (n >= SYNOPSIS_WIDTH)
        printf("  %s\n  %-*s  %s", syn, SYNOPSIS_WIDTH, "", c->summary ? c->summary : "");
    else
        printf("  %-*s  %s", SYNOPSIS_WIDTH, syn, c->summary ? c->summary : "");
    if (c->aliases && *c->aliases) {
        printf(" (also: ");
        print_aliases(c->aliases);
        printf(")");
    }
    printf("\n");
}

static void help_all(void)
{
    printf("commands (a unique prefix of a name is enough; `help COMMAND` says more):\n");
    for (const sp_cmd_group *g = sp_cmd_groups; g->cmds; g++) {
        if (!g->cmds[0].name)
            continue;
        printf("\n%s:\n", g->title);
        for (const sp_cmd *c = g->cmds; c->name; c++)
            help_line(c);
    }
    printf("\nCommands are separated by ';'; '#' starts a comment; quote arguments with \"...\" or '...'.\n");
}

static void help_one(const sp_cmd *c)
{
    printf("usage: %s%s%s\n", c->name, c->args && *c->args ? " " : "", c->args ? c->args : "");
    if (c->aliases && *c->aliases) {
        printf("aliases: ");
        print_aliases(c->aliases);
        printf("\n");
    }
    if (c->summary)
        printf("\n%s\n", c->summary);
    if (c->help)
        printf("\n%s%s", c->help, c->help[0] && c->help[strlen(c->help) - 1] == '\n' ? "" : "\n");
}

static int cmd_help(sp_app *app, int argc, char **argv)
{
    if (argc > 2)
        return sp_app_error(app, "usage: help [COMMAND]");
    if (argc == 1) {
        help_all();
        return 0;
    }
    char why[512];
    const sp_cmd *c = sp_cmd_find(argv[1], why, sizeof why);
    if (!c)
        return sp_app_error(app, "help: %s", why);
    help_one(c);
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* quit, echo, sleep */

static int cmd_quit(sp_app *app, int argc, char **argv)
{
    if (argc > 1)
        return sp_app_error(app, "usage: quit");
    app->quit = 1;
    return 0;
}

static int cmd_echo(sp_app *app, int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        printf("%s%s", argv[i], i + 1 < argc ? " " : "");
    printf("\n");
    return 0;
}

static int cmd_sleep(sp_app *app, int argc, char **argv)
{
    if (argc != 2)
        return sp_app_error(app, "usage: sleep SECONDS");
    char *end;
    errno = 0;
    double s = strtod(argv[1], &end);
    if (errno || end == argv[1] || *end || !isfinite(s) || s < 0 || s > 1e6)
        return sp_app_error(app, "sleep: expected seconds in [0, 1e6], got '%s'", argv[1]);
    fflush(stdout);
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - floor(s)) * 1e9)};
    while (nanosleep(&ts, &ts) && errno == EINTR)
        ;
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* set, show */

static int cmd_set(sp_app *app, int argc, char **argv)
{
    if (argc != 3)
        return sp_app_error(app, "usage: set NAME VALUE (`show` lists the settings)");
    char why[512];
    if (sp_app_check(app, argv[1], argv[2], why, sizeof why))
        return sp_app_error(app, "set: %s", why);
    sp_app_set(app, argv[1], argv[2]);
    return 0;
}

/* A string setting as `set` would read it back: in double quotes, with escapes. */
static void print_quoted(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if (*s == '\n' || *s == '\t')
            printf("\\%c", *s == '\n' ? 'n' : 't');
        else
            putchar(*s);
    }
    putchar('"');
}

static void show_setting(const sp_setting *s, int with_help)
{
    int len = (int)strlen(s->value) + (s->kind == SP_SET_STR ? 2 : 0);
    printf("%-20s ", s->name);
    if (s->kind == SP_SET_STR)
        print_quoted(s->value);
    else
        fputs(s->value, stdout);
    if (with_help)
        printf("%*s  %s", len < 8 ? 8 - len : 0, "", s->help ? s->help : "");
    printf("\n");
}

static int cmd_show(sp_app *app, int argc, char **argv)
{
    if (argc > 2)
        return sp_app_error(app, "usage: show [NAME]");
    for (int i = 0; i < app->nsettings; i++)
        if (argc == 1 || !strcmp(app->settings[i].name, argv[1])) {
            show_setting(&app->settings[i], 1);
            if (argc == 2)
                return 0;
        }
    if (argc == 2)
        return sp_app_error(app, "show: unknown setting '%s' (try 'show')", argv[1]);
    return 0;
}

const sp_cmd sp_cmds_core[] = {
    {"help", "?", "[COMMAND]", "list the commands, or describe one",
     "Without an argument, lists every command with its arguments and summary. With a COMMAND (a name, an\n"
     "alias or a unique prefix), prints its usage and this longer help.",
     cmd_help},
    {"quit", "exit,q", "", "leave sepal (Ctrl-D too)",
     "Ends the interactive session, or stops a script (-f, -c, stdin) without an error.", cmd_quit},
    {"set", NULL, "NAME VALUE", "change a setting (`show` lists them)",
     "Sets a default of the generate and swarm commands, e.g. `set temperature 0.7`. Numeric settings\n"
     "refuse values that are not numbers or are out of their range. Quote a value with blanks:\n"
     "`set stop \"\\n\\n\"`.",
     cmd_set},
    {"show", NULL, "[NAME]", "print the settings with their values and help",
     "Without an argument, prints every setting, its value and what it does; with NAME, that setting only.\n"
     "String values are printed quoted, the way `set` reads them.",
     cmd_show},
    {"echo", NULL, "[ARGS...]", "print the arguments, joined by spaces",
     "Prints its arguments after quote removal, separated by single spaces; handy in scripts.", cmd_echo},
    {"sleep", NULL, "SECONDS", "wait (fractions allowed)", "Waits SECONDS seconds, e.g. `sleep 0.5`.", cmd_sleep},
    {0},
};
