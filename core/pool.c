/* pool.c - a persistent thread pool: a job generation counter the workers wait on (spinning briefly, then
 * FUTEX_WAIT); the job's parts taken one at a time from a ticket by whichever thread is running (the caller
 * too), and a count of parts done the caller waits on the same way. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "pool.h"
#include "trace.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() __asm__ __volatile__("" ::: "memory")
#endif

struct sp_pool {
    int n;                /* threads, the caller included */
    pthread_t *th;
    int started;          /* workers created */
    sp_pool_fn fn;        /* the job: valid while one of its parts is untaken or running */
    void *ctx;
    uint64_t ticket;      /* the job's generation << 32 | its parts << 16 | the next part to take */
    uint32_t gen;         /* futex: bumped for every job (and for stop) */
    uint32_t done;        /* futex: parts of the job finished */
    uint32_t sleepers;    /* workers in FUTEX_WAIT on gen (a job wakes them only if some sleep) */
    uint32_t waiting;     /* the caller is in FUTEX_WAIT on done */
    int stop;
    int spin_ns;
    uint64_t contended_until; /* nobody spins before this (ns): other processes hold the cores */
    uint64_t contended;       /* times the pool was found contended */
    pthread_mutex_t busy; /* one job at a time */
};

static __thread int in_job; /* this thread runs a job: a nested call runs inline */

static long futex(uint32_t *addr, int op, uint32_t val)
{
    return syscall(SYS_futex, addr, op | FUTEX_PRIVATE_FLAG, val, NULL, NULL, 0);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Spinning pays while the pool's threads have cores to themselves. When other processes hold the cores (a busy
 * machine), a spinning worker burns its share of a core and, once descheduled, waits its turn while the job
 * waits for it; a sleeping one is woken by the job and, having slept, runs at once. So the caller looks, at most
 * every LOOK_NS, at how long it waited for a core while runnable (the run delay the kernel keeps for every
 * thread, /proc/thread-self/schedstat): over a tenth of the time, with more threads runnable on the machine than
 * it has CPUs (/proc/loadavg's running count, the looking thread included), in two looks in a row, and nobody
 * spins for CONTENDED_NS. The run delay alone misleads where processes hand work to each other: a thread woken
 * on an idle virtual CPU counts its wake-up (50-120 us) as run delay, so a loopback swarm's server (a step of
 * ~1 ms after each wake-up) looked busy in 1 of 4 windows, stopped spinning, and computed its steps 1.5x slower
 * than the same blocks in one process. (Measured on a 2-core VM over 5 ms windows, a swarm of one server: idle,
 * 1-2 threads running in 386 of 421 windows; with two busy processes, 3-7 in all 550, over a tenth of run delay
 * in 432 of them. Earlier, the run delay alone: idle, 197 of 200 windows under 1%; busy, 375 of 400 over 20%.)
 * Without schedstat (a kernel without it), the pool always spins; without loadavg, the run delay decides alone,
 * as it does where this process may run on fewer CPUs than the machine has (the count says nothing of its own). */
#define LOOK_NS 5000000ull
#define HOT_LOOKS 2
#define CONTENDED_NS 100000000ull

/* The spin budget from now: none while the pool is contended. */
static uint64_t spin_budget(sp_pool *p, uint64_t now)
{
    if (now < __atomic_load_n(&p->contended_until, __ATOMIC_RELAXED))
        return 0;
    return (uint64_t)__atomic_load_n(&p->spin_ns, __ATOMIC_RELAXED);
}

/* The first bytes of a small /proc file, NUL-terminated, in buf[cap]: their count, or 0 when it cannot be read. */
static size_t read_proc(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, cap - 1);
    close(fd);
    buf[n > 0 ? n : 0] = 0;
    return n > 0 ? (size_t)n : 0;
}

/* This thread's run delay so far (ns), or 0 if the kernel does not say. */
static uint64_t run_delay_ns(void)
{
    char buf[96];
    if (!read_proc("/proc/thread-self/schedstat", buf, sizeof buf))
        return 0;
    /* "<time on a cpu> <time waiting for one> <timeslices>": the second number */
    char *end;
    strtoull(buf, &end, 10);
    if (end == buf || *end != ' ' || end[1] < '0' || end[1] > '9')
        return 0;
    return strtoull(end + 1, NULL, 10);
}

