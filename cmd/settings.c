/* settings.c - the settings' rows (name, kind, range, default, help: each once) and their values in the app:
 * looked up by what the user typed (a unique prefix; close names for a typo), read and set by enum. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "rng.h"
#include "app.h"
#include "devparts.h"
#include "kern.h"

const sp_opt sp_settings[SP_SET_N + 1] = {
    [SP_SET_MAX_NEW_TOKENS] = {"max-new-tokens", SP_OPT_INT, .max = 1 << 20, .def = "64",
                               .help = "tokens that generate adds at most"},
    [SP_SET_TEMPERATURE] = {"temperature", SP_OPT_NUM, .max = 100, .def = "0",
                            .help = "sampling temperature; 0 is greedy"},
    [SP_SET_TOP_K] = {"top-k", SP_OPT_INT, .max = 1 << 30, .def = "0",
                      .help = "sample among the k likeliest tokens; 0 is off"},
    [SP_SET_TOP_P] = {"top-p", SP_OPT_NUM, .min = SP_OPT_ABOVE0, .max = 1, .def = "1",
                      .help = "nucleus sampling: the smallest set of tokens of probability p; 1 is off"},
    [SP_SET_REPETITION_PENALTY] = {"repetition-penalty", SP_OPT_NUM, .min = 0.01, .max = 100, .def = "1",
                                   .help = "divide the logits of tokens seen already; 1 is off"},
    [SP_SET_SEED] = {"seed", SP_OPT_INT, .max = SP_RNG_SEED_MAX, .word = "random", .def = "random",
                     .help = "seed of sampling: an integer repeats a run, random draws a fresh one each time"},
    [SP_SET_BEAMS] = {"beams", SP_OPT_INT, .min = 1, .max = 64, .def = "1",
                      .help = "beam search width; 1 is no beam search"},
    [SP_SET_MIN_NEW_TOKENS] = {"min-new-tokens", SP_OPT_INT, .max = 1 << 20, .def = "0",
                               .help = "the end-of-text token cannot come before this many new tokens"},
    [SP_SET_IGNORE_EOS] = {"ignore-eos", SP_OPT_FLAG, .def = "off",
                           .help = "generation goes on past the end-of-text token (on, off)"},
    [SP_SET_STOP] = {"stop", SP_OPT_STR, .def = "", .help = "generation stops after this text; empty is off"},
    [SP_SET_BLOCKS_PER_SERVER] = {"blocks-per-server", SP_OPT_INT, .max = 1 << 20, .def = "0",
                                  .help = "blocks each server of `swarm up` holds; 0 is an even split"},
    [SP_SET_MAX_RETRIES] = {"max-retries", SP_OPT_INT, .max = 1000, .def = "8",
                            .help = "retries of a request after a server fails (each on another route)"},
    [SP_SET_STEP_TIMEOUT] = {"step-timeout", SP_OPT_NUM, .max = 86400, .def = "0",
                             .help = "seconds a server may take for one request before it counts as failed; 0 derives "
                                     "it from the server's announced speed (a few seconds for a decode step)"},
    [SP_SET_PUSH] = {"push", SP_OPT_CHOICE, .choices = "auto|on|off", .def = "auto",
                     .help = "inference steps and training's forwards and backwards go from server to server, each "
                             "sending its output straight to the next: "
                             "auto where routing prices that faster on the measured links (and the client's pings to "
                             "the chain's servers average 1 ms or more), on wherever the servers allow it, off never "
                             "(the client sends every server its input)"},
    [SP_SET_WIRE] = {"wire", SP_OPT_CHOICE, .choices = "auto|f32|f16|bf16|q8", .def = "auto",
                     .help = "hidden states (inference steps, training) and gradients on the wire, both ways: f32 "
                             "exact, f16 and bf16 half the bytes, q8 (8-bit absmax blocks of 64) about a quarter; "
                             "auto bf16 over links measured below 300 Mbit/s (`servers --long`), else f32"},
    [SP_SET_ALLOWED_SERVERS] = {"allowed-servers", SP_OPT_STR, .def = "",
                                .help = "route only through these servers (ids, id prefixes, names or HOST:PORT, "
                                        "comma-separated)"},
    [SP_SET_BLOCKED_SERVERS] = {"blocked-servers", SP_OPT_STR, .def = "",
                                .help = "never route through these servers (same forms)"},
    [SP_SET_THREADS] = {"threads", SP_OPT_INT, .max = 256, .def = "0",
                        .help = "the client's compute threads (its LM head, training's products); 0 is every CPU it "
                                "may run on"},
    [SP_SET_DTYPE] = {"dtype", SP_OPT_CHOICE, .choices = "f32|bf16|fp16|int8|nf4", .aliases = SP_WTYPE_ALIASES, .def = "f32",
                      .help = "the client's LM head for generation: f32 uses the checkpoint's tensor in place; bf16, "
                              "fp16 (IEEE half), int8 (blocks of 32 with a scale) and nf4 are encoded copies, smaller "
                              "and faster per token (training keeps f32)"},
    [SP_SET_SWARM_KEY] = {"swarm-key", SP_OPT_PATH, .def = "",
                          .help = "a private swarm's key file (sepal-server --gen-swarm-key FILE): connections prove "
                                  "it both ways and only DHT records sealed with it are read; empty is none"},
    [SP_SET_DEVICE] = {"device", SP_OPT_STR, "auto|cpu|cuda[:N]", .def = "auto",
                       .help = "where train and eval run the client's local parts (embeddings, norms, head, prompts) "
                               "and the optimizer: cuda or cuda:N on that GPU, cpu on the CPU, auto the local parts "
                               "on the CPU and the optimizer on a GPU if there is one"},
    [SP_SET_N] = {0},
};

int sp_setting_of(const sp_opt *o)
{
    for (int k = 0; o && k < SP_SET_N; k++)
        if (o == &sp_settings[k])
            return k;
    return -1;
}

int sp_app_setting(const sp_app *app, const char *name, char *why, size_t cap)
{
    (void)app;
    int k = sp_opt_find(sp_settings, name, 1, "setting", NULL, 0);
    if (k >= 0 || !why || !cap)
        return k < 0 ? -1 : k;
    if (k == -2) {
        sp_opt_find(sp_settings, name, 1, "setting", why, cap); /* "ambiguous setting 'se': seed, stop" */
        return -1;
    }
    size_t len = (size_t)snprintf(why, cap, "unknown setting '%s'", name);
    len = len < cap ? len : cap - 1;
    if (!sp_opt_similar(sp_settings, name, "; `show` lists them", why, cap, &len))
        snprintf(why + len, cap - len, " (`show` lists them)");
    return -1;
}

