#!/usr/bin/env bash
# Ctrl-C stops the work, not the program: the real binary in tmux (a private socket) with a real local swarm.
# During a generation, a training run and `swarm up` the prompt comes back (how fast is printed), the swarm stays
# usable (`servers`, the same greedy text as before), `swarm up` stops the servers it started; at the prompt
# Ctrl-C clears the line; two Ctrl-C at once leave at once with the history saved; the terminal's settings are
# the same before and after; no server is left behind. A -c script gets SIGINT: exit 130, no server left.
. "$(dirname "$0")/lib.bash"
M="${SEPAL_STORIES15M_DIR:?}"
if ! command -v tmux >/dev/null; then
    echo "tmux not found: skipped"
    finish
fi
if [ ! -f "$M/model.safetensors" ]; then
    bad "$M: no converted stories15M; run scripts/fetch-model.sh first"
    finish
fi
BASE="sepal-ctrlc-$$"
SOCK="$BASE"
SOCKDIR="${TMUX_TMPDIR:-/tmp}/tmux-$(id -u)"
cleanup() {
    local s
    for s in "$BASE" "$BASE-2"; do
        tmux -L "$s" kill-server 2>/dev/null
        rm -f "$SOCKDIR/$s"
    done
    [ -n "${BGPID:-}" ] && kill -9 "$BGPID" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT
export SEPAL_SERVER_BIN="$SEPAL_BIN_DIR/server/sepal-server"
# a server that takes a second to start, so that a Ctrl-C can meet `swarm up` in the middle
cat > "$TMP/slow-server" <<EOF
#!/bin/sh
sleep 1
exec "$SEPAL_SERVER_BIN" "\$@"
EOF
chmod +x "$TMP/slow-server"

pane() { tmux -L "$SOCK" capture-pane -p -S -400 2>/dev/null; }
keys() { tmux -L "$SOCK" send-keys "$@"; }
# wait_for PATTERN [SECONDS]: polls the pane (scrollback included)
wait_for() {
    local i n=$(( ${2:-20} * 20 ))
    for i in $(seq "$n"); do
        pane | grep -qE -- "$1" && return 0
        sleep 0.05
    done
    return 1
}
check() { if wait_for "$2" "${3:-20}"; then ok "$1"; else bad "$1: pane lacks /$2/"; pane | grep -v "^$" | tail -8 | sed "s/^/    /"; fi; }
# the last line of the pane that is not empty
last_line() { pane | grep -v '^$' | tail -1; }
# prompt_within SECONDS: the prompt is the last line again, with nothing typed after it
prompt_within() {
    local i n=$(( $1 * 20 ))
    for i in $(seq "$n"); do
        [ "$(last_line)" = "sepal>" ] && return 0
        sleep 0.05
    done
    return 1
}
# prompt_back WHAT T0: after a Ctrl-C sent at T0 (date +%s.%N) the prompt is back, polled for up to 30 s (a hang's
# bound, no timing threshold: the seconds it took are printed; the "stopped after" checks that follow show that
# the work was cut short, not finished)
prompt_back() {
    if prompt_within 30; then
        ok "$1: the prompt is back ($(awk "BEGIN { printf \"%.2f\", $(date +%s.%N) - $2 }") s after Ctrl-C)"
    else
        bad "$1: no prompt"
        pane | tail -5 | sed 's/^/    /'
    fi
}
# the sepal of this test's pane (a child of the pane's shell: other suites may run a `sepal --repl` beside it)
sepal_pid() { pgrep -P "$(tmux -L "$SOCK" display -p '#{pane_pid}')" -f -- "--repl" | head -1; }
servers_of() { pgrep -P "$1" -f sepal-server | wc -l; }

tmux -L "$SOCK" new-session -d -x 160 -y 50 \
    "stty -g > $TMP/stty.before; env SEPAL_HISTORY=$TMP/hist SEPAL_SERVER_BIN=$TMP/slow-server LANG=C.UTF-8 $SEPAL --repl; echo \"[exit \$?]\"; stty -g > $TMP/stty.after; sleep 60"
check "prompt" "^sepal> ?$"
keys "load $M; swarm up 3" Enter
check "swarm up" "^3 servers: blocks" 60
PID=$(sepal_pid)
[ -n "$PID" ] && [ "$(servers_of "$PID")" -eq 3 ] && ok "3 servers run" || bad "3 servers run (pid $PID: $(servers_of "$PID"))"

# the greedy text before any Ctrl-C
keys "generate 'Tom had a red kite' --greedy --max-new-tokens 30" Enter
check "greedy generation" "stop: length" 30
before=$(pane | grep -A1 -m1 '^sepal> generate .Tom had a red kite' | tail -1)

