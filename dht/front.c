/* front.c - see front.h. A msgpack reader that never reads past the datagram, the envelope's schema on top of
 * it, and the table of fragmented messages in flight. */
#include "front.h"

#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 12
#define MAX_TOP 16          /* entries of the envelope map */
#define NODE4_LEN 26        /* id, IPv4 address, port */
#define NODE6_LEN 38        /* id, IPv6 address, port */
#define HASH_LEN 20
#define MAX_VALUE_SIZE (65536 + 32) /* OpenDHT skips a size above this (no fragments expected) */
#define FRAG_LIFE_S 13.0
#define MAX_MESSAGES 8192   /* fragmented messages followed at once */
#define MAX_PER_SENDER 1024

/* ---------------------------------------------------------------------------------------------- */
/* msgpack, bounded */

enum { MP_NIL, MP_BOOL, MP_UINT, MP_NEG, MP_FLOAT, MP_STR, MP_BIN, MP_ARRAY, MP_MAP };

typedef struct mp {
    const uint8_t *p, *end;
} mp;

typedef struct obj {
    int type;
    uint64_t u;         /* MP_UINT, MP_BOOL */
    const uint8_t *ptr; /* MP_STR, MP_BIN: the bytes */
    uint32_t len;       /* MP_STR, MP_BIN: bytes; MP_ARRAY: elements; MP_MAP: entries (which follow) */
} obj;

static int take(mp *m, size_t n, const uint8_t **out)
{
    if ((size_t)(m->end - m->p) < n)
        return -1;
    *out = m->p;
    m->p += n;
    return 0;
}

static int be(mp *m, size_t n, uint64_t *v)
{
    const uint8_t *b;
    if (take(m, n, &b))
        return -1;
    *v = 0;
    for (size_t i = 0; i < n; i++)
        *v = *v << 8 | b[i];
    return 0;
}

/* A string or bin of n bytes (n read as a big-endian number of w bytes when w > 0). */
static int bytes(mp *m, obj *o, int type, size_t w, uint64_t n)
{
    if (w && be(m, w, &n))
        return -1;
    o->type = type;
    o->len = (uint32_t)n;
    return n > 0xffffffffu || take(m, (size_t)n, &o->ptr);
}

/* A container of n elements, each at least `min` bytes: a count the rest of the datagram cannot hold is a lie. */
static int container(mp *m, obj *o, int type, size_t w, uint64_t n, size_t min)
{
    if (w && be(m, w, &n))
        return -1;
    o->type = type;
    o->len = (uint32_t)n;
    return n > (uint64_t)(m->end - m->p) / min ? -1 : 0;
}

static int integer(mp *m, obj *o, size_t w, int is_signed)
{
    uint64_t v;
    if (be(m, w, &v))
        return -1;
    if (is_signed && w < 8 && (v >> (8 * w - 1)) & 1)
        v |= ~0ull << (8 * w); /* sign-extend */
    o->type = is_signed && (int64_t)v < 0 ? MP_NEG : MP_UINT;
    o->u = v;
    return 0;
}

