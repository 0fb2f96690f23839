/* paths.c - the cache directory and ~ expansion. */
#include "paths.h"

#include <stdio.h>
#include <stdlib.h>

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
