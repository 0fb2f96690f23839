/* server.c - the server's life cycle: loading the span, the transport callbacks, worker threads that run
 * the queue (inference before training), and the reaper that enforces session timeouts. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>

#include "log.h"
#include "record.h"
#include "server_impl.h"
#include "span.h"
#include "timeutil.h"
#include "trace.h"

uint64_t sp_server_largest_request(int hidden, int nblocks, int max_batch_tokens, long cache_tokens)
{
    /* BACKWARD: hidden_in + grad_out + prompts [n, B, P <= T, H]; a step: hidden + prompts, B x T <= the cache */
    uint64_t bwd = (uint64_t)(2 + nblocks) * (uint64_t)max_batch_tokens;
    uint64_t step = (uint64_t)(1 + nblocks) * (uint64_t)cache_tokens;
    uint64_t positions = bwd > step ? bwd : step;
    return positions * (uint64_t)hidden * 4 + SP_PROTO_HEADER_SIZE + SP_PROTO_DEFAULT_MAX_META +
           SP_PROTO_MAX_TENSORS * SP_PROTO_DESC_SIZE;
}

/* ---------------------------------------------------------------------------------------------- */
/* queue */

static void queue_push(task_queue *q, task *t)
{
    pthread_mutex_lock(&q->lock);
    t->next = NULL;
    if (q->tail[t->prio])
        q->tail[t->prio]->next = t;
    else
        q->head[t->prio] = t;
    q->tail[t->prio] = t;
    pthread_cond_broadcast(&q->cond); /* (a worker gathering a batch waits on it too) */
    pthread_mutex_unlock(&q->lock);
}

/* Unlinks t from list p (prev: the task before it, NULL at the head); lock held. */
static void unlink_task(task_queue *q, int p, task *prev, task *t)
{
    if (prev)
        prev->next = t->next;
    else
        q->head[p] = t->next;
    if (q->tail[p] == t)
        q->tail[p] = prev;
}

/* Which tasks a turn may take: all (NULL), steps only, or the FORWARDs / BACKWARDs that share a pass with key's
 * (within rows_left rows). */
typedef struct task_filter {
    int steps;
    const sp_span_key *key;
    long rows_left;
} task_filter;

static int same_key(const sp_span_key *a, const sp_span_key *b)
{
    return a->type == b->type && a->start == b->start && a->end == b->end && a->T == b->T && a->P == b->P;
}

static int wanted(const task *t, const task_filter *f)
{
    if (!f)
        return 1;
    if (f->steps)
        return t->step;
    return t->merges && same_key(&t->key, f->key) && t->key.rows <= f->rows_left;
}

/* The peer whose turn is next in list p after peer `after`: the smallest key above it among the tasks waiting that
 * f wants, else (a new round) the smallest of all; 0 if none waits. Lock held. */
static uint64_t next_peer(const task_queue *q, int p, uint64_t after, const task_filter *f)
{
    uint64_t above = 0, least = 0;
    for (const task *t = q->head[p]; t; t = t->next) {
        if (!wanted(t, f))
            continue;
        if (t->peer > after && (!above || t->peer < above))
            above = t->peer;
        if (!least || t->peer < least)
            least = t->peer;
    }
    return above ? above : least;
}

/* e's windows at now: once its window is over, its most become the window before's, and the new one starts from
 * none; after two windows, none is left. */
static void seen_roll(struct peer_seen *e, uint64_t now, uint64_t window)
{
    if (now < e->since_ns + window)
        return;
    int gone = now >= e->since_ns + 2 * window;
    for (int p = 0; p < 2; p++) {
        e->before[p] = gone ? 0 : e->passed[p];
        e->passed[p] = 0;
    }
    e->since_ns = gone ? now : e->since_ns + window;
}

/* t, just taken out of the queue (lock held), passed every task of another client still waiting; its own count
 * of those that passed it goes into its priority's most of the window. */
static void note_taken(task_queue *q, const task *t)
{
    for (int p = 0; p < 2; p++)
        for (task *w = q->head[p]; w; w = w->next)
            w->passed += w->peer != t->peer;
    struct peer_seen *e = NULL;
    for (int i = 0; i < PEERS_SEEN && !e; i++)
        e = q->seen[i].peer == t->peer ? &q->seen[i] : NULL;
    uint64_t now = sp_now_ns();
    if (!e) {
        e = &q->seen[q->seen_next];
        q->seen_next = (q->seen_next + 1) % PEERS_SEEN;
        *e = (struct peer_seen){.peer = t->peer, .since_ns = now};
    }
    seen_roll(e, now, q->window_ns);
    if (t->passed > e->passed[t->prio])
        e->passed[t->prio] = t->passed;
}

void sp_server_passed(sp_server *s, uint64_t conn, uint64_t passed[2])
{
    uint64_t peer = sp_ws_server_peer(s->ws, conn);
    passed[0] = passed[1] = 0;
    pthread_mutex_lock(&s->q.lock);
    for (int i = 0; i < PEERS_SEEN; i++) {
        struct peer_seen *e = &s->q.seen[i];
        if (e->peer != peer)
            continue;
        seen_roll(e, sp_now_ns(), s->q.window_ns);
        for (int p = 0; p < 2; p++)
            passed[p] = e->passed[p] > e->before[p] ? e->passed[p] : e->before[p];
    }
    pthread_mutex_unlock(&s->q.lock);
}

