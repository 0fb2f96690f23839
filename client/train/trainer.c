/* trainer.c - prompt tuning: the graph of one microbatch, the schedules, the optimizer step, evaluation,
 * saving. Prompts are broadcast over the batch by replicating them into per-step leaves whose gradients
 * are summed back into the parameters (the reduction a broadcast's backward does). */
#include "trainer.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devparts.h"
#include "ops.h"
#include "rng.h"
#include "runtime_cancel.h"
#include "runtime_state.h"
#include "swarm.h"
#include "safetensors.h"
#include "timeutil.h"

struct sp_trainer {
    sp_runtime *rt;
    sp_model *blocks; /* NULL: the swarm */
    const sepal_task *task;
    void *task_ctx;
    sepal_host host;
    sp_train_opts o;
    int H, L, V, C, P;
    sp_graph *g;
    sp_t *prompts, *deep, *score; /* parameters ([P, H], [L, P, H], [C, H]); NULL when unused */
    sp_t *norm, *norm_b, *lm_head; /* frozen; norm_b: a LayerNorm's bias */
    sp_t *emb_norm, *emb_norm_b;   /* frozen: BLOOM's embedding LayerNorm (NULL: none) */
    sp_t *params[3];
    int nparams;
    sp_optim *opt;
    sp_devparts *dev; /* the local parts on a GPU (o.device 1), the parameters resident in opt's device buffers */
    sp_rng rng;
    /* per microbatch, kept between its forward and backward */
    sp_t *rep_prompts[64], *rep_deep[64], *rep_score[64], *loss[64];
    float weight[64];
    int batch_rows[64];
    long positions[64]; /* B x (T + P) each microbatch ran (T: its longest row) */
    int nmicro;
    sp_pipe *pipe; /* the current (or last) pipelined step's stages; NULL: microbatches run one by one */
    sp_route route; /* the pipelined step's route (its stages are the pipe's) */
    char errbuf[512];
    sp_train_cb progress;  /* sp_trainer_on_progress */
    void *progress_user;
    int steps_done;        /* applied by fit */
    float grad_norm;       /* the last step's gradients' norm (before clipping; inf: skipped by loss scaling) */
};

int sp_trainer_steps_done(const sp_trainer *t) { return t->steps_done; }

void sp_trainer_on_progress(sp_trainer *t, sp_train_cb cb, void *user)
{
    t->progress = cb;
    t->progress_user = user;
}

static int cancelled(const sp_trainer *t) { return t->rt && sp_runtime_cancelled(t->rt); }

void sp_train_opts_default(sp_train_opts *o)
{
    memset(o, 0, sizeof *o);
    o->tuning = SP_TUNE_DEEP;
    o->pre_seq_len = 16;
    o->lr = 1e-2f;
    o->weight_decay = 0.0f;
    o->epochs = 3;
    o->batch = 16;
    o->warmup = 20;
    o->max_length = 64;
    o->microbatches = 4; /* pipelined over the servers; the same loss and gradients as one (trainer.h) */
    o->max_in_flight = 4;
    o->schedule = SP_SCHED_1F1B;
    o->device = -1;
}

/* ---------------------------------------------------------------------------------------------- */
/* the host API a task sees */

int sp_task_encode(struct sp_runtime *rt, const char *text, int32_t *ids, int cap)
{
    int *raw, n;
    if (!rt->tok || sp_tokenizer_encode(rt->tok, text, 1, &raw, &n, NULL))
        return -1;
    int k = n < cap ? n : cap;
    for (int i = 0; i < k; i++)
        ids[i] = raw[i];
    free(raw);
    return k;
}

static int host_encode(void *ctx, const char *text, int32_t *ids, int cap)
{
    return sp_task_encode(((sp_trainer *)ctx)->rt, text, ids, cap);
}

static const float *host_data(const sepal_tensor *x, int *ndim, int64_t shape[4])
{
    const sp_t *t = (const sp_t *)x;
    *ndim = t->ndim;
    memcpy(shape, t->shape, sizeof t->shape);
    return t->data;
}

static sepal_tensor *host_ce(void *ctx, sepal_tensor *l, const int32_t *y)
{
    return (sepal_tensor *)sp_cross_entropy((sp_t *)l, y, NULL);
    (void)ctx;
}
static sepal_tensor *host_mse(void *ctx, sepal_tensor *p, const float *y)
{
    (void)ctx;
    return (sepal_tensor *)sp_mse((sp_t *)p, y, NULL);
}
static sepal_tensor *host_bce(void *ctx, sepal_tensor *l, const float *y)
{
    (void)ctx;
    return (sepal_tensor *)sp_bce_logits((sp_t *)l, y, NULL);
}
static sepal_tensor *host_add(void *ctx, sepal_tensor *a, sepal_tensor *b)
{
    (void)ctx;
    return (sepal_tensor *)sp_add((sp_t *)a, (sp_t *)b, NULL);
}
static sepal_tensor *host_scale(void *ctx, sepal_tensor *a, float s)
{
    (void)ctx;
    return (sepal_tensor *)sp_scale((sp_t *)a, s, NULL);
}
static int host_backward(void *ctx, sepal_tensor *x, const float *grad)
{
    (void)ctx;
    return sp_backward((sp_t *)x, grad, NULL) == SP_OK ? 0 : -1;
}
static void host_log(void *ctx, const char *msg)
{
    sp_trainer *t = ctx;
    sp_rt_emit(t->rt, SP_EV_INFO, msg, 0, 0, 0);
}

