#!/usr/bin/env bash
# private_headers.sh - the client runtime stays an opaque handle: its private headers (client/private/*.h, the
# swarm's swarm_impl.h) are included by client/'s own files and by the white-box tests that tests/CMakeLists.txt
# names (_client_white_box), by no other file (a front end, a benchmark, the server); each named test exists and
# includes one. The include path enforces it at compile time; this also catches a path written out in full.
. "$(dirname "$0")/lib.bash"
SRC="${SEPAL_SRC_DIR:?}"
cd "$SRC" || exit 1
headers=$(cd client && { ls private/*.h; echo swarm/swarm_impl.h; } | xargs -n1 basename | sort -u)
[ -n "$headers" ] && ok "private headers: $(echo $headers)" || bad "no private headers under client/private"
white=$(sed -n 's/^set(_client_white_box \(.*\))$/\1/p' tests/CMakeLists.txt)
[ -n "$white" ] && ok "white-box tests: $white" || bad "tests/CMakeLists.txt names no _client_white_box"
pattern=$(printf '%s\n' $headers | sed 's/\./\\./g' | paste -sd'|')
includers=$(grep -rlE "#[[:space:]]*include[[:space:]]*\"([^\"]*/)?($pattern)\"" --include='*.c' --include='*.h' \
                --include='*.cpp' --include='*.cu' . | sed 's|^\./||' | grep -vE '^(build[^/]*|client)/' | sort)
for f in $includers; do
    name=$(basename "$f" .c)
    if [[ "$f" == tests/* && " $white " == *" $name "* ]]; then
        ok "$f: a white-box test"
    else
        bad "$f includes a private header of the client runtime (use runtime.h's calls)"
    fi
done
for t in $white; do
    grep -qF "tests/$t.c" <<<"$includers" || bad "$t is named white-box but includes no private header"
done
finish
