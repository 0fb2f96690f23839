/* causal_lm.c - the shipped causal language-modelling task: prompt tuning on a text file.
 *
 * Args: "file=PATH [length=N] [stride=N] [valid=F]". The whole file is tokenized once (a BOS the tokenizer
 * puts first is dropped) and cut into chunks of `length` tokens (default 128), each starting with BOS when
 * the model has one (bos_id >= 0). Chunks start every `stride` text tokens (default: length, minus one for
 * the BOS: no overlap); with a smaller stride they overlap and the tokens an earlier chunk already predicted
 * get no loss again (target -1), as in sliding-window perplexity. The last `valid` fraction of the chunks
 * (default 0.1; at least one when there are two or more chunks and valid > 0) is the validation split.
 * A batch row is a chunk truncated to max_length; targets[t] = ids[t + 1], -1 at the row's last token and on
 * the padding. Metrics: mean loss (nats per target token) and perplexity from the logits [B, T, V].
 * Built as a plugin (exports sepal_plugin_task and sepal_plugin_check_args) or, with SEPAL_PLUGIN_BUILTIN,
 * compiled into the host. */
#include "sepal/plugin.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define DEFAULT_LENGTH 128

typedef struct {
    size_t start; /* in tokens[] */
    int clen;     /* text tokens in the chunk (the row has has_bos more) */
    int skip;     /* leading targets already predicted by the previous chunk */
} chunk;

typedef struct {
    char file[4096];
    int length, stride; /* stride 0: the default */
    double valid;
} options;

typedef struct {
    sepal_host host;
    int32_t *tokens; /* the file's tokens, without BOS */
    size_t ntok;
    int has_bos;
    chunk *chunks;
    int nchunks, ntrain;
    int32_t *ids, *last, *targets; /* the current batch */
    size_t cells_cap;
    int rows_cap;
    double loss_sum;
    long long counted;
} clm;

/* ---- arguments ---------------------------------------------------------------------------------------- */

static int parse_int(const char *v, int lo, int *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > INT_MAX)
        return -1;
    *out = (int)x;
    return 0;
}

/* Applies one "key=value" word; 0 = ok, -1 = error (in err). */
static int apply_arg(options *o, const char *word, char *err, size_t cap)
{
    const char *eq = strchr(word, '=');
    const char *v = eq ? eq + 1 : "";
    size_t klen = eq ? (size_t)(eq - word) : strlen(word);
    char *end;
    if (klen == 4 && !strncmp(word, "file", 4) && *v) {
        snprintf(o->file, sizeof o->file, "%s", v);
        return 0;
    }
    if (klen == 6 && !strncmp(word, "length", 6) && parse_int(v, 2, &o->length) == 0)
        return 0;
    if (klen == 6 && !strncmp(word, "stride", 6) && parse_int(v, 1, &o->stride) == 0)
        return 0;
    if (klen == 5 && !strncmp(word, "valid", 5)) {
        o->valid = strtod(v, &end);
        if (*v && !*end && o->valid >= 0 && o->valid < 1)
            return 0;
    }
    sepal_set_err(err, cap,
                  "causal_lm: bad argument %s (it takes file=PATH, length=N >= 2, stride=N >= 1, valid=F in [0, 1))",
                  word);
    return -1;
}

static int parse_args(const char *args, options *o, char *err, size_t cap)
{
    *o = (options){.length = DEFAULT_LENGTH, .valid = 0.1};
    const char *p = args ? args : "";
    for (;;) {
        while (isspace((unsigned char)*p))
            p++;
        size_t len = strcspn(p, " \t\r\n");
        if (!len)
            break;
        char word[4200];
        snprintf(word, sizeof word, "%.*s", (int)len, p);
        p += len;
        if (apply_arg(o, word, err, cap) != 0)
            return -1;
    }
    if (!o->file[0]) {
        sepal_set_err(err, cap, "causal_lm: no text file: pass file=PATH");
        return -1;
    }
    return 0;
}

/* ---- tokenizing the file ------------------------------------------------------------------------------ */

