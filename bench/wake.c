/* wake.c - what waking a sleeping thread costs on this machine: the floor under a swarm hop's hand-offs. A thread
 * waits on a futex; another, after the waiter has slept S microseconds (its vCPU idle meanwhile, or the waker
 * spinning on its own vCPU), notes the time and wakes it; the waiter notes when it runs again. The latency is the
 * difference. The baseline, measured in the same run: the same two threads in a ping-pong (the waker wakes the
 * waiter 5 us after it went to sleep: S = 0), what a hand-off between two busy threads costs.
 *
 * Prints, per S and per waker (sleeping beside the waiter or spinning), the median and 90th percentile latency in
 * microseconds and the median's ratio to the ping-pong's.
 *
 * usage: bench_wake [--reps N] [--sleeps "0 100 1000 5000"] */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <linux/futex.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "timeutil.h"

static uint32_t word;           /* futex: bumped by the waker for each wake-up */
static volatile uint64_t woken; /* the waiter's clock after each wake-up (ns) */
static volatile int asleep;     /* the waiter is about to wait (or waits) on word */
static volatile int stop;

static long futex(uint32_t *addr, int op, uint32_t val)
{
    return syscall(SYS_futex, addr, op | FUTEX_PRIVATE_FLAG, val, NULL, NULL, 0);
}

static uint64_t now_ns(void) { return sp_now_ns(); }

/* The waiter: sleeps on word until it changes, notes the time, and waits again. */
static void *waiter(void *arg)
{
    (void)arg;
    uint32_t seen = __atomic_load_n(&word, __ATOMIC_ACQUIRE);
    while (!stop) {
        uint32_t w;
        while ((w = __atomic_load_n(&word, __ATOMIC_ACQUIRE)) == seen && !stop) {
            asleep = 1;
            futex(&word, FUTEX_WAIT, seen);
        }
        woken = now_ns();
        asleep = 0;
        __atomic_store_n(&seen, w, __ATOMIC_RELEASE);
    }
    return NULL;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The waiter's idle stretch: nanosleep (both threads asleep: the machine idle) or a spin on the waker's vCPU. */
static void idle_for(long us, int spin)
{
    if (us <= 0)
        return;
    if (spin) {
        uint64_t until = now_ns() + (uint64_t)us * 1000;
        while (now_ns() < until)
            ;
        return;
    }
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* reps wake-ups after us of idleness; latencies (us) into lat. */
static void measure(int reps, long us, int spin, double *lat)
{
    for (int r = 0; r < reps; r++) {
        uint64_t before = woken;
        while (!asleep) /* the waiter has gone back to its wait */
            ;
        idle_for(us > 0 ? us : 5, us > 0 ? spin : 1); /* (ping-pong: 5 us for it to be in the kernel) */
        uint64_t t0 = now_ns();
        __atomic_add_fetch(&word, 1, __ATOMIC_RELEASE);
        futex(&word, FUTEX_WAKE, 1);
        while (woken == before)
            ;
        lat[r] = (double)(woken - t0) / 1e3;
    }
}

int main(int argc, char **argv)
{
    int reps = 400;
    const char *sleeps = "0 100 1000 5000";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sleeps") && i + 1 < argc)
            sleeps = argv[++i];
        else {
            fprintf(stderr, "usage: bench_wake [--reps N] [--sleeps \"0 100 1000 5000\"]\n");
            return 2;
        }
    }
    if (reps < 10)
        reps = 10;
    double *lat = malloc((size_t)reps * sizeof *lat);
    pthread_t th;
    if (!lat || pthread_create(&th, NULL, waiter, NULL)) {
        fprintf(stderr, "bench_wake: out of memory or threads\n");
        return 1;
    }
    idle_for(20000, 0); /* the waiter reaches its first wait */
    double base = 0;
    char *list = strdup(sleeps);
    printf("wake-up latency of a thread waiting on a futex (us; %d wake-ups each; %ld CPUs online)\n", reps,
           sysconf(_SC_NPROCESSORS_ONLN));
    for (char *tok = strtok(list, " ,"); tok; tok = strtok(NULL, " ,")) {
        long us = atol(tok);
        for (int spin = 0; spin < (us > 0 ? 2 : 1); spin++) {
            measure(reps, us, spin, lat);
            qsort(lat, (size_t)reps, sizeof *lat, cmp_d);
            double med = lat[reps / 2], p90 = lat[reps * 9 / 10];
            if (us == 0 && base == 0)
                base = med;
            char what[80];
            if (us == 0)
                snprintf(what, sizeof what, "ping-pong (woken 5 us after its wait)");
            else
                snprintf(what, sizeof what, "after %ld us asleep, the waker %s", us, spin ? "spinning" : "asleep too");
            printf("  %-48s median %7.1f  p90 %7.1f  x%.1f the ping-pong\n", what, med, p90, base > 0 ? med / base : 0);
        }
    }
    stop = 1;
    __atomic_add_fetch(&word, 1, __ATOMIC_RELEASE);
    futex(&word, FUTEX_WAKE, 1);
    pthread_join(th, NULL);
    free(list);
    free(lat);
    return 0;
}
