/* attack.h - hostile peers against a real sepal-server, for test_attack and bench_attack: raw sockets bound to
 * a source address of their own (127.0.0.2 on loopback, as another host would be), real websocket framing, real
 * protocol messages. Each attack runs on a thread of its own until stopped.
 *
 *   HUGE       conns connections, each after HELLO sends the start of one message declaring msg_bytes (more
 *              than a connection may hold) and waits
 *   BUDGET     the same with messages a connection may hold: together they want more than the budget
 *   FLOOD      one connection sends INFO requests as fast as the server takes them (up to max_requests) and
 *              never reads
 *   SLOWLORIS  conns sockets each send part of an HTTP upgrade, then a byte every 500 ms
 *   IDLE       conns websocket connections complete HELLO and then do nothing
 *   BULK       conns TCP connections to the bulk port (port is the bulk port) each send 3 bytes of the 16-byte
 *              attach preamble and wait: a refusal (closed within 1 s of the connect) counts in refused, a close
 *              after that (the token's deadline) in closed
 *
 * With reconnect, a connection the server closes (or refuses) is opened again after 50 ms.
 *
 * And one of another kind, on the calling thread: sp_atk_dht_flood sends malformed DHT datagrams to a UDP port. */
#ifndef SEPAL_ATTACK_H
#define SEPAL_ATTACK_H

#include <stddef.h>
#include <stdint.h>

typedef enum { SP_ATK_HUGE, SP_ATK_BUDGET, SP_ATK_FLOOD, SP_ATK_SLOWLORIS, SP_ATK_IDLE, SP_ATK_BULK } sp_atk_kind;

typedef struct sp_atk_opts {
    sp_atk_kind kind;
    const char *src;     /* source address to bind ("127.0.0.2") */
    int port;            /* the server's websocket port (BULK: its bulk port) */
    int conns;
    uint64_t msg_bytes;  /* HUGE, BUDGET: the size each message declares */
    uint64_t send_bytes; /* HUGE, BUDGET: how much of it is sent before waiting */
    int reconnect;
    long max_requests;   /* FLOOD: stop sending after this many (0: never) */
} sp_atk_opts;

typedef struct sp_atk_stats {
    long connects;  /* TCP connections made */
    long refused;   /* answered 503, or closed before the websocket upgrade finished */
    long upgraded;  /* websockets that got their HELLO reply */
    long closed;    /* closed by the server after that */
    long open;      /* connections open now */
    long sent;      /* FLOOD: requests sent whole */
    long replies;   /* FLOOD: replies read by sp_atk_drain */
    long bad;       /* FLOOD: replies that were not the INFO replies expected */
} sp_atk_stats;

typedef struct sp_atk sp_atk;

/* 0, or -1 (the message says why on stderr). */
int sp_atk_start(sp_atk **out, const sp_atk_opts *o);
void sp_atk_stats_get(sp_atk *a, sp_atk_stats *s);
/* FLOOD: stops sending more, finishes the request half sent, and reads replies until every request sent has
 * one or timeout_s passes without a reply (writing and reading together: the server reads only as its output
 * drains; "sent" counts what the kernel took, and loopback's autotuned buffers can hold a million requests). */
void sp_atk_drain(sp_atk *a, double timeout_s);
/* Stops the thread and closes every socket. */
void sp_atk_stop(sp_atk *a);

/* rate datagrams a second for `seconds` to 127.0.0.1:port, in turn the datagram that crashes OpenDHT 2.4.12
 * (reliability-anchors.md §4.4: {"e": [], "t": 4 bytes, "y": "e"}) and {"a": 5, "q": "ping", "t": 7, "y": "q"}
 * (OpenDHT walks the integer as a map). Returns how many were sent. */
long sp_atk_dht_flood(int port, int rate, double seconds);
/* Lines of the file at path (a server's log) that hold text: what an attack made the server say. */
int sp_atk_count_lines(const char *path, const char *text);

/* The helpers the attacks use, for tests that speak raw websocket themselves: a TCP connection from src to
 * 127.0.0.1:port (blocking, 2 s timeouts; -1 on failure), the upgrade (0 on "101", 1 refused, -1 failed), one
 * masked binary frame (0 / -1), and the next complete binary message (its payload in *out, malloc'd; 0, or -1
 * when the connection closed or 2 s passed). */
int sp_atk_connect(const char *src, int port);
int sp_atk_upgrade(int fd);
int sp_atk_send_msg(int fd, const uint8_t *p, size_t n);
int sp_atk_recv_msg(int fd, uint8_t **out, size_t *n);
/* A client frame header for len payload bytes (masked with mask): its size (at most 14). */
size_t sp_atk_frame_header(uint8_t *h, int opcode, int fin, uint64_t len, const uint8_t mask[4]);
/* n payload bytes p of a frame, masked as at payload offset `at` (blocking; 0 / -1). */
int sp_atk_send_masked(int fd, const uint8_t *p, size_t n, uint64_t at, const uint8_t mask[4]);

#endif
