/* device.h - the device names every program takes (sepal-server --device, the client's device setting, train
 * --device): "cpu", "cuda" (the first GPU) or "cuda:N" (N < 1024, digits only). Parsing alone: whether the GPU
 * exists is the CUDA side's question. */
#ifndef SEPAL_DEVICE_H
#define SEPAL_DEVICE_H

#include "status.h"

/* "cpu" -> *gpu = -1, "cuda" -> 0, "cuda:N" -> N; SP_ERR_ARG "expected cpu, cuda or cuda:N (N: a GPU's index, 0
 * the first), got 'V'" otherwise (*gpu untouched). */
sp_status sp_device_parse(const char *v, int *gpu, sp_err *err);

#endif
