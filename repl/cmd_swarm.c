/* cmd_swarm.c - load, swarm up/down, connect, servers, models, route: the REPL side of the client runtime.
 * The runtime reports through events; here they become lines on stderr (the TUI will draw them instead). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app.h"
#include "cli.h"
#include "runtime.h"
#include "timeutil.h"

static void print_event(const sp_event *ev, void *user)
{
    (void)user;
    switch (ev->kind) {
    case SP_EV_PROGRESS: /* a live counter on a terminal; only the final count in logs */
        if (ev->total > 0 && isatty(2))
            fprintf(stderr, "\r%s: %.0f/%.0f%s", ev->text, ev->done, ev->total, ev->done >= ev->total ? "\n" : "\r");
        else if (ev->total > 0 && ev->done >= ev->total)
            fprintf(stderr, "%s: %.0f/%.0f\n", ev->text, ev->done, ev->total);
        break;
    case SP_EV_TOKEN:
        break; /* generate streams tokens itself */
    case SP_EV_ERROR:
        fprintf(stderr, "sepal: %s\n", ev->text);
        break;
    case SP_EV_RETRY:
        fprintf(stderr, "sepal: %s\n", ev->text);
        break;
    case SP_EV_ROUTE: /* the route command prints the route; a re-route is news */
        if (ev->row)
            fprintf(stderr, "re-routed: %s\n", ev->text);
        break;
    default:
        fprintf(stderr, "%s\n", ev->text);
    }
}

/* The app's runtime, created on first use, with the current settings. */
sp_runtime *sp_app_runtime(sp_app *app);
sp_runtime *sp_app_runtime(sp_app *app)
{
    if (!app->rt) {
        sp_err err = {0};
        if (sp_runtime_new(&app->rt, print_event, app, &err))
            sp_app_error(app, "%s", err.msg);
    }
    if (app->rt) {
        sp_rt_settings *set = &app->rt->set;
        pthread_mutex_lock(&app->rt->lock);
        set->max_retries = (int)sp_app_num(app, "max-retries");
        set->step_timeout_s = sp_app_num(app, "step-timeout");
        snprintf(set->allowed, sizeof set->allowed, "%s", sp_app_get(app, "allowed-servers"));
        snprintf(set->blocked, sizeof set->blocked, "%s", sp_app_get(app, "blocked-servers"));
        pthread_mutex_unlock(&app->rt->lock);
        const char *key = sp_app_get(app, "swarm-key");
        sp_err err = {0};
        if (strcmp(key, app->rt->key_path) && sp_runtime_set_swarm_key(app->rt, key, &err)) {
            sp_app_error(app, "%s", err.msg);
            sp_app_set(app, "swarm-key", app->rt->key_path); /* the key in use stays */
            return NULL;
        }
    }
    return app->rt;
}

static int cmd_load(sp_app *app, int argc, char **argv)
{
    if (argc != 2)
        return sp_app_error(app, "usage: load DIR");
    sp_runtime *rt = sp_app_runtime(app);
    sp_err err = {0};
    if (!rt || sp_runtime_load(rt, argv[1], &err))
        return sp_app_error(app, "%s", err.msg);
    if (rt->nservers && sp_runtime_route(rt, &err))
        fprintf(stderr, "sepal: note: %s\n", err.msg);
    return 0;
}

static int cmd_swarm(sp_app *app, int argc, char **argv)
{
    sp_runtime *rt = sp_app_runtime(app);
    sp_err err = {0};
    if (!rt)
        return 1;
    if (argc == 2 && !strcmp(argv[1], "down")) {
        sp_runtime_swarm_down(rt);
        return 0;
    }
    if (argc < 3 || strcmp(argv[1], "up"))
        return sp_app_error(app, "usage: swarm up N [--blocks-per-server K] | swarm down");
    long n, k = (long)sp_app_num(app, "blocks-per-server");
    if (cli_parse_int("swarm up N", argv[2], 1, 256, &n))
        return 1;
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--blocks-per-server") && i + 1 < argc) {
            if (cli_parse_int(argv[i], argv[i + 1], 1, 1 << 20, &k))
                return 1;
            i++;
        } else {
            return sp_app_error(app, "swarm up: unknown option '%s'", argv[i]);
        }
    }
    if (sp_runtime_swarm_up(rt, (int)n, (int)k, &err))
        return sp_app_error(app, "%s", err.msg);
    return 0;
}