static void host_init(sp_trainer *t)
{
    sepal_host *h = &t->host;
    memset(h, 0, sizeof *h);
    h->abi = SEPAL_PLUGIN_ABI;
    h->ctx = t;
    h->encode = host_encode;
    h->vocab = t->V;
    h->pad_id = 0; /* Llama has no pad token: <unk>, as Petals' examples do; right padding keeps it harmless */
    h->bos_id = t->rt->local->cfg.bos_id;
    h->eos_id = t->rt->local->cfg.eos_id;
    h->data = host_data;
    h->cross_entropy = host_ce;
    h->mse = host_mse;
    h->bce_logits = host_bce;
    h->add = host_add;
    h->scale = host_scale;
    h->backward = host_backward;
    h->log = host_log;
}

/* ---------------------------------------------------------------------------------------------- */
/* parameters */

static sp_t *normal_leaf(sp_trainer *t, int ndim, const int64_t *shape, const char *name)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    float *x = malloc((size_t)n * sizeof(float));
    if (!x)
        return NULL;
    sp_rng_fill_normal(&t->rng, x, (long)n, 0.02f); /* HF's init of Petals' prompt and head weights */
    sp_t *p = sp_leaf(t->g, ndim, shape, x, 1, name);
    free(x);
    return p;
}

static sp_status make_params(sp_trainer *t, sp_err *err)
{
    int64_t ph[2] = {t->P, t->H}, dh[3] = {t->L, t->P, t->H}, sh[2] = {t->C, t->H}, nh[1] = {t->H};
    int64_t vh[2] = {t->V, t->H};
    if (t->P > 0 && !(t->prompts = t->params[t->nparams++] = normal_leaf(t, 2, ph, "prompts")))
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    if (t->o.tuning == SP_TUNE_DEEP && !(t->deep = t->params[t->nparams++] = normal_leaf(t, 3, dh, "deep_prompts")))
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    if (t->C > 0 && !(t->score = t->params[t->nparams++] = normal_leaf(t, 2, sh, "score.weight")))
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    const sp_model *m = t->rt->local;
    t->norm = sp_leaf(t->g, 1, nh, m->norm, 0, "norm.weight");
    if (m->norm_b && !(t->norm_b = sp_leaf(t->g, 1, nh, m->norm_b, 0, "norm.bias")))
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    if (m->embed_norm_w && (!(t->emb_norm = sp_leaf(t->g, 1, nh, m->embed_norm_w, 0, "embed_norm.weight")) ||
                            !(t->emb_norm_b = sp_leaf(t->g, 1, nh, m->embed_norm_b, 0, "embed_norm.bias"))))
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    if (t->C == 0)
        t->lm_head = sp_leaf(t->g, 2, vh, m->lm_head, 0, "lm_head.weight");
    if (!t->norm || (t->C == 0 && !t->lm_head))
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    return SP_OK;
}

/* The parameters resident on the device: the optimizer's buffers are the local parts' (devparts.h). */
static sp_status bind_device(sp_trainer *t, sp_err *err)
{
    float *buf[3][2] = {{0}};
    sp_t *which[3] = {t->prompts, t->deep, t->score};
    for (int i = 0; i < t->nparams; i++)
        for (int k = 0; k < 3; k++)
            if (t->params[i] == which[k])
                for (int g = 0; g < 2; g++)
                    buf[k][g] = sp_optim_device_buf(t->opt, i, g);
    sp_devparts_bind(t->dev, buf[0][0], buf[0][1], buf[1][0], buf[1][1], buf[2][0], buf[2][1]);
    return sp_optim_make_resident(t->opt, err);
}

sp_status sp_trainer_new(sp_trainer **out, sp_runtime *rt, sp_model *blocks, const sepal_task *task,
                         const char *task_args, const sp_train_opts *o, sp_err *err)
{
    *out = NULL;
    if (!rt || !rt->local)
        return sp_errf(err, SP_ERR_STATE, "no model loaded (load DIR first)");
    if (o->microbatches < 1 || o->microbatches > 64 || o->batch < 1 || o->max_length < 2)
        return sp_errf(err, SP_ERR_ARG, "need batch >= 1, 1 <= microbatches <= 64, max_length >= 2");
    sp_trainer *t = calloc(1, sizeof *t);
    if (!t)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    t->rt = rt;
    t->blocks = blocks;
    t->task = task;
    t->o = *o;
    t->H = rt->local->cfg.hidden;
    t->L = rt->local->cfg.n_layers;
    t->V = rt->local->cfg.vocab;
    t->C = task->num_labels;
    t->P = o->tuning == SP_TUNE_HEAD ? 0 : o->pre_seq_len;
    sp_rng_seed(&t->rng, o->seed);
    host_init(t);
    t->g = sp_graph_new();
    sp_status st = t->g ? make_params(t, err) : sp_errf(err, SP_ERR_NOMEM, "out of memory");
    if (!st && t->P + o->max_length > rt->local->cfg.max_pos)
        st = sp_errf(err, SP_ERR_RANGE, "%d prompt positions + max_length %d exceed the model's context of %d", t->P,
                     o->max_length, rt->local->cfg.max_pos);
    if (!st) {
        char msg[512] = "";
        t->task_ctx = task->open(&t->host, task_args ? task_args : "", msg, sizeof msg);
        size_t nl = strlen(task->name);
        int named = !strncmp(msg, task->name, nl) && msg[nl] == ':'; /* "causal_lm: cannot read ...": once */
        if (!t->task_ctx)
            st = sp_errf(err, SP_ERR_ARG, "%s%s%s%s", named ? "" : "task ", named ? "" : task->name,
                         named ? "" : ": ", msg[0] ? msg : "cannot open");
    }
    if (!st && !blocks && !rt->nservers) /* the task's arguments first: they are said before the swarm */
        st = sp_errf(err, SP_ERR_STATE, "no servers (swarm up N, or connect HOST:PORT)");
    if (!st) {
        sp_adamw_opts ao;
        sp_adamw_opts_default(&ao);
        ao.lr = o->lr;
        ao.weight_decay = o->weight_decay;
        ao.warmup_steps = o->warmup;
        ao.clip_norm = o->clip_norm;
        ao.device = o->device;
        ao.fp16 = o->fp16;
        ao.total_steps = sp_trainer_steps_planned(t); /* the lr reaches 0 at the last step that runs */
        if (o->device == 1)
            st = sp_devparts_new(&t->dev, rt->local, o->device_index, t->C, t->P, err);
        if (!st)
            st = sp_optim_new(&t->opt, t->params, t->nparams, &ao, err);
        if (!st && t->dev)
            st = bind_device(t, err);
    }
    if (st) {
        sp_trainer_free(t);
        return st;
    }
    *out = t;
    return SP_OK;
}

