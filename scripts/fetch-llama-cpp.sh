#!/usr/bin/env bash
# fetch-llama-cpp.sh - llama.cpp v0.5.0's CPU binaries and stories15M in GGUF (F32 and Q8_0), built in the cache
# from the source that the npm package node-llama-cpp@3.22.1 ships (llama/gitRelease.bundle, a git bundle of
# the release named in llama/binariesGithubRelease.json). Used by bench/compare.sh; nothing of it enters the
# repository.
#
# usage: scripts/fetch-llama-cpp.sh [--isa native|avx2|avxvnni]
#   --isa native (default): llama.cpp's default CPU build, -march=native (its best SIMD on this CPU), in build/
#               (without AMX, -mno-amx-*, where its AMX kernels die here: step 5 below)
#   --isa avx2: GGML_NATIVE=OFF with AVX, AVX2, FMA, F16C, BMI2 and SSE4.2 only (every AVX-512 and AVX-VNNI
#               option OFF), in build-avx2/: what llama.cpp runs on an AVX2 machine, to pair with SEPAL_ISA=avx2
#   --isa avxvnni: the same with GGML_AVX_VNNI=ON, in build-avxvnni/ (pairs with SEPAL_ISA=avxvnni)
# Cache: ${SEPAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sepal}/llama.cpp-v0.5.0/ holds the clone (src/), the
# builds (build/bin/llama-completion, llama-quantize, llama-convert-llama2c-to-ggml; build-avx2/bin/..., and
# build-avxvnni/bin/..., each built when first asked) and the models (made once, by whichever build is asked):
#   stories15M-f32.gguf   converted by llama.cpp's own llama2.c converter from stories15M.bin, with
#                         tokenizer-llama2c.bin: tokenizer.raw.bin with byte tokens 3-258 written as <0xNN>
#                         (the converter types a token BYTE only when its text has that form)
#   stories15M-q8_0.gguf  llama-quantize of it to Q8_0
#   stories15M-q4_0.gguf  and to Q4_0 (the comparison of nf4)
# The only registry request is `npm pack node-llama-cpp@3.22.1`; the package's tarball and the bundle in it are
# checked against the sha256 digests below. The llama2.c files come from scripts/fetch-model.sh (run it first).
# Every step writes into a temporary name and renames it, and a stamp marks a finished build, so an interrupted
# run is redone, never used half-done. JOBS=N sets the build's parallelism (default: nproc).
# The last two lines of stdout are the cache directory and the build's bin directory.
set -euo pipefail

isa=native
while [ $# -gt 0 ]; do
    case "$1" in
    --isa) isa="${2:-}"; shift 2 || { echo "fetch-llama-cpp: --isa needs a value" >&2; exit 2; } ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "fetch-llama-cpp: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
# ISA_FLAGS: the SIMD options of llama.cpp's ggml (ggml/CMakeLists.txt) for the build asked
case "$isa" in
native) BUILD_NAME=build ISA_FLAGS=() ;; # ggml's default: GGML_NATIVE=ON
avx2 | avxvnni)
    BUILD_NAME="build-$isa"
    ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
        -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF
        -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
    if [ "$isa" = avxvnni ]; then ISA_FLAGS+=(-DGGML_AVX_VNNI=ON); else ISA_FLAGS+=(-DGGML_AVX_VNNI=OFF); fi ;;
*) echo "fetch-llama-cpp: --isa is native, avx2 or avxvnni, not '$isa'" >&2; exit 2 ;;
esac

