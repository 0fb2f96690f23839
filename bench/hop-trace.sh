#!/usr/bin/env bash
# hop-trace.sh - where a swarm token's time goes: builds sepal and sepal-server with timestamps at each hand-off of
# a decode step (-DSEPAL_HOP_TRACE=ON, common/trace.h; into build-trace, Release, no CUDA), runs one `sepal -c`
# session as bench/swarm.sh does (load stories15M, `swarm up N`, a warm-up, then R pairs of `generate` through the
# swarm and `model generate` in one process, default settings), and prints the medians (and quartiles) of each
# stretch of a swarm token's decode steps, the prompt's steps and the first 5 left out:
#   client step -> send          embedding and the step's encoding
#   send -> server message       the request's way to the first server's on_message (one cross-process wake-up)
#   message -> compute           to the step's blocks: through a worker (worker pop) or inline on the transport
#   compute                      the server's blocks (a pass of the batched decode, or a step alone)
#   computed -> client reply     encoding, the reply's way back, the client's decoding
#   hops -> head                 the client's head (and its argmax)
#   token                        from one step's start to the next's
# and the one process's blocks, head and token beside them. With N > 1 servers the stretches are the first hop's.
# --scale runs bench/scale.sh's case 1 instead (the Llama-2-7B shape, 8 layers, int8, servers of --spans LIST,
# default "0:3 3:6 6:8"; --tokens default 48 there) and prints bench/hop-trace-hops.py's account: every hop's
# stretches, each server's blocks one by one beside the one process's, and its pool's wake-ups and contended spells.
# --wan runs bench/wan.sh instead (the same model and servers behind bench/linkem links: client 25 ms away, or
# --delays LIST, servers 5 ms apart; push on, push off and one process in turns) and prints bench/hop-trace-chain.py's
# timeline of a pushed and of a client-driven step across the client and the servers (every event's median offset
# from the step's start), then hop-trace-hops.py's blocks one by one.
#
# usage: bench/hop-trace.sh [--servers N] [--reps R] [--tokens T] [--build DIR] [--scale [--spans LIST]]
#        [--wan [--delays LIST]]   (defaults 1, 3, 200, build-trace)
# Exit status: 0 after a run, 1 when the build or the session fails.
set -euo pipefail
cd "$(dirname "$0")/.."

n=1 reps=3 tokens="" build=build-trace scale=0 wan=0 delays=25 spans="0:3 3:6 6:8"
while [ $# -gt 0 ]; do
    case "$1" in
    --scale) scale=1; shift ;;
    --wan) wan=1; shift ;;
    --delays) delays="$2"; shift 2 ;;
    --spans) spans="$2"; shift 2 ;;
    --servers) n="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --tokens) tokens="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "hop-trace: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
die() { echo "hop-trace: $*" >&2; exit 1; }
for v in $(env | sed -n 's/^\(SEPAL_[A-Z_]*\|OPENBLAS_[A-Z_]*\|OMP_[A-Z_]*\|GOTO_[A-Z_]*\)=.*/\1/p'); do
    [ "$v" = SEPAL_CACHE ] || unset "$v"
done

mkdir -p "$build"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DSEPAL_SANITIZE=OFF -DSEPAL_CUDA=OFF -DSEPAL_HOP_TRACE=ON \
    >"$build/configure.log" 2>&1 || { cat "$build/configure.log" >&2; die "configure failed"; }
cmake --build "$build" -j"$(nproc)" --target sepal sepal-server linkem >"$build/build.log" 2>&1 ||
    { tail -30 "$build/build.log" >&2; die "build failed"; }
sepal="$build/app/sepal"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if [ "$wan" = 1 ]; then
    SEPAL_TRACE_DIR="$tmp" bench/wan.sh --build "$build" --reps "$reps" --tokens "${tokens:-32}" --delays "$delays" ||
        die "bench/wan.sh failed"
    python3 bench/hop-trace-chain.py "$tmp"
    python3 bench/hop-trace-hops.py "$tmp" | sed -n '/^blocks/,$p'
    exit
fi
if [ "$scale" = 1 ]; then
    SEPAL_TRACE_DIR="$tmp" bench/scale.sh --case 1 --build "$build" --reps "$reps" --tokens "${tokens:-48}" \
        --spans "$spans" || die "bench/scale.sh failed"
    python3 bench/hop-trace-hops.py "$tmp"
    exit
fi
tokens="${tokens:-200}"
model="$(scripts/fetch-model.sh "$sepal" | tail -1)" || die "scripts/fetch-model.sh failed"
export SEPAL_SERVER_BIN="$build/server/sepal-server"
gen="generate 'Once upon a time' --max-new-tokens $tokens --ignore-eos"
one="model generate $model --prompt 'Once upon a time' --max-new-tokens $tokens --ignore-eos"
script="load $model; swarm up $n; $gen"
for _ in $(seq 1 "$reps"); do script="$script; $gen; $one"; done
echo "hop-trace: $n server(s), $reps pairs of $tokens tokens, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo |
    head -1), $(getconf _NPROCESSORS_ONLN) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
SEPAL_TRACE_DIR="$tmp" "$sepal" -c "$script" >"$tmp/out" 2>"$tmp/err" || { tail -20 "$tmp/err" >&2; die "the session failed"; }
python3 - "$tmp" <<'EOF'
import glob, statistics, sys
ev = []
for f in glob.glob(sys.argv[1] + "/trace-*.txt"):
    for line in open(f):
        t, ns = line.split()
        ev.append((int(ns), int(t)))
ev.sort()
steps, cur = [], None
for ns, t in ev:  # a swarm step: tag 1, then the first of each later tag (the server's only after the send)
    if t == 1:
        if cur and all(k in cur for k in (1, 2, 3, 4, 5, 11, 12, 13)):
            steps.append(cur)
        cur = {1: ns}
    elif cur is not None and t not in cur and t < 20 and (t < 10 or 2 in cur):
        cur[t] = ns
steps = steps[5:]
one, c = [], None
for ns, t in ev:
    if t == 21:
        c = {21: ns}
    elif c is not None and t in (22, 23):
        c[t] = ns
        if t == 23 and 22 in c:
            one.append(c)
            c = None
one = one[5:]
def show(name, v):
    if not v:
        return
    v = sorted(v)
    print("  %-28s median %8.1f us   p25 %8.1f   p75 %8.1f   (%d)" % (name, statistics.median(v), v[len(v) // 4], v[3 * len(v) // 4], len(v)))
def d(a, b, rows):
    return [(r[b] - r[a]) / 1e3 for r in rows if a in r and b in r and r[b] >= r[a]]
print("swarm (%d steps: %d through a worker, %d inline):" % (len(steps), sum(16 in r for r in steps), sum(17 in r for r in steps)))
show("client step -> send", d(1, 2, steps))
show("send -> server message", d(2, 11, steps))
show("message -> compute", d(11, 12, steps))
show("compute", d(12, 13, steps))
show("computed -> client reply", d(13, 3, steps))
show("hops -> head", d(6, 4, steps))
show("token", [(steps[k + 1][1] - steps[k][1]) / 1e3 for k in range(len(steps) - 1) if steps[k + 1][1] - steps[k][1] < 2e7])
print("one process (%d steps):" % len(one))
show("blocks", d(21, 22, one))
show("head", d(22, 23, one))
show("token", [(one[k + 1][21] - one[k][21]) / 1e3 for k in range(len(one) - 1) if one[k + 1][21] - one[k][21] < 2e7])
EOF
