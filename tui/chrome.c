/* chrome.c - what every panel shares and the rows around the panels: each panel's title row, the header,
 * command and status rows, boxes (help, confirm), the "terminal too small" notice, and number formats. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "panels.h"
#include "timeutil.h"
#include "version.h"
#include "widgets.h"

static const char *const PANEL_NAMES[TUI_NPANELS] = {"Swarm", "Route", "Generate", "Train", "Log"};

/* A tab of the header: "4 Train", or "4 T" when narrow. */
static void tab_label(int p, int cols, char *buf, size_t cap)
{
    snprintf(buf, cap, "%d %.*s", p + 1, cols < 60 ? 1 : 16, PANEL_NAMES[p]);
}

int tui_tab_at(int cols, int x)
{
    int at = 1; /* as the header's pieces go: from column 1, two blanks apart, while they fit */
    for (int p = 0; p < TUI_NPANELS; p++) {
        char t[32];
        tab_label(p, cols, t, sizeof t);
        int w = tui_strwidth(t);
        if (at + w + 2 > cols)
            return -1;
        if (at > 1)
            at += 2;
        if (x >= at && x < at + w)
            return p;
        at += w;
    }
    return -1;
}

void tui_view_init(tui_view *v)
{
    memset(v, 0, sizeof *v);
    v->zoom = -1;
    v->focus = TUI_P_SWARM;
    v->sort_col = TUI_COL_SPAN;
}

void tui_fmt_secs(double s, char *buf, size_t cap)
{
    if (!(s >= 0) || isinf(s))
        snprintf(buf, cap, "-");
    else if (s < 1e-3)
        snprintf(buf, cap, "%.0fus", s * 1e6);
    else if (s < 1)
        snprintf(buf, cap, "%.*fms", s < 0.01 ? 2 : 1, s * 1e3);
    else
        snprintf(buf, cap, "%.2fs", s);
}

void tui_fmt_count(double v, char *buf, size_t cap)
{
    if (!isfinite(v))
        snprintf(buf, cap, "-");
    else if (fabs(v) < 1000)
        snprintf(buf, cap, "%.0f", v);
    else if (fabs(v) < 1e6)
        snprintf(buf, cap, "%.*fk", fabs(v) < 1e4 ? 1 : 0, v / 1e3);
    else if (fabs(v) < 1e9)
        snprintf(buf, cap, "%.*fM", fabs(v) < 1e7 ? 1 : 0, v / 1e6);
    else
        snprintf(buf, cap, "%.1fG", v / 1e9);
}

void tui_draw_title(tui_cb *cb, int num, const char *name, int focused, const char *right)
{
    const tui_glyphs *g = tui_cb_glyphs(cb);
    if (cb->h < 1)
        return;
    tui_cb_fill(cb, 0, 0, 1, cb->w, g->h, R_BORDER, 0);
    char t[64];
    int role = focused ? R_TITLE_FOCUS : R_TITLE;
    int x = 0;
    if (focused)
        tui_cb_put(cb, 0, x, g->arrow, role, TUI_BOLD);
    x = 1;
    snprintf(t, sizeof t, " %d %s ", num, name);
    x += tui_cb_text(cb, 0, x, cb->w - x, t, role, focused ? TUI_BOLD | TUI_REV : TUI_BOLD);
    if (right && *right) {
        char r[160];
        snprintf(r, sizeof r, " %s ", right);
        int rw = tui_strwidth(r);
        if (x + 2 + rw < cb->w)
            tui_cb_text(cb, 0, cb->w - 1 - rw, rw, r, R_DIM, 0);
    }
}

/* Appends " | text" pieces while they fit. */
typedef struct row {
    tui_cb *cb;
    int x, y;
} row;

static void piece(row *r, const char *s, int role, int flags)
{
    int w = tui_strwidth(s);
    if (r->x + w + 2 > r->cb->w)
        return;
    if (r->x > 1)
        r->x += tui_cb_text(r->cb, r->y, r->x, 2, "  ", R_STATUS, 0);
    r->x += tui_cb_text(r->cb, r->y, r->x, w, s, role, flags);
}

