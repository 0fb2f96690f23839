/* main.c - sepal-server: serve a span of a model's blocks until SIGINT/SIGTERM.
 *
 * Alone (--blocks A:B, no DHT options) it serves a fixed span to clients that know its address. In a swarm
 * (--new-swarm, or --initial-peers HOST:PORT,...) it also runs a DHT node and announces itself: JOINING
 * while it loads, ONLINE once it serves, OFFLINE when it stops. With --num-blocks N instead of --blocks it
 * chooses the N blocks that most raise the swarm's throughput (Petals' block selection, server/blocksel.h),
 * and every balance period it checks whether moving would raise the swarm's throughput by more than the
 * balance quality allows; if so it announces OFFLINE, stops serving (clients re-route and replay), and
 * serves its new span. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "announce.h"
#include "blocksel.h"
#include "config.h"
#include "http.h"
#include "kern.h"
#include "log.h"
#include "blastune.h"
#include "memtune.h"
#include "opt.h"
#include "opts.h"
#include "rng.h"
#include "server.h"
#include "timeutil.h"

#include "version.h"

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

typedef struct args {
    sp_server_opts so;
    int num_blocks;           /* > 0: choose the span */
    int have_blocks;
    int new_swarm;
    const char *initial_peers;
    int dht_port;             /* -1: the websocket port */
    double update_period;     /* announcements */
    double balance_period;    /* mean seconds between balance checks (0: never) */
    double balance_quality;
    double selection_delay;   /* mean seconds to wait before choosing blocks */
    double bandwidth_mbit;    /* the network's rate, for the announced network_rps */
    const char *swarm_key;    /* --swarm-key FILE */
    const char *gen_swarm_key;/* --gen-swarm-key FILE: write one and exit */
    double mib[4];            /* --input-budget, --input-budget-per-conn, --input-budget-per-ip, --output-bound */
    double min_rate_kib;      /* --min-rate (KiB/s; 0: none); < 0: the default */
    char announce_host[64];   /* --announce HOST[:PORT]: where clients reach it ("": --host) */
    int announce_port;        /* 0: its own websocket port */
    char metrics_host[256];   /* --metrics HOST:PORT ("": none) */
    int metrics_port;
} args;

static void print_line(void *user, const char *line) { fprintf(user, "%s\n", line); }

static void usage(FILE *f)
{
    fprintf(f, "usage: sepal-server --model DIR (--blocks A:B | --num-blocks N) [options]\n\n");
    sp_opt_help(sp_server_opt_table, 110, print_line, f);
}

static int parse_blocks(const char *v, args *a)
{
    int s, e = -1, n = 0;
    if (!v || (sscanf(v, "%d:%n", &s, &n) < 1 || n == 0) || s < 0) {
        fprintf(stderr, "sepal-server: --blocks: expected A:B, got '%s'\n", v ? v : "");
        return -1;
    }
    if (v[n] && (sscanf(v + n, "%d", &e) != 1 || e <= s)) {
        fprintf(stderr, "sepal-server: --blocks: expected A:B with B > A, got '%s'\n", v);
        return -1;
    }
    a->so.start = s;
    a->so.end = e;
    a->have_blocks = 1;
    return 0;
}

/* --announce HOST[:PORT] (the last colon: a host name or an IPv4 address). */
static int parse_announce(const char *v, args *a)
{
    const char *colon = strrchr(v, ':');
    size_t hl = colon ? (size_t)(colon - v) : strlen(v);
    int port = 0, n = 0;
    if (hl == 0 || hl >= sizeof a->announce_host ||
        (colon && (sscanf(colon + 1, "%d%n", &port, &n) != 1 || colon[1 + n] || port < 1 || port > 65535))) {
        fprintf(stderr, "sepal-server: --announce: expected HOST or HOST:PORT (a port in 1..65535, a host of at most "
                "%zu characters), got '%s'\n", sizeof a->announce_host - 1, v);
        return -1;
    }
    memcpy(a->announce_host, v, hl);
    a->announce_host[hl] = '\0';
    a->announce_port = port;
    return 0;
}

