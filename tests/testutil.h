/* testutil.h - helpers shared by the Check suites. */
#ifndef SEPAL_TESTUTIL_H
#define SEPAL_TESTUTIL_H

#include <check.h>
#include <stddef.h>

/* Runs one suite and returns the process exit status (non-zero on any failure). */
int sp_test_run(Suite *s);
/* max |a - b| over n elements. */
double sp_max_abs_diff(const float *a, const float *b, size_t n);
/* Writes `n` bytes to a fresh file under a per-test temp dir; returns its path (static buffer rotation). */
const char *sp_test_write_file(const char *name, const void *data, size_t n);
/* A fresh temporary directory (mkdtemp under $TMPDIR or /tmp). */
const char *sp_test_tmpdir(void);

#endif