static int cmd_connect(sp_app *app, int argc, char **argv)
{
    const char *usage = "usage: connect [--swarm-key FILE] HOST:PORT[,HOST:PORT...] | "
                        "connect [--swarm-key FILE] --initial-peers HOST:PORT[,...]";
    const char *peers = NULL, *addrs = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--swarm-key") && i + 1 < argc) {
            if (sp_app_set(app, "swarm-key", argv[++i])) /* the setting: later commands keep the key */
                return sp_app_error(app, "connect: bad --swarm-key '%s'", argv[i]);
        } else if (!strcmp(argv[i], "--initial-peers") && i + 1 < argc && !peers && !addrs) {
            peers = argv[++i];
        } else if (argv[i][0] != '-' && !peers && !addrs) {
            addrs = argv[i];
        } else {
            return sp_app_error(app, "%s", usage);
        }
    }
    if (!peers && !addrs)
        return sp_app_error(app, "%s", usage);
    sp_runtime *rt = sp_app_runtime(app);
    sp_err err = {0};
    if (!rt)
        return 1;
    if (peers ? sp_runtime_join(rt, peers, &err) : sp_runtime_connect(rt, addrs, &err))
        return sp_app_error(app, "%s", err.msg);
    return 0;
}

/* "0.8 ms", "-" when unknown, "unreachable" */
static void fmt_rtt(char *buf, size_t cap, double rtt)
{
    if (rtt < 0)
        snprintf(buf, cap, "-");
    else if (isinf(rtt))
        snprintf(buf, cap, "unreachable");
    else
        snprintf(buf, cap, "%.1f ms", rtt * 1e3);
}

static void print_server(const sp_runtime *rt, const sp_server_entry *e, double now)
{
    const sp_server_record *r = &e->rec;
    char addr[96], span[32], rtt[32], pings[32], state[32];
    snprintf(addr, sizeof addr, "%s:%d", r->host, r->port);
    snprintf(span, sizeof span, "%d:%d", r->start, r->end);
    fmt_rtt(rtt, sizeof rtt, e->rtt);
    double best = -1;
    for (int i = 0; i < r->npings; i++)
        if (best < 0 || r->pings[i].rtt < best)
            best = r->pings[i].rtt;
    if (r->npings)
        snprintf(pings, sizeof pings, "%d, %.1f ms", r->npings, best * 1e3);
    else
        snprintf(pings, sizeof pings, "-");
    if (e->banned_until > now)
        snprintf(state, sizeof state, "banned %.0fs", e->banned_until - now);
    else
        snprintf(state, sizeof state, "%s", sp_server_state_name(r->state));
    printf("%-8.8s %-12.12s %-21s %-7s %-11s %9.0f %9.1f %9.0f %9.0f %-4s %9ld %-13s %-8s %-6s%s\n", r->id,
           r->name[0] ? r->name : "-", addr, span, state, r->throughput, r->inference_rps, r->forward_rps,
           r->network_rps, r->dtype, r->cache_tokens_left, pings, rtt, r->version, e->pid > 0 ? " (local)" : "");
    (void)rt;
}

static int cmd_servers(sp_app *app, int argc, char **argv)
{
    (void)argc;
    (void)argv;
    sp_runtime *rt = sp_app_runtime(app);
    if (!rt)
        return 1;
    sp_runtime_refresh(rt);
    printf("%-8s %-12s %-21s %-7s %-11s %9s %9s %9s %9s %-4s %9s %-13s %-8s %-6s\n", "id", "name", "address", "blocks",
           "state", "tok/s", "inf rps", "fwd rps", "net rps", "type", "cache", "next pings", "ping", "version");
    int shown = 0;
    double now = sp_now_s();
    pthread_mutex_lock(&rt->lock);
    for (int i = 0; i < rt->nservers; i++)
        if (!rt->servers[i]->gone) {
            print_server(rt, rt->servers[i], now);
            shown++;
        }
    pthread_mutex_unlock(&rt->lock);
    if (!shown)
        printf("(no servers: swarm up N, connect --initial-peers HOST:PORT, or connect HOST:PORT)\n");
    return 0;
}

