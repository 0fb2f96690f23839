/* autograd.c - the tape: an arena of tensors and nodes, each op's forward (which records a node holding
 * what its backward needs) and backward, and sp_backward, which walks the nodes reachable from a root in
 * reverse creation order. Gradients of intermediates live only during one backward call (node->gout);
 * leaves (and retain_grad tensors) accumulate into .grad. */
#include "autograd.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "ops.h"
#include "parts.h"
#include "swarm.h"

#define CHAIN_MAX_TOKENS 1024 /* tokens per sub-batch of the remote chain (Petals' MAX_TOKENS_IN_BATCH) */

typedef enum {
    OP_EMBED,
    OP_CONCAT,
    OP_SLICE,
    OP_RESHAPE,
    OP_RMSNORM,
    OP_LAYERNORM,
    OP_LINEAR,
    OP_POOL,
    OP_ADD,
    OP_SCALE,
    OP_CE,
    OP_MSE,
    OP_BCE,
    OP_CHAIN,
    OP_LOCAL,
    OP_EXT,
} op_kind;

/* What the remote chain's backward needs: the route each sub-batch ran over (with the servers that
 * replaced failed ones, and the ids of the activations they keep), the hidden state entering each of its
 * stages, and the deep prompts, laid out sub-batch after sub-batch. */
typedef struct chain_saved {
    sp_runtime *rt;
    int B, T, P, H, L, bsub, nsub;
    sp_route *routes; /* one per sub-batch */
    float *bound;     /* sub-batch k: routes[k].nstages x [bs, T, H] at boff[k] */
    size_t *boff;
    float *prompts;   /* sub-batch k: [L, bs, P, H] at L * b0 * P * H; NULL: no deep prompts */
    sp_pipe *pipe;    /* a pipelined microbatch's pipe and index (sp_remote_chain_mb), or NULL */
    int mb;
} chain_saved;

static void chain_saved_free(chain_saved *cs)
{
    if (!cs)
        return;
    free(cs->routes);
    free(cs->boff);
    free(cs->bound);
    free(cs->prompts);
    free(cs);
}

struct sp_node {
    op_kind op;
    sp_t *out;
    sp_t *in[3];
    int nin;
    float f;       /* rmsnorm eps, scale factor */
    int64_t a, b;  /* slice range; counted elements of a loss */
    float *saved;  /* rmsnorm rstd, layernorm mean and rstd, mse/bce targets */
    int32_t *ids;  /* embedding ids, cross-entropy targets */
    int64_t *idx;  /* pooled positions */
    chain_saved *chain;
    sp_model *model; /* local chain: the blocks; saved holds the input of each block */
    sp_block_acts *bacts; /* local chain: each block's activations, for a backward without recompute */
    int nbacts;
    const sp_ext_fn *ext; /* an external op (sp_external): its backward and free, and their context */
    void *ext_ctx;
    float *gout;   /* gradient w.r.t. out during one backward call */
    unsigned mark; /* reachable from the current root */
};

typedef struct tlist {
    sp_t **v;
    int n, cap;
} tlist;

struct sp_graph {
    pthread_mutex_t mu; /* held by the threads building on a shared graph; the chain ops drop it to wait */
    int shared;
    sp_block_acts *pool; /* activation buffers of freed local chain nodes, for the next step's */
    int npool, cappool;
    tlist leaves, temps;
    sp_node **nodes;
    int nn, capn;
    unsigned stamp;
    void (*hook)(sp_graph *g, void *user);
    void *user;
};

/* ---------------------------------------------------------------------------------------------- */
/* arena */

typedef struct shape_text {
    char s[80];
} shape_text;

static shape_text shp(const sp_t *t)
{
    shape_text r = {"["};
    for (int i = 0; i < t->ndim; i++)
        snprintf(r.s + strlen(r.s), sizeof r.s - strlen(r.s), "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    snprintf(r.s + strlen(r.s), sizeof r.s - strlen(r.s), "]");
    return r;
}

static const char *tname(const sp_t *t) { return t->name ? t->name : "tensor"; }

static sp_status nomem(sp_err *err, const char *what) { return sp_errf(err, SP_ERR_NOMEM, "%s: out of memory", what); }

static int tlist_push(tlist *l, sp_t *t)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        sp_t **v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v)
            return -1;
        l->v = v, l->cap = cap;
    }
    l->v[l->n++] = t;
    return 0;
}

static int node_push(sp_graph *g, sp_node *nd)
{
    if (g->nn == g->capn) {
        int cap = g->capn ? 2 * g->capn : 16;
        sp_node **v = realloc(g->nodes, (size_t)cap * sizeof *v);
        if (!v)
            return -1;
        g->nodes = v, g->capn = cap;
    }
    g->nodes[g->nn++] = nd;
    return 0;
}

static void tensor_free(sp_t *t)
{
    if (!t)
        return;
    free(t->data);
    free(t->grad);
    free((char *)t->name);
    free(t);
}

/* A freed node's activation buffers go back to the graph for the next step (no fresh pages each step). */
static void pool_put(sp_graph *g, sp_block_acts *a)
{
    if (!a->buf)
        return;
    if (g && g->npool == g->cappool) {
        int cap = g->cappool ? 2 * g->cappool : 16;
        sp_block_acts *p = realloc(g->pool, (size_t)cap * sizeof *p);
        if (p)
            g->pool = p, g->cappool = cap;
    }
    if (g && g->npool < g->cappool)
        g->pool[g->npool++] = *a;
    else
        sp_block_acts_free(a);
    memset(a, 0, sizeof *a);
}

static void node_free(sp_graph *g, sp_node *nd)
{
    chain_saved_free(nd->chain);
    if (nd->ext && nd->ext->free)
        nd->ext->free(nd->ext_ctx);
    for (int i = 0; i < nd->nbacts; i++)
        pool_put(g, &nd->bacts[i]);
    free(nd->bacts);
    free(nd->saved);
    free(nd->ids);
    free(nd->idx);
    free(nd->gout);
    free(nd);
}

