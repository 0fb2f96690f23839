#!/usr/bin/env bash
# Refreshes the TUI's screens in share/doc/screens/ (plain text, as tmux shows them) and the README's copies of
# them (between <!-- screen:NAME --> and <!-- /screen --> lines): the real `sepal` in tmux with a real local
# swarm of stories15M, after a generation and a short prompt tuning, at 100x30, 80x24, 60x16 (tabs) and 30x8
# (too small), with its help, and in ASCII (LC_ALL=C, from a recording of the same session).
# Usage: scripts/tui-screens.sh [BUILD_DIR]   (default build; needs tmux, the model and the sentiment data)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
SEPAL="$PWD/$BUILD/app/sepal"
export SEPAL_SERVER_BIN="$PWD/$BUILD/server/sepal-server"
M="${SEPAL_CACHE:-$HOME/.cache/sepal}/models/stories15M"
OUT=share/doc/screens
SOCK="sepal-screens-$$"
TMP=$(mktemp -d)
trap 'tmux -L "$SOCK" kill-server 2>/dev/null; rm -f "${TMUX_TMPDIR:-/tmp}/tmux-$(id -u)/$SOCK"; rm -rf "$TMP"' EXIT
[ -x "$SEPAL" ] || { echo "tui-screens: build first ($SEPAL)" >&2; exit 1; }
[ -f "$M/model.safetensors" ] || { echo "tui-screens: run scripts/fetch-model.sh first" >&2; exit 1; }
mkdir -p "$OUT"
T() { tmux -L "$SOCK" -f /dev/null "$@"; }
pane() { T capture-pane -p -t "$1"; }
# wait_for SESSION PATTERN [SECONDS]: polls the screen
wait_for() {
    local i
    for i in $(seq $((${3:-60} * 20))); do
        pane "$1" | grep -qE -- "$2" && return 0
        sleep 0.05
    done
    echo "tui-screens: the screen never showed /$2/:" >&2
    pane "$1" >&2
    exit 1
}
# shot SESSION NAME: the screen, trailing blanks removed
shot() { pane "$1" | sed 's/ *$//' > "$OUT/$2.txt"; echo "tui-screens: $OUT/$2.txt"; }

T new-session -d -s s -x 100 -y 30 "env LANG=C.UTF-8 SEPAL_HISTORY=$TMP/hist $SEPAL \
    -c 'load $M; swarm up 3' --record-events $TMP/rec.jsonl --tui; sleep 600"
wait_for s "3/3 online"
wait_for s "^:$"
T send-keys -t s -l 'generate "Once upon a time" --max-new-tokens 90'
T send-keys -t s Enter
wait_for s "stop: length"
T send-keys -t s :
T send-keys -t s -l 'train sst2 --tuning deep_ptune --pre-seq-len 8 --batch 8 --max-length 48 --max-steps 40 --eval-batches 4'
T send-keys -t s Enter
wait_for s "100%  done" 300
wait_for s "NORMAL +done: train" # the command has ended, not only the training
shot s main
T send-keys -t s '?'
wait_for s "sepal keys"
shot s help
T send-keys -t s Escape
T resize-window -t s -x 80 -y 24
wait_for s "4 Train ─+ loss  \(\]: acc\)" # the 80-column frame (at 100: "(]: accuracy)")
shot s 80x24
T resize-window -t s -x 60 -y 16
wait_for s "^ 1 Swarm +2 Route"
T send-keys -t s 4
wait_for s "▶ 4 Train"
shot s 60x16-train
T resize-window -t s -x 30 -y 8
wait_for s "terminal too small"
shot s 30x8
T resize-window -t s -x 100 -y 30
T send-keys -t s q
sleep 0.5

T new-session -d -s a -x 100 -y 30 "env LC_ALL=C LANG=C SEPAL_TUI_REPLAY_SPEED=0 $SEPAL \
    --replay-events $TMP/rec.jsonl; sleep 600"
wait_for a "replay: [0-9]+ events"
shot a ascii

# the README's copies
for f in "$OUT"/*.txt; do
    name=$(basename "$f" .txt)
    grep -q "^<!-- screen:$name -->$" README.md || continue
    awk -v name="$name" -v file="$f" '
        $0 == "<!-- screen:" name " -->" { print; print "```"; while ((getline l < file) > 0) print l; print "```"; skip = 1; next }
        skip && $0 == "<!-- /screen -->" { skip = 0 }
        !skip' README.md > "$TMP/README.md"
    cp "$TMP/README.md" README.md
    echo "tui-screens: README.md ($name)"
done
