#!/usr/bin/env bash
# The README and `help` cannot drift from the program:
#  - every command's option table (`sepal --dump-commands`) is in its README row and in `help CMD`, and the
#    README's row names no option the command does not take; each row's synopsis, and each `sepal model SUB`
#    synopsis, is help's usage line word for word; the front-end options and the settings are in the README;
#  - every sample of a generation's figures (`sepal: N prompt tokens in ...`) has the shape the program prints;
#  - the README's `sepal>` session runs, in order, against a real local swarm;
#  - every `sepal ...` shell line of the README passes `--dry-run` (its commands, options and values exist);
#  - every example of `help` runs (`sepal --dump-examples`), each in the context it needs;
#  - each screen the README shows (<!-- screen:NAME --> ... <!-- /screen -->) is share/doc/screens/NAME.txt as
#    scripts/tui-screens.sh last wrote it (a stale copy fails).
. "$(dirname "$0")/lib.bash"
M="${SEPAL_STORIES15M_DIR:?}"
R="${SEPAL_SRC_DIR:?}/README.md"
export SEPAL_SERVER_BIN="$SEPAL_BIN_DIR/server/sepal-server"
# ---- the TUI's screens: the README's copies are the files --------------------------------------------------
screens=$(grep -oE '^<!-- screen:[A-Za-z0-9_-]+ -->$' "$R" | sed 's/<!-- screen:\(.*\) -->/\1/')
[ -n "$screens" ] && ok "README shows screens: $(echo $screens)" || bad "README shows no <!-- screen:NAME --> block"
for name in $screens; do
    f="${SEPAL_SRC_DIR}/share/doc/screens/$name.txt"
    # the lines between the markers, without the code fence around them
    awk -v name="$name" '$0 == "<!-- screen:" name " -->" {on = 1; next} on && $0 == "<!-- /screen -->" {exit}
                         on' "$R" | sed '1{/^```$/d}' | sed '${/^```$/d}' > "$TMP/screen-$name.txt"
    if [ ! -f "$f" ]; then
        bad "README shows screen $name, but $f does not exist"
    elif cmp -s "$f" "$TMP/screen-$name.txt"; then
        ok "README's screen $name is $f ($(wc -l < "$f") lines)"
    else
        bad "README's screen $name differs from $f (run scripts/tui-screens.sh):"
        diff "$f" "$TMP/screen-$name.txt" | head -10 | sed 's/^/    /'
    fi
done

if [ ! -f "$M/model.safetensors" ]; then
    bad "$M: no converted stories15M; run scripts/fetch-model.sh first"
    finish
fi
# the README says ~/.cache/sepal/models/stories15M; the test's model may live elsewhere
sub_model() { sed "s#~/.cache/sepal/models/stories15M#$M#g"; }

