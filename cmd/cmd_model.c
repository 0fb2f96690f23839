/* cmd_model.c - `model info|check|generate|convert-llama2c|init`: a model directory used locally, without the swarm
 * (also `sepal model ...` from the shell). Exit statuses there: 0, 1 failure, 2 unsupported or usage. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "block.h"
#include "app.h"
#include "generate.h"
#include "kern.h"
#include "config.h"
#include "convert_llama2c.h"
#include "device.h"
#include "devparts.h"
#include "like.h"
#include "model.h"
#include "model_dev.h"
#include "paths.h"
#include "rng.h"
#include "safetensors.h"
#include "timeutil.h"
#include "tokenizer.h"

#define TOL_OUT 1e-4
#define TOL_GRAD 1e-3

enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2 };

static int fail_err(sp_app *app, const sp_err *err)
{
    sp_app_error(app, "%s", err->msg);
    return err->code == SP_ERR_UNSUPPORTED ? CLI_USAGE : CLI_FAIL;
}

/* ---------------------------------------------------------------------------------------------- */
/* info */

static const char *rope_name(sp_rope_type t)
{
    return t == SP_ROPE_LLAMA3 ? "llama3" : t == SP_ROPE_LINEAR ? "linear" : "default";
}

static const char *mlp_name(const sp_config *c)
{
    switch (c->blk.mlp) {
    case SP_MLP_SWIGLU: return "SwiGLU";
    case SP_MLP_GELU: return "GELU";
    case SP_MLP_GELU_TANH: return "GELU (tanh)";
    default: return "sparse mixture of SwiGLU experts";
    }
}

/* The family-specific lines: block structure, attention, MLP / experts, local parts. */
static void describe_family(sp_app *app, const sp_config *c)
{
    const char *norm = c->blk.norm == SP_NORM_RMS ? "RMSNorm" : "LayerNorm";
    char attn[160];
    sp_config_attention_desc(c, attn, sizeof attn);
    sp_out(app, "block:          %s, %d %s%s%s\n", c->blk.parallel ? "parallel attention + MLP" : "attention then MLP",
           c->blk.norms, norm, c->blk.norms > 1 ? "s" : "",
           c->blk.qkv_bias ? ", biases" : c->blk.out_bias || c->blk.mlp_bias ? ", some biases" : ", no biases");
    sp_out(app, "attention:      %s%s\n", attn, c->blk.qkv == SP_QKV_FUSED ? ", fused QKV" : "");
    if (c->blk.mlp == SP_MLP_MOE) {
        sp_out(app, "mlp:            %s: %d experts of %d, %d per token\n", mlp_name(c), c->blk.n_experts, c->intermediate,
               c->blk.top_k);
        long long all = sp_config_block_params(c), active = sp_config_block_active_params(c);
        sp_out(app, "experts:        a token uses %d of %d: %lld of the block's %lld parameters (%.0f%%)\n", c->blk.top_k,
               c->blk.n_experts, active, all, 100.0 * (double)active / (double)all);
    } else {
        sp_out(app, "mlp:            %s, %d\n", mlp_name(c), c->intermediate);
    }
    if (c->blk.pos == SP_POS_ROPE)
        sp_out(app, "rope:           %s, theta %.10g\n", rope_name(c->rope_type), c->rope_theta);
    sp_out(app, "local parts:    embeddings%s, final %s, %s\n", c->embed_norm ? " + embedding LayerNorm" : "", norm,
           c->tie_embeddings ? "head tied to the embeddings" : "LM head");
    sp_out(app, "KV cache:       %lld bytes per position per block (f32 K and V of %d KV head%s)\n",
           sp_config_kv_bytes_per_token(c), c->n_kv_heads, c->n_kv_heads > 1 ? "s" : "");
}

