/* record.c - server records and model index entries as JSON, and the checks a reader applies to them.
 * Everything in a record came from the network: each field is checked for type, length, characters and
 * range before it is copied, and a record that fails any check is refused whole with a reason. */
#include "record.h"

#include <cJSON.h>
#include <ctype.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SKEW_S 60.0 /* how far in the future a timestamp may be (clocks of other machines) */

static const char *const state_names[] = {"offline", "joining", "online"};

const char *sp_server_state_name(sp_server_state s)
{
    return (unsigned)s < 3 ? state_names[s] : "?";
}

static int prefix_char(int c) { return isalnum(c) || c == '.' || c == '_' || c == '-'; }

void sp_model_prefix(const char *dir, char *out, size_t cap)
{
    char *real = realpath(dir, NULL);
    const char *p = real ? real : dir;
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && p[b - 1] != '/')
        b--;
    size_t k = 0;
    for (size_t i = b; i < n && k + 1 < cap; i++)
        out[k++] = prefix_char((unsigned char)p[i]) ? p[i] : '_';
    if (k == 0 && cap > 1)
        out[k++] = '_';
    out[k] = '\0';
    free(real);
}

void sp_block_key(const char *model, int block, char *out, size_t cap) { snprintf(out, cap, "%s.%d", model, block); }

/* ---------------------------------------------------------------------------------------------- */
/* encode */

static void hex64(uint64_t v, char out[17]) { snprintf(out, 17, "%016" PRIx64, v); }

static sp_status finish(cJSON *o, char *buf, size_t cap, size_t *len, sp_err *err)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!s)
        return sp_errf(err, SP_ERR_NOMEM, "record: out of memory");
    size_t n = strlen(s);
    size_t lim = cap < SP_RECORD_MAX ? cap : SP_RECORD_MAX;
    if (n + 1 > lim) {
        free(s);
        return sp_errf(err, SP_ERR_RANGE, "record: %zu bytes encoded, at most %zu fit", n, lim - 1);
    }
    memcpy(buf, s, n + 1);
    free(s);
    if (len)
        *len = n;
    return SP_OK;
}

sp_status sp_record_encode(const sp_server_record *r, char *buf, size_t cap, size_t *len, sp_err *err)
{
    cJSON *o = cJSON_CreateObject();
    char hash[17];
    hex64(r->config_hash, hash);
    cJSON_AddNumberToObject(o, "v", SP_RECORD_VERSION);
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "name", r->name);
    cJSON_AddStringToObject(o, "host", r->host);
    cJSON_AddNumberToObject(o, "port", r->port);
    cJSON_AddStringToObject(o, "dht", r->dht);
    cJSON_AddStringToObject(o, "model", r->model);
    cJSON_AddStringToObject(o, "config", hash);
    cJSON_AddNumberToObject(o, "blocks", r->num_blocks);
    cJSON_AddNumberToObject(o, "start", r->start);
    cJSON_AddNumberToObject(o, "end", r->end);
    cJSON_AddStringToObject(o, "state", sp_server_state_name(r->state));
    cJSON_AddNumberToObject(o, "throughput", r->throughput);
    cJSON_AddNumberToObject(o, "inference_rps", r->inference_rps);
    cJSON_AddNumberToObject(o, "forward_rps", r->forward_rps);
    cJSON_AddNumberToObject(o, "network_rps", r->network_rps);
    cJSON_AddStringToObject(o, "dtype", r->dtype);
    cJSON_AddStringToObject(o, "quant", r->quant);
    if (r->device[0])
        cJSON_AddStringToObject(o, "device", r->device);
    cJSON_AddNumberToObject(o, "cache_tokens_left", (double)r->cache_tokens_left);
    cJSON_AddNumberToObject(o, "queue_wait", r->queue_wait);
    if (r->max_queue_wait > 0)
        cJSON_AddNumberToObject(o, "max_queue_wait", r->max_queue_wait);
    if (r->caps)
        cJSON_AddNumberToObject(o, "caps", r->caps);
    cJSON *pings = cJSON_AddObjectToObject(o, "next_pings");
    for (int i = 0; pings && i < r->npings && i < SP_RECORD_MAX_PINGS; i++)
        cJSON_AddNumberToObject(pings, r->pings[i].id, r->pings[i].rtt);
    cJSON_AddStringToObject(o, "version", r->version);
    cJSON_AddNumberToObject(o, "ts", r->timestamp);
    cJSON_AddNumberToObject(o, "period", r->period);
    return finish(o, buf, cap, len, err);
}