void sp_trainer_free(sp_trainer *t)
{
    if (!t)
        return;
    if (t->task_ctx)
        t->task->close(t->task_ctx);
    sp_optim_free(t->opt);
    sp_pipe_free(t->pipe);
    sp_graph_free(t->g);
    sp_devparts_free(t->dev); /* after the graph: its nodes free device buffers */
    free(t);
}

const sp_pipe *sp_trainer_last_pipe(const sp_trainer *t) { return t->pipe; }
const sp_route *sp_trainer_last_route(const sp_trainer *t) { return t->pipe ? &t->route : NULL; }

int sp_trainer_params(sp_trainer *t, sp_t ***params)
{
    if (t->dev && sp_optim_to_host(t->opt, NULL))
        return 0;
    *params = t->params;
    return t->nparams;
}

/* ---------------------------------------------------------------------------------------------- */
/* one microbatch */

/* A [B, ...] leaf holding B copies of param p (training: it requires grad, summed back into p; evaluation:
 * it does not, so no op keeps anything for a backward, and the servers keep no activations). */
static sp_t *replicate(sp_trainer *t, sp_t *p, int B, int batch_axis, int train)
{
    int64_t shape[4];
    int nd = p->ndim + 1;
    for (int i = 0, j = 0; i < nd; i++)
        shape[i] = i == batch_axis ? B : p->shape[j++];
    int64_t outer = 1, inner = 1; /* p = [outer, inner] split at the batch axis */
    for (int i = 0; i < batch_axis; i++)
        outer *= p->shape[i];
    inner = p->n / outer;
    float *x = malloc((size_t)(p->n * B) * sizeof(float));
    if (!x)
        return NULL;
    for (int64_t o = 0; o < outer; o++)
        for (int b = 0; b < B; b++)
            memcpy(x + (o * B + b) * inner, p->data + o * inner, (size_t)inner * sizeof(float));
    sp_t *r = sp_input(t->g, nd, shape, x, train, p->name); /* dropped with the step's graph */
    free(x);
    return r;
}

/* p.grad += sum over the batch axis of r.grad. */
static void reduce_into(sp_t *p, const sp_t *r, int B, int batch_axis)
{
    if (!r || !r->grad)
        return;
    if (!p->grad)
        p->grad = calloc((size_t)p->n, sizeof(float));
    if (!p->grad)
        return;
    int64_t outer = 1;
    for (int i = 0; i < batch_axis; i++)
        outer *= p->shape[i];
    int64_t inner = p->n / outer;
    for (int64_t o = 0; o < outer; o++)
        for (int b = 0; b < B; b++)
            for (int64_t k = 0; k < inner; k++)
                p->grad[o * inner + k] += r->grad[(o * B + b) * inner + k];
}

/* The default loss, chosen as Hugging Face does by num_labels. */
static sp_t *default_loss(sp_trainer *t, sp_t *logits, const sepal_batch *b, sp_err *err)
{
    if (t->C == 0)
        return sp_cross_entropy(logits, b->targets, err);
    if (t->C == 1)
        return sp_mse(logits, b->values, err);
    if (t->task->multi_label)
        return sp_bce_logits(logits, b->values, err);
    return sp_cross_entropy(logits, b->labels, err);
}

/* Whether the device computes the loss with the logits: the cross-entropy of a causal LM or of single-label
 * classes, the task having no loss of its own. */
static int dev_loss(const sp_trainer *t)
{
    return t->dev && !t->task->loss && (t->C == 0 || (t->C >= 2 && !t->task->multi_label));
}

/* forward_logits with the local parts on the device (devparts.h): the loss (loss 1) or the logits. */
static sp_t *forward_dev(sp_trainer *t, const sepal_batch *b, int mb, int train, int loss, sp_err *err)
{
    t->rep_prompts[mb] = t->rep_deep[mb] = t->rep_score[mb] = NULL; /* the device sums the batch's gradients */
    sp_t *x = sp_devparts_input(t->dev, t->g, t->prompts, b->ids, b->B, b->T, train, err);
    sp_t *deep = x && t->deep ? sp_devparts_deep(t->dev, t->deep, b->B, train, err) : NULL;
    sp_t *h = !x || (t->deep && !deep) ? NULL
              : t->blocks          ? sp_local_chain(t->blocks, x, deep, err)
                                   : sp_remote_chain_mb(t->rt, x, deep, train && t->pipe ? &t->route : NULL,
                                                        train ? t->pipe : NULL, mb, err);
    sp_dev_batch db = {.B = b->B, .T = b->T, .targets = t->C ? b->labels : b->targets, .last = b->last};
    return h ? sp_devparts_head(t->dev, h, t->score, &db, loss, train, err) : NULL;
}

