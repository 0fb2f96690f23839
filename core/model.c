/* model.c - loading a (partial) model of any supported family and running it in one process. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtune.h"
#include "ops.h"
#include "trace.h"

static sp_status read_tensor(sp_model *m, sp_safetensors *st, const char *name, float **dst, int64_t rows,
                             int64_t cols, sp_err *err)
{
    int64_t shape[2] = {rows, cols};
    int ndim = cols ? 2 : 1;
    *dst = sp_mem_alloc_weights((size_t)rows * (size_t)(cols ? cols : 1) * sizeof(float)); /* (huge pages) */
    if (!*dst)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory loading %s", name);
    sp_status s = sp_st_read_f32(st, name, *dst, ndim, shape, err);
    if (!s)
        m->bytes_loaded += (uint64_t)rows * (uint64_t)(cols ? cols : 1) * sizeof(float);
    return s;
}

/* A [rows, cols] tensor in place when the checkpoint holds it as f32 (aligned): *dst points into the mapping,
 * which the model then keeps open; else a converted copy. */
static sp_status map_tensor(sp_model *m, sp_safetensors *st, const char *name, float **dst, int64_t rows,
                            int64_t cols, int *mapped, sp_err *err)
{
    *mapped = 0;
    const sp_st_tensor *t = sp_st_get(st, name, err);
    if (!t)
        return err && err->code ? err->code : SP_ERR_NOTFOUND;
    if (t->dtype == SP_F32 && t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols &&
        ((uintptr_t)t->data & 3) == 0) {
        *dst = (float *)t->data;
        *mapped = 1;
        m->bytes_loaded += (uint64_t)rows * (uint64_t)cols * sizeof(float);
        return SP_OK;
    }
    return read_tensor(m, st, name, dst, rows, cols, err);
}

/* The local parts' tensor names: Llama/Mixtral "model.*"; Falcon "transformer.*"; BLOOM "transformer.*" or, in
 * its own checkpoints (saved from BloomModel), without the prefix. */
typedef struct local_names {
    char embed[96], embed_norm[96], norm[96];
} local_names;

static void local_names_of(const sp_model *m, sp_safetensors *st, local_names *n)
{
    if (m->cfg.arch == SP_ARCH_LLAMA || m->cfg.arch == SP_ARCH_MIXTRAL) {
        snprintf(n->embed, sizeof n->embed, "model.embed_tokens.weight");
        snprintf(n->norm, sizeof n->norm, "model.norm");
        return;
    }
    const char *p = m->cfg.arch == SP_ARCH_BLOOM && !sp_st_has(st, "transformer.word_embeddings.weight") &&
                            sp_st_has(st, "word_embeddings.weight")
                        ? ""
                        : "transformer.";
    snprintf(n->embed, sizeof n->embed, "%sword_embeddings.weight", p);
    snprintf(n->embed_norm, sizeof n->embed_norm, "%sword_embeddings_layernorm", p);
    snprintf(n->norm, sizeof n->norm, "%sln_f", p);
}

/* A norm's weight and, for LayerNorm, its bias ("<name>.weight", "<name>.bias"). */
static sp_status read_norm(sp_model *m, sp_safetensors *st, const char *name, float **w, float **b, sp_err *err)
{
    char full[128];
    snprintf(full, sizeof full, "%s.weight", name);
    sp_status s = read_tensor(m, st, full, w, m->cfg.hidden, 0, err);
    if (s || m->cfg.blk.norm != SP_NORM_LAYER)
        return s;
    snprintf(full, sizeof full, "%s.bias", name);
    return read_tensor(m, st, full, b, m->cfg.hidden, 0, err);
}

static sp_status load_local_parts(sp_model *m, sp_safetensors *st, unsigned parts, sp_err *err)
{
    const sp_config *c = &m->cfg;
    local_names n = {0};
    local_names_of(m, st, &n);
    sp_status s = SP_OK;
    int need_embed = (parts & SP_LOAD_EMBED) || ((parts & SP_LOAD_HEAD) && c->tie_embeddings);
    if (need_embed)
        s = map_tensor(m, st, n.embed, &m->embed, c->vocab, c->hidden, &m->embed_mapped, err);
    if (!s && (parts & SP_LOAD_EMBED) && c->embed_norm)
        s = read_norm(m, st, n.embed_norm, &m->embed_norm_w, &m->embed_norm_b, err);
    if (!s && (parts & SP_LOAD_HEAD)) {
        s = read_norm(m, st, n.norm, &m->norm, &m->norm_b, err);
        if (!s && c->tie_embeddings) {
            m->lm_head = m->embed;
            m->head_is_embed = 1;
            m->head_mapped = m->embed_mapped;
        } else if (!s) {
            s = map_tensor(m, st, "lm_head.weight", &m->lm_head, c->vocab, c->hidden, &m->head_mapped, err);
        }
        if (!s)
            m->head_q = sp_qmat_f32(m->lm_head, c->vocab, c->hidden);
    }
    return s;
}

