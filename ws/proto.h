/* proto.h - the sepal wire protocol as data: message types, the versioned little-endian header, tensor
 * descriptors, encode/decode with full validation, and each message kind's metadata as a struct with one encoder
 * and one validating decoder (the end of this file). No transport here (see transport.h), no cJSON; documented in
 * share/doc/protocol.md.
 *
 * A message is one contiguous byte string:
 *
 *   header      40 bytes  magic "SEPL", version major/minor, type, flags, n_tensors, request id,
 *                         metadata length, body length (everything after the header)
 *   metadata    meta_len bytes of UTF-8 JSON (an object), may be empty (meta_len 0 = {})
 *   descriptors n_tensors x 48 bytes: encoding, rank, shape[4], payload byte length
 *   payloads    the tensors' bytes, in descriptor order, back to back
 *
 * Every count, length, shape and offset is checked (with overflow checks) before use; decoding never
 * reads outside the buffer and returns an error code for garbage. */
#ifndef SEPAL_PROTO_H
#define SEPAL_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define SP_PROTO_MAGIC 0x4c504553u /* "SEPL" as little-endian bytes */
#define SP_PROTO_MAJOR 1
#define SP_PROTO_MINOR 1
#define SP_PROTO_STR_(x) #x
#define SP_PROTO_STR(x) SP_PROTO_STR_(x)
#define SP_PROTO_VERSION SP_PROTO_STR(SP_PROTO_MAJOR) "." SP_PROTO_STR(SP_PROTO_MINOR) /* "1.1", as HELLO says it */
#define SP_PROTO_HEADER_SIZE 40
#define SP_PROTO_DESC_SIZE 48
#define SP_PROTO_MAX_TENSORS 8
#define SP_PROTO_MAX_RANK 4
#define SP_PROTO_Q8_BLOCK 64 /* values per absmax block of the 8-bit encoding */

typedef enum {
    SP_MSG_HELLO = 1,
    SP_MSG_INFO = 2,
    SP_MSG_FORWARD = 3,
    SP_MSG_BACKWARD = 4,
    SP_MSG_INFERENCE_OPEN = 5,
    SP_MSG_INFERENCE_STEP = 6,
    SP_MSG_INFERENCE_CLOSE = 7,
    SP_MSG_PING = 8,
    SP_MSG_ERROR = 9,
    SP_MSG_AUTH = 10, /* the swarm key exchange (1.1; the transport answers it, see transport.h) */
    SP_MSG_INFERENCE_PUSH = 11, /* a step's input from the server before this one in the session's chain (1.2) */
    SP_MSG_SPAN_PUSH = 12, /* the input of a FORWARD or BACKWARD that awaits it, from the server before (1.2) */
    SP_MSG__END
} sp_msg_type;

enum {
    SP_MSG_F_REPLY = 1u << 0, /* a reply to request_id */
};

/* Tensor payload encodings. Floats travel as F32, F16, BF16 or Q8 (blocks of 64 values: one f32 scale =
 * absmax/127, then 64 int8; the last block may be short). I64/I32 carry integers (hypo_ids, token ids). */
typedef enum {
    SP_ENC_F32 = 0,
    SP_ENC_F16 = 1,
    SP_ENC_BF16 = 2,
    SP_ENC_Q8 = 3,
    SP_ENC_I64 = 4,
    SP_ENC_I32 = 5,
    SP_ENC__END
} sp_encoding;

const char *sp_msg_type_name(int type);      /* "FORWARD", or "?" */
const char *sp_encoding_name(int enc);       /* "f32", "q8", ... */
int sp_encoding_from_name(const char *name); /* -1 if unknown */
int sp_encoding_is_float(int enc);
/* Payload bytes for numel values in encoding enc (0 and *ok=0 on overflow). */
uint64_t sp_encoding_bytes(int enc, uint64_t numel, int *ok);

/* Limits the decoder enforces. */
typedef struct sp_proto_limits {
    uint64_t max_message; /* whole message, header included */
    uint32_t max_meta;    /* metadata bytes */
} sp_proto_limits;

#define SP_PROTO_DEFAULT_MAX_MESSAGE (256ull << 20)
#define SP_PROTO_DEFAULT_MAX_META (64u << 10)
sp_proto_limits sp_proto_default_limits(void);

/* ---------------------------------------------------------------------------------------------- */
/* byte buffers: data is preceded by SP_BUF_HEADROOM writable bytes (the transport puts frame headers
 * there without copying) */

