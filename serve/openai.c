/* openai.c - POST /v1/completions and /v1/chat/completions: the request's JSON checked into generation options
 * (400 naming the parameter at fault), the prompt (text, token ids, or a chat rendered by the model's template),
 * a generation through the swarm as an inference session of its own, and the answer in OpenAI's shape, whole or
 * streamed as server-sent events (`data: {...}` chunks, then `data: [DONE]`). With stop strings a stream holds
 * back the text that may turn out to be the start of one, so that no stop string is ever sent. */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rng.h"
#include "serve_impl.h"

#define MAX_ROWS 16 /* prompts x n */
#define MAX_STOP 4

typedef struct oai {
    int chat, stream, usage, n, nprompts, rows;
    int32_t **prompt; /* [nprompts] */
    int *len;
    sp_gen_opts o;
    const char *stop[MAX_STOP + 1]; /* NULL-terminated; the strings live in root */
    unsigned long long seed;
    cJSON *root;
    char id[48];
} oai;

static void oai_free(oai *p)
{
    for (int i = 0; p->prompt && i < p->nprompts; i++)
        free(p->prompt[i]);
    free(p->prompt);
    free(p->len);
    cJSON_Delete(p->root);
}

/* ---------------------------------------------------------------------------------------------- */
/* parameters */

static const cJSON *field(const cJSON *root, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    return cJSON_IsNull(v) ? NULL : v;
}

/* A number field in [min, max] (an integer when integer): 1 given, 0 absent, -1 refused (answered). */
static int num(srv_req *q, const cJSON *root, const char *name, double min, double max, int integer, double *v)
{
    const cJSON *f = field(root, name);
    if (!f)
        return 0;
    double d = cJSON_IsNumber(f) ? f->valuedouble : NAN;
    if (!isfinite(d) || d < min || d > max || (integer && d != floor(d)))
        return srv_error(q, 400, NULL, name, "invalid_value", "'%s' must be %s in [%g, %g]", name,
                         integer ? "an integer" : "a number", min, max);
    *v = d;
    return 1;
}

/* A boolean field: 1 given, 0 absent, -1 refused. */
static int flag(srv_req *q, const cJSON *root, const char *name, int *v)
{
    const cJSON *f = field(root, name);
    if (!f)
        return 0;
    if (!cJSON_IsBool(f))
        return srv_error(q, 400, NULL, name, "invalid_type", "'%s' must be true or false", name);
    *v = cJSON_IsTrue(f);
    return 1;
}

/* Parameters of the API this endpoint does not implement: refused when they would change the answer. */
static int unsupported(srv_req *q, const cJSON *root)
{
    static const char *const never[] = {"suffix", "tools", "functions", "logit_bias", "audio", "prediction"};
    for (size_t i = 0; i < sizeof never / sizeof *never; i++) {
        const cJSON *f = field(root, never[i]);
        if (f && !(cJSON_IsArray(f) || cJSON_IsObject(f) ? cJSON_GetArraySize(f) == 0 : cJSON_IsString(f) && !*f->valuestring))
            return srv_error(q, 400, NULL, never[i], "unsupported_parameter", "'%s' is not supported", never[i]);
    }
    const cJSON *f = field(root, "logprobs");
    if (f && !cJSON_IsFalse(f))
        return srv_error(q, 400, NULL, "logprobs", "unsupported_parameter", "'logprobs' is not supported");
    if ((f = field(root, "echo")) && cJSON_IsTrue(f))
        return srv_error(q, 400, NULL, "echo", "unsupported_parameter", "'echo' is not supported");
    const cJSON *rf = field(root, "response_format"), *type = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (rf && !(cJSON_IsString(type) && !strcmp(type->valuestring, "text")))
        return srv_error(q, 400, NULL, "response_format", "unsupported_parameter",
                         "'response_format' other than text is not supported");
    static const char *const penalties[] = {"presence_penalty", "frequency_penalty"};
    for (int i = 0; i < 2; i++) {
        double v = 0;
        int got = num(q, root, penalties[i], -2, 2, 0, &v);
        if (got < 0)
            return -1;
        if (v != 0)
            return srv_error(q, 400, NULL, penalties[i], "unsupported_parameter",
                             "'%s' is not supported (repetition_penalty is)", penalties[i]);
    }
    double best = 1;
    if (num(q, root, "best_of", 1, 1, 1, &best) < 0)
        return -1;
    return 0;
}

