#!/usr/bin/env bash
# Builds a fuzz target with clang, libFuzzer and ASan+UBSan, and runs it for SECONDS (default 20) on a copy of its
# seed corpus, so the repository's seeds stay as they are. Exits non-zero on any crash, leak, sanitizer report or
# violated invariant; the crashing input is kept in the work directory it names. Targets:
#   proto  the wire-protocol decoders (tests/fuzz/fuzz_proto.c, seeds tests/fuzz/corpus, the dictionary
#          tests/fuzz/meta.dict of metadata keys and JSON pieces)
#   dgram  the DHT's UDP front, dht/front.c, against msgpack-c (tests/fuzz/fuzz_dgram.cpp, seeds
#          tests/fuzz/corpus-dgram)
#
# Usage: tests/fuzz/run.sh [--target proto|dgram] [SECONDS]
#        tests/fuzz/run.sh [--target proto|dgram] --write-seeds [DIR]    regenerate the seeds (default: the target's)
# Needs clang and its libFuzzer runtime (Debian: clang, libclang-rt-14-dev; scripts/install-deps.sh); dgram also
# msgpack-c (libmsgpack-cxx-dev, which OpenDHT's headers need anyway).
set -euo pipefail

SRC=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=proto
if [ "${1:-}" = "--target" ]; then
    TARGET=${2:-}
    shift 2
fi
case "$TARGET" in
    proto | dgram) ;;
    *) echo "fuzz: unknown target '$TARGET' (proto or dgram)" >&2; exit 2 ;;
esac
CC=${FUZZ_CC:-}
if [ -z "$CC" ]; then
    for c in clang clang-14; do
        if command -v "$c" >/dev/null 2>&1; then CC=$c; break; fi
    done
fi
if [ -z "$CC" ]; then
    echo "fuzz: clang not found (scripts/install-deps.sh installs it)" >&2
    exit 2
fi
if ! pkg-config --exists libcjson; then
    echo "fuzz: libcjson not found (scripts/install-deps.sh installs it)" >&2
    exit 2
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/sepal-fuzz-XXXXXX")
# build_TARGET seeds|fuzz: builds $WORK/fuzz_TARGET_seeds (the seed writer) or $WORK/fuzz_TARGET (the fuzzer)
build_proto() {
    # proto.c needs only these files of common/ (the rest may pull in more libraries)
    local sources=("$SRC/ws/proto.c" "$SRC/common/status.c" "$SRC/common/half.c" "$SRC/common/hex.c") cjson_cflags cjson_libs
    read -r -a cjson_cflags <<<"$(pkg-config --cflags libcjson)"
    read -r -a cjson_libs <<<"$(pkg-config --libs libcjson)"
    local cflags=(-g -O1 -std=c11 -D_GNU_SOURCE -I"$SRC/ws" -I"$SRC/common" "${cjson_cflags[@]}")
    if [ "$1" = seeds ]; then
        "$CC" "${cflags[@]}" -DFUZZ_PROTO_SEEDS "$SRC/tests/fuzz/fuzz_proto.c" "${sources[@]}" "${cjson_libs[@]}" -lm \
            -o "$WORK/fuzz_proto_seeds"
    else
        "$CC" "${cflags[@]}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
            "$SRC/tests/fuzz/fuzz_proto.c" "${sources[@]}" "${cjson_libs[@]}" -lm -o "$WORK/fuzz_proto"
    fi
}
build_dgram() { # the front is C, the target C++ (msgpack-c): compiled apart, linked by clang++
    local cxx=${CC/clang/clang++} flags=(-g -O1 -I"$SRC/dht")
    local san=(-fsanitize=address,undefined -fno-sanitize-recover=undefined)
    if [ "$1" = seeds ]; then
        "$cxx" -std=c++17 "${flags[@]}" -DFUZZ_DGRAM_SEEDS "$SRC/tests/fuzz/fuzz_dgram.cpp" -o "$WORK/fuzz_dgram_seeds"
    else
        "$CC" -std=c11 "${flags[@]}" "${san[@]}" -fsanitize=fuzzer-no-link -c "$SRC/dht/front.c" -o "$WORK/front.o"
        "$cxx" -std=c++17 "${flags[@]}" "${san[@]}" -fsanitize=fuzzer "$SRC/tests/fuzz/fuzz_dgram.cpp" "$WORK/front.o" \
            -o "$WORK/fuzz_dgram"
    fi
}
CORPUS=$SRC/tests/fuzz/corpus DICT=(-dict="$SRC/tests/fuzz/meta.dict")
[ "$TARGET" = dgram ] && CORPUS=$SRC/tests/fuzz/corpus-dgram DICT=()

if [ "${1:-}" = "--write-seeds" ]; then
    OUTDIR=${2:-$CORPUS}
    mkdir -p "$OUTDIR"
    "build_$TARGET" seeds
    "$WORK/fuzz_${TARGET}_seeds" "$OUTDIR"
    rm -rf "$WORK"
    echo "fuzz: seeds written to $OUTDIR"
    exit 0
fi

SECONDS_TO_RUN=${1:-20}
case "$SECONDS_TO_RUN" in
    '' | *[!0-9]*) echo "usage: $0 [--target proto|dgram] [SECONDS] | --write-seeds [DIR]" >&2; exit 2 ;;
esac

echo "fuzz: building the $TARGET target with $CC in $WORK"
"build_$TARGET" fuzz
mkdir -p "$WORK/corpus"
cp "$CORPUS"/* "$WORK/corpus/"

echo "fuzz: running for ${SECONDS_TO_RUN}s on $(ls "$WORK/corpus" | wc -l) seeds"
rc=0
(cd "$WORK" && "./fuzz_$TARGET" -max_total_time="$SECONDS_TO_RUN" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
    "${DICT[@]}" -print_final_stats=1 -artifact_prefix="$WORK/" corpus) >"$WORK/log" 2>&1 || rc=$?
grep -E "^(Done|stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss_mb)|^#[0-9]+ +DONE" \
    "$WORK/log" || true
if [ "$rc" -ne 0 ]; then
    tail -40 "$WORK/log"
    echo "fuzz: FAILED (exit $rc); log, inputs and crash artifacts kept in $WORK" >&2
    exit 1
fi
rm -rf "$WORK"
echo "fuzz: ok"
