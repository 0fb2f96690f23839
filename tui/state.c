/* state.c - the UI's model, updated by events. */
#include "state.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SERIES_MAX 65536
#define GEN_MAX (256u << 10) /* bytes of generated text kept (the end) */

int tui_state_init(tui_state *st)
{
    memset(st, 0, sizeof *st);
    st->log = calloc(TUI_LOG_LINES, sizeof *st->log);
    st->val_last = NAN;
    return st->log ? 0 : -1;
}

static void series_free(tui_series *s)
{
    free(s->x);
    free(s->y);
    memset(s, 0, sizeof *s);
}

void tui_state_free(tui_state *st)
{
    tui_swarm_free(st->swarm);
    free(st->gen);
    series_free(&st->loss_s);
    series_free(&st->val_s);
    for (int i = 0; st->log && i < TUI_LOG_LINES; i++)
        free(st->log[i].text);
    free(st->log);
    free(st->out_partial);
    free(st->serve_reqs);
    for (int i = 0; i < TUI_PLOT_RUNS; i++)
        series_free(&st->plot_s[i]);
    memset(st, 0, sizeof *st);
}

static void series_add(tui_series *s, double x, double y)
{
    if (s->n == SERIES_MAX) { /* keep the newer half */
        memmove(s->x, s->x + SERIES_MAX / 2, SERIES_MAX / 2 * sizeof *s->x);
        memmove(s->y, s->y + SERIES_MAX / 2, SERIES_MAX / 2 * sizeof *s->y);
        s->n = SERIES_MAX / 2;
    }
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 256;
        double *nx = realloc(s->x, (size_t)cap * sizeof *nx);
        if (!nx)
            return;
        s->x = nx;
        double *ny = realloc(s->y, (size_t)cap * sizeof *ny);
        if (!ny)
            return;
        s->y = ny;
        s->cap = cap;
    }
    s->x[s->n] = x;
    s->y[s->n] = y;
    s->n++;
}

const tui_logline *tui_state_log(const tui_state *st, int i)
{
    if (i < 0 || i >= st->log_n)
        return NULL;
    int first = st->log_n < TUI_LOG_LINES ? 0 : st->log_head;
    return &st->log[(first + i) % TUI_LOG_LINES];
}

static void log_line(tui_state *st, double t, int level, const char *text, size_t len)
{
    tui_logline *l = &st->log[st->log_head];
    free(l->text);
    l->text = strndup(text, len);
    l->t = t;
    l->level = level;
    st->log_head = (st->log_head + 1) % TUI_LOG_LINES;
    if (st->log_n < TUI_LOG_LINES)
        st->log_n++;
    st->log_total++;
}

/* Each line of text as a log line (a trailing newline ends the last). */
static void log_lines(tui_state *st, double t, int level, const char *text)
{
    const char *p = text ? text : "";
    do {
        size_t n = strcspn(p, "\n");
        if (n || p[n] || p == text)
            log_line(st, t, level, p, n);
        p += n + (p[n] == '\n');
    } while (*p);
}

static void set_toast(tui_state *st, double t, int level, const char *text)
{
    snprintf(st->toast, sizeof st->toast, "%.*s", (int)strcspn(text, "\n"), text);
    st->toast_level = level;
    st->toast_t = t;
}

/* Command output: whole lines go to the log; a partial line waits for its end. */
static void out_text(tui_state *st, double t, const char *text)
{
    size_t a = st->out_partial ? strlen(st->out_partial) : 0, b = strlen(text);
    char *all = malloc(a + b + 1);
    if (!all)
        return;
    memcpy(all, st->out_partial ? st->out_partial : "", a);
    memcpy(all + a, text, b + 1);
    free(st->out_partial);
    st->out_partial = NULL;
    char *p = all, *nl;
    while ((nl = strchr(p, '\n'))) {
        log_line(st, t, TUI_LOG_INFO, p, (size_t)(nl - p));
        p = nl + 1;
    }
    if (*p)
        st->out_partial = strdup(p);
    free(all);
}

