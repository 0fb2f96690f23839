/* push.h - server-to-server push of a step's output (push.c): one push sent and its acknowledgement awaited, or
 * several sent before any is awaited (a pass's). */
#ifndef SEPAL_PUSH_H
#define SEPAL_PUSH_H

#include "proto.h"
#include "remote.h"
#include "server.h"

/* Sends INFERENCE_PUSH of hidden (the output of step `step`) to the session push_session of the server at
 * push_host:push_port (q's push fields), over a connection kept for the next pushes, and waits for its
 * acknowledgement (at most 2 s from the send): SP_OK once that server has it. sp_push_send is sp_push_begin then
 * sp_push_finish. */
sp_status sp_push_send(sp_server *s, const sp_step_req *q, const sp_tensor_src *hidden, sp_err *err);
/* A push in flight (sp_push_begin), or one that failed before it went out (st set, nothing in flight). It must not
 * move until sp_push_finish (the connection hands its acknowledgement into rep). */
typedef struct sp_push_pending {
    sp_remote *r;        /* the connection it went out on (NULL: it did not go out) */
    int kept;            /* r is in the server's table (else one of its own, closed when it finishes) */
    uint64_t id;         /* its request id on r */
    double sent_s;       /* when it went out (sp_now_s) */
    sp_reply rep;        /* the acknowledgement */
    sp_status st;        /* why it did not go out */
    sp_err err;
} sp_push_pending;
/* Sends the push of sp_push_send without waiting: a pass sends all its pushes, then finishes each (their
 * acknowledgements come back meanwhile). Every sp_push_begin must be followed by one sp_push_finish of p. */
void sp_push_begin(sp_server *s, const sp_step_req *q, const sp_tensor_src *hidden, sp_push_pending *p);
/* Waits for p's acknowledgement (what is left of its 2 s): sp_push_send's status. A connection that failed is
 * closed once no push is in flight on it any more, never before. */
sp_status sp_push_finish(sp_server *s, sp_push_pending *p, sp_err *err);

#endif
