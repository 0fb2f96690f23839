/* settings.h - the settings that `set` changes and `show` lists: rows of an option table (common/opt.h), so
 * each has its kind, range and default once, and the commands' options whose default a setting gives take
 * their kind and range from its row (SP_SETTING). Code names a setting by its enum. */
#ifndef SEPAL_SETTINGS_H
#define SEPAL_SETTINGS_H

#include "opt.h"

typedef enum sp_set {
    SP_SET_MAX_NEW_TOKENS,
    SP_SET_TEMPERATURE,
    SP_SET_TOP_K,
    SP_SET_TOP_P,
    SP_SET_REPETITION_PENALTY,
    SP_SET_SEED,
    SP_SET_BEAMS,
    SP_SET_MIN_NEW_TOKENS,
    SP_SET_IGNORE_EOS,
    SP_SET_STOP,
    SP_SET_BLOCKS_PER_SERVER,
    SP_SET_MAX_RETRIES,
    SP_SET_STEP_TIMEOUT,
    SP_SET_PUSH,
    SP_SET_WIRE,
    SP_SET_ALLOWED_SERVERS,
    SP_SET_BLOCKED_SERVERS,
    SP_SET_THREADS,
    SP_SET_DTYPE,
    SP_SET_SWARM_KEY,
    SP_SET_DEVICE,
    SP_SET_N
} sp_set;

/* The rows, in the order `show` lists them; sp_settings[SP_SET_N] is the {NULL} end. */
extern const sp_opt sp_settings[SP_SET_N + 1];

/* In a command's option row: its default is setting k's current value; its kind, range and choices are k's. */
#define SP_SETTING(k) .like = &sp_settings[k], .live = 1
/* In a command's option row: kind, range, choices and default are setting k's (its current value is not). */
#define SP_LIKE(k) .like = &sp_settings[k]

/* The setting whose row is o (o->like of an option), or -1. */
int sp_setting_of(const sp_opt *o);

/* A value of the device setting other than "auto" ("cpu", "cuda", "cuda:N"): 0, or -1 and why ("device cuda: no
 * usable GPU: ..."): a GPU that cannot run is refused when it is set. */
int sp_app_device_check(const char *value, char *why, size_t cap);

#endif
