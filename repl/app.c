/* app.c - the application state: settings (unique prefixes, close matches for a typo), output through the
 * sink, the runtime and its events, cancellation. */
#include "app.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern.h"
#include "log.h"
#include "paths.h"
#include "runtime.h"

/* ---------------------------------------------------------------------------------------------- */
/* output */

void sp_emit(sp_app *app, const sp_ui_event *ev)
{
    if (app->quiet && (ev->kind == SP_UI_NOTICE || ev->kind == SP_UI_PROGRESS || ev->kind == SP_UI_PROGRESS_END))
        return;
    if (app->quiet && ev->kind == SP_UI_RUNTIME && ev->rt && /* the runtime's progress and notices too */
        (ev->rt->kind == SP_EV_PROGRESS || ev->rt->kind == SP_EV_INFO || ev->rt->kind == SP_EV_SERVER))
        return;
    if (app->sink.emit)
        app->sink.emit(app->sink.user, ev);
}

static void emit_text(sp_app *app, sp_ui_kind kind, const char *fmt, va_list ap)
{
    char stack[1024], *buf = stack;
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(stack, sizeof stack, fmt, ap);
    if (n >= (int)sizeof stack && (buf = malloc((size_t)n + 1)))
        vsnprintf(buf, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    sp_ui_event ev = {.kind = kind, .text = buf ? buf : stack, .where = app->where[0] ? app->where : NULL};
    sp_emit(app, &ev);
    if (buf != stack)
        free(buf);
}

void sp_out(sp_app *app, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    emit_text(app, SP_UI_TEXT, fmt, ap);
    va_end(ap);
}

void sp_note(sp_app *app, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    emit_text(app, SP_UI_NOTICE, fmt, ap);
    va_end(ap);
}

void sp_warn(sp_app *app, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    emit_text(app, SP_UI_WARN, fmt, ap);
    va_end(ap);
}

int sp_app_error(sp_app *app, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    emit_text(app, SP_UI_ERROR, fmt, ap);
    va_end(ap);
    app->nerrors++;
    return 1;
}

void sp_progress(sp_app *app, const char *what, double done, double total, const char *unit)
{
    sp_ui_event ev = {.kind = SP_UI_PROGRESS, .what = what, .done = done, .total = total, .unit = unit};
    sp_emit(app, &ev);
}

void sp_progress_end(sp_app *app, const char *what)
{
    sp_ui_event ev = {.kind = SP_UI_PROGRESS_END, .what = what};
    sp_emit(app, &ev);
}

/* ---------------------------------------------------------------------------------------------- */
/* cancellation */

void sp_app_cancel(sp_app *app)
{
    __atomic_store_n(&app->cancel, 1, __ATOMIC_SEQ_CST);
    sp_runtime *rt = __atomic_load_n(&app->rt, __ATOMIC_SEQ_CST);
    if (rt)
        sp_runtime_cancel(rt);
}

void sp_app_cancel_clear(sp_app *app)
{
    __atomic_store_n(&app->cancel, 0, __ATOMIC_SEQ_CST);
    if (app->rt)
        sp_runtime_cancel_clear(app->rt);
}

int sp_app_cancelled(const sp_app *app) { return __atomic_load_n(&app->cancel, __ATOMIC_SEQ_CST); }

/* ---------------------------------------------------------------------------------------------- */
/* the runtime */

static void on_runtime_event(const sp_event *e, void *user)
{
    sp_app *app = user;
    sp_ui_event ev = {.kind = SP_UI_RUNTIME, .rt = e};
    sp_emit(app, &ev);
}

sp_runtime *sp_app_runtime(sp_app *app)
{
    if (!app->rt) {
        sp_err err = {0};
        sp_runtime *rt = NULL;
        if (sp_runtime_new(&rt, on_runtime_event, app, &err)) {
            sp_app_error(app, "%s", err.msg);
            return NULL;
        }
        if (sp_app_cancelled(app))
            sp_runtime_cancel(rt);
        __atomic_store_n(&app->rt, rt, __ATOMIC_SEQ_CST);
    }
    sp_rt_settings *set = &app->rt->set;
    pthread_mutex_lock(&app->rt->lock);
    set->max_retries = (int)sp_app_num(app, "max-retries");
    set->step_timeout_s = sp_app_num(app, "step-timeout");
    snprintf(set->allowed, sizeof set->allowed, "%s", sp_app_get(app, "allowed-servers"));
    snprintf(set->blocked, sizeof set->blocked, "%s", sp_app_get(app, "blocked-servers"));
    pthread_mutex_unlock(&app->rt->lock);
    sp_err terr = {0};
    double th = sp_app_num(app, "threads");
    if (!isnan(th) && (int)th != app->rt->threads && sp_runtime_set_threads(app->rt, (int)th, &terr)) {
        sp_app_error(app, "threads: %s", terr.msg);
        char v[16];
        snprintf(v, sizeof v, "%d", app->rt->threads);
        sp_app_set(app, "threads", v, NULL, 0); /* the count in use stays */
        return NULL;
    }
    sp_wtype ht;
    sp_err derr = {0};
    if (!sp_wtype_parse(sp_app_get(app, "dtype"), &ht) && (int)ht != app->rt->head_dtype &&
        sp_runtime_set_head_dtype(app->rt, (int)ht, &derr)) {
        sp_app_error(app, "dtype: %s", derr.msg);
        sp_app_set(app, "dtype", sp_wtype_name((sp_wtype)app->rt->head_dtype), NULL, 0); /* the one in use stays */
        return NULL;
    }
    const char *key = sp_app_get(app, "swarm-key");
    char path[sizeof app->rt->key_path];
    sp_expand_home(key, path, sizeof path);
    sp_err err = {0};
    if (strcmp(path, app->rt->key_path) && sp_runtime_set_swarm_key(app->rt, path, &err)) {
        sp_app_error(app, "%s", err.msg);
        sp_app_set(app, "swarm-key", app->rt->key_path, NULL, 0); /* the key in use stays */
        return NULL;
    }
    return app->rt;
}

/* ---------------------------------------------------------------------------------------------- */
/* settings */

/* Library logs (the transport's, the DHT's): errors only, as notices; SEPAL_VERBOSE=1 shows warnings too. */
static void on_log(sp_log_level level, const char *msg, void *user)
{
    sp_app *app = user;
    sp_ui_event ev = {.kind = level >= SP_LOG_ERROR ? SP_UI_WARN : SP_UI_NOTICE, .text = msg};
    sp_emit(app, &ev);
}

void sp_app_init(sp_app *app, sp_sink sink)
{
    memset(app, 0, sizeof *app);
    app->sink = sink;
    const char *v = getenv("SEPAL_VERBOSE");
    sp_log_set_level(v && *v && strcmp(v, "0") ? SP_LOG_DEBUG : SP_LOG_ERROR);
    sp_log_set_sink(on_log, app);
    sp_app_define(app, "max-new-tokens", SP_OPT_INT, 0, 1e6, NULL, "64", "tokens that generate adds at most");
    sp_app_define(app, "temperature", SP_OPT_NUM, 0, 100, NULL, "0", "sampling temperature; 0 is greedy");
    sp_app_define(app, "top-k", SP_OPT_INT, 0, 1e9, NULL, "0", "sample among the k likeliest tokens; 0 is off");
    sp_app_define(app, "top-p", SP_OPT_NUM, 1e-9, 1, NULL, "1",
                  "nucleus sampling: the smallest set of tokens of probability p; 1 is off");
    sp_app_define(app, "repetition-penalty", SP_OPT_NUM, 0.01, 100, NULL, "1",
                  "divide the logits of tokens seen already; 1 is off");
    sp_app_define(app, "seed", SP_OPT_STR, 0, 0, NULL, "random",
                  "seed of sampling: an integer repeats a run, random draws a fresh one each time");
    sp_app_define(app, "beams", SP_OPT_INT, 1, 64, NULL, "1", "beam search width; 1 is no beam search");
    sp_app_define(app, "min-new-tokens", SP_OPT_INT, 0, 1e6, NULL, "0",
                  "the end-of-text token cannot come before this many new tokens");
    sp_app_define(app, "ignore-eos", SP_OPT_FLAG, 0, 0, NULL, "off",
                  "generation goes on past the end-of-text token (on, off)");
    sp_app_define(app, "stop", SP_OPT_STR, 0, 0, NULL, "", "generation stops after this text; empty is off");
    sp_app_define(app, "blocks-per-server", SP_OPT_INT, 0, 1e6, NULL, "0",
                  "blocks each server of `swarm up` holds; 0 is an even split");
    sp_app_define(app, "max-retries", SP_OPT_INT, 0, 1000, NULL, "8",
                  "retries of a request after a server fails (each on another route)");
    sp_app_define(app, "step-timeout", SP_OPT_NUM, 0, 86400, NULL, "0",
                  "seconds a server may take for one request before it counts as failed; 0 derives it from the "
                  "server's announced speed (a few seconds for a decode step)");
    sp_app_define(app, "allowed-servers", SP_OPT_STR, 0, 0, NULL, "",
                  "route only through these servers (ids, id prefixes, names or HOST:PORT, comma-separated)");
    sp_app_define(app, "blocked-servers", SP_OPT_STR, 0, 0, NULL, "", "never route through these servers (same forms)");
    sp_app_define(app, "threads", SP_OPT_INT, 0, 256, NULL, "0",
                  "the client's compute threads (its LM head, training's products); 0 is every CPU it may run on");
    sp_app_define(app, "dtype", SP_OPT_CHOICE, 0, 0, "f32|bf16|int8|nf4", "f32",
                  "the client's LM head for generation: f32 uses the checkpoint's tensor in place; bf16, int8 (blocks "
                  "of 32 with a scale) and nf4 are encoded copies, smaller and faster per token (training keeps f32)");
    sp_app_define(app, "swarm-key", SP_OPT_STR, 0, 0, NULL, "",
                  "a private swarm's key file (sepal-server --gen-swarm-key FILE): connections prove it both ways and "
                  "only DHT records sealed with it are read; empty is none");
}

void sp_app_free(sp_app *app)
{
    sp_runtime *rt = app->rt;
    __atomic_store_n(&app->rt, NULL, __ATOMIC_SEQ_CST);
    sp_runtime_free(rt); /* stops a swarm it started, closes connections, frees the local parts */
    sp_log_set_sink(NULL, NULL);
}

int sp_is_on(const char *v) { return !strcmp(v, "1") || !strcmp(v, "on") || !strcmp(v, "yes") || !strcmp(v, "true"); }

/* Levenshtein distance of short strings (close matches for a typo). */
static int distance(const char *a, const char *b)
{
    size_t n = strlen(a), m = strlen(b);
    if (n > 63 || m > 63)
        return 99;
    int d[64][64];
    for (size_t i = 0; i <= n; i++)
        d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            int x = d[i - 1][j] + 1 < d[i][j - 1] + 1 ? d[i - 1][j] + 1 : d[i][j - 1] + 1;
            d[i][j] = c < x ? c : x;
        }
    return d[n][m];
}