/* Takes the oldest task of the next peer's in list p that f wants, the turn moved on to it; NULL if none waits.
 * Lock held. */
static task *take_turn(task_queue *q, int p, const task_filter *f)
{
    uint64_t peer = next_peer(q, p, q->rr[p], f);
    task *prev = NULL;
    for (task *t = q->head[p]; t; prev = t, t = t->next)
        if (t->peer == peer && wanted(t, f)) {
            unlink_task(q, p, prev, t);
            q->rr[p] = peer;
            note_taken(q, t);
            return t;
        }
    return NULL;
}

/* Blocks for the next task, inference first, round-robin over the peers within a priority; NULL once stopping. */
static task *queue_pop(task_queue *q)
{
    pthread_mutex_lock(&q->lock);
    for (;;) {
        if (q->stop) {
            pthread_mutex_unlock(&q->lock);
            return NULL;
        }
        for (int p = 0; p < 2; p++) {
            task *t = take_turn(q, p, NULL);
            if (t) {
                pthread_mutex_unlock(&q->lock);
                return t;
            }
        }
        pthread_cond_wait(&q->cond, &q->lock);
    }
}

/* 1 if no task waits (a worker may still be busy: then its session is busy too and the step is refused). */
static int queue_idle(task_queue *q)
{
    pthread_mutex_lock(&q->lock);
    int idle = !q->head[0] && !q->head[1];
    pthread_mutex_unlock(&q->lock);
    return idle;
}

int queue_length(task_queue *q)
{
    int n = 0;
    pthread_mutex_lock(&q->lock);
    for (int p = 0; p < 2; p++)
        for (const task *t = q->head[p]; t; t = t->next)
            n++;
    pthread_mutex_unlock(&q->lock);
    return n;
}

static void queue_drain(task_queue *q)
{
    for (int p = 0; p < 2; p++)
        while (q->head[p]) {
            task *t = q->head[p];
            q->head[p] = t->next;
            sp_buf_free(&t->msg);
            free(t);
        }
    q->tail[0] = q->tail[1] = NULL;
    while (q->spare) {
        task *t = q->spare;
        q->spare = t->next;
        free(t);
    }
    q->nspare = 0;
}

/* A zeroed task: a spare one, or a new one (NULL when out of memory). */
static task *task_new(task_queue *q)
{
    pthread_mutex_lock(&q->lock);
    task *t = q->spare;
    if (t) {
        q->spare = t->next;
        q->nspare--;
    }
    pthread_mutex_unlock(&q->lock);
    if (t) {
        memset(t, 0, sizeof *t);
        return t;
    }
    return calloc(1, sizeof *t);
}

/* A handled task (its message already freed): kept for the next request, a few of them. */
static void task_done(task_queue *q, task *t)
{
    pthread_mutex_lock(&q->lock);
    int keep = q->nspare < 16;
    if (keep) {
        t->next = q->spare;
        q->spare = t;
        q->nspare++;
    }
    pthread_mutex_unlock(&q->lock);
    if (!keep)
        free(t);
}

/* ns into the moving average *avg (3/4 old, 1/4 new). */
static void note_ns(uint64_t *avg, uint64_t ns)
{
    uint64_t old = __atomic_load_n(avg, __ATOMIC_RELAXED);
    __atomic_store_n(avg, old ? (3 * old + ns) / 4 : ns, __ATOMIC_RELAXED);
}

/* A step taken from the queue now (t0), queued at queued: its wait into the load and the metrics. */
static void note_wait(sp_server *s, uint64_t t0, uint64_t queued)
{
    note_ns(&s->queue_wait_ns, t0 - queued);
    __atomic_store_n(&s->waited_at_ns, t0, __ATOMIC_RELAXED);
}

/* A handled INFERENCE_STEP's time into the moving average. */
static void note_step(sp_server *s, uint64_t t0) { note_ns(&s->step_ns, sp_now_ns() - t0); }

/* ---------------------------------------------------------------------------------------------- */
/* batches of decode steps */

static int steps_waiting(const task_queue *q)
{
    int n = 0;
    for (const task *t = q->head[0]; t; t = t->next)
        n += t->step;
    return n;
}

/* Takes up to max waiting steps out of the queue (lock held) into out: all of them when they fit, else fairly, by
 * turns (take_turn): round-robin over the peers (a client: its source address), a peer's steps in their order (its
 * sessions each wait with one step at most, so they take turns too). One client's many sessions, over however many
 * connections, thus get one place a round like another client's single one. */
static int take_steps(task_queue *q, task **out, int max)
{
    int n = 0;
    if (steps_waiting(q) <= max) {
        for (task *prev = NULL, *t = q->head[0], *next; t; t = next) {
            next = t->next;
            if (t->step) {
                unlink_task(q, 0, prev, t);
                out[n++] = t;
            } else {
                prev = t;
            }
        }
        for (int i = 0; i < n; i++) /* (taken together: none passed another) */
            note_taken(q, out[i]);
        return n;
    }
    for (task *t; n < max && (t = take_turn(q, 0, &(task_filter){.steps = 1}));)
        out[n++] = t;
    return n;
}