static void flush_out(tui_state *st, double t)
{
    if (st->out_partial) {
        log_line(st, t, TUI_LOG_INFO, st->out_partial, strlen(st->out_partial));
        free(st->out_partial);
        st->out_partial = NULL;
    }
}

static void note(tui_state *st, double t, int kind, const char *text)
{
    tui_note *n = &st->notes[st->nnotes % TUI_ROUTE_NOTES];
    n->t = t;
    n->kind = kind;
    snprintf(n->text, sizeof n->text, "%s", text ? text : "");
    st->nnotes++;
}

static void gen_append(tui_state *st, const char *text)
{
    size_t n = strlen(text);
    if (st->gen_len + n + 1 > st->gen_cap) {
        size_t cap = st->gen_cap ? st->gen_cap : 4096;
        while (cap < st->gen_len + n + 1)
            cap *= 2;
        char *g = realloc(st->gen, cap);
        if (!g)
            return;
        st->gen = g;
        st->gen_cap = cap;
    }
    memcpy(st->gen + st->gen_len, text, n + 1);
    st->gen_len += n;
    if (st->gen_len > GEN_MAX) { /* keep the end, cut at a line or character start */
        size_t cut = st->gen_len - GEN_MAX / 2;
        while (cut < st->gen_len && ((unsigned char)st->gen[cut] & 0xC0) == 0x80)
            cut++;
        memmove(st->gen, st->gen + cut, st->gen_len - cut + 1);
        st->gen_len -= cut;
        st->gen_mark = st->gen_mark > cut ? st->gen_mark - cut : 0;
    }
}

static unsigned gen_event(tui_state *st, const tui_ev *e)
{
    switch (e->kind) {
    case TE_GEN_BEGIN:
        st->gen_len = 0;
        if (st->gen)
            st->gen[0] = 0;
        gen_append(st, e->text ? e->text : "");
        st->gen_mark = st->gen_len;
        st->gen_active = 1;
        st->gen_count++;
        st->gen_tokens = 0;
        st->gen_t0 = e->t;
        st->gen_first_t = st->gen_last_t = 0;
        st->gen_tps = 0;
        st->spark_n = 0;
        st->gen_stop[0] = 0;
        st->gen_ttft = 0;
        return TUI_D_PANEL(TUI_P_GEN) | TUI_D_HEADER;
    case TE_GEN_TEXT: {
        gen_append(st, e->text ? e->text : "");
        int k = e->n > 0 ? e->n : 1;
        if (!st->gen_tokens)
            st->gen_first_t = e->t;
        st->gen_tokens += k;
        st->gen_last_t = e->t;
        if (st->gen_tokens > 1 && st->gen_last_t > st->gen_first_t)
            st->gen_tps = (st->gen_tokens - 1) / (st->gen_last_t - st->gen_first_t);
        if (!st->gen_ttft && st->gen_first_t > 0)
            st->gen_ttft = st->gen_first_t - st->gen_t0;
        int b = (int)floor(e->t - st->gen_t0);
        if (b >= 0 && b < TUI_SPARK) {
            while (st->spark_n <= b)
                st->spark[st->spark_n++] = 0;
            st->spark[b] += k;
        }
        return TUI_D_PANEL(TUI_P_GEN) | TUI_D_HEADER;
    }
    default: /* TE_GEN_END */
        st->gen_active = 0;
        snprintf(st->gen_stop, sizeof st->gen_stop, "%s", e->what ? e->what : "");
        st->gen_new = e->n;
        st->gen_prompt = e->i;
        st->gen_prefill_s = e->a;
        st->gen_decode_s = e->b;
        if (e->c > 0)
            st->gen_ttft = e->c;
        if (e->b > 0 && e->n > 0)
            st->gen_tps = e->n / e->b;
        if (st->gen_len && st->gen[st->gen_len - 1] != '\n')
            gen_append(st, "\n");
        return TUI_D_PANEL(TUI_P_GEN) | TUI_D_HEADER;
    }
}

