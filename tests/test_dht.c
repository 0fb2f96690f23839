/* test_dht.c - the DHT layer (sp_dht: an OpenDHT node in a supervised child) at a scale where a value's
 * place matters: a value published while its node was alone (the first server of a new swarm announces
 * before anyone joins), or while the swarm was still small, must still be found once dozens of nodes have
 * joined and the nodes closest to its key are others. OpenDHT stores a value on the nodes closest to its key
 * that the publisher knows when it publishes; sp_dht keeps publications announced, so they move to the
 * closest nodes as those appear. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dht.h"
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
    sp_dht_stop(client);
    for (int i = 0; i < NODES; i++)
        sp_dht_stop(nodes[i]);
    pthread_mutex_destroy(&f.lock);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("dht");
    TCase *tc = tcase_create("scale");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, t_early_values_found);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return sp_test_run(suite()); }