static int parse_metrics(const char *v, args *a)
{
    sp_err err = {0};
    if (!sp_http_parse_listen(v, a->metrics_host, sizeof a->metrics_host, &a->metrics_port, &err))
        return 0;
    fprintf(stderr, "sepal-server: --metrics: %s\n", err.msg);
    return -1;
}

static int parse_device(const char *v)
{
    sp_err err = {0};
    int gpu;
    if (!sp_device_parse(v, &gpu, &err))
        return 0;
    fprintf(stderr, "sepal-server: --device: %s\n", err.msg);
    return -1;
}

/* --device cuda[:N] before anything starts: a GPU there; 2 after a message. */
static int check_device(const sp_server_opts *o)
{
    sp_err err = {0};
    if (o->device < 0 || sp_device_probe(o->device, &err) == SP_OK)
        return 0;
    fprintf(stderr, "sepal-server: --device cuda:%d: %s\n", o->device, err.msg);
    return 2;
}

/* --device cuda in a sepal-server built without CUDA: sepal-server-cuda beside it takes over (the same arguments),
 * when it is there; else this one goes on (and says there is no usable GPU). */
static void hand_over_to_cuda(const sp_server_opts *o, char **argv)
{
    char path[4096];
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 32);
    if (o->device < 0 || sp_server_has_cuda() || n <= 0)
        return;
    path[n] = '\0';
    char *slash = strrchr(path, '/');
    snprintf(slash ? slash + 1 : path, 32, "sepal-server-cuda");
    if (access(path, X_OK) == 0)
        execv(path, argv);
}

/* Where option k's value goes (v: given, or the row's default); -1 after a message. */
static int take(args *a, int k, const char *v)
{
    if (!sp_server_opt_take(&a->so, k, v))
        return 0;
    switch (k) {
    case S_BLOCKS: return parse_blocks(v, a);
    case S_NUM_BLOCKS: a->num_blocks = (int)sp_opt_int(v); break;
    case S_ANNOUNCE: return parse_announce(v, a);
    case S_METRICS: return parse_metrics(v, a);
    case S_DEVICE: return parse_device(v);
    case S_NEW_SWARM: a->new_swarm = 1; break;
    case S_INITIAL_PEERS: a->initial_peers = v; break;
    case S_DHT_PORT: a->dht_port = (int)sp_opt_int(v); break;
    case S_UPDATE_PERIOD: a->update_period = sp_opt_num(v); break;
    case S_BALANCE_PERIOD: a->balance_period = sp_opt_num(v); break;
    case S_BALANCE_QUALITY: a->balance_quality = sp_opt_num(v); break;
    case S_SELECTION_DELAY: a->selection_delay = sp_opt_num(v); break;
    case S_BANDWIDTH: a->bandwidth_mbit = sp_opt_num(v); break;
    case S_SWARM_KEY: a->swarm_key = v; break;
    case S_GEN_SWARM_KEY: a->gen_swarm_key = v; break;
    case S_INPUT_BUDGET: a->mib[0] = sp_opt_num(v); break;
    case S_INPUT_BUDGET_CONN: a->mib[1] = sp_opt_num(v); break;
    case S_INPUT_BUDGET_IP: a->mib[2] = sp_opt_num(v); break;
    case S_OUTPUT_BOUND: a->mib[3] = sp_opt_num(v); break;
    case S_MIN_RATE: a->min_rate_kib = sp_opt_num(v); break;
    case S_VERBOSE: sp_log_set_level(SP_LOG_DEBUG); break;
    default: break;
    }
    return 0;
}

/* Options in MiB and KiB/s into the server's limits. */
static void apply_units(args *a)
{
    sp_server_limits *l = &a->so.limits;
    uint64_t *dst[4] = {&l->input_budget, &l->input_budget_conn, &l->input_budget_ip, &l->output_bound};
    for (int i = 0; i < 4; i++)
        if (a->mib[i] > 0)
            *dst[i] = (uint64_t)(a->mib[i] * 1048576.0);
    if (a->min_rate_kib >= 0)
        l->min_rate = a->min_rate_kib > 0 ? a->min_rate_kib * 1024.0 : -1;
}

