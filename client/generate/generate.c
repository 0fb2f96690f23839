/* generate.c - generation loops over an sp_lm: one for sampling/greedy over a batch of prompts of any
 * lengths (every row advances one position per step; a row still inside its prompt is fed its next
 * prompt token, so no padding or masks are needed), and one for beam search. */
#include "generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "timeutil.h"

/* ---------------------------------------------------------------------------------------------- */
/* the local LM */

static sp_status local_begin(void *ctx, int B, int max_length, sp_err *err)
{
    sp_lm_local *l = ctx;
    l->pos = 0;
    sp_model_head_prepare(l->m); /* (the greedy head's screen: here, not in the prompt's time) */
    return sp_model_cache_init(&l->cache, l->m, B, max_length, err);
}

static sp_status local_forward(void *ctx, const int32_t *ids, int B, int T, float *logits, sp_err *err)
{
    sp_lm_local *l = ctx;
    sp_status st = sp_model_forward(l->m, logits, ids, B, T, l->pos, &l->cache, 1, err);
    if (!st)
        l->pos += T;
    return st;
}

static sp_status local_forward_argmax(void *ctx, const int32_t *ids, int B, int T, int32_t *best, sp_err *err)
{
    sp_lm_local *l = ctx;
    sp_status st = sp_model_forward_argmax(l->m, best, ids, B, T, l->pos, &l->cache, err);
    if (!st)
        l->pos += T;
    return st;
}

/* Permutes the batch rows of every block's cache. */
static sp_status local_reorder(void *ctx, const int64_t *src, int B, sp_err *err)
{
    sp_lm_local *l = ctx;
    (void)B;
    for (int i = 0; i < l->cache.nblocks; i++) {
        l->cache.kv[i].len = l->pos;
        sp_status st = sp_kv_reorder(&l->cache.kv[i], src, err);
        if (st)
            return st;
    }
    return SP_OK;
}

static sp_status local_rewind(void *ctx, int pos, sp_err *err)
{
    sp_lm_local *l = ctx;
    if (pos < 0 || pos > l->pos)
        return sp_errf(err, SP_ERR_ARG, "rewind to %d: only %d positions so far", pos, l->pos);
    l->pos = pos;
    sp_model_cache_rewind(&l->cache, pos);
    return SP_OK;
}

static void local_end(void *ctx)
{
    sp_model_cache_free(&((sp_lm_local *)ctx)->cache);
}

sp_lm sp_lm_local_make(sp_lm_local *l, sp_model *m)
{
    memset(l, 0, sizeof *l);
    l->m = m;
    return (sp_lm){.ctx = l, .vocab = m->cfg.vocab, .max_pos = m->cfg.max_pos, .begin = local_begin,
                   .forward = local_forward, .forward_argmax = local_forward_argmax, .reorder = local_reorder,
                   .rewind = local_rewind, .end = local_end};
}

/* ---------------------------------------------------------------------------------------------- */
/* results */

const char *sp_gen_stop_name(sp_gen_stop s)
{
    static const char *const names[] = {"length", "eos", "stop string", "stopped", "cancelled"};
    return (unsigned)s < sizeof names / sizeof *names ? names[s] : "?";
}

static int is_cancelled(const sp_gen_opts *o) { return o->cancel && __atomic_load_n(o->cancel, __ATOMIC_RELAXED); }

void sp_gen_opts_default(sp_gen_opts *o)
{
    memset(o, 0, sizeof *o);
    sp_sample_opts_default(&o->sample);
    o->max_new = 64;
    o->beams = 1;
    o->stop_at_eos = 1;
    o->eos_id = o->bos_id = -1;
}

void sp_gen_result_free(sp_gen_result *r)
{
    for (int i = 0; i < r->nrows; i++) {
        if (r->ids)
            free(r->ids[i]);
        if (r->text)
            free(r->text[i]);
    }
    free(r->ids);
    free(r->n);
    free(r->text);
    memset(r, 0, sizeof *r);
}

/* Bytes a row's text starts with: room for max_new tokens of a typical length, so that decoding rarely grows it
 * (it doubles when it must). */
static size_t text_cap_for(int max_new) { return (size_t)(max_new > 0 ? max_new : 0) * 8 + 64; }