/* The most a pass waits for the steps of the sessions expected back: the option's (tests), else a quarter of a
 * recent pass, at most 5 ms (5 ms before any pass ran: only the pushes of steps kept here are expected then). */
static uint64_t gather_wait(const sp_server *s)
{
    if (s->o.gather_wait_s > 0)
        return (uint64_t)(s->o.gather_wait_s * 1e9);
    uint64_t ns = __atomic_load_n(&s->batch_ns, __ATOMIC_RELAXED), wait = ns ? ns / 4 : 5000000;
    return wait < 5000000 ? wait : 5000000;
}

/* Whether a session of ids[0..*n) has no step waiting yet, besides first; those that have leave the list (a step
 * stays in the queue until a worker takes it). Lock held. */
static int expected_missing(const task_queue *q, const task *first, uint64_t *ids, int *n)
{
    for (int i = 0; i < *n;) {
        int here = first->session == ids[i];
        for (const task *t = q->head[0]; t && !here; t = t->next)
            here = t->step && t->session == ids[i];
        if (here)
            ids[i] = ids[--*n];
        else
            i++;
    }
    return *n > 0;
}

/* Waits on the queue's condition (lock held) for at most a millisecond, and not past deadline (sp_now_ns). */
static void wait_until(task_queue *q, uint64_t deadline)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t now = sp_now_ns(), left = deadline > now ? deadline - now : 0;
    uint64_t ns = (uint64_t)ts.tv_nsec + (left < 1000000 ? left : 1000000);
    ts.tv_sec += (time_t)(ns / 1000000000);
    ts.tv_nsec = (long)(ns % 1000000000);
    pthread_cond_timedwait(&q->cond, &q->lock, &ts);
}

/* The batch of steps that first (just popped) leads: those waiting, and those of the sessions whose steps are due
 * within a short wait (gather_wait; sessions_expected: by their last answer and how soon their steps came after
 * answers, at most a second or 4 passes overdue; and, where first brings an input, those whose step awaits its push
 * here: the server before sends a pass's pushes back to back), fairly chosen (take_steps), at most max_batch_tokens
 * of them. A step that came while the last pass ran (it missed it) thus runs in the next with the others, which do
 * not leave it behind again; the pushes of one pass of the server before run in one pass here, from the first (no
 * rhythm known yet). expect: room for max_batch_tokens ids. Returns how many are in out (first included). */
static int gather_steps(sp_server *s, task *first, task **out, uint64_t *expect)
{
    task_queue *q = &s->q;
    int max = s->o.max_batch_tokens, missing;
    uint64_t now = sp_now_ns(), deadline = now + gather_wait(s);
    uint64_t late = 4 * __atomic_load_n(&s->batch_ns, __ATOMIC_RELAXED);
    int ne = sessions_expected(s, now, deadline, late > 1000000000 ? late : 1000000000, first->session != 0, expect,
                               max);
    out[0] = first;
    pthread_mutex_lock(&q->lock);
    while ((missing = 1 + steps_waiting(q) < max && expected_missing(q, first, expect, &ne)) && !q->stop &&
           sp_now_ns() < deadline)
        wait_until(q, deadline);
    if (missing && !q->stop)
        __atomic_add_fetch(&s->waited_out, 1, __ATOMIC_RELAXED);
    int n = 1 + take_steps(q, out + 1, max - 1);
    pthread_mutex_unlock(&q->lock);
    return n;
}

/* The worker's buffers for a batch (kept between batches). */
typedef struct step_bufs {
    sp_step_batch *b;
    task **tasks;
    uint64_t *conns, *expect, *ids;
    int *acked;
    sp_buf **msgs;
} step_bufs;

static void task_finish(sp_server *s, task *t);

/* Runs the step first and those gathered with it as one pass, one pass at a time. */
static void run_steps(sp_server *s, task *first, step_bufs *sb, sp_ws *ws)
{
    pthread_mutex_lock(&s->batch_lock);
    int n = gather_steps(s, first, sb->tasks, sb->expect);
    uint64_t t0 = sp_now_ns();
    for (int i = 0; i < n; i++) {
        sb->conns[i] = sb->tasks[i]->conn;
        sb->msgs[i] = &sb->tasks[i]->msg;
        sb->acked[i] = sb->tasks[i]->acked;
        note_wait(s, t0, sb->tasks[i]->queued_ns);
        sp_mx_waited(&s->mx, t0 - sb->tasks[i]->queued_ns);
    }
    /* (a pass that only kept halves of pushed steps ran no blocks: its time is not a pass's) */
    if (sp_rpc_handle_steps(s, sb->conns, sb->msgs, sb->acked, n, sb->b, ws, sb->ids))
        note_ns(&s->batch_ns, sp_now_ns() - t0);
    note_step(s, t0);
    sessions_answered(s, sb->tasks, sb->ids, n, sp_now_ns());
    pthread_mutex_unlock(&s->batch_lock);
    for (int i = 0; i < n; i++)
        task_finish(s, sb->tasks[i]);
}

/* The most FORWARDs or BACKWARDs one pass takes (besides --max-batch-tokens rows). */
#define SPAN_BATCH_MAX 64

