/* pipeline.c - per-stage schedules and their turnstiles (see pipeline.h). */
#include "pipeline.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "timeutil.h"

enum { IT_WAIT, IT_DONE, IT_SKIP };

struct sp_pipe {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int S, M, aborted;
    int *order;          /* [S][2M] items: backward | mb << 1 */
    unsigned char *state; /* [S][2M] IT_* */
    int *pos;            /* [S] index of the current item (first not done/skipped) */
    int *left;           /* [S] sub-batches of the current item that have left */
    int *busy;           /* [S] threads inside the stage */
    int nbusy, peak;
    sp_pipe_item *trace; /* [S][2M] */
    int *ntrace;         /* [S] */
};

static int item(int backward, int mb) { return (backward ? 1 : 0) | mb << 1; }

/* Fills order[0..2M) for stage s. */
static void make_order(int *o, int S, int s, int M, sp_pipe_kind kind, int K)
{
    int n = 0;
    if (K <= 0 || K > M)
        K = M;
    if (kind == SP_PIPE_AFAB) {
        for (int g = 0; g < M; g += K) {
            int e = g + K < M ? g + K : M;
            for (int m = g; m < e; m++)
                o[n++] = item(0, m);
            for (int m = g; m < e; m++)
                o[n++] = item(1, m);
        }
        return;
    }
    int w = S - 1 - s;
    if (w > M)
        w = M;
    if (w > K - 1)
        w = K - 1;
    int f = 0, b = 0;
    while (f < w)
        o[n++] = item(0, f++);
    while (f < M) {
        o[n++] = item(0, f++);
        o[n++] = item(1, b++);
    }
    while (b < M)
        o[n++] = item(1, b++);
}

sp_pipe *sp_pipe_new(int stages, int M, sp_pipe_kind kind, int max_in_flight)
{
    if (stages < 1 || M < 1)
        return NULL;
    sp_pipe *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    size_t n = (size_t)stages * 2 * M;
    p->S = stages;
    p->M = M;
    p->order = malloc(n * sizeof *p->order);
    p->state = calloc(n, 1);
    p->trace = calloc(n, sizeof *p->trace);
    p->pos = calloc((size_t)stages, sizeof *p->pos);
    p->left = calloc((size_t)stages, sizeof *p->left);
    p->busy = calloc((size_t)stages, sizeof *p->busy);
    p->ntrace = calloc((size_t)stages, sizeof *p->ntrace);
    if (!p->order || !p->state || !p->trace || !p->pos || !p->left || !p->busy || !p->ntrace) {
        sp_pipe_free(p);
        return NULL;
    }
    for (int s = 0; s < stages; s++)
        make_order(p->order + (size_t)s * 2 * M, stages, s, M, kind, max_in_flight);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    return p;
}

void sp_pipe_free(sp_pipe *p)
{
    if (!p)
        return;
    if (p->order && p->state && p->trace && p->pos && p->left && p->busy && p->ntrace) {
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv);
    }
    free(p->order), free(p->state), free(p->trace), free(p->pos), free(p->left), free(p->busy), free(p->ntrace);
    free(p);
}

int sp_pipe_stages(const sp_pipe *p) { return p->S; }

int sp_pipe_order(const sp_pipe *p, int s, int *out)
{
    if (s < 0 || s >= p->S)
        return 0;
    memcpy(out, p->order + (size_t)s * 2 * p->M, (size_t)2 * p->M * sizeof *out);
    return 2 * p->M;
}

/* Index of the item in stage s's order, or -1. */
static int find(const sp_pipe *p, int s, int it)
{
    const int *o = p->order + (size_t)s * 2 * p->M;
    for (int i = 0; i < 2 * p->M; i++)
        if (o[i] == it)
            return i;
    return -1;
}

/* Moves stage s past done and skipped items. Caller holds mu. */
static void advance(sp_pipe *p, int s)
{
    const unsigned char *st = p->state + (size_t)s * 2 * p->M;
    while (p->pos[s] < 2 * p->M && st[p->pos[s]] != IT_WAIT) {
        p->pos[s]++;
        p->left[s] = 0;
    }
}