static sp_status result_alloc(sp_gen_result *r, int n, int max_new, sp_err *err)
{
    memset(r, 0, sizeof *r);
    r->nrows = n;
    r->ids = calloc((size_t)n, sizeof *r->ids);
    r->n = calloc((size_t)n, sizeof *r->n);
    r->text = calloc((size_t)n, sizeof *r->text);
    int ok = r->ids && r->n && r->text;
    for (int i = 0; ok && i < n; i++) {
        r->ids[i] = malloc((size_t)(max_new > 0 ? max_new : 1) * sizeof **r->ids);
        r->text[i] = calloc(1, text_cap_for(max_new));
        ok = r->ids[i] && r->text[i];
    }
    if (!ok) {
        sp_gen_result_free(r);
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    }
    return SP_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* sampling / greedy over a batch */

typedef struct row_state {
    const int32_t *prompt;
    int len, pos;      /* prompt length, positions consumed */
    int done;
    int32_t *context;  /* prompt + generated, for the repetition penalty */
    int ncontext;
    sp_gen_stop reason;
    sp_detok detok;
    size_t textlen, textcap; /* the text's length, and the bytes its buffer holds */
} row_state;

/* Appends a piece to the row's text; returns 1 if a stop string now appears (the text is cut there). Only the
 * new end of the text is searched: what came before held no stop string. */
static int append_text(sp_gen_result *r, int row, row_state *rs, const char *piece, size_t n,
                       const char *const *stop)
{
    char *t = r->text[row];
    if (rs->textlen + n + 1 > rs->textcap) { /* geometric: a long text is copied a few times, not per token */
        size_t cap = rs->textcap * 2 > rs->textlen + n + 1 ? rs->textcap * 2 : rs->textlen + n + 1;
        if (!(t = realloc(t, cap)))
            return 1;
        r->text[row] = t;
        rs->textcap = cap;
    }
    size_t old = rs->textlen;
    memcpy(t + rs->textlen, piece, n);
    rs->textlen += n;
    t[rs->textlen] = '\0';
    for (int i = 0; stop && stop[i]; i++) {
        size_t k = strlen(stop[i]), from = old + 1 > k ? old + 1 - k : 0;
        char *hit = k ? strstr(t + from, stop[i]) : NULL;
        if (hit) {
            *hit = '\0';
            rs->textlen = (size_t)(hit - t);
            return 1;
        }
    }
    return 0;
}

/* Chooses row b's next input: its next prompt token, or a new token from its logits (chosen >= 0: the greedy
 * choice the LM made, sp_lm.forward_argmax). */
static int next_input(const sp_gen_opts *o, const sp_tokenizer *tok, sp_sampler2 *smp, float *logits, int chosen,
                      int b, row_state *rs, sp_gen_result *r, sp_gen_token_fn cb, void *user)
{
    if (rs->pos < rs->len)
        return rs->prompt[rs->pos];
    if (rs->done)
        return rs->context[rs->ncontext - 1]; /* a filler the row never reads */
    if (r->n[b] < o->min_new) { /* not yet: the ends cannot be chosen */
        if (o->eos_id >= 0 && o->eos_id < smp->V)
            logits[o->eos_id] = -INFINITY;
        if (o->bos_id >= 0 && o->bos_id < smp->V)
            logits[o->bos_id] = -INFINITY;
    }
    int tok_id = chosen >= 0 ? chosen : sp_sampler2_next(smp, logits, rs->context, rs->ncontext);
    if (o->stop_at_eos && (tok_id == o->eos_id || tok_id == o->bos_id)) {
        rs->done = 1;
        rs->reason = SP_GEN_STOP_EOS;
        return tok_id;
    }
    r->ids[b][r->n[b]++] = tok_id;
    if (b == 0 && r->n[0] == 1)
        r->first_token_s = sp_now_s(); /* absolute here; sp_generate makes it relative */
    rs->context[rs->ncontext++] = tok_id;
    char piece[SP_DETOK_BUF] = "";
    size_t np = tok ? sp_detok_push(&rs->detok, tok_id, piece, sizeof piece) : 0;
    if (tok && append_text(r, b, rs, piece, np, o->stop))
        rs->done = 1, rs->reason = SP_GEN_STOP_STRING;
    if (cb && cb(b, tok_id, tok ? piece : NULL, user) && !rs->done)
        rs->done = 1, rs->reason = SP_GEN_STOP_CALLBACK;
    if (r->n[b] >= o->max_new && !rs->done)
        rs->done = 1, rs->reason = SP_GEN_STOP_LENGTH;
    return tok_id;
}

/* 1 if the next choice of every row is the argmax of its logits alone: greedy without a repetition penalty,
 * and no row that still samples below min_new (its end tokens masked). */
static int argmax_suffices(const sp_lm *lm, const row_state *rs, int B, const sp_gen_opts *o, const sp_gen_result *r)
{
    if (!lm->forward_argmax || o->sample.temperature > 0.0f || o->sample.repetition_penalty != 1.0f)
        return 0;
    for (int b = 0; b < B; b++)
        if (rs[b].pos >= rs[b].len && !rs[b].done && r->n[b] < o->min_new)
            return 0;
    return 1;
}

static sp_status sample_loop(const sp_lm *lm, const sp_tokenizer *tok, row_state *rs, int B, int minlen,
                             const sp_gen_opts *o, sp_gen_token_fn cb, void *user, sp_gen_result *r, sp_err *err)
{
    int V = lm->vocab;
    float *logits = malloc((size_t)B * V * sizeof(float));
    int32_t *ids = malloc((size_t)B * (minlen > 0 ? minlen : 1) * sizeof(int32_t));
    int32_t *best = malloc((size_t)B * sizeof(int32_t));
    sp_sampler2 smp;
    sp_status st = logits && ids && best && !sp_sampler2_init(&smp, &o->sample, V)
                       ? SP_OK
                       : sp_errf(err, SP_ERR_NOMEM, "out of memory");
    for (int b = 0; !st && b < B; b++) /* prefill the common prefix */
        memcpy(ids + (size_t)b * minlen, rs[b].prompt, (size_t)minlen * sizeof(int32_t));
    double t0 = sp_now_s();
    int use_best = !st && argmax_suffices(lm, rs, B, o, r);
    if (!st)
        st = use_best ? lm->forward_argmax(lm->ctx, ids, B, minlen, best, err)
                      : lm->forward(lm->ctx, ids, B, minlen, logits, err);
    r->prefill_tokens = B * minlen;
    r->prefill_s = sp_now_s() - t0;
    while (!st) {
        if (is_cancelled(o)) {
            st = SP_ERR_CANCELLED;
            break;
        }
        int all_done = 1;
        for (int b = 0; b < B; b++) {
            int chosen = use_best ? best[b] : -1;
            ids[b] = next_input(o, tok, &smp, logits + (size_t)b * V, chosen, b, &rs[b], r, cb, user);
            rs[b].pos++;
            all_done &= rs[b].done && rs[b].pos >= rs[b].len;
        }
        if (all_done)
            break;
        use_best = argmax_suffices(lm, rs, B, o, r);
        st = use_best ? lm->forward_argmax(lm->ctx, ids, B, 1, best, err)
                      : lm->forward(lm->ctx, ids, B, 1, logits, err);
    }
    r->decode_s = sp_now_s() - t0 - r->prefill_s; /* to the last token chosen (before lm->end) */
    if (st == SP_ERR_CANCELLED) { /* what came so far stands */
        for (int b = 0; b < B; b++)
            if (!rs[b].done)
                rs[b].done = 1, rs[b].reason = SP_GEN_STOP_CANCELLED;
        st = SP_OK;
    }
    r->stop_reason = rs[0].reason;
    if (logits && ids && best)
        sp_sampler2_free(&smp);
    free(logits);
    free(ids);
    free(best);
    return st;
}

static sp_status generate_sampled(const sp_lm *lm, const sp_tokenizer *tok, const int32_t *const *prompts,
                                  const int *lens, int B, const sp_gen_opts *o, sp_gen_token_fn cb, void *user,
                                  sp_gen_result *r, sp_err *err)
{
    int minlen = lens[0], maxlen = lens[0];
    for (int b = 1; b < B; b++) {
        minlen = lens[b] < minlen ? lens[b] : minlen;
        maxlen = lens[b] > maxlen ? lens[b] : maxlen;
    }
    int max_length = maxlen + (o->max_new > 0 ? o->max_new - 1 : 0); /* the last new token is never fed */
    if (minlen <= 0)
        return sp_errf(err, SP_ERR_ARG, "empty prompt");
    if (max_length > lm->max_pos)
        return sp_errf(err, SP_ERR_RANGE, "%d prompt + %d new tokens exceed the model's context of %d", maxlen,
                       o->max_new, lm->max_pos);
    row_state *rs = calloc((size_t)B, sizeof *rs);
    sp_status st = rs ? lm->begin(lm->ctx, B, max_length, err) : sp_errf(err, SP_ERR_NOMEM, "out of memory");
    for (int b = 0; !st && b < B; b++) {
        rs[b] = (row_state){.prompt = prompts[b], .len = lens[b], .pos = minlen, .textcap = text_cap_for(o->max_new)};
        rs[b].context = malloc((size_t)(lens[b] + o->max_new + 1) * sizeof(int32_t)); /* prompt + every new id */
        if (!rs[b].context) {
            st = sp_errf(err, SP_ERR_NOMEM, "out of memory");
            break;
        }
        memcpy(rs[b].context, prompts[b], (size_t)lens[b] * sizeof(int32_t));
        rs[b].ncontext = lens[b];
        rs[b].done = o->max_new <= 0;
        if (tok) { /* prime the decoder so the continuation's spacing is right */
            sp_detok_init(&rs[b].detok, tok);
            rs[b].detok.prev = prompts[b][lens[b] - 1];
            rs[b].detok.at_start = 0;
        }
    }
    if (!st) {
        st = sample_loop(lm, tok, rs, B, minlen, o, cb, user, r, err);
        lm->end(lm->ctx);
    }
    for (int b = 0; rs && b < B; b++) {
        if (tok && rs[b].context && !st) { /* an unfinished UTF-8 sequence at the end */
            char tail[SP_DETOK_BUF];
            size_t n = sp_detok_flush(&rs[b].detok, tail, sizeof tail);
            if (n && !append_text(r, b, &rs[b], tail, n, o->stop) && cb)
                cb(b, -1, tail, user);
        }
        free(rs[b].context);
    }
    free(rs);
    return st;
}

/* ---------------------------------------------------------------------------------------------- */
/* beam search */

typedef struct cand {
    float score;
    int beam, token;
} cand;

static int cand_cmp(const cand *x, const cand *y)
{
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    if (x->beam != y->beam)
        return x->beam - y->beam;
    return x->token - y->token;
}

/* Sorts the 2K x K candidates in place (insertion: few, and no allocation, unlike glibc's qsort). */
static void cand_sort(cand *c, int n)
{
    for (int i = 1; i < n; i++) {
        cand x = c[i];
        int j = i;
        for (; j > 0 && cand_cmp(&x, &c[j - 1]) < 0; j--)
            c[j] = c[j - 1];
        c[j] = x;
    }
}

typedef struct beams {
    int K, max_new, V;
    float *score;      /* [K] cumulative log-probability, -inf for unused beams */
    float *nscore;     /* [K] scratch */
    int32_t *tokens;   /* [K, max_new] */
    int len;           /* tokens so far in every live beam */
    float best_done;   /* best finished hypothesis, length-normalised */
    int32_t *done_tokens;
    int done_len, ndone;
} beams;

/* Top 2K candidates of every live beam, merged and sorted. */
static int collect(beams *bm, const float *logits, float *lp, cand *c)
{
    int n = 0, K = bm->K, V = bm->V;
    for (int k = 0; k < K; k++) {
        if (isinf(bm->score[k]))
            continue;
        sp_log_softmax(lp, logits + (size_t)k * V, V);
        for (int j = 0; j < 2 * K; j++) { /* partial selection: 2K passes are cheap for small K */
            int best = -1;
            for (int v = 0; v < V; v++)
                if (lp[v] > -INFINITY && (best < 0 || lp[v] > lp[best]))
                    best = v;
            if (best < 0)
                break;
            c[n++] = (cand){bm->score[k] + lp[best], k, best};
            lp[best] = -INFINITY;
        }
    }
    cand_sort(c, n);
    return n;
}

/* Picks the next K beams from the candidates; finished (EOS) hypotheses are set aside. Fills src and next
 * tokens. Returns the number of live beams. */
static int select_beams(beams *bm, const cand *c, int n, const sp_gen_opts *o, int64_t *src, int32_t *next,
                        int32_t *tok_new)
{
    int K = bm->K, live = 0;
    float *nscore = bm->nscore;
    for (int i = 0; i < n && live < K; i++) {
        if (o->stop_at_eos && (c[i].token == o->eos_id || c[i].token == o->bos_id)) {
            float norm = c[i].score / (float)(bm->len + 1);
            if (i < K && (!bm->ndone || norm > bm->best_done)) { /* only EOS among the top K counts */
                bm->best_done = norm;
                memcpy(bm->done_tokens, bm->tokens + (size_t)c[i].beam * bm->max_new, (size_t)bm->len * sizeof(int32_t));
                bm->done_len = bm->len;
            }
            bm->ndone += i < K;
            continue;
        }
        src[live] = c[i].beam;
        next[live] = c[i].token;
        nscore[live] = c[i].score;
        memcpy(tok_new + (size_t)live * bm->max_new, bm->tokens + (size_t)c[i].beam * bm->max_new,
               (size_t)bm->len * sizeof(int32_t));
        tok_new[(size_t)live * bm->max_new + bm->len] = c[i].token;
        live++;
    }
    for (int k = 0; k < K; k++) {
        bm->score[k] = k < live ? nscore[k] : -INFINITY;
        if (k >= live) { /* keep the batch full: dead rows copy beam 0 and are ignored */
            src[k] = src[0];
            next[k] = next[0];
        }
    }
    memcpy(bm->tokens, tok_new, (size_t)K * bm->max_new * sizeof(int32_t));
    bm->len++;
    return live;
}

static sp_status beam_loop(const sp_lm *lm, beams *bm, const sp_gen_opts *o, float *logits, sp_err *err)
{
    int K = bm->K;
    float *lp = malloc((size_t)bm->V * sizeof(float));
    cand *c = malloc((size_t)K * 2 * K * sizeof *c);
    int64_t *src = malloc((size_t)K * sizeof *src);
    int32_t *next = malloc((size_t)K * sizeof *next), *tok_new = malloc((size_t)K * bm->max_new * sizeof(int32_t));
    sp_status st = lp && c && src && next && tok_new ? SP_OK : sp_errf(err, SP_ERR_NOMEM, "out of memory");
    while (!st && bm->len < bm->max_new) {
        if (is_cancelled(o)) {
            st = SP_ERR_CANCELLED;
            break;
        }
        for (int k = 0; bm->len < o->min_new && k < K; k++) { /* not yet: the ends cannot be chosen */
            if (o->eos_id >= 0 && o->eos_id < bm->V)
                logits[(size_t)k * bm->V + o->eos_id] = -INFINITY;
            if (o->bos_id >= 0 && o->bos_id < bm->V)
                logits[(size_t)k * bm->V + o->bos_id] = -INFINITY;
        }
        int n = collect(bm, logits, lp, c);
        int live = select_beams(bm, c, n, o, src, next, tok_new);
        if (live == 0 || bm->len >= bm->max_new || bm->ndone >= K)
            break;
        st = lm->reorder(lm->ctx, src, K, err);
        if (!st)
            st = lm->forward(lm->ctx, next, K, 1, logits, err);
    }
    free(lp), free(c), free(src), free(next), free(tok_new);
    return st;
}

static sp_status generate_beams(const sp_lm *lm, const sp_tokenizer *tok, const int32_t *prompt, int len,
                                const sp_gen_opts *o, sp_gen_token_fn cb, void *user, sp_gen_result *r, sp_err *err)
{
    int K = o->beams, V = lm->vocab, positions = len + (o->max_new > 0 ? o->max_new - 1 : 0);
    if (positions > lm->max_pos)
        return sp_errf(err, SP_ERR_RANGE, "%d prompt + %d new tokens exceed the model's context of %d", len,
                       o->max_new, lm->max_pos);
    beams bm = {.K = K, .max_new = o->max_new, .V = V};
    bm.score = malloc((size_t)K * sizeof(float));
    bm.nscore = malloc((size_t)K * sizeof(float));
    bm.tokens = calloc((size_t)K * o->max_new, sizeof(int32_t));
    bm.done_tokens = calloc((size_t)o->max_new, sizeof(int32_t));
    float *logits = malloc((size_t)K * V * sizeof(float));
    int32_t *ids = malloc((size_t)K * len * sizeof(int32_t));
    sp_status st = bm.score && bm.nscore && bm.tokens && bm.done_tokens && logits && ids ? lm->begin(lm->ctx, K, positions, err)
                                                                           : sp_errf(err, SP_ERR_NOMEM, "out of memory");
    if (!st) {
        for (int k = 0; k < K; k++) { /* K copies of the prompt; only beam 0 is live at first */
            memcpy(ids + (size_t)k * len, prompt, (size_t)len * sizeof(int32_t));
            bm.score[k] = k ? -INFINITY : 0.0f;
        }
        double t0 = sp_now_s();
        st = lm->forward(lm->ctx, ids, K, len, logits, err);
        r->prefill_tokens = len;
        r->prefill_s = sp_now_s() - t0;
        if (!st)
            st = beam_loop(lm, &bm, o, logits, err);
        r->decode_s = sp_now_s() - t0 - r->prefill_s;
        lm->end(lm->ctx);
        r->stop_reason = bm.ndone ? SP_GEN_STOP_EOS : SP_GEN_STOP_LENGTH;
        if (st == SP_ERR_CANCELLED) { /* the best hypothesis so far */
            st = SP_OK;
            r->stop_reason = SP_GEN_STOP_CANCELLED;
        }
    }
    if (!st) { /* the best of the finished hypotheses and the live beams, by score per token */
        int best = 0;
        for (int k = 1; k < K; k++)
            if (bm.score[k] > bm.score[best])
                best = k;
        float live_norm = bm.len ? bm.score[best] / (float)bm.len : -INFINITY;
        int use_done = bm.ndone && (isinf(live_norm) || bm.best_done >= live_norm);
        const int32_t *chosen = use_done ? bm.done_tokens : bm.tokens + (size_t)best * o->max_new;
        int n = use_done ? bm.done_len : bm.len;
        r->best_score = use_done ? bm.best_done : live_norm;
        sp_detok d;
        if (tok) {
            sp_detok_init(&d, tok);
            d.prev = prompt[len - 1];
            d.at_start = 0;
        }
        row_state rs = {.textcap = text_cap_for(o->max_new)};
        r->first_token_s = n ? sp_now_s() : 0;
        for (int i = 0; i < n; i++) {
            r->ids[0][r->n[0]++] = chosen[i];
            char piece[SP_DETOK_BUF] = "";
            size_t np = tok ? sp_detok_push(&d, chosen[i], piece, sizeof piece) : 0;
            int stop = tok && append_text(r, 0, &rs, piece, np, o->stop);
            if (cb)
                cb(0, chosen[i], tok ? piece : NULL, user);
            if (stop) {
                r->stop_reason = SP_GEN_STOP_STRING;
                break;
            }
        }
    }
    free(bm.score), free(bm.nscore), free(bm.tokens), free(bm.done_tokens), free(logits), free(ids);
    return st;
}

/* ---------------------------------------------------------------------------------------------- */

sp_status sp_generate(const sp_lm *lm, const sp_tokenizer *tok, const int32_t *const *prompts, const int *lens,
                      int n, const sp_gen_opts *o, sp_gen_token_fn cb, void *user, sp_gen_result *out, sp_err *err)
{
    if (n <= 0)
        return sp_errf(err, SP_ERR_ARG, "no prompt");
    if (o->beams > 1 && n != 1)
        return sp_errf(err, SP_ERR_ARG, "beam search takes one prompt, not %d", n);
    if (o->stop && o->stop[0] && !tok)
        return sp_errf(err, SP_ERR_ARG, "stop strings need a tokenizer");
    for (int i = 0; i < n; i++)
        for (int t = 0; t < lens[i]; t++)
            if (prompts[i][t] < 0 || prompts[i][t] >= lm->vocab)
                return sp_errf(err, SP_ERR_RANGE, "token id %d outside the vocabulary (0..%d)",
                               prompts[i][t], lm->vocab - 1);
    sp_status st = result_alloc(out, n, o->max_new, err);
    if (st)
        return st;
    double t0 = sp_now_s();
    st = o->beams > 1 ? generate_beams(lm, tok, prompts[0], lens[0], o, cb, user, out, err)
                      : generate_sampled(lm, tok, prompts, lens, n, o, cb, user, out, err);
    out->seconds = sp_now_s() - t0;
    if (out->first_token_s > 0)
        out->first_token_s -= t0;
    int total = 0;
    for (int i = 0; i < n; i++)
        total += out->n[i];
    out->tokens_per_s = out->seconds > 0 ? total / out->seconds : 0;
    if (st)
        sp_gen_result_free(out);
    return st;
}
