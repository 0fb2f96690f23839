/* tui_impl.h - what tui.c (the UI thread: loop, frames, keys) and tui_feed.c (the producers: the sink, the
 * command worker, the swarm feeder, the replay) share. Not a public header. */
#ifndef SEPAL_TUI_IMPL_H
#define SEPAL_TUI_IMPL_H

#include <pthread.h>
#include <stdio.h>

#include "cmdline.h"
#include "crt.h"
#include "events.h"
#include "layout.h"
#include "panels.h"
#include "state.h"
#include "tui.h"

#define FRAME_S (1.0 / 30)     /* at most 30 frames a second */
#define FLASH_S 3.0            /* how long the UI's own messages stay */
#define GONE_KEEP_S 30.0       /* a server that left stays in the table (offline) this long */
#define QUEUE_CAP 4096

enum { M_NORMAL, M_CMD, M_HELP, M_CONFIRM };

typedef struct job {
    int kind;    /* 0 a line, 1 a script file, 2 the end of the start-up scripts */
    int startup; /* a -c / -f of the command line: a failure skips the others (as without the TUI) */
    char *arg;
    struct job *next;
} job;

typedef struct tui {
    sp_app *app;
    sp_sink saved_sink;
    tui_queue q;
    tui_state st;
    tui_view v;
    tui_cmdline cl;
    tui_crt crt;
    tui_layout lay;
    int lay_valid;
    tui_cb pcb[TUI_NPANELS], hdr, cmdrow, status, overlay;
    unsigned dirty, held;      /* to draw; held while paused */
    int mode, help_first, nhelp;
    char **help;
    int test;
    long frames, wakes;
    double frame_s_sum, frame_s_max, next_frame;
    char flash[160];
    double flash_until, last_intr;
    int countdown_shown;   /* the seconds the route panel's retry countdown showed last */
    int intr_while_busy;
    int quit, exit_code;
    /* the worker */
    pthread_t worker;
    int worker_on;
    pthread_mutex_t jlock;
    pthread_cond_t jcond;
    job *jobs, *jtail;
    int jstop, queued;
    volatile int busy;         /* a command runs (read by the SIGINT handler) */
    int width;                 /* columns for help text, set by the UI */
    /* the feeder */
    pthread_t feeder;
    int feeder_on;
    pthread_mutex_t flock;
    pthread_cond_t fcond;
    int fstop, fkick;
    tui_swarm *last;
    double *gone_since;
    int ngone;
    /* recording, replay */
    FILE *rec;
    double t0;
    pthread_t replayer;
    int replay_on, rstop;
    FILE *replay;
    double replay_speed;
    char *history_path;
} tui;

/* The sink of the app while the TUI runs (any thread); after tui_close_sink it posts nothing. */
void tui_emit(void *user, const sp_ui_event *ev);
void tui_open_sink(void);
void tui_close_sink(void);
/* A log line from the UI's own threads. */
void tui_post_log(tui *t, int level, const char *text);
/* Queues a command for the worker: kind 0 a line, 1 a script file, 2 the end of the start-up scripts. */
void tui_submit(tui *t, int kind, int startup, const char *arg);
/* Drops the commands queued (all but the end of the start-up scripts) and says so in the log, naming them;
 * returns how many. Ctrl-C does it: the UI thread at once, the worker after the command it stopped. */
int tui_clear_queue(tui *t);
/* How many commands wait to run; the first into first ("-f FILE" for a script). */
int tui_queue_peek(tui *t, char *first, size_t cap);
/* The threads' bodies. */
void *tui_worker_main(void *arg);
void *tui_feeder_main(void *arg);
void *tui_replay_main(void *arg);
/* The SIGINT handler's part: cancels the command running (async-signal-safe). */
void tui_on_sigint(void);
extern tui *tui_g;

#endif