/* Runs the FORWARD or BACKWARD first and those waiting that share its pass (the same key, by turns over the
 * clients, up to --max-batch-tokens rows, none more once an inference request waits) as one pass; after the
 * inference waiting, as every training request. */
static void run_spans(sp_server *s, task *first, step_bufs *sb, sp_ws *ws)
{
    task_queue *q = &s->q;
    int n = 1, max = SPAN_BATCH_MAX < s->o.max_batch_tokens ? SPAN_BATCH_MAX : s->o.max_batch_tokens;
    task_filter f = {.key = &first->key, .rows_left = s->o.max_batch_tokens - first->key.rows};
    sb->tasks[0] = first;
    pthread_mutex_lock(&q->lock);
    for (task *t; n < max && f.rows_left > 0 && !q->head[0] && (t = take_turn(q, 1, &f)); n++) {
        sb->tasks[n] = t;
        f.rows_left -= t->key.rows;
    }
    pthread_mutex_unlock(&q->lock);
    uint64_t t0 = sp_now_ns();
    for (int i = 0; i < n; i++) {
        sb->conns[i] = sb->tasks[i]->conn;
        sb->msgs[i] = &sb->tasks[i]->msg;
        sp_mx_waited(&s->mx, t0 - sb->tasks[i]->queued_ns);
    }
    if (n == 1)
        sp_rpc_handle(s, first->conn, &first->msg, ws);
    else
        sp_rpc_handle_spans(s, sb->conns, sb->msgs, n, ws);
    for (int i = 0; i < n; i++)
        task_finish(s, sb->tasks[i]);
}

/* A handled task: its message freed, its bytes back to the input budget, the task kept for the next request. */
static void task_finish(sp_server *s, task *t)
{
    sp_buf_free(&t->msg);
    sp_ws_server_release(s->ws, t->conn, t->len);
    task_done(&s->q, t);
}

static void step_bufs_free(step_bufs *sb)
{
    sp_step_batch_free(sb->b);
    free(sb->tasks), free(sb->conns), free(sb->expect), free(sb->ids), free(sb->acked), free(sb->msgs);
}

/* A batch's buffers for up to max steps; -1 when out of memory (the worker then runs steps one by one). */
static int step_bufs_init(step_bufs *sb, int max)
{
    memset(sb, 0, sizeof *sb);
    sb->b = sp_step_batch_new();
    sb->tasks = calloc((size_t)max, sizeof *sb->tasks);
    sb->conns = calloc((size_t)max, sizeof *sb->conns);
    sb->expect = calloc((size_t)max, sizeof *sb->expect);
    sb->ids = calloc((size_t)max, sizeof *sb->ids);
    sb->acked = calloc((size_t)max, sizeof *sb->acked);
    sb->msgs = calloc((size_t)max, sizeof *sb->msgs);
    if (sb->b && sb->tasks && sb->conns && sb->expect && sb->ids && sb->acked && sb->msgs)
        return 0;
    step_bufs_free(sb);
    return -1;
}

static void *worker_main(void *arg)
{
    sp_server *s = arg;
    pthread_setname_np(pthread_self(), "sp-worker");
    sp_ws ws = {0};
    step_bufs sb = {0};
    int batching = !s->o.no_batch && !step_bufs_init(&sb, s->o.max_batch_tokens);
    task *t;
    while ((t = queue_pop(&s->q))) {
        SP_TRACE(SP_TR_SRV_WORKER);
        if (t->step && batching) {
            run_steps(s, t, &sb, &ws);
            continue;
        }
        if (t->merges && batching) {
            run_spans(s, t, &sb, &ws);
            continue;
        }
        uint64_t t0 = sp_now_ns();
        sp_mx_waited(&s->mx, t0 - t->queued_ns);
        if (t->step)
            note_wait(s, t0, t->queued_ns);
        sp_rpc_handle_task(s, t->conn, &t->msg, t->acked, &ws);
        if (t->step)
            note_step(s, t0);
        task_finish(s, t);
    }
    if (batching)
        step_bufs_free(&sb);
    sp_ws_free(&ws);
    return NULL;
}

/* ---------------------------------------------------------------------------------------------- */
/* transport callbacks (transport thread: no compute here) */

/* A request of len bytes handled here or dropped: its bytes go back to the input budget. */
static void done_inline(sp_server *s, uint64_t conn, sp_buf *msg, uint64_t len)
{
    sp_buf_free(msg);
    sp_ws_server_release(s->ws, conn, len);
}

/* A parked request (training's, that awaited its pushed input) back in the queue: its bytes left the input budget
 * when it was parked. */
static void requeue(sp_server *s, uint64_t conn, sp_buf *msg)
{
    task *t = task_new(&s->q);
    if (!t) {
        sp_msg_header h = {0};
        sp_msg_header_read(msg->data, msg->len, &h);
        sp_rpc_error(s, conn, h.request_id, "internal", "out of memory");
        sp_buf_free(msg);
        return;
    }
    *t = (task){.conn = conn, .peer = sp_ws_server_peer(s->ws, conn), .msg = *msg, .prio = 1,
                .queued_ns = sp_now_ns()};
    memset(msg, 0, sizeof *msg);
    queue_push(&s->q, t);
}

