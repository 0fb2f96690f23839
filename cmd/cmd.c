/* cmd.c - the command layer: lookup by name, alias or unique prefix (subcommands too); splitting with quotes
 * and escapes; ';' and '#'; scripts; option parsing from each command's table; help text generated from the
 * same tables; completion candidates. Nothing here prints: output goes through the app's sink. */
#include "cmd.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "app.h"
#include "host.h"
#include "paths.h"
#include "runtime.h"

const sp_cmd_group sp_cmd_groups[] = {
    {"core", sp_cmds_core},
    {"model", sp_cmds_model},
    {"swarm", sp_cmds_swarm},
    {"generate", sp_cmds_generate},
    {"train", sp_cmds_train},
    {NULL, NULL},
};

/* ---------------------------------------------------------------------------------------------- */
/* lookup */

/* 1 if name is one of the comma-separated aliases. */
static int alias_match(const char *aliases, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = aliases; p && *p;) {
        size_t len = strcspn(p, ",");
        if (len == n && !strncmp(p, name, n))
            return 1;
        p += len + (p[len] == ',');
    }
    return 0;
}

/* Calls fn for every command of table (NULL: of every group). */
#define FOR_EACH_CMD(table, c)                                                                                     \
    for (const sp_cmd_group *g_ = sp_cmd_groups, *once_ = NULL; (table) ? !once_ : g_->cmds != NULL;             \
         (table) ? (void)(once_ = g_) : (void)g_++)                                                               \
        for (const sp_cmd *c = (table) ? (table) : g_->cmds; c->name; c++)

static void list_append(char *why, size_t cap, size_t *len, const char *name, int first)
{
    if (*len >= cap)
        return;
    int n = snprintf(why + *len, cap - *len, "%s%s", first ? "" : ", ", name);
    if (n > 0)
        *len = *len + (size_t)n < cap ? *len + (size_t)n : cap - 1;
}

const sp_cmd *sp_cmd_find_in(const sp_cmd *table, const char *name, char *why, size_t cap)
{
    FOR_EACH_CMD(table, c)
    if (!strcmp(c->name, name) || alias_match(c->aliases, name))
        return c;
    size_t n = strlen(name);
    const sp_cmd *hit = NULL;
    int count = 0;
    FOR_EACH_CMD(table, c)
    if (n && !strncmp(c->name, name, n)) {
        hit = c;
        count++;
    }
    if (count == 1)
        return hit;
    if (!why || !cap)
        return NULL;
    const char *what = table ? "subcommand" : "command";
    if (!count) {
        size_t len = (size_t)snprintf(why, cap, "unknown %s '%s'", what, name);
        if (table) {
            len += (size_t)snprintf(why + len, len < cap ? cap - len : 0, " (one of: ");
            int first = 1;
            FOR_EACH_CMD(table, c)
            {
                list_append(why, cap, &len, c->name, first);
                first = 0;
            }
            if (len < cap)
                snprintf(why + len, cap - len, ")");
        } else if (len < cap) {
            snprintf(why + len, cap - len, " (try 'help')");
        }
        return NULL;
    }
    size_t len = (size_t)snprintf(why, cap, "ambiguous %s '%s': ", what, name);
    len = len < cap ? len : cap - 1;
    int first = 1;
    FOR_EACH_CMD(table, c)
    if (!strncmp(c->name, name, n)) {
        list_append(why, cap, &len, c->name, first);
        first = 0;
    }
    return NULL;
}

const sp_cmd *sp_cmd_find(const char *name, char *why, size_t cap) { return sp_cmd_find_in(NULL, name, why, cap); }

/* ---------------------------------------------------------------------------------------------- */
/* paths */

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

static int nopts(const sp_cmd *c)
{
    int n = 0;
    while (c->opts && c->opts[n].name)
        n++;
    return n;
}

