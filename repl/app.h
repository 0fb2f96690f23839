/* app.h - the state behind the `sepal` front ends: the loaded model, the swarm, the defaults that `set`
 * changes. Commands act on it; the runtime reports through its events. */
#ifndef SEPAL_APP_H
#define SEPAL_APP_H

#include <stdarg.h>
#include <stddef.h>

#include "cmd.h"

#define SP_APP_MAX_SETTINGS 64

/* What a setting holds: `set` refuses a value that is not of its kind or outside [min, max]. */
typedef enum sp_setting_kind { SP_SET_STR, SP_SET_INT, SP_SET_NUM } sp_setting_kind;

typedef struct sp_setting {
    const char *name;  /* "max-new-tokens" */
    char value[512];
    const char *help;
    sp_setting_kind kind;
    double min, max;   /* for SP_SET_INT / SP_SET_NUM */
} sp_setting;

struct sp_app {
    int quit;          /* set by `quit` */
    int interactive;   /* 1 in the REPL, 0 for -c / -f / piped stdin */
    sp_setting settings[SP_APP_MAX_SETTINGS];
    int nsettings;
    struct sp_runtime *rt; /* client runtime state (model, swarm, chain): runtime.h */
    char where[256];   /* "FILE:LINE" while a script line runs (sp_app_error prefixes it), else "" */
    int nerrors;       /* messages printed by sp_app_error so far */
};

void sp_app_init(sp_app *app);
void sp_app_free(sp_app *app);
/* Prints "sepal: <message>" to stderr. Returns 1 so handlers can `return sp_app_error(...)`. */
int sp_app_error(sp_app *app, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Settings (defaults of generate etc.): NULL if unknown. */
const char *sp_app_get(const sp_app *app, const char *name);
int sp_app_set(sp_app *app, const char *name, const char *value); /* 0, or -1 unknown name, -2 bad value */
/* Checks a value for a setting without changing it: 0, -1 unknown name, -2 bad value; why says what is wrong. */
int sp_app_check(const sp_app *app, const char *name, const char *value, char *why, size_t cap);
/* A numeric setting's value (NAN if unknown or not a number): sp_app_num(app, "temperature"). */
double sp_app_num(const sp_app *app, const char *name);
/* Registers a setting (sp_app_init registers the defaults; front ends may add more). 0, or -1 if the
 * table is full, the name exists or the default is not valid. */
int sp_app_define(sp_app *app, const char *name, sp_setting_kind kind, double min, double max,
                  const char *def, const char *help);

#endif
