#!/usr/bin/env bash
# Rough edges of the TUI and of the `servers` table (issue 22), each through the real `sepal` in tmux (a private
# server, LANG=C.UTF-8, SEPAL_TUI_TEST=1) against a real loopback swarm; every check polls the screen:
#  - the REPL at 100 columns: `servers` fits the terminal (no line wraps; the least important columns left out),
#    narrower after a resize, and a server of `swarm up` is named `local` as in the TUI;
#  - the TUI at 100x30: after Ctrl-C of a generation the status row names the command it stopped (not
#    "Swarm: stopped" while 3 servers are online); a log line wider than the panel is wrapped (the generation's
#    seed at its end shows); `q` during training asks with its choices in the status row; a command typed while
#    training runs is shown queued under the panels, and Ctrl-C clears the queue (the log says which command did
#    not run, and it does not run);
#  - a replayed recording of a training that has begun without a step yet: the Train panel says "no training
#    yet", not "step 0/0 loss 0 lr 0".
. "$(dirname "$0")/lib.bash"
. "$(dirname "$0")/tui_tmux.bash"
# the pane's lines as the program wrote them (rows the terminal wrapped joined again), scrollback included
joined() { T capture-pane -p -J -S -200 -t "$1" 2>/dev/null; }
# the last table `servers` wrote, as written (its header and rows)
last_table() { joined "$1" | awk '/^id / {t = ""; on = 1} on && /^sepal>/ {on = 0} on {t = t $0 "\n"} END {printf "%s", t}'; }
# check_text NAME DESC WAIT TEXT: once WAIT shows, the screen's rows joined into one line (a log line's wrapped
# rows, their indent dropped) hold TEXT
check_text() {
    if wait_for "$1" "$3" 10 && pane "$1" | sed 's/^  //' | tr '\n' ' ' | tr -s ' ' | grep -qF -- "$4"; then
        ok "$2"
    else
        bad "$2: the screen lacks '$4'"; pane "$1" | sed 's/^/    | /'
    fi
}
status_row() { pane "$1" | tail -1; }
# check_status NAME DESC PATTERN [SECONDS]: the status row (the last) matches
check_status() {
    local i n=$(( ${4:-20} * 20 * SLOW ))
    for i in $(seq "$n"); do
        status_row "$1" | grep -qE -- "$3" && { ok "$2"; return; }
        sleep 0.05
    done
    bad "$2: the status row is '$(status_row "$1")', not /$3/"
}

# ---- the REPL: `servers` fits the terminal ---------------------------------------------------------------
start p 100x30 LANG=C.UTF-8 -- --repl
check p "the REPL's prompt" "^sepal> ?$"
text p "load $M; swarm up 3"
keys p Enter
check p "swarm up 3" "^3 servers: blocks" 60
keys p C-l
text p "servers"
keys p Enter
check p "servers: three rows" "^[0-9a-f]{8} .* 4:6 +online"
# a server of swarm up: `local`, where the TUI shows the same; no "(local)" after the row
n=$(joined p | grep -cE '^[0-9a-f]{8} local +127\.0\.0\.1:[0-9]+ +[0-9]:[0-9] +online ')
[ "$n" -eq 3 ] && ok "servers names swarm up's servers 'local' (3 rows)" ||
    { bad "servers: $n rows named local"; joined p | sed 's/^/    | /'; }
joined p | grep -q '(local)' && bad "servers still writes (local) after a row" || ok "no (local) after the rows"
long=$(last_table p | awk 'length($0) > 100' | wc -l)
[ "$long" -eq 0 ] && ok "servers at 100 columns: no line wider than the terminal (none wraps)" ||
    { bad "servers at 100 columns: $long lines wider than 100"; joined p | sed 's/^/    | /'; }
last_table p | grep -qE '^id +name +address +blocks +state +tok/s ' && ok "servers at 100: id, name, address, blocks, state, tok/s" ||
    bad "servers at 100: the header"
last_table p | grep -qE '^id .* version$' && bad "servers at 100: the version column should give way first" ||
    ok "servers at 100: the least important column (version) left out"
T resize-window -t p -x 64 -y 30
keys p C-l
text p "servers"
keys p Enter
check p "servers at 64 columns: id, address, blocks, state" "^[0-9a-f]{8} 127\.0\.0\.1:[0-9]+ +4:6 +online"
long=$(last_table p | awk 'length($0) > 64' | wc -l)
[ "$long" -eq 0 ] && ok "servers after a resize to 64 columns: every line fits" ||
    { bad "servers at 64 columns: $long lines wider"; joined p | sed 's/^/    | /'; }
