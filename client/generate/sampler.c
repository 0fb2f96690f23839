/* sampler.c - token selection. Order of the transformations follows HF transformers' logits processors:
 * repetition penalty, temperature, top-k, top-p, then one draw. */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kern.h"

void sp_sample_opts_default(sp_sample_opts *o)
{
    memset(o, 0, sizeof *o);
    o->top_p = 1.0f;
    o->repetition_penalty = 1.0f;
}

int sp_sampler2_init(sp_sampler2 *s, const sp_sample_opts *o, int V)
{
    memset(s, 0, sizeof *s);
    s->o = *o;
    s->V = V;
    sp_rng_seed(&s->rng, o->seed);
    s->probs = malloc((size_t)V * sizeof *s->probs);
    s->idx = malloc((size_t)V * sizeof *s->idx);
    if (!s->probs || !s->idx) {
        sp_sampler2_free(s);
        return -1;
    }
    return 0;
}

void sp_sampler2_free(sp_sampler2 *s)
{
    free(s->probs);
    free(s->idx);
    s->probs = NULL;
    s->idx = NULL;
}

/* The penalty with seen[V] as scratch: a token seen twice is penalised once (its first occurrence clears its
 * mark, the pass after penalises it and sets the mark). Allocates nothing. */
static void penalize(float *logits, int V, const int32_t *context, int n, float penalty, int *seen)
{
    for (int i = 0; i < n; i++)
        if (context[i] >= 0 && context[i] < V)
            seen[context[i]] = 0;
    for (int i = 0; i < n; i++) {
        int c = context[i];
        if (c >= 0 && c < V && !seen[c]) {
            logits[c] = logits[c] > 0 ? logits[c] / penalty : logits[c] * penalty;
            seen[c] = 1;
        }
    }
}

void sp_repetition_penalty(float *logits, int V, const int32_t *context, int n, float penalty)
{
    if (penalty == 1.0f || n <= 0 || V <= 0)
        return;
    int *seen = malloc((size_t)V * sizeof *seen);
    if (!seen)
        return;
    penalize(logits, V, context, n, penalty, seen);
    free(seen);
}

static int argmax(const float *x, int V) { return sp_argmax(x, V); } /* the first maximum */

/* 1 if token a ranks below token b (lower probability, or equal and a higher id). */
static int ranks_below(const float *p, int a, int b)
{
    return p[a] < p[b] || (p[a] == p[b] && a > b);
}

/* Orders idx[0..n) by probability, descending (lower id first on ties): a heap sort in place, so that sampling
 * allocates nothing (glibc's qsort mallocs a buffer for arrays over 1 KiB). The order is total: the result is
 * the same as any sort's. */
static void sort_by_prob(const float *p, int *idx, int n)
{
    /* a heap whose root ranks lowest; moving each root to the end leaves the best first */
    for (int end = n, start = n / 2 - 1;;) {
        int root;
        if (start >= 0) {
            root = start--;
        } else {
            if (--end <= 0)
                break;
            int t = idx[0];
            idx[0] = idx[end];
            idx[end] = t;
            root = 0;
        }
        for (;;) { /* sift down */
            int l = 2 * root + 1, m = root;
            if (l < end && ranks_below(p, idx[l], idx[m]))
                m = l;
            if (l + 1 < end && ranks_below(p, idx[l + 1], idx[m]))
                m = l + 1;
            if (m == root)
                break;
            int t = idx[root];
            idx[root] = idx[m];
            idx[m] = t;
            root = m;
        }
    }
}

/* The k most probable tokens into idx[0..k) via a min-heap (O(V log k)); returns k. */
static int top_k_heap(const float *p, int V, int k, int *idx)
{
    int n = 0;
    for (int v = 0; v < V; v++) {
        if (n < k) { /* sift up */
            int i = n++;
            idx[i] = v;
            while (i > 0 && ranks_below(p, idx[i], idx[(i - 1) / 2])) {
                int t = idx[i];
                idx[i] = idx[(i - 1) / 2];
                idx[(i - 1) / 2] = t;
                i = (i - 1) / 2;
            }
        } else if (ranks_below(p, idx[0], v)) { /* replace the smallest, sift down */
            idx[0] = v;
            for (int i = 0;;) {
                int l = 2 * i + 1, r = l + 1, m = i;
                if (l < n && ranks_below(p, idx[l], idx[m]))
                    m = l;
                if (r < n && ranks_below(p, idx[r], idx[m]))
                    m = r;
                if (m == i)
                    break;
                int t = idx[i];
                idx[i] = idx[m];
                idx[m] = t;
                i = m;
            }
        }
    }
    return n;
}

/* The candidate tokens, most probable first: the top k, or for top-p alone the tokens at or above
 * (1 - p) / (V - 1) (no token below it can be in the nucleus: llama2.c's cutoff). Returns their count. */
static int candidates(sp_sampler2 *s, int *n_sorted)
{
    int V = s->V, n = 0;
    if (s->o.top_k > 0 && s->o.top_k < V) {
        n = top_k_heap(s->probs, V, s->o.top_k, s->idx);
    } else {
        float cutoff = (1.0f - s->o.top_p) / (float)(V - 1);
        for (int v = 0; v < V; v++)
            if (s->probs[v] >= cutoff)
                s->idx[n++] = v;
    }
    sort_by_prob(s->probs, s->idx, n);
    *n_sorted = n;
    return n;
}

static int draw(sp_sampler2 *s, const int *idx, int n)
{
    double mass = 0;
    for (int k = 0; k < n; k++)
        mass += s->probs[idx ? idx[k] : k];
    double r = sp_rng_f32(&s->rng) * mass, acc = 0;
    for (int k = 0; k < n; k++) {
        acc += s->probs[idx ? idx[k] : k];
        if (r < acc)
            return idx ? idx[k] : k;
    }
    return idx ? idx[n - 1] : n - 1;
}

int sp_sampler2_next(sp_sampler2 *s, float *logits, const int32_t *context, int n)
{
    int V = s->V;
    if (s->o.repetition_penalty != 1.0f && n > 0)
        penalize(logits, V, context, n, s->o.repetition_penalty, s->idx); /* idx is free until candidates() */
    if (s->o.temperature <= 0.0f)
        return argmax(logits, V);
    /* softmax at the temperature */
    float mx = logits[argmax(logits, V)];
    double sum = 0;
    for (int i = 0; i < V; i++) {
        s->probs[i] = expf((logits[i] - mx) / s->o.temperature);
        sum += s->probs[i];
    }
    for (int i = 0; i < V; i++)
        s->probs[i] = (float)(s->probs[i] / sum);
    int filtered = (s->o.top_k > 0 && s->o.top_k < V) || s->o.top_p < 1.0f;
    if (!filtered) /* plain temperature sampling needs no ordering */
        return draw(s, NULL, V);
    int keep, sorted;
    keep = candidates(s, &sorted);
    if (s->o.top_p < 1.0f) { /* the smallest prefix whose mass reaches top_p (at least one token) */
        double acc = 0;
        int k = 0;
        while (k < sorted && (k == 0 || acc < s->o.top_p))
            acc += s->probs[s->idx[k++]];
        keep = k;
    }
    return draw(s, s->idx, keep);
}

void sp_log_softmax(float *out, const float *logits, int V)
{
    float mx = logits[argmax(logits, V)];
    double sum = 0;
    for (int i = 0; i < V; i++)
        sum += exp((double)logits[i] - mx);
    float lse = (float)(log(sum) + mx);
    for (int i = 0; i < V; i++)
        out[i] = logits[i] - lse;
}
