/* cmdline.c - the `:` line editor, its history and completion. */
#include "cmdline.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cellbuf.h"
#include "keys.h"

#define HISTORY_MAX 1000

void tui_cmdline_init(tui_cmdline *c, tui_complete_fn complete, void *ctx)
{
    memset(c, 0, sizeof *c);
    c->complete = complete;
    c->complete_ctx = ctx;
}

void tui_cmdline_free(tui_cmdline *c)
{
    for (int i = 0; i < c->nhist; i++)
        free(c->hist[i]);
    free(c->hist);
    sp_strlist_free(&c->cands);
    memset(c, 0, sizeof *c);
}

void tui_cmdline_open(tui_cmdline *c)
{
    c->len = c->cur = 0;
    c->buf[0] = 0;
    c->hpos = c->nhist;
    c->cycling = 0;
    c->msg[0] = 0;
}

void tui_cmdline_add_history(tui_cmdline *c, const char *line)
{
    if (!line[strspn(line, " \t")] || (c->nhist && !strcmp(c->hist[c->nhist - 1], line)))
        return;
    if (c->nhist == HISTORY_MAX) {
        free(c->hist[0]);
        memmove(c->hist, c->hist + 1, (size_t)(c->nhist - 1) * sizeof *c->hist);
        c->nhist--;
    }
    if (c->nhist == c->caphist) {
        int cap = c->caphist ? c->caphist * 2 : 64;
        char **h = realloc(c->hist, (size_t)cap * sizeof *h);
        if (!h)
            return;
        c->hist = h;
        c->caphist = cap;
    }
    char *s = strdup(line);
    if (s)
        c->hist[c->nhist++] = s;
}

void tui_cmdline_load(tui_cmdline *c, const char *path)
{
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f)
        return;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) >= 0) {
        line[strcspn(line, "\r\n")] = 0;
        tui_cmdline_add_history(c, line);
    }
    free(line);
    fclose(f);
}

void tui_cmdline_save(const tui_cmdline *c, const char *path)
{
    FILE *f = path ? fopen(path, "w") : NULL;
    if (!f)
        return;
    for (int i = 0; i < c->nhist; i++)
        fprintf(f, "%s\n", c->hist[i]);
    fclose(f);
}

static void set_line(tui_cmdline *c, const char *s)
{
    snprintf(c->buf, sizeof c->buf, "%s", s);
    c->len = c->cur = strlen(c->buf);
}

static void insert(tui_cmdline *c, const char *s, size_t n)
{
    if (c->len + n >= sizeof c->buf)
        return;
    memmove(c->buf + c->cur + n, c->buf + c->cur, c->len - c->cur + 1);
    memcpy(c->buf + c->cur, s, n);
    c->len += n;
    c->cur += n;
}

static void erase(tui_cmdline *c, size_t from, size_t to)
{
    memmove(c->buf + from, c->buf + to, c->len - to + 1);
    c->len -= to - from;
    if (c->cur > to)
        c->cur -= to - from;
    else if (c->cur > from)
        c->cur = from;
}

/* The start of the UTF-8 character before / after byte i. */
static size_t prev_char(const tui_cmdline *c, size_t i)
{
    if (!i)
        return 0;
    do
        i--;
    while (i > 0 && ((unsigned char)c->buf[i] & 0xC0) == 0x80);
    return i;
}

static size_t next_char(const tui_cmdline *c, size_t i)
{
    if (i >= c->len)
        return c->len;
    do
        i++;
    while (i < c->len && ((unsigned char)c->buf[i] & 0xC0) == 0x80);
    return i;
}

/* The word before the cursor starts after an unescaped blank or a ';'. */
static size_t word_start(const tui_cmdline *c)
{
    size_t i = c->cur;
    while (i > 0 && c->buf[i - 1] != ';' && !(isspace((unsigned char)c->buf[i - 1]) && !(i >= 2 && c->buf[i - 2] == '\\')))
        i--;
    return i;
}

