/* runtime.c - the client runtime's life cycle, its events and the model's local parts. Servers, routes,
 * sessions and chains are in swarm/. */
#include "runtime.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>

#include "kern.h"
#include "pool.h"
#include "swarm_impl.h"
#include "timeutil.h"

void sp_rt_emit(sp_runtime *rt, sp_event_kind kind, const char *text, double done, double total, int row)
{
    if (!rt->on_event)
        return;
    sp_event ev = {.kind = kind, .text = text, .done = done, .total = total, .row = row};
    rt->on_event(&ev, rt->user);
}

void sp_rt_emit_route(sp_runtime *rt, sp_event_kind kind, const char *text, int row, const sp_route *r,
                      const double *hop_s)
{
    if (!rt->on_event)
        return;
    sp_event ev = {.kind = kind, .text = text, .row = row, .route = r, .hop_s = hop_s};
    rt->on_event(&ev, rt->user);
}

void sp_rt_emitf(sp_runtime *rt, sp_event_kind kind, int row, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    sp_rt_emit(rt, kind, buf, 0, 0, row);
}

/* ---------------------------------------------------------------------------------------------- */
/* life cycle, model */

static void find_server_bin(sp_runtime *rt)
{
    const char *env = getenv("SEPAL_SERVER_BIN");
    if (env && *env) {
        snprintf(rt->server_bin, sizeof rt->server_bin, "%s", env);
        return;
    }
    char self[PATH_MAX - 64]; /* room for the suffixes below */
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    self[n > 0 ? n : 0] = '\0';
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = '\0';
    /* installed side by side, or the build tree (build/app/sepal, build/server/sepal-server) */
    snprintf(rt->server_bin, sizeof rt->server_bin, "%s/sepal-server", self);
    if (access(rt->server_bin, X_OK) != 0)
        snprintf(rt->server_bin, sizeof rt->server_bin, "%s/../server/sepal-server", self);
}

sp_status sp_runtime_new(sp_runtime **out, sp_event_fn on_event, void *user, sp_err *err)
{
    sp_runtime *rt = calloc(1, sizeof *rt);
    if (!rt)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    rt->on_event = on_event;
    rt->user = user;
    rt->set = (sp_rt_settings){.max_retries = 8, .ban_s = 15, .backoff_max_s = 60, .update_period_s = 10};
    pthread_mutex_init(&rt->lock, NULL);
    sp_view_slot_init(&rt->views);
    pthread_cond_init(&rt->pinger_cond, NULL);
    sp_rng_seed(&rt->rng, sp_now_ns() ^ (uint64_t)getpid());
    find_server_bin(rt);
    *out = rt;
    return SP_OK;
}

/* Async-signal-safe: lock-free atomics only. */
void sp_runtime_cancel(sp_runtime *rt)
{
    int first = !__atomic_exchange_n(&rt->cancel, 1, __ATOMIC_SEQ_CST);
    if (!first || !__atomic_load_n(&rt->finish_steps, __ATOMIC_SEQ_CST))
        __atomic_store_n(&rt->cancel_waits, 1, __ATOMIC_SEQ_CST);
}

void sp_runtime_cancel_clear(sp_runtime *rt)
{
    __atomic_store_n(&rt->cancel, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&rt->cancel_waits, 0, __ATOMIC_SEQ_CST);
}

int sp_runtime_cancelled(const sp_runtime *rt) { return __atomic_load_n(&rt->cancel, __ATOMIC_SEQ_CST); }
double sp_runtime_now(const sp_runtime *rt) { return rt->clock ? rt->clock->now(rt->clock->user) : sp_now_s(); }
int sp_runtime_waits_cancelled(const sp_runtime *rt) { return __atomic_load_n(&rt->cancel_waits, __ATOMIC_SEQ_CST); }

void sp_runtime_finish_steps(sp_runtime *rt, int on)
{
    __atomic_store_n(&rt->finish_steps, on, __ATOMIC_SEQ_CST);
    if (!on && sp_runtime_cancelled(rt)) /* a cancel that came meanwhile: nothing is waited for any more */
        __atomic_store_n(&rt->cancel_waits, 1, __ATOMIC_SEQ_CST);
}