static int model_info(sp_app *app, const char *dir)
{
    sp_err err = {0};
    sp_config c;
    if (sp_config_load(&c, dir, &err))
        return fail_err(app, &err);
    sp_safetensors *st = NULL;
    if (sp_st_open(&st, dir, &err))
        return fail_err(app, &err);
    long long params = 0;
    int dtype_count[SP_DTYPE__COUNT] = {0};
    for (int i = 0; i < sp_st_count(st); i++) {
        const sp_st_tensor *t = sp_st_get(st, sp_st_name(st, i), &err);
        if (!t) {
            sp_st_close(st);
            return fail_err(app, &err);
        }
        params += (long long)t->numel;
        dtype_count[t->dtype]++;
    }
    int ok = c.arch != SP_ARCH_UNKNOWN;
    sp_out(app, "architecture:   %s (%s, %s)\n", c.architecture, ok ? sp_arch_name(c.arch) : c.model_type,
           ok ? "supported" : "unsupported; supported: " SP_SUPPORTED_ARCHS);
    sp_out(app, "layers:         %d\n", c.n_layers);
    sp_out(app, "hidden size:    %d\n", c.hidden);
    sp_out(app, "intermediate:   %d\n", c.intermediate);
    sp_out(app, "heads:          %d (kv heads %d, head dim %d)\n", c.n_heads, c.n_kv_heads, c.head_dim);
    sp_out(app, "vocab:          %d\n", c.vocab);
    sp_out(app, "context:        %d\n", c.max_pos);
    if (ok)
        describe_family(app, &c);
    sp_out(app, "tied embedding: %s\n", c.tie_embeddings ? "yes" : "no");
    sp_out(app, "parameters:     %lld (%.2fM)", params, (double)params / 1e6);
    if (ok) {
        long long blk = sp_config_block_params(&c);
        sp_out(app, ": %d blocks of %lld, %lld local", c.n_layers, blk, params - (long long)c.n_layers * blk);
    }
    sp_out(app, "\ndtype:          %s (config)", sp_dtype_name(c.dtype));
    for (int i = 0; i < SP_DTYPE__COUNT; i++)
        if (dtype_count[i])
            sp_out(app, ", %d tensors %s", dtype_count[i], sp_dtype_name((sp_dtype)i));
    sp_out(app, "\n");
    sp_st_close(st);
    return CLI_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* check */

typedef struct check_ctx {
    sp_app *app;
    sp_model *m;
    sp_mdev *dev; /* --device cuda: the blocks run there (NULL: here) */
    sp_safetensors *golden;
    int failures;
    sp_err err;
} check_ctx;

static void report(check_ctx *c, const char *what, double e, double tol)
{
    int ok = e <= tol;
    sp_out(c->app, "%-22s max|err| %.3e  %s (tol %.0e)\n", what, e, ok ? "ok" : "FAIL", tol);
    c->failures += !ok;
}

/* Reads a float golden tensor of `numel` elements; NULL (and err) if missing or the wrong size. */
static float *golden_f32(check_ctx *c, const char *name, size_t numel)
{
    const sp_st_tensor *t = sp_st_get(c->golden, name, &c->err);
    if (!t)
        return NULL;
    if (t->numel != numel) {
        sp_errf(&c->err, SP_ERR_FORMAT, "%s: golden tensor '%s' has %llu elements, expected %zu", t->file, name,
                (unsigned long long)t->numel, numel);
        return NULL;
    }
    float *x = malloc(numel * sizeof(float));
    if (x && sp_to_f32(x, t->data, t->dtype, numel, &c->err)) {
        free(x);
        return NULL;
    }
    return x;
}

/* Reads an integer golden tensor of rank 2 as int32; *B, *T get its shape. */
static int32_t *golden_ids(check_ctx *c, const char *name, int *B, int *T)
{
    const sp_st_tensor *t = sp_st_get(c->golden, name, &c->err);
    if (!t)
        return NULL;
    if (t->ndim != 2 || (t->dtype != SP_I64 && t->dtype != SP_I32)) {
        sp_errf(&c->err, SP_ERR_FORMAT, "%s: golden tensor '%s' must be a 2-d integer tensor", t->file, name);
        return NULL;
    }
    int32_t *ids = malloc(t->numel * sizeof(int32_t));
    for (uint64_t i = 0; ids && i < t->numel; i++) {
        int64_t v = 0;
        if (t->dtype == SP_I64)
            memcpy(&v, (const char *)t->data + 8 * i, 8);
        else {
            int32_t v32;
            memcpy(&v32, (const char *)t->data + 4 * i, 4);
            v = v32;
        }
        ids[i] = (int32_t)v;
    }
    *B = (int)t->shape[0];
    *T = (int)t->shape[1];
    return ids;
}

/* The whole model's logits [B, T, V] for ids: the blocks on the device when there is one (the embeddings and the head
 * here), else sp_model_forward. */
static sp_status model_logits(check_ctx *c, float *logits, const int32_t *ids, int B, int T)
{
    if (!c->dev)
        return sp_model_forward(c->m, logits, ids, B, T, 0, NULL, 0, &c->err);
    int n = B * T;
    float *h = malloc((size_t)n * c->m->cfg.hidden * sizeof(float));
    sp_status st = h ? sp_model_embed(c->m, h, ids, n, &c->err) : sp_errf(&c->err, SP_ERR_NOMEM, "out of memory");
    if (!st) {
        sp_model_embed_norm(c->m, h, n);
        st = sp_mdev_blocks(c->dev, h, B, T, 0, 0, &c->err);
    }
    if (!st)
        st = sp_model_head(c->m, logits, h, n, &c->err);
    free(h);
    return st;
}

/* Block i's forward and backward to its input at positions 0.., on the device when there is one. */
static sp_status block_fwd(check_ctx *c, int i, float *out, const float *in, int B, int T)
{
    return c->dev ? sp_mdev_forward(c->dev, i, out, in, B, T, &c->err)
                  : sp_block_forward(&c->m->blocks[i], out, in, B, T, 0, NULL, &c->m->ws, &c->err);
}

static sp_status block_bwd(check_ctx *c, int i, float *dinp, const float *dout, const float *in, int B, int T)
{
    return c->dev ? sp_mdev_backward(c->dev, i, dinp, dout, in, B, T, &c->err)
                  : sp_block_backward(&c->m->blocks[i], dinp, dout, in, B, T, 0, NULL, &c->m->ws, &c->err);
}

/* Greedy decoding of n_new ids after prompt[0 .. pt) with the device's blocks and KV caches (a prefill, then decode
 * steps of one position): the embeddings and the head's first maximum here, as sp_model_generate's. */
static sp_status dev_greedy(check_ctx *c, const int32_t *prompt, int pt, int n_new, int32_t *out)
{
    int H = c->m->cfg.hidden, len = pt, pos = 0;
    const int32_t *ids = prompt;
    float *h = malloc((size_t)pt * H * sizeof(float));
    sp_status st = h ? sp_mdev_caches(c->dev, 1, pt + n_new, &c->err) : sp_errf(&c->err, SP_ERR_NOMEM, "out of memory");
    for (int k = 0; !st && k < n_new; k++) {
        st = sp_model_embed(c->m, h, ids, len, &c->err);
        if (!st) {
            sp_model_embed_norm(c->m, h, len);
            st = sp_mdev_blocks(c->dev, h, 1, len, pos, 1, &c->err);
        }
        if (!st)
            st = sp_model_head_argmax(c->m, &out[k], h + (size_t)(len - 1) * H, 1, &c->err);
        pos += len;
        ids = &out[k];
        len = 1;
    }
    free(h);
    return st;
}

static int check_logits(check_ctx *c, const int32_t *ids, int B, int T)
{
    size_t n = (size_t)B * T * c->m->cfg.vocab;
    float *want = golden_f32(c, "logits", n), *got = malloc(n * sizeof(float));
    int rc = want && got && !model_logits(c, got, ids, B, T) ? 0 : -1;
    if (!rc) {
        double e = 0;
        for (size_t i = 0; i < n; i++)
            e = fmax(e, fabs((double)want[i] - got[i]));
        report(c, "logits", e, TOL_OUT);
    }
    free(want);
    free(got);
    return rc;
}

static double max_abs(const float *a, const float *b, size_t n)
{
    double e = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        e = d > e || isnan(d) ? (isnan(d) ? INFINITY : d) : e;
    }
    return e;
}

