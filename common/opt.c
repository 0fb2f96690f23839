/* opt.c - option tables: lookup (names, short names, unique prefixes, the names nearest a typo), values checked
 * against their row, the command-line walk, and help generated from the rows. */
#include "opt.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const sp_opt *sp_opt_spec(const sp_opt *o) { return o->like ? o->like : o; }

int sp_opt_count(const sp_opt *opts)
{
    int n = 0;
    while (opts && opts[n].name)
        n++;
    return n;
}

/* ---------------------------------------------------------------------------------------------- */
/* lookup */

void sp_opt_list_add(char *buf, size_t cap, size_t *len, const char *s, int first)
{
    if (!cap || *len >= cap)
        return;
    int n = snprintf(buf + *len, cap - *len, "%s%s", first ? "" : ", ", s);
    if (n > 0)
        *len = *len + (size_t)n < cap ? *len + (size_t)n : cap - 1;
}

int sp_opt_names(const sp_opt *opts, const char *prefix, char *buf, size_t cap, size_t *len)
{
    int count = 0;
    size_t n = strlen(prefix);
    for (int i = 0; opts && opts[i].name; i++)
        if (!strncmp(opts[i].name, prefix, n))
            sp_opt_list_add(buf, cap, len, opts[i].name, !count++);
    return count;
}

/* The edit distance of short strings (insertions, deletions, substitutions and swaps of two neighbours each
 * count one: the optimal string alignment distance); 99 for long ones. */
static int distance(const char *a, const char *b)
{
    size_t n = strlen(a), m = strlen(b);
    if (n > 63 || m > 63)
        return 99;
    int d[64][64];
    for (size_t i = 0; i <= n; i++)
        d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            int x = d[i - 1][j] < d[i][j - 1] ? d[i - 1][j] + 1 : d[i][j - 1] + 1;
            d[i][j] = c < x ? c : x;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < d[i][j])
                d[i][j] = d[i - 2][j - 2] + 1;
        }
    return d[n][m];
}

void sp_similar_init(sp_similar *s, const char *typo)
{
    size_t len = strlen(typo + strspn(typo, "-"));
    *s = (sp_similar){.typo = typo, .dist = len <= 1 ? 0 : len <= 3 ? 1 : len <= 6 ? 2 : 3}; /* "b": none */
}

void sp_similar_offer(sp_similar *s, const char *name, size_t len)
{
    char n[64];
    if (len >= sizeof n)
        return;
    memcpy(n, name, len);
    n[len] = 0;
    int d = distance(s->typo, n);
    if (d > s->dist || !strcmp(n, s->typo) || (s->n && !strcmp(n, s->best[0])))
        return;
    if (d < s->dist || !s->n) /* nearer than all so far */
        s->n = 0, s->dist = d;
    if (s->n < 2)
        memcpy(s->best[s->n++], n, len + 1);
}

int sp_similar_say(const sp_similar *s, const char *after, char *buf, size_t cap, size_t *len)
{
    if (!s->n || !cap || *len >= cap)
        return 0;
    int w = snprintf(buf + *len, cap - *len, " (did you mean %s%s%s?%s)", s->best[0], s->n > 1 ? " or " : "",
                     s->n > 1 ? s->best[1] : "", after ? after : "");
    if (w > 0)
        *len = *len + (size_t)w < cap ? *len + (size_t)w : cap - 1;
    return s->n;
}

int sp_opt_similar(const sp_opt *opts, const char *name, const char *after, char *buf, size_t cap, size_t *len)
{
    sp_similar s;
    sp_similar_init(&s, name);
    for (int i = 0; opts && opts[i].name; i++)
        sp_similar_offer(&s, opts[i].name, strlen(opts[i].name));
    return sp_similar_say(&s, after, buf, cap, len);
}

int sp_opt_find(const sp_opt *opts, const char *name, int prefixes, const char *what, char *why, size_t cap)
{
    for (int i = 0; opts && opts[i].name; i++)
        if (!strcmp(opts[i].name, name) || (opts[i].short_name && !strcmp(opts[i].short_name, name)))
            return i;
    size_t n = strlen(name);
    int hit = -1, count = 0;
    for (int i = 0; prefixes && n > (name[0] == '-' ? 2u : 0u) && opts && opts[i].name; i++)
        if (!strncmp(opts[i].name, name, n))
            hit = i, count++;
    if (count == 1)
        return hit;
    if (why && cap) {
        size_t len = (size_t)snprintf(why, cap, count ? "ambiguous %s '%s': " : "unknown %s '%s'", what, name);
        len = len < cap ? len : cap - 1;
        if (count)
            sp_opt_names(opts, name, why, cap, &len);
        else
            sp_opt_similar(opts, name, NULL, why, cap, &len);
    }
    return count ? -2 : -1;
}

