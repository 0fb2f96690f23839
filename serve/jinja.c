/* jinja.c - the Jinja2 subset of jinja.h: the source split into text and tags (whitespace control, trim_blocks,
 * lstrip_blocks, raw), tags and expressions parsed into a tree, the tree run over cJSON values.
 *
 * Values: every evaluation gives a new cJSON tree its caller owns. `undefined` is a cJSON item of type
 * cJSON_Invalid (falsy, prints as nothing, `is defined` false; an attribute of it is undefined again). Integral
 * numbers print as integers (cJSON keeps no int/float difference). */
#include "jinja.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* How deep expressions and blocks nest, how many steps a render takes, how long its output and values grow, how
 * many numbers range() makes: a template past one is refused, never a crash or a hang. */
enum { MAX_DEPTH = 200, MAX_NODES = 1000, MAX_STEPS = 10000000, MAX_OUT = 16 << 20, MAX_RANGE = 100000 };

/* ---------------------------------------------------------------------------------------------- */
/* the tree */

typedef enum {
    N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_MACRO, N_BREAK, N_CONTINUE, /* statements */
    N_LIT, N_NAME, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER, N_TEST, N_NOT, N_NEG, N_BIN, N_AND, N_OR, N_COND,
    N_LIST, N_DICT, /* expressions */
} ntype;

typedef struct node node;
struct node {
    ntype t;
    int line;
    char *s;            /* TEXT: the text; NAME, ATTR, FILTER, TEST, MACRO: the name; BIN: the operator; SET: the
                           attribute of `set ns.attr` (NULL: a plain name in s2) */
    char *s2;           /* SET: the variable; FOR: the second target (NULL: one) */
    node *a, *b, *c;    /* operands; IF: a cond, b body, c the else (an IF for elif); FOR: a iterable, b body,
                           c else body; SET, OUT: a value; FOR's filter: d */
    node *d;
    node **v;           /* LIST, DICT (keys then values, alternating), CALL, FILTER, TEST: arguments; a body
                           (statements): its statements; MACRO: parameter defaults (NULL: none) */
    char **k;           /* CALL, FILTER: keyword names (NULL: positional); MACRO: parameter names */
    int n;
    int neg;            /* TEST: `is not` */
    cJSON *lit;         /* LIT */
};

static void node_free(node *x)
{
    if (!x)
        return;
    free(x->s);
    free(x->s2);
    node_free(x->a);
    node_free(x->b);
    node_free(x->c);
    node_free(x->d);
    for (int i = 0; i < x->n; i++) {
        node_free(x->v ? x->v[i] : NULL);
        free(x->k ? x->k[i] : NULL);
    }
    free(x->v);
    free(x->k);
    cJSON_Delete(x->lit);
    free(x);
}

/* ---------------------------------------------------------------------------------------------- */
/* errors */

typedef struct jerr {
    int failed;
    char msg[400];
} jerr;

