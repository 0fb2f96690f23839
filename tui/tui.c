/* tui.c - the TUI's UI thread: the loop (input, events, frames), drawing, keys, start and stop. What feeds it
 * is in tui_feed.c. */
#define NCURSES_WIDECHAR 1
#include "tui.h"

#include <curses.h>
#include <errno.h>
#include <locale.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "keys.h"
#include "paths.h"
#include "timeutil.h"
#include "tui_impl.h"
#include "widgets.h"

/* Each panel's drawing (panels.h), by TUI_P_*. */
static void (*const draw_panel[TUI_NPANELS])(tui_cb *cb, const tui_state *st, tui_view *v, int focused) = {
    [TUI_P_SWARM] = tui_draw_swarm, [TUI_P_ROUTE] = tui_draw_route, [TUI_P_GEN] = tui_draw_gen,
    [TUI_P_TRAIN] = tui_draw_train, [TUI_P_LOG] = tui_draw_log,
};

/* ---------------------------------------------------------------------------------------------- */
/* drawing */

static void say(tui *t, const char *msg)
{
    snprintf(t->flash, sizeof t->flash, "%s", msg);
    t->flash_until = sp_now_s() + FLASH_S;
    t->dirty |= TUI_D_STATUS;
}

static void relayout(tui *t)
{
    tui_layout_opts o = {.zoom = t->v.zoom, .focus = t->v.focus,
                         .swarm_rows = t->st.swarm ? t->st.swarm->n : 0};
    tui_layout l;
    tui_layout_compute(t->crt.rows, t->crt.cols, &o, &l);
    if (!t->lay_valid || memcmp(&l, &t->lay, sizeof l)) {
        t->lay = l;
        t->lay_valid = 1;
        erase();
        t->dirty = TUI_D_ALL;
    }
    int w = l.panel[TUI_P_LOG].w ? l.panel[TUI_P_LOG].w : l.cols;
    __atomic_store_n(&t->width, w > 40 ? w - 1 : 40, __ATOMIC_SEQ_CST);
}

static const char *mode_name(int m)
{
    static const char *const names[] = {"NORMAL", "COMMAND", "HELP", "QUIT?"};
    return names[m];
}

/* The `:` line in a row of cb: the text scrolled so that the cursor shows; returns the cursor's column. */
static int draw_cmdline(tui *t, tui_cb *cb, int y)
{
    const tui_cmdline *c = &t->cl;
    tui_cb_fill(cb, y, 0, 1, cb->w, ' ', R_TEXT, 0);
    tui_cb_put(cb, y, 0, ':', R_PROMPT, TUI_BOLD);
    char before[TUI_CMDLINE_MAX];
    snprintf(before, sizeof before, "%.*s", (int)c->cur, c->buf);
    int room = cb->w - 2, cw = tui_strwidth(before);
    const char *from = c->buf;
    while (cw > room - 1 && *from) { /* scroll: drop characters from the left */
        uint32_t cp;
        int k = tui_utf8_decode(from, strlen(from), &cp);
        int w = tui_cpwidth(cp);
        cw -= w < 0 ? 1 : w;
        from += k;
    }
    int used = tui_cb_text(cb, y, 1, room, from, R_TEXT, 0);
    if (c->msg[0] && 1 + used + 3 < cb->w)
        tui_cb_text(cb, y, 1 + used + 2, cb->w - used - 3, c->msg, R_DIM, 0);
    return 1 + cw;
}

static void draw_vdiv(tui *t)
{
    const tui_rect *r = &t->lay.vdiv;
    if (!r->h)
        return;
    tui_cb col = {.utf8 = t->crt.utf8};
    if (tui_cb_resize(&col, r->h, 1))
        return;
    const tui_glyphs *g = tui_cb_glyphs(&col);
    tui_cb_fill(&col, 1, 0, r->h - 1, 1, g->v, R_BORDER, 0);
    tui_cb_put(&col, 0, 0, g->ttee, R_BORDER, 0);
    tui_crt_blit(&t->crt, &col, r->y, r->x);
    tui_cb_free(&col);
}

