#!/usr/bin/env bash
# fetch-openai-npm.sh - the npm package `openai` (the client OpenAI's users have), pinned, for the test of
# `serve` (tests/cli/serve.sh): `npm pack openai@5.23.2` (the only registry request; no install scripts; the
# package has no dependencies), checked against its sha256 and unpacked into
# $CACHE/node/openai-5.23.2/node_modules/openai. Cache: ${SEPAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sepal}.
# The last line of stdout is the node_modules directory (for NODE_PATH).
set -euo pipefail

VERSION=5.23.2
SHA=a2aa74ff8be1a80a215af201a3d2228e999464d166c1eaec2c9ca313395fbef1
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FETCH_NAME=fetch-openai-npm
# shellcheck source=fetch-lib.sh
. "$REPO_ROOT/scripts/fetch-lib.sh"
CACHE="${SEPAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sepal}"
CACHE="${CACHE/#\~/$HOME}"
TGZ="$CACHE/npm/openai-$VERSION.tgz"
MODS="$CACHE/node/openai-$VERSION/node_modules"

if [[ -f "$MODS/openai/package.json" ]] && grep -q "\"version\": \"$VERSION\"" "$MODS/openai/package.json"; then
    echo "$MODS"
    exit 0
fi
mkdir -p "$CACHE/npm" "$CACHE/node"
WORK="$(mktemp -d "$CACHE/.fetch-openai.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
npm_pack "openai@$VERSION" "openai-$VERSION.tgz" "$TGZ" "$WORK"
verify "$TGZ" "$SHA" "$TGZ" "openai-$VERSION.tgz"
mkdir -p "$WORK/node_modules"
tar -xzf "$TGZ" -C "$WORK" || die "cannot unpack $TGZ; delete it and run this script again"
mv "$WORK/package" "$WORK/node_modules/openai"
rm -rf "$CACHE/node/openai-$VERSION"
mkdir -p "$CACHE/node/openai-$VERSION"
mv "$WORK/node_modules" "$MODS"
echo "$MODS"
