/* test_dht.c - the DHT layer (sp_dht: an OpenDHT node in a supervised child, behind a UDP front).
 *
 * The front (dht/front.h): datagrams shaped as OpenDHT 2.4.12 sends them pass, each shape that crashes it (or that
 * it reads unchecked) is refused with its reason, fragmented values are followed per transaction; a live node
 * survives the crash datagram and its kin, and refuses nothing of a 41-node swarm's own traffic.
 *
 * Scale: a value published while its node was alone (the first server of a new swarm announces before anyone
 * joins), or while the swarm was still small, must still be found once dozens of nodes have joined and the
 * nodes closest to its key are others. OpenDHT stores a value on the nodes closest to its key that the
 * publisher knows when it publishes; sp_dht keeps publications announced, so they move to the closest nodes as
 * those appear. */
#include <arpa/inet.h>
#include <check.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dht.h"
#include "front.h"
#include "testutil.h"
#include "timeutil.h"

#define NODES 40
#define EARLY 4 /* nodes that publish before the others join */

typedef struct found {
    pthread_mutex_t lock;
    int seen[NODES];
} found;

static void on_value(void *user, const char *key, const uint8_t *data, size_t len, int expired)
{
    found *f = user;
    int i;
    if (expired || sscanf(key, "test.key%d", &i) != 1 || i < 0 || i >= NODES)
        return;
    char want[32];
    int n = snprintf(want, sizeof want, "value of node %d", i);
    pthread_mutex_lock(&f->lock);
    if ((size_t)n == len && !memcmp(data, want, len))
        f->seen[i] = 1;
    pthread_mutex_unlock(&f->lock);
}

static void publish(sp_dht *d, int i)
{
    char key[32], val[32];
    snprintf(key, sizeof key, "test.key%d", i);
    int n = snprintf(val, sizeof val, "value of node %d", i);
    sp_dht_put(d, key, "s", 600, val, (size_t)n);
}

static int count(found *f, int *first_missing)
{
    int c = 0;
    *first_missing = -1;
    pthread_mutex_lock(&f->lock);
    for (int i = 0; i < NODES; i++) {
        c += f->seen[i];
        if (!f->seen[i] && *first_missing < 0)
            *first_missing = i;
    }
    pthread_mutex_unlock(&f->lock);
    return c;
}

