#!/usr/bin/env bash
# Push auto where the client's links and the servers' links to each other differ: 3 servers of a narrow Llama-2-7B
# shape (0:2, 2:4, 4:6), each behind a bench/linkem link it --announce's, which the client crosses with one delay and
# the servers (connecting from 127.0.0.2: `--source-address`, linkem's `--from`) with another; the servers' pings
# to each other (their DHT records) measure their own links, the client's pings its own. Routing prices both ways
# of running the chain and push auto takes the cheaper:
#   client links 60 ms, server links 1 ms:   pushed 60 + 1 + 1 + 60 = 122 ms a step, relayed 3 x 120 = 360: pushed;
#   client links 2 ms, server links 100 ms:  pushed 2 + 100 + 100 + 2 = 204 ms a step, relayed 3 x 4 = 12: relayed
# (the client's pings average 1 ms or more in both, so the old rule, push wherever the pings are that far, pushed
# both; the margins are wide, since a loaded machine adds to every ping, and the generation routes anew). Training's
# FORWARDs and BACKWARDs are priced the same way (pushed 60 + 1 + 1 + 60 against 360 relayed; 2 + 100 + 100 + 2
# against 12). Asserted on the route chosen (`route` says ", pushed") and on the steps and passes the servers pushed
# in a generation and two prompt-tuning steps (their shutdown counts), never on timings.
. "$(dirname "$0")/lib.bash"
. "${SEPAL_SRC_DIR:?}/bench/relays.sh" # relays_from
S="$SEPAL_BIN_DIR/server/sepal-server"
linkem="$SEPAL_BIN_DIR/bench/linkem" tmp="$TMP"
M="$TMP/l7"
narrow_llama "$M" 6
python3 -c "print(' '.join(['Once upon a time there was a little girl who liked to play in the park.'] * 40))" > "$TMP/text.txt"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$TMP"' EXIT
pushes() { sed -n 's/^sepal-server: shutting down (.*; pushes: \([0-9]*\) in, \([0-9]*\) out)$/\1 \2/p' "$TMP/s$1.out"; }

