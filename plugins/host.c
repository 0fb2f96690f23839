/* host.c - plugin loading (dlopen), ABI checks and the task registry. See host.h. */
#include "host.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    const sepal_task *task;
    char *origin;                     /* the path it was loaded from; NULL: built in */
    sepal_plugin_check_args_fn check; /* its check of arguments, or NULL */
} entry;

static entry reg[SP_PLUGIN_MAX];
static int nreg;
static void *handles[SP_PLUGIN_MAX];
static int nhandles;
static int atexit_done;

__attribute__((format(printf, 3, 4))) static int fail(char *err, size_t cap, const char *fmt, ...)
{
    if (err && cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, cap, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static const char *missing_callback(const sepal_task *t)
{
    if (!t->open)
        return "open";
    if (!t->close)
        return "close";
    if (!t->size)
        return "size";
    if (!t->batch)
        return "batch";
    return NULL;
}

int sp_plugin_check(const sepal_task *t, const char *what, char *err, size_t cap)
{
    what = what ? what : "task";
    if (!t)
        return fail(err, cap, "%s has no task", what);
    if (t->abi != SEPAL_PLUGIN_ABI)
        return fail(err, cap, "%s was built for plugin ABI %u, this sepal speaks %u", what, (unsigned)t->abi,
                    (unsigned)SEPAL_PLUGIN_ABI);
    if (!t->name || !*t->name)
        return fail(err, cap, "%s has no name", what);
    const char *cb = missing_callback(t);
    if (cb)
        return fail(err, cap, "%s lacks the required callback %s", what, cb);
    int m = !!t->metrics_reset + !!t->metrics_add + !!t->metrics_get;
    if (m != 0 && m != 3)
        return fail(err, cap, "%s sets only some of metrics_reset, metrics_add, metrics_get", what);
    if (t->num_labels < 0)
        return fail(err, cap, "%s has a negative num_labels", what);
    if (t->multi_label && t->num_labels < 2)
        return fail(err, cap, "%s is multi_label with fewer than 2 labels", what);
    return 0;
}

static int find_index(const char *name)
{
    for (int i = 0; i < nreg; i++)
        if (strcmp(reg[i].task->name, name) == 0)
            return i;
    return -1;
}

/* Registers t (already checked) and its check; origin is copied. 0 = ok, -1 = full or out of memory. */
static int put(const sepal_task *t, const char *origin, sepal_plugin_check_args_fn check)
{
    char *o = NULL;
    if (origin && !(o = strdup(origin)))
        return -1;
    int i = find_index(t->name);
    if (i < 0) {
        if (nreg == SP_PLUGIN_MAX) {
            free(o);
            return -1;
        }
        i = nreg++;
    } else {
        free(reg[i].origin);
    }
    reg[i].task = t;
    reg[i].origin = o;
    reg[i].check = check;
    return 0;
}

int sp_plugin_register(const sepal_task *t, sepal_plugin_check_args_fn check)
{
    if (sp_plugin_check(t, "task", NULL, 0) != 0)
        return -1;
    return put(t, NULL, check);
}

int sp_plugin_register_builtins(void)
{
    if (sp_plugin_register(sp_sst2_task(), sp_sst2_check_args()) != 0)
        return -1;
    return sp_plugin_register(sp_causal_lm_task(), sp_causal_lm_check_args());
}

int sp_plugin_check_args(const sepal_task *t, const char *args, char *err, size_t cap)
{
    for (int i = 0; i < nreg; i++)
        if (reg[i].task == t && reg[i].check)
            return reg[i].check(args ? args : "", err, cap) ? -1 : 0;
    return 0;
}

const sepal_task *sp_plugin_find(const char *name)
{
    int i = name ? find_index(name) : -1;
    return i < 0 ? NULL : reg[i].task;
}

int sp_plugin_count(void)
{
    return nreg;
}

const sepal_task *sp_plugin_at(int i)
{
    return i >= 0 && i < nreg ? reg[i].task : NULL;
}

const char *sp_plugin_origin(int i)
{
    if (i < 0 || i >= nreg)
        return NULL;
    return reg[i].origin ? reg[i].origin : "built-in";
}

void sp_plugin_unload_all(void)
{
    for (int i = 0; i < nreg; i++)
        free(reg[i].origin);
    memset(reg, 0, sizeof reg);
    nreg = 0;
    while (nhandles > 0)
        dlclose(handles[--nhandles]);
}

static int is_registered(const sepal_task *t)
{
    for (int i = 0; i < nreg; i++)
        if (reg[i].task == t)
            return 1;
    return 0;
}

/* Opens path; NULL with the message in err. */
static void *open_object(const char *path, char *err, size_t cap)
{
    struct stat sb;
    if (strchr(path, '/') && stat(path, &sb) != 0) {
        fail(err, cap, "cannot load plugin %s: %s", path, strerror(errno));
        return NULL;
    }
    dlerror();
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        fail(err, cap, "cannot load plugin %s: %s", path, why ? why : "unknown dlopen error");
    }
    return h;
}

/* The task h exports; NULL with the message in err. */
static const sepal_task *lookup_task(void *h, const char *path, char *err, size_t cap)
{
    dlerror();
    void *sym = dlsym(h, SEPAL_PLUGIN_SYMBOL);
    if (!sym) {
        fail(err, cap, "%s is not a sepal plugin: it does not export %s", path, SEPAL_PLUGIN_SYMBOL);
        return NULL;
    }
    sepal_plugin_task_fn fn;
    memcpy(&fn, &sym, sizeof fn);
    const sepal_task *t = fn();
    if (!t)
        fail(err, cap, "plugin %s returned no task from %s", path, SEPAL_PLUGIN_SYMBOL);
    return t;
}

/* The optional check of arguments h exports, or NULL. */
static sepal_plugin_check_args_fn lookup_check(void *h)
{
    sepal_plugin_check_args_fn fn = NULL;
    void *sym = dlsym(h, SEPAL_PLUGIN_CHECK_ARGS_SYMBOL);
    if (sym)
        memcpy(&fn, &sym, sizeof fn);
    return fn;
}

static int keep_handle(void *h, const sepal_task *t, const char *path, char *err, size_t cap)
{
    if (nhandles == SP_PLUGIN_MAX || (find_index(t->name) < 0 && nreg == SP_PLUGIN_MAX))
        return fail(err, cap, "cannot load plugin %s: too many plugins loaded", path);
    if (put(t, path, lookup_check(h)) != 0)
        return fail(err, cap, "cannot load plugin %s: out of memory", path);
    if (!atexit_done && atexit(sp_plugin_unload_all) == 0)
        atexit_done = 1;
    handles[nhandles++] = h;
    return 0;
}

int sp_plugin_load(const char *path, const sepal_task **out, char *err, size_t cap)
{
    if (out)
        *out = NULL;
    if (!path || !*path)
        return fail(err, cap, "no plugin path given");
    void *h = open_object(path, err, cap);
    if (!h)
        return -1;
    const sepal_task *t = lookup_task(h, path, err, cap);
    char what[1024];
    snprintf(what, sizeof what, "plugin %s", path);
    if (!t || sp_plugin_check(t, what, err, cap) != 0) {
        dlclose(h);
        return -1;
    }
    if (is_registered(t)) {
        dlclose(h); /* the same object again: drop the extra reference */
    } else if (keep_handle(h, t, path, err, cap) != 0) {
        dlclose(h);
        return -1;
    }
    if (out)
        *out = t;
    return 0;
}
