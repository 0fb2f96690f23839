/* train.c - one prompt-tuning step (deep_ptune, sst2, batch 16, max length 64, P 16 by default) through a
 * 3-server loopback swarm vs the same step with every block in this process, reps interleaved (swarm,
 * local, swarm, ...). Prints tokens/s of each and the ratio (goal >= 0.85).
 *
 * usage: bench_train [MODEL_DIR] [--servers N] [--batch B] [--max-length L] [--pre-seq-len P] [--reps R] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host.h"
#include "runtime.h"
#include "timeutil.h"
#include "trainer.h"

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const char *cache = getenv("SEPAL_CACHE"), *home = getenv("HOME");
    char model[4096];
    snprintf(model, sizeof model, "%s/models/stories15M", cache && *cache ? cache : home ? home : ".");
    if (!(cache && *cache))
        snprintf(model, sizeof model, "%s/.cache/sepal/models/stories15M", home ? home : ".");
    int servers = 3, reps = 5;
    sp_train_opts o;
    sp_train_opts_default(&o);
    o.device = 0;
    for (int i = 1; i < argc; i++) {
        int *dst = !strcmp(argv[i], "--servers")       ? &servers
                   : !strcmp(argv[i], "--batch")       ? &o.batch
                   : !strcmp(argv[i], "--max-length")  ? &o.max_length
                   : !strcmp(argv[i], "--pre-seq-len") ? &o.pre_seq_len
                   : !strcmp(argv[i], "--reps")        ? &reps
                                                       : NULL;
        if (dst && i + 1 < argc)
            *dst = atoi(argv[++i]);
        else if (argv[i][0] != '-')
            snprintf(model, sizeof model, "%s", argv[i]);
        else
            return fprintf(stderr, "usage: bench_train [MODEL_DIR] [--servers N] [--batch B] [--max-length L] "
                                   "[--pre-seq-len P] [--reps R]\n"), 2;
    }
    sp_plugin_register_builtins();
    const sepal_task *task = sp_plugin_find("sst2");
    sp_runtime *rt = NULL;
    sp_model *all = NULL;
    sp_trainer *swarm = NULL, *local = NULL;
    sp_err err = {0};
    if (!task || sp_runtime_new(&rt, NULL, NULL, &err) || sp_runtime_load(rt, model, &err) ||
        sp_runtime_swarm_up(rt, servers, 0, &err) || sp_model_load(&all, model, SP_LOAD_BLOCKS, 0, -1, &err) ||
        sp_trainer_new(&swarm, rt, NULL, task, "", &o, &err) || sp_trainer_new(&local, rt, all, task, "", &o, &err)) {
        fprintf(stderr, "bench_train: %s\n", task ? err.msg : "no sst2 task");
        sp_runtime_free(rt);
        return 1;
    }
    int *idx = malloc((size_t)o.batch * sizeof *idx);
    double *ts = calloc((size_t)reps, sizeof *ts), *tl = calloc((size_t)reps, sizeof *tl);
    for (int i = 0; i < o.batch; i++)
        idx[i] = i;
    float loss;
    int ok = !sp_trainer_step(swarm, idx, o.batch, &loss, &err) && !sp_trainer_step(local, idx, o.batch, &loss, &err);
    double tokens = (double)o.batch * (o.max_length + o.pre_seq_len); /* positions processed per step (at most) */
    for (int r = 0; ok && r < reps; r++) {
        for (int i = 0; i < o.batch; i++)
            idx[i] = (r + 1) * o.batch + i;
        double t0 = sp_now_s();
        ok = !sp_trainer_step(swarm, idx, o.batch, &loss, &err);
        double t1 = sp_now_s();
        ok = ok && !sp_trainer_step(local, idx, o.batch, &loss, &err);
        ts[r] = tokens / (t1 - t0);
        tl[r] = tokens / (sp_now_s() - t1);
        printf("  rep %d: swarm %.0f tok/s, local %.0f tok/s (loss %.4f)\n", r, ts[r], tl[r], loss);
    }
    if (!ok) {
        fprintf(stderr, "bench_train: %s\n", err.msg);
        return 1;
    }
    qsort(ts, (size_t)reps, sizeof *ts, cmp_d);
    qsort(tl, (size_t)reps, sizeof *tl, cmp_d);
    printf("train step (deep_ptune, batch %d, max length %d, P %d, %d servers): swarm %.0f tok/s, local %.0f tok/s; "
           "ratio %.2f (goal >= 0.85)\n",
           o.batch, o.max_length, o.pre_seq_len, servers, ts[reps / 2], tl[reps / 2], ts[reps / 2] / tl[reps / 2]);
    free(idx), free(ts), free(tl);
    sp_trainer_free(swarm);
    sp_trainer_free(local);
    sp_model_free(all);
    sp_runtime_free(rt);
    return 0;
}