/* The text file at path, open for reading; NULL (err set) when it cannot be read or is a directory. */
static FILE *open_text(const char *path, char *err, size_t cap)
{
    FILE *f = fopen(path, "rb");
    struct stat sb;
    if (f && fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fclose(f);
        f = NULL;
        errno = EISDIR;
    }
    if (!f)
        sepal_set_err(err, cap, "causal_lm: cannot read %s: %s", path, strerror(errno));
    return f;
}

static char *read_text(const char *path, size_t *n, char *err, size_t cap)
{
    FILE *f = open_text(path, err, cap);
    if (!f)
        return NULL;
    char *buf = NULL, part[65536];
    size_t len = 0, got;
    int rc = 0;
    while (rc == 0 && (got = fread(part, 1, sizeof part, f)) > 0) {
        char *nb = len + got < (size_t)INT_MAX / 2 ? realloc(buf, len + got + 1) : NULL;
        if (!nb) {
            rc = -1;
            sepal_set_err(err, cap, "causal_lm: %s is too large", path);
            break;
        }
        buf = nb;
        memcpy(buf + len, part, got);
        len += got;
    }
    if (rc == 0 && ferror(f)) {
        rc = -1;
        sepal_set_err(err, cap, "causal_lm: cannot read %s", path);
    }
    fclose(f);
    if (rc == 0 && len == 0) {
        rc = -1;
        sepal_set_err(err, cap, "causal_lm: %s is empty", path);
    }
    if (rc != 0) {
        free(buf);
        return NULL;
    }
    buf[len] = 0;
    *n = len;
    return buf;
}

/* Tokenizes text (n bytes) into t->tokens, dropping a leading BOS. 0 = ok. */
static int tokenize(clm *t, const char *text, size_t n, const char *path, char *err, size_t cap)
{
    if (strlen(text) != n) {
        sepal_set_err(err, cap, "causal_lm: %s contains a NUL byte: not a text file", path);
        return -1;
    }
    int want = (int)n + 8, got = -1;
    for (int tries = 0; tries < 2; tries++) {
        int32_t *ids = realloc(t->tokens, (size_t)want * sizeof *ids);
        if (!ids)
            break;
        t->tokens = ids;
        got = t->host.encode(t->host.ctx, text, ids, want);
        if (got <= want)
            break;
        want = got; /* the encoder reported the count it needed */
    }
    if (got < 0 || got > want) {
        sepal_set_err(err, cap, "causal_lm: cannot tokenize %s", path);
        return -1;
    }
    size_t off = got > 0 && t->host.bos_id >= 0 && t->tokens[0] == t->host.bos_id;
    memmove(t->tokens, t->tokens + off, ((size_t)got - off) * sizeof *t->tokens);
    t->ntok = (size_t)got - off;
    return 0;
}

/* ---- chunks ------------------------------------------------------------------------------------------- */

static int add_chunk(clm *t, int *cap, size_t start, int clen, size_t prev_end)
{
    if (t->has_bos + clen < 2)
        return 0; /* nothing to predict */
    if (t->nchunks == *cap) {
        int nc = *cap ? 2 * *cap : 64;
        chunk *c = realloc(t->chunks, (size_t)nc * sizeof *c);
        if (!c)
            return -1;
        t->chunks = c;
        *cap = nc;
    }
    long skip = (long)prev_end - (long)start + t->has_bos - 1;
    t->chunks[t->nchunks++] = (chunk){.start = start, .clen = clen, .skip = skip > 0 ? (int)skip : 0};
    return 0;
}

static int make_chunks(clm *t, const options *o, char *err, size_t cap)
{
    int C = o->length - t->has_bos, stride = o->stride ? o->stride : C, ccap = 0;
    if (stride > C) {
        sepal_set_err(err, cap, "causal_lm: stride=%d is more than the %d text tokens of a chunk", stride, C);
        return -1;
    }
    size_t prev_end = 0;
    for (size_t s = 0; s < t->ntok; s += (size_t)stride) {
        size_t left = t->ntok - s;
        int clen = left < (size_t)C ? (int)left : C;
        if (add_chunk(t, &ccap, s, clen, prev_end) != 0) {
            sepal_set_err(err, cap, "causal_lm: out of memory");
            return -1;
        }
        prev_end = s + (size_t)clen;
        if (left <= (size_t)C)
            break;
    }
    if (t->nchunks == 0) {
        sepal_set_err(err, cap, "causal_lm: %s has too little text (%zu tokens)", o->file, t->ntok);
        return -1;
    }
    return 0;
}