__attribute__((format(printf, 3, 4))) static void fail(jerr *e, int line, const char *fmt, ...)
{
    if (e->failed)
        return;
    e->failed = 1;
    int n = line > 0 ? snprintf(e->msg, sizeof e->msg, "chat template line %d: ", line)
                     : snprintf(e->msg, sizeof e->msg, "chat template: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg + n, sizeof e->msg - (size_t)n, fmt, ap);
    va_end(ap);
}

/* ---------------------------------------------------------------------------------------------- */
/* strings */

/* A growing string. */
typedef struct sbuf {
    char *s;
    size_t len, cap;
    int oom; /* 1 out of memory, 2 past MAX_OUT */
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n >= MAX_OUT) {
        b->oom = 2;
        return;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *t = realloc(b->s, cap);
        if (!t) {
            b->oom = 1;
            return;
        }
        b->s = t;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* The string built (the caller's), or NULL (freed) when it could not be. */
static char *sb_done(sbuf *b)
{
    if (b->oom) {
        free(b->s);
        return NULL;
    }
    return b->s;
}

static cJSON *str_value(char *s) /* takes s */
{
    cJSON *v = s ? cJSON_CreateString(s) : NULL;
    free(s);
    return v;
}

/* ---------------------------------------------------------------------------------------------- */
/* segments: text and tags */

typedef enum { SEG_TEXT, SEG_EXPR, SEG_STMT } segtype;

typedef struct seg {
    segtype t;
    char *s; /* the text, or the tag's inside */
    int line;
} seg;

typedef struct segs {
    seg *v;
    int n, cap;
} segs;

static int seg_add(segs *ss, segtype t, const char *s, size_t len, int line)
{
    if (ss->n == ss->cap) {
        seg *v = realloc(ss->v, (size_t)(ss->cap = ss->cap ? 2 * ss->cap : 64) * sizeof *v);
        if (!v)
            return -1;
        ss->v = v;
    }
    char *copy = strndup(s, len);
    if (!copy)
        return -1;
    ss->v[ss->n++] = (seg){t, copy, line};
    return 0;
}

static int count_lines(const char *a, const char *b)
{
    int n = 0;
    for (; a < b; a++)
        n += *a == '\n';
    return n;
}

/* The end of a tag that started at p (after its opener): where `close` begins, outside string literals. */
static const char *tag_end(const char *p, const char *close)
{
    for (char q = 0; *p; p++) {
        if (q) {
            if (*p == '\\' && p[1])
                p++;
            else if (*p == q)
                q = 0;
        } else if (*p == '"' || *p == '\'') {
            q = *p;
        } else if (!strncmp(p, close, 2)) {
            return p;
        }
    }
    return NULL;
}

/* Text before a tag, with what the tag's whitespace control strips from its end: all whitespace (`{%-`), or with
 * lstrip_blocks the blanks between the line's start and a block or comment tag. */
static size_t text_len(const char *text, size_t len, int minus, int lstrip, int line_start)
{
    if (minus) {
        while (len && isspace((unsigned char)text[len - 1]))
            len--;
    } else if (lstrip) {
        size_t k = len;
        while (k && (text[k - 1] == ' ' || text[k - 1] == '\t'))
            k--;
        if ((k == 0 && line_start) || (k > 0 && text[k - 1] == '\n'))
            len = k;
    }
    return len;
}

/* {% raw %}...{% endraw %}: the text up to the end tag; *p moves past it. */
static int raw_block(segs *ss, const char **p, int line, jerr *e)
{
    const char *q = *p;
    for (const char *t; (t = strstr(q, "{%"));) {
        const char *in = t + 2 + (t[2] == '-' || t[2] == '+');
        while (isspace((unsigned char)*in))
            in++;
        if (!strncmp(in, "endraw", 6)) {
            const char *end = tag_end(in, "%}");
            if (!end)
                break;
            size_t len = text_len(*p, (size_t)(t - *p), t[2] == '-', 0, 0);
            if (seg_add(ss, SEG_TEXT, *p, len, line))
                return -1;
            *p = end + 2;
            if (end[-1] == '-') /* the text after it: as after any block tag */
                while (isspace((unsigned char)**p))
                    ++*p;
            else if (**p == '\n')
                ++*p;
            return 0;
        }
        q = t + 2;
    }
    fail(e, line, "{%% raw %%} without {%% endraw %%}");
    return -1;
}

/* Splits src into text, {{ expressions }} and {% statements %} (comments dropped), applying whitespace control,
 * trim_blocks (the newline after a block or comment tag) and lstrip_blocks. */
static int split(const char *src, segs *ss, jerr *e)
{
    const char *p = src;
    int line = 1, strip_next = 0;
    while (*p) {
        const char *t = p;
        while ((t = strchr(t, '{')) && t[1] != '{' && t[1] != '%' && t[1] != '#')
            t++;
        const char *text = p;
        size_t len = t ? (size_t)(t - p) : strlen(p);
        if (strip_next)
            while (len && isspace((unsigned char)*text))
                text++, len--;
        strip_next = 0;
        if (!t) {
            if (len && seg_add(ss, SEG_TEXT, text, len, line))
                return -1;
            break;
        }
        char kind = t[1];
        int minus = t[2] == '-', plus = t[2] == '+';
        len = text_len(text, len, minus, kind != '{' && !plus, text == src || text[-1] == '\n');
        if (len && seg_add(ss, SEG_TEXT, text, len, line))
            return -1;
        line += count_lines(p, t);
        const char *in = t + 2 + (minus || plus);
        const char *close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
        const char *end = kind == '#' ? strstr(in, "#}") : tag_end(in, close);
        if (!end) {
            fail(e, line, "a tag opened here is not closed with %s", close);
            return -1;
        }
        int rminus = end > in && end[-1] == '-';
        if (kind != '#') {
            const char *a = in, *b = end - rminus;
            while (a < b && isspace((unsigned char)*a))
                a++;
            while (b > a && isspace((unsigned char)b[-1]))
                b--;
            if (seg_add(ss, kind == '{' ? SEG_EXPR : SEG_STMT, a, (size_t)(b - a), line))
                return -1;
        }
        line += count_lines(t, end);
        p = end + 2;
        if (rminus)
            strip_next = 1;
        else if (kind != '{' && *p == '\n') /* trim_blocks */
            p++, line++;
        else if (kind != '{' && p[0] == '\r' && p[1] == '\n')
            p += 2, line++;
        if (kind == '%' && !strcmp(ss->v[ss->n - 1].s, "raw")) {
            free(ss->v[--ss->n].s);
            if (raw_block(ss, &p, line, e))
                return -1;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* expressions: tokens */

typedef enum { T_END, T_NAME, T_NUM, T_STR, T_OP } ttype;

typedef struct lexer {
    const char *p;
    ttype t;
    char tok[8192]; /* NAME, NUM, OP: the text; STR: the value */
    double num;
    int line;
    int depth;      /* of nested expressions (parentheses, lists, calls ...): MAX_DEPTH at most */
    int nodes;      /* made for this tag: MAX_NODES at most (evaluating a tree recurses as deep as it is) */
    jerr *e;
} lexer;


static const char *const OPS[] = {"**", "//", "==", "!=", "<=", ">=", "(", ")", "[", "]", "{", "}", ".", ",", ":",
                                  "|",  "~",  "+",  "-",  "*",  "/",  "%", "<", ">", "=", NULL};

static void lex_string(lexer *L)
{
    char q = *L->p++;
    size_t n = 0;
    while (*L->p && *L->p != q) {
        char ch = *L->p++;
        if (ch == '\\' && *L->p) {
            ch = *L->p++;
            ch = ch == 'n' ? '\n' : ch == 't' ? '\t' : ch == 'r' ? '\r' : ch == '0' ? '\0' : ch;
        }
        if (n + 1 < sizeof L->tok)
            L->tok[n++] = ch;
        else
            return fail(L->e, L->line, "a string longer than %zu bytes", sizeof L->tok - 1), (void)(L->t = T_END);
    }
    L->tok[n] = 0;
    if (*L->p != q)
        fail(L->e, L->line, "a string is not closed");
    else
        L->p++;
    L->t = T_STR;
}

static void next(lexer *L)
{
    while (isspace((unsigned char)*L->p))
        L->p++;
    const char *p = L->p;
    if (!*p) {
        L->t = T_END;
        L->tok[0] = 0;
    } else if (*p == '"' || *p == '\'') {
        lex_string(L);
    } else if (isdigit((unsigned char)*p)) {
        char *end;
        L->num = strtod(p, &end);
        snprintf(L->tok, sizeof L->tok, "%.*s", (int)(end - p), p);
        L->p = end;
        L->t = T_NUM;
    } else if (isalpha((unsigned char)*p) || *p == '_') {
        size_t n = 0;
        while ((isalnum((unsigned char)*L->p) || *L->p == '_') && n + 1 < sizeof L->tok)
            L->tok[n++] = *L->p++;
        L->tok[n] = 0;
        L->t = T_NAME;
    } else {
        for (int i = 0; OPS[i]; i++)
            if (!strncmp(p, OPS[i], strlen(OPS[i]))) {
                snprintf(L->tok, sizeof L->tok, "%s", OPS[i]);
                L->p += strlen(OPS[i]);
                L->t = T_OP;
                return;
            }
        fail(L->e, L->line, "unexpected character '%c'", *p);
        L->t = T_END;
    }
}

static int is_op(const lexer *L, const char *op) { return L->t == T_OP && !strcmp(L->tok, op); }
static int is_name(const lexer *L, const char *w) { return L->t == T_NAME && !strcmp(L->tok, w); }

static int expect_op(lexer *L, const char *op)
{
    if (!is_op(L, op)) {
        fail(L->e, L->line, "expected '%s', found '%s'", op, L->t == T_END ? "the end" : L->tok);
        return -1;
    }
    next(L);
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* expressions: the parser (Jinja's precedence: or, and, not, comparisons, + -, ~, * / // %, **, unary, then
 * postfix: . [] () and the filters and tests) */

static node *mk(lexer *L, ntype t)
{
    if (++L->nodes > MAX_NODES) {
        fail(L->e, L->line, "an expression of more than %d parts", MAX_NODES);
        return NULL;
    }
    node *x = calloc(1, sizeof *x);
    if (!x)
        fail(L->e, L->line, "out of memory");
    else
        x->t = t, x->line = L->line;
    return x;
}

static node *bin(lexer *L, ntype t, const char *op, node *a, node *b)
{
    node *x = mk(L, t);
    if (!x || !a || !b) {
        node_free(x), node_free(a), node_free(b);
        return NULL;
    }
    x->s = op ? strdup(op) : NULL;
    x->a = a;
    x->b = b;
    return x;
}

static int push_arg(node *x, node *v, const char *kw)
{
    node **nv = realloc(x->v, (size_t)(x->n + 1) * sizeof *nv);
    char **nk = nv ? realloc(x->k, (size_t)(x->n + 1) * sizeof *nk) : NULL;
    if (nv)
        x->v = nv;
    if (nk)
        x->k = nk;
    if (!nv || !nk || !v) {
        node_free(v);
        return -1;
    }
    x->v[x->n] = v;
    x->k[x->n++] = kw ? strdup(kw) : NULL;
    return 0;
}

static node *expr(lexer *L);
static node *unary(lexer *L);

/* (args) after a callee or filter: positional and name=value. */
static int call_args(lexer *L, node *x)
{
    next(L); /* ( */
    while (!is_op(L, ")") && !L->e->failed) {
        char kw[128] = "";
        if (L->t == T_NAME) { /* name=value? */
            lexer peek = *L;
            next(&peek);
            if (is_op(&peek, "=")) {
                snprintf(kw, sizeof kw, "%.127s", L->tok);
                *L = peek;
                next(L);
            }
        }
        if (push_arg(x, expr(L), *kw ? kw : NULL))
            return -1;
        if (!is_op(L, ","))
            break;
        next(L);
    }
    return expect_op(L, ")");
}

static node *list_or_dict(lexer *L, int dict)
{
    node *x = mk(L, dict ? N_DICT : N_LIST);
    next(L);
    while (x && !is_op(L, dict ? "}" : "]") && !L->e->failed) {
        if (push_arg(x, expr(L), NULL) || (dict && (expect_op(L, ":") || push_arg(x, expr(L), NULL))))
            break;
        if (!is_op(L, ","))
            break;
        next(L);
    }
    if (x && expect_op(L, dict ? "}" : "]"))
        return node_free(x), NULL;
    return x;
}

static node *literal(lexer *L, cJSON *v)
{
    node *x = mk(L, N_LIT);
    if (x)
        x->lit = v;
    else
        cJSON_Delete(v);
    return x;
}

static node *primary(lexer *L)
{
    if (L->t == T_NUM) {
        double d = L->num;
        next(L);
        return literal(L, cJSON_CreateNumber(d));
    }
    if (L->t == T_STR) {
        sbuf b = {0};
        sb_str(&b, "");
        while (L->t == T_STR) { /* adjacent strings are one */
            sb_str(&b, L->tok);
            next(L);
        }
        return literal(L, str_value(sb_done(&b)));
    }
    if (L->t == T_NAME) {
        const char *w = L->tok;
        cJSON *v = !strcmp(w, "true") || !strcmp(w, "True")     ? cJSON_CreateTrue()
                   : !strcmp(w, "false") || !strcmp(w, "False") ? cJSON_CreateFalse()
                   : !strcmp(w, "none") || !strcmp(w, "None")   ? cJSON_CreateNull()
                                                                : NULL;
        if (v) {
            next(L);
            return literal(L, v);
        }
        node *x = mk(L, N_NAME);
        if (x)
            x->s = strdup(w);
        next(L);
        return x;
    }
    if (is_op(L, "(")) {
        next(L);
        node *x = expr(L);
        if (expect_op(L, ")"))
            return node_free(x), NULL;
        return x;
    }
    if (is_op(L, "[") || is_op(L, "{"))
        return list_or_dict(L, is_op(L, "{"));
    fail(L->e, L->line, "unexpected '%s'", L->t == T_END ? "end of expression" : L->tok);
    return NULL;
}

/* [i], [a:b:c] after x. */
static node *subscript(lexer *L, node *x)
{
    next(L);
    node *part[3] = {NULL, NULL, NULL};
    int colons = 0;
    for (;;) {
        if (!is_op(L, ":") && !is_op(L, "]"))
            part[colons] = expr(L);
        if (!is_op(L, ":") || colons == 2)
            break;
        colons++;
        next(L);
    }
    if (expect_op(L, "]") || (!colons && !part[0])) {
        node_free(part[0]), node_free(part[1]), node_free(part[2]), node_free(x);
        return NULL;
    }
    node *y = mk(L, colons ? N_SLICE : N_ITEM);
    if (!y) {
        node_free(part[0]), node_free(part[1]), node_free(part[2]), node_free(x);
        return NULL;
    }
    y->a = x;
    y->b = part[0];
    y->c = part[1];
    y->d = part[2];
    return y;
}

static node *postfix(lexer *L, node *x)
{
    while (x && !L->e->failed) {
        if (is_op(L, ".")) {
            next(L);
            if (L->t != T_NAME) {
                fail(L->e, L->line, "expected a name after '.'");
                return node_free(x), NULL;
            }
            node *y = mk(L, N_ATTR);
            if (!y)
                return node_free(x), NULL;
            y->a = x;
            y->s = strdup(L->tok);
            x = y;
            next(L);
        } else if (is_op(L, "[")) {
            x = subscript(L, x);
        } else if (is_op(L, "(")) {
            node *y = mk(L, N_CALL);
            if (!y)
                return node_free(x), NULL;
            y->a = x;
            x = y;
            if (call_args(L, y))
                return node_free(x), NULL;
        } else {
            break;
        }
    }
    return x;
}

/* | filter(args) and `is [not] test(args)` after x. */
static node *filters(lexer *L, node *x)
{
    while (x && !L->e->failed && (is_op(L, "|") || is_name(L, "is"))) {
        int test = is_name(L, "is");
        next(L);
        int neg = test && is_name(L, "not");
        if (neg)
            next(L);
        if (L->t != T_NAME) {
            fail(L->e, L->line, "expected a %s name", test ? "test" : "filter");
            return node_free(x), NULL;
        }
        node *y = mk(L, test ? N_TEST : N_FILTER);
        if (!y)
            return node_free(x), NULL;
        y->a = x;
        y->s = strdup(L->tok);
        y->neg = neg;
        x = y;
        next(L);
        if (is_op(L, "(") && call_args(L, y))
            return node_free(x), NULL;
        else if (test && (L->t == T_STR || L->t == T_NUM || (L->t == T_NAME && !is_name(L, "and") &&
                                                              !is_name(L, "or") && !is_name(L, "else") &&
                                                              !is_name(L, "if"))))
            push_arg(y, primary(L), NULL); /* `is equalto 3`, `is sameas none` */
    }
    return x;
}

/* -x, +x, then the postfix operators, the filters and tests: `-3|abs` is (-3)|abs, as in Jinja. */
static node *unary(lexer *L)
{
    int negs = 0;
    for (; is_op(L, "-") || is_op(L, "+"); next(L))
        negs += is_op(L, "-");
    node *x = postfix(L, primary(L));
    for (negs %= 2; x && negs; negs--) {
        node *y = mk(L, N_NEG);
        if (!y)
            return node_free(x), NULL;
        y->a = x;
        x = y;
    }
    return filters(L, x);
}

static node *power(lexer *L)
{
    node *x = unary(L);
    while (x && is_op(L, "**")) {
        next(L);
        x = bin(L, N_BIN, "**", x, unary(L));
    }
    return x;
}

static node *product(lexer *L)
{
    node *x = power(L);
    while (x && (is_op(L, "*") || is_op(L, "/") || is_op(L, "//") || is_op(L, "%"))) {
        char op[4];
        snprintf(op, sizeof op, "%.3s", L->tok);
        next(L);
        x = bin(L, N_BIN, op, x, power(L));
    }
    return x;
}

static node *concat(lexer *L)
{
    node *x = product(L);
    while (x && is_op(L, "~")) {
        next(L);
        x = bin(L, N_BIN, "~", x, product(L));
    }
    return x;
}

static node *sum(lexer *L)
{
    node *x = concat(L);
    while (x && (is_op(L, "+") || is_op(L, "-"))) {
        char op[2] = {L->tok[0], 0};
        next(L);
        x = bin(L, N_BIN, op, x, concat(L));
    }
    return x;
}

static node *compare(lexer *L)
{
    node *x = sum(L);
    static const char *const cmp[] = {"==", "!=", "<", ">", "<=", ">=", NULL};
    while (x && !L->e->failed) {
        const char *op = NULL;
        for (int i = 0; cmp[i]; i++)
            if (is_op(L, cmp[i]))
                op = cmp[i];
        if (!op && is_name(L, "in"))
            op = "in";
        if (!op && is_name(L, "not")) { /* not in */
            lexer peek = *L;
            next(&peek);
            if (!is_name(&peek, "in"))
                break;
            *L = peek;
            op = "not in";
        }
        if (!op)
            break;
        next(L);
        x = bin(L, N_BIN, op, x, sum(L));
    }
    return x;
}

static node *not_expr(lexer *L)
{
    int nots = 0;
    for (; is_name(L, "not"); next(L))
        nots++;
    node *x = compare(L);
    for (; x && nots; nots--) {
        node *y = mk(L, N_NOT);
        if (!y)
            return node_free(x), NULL;
        y->a = x;
        x = y;
    }
    return x;
}

static node *and_expr(lexer *L)
{
    node *x = not_expr(L);
    while (x && is_name(L, "and")) {
        next(L);
        x = bin(L, N_AND, NULL, x, not_expr(L));
    }
    return x;
}

static node *or_expr(lexer *L)
{
    node *x = and_expr(L);
    while (x && is_name(L, "or")) {
        next(L);
        x = bin(L, N_OR, NULL, x, and_expr(L));
    }
    return x;
}

/* x if cond [else y] */
static node *cond_expr(lexer *L)
{
    node *x = or_expr(L);
    if (!x || !is_name(L, "if"))
        return x;
    next(L);
    node *cond = or_expr(L), *alt = NULL;
    if (is_name(L, "else")) {
        next(L);
        alt = expr(L);
    }
    node *y = mk(L, N_COND);
    if (!y || !cond) {
        node_free(x), node_free(cond), node_free(alt), node_free(y);
        return NULL;
    }
    y->a = x;
    y->b = cond;
    y->c = alt;
    return y;
}

static node *expr(lexer *L)
{
    if (L->depth >= MAX_DEPTH) {
        fail(L->e, L->line, "expressions nested too deep");
        return NULL;
    }
    L->depth++;
    node *x = cond_expr(L);
    L->depth--;
    return x;
}

/* ---------------------------------------------------------------------------------------------- */
/* statements */

typedef struct parser {
    segs *ss;
    int i;
    int depth; /* of nested blocks and elifs: MAX_DEPTH at most */
    jerr *e;
} parser;

static void lex_init(lexer *L, const char *s, int line, jerr *e)
{
    memset(L, 0, sizeof *L);
    L->p = s;
    L->line = line;
    L->e = e;
    next(L);
}

/* An expression that must fill the rest of the tag. */
static node *whole_expr(lexer *L)
{
    node *x = expr(L);
    if (x && L->t != T_END) {
        fail(L->e, L->line, "unexpected '%s' after an expression", L->tok);
        return node_free(x), NULL;
    }
    return x;
}

/* The first word of a statement tag. */
static void keyword(const seg *s, char *kw, size_t cap)
{
    size_t n = 0;
    const char *p = s->s;
    while ((isalnum((unsigned char)*p) || *p == '_') && n + 1 < cap)
        kw[n++] = *p++;
    kw[n] = 0;
}

static node *body(parser *P, const char *const *ends, char *ended, size_t cap);

static node *stmt_if(parser *P, lexer *L)
{
    node *x = mk(L, N_IF);
    if (!x)
        return NULL;
    x->a = whole_expr(L);
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    char kw[16];
    x->b = body(P, ends, kw, sizeof kw);
    if (!x->a || P->e->failed)
        return node_free(x), NULL;
    if (!strcmp(kw, "elif")) {
        lexer L2;
        seg *s = &P->ss->v[P->i - 1];
        lex_init(&L2, s->s + 4, s->line, P->e);
        if (++P->depth > MAX_DEPTH)
            fail(P->e, s->line, "blocks nested too deep");
        x->c = P->e->failed ? NULL : stmt_if(P, &L2); /* its own endif ends both */
        P->depth--;
        return x->c ? x : (node_free(x), NULL);
    }
    if (!strcmp(kw, "else")) {
        static const char *const endif[] = {"endif", NULL};
        x->c = body(P, endif, kw, sizeof kw);
    }
    return P->e->failed ? (node_free(x), NULL) : x;
}

static node *stmt_for(parser *P, lexer *L)
{
    node *x = mk(L, N_FOR);
    if (!x)
        return NULL;
    if (L->t != T_NAME || is_name(L, "in"))
        return fail(P->e, L->line, "for: expected a name"), node_free(x), NULL;
    x->s = strdup(L->tok);
    next(L);
    if (is_op(L, ",")) {
        next(L);
        if (L->t != T_NAME)
            return fail(P->e, L->line, "for: expected a second name"), node_free(x), NULL;
        x->s2 = strdup(L->tok);
        next(L);
    }
    if (!is_name(L, "in"))
        return fail(P->e, L->line, "for: expected 'in'"), node_free(x), NULL;
    next(L);
    x->a = or_expr(L); /* (not expr: its `if` is the loop's filter) */
    if (is_name(L, "if")) {
        next(L);
        x->d = or_expr(L);
    }
    if (L->t != T_END && !P->e->failed)
        fail(P->e, L->line, "for: unexpected '%s'", L->tok);
    static const char *const ends[] = {"else", "endfor", NULL};
    char kw[16];
    x->b = body(P, ends, kw, sizeof kw);
    if (!strcmp(kw, "else")) {
        static const char *const endfor[] = {"endfor", NULL};
        x->c = body(P, endfor, kw, sizeof kw);
    }
    return P->e->failed ? (node_free(x), NULL) : x;
}

static node *stmt_set(parser *P, lexer *L)
{
    node *x = mk(L, N_SET);
    if (!x)
        return NULL;
    if (L->t != T_NAME)
        return fail(P->e, L->line, "set: expected a name"), node_free(x), NULL;
    x->s2 = strdup(L->tok);
    next(L);
    if (is_op(L, ".")) {
        next(L);
        x->s = strdup(L->tok);
        next(L);
    }
    if (is_op(L, "=")) {
        next(L);
        x->a = whole_expr(L);
        return x->a ? x : (node_free(x), NULL);
    }
    if (L->t != T_END) /* {% set x %}...{% endset %}: the block's output */
        return fail(P->e, L->line, "set: expected '='"), node_free(x), NULL;
    static const char *const ends[] = {"endset", NULL};
    char kw[16];
    x->b = body(P, ends, kw, sizeof kw);
    return P->e->failed ? (node_free(x), NULL) : x;
}

static node *stmt_macro(parser *P, lexer *L)
{
    node *x = mk(L, N_MACRO);
    if (!x || L->t != T_NAME)
        return fail(P->e, L->line, "macro: expected a name"), node_free(x), NULL;
    x->s = strdup(L->tok);
    next(L);
    if (expect_op(L, "("))
        return node_free(x), NULL;
    while (L->t == T_NAME && !P->e->failed) {
        char name[128];
        snprintf(name, sizeof name, "%.127s", L->tok);
        next(L);
        node *def = NULL;
        if (is_op(L, "=")) {
            next(L);
            def = expr(L);
        }
        node **nv = realloc(x->v, (size_t)(x->n + 1) * sizeof *nv);
        char **nk = nv ? realloc(x->k, (size_t)(x->n + 1) * sizeof *nk) : NULL;
        if (nv)
            x->v = nv;
        if (!nk)
            return node_free(def), node_free(x), NULL;
        x->k = nk;
        x->v[x->n] = def;
        x->k[x->n++] = strdup(name);
        if (!is_op(L, ","))
            break;
        next(L);
    }
    if (expect_op(L, ")"))
        return node_free(x), NULL;
    static const char *const ends[] = {"endmacro", NULL};
    char kw[16];
    x->b = body(P, ends, kw, sizeof kw);
    return P->e->failed ? (node_free(x), NULL) : x;
}

static node *stmt_generation(parser *P, lexer *L)
{
    node *x = mk(L, N_IF);
    if (!x || !(x->a = literal(L, cJSON_CreateTrue())))
        return node_free(x), NULL;
    static const char *const ends[] = {"endgeneration", NULL};
    char kw[16];
    x->b = body(P, ends, kw, sizeof kw);
    return P->e->failed ? (node_free(x), NULL) : x;
}

static node *statement(parser *P, const seg *s, const char *kw)
{
    lexer L;
    lex_init(&L, s->s, s->line, P->e);
    next(&L); /* past the keyword */
    if (!strcmp(kw, "if"))
        return stmt_if(P, &L);
    if (!strcmp(kw, "for"))
        return stmt_for(P, &L);
    if (!strcmp(kw, "set"))
        return stmt_set(P, &L);
    if (!strcmp(kw, "macro"))
        return stmt_macro(P, &L);
    if (!strcmp(kw, "break") || !strcmp(kw, "continue"))
        return mk(&L, kw[0] == 'b' ? N_BREAK : N_CONTINUE);
    if (!strcmp(kw, "generation")) /* transformers' marker of the assistant's part: its body as it is */
        return stmt_generation(P, &L);
    fail(P->e, s->line, "unsupported tag {%% %s %%}", kw);
    return NULL;
}

static node *body_in(parser *P, const char *const *ends, char *ended, size_t cap);

/* The closing keyword of ends (the last). */
static int last_of(const char *const *ends)
{
    int last = 0;
    while (ends[last + 1])
        last++;
    return last;
}

/* A tag that only ends or divides a block (met where no block of its kind is open). */
static int stray_end(const char *kw)
{
    return !strncmp(kw, "end", 3) || !strcmp(kw, "elif") || !strcmp(kw, "else");
}

/* Statements up to one of ends (its keyword into ended; ends NULL: the end of the template). */
static node *body(parser *P, const char *const *ends, char *ended, size_t cap)
{
    if (ended)
        ended[0] = 0;
    if (P->depth >= MAX_DEPTH) {
        fail(P->e, P->i > 0 ? P->ss->v[P->i - 1].line : 0, "blocks nested too deep");
        return NULL;
    }
    P->depth++;
    node *x = body_in(P, ends, ended, cap);
    P->depth--;
    return x;
}

static node *body_in(parser *P, const char *const *ends, char *ended, size_t cap)
{
    node *x = calloc(1, sizeof *x);
    if (!x)
        return fail(P->e, 0, "out of memory"), NULL;
    x->t = N_TEXT; /* a body: its statements in v */
    if (ended)
        ended[0] = 0;
    while (P->i < P->ss->n && !P->e->failed) {
        seg *s = &P->ss->v[P->i++];
        node *y = NULL;
        if (s->t == SEG_TEXT) {
            y = calloc(1, sizeof *y);
            if (y) {
                y->t = N_TEXT;
                y->s = strdup(s->s);
                y->line = s->line;
            }
        } else if (s->t == SEG_EXPR) {
            lexer L;
            lex_init(&L, s->s, s->line, P->e);
            node *v = whole_expr(&L);
            if (v && (y = calloc(1, sizeof *y))) {
                y->t = N_OUT;
                y->a = v;
                y->line = s->line;
            } else {
                node_free(v);
            }
        } else {
            char kw[32];
            keyword(s, kw, sizeof kw);
            for (int i = 0; ends && ends[i]; i++)
                if (!strcmp(kw, ends[i])) {
                    snprintf(ended, cap, "%.*s", (int)cap - 1, kw);
                    return x;
                }
            y = stray_end(kw) ? NULL : statement(P, s, kw);
            if (!y && stray_end(kw) && ends)
                fail(P->e, s->line, "{%% %s %%} where {%% %s %%} was expected", kw, ends[last_of(ends)]);
            else if (!y && stray_end(kw))
                fail(P->e, s->line, "{%% %s %%} without its opening tag", kw);
        }
        if (!y || push_arg(x, y, NULL)) {
            if (!P->e->failed)
                fail(P->e, s->line, "out of memory");
            break;
        }
    }
    if (ends && !P->e->failed)
        fail(P->e, P->i > 0 ? P->ss->v[P->i - 1].line : 0, "missing {%% %s %%}", ends[last_of(ends)]);
    if (P->e->failed)
        return node_free(x), NULL;
    return x;
}

/* ---------------------------------------------------------------------------------------------- */
/* values */

static cJSON *undef(void)
{
    cJSON *u = cJSON_CreateNull();
    if (u)
        u->type = cJSON_Invalid;
    return u;
}

static int is_undef(const cJSON *v) { return !v || (v->type & 0xFF) == cJSON_Invalid; }

/* A copy of v, or undefined where there is none. */
static cJSON *copy_or_undef(const cJSON *v) { return v ? cJSON_Duplicate(v, 1) : undef(); }

static int truthy(const cJSON *v)
{
    if (is_undef(v) || cJSON_IsNull(v) || cJSON_IsFalse(v))
        return 0;
    if (cJSON_IsNumber(v))
        return v->valuedouble != 0;
    if (cJSON_IsString(v))
        return v->valuestring[0] != 0;
    if (cJSON_IsArray(v) || cJSON_IsObject(v))
        return v->child != NULL;
    return 1;
}

static int integral(double d) { return d == floor(d) && fabs(d) < 9.2e18; }


/* A number as Python prints it: integers without a point, others the shortest text that reads back. */
static void num_text(double d, char *buf, size_t cap)
{
    if (integral(d)) {
        snprintf(buf, cap, "%lld", (long long)d);
        return;
    }
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, d);
        if (strtod(buf, NULL) == d)
            break;
    }
}

/* JSON as Python's json.dumps writes it (", " and ": "; non-ASCII kept, as transformers' tojson does), or with
 * indent. */
static void json_text(sbuf *b, const cJSON *v, int indent, int depth)
{
    char num[40];
    if (cJSON_IsString(v)) {
        sb_str(b, "\"");
        for (const unsigned char *p = (const unsigned char *)v->valuestring; *p; p++) {
            const char *esc = *p == '"' ? "\\\"" : *p == '\\' ? "\\\\" : *p == '\n' ? "\\n" : *p == '\r' ? "\\r"
                              : *p == '\t' ? "\\t" : *p == '\b' ? "\\b" : *p == '\f' ? "\\f" : NULL;
            if (esc) {
                sb_str(b, esc);
            } else if (*p < 0x20) {
                snprintf(num, sizeof num, "\\u%04x", *p);
                sb_str(b, num);
            } else {
                sb_put(b, (const char *)p, 1);
            }
        }
        sb_str(b, "\"");
    } else if (cJSON_IsNumber(v)) {
        num_text(v->valuedouble, num, sizeof num);
        sb_str(b, num);
    } else if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        int obj = cJSON_IsObject(v), first = 1;
        sb_str(b, obj ? "{" : "[");
        for (const cJSON *c = v->child; c; c = c->next, first = 0) {
            if (!first)
                sb_str(b, indent > 0 ? "," : ", ");
            if (indent > 0) {
                sb_str(b, "\n");
                for (int i = 0; i < indent * (depth + 1); i++)
                    sb_str(b, " ");
            }
            if (obj) {
                cJSON key = {.type = cJSON_String, .valuestring = c->string};
                json_text(b, &key, 0, 0);
                sb_str(b, ": ");
            }
            json_text(b, c, indent, depth + 1);
        }
        if (indent > 0 && v->child) {
            sb_str(b, "\n");
            for (int i = 0; i < indent * depth; i++)
                sb_str(b, " ");
        }
        sb_str(b, obj ? "}" : "]");
    } else {
        sb_str(b, cJSON_IsTrue(v) ? "true" : cJSON_IsFalse(v) ? "false" : "null");
    }
}

/* A value as Jinja prints it (Python's str): strings as they are, None, True, False, lists and dicts as
 * Python writes them. */
static void str_text(sbuf *b, const cJSON *v, int nested)
{
    char num[40];
    if (is_undef(v))
        return;
    if (cJSON_IsString(v)) {
        if (!nested) {
            sb_str(b, v->valuestring);
            return;
        }
        sb_str(b, strchr(v->valuestring, '\'') && !strchr(v->valuestring, '"') ? "\"" : "'");
        sb_str(b, v->valuestring);
        sb_str(b, strchr(v->valuestring, '\'') && !strchr(v->valuestring, '"') ? "\"" : "'");
    } else if (cJSON_IsNumber(v)) {
        num_text(v->valuedouble, num, sizeof num);
        sb_str(b, num);
    } else if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        int obj = cJSON_IsObject(v);
        sb_str(b, obj ? "{" : "[");
        for (const cJSON *c = v->child; c; c = c->next) {
            if (c != v->child)
                sb_str(b, ", ");
            if (obj) {
                cJSON key = {.type = cJSON_String, .valuestring = c->string};
                str_text(b, &key, 1);
                sb_str(b, ": ");
            }
            str_text(b, c, 1);
        }
        sb_str(b, obj ? "}" : "]");
    } else {
        sb_str(b, cJSON_IsTrue(v) ? "True" : cJSON_IsFalse(v) ? "False" : "None");
    }
}

static char *to_str(const cJSON *v)
{
    sbuf b = {0};
    sb_str(&b, "");
    str_text(&b, v, 0);
    return sb_done(&b);
}


/* ---------------------------------------------------------------------------------------------- */
/* the renderer */

typedef struct render {
    jerr *e;
    cJSON *frame[64]; /* scopes, innermost last: the context, then each for loop's iteration's and macro's */
    int nframe;
    int base;         /* the innermost macro's frame: a macro sees the context and its own frames only */
    node *macro[32];
    int nmacro;
    sbuf out;
    int jump;         /* 1 break, 2 continue */
    int depth;
    long steps;       /* statements run and expressions evaluated: MAX_STEPS at most */
} render;

/* The innermost visible scope where name is bound, or NULL. */
static cJSON *scope_of(const render *r, const char *name)
{
    for (int i = r->nframe - 1; i >= 0; i = i > r->base || i == 0 ? i - 1 : 0)
        if (cJSON_GetObjectItemCaseSensitive(r->frame[i], name))
            return r->frame[i];
    return NULL;
}

static const cJSON *lookup(const render *r, const char *name)
{
    const cJSON *f = scope_of(r, name);
    return f ? cJSON_GetObjectItemCaseSensitive(f, name) : NULL;
}

/* Counts a step: 0, or -1 (failed) past MAX_STEPS. */
static int step(render *r, const node *x)
{
    if (++r->steps <= MAX_STEPS)
        return 0;
    fail(r->e, x->line, "the template runs past %d steps", MAX_STEPS);
    return -1;
}

/* Sets name in the innermost scope (takes v). */
static void bind(render *r, const char *name, cJSON *v)
{
    cJSON *f = r->frame[r->nframe - 1];
    if (!v)
        return;
    if (cJSON_GetObjectItemCaseSensitive(f, name))
        cJSON_ReplaceItemInObjectCaseSensitive(f, name, v);
    else
        cJSON_AddItemToObject(f, name, v);
}

static cJSON *eval(render *r, const node *x);
static int run(render *r, const node *body);

/* x's arguments evaluated: positional into pos, keywords into kw (both new arrays / objects; NULL when it
 * fails). */
static int eval_args(render *r, const node *x, cJSON **pos, cJSON **kw)
{
    *pos = cJSON_CreateArray();
    *kw = cJSON_CreateObject();
    for (int i = 0; i < x->n && !r->e->failed; i++) {
        cJSON *v = eval(r, x->v[i]);
        if (!v)
            break;
        if (x->k[i])
            cJSON_AddItemToObject(*kw, x->k[i], v);
        else
            cJSON_AddItemToArray(*pos, v);
    }
    if (!r->e->failed)
        return 0;
    cJSON_Delete(*pos);
    cJSON_Delete(*kw);
    *pos = *kw = NULL;
    return -1;
}

/* Argument i (positional) or name (keyword), borrowed; NULL when not given. */
static const cJSON *arg(const cJSON *pos, const cJSON *kw, int i, const char *name)
{
    const cJSON *v = name ? cJSON_GetObjectItemCaseSensitive(kw, name) : NULL;
    return v ? v : cJSON_GetArrayItem(pos, i);
}

static int cmp_values(const cJSON *a, const cJSON *b)
{
    if (cJSON_IsNumber(a) && cJSON_IsNumber(b))
        return (a->valuedouble > b->valuedouble) - (a->valuedouble < b->valuedouble);
    if (cJSON_IsString(a) && cJSON_IsString(b)) {
        int c = strcmp(a->valuestring, b->valuestring);
        return (c > 0) - (c < 0);
    }
    return 2; /* not ordered */
}

static int equal(const cJSON *a, const cJSON *b)
{
    if (is_undef(a) || is_undef(b))
        return is_undef(a) && is_undef(b);
    if (cJSON_IsBool(a) && cJSON_IsNumber(b))
        return (cJSON_IsTrue(a) ? 1 : 0) == b->valuedouble;
    if (cJSON_IsNumber(a) && cJSON_IsBool(b))
        return equal(b, a);
    return cJSON_Compare(a, b, 1);
}

static int contains(const cJSON *hay, const cJSON *needle)
{
    if (cJSON_IsString(hay))
        return cJSON_IsString(needle) && strstr(hay->valuestring, needle->valuestring) != NULL;
    if (cJSON_IsObject(hay))
        return cJSON_IsString(needle) && cJSON_GetObjectItemCaseSensitive(hay, needle->valuestring) != NULL;
    for (const cJSON *c = cJSON_IsArray(hay) ? hay->child : NULL; c; c = c->next)
        if (equal(c, needle))
            return 1;
    return 0;
}

/* Index i of a sequence of n, Python's way (negative from the end): -1 when outside. */
static int py_index(long i, int n)
{
    if (i < 0)
        i += n;
    return i >= 0 && i < n ? (int)i : -1;
}

/* d as an index or a count, clamped into the range of an int (NaN: 0). */
static long to_index(double d) { return d > 1e9 ? 1000000000L : d < -1e9 ? -1000000000L : d == d ? (long)d : 0; }

/* The byte offsets of s's characters (UTF-8 code points, as Python counts them): *n characters, the n+1st offset
 * the string's end. NULL: out of memory. */
static size_t *char_offsets(const char *s, long *n)
{
    size_t len = strlen(s), k = 0;
    size_t *off = malloc((len + 1) * sizeof *off);
    for (size_t i = 0; off && i < len; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80)
            off[k++] = i;
    if (off)
        off[k] = len;
    *n = (long)k;
    return off;
}

/* The number of characters of s. */
static long char_count(const char *s)
{
    long n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static cJSON *item(render *r, const node *x, const cJSON *o, const cJSON *k)
{
    if (cJSON_IsObject(o) && cJSON_IsString(k)) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k->valuestring);
        return v ? cJSON_Duplicate(v, 1) : undef();
    }
    if (cJSON_IsNumber(k) && (cJSON_IsArray(o) || cJSON_IsString(o))) {
        int n = cJSON_IsArray(o) ? cJSON_GetArraySize(o) : (int)char_count(o->valuestring);
        int i = py_index(to_index(k->valuedouble), n);
        if (i < 0)
            return undef();
        if (cJSON_IsArray(o))
            return cJSON_Duplicate(cJSON_GetArrayItem(o, i), 1);
        long m;
        size_t *off = char_offsets(o->valuestring, &m);
        cJSON *c = off ? str_value(strndup(o->valuestring + off[i], off[i + 1] - off[i])) : NULL;
        free(off);
        return c;
    }
    if (is_undef(o) || cJSON_IsObject(o))
        return undef();
    fail(r->e, x->line, "cannot index this value");
    return NULL;
}

/* o[a:b:c] of a list or a string. */
static cJSON *slice(render *r, const node *x, const cJSON *o, const cJSON *a, const cJSON *b, const cJSON *c)
{
    int str = cJSON_IsString(o);
    if (!str && !cJSON_IsArray(o))
        return fail(r->e, x->line, "cannot slice this value"), NULL;
    long n = str ? char_count(o->valuestring) : cJSON_GetArraySize(o);
    long step = cJSON_IsNumber(c) ? to_index(c->valuedouble) : 1;
    if (!step)
        return fail(r->e, x->line, "slice step 0"), NULL;
    long lo = step > 0 ? 0 : n - 1, hi = step > 0 ? n : -1;
    if (cJSON_IsNumber(a)) {
        lo = to_index(a->valuedouble);
        lo = lo < 0 ? lo + n : lo;
        lo = step > 0 ? (lo < 0 ? 0 : lo > n ? n : lo) : (lo < -1 ? -1 : lo > n - 1 ? n - 1 : lo);
    }
    if (cJSON_IsNumber(b)) {
        hi = to_index(b->valuedouble);
        hi = hi < 0 ? hi + n : hi;
        hi = step > 0 ? (hi < 0 ? 0 : hi > n ? n : hi) : (hi < -1 ? -1 : hi > n - 1 ? n - 1 : hi);
    }
    sbuf sb = {0};
    sb_str(&sb, "");
    long m;
    size_t *off = str ? char_offsets(o->valuestring, &m) : NULL;
    cJSON *out = str ? NULL : cJSON_CreateArray();
    if (str && !off)
        sb.oom = 1;
    for (long i = lo; !sb.oom && (step > 0 ? i < hi : i > hi); i += step) {
        if (str)
            sb_put(&sb, o->valuestring + off[i], off[i + 1] - off[i]);
        else
            cJSON_AddItemToArray(out, cJSON_Duplicate(cJSON_GetArrayItem(o, (int)i), 1));
    }
    free(off);
    if (!str)
        free(sb.s);
    return str ? str_value(sb_done(&sb)) : out;
}

static cJSON *arith(render *r, const node *x, const char *op, const cJSON *a, const cJSON *b)
{
    if (!strcmp(op, "~")) {
        char *s = to_str(a), *t = to_str(b);
        sbuf sb = {0};
        sb_str(&sb, s ? s : "");
        sb_str(&sb, t ? t : "");
        free(s);
        free(t);
        return str_value(sb_done(&sb));
    }
    if (!strcmp(op, "+") && cJSON_IsString(a) && cJSON_IsString(b)) {
        sbuf sb = {0};
        sb_str(&sb, a->valuestring);
        sb_str(&sb, b->valuestring);
        return str_value(sb_done(&sb));
    }
    if (!strcmp(op, "+") && cJSON_IsArray(a) && cJSON_IsArray(b)) {
        cJSON *o = cJSON_Duplicate(a, 1);
        for (const cJSON *c = b->child; c; c = c->next)
            cJSON_AddItemToArray(o, cJSON_Duplicate(c, 1));
        return o;
    }
    if (!strcmp(op, "*") && cJSON_IsString(a) && cJSON_IsNumber(b)) {
        if ((double)strlen(a->valuestring) * b->valuedouble >= MAX_OUT)
            return fail(r->e, x->line, "the output would pass %d MiB", MAX_OUT >> 20), NULL;
        sbuf sb = {0};
        sb_str(&sb, "");
        for (int i = 0; i < (int)b->valuedouble; i++)
            sb_str(&sb, a->valuestring);
        return str_value(sb_done(&sb));
    }
    if (!cJSON_IsNumber(a) || !cJSON_IsNumber(b))
        return fail(r->e, x->line, "'%s' of values that are not numbers", op), NULL;
    double p = a->valuedouble, q = b->valuedouble;
    if ((!strcmp(op, "/") || !strcmp(op, "//") || !strcmp(op, "%")) && q == 0)
        return fail(r->e, x->line, "division by zero"), NULL;
    double v = !strcmp(op, "+") ? p + q : !strcmp(op, "-") ? p - q : !strcmp(op, "*") ? p * q
               : !strcmp(op, "/") ? p / q : !strcmp(op, "//") ? floor(p / q) : !strcmp(op, "**") ? pow(p, q)
               : p - q * floor(p / q);
    return cJSON_CreateNumber(v);
}

static cJSON *binary(render *r, const node *x)
{
    cJSON *a = eval(r, x->a), *b = a ? eval(r, x->b) : NULL, *v = NULL;
    const char *op = x->s;
    if (a && b) {
        int c = cmp_values(a, b);
        if (!strcmp(op, "=="))
            v = cJSON_CreateBool(equal(a, b));
        else if (!strcmp(op, "!="))
            v = cJSON_CreateBool(!equal(a, b));
        else if (!strcmp(op, "in") || !strcmp(op, "not in"))
            v = cJSON_CreateBool(contains(b, a) == (op[0] == 'i'));
        else if (op[0] == '<' || op[0] == '>')
            v = c == 2 ? (fail(r->e, x->line, "'%s' of values that cannot be ordered", op), NULL)
                       : cJSON_CreateBool(!strcmp(op, "<") ? c < 0 : !strcmp(op, ">") ? c > 0 : !strcmp(op, "<=") ? c <= 0 : c >= 0);
        else
            v = arith(r, x, op, a, b);
    }
    cJSON_Delete(a);
    cJSON_Delete(b);
    return v;
}

/* ---------------------------------------------------------------------------------------------- */
/* filters, tests, methods, functions */

static cJSON *strip(const char *s, const char *chars, int left, int right)
{
    const char *set = chars ? chars : " \t\n\r\f\v";
    size_t a = 0, b = strlen(s);
    while (left && a < b && strchr(set, s[a]))
        a++;
    while (right && b > a && strchr(set, s[b - 1]))
        b--;
    return str_value(strndup(s + a, b - a));
}

static cJSON *replace(const char *s, const char *from, const char *to, long count)
{
    sbuf sb = {0};
    sb_str(&sb, "");
    size_t fl = strlen(from);
    for (const char *p = s; *p;) {
        const char *hit = fl && count != 0 ? strstr(p, from) : NULL;
        if (!hit) {
            sb_str(&sb, p);
            break;
        }
        sb_put(&sb, p, (size_t)(hit - p));
        sb_str(&sb, to);
        p = hit + fl;
        count--;
    }
    return str_value(sb_done(&sb));
}

/* upper (1), lower (0), title (2), capitalize (3) of ASCII letters */
static cJSON *recase(const char *s, int how)
{
    char *t = strdup(s);
    for (size_t i = 0; t && t[i]; i++) {
        int start = i == 0 || !isalpha((unsigned char)t[i - 1]);
        int up = how == 1 || (how == 2 && start) || (how == 3 && i == 0);
        t[i] = (char)(up ? toupper((unsigned char)t[i]) : tolower((unsigned char)t[i]));
    }
    return str_value(t);
}

static cJSON *split_str(const char *s, const char *sep, long maxsplit)
{
    cJSON *out = cJSON_CreateArray();
    const char *p = s;
    if (!sep) { /* runs of whitespace */
        while (*p) {
            while (isspace((unsigned char)*p))
                p++;
            if (!*p)
                break;
            const char *q = p;
            while (*q && !(isspace((unsigned char)*q) && maxsplit != 0))
                q++;
            maxsplit--;
            cJSON_AddItemToArray(out, str_value(strndup(p, (size_t)(q - p))));
            p = q;
        }
        return out;
    }
    size_t sl = strlen(sep);
    for (const char *hit; sl && maxsplit != 0 && (hit = strstr(p, sep)); maxsplit--) {
        cJSON_AddItemToArray(out, str_value(strndup(p, (size_t)(hit - p))));
        p = hit + sl;
    }
    cJSON_AddItemToArray(out, cJSON_CreateString(p));
    return out;
}

/* items(): [[key, value], ...] */
static cJSON *items(const cJSON *o)
{
    cJSON *out = cJSON_CreateArray();
    for (const cJSON *c = cJSON_IsObject(o) ? o->child : NULL; c; c = c->next) {
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, cJSON_CreateString(c->string));
        cJSON_AddItemToArray(pair, cJSON_Duplicate(c, 1));
        cJSON_AddItemToArray(out, pair);
    }
    return out;
}

static const char *sarg(const cJSON *pos, const cJSON *kw, int i, const char *name)
{
    const cJSON *v = arg(pos, kw, i, name);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static double narg(const cJSON *pos, const cJSON *kw, int i, const char *name, double def)
{
    const cJSON *v = arg(pos, kw, i, name);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

/* A method of a string or a dict: NULL with *found 0 when there is none of that name. */
static cJSON *method(render *r, const node *x, const cJSON *o, const char *m, const cJSON *pos, const cJSON *kw)
{
    if (cJSON_IsString(o)) {
        const char *s = o->valuestring, *a0 = sarg(pos, kw, 0, NULL);
        if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip"))
            return strip(s, a0, m[0] != 'r', m[0] != 'l');
        if (!strcmp(m, "upper") || !strcmp(m, "lower") || !strcmp(m, "title") || !strcmp(m, "capitalize"))
            return recase(s, m[0] == 'u' ? 1 : m[0] == 'l' ? 0 : m[0] == 't' ? 2 : 3);
        if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
            size_t n = a0 ? strlen(a0) : 0, sl = strlen(s);
            int hit = a0 && n <= sl && !strncmp(m[0] == 's' ? s : s + sl - n, a0, n);
            return cJSON_CreateBool(hit);
        }
        if (!strcmp(m, "split"))
            return split_str(s, a0, (long)narg(pos, kw, 1, "maxsplit", -1));
        if (!strcmp(m, "replace") && a0 && sarg(pos, kw, 1, NULL))
            return replace(s, a0, sarg(pos, kw, 1, NULL), (long)narg(pos, kw, 2, NULL, -1));
    }
    if (cJSON_IsObject(o)) {
        if (!strcmp(m, "items"))
            return items(o);
        if (!strcmp(m, "keys") || !strcmp(m, "values")) {
            cJSON *out = cJSON_CreateArray();
            for (const cJSON *c = o->child; c; c = c->next)
                cJSON_AddItemToArray(out, m[0] == 'k' ? cJSON_CreateString(c->string) : cJSON_Duplicate(c, 1));
            return out;
        }
        if (!strcmp(m, "get")) {
            const char *k = sarg(pos, kw, 0, NULL);
            const cJSON *v = k ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL, *d = arg(pos, kw, 1, NULL);
            return v ? cJSON_Duplicate(v, 1) : d ? cJSON_Duplicate(d, 1) : cJSON_CreateNull();
        }
    }
    fail(r->e, x->line, "unknown method '%s'", m);
    return NULL;
}

static int test(render *r, const node *x, const cJSON *v, const cJSON *pos)
{
    const char *t = x->s;
    const cJSON *a = cJSON_GetArrayItem(pos, 0);
    if (!strcmp(t, "defined"))
        return !is_undef(v);
    if (!strcmp(t, "undefined"))
        return is_undef(v);
    if (!strcmp(t, "none"))
        return cJSON_IsNull(v);
    if (!strcmp(t, "string"))
        return cJSON_IsString(v);
    if (!strcmp(t, "number"))
        return cJSON_IsNumber(v);
    if (!strcmp(t, "integer"))
        return cJSON_IsNumber(v) && integral(v->valuedouble);
    if (!strcmp(t, "float"))
        return cJSON_IsNumber(v) && !integral(v->valuedouble);
    if (!strcmp(t, "mapping"))
        return cJSON_IsObject(v);
    if (!strcmp(t, "sequence") || !strcmp(t, "iterable"))
        return cJSON_IsArray(v) || cJSON_IsString(v) || cJSON_IsObject(v);
    if (!strcmp(t, "boolean"))
        return cJSON_IsBool(v);
    if (!strcmp(t, "true") || !strcmp(t, "false"))
        return t[0] == 't' ? cJSON_IsTrue(v) : cJSON_IsFalse(v);
    if (!strcmp(t, "even") || !strcmp(t, "odd"))
        return cJSON_IsNumber(v) && ((long long)v->valuedouble % 2 != 0) == (t[0] == 'o');
    if (!strcmp(t, "equalto") || !strcmp(t, "eq") || !strcmp(t, "sameas"))
        return equal(v, a);
    if (!strcmp(t, "ne"))
        return !equal(v, a);
    if (!strcmp(t, "in"))
        return contains(a, v);
    fail(r->e, x->line, "unknown test '%s'", t);
    return -1;
}

/* join, map(attribute=), selectattr and rejectattr, sort: over a list. */
static cJSON *list_filter(render *r, const node *x, const cJSON *v, const cJSON *pos, const cJSON *kw)
{
    const char *f = x->s;
    if (!strcmp(f, "join")) {
        const char *sep = sarg(pos, kw, 0, "d");
        sbuf sb = {0};
        sb_str(&sb, "");
        for (const cJSON *c = v->child; c; c = c->next) {
            char *s = to_str(c);
            if (c != v->child && sep)
                sb_str(&sb, sep);
            sb_str(&sb, s ? s : "");
            free(s);
        }
        return str_value(sb_done(&sb));
    }
    const char *attr = sarg(pos, kw, 0, "attribute");
    cJSON *out = cJSON_CreateArray();
    if (!strcmp(f, "map") && attr) {
        for (const cJSON *c = v->child; c; c = c->next) {
            const cJSON *e = cJSON_GetObjectItemCaseSensitive(c, attr);
            cJSON_AddItemToArray(out, e ? cJSON_Duplicate(e, 1) : undef());
        }
        return out;
    }
    if (!strcmp(f, "selectattr") || !strcmp(f, "rejectattr")) {
        const char *tname = sarg(pos, kw, 1, NULL);
        node t = {.t = N_TEST, .line = x->line, .s = (char *)(tname ? tname : "")};
        cJSON *targs = cJSON_CreateArray();
        const cJSON *ta = cJSON_GetArrayItem(pos, 2);
        if (ta)
            cJSON_AddItemToArray(targs, cJSON_Duplicate(ta, 1));
        for (const cJSON *c = v->child; c && attr && !r->e->failed; c = c->next) {
            const cJSON *e = cJSON_GetObjectItemCaseSensitive(c, attr);
            int ok = tname ? test(r, &t, e, targs) : truthy(e);
            if (ok >= 0 && ok == (f[0] == 's'))
                cJSON_AddItemToArray(out, cJSON_Duplicate(c, 1));
        }
        cJSON_Delete(targs);
        return out;
    }
    if (!strcmp(f, "sort") || !strcmp(f, "reverse") || !strcmp(f, "unique")) {
        int n = cJSON_GetArraySize(v);
        const cJSON **e = calloc((size_t)(n ? n : 1), sizeof *e);
        int k = 0;
        for (const cJSON *c = v->child; e && c; c = c->next)
            e[k++] = c;
        for (int i = 1; e && f[0] == 's' && i < n; i++) /* (insertion sort: stable, and lists here are short) */
            for (int j = i; j > 0 && cmp_values(e[j - 1], e[j]) == 1; j--) {
                const cJSON *t = e[j];
                e[j] = e[j - 1];
                e[j - 1] = t;
            }
        for (int i = 0; e && i < n; i++) {
            const cJSON *c = e[f[0] == 'r' ? n - 1 - i : i];
            if (f[0] != 'u' || !contains(out, c))
                cJSON_AddItemToArray(out, cJSON_Duplicate(c, 1));
        }
        free(e);
        return out;
    }
    cJSON_Delete(out);
    fail(r->e, x->line, "unknown filter '%s'", f);
    return NULL;
}

static cJSON *indent_text(const char *s, int width, int first)
{
    sbuf sb = {0};
    sb_str(&sb, "");
    for (const char *p = s; *p;) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) + 1 : strlen(p);
        if ((p != s || first) && !(n == 1 && *p == '\n'))
            for (int i = 0; i < width; i++)
                sb_str(&sb, " ");
        sb_put(&sb, p, n);
        p += n;
    }
    return str_value(sb_done(&sb));
}

