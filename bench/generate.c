/* generate.c - greedy generation through a local loopback swarm vs the single-process runner, same
 * model, same run, reps interleaved (swarm, local, swarm, local, ...) so that machine noise hits both.
 * Also the client's peak RSS against the bytes of its local parts (embeddings + norm + head).
 *
 * usage: bench_generate [MODEL_DIR] [--servers N] [--tokens N] [--reps N]
 * The swarm side runs in a child process (the client alone: its RSS is the client's), which starts the
 * servers itself as `sepal swarm up` does. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "blastune.h"
#include "generate.h"
#include "memtune.h"
#include "runtime.h"

typedef struct opts {
    const char *model;
    int servers, tokens, reps;
} opts;

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int run_once(const sp_lm *lm, const sp_tokenizer *tok, int tokens, double *tps)
{
    int *raw, n;
    sp_err err = {0};
    if (sp_tokenizer_encode(tok, "Once upon a time", 1, &raw, &n, &err))
        return fprintf(stderr, "bench: %s\n", err.msg), -1;
    int32_t ids[64];
    for (int i = 0; i < n; i++)
        ids[i] = raw[i];
    free(raw);
    sp_gen_opts o;
    sp_gen_opts_default(&o);
    o.max_new = tokens;
    o.stop_at_eos = 0;
    const int32_t *ps[1] = {ids};
    sp_gen_result r;
    if (sp_generate(lm, NULL, ps, &n, 1, &o, NULL, NULL, &r, &err))
        return fprintf(stderr, "bench: %s\n", err.msg), -1;
    *tps = r.tokens_per_s;
    sp_gen_result_free(&r);
    return 0;
}

/* The swarm client: one rep per byte read from `in`, its tok/s written to `out`; then its peak RSS (KiB)
 * and the bytes of its local parts. */
static int swarm_child(const opts *o, int in, int out)
{
    sp_runtime *rt = NULL;
    sp_err err = {0};
    if (sp_runtime_new(&rt, NULL, NULL, &err) || sp_runtime_load(rt, o->model, &err) ||
        sp_runtime_swarm_up(rt, o->servers, 0, &err)) {
        fprintf(stderr, "bench: swarm: %s\n", err.msg);
        return 1;
    }
    sp_lm_swarm sw;
    sp_lm lm = sp_lm_swarm_make(&sw, rt);
    double tps, warm;
    run_once(&lm, sp_runtime_tokenizer(rt), o->tokens, &warm);
    char c;
    while (read(in, &c, 1) == 1 && c == 'g') {
        if (run_once(&lm, sp_runtime_tokenizer(rt), o->tokens, &tps))
            tps = -1;
        if (write(out, &tps, sizeof tps) != sizeof tps)
            break;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double stats[2] = {(double)ru.ru_maxrss, (double)sp_runtime_model(rt)->bytes_loaded};
    if (write(out, stats, sizeof stats) != sizeof stats)
        return 1;
    sp_runtime_free(rt);
    return 0;
}

static int parse(int argc, char **argv, opts *o)
{
    const char *cache = getenv("SEPAL_CACHE"), *home = getenv("HOME");
    static char def[4096];
    if (cache && *cache)
        snprintf(def, sizeof def, "%s/models/stories15M", cache);
    else
        snprintf(def, sizeof def, "%s/.cache/sepal/models/stories15M", home ? home : ".");
    *o = (opts){def, 3, 200, 5};
    for (int i = 1; i < argc; i++) {
        int *dst = !strcmp(argv[i], "--servers") ? &o->servers
                   : !strcmp(argv[i], "--tokens") ? &o->tokens
                   : !strcmp(argv[i], "--reps")   ? &o->reps
                                                  : NULL;
        if (dst && i + 1 < argc)
            *dst = atoi(argv[++i]);
        else if (argv[i][0] != '-')
            o->model = argv[i];
        else
            return fprintf(stderr, "usage: bench_generate [MODEL_DIR] [--servers N] [--tokens N] [--reps N]\n"), -1;
    }
    return o->servers > 0 && o->tokens > 0 && o->reps > 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    sp_blas_tune(argv); /* as the sepal program does: OpenBLAS's kernels for this CPU */
    sp_memtune(); /* as the sepal program does */
    opts o;
    if (parse(argc, argv, &o))
        return 2;
    int to_child[2], from_child[2];
    if (pipe(to_child) || pipe(from_child))
        return 1;
    pid_t pid = fork();
    if (pid == 0) {
        close(to_child[1]);
        close(from_child[0]);
        _exit(swarm_child(&o, to_child[0], from_child[1]));
    }
    close(to_child[0]);
    close(from_child[1]);
    sp_model *m = NULL;
    sp_tokenizer *tok = NULL;
    sp_err err = {0};
    if (sp_model_load(&m, o.model, SP_LOAD_ALL, 0, -1, &err) || sp_tokenizer_load(&tok, o.model, &err)) {
        fprintf(stderr, "bench: %s\n", err.msg);
        kill(pid, SIGTERM);
        return 1;
    }
    sp_lm_local loc;
    sp_lm lm = sp_lm_local_make(&loc, m);
    double warm, *sw = calloc((size_t)o.reps, sizeof(double)), *lo = calloc((size_t)o.reps, sizeof(double));
    run_once(&lm, tok, o.tokens, &warm);
    int ok = 1;
    for (int r = 0; ok && r < o.reps; r++) { /* interleaved: swarm, local, swarm, local, ... */
        ok = write(to_child[1], "g", 1) == 1 && read(from_child[0], &sw[r], sizeof(double)) == sizeof(double) &&
             sw[r] > 0 && run_once(&lm, tok, o.tokens, &lo[r]) == 0;
    }
    double stats[2] = {0, 0};
    ok = ok && write(to_child[1], "q", 1) == 1 && read(from_child[0], stats, sizeof stats) == sizeof stats;
    int status;
    waitpid(pid, &status, 0);
    if (!ok) {
        fprintf(stderr, "bench: the swarm side failed\n");
        return 1;
    }
    printf("model %s, %d servers, %d greedy tokens per rep, %d reps (medians)\n", o.model, o.servers, o.tokens,
           o.reps);
    for (int r = 0; r < o.reps; r++)
        printf("  rep %d: swarm %.1f tok/s, local %.1f tok/s\n", r, sw[r], lo[r]);
    double ms = median(sw, o.reps), ml = median(lo, o.reps);
    printf("generate: swarm %.1f tok/s, local %.1f tok/s; ratio %.2f (goal >= 0.95)\n", ms, ml, ms / ml);
    double rss = stats[0] * 1024.0, parts = stats[1], limit = 1.2 * parts + 50e6;
    printf("client: peak RSS %.1f MB, local parts %.1f MB; RSS / (1.2 x parts + 50 MB) = %.2f (goal <= 1)\n", rss / 1e6,
           parts / 1e6, rss / limit);
    free(sw);
    free(lo);
    sp_model_free(m);
    sp_tokenizer_free(tok);
    return 0;
}
