/* kept.c - activations kept between a FORWARD and its BACKWARD. A training client that will send the
 * BACKWARD asks the FORWARD to keep each block's input (meta "keep": id), and, when they fit in the cap,
 * every block's activations; the BACKWARD (meta "kept": id) then skips recomputing the span's forward (and
 * with the activations, every block's forward too). A GPU server keeps the inputs and activations in device memory
 * (span.h's span_dev_kept, charged to the device's budget too) where they fit both (kept_plan, kept.h), else the
 * inputs on the host. Entries are bounded by a byte cap (oldest evicted first; a device entry's bytes count
 * against it too), dropped with their connection and after the step timeout; a missing entry only means a
 * recompute. */
#include <stdlib.h>
#include <string.h>

#include "server_impl.h"
#include "span.h"

kept_where kept_plan(size_t cap, int on_device, size_t acts_bytes, size_t dev_room)
{
    if (cap == 0)
        return KEEP_NONE;
    if (acts_bytes > cap / 4)
        return KEEP_INPUTS;
    if (!on_device)
        return KEEP_ACTS;
    return acts_bytes <= dev_room ? KEEP_DEVICE : KEEP_INPUTS;
}

void kept_init(kept_table *t, size_t cap)
{
    memset(t, 0, sizeof *t);
    pthread_mutex_init(&t->lock, NULL);
    pthread_mutex_init(&t->pool_lock, NULL);
    t->head = NULL;
    t->bytes = 0;
    t->cap = cap;
}

void kept_acts_get(kept_table *t, sp_block_acts *a)
{
    memset(a, 0, sizeof *a);
    pthread_mutex_lock(&t->pool_lock);
    if (t->npool > 0) {
        *a = t->pool[--t->npool];
        t->pool_bytes -= a->cap * sizeof(float);
    }
    pthread_mutex_unlock(&t->pool_lock);
}

void kept_acts_put(kept_table *t, sp_block_acts *a)
{
    if (!a->buf)
        return;
    size_t bytes = a->cap * sizeof(float);
    pthread_mutex_lock(&t->pool_lock);
    if (t->npool == t->cappool && t->pool_bytes + bytes <= t->cap / 4) {
        int cap = t->cappool ? 2 * t->cappool : 16;
        sp_block_acts *p = realloc(t->pool, (size_t)cap * sizeof *p);
        if (p)
            t->pool = p, t->cappool = cap;
    }
    if (t->npool < t->cappool && t->pool_bytes + bytes <= t->cap / 4) {
        t->pool[t->npool++] = *a;
        t->pool_bytes += bytes;
        memset(a, 0, sizeof *a);
    }
    pthread_mutex_unlock(&t->pool_lock);
    sp_block_acts_free(a); /* not pooled (a no-op if it was) */
}

void kept_free(kept_table *t, kept *x)
{
    if (x) {
        for (int i = 0; i < x->nacts; i++) {
            if (t)
                kept_acts_put(t, &x->acts[i]);
            else
                sp_block_acts_free(&x->acts[i]);
        }
        free(x->acts);
        free(x->inputs);
        span_dev_kept_free(x->dev); /* (a GPU server's: the device's lock taken) */
        free(x);
    }
}

void kept_destroy(kept_table *t)
{
    while (t->head) {
        kept *n = t->head->next;
        kept_free(NULL, t->head);
        t->head = n;
    }
    for (int i = 0; i < t->npool; i++)
        sp_block_acts_free(&t->pool[i]);
    free(t->pool);
    pthread_mutex_destroy(&t->lock);
    pthread_mutex_destroy(&t->pool_lock);
}

/* Unlinks the oldest entry (lock held); entries are pushed at the head, so the oldest is last. */
static void evict_oldest(kept_table *t)
{
    kept **p = &t->head;
    while (*p && (*p)->next)
        p = &(*p)->next;
    if (*p) {
        t->bytes -= (*p)->bytes;
        kept_free(t, *p);
        *p = NULL;
    }
}

void kept_put(sp_server *s, kept *x)
{
    kept_table *t = &s->kt;
    pthread_mutex_lock(&t->lock);
    if (x->bytes > t->cap) {
        pthread_mutex_unlock(&t->lock);
        kept_free(t, x);
        return;
    }
    while (t->head && t->bytes + x->bytes > t->cap)
        evict_oldest(t);
    x->next = t->head;
    t->head = x;
    t->bytes += x->bytes;
    pthread_mutex_unlock(&t->lock);
}

kept *kept_take(sp_server *s, uint64_t conn, uint64_t id, int start, int end, int B, int T, int P)
{
    kept_table *t = &s->kt;
    pthread_mutex_lock(&t->lock);
    for (kept **p = &t->head; *p; p = &(*p)->next) {
        kept *x = *p;
        if (x->conn == conn && x->id == id && x->start == start && x->end == end && x->B == B && x->T == T &&
            x->P == P) {
            *p = x->next;
            t->bytes -= x->bytes;
            pthread_mutex_unlock(&t->lock);
            return x;
        }
    }
    pthread_mutex_unlock(&t->lock);
    return NULL;
}

void kept_drop(sp_server *s, uint64_t conn, double older_than)
{
    kept_table *t = &s->kt;
    pthread_mutex_lock(&t->lock);
    for (kept **p = &t->head; *p;) {
        kept *x = *p;
        if (x->conn == conn || x->created < older_than) {
            *p = x->next;
            t->bytes -= x->bytes;
            kept_free(t, x);
        } else {
            p = &x->next;
        }
    }
    pthread_mutex_unlock(&t->lock);
}