/* ---------------------------------------------------------------------------------------------- */
/* values */

int sp_opt_on(const char *v)
{
    return v && (!strcmp(v, "1") || !strcmp(v, "on") || !strcmp(v, "yes") || !strcmp(v, "true"));
}

static int is_off(const char *v)
{
    return !strcmp(v, "0") || !strcmp(v, "off") || !strcmp(v, "no") || !strcmp(v, "false");
}

/* v's index in the list "a|b|c" (n: v's length), or -1 */
static int choice_index(const char *list, const char *v, size_t n)
{
    int i = 0;
    for (const char *p = list; p && *p; i++) {
        size_t len = strcspn(p, "|");
        if (len == n && !strncmp(p, v, n))
            return i;
        p += len + (p[len] == '|');
    }
    return -1;
}

int sp_opt_alias(const char *aliases, const char *v, char *buf, size_t cap)
{
    size_t n = strlen(v);
    for (const char *p = aliases; p && *p;) {
        size_t len = strcspn(p, "|"), eq = strcspn(p, "=");
        if (eq < len && eq == n && !strncmp(p, v, n)) {
            snprintf(buf, cap, "%.*s", (int)(len - eq - 1), p + eq + 1);
            return 0;
        }
        p += len + (p[len] == '|');
    }
    return -1;
}

int sp_opt_choice(const sp_opt *o, const char *v)
{
    const sp_opt *s = sp_opt_spec(o);
    char name[64];
    int i = choice_index(s->choices, v, strlen(v));
    if (i < 0 && !sp_opt_alias(s->aliases, v, name, sizeof name))
        i = choice_index(s->choices, name, strlen(name));
    return i;
}

void sp_opt_choice_name(const sp_opt *o, int i, char *buf, size_t cap)
{
    const char *p = sp_opt_spec(o)->choices;
    for (; p && *p && i > 0; i--)
        p += strcspn(p, "|") + (p[strcspn(p, "|")] == '|');
    snprintf(buf, cap, "%.*s", p && i == 0 ? (int)strcspn(p, "|") : 0, p ? p : "");
}

/* An integer: decimal digits (exact to 2^63), or a whole number written otherwise ("1e9") up to 2^53. */
static int parse_int(const char *v, double *out)
{
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (!errno && end != v && !*end) {
        *out = (double)x;
        return 0;
    }
    errno = 0;
    double d = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(d) || d != floor(d) || fabs(d) > 9007199254740992.0)
        return -1;
    *out = d;
    return 0;
}

static int parse_num(const char *v, double *out)
{
    char *end;
    errno = 0;
    *out = strtod(v, &end);
    return errno || end == v || *end || !isfinite(*out) ? -1 : 0;
}

long long sp_opt_int(const char *v)
{
    if (!v)
        return 0;
    char *end;
    long long x = strtoll(v, &end, 10);
    return *end ? (long long)sp_opt_num(v) : x; /* "1e9": checked to be whole and at most 2^53 */
}

double sp_opt_num(const char *v)
{
    double d;
    return v && !parse_num(v, &d) ? d : 0;
}

static void range_text(const sp_opt *s, char *buf, size_t cap)
{
    char lo[32], hi[32];
    snprintf(lo, sizeof lo, "%.15g", s->min);
    snprintf(hi, sizeof hi, "%.15g", s->max);
    if (s->min == SP_OPT_ABOVE0)
        snprintf(buf, cap, "(0, %s]", hi);
    else
        snprintf(buf, cap, "[%s, %s]", lo, hi);
}

/* Appends the choices of "a|b|c" near value to why (sp_similar_say). */
static void similar_choice(const char *choices, const char *value, char *why, size_t cap, size_t len)
{
    sp_similar s;
    sp_similar_init(&s, value);
    for (const char *p = choices; *p;) {
        size_t l = strcspn(p, "|");
        sp_similar_offer(&s, p, l);
        p += l + (p[l] == '|');
    }
    sp_similar_say(&s, NULL, why, cap, &len);
}

