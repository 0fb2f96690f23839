/* jinja.c - stub */
#include "jinja.h"
sp_status sp_jinja_render(const char *src, const cJSON *ctx, char **out, sp_err *err)
{
    (void)src; (void)ctx; *out = NULL;
    return sp_errf(err, SP_ERR_UNSUPPORTED, "chat template: not yet");
}
