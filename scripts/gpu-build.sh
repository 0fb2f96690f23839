#!/usr/bin/env bash
# gpu-build.sh - the full build of sepal (CMake, every target, CUDA on) on a machine that has nvcc, cuBLAS, gcc,
# cmake and ninja but none of our Debian -dev packages and no network (the lent GPU machine, Ubuntu 24.04-like),
# then the ctest suites that matter on a GPU.
#
# The packages travel as .deb files (Debian 12's: libwebsockets, OpenDHT and what its headers and .pc files
# need, ncurses, OpenSSL, cJSON, OpenBLAS, Check, libedit, and the runtime libraries a CUDA image may lack; the
# list is at the end of this comment). They are unpacked under $SEPAL_DEPS (/tmp/deps), never into /: absolute
# symlinks and the .pc files' /usr are rewritten to point there, pkg-config sees only those .pc files
# (PKG_CONFIG_LIBDIR), and the build and the tests find the headers and libraries through CPATH, LIBRARY_PATH and
# LD_LIBRARY_PATH. The system's libc, libstdc++, zlib and CUDA are the machine's own.
#
# Usage:  bash scripts/gpu-build.sh [DEBS]        DEBS: the folder of .deb files (default .debs-full)
# Environment: SEPAL_DEPS (/tmp/deps), SEPAL_GPU_BUILD (the build folder, /tmp/gpu-build), JOBS (16),
#   SEPAL_CUDA_ARCH (CMAKE_CUDA_ARCHITECTURES, 90-real: H100/H200), SEPAL_GPU_TESTS (the ctest -R regex; "" runs
#   none), SEPAL_GPU_TARGETS (cmake --build --target list; empty: all), OUT (where build.log, ctest.log and
#   gpu-build.txt, the summary, go; default the build folder).
# Exit status: 0 when the build and the tests passed (a test that skips, exit 77, passes), 1 otherwise.
#
# The .deb files (made with apt-get download on Debian 12, 36 MiB):
#   libwebsockets-dev libwebsockets17 libcap-dev libcap2 libncurses-dev libncurses6 libncursesw6 libtinfo6 check
#   libsubunit-dev libsubunit0 libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libopenblas0
#   libgfortran5 libquadmath0 libcjson-dev libcjson1 libopendht-c-dev libopendht-c2 libopendht-dev libopendht2
#   libedit-dev libedit2 libbsd-dev libbsd0 libmd-dev libmd0 libssl-dev libssl3 libgnutls28-dev libgnutls30
#   nettle-dev libnettle8 libhogweed6 libgmp10 libidn2-dev libidn2-0 libunistring2 libtasn1-6-dev libtasn1-6
#   libp11-kit-dev libp11-kit0 libffi8 libargon2-dev libargon2-1 libjsoncpp-dev libjsoncpp25 libmsgpack-cxx-dev
#   libboost1.74-dev (msgpack-cxx's headers use it) libfmt9 libhttp-parser2.9
set -uo pipefail
cd "$(dirname "$0")/.."
SRC=$(pwd)
DEBS="${1:-.debs-full}"
D="${SEPAL_DEPS:-/tmp/deps}"
B="${SEPAL_GPU_BUILD:-/tmp/gpu-build}"
JOBS="${JOBS:-16}"
TESTS="${SEPAL_GPU_TESTS-^(test_cuda.*|test_optim|test_autograd|test_proto)$}"
mkdir -p "$B"
LOGS="${OUT:-$B}"
mkdir -p "$LOGS"
SUM="$LOGS/gpu-build.txt"
t0=$(date +%s)
say() { echo "$*" | tee -a "$SUM"; }
: > "$SUM"

