#!/usr/bin/env bash
# The interactive REPL (`sepal --repl`) driven in tmux: prompt, help, tab completion, a failing command
# that does not end the session, quit, Ctrl-D, and the history file; `--tui` with stdout in a pipe.
. "$(dirname "$0")/lib.bash"
if ! command -v tmux >/dev/null; then
    echo "tmux not found: skipped"
    finish
fi
BASE="sepal-test-$$"
SOCK="$BASE"
HIST="$TMP/hist"
SOCKDIR="${TMUX_TMPDIR:-/tmp}/tmux-$(id -u)"
cleanup() {
    local s
    for s in "$BASE" "$BASE-2" "$BASE-3" "$BASE-4" "$BASE-5"; do
        tmux -L "$s" kill-server 2>/dev/null
        rm -f "$SOCKDIR/$s" # kill-server can leave the socket file behind
    done
    rm -rf "$TMP"
}
trap cleanup EXIT

# start [ARGS]: sepal in a new tmux server (ARGS default to --repl)
start() {
    tmux -L "$SOCK" new-session -d -x 100 -y 30 \
        "env SEPAL_HISTORY=$HIST HOME=$TMP LANG=C.UTF-8 $SEPAL ${1---repl}; echo \"[exit \$?]\"; sleep 30"
}
pane() { tmux -L "$SOCK" capture-pane -p -S -300 2>/dev/null; }
keys() { tmux -L "$SOCK" send-keys "$@"; }
# wait_for PATTERN: polls the pane (scrollback included) for up to 10 s
wait_for() {
    local i
    for i in $(seq 100); do
        pane | grep -qE -- "$1" && return 0
        sleep 0.1
    done
    return 1
}
check() { if wait_for "$2"; then ok "$1"; else bad "$1: pane lacks /$2/"; pane | tail -8 | sed 's/^/    /'; fi; }
# ended: the REPL has exited with status 0 (the shell then prints it; a sanitizer's report would change it)
ended() { wait_for '^\[exit 0\]$'; }

start
check "prompt" "^sepal> ?$"
keys "help" Enter
check "help lists the commands" "^  quit +leave sepal"
check "help lists model" "^  model info"
keys C-l

# Completion: a unique prefix completes with a space after it, so typing goes on with the arguments.
keys "sh" Tab "top-k" Enter
check "Tab completes sh -> show" "^top-k +0 "
# An ambiguous prefix lists the candidates (their common prefix is what was typed).
keys "s" Tab
check "Tab lists set, show, sleep" "set +show +sleep"
keys C-u
# "se": set alone (it completes) or set and servers (they are listed).
keys "se" Tab
if wait_for "servers +set"; then ok "Tab on se lists servers and set"; keys C-u
elif wait_for "^sepal> set"; then ok "Tab on se completes set"; keys C-u
else bad "Tab on se"; fi
# Aliases complete too, and setting names after set.
keys "ex" Tab
check "Tab completes an alias (ex -> exit)" "^sepal> exit"
keys C-u
# ...but an alias does not hide its command: "ge" is generate, not a stop at the common prefix of gen and generate
keys "ge" Tab "--max-n" Tab
check "Tab on ge completes generate (the alias gen stays out)" "^sepal> generate --max-new-tokens ?$"
keys C-u
keys "set tem" Tab "0.5" Enter "show temperature" Enter
check "Tab completes a setting name" "^temperature +0.5 "
# File names after other commands (directories end with / and take no space).
keys "model inf" Tab "$SEPAL_TEST_DATA/hf-t" Tab "llama-g" Tab Enter
check "Tab completes model subcommands and paths" "parameters: +250432"

# Options, their values, subcommands and task names complete too.
keys C-l
keys "generate --max-n" Tab
check "Tab completes an option" "^sepal> generate --max-new-tokens ?$"
keys C-u
keys "swarm " Tab
check "Tab lists the subcommands" "^down +up"
keys C-u
keys "train sst2 --tun" Tab "deep" Tab
check "Tab completes an option and its choice" "^sepal> train sst2 --tuning deep_ptune ?$"
keys C-u
keys "train s" Tab
check "Tab completes a task" "^sepal> train sst2 ?$"
keys C-u
keys "set seed r" Tab
check "Tab completes a setting's value" "^sepal> set seed random ?$"
keys C-u
# Errors are red on a terminal (NO_COLOR turns it off: checked below).
keys C-l
keys "bogus" Enter
if wait_for "unknown command 'bogus'" && tmux -L "$SOCK" capture-pane -p -e | grep -q $'\e\[31msepal: unknown command'; then
    ok "errors are red on a terminal"
