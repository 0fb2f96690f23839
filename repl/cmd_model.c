/* cmd_model.c - `sepal model info|check|generate|convert-llama2c`. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block.h"
#include "cli.h"
#include "config.h"
#include "convert_llama2c.h"
#include "model.h"
#include "safetensors.h"
#include "timeutil.h"
#include "tokenizer.h"

#define TOL_OUT 1e-4
#define TOL_GRAD 1e-3

static int fail_err(const sp_err *err)
{
    fprintf(stderr, "sepal: %s\n", err->msg);
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
static void describe_family(const sp_config *c)
{
    const char *norm = c->blk.norm == SP_NORM_RMS ? "RMSNorm" : "LayerNorm";
    char attn[160];
    sp_config_attention_desc(c, attn, sizeof attn);
    printf("block:          %s, %d %s%s%s\n", c->blk.parallel ? "parallel attention + MLP" : "attention then MLP",
           c->blk.norms, norm, c->blk.norms > 1 ? "s" : "",
           c->blk.qkv_bias ? ", biases" : c->blk.out_bias || c->blk.mlp_bias ? ", some biases" : ", no biases");
    printf("attention:      %s%s\n", attn, c->blk.qkv == SP_QKV_FUSED ? ", fused QKV" : "");
    if (c->blk.mlp == SP_MLP_MOE) {
        printf("mlp:            %s: %d experts of %d, %d per token\n", mlp_name(c), c->blk.n_experts, c->intermediate,
               c->blk.top_k);
        long long all = sp_config_block_params(c), active = sp_config_block_active_params(c);
        printf("experts:        a token uses %d of %d: %lld of the block's %lld parameters (%.0f%%)\n", c->blk.top_k,
               c->blk.n_experts, active, all, 100.0 * (double)active / (double)all);
    } else {
        printf("mlp:            %s, %d\n", mlp_name(c), c->intermediate);
    }
    if (c->blk.pos == SP_POS_ROPE)
        printf("rope:           %s, theta %.10g\n", rope_name(c->rope_type), c->rope_theta);
    printf("local parts:    embeddings%s, final %s, %s\n", c->embed_norm ? " + embedding LayerNorm" : "", norm,
           c->tie_embeddings ? "head tied to the embeddings" : "LM head");
    printf("KV cache:       %lld bytes per position per block (f32 K and V of %d KV head%s)\n",
           sp_config_kv_bytes_per_token(c), c->n_kv_heads, c->n_kv_heads > 1 ? "s" : "");
}

static int model_info(const char *dir)
{
    sp_err err = {0};
    sp_config c;
    if (sp_config_load(&c, dir, &err))
        return fail_err(&err);
    sp_safetensors *st = NULL;
    if (sp_st_open(&st, dir, &err))
        return fail_err(&err);
    long long params = 0;
    int dtype_count[SP_DTYPE__COUNT] = {0};
    for (int i = 0; i < sp_st_count(st); i++) {
        const sp_st_tensor *t = sp_st_get(st, sp_st_name(st, i), &err);
        if (!t) {
            sp_st_close(st);
            return fail_err(&err);
        }
        params += (long long)t->numel;
        dtype_count[t->dtype]++;
    }
    int ok = c.arch != SP_ARCH_UNKNOWN;
    printf("architecture:   %s (%s, %s)\n", c.architecture, ok ? sp_arch_name(c.arch) : c.model_type,
           ok ? "supported" : "unsupported; supported: " SP_SUPPORTED_ARCHS);
    printf("layers:         %d\n", c.n_layers);
    printf("hidden size:    %d\n", c.hidden);
    printf("intermediate:   %d\n", c.intermediate);
    printf("heads:          %d (kv heads %d, head dim %d)\n", c.n_heads, c.n_kv_heads, c.head_dim);
    printf("vocab:          %d\n", c.vocab);
    printf("context:        %d\n", c.max_pos);
    if (ok)
        describe_family(&c);
    printf("tied embedding: %s\n", c.tie_embeddings ? "yes" : "no");
    printf("parameters:     %lld (%.2fM)", params, (double)params / 1e6);
    if (ok) {
        long long blk = sp_config_block_params(&c);
        printf(": %d blocks of %lld, %lld local", c.n_layers, blk, params - (long long)c.n_layers * blk);
    }
    printf("\ndtype:          %s (config)", sp_dtype_name(c.dtype));
    for (int i = 0; i < SP_DTYPE__COUNT; i++)
        if (dtype_count[i])
            printf(", %d tensors %s", dtype_count[i], sp_dtype_name((sp_dtype)i));
    printf("\n");
    sp_st_close(st);
    return CLI_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* check */