int tui_metric_pick(const char *metrics, char *name, size_t cap, double *value)
{
    const char *p = metrics, *first = NULL;
    if (!metrics)
        return -1;
    for (; p && *p; p += strcspn(p, " ,;"), p += strspn(p, " ,;")) {
        const char *eq = strchr(p, '=');
        size_t word = strcspn(p, " ,;");
        if (!eq || (size_t)(eq - p) >= word)
            continue;
        if (!first)
            first = p;
        if (!strncmp(p, "accuracy=", 9)) {
            first = p;
            break;
        }
    }
    if (!first)
        return -1;
    const char *eq = strchr(first, '=');
    char *end;
    double v = strtod(eq + 1, &end);
    if (end == eq + 1 || !isfinite(v))
        return -1;
    snprintf(name, cap, "%.*s", (int)(eq - first), first);
    *value = v;
    return 0;
}

static unsigned train_event(tui_state *st, const tui_ev *e)
{
    switch (e->kind) {
    case TE_TRAIN_BEGIN:
        snprintf(st->train_what, sizeof st->train_what, "%s", e->text ? e->text : "");
        st->train_end[0] = 0;
        st->train_active = 1;
        st->train_runs++;
        st->plot_n = 0; /* a training's own curves replace a plot's */
        st->loss_s.n = st->val_s.n = 0;
        st->epoch = st->step = st->total = st->steps_seen = 0;
        st->loss = st->lr = st->tokens_s = st->step_rate = st->eta_s = 0;
        st->val_last = NAN;
        st->val_name[0] = 0;
        st->last_step_t = e->t;
        break;
    case TE_TRAIN_STEP: {
        double dt = e->t - st->last_step_t;
        if (dt > 0 && st->steps_seen) /* the first step's time includes the setup */
            st->step_rate = st->step_rate > 0 ? 0.7 * st->step_rate + 0.3 / dt : 1 / dt;
        st->last_step_t = e->t;
        st->steps_seen++;
        st->epoch = e->epoch;
        st->step = e->step;
        st->total = e->total;
        st->loss = e->a;
        st->lr = e->b;
        st->tokens_s = e->c;
        st->eta_s = st->step_rate > 0 && e->total > e->step ? (e->total - e->step) / st->step_rate : 0;
        series_add(&st->loss_s, e->step, e->a);
        break;
    }
    case TE_TRAIN_EVAL: {
        double v;
        char name[32];
        if (!tui_metric_pick(e->text, name, sizeof name, &v)) {
            snprintf(st->val_name, sizeof st->val_name, "%s", name);
            st->val_last = v;
            series_add(&st->val_s, st->step, v);
        }
        break;
    }
    default: /* TE_TRAIN_END */
        snprintf(st->train_end, sizeof st->train_end, "%s", e->text ? e->text : "");
        st->train_active = 0;
        st->eta_s = 0;
        break;
    }
    return TUI_D_PANEL(TUI_P_TRAIN) | TUI_D_HEADER;
}

static unsigned progress_event(tui_state *st, const tui_ev *e)
{
    const char *what = e->what ? e->what : "";
    tui_bar *b = NULL, *free_b = NULL;
    for (int i = 0; i < TUI_PROGRESS; i++) {
        if (st->bars[i].active && !strcmp(st->bars[i].what, what))
            b = &st->bars[i];
        else if (!st->bars[i].active && !free_b)
            free_b = &st->bars[i];
    }
    if (e->kind == TE_PROGRESS_END || (e->kind == TE_PROGRESS && e->b > 0 && e->a >= e->b)) {
        if (b)
            b->active = 0;
        return TUI_D_CMD;
    }
    if (!b) {
        b = free_b ? free_b : &st->bars[0];
        memset(b, 0, sizeof *b);
        snprintf(b->what, sizeof b->what, "%s", what);
        b->active = 1;
        b->t0 = e->t;
        b->done0 = e->a;
    }
    snprintf(b->unit, sizeof b->unit, "%s", e->unit ? e->unit : "");
    b->done = e->a;
    b->total = e->b;
    b->t = e->t;
    return TUI_D_CMD;
}

