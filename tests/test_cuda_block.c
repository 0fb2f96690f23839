/* test_cuda_block.c - the device block (cuda/block_cuda.h) against the CPU block (core/block.h) on a GPU: every
 * family and feature the device runs (GQA, multi-query, ALiBi, llama3 RoPE, LayerNorm with and without biases,
 * GELU, parallel blocks with one or two norms, Mixtral's router and sparse experts) in every weight encoding, at
 * odd shapes with random weights: forward without a cache (the fused decode products and the GEMM path), prefill
 * then decode steps with a KV cache (through CUDA graphs, rolled back and replayed, and the same steps without
 * graphs, without the fused kernels' dependent launches and with the plain kernels instead of the fused ones: the
 * same bits), a server's batch of several caches (against sp_block_decode_batch and each cache alone, with beam
 * search's reorder), Mixtral's decode steps of 1 to 8 rows with the experts' vectorised products and with the
 * one-weight-a-lane kernel, and the backward to the input from kept activations and recomputed. Without a GPU the suite
 * reports itself skipped (exit 77); the host-side parts (budget, sizes, what is supported, the experts' routing
 * arithmetic) are checked by test_cuda_host. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block.h"
#include "block_cuda.h"
#include "cuda_backend.h"
#include "cuda_emul.h"
#include "kern.h"
#include "kernels.h"
#include "rng.h"
#include "testrun.h"

static sp_cuda *cu; /* opened by main */

/* Families at odd shapes (no width a multiple of 32 but where a head count forces it), one feature set each. */
static const char *const configs[] = {
    /* llama, grouped-query (6 heads on 2), head size 18, FF not a multiple of the Q8 / NF4 blocks */
    "{\"model_type\":\"llama\",\"hidden_size\":108,\"num_attention_heads\":6,\"num_key_value_heads\":2,"
    "\"intermediate_size\":170,\"num_hidden_layers\":1,\"vocab_size\":64,\"rms_norm_eps\":1e-5,"
    "\"max_position_embeddings\":256}",
    /* llama3 RoPE scaling, multi-query (5 heads on 1) */
    "{\"model_type\":\"llama\",\"hidden_size\":90,\"num_attention_heads\":5,\"num_key_value_heads\":1,"
    "\"intermediate_size\":130,\"num_hidden_layers\":1,\"vocab_size\":64,\"rms_norm_eps\":1e-6,"
    "\"max_position_embeddings\":512,\"rope_parameters\":{\"factor\":8.0,\"high_freq_factor\":4.0,"
    "\"low_freq_factor\":1.0,\"original_max_position_embeddings\":8,\"rope_theta\":500000.0,"
    "\"rope_type\":\"llama3\"}}",
    /* bloom: ALiBi, LayerNorm, GELU (tanh), biases everywhere */
    "{\"model_type\":\"bloom\",\"hidden_size\":84,\"n_head\":7,\"layer_norm_epsilon\":1e-5,\"num_hidden_layers\":1,"
    "\"vocab_size\":64}",
    /* falcon-7b: multi-query, parallel attention and MLP sharing one LayerNorm, GELU (erf) */
    "{\"model_type\":\"falcon\",\"multi_query\":true,\"parallel_attn\":true,\"bias\":false,\"hidden_size\":88,"
    "\"num_attention_heads\":4,\"num_hidden_layers\":1,\"vocab_size\":64}",
    /* falcon-40b: grouped KV heads, two LayerNorms in parallel, biases */
    "{\"model_type\":\"falcon\",\"new_decoder_architecture\":true,\"parallel_attn\":true,\"bias\":true,"
    "\"hidden_size\":100,\"num_attention_heads\":10,\"num_kv_heads\":2,\"ffn_hidden_size\":150,"
    "\"num_ln_in_parallel_attn\":2,\"num_hidden_layers\":1,\"vocab_size\":64}",
    /* llama at widths of whole 16-byte chunks (and NF4 blocks), grouped-query (4 heads on 2): the vectorised decode
     * products, q, k and v in one launch of three segments, SwiGLU's gate and up rows in each warp */
    "{\"model_type\":\"llama\",\"hidden_size\":128,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
    "\"intermediate_size\":192,\"num_hidden_layers\":1,\"vocab_size\":64,\"rms_norm_eps\":1e-5,"
    "\"max_position_embeddings\":256}",
    /* falcon, sequential (attention then MLP), multi-head */
    "{\"model_type\":\"falcon\",\"multi_query\":false,\"parallel_attn\":false,\"bias\":true,\"hidden_size\":60,"
    "\"num_attention_heads\":6,\"num_hidden_layers\":1,\"vocab_size\":64}",
    /* mixtral: 5 experts of FF 150, 2 a token (so that some expert gets no token of a short step), GQA 6 on 2; rows
     * not whole 16-byte chunks (but f32's 84 columns of gate and up): the experts' one-weight-a-lane kernel */
    "{\"model_type\":\"mixtral\",\"hidden_size\":84,\"num_attention_heads\":6,\"num_key_value_heads\":2,"
    "\"intermediate_size\":150,\"num_local_experts\":5,\"num_experts_per_tok\":2,\"num_hidden_layers\":1,"
    "\"vocab_size\":64,\"rms_norm_eps\":1e-5,\"max_position_embeddings\":256}",
    /* mixtral at widths of whole chunks and NF4 blocks (H 128, FF 192), 6 experts, 2 a token, GQA 4 on 2: decode
     * steps stream the used experts' matrices by the vectorised kernel (gate and up with the SwiGLU, then down) */
    "{\"model_type\":\"mixtral\",\"hidden_size\":128,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
    "\"intermediate_size\":192,\"num_local_experts\":6,\"num_experts_per_tok\":2,\"num_hidden_layers\":1,"
    "\"vocab_size\":64,\"rms_norm_eps\":1e-5,\"max_position_embeddings\":256}",
};
#define NCFG ((int)(sizeof configs / sizeof *configs))
#define FIRST_MOE 7 /* configs from here on are mixtral's */

