/* kept.c - activations kept between a FORWARD and its BACKWARD. A training client that will send the
 * BACKWARD asks the FORWARD to keep each block's input (meta "keep": id), and, when they fit in the cap,
 * every block's activations; the BACKWARD (meta "kept": id) then skips recomputing the span's forward (and
 * with the activations, every block's forward too). Entries are bounded by a byte cap (oldest evicted first), dropped
 * with their connection and after the step timeout; a missing entry only means a recompute. */
#include <stdlib.h>

#include "server_impl.h"

void kept_init(kept_table *t, size_t cap)
{
    pthread_mutex_init(&t->lock, NULL);
    t->head = NULL;
    t->bytes = 0;
    t->cap = cap;
}

void kept_free(kept *x)
{
    if (x) {
        for (int i = 0; i < x->nacts; i++)
            sp_block_acts_free(&x->acts[i]);
        free(x->acts);
        free(x->inputs);
        free(x);
    }
}

void kept_destroy(kept_table *t)
{
    while (t->head) {
        kept *n = t->head->next;
        kept_free(t->head);
        t->head = n;
    }
    pthread_mutex_destroy(&t->lock);
}

/* Unlinks the oldest entry (lock held); entries are pushed at the head, so the oldest is last. */
static void evict_oldest(kept_table *t)
{
    kept **p = &t->head;
    while (*p && (*p)->next)
        p = &(*p)->next;
    if (*p) {
        t->bytes -= (*p)->bytes;
        kept_free(*p);
        *p = NULL;
    }
}

void kept_put(sp_server *s, kept *x)
{
    kept_table *t = &s->kt;
    pthread_mutex_lock(&t->lock);
    if (x->bytes > t->cap) {
        pthread_mutex_unlock(&t->lock);
        kept_free(x);
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
            kept_free(x);
        } else {
            p = &x->next;
        }
    }
    pthread_mutex_unlock(&t->lock);
}
