/* hfdir.h - writing a Hugging Face model directory: the directory itself (and its parents), and its JSON files
 * (config.json, tokenizer.json, the shard index). What the llama2.c conversion and `model init` share. */
#ifndef SEPAL_HFDIR_H
#define SEPAL_HFDIR_H

#include <stddef.h>

#include "status.h"

typedef struct cJSON cJSON;

/* Creates dir and its missing parents (mkdir -p); SP_ERR_IO naming the part that failed, or dir when it is
 * not a directory. */
sp_status sp_hf_mkdir(const char *dir, sp_err *err);
/* dir/name into out (cap bytes); SP_ERR_ARG when it does not fit. */
sp_status sp_hf_path(char *out, size_t cap, const char *dir, const char *name, sp_err *err);
/* Writes root to dir/name (indented when pretty, with a final newline) and frees root, whatever happens. */
sp_status sp_hf_write_json(cJSON *root, const char *dir, const char *name, int pretty, sp_err *err);

/* Copies the file src to dir/name. */
sp_status sp_hf_copy(const char *src, const char *dir, const char *name, sp_err *err);

#endif