static unsigned route_event(tui_state *st, const tui_ev *e)
{
    if (e->kind == TE_RETRY) {
        st->retries++;
        st->retry_at = e->b > 0 ? e->t + e->b : 0;
        note(st, e->t, 2, e->text);
        log_lines(st, e->t, TUI_LOG_WARN, e->text);
        return TUI_D_PANEL(TUI_P_ROUTE) | TUI_D_PANEL(TUI_P_LOG);
    }
    if (e->kind == TE_HOPS) {
        for (int h = 0; h < st->nhops; h++) {
            st->measured[h] = -1;
            for (int k = 0; k < e->nhops; k++)
                if (e->hops[k].server == st->hops[h].server && e->hops[k].start == st->hops[h].start)
                    st->measured[h] = e->hops[k].latency;
        }
        if (e->nhops && (e->nhops != st->nhops || st->measured[0] < 0)) { /* a route we were not told of */
            st->nhops = e->nhops < TUI_MAX_HOPS ? e->nhops : TUI_MAX_HOPS;
            for (int h = 0; h < st->nhops; h++) {
                st->hops[h] = e->hops[h];
                st->hops[h].latency = -1;
                st->measured[h] = e->hops[h].latency;
            }
        }
        return TUI_D_PANEL(TUI_P_ROUTE);
    }
    st->nhops = e->nhops < TUI_MAX_HOPS ? e->nhops : TUI_MAX_HOPS;
    for (int h = 0; h < st->nhops; h++) {
        st->hops[h] = e->hops[h];
        st->measured[h] = -1;
    }
    st->route_cost = e->a;
    st->route_seen++;
    st->retry_at = 0; /* routed: the wait is over */
    if (e->i) {
        st->reroutes++;
        note(st, e->t, 1, e->text);
        log_lines(st, e->t, TUI_LOG_NOTICE, "re-routed");
    }
    return TUI_D_PANEL(TUI_P_ROUTE) | TUI_D_PANEL(TUI_P_LOG);
}

static unsigned log_event(tui_state *st, const tui_ev *e)
{
    flush_out(st, e->t);
    log_lines(st, e->t, e->level, e->text);
    if (e->level >= TUI_LOG_WARN && e->level <= TUI_LOG_ERROR && e->text) {
        set_toast(st, e->t, e->level, e->text);
        return TUI_D_PANEL(TUI_P_LOG) | TUI_D_STATUS;
    }
    return TUI_D_PANEL(TUI_P_LOG);
}

static unsigned cmd_event(tui_state *st, const tui_ev *e)
{
    if (e->kind == TE_CMD_BEGIN) {
        flush_out(st, e->t);
        st->cmd_running = 1;
        snprintf(st->cmd_line, sizeof st->cmd_line, "%s", e->text ? e->text : "");
        st->cmd_t0 = e->t;
        st->toast[0] = 0;
        char line[280];
        snprintf(line, sizeof line, ":%s", st->cmd_line);
        log_lines(st, e->t, TUI_LOG_CMD, line);
    } else {
        flush_out(st, e->t);
        st->cmd_running = 0;
        st->retry_at = 0; /* the request is over, retried or not */
        st->cmd_rc = e->i;
        st->cmd_cancelled = e->n;
        st->cmds_done++;
    }
    return TUI_D_STATUS | TUI_D_CMD | TUI_D_PANEL(TUI_P_LOG);
}