#define SP_BUF_HEADROOM 32
/* A zeroed sp_buf is a valid empty buffer; sp_buf_reserve gives it an allocation (headroom included). sp_buf_free
 * keeps a few small heap buffers (a process-wide free list: 32 of at most 256 KiB, 4 MiB in all) that the next
 * sp_buf_reserve of an empty buffer takes, so a message's buffer is reused for the next, not reallocated. */

typedef struct sp_buf {
    uint8_t *base; /* allocation; data = base + SP_BUF_HEADROOM */
    uint8_t *data;
    size_t len, cap; /* cap excludes the headroom */
    size_t mapped;   /* bytes of its own anonymous mapping (sp_buf_reserve_mapped), 0: from malloc */
} sp_buf;

sp_status sp_buf_reserve(sp_buf *b, size_t cap, sp_err *err);
/* As sp_buf_reserve, but the buffer gets a mapping of its own: freeing it gives the memory back to the system at
 * once (the allocator keeps a freed block of its heap). For large received messages of a server. */
sp_status sp_buf_reserve_mapped(sp_buf *b, size_t cap, sp_err *err);
sp_status sp_buf_append(sp_buf *b, const void *p, size_t n, sp_err *err);
void sp_buf_free(sp_buf *b);
/* Sees that the free list holds at least n buffers that take a message of cap bytes (as far as its limits go): a
 * session about to exchange such messages sizes its buffers up front, so that none of its steps allocates, however
 * the threads of the process interleave. */
void sp_buf_spare_seed(size_t cap, int n);
/* Bytes of a message with meta_max bytes of metadata and tensors of the given f32 element counts (a bound for
 * sp_buf_spare_seed). */
size_t sp_msg_size_f32(size_t meta_max, const size_t *numel, int n);

/* ---------------------------------------------------------------------------------------------- */
/* decoding (zero-copy: views point into the decoded buffer) */

typedef struct sp_tensor_view {
    sp_encoding enc;
    int rank;
    int64_t shape[SP_PROTO_MAX_RANK];
    uint64_t numel;
    uint64_t nbytes;
    const uint8_t *data;
} sp_tensor_view;

typedef struct sp_msg {
    uint16_t major, minor;
    sp_msg_type type;
    uint16_t flags;
    uint64_t request_id;
    const char *meta_json; /* the metadata as it is in the buffer: meta_len bytes of valid UTF-8 JSON, an object
                              (not NUL-terminated; meta_len 0 = {}). Decoding checks it without allocating; the
                              typed decoders below read it */
    uint32_t meta_len;
    int n_tensors;
    sp_tensor_view t[SP_PROTO_MAX_TENSORS];
} sp_msg;

/* Reads only the fixed header (for stream framing): fills *body_len and checks magic, major version,
 * type and sizes against lim. SP_ERR_UNSUPPORTED for another major version (message says both). */
sp_status sp_msg_peek(const uint8_t *buf, size_t len, const sp_proto_limits *lim, uint64_t *body_len, sp_err *err);

/* The fixed header's fields as they are on the wire, unvalidated. For answering a message that failed to
 * decode: its request_id, and (sp_msg_reject_code) which ERROR code fits. Returns 0 if len < 40. */
typedef struct sp_msg_header {
    uint32_t magic;
    uint16_t major, minor, type, flags;
    uint32_t n_tensors;
    uint64_t request_id;
    uint32_t meta_len, reserved;
    uint64_t body_len;
} sp_msg_header;
int sp_msg_header_read(const uint8_t *buf, size_t len, sp_msg_header *h);
/* The ERROR reply code for a message that sp_msg_peek/sp_msg_decode refused with status s: "version" (another
 * major version), "unknown_type", "internal" (out of memory) or "malformed". */
const char *sp_msg_reject_code(const uint8_t *buf, size_t len, sp_status s);

/* Decodes and validates a whole message of exactly len bytes, metadata included (strict JSON, an object), without
 * allocating anything: views point into buf. Release with sp_msg_clear. */
sp_status sp_msg_decode(sp_msg *m, const uint8_t *buf, size_t len, const sp_proto_limits *lim, sp_err *err);
void sp_msg_clear(sp_msg *m);
/* The metadata text as a NUL-terminated copy (malloc'd; "" for none; NULL when out of memory): what a PING reply
 * echoes. */
char *sp_msg_meta_copy(const sp_msg *m);

