/* dht.c - runs `sepal-dht` (dht/node.cpp) as a child and keeps it running.
 *
 * The child talks over a socketpair (its stdin and stdout; a socket, so that writes to a dead child fail
 * with EPIPE instead of raising SIGPIPE: MSG_NOSIGNAL). One thread reads its events and calls the
 * callbacks; when the child dies it is reaped, reported, and started again after a backoff (0.1 s doubling
 * to 5 s; back to 0.1 s once a child ran for 30 s) on the same port, and everything this side asked for is
 * asked again: the bootstrap peers, the listened keys and the last publication of every (key, slot). A
 * node that still knows no peer is asked to bootstrap again every 2 s (a datagram lost under load would
 * otherwise leave it alone for a long time). The child's UDP front (front.h) refuses malformed datagrams; how
 * many it refused comes with its stats, and an event says so at most once a minute. */
#include "dht.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "timeutil.h"

#define READY_TIMEOUT_S 10.0
#define BACKOFF_MIN_S 0.1
#define BACKOFF_MAX_S 5.0
#define HEALTHY_S 30.0
#define REFUSED_EVERY_S 60.0 /* at most one event a minute about datagrams the front refused */

typedef struct pub {
    char *key, *slot;
    int ttl;
    uint8_t *data;
    size_t len;
} pub;

/* Buffered reading of the child's output. */
typedef struct reader {
    int fd;
    char buf[65536];
    size_t off, len;
} reader;

struct sp_dht {
    sp_dht_opts o;
    char helper[PATH_MAX];
    char bind[64];
    uint32_t network;
    pthread_mutex_t lock;  /* everything below; also serialises writes to the child */
    pthread_cond_t cond;
    pid_t pid;
    int fd;                /* our end of the socketpair, -1 while no child runs */
    int port, restarts, good;
    double started;        /* sp_now_s() of the child's start */
    double last_boot;      /* sp_now_s() when the peers were last asked to bootstrap through */
    char **peers;          /* "host port" */
    int *heard;            /* per peer: 1 it answered a ping, -1 a ping went unanswered, 0 not yet known */
    int npeers;
    char **listens;
    int nlistens;
    pub *pubs;
    int npubs;
    int pending;           /* puts not yet acknowledged */
    uint64_t refused_old;  /* datagrams the fronts of earlier children refused */
    uint64_t refused;      /* ... and of this one */
    uint64_t refused_told; /* the total when an event last said it */
    double refused_told_at;
    char refusal[128];     /* the rule the last one broke */
    int stop, exited;
    reader rd;
    pthread_t thread;
    int thread_started;
};

/* ---------------------------------------------------------------------------------------------- */
/* the child */

static void find_helper(sp_dht *d, const char *given)
{
    const char *env = getenv("SEPAL_DHT_BIN");
    if (given && *given) {
        snprintf(d->helper, sizeof d->helper, "%s", given);
        return;
    }
    if (env && *env) {
        snprintf(d->helper, sizeof d->helper, "%s", env);
        return;
    }
    char self[PATH_MAX - 32];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    self[n > 0 ? n : 0] = '\0';
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = '\0';
    snprintf(d->helper, sizeof d->helper, "%s/sepal-dht", self); /* installed side by side */
    if (access(d->helper, X_OK) != 0)                             /* the build tree */
        snprintf(d->helper, sizeof d->helper, "%s/../dht/sepal-dht", self);
}

/* Starts the child on d->port; d->fd is our end. */
static sp_status spawn(sp_dht *d, sp_err *err)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv))
        return sp_errf(err, SP_ERR_IO, "DHT node: socketpair: %s", strerror(errno));
    char port[16], net[16];
    snprintf(port, sizeof port, "%d", d->port);
    snprintf(net, sizeof net, "0x%x", d->network);
    pid_t pid = fork();
    if (pid < 0) {
        close(sv[0]);
        close(sv[1]);
        return sp_errf(err, SP_ERR_IO, "DHT node: fork: %s", strerror(errno));
    }
    if (pid == 0) {
        setpgid(0, 0); /* not in the terminal's foreground group: a Ctrl-C there is for our process to handle */
        dup2(sv[1], 0); /* dup2 clears close-on-exec */
        dup2(sv[1], 1);
        closefrom(3);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execl(d->helper, "sepal-dht", d->bind, port, net, (char *)NULL);
        dprintf(1, "error cannot run %s: %s\n", d->helper, strerror(errno));
        _exit(127);
    }
    close(sv[1]);
    d->pid = pid;
    d->fd = sv[0];
    d->rd = (reader){.fd = sv[0]};
    d->started = sp_now_s();
    return SP_OK;
}