static void draw_overlay(tui *t)
{
    tui_cb *o = &t->overlay;
    if (tui_cb_resize(o, t->crt.rows, t->crt.cols))
        return;
    tui_rect r;
    if (t->mode == M_HELP) {
        int page = t->crt.rows - 4 > 1 ? t->crt.rows - 4 : 1;
        if (t->help_first > t->nhelp - page)
            t->help_first = t->nhelp - page > 0 ? t->nhelp - page : 0;
        if (t->help_first < 0)
            t->help_first = 0;
        char foot[64];
        snprintf(foot, sizeof foot, " %d-%d of %d  Esc closes  j/k scroll ", t->help_first + 1,
                 t->help_first + page < t->nhelp ? t->help_first + page : t->nhelp, t->nhelp);
        r = tui_draw_box(o, "sepal keys", (const char *const *)t->help, t->nhelp, t->help_first, foot);
    } else {
        r = tui_draw_confirm(o, t->st.cmd_line);
    }
    tui_crt_blit_part(&t->crt, o, r.y, r.x, r.h, r.w);
}

static void frame(tui *t)
{
    double t0 = sp_now_s();
    relayout(t);
    const tui_layout *l = &t->lay;
    unsigned d = t->dirty;
    if (t->v.paused) { /* only the status and command rows; the rest waits */
        t->held |= d & ~(TUI_D_STATUS | TUI_D_CMD);
        d &= TUI_D_STATUS | TUI_D_CMD;
    }
    int cy = -1, cx = -1;
    if (l->tier == TUI_TIER_SMALL) {
        erase();
        tui_cb m = {.utf8 = t->crt.utf8};
        if (l->message.h > 0 && !tui_cb_resize(&m, l->message.h, l->message.w)) {
            tui_draw_too_small(&m, l->rows, l->cols);
            tui_crt_blit(&t->crt, &m, l->message.y, l->message.x);
        }
        tui_cb_free(&m);
        d |= TUI_D_STATUS;
    } else {
        for (int p = 0; p < TUI_NPANELS; p++) {
            const tui_rect *r = &l->panel[p];
            if (!r->h || !(d & TUI_D_PANEL(p)))
                continue;
            if (tui_cb_resize(&t->pcb[p], r->h, r->w))
                continue;
            t->pcb[p].utf8 = t->crt.utf8;
            int focused = p == (t->v.zoom >= 0 ? t->v.zoom : t->v.focus);
            draw_panel[p](&t->pcb[p], &t->st, &t->v, focused);
            tui_crt_blit(&t->crt, &t->pcb[p], r->y, r->x);
        }
        if (d == TUI_D_ALL)
            draw_vdiv(t);
        if ((d & TUI_D_HEADER) && !tui_cb_resize(&t->hdr, 1, l->cols)) {
            tui_draw_header(&t->hdr, &t->st, &t->v, l->tier == TUI_TIER_TABS || t->v.zoom >= 0);
            tui_crt_blit(&t->crt, &t->hdr, l->header.y, 0);
        }
        if (((d & TUI_D_CMD) || t->mode == M_CMD) && !tui_cb_resize(&t->cmdrow, 1, l->cols)) {
            if (t->mode == M_CMD) {
                cx = draw_cmdline(t, &t->cmdrow, 0);
                cy = l->cmd.y;
            } else {
                tui_draw_cmdrow(&t->cmdrow, &t->st);
            }
            tui_crt_blit(&t->crt, &t->cmdrow, l->cmd.y, 0);
        }
    }
    if (((d & TUI_D_STATUS) || t->test) && l->status.h && !tui_cb_resize(&t->status, 1, l->cols)) {
        if (l->tier == TUI_TIER_SMALL && t->mode == M_CMD) {
            cx = draw_cmdline(t, &t->status, 0);
            cy = l->status.y;
        } else {
            tui_status_info si = {.mode = mode_name(t->mode), .frame = t->test ? t->frames + 1 : -1,
                                  .flash = t->flash[0] ? t->flash : NULL,
                                  .ascii_note = !t->crt.utf8 && t->st.cmds_done == 0,
                                  .confirm = t->mode == M_CONFIRM};
            tui_draw_status(&t->status, &t->st, &t->v, &si);
        }
        tui_crt_blit(&t->crt, &t->status, l->status.y, 0);
    }
    if (t->mode == M_HELP || t->mode == M_CONFIRM)
        draw_overlay(t);
    if (cy >= 0) {
        move(cy, cx < l->cols ? cx : l->cols - 1);
        curs_set(1);
    } else {
        curs_set(0);
    }
    wnoutrefresh(stdscr);
    doupdate();
    t->dirty = 0;
    t->frames++;
    double dt = sp_now_s() - t0;
    t->frame_s_sum += dt;
    if (dt > t->frame_s_max)
        t->frame_s_max = dt;
}

