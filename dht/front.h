/* front.h - the UDP front of sepal-dht: every datagram is checked here before the OpenDHT node sees it.
 *
 * Debian's OpenDHT 2.4.12 reads some fields of a message without checking them, so one datagram can crash the
 * node (reliability-anchors.md §4.4): an error array `"e":[]` read at index 0; an "a"/"r"/"u" that is not a map,
 * or an error with none of them, walked as a map through msgpack's union; a field selection `"f":[]` divided by;
 * node lists whose length is not a multiple of a node's, thrown on after a fragmented message completed (the
 * partial entry is then left empty, and the next fragment of that transaction dereferences it). The front passes
 * only the messages OpenDHT itself sends, checked structurally:
 *
 *   - one msgpack map of at most 16 entries, keys strings, no trailing bytes, nesting at most 12 deep, every
 *     length inside the datagram (a container's count is bounded by the bytes left, so nothing is sized by
 *     the sender), no ext types, no reserved byte;
 *   - the envelope's fields of the types OpenDHT reads them as ("y" "q" "v" strings, "t" a 32-bit id or 4
 *     bytes, "n" this swarm's network id, "s" a bool, "e" an array of at least one error code, "p" a map of
 *     fragments {"o": offset, "d": bytes});
 *   - a kind OpenDHT knows (error, reply, value data, value update, or one of its seven queries), and for every
 *     kind but value data exactly one of "a", "r", "u", a map, whose fields have their types: ids 20 bytes, node
 *     lists whole nodes (26 and 38 bytes), "values" sizes or value maps, a field selection not empty;
 *   - no "values" in a value update (its handler throws for an unknown socket, which would leave the entry
 *     of a fragmented message empty).
 *
 * Fragmented values (a value over 600 bytes travels as sizes in the message and "p" fragments after it) are
 * followed per transaction id, as OpenDHT keys them: a fragment passes only while the message it belongs to is
 * open, comes from the message's sender and extends what arrived (offset = bytes so far), and once the message
 * is complete nothing more of that transaction passes, no new message either, for FRAG_LIFE_S seconds from its
 * start (longer than OpenDHT keeps an entry: 10 s, plus its receive queue's 0.65 s). So OpenDHT never receives
 * a fragment for an entry it has completed. The price: a sender's retry of a fragmented message that arrived
 * whole (OpenDHT retries a request under the same id when its reply is late) is dropped too; the first copy was
 * handled. The table is bounded; when it is full, new fragmented messages are dropped (their senders retry),
 * never old entries forgotten.
 *
 * Plain C without allocation in the stateless check, so it can be tested and fuzzed from C; sepal-dht
 * (node.cpp) runs it on its receive thread, and a crash here costs what a crash of the node costs: a restart
 * of the child, never the server. */
#ifndef SEPAL_DHT_FRONT_H
#define SEPAL_DHT_FRONT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SP_FRONT_MAX_PARTS 64   /* values given by size in one message, fragments in one datagram */

typedef enum {
    SP_DGRAM_QUERY = 1,
    SP_DGRAM_REPLY,
    SP_DGRAM_ERROR,
    SP_DGRAM_VALUE_DATA,   /* "p": fragments of values announced by size */
    SP_DGRAM_VALUE_UPDATE, /* "u" */
} sp_dgram_kind;

typedef struct sp_dgram_part {
    uint32_t index;  /* the value's position in the message's "values" */
    uint32_t a;      /* in a message: the value's total size; in a fragment: its offset */
    uint32_t len;    /* in a fragment: its bytes */
} sp_dgram_part;

/* What the check learned of a datagram it accepted. */
typedef struct sp_dgram {
    sp_dgram_kind kind;
    uint32_t tid;
    int nparts;      /* a message: its values given by size (OpenDHT then waits for fragments); value data: fragments */
    sp_dgram_part parts[SP_FRONT_MAX_PARTS];
} sp_dgram;

/* Checks one datagram against the rules above for network id `network`: 0, or -1 with *why (a static string)
 * saying which rule it broke. out may be NULL. */
int sp_dgram_check(const uint8_t *p, size_t n, uint32_t network, sp_dgram *out, const char **why);

/* The stateful front: the check plus fragment tracking. */
typedef struct sp_front sp_front;

sp_front *sp_front_new(uint32_t network);
void sp_front_free(sp_front *f);
/* 1: give the datagram to the node; 0: drop it (*why says why). from: the sender (IPv4 address and port, any
 * byte order, only compared); now: seconds on a monotonic clock. */
int sp_front_accept(sp_front *f, const uint8_t *p, size_t n, uint32_t from_addr, uint16_t from_port, double now,
                    const char **why);

#ifdef __cplusplus
}
#endif

#endif
