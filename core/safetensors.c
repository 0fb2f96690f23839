/* safetensors.c - mmap reader (single file / sharded index, lazy shard mapping) and a small writer. */
#include "safetensors.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "memtune.h"

#define ST_MAX_HEADER (100u << 20) /* the format caps the JSON header at 100 MB */

typedef struct st_file {
    char *path;
    int mapped;          /* 1 once the file is mapped and its header parsed */
    unsigned char *base; /* mapping of the whole file */
    size_t size;
} st_file;

typedef struct st_entry {
    char *name;
    int file;     /* index into files */
    int resolved; /* tensor fields filled from the file header */
    sp_st_tensor t;
} st_entry;

struct sp_safetensors {
    st_file *files;
    int nfiles;
    st_entry *entries;
    int nentries;
    uint64_t bytes_read;
    cJSON *meta; /* the __metadata__ object of the first header parsed (strings only), or NULL */
};

/* ---------------------------------------------------------------------------------------------- */
/* helpers */

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p)
        memcpy(p, s, n);
    return p;
}

static int entry_cmp(const void *a, const void *b)
{
    return strcmp(((const st_entry *)a)->name, ((const st_entry *)b)->name);
}

static st_entry *find_entry(const sp_safetensors *st, const char *name)
{
    st_entry key = {.name = (char *)name};
    if (st->nentries == 0)
        return NULL;
    return bsearch(&key, st->entries, (size_t)st->nentries, sizeof *st->entries, entry_cmp);
}

static int add_file(sp_safetensors *st, const char *path)
{
    for (int i = 0; i < st->nfiles; i++)
        if (strcmp(st->files[i].path, path) == 0)
            return i;
    st_file *f = realloc(st->files, (size_t)(st->nfiles + 1) * sizeof *f);
    if (!f)
        return -1;
    st->files = f;
    memset(&f[st->nfiles], 0, sizeof *f);
    f[st->nfiles].path = xstrdup(path);
    if (!f[st->nfiles].path)
        return -1;
    return st->nfiles++;
}

