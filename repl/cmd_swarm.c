/* cmd_swarm.c - load, swarm up/down, connect, servers, models, route: the command side of the client
 * runtime. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "runtime.h"
#include "timeutil.h"

static int cmd_load(sp_app *app, const sp_args *a)
{
    sp_runtime *rt = sp_app_runtime(app);
    sp_err err = {0};
    if (!rt)
        return 1;
    if (sp_runtime_load(rt, a->pos[0], &err))
        return sp_app_error(app, "%s", err.msg);
    return 0;
}

static int cmd_swarm_up(sp_app *app, const sp_args *a)
{
    sp_runtime *rt = sp_app_runtime(app);
    sp_err err = {0};
    if (!rt)
        return 1;
    char *end;
    long n = strtol(a->pos[0], &end, 10);
    if (*end || end == a->pos[0] || n < 1 || n > 256)
        return sp_app_error(app, "swarm up: N: expected an integer in [1, 256], got '%s'", a->pos[0]);
    long k = sp_arg_int(app, a, "--blocks-per-server", 0);
    if (sp_runtime_swarm_up(rt, (int)n, (int)k, &err)) {
        if (err.code == SP_ERR_CANCELLED)
            return sp_app_error(app, "swarm up: stopped (Ctrl-C); the servers it had started were stopped");
        return sp_app_error(app, "%s", err.msg);
    }
    return 0;
}

static int cmd_swarm_down(sp_app *app, const sp_args *a)
{
    (void)a;
    sp_runtime *rt = sp_app_runtime(app);
    if (!rt)
        return 1;
    if (!rt->swarm_started)
        return sp_app_error(app, "swarm down: no swarm was started here (swarm up N starts one)");
    sp_runtime_swarm_down(rt);
    return 0;
}

static int cmd_connect(sp_app *app, const sp_args *a)
{
    const char *peers = sp_arg(app, a, "--initial-peers"), *key = sp_arg(app, a, "--swarm-key");
    if (!peers == !a->npos)
        return sp_app_error(app, "usage: connect [--swarm-key FILE] HOST:PORT[,...] | "
                                 "connect [--swarm-key FILE] --initial-peers HOST:PORT[,...]");
    char why[256];
    if (sp_arg_given(a, "--swarm-key") && sp_app_set(app, "swarm-key", key, why, sizeof why)) /* the setting: later connections keep it */
        return sp_app_error(app, "connect: %s", why);
    sp_runtime *rt = sp_app_runtime(app);
    sp_err err = {0};
    if (!rt)
        return 1;
    if (peers ? sp_runtime_join(rt, peers, &err) : sp_runtime_connect(rt, a->pos[0], &err))
        return sp_app_error(app, "%s", err.msg);
    return 0;
}

/* "0.8 ms", "-" when unknown, "unreachable" */
static void fmt_rtt(char *buf, size_t cap, double rtt)
{
    if (rtt < 0 || isnan(rtt))
        snprintf(buf, cap, "-");
    else if (isinf(rtt))
        snprintf(buf, cap, "unreachable");
    else if (rtt < 0.001)
        snprintf(buf, cap, "%.0f us", rtt * 1e6);
    else
        snprintf(buf, cap, "%.1f ms", rtt * 1e3);
}

static void server_row(sp_app *app, const sp_server_entry *e, double now)
{
    const sp_server_record *r = &e->rec;
    char addr[96], span[32], rtt[32], pings[48], state[32], best_s[24];
    snprintf(addr, sizeof addr, "%s:%d", r->host, r->port);
    snprintf(span, sizeof span, "%d:%d", r->start, r->end);
    fmt_rtt(rtt, sizeof rtt, e->rtt);
    double best = -1;
    for (int i = 0; i < r->npings; i++)
        if (best < 0 || r->pings[i].rtt < best)
            best = r->pings[i].rtt;
    fmt_rtt(best_s, sizeof best_s, best);
    if (r->npings)
        snprintf(pings, sizeof pings, "%d, %s", r->npings, best_s);
    else
        snprintf(pings, sizeof pings, "-");
    if (e->banned_until > now)
        snprintf(state, sizeof state, "banned %.0fs", e->banned_until - now);
    else
        snprintf(state, sizeof state, "%s", sp_server_state_name(r->state));
    char cache[32];
    if (r->cache_tokens_left >= 0)
        snprintf(cache, sizeof cache, "%ld", r->cache_tokens_left);
    else
        snprintf(cache, sizeof cache, "-");
    sp_out(app, "%-8.8s %-12.12s %-21s %-7s %-11s %9.0f %9.1f %9.0f %9.0f %-4s %9s %-13s %-8s %-6s%s\n", r->id,
           r->name[0] ? r->name : "-", addr, span, state, r->throughput, r->inference_rps, r->forward_rps,
           r->network_rps, r->dtype, cache, pings, rtt, r->version, e->pid > 0 ? " (local)" : "");
}

