/* test_noalloc.c - no allocation per token in the decode path: two sepal servers (threads of this process) and
 * a client generating through them over real loopback connections (websocket + bulk channel), and every call
 * to malloc, calloc, realloc, free and the aligned allocators in this process counted while 100 decode steps
 * run, after a few steps of warm-up. Counted per thread and attributed by the thread's name (the library names
 * its threads: sp-ws-srv, sp-bulk-srv, sp-worker, sp-reaper for a server, sp-ws-cli and sp-bulk-cli for a
 * client's transport, sp-pool for the compute pool; the generating thread is the client's).
 *
 * Without sanitizers the allocators are replaced in this executable (forwarding to glibc's __libc_* entry
 * points, which shared libraries such as libwebsockets and OpenBLAS reach too); under ASan they are seen
 * through the sanitizer's malloc/free hooks. On failure the first allocations' backtraces are printed
 * (addr2line -e test_noalloc ADDRESS names a frame of this executable). */
#include <errno.h>
#include <execinfo.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "generate.h"
#include "runtime.h"
#include "server.h"
#include "testutil.h"

#define M15 SEPAL_STORIES15M_DIR
#define WARM 8    /* decode steps before counting: connections, sessions and scratch buffers settle */
#define STEPS 100 /* decode steps counted */

/* ---------------------------------------------------------------------------------------------- */
/* counting */

#define MAX_THREADS 128
#define MAX_TRACES 24
#define TRACE_DEPTH 24

static atomic_int g_on;  /* the window is open */
static atomic_int g_gen; /* which window: a thread registers once per window */
static _Thread_local int t_busy, t_slot = -1, t_gen;

typedef struct thread_count {
    pid_t tid;
    atomic_long allocs, frees;
} thread_count;
static thread_count g_thr[MAX_THREADS];
static atomic_int g_nthr;

typedef struct trace {
    pid_t tid;
    char kind; /* 'a' allocation, 'f' free */
    size_t size;
    int depth;
    void *frames[TRACE_DEPTH];
} trace;
static trace g_trace[MAX_TRACES];
static atomic_int g_ntrace;

static void note(int is_free, size_t size)
{
    if (!atomic_load_explicit(&g_on, memory_order_relaxed) || t_busy)
        return;
    t_busy = 1; /* backtrace() and anything below must not count themselves */
    int gen = atomic_load(&g_gen);
    if (t_slot < 0 || t_gen != gen) {
        int i = atomic_fetch_add(&g_nthr, 1);
        t_slot = i < MAX_THREADS ? i : MAX_THREADS - 1;
        t_gen = gen;
        if (i < MAX_THREADS)
            g_thr[i].tid = (pid_t)syscall(SYS_gettid);
    }
    atomic_fetch_add(is_free ? &g_thr[t_slot].frees : &g_thr[t_slot].allocs, 1);
    int k = atomic_fetch_add(&g_ntrace, 1);
    if (k < MAX_TRACES) {
        trace *t = &g_trace[k];
        t->tid = (pid_t)syscall(SYS_gettid);
        t->kind = is_free ? 'f' : 'a';
        t->size = size;
        t->depth = backtrace(t->frames, TRACE_DEPTH);
    }
    t_busy = 0;
}

#if defined(__SANITIZE_ADDRESS__)
/* the sanitizer runtime's (gcc 12 ships no header for it: llvm's sanitizer/allocator_interface.h declares it) */
int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void *, size_t),
                                              void (*free_hook)(const volatile void *));

static void asan_malloc_hook(const volatile void *p, size_t size)
{
    (void)p;
    note(0, size);
}

static void asan_free_hook(const volatile void *p)
{
    if (p)
        note(1, 0);
}

static void install_counters(void) { __sanitizer_install_malloc_and_free_hooks(asan_malloc_hook, asan_free_hook); }
#else
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);

void *malloc(size_t n)
{
    note(0, n);
    return __libc_malloc(n);
}

