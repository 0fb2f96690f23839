/* cmd.c - the command runner behind every front end: lookup by name, alias or unique prefix; splitting
 * with quotes and escapes; ';' and '#'; scripts; and the interactive loop on libedit (history, tab
 * completion). */
#include "cmd.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <histedit.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "app.h"

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

static const sp_cmd *find_exact(const char *name)
{
    for (const sp_cmd_group *g = sp_cmd_groups; g->cmds; g++)
        for (const sp_cmd *c = g->cmds; c->name; c++)
            if (!strcmp(c->name, name) || alias_match(c->aliases, name))
                return c;
    return NULL;
}

/* Appends ", name" (or "name") to the list in why, without overflowing it. */
static void list_append(char *why, size_t cap, size_t *len, const char *name, int first)
{
    int n = snprintf(why + *len, cap - *len, "%s%s", first ? "" : ", ", name);
    if (n > 0)
        *len = *len + (size_t)n < cap ? *len + (size_t)n : cap - 1;
}

const sp_cmd *sp_cmd_find(const char *name, char *why, size_t cap)
{
    const sp_cmd *hit = find_exact(name);
    if (hit)
        return hit;
    size_t n = strlen(name);
    int count = 0;
    for (const sp_cmd_group *g = sp_cmd_groups; g->cmds; g++)
        for (const sp_cmd *c = g->cmds; c->name; c++)
            if (n && !strncmp(c->name, name, n) && !(hit && !strcmp(hit->name, c->name))) { /* distinct names */
                hit = c;
                count++;
            }
    if (count == 1)
        return hit;
    if (!why || !cap)
        return NULL;
    if (!count) {
        snprintf(why, cap, "unknown command '%s' (try 'help')", name);
        return NULL;
    }
    size_t len = (size_t)snprintf(why, cap, "ambiguous command '%s': ", name);
    len = len < cap ? len : cap - 1;
    int first = 1;
    for (const sp_cmd_group *g = sp_cmd_groups; g->cmds; g++)
        for (const sp_cmd *c = g->cmds; c->name; c++)
            if (!strncmp(c->name, name, n)) {
                list_append(why, cap, &len, c->name, first);
                first = 0;
            }
    return NULL;
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

/* Moves the word in w (possibly empty) to the end of a. */
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

/* The escape "\c" inside double quotes: writes it into w. */
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

/* One character of the line at *pp inside quotes; advances *pp past what it consumed. */
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

/* One character of the line at *pp; advances *pp past what it consumed. quote: 0, '\'' or '"'. */
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
    if (!rc && !a.v && !(a.v = calloc(1, sizeof *a.v))) /* an empty argv still ends with NULL */
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
/* lines and scripts */

/* The end of the command starting at p: the first ';' or '#' outside quotes and escapes, or the end of
 * the line. An unbalanced quote runs to the end (sp_cmd_split then reports it). */
static const char *command_end(const char *p)
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
    char why[512];
    const sp_cmd *c = sp_cmd_find(argv[0], why, sizeof why);
    if (!c)
        return sp_app_error(app, "%s", why);
    int rc = c->fn(app, argc, argv);
    fflush(stdout);
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
    for (const char *p = line; !app->quit;) {
        const char *end = command_end(p);
        int rc = run_command(app, p, (size_t)(end - p));
        if (rc)
            return rc;
        if (*end != ';')
            break;
        p = end + 1;
    }
    return 0;
}

int sp_cmd_run_file(sp_app *app, FILE *f, const char *name)
{
    char *line = NULL;
    size_t cap = 0;
    long lineno = 0;
    int rc = 0;
    while (!rc && !app->quit && getline(&line, &cap, f) >= 0) {
        line[strcspn(line, "\r\n")] = 0;
        snprintf(app->where, sizeof app->where, "%s:%ld", name, ++lineno);
        int before = app->nerrors;
        rc = sp_cmd_run_line(app, line);
        if (rc && app->nerrors == before) /* the command printed its own message */
            sp_app_error(app, "command failed");
    }
    if (!rc && ferror(f)) {
        snprintf(app->where, sizeof app->where, "%s", name);
        rc = sp_app_error(app, "read error: %s", strerror(errno));
    }
    app->where[0] = 0;
    free(line);
    return rc;
}

/* ---------------------------------------------------------------------------------------------- */
/* completion candidates */

typedef struct strlist {
    char **v;
    int n, cap;
} strlist;

