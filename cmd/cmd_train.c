/* cmd_train.c - `train`, `eval`, `plugin load|list`: prompt tuning from the command line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app.h"
#include "host.h"
#include "runtime.h"
#include "trainer.h"

static const char *const TUNINGS[] = {"head", "ptune", "deep_ptune"};

static const sepal_task *find_task(sp_app *app, const char *cmd, const char *name)
{
    sp_plugin_register_builtins();
    const sepal_task *t = sp_plugin_find(name);
    if (!t) {
        char list[256] = "";
        size_t n = 0;
        for (int i = 0; i < sp_plugin_count() && n < sizeof list; i++)
            n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", sp_plugin_at(i)->name);
        sp_app_error(app, "%s: unknown task '%s' (tasks: %s; `plugin load PATH` adds one)", cmd, name, list);
    }
    return t;
}

/* The options both commands share, from the command line (the file's own description first, with --load). */
static void common_opts(sp_app *app, const sp_args *a, sp_train_opts *o)
{
    o->tuning = (sp_tuning)sp_arg_choice(app, a, "--tuning", (int)o->tuning);
    o->pre_seq_len = (int)sp_arg_int(app, a, "--pre-seq-len", o->pre_seq_len);
    o->batch = (int)sp_arg_int(app, a, "--batch", o->batch);
    o->max_length = (int)sp_arg_int(app, a, "--max-length", o->max_length);
    o->eval_batches = (int)sp_arg_int(app, a, "--eval-batches", o->eval_batches);
    o->microbatches = (int)sp_arg_int(app, a, "--microbatches", o->microbatches);
    o->seed = (uint64_t)sp_arg_int(app, a, "--seed", (long long)o->seed);
    int dev = sp_arg_choice(app, a, "--device", -1);
    if (dev >= 0)
        o->device = dev;
}

typedef struct progress_ctx {
    sp_app *app;
} progress_ctx;

static void on_train(const sp_train_event *ev, void *user)
{
    progress_ctx *p = user;
    sp_ui_event e = {.kind = SP_UI_TRAIN, .train = ev};
    sp_emit(p->app, &e);
}