int sp_opt_check(const sp_opt *o, const char *value, char *why, size_t cap)
{
    const sp_opt *s = sp_opt_spec(o);
    if (s->word && !strcmp(value, s->word))
        return 0;
    if (s->kind == SP_OPT_CHOICE && sp_opt_choice(o, value) < 0) {
        char list[256];
        size_t n = 0;
        for (const char *p = s->choices; *p && n + 3 < sizeof list; p++) {
            if (*p == '|')
                list[n++] = ',', list[n++] = ' ';
            else
                list[n++] = *p;
        }
        list[n] = 0;
        size_t len = (size_t)snprintf(why, cap, "%s: '%s' is not one of %s", o->name, value, list);
        similar_choice(s->choices, value, why, cap, len < cap ? len : cap - 1);
        return -1;
    }
    if (s->kind == SP_OPT_FLAG && !sp_opt_on(value) && !is_off(value)) {
        snprintf(why, cap, "%s: expected on or off, got '%s'", o->name, value);
        return -1;
    }
    if (s->kind != SP_OPT_INT && s->kind != SP_OPT_NUM)
        return 0;
    double v;
    if ((s->kind == SP_OPT_INT ? parse_int(value, &v) : parse_num(value, &v)) || v < s->min || v > s->max) {
        char range[80];
        range_text(s, range, sizeof range);
        snprintf(why, cap, "%s: expected %s in %s, got '%s'", o->name,
                 s->kind == SP_OPT_INT ? "an integer" : "a number", range, value);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* the command line */

/* A word that is no option: not "-..." (but "-", "-5" and "-.5" are words). */
static int is_word(const char *w)
{
    return w[0] != '-' || !w[1] || (w[1] != '-' && (isdigit((unsigned char)w[1]) || w[1] == '.'));
}

sp_opt_got sp_opt_next(sp_opt_parser *p, int *k, const char **value, char *why, size_t cap)
{
    if (p->i == 0)
        p->i = 1;
    if (p->i >= p->argc)
        return SP_OPT_END;
    const char *w = p->argv[p->i++];
    if (!p->dashdash && !strcmp(w, "--")) {
        p->dashdash = 1;
        return sp_opt_next(p, k, value, why, cap);
    }
    if (p->dashdash || is_word(w)) {
        *value = w;
        return SP_OPT_WORD;
    }
    const char *eq = w[1] == '-' ? strchr(w, '=') : NULL;
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)(eq && eq - w < 63 ? eq - w : (long)strlen(w)), w);
    *k = sp_opt_find(p->opts, name, p->prefixes, "option", why, cap);
    if (*k == -1)
        *value = w;
    if (*k < 0)
        return *k == -1 ? SP_OPT_UNKNOWN : SP_OPT_BAD;
    const sp_opt *o = &p->opts[*k];
    if (sp_opt_spec(o)->kind == SP_OPT_FLAG) {
        if (eq) {
            snprintf(why, cap, "option '%s' takes no value", o->name);
            return SP_OPT_BAD;
        }
        *value = "1";
        return SP_OPT_OPTION;
    }
    if (eq) {
        *value = eq + 1;
    } else if (p->i < p->argc) {
        *value = p->argv[p->i++];
    } else {
        const char *meta = sp_opt_spec(o)->kind == SP_OPT_CHOICE ? sp_opt_spec(o)->choices : o->meta;
        snprintf(why, cap, "option '%s' needs a value (%s)", o->name, meta ? meta : "VALUE");
        return SP_OPT_BAD;
    }
    return sp_opt_check(o, *value, why, cap) ? SP_OPT_BAD : SP_OPT_OPTION;
}

/* ---------------------------------------------------------------------------------------------- */
/* help */

void sp_opt_head(const sp_opt *o, char *buf, size_t cap)
{
    const sp_opt *s = sp_opt_spec(o);
    const char *meta = s->kind == SP_OPT_CHOICE ? s->choices : s->kind == SP_OPT_FLAG ? NULL : o->meta;
    snprintf(buf, cap, "%s%s%s%s%s", o->name, o->short_name ? ", " : "", o->short_name ? o->short_name : "",
             meta ? " " : "", meta ? meta : "");
}

void sp_opt_text(const sp_opt *o, char *buf, size_t cap)
{
    const sp_opt *s = sp_opt_spec(o);
    size_t n = (size_t)snprintf(buf, cap, "%s", o->help ? o->help : "");
    if (n < cap && o->like && o->live)
        n += (size_t)snprintf(buf + n, cap - n, " (default: the %s setting)", o->like->name);
    else if (n < cap && s->def)
        n += (size_t)snprintf(buf + n, cap - n, " (default %s)", s->def);
    if ((s->kind == SP_OPT_INT || s->kind == SP_OPT_NUM) && n < cap) {
        char range[80], lo[32];
        snprintf(lo, sizeof lo, "[>= %.15g]", s->min);
        range_text(s, range, sizeof range);
        snprintf(buf + n, cap - n, " %s", s->max >= 1e6 && s->min != SP_OPT_ABOVE0 ? lo : range);
    }
}

