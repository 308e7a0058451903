#!/usr/bin/env bash
# dropout_soak.sh - the dropout false-alarm soak (issue 29): CASES random dropout cases (both generators, fwd and
# fwd+bwd, p from 0 to 0.999, offsets near 2^32) on a correct kernel, in WORKERS processes with seeds 1..WORKERS;
# every failing check is a false alarm (docs/semantics.md "Dropout": the keep-fraction test's rate is <= 1e-9 per case).
#
#   scripts/dropout_soak.sh                           # 10^5 cases, one process per core
#   CASES=2000 WORKERS=2 scripts/dropout_soak.sh      # a short run
#   KERNEL=flash-bm16-bn16 scripts/dropout_soak.sh
#   LIMIT=300 scripts/dropout_soak.sh                 # stop each worker after 300 s, count what it checked
#
# Prints each worker's line and the totals; exit 0 when no check failed, 1 otherwise, 2 when the bench is not built.
set -uo pipefail
cd "$(dirname "$0")/.."
CASES=${CASES:-100000}
WORKERS=${WORKERS:-$(nproc)}
KERNEL=${KERNEL:-flash-bm16-bn32}
LIMIT=${LIMIT:-0}  # seconds per worker (0: none); a worker cut short counts its last progress line
BENCH=${BUILD:-build}/bench/dropout_stats
[ -x "$BENCH" ] || { echo "dropout_soak.sh: $BENCH not found: cmake --build build --target dropout_stats" >&2; exit 2; }
per=$(( (CASES + WORKERS - 1) / WORKERS ))
tmp=$(mktemp -d)
start=$(date +%s)
for w in $(seq 1 "$WORKERS"); do
  timeout "$LIMIT" "$BENCH" --soak "$per" --seed "$w" --kernel "$KERNEL" > "$tmp/$w.txt" 2>&1 &
done
wait
grep -hv '^soak-progress' "$tmp"/*.txt
# A worker cut short by LIMIT counts its last progress line (every 1,000 cases).
total=0 alarms=0 unfinished=0
for f in "$tmp"/*.txt; do
  last=$(grep -E '^soak( |-progress )' "$f" | tail -1)
  [ -n "$last" ] || continue
  case "$last" in soak-progress*) unfinished=$((unfinished + 1)) ;; esac
  total=$((total + $(echo "$last" | grep -o 'cases=[0-9]*' | cut -d= -f2)))
  alarms=$((alarms + $(echo "$last" | grep -o 'false_alarms=[0-9]*' | cut -d= -f2)))
done
echo "dropout soak: kernel $KERNEL, $total cases, $alarms false alarm(s), $(( $(date +%s) - start )) s$( [ $unfinished = 0 ] || echo ", $unfinished worker(s) unfinished")"
rm -rf "$tmp"
[ "$alarms" = 0 ] && [ "$total" -gt 0 ]