/* The model's output for a batch: logits [B, C] (classification) or [B*T, V] (causal LM). */
static sp_t *forward_logits(sp_trainer *t, const sepal_batch *b, int mb, int train, sp_err *err)
{
    if (t->dev)
        return forward_dev(t, b, mb, train, 0, err);
    int B = b->B, T = b->T, H = t->H, P = t->P;
    float *emb = malloc((size_t)B * T * H * sizeof(float));
    if (!emb || sp_model_embed(t->rt->local, emb, b->ids, B * T, err)) {
        free(emb);
        return emb ? NULL : (sp_errf(err, SP_ERR_NOMEM, "out of memory"), NULL);
    }
    int64_t xs[3] = {B, T, H};
    sp_t *x = sp_input(t->g, 3, xs, emb, 0, "embeddings"); /* frozen: the embeddings get no gradient */
    free(emb);
    sp_t *deep = NULL;
    t->rep_prompts[mb] = t->rep_deep[mb] = t->rep_score[mb] = NULL;
    if (x && P > 0) {
        t->rep_prompts[mb] = replicate(t, t->prompts, B, 0, train);
        x = t->rep_prompts[mb] ? sp_concat_pos(t->rep_prompts[mb], x, err) : NULL;
    }
    if (x && t->emb_norm) /* BLOOM: after the shallow prompts, as Petals does (they go through it too) */
        x = sp_layernorm(x, t->emb_norm, t->emb_norm_b, t->rt->local->cfg.norm_eps, err);
    if (x && t->deep)
        deep = t->rep_deep[mb] = replicate(t, t->deep, B, 1, train);
    sp_t *h = !x           ? NULL
              : t->blocks ? sp_local_chain(t->blocks, x, deep, err)
                          : sp_remote_chain_mb(t->rt, x, deep, train && t->pipe ? &t->route : NULL,
                                               train ? t->pipe : NULL, mb, err);
    if (h && P > 0)
        h = sp_slice_pos(h, P, P + T, err); /* the prefix goes before the final norm */
    float eps = t->rt->local->cfg.norm_eps;
    if (h) /* the family's final norm */
        h = t->norm_b ? sp_layernorm(h, t->norm, t->norm_b, eps, err) : sp_rmsnorm(h, t->norm, eps, err);
    if (!h)
        return NULL;
    if (t->C == 0) {
        sp_t *l = sp_linear(h, t->lm_head, NULL, err);
        int64_t s2[2] = {(int64_t)B * T, t->V};
        return l ? sp_reshape(l, 2, s2, err) : NULL;
    }
    int64_t *idx = malloc((size_t)B * sizeof *idx);
    for (int i = 0; idx && i < B; i++)
        idx[i] = b->last[i];
    sp_t *pooled = idx ? sp_pool_index(h, idx, err) : NULL;
    free(idx);
    /* training: a per-microbatch copy of the head, summed back in microbatch order (post_backward), so the
     * gradient does not depend on which microbatch's backward ran first */
    sp_t *score = t->score;
    if (pooled && train && !(score = t->rep_score[mb] = sp_input(t->g, 2, t->score->shape, t->score->data, 1,
                                                                  "score.weight")))
        return NULL;
    return pooled ? sp_linear(pooled, score, NULL, err) : NULL;
}

/* The task owns a batch's arrays until its next batch call; a microbatch keeps its own copy. */
static void batch_free(sepal_batch *b)
{
    free(b->ids), free(b->last), free(b->labels), free(b->values), free(b->targets);
    memset(b, 0, sizeof *b);
}

static int32_t *dup_i32(const int32_t *v, size_t n, int *fail)
{
    int32_t *d = v ? malloc(n * sizeof *d) : NULL;
    if (v && !d)
        *fail = 1;
    else if (v)
        memcpy(d, v, n * sizeof *d);
    return d;
}

static sp_status batch_copy(const sp_trainer *t, sepal_batch *dst, const sepal_batch *src, sp_err *err)
{
    int fail = 0, nl = t->C > 0 ? t->C : 1;
    size_t B = (size_t)src->B, BT = B * (size_t)src->T;
    *dst = (sepal_batch){.B = src->B, .T = src->T};
    dst->ids = dup_i32(src->ids, BT, &fail);
    dst->last = dup_i32(src->last, B, &fail);
    dst->labels = dup_i32(src->labels, B, &fail);
    dst->targets = dup_i32(src->targets, BT, &fail);
    if (src->values && (dst->values = malloc(B * nl * sizeof(float))))
        memcpy(dst->values, src->values, B * nl * sizeof(float));
    else if (src->values)
        fail = 1;
    if (fail) {
        batch_free(dst);
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    }
    return SP_OK;
}