static sp_status wait_for(sp_pipe *p, int s, int backward, int mb, int enter, sp_err *err)
{
    if (s < 0 || s >= p->S || mb < 0 || mb >= p->M)
        return sp_errf(err, SP_ERR_ARG, "pipeline: no stage %d / microbatch %d (%d stages, %d microbatches)", s, mb,
                       p->S, p->M);
    int it = item(backward, mb);
    pthread_mutex_lock(&p->mu);
    int i = find(p, s, it);
    while (!p->aborted && i >= 0 && p->pos[s] < i)
        pthread_cond_wait(&p->cv, &p->mu);
    sp_status st = SP_OK;
    if (p->aborted)
        st = sp_errf(err, SP_ERR_STATE, "pipeline aborted (another microbatch failed)");
    else if (i < 0 || p->pos[s] > i)
        st = sp_errf(err, SP_ERR_ARG, "pipeline: %s of microbatch %d on stage %d is %s", backward ? "backward" : "forward",
                     mb, s, i < 0 ? "not in its order" : "already done");
    else if (enter) {
        sp_pipe_item *tr = &p->trace[(size_t)s * 2 * p->M + p->ntrace[s]];
        if (p->left[s] == 0 && p->busy[s] == 0)
            *tr = (sp_pipe_item){.backward = backward, .mb = mb, .t_enter = sp_now_s()};
        if (p->busy[s]++ == 0 && ++p->nbusy > p->peak)
            p->peak = p->nbusy;
    }
    pthread_mutex_unlock(&p->mu);
    return st;
}

sp_status sp_pipe_enter(sp_pipe *p, int s, int backward, int mb, sp_err *err)
{
    return wait_for(p, s, backward, mb, 1, err);
}

sp_status sp_pipe_wait_turn(sp_pipe *p, int s, int backward, int mb, sp_err *err)
{
    return wait_for(p, s, backward, mb, 0, err);
}

void sp_pipe_leave(sp_pipe *p, int s, int backward, int mb, int nsub)
{
    if (s < 0 || s >= p->S)
        return;
    pthread_mutex_lock(&p->mu);
    if (p->busy[s] > 0 && --p->busy[s] == 0)
        p->nbusy--;
    int i = find(p, s, item(backward, mb));
    if (i == p->pos[s] && ++p->left[s] >= (nsub > 0 ? nsub : 1)) {
        p->state[(size_t)s * 2 * p->M + i] = IT_DONE;
        p->trace[(size_t)s * 2 * p->M + p->ntrace[s]].t_leave = sp_now_s();
        p->ntrace[s]++;
        advance(p, s);
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
}

void sp_pipe_finish(sp_pipe *p, int mb)
{
    if (mb < 0 || mb >= p->M)
        return;
    pthread_mutex_lock(&p->mu);
    for (int s = 0; s < p->S; s++) {
        for (int b = 0; b < 2; b++) {
            int i = find(p, s, item(b, mb));
            if (i < 0)
                continue;
            unsigned char *st = &p->state[(size_t)s * 2 * p->M + i];
            if (*st == IT_WAIT && !(i == p->pos[s] && p->busy[s] > 0))
                *st = IT_SKIP;
        }
        advance(p, s);
    }
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

void sp_pipe_abort(sp_pipe *p)
{
    pthread_mutex_lock(&p->mu);
    p->aborted = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

int sp_pipe_trace(const sp_pipe *p, int s, sp_pipe_item *out, int cap)
{
    if (s < 0 || s >= p->S)
        return 0;
    sp_pipe *q = (sp_pipe *)p;
    pthread_mutex_lock(&q->mu);
    int n = p->ntrace[s];
    if (out)
        memcpy(out, p->trace + (size_t)s * 2 * p->M, (size_t)(n < cap ? n : cap) * sizeof *out);
    pthread_mutex_unlock(&q->mu);
    return n;
}

int sp_pipe_peak_busy(const sp_pipe *p)
{
    sp_pipe *q = (sp_pipe *)p;
    pthread_mutex_lock(&q->mu);
    int n = p->peak;
    pthread_mutex_unlock(&q->mu);
    return n;
}
