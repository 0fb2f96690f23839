/* sampler.h - choosing the next token from logits: greedy, temperature, top-k, top-p (nucleus) and a
 * repetition penalty, with a seeded xorshift RNG so that a seed reproduces a generation. */
#ifndef SEPAL_SAMPLER_H
#define SEPAL_SAMPLER_H

#include <stdint.h>

#include "rng.h"

typedef struct sp_sample_opts {
    float temperature;        /* 0: greedy */
    int top_k;                /* 0: off */
    float top_p;              /* 1: off */
    float repetition_penalty; /* 1: off; > 1 discourages tokens already in the context */
    uint64_t seed;
} sp_sample_opts;

void sp_sample_opts_default(sp_sample_opts *o);

typedef struct sp_sampler2 {
    sp_sample_opts o;
    sp_rng rng;
    int V;
    float *probs; /* scratch [V] */
    int *idx;     /* scratch [V] */
} sp_sampler2;

int sp_sampler2_init(sp_sampler2 *s, const sp_sample_opts *o, int V); /* 0, or -1 out of memory */
void sp_sampler2_free(sp_sampler2 *s);

/* Applies the repetition penalty in place (HF semantics: a seen token's positive logit is divided by the
 * penalty, a negative one multiplied) for the n ids of the context. */
void sp_repetition_penalty(float *logits, int V, const int32_t *context, int n, float penalty);
/* The next token; logits are modified (penalty). context: every id so far (prompt included). */
int sp_sampler2_next(sp_sampler2 *s, float *logits, const int32_t *context, int n);

/* log-softmax of logits into out (for beam scores). */
void sp_log_softmax(float *out, const float *logits, int V);

#endif
