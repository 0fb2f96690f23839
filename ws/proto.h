/* proto.h - the sepal wire protocol as data: message types, the versioned little-endian header, tensor
 * descriptors, encode/decode with full validation. No transport here (see transport.h); documented in
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
                              (not NUL-terminated; meta_len 0 = {}). Decoding checks it without allocating */
    uint32_t meta_len;
    struct cJSON *meta;    /* NULL until sp_msg_meta builds the tree (then owned: sp_msg_clear frees it) */
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
 * allocating anything: views point into buf. Release with sp_msg_clear (which frees a tree sp_msg_meta built). */
sp_status sp_msg_decode(sp_msg *m, const uint8_t *buf, size_t len, const sp_proto_limits *lim, sp_err *err);
void sp_msg_clear(sp_msg *m);
/* The metadata as a cJSON object, parsed on first use and kept in m->meta (NULL when out of memory). For
 * callers that walk nested members; the sp_meta_* readers below need no tree. */
struct cJSON *sp_msg_meta(const sp_msg *m);

/* Converts a float tensor to f32 (dst holds numel floats). Integer encodings are refused. */
sp_status sp_tensor_to_f32(const sp_tensor_view *t, float *dst, sp_err *err);
/* Converts an integer tensor to int64. */
sp_status sp_tensor_to_i64(const sp_tensor_view *t, int64_t *dst, sp_err *err);
/* 1 if every value of a float tensor is finite. */
int sp_tensor_all_finite(const sp_tensor_view *t);

/* Metadata helpers over the top-level members (the first of a repeated key; NULL/-1 defaults when absent or of the
 * wrong JSON type). sp_meta_int sets *out to the value and returns 1, or sets *out = -1 and returns 0 (absent, not
 * a number, or not an integer that fits int64; JSON numbers are doubles, so integers above 2^53 are not exact:
 * send those as strings). sp_meta_int, sp_meta_num and sp_meta_strcpy read the text in place and allocate
 * nothing; sp_meta_str returns a NUL-terminated string out of the tree (sp_msg_meta builds it on the first string
 * found, so it allocates once per message). */
const char *sp_meta_str(const sp_msg *m, const char *key);
int sp_meta_int(const sp_msg *m, const char *key, int64_t *out); /* 1 if present and an integer */
int sp_meta_num(const sp_msg *m, const char *key, double *out);  /* 1 if present and a number (else *out = 0) */
/* Copies a string member (unescaped, NUL-terminated) into out: 1, or 0 when absent, not a string, or longer than
 * cap - 1 bytes (out = ""). */
int sp_meta_strcpy(const sp_msg *m, const char *key, char *out, size_t cap);

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

#endif