void *calloc(size_t k, size_t n)
{
    note(0, k * n);
    return __libc_calloc(k, n);
}

void *realloc(void *p, size_t n)
{
    note(0, n);
    return __libc_realloc(p, n);
}

void free(void *p)
{
    if (p)
        note(1, 0);
    __libc_free(p);
}

void *memalign(size_t a, size_t n)
{
    note(0, n);
    return __libc_memalign(a, n);
}

void *aligned_alloc(size_t a, size_t n)
{
    note(0, n);
    return __libc_memalign(a, n);
}

int posix_memalign(void **out, size_t a, size_t n)
{
    if (a < sizeof(void *) || (a & (a - 1)))
        return EINVAL;
    note(0, n);
    void *p = __libc_memalign(a, n);
    if (!p)
        return ENOMEM;
    *out = p;
    return 0;
}

void *valloc(size_t n)
{
    note(0, n);
    return __libc_memalign((size_t)sysconf(_SC_PAGESIZE), n);
}

static void install_counters(void) {}
#endif

static void window_open(void)
{
    atomic_fetch_add(&g_gen, 1);
    for (int i = 0; i < MAX_THREADS; i++) {
        g_thr[i].tid = 0;
        atomic_store(&g_thr[i].allocs, 0);
        atomic_store(&g_thr[i].frees, 0);
    }
    atomic_store(&g_nthr, 0);
    atomic_store(&g_ntrace, 0);
    atomic_store(&g_on, 1);
}

static void window_close(void) { atomic_store(&g_on, 0); }

/* The thread's name (the library names its threads), or "?" once it is gone. */
static void thread_name(pid_t tid, char *out, size_t cap)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/comm", (int)tid);
    FILE *f = fopen(path, "r");
    snprintf(out, cap, "?");
    if (f) {
        if (fgets(out, (int)cap, f))
            out[strcspn(out, "\n")] = '\0';
        fclose(f);
    }
}

static const char *side_of(const char *name, pid_t tid)
{
    size_t n = strlen(name);
    if (tid == (pid_t)syscall(SYS_gettid) || (n > 4 && !strcmp(name + n - 4, "-cli")))
        return "client";
    if (!strncmp(name, "sp-pool", 7))
        return "compute pool";
    if (!strncmp(name, "sp-", 3))
        return "server";
    return "other";
}

/* Prints what the window counted per thread (and the first traces when anything was); *client and *server:
 * the sums of each side (the compute pool, shared by both in this process, goes with the server). */
static long report(const char *label, long *client, long *server)
{
    long total = 0;
    *client = *server = 0;
    int n = atomic_load(&g_nthr);
    n = n < MAX_THREADS ? n : MAX_THREADS;
    for (int i = 0; i < n; i++) {
        char name[64];
        thread_name(g_thr[i].tid, name, sizeof name);
        long a = atomic_load(&g_thr[i].allocs), f = atomic_load(&g_thr[i].frees);
        const char *side = side_of(name, g_thr[i].tid);
        fprintf(stderr, "%s: thread %d (%s, %s): %ld allocations, %ld frees\n", label, (int)g_thr[i].tid, name, side,
                a, f);
        total += a + f;
        *(strcmp(side, "client") ? server : client) += a + f;
    }
    int nt = atomic_load(&g_ntrace);
    for (int k = 0; k < nt && k < MAX_TRACES; k++) {
        char name[64];
        thread_name(g_trace[k].tid, name, sizeof name);
        fprintf(stderr, "--- %s: %s of %zu bytes on thread %d (%s):\n", label,
                g_trace[k].kind == 'f' ? "free" : "allocation", g_trace[k].size, (int)g_trace[k].tid, name);
        backtrace_symbols_fd(g_trace[k].frames, g_trace[k].depth, 2);
    }
    return total;
}

/* ---------------------------------------------------------------------------------------------- */
/* a generation with the window around STEPS decode steps */

