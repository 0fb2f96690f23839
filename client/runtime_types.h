/* runtime_types.h - the plain data the client runtime's calls take and give: the opaque handle, routes (chains
 * of hops in stages), the settings, the clock of the failure policy, and a server's row as front ends see it.
 * No functions: every part of the runtime and every front end may include it. */
#ifndef SEPAL_RUNTIME_TYPES_H
#define SEPAL_RUNTIME_TYPES_H

#include <stdint.h>
#include <sys/types.h>

#include "record.h"

/* The client runtime (runtime.h). Opaque: front ends call functions, never read it or take its lock. */
typedef struct sp_runtime sp_runtime;

#define SP_RT_MAX_HOPS 64

/* One server's part of a chain. */
typedef struct sp_hop {
    int server;            /* index of the server (a row of sp_runtime_servers) */
    int start, end;        /* blocks [start, end) it runs for this chain */
    double latency;        /* expected seconds of this hop per step (routing's estimate) */
    uint64_t keep;         /* training: the id its FORWARD kept activations under (0: none) */
} sp_hop;

/* A chain over blocks [0, L) in stages: stage s runs blocks [stage_start[s], stage_start[s+1]) and is
 * served by hops first[s] .. first[s+1]-1. A route starts with one hop per stage; when a server fails,
 * its stage is served by the replacement's hops (several if no one server covers it), so the stages
 * (the pipeline's) stay put. */
typedef struct sp_route {
    int nstages;
    int stage_start[SP_RT_MAX_HOPS + 1];
    int first[SP_RT_MAX_HOPS + 1];
    int nhops;
    sp_hop hop[SP_RT_MAX_HOPS];
    double cost;           /* expected seconds per inference step (min-latency routes), else 0: the hops' round
                              trips from the client and their blocks, and for a route over every block the
                              client's own part too (local) */
    double local;          /* of which the client's own part */
    int pushed;            /* min-latency routes: its steps go from server to server (priced so), else relayed */
} sp_route;

/* Whether inference steps and training's passes go from server to server (each pushing its output to the next) or
 * through the client. */
typedef enum sp_push_mode {
    SP_PUSH_OFF,  /* every server gets its input from the client */
    SP_PUSH_ON,   /* pushed wherever the chain's servers allow it */
    SP_PUSH_AUTO, /* pushed where it is faster: the pushed route costs less than the relayed one on the measured
                   * links, and the client's pings to its servers average 1 ms or more (on loopback a push's
                   * hand-offs cost more than the client's round trips it saves) */
} sp_push_mode;

/* The wire setting's auto: hidden states travel in bf16 over a link whose rate in their direction was measured below
 * SP_WIRE_AUTO_MBIT (a request's by sp_server_row.link_up_mbit, its reply's by link_mbit; a direction not measured
 * takes the other's; a pushed chain: bf16 throughout if any of its servers' links is slow either way), else in f32
 * (unknown links, loopback, and decode steps of one position, where the bytes are few). */
#define SP_WIRE_AUTO (-1)
#define SP_WIRE_AUTO_MBIT 300.0

/* Settings of the runtime (front ends' `set`). */
typedef struct sp_rt_settings {
    int max_retries;         /* retries of one request after failures (default 8) */
    double step_timeout_s;   /* per request; 0: derived from the expected time (a few s for a decode step) */
    double ban_s;            /* first ban (default 15 s; doubles on repeated failures) */
    double backoff_max_s;    /* longest pause between retries (default 60 s) */
    char allowed[1024];      /* "id,id,host:port,..." only these (empty: all) */
    char blocked[1024];      /* never these */
    int push;                /* sp_push_mode: inference steps and training's passes pushed from server to server
                                (default auto) */
    int wire;                /* hidden states (inference steps, training's forwards) and gradients on the wire, both
                                ways and server to server: SP_WIRE_AUTO (the default), or an sp_encoding of
                                ws/proto.h, f32 (0), f16 (1), bf16 (2) or q8 (3, 8-bit absmax blocks) */
    double update_period_s;  /* lookups of every block key (a DHT listen can miss a value: OpenDHT places it on
                                the nodes closest to the key when it starts) and pings (default 10 s) */
} sp_rt_settings;

/* A training push from one server to the next that did not arrive pauses pushes between them for this long (on the
 * failure policy's clock), doubled each time it misses again after a pause, up to the max. */
#define SP_RT_NO_PUSH_S 60.0
#define SP_RT_NO_PUSH_MAX_S 960.0

/* The clock of the failure policy: bans are measured on now(), the pauses between retries are sleep()s. The
 * runtime's own (none set) is the monotonic clock and real sleeps; a test sets one that it moves itself
 * (sp_runtime_set_clock), to check the policy without waiting. */
typedef struct sp_rt_clock {
    double (*now)(void *user);
    void (*sleep)(void *user, double s);
    void *user;
} sp_rt_clock;

/* A server as the runtime knows it, copied out of its table (sp_runtime_servers). */
typedef struct sp_server_row {
    sp_server_record rec;  /* as announced (DHT), or filled from HELLO + INFO (connect HOST:PORT) */
    int from_dht;          /* found through the DHT view */
    int gone;              /* left the view (stale, expired) or stopped */
    double rtt;            /* smoothed client ping, seconds; < 0 unknown; INFINITY unreachable */
    double banned_until;   /* sp_runtime_now() until which routing avoids it */
    double busy_until;     /* ... avoids it for having refused a session as "overloaded" (busy, not failed) */
    int failures;          /* since the last success */
    long cache_total;      /* from INFO */
    int refused_caps;      /* SP_CAP_* bits its record or HELLO said but it refused (an older server) */
    double link_mbit;      /* its link's rate toward the client as measured on its large replies, Mbit/s (0: none
                              measured yet; see sp_server_entry's down) */
    double link_up_mbit;   /* ... from the client, as it measured the client's large requests and said (0: none yet,
                              or an older server that does not say) */
    int wire_auto;         /* the encoding the wire setting's auto gives its requests of more than one position ... */
    int wire_auto_back;    /* ... and asks for their replies in */
    pid_t pid;             /* > 0: started by swarm up */
    char log[256];         /* its stderr's file, for swarm-started servers ("" otherwise) */
} sp_server_row;

#endif
