/* runtime.c - the client runtime: local parts, servers (connected or started here), the route, and the
 * swarm LM that generation runs on. */
#include "runtime.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "timeutil.h"

#define CALL_TIMEOUT_MS 120000

static void emit(sp_runtime *rt, sp_event_kind kind, const char *text, double done, double total, int row)
{
    if (!rt->on_event)
        return;
    sp_event ev = {.kind = kind, .text = text, .done = done, .total = total, .row = row};
    rt->on_event(&ev, rt->user);
}

static void emitf(sp_runtime *rt, sp_event_kind kind, int row, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void emitf(sp_runtime *rt, sp_event_kind kind, int row, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    emit(rt, kind, buf, 0, 0, row);
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
    /* installed side by side, or the build tree (build/repl/sepal, build/server/sepal-server) */
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
    pthread_mutex_init(&rt->keep_lock, NULL);
    find_server_bin(rt);
    *out = rt;
    return SP_OK;
}

void sp_runtime_free(sp_runtime *rt)
{
    if (!rt)
        return;
    sp_runtime_swarm_down(rt);
    sp_model_free(rt->local);
    sp_tokenizer_free(rt->tok);
    pthread_mutex_destroy(&rt->keep_lock);
    free(rt);
}

sp_status sp_runtime_load(sp_runtime *rt, const char *dir, sp_err *err)
{
    sp_model *m = NULL;
    sp_tokenizer *tok = NULL;
    sp_status st = sp_model_load(&m, dir, SP_LOAD_EMBED | SP_LOAD_HEAD, 0, 0, err);
    if (st)
        return st;
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (access(path, R_OK) == 0 && (st = sp_tokenizer_load(&tok, dir, err))) {
        sp_model_free(m);
        return st;
    }
    sp_model_free(rt->local);
    sp_tokenizer_free(rt->tok);
    rt->local = m;
    rt->tok = tok;
    snprintf(rt->model_dir, sizeof rt->model_dir, "%s", dir);
    emitf(rt, SP_EV_INFO, 0, "loaded %s: %s, %d blocks, hidden %d, vocab %d%s (%.1f MB of local parts)", dir,
          m->cfg.architecture, m->cfg.n_layers, m->cfg.hidden, m->cfg.vocab, tok ? "" : ", no tokenizer",
          (double)m->bytes_loaded / 1e6);
    return SP_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* servers */

static void server_info(sp_runtime *rt, int i)
{
    sp_server_entry *e = &rt->servers[i];
    sp_reply rep;
    sp_err err = {0};
    if (!e->conn || sp_remote_call(e->conn, SP_MSG_INFO, NULL, NULL, 0, &rep, 5000, &err)) {
        if (strcmp(e->state, "unreachable"))
            emitf(rt, SP_EV_SERVER, i, "%s:%d unreachable%s%s", e->host, e->port, err.msg[0] ? ": " : "", err.msg);
        snprintf(e->state, sizeof e->state, "unreachable");
        if (e->conn)
            sp_reply_clear(&rep);
        return;
    }
    int64_t v;
    if (sp_meta_int(&rep.msg, "cache_tokens_available", &v))
        e->cache_left = (long)v;
    if (sp_meta_int(&rep.msg, "cache_tokens_total", &v))
        e->cache_total = (long)v;
    const cJSON *inf = cJSON_GetObjectItemCaseSensitive(rep.msg.meta, "inference_rps");
    const cJSON *fwd = cJSON_GetObjectItemCaseSensitive(rep.msg.meta, "forward_tps");
    e->inference_rps = cJSON_IsNumber(inf) ? inf->valuedouble : 0;
    e->forward_tps = cJSON_IsNumber(fwd) ? fwd->valuedouble : 0;
    snprintf(e->state, sizeof e->state, "online");
    sp_reply_clear(&rep);
}

static sp_status add_server(sp_runtime *rt, const char *host, int port, pid_t pid, sp_err *err)
{
    if (rt->nservers >= SP_RT_MAX_SERVERS)
        return sp_errf(err, SP_ERR_RANGE, "too many servers (%d)", SP_RT_MAX_SERVERS);
    sp_server_entry *e = &rt->servers[rt->nservers];
    memset(e, 0, sizeof *e);
    snprintf(e->host, sizeof e->host, "%s", host);
    e->port = port;
    e->pid = pid;
    sp_status st = sp_remote_connect(&e->conn, host, port, 0, 10000, err);
    if (st)
        return st;
    const sp_remote_info *h = sp_remote_hello(e->conn);
    e->start = h->start;
    e->end = h->end;
    rt->nservers++;
    server_info(rt, rt->nservers - 1);
    emitf(rt, SP_EV_SERVER, rt->nservers - 1, "%s:%d serves blocks %d:%d", host, port, e->start, e->end);
    return SP_OK;
}

void sp_runtime_refresh(sp_runtime *rt)
{
    for (int i = 0; i < rt->nservers; i++)
        server_info(rt, i);
}

sp_status sp_runtime_connect(sp_runtime *rt, const char *addrs, sp_err *err)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", addrs);
    for (char *save = NULL, *a = strtok_r(buf, ",", &save); a; a = strtok_r(NULL, ",", &save)) {
        char *colon = strrchr(a, ':');
        char *end = NULL;
        long port = colon ? strtol(colon + 1, &end, 10) : 0;
        if (!colon || colon == a || !end || *end || port <= 0 || port > 65535)
            return sp_errf(err, SP_ERR_ARG, "bad server address '%s' (expected HOST:PORT)", a);
        *colon = '\0';
        sp_status st = add_server(rt, a, (int)port, 0, err);
        if (st)
            return st;
    }
    return rt->local ? sp_runtime_route(rt, err) : SP_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* a local swarm */

/* Starts one sepal-server for blocks [a, b); returns its pid and the read end of its stdout. */
static pid_t spawn_server(sp_runtime *rt, int idx, int a, int b, int *out_fd, sp_err *err)
{
    int pfd[2];
    if (pipe(pfd))
        return sp_errf(err, SP_ERR_IO, "pipe: %s", strerror(errno)), -1;
    sp_server_entry *e = &rt->servers[rt->nservers];
    snprintf(e->log, sizeof e->log, "%s/sepal-swarm-%d-%d.log", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getpid(), idx);
    pid_t pid = fork();
    if (pid < 0) {
        close(pfd[0]);
        close(pfd[1]);
        return sp_errf(err, SP_ERR_IO, "fork: %s", strerror(errno)), -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* servers never outlive the app */
        dup2(pfd[1], 1);
        close(pfd[0]);
        close(pfd[1]);
        int logfd = open(e->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (logfd >= 0)
            dup2(logfd, 2);
        char blocks[32];
        snprintf(blocks, sizeof blocks, "%d:%d", a, b);
        execl(rt->server_bin, "sepal-server", "--model", rt->model_dir, "--blocks", blocks, (char *)NULL);
        fprintf(stderr, "cannot run %s: %s\n", rt->server_bin, strerror(errno));
        _exit(127);
    }
    close(pfd[1]);
    *out_fd = pfd[0];
    return pid;
}

/* Reads the server's "serving ... at ws://HOST:PORT" line (up to timeout); returns the port or -1. */
static int read_port(int fd, double timeout_s)
{
    char line[1024];
    size_t n = 0;
    double t0 = sp_now_s();
    while (n < sizeof line - 1 && sp_now_s() - t0 < timeout_s) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 200) <= 0)
            continue;
        ssize_t r = read(fd, line + n, 1);
        if (r <= 0)
            return -1;
        if (line[n++] == '\n')
            break;
    }
    line[n] = '\0';
    const char *at = strstr(line, "ws://");
    const char *colon = at ? strchr(at + 5, ':') : NULL;
    return colon ? atoi(colon + 1) : -1;
}