static void on_message(void *user, uint64_t conn, sp_buf *msg)
{
    sp_server *s = user;
    SP_TRACE(SP_TR_SRV_MSG);
    pthread_mutex_lock(&s->stats_lock);
    s->requests++;
    pthread_mutex_unlock(&s->stats_lock);
    uint64_t len = msg->len;
    sp_msg_header h = {0};
    sp_msg_header_read(msg->data, msg->len, &h);
    sp_mx_request(&s->mx, h.type, len);
    if (sp_rpc_handle_inline(s, conn, msg)) {
        done_inline(s, conn, msg, len);
        return;
    }
    if (h.type == SP_MSG_SPAN_PUSH) { /* kept for the request awaiting it, which goes back to the queue if parked */
        uint64_t pend_conn = 0;
        sp_buf pend = {0};
        sp_rpc_span_push(s, conn, msg, &pend_conn, &pend);
        done_inline(s, conn, msg, len);
        if (pend.len)
            requeue(s, pend_conn, &pend);
        return;
    }
    /* A small decode step of a fast span: answer right here, unless another transport thread is doing so */
    if (h.type == SP_MSG_INFERENCE_STEP && s->inline_steps && !s->o.workers_only &&
        !__atomic_load_n(&s->pushing, __ATOMIC_RELAXED) &&
        __atomic_load_n(&s->step_ns, __ATOMIC_RELAXED) < 1000000 && msg->len <= 32768 && queue_idle(&s->q) &&
        pthread_mutex_trylock(&s->inline_lock) == 0) {
        uint64_t t0 = sp_now_ns();
        SP_TRACE(SP_TR_SRV_INLINE);
        sp_rpc_handle(s, conn, msg, &s->inline_ws);
        note_step(s, t0);
        pthread_mutex_unlock(&s->inline_lock);
        done_inline(s, conn, msg, len);
        return;
    }
    task *t = task_new(&s->q);
    if (!t) {
        sp_rpc_error(s, conn, 0, "internal", "out of memory");
        done_inline(s, conn, msg, len);
        return;
    }
    int type = h.type;
    t->conn = conn;
    t->peer = sp_ws_server_peer(s->ws, conn);
    t->msg = *msg;
    t->prio = type == SP_MSG_FORWARD || type == SP_MSG_BACKWARD;
    /* a push brings a step's input: it joins the batches of steps (its step, kept in its session, runs in them) */
    t->step = type == SP_MSG_INFERENCE_STEP ||
              (type == SP_MSG_INFERENCE_PUSH && !s->o.no_batch && s->o.emulate_old != SP_SERVER_OLD_NOPUSH);
    t->session = t->step && !s->o.no_batch ? sp_rpc_step_session(s, msg) : 0;
    /* a push is acknowledged at once, where it will be taken: a pass here may wait for others (gather_steps) */
    t->acked = t->step && type == SP_MSG_INFERENCE_PUSH && sp_rpc_push_ack(s, conn, msg);
    t->merges = t->prio && sp_rpc_span_key(s, msg, &t->key) == 0;
    t->len = len;
    t->queued_ns = sp_now_ns();
    queue_push(&s->q, t);
}

static void on_close(void *user, uint64_t conn)
{
    sessions_close_conn(user, conn); /* a dropped connection frees its sessions and kept activations */
    kept_drop(user, conn, 0);
    awaits_expire(user, 0, conn);
}

/* ---------------------------------------------------------------------------------------------- */
/* reaper */

static void *reaper_main(void *arg)
{
    sp_server *s = arg;
    pthread_setname_np(pthread_self(), "sp-reaper");
    pthread_mutex_lock(&s->reaper_lock);
    while (!s->reaper_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&s->reaper_cond, &s->reaper_lock, &ts);
        pthread_mutex_unlock(&s->reaper_lock);
        sessions_reap(s, sp_now_s());
        kept_drop(s, UINT64_MAX, sp_now_s() - s->o.step_timeout_s);
        awaits_expire(s, sp_now_s() - s->o.step_timeout_s, UINT64_MAX);
        pthread_mutex_lock(&s->reaper_lock);
    }
    pthread_mutex_unlock(&s->reaper_lock);
    return NULL;
}

/* ---------------------------------------------------------------------------------------------- */
/* start / stop */

static sp_status load(sp_server *s, sp_err *err)
{
    const sp_server_opts *o = &s->o;
    snprintf(s->model_dir, sizeof s->model_dir, "%s", o->model_dir);
    sp_model_prefix(o->model_dir, s->model_name, sizeof s->model_name);
    if ((unsigned)o->dtype >= SP_W__COUNT)
        return sp_errf(err, SP_ERR_ARG, "server: unknown weight encoding %d", o->dtype);
    /* each block encoded as it is read, from the checkpoint's weights: the span never all in f32 */
    sp_status st = sp_model_load_encoded(&s->m, o->model_dir, SP_LOAD_BLOCKS, o->start, o->end, (sp_wtype)o->dtype,
                                         err);
    if (st)
        return st;
    if (s->o.max_length <= 0 || s->o.max_length > s->m->cfg.max_pos)
        s->o.max_length = s->m->cfg.max_pos;
    return SP_OK;
}

