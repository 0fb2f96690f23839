/* kept.h - the choice kept.c makes for a FORWARD that asks to keep what its BACKWARD needs (meta "keep"): a pure
 * function of the server's cap, where the span runs and the device budget's room (rpc.c's plan_keep asks it). */
#ifndef SEPAL_SERVER_KEPT_H
#define SEPAL_SERVER_KEPT_H

#include <stddef.h>

typedef enum { KEEP_NONE, KEEP_INPUTS, KEEP_ACTS, KEEP_DEVICE } kept_where;

/* cap: the server's keep_bytes; acts_bytes: the entry's size with every activation (a GPU server's: its device
 * bytes, span.h's span_dev_kept_bytes). Nothing when cap is 0; the activations too when they take at most a quarter
 * of cap, on the host (KEEP_ACTS) or on the GPU (KEEP_DEVICE) where dev_room, the device budget's room, holds
 * them; else the inputs alone, on the host (KEEP_INPUTS). */
kept_where kept_plan(size_t cap, int on_device, size_t acts_bytes, size_t dev_room);

#endif
