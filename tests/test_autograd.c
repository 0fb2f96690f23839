/* test_autograd.c - the client tape: every op's backward against central finite differences (the loss
 * summed in double from the f32 forward), a composite prompt-tuning graph, PyTorch's backward semantics
 * (non-scalar roots, accumulation over several backward calls, zero_grad, retain_grad, the hook), and the
 * remote chain (and sp_local_chain) against the local engine, including deep prompts and a batch split into
 * sub-batches. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd.h"
#include "block.h"
#include "model.h"
#include "rng.h"
#include "runtime.h"
#include "server.h"
#include "testutil.h"

#define GQA SEPAL_TEST_DATA "/hf-tiny/llama-gqa"
#define ROPE3 SEPAL_TEST_DATA "/hf-tiny/llama3-rope"

static sp_rng rng;

/* A leaf filled with normal values of standard deviation std. */
static sp_t *rand_leaf(sp_graph *g, int ndim, const int64_t *shape, float std, int rg, const char *name)
{
    sp_t *t = sp_leaf(g, ndim, shape, NULL, rg, name);
    ck_assert_ptr_nonnull(t);
    sp_rng_fill_normal(&rng, t->data, (long)t->n, std);
    return t;
}

/* ---------------------------------------------------------------------------------------------- */
/* finite differences */

typedef struct fd_case fd_case;
typedef sp_t *(*build_fn)(fd_case *c, sp_err *err);

struct fd_case {
    sp_graph *g;
    sp_t *p[6]; /* parameters (leaves that require grad) and constants, built into the graph by build */
    int np;
    const int32_t *ids;
    const int64_t *idx;
    const float *target;
    build_fn build;
    float *r; /* weights of a non-scalar output: the loss is sum(out * r) */
};

/* The loss in double from the f32 forward (a fresh graph each time). */
static double fd_eval(fd_case *c)
{
    sp_err err = {0};
    sp_graph_clear(c->g);
    sp_t *o = c->build(c, &err);
    ck_assert_msg(o != NULL, "%s", err.msg);
    if (!c->r)
        return o->data[0];
    double s = 0;
    for (int64_t i = 0; i < o->n; i++)
        s += (double)o->data[i] * c->r[i];
    return s;
}

/* Backward vs central differences for every element of every parameter; returns the worst relative error. */
static double fd_check(fd_case *c)
{
    sp_err err = {0};
    sp_graph_clear(c->g);
    for (int k = 0; k < c->np; k++)
        sp_zero_grad(c->p[k]);
    sp_t *o = c->build(c, &err);
    ck_assert_msg(o != NULL, "%s", err.msg);
    if (o->n > 1) {
        c->r = malloc((size_t)o->n * sizeof(float));
        sp_rng_fill_normal(&rng, c->r, (long)o->n, 1.0f);
    }
    ck_assert_msg(sp_backward(o, c->r, &err) == SP_OK, "%s", err.msg);
    double worst = 0, h = 1e-2;
    for (int k = 0; k < c->np; k++) {
        sp_t *p = c->p[k];
        if (!p->requires_grad)
            continue;
        ck_assert_ptr_nonnull(p->grad);
        float *an = malloc((size_t)p->n * sizeof(float));
        memcpy(an, p->grad, (size_t)p->n * sizeof(float));
        double scale = 1e-3, maxd = 0;
        for (int64_t i = 0; i < p->n; i++) {
            float orig = p->data[i];
            p->data[i] = orig + (float)h;
            double lp = fd_eval(c);
            p->data[i] = orig - (float)h;
            double lm = fd_eval(c);
            p->data[i] = orig;
            double num = (lp - lm) / (2 * h);
            scale = fmax(scale, fabs(num));
            maxd = fmax(maxd, fabs(num - an[i]));
        }
        free(an);
        worst = fmax(worst, maxd / scale);
    }
    free(c->r);
    c->r = NULL;
    return worst;
}

static void fd_assert(fd_case *c, const char *what)
{
    double e = fd_check(c);
    ck_assert_msg(e < 1e-3, "%s: backward differs from finite differences by %.3g (relative)", what, e);
    sp_graph_free(c->g);
}

/* ---------------------------------------------------------------------------------------------- */
/* each op */

static sp_t *b_embedding(fd_case *c, sp_err *err) { return sp_embedding(c->p[0], c->ids, 6, err); }