void sp_runtime_free(sp_runtime *rt)
{
    if (!rt)
        return;
    sp_runtime_swarm_down(rt);
    sp_rt_leave(rt);
    sp_rt_close_conns(rt);
    for (int i = 0; i < rt->nservers; i++)
        free(rt->servers[i]);
    free(rt->servers);
    sp_model_free(rt->local);
    sp_pool_free(rt->pool);
    sp_tokenizer_free(rt->tok);
    pthread_mutex_destroy(&rt->lock);
    sp_view_slot_destroy(&rt->views);
    pthread_cond_destroy(&rt->pinger_cond);
    free(rt);
}

sp_status sp_runtime_set_head_dtype(sp_runtime *rt, int t, sp_err *err)
{
    if (t < 0 || t >= SP_W__COUNT)
        return sp_errf(err, SP_ERR_ARG, "head dtype %d: expected f32, bf16, int8 or nf4", t);
    if (rt->local && t != rt->head_dtype) {
        sp_status st = sp_model_quantize(rt->local, (sp_wtype)t, 1, err);
        if (st)
            return st;
        sp_rt_emitf(rt, SP_EV_INFO, 0, "the LM head is now %s (%.1f MB)", sp_wtype_name((sp_wtype)t),
                    (double)sp_qmat_bytes((sp_wtype)t, rt->local->cfg.vocab, rt->local->cfg.hidden) / 1e6);
    }
    rt->head_dtype = t;
    return SP_OK;
}

sp_status sp_runtime_set_threads(sp_runtime *rt, int n, sp_err *err)
{
    if (n < 0 || n > 256)
        return sp_errf(err, SP_ERR_ARG, "threads %d: expected 0 (every CPU) to 256", n);
    if (n == rt->threads)
        return SP_OK;
    sp_pool *p = NULL;
    if (n > 0 && !(p = sp_pool_new(n)))
        return sp_errf(err, SP_ERR_NOMEM, "out of memory starting %d threads", n);
    if (rt->local)
        sp_model_set_pool(rt->local, p); /* NULL: the engine's default pool */
    sp_pool_free(rt->pool);
    rt->pool = p;
    rt->threads = n;
    openblas_set_num_threads(n > 0 ? n : sp_cpu_count()); /* training's large products */
    return SP_OK;
}

sp_status sp_runtime_load(sp_runtime *rt, const char *dir, sp_err *err)
{
    sp_model *m = NULL;
    sp_tokenizer *tok = NULL;
    char what[160];
    snprintf(what, sizeof what, "loading %.140s", dir);
    sp_rt_emit(rt, SP_EV_PROGRESS, what, 0, 2, 0);
    sp_status st = sp_model_load(&m, dir, SP_LOAD_EMBED | SP_LOAD_HEAD, 0, 0, err);
    if (st) {
        sp_rt_emit(rt, SP_EV_PROGRESS, what, 2, 2, 0);
        return st;
    }
    sp_rt_emit(rt, SP_EV_PROGRESS, what, 1, 2, 0);
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (access(path, R_OK) == 0 && (st = sp_tokenizer_load(&tok, dir, err))) {
        sp_model_free(m);
        return st;
    }
    if (!st && rt->head_dtype != SP_W_F32 && (st = sp_model_quantize(m, (sp_wtype)rt->head_dtype, 1, err))) {
        sp_tokenizer_free(tok);
        sp_model_free(m);
        return st;
    }
    if (rt->pool)
        sp_model_set_pool(m, rt->pool);
    sp_rt_emit(rt, SP_EV_PROGRESS, what, 2, 2, 0);
    sp_model_free(rt->local);
    sp_tokenizer_free(rt->tok);
    rt->local = m;
    rt->tok = tok;
    snprintf(rt->model_dir, sizeof rt->model_dir, "%s", dir);
    sp_model_prefix(dir, rt->model_prefix, sizeof rt->model_prefix);
    char head[48] = "";
    if (rt->head_dtype != SP_W_F32)
        snprintf(head, sizeof head, "; LM head in %s", sp_wtype_name((sp_wtype)rt->head_dtype));
    sp_rt_emitf(rt, SP_EV_INFO, 0, "loaded %s: %s, %d blocks, hidden %d, vocab %d%s (%.1f MB of local parts%s)", dir,
                m->cfg.architecture, m->cfg.n_layers, m->cfg.hidden, m->cfg.vocab, tok ? "" : ", no tokenizer",
                (double)m->bytes_loaded / 1e6, head);
    return sp_rt_view_follow_model(rt, err); /* a swarm joined before: follow this model's servers */
}

