/* sst2.c - the shipped sentiment classification task (2 classes) on the UCI "Sentiment Labelled Sentences"
 * (Kotzias et al. 2015) as packaged in the npm package sentiment@5.0.2 (test/fixtures/{amazon,yelp,imdb}.json,
 * fetched by scripts/fetch-sentiment.sh). train = amazon + yelp (2000 sentences), validation = imdb (1000).
 *
 * Args: "data=DIR" (default ${SEPAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sepal}/sentiment).
 * Each file is a JSON array of {"text": "...", "class": 0|1} ending with one {"text": "", "class": null}
 * that is skipped; texts lose their surrounding whitespace. Batches are right-padded to the longest row;
 * last[] is each row's last real token (the pooled one). Built as a plugin (exports sepal_plugin_task and
 * sepal_plugin_check_args) or, with SEPAL_PLUGIN_BUILTIN defined, compiled into the host (sp_sst2_task() and
 * sp_sst2_check_args() only). */
#include "sepal/plugin.h"

#include <cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define NUM_LABELS 2

typedef struct {
    char **text;
    int32_t *label;
    int n, cap;
} split_data;

typedef struct {
    sepal_host host;
    split_data split[2];
    int32_t *ids, *last, *labels; /* the current batch */
    size_t ids_cap;
    int rows_cap;
    int32_t *tok; /* encode scratch */
    size_t tok_cap;
    long long correct, seen;
} sst2;

/* ---- arguments ---------------------------------------------------------------------------------------- */

/* Parses "data=DIR" (space-separated key=value words) into dir; 1 = given, 0 = absent, -1 = an unknown or
 * malformed argument (named in err). */
static int parse_args(const char *args, char *dir, size_t cap, char *err, size_t errcap)
{
    int found = 0;
    const char *p = args ? args : "";
    while (*p) {
        while (isspace((unsigned char)*p))
            p++;
        size_t len = strcspn(p, " \t\r\n");
        if (!len)
            break;
        char tok[4096];
        snprintf(tok, sizeof tok, "%.*s", (int)len, p);
        p += len;
        if (strncmp(tok, "data=", 5) != 0 || !tok[5]) {
            sepal_set_err(err, errcap, "sst2: unknown argument %s (it takes data=DIR)", tok);
            return -1;
        }
        snprintf(dir, cap, "%s", tok + 5);
        found = 1;
    }
    return found;
}

static void default_dir(char *dir, size_t cap)
{
    const char *c = getenv("SEPAL_CACHE"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    if (c && c[0] == '~' && (c[1] == '/' || !c[1]) && h && *h) /* "~/..." as a shell would read it */
        snprintf(dir, cap, "%s%s/sentiment", h, c + 1);
    else if (c && *c)
        snprintf(dir, cap, "%s/sentiment", c);
    else if (x && *x)
        snprintf(dir, cap, "%s/sepal/sentiment", x);
    else
        snprintf(dir, cap, "%s/.cache/sepal/sentiment", h && *h ? h : "/tmp");
}

/* ---- data --------------------------------------------------------------------------------------------- */

static char *read_file(const char *path, char *err, size_t cap)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        sepal_set_err(err, cap, "sst2: cannot read %s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t n = 0, got;
    char chunk[65536];
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) {
        char *nb = realloc(buf, n + got + 1);
        if (!nb) {
            free(buf);
            fclose(f);
            sepal_set_err(err, cap, "sst2: out of memory reading %s", path);
            return NULL;
        }
        buf = nb;
        memcpy(buf + n, chunk, got);
        n += got;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad || !buf) {
        free(buf);
        sepal_set_err(err, cap, "sst2: cannot read %s: %s", path, bad ? "read error" : "empty file");
        return NULL;
    }
    buf[n] = 0;
    return buf;
}