static sp_status get_batch(sp_trainer *t, int split, const int *idx, int n, sepal_batch *b, sp_err *err)
{
    char msg[512] = "";
    memset(b, 0, sizeof *b);
    if (t->task->batch(t->task_ctx, split, idx, n, t->o.max_length, b, msg, sizeof msg))
        return sp_errf(err, SP_ERR_ARG, "task %s: %s", t->task->name, msg[0] ? msg : "cannot build a batch");
    return SP_OK;
}

static sp_status micro_forward_batch(sp_trainer *t, int mb, const sepal_batch *b, int n, int total, sp_err *err)
{
    t->loss[mb] = NULL;
    t->positions[mb] = 0;
    sp_t *logits = dev_loss(t) ? NULL : forward_logits(t, b, mb, 1, err);
    sp_t *loss = dev_loss(t) ? forward_dev(t, b, mb, 1, 1, err) : NULL;
    if (logits)
        loss = t->task->loss ? (sp_t *)t->task->loss(t->task_ctx, &t->host, (sepal_tensor *)logits, b)
                             : default_loss(t, logits, b, err);
    if (!loss && t->task->loss && logits && !(err && err->code))
        loss = NULL; /* the task ran its own backward (plugin.h allows it) */
    else if (!loss)
        return err && err->code ? err->code : sp_errf(err, SP_ERR_ARG, "task %s: no loss", t->task->name);
    t->loss[mb] = loss;
    t->batch_rows[mb] = b->B;
    t->positions[mb] = (long)b->B * (b->T + t->P);
    t->weight[mb] = (float)n / (float)total; /* mean over the whole batch */
    return SP_OK;
}

static sp_status micro_forward(sp_trainer *t, int mb, const int *idx, int n, int total, sp_err *err)
{
    sepal_batch tb, b;
    sp_status st = get_batch(t, SEPAL_SPLIT_TRAIN, idx, n, &tb, err);
    if (!st)
        st = batch_copy(t, &b, &tb, err);
    if (st)
        return st;
    st = micro_forward_batch(t, mb, &b, n, total, err);
    batch_free(&b);
    return st;
}

static sp_status micro_backward(sp_trainer *t, int mb, sp_err *err)
{
    if (!t->loss[mb]) /* the task already did it */
        return SP_OK;
    float g = t->weight[mb] * sp_optim_loss_scale(t->opt);
    return sp_backward(t->loss[mb], &g, err);
}

/* The post-backward work, once per step whoever called backward: the broadcast prompts' gradients are
 * summed over each microbatch's rows into the parameters. */
