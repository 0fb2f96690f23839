/* servers.c - the servers a runtime knows and its connections to them.
 *
 * An entry per server id (a server connected by address without the DHT is named by its address). Its
 * connection is shared by every thread that calls it (sp_remote serialises the calls) and reference
 * counted: a transport failure detaches it from the entry, and the last user closes it. */
#include "swarm_impl.h"

#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "timeutil.h"

struct sp_conn {
    sp_remote *r;
    int users;
    int broken;
    uint64_t rate_seq; /* rt->lock: the connection's link measurements taken into the entry (sp_remote_rx_mbit) */
};

/* ---------------------------------------------------------------------------------------------- */
/* the table */

int sp_rt_server_put(sp_runtime *rt, const sp_server_record *r, int from_dht)
{
    for (int i = 0; i < rt->nservers; i++) {
        sp_server_entry *e = rt->servers[i];
        if (!strcmp(e->rec.id, r->id)) {
            if (e->down && (!from_dht || r->timestamp > e->rec.timestamp)) { /* it announced anew: alive */
                e->down = 0;
                e->rtt = -1;
            }
            e->rec = *r;
            e->from_dht = from_dht;
            e->gone = 0;
            return i;
        }
    }
    if (rt->nservers == rt->capservers) {
        int cap = rt->capservers ? 2 * rt->capservers : 16;
        sp_server_entry **n = realloc(rt->servers, (size_t)cap * sizeof *n);
        if (!n)
            return -1;
        rt->servers = n;
        rt->capservers = cap;
    }
    sp_server_entry *e = calloc(1, sizeof *e);
    if (!e)
        return -1;
    e->rec = *r;
    e->from_dht = from_dht;
    e->rtt = -1;
    rt->servers[rt->nservers] = e;
    return rt->nservers++;
}

void sp_rt_server_label(sp_runtime *rt, int i, char *buf, size_t cap)
{
    pthread_mutex_lock(&rt->lock);
    const sp_server_record *r = &rt->servers[i]->rec;
    int n = r->name[0] ? snprintf(buf, cap, "%s (%s:%d)", r->name, r->host, r->port)
                       : snprintf(buf, cap, "%s:%d", r->host, r->port);
    if (n < 0 && cap) /* an encoding error leaves buf undefined; a longer label is cut */
        buf[0] = '\0';
    pthread_mutex_unlock(&rt->lock);
}

/* ---------------------------------------------------------------------------------------------- */
/* connections */

/* Entry i, read under the lock: the table's array moves when the DHT's thread adds a server (sp_rt_server_put),
 * while the entries themselves stay where they are. */
static sp_server_entry *entry_of(sp_runtime *rt, int i)
{
    pthread_mutex_lock(&rt->lock);
    sp_server_entry *e = rt->servers[i];
    pthread_mutex_unlock(&rt->lock);
    return e;
}

/* A connection with the bulk channel, proving the swarm key first when there is one. */
static sp_status rt_connect(sp_runtime *rt, sp_remote **r, const char *host, int port, int timeout_ms, sp_err *err)
{
    sp_remote_opts o = {.key = rt->has_key ? &rt->key : NULL};
    return sp_remote_connect_opts(r, host, port, &o, timeout_ms, err);
}

sp_status sp_runtime_set_swarm_key(sp_runtime *rt, const char *path, sp_err *err)
{
    sp_swarm_key k;
    if (path && *path && sp_swarm_key_load(&k, path, err))
        return err ? err->code : SP_ERR_ARG;
    pthread_mutex_lock(&rt->lock);
    rt->has_key = path && *path;
    if (rt->has_key)
        rt->key = k;
    snprintf(rt->key_path, sizeof rt->key_path, "%s", rt->has_key ? path : "");
    pthread_mutex_unlock(&rt->lock);
    return SP_OK;
}

/* Drops the caller's reference; `broken` also detaches c from the entry (dropping the entry's reference),
 * once, whichever thread sees the failure first. The last reference closes it. */
static void conn_release(sp_runtime *rt, sp_server_entry *e, sp_conn *c, int broken)
{
    sp_err word = {0};
    if (broken && !sp_remote_is_open(c->r))
        sp_remote_last_word(c->r, &word);
    pthread_mutex_lock(&rt->lock);
    if (word.msg[0])
        snprintf(e->last_word, sizeof e->last_word, "%s", word.msg);
    if (broken && !c->broken) {
        c->broken = 1;
        if (e->conn == c) {
            e->conn = NULL;
            c->users--;
        }
    }
    int last = --c->users == 0;
    pthread_mutex_unlock(&rt->lock);
    if (last) {
        sp_remote_close(c->r);
        free(c);
    }
}

