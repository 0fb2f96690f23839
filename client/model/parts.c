/* parts.c - the model's local parts of a client runtime (parts.h): loading them, the LM head's encoding, the
 * compute threads. */
#include "parts.h"

#include <stdio.h>
#include <unistd.h>

#include <cblas.h>

#include "devparts.h"
#include "kern.h"
#include "pool.h"
#include "runtime_state.h"

sp_status sp_runtime_set_head_dtype(sp_runtime *rt, int t, sp_err *err)
{
    if (t < 0 || t >= SP_W__COUNT)
        return sp_errf(err, SP_ERR_ARG, "head dtype %d: expected f32, bf16, int8, nf4 or fp16", t);
    if (rt->local && t != rt->head_dtype) {
        sp_status st = sp_model_quantize(rt->local, (sp_wtype)t, 1, err);
        if (st)
            return st;
        sp_rt_emitf(rt, SP_EV_INFO, 0, "the LM head is now %s (%.1f MB)", sp_wtype_name((sp_wtype)t),
                    (double)sp_qmat_bytes((sp_wtype)t, rt->local->cfg.vocab, rt->local->cfg.hidden) / 1e6);
    }
    rt->head_dtype = t;
    return SP_OK;
}

/* m's generation parts on GPU index (NULL in *out for the CPU, index < 0). */
static sp_status gen_parts_open(const sp_model *m, int index, struct sp_devparts **out, sp_err *err)
{
    *out = NULL;
    if (index < 0 || !m)
        return SP_OK;
    sp_status st = sp_devparts_new(out, m, index, 0, 0, err);
    return st ? sp_err_prefix(err, "generation's local parts on cuda:%d: ", index) : SP_OK;
}

sp_status sp_runtime_set_gen_device(sp_runtime *rt, int index, sp_err *err)
{
    if (index < -1)
        return sp_errf(err, SP_ERR_ARG, "device %d: expected -1 (the CPU) or a GPU's index", index);
    if (index == rt->gen_device)
        return SP_OK;
    char why[300];
    if (index >= 0 && !sp_device_usable(index, why, sizeof why))
        return sp_errf(err, SP_ERR_UNSUPPORTED, "generation's local parts on cuda:%d: %s", index, why);
    struct sp_devparts *d = NULL;
    sp_status st = gen_parts_open(rt->local, index, &d, err);
    if (st)
        return st;
    sp_devparts_free(rt->gen_dev);
    rt->gen_dev = d;
    rt->gen_device = index;
    return SP_OK;
}

int sp_runtime_gen_device(const sp_runtime *rt) { return rt->gen_device; }

sp_status sp_runtime_set_threads(sp_runtime *rt, int n, sp_err *err)
{
    if (n < 0 || n > 256)
        return sp_errf(err, SP_ERR_ARG, "threads %d: expected 0 (every CPU) to 256", n);
    if (n == rt->threads)
        return SP_OK;
    sp_pool *p = NULL;
    if (n > 0 && !(p = sp_pool_new(n)))
        return sp_errf(err, SP_ERR_NOMEM, "out of memory starting %d threads", n);
    if (rt->local)
        sp_model_set_pool(rt->local, p); /* NULL: the engine's default pool */
    sp_pool_free(rt->pool);
    rt->pool = p;
    rt->threads = n;
    openblas_set_num_threads(n > 0 ? n : sp_cpu_count()); /* training's large products */
    return SP_OK;
}

sp_status sp_rt_parts_load(sp_runtime *rt, const char *dir, sp_err *err)
{
    sp_model *m = NULL;
    sp_tokenizer *tok = NULL;
    sp_config cfg;
    sp_status st = sp_config_load(&cfg, dir, err); /* not a model: said before any progress */
    if (st)
        return st;
    char what[160];
    snprintf(what, sizeof what, "loading %.140s", dir);
    sp_rt_emit(rt, SP_EV_PROGRESS, what, 0, 2, 0);
    st = sp_model_load(&m, dir, SP_LOAD_EMBED | SP_LOAD_HEAD, 0, 0, err);
    if (st) {
        sp_rt_emit(rt, SP_EV_PROGRESS, what, 2, 2, 0);
        return st;
    }
    sp_rt_emit(rt, SP_EV_PROGRESS, what, 1, 2, 0);
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (access(path, R_OK) == 0 && (st = sp_tokenizer_load(&tok, dir, err))) {
        sp_model_free(m);
        return st;
    }
    struct sp_devparts *gd = NULL;
    if (!st && rt->head_dtype != SP_W_F32)
        st = sp_model_quantize(m, (sp_wtype)rt->head_dtype, 1, err);
    if (!st)
        st = gen_parts_open(m, rt->gen_device, &gd, err);
    if (st) {
        sp_rt_emit(rt, SP_EV_PROGRESS, what, 2, 2, 0);
        sp_tokenizer_free(tok);
        sp_model_free(m);
        return st;
    }
    if (rt->pool)
        sp_model_set_pool(m, rt->pool);
    sp_rt_emit(rt, SP_EV_PROGRESS, what, 2, 2, 0);
    sp_devparts_free(rt->gen_dev);
    sp_model_free(rt->local);
    sp_tokenizer_free(rt->tok);
    rt->gen_dev = gd;
    rt->local = m;
    rt->tok = tok;
    snprintf(rt->model_dir, sizeof rt->model_dir, "%s", dir);
    sp_model_prefix(dir, rt->model_prefix, sizeof rt->model_prefix);
    char head[48] = "";
    if (rt->head_dtype != SP_W_F32)
        snprintf(head, sizeof head, "; LM head in %s", sp_wtype_name((sp_wtype)rt->head_dtype));
    sp_rt_emitf(rt, SP_EV_INFO, 0, "loaded %s: %s, %d blocks, hidden %d, vocab %d%s (%.1f MB of local parts%s)", dir,
                m->cfg.architecture, m->cfg.n_layers, m->cfg.hidden, m->cfg.vocab, tok ? "" : ", no tokenizer",
                (double)m->bytes_loaded / 1e6, head);
    return SP_OK;
}

void sp_rt_parts_free(sp_runtime *rt)
{
    sp_devparts_free(rt->gen_dev);
    sp_model_free(rt->local);
    sp_pool_free(rt->pool);
    sp_tokenizer_free(rt->tok);
}

int sp_runtime_head_dtype(const sp_runtime *rt) { return rt->head_dtype; }
int sp_runtime_threads(const sp_runtime *rt) { return rt->threads; }
const sp_config *sp_runtime_config(const sp_runtime *rt) { return rt->local ? &rt->local->cfg : NULL; }
sp_model *sp_runtime_model(const sp_runtime *rt) { return rt->local; }
const sp_tokenizer *sp_runtime_tokenizer(const sp_runtime *rt) { return rt->tok; }
const char *sp_runtime_model_name(const sp_runtime *rt) { return rt->model_prefix; }
const char *sp_runtime_model_dir(const sp_runtime *rt) { return rt->model_dir; }