sp_status sp_model_record_encode(const sp_model_record *m, char *buf, size_t cap, size_t *len, sp_err *err)
{
    cJSON *o = cJSON_CreateObject();
    char hash[17];
    hex64(m->config_hash, hash);
    cJSON_AddNumberToObject(o, "v", SP_RECORD_VERSION);
    cJSON_AddStringToObject(o, "model", m->model);
    cJSON_AddStringToObject(o, "config", hash);
    cJSON_AddNumberToObject(o, "blocks", m->num_blocks);
    cJSON_AddNumberToObject(o, "hidden", m->hidden);
    cJSON_AddStringToObject(o, "architecture", m->architecture);
    cJSON_AddNumberToObject(o, "ts", m->timestamp);
    cJSON_AddNumberToObject(o, "period", m->period);
    return finish(o, buf, cap, len, err);
}

/* ---------------------------------------------------------------------------------------------- */
/* decode: every getter refuses the whole record with a reason */

enum { CH_ANY, CH_HOST, CH_PREFIX, CH_HEX };

static int chars_ok(const char *s, int kind)
{
    for (; *s; s++) {
        int c = (unsigned char)*s;
        if (c < 0x20 || c == 0x7f)
            return 0;
        if ((kind == CH_HOST && !(isalnum(c) || c == '.' || c == '-' || c == ':')) ||
            (kind == CH_PREFIX && !prefix_char(c)) || (kind == CH_HEX && !isxdigit(c)))
            return 0;
    }
    return 1;
}

static sp_status get_str(const cJSON *o, const char *name, char *out, size_t cap, int kind, int nonempty, sp_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!cJSON_IsString(v) || !v->valuestring)
        return sp_errf(err, SP_ERR_FORMAT, "'%s' is not a string", name);
    size_t n = strlen(v->valuestring);
    if (n >= cap || (nonempty && n == 0))
        return sp_errf(err, SP_ERR_FORMAT, "'%s' is %zu characters (1..%zu allowed)", name, n, cap - 1);
    if (!chars_ok(v->valuestring, kind))
        return sp_errf(err, SP_ERR_FORMAT, "'%s' holds characters not allowed there", name);
    memcpy(out, v->valuestring, n + 1);
    return SP_OK;
}

static sp_status get_num(const cJSON *o, const char *name, double lo, double hi, double *out, sp_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi)
        return sp_errf(err, SP_ERR_FORMAT, "'%s' is not a number in [%g, %g]", name, lo, hi);
    *out = v->valuedouble;
    return SP_OK;
}

static sp_status get_int(const cJSON *o, const char *name, long lo, long hi, long *out, sp_err *err)
{
    double d = 0;
    sp_status st = get_num(o, name, (double)lo, (double)hi, &d, err);
    if (!st && d != floor(d))
        st = sp_errf(err, SP_ERR_FORMAT, "'%s' is not an integer", name);
    if (!st)
        *out = (long)d;
    return st;
}

static sp_status get_hash(const cJSON *o, uint64_t *out, sp_err *err)
{
    char h[17];
    sp_status st = get_str(o, "config", h, sizeof h, CH_HEX, 1, err);
    if (!st && strlen(h) != 16)
        st = sp_errf(err, SP_ERR_FORMAT, "'config' is not 16 hex digits");
    if (!st)
        *out = strtoull(h, NULL, 16);
    return st;
}

static sp_status get_state(const cJSON *o, sp_server_state *out, sp_err *err)
{
    char s[16];
    sp_status st = get_str(o, "state", s, sizeof s, CH_PREFIX, 1, err);
    for (int i = 0; !st && i < 3; i++)
        if (!strcmp(s, state_names[i])) {
            *out = (sp_server_state)i;
            return SP_OK;
        }
    return st ? st : sp_errf(err, SP_ERR_FORMAT, "'state' is not offline, joining or online");
}

