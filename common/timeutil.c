/* timeutil.c - the clocks, and durations written for people. */
#include "timeutil.h"

#include <math.h>
#include <stdio.h>
#include <time.h>

uint64_t sp_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double sp_now_s(void)
{
    return (double)sp_now_ns() * 1e-9;
}

double sp_wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void sp_fmt_duration(double s, char *buf, size_t cap)
{
    long t = isfinite(s) && s >= 0 && s < 1e15 ? lround(floor(s)) : -1;
    if (t < 0)
        snprintf(buf, cap, "?");
    else if (s < 60)
        snprintf(buf, cap, "%.0fs", s);
    else if (t < 3600)
        snprintf(buf, cap, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, cap, "%ldh%02ldm", t / 3600, t % 3600 / 60);
}
