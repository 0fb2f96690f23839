/* opts.h - sepal-server's options: one table (common/opt.h) of every option, its kind, range, default and help,
 * indexed by an enum. The program parses its command line with it and prints its --help from it; the library's
 * sp_server_opts_default applies the same rows' defaults, so a default is written once. */
#ifndef SEPAL_SERVER_OPTS_H
#define SEPAL_SERVER_OPTS_H

#include "opt.h"
#include "server.h"

/* sepal-server's options, by index (rows of sp_server_opt_table). */
enum {
    S_MODEL, S_BLOCKS, S_NUM_BLOCKS, S_HOST, S_PORT, S_BULK_PORT, S_ANNOUNCE, S_ANNOUNCE_BULK_PORT,
    S_SOURCE_ADDRESS,
    S_NEW_SWARM, S_INITIAL_PEERS, S_DHT_PORT, S_PUBLIC_NAME, S_UPDATE_PERIOD, S_BALANCE_PERIOD, S_BALANCE_QUALITY,
    S_SELECTION_DELAY, S_BANDWIDTH, S_SWARM_KEY, S_GEN_SWARM_KEY,
    S_MAX_CONNS, S_MAX_CONNS_IP, S_MAX_HANDSHAKES, S_MAX_HANDSHAKES_IP, S_HANDSHAKE_TIMEOUT, S_IDLE_TIMEOUT,
    S_INPUT_BUDGET, S_INPUT_BUDGET_CONN, S_INPUT_BUDGET_IP, S_OUTPUT_BOUND, S_BUSY_TIMEOUT, S_MIN_RATE,
    S_DTYPE, S_DEVICE, S_THREADS, S_WORKERS, S_MAX_BATCH_TOKENS, S_NO_BATCH, S_MAX_QUEUE_WAIT, S_CACHE_TOKENS, S_CACHE_BYTES, S_MAX_LENGTH,
    S_STEP_TIMEOUT, S_SESSION_TIMEOUT, S_NO_MEASURE, S_METRICS, S_VERBOSE, S_VERSION, S_HELP, S_NOPTS
};

extern const sp_opt sp_server_opt_table[S_NOPTS + 1];

/* Puts option k's value v (already checked against its row) where it goes in o, if it is one of the server
 * library's own (host, ports, limits, work): 0. 1 when k is the program's (swarm, keys, units, --help ...),
 * which the caller takes itself. */
int sp_server_opt_take(sp_server_opts *o, int k, const char *v);

#endif
