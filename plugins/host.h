/* host.h - the plugin host: loads task plugins (include/sepal/plugin.h) and keeps the registry of tasks the
 * front end can train on, the built-in ones (sst2, causal_lm) and the loaded ones.
 *
 * Loading dlopens the .so (RTLD_NOW | RTLD_LOCAL), looks up SEPAL_PLUGIN_SYMBOL (and the optional
 * SEPAL_PLUGIN_CHECK_ARGS_SYMBOL), refuses a task built for another plugin ABI (the message names both versions) or one that lacks a required callback, and registers
 * it. A loaded task replaces a registered one of the same name. Loaded objects stay mapped until
 * sp_plugin_unload_all(), which also runs at exit. Not thread-safe: call from the front end's thread. */
#ifndef SEPAL_PLUGINS_HOST_H
#define SEPAL_PLUGINS_HOST_H

#include <stddef.h>

#include "sepal/plugin.h"

#define SP_PLUGIN_MAX 64 /* registered tasks at most */

/* Loads the plugin at path, checks and registers its task. 0 = ok (*out set), -1 = error (message in err). */
int sp_plugin_load(const char *path, const sepal_task **out, char *err, size_t cap);
/* Checks a task against the ABI: version, name, required callbacks, num_labels >= 0. what names it in the
 * message ("plugin PATH", "built-in task"). 0 = ok, -1 = error (message in err). */
int sp_plugin_check(const sepal_task *t, const char *what, char *err, size_t cap);
/* Registers a task (checked first; replaces one of the same name) with its check of arguments (may be NULL).
 * 0 = ok, -1 = invalid or registry full. */
int sp_plugin_register(const sepal_task *t, sepal_plugin_check_args_fn check);
/* Checks args for the registered task t without opening it (the plugin's sepal_plugin_check_args): 0 when they
 * pass or the task has no such check, -1 with the task's message in err. */
int sp_plugin_check_args(const sepal_task *t, const char *args, char *err, size_t cap);
/* Registers the shipped tasks, compiled in (no dlopen). 0 = ok. */
int sp_plugin_register_builtins(void);
/* The registered task called name, or NULL. */
const sepal_task *sp_plugin_find(const char *name);
/* The registered tasks in registration order, and where each came from (a path, or "built-in"). */
int sp_plugin_count(void);
const sepal_task *sp_plugin_at(int i);
const char *sp_plugin_origin(int i);
/* Empties the registry and closes every loaded object (their tasks must no longer be in use). */
void sp_plugin_unload_all(void);

/* The shipped tasks, compiled into the host library, and their checks of arguments. */
const sepal_task *sp_sst2_task(void);
const sepal_task *sp_causal_lm_task(void);
sepal_plugin_check_args_fn sp_sst2_check_args(void);
sepal_plugin_check_args_fn sp_causal_lm_check_args(void);

#endif
