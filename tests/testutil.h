/* testutil.h - helpers shared by the Check suites. */
#ifndef SEPAL_TESTUTIL_H
#define SEPAL_TESTUTIL_H

#include <check.h>
#include <stddef.h>
#include <sys/types.h>

#include "runtime_types.h"
#include "testrun.h" /* sp_test_run, sp_max_abs_diff */
/* Writes `n` bytes to a fresh file under a per-test temp dir; returns its path (static buffer rotation). */
const char *sp_test_write_file(const char *name, const void *data, size_t n);
/* The JSON of a file of at most 1 MiB (fails the test when it cannot be read or is not JSON); cJSON_Delete it. */
struct cJSON *sp_test_read_json(const char *path);
/* A fresh temporary directory (mkdtemp under $TMPDIR or /tmp). */
const char *sp_test_tmpdir(void);

/* A sepal-server process of the build tree, for tests that kill, stop or restart real servers. */
typedef struct sp_test_proc {
    pid_t pid;
    int port, dht_port;  /* from its "serving ... at ws://H:PORT (bulk port B, ... DHT H:D)" line; dht_port -1
                            without */
    int bulk_port;       /* ... -1 without */
    char log[512];       /* its stderr */
} sp_test_proc;

/* Starts SEPAL_BIN_DIR/server/sepal-server with args (NULL-terminated) and waits up to 60 s for its
 * serving line; it dies with the calling thread (PR_SET_PDEATHSIG follows the thread that forks, so a
 * helper thread that starts a server must outlive it). 0, or -1 (the server's log is printed). */
int sp_test_server_start(sp_test_proc *p, const char *const *args);
/* A TCP port of 127.0.0.1 free a moment ago (bound to port 0 and closed). */
int sp_test_free_port(void);
/* Starts SEPAL_BIN_DIR/bench/linkem with args (NULL-terminated) and waits for its first line (every link listens
 * once it is out): p->pid, and p->port the port of the first link's listening address. 0, or -1. */
int sp_test_linkem_start(sp_test_proc *p, const char *const *args);
/* Sends sig; SIGTERM/SIGKILL also reap it (pid becomes 0) and return its wait status (else 0). */
int sp_test_proc_signal(sp_test_proc *p, int sig);
/* A child of parent whose command name is comm (the DHT node of a server: "sepal-dht"), or -1. */
pid_t sp_test_child_named(pid_t parent, const char *comm);
/* Blocks until fn(user) returns non-zero or timeout_s passes (polling every 10 ms); its last value. */
int sp_test_wait_for(int (*fn)(void *user), void *user, double timeout_s);

/* The client runtime's server table, through its copies (sp_runtime_servers): the servers not gone and ONLINE; the
 * row of server i (1 if there is one); the last row of the server at port (found through the DHT if from_dht): its
 * index, or -1. */
int sp_test_count_online(sp_runtime *rt);
int sp_test_server_row(sp_runtime *rt, int i, sp_server_row *out);
int sp_test_server_at(sp_runtime *rt, int port, int from_dht, sp_server_row *out);
/* Lookups of the DHT view and pings every s seconds (the update_period setting). */
void sp_test_update_period(sp_runtime *rt, double s);
/* f32 hidden states on the wire whatever the links measure: for tests that compare numbers with another run or one
 * process at 1e-5 (wire auto sends bf16 over a link measured below SP_WIRE_AUTO_MBIT, which a loopback under ASan
 * on a loaded machine can measure: test_trainer's loss was 1.3014 against 1.3029 once). */
void sp_test_wire_f32(sp_runtime *rt);
/* Hops of the route sp_runtime_route computed last. */
int sp_test_route_hops(sp_runtime *rt);

/* Load on a server: n sessions over blocks [start, end) (hidden size H) of the server at 127.0.0.1:port, each on a
 * connection of its own, all opened before any steps (a saturated server refuses later ones), then stepping single
 * positions without pause, each in a thread, until stopped (positions rolled back before the session fills). */
typedef struct sp_test_load sp_test_load;
sp_test_load *sp_test_load_start(int port, int n, int start, int end, int H);
/* Steps answered so far (all sessions). */
int sp_test_load_steps(sp_test_load *l);
/* Asks the threads to stop (callable from an event callback: returns at once). */
void sp_test_load_halt(sp_test_load *l);
/* Stops (if not yet), joins the threads, closes the connections, frees l (NULL: nothing). */
void sp_test_load_stop(sp_test_load *l);

#endif