/* plot's runs from the event's text ("# NAME", then "X Y" lines). */
static unsigned plot_event(tui_state *st, const tui_ev *e)
{
    st->plot_n = 0;
    snprintf(st->plot_metric, sizeof st->plot_metric, "%s", e->what ? e->what : "");
    for (const char *p = e->text; p && *p; p += strcspn(p, "\n"), p += *p == '\n') {
        double x, y;
        if (p[0] == '#' && st->plot_n < TUI_PLOT_RUNS) {
            int k = st->plot_n++;
            snprintf(st->plot_name[k], sizeof st->plot_name[k], "%.*s", (int)strcspn(p + 2, "\n"), p + 2);
            st->plot_s[k].n = 0;
        } else if (st->plot_n && sscanf(p, "%lf %lf", &x, &y) == 2) {
            series_add(&st->plot_s[st->plot_n - 1], x, y);
        }
    }
    return TUI_D_PANEL(TUI_P_TRAIN);
}

static unsigned serve_event(tui_state *st, const tui_ev *e)
{
    st->serving = e->epoch ? 2 : 1;
    st->serve_active = e->i;
    st->serve_waiting = e->n;
    st->serve_served = e->step;
    st->serve_failed = e->total;
    st->serve_tps = e->a;
    snprintf(st->serve_url, sizeof st->serve_url, "%s", e->what ? e->what : "");
    snprintf(st->serve_error, sizeof st->serve_error, "%s", e->unit ? e->unit : "");
    free(st->serve_reqs);
    st->serve_reqs = e->text ? strdup(e->text) : NULL;
    return TUI_D_PANEL(TUI_P_GEN);
}

unsigned tui_state_apply(tui_state *st, const tui_ev *e)
{
    switch (e->kind) {
    case TE_LOG: return log_event(st, e);
    case TE_OUT:
        out_text(st, e->t, e->text ? e->text : "");
        return TUI_D_PANEL(TUI_P_LOG);
    case TE_SWARM:
        tui_swarm_free(st->swarm);
        st->swarm = e->swarm ? tui_swarm_dup(e->swarm) : NULL;
        return TUI_D_PANEL(TUI_P_SWARM) | TUI_D_PANEL(TUI_P_ROUTE) | TUI_D_HEADER;
    case TE_APP:
        snprintf(st->model, sizeof st->model, "%s", e->text ? e->text : "");
        snprintf(st->arch, sizeof st->arch, "%s", e->what ? e->what : "");
        st->nblocks = e->n;
        st->hidden = (int)e->a;
        st->vocab = (int)e->b;
        return TUI_D_HEADER | TUI_D_PANEL(TUI_P_SWARM);
    case TE_ROUTE:
    case TE_HOPS:
    case TE_RETRY: return route_event(st, e);
    case TE_GEN_BEGIN:
    case TE_GEN_TEXT:
    case TE_GEN_END: return gen_event(st, e);
    case TE_TRAIN_BEGIN:
    case TE_TRAIN_STEP:
    case TE_TRAIN_EVAL:
    case TE_TRAIN_END: return train_event(st, e);
    case TE_PROGRESS:
    case TE_PROGRESS_END: return progress_event(st, e);
    case TE_CMD_BEGIN:
    case TE_CMD_END: return cmd_event(st, e);
    case TE_QUIT:
        st->quit = 1;
        return TUI_D_STATUS;
    case TE_READY: return TUI_D_CMD;
    case TE_SERVE: return serve_event(st, e);
    case TE_PLOT: return plot_event(st, e);
    case TE_NKINDS: break;
    }
    return 0;
}

unsigned tui_state_queue(tui_state *st, int n, const char *first)
{
    if (n == st->queued && !strcmp(first ? first : "", st->queue_first))
        return 0;
    st->queued = n;
    snprintf(st->queue_first, sizeof st->queue_first, "%s", first ? first : "");
    return TUI_D_CMD;
}

unsigned tui_state_dropped(tui_state *st, long n)
{
    if (n <= 0)
        return 0;
    st->log_dropped += n;
    return TUI_D_PANEL(TUI_P_LOG);
}