typedef struct check_ctx {
    sp_model *m;
    sp_safetensors *golden;
    int failures;
    sp_err err;
} check_ctx;

static void report(check_ctx *c, const char *what, double e, double tol)
{
    int ok = e <= tol;
    printf("%-22s max|err| %.3e  %s (tol %.0e)\n", what, e, ok ? "ok" : "FAIL", tol);
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

static int check_logits(check_ctx *c, const int32_t *ids, int B, int T)
{
    size_t n = (size_t)B * T * c->m->cfg.vocab;
    float *want = golden_f32(c, "logits", n), *got = malloc(n * sizeof(float));
    int rc = want && got && !sp_model_forward(c->m, got, ids, B, T, 0, NULL, 0, &c->err) ? 0 : -1;
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
            rc = sp_block_forward(&m->blocks[i], got, in, B, T, 0, NULL, &m->ws, &c->err) ? -1 : 0;
        if (!rc) {
            snprintf(what, sizeof what, "block %d out", i);
            report(c, what, max_abs(got, out, n), TOL_OUT);
            rc = sp_block_backward(&m->blocks[i], got, gout, in, B, T, 0, NULL, &m->ws, &c->err) ? -1 : 0;
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
    if (!rc && (!got || sp_model_generate(c->m, prompt, pt, ot - pt, &greedy, 0, got, &n_new, NULL, NULL, &c->err)))
        rc = -1;
    if (!rc) {
        int mismatches = n_new != ot - pt;
        for (int i = 0; i < n_new && i < ot - pt; i++)
            mismatches += got[i] != want[pt + i];
        printf("%-22s %d/%d ids identical  %s\n", "greedy ids", ot - pt - mismatches, ot - pt,
               mismatches ? "FAIL" : "ok");
        c->failures += mismatches != 0;
    }
    free(prompt);
    free(want);
    free(got);
    return rc;
}

static int model_check(const char *dir, const char *golden_path)
{
    check_ctx c = {0};
    char gp[4096];
    if (!golden_path) {
        snprintf(gp, sizeof gp, "%s/golden.safetensors", dir);
        golden_path = gp;
    }
    if (sp_model_load(&c.m, dir, SP_LOAD_ALL, 0, -1, &c.err))
        return fail_err(&c.err);
    if (sp_st_open(&c.golden, golden_path, &c.err)) {
        sp_model_free(c.m);
        return fail_err(&c.err);
    }
    int B = 0, T = 0;
    int32_t *ids = golden_ids(&c, "input_ids", &B, &T);
    int rc = ids ? 0 : -1;
    printf("model %s (%s, %d layers), golden %s\n", dir, c.m->cfg.architecture, c.m->cfg.n_layers, golden_path);
    if (!rc)
        rc = check_logits(&c, ids, B, T);
    if (!rc)
        rc = check_blocks(&c, ids, B, T);
    if (!rc)
        rc = check_greedy(&c);
    free(ids);
    sp_st_close(c.golden);
    sp_model_free(c.m);
    if (rc)
        return fail_err(&c.err);
    printf("%s: %d check(s) failed\n", c.failures ? "FAIL" : "PASS", c.failures);
    return c.failures ? CLI_FAIL : CLI_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* generate */

typedef struct stream_ctx {
    sp_detok detok;
    int count;
} stream_ctx;

static int stream_token(int token, void *user)
{
    stream_ctx *s = user;
    char buf[SP_DETOK_BUF];
    size_t n = sp_detok_push(&s->detok, token, buf, sizeof buf);
    fwrite(buf, 1, n, stdout);
    fflush(stdout);
    s->count++;
    return 0;
}

static int model_generate(const char *dir, const char *prompt, long max_new, double temperature, long seed)
{
    sp_err err = {0};
    sp_tokenizer *tok = NULL;
    sp_model *m = NULL;
    int32_t *ids = NULL, *out = NULL;
    int *raw = NULL, n = 0, n_out = 0, rc = CLI_OK;
    if (sp_tokenizer_load(&tok, dir, &err) || sp_model_load(&m, dir, SP_LOAD_ALL, 0, -1, &err) ||
        sp_tokenizer_encode(tok, prompt, 1, &raw, &n, &err)) {
        rc = fail_err(&err);
        goto done;
    }
    ids = malloc((size_t)n * sizeof *ids);
    out = malloc((size_t)(max_new > 0 ? max_new : 1) * sizeof *out);
    if (!ids || !out) {
        fprintf(stderr, "sepal: out of memory\n");
        rc = CLI_FAIL;
        goto done;
    }
    for (int i = 0; i < n; i++)
        ids[i] = raw[i];
    if (n + max_new - 1 > m->cfg.max_pos)
        max_new = m->cfg.max_pos - n + 1; /* clamp to the context, as llama2.c does */
    if (max_new < 0)
        max_new = 0;
    stream_ctx sc = {0};
    sp_detok_init(&sc.detok, tok);
    for (int i = 0; i < n; i++) /* prime the decoder with the prompt so spacing continues correctly */
        sc.detok.prev = ids[i], sc.detok.at_start = 0;
    fputs(prompt, stdout);
    sp_sampler s = {.temperature = (float)temperature};
    sp_rng_seed(&s.rng, (uint64_t)seed);
    double t0 = sp_now_s();
    sp_status st = sp_model_generate(m, ids, n, (int)max_new, &s, 1, out, &n_out, stream_token, &sc, &err);
    double dt = sp_now_s() - t0;
    char tail[SP_DETOK_BUF];
    fwrite(tail, 1, sp_detok_flush(&sc.detok, tail, sizeof tail), stdout);
    printf("\n");
    if (st)
        rc = fail_err(&err);
    else
        fprintf(stderr, "sepal: %d prompt + %d new tokens in %.3f s (%.1f tok/s)\n", n, n_out, dt,
                dt > 0 ? n_out / dt : 0.0);
done:
    free(raw);
    free(ids);
    free(out);
    sp_model_free(m);
    sp_tokenizer_free(tok);
    return rc;
}

/* ---------------------------------------------------------------------------------------------- */
/* dispatch */

static void model_usage(void)
{
    fprintf(stderr, "usage: sepal model info DIR\n"
                    "       sepal model check DIR [--golden FILE]\n"
                    "       sepal model generate DIR --prompt TEXT [--max-new-tokens N] [--temperature T] [--seed S]\n"
                    "       sepal model convert-llama2c MODEL.bin TOKENIZER.bin OUTDIR\n");
}

static int parse_generate(int argc, char **argv)
{
    const char *prompt = NULL;
    long max_new = 64, seed = 0;
    double temperature = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "sepal: option '%s' needs a value\n", a);
            return CLI_USAGE;
        }
        if (!strcmp(a, "--prompt"))
            prompt = v;
        else if (!strcmp(a, "--max-new-tokens")) {
            if (cli_parse_int(a, v, 0, 1 << 20, &max_new))
                return CLI_USAGE;
        } else if (!strcmp(a, "--temperature")) {
            if (cli_parse_float(a, v, &temperature) || temperature < 0) {
                fprintf(stderr, "sepal: --temperature must be >= 0\n");
                return CLI_USAGE;
            }
        } else if (!strcmp(a, "--seed")) {
            if (cli_parse_int(a, v, 0, __LONG_MAX__, &seed))
                return CLI_USAGE;
        } else {
            fprintf(stderr, "sepal: unknown option '%s'\n", a);
            return CLI_USAGE;
        }
        i++;
    }
    if (!prompt) {
        fprintf(stderr, "sepal: model generate needs --prompt TEXT\n");
        return CLI_USAGE;
    }
    return model_generate(argv[0], prompt, max_new, temperature, seed);
}

int cmd_model(int argc, char **argv)
{
    if (argc < 2) {
        model_usage();
        return CLI_USAGE;
    }
    const char *sub = argv[0];
    if (!strcmp(sub, "info") && argc == 2)
        return model_info(argv[1]);
    if (!strcmp(sub, "check") && (argc == 2 || (argc == 4 && !strcmp(argv[2], "--golden"))))
        return model_check(argv[1], argc == 4 ? argv[3] : NULL);
    if (!strcmp(sub, "generate"))
        return parse_generate(argc - 1, argv + 1);
    if (!strcmp(sub, "convert-llama2c") && argc == 4) {
        sp_err err = {0};
        if (sp_convert_llama2c(argv[1], argv[2], argv[3], &err))
            return fail_err(&err);
        printf("%s\n", argv[3]);
        return CLI_OK;
    }
    model_usage();
    return CLI_USAGE;
}
