/* cmd_generate.c - `generate`: text (or ids) through the swarm, streamed as it comes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "runtime.h"
#include "timeutil.h"
#include "trainer.h"

/* "1,2,3" -> ids (malloc'd). */
static int parse_ids(sp_app *app, const char *s, int32_t **ids, int *n)
{
    *n = 0;
    *ids = malloc((strlen(s) / 2 + 2) * sizeof **ids);
    if (!*ids)
        return sp_app_error(app, "out of memory");
    for (const char *p = s; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 1 << 30 || (*end && *end != ','))
            return free(*ids), *ids = NULL, sp_app_error(app, "generate: --ids: expected I,J,K, got '%s'", s);
        (*ids)[(*n)++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    return *n ? 0 : (free(*ids), *ids = NULL, sp_app_error(app, "generate: --ids: no ids"));
}

typedef struct stream_ctx {
    sp_app *app;
    int quiet;
    const char *prompt; /* as typed (NULL: ids) */
    int begun;
} stream_ctx;

/* The front end shows the prompt with the first token, not before: while the swarm has no route yet (a server
 * still joining), what shows is the runtime's retry lines, never a prompt that hangs. */
static void begin_once(stream_ctx *s)
{
    if (s->begun)
        return;
    s->begun = 1;
    sp_ui_event begin = {.kind = SP_UI_GEN_BEGIN, .text = s->prompt};
    sp_emit(s->app, &begin);
}

static int stream(int row, int token, const char *text, void *user)
{
    (void)row;
    (void)token;
    stream_ctx *s = user;
    begin_once(s);
    if (text && !s->quiet) {
        sp_ui_event ev = {.kind = SP_UI_GEN_TEXT, .text = text};
        sp_emit(s->app, &ev);
    }
    return 0;
}

/* generate's options, by index (handlers read them so: a misspelt name does not compile). */
enum {
    GEN_MAX_NEW_TOKENS, GEN_TEMPERATURE, GEN_TOP_K, GEN_TOP_P, GEN_REPETITION_PENALTY, GEN_STOP, GEN_BEAMS, GEN_SEED,
    GEN_GREEDY, GEN_IGNORE_EOS, GEN_MIN_NEW_TOKENS, GEN_IDS, GEN_PROMPTS, GEN_NOPTS
};

/* The generation options from the command line and the settings; 0, or 1 after a message. */
static int gen_opts(sp_app *app, const sp_args *a, sp_gen_opts *o, unsigned long long *seed)
{
    sp_gen_opts_default(o);
    o->max_new = (int)sp_arg_int(app, a, GEN_MAX_NEW_TOKENS);
    o->sample.temperature = sp_arg_given(a, GEN_GREEDY) ? 0.0f : (float)sp_arg_num(app, a, GEN_TEMPERATURE);
    o->sample.top_k = (int)sp_arg_int(app, a, GEN_TOP_K);
    o->sample.top_p = (float)sp_arg_num(app, a, GEN_TOP_P);
    o->sample.repetition_penalty = (float)sp_arg_num(app, a, GEN_REPETITION_PENALTY);
    o->beams = (int)sp_arg_int(app, a, GEN_BEAMS);
    *seed = sp_arg_seed(app, a, GEN_SEED);
    o->sample.seed = *seed;
    o->cancel = &app->cancel;
    o->stop_at_eos = !sp_arg_on(app, a, GEN_IGNORE_EOS);
    o->min_new = (int)sp_arg_int(app, a, GEN_MIN_NEW_TOKENS);
    return 0;
}

static int cmd_generate(sp_app *app, const sp_args *a)
{
    const char *ids_arg = sp_arg(app, a, GEN_IDS), *prompts_file = sp_arg(app, a, GEN_PROMPTS);
    const char *stop = sp_arg(app, a, GEN_STOP);
    if (!a->npos == !ids_arg)
        return sp_app_error(app, "usage: generate PROMPT [options] | generate --ids I,J,K [options]");
    sp_gen_opts o;
    unsigned long long seed;
    if (gen_opts(app, a, &o, &seed))
        return 1;
    sp_runtime *rt = sp_app_runtime(app);
    if (!rt)
        return 1;
    const sp_config *c = sp_runtime_config(rt);
    const sp_tokenizer *tok = sp_runtime_tokenizer(rt);
    if (!c)
        return sp_app_error(app, "generate: no model loaded (load DIR first)");
    if (!sp_runtime_server_count(rt))
        return sp_app_error(app, "generate: no servers (swarm up N, or connect HOST:PORT)");
    if (a->npos && !tok)
        return sp_app_error(app, "generate: the model has no tokenizer: use generate --ids I,J,K");
    sp_err err = {0};
    float *shallow = NULL, *deep = NULL;
    int P = 0;
    sp_params_info info;
    if (prompts_file && (sp_params_info_read(prompts_file, &info, &err) ||
                         sp_params_check_model(prompts_file, &info, sp_runtime_model_name(rt), c->hash, &err)))
        return sp_app_error(app, "generate: --prompts: %s", err.msg);
    if (prompts_file && sp_prompts_load(prompts_file, c->n_layers, c->hidden, &shallow, &deep, &P, &err))
        return sp_app_error(app, "generate: --prompts %s: %s", prompts_file, err.msg);
    int32_t *ids = NULL;
    int n = 0, *raw = NULL;
    if (ids_arg) {
        if (parse_ids(app, ids_arg, &ids, &n))
            return free(shallow), free(deep), 1;
    } else {
        if (sp_tokenizer_encode(tok, a->pos[0], 1, &raw, &n, &err))
            return free(shallow), free(deep), sp_app_error(app, "generate: %s", err.msg);
        ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
        for (int i = 0; ids && i < n; i++)
            ids[i] = raw[i];
        free(raw);
        if (!ids)
            return free(shallow), free(deep), sp_app_error(app, "out of memory");
    }
    sp_lm_swarm sw;
    sp_lm lm = sp_lm_swarm_make(&sw, rt);
    if (prompts_file)
        sp_lm_swarm_prompts(&sw, &lm, shallow, deep, P);
    /* one rule (model generate too): refuse a prompt that does not fit; clamp what it may add */
    int ctx = lm.max_pos;
    if (n > ctx) {
        free(ids), free(shallow), free(deep);
        return sp_app_error(app, "generate: the prompt has %d tokens, more than the model's context of %d%s", n, ctx,
                            P ? " (less the trained prompts)" : "");
    }
    if (n + o.max_new - 1 > ctx) {
        sp_warn(app, "--max-new-tokens %d: %d prompt token%s room for %d in the context of %d", o.max_new, n,
                n == 1 ? " leaves" : "s leave", ctx - n + 1, ctx);
        o.max_new = ctx - n + 1;
    }
    const char *stops[2] = {stop && *stop ? stop : NULL, NULL};
    o.stop = stops[0] ? stops : NULL;
    o.eos_id = c->eos_id;
    o.bos_id = c->bos_id;
    static const int sampling[] = {GEN_TOP_K, GEN_TOP_P, GEN_SEED};
    if (o.sample.temperature <= 0) /* greedy: said once, not silently ignored */
        sp_args_warn_unused(app, a, sampling, 3,
                            "at temperature 0 (greedy decoding; sampling needs --temperature above 0)");
    stream_ctx sc = {.app = app, .quiet = ids_arg != NULL || o.stop, /* with a stop string: printed once cut */
                     .prompt = ids_arg ? NULL : a->pos[0]};
    sp_gen_result r;
    const int32_t *ps[1] = {ids};
    sp_status st = sp_generate(&lm, ids_arg ? NULL : tok, ps, &n, 1, &o, stream, &sc, &r, &err);
    free(shallow);
    free(deep);
    if (st) {
        sp_ui_event end = {.kind = SP_UI_GEN_TEXT, .text = "\n"};
        if (!ids_arg && sc.begun)
            sp_emit(app, &end);
        free(ids);
        return sp_app_error(app, "generate: %s", err.msg);
    }
    begin_once(&sc); /* no token came (cancelled before the first) */
    if (sc.quiet && !ids_arg) {
        sp_ui_event t = {.kind = SP_UI_GEN_TEXT, .text = r.text[0]};
        sp_emit(app, &t);
    }
    if (ids_arg) { /* the whole sequence, prompt included */
        size_t cap = (size_t)(n + r.n[0]) * 12 + 2, len = 0;
        char *line = malloc(cap);
        for (int i = 0; line && i < n + r.n[0]; i++)
            len += (size_t)snprintf(line + len, cap - len, "%s%d", i ? " " : "", i < n ? ids[i] : r.ids[0][i - n]);
        if (line) {
            sp_ui_event t = {.kind = SP_UI_GEN_TEXT, .text = line};
            sp_emit(app, &t);
        }
        free(line);
    }
    sp_ui_gen g = {.prompt_tokens = n, .new_tokens = r.n[0], .prefill_s = r.prefill_s,
                   .decode_s = r.decode_s, .first_token_s = r.first_token_s, .stop = r.stop_reason,
                   .seed = seed, .sampled = o.sample.temperature > 0 && o.beams <= 1};
    sp_ui_event end = {.kind = SP_UI_GEN_END, .gen = &g};
    sp_emit(app, &end);
    int cancelled = r.stop_reason == SP_GEN_STOP_CANCELLED;
    if (cancelled)
        sp_note(app, "^C (stopped after %d token%s)", r.n[0], r.n[0] == 1 ? "" : "s");
    sp_gen_result_free(&r);
    free(ids);
    return cancelled; /* a script stops at an interrupted command */
}

static const sp_opt generate_opts[] = {
    [GEN_MAX_NEW_TOKENS] = {"--max-new-tokens", .meta = "N", SP_SETTING(SP_SET_MAX_NEW_TOKENS),
                            .help = "tokens to add at most (clamped to the model's context)"},
    [GEN_TEMPERATURE] = {"--temperature", .meta = "T", SP_SETTING(SP_SET_TEMPERATURE),
                         .help = "sampling temperature; 0 is greedy"},
    [GEN_TOP_K] = {"--top-k", .meta = "K", SP_SETTING(SP_SET_TOP_K),
                   .help = "sample among the K likeliest tokens; 0 is off"},
    [GEN_TOP_P] = {"--top-p", .meta = "P", SP_SETTING(SP_SET_TOP_P), .help = "nucleus sampling; 1 is off"},
    [GEN_REPETITION_PENALTY] = {"--repetition-penalty", .meta = "R", SP_SETTING(SP_SET_REPETITION_PENALTY),
                                .help = "divide the logits of tokens seen already; 1 is off"},
    [GEN_STOP] = {"--stop", .meta = "TEXT", SP_SETTING(SP_SET_STOP), .help = "stop after this text (it is cut off)"},
    [GEN_BEAMS] = {"--beams", .meta = "N", SP_SETTING(SP_SET_BEAMS), .help = "beam search width; 1 is no beam search"},
    [GEN_SEED] = {"--seed", .meta = "S", SP_SETTING(SP_SET_SEED),
                  .help = "seed of sampling: the same seed repeats a run (`random` draws one)"},
    [GEN_GREEDY] = {"--greedy", SP_OPT_FLAG, .help = "temperature 0, whatever the settings say"},
    [GEN_IGNORE_EOS] = {"--ignore-eos", SP_SETTING(SP_SET_IGNORE_EOS),
                        .help = "go on past the end-of-text token (it stays in the text) until --max-new-tokens"},
    [GEN_MIN_NEW_TOKENS] = {"--min-new-tokens", .meta = "N", SP_SETTING(SP_SET_MIN_NEW_TOKENS),
                            .help = "the end-of-text token cannot come before N new tokens"},
    [GEN_IDS] = {"--ids", SP_OPT_STR, "I,J,K",
                 .help = "token ids instead of a prompt; prints the whole id sequence, prompt included"},
    [GEN_PROMPTS] = {"--prompts", SP_OPT_PATH, "FILE",
                     .help = "generate with prompts trained by `train --tuning ptune|deep_ptune --save FILE`"},
    [GEN_NOPTS] = {0},
};

const sp_cmd sp_cmds_generate[] = {
    {.name = "generate", .aliases = "gen", .args = "PROMPT", .min_pos = 0, .max_pos = 1, SP_OPTS(generate_opts),
     .summary = "generate text through the swarm, streaming it",
     .help = "Prints the prompt followed by the continuation as it is generated (greedy at temperature 0, the "
             "default), then the prefill and decode speeds, the time to the first token, why it stopped, and the "
             "seed when it sampled. Defaults come from `set` (see `show`). Ctrl-C stops it and keeps the text so "
             "far. A prompt longer than the model's context is refused; --max-new-tokens is clamped to what fits.",
     .examples = "generate \"Once upon a time\" --max-new-tokens 40\n"
                 "generate \"Lily and Tom\" --temperature 0.8 --top-p 0.9 --seed 7 --max-new-tokens 30\n"
                 "generate --ids 1,9038,2501,263,931 --max-new-tokens 8",
     .fn = cmd_generate},
    {0},
};