static sp_status add_entry(sp_safetensors *st, const char *name, int file, sp_err *err)
{
    st_entry *e = realloc(st->entries, (size_t)(st->nentries + 1) * sizeof *e);
    if (!e)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    st->entries = e;
    memset(&e[st->nentries], 0, sizeof *e);
    e[st->nentries].name = xstrdup(name);
    e[st->nentries].file = file;
    if (!e[st->nentries].name)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    st->nentries++;
    return SP_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* header parsing and validation */

typedef struct span {
    uint64_t begin, end;
    const char *name;
} span;

static int span_cmp(const void *a, const void *b)
{
    const span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Fills t from one header item, checking dtype, shape, offsets and size against the data section. */
static sp_status parse_tensor(sp_st_tensor *t, const cJSON *item, const char *path, uint64_t data_len,
                              sp_err *err)
{
    const char *name = item->string;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
        return sp_errf(err, SP_ERR_FORMAT, "%s: tensor '%s': header entry needs dtype, shape, data_offsets", path,
                       name);
    if (sp_dtype_from_name(dt->valuestring, &t->dtype) != 0)
        return sp_errf(err, SP_ERR_UNSUPPORTED, "%s: tensor '%s': unknown dtype '%s'", path, name, dt->valuestring);
    int nd = cJSON_GetArraySize(shape);
    if (nd > SP_MAX_DIMS)
        return sp_errf(err, SP_ERR_FORMAT, "%s: tensor '%s': rank %d exceeds %d", path, name, nd, SP_MAX_DIMS);
    uint64_t numel = 1;
    for (int i = 0; i < nd; i++) {
        const cJSON *d = cJSON_GetArrayItem(shape, i);
        if (!cJSON_IsNumber(d) || d->valuedouble < 0 || d->valuedouble > 9.0e15 ||
            d->valuedouble != (double)(int64_t)d->valuedouble)
            return sp_errf(err, SP_ERR_FORMAT, "%s: tensor '%s': bad shape dimension %d", path, name, i);
        t->shape[i] = (int64_t)d->valuedouble;
        if (t->shape[i] && numel > UINT64_MAX / (uint64_t)t->shape[i])
            return sp_errf(err, SP_ERR_FORMAT, "%s: tensor '%s': shape overflows", path, name);
        numel *= (uint64_t)t->shape[i];
    }
    t->ndim = nd;
    t->numel = numel;
    double b = cJSON_GetArrayItem(offs, 0)->valuedouble, e = cJSON_GetArrayItem(offs, 1)->valuedouble;
    if (!cJSON_IsNumber(cJSON_GetArrayItem(offs, 0)) || !cJSON_IsNumber(cJSON_GetArrayItem(offs, 1)) || b < 0 ||
        e < b || e > (double)data_len)
        return sp_errf(err, SP_ERR_FORMAT, "%s: tensor '%s': data_offsets [%.0f, %.0f] outside the data section (%llu bytes)",
                       path, name, b, e, (unsigned long long)data_len);
    uint64_t nbytes = (uint64_t)e - (uint64_t)b;
    size_t es = sp_dtype_size(t->dtype);
    if (numel > UINT64_MAX / es || numel * es != nbytes)
        return sp_errf(err, SP_ERR_FORMAT, "%s: tensor '%s': %llu bytes in file but shape x %s needs %llu", path, name,
                       (unsigned long long)nbytes, sp_dtype_name(t->dtype), (unsigned long long)(numel * es));
    t->nbytes = nbytes;
    t->data = (const void *)(uintptr_t)b; /* relative for now; rebased by the caller */
    return SP_OK;
}

/* Checks that no two tensors share bytes. */
static sp_status check_overlaps(span *spans, int n, const char *path, sp_err *err)
{
    qsort(spans, (size_t)n, sizeof *spans, span_cmp);
    for (int i = 1; i < n; i++)
        if (spans[i].begin < spans[i - 1].end && spans[i].end > spans[i].begin)
            return sp_errf(err, SP_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap", path, spans[i - 1].name,
                           spans[i].name);
    return SP_OK;
}

static sp_status map_file(st_file *f, sp_err *err)
{
    int fd = open(f->path, O_RDONLY);
    if (fd < 0)
        return sp_errf(err, SP_ERR_IO, "%s: %s", f->path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return sp_errf(err, SP_ERR_IO, "%s: not a regular file", f->path);
    }
    if (sb.st_size < 8) {
        close(fd);
        return sp_errf(err, SP_ERR_FORMAT, "%s: truncated safetensors file (%lld bytes)", f->path,
                       (long long)sb.st_size);
    }
    void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return sp_errf(err, SP_ERR_IO, "%s: mmap: %s", f->path, strerror(errno));
    f->base = p;
    f->size = (size_t)sb.st_size;
    return SP_OK;
}

/* Maps file `fi`, parses its header and resolves (or, if `register_all`, adds) its tensors. */
static sp_status load_file(sp_safetensors *st, int fi, int register_all, sp_err *err)
{
    st_file *f = &st->files[fi];
    sp_status s = map_file(f, err);
    if (s)
        return s;
    uint64_t hlen;
    memcpy(&hlen, f->base, 8); /* little-endian hosts only (x86-64, aarch64) */
    if (hlen > ST_MAX_HEADER || hlen > f->size - 8)
        return sp_errf(err, SP_ERR_FORMAT, "%s: header length %llu runs past the file (%zu bytes)", f->path,
                       (unsigned long long)hlen, f->size);
    cJSON *root = cJSON_ParseWithLength((const char *)f->base + 8, (size_t)hlen);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return sp_errf(err, SP_ERR_FORMAT, "%s: header is not a JSON object", f->path);
    }
    const unsigned char *data = f->base + 8 + hlen;
    uint64_t data_len = f->size - 8 - hlen;
    int n = cJSON_GetArraySize(root);
    span *spans = calloc((size_t)n + 1, sizeof *spans);
    int ns = 0;
    s = spans ? SP_OK : sp_errf(err, SP_ERR_NOMEM, "out of memory");
    for (const cJSON *it = root->child; it && !s; it = it->next) {
        if (it->string && !strcmp(it->string, "__metadata__") && cJSON_IsObject(it) && !st->meta)
            st->meta = cJSON_Duplicate(it, 1);
        if (!it->string || strcmp(it->string, "__metadata__") == 0)
            continue;
        sp_st_tensor t = {0};
        s = parse_tensor(&t, it, f->path, data_len, err);
        if (s)
            break;
        uint64_t rel = (uint64_t)(uintptr_t)t.data;
        t.data = data + rel;
        t.file = f->path;
        spans[ns++] = (span){rel, rel + t.nbytes, it->string};
        if (register_all && !find_entry(st, it->string)) {
            s = add_entry(st, it->string, fi, err);
            qsort(st->entries, (size_t)st->nentries, sizeof *st->entries, entry_cmp);
        }
        st_entry *e = s ? NULL : find_entry(st, it->string);
        if (e && e->file == fi) {
            e->t = t;
            e->t.name = e->name;
            e->resolved = 1;
        }
    }
    if (!s)
        s = check_overlaps(spans, ns, f->path, err);
    /* every tensor the index assigned to this file must be in its header */
    for (int i = 0; i < st->nentries && !s; i++)
        if (st->entries[i].file == fi && !st->entries[i].resolved)
            s = sp_errf(err, SP_ERR_NOTFOUND, "%s: tensor '%s' listed in the index is missing from the file", f->path,
                        st->entries[i].name);
    free(spans);
    cJSON_Delete(root);
    if (!s)
        f->mapped = 1;
    return s;
}

/* ---------------------------------------------------------------------------------------------- */
/* opening */

static char *read_text(const char *path, sp_err *err)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        sp_errf(err, SP_ERR_IO, "%s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(fp);
                sp_errf(err, SP_ERR_NOMEM, "%s: out of memory", path);
                return NULL;
            }
            buf = nb;
        }
        size_t r = fread(buf + len, 1, 4096, fp);
        len += r;
        if (r < 4096)
            break;
    }
    fclose(fp);
    buf[len] = '\0';
    return buf;
}

