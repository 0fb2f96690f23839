/* panel_gen.c - the generation (streamed text, tokens/s sparkline, time to first token, stop reason), or while
 * `serve` runs its requests (those in progress, tokens/s, served and failed, the last error), and the training
 * (loss and validation plots with axes, learning rate, step rate, tokens/s, ETA, progress bar). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "panels.h"
#include "timeutil.h"
#include "widgets.h"

/* serve's requests: where it serves; active, waiting, tok/s, served, failed; a line per request in progress; the
 * last error at the bottom. */
static void draw_serve(tui_cb *cb, const tui_state *st, int focused)
{
    char right[64], active[32], waiting[32], tps[32], tps_c[32], served[32], failed[32];
    snprintf(right, sizeof right, "serving: %d active", st->serve_active);
    tui_draw_title(cb, 3, "Generate", focused, right);
    int rows = cb->h - 1, y = 1;
    if (rows < 1)
        return;
    snprintf(active, sizeof active, "%d active", st->serve_active);
    snprintf(waiting, sizeof waiting, st->serve_waiting ? "%d waiting" : "", st->serve_waiting);
    snprintf(tps, sizeof tps, "%.1f tok/s", st->serve_tps);
    snprintf(tps_c, sizeof tps_c, "%.1ft/s", st->serve_tps);
    snprintf(served, sizeof served, "%ld served", st->serve_served);
    snprintf(failed, sizeof failed, "%ld failed", st->serve_failed);
    const tui_field f[] = {{active, NULL, 5}, {waiting, NULL, 3}, {tps, tps_c, 4}, {served, NULL, 2},
                           {failed, NULL, 3}};
    tui_fields(cb, y++, 0, cb->w, f, 5, st->serve_failed ? R_WARN : R_TEXT);
    if (y <= rows)
        tui_cb_text(cb, y++, 0, cb->w, st->serve_url, R_DIM, 0);
    int erows = !st->serve_error[0] || rows < 4 ? 0 : rows < 8 ? 1 : 2; /* the last error's, at the bottom */
    int last = rows - erows;                                            /* the requests' */
    for (const char *p = st->serve_reqs; p && *p && y <= last; y++) {
        size_t n = strcspn(p, "\n");
        char line[128];
        snprintf(line, sizeof line, "%.*s", (int)(n < sizeof line ? n : sizeof line - 1), p);
        tui_cb_text(cb, y, 0, cb->w, line, R_TEXT, 0);
        p += n + (p[n] == '\n');
    }
    char err[280];
    snprintf(err, sizeof err, "last error: %s", st->serve_error);
    size_t off = 0, len = strlen(err);
    for (int r = 0; r < erows && off < len; r++) { /* cut at the width: the second row goes on */
        tui_cb_text(cb, last + 1 + r, 0, cb->w, err + off, R_ERR, 0);
        off += (size_t)cb->w;
    }
}

