/* serve_impl.h - what the HTTP front end's files share (not a public header): the endpoint's state, one request
 * being answered, and the OpenAI-shaped answers. serve.c: the life cycle, routes, the token, the turns and the
 * log; openai.c: the completions; chat.c: the chat template. */
#ifndef SEPAL_SERVE_IMPL_H
#define SEPAL_SERVE_IMPL_H

#include <pthread.h>

#include "app.h"
#include "chat.h"
#include "http.h"
#include "runtime.h"

/* What a request leaves out: the settings when serving started (`show`). */
typedef struct srv_defaults {
    int max_new, top_k, min_new, ignore_eos;
    float temperature, top_p, repetition_penalty;
    int seed_random;
    unsigned long long seed;
} srv_defaults;

typedef struct sp_srv {
    sp_app *app;
    sp_runtime *rt;
    const sp_tokenizer *tok;
    const sp_config *cfg;
    char model[256];       /* the id requests name it by */
    char api_key[512];     /* "" none */
    long created;          /* when serving started (Unix seconds): the model's `created` */
    srv_defaults def;
    sp_chat *chat;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int parallel, generating, waiting; /* the turns */
    long next_id, served, failed;
} sp_srv;

/* One request being answered (on its connection's thread). */
typedef struct srv_req {
    sp_srv *s;
    sp_http_conn *c;
    const sp_http_req *r;
    long id;
    double t0;
    int status;            /* what was answered */
    char why[600];         /* an error's message, for the log */
    int prompt_tokens, new_tokens, stream;
    double gen_s;          /* the generation's seconds */
} srv_req;

/* An error in OpenAI's shape, {"error": {"message", "type", "param", "code"}} (param, code: NULL for null);
 * recorded for the log. Returns -1. */
int srv_error(srv_req *q, int status, const char *type, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* The JSON body of an error in OpenAI's shape (into buf); its length. */
size_t srv_error_json(int status, const char *type, const char *param, const char *code, const char *msg, char *buf,
                      size_t cap);
/* The OpenAI error type of a status: "invalid_request_error", "authentication_error", ... */
const char *srv_error_type(int status);

/* A turn to generate (at most `parallel` at once): 0, or -1 when serving stops or the peer leaves meanwhile
 * (answered). srv_turn_end gives it back. */
int srv_turn(srv_req *q);
void srv_turn_end(srv_req *q);

/* POST /v1/completions (chat 0) and /v1/chat/completions (chat 1), the body parsed already. */
void srv_completions(srv_req *q, int chat);

#endif
