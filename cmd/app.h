/* app.h - the state behind every `sepal` front end: the client runtime (model, swarm), the settings that
 * `set` changes, the output sink, and the cancel flag that Ctrl-C raises. Commands act on it. */
#ifndef SEPAL_APP_H
#define SEPAL_APP_H

#include <stdarg.h>
#include <stddef.h>

#include "cmd.h"
#include "settings.h"
#include "sink.h"

/* What `serve` asks for (cmd_serve.c fills it from its options); the HTTP front end (serve/) runs it. */
typedef struct sp_serve_opts {
    char host[256];      /* the address to listen on */
    int port;            /* 0: a free port */
    char api_key[512];   /* the bearer token every request must carry ("": none) */
    int parallel;        /* generations at once; more wait for their turn */
} sp_serve_opts;

struct sp_app {
    int quit;          /* set by `quit` */
    int interactive;   /* 1 in the REPL and the TUI, 0 for -c / -f / piped stdin */
    int quiet;         /* --quiet: no progress lines or notices */
    char set[SP_SET_N][512]; /* the settings' values (settings.h), checked against their rows */
    struct sp_runtime *rt; /* the client runtime (sp_app_runtime creates it) */
    char where[256];   /* "FILE:LINE" while a script line runs, else "" */
    int nerrors;       /* errors reported so far */
    sp_sink sink;
    int cancel;        /* sp_app_cancel: the command in progress stops (atomic) */
    int width;         /* columns for help text (0: 100) */
    int dry_run;       /* --dry-run: commands and their options are checked, not run */
    int keep_going;    /* -k: scripts go on after a failed command (the exit status still says it failed) */
    int failed;        /* commands that failed under keep_going */
    /* the HTTP front end that `serve` runs until Ctrl-C (the program sets it: serve/serve.h); NULL: none */
    int (*serve)(sp_app *app, const sp_serve_opts *o);
};

void sp_app_init(sp_app *app, sp_sink sink);
void sp_app_free(sp_app *app);

/* The runtime, created on first use with the current settings applied (NULL after an error message). */
struct sp_runtime *sp_app_runtime(sp_app *app);

/* Cancellation: async-signal-safe; the command in progress (and the runtime's waits) stop soon. Cleared
 * before each command. */
void sp_app_cancel(sp_app *app);
void sp_app_cancel_clear(sp_app *app);
int sp_app_cancelled(const sp_app *app);

/* Output, through the sink. */
void sp_emit(sp_app *app, const sp_ui_event *ev);
/* Text of a kind (SP_UI_TEXT, _NOTICE, _WARN, _ERROR), printf-style; an error carries the script position, if
 * any, and is counted (nerrors). Returns 1, so that handlers can `return sp_app_error(...)`. */
int sp_emitf(sp_app *app, sp_ui_kind kind, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#define sp_out(app, ...) sp_emitf((app), SP_UI_TEXT, __VA_ARGS__)
#define sp_note(app, ...) sp_emitf((app), SP_UI_NOTICE, __VA_ARGS__)
#define sp_warn(app, ...) sp_emitf((app), SP_UI_WARN, __VA_ARGS__)
#define sp_app_error(app, ...) sp_emitf((app), SP_UI_ERROR, __VA_ARGS__)
void sp_progress(sp_app *app, const char *what, double done, double total, const char *unit);
/* The columns a table's lines must fit (0: no limit): the sink's answer (the line front end: the terminal's when
 * stdout is one), else app->width (the TUI sets it to its log's). */
int sp_app_columns(const sp_app *app);
void sp_progress_end(sp_app *app, const char *what);

/* Settings (settings.h): the one that name (a unique prefix) names, or -1 with why ("unknown setting 'x' (did
 * you mean ...?; `show` lists them)", "ambiguous setting 'se': seed, stop"). */
int sp_app_setting(const sp_app *app, const char *name, char *why, size_t cap);
/* A setting's value (a number: 0 when it is none). */
const char *sp_app_get(const sp_app *app, sp_set k);
double sp_app_num(const sp_app *app, sp_set k);
/* Checks value against the setting's row and sets it: 0, or -1 with why ("top-p: expected a number in (0, 1],
 * got '2'"); why may be NULL. */
int sp_app_set(sp_app *app, sp_set k, const char *value, char *why, size_t cap);

#endif
