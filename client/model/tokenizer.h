/* tokenizer.h - Hugging Face tokenizer.json (+ tokenizer_config.json) loader, encoder and decoder.
 *
 * Two kinds of model "BPE" are supported:
 *
 * SP_TOK_SPM_BPE, in the SentencePiece style of Llama 1/2 (normalizer Prepend "▁" + Replace " " -> "▁", or a
 * Metaspace pre-tokenizer; byte fallback to <0xXX> tokens). Encoding follows SentencePiece / llama2.c: the
 * text is split into UTF-8 characters, a character not in the vocab becomes its <0xXX> byte tokens, then the
 * adjacent pair whose merged piece ranks best is merged, leftmost first on ties. A merged piece's rank is that
 * of the first merge in "merges" producing it, so all splits of one piece tie (as in SentencePiece, where they
 * share the piece's score). Special tokens written in the text are not recognised (they encode as plain text).
 *
 * SP_TOK_BYTE_BPE, byte-level as in GPT-2 and Llama 3 (a ByteLevel pre-tokenizer). Special added tokens
 * ("special": true) written in the text are recognised first (leftmost, then longest) and the text around
 * them is pre-tokenized by the GPT-2 regex
 *     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * or, when a Split pre-tokenizer holds exactly it, the Llama-3 one (Qwen2's, with \p{N} for \p{N}{1,3},
 * too)
 *     (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * (hand-written matchers; \p{L} / \p{N} cover all Unicode 14.0 letters and numbers of planes 0-3, \s is
 * Unicode White_Space; other Split patterns are rejected as unsupported). Each pre-token's bytes are mapped
 * to characters by the GPT-2 byte <-> unicode table and merged pair by pair, the pair of the lowest-ranked
 * merge first, leftmost first on ties (as Hugging Face `tokenizers` does). The vocab must hold the 256
 * one-character byte pieces. ByteLevel add_prefix_space and model.ignore_merges are honoured. BOS comes from
 * tokenizer_config.json, else from a TemplateProcessing post_processor that starts with a special token.
 *
 * Decoding: special tokens produce no text. SentencePiece: "▁" -> " ", <0xXX> -> that byte, and one leading
 * space of the first piece after BOS (or at the very start) is dropped. Byte-level: each character maps back
 * to its byte. Output bytes are passed through as they are (no replacement of invalid UTF-8). */
#ifndef SEPAL_TOKENIZER_H
#define SEPAL_TOKENIZER_H

#include <stddef.h>

#include "status.h"

typedef struct sp_tokenizer sp_tokenizer;

typedef enum { SP_TOK_SPM_BPE, SP_TOK_BYTE_BPE } sp_tok_kind;

/* Loads dir/tokenizer.json (required) and dir/tokenizer_config.json (optional: without it BOS/EOS are "<s>" /
 * "</s>" when present, and BOS is added). Errors name the file at fault. */
sp_status sp_tokenizer_load(sp_tokenizer **out, const char *dir, sp_err *err);
void sp_tokenizer_free(sp_tokenizer *t);

sp_tok_kind sp_tokenizer_kind(const sp_tokenizer *t);
int sp_tokenizer_vocab_size(const sp_tokenizer *t); /* highest id + 1 */
int sp_tokenizer_bos(const sp_tokenizer *t);        /* -1 if none */
int sp_tokenizer_eos(const sp_tokenizer *t);        /* -1 if none */
const char *sp_tokenizer_piece(const sp_tokenizer *t, int id); /* NULL if out of range */

/* Encodes UTF-8 text; prepends BOS when add_special && add_bos_token (and appends EOS when add_special &&
 * add_eos_token). *ids is malloc'd (free it). */
sp_status sp_tokenizer_encode(const sp_tokenizer *t, const char *text, int add_special, int **ids, int *n,
                              sp_err *err);
/* Decodes ids into a malloc'd NUL-terminated string. An id outside the vocab is an SP_ERR_RANGE error. */
sp_status sp_tokenizer_decode(const sp_tokenizer *t, const int *ids, int n, char **text, sp_err *err);

/* Streaming decoder: feed ids one at a time and get the bytes that now form complete UTF-8 characters.
 * An incomplete UTF-8 sequence is held back until it completes or turns out invalid (then its bytes are
 * passed through). The concatenated output of sp_detok_push + sp_detok_flush equals sp_tokenizer_decode. */
typedef struct sp_detok {
    const sp_tokenizer *t;
    int prev;
    unsigned char pending[8];
    int npending;
    int at_start;
} sp_detok;

/* A buffer of SP_DETOK_BUF bytes always holds one push's output (pieces longer than 1000 bytes are rejected
 * at load). With a smaller cap the output is truncated. */
#define SP_DETOK_BUF 1024

void sp_detok_init(sp_detok *d, const sp_tokenizer *t);
/* Returns the bytes written to out (NUL-terminated if room). Ids outside the vocab produce nothing. */
size_t sp_detok_push(sp_detok *d, int id, char *out, size_t cap);
/* Emits whatever is still held back (an unfinished UTF-8 sequence at the end of the stream). */
size_t sp_detok_flush(sp_detok *d, char *out, size_t cap);

#endif
