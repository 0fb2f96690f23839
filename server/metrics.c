/* metrics.c - the server's counters (metrics.h) and their text in Prometheus' exposition format 0.0.4: each
 * family with its # HELP and # TYPE, names under sepal_, seconds and bytes in base units. */
#include "metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"
#include "server_impl.h"
#include "timeutil.h"

#define ADD(p, v) __atomic_add_fetch((p), (v), __ATOMIC_RELAXED)
#define GET(p) __atomic_load_n((p), __ATOMIC_RELAXED)

static int mx_type(int t)
{
    switch (t) {
    case SP_MSG_HELLO: return SP_MX_HELLO;
    case SP_MSG_INFO: return SP_MX_INFO;
    case SP_MSG_PING: return SP_MX_PING;
    case SP_MSG_INFERENCE_OPEN: return SP_MX_OPEN;
    case SP_MSG_INFERENCE_STEP: return SP_MX_STEP;
    case SP_MSG_INFERENCE_CLOSE: return SP_MX_CLOSE;
    case SP_MSG_FORWARD: return SP_MX_FORWARD;
    case SP_MSG_BACKWARD: return SP_MX_BACKWARD;
    default: return SP_MX_OTHER;
    }
}

void sp_mx_request(sp_server_metrics *m, int msg_type, uint64_t bytes)
{
    ADD(&m->requests[mx_type(msg_type)], 1);
    ADD(&m->bytes_in, bytes);
}

void sp_mx_sent(sp_server_metrics *m, uint64_t bytes, int error)
{
    ADD(&m->bytes_out, bytes);
    if (error)
        ADD(&m->errors, 1);
}

void sp_mx_waited(sp_server_metrics *m, uint64_t ns)
{
    ADD(&m->wait_ns, ns);
    ADD(&m->waited, 1);
}

