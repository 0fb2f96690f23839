/* cmd_swarm.c - load, swarm up/down, connect, servers, route: the REPL side of the client runtime. The
 * runtime reports through events; here they become lines on stderr (the TUI will draw them instead). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app.h"
#include "cli.h"
#include "runtime.h"

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
    default:
        fprintf(stderr, "%s\n", ev->text);
    }
}

/* The app's runtime, created on first use. */
sp_runtime *sp_app_runtime(sp_app *app);
sp_runtime *sp_app_runtime(sp_app *app)
{
    if (!app->rt) {
        sp_err err = {0};
        if (sp_runtime_new(&app->rt, print_event, app, &err))
            sp_app_error(app, "%s", err.msg);
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
    long n, k = 0;
    if (cli_parse_int("swarm up N", argv[2], 1, 64, &n))
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
    if (argc != 2)
        return sp_app_error(app, "usage: connect HOST:PORT[,HOST:PORT...]");
    sp_runtime *rt = sp_app_runtime(app);
    sp_err err = {0};
    if (!rt || sp_runtime_connect(rt, argv[1], &err))
        return sp_app_error(app, "%s", err.msg);
    return 0;
}

static int cmd_servers(sp_app *app, int argc, char **argv)
{
    (void)argc;
    (void)argv;
    sp_runtime *rt = sp_app_runtime(app);
    if (!rt)
        return 1;
    sp_runtime_refresh(rt);
    printf("%-22s %-8s %12s %12s %12s  %s\n", "address", "blocks", "steps/s", "fwd tok/s", "cache left", "state");
    for (int i = 0; i < rt->nservers; i++) {
        const sp_server_entry *e = &rt->servers[i];
        char addr[96], span[32];
        snprintf(addr, sizeof addr, "%s:%d", e->host, e->port);
        snprintf(span, sizeof span, "%d:%d", e->start, e->end);
        printf("%-22s %-8s %12.1f %12.0f %12ld  %s%s\n", addr, span, e->inference_rps, e->forward_tps, e->cache_left,
               e->state, e->pid > 0 ? " (local)" : "");
    }
    if (!rt->nservers)
        printf("(no servers: swarm up N, or connect HOST:PORT)\n");
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
    if (sp_runtime_route(rt, &err))
        return sp_app_error(app, "%s", err.msg);
    char text[2048];
    sp_runtime_route_text(rt, text, sizeof text);
    printf("%s\n", text);
    return 0;
}

const sp_cmd sp_cmds_swarm[] = {
    {"load", NULL, "DIR", "load a model's local parts (embeddings, norm, head, tokenizer)",
     "Reads config.json, the tokenizer and only the embeddings, final norm and LM head of the Hugging Face\n"
     "model in DIR. The blocks are served by the swarm.",
     cmd_load},
    {"swarm", NULL, "up N [--blocks-per-server K] | down", "start or stop a local swarm of sepal-server processes",
     "swarm up N starts N sepal-server processes on free 127.0.0.1 ports, splitting the loaded model's blocks\n"
     "(evenly, or K each with --blocks-per-server), waits until all serve and connects to them.\n"
     "swarm down stops them.",
     cmd_swarm},
    {"connect", NULL, "HOST:PORT[,HOST:PORT...]", "connect to running servers", NULL, cmd_connect},
    {"servers", NULL, "", "table of the known servers: address, span, throughput, cache left, state", NULL,
     cmd_servers},
    {"route", NULL, "", "the chain of servers the next request uses", NULL, cmd_route},
    {NULL, NULL, NULL, NULL, NULL, NULL},
};
