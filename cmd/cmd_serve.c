/* cmd_serve.c - `serve`: the session's model and swarm behind an OpenAI-compatible HTTP endpoint until Ctrl-C.
 * The command reads its options, loads and joins what they ask, and hands over to the HTTP front end the program
 * provides (app->serve, serve/serve.h): the command layer never links a front end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "runtime.h"

enum { SERVE_HTTP, SERVE_API_KEY_FILE, SERVE_PARALLEL, SERVE_MODEL, SERVE_INITIAL_PEERS, SERVE_NOPTS };

/* "HOST:PORT", "[V6]:PORT", ":PORT" (loopback) into o: 0, or 1 after a message. */
static int parse_listen(sp_app *app, const char *s, sp_serve_opts *o)
{
    const char *colon = strrchr(s, ':');
    char *end;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    if (!colon || colon[1] == 0 || *end || port < 0 || port > 65535)
        return sp_app_error(app, "serve: --http: expected HOST:PORT (127.0.0.1:8080; port 0: a free one), got '%s'", s);
    size_t hl = (size_t)(colon - s);
    if (hl >= 2 && s[0] == '[' && s[hl - 1] == ']') /* [::1]:8080 */
        s++, hl -= 2;
    if (hl >= sizeof o->host)
        return sp_app_error(app, "serve: --http: the host is too long");
    snprintf(o->host, sizeof o->host, "%.*s", (int)hl, hl ? s : "127.0.0.1");
    if (!hl)
        snprintf(o->host, sizeof o->host, "127.0.0.1");
    o->port = (int)port;
    return 0;
}

/* The token: the first line of path, without blanks around it. 0, or 1 after a message. */
static int read_key(sp_app *app, const char *path, sp_serve_opts *o)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return sp_app_error(app, "serve: --api-key-file %s: cannot read it", path);
    char line[sizeof o->api_key + 2] = "";
    char *got = fgets(line, sizeof line, f);
    fclose(f);
    char *p = line, *e = line + strlen(line);
    while (*p == ' ' || *p == '\t')
        p++;
    while (e > p && (e[-1] == '\n' || e[-1] == '\r' || e[-1] == ' ' || e[-1] == '\t'))
        *--e = 0;
    if (!got || !*p)
        return sp_app_error(app, "serve: --api-key-file %s: its first line is empty (the token goes there)", path);
    if (strlen(p) >= sizeof o->api_key)
        return sp_app_error(app, "serve: --api-key-file %s: the token is longer than %zu bytes", path,
                            sizeof o->api_key - 1);
    memcpy(o->api_key, p, strlen(p) + 1); /* it fits: measured above */
    return 0;
}

/* --model and --initial-peers: what `load` and `connect --initial-peers` do, first. */
static int prepare(sp_app *app, const sp_args *a, sp_runtime *rt)
{
    const char *dir = sp_arg(app, a, SERVE_MODEL), *peers = sp_arg(app, a, SERVE_INITIAL_PEERS);
    sp_err err = {0};
    if (dir && sp_runtime_load(rt, dir, &err))
        return sp_app_error(app, "serve: --model: %s", err.msg);
    if (peers && sp_runtime_join(rt, peers, &err))
        return sp_app_error(app, "serve: --initial-peers: %s", err.msg);
    if (!sp_runtime_config(rt))
        return sp_app_error(app, "serve: no model loaded (load DIR first, or serve --model DIR)");
    if (!sp_runtime_tokenizer(rt))
        return sp_app_error(app, "serve: the model has no tokenizer.json: the endpoint takes text");
    return 0;
}

static int cmd_serve(sp_app *app, const sp_args *a)
{
    sp_serve_opts o = {.parallel = (int)sp_arg_int(app, a, SERVE_PARALLEL)};
    const char *key = sp_arg(app, a, SERVE_API_KEY_FILE);
    if (parse_listen(app, sp_arg(app, a, SERVE_HTTP), &o) || (key && read_key(app, key, &o)))
        return 1;
    if (!app->serve)
        return sp_app_error(app, "serve: this front end has no HTTP server");
    sp_runtime *rt = sp_app_runtime(app);
    if (!rt || prepare(app, a, rt))
        return 1;
    return app->serve(app, &o);
}

static const sp_opt serve_opts[] = {
    [SERVE_HTTP] = {"--http", SP_OPT_STR, "HOST:PORT", .def = "127.0.0.1:8080",
                    .help = "where to listen (port 0: a free one, said when serving starts)"},
    [SERVE_API_KEY_FILE] = {"--api-key-file", SP_OPT_PATH, "FILE",
                            .help = "every request must carry `Authorization: Bearer TOKEN`, TOKEN the first line of FILE"},
    [SERVE_PARALLEL] = {"--parallel", SP_OPT_INT, "N", 1, 64, .def = "4",
                        .help = "generations at once (each its own inference session); more wait for their turn"},
    [SERVE_MODEL] = {"--model", SP_OPT_PATH, "DIR", .help = "load this model first (as `load DIR`)"},
    [SERVE_INITIAL_PEERS] = {"--initial-peers", SP_OPT_STR, "HOST:PORT[,...]",
                             .help = "join a swarm first (as `connect --initial-peers`)"},
    [SERVE_NOPTS] = {0},
};

const sp_cmd sp_cmds_serve[] = {
    {.name = "serve", .args = "", .min_pos = 0, .max_pos = 0, SP_OPTS(serve_opts),
     .summary = "an OpenAI-compatible HTTP endpoint over the swarm, until Ctrl-C",
     .help = "Answers GET /v1/models, POST /v1/completions and POST /v1/chat/completions (streamed as server-sent "
             "events with \"stream\": true) with the loaded model through the swarm of this session; each request "
             "that generates is an inference session of its own. Parameters a request leaves out take the "
             "settings (`show`). Listens on loopback unless --http says otherwise. Ctrl-C stops it: requests in "
             "progress end with an error, and the swarm stays up.",
     .examples = "serve --http 127.0.0.1:8080\n"
                 "serve --http 0.0.0.0:8080 --api-key-file ~/.sepal-token --parallel 8",
     .fn = cmd_serve},
    {0},
};
