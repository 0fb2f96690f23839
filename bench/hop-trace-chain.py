#!/usr/bin/env python3
# hop-trace-chain.py DIR - a decode step's timeline across the client and every server, from the trace files a
# -DSEPAL_HOP_TRACE=ON build wrote to DIR (common/trace.h): for each of the client's swarm steps (tag 1 .. its head,
# tag 4), every event of every process inside it, as the offset from the step's start; steps are grouped into
# pushed ones (a server pushed: tag 18) and client-driven ones, and each (process, tag, n-th occurrence) gets its
# median offset over the group's steps (the first 3 steps of each group left out). Servers are numbered by when
# they first finish a compute in a step. The timeline shows where a token's time goes over links with delays
# (bench/wan.sh's WAN: bench/hop-trace.sh --wan runs it).
import importlib.util
import os
import statistics
import sys

# the trace files' reader and the client's file: hop-trace-hops.py's
_spec = importlib.util.spec_from_file_location("hop_trace_hops", os.path.join(os.path.dirname(os.path.abspath(
    __file__)), "hop-trace-hops.py"))
_hops = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_hops)
load = _hops.load

NAMES = {1: "step", 2: "send", 3: "reply decoded", 4: "head done", 5: "hops", 6: "hops done", 7: "written",
         8: "read", 10: "bulk poll woke", 11: "message", 12: "compute", 13: "computed", 14: "reply handed",
         15: "reply sent", 16: "worker took", 17: "inline", 18: "push", 19: "push acked", 30: None, 31: None,
         32: "pool wake", 33: "contended"}


def timeline(kind, rows, files, client, servers):
    """each (process, tag, n-th occurrence)'s median offset from the step's start over rows, in time order"""
    # servers numbered by when they first finish computing in the step (the median over steps; an awaiting step
    # marks a compute when its request comes, before its input)
    def first_compute(f):
        v = [next((o for o, t in ev[f] if t == 13), 1e18) for _, ev in rows]
        return statistics.median(v)
    order = sorted(servers, key=first_compute)
    label = {client: "client"}
    label.update({f: "server %d" % (k + 1) for k, f in enumerate(order)})
    acc = {}
    for _, ev in rows:
        for f in files:
            seen = {}
            for o, t in ev[f]:
                n = seen.get(t, 0)
                seen[t] = n + 1
                acc.setdefault((f, t, n), []).append(o)
    line = []
    for (f, t, n), v in acc.items():
        if len(v) < len(rows) // 2 or (t in (32, 33) and n > 0):
            continue
        line.append((statistics.median(v), label[f], NAMES[t] + ("" if n == 0 else " #%d" % (n + 1)), len(v)))
    line.sort()
    print("%s (%d steps), step median %.2f ms:" % (kind, len(rows), statistics.median(d for d, _ in rows) / 1e6))
    prev = 0
    for o, who, what, cnt in line:
        print("  %9.2f ms (+%7.2f)  %-9s %-22s (%d)" % (o / 1e6, (o - prev) / 1e6, who, what, cnt))
        prev = o


def main():
    files = load(sys.argv[1])
    client = _hops.the_client(files, sys.argv[1], "hop-trace-chain")
    servers = [f for f in files if f != client]
    steps = []
    cur = None
    for ns, t in files[client]:
        if t == 1:
            cur = ns
        elif t == 4 and cur is not None:
            steps.append((cur, ns))
            cur = None
    groups = {"pushed": [], "client-driven": []}
    gaps = {"pushed": [], "client-driven": []}
    for k, (a, b) in enumerate(steps):
        ev = {f: [(ns - a, t) for ns, t in files[f] if a <= ns <= b and NAMES.get(t)] for f in files}
        if not any(ev[f] for f in servers):
            continue
        kind = "pushed" if any(t == 18 for f in servers for _, t in ev[f]) else "client-driven"
        groups[kind].append((b - a, ev))
        if k + 1 < len(steps) and steps[k + 1][0] - b < 1e9:  # head done -> the next step (same generation)
            gaps[kind].append((steps[k + 1][0] - b) / 1e6)
    for kind, rows in groups.items():
        rows = rows[3:]
        if not rows:
            continue
        d = sorted(r[0] / 1e6 for r in rows)
        print("%s steps: %d, step (tag 1 -> head done) mean %.2f ms, p10 %.2f, p50 %.2f, p90 %.2f, max %.2f" % (
            kind, len(d), statistics.mean(d), d[len(d) // 10], d[len(d) // 2], d[9 * len(d) // 10], d[-1]))
        if gaps[kind]:
            print("  head done -> next step: mean %.2f ms, max %.2f" % (statistics.mean(gaps[kind]), max(gaps[kind])))
        timeline(kind + ": all steps", rows, files, client, servers)
        slow = sorted(rows, key=lambda r: r[0])[9 * len(rows) // 10:]
        if len(slow) >= 3:
            timeline(kind + ": the slowest tenth", slow, files, client, servers)
    # the one process
    one, c = [], None
    for ns, t in files[client]:
        if t == 21:
            c = ns
        elif t == 23 and c is not None:
            one.append(ns - c)
            c = None
    if one[3:]:
        print("one process: blocks + head median %.2f ms (%d tokens)" % (statistics.median(one[3:]) / 1e6,
                                                                         len(one[3:])))


if __name__ == "__main__":
    main()
