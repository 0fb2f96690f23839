#!/usr/bin/env bash
# The command front ends of `sepal` without a terminal: -c, -f, commands from a pipe; lookup, help,
# settings, quoting, comments, failures and their exit statuses.
. "$(dirname "$0")/lib.bash"
T="$SEPAL_TEST_DATA/hf-tiny"

# expect_not DESCRIPTION PATTERN -- cmd...: the output (stdout+stderr) must not match PATTERN
expect_not() {
    local desc=$1 pat=$2
    shift 3
    if "$@" 2>&1 | grep -qE -- "$pat"; then bad "$desc: output has /$pat/"; else ok "$desc"; fi
}

# Lookup: unknown, ambiguous, unique prefix, alias.
expect 1 "unknown command" "^sepal: unknown command 'bogus' \(try 'help'\)$" -- "$SEPAL" -c bogus
expect 1 "ambiguous prefix lists candidates" "^sepal: ambiguous command 's': .*set, show, sleep" -- "$SEPAL" -c s
expect 0 "unique prefix (sh -> show)" "^top-k +0 " -- "$SEPAL" -c "sh top-k"
expect 0 "unique prefix (ec -> echo)" "^prefix$" -- "$SEPAL" -c "ec prefix"
expect 0 "alias (exit)" "" -- "$SEPAL" -c "exit"

# help: every core command and model; the long help of one; an unknown one.
out=$("$SEPAL" -c help 2>&1)
for c in help quit set show echo sleep model; do
    if printf '%s\n' "$out" | grep -qE "^  $c( |$)"; then ok "help lists $c"; else bad "help lacks $c"; fi
done
expect 0 "help lists aliases" "\(also: exit, q\)" -- "$SEPAL" -c help
expect 0 "help set (long help)" "^usage: set NAME VALUE" -- "$SEPAL" -c "help set"
expect 0 "help set mentions show" "Numeric settings" -- "$SEPAL" -c "help set"
expect 0 "help by alias" "^usage: quit" -- "$SEPAL" -c "help q"
expect 1 "help of an unknown command" "help: unknown command 'nope'" -- "$SEPAL" -c "help nope"

# Settings.
expect 0 "show lists the defaults" "^max-new-tokens +64 " -- "$SEPAL" -c show
for s in temperature top-k top-p repetition-penalty seed beams stop blocks-per-server; do
    expect 0 "show $s" "^$s " -- "$SEPAL" -c "show $s"
done
expect 1 "set temperature abc fails" "set: temperature: expected a number" -- "$SEPAL" -c "set temperature abc"
expect 1 "set top-k 1.5 fails" "top-k: expected an integer" -- "$SEPAL" -c "set top-k 1.5"
expect 1 "set beams 0 is out of range" "beams: expected an integer in \[1, 64\]" -- "$SEPAL" -c "set beams 0"
expect 1 "set of an unknown setting" "unknown setting 'nope'" -- "$SEPAL" -c "set nope 1"
expect 1 "set without a value" "usage: set NAME VALUE" -- "$SEPAL" -c "set top-k"
expect 0 "set top-k 5; show top-k" "^top-k +5 " -- "$SEPAL" -c "set top-k 5; show top-k"
expect 0 "set temperature 0.7" "^temperature +0.7 " -- "$SEPAL" -c "set temperature 0.7; show temperature"
expect 0 "set a string with quotes" '^stop +"a b\\n" ' -- "$SEPAL" -c 'set stop "a b\n"; show stop'
expect 1 "show of an unknown setting" "show: unknown setting 'nope'" -- "$SEPAL" -c "show nope"

# Splitting: quotes, escapes, empty arguments; unbalanced quotes.
expect 0 "quotes and escapes" "^a b c d e f$" -- "$SEPAL" -c "echo \"a b\" 'c d' e\\ f"
expect 0 "escapes in double quotes" '^say "hi" \\ x$' -- "$SEPAL" -c 'echo "say \"hi\" \\ x"'
expect 0 "single quotes are literal" '^a\\b "c"$' -- "$SEPAL" -c "echo 'a\\b \"c\"'"
expect 0 "quoted ; and # are text" "^a;b #c$" -- "$SEPAL" -c "echo 'a;b' \"#c\""
expect 0 "escaped ; is text" "^x;y$" -- "$SEPAL" -c 'echo x\;y'
expect 1 "unbalanced double quote" "unbalanced double" -- "$SEPAL" -c 'echo "abc'
expect 1 "unbalanced single quote" "unbalanced single" -- "$SEPAL" -c "echo 'abc"

