/* timeutil.h - monotonic clock, and the wall clock for timestamps other machines read. */
#ifndef SEPAL_TIMEUTIL_H
#define SEPAL_TIMEUTIL_H

#include <stdint.h>

uint64_t sp_now_ns(void);
double sp_now_s(void);
/* Seconds since the Unix epoch (CLOCK_REALTIME): only for timestamps shared with other machines. */
double sp_wall_s(void);

#endif