static void post_backward(sp_trainer *t)
{
    for (int mb = 0; mb < t->nmicro; mb++) {
        if (t->rep_prompts[mb])
            reduce_into(t->prompts, t->rep_prompts[mb], t->batch_rows[mb], 0);
        if (t->rep_deep[mb])
            reduce_into(t->deep, t->rep_deep[mb], t->batch_rows[mb], 1);
        if (t->rep_score[mb] && t->rep_score[mb]->grad) {
            if (!t->score->grad)
                t->score->grad = calloc((size_t)t->score->n, sizeof(float));
            for (int64_t i = 0; t->score->grad && i < t->score->n; i++)
                t->score->grad[i] += t->rep_score[mb]->grad[i];
        }
        t->rep_prompts[mb] = t->rep_deep[mb] = t->rep_score[mb] = NULL;
    }
    t->nmicro = 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* schedules */

/* One thread per microbatch of a pipelined step: its forward then its backward; every hop of its chain op
 * waits for the microbatch's turn on that stage, so the stages overlap in the schedule's order. */
typedef struct mb_job {
    sp_trainer *t;
    int mb, n, total, origin; /* origin: this microbatch failed first (the others were aborted) */
    const int *idx;
    sp_status st;
    sp_err err;
} mb_job;

static void *mb_run(void *arg)
{
    mb_job *j = arg;
    sp_trainer *t = j->t;
    j->err = (sp_err){0};
    j->st = sp_pipe_wait_turn(t->pipe, 0, 0, j->mb, &j->err); /* the bound on microbatches in flight */
    if (!j->st) {
        sp_graph_lock(t->g);
        j->st = micro_forward(t, j->mb, j->idx, j->n, j->total, &j->err);
        if (!j->st)
            j->st = micro_backward(t, j->mb, &j->err);
        sp_graph_unlock(t->g);
        j->origin = j->st != SP_OK;
    }
    if (j->st)
        sp_pipe_abort(t->pipe);
    else
        sp_pipe_finish(t->pipe, j->mb); /* stages its backward did not reach (head-only) move on */
    return NULL;
}

static sp_status run_pipelined(sp_trainer *t, const int *idx, int n, int M, const int *starts, float *loss,
                               sp_err *err)
{
    sp_status rst = sp_runtime_route_train(t->rt, &t->route, err); /* one route for the step: its stages */
    if (rst)
        return rst;
    sp_runtime_note_route(t->rt, &t->route);
    sp_pipe_free(t->pipe);
    t->pipe = sp_pipe_new(t->route.nstages, M, t->o.schedule == SP_SCHED_AFAB ? SP_PIPE_AFAB : SP_PIPE_1F1B,
                          t->o.max_in_flight);
    mb_job jobs[64];
    pthread_t th[64];
    int started[64] = {0};
    if (!t->pipe)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    sp_graph_set_shared(t->g, 1);
    for (int m = 0; m < M; m++) {
        jobs[m] = (mb_job){.t = t, .mb = m, .idx = idx + starts[m], .n = starts[m + 1] - starts[m], .total = n};
        started[m] = !pthread_create(&th[m], NULL, mb_run, &jobs[m]);
        if (!started[m]) {
            jobs[m].st = sp_errf(&jobs[m].err, SP_ERR_NOMEM, "cannot start a thread for microbatch %d", m);
            jobs[m].origin = 1;
            sp_pipe_abort(t->pipe);
        }
    }
    for (int m = 0; m < M; m++)
        if (started[m])
            pthread_join(th[m], NULL);
    sp_graph_set_shared(t->g, 0);
    t->nmicro = M;
    sp_status st = SP_OK;
    for (int m = 0; m < M && !st; m++) /* a Ctrl-C: the others were aborted because of it, whatever came first */
        if (jobs[m].st == SP_ERR_CANCELLED) {
            st = jobs[m].st;
            if (err)
                *err = jobs[m].err;
        }
    for (int m = 0; m < M && !st; m++) /* the first microbatch that failed by itself */
        if (jobs[m].st && jobs[m].origin) {
            st = jobs[m].st;
            if (err)
                *err = jobs[m].err;
            sp_err_prefix(err, "microbatch %d: ", m);
        }
    for (int m = 0; m < M && !st; m++)
        if (jobs[m].st) {
            st = jobs[m].st;
            if (err)
                *err = jobs[m].err;
        }
    *loss = 0;
    for (int m = 0; m < M && !st; m++)
        if (t->loss[m])
            *loss += t->weight[m] * t->loss[m]->data[0];
    post_backward(t);
    return st;
}

/* Runs forwards and backwards of the microbatches of idx[0..n) in the schedule's order: pipelined over the
 * route's servers (one thread per microbatch), or one after the other in this thread (the local baseline,
 * or a single microbatch). */
static sp_status run_schedule(sp_trainer *t, const int *idx, int n, float *loss, sp_err *err)
{
    int M = t->o.microbatches < n ? t->o.microbatches : n, starts[65], sizes[64];
    for (int m = 0; m <= M; m++)
        starts[m] = (int)((long)m * n / M);
    for (int m = 0; m < M; m++)
        sizes[m] = starts[m + 1] - starts[m];
    if (!t->blocks && M > 1)
        return run_pipelined(t, idx, n, M, starts, loss, err);
    int stages = 1; /* one microbatch (or the local baseline): no stages to fill */
    int warm = t->o.schedule == SP_SCHED_AFAB ? M : (stages < M ? stages : M);
    if (t->o.max_in_flight > 0 && warm > t->o.max_in_flight)
        warm = t->o.max_in_flight;
    int f = 0, bwd = 0;
    sp_status st = SP_OK;
    *loss = 0;
    while (!st && bwd < M) {
        if (f < M && f - bwd < warm) { /* forward while the window has room */
            st = micro_forward(t, f, idx + starts[f], sizes[f], n, err);
            f++;
        } else {
            st = micro_backward(t, bwd, err);
            if (!st && t->loss[bwd])
                *loss += t->weight[bwd] * t->loss[bwd]->data[0];
            bwd++;
        }
    }
    t->nmicro = f;
    post_backward(t);
    return st;
}

sp_status sp_trainer_grads(sp_trainer *t, const int *idx, int n, float *loss, sp_err *err)
{
    if (t->dev)
        return sp_errf(err, SP_ERR_UNSUPPORTED, "the gradients of training on the GPU stay there");
    for (int i = 0; i < t->nparams; i++)
        sp_zero_grad(t->params[i]);
    sp_status st = run_schedule(t, idx, n, loss, err);
    sp_graph_clear(t->g);
    return st;
}

sp_status sp_trainer_step(sp_trainer *t, const int *idx, int n, float *loss, sp_err *err)
{
    sp_status st = run_schedule(t, idx, n, loss, err);
    sp_graph_clear(t->g);
    int skipped;
    float norm = 0;
    if (!st && t->dev) /* the gradients the device's backward queued */
        st = sp_devparts_sync(t->dev, err);
    if (!st)
        st = sp_optim_step(t->opt, &skipped, &norm, err);
    t->grad_norm = norm;
    return st;
}

/* ---------------------------------------------------------------------------------------------- */
/* evaluation, the whole run */

typedef struct acc_state {
    long correct, n;
    double loss_sum;
    long tokens;
} acc_state;

/* The host's metrics: accuracy for classes, mean loss and perplexity for a causal LM. */
static void default_metrics(sp_trainer *t, acc_state *a, const sp_t *logits, const sepal_batch *b)
{
    if (t->C >= 2) {
        for (int i = 0; i < b->B; i++) {
            const float *l = logits->data + (size_t)i * t->C;
            int best = 0;
            for (int c = 1; c < t->C; c++)
                best = l[c] > l[best] ? c : best;
            a->correct += b->labels && best == b->labels[i];
            a->n++;
        }
    }
}

sp_status sp_trainer_eval(sp_trainer *t, char *buf, size_t cap, sp_err *err)
{
    int n = t->task->size(t->task_ctx, SEPAL_SPLIT_VALID), bs = t->o.batch;
    if (t->o.eval_batches > 0 && n > t->o.eval_batches * bs)
        n = t->o.eval_batches * bs;
    acc_state a = {0};
    if (t->task->metrics_reset)
        t->task->metrics_reset(t->task_ctx);
    int *idx = malloc((size_t)bs * sizeof *idx);
    sp_status st = idx ? SP_OK : sp_errf(err, SP_ERR_NOMEM, "out of memory");
    int nb = (n + bs - 1) / bs;
    for (int s = 0; !st && s < n; s += bs) {
        int k = n - s < bs ? n - s : bs;
        if (t->progress) {
            sp_train_event ev = {.eval_done = s / bs, .eval_total = nb};
            t->progress(&ev, t->progress_user);
        }
        if (cancelled(t)) {
            st = sp_errf(err, SP_ERR_CANCELLED, "validation stopped after %d of %d batches", s / bs, nb);
            break;
        }
        for (int i = 0; i < k; i++)
            idx[i] = s + i;
        sepal_batch b;
        st = get_batch(t, SEPAL_SPLIT_VALID, idx, k, &b, err);
        sp_t *logits = st ? NULL : forward_logits(t, &b, 0, 0, err);
        if (!st && !logits)
            st = err && err->code ? err->code : SP_ERR_IO;
        if (st == SP_ERR_CANCELLED) /* a wait the cancel ended: say so as between batches */
            st = sp_errf(err, SP_ERR_CANCELLED, "validation stopped after %d of %d batches", s / bs, nb);
        if (!st) {
            sp_t *l = default_loss(t, logits, &b, err);
            if (l) {
                a.loss_sum += l->data[0] * k;
                a.tokens += k;
            }
            if (t->task->metrics_add)
                t->task->metrics_add(t->task_ctx, logits->data, &b);
            else
                default_metrics(t, &a, logits, &b);
        }
        sp_graph_clear(t->g);
    }
    free(idx);
    if (st)
        return st;
    if (t->progress) {
        sp_train_event ev = {.eval_done = nb, .eval_total = nb};
        t->progress(&ev, t->progress_user);
    }
    char extra[256] = "";
    if (t->task->metrics_get)
        t->task->metrics_get(t->task_ctx, extra, sizeof extra);
    else if (t->C >= 2)
        snprintf(extra, sizeof extra, "accuracy=%.4f", a.n ? (double)a.correct / a.n : 0.0);
    double mean = a.tokens ? a.loss_sum / a.tokens : 0;
    if (!strncmp(extra, "loss=", 5) || strstr(extra, " loss=")) /* the task's own loss: said once */
        snprintf(buf, cap, "%s", extra);
    else
        snprintf(buf, cap, "%s%sloss=%.4f", extra, extra[0] ? " " : "", mean);
    return SP_OK;
}

static void shuffle(sp_rng *r, int *v, int n)
{
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(sp_rng_u32(r) % (uint32_t)(i + 1)), x = v[i];
        v[i] = v[j];
        v[j] = x;
    }
}

