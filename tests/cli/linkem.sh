#!/usr/bin/env bash
# bench/linkem, the link emulator, through real sockets: the one-way delay and the rate measured through it (never
# below what was asked: a strict bound; above it only within a loose one, the machine is shared), the handshake's
# round trip, bytes identical both ways, half-close in order, backpressure with bounded memory, the connection cap,
# a dead target, bad options, and a clean exit on SIGTERM.
. "$(dirname "$0")/lib.bash"
L="$SEPAL_BIN_DIR/bench/linkem"

expect 2 "--listen without --to" "^linkem: --listen 127.0.0.1:0 has no --to$" -- "$L" --listen 127.0.0.1:0
expect 2 "a bad delay" "^linkem: --delay: expected a number or A/B, got '5/x'$" -- \
    "$L" --listen 127.0.0.1:0 --to 127.0.0.1:1 --delay 5/x
expect 2 "no link" "^linkem: give at least one --listen HOST:PORT --to HOST:PORT$" -- "$L" --delay 5
expect 0 "--help" "--rate MBIT\[/MBIT\]" -- "$L" --help
expect 2 "--from before --listen" "^linkem: --from comes after its --listen$" -- "$L" --from 127.0.0.2
expect 2 "--from a name" "^linkem: --from localhost: not an address$" -- \
    "$L" --listen 127.0.0.1:0 --to 127.0.0.1:1 --from localhost

python3 - "$L" "$TMP" <<'PY'
import hashlib, os, re, signal, socket, subprocess, sys, threading, time

linkem, tmp = sys.argv[1], sys.argv[2]
passed = failed = 0

def check(cond, what):
    global passed, failed
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    passed, failed = passed + bool(cond), failed + (not cond)

def listener():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    return s

def recv_all(c, n):
    b = bytearray()
    while len(b) < n:
        d = c.recv(min(1 << 20, n - len(b)))
        if not d:
            break
        b += d
    return bytes(b)

def recv_eof(c):
    b = bytearray()
    while True:
        d = c.recv(1 << 20)
        if not d:
            return bytes(b)
        b += d

def serve(s, fn):
    def loop():
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            threading.Thread(target=fn, args=(c,), daemon=True).start()
    threading.Thread(target=loop, daemon=True).start()

def echo(c):  # echoes until the peer's FIN, then closes (the half-close test reads the tail after its FIN)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        while True:
            d = c.recv(1 << 16)
            if not d:
                break
            c.sendall(d)
    except OSError:  # reset: linkem's SIGTERM
        pass
    c.close()

marks = {}
def sink(c):  # "PUT n": reads n bytes, notes when the last came, answers their sha256; "GET n seed": sends n bytes
    f = c.makefile("rb")
    cmd = f.readline().split()
    if not cmd:  # a connection the test only opens
        pass
    elif cmd[0] == b"PUT":
        data = f.read(int(cmd[1]))
        marks["put_done"] = time.monotonic()
        c.sendall(hashlib.sha256(data).hexdigest().encode())
    elif cmd[0] == b"GET":
        c.sendall(payload(int(cmd[1]), int(cmd[2])))
    elif cmd[0] == b"HOLD":  # reads nothing until told, then everything
        ev = holds[int(cmd[1])]
        ev.wait()
        data = f.read(int(cmd[2]))
        c.sendall(hashlib.sha256(data).hexdigest().encode())
    c.close()

holds = [threading.Event()]