void tui_draw_gen(tui_cb *cb, const tui_state *st, tui_view *v, int focused)
{
    if (st->serving == 1)
        return draw_serve(cb, st, focused);
    char right[96] = "";
    if (st->gen_active)
        snprintf(right, sizeof right, "generating");
    else if (st->gen_count)
        snprintf(right, sizeof right, "#%d", st->gen_count);
    tui_draw_title(cb, 3, "Generate", focused, right);
    int rows = cb->h - 1;
    if (rows < 1)
        return;
    if (!st->gen_count) {
        tui_cb_text(cb, 1, 0, cb->w, "nothing generated yet", R_DIM, 0);
        if (rows >= 2)
            tui_cb_text(cb, 2, 0, cb->w, ":generate \"Once upon a time\"", R_DIM, 0);
        return;
    }
    int text_rows = rows >= 3 ? rows - 1 : rows;
    if (v->gen_scroll < 0)
        v->gen_scroll = 0;
    int below = tui_text_draw(cb, 1, 0, text_rows, cb->w, st->gen ? st->gen : "", st->gen_len, st->gen_mark,
                              &v->gen_scroll, R_GEN_PROMPT, R_TEXT);
    if (below)
        tui_cb_text_right(cb, text_rows, cb->w, cb->w, " more below (End) ", R_DIM, TUI_REV);
    if (rows < 3)
        return;
    /* figures: tok/s, stop reason (or tokens so far), first token; the sparkline in what room is left */
    int y = cb->h - 1;
    char tps[32], tps_c[32], first[48], first_c[48], stop[48], text[160], a[32];
    snprintf(tps, sizeof tps, "%.1f tok/s", st->gen_tps);
    snprintf(tps_c, sizeof tps_c, "%.1ft/s", st->gen_tps);
    first[0] = first_c[0] = stop[0] = 0;
    if (st->gen_ttft > 0) {
        tui_fmt_secs(st->gen_ttft, a, sizeof a);
        snprintf(first, sizeof first, "first %s", a);
        snprintf(first_c, sizeof first_c, "1st %s", a);
    }
    if (!st->gen_active && st->gen_stop[0])
        snprintf(stop, sizeof stop, "stop: %.30s", st->gen_stop);
    else if (st->gen_active)
        snprintf(stop, sizeof stop, "%d tokens", st->gen_tokens);
    const tui_field f[] = {{tps, tps_c, 5}, {first, first_c, 3}, {stop, NULL, 4}};
    int tw = tui_fields_join(f, 3, cb->w, text, sizeof text);
    int sw = cb->w - tw - 1, x = 0;
    sw = sw > (cb->w >= 60 ? 12 : 6) ? (cb->w >= 60 ? 12 : 6) : sw;
    if (st->spark_n > 1 && sw >= 4) {
        tui_spark(cb, y, 0, sw, st->spark, st->spark_n - (st->gen_active ? 1 : 0), R_PLOT);
        x = sw + 1;
    }
    tui_cb_text(cb, y, x, cb->w - x, text, R_TEXT, 0);
}

static void plot_series(tui_cb *cb, int y, int x, int h, int w, const tui_state *st, tui_view *v, int which)
{
    const tui_series *s = which ? &st->val_s : &st->loss_s;
    tui_plot_opts o = {.xunit = which ? st->val_name : "step", .role = which ? R_PLOT2 : R_PLOT};
    if (!which && v->train_logy)
        o.logy = 1;
    if (which && !strcmp(st->val_name, "accuracy")) {
        o.fixed = 1;
        o.fixed_lo = 0;
        o.fixed_hi = 1;
    }
    if (!which)
        o.xunit = v->train_logy ? "step (log loss)" : "step";
    tui_plot(cb, y, x, h, w, s->x, s->y, s->n, &o, which ? &v->val_scale : &v->loss_scale);
}

/* The training's figures: the run's state (step, loss, validation metric, learning rate) and, on the progress
 * bar's row when there is one, the progress and rates; in one row all of them, the less important dropped first
 * when narrow. */
typedef struct train_figs {
    char step[32], step_c[32], loss[32], val[48], lr[48], pct[16], when[48], when_c[48], rate[32], rate_c[32],
        tok[48], tok_c[48];
} train_figs;

