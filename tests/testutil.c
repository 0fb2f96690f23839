#include "testutil.h"
#include "serverproc.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "remote.h"
#include "runtime.h"

const char *sp_test_tmpdir(void)
{
    static char dirs[8][256];
    static int next;
    char *d = dirs[next++ % 8];
    const char *base = getenv("TMPDIR");
    snprintf(d, 256, "%s/sepal-test-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(d))
        return NULL;
    return d;
}

cJSON *sp_test_read_json(const char *path)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    ck_assert_msg(n < sizeof buf - 1, "%s: larger than %zu bytes", path, sizeof buf - 1);
    buf[n] = '\0';
    cJSON *j = cJSON_Parse(buf);
    ck_assert_msg(j != NULL, "%s is not JSON", path);
    return j;
}

const char *sp_test_write_file(const char *name, const void *data, size_t n)
{
    static char paths[8][512];
    static int next;
    const char *dir = sp_test_tmpdir();
    if (!dir)
        return NULL;
    char *p = paths[next++ % 8];
    snprintf(p, 512, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f)
        return NULL;
    if (n && fwrite(data, 1, n, f) != n) {
        fclose(f);
        return NULL;
    }
    fclose(f);
    return p;
}

/* ---------------------------------------------------------------------------------------------- */
/* real server processes */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void print_log(const char *path)
{
    FILE *f = fopen(path, "r");
    char line[512];
    while (f && fgets(line, sizeof line, f))
        fprintf(stderr, "    %s", line);
    if (f)
        fclose(f);
}

int sp_test_server_start(sp_test_proc *p, const char *const *args)
{
    memset(p, 0, sizeof *p);
    p->dht_port = -1;
    const char *dir = sp_test_tmpdir();
    snprintf(p->log, sizeof p->log, "%s/server.log", dir ? dir : "/tmp");
    const char *argv[64] = {"sepal-server"};
    int n = 1;
    for (; args[n - 1] && n < 63; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    char line[1024];
    pid_t pid = sp_serverproc_start(SEPAL_BIN_DIR "/server/sepal-server", argv, 0, p->log, line, sizeof line);
    if (pid < 0)
        return -1;
    const char *bulk = strstr(line, "(bulk port ");
    p->pid = pid;
    if (sp_serverproc_port(line, "ws://") <= 0) {
        fprintf(stderr, "sepal-server did not start; its log:\n");
        print_log(p->log);
        sp_test_proc_signal(p, SIGKILL);
        return -1;
    }
    p->port = sp_serverproc_port(line, "ws://");
    p->dht_port = sp_serverproc_port(line, "DHT ");
    p->bulk_port = bulk ? atoi(bulk + strlen("(bulk port ")) : -1;
    return 0;
}

int sp_test_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t l = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &l);
    close(fd);
    return ntohs(a.sin_port);
}

int sp_test_linkem_start(sp_test_proc *p, const char *const *args)
{
    memset(p, 0, sizeof *p);
    p->dht_port = p->bulk_port = -1;
    const char *argv[64] = {"linkem"};
    int n = 1;
    for (; args[n - 1] && n < 63; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    char line[1024]; /* "linkem: 127.0.0.1:PORT -> HOST:PORT, delay ..." */
    pid_t pid = sp_serverproc_start(SEPAL_BIN_DIR "/bench/linkem", argv, 0, NULL, line, sizeof line);
    if (pid < 0)
        return -1;
    p->pid = pid;
    p->port = sp_serverproc_port(line, "linkem: ");
    if (p->port <= 0) {
        sp_test_proc_signal(p, SIGKILL);
        return -1;
    }
    return 0;
}

int sp_test_proc_signal(sp_test_proc *p, int sig)
{
    int status = 0;
    if (p->pid <= 0)
        return 0;
    kill(p->pid, sig);
    if (sig == SIGTERM || sig == SIGKILL) {
        waitpid(p->pid, &status, 0);
        p->pid = 0;
    }
    return status;
}

pid_t sp_test_child_named(pid_t parent, const char *comm)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    pid_t found = -1;
    while (d && found < 0 && (e = readdir(d))) {
        char path[300], buf[512];
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = '\0';
        char *open_paren = strchr(buf, '('), *close_paren = strrchr(buf, ')');
        int ppid = 0;
        char state = 0;
        if (open_paren && close_paren && sscanf(close_paren + 2, "%c %d", &state, &ppid) == 2 && ppid == parent &&
            state != 'Z' && (size_t)(close_paren - open_paren - 1) == strlen(comm) &&
            !strncmp(open_paren + 1, comm, strlen(comm)))
            found = (pid_t)atoi(e->d_name);
    }
    if (d)
        closedir(d);
    return found;
}

int sp_test_wait_for(int (*fn)(void *user), void *user, double timeout_s)
{
    double end = now_s() + timeout_s;
    int v;
    while (!(v = fn(user)) && now_s() < end) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return v;
}

/* ---------------------------------------------------------------------------------------------- */
/* the client runtime's server table */

int sp_test_count_online(sp_runtime *rt)
{
    sp_server_row *rows = NULL;
    int n = sp_runtime_servers(rt, &rows), online = 0;
    for (int i = 0; i < n; i++)
        online += !rows[i].gone && rows[i].rec.state == SP_SERVER_ONLINE;
    free(rows);
    return online;
}

