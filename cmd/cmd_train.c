/* cmd_train.c - `train`, `eval`, `plugin load|list`: prompt tuning from the command line. */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rng.h"
#include "app.h"
#include "devparts.h"
#include "timeutil.h"
#include "host.h"
#include "optim.h"
#include "runtime.h"
#include "trainer.h"

static const char *const TUNINGS[] = {"head", "ptune", "deep_ptune"};

/* train's options; eval's are the first of them (up to TR_NCOMMON). Their defaults, said in help, are the
 * trainer's (sp_train_opts_default; tests/test_cmd.c holds them to it): a value not given keeps the trainer's,
 * or what a --load file says. */
enum {
    TR_TUNING, TR_PRE_SEQ_LEN, TR_BATCH, TR_MAX_LENGTH, TR_MICROBATCHES, TR_EVAL_BATCHES, TR_SEED, TR_DEVICE,
    TR_ARGS, TR_LOAD, TR_NCOMMON,
    TR_LR = TR_NCOMMON, TR_EPOCHS, TR_WARMUP, TR_SCHEDULE, TR_MAX_IN_FLIGHT, TR_MAX_STEPS, TR_FP16, TR_SAVE,
    TR_OVERWRITE, TR_LOG, TR_NOPTS
};

/* Option k when given, else cur. */
static int int_or(const sp_app *app, const sp_args *a, int k, int cur)
{
    return sp_arg_given(a, k) ? (int)sp_arg_int(app, a, k) : cur;
}

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

/* The task's arguments (--args), checked by the task before anything touches the swarm: 0, or 1 after a message
 * ("train: causal_lm: cannot read /x: No such file or directory"). */
static int check_task_args(sp_app *app, const sp_args *a, const char *cmd, const sepal_task *t)
{
    char why[512] = "";
    if (sp_plugin_check_args(t, sp_arg(app, a, TR_ARGS), why, sizeof why))
        return sp_app_error(app, "%s: %s", cmd, why);
    return 0;
}

/* --dry-run: the task's arguments, when the task is known (an unknown one may be a plugin the script loads). */
static int check_run(sp_app *app, const sp_args *a)
{
    sp_plugin_register_builtins();
    const sepal_task *t = a->npos ? sp_plugin_find(a->pos[0]) : NULL;
    return t ? check_task_args(app, a, a->path, t) : 0;
}

/* The options both commands share, from the command line (the file's own description first, with --load). */
static void common_opts(sp_app *app, const sp_args *a, sp_train_opts *o)
{
    if (sp_arg_given(a, TR_TUNING))
        o->tuning = (sp_tuning)sp_arg_choice(app, a, TR_TUNING);
    o->pre_seq_len = int_or(app, a, TR_PRE_SEQ_LEN, o->pre_seq_len);
    o->batch = int_or(app, a, TR_BATCH, o->batch);
    o->max_length = int_or(app, a, TR_MAX_LENGTH, o->max_length);
    o->eval_batches = int_or(app, a, TR_EVAL_BATCHES, o->eval_batches);
    o->microbatches = int_or(app, a, TR_MICROBATCHES, o->microbatches);
    if (sp_arg_given(a, TR_SEED))
        o->seed = (uint64_t)sp_arg_int(app, a, TR_SEED);
    int cuda, index; /* "auto": -1, as the default is */
    char why[320];
    const char *dev = sp_arg(app, a, TR_DEVICE);
    if (strcmp(dev, "auto") && !sp_devparts_parse(dev, &cuda, &index, why, sizeof why))
        o->device = cuda, o->device_index = index;
}

typedef struct progress_ctx {
    sp_app *app;
    FILE *log;  /* --log: a JSON line per step and per validation */
    double t0;
} progress_ctx;

/* A validation's metrics ("accuracy=0.75 loss=0.5 n=128") as a JSON object of numbers. */
static cJSON *metrics_json(const char *m)
{
    cJSON *o = cJSON_CreateObject();
    char name[64];
    double v;
    int used;
    for (const char *p = m; p && sscanf(p, " %63[^= ]=%lf%n", name, &v, &used) == 2; p += used)
        cJSON_AddNumberToObject(o, name, v);
    return o;
}

