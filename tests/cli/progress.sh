#!/usr/bin/env bash
# What the line front end says about long work when stderr is not a terminal, and paths with a real `~`:
#  - plain progress lines for load, swarm up, eval and training's validation (SEPAL_PROGRESS_INTERVAL=0: a
#    line for every update), the training steps on stdout; --quiet: none of them, nor any notice, the results
#    still there; with the default interval the end of work that took 2 s or more (a `swarm up` of servers
#    that each take a second to start) has its line;
#  - the exact span line of `swarm up` and the `blocks-per-server` setting honoured;
#  - `load` of a path that is not there, or of a directory without config.json: its one message, no progress;
#  - `~` as a shell would read it, with HOME a fresh directory: `load ~/model` (a symlink to the model),
#    `train --save ~/p.safetensors`, and SEPAL_CACHE=~/cache (the sst2 data found there, the servers'
#    throughput cache written there), no directory named `~` made anywhere.
. "$(dirname "$0")/lib.bash"
M="${SEPAL_STORIES15M_DIR:?}"
export SEPAL_SERVER_BIN="$SEPAL_BIN_DIR/server/sepal-server"
if [ ! -f "$M/model.safetensors" ]; then
    bad "$M: no converted stories15M; run scripts/fetch-model.sh first"
    finish
fi
H="$TMP/home"
mkdir -p "$H/cache" "$TMP/run"
ln -s "$M" "$H/model"
ln -s "${SEPAL_SENTIMENT_DIR:?}" "$H/cache/sentiment"
SCRIPT="load ~/model; set blocks-per-server 3; swarm up 2; eval sst2 --eval-batches 2"
TRAIN="train sst2 --tuning ptune --pre-seq-len 4 --max-steps 2 --eval-batches 1"

# ---- plain lines, ~ paths ----------------------------------------------------------------------------------
(cd "$TMP/run" && HOME="$H" SEPAL_CACHE='~/cache' SEPAL_PROGRESS_INTERVAL=0 \
    "$SEPAL" -c "$SCRIPT; $TRAIN --save ~/p.safetensors" > "$TMP/out" 2> "$TMP/err")
rc=$?
[ $rc -eq 0 ] && ok "the session exits 0" || { bad "the session: exit $rc"; tail -5 "$TMP/err" | sed 's/^/    /'; }
has() { grep -qE -- "$2" "$3" && ok "$1" || { bad "$1: no /$2/"; tail -4 "$3" | sed 's/^/    /'; }; }
has "load ~/model loads \$HOME/model" "^loaded $H/model: LlamaForCausalLM" "$TMP/err"
has "load: plain progress lines" "^loading $H/model: 2/2( .*)? in [0-9.]+s$" "$TMP/err"
has "swarm up: plain progress lines" "^starting servers: 2/2( .*)? in [0-9.]+s$" "$TMP/err"
has "swarm up: the span line, blocks-per-server honoured" "^2 servers: blocks 0:3, 3:6$" "$TMP/err"
has "eval: plain progress lines" "^validation: 2/2 batches( .*)? in [0-9.]+s$" "$TMP/err"
has "train: its validation's progress line" "^validation: 1/1 batches( .*)? in [0-9.]+s$" "$TMP/err"
has "train: the steps on stdout" "^epoch 1 step 2/2: loss [0-9.]+" "$TMP/out"
has "eval reads sst2 from SEPAL_CACHE=~/cache" "^sst2: accuracy=[0-9.]+ n=32 " "$TMP/out"
[ -s "$H/p.safetensors" ] && ok "train --save ~/p.safetensors writes \$HOME/p.safetensors" ||
    bad "nothing in $H/p.safetensors"
[ -s "$H/cache/throughput.json" ] && ok "the servers' throughput cache is in \$HOME/cache" ||
    bad "no $H/cache/throughput.json"
n=$(find "$TMP" -name '~' | wc -l)
[ "$n" -eq 0 ] && ok "no directory named ~" || bad "$n paths named ~: $(find "$TMP" -name '~')"

# ---- no progress before the first byte: a path that is no model is its one line ----------------------------
mkdir -p "$TMP/nomodel"
for d in "$TMP/missing" "$TMP/nomodel"; do
    SEPAL_PROGRESS_INTERVAL=0 "$SEPAL" -c "load $d" > "$TMP/lout" 2> "$TMP/lerr"
    rc=$?
    case $d in
    */missing) want="sepal: $d: No such file or directory" ;;
    *) want="sepal: $d: not a model directory (no config.json)" ;;
    esac
    if [ $rc -eq 1 ] && [ ! -s "$TMP/lout" ] && [ "$(cat "$TMP/lerr")" = "$want" ]; then
        ok "load ${d##*/}: '$want' alone, no progress line"
    else
        bad "load ${d##*/}: exit $rc, stderr:"; head -3 "$TMP/lerr" | sed 's/^/    /'
    fi
done
SEPAL_PROGRESS_INTERVAL=0 "$SEPAL" model info "$TMP/nomodel" > "$TMP/lout" 2> "$TMP/lerr"
[ "$(cat "$TMP/lerr")" = "sepal: $TMP/nomodel: not a model directory (no config.json)" ] &&
    ok "model info says it too" || bad "model info of a directory without config.json: $(cat "$TMP/lerr")"

# ---- --quiet -------------------------------------------------------------------------------------------------
(cd "$TMP/run" && HOME="$H" SEPAL_CACHE='~/cache' SEPAL_PROGRESS_INTERVAL=0 \
    "$SEPAL" --quiet -c "$SCRIPT; $TRAIN" > "$TMP/qout" 2> "$TMP/qerr")
rc=$?
[ $rc -eq 0 ] && ok "--quiet: the session exits 0" || bad "--quiet: exit $rc"
[ ! -s "$TMP/qerr" ] && ok "--quiet: nothing on stderr" ||
    { bad "--quiet: stderr says"; head -5 "$TMP/qerr" | sed 's/^/    /'; }
has "--quiet: the results still come" "^sst2: accuracy=[0-9.]+ n=32 " "$TMP/qout"
has "--quiet: the training steps still come" "^epoch 1: validation accuracy=" "$TMP/qout"

# ---- the default interval: the end of long work ------------------------------------------------------------
cat > "$TMP/slow-server" <<EOF
#!/bin/sh
sleep 1
exec "$SEPAL_SERVER_BIN" "\$@"
EOF
chmod +x "$TMP/slow-server"
SEPAL_SERVER_BIN="$TMP/slow-server" "$SEPAL" -c "load $M; swarm up 3" > /dev/null 2> "$TMP/derr"
has "default interval: a swarm up of 2 s or more ends with its line" "^starting servers: 3/3( .*)? in [0-9.]+s$" \
    "$TMP/derr"
has "swarm up: the exact span line" "^3 servers: blocks 0:2, 2:4, 4:6$" "$TMP/derr"
finish