const sp_setting *sp_app_setting(const sp_app *app, const char *name, char *why, size_t cap)
{
    const sp_setting *hit = NULL;
    int count = 0;
    size_t n = strlen(name);
    for (int i = 0; i < app->nsettings; i++) {
        if (!strcmp(app->settings[i].name, name))
            return &app->settings[i];
        if (n && !strncmp(app->settings[i].name, name, n)) {
            hit = &app->settings[i];
            count++;
        }
    }
    if (count == 1)
        return hit;
    if (!why || !cap)
        return NULL;
    size_t len = (size_t)snprintf(why, cap, count ? "ambiguous setting '%s': " : "unknown setting '%s'", name);
    int listed = 0;
    for (int i = 0; i < app->nsettings && len < cap; i++) {
        const char *s = app->settings[i].name;
        int match = count ? !strncmp(s, name, n) : distance(s, name) <= 3 || (n >= 3 && strstr(s, name));
        if (match)
            len += (size_t)snprintf(why + len, cap - len, "%s%s", listed++ ? ", " : count ? "" : " (did you mean ",
                                    s);
    }
    if (!count && len < cap)
        snprintf(why + len, cap - len, listed ? "?; `show` lists them)" : " (`show` lists them)");
    return NULL;
}

const char *sp_app_get(const sp_app *app, const char *name)
{
    for (int i = 0; i < app->nsettings; i++)
        if (!strcmp(app->settings[i].name, name))
            return app->settings[i].value;
    return NULL;
}

