#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

static sp_log_level g_min = SP_LOG_WARN;
static sp_log_sink g_sink;
static void *g_user;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

void sp_log_set_level(sp_log_level min_level) { g_min = min_level; }

void sp_log_set_sink(sp_log_sink sink, void *user)
{
    pthread_mutex_lock(&g_lock);
    g_sink = sink;
    g_user = user;
    pthread_mutex_unlock(&g_lock);
}

void sp_log(sp_log_level level, const char *fmt, ...)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    if (level < g_min)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&g_lock);
    if (g_sink)
        g_sink(level, msg, g_user);
    else
        fprintf(stderr, "sepal: %s: %s\n", names[level], msg);
    pthread_mutex_unlock(&g_lock);
}

void sp_log_limited(sp_log_limit *lim, sp_log_level level, const char *fmt, ...)
{
    if (level < g_min)
        return;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double now = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
    pthread_mutex_lock(&g_lock);
    if (now - lim->window_start >= SP_LOG_WINDOW_S) {
        lim->window_start = now;
        lim->in_window = 0;
    }
    int pass = lim->in_window < SP_LOG_BURST;
    unsigned long suppressed = pass ? lim->suppressed : 0;
    if (pass) {
        lim->in_window++;
        lim->suppressed = 0;
    } else {
        lim->suppressed++;
    }
    pthread_mutex_unlock(&g_lock);
    if (!pass)
        return;
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (suppressed)
        sp_log(level, "%s (%lu similar suppressed)", msg, suppressed);
    else
        sp_log(level, "%s", msg);
}

void sp_log_limited_flush(sp_log_limit *lim)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double now = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
    pthread_mutex_lock(&g_lock);
    unsigned long n = lim->suppressed && now - lim->window_start >= SP_LOG_WINDOW_S ? lim->suppressed : 0;
    if (n) {
        lim->suppressed = 0;
        lim->window_start = now;
        lim->in_window = 0;
    }
    pthread_mutex_unlock(&g_lock);
    if (n)
        sp_log(SP_LOG_WARN, "(%lu similar lines suppressed in %.0f s)", n, SP_LOG_WINDOW_S);
}
