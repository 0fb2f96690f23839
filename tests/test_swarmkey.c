/* test_swarmkey.c - a private swarm: the key file, HMAC-SHA256 (a known answer from the openssl command), sealed
 * DHT records (AES-256-GCM: opaque to outsiders, opened only with the key); the swarm key exchange over real sockets (in-process transport and a real sepal-server): a keyed
 * client and server work, an unkeyed or wrong-keyed client is refused before anything reaches a handler (the
 * server's counters say so), a client refuses a server without the key, a replayed proof is refused by the server
 * and a replayed challenge by the client; and a keyed swarm over the DHT, where an unkeyed server and a forged
 * record stay out of a keyed client's view and the servers ping only each other; a keyed server's ping of an
 * unkeyed one fails the key exchange and counts as no ping; an outsider (no key, another key) on a keyed swarm's DHT
 * lists no server, counts the records it cannot open, and the raw values show no name, address or port. White-box
 * in one place: it reads the runtime's DHT view's counters (private/runtime_state.h). */
#include <arpa/inet.h>
#include <cJSON.h>
#include <check.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "attack.h"
#include "dht.h"
#include "generate.h"
#include "record.h"
#include "remote.h"
#include "runtime.h"
#include "runtime_state.h"
#include "swarmkey.h"
#include "testutil.h"
#include "timeutil.h"
#include "transport.h"
#include "view.h"

#define M15 SEPAL_STORIES15M_DIR
#define TMO 20000

/* A fresh key file (mode 0600) and its key. */
static const char *new_key(sp_swarm_key *k)
{
    static char paths[4][512];
    static int next;
    char *p = paths[next++ % 4];
    snprintf(p, 512, "%s/swarm.key", sp_test_tmpdir());
    sp_err err = {0};
    ck_assert_msg(sp_swarm_key_generate(p, &err) == SP_OK, "%s", err.msg);
    if (k)
        ck_assert_msg(sp_swarm_key_load(k, p, &err) == SP_OK, "%s", err.msg);
    return p;
}

/* ---------------------------------------------------------------------------------------------- */
/* the key, the MAC, the records */