void tui_draw_header(tui_cb *cb, const tui_state *st, const tui_view *v, int tabs)
{
    const tui_glyphs *g = tui_cb_glyphs(cb);
    tui_cb_fill(cb, 0, 0, 1, cb->w, ' ', R_STATUS, 0);
    row r = {cb, 1, 0};
    char t[160];
    if (tabs) { /* the panels as tabs: the one shown in reverse */
        for (int p = 0; p < TUI_NPANELS; p++) {
            tab_label(p, cb->w, t, sizeof t);
            int shown = v->zoom >= 0 ? p == v->zoom : p == v->focus;
            piece(&r, t, shown ? R_TITLE_FOCUS : R_STATUS, shown ? TUI_REV | TUI_BOLD : 0);
        }
        return;
    }
    piece(&r, "sepal " SEPAL_VERSION, R_TITLE, TUI_BOLD);
    if (st->model[0]) {
        snprintf(t, sizeof t, "%s  %d blocks", st->model, st->nblocks);
        piece(&r, t, R_STATUS, 0);
    } else {
        piece(&r, "no model", R_DIM, 0);
    }
    const tui_swarm *s = st->swarm;
    if (s && s->n) {
        int online = 0, L = s->nblocks > 0 ? s->nblocks : st->nblocks, covered = L > 0;
        for (int i = 0; i < s->n; i++)
            online += s->s[i].state == TUI_ST_ONLINE && !s->s[i].banned;
        for (int b = 0; b < L && covered; b++) { /* every block has an online server */
            int any = 0;
            for (int i = 0; i < s->n && !any; i++)
                any = s->s[i].state == TUI_ST_ONLINE && !s->s[i].banned && s->s[i].start <= b && b < s->s[i].end;
            covered = any;
        }
        snprintf(t, sizeof t, "%d server%s online", online, online == 1 ? "" : "s");
        piece(&r, t, R_STATUS, 0);
        char mark[8];
        int k = tui_utf8_encode(covered ? g->check : g->cross, mark);
        mark[k] = 0;
        snprintf(t, sizeof t, "%s %s", covered ? "covered" : "not covered", mark);
        piece(&r, t, covered ? R_GOOD : R_ERR, TUI_BOLD);
    }
    if (st->gen_count) {
        snprintf(t, sizeof t, "%.1f tok/s", st->gen_tps);
        piece(&r, t, R_STATUS, 0);
    }
    if (st->train_runs && st->total > 0) {
        snprintf(t, sizeof t, "train %.0f%%", 100.0 * st->step / st->total);
        piece(&r, t, R_STATUS, 0);
    }
}

/* "queued: CMD  (+N more; Ctrl-C clears)" from column 0, the command cut to leave the rest whole; returns the
 * columns used. */
static int queue_text(tui_cb *cb, const tui_state *st)
{
    char tail[64], head[32];
    snprintf(head, sizeof head, "queued: ");
    if (st->queued > 1)
        snprintf(tail, sizeof tail, "  (+%d more; Ctrl-C clears)", st->queued - 1);
    else
        snprintf(tail, sizeof tail, "  (Ctrl-C clears)");
    int room = cb->w - tui_strwidth(head) - tui_strwidth(tail);
    if (room < 8) { /* too narrow for the command */
        snprintf(tail, sizeof tail, "%d queued", st->queued);
        return tui_cb_text(cb, 0, 0, cb->w, tail, R_WARN, TUI_BOLD);
    }
    int x = tui_cb_text(cb, 0, 0, cb->w, head, R_WARN, TUI_BOLD);
    x += tui_cb_text(cb, 0, x, room, st->queue_first, R_TEXT, 0);
    return x + tui_cb_text(cb, 0, x, cb->w - x, tail, R_DIM, 0);
}

void tui_draw_cmdrow(tui_cb *cb, const tui_state *st)
{
    int x = st->queued > 0 ? queue_text(cb, st) + 2 : 0, any = x > 0;
    for (int i = 0; i < TUI_PROGRESS; i++) {
        const tui_bar *b = &st->bars[i];
        if (!b->active || x >= cb->w)
            continue;
        char t[200], eta[32] = "";
        double el = b->t - b->t0, rate = el > 0 ? (b->done - b->done0) / el : 0;
        if (rate > 0 && b->total > b->done) {
            char d[24];
            sp_fmt_duration((b->total - b->done) / rate, d, sizeof d);
            snprintf(eta, sizeof eta, " ETA %s", d);
        }
        if (b->total > 0)
            snprintf(t, sizeof t, " %.0f/%.0f%s%s%s", b->done, b->total, b->unit[0] ? " " : "", b->unit, eta);
        else
            snprintf(t, sizeof t, " %.0f%s%s", b->done, b->unit[0] ? " " : "", b->unit);
        x += tui_cb_text(cb, 0, x, cb->w - x, b->what, R_TEXT, TUI_BOLD) + 1;
        int bw = cb->w - x - tui_strwidth(t);
        bw = bw > 30 ? 30 : bw;
        if (bw >= 6 && b->total > 0) {
            tui_progress(cb, 0, x, bw, b->done / b->total, R_BAR);
            x += bw;
        }
        x += tui_cb_text(cb, 0, x, cb->w - x, t, R_DIM, 0) + 2;
        any = 1;
    }
    if (!any)
        tui_cb_text(cb, 0, 0, cb->w, st->cmd_running ? "" : ": runs a command (Tab completes), ? shows the keys",
                    R_DIM, 0);
}

