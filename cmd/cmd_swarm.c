/* cmd_swarm.c - load, swarm up/down, connect, servers, models, route: the command side of the client
 * runtime. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "proto.h" /* SP_CAP_*: what a server says it can do */
#include "runtime.h"
#include "table.h"
#include "timeutil.h"

enum { UP_BLOCKS_PER_SERVER, UP_THREADS, UP_NOPTS };
enum { SERVERS_LONG, SERVERS_NOPTS };
enum { CONNECT_INITIAL_PEERS, CONNECT_SWARM_KEY, CONNECT_NOPTS };

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
    long k = (long)sp_arg_int(app, a, UP_BLOCKS_PER_SERVER);
    sp_runtime_swarm_threads(rt, (int)sp_arg_int(app, a, UP_THREADS));
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
    if (!sp_runtime_swarm_started(rt))
        return sp_app_error(app, "swarm down: no swarm was started here (swarm up N starts one)");
    sp_runtime_swarm_down(rt);
    return 0;
}

static int cmd_connect(sp_app *app, const sp_args *a)
{
    const char *peers = sp_arg(app, a, CONNECT_INITIAL_PEERS), *key = sp_arg(app, a, CONNECT_SWARM_KEY);
    if (!peers == !a->npos)
        return sp_app_error(app, "usage: connect [--swarm-key FILE] HOST:PORT[,...] | "
                                 "connect [--swarm-key FILE] --initial-peers HOST:PORT[,...]");
    char why[256];
    /* the setting: later connections keep it */
    if (sp_arg_given(a, CONNECT_SWARM_KEY) && sp_app_set(app, SP_SET_SWARM_KEY, key, why, sizeof why))
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

/* The `servers` table's columns; the least important are dropped first where the output is narrow. */
enum { SC_ID, SC_NAME, SC_ADDR, SC_BLOCKS, SC_STATE, SC_TPUT, SC_INF, SC_FWD, SC_NET, SC_TYPE, SC_CACHE, SC_PINGS,
       SC_PING, SC_VERSION, SC_N };
static const sp_col SERVER_COLS[SC_N] = {
    [SC_ID] = {"id", 8, 8, 0, 100},         [SC_NAME] = {"name", 4, 12, 0, 40},
    [SC_ADDR] = {"address", 0, 0, 0, 75},   [SC_BLOCKS] = {"blocks", 0, 0, 0, 95},
    [SC_STATE] = {"state", 0, 0, 0, 85},    [SC_TPUT] = {"tok/s", 0, 0, 1, 80},
    [SC_INF] = {"inf rps", 0, 0, 1, 30},    [SC_FWD] = {"fwd rps", 0, 0, 1, 25},
    [SC_NET] = {"net rps", 0, 0, 1, 20},    [SC_TYPE] = {"type", 0, 0, 0, 50},
    [SC_CACHE] = {"cache", 0, 0, 1, 60},    [SC_PINGS] = {"next pings", 0, 0, 0, 35},
    [SC_PING] = {"ping", 0, 0, 1, 55},      [SC_VERSION] = {"version", 0, 0, 0, 10},
};

typedef struct server_cells {
    char text[SC_N][112];
} server_cells;

static void server_row(const sp_server_row *e, double now, server_cells *out)
{
    const sp_server_record *r = &e->rec;
    char(*t)[112] = out->text;
    snprintf(t[SC_ID], sizeof t[SC_ID], "%s", r->id);
    snprintf(t[SC_NAME], sizeof t[SC_NAME], "%s", sp_server_shown_name(r->name, e->pid > 0));
    snprintf(t[SC_ADDR], sizeof t[SC_ADDR], "%s:%d", r->host, r->port);
    snprintf(t[SC_BLOCKS], sizeof t[SC_BLOCKS], "%d:%d", r->start, r->end);
    if (e->banned_until > now)
        snprintf(t[SC_STATE], sizeof t[SC_STATE], "banned %.0fs", e->banned_until - now);
    else if (e->busy_until > now)
        snprintf(t[SC_STATE], sizeof t[SC_STATE], "busy %.0fs", e->busy_until - now);
    else if (sp_record_saturated(r))
        snprintf(t[SC_STATE], sizeof t[SC_STATE], "busy");
    else
        snprintf(t[SC_STATE], sizeof t[SC_STATE], "%s", sp_server_state_name(r->state));
    snprintf(t[SC_TPUT], sizeof t[SC_TPUT], "%.0f", r->throughput);
    snprintf(t[SC_INF], sizeof t[SC_INF], "%.1f", r->inference_rps);
    snprintf(t[SC_FWD], sizeof t[SC_FWD], "%.0f", r->forward_rps);
    snprintf(t[SC_NET], sizeof t[SC_NET], "%.0f", r->network_rps);
    const char *gpu = r->device[0] && strcmp(r->device, "cpu") ? r->device : NULL; /* "bf16 cuda:0" (the name: --long) */
    snprintf(t[SC_TYPE], sizeof t[SC_TYPE], "%s%s%.*s", r->dtype[0] ? r->dtype : "-", gpu ? " " : "",
             gpu ? (int)strcspn(gpu, " ") : 0, gpu ? gpu : "");
    if (r->cache_tokens_left >= 0)
        snprintf(t[SC_CACHE], sizeof t[SC_CACHE], "%ld", r->cache_tokens_left);
    else
        snprintf(t[SC_CACHE], sizeof t[SC_CACHE], "-");
    double best = -1;
    for (int i = 0; i < r->npings; i++)
        if (best < 0 || r->pings[i].rtt < best)
            best = r->pings[i].rtt;
    char best_s[32];
    fmt_rtt(best_s, sizeof best_s, best);
    if (r->npings)
        snprintf(t[SC_PINGS], sizeof t[SC_PINGS], "%d, %s", r->npings, best_s);
    else
        snprintf(t[SC_PINGS], sizeof t[SC_PINGS], "-");
    fmt_rtt(t[SC_PING], sizeof t[SC_PING], e->rtt);
    snprintf(t[SC_VERSION], sizeof t[SC_VERSION], "%s", r->version[0] ? r->version : "-");
}

/* What a server says it can take pushed (its caps, less those it refused): servers --long's push line. */
static const char *push_caps(int caps, int refused)
{
    int both = SP_CAP_STEP_PUSH | SP_CAP_SPAN_PUSH;
    if ((caps & both) == both)
        return "steps and training passes";
    if (caps & SP_CAP_STEP_PUSH)
        return refused ? "steps (training passes refused: an older server)" : "steps";
    if (caps & SP_CAP_SPAN_PUSH)
        return refused ? "training passes (steps refused: an older server)" : "training passes";
    return refused ? "none (refused: an older server)" : "none (it says no capabilities: an older server)";
}

/* servers --long: every field of server i's record (of the n rows), one per line, nothing cut. */
static void server_long(sp_app *app, const sp_server_row *rows, int n, int i, double now, double wall)
{
    const sp_server_row *e = &rows[i];
    const sp_server_record *r = &e->rec;
    char rtt[32], state[64];
    sp_out(app, "server %s%s\n", r->id, e->pid > 0 ? " (local: started by swarm up)" : "");
    sp_out(app, "  name        %s%s\n", sp_server_shown_name(r->name, e->pid > 0), r->name[0] ? "" : " (no --public-name)");
    sp_out(app, "  address     ws://%s:%d\n", r->host, r->port);
    sp_out(app, "  dht node    %s\n", r->dht[0] ? r->dht : "-");
    sp_out(app, "  model       %s (config %016llx, %d blocks)\n", r->model[0] ? r->model : "-",
           (unsigned long long)r->config_hash, r->num_blocks);
    sp_out(app, "  blocks      %d:%d (%d)\n", r->start, r->end, r->end - r->start);
    if (e->banned_until > now)
        snprintf(state, sizeof state, ", banned for %.0f s more (%d failures)", e->banned_until - now, e->failures);
    else if (e->busy_until > now)
        snprintf(state, sizeof state, ", busy (refused a session) for %.0f s more", e->busy_until - now);
    else
        state[0] = '\0';
    sp_out(app, "  state       %s%s\n", sp_server_state_name(r->state), state);
    sp_out(app, "  throughput  %.1f tokens/s per block\n", r->throughput);
    sp_out(app, "  rps         inference %.1f steps/s, forward %.1f tokens/s, network %.1f tokens/s\n",
           r->inference_rps, r->forward_rps, r->network_rps);
    sp_out(app, "  dtype       %s\n", r->dtype[0] ? r->dtype : "-");
    sp_out(app, "  quant       %s\n", r->quant[0] ? r->quant : "none");
    sp_out(app, "  device      %s\n", r->device[0] ? r->device : "cpu");
    if (r->cache_tokens_left >= 0)
        sp_out(app, "  cache left  %ld tokens\n", r->cache_tokens_left);
    else
        sp_out(app, "  cache left  -\n");
    if (r->max_queue_wait > 0)
        sp_out(app, "  queue wait  %.3g s (new sessions refused over %g s)%s\n", r->queue_wait, r->max_queue_wait,
               r->queue_wait > r->max_queue_wait ? ": saturated" : "");
    else
        sp_out(app, "  queue wait  %.3g s\n", r->queue_wait);
    sp_out(app, "  push        %s\n", push_caps(r->caps & ~e->refused_caps, e->refused_caps));
    if (!r->npings)
        sp_out(app, "  next pings  none\n");
    for (int p = 0; p < r->npings; p++) {
        char who[96] = "";
        for (int j = 0; j < n; j++)
            if (!strcmp(rows[j].rec.id, r->pings[p].id)) {
                const sp_server_record *x = &rows[j].rec;
                snprintf(who, sizeof who, " (%s:%d, blocks %d:%d)", x->host, x->port, x->start, x->end);
            }
        fmt_rtt(rtt, sizeof rtt, r->pings[p].rtt);
        sp_out(app, "  %-11s %s %s%s\n", p ? "" : "next pings", r->pings[p].id, rtt, who);
    }
    fmt_rtt(rtt, sizeof rtt, e->rtt);
    sp_out(app, "  ping        %s (from this app)\n", rtt);
    if (e->link_mbit > 0 || e->link_up_mbit > 0) {
        char up[32] = "-", down[32] = "-";
        if (e->link_up_mbit > 0)
            snprintf(up, sizeof up, "%.1f Mbit/s", e->link_up_mbit);
        if (e->link_mbit > 0)
            snprintf(down, sizeof down, "%.1f Mbit/s", e->link_mbit);
        sp_out(app, "  link        to it %s, from it %s (measured on large messages; -: none yet): wire auto "
               "sends %s, asks for %s back\n", up, down, sp_encoding_name(e->wire_auto),
               sp_encoding_name(e->wire_auto_back));
    } else {
        sp_out(app, "  link        - (no large message measured yet): wire auto sends f32\n");
    }
    sp_out(app, "  version     %s\n", r->version[0] ? r->version : "-");
    if (e->from_dht && r->timestamp > 0)
        sp_out(app, "  announced   %.1f s ago (every %.0f s)\n", wall - r->timestamp, r->period);
    else
        sp_out(app, "  announced   - (connected by address, not through the DHT)\n");
}

/* Servers to show: not gone, and of a restarted server (the same address under a new id) the newest record. */
static int server_shown(const sp_server_row *rows, int n, int i)
{
    const sp_server_row *e = &rows[i];
    if (e->gone)
        return 0;
    for (int j = 0; j < n; j++)
        if (j != i && !rows[j].gone && rows[j].rec.port == e->rec.port && !strcmp(rows[j].rec.host, e->rec.host) &&
            rows[j].rec.timestamp > e->rec.timestamp)
            return 0;
    return 1;
}

static int cmd_servers(sp_app *app, const sp_args *a)
{
    sp_runtime *rt = sp_app_runtime(app);
    if (!rt)
        return 1;
    int lng = sp_arg_given(a, SERVERS_LONG), shown = 0;
    sp_runtime_refresh(rt);
    double now = sp_runtime_now(rt), wall = sp_wall_s();
    sp_server_row *rows = NULL;
    int n = sp_runtime_servers(rt, &rows);
    server_cells *cells = n > 0 ? calloc((size_t)n, sizeof *cells) : NULL;
    const char **ptr = n > 0 ? calloc((size_t)n * SC_N, sizeof *ptr) : NULL;
    if (n < 0 || (n > 0 && (!cells || !ptr))) {
        free(rows);
        free(cells);
        free(ptr);
        return sp_app_error(app, "servers: out of memory");
    }
    for (int i = 0; i < n; i++) {
        if (!server_shown(rows, n, i))
            continue;
        if (lng) {
            if (shown)
                sp_out(app, "\n");
            server_long(app, rows, n, i, now, wall);
        } else {
            server_row(&rows[i], now, &cells[shown]);
            for (int c = 0; c < SC_N; c++)
                ptr[(size_t)shown * SC_N + (size_t)c] = cells[shown].text[c];
        }
        shown++;
    }
    if (!lng)
        sp_table_out(app, SERVER_COLS, SC_N, ptr, shown, sp_app_columns(app));
    free(rows);
    free(cells);
    free(ptr);
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
    if (!sp_runtime_in_swarm(rt))
        return sp_app_error(app, "models: not in a swarm (swarm up N, or connect --initial-peers HOST:PORT)");
    sp_model_record *m = NULL;
    int n = sp_runtime_models(rt, &m);
    sp_out(app, "%-24s %7s %7s %-18s %s\n", "model", "blocks", "hidden", "config", "architecture");
    for (int i = 0; i < n; i++)
        sp_out(app, "%-24s %7d %7d %016llx   %s%s\n", m[i].model, m[i].num_blocks, m[i].hidden,
               (unsigned long long)m[i].config_hash, m[i].architecture,
               sp_runtime_config(rt) && !strcmp(m[i].model, sp_runtime_model_name(rt)) ? " (loaded)" : "");
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
    const sp_config *c = sp_runtime_config(rt);
    if (!c)
        return sp_app_error(app, "route: no model loaded (load DIR first)");
    sp_route r;
    if (sp_runtime_route_inference(rt, 0, c->n_layers, 0, &r, &err))
        return sp_app_error(app, "route: %s", err.msg);
    char text[4096];
    sp_runtime_route_text(rt, &r, text, sizeof text);
    sp_out(app, "%s\n", text);
    sp_runtime_note_route(rt, &r); /* the TUI's route panel shows the same figures */
    return 0;
}

static const sp_opt swarm_up_opts[] = {
    [UP_BLOCKS_PER_SERVER] = {"--blocks-per-server", .meta = "K", SP_SETTING(SP_SET_BLOCKS_PER_SERVER),
                              .help = "blocks each server holds (N x K above the model's blocks gives redundancy); 0 "
                                      "is an even split"},
    [UP_THREADS] = {"--threads", SP_OPT_INT, "T", 0, 256, .def = "0",
                    .help = "compute threads of each server (sepal-server --threads); 0: every CPU, each server's"},
    [UP_NOPTS] = {0},
};

static const sp_cmd swarm_subs[] = {
    {.name = "up", .args = "N", .min_pos = 1, .max_pos = 1, SP_OPTS(swarm_up_opts),
     .summary = "start N sepal-server processes on 127.0.0.1 as a real swarm, and join it",
     .help = "The first server starts the swarm (its DHT node), the others and this app join through it, and each "
             "server chooses its blocks where the swarm needs them: an even split, or K each. It waits until all "
             "serve. Ctrl-C stops it and the servers it started. A second `swarm up` is refused while one is up. "
             "Server I writes its log to $TMPDIR/sepal-swarm-PID-I.log (TMPDIR: /tmp when unset; PID: this "
             "app's), removed by `swarm down` and kept when the server dies (the message names it).",
     .examples = "swarm up 3\nswarm up 4 --blocks-per-server 3\nswarm up 2 --threads 1", .fn = cmd_swarm_up},
    {.name = "down", .args = "", .max_pos = 0, .summary = "stop the servers of swarm up (each announces OFFLINE)",
     .examples = "swarm down", .fn = cmd_swarm_down},
    {0},
};

static const sp_opt servers_opts[] = {
    [SERVERS_LONG] = {"--long", SP_OPT_FLAG, .short_name = "-l",
                      .help = "every field of each record, one per line, nothing cut"},
    [SERVERS_NOPTS] = {0},
};

static const sp_opt connect_opts[] = {
    [CONNECT_INITIAL_PEERS] = {"--initial-peers", SP_OPT_STR, "HOST:PORT[,...]",
                               .help = "join a swarm through these DHT nodes (any server's DHT port)"},
    [CONNECT_SWARM_KEY] = {"--swarm-key", .meta = "FILE", SP_SETTING(SP_SET_SWARM_KEY),
                           .help = "a private swarm's key (sepal-server --gen-swarm-key FILE); it becomes the "
                                   "swarm-key setting"},
    [CONNECT_NOPTS] = {0},
};

const sp_cmd sp_cmds_swarm[] = {
    {.name = "load", .args = "DIR", .min_pos = 1, .max_pos = 1, .pos_paths = 1,
     .summary = "load a model's local parts (embeddings, final norm, head, tokenizer)",
     .help = "Reads config.json, the tokenizer and only the embeddings, final norm and LM head of the Hugging Face "
             "model in DIR (a leading ~ is your home). The blocks are served by the swarm.",
     .examples = "load ~/.cache/sepal/models/stories15M", .fn = cmd_load},
    {.name = "swarm", .args = "up N | down", .subs = swarm_subs,
     .summary = "start or stop a local swarm of sepal-server processes"},
    {.name = "connect", .args = "[HOST:PORT[,...]]", .max_pos = 1, SP_OPTS(connect_opts),
     .summary = "join a swarm, or use servers by address",
     .help = "connect --initial-peers HOST:PORT,... joins a swarm through its DHT nodes (any server's DHT port): a "
             "DHT node of this app's own keeps a live view of the loaded model's servers, and routing picks among "
             "them. connect HOST:PORT,... (or ws://HOST:PORT) uses servers by their websocket address, without "
             "the DHT; a server of another model is refused. --swarm-key FILE joins a private swarm: every "
             "connection proves the key both ways and only DHT records sealed with it are read.",
     .examples = "connect --initial-peers 127.0.0.1:31330\nconnect 127.0.0.1:31330", .fn = cmd_connect},
    {.name = "servers", .args = "", .max_pos = 0, SP_OPTS(servers_opts),
     .summary = "the servers: id, name, address, blocks, state, throughput, rps, cache, pings, version",
     .help = "One row per server: its id, public name (`local` for a server of swarm up without one), websocket "
             "address, blocks, state (online, joining, offline, banned), throughput (tokens/s per block it "
             "offers), inference / forward / network rps, precision, cache left (positions a session over its "
             "span can get), its pings to its successors (count, best), this app's ping to it, and its version. "
             "Ids are cut to 8 characters, names to 12. On a terminal the table fits its width ($COLUMNS when "
             "set; the log's in the TUI), the least important columns left out first (version, net, fwd and inf "
             "rps, next pings, name, type, ping, cache); into a file or a pipe every column is written. "
             "--long (-l) shows every field of each server's record instead, nothing cut: the full id, name, "
             "address, DHT node, model, blocks, state (and ban), throughput, the three rps, dtype, quantisation, "
             "cache left, each of its next-hop pings, this app's ping, version, and how long ago it announced.",
     .examples = "servers\nservers -l", .fn = cmd_servers},
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