static cJSON *filter(render *r, const node *x, const cJSON *v, const cJSON *pos, const cJSON *kw);

/* A list filter of a value that is not a list: over its items (a string's characters, a dict's keys, nothing);
 * a string reversed stays a string. */
static cJSON *seq_filter(render *r, const node *x, const cJSON *v, const cJSON *pos, const cJSON *kw)
{
    node as_list = {.t = N_FILTER, .line = x->line, .s = "list"};
    cJSON *l = filter(r, &as_list, v, NULL, NULL), *out = l ? list_filter(r, x, l, pos, kw) : NULL;
    cJSON_Delete(l);
    if (out && cJSON_IsString(v) && !strcmp(x->s, "reverse")) {
        node join = {.t = N_FILTER, .line = x->line, .s = "join"};
        cJSON *s = list_filter(r, &join, out, NULL, NULL);
        cJSON_Delete(out);
        out = s;
    }
    return out;
}

static cJSON *filter(render *r, const node *x, const cJSON *v, const cJSON *pos, const cJSON *kw)
{
    const char *f = x->s;
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        const cJSON *d = arg(pos, kw, 0, "default_value");
        int use = is_undef(v) || (cJSON_IsTrue(arg(pos, kw, 1, "boolean")) && !truthy(v));
        return use && !d ? cJSON_CreateString("") : cJSON_Duplicate(use ? d : v, 1);
    }
    if (!strcmp(f, "length") || !strcmp(f, "count"))
        return cJSON_CreateNumber(cJSON_IsString(v) ? (double)char_count(v->valuestring) : cJSON_GetArraySize(v));
    if (!strcmp(f, "tojson")) {
        sbuf sb = {0};
        sb_str(&sb, "");
        json_text(&sb, v, (int)narg(pos, kw, 0, "indent", 0), 0);
        return str_value(sb_done(&sb));
    }
    if (!strcmp(f, "string") || !strcmp(f, "safe") || !strcmp(f, "e") || !strcmp(f, "escape"))
        return str_value(to_str(v)); /* (no autoescape, as transformers renders) */
    if (!strcmp(f, "int") || !strcmp(f, "float") || !strcmp(f, "abs")) {
        double d = cJSON_IsNumber(v) ? v->valuedouble : cJSON_IsString(v) ? strtod(v->valuestring, NULL) : 0;
        return cJSON_CreateNumber(f[0] == 'i' ? trunc(d) : f[0] == 'a' ? fabs(d) : d);
    }
    if (!strcmp(f, "items"))
        return items(v);
    if (!strcmp(f, "list")) {
        if (cJSON_IsArray(v))
            return cJSON_Duplicate(v, 1);
        cJSON *out = cJSON_CreateArray();
        const char *s = cJSON_IsString(v) ? v->valuestring : "";
        long n;
        size_t *off = char_offsets(s, &n);
        for (long i = 0; off && i < n; i++)
            cJSON_AddItemToArray(out, str_value(strndup(s + off[i], off[i + 1] - off[i])));
        free(off);
        for (const cJSON *c = cJSON_IsObject(v) ? v->child : NULL; c; c = c->next)
            cJSON_AddItemToArray(out, cJSON_CreateString(c->string));
        return out;
    }
    if (!strcmp(f, "first") || !strcmp(f, "last")) {
        int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 0;
        return n ? cJSON_Duplicate(cJSON_GetArrayItem(v, f[0] == 'f' ? 0 : n - 1), 1) : undef();
    }
    if (cJSON_IsArray(v))
        return list_filter(r, x, v, pos, kw);
    char *s = to_str(v);
    cJSON *out = NULL;
    if (!s)
        return fail(r->e, x->line, "out of memory"), NULL;
    if (!strcmp(f, "trim"))
        out = strip(s, NULL, 1, 1);
    else if (!strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "title") || !strcmp(f, "capitalize"))
        out = recase(s, f[0] == 'u' ? 1 : f[0] == 'l' ? 0 : f[0] == 't' ? 2 : 3);
    else if (!strcmp(f, "replace") && sarg(pos, kw, 0, NULL) && sarg(pos, kw, 1, NULL))
        out = replace(s, sarg(pos, kw, 0, NULL), sarg(pos, kw, 1, NULL), (long)narg(pos, kw, 2, "count", -1));
    else if (!strcmp(f, "indent"))
        out = indent_text(s, (int)narg(pos, kw, 0, "width", 4), cJSON_IsTrue(arg(pos, kw, 1, "first")));
    else if (!strcmp(f, "join") || !strcmp(f, "map") || !strcmp(f, "sort") || !strcmp(f, "reverse"))
        out = seq_filter(r, x, v, pos, kw);
    else
        fail(r->e, x->line, "unknown filter '%s'", f);
    free(s);
    return out;
}