/* The short name of option long_name in c->short_opts ("-l --long,..."), or NULL; and the reverse. */
static const char *opt_short(const sp_cmd *c, const char *long_name, char *buf, size_t cap)
{
    for (const char *p = c->short_opts; p && *p;) {
        size_t k = strcspn(p, ",");
        const char *sp = memchr(p, ' ', k);
        if (sp && (size_t)(p + k - sp - 1) == strlen(long_name) && !strncmp(sp + 1, long_name, strlen(long_name))) {
            snprintf(buf, cap, "%.*s", (int)(sp - p), p);
            return buf;
        }
        p += k + (p[k] == ',');
    }
    return NULL;
}

static const char *opt_long(const sp_cmd *c, const char *short_name, char *buf, size_t cap)
{
    for (const char *p = c->short_opts; p && *p;) {
        size_t k = strcspn(p, ",");
        const char *sp = memchr(p, ' ', k);
        if (sp && (size_t)(sp - p) == strlen(short_name) && !strncmp(p, short_name, strlen(short_name))) {
            snprintf(buf, cap, "%.*s", (int)(p + k - sp - 1), sp + 1);
            return buf;
        }
        p += k + (p[k] == ',');
    }
    return NULL;
}

static int opt_index(const sp_cmd *c, const char *name)
{
    char buf[64];
    const char *l = name[0] == '-' && name[1] != '-' ? opt_long(c, name, buf, sizeof buf) : NULL;
    if (l)
        name = l;
    for (int i = 0; c->opts && c->opts[i].name; i++)
        if (!strcmp(c->opts[i].name, name))
            return i;
    return -1;
}

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

/* "--opt" of c by its full name or a unique prefix. */
static int find_opt(sp_app *app, const sp_cmd *c, const char *path, const char *name)
{
    int exact = opt_index(c, name);
    if (exact >= 0)
        return exact;
    int hit = -1, count = 0;
    size_t n = strlen(name);
    for (int i = 0; c->opts && c->opts[i].name; i++)
        if (n > 2 && !strncmp(c->opts[i].name, name, n))
            hit = i, count++;
    if (count == 1)
        return hit;
    char list[512] = "";
    size_t len = 0;
    int first = 1;
    for (int i = 0; c->opts && c->opts[i].name; i++)
        if (!count || !strncmp(c->opts[i].name, name, n)) {
            list_append(list, sizeof list, &len, c->opts[i].name, first);
            first = 0;
        }
    const char *owner = NULL; /* an option of another command ("eval --lr") */
    FOR_EACH_CMD(NULL, o)
    {
        for (int i = 0; !owner && o->opts && o->opts[i].name; i++)
            if (!strcmp(o->opts[i].name, name) && o != c)
                owner = o->name;
    }
    if (count)
        sp_app_error(app, "%s: ambiguous option '%s': %s", path, name, list);
    else if (owner)
        sp_app_error(app, "%s: '%s' is an option of %s, not of %s", path, name, owner, path);
    else if (len)
        sp_app_error(app, "%s: unknown option '%s' (its options: %s)", path, name, list);
    else
        sp_app_error(app, "%s: unknown option '%s' (it takes none)", path, name);
    return -1;
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
    int rc = 0, only_pos = 0;
    for (int i = 1; i < argc && !rc; i++) {
        const char *w = argv[i];
        if (!only_pos && !strcmp(w, "--")) {
            only_pos = 1;
            continue;
        }
        if (only_pos || w[0] != '-' || !w[1] || (w[1] != '-' && (isdigit((unsigned char)w[1]) || w[1] == '.'))) {
            char *p = c->pos_paths ? sp_expand_tilde(w) : strdup(w);
            if (!p)
                return sp_args_free(a), sp_app_error(app, "out of memory");
            a->pos[a->npos++] = p;
            continue;
        }
        const char *eq = strchr(w, '=');
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(eq && eq - w < 63 ? eq - w : (long)strlen(w)), w);
        int k = find_opt(app, c, path, name);
        if (k < 0) {
            rc = 1;
            break;
        }
        const sp_opt *o = &c->opts[k];
        const char *v;
        if (o->kind == SP_OPT_FLAG) {
            if (eq) {
                rc = sp_app_error(app, "%s: option '%s' takes no value", path, o->name);
                break;
            }
            v = "1";
        } else if (eq) {
            v = eq + 1;
        } else if (i + 1 < argc) {
            v = argv[++i];
        } else {
            rc = sp_app_error(app, "%s: option '%s' needs a value (%s)", path, o->name, o->meta ? o->meta : "VALUE");
            break;
        }
        char why[512];
        if (sp_check_value(o->name, o->kind, o->min, o->max, o->choices, v, why, sizeof why)) {
            rc = sp_app_error(app, "%s: %s", path, why);
            break;
        }
        free(a->val[k]);
        a->val[k] = o->kind == SP_OPT_PATH ? sp_expand_tilde(v) : strdup(v);
        if (!a->val[k])
            rc = sp_app_error(app, "out of memory");
    }
    if (!rc && a->npos < c->min_pos)
        rc = sp_app_error(app, "%s: missing %s (usage: %s%s%s)", path, c->args && *c->args ? c->args : "arguments",
                          path, c->args && *c->args ? " " : "", c->args ? c->args : "");
    else if (!rc && c->max_pos >= 0 && a->npos > c->max_pos)
        rc = c->max_pos == 0 ? sp_app_error(app, "%s: takes no arguments, got '%s'", path, a->pos[c->max_pos])
                             : sp_app_error(app, "%s: unexpected argument '%s' (usage: %s %s; quote arguments with "
                                                 "blanks)", path, a->pos[c->max_pos], path, c->args ? c->args : "");
    if (rc)
        sp_args_free(a);
    return rc;
}