/* The next object's header (a string's or bin's bytes included; a container's elements follow). */
static int next(mp *m, obj *o)
{
    const uint8_t *b;
    if (take(m, 1, &b))
        return -1;
    unsigned c = *b;
    memset(o, 0, sizeof *o);
    if (c <= 0x7f || c >= 0xe0) {
        o->type = c <= 0x7f ? MP_UINT : MP_NEG;
        o->u = c <= 0x7f ? c : (uint64_t)(int64_t)(int8_t)c;
        return 0;
    }
    if (c <= 0x8f)
        return container(m, o, MP_MAP, 0, c & 0x0f, 2);
    if (c <= 0x9f)
        return container(m, o, MP_ARRAY, 0, c & 0x0f, 1);
    if (c <= 0xbf)
        return bytes(m, o, MP_STR, 0, c & 0x1f);
    switch (c) {
    case 0xc0: o->type = MP_NIL; return 0;
    case 0xc2: case 0xc3: o->type = MP_BOOL; o->u = c == 0xc3; return 0;
    case 0xc4: return bytes(m, o, MP_BIN, 1, 0);
    case 0xc5: return bytes(m, o, MP_BIN, 2, 0);
    case 0xc6: return bytes(m, o, MP_BIN, 4, 0);
    case 0xca: o->type = MP_FLOAT; return take(m, 4, &b);
    case 0xcb: o->type = MP_FLOAT; return take(m, 8, &b);
    case 0xcc: return integer(m, o, 1, 0);
    case 0xcd: return integer(m, o, 2, 0);
    case 0xce: return integer(m, o, 4, 0);
    case 0xcf: return integer(m, o, 8, 0);
    case 0xd0: return integer(m, o, 1, 1);
    case 0xd1: return integer(m, o, 2, 1);
    case 0xd2: return integer(m, o, 4, 1);
    case 0xd3: return integer(m, o, 8, 1);
    case 0xd9: return bytes(m, o, MP_STR, 1, 0);
    case 0xda: return bytes(m, o, MP_STR, 2, 0);
    case 0xdb: return bytes(m, o, MP_STR, 4, 0);
    case 0xdc: return container(m, o, MP_ARRAY, 2, 0, 1);
    case 0xdd: return container(m, o, MP_ARRAY, 4, 0, 1);
    case 0xde: return container(m, o, MP_MAP, 2, 0, 2);
    case 0xdf: return container(m, o, MP_MAP, 4, 0, 2);
    default: return -1; /* 0xc1 (never used), ext types (OpenDHT sends none) */
    }
}

/* Skips the elements of a container whose header o was just read, depth levels deep. */
static int skip_body(mp *m, const obj *o, int depth)
{
    if (o->type != MP_ARRAY && o->type != MP_MAP)
        return 0;
    if (depth >= MAX_DEPTH)
        return -1;
    uint64_t n = (uint64_t)o->len * (o->type == MP_MAP ? 2 : 1);
    for (uint64_t i = 0; i < n; i++) {
        obj e;
        if (next(m, &e) || skip_body(m, &e, depth + 1))
            return -1;
    }
    return 0;
}

static int skip(mp *m, int depth)
{
    obj o;
    return next(m, &o) || skip_body(m, &o, depth) ? -1 : 0;
}

static int key_is(const obj *k, const char *s)
{
    size_t n = strlen(s);
    return k->type == MP_STR && k->len == n && !memcmp(k->ptr, s, n);
}

/* ---------------------------------------------------------------------------------------------- */
/* the schema */

typedef struct ctx {
    mp m;
    const char *why;
    sp_dgram *out;
} ctx;

static int fail(ctx *c, const char *why)
{
    if (!c->why)
        c->why = why;
    return -1;
}

static int want(ctx *c, obj *o, int type, const char *why)
{
    if (next(&c->m, o) || o->type != type)
        return fail(c, why);
    return 0;
}

static int want_uint(ctx *c, uint64_t max, uint64_t *v, const char *why)
{
    obj o;
    if (next(&c->m, &o) || o.type != MP_UINT || o.u > max)
        return fail(c, why);
    if (v)
        *v = o.u;
    return 0;
}

/* A transaction id: a 32-bit unsigned integer, or 4 bytes. */
static int want_tid(ctx *c, uint32_t *tid)
{
    obj o;
    if (next(&c->m, &o))
        return fail(c, "malformed msgpack");
    if (o.type == MP_UINT && o.u <= 0xffffffffu) {
        *tid = (uint32_t)o.u;
        return 0;
    }
    if ((o.type == MP_BIN || o.type == MP_STR) && o.len == 4) {
        *tid = (uint32_t)o.ptr[0] << 24 | (uint32_t)o.ptr[1] << 16 | (uint32_t)o.ptr[2] << 8 | o.ptr[3];
        return 0;
    }
    return fail(c, "a transaction id that is neither a 32-bit integer nor 4 bytes");
}

static int want_blob(ctx *c, uint32_t max, obj *o, const char *why)
{
    if (next(&c->m, o) || (o->type != MP_BIN && o->type != MP_STR) || o->len > max)
        return fail(c, why);
    return 0;
}