/* Tolerances, as max |device - cpu| / max |cpu| over a result. f32: the same arithmetic summed in other orders.
 * Encoded weights decode to the same floats on both sides (kmath.h), and the CPU runs its scalar kernels (main:
 * its SIMD levels multiply int8 / NF4 by x quantised to int8, the device by x in f32: at widths of whole blocks
 * the two differed by 1.04e-2 in a decode step on an H200), but products of more than 8 rows and the backward's
 * may run on bf16 tensor cores (the activations or gradients rounded to bf16, 2^-9 relative each; fp16 weights'
 * on fp16 ones, 2^-12), a few of them in a row: 1e-2. */
static const double tol_fwd[SP_W__COUNT] = {[SP_W_F32] = 1e-4, [SP_W_BF16] = 1e-2, [SP_W_Q8] = 1e-2,
                                            [SP_W_NF4] = 1e-2, [SP_W_F16] = 1e-2};
static const double tol_bwd[SP_W__COUNT] = {[SP_W_F32] = 1e-4, [SP_W_BF16] = 1e-2, [SP_W_Q8] = 1e-2,
                                            [SP_W_NF4] = 1e-2, [SP_W_F16] = 1e-2};



static float *dev(const float *h, size_t n)
{
    void *d = NULL;
    OK(sp_cuda_dup(cu, &d, h, n * sizeof(float), E));
    return d;
}

static float *dev_zero(size_t n)
{
    void *d = NULL;
    OK(sp_cuda_alloc(cu, &d, n * sizeof(float), E));
    return d;
}

static float *host(const float *d, size_t n)
{
    float *h = malloc(n * sizeof(float));
    OK(sp_cuda_sync(cu, E));
    OK(sp_cuda_download(cu, h, d, n * sizeof(float), E));
    return h;
}

static float *randn(sp_rng *r, size_t n, float sd)
{
    float *x = malloc(n * sizeof(float));
    sp_rng_fill_normal(r, x, (long)n, sd);
    return x;
}

/* Config ci's block with random weights (norm gains near 1) encoded in t, and its device copy. */
typedef struct tcase {
    sp_config cfg;
    sp_rope rope;
    sp_block b;
    sp_cuda_block *cb;
    int H;
} tcase;

static void case_init(tcase *c, int ci, sp_wtype t)
{
    sp_err err = {0};
    ck_assert_msg(sp_config_parse(&c->cfg, configs[ci], "test", &err) == SP_OK, "%s", err.msg);
    if (c->cfg.blk.pos == SP_POS_ROPE)
        ck_assert_msg(sp_rope_init(&c->rope, &c->cfg, &err) == SP_OK, "%s", err.msg);
    ck_assert_msg(sp_block_init(&c->b, &c->cfg, &c->rope, &err) == SP_OK, "%s", err.msg);
    sp_rng r;
    sp_rng_seed(&r, 100 + (uint64_t)ci);
    sp_rng_fill_normal(&r, c->b.mem, (long)c->b.numel, 0.08f);
    float *gains[] = {c->b.ln1_w, c->b.ln2_w};
    for (int g = 0; g < 2; g++)
        for (int i = 0; gains[g] && i < c->b.H; i++)
            gains[g][i] += 1.0f;
    /* Experts: the router's choice is a step function of its input, which passes through the attention's products
     * (on bf16 tensor cores on the device: 1e-3 relative). A token whose second and third logits are that close
     * would take another expert on each side; with the attention's output scaled down 100 times the router sees
     * its input within 1e-5 on both sides, and no token of these cases comes near a tie. */
    for (size_t i = 0; c->b.k.mlp == SP_MLP_MOE && i < (size_t)c->b.H * c->b.nh * c->b.hd; i++)
        c->b.wo[i] *= 0.01f;
    ck_assert_msg(sp_block_quantize(&c->b, t, &err) == SP_OK, "%s", err.msg);
    ck_assert_msg(sp_cuda_block_upload(cu, &c->cb, &c->b, &err) == SP_OK, "%s", err.msg);
    c->H = c->b.H;
}

