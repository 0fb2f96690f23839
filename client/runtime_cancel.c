/* runtime_cancel.c - the cancel flags (lock-free atomics, so a signal handler may raise them) and the clock of
 * the failure policy (runtime_cancel.h). */
#include "runtime_cancel.h"

#include "runtime_state.h"
#include "timeutil.h"

/* Async-signal-safe: lock-free atomics only. */
void sp_runtime_cancel(sp_runtime *rt)
{
    int first = !__atomic_exchange_n(&rt->cancel, 1, __ATOMIC_SEQ_CST);
    if (!first || !__atomic_load_n(&rt->finish_steps, __ATOMIC_SEQ_CST))
        __atomic_store_n(&rt->cancel_waits, 1, __ATOMIC_SEQ_CST);
}

void sp_runtime_cancel_clear(sp_runtime *rt)
{
    __atomic_store_n(&rt->cancel, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&rt->cancel_waits, 0, __ATOMIC_SEQ_CST);
}

int sp_runtime_cancelled(const sp_runtime *rt) { return __atomic_load_n(&rt->cancel, __ATOMIC_SEQ_CST); }
int sp_runtime_waits_cancelled(const sp_runtime *rt) { return __atomic_load_n(&rt->cancel_waits, __ATOMIC_SEQ_CST); }

void sp_runtime_finish_steps(sp_runtime *rt, int on)
{
    __atomic_store_n(&rt->finish_steps, on, __ATOMIC_SEQ_CST);
    if (!on && sp_runtime_cancelled(rt)) /* a cancel that came meanwhile: nothing is waited for any more */
        __atomic_store_n(&rt->cancel_waits, 1, __ATOMIC_SEQ_CST);
}

double sp_runtime_now(const sp_runtime *rt) { return rt->clock ? rt->clock->now(rt->clock->user) : sp_now_s(); }
void sp_runtime_set_clock(sp_runtime *rt, const sp_rt_clock *c) { rt->clock = c; }
