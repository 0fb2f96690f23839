/* cmd_generate.c - `generate`: text (or ids) through the swarm, streamed as it comes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "cli.h"
#include "runtime.h"
#include "trainer.h"

sp_runtime *sp_app_runtime(sp_app *app);

typedef struct gen_args {
    const char *prompt, *ids, *stop, *prompts;
    sp_gen_opts o;
} gen_args;

/* Defaults from `set`, then the options given. */
static int parse(sp_app *app, int argc, char **argv, gen_args *g)
{
    memset(g, 0, sizeof *g);
    sp_gen_opts_default(&g->o);
    const char *names[] = {"--max-new-tokens", "--temperature", "--top-k", "--top-p", "--repetition-penalty",
                           "--beams", "--seed", "--stop", "--ids", "--prompts"};
    const char *vals[10] = {NULL};
    for (int k = 0; k < 8; k++)
        vals[k] = sp_app_get(app, names[k] + 2);
    for (int i = 1; i < argc; i++) {
        int k = 0;
        while (k < 10 && strcmp(argv[i], names[k]))
            k++;
        if (!strcmp(argv[i], "--greedy")) {
            vals[1] = "0";
        } else if (k < 10) {
            if (i + 1 >= argc)
                return sp_app_error(app, "generate: option '%s' needs a value", argv[i]);
            vals[k] = argv[++i];
        } else if (!strncmp(argv[i], "--", 2)) {
            return sp_app_error(app, "generate: unknown option '%s'", argv[i]);
        } else if (g->prompt) {
            return sp_app_error(app, "generate: one prompt only (quote it): extra '%s'", argv[i]);
        } else {
            g->prompt = argv[i];
        }
    }
    long n = 64, topk = 0, beams = 1, seed = 0;
    double t = 0, p = 1, rep = 1;
    if ((vals[0] && cli_parse_int("--max-new-tokens", vals[0], 0, 1 << 20, &n)) ||
        (vals[1] && cli_parse_float("--temperature", vals[1], &t)) ||
        (vals[2] && cli_parse_int("--top-k", vals[2], 0, 1 << 30, &topk)) ||
        (vals[3] && cli_parse_float("--top-p", vals[3], &p)) ||
        (vals[4] && cli_parse_float("--repetition-penalty", vals[4], &rep)) ||
        (vals[5] && cli_parse_int("--beams", vals[5], 1, 64, &beams)) ||
        (vals[6] && cli_parse_int("--seed", vals[6], 0, __LONG_MAX__, &seed)))
        return 1;
    if (t < 0 || p <= 0 || p > 1 || rep <= 0)
        return sp_app_error(app, "generate: need temperature >= 0, 0 < top-p <= 1, repetition-penalty > 0");
    g->o.max_new = (int)n;
    g->o.sample.temperature = (float)t;
    g->o.sample.top_k = (int)topk;
    g->o.sample.top_p = (float)p;
    g->o.sample.repetition_penalty = (float)rep;
    g->o.sample.seed = (uint64_t)seed;
    g->o.beams = (int)beams;
    g->stop = vals[7] && *vals[7] ? vals[7] : NULL;
    g->ids = vals[8];
    g->prompts = vals[9];
    if (!g->prompt == !g->ids)
        return sp_app_error(app, "usage: generate PROMPT [options] | generate --ids I,J,K [options]");
    return 0;
}