static void case_free(tcase *c)
{
    sp_cuda_block_free(c->cb);
    sp_block_free(&c->b);
}

/* One forward of [B, T] without a cache on both sides. */
static void check_forward(tcase *c, sp_wtype t, int B, int T, int pos0, sp_rng *r, const char *what)
{
    size_t n = (size_t)B * T * c->H;
    float *x = randn(r, n, 1.0f), *want = malloc(n * sizeof(float)), *dx = dev(x, n), *dy = dev_zero(n);
    sp_ws ws = {0};
    sp_err err = {0};
    ck_assert_int_eq(sp_block_forward(&c->b, want, x, B, T, pos0, NULL, &ws, &err), SP_OK);
    OK(sp_cuda_block_forward(c->cb, dy, dx, B, T, pos0, NULL, E));
    float *got = host(dy, n);
    double e = emul_rel_err(got, want, n);
    ck_assert_msg(e <= tol_fwd[t], "%s %s [%d, %d]: error %.3g > %.3g", what, sp_wtype_name(t), B, T, e, tol_fwd[t]);
    OK(sp_cuda_block_forward(c->cb, dx, dx, B, T, pos0, NULL, E)); /* in place: the same bits */
    float *again = host(dx, n);
    ck_assert_msg(memcmp(again, got, n * sizeof(float)) == 0, "%s %s [%d, %d]: in place differs", what,
                  sp_wtype_name(t), B, T);
    free(x), free(want), free(got), free(again);
    sp_ws_free(&ws);
    sp_cuda_free(cu, dx), sp_cuda_free(cu, dy);
}

START_TEST(t_block_forward_vs_cpu)
{
    for (int t = 0; t < SP_W__COUNT; t++) {
        tcase c;
        case_init(&c, _i, (sp_wtype)t);
        ck_assert_msg(sp_cuda_block_bytes(c.cb) == sp_block_bytes(&c.b), "%s %s: %zu bytes on the device, %zu here",
                      c.cfg.model_type, sp_wtype_name((sp_wtype)t), sp_cuda_block_bytes(c.cb), sp_block_bytes(&c.b));
        sp_rng r;
        sp_rng_seed(&r, 7);
        check_forward(&c, (sp_wtype)t, 2, 7, 0, &r, c.cfg.model_type); /* 14 rows: the GEMM path */
        check_forward(&c, (sp_wtype)t, 1, 3, 11, &r, c.cfg.model_type);  /* 3 rows: fused products, pos0 11 */
        check_forward(&c, (sp_wtype)t, 2, 70, 4, &r, c.cfg.model_type); /* 140 rows: flash tiles, the bf16 path */
        case_free(&c);
    }
}
END_TEST

/* Prefill of P positions, then decode steps, on both sides; device outputs of every step into steps_out. fused:
 * sp_cuda_block_use_fused's level for the steps. */
