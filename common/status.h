/* status.h - status codes and the error out-parameter every fallible library call takes.
 *
 * Convention: a fallible function returns an sp_status (SP_OK == 0) and, on failure, fills `err`
 * (which may be NULL) with a one-line message that names the file / tensor / field at fault.
 * Library code never exits or aborts on bad input. */
#ifndef SEPAL_STATUS_H
#define SEPAL_STATUS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    SP_OK = 0,
    SP_ERR_IO,          /* a file or socket operation failed */
    SP_ERR_FORMAT,      /* malformed data (file, header, message) */
    SP_ERR_NOMEM,       /* allocation failed */
    SP_ERR_ARG,         /* invalid argument / shape / option */
    SP_ERR_NOTFOUND,    /* a named thing (tensor, key, file) is missing */
    SP_ERR_UNSUPPORTED, /* valid but not implemented (architecture, dtype) */
    SP_ERR_CHECKSUM,    /* content does not match its expected digest */
    SP_ERR_RANGE,       /* a value is outside what the receiver accepts */
    SP_ERR_STATE,       /* call not valid in the current state */
    SP_ERR_TIMEOUT,     /* a wait ran out */
    SP_ERR_CLOSED,      /* the connection or peer is gone */
    SP_ERR_CANCELLED,   /* the caller asked to stop (Ctrl-C) */
    SP_ERR_BUSY,        /* the peer is saturated now (a server's "overloaded"): go elsewhere, or later */
    SP_ERR__COUNT
} sp_status;

typedef struct sp_err {
    sp_status code;
    char msg[512];
} sp_err;

const char *sp_status_str(sp_status s);

/* Records a formatted message in `err` (if non-NULL) and returns `code`, so callers can write
 * `return sp_errf(err, SP_ERR_FORMAT, "%s: bad header", path);`. */
sp_status sp_errf(sp_err *err, sp_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefixes an existing message with more context ("loading block 3: " + old message). */
sp_status sp_err_prefix(sp_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif
#endif
