/* throughput.c - the server measures its own speed at start: single-token inference steps/s over its
 * whole span (KV cache of 128 positions), and the tokens/s of one 1024-token forward (or the model's
 * context, if shorter). Figures are cached in a file keyed by model / blocks / dtype / host / threads,
 * so restarts do not pay for it again. A figure measured while the machine was overloaded (a 1-minute load
 * average over 1 per CPU, as under a test suite) or older than a week is measured again: a busy hour does not
 * stay in the cache (one of 64 steps/s for a span that does 1350 had). */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "paths.h"
#include "rng.h"
#include "server_impl.h"
#include "span.h"
#include "timeutil.h"

static void cache_path(const sp_server *s, char *buf, size_t cap)
{
    if (s->o.throughput_cache) {
        snprintf(buf, cap, "%s", s->o.throughput_cache);
        return;
    }
    char dir[3800];
    sp_cache_dir(dir, sizeof dir);
    snprintf(buf, cap, "%.3800s/throughput.json", dir);
}

static void cache_key(const sp_server *s, char *buf, size_t cap)
{
    char host[128] = "localhost";
    gethostname(host, sizeof host - 1);
    char *real = realpath(s->model_dir, NULL);
    snprintf(buf, cap, "%s|%d:%d|%s|%s|threads=%d%s%s", real ? real : s->model_dir, s->m->first, s->m->last,
             sp_wtype_name((sp_wtype)s->o.dtype), host, s->blas_threads, s->dev ? "|" : "",
             s->dev ? span_device(s) : "");
    free(real);
}

static cJSON *read_cache(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = malloc(1 << 20);
    size_t n = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    if (!buf)
        return NULL;
    buf[n] = '\0';
    cJSON *root = cJSON_Parse(buf);
    free(buf);
    return cJSON_IsObject(root) ? root : (cJSON_Delete(root), NULL);
}

/* The 1-minute load average over the CPUs this process may use (what the measurement competed with). */
static double load_per_cpu(void)
{
    double l = 0;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1)
            l = 0;
        fclose(f);
    }
    int n = sp_cpu_count();
    return l / (n > 0 ? n : 1);
}

static int lookup(const sp_server *s, sp_server *out)
{
    char path[4096], key[4600];
    cache_path(s, path, sizeof path);
    cache_key(s, key, sizeof key);
    cJSON *root = read_cache(path);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, key);
    const cJSON *inf = cJSON_GetObjectItemCaseSensitive(e, "inference_rps");
    const cJSON *fwd = cJSON_GetObjectItemCaseSensitive(e, "forward_tps");
    const cJSON *load = cJSON_GetObjectItemCaseSensitive(e, "load_per_cpu");
    const cJSON *at = cJSON_GetObjectItemCaseSensitive(e, "measured_at");
    int ok = cJSON_IsNumber(inf) && cJSON_IsNumber(fwd) && inf->valuedouble > 0 && fwd->valuedouble > 0 &&
             cJSON_IsNumber(load) && load->valuedouble <= 1.0 && cJSON_IsNumber(at) &&
             (double)time(NULL) - at->valuedouble < 7 * 86400.0;
    if (ok) {
        out->inference_rps = inf->valuedouble;
        out->forward_tps = fwd->valuedouble;
    }
    cJSON_Delete(root);
    return ok;
}

static void store(const sp_server *s)
{
    char path[4096], key[4600], tmp[4200];
    cache_path(s, path, sizeof path);
    cache_key(s, key, sizeof key);
    cJSON *root = read_cache(path);
    if (!root)
        root = cJSON_CreateObject();
    cJSON_DeleteItemFromObjectCaseSensitive(root, key);
    cJSON *e = cJSON_AddObjectToObject(root, key);
    cJSON_AddNumberToObject(e, "inference_rps", s->inference_rps);
    cJSON_AddNumberToObject(e, "forward_tps", s->forward_tps);
    cJSON_AddNumberToObject(e, "load_per_cpu", load_per_cpu());
    cJSON_AddNumberToObject(e, "measured_at", (double)time(NULL));
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = '\0';
        mkdir(dir, 0755); /* one level is enough for the default ~/.cache/sepal */
    }
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    FILE *f = text ? fopen(tmp, "wb") : NULL;
    if (f && fputs(text, f) >= 0 && fclose(f) == 0)
        rename(tmp, path); /* atomic: concurrent servers never see a half-written file */
    else if (f)
        fclose(f);
    free(text);
}

/* Runs the span's blocks on x [1, T, H] (cache optional). */
static int run(sp_server *s, float *x, int T, int pos0, sp_kv_cache *kv, sp_ws *ws)
{
    sp_err err = {0};
    for (int i = 0; i < s->m->last - s->m->first; i++)
        if (sp_block_forward(&s->m->blocks[i], x, x, 1, T, pos0, kv ? &kv[i] : NULL, ws, &err))
            return -1;
    return 0;
}

static void measure(sp_server *s)
{
    int n = s->m->last - s->m->first, H = s->m->cfg.hidden, ctx = s->m->cfg.max_pos;
    int T = ctx < 1024 ? ctx : 1024, past = ctx > 129 ? 128 : ctx / 2;
    if (s->dev) { /* the same figures on the device (span.h) */
        span_dev_measure(s, T, past, &s->inference_rps, &s->forward_tps);
        return;
    }
    float *x = calloc((size_t)T * H, sizeof(float));
    sp_kv_cache *kv = calloc((size_t)(n ? n : 1), sizeof *kv);
    sp_ws ws = {0};
    sp_rng r;
    sp_rng_seed(&r, 1);
    int ok = x && kv;
    for (int i = 0; ok && i < n; i++)
        ok = sp_kv_init(&kv[i], 1, past + 1, s->m->cfg.n_kv_heads, s->m->cfg.head_dim, NULL) == SP_OK;
    if (ok) {
        sp_rng_fill_normal(&r, x, (long)T * H, 1.0f);
        double t0 = sp_now_s();
        ok = !run(s, x, T, 0, NULL, &ws);
        s->forward_tps = T / (sp_now_s() - t0);
        int steps = 0;
        t0 = sp_now_s();
        while (ok && (steps < 3 || sp_now_s() - t0 < 0.5) && steps < 1000) { /* about half a second */
            for (int i = 0; i < n; i++)
                kv[i].len = past;
            ok = !run(s, x, 1, past, kv, &ws);
            steps++;
        }
        s->inference_rps = steps / (sp_now_s() - t0);
    }
    for (int i = 0; kv && i < n; i++)
        sp_kv_free(&kv[i]);
    free(kv);
    free(x);
    sp_ws_free(&ws);
    if (!ok)
        s->inference_rps = s->forward_tps = 0;
}

void sp_throughput_measure(sp_server *s)
{
    if (lookup(s, s)) {
        sp_log(SP_LOG_INFO, "throughput (cached): %.1f steps/s, %.0f tokens/s", s->inference_rps, s->forward_tps);
        return;
    }
    measure(s);
    sp_log(SP_LOG_INFO, "throughput (measured): %.1f steps/s, %.0f tokens/s", s->inference_rps, s->forward_tps);
    if (s->inference_rps > 0)
        store(s);
}