/* The KV budget in bytes, from the family's bytes per position (2 x kv_heads x head_dim x 4 per block). */
static sp_status cache_budget(sp_server *s, sp_err *err)
{
    long kv = (long)sp_config_kv_bytes_per_token(&s->m->cfg), span = s->m->last - s->m->first;
    if (s->o.cache_bytes > 0) {
        s->o.cache_tokens = span > 0 ? s->o.cache_bytes / (kv * span) : 0;
        if (s->o.cache_tokens < 1)
            return sp_errf(err, SP_ERR_ARG, "a KV cache of %ld bytes holds no position of %ld blocks (%ld bytes each)",
                           s->o.cache_bytes, span, kv * span);
    }
    sessions_init(&s->st, s->o.cache_tokens * span * kv, kv);
    return SP_OK;
}

static sp_status start_threads(sp_server *s, sp_err *err)
{
    s->nworkers = s->o.workers > 0 ? s->o.workers : 1;
    /* tasks for the requests in flight: one per worker, one arriving meanwhile (a worker lets go of its task
     * just after its answer went out, and the next request may come first) */
    for (int i = 0; i < 2 * s->nworkers + 2; i++) {
        task *t = calloc(1, sizeof *t);
        if (!t)
            return sp_errf(err, SP_ERR_NOMEM, "out of memory");
        task_done(&s->q, t);
    }
    s->workers = calloc((size_t)s->nworkers, sizeof *s->workers);
    if (!s->workers)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < s->nworkers; i++)
        if (pthread_create(&s->workers[i], NULL, worker_main, s)) {
            s->nworkers = i;
            return sp_errf(err, SP_ERR_IO, "cannot start worker threads");
        }
    if (pthread_create(&s->reaper, NULL, reaper_main, s))
        return sp_errf(err, SP_ERR_IO, "cannot start the reaper thread");
    s->reaper_started = 1;
    return SP_OK;
}

/* The transport's limits from the server's, sized from the span: a connection's share holds the largest request
 * the span accepts (a smaller one given is refused: legitimate requests would never fit). */
static sp_status transport_limits(sp_server *s, sp_transport_opts *to, sp_err *err)
{
    const sp_server_limits *l = &s->o.limits;
    uint64_t need = sp_server_largest_request(s->m->cfg.hidden, s->m->last - s->m->first, s->o.max_batch_tokens,
                                              s->o.cache_tokens);
    uint64_t mib = 1ull << 20, conn = l->input_budget_conn ? l->input_budget_conn : (need + mib - 1) / mib * mib;
    if (conn < need || (s->o.max_message && s->o.max_message < need))
        return sp_errf(err, SP_ERR_ARG, "the input budget per connection (%.1f MiB) is below the largest request "
                       "this span accepts (%.1f MiB: (2 + %d blocks) x %d max-batch-tokens, or (1 + blocks) x %ld "
                       "cache-tokens, x hidden %d x 4 bytes); raise it or lower --max-batch-tokens / --cache-tokens",
                       (double)(s->o.max_message && s->o.max_message < conn ? s->o.max_message : conn) / mib,
                       (double)need / mib, s->m->last - s->m->first, s->o.max_batch_tokens, s->o.cache_tokens,
                       s->m->cfg.hidden);
    to->max_message = s->o.max_message && s->o.max_message < conn ? s->o.max_message : conn;
    to->rx_budget_conn = conn;
    to->rx_budget = l->input_budget;
    to->rx_budget_ip = l->input_budget_ip;
    to->tx_bound = l->output_bound;
    to->max_conns = l->max_conns;
    to->max_conns_per_ip = l->max_conns_per_ip;
    to->max_pending = l->max_pending;
    to->max_pending_per_ip = l->max_pending_per_ip;
    to->handshake_timeout_s = l->handshake_timeout_s;
    to->idle_timeout_s = l->idle_timeout_s > 0 ? (int)ceil(l->idle_timeout_s) : 0;
    to->busy_timeout_s = l->busy_timeout_s;
    to->min_rate = l->min_rate;
    return SP_OK;
}

static sp_status start_transport(sp_server *s, sp_err *err)
{
    sp_transport_opts to;
    sp_transport_opts_default(&to);
    sp_status st = transport_limits(s, &to, err);
    if (st)
        return st;
    to.host = s->o.host;
    to.port = s->o.port;
    to.bulk_port = s->o.bulk_port;
    to.bulk_threshold = 1; /* replies go back on the channel a client attached, small ones too */
    to.first_type = SP_MSG_HELLO;
    to.app_releases = 1; /* a request holds its budget until a worker is done with it */
    to.key = s->o.key;
    st = sp_ws_server_start(&s->ws, &to, on_message, on_close, s, err);
    if (!st)
        s->limits.max_message = to.max_message; /* the decoder's cap is the transport's */
    return st;
}

void sp_server_limits_get(sp_server *s, sp_server_limits *out)
{
    sp_ws_server_stats ts;
    sp_ws_server_stats_get(s->ws, &ts);
    const sp_transport_opts *t = &ts.limits;
    *out = (sp_server_limits){.max_conns = t->max_conns, .max_conns_per_ip = t->max_conns_per_ip,
                              .max_pending = t->max_pending, .max_pending_per_ip = t->max_pending_per_ip,
                              .handshake_timeout_s = t->handshake_timeout_s, .idle_timeout_s = t->idle_timeout_s,
                              .input_budget = t->rx_budget, .input_budget_conn = t->rx_budget_conn,
                              .input_budget_ip = t->rx_budget_ip, .output_bound = t->tx_bound,
                              .busy_timeout_s = t->busy_timeout_s, .min_rate = t->min_rate};
}

