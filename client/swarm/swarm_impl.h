/* swarm_impl.h - internals shared by the swarm's files and the runtime's life cycle (not a public header: it
 * includes the runtime's private state, private/runtime_state.h). */
#ifndef SEPAL_SWARM_IMPL_H
#define SEPAL_SWARM_IMPL_H

#include <math.h>
#include <string.h>

#include "remote.h"
#include "runtime_cancel.h"
#include "runtime_state.h"
#include "swarm.h"

#define CALL_TIMEOUT_MS 120000

/* ---------------------------------------------------------------------------------------------- */
/* servers.c: the table and the connections */

/* The entry of server i (entries never move; indices stay valid). */
static inline sp_server_entry *sp_rt_entry(sp_runtime *rt, int i) { return rt->servers[i]; }
/* Adds (or updates, by id) an entry; caller holds rt->lock. Index, or -1 when out of memory. */
int sp_rt_server_put(sp_runtime *rt, const sp_server_record *r, int from_dht);
/* "name (127.0.0.1:4001)" or "127.0.0.1:4001": how messages name server i. */
void sp_rt_server_label(sp_runtime *rt, int i, char *buf, size_t cap);
/* One request to server i on its shared connection (opened if needed). A transport failure (closed,
 * timed out, unreadable reply) breaks the connection: the next request opens a new one, and the server
 * sees the old one close (a hung server frees its sessions when it wakes). An ERROR reply keeps it. */
sp_status sp_rt_call(sp_runtime *rt, int i, sp_msg_type type, const char *meta, const sp_tensor_src *t, int n,
                     sp_reply *rep, int timeout_ms, sp_err *err);
/* sp_rt_call that gives up once *abort is non-zero (SP_ERR_CANCELLED; the connection stays): NULL never. */
sp_status sp_rt_call_abortable(sp_runtime *rt, int i, sp_msg_type type, const char *meta, const sp_tensor_src *t,
                               int n, sp_reply *rep, int timeout_ms, const int *abort, sp_err *err);
/* The encoding the wire setting's auto gives hidden states of more than one position over a link of mbit (0:
 * unknown): bf16 below SP_WIRE_AUTO_MBIT, else f32. */
static inline sp_encoding sp_rt_wire_of_link(double mbit)
{
    return mbit > 0 && mbit < SP_WIRE_AUTO_MBIT ? SP_ENC_BF16 : SP_ENC_F32;
}
/* What auto gives a client-driven request to the server of entry e: its hidden states by the link's rate toward the
 * server (returned; not measured yet, or an older server that does not say: the rate back stands in, as it did
 * before servers said), its reply's by the rate back (*back; not measured: f32, as a link too fast to measure). */
static inline sp_encoding sp_rt_wire_of_entry(const sp_server_entry *e, sp_encoding *back)
{
    *back = sp_rt_wire_of_link(e->link_down.mbit);
    return sp_rt_wire_of_link(e->link_up.mbit > 0 ? e->link_up.mbit : e->link_down.mbit);
}
/* The encodings of a request's hidden states to servers srv[0..n) for T positions a row: the wire setting, or its
 * auto (decode steps, T 1, in f32). back non-NULL (a client-driven hop, n 1): the request's by the link toward its
 * server, and into *back its reply's, by the link back (sp_rt_wire_of_entry). back NULL (a pushed chain: the reply
 * and the pushes after it come in the encoding of the first hop's input): one for all, bf16 where any link of any
 * of them is slow either way. Takes rt->lock itself. */
sp_encoding sp_rt_wire(sp_runtime *rt, const int *srv, int n, int T, sp_encoding *back);
/* Closes every connection (swarm down, free). */
void sp_rt_close_conns(sp_runtime *rt);
/* 1 if a and b announce the same address (host and ws port): lives of one server, or the same one. */
static inline int sp_rt_same_addr(const sp_server_entry *a, const sp_server_entry *b)
{
    return a->rec.port == b->rec.port && !strcmp(a->rec.host, b->rec.host);
}
/* Push auto's rule: steps over these servers are pushed when the client's known pings to them average 1 ms or
 * more (unknown ones count 0). Caller holds rt->lock. */
#define SP_PUSH_AUTO_PING 1e-3
static inline int sp_rt_pings_call_for_push(const sp_runtime *rt, const int *server, int n)
{
    double rtt = 0;
    for (int h = 0; h < n; h++) {
        double r = rt->servers[server[h]]->rtt;
        rtt += r > 0 && isfinite(r) ? r : 0;
    }
    return n > 0 && rtt / n >= SP_PUSH_AUTO_PING;
}
/* Where other servers push to server i: the address it is announced at (HELLO's addr, else its record's). Takes
 * rt->lock itself. */
void sp_rt_push_addr(sp_runtime *rt, int i, char *host, size_t cap, int *port);
/* 1 if server i says it can do cap (SP_CAP_* of ws/proto.h: its record's or HELLO's caps) and has not refused it.
 * Caller holds rt->lock. */
static inline int sp_rt_can(const sp_runtime *rt, int i, int cap)
{
    const sp_server_entry *e = rt->servers[i];
    return (e->rec.caps & ~e->refused_caps & cap) == cap;
}
/* Server i answered a request that awaited its pushed input with an error of ours (why): it cannot do cap after all
 * (an older server). Remembered on its entry (sp_rt_can says 0 from now on), told once as an SP_EV_SERVER event. */
void sp_rt_refused_await(sp_runtime *rt, int i, int cap, const sp_err *why);
/* Training's passes over the route r (one hop a stage): 1 if they go from server to server, by the push setting
 * (auto: where the pushed chain is priced below the relayed one, see sp_rt_train_price, and the client's pings
 * to its servers average 1 ms or more): two hops or more, one a stage, no server twice, each saying it can
 * (SP_CAP_SPAN_PUSH), no pair whose pushes are paused (a push between them did not arrive lately). */
