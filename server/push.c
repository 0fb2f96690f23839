/* push.c - server-to-server push: a step's output sent straight to the next server of the session's chain
 * (INFERENCE_PUSH), and a training pass's output to the request of the next server that awaits it (SPAN_PUSH),
 * over connections kept per address. A push waits for the next server's acknowledgement (it
 * acknowledges before it computes), so the step's reply can say whether the push arrived; the client delivers
 * the input itself when it did not. Pushes go out one at a time (a server pushes a step of each of its sessions,
 * a few ms each). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "remote.h"
#include "server_impl.h"

#define PUSH_TIMEOUT_MS 2000
#define PUSH_CONNS 8

typedef struct push_conn {
    char host[256];
    int port;
    sp_remote *r;
} push_conn;

/* The kept connection to host:port (opened, or replacing the least recent entry), NULL with err set; push_lock
 * held. */
static sp_remote *conn_to(sp_server *s, const char *host, int port, sp_err *err)
{
    if (!s->push_conns && !(s->push_conns = calloc(PUSH_CONNS, sizeof *s->push_conns))) {
        sp_errf(err, SP_ERR_NOMEM, "out of memory");
        return NULL;
    }
    push_conn *c = NULL;
    for (int i = 0; i < s->npush_conns && !c; i++)
        if (s->push_conns[i].port == port && !strcmp(s->push_conns[i].host, host))
            c = &s->push_conns[i];
    if (c && !sp_remote_is_open(c->r)) {
        sp_remote_close(c->r);
        c->r = NULL;
    }
    if (!c) { /* a new entry at the end; when full, the first (oldest) goes */
        if (s->npush_conns == PUSH_CONNS) {
            sp_remote_close(s->push_conns[0].r);
            memmove(&s->push_conns[0], &s->push_conns[1], (PUSH_CONNS - 1) * sizeof *c);
            s->npush_conns--;
        }
        c = &s->push_conns[s->npush_conns++];
        memset(c, 0, sizeof *c);
        snprintf(c->host, sizeof c->host, "%s", host);
        c->port = port;
    }
    if (!c->r) {
        sp_remote_opts ro = {.no_bulk = 1, .key = s->o.key, .source = s->o.source_address};
        if (sp_remote_connect_opts(&c->r, host, port, &ro, PUSH_TIMEOUT_MS, err))
            c->r = NULL;
    }
    return c->r;
}

/* One push of type (meta, the tensor t) to host:port, its acknowledgement awaited. */
static sp_status push(sp_server *s, sp_msg_type type, const char *host, int port, const char *meta,
                      const sp_tensor_src *t, sp_err *err)
{
    sp_status st;
    pthread_mutex_lock(&s->push_lock);
    sp_remote *r = conn_to(s, host, port, err);
    sp_reply rep = {0};
    st = r ? sp_remote_call(r, type, meta, t, 1, &rep, PUSH_TIMEOUT_MS, err)
           : (err && err->code ? err->code : SP_ERR_IO);
    if (st && r && rep.msg.type != SP_MSG_ERROR) { /* a transport failure: a new connection next time */
        for (int i = 0; i < s->npush_conns; i++)
            if (s->push_conns[i].r == r) {
                sp_remote_close(r);
                s->push_conns[i].r = NULL;
            }
    }
    pthread_mutex_unlock(&s->push_lock);
    sp_reply_clear(&rep);
    return st;
}

sp_status sp_push_send(sp_server *s, const sp_step_req *q, const sp_tensor_src *hidden, sp_err *err)
{
    char meta[160];
    sp_push_req p = {.session = q->push_session, .token = q->push_token, .step = q->step};
    sp_status st = sp_push_req_encode(&p, meta, sizeof meta, err);
    return st ? st : push(s, SP_MSG_INFERENCE_PUSH, q->push_host, q->push_port, meta, hidden, err);
}

sp_status sp_span_push_send(sp_server *s, const sp_span_req *q, const sp_tensor_src *out, sp_err *err)
{
    char meta[128];
    sp_span_push_req p = {.id = q->push_id, .token = q->push_token};
    sp_status st = sp_span_push_req_encode(&p, meta, sizeof meta, err);
    return st ? st : push(s, SP_MSG_SPAN_PUSH, q->push_host, q->push_port, meta, out, err);
}

void sp_push_close_all(sp_server *s)
{
    for (int i = 0; i < s->npush_conns; i++)
        sp_remote_close(s->push_conns[i].r);
    free(s->push_conns);
    s->push_conns = NULL;
    s->npush_conns = 0;
}
