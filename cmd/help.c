/* help.c - what `help` says, generated from the command tables: the list of commands (each summary in a column,
 * wrapped), one command's usage, text, subcommands, options (common/opt.h's help of its option table) and
 * examples; the synopsis `usage:` lines show; and the dumps the README check reads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"

/* A line of help text to the app's sink. */
static void out_line(void *user, const char *line) { sp_out(user, "%s\n", line); }

/* Appends a word to a wrapped synopsis: a new line (indent blanks) when it would pass width. */
typedef struct wrap {
    char *buf;
    size_t cap, len;
    int col, width, indent;
} wrap;

static void wrap_word(wrap *w, const char *word)
{
    int n = (int)strlen(word);
    if (w->len >= w->cap)
        return;
    if (w->len && w->col > w->indent && w->col + 1 + n > w->width) {
        w->len += (size_t)snprintf(w->buf + w->len, w->cap - w->len, "\n%*s", w->indent, "");
        w->col = w->indent;
    } else if (w->col > w->indent || (w->len && w->buf[w->len - 1] != ' ' && w->buf[w->len - 1] != '\n')) {
        w->len += (size_t)snprintf(w->buf + w->len, w->cap - w->len, " ");
        w->col++;
    }
    if (w->len < w->cap)
        w->len += (size_t)snprintf(w->buf + w->len, w->cap - w->len, "%s", word);
    w->col += n;
    if (w->len >= w->cap)
        w->len = w->cap - 1;
}

void sp_cmd_synopsis(const sp_cmd *c, const char *path, int at, int width, int indent, char *buf, size_t cap)
{
    wrap w = {.buf = buf, .cap = cap, .width = width, .indent = indent, .col = at};
    buf[0] = 0;
    wrap_word(&w, path);
    if (c->subs && !c->fn) {
        char subs[256] = "";
        size_t len = 0;
        int first = 1;
        for (const sp_cmd *s = c->subs; s->name; s++) {
            if (len < sizeof subs)
                len += (size_t)snprintf(subs + len, sizeof subs - len, "%s%s", first ? "" : "|", s->name);
            first = 0;
        }
        wrap_word(&w, subs);
        wrap_word(&w, "...");
        return;
    }
    if (c->args && *c->args) {
        /* the positional synopsis stays whole per word */
        char tmp[256];
        snprintf(tmp, sizeof tmp, "%s", c->args);
        for (char *save = NULL, *t = strtok_r(tmp, " ", &save); t; t = strtok_r(NULL, " ", &save))
            wrap_word(&w, t);
    }
    for (int i = 0; c->opts && c->opts[i].name; i++) {
        char o[128];
        sp_opt_synopsis(&c->opts[i], o, sizeof o);
        wrap_word(&w, o);
    }
}

/* One row of the list: the name, then the summary (and aliases) in the column after it, wrapped there. */
static void help_line(sp_app *app, const sp_cmd *c, const char *name, int width)
{
    char aliases[128] = "";
    for (size_t i = 0, n = 0; c->aliases && c->aliases[i] && n + 3 < sizeof aliases; i++) {
        if (c->aliases[i] == ',')
            aliases[n++] = ',', aliases[n++] = ' ';
        else
            aliases[n++] = c->aliases[i];
        aliases[n] = 0;
    }
    char text[512];
    snprintf(text, sizeof text, "%s%s%s%s", c->summary ? c->summary : "", c->aliases ? " (also: " : "", aliases,
             c->aliases ? ")" : "");
    sp_opt_columns(name, 19, text, width, out_line, app);
}

static void help_all(sp_app *app, int width)
{
    sp_out(app, "commands (a unique prefix of a name is enough; `help COMMAND` shows its options):\n");
    for (const sp_cmd_group *g = sp_cmd_groups; g->cmds; g++) {
        if (!g->cmds[0].name)
            continue;
        sp_out(app, "\n%s:\n", g->title);
        for (const sp_cmd *c = g->cmds; c->name; c++) {
            if (c->fn || !c->subs)
                help_line(app, c, c->name, width);
            for (const sp_cmd *s = c->subs; s && s->name; s++) { /* subcommands get rows of their own */
                char name[64];
                snprintf(name, sizeof name, "%s %s", c->name, s->name);
                help_line(app, s, name, width);
            }
        }
    }
    sp_out(app, "\nCommands are separated by ';'; '#' starts a comment; quote arguments with \"...\" or '...'.\n"
                "Ctrl-C stops the command that runs (the swarm stays up); Ctrl-D or `quit` leaves.\n");
}

void sp_cmd_help(sp_app *app, const sp_cmd *c, const char *path, int width)
{
    if (width < 40)
        width = 40;
    if (!c) {
        help_all(app, width);
        return;
    }
    char syn[4096];
    int indent = 7 + (int)strlen(path) + 1 > width / 2 ? 8 : 7 + (int)strlen(path) + 1; /* under the arguments */
    sp_cmd_synopsis(c, path, 7, width, indent, syn, sizeof syn);                        /* after "usage: " */
    sp_out(app, "usage: %s\n", syn);
    if (c->aliases && *c->aliases)
        sp_out(app, "aliases: %s\n", c->aliases);
    if (c->summary) {
        sp_out(app, "\n");
        sp_opt_wrap(c->summary, width, 0, out_line, app);
    }
    if (c->help) {
        sp_out(app, "\n");
        sp_opt_wrap(c->help, width, 0, out_line, app);
    }
    if (c->subs) {
        sp_out(app, "\nsubcommands (`help %s NAME` says more):\n", path);
        for (const sp_cmd *s = c->subs; s->name; s++) {
            char p2[128], syn2[1024];
            snprintf(p2, sizeof p2, "%s %s", path, s->name);
            sp_cmd_synopsis(s, p2, 2, width, 6, syn2, sizeof syn2);
            sp_out(app, "  %s\n", syn2);
            if (s->summary)
                sp_opt_wrap(s->summary, width, 6, out_line, app);
        }
    }
    if (c->nopts) {
        sp_out(app, "\noptions:\n");
        sp_opt_help(c->opts, width, out_line, app);
    }
    if (c->examples && *c->examples) {
        sp_out(app, "\nexamples:\n");
        char *ex = strdup(c->examples);
        for (char *save = NULL, *l = ex ? strtok_r(ex, "\n", &save) : NULL; l; l = strtok_r(NULL, "\n", &save))
            sp_out(app, "  %s\n", l);
        free(ex);
    }
}

static void dump_cmd(sp_app *app, const sp_cmd *c, const char *path)
{
    if (c->fn) {
        sp_out(app, "%s", path);
        for (int i = 0; c->opts && c->opts[i].name; i++)
            sp_out(app, " %s", c->opts[i].name);
        sp_out(app, "\n");
    }
    for (const sp_cmd *s = c->subs; s && s->name; s++) {
        char p2[128];
        snprintf(p2, sizeof p2, "%s %s", path, s->name);
        dump_cmd(app, s, p2);
    }
}

void sp_cmd_dump(sp_app *app)
{
    SP_CMD_EACH(NULL, c)
    dump_cmd(app, c, c->name);
}

static void dump_examples(sp_app *app, const sp_cmd *c)
{
    if (c->examples && *c->examples)
        sp_out(app, "%s%s", c->examples, c->examples[strlen(c->examples) - 1] == '\n' ? "" : "\n");
    for (const sp_cmd *s = c->subs; s && s->name; s++)
        dump_examples(app, s);
}

void sp_cmd_dump_examples(sp_app *app)
{
    SP_CMD_EACH(NULL, c)
    dump_examples(app, c);
}
