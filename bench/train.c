/* train.c - one prompt-tuning step (deep_ptune, sst2, batch 16, max length 64, P 16 by default) through a
 * 3-server loopback swarm vs the same step with every block in this process, reps interleaved (swarm,
 * local, swarm, ...). Prints tokens/s of each and the ratio (goal >= 0.85). Tokens are the positions a step
 * really runs: B x (T + P), T being the batch's longest row (sst2 pads to it, not to max_length).
 *
 * --local-only: no servers; only the single-process step.
 * --dump-batch FILE: writes the initial trainable parameters, the optimizer settings and every step's batch
 * (ids, last, labels) with our loss, so bench/train_torch.py can run the identical workflow.
 *
 * --microbatches M: the swarm's step pipelined over M microbatches (default: the trainer's, 4); the
 * single-process step always runs the batch at once.
 *
 * usage: bench_train [MODEL_DIR] [--servers N] [--batch B] [--max-length L] [--pre-seq-len P] [--reps R]
 *                    [--microbatches M]
 *                    [--local-only] [--dump-batch FILE] */
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

/* ---- a second instance of the task, to see the batches the trainer builds (same data, same code) ---- */

static int peek_encode(void *ctx, const char *text, int32_t *ids, int cap)
{
    return sp_task_encode(ctx, text, ids, cap); /* the trainer's host encode */
}

static void *peek_open(const sepal_task *task, sp_runtime *rt, sepal_host *h)
{
    memset(h, 0, sizeof *h);
    h->abi = SEPAL_PLUGIN_ABI;
    h->ctx = rt;
    h->encode = peek_encode;
    h->vocab = sp_runtime_config(rt)->vocab;
    h->pad_id = 0; /* as the trainer's host */
    h->bos_id = sp_runtime_config(rt)->bos_id;
    h->eos_id = sp_runtime_config(rt)->eos_id;
    char msg[512] = "";
    void *ctx = task->open(h, "", msg, sizeof msg);
    if (!ctx)
        fprintf(stderr, "bench_train: task %s: %s\n", task->name, msg);
    return ctx;
}

static void dump_ints(FILE *f, const char *what, const int32_t *v, long n)
{
    fprintf(f, "%s", what);
    for (long i = 0; i < n; i++)
        fprintf(f, " %d", (int)v[i]);
    fputc('\n', f);
}

/* Header: the optimizer settings the trainer uses and the initial trainable parameters. */
static void dump_header(FILE *f, const char *model, sp_trainer *t, const sp_train_opts *o, int per_epoch,
                        const sp_config *cfg)
{
    sp_adamw_opts ao;
    sp_adamw_opts_default(&ao); /* the trainer keeps its betas and eps */
    int total = o->max_steps > 0 ? o->max_steps : per_epoch * o->epochs;
    fprintf(f, "sepal-train-dump 1\nmodel %s\n", model);
    fprintf(f,
            "opts batch %d pre_seq_len %d max_length %d layers %d hidden %d lr %.9g weight_decay %.9g warmup %d "
            "total_steps %d beta1 %.9g beta2 %.9g eps %.9g clip_norm %.9g microbatches %d norm_eps %.9g\n",
            o->batch, o->pre_seq_len, o->max_length, cfg->n_layers, cfg->hidden, (double)o->lr,
            (double)o->weight_decay, o->warmup, total, (double)ao.beta1, (double)ao.beta2, (double)ao.eps,
            (double)o->clip_norm, o->microbatches, (double)cfg->norm_eps);
    sp_t **params;
    int np = sp_trainer_params(t, &params);
    for (int i = 0; i < np; i++) {
        fprintf(f, "param %s %d", params[i]->name, params[i]->ndim);
        for (int d = 0; d < params[i]->ndim; d++)
            fprintf(f, " %lld", (long long)params[i]->shape[d]);
        fputc('\n', f);
        for (int64_t k = 0; k < params[i]->n; k++)
            fprintf(f, "%s%.9g", k ? " " : "", (double)params[i]->data[k]);
        fputc('\n', f);
    }
}

