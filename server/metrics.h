/* metrics.h - what a server counts for `sepal-server --metrics HOST:PORT` (Prometheus' text format, as
 * llama-server's /metrics): requests by type, ERROR replies, how long requests waited in the queue, the sizes of
 * the batches its blocks ran (a request alone is a batch of 1; a pass of batched decode steps one of that many),
 * positions computed by kind, bytes in and out. Counters are atomics any thread adds to; the text also reads the
 * server's gauges (sessions, KV cache, queue, kept activations, connections, auth failures). */
#ifndef SEPAL_SERVER_METRICS_H
#define SEPAL_SERVER_METRICS_H

#include <stdint.h>

enum { SP_MX_HELLO, SP_MX_INFO, SP_MX_PING, SP_MX_OPEN, SP_MX_STEP, SP_MX_CLOSE, SP_MX_FORWARD, SP_MX_BACKWARD,
       SP_MX_OTHER, SP_MX_NTYPES };
enum { SP_MX_TOK_INFERENCE, SP_MX_TOK_FORWARD, SP_MX_TOK_BACKWARD, SP_MX_NTOK };
#define SP_MX_BATCH_BUCKETS 8 /* batch sizes <= 1, 2, 4, ... 64, and more */

typedef struct sp_server_metrics {
    uint64_t requests[SP_MX_NTYPES];
    uint64_t errors;                 /* ERROR replies sent */
    uint64_t overloaded;             /* inference sessions refused for the queue wait (--max-queue-wait) */
    uint64_t wait_ns, waited;        /* time in the queue: its sum, and the requests that went through it */
    uint64_t batch[SP_MX_BATCH_BUCKETS], batch_sum, batches;
    uint64_t tokens[SP_MX_NTOK];     /* positions computed: inference steps, forwards, backwards */
    uint64_t merged[SP_MX_NTOK], merged_requests[SP_MX_NTOK]; /* passes of several requests, by kind; their requests */
    uint64_t bytes_in, bytes_out;    /* requests received, replies sent (both channels) */
    /* tokens/s between scrapes: the last scrape's total and time (under the scraper's lock) */
    uint64_t last_tokens;
    double last_t, started_t;
} sp_server_metrics;

/* A request of this wire type (sp_msg_type) and length received. */
void sp_mx_request(sp_server_metrics *m, int msg_type, uint64_t bytes);
/* A reply (or ERROR) of these bytes sent. */
void sp_mx_sent(sp_server_metrics *m, uint64_t bytes, int error);
/* A request that waited ns in the queue. */
void sp_mx_waited(sp_server_metrics *m, uint64_t ns);
/* The blocks ran one batch of n requests, computing `tokens` positions of this kind (SP_MX_TOK_*). */
void sp_mx_batch(sp_server_metrics *m, int n, int kind, uint64_t tokens);

/* What the server program adds to the text (its DHT node's restarts, the datagrams its front refused). */
typedef struct sp_mx_extra {
    int have_dht;
    long dht_restarts;
    uint64_t dht_refused;
} sp_mx_extra;

#endif