static cJSON *range(render *r, const node *x, const cJSON *pos)
{
    int n = cJSON_GetArraySize(pos);
    double a = n > 1 ? narg(pos, NULL, 0, NULL, 0) : 0, b = narg(pos, NULL, n > 1 ? 1 : 0, NULL, 0);
    double step = n > 2 ? narg(pos, NULL, 2, NULL, 1) : 1;
    if (fabs(b - a) / (step ? fabs(step) : 1) > MAX_RANGE)
        return fail(r->e, x->line, "range of more than %d numbers", MAX_RANGE), NULL;
    cJSON *out = cJSON_CreateArray();
    for (double i = a; step > 0 ? i < b : i > b; i += step ? step : 1)
        cJSON_AddItemToArray(out, cJSON_CreateNumber(i));
    return out;
}

static cJSON *call_macro(render *r, const node *m, const cJSON *pos, const cJSON *kw)
{
    if (r->nframe >= 64 || r->depth > 50)
        return fail(r->e, m->line, "macros nested too deep"), NULL;
    cJSON *f = cJSON_CreateObject();
    int base = r->base;
    r->base = r->nframe;
    r->frame[r->nframe++] = f;
    for (int i = 0; i < m->n && !r->e->failed; i++) {
        const cJSON *given = arg(pos, kw, i, m->k[i]);
        bind(r, m->k[i], given ? cJSON_Duplicate(given, 1) : m->v[i] ? eval(r, m->v[i]) : undef());
    }
    sbuf saved = r->out;
    r->out = (sbuf){0};
    sb_str(&r->out, "");
    r->depth++;
    run(r, m->b);
    r->depth--;
    cJSON *v = r->out.oom ? NULL : cJSON_CreateString(r->out.s);
    free(r->out.s);
    r->out = saved;
    cJSON_Delete(r->frame[--r->nframe]);
    r->base = base;
    return v;
}