/* Next line of the child's output (without '\n') into line; 0 on success, -1 at EOF or after timeout_s
 * (< 0: wait forever). */
static int read_line(reader *r, char *line, size_t cap, double timeout_s)
{
    double end = sp_now_s() + timeout_s;
    for (;;) {
        char *nl = memchr(r->buf + r->off, '\n', r->len - r->off);
        if (nl) {
            size_t n = (size_t)(nl - (r->buf + r->off));
            size_t k = n < cap - 1 ? n : cap - 1;
            memcpy(line, r->buf + r->off, k);
            line[k] = '\0';
            r->off += n + 1;
            return 0;
        }
        if (r->off > 0) { /* make room */
            memmove(r->buf, r->buf + r->off, r->len - r->off);
            r->len -= r->off;
            r->off = 0;
        }
        if (r->len == sizeof r->buf) /* a line longer than the buffer: drop it */
            r->len = 0;
        if (timeout_s >= 0) {
            double left = end - sp_now_s();
            struct pollfd p = {.fd = r->fd, .events = POLLIN};
            if (left <= 0 || poll(&p, 1, (int)(left * 1000) + 1) <= 0)
                return -1;
        }
        ssize_t n = read(r->fd, r->buf + r->len, sizeof r->buf - r->len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        r->len += (size_t)n;
    }
}

/* Exactly n bytes of a value's payload. */
static int read_bytes(reader *r, uint8_t *out, size_t n)
{
    size_t have = r->len - r->off < n ? r->len - r->off : n;
    memcpy(out, r->buf + r->off, have);
    r->off += have;
    while (have < n) {
        ssize_t k = read(r->fd, out + have, n - have);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        have += (size_t)k;
    }
    return 0;
}

/* Writes a command (and a payload) to the child; caller holds d->lock. A dead child is ignored: its
 * restart asks again. */
static void send_locked(sp_dht *d, const char *line, const void *data, size_t len)
{
    if (d->fd < 0)
        return;
    const char *parts[2] = {line, data};
    size_t lens[2] = {strlen(line), len};
    for (int i = 0; i < 2; i++)
        for (size_t off = 0; off < lens[i];) {
            ssize_t n = send(d->fd, parts[i] + off, lens[i] - off, MSG_NOSIGNAL);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                return;
            off += (size_t)n;
        }
}

static void send_put_locked(sp_dht *d, const pub *p)
{
    char line[512];
    snprintf(line, sizeof line, "put %s %s %d %zu\n", p->key, p->slot, p->ttl, p->len);
    send_locked(d, line, p->data, p->len);
    d->pending++;
}

/* Everything this side asked for, asked again of a new child. */
static void replay_locked(sp_dht *d)
{
    char line[512];
    for (int i = 0; i < d->npeers; i++) {
        snprintf(line, sizeof line, "boot %s\n", d->peers[i]);
        send_locked(d, line, NULL, 0);
    }
    for (int i = 0; i < d->nlistens; i++) {
        snprintf(line, sizeof line, "listen %s\n", d->listens[i]);
        send_locked(d, line, NULL, 0);
    }
    d->pending = 0;
    for (int i = 0; i < d->npubs; i++)
        send_put_locked(d, &d->pubs[i]);
}

/* Starts a child and waits for its `ready` (it says the port it bound). */
static sp_status start_child(sp_dht *d, sp_err *err)
{
    sp_status st = spawn(d, err);
    if (st)
        return st;
    char line[512];
    while (read_line(&d->rd, line, sizeof line, READY_TIMEOUT_S) == 0) {
        int port;
        if (sscanf(line, "ready %d", &port) == 1) {
            d->port = port;
            return SP_OK;
        }
        if (!strncmp(line, "error ", 6)) {
            st = sp_errf(err, SP_ERR_IO, "DHT node on %s:%d: %s", d->bind, d->port, line + 6);
            break;
        }
    }
    if (!st)
        st = sp_errf(err, SP_ERR_IO, "DHT node %s did not start within %.0f s (set SEPAL_DHT_BIN to sepal-dht)",
                     d->helper, READY_TIMEOUT_S);
    kill(d->pid, SIGKILL);
    waitpid(d->pid, NULL, 0);
    close(d->fd);
    d->fd = -1;
    d->pid = -1;
    return st;
}

/* ---------------------------------------------------------------------------------------------- */
/* the reader and supervisor thread */

static void event(sp_dht *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void event(sp_dht *d, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (d->o.on_event)
        d->o.on_event(d->o.user, buf);
}

/* A stats line's refusal count and reason; an event when there are new ones and the last is a minute old. */
static void note_refused(sp_dht *d, const char *line)
{
    unsigned long long n = 0;
    int at = 0;
    if (sscanf(line, "stats %*d %*d %llu %n", &n, &at) < 1)
        return;
    pthread_mutex_lock(&d->lock);
    d->refused = n;
    if (at > 0)
        snprintf(d->refusal, sizeof d->refusal, "%s", line + at);
    uint64_t total = d->refused_old + d->refused, news = total - d->refused_told;
    int tell = news > 0 && sp_now_s() - d->refused_told_at >= REFUSED_EVERY_S;
    if (tell) {
        d->refused_told = total;
        d->refused_told_at = sp_now_s();
    }
    char why[sizeof d->refusal];
    memcpy(why, d->refusal, sizeof why);
    pthread_mutex_unlock(&d->lock);
    if (tell)
        event(d, "DHT node: refused %llu datagram%s (%llu in all; the last: %s)", (unsigned long long)news,
              news == 1 ? "" : "s", (unsigned long long)total, why);
}

/* One event line from the child. -1 when its payload could not be read. */
static int handle(sp_dht *d, const char *line)
{
    char key[SP_DHT_MAX_KEY + 1], slot[SP_DHT_MAX_KEY + 1];
    int expired, ok, good, dubious, port;
    size_t len;
    if (sscanf(line, "value %200s %d %zu", key, &expired, &len) == 3) {
        uint8_t *data = len <= SP_DHT_MAX_VALUE ? malloc(len ? len : 1) : NULL;
        if (!data || read_bytes(&d->rd, data, len)) {
            free(data);
            return -1;
        }
        if (d->o.on_value)
            d->o.on_value(d->o.user, key, data, len, expired);
        free(data);
    } else if (sscanf(line, "done %200s %d", key, &ok) == 2) {
        if (d->o.on_get_done)
            d->o.on_get_done(d->o.user, key, ok);
    } else if (sscanf(line, "putdone %200s %200s %d", key, slot, &ok) == 3) {
        pthread_mutex_lock(&d->lock);
        if (d->pending > 0 && --d->pending == 0)
            pthread_cond_broadcast(&d->cond);
        pthread_mutex_unlock(&d->lock);
    } else if (sscanf(line, "pong %130s %d %d", key, &port, &ok) == 3) { /* key: the peer's host */
        char hp[sizeof key + 16];
        snprintf(hp, sizeof hp, "%s %d", key, port);
        pthread_mutex_lock(&d->lock);
        for (int i = 0; i < d->npeers; i++)
            if (!strcmp(d->peers[i], hp) && d->heard[i] != 1)
                d->heard[i] = ok ? 1 : -1;
        pthread_cond_broadcast(&d->cond);
        pthread_mutex_unlock(&d->lock);
    } else if (sscanf(line, "stats %d %d", &good, &dubious) == 2) {
        pthread_mutex_lock(&d->lock);
        d->good = good;
        if (good == 0 && sp_now_s() - d->last_boot > 1.0) { /* a lost bootstrap datagram: OpenDHT retries late */
            char l[200];
            for (int i = 0; i < d->npeers; i++) {
                snprintf(l, sizeof l, "boot %s\n", d->peers[i]);
                send_locked(d, l, NULL, 0);
            }
            d->last_boot = sp_now_s();
        }
        pthread_cond_broadcast(&d->cond);
        pthread_mutex_unlock(&d->lock);
        note_refused(d, line);
    } else if (!strncmp(line, "error ", 6)) {
        event(d, "DHT node: %s", line + 6);
    }
    return 0;
}

/* Waits on d->cond for at most s seconds. Caller holds d->lock. */
static void wait_locked(sp_dht *d, double s)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long ns = ts.tv_nsec + (long)((s > 0 ? s : 0) * 1e9);
    ts.tv_sec += ns / 1000000000L;
    ts.tv_nsec = ns % 1000000000L;
    pthread_cond_timedwait(&d->cond, &d->lock, &ts);
}

/* Waits s seconds or until stopping; 1 if stopping. Caller holds d->lock. */
static int nap_locked(sp_dht *d, double s)
{
    double end = sp_now_s() + s;
    while (!d->stop && sp_now_s() < end)
        wait_locked(d, end - sp_now_s() < 0.05 ? end - sp_now_s() : 0.05);
    return d->stop;
}

/* The child is gone: reap it and say how it ended. */
static void reap(sp_dht *d)
{
    int status = 0;
    pid_t pid = d->pid;
    if (pid > 0)
        waitpid(pid, &status, 0);
    pthread_mutex_lock(&d->lock);
    close(d->fd);
    d->fd = -1;
    d->pid = -1;
    d->exited = 1;
    d->pending = 0;
    d->refused_old += d->refused;
    d->refused = 0;
    pthread_cond_broadcast(&d->cond);
    int stopping = d->stop;
    pthread_mutex_unlock(&d->lock);
    if (!stopping) {
        if (WIFSIGNALED(status))
            event(d, "DHT node died (signal %d)", WTERMSIG(status));
        else
            event(d, "DHT node exited (status %d)", WEXITSTATUS(status));
    }
}

static void *supervise(void *arg)
{
    sp_dht *d = arg;
    double backoff = BACKOFF_MIN_S;
    char line[1024];
    for (;;) {
        while (read_line(&d->rd, line, sizeof line, -1) == 0)
            if (handle(d, line))
                break;
        reap(d);
        pthread_mutex_lock(&d->lock);
        if (sp_now_s() - d->started > HEALTHY_S)
            backoff = BACKOFF_MIN_S;
        for (;;) {
            if (nap_locked(d, backoff)) {
                pthread_mutex_unlock(&d->lock);
                return NULL;
            }
            backoff = backoff * 2 < BACKOFF_MAX_S ? backoff * 2 : BACKOFF_MAX_S;
            sp_err err = {0};
            d->exited = 0;
            if (!start_child(d, &err)) {
                d->restarts++;
                replay_locked(d);
                break;
            }
            event(d, "%s", err.msg);
        }
        int port = d->port;
        pthread_mutex_unlock(&d->lock);
        event(d, "DHT node restarted on %s:%d", d->bind, port);
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* the API */

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    return p ? memcpy(p, s, n) : NULL;
}

static int name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > SP_DHT_MAX_KEY)
        return 0;
    for (; *s; s++)
        if ((unsigned char)*s <= ' ' || *s == 0x7f)
            return 0;
    return 1;
}