static void sl_free(strlist *l)
{
    for (int i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    *l = (strlist){0};
}

/* Adds a copy of s (its first len bytes) if it starts with prefix and is not there yet. */
static void sl_add(strlist *l, const char *s, size_t len, const char *prefix)
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

static void command_candidates(strlist *out, const char *word, int with_aliases)
{
    for (const sp_cmd_group *g = sp_cmd_groups; g->cmds; g++)
        for (const sp_cmd *c = g->cmds; c->name; c++) {
            sl_add(out, c->name, strlen(c->name), word);
            for (const char *p = with_aliases ? c->aliases : NULL; p && *p;) {
                size_t len = strcspn(p, ",");
                sl_add(out, p, len, word);
                p += len + (p[len] == ',');
            }
        }
}

static void file_candidates(strlist *out, const char *word)
{
    const char *slash = strrchr(word, '/');
    size_t dlen = slash ? (size_t)(slash - word) + 1 : 0;
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%.*s", (int)dlen, word);
    const char *base = word + dlen;
    DIR *d = opendir(dlen ? dir : ".");
    if (!d)
        return;
    for (struct dirent *e; (e = readdir(d));) {
        if ((e->d_name[0] == '.' && base[0] != '.') || !strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char path[PATH_MAX + 2];
        struct stat st;
        int n = snprintf(path, sizeof path - 1, "%s%s", dir, e->d_name);
        if (n <= 0 || (size_t)n >= sizeof path - 1)
            continue;
        if (!stat(path, &st) && S_ISDIR(st.st_mode))
            strcat(path, "/");
        sl_add(out, path, strlen(path), word);
    }
    closedir(d);
}

static const char *const model_subcommands[] = {"info", "check", "generate", "convert-llama2c", NULL};

/* Candidates for word, the argument after the words prior[0..nprior). Sets *files for file names. */
static void candidates(const sp_app *app, int nprior, char **prior, const char *word, strlist *out, int *files)
{
    *files = 0;
    if (!nprior) {
        command_candidates(out, word, 1);
        return;
    }
    const sp_cmd *c = sp_cmd_find(prior[0], NULL, 0);
    const char *name = c ? c->name : "";
    int settings = !strcmp(name, "set") || !strcmp(name, "show");
    if (!strcmp(name, "help") || settings) {
        for (int i = 0; nprior == 1 && settings && i < app->nsettings; i++)
            sl_add(out, app->settings[i].name, strlen(app->settings[i].name), word);
        if (nprior == 1 && !settings)
            command_candidates(out, word, 0);
        return;
    }
    if (!strcmp(name, "model") && nprior == 1) {
        for (int i = 0; model_subcommands[i]; i++)
            sl_add(out, model_subcommands[i], strlen(model_subcommands[i]), word);
        return;
    }
    *files = 1;
    file_candidates(out, word);
}

/* ---------------------------------------------------------------------------------------------- */
/* completion in the line editor */

/* Where the word that ends at cur begins: after an unescaped blank or a ';'. */
static size_t word_start(const char *b, size_t cur)
{
    size_t i = cur;
    while (i > 0 && b[i - 1] != ';' && !(isspace((unsigned char)b[i - 1]) && !(i >= 2 && b[i - 2] == '\\')))
        i--;
    return i;
}

/* Inserts s, a backslash before each character the splitter would treat specially. */
static void insert_escaped(EditLine *el, const char *s)
{
    char buf[2 * PATH_MAX + 4];
    size_t n = 0;
    for (; *s && n + 3 < sizeof buf; s++) {
        if (strchr(" \t\\'\";#", *s))
            buf[n++] = '\\';
        buf[n++] = *s;
    }
    buf[n] = 0;
    el_insertstr(el, buf);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Lists the candidates below the line in columns (without the directory part of file names). */
static void show_candidates(EditLine *el, const strlist *l, size_t skip)
{
    int cols = 80;
    el_get(el, EL_GETTC, "co", &cols);
    size_t width = 0;
    for (int i = 0; i < l->n; i++)
        width = strlen(l->v[i]) - skip > width ? strlen(l->v[i]) - skip : width;
    int per_row = cols > 0 && (size_t)cols > width + 2 ? (int)((size_t)cols / (width + 2)) : 1;
    fputc('\n', stdout);
    for (int i = 0; i < l->n; i++)
        printf("%-*s%s", (int)(width + 2), l->v[i] + skip, (i + 1) % per_row && i + 1 < l->n ? "" : "\n");
    fflush(stdout);
}

static size_t common_prefix(const strlist *l)
{
    size_t n = strlen(l->v[0]);
    for (int i = 1; i < l->n; i++)
        for (size_t j = 0; j < n; j++)
            if (l->v[i][j] != l->v[0][j]) {
                n = j;
                break;
            }
    return n;
}

/* Completes word (as typed, unescaped) from the candidates: the unique one, else their common prefix,
 * else a list of them. */
static unsigned char complete_from(EditLine *el, strlist *l, const char *word, int files)
{
    size_t wlen = strlen(word);
    if (!l->n)
        return CC_REFRESH_BEEP;
    qsort(l->v, (size_t)l->n, sizeof *l->v, cmp_str);
    size_t common = common_prefix(l);
    if (l->n == 1) {
        insert_escaped(el, l->v[0] + wlen);
        if (!files || !common || l->v[0][common - 1] != '/')
            el_insertstr(el, " ");
        return CC_REFRESH;
    }
    if (common > wlen) {
        char *extra = strndup(l->v[0] + wlen, common - wlen);
        if (extra)
            insert_escaped(el, extra);
        free(extra);
        return CC_REFRESH;
    }
    const char *slash = files ? strrchr(word, '/') : NULL;
    show_candidates(el, l, slash ? (size_t)(slash - word) + 1 : 0);
    return CC_REDISPLAY;
}

/* The text between begin and end without the backslashes of escapes. */
static char *unescape(const char *begin, const char *end)
{
    char *s = malloc((size_t)(end - begin) + 1), *o = s;
    for (const char *p = begin; s && p < end; p++)
        *o++ = *p == '\\' && p + 1 < end ? *++p : *p;
    if (s)
        *o = 0;
    return s;
}

static unsigned char complete(EditLine *el, int ch)
{
    (void)ch;
    const LineInfo *li = el_line(el);
    size_t cur = (size_t)(li->cursor - li->buffer), ws = word_start(li->buffer, cur), seg = ws;
    while (seg > 0 && li->buffer[seg - 1] != ';')
        seg--;
    char *before = strndup(li->buffer + seg, ws - seg), *word = unescape(li->buffer + ws, li->cursor);
    char why[64];
    int argc = 0, files = 0;
    char **argv = NULL;
    unsigned char rc = CC_REFRESH_BEEP;
    sp_app *app = NULL;
    el_get(el, EL_CLIENTDATA, &app);
    if (before && word && app && !sp_cmd_split(before, &argc, &argv, why, sizeof why)) {
        strlist l = {0};
        candidates(app, argc, argv, word, &l, &files);
        rc = complete_from(el, &l, word, files);
        sl_free(&l);
    }
    sp_cmd_free_argv(argc, argv);
    free(before);
    free(word);
    return rc;
}

/* ---------------------------------------------------------------------------------------------- */
/* history: one command per line, plain text */

#define HISTORY_MAX 1000

static char *history_path(void)
{
    const char *env = getenv("SEPAL_HISTORY"), *home = getenv("HOME");
    char *path = NULL;
    if (env && *env)
        return strdup(env);
    if (home && *home && asprintf(&path, "%s/.sepal_history", home) < 0)
        return NULL;
    return path;
}

static void history_load(History *h, const char *path)
{
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f)
        return;
    HistEvent ev;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) >= 0) {
        line[strcspn(line, "\r\n")] = 0;
        if (*line)
            history(h, &ev, H_ENTER, line);
    }
    free(line);
    fclose(f);
}