def payload(n, seed):
    return (hashlib.sha256(str(seed).encode()).digest() * (n // 32 + 1))[:n]

echo_srv, sink_srv = listener(), listener()
serve(echo_srv, echo)
serve(sink_srv, sink)
dead = listener(); dead_port = dead.getsockname()[1]; dead.close()  # nothing listens there

args = [linkem,
        "--listen", "127.0.0.1:0", "--to", "127.0.0.1:%d" % echo_srv.getsockname()[1], "--delay", "40",
        "--listen", "127.0.0.1:0", "--to", "127.0.0.1:%d" % sink_srv.getsockname()[1], "--delay", "5/20",
        "--rate", "20/80",
        "--listen", "127.0.0.1:0", "--to", "127.0.0.1:%d" % sink_srv.getsockname()[1], "--delay", "5",
        "--buffer", "256", "--max-conns", "2",
        "--listen", "127.0.0.1:0", "--to", "127.0.0.1:%d" % dead_port,
        "--listen", "127.0.0.1:0", "--to", "127.0.0.1:%d" % echo_srv.getsockname()[1], "--delay", "30",
        "--from", "127.0.0.2", "--delay", "2"]
p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=open(os.path.join(tmp, "linkem.err"), "w"), text=True)
ports = []
for line in p.stdout:
    m = re.match(r"linkem: 127\.0\.0\.1:(\d+) -> ", line)
    if m:
        ports.append(int(m.group(1)))
    if line.startswith("linkem: ready"):
        break
check(len(ports) == 5 and all(ports), "five links listening on the ports they print: %s" % ports)

def conn(i):
    c = socket.create_connection(("127.0.0.1", ports[i]))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return c

# --- delay: the handshake's round trip, then 40 ms each way -------------------------------------------------
t0 = time.monotonic()
c = conn(0)
c.sendall(b"x" * 100)
first = recv_all(c, 100)
t_first = time.monotonic() - t0
rtts = []
for _ in range(5):
    t = time.monotonic()
    c.sendall(b"y" * 1000)
    recv_all(c, 1000)
    rtts.append(time.monotonic() - t)
rtt = min(rtts)
print("  first reply after %.1f ms (handshake + round trip), then round trips of %s ms" %
      (t_first * 1e3, " ".join("%.1f" % (r * 1e3) for r in rtts)))
check(first == b"x" * 100 and t_first >= 0.160, "the first reply comes 4 x 40 ms after the connect at the earliest (SYN, SYN-ACK, data, reply)")
check(all(r >= 0.080 for r in rtts), "no round trip under 2 x 40 ms")
check(rtt < 0.080 + 0.150, "round trips close to 80 ms (min %.1f ms)" % (rtt * 1e3))

# --- --from: the connections from 127.0.0.2 cross link 4 in 2 ms each way, the others in 30 ----------------------
def min_rtt(src):
    s = socket.socket()
    s.bind((src, 0))
    s.connect(("127.0.0.1", ports[4]))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out = []
    for _ in range(4):
        t = time.monotonic()
        s.sendall(b"z" * 100)
        recv_all(s, 100)
        out.append(time.monotonic() - t)
    s.close()
    return min(out)
near, far = min_rtt("127.0.0.2"), min_rtt("127.0.0.1")
print("  --from 127.0.0.2: round trip %.1f ms; from 127.0.0.1: %.1f ms" % (near * 1e3, far * 1e3))
check(far >= 0.060 and near >= 0.004, "no round trip under its path's 2 x 30 ms (others) or 2 x 2 ms (--from)")
check(near < 0.060, "the connections from 127.0.0.2 take the --from path (%.1f ms < 60)" % (near * 1e3))

# --- half-close: data, FIN; the echo's data, then its FIN --------------------------------------------------
data = payload(300000, 1)
c.sendall(data)
c.shutdown(socket.SHUT_WR)
back = recv_eof(c)
check(back == data, "half-close: everything sent before the FIN comes back, then EOF (%d bytes)" % len(back))
c.close()

# --- rate and bytes: 2 MB toward at 20 Mbit/s, 4 MB back at 80 Mbit/s ---------------------------------------
n_up, n_down = 2000000, 4000000
c = conn(1)
time.sleep(0.05)  # past the handshake's 15 ms
data = payload(n_up, 2)
t = time.monotonic()
c.sendall(b"PUT %d\n" % n_up + data)
digest = recv_all(c, 64)
up_s = marks["put_done"] - t
c.close()
want_up = (n_up + 12) * 8 / 20e6
print("  %d bytes toward in %.3f s: %.1f Mbit/s (link 20 Mbit/s, 5 ms)" % (n_up, up_s, n_up * 8 / up_s / 1e6))
check(digest == hashlib.sha256(data).hexdigest().encode(), "2 MB toward --to arrive identical")
check(up_s >= want_up + 0.005, "toward: never faster than 20 Mbit/s + 5 ms (%.3f s >= %.3f s)" % (up_s, want_up + 0.005))
check(up_s < 3 * want_up, "toward: close to 20 Mbit/s")
c = conn(1)
time.sleep(0.05)
t = time.monotonic()
c.sendall(b"GET %d 3\n" % n_down)
got = recv_all(c, n_down)
down_s = time.monotonic() - t
c.close()
want_down = 0.005 + n_down * 8 / 80e6 + 0.020
print("  %d bytes back in %.3f s: %.1f Mbit/s (link 80 Mbit/s, 20 ms)" % (n_down, down_s, n_down * 8 / down_s / 1e6))
check(got == payload(n_down, 3), "4 MB back arrive identical")
check(down_s >= want_down, "back: never faster than 80 Mbit/s + the round trip (%.3f s >= %.3f s)" % (down_s, want_down))
check(down_s < 3 * want_down, "back: close to 80 Mbit/s")

# --- backpressure: a receiver that does not read; linkem holds at most --buffer (256 KiB) a direction ---------
def rss(pid):
    for line in open("/proc/%d/status" % pid):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
before = rss(p.pid)
n_hold = 32 << 20
c = conn(2)
data = payload(n_hold, 4)
sent = [0]
def push():
    try:
        c.sendall(b"HOLD 0 %d\n" % n_hold + data)
        sent[0] = 1
    except OSError:
        pass
th = threading.Thread(target=push, daemon=True)
th.start()
time.sleep(1.0)
during = rss(p.pid)
check(not sent[0], "the sender is held back while nobody reads (backpressure)")
check(during - before < 8 << 20, "linkem's memory stays bounded: %+.1f MB while 32 MB wait" % ((during - before) / 1e6))
holds[0].set()
digest = recv_all(c, 64)
th.join(10)
check(sent[0] and digest == hashlib.sha256(data).hexdigest().encode(), "then all 32 MB arrive, identical")
c.close()

# --- the connection cap (2) and a target nobody listens on ----------------------------------------------------
def closed(i):  # a connection through link i that the other end closes (or resets) without a byte
    x = conn(i)
    x.settimeout(5)
    try:
        r = x.recv(1)
    except OSError:
        r = b""
    x.close()
    return r == b""

held = [conn(2), conn(2)]
time.sleep(0.2)
check(closed(2), "a third connection over --max-conns 2 is closed at once")
for h in held:
    h.close()
check(closed(3), "a connection to a target nobody listens on is closed")

# --- many at once ---------------------------------------------------------------------------------------------
res = []
def one(k):
    s = conn(0)
    m = payload(5000, 100 + k)
    s.sendall(m)
    res.append(recv_all(s, 5000) == m)
    s.close()
ths = [threading.Thread(target=one, args=(k,)) for k in range(40)]
[t.start() for t in ths]
[t.join(20) for t in ths]
check(len(res) == 40 and all(res), "40 connections at once through one link, each echoed identically")

# --- SIGTERM ----------------------------------------------------------------------------------------------------
held = conn(0)
t = time.monotonic()
p.send_signal(signal.SIGTERM)
rc = p.wait(10)
check(rc == 0 and time.monotonic() - t < 2, "SIGTERM: exit 0 at once, with a connection open (rc %d)" % rc)
err = open(os.path.join(tmp, "linkem.err")).read()
check(re.search(r"^linkem: 127\.0\.0\.1:0 -> 127\.0\.0\.1:\d+: 4[0-9] connections \(0 refused, 0 failed to connect\), "
                r"\d+ bytes toward, \d+ back$", err, re.M) is not None, "its counts on stderr")
check(re.search(r"1 connections \(0 refused, 1 failed to connect\)", err) is not None, "the dead target counted")
check(re.search(r"\(1 refused, 0 failed to connect\)", err) is not None, "the refused connection counted")
check(re.search(r"^linkem:   from 127\.0\.0\.2: 1 connections, 400 bytes toward, 400 back$", err, re.M) is not None,
      "the --from path's counts")
held.close()
print("PY %d %d" % (passed, failed))
sys.exit(1 if failed else 0)
PY
rc=$?
[ $rc -eq 0 ] && ok "linkem through real sockets" || bad "linkem through real sockets"
finish