static void split_blocks(int L, int n, int k, int i, int *a, int *b)
{
    if (k <= 0) { /* even split, the remainder spread over the first servers */
        *a = i * L / n;
        *b = (i + 1) * L / n;
    } else { /* spans of k, spread so that together they cover [0, L) (with overlap if n*k > L) */
        *a = n > 1 ? (int)((long)i * (L - k) / (n - 1)) : 0;
        *b = *a + k;
    }
}

sp_status sp_runtime_swarm_up(sp_runtime *rt, int n, int k, sp_err *err)
{
    if (!rt->local)
        return sp_errf(err, SP_ERR_STATE, "no model loaded (load DIR first)");
    int L = rt->local->cfg.n_layers;
    if (n < 1 || n > SP_RT_MAX_SERVERS - rt->nservers)
        return sp_errf(err, SP_ERR_ARG, "swarm up: %d servers is not between 1 and %d", n, SP_RT_MAX_SERVERS);
    if (k < 0 || k > L || (k > 0 && (long)n * k < L) || (k == 0 && n > L))
        return sp_errf(err, SP_ERR_ARG, "swarm up: %d servers of %s blocks cannot cover the model's %d blocks", n,
                       k ? "k" : "at least one", L);
    if (access(rt->server_bin, X_OK) != 0)
        return sp_errf(err, SP_ERR_NOTFOUND, "sepal-server not found at %s (set SEPAL_SERVER_BIN)", rt->server_bin);
    for (int i = 0; i < n; i++) {
        int a, b, fd;
        split_blocks(L, n, k, i, &a, &b);
        emit(rt, SP_EV_PROGRESS, "starting servers", i, n, i);
        pid_t pid = spawn_server(rt, i, a, b, &fd, err);
        if (pid < 0)
            return *err->msg ? err->code : SP_ERR_IO;
        int port = read_port(fd, 300);
        close(fd);
        char log[256];
        snprintf(log, sizeof log, "%s", rt->servers[rt->nservers].log);
        if (port <= 0) {
            kill(pid, SIGTERM);
            waitpid(pid, NULL, 0);
            return sp_errf(err, SP_ERR_IO, "server for blocks %d:%d did not start (see %s)", a, b, log);
        }
        sp_status st = add_server(rt, "127.0.0.1", port, pid, err);
        if (st) {
            kill(pid, SIGTERM);
            waitpid(pid, NULL, 0);
            return st;
        }
        snprintf(rt->servers[rt->nservers - 1].log, sizeof log, "%s", log);
    }
    emit(rt, SP_EV_PROGRESS, "starting servers", n, n, n);
    return sp_runtime_route(rt, err);
}