static void add_peer_locked(sp_dht *d, const char *host, int port)
{
    char hp[160];
    snprintf(hp, sizeof hp, "%s %d", host, port);
    for (int i = 0; i < d->npeers; i++)
        if (!strcmp(d->peers[i], hp))
            return;
    char **n = realloc(d->peers, (size_t)(d->npeers + 1) * sizeof *n);
    if (n)
        d->peers = n;
    int *h = n ? realloc(d->heard, (size_t)(d->npeers + 1) * sizeof *h) : NULL;
    if (h)
        d->heard = h;
    if (!h || !(n[d->npeers] = dup_str(hp)))
        return;
    h[d->npeers] = 0;
    d->npeers++;
    char line[200];
    snprintf(line, sizeof line, "boot %s\n", hp);
    send_locked(d, line, NULL, 0);
}

/* "host:port,host:port" into the peer list. */
static sp_status parse_peers(sp_dht *d, const char *list, sp_err *err)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *t = strtok_r(buf, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
        char *colon = strrchr(t, ':'), *end = NULL;
        long port = colon ? strtol(colon + 1, &end, 10) : 0;
        if (!colon || colon == t || !end || *end || port <= 0 || port > 65535 || colon - t > 128)
            return sp_errf(err, SP_ERR_ARG, "bad DHT peer '%s' (expected HOST:PORT)", t);
        *colon = '\0';
        add_peer_locked(d, t, (int)port);
    }
    return SP_OK;
}

