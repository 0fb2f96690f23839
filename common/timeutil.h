/* timeutil.h - monotonic clock. */
#ifndef SEPAL_TIMEUTIL_H
#define SEPAL_TIMEUTIL_H

#include <stdint.h>

uint64_t sp_now_ns(void);
double sp_now_s(void);

#endif
