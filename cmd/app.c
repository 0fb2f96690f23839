/* app.c - the application state: output through the sink, the runtime (the settings applied to it) and its
 * events, cancellation. The settings themselves: settings.c. */
#include "app.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devparts.h"
#include "kern.h"
#include "log.h"
#include "paths.h"
#include "proto.h"
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

int sp_emitf(sp_app *app, sp_ui_kind kind, const char *fmt, ...)
{
    char stack[1024], *buf = stack;
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(stack, sizeof stack, fmt, ap);
    if (n >= (int)sizeof stack && (buf = malloc((size_t)n + 1)))
        vsnprintf(buf, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    va_end(ap);
    sp_ui_event ev = {.kind = kind, .text = buf ? buf : stack, .where = app->where[0] ? app->where : NULL};
    app->nerrors += kind == SP_UI_ERROR;
    sp_emit(app, &ev);
    if (buf != stack)
        free(buf);
    return 1;
}

void sp_progress(sp_app *app, const char *what, double done, double total, const char *unit)
{
    sp_ui_event ev = {.kind = SP_UI_PROGRESS, .what = what, .done = done, .total = total, .unit = unit};
    sp_emit(app, &ev);
}

int sp_app_columns(const sp_app *app)
{
    int c = app->sink.columns ? app->sink.columns(app->sink.user) : app->width;
    return c > 0 ? c : 0;
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

/* The device setting for generation's local parts (sp_runtime_set_gen_device): cuda[:N] on that GPU, auto and cpu
 * on the CPU. -1 after an error said (the setting back to what is in use). */
static int apply_gen_device(sp_app *app)
{
    int cuda = 0, index = 0;
    char why[160];
    if (sp_devparts_parse(sp_app_get(app, SP_SET_DEVICE), &cuda, &index, why, sizeof why))
        cuda = 0; /* auto */
    int want = cuda ? index : -1, had = sp_runtime_gen_device(app->rt);
    sp_err err = {0};
    if (want == had || !sp_runtime_set_gen_device(app->rt, want, &err))
        return 0;
    sp_app_error(app, "device: %s", err.msg);
    char v[32] = "cpu";
    if (had >= 0)
        snprintf(v, sizeof v, "cuda:%d", had);
    sp_app_set(app, SP_SET_DEVICE, v, NULL, 0); /* the device in use stays */
    return -1;
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
    sp_rt_settings set;
    sp_runtime_settings(app->rt, &set);
    set.max_retries = (int)sp_app_num(app, SP_SET_MAX_RETRIES);
    set.step_timeout_s = sp_app_num(app, SP_SET_STEP_TIMEOUT);
    const char *push = sp_app_get(app, SP_SET_PUSH);
    set.push = !strcmp(push, "on") ? SP_PUSH_ON : !strcmp(push, "off") ? SP_PUSH_OFF : SP_PUSH_AUTO;
    int wire = sp_encoding_from_name(sp_app_get(app, SP_SET_WIRE)); /* (the setting's choices are its names) */
    set.wire = wire >= 0 ? wire : SP_WIRE_AUTO; /* (auto: no encoding's name) */
    snprintf(set.allowed, sizeof set.allowed, "%s", sp_app_get(app, SP_SET_ALLOWED_SERVERS));
    snprintf(set.blocked, sizeof set.blocked, "%s", sp_app_get(app, SP_SET_BLOCKED_SERVERS));
    sp_runtime_set_settings(app->rt, &set);
    sp_err terr = {0};
    double th = sp_app_num(app, SP_SET_THREADS);
    if ((int)th != sp_runtime_threads(app->rt) && sp_runtime_set_threads(app->rt, (int)th, &terr)) {
        sp_app_error(app, "threads: %s", terr.msg);
        char v[16];
        snprintf(v, sizeof v, "%d", sp_runtime_threads(app->rt));
        sp_app_set(app, SP_SET_THREADS, v, NULL, 0); /* the count in use stays */
        return NULL;
    }
    sp_wtype ht;
    sp_err derr = {0};
    if (!sp_wtype_parse(sp_app_get(app, SP_SET_DTYPE), &ht) && (int)ht != sp_runtime_head_dtype(app->rt) &&
        sp_runtime_set_head_dtype(app->rt, (int)ht, &derr)) {
        sp_app_error(app, "dtype: %s", derr.msg);
        sp_app_set(app, SP_SET_DTYPE, sp_wtype_name((sp_wtype)sp_runtime_head_dtype(app->rt)), NULL, 0); /* in use stays */
        return NULL;
    }
    if (apply_gen_device(app))
        return NULL;
    const char *key = sp_app_get(app, SP_SET_SWARM_KEY);
    char path[4096];
    sp_expand_home(key, path, sizeof path);
    sp_err err = {0};
    if (strcmp(path, sp_runtime_swarm_key_path(app->rt)) && sp_runtime_set_swarm_key(app->rt, path, &err)) {
        sp_app_error(app, "%s", err.msg);
        sp_app_set(app, SP_SET_SWARM_KEY, sp_runtime_swarm_key_path(app->rt), NULL, 0); /* the key in use stays */
        return NULL;
    }
    return app->rt;
}

/* ---------------------------------------------------------------------------------------------- */
/* the app */

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
    for (int k = 0; k < SP_SET_N; k++)
        sp_app_set(app, (sp_set)k, sp_settings[k].def, NULL, 0);
}

void sp_app_free(sp_app *app)
{
    sp_runtime *rt = app->rt;
    __atomic_store_n(&app->rt, NULL, __ATOMIC_SEQ_CST);
    sp_runtime_free(rt); /* stops a swarm it started, closes connections, frees the local parts */
    sp_log_set_sink(NULL, NULL);
}