static void run_cached(tcase *c, sp_wtype t, int graphs, int fused, int B, float *steps_out, int nsteps,
                       int with_cpu)
{
    int P = 5, cap = 16, H = c->H;
    sp_cuda_block_use_graphs(c->cb, graphs);
    sp_cuda_block_use_fused(c->cb, fused);
    sp_kv_cache kv;
    sp_cuda_kv *dkv = NULL;
    sp_err err = {0};
    sp_cuda_budget budget = {.limit = sp_cuda_kv_bytes(&c->b, B, cap)};
    ck_assert_int_eq(sp_kv_init(&kv, B, cap, c->b.nkv, c->b.hd, &err), SP_OK);
    OK(sp_cuda_kv_new(c->cb, &dkv, B, cap, &budget, E));
    ck_assert_uint_eq(budget.used, budget.limit);
    sp_rng r;
    sp_rng_seed(&r, 9);
    size_t np = (size_t)B * P * H, ns = (size_t)B * H;
    float *x = randn(&r, np, 1.0f), *want = malloc(np * sizeof(float)), *dx = dev(x, np), *dy = dev_zero(np);
    sp_ws ws = {0};
    ck_assert_int_eq(sp_block_forward(&c->b, want, x, B, P, 0, &kv, &ws, &err), SP_OK);
    OK(sp_cuda_block_forward(c->cb, dy, dx, B, P, 0, dkv, E));
    float *got = host(dy, np);
    double e = emul_rel_err(got, want, np);
    ck_assert_msg(e <= tol_fwd[t], "%s prefill %s B %d: error %.3g > %.3g", c->cfg.model_type, sp_wtype_name(t), B, e,
                  tol_fwd[t]);
    free(got);
    /* steps 0 .. nsteps-2 in order, then roll both back by 2 and run the last step at the earlier position: the
     * graph, captured at another position, replays there */
    float *xs = randn(&r, ns * (size_t)nsteps, 1.0f), *ys = malloc(ns * sizeof(float));
    for (int s = 0; s < nsteps; s++) {
        if (s == nsteps - 1) {
            kv.len -= 2;
            OK(sp_cuda_kv_set_len(dkv, sp_cuda_kv_len(dkv) - 2, E));
        }
        int pos = sp_cuda_kv_len(dkv);
        ck_assert_int_eq(pos, kv.len);
        OK(sp_cuda_upload(cu, dx, xs + ns * s, ns * sizeof(float), E));
        OK(sp_cuda_block_forward(c->cb, dy, dx, B, 1, pos, dkv, E));
        float *g = host(dy, ns);
        memcpy(steps_out + ns * s, g, ns * sizeof(float));
        if (with_cpu) {
            ck_assert_int_eq(sp_block_forward(&c->b, ys, xs + ns * s, B, 1, pos, &kv, &ws, &err), SP_OK);
            e = emul_rel_err(g, ys, ns);
            ck_assert_msg(e <= tol_fwd[t], "%s decode step %d at %d %s B %d graphs %d: error %.3g > %.3g",
                          c->cfg.model_type, s, pos, sp_wtype_name(t), B, graphs, e, tol_fwd[t]);
        } else {
            kv.len++;
        }
        free(g);
        ck_assert_int_eq(sp_cuda_kv_len(dkv), pos + 1);
    }
    ck_assert_msg(sp_cuda_kv_graphed(dkv) == (graphs && B <= 8), "%s %s B %d graphs %d: graphed %d",
                  c->cfg.model_type, sp_wtype_name(t), B, graphs, sp_cuda_kv_graphed(dkv));
    /* the device cache holds what the CPU's does */
    const float *dk, *dv;
    sp_cuda_kv_arrays(dkv, &dk, &dv);
    size_t nk = (size_t)B * cap * c->b.nkv * c->b.hd;
    float *hk = host(dk, nk);
    for (int b = 0; with_cpu && b < B; b++) {
        size_t off = (size_t)b * cap * c->b.nkv * c->b.hd, used = (size_t)kv.len * c->b.nkv * c->b.hd;
        e = emul_rel_err(hk + off, kv.k + off, used);
        ck_assert_msg(e <= tol_fwd[t], "%s %s cached keys row %d: error %.3g", c->cfg.model_type, sp_wtype_name(t), b,
                      e);
    }
    /* a step past the cache's length is refused, and nothing changes */
    sp_cuda_kv_set_len(dkv, 0, &err);
    ck_assert_int_eq(sp_cuda_block_forward(c->cb, dy, dx, B, 1, 3, dkv, &err), SP_ERR_ARG);
    free(hk), free(x), free(want), free(xs), free(ys);
    sp_ws_free(&ws);
    sp_kv_free(&kv);
    sp_cuda_kv_free(dkv);
    ck_assert_uint_eq(budget.used, 0);
    sp_cuda_free(cu, dx), sp_cuda_free(cu, dy);
    sp_cuda_block_use_graphs(c->cb, 1);
    sp_cuda_block_use_fused(c->cb, 2);
}

/* Decode steps against the CPU's (fused kernels as dependent launches, through graphs), then the same steps without
 * graphs, with the fused kernels launched plainly and with the plain kernels (sp_cuda_block_use_fused 1, 0): the
 * same sums in the same order, so the same bits; so do the attention's keys a warp (sp_cuda_attn_tune) and L2 asked
 * for the next product's weights (sp_cuda_block_use_prefetch 1 and 255 MiB: all of these small blocks' matrices). */
START_TEST(t_block_decode_vs_cpu)
{
    int nsteps = 5;
    for (int t = 0; t < SP_W__COUNT; t++)
        for (int B = 1; B <= 9; B += 8) { /* 9 rows: past the graphs' limit, launched one by one */
            tcase c;
            case_init(&c, _i, (sp_wtype)t);
            size_t ns = (size_t)B * c.H * nsteps;
            float *with = malloc(ns * sizeof(float)), *other = malloc(ns * sizeof(float));
            run_cached(&c, (sp_wtype)t, 1, 2, B, with, nsteps, 1);
            struct {
                int graphs, fused;
            } runs[] = {{0, 2}, {1, 1}, {1, 0}};
            for (int i = 0; i < 3; i++) {
                run_cached(&c, (sp_wtype)t, runs[i].graphs, runs[i].fused, B, other, nsteps, 0);
                ck_assert_msg(memcmp(with, other, ns * sizeof(float)) == 0,
                              "%s: graphs %d, fused %d changed the numbers (%s, B %d): error %.3g", c.cfg.model_type,
                              runs[i].graphs,
                              runs[i].fused, sp_wtype_name((sp_wtype)t), B, emul_rel_err(other, with, ns));
            }
            for (int keys = 8; keys <= 16; keys *= 2) { /* the attention's keys a warp: each score summed as alone */
                sp_cuda_attn_tune(keys);
                run_cached(&c, (sp_wtype)t, 1, 2, B, other, nsteps, 0);
                sp_cuda_attn_tune(0);
                ck_assert_msg(memcmp(with, other, ns * sizeof(float)) == 0,
                              "%s: %d keys a warp changed the numbers (%s, B %d): error %.3g", c.cfg.model_type, keys,
                              sp_wtype_name((sp_wtype)t), B, emul_rel_err(other, with, ns));
            }
            for (int mib = 1; mib <= 255; mib += 254) { /* L2 asked for the next product's weights: a hint */
                sp_cuda_block_use_prefetch(c.cb, mib);
                run_cached(&c, (sp_wtype)t, 1, 2, B, other, nsteps, 0);
                sp_cuda_block_use_prefetch(c.cb, 0);
                ck_assert_msg(memcmp(with, other, ns * sizeof(float)) == 0,
                              "%s: a prefetch of %d MiB changed the numbers (%s, B %d): error %.3g", c.cfg.model_type,
                              mib, sp_wtype_name((sp_wtype)t), B, emul_rel_err(other, with, ns));
            }
            free(with), free(other);
            case_free(&c);
        }
}
END_TEST