/* Converts a float tensor to f32 (dst holds numel floats). Integer encodings are refused. */
sp_status sp_tensor_to_f32(const sp_tensor_view *t, float *dst, sp_err *err);
/* Converts an integer tensor to int64. */
sp_status sp_tensor_to_i64(const sp_tensor_view *t, int64_t *dst, sp_err *err);
/* 1 if every value of a float tensor is finite. */
int sp_tensor_all_finite(const sp_tensor_view *t);

/* ---------------------------------------------------------------------------------------------- */
/* encoding */

/* A tensor to send. For float encodings `f32` holds numel floats (converted on encode); for I64/I32
 * `raw` holds the integers in that width. */
typedef struct sp_tensor_src {
    sp_encoding enc;
    int rank;
    int64_t shape[SP_PROTO_MAX_RANK];
    const float *f32;
    const void *raw;
} sp_tensor_src;

/* Encodes a message into out (reset first; its headroom is kept). meta_json may be NULL. */
sp_status sp_msg_encode(sp_buf *out, sp_msg_type type, uint16_t flags, uint64_t request_id, const char *meta_json,
                        const sp_tensor_src *t, int n, sp_err *err);
/* An ERROR reply to request_id with {"code": code, "message": message}. */
sp_status sp_msg_encode_error(sp_buf *out, uint64_t request_id, const char *code, const char *message, sp_err *err);

/* ---------------------------------------------------------------------------------------------- */
/* typed metadata: one struct per message kind's metadata (ggml-rpc's one request struct per command), each with
 * one encode (struct -> the JSON text to give sp_msg_encode) and one validated decode (a decoded message -> struct).
 * Nothing outside proto.c builds or reads metadata by hand; share/doc/protocol.md describes these structs' fields.
 *
 * A field is required or optional. A required field is always written, and decoding fails without it. An optional
 * field has an "absent" value (said per field below: 0, -1 or ""): it is not written when it holds it, and decoding
 * gives it when the key is missing. Decoding checks the JSON type of every field it knows, that the value fits its C
 * type and the field's range (the protocol's own: no negative block index, length or position, ports up to 65535;
 * what depends on a server's state, such as the blocks it holds, is the server's to check), the length of strings
 * (a longer one is refused, never cut; no NUL characters), and the message's type and direction (a request's
 * decoder refuses a reply). Unknown keys are skipped (a newer minor version may add some) and a repeated key means
 * its first value, as everywhere in the metadata. Integers travel as JSON numbers (doubles: exact up to 2^53; a
 * 64-bit field takes at most 2^53 - 1); a 64-bit value that may exceed that travels as a string (config,
 * bulk_token).
 *
 * encode: writes the text, NUL-terminated, into out[0..cap); SP_ERR_ARG for a field out of its range or a string
 * that is not UTF-8, SP_ERR_RANGE when cap is too small (nothing is ever cut). decode: fills *v (zeroed first,
 * optional fields at their absent value) or returns SP_ERR_FORMAT with a message that names the message and the
 * field ("INFERENCE_OPEN request: 'batch' must be an integer in 0..2147483647, got 1.5"). Neither allocates. */

/* Copies src (NULL: "") into a struct's string field of cap bytes, cut at the start of a UTF-8 character when it is
 * longer, invalid UTF-8 made '?' (a field must hold UTF-8 to be encoded). */
void sp_meta_set(char *dst, size_t cap, const char *src);

/* Large enough for the encoding of any struct below (ERROR's message aside: sp_msg_encode_error sizes its own),
 * even with every string at its longest and escaped. */
#define SP_META_CAP 8192

/* HELLO request: the first request on a connection. */
typedef struct sp_hello_req {
    char version[16]; /* optional: the protocol the client speaks, "1.1"; a server refuses another major */
    char client[64];  /* optional: "sepal 0.1.0" */
} sp_hello_req;

/* HELLO reply: who the server is and how to attach the bulk channel. */
typedef struct sp_hello_reply {
    char version[16];    /* optional: the server's protocol, "1.1" */
    char server[64];     /* optional: "sepal-server 0.1.0" */
    char model[256];     /* required: the model's name */
    uint64_t config;     /* optional (0): FNV-1a 64 of the model's config.json, as 16 hex digits */
    char dtype[16];      /* optional: how it holds its blocks, "f32", "int8", ... */
    int blocks;          /* optional (0): the model's blocks, 1..2^20 */
    int start, end;      /* required: the blocks [start, end) it holds, 0 <= start */
    char id[24];         /* optional: its id in the swarm ("" without the DHT) */
    int bulk_port;       /* optional (0): the bulk channel's port; -1 or 0: none */
    uint64_t bulk_token; /* optional (0): the one-time token that attaches it, as a decimal string */
    int dht_port;        /* optional (0): the UDP port of its DHT node (0: none), what --initial-peers takes */
    char addr[80];       /* optional: "HOST:PORT", the websocket address it is announced at (where the server before
                          * it in a chain pushes to it; a client may reach it by another) */
    int caps;            /* optional (0): what it can do beyond 1.1's requests, SP_CAP_* bits (unknown bits are
                          * ignored); a server that does not say it has none of them */
} sp_hello_reply;