/* servers --long: every field of server i's record, one per line, nothing cut; caller holds rt->lock. */
static void server_long(sp_app *app, sp_runtime *rt, int i, double now, double wall)
{
    const sp_server_entry *e = rt->servers[i];
    const sp_server_record *r = &e->rec;
    char rtt[32], state[64];
    sp_out(app, "server %s%s\n", r->id, e->pid > 0 ? " (local: started by swarm up)" : "");
    sp_out(app, "  name        %s\n", r->name[0] ? r->name : "- (no --public-name)");
    sp_out(app, "  address     ws://%s:%d\n", r->host, r->port);
    sp_out(app, "  dht node    %s\n", r->dht[0] ? r->dht : "-");
    sp_out(app, "  model       %s (config %016llx, %d blocks)\n", r->model[0] ? r->model : "-",
           (unsigned long long)r->config_hash, r->num_blocks);
    sp_out(app, "  blocks      %d:%d (%d)\n", r->start, r->end, r->end - r->start);
    if (e->banned_until > now)
        snprintf(state, sizeof state, ", banned for %.0f s more (%d failures)", e->banned_until - now, e->failures);
    else
        state[0] = '\0';
    sp_out(app, "  state       %s%s\n", sp_server_state_name(r->state), state);
    sp_out(app, "  throughput  %.1f tokens/s per block\n", r->throughput);
    sp_out(app, "  rps         inference %.1f steps/s, forward %.1f tokens/s, network %.1f tokens/s\n",
           r->inference_rps, r->forward_rps, r->network_rps);
    sp_out(app, "  dtype       %s\n", r->dtype[0] ? r->dtype : "-");
    sp_out(app, "  quant       %s\n", r->quant[0] ? r->quant : "none");
    if (r->cache_tokens_left >= 0)
        sp_out(app, "  cache left  %ld tokens\n", r->cache_tokens_left);
    else
        sp_out(app, "  cache left  -\n");
    if (!r->npings)
        sp_out(app, "  next pings  none\n");
    for (int p = 0; p < r->npings; p++) {
        char who[96] = "";
        for (int j = 0; j < rt->nservers; j++)
            if (!strcmp(rt->servers[j]->rec.id, r->pings[p].id)) {
                const sp_server_record *n = &rt->servers[j]->rec;
                snprintf(who, sizeof who, " (%s:%d, blocks %d:%d)", n->host, n->port, n->start, n->end);
            }
        fmt_rtt(rtt, sizeof rtt, r->pings[p].rtt);
        sp_out(app, "  %-11s %s %s%s\n", p ? "" : "next pings", r->pings[p].id, rtt, who);
    }
    fmt_rtt(rtt, sizeof rtt, e->rtt);
    sp_out(app, "  ping        %s (from this app)\n", rtt);
    sp_out(app, "  version     %s\n", r->version[0] ? r->version : "-");
    if (e->from_dht && r->timestamp > 0)
        sp_out(app, "  announced   %.1f s ago (every %.0f s)\n", wall - r->timestamp, r->period);
    else
        sp_out(app, "  announced   - (connected by address, not through the DHT)\n");
}