/* Mixtral's decode steps of 1 to 8 rows (the experts chosen on the device, graphed) against the CPU's, with the
 * experts' vectorised products (the default) and with the one-weight-a-lane kernel (sp_cuda_block_use_moe_vec 0),
 * each within the tolerance. The switch takes effect (other sums, so other bits in some step) where an encoding's
 * rows are whole 16-byte chunks, and changes nothing where none are (both take the one-weight-a-lane kernel); under
 * a cache whose steps replay a graph it takes effect at the next step (captured anew), and back. */
START_TEST(t_moe_decode_rows_vs_cpu)
{
    static const int per_chunk[SP_W__COUNT] = {[SP_W_F32] = 4, [SP_W_BF16] = 8, [SP_W_Q8] = 16, [SP_W_NF4] = 64,
                                               [SP_W_F16] = 8};
    int nsteps = 3;
    for (int t = 0; t < SP_W__COUNT; t++) {
        tcase c;
        case_init(&c, _i, (sp_wtype)t);
        ck_assert_int_eq(c.b.k.mlp, SP_MLP_MOE);
        int chunked = c.H % per_chunk[t] == 0 || c.b.FF % per_chunk[t] == 0, differed = 0;
        for (int B = 1; B <= 8; B++) {
            size_t ns = (size_t)B * c.H * nsteps;
            float *vec = malloc(ns * sizeof(float)), *lane = malloc(ns * sizeof(float));
            run_cached(&c, (sp_wtype)t, 1, 2, B, vec, nsteps, 1);
            sp_cuda_block_use_moe_vec(c.cb, 0);
            run_cached(&c, (sp_wtype)t, 1, 2, B, lane, nsteps, 1);
            sp_cuda_block_use_moe_vec(c.cb, 1);
            differed |= memcmp(vec, lane, ns * sizeof(float)) != 0;
            double e = emul_rel_err(lane, vec, ns);
            ck_assert_msg(e <= tol_fwd[t], "%s %s B %d: the two experts' kernels differ by %.3g > %.3g",
                          c.cfg.model_type, sp_wtype_name((sp_wtype)t), B, e, tol_fwd[t]);
            free(vec), free(lane);
        }
        ck_assert_msg(differed == chunked, "%s %s (H %d, FF %d): the experts' kernels %s", c.cfg.model_type,
                      sp_wtype_name((sp_wtype)t), c.H, c.b.FF,
                      chunked ? "gave the same bits (the vectorised one did not run)" : "differ without chunks");
        /* the switch under a cache whose steps replay a graph: the step at position 2 again with the other kernel
         * (captured anew: the one-weight-a-lane bits where there are chunks), then back (the first bits) */
        sp_cuda_kv *kv = NULL;
        sp_rng r;
        sp_rng_seed(&r, 23);
        size_t H = (size_t)c.H;
        float *x = randn(&r, 3 * H, 1.0f), *dx = dev_zero(H), *dy = dev_zero(H), *got[3];
        OK(sp_cuda_kv_new(c.cb, &kv, 1, 8, NULL, E));
        for (int i = 0; i < 5; i++) { /* positions 0, 1, 2; then 2 lane; then 2 vectorised */
            int pos = i < 3 ? i : 2;
            if (i >= 3) {
                sp_cuda_block_use_moe_vec(c.cb, i == 4);
                OK(sp_cuda_kv_set_len(kv, 2, E));
            }
            OK(sp_cuda_upload(cu, dx, x + H * (size_t)pos, H * sizeof(float), E));
            OK(sp_cuda_block_forward(c.cb, dy, dx, 1, 1, pos, kv, E));
            if (i >= 2)
                got[i - 2] = host(dy, H);
        }
        ck_assert(sp_cuda_kv_graphed(kv));
        ck_assert_msg((memcmp(got[0], got[1], H * sizeof(float)) != 0) == chunked,
                      "%s %s: the switch under a graph %s", c.cfg.model_type, sp_wtype_name((sp_wtype)t),
                      chunked ? "changed nothing (the graph was not captured anew)" : "changed the bits");
        ck_assert_msg(emul_rel_err(got[1], got[0], H) <= tol_fwd[t], "%s %s: the switch under a graph: error %.3g",
                      c.cfg.model_type, sp_wtype_name((sp_wtype)t), emul_rel_err(got[1], got[0], H));
        ck_assert_msg(memcmp(got[2], got[0], H * sizeof(float)) == 0, "%s %s: switched back, other bits",
                      c.cfg.model_type, sp_wtype_name((sp_wtype)t));
        sp_cuda_kv_free(kv);
        free(x), free(got[0]), free(got[1]), free(got[2]);
        sp_cuda_free(cu, dx), sp_cuda_free(cu, dy);
        case_free(&c);
    }
}
END_TEST