/* A server's capabilities, as HELLO and its DHT record say them (a bit set: "caps"). A client asks for what a server
 * says it can; an older server says nothing, and answers a request that awaits its input with bad_request. */
enum {
    SP_CAP_STEP_PUSH = 1u << 0, /* INFERENCE_STEP's await and push fields, INFERENCE_PUSH, OPEN's push_token */
    SP_CAP_SPAN_PUSH = 1u << 1, /* FORWARD's and BACKWARD's await and push fields, SPAN_PUSH */
    SP_CAPS_ALL = SP_CAP_STEP_PUSH | SP_CAP_SPAN_PUSH,
};

/* INFO reply's "transport" object (sp_ws_server_stats): each optional (-1; swarm_key a bool, -1 absent). */
typedef struct sp_info_transport {
    int64_t conns, pending, accepted, refused, refused_ip, handshake_timeouts, idle_closed, busy, slow, auth_failed,
        waits, paused, delivered, bulk_refused, bulk_timeouts, out_of_fds, budget_used, budget_peak, budget,
        budget_conn;
    int swarm_key;
} sp_info_transport;

/* INFO reply: the server's state (the request has no metadata). model, start and end are required; every other
 * field is optional: strings "", integers -1, the rates 0, transport's fields -1 when absent. */
typedef struct sp_info_reply {
    char model[256];
    char architecture[64];
    int start, end;
    char dtype[16];
    int64_t weight_bytes;
    char protocol[16];
    int hidden_size;
    char family[16];
    int kv_heads, head_dim;
    int64_t cache_bytes_per_token, cache_bytes_total, cache_tokens_total, cache_tokens_available;
    int max_batch_tokens, max_length;
    double inference_rps, forward_tps; /* finite, >= 0 */
    char public_name[64];
    int sessions;
    int64_t kept_bytes, requests;
    int64_t batches, batched_rows, batch_peak; /* batched decode passes, rows through them, most rows in one */
    double queue_wait;                         /* recent decode steps' wait in the queue, s (finite, >= 0) */
    int64_t passed_inference, passed_training; /* for the asking client (its address): the most requests of other
                                                  clients taken from the queue while one of its inference (training)
                                                  requests waited there (how fair the turns were) */
    double max_queue_wait;                     /* the bound on it over which new sessions are refused, s (0: none) */
    char device[64];                           /* where the span runs: "cpu", "cuda:0 NVIDIA H200" ("": not said) */
    sp_info_transport transport;
} sp_info_reply;

/* FORWARD and BACKWARD requests: a span (their replies have no metadata). */
typedef struct sp_span_req {
    int start, end;     /* required: the span [start, end), 0 <= start */
    uint64_t keep;      /* optional (0): FORWARD's "keep": keep the span's activations under this id for a BACKWARD;
                           BACKWARD's "kept": the id a FORWARD kept them under */
    int reply_encoding; /* optional (-1: the request's own): SP_ENC_F32..SP_ENC_Q8, sent by name */
    /* server-to-server push (training's passes), each optional (0, ""): */
    uint64_t await;       /* the request lacks its hidden state (FORWARD) or grad_out (BACKWARD): it comes by
                           * SPAN_PUSH with this id ... */
    uint64_t await_token; /* ... and this token (the client's random 64 bits) */
    char push_host[256];  /* after the span ran, its output goes to this server ... */
    int push_port;
    uint64_t push_id;     /* ... to its request awaiting this id ... */
    uint64_t push_token;  /* ... with this token */
} sp_span_req;
typedef sp_span_req sp_forward_req, sp_backward_req;

