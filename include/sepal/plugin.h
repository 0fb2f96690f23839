/* sepal/plugin.h - the ONLY header a sepal plugin includes. A plugin is a shared object (.so) exporting
 *
 *     const sepal_task *sepal_plugin_task(void);
 *
 * which returns a training task: its data (train and validation splits), batches of token ids, optionally
 * its own loss over the model's output, and its metrics. The host (`sepal`: `plugin load PATH`, `train`,
 * `eval`) checks abi == SEPAL_PLUGIN_ABI before using anything else and refuses another version with a
 * message naming both. Everything crosses this boundary as plain C: ids, floats, and opaque tensors that only
 * the host's functions touch. Version history: 1 = first. */
#ifndef SEPAL_PLUGIN_H
#define SEPAL_PLUGIN_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SEPAL_PLUGIN_ABI 1u

typedef struct sepal_tensor sepal_tensor; /* a host tensor (autograd); opaque to plugins */

/* What the host offers a task. ctx is passed back to every function. */
typedef struct sepal_host {
    uint32_t abi;
    void *ctx;
    /* Tokenizes text (with BOS when the model adds one) into ids[0..cap); returns the count, -1 on error. */
    int (*encode)(void *ctx, const char *text, int32_t *ids, int cap);
    int vocab, pad_id, bos_id, eos_id;
    /* Tensor access and the losses a custom loss may combine (NULL on error; the host reports it). */
    const float *(*data)(const sepal_tensor *t, int *ndim, int64_t shape[4]);
    sepal_tensor *(*cross_entropy)(void *ctx, sepal_tensor *logits, const int32_t *targets);
    sepal_tensor *(*mse)(void *ctx, sepal_tensor *pred, const float *target);
    sepal_tensor *(*bce_logits)(void *ctx, sepal_tensor *logits, const float *target);
    sepal_tensor *(*add)(void *ctx, sepal_tensor *a, sepal_tensor *b);
    sepal_tensor *(*scale)(void *ctx, sepal_tensor *a, float s);
    /* Backward from t (a non-scalar needs grad); grads accumulate into the trainable parameters. 0 = ok. */
    int (*backward)(void *ctx, sepal_tensor *t, const float *grad);
    void (*log)(void *ctx, const char *msg);
} sepal_host;

/* A batch the task builds. Rows are right-padded with pad_id to T (causal attention then leaves every
 * real token untouched by the pads). The task owns the arrays until its next batch call. */
typedef struct sepal_batch {
    int B, T;
    int32_t *ids;     /* [B, T] */
    int32_t *last;    /* [B] position of each row's last real token (the pooled one) */
    int32_t *labels;  /* [B] class ids (num_labels >= 2), or NULL */
    float *values;    /* [B * num_labels] regression (num_labels == 1) or multi-label targets, or NULL */
    int32_t *targets; /* [B, T] next-token targets for a causal-LM task (-1: no loss here), or NULL */
} sepal_batch;

enum { SEPAL_SPLIT_TRAIN = 0, SEPAL_SPLIT_VALID = 1 };

typedef struct sepal_task {
    uint32_t abi;             /* SEPAL_PLUGIN_ABI */
    const char *name;         /* "sst2" */
    const char *description;
    int num_labels;           /* 0: causal LM; 1: regression; >= 2: classes */
    int multi_label;          /* with num_labels >= 2: independent labels (BCE) instead of one class */
    /* Opens the task (loads its data). args: "key=value ..." from the command line, may be "". */
    void *(*open)(const sepal_host *host, const char *args, char *err, size_t errcap);
    void (*close)(void *task);
    int (*size)(void *task, int split);
    /* Builds the batch of examples idx[0..n) of split, truncated to max_length tokens. 0 = ok. */
    int (*batch)(void *task, int split, const int *idx, int n, int max_length, sepal_batch *out, char *err,
                 size_t errcap);
    /* Optional: the loss of a batch given the model's output (logits [B, C] for classification,
     * [B, T, V] for a causal LM). NULL: the host's default (cross-entropy, MSE or BCE as Hugging Face
     * chooses by num_labels). A task may also call host->backward itself and return NULL. */
    sepal_tensor *(*loss)(void *task, const sepal_host *host, sepal_tensor *logits, const sepal_batch *b);
    /* Metrics over a validation pass: reset, add each batch's output, then a one-line summary
     * ("accuracy=0.8120 n=1000"). NULL: the host reports accuracy (classes) or loss/perplexity (LM).
     * metrics_get returns 0, or -1 when the summary does not fit in cap (out then holds a truncated line). */
    void (*metrics_reset)(void *task);
    void (*metrics_add)(void *task, const float *logits, const sepal_batch *b);
    int (*metrics_get)(void *task, char *out, size_t cap);
} sepal_task;

