/* opts.c - sepal-server's option table (opts.h) and the library's share of it: the rows that fill
 * sp_server_opts, and its defaults from the same rows. */
#include "opts.h"

#include <string.h>

#include "kern.h"
#include "span.h"

/* Every option once: its kind, range, default (what the server does without it) and help. */
const sp_opt sp_server_opt_table[S_NOPTS + 1] = {
    [S_MODEL] = {"--model", SP_OPT_STR, "DIR",
                 .help = "Hugging Face model directory (only the blocks served are read)"},
    [S_BLOCKS] = {"--blocks", SP_OPT_STR, "A:B",
                  .help = "the span of blocks to serve (B may be empty: to the last block)"},
    [S_NUM_BLOCKS] = {"--num-blocks", SP_OPT_INT, "N", 1, 1 << 20,
                      .help = "serve N blocks, chosen where the swarm needs them (needs a swarm)"},
    [S_HOST] = {"--host", SP_OPT_STR, "H", .def = "127.0.0.1", .help = "address to bind, websockets and DHT"},
    [S_PORT] = {"--port", SP_OPT_INT, "P", 0, 65535, .def = "0", .help = "websocket port; 0: any free port"},
    [S_BULK_PORT] = {"--bulk-port", SP_OPT_INT, "P", -1, 65535, .def = "0",
                     .help = "TCP port of the bulk tensor channel; 0: any; -1: none"},
    [S_ANNOUNCE] = {"--announce", SP_OPT_STR, "HOST[:PORT]",
                    .help = "the address clients reach it at (a relay, NAT or port forward), announced and told "
                            "instead of --host's; HOST alone keeps the ports"},
    [S_ANNOUNCE_BULK_PORT] = {"--announce-bulk-port", SP_OPT_INT, "P", 1, 65535,
                              .help = "the port clients reach the bulk channel at, when --announce moves the "
                                      "websocket's"},
    [S_SOURCE_ADDRESS] = {"--source-address", SP_OPT_STR, "ADDR",
                          .help = "the local address its own connections to other servers (pushes, next-hop pings) "
                                  "come from; default: the system's choice"},
    [S_NEW_SWARM] = {"--new-swarm", SP_OPT_FLAG, .section = "\nswarm:",
                     .help = "start a new swarm (this server's DHT node is its first peer)"},
    [S_INITIAL_PEERS] = {"--initial-peers", SP_OPT_STR, "LIST",
                         .help = "join a swarm through DHT nodes HOST:PORT[,HOST:PORT...]"},
    [S_DHT_PORT] = {"--dht-port", SP_OPT_INT, "P", 0, 65535,
                    .help = "UDP port of the DHT node (default: the websocket port; 0: any)"},
    [S_PUBLIC_NAME] = {"--public-name", SP_OPT_STR, "S", .help = "a name shown to clients"},
    [S_UPDATE_PERIOD] = {"--update-period", SP_OPT_NUM, "S", 0.1, 86400, .def = "30",
                         .help = "seconds between announcements"},
    [S_BALANCE_PERIOD] = {"--balance-period", SP_OPT_NUM, "S", 0, 1e6, .def = "60",
                          .help = "mean seconds between checks whether to move; 0: never"},
    [S_BALANCE_QUALITY] = {"--balance-quality", SP_OPT_NUM, "Q", 0, 10, .def = "0.75",
                           .help = "move when the swarm's throughput would rise by more than 1/Q"},
    [S_SELECTION_DELAY] = {"--selection-delay", SP_OPT_NUM, "S", 0, 3600, .def = "1",
                           .help = "mean seconds to wait before choosing blocks"},
    [S_BANDWIDTH] = {"--bandwidth", SP_OPT_NUM, "MBIT", 0.001, 1e7, .def = "100",
                     .help = "the network's rate, announced as tokens/s"},
    [S_SWARM_KEY] = {"--swarm-key", SP_OPT_STR, "FILE",
                     .help = "a private swarm: peers must prove this key (servers and clients alike)"},
    [S_GEN_SWARM_KEY] = {"--gen-swarm-key", SP_OPT_STR, "FILE",
                         .help = "write a new swarm key to FILE (mode 0600) and exit"},
    [S_MAX_CONNS] = {"--max-connections", SP_OPT_INT, "N", 1, 1 << 20,
                     .section = "\nlimits (what one peer can make the server hold; defaults from the span and the "
                                "machine, printed at start):",
                     .help = "connections at once (default min(4096, (open-file limit - 64) / 2))"},
    [S_MAX_CONNS_IP] = {"--max-connections-per-ip", SP_OPT_INT, "N", 1, 1 << 20,
                        .help = "from one address (default min(256, max-connections))"},
    [S_MAX_HANDSHAKES] = {"--max-handshakes", SP_OPT_INT, "N", 1, 1 << 20,
                          .help = "connections before their HELLO (default 256)"},
    [S_MAX_HANDSHAKES_IP] = {"--max-handshakes-per-ip", SP_OPT_INT, "N", 1, 1 << 20,
                             .help = "... from one address (default 64)"},
    [S_HANDSHAKE_TIMEOUT] = {"--handshake-timeout", SP_OPT_NUM, "S", 0.05, 3600,
                             .help = "for the HTTP upgrade, then again for the swarm key and HELLO (default 5)"},
    [S_IDLE_TIMEOUT] = {"--idle-timeout", SP_OPT_NUM, "S", 0, 1e9, .def = "120",
                        .help = "close connections without sessions silent this long; 0: never"},
    [S_INPUT_BUDGET] = {"--input-budget", SP_OPT_NUM, "MIB", 1, 1 << 24,
                        .help = "requests and unsent replies held, in total (default max(2 x per-conn, 512), at most "
                                "a quarter of the memory)"},
    [S_INPUT_BUDGET_CONN] = {"--input-budget-per-conn", SP_OPT_NUM, "MIB", 1, 1 << 24,
                             .help = "one connection's share, also its largest message (default: the largest request "
                                     "the span accepts)"},
    [S_INPUT_BUDGET_IP] = {"--input-budget-per-ip", SP_OPT_NUM, "MIB", 1, 1 << 24,
                           .help = "one address's share (default half the budget)"},
    [S_OUTPUT_BOUND] = {"--output-bound", SP_OPT_NUM, "MIB", 0.0625, 1 << 20,
                        .help = "unsent replies over which a connection is not read (default 1)"},
    [S_BUSY_TIMEOUT] = {"--busy-timeout", SP_OPT_NUM, "S", 0.05, 3600,
                        .help = "how long a request waits for budget before \"busy\" (default 10)"},
    [S_MIN_RATE] = {"--min-rate", SP_OPT_NUM, "KIB", 0, 1 << 30,
                    .help = "KiB/s a request must arrive at, after 10 s (default 64; 0: none)"},
    [S_DTYPE] = {"--dtype", SP_OPT_CHOICE, .choices = "f32|bf16|fp16|int8|nf4", .aliases = SP_WTYPE_ALIASES, .def = "f32", .section = "\nwork:",
                 .help = "hold the blocks as f32, bf16, fp16 (IEEE half: closer to f32 than bf16, up to 65504), "
                         "int8 (blocks of 32, like Q8_0) or nf4 (as bitsandbytes; blocks of 64), encoded at load"},
    [S_DEVICE] = {"--device", SP_OPT_STR, "cpu|cuda[:N]", .def = "cpu",
                  .help = "run the blocks on the CPU, or on CUDA GPU N (0: the first), uploaded once at start"},
    [S_THREADS] = {"--threads", SP_OPT_INT, "N", 1, 256,
                   .help = "compute threads (default: the CPUs this process may run on)"},
    [S_WORKERS] = {"--workers", SP_OPT_INT, "N", 1, 256, .def = "1", .help = "request worker threads"},
    [S_MAX_BATCH_TOKENS] = {"--max-batch-tokens", SP_OPT_INT, "N", 1, 1 << 24, .def = "2048",
                            .help = "batch x positions per request; rows of one batched pass of decode steps"},
    [S_NO_BATCH] = {"--no-batch", SP_OPT_FLAG,
                    .help = "run the decode steps of different sessions one by one, not as one pass"},
    [S_MAX_QUEUE_WAIT] = {"--max-queue-wait", SP_OPT_NUM, "S", 0, 1e6, .def = "5",
                          .help = "refuse new inference sessions (\"overloaded\") while decode steps wait longer than S "
                                  "seconds in the queue; running ones go on; 0: never"},
    [S_CACHE_TOKENS] = {"--cache-tokens", SP_OPT_INT, "N", 1, 1e12, .def = "8192",
                        .help = "KV-cache budget in positions over the span"},
    [S_CACHE_BYTES] = {"--cache-bytes", SP_OPT_INT, "N", 1, 1e15,
                       .help = "KV-cache budget in bytes instead: the positions it holds follow the family's KV heads "
                               "and head size (2 x kv_heads x head_dim x 4 per block)"},
    [S_MAX_LENGTH] = {"--max-length", SP_OPT_INT, "N", 1, 1 << 24,
                      .help = "largest inference session (default: the model's context)"},
    [S_STEP_TIMEOUT] = {"--step-timeout", SP_OPT_NUM, "S", 0.1, 1e9, .def = "300",
                        .help = "close sessions idle for S seconds"},
    [S_SESSION_TIMEOUT] = {"--session-timeout", SP_OPT_NUM, "S", 0.1, 1e9, .def = "1800",
                           .help = "close sessions older than S seconds"},
    [S_NO_MEASURE] = {"--no-measure", SP_OPT_FLAG, .help = "skip the throughput measurement at start"},
    [S_METRICS] = {"--metrics", SP_OPT_STR, "HOST:PORT",
                   .help = "serve Prometheus metrics at http://HOST:PORT/metrics (port 0: a free one, said at start)"},
    [S_VERBOSE] = {"--verbose", SP_OPT_FLAG, .help = "log requests and sessions"},
    [S_VERSION] = {"--version", SP_OPT_FLAG, .help = "print the version and exit"},
    [S_HELP] = {"--help", SP_OPT_FLAG, .short_name = "-h", .help = "this text"},
    [S_NOPTS] = {0},
};


