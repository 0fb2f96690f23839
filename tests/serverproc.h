/* serverproc.h - a sepal-server process for the tests and the benches: started with its stdout on a pipe and its
 * stderr in a log (or /dev/null), dying with the thread that started it (PR_SET_PDEATHSIG), and its serving line
 * read ("sepal-server: serving blocks ... at ws://HOST:PORT (bulk port B, DHT HOST:D) ..."). */
#ifndef SEPAL_SERVERPROC_H
#define SEPAL_SERVERPROC_H

#include <stddef.h>
#include <sys/types.h>

/* Starts bin (NULL: sp_serverproc_bin()) with argv (argv[0] included, NULL-terminated), its stderr into the file
 * log (NULL: /dev/null); fd_limit > 0: its open-file limit. Its first stdout line, within 60 s, goes to line (""
 * if none). The pid, or -1. */
pid_t sp_serverproc_start(const char *bin, const char *const *argv, int fd_limit, const char *log, char *line,
                            size_t cap);
/* SEPAL_SERVER_BIN, else build/server/sepal-server beside this build/bench/ program (a static buffer). */
const char *sp_serverproc_bin(void);
/* The port after tag in a serving line ("ws://" -> the websocket port, "DHT " -> the DHT node's): the number
 * after the first ':' that follows tag, or -1. */
int sp_serverproc_port(const char *line, const char *tag);

/* CPU seconds process pid has used (user + system, from /proc/PID/stat), or -1. */
double sp_serverproc_cpu_s(pid_t pid);

#endif
