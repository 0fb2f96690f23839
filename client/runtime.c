/* runtime.c - the client runtime's life cycle (new, load, free) and what front ends read of it, copied under
 * its lock. Everything else is below, in the runtime's parts: events, cancellation, the model's local parts
 * (model/), the swarm (swarm/). */
#include "runtime.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime_state.h"
#include "swarm_impl.h"
#include "timeutil.h"

/* ---------------------------------------------------------------------------------------------- */
/* life cycle */

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
    rt->events = (sp_events){.fn = on_event, .user = user};
    rt->gen_device = -1; /* generation's local parts on the CPU */
    rt->set = (sp_rt_settings){.max_retries = 8, .push = SP_PUSH_AUTO, .wire = SP_WIRE_AUTO, .ban_s = 15, .backoff_max_s = 60, .update_period_s = 10};
    pthread_mutex_init(&rt->lock, NULL);
    sp_view_slot_init(&rt->views);
    pthread_cond_init(&rt->pinger_cond, NULL);
    sp_rng_seed(&rt->rng, sp_now_ns() ^ (uint64_t)getpid());
    find_server_bin(rt);
    *out = rt;
    return SP_OK;
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
    sp_rt_parts_free(rt);
    pthread_mutex_destroy(&rt->lock);
    sp_view_slot_destroy(&rt->views);
    pthread_cond_destroy(&rt->pinger_cond);
    free(rt);
}

sp_status sp_runtime_load(sp_runtime *rt, const char *dir, sp_err *err)
{
    sp_status st = sp_rt_parts_load(rt, dir, err);
    return st ? st : sp_rt_view_follow_model(rt, err); /* a swarm joined before: follow this model's servers */
}

/* ---------------------------------------------------------------------------------------------- */
/* what front ends read */

static void row_of(const sp_server_entry *e, sp_server_row *r)
{
    *r = (sp_server_row){.rec = e->rec, .from_dht = e->from_dht, .gone = e->gone, .rtt = e->rtt,
                         .banned_until = e->banned_until, .busy_until = e->busy_until, .failures = e->failures, .cache_total = e->cache_total,
                         .refused_caps = e->refused_caps, .link_mbit = e->link_down.mbit,
                         .link_up_mbit = e->link_up.mbit, .pid = e->pid};
    sp_encoding back;
    r->wire_auto = sp_rt_wire_of_entry(e, &back);
    r->wire_auto_back = back;
    snprintf(r->log, sizeof r->log, "%s", e->log);
}

int sp_runtime_servers(sp_runtime *rt, sp_server_row **out)
{
    *out = NULL;
    pthread_mutex_lock(&rt->lock);
    int n = rt->nservers;
    sp_server_row *rows = n ? malloc((size_t)n * sizeof *rows) : NULL;
    for (int i = 0; rows && i < n; i++)
        row_of(rt->servers[i], &rows[i]);
    pthread_mutex_unlock(&rt->lock);
    if (n && !rows)
        return -1;
    *out = rows;
    return n;
}

int sp_runtime_server_count(sp_runtime *rt)
{
    pthread_mutex_lock(&rt->lock);
    int n = rt->nservers;
    pthread_mutex_unlock(&rt->lock);
    return n;
}

void sp_runtime_last_route(sp_runtime *rt, sp_route *out)
{
    pthread_mutex_lock(&rt->lock);
    *out = rt->route;
    pthread_mutex_unlock(&rt->lock);
}

void sp_runtime_settings(sp_runtime *rt, sp_rt_settings *out)
{
    pthread_mutex_lock(&rt->lock);
    *out = rt->set;
    pthread_mutex_unlock(&rt->lock);
}

void sp_runtime_set_settings(sp_runtime *rt, const sp_rt_settings *s)
{
    pthread_mutex_lock(&rt->lock);
    rt->set = *s;
    pthread_mutex_unlock(&rt->lock);
}

int sp_runtime_swarm_started(const sp_runtime *rt) { return rt->swarm_started; }
int sp_runtime_in_swarm(const sp_runtime *rt) { return rt->dht != NULL; }
const char *sp_runtime_swarm_key_path(const sp_runtime *rt) { return rt->key_path; }
const char *sp_runtime_initial_peers(const sp_runtime *rt) { return rt->initial_peers; }