START_TEST(t_key_file)
{
    sp_swarm_key a, b, c;
    const char *pa = new_key(&a), *pc = new_key(&c);
    sp_err err = {0};
    struct stat st;
    ck_assert_int_eq(stat(pa, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0600);
    ck_assert_int_eq(sp_swarm_key_load(&b, pa, &err), SP_OK); /* the same file, the same subkeys */
    ck_assert(!memcmp(&a, &b, sizeof a));
    ck_assert_str_ne(a.id_hex, c.id_hex);
    ck_assert(memcmp(a.auth, c.auth, sizeof a.auth));
    ck_assert_int_eq(sp_swarm_key_generate(pa, &err), SP_ERR_STATE); /* never overwritten */
    ck_assert_msg(strstr(err.msg, "never overwritten"), "%s", err.msg);
    ck_assert_int_eq(sp_swarm_key_load(&b, pa, &err), SP_OK);
    ck_assert(!memcmp(&a, &b, sizeof a));
    ck_assert_int_eq(chmod(pc, 0644), 0); /* readable by others: refused, with the fix */
    ck_assert_int_eq(sp_swarm_key_load(&b, pc, &err), SP_ERR_STATE);
    ck_assert_msg(strstr(err.msg, "chmod 600"), "%s", err.msg);
    const char *bad[] = {"", "sepal-swarm-key/1 00", "sepal-swarm-key/2 " "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
                         "sepal-swarm-key/1 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1g"};
    for (int i = 0; i < 4; i++) {
        const char *p = sp_test_write_file("k", bad[i], strlen(bad[i]));
        ck_assert_int_eq(chmod(p, 0600), 0);
        ck_assert_int_eq(sp_swarm_key_load(&b, p, &err), SP_ERR_FORMAT);
        ck_assert_msg(strstr(err.msg, "--gen-swarm-key"), "%s", err.msg);
    }
    ck_assert_int_eq(sp_swarm_key_load(&b, "/nonexistent/swarm.key", &err), SP_ERR_NOTFOUND);
    /* the subkeys: HMAC(key, label), as `openssl dgst -sha256 -mac HMAC -macopt hexkey:KEY` computes them */
    const char *line = "sepal-swarm-key/1 9f73d8f518d16a8833d61b20d3001d38849de17cf5ea0c39fe7d260164f6fc24\n";
    const char *p = sp_test_write_file("k", line, strlen(line));
    ck_assert_int_eq(chmod(p, 0600), 0);
    ck_assert_int_eq(sp_swarm_key_load(&b, p, &err), SP_OK);
    ck_assert_str_eq(b.id_hex, "1fa12f6d7037158e");
    char hex[65];
    sp_hex_encode(b.auth, 32, hex);
    ck_assert_str_eq(hex, "f1491a44d11c4338bdc279e67cd2509a97b62a3f67bc6b377025d49f07510f92");
}
END_TEST

START_TEST(t_hmac)
{
    uint8_t key[32], out[32];
    for (int i = 0; i < 32; i++)
        key[i] = (uint8_t)i;
    const char *a = "sepal hmac ", *b = "known answer";
    const void *parts[2] = {a, b};
    size_t lens[2] = {strlen(a), strlen(b)};
    ck_assert_int_eq(sp_hmac_sha256(key, parts, lens, 2, out), 0); /* parts are concatenated */
    char hex[65];
    sp_hex_encode(out, 32, hex);
    ck_assert_str_eq(hex, "b0859910f7a9d3372222b3542d90e2500cfc868c832c16ae17224b2abe20b1a7");
    uint8_t x[32];
    memcpy(x, out, 32);
    ck_assert(sp_ct_equal(x, out, 32));
    x[31] ^= 1;
    ck_assert(!sp_ct_equal(x, out, 32));
    ck_assert_int_eq(sp_hex_decode(hex, x, 32), 0);
    ck_assert(sp_ct_equal(x, out, 32));
    ck_assert_int_eq(sp_hex_decode("0g", x, 1), -1);
}
END_TEST

static void some_record(sp_server_record *r)
{
    memset(r, 0, sizeof *r);
    snprintf(r->id, sizeof r->id, "0123456789abcdef");
    snprintf(r->host, sizeof r->host, "127.0.0.1");
    r->port = 4001;
    snprintf(r->model, sizeof r->model, "stories15M");
    r->num_blocks = 6;
    r->end = 6;
    r->state = SP_SERVER_ONLINE;
    snprintf(r->dtype, sizeof r->dtype, "f32");
    snprintf(r->quant, sizeof r->quant, "none");
    snprintf(r->version, sizeof r->version, "0.1.0");
    r->timestamp = sp_wall_s();
    r->period = 30;
}

/* r encoded into buf (which must succeed: *len its bytes) and decoded back: the decode's status. */
static sp_status round_trip(const sp_server_record *r, char *buf, size_t *len, sp_server_record *back, sp_err *err)
{
    ck_assert_int_eq(sp_record_encode(r, buf, SP_RECORD_MAX, len, err), SP_OK);
    return sp_record_decode(back, buf, *len, NULL, err);
}

/* A record's queue_wait (the server's load) goes through; a record without it (an older server's) reads as 0,
 * one with a negative or non-numeric value is refused. */
START_TEST(t_record_queue_wait)
{
    sp_server_record r, back;
    some_record(&r);
    r.queue_wait = 0.375;
    char buf[SP_RECORD_MAX];
    size_t len;
    sp_err err = {0};
    ck_assert_int_eq(round_trip(&r, buf, &len, &back, &err), SP_OK);
    ck_assert_double_eq(back.queue_wait, 0.375);
    char *at = memmem(buf, len, "\"queue_wait\":0.375,", 19);
    ck_assert_ptr_nonnull(at);
    memmove(at, at + 19, len - (size_t)(at + 19 - buf)); /* absent */
    ck_assert_int_eq(sp_record_decode(&back, buf, len - 19, NULL, &err), SP_OK);
    ck_assert_double_eq(back.queue_wait, 0);
    r.queue_wait = -1;
    ck_assert_int_ne(round_trip(&r, buf, &len, &back, &err), SP_OK);
    ck_assert_msg(strstr(err.msg, "queue_wait"), "%s", err.msg);
    /* its bound: said when set, read back; absent (none, or an older server) reads as 0 */
    r.queue_wait = 0.5;
    r.max_queue_wait = 0.25;
    ck_assert_int_eq(round_trip(&r, buf, &len, &back, &err), SP_OK);
    ck_assert_ptr_nonnull(memmem(buf, len, "\"max_queue_wait\":0.25", 20));
    ck_assert_double_eq(back.max_queue_wait, 0.25);
    r.max_queue_wait = 0;
    ck_assert_int_eq(round_trip(&r, buf, &len, &back, &err), SP_OK);
    ck_assert_ptr_null(memmem(buf, len, "max_queue_wait", 14));
    ck_assert_double_eq(back.max_queue_wait, 0);
}
END_TEST

/* A record's capabilities (what the server can take pushed) go through; a record without them (an older server's)
 * reads as none, one with a negative value is refused. */
START_TEST(t_record_caps)
{
    sp_server_record r, back;
    some_record(&r);
    r.caps = 3;
    char buf[SP_RECORD_MAX];
    size_t len;
    sp_err err = {0};
    ck_assert_int_eq(round_trip(&r, buf, &len, &back, &err), SP_OK);
    ck_assert_ptr_nonnull(memmem(buf, len, "\"caps\":3", 8));
    ck_assert_int_eq(back.caps, 3);
    r.caps = 0;
    back.caps = 7;
    ck_assert_int_eq(round_trip(&r, buf, &len, &back, &err), SP_OK);
    ck_assert_ptr_null(memmem(buf, len, "caps", 4));
    ck_assert_int_eq(back.caps, 0);
    r.caps = -1;
    ck_assert_int_ne(round_trip(&r, buf, &len, &back, &err), SP_OK);
    ck_assert_msg(strstr(err.msg, "caps"), "%s", err.msg);
}
END_TEST

START_TEST(t_record_seal)
{
    sp_swarm_key k, other;
    new_key(&k);
    new_key(&other);
    sp_server_record r, back;
    some_record(&r);
    snprintf(r.name, sizeof r.name, "secret-name");
    char buf[SP_RECORD_MAX], again[SP_RECORD_MAX], plain[SP_RECORD_MAX + 2];
    size_t len, len2, plen, raw;
    sp_err err = {0};
    ck_assert_int_eq(sp_record_encode(&r, buf, sizeof buf, &len, &err), SP_OK);
    raw = len;
    ck_assert_int_eq(sp_record_unseal(buf, len, &k, plain, sizeof plain, &plen, &err), SP_ERR_FORMAT); /* open */
    ck_assert_msg(strstr(err.msg, "not sealed"), "%s", err.msg);
    ck_assert(!sp_record_is_sealed(buf, len, NULL, NULL));
    memcpy(again, buf, len);
    len2 = len;
    ck_assert_int_eq(sp_record_seal(buf, sizeof buf, &len, &k, &err), SP_OK);
    ck_assert_int_eq(sp_record_seal(again, sizeof again, &len2, &k, &err), SP_OK);
    ck_assert_uint_eq(len, raw + SP_RECORD_SEAL_OVERHEAD);
    ck_assert_msg(memcmp(buf, again, len), "two sealings of one record are the same bytes (a nonce reused)");
    /* an outsider sees the swarm id and the length, nothing of the record */
    char swarm[17];
    ck_assert(sp_record_is_sealed(buf, len, swarm, NULL));
    ck_assert_str_eq(swarm, k.id_hex);
    const char *secrets[] = {"secret-name", "127.0.0.1", "4001", "stories15M", "0123456789abcdef", "online"};
    for (size_t i = 0; i < sizeof secrets / sizeof *secrets; i++)
        ck_assert_msg(!memmem(buf, len, secrets[i], strlen(secrets[i])), "'%s' readable in the sealed value", secrets[i]);
    ck_assert_int_ne(sp_record_decode(&back, buf, len, NULL, &err), SP_OK); /* a reader without the key: nothing */
    ck_assert_int_eq(sp_record_unseal(buf, len, &k, plain, sizeof plain, &plen, &err), SP_OK);
    ck_assert_uint_eq(plen, raw);
    ck_assert_int_eq(sp_record_decode(&back, plain, plen, NULL, &err), SP_OK);
    ck_assert_str_eq(back.id, r.id);
    ck_assert_str_eq(back.name, "secret-name");
    ck_assert_int_eq(sp_record_unseal(buf, len, &other, plain, sizeof plain, &plen, &err), SP_ERR_FORMAT);
    ck_assert_msg(strstr(err.msg, "sealed for swarm") && strstr(err.msg, k.id_hex), "%s", err.msg);
    for (size_t at = 0; at < len; at += 7) { /* any byte altered, in clear or sealed: it does not open */
        char forged[SP_RECORD_MAX];
        memcpy(forged, buf, len);
        forged[at] ^= 0x20;
        ck_assert_int_eq(sp_record_unseal(forged, len, &k, plain, sizeof plain, &plen, &err), SP_ERR_FORMAT);
    }
    memcpy(buf + 4, other.id, SP_SWARM_ID_BYTES); /* another swarm's id on this swarm's sealing */
    ck_assert_int_eq(sp_record_unseal(buf, len, &other, plain, sizeof plain, &plen, &err), SP_ERR_FORMAT);
    ck_assert_msg(strstr(err.msg, "does not open"), "%s", err.msg);
    len = raw; /* no room for the sealing */
    ck_assert_int_eq(sp_record_encode(&r, buf, sizeof buf, &len, &err), SP_OK);
    ck_assert_int_eq(sp_record_seal(buf, len + 10, &len, &k, &err), SP_ERR_RANGE);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* the exchange over the transport */

typedef struct echo {
    sp_ws_server *s;
    pthread_mutex_t mu;
    int nmsg;
} echo;

static void on_msg(void *u, uint64_t conn, sp_buf *m)
{
    echo *e = u;
    pthread_mutex_lock(&e->mu);
    e->nmsg++;
    sp_ws_server *s = e->s;
    pthread_mutex_unlock(&e->mu);
    sp_ws_server_send(s, conn, m, NULL);
}

static void on_close(void *u, uint64_t conn)
{
    (void)u, (void)conn;
}

static void echo_start(echo *e, const sp_swarm_key *key)
{
    memset(e, 0, sizeof *e);
    pthread_mutex_init(&e->mu, NULL);
    sp_transport_opts o;
    sp_transport_opts_default(&o);
    o.key = key;
    sp_err err = {0};
    sp_ws_server *s = NULL;
    ck_assert_msg(sp_ws_server_start(&s, &o, on_msg, on_close, e, &err) == SP_OK, "%s", err.msg);
    pthread_mutex_lock(&e->mu);
    e->s = s;
    pthread_mutex_unlock(&e->mu);
}

static int echo_count(echo *e)
{
    pthread_mutex_lock(&e->mu);
    int n = e->nmsg;
    pthread_mutex_unlock(&e->mu);
    return n;
}

static sp_status client(int port, const sp_swarm_key *key, sp_ws_client **c, sp_err *err)
{
    sp_transport_opts o;
    sp_transport_opts_default(&o);
    o.key = key;
    return sp_ws_client_connect(c, "127.0.0.1", port, &o, 5000, err);
}

static void ping(sp_ws_client *c, uint64_t id)
{
    sp_buf b = {0}, r = {0};
    sp_err err = {0};
    ck_assert_int_eq(sp_msg_encode(&b, SP_MSG_PING, 0, id, NULL, NULL, 0, NULL), SP_OK);
    ck_assert_int_eq(sp_ws_client_send(c, &b, NULL), SP_OK);
    ck_assert_msg(sp_ws_client_recv(c, &r, TMO, &err) == SP_OK, "%s", err.msg);
    sp_buf_free(&r);
}

/* The first message of a client without the key gets ERROR "unauthorized", then the close. */
static void refused_unkeyed(int port)
{
    sp_ws_client *c = NULL;
    sp_err err = {0};
    ck_assert_int_eq(client(port, NULL, &c, &err), SP_OK); /* nothing to prove: it connects */
    sp_buf b = {0}, r = {0};
    ck_assert_int_eq(sp_msg_encode(&b, SP_MSG_PING, 0, 9, NULL, NULL, 0, NULL), SP_OK);
    ck_assert_int_eq(sp_ws_client_send(c, &b, NULL), SP_OK);
    ck_assert_msg(sp_ws_client_recv(c, &r, TMO, &err) == SP_OK, "%s", err.msg);
    sp_msg m;
    sp_proto_limits lim = sp_proto_default_limits();
    ck_assert_int_eq(sp_msg_decode(&m, r.data, r.len, &lim, NULL), SP_OK);
    ck_assert_int_eq(m.type, SP_MSG_ERROR);
    sp_error_reply e;
    ck_assert_int_eq(sp_error_reply_decode(&m, &e, NULL), SP_OK);
    ck_assert_str_eq(e.code, "unauthorized");
    ck_assert_msg(strstr(e.message, "--swarm-key"), "%s", e.message);
    sp_msg_clear(&m);
    sp_buf_free(&r);
    ck_assert_int_eq(sp_ws_client_recv(c, &r, TMO, &err), SP_ERR_CLOSED);
    sp_ws_client_close(c);
}

START_TEST(t_transport_exchange)
{
    sp_swarm_key k, other;
    new_key(&k);
    new_key(&other);
    echo e;
    echo_start(&e, &k);
    int port = sp_ws_server_port(e.s);
    sp_ws_client *c = NULL;
    sp_err err = {0};
    ck_assert_msg(client(port, &k, &c, &err) == SP_OK, "%s", err.msg);
    ping(c, 1);
    ping(c, 2);
    sp_ws_client_close(c);
    ck_assert_int_eq(echo_count(&e), 2);
    refused_unkeyed(port);
    ck_assert_int_eq(client(port, &other, &c, &err), SP_ERR_STATE);
    ck_assert_msg(strstr(err.msg, "another swarm key"), "%s", err.msg);
    ck_assert_int_eq(echo_count(&e), 2); /* nothing of theirs reached on_message */
    sp_ws_server_stats st;
    sp_ws_server_stats_get(e.s, &st);
    ck_assert_int_eq((int)st.auth_failed, 2);
    /* a client with a key refuses a server without one */
    echo open;
    echo_start(&open, NULL);
    ck_assert_int_eq(client(sp_ws_server_port(open.s), &k, &c, &err), SP_ERR_STATE);
    ck_assert_msg(strstr(err.msg, "has no swarm key"), "%s", err.msg);
    ck_assert_int_eq(echo_count(&open), 0);
    sp_ws_server_stop(open.s);
    sp_ws_server_stop(e.s);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* replays */

static sp_buf auth_msg(uint64_t id, const char *nonce_hex, const char *proof_hex)
{
    cJSON *o = cJSON_CreateObject();
    if (nonce_hex)
        cJSON_AddStringToObject(o, "nonce", nonce_hex);
    if (proof_hex)
        cJSON_AddStringToObject(o, "proof", proof_hex);
    char *json = cJSON_PrintUnformatted(o);
    sp_buf b = {0};
    ck_assert_int_eq(sp_msg_encode(&b, SP_MSG_AUTH, 0, id, json, NULL, 0, NULL), SP_OK);
    cJSON_free(json);
    cJSON_Delete(o);
    return b;
}

/* Sends m on a raw connection and returns the answer, decoded (caller clears it and frees *raw). */
static sp_msg exchange(int fd, sp_buf *m, uint8_t **raw)
{
    size_t n;
    ck_assert_int_eq(sp_atk_send_msg(fd, m->data, m->len), 0);
    sp_buf_free(m);
    ck_assert_int_eq(sp_atk_recv_msg(fd, raw, &n), 0);
    sp_msg r;
    sp_proto_limits lim = sp_proto_default_limits();
    ck_assert_int_eq(sp_msg_decode(&r, *raw, n, &lim, NULL), SP_OK);
    return r;
}

/* The client's proof for a challenge (what a key holder sends). */
static void client_proof(const sp_swarm_key *k, const uint8_t ns[32], const uint8_t nc[32], char hex[65])
{
    const char *label = "sepal/v1/client";
    const void *parts[3] = {label, ns, nc};
    size_t lens[3] = {strlen(label), 32, 32};
    uint8_t p[32];
    ck_assert_int_eq(sp_hmac_sha256(k->auth, parts, lens, 3, p), 0);
    sp_hex_encode(p, 32, hex);
}

/* A recorded exchange does not open another connection: the server's nonce is fresh each time. */
START_TEST(t_replayed_proof)
{
    sp_swarm_key k;
    new_key(&k);
    echo e;
    echo_start(&e, &k);
    int port = sp_ws_server_port(e.s);
    uint8_t nc[32], ns[32];
    char nc_hex[65], proof[65];
    for (int i = 0; i < 32; i++)
        nc[i] = (uint8_t)(i * 7);
    sp_hex_encode(nc, 32, nc_hex);
    /* a key holder's exchange, recorded */
    int fd = sp_atk_connect("127.0.0.1", port);
    ck_assert_int_eq(sp_atk_upgrade(fd), 0);
    uint8_t *raw;
    sp_buf m = auth_msg(1, nc_hex, NULL);
    sp_msg r = exchange(fd, &m, &raw);
    ck_assert_int_eq(r.type, SP_MSG_AUTH);
    sp_auth_challenge ch;
    ck_assert_int_eq(sp_auth_challenge_decode(&r, &ch, NULL), SP_OK);
    memcpy(ns, ch.nonce, 32);
    client_proof(&k, ns, nc, proof);
    sp_msg_clear(&r);
    free(raw);
    m = auth_msg(2, NULL, proof);
    r = exchange(fd, &m, &raw);
    ck_assert_int_eq(r.type, SP_MSG_AUTH); /* accepted: {"ok": true} */
    sp_auth_verdict v;
    ck_assert(sp_auth_verdict_decode(&r, &v, NULL) == SP_OK && v.ok);
    sp_msg_clear(&r);
    free(raw);
    close(fd);
    /* the same messages again, by someone without the key */
    fd = sp_atk_connect("127.0.0.2", port);
    ck_assert_int_eq(sp_atk_upgrade(fd), 0);
    m = auth_msg(1, nc_hex, NULL);
    r = exchange(fd, &m, &raw);
    ck_assert_int_eq(r.type, SP_MSG_AUTH);
    ck_assert_int_eq(sp_auth_challenge_decode(&r, &ch, NULL), SP_OK);
    ck_assert(memcmp(ns, ch.nonce, 32)); /* a new challenge */
    sp_msg_clear(&r);
    free(raw);
    m = auth_msg(2, NULL, proof);
    r = exchange(fd, &m, &raw);
    ck_assert_int_eq(r.type, SP_MSG_ERROR);
    sp_error_reply er;
    ck_assert_int_eq(sp_error_reply_decode(&r, &er, NULL), SP_OK);
    ck_assert_str_eq(er.code, "unauthorized");
    sp_msg_clear(&r);
    free(raw);
    size_t n;
    ck_assert_int_eq(sp_atk_recv_msg(fd, &raw, &n), -1); /* closed */
    close(fd);
    ck_assert_int_eq(echo_count(&e), 0);
    sp_ws_server_stop(e.s);
}
END_TEST

/* A fake server that answers the upgrade, reads the client's first frame and replays a recorded challenge. */
typedef struct fake {
    int listen_fd, port;
    uint8_t *frame; /* the recorded AUTH reply, as a server frame */
    size_t len;
    pthread_t th;
} fake;

static void *fake_main(void *arg)
{
    fake *f = arg;
    int fd = accept(f->listen_fd, NULL, NULL);
    if (fd < 0)
        return NULL;
    char req[4096];
    size_t n = 0;
    while (n < sizeof req - 1 && !strstr(req, "\r\n\r\n")) {
        ssize_t r = recv(fd, req + n, sizeof req - 1 - n, 0);
        if (r <= 0)
            break;
        n += (size_t)r;
        req[n] = '\0';
    }
    char key[128] = "", *k = strcasestr(req, "Sec-WebSocket-Key:");
    if (k)
        sscanf(k + 18, " %127[^\r]", key);
    char cat[256];
    snprintf(cat, sizeof cat, "%s258EAFA5-E914-47DA-95CA-C5AB0DC85B11", key);
    unsigned char sha[20], acc[64];
    unsigned int sl = 0;
    EVP_Digest(cat, strlen(cat), sha, &sl, EVP_sha1(), NULL);
    EVP_EncodeBlock(acc, sha, 20);
    char resp[512];
    int rn = snprintf(resp, sizeof resp, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      "Sec-WebSocket-Accept: %s\r\nSec-WebSocket-Protocol: sepal\r\n\r\n", acc);
    send(fd, resp, (size_t)rn, MSG_NOSIGNAL);
    uint8_t buf[4096];
    ssize_t r = recv(fd, buf, sizeof buf, 0); /* the client's AUTH (its fresh nonce): ignored */
    if (r > 0)
        send(fd, f->frame, f->len, MSG_NOSIGNAL);
    r = recv(fd, buf, sizeof buf, 0); /* the client closes */
    close(fd);
    return NULL;
}

START_TEST(t_replayed_challenge)
{
    sp_swarm_key k;
    new_key(&k);
    echo e;
    echo_start(&e, &k);
    /* record a real challenge */
    int fd = sp_atk_connect("127.0.0.1", sp_ws_server_port(e.s));
    ck_assert_int_eq(sp_atk_upgrade(fd), 0);
    char nc_hex[65];
    uint8_t nc[32] = {1}, *raw;
    sp_hex_encode(nc, 32, nc_hex);
    sp_buf m = auth_msg(1, nc_hex, NULL);
    ck_assert_int_eq(sp_atk_send_msg(fd, m.data, m.len), 0);
    sp_buf_free(&m);
    size_t n;
    ck_assert_int_eq(sp_atk_recv_msg(fd, &raw, &n), 0);
    close(fd);
    fake f = {0};
    f.frame = malloc(n + 4);
    f.frame[0] = 0x82; /* a server frame: final, binary, unmasked */
    f.frame[1] = 126;
    f.frame[2] = (uint8_t)(n >> 8);
    f.frame[3] = (uint8_t)n;
    memcpy(f.frame + 4, raw, n);
    f.len = n + 4;
    free(raw);
    f.listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    ck_assert_int_eq(bind(f.listen_fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(listen(f.listen_fd, 1), 0);
    getsockname(f.listen_fd, (struct sockaddr *)&a, &al);
    pthread_create(&f.th, NULL, fake_main, &f);
    /* a key holder connecting to the fake gets the replayed challenge: its own nonce is not in the proof */
    sp_ws_client *c = NULL;
    sp_err err = {0};
    ck_assert_int_eq(client(ntohs(a.sin_port), &k, &c, &err), SP_ERR_STATE);
    ck_assert_msg(strstr(err.msg, "is not in this private swarm"), "%s", err.msg);
    pthread_join(f.th, NULL);
    close(f.listen_fd);
    free(f.frame);
    sp_ws_server_stop(e.s);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* a real server */

static sp_runtime *runtime_with(const char *key_path)
{
    sp_runtime *rt = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_runtime_new(&rt, NULL, NULL, &err), SP_OK);
    ck_assert_msg(sp_runtime_load(rt, M15, &err) == SP_OK, "%s", err.msg);
    if (key_path)
        ck_assert_msg(sp_runtime_set_swarm_key(rt, key_path, &err) == SP_OK, "%s", err.msg);
    return rt;
}

static void generates(sp_runtime *rt)
{
    int *ids = NULL, n = 0;
    sp_err err = {0};
    ck_assert_int_eq(sp_tokenizer_encode(sp_runtime_tokenizer(rt), "Once upon a time", 1, &ids, &n, &err), SP_OK);
    sp_lm_swarm sw;
    sp_lm lm = sp_lm_swarm_make(&sw, rt);
    sp_gen_opts o;
    sp_gen_opts_default(&o);
    o.max_new = 8;
    const int32_t *ps[1] = {ids};
    sp_gen_result r;
    ck_assert_msg(sp_generate(&lm, sp_runtime_tokenizer(rt), ps, &n, 1, &o, NULL, NULL, &r, &err) == SP_OK, "%s", err.msg);
    ck_assert_str_eq(r.text[0], ", there was a little girl named L");
    sp_gen_result_free(&r);
    free(ids);
}

/* INFO through a keyed connection: the server's state. */
static sp_info_reply info_of(int port, const sp_swarm_key *k)
{
    sp_remote *r = NULL;
    sp_remote_opts o = {.no_bulk = 1, .key = k};
    sp_err err = {0};
    sp_info_reply a;
    ck_assert_msg(sp_remote_connect_opts(&r, "127.0.0.1", port, &o, TMO, &err) == SP_OK, "%s", err.msg);
    ck_assert_msg(sp_remote_get_info(r, &a, TMO, &err) == SP_OK, "%s", err.msg);
    sp_remote_close(r);
    return a;
}

START_TEST(t_keyed_server)
{
    sp_swarm_key k;
    const char *path = new_key(&k), *wrong = new_key(NULL);
    const char *args[] = {"--model", M15, "--blocks", "0:6", "--no-measure", "--swarm-key", path, NULL};
    sp_test_proc p;
    ck_assert(sp_test_server_start(&p, args) == 0);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", p.port);
    sp_runtime *rt = runtime_with(path);
    sp_err err = {0};
    ck_assert_msg(sp_runtime_connect(rt, addr, &err) == SP_OK, "%s", err.msg);
    generates(rt);
    sp_runtime_free(rt);
    double served = (double)info_of(p.port, &k).requests; /* the key holder's, this HELLO and INFO included */
    ck_assert_double_gt(served, 10);
    rt = runtime_with(NULL);
    ck_assert_int_ne(sp_runtime_connect(rt, addr, &err), SP_OK);
    ck_assert_msg(strstr(err.msg, "unauthorized") && strstr(err.msg, "--swarm-key"), "%s", err.msg);
    sp_runtime_free(rt);
    rt = runtime_with(wrong);
    ck_assert_int_ne(sp_runtime_connect(rt, addr, &err), SP_OK);
    ck_assert_msg(strstr(err.msg, "another swarm key"), "%s", err.msg);
    sp_runtime_free(rt);
    /* the refused peers reached no handler: two more requests, the HELLO and INFO that ask */
    ck_assert_double_eq((double)info_of(p.port, &k).requests, served + 2);
    ck_assert_double_eq((double)info_of(p.port, &k).transport.auth_failed, 2);
    /* sepal-server's own refusals: a wrong file */
    const char *bad_args[] = {"--model", M15, "--blocks", "0:6", "--no-measure", "--swarm-key", "/nonexistent", NULL};
    sp_test_proc q;
    ck_assert_int_ne(sp_test_server_start(&q, bad_args), 0);
    sp_test_proc_signal(&p, SIGTERM);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* a keyed swarm over the DHT */

static sp_test_proc procs[4];

static void swarm_server(sp_test_proc *p, const char *blocks, int peer_dht, const char *key)
{
    char peers[64];
    snprintf(peers, sizeof peers, "127.0.0.1:%d", peer_dht);
    const char *args[24] = {"--model", M15, "--no-measure", "--update-period", "1", "--balance-period", "0",
                            "--blocks", blocks};
    int n = 9;
    if (peer_dht > 0) {
        args[n++] = "--initial-peers";
        args[n++] = peers;
    } else {
        args[n++] = "--new-swarm";
    }
    if (key) {
        args[n++] = "--swarm-key";
        args[n++] = key;
    }
    args[n] = NULL;
    ck_assert_msg(sp_test_server_start(p, args) == 0, "server %s did not start", blocks);
}

typedef struct view_wait {
    sp_runtime *rt;
    int ports[2];
} view_wait;

/* Both keyed servers are in the view, and each has pinged the other. */
static int keyed_seen(void *u)
{
    view_wait *w = u;
    int found = 0, pinged = 0;
    sp_server_row *rows = NULL;
    int n = sp_runtime_servers(w->rt, &rows);
    for (int i = 0; i < n; i++) {
        const sp_server_record *r = &rows[i].rec;
        if (rows[i].gone || r->state != SP_SERVER_ONLINE)
            continue;
        found += r->port == w->ports[0] || r->port == w->ports[1];
        pinged += r->npings > 0;
    }
    free(rows);
    return found == 2 && pinged >= 1;
}

START_TEST(t_keyed_swarm)
{
    sp_swarm_key k;
    const char *path = new_key(&k);
    swarm_server(&procs[0], "0:3", 0, path);          /* keyed, starts the swarm */
    swarm_server(&procs[1], "3:6", procs[0].dht_port, path);
    swarm_server(&procs[2], "0:6", procs[0].dht_port, NULL); /* no key, same DHT: its records are not sealed */
    sp_runtime *rt = runtime_with(path);
    sp_test_update_period(rt, 1);
    char peers[64];
    snprintf(peers, sizeof peers, "127.0.0.1:%d", procs[0].dht_port);
    sp_err err = {0};
    ck_assert_msg(sp_runtime_join(rt, peers, &err) == SP_OK, "%s", err.msg);
    /* a forged record: the right form, a tag made with another key */
    sp_swarm_key other;
    new_key(&other);
    sp_dht *evil = NULL;
    sp_dht_opts d = {.bind = "127.0.0.2", .bootstrap = peers};
    ck_assert_msg(sp_dht_start(&evil, &d, &err) == SP_OK, "%s", err.msg);
    sp_dht_wait_peers(evil, 5000);
    sp_server_record r;
    some_record(&r);
    r.config_hash = sp_runtime_config(rt)->hash;
    r.throughput = 1e9;
    char buf[SP_RECORD_MAX];
    size_t len;
    ck_assert_int_eq(sp_record_encode(&r, buf, sizeof buf, &len, &err), SP_OK);
    ck_assert_int_eq(sp_record_seal(buf, sizeof buf, &len, &other, &err), SP_OK);
    sp_dht_put(evil, "stories15M.0", "forged", 60, buf, len);
    view_wait w = {rt, {procs[0].port, procs[1].port}};
    ck_assert_msg(sp_test_wait_for(keyed_seen, &w, 30), "the keyed servers did not show up (or never pinged)");
    sp_view_stats vs = {0};
    for (double end = sp_now_s() + 15; sp_now_s() < end && vs.dropped < 2; usleep(50000))
        sp_view_slot_stats(&rt->views, &vs);
    printf("keyed swarm: %llu values dropped, the last because %s\n", (unsigned long long)vs.dropped, vs.last_drop);
    ck_assert_int_ge((int)vs.dropped, 2);
    sp_server_row *rows = NULL;
    int n = sp_runtime_servers(rt, &rows);
    for (int i = 0; i < n; i++) { /* the unkeyed server and the forged record never got in */
        const sp_server_record *x = &rows[i].rec;
        ck_assert_int_ne(x->port, procs[2].port);
        ck_assert_str_ne(x->id, "0123456789abcdef");
        for (int j = 0; j < x->npings; j++) /* a keyed server pings only key holders */
            ck_assert_msg(strcmp(x->pings[j].id, "0123456789abcdef"), "pinged the forged server");
    }
    free(rows);
    sp_route route;
    ck_assert_msg(sp_runtime_route_inference(rt, 0, 6, 0, &route, &err) == SP_OK, "%s", err.msg);
    generates(rt);
    sp_dht_stop(evil);
    sp_runtime_free(rt);
    for (int i = 0; i < 3; i++)
        sp_test_proc_signal(&procs[i], SIGKILL);
}
END_TEST

/* Issue 22: an outsider that joins a keyed swarm's DHT sees only opaque values. Two keyed servers (one with a
 * public name); a client without the key and one with another key join their DHT: neither lists a server, each
 * counts the sealed records it found and cannot open (and the swarm they are sealed for); the raw values under a
 * block key hold neither the name nor the address nor the port; the key holder sees both servers. */
typedef struct raw_values {
    pthread_mutex_t lock;
    int n, readable;
    int sealed_all;
    char secrets[3][64];
} raw_values;

static void raw_value(void *u, const char *key, const uint8_t *data, size_t len, int expired)
{
    raw_values *r = u;
    if (expired || strcmp(key, "stories15M.0"))
        return;
    pthread_mutex_lock(&r->lock);
    r->n++;
    r->sealed_all &= sp_record_is_sealed(data, len, NULL, NULL);
    for (int i = 0; i < 3; i++)
        r->readable += memmem(data, len, r->secrets[i], strlen(r->secrets[i])) != NULL;
    pthread_mutex_unlock(&r->lock);
}

typedef struct unreadable_wait {
    sp_runtime *rt;
    int n;
} unreadable_wait;

static int found_unreadable(void *u)
{
    unreadable_wait *w = u;
    sp_view_stats vs;
    sp_view_slot_stats(&w->rt->views, &vs);
    return vs.unreadable >= w->n;
}

static int dht_servers(sp_runtime *rt)
{
    int n = 0;
    pthread_mutex_lock(&rt->lock);
    for (int i = 0; i < rt->nservers; i++)
        n += rt->servers[i]->from_dht && !rt->servers[i]->gone;
    pthread_mutex_unlock(&rt->lock);
    return n;
}

START_TEST(t_outsider_sees_opaque)
{
    sp_swarm_key k;
    const char *path = new_key(&k), *wrong = new_key(NULL);
    const char *a0[] = {"--model", M15, "--no-measure", "--update-period", "1", "--balance-period", "0", "--blocks",
                        "0:3", "--new-swarm", "--swarm-key", path, "--public-name", "secret-name", NULL};
    ck_assert(sp_test_server_start(&procs[0], a0) == 0);
    swarm_server(&procs[1], "3:6", procs[0].dht_port, path);
    char peers[64];
    snprintf(peers, sizeof peers, "127.0.0.1:%d", procs[0].dht_port);
    sp_err err = {0};
    const char *keys[2] = {NULL, wrong};
    for (int i = 0; i < 2; i++) {
        sp_runtime *rt = runtime_with(keys[i]);
        rt->set.update_period_s = 1;
        ck_assert_msg(sp_runtime_join(rt, peers, &err) == SP_OK, "%s", err.msg);
        unreadable_wait w = {rt, 2}; /* at least one sealing of each server */
        int found = sp_test_wait_for(found_unreadable, &w, 20);
        sp_view_stats vs;
        sp_view_slot_stats(&rt->views, &vs);
        printf("outsider (%s): %d servers listed, %d sealed records it cannot open (swarm %s)\n",
               keys[i] ? "another key" : "no key", dht_servers(rt), vs.unreadable, vs.unreadable_swarm);
        ck_assert_msg(found, "%d sealed records counted", vs.unreadable);
        ck_assert_int_eq(dht_servers(rt), 0);
        ck_assert_str_eq(vs.unreadable_swarm, k.id_hex);
        sp_runtime_free(rt);
    }
    /* the values themselves */
    raw_values r = {.sealed_all = 1};
    pthread_mutex_init(&r.lock, NULL);
    snprintf(r.secrets[0], sizeof r.secrets[0], "secret-name");
    snprintf(r.secrets[1], sizeof r.secrets[1], "127.0.0.1");
    snprintf(r.secrets[2], sizeof r.secrets[2], "\"port\":%d", procs[0].port);
    sp_dht *d = NULL;
    sp_dht_opts dopts = {.bind = "127.0.0.2", .bootstrap = peers, .on_value = raw_value, .user = &r};
    ck_assert_msg(sp_dht_start(&d, &dopts, &err) == SP_OK, "%s", err.msg);
    sp_dht_wait_peers(d, 5000);
    for (int i = 0; i < 50; i++) {
        pthread_mutex_lock(&r.lock);
        int n = r.n;
        pthread_mutex_unlock(&r.lock);
        if (n > 0)
            break;
        sp_dht_get(d, "stories15M.0");
        usleep(200000);
    }
    sp_dht_stop(d);
    printf("outsider: %d values under stories15M.0, all sealed: %s, %d with a readable name, address or port\n", r.n,
           r.sealed_all ? "yes" : "no", r.readable);
    ck_assert_int_gt(r.n, 0);
    ck_assert(r.sealed_all);
    ck_assert_int_eq(r.readable, 0);
    pthread_mutex_destroy(&r.lock);
    /* the key holder sees both */
    sp_runtime *rt = runtime_with(path);
    rt->set.update_period_s = 1;
    ck_assert_msg(sp_runtime_join(rt, peers, &err) == SP_OK, "%s", err.msg);
    view_wait vw = {rt, {procs[0].port, procs[1].port}};
    ck_assert_msg(sp_test_wait_for(keyed_seen, &vw, 30), "the key holder does not see the keyed servers");
    sp_runtime_free(rt);
    for (int i = 0; i < 2; i++)
        sp_test_proc_signal(&procs[i], SIGKILL);
}
END_TEST

/* A keyed server pings the servers likely to follow it (issue 11) through the key exchange: one that lacks the key
 * fails it (its transport counts the refusal) and gets no ping entry, as if unreachable, while the keyed successor
 * gets one. The unkeyed server is named by a record sealed with the key (a member that lost its key, or a key
 * holder's mistake): without it no keyed reader would see the server at all. A view of our own (not a runtime,
 * whose own pings would reach the unkeyed server too) reads the records. */
/* The record of the server at port (1 if in the view). */
static int record_at(sp_view *v, int port, sp_server_record *out)
{
    sp_server_record *all = NULL;
    int n = sp_view_snapshot(v, &all), found = 0;
    for (int i = 0; i < n && !found; i++)
        if (all[i].port == port && all[i].state == SP_SERVER_ONLINE) {
            *out = all[i];
            found = 1;
        }
    free(all);
    return found;
}

static int has_ping(const sp_server_record *r, const char *id)
{
    for (int j = 0; j < r->npings; j++)
        if (!strcmp(r->pings[j].id, id))
            return 1;
    return 0;
}

typedef struct ping_wait {
    sp_view *v;
    char keyed_id[SP_SERVER_ID_LEN];
} ping_wait;

/* The keyed servers are in the view, and the first has pinged the second. */
static int keyed_pinged(void *u)
{
    ping_wait *w = u;
    sp_server_record a, b;
    if (!record_at(w->v, procs[0].port, &a) || !record_at(w->v, procs[1].port, &b))
        return 0;
    snprintf(w->keyed_id, sizeof w->keyed_id, "%s", b.id);
    return has_ping(&a, b.id);
}

/* Both keyed servers tried the unkeyed one (twice each, say). */
static int unkeyed_tried(void *u)
{
    (void)u;
    return (double)info_of(procs[2].port, NULL).transport.auth_failed >= 4;
}

typedef struct published_wait {
    sp_view *v;
    double after;
} published_wait;

/* Both keyed servers published a record after `after` (wall clock). */
static int published_since(void *u)
{
    published_wait *w = u;
    sp_server_record a, b;
    return record_at(w->v, procs[0].port, &a) && record_at(w->v, procs[1].port, &b) && a.timestamp > w->after &&
           b.timestamp > w->after;
}

START_TEST(t_keyed_pings_unkeyed)
{
    sp_swarm_key k;
    const char *path = new_key(&k);
    swarm_server(&procs[0], "0:3", 0, path);
    swarm_server(&procs[1], "3:6", procs[0].dht_port, path);
    swarm_server(&procs[2], "3:6", procs[0].dht_port, NULL);
    char peers[64];
    snprintf(peers, sizeof peers, "127.0.0.1:%d", procs[0].dht_port);
    sp_view_slot slot;
    sp_view_slot_init(&slot);
    sp_dht *d = NULL;
    sp_err err = {0};
    sp_dht_opts dopts = {.bind = "127.0.0.2", .bootstrap = peers, .on_value = sp_view_slot_on_value,
                         .on_get_done = sp_view_slot_on_get_done, .user = &slot};
    ck_assert_msg(sp_dht_start(&d, &dopts, &err) == SP_OK, "%s", err.msg);
    sp_dht_wait_peers(d, 5000);
    sp_view_opts vo = {.model = "stories15M", .num_blocks = 6, .refresh_s = 1, .key = &k};
    sp_view *v = NULL;
    ck_assert_msg(sp_view_new(&v, d, &vo, &err) == SP_OK, "%s", err.msg);
    sp_view_slot_swap(&slot, v);
    ping_wait w = {v, ""};
    ck_assert_msg(sp_test_wait_for(keyed_pinged, &w, 30), "the keyed servers never pinged each other");
    /* a record sealed with the key that names the unkeyed server, as a successor of the first and beside the
     * second */
    sp_server_record b, r;
    ck_assert(record_at(v, procs[1].port, &b));
    some_record(&r);
    snprintf(r.id, sizeof r.id, "fedcba9876543210");
    r.port = procs[2].port;
    r.start = 3;
    r.config_hash = b.config_hash;
    char buf[SP_RECORD_MAX];
    size_t len;
    ck_assert_int_eq(sp_record_encode(&r, buf, sizeof buf, &len, &err), SP_OK);
    ck_assert_int_eq(sp_record_seal(buf, sizeof buf, &len, &k, &err), SP_OK);
    for (int blk = 3; blk < 6; blk++) {
        char key[32];
        snprintf(key, sizeof key, "stories15M.%d", blk);
        sp_dht_put(d, key, r.id, 60, buf, len);
    }
    ck_assert_msg(sp_test_wait_for(unkeyed_tried, NULL, 30), "the keyed servers never tried the unkeyed one (%.0f "
                  "refused)", (double)info_of(procs[2].port, NULL).transport.auth_failed);
    sp_server_record seen;
    published_wait pw = {v, sp_wall_s()};
    ck_assert_msg(sp_test_wait_for(published_since, &pw, 10), "the keyed servers did not publish again");
    ck_assert_msg(keyed_pinged(&w), "the keyed servers stopped pinging each other");
    ck_assert_msg(record_at(v, procs[2].port, &seen), "the record naming the unkeyed server is not in the view");
    printf("keyed pings: the unkeyed server refused %.0f key exchanges\n",
           (double)info_of(procs[2].port, NULL).transport.auth_failed);
    double requests = (double)info_of(procs[2].port, NULL).requests; /* this call's HELLO and INFO included */
    for (int i = 0; i < 2; i++) {
        sp_server_record x;
        ck_assert(record_at(v, procs[i].port, &x));
        ck_assert_msg(!has_ping(&x, r.id), "server %d recorded a ping of the server without the key", i);
    }
    /* and no PING of theirs reached a handler there: only our INFOs (and their HELLOs) did */
    ck_assert_double_eq((double)info_of(procs[2].port, NULL).requests, requests + 2);
    sp_dht_stop(d);
    sp_view_slot_destroy(&slot); /* frees v */
    for (int i = 0; i < 3; i++)
        sp_test_proc_signal(&procs[i], SIGKILL);
}
END_TEST

static Suite *swarmkey_suite(void)
{
    Suite *s = suite_create("swarmkey");
    TCase *tc = tcase_create("swarmkey");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, t_key_file);
    tcase_add_test(tc, t_hmac);
    tcase_add_test(tc, t_record_seal);
    tcase_add_test(tc, t_record_queue_wait);
    tcase_add_test(tc, t_record_caps);
    tcase_add_test(tc, t_transport_exchange);
    tcase_add_test(tc, t_replayed_proof);
    tcase_add_test(tc, t_replayed_challenge);
    tcase_add_test(tc, t_keyed_server);
    tcase_add_test(tc, t_keyed_swarm);
    tcase_add_test(tc, t_outsider_sees_opaque);
    tcase_add_test(tc, t_keyed_pings_unkeyed);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return sp_test_run(swarmkey_suite()); }
