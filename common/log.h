/* log.h - leveled logging. Library code logs through here; a front end may install a sink
 * (the TUI's log panel) instead of the default stderr writer. */
#ifndef SEPAL_LOG_H
#define SEPAL_LOG_H

typedef enum { SP_LOG_DEBUG, SP_LOG_INFO, SP_LOG_WARN, SP_LOG_ERROR } sp_log_level;

typedef void (*sp_log_sink)(sp_log_level level, const char *msg, void *user);

void sp_log_set_level(sp_log_level min_level);
void sp_log_set_sink(sp_log_sink sink, void *user); /* NULL restores stderr */
void sp_log(sp_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
