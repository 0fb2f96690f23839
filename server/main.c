/* main.c - sepal-server: serve a span of a model's blocks until SIGINT/SIGTERM. */
#include <errno.h>
#include <stddef.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "memtune.h"
#include "server.h"

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sepal-server --model DIR --blocks A:B [options]\n"
            "\n"
            "  --model DIR             Hugging Face model directory (only blocks A..B-1 are read)\n"
            "  --blocks A:B            the span of blocks to serve (B may be empty: to the last block)\n"
            "  --host H                address to bind (default 127.0.0.1)\n"
            "  --port P                websocket port (default 0: any free port)\n"
            "  --bulk-port P           TCP port of the bulk tensor channel (default 0: any; -1: none)\n"
            "  --threads N             worker threads (default 1)\n"
            "  --max-batch-tokens N    batch x positions per request (default 2048)\n"
            "  --cache-tokens N        KV-cache budget in positions over the span (default 8192)\n"
            "  --max-length N          largest inference session (default: the model's context)\n"
            "  --step-timeout S        close sessions idle for S seconds (default 300)\n"
            "  --session-timeout S     close sessions older than S seconds (default 1800)\n"
            "  --public-name S         a name shown to clients\n"
            "  --no-measure            skip the throughput measurement at start\n"
            "  --verbose               log requests and sessions\n");
}

static int parse_long(const char *opt, const char *v, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || errno || *end || end == v || x < lo || x > hi) {
        fprintf(stderr, "sepal-server: %s: expected an integer in [%ld, %ld], got '%s'\n", opt, lo, hi, v ? v : "");
        return -1;
    }
    *out = x;
    return 0;
}

static int parse_blocks(const char *v, sp_server_opts *o)
{
    int a, b = -1, n = 0;
    if (!v || (sscanf(v, "%d:%n", &a, &n) < 1 || n == 0) || a < 0) {
        fprintf(stderr, "sepal-server: --blocks: expected A:B, got '%s'\n", v ? v : "");
        return -1;
    }
    if (v[n] && (sscanf(v + n, "%d", &b) != 1 || b <= a)) {
        fprintf(stderr, "sepal-server: --blocks: expected A:B with B > A, got '%s'\n", v);
        return -1;
    }
    o->start = a;
    o->end = b;
    return 0;
}

/* Value options, table-driven: strings, ints and longs with their ranges. */
enum { OPT_STR, OPT_INT, OPT_LONG, OPT_SECONDS };
typedef struct opt_def {
    const char *name;
    int kind;
    long lo, hi;
    size_t off; /* offset into sp_server_opts */
} opt_def;

static const opt_def opt_table[] = {
    {"--model", OPT_STR, 0, 0, offsetof(sp_server_opts, model_dir)},
    {"--host", OPT_STR, 0, 0, offsetof(sp_server_opts, host)},
    {"--public-name", OPT_STR, 0, 0, offsetof(sp_server_opts, public_name)},
    {"--port", OPT_INT, 0, 65535, offsetof(sp_server_opts, port)},
    {"--bulk-port", OPT_INT, -1, 65535, offsetof(sp_server_opts, bulk_port)},
    {"--threads", OPT_INT, 1, 256, offsetof(sp_server_opts, threads)},
    {"--max-batch-tokens", OPT_INT, 1, 1 << 24, offsetof(sp_server_opts, max_batch_tokens)},
    {"--cache-tokens", OPT_LONG, 1, 1L << 40, offsetof(sp_server_opts, cache_tokens)},
    {"--max-length", OPT_INT, 1, 1 << 24, offsetof(sp_server_opts, max_length)},
    {"--step-timeout", OPT_SECONDS, 1, 1 << 30, offsetof(sp_server_opts, step_timeout_s)},
    {"--session-timeout", OPT_SECONDS, 1, 1 << 30, offsetof(sp_server_opts, session_timeout_s)},
};

static int set_option(const opt_def *d, const char *v, sp_server_opts *o)
{
    char *p = (char *)o + d->off;
    long x = 0;
    if (d->kind != OPT_STR && parse_long(d->name, v, d->lo, d->hi, &x))
        return -1;
    switch (d->kind) {
    case OPT_STR: *(const char **)(void *)p = v; break;
    case OPT_INT: *(int *)(void *)p = (int)x; break;
    case OPT_LONG: *(long *)(void *)p = x; break;
    default: *(double *)(void *)p = (double)x; break;
    }
    return 0;
}

/* Returns 0, or 2 after a usage message. */
static int parse_args(int argc, char **argv, sp_server_opts *o)
{
    int have_blocks = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        }
        if (!strcmp(a, "--no-measure")) {
            o->measure = 0;
            continue;
        }
        if (!strcmp(a, "--verbose")) {
            sp_log_set_level(SP_LOG_DEBUG);
            continue;
        }
        const opt_def *d = NULL;
        for (size_t k = 0; k < sizeof opt_table / sizeof *opt_table; k++)
            if (!strcmp(a, opt_table[k].name))
                d = &opt_table[k];
        if (!d && strcmp(a, "--blocks")) {
            fprintf(stderr, "sepal-server: unknown option '%s'\n", a);
            return 2;
        }
        if (!v) {
            fprintf(stderr, "sepal-server: option '%s' needs a value\n", a);
            return 2;
        }
        if (d ? set_option(d, v, o) : parse_blocks(v, o))
            return 2;
        have_blocks |= !d;
        i++;
    }
    if (!o->model_dir || !have_blocks) {
        fprintf(stderr, "sepal-server: --model DIR and --blocks A:B are required\n");
        usage(stderr);
        return 2;
    }
    return 0;
}

int main(int argc, char **argv)
{
    sp_memtune();
    sp_server_opts o;
    sp_server_opts_default(&o);
    o.bulk_port = 0;
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc;
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    sp_server *s = NULL;
    sp_err err = {0};
    if (sp_server_start(&s, &o, &err)) {
        fprintf(stderr, "sepal-server: %s\n", err.msg);
        return err.code == SP_ERR_ARG || err.code == SP_ERR_UNSUPPORTED ? 2 : 1;
    }
    double inf, fwd;
    sp_server_throughput(s, &inf, &fwd);
    printf("sepal-server: serving blocks %d:%d of %s at ws://%s:%d (bulk port %d), %.1f steps/s, %.0f tokens/s\n",
           o.start, o.end < 0 ? -1 : o.end, o.model_dir, o.host, sp_server_port(s), sp_server_bulk_port(s), inf, fwd);
    fflush(stdout);
    while (!g_stop)
        pause();
    fprintf(stderr, "sepal-server: shutting down (%llu requests served)\n",
            (unsigned long long)sp_server_requests(s));
    sp_server_stop(s);
    return 0;
}
