/* panel_swarm.c - the swarm: coverage per block, then one row per server (state glyph, id, name, throughput,
 * inference / forward / network rps, precision, cache left, best ping to a successor, version, span bar). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "panels.h"
#include "table.h"
#include "widgets.h"

static const tui_col COLS[TUI_NCOLS] = {
    [TUI_COL_STATE] = {"", 1, 1, 0, 100},
    [TUI_COL_ID] = {"id", 6, 8, 0, 90},
    [TUI_COL_NAME] = {"name", 4, 12, 0, 40},
    [TUI_COL_TPUT] = {"tok/s", 5, 7, 1, 80},
    [TUI_COL_INF] = {"inf", 5, 6, 1, 30},
    [TUI_COL_FWD] = {"fwd", 5, 7, 1, 25},
    [TUI_COL_NET] = {"net", 5, 7, 1, 20},
    [TUI_COL_PREC] = {"prec", 4, 8, 0, 50},
    [TUI_COL_CACHE] = {"cache", 5, 6, 1, 60},
    [TUI_COL_PING] = {"ping", 6, 7, 1, 55},
    [TUI_COL_VERSION] = {"ver", 5, 8, 0, 10},
    [TUI_COL_SPAN] = {"blocks", 20, 0, 0, 95},
};

const char *tui_col_name(int col)
{
    static const char *const names[TUI_NCOLS] = {"state", "id", "name", "tok/s", "inf rps", "fwd rps", "net rps",
                                                 "precision", "cache", "ping", "version", "blocks"};
    return col >= 0 && col < TUI_NCOLS ? names[col] : "?";
}

static const tui_swarm *g_sort_swarm; /* qsort has no context argument; the UI thread alone sorts */
static int g_sort_col, g_sort_desc;

static double key_num(const tui_server *s, int col)
{
    switch (col) {
    case TUI_COL_STATE: return s->state;
    case TUI_COL_TPUT: return s->tput;
    case TUI_COL_INF: return s->inf_rps;
    case TUI_COL_FWD: return s->fwd_rps;
    case TUI_COL_NET: return s->net_rps;
    case TUI_COL_CACHE: return (double)s->cache;
    case TUI_COL_PING: return s->best_ping < 0 ? INFINITY : s->best_ping;
    case TUI_COL_SPAN: return s->start * 1e6 + s->end;
    default: return 0;
    }
}

static const char *key_str(const tui_server *s, int col)
{
    switch (col) {
    case TUI_COL_ID: return s->id;
    case TUI_COL_NAME: return s->name;
    case TUI_COL_PREC: return s->prec;
    case TUI_COL_VERSION: return s->version;
    default: return NULL;
    }
}

static int cmp_rows(const void *pa, const void *pb)
{
    int a = *(const int *)pa, b = *(const int *)pb;
    const tui_server *x = &g_sort_swarm->s[a], *y = &g_sort_swarm->s[b];
    int c = 0;
    const char *sx = key_str(x, g_sort_col);
    if (sx) {
        c = strcmp(sx, key_str(y, g_sort_col));
    } else {
        double u = key_num(x, g_sort_col), v = key_num(y, g_sort_col);
        c = u < v ? -1 : u > v ? 1 : 0;
    }
    if (g_sort_desc)
        c = -c;
    return c ? c : a - b; /* stable: the snapshot's order breaks ties */
}

int tui_swarm_order(const tui_swarm *s, int sort_col, int desc, int *order, int cap)
{
    int n = s ? (s->n < cap ? s->n : cap) : 0;
    for (int i = 0; i < n; i++)
        order[i] = i;
    if (n > 1) {
        g_sort_swarm = s;
        g_sort_col = sort_col;
        g_sort_desc = desc;
        qsort(order, (size_t)n, sizeof *order, cmp_rows);
    }
    return n;
}

/* A server's colour: its state's, a busy one's (online, but refusing new sessions) the warning colour. */
int tui_server_role(const tui_server *s)
{
    static const int roles[4] = {R_ONLINE, R_JOINING, R_UNREACH, R_OFFLINE};
    return s->busy && s->state == TUI_ST_ONLINE ? R_WARN : roles[s->state & 3];
}

/* The text of one cell of a server's row. */
static void cell_text(const tui_server *s, int col, char *buf, size_t cap)
{
    buf[0] = 0;
    switch (col) {
    case TUI_COL_ID: snprintf(buf, cap, "%.8s", s->id); break;
    case TUI_COL_NAME: snprintf(buf, cap, "%s", sp_server_shown_name(s->name, s->local)); break;
    case TUI_COL_TPUT: tui_fmt_count(s->tput, buf, cap); break;
    case TUI_COL_INF: tui_fmt_count(s->inf_rps, buf, cap); break;
    case TUI_COL_FWD: tui_fmt_count(s->fwd_rps, buf, cap); break;
    case TUI_COL_NET: tui_fmt_count(s->net_rps, buf, cap); break;
    case TUI_COL_PREC: snprintf(buf, cap, "%s", s->prec[0] ? s->prec : "-"); break;
    case TUI_COL_CACHE:
        if (s->cache < 0)
            snprintf(buf, cap, "-");
        else
            tui_fmt_count((double)s->cache, buf, cap);
        break;
    case TUI_COL_PING:
        if (s->state == TUI_ST_UNREACH && isinf(s->rtt))
            snprintf(buf, cap, "unreach");
        else if (s->banned)
            snprintf(buf, cap, "banned");
        else if (s->busy)
            snprintf(buf, cap, "busy");
        else
            tui_fmt_secs(s->npings ? s->best_ping : s->rtt, buf, cap);
        break;
    case TUI_COL_VERSION: snprintf(buf, cap, "%s", s->version[0] ? s->version : "-"); break;
    default: break;
    }
}

