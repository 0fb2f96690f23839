/* cmd_train.c - `train`, `eval`, `plugin load|list`: prompt tuning from the REPL. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "cli.h"
#include "host.h"
#include "runtime.h"
#include "trainer.h"

sp_runtime *sp_app_runtime(sp_app *app);

static const sepal_task *find_task(sp_app *app, const char *name)
{
    sp_plugin_register_builtins();
    const sepal_task *t = sp_plugin_find(name);
    if (!t)
        sp_app_error(app, "unknown task '%s' (plugin list shows the tasks; plugin load PATH adds one)", name);
    return t;
}

typedef struct train_args {
    const char *task, *task_args, *save, *load;
    sp_train_opts o;
} train_args;

static int parse_enum(sp_app *app, const char *opt, const char *v, const char *const *names, int n, int *out)
{
    char all[128] = "";
    for (int i = 0; i < n; i++) {
        if (!strcmp(v, names[i]))
            return *out = i, 0;
        snprintf(all + strlen(all), sizeof all - strlen(all), "%s%s", i ? ", " : "", names[i]);
    }
    return sp_app_error(app, "%s: '%s' is not one of %s", opt, v, all);
}

/* train TASK [--tuning ...] ...; eval TASK [--load FILE] takes the same options. */
static int parse(sp_app *app, int argc, char **argv, train_args *a)
{
    memset(a, 0, sizeof *a);
    sp_train_opts_default(&a->o);
    if (argc < 2 || argv[1][0] == '-')
        return sp_app_error(app, "usage: %s TASK [options] (help %s)", argv[0], argv[0]);
    a->task = argv[1];
    static const char *const tunings[] = {"head", "ptune", "deep_ptune"}, *const scheds[] = {"afab", "1f1b"};
    for (int i = 2; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "--fp16")) {
            a->o.fp16 = 1;
            continue;
        }
        long x;
        double d;
        int e = 0, rc = 0;
        if (!v)
            return sp_app_error(app, "option '%s' needs a value", o);
        if (!strcmp(o, "--tuning"))
            rc = parse_enum(app, o, v, tunings, 3, &e), a->o.tuning = (sp_tuning)e;
        else if (!strcmp(o, "--schedule"))
            rc = parse_enum(app, o, v, scheds, 2, &e), a->o.schedule = (sp_schedule)e;
        else if (!strcmp(o, "--pre-seq-len"))
            rc = cli_parse_int(o, v, 0, 4096, &x), a->o.pre_seq_len = (int)x;
        else if (!strcmp(o, "--lr"))
            rc = cli_parse_float(o, v, &d), a->o.lr = (float)d;
        else if (!strcmp(o, "--epochs"))
            rc = cli_parse_int(o, v, 1, 1000, &x), a->o.epochs = (int)x;
        else if (!strcmp(o, "--batch"))
            rc = cli_parse_int(o, v, 1, 4096, &x), a->o.batch = (int)x;
        else if (!strcmp(o, "--warmup"))
            rc = cli_parse_int(o, v, 0, 1 << 24, &x), a->o.warmup = (int)x;
        else if (!strcmp(o, "--max-length"))
            rc = cli_parse_int(o, v, 2, 1 << 20, &x), a->o.max_length = (int)x;
        else if (!strcmp(o, "--microbatches"))
            rc = cli_parse_int(o, v, 1, 64, &x), a->o.microbatches = (int)x;
        else if (!strcmp(o, "--max-in-flight"))
            rc = cli_parse_int(o, v, 0, 64, &x), a->o.max_in_flight = (int)x;
        else if (!strcmp(o, "--max-steps"))
            rc = cli_parse_int(o, v, 0, 1 << 30, &x), a->o.max_steps = (int)x;
        else if (!strcmp(o, "--eval-batches"))
            rc = cli_parse_int(o, v, 0, 1 << 30, &x), a->o.eval_batches = (int)x;
        else if (!strcmp(o, "--seed"))
            rc = cli_parse_int(o, v, 0, __LONG_MAX__, &x), a->o.seed = (uint64_t)x;
        else if (!strcmp(o, "--device"))
            rc = parse_enum(app, o, v, (const char *const[]){"cpu", "cuda"}, 2, &e), a->o.device = e;
        else if (!strcmp(o, "--args"))
            a->task_args = v;
        else if (!strcmp(o, "--save"))
            a->save = v;
        else if (!strcmp(o, "--load"))
            a->load = v;
        else
            return sp_app_error(app, "%s: unknown option '%s'", argv[0], o);
        if (rc)
            return 1;
        i++;
    }
    if (a->o.tuning == SP_TUNE_HEAD)
        a->o.pre_seq_len = 0;
    else if (a->o.pre_seq_len < 1)
        return sp_app_error(app, "%s: --pre-seq-len must be >= 1 for %s", argv[0], tunings[a->o.tuning]);
    return 0;
}

