#!/usr/bin/env bash
# time_step.sh - a CMake compiler / linker launcher that runs one build step under /usr/bin/time and appends its CPU
# time (user + system, children included) and output to $ATTNFUZZ_TIME_LOG; scripts/build_times.sh --cpu reads it.
#   cmake --preset default -DCMAKE_CXX_COMPILER_LAUNCHER=$PWD/scripts/time_step.sh (C, CUDA, HIP, CXX_LINKER alike)
set -uo pipefail
[ -n "${ATTNFUZZ_TIME_LOG:-}" ] || exec "$@"  # not measuring: the step as it is
out=? prev=
for a in "$@"; do  # the step's output: the argument after -o
  [ "$prev" = -o ] && out=$a
  prev=$a
done
tmp=$(mktemp)
/usr/bin/time -f "%U %S" -o "$tmp" "$@"
rc=$?
printf '%s\t%s\n' "$(tail -1 "$tmp")" "$out" >>"$ATTNFUZZ_TIME_LOG"
rm -f "$tmp"
exit $rc