/* stop: a string or up to four of them. */
static int stops(srv_req *q, const cJSON *root, oai *p)
{
    const cJSON *f = field(root, "stop"), *e;
    int k = 0;
    if (cJSON_IsString(f) && *f->valuestring)
        p->stop[k++] = f->valuestring;
    else if (cJSON_IsArray(f) && cJSON_GetArraySize(f) <= MAX_STOP) {
        cJSON_ArrayForEach(e, f)
        {
            if (!cJSON_IsString(e))
                return srv_error(q, 400, NULL, "stop", "invalid_type", "'stop' must be a string or up to 4 strings");
            if (*e->valuestring)
                p->stop[k++] = e->valuestring;
        }
    } else if (f && !cJSON_IsString(f)) {
        return srv_error(q, 400, NULL, "stop", "invalid_type", "'stop' must be a string or up to 4 strings");
    }
    p->stop[k] = NULL;
    p->o.stop = k ? p->stop : NULL;
    return 0;
}

/* The sampling and length parameters, the session's settings where the request says nothing. */
static int sampling(srv_req *q, const cJSON *root, oai *p)
{
    const srv_defaults *d = &q->s->def;
    sp_gen_opts *o = &p->o;
    sp_gen_opts_default(o);
    double max_new = d->max_new, temp = d->temperature, top_p = d->top_p, top_k = d->top_k,
           rep = d->repetition_penalty, min_new = d->min_new, n = 1, seed = 0;
    int ignore_eos = d->ignore_eos, got_seed;
    if (num(q, root, "max_tokens", 1, 1e6, 1, &max_new) < 0 ||
        (p->chat && num(q, root, "max_completion_tokens", 1, 1e6, 1, &max_new) < 0) ||
        num(q, root, "temperature", 0, 2, 0, &temp) < 0 || num(q, root, "top_p", 0, 1, 0, &top_p) < 0 ||
        num(q, root, "top_k", 0, 1e6, 1, &top_k) < 0 || num(q, root, "repetition_penalty", 0.01, 10, 0, &rep) < 0 ||
        num(q, root, "min_tokens", 0, 1e6, 1, &min_new) < 0 || num(q, root, "n", 1, MAX_ROWS, 1, &n) < 0 ||
        (got_seed = num(q, root, "seed", -9.2e18, 1.8e19, 1, &seed)) < 0 || flag(q, root, "ignore_eos", &ignore_eos) < 0)
        return -1;
    o->max_new = (int)max_new;
    o->sample.temperature = top_p > 0 ? (float)temp : 0.0f; /* top_p 0: only the likeliest token */
    o->sample.top_p = top_p > 0 ? (float)top_p : 1.0f;
    o->sample.top_k = (int)top_k;
    o->sample.repetition_penalty = (float)rep;
    o->min_new = (int)min_new;
    o->stop_at_eos = !ignore_eos;
    p->n = (int)n;
    p->seed = got_seed ? (unsigned long long)(long long)seed : d->seed_random ? sp_rng_fresh_seed() : d->seed;
    o->sample.seed = p->seed;
    o->eos_id = q->s->cfg->eos_id;
    o->bos_id = q->s->cfg->bos_id;
    return stops(q, root, p);
}

/* ---------------------------------------------------------------------------------------------- */
/* prompts */

static int add_prompt(srv_req *q, oai *p, int32_t *ids, int n)
{
    int32_t **pp = realloc(p->prompt, (size_t)(p->nprompts + 1) * sizeof *pp);
    int *lp = pp ? realloc(p->len, (size_t)(p->nprompts + 1) * sizeof *lp) : NULL;
    if (pp)
        p->prompt = pp;
    if (lp)
        p->len = lp;
    if (!pp || !lp)
        return free(ids), srv_error(q, 500, NULL, NULL, NULL, "out of memory");
    p->prompt[p->nprompts] = ids;
    p->len[p->nprompts++] = n;
    return 0;
}

/* A prompt's text, encoded as `generate` encodes it (BOS first). */
static int text_prompt(srv_req *q, oai *p, const char *text)
{
    int *raw = NULL, n = 0;
    sp_err err = {0};
    if (sp_tokenizer_encode(q->s->tok, text, 1, &raw, &n, &err))
        return srv_error(q, 400, NULL, "prompt", NULL, "prompt: %s", err.msg);
    int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    for (int i = 0; ids && i < n; i++)
        ids[i] = raw[i];
    free(raw);
    return ids ? add_prompt(q, p, ids, n) : srv_error(q, 500, NULL, NULL, NULL, "out of memory");
}