static int check_args(const args *a)
{
    const char *why = NULL;
    if (a->gen_swarm_key)
        return 0;
    if (!a->so.model_dir)
        why = "--model DIR is required";
    else if (a->have_blocks == (a->num_blocks > 0))
        why = "give either --blocks A:B or --num-blocks N";
    else if (a->new_swarm && a->initial_peers)
        why = "--new-swarm and --initial-peers exclude each other";
    else if (a->num_blocks > 0 && !a->new_swarm && !a->initial_peers)
        why = "--num-blocks chooses blocks in a swarm: add --new-swarm or --initial-peers HOST:PORT";
    else if (a->so.public_bulk_port && !a->announce_host[0])
        why = "--announce-bulk-port goes with --announce HOST:PORT";
    else if (a->announce_port && (a->so.port == 0 || a->announce_port != a->so.port) && a->so.bulk_port != -1 &&
             !a->so.public_bulk_port)
        why = "--announce HOST:PORT moves the websocket's port: say where clients reach the bulk channel too "
              "(--announce-bulk-port P), or turn it off (--bulk-port -1)";
    if (why)
        fprintf(stderr, "sepal-server: %s (--help lists the options)\n", why);
    return why ? 2 : 0;
}

/* Returns 0 to run, 1 to exit 0 (--help, --version), 2 after a usage error. */
static int parse_args(int argc, char **argv, args *a)
{
    for (int k = 0; k < S_NOPTS; k++) /* the defaults, then what is given */
        if (sp_server_opt_table[k].def)
            take(a, k, sp_server_opt_table[k].def);
    sp_opt_parser p = {.opts = sp_server_opt_table, .argc = argc, .argv = argv};
    int k = -1;
    const char *v = NULL;
    char why[512];
    for (sp_opt_got got; (got = sp_opt_next(&p, &k, &v, why, sizeof why)) != SP_OPT_END;) {
        if (got == SP_OPT_WORD) {
            fprintf(stderr, "sepal-server: unexpected argument '%s' (--help lists the options)\n", v);
            return 2;
        }
        if (got == SP_OPT_UNKNOWN) { /* why: "unknown option 'NAME'", and the nearest names */
            fprintf(stderr, "sepal-server: %s; --help lists the options\n", why);
            return 2;
        }
        if (got == SP_OPT_BAD) {
            fprintf(stderr, "sepal-server: %s\n", why);
            return 2;
        }
        if (k == S_HELP || k == S_VERSION) {
            if (k == S_HELP)
                usage(stdout);
            else
                printf("sepal-server %s\n", SEPAL_VERSION);
            return 1;
        }
        if (take(a, k, v))
            return 2;
    }
    apply_units(a);
    return check_args(a);
}

/* ---------------------------------------------------------------------------------------------- */
/* the swarm */

typedef struct app {
    args a;
    char id[SP_SERVER_ID_LEN];
    sp_config cfg;
    sp_server *srv;          /* changed under srv_lock (the metrics' thread reads it) */
    pthread_mutex_t srv_lock;
    sp_announce *ann;
    sp_rng rng;
    int port, bulk_port; /* kept across moves */
    sp_http *metrics;    /* --metrics */
} app;

/* The server now, under srv_lock (NULL: none: loading, or moving). */
static void set_srv(app *p, sp_server *s)
{
    pthread_mutex_lock(&p->srv_lock);
    p->srv = s;
    pthread_mutex_unlock(&p->srv_lock);
}