/* A copy of s without its surrounding whitespace. */
static char *strip_dup(const char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        n--;
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

static int split_push(split_data *s, char *text, int label)
{
    if (s->n == s->cap) {
        int nc = s->cap ? 2 * s->cap : 1024;
        char **t = realloc(s->text, (size_t)nc * sizeof *t);
        if (!t)
            return -1;
        s->text = t;
        int32_t *l = realloc(s->label, (size_t)nc * sizeof *l);
        if (!l)
            return -1;
        s->label = l;
        s->cap = nc;
    }
    s->text[s->n] = text;
    s->label[s->n++] = label;
    return 0;
}

/* Adds one {"text", "class"} entry (index i of path); 0 = ok or skipped, -1 = error. */
static int add_entry(split_data *s, const cJSON *e, int i, const char *path, char *err, size_t cap)
{
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(e, "text");
    const cJSON *cls = cJSON_GetObjectItemCaseSensitive(e, "class");
    if (!cJSON_IsString(text)) {
        sepal_set_err(err, cap, "sst2: %s: entry %d has no text", path, i);
        return -1;
    }
    char *t = strip_dup(text->valuestring);
    if (!t) {
        sepal_set_err(err, cap, "sst2: %s: out of memory at entry %d", path, i);
        return -1;
    }
    if (!*t && (!cls || cJSON_IsNull(cls))) { /* the trailing empty entry */
        free(t);
        return 0;
    }
    if (!*t || !cJSON_IsNumber(cls) || (cls->valuedouble != 0 && cls->valuedouble != 1)) {
        free(t);
        sepal_set_err(err, cap, "sst2: %s: entry %d needs a non-empty text and class 0 or 1", path, i);
        return -1;
    }
    if (split_push(s, t, (int)cls->valuedouble) != 0) {
        free(t);
        sepal_set_err(err, cap, "sst2: %s: out of memory at entry %d", path, i);
        return -1;
    }
    return 0;
}

static int load_file(split_data *s, const char *dir, const char *name, char *err, size_t cap)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat sb;
    if (stat(path, &sb) != 0 && errno == ENOENT) {
        sepal_set_err(err, cap, "no sentiment data in %s: run scripts/fetch-sentiment.sh", dir);
        return -1;
    }
    char *json = read_file(path, err, cap);
    if (!json)
        return -1;
    cJSON *root = cJSON_Parse(json);
    free(json);
    if (!cJSON_IsArray(root)) {
        cJSON_Delete(root);
        sepal_set_err(err, cap, "sst2: %s is not a JSON array of {\"text\", \"class\"}", path);
        return -1;
    }
    int i = 0, rc = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, root)
    {
        if ((rc = add_entry(s, e, i++, path, err, cap)) != 0)
            break;
    }
    cJSON_Delete(root);
    return rc;
}

/* ---- the task ----------------------------------------------------------------------------------------- */

static void free_split(split_data *s)
{
    for (int i = 0; i < s->n; i++)
        free(s->text[i]);
    free(s->text);
    free(s->label);
}

static void sst2_close(void *tp)
{
    sst2 *t = tp;
    if (!t)
        return;
    free_split(&t->split[0]);
    free_split(&t->split[1]);
    free(t->ids);
    free(t->last);
    free(t->labels);
    free(t->tok);
    free(t);
}

/* The data directory args name (data=DIR, else the default), which must be there; 0, or -1 (err set). */
static int data_dir(const char *args, char *dir, size_t dircap, char *err, size_t cap)
{
    int r = parse_args(args, dir, dircap, err, cap);
    if (r < 0)
        return -1;
    if (r == 0)
        default_dir(dir, dircap);
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        sepal_set_err(err, cap, "no sentiment data in %s: run scripts/fetch-sentiment.sh", dir);
        return -1;
    }
    return 0;
}

/* The arguments alone, before anything is loaded (sepal_plugin_check_args). */
static int sst2_check_args(const char *args, char *err, size_t cap)
{
    char dir[4096];
    return data_dir(args, dir, sizeof dir, err, cap);
}

static void *sst2_open(const sepal_host *host, const char *args, char *err, size_t cap)
{
    char dir[4096];
    if (data_dir(args, dir, sizeof dir, err, cap) != 0)
        return NULL;
    if (!host || !host->encode) {
        sepal_set_err(err, cap, "sst2: the host offers no tokenizer");
        return NULL;
    }
    sst2 *t = calloc(1, sizeof *t);
    if (!t) {
        sepal_set_err(err, cap, "sst2: out of memory");
        return NULL;
    }
    t->host = *host;
    if (load_file(&t->split[SEPAL_SPLIT_TRAIN], dir, "amazon.json", err, cap) != 0 ||
        load_file(&t->split[SEPAL_SPLIT_TRAIN], dir, "yelp.json", err, cap) != 0 ||
        load_file(&t->split[SEPAL_SPLIT_VALID], dir, "imdb.json", err, cap) != 0) {
        sst2_close(t);
        return NULL;
    }
    return t;
}

static int sst2_size(void *tp, int split)
{
    sst2 *t = tp;
    return split == SEPAL_SPLIT_TRAIN || split == SEPAL_SPLIT_VALID ? t->split[split].n : -1;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    void *np = realloc(*p, need * elem);
    if (!np)
        return -1;
    *p = np;
    *cap = need;
    return 0;
}

static int reserve(sst2 *t, int n, int max_length)
{
    size_t rows = (size_t)t->rows_cap;
    if (n > t->rows_cap) {
        void *last = t->last, *labels = t->labels;
        size_t c1 = rows, c2 = rows;
        int rc = grow(&last, &c1, (size_t)n, sizeof(int32_t));
        t->last = last;
        rc |= grow(&labels, &c2, (size_t)n, sizeof(int32_t));
        t->labels = labels;
        if (rc)
            return -1;
        t->rows_cap = n;
    }
    void *ids = t->ids;
    int rc = grow(&ids, &t->ids_cap, (size_t)n * (size_t)max_length, sizeof(int32_t));
    t->ids = ids;
    return rc;
}