int sp_trainer_steps_planned(const sp_trainer *t)
{
    int n = t->task->size(t->task_ctx, SEPAL_SPLIT_TRAIN), bs = t->o.batch;
    int total = (n + bs - 1) / bs * t->o.epochs;
    return t->o.max_steps > 0 && total > t->o.max_steps ? t->o.max_steps : total;
}

sp_status sp_trainer_fit(sp_trainer *t, sp_train_cb cb, void *user, sp_err *err)
{
    int n = t->task->size(t->task_ctx, SEPAL_SPLIT_TRAIN), bs = t->o.batch;
    int total = sp_trainer_steps_planned(t), step = 0;
    int *order = malloc((size_t)(n > 0 ? n : 1) * sizeof *order);
    if (!order)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    sp_status st = SP_OK;
    for (int e = 0; !st && e < t->o.epochs && step < total; e++) {
        for (int i = 0; i < n; i++)
            order[i] = i;
        shuffle(&t->rng, order, n);
        for (int s = 0; !st && s < n && step < total; s += bs) {
            int k = n - s < bs ? n - s : bs;
            float loss, lr = sp_optim_lr(t->opt);
            if (cancelled(t)) {
                st = sp_errf(err, SP_ERR_CANCELLED, "stopped after step %d of %d", step, total);
                break;
            }
            double t0 = sp_now_s();
            memset(t->positions, 0, sizeof t->positions);
            if (t->rt) /* a Ctrl-C lets this step finish (a second one ends it, not applied) */
                sp_runtime_finish_steps(t->rt, 1);
            st = sp_trainer_step(t, order + s, k, &loss, err);
            if (t->rt)
                sp_runtime_finish_steps(t->rt, 0);
            if (st == SP_ERR_CANCELLED) {
                sp_errf(err, SP_ERR_CANCELLED, "stopped during step %d of %d (not applied)", step + 1, total);
                break;
            }
            step++;
            t->steps_done += !st;
            long pos = 0;
            for (int m = 0; m < 64; m++)
                pos += t->positions[m];
            if (!st && cb) {
                sp_train_event ev = {.epoch = e + 1, .step = step, .steps_total = total, .loss = loss, .lr = lr,
                                     .grad_norm = t->grad_norm, .tokens_per_s = (double)pos / (sp_now_s() - t0)};
                cb(&ev, user);
            }
        }
        char metrics[512];
        if (!st)
            st = sp_trainer_eval(t, metrics, sizeof metrics, err);
        if (!st && cb) {
            sp_train_event ev = {.epoch = e + 1, .step = step, .steps_total = total, .metrics = metrics};
            cb(&ev, user);
        }
    }
    free(order);
    if (t->dev) { /* the host's copy of the trained parameters */
        sp_status hs = sp_optim_to_host(t->opt, st ? NULL : err);
        st = st ? st : hs;
    }
    return st;
}

/* ---------------------------------------------------------------------------------------------- */
/* save / load */

