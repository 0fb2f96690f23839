/* paths.c - the cache directory, the history file and ~ expansion. */
#include "paths.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sp_expand_home(const char *path, char *buf, size_t cap)
{
    const char *home = getenv("HOME");
    if (path[0] == '~' && (path[1] == '/' || !path[1]) && home && *home)
        snprintf(buf, cap, "%s%s", home, path + 1);
    else
        snprintf(buf, cap, "%s", path);
}

void sp_cache_dir(char *buf, size_t cap)
{
    const char *c = getenv("SEPAL_CACHE"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    if (c && *c)
        sp_expand_home(c, buf, cap);
    else if (x && *x)
        snprintf(buf, cap, "%s/sepal", x);
    else
        snprintf(buf, cap, "%s/.cache/sepal", h && *h ? h : "/tmp");
}

char *sp_history_path(void)
{
    const char *env = getenv("SEPAL_HISTORY"), *home = getenv("HOME");
    if (!(env && *env) && !(home && *home))
        return NULL;
    size_t cap = (env && *env ? strlen(env) : strlen("/.sepal_history")) + (home ? strlen(home) : 0) + 1;
    char *path = malloc(cap);
    if (path && env && *env)
        sp_expand_home(env, path, cap);
    else if (path)
        snprintf(path, cap, "%s/.sepal_history", home);
    return path;
}
