/* sink.h - where commands' output goes. A command never prints: it emits events, and each front end gives
 * the app a sink that shows them its way (the line front end: stdout for results, stderr for notices, errors
 * and progress lines redrawn in place; the TUI: its panels). Runtime events (servers, routes, retries) arrive
 * the same way. A sink may be called from any thread (the runtime's included) and must not block for long. */
#ifndef SEPAL_SINK_H
#define SEPAL_SINK_H

#include "generate.h"
#include "runtime.h"
#include "trainer.h"

typedef enum sp_ui_kind {
    SP_UI_TEXT,       /* text: command output (results, tables); may hold several lines */
    SP_UI_NOTICE,     /* text: something worth knowing (dim) */
    SP_UI_WARN,       /* text: a warning */
    SP_UI_ERROR,      /* text: an error (where, if any, is the script position) */
    SP_UI_PROGRESS,   /* what, done, total, unit: long work going on (rate and ETA are the sink's to show) */
    SP_UI_PROGRESS_END, /* what: that work ended */
    SP_UI_GEN_BEGIN,  /* text: the prompt as the user typed it (NULL: ids) */
    SP_UI_GEN_TEXT,   /* text: the next piece of the continuation */
    SP_UI_GEN_END,    /* gen: the result's figures; text: extra (the seed) */
    SP_UI_TRAIN,      /* train: a step, an epoch's metrics, or validation progress */
    SP_UI_TRAIN_BEGIN,/* text: what is trained ("sst2 deep_ptune, 375 steps") */
    SP_UI_TRAIN_END,  /* text: how it ended */
    SP_UI_RUNTIME,    /* rt: an event of the client runtime */
    SP_UI_LINE,       /* text: a script's line about to run (where: "FILE:LINE"); not for comments or blank lines */
    SP_UI_SERVE,      /* serve: the endpoint's requests now (twice a second while `serve` runs, and when it stops) */
    SP_UI_PLOT,       /* plot: runs' curves of one metric to draw (`plot`): the line front end as text, the TUI in
                         its training panel */
} sp_ui_kind;

/* The figures of a finished generation. */
typedef struct sp_ui_gen {
    int prompt_tokens, new_tokens;
    double prefill_s, decode_s, first_token_s;
    sp_gen_stop stop;
    unsigned long long seed;
    int sampled; /* the seed matters */
} sp_ui_gen;

/* The OpenAI endpoint's requests (`serve`): those generating or waiting, the rates, the totals. */
#define SP_UI_SERVE_ROWS 8
typedef struct sp_ui_serve_req {
    long id;
    int chat, stream, waiting;   /* /v1/chat/completions; streamed; waiting for its turn */
    int prompt_tokens, new_tokens;
    double secs;                 /* since it came */
} sp_ui_serve_req;

typedef struct sp_ui_serve {
    const char *url;             /* "http://127.0.0.1:8080/v1" */
    int active, waiting;         /* generating, waiting for a turn */
    int nreq;                    /* rows in req (the oldest SP_UI_SERVE_ROWS requests in progress) */
    sp_ui_serve_req req[SP_UI_SERVE_ROWS];
    long served, failed;         /* requests answered so far, and of them with an error */
    double tokens_per_s;         /* new tokens of all requests per second, over the last half second */
    const char *last_error;      /* "#9 POST /v1/completions 400: 'temperature' must be ..." or NULL */
    int stopped;                 /* serving has ended */
} sp_ui_serve;

/* Runs' curves of one metric (`plot FILE...`): each run's (x, y) points, x the step. */
typedef struct sp_ui_run {
    const char *name;            /* the file's name */
    int n;
    const double *x, *y;
} sp_ui_run;

typedef struct sp_ui_plot {
    const char *metric;          /* "loss", "lr", "grad_norm", "tokens_per_s", or a validation metric */
    int nruns;
    const sp_ui_run *runs;
    int width, height;           /* the text plot's size (the line front end) */
} sp_ui_plot;

typedef struct sp_ui_event {
    sp_ui_kind kind;
    const char *text;
    const char *what, *unit;
    double done, total;
    const char *where;          /* SP_UI_ERROR: "FILE:LINE" of a script, or NULL */
    const sp_ui_gen *gen;
    const sp_train_event *train;
    const sp_event *rt;
    const sp_ui_serve *serve;
    const sp_ui_plot *plot;
} sp_ui_event;

typedef struct sp_sink {
    void (*emit)(void *user, const sp_ui_event *ev);
    void *user;
    /* The columns a table's lines must fit where the output is shown, asked at each table (a terminal may be
     * resized); 0: no limit. NULL: the app's width (sp_app_columns). */
    int (*columns)(void *user);
} sp_sink;

#endif
