#!/usr/bin/env bash
# compare_test_times.sh - `ctest --preset default` of two revisions on the same cores, one after the other, old and
# new side by side (issue 32 item 4): each built in its own worktree with every core, then tested pinned to CORES.
#   scripts/compare_test_times.sh OLD_REV NEW_REV [--work DIR] [--cores 0,1] [--top N]
# e.g. on a quiet 16-core host: scripts/compare_test_times.sh main testspeed --cores 0,1
# Prints each run's wall time, then scripts/test_times.sh --compare (slowest tests and executables, old | new).
set -euo pipefail
work=${TMPDIR:-/tmp}/attnfuzz-test-times cores=0,1 top=25 revs=()
while [ $# -gt 0 ]; do
  case "$1" in
    --work) [ $# -ge 2 ] || { echo "compare_test_times.sh: --work needs a directory" >&2; exit 2; }; work=$2; shift 2 ;;
    --cores) [[ $# -ge 2 && $2 =~ ^[0-9,-]+$ ]] || { echo "compare_test_times.sh: --cores needs a cpu list (0,1)" >&2; exit 2; }; cores=$2; shift 2 ;;
    --top) [[ $# -ge 2 && $2 =~ ^[0-9]+$ ]] || { echo "compare_test_times.sh: --top needs a count" >&2; exit 2; }; top=$2; shift 2 ;;
    -*) echo "compare_test_times.sh: unknown option $1 (usage: scripts/compare_test_times.sh OLD_REV NEW_REV [--work DIR] [--cores 0,1] [--top N])" >&2; exit 2 ;;
    *) revs+=("$1"); shift ;;
  esac
done
[ ${#revs[@]} -eq 2 ] || { echo "compare_test_times.sh: give two revisions, OLD_REV NEW_REV" >&2; exit 2; }
command -v taskset >/dev/null || { echo "compare_test_times.sh: taskset not found (util-linux)" >&2; exit 2; }
repo=$(git rev-parse --show-toplevel)
for r in "${revs[@]}"; do
  git -C "$repo" rev-parse --verify --quiet "$r^{commit}" >/dev/null || { echo "compare_test_times.sh: $r is not a revision" >&2; exit 2; }
done
ncores=$(tr ',' '\n' <<<"$cores" | wc -l)
mkdir -p "$work"
for side in old new; do
  rev=${revs[0]}; [ "$side" = new ] && rev=${revs[1]}
  tree=$work/$side
  git -C "$repo" worktree remove --force "$tree" 2>/dev/null || rm -rf "$tree"
  git -C "$repo" worktree add --detach "$tree" "$rev" >/dev/null
  echo "== $side: $rev ($(git -C "$tree" log -1 --format='%h %s' | cut -c1-80))"
  (cd "$tree" && cmake --preset default >/dev/null && cmake --build build -j "$(nproc)" >/dev/null)
  start=$(date +%s)
  (cd "$tree" && taskset -c "$cores" ctest --test-dir build -j "$ncores" --timeout 900 >"$work/$side.ctest.log" 2>&1) || true
  echo "$side: ctest -j $ncores on cores $cores: $(( $(date +%s) - start )) s wall; $(grep -E 'tests passed|tests failed' "$work/$side.ctest.log" | tail -1)"
done
bash "$repo/scripts/test_times.sh" --build "$work/new/build" --compare "$work/old/build" --top "$top"
echo "worktrees: $work/old $work/new (git worktree remove them when done); ctest output: $work/{old,new}.ctest.log"