static sp_status load_blocks(sp_model *m, sp_safetensors *st, sp_wtype t, sp_err *err)
{
    int n = m->last - m->first;
    m->blocks = calloc((size_t)(n > 0 ? n : 1), sizeof *m->blocks);
    if (!m->blocks)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        sp_status s = sp_block_init(&m->blocks[i], &m->cfg, &m->rope, err);
        size_t numel = m->blocks[i].numel; /* what is read, as f32 */
        if (!s)
            s = sp_block_load_encoded(&m->blocks[i], st, m->first + i, t, err);
        if (s)
            return t == SP_W_F32 ? s : sp_err_prefix(err, "block %d to %s: ", m->first + i, sp_wtype_name(t));
        m->bytes_loaded += numel * sizeof(float);
    }
    return SP_OK;
}

sp_status sp_model_load(sp_model **out, const char *dir, unsigned parts, int first, int last, sp_err *err)
{
    return sp_model_load_encoded(out, dir, parts, first, last, SP_W_F32, err);
}

sp_status sp_model_load_encoded(sp_model **out, const char *dir, unsigned parts, int first, int last, sp_wtype t,
                                sp_err *err)
{
    *out = NULL;
    sp_model *m = calloc(1, sizeof *m);
    if (!m)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&m->head_lock, NULL);
    sp_safetensors *st = NULL;
    sp_status s = sp_config_load(&m->cfg, dir, err);
    if (!s)
        s = sp_config_check_supported(&m->cfg, err);
    if (!s && m->cfg.blk.pos == SP_POS_ROPE)
        s = sp_rope_init(&m->rope, &m->cfg, err);
    if (!s && (parts & SP_LOAD_BLOCKS)) {
        if (last < 0)
            last = m->cfg.n_layers;
        if (first < 0 || first > last || last > m->cfg.n_layers)
            s = sp_errf(err, SP_ERR_ARG, "blocks %d:%d outside the model's 0:%d", first, last, m->cfg.n_layers);
        m->first = first;
        m->last = last;
    }
    if (!s)
        s = sp_st_open(&st, dir, err);
    if (!s)
        s = load_local_parts(m, st, parts, err);
    if (!s && (parts & SP_LOAD_BLOCKS))
        s = load_blocks(m, st, t, err);
    if (st)
        m->files_mapped = sp_st_files_mapped(st);
    if (m->embed_mapped || m->head_mapped)
        m->st = st; /* the tensors in place live as long as the model */
    else
        sp_st_close(st);
    if (s) {
        sp_model_free(m);
        return s;
    }
    *out = m;
    return SP_OK;
}

void sp_model_free(sp_model *m)
{
    if (!m)
        return;
    for (int i = 0; m->blocks && i < m->last - m->first; i++)
        sp_block_free(&m->blocks[i]);
    free(m->blocks);
    sp_qmat_free(&m->head_q);
    sp_qmat_free(&m->head_screen);
    free(m->head_buf);
    free(m->hid);
    if (!m->head_is_embed && !m->head_mapped)
        free(m->lm_head);
    if (!m->embed_mapped)
        free(m->embed);
    sp_st_close(m->st);
    free(m->embed_norm_w);
    free(m->embed_norm_b);
    free(m->norm);
    free(m->norm_b);
    sp_ws_free(&m->ws);
    pthread_mutex_destroy(&m->head_lock);
    free(m);
}

sp_status sp_model_quantize(sp_model *m, sp_wtype t, int head, sp_err *err)
{
    for (int i = 0; i < m->last - m->first; i++) {
        sp_status s = sp_block_quantize(&m->blocks[i], t, err);
        if (s)
            return sp_err_prefix(err, "block %d to %s: ", m->first + i, sp_wtype_name(t));
    }
    if (!head || !m->lm_head || t == m->head_q.type)
        return SP_OK;
    sp_qmat q;
    sp_status s = t == SP_W_F32 ? (q = sp_qmat_f32(m->lm_head, m->cfg.vocab, m->cfg.hidden), SP_OK)
                                : sp_qmat_encode(&q, t, m->lm_head, m->cfg.vocab, m->cfg.hidden, err);
    if (s)
        return sp_err_prefix(err, "LM head to %s: ", sp_wtype_name(t));
    sp_qmat_free(&m->head_q);
    m->head_q = q;
    return SP_OK;
}

