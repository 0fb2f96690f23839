/* record.h - what a server announces in the DHT, and the swarm's model index.
 *
 * Keys: one per block, "<model>.<i>" (the model's prefix: its directory's name, see sp_model_prefix), whose
 * values are the records of the servers holding block i; and SP_MODELS_KEY, whose values name the models
 * in the swarm. A record is a small JSON object (share/doc/protocol.md, "Discovery"): the server's id,
 * address, span, state, throughput, cache left, pings to its successors, version, public name, and the
 * time it was written. Readers trust nothing in it: sp_record_decode checks every field and the record's
 * consistency with the key it came under and with the model the reader holds, and a record older than three
 * of its writer's announcement periods is stale (its server is presumed dead). */
#ifndef SEPAL_RECORD_H
#define SEPAL_RECORD_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "swarmkey.h"

#define SP_RECORD_VERSION 1
#define SP_RECORD_MAX 4096      /* bytes of an encoded record; larger values are dropped */
#define SP_RECORD_MAX_PINGS 16
#define SP_SERVER_ID_LEN 17     /* 16 hex digits + NUL */
#define SP_MODELS_KEY "_sepal.models"
#define SP_MODEL_PREFIX_MAX 96

typedef enum { SP_SERVER_OFFLINE = 0, SP_SERVER_JOINING = 1, SP_SERVER_ONLINE = 2 } sp_server_state;

typedef struct sp_next_ping {
    char id[SP_SERVER_ID_LEN]; /* a server holding this server's next block */
    double rtt;                /* smoothed round trip, seconds */
} sp_next_ping;

typedef struct sp_server_record {
    char id[SP_SERVER_ID_LEN]; /* random per server process */
    char name[64];             /* --public-name ("" if none) */
    char host[64];             /* websocket address */
    int port;
    char dht[80];              /* "host:port" of its DHT node (a peer to rejoin through) */
    char model[SP_MODEL_PREFIX_MAX];
    uint64_t config_hash;      /* sp_config.hash of the model it serves */
    int num_blocks;            /* blocks of the model */
    int start, end;            /* the span served, [start, end) */
    sp_server_state state;
    double throughput;         /* tokens/s it offers per block (routing weight, block selection) */
    double inference_rps;      /* single-token steps/s per block */
    double forward_rps;        /* tokens/s per block of a 1024-token forward */
    double network_rps;        /* tokens/s its network carries */
    char dtype[16], quant[16]; /* "f32", "none" */
    char device[64];           /* where its blocks run: "cpu", "cuda:0 NVIDIA H200" ("": not said, an older server) */
    long cache_tokens_left;    /* positions a new session over the whole span can still get */
    double queue_wait;         /* seconds its recent decode steps waited in its queue (its load; 0 if not said) */
    double max_queue_wait;     /* its bound on that wait: over it, it refuses new inference sessions (0: none, or not
                                  said) */
    int caps;                  /* what it can do beyond the protocol's base: the SP_CAP_* bits of ws/proto.h (0: none,
                                  or an older server that does not say) */
    int npings;
    sp_next_ping pings[SP_RECORD_MAX_PINGS];
    char version[16];          /* sepal version */
    double timestamp;          /* wall-clock seconds when written */
    double period;             /* seconds between its announcements */
} sp_server_record;

/* What a reader expects of a record: its model (prefix, hash, block count), the block whose key it came
 * under (-1: any), and the reader's clock. */
typedef struct sp_record_expect {
    const char *model;
    uint64_t config_hash;
    int num_blocks;
    int block;
    double now;
} sp_record_expect;

typedef struct sp_model_record {
    char model[SP_MODEL_PREFIX_MAX];
    uint64_t config_hash;
    int num_blocks;
    int hidden;
    char architecture[64];
    double timestamp, period;
} sp_model_record;

const char *sp_server_state_name(sp_server_state s); /* "offline", "joining", "online" */

/* A model's prefix in the swarm: the last component of dir (realpath'd), with anything outside
 * [A-Za-z0-9._-] replaced by '_'. */
void sp_model_prefix(const char *dir, char *out, size_t cap);
/* "<model>.<block>" */
void sp_block_key(const char *model, int block, char *out, size_t cap);

/* JSON of r into buf (NUL-terminated); SP_ERR_RANGE if it would exceed min(cap, SP_RECORD_MAX). */
sp_status sp_record_encode(const sp_server_record *r, char *buf, size_t cap, size_t *len, sp_err *err);
/* Parses and checks a record (sizes, types, ranges, span within the model, the key's block inside the span,
 * model and hash as expected, timestamp not in the future beyond the allowed skew). err says what is wrong. */
sp_status sp_record_decode(sp_server_record *r, const void *data, size_t len, const sp_record_expect *x, sp_err *err);
/* 1 if r was written more than three of its periods before now. */
int sp_record_is_stale(const sp_server_record *r, double now);
/* 1 if the record says the server's queue wait is over its bound: it refuses new inference sessions now (busy). */
int sp_record_saturated(const sp_server_record *r);

sp_status sp_model_record_encode(const sp_model_record *m, char *buf, size_t cap, size_t *len, sp_err *err);

/* A private swarm's records (server records and model index entries alike) are sealed: the value is not the JSON
 * but, versioned by its first bytes (JSON starts with '{'),
 *
 *   "SPR" 2 | swarm id (8 bytes) | nonce (12 random bytes) | AES-256-GCM(the swarm key's seal subkey, JSON) | tag (16)
 *
 * with the magic and swarm id authenticated in clear. An outsider sees only which swarm a value belongs to (the
 * swarm id is public) and its length; a reader with the key opens it and checks the JSON as any record, and drops
 * what does not open (another key, altered bytes) and unsealed values (outsiders can still store values under
 * the keys, but cannot make keyed readers route to them). An open swarm's records are the JSON, as before. */
#define SP_RECORD_SEALED_VERSION 2
#define SP_RECORD_SEAL_OVERHEAD (4 + SP_SWARM_ID_BYTES + SP_AEAD_NONCE_BYTES + SP_AEAD_TAG_BYTES)
/* Seals the encoded JSON in buf (*len bytes) in place. SP_ERR_RANGE if it no longer fits. */
sp_status sp_record_seal(char *buf, size_t cap, size_t *len, const sp_swarm_key *k, sp_err *err);
/* Opens a sealed value into out (the JSON, NUL-terminated). SP_ERR_FORMAT, saying "not sealed", "sealed for swarm
 * X, not this key's (Y)" or "does not open with this swarm key", otherwise. */
sp_status sp_record_unseal(const void *data, size_t len, const sp_swarm_key *k, char *out, size_t cap, size_t *out_len,
                           sp_err *err);
/* 1 if data is a sealed value (its swarm id as hex, and its nonce, which tells apart two sealings, copied out; either
 * may be NULL), else 0. */
int sp_record_is_sealed(const void *data, size_t len, char swarm_hex[2 * SP_SWARM_ID_BYTES + 1],
                        uint8_t nonce[SP_AEAD_NONCE_BYTES]);
sp_status sp_model_record_decode(sp_model_record *m, const void *data, size_t len, double now, sp_err *err);

#endif