/* ---------------------------------------------------------------------------------------------- */
/* keys */

static unsigned focus_ctx(const tui_view *v)
{
    switch (v->zoom >= 0 ? v->zoom : v->focus) {
    case TUI_P_SWARM: return TUI_CTX_SWARM;
    case TUI_P_GEN:
    case TUI_P_LOG: return TUI_CTX_SCROLL;
    case TUI_P_TRAIN: return TUI_CTX_TRAIN;
    default: return 0;
    }
}

static void request_quit(tui *t, int code)
{
    if (t->busy) {
        t->mode = M_CONFIRM;
        t->exit_code = code;
        t->dirty = TUI_D_ALL;
        return;
    }
    t->quit = 1;
    t->exit_code = code;
}

static void act(tui *t, tui_action a)
{
    switch (a) {
    case TUI_A_QUIT: request_quit(t, 0); break;
    case TUI_A_HELP:
        t->mode = M_HELP;
        t->help_first = 0;
        break;
    case TUI_A_CMDLINE:
        t->mode = M_CMD;
        tui_cmdline_open(&t->cl);
        t->dirty |= TUI_D_CMD;
        break;
    case TUI_A_REDRAW:
        clearok(curscr, TRUE);
        t->dirty = TUI_D_ALL;
        break;
    case TUI_A_PAUSE:
        t->v.paused = !t->v.paused;
        t->dirty |= t->held | TUI_D_STATUS;
        t->held = 0;
        break;
    default: t->dirty |= tui_view_apply(&t->v, &t->st, &t->lay, a); break;
    }
}

static void normal_key(tui *t, int key) { act(t, tui_key_action(focus_ctx(&t->v) | TUI_CTX_GLOBAL, key)); }

/* A click focuses the panel (or tab) under it; the wheel scrolls the focused panel. */
static void mouse(tui *t)
{
    MEVENT me;
    if (getmouse(&me) != OK)
        return;
    int kind = me.bstate & (BUTTON1_PRESSED | BUTTON1_CLICKED) ? TUI_MOUSE_CLICK
               : me.bstate & BUTTON4_PRESSED                   ? TUI_MOUSE_WHEEL_UP
#ifdef BUTTON5_PRESSED
               : me.bstate & BUTTON5_PRESSED ? TUI_MOUSE_WHEEL_DOWN
#endif
                                             : TUI_MOUSE_NONE;
    tui_action a = tui_mouse_action(&t->lay, &t->v, kind, me.y, me.x);
    for (int i = 0; i < (kind == TUI_MOUSE_CLICK ? 1 : TUI_WHEEL_LINES) && a != TUI_A_NONE; i++)
        act(t, a);
}

/* The command row's view of the job queue. */
static void refresh_queue(tui *t)
{
    char first[240];
    int n = tui_queue_peek(t, first, sizeof first);
    t->dirty |= tui_state_queue(&t->st, n, first);
}

/* A line typed at `:`: queued for the worker; while a command runs (or others wait) the log says so. */
static void submit_line(tui *t, const char *line)
{
    pthread_mutex_lock(&t->jlock);
    int waits = t->busy || t->queued > 0;
    pthread_mutex_unlock(&t->jlock);
    tui_submit(t, 0, 0, line);
    if (waits) {
        char msg[600];
        snprintf(msg, sizeof msg, "queued: %.240s (it runs after %.240s; Ctrl-C clears the queue)", line,
                 t->st.cmd_running ? t->st.cmd_line : "the commands before it");
        tui_post_log(t, TUI_LOG_NOTICE, msg);
    }
    refresh_queue(t);
}

