/* push.c - server-to-server push: a step's output sent straight to the next server of the session's chain
 * (INFERENCE_PUSH), and a training pass's output to the request of the next server that awaits it (SPAN_PUSH),
 * over connections kept per address. A push waits for the next server's acknowledgement (it acknowledges before it
 * computes), so the step's reply can say whether the push arrived; the client delivers the input itself when it
 * did not.
 *
 * A pass of decode steps pipelines its pushes: sp_push_begin sends each (the acknowledgement's place registered on
 * the connection first), then sp_push_finish awaits each acknowledgement (and the step's reply goes), so a pass of
 * N pushed sessions waits about one round trip to the next servers, not N one after another (bench_serve --push,
 * links of 5 ms each way: a round of 16 sessions 18 ms against 178 one push at a time, the next server's input
 * 17 ms after the step at the median against 172). A single step's push (sp_push_send) and training's
 * (sp_span_push_send) are a begin and its finish.
 *
 * The table of kept connections (push_lock) counts the pushes in flight on each: a connection with a push in flight
 * is never closed nor evicted. One that failed takes no new push and is closed when its last push finished; when
 * all PUSH_CONNS kept ones have pushes in flight, a push to another address goes out on a connection of its own,
 * closed when it finishes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "remote.h"
#include "server_impl.h"
#include "timeutil.h"

#define PUSH_TIMEOUT_MS 2000
#define PUSH_CONNS 8

typedef struct push_conn {
    char host[256];
    int port;
    sp_remote *r;
    int inflight; /* pushes in flight on r */
    int broken;   /* r failed: no new push goes on it; closed when none is in flight */
} push_conn;

/* Entry i out of the table, its connection closed; push_lock held, nothing in flight on it. */
static void drop_entry(sp_server *s, int i)
{
    sp_remote_close(s->push_conns[i].r);
    memmove(&s->push_conns[i], &s->push_conns[i + 1], (size_t)(s->npush_conns - i - 1) * sizeof *s->push_conns);
    s->npush_conns--;
}

/* A connection to host:port for one more push, NULL with err set; push_lock held. The kept one (opened, or in a
 * new entry replacing the least recent one with nothing in flight), its count of pushes in flight raised (*in_table 1),
 * or, when every entry has pushes in flight, one of the push's own (*in_table 0). */
static sp_remote *conn_to(sp_server *s, const char *host, int port, int *in_table, sp_err *err)
{
    sp_remote_opts ro = {.no_bulk = 1, .key = s->o.key, .source = s->o.source_address};
    *in_table = 0;
    if (!s->push_conns && !(s->push_conns = calloc(PUSH_CONNS, sizeof *s->push_conns))) {
        sp_errf(err, SP_ERR_NOMEM, "out of memory");
        return NULL;
    }
    push_conn *c = NULL;
    for (int i = 0; i < s->npush_conns && !c; i++)
        if (!s->push_conns[i].broken && s->push_conns[i].port == port && !strcmp(s->push_conns[i].host, host))
            c = &s->push_conns[i];
    if (c && !sp_remote_is_open(c->r)) {
        if (c->inflight) { /* closed under pushes still waiting: it goes when they finished */
            c->broken = 1;
            c = NULL;
        } else {
            sp_remote_close(c->r);
            c->r = NULL;
        }
    }
    if (!c) { /* a new entry at the end; when full, the first (oldest) with no push in flight goes */
        int i = 0;
        while (s->npush_conns == PUSH_CONNS && i < s->npush_conns && s->push_conns[i].inflight)
            i++;
        if (s->npush_conns == PUSH_CONNS && i == s->npush_conns) { /* all busy: a connection of the push's own */
            sp_remote *r = NULL;
            return sp_remote_connect_opts(&r, host, port, &ro, PUSH_TIMEOUT_MS, err) ? NULL : r;
        }
        if (s->npush_conns == PUSH_CONNS)
            drop_entry(s, i);
        c = &s->push_conns[s->npush_conns++];
        memset(c, 0, sizeof *c);
        snprintf(c->host, sizeof c->host, "%s", host);
        c->port = port;
    }
    if (!c->r && sp_remote_connect_opts(&c->r, host, port, &ro, PUSH_TIMEOUT_MS, err))
        c->r = NULL;
    if (c->r) {
        c->inflight++;
        *in_table = 1;
    }
    return c->r;
}

