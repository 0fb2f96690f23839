// node.cpp - sepal-dht: one OpenDHT node, driven by its parent (dht/dht.c) over stdin and stdout.
//
// Why a program of its own: Debian's OpenDHT 2.4.12 segfaults on one malformed UDP datagram, so a node
// inside a server would take its sessions down with it; here a crash costs the parent a restart. Why C++:
// OpenDHT's C API can neither bind one address nor register value types.
//
//   usage: sepal-dht BIND_IPV4 PORT NETWORK_ID
//
// It binds only BIND_IPV4:PORT (UDP, no IPv6), registers the value types 0x5E00 + k (k = 0..16) that live
// 2^k seconds in the DHT and are at most 16384 bytes, and exits when its stdin closes or its parent dies.
// Its socket is ours, not OpenDHT's: every datagram passes the UDP front (front.h) before the node sees it,
// so the malformed datagrams that crash OpenDHT 2.4.12 are dropped (and counted) instead.
// SEPAL_DHT_NO_FRONT=1 (a testing aid: bench/dht_flood measures what the front saves) lets every datagram through.
//
// Protocol (every message is one text line; a value's bytes follow its line):
//   parent -> node   boot HOST PORT           join through HOST:PORT (may repeat); answered by `pong`
//                    listen KEY               values of KEY, now and later, as `value` lines
//                    get KEY                  one lookup: `value` lines, then `done KEY OK`
//                    put KEY SLOT TTL LEN     + LEN bytes: publish under KEY for TTL s, replacing what was
//                                             published under (KEY, SLOT) before; answered by `putdone`
//                    quit
//   node -> parent   ready PORT
//                    value KEY EXPIRED LEN    + LEN bytes
//                    done KEY OK
//                    putdone KEY SLOT OK
//                    pong HOST PORT OK        whether HOST:PORT answered a ping (OK 0: not within ~3 s)
//                    stats GOOD DUBIOUS REFUSED [WHY]
//                                             when they change, else every 2 s; REFUSED: datagrams the
//                                             front dropped so far, WHY: the rule the last one broke
//                    error TEXT
// Keys and slots are at most 200 bytes, without whitespace. Every value gets a new random id: OpenDHT's
// listen cache de-duplicates by id, so a re-published id with new content would never reach a listener.
#include <opendht.h>
#include <opendht/network_utils.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <stdexcept>
#include <thread>

#include "front.h"

