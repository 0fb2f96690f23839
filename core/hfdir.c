/* hfdir.c - see hfdir.h. */
#include "hfdir.h"

#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

sp_status sp_hf_mkdir(const char *dir, sp_err *err)
{
    char buf[4096];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof buf)
        return sp_errf(err, SP_ERR_ARG, "invalid output directory '%s'", dir);
    memcpy(buf, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0')
            continue;
        char saved = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return sp_errf(err, SP_ERR_IO, "%s: cannot create directory: %s", buf, strerror(errno));
        buf[i] = saved;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return sp_errf(err, SP_ERR_IO, "%s: not a directory", dir);
    return SP_OK;
}

sp_status sp_hf_path(char *out, size_t cap, const char *dir, const char *name, sp_err *err)
{
    int n = snprintf(out, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap)
        return sp_errf(err, SP_ERR_ARG, "%s: path too long", dir);
    return SP_OK;
}

sp_status sp_hf_write_json(cJSON *root, const char *outdir, const char *name, int pretty, sp_err *err)
{
    char path[4096];
    sp_status s = sp_hf_path(path, sizeof path, outdir, name, err);
    char *txt = s == SP_OK && root ? (pretty ? cJSON_Print(root) : cJSON_PrintUnformatted(root)) : NULL;
    cJSON_Delete(root);
    if (s != SP_OK)
        return s;
    if (!txt)
        return sp_errf(err, SP_ERR_NOMEM, "%s: out of memory building JSON", path);
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(txt);
        return sp_errf(err, SP_ERR_IO, "%s: %s", path, strerror(errno));
    }
    size_t n = strlen(txt);
    int ok = fwrite(txt, 1, n, f) == n && fputc('\n', f) != EOF;
    ok = (fclose(f) == 0) && ok;
    free(txt);
    return ok ? SP_OK : sp_errf(err, SP_ERR_IO, "%s: write failed: %s", path, strerror(errno));
}

sp_status sp_hf_copy(const char *src, const char *dir, const char *name, sp_err *err)
{
    char dst[4096];
    sp_status s = sp_hf_path(dst, sizeof dst, dir, name, err);
    if (s)
        return s;
    FILE *in = fopen(src, "rb"), *out = in ? fopen(dst, "wb") : NULL;
    if (!in || !out) {
        s = sp_errf(err, SP_ERR_IO, "%s: %s", in ? dst : src, strerror(errno));
        if (in)
            fclose(in);
        return s;
    }
    char buf[1 << 16];
    size_t n;
    int ok = 1;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0)
        ok = fwrite(buf, 1, n, out) == n;
    ok = ok && !ferror(in);
    fclose(in);
    ok = fclose(out) == 0 && ok;
    return ok ? SP_OK : sp_errf(err, SP_ERR_IO, "copying %s to %s failed: %s", src, dst, strerror(errno));
}