static int uint_array(ctx *c, uint32_t min_len, const char *why)
{
    obj o;
    if (want(c, &o, MP_ARRAY, why) || o.len < min_len)
        return fail(c, why);
    for (uint32_t i = 0; i < o.len; i++)
        if (want_uint(c, UINT64_MAX, NULL, why))
            return -1;
    return 0;
}

/* "values": sizes (a fragmented value: recorded) or value maps (checked by OpenDHT under its try). */
static int values(ctx *c, int *nsizes)
{
    obj a;
    if (want(c, &a, MP_ARRAY, "'values' is not an array"))
        return -1;
    for (uint32_t i = 0; i < a.len; i++) {
        obj v;
        if (next(&c->m, &v))
            return fail(c, "malformed msgpack");
        if (v.type == MP_MAP) {
            if (skip_body(&c->m, &v, 3))
                return fail(c, "a value nested too deep or malformed");
        } else if (v.type == MP_UINT) {
            if (v.u > MAX_VALUE_SIZE)
                continue;
            if (c->out->nparts >= SP_FRONT_MAX_PARTS)
                return fail(c, "more values by size than the front follows");
            c->out->parts[c->out->nparts++] = (sp_dgram_part){.index = i, .a = (uint32_t)v.u};
            (*nsizes)++;
        } else {
            return fail(c, "a value that is neither a map nor a size");
        }
    }
    return 0;
}

/* "fileds" (sic): {"f": [field, ...] (not empty: OpenDHT divides by its size), "v": [...]}. */
static int fields(ctx *c)
{
    obj m, k;
    if (want(c, &m, MP_MAP, "'fileds' is not a map"))
        return -1;
    int has_f = 0;
    for (uint32_t i = 0; i < m.len; i++) {
        if (want(c, &k, MP_STR, "a field selection key is not a string"))
            return -1;
        if (key_is(&k, "f")) {
            if (uint_array(c, 1, "an empty or malformed field selection"))
                return -1;
            has_f = 1;
        } else if (key_is(&k, "v")) {
            obj v;
            if (want(c, &v, MP_ARRAY, "field values are not an array") || skip_body(&c->m, &v, 3))
                return fail(c, "malformed field values");
        } else if (skip(&c->m, 3)) {
            return fail(c, "malformed msgpack");
        }
    }
    return has_f ? 0 : fail(c, "a field selection without fields");
}

/* "q" inside a request: {"w": [filters], "s": [fields]}. */
static int query(ctx *c)
{
    obj m, k, v;
    if (want(c, &m, MP_MAP, "a query that is not a map"))
        return -1;
    for (uint32_t i = 0; i < m.len; i++) {
        if (want(c, &k, MP_STR, "a query key is not a string"))
            return -1;
        if (key_is(&k, "s")) {
            if (uint_array(c, 0, "a query's selection is not an array of fields"))
                return -1;
        } else if (key_is(&k, "w")) {
            if (want(c, &v, MP_ARRAY, "a query's filters are not an array"))
                return -1;
            for (uint32_t j = 0; j < v.len; j++) {
                obj f;
                if (want(c, &f, MP_MAP, "a query filter is not a map") || skip_body(&c->m, &f, 4))
                    return fail(c, "malformed query filter");
            }
        } else if (skip(&c->m, 3)) {
            return fail(c, "malformed msgpack");
        }
    }
    return 0;
}

