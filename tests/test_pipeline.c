/* test_pipeline.c - per-stage schedules and their turnstiles (client/train/pipeline.h): the orders AFAB and 1F1B
 * give each stage (written out by hand for small cases), properties for every S x M x bound (each item once,
 * forward before backward, at most K microbatches in flight on a stage, no deadlock when run with the data
 * dependencies of a pipeline), and real threads going through the turnstiles: every stage works in its
 * order, stages overlap, finish skips, abort wakes every waiter. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pipeline.h"
#include "testutil.h"

#define F(m) ((m) << 1)
#define B(m) (((m) << 1) | 1)

static void expect_order(sp_pipe *p, int s, const int *want, int n)
{
    int got[128];
    ck_assert_int_eq(sp_pipe_order(p, s, got), n);
    for (int i = 0; i < n; i++)
        ck_assert_msg(got[i] == want[i], "stage %d item %d: %s%d, want %s%d", s, i, got[i] & 1 ? "B" : "F", got[i] >> 1,
                      want[i] & 1 ? "B" : "F", want[i] >> 1);
}

START_TEST(t_orders_by_hand)
{
    sp_pipe *p = sp_pipe_new(3, 4, SP_PIPE_1F1B, 0);
    ck_assert_ptr_nonnull(p);
    const int s0[] = {F(0), F(1), F(2), B(0), F(3), B(1), B(2), B(3)};
    const int s1[] = {F(0), F(1), B(0), F(2), B(1), F(3), B(2), B(3)};
    const int s2[] = {F(0), B(0), F(1), B(1), F(2), B(2), F(3), B(3)};
    expect_order(p, 0, s0, 8);
    expect_order(p, 1, s1, 8);
    expect_order(p, 2, s2, 8);
    sp_pipe_free(p);

    p = sp_pipe_new(2, 3, SP_PIPE_AFAB, 0);
    const int a[] = {F(0), F(1), F(2), B(0), B(1), B(2)};
    expect_order(p, 0, a, 6);
    expect_order(p, 1, a, 6);
    sp_pipe_free(p);

    p = sp_pipe_new(2, 5, SP_PIPE_AFAB, 2); /* groups of 2 */
    const int ak[] = {F(0), F(1), B(0), B(1), F(2), F(3), B(2), B(3), F(4), B(4)};
    expect_order(p, 1, ak, 10);
    sp_pipe_free(p);

    p = sp_pipe_new(4, 4, SP_PIPE_1F1B, 2); /* stage 0 would warm up 3, the bound allows 1 */
    const int k0[] = {F(0), F(1), B(0), F(2), B(1), F(3), B(2), B(3)};
    expect_order(p, 0, k0, 8);
    sp_pipe_free(p);

    ck_assert_ptr_null(sp_pipe_new(0, 4, SP_PIPE_1F1B, 0));
    ck_assert_ptr_null(sp_pipe_new(2, 0, SP_PIPE_1F1B, 0));
}
END_TEST

/* Runs the orders with a pipeline's dependencies, one item per stage per tick: F(m) on s needs F(m) on
 * s - 1; B(m) on s needs B(m) on s + 1 (on the last stage, its F(m)). Returns the ticks, -1 on deadlock. */
static int simulate(sp_pipe *p, int S, int M)
{
    int order[8][128], pos[8] = {0};
    unsigned char fdone[8][64] = {{0}}, bdone[8][64] = {{0}};
    for (int s = 0; s < S; s++)
        sp_pipe_order(p, s, order[s]);
    for (int tick = 0; tick < 10 * S * M + 10; tick++) {
        int all = 1, moved = 0;
        unsigned char fnow[8][64], bnow[8][64];
        memcpy(fnow, fdone, sizeof fnow);
        memcpy(bnow, bdone, sizeof bnow);
        for (int s = 0; s < S; s++) {
            if (pos[s] == 2 * M)
                continue;
            all = 0;
            int it = order[s][pos[s]], m = it >> 1;
            int ready = it & 1 ? (s == S - 1 ? fdone[s][m] : bdone[s + 1][m]) : (s == 0 || fdone[s - 1][m]);
            if (ready) {
                if (it & 1)
                    bnow[s][m] = 1;
                else
                    fnow[s][m] = 1;
                pos[s]++;
                moved = 1;
            }
        }
        if (all)
            return tick;
        if (!moved)
            return -1;
        memcpy(fdone, fnow, sizeof fnow);
        memcpy(bdone, bnow, sizeof bnow);
    }
    return -1;
}