/* A prompt of token ids (each in the vocabulary). */
static int ids_prompt(srv_req *q, oai *p, const cJSON *a)
{
    int n = cJSON_GetArraySize(a), i = 0, V = q->s->cfg->vocab;
    int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    if (!ids)
        return srv_error(q, 500, NULL, NULL, NULL, "out of memory");
    const cJSON *e;
    cJSON_ArrayForEach(e, a)
    {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 || e->valuedouble >= V)
            return free(ids), srv_error(q, 400, NULL, "prompt", "invalid_value",
                                        "prompt: token ids must be integers in [0, %d)", V);
        ids[i++] = (int32_t)e->valuedouble;
    }
    return add_prompt(q, p, ids, n);
}

/* prompt: a string, strings, token ids, or lists of token ids. */
static int prompts(srv_req *q, const cJSON *root, oai *p)
{
    const cJSON *f = field(root, "prompt"), *e;
    if (cJSON_IsString(f))
        return text_prompt(q, p, f->valuestring);
    if (!cJSON_IsArray(f) || !cJSON_GetArraySize(f))
        return srv_error(q, 400, NULL, "prompt", "invalid_type",
                         "'prompt' must be a string, strings, token ids or lists of token ids");
    if (cJSON_IsNumber(f->child))
        return ids_prompt(q, p, f);
    cJSON_ArrayForEach(e, f)
    {
        int bad = cJSON_IsString(e) ? text_prompt(q, p, e->valuestring)
                  : cJSON_IsArray(e) && cJSON_GetArraySize(e) ? ids_prompt(q, p, e)
                                                              : srv_error(q, 400, NULL, "prompt", "invalid_type",
                                                                          "'prompt' must be a string, strings, token "
                                                                          "ids or lists of token ids");
        if (bad)
            return -1;
    }
    return 0;
}

/* A message's content as text: a string, or parts of type text (joined). NULL content: "". */
static int content_text(srv_req *q, const cJSON *c, cJSON **out)
{
    if (!c || cJSON_IsNull(c) || cJSON_IsString(c)) {
        *out = cJSON_CreateString(cJSON_IsString(c) ? c->valuestring : "");
        return 0;
    }
    if (!cJSON_IsArray(c))
        return srv_error(q, 400, NULL, "messages", "invalid_type", "a message's content must be a string or parts");
    size_t len = 1;
    const cJSON *part;
    cJSON_ArrayForEach(part, c)
    {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type"), *t = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(t))
            return srv_error(q, 400, NULL, "messages", "unsupported_content", "only text content parts are supported");
        len += strlen(t->valuestring);
    }
    char *s = malloc(len);
    if (!s)
        return srv_error(q, 500, NULL, NULL, NULL, "out of memory");
    s[0] = 0;
    cJSON_ArrayForEach(part, c) strcat(s, cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring);
    *out = cJSON_CreateString(s);
    free(s);
    return 0;
}

/* messages -> [{role, content: text}] -> the chat template -> the prompt. */
static int chat_prompt(srv_req *q, const cJSON *root, oai *p)
{
    const cJSON *f = field(root, "messages"), *m;
    if (!cJSON_IsArray(f) || !cJSON_GetArraySize(f))
        return srv_error(q, 400, NULL, "messages", "invalid_type", "'messages' must be a non-empty array");
    cJSON *msgs = cJSON_CreateArray();
    cJSON_ArrayForEach(m, f)
    {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        cJSON *text = NULL;
        if (!cJSON_IsString(role) || !*role->valuestring) {
            cJSON_Delete(msgs);
            return srv_error(q, 400, NULL, "messages", "invalid_type", "every message needs a 'role'");
        }
        if (content_text(q, cJSON_GetObjectItemCaseSensitive(m, "content"), &text))
            return cJSON_Delete(msgs), -1;
        cJSON *one = cJSON_CreateObject();
        cJSON_AddStringToObject(one, "role", role->valuestring);
        cJSON_AddItemToObject(one, "content", text);
        cJSON_AddItemToArray(msgs, one);
    }
    char *text = NULL;
    int32_t *ids = NULL;
    int n = 0;
    sp_err err = {0};
    sp_status st = sp_chat_prompt(q->s->chat, msgs, &text, &ids, &n, &err);
    cJSON_Delete(msgs);
    free(text);
    if (st)
        return srv_error(q, 400, NULL, "messages", NULL, "%s", err.msg);
    return add_prompt(q, p, ids, n);
}

