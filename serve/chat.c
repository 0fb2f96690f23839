/* chat.c - messages into a prompt (chat.h): the model's chat template, or the plain one. */
#include "chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja.h"

struct sp_chat {
    const sp_tokenizer *tok;
    char *tmpl;   /* NULL: the plain template */
    cJSON *vars;  /* bos_token, eos_token, unk_token, pad_token: the template's variables besides the messages */
};

static char *read_file(const char *path, sp_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (size_t n = 1; n;) {
        if (len + 4096 + 1 > cap) {
            char *b = realloc(buf, cap = 2 * cap + 8192);
            if (!b) {
                free(buf);
                fclose(f);
                sp_errf(err, SP_ERR_NOMEM, "out of memory");
                return NULL;
            }
            buf = b;
        }
        len += n = fread(buf + len, 1, 4096, f);
    }
    fclose(f);
    buf[len] = 0;
    return buf;
}

/* A special token's text: "<s>", or an AddedToken's {"content": "<s>", ...}; NULL when none. */
static const char *token_text(const cJSON *cfg, const char *name)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(cfg, name);
    if (cJSON_IsObject(t))
        t = cJSON_GetObjectItemCaseSensitive(t, "content");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

/* The template of cfg: chat_template as a string, or the entry named "default" of a list of {name, template}. */
static const char *template_of(const cJSON *cfg)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template"), *e;
    if (cJSON_IsString(t))
        return t->valuestring;
    const cJSON *list = cJSON_IsArray(t) ? t : NULL;
    cJSON_ArrayForEach(e, list)
    {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
        const cJSON *body = cJSON_GetObjectItemCaseSensitive(e, "template");
        if (cJSON_IsString(name) && !strcmp(name->valuestring, "default") && cJSON_IsString(body))
            return body->valuestring;
    }
    return NULL;
}

sp_status sp_chat_load(sp_chat **out, const char *dir, const sp_tokenizer *tok, sp_err *err)
{
    *out = NULL;
    sp_chat *c = calloc(1, sizeof *c);
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    sp_err ferr = {0};
    char *text = c ? read_file(path, &ferr) : NULL;
    cJSON *cfg = text ? cJSON_Parse(text) : NULL;
    int had = text != NULL;
    free(text);
    if (!c || ferr.code)
        return free(c), sp_errf(err, SP_ERR_NOMEM, "out of memory");
    if (had && !cfg)
        return free(c), sp_errf(err, SP_ERR_FORMAT, "%s: not JSON", path);
    c->tok = tok;
    c->vars = cJSON_CreateObject();
    const char *names[] = {"bos_token", "eos_token", "unk_token", "pad_token"};
    for (int i = 0; i < 4; i++) {
        const char *v = token_text(cfg, names[i]);
        if (v)
            cJSON_AddStringToObject(c->vars, names[i], v);
    }
    const char *tmpl = template_of(cfg);
    c->tmpl = tmpl ? strdup(tmpl) : NULL;
    cJSON_Delete(cfg);
    *out = c;
    if (!tmpl)
        return SP_OK;
    /* a template outside the subset is refused now, not at the first request */
    cJSON *probe = cJSON_Parse("[{\"role\":\"user\",\"content\":\"hi\"}]");
    char *t = NULL;
    int32_t *ids = NULL;
    int n;
    sp_status st = sp_chat_prompt(c, probe, &t, &ids, &n, err);
    cJSON_Delete(probe);
    free(t);
    free(ids);
    if (st) {
        sp_err_prefix(err, "%s: ", path);
        sp_chat_free(c);
        *out = NULL;
    }
    return st;
}

void sp_chat_free(sp_chat *c)
{
    if (!c)
        return;
    free(c->tmpl);
    cJSON_Delete(c->vars);
    free(c);
}

const char *sp_chat_describe(const sp_chat *c)
{
    return c->tmpl ? "the chat template of tokenizer_config.json" : "no chat template: the plain one";
}