static sp_status open_index(sp_safetensors *st, const char *index_path, sp_err *err)
{
    char *text = read_text(index_path, err);
    if (!text)
        return err ? err->code : SP_ERR_IO;
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) {
        cJSON_Delete(root);
        return sp_errf(err, SP_ERR_FORMAT, "%s: not a safetensors index (no weight_map object)", index_path);
    }
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", index_path);
    char *slash = strrchr(dir, '/');
    if (slash)
        slash[1] = '\0';
    else
        strcpy(dir, "./");
    sp_status s = SP_OK;
    for (const cJSON *it = map->child; it && !s; it = it->next) {
        if (!cJSON_IsString(it) || strchr(it->valuestring, '/')) {
            s = sp_errf(err, SP_ERR_FORMAT, "%s: bad shard name for tensor '%s'", index_path, it->string);
            break;
        }
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s%s", dir, it->valuestring);
        int fi = add_file(st, path);
        s = fi < 0 ? sp_errf(err, SP_ERR_NOMEM, "out of memory") : add_entry(st, it->string, fi, err);
    }
    cJSON_Delete(root);
    if (!s)
        qsort(st->entries, (size_t)st->nentries, sizeof *st->entries, entry_cmp);
    for (int i = 1; i < st->nentries && !s; i++)
        if (strcmp(st->entries[i - 1].name, st->entries[i].name) == 0)
            s = sp_errf(err, SP_ERR_FORMAT, "%s: tensor '%s' listed twice", index_path, st->entries[i].name);
    return s;
}