static int cmd_servers(sp_app *app, const sp_args *a)
{
    sp_runtime *rt = sp_app_runtime(app);
    if (!rt)
        return 1;
    int lng = sp_arg_given(a, "--long");
    sp_runtime_refresh(rt);
    if (!lng)
        sp_out(app, "%-8s %-12s %-21s %-7s %-11s %9s %9s %9s %9s %-4s %9s %-13s %-8s %-6s\n", "id", "name",
               "address", "blocks", "state", "tok/s", "inf rps", "fwd rps", "net rps", "type", "cache", "next pings",
               "ping", "version");
    int shown = 0;
    double now = sp_runtime_now(rt), wall = sp_wall_s();
    pthread_mutex_lock(&rt->lock);
    for (int i = 0; i < rt->nservers; i++) {
        const sp_server_entry *e = rt->servers[i];
        if (e->gone)
            continue;
        int newer = 0; /* a restarted server: the same address under a new id; show the newest record */
        for (int j = 0; j < rt->nservers && !newer; j++)
            newer = j != i && !rt->servers[j]->gone && rt->servers[j]->rec.port == e->rec.port &&
                    !strcmp(rt->servers[j]->rec.host, e->rec.host) && rt->servers[j]->rec.timestamp > e->rec.timestamp;
        if (newer)
            continue;
        if (lng && shown)
            sp_out(app, "\n");
        if (lng)
            server_long(app, rt, i, now, wall);
        else
            server_row(app, e, now);
        shown++;
    }
    pthread_mutex_unlock(&rt->lock);
    if (!shown)
        sp_out(app, "(no servers: swarm up N, connect --initial-peers HOST:PORT, or connect HOST:PORT)\n");
    return 0;
}

static int cmd_models(sp_app *app, const sp_args *a)
{
    (void)a;
    sp_runtime *rt = sp_app_runtime(app);
    if (!rt)
        return 1;
    if (!rt->dht)
        return sp_app_error(app, "models: not in a swarm (swarm up N, or connect --initial-peers HOST:PORT)");
    sp_model_record *m = NULL;
    int n = sp_runtime_models(rt, &m);
    sp_out(app, "%-24s %7s %7s %-18s %s\n", "model", "blocks", "hidden", "config", "architecture");
    for (int i = 0; i < n; i++)
        sp_out(app, "%-24s %7d %7d %016llx   %s%s\n", m[i].model, m[i].num_blocks, m[i].hidden,
               (unsigned long long)m[i].config_hash, m[i].architecture,
               rt->local && !strcmp(m[i].model, rt->model_prefix) ? " (loaded)" : "");
    if (!n)
        sp_out(app, "(no models announced yet)\n");
    free(m);
    return 0;
}

static int cmd_route(sp_app *app, const sp_args *a)
{
    (void)a;
    sp_runtime *rt = sp_app_runtime(app);
    sp_err err = {0};
    if (!rt)
        return 1;
    if (!rt->local)
        return sp_app_error(app, "route: no model loaded (load DIR first)");
    sp_route r;
    if (sp_runtime_route_inference(rt, 0, rt->local->cfg.n_layers, 0, &r, &err))
        return sp_app_error(app, "route: %s", err.msg);
    char text[4096];
    sp_runtime_route_text(rt, &r, text, sizeof text);
    sp_out(app, "%s\n", text);
    sp_runtime_note_route(rt, &r); /* the TUI's route panel shows the same figures */
    return 0;
}

static const sp_opt swarm_up_opts[] = {
    {"--blocks-per-server", SP_OPT_INT, "K", 1, 1 << 20, NULL, "blocks-per-server", NULL,
     "blocks each server holds (N x K above the model's blocks gives redundancy)"},
    {0},
};

static const sp_cmd swarm_subs[] = {
    {.name = "up", .args = "N", .min_pos = 1, .max_pos = 1, .opts = swarm_up_opts,
     .summary = "start N sepal-server processes on 127.0.0.1 as a real swarm, and join it",
     .help = "The first server starts the swarm (its DHT node), the others and this app join through it, and each "
             "server chooses its blocks where the swarm needs them: an even split, or K each. It waits until all "
             "serve. Ctrl-C stops it and the servers it started. A second `swarm up` is refused while one is up. "
             "Server I writes its log to $TMPDIR/sepal-swarm-PID-I.log (TMPDIR: /tmp when unset; PID: this "
             "app's), removed by `swarm down` and kept when the server dies (the message names it).",
     .examples = "swarm up 3\nswarm up 4 --blocks-per-server 3", .fn = cmd_swarm_up},
    {.name = "down", .args = "", .max_pos = 0, .summary = "stop the servers of swarm up (each announces OFFLINE)",
     .examples = "swarm down", .fn = cmd_swarm_down},
    {0},
};

