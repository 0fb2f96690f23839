#!/usr/bin/env bash
# `serve` inside the TUI: the real `sepal` in tmux (tui_tmux.bash) serving a real 2-server swarm of stories15M
# whose servers answer 20 ms late (SEPAL_SERVER_FAULT=slow:20, so that a request lasts long enough to be seen).
# While serving, the Generate panel shows the endpoint: its URL, the requests active and waiting, tokens/s,
# served and failed, a line per request in progress (its kind, its tokens so far), the last error; the log has a
# line per request; Ctrl-C ends serving and the panel is the generation's again; the recorded events replay.
# Every check polls the screen.
. "$(dirname "$0")/lib.bash"
. "$(dirname "$0")/tui_tmux.bash"
start s 100x30 LANG=C.UTF-8 SEPAL_SERVER_FAULT=slow:20 -- \
    -c "'load $M; swarm up 2; serve --http 127.0.0.1:0 --parallel 2'" --record-events "$TMP/rec.jsonl" --tui
check s "serving: the panel says so" "─ 3 Generate ─+ serving: 0 active ─" 90
check s "its figures: none active yet, 0 tok/s, none served" "0 active +0\.0 tok/s +0 served +0 failed"
URL=$(pane s | grep -oE 'http://127\.0\.0\.1:[0-9]+/v1' | head -1)
[ -n "$URL" ] && ok "the panel shows where it serves ($URL)" || bad "no URL on the screen"

# a long streamed completion, and a second one: both show while they run
body='{"prompt":"Once upon a time","max_tokens":120,"ignore_eos":true,"temperature":0,"stream":true}'
curl -sN "$URL/completions" -d "$body" > "$TMP/s1" &
C1=$!
curl -s "$URL/chat/completions" -d '{"messages":[{"role":"user","content":"Tom had a red kite"}],"max_tokens":100,"ignore_eos":true}' > "$TMP/s2" &
C2=$!
check s "two requests active" "serving: 2 active" 30
check s "a line per request: a streamed completion with its tokens so far" \
    "#[0-9]+ completion, streamed: 5 \+ [0-9]+ tokens in [0-9.]+ s"
check s "... and a chat" "#[0-9]+ chat: [0-9]+ \+ [0-9]+ tokens in [0-9.]+ s"
check s "the tokens/s of both" "2 active +[1-9][0-9.]* tok/s"
# a bad request meanwhile
st=$(curl -s -o "$TMP/bad" -w '%{http_code}' "$URL/completions" -d '{"prompt":"a","temperature":5}')
[ "$st" = 400 ] && ok "a bad request: 400" || bad "bad request: $st"
check s "the failure counted" "[1-9] failed"
check s "the last error, at the panel's bottom" "last error: #[0-9]+ POST /v1/completions 400: "
wait $C1 $C2
check s "the requests done: none active, 3 served" "0 active .* 3 served +1 failed" 30
check s "the log: a line per request" "serve: #[0-9]+ POST /v1/completions 200: 5 \+ 120 tokens in [0-9.]+ s \([0-9.]+ tok/s, streamed\)"
grep -q '^data: \[DONE\]' "$TMP/s1" && ok "the stream ended with [DONE]" || bad "stream: $(tail -c 200 "$TMP/s1")"

# Ctrl-C ends serving: the panel is the generation's again
keys s C-c
check s "Ctrl-C: serve stops (the log says how it went)" "serve: stopped after 3 requests \(1 failed\)" 20
check s "the panel is the generation's again" "nothing generated yet"
keys s Escape
keys s q
check s "q leaves" "^\[exit 0\]" 20

# the recording replays the same screens
grep -q '"k":"serve"' "$TMP/rec.jsonl" && ok "the events are recorded" || bad "no serve event recorded"
start p 100x30 LANG=C.UTF-8 -- --replay-events "$TMP/rec.jsonl" --tui
check p "the replay shows the endpoint's requests" "#[0-9]+ completion, streamed: 5 \+ [0-9]+ tokens" 60
finish
