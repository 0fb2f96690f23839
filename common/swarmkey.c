/* swarmkey.c - see swarmkey.h. */
#include "swarmkey.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAGIC "sepal-swarm-key/1"

static EVP_MAC *g_hmac;
static pthread_once_t g_hmac_once = PTHREAD_ONCE_INIT;
static void hmac_fetch(void) { g_hmac = EVP_MAC_fetch(NULL, "HMAC", NULL); }

int sp_hmac_sha256(const uint8_t key[SP_HMAC_BYTES], const void *const *parts, const size_t *lens, int n,
                   uint8_t out[SP_HMAC_BYTES])
{
    pthread_once(&g_hmac_once, hmac_fetch);
    EVP_MAC_CTX *ctx = g_hmac ? EVP_MAC_CTX_new(g_hmac) : NULL;
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", (char *)"SHA256", 0), OSSL_PARAM_construct_end()};
    size_t outlen = 0;
    int ok = ctx && EVP_MAC_init(ctx, key, SP_HMAC_BYTES, params) == 1;
    for (int i = 0; ok && i < n; i++)
        ok = EVP_MAC_update(ctx, parts[i], lens[i]) == 1;
    ok = ok && EVP_MAC_final(ctx, out, &outlen, SP_HMAC_BYTES) == 1 && outlen == SP_HMAC_BYTES;
    EVP_MAC_CTX_free(ctx);
    return ok ? 0 : -1;
}

/* One AES-256-GCM pass: enc 1 seals (writes the tag after the n bytes), 0 opens (checks the tag after them). */
static int gcm(int enc, const uint8_t *key, const uint8_t *nonce, const void *aad, size_t aad_len, const uint8_t *in,
               size_t n, uint8_t *out)
{
    if (n > 0x7fffffff || aad_len > 0x7fffffff)
        return -1;
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    int len = 0, ok = c && EVP_CipherInit_ex(c, EVP_aes_256_gcm(), NULL, NULL, NULL, enc) == 1 &&
                      EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_IVLEN, SP_AEAD_NONCE_BYTES, NULL) == 1 &&
                      EVP_CipherInit_ex(c, NULL, NULL, key, nonce, enc) == 1 &&
                      (aad_len == 0 || EVP_CipherUpdate(c, NULL, &len, aad, (int)aad_len) == 1) &&
                      (n == 0 || EVP_CipherUpdate(c, out, &len, in, (int)n) == 1);
    if (ok && !enc) /* the expected tag, before the final check */
        ok = EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, SP_AEAD_TAG_BYTES, (void *)(in + n)) == 1;
    ok = ok && EVP_CipherFinal_ex(c, out + n, &len) == 1;
    if (ok && enc)
        ok = EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, SP_AEAD_TAG_BYTES, out + n) == 1;
    EVP_CIPHER_CTX_free(c);
    return ok ? 0 : -1;
}

int sp_aead_seal(const uint8_t key[SP_HMAC_BYTES], const uint8_t nonce[SP_AEAD_NONCE_BYTES], const void *aad,
                 size_t aad_len, const void *in, size_t n, uint8_t *out)
{
    return gcm(1, key, nonce, aad, aad_len, in, n, out);
}

int sp_aead_open(const uint8_t key[SP_HMAC_BYTES], const uint8_t nonce[SP_AEAD_NONCE_BYTES], const void *aad,
                 size_t aad_len, const void *in, size_t n, uint8_t *out)
{
    if (n < SP_AEAD_TAG_BYTES)
        return -1;
    int r = gcm(0, key, nonce, aad, aad_len, in, n - SP_AEAD_TAG_BYTES, out);
    if (r)
        OPENSSL_cleanse(out, n - SP_AEAD_TAG_BYTES); /* nothing of a forgery is handed on */
    return r;
}

int sp_ct_equal(const void *a, const void *b, size_t n) { return CRYPTO_memcmp(a, b, n) == 0; }

int sp_random_bytes(void *p, size_t n) { return n <= 0x7fffffff && RAND_bytes(p, (int)n) == 1 ? 0 : -1; }

