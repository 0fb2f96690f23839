#!/usr/bin/env bash
# `sepal-server --metrics HOST:PORT`: a keyed server of stories15M that starts a swarm, scraped with curl as
# Prometheus scrapes it. The text is the exposition format (every sample's family has its # HELP and # TYPE,
# every sample line is `name{labels} value`); a generation through it moves the counters (inference steps,
# inference positions, bytes in and out, batches of 1) and holds a session's KV cache while it runs; a client
# without the swarm key counts as an auth failure; the DHT node killed counts as a restart; other paths are 404,
# a bad --metrics is refused, and the server stops cleanly with its endpoint.
. "$(dirname "$0")/lib.bash"
M="${SEPAL_STORIES15M_DIR:?}"
SERVER="$SEPAL_BIN_DIR/server/sepal-server"
export SEPAL_CACHE="$TMP/cache"
if [ ! -f "$M/model.safetensors" ]; then
    bad "$M: no converted stories15M; run scripts/fetch-model.sh first"
    finish
fi
expect 2 "a bad --metrics is refused" "sepal-server: --metrics: expected HOST:PORT" -- \
    "$SERVER" --model "$M" --blocks 0: --metrics nonsense

"$SERVER" --gen-swarm-key "$TMP/key" > /dev/null
"$SERVER" --model "$M" --blocks 0: --no-measure --swarm-key "$TMP/key" --new-swarm --update-period 1 \
    --metrics 127.0.0.1:0 > "$TMP/srv.out" 2> "$TMP/srv.err" &
SRV=$!
trap 'kill $SRV 2>/dev/null; rm -rf "$TMP"' EXIT
for _ in $(seq 150); do grep -q "ws://" "$TMP/srv.out" 2>/dev/null && break; sleep 0.1; done
PORT=$(grep -o 'ws://127.0.0.1:[0-9]*' "$TMP/srv.out" | cut -d: -f3)
MURL=$(grep -o 'metrics at http://127.0.0.1:[0-9]*/metrics' "$TMP/srv.out" | cut -d' ' -f3)
[ -n "$PORT" ] && [ -n "$MURL" ] && ok "the server says where its metrics are ($MURL)" ||
    { bad "no server or no metrics line: $(cat "$TMP/srv.out" "$TMP/srv.err")"; finish; }

# scrape NAME: the text into $TMP/NAME
scrape() { curl -s -o "$TMP/$1" -w '%{http_code} %{content_type}' "$MURL"; }
# val FILE SAMPLE: the value of the sample (its name and labels as written)
val() { awk -v s="$2" '$1 == s { print $2 }' "$TMP/$1"; }

st=$(scrape m0)
[ "$st" = "200 text/plain; version=0.0.4; charset=utf-8" ] && ok "GET /metrics: 200 in the text format 0.0.4" ||
    bad "GET /metrics: $st"
python3 - "$TMP/m0" > "$TMP/fmt" <<'PY'
import re, sys
fam, bad, n = {}, [], 0
for line in open(sys.argv[1]).read().splitlines():
    m = re.match(r"# (HELP|TYPE) (sepal_[a-z_]+) (.+)$", line)
    if m:
        fam.setdefault(m.group(2), set()).add(m.group(1))
        continue
    m = re.match(r'(sepal_[a-z_]+?)(_bucket|_sum|_count)?(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? (-?[0-9.e+]+|\+Inf|NaN)$', line)
    if not m:
        bad.append(line)
        continue
    n += 1
    name = m.group(1) + (m.group(2) or "")
    if name not in fam and m.group(1) not in fam:
        bad.append("no HELP/TYPE: " + line)
bad += [f for f, k in fam.items() if k != {"HELP", "TYPE"}]
print("ok" if not bad and n > 30 else "bad %d samples: %s" % (n, bad[:3]))
PY
[ "$(cat "$TMP/fmt")" = ok ] && ok "every sample line is well formed, under its family's HELP and TYPE" ||
    bad "the text: $(cat "$TMP/fmt")"
for s in 'sepal_requests_total{type="inference_step"}' 'sepal_queue_length' 'sepal_queue_wait_seconds_count' \
         'sepal_batch_size_count' 'sepal_tokens_per_second' 'sepal_kv_cache_used_bytes' 'sepal_connections' \
         'sepal_received_bytes_total' 'sepal_sent_bytes_total' 'sepal_auth_failures_total' 'sepal_dht_restarts_total'; do
    [ -n "$(val m0 "$s")" ] || missing="${missing:-} $s"
done
[ -z "${missing:-}" ] && ok "the samples of issue 25 are there (requests by type, queue, batches, tokens/s, KV cache, connections, bytes, auth failures, DHT restarts)" ||
    bad "samples missing:$missing"
grep -q '^sepal_info{model="stories15M",start="0",end="6",dtype="f32"} 1$' "$TMP/m0" && ok "sepal_info names the span" ||
    bad "sepal_info: $(grep sepal_info "$TMP/m0")"

# a generation through the server; a scrape while a slower one runs sees its session's cache
"$SEPAL" -c "load $M; connect --swarm-key $TMP/key 127.0.0.1:$PORT; generate 'Once upon a time' --max-new-tokens 16 --greedy" \
    > "$TMP/gen" 2>&1 && ok "a generation through the keyed server" || bad "generate: $(tail -3 "$TMP/gen")"
