#!/usr/bin/env bash
# Sampling without --seed draws a fresh seed each run and prints it; --seed S repeats a run, S the seed a run
# printed included: `model generate` (every block in this process) and `generate` through a loopback swarm
# (one session fed through a FIFO, so that the seed one generation printed is given to the next).
. "$(dirname "$0")/lib.bash"
M="${SEPAL_STORIES15M_DIR:?}"
export SEPAL_SERVER_BIN="$SEPAL_BIN_DIR/server/sepal-server"
if [ ! -f "$M/model.safetensors" ]; then
    bad "$M: no converted stories15M; run scripts/fetch-model.sh first"
    finish
fi
SAMPLE=(--temperature 1 --max-new-tokens 24)
seed_of() { grep -oE 'stop: [a-z ]+; seed [0-9]+$' "$1" | tail -1 | grep -oE '[0-9]+$'; }

# ---- model generate ----------------------------------------------------------------------------------------
for r in a b; do
    "$SEPAL" model generate "$M" --prompt "The cat" "${SAMPLE[@]}" > "$TMP/$r.out" 2> "$TMP/$r.err" ||
        bad "model generate run $r: exit $?"
done
sa=$(seed_of "$TMP/a.err"); sb=$(seed_of "$TMP/b.err")
[ -n "$sa" ] && [ -n "$sb" ] && ok "model generate prints the seed it drew ($sa, $sb)" ||
    bad "model generate printed no seed: $(tail -1 "$TMP/a.err")"
[ -n "$sa" ] && [ "$sa" != "$sb" ] && ok "model generate: two runs without --seed draw different seeds" ||
    bad "model generate: the same seed twice ($sa)"
for r in c d; do
    "$SEPAL" model generate "$M" --prompt "The cat" "${SAMPLE[@]}" --seed "${sa:-1}" > "$TMP/$r.out" 2> "$TMP/$r.err"
done
[ -s "$TMP/c.out" ] && cmp -s "$TMP/c.out" "$TMP/d.out" && ok "model generate: --seed S twice, the same text" ||
    bad "model generate: --seed $sa twice differs"
cmp -s "$TMP/a.out" "$TMP/c.out" && ok "model generate: --seed S repeats the run that printed S" ||
    bad "model generate: --seed $sa does not repeat its run: '$(cat "$TMP/a.out")' vs '$(cat "$TMP/c.out")'"
[ "$(seed_of "$TMP/c.err")" = "$sa" ] && ok "model generate: --seed S prints S" ||
    bad "model generate: --seed S printed another"
"$SEPAL" model generate "$M" --prompt "The cat" --max-new-tokens 8 2> "$TMP/g.err" > /dev/null
grep -q "seed" "$TMP/g.err" && bad "greedy model generate prints a seed" || ok "greedy model generate prints no seed"
# the largest seed a run may draw (2^63 - 1: drawn seeds are below 2^63) is one --seed takes, and the seed setting
big=9223372036854775807
"$SEPAL" model generate "$M" --prompt "The cat" "${SAMPLE[@]}" --seed $big > /dev/null 2> "$TMP/big.err" &&
    [ "$(seed_of "$TMP/big.err")" = "$big" ] && ok "model generate: --seed $big (the largest drawn) is taken" ||
    bad "model generate: --seed $big: $(tail -1 "$TMP/big.err")"
"$SEPAL" -c "set seed $big" > /dev/null 2> "$TMP/set.err" && ok "set seed $big" || bad "set seed $big: $(cat "$TMP/set.err")"

# ---- generate through a swarm: one session, commands through a FIFO ----------------------------------------
mkfifo "$TMP/in"
"$SEPAL" < "$TMP/in" > "$TMP/s.out" 2> "$TMP/s.err" &
SESSION=$!
exec 3> "$TMP/in"
trap 'exec 3>&-; kill $SESSION 2>/dev/null; rm -rf "$TMP"' EXIT
# wait_err N: until stderr holds N generation summaries (or 60 s)
wait_err() {
    local i
    for i in $(seq 1200); do
        [ "$(grep -c '; stop: ' "$TMP/s.err")" -ge "$1" ] && return 0
        kill -0 $SESSION 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}
echo "load $M; swarm up 2" >&3
g="generate 'The cat' ${SAMPLE[*]}"
printf 'echo ==1==; %s\necho ==2==; %s\n' "$g" "$g" >&3
wait_err 2 || bad "the swarm session did not generate twice: $(tail -3 "$TMP/s.err")"
seed_n() { grep -oE '; seed [0-9]+$' "$TMP/s.err" | sed -n "$1p" | grep -oE '[0-9]+'; }
s1=$(seed_n 1); s2=$(seed_n 2)
[ -n "$s1" ] && [ -n "$s2" ] && [ "$s1" != "$s2" ] &&
    ok "generate: two runs without --seed draw different seeds ($s1, $s2)" ||
    bad "generate: seeds '$s1' and '$s2'"
printf 'echo ==3==; %s --seed %s\necho ==4==; %s --seed %s\necho ==5==\nquit\n' "$g" "${s1:-1}" "$g" "${s1:-1}" >&3
exec 3>&-
wait $SESSION
rc=$?
[ $rc -eq 0 ] && ok "the swarm session exits 0" || bad "the swarm session: exit $rc; $(tail -3 "$TMP/s.err")"
text() { awk -v s="==$1==" -v e="==$(($1 + 1))==" '$0==s{on=1;next} $0==e{on=0} on' "$TMP/s.out"; }
t1=$(text 1); t3=$(text 3); t4=$(text 4)
[ -n "$t3" ] && [ "$t3" = "$t4" ] && ok "generate: --seed S twice, the same text" ||
    bad "generate: --seed S twice: '$t3' vs '$t4'"
[ -n "$t1" ] && [ "$t1" = "$t3" ] && ok "generate: --seed S repeats the run that printed S" ||
    bad "generate: --seed $s1 does not repeat its run: '$t1' vs '$t3'"
s3=$(seed_n 3)
[ "$s3" = "$s1" ] && ok "generate: --seed S prints S" || bad "generate: --seed $s1 printed '$s3'"
finish
