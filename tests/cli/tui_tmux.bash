# tui_tmux.bash - the real `sepal` in a private tmux server, for the TUI's tests (sourced after lib.bash): the
# stories15M model and the sentiment data checked (the test is skipped without tmux), SEPAL_SERVER_BIN, a cache
# with the sentiment data, T (tmux on the test's own socket, killed at exit), SLOW (3 under a sanitizer), and
# start (a session running sepal, COLUMNS unset), pane, keys, text, wait_for, wait_gone, check,
# ctrl_c_generation.
M="${SEPAL_STORIES15M_DIR:?}"
if ! command -v tmux >/dev/null; then
    echo "tmux not found: skipped"
    finish
fi
if [ ! -f "$M/model.safetensors" ] || [ ! -f "${SEPAL_SENTIMENT_DIR:?}/imdb.json" ]; then
    bad "run scripts/fetch-model.sh and scripts/fetch-sentiment.sh first"
    finish
fi
export SEPAL_SERVER_BIN="$SEPAL_BIN_DIR/server/sepal-server"
mkdir -p "$TMP/cache"
ln -s "$SEPAL_SENTIMENT_DIR" "$TMP/cache/sentiment"
SOCK="sepal-${0##*/}-$$"
SOCKDIR="${TMUX_TMPDIR:-/tmp}/tmux-$(id -u)"
cleanup() {
    tmux -L "$SOCK" kill-server 2>/dev/null
    rm -f "$SOCKDIR/$SOCK"
    rm -rf "$TMP"
}
trap cleanup EXIT
T() { tmux -L "$SOCK" -f /dev/null "$@"; }
# under a sanitizer everything is slower
SLOW=1
"$SEPAL" --version >/dev/null 2>&1 && ldd "$SEPAL" 2>/dev/null | grep -q libasan && SLOW=3

# start NAME COLSxROWS ENV... -- ARGS...: sepal in a new session; the pane keeps the shell's view afterwards
start() {
    local name=$1 size=$2 envs=() args=()
    shift 2
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    args=("$@")
    local cmd="stty -g > $TMP/$name.before; env -u COLUMNS SEPAL_TUI_TEST=1 SEPAL_HISTORY=$TMP/hist SEPAL_CACHE=$TMP/cache HOME=$TMP"
    cmd="$cmd ${envs[*]} $SEPAL ${args[*]}; echo \"[exit \$?]\"; stty -g > $TMP/$name.after; sleep 600"
    T new-session -d -s "$name" -x "${size%x*}" -y "${size#*x}" "$cmd"
}
pane() { T capture-pane -p -t "$1" 2>/dev/null; }
keys() { local s=$1; shift; T send-keys -t "$s" "$@"; }
text() { T send-keys -t "$1" -l -- "$2"; }
# wait_for NAME PATTERN [SECONDS]: polls the pane every 50 ms
wait_for() {
    local i n=$(( ${3:-20} * 20 * SLOW ))
    for i in $(seq "$n"); do
        pane "$1" | grep -qE -- "$2" && return 0
        sleep 0.05
    done
    return 1
}
# wait_gone NAME PATTERN [SECONDS]: polls until the pane no longer shows it
wait_gone() {
    local i n=$(( ${3:-20} * 20 * SLOW ))
    for i in $(seq "$n"); do
        pane "$1" | grep -qE -- "$2" || return 0
        sleep 0.05
    done
    return 1
}
check() { if wait_for "$1" "$3" "${4:-20}"; then ok "$2"; else bad "$2: the screen lacks /$3/"; pane "$1" | sed 's/^/    | /'; fi; }
# ctrl_c_generation NAME: at `:`, a long sampled generation of "Lily and Tom", and Ctrl-C once it streams (if it
# ended before the Ctrl-C landed, again once it has ended, up to 3 times); the screen then says "stop: cancelled"
ctrl_c_generation() {
    local try
    for try in 1 2 3; do
        keys "$1" :
        text "$1" "generate 'Lily and Tom' --temperature 0.9 --max-new-tokens 250 --ignore-eos"
        keys "$1" Enter
        wait_for "$1" "─ 3 Generate ─+ generating ─" 30 || break
        keys "$1" C-c
        # (the generation's end first: an earlier generation's "stop: length" is on the screen too, and a new try
        # typed while this one still winds down would be queued, and the next Ctrl-C would clear it instead)
        wait_gone "$1" "─ 3 Generate ─+ generating ─" 10 || break
        wait_for "$1" "stop: (cancelled|eos|length)" 10 || break
        pane "$1" | grep -q "stop: cancelled" && break
    done
}