static int choice_index(const char *choices, const char *v)
{
    size_t n = strlen(v);
    int i = 0;
    for (const char *p = choices; p && *p; i++) {
        size_t len = strcspn(p, "|");
        if (len == n && !strncmp(p, v, n))
            return i;
        p += len + (p[len] == '|');
    }
    return -1;
}

static int parse_number(sp_opt_kind kind, const char *value, double *out)
{
    char *end;
    errno = 0;
    if (kind == SP_OPT_INT)
        *out = (double)strtoll(value, &end, 10);
    else
        *out = strtod(value, &end);
    return errno || end == value || *end || !isfinite(*out) ? -1 : 0;
}

int sp_check_value(const char *what, sp_opt_kind kind, double min, double max, const char *choices,
                   const char *value, char *why, size_t cap)
{
    if (kind == SP_OPT_CHOICE && choice_index(choices, value) < 0) {
        char list[256];
        size_t n = 0;
        for (const char *p = choices; *p && n + 3 < sizeof list; p++) {
            if (*p == '|')
                list[n++] = ',', list[n++] = ' ';
            else
                list[n++] = *p;
        }
        list[n] = 0;
        snprintf(why, cap, "%s: '%s' is not one of %s", what, value, list);
        return -1;
    }
    if (kind == SP_OPT_FLAG && !sp_is_on(value) && strcmp(value, "0") && strcmp(value, "off") &&
        strcmp(value, "no") && strcmp(value, "false")) {
        snprintf(why, cap, "%s: expected on or off, got '%s'", what, value);
        return -1;
    }
    if (kind != SP_OPT_INT && kind != SP_OPT_NUM)
        return 0;
    double v;
    if (parse_number(kind, value, &v) || v < min || v > max) {
        char lo[32], hi[32];
        snprintf(lo, sizeof lo, "%.15g", min);
        snprintf(hi, sizeof hi, "%.15g", max);
        if (min == 1e-9)
            snprintf(why, cap, "%s: expected %s in (0, %s], got '%s'", what, kind == SP_OPT_INT ? "an integer" : "a number",
                     hi, value);
        else
            snprintf(why, cap, "%s: expected %s in [%s, %s], got '%s'", what,
                     kind == SP_OPT_INT ? "an integer" : "a number", lo, hi, value);
        return -1;
    }
    return 0;
}