static cJSON *call(render *r, const node *x)
{
    cJSON *pos, *kw, *v = NULL;
    if (eval_args(r, x, &pos, &kw))
        return cJSON_Delete(pos), cJSON_Delete(kw), NULL;
    const node *f = x->a;
    if (f->t == N_ATTR) {
        cJSON *o = eval(r, f->a);
        v = o ? method(r, x, o, f->s, pos, kw) : NULL;
        cJSON_Delete(o);
    } else if (f->t == N_NAME && !strcmp(f->s, "raise_exception")) {
        const char *msg = sarg(pos, kw, 0, NULL);
        fail(r->e, 0, "raise_exception: %s", msg ? msg : "");
    } else if (f->t == N_NAME && !strcmp(f->s, "namespace")) {
        v = cJSON_Duplicate(kw, 1);
    } else if (f->t == N_NAME && !strcmp(f->s, "range")) {
        v = range(r, x, pos);
    } else if (f->t == N_NAME && !strcmp(f->s, "strftime_now")) {
        char buf[128] = "";
        time_t now = time(NULL);
        struct tm tm;
        const char *fmt = sarg(pos, kw, 0, NULL);
        strftime(buf, sizeof buf, fmt ? fmt : "", localtime_r(&now, &tm));
        v = cJSON_CreateString(buf);
    } else {
        for (int i = 0; f->t == N_NAME && i < r->nmacro && !v; i++)
            if (!strcmp(r->macro[i]->s, f->s))
                v = call_macro(r, r->macro[i], pos, kw);
        if (!v && !r->e->failed)
            fail(r->e, x->line, "unknown function '%s'", f->t == N_NAME ? f->s : "?");
    }
    cJSON_Delete(pos);
    cJSON_Delete(kw);
    return v;
}