PKG="node-llama-cpp@3.22.1"
TGZ_NAME="node-llama-cpp-3.22.1.tgz"
TGZ_SHA="a0d9dd80eacd2ab1cfe71aee57ac8a806487fd70b3d2a38fbec637752d9e5c5f"
BUNDLE_SHA="5f5d1105d5df040738d87b8290e5d17e7362131cdcfdb0831618e0ea528b4a51"
RELEASE="v0.5.0" # llama/binariesGithubRelease.json of that package
COMMIT="de3ff815ea7d559ee917f063901b8986f038abc6" # the bundle's HEAD
MODEL_SHA="cd590644d963867a2b6e5a1107f51fad663c41d79c149fbecbbb1f95fa81f49a" # stories15M.bin (fetch-model.sh)
TOK_SHA="74f899535f8f99cdeac697474b697f3fa40467b8376dab7b6c4d8c753f28ae9f"   # tokenizer.raw.bin
TARGETS=(llama-completion llama-quantize llama-convert-llama2c-to-ggml)

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FETCH_NAME=fetch-llama-cpp
# shellcheck source=fetch-lib.sh
. "$REPO_ROOT/scripts/fetch-lib.sh"
CACHE="${SEPAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sepal}"
CACHE="${CACHE/#\~/$HOME}"
DIR="$CACHE/llama.cpp-$RELEASE"
BUILD="$DIR/$BUILD_NAME"
BIN="$BUILD/bin"
STAMP="$BUILD/built-from.txt"
NO_AMX="$DIR/native-no-amx" # made by step 5 where the native build's AMX kernels cannot run
# (ggml's GGML_AMX_* options act only without GGML_NATIVE; with -march=native the compiler's own -mno-amx-* do:
# GCC keeps an ISA option given explicitly whatever -march says)
NO_AMX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
if [ "$isa" = native ] && [ -f "$NO_AMX" ]; then ISA_FLAGS=(-DCMAKE_C_FLAGS="$NO_AMX_FLAGS" -DCMAKE_CXX_FLAGS="$NO_AMX_FLAGS"); fi
stamp_text() { # (the native build's stamp as before --isa was added, so that its build is kept)
    printf '%s %s %s\n%s\n' "$PKG" "$RELEASE" "$COMMIT" "${TARGETS[*]}"
    [ ${#ISA_FLAGS[@]} -eq 0 ] || printf '%s\n' "${ISA_FLAGS[*]}"
}

mkdir -p "$CACHE/npm" "$DIR"
WORK="$(mktemp -d "$DIR/.fetch.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# 1. The package and its bundle.
if [[ ! -f "$DIR/src/.git/HEAD" || "$(git -C "$DIR/src" rev-parse HEAD 2>/dev/null)" != "$COMMIT" ]]; then
    TGZ="$CACHE/npm/$TGZ_NAME"
    npm_pack "$PKG" "$TGZ_NAME" "$TGZ" "$WORK"
    verify "$TGZ" "$TGZ_SHA" "$TGZ"
    tar -xzf "$TGZ" -C "$WORK" package/llama/gitRelease.bundle package/llama/binariesGithubRelease.json ||
        die "cannot extract llama/gitRelease.bundle from $TGZ; delete it and run this script again"
    verify "$WORK/package/llama/gitRelease.bundle" "$BUNDLE_SHA" "$TGZ" "llama/gitRelease.bundle in $TGZ"
    grep -q "\"$RELEASE\"" "$WORK/package/llama/binariesGithubRelease.json" ||
        die "$TGZ names another llama.cpp release than $RELEASE"
    git clone -q "$WORK/package/llama/gitRelease.bundle" "$WORK/src" 2>/dev/null ||
        die "git clone of llama/gitRelease.bundle failed"
    [[ "$(git -C "$WORK/src" rev-parse HEAD)" == "$COMMIT" ]] || die "the bundle's HEAD is not $COMMIT"
    rm -rf "$DIR/src" "$DIR"/build "$DIR"/build-*
    mv "$WORK/src" "$DIR/src"
fi

# 2. The CPU binaries (llama.cpp's default CPU settings, OpenMP, static, no network; the SIMD of --isa).
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$(stamp_text)" ]]; then
    command -v cmake >/dev/null 2>&1 || die "cmake is needed to build llama.cpp"
    echo "$FETCH_NAME: building llama.cpp $RELEASE (${TARGETS[*]}, --isa $isa) in $BUILD ..." >&2
    rm -rf "$BUILD"
    cmake -S "$DIR/src" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_UI=OFF "${ISA_FLAGS[@]}" \
        >"$WORK/configure.log" 2>&1 ||
        { tail -30 "$WORK/configure.log" >&2; die "cmake configure of llama.cpp failed (log above)"; }
    cmake --build "$BUILD" -j"${JOBS:-$(nproc)}" --target "${TARGETS[@]}" >"$WORK/build.log" 2>&1 ||
        { tail -30 "$WORK/build.log" >&2; die "building llama.cpp failed (log above)"; }
    for t in "${TARGETS[@]}"; do
        [[ -x "$BIN/$t" ]] || die "the build made no $BIN/$t"
    done
    stamp_text >"$STAMP"
fi

# 3. stories15M in GGUF: F32 by the llama2.c converter, Q8_0 by llama-quantize.
MODEL_BIN="$CACHE/stories15M.bin"
TOK_BIN="$CACHE/tokenizer.raw.bin"
[[ -f "$MODEL_BIN" && -f "$TOK_BIN" ]] || die "$MODEL_BIN or $TOK_BIN missing: run scripts/fetch-model.sh first"
if [[ ! -f "$DIR/stories15M-f32.gguf" || ! -f "$DIR/stories15M-q8_0.gguf" ]]; then
    verify "$MODEL_BIN" "$MODEL_SHA" "$MODEL_BIN"
    verify "$TOK_BIN" "$TOK_SHA" "$TOK_BIN"
    # tokenizer.raw.bin: int32 max_len, then per token f32 score, int32 length, bytes. Tokens 3..258 hold the
    # bytes 0..255 themselves (128..255 as the UTF-8 of U+0080..U+00FF); llama.cpp wants their text as <0xNN>.
    python3 - "$TOK_BIN" "$WORK/tokenizer-llama2c.bin" <<'EOF' || die "rewriting the byte tokens of $TOK_BIN failed"
import struct, sys
src = open(sys.argv[1], "rb").read()
out, off = [src[:4]], 4
i = 0
while off < len(src):
    score, n = struct.unpack_from("<fi", src, off)
    text = src[off + 8:off + 8 + n]
    off += 8 + n
    if 3 <= i <= 258:
        b = text.decode("utf-8")
        if len(b) != 1 or ord(b) != i - 3:
            sys.exit("token %d is %r, not the byte 0x%02X" % (i, text, i - 3))
        text = b"<0x%02X>" % (i - 3)
    out.append(struct.pack("<fi", score, len(text)) + text)
    i += 1
if i != 32000:
    sys.exit("%d tokens, not 32000" % i)
open(sys.argv[2], "wb").write(b"".join(out))
EOF
    (cd "$WORK" && "$BIN/llama-convert-llama2c-to-ggml" --copy-vocab-from-model "$WORK/tokenizer-llama2c.bin" \
        --llama2c-model "$MODEL_BIN" --llama2c-output-model "$WORK/stories15M-f32.gguf" >"$WORK/convert.log" 2>&1) ||
        { tail -20 "$WORK/convert.log" >&2; die "llama-convert-llama2c-to-ggml failed (log above)"; }
    "$BIN/llama-quantize" "$WORK/stories15M-f32.gguf" "$WORK/stories15M-q8_0.gguf" Q8_0 >"$WORK/quantize.log" 2>&1 ||
        { tail -20 "$WORK/quantize.log" >&2; die "llama-quantize to Q8_0 failed (log above)"; }
    mv "$WORK/tokenizer-llama2c.bin" "$DIR/tokenizer-llama2c.bin"
    mv "$WORK/stories15M-q8_0.gguf" "$DIR/stories15M-q8_0.gguf"
    mv "$WORK/stories15M-f32.gguf" "$DIR/stories15M-f32.gguf"
fi
# 4. Q4_0 (llama-quantize's own choice of the other tensors' types), for nf4's comparison.
if [[ ! -f "$DIR/stories15M-q4_0.gguf" ]]; then
    "$BIN/llama-quantize" "$DIR/stories15M-f32.gguf" "$WORK/stories15M-q4_0.gguf" Q4_0 >"$WORK/quantize.log" 2>&1 ||
        { tail -20 "$WORK/quantize.log" >&2; die "llama-quantize to Q4_0 failed (log above)"; }
    mv "$WORK/stories15M-q4_0.gguf" "$DIR/stories15M-q4_0.gguf"
fi
# 5. The native build's AMX kernels (ggml's Q8_0 and Q4_0 matrix products on a CPU that says amx_int8) must run
# here: on a 2-vCPU Xeon (Emerald Rapids) VM whose kernel granted the tile state, v0.5.0's Q8_0 decode died of
# SIGILL at a `tilezero` (tinygemm_kernel_amx). Where a 4-token run of either dies of a signal, the native build is
# made again without them (-mno-amx-*, the marker native-no-amx: kept for later runs) and says so; where that build
# dies too, the script fails saying so.
if [ "$isa" = native ] && grep -qw amx_int8 /proc/cpuinfo 2>/dev/null; then
    for q in q8_0 q4_0; do
        rc=0
        "$BIN/llama-completion" -m "$DIR/stories15M-$q.gguf" -p "Once upon a time" -n 4 -t 1 -tb 1 -c 128 --temp 0 \
            --seed 0 -no-cnv --no-warmup --simple-io </dev/null >/dev/null 2>"$WORK/probe.log" || rc=$?
        if [ "$rc" -gt 128 ] && [ -f "$NO_AMX" ]; then
            tail -5 "$WORK/probe.log" >&2
            die "the native build without AMX ($BUILD) still dies of signal $((rc - 128)) on $q"
        elif [ "$rc" -gt 128 ]; then
            echo "$FETCH_NAME: the native build's $q run died of signal $((rc - 128)) (its AMX kernels: this CPU" \
                "says amx_int8); building it again without AMX" >&2
            touch "$NO_AMX"
            rm -rf "$WORK"
            exec "$0" --isa native
        fi
    done
fi
echo "$DIR"
echo "$BIN"
