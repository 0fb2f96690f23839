#!/usr/bin/env bash
# A private swarm from the command line: sepal-server --gen-swarm-key / --swarm-key, and the app's
# `connect --swarm-key FILE` and `swarm-key` setting against a real keyed server (and `swarm up` with the key);
# over a keyed swarm's DHT, a client with another key or none is told, before any generation, that it found
# records it cannot read; a server given a websocket port (or a dead address) as --initial-peers exits saying so,
# and the app's `connect --initial-peers` given one says so too.
. "$(dirname "$0")/lib.bash"
M="${SEPAL_STORIES15M_DIR:?}"
SERVER="$SEPAL_BIN_DIR/server/sepal-server"
export SEPAL_SERVER_BIN="$SERVER"
export SEPAL_CACHE="$TMP/cache"

if [ ! -f "$M/model.safetensors" ]; then
    bad "$M: no converted stories15M; run scripts/fetch-model.sh first"
    finish
fi

expect 0 "--gen-swarm-key writes a key" "wrote a swarm key to .*swarm id [0-9a-f]{16}" -- "$SERVER" --gen-swarm-key "$TMP/k1"
[ "$(stat -c %a "$TMP/k1")" = 600 ] && ok "the key file is mode 600" || bad "the key file is mode $(stat -c %a "$TMP/k1")"
expect 1 "an existing key is never overwritten" "never overwritten" -- "$SERVER" --gen-swarm-key "$TMP/k1"
"$SERVER" --gen-swarm-key "$TMP/k2" > /dev/null
cp "$TMP/k1" "$TMP/open" && chmod 644 "$TMP/open"
expect 2 "a key others can read is refused" "chmod 600" -- "$SERVER" --model "$M" --blocks 0: --swarm-key "$TMP/open"
expect 2 "a missing key file is named" "swarm key /nonexistent" -- "$SERVER" --model "$M" --blocks 0: --swarm-key /nonexistent

# a keyed server
"$SERVER" --model "$M" --blocks 0: --no-measure --swarm-key "$TMP/k1" > "$TMP/srv.out" 2> "$TMP/srv.err" &
SRV=$!
trap 'kill $SRV 2>/dev/null; rm -rf "$TMP"' EXIT
for _ in $(seq 100); do grep -q "ws://" "$TMP/srv.out" 2>/dev/null && break; sleep 0.1; done
PORT=$(grep -o 'ws://127.0.0.1:[0-9]*' "$TMP/srv.out" | cut -d: -f3)
[ -n "$PORT" ] && ok "the keyed server serves" || { bad "the keyed server did not start"; cat "$TMP/srv.err"; finish; }
grep -q "swarm key: [0-9a-f]\{16\}" "$TMP/srv.out" && ok "its limits line names the swarm" || bad "no swarm id in: $(cat "$TMP/srv.out")"

expect 0 "connect --swarm-key: generates" "there was a little girl" -- \
    "$SEPAL" -c "load $M; connect --swarm-key $TMP/k1 127.0.0.1:$PORT; generate 'Once upon a time' --max-new-tokens 8"
expect 0 "the swarm-key setting: generates" "there was a little girl" -- \
    "$SEPAL" -c "load $M; set swarm-key $TMP/k1; connect 127.0.0.1:$PORT; generate 'Once upon a time' --max-new-tokens 8"
expect 1 "no key: refused, saying why" "unauthorized.*--swarm-key" -- "$SEPAL" -c "load $M; connect 127.0.0.1:$PORT"
expect 1 "another key: refused, saying why" "another swarm key" -- \
    "$SEPAL" -c "load $M; connect --swarm-key $TMP/k2 127.0.0.1:$PORT"
expect 1 "a missing key file: named" "swarm key /nonexistent" -- "$SEPAL" -c "set swarm-key /nonexistent; load $M"
grep -q "refused: this server is in a private swarm" "$TMP/srv.err" && ok "the server logged the keyless peer" ||
    bad "the server's log lacks the refusal"