static void print_step(const sp_train_event *ev, void *user)
{
    (void)user;
    if (ev->metrics)
        printf("epoch %d: validation %s\n", ev->epoch, ev->metrics);
    else
        printf("epoch %d step %d/%d: loss %.4f lr %.2e (%.0f tok/s)\n", ev->epoch, ev->step, ev->steps_total, ev->loss,
               ev->lr, ev->tokens_per_s);
    fflush(stdout);
}

static int run(sp_app *app, int argc, char **argv, int do_train)
{
    train_args a;
    if (parse(app, argc, argv, &a))
        return 1;
    const sepal_task *task = find_task(app, a.task);
    sp_runtime *rt = task ? sp_app_runtime(app) : NULL;
    if (!rt)
        return 1;
    sp_trainer *t = NULL;
    sp_err err = {0};
    if (sp_trainer_new(&t, rt, NULL, task, a.task_args, &a.o, &err))
        return sp_app_error(app, "%s", err.msg);
    sp_status st = a.load ? sp_trainer_load(t, a.load, &err) : SP_OK;
    char metrics[512];
    if (!st && do_train)
        st = sp_trainer_fit(t, print_step, NULL, &err);
    else if (!st)
        st = sp_trainer_eval(t, metrics, sizeof metrics, &err);
    if (!st && !do_train)
        printf("%s: %s\n", task->name, metrics);
    if (!st && a.save && !(st = sp_trainer_save(t, a.save, &err)))
        printf("saved the trained parameters to %s\n", a.save);
    sp_trainer_free(t);
    return st ? sp_app_error(app, "%s", err.msg) : 0;
}

static int cmd_train(sp_app *app, int argc, char **argv) { return run(app, argc, argv, 1); }
static int cmd_eval(sp_app *app, int argc, char **argv) { return run(app, argc, argv, 0); }

static int cmd_plugin(sp_app *app, int argc, char **argv)
{
    sp_plugin_register_builtins();
    if (argc == 3 && !strcmp(argv[1], "load")) {
        const sepal_task *t;
        char why[512];
        if (sp_plugin_load(argv[2], &t, why, sizeof why))
            return sp_app_error(app, "%s", why);
        printf("loaded task %s: %s\n", t->name, t->description ? t->description : "");
        return 0;
    }
    if (argc == 2 && !strcmp(argv[1], "list")) {
        for (int i = 0; i < sp_plugin_count(); i++) {
            const sepal_task *t = sp_plugin_at(i);
            printf("%-12s %-8s %s\n", t->name,
                   t->num_labels == 0 ? "lm" : t->num_labels == 1 ? "regress" : "classes",
                   t->description ? t->description : "");
        }
        return 0;
    }
    return sp_app_error(app, "usage: plugin load PATH | plugin list");
}

#define TRAIN_ARGS                                                                                                \
    "TASK [--tuning head|ptune|deep_ptune] [--pre-seq-len P] [--lr X] [--epochs N] [--batch B] [--warmup W] "    \
    "[--max-length L] [--schedule afab|1f1b] [--microbatches M] [--max-in-flight K] [--seed S] [--save FILE] "     \
    "[--load FILE] [--args \"k=v ...\"] [--max-steps N] [--eval-batches N] [--device cpu|cuda] [--fp16]"

const sp_cmd sp_cmds_train[] = {
    {"train", NULL, TRAIN_ARGS, "prompt-tune the loaded model on a task through the swarm",
     "Trains the client's parameters (prompts, deep prompts, a classification head) while the blocks run on\n"
     "the servers. Prints the loss of every step and the validation metrics after every epoch.\n"
     "The servers are pipeline stages: a batch runs as --microbatches M (default 4) that overlap across them,\n"
     "each server taking its work in --schedule 1f1b (default) or afab order; --max-in-flight K (default 4,\n"
     "0: no bound) bounds how many microbatches hold activations at once. Loss and gradients are the same.\n"
     "Tasks: `plugin list` (sst2 and causal_lm are built in; causal_lm needs --args \"file=PATH\").",
     cmd_train},
    {"eval", NULL, TRAIN_ARGS, "validation metrics of a task (with --load FILE: trained parameters)", NULL, cmd_eval},
    {"plugin", NULL, "load PATH | list", "load a task plugin (.so), or list the tasks", NULL, cmd_plugin},
    {NULL, NULL, NULL, NULL, NULL, NULL},
};