else
    bad "errors are not red"
fi
# A failed command prints its message and the loop goes on.
keys "bogus" Enter
check "failed command prints its error" "^sepal: unknown command 'bogus'"
keys "echo still here" Enter
check "the REPL goes on after a failure" "^still here$"
keys "quit" Enter
if ended; then ok "quit ends the REPL"; else bad "quit: still running"; fi
tmux -L "$SOCK" kill-server 2>/dev/null
SOCK="$BASE-2" # a fresh server: the old one may still be going away

# The history file holds the commands, in order.
if [ -f "$HIST" ]; then ok "history file written"; else bad "no history file at $HIST"; fi
want=$(printf 'help\nshow top-k\nset temperature 0.5\nshow temperature\nmodel info %s/hf-tiny/llama-gqa/\nbogus\necho still here\nquit' "$SEPAL_TEST_DATA")
# (the second bogus is the same line as the first: libedit keeps one)
got=$(cat "$HIST" 2>/dev/null)
[ "$got" = "$want" ] && ok "history holds the commands" || bad "history: '$got'"

# A new session recalls it (Up), and Ctrl-D on an empty line ends it.
start
check "second prompt" "^sepal> ?$"
keys Up Up
check "Up recalls the history" "^sepal> echo still here"
keys C-u C-d
if ended; then ok "Ctrl-D ends the REPL"; else bad "Ctrl-D: still running"; fi

# NO_COLOR keeps the REPL plain.
SOCK="$BASE-3"
tmux -L "$SOCK" new-session -d -x 100 -y 30 \
    "env SEPAL_HISTORY=$HIST HOME=$TMP LANG=C.UTF-8 NO_COLOR=1 $SEPAL --repl; echo \"[exit \$?]\"; sleep 30"
check "--repl with NO_COLOR: the REPL" "^sepal> ?$"
keys "bogus" Enter
wait_for "unknown command 'bogus'"
tmux -L "$SOCK" capture-pane -p -e | grep -q $'\e\[31m' && bad "NO_COLOR: still coloured" || ok "NO_COLOR: no colour"
keys "echo no-args" Enter "q" Enter
check "--repl: commands run" "^no-args$"
if ended; then ok "--repl: q ends it"; else bad "--repl: still running"; fi
tmux -L "$SOCK" kill-server 2>/dev/null

# Without arguments on a terminal, sepal is the TUI (tests/cli/tui.sh tests it); `quit` at its : line leaves.
SOCK="$BASE-4"
tmux -L "$SOCK" new-session -d -x 100 -y 30 \
    "env SEPAL_HISTORY=$HIST HOME=$TMP LANG=C.UTF-8 $SEPAL; echo \"[exit \$?]\"; sleep 30"
check "no arguments on a tty: the TUI" "1 Swarm"
keys ":" "quit" Enter
if ended; then ok "the TUI: :quit ends it"; else bad "the TUI: still running"; fi
tmux -L "$SOCK" kill-server 2>/dev/null

# --tui with stdout in a pipe (stdin still the terminal): it says why there is no TUI and what runs instead,
# runs the commands and ends; it does not wait for commands at the terminal.
SOCK="$BASE-5"
tmux -L "$SOCK" new-session -d -x 100 -y 30 \
    "env SEPAL_HISTORY=$HIST HOME=$TMP LANG=C.UTF-8 $SEPAL --tui -c 'echo hi' | cat; echo \"[exit \${PIPESTATUS[0]}]\"; sleep 30"
check "--tui without a terminal says so" \
    "^sepal: --tui needs a terminal \(stdout is not a terminal\): running the -c / -f commands without it$"
check "--tui without a terminal: the commands run" "^hi$"
if ended; then ok "--tui without a terminal: it ends after them (exit 0)"; else bad "--tui | cat: still running"; pane | tail -4; fi
finish