scrape m1 > /dev/null
steps0=$(val m0 'sepal_requests_total{type="inference_step"}')
steps1=$(val m1 'sepal_requests_total{type="inference_step"}')
tok1=$(val m1 'sepal_tokens_total{kind="inference"}')
[ "$steps0" = 0 ] && [ "$steps1" -ge 16 ] && ok "inference steps: 0, then $steps1 after 16 new tokens" ||
    bad "inference steps $steps0 -> $steps1"
[ "$tok1" -ge 20 ] && ok "inference positions: $tok1 (the prompt's 5, then 15 new tokens fed back)" || bad "inference positions: $tok1"
[ "$(val m1 'sepal_requests_total{type="inference_open"}')" -ge 1 ] && ok "a session opened" || bad "no inference_open"
[ "$(val m1 'sepal_batch_size_count')" = "$(val m1 'sepal_batch_size_bucket{le="1"}')" ] &&
    [ "$(val m1 'sepal_batch_size_count')" -ge "$steps1" ] && ok "each compute request ran as a batch of 1" ||
    bad "batches: $(grep '^sepal_batch_size' "$TMP/m1" | tr '\n' ' ')"
awk -v a="$(val m0 sepal_received_bytes_total)" -v b="$(val m1 sepal_received_bytes_total)" \
    -v c="$(val m0 sepal_sent_bytes_total)" -v d="$(val m1 sepal_sent_bytes_total)" 'BEGIN { exit !(b > a + 16 * 1000 && d > c + 16 * 1000) }' &&
    ok "bytes in and out rose by more than 16 steps of hidden states" || bad "bytes: $(grep _bytes_total "$TMP/m1" | tr '\n' ' ')"
awk -v t="$(val m1 sepal_tokens_per_second)" 'BEGIN { exit !(t > 0) }' && ok "tokens/s since the last scrape: $(val m1 sepal_tokens_per_second)" ||
    bad "tokens/s: $(val m1 sepal_tokens_per_second)"
"$SEPAL" -c "load $M; connect --swarm-key $TMP/key 127.0.0.1:$PORT; generate 'Once upon a time' --max-new-tokens 240 --ignore-eos" \
    > "$TMP/gen2" 2>&1 &
GEN=$!
held=0
for _ in $(seq 100); do
    scrape m2 > /dev/null
    if [ "$(val m2 sepal_sessions)" = 1 ] && [ "$(val m2 sepal_kv_cache_used_bytes)" -gt 0 ]; then held=1; break; fi
    sleep 0.05
done
wait $GEN
[ $held = 1 ] && ok "while a generation runs: 1 session, $(val m2 sepal_kv_cache_used_bytes) bytes of KV cache held" ||
    bad "no session seen: $(grep -E '^sepal_(sessions|kv_cache)' "$TMP/m2" | tr '\n' ' ')"
scrape m3 > /dev/null
[ "$(val m3 sepal_sessions)" = 0 ] && [ "$(val m3 sepal_kv_cache_used_bytes)" = 0 ] && ok "after it: none held" ||
    bad "after: $(grep -E '^sepal_(sessions|kv_cache)' "$TMP/m3" | tr '\n' ' ')"

# a client without the key; the DHT node killed
"$SEPAL" -c "load $M; connect 127.0.0.1:$PORT" > /dev/null 2>&1
scrape m4 > /dev/null
[ "$(val m4 sepal_auth_failures_total)" -gt "$(val m3 sepal_auth_failures_total)" ] &&
    ok "a client without the swarm key: auth failures $(val m3 sepal_auth_failures_total) -> $(val m4 sepal_auth_failures_total)" ||
    bad "auth failures: $(val m3 sepal_auth_failures_total) -> $(val m4 sepal_auth_failures_total)"
DHT=$(pgrep -P $SRV | head -1)
[ -n "$DHT" ] && kill -9 "$DHT"
for _ in $(seq 100); do
    scrape m5 > /dev/null
    [ "$(val m5 sepal_dht_restarts_total)" = 1 ] && break
    sleep 0.1
done
[ -n "$DHT" ] && [ "$(val m5 sepal_dht_restarts_total)" = 1 ] && ok "the DHT node killed: dht_restarts_total 0 -> 1" ||
    bad "DHT restarts: $(val m5 sepal_dht_restarts_total) (child ${DHT:-none})"

st=$(curl -s -o /dev/null -w '%{http_code}' "${MURL%/metrics}/other")
[ "$st" = 404 ] && ok "another path: 404" || bad "another path: $st"
st=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$MURL")
[ "$st" = 405 ] && ok "POST /metrics: 405" || bad "POST: $st"
kill -TERM $SRV
wait $SRV
rc=$?
[ $rc -eq 0 ] && ok "the server stops with its endpoint (exit 0)" || bad "server exit $rc: $(tail -3 "$TMP/srv.err")"
curl -s -o /dev/null "$MURL" && bad "the endpoint outlived the server" || ok "the endpoint is gone with it"
finish