/* Whether more threads are running on the machine than it has CPUs (1 when it cannot tell). */
static int machine_oversubscribed(void)
{
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    char buf[128];
    if (online < 1 || sp_cpu_count() < online || !read_proc("/proc/loadavg", buf, sizeof buf))
        return 1;
    /* "0.12 0.34 0.56 <running>/<threads> <last pid>": the fourth field's first number */
    char *p = buf;
    for (int f = 0; f < 3 && p; f++)
        if ((p = strchr(p, ' ')))
            p++;
    if (!p || *p < '0' || *p > '9')
        return 1;
    return strtol(p, NULL, 10) > online;
}

/* The caller's look (at most every LOOK_NS; the calling thread's own figures, kept per thread). */
static void look_contention(sp_pool *p)
{
    static __thread uint64_t next, last_t, last_delay;
    static __thread int hot;
    uint64_t t = now_ns();
    if (t < next)
        return;
    next = t + LOOK_NS;
    uint64_t d = run_delay_ns();
    if (!d)
        return;
    int waited = last_t && (d - last_delay) * 10 > t - last_t; /* a longer window (no jobs, or a slow one) dilutes */
    hot = waited && machine_oversubscribed() ? hot + 1 : 0;
    last_t = t;
    last_delay = d;
    if (hot >= HOT_LOOKS) {
        if (t >= __atomic_load_n(&p->contended_until, __ATOMIC_RELAXED)) {
            SP_TRACE(SP_TR_POOL_CONTENDED);
            __atomic_add_fetch(&p->contended, 1, __ATOMIC_RELAXED);
        }
        __atomic_store_n(&p->contended_until, t + CONTENDED_NS, __ATOMIC_RELAXED);
    }
}

int sp_cpu_count(void)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0)
            return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* Takes and runs parts of job `gen` until none is left; the parts it ran are counted in done. A thread that
 * comes late (the job is over, or another one has begun) takes nothing: the generation in the ticket differs,
 * or every part is taken. A part taken means its job cannot end before it is done, so fn and ctx, read after
 * the take, are that job's. */
