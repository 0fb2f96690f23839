/* quality.c - what the weight encodings cost in quality: the mean negative log-likelihood of held-out text
 * under stories15M with its blocks in f32, bf16, int8 and nf4 (the local parts stay f32, as a server's encoding
 * does not touch them), in windows of 256 tokens; and whether greedy generation of the llama2.c golden prompts
 * gives the same text as f32. Goals: int8 within 1% of f32's NLL, nf4 within 8%.
 *
 * Texts: the imdb sentences of the sentiment data (scripts/fetch-sentiment.sh; English reviews, outside
 * TinyStories) and the five golden stories (llama2.c's greedy outputs: inside the model's domain).
 *
 * usage: bench_quality [MODEL_DIR] [--data DIR] [--golden FILE] [--windows N] */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "generate.h"
#include "kern.h"
#include "model.h"
#include "tokenizer.h"

#define WIN 256

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    if (b)
        b[n] = 0;
    fclose(f);
    return b;
}

/* Mean NLL (nats per token) of ids in windows of WIN tokens (each window's first token unscored). */
static double nll(sp_model *m, const int32_t *ids, int n, int max_windows, long *scored)
{
    int V = m->cfg.vocab;
    float *logits = malloc((size_t)WIN * V * sizeof(float));
    double sum = 0;
    *scored = 0;
    sp_err err = {0};
    for (int w = 0; w + 1 < n && (max_windows <= 0 || w / WIN < max_windows); w += WIN) {
        int T = n - w < WIN ? n - w : WIN;
        if (T < 2 || sp_model_forward(m, logits, ids + w, 1, T, 0, NULL, 0, &err))
            break;
        for (int t = 0; t + 1 < T; t++) {
            const float *l = logits + (size_t)t * V;
            float mx = l[0];
            for (int v = 1; v < V; v++)
                mx = l[v] > mx ? l[v] : mx;
            double z = 0;
            for (int v = 0; v < V; v++)
                z += exp((double)l[v] - mx);
            sum += log(z) + mx - l[ids[w + t + 1]];
            (*scored)++;
        }
    }
    free(logits);
    return *scored ? sum / *scored : NAN;
}

static int32_t *encode(const sp_tokenizer *tok, const char *text, int *n)
{
    int *raw = NULL;
    sp_err err = {0};
    if (sp_tokenizer_encode(tok, text, 1, &raw, n, &err))
        return NULL;
    int32_t *ids = malloc((size_t)*n * sizeof *ids);
    for (int i = 0; ids && i < *n; i++)
        ids[i] = raw[i];
    free(raw);
    return ids;
}