START_TEST(t_order_properties)
{
    for (int kind = 0; kind < 2; kind++)
        for (int S = 1; S <= 6; S++)
            for (int M = 1; M <= 9; M++)
                for (int K = 0; K <= 4; K++) {
                    sp_pipe *p = sp_pipe_new(S, M, kind ? SP_PIPE_1F1B : SP_PIPE_AFAB, K);
                    ck_assert_ptr_nonnull(p);
                    for (int s = 0; s < S; s++) {
                        int o[128], seen[128] = {0}, inflight = 0, peak = 0;
                        ck_assert_int_eq(sp_pipe_order(p, s, o), 2 * M);
                        for (int i = 0; i < 2 * M; i++) {
                            ck_assert(o[i] >= 0 && o[i] < 2 * M);
                            ck_assert_msg(!seen[o[i]]++, "item twice");
                            if (o[i] & 1)
                                ck_assert_msg(seen[o[i] - 1], "B(%d) before F(%d)", o[i] >> 1, o[i] >> 1);
                            inflight += o[i] & 1 ? -1 : 1;
                            peak = inflight > peak ? inflight : peak;
                        }
                        if (K > 0)
                            ck_assert_msg(peak <= K, "kind %d S %d M %d K %d stage %d: %d in flight", kind, S, M, K, s,
                                          peak);
                        if (kind == 1) /* 1F1B: no stage holds more than S - s */
                            ck_assert_int_le(peak, S - s);
                    }
                    int ticks = simulate(p, S, M);
                    ck_assert_msg(ticks > 0, "kind %d S %d M %d K %d deadlocks", kind, S, M, K);
                    if (kind == 1 && K == 0) /* a full pipeline: 2(M + S - 1) ticks, not 2MS */
                        ck_assert_int_le(ticks, 2 * (M + S - 1));
                    sp_pipe_free(p);
                }
}
END_TEST

/* Threads: microbatch m runs F through stages 0..S-1, then B through S-1..0, sleeping a little in each. */
typedef struct mbt {
    sp_pipe *p;
    int S, mb, nsub, skip_backward, fail_at_stage;
    sp_status st;
} mbt;

static void *sub_run(void *arg);

typedef struct subt {
    mbt *m;
    int s, bwd;
} subt;

static void *sub_run(void *arg)
{
    subt *x = arg;
    sp_err err = {0};
    if (sp_pipe_enter(x->m->p, x->s, x->bwd, x->m->mb, &err) == SP_OK) {
        usleep(1000 + (unsigned)(x->m->mb * 37 % 5) * 300);
        sp_pipe_leave(x->m->p, x->s, x->bwd, x->m->mb, x->m->nsub);
    }
    return NULL;
}

static void *mb_run(void *arg)
{
    mbt *m = arg;
    sp_err err = {0};
    m->st = SP_OK;
    for (int d = 0; d < 2 && !m->st; d++) {
        if (d == 1 && m->skip_backward)
            break;
        for (int k = 0; k < m->S && !m->st; k++) {
            int s = d ? m->S - 1 - k : k;
            if (s == m->fail_at_stage && !d) {
                sp_pipe_abort(m->p);
                m->st = SP_ERR_IO;
                break;
            }
            if (m->nsub == 1) {
                m->st = sp_pipe_enter(m->p, s, d, m->mb, &err);
                if (!m->st) {
                    usleep(1000 + (unsigned)(m->mb * 37 % 5) * 300);
                    sp_pipe_leave(m->p, s, d, m->mb, 1);
                }
            } else { /* sub-batches enter together */
                pthread_t th[4];
                subt x[4];
                for (int i = 0; i < m->nsub; i++) {
                    x[i] = (subt){.m = m, .s = s, .bwd = d};
                    pthread_create(&th[i], NULL, sub_run, &x[i]);
                }
                for (int i = 0; i < m->nsub; i++)
                    pthread_join(th[i], NULL);
            }
        }
    }
    sp_pipe_finish(m->p, m->mb);
    return NULL;
}

static void run_threads(sp_pipe *p, int S, int M, int nsub, int skip_backward, int fail_mb, mbt *ms)
{
    pthread_t th[64];
    for (int m = M - 1; m >= 0; m--) { /* started in reverse: the turnstiles must order them */
        ms[m] = (mbt){.p = p, .S = S, .mb = m, .nsub = nsub, .skip_backward = skip_backward,
                      .fail_at_stage = m == fail_mb ? 1 : -1};
        ck_assert_int_eq(pthread_create(&th[m], NULL, mb_run, &ms[m]), 0);
    }
    for (int m = 0; m < M; m++)
        pthread_join(th[m], NULL);
}

