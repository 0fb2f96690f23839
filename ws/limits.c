/* limits.c - what a server lets its peers hold (transport.h, "A server bounds what one peer can make it
 * hold"): the connection table, per-address records, and the budget every message and queued reply is charged
 * to. Everything here runs under the server's mutex (mu) unless said otherwise. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport_impl.h"

/* ---------------------------------------------------------------------------------------------- */
/* the connection table: s->conns (every conn, by slot) and an id index (open addressing, linear probing) */

static size_t id_home(uint64_t id, size_t cap) { return (size_t)(id * 0x9E3779B97F4A7C15ull >> 17) & (cap - 1); }

static size_t id_probe(const sp_ws_server *s, uint64_t id)
{
    size_t i = id_home(id, s->capids);
    while (s->ids[i] && s->conns[s->ids[i] - 1]->id != id)
        i = (i + 1) & (s->capids - 1);
    return i;
}

static int ids_rebuild(sp_ws_server *s, size_t cap)
{
    uint64_t *n = calloc(cap, sizeof *n);
    if (!n)
        return -1;
    free(s->ids);
    s->ids = n;
    s->capids = cap;
    for (size_t k = 0; k < s->nconns; k++)
        s->ids[id_probe(s, s->conns[k]->id)] = k + 1;
    return 0;
}

conn *tp_find_conn(sp_ws_server *s, uint64_t id)
{
    if (!s->capids)
        return NULL;
    size_t i = id_probe(s, id);
    return s->ids[i] ? s->conns[s->ids[i] - 1] : NULL;
}

int tp_conn_insert(sp_ws_server *s, conn *c)
{
    if (tp_grow((void **)&s->conns, &s->capconns, s->nconns + 1, sizeof *s->conns))
        return -1;
    if (2 * (s->nconns + 1) > s->capids && ids_rebuild(s, s->capids ? 2 * s->capids : 64))
        return -1;
    c->slot = s->nconns;
    s->conns[s->nconns++] = c;
    s->ids[id_probe(s, c->id)] = c->slot + 1;
    return 0;
}

/* Removes slot i's index entry, moving later entries of its probe run back (no tombstones). */
static void ids_delete(sp_ws_server *s, size_t i)
{
    size_t mask = s->capids - 1, j = i;
    s->ids[i] = 0;
    for (;;) {
        j = (j + 1) & mask;
        if (!s->ids[j])
            return;
        size_t h = id_home(s->conns[s->ids[j] - 1]->id, s->capids);
        /* the entry at j may fill the hole at i if its home is not in (i, j] (cyclically) */
        if ((j > i && (h <= i || h > j)) || (j < i && h <= i && h > j)) {
            s->ids[i] = s->ids[j];
            s->ids[j] = 0;
            i = j;
        }
    }
}

void tp_conn_remove(sp_ws_server *s, conn *c)
{
    size_t i = id_probe(s, c->id);
    if (!s->ids[i])
        return;
    ids_delete(s, i);
    size_t last = --s->nconns;
    if (c->slot != last) { /* the last conn takes c's slot */
        conn *m = s->conns[last];
        s->conns[c->slot] = m;
        m->slot = c->slot;
        s->ids[id_probe(s, m->id)] = m->slot + 1;
    }
}

void tp_flag(sp_ws_server *s, conn *c)
{
    if (c->flagged || tp_grow((void **)&s->wakeq, &s->capwakeq, s->nwakeq + 1, sizeof *s->wakeq))
        return;
    c->flagged = 1;
    s->wakeq[s->nwakeq++] = c->id;
    if (s->ctx)
        lws_cancel_service(s->ctx);
}

/* ---------------------------------------------------------------------------------------------- */
/* sources */

void tp_addr_of(const struct sockaddr *sa, uint8_t addr[16])
{
    memset(addr, 0, 16);
    if (sa->sa_family == AF_INET) {
        addr[10] = addr[11] = 0xff;
        memcpy(addr + 12, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, 4);
    } else if (sa->sa_family == AF_INET6) {
        memcpy(addr, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, 16);
    }
}

void tp_src_name(const uint8_t addr[16], char *out, size_t cap)
{
    static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (!memcmp(addr, v4, 12) ? !inet_ntop(AF_INET, addr + 12, out, (socklen_t)cap)
                              : !inet_ntop(AF_INET6, addr, out, (socklen_t)cap))
        snprintf(out, cap, "?");
}

src_entry *tp_src_get(sp_ws_server *s, const uint8_t addr[16])
{
    for (size_t i = 0; i < s->nsrcs; i++)
        if (!memcmp(s->srcs[i]->addr, addr, 16))
            return s->srcs[i];
    src_entry *e = calloc(1, sizeof *e);
    if (!e || tp_grow((void **)&s->srcs, &s->capsrcs, s->nsrcs + 1, sizeof *s->srcs)) {
        free(e);
        return NULL;
    }
    memcpy(e->addr, addr, 16);
    tp_src_name(addr, e->name, sizeof e->name);
    s->srcs[s->nsrcs++] = e;
    return e;
}

void tp_src_put(sp_ws_server *s, src_entry *e)
{
    if (!e || e->conns || e->pending || e->bulk_pending || e->used)
        return;
    for (size_t i = 0; i < s->nsrcs; i++)
        if (s->srcs[i] == e) {
            s->srcs[i] = s->srcs[--s->nsrcs];
            free(e);
            return;
        }
}

/* ---------------------------------------------------------------------------------------------- */
/* out of descriptors */

/* Descriptors are taken under one lock by both listeners (and given back to the spares under it), so the slot one
 * listener's spare frees is not taken by the other's accept before its own. */
