/* policy.c - what the runtime does when a server fails (Petals' policy, reference/petals-internals.md §4.6,
 * §9.7): the server is banned for ban_s * 2^k seconds (k: its failures since its last success), requests
 * are retried after 0, 1, 2, 4 ... backoff_max_s seconds on a route that avoids it, and each retry is an
 * event. Timeouts come from what the server's announced throughput predicts, so a hung server is noticed
 * within seconds of a decode step. */
#include "swarm_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "timeutil.h"

int sp_rt_retryable(sp_status st, const sp_reply *rep)
{
    const char *code = rep ? sp_reply_error_code(rep) : NULL;
    if (!code) /* transport failures, timeouts, replies that are malformed or hold non-finite values */
        return st == SP_ERR_IO || st == SP_ERR_CLOSED || st == SP_ERR_TIMEOUT || st == SP_ERR_FORMAT ||
               st == SP_ERR_RANGE || st == SP_ERR_NOTFOUND || st == SP_ERR_STATE;
    /* errors any server would give for this request are ours, not the server's */
    static const char *const ours[] = {"bad_request", "shape", "dtype", "non_finite", "version", "malformed"};
    for (size_t i = 0; i < sizeof ours / sizeof *ours; i++)
        if (!strcmp(code, ours[i]))
            return 0;
    return 1;
}

/* "WHAT; retry K of N in S s" (or "now", or "no retries left (N)") as an SP_EV_RETRY event for the retry
 * that follows try `attempt`; its `total` is the pause in seconds (a front end counts it down). */
static void retry_event(sp_runtime *rt, int row, int attempt, const char *what)
{
    int max = rt->set.max_retries;
    char text[1200];
    double wait = sp_rt_backoff(rt, attempt + 1);
    if (attempt >= max)
        snprintf(text, sizeof text, "%s; no retries left (%d)", what, max);
    else if (wait > 0)
        snprintf(text, sizeof text, "%s; retry %d of %d in %.0f s", what, attempt + 1, max, wait);
    else
        snprintf(text, sizeof text, "%s; retry %d of %d now", what, attempt + 1, max);
    sp_rt_emit(rt, SP_EV_RETRY, text, 0, attempt < max ? wait : 0, row);
}

/* Bans server i (see sp_rt_failed), and with it the earlier lives of the server at its address: they are
 * the same process's address, and a retry must not go back there while another route exists. Returns the
 * ban's length. Caller holds rt->lock. */
static double ban(sp_runtime *rt, int i)
{
    sp_server_entry *e = rt->servers[i];
    double len = rt->set.ban_s * pow(2.0, e->failures < 20 ? e->failures : 20);
    double now = sp_runtime_now(rt);
    if (e->banned_until < now) { /* a server already banned keeps its ban (Petals' Blacklist) */
        e->banned_until = now + len;
        e->failures++;
    } else {
        len = e->banned_until - now;
    }
    for (int j = 0; j < rt->nservers; j++) {
        sp_server_entry *o = rt->servers[j];
        if (j != i && !o->gone && sp_rt_same_addr(o, e) && o->rec.timestamp <= e->rec.timestamp &&
            o->banned_until < e->banned_until)
            o->banned_until = e->banned_until;
    }
    return len;
}

/* Marks server i busy for ban_s (it refused a session as "overloaded"): avoided, not banned. Returns the time.
 * Caller holds rt->lock. */
static double mark_busy(sp_runtime *rt, int i)
{
    rt->servers[i]->busy_until = sp_runtime_now(rt) + rt->set.ban_s;
    return rt->set.ban_s;
}