void sp_opt_synopsis(const sp_opt *o, char *buf, size_t cap)
{
    const sp_opt *s = sp_opt_spec(o);
    const char *open = o->required ? "" : "[", *close = o->required ? "" : "]";
    if (s->kind == SP_OPT_FLAG)
        snprintf(buf, cap, "%s%s%s", open, o->name, close);
    else if (s->kind == SP_OPT_CHOICE)
        snprintf(buf, cap, "%s%s %s%s", open, o->name, s->choices, close);
    else
        snprintf(buf, cap, "%s%s %s%s", open, o->name, o->meta ? o->meta : "VALUE", close);
}

/* A line being filled, word by word, up to width columns; a full line goes to line() and the next one starts
 * with indent blanks. */
typedef struct filler {
    char text[1024];
    size_t len;
    int col, width, indent;
    int lines; /* given to line() so far */
    sp_opt_line_fn line;
    void *user;
} filler;

static void fill_flush(filler *f)
{
    f->line(f->user, f->text);
    f->lines++;
    f->len = (size_t)snprintf(f->text, sizeof f->text, "%*s", f->indent, "");
    f->col = f->indent;
}

static void fill_word(filler *f, const char *w, size_t n)
{
    if (f->col > f->indent && f->col + 1 + (int)n > f->width)
        fill_flush(f);
    if (f->len < sizeof f->text)
        f->len += (size_t)snprintf(f->text + f->len, sizeof f->text - f->len, "%s%.*s", f->col > f->indent ? " " : "",
                                   (int)n, w);
    f->col += (int)n + (f->col > f->indent);
}

/* The length of a range ("[0, 100]", "(0, 1]", "[>= 1]") at p, kept on one line; 0 if p starts none. */
static size_t range_len(const char *p)
{
    if (*p != '[' && !(*p == '(' && isdigit((unsigned char)p[1])))
        return 0;
    size_t n = strcspn(p, "]\n");
    return p[n] == ']' && n < 40 ? n + 1 : 0;
}

/* text's words after what f holds; '\n' ends a line. */
static void fill_text(filler *f, const char *text)
{
    for (const char *p = text; *p;) {
        size_t n = range_len(p) ? range_len(p) : strcspn(p, " \n");
        if (n)
            fill_word(f, p, n);
        p += n;
        if (*p == '\n')
            fill_flush(f);
        while (*p == ' ')
            p++;
        if (*p == '\n')
            p++;
    }
}

void sp_opt_wrap(const char *text, int width, int indent, sp_opt_line_fn line, void *user)
{
    filler f = {.width = width, .indent = indent, .line = line, .user = user};
    f.len = (size_t)snprintf(f.text, sizeof f.text, "%*s", indent, "");
    f.col = indent;
    fill_text(&f, text);
    if (f.col > indent)
        line(user, f.text);
}

void sp_opt_columns(const char *head, int col, const char *text, int width, sp_opt_line_fn line, void *user)
{
    filler f = {.width = width, .indent = col, .line = line, .user = user};
    int alone = 2 + (int)strlen(head) + 2 > col; /* a head too wide: a line of its own */
    if (alone) {
        snprintf(f.text, sizeof f.text, "  %s", head);
        line(user, f.text);
        f.len = (size_t)snprintf(f.text, sizeof f.text, "%*s", col, "");
    } else {
        f.len = (size_t)snprintf(f.text, sizeof f.text, "  %-*s", col - 2, head);
    }
    f.col = col;
    fill_text(&f, text);
    if (f.col > col || (!alone && !f.lines))
        line(user, f.text);
}

void sp_opt_help(const sp_opt *opts, int width, sp_opt_line_fn line, void *user)
{
    int w = 0;
    for (int i = 0; opts && opts[i].name; i++) {
        char head[160];
        sp_opt_head(&opts[i], head, sizeof head);
        w = (int)strlen(head) > w ? (int)strlen(head) : w;
    }
    w = w > 30 ? 30 : w;
    for (int i = 0; opts && opts[i].name; i++) {
        char head[160], text[768];
        sp_opt_head(&opts[i], head, sizeof head);
        sp_opt_text(&opts[i], text, sizeof text);
        if (opts[i].section)
            line(user, opts[i].section);
        sp_opt_columns(head, w + 4, text, width, line, user);
    }
}