/* "1,2,3" -> ids (malloc'd). */
static int parse_ids(sp_app *app, const char *s, int32_t **ids, int *n)
{
    *n = 0;
    *ids = malloc((strlen(s) / 2 + 2) * sizeof **ids);
    for (const char *p = s; *ids && *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 1 << 30 || (*end && *end != ','))
            return free(*ids), *ids = NULL, sp_app_error(app, "generate --ids: expected I,J,K, got '%s'", s);
        (*ids)[(*n)++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    return *n ? 0 : sp_app_error(app, "generate --ids: no ids");
}

static int stream(int row, int token, const char *text, void *user)
{
    (void)row;
    (void)token;
    if (text && !*(int *)user) {
        fputs(text, stdout);
        fflush(stdout);
    }
    return 0;
}

static int cmd_generate(sp_app *app, int argc, char **argv)
{
    gen_args g;
    if (parse(app, argc, argv, &g))
        return 1;
    sp_runtime *rt = sp_app_runtime(app);
    if (!rt)
        return 1;
    if (!rt->local)
        return sp_app_error(app, "no model loaded (load DIR first)");
    if (!rt->nservers)
        return sp_app_error(app, "no servers (swarm up N, or connect HOST:PORT)");
    if (g.prompt && !rt->tok)
        return sp_app_error(app, "the model has no tokenizer: use generate --ids I,J,K");
    int32_t *ids = NULL;
    int n = 0, *raw = NULL;
    sp_err err = {0};
    if (g.ids) {
        if (parse_ids(app, g.ids, &ids, &n))
            return 1;
    } else {
        if (sp_tokenizer_encode(rt->tok, g.prompt, 1, &raw, &n, &err))
            return sp_app_error(app, "%s", err.msg);
        ids = malloc((size_t)n * sizeof *ids);
        for (int i = 0; ids && i < n; i++)
            ids[i] = raw[i];
        free(raw);
    }
    const char *stops[2] = {g.stop, NULL};
    g.o.stop = g.stop ? stops : NULL;
    g.o.eos_id = rt->local->cfg.eos_id;
    g.o.bos_id = rt->local->cfg.bos_id;
    int quiet = g.ids != NULL || g.stop; /* with a stop string the text is printed once it is cut */
    if (g.prompt) {
        fputs(g.prompt, stdout);
        fflush(stdout);
    }
    sp_lm_swarm sw;
    sp_lm lm = sp_lm_swarm_make(&sw, rt);
    float *shallow = NULL, *deep = NULL;
    if (g.prompts) {
        int P;
        if (sp_prompts_load(g.prompts, rt->local->cfg.n_layers, rt->local->cfg.hidden, &shallow, &deep, &P, &err)) {
            free(ids);
            return sp_app_error(app, "generate: %s", err.msg);
        }
        sp_lm_swarm_prompts(&sw, &lm, shallow, deep, P);
    }
    sp_gen_result r;
    const int32_t *ps[1] = {ids};
    sp_status st = sp_generate(&lm, g.ids ? NULL : rt->tok, ps, &n, 1, &g.o, stream, &quiet, &r, &err);
    free(shallow);
    free(deep);
    if (st) {
        if (g.prompt)
            printf("\n");
        free(ids);
        return sp_app_error(app, "%s", err.msg);
    }
    if (g.prompt && g.stop)
        fputs(r.text[0], stdout);
    if (g.ids) { /* the whole sequence, prompt included */
        for (int i = 0; i < n; i++)
            printf("%s%d", i ? " " : "", ids[i]);
        for (int i = 0; i < r.n[0]; i++)
            printf(" %d", r.ids[0][i]);
    }
    printf("\n");
    fflush(stdout);
    fprintf(stderr, "sepal: %d prompt + %d new tokens in %.3f s (%.1f tok/s)\n", n, r.n[0], r.seconds, r.tokens_per_s);
    sp_gen_result_free(&r);
    free(ids);
    return 0;
}

const sp_cmd sp_cmds_generate[] = {
    {"generate", "gen",
     "PROMPT [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--repetition-penalty R] [--stop S] "
     "[--beams N] [--seed S] [--greedy] [--prompts FILE] | --ids I,J,K [...]",
     "generate text through the swarm, streaming it",
     "Prints the prompt followed by the continuation as it is generated (greedy at temperature 0, the default).\n"
     "With --ids the prompt is token ids and the whole id sequence is printed, prompt included.\n"
     "--prompts FILE: generate with prompts trained by `train --tuning ptune|deep_ptune --save FILE`.\n"
     "Defaults come from `set` (see `show`).",
     cmd_generate},
    {NULL, NULL, NULL, NULL, NULL, NULL},
};
