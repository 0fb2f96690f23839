/* parts.h - the model's local parts in a client runtime: the embeddings, the final norm and the LM head (the
 * blocks are the servers'), the tokenizer, the LM head's encoding for generation and the compute threads; and
 * what front ends read of them. sp_runtime_load (runtime.h) loads them. */
#ifndef SEPAL_PARTS_H
#define SEPAL_PARTS_H

#include "model.h"
#include "runtime_types.h"
#include "status.h"
#include "tokenizer.h"

/* Encodes the local LM head in t (f32, bf16, int8, nf4, fp16) for generation, now if a model is loaded and at every
 * later load; f32 (the default) uses the checkpoint's tensor in place. Training always uses the f32 head. */
sp_status sp_runtime_set_head_dtype(sp_runtime *rt, int t, sp_err *err);
int sp_runtime_head_dtype(const sp_runtime *rt);

/* Generation's local parts (the embeddings, BLOOM's embedding norm, the final norm and the LM head) on GPU index
 * (-1: the CPU, the default), for the loaded model now and at every later load (uploaded once a load,
 * client/train/devparts.h); the swarm's sessions (sp_lm_swarm) use them, the head in f32 whatever
 * sp_runtime_set_head_dtype says (that encoding is the CPU's). A GPU that cannot run, or parts that do not fit
 * it, are refused and the setting stays; a load that cannot put them there fails (the model before stays). */
sp_status sp_runtime_set_gen_device(sp_runtime *rt, int index, sp_err *err);
int sp_runtime_gen_device(const sp_runtime *rt);

/* The client's compute threads (the LM head, training's products): n, or 0 for every CPU the process may run
 * on; applies to the loaded model and later loads. */
sp_status sp_runtime_set_threads(sp_runtime *rt, int n, sp_err *err);
int sp_runtime_threads(const sp_runtime *rt);

/* What was loaded; each NULL (the name "") before the first load. They stay valid until the next load or
 * sp_runtime_free, and are read on the thread that loads (a front end's command thread). */
const sp_config *sp_runtime_config(const sp_runtime *rt);
sp_model *sp_runtime_model(const sp_runtime *rt);           /* the local parts (sp_model_embed, sp_model_head) */
const sp_tokenizer *sp_runtime_tokenizer(const sp_runtime *rt); /* NULL also when the model has none */
const char *sp_runtime_model_dir(const sp_runtime *rt);     /* the directory it was loaded from ("": none) */
const char *sp_runtime_model_name(const sp_runtime *rt);    /* its prefix in the swarm (sp_model_prefix) */

#endif
