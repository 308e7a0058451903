#!/usr/bin/env bash
# offline-build.sh - builds attn-fuzz on a machine that has a compiler, CMake and ninja but none of Debian's -dev
# packages and no network (e.g. a GPU host): the packages travel as .deb files in .devdeps/ and are unpacked
# under a private prefix, never into /.
#
#   scripts/offline-build.sh --download         # on a Debian 12 machine with network: fill .devdeps/
#   scripts/offline-build.sh [BUILD [PRESET]]   # on the offline machine: unpack, configure, build (default
#                                               # build/offline, preset default; PRESET nvidia adds the GPU backend)
#   extra CMake arguments: CMAKE_ARGS="-DBUILD_TESTING=OFF" scripts/offline-build.sh
#   only some targets: TARGETS="attn-check attn-fuzz" scripts/offline-build.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DEBS=(libboost1.74-dev libboost-context1.74-dev libboost-context1.74.0 libmpfr-dev libmpfr6 libgmp-dev libgmp10
      libgmpxx4ldbl libgtest-dev googletest librapidcheck-dev libcli11-dev nlohmann-json3-dev libxtensor-dev xtl-dev
      libxsimd-dev libclang-rt-14-dev)
if [ "${1:-}" = "--download" ]; then
  mkdir -p .devdeps && (cd .devdeps && apt-get download "${DEBS[@]}")
  du -sh .devdeps
  exit 0
fi
BUILD=${1:-build/offline}
PRESET=${2:-default}
PREFIX=${PREFIX:-/opt/attnfuzz-deps}
ls .devdeps/*.deb >/dev/null 2>&1 || { echo "offline-build: no .devdeps/*.deb: run --download first" >&2; exit 2; }
mkdir -p "$PREFIX"
for f in .devdeps/*.deb; do dpkg -x "$f" "$PREFIX"; done
LIB="$PREFIX/usr/lib/x86_64-linux-gnu"
export CPATH="$PREFIX/usr/include:$PREFIX/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}" LIBRARY_PATH="$LIB${LIBRARY_PATH:+:$LIBRARY_PATH}"
export LD_LIBRARY_PATH="$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
FUZZER=$(ls "$PREFIX"/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a | head -1)
GPU=()
[ "$PRESET" = nvidia ] && GPU=(-DATTNFUZZ_NVIDIA=ON)
# shellcheck disable=SC2086
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$PREFIX/usr" \
  -DATTNFUZZ_BOOST_CONTEXT_LIB="$LIB/libboost_context.so.1.74.0" -DATTNFUZZ_LIBFUZZER_ARCHIVE="$FUZZER" \
  "${GPU[@]}" ${CMAKE_ARGS:-}
# shellcheck disable=SC2086
cmake --build "$BUILD" -j "$(nproc)" ${TARGETS:+--target $TARGETS}
echo "offline-build: built $BUILD (run with LD_LIBRARY_PATH=$LIB)"