/* FORWARD and BACKWARD replies' metadata (none unless a push was asked for or the request's rate is told). */
typedef struct sp_span_reply {
    int pushed;     /* optional (0; a bool): the push the request asked for was delivered */
    double rx_mbit; /* optional (0: none): the rate, Mbit/s, at which the server measured a large request of this
                       connection arrive on its bulk channel (sp_ws_server_rx_take), each measurement sent once */
} sp_span_reply;
typedef sp_span_reply sp_forward_reply, sp_backward_reply;

/* SPAN_PUSH request: the output of a FORWARD (or BACKWARD) [B, T, H], from the server that ran it, for the request
 * of the next server (the one before, for a BACKWARD) that awaits it (its reply, an acknowledgement, is empty). */
typedef struct sp_span_push_req {
    uint64_t id;    /* required: the awaiting request's "await" */
    uint64_t token; /* required: its "await_token" */
} sp_span_push_req;

/* INFERENCE_OPEN request: all required, each >= 0 (the server refuses 0 with its own codes). */
typedef struct sp_open_req {
    int start, end;
    int max_length, batch;
} sp_open_req;

/* INFERENCE_OPEN reply. */
typedef struct sp_open_reply {
    uint64_t session; /* required: the session's id */
    int max_length;   /* optional (-1): the session's positions */
    uint64_t push_token; /* optional (0: the server takes no pushes): what a push into the session must carry */
} sp_open_reply;

/* INFERENCE_STEP request. */
typedef struct sp_step_req {
    uint64_t session;        /* required */
    int start_from_position; /* optional (-1): where the step starts (lower than the cache's length: a rollback) */
    int reply_encoding;      /* optional (-1) */
    uint64_t step;           /* optional (0): the client's step number, which pushes of this step's input carry */
    int await;               /* optional (0; a bool): the hidden state is not in this request, it comes by
                              * INFERENCE_PUSH with the same step (the request's tensors: prompts, hypo_ids) */
    char push_host[256];     /* optional (""): after the step, push the output to this server ... */
    int push_port;           /* optional (0) */
    uint64_t push_session;   /* optional (0): ... into its session ... */
    uint64_t push_token;     /* optional (0): ... with this token (the session's, from its INFERENCE_OPEN reply) */
} sp_step_req;

/* INFERENCE_STEP reply. */
typedef struct sp_step_reply {
    int position; /* required: the cache's length after the step */
    int pushed;   /* optional (0; a bool): the push the request asked for was delivered (1; 0: not, or none asked) */
    double rx_mbit; /* optional (0): as sp_span_reply's */
} sp_step_reply;

/* INFERENCE_PUSH request: the input hidden state [B, T, H] of a step of another server's session, from the server
 * before it (its reply, an acknowledgement, has no metadata). */
typedef struct sp_push_req {
    uint64_t session; /* required */
    uint64_t token;   /* required: the session's push token */
    uint64_t step;    /* required: the step it is the input of */
} sp_push_req;

/* INFERENCE_CLOSE request (the reply has no metadata). */
typedef struct sp_close_req {
    uint64_t session; /* required */
} sp_close_req;

/* PING has no struct: no fields of its own, any object, which the reply echoes (sp_msg_meta_copy). */

/* ERROR, always a reply (sp_msg_encode_error builds one from any text). */
typedef struct sp_error_reply {
    char code[32];      /* required, not empty: "shape", "out_of_cache", ... (share/doc/protocol.md) */
    char message[2048]; /* optional: what went wrong, for people */
} sp_error_reply;

/* AUTH, the swarm key exchange (ws/auth.c): four messages, each field required but swarm. Nonces and proofs travel
 * as 64 hex digits. */
typedef struct sp_auth_hello {  /* client -> server */
    uint8_t nonce[32];
    char swarm[64];             /* optional: the swarm id the client holds the key of (16 hex digits) */
} sp_auth_hello;
typedef struct sp_auth_challenge { /* server -> client, reply */
    uint8_t nonce[32], proof[32];
} sp_auth_challenge;
typedef struct sp_auth_proof {  /* client -> server */
    uint8_t proof[32];
} sp_auth_proof;
typedef struct sp_auth_verdict { /* server -> client, reply */
    int ok;                     /* a JSON bool */
} sp_auth_verdict;