/* A server's batch: three sessions' caches of 1, 2 and 1 rows at lengths 3, 6 and 4 decoded together, against the
 * CPU's sp_block_decode_batch and against each cache stepped alone on the device (4 rows: the fused products,
 * so the same bits); then beam search's reorder of the 2-row cache on both sides and more batched steps. */
START_TEST(t_block_decode_batch_vs_cpu)
{
    enum { N = 3 };
    int rows[N] = {1, 2, 1}, lens[N] = {3, 6, 4}, caps[N] = {12, 11, 16}, R = 4; /* the 2-row cache full at the end */
    for (int t = 0; t < SP_W__COUNT; t++) {
        tcase c;
        case_init(&c, _i, (sp_wtype)t);
        int H = c.H;
        sp_rng r;
        sp_rng_seed(&r, 17);
        sp_kv_cache kv[N], *kvp[N];
        sp_cuda_kv *dkv[N], *alone[N];
        sp_ws ws = {0};
        sp_err err = {0};
        float *dx = dev_zero((size_t)R * 8 * H), *dy = dev_zero((size_t)R * 8 * H);
        for (int i = 0; i < N; i++) {
            kvp[i] = &kv[i];
            ck_assert_int_eq(sp_kv_init(&kv[i], rows[i], caps[i], c.b.nkv, c.b.hd, &err), SP_OK);
            OK(sp_cuda_kv_new(c.cb, &dkv[i], rows[i], caps[i], NULL, E));
            OK(sp_cuda_kv_new(c.cb, &alone[i], rows[i], caps[i], NULL, E));
            size_t n = (size_t)rows[i] * lens[i] * H;
            float *x = randn(&r, n, 1.0f), *y = malloc(n * sizeof(float));
            ck_assert_int_eq(sp_block_forward(&c.b, y, x, rows[i], lens[i], 0, &kv[i], &ws, &err), SP_OK);
            OK(sp_cuda_upload(cu, dx, x, n * sizeof(float), E));
            OK(sp_cuda_block_forward(c.cb, dy, dx, rows[i], lens[i], 0, dkv[i], E));
            OK(sp_cuda_block_forward(c.cb, dy, dx, rows[i], lens[i], 0, alone[i], E));
            free(x), free(y);
        }
        int item_rows[N];
        size_t nr = (size_t)R * H;
        float *want = malloc(nr * sizeof(float));
        for (int s = 0; s < 5; s++) {
            if (s == 3) { /* beam search reorders the 2-row session's cache: both rows continue row 1 */
                int64_t src[2] = {1, 1};
                ck_assert_int_eq(sp_kv_reorder(&kv[1], src, &err), SP_OK);
                OK(sp_cuda_kv_reorder(dkv[1], src, E));
                OK(sp_cuda_kv_reorder(alone[1], src, E));
            }
            float *x = randn(&r, nr, 1.0f);
            ck_assert_int_eq(sp_block_decode_batch(&c.b, want, x, kvp, N, item_rows, &ws, &err), SP_OK);
            OK(sp_cuda_upload(cu, dx, x, nr * sizeof(float), E));
            OK(sp_cuda_block_decode_batch(c.cb, dy, dx, dkv, N, E));
            float *got = host(dy, nr);
            double e = emul_rel_err(got, want, nr);
            ck_assert_msg(e <= tol_fwd[t], "%s batched step %d %s: error %.3g > %.3g", c.cfg.model_type, s,
                          sp_wtype_name((sp_wtype)t), e, tol_fwd[t]);
            for (int i = 0, o = 0; i < N; o += rows[i++]) { /* each cache alone: the same bits */
                ck_assert_int_eq(sp_cuda_kv_len(dkv[i]), kv[i].len);
                OK(sp_cuda_block_forward(c.cb, dy + (size_t)o * H, dx + (size_t)o * H, rows[i], 1,
                                         sp_cuda_kv_len(alone[i]), alone[i], E));
            }
            float *one = host(dy, nr);
            ck_assert_msg(memcmp(one, got, nr * sizeof(float)) == 0, "%s %s step %d: batched differs from alone",
                          c.cfg.model_type, sp_wtype_name((sp_wtype)t), s);
            free(x), free(got), free(one);
        }
        /* a full cache in the batch: refused before anything runs */
        sp_cuda_kv *full = NULL;
        OK(sp_cuda_kv_new(c.cb, &full, 1, 1, NULL, E));
        OK(sp_cuda_block_forward(c.cb, dy, dx, 1, 1, 0, full, E));
        sp_cuda_kv *bad[2] = {dkv[0], full};
        int len0 = sp_cuda_kv_len(dkv[0]);
        ck_assert_int_eq(sp_cuda_block_decode_batch(c.cb, dy, dx, bad, 2, &err), SP_ERR_RANGE);
        ck_assert_int_eq(sp_cuda_kv_len(dkv[0]), len0);
        int64_t out_of_range[2] = {0, 2};
        ck_assert_int_eq(sp_cuda_kv_reorder(dkv[1], out_of_range, &err), SP_ERR_ARG);
        sp_cuda_kv_free(full);
        for (int i = 0; i < N; i++) {
            sp_kv_free(&kv[i]);
            sp_cuda_kv_free(dkv[i]);
            sp_cuda_kv_free(alone[i]);
        }
        free(want);
        sp_ws_free(&ws);
        sp_cuda_free(cu, dx), sp_cuda_free(cu, dy);
        case_free(&c);
    }
}
END_TEST