START_TEST(t_fd_embedding)
{
    fd_case c = {.g = sp_graph_new(), .np = 1, .build = b_embedding};
    static const int32_t ids[6] = {0, 3, 3, 6, 1, 3};
    c.ids = ids;
    c.p[0] = rand_leaf(c.g, 2, (int64_t[]){7, 5}, 1.0f, 1, "table");
    fd_assert(&c, "embedding");
}
END_TEST

static sp_t *b_concat(fd_case *c, sp_err *err)
{
    sp_t *cat = sp_concat_pos(c->p[0], c->p[1], err);
    sp_t *s = sp_slice_pos(cat, 1, 4, err);
    return sp_reshape(s, 2, (int64_t[]){2, 12}, err);
}

START_TEST(t_fd_concat_slice_reshape)
{
    fd_case c = {.g = sp_graph_new(), .np = 2, .build = b_concat};
    c.p[0] = rand_leaf(c.g, 3, (int64_t[]){2, 2, 4}, 1.0f, 1, "a");
    c.p[1] = rand_leaf(c.g, 3, (int64_t[]){2, 3, 4}, 1.0f, 1, "b");
    fd_assert(&c, "concat/slice/reshape");
}
END_TEST

static sp_t *b_rmsnorm(fd_case *c, sp_err *err) { return sp_rmsnorm(c->p[0], c->p[1], 1e-5f, err); }

START_TEST(t_fd_rmsnorm)
{
    fd_case c = {.g = sp_graph_new(), .np = 2, .build = b_rmsnorm};
    c.p[0] = rand_leaf(c.g, 3, (int64_t[]){2, 3, 8}, 1.0f, 1, "x");
    c.p[1] = rand_leaf(c.g, 1, (int64_t[]){8}, 1.0f, 1, "w");
    fd_assert(&c, "rmsnorm");
}
END_TEST

static sp_t *b_layernorm(fd_case *c, sp_err *err) { return sp_layernorm(c->p[0], c->p[1], c->p[2], 1e-5f, err); }

/* BLOOM's embedding LayerNorm and the LayerNorm families' final norm: input, weight and bias. */
START_TEST(t_fd_layernorm)
{
    int64_t xs[3] = {2, 3, 5}, ws[1] = {5};
    fd_case c = {.g = sp_graph_new(), .np = 3, .build = b_layernorm};
    c.p[0] = rand_leaf(c.g, 3, xs, 1.5f, 1, "x");
    c.p[1] = rand_leaf(c.g, 1, ws, 1.0f, 1, "w");
    c.p[2] = rand_leaf(c.g, 1, ws, 1.0f, 1, "b");
    sp_err err = {0}; /* a bias of another width is refused */
    int64_t bad[1] = {4};
    ck_assert_ptr_null(sp_layernorm(c.p[0], c.p[1], rand_leaf(c.g, 1, bad, 1.0f, 0, "b4"), 1e-5f, &err));
    ck_assert_ptr_nonnull(strstr(err.msg, "sp_layernorm"));
    fd_assert(&c, "layernorm"); /* frees the graph */
}
END_TEST

static sp_t *b_linear(fd_case *c, sp_err *err) { return sp_linear(c->p[0], c->p[1], c->p[2], err); }

START_TEST(t_fd_linear)
{
    for (int bias = 0; bias < 2; bias++) {
        fd_case c = {.g = sp_graph_new(), .np = 2 + bias, .build = b_linear};
        c.p[0] = rand_leaf(c.g, 3, (int64_t[]){2, 3, 6}, 1.0f, 1, "x");
        c.p[1] = rand_leaf(c.g, 2, (int64_t[]){4, 6}, 0.5f, 1, "W");
        if (bias)
            c.p[2] = rand_leaf(c.g, 1, (int64_t[]){4}, 0.5f, 1, "b");
        fd_assert(&c, bias ? "linear with bias" : "linear");
    }
}
END_TEST

static sp_t *b_pool(fd_case *c, sp_err *err)
{
    sp_t *p = sp_pool_index(c->p[0], c->idx, err);
    return sp_scale(sp_add(p, c->p[1], err), 0.7f, err);
}

START_TEST(t_fd_pool_add_scale)
{
    static const int64_t idx[3] = {0, -1, 2};
    fd_case c = {.g = sp_graph_new(), .np = 2, .build = b_pool, .idx = idx};
    c.p[0] = rand_leaf(c.g, 3, (int64_t[]){3, 4, 5}, 1.0f, 1, "x");
    c.p[1] = rand_leaf(c.g, 2, (int64_t[]){3, 5}, 1.0f, 1, "y");
    fd_assert(&c, "pool/add/scale");
}
END_TEST

