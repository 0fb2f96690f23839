/* span.c - span.h's share common to both builds: the device's name (--device's parse: common/device.c). The device itself is
 * dev/span_cuda.c (a build with CUDA) or dev/span_none.c (without). */
#include "span.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *span_device(const sp_server *s) { return s->dev ? s->device_name : "cpu"; }
