/* serve.c - the OpenAI-compatible endpoint's life cycle (serve.h): the HTTP server (http/), the routes, the
 * bearer token, the turns of the generations, and a line in the app's log for every request (its status, tokens,
 * speed and the requests active), which the TUI shows in its log panel. */
#include "serve.h"

#include <cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "rng.h"
#include "serve_impl.h"
#include "timeutil.h"

/* ---------------------------------------------------------------------------------------------- */
/* errors in OpenAI's shape */

const char *srv_error_type(int status)
{
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 503: return "unavailable_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

size_t srv_error_json(int status, const char *type, const char *param, const char *code, const char *msg, char *buf,
                      size_t cap)
{
    cJSON *root = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", type ? type : srv_error_type(status));
    if (param)
        cJSON_AddStringToObject(e, "param", param);
    else
        cJSON_AddNullToObject(e, "param");
    if (code)
        cJSON_AddStringToObject(e, "code", code);
    else
        cJSON_AddNullToObject(e, "code");
    size_t n = 0;
    if (cJSON_PrintPreallocated(root, buf, (int)cap - 1, 0))
        n = strlen(buf);
    else
        n = (size_t)snprintf(buf, cap, "{\"error\":{\"message\":\"error %d\",\"type\":\"server_error\"}}", status);
    cJSON_Delete(root);
    return n < cap ? n : cap - 1;
}

int srv_error(srv_req *q, int status, const char *type, const char *param, const char *code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(q->why, sizeof q->why, fmt, ap);
    va_end(ap);
    char body[1024];
    size_t n = srv_error_json(status, type, param, code, q->why, body, sizeof body);
    q->status = status;
    const char *extra = status == 401 ? "WWW-Authenticate: Bearer\r\n" : NULL;
    sp_http_respond(q->c, status, "application/json", extra, body, n);
    return -1;
}

/* The errors the HTTP server answers itself (a malformed request, too large, too slow). */
static size_t http_error_body(int status, const char *msg, char *buf, size_t cap, const char **ctype, void *user)
{
    (void)user;
    *ctype = "application/json";
    return srv_error_json(status, NULL, NULL, NULL, msg, buf, cap);
}

/* ---------------------------------------------------------------------------------------------- */
/* turns */

int srv_turn(srv_req *q)
{
    sp_srv *s = q->s;
    pthread_mutex_lock(&s->mu);
    s->waiting++;
    int gone = 0;
    while (s->generating >= s->parallel && !(gone = sp_http_stopping(q->c) || sp_http_peer_gone(q->c))) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100000000;
        ts.tv_sec += ts.tv_nsec / 1000000000;
        ts.tv_nsec %= 1000000000;
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    s->waiting--;
    if (!gone)
        s->generating++;
    pthread_mutex_unlock(&s->mu);
    if (gone)
        return srv_error(q, 503, NULL, NULL, "shutting_down", "the endpoint is stopping (or the client left)");
    return 0;
}

void srv_turn_end(srv_req *q)
{
    pthread_mutex_lock(&q->s->mu);
    q->s->generating--;
    pthread_cond_signal(&q->s->cv);
    pthread_mutex_unlock(&q->s->mu);
}

/* ---------------------------------------------------------------------------------------------- */
/* routes */

/* 1 if the request carries the token (or none is asked); else answered 401. Compared in constant time. */
static int authorized(srv_req *q)
{
    const char *want = q->s->api_key;
    if (!*want)
        return 1;
    const char *h = sp_http_header_get(q->r, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7))
        return srv_error(q, 401, NULL, NULL, "invalid_api_key",
                         "no API key: send it as `Authorization: Bearer TOKEN`"), 0;
    h += 7;
    while (*h == ' ')
        h++;
    size_t n = strlen(want), m = strlen(h);
    unsigned diff = (unsigned)(n ^ m);
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned char)want[i] ^ (unsigned char)(i < m ? h[i] : 0);
    if (diff)
        return srv_error(q, 401, NULL, NULL, "invalid_api_key", "incorrect API key"), 0;
    return 1;
}

static void send_json(srv_req *q, int status, cJSON *root)
{
    char *text = cJSON_PrintUnformatted(root);
    q->status = status;
    if (text)
        sp_http_respond(q->c, status, "application/json", NULL, text, strlen(text));
    else
        srv_error(q, 500, NULL, NULL, NULL, "out of memory");
    free(text);
    cJSON_Delete(root);
}

static cJSON *model_object(const sp_srv *s)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->model);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->created);
    cJSON_AddStringToObject(m, "owned_by", "sepal");
    return m;
}

/* GET /v1/models, GET /v1/models/ID */
static void models(srv_req *q, const char *id)
{
    if (id && strcmp(id, q->s->model)) {
        srv_error(q, 404, "invalid_request_error", "model", "model_not_found", "The model '%.100s' does not exist", id);
        return;
    }
    if (id)
        return send_json(q, 200, model_object(q->s));
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "data"), model_object(q->s));
    send_json(q, 200, root);
}

static int method_is(srv_req *q, const char *m)
{
    if (!strcmp(q->r->method, m))
        return 1;
    srv_error(q, 405, NULL, NULL, NULL, "%s %s: use %s", q->r->method, q->r->path, m);
    return 0;
}

