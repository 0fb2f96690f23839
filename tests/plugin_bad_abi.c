/* plugin_bad_abi.c - test fixtures for test_plugins.c: a task plugin built for plugin ABI 7 (the host must
 * refuse it, naming both versions), and, with SEPAL_TEST_NO_SYMBOL, a module that exports no task at all. */
#include "sepal/plugin.h"

#include <stddef.h>

static void *bad_open(const sepal_host *host, const char *args, char *err, size_t cap)
{
    return NULL;
}

static void bad_close(void *task)
{
}

static int bad_size(void *task, int split)
{
    return 0;
}

static int bad_batch(void *task, int split, const int *idx, int n, int max_length, sepal_batch *out, char *err,
                     size_t cap)
{
    return -1;
}

static const sepal_task task = {
    .abi = 7,
    .name = "bad_abi",
    .description = "a task from the future",
    .open = bad_open,
    .close = bad_close,
    .size = bad_size,
    .batch = bad_batch,
};

#ifndef SEPAL_TEST_NO_SYMBOL
SEPAL_PLUGIN_EXPORT const sepal_task *sepal_plugin_task(void);
SEPAL_PLUGIN_EXPORT const sepal_task *sepal_plugin_task(void)
{
    return &task;
}
#else
SEPAL_PLUGIN_EXPORT const sepal_task *some_other_symbol(void);
SEPAL_PLUGIN_EXPORT const sepal_task *some_other_symbol(void)
{
    return &task;
}
#endif
