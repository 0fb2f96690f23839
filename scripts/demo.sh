#!/usr/bin/env bash
# The main job: install dependencies, build, fetch + convert the shipped model (stories15M), describe it,
# then generate a story with it locally. PROMPT and TOKENS override the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh -DCMAKE_BUILD_TYPE=Release
model=$(scripts/fetch-model.sh build/repl/sepal | tail -n 1)
build/repl/sepal model info "$model"
echo
build/repl/sepal model generate "$model" --prompt "${PROMPT:-Once upon a time}" --max-new-tokens "${TOKENS:-200}"