static void cmd_key(tui *t, int key, int is_char)
{
    tui_action a = is_char && key >= 0x20 && key != 0x7F ? TUI_A_NONE : tui_key_action(TUI_CTX_CMD, key);
    if (!is_char && a == TUI_A_NONE)
        return; /* a function key the line does not use */
    int r = tui_cmdline_key(&t->cl, a, a == TUI_A_NONE ? key : -1);
    if (r == TUI_CL_RUN) {
        const char *line = t->cl.buf;
        if (line[strspn(line, " \t")])
            submit_line(t, line);
        t->mode = M_NORMAL;
    } else if (r == TUI_CL_CANCEL) {
        t->mode = M_NORMAL;
    }
    t->dirty |= TUI_D_CMD | TUI_D_STATUS;
}

static void key(tui *t, int k, int is_char)
{
    if (is_char && k >= 0x100 && t->mode != M_CMD)
        return; /* a character, not one of curses' key codes it could be mistaken for */
    if (k == KEY_RESIZE) {
        tui_crt_resize(&t->crt);
        t->lay_valid = 0;
        t->dirty = TUI_D_ALL;
        return;
    }
    if (!is_char && k == KEY_MOUSE) {
        if (t->mode == M_NORMAL)
            mouse(t);
        else
            getmouse(&(MEVENT){0}); /* taken, not used */
        return;
    }
    switch (t->mode) {
    case M_CMD: cmd_key(t, k, is_char); return;
    case M_HELP: {
        tui_action a = tui_key_action(TUI_CTX_HELP, k);
        int page = t->crt.rows - 4 > 1 ? t->crt.rows - 4 : 1;
        if (a == TUI_A_CLOSE) {
            t->mode = M_NORMAL;
            t->dirty = TUI_D_ALL;
        }
        t->help_first += a == TUI_A_DOWN ? 1 : a == TUI_A_UP ? -1 : a == TUI_A_PGDN ? page : a == TUI_A_PGUP ? -page : 0;
        return;
    }
    case M_CONFIRM: {
        tui_action a = tui_key_action(TUI_CTX_CONFIRM, k);
        if (a == TUI_A_YES) {
            sp_app_cancel(t->app);
            t->quit = 1;
        } else if (a == TUI_A_NO) {
            t->mode = M_NORMAL;
            t->dirty = TUI_D_ALL;
        }
        return;
    }
    default: normal_key(t, k); return;
    }
}

/* Ctrl-C: stops the command running and drops the commands queued behind it (the log names them); with none
 * of either, a second one within FLASH_S quits. In the `:` line it clears the line first; at the quit question
 * it is a yes. */
static void interrupt(tui *t)
{
    double now = sp_now_s();
    if (t->mode == M_CONFIRM) {
        sp_app_cancel(t->app);
        t->quit = 1;
        return;
    }
    if (t->mode == M_CMD && t->cl.len) {
        tui_cmdline_open(&t->cl);
        t->dirty |= TUI_D_CMD;
        return;
    }
    if (t->mode == M_CMD || t->mode == M_HELP) {
        t->mode = M_NORMAL;
        t->dirty = TUI_D_ALL;
    }
    int cleared = tui_clear_queue(t); /* what waits does not run */
    refresh_queue(t);
    if (t->busy) { /* the handler has cancelled it already */
        if (++t->intr_while_busy >= 2)
            request_quit(t, 130);
        else
            say(t, cleared ? "stopping the command, the queue cleared (Ctrl-C again: quit)"
                           : "stopping the command (Ctrl-C again: quit)");
        return;
    }
    if (cleared) {
        say(t, "the queue cleared");
        return;
    }
    if (now - t->last_intr < FLASH_S) {
        request_quit(t, 130);
        return;
    }
    t->last_intr = now;
    say(t, "Ctrl-C again to quit (q quits too)");
}

/* ---------------------------------------------------------------------------------------------- */
/* the loop */

