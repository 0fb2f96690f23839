/* app.c - the application state: settings (the defaults of generate and swarm) and error reporting. */
#include "app.h"
#include "runtime.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sp_app_init(sp_app *app)
{
    memset(app, 0, sizeof *app);
    sp_app_define(app, "max-new-tokens", SP_SET_INT, 0, 1e6, "64", "tokens that generate adds at most");
    sp_app_define(app, "temperature", SP_SET_NUM, 0, 100, "0", "sampling temperature; 0 is greedy");
    sp_app_define(app, "top-k", SP_SET_INT, 0, 1e9, "0", "sample among the k likeliest tokens; 0 is off");
    sp_app_define(app, "top-p", SP_SET_NUM, 0, 1, "1", "nucleus sampling: smallest set of probability p; 1 is off");
    sp_app_define(app, "repetition-penalty", SP_SET_NUM, 0.01, 100, "1",
                  "divide the logits of tokens seen already; 1 is off");
    sp_app_define(app, "seed", SP_SET_INT, 0, 9.2e18, "0", "random seed of sampling");
    sp_app_define(app, "beams", SP_SET_INT, 1, 64, "1", "beam search width; 1 is no beam search");
    sp_app_define(app, "stop", SP_SET_STR, 0, 0, "", "generation stops after this text; empty is off");
    sp_app_define(app, "blocks-per-server", SP_SET_INT, 0, 1e6, "0",
                  "blocks each server of `swarm up` holds; 0 is an even split");
    sp_app_define(app, "max-retries", SP_SET_INT, 0, 1000, "8",
                  "retries of a request after a server fails (each on another route)");
    sp_app_define(app, "step-timeout", SP_SET_NUM, 0, 86400, "0",
                  "seconds a server may take for one request before it counts as failed; 0 derives it from the "
                  "server's announced speed (a few seconds for a decode step)");
    sp_app_define(app, "allowed-servers", SP_SET_STR, 0, 0, "",
                  "route only through these servers (ids, id prefixes, names or HOST:PORT, comma-separated)");
    sp_app_define(app, "blocked-servers", SP_SET_STR, 0, 0, "", "never route through these servers (same forms)");
    sp_app_define(app, "swarm-key", SP_SET_STR, 0, 0, "",
                  "a private swarm's key file (sepal-server --gen-swarm-key FILE): connections prove it both ways and "
                  "DHT records without its tag are dropped; empty is none");
}

void sp_app_free(sp_app *app)
{
    sp_runtime_free(app->rt); /* stops a swarm it started, closes connections, frees the local parts */
    app->rt = NULL;
}

int sp_app_error(sp_app *app, const char *fmt, ...)
{
    fflush(stdout); /* keep the order of output and messages when both go to one pipe */
    fputs("sepal: ", stderr);
    if (app->where[0])
        fprintf(stderr, "%s: ", app->where);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    app->nerrors++;
    return 1;
}

static const sp_setting *find(const sp_app *app, const char *name)
{
    for (int i = 0; i < app->nsettings; i++)
        if (!strcmp(app->settings[i].name, name))
            return &app->settings[i];
    return NULL;
}

const char *sp_app_get(const sp_app *app, const char *name)
{
    const sp_setting *s = find(app, name);
    return s ? s->value : NULL;
}

/* Parses a number of the setting's kind: 0, or -1 if value is not one. */
static int parse_number(const sp_setting *s, const char *value, double *out)
{
    char *end;
    errno = 0;
    if (s->kind == SP_SET_INT) {
        long long v = strtoll(value, &end, 10);
        *out = (double)v;
    } else {
        *out = strtod(value, &end);
    }
    return errno || end == value || *end || !isfinite(*out) ? -1 : 0;
}

static int check_value(const sp_setting *s, const char *value, char *why, size_t cap)
{
    if (strlen(value) >= sizeof s->value) {
        snprintf(why, cap, "%s: value too long (at most %zu bytes)", s->name, sizeof s->value - 1);
        return -2;
    }
    if (s->kind == SP_SET_STR)
        return 0;
    double v;
    const char *what = s->kind == SP_SET_INT ? "an integer" : "a number";
    if (parse_number(s, value, &v) || v < s->min || v > s->max) {
        snprintf(why, cap, "%s: expected %s in [%g, %g], got '%s'", s->name, what, s->min, s->max, value);
        return -2;
    }
    return 0;
}

int sp_app_check(const sp_app *app, const char *name, const char *value, char *why, size_t cap)
{
    const sp_setting *s = find(app, name);
    if (!s) {
        snprintf(why, cap, "unknown setting '%s' (try 'show')", name);
        return -1;
    }
    return check_value(s, value, why, cap);
}

int sp_app_set(sp_app *app, const char *name, const char *value)
{
    char why[256];
    int rc = sp_app_check(app, name, value, why, sizeof why);
    if (rc)
        return rc;
    sp_setting *s = (sp_setting *)find(app, name);
    snprintf(s->value, sizeof s->value, "%s", value);
    return 0;
}

double sp_app_num(const sp_app *app, const char *name)
{
    const sp_setting *s = find(app, name);
    double v;
    if (!s || s->kind == SP_SET_STR || parse_number(s, s->value, &v))
        return NAN;
    return v;
}

int sp_app_define(sp_app *app, const char *name, sp_setting_kind kind, double min, double max,
                  const char *def, const char *help)
{
    if (app->nsettings >= SP_APP_MAX_SETTINGS || find(app, name))
        return -1;
    sp_setting *s = &app->settings[app->nsettings];
    *s = (sp_setting){.name = name, .help = help, .kind = kind, .min = min, .max = max};
    char why[256];
    if (check_value(s, def, why, sizeof why))
        return -1;
    snprintf(s->value, sizeof s->value, "%s", def);
    app->nsettings++;
    return 0;
}