static const sp_opt servers_opts[] = {
    {"--long", SP_OPT_FLAG, NULL, 0, 0, NULL, NULL, NULL, "every field of each record, one per line, nothing cut"},
    {0},
};

static const sp_opt connect_opts[] = {
    {"--initial-peers", SP_OPT_STR, "HOST:PORT[,...]", 0, 0, NULL, NULL, NULL,
     "join a swarm through these DHT nodes (any server's DHT port)"},
    {"--swarm-key", SP_OPT_PATH, "FILE", 0, 0, NULL, "swarm-key", NULL,
     "a private swarm's key (sepal-server --gen-swarm-key FILE); it becomes the swarm-key setting"},
    {0},
};

const sp_cmd sp_cmds_swarm[] = {
    {.name = "load", .args = "DIR", .min_pos = 1, .max_pos = 1, .pos_paths = 1,
     .summary = "load a model's local parts (embeddings, final norm, head, tokenizer)",
     .help = "Reads config.json, the tokenizer and only the embeddings, final norm and LM head of the Hugging Face "
             "model in DIR (a leading ~ is your home). The blocks are served by the swarm.",
     .examples = "load ~/.cache/sepal/models/stories15M", .fn = cmd_load},
    {.name = "swarm", .args = "up N | down", .subs = swarm_subs,
     .summary = "start or stop a local swarm of sepal-server processes"},
    {.name = "connect", .args = "[HOST:PORT[,...]]", .max_pos = 1, .opts = connect_opts,
     .summary = "join a swarm, or use servers by address",
     .help = "connect --initial-peers HOST:PORT,... joins a swarm through its DHT nodes (any server's DHT port): a "
             "DHT node of this app's own keeps a live view of the loaded model's servers, and routing picks among "
             "them. connect HOST:PORT,... (or ws://HOST:PORT) uses servers by their websocket address, without "
             "the DHT; a server of another model is refused. --swarm-key FILE joins a private swarm: every "
             "connection proves the key both ways and DHT records without its tag are dropped.",
     .examples = "connect --initial-peers 127.0.0.1:31330\nconnect 127.0.0.1:31330", .fn = cmd_connect},
    {.name = "servers", .args = "", .max_pos = 0, .opts = servers_opts,
     .summary = "the servers: id, name, address, blocks, state, throughput, rps, cache, pings, version",
     .help = "One row per server: its id (and public name), websocket address, blocks, state (online, joining, "
             "offline, banned), throughput (tokens/s per block it offers), inference / forward / network rps, "
             "precision, cache left (positions a session over its span can get), its pings to its successors "
             "(count, best), this app's ping to it, and its version. Long ids and names are cut to fit; "
             "--long (-l) shows every field of each server's record instead, nothing cut: the full id, name, "
             "address, DHT node, model, blocks, state (and ban), throughput, the three rps, dtype, quantisation, "
             "cache left, each of its next-hop pings, this app's ping, version, and how long ago it announced.",
     .examples = "servers\nservers -l", .fn = cmd_servers, .short_opts = "-l --long"},
    {.name = "models", .args = "", .max_pos = 0, .summary = "the models announced in the swarm", .examples = "models",
     .fn = cmd_models},
    {.name = "route", .args = "", .max_pos = 0,
     .summary = "the chain of servers the next generation uses, with each hop's expected latency",
     .help = "The min-latency route (Petals' Dijkstra over the servers' spans, pings, speeds and cache left) over "
             "every block, each hop's expected time per step, and the steps/s it predicts. Training routes are "
             "drawn per sub-batch at random, weighted by the servers' throughput.",
     .examples = "route", .fn = cmd_route},
    {0},
};