sp_status sp_dht_start(sp_dht **out, const sp_dht_opts *o, sp_err *err)
{
    *out = NULL;
    sp_dht *d = calloc(1, sizeof *d);
    if (!d)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    d->o = *o;
    d->fd = -1;
    d->pid = -1;
    d->port = o->port;
    d->network = o->network ? o->network : SP_DHT_NETWORK;
    snprintf(d->bind, sizeof d->bind, "%s", o->bind && *o->bind ? o->bind : "127.0.0.1");
    find_helper(d, o->helper);
    pthread_mutex_init(&d->lock, NULL);
    pthread_cond_init(&d->cond, NULL);
    sp_status st = SP_OK;
    if (access(d->helper, X_OK) != 0)
        st = sp_errf(err, SP_ERR_NOTFOUND, "DHT node program %s: %s (set SEPAL_DHT_BIN to sepal-dht)", d->helper,
                     strerror(errno));
    if (!st)
        st = start_child(d, err);
    if (!st && o->bootstrap && *o->bootstrap) {
        pthread_mutex_lock(&d->lock);
        st = parse_peers(d, o->bootstrap, err);
        pthread_mutex_unlock(&d->lock);
    }
    if (!st && pthread_create(&d->thread, NULL, supervise, d))
        st = sp_errf(err, SP_ERR_IO, "DHT node: cannot start its thread");
    d->thread_started = !st;
    if (st) {
        sp_dht_stop(d);
        return st;
    }
    *out = d;
    return SP_OK;
}