sp_status sp_server_start(sp_server **out, const sp_server_opts *o, sp_err *err)
{
    *out = NULL;
    if (!o->model_dir)
        return sp_errf(err, SP_ERR_ARG, "server: no model directory");
    sp_server *s = calloc(1, sizeof *s);
    if (!s)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    s->o = *o;
    if (o->key) { /* a copy: the caller's may go */
        s->key = *o->key;
        s->o.key = &s->key;
    }
    pthread_mutex_init(&s->q.lock, NULL);
    pthread_cond_init(&s->q.cond, NULL);
    s->q.window_ns = (uint64_t)((o->passed_window_s > 0 ? o->passed_window_s : 60) * 1e9);
    pthread_mutex_init(&s->stats_lock, NULL);
    pthread_mutex_init(&s->mx_lock, NULL);
    s->mx.started_t = sp_now_s();
    pthread_mutex_init(&s->reaper_lock, NULL);
    pthread_cond_init(&s->reaper_cond, NULL);
    kept_init(&s->kt, o->keep_bytes);
    awaits_init(&s->aw, o->await_bytes ? o->await_bytes : o->keep_bytes / 2 + ((size_t)64 << 20)); /* pushed inputs */
    pthread_mutex_init(&s->inline_lock, NULL);
    pthread_mutex_init(&s->push_lock, NULL);
    pthread_mutex_init(&s->batch_lock, NULL);
    s->limits = sp_proto_default_limits();
    s->limits.max_message = o->max_message;
    if (o->threads > 0) /* the engine's pool (decode kernels), created by the first block that loads */
        sp_pool_default_threads(o->threads);
    s->blas_threads = o->threads > 0 ? o->threads : sp_cpu_count(); /* OpenBLAS: large products only */
    openblas_set_num_threads(s->blas_threads);
    sp_status st = load(s, err);
    if (!st)
        st = cache_budget(s, err);
    if (!st && o->device >= 0 && (st = span_dev_open(s, o->device, err))) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        sp_errf(err, st, "--device cuda:%d: %.480s", o->device, why);
    }
    if (!st) {
        if (s->o.measure)
            sp_throughput_measure(s);
        /* a single-token step that takes under a millisecond costs less than the hand-off to a worker */
        s->inline_steps = 1;
        s->step_ns = s->inference_rps > 0 ? (uint64_t)(1e9 / s->inference_rps) : 1000000;
        st = start_threads(s, err);
    }
    if (!st)
        st = start_transport(s, err);
    if (st) {
        sp_server_stop(s);
        return st;
    }
    *out = s;
    return SP_OK;
}

int sp_server_port(const sp_server *s) { return sp_ws_server_port(s->ws); }
int sp_server_bulk_port(const sp_server *s) { return sp_ws_server_bulk_port(s->ws); }

int sp_server_public_bulk_port(const sp_server *s)
{
    int own = sp_ws_server_bulk_port(s->ws);
    return own > 0 && s->o.public_bulk_port > 0 ? s->o.public_bulk_port : own;
}

void sp_server_span(const sp_server *s, int *start, int *end)
{
    *start = s->m->first;
    *end = s->m->last;
}

long sp_server_cache_left(sp_server *s) { return sessions_tokens_available(s); }

const char *sp_server_dtype(const sp_server *s) { return sp_wtype_name((sp_wtype)s->o.dtype); }
const char *sp_server_device(const sp_server *s) { return span_device(s); }

size_t sp_server_weight_bytes(const sp_server *s)
{
    if (s->dev)
        return span_dev_weight_bytes(s);
    size_t n = 0;
    for (int i = 0; s->m && i < s->m->last - s->m->first; i++)
        n += sp_block_bytes(&s->m->blocks[i]);
    return n;
}

void sp_server_throughput(const sp_server *s, double *inference_rps, double *forward_tps)
{
    *inference_rps = s->inference_rps;
    *forward_tps = s->forward_tps;
}

int sp_server_sessions(sp_server *s)
{
    pthread_mutex_lock(&s->st.lock);
    int n = s->st.count;
    pthread_mutex_unlock(&s->st.lock);
    return n;
}

void sp_server_batch_stats_get(sp_server *s, sp_server_batch_stats *out)
{
    *out = (sp_server_batch_stats){
        .batches = __atomic_load_n(&s->batches, __ATOMIC_RELAXED),
        .rows = __atomic_load_n(&s->batched_rows, __ATOMIC_RELAXED),
        .peak = __atomic_load_n(&s->batch_peak, __ATOMIC_RELAXED),
        .prefills = __atomic_load_n(&s->batched_prefills, __ATOMIC_RELAXED),
        .long_prefills = __atomic_load_n(&s->batched_long, __ATOMIC_RELAXED),
        .waited_out = __atomic_load_n(&s->waited_out, __ATOMIC_RELAXED),
        .queue_wait_s = sp_server_queue_wait(s)};
}