static void draw_row(tui_cb *cb, int y, const tui_server *s, const int *w, int nblocks, int selected)
{
    const tui_glyphs *g = tui_cb_glyphs(cb);
    int role = tui_server_role(s), dim = s->state == TUI_ST_OFFLINE;
    for (int c = 0; c < TUI_NCOLS; c++) {
        int x = sp_cols_x(w, TUI_NCOLS, c);
        if (x < 0)
            continue;
        if (c == TUI_COL_STATE) {
            tui_cb_put(cb, y, x, g->state[s->state & 3], role, TUI_BOLD);
        } else if (c == TUI_COL_SPAN) {
            char lab[24];
            snprintf(lab, sizeof lab, " %d:%d", s->start, s->end);
            int lw = (int)strlen(lab), bw = w[c] - lw;
            if (bw < 6) {
                bw = w[c];
                lw = 0;
            }
            tui_spanbar(cb, y, x, bw, s->start, s->end, nblocks, role);
            if (lw)
                tui_cb_text(cb, y, x + bw, lw, lab, R_DIM, 0);
        } else {
            char t[64];
            cell_text(s, c, t, sizeof t);
            int tw = tui_strwidth(t);
            int at = COLS[c].right && tw < w[c] ? x + w[c] - tw : x;
            int busy = c == TUI_COL_PING && s->busy && !s->banned;
            tui_cb_text(cb, y, at, w[c] - (at - x), t, dim ? R_DIM : busy ? R_WARN : R_TEXT, busy ? TUI_BOLD : 0);
        }
    }
    if (selected)
        tui_cb_paint(cb, y, 0, 1, cb->w, R_SEL, TUI_REV);
}

/* Servers per block among the servers that can take requests now. */
static void coverage(const tui_swarm *s, int *count, int nblocks)
{
    memset(count, 0, (size_t)nblocks * sizeof *count);
    for (int i = 0; s && i < s->n; i++) {
        const tui_server *v = &s->s[i];
        if (v->state != TUI_ST_ONLINE || v->banned)
            continue;
        for (int b = v->start < 0 ? 0 : v->start; b < v->end && b < nblocks; b++)
            count[b]++;
    }
}

static int nblocks_of(const tui_state *st)
{
    if (st->swarm && st->swarm->nblocks > 0)
        return st->swarm->nblocks;
    return st->nblocks;
}

void tui_draw_swarm(tui_cb *cb, const tui_state *st, tui_view *v, int focused)
{
    const tui_swarm *s = st->swarm;
    int n = s ? s->n : 0, L = nblocks_of(st), online = 0;
    for (int i = 0; i < n; i++)
        online += s->s[i].state == TUI_ST_ONLINE;
    char right[96];
    snprintf(right, sizeof right, "%d/%d online  sort %s", online, n, tui_col_name(v->sort_col));
    tui_draw_title(cb, 1, "Swarm", focused, right);
    if (cb->h < 2)
        return;
    /* coverage */
    int *count = L > 0 ? calloc((size_t)L, sizeof *count) : NULL;
    int missing = 0;
    if (count) {
        coverage(s, count, L);
        for (int b = 0; b < L; b++)
            missing += count[b] == 0;
    }
    int w[TUI_NCOLS];
    sp_cols_fit(COLS, TUI_NCOLS, cb->w, w);
    int sx = sp_cols_x(w, TUI_NCOLS, TUI_COL_SPAN);
    char lab[96];
    if (!L) {
        tui_cb_text(cb, 1, 0, cb->w, "no model loaded (:load DIR), no servers (:swarm up N or :connect)", R_DIM, 0);
    } else {
        snprintf(lab, sizeof lab, "%d blocks, servers per block", L);
        int bx = sx > 0 ? sx : 0, bw = sx > 0 ? w[TUI_COL_SPAN] : cb->w;
        tui_cb_text(cb, 1, 0, bx > 1 ? bx - 1 : 0, lab, R_DIM, 0);
        snprintf(lab, sizeof lab, " %s", missing ? "gap" : "ok");
        int lw = (int)strlen(lab);
        if (bw > lw + 6) {
            tui_coverage(cb, 1, bx, bw - lw, count, L);
            tui_cb_text(cb, 1, bx + bw - lw, lw, lab, missing ? R_ERR : R_GOOD, TUI_BOLD);
        }
    }
    free(count);
    if (cb->h < 3)
        return;
    tui_table_header(cb, 2, 0, COLS, TUI_NCOLS, w, v->sort_col, v->sort_desc);
    int rows = cb->h - 3;
    if (!n) {
        if (rows > 0 && L)
            tui_cb_text(cb, 3, 2, cb->w - 2, "(no servers yet)", R_DIM, 0);
        return;
    }
    int *order = malloc((size_t)n * sizeof *order);
    if (!order)
        return;
    tui_swarm_order(s, v->sort_col, v->sort_desc, order, n);
    if (v->swarm_sel >= n)
        v->swarm_sel = n - 1;
    if (v->swarm_sel < 0)
        v->swarm_sel = 0;
    v->swarm_top = tui_table_scroll(v->swarm_sel, v->swarm_top, rows, n);
    for (int r = 0; r < rows && v->swarm_top + r < n; r++)
        draw_row(cb, 3 + r, &s->s[order[v->swarm_top + r]], w, L, focused && v->swarm_top + r == v->swarm_sel);
    if (v->swarm_top + rows < n) { /* more below */
        snprintf(lab, sizeof lab, " %d more ", n - v->swarm_top - rows);
        tui_cb_text_right(cb, cb->h - 1, cb->w, cb->w, lab, R_DIM, TUI_REV);
    }
    free(order);
}