/* A zero-filled tensor in g (a leaf or an op's output). ndim 0 is a scalar. */
static sp_t *tensor_new(sp_graph *g, int ndim, const int64_t *shape, int leaf, sp_err *err)
{
    if (ndim < 0 || ndim > 4) {
        sp_errf(err, SP_ERR_ARG, "a tensor has 0 to 4 dimensions, not %d", ndim);
        return NULL;
    }
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 1 || shape[i] > INT_MAX || n > INT_MAX / shape[i]) {
            sp_errf(err, SP_ERR_ARG, "dimension %d of a tensor is %lld (1 .. %d elements in all)", i,
                    (long long)shape[i], INT_MAX);
            return NULL;
        }
        n *= shape[i];
    }
    sp_t *t = calloc(1, sizeof *t);
    if (t)
        t->data = calloc((size_t)n, sizeof(float));
    if (!t || !t->data || tlist_push(leaf ? &g->leaves : &g->temps, t)) {
        tensor_free(t);
        nomem(err, "new tensor");
        return NULL;
    }
    t->ndim = ndim;
    if (ndim)
        memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    t->n = n;
    t->g = g;
    return t;
}

sp_graph *sp_graph_new(void)
{
    sp_graph *g = calloc(1, sizeof(sp_graph));
    if (g)
        pthread_mutex_init(&g->mu, NULL);
    return g;
}

void sp_graph_set_shared(sp_graph *g, int on) { g->shared = on != 0; }
void sp_graph_lock(sp_graph *g) { pthread_mutex_lock(&g->mu); }
void sp_graph_unlock(sp_graph *g) { pthread_mutex_unlock(&g->mu); }

/* The chain ops wait for servers without the graph's lock when threads share it. */
static void graph_release(sp_graph *g)
{
    if (g->shared)
        pthread_mutex_unlock(&g->mu);
}
static void graph_reacquire(sp_graph *g)
{
    if (g->shared)
        pthread_mutex_lock(&g->mu);
}

void sp_graph_counts(const sp_graph *g, int *leaves, int *temps, int *nodes)
{
    *leaves = g->leaves.n;
    *temps = g->temps.n;
    *nodes = g->nn;
}

void sp_graph_clear(sp_graph *g)
{
    if (!g)
        return;
    for (int i = 0; i < g->nn; i++)
        node_free(g, g->nodes[i]);
    g->nn = 0;
    for (int i = 0; i < g->temps.n; i++)
        tensor_free(g->temps.v[i]);
    g->temps.n = 0;
}