static int split_valid(int nchunks, double valid)
{
    if (nchunks < 2 || valid <= 0)
        return 0;
    int nv = (int)floor(nchunks * valid + 0.5);
    if (nv < 1)
        nv = 1;
    return nv > nchunks - 1 ? nchunks - 1 : nv;
}

/* ---- the task ----------------------------------------------------------------------------------------- */

static void clm_close(void *tp)
{
    clm *t = tp;
    if (!t)
        return;
    free(t->tokens);
    free(t->chunks);
    free(t->ids);
    free(t->last);
    free(t->targets);
    free(t);
}

static int load(clm *t, const options *o, char *err, size_t cap)
{
    size_t n = 0;
    char *text = read_text(o->file, &n, err, cap);
    if (!text)
        return -1;
    int rc = tokenize(t, text, n, o->file, err, cap);
    free(text);
    if (rc == 0)
        rc = make_chunks(t, o, err, cap);
    if (rc == 0)
        t->ntrain = t->nchunks - split_valid(t->nchunks, o->valid);
    return rc;
}

static void *clm_open(const sepal_host *host, const char *args, char *err, size_t cap)
{
    options o;
    if (parse_args(args, &o, err, cap) != 0)
        return NULL;
    if (!host || !host->encode) {
        sepal_set_err(err, cap, "causal_lm: the host offers no tokenizer");
        return NULL;
    }
    clm *t = calloc(1, sizeof *t);
    if (!t) {
        sepal_set_err(err, cap, "causal_lm: out of memory");
        return NULL;
    }
    t->host = *host;
    t->has_bos = host->bos_id >= 0;
    if (load(t, &o, err, cap) != 0) {
        clm_close(t);
        return NULL;
    }
    return t;
}

static int clm_size(void *tp, int split)
{
    clm *t = tp;
    if (split == SEPAL_SPLIT_TRAIN)
        return t->ntrain;
    return split == SEPAL_SPLIT_VALID ? t->nchunks - t->ntrain : -1;
}

static int reserve(clm *t, int n, int T)
{
    if (n > t->rows_cap) {
        int32_t *last = realloc(t->last, (size_t)n * sizeof *last);
        if (!last)
            return -1;
        t->last = last;
        t->rows_cap = n;
    }
    size_t cells = (size_t)n * (size_t)T;
    if (cells > t->cells_cap) {
        int32_t *ids = realloc(t->ids, cells * sizeof *ids);
        if (ids)
            t->ids = ids;
        int32_t *tg = realloc(t->targets, cells * sizeof *tg);
        if (tg)
            t->targets = tg;
        if (!ids || !tg)
            return -1;
        t->cells_cap = cells;
    }
    return 0;
}

static int32_t pad_id(const sepal_host *h)
{
    return h->pad_id >= 0 ? h->pad_id : h->eos_id >= 0 ? h->eos_id : 0;
}

/* Writes chunk c, truncated to max_length, as a row of width T; returns its length. */
static int fill_row(clm *t, const chunk *c, int max_length, int T, int32_t *ids, int32_t *tg)
{
    int L = t->has_bos + c->clen, pad = pad_id(&t->host);
    L = L < max_length ? L : max_length;
    for (int j = 0; j < L; j++)
        ids[j] = t->has_bos && j == 0 ? t->host.bos_id : t->tokens[c->start + (size_t)(j - t->has_bos)];
    for (int j = L; j < T; j++)
        ids[j] = pad;
    for (int j = 0; j < T; j++)
        tg[j] = j + 1 < L && j >= c->skip ? ids[j + 1] : -1;
    return L;
}

static const chunk *chunk_of(clm *t, int split, int i)
{
    int base = split == SEPAL_SPLIT_TRAIN ? 0 : t->ntrain;
    return &t->chunks[base + i];
}