/* 1 if the server that answered at entry i's address (HELLO) is not entry i's (a restart there: a new id),
 * with err saying so; entry i is then down. Entries from the DHT only: a server connected by address is
 * that address. */
static int other_server(sp_runtime *rt, int i, const sp_remote *r, sp_err *err)
{
    const char *id = sp_remote_hello(r)->id;
    pthread_mutex_lock(&rt->lock);
    sp_server_entry *e = rt->servers[i];
    int other = e->from_dht && id[0] && strcmp(id, e->rec.id);
    char was[SP_SERVER_ID_LEN];
    snprintf(was, sizeof was, "%s", e->rec.id);
    if (other) {
        e->down = 1;
        e->rtt = INFINITY;
    }
    pthread_mutex_unlock(&rt->lock);
    if (other)
        sp_errf(err, SP_ERR_NOTFOUND, "server %s is no longer there: %s answers (a restart)", was, id);
    return other;
}

/* The shared connection of server i, opened if there is none (outside the lock: connecting takes a round
 * trip or a timeout). */
static sp_conn *conn_acquire(sp_runtime *rt, int i, int timeout_ms, sp_err *err)
{
    pthread_mutex_lock(&rt->lock);
    sp_server_entry *e = rt->servers[i];
    sp_conn *c = e->conn;
    char host[64];
    int port = e->rec.port;
    snprintf(host, sizeof host, "%s", e->rec.host);
    if (c)
        c->users++;
    pthread_mutex_unlock(&rt->lock);
    if (c && sp_remote_is_open(c->r))
        return c;
    if (c && sp_remote_last_word(c->r, err)) { /* it closed saying why (shutting down): that is the failure */
        if (err)
            err->code = SP_ERR_CLOSED; /* the server's, not the request's: retried elsewhere */
        conn_release(rt, e, c, 1);
        return NULL;
    }
    if (c) /* the server closed it while it was idle (its idle timeout): a new one, no failure */
        conn_release(rt, e, c, 1);
    sp_remote *r = NULL;
    sp_status cst = rt_connect(rt, &r, host, port, timeout_ms, err);
    if (cst || other_server(rt, i, r, err)) {
        sp_remote_close(r);
        pthread_mutex_lock(&rt->lock); /* it had said why it closed (another thread saw it): that is the failure */
        if (cst && e->last_word[0])
            sp_errf(err, SP_ERR_CLOSED, "%s", e->last_word);
        pthread_mutex_unlock(&rt->lock);
        return NULL;
    }
    pthread_mutex_lock(&rt->lock);
    e->last_word[0] = '\0'; /* a new life, or the same one answering again */
    pthread_mutex_unlock(&rt->lock);
    c = calloc(1, sizeof *c);
    if (!c) {
        sp_remote_close(r);
        sp_errf(err, SP_ERR_NOMEM, "out of memory");
        return NULL;
    }
    c->r = r;
    c->users = 1;
    sp_remote_set_cancel(r, &rt->cancel_waits);
    pthread_mutex_lock(&rt->lock);
    if (e->conn) { /* another thread connected meanwhile: use that one */
        sp_conn *other = e->conn;
        other->users++;
        pthread_mutex_unlock(&rt->lock);
        sp_remote_close(r);
        free(c);
        return other;
    }
    e->conn = c;
    c->users++; /* the entry's own reference */
    pthread_mutex_unlock(&rt->lock);
    return c;
}

