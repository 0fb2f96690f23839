/* pipeline.c - what pipelining over the servers buys: one prompt-tuning step (deep_ptune, sst2) through a
 * loopback swarm with M microbatches, 1F1B with the stages overlapping (max in flight = number of servers)
 * vs the same M microbatches with one in flight (every server idles while the others work: no overlap),
 * and vs one microbatch. Reps interleaved; prints tokens/s of each and the ratios.
 *
 * usage: bench_pipeline [MODEL_DIR] [--servers N] [--batch B] [--microbatches M] [--max-length L]
 *                       [--pre-seq-len P] [--reps R] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blastune.h"
#include "host.h"
#include "runtime.h"
#include "memtune.h"
#include "timeutil.h"
#include "trainer.h"

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    sp_blas_tune(argv); /* as the sepal program does: OpenBLAS's kernels for this CPU */
    sp_memtune(); /* as the sepal program does */
    const char *cache = getenv("SEPAL_CACHE"), *home = getenv("HOME");
    char model[4096];
    if (cache && *cache)
        snprintf(model, sizeof model, "%s/models/stories15M", cache);
    else
        snprintf(model, sizeof model, "%s/.cache/sepal/models/stories15M", home ? home : ".");
    int servers = 3, reps = 5, M = 4;
    sp_train_opts o;
    sp_train_opts_default(&o);
    o.device = 0;
    o.batch = 32;
    for (int i = 1; i < argc; i++) {
        int *dst = !strcmp(argv[i], "--servers")        ? &servers
                   : !strcmp(argv[i], "--batch")        ? &o.batch
                   : !strcmp(argv[i], "--microbatches") ? &M
                   : !strcmp(argv[i], "--max-length")   ? &o.max_length
                   : !strcmp(argv[i], "--pre-seq-len")  ? &o.pre_seq_len
                   : !strcmp(argv[i], "--reps")         ? &reps
                                                        : NULL;
        if (dst && i + 1 < argc)
            *dst = atoi(argv[++i]);
        else if (argv[i][0] != '-')
            snprintf(model, sizeof model, "%s", argv[i]);
        else
            return fprintf(stderr, "usage: bench_pipeline [MODEL_DIR] [--servers N] [--batch B] [--microbatches M] "
                                   "[--max-length L] [--pre-seq-len P] [--reps R]\n"),
                   2;
    }
    if (reps < 1 || M < 1 || M > 64 || o.batch < M)
        return fprintf(stderr, "bench_pipeline: need reps >= 1, 1 <= microbatches <= 64, batch >= microbatches\n"), 2;
    sp_plugin_register_builtins();
    const sepal_task *task = sp_plugin_find("sst2");
    sp_runtime *rt = NULL;
    sp_err err = {0};
    enum { NK = 3 };
    const char *names[NK] = {"pipelined", "one in flight", "one microbatch"};
    sp_trainer *tr[NK] = {0};
    int ok = task && !sp_runtime_new(&rt, NULL, NULL, &err) && !sp_runtime_load(rt, model, &err) &&
             !sp_runtime_swarm_up(rt, servers, 0, &err);
    for (int k = 0; ok && k < NK; k++) {
        sp_train_opts ok_ = o;
        ok_.schedule = SP_SCHED_1F1B;
        ok_.microbatches = k == 2 ? 1 : M;
        ok_.max_in_flight = k == 0 ? servers : 1;
        ok = !sp_trainer_new(&tr[k], rt, NULL, task, "", &ok_, &err);
    }
    if (!ok) {
        fprintf(stderr, "bench_pipeline: %s\n", task ? err.msg : "no sst2 task");
        for (int k = 0; k < NK; k++)
            sp_trainer_free(tr[k]);
        sp_runtime_free(rt);
        return 1;
    }
    int *idx = malloc((size_t)o.batch * sizeof *idx);
    double *tps = calloc((size_t)NK * reps, sizeof *tps);
    float loss;
    double tokens = (double)o.batch * (o.max_length + o.pre_seq_len); /* positions per step (at most) */
    for (int i = 0; i < o.batch; i++)
        idx[i] = i;
    for (int k = 0; ok && k < NK; k++) /* warm-up */
        ok = !sp_trainer_grads(tr[k], idx, o.batch, &loss, &err);
    for (int r = 0; ok && r < reps; r++) {
        for (int i = 0; i < o.batch; i++)
            idx[i] = (r + 1) * o.batch + i;
        printf("  rep %d:", r);
        for (int k = 0; ok && k < NK; k++) {
            double t0 = sp_now_s();
            ok = !sp_trainer_grads(tr[k], idx, o.batch, &loss, &err);
            tps[k * reps + r] = tokens / (sp_now_s() - t0);
            printf(" %s %.0f tok/s (peak busy servers %d);", names[k], tps[k * reps + r],
                   sp_trainer_last_pipe(tr[k]) ? sp_pipe_peak_busy(sp_trainer_last_pipe(tr[k])) : 1);
        }
        printf("\n");
    }
    if (!ok) {
        fprintf(stderr, "bench_pipeline: %s\n", err.msg);
        return 1;
    }
    double med[NK];
    for (int k = 0; k < NK; k++) {
        qsort(tps + k * reps, (size_t)reps, sizeof *tps, cmp_d);
        med[k] = tps[k * reps + reps / 2];
    }
    printf("deep_ptune forward+backward, batch %d, max length %d, P %d, %d servers, %d microbatches (1F1B); tok/s\n"
           "counts B x (max_length + P) positions (more than the padded batches run: the ratios are what counts):\n"
           "  pipelined %.0f tok/s, one in flight %.0f tok/s, one microbatch %.0f tok/s;\n"
           "  pipelined / one in flight %.2f, pipelined / one microbatch %.2f\n",
           o.batch, o.max_length, o.pre_seq_len, servers, M, med[0], med[1], med[2], med[0] / med[1], med[0] / med[2]);
    free(idx), free(tps);
    for (int k = 0; k < NK; k++)
        sp_trainer_free(tr[k]);
    sp_runtime_free(rt);
    return 0;
}