void sp_rt_failed(sp_runtime *rt, int i, int attempt, const sp_err *why)
{
    char label[160];
    sp_rt_server_label(rt, i, label, sizeof label);
    int busy = why && why->code == SP_ERR_BUSY;
    /* a lost connection: if nothing listens there any more, the server is gone, not busy */
    int down = why && (why->code == SP_ERR_IO || why->code == SP_ERR_CLOSED) && sp_rt_probe_down(rt, i);
    pthread_mutex_lock(&rt->lock);
    sp_server_entry *e = rt->servers[i];
    double len = busy ? mark_busy(rt, i) : ban(rt, i);
    int start = e->rec.start, end = e->rec.end;
    pthread_mutex_unlock(&rt->lock);
    /* the error often names the server again: "HOST:PORT (blocks a:b): ..." */
    const char *msg = why && why->msg[0] ? why->msg : "?";
    size_t ll = strlen(label);
    if (!strncmp(msg, label, ll)) {
        const char *rest = msg + ll;
        if (!strncmp(rest, " (blocks ", 9) && strchr(rest, ')'))
            rest = strchr(rest, ')') + 1;
        if (!strncmp(rest, ": ", 2))
            msg = rest + 2;
    }
    char what[1024];
    if (busy)
        snprintf(what, sizeof what, "%s (blocks %d:%d) is busy: %s; other servers first for %.0f s", label, start, end,
                 msg, len);
    else
        snprintf(what, sizeof what, "%s (blocks %d:%d) failed: %s%s; banned for %.0f s", label, start, end, msg,
                 down ? "; nothing listens there now" : "", len);
    retry_event(rt, i, attempt, what);
}

int sp_rt_no_server(sp_runtime *rt, int start, int end, int attempt, sp_err *err)
{
    char who[160], what[400];
    int missing, L = rt->local ? rt->local->cfg.n_layers : end;
    if (!sp_rt_joining(rt, start, end, &missing, who, sizeof who)) {
        char failure[sizeof err->msg];
        snprintf(failure, sizeof failure, "%s", err ? err->msg : "");
        if (failure[0]) /* after a server's failure: say which, and why no other can stand in */
            sp_errf(err, SP_ERR_NOTFOUND, "%.300s; no other server holds block %d (of 0..%d), and none is joining",
                    failure, missing, L - 1);
        else
            sp_errf(err, SP_ERR_NOTFOUND, "no online server holds block %d (of 0..%d), and none is joining", missing,
                    L - 1);
        return 0;
    }
    if (missing >= 0)
        snprintf(what, sizeof what, "no online server holds block %d (of 0..%d) yet; %s", missing, L - 1, who);
    else
        snprintf(what, sizeof what, "blocks %d:%d have servers again", start, end);
    retry_event(rt, -1, attempt, what);
    return 1;
}

void sp_rt_succeeded(sp_runtime *rt, int i)
{
    pthread_mutex_lock(&rt->lock);
    rt->servers[i]->failures = 0;
    rt->servers[i]->banned_until = 0;
    pthread_mutex_unlock(&rt->lock);
}

double sp_rt_backoff(const sp_runtime *rt, int attempt)
{
    if (attempt <= 1)
        return 0;
    double d = pow(2.0, attempt - 2);
    return d < rt->set.backoff_max_s ? d : rt->set.backoff_max_s;
}

int sp_rt_sleep(sp_runtime *rt, double s)
{
    if (rt->clock) { /* a test's clock: it moves by itself */
        if (sp_runtime_waits_cancelled(rt))
            return -1;
        rt->clock->sleep(rt->clock->user, s);
        return 0;
    }
    double end = sp_now_s() + s;
    for (;;) {
        if (sp_runtime_waits_cancelled(rt))
            return -1;
        double left = end - sp_now_s();
        if (left <= 0)
            return 0;
        double d = left < 0.05 ? left : 0.05;
        struct timespec ts = {(time_t)d, (long)((d - floor(d)) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

int sp_rt_timeout_ms(sp_runtime *rt, int i, int nblocks, long tokens, int decode)
{
    if (rt->set.step_timeout_s > 0)
        return (int)(rt->set.step_timeout_s * 1000);
    pthread_mutex_lock(&rt->lock);
    const sp_server_record *r = &rt->servers[i]->rec;
    double rate = decode ? r->inference_rps : r->forward_rps; /* per block */
    pthread_mutex_unlock(&rt->lock);
    if (rate <= 0)
        rate = decode ? 50 : 500; /* unknown: slow, so that a slow server is not taken for a dead one */
    double expected = (double)(tokens > 0 ? tokens : 1) * nblocks / rate;
    double ms = 1000 * (2.0 + 20 * expected);
    return ms < CALL_TIMEOUT_MS ? (int)ms : CALL_TIMEOUT_MS;
}