void sp_dht_stop(sp_dht *d)
{
    if (!d)
        return;
    pthread_mutex_lock(&d->lock);
    d->stop = 1;
    send_locked(d, "quit\n", NULL, 0);
    if (d->fd >= 0)
        shutdown(d->fd, SHUT_WR);
    pthread_cond_broadcast(&d->cond);
    double end = sp_now_s() + 0.1; /* a node that does not quit at once is killed: its values expire anyway */
    while (d->thread_started && !d->exited && d->pid > 0 && sp_now_s() < end)
        wait_locked(d, 0.05);
    if (!d->exited && d->pid > 0)
        kill(d->pid, SIGKILL); /* it did not quit: the reader sees EOF now */
    pthread_mutex_unlock(&d->lock);
    if (d->thread_started)
        pthread_join(d->thread, NULL);
    else if (d->pid > 0) {
        kill(d->pid, SIGKILL);
        waitpid(d->pid, NULL, 0);
    }
    if (d->fd >= 0)
        close(d->fd);
    for (int i = 0; i < d->npeers; i++)
        free(d->peers[i]);
    for (int i = 0; i < d->nlistens; i++)
        free(d->listens[i]);
    for (int i = 0; i < d->npubs; i++) {
        free(d->pubs[i].key);
        free(d->pubs[i].slot);
        free(d->pubs[i].data);
    }
    free(d->peers);
    free(d->heard);
    free(d->listens);
    free(d->pubs);
    pthread_mutex_destroy(&d->lock);
    pthread_cond_destroy(&d->cond);
    free(d);
}

int sp_dht_port(const sp_dht *d) { return d->port; }

pid_t sp_dht_pid(const sp_dht *d)
{
    sp_dht *m = (sp_dht *)d;
    pthread_mutex_lock(&m->lock);
    pid_t p = m->pid;
    pthread_mutex_unlock(&m->lock);
    return p;
}

int sp_dht_restarts(const sp_dht *d)
{
    sp_dht *m = (sp_dht *)d;
    pthread_mutex_lock(&m->lock);
    int n = m->restarts;
    pthread_mutex_unlock(&m->lock);
    return n;
}

uint64_t sp_dht_refused(const sp_dht *d)
{
    sp_dht *m = (sp_dht *)d;
    pthread_mutex_lock(&m->lock);
    uint64_t n = m->refused_old + m->refused;
    pthread_mutex_unlock(&m->lock);
    return n;
}

int sp_dht_good_nodes(const sp_dht *d)
{
    sp_dht *m = (sp_dht *)d;
    pthread_mutex_lock(&m->lock);
    int n = m->good;
    pthread_mutex_unlock(&m->lock);
    return n;
}

int sp_dht_wait_peers(sp_dht *d, int timeout_ms)
{
    double end = sp_now_s() + timeout_ms / 1000.0;
    pthread_mutex_lock(&d->lock);
    while (d->good < 1 && !d->stop && sp_now_s() < end)
        wait_locked(d, end - sp_now_s() < 0.05 ? end - sp_now_s() : 0.05);
    int ok = d->good >= 1;
    pthread_mutex_unlock(&d->lock);
    return ok ? 0 : -1;
}

/* 1 while some peer's ping has neither been answered nor expired. */
static int peers_pending_locked(const sp_dht *d)
{
    for (int i = 0; i < d->npeers; i++)
        if (d->heard[i] == 0)
            return 1;
    return 0;
}