int sp_rt_train_pushable(sp_runtime *rt, const sp_route *r);
/* What one pass over servers srv[0..n) costs on the links, in seconds: relayed, the client's round trip to each;
 * pushed, the client's one-way delay to the first, each server's to the next (half the ping it announced for it,
 * else half the client's to the next) and the last one's back (an unknown ping counts 0.3 s, as routing's).
 * Caller holds rt->lock. */
double sp_rt_train_price(const sp_runtime *rt, const int *srv, int n, int pushed);
/* After a transport failure of server i: when its address refuses connections now (a plain TCP connect;
 * a killed server's port closes with it), every entry at that address is down (routing leaves them out)
 * and unreachable. 1 if so. Takes rt->lock itself. */
int sp_rt_probe_down(sp_runtime *rt, int i);

/* ---------------------------------------------------------------------------------------------- */
/* policy.c: failures, bans, retries, timeouts */

/* 1 if the failure st (with rep's ERROR code, if any) is the server's: ban and retry elsewhere. 0 for
 * errors any server would give (a bad request of ours). */
int sp_rt_retryable(sp_status st, const sp_reply *rep);
/* Server i failed a request: ban it (ban_s * 2^failures), and report the retry that follows (attempt of
 * max) or that none does. A server that refused a session as "overloaded" (why: SP_ERR_BUSY) did not fail: it is
 * busy, avoided by routing for ban_s (not doubled; its failures stay), and the report says so. */
void sp_rt_failed(sp_runtime *rt, int i, int attempt, const sp_err *why);
void sp_rt_succeeded(sp_runtime *rt, int i);
/* Whether routing avoids entry e as busy at time now (sp_runtime_now): it refused a session as "overloaded" lately,
 * or its record says its queue wait is over its bound (it refuses new sessions now). Caller holds rt->lock. */
static inline int sp_rt_busy(const sp_server_entry *e, double now)
{
    return e->busy_until > now || sp_record_saturated(&e->rec);
}
/* No route over blocks [start, end) for try `attempt`: some block has no online server. If joining servers hold
 * every such block, an SP_EV_RETRY event says so with the retry that follows (as sp_rt_failed's), and 1 is
 * returned: wait and retry. Otherwise 0: fail now, as waiting cannot help, err saying why: "no online server
 * holds block B (of 0..L-1), and none is joining", or after the server failure err held, "THAT FAILURE; no other
 * server holds block B (of 0..L-1), and none is joining". */
int sp_rt_no_server(sp_runtime *rt, int start, int end, int attempt, sp_err *err);
/* Seconds to wait before retry `attempt` (1, 2, ...): 0, 1, 2, 4 ... backoff_max_s. */
double sp_rt_backoff(const sp_runtime *rt, int attempt);
/* Sleeps s seconds, or less when the runtime is cancelled: 0, or -1 if it was. */
int sp_rt_sleep(sp_runtime *rt, double s);
/* How long a request may take on server i: the step_timeout setting, else 2 s plus 20 times what its
 * announced rate predicts for `tokens` positions over `nblocks` blocks (decode: at its single-token step
 * rate, tokens = the batch's rows; else at its forward rate). */
int sp_rt_timeout_ms(sp_runtime *rt, int i, int nblocks, long tokens, int decode);

/* ---------------------------------------------------------------------------------------------- */
/* route.c */

/* r = the hops of `hops`, one stage each. */
void sp_route_single_stage(sp_route *r, const sp_route *hops);
/* A max-throughput route over blocks [start, end) (a training stage's replacement). */
sp_status sp_rt_route_span_train(sp_runtime *rt, int start, int end, sp_route *out, sp_err *err);
/* Whether waiting for blocks [start, end) makes sense: 1 if every block there without an online server is
 * held by a joining one (who: "server ID (blocks a:b) is joining", the first; "" when no block lacks a server
 * now), 0 if some block has neither; *missing: the first block without an online server (-1: none). */
int sp_rt_joining(sp_runtime *rt, int start, int end, int *missing, char *who, size_t cap);
/* Replaces the hops of stage s with the hops of repl (a route over the stage's blocks). 0, or -1 when too
 * many hops. Keep ids of the stage are cleared. */
int sp_route_replace_stage(sp_route *r, int s, const sp_route *repl);

/* ---------------------------------------------------------------------------------------------- */
/* local.c */

/* Reaps servers of swarm up that died: their entries become gone, with an event saying how they ended. */
void sp_rt_reap_local(sp_runtime *rt);

/* ---------------------------------------------------------------------------------------------- */
/* discovery.c */

/* Re-creates the view for the loaded model (after load). */
sp_status sp_rt_view_follow_model(sp_runtime *rt, sp_err *err);
/* Stops the view, the pinger and the DHT node; DHT entries become gone. */
void sp_rt_leave(sp_runtime *rt);
/* Measures the round trip to server i now (a burst of pings, the fastest; the median of the last few is its
 * ping); a server that does not answer is unreachable (and down if nothing listens at its address). */
void sp_rt_ping(sp_runtime *rt, int i);
/* Pings, now, up to 3 servers each of the first block, of middle blocks and of the last block whose round trip is
 * still unknown (what the pinger thread measures first). */
void sp_rt_ping_unknown(sp_runtime *rt);
/* Forgets every measured ping (they were taken while servers started): the next use measures them anew. */
void sp_rt_forget_pings(sp_runtime *rt);
/* Waits until the view holds an ONLINE record of a server at port (on 127.0.0.1): its index, or -1. */
int sp_rt_wait_server(sp_runtime *rt, int port, double timeout_s);

#endif