static sp_t *b_ce(fd_case *c, sp_err *err) { return sp_cross_entropy(c->p[0], c->ids, err); }
static sp_t *b_mse(fd_case *c, sp_err *err) { return sp_mse(c->p[0], c->target, err); }
static sp_t *b_bce(fd_case *c, sp_err *err) { return sp_bce_logits(c->p[0], c->target, err); }

START_TEST(t_fd_losses)
{
    static const int32_t targets[5] = {1, -1, 6, 0, -1};
    fd_case c = {.g = sp_graph_new(), .np = 1, .build = b_ce, .ids = targets};
    c.p[0] = rand_leaf(c.g, 2, (int64_t[]){5, 7}, 2.0f, 1, "logits");
    fd_assert(&c, "cross-entropy");
    float t[12];
    for (int i = 0; i < 12; i++)
        t[i] = sp_rng_f32(&rng);
    build_fn fns[2] = {b_mse, b_bce};
    for (int k = 0; k < 2; k++) {
        fd_case d = {.g = sp_graph_new(), .np = 1, .build = fns[k], .target = t};
        d.p[0] = rand_leaf(d.g, 2, (int64_t[]){3, 4}, 2.0f, 1, "x");
        fd_assert(&d, k ? "bce with logits" : "mse");
    }
}
END_TEST

/* Values: cross-entropy is the mean over counted rows; all ignored gives 0; mse and bce by hand. */
START_TEST(t_loss_values)
{
    sp_graph *g = sp_graph_new();
    sp_err err = {0};
    sp_t *z = sp_leaf(g, 2, (int64_t[]){3, 4}, NULL, 1, "zeros");
    sp_t *ce = sp_cross_entropy(z, (const int32_t[]){2, -1, 0}, &err);
    ck_assert_double_eq_tol(ce->data[0], log(4.0), 1e-6);
    ck_assert_int_eq(ce->ndim, 0);
    ck_assert_int_eq(ce->n, 1);
    ck_assert_int_eq(sp_backward(ce, NULL, &err), SP_OK);
    /* row 0: (softmax - onehot) / 2 counted rows; row 1 ignored */
    ck_assert_double_eq_tol(z->grad[0], 0.25 / 2, 1e-7);
    ck_assert_double_eq_tol(z->grad[2], (0.25 - 1) / 2, 1e-7);
    ck_assert_float_eq(z->grad[4], 0.0f);
    sp_t *none = sp_cross_entropy(z, (const int32_t[]){-1, -1, -1}, &err);
    ck_assert_float_eq(none->data[0], 0.0f);
    float tg[12] = {0};
    tg[0] = 1.0f;
    sp_t *m = sp_mse(z, tg, &err);
    ck_assert_double_eq_tol(m->data[0], 1.0 / 12, 1e-7);
    sp_t *b = sp_bce_logits(z, tg, &err);
    ck_assert_double_eq_tol(b->data[0], log(2.0), 1e-6);
    ck_assert_ptr_null(sp_cross_entropy(z, (const int32_t[]){4, 0, 0}, &err));
    ck_assert_int_eq(err.code, SP_ERR_ARG);
    sp_graph_free(g);
}
END_TEST

/* embedding -> concat prompts -> rmsnorm -> linear -> pool -> cross-entropy */
static sp_t *b_composite(fd_case *c, sp_err *err)
{
    sp_t *e = sp_embedding(c->p[0], c->ids, 6, err);
    sp_t *x = sp_reshape(e, 3, (int64_t[]){2, 3, 8}, err);
    sp_t *h = sp_concat_pos(c->p[1], x, err);
    sp_t *n = sp_rmsnorm(h, c->p[2], 1e-5f, err);
    sp_t *l = sp_linear(n, c->p[3], c->p[4], err);
    sp_t *p = sp_pool_index(l, c->idx, err);
    return sp_cross_entropy(p, (const int32_t[]){1, 3}, err);
}