static void history_save(History *h, const char *path)
{
    FILE *f = path ? fopen(path, "w") : NULL;
    if (!f)
        return;
    HistEvent ev;
    /* libedit's list runs from the newest (H_FIRST) to the oldest (H_LAST); write oldest first */
    for (int rc = history(h, &ev, H_LAST); rc != -1; rc = history(h, &ev, H_PREV))
        fprintf(f, "%s\n", ev.str);
    fclose(f);
}

/* ---------------------------------------------------------------------------------------------- */
/* the loop */

static char *prompt(EditLine *el)
{
    (void)el;
    return (char *)"sepal> ";
}

static EditLine *editor_new(sp_app *app, History *h)
{
    EditLine *el = el_init("sepal", stdin, stdout, stderr);
    if (!el)
        return NULL;
    el_set(el, EL_EDITOR, "emacs");
    el_set(el, EL_SIGNAL, 1);
    el_set(el, EL_PROMPT, prompt);
    el_set(el, EL_HIST, history, h);
    el_set(el, EL_CLIENTDATA, app);
    /* the wide call keeps these (static) strings; the narrow el_set would copy them and never free them */
    el_wset(el, EL_ADDFN, L"sepal-complete", L"complete a command, setting or file name", complete);
    el_set(el, EL_BIND, "^I", "sepal-complete", NULL);
    el_source(el, NULL); /* ~/.editrc */
    return el;
}

/* One line from the editor without its newline (malloc'd), or NULL at the end of input. */
static char *read_line(EditLine *el)
{
    for (;;) {
        int n = 0;
        errno = 0;
        const char *s = el_gets(el, &n);
        if (s && n > 0)
            return strndup(s, strcspn(s, "\r\n"));
        if (n < 0 && errno == EINTR)
            continue;
        return NULL;
    }
}

int sp_cmd_repl(sp_app *app)
{
    HistEvent ev;
    History *h = history_init();
    char *path = history_path();
    EditLine *el = h ? editor_new(app, h) : NULL;
    if (!el) {
        if (h)
            history_end(h);
        free(path);
        return sp_app_error(app, "cannot start the line editor");
    }
    history(h, &ev, H_SETSIZE, HISTORY_MAX);
    history(h, &ev, H_SETUNIQUE, 1);
    history_load(h, path);
    app->interactive = 1;
    for (char *line; !app->quit && (line = read_line(el));) {
        if (line[strspn(line, " \t")])
            history(h, &ev, H_ENTER, line);
        sp_cmd_run_line(app, line); /* a failed command has printed its message; go on */
        fflush(stdout);
        free(line);
    }
    if (!app->quit && isatty(STDOUT_FILENO))
        fputc('\n', stdout); /* Ctrl-D: end the prompt's line */
    history_save(h, path);
    el_end(el);
    history_end(h);
    free(path);
    return 0;
}
