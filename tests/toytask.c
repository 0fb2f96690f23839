/* toytask.c - the toy training task of toytask.h. */
#include <stdlib.h>
#include <string.h>

#include "rng.h"
#include "toytask.h"

typedef struct toy {
    int V;
    sepal_batch b; /* the last batch's arrays (the task owns them until its next batch) */
} toy;

static void toy_free_batch(toy *k)
{
    free(k->b.ids), free(k->b.last), free(k->b.labels), free(k->b.targets);
    memset(&k->b, 0, sizeof k->b);
}

static void *toy_open(const sepal_host *host, const char *args, char *err, size_t cap)
{
    (void)args, (void)err, (void)cap;
    toy *k = calloc(1, sizeof *k);
    if (k)
        k->V = host->vocab;
    return k;
}

static void toy_close(void *p)
{
    toy_free_batch(p);
    free(p);
}

static int toy_size(void *p, int split)
{
    (void)p, (void)split;
    return TOY_EXAMPLES;
}

static int toy_batch(void *p, int split, const int *idx, int n, int max_length, sepal_batch *out, char *err,
                     size_t cap)
{
    (void)cap, (void)err;
    toy *k = p;
    toy_free_batch(k);
    int T = 0;
    for (int i = 0; i < n; i++)
        T = 4 + idx[i] % 9 > T ? 4 + idx[i] % 9 : T;
    T = T < max_length ? T : max_length;
    sepal_batch *b = &k->b;
    b->B = n, b->T = T;
    b->ids = calloc((size_t)n * T, sizeof *b->ids);
    b->targets = calloc((size_t)n * T, sizeof *b->targets);
    b->last = calloc((size_t)n, sizeof *b->last);
    b->labels = calloc((size_t)n, sizeof *b->labels);
    if (!b->ids || !b->targets || !b->last || !b->labels)
        return -1;
    for (int i = 0; i < n; i++) {
        int len = 4 + idx[i] % 9 < T ? 4 + idx[i] % 9 : T;
        sp_rng r;
        sp_rng_seed(&r, 1000u * (uint64_t)split + (uint64_t)idx[i] + 1);
        for (int t = 0; t < T; t++)
            b->ids[i * T + t] = t < len ? (int32_t)(sp_rng_u32(&r) % (uint32_t)k->V) : 0;
        for (int t = 0; t < T; t++)
            b->targets[i * T + t] = t + 1 < len ? b->ids[i * T + t + 1] : -1;
        b->last[i] = len - 1;
        b->labels[i] = b->ids[i * T] % 2;
    }
    *out = *b;
    return 0;
}

const sepal_task toy_lm = {.abi = SEPAL_PLUGIN_ABI, .name = "toy-lm", .num_labels = 0, .open = toy_open,
                            .close = toy_close, .size = toy_size, .batch = toy_batch};
const sepal_task toy_cls = {.abi = SEPAL_PLUGIN_ABI, .name = "toy-cls", .num_labels = 2, .open = toy_open,
                             .close = toy_close, .size = toy_size, .batch = toy_batch};