/* The request or reply map ("a", "r" or "u"). */
static int body(ctx *c, int *has_id, int *nsizes)
{
    obj m, k, o;
    if (want(c, &m, MP_MAP, "'a', 'r' or 'u' is not a map"))
        return -1;
    uint32_t tid;
    for (uint32_t i = 0; i < m.len; i++) {
        if (want(c, &k, MP_STR, "a request key is not a string"))
            return -1;
        int r = 0;
        if (key_is(&k, "id") || key_is(&k, "h") || key_is(&k, "target")) {
            r = want(c, &o, MP_BIN, "an id that is not 20 bytes") || (o.len != HASH_LEN && fail(c, "an id that is not 20 bytes"));
            *has_id |= key_is(&k, "id");
        } else if (key_is(&k, "sid")) {
            r = want_tid(c, &tid);
        } else if (key_is(&k, "n4")) {
            r = want(c, &o, MP_BIN, "'n4' is not bytes") || (o.len % NODE4_LEN && fail(c, "'n4' is not whole nodes"));
        } else if (key_is(&k, "n6")) {
            r = want(c, &o, MP_BIN, "'n6' is not bytes") || (o.len % NODE6_LEN && fail(c, "'n6' is not whole nodes"));
        } else if (key_is(&k, "sa")) {
            r = want(c, &o, MP_BIN, "'sa' is not an address") || (o.len > 16 && fail(c, "'sa' is not an address"));
        } else if (key_is(&k, "token")) {
            r = want_blob(c, 512, &o, "a token that is not bytes");
        } else if (key_is(&k, "vid")) {
            r = want_uint(c, UINT64_MAX, NULL, "'vid' is not a value id");
        } else if (key_is(&k, "c") || key_is(&k, "ve")) {
            r = next(&c->m, &o) || (o.type != MP_UINT && o.type != MP_NEG) ? fail(c, "a time or version that is not an integer") : 0;
        } else if (key_is(&k, "values")) {
            r = values(c, nsizes);
        } else if (key_is(&k, "exp") || key_is(&k, "re") || key_is(&k, "w")) {
            r = uint_array(c, 0, "'exp', 're' or 'w' is not an array of integers");
        } else if (key_is(&k, "fileds")) {
            r = fields(c);
        } else if (key_is(&k, "q")) {
            r = query(c);
        } else {
            r = skip(&c->m, 2) ? fail(c, "malformed msgpack") : 0;
        }
        if (r)
            return -1;
    }
    return 0;
}

/* "p": {index: {"o": offset, "d": bytes}, ...} */
static int fragments(ctx *c)
{
    obj m, k, f;
    if (want(c, &m, MP_MAP, "'p' is not a map"))
        return -1;
    for (uint32_t i = 0; i < m.len; i++) {
        uint64_t index, off = 0;
        if (want_uint(c, 0xffffffffu, &index, "a fragment index that is not an integer") ||
            want(c, &f, MP_MAP, "a fragment that is not a map"))
            return -1;
        int has_o = 0, has_d = 0;
        obj d = {0};
        for (uint32_t j = 0; j < f.len; j++) {
            if (want(c, &k, MP_STR, "a fragment key is not a string"))
                return -1;
            int r;
            if (key_is(&k, "o")) {
                r = want_uint(c, 0xffffffffu, &off, "a fragment offset that is not an integer");
                has_o = 1;
            } else if (key_is(&k, "d")) {
                r = want_blob(c, 0xffffffffu, &d, "fragment data that is not bytes");
                has_d = 1;
            } else {
                r = skip(&c->m, 3) ? fail(c, "malformed msgpack") : 0;
            }
            if (r)
                return -1;
        }
        if (!has_o || !has_d) /* OpenDHT skips it */
            continue;
        if (c->out->nparts >= SP_FRONT_MAX_PARTS)
            return fail(c, "more fragments in one datagram than the front follows");
        c->out->parts[c->out->nparts++] = (sp_dgram_part){.index = (uint32_t)index, .a = (uint32_t)off, .len = d.len};
    }
    return 0;
}