static sp_status get_pings(const cJSON *o, sp_server_record *r, sp_err *err)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "next_pings");
    if (!cJSON_IsObject(p))
        return sp_errf(err, SP_ERR_FORMAT, "'next_pings' is not an object");
    r->npings = 0;
    for (const cJSON *e = p->child; e; e = e->next) {
        if (r->npings >= SP_RECORD_MAX_PINGS)
            return sp_errf(err, SP_ERR_FORMAT, "'next_pings' has more than %d entries", SP_RECORD_MAX_PINGS);
        sp_next_ping *np = &r->pings[r->npings];
        if (!e->string || strlen(e->string) != 16 || !chars_ok(e->string, CH_HEX))
            return sp_errf(err, SP_ERR_FORMAT, "'next_pings' key is not a server id");
        if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble) || e->valuedouble < 0 || e->valuedouble > 60)
            return sp_errf(err, SP_ERR_FORMAT, "'next_pings' value is not a round trip in [0, 60] s");
        memcpy(np->id, e->string, 17);
        np->rtt = e->valuedouble;
        r->npings++;
    }
    return SP_OK;
}

static cJSON *parse_object(const void *data, size_t len, sp_err *err)
{
    if (len == 0 || len > SP_RECORD_MAX) {
        sp_errf(err, SP_ERR_FORMAT, "%zu bytes (1..%d allowed)", len, SP_RECORD_MAX);
        return NULL;
    }
    cJSON *o = cJSON_ParseWithLength(data, len);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        sp_errf(err, SP_ERR_FORMAT, "not a JSON object");
        return NULL;
    }
    long v = 0;
    sp_status st = get_int(o, "v", 1, 1000, &v, err);
    if (!st && v != SP_RECORD_VERSION)
        st = sp_errf(err, SP_ERR_FORMAT, "record version %ld (this reader knows %d)", v, SP_RECORD_VERSION);
    if (st) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static sp_status decode_fields(sp_server_record *r, const cJSON *o, sp_err *err)
{
    long port, blocks, start, end, cache, caps = 0;
    sp_status st;
    if ((st = get_str(o, "id", r->id, sizeof r->id, CH_HEX, 1, err)) || strlen(r->id) != 16)
        return st ? st : sp_errf(err, SP_ERR_FORMAT, "'id' is not 16 hex digits");
    if ((st = get_str(o, "name", r->name, sizeof r->name, CH_ANY, 0, err)) ||
        (st = get_str(o, "host", r->host, sizeof r->host, CH_HOST, 1, err)) ||
        (st = get_int(o, "port", 0, 65535, &port, err)) || /* 0: not listening yet (joining) */
        (st = get_str(o, "dht", r->dht, sizeof r->dht, CH_HOST, 0, err)) ||
        (st = get_str(o, "model", r->model, sizeof r->model, CH_PREFIX, 1, err)) ||
        (st = get_hash(o, &r->config_hash, err)) || (st = get_int(o, "blocks", 1, 1 << 20, &blocks, err)) ||
        (st = get_int(o, "start", 0, 1 << 20, &start, err)) || (st = get_int(o, "end", 1, 1 << 20, &end, err)) ||
        (st = get_state(o, &r->state, err)) ||
        (st = get_num(o, "throughput", 0, 1e12, &r->throughput, err)) ||
        (st = get_num(o, "inference_rps", 0, 1e12, &r->inference_rps, err)) ||
        (st = get_num(o, "forward_rps", 0, 1e12, &r->forward_rps, err)) ||
        (st = get_num(o, "network_rps", 0, 1e12, &r->network_rps, err)) ||
        (st = get_str(o, "dtype", r->dtype, sizeof r->dtype, CH_PREFIX, 1, err)) ||
        (st = get_str(o, "quant", r->quant, sizeof r->quant, CH_PREFIX, 1, err)) ||
        (st = get_int(o, "cache_tokens_left", 0, LONG_MAX / 2, &cache, err)) || (st = get_pings(o, r, err)) ||
        (st = get_str(o, "version", r->version, sizeof r->version, CH_ANY, 1, err)) ||
        (st = get_num(o, "ts", 0, 1e11, &r->timestamp, err)) || (st = get_num(o, "period", 0.05, 86400, &r->period, err)) ||
        (cJSON_GetObjectItemCaseSensitive(o, "queue_wait") && /* optional: older servers do not say it */
         (st = get_num(o, "queue_wait", 0, 1e6, &r->queue_wait, err))) ||
        (cJSON_GetObjectItemCaseSensitive(o, "max_queue_wait") && /* optional: none, or an older server */
         (st = get_num(o, "max_queue_wait", 0, 1e6, &r->max_queue_wait, err))) ||
        (cJSON_GetObjectItemCaseSensitive(o, "device") && /* optional: an older server */
         (st = get_str(o, "device", r->device, sizeof r->device, CH_ANY, 0, err))) ||
        (cJSON_GetObjectItemCaseSensitive(o, "caps") && /* optional: none, or an older server */
         (st = get_int(o, "caps", 0, INT_MAX, &caps, err))))
        return st;
    r->caps = (int)caps;
    r->port = (int)port;
    r->num_blocks = (int)blocks;
    r->start = (int)start;
    r->end = (int)end;
    r->cache_tokens_left = cache;
    return SP_OK;
}

