/* script.c - running commands: one line (';' between commands, '#' a comment), a script file or stdin (each
 * line's position in messages, the first failure ends it unless keep_going), and the -f argument of the front
 * ends (a file, ~ expanded, or "-" for stdin). A command runs through its table: subcommands, arguments, then
 * its handler (under --dry-run: its check, if it has one). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"

static int run_argv(sp_app *app, int argc, char **argv)
{
    char why[512], path[128];
    const sp_cmd *c = sp_cmd_find(argv[0], why, sizeof why);
    if (!c)
        return sp_app_error(app, "%s", why);
    snprintf(path, sizeof path, "%s", c->name);
    int skip = 0; /* words of argv that named (sub)commands, minus one */
    while (c->subs) {
        if (argc - skip < 2) {
            if (c->fn)
                break;
            char syn[1024];
            sp_cmd_synopsis(c, path, 0, 1000, 0, syn, sizeof syn);
            return sp_app_error(app, "%s: which one? usage: %s", path, syn);
        }
        const sp_cmd *s = sp_cmd_find_in(c->subs, argv[skip + 1], why, sizeof why);
        if (!s)
            return sp_app_error(app, "%s: %s", path, why);
        c = s;
        skip++;
        size_t n = strlen(path);
        snprintf(path + n, sizeof path - n, " %s", c->name);
    }
    sp_args a;
    if (sp_args_parse(app, c, path, argc - skip, argv + skip, &a))
        return 1;
    int rc = !app->dry_run ? c->fn(app, &a) : c->check ? c->check(app, &a) : 0;
    sp_args_free(&a);
    return rc ? 1 : 0;
}

static int run_command(sp_app *app, const char *text, size_t len)
{
    char *s = strndup(text, len);
    if (!s)
        return sp_app_error(app, "out of memory");
    char why[256];
    int argc = 0;
    char **argv = NULL;
    int rc = sp_cmd_split(s, &argc, &argv, why, sizeof why);
    free(s);
    if (rc)
        return sp_app_error(app, "%s", why);
    rc = argc ? run_argv(app, argc, argv) : 0;
    sp_cmd_free_argv(argc, argv);
    return rc;
}

int sp_cmd_run_line(sp_app *app, const char *line)
{
    int failed = 0;
    for (const char *p = line; !app->quit;) {
        const char *end = sp_cmd_end(p);
        int rc = run_command(app, p, (size_t)(end - p));
        if (rc && (!app->keep_going || sp_app_cancelled(app)))
            return rc;
        if (rc)
            failed = 1, app->failed++;
        if (sp_app_cancelled(app))
            return 1;
        if (*end != ';')
            break;
        p = end + 1;
    }
    return failed && !app->keep_going;
}

int sp_cmd_run_file(sp_app *app, FILE *f, const char *name)
{
    char *line = NULL;
    size_t cap = 0;
    long lineno = 0;
    int rc = 0;
    while (!rc && !app->quit && !sp_app_cancelled(app) && getline(&line, &cap, f) >= 0) {
        line[strcspn(line, "\r\n")] = 0;
        snprintf(app->where, sizeof app->where, "%s:%ld", name, ++lineno);
        const char *first = line + strspn(line, " \t");
        if (*first && *first != '#') {
            sp_ui_event ev = {.kind = SP_UI_LINE, .text = line, .where = app->where};
            sp_emit(app, &ev);
        }
        int before = app->nerrors;
        rc = sp_cmd_run_line(app, line);
        if (rc && app->nerrors == before && !sp_app_cancelled(app))
            sp_app_error(app, "command failed");
    }
    if (!rc && ferror(f) && !sp_app_cancelled(app)) {
        snprintf(app->where, sizeof app->where, "%s", name);
        rc = sp_app_error(app, "read error: %s", strerror(errno));
    }
    app->where[0] = 0;
    free(line);
    return rc || sp_app_cancelled(app);
}

int sp_cmd_run_script(sp_app *app, const char *path)
{
    if (!strcmp(path, "-"))
        return sp_cmd_run_file(app, stdin, "<stdin>");
    char *p = sp_expand_tilde(path);
    FILE *f = p ? fopen(p, "r") : NULL;
    if (!f) {
        int rc = sp_app_error(app, "%s: %s", path, p ? strerror(errno) : "out of memory");
        free(p);
        return rc;
    }
    int rc = sp_cmd_run_file(app, f, path);
    fclose(f);
    free(p);
    return rc;
}