/* A push on r (conn_to's, in the table or not) ended, failed when `failed` (a transport failure: a new connection next
 * time); push_lock held. */
static void conn_done(sp_server *s, sp_remote *r, int in_table, int failed)
{
    if (!in_table) {
        sp_remote_close(r);
        return;
    }
    for (int i = 0; i < s->npush_conns; i++) {
        push_conn *c = &s->push_conns[i];
        if (c->r != r)
            continue;
        c->inflight--;
        c->broken |= failed;
        if (c->broken && !c->inflight)
            drop_entry(s, i);
        return;
    }
}

/* One push of type (meta, the tensor t) to host:port sent, into p. */
static void begin(sp_server *s, sp_msg_type type, const char *host, int port, const char *meta, const sp_tensor_src *t,
                  sp_push_pending *p)
{
    int in_table;
    pthread_mutex_lock(&s->push_lock);
    sp_remote *r = conn_to(s, host, port, &in_table, &p->err);
    pthread_mutex_unlock(&s->push_lock);
    if (!r) {
        p->st = p->err.code ? p->err.code : SP_ERR_IO;
        return;
    }
    p->sent_s = sp_now_s();
    p->st = sp_remote_send(r, type, meta, t, 1, &p->rep, &p->id, &p->err);
    if (p->st) { /* nothing in flight: the connection's count back now */
        pthread_mutex_lock(&s->push_lock);
        conn_done(s, r, in_table, p->rep.msg.type != SP_MSG_ERROR);
        pthread_mutex_unlock(&s->push_lock);
        sp_reply_clear(&p->rep);
        return;
    }
    p->r = r;
    p->kept = in_table;
    uint64_t now = __atomic_add_fetch(&s->pushes_in_flight, 1, __ATOMIC_RELAXED);
    for (uint64_t old = __atomic_load_n(&s->pushes_in_flight_peak, __ATOMIC_RELAXED); now > old;)
        if (__atomic_compare_exchange_n(&s->pushes_in_flight_peak, &old, now, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            break;
}

void sp_push_begin(sp_server *s, const sp_step_req *q, const sp_tensor_src *hidden, sp_push_pending *p)
{
    char meta[160];
    memset(p, 0, sizeof *p);
    sp_push_req pq = {.session = q->push_session, .token = q->push_token, .step = q->step};
    if (!(p->st = sp_push_req_encode(&pq, meta, sizeof meta, &p->err)))
        begin(s, SP_MSG_INFERENCE_PUSH, q->push_host, q->push_port, meta, hidden, p);
}

sp_status sp_push_finish(sp_server *s, sp_push_pending *p, sp_err *err)
{
    if (!p->r) {
        if (err)
            *err = p->err;
        return p->st;
    }
    double left_ms = PUSH_TIMEOUT_MS - (sp_now_s() - p->sent_s) * 1e3;
    sp_status st = sp_remote_wait(p->r, p->id, left_ms > 0 ? (int)left_ms : 0, err);
    __atomic_sub_fetch(&s->pushes_in_flight, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&s->push_lock);
    conn_done(s, p->r, p->kept, st && p->rep.msg.type != SP_MSG_ERROR);
    pthread_mutex_unlock(&s->push_lock);
    sp_reply_clear(&p->rep);
    p->r = NULL;
    p->st = st;
    return st;
}

sp_status sp_push_send(sp_server *s, const sp_step_req *q, const sp_tensor_src *hidden, sp_err *err)
{
    sp_push_pending p;
    sp_push_begin(s, q, hidden, &p);
    return sp_push_finish(s, &p, err);
}

sp_status sp_span_push_send(sp_server *s, const sp_span_req *q, const sp_tensor_src *out, sp_err *err)
{
    char meta[128];
    sp_span_push_req pq = {.id = q->push_id, .token = q->push_token};
    sp_push_pending p;
    memset(&p, 0, sizeof p);
    if (!(p.st = sp_span_push_req_encode(&pq, meta, sizeof meta, &p.err)))
        begin(s, SP_MSG_SPAN_PUSH, q->push_host, q->push_port, meta, out, &p);
    return sp_push_finish(s, &p, err);
}

void sp_push_close_all(sp_server *s)
{
    for (int i = 0; i < s->npush_conns; i++)
        sp_remote_close(s->push_conns[i].r);
    free(s->push_conns);
    s->push_conns = NULL;
    s->npush_conns = 0;
}
