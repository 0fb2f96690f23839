/* convert_llama2c.h - converts Karpathy llama2.c checkpoints (model.bin + tokenizer.bin) into a
 * Hugging Face Llama model directory: model.safetensors (F32), config.json, tokenizer.json,
 * tokenizer_config.json and generation_config.json. */
#ifndef SEPAL_CONVERT_LLAMA2C_H
#define SEPAL_CONVERT_LLAMA2C_H

#include "status.h"

/* Reads `model_bin` and `tokenizer_bin` (validating sizes against the header) and writes the model
 * into `outdir`, creating it (and missing parents) if needed. Existing files there are overwritten. */
sp_status sp_convert_llama2c(const char *model_bin, const char *tokenizer_bin, const char *outdir, sp_err *err);

#endif