# Unpacks every .deb of $DEBS under $D and makes the tree self-contained (see above).
unpack() {
    compgen -G "$DEBS/*.deb" > /dev/null || { say "gpu-build: no .deb files in $DEBS"; return 1; }
    mkdir -p "$D"
    local f n=0
    for f in "$DEBS"/*.deb; do
        dpkg-deb -x "$f" "$D" || { say "gpu-build: cannot unpack $f"; return 1; }
        n=$((n + 1))
    done
    # absolute symlinks (libtinfo.so -> /lib/...) point into $D when their target is there
    local l
    find "$D" -type l -lname '/*' | while read -r l; do
        [ -e "$D$(readlink "$l")" ] && ln -sfn "$D$(readlink "$l")" "$l"
    done
    # .pc files: /usr -> $D/usr (prefix=, libdir=, -I/usr, -L/usr)
    find "$D" -name '*.pc' -exec sed -i -E "s#(=|-I|-L)/usr/#\1$D/usr/#g; s#=/usr\$#=$D/usr#" {} +
    say "gpu-build: $n packages unpacked under $D"
}

unpack || exit 1
A=x86_64-linux-gnu
LIBS="$D/usr/lib/$A:$D/lib/$A:$D/usr/lib/$A/openblas-pthread"
PC="$D/usr/lib/$A/pkgconfig:$D/usr/lib/$A/openblas-pthread/pkgconfig"
export PKG_CONFIG_LIBDIR="$PC:$D/usr/share/pkgconfig:$D/usr/lib/pkgconfig"
export CMAKE_PREFIX_PATH="$D/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export CPATH="$D/usr/include${CPATH:+:$CPATH}"
export LIBRARY_PATH="$LIBS${LIBRARY_PATH:+:$LIBRARY_PATH}"
export LD_LIBRARY_PATH="$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# the linker searches $D before the system's folders, for -l, linker scripts (libncursesw.so: INPUT(libncursesw.so.6
# -ltinfo)) and the libraries' own needs alike, so a program links against the copies it runs with (the first GPU
# run linked the machine's newer libncursesw.so.6 with the packages' older libtinfo.so.6 and failed)
export LDFLAGS="-L${LIBS//:/ -L} -Wl,-rpath-link,$LIBS${LDFLAGS:+ $LDFLAGS}"
for m in openblas libcjson check libwebsockets ncursesw opendht-c opendht libedit libcrypto; do
    pkg-config --exists "$m" ||
        say "gpu-build: pkg-config cannot find $m: $(pkg-config --print-errors --exists "$m" 2>&1 | head -2)"
done
say "gpu-build: $(command -v nvcc || echo 'no nvcc on PATH'), $(cmake --version | head -1), $(gcc --version | head -1)"

GEN=()
command -v ninja > /dev/null && GEN=(-G Ninja)
cmake -S "$SRC" -B "$B" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DSEPAL_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${SEPAL_CUDA_ARCH:-90-real}" > "$LOGS/build.log" 2>&1
rc=$?
say "gpu-build: configure exit $rc after $(($(date +%s) - t0)) s"
[ $rc -eq 0 ] || { tail -30 "$LOGS/build.log"; exit 1; }
TARGETS=() KEEP=()
[ -n "${SEPAL_GPU_TARGETS:-}" ] && TARGETS=(--target $SEPAL_GPU_TARGETS)
[ ${#GEN[@]} -gt 0 ] && KEEP=(-- -k 0) # every failing target in one run
cmake --build "$B" -j "$JOBS" "${TARGETS[@]}" "${KEEP[@]}" >> "$LOGS/build.log" 2>&1
rc=$?
say "gpu-build: build exit $rc after $(($(date +%s) - t0)) s, $(grep -c 'warning:' "$LOGS/build.log") warnings"
if [ $rc -ne 0 ]; then
    grep -E 'error|Error|undefined reference' "$LOGS/build.log" | head -30 | tee -a "$SUM"
    exit 1
fi
[ -n "$TESTS" ] || exit 0
ctest --test-dir "$B" -R "$TESTS" -j 4 --timeout 240 --output-on-failure > "$LOGS/ctest.log" 2>&1
rc=$?
grep -E 'tests passed|Passed|Failed|Skipped|\*\*\*' "$LOGS/ctest.log" | tee -a "$SUM"
say "gpu-build: ctest exit $rc after $(($(date +%s) - t0)) s"
[ $rc -eq 0 ]
