/* parse.c - from a line to a command's arguments: splitting with quotes and escapes, the end of a command (';',
 * '#'), and the options of each command's table (common/opt.h walks them; here: the messages that name the
 * command, ~ in paths, the values by index). */
#include "cmd.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "paths.h"
#include "rng.h"

char *sp_expand_tilde(const char *path)
{
    const char *home = getenv("HOME");
    size_t cap = strlen(path) + (home ? strlen(home) : 0) + 1;
    char *s = malloc(cap);
    if (s)
        sp_expand_home(path, s, cap); /* the one rule, common/paths.c's */
    return s;
}

/* ---------------------------------------------------------------------------------------------- */
/* options */

void sp_args_free(sp_args *a)
{
    for (int i = 0; i < SP_MAX_OPTS; i++)
        free(a->val[i]);
    if (a->argv_owned) {
        for (int i = 0; i < a->npos; i++)
            free(a->argv_owned[i]);
        free(a->argv_owned);
    }
    memset(a, 0, sizeof *a);
}

/* An option no row of c names: whose it is (another command's), else the nearest of c's options, else all of
 * them. */
static int unknown_opt(sp_app *app, const sp_cmd *c, const char *path, const char *word)
{
    char name[64], list[512] = "";
    snprintf(name, sizeof name, "%.*s", (int)strcspn(word, "="), word);
    const char *owner = NULL; /* an option of another command ("eval --lr") */
    SP_CMD_EACH(NULL, o)
    {
        if (!owner && o != c && sp_opt_find(o->opts, name, 0, "option", NULL, 0) >= 0)
            owner = o->name;
    }
    size_t len = 0;
    if (owner)
        return sp_app_error(app, "%s: '%s' is an option of %s, not of %s", path, name, owner, path);
    if (sp_opt_similar(c->opts, name, NULL, list, sizeof list, &len)) /* " (did you mean --x?)" */
        return sp_app_error(app, "%s: unknown option '%s'%s", path, name, list);
    if (sp_opt_names(c->opts, "", list, sizeof list, &len))
        return sp_app_error(app, "%s: unknown option '%s' (its options: %s)", path, name, list);
    return sp_app_error(app, "%s: unknown option '%s' (it takes none)", path, name);
}

static int take_word(sp_app *app, const sp_cmd *c, sp_args *a, const char *w)
{
    char *p = c->pos_paths ? sp_expand_tilde(w) : strdup(w);
    if (!p)
        return sp_app_error(app, "out of memory");
    a->pos[a->npos++] = p;
    return 0;
}

static int take_value(sp_app *app, const sp_cmd *c, sp_args *a, int k, const char *v)
{
    if (k >= SP_MAX_OPTS)
        return sp_app_error(app, "%s: more than %d options", c->name, SP_MAX_OPTS);
    free(a->val[k]);
    a->val[k] = sp_opt_spec(&c->opts[k])->kind == SP_OPT_PATH ? sp_expand_tilde(v) : strdup(v);
    return a->val[k] ? 0 : sp_app_error(app, "out of memory");
}

/* The count of positionals against the command's: 0, or 1 after a message. */
static int check_npos(sp_app *app, const sp_cmd *c, const char *path, const sp_args *a)
{
    const char *args = c->args ? c->args : "";
    if (a->npos < c->min_pos)
        return sp_app_error(app, "%s: missing %s (usage: %s%s%s)", path, *args ? args : "arguments", path,
                            *args ? " " : "", args);
    if (c->max_pos < 0 || a->npos <= c->max_pos)
        return 0;
    if (c->max_pos == 0)
        return sp_app_error(app, "%s: takes no arguments, got '%s'", path, a->pos[0]);
    return sp_app_error(app, "%s: unexpected argument '%s' (usage: %s %s; quote arguments with blanks)", path,
                        a->pos[c->max_pos], path, args);
}