typedef struct run {
    sp_lm inner;  /* the swarm LM */
    int forwards; /* LM forward calls so far (the first is the prompt's) */
    int counted;  /* ... while the window was open */
    int tokens;   /* tokens the callback saw */
} run;

static run g_run;

/* The window opens as decode step WARM + 1 starts and closes as step WARM + STEPS ends: everything between (the
 * steps, choosing each token, the text, the callback, beam search's reorders) is counted. */
/* Step `step` (0: the prompt) is about to run: the counting window opens before step WARM + 1. */
static int counting_begin(void)
{
    int step = g_run.forwards++;
    if (step == WARM + 1)
        window_open();
    if (atomic_load(&g_on))
        g_run.counted++;
    return step;
}

static void counting_end(int step)
{
    if (step == WARM + STEPS)
        window_close();
}

static sp_status counting_forward(void *ctx, const int32_t *ids, int B, int T, float *logits, sp_err *err)
{
    int step = counting_begin();
    sp_status st = g_run.inner.forward(ctx, ids, B, T, logits, err);
    counting_end(step);
    return st;
}

/* greedy steps come this way (the head's exact argmax) */
static sp_status counting_forward_argmax(void *ctx, const int32_t *ids, int B, int T, int32_t *best, sp_err *err)
{
    int step = counting_begin();
    sp_status st = g_run.inner.forward_argmax(ctx, ids, B, T, best, err);
    counting_end(step);
    return st;
}

static int on_token(int row, int token, const char *text, void *user)
{
    (void)row, (void)token, (void)text, (void)user;
    g_run.tokens++;
    return 0;
}

static int g_ws_only; /* servers without a bulk port: every message over the websocket (libwebsockets) */

static sp_server *start_server(int a, int b, int workers_only)
{
    sp_server_opts o;
    sp_server_opts_default(&o);
    o.model_dir = M15;
    o.start = a;
    o.end = b;
    o.measure = 0;
    o.workers_only = workers_only;
    if (g_ws_only)
        o.bulk_port = -1;
    sp_server *s = NULL;
    sp_err err = {0};
    ck_assert_msg(sp_server_start(&s, &o, &err) == SP_OK, "%s", err.msg);
    return s;
}

/* Generates WARM + STEPS + a few tokens after a prompt through two servers with the sampling options given (and
 * beams > 1: beam search); returns what the window counted (printed per thread). */