/* ---------------------------------------------------------------------------------------------- */
/* evaluation */

static cJSON *eval_collection(render *r, const node *x)
{
    cJSON *out = x->t == N_LIST ? cJSON_CreateArray() : cJSON_CreateObject();
    for (int i = 0; i < x->n && !r->e->failed; i += x->t == N_LIST ? 1 : 2) {
        cJSON *v = eval(r, x->v[i]);
        if (!v)
            break;
        if (x->t == N_LIST) {
            cJSON_AddItemToArray(out, v);
            continue;
        }
        cJSON *val = eval(r, x->v[i + 1]);
        char *k = to_str(v);
        if (val && k)
            cJSON_AddItemToObject(out, k, val);
        else
            cJSON_Delete(val);
        free(k);
        cJSON_Delete(v);
    }
    return r->e->failed ? (cJSON_Delete(out), NULL) : out;
}

static cJSON *eval_node(render *r, const node *x)
{
    cJSON *a = NULL, *b = NULL, *c = NULL, *d = NULL, *v = NULL;
    switch (x->t) {
    case N_LIT:
        return cJSON_Duplicate(x->lit, 1);
    case N_NAME: {
        const cJSON *f = lookup(r, x->s);
        return f ? cJSON_Duplicate(f, 1) : undef();
    }
    case N_ATTR:
        if ((a = eval(r, x->a))) {
            const cJSON *f = cJSON_IsObject(a) ? cJSON_GetObjectItemCaseSensitive(a, x->s) : NULL;
            v = f ? cJSON_Duplicate(f, 1) : undef();
        }
        break;
    case N_ITEM:
        if ((a = eval(r, x->a)) && (b = eval(r, x->b)))
            v = item(r, x, a, b);
        break;
    case N_SLICE:
        a = eval(r, x->a);
        b = x->b ? eval(r, x->b) : NULL;
        c = x->c ? eval(r, x->c) : NULL;
        d = x->d ? eval(r, x->d) : NULL;
        if (a && !r->e->failed)
            v = slice(r, x, a, b, c, d);
        break;
    case N_CALL:
        return call(r, x);
    case N_FILTER:
    case N_TEST: {
        cJSON *pos, *kw;
        if ((a = eval(r, x->a)) && !eval_args(r, x, &pos, &kw)) {
            int t = x->t == N_TEST ? test(r, x, a, pos) : 0;
            v = x->t == N_FILTER ? filter(r, x, a, pos, kw) : t >= 0 ? cJSON_CreateBool(t != x->neg) : NULL;
        } else {
            pos = kw = NULL;
        }
        cJSON_Delete(pos);
        cJSON_Delete(kw);
        break;
    }
    case N_NOT:
        if ((a = eval(r, x->a)))
            v = cJSON_CreateBool(!truthy(a));
        break;
    case N_NEG:
        if ((a = eval(r, x->a)) && cJSON_IsNumber(a))
            v = cJSON_CreateNumber(-a->valuedouble);
        else if (a)
            fail(r->e, x->line, "'-' of a value that is not a number");
        break;
    case N_AND:
    case N_OR: /* Python's: the deciding operand itself */
        if ((a = eval(r, x->a)) && truthy(a) == (x->t == N_OR))
            return a;
        cJSON_Delete(a);
        return eval(r, x->b);
    case N_COND:
        if ((a = eval(r, x->b)))
            v = truthy(a) ? eval(r, x->a) : x->c ? eval(r, x->c) : undef();
        break;
    case N_BIN:
        return binary(r, x);
    case N_LIST:
    case N_DICT:
        return eval_collection(r, x);
    default:
        fail(r->e, x->line, "not an expression");
    }
    cJSON_Delete(a);
    cJSON_Delete(b);
    cJSON_Delete(c);
    cJSON_Delete(d);
    return r->e->failed ? (cJSON_Delete(v), NULL) : v;
}

