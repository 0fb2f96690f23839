/* tui_feed.c - what feeds the UI thread: the app's sink (commands' output, the runtime's events), the command
 * worker, the feeder that turns the runtime's server table into snapshots, and the replay of a recording. None of
 * them calls curses; they post events (events.h) and never wait for the UI. */
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime.h"
#include "timeutil.h"
#include "tui_impl.h"

tui *tui_g; /* for the SIGINT handler */
/* The sink may be called from any thread until the TUI ends: it counts its callers, and the end waits for them. */
static int g_sink_closed, g_sink_callers;

/* ---------------------------------------------------------------------------------------------- */
/* posting events */

static void post(tui *t, tui_ev *e)
{
    if (!e)
        return;
    if (!e->t)
        e->t = sp_now_s();
    tui_queue_push(&t->q, e);
}

static tui_ev *ev_text(tui_ev_kind k, const char *text)
{
    tui_ev *e = tui_ev_new(k);
    if (e && text && !(e->text = strdup(text))) {
        tui_ev_free(e);
        return NULL;
    }
    return e;
}

void tui_post_log(tui *t, int level, const char *text)
{
    tui_ev *e = ev_text(TE_LOG, text);
    if (e)
        e->level = level;
    post(t, e);
}

static void kick_feeder(tui *t)
{
    pthread_mutex_lock(&t->flock);
    t->fkick = 1;
    pthread_cond_signal(&t->fcond);
    pthread_mutex_unlock(&t->flock);
}

static tui_ev *route_ev(tui_ev_kind k, const sp_route *r, const double *hop_s)
{
    tui_ev *e = tui_ev_new(k);
    if (!e)
        return NULL;
    int n = r ? (r->nhops < SP_RT_MAX_HOPS ? r->nhops : SP_RT_MAX_HOPS) : 0;
    if (n && !(e->hops = calloc((size_t)n, sizeof *e->hops))) {
        tui_ev_free(e);
        return NULL;
    }
    e->nhops = n;
    for (int h = 0; h < n; h++)
        e->hops[h] = (tui_hop){.server = r->hop[h].server, .start = r->hop[h].start, .end = r->hop[h].end,
                               .latency = hop_s ? hop_s[h] : r->hop[h].latency};
    e->a = r ? r->cost : 0;
    return e;
}

static void runtime_event(tui *t, const sp_event *r)
{
    tui_ev *e = NULL;
    switch (r->kind) {
    case SP_EV_PROGRESS:
        e = tui_ev_new(TE_PROGRESS);
        if (e) {
            e->what = strdup(r->text ? r->text : "");
            e->a = r->done;
            e->b = r->total;
        }
        break;
    case SP_EV_TOKEN: return;
    case SP_EV_STEP:
        post(t, route_ev(TE_HOPS, r->route, r->hop_s));
        return;
    case SP_EV_ROUTE:
        e = route_ev(TE_ROUTE, r->route, NULL);
        if (e) {
            e->i = r->row;
            e->text = r->text ? strdup(r->text) : NULL;
        }
        post(t, e);
        kick_feeder(t);
        return;
    case SP_EV_RETRY:
        e = ev_text(TE_RETRY, r->text);
        if (e) {
            e->i = r->row;
            e->b = r->total; /* the pause before the retry */
        }
        post(t, e);
        kick_feeder(t);
        return;
    case SP_EV_ERROR: tui_post_log(t, TUI_LOG_WARN, r->text); return;
    default: /* SP_EV_INFO, SP_EV_SERVER */
        tui_post_log(t, TUI_LOG_INFO, r->text);
        kick_feeder(t);
        return;
    }
    post(t, e);
}

