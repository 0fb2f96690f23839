/* timeutil.h - monotonic clock, the wall clock for timestamps other machines read, durations for people. */
#ifndef SEPAL_TIMEUTIL_H
#define SEPAL_TIMEUTIL_H

#include <stddef.h>
#include <stdint.h>

uint64_t sp_now_ns(void);
double sp_now_s(void);
/* Seconds since the Unix epoch (CLOCK_REALTIME): only for timestamps shared with other machines. */
double sp_wall_s(void);
/* A duration for people, as progress lines and the TUI show an ETA: "45s", "3m05s", "1h02m"; "?" for a
 * negative or infinite one (or one of 1e15 s and more). */
void sp_fmt_duration(double s, char *buf, size_t cap);

#endif