int sp_server_opt_take(sp_server_opts *o, int k, const char *v)
{
    sp_server_limits *l = &o->limits;
    sp_wtype t = SP_W_F32;
    switch (k) {
    case S_MODEL: o->model_dir = v; break;
    case S_HOST: o->host = v; break;
    case S_PORT: o->port = (int)sp_opt_int(v); break;
    case S_BULK_PORT: o->bulk_port = (int)sp_opt_int(v); break;
    case S_ANNOUNCE_BULK_PORT: o->public_bulk_port = (int)sp_opt_int(v); break;
    case S_PUBLIC_NAME: o->public_name = v; break;
    case S_SOURCE_ADDRESS: o->source_address = v; break;
    case S_MAX_CONNS: l->max_conns = (int)sp_opt_int(v); break;
    case S_MAX_CONNS_IP: l->max_conns_per_ip = (int)sp_opt_int(v); break;
    case S_MAX_HANDSHAKES: l->max_pending = (int)sp_opt_int(v); break;
    case S_MAX_HANDSHAKES_IP: l->max_pending_per_ip = (int)sp_opt_int(v); break;
    case S_HANDSHAKE_TIMEOUT: l->handshake_timeout_s = sp_opt_num(v); break;
    case S_IDLE_TIMEOUT: l->idle_timeout_s = sp_opt_num(v); break;
    case S_BUSY_TIMEOUT: l->busy_timeout_s = sp_opt_num(v); break;
    case S_DTYPE: sp_wtype_parse(v, &t), o->dtype = (int)t; break;
    case S_DEVICE: return sp_device_parse(v, &o->device, NULL) != SP_OK; /* a bad value: the program says so */
    case S_THREADS: o->threads = (int)sp_opt_int(v); break;
    case S_WORKERS: o->workers = (int)sp_opt_int(v); break;
    case S_MAX_BATCH_TOKENS: o->max_batch_tokens = (int)sp_opt_int(v); break;
    case S_CACHE_TOKENS: o->cache_tokens = (long)sp_opt_int(v); break;
    case S_CACHE_BYTES: o->cache_bytes = (long)sp_opt_int(v); break;
    case S_MAX_LENGTH: o->max_length = (int)sp_opt_int(v); break;
    case S_STEP_TIMEOUT: o->step_timeout_s = sp_opt_num(v); break;
    case S_SESSION_TIMEOUT: o->session_timeout_s = sp_opt_num(v); break;
    case S_NO_MEASURE: o->measure = 0; break;
    case S_NO_BATCH: o->no_batch = 1; break;
    case S_MAX_QUEUE_WAIT: o->max_queue_wait_s = sp_opt_num(v); break;
    default: return 1;
    }
    return 0;
}

void sp_server_opts_default(sp_server_opts *o)
{
    memset(o, 0, sizeof *o);
    o->end = -1;
    o->measure = 1;
    o->keep_bytes = (size_t)512 << 20;
    for (int k = 0; k < S_NOPTS; k++)
        if (sp_server_opt_table[k].def)
            sp_server_opt_take(o, k, sp_server_opt_table[k].def);
}
