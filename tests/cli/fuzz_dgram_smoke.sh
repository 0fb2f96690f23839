#!/usr/bin/env bash
# The DHT front's fuzz target for 20 s (tests/fuzz/run.sh --target dgram: clang + libFuzzer + ASan/UBSan, from the
# seeds in tests/fuzz/corpus-dgram): no crash, leak or sanitizer report, and nothing the front passes that
# msgpack-c (OpenDHT's parser) refuses.
. "$(dirname "$0")/lib.bash"
SRC=${SEPAL_SRC_DIR:?}

out=$(bash "$SRC/tests/fuzz/run.sh" --target dgram 20 2>&1)
rc=$?
printf '%s\n' "$out" | grep -E "^(Done|stat::|fuzz:)" | sed 's/^/    /'
if [ "$rc" -eq 0 ] && printf '%s\n' "$out" | grep -qE "^Done [0-9]+ runs"; then
    ok "fuzz_dgram 20 s without a crash"
else
    bad "fuzz_dgram: exit $rc"
    printf '%s\n' "$out" | tail -30 | sed 's/^/    /'
fi
finish
