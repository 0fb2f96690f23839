#!/usr/bin/env bash
# `serve`, the OpenAI-compatible endpoint, against a real local swarm of stories15M: one `sepal -c` session
# generates four prompts greedily (`generate`), then serves; curl and the npm package `openai` (the client users
# have; scripts/fetch-openai-npm.sh pins it) must get exactly generate's texts, alone and four streams at once,
# with usage counts, stop strings, n and seeds; errors come in OpenAI's shape with their status codes (400 bad
# parameters and bodies, 404 an unknown model or URL, 405, 413, 401 without the token, 503 without servers);
# `sepal serve` on the command line (--model, --initial-peers, --api-key-file) serves the same swarm; Ctrl-C
# ends a stream in progress with an error event and the session with 130.
. "$(dirname "$0")/lib.bash"
need_stories15M
M="$SEPAL_STORIES15M_DIR"
MODS=$(bash "${SEPAL_SRC_DIR:?}/scripts/fetch-openai-npm.sh" | tail -n 1)
[ -f "$MODS/openai/package.json" ] && ok "the openai npm package is at $MODS" || { bad "no openai npm package"; finish; }
export SEPAL_SERVER_BIN="$SEPAL_BIN_DIR/server/sepal-server"
export SEPAL_CACHE="$TMP/cache"
N=24
PROMPTS=("Once upon a time" "Tom had a red kite" "Lily and Tom went to the park" "The little dog")

# port_of FILE: the port of the "serving ... at http://127.0.0.1:PORT/v1" line, waiting up to 120 s for it
port_of() {
    for _ in $(seq 600); do
        grep -qE '^serving .* at http://' "$1" 2>/dev/null && break
        sleep 0.2
    done
    grep -oE 'at http://127\.0\.0\.1:[0-9]+/v1' "$1" | head -1 | sed 's/.*:\([0-9]*\)\/v1/\1/'
}

script="load $M; swarm up 2"
for i in "${!PROMPTS[@]}"; do
    script="$script; echo ==$i==; generate '${PROMPTS[$i]}' --max-new-tokens $N --greedy"
done
script="$script; echo ==end==; servers --long; serve --http 127.0.0.1:0 --parallel 4"
# each server answers 2 ms late: a long stream lasts long enough for the Ctrl-C at the end to land in it
SEPAL_SERVER_FAULT=slow:2 "$SEPAL" -c "$script" > "$TMP/out" 2> "$TMP/err" &
PID=$!
trap 'kill $PID $PID2 $PID3 $PID4 2>/dev/null; rm -rf "$TMP"' EXIT
PORT=$(port_of "$TMP/out")
if [ -z "$PORT" ]; then
    bad "serve did not start"; tail -5 "$TMP/err" | sed 's/^/    /'; finish
fi
ok "serve listens on 127.0.0.1:$PORT"
B="http://127.0.0.1:$PORT"
python3 - "$TMP/out" "$N" "${PROMPTS[@]}" > "$TMP/want.json" <<'PY'
import json, sys
out = open(sys.argv[1]).read()
n, prompts = int(sys.argv[2]), sys.argv[3:]
texts = {}
for i, p in enumerate(prompts):
    seg = out.split("==%d==\n" % i)[1].split("\n==")[0]  # generate's line: the prompt, then its continuation
    assert seg.startswith(p), seg
    texts[p] = seg[len(p):]
print(json.dumps({"model": "stories15M", "tokens": n, "texts": texts}))
PY
[ -s "$TMP/want.json" ] && ok "generate's greedy texts read" || bad "generate's texts: $(head -c 300 "$TMP/out")"
want0=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d["texts"]["Once upon a time"]))' "$TMP/want.json")

# ---- curl ---------------------------------------------------------------------------------------------------
# jq-less checks: python reads the JSON
jget() { python3 -c "import json,sys; d=json.load(sys.stdin); print(json.dumps(eval(sys.argv[1])))" "$1"; }
# req METHOD PATH BODY: "STATUS BODY" of one request
req() { curl -s -o "$TMP/body" -w '%{http_code}' -X "$1" "$B$2" -H 'Content-Type: application/json' ${3:+--data-binary "$3"}; }

st=$(req GET /v1/models)
[ "$st" = 200 ] && [ "$(jget 'd["data"][0]["id"]' < "$TMP/body")" = '"stories15M"' ] && ok "curl: GET /v1/models" ||
    bad "GET /v1/models: $st $(cat "$TMP/body")"