void sp_model_set_pool(sp_model *m, sp_pool *pool)
{
    m->pool = pool;
    for (int i = 0; i < m->last - m->first; i++)
        m->blocks[i].pool = pool ? pool : sp_pool_default();
}

/* ---------------------------------------------------------------------------------------------- */
/* caches */

sp_status sp_model_cache_init(sp_model_cache *c, const sp_model *m, int B, int cap, sp_err *err)
{
    c->nblocks = m->last - m->first;
    c->kv = calloc((size_t)(c->nblocks > 0 ? c->nblocks : 1), sizeof *c->kv);
    if (!c->kv)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < c->nblocks; i++) {
        sp_status s = sp_kv_init(&c->kv[i], B, cap, m->cfg.n_kv_heads, m->cfg.head_dim, err);
        if (s) {
            sp_model_cache_free(c);
            return s;
        }
    }
    return SP_OK;
}

void sp_model_cache_free(sp_model_cache *c)
{
    for (int i = 0; c->kv && i < c->nblocks; i++)
        sp_kv_free(&c->kv[i]);
    free(c->kv);
    c->kv = NULL;
    c->nblocks = 0;
}

void sp_model_cache_rewind(sp_model_cache *c, int len)
{
    for (int i = 0; i < c->nblocks; i++)
        if (c->kv[i].len > len)
            c->kv[i].len = len;
}

/* ---------------------------------------------------------------------------------------------- */
/* running */

sp_status sp_model_embed(sp_model *m, float *hidden, const int32_t *ids, int n, sp_err *err)
{
    if (!m->embed)
        return sp_errf(err, SP_ERR_STATE, "model: embeddings not loaded");
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= m->cfg.vocab)
            return sp_errf(err, SP_ERR_RANGE, "token id %d outside the vocabulary (0..%d)", ids[i], m->cfg.vocab - 1);
    sp_embedding_forward(hidden, ids, m->embed, n, m->cfg.hidden);
    return SP_OK;
}

sp_status sp_model_blocks(sp_model *m, float *hidden, int B, int T, int pos0, sp_model_cache *cache, sp_err *err)
{
    for (int i = 0; i < m->last - m->first; i++) {
        sp_status s = sp_block_forward(&m->blocks[i], hidden, hidden, B, T, pos0, cache ? &cache->kv[i] : NULL,
                                       &m->ws, err);
        if (s)
            return sp_err_prefix(err, "block %d: ", m->first + i);
    }
    return SP_OK;
}

void sp_model_embed_norm(const sp_model *m, float *hidden, int n)
{
    int H = m->cfg.hidden;
    for (int i = 0; m->embed_norm_w && i < n; i++) { /* a row at a time: in place, the statistics are scratch */
        float st[2];
        sp_layernorm_forward(hidden + (size_t)i * H, st, st + 1, hidden + (size_t)i * H, m->embed_norm_w,
                             m->embed_norm_b, 1, H, m->cfg.norm_eps);
    }
}

sp_status sp_model_final_norm(const sp_model *m, float *out, const float *hidden, int n, sp_err *err)
{
    if (!m->norm)
        return sp_errf(err, SP_ERR_STATE, "model: final norm not loaded");
    if (m->cfg.blk.norm == SP_NORM_RMS) {
        sp_rmsnorm_forward(out, NULL, hidden, m->norm, n, m->cfg.hidden, m->cfg.norm_eps);
        return SP_OK;
    }
    float small[2 * 64]; /* a decode batch's rows: no allocation */
    float *stats = n <= 64 ? small : malloc((size_t)n * 2 * sizeof(float));
    if (!stats)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    sp_layernorm_forward(out, stats, stats + n, hidden, m->norm, m->norm_b, n, m->cfg.hidden, m->cfg.norm_eps);
    if (stats != small)
        free(stats);
    return SP_OK;
}