static int clm_batch(void *tp, int split, const int *idx, int n, int max_length, sepal_batch *out, char *err,
                     size_t cap)
{
    clm *t = tp;
    int size = clm_size(t, split);
    if (size < 0 || n < 1 || !idx || max_length < 1) {
        sepal_set_err(err, cap, "causal_lm: a batch needs a split, at least one example and max_length >= 1");
        return -1;
    }
    int T = 1;
    for (int r = 0; r < n; r++) {
        if (idx[r] < 0 || idx[r] >= size) {
            sepal_set_err(err, cap, "causal_lm: example %d is out of range (the split has %d)", idx[r], size);
            return -1;
        }
        int L = t->has_bos + chunk_of(t, split, idx[r])->clen;
        T = L > T ? L : T;
    }
    T = T < max_length ? T : max_length;
    if (reserve(t, n, T) != 0) {
        sepal_set_err(err, cap, "causal_lm: out of memory building a batch");
        return -1;
    }
    for (int r = 0; r < n; r++) {
        size_t off = (size_t)r * (size_t)T;
        t->last[r] = fill_row(t, chunk_of(t, split, idx[r]), max_length, T, t->ids + off, t->targets + off) - 1;
    }
    *out = (sepal_batch){.B = n, .T = T, .ids = t->ids, .last = t->last, .targets = t->targets};
    return 0;
}

/* ---- metrics ------------------------------------------------------------------------------------------ */

static void clm_metrics_reset(void *tp)
{
    clm *t = tp;
    t->loss_sum = 0;
    t->counted = 0;
}

/* -log softmax(row)[target] in double. */
static double nll(const float *row, int V, int target)
{
    double m = row[0];
    for (int v = 1; v < V; v++)
        m = row[v] > m ? row[v] : m;
    double s = 0;
    for (int v = 0; v < V; v++)
        s += exp((double)row[v] - m);
    return m + log(s) - (double)row[target];
}

static void clm_metrics_add(void *tp, const float *logits, const sepal_batch *b)
{
    clm *t = tp;
    int V = t->host.vocab;
    if (!logits || !b || !b->targets || V < 1)
        return;
    for (size_t i = 0; i < (size_t)b->B * (size_t)b->T; i++) {
        int32_t target = b->targets[i];
        if (target < 0 || target >= V)
            continue;
        t->loss_sum += nll(logits + i * (size_t)V, V, target);
        t->counted++;
    }
}

static int clm_metrics_get(void *tp, char *out, size_t cap)
{
    clm *t = tp;
    int n;
    if (t->counted) {
        double loss = t->loss_sum / (double)t->counted;
        n = snprintf(out, cap, "loss=%.4f perplexity=%.4f tokens=%lld", loss, exp(loss), t->counted);
    } else {
        n = snprintf(out, cap, "loss=n/a perplexity=n/a tokens=0");
    }
    return n >= 0 && (size_t)n < cap ? 0 : -1;
}

/* The arguments alone, before anything is loaded (sepal_plugin_check_args): valid, and the file there to read. */
static int clm_check_args(const char *args, char *err, size_t cap)
{
    options o;
    if (parse_args(args, &o, err, cap) != 0)
        return -1;
    FILE *f = open_text(o.file, err, cap);
    if (!f)
        return -1;
    fclose(f);
    return 0;
}

static const sepal_task task = {
    .abi = SEPAL_PLUGIN_ABI,
    .name = "causal_lm",
    .description = "causal language modelling on a text file (next-token loss, perplexity); "
                   "args: file=PATH [length=128] [stride=N] [valid=0.1]",
    .num_labels = 0,
    .multi_label = 0,
    .open = clm_open,
    .close = clm_close,
    .size = clm_size,
    .batch = clm_batch,
    .loss = NULL, /* the host's cross-entropy over targets */
    .metrics_reset = clm_metrics_reset,
    .metrics_add = clm_metrics_add,
    .metrics_get = clm_metrics_get,
};

SEPAL_PLUGIN_TASK(task, sp_causal_lm_task)
SEPAL_PLUGIN_CHECK_ARGS(clm_check_args, sp_causal_lm_check_args)