sp_status sp_hello_req_encode(const sp_hello_req *v, char *out, size_t cap, sp_err *err);
sp_status sp_hello_req_decode(const sp_msg *m, sp_hello_req *v, sp_err *err);
sp_status sp_hello_reply_encode(const sp_hello_reply *v, char *out, size_t cap, sp_err *err);
sp_status sp_hello_reply_decode(const sp_msg *m, sp_hello_reply *v, sp_err *err);
sp_status sp_info_reply_encode(const sp_info_reply *v, char *out, size_t cap, sp_err *err);
sp_status sp_info_reply_decode(const sp_msg *m, sp_info_reply *v, sp_err *err);
sp_status sp_forward_req_encode(const sp_forward_req *v, char *out, size_t cap, sp_err *err);
sp_status sp_forward_req_decode(const sp_msg *m, sp_forward_req *v, sp_err *err);
sp_status sp_backward_req_encode(const sp_backward_req *v, char *out, size_t cap, sp_err *err);
sp_status sp_backward_req_decode(const sp_msg *m, sp_backward_req *v, sp_err *err);
sp_status sp_open_req_encode(const sp_open_req *v, char *out, size_t cap, sp_err *err);
sp_status sp_open_req_decode(const sp_msg *m, sp_open_req *v, sp_err *err);
sp_status sp_open_reply_encode(const sp_open_reply *v, char *out, size_t cap, sp_err *err);
sp_status sp_open_reply_decode(const sp_msg *m, sp_open_reply *v, sp_err *err);
sp_status sp_step_req_encode(const sp_step_req *v, char *out, size_t cap, sp_err *err);
sp_status sp_step_req_decode(const sp_msg *m, sp_step_req *v, sp_err *err);
sp_status sp_step_reply_encode(const sp_step_reply *v, char *out, size_t cap, sp_err *err);
sp_status sp_step_reply_decode(const sp_msg *m, sp_step_reply *v, sp_err *err);
sp_status sp_push_req_encode(const sp_push_req *v, char *out, size_t cap, sp_err *err);
sp_status sp_forward_reply_encode(const sp_forward_reply *v, char *out, size_t cap, sp_err *err);
sp_status sp_forward_reply_decode(const sp_msg *m, sp_forward_reply *v, sp_err *err);
sp_status sp_backward_reply_encode(const sp_backward_reply *v, char *out, size_t cap, sp_err *err);
sp_status sp_backward_reply_decode(const sp_msg *m, sp_backward_reply *v, sp_err *err);
sp_status sp_span_push_req_encode(const sp_span_push_req *v, char *out, size_t cap, sp_err *err);
sp_status sp_span_push_req_decode(const sp_msg *m, sp_span_push_req *v, sp_err *err);
sp_status sp_push_req_decode(const sp_msg *m, sp_push_req *v, sp_err *err);
sp_status sp_close_req_encode(const sp_close_req *v, char *out, size_t cap, sp_err *err);
sp_status sp_close_req_decode(const sp_msg *m, sp_close_req *v, sp_err *err);
sp_status sp_error_reply_encode(const sp_error_reply *v, char *out, size_t cap, sp_err *err);
sp_status sp_error_reply_decode(const sp_msg *m, sp_error_reply *v, sp_err *err);
sp_status sp_auth_hello_encode(const sp_auth_hello *v, char *out, size_t cap, sp_err *err);
sp_status sp_auth_hello_decode(const sp_msg *m, sp_auth_hello *v, sp_err *err);
sp_status sp_auth_challenge_encode(const sp_auth_challenge *v, char *out, size_t cap, sp_err *err);
sp_status sp_auth_challenge_decode(const sp_msg *m, sp_auth_challenge *v, sp_err *err);
sp_status sp_auth_proof_encode(const sp_auth_proof *v, char *out, size_t cap, sp_err *err);
sp_status sp_auth_proof_decode(const sp_msg *m, sp_auth_proof *v, sp_err *err);
sp_status sp_auth_verdict_encode(const sp_auth_verdict *v, char *out, size_t cap, sp_err *err);
sp_status sp_auth_verdict_decode(const sp_msg *m, sp_auth_verdict *v, sp_err *err);

/* The structs above as data, for code that treats them all alike (tests/test_proto.c, the fuzz target): each with
 * the message it is the metadata of, and its encode and decode. */
typedef struct sp_meta_codec {
    const char *name;  /* "hello_reply": sp_hello_reply */
    sp_msg_type type;
    uint16_t flags;    /* SP_MSG_F_REPLY for a reply's metadata */
    size_t size;       /* of the struct */
    sp_status (*encode)(const void *v, char *out, size_t cap, sp_err *err);
    sp_status (*decode)(const sp_msg *m, void *v, sp_err *err);
} sp_meta_codec;
#define SP_META_CODECS 19
extern const sp_meta_codec sp_meta_codecs[SP_META_CODECS];


#endif