int main(int argc, char **argv)
{
    sp_blas_tune(argv); /* as the sepal program does: OpenBLAS's kernels for this CPU */
    sp_memtune(); /* as the sepal program does */
    const char *cache = getenv("SEPAL_CACHE"), *home = getenv("HOME");
    char model[4096];
    snprintf(model, sizeof model, "%s/models/stories15M", cache && *cache ? cache : home ? home : ".");
    if (!(cache && *cache))
        snprintf(model, sizeof model, "%s/.cache/sepal/models/stories15M", home ? home : ".");
    int servers = 3, reps = 5, local_only = 0, micro = 0;
    const char *dump = NULL;
    sp_train_opts o;
    sp_train_opts_default(&o);
    o.device = 0;
    for (int i = 1; i < argc; i++) {
        int *dst = !strcmp(argv[i], "--servers")       ? &servers
                   : !strcmp(argv[i], "--batch")       ? &o.batch
                   : !strcmp(argv[i], "--max-length")  ? &o.max_length
                   : !strcmp(argv[i], "--pre-seq-len") ? &o.pre_seq_len
                   : !strcmp(argv[i], "--reps")        ? &reps
                   : !strcmp(argv[i], "--microbatches") ? &micro
                                                       : NULL;
        if (dst && i + 1 < argc)
            *dst = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--local-only"))
            local_only = 1;
        else if (!strcmp(argv[i], "--dump-batch") && i + 1 < argc)
            dump = argv[++i];
        else if (argv[i][0] != '-')
            snprintf(model, sizeof model, "%s", argv[i]);
        else
            return fprintf(stderr, "usage: bench_train [MODEL_DIR] [--servers N] [--batch B] [--max-length L] "
                                   "[--pre-seq-len P] [--reps R] [--microbatches M] [--local-only] "
                                   "[--dump-batch FILE]\n"), 2;
    }
    if (reps < 1)
        reps = 1;
    if (!micro)
        micro = o.microbatches < o.batch ? o.microbatches : o.batch; /* the trainer's default */
    o.microbatches = 1; /* the single-process baseline: the whole batch at once */
    if (micro < 1 || micro > 64 || micro > o.batch)
        return fprintf(stderr, "bench_train: need 1 <= microbatches <= min(64, batch)\n"), 2;
    sp_train_opts so = o; /* the swarm's step may be pipelined over M microbatches: the same loss and gradients */
    so.microbatches = micro;
    so.max_in_flight = servers;
    sp_plugin_register_builtins();
    const sepal_task *task = sp_plugin_find("sst2");
    sp_runtime *rt = NULL;
    sp_model *all = NULL;
    sp_trainer *swarm = NULL, *local = NULL;
    sp_err err = {0};
    if (!task || sp_runtime_new(&rt, NULL, NULL, &err) || sp_runtime_load(rt, model, &err) ||
        (!local_only && sp_runtime_swarm_up(rt, servers, 0, &err)) ||
        sp_model_load(&all, model, SP_LOAD_BLOCKS, 0, -1, &err) ||
        (!local_only && sp_trainer_new(&swarm, rt, NULL, task, "", &so, &err)) ||
        sp_trainer_new(&local, rt, all, task, "", &o, &err)) {
        fprintf(stderr, "bench_train: %s\n", task ? err.msg : "no sst2 task");
        sp_runtime_free(rt);
        return 1;
    }
    /* The batches the trainer will build, seen through a second instance of the task. */
    sepal_host peek_host;
    void *peek = peek_open(task, rt, &peek_host); /* the batches' real lengths T */
    FILE *df = dump ? fopen(dump, "w") : NULL;
    if (!peek)
        return 1;
    if (dump && !df)
        return perror(dump), 1;
    if (df) {
        int n = task->size(peek, SEPAL_SPLIT_TRAIN);
        dump_header(df, model, local, &o, (n + o.batch - 1) / o.batch, sp_runtime_config(rt));
    }
    int *idx = malloc((size_t)o.batch * sizeof *idx);
    double *ts = calloc((size_t)reps, sizeof *ts), *tl = calloc((size_t)reps, sizeof *tl);
    long pos_sum = 0, pos_nominal = (long)o.batch * (o.max_length + o.pre_seq_len);
    double time_sum = 0, batch_s = 0;
    int Tmin = 1 << 30, Tmax = 0;
    float loss;
    int ok = 1;
    /* step -1 is the warm-up (examples 0..B-1), then rep r takes examples (r+1)B..(r+2)B-1 */
    for (int r = -1; ok && r < reps; r++) {
        for (int i = 0; i < o.batch; i++)
            idx[i] = (r + 1) * o.batch + i;
        int T = 0;
        if (peek) {
            sepal_batch b;
            char msg[512] = "";
            double b0 = sp_now_s();
            if (task->batch(peek, SEPAL_SPLIT_TRAIN, idx, o.batch, o.max_length, &b, msg, sizeof msg))
                return fprintf(stderr, "bench_train: task %s: %s\n", task->name, msg), 1;
            if (r >= 0)
                batch_s += sp_now_s() - b0;
            T = b.T;
            if (df) {
                fprintf(df, "step %d B %d T %d\n", r + 1, b.B, b.T);
                dump_ints(df, "ids", b.ids, (long)b.B * b.T);
                dump_ints(df, "last", b.last, b.B);
                dump_ints(df, "labels", b.labels, b.B);
            }
        }
        double t0 = sp_now_s();
        if (swarm)
            ok = !sp_trainer_step(swarm, idx, o.batch, &loss, &err);
        double t1 = sp_now_s();
        ok = ok && !sp_trainer_step(local, idx, o.batch, &loss, &err);
        double t2 = sp_now_s();
        if (df && ok)
            fprintf(df, "loss %.9g\n", (double)loss);
        if (!ok || r < 0) {
            if (ok && local_only)
                printf("  warm-up: T %d, loss %.6f\n", T, (double)loss);
            continue;
        }
        if (local_only) {
            long pos = (long)o.batch * (T + o.pre_seq_len);
            tl[r] = (double)pos / (t2 - t1);
            pos_sum += pos;
            time_sum += t2 - t1;
            Tmin = T < Tmin ? T : Tmin;
            Tmax = T > Tmax ? T : Tmax;
            printf("  rep %d: local %.0f tok/s (T %d, %ld positions, %.1f ms, loss %.6f)\n", r, tl[r], T, pos,
                   (t2 - t1) * 1e3, (double)loss);
            continue;
        }
        double tokens = (double)o.batch * (T + o.pre_seq_len); /* the positions this step really ran */
        ts[r] = tokens / (t1 - t0);
        tl[r] = tokens / (t2 - t1);
        printf("  rep %d: swarm %.0f tok/s, local %.0f tok/s (T %d, loss %.4f)\n", r, ts[r], tl[r], T, loss);
    }
    if (df && fclose(df))
        ok = 0, snprintf(err.msg, sizeof err.msg, "cannot write %s", dump);
    if (!ok) {
        fprintf(stderr, "bench_train: %s\n", err.msg);
        return 1;
    }
    qsort(ts, (size_t)reps, sizeof *ts, cmp_d);
    qsort(tl, (size_t)reps, sizeof *tl, cmp_d);
    if (local_only)
        printf("train step local-only (deep_ptune, batch %d, max length %d, P %d, T %d..%d): median %.1f tok/s "
               "over real positions B x (T + P); all reps %ld positions in %.3f s = %.1f tok/s; "
               "batch building %.2f ms/step (included); nominal B x (max_length + P) = %ld/step\n",
               o.batch, o.max_length, o.pre_seq_len, Tmin, Tmax, tl[reps / 2], pos_sum, time_sum,
               (double)pos_sum / time_sum, batch_s * 1e3 / reps, pos_nominal);
    else
        printf("train step (deep_ptune, batch %d, max length %d, P %d, %d servers, swarm in %d microbatch%s; tokens: "
               "B x (T + P), T the batch's longest row): swarm %.0f tok/s, local %.0f tok/s; ratio %.2f (goal >= 0.85)\n",
               o.batch, o.max_length, o.pre_seq_len, servers, micro, micro > 1 ? "es (1F1B)" : "", ts[reps / 2],
               tl[reps / 2], ts[reps / 2] / tl[reps / 2]);
    free(idx), free(ts), free(tl);
    if (peek)
        task->close(peek);
    sp_trainer_free(swarm);
    sp_trainer_free(local);
    sp_model_free(all);
    sp_runtime_free(rt);
    return 0;
}
