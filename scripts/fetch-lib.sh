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
