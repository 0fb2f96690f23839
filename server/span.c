/* span.c - span.h's share common to both builds: --device's parse and the device's name. The device itself is
 * dev/span_cuda.c (a build with CUDA) or dev/span_none.c (without). */
#include "span.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

sp_status sp_device_parse(const char *v, int *gpu, sp_err *err)
{
    char *end = NULL;
    if (!strcmp(v, "cpu"))
        return *gpu = -1, SP_OK;
    if (!strcmp(v, "cuda"))
        return *gpu = 0, SP_OK;
    if (!strncmp(v, "cuda:", 5) && v[5] >= '0' && v[5] <= '9') {
        long n = strtol(v + 5, &end, 10);
        if (!*end && n < 1024)
            return *gpu = (int)n, SP_OK;
    }
    return sp_errf(err, SP_ERR_ARG, "expected cpu, cuda or cuda:N (N: a GPU's index, 0 the first), got '%s'", v);
}

const char *span_device(const sp_server *s) { return s->dev ? s->device_name : "cpu"; }