void sp_mx_batch(sp_server_metrics *m, int n, int kind, uint64_t tokens)
{
    int b = 0;
    while (b < SP_MX_BATCH_BUCKETS - 1 && n > 1 << b)
        b++;
    ADD(&m->batch[b], 1);
    ADD(&m->batch_sum, (uint64_t)n);
    ADD(&m->batches, 1);
    if (kind >= 0 && kind < SP_MX_NTOK)
        ADD(&m->tokens[kind], tokens);
    if (kind >= 0 && kind < SP_MX_NTOK && n > 1) {
        ADD(&m->merged[kind], 1);
        ADD(&m->merged_requests[kind], (uint64_t)n);
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* the text */

typedef struct text {
    char *s;
    size_t len, cap;
    int oom;
} text;

__attribute__((format(printf, 2, 3))) static void put(text *t, const char *fmt, ...)
{
    for (int tries = 0; tries < 2 && !t->oom; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->s ? t->s + t->len : NULL, t->s ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->oom = 1;
        } else if (t->s && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        } else {
            size_t cap = t->cap ? t->cap : 4096;
            while (cap <= t->len + (size_t)n)
                cap *= 2;
            char *s = realloc(t->s, cap);
            if (!s)
                t->oom = 1;
            else
                t->s = s, t->cap = cap;
        }
    }
}

/* A family's head: # HELP and # TYPE. */
static void head(text *t, const char *name, const char *type, const char *help)
{
    put(t, "# HELP sepal_%s %s\n# TYPE sepal_%s %s\n", name, help, name, type);
}

/* A family of one sample. */
static void one(text *t, const char *name, const char *type, const char *help, double v)
{
    head(t, name, type, help);
    put(t, "sepal_%s %.17g\n", name, v);
}

static void requests(text *t, sp_server_metrics *m)
{
    static const char *const names[SP_MX_NTYPES] = {"hello", "info", "ping", "inference_open", "inference_step",
                                                    "inference_close", "forward", "backward", "other"};
    head(t, "requests_total", "counter", "Requests received, by type.");
    for (int i = 0; i < SP_MX_NTYPES; i++)
        put(t, "sepal_requests_total{type=\"%s\"} %llu\n", names[i], (unsigned long long)GET(&m->requests[i]));
    one(t, "request_errors_total", "counter", "ERROR replies sent.", (double)GET(&m->errors));
}

static void queue(text *t, sp_server *s, sp_server_metrics *m)
{
    one(t, "queue_length", "gauge", "Requests waiting for a worker now.", queue_length(&s->q));
    one(t, "queue_wait_now_seconds", "gauge", "The load: recent decode steps' wait in the queue (as announced).",
        sp_server_queue_wait(s));
    one(t, "sessions_refused_overloaded_total", "counter",
        "Inference sessions refused while the queue wait was over --max-queue-wait.", (double)GET(&m->overloaded));
    head(t, "queue_wait_seconds", "summary", "Time requests waited in the queue for a worker.");
    put(t, "sepal_queue_wait_seconds_sum %.9f\nsepal_queue_wait_seconds_count %llu\n", GET(&m->wait_ns) * 1e-9,
        (unsigned long long)GET(&m->waited));
    head(t, "batch_size", "histogram", "Requests the blocks ran in one pass.");
    uint64_t cum = 0;
    for (int b = 0; b < SP_MX_BATCH_BUCKETS; b++) {
        cum += GET(&m->batch[b]);
        if (b < SP_MX_BATCH_BUCKETS - 1)
            put(t, "sepal_batch_size_bucket{le=\"%d\"} %llu\n", 1 << b, (unsigned long long)cum);
        else
            put(t, "sepal_batch_size_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cum);
    }
    put(t, "sepal_batch_size_sum %llu\nsepal_batch_size_count %llu\n", (unsigned long long)GET(&m->batch_sum),
        (unsigned long long)GET(&m->batches));
}

static const char *const mx_kinds[SP_MX_NTOK] = {"inference", "forward", "backward"};

/* Passes of several requests: decode steps of several sessions, FORWARDs or BACKWARDs of several clients. */
static void merged(text *t, sp_server_metrics *m)
{
    head(t, "batched_passes_total", "counter", "Passes that ran several requests together, by kind.");
    for (int k = 0; k < SP_MX_NTOK; k++)
        put(t, "sepal_batched_passes_total{kind=\"%s\"} %llu\n", mx_kinds[k], (unsigned long long)GET(&m->merged[k]));
    head(t, "batched_requests_total", "counter", "Requests that ran in those passes, by kind.");
    for (int k = 0; k < SP_MX_NTOK; k++)
        put(t, "sepal_batched_requests_total{kind=\"%s\"} %llu\n", mx_kinds[k],
            (unsigned long long)GET(&m->merged_requests[k]));
}

static void tokens(text *t, sp_server_metrics *m, double now)
{
    const char *const *kinds = mx_kinds;
    head(t, "tokens_total", "counter", "Positions the blocks computed, by kind.");
    uint64_t all = 0;
    for (int k = 0; k < SP_MX_NTOK; k++) {
        uint64_t v = GET(&m->tokens[k]);
        all += v;
        put(t, "sepal_tokens_total{kind=\"%s\"} %llu\n", kinds[k], (unsigned long long)v);
    }
    double since = m->last_t > 0 ? m->last_t : m->started_t;
    one(t, "tokens_per_second", "gauge", "Positions computed per second since the previous scrape.",
        now > since ? (double)(all - m->last_tokens) / (now - since) : 0.0);
    m->last_tokens = all;
    m->last_t = now;
}

static void memory(text *t, sp_server *s)
{
    pthread_mutex_lock(&s->st.lock);
    long used = s->st.used, budget = s->st.budget;
    pthread_mutex_unlock(&s->st.lock);
    one(t, "sessions", "gauge", "Inference sessions open.", sp_server_sessions(s));
    one(t, "kv_cache_used_bytes", "gauge", "Bytes of the KV cache budget held by open sessions.", (double)used);
    one(t, "kv_cache_budget_bytes", "gauge", "Bytes of KV cache the server may hold.", (double)budget);
    one(t, "kv_cache_tokens_available", "gauge", "Positions a new session over the whole span can still get.",
        (double)sessions_tokens_available(s));
    one(t, "kept_bytes", "gauge", "Bytes of activations kept for backwards to come.", (double)sp_server_kept_bytes(s));
    sp_server_awaits aw;
    sp_server_awaits_get(s, &aw);
    one(t, "push_held_bytes", "gauge", "Bytes of training's pushed inputs and requests awaiting them held now.",
        (double)aw.held);
    one(t, "push_held_expired_total", "counter",
        "Pushed inputs and awaiting requests dropped unclaimed at the step timeout.", (double)aw.expired);
    one(t, "push_refused_total", "counter", "Training's pushes refused: the held bytes would go over their cap.",
        (double)aw.refused);
    uint64_t in, out;
    sp_server_pushes(s, &in, &out);
    one(t, "pushes_in_total", "counter", "Pushes of other servers taken in (steps' and training passes' inputs).",
        (double)in);
    one(t, "pushes_out_total", "counter", "Pushes to the next servers that they acknowledged.", (double)out);
    one(t, "pushes_in_flight_peak", "gauge",
        "The most pushes in flight at once (a pass sends all its sessions' pushes, then awaits them).",
        (double)sp_server_pushes_in_flight_peak(s));
}

static void network(text *t, sp_server *s, sp_server_metrics *m)
{
    sp_ws_server_stats w;
    sp_ws_server_stats_get(s->ws, &w);
    one(t, "connections", "gauge", "Client connections open (handshakes included).", w.conns);
    one(t, "connections_accepted_total", "counter", "Connections taken.", (double)w.accepted);
    one(t, "connections_refused_total", "counter", "Connections refused over a cap.", (double)w.refused);
    one(t, "auth_failures_total", "counter", "Connections that failed the swarm key exchange or skipped it.",
        (double)w.auth_failed);
    one(t, "received_bytes_total", "counter", "Bytes of requests received.", (double)GET(&m->bytes_in));
    one(t, "sent_bytes_total", "counter", "Bytes of replies sent.", (double)GET(&m->bytes_out));
}

char *sp_server_metrics_text(sp_server *s, const sp_mx_extra *x)
{
    sp_server_metrics *m = &s->mx;
    text t = {0};
    double now = sp_now_s();
    int start, end;
    sp_server_span(s, &start, &end);
    head(&t, "info", "gauge", "The server: its model, blocks and encoding.");
    put(&t, "sepal_info{model=\"%s\",start=\"%d\",end=\"%d\",dtype=\"%s\"} 1\n", s->model_name, start, end,
        sp_server_dtype(s));
    one(&t, "uptime_seconds", "gauge", "Seconds since the server started.", now - m->started_t);
    requests(&t, m);
    queue(&t, s, m);
    merged(&t, m);
    pthread_mutex_lock(&s->mx_lock); /* the tokens/s window is the scrapes' own */
    tokens(&t, m, now);
    pthread_mutex_unlock(&s->mx_lock);
    memory(&t, s);
    network(&t, s, m);
    if (x && x->have_dht) {
        one(&t, "dht_restarts_total", "counter", "Times the DHT node's child process was restarted.",
            (double)x->dht_restarts);
        one(&t, "dht_refused_datagrams_total", "counter", "Datagrams the DHT front refused.",
            (double)x->dht_refused);
    }
    if (t.oom) {
        free(t.s);
        return NULL;
    }
    return t.s;
}