/* Which of OpenDHT's queries q names (0: none). */
static int known_query(const obj *q)
{
    static const char *const names[] = {"ping", "find", "get", "listen", "put", "refresh", "update"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (key_is(q, names[i]))
            return 1;
    return 0;
}

typedef struct top {
    obj y, q;
    int has_y, has_q, has_t, has_e, has_p;
    int body;          /* which of "a", "r", "u" came: 'a', 'r', 'u' (0: none) */
    int has_id, nsizes;
    uint64_t network;
} top;

/* One entry of the envelope map. */
static int top_entry(ctx *c, top *t)
{
    obj k, o;
    if (want(c, &k, MP_STR, "an envelope key is not a string"))
        return -1;
    if (key_is(&k, "y") || key_is(&k, "q")) {
        int y = key_is(&k, "y");
        if ((y ? t->has_y : t->has_q) || want(c, y ? &t->y : &t->q, MP_STR, "'y' or 'q' is not a string"))
            return fail(c, "'y' or 'q' twice, or not a string");
        *(y ? &t->has_y : &t->has_q) = 1;
        return 0;
    }
    if (key_is(&k, "t")) {
        t->has_t = 1;
        return want_tid(c, &c->out->tid);
    }
    if (key_is(&k, "v"))
        return want_blob(c, 256, &o, "a user agent that is not a string");
    if (key_is(&k, "n"))
        return want_uint(c, 0xffffffffu, &t->network, "a network id that is not a 32-bit integer");
    if (key_is(&k, "s"))
        return want(c, &o, MP_BOOL, "'s' is not a bool");
    if (key_is(&k, "a") || key_is(&k, "r") || key_is(&k, "u")) {
        if (t->body)
            return fail(c, "more than one of 'a', 'r' and 'u'");
        t->body = k.ptr[0];
        return body(c, &t->has_id, &t->nsizes);
    }
    if (key_is(&k, "e")) {
        if (t->has_e || want(c, &o, MP_ARRAY, "an error that is not an array") || o.len < 1)
            return fail(c, "an error that is not an array of a code and a message");
        t->has_e = 1;
        if (want_uint(c, 0xffff, NULL, "an error code that is not a 16-bit integer"))
            return -1;
        for (uint32_t i = 1; i < o.len; i++)
            if (skip(&c->m, 2))
                return fail(c, "malformed msgpack");
        return 0;
    }
    if (key_is(&k, "p")) {
        if (t->has_p)
            return fail(c, "'p' twice");
        t->has_p = 1;
        return fragments(c);
    }
    return skip(&c->m, 1) ? fail(c, "malformed msgpack") : 0;
}

/* OpenDHT's order: an error, a reply, value data, a value update, else a query ("y" must then be "q"). */
static int classify(ctx *c, const top *t, uint32_t network)
{
    sp_dgram *d = c->out;
    if (t->network != network)
        return fail(c, "another network id");
    d->kind = t->has_e ? SP_DGRAM_ERROR : t->body == 'r' ? SP_DGRAM_REPLY : t->has_p ? SP_DGRAM_VALUE_DATA
            : t->body == 'u' ? SP_DGRAM_VALUE_UPDATE : SP_DGRAM_QUERY;
    if (t->has_p && (t->body || t->has_e)) /* OpenDHT would ignore the fragments; never sent so */
        return fail(c, "fragments and a message in one datagram");
    if (d->kind == SP_DGRAM_VALUE_DATA)
        return t->has_t ? 0 : fail(c, "value data without a transaction id");
    if (d->kind == SP_DGRAM_QUERY && ((t->has_y && !key_is(&t->y, "q")) || !t->has_q || !known_query(&t->q)))
        return fail(c, "not a query OpenDHT knows");
    if (!t->body)
        return fail(c, "no 'a', 'r' or 'u'");
    if (!t->has_id)
        return fail(c, "no sender id");
    if (d->kind == SP_DGRAM_VALUE_UPDATE && t->nsizes)
        return fail(c, "values by size in a value update");
    return 0;
}

int sp_dgram_check(const uint8_t *p, size_t n, uint32_t network, sp_dgram *out, const char **why)
{
    sp_dgram scratch;
    ctx c = {.m = {p, p + n}, .out = out ? out : &scratch};
    memset(c.out, 0, sizeof *c.out);
    top t = {0};
    obj m;
    int bad = want(&c, &m, MP_MAP, "not a msgpack map") || (m.len > MAX_TOP && fail(&c, "an envelope of too many fields"));
    for (uint32_t i = 0; !bad && i < m.len; i++)
        bad = top_entry(&c, &t);
    if (!bad && c.m.p != c.m.end)
        bad = fail(&c, "bytes after the message");
    if (!bad)
        bad = classify(&c, &t, network);
    if (bad && why)
        *why = c.why ? c.why : "malformed msgpack";
    return bad ? -1 : 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* fragmented messages in flight */

typedef struct message {
    uint32_t tid, addr;
    uint16_t port;
    int complete;
    double start;
    int nparts;
    uint32_t total[SP_FRONT_MAX_PARTS], index[SP_FRONT_MAX_PARTS], have[SP_FRONT_MAX_PARTS];
} message;

struct sp_front {
    uint32_t network;
    int n;
    message *msgs; /* [MAX_MESSAGES], the first n alive */
};

sp_front *sp_front_new(uint32_t network)
{
    sp_front *f = calloc(1, sizeof *f);
    if (f && !(f->msgs = calloc(MAX_MESSAGES, sizeof *f->msgs))) {
        free(f);
        return NULL;
    }
    if (f)
        f->network = network;
    return f;
}

void sp_front_free(sp_front *f)
{
    if (f)
        free(f->msgs);
    free(f);
}

/* Forgets messages older than FRAG_LIFE_S; returns the one of tid (NULL: none) and counts the sender's. */
static message *find(sp_front *f, uint32_t tid, uint32_t addr, uint16_t port, double now, int *from_sender)
{
    message *hit = NULL;
    *from_sender = 0;
    for (int i = 0; i < f->n;) {
        message *m = &f->msgs[i];
        if (now - m->start > FRAG_LIFE_S) {
            *m = f->msgs[--f->n];
            continue;
        }
        *from_sender += m->addr == addr && m->port == port;
        if (m->tid == tid)
            hit = m;
        i++;
    }
    return hit;
}

/* A message announcing values by size: OpenDHT opens a partial entry for its tid. */
static int open_message(sp_front *f, const sp_dgram *d, uint32_t addr, uint16_t port, double now, const char **why)
{
    int mine;
    if (find(f, d->tid, addr, port, now, &mine)) {
        *why = "a fragmented message of a transaction still in flight";
        return 0;
    }
    if (f->n == MAX_MESSAGES || mine >= MAX_PER_SENDER) {
        *why = "too many fragmented messages in flight";
        return 0;
    }
    message *m = &f->msgs[f->n++];
    *m = (message){.tid = d->tid, .addr = addr, .port = port, .start = now, .nparts = d->nparts};
    for (int i = 0; i < d->nparts; i++) {
        m->index[i] = d->parts[i].index;
        m->total[i] = d->parts[i].a;
    }
    return 1;
}

/* A datagram of fragments: passes if it extends an open message of its sender, as OpenDHT appends it. */
static int extend_message(sp_front *f, const sp_dgram *d, uint32_t addr, uint16_t port, double now, const char **why)
{
    int mine;
    message *m = find(f, d->tid, addr, port, now, &mine);
    if (!m || m->complete || m->addr != addr || m->port != port) {
        *why = "a fragment of no open message of its sender";
        return 0;
    }
    int grew = 0;
    for (int i = 0; i < m->nparts; i++)
        for (int j = 0; j < d->nparts; j++)
            if (d->parts[j].index == m->index[i]) { /* OpenDHT keeps the first of an index */
                if (m->have[i] < m->total[i] && d->parts[j].a == m->have[i]) {
                    m->have[i] += d->parts[j].len;
                    grew = 1;
                }
                break;
            }
    if (!grew) {
        *why = "a fragment that extends nothing";
        return 0;
    }
    m->complete = 1;
    for (int i = 0; i < m->nparts; i++)
        m->complete &= m->have[i] >= m->total[i];
    return 1;
}

int sp_front_accept(sp_front *f, const uint8_t *p, size_t n, uint32_t from_addr, uint16_t from_port, double now,
                    const char **why)
{
    sp_dgram d;
    const char *w = NULL;
    int ok = sp_dgram_check(p, n, f->network, &d, &w) == 0;
    if (ok && d.kind == SP_DGRAM_VALUE_DATA)
        ok = extend_message(f, &d, from_addr, from_port, now, &w);
    else if (ok && d.nparts > 0)
        ok = open_message(f, &d, from_addr, from_port, now, &w);
    if (why)
        *why = ok ? NULL : w;
    return ok;
}