/* Tokenizes text into dst[0..max_length); returns the count (>= 1), -1 on error. */
static int encode_row(sst2 *t, const char *text, int32_t *dst, int max_length)
{
    size_t need = strlen(text) + 8;
    if (need < (size_t)max_length)
        need = (size_t)max_length;
    if (need > 0x7fffffff)
        return -1;
    void *tok = t->tok;
    int rc = grow(&tok, &t->tok_cap, need, sizeof(int32_t));
    t->tok = tok;
    if (rc)
        return -1;
    int n = t->host.encode(t->host.ctx, text, t->tok, (int)need);
    if (n <= 0)
        return -1;
    if (n > max_length)
        n = max_length;
    memcpy(dst, t->tok, (size_t)n * sizeof *dst);
    return n;
}

static int32_t pad_id(const sepal_host *h)
{
    return h->pad_id >= 0 ? h->pad_id : h->eos_id >= 0 ? h->eos_id : 0;
}

/* Rows were encoded at stride max_length with their lengths in last[]; packs them at stride T, pads. */
static void pack_rows(sst2 *t, int n, int max_length, int T)
{
    int32_t pad = pad_id(&t->host);
    for (int r = 0; r < n; r++) {
        int len = t->last[r];
        memmove(t->ids + (size_t)r * T, t->ids + (size_t)r * max_length, (size_t)len * sizeof *t->ids);
        for (int j = len; j < T; j++)
            t->ids[(size_t)r * T + j] = pad;
        t->last[r] = len - 1;
    }
}

static int check_batch_args(sst2 *t, int split, const int *idx, int n, int max_length, char *err, size_t cap)
{
    if (split != SEPAL_SPLIT_TRAIN && split != SEPAL_SPLIT_VALID) {
        sepal_set_err(err, cap, "sst2: no such split");
        return -1;
    }
    if (n < 1 || max_length < 1 || !idx) {
        sepal_set_err(err, cap, "sst2: a batch needs at least one example and max_length >= 1");
        return -1;
    }
    for (int r = 0; r < n; r++) {
        if (idx[r] < 0 || idx[r] >= t->split[split].n) {
            sepal_set_err(err, cap, "sst2: example %d is out of range (the split has %d)", idx[r], t->split[split].n);
            return -1;
        }
    }
    return 0;
}

static int sst2_batch(void *tp, int split, const int *idx, int n, int max_length, sepal_batch *out, char *err,
                      size_t cap)
{
    sst2 *t = tp;
    if (check_batch_args(t, split, idx, n, max_length, err, cap) != 0)
        return -1;
    if (reserve(t, n, max_length) != 0) {
        sepal_set_err(err, cap, "sst2: out of memory building a batch");
        return -1;
    }
    const split_data *s = &t->split[split];
    int T = 1;
    for (int r = 0; r < n; r++) {
        int len = encode_row(t, s->text[idx[r]], t->ids + (size_t)r * max_length, max_length);
        if (len < 0) {
            sepal_set_err(err, cap, "sst2: cannot tokenize \"%.200s\"", s->text[idx[r]]);
            return -1;
        }
        t->last[r] = len;
        t->labels[r] = s->label[idx[r]];
        T = len > T ? len : T;
    }
    pack_rows(t, n, max_length, T);
    *out = (sepal_batch){.B = n, .T = T, .ids = t->ids, .last = t->last, .labels = t->labels};
    return 0;
}

/* ---- metrics ------------------------------------------------------------------------------------------ */

static void sst2_metrics_reset(void *tp)
{
    sst2 *t = tp;
    t->correct = t->seen = 0;
}

static void sst2_metrics_add(void *tp, const float *logits, const sepal_batch *b)
{
    sst2 *t = tp;
    if (!logits || !b || !b->labels)
        return;
    for (int r = 0; r < b->B; r++) {
        const float *row = logits + (size_t)r * NUM_LABELS;
        int best = 0;
        for (int c = 1; c < NUM_LABELS; c++)
            if (row[c] > row[best])
                best = c;
        t->correct += best == b->labels[r];
        t->seen++;
    }
}

static int sst2_metrics_get(void *tp, char *out, size_t cap)
{
    sst2 *t = tp;
    int n;
    if (t->seen)
        n = snprintf(out, cap, "accuracy=%.4f n=%lld", (double)t->correct / (double)t->seen, t->seen);
    else
        n = snprintf(out, cap, "accuracy=n/a n=0");
    return n >= 0 && (size_t)n < cap ? 0 : -1;
}

static const sepal_task task = {
    .abi = SEPAL_PLUGIN_ABI,
    .name = "sst2",
    .description = "sentiment classification (negative/positive) on the UCI Sentiment Labelled Sentences: "
                   "train amazon+yelp (2000), validation imdb (1000); args: data=DIR",
    .num_labels = NUM_LABELS,
    .multi_label = 0,
    .open = sst2_open,
    .close = sst2_close,
    .size = sst2_size,
    .batch = sst2_batch,
    .loss = NULL, /* the host's cross-entropy over [B, 2] */
    .metrics_reset = sst2_metrics_reset,
    .metrics_add = sst2_metrics_add,
    .metrics_get = sst2_metrics_get,
};

SEPAL_PLUGIN_TASK(task, sp_sst2_task)
SEPAL_PLUGIN_CHECK_ARGS(sst2_check_args, sp_sst2_check_args)
