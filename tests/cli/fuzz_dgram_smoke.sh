#!/usr/bin/env bash
# The DHT front's fuzz target for 20 s (tests/fuzz/run.sh --target dgram: clang + libFuzzer + ASan/UBSan, from the
# seeds in tests/fuzz/corpus-dgram): no crash, leak or sanitizer report, and nothing the front passes that
# msgpack-c (OpenDHT's parser) refuses.
. "$(dirname "$0")/lib.bash"
fuzz_smoke dgram
finish
