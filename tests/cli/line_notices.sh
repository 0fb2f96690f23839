#!/usr/bin/env bash
# The line front end never cuts a generation's text with a notice: the app's own DHT node (a real sepal-dht
# child) is killed while a real swarm streams a story into one pipe (stdout and stderr together, as `2>&1`
# or a terminal shows them); "DHT node died" must come on a line of its own, after the text's line ends,
# before the generation's figures.
. "$(dirname "$0")/lib.bash"
M="${SEPAL_STORIES15M_DIR:?}"
export SEPAL_SERVER_BIN="$SEPAL_BIN_DIR/server/sepal-server"
export SEPAL_CACHE="$TMP/cache"

if [ ! -f "$M/model.safetensors" ]; then
    bad "$M: no converted stories15M; run scripts/fetch-model.sh first"
    finish
fi

P="Once upon a time"
G="generate \"$P\" --max-new-tokens 250 --ignore-eos"
# the story twice (greedy: the same text): the DHT node dies during the first, the second is the reference
"$SEPAL" -c "load $M; swarm up 1; $G; echo ==; $G" > "$TMP/both" 2>&1 &
APP=$!
# the story streams: some text after the prompt (a 250-token story takes about 0.5 s)
for _ in $(seq 3000); do
    grep -qE "^$P.{12}" "$TMP/both" && break
    kill -0 $APP 2>/dev/null || break
    sleep 0.01
done
DHT=$(pgrep -P $APP -x sepal-dht | head -1)
if [ -n "$DHT" ] && grep -qE "^$P.{12}" "$TMP/both" && ! grep -q "^==$" "$TMP/both"; then
    kill -9 "$DHT"
    ok "killed the app's DHT node ($DHT) while the story streamed"
else
    bad "no story streaming, or no DHT child of the app: $(tail -3 "$TMP/both")"
fi
wait $APP
rc=$?
[ $rc -eq 0 ] && ok "the session exits 0" || bad "the session: exit $rc"
# the notice came during the first generation, so its place says something
died=$(grep -n "DHT node died" "$TMP/both" | head -1 | cut -d: -f1)
figures=$(grep -n "prompt tokens\? in" "$TMP/both" | head -1 | cut -d: -f1)
if [ -n "$died" ] && [ -n "$figures" ] && [ "$died" -lt "$figures" ]; then
    ok "the notice came during the generation (line $died, its figures on line $figures)"
else
    bad "no 'DHT node died' before the first generation's figures:"; head -12 "$TMP/both" | cut -c1-100 | sed 's/^/    /'
fi
if grep -qE '^DHT node died \(signal 9\)$' "$TMP/both" && ! grep -qE '.DHT node (died|restarted)' "$TMP/both"; then
    ok "the notice is a line of its own, not inside the text"
else
    bad "the notice cut the text:"; grep -E 'DHT node' "$TMP/both" | head -3 | cut -c1-200 | sed 's/^/    /'
fi
# each story: from the prompt to its figures, the DHT node's lines left out; the first is the second
story() { awk -v n="$1" '/^Once upon a time/ { k++ } k == n && /prompt tokens? in/ { exit } k == n' "$TMP/both" |
    grep -v '^DHT node'; }
story 1 > "$TMP/s1"
story 2 > "$TMP/s2"
if [ "$(wc -c < "$TMP/s1")" -gt 200 ] && cmp -s "$TMP/s1" "$TMP/s2"; then
    ok "the story the notice came in is whole: the same $(wc -c < "$TMP/s1") bytes as the one without"
else
    bad "the story the notice came in differs:"; diff "$TMP/s1" "$TMP/s2" | head -6 | cut -c1-160 | sed 's/^/    /'
fi
finish