st=$(req POST /v1/completions '{"model":"stories15M","prompt":"Once upon a time","max_tokens":'$N',"temperature":0}')
[ "$st" = 200 ] && [ "$(jget 'd["choices"][0]["text"]' < "$TMP/body")" = "$want0" ] &&
    ok "curl: a greedy completion equals generate's text" || bad "curl completion: $st $(cat "$TMP/body")"
[ "$(jget '[d["usage"][k] for k in ("prompt_tokens","completion_tokens","total_tokens")]' < "$TMP/body")" = "[5, $N, $((5 + N))]" ] &&
    ok "curl: usage counts 5 + $N" || bad "usage: $(cat "$TMP/body")"
curl -sN "$B/v1/chat/completions" -d '{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":'$N',"temperature":0,"stream":true}' > "$TMP/sse"
got=$(python3 -c '
import json, sys
t, ev = "", [l for l in open(sys.argv[1]).read().split("\n\n") if l]
assert all(e.startswith("data: ") for e in ev) and ev[-1] == "data: [DONE]", ev[-2:]
for e in ev[:-1]:
    for c in json.loads(e[6:])["choices"]:
        t += c["delta"].get("content") or ""
print(json.dumps(t))' "$TMP/sse")
[ "$got" = "$want0" ] && ok "curl: a streamed chat (server-sent events, [DONE] last) equals generate's text" ||
    bad "curl stream: $got vs $want0"

# errors in OpenAI's shape: STATUS TYPE PARAM for each bad request
errcase() {
    local want=$1 type=$2 param=$3 desc=$4
    shift 4
    local st
    st=$(req "$@")
    local shape
    shape=$(jget '[d["error"]["type"], d["error"]["param"], type(d["error"]["message"]).__name__]' < "$TMP/body" 2>/dev/null)
    [ "$st" = "$want" ] && [ "$shape" = "[\"$type\", $param, \"str\"]" ] && ok "$desc: $want $type" ||
        bad "$desc: $st $(head -c 300 "$TMP/body"), want $want $type $param"
}
errcase 400 invalid_request_error '"temperature"' "temperature 2.5" POST /v1/completions '{"prompt":"a","temperature":2.5}'
errcase 400 invalid_request_error '"max_tokens"' "max_tokens 0" POST /v1/completions '{"prompt":"a","max_tokens":0}'
errcase 400 invalid_request_error '"stop"' "stop of 5 strings" POST /v1/completions '{"prompt":"a","stop":["a","b","c","d","e"]}'
errcase 400 invalid_request_error '"prompt"' "a prompt that is a number" POST /v1/completions '{"prompt":5}'
errcase 400 invalid_request_error '"prompt"' "token ids outside the vocabulary" POST /v1/completions '{"prompt":[1,99999]}'
errcase 400 invalid_request_error '"logprobs"' "logprobs" POST /v1/completions '{"prompt":"a","logprobs":2}'
errcase 400 invalid_request_error '"frequency_penalty"' "frequency_penalty 1" POST /v1/completions '{"prompt":"a","frequency_penalty":1}'
errcase 400 invalid_request_error '"messages"' "a message without a role" POST /v1/chat/completions '{"messages":[{"content":"a"}]}'
errcase 400 invalid_request_error '"messages"' "an image part" POST /v1/chat/completions '{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}'
errcase 400 invalid_request_error null "a body that is not JSON" POST /v1/completions '{"prompt": "a",'
long=$(python3 -c 'print(",".join(["1"] + ["450"] * 300))')
errcase 400 invalid_request_error '"prompt"' "a prompt longer than the context" POST /v1/completions '{"prompt":['"$long"']}'
errcase 404 invalid_request_error '"model"' "an unknown model" POST /v1/completions '{"model":"llama","prompt":"a"}'
errcase 404 not_found_error null "an unknown URL" GET /v1/embeddings
errcase 405 invalid_request_error null "GET of a POST route" GET /v1/completions
head -c 2000000 /dev/zero | tr '\0' 'a' > "$TMP/big"
st=$(curl -s -o "$TMP/body" -w '%{http_code}' "$B/v1/completions" --data-binary @"$TMP/big")
[ "$st" = 413 ] && grep -q '"error"' "$TMP/body" && ok "a 2 MB body: 413 in OpenAI's shape" || bad "big body: $st $(head -c 200 "$TMP/body")"
printf 'GET / HTTP/1.1\r\nHost x\r\n\r\n' | timeout 60 python3 -c '
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1]))); s.sendall(sys.stdin.buffer.read())
print(s.recv(4096).decode().split("\r\n")[0])' "$PORT" > "$TMP/raw"
grep -q "^HTTP/1.1 400 " "$TMP/raw" && ok "a malformed header line: 400" || bad "malformed header: $(cat "$TMP/raw")"
st=$(req GET /health)
[ "$st" = 200 ] && ok "still serving after the bad requests (GET /health)" || bad "/health: $st"