int sp_args_parse(sp_app *app, const sp_cmd *c, const char *path, int argc, char **argv, sp_args *a)
{
    memset(a, 0, sizeof *a);
    a->cmd = c;
    a->path = path;
    a->argv_owned = calloc((size_t)argc + 1, sizeof *a->argv_owned);
    if (!a->argv_owned)
        return sp_app_error(app, "out of memory");
    a->pos = a->argv_owned;
    sp_opt_parser p = {.opts = c->opts, .argc = argc, .argv = argv, .prefixes = 1};
    int rc = 0, k = -1;
    const char *v = NULL;
    char why[512];
    for (sp_opt_got got; !rc && (got = sp_opt_next(&p, &k, &v, why, sizeof why)) != SP_OPT_END;) {
        if (got == SP_OPT_WORD)
            rc = take_word(app, c, a, v);
        else if (got == SP_OPT_OPTION)
            rc = take_value(app, c, a, k, v);
        else if (got == SP_OPT_UNKNOWN)
            rc = unknown_opt(app, c, path, v);
        else
            rc = sp_app_error(app, "%s: %s", path, why);
    }
    for (int i = 0; !rc && i < c->nopts; i++) { /* an option every use gives */
        const sp_opt *o = &c->opts[i];
        const sp_opt *spec = sp_opt_spec(o);
        if (o->required && !a->val[i] && spec->choices)
            rc = sp_app_error(app, "%s: needs %s, one of %s", path, o->name, spec->choices);
        else if (o->required && !a->val[i])
            rc = sp_app_error(app, "%s: needs %s %s", path, o->name, o->meta ? o->meta : "VALUE");
    }
    if (!rc)
        rc = check_npos(app, c, path, a);
    if (rc)
        sp_args_free(a);
    return rc;
}

/* Row k of the command's table (NULL when k is not one). */
static const sp_opt *row(const sp_args *a, int k) { return k >= 0 && k < a->cmd->nopts ? &a->cmd->opts[k] : NULL; }

int sp_arg_given(const sp_args *a, int k) { return row(a, k) && a->val[k]; }

const char *sp_arg(const sp_app *app, const sp_args *a, int k)
{
    const sp_opt *o = row(a, k);
    if (!o || a->val[k])
        return o ? a->val[k] : NULL;
    int s = o->live ? sp_setting_of(o->like) : -1;
    return s >= 0 ? sp_app_get(app, (sp_set)s) : sp_opt_spec(o)->def;
}

long long sp_arg_int(const sp_app *app, const sp_args *a, int k) { return sp_opt_int(sp_arg(app, a, k)); }

double sp_arg_num(const sp_app *app, const sp_args *a, int k) { return sp_opt_num(sp_arg(app, a, k)); }

int sp_arg_choice(const sp_app *app, const sp_args *a, int k)
{
    const char *v = sp_arg(app, a, k);
    return v ? sp_opt_choice(row(a, k), v) : -1;
}

int sp_arg_on(const sp_app *app, const sp_args *a, int k) { return sp_opt_on(sp_arg(app, a, k)); }

unsigned long long sp_arg_seed(const sp_app *app, const sp_args *a, int k)
{
    const char *v = sp_arg(app, a, k), *word = row(a, k) ? sp_opt_spec(row(a, k))->word : NULL;
    if (!v || (word && !strcmp(v, word)))
        return sp_rng_fresh_seed();
    return (unsigned long long)sp_opt_int(v);
}

void sp_args_warn_unused(sp_app *app, const sp_args *a, const int *ks, int n, const char *why)
{
    char list[256] = "";
    size_t len = 0;
    int given = 0;
    for (int i = 0; i < n; i++)
        if (sp_arg_given(a, ks[i]))
            sp_opt_list_add(list, sizeof list, &len, row(a, ks[i])->name, !given++);
    if (given)
        sp_warn(app, "%s %s no effect %s", list, given == 1 ? "has" : "have", why);
}

/* ---------------------------------------------------------------------------------------------- */
/* splitting */

