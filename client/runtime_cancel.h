/* runtime_cancel.h - cancellation, the one path for Ctrl-C, and the clock of the runtime's failure policy.
 *
 * sp_runtime_cancel (async-signal-safe: it only sets a flag) makes the work in progress stop soon: a pending
 * network wait returns SP_ERR_CANCELLED within 100 ms, retries and their back-off end, `swarm up` stops starting
 * servers, generation stops between tokens and training after the step in flight (the callers check
 * sp_runtime_cancelled; see sp_runtime_finish_steps). Nothing is banned for it, and the swarm and the sessions of
 * later requests are unaffected. The flag stays set until sp_runtime_cancel_clear (the front end clears it before
 * each command). Every call here may come from any thread. */
#ifndef SEPAL_RUNTIME_CANCEL_H
#define SEPAL_RUNTIME_CANCEL_H

#include "runtime_types.h"

void sp_runtime_cancel(sp_runtime *rt);
void sp_runtime_cancel_clear(sp_runtime *rt);
int sp_runtime_cancelled(const sp_runtime *rt);
/* While on (training's steps), a first sp_runtime_cancel only asks the work to stop: the step in flight
 * finishes, its network waits and retries running as usual, and the caller stops after it; a second cancel
 * (or one when off) ends the waits too. Turning it off after a cancel ends them as well. */
void sp_runtime_finish_steps(sp_runtime *rt, int on);
/* Whether network waits and back-offs must end now (what the connections' waits check). */
int sp_runtime_waits_cancelled(const sp_runtime *rt);

/* Seconds on the clock bans are measured on (the clock set, else sp_now_s): compare banned_until with it. */
double sp_runtime_now(const sp_runtime *rt);
/* Measures bans and back-offs on c from now on (NULL: the runtime's own clock); c must outlive its use. For
 * tests of the policy; set it before the runtime works. */
void sp_runtime_set_clock(sp_runtime *rt, const sp_rt_clock *c);

#endif