static long decode_window(const char *label, int workers_only, const sp_sample_opts *so, int beams, long *client,
                          long *server)
{
    struct stat sb;
    ck_assert_msg(stat(M15 "/model.safetensors", &sb) == 0, "%s: no converted stories15M; run scripts/fetch-model.sh",
                  M15);
    sp_server *s0 = start_server(0, 3, workers_only), *s1 = start_server(3, 6, workers_only);
    sp_runtime *rt = NULL;
    sp_err err = {0};
    ck_assert_int_eq(sp_runtime_new(&rt, NULL, NULL, &err), SP_OK);
    ck_assert_msg(sp_runtime_load(rt, M15, &err) == SP_OK, "%s", err.msg);
    ck_assert_ptr_nonnull(sp_runtime_tokenizer(rt)); /* the text path counts too */
    char addrs[128];
    snprintf(addrs, sizeof addrs, "127.0.0.1:%d,127.0.0.1:%d", sp_server_port(s0), sp_server_port(s1));
    ck_assert_msg(sp_runtime_connect(rt, addrs, &err) == SP_OK, "%s", err.msg);
    ck_assert_int_eq(sp_test_route_hops(rt), 2);

    int *prompt = NULL, np = 0;
    ck_assert_int_eq(sp_tokenizer_encode(sp_runtime_tokenizer(rt), "Once upon a time, there was a little", 1, &prompt, &np, &err), SP_OK);
    ck_assert_int_gt(np, 1);
    sp_lm_swarm sw;
    memset(&g_run, 0, sizeof g_run);
    g_run.inner = sp_lm_swarm_make(&sw, rt);
    sp_lm lm = g_run.inner;
    lm.forward = counting_forward;
    lm.forward_argmax = counting_forward_argmax;
    sp_gen_opts o;
    sp_gen_opts_default(&o);
    o.sample = *so;
    o.beams = beams;
    o.max_new = WARM + STEPS + 4;
    o.stop_at_eos = 0; /* every step counts */
    sp_gen_result r;
    const int32_t *ps[1] = {(const int32_t *)prompt};
    void *warm[4];
    backtrace(warm, 4); /* its first call loads libgcc: not inside the window */
    install_counters();
    window_open(); /* the counters see an allocation (this build's way of counting works) */
    void *volatile probe = malloc(64);
    free(probe);
    window_close();
    ck_assert_int_eq(atomic_load(&g_nthr), 1);
    ck_assert_int_eq(atomic_load(&g_thr[0].allocs), 1);
    ck_assert_int_eq(atomic_load(&g_thr[0].frees), 1);
    ck_assert_msg(sp_generate(&lm, sp_runtime_tokenizer(rt), ps, &np, 1, &o, on_token, NULL, &r, &err) == SP_OK, "%s", err.msg);
    window_close();
    ck_assert_int_eq(r.n[0], o.max_new);
    ck_assert_int_ge(g_run.tokens, o.max_new);
    ck_assert_int_eq(g_run.counted, STEPS); /* the window saw exactly STEPS decode steps */
    ck_assert(strlen(r.text[0]) > 0);
    long total = report(label, client, server);
    fprintf(stderr, "%s: %ld allocations and frees in %d decode steps (client %ld, server %ld); text: %.60s...\n",
            label, total, STEPS, *client, *server, r.text[0]);
    sp_gen_result_free(&r);
    free(prompt);
    sp_runtime_free(rt);
    sp_server_stop(s0);
    sp_server_stop(s1);
    return total;
}

/* decode_window, and none counted on either side. */
static void expect_none(const char *label, int workers_only, const sp_sample_opts *so, int beams)
{
    long client, server;
    long total = decode_window(label, workers_only, so, beams, &client, &server);
    ck_assert_msg(total == 0, "%s: %ld allocations or frees in %d decode steps (client %ld, server %ld): see above",
                  label, total, STEPS, client, server);
}

/* Greedy decoding; the servers answer the steps on their transport threads (a fast span's default). */
START_TEST(t_greedy_inline)
{
    sp_sample_opts so;
    sp_sample_opts_default(&so);
    so.temperature = 0;
    expect_none("greedy, inline steps", 0, &so, 1);
}
END_TEST

/* Sampling with top-p and a repetition penalty; every step goes through a server's worker thread (a slow
 * span's path: the moving average of step times over 1 ms). */
START_TEST(t_sampled_workers)
{
    sp_sample_opts so;
    sp_sample_opts_default(&so);
    so.temperature = 0.9f;
    so.top_p = 0.9f;
    so.repetition_penalty = 1.1f;
    so.seed = 42;
    expect_none("sampled, worker steps", 1, &so, 1);
}
END_TEST

/* Beam search with 4 beams: every step reorders the client's histories and the servers' caches (hypo_ids). */
START_TEST(t_beams)
{
    sp_sample_opts so;
    sp_sample_opts_default(&so);
    expect_none("4 beams", 0, &so, 4);
}
END_TEST

START_TEST(t_websocket_only)
{
    sp_sample_opts so;
    sp_sample_opts_default(&so);
    g_ws_only = 1;
    expect_none("websocket only", 0, &so, 1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("noalloc");
    TCase *tc = tcase_create("noalloc");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, t_greedy_inline);
    tcase_add_test(tc, t_sampled_workers);
    tcase_add_test(tc, t_beams);
    tcase_add_test(tc, t_websocket_only);
    suite_add_tcase(s, tc);
    return sp_test_run(s);
}