START_TEST(t_fd_composite)
{
    static const int32_t ids[6] = {4, 0, 10, 4, 7, 2};
    static const int64_t idx[2] = {3, -1};
    fd_case c = {.g = sp_graph_new(), .np = 5, .build = b_composite, .ids = ids, .idx = idx};
    c.p[0] = rand_leaf(c.g, 2, (int64_t[]){11, 8}, 1.0f, 1, "embed");
    c.p[1] = rand_leaf(c.g, 3, (int64_t[]){2, 2, 8}, 1.0f, 1, "prompts");
    c.p[2] = rand_leaf(c.g, 1, (int64_t[]){8}, 1.0f, 1, "norm");
    c.p[3] = rand_leaf(c.g, 2, (int64_t[]){4, 8}, 1.0f, 1, "score");
    c.p[4] = rand_leaf(c.g, 1, (int64_t[]){4}, 1.0f, 1, "bias");
    fd_assert(&c, "composite");
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* PyTorch semantics */

START_TEST(t_nonscalar_root)
{
    sp_graph *g = sp_graph_new();
    sp_err err = {0};
    sp_t *x = rand_leaf(g, 2, (int64_t[]){2, 3}, 1.0f, 1, "x");
    sp_t *y = sp_scale(x, 3.0f, &err);
    ck_assert_int_eq(sp_backward(y, NULL, &err), SP_ERR_ARG);
    ck_assert_str_eq(err.msg, "backward of a non-scalar tensor [2, 3] needs a gradient");
    ck_assert_ptr_null(x->grad);
    float gr[6] = {1, -2, 3, 0.5f, 0, 7};
    ck_assert_int_eq(sp_backward(y, gr, &err), SP_OK); /* the gradient of sum(y * gr) */
    for (int i = 0; i < 6; i++)
        ck_assert_float_eq(x->grad[i], 3.0f * gr[i]);
    /* a root no parameter reaches */
    sp_t *c = rand_leaf(g, 1, (int64_t[]){1}, 1.0f, 0, "const");
    ck_assert_int_eq(sp_backward(sp_scale(c, 2.0f, &err), NULL, &err), SP_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(err.msg, "does not require grad"));
    /* a parameter as the root */
    sp_zero_grad(x);
    ck_assert_int_eq(sp_backward(x, gr, &err), SP_OK);
    for (int i = 0; i < 6; i++)
        ck_assert_float_eq(x->grad[i], gr[i]);
    sp_graph_free(g);
}
END_TEST

typedef struct two_loss {
    sp_graph *g;
    sp_t *x, *W, *b, *l1, *l2;
} two_loss;

/* A small model with two losses on a shared hidden layer. */
static void two_losses(two_loss *m)
{
    sp_err err = {0};
    sp_graph_clear(m->g);
    sp_t *h = sp_linear(m->x, m->W, m->b, &err);
    static const float tgt[12] = {0.1f, 0.2f, -0.3f, 0.4f, 0.5f, 0.6f, 0.7f, -0.8f, 0.9f, 1.0f, 1.1f, 1.2f};
    m->l1 = sp_mse(h, tgt, &err);
    m->l2 = sp_cross_entropy(h, (const int32_t[]){0, 3, -1}, &err);
    ck_assert_msg(m->l1 && m->l2, "%s", err.msg);
}

static float *grads_copy(two_loss *m)
{
    sp_t *p[2] = {m->W, m->b};
    float *c = malloc((24 + 4) * sizeof(float));
    memcpy(c, p[0]->grad, 24 * sizeof(float));
    memcpy(c + 24, p[1]->grad, 4 * sizeof(float));
    return c;
}

START_TEST(t_accumulate)
{
    two_loss m = {.g = sp_graph_new()};
    sp_err err = {0};
    m.x = rand_leaf(m.g, 2, (int64_t[]){3, 6}, 1.0f, 0, "x");
    m.W = rand_leaf(m.g, 2, (int64_t[]){4, 6}, 1.0f, 1, "W");
    m.b = rand_leaf(m.g, 1, (int64_t[]){4}, 1.0f, 1, "b");
    two_losses(&m);
    ck_assert_int_eq(sp_backward(m.l1, NULL, &err), SP_OK);
    ck_assert_int_eq(sp_backward(m.l2, NULL, &err), SP_OK);
    float *sep = grads_copy(&m);
    ck_assert_ptr_null(m.x->grad); /* a constant gets no gradient */
    /* the sum built from the model's losses after the fact */
    sp_zero_grad(m.W), sp_zero_grad(m.b);
    ck_assert_float_eq(m.W->grad[0], 0.0f);
    sp_t *sum = sp_add(m.l1, m.l2, &err);
    ck_assert_int_eq(sp_backward(sum, NULL, &err), SP_OK);
    float *joint = grads_copy(&m);
    ck_assert_double_le(sp_max_abs_diff(sep, joint, 28), 1e-6);
    /* the same loss twice: twice the gradient; the graph stays usable */
    ck_assert_int_eq(sp_backward(sum, NULL, &err), SP_OK);
    for (int i = 0; i < 24; i++)
        ck_assert_double_eq_tol(m.W->grad[i], 2 * joint[i], 1e-6);
    /* after clear, parameters and their grads stay; a new graph works */
    sp_graph_clear(m.g);
    for (int i = 0; i < 24; i++)
        ck_assert_double_eq_tol(m.W->grad[i], 2 * joint[i], 1e-6);
    sp_zero_grad(m.W), sp_zero_grad(m.b);
    two_losses(&m);
    ck_assert_int_eq(sp_backward(sp_add(m.l1, m.l2, &err), NULL, &err), SP_OK);
    float *again = grads_copy(&m);
    ck_assert_double_le(sp_max_abs_diff(again, joint, 28), 1e-6);
    free(sep), free(joint), free(again);
    sp_graph_free(m.g);
}
END_TEST

START_TEST(t_retain_grad)
{
    sp_graph *g = sp_graph_new();
    sp_err err = {0};
    sp_t *x = rand_leaf(g, 2, (int64_t[]){2, 3}, 1.0f, 0, "x");
    sp_t *W = rand_leaf(g, 2, (int64_t[]){4, 3}, 1.0f, 1, "W");
    sp_t *h = sp_linear(x, W, NULL, &err), *h2 = sp_scale(h, 2.0f, &err);
    h2->retain_grad = 1;
    float tgt[8] = {0};
    sp_t *l = sp_mse(h2, tgt, &err);
    ck_assert_int_eq(sp_backward(l, NULL, &err), SP_OK);
    ck_assert_ptr_null(h->grad); /* intermediate without retain_grad */
    ck_assert_ptr_nonnull(h2->grad);
    for (int i = 0; i < 8; i++)
        ck_assert_double_eq_tol(h2->grad[i], 2.0 * h2->data[i] / 8, 1e-6);
    ck_assert_int_eq(sp_backward(l, NULL, &err), SP_OK);
    for (int i = 0; i < 8; i++)
        ck_assert_double_eq_tol(h2->grad[i], 4.0 * h2->data[i] / 8, 1e-6);
    sp_graph_free(g);
}
END_TEST

/* An external op (sp_external) that is 3 x elsewhere: its backward adds 3 gout; its context counts frees. */
typedef struct ext_ctx {
    int64_t n;
    int freed;
} ext_ctx;

static sp_status ext_backward(void *p, const float *gout, float **gin, sp_err *err)
{
    (void)err;
    ext_ctx *c = p;
    for (int64_t i = 0; gin[0] && i < c->n; i++)
        gin[0][i] += 3.0f * gout[i];
    return SP_OK;
}

static void ext_free(void *p) { ((ext_ctx *)p)->freed++; }

static const sp_ext_fn ext_fn = {ext_backward, ext_free};

START_TEST(t_external)
{
    sp_graph *g = sp_graph_new(), *other = sp_graph_new();
    sp_err err = {0};
    sp_t *x = rand_leaf(g, 2, (int64_t[]){2, 3}, 1.0f, 0, "x");
    sp_t *W = rand_leaf(g, 2, (int64_t[]){4, 3}, 1.0f, 1, "W");
    float tgt[8] = {0.5f, -1, 2, 0, 1, 1, -2, 0.25f}, y[8];
    /* the reference: mse(3 (x W^T)) */
    sp_t *h = sp_linear(x, W, NULL, &err);
    ck_assert_int_eq(sp_backward(sp_mse(sp_scale(h, 3.0f, &err), tgt, &err), NULL, &err), SP_OK);
    float ref[12];
    memcpy(ref, W->grad, sizeof ref);
    sp_zero_grad(W);
    for (int i = 0; i < 8; i++)
        y[i] = 3.0f * h->data[i];
    ext_ctx c = {.n = 8};
    sp_t *e = sp_external(g, 2, h->shape, y, h, NULL, &ext_fn, &c, &err);
    ck_assert_ptr_nonnull(e);
    ck_assert(e->requires_grad);
    ck_assert_float_eq(e->data[7], y[7]);
    ck_assert_int_eq(sp_backward(sp_mse(e, tgt, &err), NULL, &err), SP_OK);
    ck_assert_double_le(sp_max_abs_diff(W->grad, ref, 12), 1e-6);
    /* no input that requires grad: a constant; the graph frees each context once, at its clear */
    ext_ctx c2 = {.n = 8};
    ck_assert(!sp_external(g, 2, h->shape, NULL, NULL, NULL, &ext_fn, &c2, &err)->requires_grad);
    ck_assert_int_eq(c.freed + c2.freed, 0);
    sp_graph_clear(g);
    ck_assert_int_eq(c.freed, 1);
    ck_assert_int_eq(c2.freed, 1);
    /* an input of another graph: refused, and the context freed at once */
    ext_ctx c3 = {.n = 8};
    sp_t *o = rand_leaf(other, 1, (int64_t[]){8}, 1.0f, 1, "o");
    ck_assert_ptr_null(sp_external(g, 1, o->shape, NULL, o, NULL, &ext_fn, &c3, &err));
    ck_assert_int_eq(err.code, SP_ERR_ARG);
    ck_assert_int_eq(c3.freed, 1);
    sp_graph_free(g);
    sp_graph_free(other);
}
END_TEST

static void count_hook(sp_graph *g, void *user)
{
    (void)g;
    ++*(int *)user;
}

START_TEST(t_hook_and_errors)
{
    sp_graph *g = sp_graph_new();
    int calls = 0;
    sp_graph_on_backward(g, count_hook, &calls);
    sp_err err = {0};
    sp_t *x = rand_leaf(g, 2, (int64_t[]){2, 3}, 1.0f, 1, "x");
    float tgt[6] = {0};
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(sp_backward(sp_mse(x, tgt, &err), NULL, &err), SP_OK);
    ck_assert_int_eq(calls, 3);
    /* shape errors: NULL and a message; a NULL input propagates */
    sp_t *y = rand_leaf(g, 2, (int64_t[]){3, 2}, 1.0f, 1, "y");
    ck_assert_ptr_null(sp_add(x, y, &err));
    ck_assert_int_eq(err.code, SP_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(err.msg, "[2, 3] and [3, 2]"));
    ck_assert_ptr_null(sp_scale(sp_add(x, y, &err), 2.0f, &err));
    ck_assert_ptr_nonnull(strstr(err.msg, "sp_add"));
    ck_assert_ptr_null(sp_embedding(x, (const int32_t[]){2}, 1, &err));
    ck_assert_ptr_nonnull(strstr(err.msg, "outside"));
    ck_assert_ptr_null(sp_linear(x, y, NULL, &err));
    ck_assert_ptr_null(sp_slice_pos(x, 0, 1, &err));
    ck_assert_ptr_null(sp_reshape(x, 1, (int64_t[]){5}, &err));
    ck_assert_int_eq(calls, 3);
    sp_graph_free(g);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* the remote chain */

static sp_server *srv[2];

static sp_server *start(const char *dir, int a, int b)
{
    sp_server_opts o;
    sp_server_opts_default(&o);
    o.model_dir = dir;
    o.start = a;
    o.end = b;
    o.measure = 0;
    sp_server *s = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_server_start(&s, &o, &err) == SP_OK, "%s", err.msg);
    return s;
}

/* A runtime with dir's local parts, connected to servers [0, split) and [split, L). */
static sp_runtime *swarm(const char *dir, int split, int L)
{
    srv[0] = start(dir, 0, split);
    srv[1] = start(dir, split, L);
    sp_runtime *rt = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_runtime_new(&rt, NULL, NULL, &err), SP_OK);
    ck_assert_msg(sp_runtime_load(rt, dir, &err) == SP_OK, "%s", err.msg);
    char addrs[128];
    snprintf(addrs, sizeof addrs, "127.0.0.1:%d,127.0.0.1:%d", sp_server_port(srv[0]), sp_server_port(srv[1]));
    ck_assert_msg(sp_runtime_connect(rt, addrs, &err) == SP_OK, "%s", err.msg);
    ck_assert_int_eq(sp_test_route_hops(rt), 2);
    return rt;
}

