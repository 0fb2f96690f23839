/* hex.h - bytes as hex digits and back (swarm keys, AUTH nonces and proofs). No dependencies. */
#ifndef SEPAL_HEX_H
#define SEPAL_HEX_H

#include <stddef.h>
#include <stdint.h>

/* Lower-case hex of n bytes into out (2n + 1 bytes). */
void sp_hex_encode(const uint8_t *p, size_t n, char *out);
/* Exactly 2n hex digits (either case) followed by NUL into n bytes; -1 otherwise. */
int sp_hex_decode(const char *s, uint8_t *out, size_t n);

#endif