double sp_server_queue_wait(sp_server *s)
{
    uint64_t now = sp_now_ns(), oldest = 0;
    pthread_mutex_lock(&s->q.lock);
    const task *t = s->q.head[0];
    while (t && !t->step) /* (opens and closes cost nothing; the list is in arrival order) */
        t = t->next;
    if (t)
        oldest = now - t->queued_ns;
    pthread_mutex_unlock(&s->q.lock);
    uint64_t avg = __atomic_load_n(&s->queue_wait_ns, __ATOMIC_RELAXED),
             at = __atomic_load_n(&s->waited_at_ns, __ATOMIC_RELAXED),
             fresh = 2000000000ull + 2 * __atomic_load_n(&s->batch_ns, __ATOMIC_RELAXED);
    uint64_t recent = at && now - at < fresh ? avg : 0;
    return (double)(recent > oldest ? recent : oldest) / 1e9;
}

int sp_server_saturated(sp_server *s)
{
    return s->o.max_queue_wait_s > 0 && sp_server_queue_wait(s) > s->o.max_queue_wait_s;
}

size_t sp_server_kept_bytes(sp_server *s)
{
    pthread_mutex_lock(&s->kt.lock);
    size_t n = s->kt.bytes;
    pthread_mutex_unlock(&s->kt.lock);
    return n;
}

void sp_server_pushes(sp_server *s, uint64_t *in, uint64_t *out)
{
    *in = __atomic_load_n(&s->pushes_in, __ATOMIC_RELAXED);
    *out = __atomic_load_n(&s->pushes_out, __ATOMIC_RELAXED);
}

uint64_t sp_server_pushes_in_flight_peak(sp_server *s)
{
    return __atomic_load_n(&s->pushes_in_flight_peak, __ATOMIC_RELAXED);
}

void sp_server_awaits_get(sp_server *s, sp_server_awaits *out)
{
    pthread_mutex_lock(&s->aw.lock);
    *out = (sp_server_awaits){
        .held = s->aw.bytes, .cap = s->aw.cap, .expired = s->aw.expired, .refused = s->aw.refused};
    pthread_mutex_unlock(&s->aw.lock);
}

int sp_server_caps(const sp_server *s) { return s->o.emulate_old == SP_SERVER_OLD_NOPUSH ? 0 : SP_CAPS_ALL; }

uint64_t sp_server_requests(sp_server *s)
{
    pthread_mutex_lock(&s->stats_lock);
    uint64_t n = s->requests;
    pthread_mutex_unlock(&s->stats_lock);
    return n;
}

/* Every connection with an open session hears why it is about to close: an ERROR "shutdown" (request id 0,
 * which a waiting client takes as its answer), so a client prints that reason rather than "connection closed". */
void sp_server_goodbye(sp_server *s)
{
    if (!s || !s->ws || !s->m)
        return;
    uint64_t conns[256];
    int n = 0;
    pthread_mutex_lock(&s->st.lock);
    for (session *x = s->st.head; x && n < 256; x = x->next) {
        int seen = 0;
        for (int i = 0; i < n && !seen; i++)
            seen = conns[i] == x->conn;
        if (!seen && !x->closed)
            conns[n++] = x->conn;
    }
    pthread_mutex_unlock(&s->st.lock);
    for (int i = 0; i < n; i++)
        sp_rpc_error(s, conns[i], 0, "shutdown", "the server is shutting down");
}

void sp_server_stop(sp_server *s)
{
    if (!s)
        return;
    sp_server_goodbye(s); /* (again: a session opened since is told too) */
    /* workers finish the task in hand (their replies still go out), then the transport closes every
     * connection, which frees the sessions */
    pthread_mutex_lock(&s->q.lock);
    s->q.stop = 1;
    pthread_cond_broadcast(&s->q.cond);
    pthread_mutex_unlock(&s->q.lock);
    for (int i = 0; i < s->nworkers; i++)
        pthread_join(s->workers[i], NULL);
    if (s->ws)
        sp_ws_server_stop(s->ws);
    if (s->reaper_started) {
        pthread_mutex_lock(&s->reaper_lock);
        s->reaper_stop = 1;
        pthread_cond_signal(&s->reaper_cond);
        pthread_mutex_unlock(&s->reaper_lock);
        pthread_join(s->reaper, NULL);
    }
    queue_drain(&s->q);
    sp_push_close_all(s);
    pthread_mutex_destroy(&s->push_lock);
    if (s->m)
        sessions_destroy(&s->st);
    kept_destroy(&s->kt);
    awaits_destroy(&s->aw);
    span_dev_close(s); /* after the sessions: their device caches go first */
    free(s->workers);
    sp_ws_free(&s->inline_ws);
    pthread_mutex_destroy(&s->inline_lock);
    pthread_mutex_destroy(&s->batch_lock);
    sp_model_free(s->m);
    pthread_mutex_destroy(&s->q.lock);
    pthread_cond_destroy(&s->q.cond);
    pthread_mutex_destroy(&s->stats_lock);
    pthread_mutex_destroy(&s->mx_lock);
    pthread_mutex_destroy(&s->reaper_lock);
    pthread_cond_destroy(&s->reaper_cond);
    free(s);
}
