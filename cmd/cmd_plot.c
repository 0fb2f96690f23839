/* cmd_plot.c - `plot FILE [FILE...]`: the training logs `train --log` wrote (JSON Lines: a step's loss, lr,
 * grad_norm, tokens_per_s; an epoch's validation metrics), one metric of each run as a curve over the steps, for
 * the front end to draw (SP_UI_PLOT: the line front end as text, sp_plot_text; the TUI in its training panel). */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "plot.h"

enum { PL_METRIC, PL_WIDTH, PL_HEIGHT, PL_NOPTS };
#define PLOT_MAX_RUNS 8
static const char MARKS[PLOT_MAX_RUNS + 1] = "*o+x#@%&";

/* ---------------------------------------------------------------------------------------------- */
/* the text plot */

typedef struct grid {
    char *cell;
    int w, h;
} grid;

static void legend(char *out, size_t cap, const sp_ui_plot *p, int r)
{
    const sp_ui_run *run = &p->runs[r];
    int best = 0, lower = strcmp(p->metric, "accuracy") != 0; /* the best: the lowest, or the highest accuracy */
    for (int i = 1; i < run->n; i++)
        if (lower ? run->y[i] < run->y[best] : run->y[i] > run->y[best])
            best = i;
    snprintf(out, cap, "  %c %s: %d point%s, %s %.4g -> %.4g (%s %.4g at step %.0f)\n", MARKS[r], run->name, run->n,
             run->n == 1 ? "" : "s", p->metric, run->y[0], run->y[run->n - 1], lower ? "min" : "max", run->y[best],
             run->x[best]);
}

char *sp_plot_text(const sp_ui_plot *p)
{
    double x0 = INFINITY, x1 = -INFINITY, lo = INFINITY, hi = -INFINITY;
    for (int r = 0; r < p->nruns; r++)
        for (int i = 0; i < p->runs[r].n; i++) {
            x0 = fmin(x0, p->runs[r].x[i]), x1 = fmax(x1, p->runs[r].x[i]);
            lo = fmin(lo, p->runs[r].y[i]), hi = fmax(hi, p->runs[r].y[i]);
        }
    if (!(hi > lo))
        lo -= 0.5, hi += 0.5;
    if (!(x1 > x0))
        x1 = x0 + 1;
    int gw = 10, pw = (p->width > 30 ? p->width : 30) - gw - 1, ph = p->height > 4 ? p->height : 4;
    grid g = {.cell = malloc((size_t)pw * (size_t)ph), .w = pw, .h = ph};
    size_t cap = (size_t)(ph + 4 + p->nruns) * (size_t)(pw + gw + 400) + 256;
    char *out = malloc(cap);
    if (!g.cell || !out)
        return free(g.cell), free(out), NULL;
    memset(g.cell, ' ', (size_t)pw * (size_t)ph);
    for (int r = 0; r < p->nruns; r++)
        for (int i = 0; i < p->runs[r].n; i++) {
            int cx = (int)lround((p->runs[r].x[i] - x0) / (x1 - x0) * (pw - 1));
            int cy = (int)lround((hi - p->runs[r].y[i]) / (hi - lo) * (ph - 1));
            g.cell[cy * pw + cx] = MARKS[r];
        }
    size_t k = (size_t)snprintf(out, cap, "%s of %d run%s\n", p->metric, p->nruns, p->nruns == 1 ? "" : "s");
    for (int row = 0; row < ph; row++) {
        char lab[32] = "";
        if (row == 0 || row == ph - 1 || row == ph / 2) /* the top, the middle and the bottom */
            snprintf(lab, sizeof lab, "%.4g", hi - (hi - lo) * row / (ph - 1));
        k += (size_t)snprintf(out + k, cap - k, "%*s %c%.*s\n", gw - 1, lab, lab[0] ? '+' : '|', pw,
                              g.cell + row * pw);
    }
    k += (size_t)snprintf(out + k, cap - k, "%*s +", gw - 1, "");
    for (int i = 0; i < pw; i++)
        out[k++] = '-';
    char a[32], b[32];
    snprintf(a, sizeof a, "%.0f", x0);
    snprintf(b, sizeof b, "%.0f", x1);
    k += (size_t)snprintf(out + k, cap - k, "\n%*s  %s%*s%*s\n", gw - 1, "", a, pw / 2 - (int)strlen(a) + 2, "step",
                          pw - pw / 2 - 2, b);
    for (int r = 0; r < p->nruns; r++) {
        char line[600];
        legend(line, sizeof line, p, r);
        k += (size_t)snprintf(out + k, cap - k, "%s", line);
    }
    free(g.cell);
    return out;
}

/* ---------------------------------------------------------------------------------------------- */
/* reading the logs */

typedef struct series {
    double *x, *y;
    int n, cap;
    char keys[256]; /* the metrics the file has, for the message when it lacks the one asked */
} series;

static int push(series *s, double x, double y)
{
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        double *nx = realloc(s->x, (size_t)cap * sizeof *nx);
        if (nx)
            s->x = nx;
        double *ny = nx ? realloc(s->y, (size_t)cap * sizeof *ny) : NULL;
        if (!ny)
            return -1;
        s->y = ny;
        s->cap = cap;
    }
    s->x[s->n] = x;
    s->y[s->n++] = y;
    return 0;
}

static void note_key(series *s, const char *key)
{
    char word[96];
    snprintf(word, sizeof word, " %.80s,", key);
    if (!strstr(s->keys, word) && strlen(s->keys) + strlen(word) < sizeof s->keys)
        strcat(s->keys, word);
}