static const char *focus_name(const tui_view *v) { return PANEL_NAMES[v->zoom >= 0 ? v->zoom : v->focus]; }

/* The quit question in `room` columns at x: the longest form of the choices that fits, then what runs. */
static void confirm_text(tui_cb *cb, int x, int room, const tui_state *st)
{
    static const char *const forms[] = {"y quits (the command is stopped first), n or Esc stays",
                                        "y quits, n or Esc stays", "y quits, n stays", "y/n"};
    const char *c = forms[3];
    for (int i = 0; i < 4; i++)
        if (tui_strwidth(forms[i]) <= room) {
            c = forms[i];
            break;
        }
    int k = tui_cb_text(cb, 0, x, room, c, R_WARN, TUI_BOLD);
    char t[300];
    snprintf(t, sizeof t, "  running: %s", st->cmd_line);
    if (st->cmd_running && room - k > 12)
        tui_cb_text(cb, 0, x + k, room - k, t, R_STATUS, 0);
}

/* What the status row says after the mode: the UI's own message, the command running, the last error, or how
 * the last command ended (named: "stopped by Ctrl-C: generate ..."). */
static int status_text(const tui_state *st, const tui_view *v, const tui_status_info *si, char *t, size_t cap)
{
    if (si->flash) {
        snprintf(t, cap, "%s", si->flash);
        return R_WARN;
    }
    if (st->cmd_running) {
        snprintf(t, cap, "running: %s  (Ctrl-C stops it)", st->cmd_line);
        return R_GOOD;
    }
    if (st->toast[0]) {
        snprintf(t, cap, "%s", st->toast);
        return st->toast_level == TUI_LOG_ERROR ? R_ERR : R_WARN;
    }
    if (si->ascii_note)
        snprintf(t, cap, "ASCII mode (the locale is not UTF-8)");
    else if (st->cmds_done)
        snprintf(t, cap, "%s: %s", st->cmd_cancelled ? "stopped by Ctrl-C" : st->cmd_rc ? "failed" : "done",
                 st->cmd_line);
    else
        snprintf(t, cap, "focus: %s", focus_name(v));
    return R_STATUS;
}

void tui_draw_status(tui_cb *cb, const tui_state *st, const tui_view *v, const tui_status_info *si)
{
    tui_cb_fill(cb, 0, 0, 1, cb->w, ' ', R_STATUS, 0);
    char t[300], right[96] = "";
    int x = 0;
    snprintf(t, sizeof t, " %s ", si->mode ? si->mode : "NORMAL");
    x += tui_cb_text(cb, 0, x, cb->w, t, R_STATUS, TUI_REV | TUI_BOLD);
    /* the right end: hints (and the frame counter in test mode); the quit question takes the whole row */
    size_t k = 0;
    if (v->paused && !si->confirm)
        k += (size_t)snprintf(right + k, sizeof right - k, "PAUSED  ");
    if (cb->w >= 70 && !si->confirm)
        k += (size_t)snprintf(right + k, sizeof right - k, "q quit  : cmd  ? help");
    if (si->frame >= 0)
        snprintf(right + k, sizeof right - k, "%sf=%ld", k ? "  " : "", si->frame);
    int rx = tui_strwidth(right) + 1 < cb->w - x ? cb->w - tui_strwidth(right) - 1 : cb->w;
    if (rx < cb->w)
        tui_cb_text(cb, 0, rx, cb->w - rx, right, R_DIM, 0);
    int room = rx - x - 2; /* a blank each side */
    x++;
    if (room <= 0)
        return;
    if (si->confirm) {
        confirm_text(cb, x, room, st);
        return;
    }
    int role = status_text(st, v, si, t, sizeof t);
    tui_cb_text(cb, 0, x, room, t, role, role == R_STATUS ? 0 : TUI_BOLD);
}

void tui_draw_too_small(tui_cb *cb, int rows, int cols)
{
    char size[64];
    snprintf(size, sizeof size, "%dx%d, needs %dx%d", cols, rows, TUI_MIN_COLS, TUI_MIN_ROWS);
    const char *lines[3] = {"terminal too small", size, "q quits, : runs a command"};
    int y = (cb->h - 3) / 2;
    for (int i = 0; i < 3; i++) {
        int w = tui_strwidth(lines[i]), x = w < cb->w ? (cb->w - w) / 2 : 0;
        tui_cb_text(cb, y + i, x, cb->w - x, lines[i], i ? R_DIM : R_WARN, i ? 0 : TUI_BOLD);
    }
}

