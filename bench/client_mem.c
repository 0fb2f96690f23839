/* client_mem.c - what `load` costs the client: peak RSS (VmHWM) of a fresh process after loading a model's
 * local parts (embeddings, final norm, head, tokenizer), against the bytes of those parts; the goal is
 * peak <= 1.1 x local-parts bytes + 16 MB. Each model loads in a child process of its own, so the figures are
 * the client's alone; the baseline is a child that loads nothing (measured in the same run).
 *
 * usage: bench_client_mem [MODEL_DIR ...] (default: the shipped stories15M) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "memtune.h"
#include "model.h"
#include "runtime.h"

static long status_kb(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    size_t n = strlen(field);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, field, n))
            kb = atol(line + n);
    if (f)
        fclose(f);
    return kb;
}

/* In a child: load dir (NULL: nothing) and write "hwm_kb rss_kb local_bytes hwm_after_kb" to fd, the last
 * after a first token's head and embedding lookups (every page of them in use). */
static void child(const char *dir, int fd)
{
    sp_runtime *rt = NULL;
    sp_err err = {0};
    long long bytes = 0;
    if (sp_runtime_new(&rt, NULL, NULL, &err))
        _exit(1);
    if (dir) {
        if (sp_runtime_load(rt, dir, &err)) {
            fprintf(stderr, "bench: %s\n", err.msg);
            _exit(1);
        }
        bytes = (long long)sp_runtime_model(rt)->bytes_loaded;
    }
    long hwm = status_kb("VmHWM:"), rss = status_kb("VmRSS:"), used = hwm;
    if (dir) {
        int H = sp_runtime_config(rt)->hidden, V = sp_runtime_config(rt)->vocab;
        float *h = calloc((size_t)H, sizeof(float)), *logits = malloc((size_t)V * sizeof(float));
        int32_t ids[64];
        for (int i = 0; i < 64; i++)
            ids[i] = (int32_t)((long)i * V / 64);
        float *e = malloc((size_t)64 * H * sizeof(float));
        for (int i = 0; h && i < H; i++)
            h[i] = 0.01f * (float)(i % 7);
        if (h && logits && e && !sp_model_embed(sp_runtime_model(rt), e, ids, 64, &err) &&
            !sp_model_head(sp_runtime_model(rt), logits, h, 1, &err))
            used = status_kb("VmHWM:");
        free(h), free(logits), free(e);
    }
    dprintf(fd, "%ld %ld %lld %ld\n", hwm, rss, bytes, used);
    _exit(0);
}

static int measure(const char *dir, long *hwm, long *rss, long long *bytes, long *used)
{
    int p[2];
    if (pipe(p))
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        child(dir, p[1]);
    }
    close(p[1]);
    char buf[128] = "";
    ssize_t n = read(p[0], buf, sizeof buf - 1);
    close(p[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    if (n <= 0 || !WIFEXITED(st) || WEXITSTATUS(st))
        return -1;
    buf[n] = 0;
    return sscanf(buf, "%ld %ld %lld %ld", hwm, rss, bytes, used) == 4 ? 0 : -1;
}

int main(int argc, char **argv)
{
    sp_memtune();
    static char def[4096];
    const char *home = getenv("HOME");
    snprintf(def, sizeof def, "%s/.cache/sepal/models/stories15M", home ? home : ".");
    const char *dirs_default[] = {def};
    const char **dirs = argc > 1 ? (const char **)argv + 1 : dirs_default;
    int n = argc > 1 ? argc - 1 : 1;
    long bh, br, bu;
    long long bb;
    if (measure(NULL, &bh, &br, &bb, &bu))
        return fprintf(stderr, "bench_client_mem: the baseline child failed\n"), 1;
    printf("bench_client_mem: a client process that loads nothing peaks at %.1f MB\n", bh / 1024.0);
    int rc = 0;
    for (int i = 0; i < n; i++) {
        long hwm, rss, used;
        long long bytes;
        if (measure(dirs[i], &hwm, &rss, &bytes, &used)) {
            fprintf(stderr, "bench_client_mem: %s: the child failed\n", dirs[i]);
            rc = 1;
            continue;
        }
        double mb = bytes / 1048576.0, peak = hwm / 1024.0, goal = 1.1 * mb + 16;
        printf("  %s: local parts %.1f MB; peak RSS %.1f MB (%.2fx), after load %.1f MB; goal <= %.1f MB: %s\n",
               dirs[i], mb, peak, peak / mb, rss / 1024.0, goal, peak <= goal ? "met" : "missed");
        printf("    peak over the empty client's: %.1f MB (%.2fx the local parts); after a first token (the head and "
               "embeddings in use): %.1f MB (%.2fx): %s\n",
               (hwm - bh) / 1024.0, (hwm - bh) / 1024.0 / mb, used / 1024.0, used / 1024.0 / mb,
               used / 1024.0 <= goal ? "met" : "missed");
    }
    return rc;
}