static void gen_end(tui *t, const sp_ui_gen *g)
{
    tui_ev *e = tui_ev_new(TE_GEN_END);
    if (!e)
        return;
    e->n = g->new_tokens;
    e->i = g->prompt_tokens;
    e->a = g->prefill_s;
    e->b = g->decode_s;
    e->c = g->first_token_s;
    e->what = strdup(sp_gen_stop_name(g->stop));
    post(t, e);
    char line[300];
    int n = snprintf(line, sizeof line, "%d prompt token%s in %.3f s, %d new in %.3f s (%.1f tok/s)", g->prompt_tokens,
                     g->prompt_tokens == 1 ? "" : "s", g->prefill_s, g->new_tokens, g->decode_s,
                     g->decode_s > 0 ? g->new_tokens / g->decode_s : 0);
    if (g->first_token_s > 0 && n < (int)sizeof line)
        n += snprintf(line + n, sizeof line - (size_t)n, ", first after %.3f s", g->first_token_s);
    if (n < (int)sizeof line)
        n += snprintf(line + n, sizeof line - (size_t)n, "; stop: %s", sp_gen_stop_name(g->stop));
    if (g->sampled && n < (int)sizeof line)
        snprintf(line + n, sizeof line - (size_t)n, "; seed %llu", g->seed);
    tui_post_log(t, TUI_LOG_NOTICE, line);
}

static void train_event(tui *t, const sp_train_event *r)
{
    tui_ev *e;
    if (r->eval_total > 0) {
        e = tui_ev_new(TE_PROGRESS);
        if (e) {
            e->what = strdup("validation");
            e->unit = strdup("batches");
            e->a = r->eval_done;
            e->b = r->eval_total;
        }
    } else if (r->metrics) {
        e = ev_text(TE_TRAIN_EVAL, r->metrics);
        if (e)
            e->epoch = r->epoch;
        char line[600];
        snprintf(line, sizeof line, "epoch %d: validation %s", r->epoch, r->metrics);
        tui_post_log(t, TUI_LOG_INFO, line);
    } else {
        e = tui_ev_new(TE_TRAIN_STEP);
        if (e) {
            e->epoch = r->epoch;
            e->step = r->step;
            e->total = r->steps_total;
            e->a = r->loss;
            e->b = r->lr;
            e->c = r->tokens_per_s;
        }
    }
    post(t, e);
}

/* serve's view: the figures in the numbers, a line per request in progress ("#12 chat, streamed: 12 + 40
 * tokens in 1.2 s", "#13 completion: waiting 0.3 s"). */
static tui_ev *serve_event(const sp_ui_serve *v)
{
    tui_ev *e = tui_ev_new(TE_SERVE);
    if (!e)
        return NULL;
    e->i = v->active;
    e->n = v->waiting;
    e->step = (int)v->served;
    e->total = (int)v->failed;
    e->a = v->tokens_per_s;
    e->epoch = v->stopped;
    e->what = strdup(v->url ? v->url : "");
    e->unit = v->last_error ? strdup(v->last_error) : NULL;
    char lines[SP_UI_SERVE_ROWS * 96] = "";
    size_t k = 0;
    for (int i = 0; i < v->nreq && k < sizeof lines; i++) {
        const sp_ui_serve_req *r = &v->req[i];
        const char *kind = r->chat ? "chat" : "completion", *how = r->stream ? ", streamed" : "";
        int n = r->waiting ? snprintf(lines + k, sizeof lines - k, "%s#%ld %s%s: waiting %.1f s", k ? "\n" : "", r->id,
                                      kind, how, r->secs)
                           : snprintf(lines + k, sizeof lines - k, "%s#%ld %s%s: %d + %d tokens in %.1f s",
                                      k ? "\n" : "", r->id, kind, how, r->prompt_tokens, r->new_tokens, r->secs);
        k += n > 0 ? (size_t)n : 0;
    }
    e->text = strdup(lines);
    return e;
}

/* plot's runs as text: "# NAME" then an "X Y" line per point, each run after the other. */
static tui_ev *plot_event(const sp_ui_plot *p)
{
    tui_ev *e = tui_ev_new(TE_PLOT);
    char *s = NULL;
    size_t len = 0;
    FILE *f = e ? open_memstream(&s, &len) : NULL;
    if (!f) {
        tui_ev_free(e);
        return NULL;
    }
    for (int r = 0; r < p->nruns; r++) {
        fprintf(f, "# %s\n", p->runs[r].name);
        for (int i = 0; i < p->runs[r].n; i++)
            fprintf(f, "%.17g %.17g\n", p->runs[r].x[i], p->runs[r].y[i]);
    }
    fclose(f);
    e->text = s;
    e->what = strdup(p->metric);
    return e;
}