tui_rect tui_draw_box(tui_cb *cb, const char *title, const char *const *lines, int n, int first, const char *footer)
{
    const tui_glyphs *g = tui_cb_glyphs(cb);
    int w = 0;
    for (int i = 0; i < n; i++)
        w = tui_strwidth(lines[i]) > w ? tui_strwidth(lines[i]) : w;
    w += 4;
    int fw = footer ? tui_strwidth(footer) + 4 : 0;
    w = w < fw ? fw : w;
    if (w > cb->w)
        w = cb->w;
    int h = n + 2 > cb->h ? cb->h : n + 2, y0 = (cb->h - h) / 2, x0 = (cb->w - w) / 2;
    tui_rect r = {.y = y0, .x = x0, .h = h, .w = w};
    if (w < 4 || h < 3)
        return (tui_rect){0};
    tui_cb_fill(cb, y0, x0, h, w, ' ', R_TEXT, 0);
    tui_cb_fill(cb, y0, x0 + 1, 1, w - 2, g->h, R_BORDER, 0);
    tui_cb_fill(cb, y0 + h - 1, x0 + 1, 1, w - 2, g->h, R_BORDER, 0);
    tui_cb_fill(cb, y0 + 1, x0, h - 2, 1, g->v, R_BORDER, 0);
    tui_cb_fill(cb, y0 + 1, x0 + w - 1, h - 2, 1, g->v, R_BORDER, 0);
    tui_cb_put(cb, y0, x0, g->tl, R_BORDER, 0);
    tui_cb_put(cb, y0, x0 + w - 1, g->tr, R_BORDER, 0);
    tui_cb_put(cb, y0 + h - 1, x0, g->bl, R_BORDER, 0);
    tui_cb_put(cb, y0 + h - 1, x0 + w - 1, g->br, R_BORDER, 0);
    char t[160];
    snprintf(t, sizeof t, " %s ", title);
    tui_cb_text(cb, y0, x0 + 2, w - 4, t, R_TITLE, TUI_BOLD);
    if (footer)
        tui_cb_text(cb, y0 + h - 1, x0 + 2, w - 4, footer, R_DIM, 0);
    for (int i = 0; i < h - 2 && first + i < n; i++)
        tui_cb_text(cb, y0 + 1 + i, x0 + 2, w - 4, lines[first + i], R_TEXT, 0);
    return r;
}

/* Wraps text to w columns into lines (at most cap, each at most 160 bytes); returns how many, or -1 when it
 * takes more. */
static int wrap_into(const char *text, int w, char (*lines)[160], int cap)
{
    tui_line l[8];
    int more = 0, n = w > 0 ? tui_text_wrap(text, strlen(text), w, l, cap < 8 ? cap : 8, &more) : 0;
    if (more || n < 1)
        return -1;
    for (int i = 0; i < n; i++)
        snprintf(lines[i], sizeof lines[i], "%.*s", (int)(l[i].len < 159 ? l[i].len : 159), text + l[i].off);
    return n;
}

tui_rect tui_draw_confirm(tui_cb *cb, const char *running)
{
    char q[400], lines[8][160];
    const char *ptr[8];
    int w = cb->w - 4 < 56 ? cb->w - 4 : 56, rows = cb->h - 2 < 8 ? cb->h - 2 : 8, n = -1;
    /* the longest question whose lines, a blank and the choices fit; then without the blank */
    snprintf(q, sizeof q, "`%.60s%s` is running. Quit anyway? It is stopped first.", running,
             strlen(running) > 60 ? "..." : "");
    const char *qs[] = {q, "A command is running. Quit anyway? It is stopped first.", "Quit? It is stopped first.",
                        "Quit?"};
    for (int blank = 1; blank >= 0 && n < 0; blank--)
        for (int i = 0; i < 4 && n < 0; i++) {
            int k = wrap_into(qs[i], w, lines, rows - 1 - blank);
            if (k > 0) {
                if (blank)
                    lines[k++][0] = 0;
                n = k;
            }
        }
    if (n < 0)
        n = 0;
    static const char *const choices[] = {"y quits, n or Esc stays", "y quits, n stays", "y/n"};
    const char *c = choices[2];
    for (int i = 0; i < 3; i++)
        if (tui_strwidth(choices[i]) <= w) {
            c = choices[i];
            break;
        }
    snprintf(lines[n++], sizeof lines[0], "%s", c);
    for (int i = 0; i < n; i++)
        ptr[i] = lines[i];
    return tui_draw_box(cb, "quit?", ptr, n, 0, NULL);
}
