/* auth.c - the swarm key exchange (share/doc/protocol.md, "AUTH"): a mutual HMAC-SHA256 challenge-response
 * that comes before anything else on a connection to a server with a swarm key.
 *
 *   client -> server  AUTH {"nonce": Nc, "swarm": id}                     Nc: 32 fresh random bytes (hex)
 *   server -> client  AUTH reply {"nonce": Ns, "proof": HMAC(K, "sepal/v1/server" | Nc | Ns)}
 *   client -> server  AUTH {"proof": HMAC(K, "sepal/v1/client" | Ns | Nc)}
 *   server -> client  AUTH reply {"ok": true}
 *
 * K is the key's auth subkey (swarmkey.h). Each side proves the key over the other's fresh nonce, so a
 * recorded exchange proves nothing on another connection (no replay, and no clock needed), and the labels
 * differ, so a proof one side makes never passes for the other's. Tags are compared in constant time. A
 * failure is an ERROR "unauthorized" and a ws close 1008 on the server's side, a clear error on the client's. */
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "timeutil.h"
#include "transport_impl.h"

#define NONCE 32
#define AUTH_LIMIT 4096

static const char SERVER_LABEL[] = "sepal/v1/server";
static const char CLIENT_LABEL[] = "sepal/v1/client";

/* HMAC(K, label | a | b) over two nonces. */
static int proof(const sp_swarm_key *k, const char *label, const uint8_t *a, const uint8_t *b, uint8_t out[SP_HMAC_BYTES])
{
    const void *parts[3] = {label, a, b};
    size_t lens[3] = {strlen(label), NONCE, NONCE};
    return sp_hmac_sha256(k->auth, parts, lens, 3, out);
}

/* Metadata text for the messages below (sp_auth_* of proto.h: nonces and proofs in hex). */
#define AUTH_META 512

/* ---------------------------------------------------------------------------------------------- */
/* server */

static int refuse(sp_ws_server *s, conn *c, uint64_t reqid, const char *why)
{
    pthread_mutex_lock(&s->mu);
    s->st.auth_failed++;
    char who[48];
    snprintf(who, sizeof who, "%s", c->src ? c->src->name : "?");
    pthread_mutex_unlock(&s->mu);
    sp_log_limited(&tp_log_refused, SP_LOG_WARN, "transport: conn %llu from %s refused: %s", (unsigned long long)c->id,
                   who, why);
    c->fail.reply = 1;
    c->fail.reqid = reqid;
    c->fail.errcode = "unauthorized";
    tp_defer_close(c->wsi, &c->fail, LWS_CLOSE_STATUS_POLICY_VIOLATION, why);
    return -1;
}

/* Queues a reply of the exchange on c (service thread): meta from sp_auth_*_encode, nothing if that failed (""). */
static void reply(sp_ws_server *s, conn *c, uint64_t id, const char *meta)
{
    sp_buf b = {0};
    if (!meta[0] || sp_msg_encode(&b, SP_MSG_AUTH, SP_MSG_F_REPLY, id, meta, NULL, 0, NULL)) {
        sp_buf_free(&b);
        return;
    }
    pthread_mutex_lock(&s->mu);
    uint64_t len = b.len;
    if (tp_msgq_push(&c->txq, &b) == 0)
        tp_charge(s, c, 0, (int64_t)len);
    pthread_mutex_unlock(&s->mu);
    lws_callback_on_writable(c->wsi);
}

static int challenge(sp_ws_server *s, conn *c, const sp_msg *m)
{
    sp_auth_hello h;
    sp_auth_challenge ch;
    char why[160], meta[AUTH_META];
    int ok = sp_auth_hello_decode(m, &h, NULL) == SP_OK;
    if (ok && h.swarm[0] && strcmp(h.swarm, s->key.id_hex)) {
        snprintf(why, sizeof why, "another swarm key (the peer's swarm is %.16s, this server's is %s)", h.swarm,
                 s->key.id_hex);
        return refuse(s, c, m->request_id, why);
    }
    if (!ok || sp_random_bytes(c->nonce_s, NONCE) ||
        proof(&s->key, SERVER_LABEL, h.nonce, c->nonce_s, ch.proof))
        return refuse(s, c, m->request_id, "malformed swarm key exchange (AUTH needs a 64-hex-digit nonce)");
    memcpy(c->nonce_c, h.nonce, NONCE);
    memcpy(ch.nonce, c->nonce_s, NONCE);
    sp_auth_challenge_encode(&ch, meta, sizeof meta, NULL); /* "" if it failed: no reply, the client times out */
    reply(s, c, m->request_id, meta);
    c->auth = AUTH_CHALLENGED;
    return 0;
}

static int verify(sp_ws_server *s, conn *c, const sp_msg *m)
{
    uint8_t want[SP_HMAC_BYTES];
    sp_auth_proof p;
    sp_auth_verdict v = {.ok = 1};
    char meta[AUTH_META];
    if (sp_auth_proof_decode(m, &p, NULL) || proof(&s->key, CLIENT_LABEL, c->nonce_s, c->nonce_c, want) ||
        !sp_ct_equal(p.proof, want, sizeof want))
        return refuse(s, c, m->request_id, "wrong swarm key (the proof does not match this server's key)");
    sp_auth_verdict_encode(&v, meta, sizeof meta, NULL);
    reply(s, c, m->request_id, meta);
    c->auth = AUTH_DONE;
    return 0;
}