/* The seed setting: an integer, or "random". */
static int check_setting(const sp_setting *s, const char *value, char *why, size_t cap)
{
    if (strlen(value) >= sizeof s->value) {
        snprintf(why, cap, "%s: value too long (at most %zu bytes)", s->name, sizeof s->value - 1);
        return -1;
    }
    if (!strcmp(s->name, "seed") && strcmp(value, "random"))
        return sp_check_value(s->name, SP_OPT_INT, 0, 9.2e18, NULL, value, why, cap);
    return sp_check_value(s->name, s->kind, s->min, s->max, s->choices, value, why, cap);
}

int sp_app_set(sp_app *app, const char *name, const char *value, char *why, size_t cap)
{
    sp_setting *s = (sp_setting *)sp_app_setting(app, name, why, cap);
    if (!s)
        return -1;
    if (check_setting(s, value, why, cap))
        return -2;
    snprintf(s->value, sizeof s->value, "%s", value);
    return 0;
}

double sp_app_num(const sp_app *app, const char *name)
{
    const char *v = sp_app_get(app, name);
    double x;
    if (!v || parse_number(SP_OPT_NUM, v, &x))
        return NAN;
    return x;
}

int sp_app_define(sp_app *app, const char *name, sp_opt_kind kind, double min, double max, const char *choices,
                  const char *def, const char *help)
{
    if (app->nsettings >= SP_APP_MAX_SETTINGS || sp_app_get(app, name))
        return -1;
    sp_setting *s = &app->settings[app->nsettings];
    *s = (sp_setting){.name = name, .help = help, .kind = kind, .min = min, .max = max, .choices = choices};
    char why[256];
    if (check_setting(s, def, why, sizeof why))
        return -1;
    snprintf(s->value, sizeof s->value, "%s", def);
    app->nsettings++;
    return 0;
}