/* ---------------------------------------------------------------------------------------------- */
/* answers */

/* The envelope of an answer or a chunk: id, object, created, model, and an empty choices. */
static cJSON *envelope(const srv_req *q, const oai *p, int chunk, cJSON **choices)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", p->id);
    cJSON_AddStringToObject(root, "object",
                            p->chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion");
    cJSON_AddNumberToObject(root, "created", (double)q->s->created);
    cJSON_AddStringToObject(root, "model", q->s->model);
    if (p->chat)
        cJSON_AddNullToObject(root, "system_fingerprint");
    *choices = cJSON_AddArrayToObject(root, "choices");
    return root;
}

/* A choice: text (a completion), a message (a chat answer) or a delta (a chat chunk; role: the first). */
static void add_choice(const oai *p, cJSON *choices, int index, const char *text, const char *finish, int chunk,
                       int role)
{
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", index);
    if (!p->chat) {
        cJSON_AddStringToObject(c, "text", text ? text : "");
    } else {
        cJSON *m = cJSON_AddObjectToObject(c, chunk ? "delta" : "message");
        if (role || !chunk)
            cJSON_AddStringToObject(m, "role", "assistant");
        if (text)
            cJSON_AddStringToObject(m, "content", text);
    }
    cJSON_AddNullToObject(c, "logprobs");
    if (finish)
        cJSON_AddStringToObject(c, "finish_reason", finish);
    else
        cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToArray(choices, c);
}

static void add_usage(cJSON *root, int prompt, int completion)
{
    cJSON *u = cJSON_AddObjectToObject(root, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", completion);
    cJSON_AddNumberToObject(u, "total_tokens", prompt + completion);
}

/* One server-sent event `data: JSON` (root is freed): 0, or -1 when the peer is gone. */
static int sse(srv_req *q, cJSON *root)
{
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!text)
        return -1;
    size_t n = strlen(text);
    char *ev = malloc(n + 9);
    int rc = -1;
    if (ev) {
        memcpy(ev, "data: ", 6);
        memcpy(ev + 6, text, n);
        memcpy(ev + 6 + n, "\n\n", 3);
        rc = sp_http_stream_write(q->c, ev, n + 8);
    }
    free(ev);
    free(text);
    return rc;
}

/* ---------------------------------------------------------------------------------------------- */
/* streaming */

typedef struct row_text {
    char *acc;        /* the row's text so far */
    size_t len, cap, sent;
    int done;         /* a stop string was found: nothing more is sent */
} row_text;

typedef struct stream_st {
    srv_req *q;
    oai *p;
    row_text *row;
    int gone;         /* the peer left, or serving stops */
} stream_st;

/* How much of a row's text can be sent: all of it without stop strings; else up to the first stop string found,
 * or up to the longest end of the text that could still begin one. */
static size_t safe_len(const oai *p, row_text *t)
{
    if (!p->o.stop)
        return t->len;
    size_t safe = t->len;
    for (int i = 0; p->stop[i]; i++) {
        const char *hit = strstr(t->acc, p->stop[i]);
        if (hit && (size_t)(hit - t->acc) < safe) {
            safe = (size_t)(hit - t->acc);
            t->done = 1;
        }
    }
    for (int i = 0; !t->done && p->stop[i]; i++) {
        size_t sl = strlen(p->stop[i]);
        for (size_t k = sl - 1; k > 0; k--)
            if (k <= t->len && !strncmp(t->acc + t->len - k, p->stop[i], k)) {
                if (t->len - k < safe)
                    safe = t->len - k;
                break;
            }
    }
    return safe < t->sent ? t->sent : safe;
}

/* Sends row's text from what was sent up to `upto` as a chunk. */
static int send_delta(stream_st *st, int row, size_t upto, int role)
{
    row_text *t = &st->row[row];
    if (upto <= t->sent && !role)
        return 0;
    char *piece = strndup(t->acc + t->sent, upto - t->sent);
    cJSON *choices, *root = envelope(st->q, st->p, 1, &choices);
    add_choice(st->p, choices, row, piece ? piece : "", NULL, 1, role);
    free(piece);
    t->sent = upto;
    return sse(st->q, root);
}