static void take_events(tui *t)
{
    long dropped = 0;
    tui_ev *list = tui_queue_take(&t->q, &dropped);
    t->dirty |= tui_state_dropped(&t->st, dropped);
    for (tui_ev *e = list; e; e = e->next) {
        if (t->rec) {
            char *j = tui_ev_to_json(e, t->t0);
            if (j)
                fprintf(t->rec, "%s\n", j);
            free(j);
        }
        unsigned d = tui_state_apply(&t->st, e);
        t->dirty |= d;
        if (e->kind == TE_CMD_BEGIN || e->kind == TE_CMD_END || e->kind == TE_READY)
            refresh_queue(t);
        if (e->kind == TE_CMD_END) {
            t->intr_while_busy = 0;
            if (t->mode == M_CONFIRM && !t->quit) { /* nothing to stop any more */
                t->mode = M_NORMAL;
                t->dirty = TUI_D_ALL;
            }
        }
        if (e->kind == TE_READY && t->mode == M_NORMAL) { /* the start-up scripts have run: over to the user */
            t->mode = M_CMD;
            tui_cmdline_open(&t->cl);
        }
        if (e->kind == TE_QUIT)
            t->quit = 1;
    }
    if (t->rec && list)
        fflush(t->rec);
    tui_ev_free_list(list);
}

static void read_keys(tui *t)
{
    wint_t wc;
    int r;
    while ((r = wget_wch(stdscr, &wc)) != ERR) {
        if (r == KEY_CODE_YES)
            key(t, (int)wc, 0);
        else
            key(t, (int)wc, 1);
        t->dirty |= TUI_D_STATUS;
    }
}

static int signals(tui *t)
{
    tui_signals s = tui_crt_take_signals();
    if (s.winch) {
        tui_crt_resize(&t->crt);
        t->lay_valid = 0;
        t->dirty = TUI_D_ALL;
    }
    for (int i = 0; i < s.intr; i++)
        interrupt(t);
    if (s.term || s.hup) {
        sp_app_cancel(t->app);
        t->quit = 1;
        t->exit_code = s.term ? 143 : 129;
    }
    return s.winch;
}

/* While a retry waits, the route panel's countdown changes once a second: ms until it next does (-1: no
 * countdown), and the panel is marked for redrawing when the second shown changed. */
static int countdown_ms(tui *t, double now)
{
    double left = t->st.retry_at - now;
    int shown = left > 0 ? (int)ceil(left) : 0;
    if (shown != t->countdown_shown) {
        t->countdown_shown = shown;
        t->dirty |= TUI_D_PANEL(TUI_P_ROUTE);
    }
    if (left <= 0)
        return -1;
    return (int)ceil((left - floor(left)) * 1000) + 1;
}