/* A step's metric (loss, lr, grad_norm, tokens_per_s), not a validation's (accuracy, val_loss: "val_" before a
 * name the steps have too). */
static int step_metric(const char *m)
{
    return !strcmp(m, "loss") || !strcmp(m, "lr") || !strcmp(m, "grad_norm") || !strcmp(m, "tokens_per_s");
}

/* One line of a log: a step's metric, or a validation's, into s. 0, or -1 when the line is not a log's. */
static int take_line(const char *line, const char *metric, series *s)
{
    cJSON *o = cJSON_Parse(line);
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(o, "step");
    const cJSON *val = cJSON_GetObjectItemCaseSensitive(o, "validation");
    if (!cJSON_IsObject(o) || (!cJSON_IsNumber(step) && !cJSON_GetObjectItemCaseSensitive(o, "run")))
        return cJSON_Delete(o), -1;
    const cJSON *from = cJSON_IsObject(val) ? val : o, *v = NULL, *e;
    const cJSON *keys = cJSON_IsNumber(step) ? from : NULL; /* (not the run's line) */
    cJSON_ArrayForEach(e, keys)
    {
        char name[80];
        snprintf(name, sizeof name, "%s%s", val && step_metric(e->string) ? "val_" : "", e->string);
        if (cJSON_IsNumber(e) && strcmp(e->string, "step") && strcmp(e->string, "epoch") && strcmp(e->string, "t"))
            note_key(s, name);
    }
    if (val && !step_metric(metric)) /* "accuracy", "val_loss" */
        v = cJSON_GetObjectItemCaseSensitive(val, metric + (strncmp(metric, "val_", 4) ? 0 : 4));
    else if (!val && step_metric(metric))
        v = cJSON_GetObjectItemCaseSensitive(o, metric);
    int rc = 0;
    if (cJSON_IsNumber(step) && cJSON_IsNumber(v) && isfinite(v->valuedouble))
        rc = push(s, step->valuedouble, v->valuedouble);
    cJSON_Delete(o);
    return rc;
}

/* The run of path: its points of metric. 0, or 1 after a message. */
static int read_run(sp_app *app, const char *path, const char *metric, series *s)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return sp_app_error(app, "plot: %s: cannot read it", path);
    char *line = NULL;
    size_t cap = 0;
    int no = 0, rc = 0;
    while (!rc && getline(&line, &cap, f) > 0) {
        no++;
        if (line[strspn(line, " \t\r\n")] && take_line(line, metric, s))
            rc = sp_app_error(app, "plot: %s:%d: not a line of a training log (train --log FILE writes them)", path,
                              no);
    }
    free(line);
    fclose(f);
    if (!rc && !s->n) {
        size_t n = strlen(s->keys);
        if (n)
            s->keys[n - 1] = 0; /* the last comma */
        rc = sp_app_error(app, "plot: %s has no '%s' values (%s%s)", path, metric, n ? "it has:" : "it is empty",
                          s->keys);
    }
    return rc;
}

static int cmd_plot(sp_app *app, const sp_args *a)
{
    const char *metric = sp_arg(app, a, PL_METRIC);
    if (a->npos > PLOT_MAX_RUNS)
        return sp_app_error(app, "plot: at most %d files", PLOT_MAX_RUNS);
    series s[PLOT_MAX_RUNS] = {{0}};
    sp_ui_run runs[PLOT_MAX_RUNS];
    int rc = 0;
    for (int i = 0; i < a->npos && !rc; i++) {
        rc = read_run(app, a->pos[i], metric, &s[i]);
        const char *slash = strrchr(a->pos[i], '/');
        runs[i] = (sp_ui_run){.name = slash ? slash + 1 : a->pos[i], .n = s[i].n, .x = s[i].x, .y = s[i].y};
    }
    if (!rc) {
        sp_ui_plot p = {.metric = metric, .nruns = a->npos, .runs = runs,
                        .width = (int)sp_arg_int(app, a, PL_WIDTH), .height = (int)sp_arg_int(app, a, PL_HEIGHT)};
        sp_ui_event e = {.kind = SP_UI_PLOT, .plot = &p};
        sp_emit(app, &e);
    }
    for (int i = 0; i < a->npos; i++)
        free(s[i].x), free(s[i].y);
    return rc;
}

static const sp_opt plot_opts[] = {
    [PL_METRIC] = {"--metric", SP_OPT_STR, "NAME", .def = "loss",
                   .help = "a step's loss, lr, grad_norm, tokens_per_s; a validation's accuracy, val_loss ..."},
    [PL_WIDTH] = {"--width", SP_OPT_INT, "COLUMNS", 30, 1000, .def = "72", .help = "the text plot's width"},
    [PL_HEIGHT] = {"--height", SP_OPT_INT, "ROWS", 4, 200, .def = "16", .help = "the text plot's height"},
    [PL_NOPTS] = {0},
};

const sp_cmd sp_cmds_plot[] = {
    {.name = "plot", .args = "FILE [FILE...]", .min_pos = 1, .max_pos = PLOT_MAX_RUNS, .pos_paths = 1,
     SP_OPTS(plot_opts),
     .summary = "draw training runs' curves from their logs (train --log FILE), to compare them",
     .help = "Each FILE is a run's log as `train --log` writes it; the metric's values over the steps, one curve "
             "per run: in the REPL a text plot (a marker per run) with a legend of each run's first, last and best "
             "values; in the TUI in the training panel, until a training starts.",
     .examples = "plot run1.jsonl --metric loss", .fn = cmd_plot},
    {0},
};
