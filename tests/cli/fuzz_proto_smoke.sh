#!/usr/bin/env bash
# The wire-protocol fuzz target for 20 s (tests/fuzz/run.sh: clang + libFuzzer + ASan/UBSan, from the seeds in
# tests/fuzz/corpus): no crash, leak, sanitizer report or broken decoder invariant.
. "$(dirname "$0")/lib.bash"
fuzz_smoke proto
finish