START_TEST(t_early_values_found)
{
    sp_dht *nodes[NODES] = {0};
    sp_err err = {0};
    char peers[64];
    sp_dht_opts o0 = {.bind = "127.0.0.1"};
    ck_assert_msg(sp_dht_start(&nodes[0], &o0, &err) == SP_OK, "%s", err.msg);
    snprintf(peers, sizeof peers, "127.0.0.1:%d", sp_dht_port(nodes[0]));
    publish(nodes[0], 0); /* alone: it can only store its value itself */
    for (int i = 1; i < NODES; i++) {
        sp_dht_opts o = {.bind = "127.0.0.1", .bootstrap = peers};
        ck_assert_msg(sp_dht_start(&nodes[i], &o, &err) == SP_OK, "node %d: %s", i, err.msg);
        if (i < EARLY) /* a swarm of i + 1 nodes */
            publish(nodes[i], i);
    }
    for (int i = EARLY; i < NODES; i++)
        publish(nodes[i], i);
    for (int i = 0; i < NODES; i++)
        sp_dht_flush(nodes[i], 10000, &err);
    /* a client that joins through the last node and looks every key up until it has them all */
    found f = {.seen = {0}};
    pthread_mutex_init(&f.lock, NULL);
    snprintf(peers, sizeof peers, "127.0.0.1:%d", sp_dht_port(nodes[NODES - 1]));
    sp_dht_opts oc = {.bind = "127.0.0.1", .bootstrap = peers, .on_value = on_value, .user = &f};
    sp_dht *client = NULL;
    ck_assert_msg(sp_dht_start(&client, &oc, &err) == SP_OK, "%s", err.msg);
    ck_assert_int_eq(sp_dht_wait_peers(client, 5000), 0);
    double t0 = sp_now_s();
    int missing = -1, c = 0;
    for (int round = 0; sp_now_s() - t0 < 20; round++) {
        for (int i = 0; i < NODES; i++) {
            pthread_mutex_lock(&f.lock);
            int seen = f.seen[i];
            pthread_mutex_unlock(&f.lock);
            if (!seen) {
                char key[32];
                snprintf(key, sizeof key, "test.key%d", i);
                sp_dht_get(client, key);
            }
        }
        struct timespec ts = {0, 500 * 1000000L};
        nanosleep(&ts, NULL);
        if ((c = count(&f, &missing)) == NODES)
            break;
    }
    printf("dht: %d/%d values found %.2f s after the client joined (%d nodes; the first %d published while "
           "the swarm had 1..%d nodes)\n", c, NODES, sp_now_s() - t0, NODES, EARLY, EARLY);
    ck_assert_msg(c == NODES, "%d of %d values found; the first missing: node %d's%s", c, NODES, missing,
                  missing >= 0 && missing < EARLY ? " (published early)" : "");
    uint64_t refused = sp_dht_refused(client); /* the swarm's own traffic all passed the fronts */
    for (int i = 0; i < NODES; i++)
        refused += sp_dht_refused(nodes[i]);
    ck_assert_msg(refused == 0, "the fronts refused %llu datagrams of the swarm's own traffic",
                  (unsigned long long)refused);
    sp_dht_stop(client);
    for (int i = 0; i < NODES; i++)
        sp_dht_stop(nodes[i]);
    pthread_mutex_destroy(&f.lock);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* the UDP front */

/* A msgpack writer, enough to build what OpenDHT 2.4.12 sends (network_engine.cpp's packers). */
typedef struct mpw {
    uint8_t b[4096];
    size_t n;
} mpw;

static void w_raw(mpw *w, const void *p, size_t n)
{
    ck_assert_uint_le(w->n + n, sizeof w->b);
    memcpy(w->b + w->n, p, n);
    w->n += n;
}

static void w_byte(mpw *w, unsigned c) { w_raw(w, &(uint8_t){(uint8_t)c}, 1); }

static void w_be(mpw *w, uint64_t v, int bytes)
{
    for (int i = bytes - 1; i >= 0; i--)
        w_byte(w, (unsigned)(v >> (8 * i)) & 0xff);
}

static void w_head(mpw *w, unsigned fix, unsigned c16, unsigned n)
{
    if (n < 16) {
        w_byte(w, fix | n);
    } else {
        w_byte(w, c16);
        w_be(w, n, 2);
    }
}

static void w_map(mpw *w, unsigned n) { w_head(w, 0x80, 0xde, n); }
static void w_arr(mpw *w, unsigned n) { w_head(w, 0x90, 0xdc, n); }

static void w_str(mpw *w, const char *s)
{
    size_t n = strlen(s);
    if (n < 32) {
        w_byte(w, 0xa0 | (unsigned)n);
    } else {
        w_byte(w, 0xd9);
        w_byte(w, (unsigned)n);
    }
    w_raw(w, s, n);
}

static void w_bin(mpw *w, size_t n, int fill)
{
    uint8_t buf[2048];
    memset(buf, fill, n);
    if (n < 256) {
        w_byte(w, 0xc4);
        w_byte(w, (unsigned)n);
    } else {
        w_byte(w, 0xc5);
        w_be(w, n, 2);
    }
    w_raw(w, buf, n);
}

static void w_uint(mpw *w, uint64_t v)
{
    if (v < 128) {
        w_byte(w, (unsigned)v);
    } else if (v < 0x10000) {
        w_byte(w, 0xcd);
        w_be(w, v, 2);
    } else {
        w_byte(w, 0xce);
        w_be(w, v, 4);
    }
}

static void w_id(mpw *w) { w_bin(w, 20, 0x42); }

/* The tail of every envelope: t, y, v, n (OpenDHT packs the network id when it is not 0). */
static void w_tail(mpw *w, uint32_t tid, const char *y)
{
    w_str(w, "t"), w_uint(w, tid);
    w_str(w, "y"), w_str(w, y);
    w_str(w, "v"), w_str(w, "RNG1");
    w_str(w, "n"), w_uint(w, SP_DHT_NETWORK);
}

/* {"a": {"id": ...}, "q": q, t, y, v, n} with `extra` entries of "a" written by fn. */
static void w_query(mpw *w, const char *q, unsigned extra, void (*fn)(mpw *))
{
    w_map(w, 6);
    w_str(w, "a"), w_map(w, 1 + extra);
    w_str(w, "id"), w_id(w);
    if (fn)
        fn(w);
    w_str(w, "q"), w_str(w, q);
    w_tail(w, 7, "q");
}

static void a_find(mpw *w) { w_str(w, "target"), w_id(w), w_str(w, "w"), w_arr(w, 1), w_uint(w, 2); }

static void a_get(mpw *w)
{
    w_str(w, "h"), w_id(w);
    w_str(w, "q"), w_map(w, 2), w_str(w, "s"), w_arr(w, 1), w_uint(w, 1), w_str(w, "w"), w_arr(w, 1);
    w_map(w, 2), w_str(w, "f"), w_uint(w, 1), w_str(w, "v"), w_uint(w, 5);
    w_str(w, "w"), w_arr(w, 1), w_uint(w, 2);
}

static void a_listen(mpw *w)
{
    w_str(w, "ve"), w_uint(w, 1), w_str(w, "h"), w_id(w), w_str(w, "token"), w_bin(w, 32, 1);
    w_str(w, "sid"), w_uint(w, 99);
}

static void a_put_sizes(mpw *w)
{
    w_str(w, "h"), w_id(w), w_str(w, "values"), w_arr(w, 1), w_uint(w, 700);
    w_str(w, "c"), w_uint(w, 1795000000), w_str(w, "token"), w_bin(w, 32, 1);
}

/* A value as OpenDHT packs it: {"id", "dat": {"body": {"data", "type"}}}. */
static void w_value(mpw *w)
{
    w_map(w, 2);
    w_str(w, "id"), w_uint(w, 12345);
    w_str(w, "dat"), w_map(w, 1), w_str(w, "body"), w_map(w, 2);
    w_str(w, "data"), w_bin(w, 300, 'x'), w_str(w, "type"), w_uint(w, 0x5E05);
}

/* A reply: {"r": {"id", "sa", "n4", "token", "values"}, t, y, v, n}. */
static void w_reply(mpw *w, size_t n4)
{
    w_map(w, 5);
    w_str(w, "r"), w_map(w, 5);
    w_str(w, "id"), w_id(w), w_str(w, "sa"), w_bin(w, 4, 127);
    w_str(w, "n4"), w_bin(w, n4, 3), w_str(w, "token"), w_bin(w, 32, 1);
    w_str(w, "values"), w_arr(w, 1), w_value(w);
    w_tail(w, 7, "r");
}

/* A datagram of value data: {"n", "y": "p", "t", "p": {index: {"o", "d"}}}. */
static void w_fragment(mpw *w, uint32_t tid, unsigned off, unsigned len)
{
    w_map(w, 4);
    w_str(w, "n"), w_uint(w, SP_DHT_NETWORK);
    w_str(w, "y"), w_str(w, "p");
    w_str(w, "t"), w_uint(w, tid);
    w_str(w, "p"), w_map(w, 1), w_uint(w, 0), w_map(w, 2);
    w_str(w, "o"), w_uint(w, off), w_str(w, "d"), w_bin(w, len, 'v');
}

static void pass(const mpw *w, const char *what)
{
    const char *why = NULL;
    ck_assert_msg(sp_dgram_check(w->b, w->n, SP_DHT_NETWORK, NULL, &why) == 0, "%s refused: %s", what, why);
}

static void refuse(const mpw *w, const char *what, const char *reason)
{
    const char *why = NULL;
    ck_assert_msg(sp_dgram_check(w->b, w->n, SP_DHT_NETWORK, NULL, &why) != 0, "%s passed", what);
    ck_assert_msg(why && strstr(why, reason), "%s refused because '%s', expected '%s'", what, why, reason);
}

START_TEST(t_front_shapes)
{
    mpw w = {0};
    w_query(&w, "ping", 0, NULL), pass(&w, "ping");
    w = (mpw){0}, w_query(&w, "find", 2, a_find), pass(&w, "find");
    w = (mpw){0}, w_query(&w, "get", 3, a_get), pass(&w, "get with a query");
    w = (mpw){0}, w_query(&w, "listen", 4, a_listen), pass(&w, "listen");
    w = (mpw){0}, w_query(&w, "put", 4, a_put_sizes), pass(&w, "put of a value by size");
    w = (mpw){0}, w_reply(&w, 3 * 26), pass(&w, "reply with nodes and a value");
    w = (mpw){0};
    w_map(&w, 6), w_str(&w, "e"), w_arr(&w, 2), w_uint(&w, 401), w_str(&w, "unauthorized");
    w_str(&w, "r"), w_map(&w, 1), w_str(&w, "id"), w_id(&w), w_tail(&w, 7, "e");
    pass(&w, "error with the sender's id");
    w = (mpw){0};
    w_map(&w, 5), w_str(&w, "u"), w_map(&w, 3), w_str(&w, "id"), w_id(&w), w_str(&w, "token"), w_bin(&w, 32, 1);
    w_str(&w, "re"), w_arr(&w, 1), w_uint(&w, 12345), w_tail(&w, 7, "r");
    pass(&w, "value update (refreshed)");
    w = (mpw){0}, w_fragment(&w, 7, 0, 640), pass(&w, "value data");

    /* reliability-anchors.md §4.4: the datagram that crashes OpenDHT 2.4.12 */
    w = (mpw){0};
    w_map(&w, 4), w_str(&w, "e"), w_arr(&w, 0), w_str(&w, "t"), w_bin(&w, 4, 0), w_str(&w, "y"), w_str(&w, "e");
    w_str(&w, "n"), w_uint(&w, SP_DHT_NETWORK);
    refuse(&w, "{\"e\": []}", "an error that is not an array of a code and a message");
    w = (mpw){0}; /* an error and no request map: OpenDHT walks the array as a map */
    w_map(&w, 5), w_str(&w, "e"), w_arr(&w, 2), w_uint(&w, 401), w_str(&w, "x"), w_tail(&w, 7, "e");
    refuse(&w, "an error alone", "no 'a', 'r' or 'u'");
    w = (mpw){0};
    w_map(&w, 6), w_str(&w, "a"), w_uint(&w, 5), w_str(&w, "q"), w_str(&w, "ping"), w_tail(&w, 7, "q");
    refuse(&w, "\"a\": 5", "'a', 'r' or 'u' is not a map");
    w = (mpw){0};
    w_map(&w, 6), w_str(&w, "a"), w_str(&w, "\x81\xa1y\xa1q"), w_str(&w, "q"), w_str(&w, "ping"), w_tail(&w, 7, "q");
    refuse(&w, "\"a\": a string", "'a', 'r' or 'u' is not a map");
    w = (mpw){0}; /* OpenDHT divides by the number of selected fields */
    w_map(&w, 5), w_str(&w, "r"), w_map(&w, 2), w_str(&w, "id"), w_id(&w), w_str(&w, "fileds"), w_map(&w, 2);
    w_str(&w, "f"), w_arr(&w, 0), w_str(&w, "v"), w_arr(&w, 0), w_tail(&w, 7, "r");
    refuse(&w, "an empty field selection", "an empty or malformed field selection");
    w = (mpw){0};
    w_map(&w, 5), w_str(&w, "u"), w_map(&w, 2), w_str(&w, "id"), w_id(&w), w_str(&w, "values"), w_arr(&w, 1);
    w_uint(&w, 700), w_tail(&w, 7, "r");
    refuse(&w, "a value update announcing a value by size", "values by size in a value update");
    w = (mpw){0}, w_reply(&w, 25), refuse(&w, "25 bytes of nodes", "'n4' is not whole nodes");
    w = (mpw){0};
    w_map(&w, 6), w_str(&w, "a"), w_map(&w, 1), w_str(&w, "id"), w_bin(&w, 19, 1), w_str(&w, "q"), w_str(&w, "ping");
    w_tail(&w, 7, "q");
    refuse(&w, "a 19-byte id", "an id that is not 20 bytes");
    w = (mpw){0};
    w_map(&w, 6), w_str(&w, "a"), w_map(&w, 0), w_str(&w, "q"), w_str(&w, "ping"), w_tail(&w, 7, "q");
    refuse(&w, "no sender id", "no sender id");
    w = (mpw){0}, w_query(&w, "evil", 0, NULL), refuse(&w, "an unknown query", "not a query OpenDHT knows");
    w = (mpw){0}, w_query(&w, "ping", 0, NULL), w_byte(&w, 0xc0), refuse(&w, "a trailing byte", "bytes after");
    w = (mpw){0}, w_query(&w, "ping", 0, NULL), w.b[w.n - 1] ^= 1, refuse(&w, "another network", "another network id");
    w = (mpw){0}; /* a count the datagram cannot hold: never sized by the sender */
    w_map(&w, 6), w_str(&w, "a"), w_map(&w, 2), w_str(&w, "id"), w_id(&w), w_str(&w, "x"), w_byte(&w, 0xdd);
    w_be(&w, 0xffffffffu, 4);
    refuse(&w, "an array of 2^32-1 elements", "malformed msgpack");
    w = (mpw){0};
    w_map(&w, 6), w_str(&w, "a"), w_map(&w, 2), w_str(&w, "id"), w_id(&w), w_str(&w, "x");
    for (int i = 0; i < 40; i++)
        w_arr(&w, 1);
    w_uint(&w, 1), w_str(&w, "q"), w_str(&w, "ping"), w_tail(&w, 7, "q");
    refuse(&w, "40 nested arrays", "malformed msgpack");
    w = (mpw){0};
    w_map(&w, 7), w_str(&w, "x"), w_byte(&w, 0xd4), w_byte(&w, 1), w_byte(&w, 0), w_str(&w, "a"), w_map(&w, 1);
    w_str(&w, "id"), w_id(&w), w_str(&w, "q"), w_str(&w, "ping"), w_tail(&w, 7, "q");
    refuse(&w, "an ext type", "malformed msgpack");
    /* every truncation of a valid message */
    w = (mpw){0}, w_reply(&w, 26);
    for (size_t n = 0; n < w.n; n++)
        ck_assert_msg(sp_dgram_check(w.b, n, SP_DHT_NETWORK, NULL, NULL) != 0, "%zu of %zu bytes passed", n, w.n);
}
END_TEST

/* A value over 600 bytes: its size in the message, then fragments, followed per transaction. */
START_TEST(t_front_fragments)
{
    sp_front *f = sp_front_new(SP_DHT_NETWORK);
    ck_assert_ptr_nonnull(f);
    const uint32_t ip = 0x0100007f;
    mpw put = {0}, a = {0}, b = {0}, late = {0};
    w_query(&put, "put", 4, a_put_sizes);        /* tid 7: one value of 700 bytes */
    w_fragment(&a, 7, 0, 640);
    w_fragment(&b, 7, 640, 60);
    w_fragment(&late, 7, 700, 10);
    const char *why = NULL;
    ck_assert_int_eq(sp_front_accept(f, a.b, a.n, ip, 4000, 0.0, &why), 0); /* before its message */
    ck_assert_str_eq(why, "a fragment of no open message of its sender");
    ck_assert_int_eq(sp_front_accept(f, put.b, put.n, ip, 4000, 0.0, &why), 1);
    ck_assert_int_eq(sp_front_accept(f, put.b, put.n, ip, 4000, 0.1, &why), 0);
    ck_assert_str_eq(why, "a fragmented message of a transaction still in flight");
    ck_assert_int_eq(sp_front_accept(f, a.b, a.n, ip, 4001, 0.2, &why), 0);  /* another sender */
    ck_assert_int_eq(sp_front_accept(f, a.b, a.n, ip, 4000, 0.2, &why), 1);
    ck_assert_int_eq(sp_front_accept(f, a.b, a.n, ip, 4000, 0.3, &why), 0);  /* again */
    ck_assert_str_eq(why, "a fragment that extends nothing");
    ck_assert_int_eq(sp_front_accept(f, b.b, b.n, ip, 4000, 0.3, &why), 1);  /* complete */
    ck_assert_int_eq(sp_front_accept(f, late.b, late.n, ip, 4000, 0.4, &why), 0);
    ck_assert_int_eq(sp_front_accept(f, put.b, put.n, ip, 4000, 5.0, &why), 0); /* the transaction rests */
    ck_assert_int_eq(sp_front_accept(f, put.b, put.n, ip, 4000, 13.5, &why), 1);
    mpw ping = {0};
    w_query(&ping, "ping", 0, NULL);
    ck_assert_int_eq(sp_front_accept(f, ping.b, ping.n, ip, 4000, 13.5, &why), 1); /* no fragments: no state */
    ck_assert_int_eq(sp_front_accept(f, ping.b, ping.n, ip, 4000, 13.5, &why), 1);
    sp_front_free(f);
}
END_TEST

/* A live node (behind its front) gets the crash datagram and its kin: it keeps running (no restart), counts
 * them, and still stores and serves a value. */
static int has_value(void *u)
{
    found *f = u;
    pthread_mutex_lock(&f->lock);
    int seen = f->seen[1];
    pthread_mutex_unlock(&f->lock);
    return seen;
}

START_TEST(t_front_live)
{
    sp_dht *a = NULL, *b = NULL;
    sp_err err = {0};
    sp_dht_opts oa = {.bind = "127.0.0.1"};
    ck_assert_msg(sp_dht_start(&a, &oa, &err) == SP_OK, "%s", err.msg);
    char peers[64];
    snprintf(peers, sizeof peers, "127.0.0.1:%d", sp_dht_port(a));
    found f = {.seen = {0}};
    pthread_mutex_init(&f.lock, NULL);
    sp_dht_opts ob = {.bind = "127.0.0.1", .bootstrap = peers, .on_value = on_value, .user = &f};
    ck_assert_msg(sp_dht_start(&b, &ob, &err) == SP_OK, "%s", err.msg);
    ck_assert_int_eq(sp_dht_wait_peers(b, 5000), 0);
    pid_t pid = sp_dht_pid(a);
    mpw bad[4];
    memset(bad, 0, sizeof bad);
    w_map(&bad[0], 3), w_str(&bad[0], "e"), w_arr(&bad[0], 0), w_str(&bad[0], "t"), w_bin(&bad[0], 4, 0);
    w_str(&bad[0], "y"), w_str(&bad[0], "e"); /* byte for byte the datagram of §4.4 */
    w_map(&bad[1], 5), w_str(&bad[1], "e"), w_arr(&bad[1], 2), w_uint(&bad[1], 401), w_str(&bad[1], "x");
    w_tail(&bad[1], 7, "e");
    w_map(&bad[2], 6), w_str(&bad[2], "a"), w_str(&bad[2], "\x81\xa1y"), w_str(&bad[2], "q"), w_str(&bad[2], "ping");
    w_tail(&bad[2], 7, "q");
    w_map(&bad[3], 5), w_str(&bad[3], "r"), w_map(&bad[3], 2), w_str(&bad[3], "id"), w_id(&bad[3]);
    w_str(&bad[3], "fileds"), w_map(&bad[3], 2), w_str(&bad[3], "f"), w_arr(&bad[3], 0), w_str(&bad[3], "v");
    w_arr(&bad[3], 2), w_uint(&bad[3], 1), w_uint(&bad[3], 2), w_tail(&bad[3], 7, "r");
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)sp_dht_port(a))};
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    for (int round = 0; round < 10; round++)
        for (int i = 0; i < 4; i++)
            sendto(fd, bad[i].b, bad[i].n, 0, (struct sockaddr *)&to, sizeof to);
    close(fd);
    publish(a, 1);
    sp_dht_flush(a, 10000, &err);
    for (double end = sp_now_s() + 10; sp_now_s() < end && !has_value(&f); usleep(200000))
        sp_dht_get(b, "test.key1");
    for (double end = sp_now_s() + 2; sp_now_s() < end && sp_dht_refused(a) < 40; usleep(10000))
        ; /* the count comes with the node's stats */
    printf("front: %llu datagrams refused, the node %s\n", (unsigned long long)sp_dht_refused(a),
           sp_dht_pid(a) == pid ? "kept running" : "was restarted");
    ck_assert_msg(sp_dht_pid(a) == pid && sp_dht_restarts(a) == 0, "the node died (%d restarts)", sp_dht_restarts(a));
    ck_assert_uint_eq(sp_dht_refused(a), 40);
    ck_assert_msg(has_value(&f), "the node no longer serves its value");
    sp_dht_stop(b);
    sp_dht_stop(a);
    pthread_mutex_destroy(&f.lock);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("dht");
    TCase *front = tcase_create("front");
    tcase_set_timeout(front, 60);
    tcase_add_test(front, t_front_shapes);
    tcase_add_test(front, t_front_fragments);
    tcase_add_test(front, t_front_live);
    suite_add_tcase(s, front);
    TCase *tc = tcase_create("scale");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, t_early_values_found);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return sp_test_run(suite()); }