/* Backward at [2, 6] (the fused products in the forward), [1, 70] (flash tiles and the bf16 path; f32: GEMMs) and
 * [1, 5] (Mixtral: a forward of decode-sized steps, whose experts' products keep what the backward reads) */
START_TEST(t_block_backward_vs_cpu)
{
    static const int shapes[3][2] = {{2, 6}, {1, 70}, {1, 5}};
    for (int t = 0; t < 3 * SP_W__COUNT; t++) {
        tcase c;
        case_init(&c, _i, (sp_wtype)(t % SP_W__COUNT));
        int B = shapes[t / SP_W__COUNT][0], T = shapes[t / SP_W__COUNT][1], pos0 = 3;
        size_t n = (size_t)B * T * c.H;
        sp_rng r;
        sp_rng_seed(&r, 13);
        float *x = randn(&r, n, 1.0f), *dout = randn(&r, n, 1.0f), *want = malloc(n * sizeof(float));
        sp_ws ws = {0};
        sp_err err = {0};
        ck_assert_int_eq(sp_block_backward(&c.b, want, dout, x, B, T, pos0, NULL, &ws, &err), SP_OK);
        float *dx = dev(x, n), *ddout = dev(dout, n), *dy = dev_zero(n), *dd = dev_zero(n);
        sp_cuda_acts k = {0};
        OK(sp_cuda_block_forward_keep(c.cb, dy, dx, B, T, pos0, &k, E));
        OK(sp_cuda_block_backward_kept(c.cb, dd, ddout, dx, &k, E));
        float *got = host(dd, n);
        double e = emul_rel_err(got, want, n);
        ck_assert_msg(e <= tol_bwd[t % SP_W__COUNT], "%s %s [%d, %d] dinp (kept): error %.3g > %.3g", c.cfg.model_type,
                      sp_wtype_name((sp_wtype)(t % SP_W__COUNT)), B, T, e, tol_bwd[t % SP_W__COUNT]);
        OK(sp_cuda_block_backward(c.cb, ddout, ddout, dx, B, T, pos0, E)); /* recomputed, dinp = dout */
        float *again = host(ddout, n);
        ck_assert_msg(memcmp(again, got, n * sizeof(float)) == 0,
                      "%s %s: recomputed backward differs from the kept one", c.cfg.model_type,
                      sp_wtype_name((sp_wtype)(t % SP_W__COUNT)));
        free(x), free(dout), free(want), free(got), free(again);
        sp_ws_free(&ws);
        sp_cuda_acts_free(c.cb, &k);
        sp_cuda_free(cu, dx), sp_cuda_free(cu, ddout), sp_cuda_free(cu, dy), sp_cuda_free(cu, dd);
        case_free(&c);
    }
}
END_TEST

/* A prompt in two chunks over a cache (40 positions, then 37 more: flash attention over past positions, the bf16
 * path) against the CPU's, and the same chunks with flash attention off (the cuBLAS path) within the tolerance. */