# ';' and '#'.
expect 0 "two commands on a line" "^one$" -- "$SEPAL" -c "echo one; echo two"
expect 0 "second command runs" "^two$" -- "$SEPAL" -c "echo one;echo two"
expect 0 "empty commands are skipped" "^z$" -- "$SEPAL" -c ";; ; echo z ;"
expect 0 "comment" "^visible$" -- "$SEPAL" -c "echo visible # echo hidden"
expect_not "comment hides the rest" "hidden" -- "$SEPAL" -c "echo visible # echo hidden; echo hidden"
expect 0 "a line that is only a comment" "" -- "$SEPAL" -c "# nothing"

# The first failure stops everything: exit 1, message on stderr.
out=$("$SEPAL" -c "echo 1; bogus; echo 2" 2>"$TMP/err"); rc=$?
[ "$rc" -eq 1 ] && ok "-c stops at a failure (exit 1)" || bad "-c failure: exit $rc"
[ "$out" = "1" ] && ok "-c ran the commands before the failure only" || bad "-c output: '$out'"
grep -q "unknown command 'bogus'" "$TMP/err" && ok "-c failure message on stderr" || bad "-c stderr: $(cat "$TMP/err")"

# Several -c and -f, in order; a failure stops the later ones.
printf 'echo from-file\n' > "$TMP/a.sepal"
out=$("$SEPAL" -c "echo c1" -f "$TMP/a.sepal" -c "echo c2" 2>&1)
[ "$out" = "$(printf 'c1\nfrom-file\nc2')" ] && ok "-c -f -c in order" || bad "-c -f -c: '$out'"
out=$("$SEPAL" -c "echo c1" -c bogus -c "echo c3" 2>/dev/null); rc=$?
[ "$rc" -eq 1 ] && [ "$out" = "c1" ] && ok "a failed -c stops the next ones" || bad "several -c: rc $rc, '$out'"

# Scripts: FILE:LINE of the failing line; nothing after it runs; comments and blank lines.
printf '# a script\n\necho first  # trailing comment\nset top-k 3; show top-k\nset temperature hot\necho never\n' > "$TMP/s.sepal"
expect 1 "-f reports FILE:LINE" "^sepal: $TMP/s.sepal:5: set: temperature: expected a number" -- "$SEPAL" -f "$TMP/s.sepal"
expect 1 "-f ran the lines before" "^top-k +3 " -- "$SEPAL" -f "$TMP/s.sepal"
expect_not "-f stops at the failing line" "never" -- "$SEPAL" -f "$TMP/s.sepal"
printf 'echo ok\nbogus arg\n' > "$TMP/u.sepal"
expect 1 "-f unknown command with its line" "u.sepal:2: unknown command 'bogus'" -- "$SEPAL" -f "$TMP/u.sepal"
printf 'model info %s/nope\n' "$TMP" > "$TMP/m.sepal"
expect 1 "-f failing model command names its line and the file" "m.sepal:1: .*/nope: No such file" -- "$SEPAL" -f "$TMP/m.sepal"
expect 1 "-f of a missing file" "nope.sepal: No such file" -- "$SEPAL" -f "$TMP/nope.sepal"
expect 0 "-f - reads stdin" "^dash$" -- bash -c "echo 'echo dash' | \"$SEPAL\" -f -"
# the shipped demo: a 3-server swarm of stories15M, two generations (the greedy one is run.c's text) and a
# short prompt tuning on the sentiment data (linked into the demo's cache)
mkdir -p "$TMP/cache" && ln -s "${SEPAL_SENTIMENT_DIR:?}" "$TMP/cache/sentiment"
demo=$(SEPAL_SERVER_BIN="$SEPAL_BIN_DIR/server/sepal-server" SEPAL_CACHE="$TMP/cache" \
    "$SEPAL" -c "load ${SEPAL_STORIES15M_DIR:?}" -f "$SEPAL_SRC_DIR/share/demo.sepal" 2>&1)
rc=$?
[ $rc -eq 0 ] && ok "the shipped demo script runs" || { bad "the shipped demo script: exit $rc"; echo "$demo" | tail -5; }
grep -q "^Once upon a time, there was a little girl named Lily\. She loved to play outside" <<< "$demo" &&
    ok "the demo's greedy story is run.c's" || bad "the demo's greedy story"
grep -qE "^epoch 1 step 40/40: loss [0-9.]+" <<< "$demo" && grep -qE "^epoch 1: validation accuracy=[0-9.]+ n=128" <<< "$demo" &&
    ok "the demo trains 40 steps and reports accuracy" || bad "the demo's training"