namespace {

constexpr size_t kMaxValue = 16384;
constexpr size_t kMaxName = 200;
constexpr dht::ValueType::Id kTypeBase = 0x5E00;
constexpr int kTypes = 17;

std::mutex out_lock; // one writer at a time: DhtRunner calls back on its own threads

void emit(const std::string &line, const uint8_t *data = nullptr, size_t len = 0)
{
    std::lock_guard<std::mutex> g(out_lock);
    fwrite(line.data(), 1, line.size(), stdout);
    fputc('\n', stdout);
    if (len)
        fwrite(data, 1, len, stdout);
    fflush(stdout);
}

void emit_value(const std::string &key, const std::shared_ptr<dht::Value> &v, bool expired)
{
    if (!v || v->data.size() > kMaxValue)
        return;
    emit("value " + key + " " + (expired ? "1 " : "0 ") + std::to_string(v->data.size()), v->data.data(),
         v->data.size());
}

void register_types(dht::DhtRunner &r)
{
    for (int k = 0; k < kTypes; k++) {
        auto store = [](dht::InfoHash, std::shared_ptr<dht::Value> &v, const dht::InfoHash &, const dht::SockAddr &) {
            return v && v->data.size() <= kMaxValue;
        };
        r.registerType(dht::ValueType(kTypeBase + k, "sepal-" + std::to_string(1 << k) + "s",
                                      std::chrono::seconds(1L << k), store));
    }
}

double now_s()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

// The node's UDP socket, bound to one IPv4 address: a thread receives, the front (front.h) judges, and only
// what it accepts reaches OpenDHT (through DatagramSocket::onReceived, as OpenDHT's own UdpSocket does).
class FrontSocket final : public dht::net::DatagramSocket {
  public:
    FrontSocket(const sockaddr_in &bind_to, uint32_t network) : front_(sp_front_new(network))
    {
        const char *off = getenv("SEPAL_DHT_NO_FRONT");
        open_ = off && *off == '1';
        fd_ = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        sockaddr_in got{};
        socklen_t len = sizeof got;
        if (!front_ || fd_ < 0 || bind(fd_, (const sockaddr *)&bind_to, sizeof bind_to) ||
            getsockname(fd_, (sockaddr *)&got, &len) || pipe2(wake_, O_CLOEXEC)) {
            std::string why = front_ ? strerror(errno) : "out of memory";
            release();
            throw std::runtime_error(why);
        }
        bound_ = dht::SockAddr((const sockaddr *)&got, len);
        thread_ = std::thread([this] { receive(); });
    }
    ~FrontSocket() override
    {
        stop();
        if (thread_.joinable())
            thread_.join();
        release();
    }
    int sendTo(const dht::SockAddr &dest, const uint8_t *data, size_t size, bool replied) override
    {
        if (!dest || dest.getFamily() != AF_INET)
            return EAFNOSUPPORT;
        int flags = MSG_NOSIGNAL | (replied ? MSG_CONFIRM : 0);
        return sendto(fd_, data, size, flags, dest.get(), dest.getLength()) < 0 ? errno : 0;
    }
    bool hasIPv4() const override { return true; }
    bool hasIPv6() const override { return false; }
    const dht::SockAddr &getBoundRef(sa_family_t family) const override { return family == AF_INET6 ? none_ : bound_; }
    void stop() override
    {
        if (running_.exchange(false) && wake_[1] >= 0) {
            char c = 0;
            (void)!write(wake_[1], &c, 1);
        }
    }
    uint64_t refused() const { return refused_.load(); }
    const char *last_refusal() const { return last_why_.load(); }

  private:
    sp_front *front_;
    bool open_ = false; // SEPAL_DHT_NO_FRONT
    int fd_ = -1, wake_[2] = {-1, -1};
    dht::SockAddr bound_, none_;
    std::thread thread_;
    std::atomic<bool> running_{true};
    std::atomic<uint64_t> refused_{0};
    std::atomic<const char *> last_why_{""};

    void release()
    {
        for (int fd : {fd_, wake_[0], wake_[1]})
            if (fd >= 0)
                close(fd);
        fd_ = wake_[0] = wake_[1] = -1;
        sp_front_free(front_);
        front_ = nullptr;
    }

