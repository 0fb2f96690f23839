#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const status_names[SP_ERR__COUNT] = {
    [SP_OK] = "ok",
    [SP_ERR_IO] = "i/o error",
    [SP_ERR_FORMAT] = "malformed data",
    [SP_ERR_NOMEM] = "out of memory",
    [SP_ERR_ARG] = "invalid argument",
    [SP_ERR_NOTFOUND] = "not found",
    [SP_ERR_UNSUPPORTED] = "unsupported",
    [SP_ERR_CHECKSUM] = "checksum mismatch",
    [SP_ERR_RANGE] = "out of range",
    [SP_ERR_STATE] = "invalid state",
    [SP_ERR_TIMEOUT] = "timed out",
    [SP_ERR_CLOSED] = "connection closed",
    [SP_ERR_CANCELLED] = "cancelled",
    [SP_ERR_BUSY] = "busy",
};

const char *sp_status_str(sp_status s)
{
    if ((int)s < 0 || s >= SP_ERR__COUNT)
        return "unknown status";
    return status_names[s];
}

sp_status sp_errf(sp_err *err, sp_status code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

sp_status sp_err_prefix(sp_err *err, const char *fmt, ...)
{
    if (!err)
        return SP_OK;
    char prefix[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    size_t plen = n < 0 ? 0 : (size_t)n < sizeof prefix ? (size_t)n : sizeof prefix - 1;
    size_t old = strnlen(err->msg, sizeof err->msg - 1);
    if (plen + old > sizeof err->msg - 1)
        old = sizeof err->msg - 1 - plen;
    memmove(err->msg + plen, err->msg, old);
    memcpy(err->msg, prefix, plen);
    err->msg[plen + old] = '\0';
    return err->code;
}
