/* trace.c - see trace.h (compiled only with -DSEPAL_HOP_TRACE=ON). */
#include "trace.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "timeutil.h"

#define TRACE_CAP 200000

static uint64_t tr_ns[TRACE_CAP];
static int tr_tag[TRACE_CAP];
static int tr_n;

void sp_trace(int tag)
{
    int i = __atomic_fetch_add(&tr_n, 1, __ATOMIC_RELAXED);
    if (i < TRACE_CAP) {
        tr_ns[i] = sp_now_ns();
        tr_tag[i] = tag;
    }
    if (i % 4096 == 4095)
        sp_trace_flush();
}

__attribute__((destructor)) void sp_trace_flush(void)
{
    const char *dir = getenv("SEPAL_TRACE_DIR");
    int n = __atomic_load_n(&tr_n, __ATOMIC_RELAXED);
    if (!dir || !n)
        return;
    char path[4096];
    snprintf(path, sizeof path, "%s/trace-%d.txt", dir, (int)getpid());
    FILE *f = fopen(path, "w");
    if (!f)
        return;
    for (int i = 0; i < n && i < TRACE_CAP; i++)
        fprintf(f, "%d %llu\n", tr_tag[i], (unsigned long long)tr_ns[i]);
    fclose(f);
}