/* block.i.in -> block.i.out, and block.i.grad_out -> block.i.grad_in, for every block. */
static int check_blocks(check_ctx *c, const int32_t *ids, int B, int T)
{
    sp_model *m = c->m;
    size_t n = (size_t)B * T * m->cfg.hidden;
    float *got = malloc(n * sizeof(float)), *emb = malloc(n * sizeof(float));
    int rc = got && emb && !sp_model_embed(m, emb, ids, B * T, &c->err) ? 0 : -1;
    if (!rc)
        sp_model_embed_norm(m, emb, B * T); /* what enters block 0 (BLOOM: after its embedding LayerNorm) */
    for (int i = 0; !rc && i < m->cfg.n_layers; i++) {
        static const char *const parts[4] = {"in", "out", "grad_out", "grad_in"};
        float *g[4] = {NULL, NULL, NULL, NULL};
        char name[64], what[64];
        for (int p = 0; p < 4 && (p == 0 || g[p - 1]); p++) { /* stop at the first missing tensor */
            snprintf(name, sizeof name, "block.%d.%s", i, parts[p]);
            g[p] = golden_f32(c, name, n);
        }
        float *in = g[0], *out = g[1], *gout = g[2], *gin = g[3];
        rc = in && out && gout && gin ? 0 : -1;
        if (!rc && i == 0)
            report(c, "embeddings", max_abs(emb, in, n), TOL_OUT);
        if (!rc)
            rc = block_fwd(c, i, got, in, B, T) ? -1 : 0;
        if (!rc) {
            snprintf(what, sizeof what, "block %d out", i);
            report(c, what, max_abs(got, out, n), TOL_OUT);
            rc = block_bwd(c, i, got, gout, in, B, T) ? -1 : 0;
        }
        if (!rc) {
            snprintf(what, sizeof what, "block %d grad_in", i);
            report(c, what, max_abs(got, gin, n), TOL_GRAD);
        }
        free(in);
        free(out);
        free(gout);
        free(gin);
    }
    free(got);
    free(emb);
    return rc;
}