static void swarm_down(sp_runtime *rt)
{
    sp_runtime_free(rt);
    for (int i = 0; i < 2; i++) {
        sp_server_stop(srv[i]);
        srv[i] = NULL;
    }
}

typedef struct chain_ref {
    int B, T, P, H, L;
    const float *x, *dp, *g; /* input [B,T,H], prompts [L,B,P,H] (or NULL), output grad [B,T,H] */
    float *y, *gx, *gdp;     /* results */
} chain_ref;

static void add_prompt(float *h, const float *p, const chain_ref *c, float *gout)
{
    for (int b = 0; b < c->B; b++)
        for (int i = 0; i < c->P * c->H; i++) {
            if (gout)
                gout[(size_t)b * c->P * c->H + i] = h[(size_t)b * c->T * c->H + i];
            else
                h[(size_t)b * c->T * c->H + i] += p[(size_t)b * c->P * c->H + i];
        }
}

/* The local engine: every block in one process, prompt i added to the first P positions entering block i. */
static void local_chain(sp_model *m, chain_ref *c)
{
    sp_err err = {0};
    size_t N = (size_t)c->B * c->T * c->H, NP = (size_t)c->B * c->P * c->H;
    float *acts = malloc(N * c->L * sizeof(float));
    sp_ws ws = {0};
    memcpy(c->y, c->x, N * sizeof(float));
    for (int i = 0; i < c->L; i++) {
        if (c->dp)
            add_prompt(c->y, c->dp + i * NP, c, NULL);
        memcpy(acts + i * N, c->y, N * sizeof(float));
        ck_assert_int_eq(sp_block_forward(&m->blocks[i], c->y, acts + i * N, c->B, c->T, 0, NULL, &ws, &err), SP_OK);
    }
    memcpy(c->gx, c->g, N * sizeof(float));
    for (int i = c->L - 1; i >= 0; i--) {
        ck_assert_int_eq(sp_block_backward(&m->blocks[i], c->gx, c->gx, acts + i * N, c->B, c->T, 0, NULL, &ws,
                                                 &err), SP_OK);
        if (c->dp)
            add_prompt(c->gx, NULL, c, c->gdp + i * NP);
    }
    free(acts);
    sp_ws_free(&ws);
}