/* The record against what the reader expects: its model, the key's block, the clock. */
static sp_status check_consistent(const sp_server_record *r, const sp_record_expect *x, sp_err *err)
{
    if (r->state == SP_SERVER_ONLINE && r->port == 0)
        return sp_errf(err, SP_ERR_FORMAT, "online without a port");
    if (r->start >= r->end || r->end > r->num_blocks)
        return sp_errf(err, SP_ERR_FORMAT, "span %d:%d is not inside the model's %d blocks", r->start, r->end,
                       r->num_blocks);
    if (!x)
        return SP_OK;
    if (x->model && strcmp(r->model, x->model))
        return sp_errf(err, SP_ERR_FORMAT, "record of model '%s', expected '%s'", r->model, x->model);
    if (x->config_hash && r->config_hash != x->config_hash)
        return sp_errf(err, SP_ERR_FORMAT, "config %016" PRIx64 " of model '%s' differs from ours (%016" PRIx64 ")",
                       r->config_hash, r->model, x->config_hash);
    if (x->num_blocks > 0 && r->num_blocks != x->num_blocks)
        return sp_errf(err, SP_ERR_FORMAT, "model of %d blocks, expected %d", r->num_blocks, x->num_blocks);
    if (x->block >= 0 && (x->block < r->start || x->block >= r->end))
        return sp_errf(err, SP_ERR_FORMAT, "span %d:%d announced under block %d", r->start, r->end, x->block);
    if (x->now > 0 && r->timestamp > x->now + MAX_SKEW_S)
        return sp_errf(err, SP_ERR_FORMAT, "timestamp %.0f s in the future", r->timestamp - x->now);
    return SP_OK;
}

sp_status sp_record_decode(sp_server_record *r, const void *data, size_t len, const sp_record_expect *x, sp_err *err)
{
    memset(r, 0, sizeof *r);
    cJSON *o = parse_object(data, len, err);
    if (!o)
        return SP_ERR_FORMAT;
    sp_status st = decode_fields(r, o, err);
    cJSON_Delete(o);
    if (!st)
        st = check_consistent(r, x, err);
    if (st)
        sp_err_prefix(err, "server record: ");
    return st;
}

int sp_record_is_stale(const sp_server_record *r, double now) { return r->timestamp + 3 * r->period < now; }

int sp_record_saturated(const sp_server_record *r) { return r->max_queue_wait > 0 && r->queue_wait > r->max_queue_wait; }