static int check_greedy(check_ctx *c)
{
    int pb, pt, ob, ot, n_new = 0;
    int32_t *prompt = golden_ids(c, "greedy.prompt", &pb, &pt);
    int32_t *want = prompt ? golden_ids(c, "greedy.output", &ob, &ot) : NULL;
    int rc = want ? 0 : -1;
    if (!rc && (pb != 1 || ob != 1 || ot <= pt)) {
        sp_errf(&c->err, SP_ERR_FORMAT, "golden: greedy.prompt/greedy.output must be [1, n] with output longer");
        rc = -1;
    }
    int32_t *got = rc ? NULL : malloc((size_t)(ot - pt) * sizeof(int32_t));
    sp_sampler greedy = {.temperature = 0};
    if (!rc && c->dev) {
        n_new = ot - pt;
        rc = !got || dev_greedy(c, prompt, pt, n_new, got) ? -1 : 0;
    } else if (!rc && (!got || sp_model_generate(c->m, prompt, pt, ot - pt, &greedy, 0, got, &n_new, NULL, NULL,
                                                 &c->err))) {
        rc = -1;
    }
    if (!rc) {
        int mismatches = n_new != ot - pt;
        for (int i = 0; i < n_new && i < ot - pt; i++)
            mismatches += got[i] != want[pt + i];
        sp_out(c->app, "%-22s %d/%d ids identical  %s\n", "greedy ids", ot - pt - mismatches, ot - pt,
               mismatches ? "FAIL" : "ok");
        c->failures += mismatches != 0;
    }
    free(prompt);
    free(want);
    free(got);
    return rc;
}