# Commands from a pipe (no arguments, stdin not a terminal).
expect 0 "commands from a pipe" "^hi$" -- bash -c "printf 'echo hi\n' | \"$SEPAL\""
expect 1 "a pipe with a failing line" "<stdin>:2: unknown command 'bogus'" -- bash -c "printf 'echo hi\nbogus\necho no\n' | \"$SEPAL\""
expect 0 "no input at all" "" -- bash -c "\"$SEPAL\" < /dev/null"

# quit stops a script, a line and the -c after it, with status 0.
printf 'echo before\nquit\necho after\n' > "$TMP/q.sepal"
expect 0 "quit stops a script" "^before$" -- "$SEPAL" -f "$TMP/q.sepal"
expect_not "nothing runs after quit (script)" "after" -- "$SEPAL" -f "$TMP/q.sepal"
expect_not "nothing runs after quit (line, -c)" "after" -- "$SEPAL" -c "quit; echo after" -c "echo after"
expect_not "nothing runs after quit (pipe)" "after" -- bash -c "printf 'q\necho after\n' | \"$SEPAL\""

# sleep.
expect 0 "sleep 0.05" "^slept$" -- "$SEPAL" -c "sleep 0.05; echo slept"
expect 1 "sleep of a non-number" "sleep: expected seconds" -- "$SEPAL" -c "sleep soon"

# model through the REPL, and the old subcommands unchanged.
expect 0 "model info through the REPL" "parameters: +250432" -- "$SEPAL" -c "model info $T/llama-gqa"
expect 1 "model info of a missing dir through the REPL" "nope: No such file" -- "$SEPAL" -c "model info $TMP/nope"
expect 1 "model without a subcommand" "" -- "$SEPAL" -c "model"
expect 0 "sepal model info still works" "parameters: +250432" -- "$SEPAL" model info "$T/llama-gqa"
expect 0 "--version" "^sepal 0.1.0$" -- "$SEPAL" --version
expect 0 "--help" "^usage: sepal" -- "$SEPAL" --help

# Usage errors: exit 2.
expect 2 "-c without an argument" "option '-c' needs a value" -- "$SEPAL" -c
expect 2 "-f without an argument" "option '-f' needs a value \(FILE\)" -- "$SEPAL" -f
# a usage error is one line and where to look, not the whole help (exactly these lines on stderr, nothing on stdout)
usage_error() { # DESCRIPTION EXPECTED-STDERR -- sepal's arguments...
    local desc=$1 want=$2
    shift 3
    "$SEPAL" "$@" > "$TMP/ue.out" 2> "$TMP/ue.err"
    local rc=$?
    printf '%s\nTry '"'"'sepal --help'"'"' for more information.\n' "$want" > "$TMP/ue.want"
    if [ $rc -eq 2 ] && [ ! -s "$TMP/ue.out" ] && cmp -s "$TMP/ue.want" "$TMP/ue.err"; then
        ok "$desc"
    else
        bad "$desc: exit $rc, stderr:"; head -4 "$TMP/ue.err" | sed 's/^/    /'
    fi
}
usage_error "unknown option" "sepal: unknown option '--bogus'" -- --bogus
usage_error "a typo of an option: the nearest" "sepal: unknown option '--quite' (did you mean --quiet?)" -- --quite
usage_error "a bad --flag=value" "sepal: option '--tui' takes no value" -- --tui=1
usage_error "unknown program command" "sepal: unexpected argument 'frobnicate' (commands run with -c \"CMD\" or -f FILE)" -- frobnicate
usage_error "a command without -c" "sepal: 'generate' is a command: run it with -c (sepal -c \"generate ...\")" -- generate hi
# a typo of a command, an option, a subcommand, a choice: the nearest names (as git and cargo say them)
expect 1 "a typo of a command" "^sepal: unknown command 'genrate' \(did you mean generate\?\)$" -- "$SEPAL" -c "genrate hi"
expect 1 "a typo of an option" "^sepal: generate: unknown option '--temprature' \(did you mean --temperature\?\)$" -- "$SEPAL" -c "generate hi --temprature 1"
expect 1 "a typo of a subcommand" "^sepal: model: unknown subcommand 'chek' \(did you mean check\?\)$" -- "$SEPAL" -c "model chek x"
expect 1 "a typo of a choice" "'deep-ptune' is not one of head, ptune, deep_ptune \(did you mean deep_ptune\?\)$" -- "$SEPAL" -c "train sst2 --tuning deep-ptune"
expect 2 "a typo of sepal model's subcommand" "^sepal: model: unknown subcommand 'genrate' \(did you mean generate\?\)$" -- "$SEPAL" model genrate x
finish