# Ctrl-C during a long generation
keys C-l
# (--ignore-eos: a sampled story may end in half a second; the prompt shows with the first token)
keys "generate 'Once upon a time' --temperature 0.9 --max-new-tokens 250 --ignore-eos" Enter
wait_for "^Once upon a time" 20
sleep 0.1
t0=$(date +%s.%N)
keys C-c
prompt_back generation "$t0"
check "generation: it says how many tokens it kept" "^\^C \(stopped after [0-9]+ tokens?\)"
keys "servers" Enter
sleep 0.5
n=$(pane | grep -cE '^[0-9a-f]{8} local .* online ')
[ "$n" -eq 3 ] && ok "servers: the swarm is intact" || bad "servers: $n of 3 online"
keys C-l
keys "generate 'Tom had a red kite' --greedy --max-new-tokens 30" Enter
check "greedy again" "stop: length" 30
after=$(pane | grep -A1 -m1 '^sepal> generate .Tom had a red kite' | tail -1)
[ -n "$before" ] && [ "$before" = "$after" ] && ok "the same greedy text as before the Ctrl-C" || bad "greedy text changed: '$before' vs '$after'"

# Ctrl-C during training: the step in flight finishes (a step of this model takes well under a second), the
# run stops after it, and --save writes what was trained; the file is a valid one (eval --load reads it)
keys C-l
keys "train sst2 --tuning deep_ptune --max-steps 500 --epochs 1 --save $TMP/ctrlc.safetensors" Enter
check "training runs" "step 2/" 60
t0=$(date +%s.%N)
keys C-c
prompt_back training "$t0"
check "training: stopped after the step in flight" "^\^C \(stopped after step [0-9]+ of [0-9]+\)$"
done_steps=$(pane | grep -oE '^\^C \(stopped after step [0-9]+' | tail -1 | grep -oE '[0-9]+$')
last_step=$(pane | grep -oE '^epoch 1 step [0-9]+/' | tail -1 | grep -oE '[0-9]+/' | tr -d /)
[ -n "$done_steps" ] && [ "$done_steps" = "$last_step" ] &&
    ok "training: every step begun was applied and shown ($done_steps)" ||
    bad "training: stopped after '$done_steps', last step shown '$last_step'"
check "training: --save says what it saved" \
    "^saved the parameters after ${done_steps:-X} steps? to $TMP/ctrlc\.safetensors$"
keys C-l
keys "eval --load $TMP/ctrlc.safetensors --eval-batches 1" Enter
check "training: the saved file is valid (eval --load reads it)" "^sst2: accuracy=[0-9.]+ " 60
prompt_within 5 || bad "eval --load: no prompt"

# Ctrl-C during eval: the prompt is back, it says how far validation went
keys C-l
keys "eval sst2 --tuning deep_ptune" Enter
check "eval runs" "validation: [0-9]+/[0-9]{2,} batches" 60
t0=$(date +%s.%N)
keys C-c
prompt_back eval "$t0"
check "eval: it says how far it went" "^\^C \(validation stopped after [0-9]+ of [0-9]+ batches\)$"
keys "servers" Enter
sleep 0.5
n=$(pane | grep -cE '^[0-9a-f]{8} local .* online ')
[ "$n" -ge 3 ] && ok "servers after training's Ctrl-C" || bad "servers after training's Ctrl-C: $n online"

# at the prompt: Ctrl-C clears the line
keys C-l
keys "echo this should not run"
sleep 0.2
keys C-c
sleep 0.2
keys Enter
sleep 0.3
pane | grep -q '^this should not run' && bad "Ctrl-C at the prompt did not clear the line" || ok "Ctrl-C at the prompt clears the line"

# Ctrl-C during swarm up: the servers it started stop
keys "swarm down" Enter
sleep 1
keys C-l
keys "set blocks-per-server 2; swarm up 3" Enter
sleep 0.3
keys C-c
prompt_within 3 && ok "swarm up: the prompt is back" || bad "swarm up: no prompt"
sleep 0.5
[ "$(servers_of "$PID")" -eq 0 ] && ok "swarm up: no server left running" || bad "swarm up: $(servers_of "$PID") servers left"
keys "swarm up 3" Enter
check "a swarm comes up again" "^3 servers: blocks" 60

# quit: servers stop, the terminal is restored
keys C-l
keys "quit" Enter
check "quit" "^\[exit 0\]$" 20
sleep 1
[ "$(servers_of "$PID")" -eq 0 ] && ok "no server left after quit" || bad "servers left after quit"
sleep 0.3
if [ -s "$TMP/stty.before" ] && cmp -s "$TMP/stty.before" "$TMP/stty.after"; then ok "stty -g is the same"; else bad "stty -g changed"; fi
tmux -L "$SOCK" kill-server 2>/dev/null
SOCK="$BASE-2" # a fresh server: the old one may still be going away ("server exited unexpectedly")

# two Ctrl-C at once: leave at once, history saved
rm -f "$TMP/stty.before" "$TMP/stty.after"
tmux -L "$SOCK" new-session -d -x 160 -y 50 \
    "stty -g > $TMP/stty.before; env SEPAL_HISTORY=$TMP/hist2 LANG=C.UTF-8 $SEPAL --repl; echo \"[exit \$?]\"; stty -g > $TMP/stty.after; sleep 60"