/* train TASK ... / eval [TASK] ... */
static int run(sp_app *app, const sp_args *a, int do_train)
{
    const char *cmd = do_train ? "train" : "eval";
    const char *load = sp_arg(app, a, "--load"), *save = sp_arg(app, a, "--save");
    sp_params_info info = {0};
    sp_err err = {0};
    if (load && sp_params_info_read(load, &info, &err))
        return sp_app_error(app, "%s: --load %s: %s", cmd, load, err.msg);
    const char *task_name = a->npos ? a->pos[0] : info.has_meta ? info.task : NULL;
    if (!task_name)
        return sp_app_error(app, "%s: which task? (usage: %s TASK [options]; `plugin list` shows the tasks)", cmd, cmd);
    if (info.has_meta && a->npos && strcmp(a->pos[0], info.task))
        return sp_app_error(app, "%s: %s was trained on task %s, not %s", cmd, load, info.task, a->pos[0]);
    if (info.has_meta && ((sp_arg_given(a, "--tuning") &&
                           sp_arg_choice(app, a, "--tuning", 0) != (int)info.tuning) ||
                          (sp_arg_given(a, "--pre-seq-len") && info.tuning != SP_TUNE_HEAD &&
                           sp_arg_int(app, a, "--pre-seq-len", 0) != info.pre_seq_len)))
        return sp_app_error(app, "%s: %s holds --tuning %s --pre-seq-len %d; leave those options out", cmd, load,
                            TUNINGS[info.tuning], info.pre_seq_len);
    const sepal_task *task = find_task(app, cmd, task_name);
    sp_runtime *rt = task ? sp_app_runtime(app) : NULL;
    if (!rt)
        return 1;
    if (!rt->local)
        return sp_app_error(app, "%s: no model loaded (load DIR first)", cmd);
    if (load && sp_params_check_model(load, &info, rt->model_prefix, rt->local->cfg.hash, &err))
        return sp_app_error(app, "%s: %s", cmd, err.msg);
    sp_train_opts o;
    sp_train_opts_default(&o);
    if (info.has_meta) {
        o.tuning = info.tuning;
        o.pre_seq_len = info.pre_seq_len ? info.pre_seq_len : o.pre_seq_len;
    }
    common_opts(app, a, &o);
    if (do_train) {
        o.lr = (float)sp_arg_num(app, a, "--lr", o.lr);
        o.epochs = (int)sp_arg_int(app, a, "--epochs", o.epochs);
        o.warmup = (int)sp_arg_int(app, a, "--warmup", o.warmup);
        o.schedule = (sp_schedule)sp_arg_choice(app, a, "--schedule", (int)o.schedule);
        o.max_in_flight = (int)sp_arg_int(app, a, "--max-in-flight", o.max_in_flight);
        o.max_steps = (int)sp_arg_int(app, a, "--max-steps", o.max_steps);
        o.fp16 = sp_arg_given(a, "--fp16");
    }
    if (o.tuning == SP_TUNE_HEAD)
        o.pre_seq_len = 0;
    if (save && access(save, F_OK) == 0 && !sp_arg_given(a, "--overwrite"))
        return sp_app_error(app, "%s: --save %s: the file exists (add --overwrite to replace it)", cmd, save);
    sp_trainer *t = NULL;
    if (sp_trainer_new(&t, rt, NULL, task, sp_arg(app, a, "--args"), &o, &err))
        return sp_app_error(app, "%s: %s", cmd, err.msg);
    progress_ctx pc = {.app = app};
    sp_trainer_on_progress(t, on_train, &pc);
    sp_status st = load ? sp_trainer_load(t, load, &err) : SP_OK;
    if (st) {
        sp_trainer_free(t);
        return sp_app_error(app, "%s: --load %s: %s", cmd, load, err.msg);
    }
    char metrics[512];
    if (do_train) {
        char what[256], span[48];
        if (o.max_steps > 0) /* the steps decide, not the epochs */
            snprintf(span, sizeof span, "at most %d step%s", o.max_steps, o.max_steps == 1 ? "" : "s");
        else
            snprintf(span, sizeof span, "%d epoch%s", o.epochs, o.epochs == 1 ? "" : "s");
        snprintf(what, sizeof what, "training %s with %s (P %d), batch %d, lr %g, %s", task->name,
                 TUNINGS[o.tuning], o.tuning == SP_TUNE_HEAD ? 0 : o.pre_seq_len, o.batch, (double)o.lr, span);
        sp_ui_event b = {.kind = SP_UI_TRAIN_BEGIN, .text = what};
        sp_emit(app, &b);
        st = sp_trainer_fit(t, on_train, &pc, &err);
    } else {
        st = sp_trainer_eval(t, metrics, sizeof metrics, &err);
    }
    int steps = sp_trainer_steps_done(t);
    int cancelled = st == SP_ERR_CANCELLED;
    if (!st && !do_train)
        sp_out(app, "%s: %s\n", task->name, metrics);
    if (do_train) {
        char how[600];
        snprintf(how, sizeof how, "%s", cancelled ? err.msg : st ? "failed" : "done");
        sp_ui_event e = {.kind = SP_UI_TRAIN_END, .text = how};
        sp_emit(app, &e);
    }
    int rc = 0;
    if (st && !cancelled)
        rc = sp_app_error(app, "%s: %s", cmd, err.msg);
    else if (cancelled)
        rc = (sp_note(app, "^C (%s)", err.msg), 1);
    /* --save: what was trained, also when stopped; never parameters no step has changed */
    if (save && do_train && (!st || cancelled) && steps > 0) {
        sp_err serr = {0};
        if (sp_trainer_save(t, save, &serr))
            rc = sp_app_error(app, "train: --save %s: %s", save, serr.msg);
        else if (cancelled)
            sp_out(app, "saved the parameters after %d step%s to %s\n", steps, steps == 1 ? "" : "s", save);
        else
            sp_out(app, "saved the trained parameters to %s\n", save);
    } else if (save && do_train && steps == 0) {
        sp_note(app, "nothing saved to %s: no step was taken", save);
    }
    sp_trainer_free(t);
    return rc;
}

static int cmd_train(sp_app *app, const sp_args *a) { return run(app, a, 1); }
static int cmd_eval(sp_app *app, const sp_args *a) { return run(app, a, 0); }

static int cmd_plugin_load(sp_app *app, const sp_args *a)
{
    sp_plugin_register_builtins();
    const sepal_task *t;
    char why[512];
    if (sp_plugin_load(a->pos[0], &t, why, sizeof why))
        return sp_app_error(app, "plugin load: %s", why);
    sp_out(app, "loaded task %s: %s\n", t->name, t->description ? t->description : "");
    return 0;
}

static int cmd_plugin_list(sp_app *app, const sp_args *a)
{
    (void)a;
    sp_plugin_register_builtins();
    for (int i = 0; i < sp_plugin_count(); i++) {
        const sepal_task *t = sp_plugin_at(i);
        sp_out(app, "%-12s %-8s %s\n", t->name, t->num_labels == 0 ? "lm" : t->num_labels == 1 ? "regress" : "classes",
               t->description ? t->description : "");
    }
    return 0;
}

