/* panel_gen.c - the generation (streamed text, tokens/s sparkline, time to first token, stop reason) and the
 * training (loss and validation plots with axes, learning rate, step rate, tokens/s, ETA, progress bar). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "panels.h"
#include "widgets.h"

void tui_draw_gen(tui_cb *cb, const tui_state *st, tui_view *v, int focused)
{
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
    /* figures: sparkline, tok/s, first token, stop */
    int y = cb->h - 1, x = 0;
    char t[160], a[32];
    int sw = cb->w >= 60 ? 12 : 6;
    if (st->spark_n > 1 && cb->w > sw + 20) {
        tui_spark(cb, y, 0, sw, st->spark, st->spark_n - (st->gen_active ? 1 : 0), R_PLOT);
        x = sw + 1;
    }
    int n = snprintf(t, sizeof t, "%.1f tok/s", st->gen_tps);
    if (st->gen_ttft > 0) {
        tui_fmt_secs(st->gen_ttft, a, sizeof a);
        n += snprintf(t + n, sizeof t - (size_t)n, "  first %s", a);
    }
    if (!st->gen_active && st->gen_stop[0])
        snprintf(t + n, sizeof t - (size_t)n, "  stop: %s", st->gen_stop);
    else if (st->gen_active)
        snprintf(t + n, sizeof t - (size_t)n, "  %d tokens", st->gen_tokens);
    tui_cb_text(cb, y, x, cb->w - x, t, R_TEXT, 0);
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

void tui_draw_train(tui_cb *cb, const tui_state *st, tui_view *v, int focused)
{
    char right[96] = "", t[200], a[32], b[32];
    const char *series = v->train_series ? (st->val_name[0] ? st->val_name : "validation") : "loss";
    int both = cb->w >= 70 && cb->h >= 8;
    if (st->train_runs)
        snprintf(right, sizeof right, "%s%s%s", both ? "loss | validation" : series, v->train_logy ? " (log)" : "",
                 st->train_active ? "" : st->train_end[0] ? "  ended" : "");
    tui_draw_title(cb, 4, "Train", focused, right);
    int rows = cb->h - 1;
    if (rows < 1)
        return;
    if (!st->train_runs) {
        tui_cb_text(cb, 1, 0, cb->w, "no training yet", R_DIM, 0);
        if (rows >= 2)
            tui_cb_text(cb, 2, 0, cb->w, ":train sst2 --max-steps 20", R_DIM, 0);
        return;
    }
    int info_rows = rows >= 6 ? 2 : rows >= 4 ? 1 : 0, ph = rows - info_rows;
    if (ph >= 2) {
        if (both) {
            int lw = cb->w * 3 / 5;
            plot_series(cb, 1, 0, ph, lw, st, v, 0);
            plot_series(cb, 1, lw + 1, ph, cb->w - lw - 1, st, v, 1);
        } else {
            plot_series(cb, 1, 0, ph, cb->w, st, v, v->train_series);
        }
    }
    if (!info_rows)
        return;
    int y = 1 + ph;
    tui_tick_label(st->lr, a, sizeof a);
    int n = snprintf(t, sizeof t, "step %d/%d  loss %.3g", st->step, st->total, st->loss);
    if (!isnan(st->val_last)) /* the validation metric early: narrow panels cut the end */
        n += snprintf(t + n, sizeof t - (size_t)n, "  %s %.3g",
                      !strcmp(st->val_name, "accuracy") ? "acc" : st->val_name, st->val_last);
    n += snprintf(t + n, sizeof t - (size_t)n, "  lr %s", a);
    if (st->step_rate > 0)
        n += snprintf(t + n, sizeof t - (size_t)n, "  %.3g st/s", st->step_rate);
    if (st->tokens_s > 0) {
        tui_fmt_count(st->tokens_s, b, sizeof b);
        snprintf(t + n, sizeof t - (size_t)n, "  %s tok/s", b);
    }
    tui_cb_text(cb, y, 0, cb->w, t, R_TEXT, 0);
    if (info_rows < 2)
        return;
    y++;
    double frac = st->total > 0 ? (double)st->step / st->total : 0;
    if (st->train_active) {
        tui_fmt_duration(st->eta_s, a, sizeof a);
        snprintf(t, sizeof t, " %3.0f%%  ETA %s", frac * 100, st->eta_s > 0 ? a : "?");
    } else {
        snprintf(t, sizeof t, " %3.0f%%  %.120s", frac * 100, st->train_end);
    }
    int tw = tui_strwidth(t), bw = cb->w - tw;
    if (bw > 30)
        bw = cb->w / 2;
    if (bw >= 5) {
        tui_progress(cb, y, 0, bw, frac, st->train_active ? R_BAR : R_GOOD);
        tui_cb_text(cb, y, bw, cb->w - bw, t, R_TEXT, 0);
    } else {
        tui_cb_text(cb, y, 0, cb->w, t, R_TEXT, 0);
    }
}