sp_status sp_model_head(sp_model *m, float *logits, const float *hidden, int n, sp_err *err)
{
    if (!m->norm || !m->lm_head)
        return sp_errf(err, SP_ERR_STATE, "model: final norm / LM head not loaded");
    int H = m->cfg.hidden;
    /* a decode batch (up to 8 rows) goes through a buffer on the stack, as many rows at a time as fit (all of them
     * up to H = 2048, one at a time up to 16384): no allocation per token; a larger batch gets one of its own */
    enum { SMALL = 16 * 1024 };
    float small[SMALL];
    int rows = H <= SMALL ? SMALL / H : 0, chunk = n <= rows ? n : n <= 8 && rows ? rows : n;
    float *tmp = chunk == n && n * (size_t)H > SMALL ? malloc((size_t)n * H * sizeof(float)) : small;
    if (!tmp)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    sp_status s = SP_OK;
    for (int r0 = 0; !s && r0 < n; r0 += chunk) {
        int k = n - r0 < chunk ? n - r0 : chunk;
        const float *h = hidden + (size_t)r0 * H;
        float *out = logits + (size_t)r0 * m->cfg.vocab;
        s = sp_model_final_norm(m, tmp, h, k, err);
        if (!s && m->head_q.q) /* decode on the engine's kernels and pool (no BLAS threads), a batch on sgemm */
            sp_qmat_mul(&m->head_q, tmp, out, k, m->pool ? m->pool : sp_pool_default());
        else if (!s)
            sp_linear_forward(out, tmp, m->lm_head, NULL, k, H, m->cfg.vocab);
    }
    if (tmp != small)
        free(tmp);
    return s;
}

static sp_status head_argmax_locked(sp_model *m, int32_t *best, const float *hidden, int n, sp_err *err);

sp_status sp_model_head_argmax(sp_model *m, int32_t *best, const float *hidden, int n, sp_err *err)
{
    if (!m->norm || !m->lm_head)
        return sp_errf(err, SP_ERR_STATE, "model: final norm / LM head not loaded");
    pthread_mutex_lock(&m->head_lock); /* (a client's generations may run on several threads) */
    sp_status s = head_argmax_locked(m, best, hidden, n, err);
    pthread_mutex_unlock(&m->head_lock);
    return s;
}

/* The screen and the scratch of head_argmax_locked, once (lock held); out of memory for the screen leaves every row
 * to the f32 head, as before. */
static sp_status head_prepare_locked(sp_model *m, sp_err *err)
{
    int H = m->cfg.hidden, V = m->cfg.vocab;
    if (!m->head_buf && !(m->head_buf = malloc(((size_t)H + V) * sizeof(float))))
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    if (!m->head_screen_state && m->head_q.q && m->head_q.type == SP_W_F32) {
        sp_err e2 = {0};
        m->head_screen_state =
            sp_qmat_encode(&m->head_screen, SP_W_Q8, (const float *)m->head_q.q, V, H, &e2) ? -1 : 1;
    }
    return SP_OK;
}

void sp_model_head_prepare(sp_model *m)
{
    if (!m->norm || !m->lm_head)
        return;
    pthread_mutex_lock(&m->head_lock);
    sp_err err = {0}; /* (out of memory: the first sp_model_head_argmax says so) */
    head_prepare_locked(m, &err);
    pthread_mutex_unlock(&m->head_lock);
}

static sp_status head_argmax_locked(sp_model *m, int32_t *best, const float *hidden, int n, sp_err *err)
{
    int H = m->cfg.hidden, V = m->cfg.vocab;
    sp_status st = head_prepare_locked(m, err);
    if (st)
        return st;
    float *xn = m->head_buf, *logits = m->head_buf + H;
    sp_pool *pool = m->pool ? m->pool : sp_pool_default();
    for (int i = 0; i < n; i++) {
        sp_status s = sp_model_final_norm(m, xn, hidden + (size_t)i * H, 1, err);
        if (s)
            return s;
        int b = m->head_screen_state == 1 && m->head_q.type == SP_W_F32
                    ? sp_qmat_argmax(&m->head_q, &m->head_screen, xn, logits, pool)
                    : -1;
        if (b < 0) { /* every logit, as sp_model_head computes them */
            if (m->head_q.q)
                sp_qmat_mul(&m->head_q, xn, logits, 1, pool);
            else
                sp_linear_forward(logits, xn, m->lm_head, NULL, 1, H, V);
            b = sp_argmax(logits, V);
        }
        best[i] = b;
    }
    return SP_OK;
}

/* Embeddings and blocks over ids[B, T]: the hidden states in m->hid (grown to the largest step, kept). */
static sp_status run_blocks(sp_model *m, const int32_t *ids, int B, int T, int pos0, sp_model_cache *cache,
                            sp_err *err)
{
    size_t need = (size_t)B * T * m->cfg.hidden;
    if (m->hid_cap < need) {
        float *p = realloc(m->hid, need * sizeof(float));
        if (!p)
            return sp_errf(err, SP_ERR_NOMEM, "out of memory");
        m->hid = p;
        m->hid_cap = need;
    }
    sp_status s = sp_model_embed(m, m->hid, ids, B * T, err);
    if (!s)
        sp_model_embed_norm(m, m->hid, B * T);
    return s ? s : sp_model_blocks(m, m->hid, B, T, pos0, cache, err);
}

