/* servers.c - the servers a runtime knows: connected by address, or started here as a local swarm. */
#include "swarm_impl.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "timeutil.h"

/* ---------------------------------------------------------------------------------------------- */
/* servers */

static void server_info(sp_runtime *rt, int i)
{
    sp_server_entry *e = &rt->servers[i];
    sp_reply rep;
    sp_err err = {0};
    if (!e->conn || sp_remote_call(e->conn, SP_MSG_INFO, NULL, NULL, 0, &rep, 5000, &err)) {
        if (strcmp(e->state, "unreachable"))
            sp_rt_emitf(rt, SP_EV_SERVER, i, "%s:%d unreachable%s%s", e->host, e->port, err.msg[0] ? ": " : "", err.msg);
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
    sp_rt_emitf(rt, SP_EV_SERVER, rt->nservers - 1, "%s:%d serves blocks %d:%d", host, port, e->start, e->end);
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
        sp_rt_emit(rt, SP_EV_PROGRESS, "starting servers", i, n, i);
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
    sp_rt_emit(rt, SP_EV_PROGRESS, "starting servers", n, n, n);
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
            sp_rt_emitf(rt, SP_EV_SERVER, i, "%s:%d stopped", e->host, e->port);
        }
    }
    rt->nservers = 0;
    rt->nroute = 0;
}