# synopsis HELP-TEXT: help's "usage: ..." line, its continuation lines joined
synopsis() { printf '%s\n' "$1" | awk '/^usage: / { on = 1; sub(/^usage: /, ""); printf "%s", $0; next }
    on && /^ +/ { sub(/^ +/, " "); printf "%s", $0; next } on { exit }'; }

# ---- options: table, help, README ------------------------------------------------------------------------
"$SEPAL" --dump-commands > "$TMP/cmds" || bad "--dump-commands failed"
# `help`'s list, a command's wrapped summary joined into its line
helplist=$("$SEPAL" -c help | awk '/^  [a-z?]/ { if (l != "") print l; l = $0; next }
    /^   +/ { sub(/^ +/, " "); l = l $0; next } { if (l != "") print l; l = "" } END { if (l != "") print l }')
naliases=0
while read -r line; do
    words=($line)
    path=""
    opts=()
    for w in "${words[@]}"; do
        if [[ $w == --* ]]; then opts+=("$w"); else path="${path:+$path }$w"; fi
    done
    row=$(grep -E "^\| \`$path( |\`)" "$R" | head -1)
    if [ -z "$row" ]; then
        bad "README has no row for '$path'"
        continue
    fi
    helptext=$("$SEPAL" -c "help $path" 2>&1)
    missing=""
    for o in "${opts[@]}"; do
        printf '%s\n' "$row" | grep -qE -- "$o([^a-z0-9-]|$)" || missing="$missing $o"
        printf '%s\n' "$helptext" | grep -qE -- "^  $o([^a-z0-9-]|$)" || bad "help $path lacks $o"
    done
    [ -z "$missing" ] && ok "README row of '$path' names its ${#opts[@]} options" || bad "README row of '$path' lacks$missing"
    extra=""
    cell=$(printf '%s\n' "$row" | cut -d'|' -f2)
    for o in $(printf '%s\n' "$cell" | grep -oE -- '--[a-z][a-z0-9-]*' | sort -u); do
        printf ' %s ' "${opts[@]}" | grep -q -- " $o " || extra="$extra $o"
    done
    [ -z "$extra" ] && ok "README row of '$path' names no other option" || bad "README row of '$path' names options it does not take:$extra"
    # the row's synopsis is help's usage line, word for word (brackets say what is optional)
    syn=$(synopsis "$helptext")
    cell=$(printf '%s\n' "$row" | sed 's/\\|/\x01/g' | cut -d'|' -f2 | sed 's/\x01/|/g; s/^ *`//; s/` *$//')
    [ "$cell" = "$syn" ] && ok "README row of '$path' is its usage line" ||
        bad "README row of '$path' is not its usage line: README '$cell', help '$syn'"
    # its aliases (help's "aliases: a,b"): each in its README row and in `help`'s list, each one the command
    read -ra als <<< "$(printf '%s\n' "$helptext" | sed -n 's/^aliases: //p' | tr ',' ' ')" # no globbing of `?`
    also=$(printf '%s\n' "$helplist" | grep -E "^  $path " | grep -oE '\(also: [^)]*\)' |
        sed 's/^(also: //; s/)$//; s/, /\n/g')
    for al in "${als[@]}"; do
        naliases=$((naliases + 1))
        printf '%s\n' "$row" | grep -qF -- "\`$al\`" && ok "README row of '$path' names its alias $al" ||
            bad "README row of '$path' lacks its alias $al"
        printf '%s\n' "$also" | grep -qxF -- "$al" && ok "help lists the alias $al of $path" ||
            bad "help does not list the alias $al of $path"
        "$SEPAL" -c "help $al" 2>&1 | grep -qE "^usage: $path( |$)" && ok "the alias $al is $path" ||
            bad "help $al is not $path's"
    done
done < "$TMP/cmds"
[ "$naliases" -ge 4 ] && ok "$naliases aliases checked" || bad "only $naliases aliases found"
for o in $("$SEPAL" --help | grep -oE -- '(^| )--?[a-z][a-z-]*' | sort -u); do
    grep -qE -- "(^|[^a-z-])$o([^a-z0-9-]|$)" "$R" && ok "README mentions sepal $o" || bad "README lacks sepal $o"
done
for s in $("$SEPAL" -c show | awk '{print $1}'); do
    grep -q -- "\`$s\`" "$R" && ok "README names the setting $s" || bad "README lacks the setting $s"
done
for e in SEPAL_CACHE XDG_CACHE_HOME SEPAL_HISTORY SEPAL_SERVER_BIN SEPAL_VERBOSE SEPAL_PROGRESS_INTERVAL NO_COLOR \
    SEPAL_TUI_REPLAY_SPEED SEPAL_ISA SEPAL_BLAS_CORE; do
    "$SEPAL" --help | grep -q "$e" && grep -q "$e" "$R" && ok "$e in --help and README" || bad "$e missing in --help or README"
done

# the Model tools' synopses (`sepal model SUB ...`, a description after two blanks) are help's usage lines too
awk '/^```/{inb=!inb; next} inb' "$R" | sed -e ':a' -e '/\\$/N; s/\\\n *//; ta' | grep -E '^sepal model [a-z0-9-]+ ' |
    sed 's/^sepal //; s/  .*//' > "$TMP/toolsyn"
nsyn=0
while IFS= read -r line; do
    sub=$(printf '%s\n' "$line" | cut -d' ' -f1-2)
    syn=$(synopsis "$("$SEPAL" -c "help $sub" 2>&1)")
    nsyn=$((nsyn + 1))
    [ "$line" = "$syn" ] && ok "README: sepal $sub's synopsis is its usage line" ||
        bad "README: sepal $sub's synopsis: README '$line', help '$syn'"
done < "$TMP/toolsyn"
[ "$nsyn" -ge 4 ] && ok "$nsyn model tool synopses checked" || bad "only $nsyn model tool synopses found"

# ---- the README's sepal> session --------------------------------------------------------------------------
mkdir -p "$TMP/run"
# the code blocks made of prompt lines only (a transcript with output is an illustration, not a session)
awk '/^```/{ if (inb) { if (ok && n) printf "%s", buf; inb = 0 } else { inb = 1; ok = 1; n = 0; buf = "" } next }
     inb { if ($0 ~ /^sepal> /) { buf = buf substr($0, 8) "\n"; n++ } else if ($0 !~ /^#/) ok = 0 }' "$R" |
    sub_model > "$TMP/session.sepal"
n=$(wc -l < "$TMP/session.sepal")
if [ "$n" -lt 5 ]; then
    bad "the README's sepal> session has only $n lines"
else
    out=$(cd "$TMP/run" && "$SEPAL" -f "$TMP/session.sepal" 2>&1)
    rc=$?
    [ $rc -eq 0 ] && ok "the README's sepal> session ($n commands) runs" || { bad "the README's session: exit $rc"; printf '%s\n' "$out" | tail -6 | sed 's/^/    /'; }
    # the figures a generation ends with: every sample of them in the README has the shape the program prints
    # (figures, the stop reason and a seed aside)
    shape() { sed -E 's/[0-9]+(\.[0-9]+)?/N/g; s/stop: (length|eos|stop string|stopped|cancelled)/stop: WHY/; s/; seed N$//'; }
    real=$(printf '%s\n' "$out" | grep -m1 -E '^sepal: [0-9]+ prompt tokens? in ' | shape)
    nfig=0
    while IFS= read -r line; do
        nfig=$((nfig + 1))
        [ -n "$real" ] && [ "$(printf '%s\n' "$line" | shape)" = "$real" ] &&
            ok "README's sample figures have the program's shape: $line" ||
            bad "README's sample figures differ from what the program prints: '$line' vs '$real'"
    done < <(awk '/^```/{inb=!inb; next} inb' "$R" | grep -E '^sepal: [0-9]+ prompt')
    [ "$nfig" -ge 1 ] && ok "$nfig sample figure lines checked" || bad "no sample figure line in the README"
fi

# ---- the README's shell lines pass --dry-run ----------------------------------------------------------------
# code blocks only; a trailing backslash continues a line
awk '/^```/{inb=!inb; next} inb' "$R" | sed -e ':a' -e '/\\$/N; s/\\\n *//; ta' | grep -E '^sepal ' | sub_model > "$TMP/shell"
n=0
while IFS= read -r line; do
    n=$((n + 1))
    args="${line#sepal }"
    printf '%s\n' "$args" | grep -qE '(^| )(DIR|FILE|TEXT|MODEL\.bin)( |$)|\[-|\|' && continue # a synopsis
    case "$args" in
    model\ *) eval "set -- $args"; cmdline="$*"; check=("$SEPAL" --dry-run -c "$cmdline") ;;
    -* | \[*) eval "set -- $args" 2>/dev/null || set --; check=("$SEPAL" --dry-run "$@") ;;
    *) continue ;;
    esac
    case "$args" in \[*) continue ;; esac # a synopsis, not a command
    out=$("${check[@]}" < /dev/null 2>&1)
    rc=$?
    [ $rc -eq 0 ] && ok "README: $line" || { bad "README: $line: exit $rc"; printf '%s\n' "$out" | tail -3 | sed 's/^/    /'; }
done < "$TMP/shell"
[ "$n" -ge 3 ] && ok "$n shell lines of the README checked" || bad "only $n shell lines found"

# ---- the README's `$ sepal model info|check ...` transcripts run, and print what the README shows -------------
# (cheap: the tiny checkpoints of tests/data; run from the source tree, where their paths are)
awk '/^```/ { inb = !inb; act = 0; next } inb && /^\$ / { n++; act = 1 } inb && act { print n "\t" $0 }' "$R" \
    > "$TMP/transcripts"
nt=0
for i in $(cut -f1 "$TMP/transcripts" | sort -un); do
    cmd=$(awk -F'\t' -v i="$i" '$1 == i' "$TMP/transcripts" | head -1 | cut -f2- | sed 's/^\$ //')
    case "$cmd" in "sepal model info "* | "sepal model check "*) ;; *) continue ;; esac
    awk -F'\t' -v i="$i" '$1 == i' "$TMP/transcripts" | tail -n +2 | cut -f2- > "$TMP/want"
    nt=$((nt + 1))
    (cd "$SEPAL_SRC_DIR" && SEPAL="$SEPAL" bash -c "\"\$SEPAL\"${cmd#sepal}") > "$TMP/got" 2>&1
    if [ -s "$TMP/want" ] && cmp -s "$TMP/want" "$TMP/got"; then
        ok "README: \$ $cmd prints what the README shows"
    else
        bad "README: \$ $cmd differs from the README"; diff "$TMP/want" "$TMP/got" | head -6 | sed 's/^/    /'
    fi