sp_status sp_model_forward(sp_model *m, float *logits, const int32_t *ids, int B, int T, int pos0,
                           sp_model_cache *cache, int last_only, sp_err *err)
{
    int H = m->cfg.hidden;
    sp_status s = run_blocks(m, ids, B, T, pos0, cache, err);
    if (!s && !last_only)
        s = sp_model_head(m, logits, m->hid, B * T, err);
    for (int b = 0; !s && last_only && b < B; b++) /* only each sequence's last position */
        s = sp_model_head(m, logits + (size_t)b * m->cfg.vocab, m->hid + ((size_t)b * T + T - 1) * H, 1, err);
    return s;
}

sp_status sp_model_forward_argmax(sp_model *m, int32_t *best, const int32_t *ids, int B, int T, int pos0,
                                  sp_model_cache *cache, sp_err *err)
{
    int H = m->cfg.hidden;
    SP_TRACE(SP_TR_ONE);
    sp_status s = run_blocks(m, ids, B, T, pos0, cache, err);
    SP_TRACE(SP_TR_ONE_BLOCKS);
    for (int b = 0; !s && b < B; b++)
        s = sp_model_head_argmax(m, best + b, m->hid + ((size_t)b * T + T - 1) * H, 1, err);
    SP_TRACE(SP_TR_ONE_HEAD);
    return s;
}

/* ---------------------------------------------------------------------------------------------- */
/* sampling and generation */

int sp_sample(sp_sampler *s, const float *logits, int V)
{
    int best = sp_argmax(logits, V); /* the first maximum */
    if (!s || s->temperature <= 0.0f)
        return best;
    /* softmax at temperature T, then one uniform draw */
    double sum = 0, mx = logits[best];
    for (int i = 0; i < V; i++)
        sum += exp((logits[i] - mx) / s->temperature);
    double r = sp_rng_f32(&s->rng) * sum, acc = 0;
    for (int i = 0; i < V; i++) {
        acc += exp((logits[i] - mx) / s->temperature);
        if (r < acc)
            return i;
    }
    return best;
}

sp_status sp_model_generate(sp_model *m, const int32_t *prompt, int n, int max_new, sp_sampler *s, int stop_at_eos,
                            int32_t *out, int *n_out, sp_token_cb cb, void *user, sp_err *err)
{
    *n_out = 0;
    if (n <= 0)
        return sp_errf(err, SP_ERR_ARG, "generate: empty prompt");
    int cap = n + (max_new > 0 ? max_new - 1 : 0); /* the last new token is never fed back */
    if (cap > m->cfg.max_pos)
        return sp_errf(err, SP_ERR_RANGE, "generate: %d prompt + %d new tokens exceed the model's context of %d", n,
                       max_new, m->cfg.max_pos);
    int greedy = !s || s->temperature <= 0.0f; /* the argmax alone (sp_model_forward_argmax) */
    float *logits = greedy ? NULL : malloc((size_t)m->cfg.vocab * sizeof(float));
    sp_model_cache cache = {0};
    sp_status st = logits || greedy ? sp_model_cache_init(&cache, m, 1, cap, err)
                                    : sp_errf(err, SP_ERR_NOMEM, "out of memory");
    int32_t next = 0;
    /* prefill the prompt, then one token per step */
    if (!st)
        st = greedy ? sp_model_forward_argmax(m, &next, prompt, 1, n, 0, &cache, err)
                    : sp_model_forward(m, logits, prompt, 1, n, 0, &cache, 1, err);
    for (int pos = n; !st && *n_out < max_new; pos++) {
        int tok = greedy ? next : sp_sample(s, logits, m->cfg.vocab);
        if (stop_at_eos && (tok == m->cfg.eos_id || tok == m->cfg.bos_id))
            break;
        out[(*n_out)++] = tok;
        if (cb && cb(tok, user))
            break;
        if (*n_out < max_new)
            st = greedy ? sp_model_forward_argmax(m, &next, &out[*n_out - 1], 1, 1, pos, &cache, err)
                        : sp_model_forward(m, logits, &out[*n_out - 1], 1, 1, pos, &cache, 1, err);
    }
    sp_model_cache_free(&cache);
    free(logits);
    return st;
}