/* The median of v[0..n) (n 1..4; of an even count, the mean of the middle two). */
static double median(const double *v, int n)
{
    double s[4];
    memcpy(s, v, (size_t)n * sizeof *s);
    for (int i = 1; i < n; i++) /* insertion sort: n <= 4 */
        for (int j = i; j > 0 && s[j] < s[j - 1]; j--) {
            double t = s[j];
            s[j] = s[j - 1];
            s[j - 1] = t;
        }
    return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

/* A measurement (Mbit/s) into one direction of a link (rt->lock held). */
static void link_rate_add(sp_link_rate *l, double mbit)
{
    int w = (int)(sizeof l->win / sizeof l->win[0]);
    l->win[l->n++ % w] = mbit;
    l->mbit = l->n < 2 ? 0 : median(l->win, l->n < w ? l->n : w);
}

/* After a reply of len bytes from server i on c: a measurement of its link toward the client that the transport took
 * since the last look goes into the entry (only after large replies: decode steps' small ones skip even the look). */
static void link_note(sp_runtime *rt, int i, sp_conn *c, size_t len)
{
    if (len < SP_REMOTE_RATE_MIN)
        return;
    uint64_t seq;
    double mbit = sp_remote_rx_mbit(c->r, &seq);
    pthread_mutex_lock(&rt->lock);
    if (seq != c->rate_seq && mbit > 0)
        link_rate_add(&rt->servers[i]->link_down, mbit);
    c->rate_seq = seq;
    pthread_mutex_unlock(&rt->lock);
}

/* Bytes of the request's tensors t[0..n) on the wire (their payloads; overflow: as many as counted). */
static uint64_t request_bytes(const sp_tensor_src *t, int n)
{
    uint64_t sum = 0;
    for (int k = 0; k < n; k++) {
        uint64_t numel = 1;
        for (int d = 0; d < t[k].rank; d++)
            numel *= t[k].shape[d] > 0 ? (uint64_t)t[k].shape[d] : 0;
        int ok = 1;
        sum += sp_encoding_bytes(t[k].enc, numel, &ok);
    }
    return sum;
}

/* After server i answered a request of tensors t[0..n): the rate at which it measured a large request of ours arrive
 * (its reply's rx_mbit; only FORWARD's, BACKWARD's and INFERENCE_STEP's replies say one, and only to requests large
 * enough to be measured) goes into the entry's link from the client. */
static void up_note(sp_runtime *rt, int i, sp_msg_type type, const sp_tensor_src *t, int n, const sp_reply *rep)
{
    if (rep->msg.meta_len == 0 || request_bytes(t, n) < SP_REMOTE_RATE_MIN)
        return;
    double mbit = 0;
    if (type == SP_MSG_FORWARD || type == SP_MSG_BACKWARD) {
        sp_span_reply a = {0};
        if ((type == SP_MSG_FORWARD ? sp_forward_reply_decode : sp_backward_reply_decode)(&rep->msg, &a, NULL) == SP_OK)
            mbit = a.rx_mbit;
    } else if (type == SP_MSG_INFERENCE_STEP) {
        sp_step_reply a = {0};
        if (sp_step_reply_decode(&rep->msg, &a, NULL) == SP_OK)
            mbit = a.rx_mbit;
    }
    if (mbit <= 0)
        return;
    pthread_mutex_lock(&rt->lock);
    link_rate_add(&rt->servers[i]->link_up, mbit);
    pthread_mutex_unlock(&rt->lock);
}

sp_encoding sp_rt_wire(sp_runtime *rt, const int *srv, int n, int T, sp_encoding *back)
{
    int wire = rt->set.wire; /* (read without the lock, as the other settings: set between requests) */
    sp_encoding enc = wire == SP_WIRE_AUTO ? SP_ENC_F32 : (sp_encoding)wire;
    if (back)
        *back = enc;
    if (wire != SP_WIRE_AUTO || T <= 1) /* a decode step: not even the lock */
        return enc;
    pthread_mutex_lock(&rt->lock);
    for (int h = 0; h < n; h++) {
        if (srv[h] < 0)
            continue;
        sp_encoding to, from;
        to = sp_rt_wire_of_entry(rt->servers[srv[h]], &from);
        if (back) { /* one server: each direction its own */
            enc = to;
            *back = from;
        } else if (to != SP_ENC_F32 || from != SP_ENC_F32) {
            enc = to != SP_ENC_F32 ? to : from;
        }
    }
    pthread_mutex_unlock(&rt->lock);
    return enc;
}

sp_status sp_rt_call(sp_runtime *rt, int i, sp_msg_type type, const char *meta, const sp_tensor_src *t, int n,
                     sp_reply *rep, int timeout_ms, sp_err *err)
{
    return sp_rt_call_abortable(rt, i, type, meta, t, n, rep, timeout_ms, NULL, err);
}

sp_status sp_rt_call_abortable(sp_runtime *rt, int i, sp_msg_type type, const char *meta, const sp_tensor_src *t,
                               int n, sp_reply *rep, int timeout_ms, const int *abort, sp_err *err)
{
    memset(rep, 0, sizeof *rep);
    sp_conn *c = conn_acquire(rt, i, timeout_ms < 10000 ? timeout_ms : 10000, err);
    if (!c)
        return err && err->code ? err->code : SP_ERR_IO;
    sp_status st = sp_remote_call_abortable(c->r, type, meta, t, n, rep, timeout_ms, abort, err);
    if (!st) {
        link_note(rt, i, c, rep->buf.len);
        up_note(rt, i, type, t, n, rep);
    }
    /* an ERROR reply leaves the connection sound, and so does a cancelled wait (the late reply is dropped) */
    int broken = st && st != SP_ERR_CANCELLED && rep->msg.type != SP_MSG_ERROR;
    conn_release(rt, entry_of(rt, i), c, broken);
    return st;
}

void sp_rt_close_conns(sp_runtime *rt)
{
    for (int i = 0; i < rt->nservers; i++) {
        pthread_mutex_lock(&rt->lock);
        sp_server_entry *e = rt->servers[i];
        sp_conn *c = e->conn;
        if (c)
            c->users++; /* as a caller would */
        pthread_mutex_unlock(&rt->lock);
        if (c)
            conn_release(rt, e, c, 1);
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* servers connected by address (no DHT): HELLO and INFO fill their entry */

static void fill_from_info(sp_runtime *rt, int i, const sp_info_reply *a)
{
    sp_server_entry *e = rt->servers[i];
    pthread_mutex_lock(&rt->lock);
    int nb = e->rec.end - e->rec.start;
    if (a->cache_tokens_available >= 0)
        e->rec.cache_tokens_left = (long)a->cache_tokens_available;
    if (a->cache_tokens_total >= 0)
        e->cache_total = (long)a->cache_tokens_total;
    /* INFO gives the span's rates; records carry per-block ones */
    e->rec.inference_rps = a->inference_rps * nb;
    e->rec.forward_rps = a->forward_tps * nb;
    e->rec.throughput = e->rec.forward_rps / ((nb + 1) / 2.0);
    snprintf(e->rec.name, sizeof e->rec.name, "%s", a->public_name);
    e->rec.queue_wait = a->queue_wait;
    e->rec.max_queue_wait = a->max_queue_wait;
    if (a->device[0])
        snprintf(e->rec.device, sizeof e->rec.device, "%s", a->device);
    e->rec.state = SP_SERVER_ONLINE;
    pthread_mutex_unlock(&rt->lock);
}

/* INFO of a directly connected server; a failure marks it offline. */
static void server_info(sp_runtime *rt, int i)
{
    sp_reply rep;
    sp_err err = {0};
    sp_info_reply a;
    sp_status st = sp_rt_call(rt, i, SP_MSG_INFO, NULL, NULL, 0, &rep, 5000, &err);
    if (!st)
        st = sp_info_reply_decode(&rep.msg, &a, &err);
    if (!st) {
        fill_from_info(rt, i, &a);
    } else {
        pthread_mutex_lock(&rt->lock);
        int was = rt->servers[i]->rec.state;
        rt->servers[i]->rec.state = SP_SERVER_OFFLINE;
        pthread_mutex_unlock(&rt->lock);
        char label[128];
        sp_rt_server_label(rt, i, label, sizeof label);
        if (was != SP_SERVER_OFFLINE)
            sp_rt_emitf(rt, SP_EV_SERVER, i, "%s unreachable: %s", label, err.msg);
    }
    sp_reply_clear(&rep);
}

void sp_runtime_refresh(sp_runtime *rt)
{
    pthread_mutex_lock(&rt->lock);
    int n = rt->nservers;
    pthread_mutex_unlock(&rt->lock);
    for (int i = 0; i < n; i++)
        if (!rt->servers[i]->from_dht && !rt->servers[i]->gone)
            server_info(rt, i);
}

/* A plain TCP connection to host:port, to say what is wrong when the websocket fails: 0 it accepts, or
 * SP_ERR_IO with "connection refused", "no such host", "unreachable" ... in err. */
static sp_status tcp_probe(const char *host, int port, int timeout_ms, sp_err *err)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int g = getaddrinfo(host, ps, &hints, &ai);
    if (g)
        return sp_errf(err, SP_ERR_IO, "%s:%d: no such host (%s)", host, port, gai_strerror(g));
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), e = 0;
    if (fd < 0 || (connect(fd, ai->ai_addr, ai->ai_addrlen) && errno != EINPROGRESS)) {
        e = errno;
    } else {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int n = poll(&p, 1, timeout_ms);
        socklen_t len = sizeof e;
        if (n == 0)
            e = ETIMEDOUT;
        else if (n < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len))
            e = errno;
    }
    if (fd >= 0)
        close(fd);
    freeaddrinfo(ai);
    if (!e)
        return SP_OK;
    if (e == ECONNREFUSED)
        return sp_errf(err, SP_ERR_IO, "%s:%d: connection refused (no server listens there)", host, port);
    if (e == ETIMEDOUT)
        return sp_errf(err, SP_ERR_IO, "%s:%d: unreachable (no answer within %d s)", host, port, timeout_ms / 1000);
    return sp_errf(err, SP_ERR_IO, "%s:%d: unreachable (%s)", host, port, strerror(e));
}