/* x's value (the caller's), or NULL with the error said: a value that could not be made (out of memory, or past
 * MAX_OUT) is an error, never a value left out. */
static cJSON *eval(render *r, const node *x)
{
    if (step(r, x))
        return NULL;
    cJSON *v = eval_node(r, x);
    if (!v && !r->e->failed)
        fail(r->e, x->line, "out of memory, or a value past %d MiB", MAX_OUT >> 20);
    return v;
}

/* ---------------------------------------------------------------------------------------------- */
/* statements */

static void loop_vars(cJSON *loop, int i, int n, const cJSON *items)
{
    cJSON_AddNumberToObject(loop, "index", i + 1);
    cJSON_AddNumberToObject(loop, "index0", i);
    cJSON_AddNumberToObject(loop, "revindex", n - i);
    cJSON_AddNumberToObject(loop, "revindex0", n - i - 1);
    cJSON_AddBoolToObject(loop, "first", i == 0);
    cJSON_AddBoolToObject(loop, "last", i == n - 1);
    cJSON_AddNumberToObject(loop, "length", n);
    if (i > 0)
        cJSON_AddItemToObject(loop, "previtem", cJSON_Duplicate(cJSON_GetArrayItem(items, i - 1), 1));
    if (i < n - 1)
        cJSON_AddItemToObject(loop, "nextitem", cJSON_Duplicate(cJSON_GetArrayItem(items, i + 1), 1));
}