int sp_arg_given(const sp_args *a, const char *opt)
{
    int k = opt_index(a->cmd, opt);
    return k >= 0 && a->val[k] != NULL;
}

const char *sp_arg(const sp_app *app, const sp_args *a, const char *opt)
{
    int k = opt_index(a->cmd, opt);
    if (k < 0)
        return NULL;
    if (a->val[k])
        return a->val[k];
    const char *setting = a->cmd->opts[k].setting;
    return setting ? sp_app_get(app, setting) : NULL;
}

long long sp_arg_int(const sp_app *app, const sp_args *a, const char *opt, long long def)
{
    const char *v = sp_arg(app, a, opt);
    if (!v || !*v)
        return def;
    char *end;
    long long x = strtoll(v, &end, 10);
    return *end ? def : x;
}

double sp_arg_num(const sp_app *app, const sp_args *a, const char *opt, double def)
{
    const char *v = sp_arg(app, a, opt);
    if (!v || !*v)
        return def;
    char *end;
    double x = strtod(v, &end);
    return *end || !isfinite(x) ? def : x;
}

int sp_arg_choice(const sp_app *app, const sp_args *a, const char *opt, int def)
{
    const char *v = sp_arg(app, a, opt);
    int k = opt_index(a->cmd, opt);
    if (!v || k < 0)
        return def;
    size_t n = strlen(v);
    int i = 0;
    for (const char *p = a->cmd->opts[k].choices; p && *p; i++) {
        size_t len = strcspn(p, "|");
        if (len == n && !strncmp(p, v, n))
            return i;
        p += len + (p[len] == '|');
    }
    return def;
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

/* ---------------------------------------------------------------------------------------------- */
/* running */

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
            sp_cmd_synopsis(c, path, 1000, 0, syn, sizeof syn);
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
    int rc = app->dry_run ? 0 : c->fn(app, &a);
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

/* ---------------------------------------------------------------------------------------------- */
/* help */

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
    if (w->col > w->indent && w->col + 1 + n > w->width) {
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

static void opt_synopsis(const sp_opt *o, char *buf, size_t cap)
{
    if (o->kind == SP_OPT_FLAG)
        snprintf(buf, cap, "[%s]", o->name);
    else if (o->kind == SP_OPT_CHOICE)
        snprintf(buf, cap, "[%s %s]", o->name, o->choices);
    else
        snprintf(buf, cap, "[%s %s]", o->name, o->meta ? o->meta : "VALUE");
}

void sp_cmd_synopsis(const sp_cmd *c, const char *path, int width, int indent, char *buf, size_t cap)
{
    wrap w = {.buf = buf, .cap = cap, .width = width, .indent = indent, .col = 0};
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
        opt_synopsis(&c->opts[i], o, sizeof o);
        wrap_word(&w, o);
    }
}

/* Text wrapped at width, each line indented by indent (the first too). */
static void out_wrapped(sp_app *app, const char *text, int width, int indent)
{
    char line[1024];
    int col = 0;
    size_t len = 0;
    const char *p = text;
    while (*p) {
        size_t n = strcspn(p, " \n");
        if (col && col + 1 + (int)n > width) {
            sp_out(app, "%s\n", line);
            len = 0, col = 0;
        }
        if (!col) {
            len = (size_t)snprintf(line, sizeof line, "%*s", indent, "");
            col = indent;
        } else if (len < sizeof line) {
            len += (size_t)snprintf(line + len, sizeof line - len, " ");
            col++;
        }
        if (len < sizeof line)
            len += (size_t)snprintf(line + len, sizeof line - len, "%.*s", (int)n, p);
        col += (int)n;
        p += n;
        if (*p == '\n') {
            sp_out(app, "%s\n", line);
            len = 0, col = 0;
        }
        if (*p)
            p++;
    }
    if (col)
        sp_out(app, "%s\n", line);
}

static void help_line(sp_app *app, const sp_cmd *c, const char *name, int width)
{
    char head[64], aliases[128] = "";
    snprintf(head, sizeof head, "  %-16s ", name);
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
    /* the summary in the column after the names, wrapped there; a longer name pushes it down a line */
    char line[1024];
    size_t len = (size_t)snprintf(line, sizeof line, "%s", head);
    int col = (int)len, start = 19;
    if (col > start) {
        sp_out(app, "  %s\n", name);
        len = (size_t)snprintf(line, sizeof line, "%*s", start, "");
        col = start;
    }
    for (const char *p = text; *p;) {
        size_t k = strcspn(p, " ");
        if (col > start && col + 1 + (int)k > width) {
            sp_out(app, "%s\n", line);
            len = (size_t)snprintf(line, sizeof line, "%*s", start, "");
            col = start;
        }
        if (len < sizeof line)
            len += (size_t)snprintf(line + len, sizeof line - len, "%s%.*s", col > start ? " " : "", (int)k, p);
        col += (int)k + (col > start);
        p += k;
        while (*p == ' ')
            p++;
    }
    sp_out(app, "%s\n", line);
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

static void help_opts(sp_app *app, const sp_cmd *c, int width)
{
    int w = 0;
    for (int i = 0; c->opts && c->opts[i].name; i++) {
        char o[128];
        snprintf(o, sizeof o, "%s%s%s", c->opts[i].name, c->opts[i].meta ? " " : "",
                 c->opts[i].meta ? c->opts[i].meta : c->opts[i].kind == SP_OPT_CHOICE ? " " : "");
        if (c->opts[i].kind == SP_OPT_CHOICE)
            snprintf(o, sizeof o, "%s %s", c->opts[i].name, c->opts[i].choices);
        char sh[32];
        int ow = (int)strlen(o) + (opt_short(c, c->opts[i].name, sh, sizeof sh) ? (int)strlen(sh) + 2 : 0);
        w = ow > w ? ow : w;
    }
    w = w > 30 ? 30 : w;
    if (nopts(c))
        sp_out(app, "\noptions:\n");
    for (int i = 0; c->opts && c->opts[i].name; i++) {
        const sp_opt *o = &c->opts[i];
        char head[128], text[640], sh[32];
        if (o->kind == SP_OPT_CHOICE)
            snprintf(head, sizeof head, "%s %s", o->name, o->choices);
        else if (opt_short(c, o->name, sh, sizeof sh))
            snprintf(head, sizeof head, "%s, %s%s%s", o->name, sh, o->meta ? " " : "", o->meta ? o->meta : "");
        else
            snprintf(head, sizeof head, "%s%s%s", o->name, o->meta ? " " : "", o->meta ? o->meta : "");
        size_t n = (size_t)snprintf(text, sizeof text, "%s", o->help ? o->help : "");
        if (o->setting && n < sizeof text)
            n += (size_t)snprintf(text + n, sizeof text - n, " (default: the %s setting)", o->setting);
        else if (o->def && n < sizeof text)
            n += (size_t)snprintf(text + n, sizeof text - n, " (default %s)", o->def);
        if ((o->kind == SP_OPT_INT || o->kind == SP_OPT_NUM) && n < sizeof text) {
            char lo[32], hi[32];
            snprintf(lo, sizeof lo, "%.15g", o->min);
            snprintf(hi, sizeof hi, "%.15g", o->max);
            if (o->min == 1e-9)
                snprintf(text + n, sizeof text - n, " (0, %s]", hi);
            else if (o->max >= 1e6)
                snprintf(text + n, sizeof text - n, " [>= %s]", lo);
            else
                snprintf(text + n, sizeof text - n, " [%s, %s]", lo, hi);
        }
        if ((int)strlen(head) > w) {
            sp_out(app, "  %s\n", head);
            out_wrapped(app, text, width, w + 4);
        } else {
            char first[1024];
            snprintf(first, sizeof first, "  %-*s  %s", w, head, text);
            if ((int)strlen(first) <= width) {
                sp_out(app, "%s\n", first);
            } else {
                /* wrap the help text in the column after the option */
                char pad[160];
                snprintf(pad, sizeof pad, "  %-*s  ", w, head);
                char line[1024];
                size_t len = (size_t)snprintf(line, sizeof line, "%s", pad);
                int col = (int)len;
                for (const char *p = text; *p;) {
                    size_t k = strcspn(p, " ");
                    if (col + (int)k + 1 > width && col > w + 4) {
                        sp_out(app, "%s\n", line);
                        len = (size_t)snprintf(line, sizeof line, "%*s", w + 4, "");
                        col = w + 4;
                    }
                    if (len < sizeof line)
                        len += (size_t)snprintf(line + len, sizeof line - len, "%s%.*s", col > w + 4 ? " " : "",
                                                (int)k, p);
                    col += (int)k + 1;
                    p += k;
                    while (*p == ' ')
                        p++;
                }
                sp_out(app, "%s\n", line);
            }
        }
    }
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
    sp_cmd_synopsis(c, path, width, 7 + (int)strlen(path) + 1 > width / 2 ? 8 : 7 + (int)strlen(path) + 1, syn,
                    sizeof syn);
    sp_out(app, "usage: %s\n", syn);
    if (c->aliases && *c->aliases)
        sp_out(app, "aliases: %s\n", c->aliases);
    if (c->summary) {
        sp_out(app, "\n");
        out_wrapped(app, c->summary, width, 0);
    }
    if (c->help) {
        sp_out(app, "\n");
        out_wrapped(app, c->help, width, 0);
    }
    if (c->subs) {
        sp_out(app, "\nsubcommands (`help %s NAME` says more):\n", path);
        for (const sp_cmd *s = c->subs; s->name; s++) {
            char p2[128], syn2[1024];
            snprintf(p2, sizeof p2, "%s %s", path, s->name);
            sp_cmd_synopsis(s, p2, width - 2, 6, syn2, sizeof syn2);
            sp_out(app, "  %s\n", syn2);
            if (s->summary)
                out_wrapped(app, s->summary, width, 6);
        }
    }
    help_opts(app, c, width);
    if (c->examples && *c->examples) {
        sp_out(app, "\nexamples:\n");
        char *ex = strdup(c->examples);
        for (char *save = NULL, *l = ex ? strtok_r(ex, "\n", &save) : NULL; l; l = strtok_r(NULL, "\n", &save))
            sp_out(app, "  %s\n", l);
        free(ex);
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* completion candidates */

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

static void add_commands(sp_strlist *out, const sp_cmd *table, const char *word, int with_aliases)
{
    FOR_EACH_CMD(table, c)
    {
        sp_strlist_add(out, c->name, strlen(c->name), word);
        for (const char *p = with_aliases ? c->aliases : NULL; p && *p;) {
            size_t len = strcspn(p, ",");
            sp_strlist_add(out, p, len, word);
            p += len + (p[len] == ',');
        }
    }
}

static void add_choices(sp_strlist *out, const char *choices, const char *word)
{
    for (const char *p = choices; p && *p;) {
        size_t len = strcspn(p, "|");
        sp_strlist_add(out, p, len, word);
        p += len + (p[len] == '|');
    }
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

/* The option of c named by the word before the one being typed, if it takes a value. */
static const sp_opt *pending_opt(const sp_cmd *c, const char *prev)
{
    int k = c ? opt_index(c, prev) : -1;
    return k >= 0 && c->opts[k].kind != SP_OPT_FLAG ? &c->opts[k] : NULL;
}

void sp_cmd_complete(const sp_app *app, int nprior, char **prior, const char *word, sp_strlist *out, int *files)
{
    *files = 0;
    if (!nprior) {
        add_commands(out, NULL, word, 1);
        return;
    }
    const sp_cmd *c = sp_cmd_find(prior[0], NULL, 0);
    if (!c)
        return;
    int k = 1;
    while (c->subs && k < nprior) { /* descend into subcommands already typed */
        const sp_cmd *s = sp_cmd_find_in(c->subs, prior[k], NULL, 0);
        if (!s)
            break;
        c = s;
        k++;
    }
    if (c->subs && k == nprior && !(c->fn && word[0] == '-')) {
        add_commands(out, c->subs, word, 0);
        return;
    }
    const sp_opt *o = pending_opt(c, prior[nprior - 1]);
    if (o) { /* the value of an option */
        if (o->kind == SP_OPT_CHOICE)
            add_choices(out, o->choices, word);
        else if (o->kind == SP_OPT_PATH)
            *files = 1, add_files(out, word);
        return;
    }
    if (word[0] == '-') {
        for (int i = 0; c->opts && c->opts[i].name; i++)
            sp_strlist_add(out, c->opts[i].name, strlen(c->opts[i].name), word);
        return;
    }
    int npos = nprior - k; /* positionals before this one (roughly: options with values count too) */
    if (!strcmp(c->name, "help")) {
        if (npos == 0)
            add_commands(out, NULL, word, 0);
        return;
    }
    if (!strcmp(c->name, "set") || !strcmp(c->name, "show")) {
        if (npos == 0) {
            for (int i = 0; i < app->nsettings; i++)
                sp_strlist_add(out, app->settings[i].name, strlen(app->settings[i].name), word);
        } else if (npos == 1 && !strcmp(c->name, "set")) {
            const sp_setting *s = sp_app_setting(app, prior[nprior - 1], NULL, 0);
            if (s && s->kind == SP_OPT_CHOICE)
                add_choices(out, s->choices, word);
            else if (s && s->kind == SP_OPT_FLAG)
                add_choices(out, "on|off", word);
            else if (s && !strcmp(s->name, "seed"))
                add_choices(out, "random", word);
        }
        return;
    }
    if ((!strcmp(c->name, "train") || !strcmp(c->name, "eval")) && npos == 0) {
        sp_plugin_register_builtins();
        for (int i = 0; i < sp_plugin_count(); i++)
            sp_strlist_add(out, sp_plugin_at(i)->name, strlen(sp_plugin_at(i)->name), word);
        return;
    }
    if (c->pos_paths) {
        *files = 1;
        add_files(out, word);
    }
}

/* ---------------------------------------------------------------------------------------------- */

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
    FOR_EACH_CMD(NULL, c)
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
    FOR_EACH_CMD(NULL, c)
    dump_examples(app, c);
}