/* Sleeps up to s seconds, waking early on a stop signal. */
static void nap(double s)
{
    double end = sp_now_s() + s;
    while (!g_stop && sp_now_s() < end) {
        double left = end - sp_now_s();
        struct timespec ts = {0, (long)((left < 0.1 ? left : 0.1) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

static void new_id(char out[SP_SERVER_ID_LEN])
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v)
        v = sp_now_ns() ^ ((uint64_t)getpid() << 32);
    snprintf(out, SP_SERVER_ID_LEN, "%016llx", (unsigned long long)v);
}

/* The other servers' spans (joining or online), for block selection; *me_idx: where self goes (appended). */
static int swarm_spans(app *p, sp_blk_span **out, sp_server_record **recs, int with_self, int *me_idx)
{
    int n = sp_view_snapshot(sp_announce_view(p->ann), recs);
    sp_blk_span *s = malloc((size_t)(n + 1) * sizeof *s);
    int k = 0;
    for (int i = 0; s && i < n; i++) {
        const sp_server_record *r = &(*recs)[i];
        if (r->state == SP_SERVER_OFFLINE || !strcmp(r->id, p->id))
            continue;
        s[k++] = (sp_blk_span){.start = r->start, .end = r->end, .throughput = r->throughput, .id = r->id};
    }
    if (s && with_self) {
        sp_server_record self;
        sp_announce_record(p->ann, &self);
        *me_idx = k;
        s[k++] = (sp_blk_span){.start = self.start, .end = self.end, .throughput = self.throughput, .id = p->id};
    }
    *out = s;
    return s ? k : 0;
}

static int choose_span(app *p, int *start, int *end)
{
    int L = p->cfg.n_layers, k = p->a.num_blocks < L ? p->a.num_blocks : L;
    if (p->a.initial_peers && sp_dht_wait_peers(sp_announce_dht(p->ann), 10000))
        sp_log(SP_LOG_WARN, "no DHT peer answered within 10 s (--initial-peers %s)", p->a.initial_peers);
    if (sp_view_wait_round(sp_announce_view(p->ann), 10000))
        sp_log(SP_LOG_WARN, "the swarm did not answer within 10 s; choosing blocks from what is known");
    nap(2 * p->a.selection_delay * sp_rng_f32(&p->rng)); /* servers started together choose one by one */
    sp_blk_span *spans = NULL;
    sp_server_record *recs = NULL;
    int n = swarm_spans(p, &spans, &recs, 0, NULL);
    *start = sp_blocksel_choose(spans, n, L, k);
    *end = *start + k;
    free(spans);
    free(recs);
    return 0;
}

/* The recent decode steps' wait in the server's queue (its load), 0 without a server. */
static double queue_wait(app *p)
{
    sp_server_batch_stats bs = {0};
    if (p->srv)
        sp_server_batch_stats_get(p->srv, &bs);
    return bs.queue_wait_s;
}

static void announce_state(app *p, int start, int end, sp_server_state state)
{
    if (!p->ann)
        return;
    int nb = end - start;
    double inf = 0, fwd = 0;
    if (p->srv)
        sp_server_throughput(p->srv, &inf, &fwd);
    sp_server_record r = {.start = start, .end = end, .state = state,
                          .port = p->a.announce_port ? p->a.announce_port : p->port};
    r.network_rps = p->a.bandwidth_mbit * 1e6 / (p->cfg.hidden * 32.0); /* f32 activations on the wire */
    r.inference_rps = inf * nb;                                      /* per block */
    r.forward_rps = fwd * nb;
    /* Petals: a request uses (nb + 1) / 2 of a span's blocks on average; before measuring, the network's rate */
    r.throughput = fwd > 0 ? fmin(r.forward_rps / ((nb + 1) / 2.0), r.network_rps) : r.network_rps;
    r.cache_tokens_left = p->srv ? sp_server_cache_left(p->srv) : 0;
    r.queue_wait = queue_wait(p);
    r.max_queue_wait = p->a.so.max_queue_wait_s;
    r.caps = p->srv && state != SP_SERVER_OFFLINE ? sp_server_caps(p->srv) : 0;
    if (p->srv)
        snprintf(r.device, sizeof r.device, "%s", sp_server_device(p->srv));
    sp_announce_update(p->ann, &r);
}

/* The announcer's thread (every 200 ms): the server is used under srv_lock, so a move cannot stop it meanwhile. */
static void fill_record(void *user, sp_server_record *r)
{
    app *p = user;
    pthread_mutex_lock(&p->srv_lock);
    if (p->srv && r->state != SP_SERVER_OFFLINE) {
        r->cache_tokens_left = sp_server_cache_left(p->srv);
        r->queue_wait = queue_wait(p);
        r->max_queue_wait = p->a.so.max_queue_wait_s;
        snprintf(r->device, sizeof r->device, "%s", sp_server_device(p->srv));
    }
    pthread_mutex_unlock(&p->srv_lock);
}

static void print_limits(app *p)
{
    sp_server_limits l;
    sp_server_limits_get(p->srv, &l);
    const double mib = 1048576.0;
    char idle[32] = "never", rate[32] = "none";
    if (l.idle_timeout_s > 0)
        snprintf(idle, sizeof idle, "%.0f s", l.idle_timeout_s);
    if (l.min_rate > 0)
        snprintf(rate, sizeof rate, "%.0f KiB/s", l.min_rate / 1024);
    printf("sepal-server: limits: %d connections (%d per address), %d in their handshake (%d per address), "
           "handshake %.3g s, idle %s; input budget %.0f MiB (%.1f per connection, %.0f per address), output bound "
           "%.1f MiB, busy after %.3g s, min rate %s; swarm key: %s\n",
           l.max_conns, l.max_conns_per_ip, l.max_pending, l.max_pending_per_ip, l.handshake_timeout_s, idle,
           (double)l.input_budget / mib, (double)l.input_budget_conn / mib, (double)l.input_budget_ip / mib,
           (double)l.output_bound / mib, l.busy_timeout_s, rate, p->a.so.key ? p->a.so.key->id_hex : "none");
}

/* A testing aid: SEPAL_SERVER_LOAD_DELAY=S makes loading take S seconds longer (stories15M loads in
 * milliseconds), so that a test can watch the JOINING record before ONLINE. Unset: no delay. */
static double load_delay(void)
{
    const char *d = getenv("SEPAL_SERVER_LOAD_DELAY");
    double s = d && *d ? strtod(d, NULL) : 0;
    return s > 0 && s < 3600 ? s : 0;
}

/* A testing aid: SEPAL_SERVER_OLD=nopush makes this process behave as a server from before push (no capabilities
 * said, awaiting requests refused, pushes unknown), SEPAL_SERVER_OLD=await as one that says it can push but refuses
 * awaiting requests (sp_server_opts.emulate_old), for the client's fallback in mixed swarms. Unset: nothing changes. */
static int emulate_old(void)
{
    const char *v = getenv("SEPAL_SERVER_OLD");
    int mode = !v || !*v                ? 0
               : !strcmp(v, "nopush") ? SP_SERVER_OLD_NOPUSH
               : !strcmp(v, "await")  ? SP_SERVER_OLD_AWAIT
                                      : -1;
    if (mode < 0)
        fprintf(stderr, "sepal-server: SEPAL_SERVER_OLD=%s is neither nopush nor await: ignored\n", v);
    else if (mode)
        fprintf(stderr, "sepal-server: SEPAL_SERVER_OLD=%s: behaving as an older server\n", v);
    return mode > 0 ? mode : 0;
}

/* Loads and serves [start, end); announces JOINING, then ONLINE. */
static sp_status serve(app *p, int start, int end, sp_err *err)
{
    announce_state(p, start, end, SP_SERVER_JOINING);
    if (load_delay() > 0) {
        fprintf(stderr, "sepal-server: SEPAL_SERVER_LOAD_DELAY: loading blocks %d:%d %.1f s late\n", start, end,
                load_delay());
        nap(load_delay());
    }
    sp_server_opts o = p->a.so;
    o.start = start;
    o.end = end;
    o.port = p->port;
    o.bulk_port = p->bulk_port;
    o.id = p->id;
    o.dht_port = p->ann ? sp_announce_dht_port(p->ann) : 0;
    o.public_host = p->a.announce_host[0] ? p->a.announce_host : NULL;
    o.public_port = p->a.announce_port;
    o.emulate_old = emulate_old();
    sp_server *srv = NULL;
    sp_status st = sp_server_start(&srv, &o, err);
    if (st)
        return st;
    set_srv(p, srv);
    sp_server_span(p->srv, &start, &end);
    p->port = sp_server_port(p->srv);
    if (p->bulk_port == 0)
        p->bulk_port = sp_server_bulk_port(p->srv);
    announce_state(p, start, end, SP_SERVER_ONLINE);
    double inf, fwd;
    sp_server_throughput(p->srv, &inf, &fwd);
    char dht[96] = "";
    if (p->ann)
        snprintf(dht, sizeof dht, ", DHT %s:%d", o.host, sp_announce_dht_port(p->ann));
    printf("sepal-server: serving blocks %d:%d of %s at ws://%s:%d (bulk port %d%s), %.1f steps/s, %.0f tokens/s; "
           "%s weights, %.1f MB, on %s\n",
           start, end, o.model_dir, o.host, p->port, sp_server_bulk_port(p->srv), dht, inf, fwd,
           sp_server_dtype(p->srv), sp_server_weight_bytes(p->srv) / 1e6, sp_server_device(p->srv));
    if (p->a.announce_host[0])
        printf("sepal-server: announced as ws://%s:%d (bulk port %d): clients reach it there\n", p->a.announce_host,
               p->a.announce_port ? p->a.announce_port : p->port, sp_server_public_bulk_port(p->srv));
    print_limits(p);
    fflush(stdout);
    return SP_OK;
}

/* Petals' rebalancing: move when the swarm would gain enough; returns the status of serving the new span. */
static sp_status maybe_move(app *p, sp_err *err)
{
    sp_blk_span *spans = NULL;
    sp_server_record *recs = NULL;
    int me = -1, n = swarm_spans(p, &spans, &recs, 1, &me);
    int move = spans && sp_blocksel_should_move(spans, n, me, p->cfg.n_layers, p->a.balance_quality, &p->rng);
    free(spans);
    free(recs);
    if (!move)
        return SP_OK;
    int start, end, old_start, old_end;
    sp_server_span(p->srv, &old_start, &old_end);
    announce_state(p, old_start, old_end, SP_SERVER_OFFLINE);
    sp_server *old = p->srv;
    set_srv(p, NULL);
    sp_server_stop(old);
    choose_span(p, &start, &end);
    fprintf(stderr, "sepal-server: moving from blocks %d:%d to %d:%d (the swarm gains throughput)\n", old_start,
            old_end, start, end);
    return serve(p, start, end, err);
}

static int run(app *p)
{
    sp_err err = {0};
    int start = p->a.so.start, end = p->a.so.end;
    if (p->a.num_blocks > 0)
        choose_span(p, &start, &end);
    if (serve(p, start, end, &err)) {
        fprintf(stderr, "sepal-server: %s\n", err.msg);
        return err.code == SP_ERR_ARG || err.code == SP_ERR_UNSUPPORTED ? 2 : 1;
    }
    double next_check = sp_now_s() + 2 * p->a.balance_period * sp_rng_f32(&p->rng);
    while (!g_stop) {
        nap(0.2);
        if (g_stop || !p->ann || p->a.num_blocks <= 0 || p->a.balance_period <= 0 || sp_now_s() < next_check)
            continue;
        if (maybe_move(p, &err)) {
            fprintf(stderr, "sepal-server: %s\n", err.msg);
            return 1;
        }
        next_check = sp_now_s() + 2 * p->a.balance_period * sp_rng_f32(&p->rng);
    }
    return 0;
}

/* GET /metrics: the server's metrics (Prometheus' text format), its DHT node's restarts added; 503 while no
 * server runs (loading, moving). */
static void metrics_handler(sp_http_conn *c, const sp_http_req *r, void *user)
{
    app *p = user;
    if (strcmp(r->path, "/metrics")) {
        sp_http_respond(c, 404, "text/plain", NULL, "not found: the metrics are at /metrics\n", 39);
        return;
    }
    if (strcmp(r->method, "GET") && strcmp(r->method, "HEAD")) {
        sp_http_respond(c, 405, "text/plain", "Allow: GET\r\n", "use GET\n", 8);
        return;
    }
    sp_dht *d = p->ann ? sp_announce_dht(p->ann) : NULL;
    sp_mx_extra x = {.have_dht = d != NULL, .dht_restarts = d ? sp_dht_restarts(d) : 0,
                     .dht_refused = d ? sp_dht_refused(d) : 0};
    pthread_mutex_lock(&p->srv_lock);
    char *text = p->srv ? sp_server_metrics_text(p->srv, &x) : NULL;
    int loading = !p->srv;
    pthread_mutex_unlock(&p->srv_lock);
    if (text)
        sp_http_respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", NULL, text, strlen(text));
    else if (loading)
        sp_http_respond(c, 503, "text/plain", NULL, "no blocks served yet (loading)\n", 31);
    else
        sp_http_respond(c, 500, "text/plain", NULL, "out of memory\n", 14);
    free(text);
}

static int start_metrics(app *p)
{
    if (!p->a.metrics_host[0])
        return 0;
    sp_err err = {0};
    sp_http_opts ho = {.host = p->a.metrics_host, .port = p->a.metrics_port, .handler = metrics_handler, .user = p};
    if (sp_http_start(&p->metrics, &ho, &err)) {
        fprintf(stderr, "sepal-server: --metrics: %s\n", err.msg);
        return -1;
    }
    int v6 = strchr(p->a.metrics_host, ':') != NULL;
    printf("sepal-server: metrics at http://%s%s%s:%d/metrics\n", v6 ? "[" : "", p->a.metrics_host, v6 ? "]" : "",
           sp_http_port(p->metrics));
    fflush(stdout);
    return 0;
}

static sp_status join_swarm(app *p, sp_err *err)
{
    char prefix[SP_MODEL_PREFIX_MAX];
    sp_model_prefix(p->a.so.model_dir, prefix, sizeof prefix);
    sp_announce_opts ao = {.dht_bind = p->a.so.host, .initial_peers = p->a.initial_peers, .period = p->a.update_period,
                           .hidden = p->cfg.hidden, .architecture = p->cfg.architecture, .key = p->a.so.key,
                           .source = p->a.so.source_address};
    ao.dht_port = p->a.dht_port >= 0 ? p->a.dht_port : p->a.so.port;
    sp_server_record *b = &ao.base;
    snprintf(b->id, sizeof b->id, "%s", p->id);
    snprintf(b->name, sizeof b->name, "%s", p->a.so.public_name ? p->a.so.public_name : "");
    snprintf(b->host, sizeof b->host, "%s", p->a.announce_host[0] ? p->a.announce_host : p->a.so.host);
    snprintf(b->model, sizeof b->model, "%s", prefix);
    snprintf(b->dtype, sizeof b->dtype, "%s", sp_wtype_name((sp_wtype)p->a.so.dtype));
    snprintf(b->quant, sizeof b->quant, "%s",
             p->a.so.dtype == SP_W_Q8 || p->a.so.dtype == SP_W_NF4 ? sp_wtype_name((sp_wtype)p->a.so.dtype) : "none");
    snprintf(b->version, sizeof b->version, "%s", SEPAL_VERSION);
    b->config_hash = p->cfg.hash;
    b->num_blocks = p->cfg.n_layers;
    sp_status st = sp_announce_start(&p->ann, &ao, err);
    if (!st)
        sp_announce_set_fill(p->ann, fill_record, p);
    return st;
}

/* Whether host:port (the address of option opt) can be bound (type: SOCK_STREAM or SOCK_DGRAM): 0, or -1 after a
 * message that says why, before anything else starts (lws would log its internals instead). */
static int check_bind(const char *opt, const char *host, int port, int type, const char *what)
{
    if (port < 0)
        return 0; /* port 0: any free one; the address is still checked */
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &sin.sin_addr) != 1) {
        fprintf(stderr, "sepal-server: %s %s: not an IPv4 address\n", opt, host);
        return -1;
    }
    int fd = socket(AF_INET, type | SOCK_CLOEXEC, 0), e = 0;
    int one = 1;
    if (fd >= 0 && type == SOCK_STREAM)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sin, sizeof sin))
        e = errno;
    if (fd >= 0)
        close(fd);
    if (e == EADDRINUSE)
        fprintf(stderr, "sepal-server: port %d is in use (%s)\n", port, what);
    else if (e == EADDRNOTAVAIL)
        fprintf(stderr, "sepal-server: %s %s: not an address of this machine\n", opt, host);
    else if (e == EACCES)
        fprintf(stderr, "sepal-server: port %d (%s): permission denied (ports below 1024 need root)\n", port, what);
    else if (e)
        fprintf(stderr, "sepal-server: cannot bind %s:%d (%s): %s\n", host, port, what, strerror(e));
    return e ? -1 : 0;
}