int sp_test_server_row(sp_runtime *rt, int i, sp_server_row *out)
{
    sp_server_row *rows = NULL;
    int n = sp_runtime_servers(rt, &rows), found = i >= 0 && i < n;
    if (found)
        *out = rows[i];
    free(rows);
    return found;
}

int sp_test_server_at(sp_runtime *rt, int port, int from_dht, sp_server_row *out)
{
    sp_server_row *rows = NULL;
    int n = sp_runtime_servers(rt, &rows), found = -1;
    for (int i = 0; i < n; i++)
        if (rows[i].rec.port == port && (!from_dht || rows[i].from_dht))
            found = i;
    if (found >= 0 && out)
        *out = rows[found];
    free(rows);
    return found;
}

void sp_test_update_period(sp_runtime *rt, double s)
{
    sp_rt_settings set;
    sp_runtime_settings(rt, &set);
    set.update_period_s = s;
    sp_runtime_set_settings(rt, &set);
}

void sp_test_wire_f32(sp_runtime *rt)
{
    sp_rt_settings set;
    sp_runtime_settings(rt, &set);
    set.wire = SP_ENC_F32;
    sp_runtime_set_settings(rt, &set);
}

int sp_test_route_hops(sp_runtime *rt)
{
    sp_route r;
    sp_runtime_last_route(rt, &r);
    return r.nhops;
}

/* ---------------------------------------------------------------------------------------------- */
/* load on a server */

#define LOAD_MAX 16

typedef struct load_session {
    struct sp_test_load *l;
    sp_remote *r;
    uint64_t id;
    pthread_t th;
} load_session;

struct sp_test_load {
    int n, H, max_length;
    int stop, steps; /* atomics */
    load_session s[LOAD_MAX];
};

static void *load_main(void *p)
{
    load_session *x = p;
    sp_test_load *l = x->l;
    float *h = calloc((size_t)l->H, sizeof *h);
    ck_assert_ptr_nonnull(h);
    sp_tensor_src t = {.enc = SP_ENC_F32, .rank = 3, .shape = {1, 1, l->H}, .f32 = h};
    for (int pos = 0; !__atomic_load_n(&l->stop, __ATOMIC_SEQ_CST); pos = pos + 1 < l->max_length ? pos + 1 : 0) {
        char meta[128];
        sp_step_req q = {.session = x->id, .start_from_position = pos ? -1 : 0, .reply_encoding = -1};
        ck_assert_int_eq(sp_step_req_encode(&q, meta, sizeof meta, NULL), SP_OK);
        sp_reply rep;
        sp_err err = {0};
        ck_assert_msg(sp_remote_call(x->r, SP_MSG_INFERENCE_STEP, meta, &t, 1, &rep, 60000, &err) == SP_OK,
                      "a loading session's step: %s", err.msg);
        sp_reply_clear(&rep);
        __atomic_add_fetch(&l->steps, 1, __ATOMIC_SEQ_CST);
    }
    free(h);
    return NULL;
}

sp_test_load *sp_test_load_start(int port, int n, int start, int end, int H)
{
    sp_test_load *l = calloc(1, sizeof *l);
    ck_assert(l && n > 0 && n <= LOAD_MAX);
    *l = (sp_test_load){.n = n, .H = H, .max_length = 64};
    for (int i = 0; i < n; i++) {
        load_session *x = &l->s[i];
        sp_err err = {0};
        ck_assert_msg(sp_remote_connect(&x->r, "127.0.0.1", port, 1, 20000, &err) == SP_OK, "%s", err.msg);
        char meta[128];
        sp_open_req q = {.start = start, .end = end, .max_length = l->max_length, .batch = 1};
        ck_assert_int_eq(sp_open_req_encode(&q, meta, sizeof meta, NULL), SP_OK);
        sp_reply rep;
        sp_open_reply a = {0};
        ck_assert_msg(sp_remote_call(x->r, SP_MSG_INFERENCE_OPEN, meta, NULL, 0, &rep, 20000, &err) == SP_OK,
                      "a loading session's open: %s", err.msg);
        ck_assert_int_eq(sp_open_reply_decode(&rep.msg, &a, &err), SP_OK);
        sp_reply_clear(&rep);
        x->id = a.session;
        x->l = l;
    }
    for (int i = 0; i < n; i++)
        ck_assert_int_eq(pthread_create(&l->s[i].th, NULL, load_main, &l->s[i]), 0);
    return l;
}

int sp_test_load_steps(sp_test_load *l) { return __atomic_load_n(&l->steps, __ATOMIC_SEQ_CST); }

void sp_test_load_halt(sp_test_load *l) { __atomic_store_n(&l->stop, 1, __ATOMIC_SEQ_CST); }

void sp_test_load_stop(sp_test_load *l)
{
    if (!l)
        return;
    sp_test_load_halt(l);
    for (int i = 0; i < l->n; i++) {
        pthread_join(l->s[i].th, NULL);
        sp_remote_close(l->s[i].r);
    }
    free(l);
}