/* Replaces buf[from, cur) with s, escaping what the command splitter would take apart. */
static void replace_word(tui_cmdline *c, size_t from, const char *s, int space)
{
    erase(c, from, c->cur);
    c->cur = from;
    for (; *s; s++) {
        if (strchr(" \t\\'\";#", *s))
            insert(c, "\\", 1);
        insert(c, s, 1);
    }
    if (space)
        insert(c, " ", 1);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void complete(tui_cmdline *c)
{
    if (c->cycling && c->cands.n) { /* Tab again: the next candidate */
        c->cand_i = (c->cand_i + 1) % c->cands.n;
        replace_word(c, c->cand_start, c->cands.v[c->cand_i], 0);
        return;
    }
    sp_strlist_free(&c->cands);
    c->cands = (sp_strlist){0};
    size_t ws = word_start(c);
    int files = 0;
    if (c->complete)
        c->complete(c->complete_ctx, c->buf, c->cur, &c->cands, &ws, &files);
    sp_strlist *l = &c->cands;
    if (!l->n) {
        snprintf(c->msg, sizeof c->msg, "no completion");
        return;
    }
    qsort(l->v, (size_t)l->n, sizeof *l->v, cmp_str);
    size_t common = strlen(l->v[0]);
    for (int i = 1; i < l->n; i++)
        for (size_t j = 0; j < common; j++)
            if (l->v[i][j] != l->v[0][j]) {
                common = j;
                break;
            }
    size_t typed = c->cur - ws;
    if (l->n == 1) {
        size_t n = strlen(l->v[0]);
        replace_word(c, ws, l->v[0], !(files && n && l->v[0][n - 1] == '/'));
        c->msg[0] = 0;
        return;
    }
    if (common > typed) {
        char *pre = strndup(l->v[0], common);
        if (pre)
            replace_word(c, ws, pre, 0);
        free(pre);
    }
    size_t k = 0; /* the candidates, for the row beside the line */
    for (int i = 0; i < l->n && k + 2 < sizeof c->msg; i++) {
        const char *s = l->v[i], *slash = files ? strrchr(s, '/') : NULL;
        if (slash && slash[1])
            s = slash + 1;
        k += (size_t)snprintf(c->msg + k, sizeof c->msg - k, "%s%s", i ? "  " : "", s);
    }
    c->cycling = 1;
    c->cand_i = -1;
    c->cand_start = ws;
}

static void history_move(tui_cmdline *c, int d)
{
    int to = c->hpos + d;
    if (to < 0 || to > c->nhist)
        return;
    if (c->hpos == c->nhist) /* leaving the line being typed: keep it */
        snprintf(c->saved, sizeof c->saved, "%s", c->buf);
    c->hpos = to;
    set_line(c, to == c->nhist ? c->saved : c->hist[to]);
}

int tui_cmdline_key(tui_cmdline *c, int action, long ch)
{
    if (action != TUI_A_CMD_COMPLETE)
        c->cycling = 0;
    if (action != TUI_A_CMD_COMPLETE && action != TUI_A_NONE)
        c->msg[0] = 0;
    switch (action) {
    case TUI_A_CMD_RUN:
        tui_cmdline_add_history(c, c->buf);
        c->hpos = c->nhist;
        c->msg[0] = 0;
        return TUI_CL_RUN;
    case TUI_A_CMD_CANCEL:
        tui_cmdline_add_history(c, c->buf);
        c->msg[0] = 0;
        return TUI_CL_CANCEL;
    case TUI_A_CMD_COMPLETE: complete(c); break;
    case TUI_A_CMD_PREV: history_move(c, -1); break;
    case TUI_A_CMD_NEXT: history_move(c, 1); break;
    case TUI_A_CMD_LEFT: c->cur = prev_char(c, c->cur); break;
    case TUI_A_CMD_RIGHT: c->cur = next_char(c, c->cur); break;
    case TUI_A_CMD_BOL: c->cur = 0; break;
    case TUI_A_CMD_EOL: c->cur = c->len; break;
    case TUI_A_CMD_BS:
        if (!c->len && !c->cur)
            return TUI_CL_CANCEL; /* backspace on an empty line leaves it, as vim's does */
        erase(c, prev_char(c, c->cur), c->cur);
        break;
    case TUI_A_CMD_DEL: erase(c, c->cur, next_char(c, c->cur)); break;
    case TUI_A_CMD_KILL_BOL: erase(c, 0, c->cur); break;
    case TUI_A_CMD_KILL_EOL: erase(c, c->cur, c->len); break;
    case TUI_A_CMD_KILL_WORD: {
        size_t i = c->cur;
        while (i > 0 && isspace((unsigned char)c->buf[i - 1]))
            i--;
        while (i > 0 && !isspace((unsigned char)c->buf[i - 1]))
            i--;
        erase(c, i, c->cur);
        break;
    }
    default:
        if (ch < 0x20 || ch == 0x7F || ch > 0x10FFFF)
            return TUI_CL_NONE;
        {
            char b[4];
            int n = tui_utf8_encode((uint32_t)ch, b);
            insert(c, b, (size_t)n);
        }
        break;
    }
    return TUI_CL_CHANGED;
}