/* HMAC(raw, label) into out. */
static void subkey(const uint8_t raw[SP_SWARM_KEY_BYTES], const char *label, uint8_t out[SP_HMAC_BYTES])
{
    const void *parts[1] = {label};
    size_t lens[1] = {strlen(label)};
    if (sp_hmac_sha256(raw, parts, lens, 1, out))
        memset(out, 0, SP_HMAC_BYTES); /* libcrypto broken: every tag then fails to verify against a peer's */
}

void sp_swarm_key_derive(sp_swarm_key *k, const uint8_t raw[SP_SWARM_KEY_BYTES])
{
    uint8_t id[SP_HMAC_BYTES];
    subkey(raw, "sepal/v1/auth", k->auth);
    subkey(raw, "sepal/v2/seal", k->seal);
    subkey(raw, "sepal/v1/id", id);
    memcpy(k->id, id, SP_SWARM_ID_BYTES);
    sp_hex_encode(k->id, SP_SWARM_ID_BYTES, k->id_hex);
}

sp_status sp_swarm_key_generate(const char *path, sp_err *err)
{
    uint8_t raw[SP_SWARM_KEY_BYTES];
    char line[sizeof MAGIC + 2 * SP_SWARM_KEY_BYTES + 2];
    if (sp_random_bytes(raw, sizeof raw))
        return sp_errf(err, SP_ERR_IO, "swarm key: no random bytes from OpenSSL");
    char hex[2 * SP_SWARM_KEY_BYTES + 1];
    sp_hex_encode(raw, sizeof raw, hex);
    OPENSSL_cleanse(raw, sizeof raw);
    int n = snprintf(line, sizeof line, "%s %s\n", MAGIC, hex);
    OPENSSL_cleanse(hex, sizeof hex);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        OPENSSL_cleanse(line, sizeof line);
        return sp_errf(err, errno == EEXIST ? SP_ERR_STATE : SP_ERR_IO, "swarm key %s: %s%s", path, strerror(errno),
                       errno == EEXIST ? " (an existing key is never overwritten)" : "");
    }
    int bad = write(fd, line, (size_t)n) != n;
    OPENSSL_cleanse(line, sizeof line);
    bad |= close(fd) != 0;
    if (bad) {
        unlink(path);
        return sp_errf(err, SP_ERR_IO, "swarm key %s: cannot write it", path);
    }
    return SP_OK;
}

sp_status sp_swarm_key_load(sp_swarm_key *k, const char *path, sp_err *err)
{
    memset(k, 0, sizeof *k);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return sp_errf(err, errno == ENOENT ? SP_ERR_NOTFOUND : SP_ERR_IO, "swarm key %s: %s", path, strerror(errno));
    struct stat st;
    char buf[256];
    ssize_t n = fstat(fd, &st) == 0 ? read(fd, buf, sizeof buf - 1) : -1;
    close(fd);
    if (n < 0)
        return sp_errf(err, SP_ERR_IO, "swarm key %s: %s", path, strerror(errno));
    if (st.st_mode & 077)
        return sp_errf(err, SP_ERR_STATE, "swarm key %s: readable by others (mode %03o); chmod 600 %s", path,
                       (unsigned)(st.st_mode & 0777), path);
    buf[n] = '\0';
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
        buf[--n] = '\0';
    uint8_t raw[SP_SWARM_KEY_BYTES];
    size_t m = strlen(MAGIC);
    int ok = (size_t)n == m + 1 + 2 * SP_SWARM_KEY_BYTES && !strncmp(buf, MAGIC, m) && buf[m] == ' ' &&
             sp_hex_decode(buf + m + 1, raw, sizeof raw) == 0;
    OPENSSL_cleanse(buf, sizeof buf);
    if (!ok)
        return sp_errf(err, SP_ERR_FORMAT, "swarm key %s: not a key file (one line: \"%s\" and 64 hex digits; "
                       "sepal-server --gen-swarm-key FILE writes one)", path, MAGIC);
    sp_swarm_key_derive(k, raw);
    OPENSSL_cleanse(raw, sizeof raw);
    return SP_OK;
}
