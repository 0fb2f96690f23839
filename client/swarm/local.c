/* local.c - `swarm up`: a real swarm of sepal-server processes on loopback, the one-machine default. The
 * first server starts the swarm (--new-swarm), the client joins through its DHT node, and each further
 * server joins the same way and chooses its own blocks (--num-blocks, Petals' block selection): so the
 * default runs the code of a real deployment. Servers start one after another, each once the one before is
 * ONLINE in the client's view, so each chooses knowing where the others are. */
#include "swarm_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "timeutil.h"

#define START_TIMEOUT_S 300

/* Starts `sepal-server --num-blocks k` (first: --new-swarm, else --initial-peers peers); its stdout is
 * returned in *out_fd, its stderr goes to log. */
static pid_t spawn_server(sp_runtime *rt, int k, const char *peers, const char *log, int *out_fd, sp_err *err)
{
    int pfd[2];
    if (pipe(pfd))
        return sp_errf(err, SP_ERR_IO, "pipe: %s", strerror(errno)), -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(pfd[0]);
        close(pfd[1]);
        return sp_errf(err, SP_ERR_IO, "fork: %s", strerror(errno)), -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* servers never outlive the app */
        setpgid(0, 0); /* a Ctrl-C at the terminal stops the app's command, not its servers */
        sigset_t none; /* the thread that forked may block signals (the TUI's workers do): not the server */
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        dup2(pfd[1], 1);
        close(pfd[0]);
        close(pfd[1]);
        int logfd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (logfd >= 0)
            dup2(logfd, 2);
        char blocks[32];
        snprintf(blocks, sizeof blocks, "%d", k);
        const char *argv[20] = {"sepal-server", "--model", rt->model_dir, "--num-blocks", blocks,
                                "--selection-delay", "0", "--balance-period", "5"};
        int n = 9;
        if (peers) {
            argv[n++] = "--initial-peers";
            argv[n++] = peers;
        } else {
            argv[n++] = "--new-swarm";
        }
        char threads[16];
        if (rt->swarm_threads > 0) {
            snprintf(threads, sizeof threads, "%d", rt->swarm_threads);
            argv[n++] = "--threads";
            argv[n++] = threads;
        }
        if (rt->has_key) { /* a private swarm: the servers hold its key too */
            argv[n++] = "--swarm-key";
            argv[n++] = rt->key_path;
        }
        argv[n] = NULL;
        execv(rt->server_bin, (char *const *)argv);
        fprintf(stderr, "cannot run %s: %s\n", rt->server_bin, strerror(errno));
        _exit(127);
    }
    close(pfd[1]);
    *out_fd = pfd[0];
    return pid;
}

/* Reads the server's "serving ... at ws://HOST:PORT (... DHT HOST:D) ..." line (up to timeout): its ws
 * port (or -1) and its DHT port. */
