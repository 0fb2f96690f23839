/* panel_route.c - the chain the current request uses (each hop: server, blocks, its time per step: measured in
 * the last step, or routing's estimate with ~), and below it what happened to the route: retries, bans,
 * re-routes, newest first. While a retry waits, the title counts down to it. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "panels.h"
#include "timeutil.h"
#include "widgets.h"

static const tui_server *server_at(const tui_state *st, int idx)
{
    for (int i = 0; st->swarm && i < st->swarm->n; i++)
        if (st->swarm->s[i].idx == idx)
            return &st->swarm->s[i];
    return NULL;
}

/* Flows a piece of text at (*y, *x), moving to the next row when it does not fit. */
static void flow(tui_cb *cb, int *y, int *x, int ymax, const char *s, int role, int flags)
{
    int w = tui_strwidth(s);
    if (*x > 0 && *x + w > cb->w) {
        (*y)++;
        *x = 2;
    }
    if (*y >= ymax)
        return;
    *x += tui_cb_text(cb, *y, *x, cb->w - *x, s, role, flags);
}

void tui_draw_route(tui_cb *cb, const tui_state *st, tui_view *v, int focused)
{
    (void)v;
    const tui_glyphs *g = tui_cb_glyphs(cb);
    char right[96] = "";
    double wait = st->retry_at - sp_now_s();
    if (wait > 0) /* a retry waits: count down to it */
        snprintf(right, sizeof right, "retries %d  next try in %.0f s", st->retries, ceil(wait));
    else if (st->retries || st->reroutes)
        snprintf(right, sizeof right, "retries %d  re-routes %d", st->retries, st->reroutes);
    tui_draw_title(cb, 2, "Route", focused, right);
    if (cb->h < 2)
        return;
    int y = 1, x = 0, ymax = cb->h;
    if (!st->nhops) {
        tui_cb_text(cb, 1, 0, cb->w, st->route_seen ? "(no route)" : "no route yet (:route, or a :generate)", R_DIM, 0);
        y = 2;
    } else {
        char arrow[8], t[160];
        int k = tui_utf8_encode(g->arrow, arrow);
        arrow[k] = 0;
        flow(cb, &y, &x, ymax, "you", R_DIM, 0);
        for (int h = 0; h < st->nhops; h++) {
            const tui_hop *hp = &st->hops[h];
            const tui_server *s = server_at(st, hp->server);
            char lat[32];
            double m = st->measured[h];
            if (m > 0)
                tui_fmt_secs(m, lat, sizeof lat);
            else if (hp->latency > 0) {
                lat[0] = '~';
                tui_fmt_secs(hp->latency, lat + 1, sizeof lat - 1);
            } else {
                lat[0] = 0; /* a training route: no estimate per step */
            }
            snprintf(t, sizeof t, " %s ", arrow);
            flow(cb, &y, &x, ymax, t, R_DIM, 0);
            if (s && s->name[0])
                snprintf(t, sizeof t, "%.12s", s->name);
            else if (s)
                snprintf(t, sizeof t, "%.8s", s->id);
            else
                snprintf(t, sizeof t, "#%d", hp->server);
            flow(cb, &y, &x, ymax, t, s ? tui_server_role(s) : R_TEXT, TUI_BOLD);
            snprintf(t, sizeof t, "[%d:%d)%s%s", hp->start, hp->end, lat[0] ? " " : "", lat);
            flow(cb, &y, &x, ymax, t, R_TEXT, 0);
            if (s && s->busy) /* routing avoids it for new sessions; this chain may still hold it */
                flow(cb, &y, &x, ymax, " busy", R_WARN, TUI_BOLD);
        }
        if (st->route_cost > 0) {
            char t2[64];
            snprintf(t2, sizeof t2, "   %d hop%s, ~%.0f steps/s", st->nhops, st->nhops == 1 ? "" : "s",
                     1.0 / st->route_cost);
            flow(cb, &y, &x, ymax, t2, R_DIM, 0);
        }
        y++;
    }
    /* what happened, newest first; a note longer than a row goes on in the rows under it (indented) while there
     * is room, so a zoomed panel shows each whole: which server failed, why, its ban, the retry */
    int shown = st->nnotes < TUI_ROUTE_NOTES ? st->nnotes : TUI_ROUTE_NOTES;
    for (int i = 0; i < shown && y < cb->h; i++) {
        const tui_note *n = &st->notes[(st->nnotes - 1 - i) % TUI_ROUTE_NOTES];
        char t[280];
        int kw = snprintf(t, sizeof t, "%s", n->kind == 1 ? "re-routed: " : "retry: ");
        snprintf(t + kw, sizeof t - (size_t)kw, "%s", n->text);
        tui_line lines[16];
        int more = 0, nl = cb->w > 12 ? tui_text_wrap(t, strlen(t), cb->w - 2, lines, 16, &more) : 0;
        if (nl < 1 || more) { /* too narrow to wrap it whole: its first row */
            tui_cb_text(cb, y, 0, cb->w, t, n->kind == 1 ? R_WARN : R_ERR, TUI_BOLD);
            tui_cb_text(cb, y, kw, cb->w - kw, n->text, R_TEXT, 0);
            y++;
            continue;
        }
        for (int k = 0; k < nl && y < cb->h; k++, y++) {
            int cx = k ? 2 : 0;
            size_t off = lines[k].off, len = lines[k].len;
            if (!k) {
                int head = (int)(len < (size_t)kw ? len : (size_t)kw);
                cx += tui_cb_textn(cb, y, 0, cb->w, t, (size_t)head, n->kind == 1 ? R_WARN : R_ERR, TUI_BOLD);
                off += (size_t)head;
                len -= (size_t)head;
            }
            tui_cb_textn(cb, y, cx, cb->w - cx, t + off, len, R_TEXT, 0);
        }
    }
}
