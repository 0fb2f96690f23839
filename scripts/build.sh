#!/usr/bin/env bash
# Configures and builds into build/ (or $SEPAL_BUILD_DIR), optimised: CMake's Release (-O3). The demo, the tests
# and the benchmarks use this build. Another build is asked for by name, first on the command line:
#   --type release         the default (-O3 -DNDEBUG)
#   --type relwithdebinfo  -O2 -g (what a debugger or perf wants; slower: ~0.6x the f32 decode of Release)
#   --type debug           -O0 -g
#   --type asan            Debug with ASan+UBSan at -O1 (ASan's advice: ~0.6x the -O0 time of a generation, the
#                          same reports), no CUDA (into build-asan unless $SEPAL_BUILD_DIR says)
# Every run configures the type again, so a build directory configured otherwise before becomes this type.
# Extra arguments go to cmake's configure step (after the type's, so a -D there wins).
set -euo pipefail
cd "$(dirname "$0")/.."
type=release
if [ "${1:-}" = --type ]; then
    [ $# -ge 2 ] || { echo "build.sh: --type needs release, relwithdebinfo, debug or asan" >&2; exit 2; }
    type="$2"
    shift 2
fi
case "$type" in
release) flags=(-DCMAKE_BUILD_TYPE=Release -DSEPAL_SANITIZE=OFF) ;;
relwithdebinfo) flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DSEPAL_SANITIZE=OFF) ;;
debug) flags=(-DCMAKE_BUILD_TYPE=Debug -DSEPAL_SANITIZE=OFF) ;;
asan) flags=(-DCMAKE_BUILD_TYPE=Debug "-DCMAKE_C_FLAGS_DEBUG=-g -O1" -DSEPAL_SANITIZE=ON -DSEPAL_CUDA=OFF) ;;
*) echo "build.sh: unknown build type '$type' (release, relwithdebinfo, debug or asan)" >&2; exit 2 ;;
esac
BUILD="${SEPAL_BUILD_DIR:-$([ "$type" = asan ] && echo build-asan || echo build)}"
mkdir -p "$BUILD"
cmake -S . -B "$BUILD" "${flags[@]}" "$@" > "$BUILD/configure.log" 2>&1 || { cat "$BUILD/configure.log"; exit 1; }
grep -E "^-- sepal:" "$BUILD/configure.log" || true
cmake --build "$BUILD" -j"$(nproc)"
