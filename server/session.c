/* session.c - inference sessions: KV caches charged against the server's budget, one owner
 * connection each, freed on close, on disconnect and on timeouts; and each one's rhythm in batched passes (when
 * its steps were answered and came back), from which a pass knows whose steps are due. */
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "log.h"
#include "server_impl.h"
#include "span.h"
#include "timeutil.h"

void sessions_init(session_table *t, long budget, long kv_bytes)
{
    memset(t, 0, sizeof *t);
    pthread_mutex_init(&t->lock, NULL);
    t->budget = budget;
    t->kv_bytes = kv_bytes > 0 ? kv_bytes : 1;
    t->next_id = 1;
}

static void session_free(session *x)
{
    span_dev_kv_free(x);
    for (int i = 0; x->kv && i < x->end - x->start; i++)
        sp_kv_free(&x->kv[i]);
    free(x->kv);
    free(x->scratch);
    sp_ws_free(&x->ws);
    session_drop_push(x);
    free(x);
}

void session_drop_push(session *x)
{
    sp_buf_free(&x->pend);
    sp_buf_free(&x->inbox);
    x->pend_step = x->inbox_step = 0;
    __atomic_store_n(&x->pend_ns, 0, __ATOMIC_RELAXED);
}

void sessions_destroy(session_table *t)
{
    session *x = t->head;
    while (x) {
        session *n = x->next;
        session_free(x);
        x = n;
    }
    t->head = NULL;
    pthread_mutex_destroy(&t->lock);
}

