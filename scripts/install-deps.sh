#!/usr/bin/env bash
# install-deps.sh - installs the Debian 12 packages attn-fuzz builds and tests with (needs root or sudo).
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
PACKAGES=(
  build-essential cmake ninja-build git
  libboost-dev libboost-context-dev        # fibers of the cpu emulator; Boost.Multiprecision
  libmpfr-dev libgmp-dev                   # the oracle's mpfr backend
  googletest libgtest-dev                  # tests (GoogleTest + ctest)
  librapidcheck-dev                        # property-based tests
  libcli11-dev nlohmann-json3-dev          # command lines, JSON reports and corpus files
  libxtensor-dev                           # npy/: NPY reader and writer (xtensor/xnpy.hpp) for attn-check --npy
  clang libclang-rt-14-dev                 # libFuzzer and ThreadSanitizer builds
  hipcc libamdhip64-dev                    # amd backend (Debian ROCm 5.2)
  libxml2-utils                            # xmllint: tests check that SVG and JUnit are well formed
  librsvg2-dev                             # PNG heatmaps next to the SVGs (optional: CMake ATTNFUZZ_PNG)
  python3-numpy python3-pytest             # adapters: the numpy reference adapter and the pytest entry point (tests/adapters)
  slurm-wlm munge                          # tests/scripts/slurm_array_test.sh: a single-node Slurm runs scripts/slurm
)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all packages present"
fi
