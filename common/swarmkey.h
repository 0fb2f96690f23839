/* swarmkey.h - a private swarm's key, and the HMAC-SHA256 it signs with (OpenSSL libcrypto).
 *
 * A swarm key is 32 random bytes in a file of one line, "sepal-swarm-key/1 <64 hex digits>", readable by its
 * owner only (mode 0600; a file others can read is refused, as ssh refuses such private keys). Every key
 * holder is trusted: the key proves membership, not identity. Three subkeys are derived from it, each
 * HMAC-SHA256(key, label), so that a key made for one purpose never serves another:
 *
 *   auth    "sepal/v1/auth"    the challenge-response on a connection (ws/auth.c, share/doc/protocol.md)
 *   seal    "sepal/v2/seal"    the AES-256-GCM key that seals DHT records (dht/record.h)
 *   id      "sepal/v1/id"      the swarm id: its first 8 bytes, public, say which swarm a peer is in
 *
 * Compare tags with sp_ct_equal (constant time), never memcmp. */
#ifndef SEPAL_SWARMKEY_H
#define SEPAL_SWARMKEY_H

#include <stddef.h>
#include <stdint.h>

#include "hex.h" /* sp_hex_encode, sp_hex_decode */
#include "status.h"

#define SP_SWARM_KEY_BYTES 32
#define SP_HMAC_BYTES 32
#define SP_SWARM_ID_BYTES 8
#define SP_AEAD_NONCE_BYTES 12
#define SP_AEAD_TAG_BYTES 16

typedef struct sp_swarm_key {
    uint8_t auth[SP_HMAC_BYTES];
    uint8_t seal[SP_HMAC_BYTES];
    uint8_t id[SP_SWARM_ID_BYTES];
    char id_hex[2 * SP_SWARM_ID_BYTES + 1];
} sp_swarm_key;

/* Writes a new key to path (created with mode 0600; an existing file is never overwritten). */
sp_status sp_swarm_key_generate(const char *path, sp_err *err);
/* Reads a key file (format and mode checked; the message names the file and what is wrong). */
sp_status sp_swarm_key_load(sp_swarm_key *k, const char *path, sp_err *err);
/* Derives the subkeys of a raw 32-byte key. */
void sp_swarm_key_derive(sp_swarm_key *k, const uint8_t raw[SP_SWARM_KEY_BYTES]);

/* HMAC-SHA256 of the concatenation of n parts; -1 if libcrypto fails. */
int sp_hmac_sha256(const uint8_t key[SP_HMAC_BYTES], const void *const *parts, const size_t *lens, int n,
                   uint8_t out[SP_HMAC_BYTES]);
/* AES-256-GCM (OpenSSL): seals n bytes of in, and aad (authenticated, not encrypted), into out: n bytes of
 * ciphertext, then the 16-byte tag. A nonce must never be used twice with one key (take sp_random_bytes).
 * -1 if libcrypto fails. */
int sp_aead_seal(const uint8_t key[SP_HMAC_BYTES], const uint8_t nonce[SP_AEAD_NONCE_BYTES], const void *aad,
                 size_t aad_len, const void *in, size_t n, uint8_t *out);
/* Opens what sp_aead_seal made (n bytes, the tag included) into out (n - 16 bytes): 0, or -1 when the tag does
 * not verify (another key, altered bytes or aad) or libcrypto fails. */
int sp_aead_open(const uint8_t key[SP_HMAC_BYTES], const uint8_t nonce[SP_AEAD_NONCE_BYTES], const void *aad,
                 size_t aad_len, const void *in, size_t n, uint8_t *out);
/* 1 if a and b hold the same n bytes, in time that does not depend on where they differ. */
int sp_ct_equal(const void *a, const void *b, size_t n);
/* Cryptographically random bytes (RAND_bytes); -1 on failure. */
int sp_random_bytes(void *p, size_t n);

#endif