int sp_rt_probe_down(sp_runtime *rt, int i)
{
    char host[64];
    pthread_mutex_lock(&rt->lock);
    snprintf(host, sizeof host, "%s", rt->servers[i]->rec.host);
    int port = rt->servers[i]->rec.port;
    pthread_mutex_unlock(&rt->lock);
    if (port <= 0 || tcp_probe(host, port, 1000, NULL) == SP_OK)
        return 0;
    double now = sp_now_s();
    pthread_mutex_lock(&rt->lock);
    for (int j = 0; j < rt->nservers; j++) {
        sp_server_entry *e = rt->servers[j];
        if (sp_rt_same_addr(e, rt->servers[i])) {
            e->down = 1;
            e->rtt = INFINITY;
            e->rtt_when = now;
        }
    }
    pthread_mutex_unlock(&rt->lock);
    return 1;
}

/* Connects to host:port, says HELLO, checks that it serves the loaded model, and adds it under its address. */
static sp_status add_direct(sp_runtime *rt, const char *host, int port, sp_err *err)
{
    sp_status st = tcp_probe(host, port, 5000, err);
    if (st)
        return st;
    sp_remote *r = NULL;
    sp_err werr = {0};
    st = rt_connect(rt, &r, host, port, 10000, &werr);
    if (st == SP_ERR_UNSUPPORTED) /* a sepal server of another protocol version */
        return sp_errf(err, st, "%s:%d: %s", host, port, werr.msg);
    /* a sepal server that refused us: the swarm key exchange failed, or HELLO answered with an ERROR */
    int refused = st == SP_ERR_STATE || (st == SP_ERR_ARG && strstr(werr.msg, "HELLO: "));
    if (st && !refused) /* the websocket handshake itself failed */
        return sp_errf(err, SP_ERR_IO, "%s:%d: not a sepal server (%s)", host, port,
                       st == SP_ERR_TIMEOUT ? "no answer to the websocket handshake" : "the websocket handshake failed");
    if (st) /* a websocket server that refused us or broke off (the swarm key, a limit): its reason */
        return sp_errf(err, st, "%s", werr.msg);
    const sp_remote_info *h = sp_remote_hello(r);
    if (rt->local && ((h->config_hash && h->config_hash != rt->local->cfg.hash) ||
                      (h->num_blocks && h->num_blocks != rt->local->cfg.n_layers))) {
        sp_errf(err, SP_ERR_ARG,
                "%s:%d serves %s (config %016llx, %d blocks), but the loaded model is %s (config %016llx, %d blocks)",
                host, port, h->model[0] ? h->model : "another model", (unsigned long long)h->config_hash,
                h->num_blocks, rt->model_prefix, (unsigned long long)rt->local->cfg.hash, rt->local->cfg.n_layers);
        sp_remote_close(r);
        return SP_ERR_ARG;
    }
    sp_remote_set_cancel(r, &rt->cancel_waits);
    sp_server_record rec = {.port = port, .start = h->start, .end = h->end, .state = SP_SERVER_ONLINE,
                            .cache_tokens_left = -1, .config_hash = h->config_hash, .num_blocks = h->num_blocks,
                            .caps = h->caps};
    snprintf(rec.id, sizeof rec.id, "%.*s", (int)sizeof rec.id - 1, h->id[0] ? h->id : "");
    if (!rec.id[0]) /* an old server without an id: its address names it */
        snprintf(rec.id, sizeof rec.id, "%08x%08x", (unsigned)(sp_now_ns() & 0xffffffffu), (unsigned)port);
    snprintf(rec.host, sizeof rec.host, "%s", host);
    snprintf(rec.model, sizeof rec.model, "%.*s", (int)sizeof rec.model - 1, h->model);
    snprintf(rec.version, sizeof rec.version, "%s", h->server_version[0] ? h->server_version : h->version);
    snprintf(rec.dtype, sizeof rec.dtype, "%s", h->dtype[0] ? h->dtype : "f32");
    snprintf(rec.quant, sizeof rec.quant, "%s",
             !strcmp(rec.dtype, "int8") || !strcmp(rec.dtype, "nf4") ? rec.dtype : "none");
    sp_conn *c = calloc(1, sizeof *c);
    pthread_mutex_lock(&rt->lock);
    int i = c ? sp_rt_server_put(rt, &rec, 0) : -1;
    if (i >= 0)
        snprintf(rt->servers[i]->addr, sizeof rt->servers[i]->addr, "%s", h->addr);
    if (i >= 0 && !rt->servers[i]->conn) { /* this connection becomes the shared one */
        *c = (sp_conn){.r = r, .users = 1};
        rt->servers[i]->conn = c;
        r = NULL;
        c = NULL;
    }
    pthread_mutex_unlock(&rt->lock);
    sp_remote_close(r);
    free(c);
    if (i < 0)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    server_info(rt, i);
    sp_rt_emitf(rt, SP_EV_SERVER, i, "%s:%d serves blocks %d:%d", host, port, rec.start, rec.end);
    return SP_OK;
}

