#include "timeutil.h"

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
