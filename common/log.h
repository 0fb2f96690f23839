/* log.h - leveled logging. Library code logs through here; a front end may install a sink
 * (the TUI's log panel) instead of the default stderr writer. */
#ifndef SEPAL_LOG_H
#define SEPAL_LOG_H

typedef enum { SP_LOG_DEBUG, SP_LOG_INFO, SP_LOG_WARN, SP_LOG_ERROR } sp_log_level;

typedef void (*sp_log_sink)(sp_log_level level, const char *msg, void *user);

void sp_log_set_level(sp_log_level min_level);
void sp_log_set_sink(sp_log_sink sink, void *user); /* NULL restores stderr */
void sp_log(sp_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Rate-limited logging for lines a peer can cause (refused or failed connections): at most SP_LOG_BURST lines
 * per SP_LOG_WINDOW_S seconds per limiter; the first line after a quiet spell says how many were suppressed
 * ("(12 similar suppressed)"). A limiter is zeroed static storage at the call site; thread-safe. */
#define SP_LOG_BURST 5
#define SP_LOG_WINDOW_S 10.0
typedef struct sp_log_limit {
    double window_start;
    int in_window;
    unsigned long suppressed;
} sp_log_limit;
void sp_log_limited(sp_log_limit *lim, sp_log_level level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Once a window is over, says how many lines it suppressed (call it now and then: a burst that stops would
 * otherwise never be counted). */
void sp_log_limited_flush(sp_log_limit *lim);

#endif