static int on_token(int row, int token, const char *text, void *user)
{
    (void)token;
    stream_st *st = user;
    srv_req *q = st->q;
    q->new_tokens++;
    if (sp_http_stopping(q->c) || (!q->stream && (q->new_tokens & 7) == 0 && sp_http_peer_gone(q->c)))
        return st->gone = 1;
    if (!q->stream || !text || !*text)
        return 0;
    row_text *t = &st->row[row];
    size_t n = strlen(text);
    if (t->done)
        return 0;
    if (t->len + n + 1 > t->cap) {
        char *a = realloc(t->acc, t->cap = 2 * (t->len + n + 1));
        if (!a)
            return st->gone = 1;
        t->acc = a;
    }
    memcpy(t->acc + t->len, text, n + 1);
    t->len += n;
    if (send_delta(st, row, safe_len(st->p, t), 0))
        return st->gone = 1;
    return 0;
}

static const char *finish_reason(const oai *p, const sp_gen_result *r, int row)
{
    return r->n[row] >= p->o.max_new ? "length" : "stop";
}

/* The end of a stream: each row's held-back rest (the generator's text is final: cut before any stop string),
 * each row's finish reason, the usage when asked, [DONE]. */
static void stream_end(stream_st *st, const sp_gen_result *r)
{
    oai *p = st->p;
    for (int i = 0; i < p->rows; i++) {
        row_text *t = &st->row[i];
        size_t full = strlen(r->text[i]);
        if (full > t->sent && (!t->acc || t->sent <= t->len)) {
            free(t->acc);
            t->acc = strdup(r->text[i]);
            t->len = full;
            if (t->acc)
                send_delta(st, i, full, 0);
        }
        cJSON *choices, *root = envelope(st->q, p, 1, &choices);
        add_choice(p, choices, i, p->chat ? NULL : "", finish_reason(p, r, i), 1, 0);
        sse(st->q, root);
    }
    if (p->usage) {
        cJSON *choices, *root = envelope(st->q, p, 1, &choices);
        add_usage(root, st->q->prompt_tokens, st->q->new_tokens);
        sse(st->q, root);
    }
    sp_http_stream_write(st->q->c, "data: [DONE]\n\n", 14);
}

/* An error after the stream began: an event holding it (OpenAI's clients raise it), and the end. */
static void stream_error(srv_req *q, int status, const char *code, const char *msg)
{
    char body[1024];
    size_t n = srv_error_json(status, NULL, NULL, code, msg, body, sizeof body);
    char ev[1100];
    int k = snprintf(ev, sizeof ev, "data: %.*s\n\n", (int)n, body);
    sp_http_stream_write(q->c, ev, (size_t)k);
    q->status = status;
    snprintf(q->why, sizeof q->why, "%s", msg);
}

/* ---------------------------------------------------------------------------------------------- */
/* generation */

static void answer_whole(srv_req *q, oai *p, const sp_gen_result *r)
{
    cJSON *choices, *root = envelope(q, p, 0, &choices);
    for (int i = 0; i < p->rows; i++)
        add_choice(p, choices, i, r->text[i], finish_reason(p, r, i), 0, 0);
    add_usage(root, q->prompt_tokens, q->new_tokens);
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    q->status = 200;
    if (text)
        sp_http_respond(q->c, 200, "application/json", NULL, text, strlen(text));
    else
        srv_error(q, 500, NULL, NULL, NULL, "out of memory");
    free(text);
}

static int status_of(sp_status st)
{
    return st == SP_ERR_ARG || st == SP_ERR_RANGE ? 400 : st == SP_ERR_NOMEM ? 500 : 503;
}

