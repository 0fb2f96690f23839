# lib.bash - tiny assertion helpers for the shell-level tests (sourced). Each test ends with `finish`,
# which prints "N passed, N failed" and exits non-zero on any failure.
set -u
PASS=0
FAIL=0
SEPAL="${SEPAL_BIN_DIR:?}/app/sepal"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/sepal-cli-XXXXXX")
trap 'rm -rf "$TMP"' EXIT

ok() { PASS=$((PASS + 1)); echo "ok: $1"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL: $1"; }

# expect CODE DESCRIPTION PATTERN -- cmd...: runs cmd, checks its exit code and that stdout+stderr match PATTERN
expect() {
    local code=$1 desc=$2 pat=$3
    shift 4
    local out rc
    out=$("$@" 2>&1)
    rc=$?
    if [ "$rc" -ne "$code" ]; then
        bad "$desc: exit $rc, expected $code"; printf '%s\n' "$out" | tail -5 | sed 's/^/    /'
    elif [ -n "$pat" ] && ! printf '%s\n' "$out" | grep -qE -- "$pat"; then
        bad "$desc: output lacks /$pat/"; printf '%s\n' "$out" | tail -5 | sed 's/^/    /'
    else
        ok "$desc"
    fi
}

# fuzz_smoke TARGET: tests/fuzz/run.sh --target TARGET for 20 s; ok when libFuzzer finished its runs cleanly
fuzz_smoke() {
    local out rc
    out=$(bash "${SEPAL_SRC_DIR:?}/tests/fuzz/run.sh" --target "$1" 20 2>&1)
    rc=$?
    printf '%s\n' "$out" | grep -E "^(Done|stat::|fuzz:)" | sed 's/^/    /'
    if [ "$rc" -eq 0 ] && printf '%s\n' "$out" | grep -qE "^Done [0-9]+ runs"; then
        ok "fuzz_$1 20 s without a crash"
    else
        bad "fuzz_$1: exit $rc"
        printf '%s\n' "$out" | tail -30 | sed 's/^/    /'
    fi
}

finish() {
    echo "$PASS passed, $FAIL failed"
    [ "$FAIL" -eq 0 ]
    exit $?
}

# need_stories15M: the converted stories15M in $SEPAL_STORIES15M_DIR, else a failure and the end
need_stories15M() {
    if [ ! -f "${SEPAL_STORIES15M_DIR:?}/model.safetensors" ]; then
        bad "$SEPAL_STORIES15M_DIR: no converted stories15M; run scripts/fetch-model.sh first"
        finish
    fi
}

# narrow_llama DIR LAYERS: a narrow Llama-2-7B shape (`model init --like llama-2-7b`, LAYERS layers of 256) at DIR,
# with a fresh throughput cache ($SEPAL_CACHE in $TMP, where stories15M's tokenizer is found)
narrow_llama() {
    export SEPAL_CACHE="$TMP/cache"
    mkdir -p "$SEPAL_CACHE/models" && ln -s "${SEPAL_STORIES15M_DIR:?}" "$SEPAL_CACHE/models/stories15M"
    expect 0 "a narrow Llama-2-7B shape" "$2 layers of 256" -- "$SEPAL" model init "$1" --like llama-2-7b --layers "$2" \
        --hidden 256
}
