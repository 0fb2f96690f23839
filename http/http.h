/* http.h - a small HTTP/1.1 server for sepal's front ends: `serve`'s OpenAI-compatible endpoint, and any
 * program that needs to answer plain HTTP (sepal-server's metrics). It depends on common/ alone.
 *
 * One thread accepts; every connection gets a thread of its own (at most max_conns at once: one more is
 * answered 503 and closed), which reads a request, calls the handler on that same thread, and goes on with the
 * next request of the connection (keep-alive, pipelined requests in order). A handler may take as long as it
 * likes (a generation) and may stream its answer (chunked; server-sent events are written that way).
 *
 * Requests are read strictly, within limits (sp_http_limits): the request line and each header line at most
 * max_line bytes (414 / 431), at most max_headers headers and max_head bytes of head (431), a body of at most
 * max_body bytes given by Content-Length (413; a Transfer-Encoding is 501, two different lengths 400), HTTP/1.0
 * or 1.1 only (505), Host required in 1.1, `Expect: 100-continue` honoured. A request must arrive whole within
 * request_timeout_ms of its first byte, however slowly it trickles (408 then); a connection idle for
 * idle_timeout_ms between requests is closed; a write that cannot go on for write_timeout_ms ends the
 * connection. A malformed request is answered with its status and the connection closed; the process and the
 * other connections go on. The error bodies are the owner's (error_body), plain text otherwise.
 *
 * sp_http_stop stops accepting, tells the handlers (sp_http_stopping: they end their work and answer), closes
 * the idle connections and waits for every thread. The threads block every signal (the owner's thread gets
 * them). Nothing here prints. */
#ifndef SEPAL_HTTP_H
#define SEPAL_HTTP_H

#include <stddef.h>

#include "status.h"

typedef struct sp_http_limits {
    size_t max_line;        /* request line and each header line (default 8192) */
    int max_headers;        /* default 64 */
    size_t max_head;        /* request line + headers (default 32768) */
    size_t max_body;        /* default 1 MiB */
    int request_timeout_ms; /* a whole request, from its first byte (default 10000) */
    int idle_timeout_ms;    /* between requests of a connection (default 30000) */
    int write_timeout_ms;   /* a write making no progress (default 10000) */
    int max_conns;          /* connections at once (default 64) */
} sp_http_limits;

typedef struct sp_http_header {
    const char *name, *value; /* value without its leading and trailing blanks */
} sp_http_header;

#define SP_HTTP_MAX_HEADERS 256

typedef struct sp_http_req {
    const char *method; /* "GET", "POST", ... */
    const char *target; /* as sent: "/v1/models?x=1" */
    const char *path;   /* the target without its query: "/v1/models" */
    int minor;          /* HTTP/1.minor */
    int nheaders;
    sp_http_header headers[SP_HTTP_MAX_HEADERS];
    const char *body;   /* body_len bytes, then a NUL ("" when none) */
    size_t body_len;
} sp_http_req;

/* The value of header name (any case), or NULL. */
const char *sp_http_header_get(const sp_http_req *r, const char *name);

typedef struct sp_http sp_http;           /* a server */
typedef struct sp_http_conn sp_http_conn; /* a connection, for its handler to answer on */

/* Answers the request: status, content type, extra header lines (each ending "\r\n"; NULL: none), body. 0, or
 * -1 when the peer is gone (or an answer was given already). */
int sp_http_respond(sp_http_conn *c, int status, const char *ctype, const char *extra, const char *body, size_t len);
/* An answer streamed in pieces (chunked in HTTP/1.1; HTTP/1.0 ends it by closing): begin, write (each piece
 * sent at once; an empty one is skipped), end. Each returns 0, or -1 when the peer is gone. */
int sp_http_stream_begin(sp_http_conn *c, int status, const char *ctype, const char *extra);
int sp_http_stream_write(sp_http_conn *c, const char *data, size_t len);
int sp_http_stream_end(sp_http_conn *c);
/* 1 when the peer has closed its side (or reset): work for it can stop. Reads nothing. */
int sp_http_peer_gone(sp_http_conn *c);
/* 1 once sp_http_stop was called: a handler ends its work and answers. */
int sp_http_stopping(const sp_http_conn *c);
/* "127.0.0.1:5555", the peer's address. */
const char *sp_http_peer(const sp_http_conn *c);

/* Called on the connection's thread for every well-formed request; it answers with sp_http_respond or a
 * stream (no answer: 500). */
typedef void (*sp_http_handler)(sp_http_conn *c, const sp_http_req *r, void *user);
/* The body of an error the server itself answers (400, 408, 413, 414, 431, 501, 503, 505, 500): written into
 * buf (at most cap bytes), its content type into *ctype; returns its length. */
typedef size_t (*sp_http_error_fn)(int status, const char *msg, char *buf, size_t cap, const char **ctype, void *user);

typedef struct sp_http_opts {
    const char *host;  /* an address to bind (a name is resolved); NULL: 127.0.0.1 */
    int port;          /* 0: any free port (sp_http_port says which) */
    sp_http_limits lim; /* zero fields: the defaults */
    sp_http_handler handler;
    sp_http_error_fn error_body; /* NULL: plain text */
    void *user;
} sp_http_opts;

/* Binds, listens and starts accepting. Errors: "cannot listen on HOST:PORT: Address already in use". */
sp_status sp_http_start(sp_http **out, const sp_http_opts *o, sp_err *err);
int sp_http_port(const sp_http *s);
/* Connections open now (handlers running or idle keep-alive ones). */
int sp_http_conns(sp_http *s);
/* Stops (see above), waits for every handler, frees s. */
void sp_http_stop(sp_http *s);

/* "Bad Request" for 400, ... ("Unknown" for a code it does not know). */
const char *sp_http_reason(int status);

#endif
