#!/usr/bin/env bash
# plugin_make_test.sh - examples/plugin's Makefile builds any source under any name (SRC=, NAME=) and the
# library loads: a copy of the example built out of tree, then listed and checked by attn-check.
# Usage: plugin_make_test.sh REPO_ROOT ATTN_CHECK WORKDIR
set -euo pipefail
root=$1 attn_check=$2 work=$3
rm -rf "$work" && mkdir -p "$work/src"
cp "$root/examples/plugin/Makefile" "$work/"
cp "$root/examples/plugin/naive_attention.hip" "$work/src/my_flash.hip"
make -s -C "$work" cpu ATTNFUZZ_ROOT="$root" SRC=src/my_flash.hip            # NAME defaults to the stem
make -s -C "$work" cpu ATTNFUZZ_ROOT="$root" SRC=src/my_flash.hip NAME=mykernels
for lib in libmy_flash_cpu.so libmykernels_cpu.so; do
  [ -f "$work/$lib" ] || { echo "plugin_make_test: make did not write $lib"; exit 1; }
done
"$attn_check" --plugin "$work/libmykernels_cpu.so" --backend cpu --list | grep -q '^example-naive ' ||
  { echo "plugin_make_test: attn-check does not list the plug-in's kernel"; exit 1; }
"$attn_check" --plugin "$work/libmykernels_cpu.so" --backend cpu --kernel example-naive --sq 7 --sk 13 --d 59 \
  --mask causal-br --out "$work/reports" --quiet
make -s -C "$work" clean SRC=src/my_flash.hip NAME=mykernels
[ ! -e "$work/libmykernels_cpu.so" ] || { echo "plugin_make_test: make clean left the library"; exit 1; }
echo "plugin_make_test: SRC / NAME build, load and pass"