# ---- the npm openai package ---------------------------------------------------------------------------------
NODE_PATH="$MODS" node "$SEPAL_SRC_DIR/tests/cli/serve_client.js" "$B/v1" "$TMP/want.json" > "$TMP/node.out" 2>&1
rc=$?
while IFS= read -r line; do
    case "$line" in ok:*) ok "${line#ok: }" ;; FAIL:*) bad "${line#FAIL: }" ;; *) echo "    $line" ;; esac
done < "$TMP/node.out"
[ $rc -eq 0 ] && ok "node serve_client.js exits 0" || bad "node serve_client.js: exit $rc"

# ---- `sepal serve` on the command line, over the same swarm, with a token; and one without servers ---------
DHT=$(grep -oE '^  dht node +127\.0\.0\.1:[0-9]+' "$TMP/out" | head -1 | grep -oE '[0-9]+$')
echo "s3cret-token" > "$TMP/token"
"$SEPAL" serve --http 127.0.0.1:0 --model "$M" --initial-peers "127.0.0.1:$DHT" --api-key-file "$TMP/token" \
    > "$TMP/out2" 2> "$TMP/err2" &
PID2=$!
"$SEPAL" serve --http 127.0.0.1:0 --model "$M" > "$TMP/out3" 2> "$TMP/err3" &
PID3=$!
P2=$(port_of "$TMP/out2")
P3=$(port_of "$TMP/out3")
if [ -n "$P2" ]; then
    B="http://127.0.0.1:$P2"
    errcase 401 authentication_error null "no token" POST /v1/completions '{"prompt":"a"}'
    st=$(curl -s -o "$TMP/body" -w '%{http_code}' -H 'Authorization: Bearer wrong' "$B/v1/models")
    [ "$st" = 401 ] && ok "a wrong token: 401" || bad "wrong token: $st"
    st=$(curl -s -o "$TMP/body" -w '%{http_code}' -H 'Authorization: Bearer s3cret-token' "$B/v1/completions" \
        -d '{"prompt":"Once upon a time","max_tokens":'$N',"temperature":0}')
    [ "$st" = 200 ] && [ "$(jget 'd["choices"][0]["text"]' < "$TMP/body")" = "$want0" ] &&
        ok "sepal serve --model --initial-peers --api-key-file: the same greedy text with the token" ||
        bad "sepal serve with a token: $st $(cat "$TMP/body")"
else
    bad "sepal serve --initial-peers did not start: $(tail -3 "$TMP/err2")"
fi
if [ -n "$P3" ]; then
    B="http://127.0.0.1:$P3"
    errcase 503 unavailable_error null "no servers" POST /v1/completions '{"prompt":"a"}'
else
    bad "sepal serve without servers did not start: $(tail -3 "$TMP/err3")"
fi

# ---- the model's chat template: a copy of the model whose tokenizer_config.json has one ----------------------
# (the same directory name: the same model in the swarm). It drops the system message and joins the rest with
# spaces after BOS, so that the chat's prompt is "Once upon a time": generate's greedy text, 5 tokens; the plain
# template would have joined the three messages with newlines. It raises when the last message is not the user's.
# shellcheck disable=SC2016
chat_tpl() {
    mkdir -p "$TMP/$1/stories15M"
    for f in "$M"/*; do [ "${f##*/}" = tokenizer_config.json ] || ln -s "$f" "$TMP/$1/stories15M/"; done
    python3 -c 'import json, sys
c = json.load(open(sys.argv[1])); c["chat_template"] = sys.argv[2]
json.dump(c, open(sys.argv[3], "w"))' "$M/tokenizer_config.json" "$2" "$TMP/$1/stories15M/tokenizer_config.json"
}
chat_tpl tpl "{% if messages[-1]['role'] != 'user' %}{{ raise_exception('the last message must be the user\\'s') }}{% endif %}
{{- bos_token }}{% for m in messages if m.role != 'system' %}{{ m.content|trim }}{% if not loop.last %} {% endif %}{% endfor %}"
"$SEPAL" serve --http 127.0.0.1:0 --model "$TMP/tpl/stories15M" --initial-peers "127.0.0.1:$DHT" > "$TMP/out4" 2> "$TMP/err4" &
PID4=$!
P4=$(port_of "$TMP/out4")
grep -q "(the chat template of tokenizer_config.json;" "$TMP/out4" && ok "serve says it uses the model's chat template" ||
    bad "serve's first line: $(head -2 "$TMP/out4")"