/* --log: the step's (or the validation's) line, flushed (a plot may read it while the run goes on). */
static void log_event(progress_ctx *p, const sp_train_event *ev)
{
    if (!p->log || ev->eval_total > 0)
        return;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "step", ev->step);
    cJSON_AddNumberToObject(o, "epoch", ev->epoch);
    if (ev->metrics) {
        cJSON_AddItemToObject(o, "validation", metrics_json(ev->metrics));
    } else {
        cJSON_AddNumberToObject(o, "loss", ev->loss);
        cJSON_AddNumberToObject(o, "lr", ev->lr);
        cJSON_AddNumberToObject(o, "grad_norm", ev->grad_norm);
        cJSON_AddNumberToObject(o, "tokens_per_s", round(ev->tokens_per_s * 10) / 10);
    }
    cJSON_AddNumberToObject(o, "t", round((sp_now_s() - p->t0) * 1000) / 1000);
    char *s = cJSON_PrintUnformatted(o);
    if (s)
        fprintf(p->log, "%s\n", s), fflush(p->log);
    free(s);
    cJSON_Delete(o);
}

static void on_train(const sp_train_event *ev, void *user)
{
    progress_ctx *p = user;
    log_event(p, ev);
    sp_ui_event e = {.kind = SP_UI_TRAIN, .train = ev};
    sp_emit(p->app, &e);
}

/* --log FILE: opened (refused when it exists, unless --overwrite), its first line the run's description. */
static int open_log(sp_app *app, const sp_args *a, const char *what, progress_ctx *p)
{
    const char *path = sp_arg(app, a, TR_LOG);
    if (!path)
        return 0;
    if (!(p->log = fopen(path, "w")))
        return sp_app_error(app, "train: --log %s: cannot write it", path);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "run", what);
    cJSON_AddNumberToObject(o, "started", (double)time(NULL));
    char *s = cJSON_PrintUnformatted(o);
    if (s)
        fprintf(p->log, "%s\n", s), fflush(p->log);
    free(s);
    cJSON_Delete(o);
    return 0;
}

