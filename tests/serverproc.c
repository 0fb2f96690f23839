/* serverproc.c - sepal-server processes for the tests and the benches (serverproc.h). */
#include "serverproc.h"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

const char *sp_serverproc_bin(void)
{
    static char bin[PATH_MAX];
    const char *env = getenv("SEPAL_SERVER_BIN");
    if (env) {
        snprintf(bin, sizeof bin, "%s", env);
        return bin;
    }
    ssize_t n = readlink("/proc/self/exe", bin, sizeof bin - 32);
    bin[n > 0 ? n : 0] = '\0';
    for (int k = 0; k < 2; k++) { /* .../build/bench/bench_x -> .../build */
        char *slash = strrchr(bin, '/');
        if (slash)
            *slash = '\0';
    }
    strncat(bin, "/server/sepal-server", sizeof bin - strlen(bin) - 1);
    return bin;
}

/* Reads one line from fd (60 s at most). */
static void read_line(int fd, char *line, size_t cap)
{
    size_t len = 0;
    while (len < cap - 1) {
        struct pollfd q = {.fd = fd, .events = POLLIN};
        if (poll(&q, 1, 60000) <= 0 || read(fd, line + len, 1) != 1)
            break;
        if (line[len++] == '\n')
            break;
    }
    line[len] = '\0';
}

pid_t sp_serverproc_start(const char *bin, const char *const *argv, int fd_limit, const char *log, char *line,
                            size_t cap)
{
    if (!bin)
        bin = sp_serverproc_bin();
    line[0] = '\0';
    int pfd[2];
    if (pipe(pfd))
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(pfd[1], 1);
        close(pfd[0]);
        close(pfd[1]);
        int fd = log ? open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644) : open("/dev/null", O_WRONLY);
        if (fd >= 0)
            dup2(fd, 2);
        struct rlimit rl;
        if (fd_limit > 0 && getrlimit(RLIMIT_NOFILE, &rl) == 0) {
            rl.rlim_cur = (rlim_t)fd_limit;
            setrlimit(RLIMIT_NOFILE, &rl);
        }
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    close(pfd[1]);
    if (pid > 0)
        read_line(pfd[0], line, cap);
    close(pfd[0]);
    return pid;
}

int sp_serverproc_port(const char *line, const char *tag)
{
    const char *t = strstr(line, tag), *c = t ? strchr(t + strlen(tag), ':') : NULL;
    return c ? atoi(c + 1) : -1;
}

double sp_serverproc_cpu_s(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    unsigned long ut = 0, st = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}