if [ -n "$P4" ]; then
    B="http://127.0.0.1:$P4"
    st=$(req POST /v1/chat/completions '{"messages":[{"role":"system","content":"Ignore me"},{"role":"user","content":"Once upon"},{"role":"user","content":" a time "}],"max_tokens":'$N',"temperature":0}')
    [ "$st" = 200 ] && [ "$(jget 'd["choices"][0]["message"]["content"]' < "$TMP/body")" = "$want0" ] &&
        [ "$(jget 'd["usage"]["prompt_tokens"]' < "$TMP/body")" = 5 ] &&
        ok "a chat through the model's template: the prompt it renders (5 tokens), generate's greedy text" ||
        bad "chat template: $st $(head -c 400 "$TMP/body")"
    errcase 400 invalid_request_error '"messages"' "the template's raise_exception" POST /v1/chat/completions \
        '{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]}'
    grep -q "chat template: raise_exception: the last message must be the user's" "$TMP/body" &&
        ok "its message is the template's" || bad "raise_exception's message: $(cat "$TMP/body")"
else
    bad "sepal serve with a chat template did not start: $(tail -3 "$TMP/err4")"
fi
kill -INT $PID4; wait $PID4
chat_tpl badtpl "{% for m in messages %}{{ m.content | frobnicate }}{% endfor %}"
expect 1 "a chat template outside the subset" \
    "serve: $TMP/badtpl/stories15M/tokenizer_config.json: chat template line 1: unknown filter 'frobnicate'" -- \
    "$SEPAL" serve --http 127.0.0.1:0 --model "$TMP/badtpl/stories15M"

kill -INT $PID2 $PID3
wait $PID2; rc2=$?
wait $PID3; rc3=$?
[ $rc2 -eq 130 ] && [ $rc3 -eq 130 ] && ok "sepal serve: Ctrl-C ends it with 130" || bad "sepal serve exits $rc2 / $rc3"
expect 1 "sepal serve --http nonsense" "expected HOST:PORT" -- "$SEPAL" serve --http nonsense
expect 1 "sepal serve without a model" "no model loaded" -- "$SEPAL" serve --http 127.0.0.1:0
expect 1 "a port in use" "cannot listen on 127.0.0.1:$PORT: Address already in use" -- \
    "$SEPAL" -c "load $M; serve --http 127.0.0.1:$PORT"

# ---- Ctrl-C with a stream in progress -----------------------------------------------------------------------
B="http://127.0.0.1:$PORT"
curl -sN "$B/v1/completions" -d '{"prompt":"Once upon a time","max_tokens":250,"ignore_eos":true,"stream":true}' > "$TMP/cut" &
CURL=$!
for _ in $(seq 200); do [ "$(grep -c '^data: ' "$TMP/cut")" -ge 3 ] && break; sleep 0.05; done
kill -INT $PID
wait $CURL
wait $PID; rc=$?
[ $rc -eq 130 ] && ok "Ctrl-C stops the session's serve: exit 130" || bad "serve session exit $rc"
grep -q '^data: {"error":{"message":"the endpoint is stopping"' "$TMP/cut" && ! grep -q '^data: \[DONE\]' "$TMP/cut" &&
    ok "the stream in progress ends with an error event" || bad "the cut stream: $(tail -c 300 "$TMP/cut")"
# the log: a line per request, with its status, tokens, speed and the requests active
grep -qE '^serve: #[0-9]+ POST /v1/completions 200: 5 \+ 24 tokens in [0-9.]+ s \([0-9.]+ tok/s\); [0-9]+ active$' "$TMP/err" &&
    ok "the log has each request's line" || bad "log lines: $(grep 'serve: #' "$TMP/err" | head -3)"
grep -qE '^sepal: warning: serve: #[0-9]+ POST /v1/completions 400: .temperature. must be a number in \[0, 2\]; [0-9]+ active$' "$TMP/err" &&
    ok "the log says each error" || bad "log error lines: $(grep 'serve: #.* 400' "$TMP/err" | head -3)"
grep -qE '^serve: stopped after [0-9]+ requests \([0-9]+ failed\)$' "$TMP/err" && ok "serve says how it ended" ||
    bad "no end line: $(tail -3 "$TMP/err")"
finish