/* train TASK ... / eval [TASK] ... */
static int run(sp_app *app, const sp_args *a, int do_train)
{
    const char *cmd = do_train ? "train" : "eval";
    const char *load = sp_arg(app, a, TR_LOAD), *save = sp_arg(app, a, TR_SAVE);
    sp_params_info info = {0};
    sp_err err = {0};
    if (load && sp_params_info_read(load, &info, &err))
        return sp_app_error(app, "%s: --load %s: %s", cmd, load, err.msg);
    const char *task_name = a->npos ? a->pos[0] : info.has_meta ? info.task : NULL;
    if (!task_name)
        return sp_app_error(app, "%s: which task? (usage: %s TASK [options]; `plugin list` shows the tasks)", cmd, cmd);
    if (info.has_meta && a->npos && strcmp(a->pos[0], info.task))
        return sp_app_error(app, "%s: %s was trained on task %s, not %s", cmd, load, info.task, a->pos[0]);
    if (info.has_meta && ((sp_arg_given(a, TR_TUNING) && sp_arg_choice(app, a, TR_TUNING) != (int)info.tuning) ||
                          (sp_arg_given(a, TR_PRE_SEQ_LEN) && info.tuning != SP_TUNE_HEAD &&
                           sp_arg_int(app, a, TR_PRE_SEQ_LEN) != info.pre_seq_len)))
        return sp_app_error(app, "%s: %s holds --tuning %s --pre-seq-len %d; leave those options out", cmd, load,
                            TUNINGS[info.tuning], info.pre_seq_len);
    const sepal_task *task = find_task(app, cmd, task_name);
    if (!task || check_task_args(app, a, cmd, task))
        return 1;
    char why[400];
    const char *dev = sp_arg(app, a, TR_DEVICE); /* given, or the device setting's */
    if (strcmp(dev, "auto") && sp_app_device_check(dev, why, sizeof why)) /* before the swarm */
        return sp_app_error(app, "%s: %s%s", cmd, sp_arg_given(a, TR_DEVICE) ? "--" : "", why);
    sp_runtime *rt = sp_app_runtime(app);
    if (!rt)
        return 1;
    if (!sp_runtime_config(rt))
        return sp_app_error(app, "%s: no model loaded (load DIR first)", cmd);
    if (load && sp_params_check_model(load, &info, sp_runtime_model_name(rt), sp_runtime_config(rt)->hash, &err))
        return sp_app_error(app, "%s: %s", cmd, err.msg);
    sp_train_opts o;
    sp_train_opts_default(&o);
    if (info.has_meta) {
        o.tuning = info.tuning;
        o.pre_seq_len = info.pre_seq_len ? info.pre_seq_len : o.pre_seq_len;
    }
    common_opts(app, a, &o);
    if (do_train) {
        if (sp_arg_given(a, TR_LR))
            o.lr = (float)sp_arg_num(app, a, TR_LR);
        o.epochs = int_or(app, a, TR_EPOCHS, o.epochs);
        o.warmup = int_or(app, a, TR_WARMUP, o.warmup);
        if (sp_arg_given(a, TR_SCHEDULE))
            o.schedule = (sp_schedule)sp_arg_choice(app, a, TR_SCHEDULE);
        o.max_in_flight = int_or(app, a, TR_MAX_IN_FLIGHT, o.max_in_flight);
        o.max_steps = int_or(app, a, TR_MAX_STEPS, o.max_steps);
        o.fp16 = sp_arg_given(a, TR_FP16);
    }
    if (o.tuning == SP_TUNE_HEAD)
        o.pre_seq_len = 0;
    if (save && access(save, F_OK) == 0 && !sp_arg_given(a, TR_OVERWRITE))
        return sp_app_error(app, "%s: --save %s: the file exists (add --overwrite to replace it)", cmd, save);
    const char *log = do_train ? sp_arg(app, a, TR_LOG) : NULL;
    if (log && access(log, F_OK) == 0 && !sp_arg_given(a, TR_OVERWRITE))
        return sp_app_error(app, "%s: --log %s: the file exists (add --overwrite to replace it)", cmd, log);
    sp_trainer *t = NULL;
    if (sp_trainer_new(&t, rt, NULL, task, sp_arg(app, a, TR_ARGS), &o, &err))
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
        char what[256], span[64];
        int planned = sp_trainer_steps_planned(t); /* what will run: the count the steps are numbered against */
        if (o.max_steps > 0 && planned == o.max_steps) /* the steps decide, not the epochs */
            snprintf(span, sizeof span, "at most %d step%s", planned, planned == 1 ? "" : "s");
        else
            snprintf(span, sizeof span, "%d epoch%s (%d step%s)", o.epochs, o.epochs == 1 ? "" : "s", planned,
                     planned == 1 ? "" : "s");
        snprintf(what, sizeof what, "training %s with %s (P %d), batch %d, lr %g, %s", task->name,
                 TUNINGS[o.tuning], o.tuning == SP_TUNE_HEAD ? 0 : o.pre_seq_len, o.batch, (double)o.lr, span);
        if (open_log(app, a, what, &pc)) {
            sp_trainer_free(t);
            return 1;
        }
        pc.t0 = sp_now_s();
        sp_ui_event b = {.kind = SP_UI_TRAIN_BEGIN, .text = what};
        sp_emit(app, &b);
        st = sp_trainer_fit(t, on_train, &pc, &err);
        if (pc.log)
            fclose(pc.log);
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
    [TR_TUNING] = {"--tuning", SP_OPT_CHOICE, .choices = "head|ptune|deep_ptune", .def = "deep_ptune",            \
                   .help = "what trains: a head only, prompts, or prompts before every block"},                    \
    [TR_PRE_SEQ_LEN] = {"--pre-seq-len", SP_OPT_INT, "P", 1, 4096, .def = "16", .help = "prompt positions"},      \
    [TR_BATCH] = {"--batch", SP_OPT_INT, "B", 1, 4096, .def = "16", .help = "examples per step"},                 \
    [TR_MAX_LENGTH] = {"--max-length", SP_OPT_INT, "L", 2, 1 << 20, .def = "64",                                  \
                       .help = "tokens per example at most"},                                                      \
    [TR_MICROBATCHES] = {"--microbatches", SP_OPT_INT, "M", 1, 64, .def = "4",                                    \
                         .help = "microbatches a batch is split into"},                                            \
    [TR_EVAL_BATCHES] = {"--eval-batches", SP_OPT_INT, "N", 0, 1 << 30, .def = "0",                               \
                         .help = "validate on N batches only; 0: all"},                                            \
    [TR_SEED] = {"--seed", SP_OPT_INT, "S", 0, SP_RNG_SEED_MAX, .def = "0", .help = "seed of initialisation and shuffling"}, \
    [TR_DEVICE] = {"--device", .meta = "auto|cpu|cuda[:N]", SP_SETTING(SP_SET_DEVICE),                            \
                   .help = "where the local parts and the optimizer run (the device setting)"},                   \
    [TR_ARGS] = {"--args", SP_OPT_STR, "\"k=v ...\"", .help = "the task's arguments (causal_lm: file=PATH)"},      \
    [TR_LOAD] = {"--load", SP_OPT_PATH, "FILE",                                                                   \
                 .help = "start from parameters saved by --save (the file says its task, tuning and pre-seq-len)"}

/* Tab completion: the task names. */
static void complete_task(const sp_app *app, int npos, const char *prev, const char *word, sp_strlist *out)
{
    (void)app, (void)prev;
    if (npos != 0)
        return;
    sp_plugin_register_builtins();
    for (int i = 0; i < sp_plugin_count(); i++)
        sp_strlist_add(out, sp_plugin_at(i)->name, strlen(sp_plugin_at(i)->name), word);
}

static const sp_opt train_opts[] = {
    COMMON_OPTS,
    [TR_LR] = {"--lr", SP_OPT_NUM, "X", 0, 10, .def = "1e-2", .help = "peak learning rate (AdamW)"},
    [TR_EPOCHS] = {"--epochs", SP_OPT_INT, "N", 1, 1000, .def = "3", .help = "passes over the training split"},
    [TR_WARMUP] = {"--warmup", SP_OPT_INT, "W", 0, 1 << 24, .def = "20",
                   .help = "steps of linear warm-up (then linear decay)"},
    [TR_SCHEDULE] = {"--schedule", SP_OPT_CHOICE, .choices = "afab|1f1b", .def = "1f1b",
                     .help = "the pipeline's order over the servers"},
    [TR_MAX_IN_FLIGHT] = {"--max-in-flight", SP_OPT_INT, "K", 0, 64, .def = "4",
                          .help = "microbatches holding activations at once; 0: no bound"},
    [TR_MAX_STEPS] = {"--max-steps", SP_OPT_INT, "N", 0, 1 << 30, .def = "0",
                      .help = "stop after N steps; 0: the epochs decide"},
    [TR_FP16] = {"--fp16", SP_OPT_FLAG, .help = "dynamic loss scaling, as fp16 training needs"},
    [TR_SAVE] = {"--save", SP_OPT_PATH, "FILE",
                 .help = "write the trained parameters (also when stopped after some steps)"},
    [TR_OVERWRITE] = {"--overwrite", SP_OPT_FLAG, .help = "let --save and --log replace an existing file"},
    [TR_LOG] = {"--log", SP_OPT_PATH, "FILE",
                .help = "write the run's metrics as JSON Lines (each step's loss, lr, grad_norm, tokens_per_s; "
                        "each epoch's validation) for `plot`"},
    [TR_NOPTS] = {0},
};

static const sp_opt eval_opts[] = {COMMON_OPTS, [TR_NCOMMON] = {0}};

static const sp_cmd plugin_subs[] = {
    {.name = "load", .args = "PATH", .min_pos = 1, .max_pos = 1, .pos_paths = 1,
     .summary = "load a task plugin (.so); a plugin of another ABI version is refused", .fn = cmd_plugin_load},
    {.name = "list", .args = "", .max_pos = 0, .summary = "list the tasks", .examples = "plugin list",
     .fn = cmd_plugin_list},
    {0},
};

const sp_cmd sp_cmds_train[] = {
    {.name = "train", .args = "TASK", .min_pos = 1, .max_pos = 1, SP_OPTS(train_opts),
     .summary = "prompt-tune the loaded model on a task through the swarm",
     .help = "Trains the client's parameters (prompts, deep prompts, a classification head) while the blocks run on "
             "the servers: the loss of every step, the validation metrics after every epoch (with a progress line). "
             "The servers are pipeline stages: a batch runs as --microbatches M that overlap across them, each server "
             "taking its work in --schedule order; --max-in-flight bounds how many microbatches hold activations at "
             "once. Loss and gradients are the same whatever the schedule. Ctrl-C stops after the current step (and "
             "--save writes what was trained). Tasks: `plugin list` (sst2 and causal_lm are built in; causal_lm "
             "needs --args \"file=PATH\").",
     .examples = "train sst2 --tuning deep_ptune --max-steps 5 --eval-batches 2 --log run1.jsonl", .fn = cmd_train,
     .check = check_run, .complete = complete_task},
    {.name = "eval", .args = "[TASK]", .min_pos = 0, .max_pos = 1, SP_OPTS(eval_opts),
     .summary = "validation metrics of a task (with --load FILE: of trained parameters)",
     .help = "With --load FILE the task, tuning and pre-seq-len come from the file (saved by train --save); a file "
             "trained for another model is refused. Options of training (--lr, --epochs, --save ...) are refused.",
     .examples = "eval sst2 --tuning head --eval-batches 2", .fn = cmd_eval, .check = check_run,
     .complete = complete_task},
    {.name = "plugin", .args = "load PATH | list", .subs = plugin_subs, .summary = "load a task plugin, or list the tasks"},
    {0},
};