static void take_parts(sp_pool *p, uint32_t gen)
{
    uint64_t t = __atomic_load_n(&p->ticket, __ATOMIC_ACQUIRE);
    for (;;) {
        uint32_t parts = (uint32_t)(t >> 16) & 0xffff, i = (uint32_t)t & 0xffff;
        if ((uint32_t)(t >> 32) != gen || i >= parts)
            return;
        if (!__atomic_compare_exchange_n(&p->ticket, &t, t + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            continue; /* t now holds the current ticket */
        sp_pool_fn fn = p->fn;
        void *ctx = p->ctx;
        int was = in_job;
        in_job = 1;
        fn(ctx, (int)i, (int)parts);
        in_job = was;
        if (__atomic_add_fetch(&p->done, 1, __ATOMIC_ACQ_REL) == parts && __atomic_load_n(&p->waiting, __ATOMIC_SEQ_CST))
            futex(&p->done, FUTEX_WAKE, 1);
        t = __atomic_load_n(&p->ticket, __ATOMIC_ACQUIRE);
    }
}

typedef struct worker_arg {
    sp_pool *p;
    int id;
} worker_arg;

static void *worker_main(void *arg)
{
    worker_arg *w = arg;
    pthread_setname_np(pthread_self(), "sp-pool");
    sp_pool *p = w->p;
    free(w);
    uint32_t seen = 0; /* the generation at creation: a job posted before this thread ran is still seen */
    for (;;) {
        /* spin for the next job (unless the pool is contended), then sleep */
        uint64_t t = now_ns(), until = t + spin_budget(p, t);
        uint32_t g;
        int spins = 0;
        while ((g = __atomic_load_n(&p->gen, __ATOMIC_ACQUIRE)) == seen) {
            if ((++spins & 63) == 0 && now_ns() >= until) {
                __atomic_add_fetch(&p->sleepers, 1, __ATOMIC_SEQ_CST);
                if (__atomic_load_n(&p->gen, __ATOMIC_SEQ_CST) == seen)
                    futex(&p->gen, FUTEX_WAIT, seen);
                __atomic_sub_fetch(&p->sleepers, 1, __ATOMIC_SEQ_CST);
                t = now_ns();
                until = t + spin_budget(p, t);
            } else {
                CPU_RELAX();
            }
        }
        seen = g;
        if (__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE))
            return NULL;
        take_parts(p, g);
    }
}

sp_pool *sp_pool_new(int nthreads)
{
    sp_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->n = nthreads > 0 ? nthreads : sp_cpu_count();
    if (p->n > 256)
        p->n = 256;
    p->spin_ns = 50 * 1000;
    pthread_mutex_init(&p->busy, NULL);
    p->th = calloc((size_t)p->n, sizeof *p->th);
    if (!p->th) {
        free(p);
        return NULL;
    }
    for (int i = 1; i < p->n; i++) {
        worker_arg *w = malloc(sizeof *w);
        if (w)
            *w = (worker_arg){p, i};
        if (!w || pthread_create(&p->th[i], NULL, worker_main, w)) {
            free(w);
            p->n = i; /* fewer threads: still a working pool */
            break;
        }
        p->started = i;
    }
    return p;
}

void sp_pool_free(sp_pool *p)
{
    if (!p)
        return;
    __atomic_store_n(&p->stop, 1, __ATOMIC_RELEASE);
    __atomic_add_fetch(&p->gen, 1, __ATOMIC_SEQ_CST);
    futex(&p->gen, FUTEX_WAKE, INT_MAX);
    for (int i = 1; i <= p->started; i++)
        pthread_join(p->th[i], NULL);
    pthread_mutex_destroy(&p->busy);
    free(p->th);
    free(p);
}

int sp_pool_threads(const sp_pool *p) { return p ? p->n : 1; }

uint64_t sp_pool_contended(const sp_pool *p) { return p ? __atomic_load_n(&p->contended, __ATOMIC_RELAXED) : 0; }

void sp_pool_set_spin(sp_pool *p, int us) { __atomic_store_n(&p->spin_ns, us > 0 ? us * 1000 : 0, __ATOMIC_RELAXED); }

void sp_pool_run_parts(sp_pool *p, sp_pool_fn fn, void *ctx, int parts)
{
    if (parts < 1)
        parts = 1;
    if (parts > 0xffff)
        parts = 0xffff;
    if (!p || p->n <= 1 || parts == 1 || in_job || pthread_mutex_trylock(&p->busy)) {
        int was = in_job;
        in_job = 1;
        fn(ctx, 0, 1); /* the whole job as one part */
        in_job = was;
        return;
    }
    look_contention(p);
    /* publish the job: fn, ctx and done first, then the ticket, then the generation the workers wait on */
    uint32_t g = __atomic_load_n(&p->gen, __ATOMIC_RELAXED) + 1;
    if (g == 0) /* the ticket's generation 0 never names a job */
        g = 1;
    p->fn = fn;
    p->ctx = ctx;
    __atomic_store_n(&p->done, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&p->ticket, (uint64_t)g << 32 | (uint64_t)parts << 16, __ATOMIC_RELEASE);
    __atomic_store_n(&p->gen, g, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&p->sleepers, __ATOMIC_SEQ_CST)) {
        SP_TRACE(SP_TR_POOL_WAKE);
        futex(&p->gen, FUTEX_WAKE, INT_MAX);
    }
    /* the caller takes parts too: a worker that is not running (asleep, or its core taken by another
     * process) takes none, and nothing waits for it */
    take_parts(p, g);
    /* wait for the parts others took: spin briefly (unless contended), then sleep on done */
    uint64_t t = now_ns(), until = t + spin_budget(p, t);
    int spins = 0;
    uint32_t d;
    while ((d = __atomic_load_n(&p->done, __ATOMIC_ACQUIRE)) != (uint32_t)parts) {
        if ((++spins & 63) == 0 && now_ns() >= until) {
            __atomic_store_n(&p->waiting, 1, __ATOMIC_SEQ_CST);
            if ((d = __atomic_load_n(&p->done, __ATOMIC_SEQ_CST)) != (uint32_t)parts)
                futex(&p->done, FUTEX_WAIT, d);
            __atomic_store_n(&p->waiting, 0, __ATOMIC_SEQ_CST);
        } else {
            CPU_RELAX();
        }
    }
    pthread_mutex_unlock(&p->busy);
}

void sp_pool_run(sp_pool *p, sp_pool_fn fn, void *ctx) { sp_pool_run_parts(p, fn, ctx, p ? p->n : 1); }

/* ---------------------------------------------------------------------------------------------- */

static pthread_once_t default_once = PTHREAD_ONCE_INIT;
static sp_pool *default_pool;
static int default_threads;

static void default_init(void) { default_pool = sp_pool_new(default_threads); }

sp_pool *sp_pool_default(void)
{
    pthread_once(&default_once, default_init);
    return default_pool;
}

void sp_pool_default_threads(int n) { default_threads = n; }

void sp_pool_split(long n, int i, int parts, long align, long *lo, long *hi)
{
    if (align < 1)
        align = 1;
    long units = (n + align - 1) / align;
    long a = units * i / parts, b = units * (i + 1) / parts;
    *lo = a * align < n ? a * align : n;
    *hi = i == parts - 1 ? n : (b * align < n ? b * align : n);
}