int main(int argc, char **argv)
{
    sp_blas_tune(argv); /* first: it may run the program again */
    sp_memtune();
    sp_err err = {0};
    if (sp_kern_check_env(&err)) {
        fprintf(stderr, "sepal-server: %s\n", err.msg);
        return 2;
    }
    static app p;
    sp_server_opts_default(&p.a.so);
    p.a.dht_port = -1;     /* the websocket port */
    p.a.min_rate_kib = -1; /* the transport's */
    int rc = parse_args(argc, argv, &p.a);
    if (rc)
        return rc == 1 ? 0 : rc;
    hand_over_to_cuda(&p.a.so, argv);
    static sp_swarm_key key;
    if (p.a.gen_swarm_key) {
        if (sp_swarm_key_generate(p.a.gen_swarm_key, &err) || sp_swarm_key_load(&key, p.a.gen_swarm_key, &err)) {
            fprintf(stderr, "sepal-server: %s\n", err.msg);
            return 1;
        }
        printf("sepal-server: wrote a swarm key to %s (swarm id %s); give it to every server and client of the swarm "
               "(--swarm-key %s, connect --swarm-key %s)\n", p.a.gen_swarm_key, key.id_hex, p.a.gen_swarm_key,
               p.a.gen_swarm_key);
        return 0;
    }
    const char *host = p.a.so.host ? p.a.so.host : "127.0.0.1";
    int swarm = p.a.new_swarm || p.a.initial_peers;
    int dht_port = p.a.dht_port >= 0 ? p.a.dht_port : p.a.so.port;
    const char *src = p.a.so.source_address;
    if (check_bind("--host", host, p.a.so.port, SOCK_STREAM, "websockets") ||
        (p.a.so.bulk_port > 0 && check_bind("--host", host, p.a.so.bulk_port, SOCK_STREAM, "--bulk-port")) ||
        (swarm && dht_port > 0 && check_bind("--host", host, dht_port, SOCK_DGRAM, "UDP, the DHT")) ||
        (src && check_bind("--source-address", src, 0, SOCK_STREAM, "outgoing connections")))
        return 1;
    if (p.a.swarm_key) {
        if (sp_swarm_key_load(&key, p.a.swarm_key, &err)) {
            fprintf(stderr, "sepal-server: %s\n", err.msg);
            return 2;
        }
        p.a.so.key = &key;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (sp_config_load(&p.cfg, p.a.so.model_dir, &err)) {
        fprintf(stderr, "sepal-server: %s\n", err.msg);
        return 1;
    }
    if ((rc = check_device(&p.a.so)))
        return rc;
    new_id(p.id);
    sp_rng_seed(&p.rng, sp_now_ns() ^ strtoull(p.id, NULL, 16));
    p.port = p.a.so.port;
    p.bulk_port = p.a.so.bulk_port;
    if ((p.a.new_swarm || p.a.initial_peers) && join_swarm(&p, &err)) {
        fprintf(stderr, "sepal-server: %s\n", err.msg);
        return 1;
    }
    if (p.ann && sp_announce_check_peers(p.ann, &err)) { /* a websocket port given for a DHT node, say */
        fprintf(stderr, "sepal-server: %s\n", err.msg);
        sp_announce_stop(p.ann);
        return 2;
    }
    pthread_mutex_init(&p.srv_lock, NULL);
    if (start_metrics(&p)) {
        sp_announce_stop(p.ann);
        return 1;
    }
    rc = run(&p);
    if (p.srv) {
        uint64_t pin, pout;
        sp_server_pushes(p.srv, &pin, &pout);
        fprintf(stderr, "sepal-server: shutting down (%llu requests served; pushes: %llu in, %llu out)\n",
                (unsigned long long)sp_server_requests(p.srv), (unsigned long long)pin, (unsigned long long)pout);
    }
    sp_server_goodbye(p.srv); /* clients in a session hear why, and route around it at once */
    sp_announce_stop(p.ann);   /* OFFLINE: clients stop choosing it before its connections close */
    if (p.metrics)
        sp_http_stop(p.metrics);
    sp_server *srv = p.srv;
    set_srv(&p, NULL);
    sp_server_stop(srv);
    return rc;
}