/* Checks the prompts against the context (max_tokens clamped, as `generate` clamps it). */
static int fits(srv_req *q, oai *p, int ctx)
{
    for (int i = 0; i < p->nprompts; i++) {
        if (p->len[i] > ctx)
            return srv_error(q, 400, NULL, p->chat ? "messages" : "prompt", "context_length_exceeded",
                             "the prompt has %d tokens, more than the model's context of %d", p->len[i], ctx);
        if (!p->len[i])
            return srv_error(q, 400, NULL, "prompt", "invalid_value", "the prompt is empty");
        if (p->len[i] + p->o.max_new - 1 > ctx)
            p->o.max_new = ctx - p->len[i] + 1;
        q->prompt_tokens += p->len[i];
    }
    if ((p->rows = p->nprompts * p->n) > MAX_ROWS)
        return srv_error(q, 400, NULL, "n", "invalid_value", "prompts x n is %d, more than %d", p->rows, MAX_ROWS);
    return 0;
}

static void generate(srv_req *q, oai *p)
{
    sp_srv *s = q->s;
    sp_lm_swarm sw;
    sp_lm lm = sp_lm_swarm_make(&sw, s->rt);
    if (fits(q, p, lm.max_pos))
        return;
    if (!sp_runtime_server_count(s->rt)) {
        srv_error(q, 503, NULL, NULL, "no_route", "no servers (swarm up N, or connect, in the session)");
        return;
    }
    const int32_t *rows[MAX_ROWS];
    int lens[MAX_ROWS];
    for (int i = 0; i < p->rows; i++)
        rows[i] = p->prompt[i / p->n], lens[i] = p->len[i / p->n];
    if (srv_turn(q))
        return;
    row_text rt[MAX_ROWS] = {0};
    stream_st st = {.q = q, .p = p, .row = rt};
    p->o.cancel = &s->app->cancel; /* Ctrl-C */
    if (p->stream && !sp_http_stream_begin(q->c, 200, "text/event-stream", NULL))
        for (int i = 0; p->chat && i < p->rows; i++)
            send_delta(&st, i, 0, 1); /* the role first, as OpenAI streams it */
    q->status = 200;
    sp_gen_result r;
    sp_err err = {0};
    sp_status rc = sp_generate(&lm, s->tok, rows, lens, p->rows, &p->o, on_token, &st, &r, &err);
    srv_turn_end(q);
    q->gen_s = rc ? 0 : r.seconds;
    q->new_tokens = 0;
    for (int i = 0; !rc && i < p->rows; i++)
        q->new_tokens += r.n[i];
    int stopped = !rc && (st.gone || r.stop_reason == SP_GEN_STOP_CANCELLED);
    const char *why = rc ? err.msg : "the endpoint is stopping";
    if (p->stream && (rc || stopped))
        stream_error(q, rc ? status_of(rc) : 503, rc ? "generation_failed" : "shutting_down", why);
    else if (p->stream)
        stream_end(&st, &r);
    else if (rc || stopped)
        srv_error(q, rc ? status_of(rc) : 503, NULL, NULL, rc ? "generation_failed" : "shutting_down", "%s", why);
    else
        answer_whole(q, p, &r);
    for (int i = 0; i < MAX_ROWS; i++)
        free(rt[i].acc);
    if (!rc)
        sp_gen_result_free(&r);
}

void srv_completions(srv_req *q, int chat)
{
    oai p = {.chat = chat};
    p.root = cJSON_ParseWithLength(q->r->body, q->r->body_len);
    if (!cJSON_IsObject(p.root)) {
        srv_error(q, 400, NULL, NULL, "invalid_json", "the body is not a JSON object");
        return oai_free(&p);
    }
    const cJSON *model = field(p.root, "model");
    int stream = 0, usage = 0;
    const cJSON *so = field(p.root, "stream_options");
    if (model && !cJSON_IsString(model))
        srv_error(q, 400, NULL, "model", "invalid_type", "'model' must be a string");
    else if (model && strcmp(model->valuestring, q->s->model))
        srv_error(q, 404, "invalid_request_error", "model", "model_not_found",
                  "The model '%.100s' does not exist (this endpoint serves %s)", model->valuestring, q->s->model);
    else if (unsupported(q, p.root) || flag(q, p.root, "stream", &stream) < 0 || flag(q, so, "include_usage", &usage) < 0 ||
             sampling(q, p.root, &p) || (chat ? chat_prompt(q, p.root, &p) : prompts(q, p.root, &p)))
        ; /* answered */
    else {
        p.stream = q->stream = stream;
        p.usage = usage;
        snprintf(p.id, sizeof p.id, "%s-%lx%06lx", chat ? "chatcmpl" : "cmpl", q->s->created, q->id);
        generate(q, &p);
    }
    oai_free(&p);
}
