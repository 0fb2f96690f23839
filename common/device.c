/* device.c - see device.h. */
#include "device.h"

#include <stdlib.h>
#include <string.h>

sp_status sp_device_parse(const char *v, int *gpu, sp_err *err)
{
    char *end = NULL;
    if (v && !strcmp(v, "cpu"))
        return *gpu = -1, SP_OK;
    if (v && !strcmp(v, "cuda"))
        return *gpu = 0, SP_OK;
    if (v && !strncmp(v, "cuda:", 5) && v[5] >= '0' && v[5] <= '9') {
        long n = strtol(v + 5, &end, 10);
        if (!*end && n < 1024)
            return *gpu = (int)n, SP_OK;
    }
    return sp_errf(err, SP_ERR_ARG, "expected cpu, cuda or cuda:N (N: a GPU's index, 0 the first), got '%s'",
                   v ? v : "");
}