/* Appends the ids of text[0..len) (no special tokens added) to *ids. */
static sp_status append(const sp_tokenizer *tok, const char *text, size_t len, int add_special, int32_t **ids, int *n,
                        sp_err *err)
{
    char *piece = strndup(text, len);
    int *got = NULL, k = 0;
    sp_status st = piece ? sp_tokenizer_encode(tok, piece, add_special, &got, &k, err)
                         : sp_errf(err, SP_ERR_NOMEM, "out of memory");
    free(piece);
    int32_t *grown = st ? NULL : realloc(*ids, (size_t)(*n + k + 1) * sizeof **ids);
    if (!st && !grown)
        st = sp_errf(err, SP_ERR_NOMEM, "out of memory");
    for (int i = 0; !st && i < k; i++)
        grown[*n + i] = got[i];
    if (!st) {
        *ids = grown;
        *n += k;
    }
    free(got);
    return st;
}

/* The special token (BOS or EOS, as the tokenizer names them) that text starts with: its id and length. */
static int special_at(const sp_tokenizer *tok, const char *text, size_t *len)
{
    int sp[2] = {sp_tokenizer_bos(tok), sp_tokenizer_eos(tok)};
    for (int i = 0; i < 2; i++) {
        const char *piece = sp[i] >= 0 ? sp_tokenizer_piece(tok, sp[i]) : NULL;
        if (piece && *piece && !strncmp(text, piece, strlen(piece))) {
            *len = strlen(piece);
            return sp[i];
        }
    }
    return -1;
}

/* A rendered template's ids: the text between BOS and EOS texts encoded without special tokens (a byte-level
 * tokenizer finds its special tokens itself; a SentencePiece one is told here). */
static sp_status encode_rendered(const sp_tokenizer *tok, const char *text, int32_t **ids, int *n, sp_err *err)
{
    *ids = NULL;
    *n = 0;
    if (sp_tokenizer_kind(tok) == SP_TOK_BYTE_BPE)
        return append(tok, text, strlen(text), 0, ids, n, err);
    sp_status st = SP_OK;
    const char *run = text;
    for (const char *p = text; !st && *p;) {
        size_t len;
        int id = special_at(tok, p, &len);
        if (id < 0) {
            p++;
            continue;
        }
        if (p > run)
            st = append(tok, run, (size_t)(p - run), 0, ids, n, err);
        int32_t *grown = st ? NULL : realloc(*ids, (size_t)(*n + 1) * sizeof **ids);
        if (!st && !grown)
            st = sp_errf(err, SP_ERR_NOMEM, "out of memory");
        if (!st) {
            *ids = grown;
            (*ids)[(*n)++] = id;
        }
        p += len;
        run = p;
    }
    if (!st && *run)
        st = append(tok, run, strlen(run), 0, ids, n, err);
    return st;
}

/* The plain template: each message's content on a line of its own. */
static char *plain(const cJSON *messages)
{
    size_t len = 1;
    const cJSON *m;
    cJSON_ArrayForEach(m, messages) len += strlen(cJSON_GetObjectItemCaseSensitive(m, "content")->valuestring) + 1;
    char *out = malloc(len), *p = out;
    if (!out)
        return NULL;
    cJSON_ArrayForEach(m, messages)
    {
        const char *s = cJSON_GetObjectItemCaseSensitive(m, "content")->valuestring;
        p += sprintf(p, "%s%s", p > out ? "\n" : "", s);
    }
    *p = 0;
    return out;
}

sp_status sp_chat_prompt(const sp_chat *c, const cJSON *messages, char **text, int32_t **ids, int *n, sp_err *err)
{
    *text = NULL;
    *ids = NULL;
    *n = 0;
    if (!c->tmpl) {
        if (!(*text = plain(messages)))
            return sp_errf(err, SP_ERR_NOMEM, "out of memory");
        return append(c->tok, *text, strlen(*text), 1, ids, n, err); /* as `generate` encodes a prompt */
    }
    cJSON *ctx = cJSON_Duplicate(c->vars, 1);
    cJSON_AddItemToObject(ctx, "messages", cJSON_Duplicate(messages, 1));
    cJSON_AddTrueToObject(ctx, "add_generation_prompt");
    sp_status st = sp_jinja_render(c->tmpl, ctx, text, err);
    cJSON_Delete(ctx);
    if (!st)
        st = encode_rendered(c->tok, *text, ids, n, err);
    if (st) {
        free(*text);
        free(*ids);
        *text = NULL;
        *ids = NULL;
    }
    return st;
}