static int read_ports(sp_runtime *rt, int fd, double timeout_s, int *dht_port)
{
    char line[1024];
    size_t n = 0;
    double t0 = sp_now_s();
    *dht_port = -1;
    while (n < sizeof line - 1 && sp_now_s() - t0 < timeout_s) {
        if (sp_runtime_cancelled(rt))
            return -1;
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
    const char *dht = strstr(line, "DHT ");
    const char *dcolon = dht ? strchr(dht + 4, ':') : NULL;
    *dht_port = dcolon ? atoi(dcolon + 1) : -1;
    return colon ? atoi(colon + 1) : -1;
}

/* Blocks per server: k each, or an even split of L over n. */
static int blocks_of(int L, int n, int k, int i) { return k > 0 ? k : (i + 1) * L / n - i * L / n; }

static sp_status check_swarm_args(sp_runtime *rt, int n, int k, sp_err *err)
{
    if (!rt->local)
        return sp_errf(err, SP_ERR_STATE, "no model loaded (load DIR first)");
    int L = rt->local->cfg.n_layers;
    if (rt->swarm_started)
        return sp_errf(err, SP_ERR_STATE, "a swarm is already up (swarm down first)");
    if (rt->dht)
        return sp_errf(err, SP_ERR_STATE, "already in a swarm (joined through %s)", rt->initial_peers);
    if (n < 1 || n > 256)
        return sp_errf(err, SP_ERR_ARG, "swarm up: %d servers is not between 1 and 256", n);
    if (k == 0 && n > L)
        return sp_errf(err, SP_ERR_ARG, "swarm up: %d servers for %d blocks leave some without a block (at most %d)",
                       n, L, L);
    if (k > L)
        return sp_errf(err, SP_ERR_ARG, "swarm up: --blocks-per-server %d is more than the model's %d blocks", k, L);
    if (k > 0 && (long)n * k < L)
        return sp_errf(err, SP_ERR_ARG, "swarm up: %d servers of %d blocks cannot cover the model's %d blocks "
                       "(need at least %d servers)", n, k, L, (L + k - 1) / k);
    if (access(rt->server_bin, X_OK) != 0)
        return sp_errf(err, SP_ERR_NOTFOUND, "sepal-server not found at %s (set SEPAL_SERVER_BIN)", rt->server_bin);
    return SP_OK;
}

/* Starts server i and waits until the client's view shows it ONLINE; first: also joins through it. */
static sp_status start_one(sp_runtime *rt, int i, int k, char *peers, size_t cap, sp_err *err)
{
    char log[256];
    snprintf(log, sizeof log, "%s/sepal-swarm-%d-%d.log", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getpid(), i);
    int fd, dht_port = -1;
    pid_t pid = spawn_server(rt, k, i ? peers : NULL, log, &fd, err);
    if (pid < 0)
        return err && err->code ? err->code : SP_ERR_IO;
    int port = read_ports(rt, fd, START_TIMEOUT_S, &dht_port);
    close(fd);
    sp_status st = SP_OK;
    if (sp_runtime_cancelled(rt))
        st = sp_errf(err, SP_ERR_CANCELLED, "swarm up: cancelled while server %d started", i + 1);
    else if (port <= 0 || dht_port <= 0)
        st = sp_errf(err, SP_ERR_IO, "server %d did not start (see %s)", i + 1, log);
    if (!st && i == 0) {
        snprintf(peers, cap, "127.0.0.1:%d", dht_port);
        st = sp_runtime_join(rt, peers, err);
    }
    int idx = st ? -1 : sp_rt_wait_server(rt, port, 30);
    if (!st && idx < 0 && sp_runtime_cancelled(rt))
        st = sp_errf(err, SP_ERR_CANCELLED, "swarm up: cancelled while server %d joined", i + 1);
    else if (!st && idx < 0)
        st = sp_errf(err, SP_ERR_TIMEOUT, "server %d (port %d) did not appear in the swarm within 30 s (see %s)", i + 1,
                     port, log);
    if (st) {
        kill(pid, SIGTERM);
        waitpid(pid, NULL, 0);
        return st;
    }
    pthread_mutex_lock(&rt->lock);
    rt->servers[idx]->pid = pid;
    snprintf(rt->servers[idx]->log, sizeof rt->servers[idx]->log, "%s", log);
    pthread_mutex_unlock(&rt->lock);
    return SP_OK;
}

/* The first block no online server of ours holds, or -1. */
static int first_hole(sp_runtime *rt, int L)
{
    int hole = -1;
    pthread_mutex_lock(&rt->lock);
    for (int b = 0; b < L && hole < 0; b++) {
        int held = 0;
        for (int i = 0; i < rt->nservers && !held; i++) {
            const sp_server_entry *e = rt->servers[i];
            held = e->pid > 0 && !e->gone && e->rec.state == SP_SERVER_ONLINE && e->rec.start <= b && b < e->rec.end;
        }
        if (!held)
            hole = b;
    }
    pthread_mutex_unlock(&rt->lock);
    return hole;
}

void sp_runtime_swarm_threads(sp_runtime *rt, int threads) { rt->swarm_threads = threads > 0 ? threads : 0; }

sp_status sp_runtime_swarm_up(sp_runtime *rt, int n, int k, sp_err *err)
{
    sp_status st = check_swarm_args(rt, n, k, err);
    if (st)
        return st;
    int L = rt->local->cfg.n_layers;
    char peers[128] = "";
    rt->swarm_started = 1;
    for (int i = 0; i < n && !st; i++) {
        sp_rt_emit(rt, SP_EV_PROGRESS, "starting servers", i, n, i);
        st = start_one(rt, i, blocks_of(L, n, k, i), peers, sizeof peers, err);
    }
    if (st) {
        sp_runtime_swarm_down(rt);
        return st;
    }
    sp_rt_emit(rt, SP_EV_PROGRESS, "starting servers", n, n, n);
    /* each server chose its blocks from what it saw; on a busy machine one may have seen too little and doubled
     * another's span: they rebalance (every few seconds here), and the swarm is up once every block is served */
    int L2 = rt->local->cfg.n_layers, hole = -1;
    for (double end = sp_now_s() + 30; !st;) {
        hole = first_hole(rt, L2);
        if (hole < 0 || sp_now_s() > end)
            break;
        if (sp_rt_sleep(rt, 0.05))
            st = sp_errf(err, SP_ERR_CANCELLED, "swarm up: cancelled while the servers rebalanced");
    }
    if (!st && hole >= 0)
        st = sp_errf(err, SP_ERR_TIMEOUT, "swarm up: no server took block %d within 30 s", hole);
    if (st) {
        sp_runtime_swarm_down(rt);
        return st;
    }
    /* the spans in block order (the servers are listed in the order the DHT view found them) */
    int span[256][2], ns = 0;
    pthread_mutex_lock(&rt->lock);
    for (int i = 0; i < rt->nservers && ns < 256; i++)
        if (rt->servers[i]->pid > 0 && !rt->servers[i]->gone) {
            int a = rt->servers[i]->rec.start, b = rt->servers[i]->rec.end, at = ns++;
            for (; at > 0 && (span[at - 1][0] > a || (span[at - 1][0] == a && span[at - 1][1] > b)); at--) {
                span[at][0] = span[at - 1][0];
                span[at][1] = span[at - 1][1];
            }
            span[at][0] = a;
            span[at][1] = b;
        }
    pthread_mutex_unlock(&rt->lock);
    char spans[1024];
    size_t m = 0;
    for (int i = 0; i < ns && m < sizeof spans; i++)
        m += (size_t)snprintf(spans + m, sizeof spans - m, "%s%d:%d", m ? ", " : "", span[i][0], span[i][1]);
    sp_rt_emitf(rt, SP_EV_INFO, 0, "%d server%s: blocks %s", n, n > 1 ? "s" : "", spans);
    sp_rt_forget_pings(rt); /* taken while servers started: the route measures them again */
    return sp_runtime_route(rt, err);
}

void sp_rt_reap_local(sp_runtime *rt)
{
    pthread_mutex_lock(&rt->lock);
    int n = rt->nservers;
    pthread_mutex_unlock(&rt->lock);
    for (int i = 0; i < n; i++) {
        sp_server_entry *e = rt->servers[i];
        pthread_mutex_lock(&rt->lock);
        pid_t pid = e->pid;
        pthread_mutex_unlock(&rt->lock);
        int status;
        if (pid <= 0 || waitpid(pid, &status, WNOHANG) != pid)
            continue;
        pthread_mutex_lock(&rt->lock);
        e->pid = 0;
        e->gone = 1;
        pthread_mutex_unlock(&rt->lock);
        char how[64];
        if (WIFSIGNALED(status))
            snprintf(how, sizeof how, "killed by signal %d", WTERMSIG(status));
        else
            snprintf(how, sizeof how, "exit status %d", WEXITSTATUS(status));
        sp_rt_emitf(rt, SP_EV_SERVER, i, "server %s at %s:%d (blocks %d:%d) exited (%s); its log: %s", e->rec.id,
                    e->rec.host, e->rec.port, e->rec.start, e->rec.end, how, e->log);
    }
}

void sp_runtime_swarm_down(sp_runtime *rt)
{
    pthread_mutex_lock(&rt->lock);
    int n = rt->nservers;
    pthread_mutex_unlock(&rt->lock);
    for (int i = 0; i < n; i++) { /* all at once: each announces OFFLINE and stops */
        sp_server_entry *e = rt->servers[i];
        if (e->pid > 0)
            kill(e->pid, SIGTERM);
    }
    for (int i = 0; i < n; i++) {
        sp_server_entry *e = rt->servers[i];
        if (e->pid <= 0)
            continue;
        waitpid(e->pid, NULL, 0);
        unlink(e->log);
        sp_rt_emitf(rt, SP_EV_SERVER, i, "%s:%d stopped", e->rec.host, e->rec.port);
        pthread_mutex_lock(&rt->lock);
        e->pid = 0;
        e->gone = 1;
        pthread_mutex_unlock(&rt->lock);
    }
    sp_rt_close_conns(rt);
    if (rt->swarm_started || !rt->dht) /* our own swarm is gone; a joined one stays */
        sp_rt_leave(rt);
    pthread_mutex_lock(&rt->lock);
    for (int i = 0; i < rt->nservers; i++)
        if (!rt->servers[i]->from_dht || rt->swarm_started)
            rt->servers[i]->gone = 1;
    rt->route.nhops = rt->route.nstages = 0;
    pthread_mutex_unlock(&rt->lock);
    rt->swarm_started = 0;
}