/* sp_local_chain on copies of x and the prompts equals the reference too. */
static void local_op_vs_ref(sp_model *m, const sp_t *x, const sp_t *dp, const float *gr, const chain_ref *c,
                            double tol)
{
    sp_graph *g = sp_graph_new();
    sp_err err = {0};
    sp_t *lx = sp_leaf(g, 3, x->shape, x->data, 1, "x");
    sp_t *ldp = dp ? sp_leaf(g, 4, dp->shape, dp->data, 1, "deep prompts") : NULL;
    sp_t *y = sp_local_chain(m, lx, ldp, &err);
    ck_assert_msg(y != NULL, "%s", err.msg);
    ck_assert_msg(sp_backward(y, gr, &err) == SP_OK, "%s", err.msg);
    ck_assert_double_le(sp_max_abs_diff(y->data, c->y, (size_t)x->n), tol);
    ck_assert_double_le(sp_max_abs_diff(lx->grad, c->gx, (size_t)x->n), tol);
    if (dp)
        ck_assert_double_le(sp_max_abs_diff(ldp->grad, c->gdp, (size_t)dp->n), tol);
    sp_graph_free(g);
}

/* sp_remote_chain forward and backward over a 2-server swarm vs the local engine; sp_local_chain too. */
static void chain_vs_local(const char *dir, int split, int L, int B, int T, int P, double tol)
{
    sp_runtime *rt = swarm(dir, split, L);
    sp_graph *g = sp_graph_new();
    sp_err err = {0};
    int H = sp_runtime_config(rt)->hidden;
    sp_t *x = rand_leaf(g, 3, (int64_t[]){B, T, H}, 1.0f, 1, "x");
    sp_t *dp = P ? rand_leaf(g, 4, (int64_t[]){L, B, P, H}, 0.5f, 1, "deep prompts") : NULL;
    sp_t *y = sp_remote_chain(rt, x, dp, &err);
    ck_assert_msg(y != NULL, "%s", err.msg);
    size_t N = (size_t)x->n;
    float *gr = malloc(N * sizeof(float));
    sp_rng_fill_normal(&rng, gr, (long)N, 1.0f);
    ck_assert_msg(sp_backward(y, gr, &err) == SP_OK, "%s", err.msg);
    chain_ref c = {.B = B, .T = T, .P = P, .H = H, .L = L, .x = x->data, .dp = dp ? dp->data : NULL, .g = gr};
    c.y = malloc(N * sizeof(float)), c.gx = malloc(N * sizeof(float));
    c.gdp = dp ? malloc((size_t)dp->n * sizeof(float)) : NULL;
    sp_model *m = NULL;
    ck_assert_msg(sp_model_load(&m, dir, SP_LOAD_BLOCKS, 0, -1, &err) == SP_OK, "%s", err.msg);
    local_chain(m, &c);
    ck_assert_double_le(sp_max_abs_diff(y->data, c.y, N), tol);
    ck_assert_double_le(sp_max_abs_diff(x->grad, c.gx, N), tol);
    if (dp)
        ck_assert_double_le(sp_max_abs_diff(dp->grad, c.gdp, (size_t)dp->n), tol);
    local_op_vs_ref(m, x, dp, gr, &c, tol);
    sp_model_free(m);
    free(gr), free(c.y), free(c.gx), free(c.gdp);
    sp_graph_free(g);
    swarm_down(rt);
}