static void train_figures(const tui_state *st, train_figs *f)
{
    char a[32];
    memset(f, 0, sizeof *f);
    snprintf(f->step, sizeof f->step, "step %d/%d", st->step, st->total);
    snprintf(f->step_c, sizeof f->step_c, "%d/%d", st->step, st->total);
    snprintf(f->loss, sizeof f->loss, "loss %.3g", st->loss);
    if (!isnan(st->val_last))
        snprintf(f->val, sizeof f->val, "%s %.3g", !strcmp(st->val_name, "accuracy") ? "acc" : st->val_name,
                 st->val_last);
    tui_tick_label(st->lr, a, sizeof a);
    snprintf(f->lr, sizeof f->lr, "lr %s", a);
    double frac = st->total > 0 ? (double)st->step / st->total : 0;
    snprintf(f->pct, sizeof f->pct, "%.0f%%", frac * 100);
    if (st->train_active) {
        sp_fmt_duration(st->eta_s, a, sizeof a);
        snprintf(f->when, sizeof f->when, "ETA %s", st->eta_s > 0 ? a : "?");
    } else {
        snprintf(f->when, sizeof f->when, "%.40s", st->train_end);
        snprintf(f->when_c, sizeof f->when_c, "%.*s", (int)strcspn(st->train_end, " :("), st->train_end);
    }
    if (st->step_rate > 0) {
        snprintf(f->rate, sizeof f->rate, "%.3g st/s", st->step_rate);
        snprintf(f->rate_c, sizeof f->rate_c, "%.3gst/s", st->step_rate);
    }
    if (st->tokens_s > 0) {
        tui_fmt_count(st->tokens_s, a, sizeof a);
        snprintf(f->tok, sizeof f->tok, "%s tok/s", a);
        snprintf(f->tok_c, sizeof f->tok_c, "%st/s", a);
    }
}

/* `plot`'s runs: one curve each over the same axes, each in its colour, and a legend row naming them. */
static void draw_plot(tui_cb *cb, const tui_state *st, tui_view *v, int focused)
{
    static const int roles[TUI_PLOT_RUNS] = {R_PLOT, R_PLOT2, R_GOOD, R_WARN, R_ERR, R_JOINING, R_ONLINE, R_TEXT};
    char right[96];
    snprintf(right, sizeof right, "plot: %s, %d run%s", st->plot_metric, st->plot_n, st->plot_n == 1 ? "" : "s");
    tui_draw_title(cb, 4, "Train", focused, right);
    int rows = cb->h - 1;
    if (rows < 1)
        return;
    tui_plot_line lines[TUI_PLOT_RUNS];
    for (int i = 0; i < st->plot_n; i++)
        lines[i] = (tui_plot_line){.xs = st->plot_s[i].x, .ys = st->plot_s[i].y, .n = st->plot_s[i].n, .role = roles[i]};
    int legend = rows >= 4;
    tui_plot_opts o = {.xunit = "step", .role = R_PLOT};
    if (!strcmp(st->plot_metric, "accuracy"))
        o.fixed = 1, o.fixed_lo = 0, o.fixed_hi = 1;
    tui_plot_lines(cb, 1, 0, rows - legend, cb->w, lines, st->plot_n, &o, &v->loss_scale);
    const tui_glyphs *g = tui_cb_glyphs(cb);
    for (int i = 0, x = 0; legend && i < st->plot_n && x + (i ? 4 : 2) < cb->w; i++) { /* "─ a.jsonl  ─ b.jsonl" */
        x += i ? 2 : 0;
        tui_cb_put(cb, rows, x, g->h, roles[i], 0);
        x += 2;
        x += tui_cb_text(cb, rows, x, cb->w - x, st->plot_name[i], R_TEXT, 0);
    }
}