typedef struct strbuf {
    char *s;
    size_t n, cap;
} strbuf;

static int sb_put(strbuf *b, char c)
{
    if (b->n + 1 >= b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 32;
        char *s = realloc(b->s, cap);
        if (!s)
            return -1;
        b->s = s;
        b->cap = cap;
    }
    b->s[b->n++] = c;
    b->s[b->n] = 0;
    return 0;
}

typedef struct argv_builder {
    char **v;
    int n, cap;
} argv_builder;

static int av_push(argv_builder *a, strbuf *w)
{
    if (a->n + 2 > a->cap) {
        int cap = a->cap ? 2 * a->cap : 8;
        char **v = realloc(a->v, (size_t)cap * sizeof *v);
        if (!v)
            return -1;
        a->v = v;
        a->cap = cap;
    }
    if (!w->s && sb_put(w, 0))
        return -1;
    a->v[a->n++] = w->s;
    a->v[a->n] = NULL;
    *w = (strbuf){0};
    return 0;
}

static int put_dq_escape(strbuf *w, char c)
{
    switch (c) {
    case '"':
    case '\\': return sb_put(w, c);
    case 'n': return sb_put(w, '\n');
    case 't': return sb_put(w, '\t');
    default: return sb_put(w, '\\') || sb_put(w, c);
    }
}

static int split_quoted(const char **pp, char *quote, strbuf *w)
{
    const char *p = *pp;
    *pp = p + 1;
    if (*p == *quote) {
        *quote = 0;
        return 0;
    }
    if (*quote == '"' && *p == '\\' && p[1]) {
        *pp = p + 2;
        return put_dq_escape(w, p[1]);
    }
    return sb_put(w, *p);
}

static int split_char(const char **pp, char *quote, int *inword, strbuf *w, argv_builder *a)
{
    if (*quote)
        return split_quoted(pp, quote, w);
    const char *p = *pp;
    *pp = p + 1;
    if (isspace((unsigned char)*p)) {
        int rc = *inword ? av_push(a, w) : 0;
        *inword = 0;
        return rc;
    }
    *inword = 1;
    if (*p == '\'' || *p == '"') {
        *quote = *p;
        return 0;
    }
    if (*p == '\\' && p[1]) {
        *pp = p + 2;
        return sb_put(w, p[1]);
    }
    return sb_put(w, *p);
}

void sp_cmd_free_argv(int argc, char **argv)
{
    if (!argv)
        return;
    for (int i = 0; i < argc; i++)
        free(argv[i]);
    free(argv);
}

int sp_cmd_split(const char *line, int *argc, char ***argv, char *why, size_t cap)
{
    argv_builder a = {0};
    strbuf w = {0};
    char quote = 0;
    int inword = 0, rc = 0;
    for (const char *p = line; *p && !rc;)
        rc = split_char(&p, &quote, &inword, &w, &a);
    if (!rc && inword && !quote)
        rc = av_push(&a, &w);
    if (!rc && !a.v && !(a.v = calloc(1, sizeof *a.v)))
        rc = -1;
    if (rc)
        snprintf(why, cap, "out of memory");
    else if (quote)
        snprintf(why, cap, "unbalanced %s quote", quote == '"' ? "double (\")" : "single (')");
    free(w.s);
    if (rc || quote) {
        sp_cmd_free_argv(a.n, a.v);
        return -1;
    }
    *argc = a.n;
    *argv = a.v;
    return 0;
}

const char *sp_cmd_end(const char *p)
{
    char quote = 0;
    for (; *p; p++) {
        if (quote == '\'') {
            quote = *p == '\'' ? 0 : quote;
        } else if (*p == '\\') {
            p += p[1] != 0;
        } else if (quote == '"') {
            quote = *p == '"' ? 0 : quote;
        } else if (*p == '\'' || *p == '"') {
            quote = *p;
        } else if (*p == ';' || *p == '#') {
            break;
        }
    }
    return p;
}