void sp_graph_free(sp_graph *g)
{
    if (!g)
        return;
    sp_graph_clear(g);
    for (int i = 0; i < g->leaves.n; i++)
        tensor_free(g->leaves.v[i]);
    free(g->leaves.v);
    free(g->temps.v);
    free(g->nodes);
    for (int i = 0; i < g->npool; i++)
        sp_block_acts_free(&g->pool[i]);
    free(g->pool);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

void sp_graph_on_backward(sp_graph *g, void (*hook)(sp_graph *g, void *user), void *user)
{
    g->hook = hook;
    g->user = user;
}

static sp_t *leaf_new(sp_graph *g, int ndim, const int64_t *shape, const float *data, int requires_grad,
                      const char *name, int kept)
{
    if (!g || (ndim && !shape))
        return NULL;
    sp_t *t = tensor_new(g, ndim, shape, kept, NULL);
    if (!t)
        return NULL;
    if (data)
        memcpy(t->data, data, (size_t)t->n * sizeof(float));
    t->requires_grad = requires_grad != 0;
    if (name && !(t->name = strdup(name))) {
        if (kept)
            g->leaves.n--;
        else
            g->temps.n--;
        tensor_free(t);
        return NULL;
    }
    return t;
}

sp_t *sp_leaf(sp_graph *g, int ndim, const int64_t *shape, const float *data, int requires_grad, const char *name)
{
    return leaf_new(g, ndim, shape, data, requires_grad, name, 1);
}

sp_t *sp_input(sp_graph *g, int ndim, const int64_t *shape, const float *data, int requires_grad, const char *name)
{
    return leaf_new(g, ndim, shape, data, requires_grad, name, 0);
}

void sp_zero_grad(sp_t *t)
{
    if (t && t->grad)
        memset(t->grad, 0, (size_t)t->n * sizeof(float));
}

/* Records the node that made out from up to three inputs; out requires grad if any input does. */
static sp_node *node_new(sp_t *out, op_kind op, sp_t *a, sp_t *b, sp_t *c, sp_err *err)
{
    sp_node *nd = calloc(1, sizeof *nd);
    if (!nd || node_push(out->g, nd)) {
        free(nd);
        nomem(err, "recording an op");
        return NULL;
    }
    nd->op = op;
    nd->out = out;
    sp_t *in[3] = {a, b, c};
    for (int i = 0; i < 3; i++)
        if (in[i]) {
            nd->in[i] = in[i];
            nd->nin = i + 1;
            out->requires_grad |= in[i]->requires_grad;
        }
    out->node = nd;
    return nd;
}

/* The output tensor and its node, or NULL (err set). */
static sp_t *op_out(sp_graph *g, int ndim, const int64_t *shape, op_kind op, sp_t *a, sp_t *b, sp_t *c, sp_err *err)
{
    sp_t *o = tensor_new(g, ndim, shape, 0, err);
    if (o && !node_new(o, op, a, b, c, err))
        return NULL; /* o stays in g->temps until the next clear */
    return o;
}

/* Inputs must exist (a failed op gives NULL: err is kept) and share a graph. */
static int bad_inputs(const char *op, sp_t *a, sp_t *b, sp_err *err)
{
    if (!a || (b && b->g != a->g)) {
        if (a && err)
            sp_errf(err, SP_ERR_ARG, "%s: the inputs belong to different graphs", op);
        else if (err && !err->code)
            sp_errf(err, SP_ERR_ARG, "%s: an input is NULL", op);
        return 1;
    }
    return 0;
}

static int same_shape(const sp_t *a, const sp_t *b)
{
    if (a->ndim != b->ndim)
        return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return 0;
    return 1;
}

static float *dup_floats(const float *x, int64_t n)
{
    float *d = malloc((size_t)n * sizeof *d);
    if (d)
        memcpy(d, x, (size_t)n * sizeof *d);
    return d;
}

static void add_into(float *d, const float *g, int64_t n, float s)
{
    for (int64_t i = 0; i < n; i++)
        d[i] += s * g[i];
}

/* ---------------------------------------------------------------------------------------------- */
/* shape ops */

sp_t *sp_embedding(sp_t *table, const int32_t *ids, int64_t N, sp_err *err)
{
    if (bad_inputs("sp_embedding", table, NULL, err))
        return NULL;
    if (table->ndim != 2 || !ids || N < 1) {
        sp_errf(err, SP_ERR_ARG, "sp_embedding: needs a table [V, H] (%s is %s) and N >= 1 ids", tname(table),
                shp(table).s);
        return NULL;
    }
    for (int64_t i = 0; i < N; i++)
        if (ids[i] < 0 || ids[i] >= table->shape[0]) {
            sp_errf(err, SP_ERR_ARG, "sp_embedding: id %d at %lld is outside the table's %lld rows", ids[i],
                    (long long)i, (long long)table->shape[0]);
            return NULL;
        }
    int64_t H = table->shape[1], shape[2] = {N, H};
    sp_t *o = op_out(table->g, 2, shape, OP_EMBED, table, NULL, NULL, err);
    if (!o)
        return NULL;
    if (!(o->node->ids = malloc((size_t)N * sizeof *ids))) {
        nomem(err, "sp_embedding");
        return NULL;
    }
    memcpy(o->node->ids, ids, (size_t)N * sizeof *ids);
    sp_embedding_forward_f32(o->data, ids, table->data, (int)N, (int)H);
    return o;
}

sp_t *sp_concat_pos(sp_t *a, sp_t *b, sp_err *err)
{
    if (bad_inputs("sp_concat_pos", a, b, err))
        return NULL;
    if (!b || a->ndim != 3 || b->ndim != 3 || a->shape[0] != b->shape[0] || a->shape[2] != b->shape[2]) {
        sp_errf(err, SP_ERR_ARG, "sp_concat_pos: %s and %s are not [B, P, H] and [B, T, H]", a ? shp(a).s : "NULL",
                b ? shp(b).s : "NULL");
        return NULL;
    }
    int64_t B = a->shape[0], P = a->shape[1], T = b->shape[1], H = a->shape[2], shape[3] = {B, P + T, H};
    sp_t *o = op_out(a->g, 3, shape, OP_CONCAT, a, b, NULL, err);
    for (int64_t r = 0; o && r < B; r++) {
        memcpy(o->data + r * (P + T) * H, a->data + r * P * H, (size_t)(P * H) * sizeof(float));
        memcpy(o->data + (r * (P + T) + P) * H, b->data + r * T * H, (size_t)(T * H) * sizeof(float));
    }
    return o;
}

sp_t *sp_slice_pos(sp_t *x, int64_t from, int64_t to, sp_err *err)
{
    if (bad_inputs("sp_slice_pos", x, NULL, err))
        return NULL;
    if (x->ndim != 3 || from < 0 || to <= from || to > x->shape[1]) {
        sp_errf(err, SP_ERR_ARG, "sp_slice_pos: positions %lld:%lld of %s (needs [B, T, H], 0 <= from < to <= T)",
                (long long)from, (long long)to, shp(x).s);
        return NULL;
    }
    int64_t B = x->shape[0], T = x->shape[1], H = x->shape[2], shape[3] = {B, to - from, H};
    sp_t *o = op_out(x->g, 3, shape, OP_SLICE, x, NULL, NULL, err);
    if (!o)
        return NULL;
    o->node->a = from;
    o->node->b = to;
    for (int64_t r = 0; r < B; r++)
        memcpy(o->data + r * (to - from) * H, x->data + (r * T + from) * H, (size_t)((to - from) * H) * sizeof(float));
    return o;
}

sp_t *sp_reshape(sp_t *x, int ndim, const int64_t *shape, sp_err *err)
{
    if (bad_inputs("sp_reshape", x, NULL, err))
        return NULL;
    int64_t n = 1;
    for (int i = 0; shape && i < ndim && i < 4; i++)
        n *= shape[i];
    if ((ndim && !shape) || n != x->n) {
        sp_errf(err, SP_ERR_ARG, "sp_reshape: %s (%lld elements) cannot take a shape of %lld elements", shp(x).s,
                (long long)x->n, (long long)n);
        return NULL;
    }
    sp_t *o = op_out(x->g, ndim, shape, OP_RESHAPE, x, NULL, NULL, err);
    if (o)
        memcpy(o->data, x->data, (size_t)x->n * sizeof(float));
    return o;
}

sp_t *sp_pool_index(sp_t *x, const int64_t *idx, sp_err *err)
{
    if (bad_inputs("sp_pool_index", x, NULL, err))
        return NULL;
    if (x->ndim != 3 || !idx) {
        sp_errf(err, SP_ERR_ARG, "sp_pool_index: needs x [B, T, H] (got %s) and B indices", shp(x).s);
        return NULL;
    }
    int64_t B = x->shape[0], T = x->shape[1], H = x->shape[2], shape[2] = {B, H};
    for (int64_t r = 0; r < B; r++)
        if (idx[r] < -T || idx[r] >= T) {
            sp_errf(err, SP_ERR_ARG, "sp_pool_index: index %lld of row %lld is outside -%lld .. %lld",
                    (long long)idx[r], (long long)r, (long long)T, (long long)T - 1);
            return NULL;
        }
    sp_t *o = op_out(x->g, 2, shape, OP_POOL, x, NULL, NULL, err);
    if (o && !(o->node->idx = malloc((size_t)B * sizeof *idx))) {
        nomem(err, "sp_pool_index");
        return NULL;
    }
    for (int64_t r = 0; o && r < B; r++) {
        o->node->idx[r] = (idx[r] + T) % T; /* -1 is the last position */
        memcpy(o->data + r * H, x->data + (r * T + o->node->idx[r]) * H, (size_t)H * sizeof(float));
    }
    return o;
}

/* ---------------------------------------------------------------------------------------------- */
/* arithmetic */

sp_t *sp_rmsnorm(sp_t *x, sp_t *w, float eps, sp_err *err)
{
    if (bad_inputs("sp_rmsnorm", x, w, err))
        return NULL;
    if (!w || x->ndim < 1 || w->ndim != 1 || w->shape[0] != x->shape[x->ndim - 1]) {
        sp_errf(err, SP_ERR_ARG, "sp_rmsnorm: weight %s does not match the last dimension of x %s",
                w ? shp(w).s : "NULL", shp(x).s);
        return NULL;
    }
    int64_t C = w->shape[0], N = x->n / C;
    sp_t *o = op_out(x->g, x->ndim, x->shape, OP_RMSNORM, x, w, NULL, err);
    if (o && !(o->node->saved = malloc((size_t)N * sizeof(float)))) {
        nomem(err, "sp_rmsnorm");
        return NULL;
    }
    if (o)
        sp_rmsnorm_forward_f32(o->data, o->node->saved, x->data, w->data, (int)N, (int)C, eps);
    return o;
}

sp_t *sp_layernorm(sp_t *x, sp_t *w, sp_t *b, float eps, sp_err *err)
{
    if (bad_inputs("sp_layernorm", x, w, err) || (b && bad_inputs("sp_layernorm", x, b, err)))
        return NULL;
    if (!w || x->ndim < 1 || w->ndim != 1 || w->shape[0] != x->shape[x->ndim - 1] ||
        (b && (b->ndim != 1 || b->shape[0] != w->shape[0]))) {
        sp_errf(err, SP_ERR_ARG, "sp_layernorm: weight %s, bias %s do not match the last dimension of x %s",
                w ? shp(w).s : "NULL", b ? shp(b).s : "none", shp(x).s);
        return NULL;
    }
    int64_t C = w->shape[0], N = x->n / C;
    sp_t *o = op_out(x->g, x->ndim, x->shape, OP_LAYERNORM, x, w, b, err);
    if (o && !(o->node->saved = malloc((size_t)N * 2 * sizeof(float)))) {
        nomem(err, "sp_layernorm");
        return NULL;
    }
    if (o)
        sp_layernorm_forward_f32(o->data, o->node->saved, o->node->saved + N, x->data, w->data, b ? b->data : NULL,
                                 (int)N, (int)C, eps);
    return o;
}

sp_t *sp_linear(sp_t *x, sp_t *W, sp_t *b, sp_err *err)
{
    if (bad_inputs("sp_linear", x, W, err) || (b && bad_inputs("sp_linear", x, b, err)))
        return NULL;
    if (!W || x->ndim < 1 || W->ndim != 2 || W->shape[1] != x->shape[x->ndim - 1] ||
        (b && (b->ndim != 1 || b->shape[0] != W->shape[0]))) {
        sp_errf(err, SP_ERR_ARG, "sp_linear: x %s, W %s, b %s do not fit [.., I], [O, I], [O]", shp(x).s,
                W ? shp(W).s : "NULL", b ? shp(b).s : "none");
        return NULL;
    }
    int64_t I = W->shape[1], O = W->shape[0], N = x->n / I, shape[4];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = O;
    sp_t *o = op_out(x->g, x->ndim, shape, OP_LINEAR, x, W, b, err);
    if (o)
        sp_linear_forward_f32(o->data, x->data, W->data, b ? b->data : NULL, (int)N, (int)I, (int)O);
    return o;
}

sp_t *sp_add(sp_t *a, sp_t *b, sp_err *err)
{
    if (bad_inputs("sp_add", a, b, err))
        return NULL;
    if (!b || !same_shape(a, b)) {
        sp_errf(err, SP_ERR_ARG, "sp_add: shapes %s and %s differ", shp(a).s, b ? shp(b).s : "NULL");
        return NULL;
    }
    sp_t *o = op_out(a->g, a->ndim, a->shape, OP_ADD, a, b, NULL, err);
    for (int64_t i = 0; o && i < a->n; i++)
        o->data[i] = a->data[i] + b->data[i];
    return o;
}

sp_t *sp_scale(sp_t *a, float s, sp_err *err)
{
    if (bad_inputs("sp_scale", a, NULL, err))
        return NULL;
    sp_t *o = op_out(a->g, a->ndim, a->shape, OP_SCALE, a, NULL, NULL, err);
    if (!o)
        return NULL;
    o->node->f = s;
    for (int64_t i = 0; i < a->n; i++)
        o->data[i] = s * a->data[i];
    return o;
}

/* ---------------------------------------------------------------------------------------------- */
/* losses: scalars, means over the counted elements */

static sp_t *loss_out(sp_t *x, op_kind op, sp_err *err) { return op_out(x->g, 0, NULL, op, x, NULL, NULL, err); }

sp_t *sp_cross_entropy(sp_t *logits, const int32_t *targets, sp_err *err)
{
    if (bad_inputs("sp_cross_entropy", logits, NULL, err))
        return NULL;
    if (logits->ndim != 2 || !targets) {
        sp_errf(err, SP_ERR_ARG, "sp_cross_entropy: needs logits [N, C] (got %s) and N targets", shp(logits).s);
        return NULL;
    }
    int64_t N = logits->shape[0], C = logits->shape[1], count = 0;
    for (int64_t i = 0; i < N; i++) {
        if (targets[i] >= C) {
            sp_errf(err, SP_ERR_ARG, "sp_cross_entropy: target %d of row %lld is not below %lld classes", targets[i],
                    (long long)i, (long long)C);
            return NULL;
        }
        count += targets[i] >= 0;
    }
    sp_t *o = loss_out(logits, OP_CE, err);
    float *losses = o ? malloc((size_t)N * sizeof *losses) : NULL;
    if (o && (!losses || !(o->node->ids = malloc((size_t)N * sizeof *targets)))) {
        free(losses);
        nomem(err, "sp_cross_entropy");
        return NULL;
    }
    if (!o)
        return NULL;
    memcpy(o->node->ids, targets, (size_t)N * sizeof *targets);
    o->node->b = count;
    sp_crossentropy_forward_f32(losses, logits->data, targets, (int)N, (int)C);
    double sum = 0;
    for (int64_t i = 0; i < N; i++)
        sum += losses[i];
    o->data[0] = count ? (float)(sum / (double)count) : 0.0f; /* nothing counted: 0, no gradient */
    free(losses);
    return o;
}

/* The mse/bce node with a copy of the targets, or NULL. */
static sp_t *pointwise_loss(sp_t *x, const float *target, op_kind op, const char *name, sp_err *err)
{
    if (bad_inputs(name, x, NULL, err))
        return NULL;
    if (!target) {
        sp_errf(err, SP_ERR_ARG, "%s: no target", name);
        return NULL;
    }
    sp_t *o = loss_out(x, op, err);
    if (o && !(o->node->saved = dup_floats(target, x->n))) {
        nomem(err, name);
        return NULL;
    }
    if (o)
        o->node->b = x->n;
    return o;
}

sp_t *sp_mse(sp_t *pred, const float *target, sp_err *err)
{
    sp_t *o = pointwise_loss(pred, target, OP_MSE, "sp_mse", err);
    if (!o)
        return NULL;
    double sum = 0;
    for (int64_t i = 0; i < pred->n; i++) {
        double d = (double)pred->data[i] - target[i];
        sum += d * d;
    }
    o->data[0] = (float)(sum / (double)pred->n);
    return o;
}

sp_t *sp_bce_logits(sp_t *logits, const float *target, sp_err *err)
{
    sp_t *o = pointwise_loss(logits, target, OP_BCE, "sp_bce_logits", err);
    if (!o)
        return NULL;
    double sum = 0;
    for (int64_t i = 0; i < logits->n; i++) {
        double x = logits->data[i];
        sum += (x > 0 ? x : 0) - x * target[i] + log1p(exp(-fabs(x)));
    }
    o->data[0] = (float)(sum / (double)logits->n);
    return o;
}

sp_t *sp_external(sp_graph *g, int ndim, const int64_t *shape, const float *data, sp_t *a, sp_t *b,
                  const sp_ext_fn *fn, void *ctx, sp_err *err)
{
    sp_t *o = NULL;
    if (!g || !fn || !fn->backward || (a && a->g != g) || (b && b->g != g))
        sp_errf(err, SP_ERR_ARG, "external op: no graph or backward, or an input of another graph");
    else
        o = op_out(g, ndim, shape, OP_EXT, a, b, NULL, err);
    if (!o) {
        if (fn && fn->free)
            fn->free(ctx);
        return NULL;
    }
    o->node->ext = fn;
    o->node->ext_ctx = ctx;
    if (data && o->n > 0)
        memcpy(o->data, data, (size_t)o->n * sizeof(float));
    return o;
}

/* ---------------------------------------------------------------------------------------------- */
/* the remote chain: sub-batches of at most CHAIN_MAX_TOKENS tokens, one thread each */

typedef struct chain_job {
    sp_runtime *rt;
    sp_route *route;     /* the sub-batch's, updated in place */
    float *hidden;       /* [bs, T, H], in place */
    const float *prompts; /* [L, bs, P, H] or NULL */
    float *bound;        /* route->nstages x [bs, T, H] (forward: NULL when no backward will follow) */
    float *grad_prompts; /* [L, bs, P, H] or NULL */
    int bs, T, P, backward;
    sp_pipe_ticket tk;
    sp_status st;
    sp_err err;
} chain_job;

static void *chain_job_run(void *arg)
{
    chain_job *j = arg;
    j->err = (sp_err){0};
    if (j->backward)
        j->st = sp_runtime_backward(j->rt, j->route, j->hidden, j->bs, j->T, j->prompts, j->P, j->bound,
                                    j->grad_prompts, j->tk.pipe ? &j->tk : NULL, &j->err);
    else
        j->st = sp_runtime_forward(j->rt, j->route, j->hidden, j->bs, j->T, j->prompts, j->P, j->bound,
                                   j->tk.pipe ? &j->tk : NULL, &j->err);
    return NULL;
}

/* Runs the jobs concurrently (inline when there is one, or when a thread cannot start); the first failure
 * is reported. */
static sp_status run_jobs(chain_job *jobs, int n, sp_err *err)
{
    pthread_t *th = calloc((size_t)n, sizeof *th);
    char *started = calloc((size_t)n, 1);
    for (int i = 0; i < n; i++) {
        if (n > 1 && th && started && !pthread_create(&th[i], NULL, chain_job_run, &jobs[i]))
            started[i] = 1;
        else
            chain_job_run(&jobs[i]);
    }
    for (int i = 0; i < n; i++)
        if (started && started[i])
            pthread_join(th[i], NULL);
    free(th);
    free(started);
    for (int i = 0; i < n; i++)
        if (jobs[i].st) {
            if (err)
                *err = jobs[i].err;
            sp_err_prefix(err, "remote chain, rows %d..%d: ", i * jobs[0].bs, i * jobs[0].bs + jobs[i].bs - 1);
            return jobs[i].st;
        }
    return SP_OK;
}

/* One job per sub-batch over hidden [B, T, H]; bound/prompts/grad_prompts in the sub-batch-major layout. */
static chain_job *make_jobs(const chain_saved *cs, float *hidden, float *bound, float *gp, int backward, int *n)
{
    *n = (cs->B + cs->bsub - 1) / cs->bsub;
    chain_job *jobs = calloc((size_t)*n, sizeof *jobs);
    for (int k = 0; jobs && k < *n; k++) {
        size_t b0 = (size_t)k * cs->bsub, bs = cs->B - b0 < (size_t)cs->bsub ? cs->B - b0 : (size_t)cs->bsub;
        size_t row = (size_t)cs->T * cs->H, prow = (size_t)cs->L * cs->P * cs->H;
        jobs[k] = (chain_job){.rt = cs->rt, .route = &cs->routes[k], .hidden = hidden + b0 * row, .bs = (int)bs,
                              .T = cs->T, .P = cs->P, .backward = backward};
        jobs[k].bound = bound ? bound + cs->boff[k] : NULL;
        jobs[k].prompts = cs->prompts ? cs->prompts + b0 * prow : NULL;
        jobs[k].grad_prompts = gp ? gp + b0 * prow : NULL;
        jobs[k].tk = (sp_pipe_ticket){.pipe = cs->pipe, .mb = cs->mb, .nsub = *n};
    }
    return jobs;
}

/* [L, B, P, H] <-> sub-batch-major [L, bs, P, H] blocks (scatter adds). */
static void prompts_regroup(const chain_saved *cs, float *batch, float *sub, int scatter)
{
    size_t ph = (size_t)cs->P * cs->H;
    for (int b0 = 0; b0 < cs->B; b0 += cs->bsub) {
        int bs = cs->B - b0 < cs->bsub ? cs->B - b0 : cs->bsub;
        for (int l = 0; l < cs->L; l++) {
            float *s = sub + (size_t)cs->L * b0 * ph + (size_t)l * bs * ph;
            float *d = batch + ((size_t)l * cs->B + b0) * ph;
            if (scatter)
                add_into(d, s, (int64_t)bs * (int64_t)ph, 1.0f);
            else
                memcpy(s, d, (size_t)bs * ph * sizeof(float));
        }
    }
}

static sp_status chain_check(sp_runtime *rt, sp_t *x, sp_t *dp, sp_err *err)
{
    const sp_config *c = rt ? sp_runtime_config(rt) : NULL;
    if (!c)
        return sp_errf(err, SP_ERR_STATE, "sp_remote_chain: no model loaded");
    int H = c->hidden, L = c->n_layers;
    if (x->ndim != 3 || x->shape[2] != H)
        return sp_errf(err, SP_ERR_ARG, "sp_remote_chain: input %s is not [B, T, %d]", shp(x).s, H);
    if (dp && (dp->ndim != 4 || dp->shape[0] != L || dp->shape[1] != x->shape[0] || dp->shape[2] > x->shape[1] ||
               dp->shape[3] != H))
        return sp_errf(err, SP_ERR_ARG, "sp_remote_chain: deep prompts %s are not [%d, %lld, P <= %lld, %d]",
                       shp(dp).s, L, (long long)x->shape[0], (long long)x->shape[1], H);
    return SP_OK;
}

/* Each sub-batch's route: `route` (a pipelined step's, the same for all), else one max-throughput route
 * each (Petals: every sub-batch is routed by itself); then the boundaries' offsets. */
static sp_status chain_routes(chain_saved *cs, const sp_route *route, sp_err *err)
{
    cs->nsub = (cs->B + cs->bsub - 1) / cs->bsub;
    cs->routes = calloc((size_t)cs->nsub, sizeof *cs->routes);
    cs->boff = calloc((size_t)cs->nsub + 1, sizeof *cs->boff);
    if (!cs->routes || !cs->boff)
        return nomem(err, "sp_remote_chain");
    for (int k = 0; k < cs->nsub; k++) {
        sp_status st = route ? SP_OK : sp_runtime_route_train(cs->rt, &cs->routes[k], err);
        if (st)
            return st;
        if (route)
            cs->routes[k] = *route;
        int b0 = k * cs->bsub, bs = cs->B - b0 < cs->bsub ? cs->B - b0 : cs->bsub;
        cs->boff[k + 1] = cs->boff[k] + (size_t)cs->routes[k].nstages * bs * cs->T * cs->H;
    }
    return SP_OK;
}

static chain_saved *chain_saved_new(sp_runtime *rt, sp_t *x, sp_t *dp, const sp_route *route, int keep, sp_err *err)
{
    chain_saved *cs = calloc(1, sizeof *cs);
    if (!cs)
        return nomem(err, "sp_remote_chain"), NULL;
    *cs = (chain_saved){.rt = rt, .B = (int)x->shape[0], .T = (int)x->shape[1], .P = dp ? (int)dp->shape[2] : 0,
                        .H = sp_runtime_config(rt)->hidden, .L = sp_runtime_config(rt)->n_layers};
    cs->bsub = CHAIN_MAX_TOKENS / cs->T > 0 ? CHAIN_MAX_TOKENS / cs->T : 1;
    if (chain_routes(cs, route, err)) {
        chain_saved_free(cs);
        return NULL;
    }
    size_t np = dp ? (size_t)dp->n : 0;
    cs->bound = keep ? malloc(cs->boff[cs->nsub] * sizeof(float)) : NULL;
    cs->prompts = np ? malloc(np * sizeof(float)) : NULL;
    if ((keep && !cs->bound) || (np && !cs->prompts)) {
        chain_saved_free(cs);
        return nomem(err, "sp_remote_chain"), NULL;
    }
    if (np)
        prompts_regroup(cs, dp->data, cs->prompts, 0);
    return cs;
}

sp_t *sp_remote_chain_mb(struct sp_runtime *rt, sp_t *x, sp_t *deep_prompts, const sp_route *route, sp_pipe *pipe,
                         int mb, sp_err *err)
{
    if (bad_inputs("sp_remote_chain", x, deep_prompts, err) || chain_check(rt, x, deep_prompts, err))
        return NULL;
    sp_t *o = op_out(x->g, 3, x->shape, OP_CHAIN, x, deep_prompts, NULL, err);
    if (!o || !(o->node->chain = chain_saved_new(rt, x, deep_prompts, route, o->requires_grad, err)))
        return NULL;
    chain_saved *cs = o->node->chain;
    cs->pipe = pipe;
    cs->mb = mb;
    memcpy(o->data, x->data, (size_t)x->n * sizeof(float));
    int n = 0;
    chain_job *jobs = make_jobs(cs, o->data, cs->bound, NULL, 0, &n);
    graph_release(x->g);
    sp_status st = jobs ? run_jobs(jobs, n, err) : nomem(err, "sp_remote_chain");
    graph_reacquire(x->g);
    free(jobs);
    return st ? NULL : o;
}

sp_t *sp_remote_chain(struct sp_runtime *rt, sp_t *x, sp_t *deep_prompts, sp_err *err)
{
    return sp_remote_chain_mb(rt, x, deep_prompts, NULL, NULL, 0, err);
}

static sp_status chain_backward(sp_node *nd, float **d, sp_err *err)
{
    chain_saved *cs = nd->chain;
    int64_t n = nd->out->n;
    float *g = dup_floats(nd->gout, n);
    float *gp = d[1] ? calloc((size_t)nd->in[1]->n, sizeof(float)) : NULL;
    int nj = 0;
    chain_job *jobs = g && (gp || !d[1]) ? make_jobs(cs, g, cs->bound, gp, 1, &nj) : NULL;
    graph_release(nd->out->g);
    sp_status st = jobs ? run_jobs(jobs, nj, err) : nomem(err, "remote chain backward");
    graph_reacquire(nd->out->g);
    if (!st && d[0])
        add_into(d[0], g, n, 1.0f);
    if (!st && d[1])
        prompts_regroup(cs, d[1], gp, 1);
    free(jobs);
    free(g);
    free(gp);
    return st;
}

/* ---------------------------------------------------------------------------------------------- */
/* the local chain: every block of a model in this process */

/* Adds prompt [B, P, H] to the first P positions of h [B, T, H], or (grad) accumulates them into it. */
static void prompt_rows(float *h, float *p, int64_t B, int64_t T, int64_t P, int64_t H, int to_prompt)
{
    for (int64_t b = 0; b < B; b++) {
        if (to_prompt)
            add_into(p + b * P * H, h + b * T * H, P * H, 1.0f);
        else
            add_into(h + b * T * H, p + b * P * H, P * H, 1.0f);
    }
}

/* The local chain runs in the model's scratch (kept between calls: no fresh pages every step); one local
 * chain op at a time uses it. */
static pthread_mutex_t local_ws_lock = PTHREAD_MUTEX_INITIALIZER;
static sp_ws *local_ws_acquire(sp_model *m)
{
    pthread_mutex_lock(&local_ws_lock);
    return &m->ws;
}
static void local_ws_release(void) { pthread_mutex_unlock(&local_ws_lock); }

static sp_status local_check(sp_model *m, sp_t *x, sp_t *dp, sp_err *err)
{
    int nb = m ? m->last - m->first : 0, H = m ? m->cfg.hidden : 0;
    if (!m || !m->blocks || nb < 1)
        return sp_errf(err, SP_ERR_STATE, "sp_local_chain: the model holds no blocks");
    if (x->ndim != 3 || x->shape[2] != H)
        return sp_errf(err, SP_ERR_ARG, "sp_local_chain: input %s is not [B, T, %d]", shp(x).s, H);
    if (dp && (dp->ndim != 4 || dp->shape[0] != nb || dp->shape[1] != x->shape[0] || dp->shape[2] > x->shape[1] ||
               dp->shape[3] != H))
        return sp_errf(err, SP_ERR_ARG, "sp_local_chain: deep prompts %s are not [%d, %lld, P <= %lld, %d]",
                       shp(dp).s, nb, (long long)x->shape[0], (long long)x->shape[1], H);
    return SP_OK;
}

static sp_status local_forward(sp_node *nd, float *acts, sp_err *err)
{
    sp_model *m = nd->model;
    sp_t *x = nd->in[0], *dp = nd->in[1], *o = nd->out;
    int64_t B = x->shape[0], T = x->shape[1], H = x->shape[2], P = dp ? dp->shape[2] : 0;
    sp_ws *ws = local_ws_acquire(m);
    sp_status st = SP_OK;
    memcpy(o->data, x->data, (size_t)x->n * sizeof(float));
    for (int i = 0; !st && i < m->last - m->first; i++) {
        if (dp)
            prompt_rows(o->data, dp->data + i * B * P * H, B, T, P, H, 0);
        if (acts)
            memcpy(acts + i * x->n, o->data, (size_t)x->n * sizeof(float));
        if (nd->bacts)
            st = sp_block_forward_keep(&m->blocks[i], o->data, o->data, (int)B, (int)T, 0, &nd->bacts[i], err);
        else
            st = sp_block_forward(&m->blocks[i], o->data, o->data, (int)B, (int)T, 0, NULL, ws, err);
        if (st)
            sp_err_prefix(err, "sp_local_chain: block %d: ", m->first + i);
    }
    local_ws_release();
    return st;
}

sp_t *sp_local_chain(struct sp_model *m, sp_t *x, sp_t *deep_prompts, sp_err *err)
{
    if (bad_inputs("sp_local_chain", x, deep_prompts, err) || local_check(m, x, deep_prompts, err))
        return NULL;
    sp_t *o = op_out(x->g, 3, x->shape, OP_LOCAL, x, deep_prompts, NULL, err);
    if (!o)
        return NULL;
    o->node->model = m;
    size_t nacts = (size_t)x->n * (size_t)(m->last - m->first);
    if (o->requires_grad) { /* keep what the backward needs: each block's input and activations */
        o->node->nbacts = m->last - m->first;
        o->node->saved = malloc(nacts * sizeof(float));
        o->node->bacts = calloc((size_t)o->node->nbacts, sizeof *o->node->bacts);
        if (!o->node->saved || !o->node->bacts) {
            nomem(err, "sp_local_chain");
            return NULL;
        }
        for (int i = 0; i < o->node->nbacts && x->g->npool > 0; i++) /* last step's buffers */
            o->node->bacts[i] = x->g->pool[--x->g->npool];
    }
    return local_forward(o->node, o->node->saved, err) ? NULL : o;
}

static sp_status local_backward(sp_node *nd, float **d, sp_err *err)
{
    sp_model *m = nd->model;
    sp_t *x = nd->in[0], *dp = nd->in[1];
    int64_t B = x->shape[0], T = x->shape[1], H = x->shape[2], P = dp ? dp->shape[2] : 0;
    float *g = dup_floats(nd->gout, x->n);
    if (!g)
        return nomem(err, "local chain backward");
    sp_ws *ws = local_ws_acquire(m);
    sp_status st = SP_OK;
    for (int i = m->last - m->first - 1; !st && i >= 0; i--) {
        st = sp_block_backward_kept(&m->blocks[i], g, g, nd->saved + i * x->n, &nd->bacts[i], NULL, ws, err);
        if (!st && d[1])
            prompt_rows(g, d[1] + i * B * P * H, B, T, P, H, 1);
    }
    if (!st && d[0])
        add_into(d[0], g, x->n, 1.0f);
    local_ws_release();
    free(g);
    return st;
}

/* ---------------------------------------------------------------------------------------------- */
/* backward of each op: d[i] is the gradient buffer of input i (NULL: not needed), gout the output's */

static void concat_backward(sp_node *nd, float **d, const float *g)
{
    const sp_t *a = nd->in[0], *b = nd->in[1];
    int64_t B = a->shape[0], P = a->shape[1], T = b->shape[1], H = a->shape[2];
    for (int64_t r = 0; r < B; r++) {
        if (d[0])
            add_into(d[0] + r * P * H, g + r * (P + T) * H, P * H, 1.0f);
        if (d[1])
            add_into(d[1] + r * T * H, g + (r * (P + T) + P) * H, T * H, 1.0f);
    }
}

static void slice_backward(sp_node *nd, float **d, const float *g)
{
    const sp_t *x = nd->in[0];
    int64_t B = x->shape[0], T = x->shape[1], H = x->shape[2], len = nd->b - nd->a;
    for (int64_t r = 0; r < B; r++)
        add_into(d[0] + (r * T + nd->a) * H, g + r * len * H, len * H, 1.0f);
}

static void pool_backward(sp_node *nd, float **d, const float *g)
{
    const sp_t *x = nd->in[0];
    int64_t B = x->shape[0], T = x->shape[1], H = x->shape[2];
    for (int64_t r = 0; r < B; r++)
        add_into(d[0] + (r * T + nd->idx[r]) * H, g + r * H, H, 1.0f);
}

static sp_status ce_backward(sp_node *nd, float **d, const float *g, sp_err *err)
{
    const sp_t *x = nd->in[0];
    int64_t N = x->shape[0], C = x->shape[1];
    if (!nd->b)
        return SP_OK;
    float *dl = malloc((size_t)N * sizeof *dl);
    if (!dl)
        return nomem(err, "cross-entropy backward");
    for (int64_t i = 0; i < N; i++)
        dl[i] = g[0] / (float)nd->b;
    sp_crossentropy_backward_f32(d[0], dl, x->data, nd->ids, (int)N, (int)C);
    free(dl);
    return SP_OK;
}

static void pointwise_backward(sp_node *nd, float **d, const float *g)
{
    const sp_t *x = nd->in[0];
    double s = (double)g[0] / (double)nd->b;
    for (int64_t i = 0; i < x->n; i++) {
        double v = x->data[i], t = nd->saved[i];
        double dv = nd->op == OP_MSE ? 2.0 * (v - t) : 1.0 / (1.0 + exp(-v)) - t;
        d[0][i] += (float)(s * dv);
    }
}

static sp_status op_backward(sp_node *nd, float **d, sp_err *err)
{
    const float *g = nd->gout;
    sp_t *x = nd->in[0], *w = nd->in[1];
    int64_t C = x->shape[x->ndim ? x->ndim - 1 : 0]; /* rmsnorm: H; linear: I */
    switch (nd->op) {
    case OP_EMBED:
        sp_embedding_backward_f32(d[0], g, nd->ids, (int)nd->out->shape[0], (int)x->shape[1]);
        return SP_OK;
    case OP_CONCAT: concat_backward(nd, d, g); return SP_OK;
    case OP_SLICE: slice_backward(nd, d, g); return SP_OK;
    case OP_POOL: pool_backward(nd, d, g); return SP_OK;
    case OP_RESHAPE: add_into(d[0], g, x->n, 1.0f); return SP_OK;
    case OP_SCALE: add_into(d[0], g, x->n, nd->f); return SP_OK;
    case OP_ADD:
        for (int i = 0; i < 2; i++)
            if (d[i])
                add_into(d[i], g, x->n, 1.0f);
        return SP_OK;
    case OP_RMSNORM:
        sp_rmsnorm_backward_f32(d[0], d[1], g, x->data, w->data, nd->saved, (int)(x->n / C), (int)C);
        return SP_OK;
    case OP_LAYERNORM: {
        int64_t N = x->n / C;
        sp_layernorm_backward_f32(d[0], d[1], d[2], g, x->data, w->data, nd->saved, nd->saved + N, (int)N, (int)C);
        return SP_OK;
    }
    case OP_LINEAR:
        sp_linear_backward_f32(d[0], d[1], d[2], g, x->data, w->data, (int)(x->n / C), (int)C, (int)w->shape[0]);
        return SP_OK;
    case OP_CE: return ce_backward(nd, d, g, err);
    case OP_MSE:
    case OP_BCE: pointwise_backward(nd, d, g); return SP_OK;
    case OP_CHAIN: return chain_backward(nd, d, err);
    case OP_LOCAL: return local_backward(nd, d, err);
    case OP_EXT: return nd->ext->backward(nd->ext_ctx, g, d, err);
    }
    return sp_errf(err, SP_ERR_STATE, "unknown op %d", (int)nd->op);
}

/* ---------------------------------------------------------------------------------------------- */
/* sp_backward */

/* Where the gradient w.r.t. t accumulates: .grad of a leaf, the producing node's gout otherwise. */
static sp_status grad_slot(sp_t *t, float **out, sp_err *err)
{
    *out = NULL;
    if (!t || !t->requires_grad)
        return SP_OK;
    float **slot = t->node ? &t->node->gout : &t->grad;
    if (!*slot && !(*slot = calloc((size_t)t->n, sizeof(float))))
        return nomem(err, "backward");
    *out = *slot;
    return SP_OK;
}

static sp_status mark_reachable(sp_graph *g, sp_node *root, unsigned stamp, sp_err *err)
{
    sp_node **stack = malloc((size_t)g->nn * sizeof *stack);
    if (!stack)
        return nomem(err, "backward");
    int n = 0;
    root->mark = stamp;
    stack[n++] = root;
    while (n) {
        sp_node *nd = stack[--n];
        for (int i = 0; i < nd->nin; i++) {
            sp_t *x = nd->in[i];
            if (x && x->requires_grad && x->node && x->node->mark != stamp) {
                x->node->mark = stamp;
                stack[n++] = x->node;
            }
        }
    }
    free(stack);
    return SP_OK;
}

/* A retain_grad intermediate keeps (accumulates) its now complete gradient. */
static sp_status retain(sp_t *t, const float *g, sp_err *err)
{
    if (!t->grad && !(t->grad = calloc((size_t)t->n, sizeof(float))))
        return nomem(err, "backward");
    add_into(t->grad, g, t->n, 1.0f);
    return SP_OK;
}

static sp_status node_backward(sp_node *nd, sp_err *err)
{
    float *d[3] = {0};
    sp_status st = nd->out->retain_grad ? retain(nd->out, nd->gout, err) : SP_OK;
    for (int i = 0; !st && i < nd->nin; i++)
        st = grad_slot(nd->in[i], &d[i], err);
    if (!st)
        st = op_backward(nd, d, err);
    free(nd->gout);
    nd->gout = NULL;
    return st;
}

static sp_status run_tape(sp_graph *g, sp_t *root, const float *grad, sp_err *err)
{
    if (++g->stamp == 0)
        ++g->stamp;
    unsigned stamp = g->stamp;
    float *seed = NULL;
    sp_status st = mark_reachable(g, root->node, stamp, err);
    if (!st)
        st = grad_slot(root, &seed, err);
    if (!st)
        add_into(seed, grad, root->n, 1.0f);
    for (int i = g->nn - 1; i >= 0 && !st; i--)
        if (g->nodes[i]->mark == stamp && g->nodes[i]->gout)
            st = node_backward(g->nodes[i], err);
    for (int i = 0; i < g->nn; i++) /* after a failure: drop what is left (of this call's nodes) */
        if (g->nodes[i]->mark == stamp) {
            free(g->nodes[i]->gout);
            g->nodes[i]->gout = NULL;
        }
    return st;
}

sp_status sp_backward(sp_t *t, const float *grad, sp_err *err)
{
    if (!t)
        return sp_errf(err, SP_ERR_ARG, "backward of a NULL tensor");
    if (!t->requires_grad)
        return sp_errf(err, SP_ERR_ARG, "backward of %s %s, which does not require grad (no parameter reaches it)",
                       tname(t), shp(t).s);
    if (!grad && t->n != 1)
        return sp_errf(err, SP_ERR_ARG, "backward of a non-scalar tensor %s needs a gradient", shp(t).s);
    const float one = 1.0f;
    sp_status st;
    if (t->node) {
        st = run_tape(t->g, t, grad ? grad : &one, err);
    } else { /* a parameter itself */
        float *slot = NULL;
        st = grad_slot(t, &slot, err);
        if (!st)
            add_into(slot, grad ? grad : &one, t->n, 1.0f);
    }
    if (!st && t->g->hook)
        t->g->hook(t->g, t->g->user);
    return st;
}