    void receive()
    {
        std::vector<uint8_t> buf(65536);
        while (running_) {
            pollfd p[2] = {{fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
            if (poll(p, 2, -1) < 0 && errno != EINTR)
                break;
            if (p[1].revents)
                break;
            for (;;) { // everything queued, then wait again
                sockaddr_in from{};
                socklen_t flen = sizeof from;
                ssize_t n = recvfrom(fd_, buf.data(), buf.size(), 0, (sockaddr *)&from, &flen);
                if (n < 0)
                    break;
                const char *why = "not from an IPv4 address";
                if (flen != sizeof from || from.sin_family != AF_INET ||
                    (!open_ && !sp_front_accept(front_, buf.data(), (size_t)n, from.sin_addr.s_addr, from.sin_port,
                                                now_s(), &why))) {
                    refused_++;
                    last_why_ = why;
                    continue;
                }
                auto pkts = getNewPacket();
                auto &pkt = pkts.front();
                pkt.data.assign(buf.begin(), buf.begin() + n);
                pkt.from = dht::SockAddr((const sockaddr *)&from, flen);
                pkt.received = dht::clock::now();
                onReceived(std::move(pkts));
            }
        }
    }
};

bool valid_name(const std::string &s)
{
    if (s.empty() || s.size() > kMaxName)
        return false;
    for (unsigned char c : s)
        if (c <= ' ' || c == 0x7f)
            return false;
    return true;
}

class Node {
  public:
    Node() : rng_(std::random_device{}()) {}

    int run(const char *bind, int port, uint32_t network)
    {
        sockaddr_in sin{};
        sin.sin_family = AF_INET;
        sin.sin_port = htons((uint16_t)port);
        if (inet_pton(AF_INET, bind, &sin.sin_addr) != 1) {
            emit(std::string("error bad bind address ") + bind);
            return 2;
        }
        dht::DhtRunner::Config cfg;
        cfg.dht_config.node_config.network = network;
        // OpenDHT limits requests per source IP address. On loopback every node of the swarm is this machine
        // and shares 127.0.0.1's budget, so the limit would throttle the swarm against itself.
        if (ntohl(sin.sin_addr.s_addr) >> 24 == 127)
            cfg.dht_config.node_config.max_peer_req_per_sec = -1;
        cfg.threaded = true;
        dht::DhtRunner::Context ctx;
        try {
            auto sock = std::make_unique<FrontSocket>(sin, network);
            socket_ = sock.get(); // the runner owns it until it is joined (after the stats thread)
            ctx.sock = std::move(sock);
            runner_.run(cfg, std::move(ctx));
        } catch (const std::exception &e) {
            emit(std::string("error cannot bind ") + bind + ":" + std::to_string(port) + ": " + e.what());
            return 1;
        }
        register_types(runner_);
        emit("ready " + std::to_string(runner_.getBoundPort(AF_INET)));
        std::thread stats([this] { report_stats(); });
        loop();
        stop_ = true;
        stats.join();
        runner_.shutdown({}, true);
        runner_.join();
        return 0;
    }

  private:
    dht::DhtRunner runner_;
    FrontSocket *socket_ = nullptr;
    std::mt19937_64 rng_;
    struct Pub {
        dht::Value::Id id = 0;
        std::shared_ptr<std::atomic<bool>> reported; // its putdone went out (the parent counts them)
    };
    std::map<std::pair<std::string, std::string>, Pub> published_;
    std::map<std::string, bool> listening_;
    std::atomic<bool> stop_{false};

    // Node counts: at once when they change (a new node waits for its first peer), else every 2 s.
    void report_stats()
    {
        unsigned last_good = ~0u, last_dubious = ~0u;
        uint64_t last_refused = 0;
        for (int tick = 0; !stop_; tick++) {
            unsigned good = 0, dubious = 0, cached = 0, incoming = 0;
            runner_.getNodesStats(AF_INET, &good, &dubious, &cached, &incoming);
            uint64_t refused = socket_->refused();
            if (good != last_good || dubious != last_dubious || refused != last_refused || tick % 100 == 0)
                emit("stats " + std::to_string(good) + " " + std::to_string(dubious) + " " + std::to_string(refused) +
                     (refused ? std::string(" ") + socket_->last_refusal() : ""));
            last_good = good;
            last_dubious = dubious;
            last_refused = refused;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
    }

    // Reads one command line and acts on it; false at the end of input or on quit.
    void loop()
    {
        char *line = nullptr;
        size_t cap = 0;
        ssize_t n;
        while ((n = getline(&line, &cap, stdin)) > 0) {
            std::string l(line, line[n - 1] == '\n' ? n - 1 : n);
            if (l == "quit" || !command(l))
                break;
        }
        free(line);
    }

    // One command; false when its payload could not be read (the input is gone).
    bool command(const std::string &l)
    {
        char a[256], b[256];
        long x = 0, y = 0;
        if (sscanf(l.c_str(), "boot %255s %ld", a, &x) == 2) {
            runner_.bootstrap(a, std::to_string(x));
            probe(a, x);
        } else if (sscanf(l.c_str(), "listen %255s", a) == 1 && valid_name(a)) {
            listen(a);
        } else if (sscanf(l.c_str(), "get %255s", a) == 1 && valid_name(a)) {
            get(a);
        } else if (sscanf(l.c_str(), "put %255s %255s %ld %ld", a, b, &x, &y) == 4) {
            std::vector<uint8_t> data(y > 0 && (size_t)y <= kMaxValue ? (size_t)y : 0);
            if (y < 0 || (size_t)y > kMaxValue) {
                emit("error put of " + std::to_string(y) + " bytes");
                return false; // the stream cannot be resynchronised
            }
            if (y > 0 && fread(data.data(), 1, (size_t)y, stdin) != (size_t)y)
                return false;
            if (valid_name(a) && valid_name(b))
                put(a, b, x, std::move(data));
            else
                emit("error bad key or slot");
        } else {
            emit("error unknown command: " + l.substr(0, 80));
        }
        return true;
    }

    // Pings every IPv4 address HOST resolves to: `pong HOST PORT 1` once one answered, `... 0` when none did
    // (OpenDHT gives a ping three tries a second apart).
    void probe(const std::string &host, long port)
    {
        std::vector<dht::SockAddr> addrs;
        try {
            for (auto &sa : dht::SockAddr::resolve(host, std::to_string(port)))
                if (sa.getFamily() == AF_INET)
                    addrs.push_back(sa);
        } catch (const std::exception &) {
        }
        std::string tag = "pong " + host + " " + std::to_string(port);
        if (addrs.empty())
            emit(tag + " 0");
        else
            runner_.bootstrap(std::move(addrs), [tag](bool ok) { emit(tag + (ok ? " 1" : " 0")); });
    }

    void listen(const std::string &key)
    {
        if (listening_[key])
            return;
        listening_[key] = true;
        runner_.listen(dht::InfoHash::get(key), [key](const std::vector<std::shared_ptr<dht::Value>> &vals, bool expired) {
            for (const auto &v : vals)
                emit_value(key, v, expired);
            return true;
        });
    }

    void get(const std::string &key)
    {
        runner_.get(
            dht::InfoHash::get(key),
            [key](const std::vector<std::shared_ptr<dht::Value>> &vals) {
                for (const auto &v : vals)
                    emit_value(key, v, false);
                return true;
            },
            [key](bool ok) { emit("done " + key + (ok ? " 1" : " 0")); });
    }

    void put(const std::string &key, const std::string &slot, long ttl, std::vector<uint8_t> data)
    {
        int k = 0;
        while (k < kTypes - 1 && (1L << k) < ttl)
            k++;
        auto v = std::make_shared<dht::Value>(data.data(), data.size());
        v->type = kTypeBase + k;
        v->id = std::uniform_int_distribution<dht::Value::Id>{1}(rng_);
        auto h = dht::InfoHash::get(key);
        std::string tag = key + " " + slot;
        auto reported = std::make_shared<std::atomic<bool>>(false);
        runner_.put(
            h, v,
            [tag, reported](bool ok) {
                if (!reported->exchange(true))
                    emit("putdone " + tag + (ok ? " 1" : " 0"));
            },
            dht::time_point::max(), true);
        auto &old = published_[{key, slot}];
        if (old.id) {
            runner_.cancelPut(h, old.id); // its remote copies expire at their TTL
            if (!old.reported->exchange(true)) // a cancelled put never calls back: it is done, superseded
                emit("putdone " + tag + " 0");
        }
        old = Pub{v->id, reported};
    }
};

} // namespace

int main(int argc, char **argv)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL); // never outlive the parent
    signal(SIGPIPE, SIG_IGN);
    if (argc != 4) {
        fprintf(stderr, "usage: sepal-dht BIND_IPV4 PORT NETWORK_ID\n");
        return 2;
    }
    if (getppid() == 1) // the parent died before the death signal was armed
        return 1;
    Node node;
    return node.run(argv[1], atoi(argv[2]), (uint32_t)strtoul(argv[3], nullptr, 0));
}
