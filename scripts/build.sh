#!/usr/bin/env bash
# Configures and builds into build/ (or $SEPAL_BUILD_DIR). Extra arguments go to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${SEPAL_BUILD_DIR:-build}"
mkdir -p "$BUILD"
cmake -S . -B "$BUILD" "$@" > "$BUILD/configure.log" 2>&1 || { cat "$BUILD/configure.log"; exit 1; }
grep -E "^-- sepal:" "$BUILD/configure.log" || true
cmake --build "$BUILD" -j"$(nproc)"