static void loop(tui *t)
{
    t->dirty = TUI_D_ALL;
    frame(t);
    t->next_frame = sp_now_s() + FRAME_S;
    while (!t->quit) {
        double now = sp_now_s();
        int timeout = -1, cd = countdown_ms(t, now);
        int pending = t->dirty && !(t->v.paused && !(t->dirty & (TUI_D_STATUS | TUI_D_CMD)));
        if (pending)
            timeout = now >= t->next_frame ? 0 : (int)ceil((t->next_frame - now) * 1000);
        if (t->flash[0]) {
            int ft = t->flash_until > now ? (int)ceil((t->flash_until - now) * 1000) : 0;
            timeout = timeout < 0 || ft < timeout ? ft : timeout;
        }
        if (cd >= 0 && !pending)
            timeout = timeout < 0 || cd < timeout ? cd : timeout;
        /* while a frame waits for its slot, the queue waits too (its events are taken just before the frame) */
        struct pollfd pf[2] = {{.fd = 0, .events = POLLIN}, {.fd = t->q.efd, .events = POLLIN}};
        int n = pending ? 1 : 2;
        int r = poll(pf, (nfds_t)n, timeout);
        t->wakes++;
        if (r < 0 && errno != EINTR)
            break;
        int resized = signals(t);
        if (r > 0 && (pf[0].revents & POLLIN))
            read_keys(t);
        if (r > 0 && (pf[0].revents & (POLLHUP | POLLERR)) && !(pf[0].revents & POLLIN)) {
            t->quit = 1; /* the terminal went away */
            t->exit_code = 129;
        }
        now = sp_now_s();
        if (t->flash[0] && now >= t->flash_until) {
            t->flash[0] = 0;
            t->dirty |= TUI_D_STATUS;
        }
        if (!pending || now >= t->next_frame || resized)
            take_events(t);
        if (t->quit)
            break;
        if (t->dirty && (now >= t->next_frame || resized)) {
            frame(t);
            t->next_frame = now + FRAME_S;
        }
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* start and stop */

static void complete_cb(void *ctx, const char *line, size_t cursor, sp_strlist *out, size_t *word_start, int *files)
{
    tui *t = ctx;
    size_t seg = *word_start;
    while (seg > 0 && line[seg - 1] != ';')
        seg--;
    char *before = strndup(line + seg, *word_start - seg), *word = malloc(cursor - *word_start + 1), why[64];
    if (word) { /* the word as the splitter will see it */
        size_t k = 0;
        for (size_t i = *word_start; i < cursor; i++)
            word[k++] = line[i] == '\\' && i + 1 < cursor ? line[++i] : line[i];
        word[k] = 0;
    }
    int argc = 0;
    char **argv = NULL;
    if (before && word && !sp_cmd_split(before, &argc, &argv, why, sizeof why))
        sp_cmd_complete(t->app, argc, argv, word, out, files);
    sp_cmd_free_argv(argc, argv);
    free(before);
    free(word);
}

static void stop_threads(tui *t)
{
    if (t->replay_on) {
        pthread_mutex_lock(&t->flock);
        t->rstop = 1;
        pthread_mutex_unlock(&t->flock);
        pthread_join(t->replayer, NULL);
        t->replay_on = 0;
    }
    if (t->worker_on) {
        pthread_mutex_lock(&t->jlock);
        t->jstop = 1;
        pthread_cond_signal(&t->jcond);
        pthread_mutex_unlock(&t->jlock);
        if (t->busy)
            sp_app_cancel(t->app);
        struct timespec ts; /* a cancelled command ends within a second; one that does not is left behind */
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 20;
        if (pthread_timedjoin_np(t->worker, NULL, &ts)) {
            fprintf(stderr, "sepal: the command running did not stop within 20 s; leaving without it\n");
            fflush(stderr);
            _exit(t->exit_code ? t->exit_code : 1); /* the servers of swarm up stop with this process */
        }
        t->worker_on = 0;
    }
    if (t->feeder_on) {
        pthread_mutex_lock(&t->flock);
        t->fstop = 1;
        pthread_cond_signal(&t->fcond);
        pthread_mutex_unlock(&t->flock);
        pthread_join(t->feeder, NULL);
        t->feeder_on = 0;
    }
}

static void free_ui(tui *t)
{
    for (int p = 0; p < TUI_NPANELS; p++)
        tui_cb_free(&t->pcb[p]);
    tui_cb_free(&t->hdr);
    tui_cb_free(&t->cmdrow);
    tui_cb_free(&t->status);
    tui_cb_free(&t->overlay);
    for (int i = 0; i < t->nhelp; i++)
        free(t->help[i]);
    free(t->help);
    tui_cmdline_free(&t->cl);
    tui_state_free(&t->st);
    tui_swarm_free(t->last);
    free(t->gone_since);
    free(t->history_path);
    pthread_mutex_destroy(&t->jlock);
    pthread_cond_destroy(&t->jcond);
    pthread_mutex_destroy(&t->flock);
    pthread_cond_destroy(&t->fcond);
}

static int open_files(tui *t, const tui_opts *o)
{
    if (o->record && !(t->rec = fopen(o->record, "w"))) {
        fprintf(stderr, "sepal: --record-events %s: %s\n", o->record, strerror(errno));
        return -1;
    }
    if (o->replay && !(t->replay = fopen(o->replay, "r"))) {
        fprintf(stderr, "sepal: --replay-events %s: %s\n", o->replay, strerror(errno));
        return -1;
    }
    const char *sp = getenv("SEPAL_TUI_REPLAY_SPEED");
    t->replay_speed = sp && *sp ? atof(sp) : 1;
    if (!(t->replay_speed >= 0))
        t->replay_speed = 1;
    return 0;
}

static void close_files(tui *t)
{
    if (t->rec)
        fclose(t->rec);
    if (t->replay)
        fclose(t->replay);
    t->rec = t->replay = NULL;
}

static int start_threads(tui *t, const tui_opts *o)
{
    t->worker_on = !pthread_create(&t->worker, NULL, tui_worker_main, t);
    t->feeder_on = !pthread_create(&t->feeder, NULL, tui_feeder_main, t);
    if (t->replay)
        t->replay_on = !pthread_create(&t->replayer, NULL, tui_replay_main, t);
    if (!t->worker_on || !t->feeder_on)
        return -1;
    for (int i = 0; i < o->nscripts; i++)
        tui_submit(t, o->scripts[i].file ? 1 : 0, 1, o->scripts[i].arg);
    if (o->nscripts)
        tui_submit(t, 2, 1, "");
    return 0;
}

static void report_stats(const tui *t)
{
    const char *s = getenv("SEPAL_TUI_STATS");
    if (!s || !*s)
        return;
    fprintf(stderr, "sepal: tui: %ld frames, %.3f ms mean, %.3f ms max per frame; %ld wake-ups\n", t->frames,
            t->frames ? t->frame_s_sum / t->frames * 1e3 : 0, t->frame_s_max * 1e3, t->wakes);
}

int tui_run(sp_app *app, const tui_opts *o)
{
    setlocale(LC_CTYPE, "");
    tui *t = calloc(1, sizeof *t);
    if (!t)
        return 1;
    t->app = app;
    t->t0 = sp_now_s();
    t->test = getenv("SEPAL_TUI_TEST") && *getenv("SEPAL_TUI_TEST");
    pthread_mutex_init(&t->jlock, NULL);
    pthread_cond_init(&t->jcond, NULL);
    pthread_mutex_init(&t->flock, NULL);
    pthread_cond_init(&t->fcond, NULL);
    tui_view_init(&t->v);
    tui_cmdline_init(&t->cl, complete_cb, t);
    t->history_path = sp_history_path();
    tui_cmdline_load(&t->cl, t->history_path);
    t->nhelp = tui_help_lines(&t->help);
    int rc = 1;
    if (tui_state_init(&t->st) || tui_queue_init(&t->q, QUEUE_CAP, 1) || open_files(t, o)) {
        close_files(t);
        free_ui(t);
        free(t);
        return 1;
    }
    tui_g = t;
    tui_crt_signals(t->q.efd, tui_on_sigint); /* before curses: ncurses then installs none of its own */
    if (tui_crt_init(&t->crt, 0)) {
        fprintf(stderr, "sepal: no TUI on this terminal (TERM=%s): the line REPL instead\n",
                getenv("TERM") ? getenv("TERM") : "");
        rc = -1;
        goto out;
    }
    tui_cb *cbs[] = {&t->pcb[0], &t->pcb[1], &t->pcb[2], &t->pcb[3], &t->pcb[4], &t->hdr, &t->cmdrow, &t->status,
                     &t->overlay};
    for (size_t i = 0; i < sizeof cbs / sizeof cbs[0]; i++)
        cbs[i]->utf8 = t->crt.utf8;
    t->saved_sink = app->sink;
    tui_open_sink();
    app->sink = (sp_sink){.emit = tui_emit, .user = t};
    app->interactive = 1;
    if (start_threads(t, o)) {
        tui_crt_done(&t->crt);
        fprintf(stderr, "sepal: cannot start the TUI's threads\n");
        goto out;
    }
    refresh_queue(t);
    loop(t);
    rc = t->exit_code;
    tui_crt_done(&t->crt); /* the terminal back first; then the command running stops (cancelled: network
                              waits end within 100 ms) */
    report_stats(t);
    stop_threads(t);
out:
    stop_threads(t);
    if (t->saved_sink.emit) { /* the TUI ran */
        app->sink = t->saved_sink;
        tui_close_sink();
        app->quiet = 1; /* the servers stopping after this say nothing; errors still show */
        tui_cmdline_save(&t->cl, t->history_path);
    }
    tui_g = NULL;
    tui_crt_signals_off();
    tui_queue_destroy(&t->q);
    close_files(t);
    free_ui(t);
    free(t);
    return rc;
}
