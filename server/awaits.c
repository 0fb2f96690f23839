/* awaits.c - training's pushed passes: FORWARDs and BACKWARDs that await their input (meta "await": id,
 * "await_token": token) and the inputs pushed for them (SPAN_PUSH). An entry pairs one awaiting request with its
 * input, whichever comes first: a worker parks a request whose input has not come, and the push that brings it
 * hands the request back to the queue; an input that comes first waits for its request, which must name the
 * same token (else the input is dropped: the client's random token is the only key). A push for a parked
 * request of another token is refused. Entries are bounded in bytes (a push beyond the cap is refused, "busy",
 * and counted: the client falls back to relaying), dropped after the step timeout (a parked request is then answered
 * with ERROR `timeout`; counted, and an input logged) and with the connection of their request. */
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "server_impl.h"
#include "timeutil.h"

void awaits_init(await_table *t, size_t cap)
{
    memset(t, 0, sizeof *t);
    pthread_mutex_init(&t->lock, NULL);
    t->cap = cap;
}

static void entry_free(await_table *t, await_entry *e)
{
    t->bytes -= e->input.len + e->pend.len;
    sp_buf_free(&e->input);
    sp_buf_free(&e->pend);
    free(e);
}

void awaits_destroy(await_table *t)
{
    while (t->head) {
        await_entry *n = t->head->next;
        entry_free(t, t->head);
        t->head = n;
    }
    pthread_mutex_destroy(&t->lock);
}

/* The entry of id (lock held), and the link that points at it; NULL if none. */
static await_entry *find(await_table *t, uint64_t id, await_entry ***link)
{
    for (await_entry **p = &t->head; *p; p = &(*p)->next)
        if ((*p)->id == id) {
            *link = p;
            return *p;
        }
    return NULL;
}

static await_entry *add(await_table *t, uint64_t id, uint64_t token)
{
    await_entry *e = calloc(1, sizeof *e);
    if (e) {
        *e = (await_entry){.id = id, .token = token, .created = sp_now_s(), .next = t->head};
        t->head = e;
    }
    return e;
}

sp_status awaits_arrive(sp_server *s, uint64_t id, uint64_t token, sp_buf *input, uint64_t *conn, sp_buf *pend,
                        sp_err *err)
{
    await_table *t = &s->aw;
    await_entry **link, *e;
    sp_status st = SP_OK;
    pthread_mutex_lock(&t->lock);
    e = find(t, id, &link);
    if (e && e->token != token)
        st = sp_errf(err, SP_ERR_ARG, "wrong token for the request awaiting %llu", (unsigned long long)id);
    else if (e && e->input.len)
        st = sp_errf(err, SP_ERR_STATE, "the input of %llu came already", (unsigned long long)id);
    else if (t->bytes + input->len > t->cap && ++t->refused)
        st = sp_errf(err, SP_ERR_RANGE,
                     "this server holds %zu bytes of pushed inputs and requests awaiting them, and this push of %zu "
                     "would go over its cap of %zu: the client sends the input itself",
                     t->bytes, input->len, t->cap);
    else if (!e && !(e = add(t, id, token)))
        st = sp_errf(err, SP_ERR_NOMEM, "out of memory");
    if (!st) {
        e->input = *input;
        memset(input, 0, sizeof *input);
        t->bytes += e->input.len;
        if (e->pend.len) { /* its request is parked: back to the queue, where it finds this input */
            t->bytes -= e->pend.len;
            *pend = e->pend;
            *conn = e->pend_conn;
            memset(&e->pend, 0, sizeof e->pend);
        }
    }
    pthread_mutex_unlock(&t->lock);
    return st;
}

int awaits_take(sp_server *s, uint64_t id, uint64_t token, uint64_t conn, sp_buf *req, sp_buf *input, sp_err *err)
{
    await_table *t = &s->aw;
    await_entry **link, *e;
    int rc = 0;
    pthread_mutex_lock(&t->lock);
    e = find(t, id, &link);
    if (e && e->pend.len) {
        rc = -1;
        sp_errf(err, SP_ERR_STATE, "another request awaits %llu", (unsigned long long)id);
    } else if (e && e->token == token) { /* its input came: taken, the entry done */
        *input = e->input;
        memset(&e->input, 0, sizeof e->input);
        t->bytes -= input->len;
        *link = e->next;
        entry_free(t, e);
        rc = 1;
    } else {
        if (e) { /* an input under another token: not this request's */
            *link = e->next;
            entry_free(t, e);
        }
        if (!(e = add(t, id, token))) {
            rc = -1;
            sp_errf(err, SP_ERR_NOMEM, "out of memory");
        } else { /* parked until its input comes (the request's buffer is taken: no reply now) */
            e->pend = *req;
            e->pend_conn = conn;
            memset(req, 0, sizeof *req);
            t->bytes += e->pend.len;
        }
    }
    pthread_mutex_unlock(&t->lock);
    return rc;
}

void awaits_expire(sp_server *s, double older_than, uint64_t conn)
{
    await_table *t = &s->aw;
    pthread_mutex_lock(&t->lock);
    for (await_entry **p = &t->head; *p;) {
        await_entry *e = *p;
        int gone = conn != UINT64_MAX && e->pend.len && e->pend_conn == conn;
        if (e->created >= older_than && !gone) {
            p = &e->next;
            continue;
        }
        *p = e->next;
        sp_msg_header h = {0};
        if (e->pend.len && !gone && sp_msg_header_read(e->pend.data, e->pend.len, &h))
            sp_rpc_error(s, e->pend_conn, h.request_id, "timeout", "its input was not pushed within %g s",
                         s->o.step_timeout_s);
        else if (conn == UINT64_MAX)
            sp_log(SP_LOG_INFO, "a pushed input for %llu (%zu bytes) was not claimed within %g s: dropped",
                   (unsigned long long)e->id, e->input.len, s->o.step_timeout_s);
        t->expired += conn == UINT64_MAX; /* (the reaper's call; else the connection went) */
        entry_free(t, e);
    }
    pthread_mutex_unlock(&t->lock);
}
