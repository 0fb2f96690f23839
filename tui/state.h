/* state.h - what the UI knows, built only from events (events.h): the model, the swarm's latest snapshot, the
 * route with its hops' timings and a list of what happened to it, the generation's text and figures, the
 * training's curves, progress bars, the log and the command in progress. Rates (tokens/s, steps/s, ETA) come
 * from the events' own times, so nothing here needs a clock or a timer. No curses: the tests feed it events. */
#ifndef SEPAL_TUI_STATE_H
#define SEPAL_TUI_STATE_H

#include <stddef.h>

#include "events.h"
#include "layout.h"

/* What an event changed, for the redraw: one bit per panel, then the header, command and status rows. */
#define TUI_D_PANEL(p) (1u << (p))
#define TUI_D_HEADER (1u << TUI_NPANELS)
#define TUI_D_CMD (1u << (TUI_NPANELS + 1))
#define TUI_D_STATUS (1u << (TUI_NPANELS + 2))
#define TUI_D_ALL (TUI_D_STATUS * 2 - 1)

#define TUI_MAX_HOPS 64
#define TUI_ROUTE_NOTES 32
#define TUI_SPARK 240
#define TUI_PROGRESS 4
#define TUI_PLOT_RUNS 8

typedef struct tui_series {
    double *x, *y;
    int n, cap;
} tui_series;

typedef struct tui_logline {
    double t;
    int level;
    char *text;
} tui_logline;

typedef struct tui_note {
    double t;
    int kind;  /* 0 route, 1 re-route, 2 retry / ban */
    char text[240];
} tui_note;

typedef struct tui_bar {
    char what[96], unit[24];
    double done, total, t0, t, done0;
    int active;
} tui_bar;

typedef struct tui_state {
    /* the model (TE_APP) */
    char model[96], arch[64];
    int nblocks, hidden, vocab;
    /* the swarm (TE_SWARM) */
    tui_swarm *swarm;
    /* the route (TE_ROUTE, TE_HOPS, TE_RETRY) */
    int nhops;
    tui_hop hops[TUI_MAX_HOPS];
    double measured[TUI_MAX_HOPS]; /* s of each hop in the last step, -1 unknown */
    double route_cost;
    int route_seen;
    tui_note notes[TUI_ROUTE_NOTES];
    int nnotes;                    /* in all; the last TUI_ROUTE_NOTES are kept (a ring) */
    int retries, reroutes;
    double retry_at;               /* sp_now_s() of the next try a retry waits for (0: none): a countdown */
    /* the generation */
    char *gen;
    size_t gen_len, gen_cap, gen_mark; /* the text; bytes before gen_mark are the prompt */
    int gen_active, gen_count, gen_tokens;
    double gen_t0, gen_first_t, gen_last_t, gen_tps;
    double spark[TUI_SPARK];       /* tokens in each second of the generation */
    int spark_n;
    char gen_stop[32];
    int gen_new, gen_prompt;
    double gen_prefill_s, gen_decode_s, gen_ttft;
    /* the training */
    char train_what[240], train_end[240];
    int train_active, train_runs, epoch, step, total, steps_seen;
    double loss, lr, tokens_s, step_rate, eta_s, last_step_t;
    tui_series loss_s, val_s;
    char val_name[32];
    double val_last;
    /* `serve` (TE_SERVE): 0 never, 1 serving, 2 stopped; its figures and a line per request in progress */
    int serving, serve_active, serve_waiting;
    long serve_served, serve_failed;
    double serve_tps;
    char serve_url[128], serve_error[240];
    char *serve_reqs;
    /* `plot` (TE_PLOT): runs' curves of one metric, shown in the training panel until a training starts */
    int plot_n;
    char plot_metric[32], plot_name[TUI_PLOT_RUNS][64];
    tui_series plot_s[TUI_PLOT_RUNS];
    /* progress bars */
    tui_bar bars[TUI_PROGRESS];
    /* the log: a ring of TUI_LOG_LINES */
    tui_logline *log;
    int log_n, log_head;
    long log_total, log_dropped;
    char *out_partial;             /* command output not yet ended by a newline */
    /* the command */
    int cmd_running;
    char cmd_line[240];
    int cmd_rc, cmd_cancelled, cmds_done;
    double cmd_t0;
    int queued;                    /* commands waiting for the one running (typed at `:` meanwhile) */
    char queue_first[240];         /* the first of them */
    int quit;
    /* the latest warning or error, for the status row */
    char toast[240];
    int toast_level;
    double toast_t;
} tui_state;

#define TUI_LOG_LINES 2000

int tui_state_init(tui_state *st);
void tui_state_free(tui_state *st);
/* Applies one event; returns what it changed (TUI_D_*). */
unsigned tui_state_apply(tui_state *st, const tui_ev *e);
/* The commands waiting to run: how many, and the first (the UI thread looks at its job queue; not an event,
 * since a replay has no queue). Returns TUI_D_CMD if that changed, else 0. */
unsigned tui_state_queue(tui_state *st, int n, const char *first);
/* Notes dropped events (the queue's count). */
unsigned tui_state_dropped(tui_state *st, long n);
/* Log line i of the ring, 0 the oldest kept. */
const tui_logline *tui_state_log(const tui_state *st, int i);
/* The validation metric in a metrics string ("accuracy=0.81 loss=0.4 n=128"): accuracy if there, else the first
 * value; its name into name. 0, or -1 if there is none. */
int tui_metric_pick(const char *metrics, char *name, size_t cap, double *value);

#endif
