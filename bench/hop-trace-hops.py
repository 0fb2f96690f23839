#!/usr/bin/env python3
# hop-trace-hops.py DIR - where a client-driven swarm token goes, hop by hop, from the trace files a
# -DSEPAL_HOP_TRACE=ON build wrote to DIR (common/trace.h): one client (the file with swarm steps, tag 1) and any
# number of servers. Each decode step's hop j is the client's j-th send (tag 2) and reply (3); its server is the one
# whose message (11) follows that send first. Prints the medians and quartiles of each stretch of each hop, the
# servers' blocks one by one (30/31 inside their compute, 12/13) beside the one process's (inside 21/22), and how
# often a pool's job had to wake sleeping workers (32) or a pool found the machine contended (33). The first 3 steps
# of the trace are left out (the prompt, warm-up). bench/hop-trace.sh --scale runs it.
import bisect
import glob
import statistics
import sys


def load(d):
    files = {}
    for f in glob.glob(d + "/trace-*.txt"):
        ev = []
        for line in open(f):
            t, ns = line.split()
            ev.append((int(ns), int(t)))
        ev.sort()
        files[f] = ev
    return files


def show(name, v, unit="us"):
    if not v:
        return
    v = sorted(v)
    print("  %-36s median %9.1f %s  p25 %9.1f  p75 %9.1f  (%d)" % (name, statistics.median(v), unit, v[len(v) // 4],
                                                                    v[3 * len(v) // 4], len(v)))


def client_steps(ev):
    steps, cur = [], None
    for ns, t in ev:
        if t == 1:
            if cur and 4 in cur:
                steps.append(cur)
            cur = {1: ns, 2: [], 3: []}
        elif cur is not None:
            if t in (2, 3):
                cur[t].append(ns)
            elif t not in cur:
                cur[t] = ns
    for k in range(len(steps) - 1):
        steps[k]['next'] = steps[k + 1][1]
    return [s for s in steps if s[2] and len(s[2]) == len(s[3])][3:]


def first_after(ev, idx, ns, tag, limit):
    i = bisect.bisect_left(idx, ns)
    while i < len(ev) and ev[i][0] <= limit:
        if ev[i][1] == tag:
            return ev[i][0]
        i += 1
    return None


def hops(files, client, steps):
    servers = [f for f in files if f != client]
    cev = files[client]
    cidx = [ns for ns, _ in cev]
    idx = {f: [ns for ns, _ in files[f]] for f in servers}
    res, order = {}, []

    def add(k, v):
        if k not in res:
            order.append(k)
        res.setdefault(k, []).append(v / 1e3)
    for s in steps:
        n = len(s[2])
        for j in range(n):
            snd, rep = s[2][j], s[3][j]
            best = None
            for f in servers:
                m = first_after(files[f], idx[f], snd, 11, rep)
                if m and (best is None or m < best[0]):
                    best = (m, f)
            if not best:
                continue
            m, f = best
            ev, ix = files[f], idx[f]
            w = first_after(ev, ix, m, 16, rep)
            c0 = first_after(ev, ix, m, 12, rep)
            c1 = first_after(ev, ix, m, 13, rep)
            e0 = first_after(ev, ix, c1 or m, 14, rep)
            wr = first_after(cev, cidx, snd, 7, rep)
            rd = first_after(cev, cidx, snd, 8, rep + 1)
            wk = first_after(ev0, idx[f], wr or snd, 10, m) if (ev0 := files[f]) else None
            if wr:
                add("hop %d: send -> written" % j, wr - snd)
            if wk:
                add("hop %d: written -> server's poll" % j, wk - (wr or snd))
                add("hop %d: server's poll -> message" % j, m - wk)
            add("hop %d: send -> server's message" % j, m - snd)
            if w:
                add("hop %d: message -> worker" % j, w - m)
            if c0:
                add("hop %d: worker -> compute" % j, c0 - (w or m))
            if c0 and c1:
                add("hop %d: compute" % j, c1 - c0)
            if c1 and e0:
                add("hop %d: computed -> reply sent" % j, e0 - c1)
            if e0:
                add("hop %d: reply sent -> client's" % j, rep - e0)
            if e0 and rd and rd >= e0:
                add("hop %d: reply sent -> client read it" % j, rd - e0)
                add("hop %d: client read -> decoded" % j, rep - rd)
            if j + 1 < n:
                add("hop %d: client's reply -> next send" % j, s[2][j + 1] - rep)
            if c0 and c1:
                add("hop %d: all but the compute" % j, rep - snd - (c1 - c0))
        add("client: step -> first send", s[2][0] - s[1])
        add("client: last reply -> head done", s[4] - s[3][-1])
        if 'next' in s and s['next'] - s[1] < 2e8:
            add("client: head done -> next step", s['next'] - s[4])
            add("token", s['next'] - s[1])
    print("swarm (%d decode steps of %d hops):" % (len(steps), len(steps[0][2]) if steps else 0))
    for k in order:
        show(k, res[k])


def windows(ev, a, b):
    """per window a..b: the blocks' durations (30..31 inside), the pool wakes (32) in it"""
    out, cur, b0 = [], None, None
    for ns, t in ev:
        if t == a:
            cur, b0 = {'t0': ns, 'b': [], 'w': 0}, None
        elif cur is None:
            continue
        elif t == 30:
            b0 = ns
        elif t == 31 and b0:
            cur['b'].append(ns - b0)
            b0 = None
        elif t == 32:
            cur['w'] += 1
        elif t == b:
            cur['dur'] = ns - cur['t0']
            out.append(cur)
            cur = None
    return out


def blocks(name, ws, ev):
    ws = [w for w in ws[3:] if w['b']]
    if not ws:
        return
    n = statistics.mode(len(w['b']) for w in ws)
    ws = [w for w in ws if len(w['b']) == n]
    per = " ".join("%.2f" % (statistics.median(w['b'][k] for w in ws) / 1e6) for k in range(n))
    print("  %-14s %3d steps: %.2f ms (blocks %s ms); pool wakes a step %.1f; contended %d times" % (
        name, len(ws), statistics.median(w['dur'] for w in ws) / 1e6, per, statistics.mean(w['w'] for w in ws),
        sum(t == 33 for _, t in ev)))


def the_client(files, d, name):
    """the one trace file with swarm steps (tag 1): the client's; else the script ends saying so"""
    clients = [f for f, ev in files.items() if any(t == 1 for _, t in ev)]
    if len(clients) != 1:
        sys.exit("%s: expected one client's trace in %s, found %d" % (name, d, len(clients)))
    return clients[0]


def main():
    files = load(sys.argv[1])
    client = the_client(files, sys.argv[1], "hop-trace-hops")
    hops(files, client, client_steps(files[client]))
    print("blocks (medians; one process: sp_model_forward_argmax's, a server: its step's):")
    blocks("one process", windows(files[client], 21, 22), files[client])
    for k, f in enumerate(sorted((f for f in files if f != client),
                                 key=lambda f: next((ns for ns, t in files[f] if t == 12), 0))):
        blocks("server %d" % (k + 1), windows(files[f], 12, 13), files[f])
    one = [w for w in windows(files[client], 21, 23)][3:]
    show("one process: token's blocks + head", [w['dur'] / 1e3 for w in one])


if __name__ == "__main__":
    main()