done
[ "$nt" -ge 3 ] && ok "$nt model transcripts of the README run" || bad "only $nt model transcripts found"

# ---- every example of help ----------------------------------------------------------------------------------
# a server for the connect examples (127.0.0.1:31330 in the help): ws and DHT on a port free a moment ago (another
# suite may hold 31330; up to three ports tried, in case one is taken between the choice and the bind)
for try in 1 2 3; do
    PORT=$(python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
    "$SEPAL_SERVER_BIN" --model "$M" --blocks 0:6 --port "$PORT" --new-swarm --no-measure > "$TMP/srv.out" 2>&1 &
    SRV=$!
    trap 'kill $SRV 2>/dev/null; rm -rf "$TMP"' EXIT
    for i in $(seq 200); do
        grep -q "^sepal-server: serving" "$TMP/srv.out" && break
        kill -0 $SRV 2>/dev/null || break
        sleep 0.05
    done
    grep -q "^sepal-server: serving" "$TMP/srv.out" && break
done
grep -q "^sepal-server: serving" "$TMP/srv.out" || bad "the server on $PORT did not start: $(cat "$TMP/srv.out")"
"$SEPAL" --dump-examples | sub_model | sed "s#127.0.0.1:31330#127.0.0.1:$PORT#g" > "$TMP/examples"
grep -q "127.0.0.1:$PORT" "$TMP/examples" || bad "no connect example names 127.0.0.1:31330"
# serve_example CONTEXT EXAMPLE: `serve` on port 0 (the token file made) until it says it serves, then Ctrl-C: 130
serve_example() {
    local ex=${2//:8080/:0}
    ex=${ex//\~\/.sepal-token/$TMP/token}
    echo "example-token" > "$TMP/token"
    (cd "$TMP/run" && exec "$SEPAL" -c "$1" -c "$ex" < /dev/null > "$TMP/serve.out" 2>&1) &
    local pid=$! rc
    for _ in $(seq 600); do grep -q "^serving .* at http://" "$TMP/serve.out" && break; sleep 0.2; done
    kill -INT $pid
    wait $pid
    rc=$?
    grep -q "^serving .* at http://" "$TMP/serve.out" && [ $rc -eq 130 ] && ok "help example: $2 (served; Ctrl-C: 130)" ||
        { bad "help example: $2: exit $rc"; tail -4 "$TMP/serve.out" | sed 's/^/    /'; }
}
n=0
while IFS= read -r ex; do
    n=$((n + 1))
    case "$ex" in
    swarm\ up* | connect* | load* | model\ * | help* | set* | show* | echo* | sleep* | version* | plugin* | plot\ *) ctx="load $M" ;;
    *) ctx="load $M; swarm up 3" ;;
    esac
    if [[ $ex == "serve "* ]]; then # it serves until Ctrl-C: on a free port, with a token file, until it says so
        serve_example "$ctx" "$ex"
        continue
    fi
    out=$(cd "$TMP/run" && timeout 120 "$SEPAL" -c "$ctx" -c "$ex" < /dev/null 2>&1)
    rc=$?
    [ $rc -eq 0 ] && ok "help example: $ex" || { bad "help example: $ex: exit $rc"; printf '%s\n' "$out" | grep -vE '^server |stopped$' | tail -6 | sed 's/^/    /'; }
done < "$TMP/examples"
[ "$n" -ge 10 ] && ok "$n help examples ran" || bad "only $n help examples"
finish