sp_status session_open(sp_server *s, uint64_t conn, int start, int end, int B, int max_length, uint64_t *id,
                       uint64_t *token, sp_err *err)
{
    session_table *t = &s->st;
    long cost = (long)B * max_length * (end - start) * t->kv_bytes;
    pthread_mutex_lock(&t->lock);
    int fits = t->used + cost <= t->budget;
    if (fits)
        t->used += cost; /* reserve before allocating, so concurrent opens cannot overshoot */
    pthread_mutex_unlock(&t->lock);
    if (!fits)
        return sp_errf(err, SP_ERR_RANGE,
                       "out of cache: %d x %d positions over %d blocks need %ld KiB, %ld of %ld KiB free", B,
                       max_length, end - start, cost >> 10, (t->budget - t->used) >> 10, t->budget >> 10);
    session *x = calloc(1, sizeof *x);
    sp_status st = x ? SP_OK : sp_errf(err, SP_ERR_NOMEM, "out of memory");
    if (!st && s->dev) /* the span on the GPU: device caches, nothing on the host */
        st = span_dev_kv_open(s, x, start, end, B, max_length, err);
    if (!st && !s->dev) {
        x->kv = calloc((size_t)(end - start), sizeof *x->kv);
        st = x->kv ? SP_OK : sp_errf(err, SP_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; !st && !s->dev && i < end - start; i++)
        st = sp_kv_init(&x->kv[i], B, max_length, s->m->cfg.n_kv_heads, s->m->cfg.head_dim, err);
    if (!st) { /* one position of every row: a decode step's input, computed in place */
        x->scratch_floats = (size_t)B * s->m->cfg.hidden;
        x->scratch = malloc(x->scratch_floats * sizeof(float));
        st = x->scratch ? SP_OK : sp_errf(err, SP_ERR_NOMEM, "out of memory");
    }
    size_t wsf = 0;
    for (int i = start; !st && !s->dev && i < end; i++) {
        size_t f = sp_block_ws_floats(&s->m->blocks[i - s->m->first], B, 1, max_length);
        wsf = f > wsf ? f : wsf;
    }
    if (!st)
        st = sp_ws_reserve(&x->ws, wsf, err);
    pthread_mutex_lock(&t->lock);
    if (st) {
        t->used -= cost;
        pthread_mutex_unlock(&t->lock);
        if (x) { /* session_free copes with a partly built session */
            x->start = start;
            x->end = end;
            session_free(x);
        }
        return st;
    }
    while (!x->token && getrandom(&x->token, sizeof x->token, 0) != (ssize_t)sizeof x->token)
        x->token = 0; /* (an interrupted call: again) */
    x->conn = conn;
    x->start = start;
    x->end = end;
    x->B = B;
    x->max_length = max_length;
    x->cost = cost;
    x->created = x->last_used = sp_now_s();
    x->id = t->next_id++;
    x->next = t->head;
    t->head = x;
    t->count++;
    *id = x->id;
    *token = x->token;
    sp_ws_server_hold(s->ws, conn, +1); /* a connection with a session is not idle */
    pthread_mutex_unlock(&t->lock);
    return SP_OK;
}

/* Unlinks x (lock held) and frees it unless a worker holds it (then the worker frees it on release); its
 * connection may be closed for idleness again once it has no session. */
static void unlink_locked(sp_server *s, session_table *t, session *x)
{
    sp_ws_server_hold(s->ws, x->conn, -1);
    for (session **p = &t->head; *p; p = &(*p)->next) {
        if (*p == x) {
            *p = x->next;
            break;
        }
    }
    t->used -= x->cost;
    t->count--;
    x->closed = 1;
    if (!x->busy)
        session_free(x);
}

/* Session id of connection conn, with t->lock held: NULL (err set) when it has none of that id. */
static session *find_locked(session_table *t, uint64_t conn, uint64_t id, sp_err *err)
{
    session *x = t->head;
    while (x && x->id != id)
        x = x->next;
    if (x && x->conn == conn)
        return x;
    sp_errf(err, SP_ERR_NOTFOUND, "no session %llu on this connection", (unsigned long long)id);
    return NULL;
}

session *session_acquire(sp_server *s, uint64_t conn, uint64_t id, sp_err *err)
{
    session_table *t = &s->st;
    pthread_mutex_lock(&t->lock);
    session *x = find_locked(t, conn, id, err);
    if (!x) {
        pthread_mutex_unlock(&t->lock);
        return NULL;
    }
    if (x->busy) { /* a client steps a session one step at a time */
        pthread_mutex_unlock(&t->lock);
        sp_errf(err, SP_ERR_STATE, "session %llu is already stepping", (unsigned long long)id);
        return NULL;
    }
    x->busy = 1;
    pthread_mutex_unlock(&t->lock);
    return x;
}

/* Session id with t->lock held, for a push: NULL (err set) when there is none, or its token is not `token`. */
static session *find_push_locked(session_table *t, uint64_t id, uint64_t token, sp_err *err)
{
    session *x = t->head;
    while (x && x->id != id)
        x = x->next;
    if (!x) {
        sp_errf(err, SP_ERR_NOTFOUND, "no session %llu", (unsigned long long)id);
        return NULL;
    }
    uint64_t d = x->token ^ token; /* the same time whatever bits differ */
    if (d) {
        sp_errf(err, SP_ERR_ARG, "wrong push token for session %llu", (unsigned long long)id);
        return NULL;
    }
    return x;
}

int session_push_ok(sp_server *s, uint64_t id, uint64_t token)
{
    sp_err err = {0};
    pthread_mutex_lock(&s->st.lock);
    int ok = find_push_locked(&s->st, id, token, &err) != NULL;
    pthread_mutex_unlock(&s->st.lock);
    return ok;
}

session *session_acquire_wait(sp_server *s, uint64_t conn, uint64_t id, uint64_t token, sp_err *err)
{
    return session_acquire_within(s, conn, id, token, 5000000, err);
}

session *session_acquire_within(sp_server *s, uint64_t conn, uint64_t id, uint64_t token, int wait_us, sp_err *err)
{
    session_table *t = &s->st;
    for (int waited_us = 0;; waited_us += 200) {
        pthread_mutex_lock(&t->lock);
        session *x = conn ? find_locked(t, conn, id, err) : find_push_locked(t, id, token, err);
        int free_now = x && !x->busy;
        if (free_now)
            x->busy = 1;
        pthread_mutex_unlock(&t->lock);
        if (!x || free_now)
            return x;
        if (waited_us >= wait_us) {
            sp_errf(err, SP_ERR_STATE, "session %llu is already stepping", (unsigned long long)id);
            return NULL;
        }
        struct timespec d = {0, 200000};
        nanosleep(&d, NULL);
    }
}

void session_release(sp_server *s, session *x)
{
    pthread_mutex_lock(&s->st.lock);
    x->busy = 0;
    x->last_used = sp_now_s();
    if (x->closed)
        session_free(x);
    pthread_mutex_unlock(&s->st.lock);
}

sp_status session_close(sp_server *s, uint64_t conn, uint64_t id, sp_err *err)
{
    session_table *t = &s->st;
    pthread_mutex_lock(&t->lock);
    session *x = find_locked(t, conn, id, err);
    if (!x) {
        pthread_mutex_unlock(&t->lock);
        return SP_ERR_NOTFOUND;
    }
    unlink_locked(s, t, x);
    pthread_mutex_unlock(&t->lock);
    return SP_OK;
}

void sessions_close_conn(sp_server *s, uint64_t conn)
{
    session_table *t = &s->st;
    pthread_mutex_lock(&t->lock);
    session *x = t->head;
    while (x) {
        session *n = x->next;
        if (x->conn == conn)
            unlink_locked(s, t, x);
        x = n;
    }
    pthread_mutex_unlock(&t->lock);
}

void sessions_answered(sp_server *s, task *const *tasks, const uint64_t *ids, int n, uint64_t now)
{
    session_table *t = &s->st;
    pthread_mutex_lock(&t->lock);
    for (int i = 0; i < n; i++) {
        session *x = t->head;
        while (ids[i] && x && x->id != ids[i])
            x = x->next;
        if (!ids[i] || !x)
            continue;
        uint64_t came = tasks[i]->queued_ns; /* (it may come before the pass that answered it ends) */
        if (x->answered_ns) {
            x->turn_ns[1] = x->turn_ns[0];
            x->turn_ns[0] = came > x->answered_ns ? came - x->answered_ns : 0;
        }
        x->answered_ns = now;
    }
    pthread_mutex_unlock(&t->lock);
}

int sessions_expected(sp_server *s, uint64_t now, uint64_t deadline, uint64_t late_ns, int awaiting, uint64_t *ids,
                      int max)
{
    int n = 0;
    pthread_mutex_lock(&s->st.lock);
    for (const session *x = s->st.head; x && n < max; x = x->next) {
        uint64_t turn = x->turn_ns[0] < x->turn_ns[1] ? x->turn_ns[0] : x->turn_ns[1], due = x->answered_ns + turn;
        uint64_t kept_ns = awaiting ? __atomic_load_n(&x->pend_ns, __ATOMIC_RELAXED) : 0;
        if ((x->answered_ns && due <= deadline && now < due + late_ns) || (kept_ns && now < kept_ns + late_ns))
            ids[n++] = x->id;
    }
    pthread_mutex_unlock(&s->st.lock);
    return n;
}

int sessions_reap(sp_server *s, double now)
{
    session_table *t = &s->st;
    int n = 0;
    pthread_mutex_lock(&t->lock);
    session *x = t->head;
    while (x) {
        session *nx = x->next;
        int idle = !x->busy && now - x->last_used > s->o.step_timeout_s;
        int old = now - x->created > s->o.session_timeout_s;
        if (idle || old) {
            sp_log(SP_LOG_INFO, "closing session %llu: %s", (unsigned long long)x->id,
                   idle ? "step timeout" : "session timeout");
            unlink_locked(s, t, x);
            n++;
        }
        x = nx;
    }
    pthread_mutex_unlock(&t->lock);
    return n;
}

long sessions_tokens_available(sp_server *s)
{
    int nb = s->m->last - s->m->first;
    pthread_mutex_lock(&s->st.lock);
    long free_bt = s->st.budget - s->st.used;
    pthread_mutex_unlock(&s->st.lock);
    return nb > 0 ? free_bt / ((long)nb * s->st.kv_bytes) : 0;
}