check "prompt (2)" "^sepal> ?$"
keys "load $M; swarm up 2" Enter
check "swarm up (2)" "^2 servers: blocks" 60
PID=$(sepal_pid)
# a command slow to honour a Ctrl-C: connecting to a server that accepts TCP but never answers (stopped)
"$SEPAL_SERVER_BIN" --model "$M" --blocks 0:6 --no-measure > "$TMP/hung.out" 2>&1 &
HUNG=$!
for i in $(seq 200); do grep -q "^sepal-server: serving" "$TMP/hung.out" && break; sleep 0.05; done
HPORT=$(grep -o 'ws://127.0.0.1:[0-9]*' "$TMP/hung.out" | cut -d: -f3)
kill -STOP "$HUNG"
keys "connect 127.0.0.1:$HPORT" Enter
sleep 0.5
keys C-c
sleep 0.3
keys C-c
check "two Ctrl-C: it leaves at once" "^\[exit 130\]$" 3
sleep 1
grep -q "connect 127.0.0.1:$HPORT" "$TMP/hist2" 2>/dev/null && ok "history saved" || bad "history not saved"
[ -n "$PID" ] && [ "$(pgrep -P "$PID" | wc -l)" -eq 0 ] && ! kill -0 "$PID" 2>/dev/null && ok "process and servers gone" || bad "left behind"
sleep 1
if pgrep -f "sepal-server --model $M --num-blocks" | xargs -r ps -o ppid= -p | grep -q "^ *1$"; then
    bad "an orphaned sepal-server runs"
else
    ok "no orphaned server"
fi
if [ -s "$TMP/stty.before" ] && cmp -s "$TMP/stty.before" "$TMP/stty.after"; then ok "stty -g is the same (2)"; else bad "stty -g changed (2)"; fi
tmux -L "$SOCK" kill-server 2>/dev/null
kill -CONT "$HUNG"; kill -9 "$HUNG"; wait "$HUNG" 2>/dev/null

# a -c script: SIGINT stops it, its servers stop, exit 130
"$SEPAL" -c "load $M; swarm up 2; sleep 60" > "$TMP/out" 2>&1 &
BGPID=$!
for i in $(seq 200); do grep -q "^2 servers" "$TMP/out" && break; sleep 0.05; done
kids=$(pgrep -P "$BGPID" -f sepal-server | tr '\n' ' ')
kill -INT "$BGPID"
wait "$BGPID"
rc=$?
BGPID=
[ "$rc" -eq 130 ] && ok "-c script: SIGINT exits 130" || bad "-c script: exit $rc"
sleep 0.5
left=0
for k in $kids; do kill -0 "$k" 2>/dev/null && left=$((left + 1)); done
[ -n "$kids" ] && [ "$left" -eq 0 ] && ok "-c script: its servers stopped" || bad "-c script: servers '$kids', $left left"
"$SEPAL" -c "sleep 60" > /dev/null 2>&1 &
BGPID=$!
sleep 0.3
kill -TERM "$BGPID"
wait "$BGPID"
rc=$?
BGPID=
[ "$rc" -eq 143 ] && ok "-c script: SIGTERM exits 143" || bad "-c script: SIGTERM exit $rc"

# -f FILE and a script on stdin, with a server up: SIGINT exits 130, SIGTERM 143, the server stops
printf 'load %s\nswarm up 1\nsleep 60\necho not reached\n' "$M" > "$TMP/sig.sepal"
for how in -f stdin; do
    for sig in INT TERM; do
        if [ "$how" = -f ]; then
            "$SEPAL" -f "$TMP/sig.sepal" > "$TMP/out" 2>&1 &
        else
            "$SEPAL" < "$TMP/sig.sepal" > "$TMP/out" 2>&1 &
        fi
        BGPID=$!
        for i in $(seq 400); do grep -qE "^1 servers?: blocks 0:6$" "$TMP/out" && break; sleep 0.05; done
        kids=$(pgrep -P "$BGPID" -f sepal-server | tr '\n' ' ')
        kill -"$sig" "$BGPID"
        wait "$BGPID"
        rc=$?
        BGPID=
        want=$([ $sig = INT ] && echo 130 || echo 143)
        [ "$rc" -eq "$want" ] && ok "$how script: SIG$sig exits $want" ||
            { bad "$how script: SIG$sig exit $rc"; tail -3 "$TMP/out"; }
        sleep 0.5
        left=0
        for k in $kids; do kill -0 "$k" 2>/dev/null && left=$((left + 1)); done
        [ -n "$kids" ] && [ "$left" -eq 0 ] && ok "$how script: SIG$sig stops its server" ||
            bad "$how script: servers '$kids', $left left"
        grep -q "not reached" "$TMP/out" && bad "$how script: SIG$sig: the script went on" ||
            ok "$how script: SIG$sig stops the script"
    done
done
finish