START_TEST(t_chain_equals_local)
{
    chain_vs_local(GQA, 2, 4, 2, 5, 2, 1e-5);
    chain_vs_local(GQA, 2, 4, 3, 4, 0, 1e-5);
}
END_TEST

/* B = 6, T = 300: 1800 tokens, sub-batches of 3 rows run concurrently; equal to the unsplit computation
 * (llama3-rope: its context holds 300 positions). */
START_TEST(t_chain_sub_batches)
{
    chain_vs_local(ROPE3, 1, 3, 6, 300, 3, 1e-5);
}
END_TEST

/* Shape errors, and a chain over constants (no gradient needed: no boundaries kept). */
START_TEST(t_chain_errors)
{
    sp_runtime *rt = swarm(GQA, 2, 4);
    sp_graph *g = sp_graph_new();
    sp_err err = {0};
    sp_t *bad = rand_leaf(g, 3, (int64_t[]){2, 3, 5}, 1.0f, 1, "x");
    ck_assert_ptr_null(sp_remote_chain(rt, bad, NULL, &err));
    ck_assert_ptr_nonnull(strstr(err.msg, "[2, 3, 5]"));
    sp_t *x = rand_leaf(g, 3, (int64_t[]){2, 3, 64}, 1.0f, 0, "x");
    sp_t *dp = rand_leaf(g, 4, (int64_t[]){4, 2, 4, 64}, 1.0f, 1, "dp"); /* P > T */
    ck_assert_ptr_null(sp_remote_chain(rt, x, dp, &err));
    ck_assert_int_eq(err.code, SP_ERR_ARG);
    /* constants only: no gradient is needed, the output does not require grad */
    sp_t *y = sp_remote_chain(rt, x, NULL, &err);
    ck_assert_ptr_nonnull(y);
    ck_assert_int_eq(y->requires_grad, 0);
    sp_graph_free(g);
    swarm_down(rt);
}
END_TEST