static int cmd_models(sp_app *app, int argc, char **argv)
{
    (void)argc;
    (void)argv;
    sp_runtime *rt = sp_app_runtime(app);
    if (!rt)
        return 1;
    if (!rt->dht)
        return sp_app_error(app, "not in a swarm (swarm up N, or connect --initial-peers HOST:PORT)");
    sp_model_record *m = NULL;
    int n = sp_runtime_models(rt, &m);
    printf("%-24s %7s %7s %-18s %s\n", "model", "blocks", "hidden", "config", "architecture");
    for (int i = 0; i < n; i++)
        printf("%-24s %7d %7d %016llx   %s%s\n", m[i].model, m[i].num_blocks, m[i].hidden,
               (unsigned long long)m[i].config_hash, m[i].architecture,
               rt->local && !strcmp(m[i].model, rt->model_prefix) ? " (loaded)" : "");
    if (!n)
        printf("(no models announced yet)\n");
    free(m);
    return 0;
}

static int cmd_route(sp_app *app, int argc, char **argv)
{
    (void)argc;
    (void)argv;
    sp_runtime *rt = sp_app_runtime(app);
    sp_err err = {0};
    if (!rt)
        return 1;
    if (!rt->local)
        return sp_app_error(app, "no model loaded (load DIR first)");
    sp_route r;
    if (sp_runtime_route_inference(rt, 0, rt->local->cfg.n_layers, 0, &r, &err))
        return sp_app_error(app, "%s", err.msg);
    char text[4096];
    sp_runtime_route_text(rt, &r, text, sizeof text);
    printf("%s\n", text);
    return 0;
}

const sp_cmd sp_cmds_swarm[] = {
    {"load", NULL, "DIR", "load a model's local parts (embeddings, norm, head, tokenizer)",
     "Reads config.json, the tokenizer and only the embeddings, final norm and LM head of the Hugging Face\n"
     "model in DIR. The blocks are served by the swarm.",
     cmd_load},
    {"swarm", NULL, "up N [--blocks-per-server K] | down", "start or stop a local swarm of sepal-server processes",
     "swarm up N starts N sepal-server processes on free 127.0.0.1 ports as a real swarm: the first starts it\n"
     "(its DHT node), the others and this app join through it, and each server chooses its blocks where the\n"
     "swarm needs them (an even split, or K each with --blocks-per-server or the blocks-per-server setting;\n"
     "N x K above the model's blocks gives redundancy). It waits until all serve.\n"
     "swarm down stops them (each announces OFFLINE) and leaves the swarm.",
     cmd_swarm},
    {"connect", NULL, "[--swarm-key FILE] HOST:PORT[,...] | [--swarm-key FILE] --initial-peers HOST:PORT[,...]",
     "join a swarm, or use servers by address",
     "connect --initial-peers HOST:PORT,... joins a swarm through its DHT nodes (any server's DHT port): a DHT\n"
     "node of this app's own keeps a live view of the loaded model's servers, and routing picks among them.\n"
     "connect HOST:PORT,... uses servers by their websocket address, without the DHT.\n"
     "--swarm-key FILE joins a private swarm (it sets the swarm-key setting): every connection proves the key\n"
     "both ways before anything else, and DHT records without its tag are dropped. swarm up then starts its\n"
     "servers with the key too.",
     cmd_connect},
    {"servers", NULL, "", "the servers: id, name, address, blocks, state, throughput, rps, cache, pings, version",
     "One row per server: its id (and public name), websocket address, blocks, state (online, joining,\n"
     "offline, banned), throughput (tokens/s per block it offers), inference / forward / network rps,\n"
     "precision, cache left (positions a session over its span can get), its pings to its successors\n"
     "(count, best), this app's ping to it, and its version.",
     cmd_servers},
    {"models", NULL, "", "the models announced in the swarm", NULL, cmd_models},
    {"route", NULL, "", "the chain of servers the next generation uses, with each hop's expected latency",
     "The min-latency route (Petals' Dijkstra over the servers' spans, pings, speeds and cache left) over\n"
     "every block, each hop's expected time per step, and the steps/s it predicts. Training routes are\n"
     "drawn per sub-batch at random, weighted by the servers' throughput.",
     cmd_route},
    {NULL, NULL, NULL, NULL, NULL, NULL},
};
