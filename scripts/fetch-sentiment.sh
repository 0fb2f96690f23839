#!/usr/bin/env bash
# fetch-sentiment.sh - the UCI "Sentiment Labelled Sentences" data for the sst2 training task (plugins/sst2).
#
# Cache: ${SEPAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sepal}. The data comes from the npm package
# sentiment@5.0.2 (the only registry request this script makes: `npm pack` of that package, no install
# scripts, kept in $CACHE/npm), whose test fixtures amazon.json, yelp.json and imdb.json (1000 labelled
# sentences each) are checked against known sha256 digests and copied into $CACHE/sentiment/ under temporary
# names, then renamed into place. The last line of stdout is the data directory.
set -euo pipefail

PKG="sentiment@5.0.2"
TGZ_NAME="sentiment-5.0.2.tgz"
declare -A SHA=(
    [amazon.json]="bc5eb0cac49fc45987301f1dc2d02cf5ca356ba6c882be179dce77d74e666ed9"
    [yelp.json]="9f3f47983f21eeb819380767b74bfa648eca208f156241111454b3e122773ff7"
    [imdb.json]="44a7b9082ed732ee2de3c858ea5ee2e99aca34f239a1c4359d3a300bf099bdb5"
)
FILES=(amazon.json yelp.json imdb.json)

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FETCH_NAME=fetch-sentiment
# shellcheck source=fetch-lib.sh
. "$REPO_ROOT/scripts/fetch-lib.sh"
CACHE="${SEPAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sepal}"
CACHE="${CACHE/#\~/$HOME}" # a quoted ~ (SEPAL_CACHE="~/x"), expanded as a shell would
DIR="$CACHE/sentiment"
TGZ="$CACHE/npm/$TGZ_NAME"

# Fast path: all three files present with the expected digests.
complete=1
for f in "${FILES[@]}"; do
    if [[ ! -f "$DIR/$f" || "$(sha256_of "$DIR/$f")" != "${SHA[$f]}" ]]; then
        complete=0
    fi
done
if [[ "$complete" == 1 ]]; then
    echo "$DIR"
    exit 0
fi

mkdir -p "$CACHE/npm" "$DIR"
WORK="$(mktemp -d "$CACHE/.fetch-sentiment.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# 1. The package (unless cached).
npm_pack "$PKG" "$TGZ_NAME" "$TGZ" "$WORK"

# 2. The fixtures, verified, then renamed into place.
members=()
for f in "${FILES[@]}"; do
    members+=("package/test/fixtures/$f")
done
tar -xzf "$TGZ" -C "$WORK" "${members[@]}" ||
    die "cannot extract the fixtures from $TGZ; delete it and run this script again"
for f in "${FILES[@]}"; do
    verify "$WORK/package/test/fixtures/$f" "${SHA[$f]}" "$TGZ" "$f (in $TGZ)"
done
for f in "${FILES[@]}"; do
    mv "$WORK/package/test/fixtures/$f" "$DIR/.$f.tmp"
    mv "$DIR/.$f.tmp" "$DIR/$f"
done
echo "$DIR"