int main(void)
{
    sp_rng_seed(&rng, 20240611);
    Suite *s = suite_create("autograd");
    TCase *ops = tcase_create("ops");
    tcase_add_test(ops, t_fd_embedding);
    tcase_add_test(ops, t_fd_concat_slice_reshape);
    tcase_add_test(ops, t_fd_rmsnorm);
    tcase_add_test(ops, t_fd_layernorm);
    tcase_add_test(ops, t_fd_linear);
    tcase_add_test(ops, t_fd_pool_add_scale);
    tcase_add_test(ops, t_fd_losses);
    tcase_add_test(ops, t_loss_values);
    tcase_add_test(ops, t_fd_composite);
    suite_add_tcase(s, ops);
    TCase *sem = tcase_create("semantics");
    tcase_add_test(sem, t_nonscalar_root);
    tcase_add_test(sem, t_accumulate);
    tcase_add_test(sem, t_retain_grad);
    tcase_add_test(sem, t_hook_and_errors);
    tcase_add_test(sem, t_external);
    suite_add_tcase(s, sem);
    TCase *chain = tcase_create("chain");
    tcase_set_timeout(chain, 240);
    tcase_add_test(chain, t_chain_equals_local);
    tcase_add_test(chain, t_chain_sub_batches);
    tcase_add_test(chain, t_chain_errors);
    suite_add_tcase(s, chain);
    return sp_test_run(s);
}