int tp_auth_server(sp_ws_server *s, conn *c, const sp_buf *msg)
{
    sp_msg_header h = {0};
    sp_msg_header_read(msg->data, msg->len, &h);
    if (!s->has_key)
        return refuse(s, c, h.request_id, "this server has no swarm key (it is not in a private swarm)");
    if (h.type != SP_MSG_AUTH)
        return refuse(s, c, h.request_id,
                      "this server is in a private swarm: connect with its swarm key (--swarm-key FILE)");
    sp_proto_limits lim = {.max_message = AUTH_LIMIT, .max_meta = AUTH_LIMIT};
    sp_msg m;
    if (c->auth == AUTH_DONE || sp_msg_decode(&m, msg->data, msg->len, &lim, NULL) != SP_OK)
        return refuse(s, c, h.request_id, "malformed swarm key exchange");
    int r = c->auth == AUTH_NONE ? challenge(s, c, &m) : verify(s, c, &m);
    sp_msg_clear(&m);
    return r;
}

/* ---------------------------------------------------------------------------------------------- */
/* client */

/* Sends an AUTH request with meta and waits for the answer, decoded into *m (its buffer in *b). */
static sp_status exchange(sp_ws_client *c, uint64_t id, const char *meta, sp_msg *m, sp_buf *b, uint64_t until,
                          sp_err *err)
{
    sp_buf q = {0};
    sp_status st = sp_msg_encode(&q, SP_MSG_AUTH, 0, id, meta, NULL, 0, err);
    if (!st)
        st = sp_ws_client_send(c, &q, err);
    else
        sp_buf_free(&q);
    int left = (int)((until > sp_now_ns() ? until - sp_now_ns() : 0) / 1000000);
    if (!st)
        st = sp_ws_client_recv(c, b, left, err);
    if (st)
        return st;
    sp_proto_limits lim = {.max_message = AUTH_LIMIT, .max_meta = AUTH_LIMIT};
    if (sp_msg_decode(m, b->data, b->len, &lim, err) != SP_OK) {
        sp_buf_free(b);
        return sp_err_prefix(err, "the swarm key exchange: ");
    }
    return SP_OK;
}

/* What an answer that is not the expected AUTH reply means. */
static sp_status unexpected(sp_ws_client *c, const sp_msg *m, sp_err *err)
{
    sp_error_reply e;
    int is_error = m->type == SP_MSG_ERROR && sp_error_reply_decode(m, &e, NULL) == SP_OK;
    const char *code = is_error ? e.code : NULL, *text = is_error && e.message[0] ? e.message : NULL;
    if (code && !strcmp(code, "unknown_type"))
        return sp_errf(err, SP_ERR_STATE, "%s:%d does not know the swarm key exchange (an older sepal-server): it is "
                       "not in this private swarm", c->host, c->port);
    if (code)
        return sp_errf(err, SP_ERR_STATE, "%s:%d refused the swarm key: %s", c->host, c->port, text ? text : code);
    return sp_errf(err, SP_ERR_STATE, "%s:%d answered the swarm key exchange with %s", c->host, c->port,
                   sp_msg_type_name(m->type));
}

sp_status tp_auth_client(sp_ws_client *c, int timeout_ms, sp_err *err)
{
    uint64_t until = tp_deadline_after(timeout_ms < 0 ? 30000 : timeout_ms);
    uint8_t want[SP_HMAC_BYTES];
    sp_auth_hello h = {.swarm = ""};
    sp_auth_challenge ch;
    sp_auth_proof p;
    sp_auth_verdict v;
    char meta[AUTH_META];
    if (sp_random_bytes(h.nonce, NONCE))
        return sp_errf(err, SP_ERR_IO, "no random bytes for the swarm key exchange");
    snprintf(h.swarm, sizeof h.swarm, "%s", c->key.id_hex);
    sp_msg m;
    sp_buf b = {0};
    sp_status st = sp_auth_hello_encode(&h, meta, sizeof meta, err);
    if (!st)
        st = exchange(c, 1, meta, &m, &b, until, err);
    if (st)
        return st;
    if (m.type != SP_MSG_AUTH)
        st = unexpected(c, &m, err);
    else if (sp_auth_challenge_decode(&m, &ch, NULL) || proof(&c->key, SERVER_LABEL, h.nonce, ch.nonce, want) ||
             !sp_ct_equal(ch.proof, want, sizeof want))
        st = sp_errf(err, SP_ERR_STATE, "%s:%d is not in this private swarm (its proof of the swarm key is wrong)",
                     c->host, c->port);
    sp_msg_clear(&m);
    sp_buf_free(&b);
    if (st) {
        tp_cli_fail(c, "swarm key mismatch");
        return st;
    }
    if (proof(&c->key, CLIENT_LABEL, ch.nonce, h.nonce, p.proof))
        return sp_errf(err, SP_ERR_IO, "the swarm key exchange: HMAC failed");
    st = sp_auth_proof_encode(&p, meta, sizeof meta, err);
    if (!st)
        st = exchange(c, 2, meta, &m, &b, until, err);
    if (st)
        return st;
    if (m.type != SP_MSG_AUTH || sp_auth_verdict_decode(&m, &v, NULL) || !v.ok)
        st = unexpected(c, &m, err);
    sp_msg_clear(&m);
    sp_buf_free(&b);
    return st;
}