sp_status sp_runtime_connect(sp_runtime *rt, const char *addrs, sp_err *err)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", addrs);
    for (char *save = NULL, *a = strtok_r(buf, ",", &save); a; a = strtok_r(NULL, ",", &save)) {
        if (!strncmp(a, "ws://", 5))
            a += 5;
        size_t al = strlen(a);
        if (al && a[al - 1] == '/')
            a[al - 1] = '\0';
        char *colon = strrchr(a, ':');
        char *end = NULL;
        long port = colon ? strtol(colon + 1, &end, 10) : 0;
        if (!colon || colon == a || !end || *end || port <= 0 || port > 65535)
            return sp_errf(err, SP_ERR_ARG, "bad server address '%s' (expected HOST:PORT)", a);
        *colon = '\0';
        sp_status st = add_direct(rt, a, (int)port, err);
        if (st)
            return st;
    }
    if (rt->local) { /* servers may join later: a missing block is news, not a failure of connect */
        sp_err rerr = {0};
        if (sp_runtime_route(rt, &rerr))
            sp_rt_emitf(rt, SP_EV_INFO, 0, "no complete route yet: %s", rerr.msg);
    }
    return SP_OK;
}

void sp_rt_push_addr(sp_runtime *rt, int i, char *host, size_t cap, int *port)
{
    pthread_mutex_lock(&rt->lock);
    const sp_server_entry *e = rt->servers[i];
    const char *colon = strrchr(e->addr, ':');
    if (colon && colon > e->addr && atoi(colon + 1) > 0) { /* where it is announced, which its HELLO said */
        snprintf(host, cap, "%.*s", (int)(colon - e->addr), e->addr);
        *port = atoi(colon + 1);
    } else { /* a server found in the DHT: its record's address is the announced one */
        snprintf(host, cap, "%s", e->rec.host);
        *port = e->rec.port;
    }
    pthread_mutex_unlock(&rt->lock);
}

void sp_rt_refused_await(sp_runtime *rt, int i, int cap, const sp_err *why)
{
    pthread_mutex_lock(&rt->lock);
    int was = rt->servers[i]->refused_caps & cap;
    rt->servers[i]->refused_caps |= cap;
    pthread_mutex_unlock(&rt->lock);
    if (was)
        return;
    char label[160];
    sp_rt_server_label(rt, i, label, sizeof label);
    sp_rt_emitf(rt, SP_EV_SERVER, i,
                "%s does not take pushed inputs (it answered: %.300s): %s through it are client-driven", label,
                why && why->msg[0] ? why->msg : "an error",
                cap == SP_CAP_STEP_PUSH ? "generation steps" : "training's passes");
}
