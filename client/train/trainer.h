/* trainer.h - prompt tuning through the swarm (Petals semantics, petals-internals.md §3): the trainable
 * parameters live on the client (shallow prompts [P, H], deep prompts [L, P, H], a classification head
 * [C, H]); forward and backward of the blocks run on the servers; the optimizer runs locally (CUDA if
 * present; with device 1 the local parts too, their parameters resident on the GPU: devparts.h). A task
 * (include/sepal/plugin.h) supplies data, batches, loss and metrics.
 *
 * Modes: head-only (P = 0), ptune (P prefix embeddings prepended, plus the head), deep_ptune (also a prompt
 * per block added to the first P positions entering it). A causal-LM task uses the model's own head.
 * Schedules over M microbatches (gradient accumulation), the route's servers being the pipeline stages
 * (pipeline.h): AFAB (all forwards, then all backwards) and 1F1B (warm-up forwards, then one forward one
 * backward, then cool-down), at most `max_in_flight` microbatches holding activations. The microbatches run
 * concurrently, one thread each, so microbatch m+1 runs on server 1 while m runs on server 2; every server
 * takes its work in its stage's order. Loss and gradients do not depend on the schedule (the per-microbatch
 * parts are summed in microbatch order). The local baseline (all blocks in this process) runs them one by
 * one in the same order. */
#ifndef SEPAL_TRAINER_H
#define SEPAL_TRAINER_H

#include <stdint.h>

#include "autograd.h"
#include "model.h"
#include "optim.h"
#include "sepal/plugin.h"

struct sp_runtime;

typedef enum { SP_TUNE_HEAD, SP_TUNE_PTUNE, SP_TUNE_DEEP } sp_tuning;
typedef enum { SP_SCHED_AFAB, SP_SCHED_1F1B } sp_schedule;

typedef struct sp_train_opts {
    sp_tuning tuning;
    int pre_seq_len;   /* P */
    float lr, weight_decay, clip_norm;
    int epochs, batch, warmup, max_length, microbatches, max_in_flight;
    sp_schedule schedule;
    uint64_t seed;
    int device;        /* -1 auto (the optimizer on CUDA if present, the local parts on the CPU), 0 CPU, 1 CUDA:
                        * the local parts and the optimizer on GPU device_index (devparts.h) */
    int device_index;
    int fp16;          /* dynamic loss scaling (fp32 master parameters) */
    int max_steps;     /* 0: all epochs */
    int eval_batches;  /* 0: the whole validation split */
} sp_train_opts;

void sp_train_opts_default(sp_train_opts *o);

/* Per-step and per-epoch reports (the front end draws them). */
typedef struct sp_train_event {
    int epoch, step, steps_total;
    float loss, lr, grad_norm;
    double tokens_per_s; /* positions the step ran (B x (T + P), T each microbatch's longest row) per second */
    const char *metrics; /* non-NULL at the end of an epoch's validation */
    int eval_done, eval_total; /* eval_total > 0: progress of a validation (batches done of total), nothing else */
} sp_train_event;
typedef void (*sp_train_cb)(const sp_train_event *ev, void *user);

typedef struct sp_trainer sp_trainer;

/* blocks: NULL to run the blocks through rt's route, or a model holding every block to run them in this
 * process (the single-process baseline). The task is opened (its arguments checked, its data read) before the
 * swarm is asked for: "task sst2: no sentiment data in ..." comes before "no servers". */
sp_status sp_trainer_new(sp_trainer **out, struct sp_runtime *rt, sp_model *blocks, const sepal_task *task,
                         const char *task_args, const sp_train_opts *o, sp_err *err);
void sp_trainer_free(sp_trainer *t);
/* The steps sp_trainer_fit will take: the epochs' batches, or --max-steps when that is fewer. */
int sp_trainer_steps_planned(const sp_trainer *t);
/* Optimizer steps applied by sp_trainer_fit so far. */
int sp_trainer_steps_done(const sp_trainer *t);
/* Also report the progress of evaluations (sp_trainer_eval, and fit's) to cb. */
void sp_trainer_on_progress(sp_trainer *t, sp_train_cb cb, void *user);

/* One optimizer step over the batch of examples idx[0..n) of the train split (split into microbatches
 * per the schedule). Reports the mean loss. */
sp_status sp_trainer_step(sp_trainer *t, const int *idx, int n, float *loss, sp_err *err);
/* Loss and gradients only (no update): for tests comparing schedules. grads: the trainable tensors (device 1:
 * SP_ERR_UNSUPPORTED, the gradients stay on the GPU). */
sp_status sp_trainer_grads(sp_trainer *t, const int *idx, int n, float *loss, sp_err *err);
int sp_trainer_params(sp_trainer *t, sp_t ***params);
/* The stages of the last pipelined step (its per-stage traces), or NULL if none ran. */
const sp_pipe *sp_trainer_last_pipe(const sp_trainer *t);
/* The route of the last pipelined step (its stages are the pipe's); NULL before one ran. */
const struct sp_route *sp_trainer_last_route(const sp_trainer *t);
/* The whole run: epochs over shuffled batches, validation after each epoch. */
sp_status sp_trainer_fit(sp_trainer *t, sp_train_cb cb, void *user, sp_err *err);
/* Validation metrics into buf: the task's, then the mean loss ("accuracy=0.8120 n=1000 loss=0.4100"), unless
 * the task's own say a loss already ("loss=2.31 perplexity=10.1 tokens=512": once). */
sp_status sp_trainer_eval(sp_trainer *t, char *buf, size_t cap, sp_err *err);
/* Trained parameters to / from a safetensors file. */
/* Writes the trained parameters with what they are (task, tuning, pre_seq_len, the model's prefix and config
 * hash) in the file's metadata. */
sp_status sp_trainer_save(sp_trainer *t, const char *path, sp_err *err);
/* Reads parameters saved by sp_trainer_save; a file saved for another model (config hash) is refused. */
sp_status sp_trainer_load(sp_trainer *t, const char *path, sp_err *err);

/* What a parameter file says about itself (files of older versions say nothing: has_meta 0). */
typedef struct sp_params_info {
    int has_meta;
    char task[64], model[96];
    sp_tuning tuning;
    int pre_seq_len;
    unsigned long long config_hash; /* 0: not said */
} sp_params_info;
sp_status sp_params_info_read(const char *path, sp_params_info *out, sp_err *err);
/* SP_ERR_ARG naming both models when info says the file is for another model than config_hash. */
sp_status sp_params_check_model(const char *path, const sp_params_info *info, const char *model,
                                unsigned long long config_hash, sp_err *err);
/* What a task's host encode does: text -> ids with BOS, at most cap; -1 if the model has no tokenizer. */
int sp_task_encode(struct sp_runtime *rt, const char *text, int32_t *ids, int cap);
/* The prompts of a file saved by sp_trainer_save, for generation (runtime.h's sp_lm_swarm_prompts): shallow
 * [P, H] (malloc'd), deep [L, P, H] (malloc'd; NULL for ptune), P. Shapes are checked against L and H. */
sp_status sp_prompts_load(const char *path, int L, int H, float **shallow, float **deep, int *P, sp_err *err);

#endif