int sp_dht_silent_peers(sp_dht *d, int timeout_ms, char *out, size_t cap)
{
    double end = sp_now_s() + timeout_ms / 1000.0;
    pthread_mutex_lock(&d->lock);
    while (peers_pending_locked(d) && !d->stop && sp_now_s() < end)
        wait_locked(d, end - sp_now_s() < 0.05 ? end - sp_now_s() : 0.05);
    int n = 0;
    size_t at = 0;
    if (cap)
        out[0] = '\0';
    for (int i = 0; i < d->npeers; i++) {
        if (d->heard[i] == 1)
            continue;
        char host[160];
        int port = 0;
        if (sscanf(d->peers[i], "%159s %d", host, &port) == 2 && at < cap)
            at += (size_t)snprintf(out + at, cap - at, "%s%s:%d", n ? "," : "", host, port);
        n++;
    }
    pthread_mutex_unlock(&d->lock);
    return n;
}

void sp_dht_bootstrap(sp_dht *d, const char *host, int port)
{
    if (!name_ok(host) || strlen(host) > 128 || port <= 0 || port > 65535)
        return;
    pthread_mutex_lock(&d->lock);
    add_peer_locked(d, host, port);
    pthread_mutex_unlock(&d->lock);
}

void sp_dht_listen(sp_dht *d, const char *key)
{
    if (!name_ok(key))
        return;
    pthread_mutex_lock(&d->lock);
    int known = 0;
    for (int i = 0; i < d->nlistens && !known; i++)
        known = !strcmp(d->listens[i], key);
    char **n = known ? NULL : realloc(d->listens, (size_t)(d->nlistens + 1) * sizeof *n);
    if (n) {
        d->listens = n;
        if ((n[d->nlistens] = dup_str(key))) {
            d->nlistens++;
            char line[256];
            snprintf(line, sizeof line, "listen %s\n", key);
            send_locked(d, line, NULL, 0);
        }
    }
    pthread_mutex_unlock(&d->lock);
}

void sp_dht_get(sp_dht *d, const char *key)
{
    if (!name_ok(key))
        return;
    char line[256];
    snprintf(line, sizeof line, "get %s\n", key);
    pthread_mutex_lock(&d->lock);
    int alive = d->fd >= 0;
    send_locked(d, line, NULL, 0);
    pthread_mutex_unlock(&d->lock);
    if (!alive && d->o.on_get_done) /* no node now: the lookup ends at once, empty */
        d->o.on_get_done(d->o.user, key, 0);
}

void sp_dht_put(sp_dht *d, const char *key, const char *slot, int ttl_s, const void *data, size_t len)
{
    if (!name_ok(key) || !name_ok(slot) || len > SP_DHT_MAX_VALUE)
        return;
    pthread_mutex_lock(&d->lock);
    pub *p = NULL;
    for (int i = 0; i < d->npubs && !p; i++)
        if (!strcmp(d->pubs[i].key, key) && !strcmp(d->pubs[i].slot, slot))
            p = &d->pubs[i];
    if (!p) {
        pub *n = realloc(d->pubs, (size_t)(d->npubs + 1) * sizeof *n);
        if (n) {
            d->pubs = n;
            p = &n[d->npubs];
            *p = (pub){.key = dup_str(key), .slot = dup_str(slot)};
            if (p->key && p->slot)
                d->npubs++;
            else {
                free(p->key);
                free(p->slot);
                p = NULL;
            }
        }
    }
    uint8_t *copy = p ? malloc(len ? len : 1) : NULL;
    if (copy) {
        memcpy(copy, data, len);
        free(p->data);
        p->data = copy;
        p->len = len;
        p->ttl = ttl_s < 1 ? 1 : ttl_s;
        send_put_locked(d, p);
    }
    pthread_mutex_unlock(&d->lock);
}

sp_status sp_dht_flush(sp_dht *d, int timeout_ms, sp_err *err)
{
    double end = sp_now_s() + timeout_ms / 1000.0;
    pthread_mutex_lock(&d->lock);
    while (d->pending > 0 && !d->stop && sp_now_s() < end)
        wait_locked(d, end - sp_now_s() < 0.05 ? end - sp_now_s() : 0.05);
    int left = d->pending;
    pthread_mutex_unlock(&d->lock);
    return left > 0 ? sp_errf(err, SP_ERR_TIMEOUT, "DHT: %d publications not stored within %d ms", left, timeout_ms)
                    : SP_OK;
}
