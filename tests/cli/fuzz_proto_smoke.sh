#!/usr/bin/env bash
# The wire-protocol fuzz target for 20 s (tests/fuzz/run.sh: clang + libFuzzer + ASan/UBSan, from the seeds in
# tests/fuzz/corpus): no crash, leak, sanitizer report or broken decoder invariant.
. "$(dirname "$0")/lib.bash"
SRC=${SEPAL_SRC_DIR:?}

out=$(bash "$SRC/tests/fuzz/run.sh" 20 2>&1)
rc=$?
printf '%s\n' "$out" | grep -E "^(Done|stat::|fuzz:)" | sed 's/^/    /'
if [ "$rc" -eq 0 ] && printf '%s\n' "$out" | grep -qE "^Done [0-9]+ runs"; then
    ok "fuzz_proto 20 s without a crash"
else
    bad "fuzz_proto: exit $rc"
    printf '%s\n' "$out" | tail -30 | sed 's/^/    /'
fi
finish