/* Binds the loop's targets to item (two targets: a pair). */
static void bind_targets(render *r, const node *x, const cJSON *it)
{
    if (!x->s2) {
        bind(r, x->s, cJSON_Duplicate(it, 1));
        return;
    }
    bind(r, x->s, copy_or_undef(cJSON_GetArrayItem(it, 0)));
    bind(r, x->s2, copy_or_undef(cJSON_GetArrayItem(it, 1)));
}

/* The items a for loop walks: a list, a dict's keys, a string's characters; those its filter keeps. */
static cJSON *loop_items(render *r, const node *x)
{
    cJSON *v = eval(r, x->a), *all = NULL;
    if (!v)
        return NULL;
    if (cJSON_IsArray(v)) {
        all = v;
    } else {
        node f = {.t = N_FILTER, .line = x->line, .s = "list"};
        all = cJSON_IsObject(v) || cJSON_IsString(v) || is_undef(v) ? filter(r, &f, v, NULL, NULL)
                                                                     : (fail(r->e, x->line, "for: cannot iterate this value"), NULL);
        cJSON_Delete(v);
    }
    if (!all || !x->d)
        return all;
    cJSON *kept = cJSON_CreateArray();
    r->frame[r->nframe++] = cJSON_CreateObject();
    for (const cJSON *c = all->child; c && !r->e->failed; c = c->next) {
        bind_targets(r, x, c);
        cJSON *ok = eval(r, x->d);
        if (truthy(ok))
            cJSON_AddItemToArray(kept, cJSON_Duplicate(c, 1));
        cJSON_Delete(ok);
    }
    cJSON_Delete(r->frame[--r->nframe]);
    cJSON_Delete(all);
    return kept;
}

static void run_for(render *r, const node *x)
{
    if (r->nframe >= 63)
        return fail(r->e, x->line, "loops nested too deep");
    cJSON *list = loop_items(r, x);
    if (!list)
        return;
    int n = cJSON_GetArraySize(list), i = 0;
    for (const cJSON *c = list->child; c && !r->e->failed; c = c->next, i++) {
        cJSON *f = cJSON_CreateObject(); /* each iteration's: what it sets is gone at the next, as in Jinja */
        loop_vars(cJSON_AddObjectToObject(f, "loop"), i, n, list);
        r->frame[r->nframe++] = f;
        bind_targets(r, x, c);
        run(r, x->b);
        cJSON_Delete(r->frame[--r->nframe]);
        int jump = r->jump;
        r->jump = 0;
        if (jump == 1)
            break;
    }
    if (!n && x->c)
        run(r, x->c);
    cJSON_Delete(list);
}

static void run_set(render *r, const node *x)
{
    cJSON *v;
    if (x->a) {
        v = eval(r, x->a);
    } else { /* a block's output */
        sbuf saved = r->out;
        r->out = (sbuf){0};
        sb_str(&r->out, "");
        run(r, x->b);
        v = r->out.oom ? NULL : cJSON_CreateString(r->out.s);
        free(r->out.s);
        r->out = saved;
    }
    if (!v)
        return;
    if (!x->s)
        return bind(r, x->s2, v);
    cJSON *f = scope_of(r, x->s2), *ns = f ? cJSON_GetObjectItemCaseSensitive(f, x->s2) : NULL;
    if (cJSON_IsObject(ns)) { /* ns.attr = v: the namespace where it lives */
        if (cJSON_GetObjectItemCaseSensitive(ns, x->s))
            cJSON_ReplaceItemInObjectCaseSensitive(ns, x->s, v);
        else
            cJSON_AddItemToObject(ns, x->s, v);
        return;
    }
    cJSON_Delete(v);
    fail(r->e, x->line, "set %s.%s: no namespace %s", x->s2, x->s, x->s2);
}

static int run(render *r, const node *body)
{
    for (int i = 0; body && i < body->n && !r->e->failed && !r->jump && !step(r, body->v[i]); i++) {
        const node *x = body->v[i];
        switch (x->t) {
        case N_TEXT:
            sb_str(&r->out, x->s);
            break;
        case N_OUT: {
            cJSON *v = eval(r, x->a);
            char *s = v ? to_str(v) : NULL;
            if (s)
                sb_str(&r->out, s);
            free(s);
            cJSON_Delete(v);
            break;
        }
        case N_IF: {
            const node *b = x;
            for (;;) {
                cJSON *c = eval(r, b->a);
                int t = truthy(c);
                cJSON_Delete(c);
                if (r->e->failed || t) {
                    run(r, b->b);
                    break;
                }
                if (!b->c || b->c->t != N_IF) { /* else (a body), or nothing */
                    run(r, b->c);
                    break;
                }
                b = b->c; /* elif */
            }
            break;
        }
        case N_FOR:
            run_for(r, x);
            break;
        case N_SET:
            run_set(r, x);
            break;
        case N_MACRO:
            if (r->nmacro < 32)
                r->macro[r->nmacro++] = (node *)x;
            else
                fail(r->e, x->line, "too many macros");
            break;
        case N_BREAK:
        case N_CONTINUE:
            r->jump = x->t == N_BREAK ? 1 : 2;
            break;
        default:
            fail(r->e, x->line, "not a statement");
        }
    }
    if (r->out.oom)
        fail(r->e, 0, "%s", r->out.oom == 2 ? "the output would pass 16 MiB" : "out of memory");
    return r->e->failed ? -1 : 0;
}

/* The source as Jinja reads it: newlines \n (\r\n and \r turned), the last one dropped (keep_trailing_newline
 * off). */
static char *normalized(const char *src)
{
    char *s = malloc(strlen(src) + 1), *q = s;
    for (const char *p = src; s && *p; p++) {
        *q++ = *p == '\r' ? '\n' : *p;
        if (p[0] == '\r' && p[1] == '\n')
            p++;
    }
    if (s && q > s && q[-1] == '\n')
        q--;
    if (s)
        *q = 0;
    return s;
}

sp_status sp_jinja_render(const char *src, const cJSON *ctx, char **out, sp_err *err)
{
    *out = NULL;
    jerr e = {0};
    segs ss = {0};
    node *tree = NULL;
    char *text = normalized(src);
    if (text && !split(text, &ss, &e)) {
        parser P = {.ss = &ss, .e = &e};
        tree = body(&P, NULL, NULL, 0);
    }
    render r = {.e = &e};
    if (tree) {
        r.frame[r.nframe++] = ctx ? cJSON_Duplicate(ctx, 1) : cJSON_CreateObject();
        sb_str(&r.out, "");
        run(&r, tree);
        cJSON_Delete(r.frame[0]);
    }
    for (int i = 0; i < ss.n; i++)
        free(ss.v[i].s);
    free(ss.v);
    free(text);
    node_free(tree);
    if (e.failed || !tree) {
        free(r.out.s);
        return sp_errf(err, SP_ERR_UNSUPPORTED, "%s", e.failed ? e.msg : "chat template: out of memory");
    }
    *out = r.out.s;
    return SP_OK;
}
