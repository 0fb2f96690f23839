/* convert_llama2c.h - converts Karpathy llama2.c checkpoints (model.bin + tokenizer.bin) into a
 * Hugging Face Llama model directory: model.safetensors (F32), config.json, tokenizer.json,
 * tokenizer_config.json and generation_config.json. */
#ifndef SEPAL_CONVERT_LLAMA2C_H
#define SEPAL_CONVERT_LLAMA2C_H

#include <stdint.h>

#include "status.h"

/* Reads `model_bin` and `tokenizer_bin` (validating sizes against the header) and writes the model
 * into `outdir`, creating it (and missing parents) if needed. Existing files there are overwritten. */
sp_status sp_convert_llama2c(const char *model_bin, const char *tokenizer_bin, const char *outdir, sp_err *err);

/* Writes a Llama tokenizer into outdir, as the conversion does: tokenizer.json (SentencePiece BPE with byte
 * fallback, as transformers' LlamaTokenizerFast reads it; every split of a piece into two pieces is a merge,
 * ranked by the piece's score), tokenizer_config.json (model_max_length max_len) and generation_config.json.
 * pieces: <unk>, <s>, </s>, the byte tokens <0x00>..<0xFF>, then n - 259 unique pieces in HF spelling (U+2581
 * for a space); they and scores stay the caller's. */
sp_status sp_spm_tokenizer_write(char *const *pieces, const float *scores, int n, int max_len, const char *outdir,
                                 sp_err *err);
/* Only its tokenizer_config.json and generation_config.json (<s> 1, </s> 2), beside a tokenizer.json copied. */
sp_status sp_spm_tokenizer_configs_write(int64_t max_len, const char *outdir, sp_err *err);

#endif