static void route(srv_req *q)
{
    const char *p = q->r->path;
    if (!strcmp(p, "/health")) { /* llama-server's: for load balancers and scripts, without the token */
        if (method_is(q, "GET")) {
            cJSON *root = cJSON_CreateObject();
            cJSON_AddStringToObject(root, "status", "ok");
            send_json(q, 200, root);
        }
        return;
    }
    int known = !strcmp(p, "/v1/models") || !strncmp(p, "/v1/models/", 11) || !strcmp(p, "/v1/completions") ||
                !strcmp(p, "/v1/chat/completions");
    if (!known) {
        srv_error(q, 404, NULL, NULL, "unknown_url", "Unknown request URL: %.16s %.200s", q->r->method, p);
        return;
    }
    if (!authorized(q))
        return;
    if (!strncmp(p, "/v1/models", 10)) {
        if (method_is(q, "GET"))
            models(q, p[10] == '/' ? p + 11 : NULL);
    } else if (method_is(q, "POST")) {
        srv_completions(q, !strcmp(p, "/v1/chat/completions"));
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* the log */

static void log_request(srv_req *q)
{
    sp_srv *s = q->s;
    pthread_mutex_lock(&s->mu);
    int failed = q->status >= 400, active = s->generating + s->waiting;
    s->served++;
    s->failed += failed;
    pthread_mutex_unlock(&s->mu);
    char figures[160] = "";
    if (q->prompt_tokens)
        snprintf(figures, sizeof figures, ": %d + %d tokens in %.2f s (%.1f tok/s%s)", q->prompt_tokens,
                 q->new_tokens, q->gen_s, q->gen_s > 0 ? q->new_tokens / q->gen_s : 0.0, q->stream ? ", streamed" : "");
    sp_emitf(s->app, failed ? SP_UI_WARN : SP_UI_NOTICE, "serve: #%ld %s %s %d%s%s%s; %d active", q->id, q->r->method,
             q->r->path, q->status, figures, failed ? ": " : "", failed ? q->why : "", active);
}

static void handle(sp_http_conn *c, const sp_http_req *r, void *user)
{
    sp_srv *s = user;
    srv_req q = {.s = s, .c = c, .r = r, .t0 = sp_now_s()};
    pthread_mutex_lock(&s->mu);
    q.id = ++s->next_id;
    pthread_mutex_unlock(&s->mu);
    route(&q);
    if (strcmp(r->path, "/health"))
        log_request(&q);
}

/* ---------------------------------------------------------------------------------------------- */
/* life cycle */

static void read_defaults(sp_app *app, srv_defaults *d)
{
    d->max_new = (int)sp_app_num(app, SP_SET_MAX_NEW_TOKENS);
    d->temperature = (float)sp_app_num(app, SP_SET_TEMPERATURE);
    d->top_k = (int)sp_app_num(app, SP_SET_TOP_K);
    d->top_p = (float)sp_app_num(app, SP_SET_TOP_P);
    d->repetition_penalty = (float)sp_app_num(app, SP_SET_REPETITION_PENALTY);
    d->min_new = (int)sp_app_num(app, SP_SET_MIN_NEW_TOKENS);
    d->ignore_eos = sp_opt_on(sp_app_get(app, SP_SET_IGNORE_EOS));
    const char *seed = sp_app_get(app, SP_SET_SEED);
    d->seed_random = !seed || !strcmp(seed, "random");
    d->seed = d->seed_random ? 0 : (unsigned long long)sp_opt_int(seed);
}

static int loopback(const char *host)
{
    return !strcmp(host, "localhost") || !strncmp(host, "127.", 4) || !strcmp(host, "::1");
}

static int srv_init(sp_srv *s, sp_app *app, const sp_serve_opts *o)
{
    memset(s, 0, sizeof *s);
    s->app = app;
    s->rt = sp_app_runtime(app);
    s->cfg = sp_runtime_config(s->rt);
    s->tok = sp_runtime_tokenizer(s->rt);
    snprintf(s->model, sizeof s->model, "%s", sp_runtime_model_name(s->rt));
    snprintf(s->api_key, sizeof s->api_key, "%s", o->api_key);
    s->parallel = o->parallel > 0 ? o->parallel : 1;
    s->created = (long)time(NULL);
    read_defaults(app, &s->def);
    sp_err err = {0};
    if (sp_chat_load(&s->chat, sp_runtime_model_dir(s->rt), s->tok, &err))
        return sp_app_error(app, "serve: %s", err.msg);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    return 0;
}

int sp_serve_run(sp_app *app, const sp_serve_opts *o)
{
    sp_srv *s = malloc(sizeof *s);
    if (!s)
        return sp_app_error(app, "out of memory");
    if (srv_init(s, app, o))
        return free(s), 1;
    sp_http *h = NULL;
    sp_err err = {0};
    sp_http_opts ho = {.host = o->host, .port = o->port, .handler = handle, .error_body = http_error_body, .user = s};
    if (sp_http_start(&h, &ho, &err)) {
        sp_chat_free(s->chat);
        free(s);
        return sp_app_error(app, "serve: %s", err.msg);
    }
    int v6 = strchr(o->host, ':') != NULL;
    sp_out(app, "serving %s at http://%s%s%s:%d/v1 (%s; %d at once%s); Ctrl-C stops\n", s->model, v6 ? "[" : "", o->host,
           v6 ? "]" : "", sp_http_port(h), sp_chat_describe(s->chat), s->parallel, *s->api_key ? "; a token" : "");
    if (!loopback(o->host) && !*s->api_key)
        sp_warn(app, "serve: %s is not a loopback address and no --api-key-file was given: anyone who reaches it "
                     "can use the swarm", o->host);
    while (!sp_app_cancelled(app)) {
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 50000000};
        nanosleep(&ts, NULL);
    }
    sp_http_stop(h); /* the handlers see it, end their generations and answer */
    sp_note(app, "serve: stopped after %ld request%s (%ld failed)", s->served, s->served == 1 ? "" : "s", s->failed);
    sp_chat_free(s->chat);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
    return 0;
}
