/* generate.h - text generation over any language model that can take positions and return next-token
 * logits: the local single-process runner (sp_lm_local) or the swarm (runtime.h). Greedy, temperature,
 * top-k, top-p, repetition penalty, stop strings, max new tokens, a seed, batches of prompts of different
 * lengths, and beam search (the LM reorders its caches' batch). */
#ifndef SEPAL_GENERATE_H
#define SEPAL_GENERATE_H

#include <stdint.h>

#include "model.h"
#include "sampler.h"
#include "status.h"
#include "tokenizer.h"

/* The model as generation sees it. Positions are implicit: each forward appends T positions to every row. */
typedef struct sp_lm {
    void *ctx;
    int vocab, max_pos;
    /* Starts a sequence batch of B rows that will hold up to max_length positions. */
    sp_status (*begin)(void *ctx, int B, int max_length, sp_err *err);
    /* ids [B, T] -> logits [B, V] of each row's last new position. */
    sp_status (*forward)(void *ctx, const int32_t *ids, int B, int T, float *logits, sp_err *err);
    /* Optional (NULL: not offered): as forward, but only each row's greedy choice, best[B] = the first maximum
     * of the logits forward would give; used for the steps whose choice is that argmax alone (temperature 0,
     * no repetition penalty, no end token masked). A wrapper that replaces forward must replace this too. */
    sp_status (*forward_argmax)(void *ctx, const int32_t *ids, int B, int T, int32_t *best, sp_err *err);
    /* Row b of the caches becomes old row src[b] (beam search). */
    sp_status (*reorder)(void *ctx, const int64_t *src, int B, sp_err *err);
    /* Rolls every row back to its first pos positions (0 <= pos <= the positions so far): the next forward
     * continues from there (Petals' start_from_position). */
    sp_status (*rewind)(void *ctx, int pos, sp_err *err);
    void (*end)(void *ctx);
} sp_lm;

/* An LM over a local sp_model holding everything (embeddings, all blocks, head). */
typedef struct sp_lm_local {
    sp_model *m;
    sp_model_cache cache;
    int pos;
} sp_lm_local;

sp_lm sp_lm_local_make(sp_lm_local *l, sp_model *m);

typedef struct sp_gen_opts {
    sp_sample_opts sample;
    int max_new;
    int beams;               /* 1: no beam search */
    const char *const *stop; /* NULL-terminated stop strings (need a tokenizer), may be NULL */
    int stop_at_eos;         /* stop a row at EOS (and BOS, as llama2.c does); 0: go on past them (--ignore-eos) */
    int min_new;             /* EOS and BOS cannot be chosen before this many new tokens (--min-new-tokens) */
    int eos_id, bos_id;
    const int *cancel;       /* non-zero (read atomically) stops the generation between steps; may be NULL */
} sp_gen_opts;

void sp_gen_opts_default(sp_gen_opts *o);

/* Called for every new token of row `row` (text: its decoded piece if a tokenizer was given, else NULL).
 * Return non-zero to stop generating. */
typedef int (*sp_gen_token_fn)(int row, int token, const char *text, void *user);

/* Why row 0 stopped. */
typedef enum {
    SP_GEN_STOP_LENGTH,    /* max_new tokens */
    SP_GEN_STOP_EOS,       /* the model ended it */
    SP_GEN_STOP_STRING,    /* a stop string */
    SP_GEN_STOP_CALLBACK,  /* the token callback asked */
    SP_GEN_STOP_CANCELLED, /* opts.cancel, or an LM call that returned SP_ERR_CANCELLED: what came so far is kept */
} sp_gen_stop;

const char *sp_gen_stop_name(sp_gen_stop s); /* "length", "eos", "stop string", "stopped", "cancelled" */

typedef struct sp_gen_result {
    int nrows;
    int32_t **ids; /* per row: the new tokens (the EOS that stopped a row is not included) */
    int *n;
    char **text;   /* per row: the decoded continuation if a tokenizer was given, cut before a stop string */
    double seconds, tokens_per_s;
    float best_score; /* beam search: the chosen hypothesis' score */
    sp_gen_stop stop_reason;
    int prefill_tokens;   /* positions of the first LM call (the prompts' common prefix, all rows) */
    double prefill_s;     /* time of that call */
    double first_token_s; /* from the start to row 0's first new token (0: none) */
    double decode_s;      /* the decode steps' time: from the end of that call to the last new token (neither the
                             sessions' opening before the prompt nor their closing after: a swarm's round trips) */
} sp_gen_result;

void sp_gen_result_free(sp_gen_result *r);

/* Generates after each of the n prompts (prompt i: prompts[i][0..lens[i])). With beams > 1, n must be 1. */
sp_status sp_generate(const sp_lm *lm, const sp_tokenizer *tok, const int32_t *const *prompts, const int *lens,
                      int n, const sp_gen_opts *o, sp_gen_token_fn cb, void *user, sp_gen_result *out, sp_err *err);

#endif