void tui_draw_train(tui_cb *cb, const tui_state *st, tui_view *v, int focused)
{
    if (st->plot_n)
        return draw_plot(cb, st, v, focused);
    char right[128] = "", text[256] = "";
    const char *vname = st->val_name[0] ? st->val_name : "validation";
    int rows = cb->h - 1;
    int info_rows = rows >= 6 ? 2 : rows >= 4 ? 1 : 0, ph = rows - info_rows;
    /* both plots: side by side when wide, one above the other when tall; else one, switched by [ and ] */
    int beside = cb->w >= 70 && cb->h >= 8, stacked = !beside && ph >= 12 && st->val_s.n > 0;
    if (st->steps_seen) { /* fitted to the title row (" 4 Train " and the rules take 15 columns) */
        char series[64], hint[64], hint_c[64];
        const char *logy = v->train_logy ? " (log)" : "";
        const char *other = v->train_series ? "loss" : vname;
        series[0] = hint[0] = hint_c[0] = 0;
        if (beside || stacked) {
            snprintf(series, sizeof series, "loss%s | %s", logy, vname);
        } else {
            snprintf(series, sizeof series, "%s%s", v->train_series ? vname : "loss", v->train_series ? "" : logy);
            if (st->val_s.n > 0 || v->train_series) { /* the other curve is a key away: say which */
                snprintf(hint, sizeof hint, "(]: %s)", other);
                snprintf(hint_c, sizeof hint_c, "(]: %s)", !strcmp(other, "accuracy") ? "acc" : other);
            }
        }
        const tui_field f[] = {{series, NULL, 5}, {hint, hint_c, 3},
                               {st->train_active || !st->train_end[0] ? "" : "ended", NULL, 4}};
        tui_fields_join(f, 3, cb->w - 15, right, sizeof right);
    }
    tui_draw_title(cb, 4, "Train", focused, right);
    if (rows < 1)
        return;
    if (!st->steps_seen) { /* nothing to plot or count until the first step (a run may be setting up) */
        char t[300];
        if (st->train_active)
            snprintf(t, sizeof t, "starting: %s", st->train_what);
        else if (st->train_runs)
            snprintf(t, sizeof t, "the last run ended before its first step: %s", st->train_end);
        else
            snprintf(t, sizeof t, ":train sst2 --max-steps 20");
        tui_cb_text(cb, 1, 0, cb->w, "no training yet", R_DIM, 0);
        if (rows >= 2)
            tui_cb_text(cb, 2, 0, cb->w, t, R_DIM, 0);
        return;
    }
    if (ph >= 2) {
        if (beside) {
            int lw = cb->w * 3 / 5;
            plot_series(cb, 1, 0, ph, lw, st, v, 0);
            plot_series(cb, 1, lw + 1, ph, cb->w - lw - 1, st, v, 1);
        } else if (stacked) {
            int top = ph / 2;
            plot_series(cb, 1, 0, top, cb->w, st, v, 0);
            plot_series(cb, 1 + top, 0, ph - top, cb->w, st, v, 1);
        } else {
            plot_series(cb, 1, 0, ph, cb->w, st, v, v->train_series);
        }
    }
    if (!info_rows)
        return;
    train_figs f;
    train_figures(st, &f);
    int y = 1 + ph;
    if (info_rows < 2) {
        const tui_field one[] = {{f.step, f.step_c, 5}, {f.loss, NULL, 5}, {f.val, NULL, 4}, {f.lr, NULL, 2},
                                 {f.rate, f.rate_c, 3}, {f.tok, f.tok_c, 1}};
        tui_fields(cb, y, 0, cb->w, one, 6, R_TEXT);
        return;
    }
    const tui_field run[] = {{f.step, f.step_c, 5}, {f.loss, NULL, 5}, {f.val, NULL, 4}, {f.lr, NULL, 2}};
    tui_fields(cb, y, 0, cb->w, run, 4, R_TEXT);
    y++;
    /* [██████    ] 50%  ETA 5s  4 st/s  1.2k tok/s: the bar takes what the figures leave, up to half the row */
    const tui_field prog[] = {{f.pct, NULL, 5}, {f.when, f.when_c, 4}, {f.rate, f.rate_c, 3}, {f.tok, f.tok_c, 2}};
    int minbar = 8, bw;
    int tw = cb->w > minbar + 1 ? tui_fields_join(prog, 4, cb->w - minbar - 1, text, sizeof text) : 0;
    bw = cb->w - tw - 1;
    int cap = cb->w / 2 > 30 ? cb->w / 2 : 30;
    bw = bw > cap ? cap : bw;
    double frac = st->total > 0 ? (double)st->step / st->total : 0;
    if (bw >= minbar) {
        tui_progress(cb, y, 0, bw, frac, st->train_active ? R_BAR : R_GOOD);
        tui_cb_text(cb, y, bw + 1, cb->w - bw - 1, text, R_TEXT, 0);
    } else {
        tui_fields(cb, y, 0, cb->w, prog, 4, R_TEXT);
    }
}