START_TEST(t_threads_follow_the_orders)
{
    for (int kind = 0; kind < 2; kind++)
        for (int nsub = 1; nsub <= 3; nsub += 2) {
            int S = 3, M = 5;
            sp_pipe *p = sp_pipe_new(S, M, kind ? SP_PIPE_1F1B : SP_PIPE_AFAB, 0);
            mbt ms[5];
            run_threads(p, S, M, nsub, 0, -1, ms);
            for (int s = 0; s < S; s++) {
                int o[16];
                sp_pipe_item tr[16];
                sp_pipe_order(p, s, o);
                ck_assert_int_eq(sp_pipe_trace(p, s, tr, 16), 2 * M);
                for (int i = 0; i < 2 * M; i++) {
                    ck_assert_int_eq(tr[i].backward, o[i] & 1);
                    ck_assert_int_eq(tr[i].mb, o[i] >> 1);
                    ck_assert(tr[i].t_leave >= tr[i].t_enter);
                    if (i)
                        ck_assert_msg(tr[i].t_enter >= tr[i - 1].t_leave, "stage %d ran two items at once", s);
                }
            }
            /* F(1) on stage 0 runs while F(0) runs on stage 1 or soon after: stages overlap */
            ck_assert_int_ge(sp_pipe_peak_busy(p), 2);
            sp_pipe_free(p);
        }
}
END_TEST

START_TEST(t_finish_skips_backwards)
{
    /* head-only training: no backward reaches the servers; finish must let the forwards go on */
    sp_pipe *p = sp_pipe_new(3, 4, SP_PIPE_1F1B, 0);
    mbt ms[4];
    run_threads(p, 3, 4, 1, 1, -1, ms);
    for (int s = 0; s < 3; s++) {
        sp_pipe_item tr[8];
        int n = sp_pipe_trace(p, s, tr, 8);
        ck_assert_int_eq(n, 4); /* the four forwards, in order */
        for (int i = 0; i < n; i++)
            ck_assert(!tr[i].backward && tr[i].mb == i);
    }
    for (int m = 0; m < 4; m++)
        ck_assert_int_eq(ms[m].st, SP_OK);
    sp_pipe_free(p);
}
END_TEST

START_TEST(t_abort_wakes_everyone)
{
    sp_pipe *p = sp_pipe_new(3, 6, SP_PIPE_AFAB, 0);
    mbt ms[6];
    run_threads(p, 3, 6, 1, 0, 2, ms); /* microbatch 2 fails before stage 1: the others must not hang */
    ck_assert_int_eq(ms[2].st, SP_ERR_IO);
    int aborted = 0;
    for (int m = 0; m < 6; m++)
        aborted += ms[m].st == SP_ERR_STATE;
    ck_assert_int_ge(aborted, 1);
    sp_err err = {0};
    ck_assert_int_eq(sp_pipe_enter(p, 0, 0, 0, &err), SP_ERR_STATE);
    ck_assert(strstr(err.msg, "aborted"));
    sp_pipe_free(p);
}
END_TEST

START_TEST(t_bad_items)
{
    sp_pipe *p = sp_pipe_new(2, 2, SP_PIPE_1F1B, 0);
    sp_err err = {0};
    ck_assert_int_eq(sp_pipe_enter(p, 2, 0, 0, &err), SP_ERR_ARG);
    ck_assert_int_eq(sp_pipe_enter(p, 0, 0, 7, &err), SP_ERR_ARG);
    ck_assert_int_eq(sp_pipe_enter(p, 0, 0, 0, &err), SP_OK);
    sp_pipe_leave(p, 0, 0, 0, 1);
    ck_assert_int_eq(sp_pipe_enter(p, 0, 0, 0, &err), SP_ERR_ARG); /* done already */
    ck_assert(strstr(err.msg, "already done"));
    sp_pipe_free(p);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("pipeline");
    TCase *tc = tcase_create("pipeline");
    tcase_add_test(tc, t_orders_by_hand);
    tcase_add_test(tc, t_order_properties);
    tcase_add_test(tc, t_threads_follow_the_orders);
    tcase_add_test(tc, t_finish_skips_backwards);
    tcase_add_test(tc, t_abort_wakes_everyone);
    tcase_add_test(tc, t_bad_items);
    suite_add_tcase(s, tc);
    return sp_test_run(s);
}