text p "quit"
keys p Enter
check p "the REPL quits" "^\[exit 0\]$" 30

# ---- the TUI ------------------------------------------------------------------------------------------
start a 100x30 LANG=C.UTF-8 -- -c "'load $M; swarm up 3'" --tui
check a "the TUI: 3 servers online" "3/3 online" 60
check a "the : line opens after the scripts" "^:$"
check a "the TUI names swarm up's servers 'local' too" "^● [0-9a-f]{8} local "
# a log line wider than the panel is wrapped: the seed at the end of the generation's figures shows
text a 'generate "Lily and Tom" --temperature 0.8 --seed 9123456789012345678 --max-new-tokens 30'
keys a Enter
check a "a sampled generation" "stop: (length|eos)" 30
check_text a "a log line wider than the panel is wrapped: its seed shows" "seed" \
    "; seed 9123456789012345678"
# Ctrl-C of a generation: the status row names the command it stopped, the swarm is fine
ctrl_c_generation a
check a "Ctrl-C stops the generation" "stop: cancelled" 1
check_status a "the status row names what Ctrl-C stopped" "^ NORMAL +stopped by Ctrl-C: generate 'Lily and Tom'" 10
status_row a | grep -q "Swarm: stopped" && bad "the status row says 'Swarm: stopped'" ||
    ok "the status row does not say the swarm stopped"
check a "... while the swarm is up" "3 servers online"

# q during training: the choices show in the status row at 100 columns
keys a :
text a "train sst2 --tuning ptune --pre-seq-len 4 --batch 4 --max-length 32 --max-steps 400"
keys a Enter
check a "a long training runs" "step [1-9][0-9]*/400" 60
keys a q
check_status a "q while training: the status row asks, with the choices" "^ QUIT\? +y quits .*n or Esc stays" 5
check a "... and the box too" "y quits, n or Esc stays" 1
keys a n
check_status a "n: the question is gone" "^ NORMAL +running: train" 5
# a command typed meanwhile is queued, shown under the panels; Ctrl-C stops the training and clears the queue
keys a :
text a 'generate "Tom had a red kite" --max-new-tokens 20'
keys a Enter
check a "the queued command is shown (Ctrl-C clears)" \
    "^queued: generate \"Tom had a red kite\" --max-new-tokens 20  \(Ctrl-C clears\)" 5
check a "the log says it is queued" "^queued: generate \"Tom had a red kite\" --max-new-tokens 20 \(it runs after train" 5
keys a C-c
check a "Ctrl-C stops the training" "stopped (after|during) step" 30
check_text a "the log says the queue was cleared, naming the command" "Ctrl-C cleared the queue: 1 command not run:" \
    'Ctrl-C cleared the queue: 1 command not run: generate "Tom had a red kite" --max-new-tokens 20'
check_status a "the status row: the training stopped" "stopped by Ctrl-C: train sst2|cleared the queue" 30
wait_for a "^queued: .*Ctrl-C clears\) *$" 1 && bad "the queue is still shown after Ctrl-C" || ok "the queue is gone from the screen"
# commands run in order: once a later one has run, the cleared generation would have run before it
keys a :
text a "echo after-the-queue"
keys a Enter
check a "a command after the Ctrl-C runs" "^after-the-queue$" 20
pane a | grep -qE '^:generate "Tom had a red kite"|^Tom had a red kite' && bad "the cleared generation ran" ||
    ok "the cleared generation did not run"
keys a q
check a "q quits (exit 0)" "^\[exit 0\]$" 30

# ---- the Train panel before the first step (a recording: the training has begun, no step yet) ------------
printf '%s\n' '{"t":0,"k":"train_begin","text":"training sst2 with deep_ptune (P 8), batch 8, lr 0.01, at most 40 steps"}' \
    > "$TMP/begun.jsonl"
start b 100x30 LANG=C.UTF-8 -- --replay-events "$TMP/begun.jsonl"
check b "replay: the recording is shown" "replay: 1 events" 10
check b "before the first step: no training yet" "│no training yet" 5
check b "... and what starts" "│starting: training sst2 with deep_ptune" 1
pane b | grep -qE "step 0/0|loss 0 +lr" && bad "the Train panel shows step 0/0 before any step" ||
    ok "no 'step 0/0 loss 0 lr 0' before the first step"
keys b q
check b "replay: q quits" "^\[exit 0\]$" 10
finish