void sp_runtime_swarm_down(sp_runtime *rt)
{
    for (int i = 0; i < rt->nservers; i++) {
        sp_server_entry *e = &rt->servers[i];
        sp_remote_close(e->conn);
        e->conn = NULL;
        if (e->pid > 0) {
            kill(e->pid, SIGTERM);
            waitpid(e->pid, NULL, 0);
            unlink(e->log);
            emitf(rt, SP_EV_SERVER, i, "%s:%d stopped", e->host, e->port);
        }
    }
    rt->nservers = 0;
    rt->nroute = 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* route */

sp_status sp_runtime_route(sp_runtime *rt, sp_err *err)
{
    if (!rt->local)
        return sp_errf(err, SP_ERR_STATE, "no model loaded");
    int L = rt->local->cfg.n_layers, pos = 0;
    rt->nroute = 0;
    while (pos < L) {
        int best = -1;
        for (int i = 0; i < rt->nservers; i++) {
            const sp_server_entry *e = &rt->servers[i];
            if (strcmp(e->state, "online") || e->start > pos || e->end <= pos)
                continue;
            if (best < 0 || e->end > rt->servers[best].end ||
                (e->end == rt->servers[best].end && e->inference_rps > rt->servers[best].inference_rps))
                best = i;
        }
        if (best < 0)
            return sp_errf(err, SP_ERR_NOTFOUND, "no online server holds block %d (of 0..%d)", pos, L - 1);
        rt->route[rt->nroute++] = (sp_hop){best, pos, rt->servers[best].end};
        pos = rt->servers[best].end;
    }
    char text[1024];
    sp_runtime_route_text(rt, text, sizeof text);
    emit(rt, SP_EV_ROUTE, text, 0, 0, 0);
    return SP_OK;
}

void sp_runtime_route_text(const sp_runtime *rt, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < rt->nroute && n < cap; i++) {
        const sp_hop *h = &rt->route[i];
        const sp_server_entry *e = &rt->servers[h->server];
        n += (size_t)snprintf(buf + n, cap - n, "%s%d:%d %s:%d", i ? " -> " : "", h->start, h->end, e->host, e->port);
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* the swarm as an LM: sessions along the route */

static sp_remote *hop_conn(sp_runtime *rt, int h) { return rt->servers[rt->route[h].server].conn; }

static void swarm_close_sessions(sp_lm_swarm *s)
{
    for (int h = 0; h < s->nhops; h++) {
        if (s->session[h]) {
            char meta[64];
            snprintf(meta, sizeof meta, "{\"session\":%llu}", (unsigned long long)s->session[h]);
            sp_reply rep;
            sp_remote_call(hop_conn(s->rt, h), SP_MSG_INFERENCE_CLOSE, meta, NULL, 0, &rep, 5000, NULL);
            sp_reply_clear(&rep);
        }
        free(s->history[h]);
        s->history[h] = NULL;
        s->session[h] = 0;
    }
    free(s->hypo);
    s->hypo = NULL;
    s->nhops = 0;
}

static sp_status swarm_begin(void *ctx, int B, int max_length, sp_err *err)
{
    sp_lm_swarm *s = ctx;
    sp_runtime *rt = s->rt;
    if (!rt->nroute && sp_runtime_route(rt, err))
        return err ? err->code : SP_ERR_NOTFOUND;
    s->B = B;
    s->max_length = max_length + s->P; /* the prompts take the first P positions */
    max_length = s->max_length;
    s->pos = 0;
    s->nhops = rt->nroute;
    size_t H = (size_t)rt->local->cfg.hidden;
    for (int h = 0; h < s->nhops; h++) {
        char meta[160];
        snprintf(meta, sizeof meta, "{\"start\":%d,\"end\":%d,\"max_length\":%d,\"batch\":%d}", rt->route[h].start,
                 rt->route[h].end, max_length, B);
        sp_reply rep;
        sp_status st = sp_remote_call(hop_conn(rt, h), SP_MSG_INFERENCE_OPEN, meta, NULL, 0, &rep, CALL_TIMEOUT_MS, err);
        int64_t id = 0;
        if (!st && !sp_meta_int(&rep.msg, "session", &id))
            st = sp_errf(err, SP_ERR_FORMAT, "INFERENCE_OPEN reply without a session id");
        sp_reply_clear(&rep);
        s->session[h] = (uint64_t)id;
        s->history[h] = st ? NULL : malloc((size_t)B * max_length * H * sizeof(float));
        if (!st && !s->history[h])
            st = sp_errf(err, SP_ERR_NOMEM, "out of memory");
        if (st) {
            s->nhops = h + 1;
            swarm_close_sessions(s);
            return sp_err_prefix(err, "%s:%d: ", rt->servers[rt->route[h].server].host,
                                 rt->servers[rt->route[h].server].port);
        }
    }
    return SP_OK;
}

/* Appends x [B, T, H] to the history of hop h at positions pos.. */
static void keep_history(sp_lm_swarm *s, int h, const float *x, int T)
{
    size_t H = (size_t)s->rt->local->cfg.hidden;
    for (int b = 0; b < s->B; b++)
        memcpy(s->history[h] + ((size_t)b * s->max_length + s->pos) * H, x + (size_t)b * T * H, T * H * sizeof(float));
}

/* One INFERENCE_STEP on hop h: x [B, T, H] in place; deep: the hop's deep prompts [n, B, P, H] or NULL. */
static sp_status step_hop(sp_lm_swarm *s, int h, float *x, int T, const float *deep, sp_err *err)
{
    sp_runtime *rt = s->rt;
    int H = rt->local->cfg.hidden, nb = rt->route[h].end - rt->route[h].start;
    char meta[96];
    snprintf(meta, sizeof meta, "{\"session\":%llu}", (unsigned long long)s->session[h]);
    sp_tensor_src t[3] = {{.enc = SP_ENC_F32, .rank = 3, .shape = {s->B, T, H}, .f32 = x}};
    int n = 1;
    if (deep)
        t[n++] = (sp_tensor_src){.enc = SP_ENC_F32, .rank = 4, .shape = {nb, s->B, s->P, H}, .f32 = deep};
    if (s->hypo)
        t[n++] = (sp_tensor_src){.enc = SP_ENC_I64, .rank = 1, .shape = {s->B}, .raw = s->hypo};
    sp_reply rep;
    sp_status st = sp_remote_call(hop_conn(rt, h), SP_MSG_INFERENCE_STEP, meta, t, n, &rep, CALL_TIMEOUT_MS, err);
    if (!st) {
        const sp_tensor_view *o = rep.msg.n_tensors ? &rep.msg.t[0] : NULL;
        if (!o || o->rank != 3 || o->shape[0] != s->B || o->shape[1] != T || o->shape[2] != H)
            st = sp_errf(err, SP_ERR_FORMAT, "step reply is not [%d, %d, %d]", s->B, T, H);
        else if (!sp_tensor_all_finite(o))
            st = sp_errf(err, SP_ERR_FORMAT, "step reply holds non-finite values");
        else
            st = sp_tensor_to_f32(o, x, err);
    }
    sp_reply_clear(&rep);
    if (st)
        sp_err_prefix(err, "%s:%d (blocks %d:%d): ", rt->servers[rt->route[h].server].host,
                      rt->servers[rt->route[h].server].port, rt->route[h].start, rt->route[h].end);
    return st;
}

/* The first step with prompts: [B, P + T, H] = shallow prompts then the tokens' embeddings in place of x
 * (x [B, T, H] embedded); deep prompts broadcast over the batch, [L, B, P, H]. */
static sp_status with_prompts(sp_lm_swarm *s, float **x, int B, int T, float **deep, sp_err *err)
{
    size_t H = (size_t)s->rt->local->cfg.hidden, P = (size_t)s->P, L = (size_t)s->rt->local->cfg.n_layers;
    float *y = calloc((size_t)B * (P + T) * H, sizeof(float));
    *deep = s->deep ? malloc(L * B * P * H * sizeof(float)) : NULL;
    if (!y || (s->deep && !*deep)) {
        free(y);
        free(*deep);
        *deep = NULL;
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    }
    for (int b = 0; b < B; b++) {
        if (s->shallow)
            memcpy(y + (size_t)b * (P + T) * H, s->shallow, P * H * sizeof(float));
        memcpy(y + ((size_t)b * (P + T) + P) * H, *x + (size_t)b * T * H, T * H * sizeof(float));
    }
    for (size_t l = 0; *deep && l < L; l++)
        for (int b = 0; b < B; b++)
            memcpy(*deep + (l * B + b) * P * H, s->deep + l * P * H, P * H * sizeof(float));
    free(*x);
    *x = y;
    return SP_OK;
}

static sp_status swarm_forward(void *ctx, const int32_t *ids, int B, int T, float *logits, sp_err *err)
{
    sp_lm_swarm *s = ctx;
    sp_runtime *rt = s->rt;
    int H = rt->local->cfg.hidden, V = rt->local->cfg.vocab;
    float *x = malloc((size_t)B * T * H * sizeof(float)), *last = malloc((size_t)B * H * sizeof(float));
    float *deep = NULL;
    sp_status st = x && last ? sp_model_embed(rt->local, x, ids, B * T, err) : sp_errf(err, SP_ERR_NOMEM, "out of memory");
    if (!st && s->pos == 0 && s->P > 0) {
        st = with_prompts(s, &x, B, T, &deep, err);
        T += s->P;
    }
    for (int h = 0; !st && h < s->nhops; h++) {
        keep_history(s, h, x, T);
        size_t off = (size_t)rt->route[h].start * B * s->P * H;
        st = step_hop(s, h, x, T, deep ? deep + off : NULL, err);
    }
    free(deep);
    free(s->hypo); /* the reorder went out with this step to every hop */
    s->hypo = NULL;
    for (int b = 0; !st && b < B; b++)
        memcpy(last + (size_t)b * H, x + ((size_t)b * T + T - 1) * H, (size_t)H * sizeof(float));
    if (!st)
        st = sp_model_head(rt->local, logits, last, B, err);
    if (!st)
        s->pos += T;
    free(x);
    free(last);
    (void)V;
    return st;
}

/* The servers reorder with the next step (hypo_ids); the history is reordered here, now. */
static sp_status swarm_reorder(void *ctx, const int64_t *src, int B, sp_err *err)
{
    sp_lm_swarm *s = ctx;
    size_t H = (size_t)s->rt->local->cfg.hidden, row = (size_t)s->max_length * H;
    int64_t *composed = malloc((size_t)B * sizeof *composed);
    float *tmp = malloc((size_t)B * row * sizeof(float));
    if (!composed || !tmp) {
        free(composed);
        free(tmp);
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    }
    for (int b = 0; b < B; b++) /* two reorders before a step compose */
        composed[b] = s->hypo ? s->hypo[src[b]] : src[b];
    for (int h = 0; h < s->nhops; h++) {
        memcpy(tmp, s->history[h], (size_t)B * row * sizeof(float));
        for (int b = 0; b < B; b++)
            memcpy(s->history[h] + b * row, tmp + src[b] * row, (size_t)s->pos * H * sizeof(float));
    }
    free(tmp);
    free(s->hypo);
    s->hypo = composed;
    return SP_OK;
}

static void swarm_end(void *ctx) { swarm_close_sessions(ctx); }

void sp_lm_swarm_prompts(sp_lm_swarm *s, sp_lm *lm, const float *shallow, const float *deep, int P)
{
    s->shallow = shallow;
    s->deep = deep;
    s->P = P > 0 ? P : 0;
    lm->max_pos = s->rt->local->cfg.max_pos - s->P;
}

sp_lm sp_lm_swarm_make(sp_lm_swarm *s, sp_runtime *rt)
{
    memset(s, 0, sizeof *s);
    s->rt = rt;
    return (sp_lm){.ctx = s, .vocab = rt->local->cfg.vocab, .max_pos = rt->local->cfg.max_pos, .begin = swarm_begin,
                   .forward = swarm_forward, .reorder = swarm_reorder, .end = swarm_end};
}

/* ---------------------------------------------------------------------------------------------- */
/* forward / backward over the route (training) */

/* One FORWARD or BACKWARD on hop h. t: the tensors (hidden [, grad]); prompts: all blocks' deep prompts
 * [L, B, P, H] or NULL. Tensor 0 of the reply goes to out, tensor 1 (prompt grads) to gp (hop's slice). */
static sp_status call_span(sp_runtime *rt, int h, sp_msg_type type, const sp_tensor_src *t, int n,
                           const float *prompts, int P, float *out, float *gp, int B, int T, const char *keep_key,
                           uint64_t keep_id, sp_err *err)
{
    const sp_hop *hop = &rt->route[h];
    int H = rt->local->cfg.hidden, nb = hop->end - hop->start;
    char meta[128];
    if (keep_id)
        snprintf(meta, sizeof meta, "{\"start\":%d,\"end\":%d,\"%s\":%llu}", hop->start, hop->end, keep_key,
                 (unsigned long long)keep_id);
    else
        snprintf(meta, sizeof meta, "{\"start\":%d,\"end\":%d}", hop->start, hop->end);
    sp_tensor_src a[3];
    memcpy(a, t, (size_t)n * sizeof *t);
    if (prompts)
        a[n++] = (sp_tensor_src){.enc = SP_ENC_F32, .rank = 4, .shape = {nb, B, P, H},
                                 .f32 = prompts + (size_t)hop->start * B * P * H};
    sp_reply rep;
    sp_status st = sp_remote_call(hop_conn(rt, h), type, meta, a, n, &rep, CALL_TIMEOUT_MS, err);
    if (!st) {
        const sp_tensor_view *o = rep.msg.n_tensors ? &rep.msg.t[0] : NULL;
        const sp_tensor_view *g = rep.msg.n_tensors > 1 ? &rep.msg.t[1] : NULL;
        if (!o || o->rank != 3 || o->shape[0] != B || o->shape[1] != T || o->shape[2] != H)
            st = sp_errf(err, SP_ERR_FORMAT, "%s reply is not [%d, %d, %d]", sp_msg_type_name(type), B, T, H);
        else if (!sp_tensor_all_finite(o))
            st = sp_errf(err, SP_ERR_FORMAT, "%s reply holds non-finite values", sp_msg_type_name(type));
        else if (gp && (!g || g->numel != (uint64_t)nb * B * P * H))
            st = sp_errf(err, SP_ERR_FORMAT, "BACKWARD reply lacks the prompts' gradient [%d, %d, %d, %d]", nb, B, P, H);
        else
            st = sp_tensor_to_f32(o, out, err);
        if (!st && gp)
            st = sp_tensor_to_f32(g, gp + (size_t)hop->start * B * P * H, err);
    }
    sp_reply_clear(&rep);
    if (st)
        sp_err_prefix(err, "%s:%d (blocks %d:%d): ", rt->servers[hop->server].host, rt->servers[hop->server].port,
                      hop->start, hop->end);
    return st;
}

/* Registers a FORWARD that keeps activations: ids for its hops, found again by its boundaries. */
static struct sp_keep *keep_register(sp_runtime *rt, const float *boundaries)
{
    pthread_mutex_lock(&rt->keep_lock);
    struct sp_keep *k = &rt->keeps[rt->keep_next_slot++ % 64]; /* the oldest slot: its server entry ages out */
    k->boundaries = boundaries;
    k->nhops = rt->nroute;
    for (int h = 0; h < rt->nroute; h++)
        k->id[h] = ++rt->keep_next_id;
    pthread_mutex_unlock(&rt->keep_lock);
    return k;
}

/* The keep ids of the FORWARD that filled these boundaries (copied out and forgotten), or 0 if none. */
static int keep_lookup(sp_runtime *rt, const float *boundaries, uint64_t *ids)
{
    int n = 0;
    pthread_mutex_lock(&rt->keep_lock);
    for (int i = 0; i < 64; i++)
        if (rt->keeps[i].boundaries == boundaries && rt->keeps[i].nhops == rt->nroute) {
            n = rt->keeps[i].nhops;
            memcpy(ids, rt->keeps[i].id, (size_t)n * sizeof *ids);
            rt->keeps[i].boundaries = NULL;
            break;
        }
    pthread_mutex_unlock(&rt->keep_lock);
    return n;
}

/* Hop h of a pipelined microbatch waits for its turn on that stage (pipeline.h); call_span then leave. */
static sp_status gated_call(sp_runtime *rt, const sp_pipe_ticket *tk, int h, sp_msg_type type, const sp_tensor_src *t,
                            int n, const float *prompts, int P, float *out, float *gp, int B, int T,
                            const char *keep_key, uint64_t keep_id, sp_err *err)
{
    int bwd = type == SP_MSG_BACKWARD;
    if (tk && tk->pipe) {
        if (sp_pipe_stages(tk->pipe) != rt->nroute)
            return sp_errf(err, SP_ERR_STATE, "pipeline of %d stages over a route of %d hops", sp_pipe_stages(tk->pipe),
                           rt->nroute);
        sp_status st = sp_pipe_enter(tk->pipe, h, bwd, tk->mb, err);
        if (st)
            return st;
    }
    sp_status st = call_span(rt, h, type, t, n, prompts, P, out, gp, B, T, keep_key, keep_id, err);
    if (tk && tk->pipe)
        sp_pipe_leave(tk->pipe, h, bwd, tk->mb, tk->nsub);
    return st;
}

sp_status sp_runtime_forward(sp_runtime *rt, float *hidden, int B, int T, const float *prompts, int P,
                             float *boundaries, const sp_pipe_ticket *tk, sp_err *err)
{
    if (!rt->nroute && sp_runtime_route(rt, err))
        return err ? err->code : SP_ERR_NOTFOUND;
    int H = rt->local->cfg.hidden;
    size_t N = (size_t)B * T * H;
    uint64_t ids[SP_RT_MAX_SERVERS] = {0};
    if (boundaries) { /* a backward will follow: the servers keep what it needs */
        struct sp_keep *k = keep_register(rt, boundaries);
        memcpy(ids, k->id, (size_t)rt->nroute * sizeof *ids);
    }
    for (int h = 0; h < rt->nroute; h++) {
        if (boundaries)
            memcpy(boundaries + h * N, hidden, N * sizeof(float));
        sp_tensor_src t = {.enc = SP_ENC_F32, .rank = 3, .shape = {B, T, H}, .f32 = hidden};
        sp_status st = gated_call(rt, tk, h, SP_MSG_FORWARD, &t, 1, prompts, P, hidden, NULL, B, T, "keep", ids[h], err);
        if (st)
            return st;
    }
    return SP_OK;
}

sp_status sp_runtime_backward(sp_runtime *rt, float *grad, int B, int T, const float *prompts, int P,
                              const float *boundaries, float *grad_prompts, const sp_pipe_ticket *tk, sp_err *err)
{
    int H = rt->local->cfg.hidden;
    size_t N = (size_t)B * T * H;
    uint64_t ids[SP_RT_MAX_SERVERS] = {0};
    keep_lookup(rt, boundaries, ids); /* none: the servers recompute their forward */
    for (int h = rt->nroute - 1; h >= 0; h--) {
        sp_tensor_src t[2] = {{.enc = SP_ENC_F32, .rank = 3, .shape = {B, T, H}, .f32 = boundaries + h * N},
                              {.enc = SP_ENC_F32, .rank = 3, .shape = {B, T, H}, .f32 = grad}};
        sp_status st = gated_call(rt, tk, h, SP_MSG_BACKWARD, t, 2, prompts, P, grad, prompts ? grad_prompts : NULL, B,
                                  T, "kept", ids[h], err);
        if (st)
            return st;
    }
    return SP_OK;
}