# topology NAME CLIENT_MS SERVER_MS WANT (pushed|relayed): a fresh swarm behind such links; the route push auto
# takes once the servers' pings are in their records, and the pushes of a generation of 6 tokens.
topology() {
    local name=$1 cms=$2 sms=$3 want=$4 P1 P2 P3 D1 D2 D3 A1 A2 A3 n
    read -r P1 P2 P3 D1 D2 D3 < <(free_ports 6)
    relays_from "$name" "$cms" 127.0.0.2 "$sms" $P1 $P2 $P3 > "$TMP/$name.ports"
    read -r A1 A2 A3 < "$TMP/$name.ports"
    [ -n "$A3" ] && grep -q "^linkem:   from 127\.0\.0\.2, delay $sms ms / $sms ms" "$TMP/$name.out" &&
        ok "$name: links of $cms ms from the client, $sms ms from the servers" || bad "$name: linkem did not start"
    local peers=(--new-swarm) spid=()
    for n in 1 2 3; do
        local port dht ann
        port=$(eval echo "\$P$n") dht=$(eval echo "\$D$n") ann=$(eval echo "\$A$n")
        "$S" --model "$M" --blocks "$(( 2 * n - 2 )):$(( 2 * n ))" --port "$port" --bulk-port -1 --dht-port "$dht" \
            --no-measure --announce "127.0.0.1:$ann" --source-address 127.0.0.2 "${peers[@]}" > "$TMP/s$n.out" 2>&1 &
        pids+=($!) spid+=($!)
        peers=(--initial-peers "127.0.0.1:$D1")
    done
    # until S1's and S2's records carry their pings to their successors, a pushed chain guesses each switch from the
    # client's own ping: the route is read until it is as the links make it
    local hops="^0:2 127\.0\.0\.1:$A1 \([0-9.]+ ms\) -> 2:4 127\.0\.0\.1:$A2 \([0-9.]+ ms\) -> 4:6 127\.0\.0\.1:$A3"
    local route_re="$hops .*steps/s expected$" line=""
    [ "$want" = pushed ] && route_re="$hops .*steps/s expected, pushed$"
    for _ in $(seq ${ROUTE_TRIES:-60}); do
        line=$("$SEPAL" -c "load $M; connect --initial-peers 127.0.0.1:$D1; set push auto; route" 2>/dev/null |
            grep -E '^0:2 ')
        grep -qE "$route_re" <<< "$line" && break
        sleep 1
    done
    grep -qE "$route_re" <<< "$line" && ok "$name: push auto routes the chain $want ($line)" ||
        { bad "$name: push auto: route '$line', expected it $want"
          "$SEPAL" -c "load $M; connect --initial-peers 127.0.0.1:$D1; servers -l" 2>&1 | grep -E 'address|next pings|ping  '; }
    "$SEPAL" -c "load $M; connect --initial-peers 127.0.0.1:$D1; set push auto; set ignore-eos on;
                 generate 'Once upon a time' --max-new-tokens 6" > /dev/null 2> "$TMP/$name.gen" &&
        ok "$name: the client generates" || { bad "$name: generate"; tail -3 "$TMP/$name.gen"; }
    # a prompt-tuning step in a fresh client (its pings measured when a pass is priced): its FORWARDs and BACKWARDs
    # priced as the generation's steps were
    "$SEPAL" -c "load $M; connect --initial-peers 127.0.0.1:$D1; set push auto;
                 train causal_lm --args 'file=$TMP/text.txt length=16' --tuning ptune --pre-seq-len 2 --batch 2
                 --max-length 16 --max-steps 2 --microbatches 1 --eval-batches 1 --seed 3" > "$TMP/$name.train" 2>&1 &&
        ok "$name: the client trains" || { bad "$name: train"; tail -3 "$TMP/$name.train"; }
    kill "${spid[@]}" 2>/dev/null
    for n in "${spid[@]}"; do wait "$n" 2>/dev/null; done
    local in1 out1 in2 out2 in3 out3
    read -r in1 out1 < <(pushes 1)
    read -r in2 out2 < <(pushes 2)
    read -r in3 out3 < <(pushes 3)
    if [ "$want" = pushed ]; then
        # S1 pushes the generation's steps and training's FORWARDs, S3 training's BACKWARDs, S2 both; only a BACKWARD
        # pushes into S1 or out of S3
        local fwd=$(( out1 - ${in1:-0} ))
        [ "${in1:-0}" -gt 0 ] && [ "${out3:-0}" -eq "$in1" ] && [ "$fwd" -gt 0 ] && [ "${in2:-0}" -eq "$(( out1 + out3 ))" ] &&
            [ "${out2:-0}" -eq "$(( out1 + out3 ))" ] && [ "${in3:-0}" -eq "$out1" ] &&
            ok "$name: the generation's steps and training's FORWARDs went 1 -> 2 -> 3, its BACKWARDs 3 -> 2 -> 1 ($in1 of them)" ||
            bad "$name: pushes: S1 '$in1 $out1', S2 '$in2 $out2', S3 '$in3 $out3'"
    else
        [ "${out1:-x}" = 0 ] && [ "${out2:-x}" = 0 ] && [ "${in2:-x}" = 0 ] && [ "${in3:-x}" = 0 ] && [ "${in1:-x}" = 0 ] &&
            [ "${out3:-x}" = 0 ] && ok "$name: the generation's steps and training's passes were relayed by the client (no pushes)" ||
            bad "$name: pushes: S1 '$in1 $out1', S2 '$in2 $out2', S3 '$in3 $out3'"
    fi
}

topology far-client 60 1 pushed
topology far-servers 2 100 relayed
finish