/* The symbol the host looks up. */
typedef const sepal_task *(*sepal_plugin_task_fn)(void);
#define SEPAL_PLUGIN_SYMBOL "sepal_plugin_task"

/* Optional, beside the task: a plugin may also export
 *
 *     int sepal_plugin_check_args(const char *args, char *err, size_t errcap);
 *
 * which checks the task's arguments ("key=value ...", may be "") without loading anything: every key known,
 * every value valid, a file or directory they name there and readable. 0 = ok, -1 = error (in err). The host
 * calls it before it touches the swarm or opens the task, and for `sepal --dry-run`, so that a typo is said at
 * once; without it open() is the first check. SEPAL_PLUGIN_CHECK_ARGS below exports it. */
typedef int (*sepal_plugin_check_args_fn)(const char *args, char *err, size_t errcap);
#define SEPAL_PLUGIN_CHECK_ARGS_SYMBOL "sepal_plugin_check_args"

/* Marks that symbol exported when a plugin is built with -fvisibility=hidden (the shipped ones are). */
#if defined(__GNUC__)
#define SEPAL_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define SEPAL_PLUGIN_EXPORT
#endif

/* A message into a task's err buffer (nothing when err is NULL or cap 0), printf-style: the helper every task's
 * functions use to say what went wrong. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static inline void sepal_set_err(char *err, size_t cap, const char *fmt, ...)
{
    if (err && cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, cap, fmt, ap);
        va_end(ap);
    }
}

/* A plugin's export stanza, the same for every plugin: SEPAL_PLUGIN_TASK(task, getter) at the end of its source,
 * after its `static const sepal_task task`. It defines getter() (a host that compiles the plugin in, with
 * SEPAL_PLUGIN_BUILTIN, registers the task through it) and, in a module, the exported sepal_plugin_task(). */
#define SEPAL_PLUGIN_GETTER(task, getter)                                                                          \
    const sepal_task *getter(void);                                                                                \
    const sepal_task *getter(void) { return &(task); }
#ifdef SEPAL_PLUGIN_BUILTIN
#define SEPAL_PLUGIN_TASK(task, getter) SEPAL_PLUGIN_GETTER(task, getter)
#else
#define SEPAL_PLUGIN_TASK(task, getter)                                                                            \
    SEPAL_PLUGIN_GETTER(task, getter)                                                                              \
    SEPAL_PLUGIN_EXPORT const sepal_task *sepal_plugin_task(void);                                                 \
    SEPAL_PLUGIN_EXPORT const sepal_task *sepal_plugin_task(void) { return &(task); }
#endif

/* The stanza of the optional check: SEPAL_PLUGIN_CHECK_ARGS(fn, getter) after fn (a static function of the
 * sepal_plugin_check_args_fn type). It defines getter(), which returns fn (a host that compiles the plugin in
 * registers the check through it) and, in a module, the exported sepal_plugin_check_args(). */
#define SEPAL_PLUGIN_CHECK_GETTER(fn, getter)                                                                      \
    sepal_plugin_check_args_fn getter(void);                                                                       \
    sepal_plugin_check_args_fn getter(void) { return fn; }
#ifdef SEPAL_PLUGIN_BUILTIN
#define SEPAL_PLUGIN_CHECK_ARGS(fn, getter) SEPAL_PLUGIN_CHECK_GETTER(fn, getter)
#else
#define SEPAL_PLUGIN_CHECK_ARGS(fn, getter)                                                                        \
    SEPAL_PLUGIN_CHECK_GETTER(fn, getter)                                                                          \
    SEPAL_PLUGIN_EXPORT int sepal_plugin_check_args(const char *args, char *err, size_t errcap);                   \
    SEPAL_PLUGIN_EXPORT int sepal_plugin_check_args(const char *args, char *err, size_t errcap)                    \
    {                                                                                                              \
        return fn(args, err, errcap);                                                                              \
    }
#endif

#ifdef __cplusplus
}
#endif
#endif
