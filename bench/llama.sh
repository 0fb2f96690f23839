# llama.sh - what the benches against llama.cpp share (sourced by compare.sh and prefill.sh once their options are
# read; they set bench, their name for messages, and build): die; default settings (SEPAL_* but SEPAL_CACHE,
# OPENBLAS_*, OMP_* and GOTO_* unset: an OPENBLAS_CORETYPE=Haswell left in an environment makes OpenBLAS, sepal's
# products of more than 8 rows, run AVX2 kernels on an AVX-512 CPU); sepal and its stories15M, llama.cpp's
# llama-completion and its GGUFs; a temporary directory tmp and the busy processes (`yes`), both gone at exit;
# the GGUF and llama.cpp's name of an encoding; the kernel levels this CPU runs; the llama.cpp build that pairs
# with each level (llama_builds, llama_for).

die() { echo "$bench: $*" >&2; exit 1; }

for v in $(env | sed -n 's/^\(SEPAL_[A-Z_]*\|OPENBLAS_[A-Z_]*\|OMP_[A-Z_]*\|GOTO_[A-Z_]*\)=.*/\1/p'); do
    [ "$v" = SEPAL_CACHE ] || unset "$v"
done

sepal="$build/app/sepal"
[ -x "$sepal" ] || die "$sepal not found: build first (SEPAL_BUILD_DIR=$build scripts/build.sh)"
model="$(scripts/fetch-model.sh "$sepal" | tail -1)" || die "scripts/fetch-model.sh failed"
llama="$(scripts/fetch-llama-cpp.sh | tail -2 | head -1)" || die "scripts/fetch-llama-cpp.sh failed"
completion="$llama/build/bin/llama-completion"

. bench/busy.sh

gguf_of() { echo "$llama/stories15M-$(case "$1" in f32) echo f32 ;; int8) echo q8_0 ;; nf4) echo q4_0 ;; esac).gguf"; }
llama_name() { case "$1" in f32) echo F32 ;; int8) echo Q8_0 ;; nf4) echo Q4_0 ;; esac; }

# levels_run "avx2 avx512" -> those of the levels this CPU runs (sepal refuses the others at start: each skipped
# one is said), or dies when none is left
levels_run() {
    local runs="" isa out
    for isa in $1; do
        if out="$(SEPAL_ISA="$isa" "$sepal" --version 2>&1)"; then runs="$runs $isa"; else echo "$bench: skipped: $out" >&2; fi
    done
    [ -n "$runs" ] || die "no kernel level of '$1' runs on this CPU"
    echo "${runs# }"
}

# The llama.cpp build that runs what an x86 machine of sepal's level has: avx2 (and scalar: llama.cpp has no
# build without SIMD) the AVX2-only build, avxvnni the AVX2 + AVX-VNNI one, avx512 the native one (-march=native:
# this CPU's best, AVX-512 where sepal runs avx512). Compared natively, an AVX-512 llama.cpp would race sepal's
# forced AVX2 kernels.
llama_isa_of() { case "$1" in avx512) echo native ;; avxvnni) echo avxvnni ;; *) echo avx2 ;; esac; }
declare -A llama_bins
# llama_builds "avx2 avx512": fetches (builds, the first time: minutes) the build of each level and says which
# runs against which, with its system_info line
llama_builds() {
    local isa want bin info
    for isa in $1; do
        want="$(llama_isa_of "$isa")"
        bin="$(scripts/fetch-llama-cpp.sh --isa "$want" | tail -1)" || die "scripts/fetch-llama-cpp.sh --isa $want failed"
        llama_bins[$isa]="$bin/llama-completion"
        info="$("$bin/llama-completion" -m "$(gguf_of f32)" -p "Once" -n 1 -t 1 -c 128 --temp 0 -no-cnv --no-warmup \
            --simple-io </dev/null 2>&1 >/dev/null | sed -n 's/.*system_info: //p' | head -1)"
        echo "llama.cpp against sepal's $isa: --isa $want build ($bin), system_info: ${info:-?}"
    done
}
# llama_for ISA -> the llama-completion of the level (llama_builds first)
llama_for() { echo "${llama_bins[$1]:?llama_builds did not fetch a build for $1}"; }

# How llama.cpp's threads wait for work and at its barriers (--llama-wait): its builds here run them with OpenMP
# (GGML_OPENMP, libgomp: system_info says OPENMP = 1), whose threads spin about 300000 rounds before they sleep,
# and `--poll` (default 50) only sets the spinning of llama.cpp's own thread pool, which an OpenMP build does not
# run. passive: OMP_WAIT_POLICY=passive (libgomp's threads sleep at once) and --poll 0 (no polling, for a build
# without OpenMP); default: neither (--poll 50, libgomp's spinning). On this 2-vCPU machine, shared, 2 threads
# spinning collapsed (2-71 tok/s against 400-1400 on one thread) as soon as another process ran; passive did not.
llama_waits="passive default"
# check_waits "passive default" -> dies on a name that is not one of llama_waits
check_waits() {
    local w
    [ -n "$1" ] || die "--llama-wait needs one or more of: $llama_waits"
    for w in $1; do
        case " $llama_waits " in *" $w "*) ;; *) die "--llama-wait: unknown setting '$w' (one or more of: $llama_waits)" ;; esac
    done
}
# wait_says WAIT -> what the setting does, for the header
wait_says() { case "$1" in passive) echo "passive (OMP_WAIT_POLICY=passive, --poll 0)" ;; *) echo "default (--poll 50, libgomp's spin)" ;; esac; }
# llama_exec WAIT COMMAND... -> runs a llama.cpp command with that setting
llama_exec() {
    local w="$1"
    shift
    case "$w" in
    passive) OMP_WAIT_POLICY=passive "$@" --poll 0 ;;
    *) "$@" ;;
    esac
}
