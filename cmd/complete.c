/* complete.c - Tab completion's candidates, from the same tables as the parser: commands and subcommands, a
 * command's options, an option's values (choices, a word such as `random`, file names for paths), and what a
 * command's own hook adds for its positionals (setting names, task names ...). No terminal here: the front ends
 * show the candidates. */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "app.h"

void sp_strlist_free(sp_strlist *l)
{
    for (int i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    *l = (sp_strlist){0};
}

void sp_strlist_add(sp_strlist *l, const char *s, size_t len, const char *prefix)
{
    size_t np = strlen(prefix);
    if (len < np || strncmp(s, prefix, np))
        return;
    for (int i = 0; i < l->n; i++)
        if (strlen(l->v[i]) == len && !strncmp(l->v[i], s, len))
            return;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        char **v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v)
            return;
        l->v = v;
        l->cap = cap;
    }
    char *copy = strndup(s, len);
    if (copy)
        l->v[l->n++] = copy;
}

void sp_complete_commands(sp_strlist *out, const sp_cmd *table, const char *word, int aliases)
{
    SP_CMD_EACH(table, c)
    {
        sp_strlist_add(out, c->name, strlen(c->name), word);
        int named = !strncmp(c->name, word, strlen(word)); /* "ge": generate, not gen too (Tab would stop at gen) */
        for (const char *p = aliases && !named ? c->aliases : NULL; p && *p;) {
            size_t len = strcspn(p, ",");
            sp_strlist_add(out, p, len, word);
            p += len + (p[len] == ',');
        }
    }
}

void sp_complete_choices(sp_strlist *out, const char *choices, const char *word)
{
    for (const char *p = choices; p && *p;) {
        size_t len = strcspn(p, "|");
        sp_strlist_add(out, p, len, word);
        p += len + (p[len] == '|');
    }
}

void sp_complete_names(sp_strlist *out, const sp_opt *opts, const char *word)
{
    for (int i = 0; opts && opts[i].name; i++)
        sp_strlist_add(out, opts[i].name, strlen(opts[i].name), word);
}

void sp_complete_value(sp_strlist *out, const sp_opt *o, const char *word)
{
    const sp_opt *s = sp_opt_spec(o);
    if (s->kind == SP_OPT_CHOICE)
        sp_complete_choices(out, s->choices, word);
    else if (s->kind == SP_OPT_FLAG)
        sp_complete_choices(out, "on|off", word);
    if (s->word)
        sp_strlist_add(out, s->word, strlen(s->word), word);
}

static void add_files(sp_strlist *out, const char *word)
{
    char *expanded = sp_expand_tilde(word);
    if (!expanded)
        return;
    int tilde = strcmp(expanded, word) != 0;
    const char *slash = strrchr(expanded, '/');
    size_t dlen = slash ? (size_t)(slash - expanded) + 1 : 0;
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%.*s", (int)dlen, expanded);
    const char *base = expanded + dlen;
    DIR *d = opendir(dlen ? dir : ".");
    const char *home = getenv("HOME");
    for (struct dirent *e; d && (e = readdir(d));) {
        if ((e->d_name[0] == '.' && base[0] != '.') || !strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char path[PATH_MAX + 2];
        struct stat st;
        int n = snprintf(path, sizeof path - 1, "%s%s", dir, e->d_name);
        if (n <= 0 || (size_t)n >= sizeof path - 1)
            continue;
        if (!stat(path, &st) && S_ISDIR(st.st_mode))
            strcat(path, "/");
        if (tilde && home) { /* show it as typed: ~/... */
            char t[PATH_MAX + 4];
            snprintf(t, sizeof t, "~%s", path + strlen(home));
            sp_strlist_add(out, t, strlen(t), word);
        } else {
            sp_strlist_add(out, path, strlen(path), word);
        }
    }
    if (d)
        closedir(d);
    free(expanded);
}

/* The command that the words before the one typed name, descending into subcommands; *k: the words it took. */
static const sp_cmd *typed_cmd(int nprior, char **prior, int *k)
{
    const sp_cmd *c = sp_cmd_find(prior[0], NULL, 0);
    *k = 1;
    while (c && c->subs && *k < nprior) {
        const sp_cmd *s = sp_cmd_find_in(c->subs, prior[*k], NULL, 0);
        if (!s)
            break;
        c = s;
        (*k)++;
    }
    return c;
}

void sp_cmd_complete(const sp_app *app, int nprior, char **prior, const char *word, sp_strlist *out, int *files)
{
    *files = 0;
    if (!nprior) {
        sp_complete_commands(out, NULL, word, 1);
        return;
    }
    int k;
    const sp_cmd *c = typed_cmd(nprior, prior, &k);
    if (!c)
        return;
    if (c->subs && k == nprior && !(c->fn && word[0] == '-')) {
        sp_complete_commands(out, c->subs, word, 0);
        return;
    }
    int o = sp_opt_find(c->opts, prior[nprior - 1], 0, "option", NULL, 0);
    if (o >= 0 && sp_opt_spec(&c->opts[o])->kind != SP_OPT_FLAG) { /* the value of an option */
        if (sp_opt_spec(&c->opts[o])->kind == SP_OPT_PATH)
            *files = 1, add_files(out, word);
        else
            sp_complete_value(out, &c->opts[o], word);
        return;
    }
    if (word[0] == '-') {
        sp_complete_names(out, c->opts, word);
        return;
    }
    if (c->complete) /* positionals before this one: roughly (options with values count too) */
        c->complete(app, nprior - k, prior[nprior - 1], word, out);
    else if (c->pos_paths)
        *files = 1, add_files(out, word);
}
