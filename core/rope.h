/* rope.h - rotary position embedding tables (default, linear and llama3 frequency scaling). */
#ifndef SEPAL_ROPE_H
#define SEPAL_ROPE_H

#include "config.h"

#define SP_ROPE_MAX_HALF 512

typedef struct sp_rope {
    int hd;                           /* head dim; hd/2 frequencies */
    float inv_freq[SP_ROPE_MAX_HALF]; /* computed in f32 like transformers does */
} sp_rope;

sp_status sp_rope_init(sp_rope *r, const sp_config *cfg, sp_err *err);
/* cos/sin [T, hd/2] for positions pos0 .. pos0+T-1. */
void sp_rope_tables(const sp_rope *r, int pos0, int T, float *cos, float *sin);

#endif
