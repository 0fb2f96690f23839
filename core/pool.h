/* pool.h - the engine's one persistent thread pool (decode matvecs, attention, element-wise work).
 *
 * sp_pool_run_parts(p, fn, ctx, n) runs fn(ctx, i, n) once for every part i in 0..n-1 and returns when all
 * are done. The parts are taken one at a time by whichever of the pool's threads is running, the caller
 * included: a worker that is asleep or whose core another process holds takes none, and the caller never
 * waits for it (it waits only for parts already taken), so a contended machine costs a job at most the part
 * a preempted thread holds, not a whole time slice per job. More parts than threads balance better; each costs
 * an atomic operation. sp_pool_run(p, fn, ctx) is sp_pool_run_parts with one part per thread.
 * Workers that have no job spin for a short while (a decode step's next matvec comes within microseconds) and
 * then sleep on a futex, so an idle process, or one whose cores are taken by others, gives them back: nothing
 * spins for longer than the spin budget. On a busy machine (the caller waited for a core over a tenth of the
 * time while more threads ran than the machine has CPUs, in two 5 ms looks in a row) nobody spins for the next
 * 100 ms: a spinning thread would wait for its turn while the job waits for it, a sleeping one is woken by the
 * job and runs at once.
 *
 * One job at a time: a call while another thread's job runs (two server workers, say), or from inside a job,
 * runs fn(ctx, 0, 1) on the calling thread instead of waiting. fn must accept any n >= 1. */
#ifndef SEPAL_POOL_H
#define SEPAL_POOL_H

#include <stdint.h>

typedef struct sp_pool sp_pool;
typedef void (*sp_pool_fn)(void *ctx, int i, int n);

/* nthreads <= 0: the CPUs this process may run on (sched_getaffinity). NULL when out of memory or threads. */
sp_pool *sp_pool_new(int nthreads);
void sp_pool_free(sp_pool *p);
int sp_pool_threads(const sp_pool *p);
/* Times p found the machine busy and stopped spinning (for 100 ms each). */
uint64_t sp_pool_contended(const sp_pool *p);
/* Microseconds a worker spins for the next job before it sleeps (default 50; 0: sleep at once). */
void sp_pool_set_spin(sp_pool *p, int us);

void sp_pool_run(sp_pool *p, sp_pool_fn fn, void *ctx);
/* n parts (at most 65535), taken by whichever thread is free. */
void sp_pool_run_parts(sp_pool *p, sp_pool_fn fn, void *ctx, int n);

/* The CPUs this process may run on (at least 1). */
int sp_cpu_count(void);

/* The process's default pool, created on first use with sp_pool_default_threads() threads (0: all CPUs). */
sp_pool *sp_pool_default(void);
void sp_pool_default_threads(int n); /* before the first sp_pool_default() call */

/* [lo, hi) of n items for part i of parts, in multiples of align (the last part takes the rest). */
void sp_pool_split(long n, int i, int parts, long align, long *lo, long *hi);

#endif
