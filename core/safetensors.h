/* safetensors.h - reader (mmap; single file or sharded index; reads only the tensors asked for) and writers (a
 * file at once, or streamed).
 *
 * Format: 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets:[b,e]},
 * "__metadata__": {...}}, then the data section. Every offset, shape and dtype is validated before use:
 * offsets must lie inside the file, match dtype*shape, and tensors must not overlap. */
#ifndef SEPAL_SAFETENSORS_H
#define SEPAL_SAFETENSORS_H

#include <stdint.h>

#include "dtype.h"
#include "status.h"

#define SP_MAX_DIMS 8

typedef struct sp_st_tensor {
    const char *name;
    sp_dtype dtype;
    int ndim;
    int64_t shape[SP_MAX_DIMS];
    uint64_t numel;
    uint64_t nbytes;
    const void *data; /* points into the read-only mapping */
    const char *file; /* path of the file holding it */
} sp_st_tensor;

typedef struct sp_safetensors sp_safetensors;

/* Opens `path`: a .safetensors file, a model.safetensors.index.json, or a directory holding either
 * (model.safetensors.index.json is preferred over model.safetensors). Sharded files are mapped
 * lazily, when one of their tensors is first asked for. */
sp_status sp_st_open(sp_safetensors **out, const char *path, sp_err *err);
void sp_st_close(sp_safetensors *st);

/* Looks up a tensor by name; NULL (with err set, naming the file and tensor) if it is missing or
 * its shard cannot be opened. */
const sp_st_tensor *sp_st_get(sp_safetensors *st, const char *name, sp_err *err);
int sp_st_has(sp_safetensors *st, const char *name);
/* Gives back the memory of tensor `name`'s pages in the mapping (those wholly inside it; the file stays mapped and
 * a later read faults them in again): for a reader that has copied the tensor, so that what it read does not stay
 * resident in it. Nothing when the tensor is unknown or not mapped yet. */
void sp_st_release(sp_safetensors *st, const char *name);

/* Reads tensor `name` into dst as f32, after checking its shape equals shape[0..ndim). */
sp_status sp_st_read_f32(sp_safetensors *st, const char *name, float *dst, int ndim, const int64_t *shape,
                         sp_err *err);

/* A string of the file's __metadata__ (the first header read), or NULL. */
const char *sp_st_meta(const sp_safetensors *st, const char *key);

/* Number of tensor names known (from the index or the single header) and the i-th name. */
int sp_st_count(const sp_safetensors *st);
const char *sp_st_name(const sp_safetensors *st, int i);

/* Bytes of tensor data handed out through sp_st_get so far, and files mapped. */
uint64_t sp_st_bytes_read(const sp_safetensors *st);
int sp_st_files_mapped(const sp_safetensors *st);

/* Writer: one file, tensors in the order given. */
typedef struct sp_st_wtensor {
    const char *name;
    sp_dtype dtype;
    int ndim;
    int64_t shape[SP_MAX_DIMS];
    const void *data;
} sp_st_wtensor;

sp_status sp_st_write(const char *path, const sp_st_wtensor *t, int n, const char *metadata_json, sp_err *err);

/* Streaming writer of one file: the header from the tensors' names, dtypes and shapes (their data unused), then
 * their bytes in order, in pieces of any size (a model larger than memory). close checks that every byte came;
 * abort (also after a failed put) closes without that check, leaving the file for the caller to remove. */
typedef struct sp_st_writer sp_st_writer;
sp_status sp_st_writer_open(sp_st_writer **w, const char *path, const sp_st_wtensor *t, int n,
                            const char *metadata_json, sp_err *err);
sp_status sp_st_writer_put(sp_st_writer *w, const void *data, size_t bytes, sp_err *err);
sp_status sp_st_writer_close(sp_st_writer *w, sp_err *err);
void sp_st_writer_abort(sp_st_writer *w);

#endif