static char *with_where(const sp_ui_event *ev)
{
    char *s = NULL;
    if (ev->where && asprintf(&s, "%s: %s", ev->where, ev->text ? ev->text : "") >= 0)
        return s;
    return strdup(ev->text ? ev->text : "");
}

static void emit(tui *t, const sp_ui_event *ev)
{
    tui_ev *e = NULL;
    switch (ev->kind) {
    case SP_UI_TEXT: e = ev_text(TE_OUT, ev->text); break;
    case SP_UI_NOTICE: tui_post_log(t, TUI_LOG_NOTICE, ev->text); return;
    case SP_UI_WARN:
    case SP_UI_ERROR:
        e = tui_ev_new(TE_LOG);
        if (e) {
            e->level = ev->kind == SP_UI_ERROR ? TUI_LOG_ERROR : TUI_LOG_WARN;
            e->text = with_where(ev);
        }
        break;
    case SP_UI_PROGRESS:
        e = tui_ev_new(TE_PROGRESS);
        if (e) {
            e->what = strdup(ev->what ? ev->what : "");
            e->unit = ev->unit ? strdup(ev->unit) : NULL;
            e->a = ev->done;
            e->b = ev->total;
        }
        break;
    case SP_UI_PROGRESS_END:
        e = tui_ev_new(TE_PROGRESS_END);
        if (e)
            e->what = strdup(ev->what ? ev->what : "");
        break;
    case SP_UI_GEN_BEGIN: e = ev_text(TE_GEN_BEGIN, ev->text ? ev->text : ""); break;
    case SP_UI_GEN_TEXT:
        e = ev_text(TE_GEN_TEXT, ev->text);
        if (e)
            e->n = 1;
        break;
    case SP_UI_GEN_END: gen_end(t, ev->gen); return;
    case SP_UI_TRAIN: train_event(t, ev->train); return;
    case SP_UI_TRAIN_BEGIN:
        post(t, ev_text(TE_TRAIN_BEGIN, ev->text));
        tui_post_log(t, TUI_LOG_NOTICE, ev->text);
        return;
    case SP_UI_TRAIN_END:
        post(t, ev_text(TE_TRAIN_END, ev->text));
        return;
    case SP_UI_RUNTIME: runtime_event(t, ev->rt); return;
    case SP_UI_LINE:
        e = ev_text(TE_CMD_BEGIN, ev->text);
        if (e)
            e->n = 1;
        break;
    case SP_UI_SERVE: e = serve_event(ev->serve); break;
    case SP_UI_PLOT: e = plot_event(ev->plot); break;
    }
    post(t, e);
}

void tui_emit(void *user, const sp_ui_event *ev)
{
    __atomic_add_fetch(&g_sink_callers, 1, __ATOMIC_SEQ_CST);
    if (!__atomic_load_n(&g_sink_closed, __ATOMIC_SEQ_CST))
        emit(user, ev);
    __atomic_sub_fetch(&g_sink_callers, 1, __ATOMIC_SEQ_CST);
}

void tui_open_sink(void) { __atomic_store_n(&g_sink_closed, 0, __ATOMIC_SEQ_CST); }

void tui_close_sink(void)
{
    __atomic_store_n(&g_sink_closed, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&g_sink_callers, __ATOMIC_SEQ_CST))
        sched_yield();
}

/* ---------------------------------------------------------------------------------------------- */
/* the worker: commands, one at a time */

static void post_app(tui *t)
{
    sp_runtime *rt = __atomic_load_n(&t->app->rt, __ATOMIC_SEQ_CST);
    const sp_config *c = rt ? sp_runtime_config(rt) : NULL;
    if (!c)
        return;
    tui_ev *e = ev_text(TE_APP, sp_runtime_model_name(rt));
    if (!e)
        return;
    e->what = strdup(c->architecture);
    e->n = c->n_layers;
    e->a = c->hidden;
    e->b = c->vocab;
    post(t, e);
}