#define COMMON_OPTS                                                                                                \
    {"--tuning", SP_OPT_CHOICE, NULL, 0, 0, "head|ptune|deep_ptune", NULL, "deep_ptune",                           \
     "what trains: a head only, prompts, or prompts before every block"},                                          \
        {"--pre-seq-len", SP_OPT_INT, "P", 1, 4096, NULL, NULL, "16", "prompt positions"},                         \
        {"--batch", SP_OPT_INT, "B", 1, 4096, NULL, NULL, "16", "examples per step"},                              \
        {"--max-length", SP_OPT_INT, "L", 2, 1 << 20, NULL, NULL, "64", "tokens per example at most"},             \
        {"--microbatches", SP_OPT_INT, "M", 1, 64, NULL, NULL, "4", "microbatches a batch is split into"},         \
        {"--eval-batches", SP_OPT_INT, "N", 0, 1 << 30, NULL, NULL, "0", "validate on N batches only; 0: all"},    \
        {"--seed", SP_OPT_INT, "S", 0, 9.2e18, NULL, NULL, "0", "seed of initialisation and shuffling"},           \
        {"--device", SP_OPT_CHOICE, NULL, 0, 0, "cpu|cuda", NULL, "cuda if present",                               \
         "where the optimizer step runs"},                                                                          \
        {"--args", SP_OPT_STR, "\"k=v ...\"", 0, 0, NULL, NULL, NULL, "the task's arguments (causal_lm: file=PATH)"}, \
        {"--load", SP_OPT_PATH, "FILE", 0, 0, NULL, NULL, NULL,                                                     \
         "start from parameters saved by --save (the file says its task, tuning and pre-seq-len)"}

static const sp_opt train_opts[] = {
    COMMON_OPTS,
    {"--lr", SP_OPT_NUM, "X", 0, 10, NULL, NULL, "1e-2", "peak learning rate (AdamW)"},
    {"--epochs", SP_OPT_INT, "N", 1, 1000, NULL, NULL, "3", "passes over the training split"},
    {"--warmup", SP_OPT_INT, "W", 0, 1 << 24, NULL, NULL, "20", "steps of linear warm-up (then linear decay)"},
    {"--schedule", SP_OPT_CHOICE, NULL, 0, 0, "afab|1f1b", NULL, "1f1b", "the pipeline's order over the servers"},
    {"--max-in-flight", SP_OPT_INT, "K", 0, 64, NULL, NULL, "4",
     "microbatches holding activations at once; 0: no bound"},
    {"--max-steps", SP_OPT_INT, "N", 0, 1 << 30, NULL, NULL, "0", "stop after N steps; 0: the epochs decide"},
    {"--fp16", SP_OPT_FLAG, NULL, 0, 0, NULL, NULL, NULL, "dynamic loss scaling, as fp16 training needs"},
    {"--save", SP_OPT_PATH, "FILE", 0, 0, NULL, NULL, NULL,
     "write the trained parameters (also when stopped after some steps)"},
    {"--overwrite", SP_OPT_FLAG, NULL, 0, 0, NULL, NULL, NULL, "let --save replace an existing file"},
    {0},
};

static const sp_opt eval_opts[] = {COMMON_OPTS, {0}};

static const sp_cmd plugin_subs[] = {
    {.name = "load", .args = "PATH", .min_pos = 1, .max_pos = 1, .pos_paths = 1,
     .summary = "load a task plugin (.so); a plugin of another ABI version is refused", .fn = cmd_plugin_load},
    {.name = "list", .args = "", .max_pos = 0, .summary = "list the tasks", .examples = "plugin list",
     .fn = cmd_plugin_list},
    {0},
};

const sp_cmd sp_cmds_train[] = {
    {.name = "train", .args = "TASK", .min_pos = 1, .max_pos = 1, .opts = train_opts,
     .summary = "prompt-tune the loaded model on a task through the swarm",
     .help = "Trains the client's parameters (prompts, deep prompts, a classification head) while the blocks run on "
             "the servers: the loss of every step, the validation metrics after every epoch (with a progress line). "
             "The servers are pipeline stages: a batch runs as --microbatches M that overlap across them, each server "
             "taking its work in --schedule order; --max-in-flight bounds how many microbatches hold activations at "
             "once. Loss and gradients are the same whatever the schedule. Ctrl-C stops after the current step (and "
             "--save writes what was trained). Tasks: `plugin list` (sst2 and causal_lm are built in; causal_lm "
             "needs --args \"file=PATH\").",
     .examples = "train sst2 --tuning deep_ptune --max-steps 5 --eval-batches 2", .fn = cmd_train},
    {.name = "eval", .args = "[TASK]", .min_pos = 0, .max_pos = 1, .opts = eval_opts,
     .summary = "validation metrics of a task (with --load FILE: of trained parameters)",
     .help = "With --load FILE the task, tuning and pre-seq-len come from the file (saved by train --save); a file "
             "trained for another model is refused. Options of training (--lr, --epochs, --save ...) are refused.",
     .examples = "eval sst2 --tuning head --eval-batches 2", .fn = cmd_eval},
    {.name = "plugin", .args = "load PATH | list", .subs = plugin_subs, .summary = "load a task plugin, or list the tasks"},
    {0},
};