# a keyed swarm over the DHT: its records are sealed, and an outsider is told why it sees no server (issue 22)
"$SERVER" --model "$M" --blocks 0: --no-measure --swarm-key "$TMP/k1" --new-swarm --update-period 1 \
    > "$TMP/dht.out" 2> "$TMP/dht.err" &
DSRV=$!
trap 'kill $SRV $DSRV 2>/dev/null; rm -rf "$TMP"' EXIT
for _ in $(seq 100); do grep -q "DHT 127" "$TMP/dht.out" 2>/dev/null && break; sleep 0.1; done
DPORT=$(grep -o 'DHT 127.0.0.1:[0-9]*' "$TMP/dht.out" | cut -d: -f2)
[ -n "$DPORT" ] && ok "a keyed server starts a swarm" || { bad "the keyed swarm did not start"; cat "$TMP/dht.err"; }
# told_first DESC 'CONNECT OPTIONS' PATTERN: PATTERN comes out, before generate's "no servers"
told_first() {
    local out msg gen
    out=$("$SEPAL" -c "load $M; connect $2 --initial-peers 127.0.0.1:$DPORT; generate 'Once upon a time' \
--max-new-tokens 8" 2>&1)
    msg=$(printf '%s\n' "$out" | grep -nE -- "$3" | head -1 | cut -d: -f1)
    gen=$(printf '%s\n' "$out" | grep -n "generate: no servers" | head -1 | cut -d: -f1)
    if [ -n "$msg" ] && [ -n "$gen" ] && [ "$msg" -lt "$gen" ]; then
        ok "$1"
    else
        bad "$1"; printf '%s\n' "$out" | tail -5 | sed 's/^/    /'
    fi
}
told_first "another key over the DHT: told why before generating" "--swarm-key $TMP/k2" \
    "[0-9]+ records? under this model cannot be read with this swarm key"
told_first "no key over the DHT: told why before generating" "" \
    "[0-9]+ records? under this model cannot be read without a swarm key .*--swarm-key"
expect 0 "the key over the DHT: generates" "there was a little girl" -- \
    "$SEPAL" -c "load $M; connect --swarm-key $TMP/k1 --initial-peers 127.0.0.1:$DPORT; generate 'Once upon a time' --max-new-tokens 8"

# --initial-peers given the websocket port (the README's old example), or nothing at all: an error that names the
# right port, not a server that silently joins nothing (issue 22); `timeout` keeps such a server from hanging here
DWS=$(grep -o 'ws://127.0.0.1:[0-9]*' "$TMP/dht.out" | cut -d: -f3)
expect 2 "--initial-peers given a websocket port: the DHT port named" \
    "127.0.0.1:$DWS is the websocket port of a sepal-server .*its DHT node is 127.0.0.1:$DPORT: use --initial-peers 127.0.0.1:$DPORT" -- \
    timeout 60 "$SERVER" --model "$M" --blocks 3:6 --no-measure --swarm-key "$TMP/k1" --initial-peers "127.0.0.1:$DWS"
expect 2 "--initial-peers where nothing answers: said" "127.0.0.1:9 does not answer as a DHT node" -- \
    timeout 60 "$SERVER" --model "$M" --blocks 3:6 --no-measure --initial-peers 127.0.0.1:9
# ... and the app's connect --initial-peers the same way (it finds no server: then it says why)
expect 1 "connect --initial-peers given a websocket port: the DHT port named" \
    "--initial-peers 127.0.0.1:$DWS: 127.0.0.1:$DWS is the websocket port of a sepal-server .*use --initial-peers 127.0.0.1:$DPORT" -- \
    timeout 60 "$SEPAL" -c "load $M; connect --swarm-key $TMP/k1 --initial-peers 127.0.0.1:$DWS"

# swarm up with a key: its servers hold it (a keyed client refuses a server without one)
expect 0 "swarm up with the key, then generate" "there was a little girl" -- \
    "$SEPAL" -c "load $M; set swarm-key $TMP/k1; swarm up 2; generate 'Once upon a time' --max-new-tokens 8; swarm down"
finish
