#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sp_test_run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

double sp_max_abs_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > m || isnan(d))
            m = isnan(d) ? INFINITY : d;
    }
    return m;
}

const char *sp_test_tmpdir(void)
{
    static char dirs[8][256];
    static int next;
    char *d = dirs[next++ % 8];
    const char *base = getenv("TMPDIR");
    snprintf(d, 256, "%s/sepal-test-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(d))
        return NULL;
    return d;
}

const char *sp_test_write_file(const char *name, const void *data, size_t n)
{
    static char paths[8][512];
    static int next;
    const char *dir = sp_test_tmpdir();
    if (!dir)
        return NULL;
    char *p = paths[next++ % 8];
    snprintf(p, 512, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f)
        return NULL;
    if (n && fwrite(data, 1, n, f) != n) {
        fclose(f);
        return NULL;
    }
    fclose(f);
    return p;
}
