/* testrun.h - the part of the suites' helpers that needs only Check: running a suite and comparing arrays.
 * Suites that must build without the rest of sepal (the CUDA suites, built by hand on a GPU machine by
 * scripts/device-test-cuda.sh) include this instead of testutil.h. */
#ifndef SEPAL_TESTRUN_H
#define SEPAL_TESTRUN_H

#include <check.h>
#include <stddef.h>

/* Runs one suite and returns the process exit status (non-zero on any failure). */
int sp_test_run(Suite *s);
/* max |a - b| over n elements. */
double sp_max_abs_diff(const float *a, const float *b, size_t n);

#endif
