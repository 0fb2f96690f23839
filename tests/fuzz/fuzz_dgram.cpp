// fuzz_dgram.cpp - libFuzzer target for the DHT's UDP front, dht/front.c (built and run by
// `tests/fuzz/run.sh --target dgram`).
//
// Each input is a sender (its first byte: one of four ports) and a datagram (the rest), given to one front that
// lives across inputs (so fragment state builds up), the clock a tenth of a second further each time. The front
// must never crash, leak or read outside the datagram, and what its check accepts must be one whole msgpack
// object to msgpack-c (the parser OpenDHT uses): no exception, nothing left over. Violations abort(), which
// libFuzzer reports as a crash with the input saved.
//
// Built with -DFUZZ_DGRAM_SEEDS instead, it writes the seed corpus (datagrams shaped as OpenDHT 2.4.12 sends
// them): fuzz_dgram_seeds DIR
#include <msgpack.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "front.h"

static const uint32_t NETWORK = 0x5E9A1;

#ifndef FUZZ_DGRAM_SEEDS

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static sp_front *front = sp_front_new(NETWORK);
    static double now = 0;
    if (!front)
        abort();
    if (size < 1)
        return 0;
    now += 0.1;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    sp_dgram d;
    const char *why = nullptr;
    if (sp_dgram_check(p, n, NETWORK, &d, &why) == 0) {
        if (d.nparts < 0 || d.nparts > SP_FRONT_MAX_PARTS)
            abort();
        try {
            std::size_t off = 0;
            msgpack::object_handle oh = msgpack::unpack(reinterpret_cast<const char *>(p), n, off);
            if (off != n || oh.get().type != msgpack::type::MAP)
                abort();
        } catch (const std::exception &) {
            abort(); // the front passed what OpenDHT's parser refuses: the two readers disagree
        }
    } else if (!why) {
        abort();
    }
    sp_front_accept(front, p, n, 0x0100007f, (uint16_t)(4000 + (data[0] & 3)), now, &why);
    return 0;
}

#else

using Packer = msgpack::packer<msgpack::sbuffer>;

static void write(const std::string &dir, const char *name, const msgpack::sbuffer &b)
{
    std::string path = dir + "/" + name;
    FILE *f = fopen(path.c_str(), "wb");
    if (!f || fputc(0, f) == EOF || fwrite(b.data(), 1, b.size(), f) != b.size()) { // sender 0, then the datagram
        perror(path.c_str());
        exit(1);
    }
    fclose(f);
}

static void id(Packer &pk)
{
    std::string h(20, 'B');
    pk.pack_bin(20);
    pk.pack_bin_body(h.data(), 20);
}

static void tail(Packer &pk, uint32_t tid, const char *y)
{
    pk.pack("t"), pk.pack(tid), pk.pack("y"), pk.pack(y), pk.pack("v"), pk.pack("RNG1"), pk.pack("n"), pk.pack(NETWORK);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_dgram_seeds DIR\n");
        return 2;
    }
    std::string dir = argv[1];
    {
        msgpack::sbuffer b;
        Packer pk(&b);
        pk.pack_map(6), pk.pack("a"), pk.pack_map(1), pk.pack("id"), id(pk), pk.pack("q"), pk.pack("ping");
        tail(pk, 7, "q");
        write(dir, "ping.bin", b);
    }
    {
        msgpack::sbuffer b;
        Packer pk(&b);
        std::string nodes(52, 'n'), data(300, 'x');
        pk.pack_map(5), pk.pack("r"), pk.pack_map(4), pk.pack("id"), id(pk), pk.pack("n4"), pk.pack_bin(52);
        pk.pack_bin_body(nodes.data(), 52), pk.pack("token"), pk.pack_bin(4), pk.pack_bin_body("tokn", 4);
        pk.pack("values"), pk.pack_array(1), pk.pack_map(2), pk.pack("id"), pk.pack(uint64_t(12345)), pk.pack("dat");
        pk.pack_map(1), pk.pack("body"), pk.pack_map(2), pk.pack("data"), pk.pack_bin(300);
        pk.pack_bin_body(data.data(), 300), pk.pack("type"), pk.pack(0x5E05);
        tail(pk, 7, "r");
        write(dir, "reply.bin", b);
    }
    {
        msgpack::sbuffer b;
        Packer pk(&b);
        pk.pack_map(6), pk.pack("a"), pk.pack_map(4), pk.pack("id"), id(pk), pk.pack("h"), id(pk), pk.pack("values");
        pk.pack_array(1), pk.pack(700), pk.pack("token"), pk.pack_bin(4), pk.pack_bin_body("tokn", 4);
        pk.pack("q"), pk.pack("put");
        tail(pk, 9, "q");
        write(dir, "put-by-size.bin", b);
    }
    for (int part = 0; part < 2; part++) {
        msgpack::sbuffer b;
        Packer pk(&b);
        unsigned off = part ? 640 : 0, len = part ? 60 : 640;
        std::string data(len, 'v');
        pk.pack_map(4), pk.pack("n"), pk.pack(NETWORK), pk.pack("y"), pk.pack("p"), pk.pack("t"), pk.pack(9);
        pk.pack("p"), pk.pack_map(1), pk.pack(0), pk.pack_map(2), pk.pack("o"), pk.pack(off), pk.pack("d");
        pk.pack_bin(len), pk.pack_bin_body(data.data(), len);
        write(dir, part ? "fragment-1.bin" : "fragment-0.bin", b);
    }
    {
        msgpack::sbuffer b;
        Packer pk(&b);
        pk.pack_map(6), pk.pack("e"), pk.pack_array(2), pk.pack(401), pk.pack("unauthorized"), pk.pack("r");
        pk.pack_map(1), pk.pack("id"), id(pk);
        tail(pk, 7, "e");
        write(dir, "error.bin", b);
    }
    return 0;
}

#endif