sp_status sp_model_record_decode(sp_model_record *m, const void *data, size_t len, double now, sp_err *err)
{
    memset(m, 0, sizeof *m);
    cJSON *o = parse_object(data, len, err);
    if (!o)
        return sp_err_prefix(err, "model record: ");
    long blocks = 0, hidden = 0;
    sp_status st;
    if ((st = get_str(o, "model", m->model, sizeof m->model, CH_PREFIX, 1, err)) || (st = get_hash(o, &m->config_hash, err)) ||
        (st = get_int(o, "blocks", 1, 1 << 20, &blocks, err)) || (st = get_int(o, "hidden", 1, 1 << 24, &hidden, err)) ||
        (st = get_str(o, "architecture", m->architecture, sizeof m->architecture, CH_PREFIX, 0, err)) ||
        (st = get_num(o, "ts", 0, 1e11, &m->timestamp, err)) || (st = get_num(o, "period", 0.05, 86400, &m->period, err)))
        ;
    else if (now > 0 && m->timestamp > now + MAX_SKEW_S)
        st = sp_errf(err, SP_ERR_FORMAT, "timestamp %.0f s in the future", m->timestamp - now);
    cJSON_Delete(o);
    m->num_blocks = (int)blocks;
    m->hidden = (int)hidden;
    return st ? sp_err_prefix(err, "model record: ") : SP_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* sealed records of a private swarm */

static const uint8_t SEAL_MAGIC[4] = {'S', 'P', 'R', SP_RECORD_SEALED_VERSION};
#define SEAL_AAD (4 + SP_SWARM_ID_BYTES)                  /* magic and swarm id: authenticated, in clear */
#define SEAL_HEAD (SEAL_AAD + SP_AEAD_NONCE_BYTES)

int sp_record_is_sealed(const void *data, size_t len, char swarm_hex[2 * SP_SWARM_ID_BYTES + 1],
                        uint8_t nonce[SP_AEAD_NONCE_BYTES])
{
    const uint8_t *d = data;
    if (len < SP_RECORD_SEAL_OVERHEAD || memcmp(d, SEAL_MAGIC, sizeof SEAL_MAGIC))
        return 0;
    if (swarm_hex)
        sp_hex_encode(d + 4, SP_SWARM_ID_BYTES, swarm_hex);
    if (nonce)
        memcpy(nonce, d + SEAL_AAD, SP_AEAD_NONCE_BYTES);
    return 1;
}

sp_status sp_record_seal(char *buf, size_t cap, size_t *len, const sp_swarm_key *k, sp_err *err)
{
    size_t n = *len, lim = cap < SP_RECORD_MAX ? cap : SP_RECORD_MAX;
    if (n + SP_RECORD_SEAL_OVERHEAD > lim)
        return sp_errf(err, SP_ERR_RANGE, "record: %zu bytes sealed, at most %zu fit", n + SP_RECORD_SEAL_OVERHEAD, lim);
    uint8_t head[SEAL_HEAD];
    memcpy(head, SEAL_MAGIC, sizeof SEAL_MAGIC);
    memcpy(head + 4, k->id, SP_SWARM_ID_BYTES);
    if (sp_random_bytes(head + SEAL_AAD, SP_AEAD_NONCE_BYTES))
        return sp_errf(err, SP_ERR_IO, "record: no random bytes from OpenSSL");
    uint8_t sealed[SP_RECORD_MAX];
    if (sp_aead_seal(k->seal, head + SEAL_AAD, head, SEAL_AAD, buf, n, sealed))
        return sp_errf(err, SP_ERR_IO, "record: AES-256-GCM failed");
    memcpy(buf, head, SEAL_HEAD);
    memcpy(buf + SEAL_HEAD, sealed, n + SP_AEAD_TAG_BYTES);
    *len = n + SP_RECORD_SEAL_OVERHEAD;
    return SP_OK;
}

sp_status sp_record_unseal(const void *data, size_t len, const sp_swarm_key *k, char *out, size_t cap, size_t *out_len,
                           sp_err *err)
{
    const uint8_t *d = data;
    char swarm[2 * SP_SWARM_ID_BYTES + 1];
    if (!sp_record_is_sealed(data, len, swarm, NULL))
        return sp_errf(err, SP_ERR_FORMAT, "record: not sealed (a record of an open swarm, not of this private one)");
    size_t n = len - SP_RECORD_SEAL_OVERHEAD;
    if (len > SP_RECORD_MAX || n + 1 > cap)
        return sp_errf(err, SP_ERR_FORMAT, "record: %zu bytes sealed (at most %d)", len, SP_RECORD_MAX);
    if (memcmp(d + 4, k->id, SP_SWARM_ID_BYTES))
        return sp_errf(err, SP_ERR_FORMAT, "record: sealed for swarm %s, not this key's (%s)", swarm, k->id_hex);
    if (sp_aead_open(k->seal, d + SEAL_AAD, d, SEAL_AAD, d + SEAL_HEAD, n + SP_AEAD_TAG_BYTES, (uint8_t *)out))
        return sp_errf(err, SP_ERR_FORMAT, "record: does not open with this swarm key (forged or altered)");
    out[n] = '\0';
    *out_len = n;
    return SP_OK;
}
