/* chat.h - a chat's messages as the model's prompt: the chat template of the model's tokenizer_config.json
 * (rendered by jinja.h, as transformers' apply_chat_template renders it, with the generation prompt), or, for a
 * model without one, the plain template: the messages' contents, one after another, each on a line of its own,
 * without roles, encoded as `generate` encodes a prompt (BOS first), so that one user message is the prompt
 * `generate` would get. */
#ifndef SEPAL_CHAT_H
#define SEPAL_CHAT_H

#include <cJSON.h>
#include <stdint.h>

#include "status.h"
#include "tokenizer.h"

typedef struct sp_chat sp_chat;

/* Reads dir/tokenizer_config.json (none: the plain template): its chat_template (a string, or the one named
 * "default" of a list) and its special tokens' texts. A file that is not JSON, or a template that does not
 * parse, is an error naming the file. */
sp_status sp_chat_load(sp_chat **out, const char *dir, const sp_tokenizer *tok, sp_err *err);
void sp_chat_free(sp_chat *c);
/* "the chat template of tokenizer_config.json" or "no chat template: the plain one". */
const char *sp_chat_describe(const sp_chat *c);

/* The prompt's text for messages (a cJSON array of {"role", "content": string}), with the generation prompt
 * (*text malloc'd), and its ids (*ids malloc'd): special tokens written by the template (BOS, EOS) become their
 * ids whatever the tokenizer's kind. */
sp_status sp_chat_prompt(const sp_chat *c, const cJSON *messages, char **text, int32_t **ids, int *n, sp_err *err);

#endif