/* -f PATH: a script, but not stdin (the terminal is the TUI's). */
static int run_script(tui *t, const char *path)
{
    if (!strcmp(path, "-"))
        return sp_app_error(t->app, "-f -: stdin is the terminal here (use -f FILE)");
    return sp_cmd_run_script(t->app, path);
}

/* Drops the jobs queued (startup_only: the start-up scripts'), never the end marker of the start-up scripts;
 * returns how many, and lists them ("; " apart) into what. */
static int drop_queued_locked(tui *t, int startup_only, char *what, size_t cap)
{
    job **pp = &t->jobs;
    int n = 0;
    size_t k = 0;
    t->jtail = NULL;
    while (*pp) {
        job *j = *pp;
        if (j->kind != 2 && (j->startup || !startup_only)) {
            if (what && k < cap)
                k += (size_t)snprintf(what + k, cap - k, "%s%s%s", n ? "; " : "", j->kind ? "-f " : "", j->arg);
            *pp = j->next;
            free(j->arg);
            free(j);
            t->queued--;
            n++;
        } else {
            t->jtail = j;
            pp = &j->next;
        }
    }
    return n;
}

int tui_clear_queue(tui *t)
{
    char what[400] = "", line[480];
    pthread_mutex_lock(&t->jlock);
    int n = drop_queued_locked(t, 0, what, sizeof what);
    pthread_mutex_unlock(&t->jlock);
    if (n) {
        snprintf(line, sizeof line, "Ctrl-C cleared the queue: %d command%s not run: %s", n, n == 1 ? "" : "s", what);
        tui_post_log(t, TUI_LOG_WARN, line);
    }
    return n;
}

int tui_queue_peek(tui *t, char *first, size_t cap)
{
    int n = 0;
    first[0] = 0;
    pthread_mutex_lock(&t->jlock);
    for (const job *j = t->jobs; j; j = j->next)
        if (j->kind != 2 && !n++)
            snprintf(first, cap, "%s%s", j->kind ? "-f " : "", j->arg);
    pthread_mutex_unlock(&t->jlock);
    return n;
}

void *tui_worker_main(void *arg)
{
    tui *t = arg;
    tui_crt_block_signals(); /* the runtime's threads, started from here, inherit it */
    pthread_mutex_lock(&t->jlock);
    for (;;) {
        while (!t->jobs && !t->jstop)
            pthread_cond_wait(&t->jcond, &t->jlock);
        if (t->jstop)
            break;
        job *j = t->jobs;
        t->jobs = j->next;
        if (!t->jobs)
            t->jtail = NULL;
        t->queued--;
        pthread_mutex_unlock(&t->jlock);
        if (j->kind == 2) {
            post(t, tui_ev_new(TE_READY));
        } else {
            char *title = NULL;
            if (asprintf(&title, "%s%s", j->kind ? "-f " : "", j->arg) < 0)
                title = NULL;
            post(t, ev_text(TE_CMD_BEGIN, title ? title : j->arg));
            free(title);
            sp_app_cancel_clear(t->app);
            t->app->width = __atomic_load_n(&t->width, __ATOMIC_SEQ_CST);
            __atomic_store_n(&t->busy, 1, __ATOMIC_SEQ_CST);
            int rc = j->kind ? run_script(t, j->arg) : sp_cmd_run_line(t->app, j->arg);
            int cancelled = sp_app_cancelled(t->app);
            __atomic_store_n(&t->busy, 0, __ATOMIC_SEQ_CST);
            if (cancelled) { /* Ctrl-C: what was queued meanwhile does not run either */
                sp_app_cancel_clear(t->app);
                tui_clear_queue(t);
            } else if (rc && j->startup && !t->app->keep_going) { /* the other start-up scripts do not run */
                pthread_mutex_lock(&t->jlock);
                drop_queued_locked(t, 1, NULL, 0);
                pthread_mutex_unlock(&t->jlock);
            }
            post_app(t);
            tui_ev *e = tui_ev_new(TE_CMD_END);
            if (e) {
                e->i = rc;
                e->n = cancelled;
            }
            post(t, e);
            kick_feeder(t);
            if (t->app->quit)
                post(t, tui_ev_new(TE_QUIT));
        }
        free(j->arg);
        free(j);
        pthread_mutex_lock(&t->jlock);
    }
    pthread_mutex_unlock(&t->jlock);
    return NULL;
}