/* gpu: the blocks on GPU gpu (--device cuda:N), or here (-1). */
static int model_check(sp_app *app, const char *dir, const char *golden_path, int gpu)
{
    check_ctx c = {.app = app};
    char gp[4096];
    sp_config cfg;
    if (!golden_path) {
        snprintf(gp, sizeof gp, "%s/golden.safetensors", dir);
        golden_path = gp;
        int model = !sp_config_load(&cfg, dir, &c.err) && cfg.arch != SP_ARCH_UNKNOWN;
        if (model && access(gp, F_OK)) /* a model we serve, but nothing to compare it with */
            return sp_app_error(app, "model check: %s has no golden.safetensors: give --golden FILE, the outputs to "
                                     "compare with (the model's logits, every block's in -> out and grad_in, greedy "
                                     "ids; safetensors as tests/data/hf-tiny/README.md describes)", dir);
    }
    char why[160];
    if (gpu >= 0 && !sp_device_usable(gpu, why, sizeof why)) /* before the model is read */
        return sp_app_error(app, "model check: --device cuda:%d: %s", gpu, why), CLI_USAGE;
    if (sp_model_load(&c.m, dir, SP_LOAD_ALL, 0, -1, &c.err))
        return fail_err(app, &c.err);
    if (sp_st_open(&c.golden, golden_path, &c.err) || (gpu >= 0 && sp_mdev_open(&c.dev, c.m, gpu, &c.err))) {
        sp_st_close(c.golden);
        sp_model_free(c.m);
        return fail_err(app, &c.err);
    }
    int B = 0, T = 0;
    int32_t *ids = golden_ids(&c, "input_ids", &B, &T);
    int rc = ids ? 0 : -1;
    sp_out(app, "model %s (%s, %d layers), golden %s\n", dir, c.m->cfg.architecture, c.m->cfg.n_layers, golden_path);
    if (c.dev)
        sp_out(app, "blocks on %s (the embeddings and the head here)\n", sp_mdev_name(c.dev));
    if (!rc)
        rc = check_logits(&c, ids, B, T);
    if (!rc)
        rc = check_blocks(&c, ids, B, T);
    if (!rc)
        rc = check_greedy(&c);
    free(ids);
    sp_mdev_close(c.dev);
    sp_st_close(c.golden);
    sp_model_free(c.m);
    if (rc)
        return fail_err(app, &c.err);
    sp_out(app, "%s: %d check(s) failed\n", c.failures ? "FAIL" : "PASS", c.failures);
    return c.failures ? CLI_FAIL : CLI_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* generate */

typedef struct stream_ctx {
    sp_app *app;
} stream_ctx;

static int stream_piece(int row, int token, const char *text, void *user)
{
    (void)row, (void)token;
    stream_ctx *s = user;
    sp_ui_event ev = {.kind = SP_UI_GEN_TEXT, .text = text};
    if (text && *text)
        sp_emit(s->app, &ev);
    return 0;
}

/* Generation with every block in this process: the same generator, sampler and options as `generate`; the
 * blocks and the head encoded in dtype (as a server's --dtype encodes its blocks), on a pool of `threads`
 * threads (0: the engine's default pool, every CPU); OpenBLAS runs one thread meanwhile, so that the pool splits
 * the prefill's large products (each part an sgemm of its rows) instead of OpenBLAS's own threads contending
 * with the pool's for the cores. */
static int model_generate(sp_app *app, const char *dir, const char *prompt, const sp_gen_opts *opts, sp_wtype dtype,
                          int threads)
{
    sp_err err = {0};
    sp_tokenizer *tok = NULL;
    sp_model *m = NULL;
    sp_pool *pool = NULL;
    int32_t *ids = NULL;
    int *raw = NULL, n = 0, rc = CLI_OK, blas_was = openblas_get_num_threads();
    sp_gen_opts o = *opts;
    if (threads > 0 && !(pool = sp_pool_new(threads))) {
        rc = sp_app_error(app, "model generate: cannot start %d threads", threads);
        goto done;
    }
    if (sp_tokenizer_load(&tok, dir, &err) || sp_model_load_encoded(&m, dir, SP_LOAD_ALL, 0, -1, dtype, &err) ||
        sp_model_quantize(m, dtype, 1, &err) || sp_tokenizer_encode(tok, prompt, 1, &raw, &n, &err)) {
        rc = fail_err(app, &err);
        goto done;
    }
    if (n > m->cfg.max_pos) { /* the rule of `generate` too: refuse what does not fit, clamp what it may add */
        rc = sp_app_error(app, "model generate: the prompt has %d tokens, more than the model's context of %d", n,
                          m->cfg.max_pos);
        goto done;
    }
    if (n + o.max_new - 1 > m->cfg.max_pos) {
        sp_warn(app, "--max-new-tokens %d: %d prompt token%s room for %d in the context of %d", o.max_new, n,
                n == 1 ? " leaves" : "s leave", m->cfg.max_pos - n + 1, m->cfg.max_pos);
        o.max_new = m->cfg.max_pos - n + 1;
    }
    if (!(ids = malloc((size_t)(n ? n : 1) * sizeof *ids))) {
        rc = sp_app_error(app, "out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++)
        ids[i] = raw[i];
    o.eos_id = m->cfg.eos_id;
    o.bos_id = m->cfg.bos_id;
    stream_ctx sc = {.app = app};
    sp_ui_event begin = {.kind = SP_UI_GEN_BEGIN, .text = prompt};
    sp_emit(app, &begin);
    if (pool)
        sp_model_set_pool(m, pool);
    openblas_set_num_threads(1);
    sp_lm_local loc;
    sp_lm lm = sp_lm_local_make(&loc, m);
    sp_gen_result r;
    const int32_t *ps[1] = {ids};
    if (sp_generate(&lm, tok, ps, &n, 1, &o, stream_piece, &sc, &r, &err)) {
        sp_ui_event nl = {.kind = SP_UI_GEN_TEXT, .text = "\n"};
        sp_emit(app, &nl);
        rc = sp_app_error(app, "model generate: %s", err.msg); /* CLI_FAIL */
        goto done;
    }
    sp_ui_gen g = {.prompt_tokens = n, .new_tokens = r.n[0], .prefill_s = r.prefill_s,
                   .decode_s = r.decode_s, .first_token_s = r.first_token_s, .stop = r.stop_reason,
                   .seed = (unsigned long long)o.sample.seed, .sampled = o.sample.temperature > 0};
    sp_ui_event end = {.kind = SP_UI_GEN_END, .gen = &g};
    sp_emit(app, &end);
    char kern[128];
    int nth = pool ? threads : sp_pool_threads(sp_pool_default());
    sp_kern_describe(kern, sizeof kern);
    sp_note(app, "model generate: %s, %d thread%s", kern, nth, nth == 1 ? "" : "s");
    if (r.stop_reason == SP_GEN_STOP_CANCELLED)
        sp_note(app, "^C (stopped after %d token%s)", r.n[0], r.n[0] == 1 ? "" : "s");
    sp_gen_result_free(&r);
done:
    free(raw);
    free(ids);
    sp_model_free(m);
    sp_tokenizer_free(tok);
    sp_pool_free(pool);
    openblas_set_num_threads(blas_was);
    return rc;
}

/* ---------------------------------------------------------------------------------------------- */
/* the commands */

static int cmd_info(sp_app *app, const sp_args *a) { return model_info(app, a->pos[0]); }

enum { CHECK_GOLDEN, CHECK_DEVICE, CHECK_NOPTS };
/* model generate's options: the rows of the settings of the same names give their kind, range and default (not
 * their current values: this runs without the swarm, and without the session's settings) */
enum {
    MG_PROMPT, MG_MAX_NEW_TOKENS, MG_TEMPERATURE, MG_TOP_K, MG_TOP_P, MG_SEED, MG_IGNORE_EOS, MG_MIN_NEW_TOKENS,
    MG_DTYPE, MG_THREADS, MG_NOPTS
};

static int cmd_check(sp_app *app, const sp_args *a)
{
    sp_err err = {0};
    int gpu = -1;
    const char *dev = sp_arg(app, a, CHECK_DEVICE);
    if (dev && sp_device_parse(dev, &gpu, &err))
        return sp_app_error(app, "model check: --device: %s", err.msg), CLI_USAGE;
    return model_check(app, a->pos[0], sp_arg(app, a, CHECK_GOLDEN), gpu);
}

static int cmd_gen(sp_app *app, const sp_args *a)
{
    const char *prompt = sp_arg(app, a, MG_PROMPT); /* required: the parser saw it */
    sp_gen_opts o;
    sp_gen_opts_default(&o);
    o.max_new = (int)sp_arg_int(app, a, MG_MAX_NEW_TOKENS);
    o.sample.temperature = (float)sp_arg_num(app, a, MG_TEMPERATURE);
    o.sample.top_k = (int)sp_arg_int(app, a, MG_TOP_K);
    o.sample.top_p = (float)sp_arg_num(app, a, MG_TOP_P);
    /* no --seed: a fresh one, printed at the end so that --seed S repeats the run (as `generate` does) */
    o.sample.seed = sp_arg_seed(app, a, MG_SEED);
    o.stop_at_eos = !sp_arg_given(a, MG_IGNORE_EOS);
    o.min_new = (int)sp_arg_int(app, a, MG_MIN_NEW_TOKENS);
    o.cancel = &app->cancel;
    static const int sampling[] = {MG_TOP_K, MG_TOP_P, MG_SEED};
    if (o.sample.temperature <= 0) /* greedy: said once, not silently ignored */
        sp_args_warn_unused(app, a, sampling, 3,
                            "at temperature 0 (greedy decoding; sampling needs --temperature above 0)");
    sp_wtype dtype = SP_W_F32; /* (a checked choice: a name sp_wtype_parse knows) */
    sp_wtype_parse(sp_arg(app, a, MG_DTYPE), &dtype);
    return model_generate(app, a->pos[0], prompt, &o, dtype, (int)sp_arg_int(app, a, MG_THREADS));
}

static int cmd_convert(sp_app *app, const sp_args *a)
{
    sp_err err = {0};
    if (sp_convert_llama2c(a->pos[0], a->pos[1], a->pos[2], &err))
        return fail_err(app, &err);
    sp_out(app, "%s\n", a->pos[2]);
    return CLI_OK;
}

enum { MI_LIKE, MI_LAYERS, MI_HIDDEN, MI_DTYPE, MI_SEED, MI_SHARD_SIZE, MI_NOPTS };

static void init_progress(void *user, uint64_t done, uint64_t total)
{
    sp_progress(user, "writing", (double)done / 1e9, (double)total / 1e9, "GB");
}

/* "DIR: llama-2-7b-shaped, 32 layers of 4096, 6.74B parameters, bf16, 13.48 GB in 3 shards; tokenizer: ..." */
static void init_summary(sp_app *app, const char *dir, const char *like, const sp_like_result *r, sp_dtype dtype)
{
    double p = (double)r->params, gb = (double)r->bytes / 1e9;
    int big = p >= 1e9, gbs = gb >= 1;
    sp_out(app, "%s: %s-shaped, %d layers of %d, %.*f%s parameters, %s, %.*f %s in %d shard%s; tokenizer: %s, %d "
           "tokens\n", dir, like, r->layers, r->hidden, big ? 2 : 1, p / (big ? 1e9 : 1e6), big ? "B" : "M",
           dtype == SP_F32 ? "f32" : "bf16", gbs ? 2 : 1, gbs ? gb : gb * 1e3, gbs ? "GB" : "MB", r->shards,
           r->shards == 1 ? "" : "s", r->synthetic_tokenizer ? "synthetic" : "stories15M's", r->vocab);
}

/* A model of real shape with random weights (core/like.h); the tokenizer of stories15M where it fits. */
static int cmd_init(sp_app *app, const sp_args *a)
{
    const char *like = sp_arg(app, a, MI_LIKE); /* required: the command layer has refused a line without it */
    sp_err err = {0};
    sp_like_opts o = {.like = like, .layers = (int)sp_arg_int(app, a, MI_LAYERS),
                      .hidden = (int)sp_arg_int(app, a, MI_HIDDEN),
                      .dtype = sp_arg_choice(app, a, MI_DTYPE) == 1 ? SP_F32 : SP_BF16,
                      .seed = (uint64_t)sp_arg_int(app, a, MI_SEED), .cancel = &app->cancel,
                      .progress = init_progress, .user = app};
    if (sp_like_parse_size(sp_arg(app, a, MI_SHARD_SIZE), &o.shard_bytes, &err))
        return sp_app_error(app, "%s", err.msg), CLI_USAGE;
    char tok[4096], cache[4000];
    sp_cache_dir(cache, sizeof cache);
    snprintf(tok, sizeof tok, "%s/models/stories15M", cache);
    o.tokenizer = tok;
    sp_like_result r;
    sp_status st = sp_like_init(a->pos[0], &o, &r, &err);
    sp_progress_end(app, "writing");
    if (st)
        return st == SP_ERR_ARG ? (sp_app_error(app, "%s", err.msg), CLI_USAGE) : fail_err(app, &err);
    if (r.synthetic_tokenizer && r.vocab == 32000)
        sp_note(app, "no stories15M tokenizer in %s (scripts/fetch-model.sh fetches it): a synthetic one", tok);
    init_summary(app, a->pos[0], like, &r, o.dtype);
    return CLI_OK;
}

static const sp_opt init_opts[] = {
    [MI_LIKE] = {"--like", SP_OPT_CHOICE, .choices = SP_LIKE_NAMES, .required = 1,
                 .help = "the model whose shapes to take"},
    [MI_LAYERS] = {"--layers", SP_OPT_INT, "N", 1, 1000,
                   .help = "fewer layers than the model has (the width stays); default: all"},
    [MI_HIDDEN] = {"--hidden", SP_OPT_INT, "N", 64, 1 << 20,
                   .help = "a narrower width (small models for tests): the same heads, the head size and the MLP in "
                           "proportion; default: the model's"},
    [MI_DTYPE] = {"--dtype", SP_OPT_CHOICE, .choices = "bf16|f32", .def = "bf16", .help = "the weights on disk"},
    [MI_SEED] = {"--seed", SP_OPT_INT, "S", 0, SP_RNG_SEED_MAX, .def = "0",
                 .help = "the weights' seed: the same seed writes the same tensors"},
    [MI_SHARD_SIZE] = {"--shard-size", SP_OPT_STR, "SIZE", .def = "5GB",
                       .help = "the largest shard (5GB, 500MB, 2GiB), as transformers' max_shard_size"},
    [MI_NOPTS] = {0},
};

static const sp_opt check_opts[] = {
    [CHECK_GOLDEN] = {"--golden", SP_OPT_PATH, "FILE",
                      .help = "the golden outputs to compare with (default DIR/golden.safetensors)"},
    [CHECK_DEVICE] = {"--device", SP_OPT_STR, "cpu|cuda[:N]", .def = "cpu",
                      .help = "where the blocks run: here, or on CUDA GPU N (the embeddings and the head stay here)"},
    [CHECK_NOPTS] = {0},
};

static const sp_opt gen_opts[] = {
    [MG_PROMPT] = {"--prompt", SP_OPT_STR, "TEXT", .help = "the prompt", .required = 1},
    [MG_MAX_NEW_TOKENS] = {"--max-new-tokens", .meta = "N", SP_LIKE(SP_SET_MAX_NEW_TOKENS),
                           .help = "tokens to add at most"},
    [MG_TEMPERATURE] = {"--temperature", .meta = "T", SP_LIKE(SP_SET_TEMPERATURE),
                        .help = "sampling temperature; 0 is greedy"},
    [MG_TOP_K] = {"--top-k", .meta = "K", SP_LIKE(SP_SET_TOP_K),
                  .help = "sample among the K likeliest tokens; 0 is off"},
    [MG_TOP_P] = {"--top-p", .meta = "P", SP_LIKE(SP_SET_TOP_P), .help = "nucleus sampling; 1 is off"},
    [MG_SEED] = {"--seed", .meta = "S", SP_LIKE(SP_SET_SEED),
                 .help = "seed of sampling (printed at the end when it sampled): the same seed repeats a run; "
                         "`random` draws one"},
    [MG_IGNORE_EOS] = {"--ignore-eos", SP_OPT_FLAG, .help = "go on past the end-of-text token until --max-new-tokens"},
    [MG_MIN_NEW_TOKENS] = {"--min-new-tokens", .meta = "N", SP_LIKE(SP_SET_MIN_NEW_TOKENS),
                           .help = "the end-of-text token cannot come before N new tokens"},
    [MG_DTYPE] = {"--dtype", SP_LIKE(SP_SET_DTYPE),
                  .help = "the blocks and the LM head encoded so, as sepal-server --dtype encodes its blocks"},
    [MG_THREADS] = {"--threads", .meta = "N", SP_LIKE(SP_SET_THREADS),
                    .help = "compute threads (the engine's pool and OpenBLAS); 0 is every CPU it may run on"},
    [MG_NOPTS] = {0},
};

static const sp_cmd model_subs[] = {
    {.name = "info", .args = "DIR", .min_pos = 1, .max_pos = 1, .pos_paths = 1,
     .summary = "architecture, sizes, parameter count, dtypes", .examples = "model info ~/.cache/sepal/models/stories15M",
     .fn = cmd_info},
    {.name = "check", .args = "DIR", .min_pos = 1, .max_pos = 1, .pos_paths = 1, SP_OPTS(check_opts),
     .summary = "run the model in this process against golden outputs (logits, every block and its input gradient, "
                "greedy ids)",
     .fn = cmd_check},
    {.name = "generate", .args = "DIR", .min_pos = 1, .max_pos = 1, .pos_paths = 1, SP_OPTS(gen_opts),
     .summary = "generate in this process, without the swarm",
     .examples = "model generate ~/.cache/sepal/models/stories15M --prompt \"Once upon a time\" --max-new-tokens 20",
     .fn = cmd_gen},
    {.name = "convert-llama2c", .args = "MODEL.bin TOKENIZER.bin OUTDIR", .min_pos = 3, .max_pos = 3, .pos_paths = 1,
     .summary = "convert a llama2.c checkpoint to a Hugging Face directory", .fn = cmd_convert},
    {.name = "init", .args = "OUTDIR", .min_pos = 1, .max_pos = 1, .pos_paths = 1, SP_OPTS(init_opts),
     .summary = "write a model of a real model's shape with random weights (for benches and tests)",
     .examples = "model init llama-2-7b-narrow --like llama-2-7b --layers 2 --hidden 256", .fn = cmd_init},
    {0},
};

const sp_cmd sp_cmds_model[] = {
    {.name = "model", .args = "info|check|generate|convert-llama2c|init ...", .subs = model_subs,
     .summary = "inspect, check or run a model directory locally"},
    {0},
};