const char *sp_app_get(const sp_app *app, sp_set k) { return app->set[k]; }

double sp_app_num(const sp_app *app, sp_set k)
{
    const sp_opt *o = &sp_settings[k];
    return o->kind == SP_OPT_INT || o->kind == SP_OPT_NUM ? sp_opt_num(app->set[k]) : NAN;
}

int sp_app_set(sp_app *app, sp_set k, const char *value, char *why, size_t cap)
{
    char buf[256];
    if (!why || !cap)
        why = buf, cap = sizeof buf;
    if (strlen(value) >= sizeof app->set[k]) {
        snprintf(why, cap, "%s: value too long (at most %zu bytes)", sp_settings[k].name, sizeof app->set[k] - 1);
        return -1;
    }
    if (sp_opt_check(&sp_settings[k], value, why, cap))
        return -1;
    if (k == SP_SET_DEVICE && strcmp(value, "auto") && sp_app_device_check(value, why, cap))
        return -1;
    snprintf(app->set[k], sizeof app->set[k], "%s", value);
    if (sp_settings[k].kind == SP_OPT_CHOICE) /* an alias's choice is stored ("f16": fp16) */
        sp_opt_choice_name(&sp_settings[k], sp_opt_choice(&sp_settings[k], value), app->set[k], sizeof app->set[k]);
    return 0;
}

int sp_app_device_check(const char *value, char *why, size_t cap)
{
    int cuda, index;
    char msg[320];
    if (sp_devparts_parse(value, &cuda, &index, msg, sizeof msg) || (cuda && !sp_device_usable(index, msg, sizeof msg))) {
        snprintf(why, cap, "device %s: %s", value, msg);
        return -1;
    }
    return 0;
}