void tui_submit(tui *t, int kind, int startup, const char *arg)
{
    job *j = calloc(1, sizeof *j);
    if (!j || !(j->arg = strdup(arg ? arg : ""))) {
        free(j);
        return;
    }
    j->kind = kind;
    j->startup = startup;
    pthread_mutex_lock(&t->jlock);
    if (t->jtail)
        t->jtail->next = j;
    else
        t->jobs = j;
    t->jtail = j;
    t->queued++;
    pthread_cond_signal(&t->jcond);
    pthread_mutex_unlock(&t->jlock);
}

void tui_on_sigint(void)
{
    tui *t = tui_g;
    if (t && __atomic_load_n(&t->busy, __ATOMIC_SEQ_CST))
        sp_app_cancel(t->app);
}

/* ---------------------------------------------------------------------------------------------- */
/* the feeder: the server table as snapshots */

static void server_of(const sp_server_row *e, int idx, double now, tui_server *s)
{
    const sp_server_record *r = &e->rec;
    memset(s, 0, sizeof *s);
    s->idx = idx;
    snprintf(s->id, sizeof s->id, "%s", r->id);
    snprintf(s->name, sizeof s->name, "%s", r->name);
    snprintf(s->host, sizeof s->host, "%s", r->host);
    s->port = r->port;
    s->start = r->start;
    s->end = r->end;
    s->banned = e->banned_until > now;
    s->busy = e->busy_until > now || sp_record_saturated(r);
    s->local = e->pid > 0;
    if (e->gone || r->state == SP_SERVER_OFFLINE)
        s->state = TUI_ST_OFFLINE;
    else if (r->state == SP_SERVER_JOINING)
        s->state = TUI_ST_JOINING;
    else if (s->banned || isinf(e->rtt))
        s->state = TUI_ST_UNREACH;
    else
        s->state = TUI_ST_ONLINE;
    s->tput = r->throughput;
    s->inf_rps = r->inference_rps;
    s->fwd_rps = r->forward_rps;
    s->net_rps = r->network_rps;
    if (r->quant[0] && strcmp(r->quant, "none"))
        snprintf(s->prec, sizeof s->prec, "%.11s/%.11s", r->dtype, r->quant);
    else
        snprintf(s->prec, sizeof s->prec, "%s", r->dtype);
    s->cache = r->cache_tokens_left;
    s->npings = r->npings;
    s->best_ping = -1;
    for (int i = 0; i < r->npings; i++)
        if (s->best_ping < 0 || r->pings[i].rtt < s->best_ping)
            s->best_ping = r->pings[i].rtt;
    s->rtt = e->rtt;
    snprintf(s->version, sizeof s->version, "%s", r->version);
}

static tui_swarm *snapshot(tui *t, sp_runtime *rt)
{
    tui_swarm *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    double now = sp_now_s(), ban_now = sp_runtime_now(rt); /* bans are on the runtime's clock */
    sp_server_row *rows = NULL;
    int n = sp_runtime_servers(rt, &rows);
    if (n < 0) /* out of memory: an empty table this time */
        n = 0;
    if (n > t->ngone) {
        double *g = realloc(t->gone_since, (size_t)n * sizeof *g);
        if (g) {
            for (int i = t->ngone; i < n; i++)
                g[i] = 0;
            t->gone_since = g;
            t->ngone = n;
        }
    }
    s->s = n ? calloc((size_t)n, sizeof *s->s) : NULL;
    for (int i = 0; s->s && i < n; i++) {
        const sp_server_row *e = &rows[i];
        if (i < t->ngone) {
            if (!e->gone)
                t->gone_since[i] = 0;
            else if (!t->gone_since[i])
                t->gone_since[i] = now;
            if (e->gone && now - t->gone_since[i] > GONE_KEEP_S)
                continue;
        }
        server_of(e, i, ban_now, &s->s[s->n++]);
        if (e->rec.num_blocks > s->nblocks)
            s->nblocks = e->rec.num_blocks;
        if (!s->model[0])
            snprintf(s->model, sizeof s->model, "%s", e->rec.model);
    }
    free(rows);
    return s;
}