static pthread_mutex_t g_fd_mu = PTHREAD_MUTEX_INITIALIZER;

int tp_accept(int lfd, struct sockaddr *sa, socklen_t *sl)
{
    pthread_mutex_lock(&g_fd_mu);
    int fd = accept4(lfd, sa, sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    int e = errno;
    pthread_mutex_unlock(&g_fd_mu);
    errno = e;
    return fd;
}

void tp_spare_retake(int *spare)
{
    if (*spare >= 0)
        return;
    pthread_mutex_lock(&g_fd_mu);
    *spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    pthread_mutex_unlock(&g_fd_mu);
}

int tp_shed(int lfd, int *spare, void (*refuse)(int fd))
{
    pthread_mutex_lock(&g_fd_mu);
    if (*spare < 0) /* lost to another thread last time: take it back first */
        *spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    int n = 0, none = 1;
    if (*spare >= 0) {
        close(*spare);
        *spare = -1;
        none = 0;
        while (n < 64) { /* once one is accepted and closed, its slot serves the next */
            int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd >= 0) {
                refuse(fd);
                n++;
            } else if (errno != EINTR) {
                none = errno == EMFILE || errno == ENFILE; /* a thread outside the transport took the slot */
                break;
            }
        }
        *spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    pthread_mutex_unlock(&g_fd_mu);
    return n == 0 && none ? -1 : n;
}

/* ---------------------------------------------------------------------------------------------- */
/* the budget */

static void add(uint64_t *v, int64_t d) { *v = d < 0 && (uint64_t)-d > *v ? 0 : *v + (uint64_t)d; }

void tp_charge(sp_ws_server *s, conn *c, int64_t din, int64_t dout)
{
    int64_t d = din + dout;
    add(&c->in_bytes, din);
    add(&c->out_bytes, dout);
    if (c->src)
        add(&c->src->used, d);
    add(&s->used, d);
    if (s->used > s->st.budget_peak)
        s->st.budget_peak = s->used;
    if (s->used > s->trim_mark)
        s->trim_mark = s->used;
    if (!c->out_full && c->out_bytes > s->o.tx_bound) {
        c->out_full = 1; /* the service thread stops reading the ws; the bulk thread stops polling it */
        s->st.paused++;
        tp_flag(s, c);
    } else if (c->out_full && c->out_bytes <= s->o.tx_bound / 2) {
        c->out_full = 0;
        tp_flag(s, c);
        if (c->bulk)
            tp_wake_bulk(s);
    }
    if (d < 0 && s->waiting) { /* room for a waiting message, maybe */
        if (s->ctx)
            lws_cancel_service(s->ctx);
        tp_wake_bulk(s);
    }
}

int tp_admit(sp_ws_server *s, conn *c, uint64_t total)
{
    if (total > s->o.rx_budget_conn)
        return -1;
    /* a connection's share is of its input (its output has tx_bound); the address's and the total count both */
    if (c->in_bytes + total > s->o.rx_budget_conn || (c->src && c->src->used + total > s->o.rx_budget_ip) ||
        s->used + total > s->o.rx_budget)
        return 0;
    tp_charge(s, c, (int64_t)total, 0);
    return 1;
}

/* ---------------------------------------------------------------------------------------------- */
/* defaults */

static uint64_t machine_memory(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 4ull << 30;
}

static int fd_limit(void)
{
    struct rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r) || r.rlim_cur == RLIM_INFINITY || r.rlim_cur > 1 << 20)
        return 1 << 20;
    return (int)r.rlim_cur;
}

static int imin(int a, int b) { return a < b ? a : b; }
static uint64_t umax(uint64_t a, uint64_t b) { return a > b ? a : b; }
static uint64_t umin(uint64_t a, uint64_t b) { return a < b ? a : b; }

void tp_resolve_limits(sp_ws_server *s)
{
    sp_transport_opts *o = &s->o;
    if (o->max_conns <= 0) /* a connection may hold two descriptors (its bulk socket); some are the process's */
        o->max_conns = imin(4096, (fd_limit() - 64) / 2 > 16 ? (fd_limit() - 64) / 2 : 16);
    if (o->max_conns_per_ip <= 0)
        o->max_conns_per_ip = imin(256, o->max_conns);
    if (o->max_pending <= 0)
        o->max_pending = imin(256, o->max_conns);
    if (o->max_pending_per_ip <= 0)
        o->max_pending_per_ip = imin(64, o->max_pending); /* a burst of local clients */
    if (o->handshake_timeout_s <= 0)
        o->handshake_timeout_s = 5;
    if (!o->rx_budget_conn)
        o->rx_budget_conn = o->max_message;
    o->rx_budget_conn = umax(o->rx_budget_conn, PREAUTH_MAX);
    if (!o->rx_budget)
        o->rx_budget = umin(umax(2 * o->rx_budget_conn, 512ull << 20), machine_memory() / 4);
    o->rx_budget = umax(o->rx_budget, o->rx_budget_conn);
    if (!o->rx_budget_ip)
        o->rx_budget_ip = umax(o->rx_budget / 2, o->rx_budget_conn);
    o->rx_budget_ip = umin(umax(o->rx_budget_ip, o->rx_budget_conn), o->rx_budget);
    if (!o->tx_bound)
        o->tx_bound = 1ull << 20; /* a client has one reply outstanding: only a peer that does not read meets it */
    if (o->busy_timeout_s <= 0)
        o->busy_timeout_s = 10;
    if (o->min_rate == 0)
        o->min_rate = 64 << 10;
}