static int is_dir(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int exists(const char *p)
{
    return access(p, F_OK) == 0;
}

sp_status sp_st_open(sp_safetensors **out, const char *path, sp_err *err)
{
    *out = NULL;
    sp_safetensors *st = calloc(1, sizeof *st);
    if (!st)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    char buf[PATH_MAX];
    const char *target = path;
    if (is_dir(path)) {
        snprintf(buf, sizeof buf, "%s/model.safetensors.index.json", path);
        if (!exists(buf))
            snprintf(buf, sizeof buf, "%s/model.safetensors", path);
        if (!exists(buf)) {
            free(st);
            return sp_errf(err, SP_ERR_NOTFOUND, "%s: no model.safetensors or model.safetensors.index.json", path);
        }
        target = buf;
    }
    size_t len = strlen(target);
    sp_status s;
    if (len > 5 && strcmp(target + len - 5, ".json") == 0) {
        s = open_index(st, target, err);
    } else {
        int fi = add_file(st, target);
        s = fi < 0 ? sp_errf(err, SP_ERR_NOMEM, "out of memory") : load_file(st, fi, 1, err);
    }
    if (s) {
        sp_st_close(st);
        return s;
    }
    *out = st;
    return SP_OK;
}

void sp_st_close(sp_safetensors *st)
{
    if (!st)
        return;
    for (int i = 0; i < st->nfiles; i++) {
        if (st->files[i].base)
            munmap(st->files[i].base, st->files[i].size);
        free(st->files[i].path);
    }
    for (int i = 0; i < st->nentries; i++)
        free(st->entries[i].name);
    free(st->files);
    free(st->entries);
    cJSON_Delete(st->meta);
    free(st);
}

const char *sp_st_meta(const sp_safetensors *st, const char *key)
{
    const cJSON *v = st->meta ? cJSON_GetObjectItemCaseSensitive(st->meta, key) : NULL;
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* ---------------------------------------------------------------------------------------------- */
/* access */

const sp_st_tensor *sp_st_get(sp_safetensors *st, const char *name, sp_err *err)
{
    st_entry *e = find_entry(st, name);
    if (!e) {
        const char *where = st->nfiles ? st->files[0].path : "safetensors";
        sp_errf(err, SP_ERR_NOTFOUND, "%s: tensor '%s' not found", st->nfiles == 1 ? where : "checkpoint", name);
        return NULL;
    }
    st_file *f = &st->files[e->file];
    if (!f->mapped && !f->base) {
        if (load_file(st, e->file, 0, err) != SP_OK)
            return NULL;
        e = find_entry(st, name); /* entries array is stable, but be explicit */
    } else if (!f->mapped) {
        sp_errf(err, SP_ERR_FORMAT, "%s: file failed to load earlier", f->path);
        return NULL;
    }
    st->bytes_read += e->t.nbytes;
    return &e->t;
}

int sp_st_has(sp_safetensors *st, const char *name)
{
    return find_entry(st, name) != NULL;
}

void sp_st_release(sp_safetensors *st, const char *name)
{
    const st_entry *e = find_entry(st, name);
    if (e && e->resolved && st->files[e->file].base)
        sp_mem_release(e->t.data, e->t.nbytes);
}

sp_status sp_st_read_f32(sp_safetensors *st, const char *name, float *dst, int ndim, const int64_t *shape,
                         sp_err *err)
{
    const sp_st_tensor *t = sp_st_get(st, name, err);
    if (!t)
        return err ? err->code : SP_ERR_NOTFOUND;
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        ok = t->shape[i] == shape[i];
    if (!ok) {
        char got[128] = "", want[128] = "";
        for (int i = 0; i < t->ndim; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? "," : "", (long long)t->shape[i]);
        for (int i = 0; i < ndim; i++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", i ? "," : "", (long long)shape[i]);
        return sp_errf(err, SP_ERR_FORMAT, "%s: tensor '%s' has shape [%s], expected [%s]", t->file, name, got, want);
    }
    sp_status s = sp_to_f32(dst, t->data, t->dtype, t->numel, err);
    if (s)
        sp_err_prefix(err, "%s: tensor '%s': ", t->file, name);
    return s;
}

int sp_st_count(const sp_safetensors *st) { return st->nentries; }
const char *sp_st_name(const sp_safetensors *st, int i) { return i >= 0 && i < st->nentries ? st->entries[i].name : NULL; }
uint64_t sp_st_bytes_read(const sp_safetensors *st) { return st->bytes_read; }

int sp_st_files_mapped(const sp_safetensors *st)
{
    int n = 0;
    for (int i = 0; i < st->nfiles; i++)
        n += st->files[i].base != NULL;
    return n;
}

/* ---------------------------------------------------------------------------------------------- */
/* writer */

struct sp_st_writer {
    FILE *fp;
    char *path;
    uint64_t left; /* data bytes still to come */
};

static uint64_t wtensor_bytes(const sp_st_wtensor *t)
{
    uint64_t numel = 1;
    for (int d = 0; d < t->ndim; d++)
        numel *= (uint64_t)t->shape[d];
    return numel * sp_dtype_size(t->dtype);
}

/* The JSON header of tensors t[0..n) laid out in order (malloc'd), and the bytes of their data. */
static char *write_header(const sp_st_wtensor *t, int n, const char *metadata_json, const char *path,
                          uint64_t *data_bytes, sp_err *err)
{
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return sp_errf(err, SP_ERR_NOMEM, "out of memory"), NULL;
    if (metadata_json) {
        cJSON *meta = cJSON_Parse(metadata_json);
        if (!meta) {
            cJSON_Delete(root);
            return sp_errf(err, SP_ERR_ARG, "%s: metadata is not valid JSON", path), NULL;
        }
        cJSON_AddItemToObject(root, "__metadata__", meta);
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        cJSON *item = cJSON_AddObjectToObject(root, t[i].name);
        cJSON_AddStringToObject(item, "dtype", sp_dtype_name(t[i].dtype));
        cJSON *shape = cJSON_AddArrayToObject(item, "shape");
        for (int d = 0; d < t[i].ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t[i].shape[d]));
        uint64_t nb = wtensor_bytes(&t[i]);
        cJSON *offs = cJSON_AddArrayToObject(item, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + nb)));
        off += nb;
    }
    char *hdr = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!hdr)
        sp_errf(err, SP_ERR_NOMEM, "out of memory");
    *data_bytes = off;
    return hdr;
}