sp_status sp_trainer_save(sp_trainer *t, const char *path, sp_err *err)
{
    sp_status hs = t->dev ? sp_optim_to_host(t->opt, err) : SP_OK;
    if (hs)
        return hs;
    sp_st_wtensor w[3];
    for (int i = 0; i < t->nparams; i++) {
        w[i] = (sp_st_wtensor){.name = t->params[i]->name, .dtype = SP_F32, .ndim = t->params[i]->ndim,
                               .data = t->params[i]->data};
        for (int d = 0; d < t->params[i]->ndim; d++)
            w[i].shape[d] = t->params[i]->shape[d];
    }
    char meta[512];
    snprintf(meta, sizeof meta,
             "{\"sepal\":\"prompt tuning\",\"task\":\"%s\",\"tuning\":\"%s\",\"pre_seq_len\":\"%d\","
             "\"model\":\"%s\",\"config\":\"%016llx\"}",
             t->task->name, t->o.tuning == SP_TUNE_DEEP ? "deep_ptune" : t->o.tuning == SP_TUNE_PTUNE ? "ptune" : "head",
             t->P, t->rt && t->rt->model_prefix[0] ? t->rt->model_prefix : "",
             (unsigned long long)(t->rt && t->rt->local ? t->rt->local->cfg.hash : 0));
    return sp_st_write(path, w, t->nparams, meta, err);
}

sp_status sp_params_info_read(const char *path, sp_params_info *out, sp_err *err)
{
    memset(out, 0, sizeof *out);
    sp_safetensors *st = NULL;
    sp_status s = sp_st_open(&st, path, err);
    if (s)
        return s;
    const char *task = sp_st_meta(st, "task"), *tuning = sp_st_meta(st, "tuning"), *p = sp_st_meta(st, "pre_seq_len");
    const char *model = sp_st_meta(st, "model"), *cfg = sp_st_meta(st, "config");
    if (task && tuning && p) {
        out->has_meta = 1;
        snprintf(out->task, sizeof out->task, "%s", task);
        out->tuning = !strcmp(tuning, "deep_ptune") ? SP_TUNE_DEEP : !strcmp(tuning, "ptune") ? SP_TUNE_PTUNE
                                                                                                : SP_TUNE_HEAD;
        out->pre_seq_len = atoi(p);
        snprintf(out->model, sizeof out->model, "%s", model ? model : "");
        out->config_hash = cfg ? strtoull(cfg, NULL, 16) : 0;
    }
    sp_st_close(st);
    return SP_OK;
}

sp_status sp_params_check_model(const char *path, const sp_params_info *info, const char *model,
                                unsigned long long config_hash, sp_err *err)
{
    if (info->config_hash && config_hash && info->config_hash != config_hash)
        return sp_errf(err, SP_ERR_ARG, "%s was trained for %s (config %016llx), not for the loaded %s (config %016llx)",
                       path, info->model[0] ? info->model : "another model", info->config_hash, model,
                       config_hash);
    return SP_OK;
}

sp_status sp_prompts_load(const char *path, int L, int H, float **shallow, float **deep, int *P, sp_err *err)
{
    *shallow = *deep = NULL;
    *P = 0;
    sp_safetensors *st = NULL;
    sp_status s = sp_st_open(&st, path, err);
    if (s)
        return s;
    const sp_st_tensor *sh = sp_st_has(st, "prompts") ? sp_st_get(st, "prompts", err) : NULL;
    if (!sh)
        s = sp_errf(err, SP_ERR_NOTFOUND, "%s holds no prompts (saved by train with --tuning head?)", path);
    else if (sh->ndim != 2 || sh->shape[1] != H || sh->shape[0] < 1 || sh->shape[0] > 1 << 20)
        s = sp_errf(err, SP_ERR_ARG, "%s: prompts are not [P, %d] for this model", path, H);
    int64_t ps[2] = {sh ? sh->shape[0] : 0, H}, ds[3] = {L, ps[0], H};
    if (!s && !(*shallow = malloc((size_t)ps[0] * H * sizeof(float))))
        s = sp_errf(err, SP_ERR_NOMEM, "out of memory");
    if (!s)
        s = sp_st_read_f32(st, "prompts", *shallow, 2, ps, err);
    if (!s && sp_st_has(st, "deep_prompts")) {
        if (!(*deep = malloc((size_t)L * ps[0] * H * sizeof(float))))
            s = sp_errf(err, SP_ERR_NOMEM, "out of memory");
        else
            s = sp_st_read_f32(st, "deep_prompts", *deep, 3, ds, err);
    }
    sp_st_close(st);
    if (s) {
        free(*shallow), free(*deep);
        *shallow = *deep = NULL;
        return s;
    }
    *P = (int)ps[0];
    return SP_OK;
}

sp_status sp_trainer_load(sp_trainer *t, const char *path, sp_err *err)
{
    sp_params_info info;
    sp_status s = sp_params_info_read(path, &info, err);
    if (!s && t->rt && t->rt->local)
        s = sp_params_check_model(path, &info, t->rt->model_prefix, t->rt->local->cfg.hash, err);
    if (s)
        return s;
    sp_safetensors *st = NULL;
    s = sp_st_open(&st, path, err);
    for (int i = 0; !s && i < t->nparams; i++)
        s = sp_st_read_f32(st, t->params[i]->name, t->params[i]->data, t->params[i]->ndim, t->params[i]->shape, err);
    sp_st_close(st);
    if (!s && t->dev)
        s = sp_optim_to_device(t->opt, err);
    return s;
}