void *tui_feeder_main(void *arg)
{
    tui *t = arg;
    tui_crt_block_signals();
    pthread_mutex_lock(&t->flock);
    while (!t->fstop) {
        sp_runtime *rt = __atomic_load_n(&t->app->rt, __ATOMIC_SEQ_CST);
        if (!t->fkick) {
            if (rt) { /* the records change without events (speeds, cache, pings): a look a second */
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_sec += 1;
                pthread_cond_timedwait(&t->fcond, &t->flock, &ts);
            } else {
                pthread_cond_wait(&t->fcond, &t->flock);
            }
        }
        t->fkick = 0;
        if (t->fstop)
            break;
        rt = __atomic_load_n(&t->app->rt, __ATOMIC_SEQ_CST);
        pthread_mutex_unlock(&t->flock);
        tui_swarm *s = rt ? snapshot(t, rt) : NULL;
        if (s && !tui_swarm_same(s, t->last)) {
            tui_ev *e = tui_ev_new(TE_SWARM);
            if (e && (e->swarm = tui_swarm_dup(s)))
                post(t, e);
            else
                tui_ev_free(e);
            tui_swarm_free(t->last);
            t->last = s;
        } else {
            tui_swarm_free(s);
        }
        pthread_mutex_lock(&t->flock);
    }
    pthread_mutex_unlock(&t->flock);
    return NULL;
}

/* ---------------------------------------------------------------------------------------------- */
/* replay */

/* Sleeps until monotonic time `until`, or until asked to stop (1). */
static int replay_wait(tui *t, double until)
{
    for (;;) {
        pthread_mutex_lock(&t->flock);
        int stop = t->rstop;
        pthread_mutex_unlock(&t->flock);
        double left = until - sp_now_s();
        if (stop)
            return 1;
        if (left <= 0)
            return 0;
        double d = left < 0.1 ? left : 0.1;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)(d * 1e9)};
        nanosleep(&ts, NULL);
    }
}

void *tui_replay_main(void *arg)
{
    tui *t = arg;
    tui_crt_block_signals();
    char *line = NULL, why[128];
    size_t cap = 0;
    long n = 0, lineno = 0, bad = 0;
    double base = sp_now_s();
    while (getline(&line, &cap, t->replay) >= 0) {
        lineno++;
        if (!line[strspn(line, " \t\r\n")])
            continue;
        tui_ev *e = tui_ev_from_json(line, why, sizeof why);
        if (!e) {
            if (!bad++) {
                char msg[256];
                snprintf(msg, sizeof msg, "replay: line %ld: %s (skipped)", lineno, why);
                tui_post_log(t, TUI_LOG_WARN, msg);
            }
            continue;
        }
        if (e->kind == TE_READY || e->kind == TE_QUIT) { /* what the user did then is not for now */
            tui_ev_free(e);
            continue;
        }
        double at = base + (t->replay_speed > 0 ? e->t / t->replay_speed : 0);
        if (replay_wait(t, at)) {
            tui_ev_free(e);
            break;
        }
        e->t += base; /* the recorded times: rates come out as they were, at any pace */
        post(t, e);
        n++;
    }
    free(line);
    char msg[160];
    snprintf(msg, sizeof msg, "replay: %ld events%s", n, bad ? " (some lines skipped)" : "");
    tui_post_log(t, TUI_LOG_NOTICE, msg);
    return NULL;
}