sp_status sp_st_writer_open(sp_st_writer **out, const char *path, const sp_st_wtensor *t, int n,
                            const char *metadata_json, sp_err *err)
{
    *out = NULL;
    uint64_t data = 0;
    char *hdr = write_header(t, n, metadata_json, path, &data, err);
    if (!hdr)
        return err ? err->code : SP_ERR_NOMEM;
    sp_st_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->path = xstrdup(path))) {
        free(w);
        free(hdr);
        return sp_errf(err, SP_ERR_NOMEM, "out of memory");
    }
    w->left = data;
    if (!(w->fp = fopen(path, "wb"))) {
        sp_status s = sp_errf(err, SP_ERR_IO, "%s: %s", path, strerror(errno));
        free(w->path);
        free(w);
        free(hdr);
        return s;
    }
    size_t hl = strlen(hdr), padded = (hl + 7) & ~(size_t)7; /* align the data section to 8 bytes */
    uint64_t hlen = padded;
    int ok = fwrite(&hlen, 8, 1, w->fp) == 1 && fwrite(hdr, 1, hl, w->fp) == hl;
    for (size_t i = hl; ok && i < padded; i++)
        ok = fputc(' ', w->fp) != EOF;
    free(hdr);
    *out = w;
    if (!ok) {
        sp_errf(err, SP_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        sp_st_writer_abort(w);
        *out = NULL;
        return SP_ERR_IO;
    }
    return SP_OK;
}

sp_status sp_st_writer_put(sp_st_writer *w, const void *data, size_t bytes, sp_err *err)
{
    if (bytes > w->left)
        return sp_errf(err, SP_ERR_ARG, "%s: %zu bytes more than the header's tensors hold", w->path, bytes);
    if (bytes && fwrite(data, 1, bytes, w->fp) != bytes)
        return sp_errf(err, SP_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
    w->left -= bytes;
    return SP_OK;
}

sp_status sp_st_writer_close(sp_st_writer *w, sp_err *err)
{
    if (!w)
        return SP_OK;
    sp_status s = SP_OK;
    if (w->left)
        s = sp_errf(err, SP_ERR_ARG, "%s: %llu bytes of tensor data missing", w->path, (unsigned long long)w->left);
    if (fclose(w->fp) != 0 && !s)
        s = sp_errf(err, SP_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
    w->fp = NULL;
    sp_st_writer_abort(w);
    return s;
}

void sp_st_writer_abort(sp_st_writer *w)
{
    if (!w)
        return;
    if (w->fp)
        fclose(w->fp);
    free(w->path);
    free(w);
}

sp_status sp_st_write(const char *path, const sp_st_wtensor *t, int n, const char *metadata_json, sp_err *err)
{
    sp_st_writer *w = NULL;
    sp_status s = sp_st_writer_open(&w, path, t, n, metadata_json, err);
    for (int i = 0; !s && i < n; i++)
        s = sp_st_writer_put(w, t[i].data, (size_t)wtensor_bytes(&t[i]), err);
    if (s) {
        sp_st_writer_abort(w);
        return s;
    }
    return sp_st_writer_close(w, err);
}