START_TEST(t_block_prefill_chunks_vs_cpu)
{
    for (int t = 0; t < SP_W__COUNT; t++) {
        tcase c;
        case_init(&c, _i, (sp_wtype)t);
        int B = 1, P[2] = {40, 37}, cap = 80, H = c.H;
        sp_rng r;
        sp_rng_seed(&r, 21);
        size_t n = (size_t)B * (P[0] + P[1]) * H;
        float *x = randn(&r, n, 1.0f), *want = malloc(n * sizeof(float)), *dx = dev(x, n), *dy = dev_zero(n);
        sp_ws ws = {0};
        sp_err err = {0};
        sp_kv_cache kv;
        ck_assert_int_eq(sp_kv_init(&kv, B, cap, c.b.nkv, c.b.hd, &err), SP_OK);
        float *got[2];
        for (int flash = 1; flash >= 0; flash--) {
            sp_cuda_kv *dkv = NULL;
            OK(sp_cuda_kv_new(c.cb, &dkv, B, cap, NULL, E));
            sp_cuda_block_use_flash(c.cb, flash);
            for (int k = 0, p0 = 0; k < 2; p0 += P[k++]) {
                size_t off = (size_t)p0 * H;
                if (flash)
                    ck_assert_int_eq(sp_block_forward(&c.b, want + off, x + off, B, P[k], p0, &kv, &ws, &err), SP_OK);
                OK(sp_cuda_block_forward(c.cb, dy + off, dx + off, B, P[k], p0, dkv, E));
            }
            got[flash] = host(dy, n);
            double e = emul_rel_err(got[flash], want, n);
            ck_assert_msg(e <= tol_fwd[t], "%s chunked prefill %s (flash %d): error %.3g > %.3g", c.cfg.model_type,
                          sp_wtype_name((sp_wtype)t), flash, e, tol_fwd[t]);
            sp_cuda_kv_free(dkv);
        }
        sp_cuda_block_use_flash(c.cb, 1);
        if (t == SP_W_F32 || t == SP_W_F16) /* f32 and fp16 blocks never take the flash path */
            ck_assert_mem_eq(got[0], got[1], n * sizeof(float));
        free(x), free(want), free(got[0]), free(got[1]);
        sp_kv_free(&kv);
        sp_ws_free(&ws);
        sp_cuda_free(cu, dx), sp_cuda_free(cu, dy);
        case_free(&c);
    }
}
END_TEST

START_TEST(t_block_errors)
{
    tcase c;
    case_init(&c, 0, SP_W_F32);
    sp_err err = {0};
    sp_cuda_kv *kv = NULL;
    sp_cuda_budget small = {.limit = sp_cuda_kv_bytes(&c.b, 2, 8) - 1};
    ck_assert_int_eq(sp_cuda_kv_new(c.cb, &kv, 2, 8, &small, &err), SP_ERR_NOMEM);
    ck_assert_ptr_null(kv);
    ck_assert_uint_eq(small.used, 0);
    ck_assert_msg(strstr(err.msg, "exceed the budget") != NULL, "%s", err.msg);
    OK(sp_cuda_kv_new(c.cb, &kv, 2, 8, NULL, E));
    float *d = dev_zero((size_t)2 * 9 * c.H);
    ck_assert_int_eq(sp_cuda_block_forward(c.cb, d, d, 2, 9, 0, kv, &err), SP_ERR_RANGE); /* 9 > 8 positions */
    ck_assert_int_eq(sp_cuda_block_forward(c.cb, d, d, 1, 1, 0, kv, &err), SP_ERR_ARG);   /* batch 1 of 2 */
    ck_assert_int_eq(sp_cuda_kv_set_len(kv, 1, &err), SP_ERR_ARG);                        /* past its length */
    sp_cuda_acts k = {0};
    ck_assert_int_eq(sp_cuda_block_backward_kept(c.cb, d, d, d, &k, &err), SP_ERR_STATE);
    ck_assert_int_eq(sp_cuda_kv_len(kv), 0);
    sp_cuda_kv_free(kv);
    sp_cuda_free(cu, d);
    ck_assert_uint_eq(sp_cuda_block_bytes(c.cb), sp_block_bytes(&c.b));
    case_free(&c);
}
END_TEST

int main(void)
{
    int rc = emul_open_gpu("test_cuda_block", &cu);
    if (rc)
        return rc;
    sp_kern_force(SP_ISA_SCALAR); /* the CPU reference in f32 (the tolerances above) */
    Suite *s = suite_create("cuda_block");
    TCase *tc = tcase_create("block_vs_cpu");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, t_block_forward_vs_cpu, 0, NCFG);
    tcase_add_loop_test(tc, t_block_decode_vs_cpu, 0, NCFG);
    tcase_add_loop_test(tc, t_block_decode_batch_vs_cpu, 0, NCFG);
    tcase_add_loop_test(tc, t_moe_decode_rows_vs_cpu, FIRST_MOE, NCFG);
    tcase_add_loop_test(tc, t_block_backward_vs_cpu, 0, NCFG);
    tcase_add_loop_test(tc, t_block_prefill_chunks_vs_cpu, 0, NCFG);
    tcase_add_test(tc, t_block_errors);
    suite_add_tcase(s, tc);
    rc = sp_test_run(s);
    sp_cuda_close(cu);
    return rc;
}