int main(int argc, char **argv)
{
    static char model[4096], data[4096], golden[4096];
    const char *home = getenv("HOME");
    snprintf(model, sizeof model, "%s/.cache/sepal/models/stories15M", home ? home : ".");
    snprintf(data, sizeof data, "%s/.cache/sepal/sentiment", home ? home : ".");
    snprintf(golden, sizeof golden, "%s", SEPAL_GOLDEN_JSONL);
    int max_windows = 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--data") && i + 1 < argc)
            snprintf(data, sizeof data, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--golden") && i + 1 < argc)
            snprintf(golden, sizeof golden, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--windows") && i + 1 < argc)
            max_windows = atoi(argv[++i]);
        else if (argv[i][0] != '-')
            snprintf(model, sizeof model, "%s", argv[i]);
        else
            return fprintf(stderr, "usage: bench_quality [MODEL_DIR] [--data DIR] [--golden FILE] [--windows N]\n"), 2;
    }
    sp_err err = {0};
    sp_tokenizer *tok = NULL;
    if (sp_tokenizer_load(&tok, model, &err))
        return fprintf(stderr, "bench_quality: %s\n", err.msg), 1;
    /* the texts */
    char path[4200];
    snprintf(path, sizeof path, "%s/imdb.json", data);
    char *raw = slurp(path);
    cJSON *arr = raw ? cJSON_Parse(raw) : NULL;
    size_t cap = 1 << 20, len = 0;
    char *imdb = malloc(cap);
    imdb[0] = 0;
    for (const cJSON *e = cJSON_IsArray(arr) ? arr->child : NULL; e; e = e->next) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "text");
        if (cJSON_IsString(t) && len + strlen(t->valuestring) + 2 < cap)
            len += (size_t)snprintf(imdb + len, cap - len, "%s ", t->valuestring);
    }
    cJSON_Delete(arr);
    free(raw);
    char *gold = slurp(golden);
    size_t gcap = 1 << 16, glen = 0;
    char *stories = calloc(1, gcap);
    char *prompts[8];
    int nprompt = 0;
    for (char *save = NULL, *l = gold ? strtok_r(gold, "\n", &save) : NULL; l; l = strtok_r(NULL, "\n", &save)) {
        cJSON *o = cJSON_Parse(l);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "text"), *p = cJSON_GetObjectItemCaseSensitive(o, "prompt");
        if (cJSON_IsString(t) && glen + strlen(t->valuestring) + 2 < gcap)
            glen += (size_t)snprintf(stories + glen, gcap - glen, "%s\n", t->valuestring);
        if (cJSON_IsString(p) && nprompt < 8)
            prompts[nprompt++] = strdup(p->valuestring);
        cJSON_Delete(o);
    }
    free(gold);
    if (!len || !glen)
        return fprintf(stderr, "bench_quality: no text (%s, %s): fetch the sentiment data, or give --data\n", path,
                       golden), 1;
    int n1, n2;
    int32_t *ids1 = encode(tok, imdb, &n1), *ids2 = encode(tok, stories, &n2);
    printf("bench_quality: stories15M, windows of %d tokens; imdb text: %d tokens (first %d windows), golden stories: "
           "%d tokens\n",
           WIN, n1, max_windows, n2);
    double base1 = 0, base2 = 0;
    int32_t *base_gen[8] = {0};
    int base_n[8] = {0};
    for (int t = 0; t < SP_W__COUNT; t++) {
        sp_model *m = NULL;
        if (sp_model_load(&m, model, SP_LOAD_ALL, 0, -1, &err))
            return fprintf(stderr, "bench_quality: %s\n", err.msg), 1;
        size_t bytes = 0;
        for (int b = 0; b < m->cfg.n_layers; b++) {
            if (sp_block_quantize(&m->blocks[b], (sp_wtype)t, &err))
                return fprintf(stderr, "bench_quality: %s\n", err.msg), 1;
            bytes += sp_block_bytes(&m->blocks[b]);
        }
        long s1, s2;
        double a = nll(m, ids1, n1, max_windows, &s1), b = nll(m, ids2, n2, 0, &s2);
        if (t == SP_W_F32)
            base1 = a, base2 = b;
        /* greedy continuations of the golden prompts */
        int same = 0, total = 0;
        char agree[128] = "";
        size_t al = 0;
        for (int k = 0; k < nprompt; k++) {
            int np;
            int32_t *pid = encode(tok, prompts[k], &np);
            sp_lm_local loc;
            sp_lm lm = sp_lm_local_make(&loc, m);
            sp_gen_opts o;
            sp_gen_opts_default(&o);
            o.max_new = 100;
            o.eos_id = m->cfg.eos_id;
            o.bos_id = m->cfg.bos_id;
            sp_gen_result r;
            const int32_t *pp = pid;
            if (pid && !sp_generate(&lm, NULL, &pp, &np, 1, &o, NULL, NULL, &r, &err)) {
                if (t == SP_W_F32) {
                    base_gen[k] = malloc((size_t)r.n[0] * sizeof(int32_t));
                    memcpy(base_gen[k], r.ids[0], (size_t)r.n[0] * sizeof(int32_t));
                    base_n[k] = r.n[0];
                }
                same += r.n[0] == base_n[k] && !memcmp(r.ids[0], base_gen[k], (size_t)r.n[0] * sizeof(int32_t));
                int d = 0; /* tokens equal to f32's before the first difference */
                while (d < r.n[0] && d < base_n[k] && r.ids[0][d] == base_gen[k][d])
                    d++;
                if (al < sizeof agree)
                    al += (size_t)snprintf(agree + al, sizeof agree - al, "%s%d", k ? "," : "", d);
                total++;
                sp_gen_result_free(&r);
            }
            free(pid);
        }
        printf("  %-5s blocks %5.1f MB: NLL imdb %.4f (%+.2f%%), stories %.4f (%+.2f%%); greedy texts as f32: %d of %d "
               "(tokens equal before the first difference: %s of 100)\n",
               sp_wtype_name((sp_wtype)t), bytes / 1e6, a, 100 * (a - base1) / base1, b, 100 * (b - base2) / base2,
               same, total, agree);
        sp_model_free(m);
    }
    printf("  goals: int8 within 1%% of f32's NLL, nf4 within 8%%\n");
    for (int k = 0; k < nprompt; k++)
        free(prompts[k]), free(base_gen[k]);
    free(ids1), free(ids2), free(imdb), free(stories);
    sp_tokenizer_free(tok);
    return 0;
}
