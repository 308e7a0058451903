#!/usr/bin/env bash
# soak.sh - the false-positive soak (issue 11 item 2): attn-fuzz campaigns over every built-in kernel until at
# least CASES generated cases ran; every failing check on a correct kernel is a false positive.
#
#   scripts/soak.sh                                  # 10^6 cases, one worker per core, reports/soak
#   CASES=200000 WORKERS=2 OUT=/tmp/soak scripts/soak.sh
#   scripts/soak.sh --values finite                  # extra flags go to attn-fuzz
#
# Environment: CASES (default 1000000), WORKERS (default nproc), OUT (default reports/soak), BUILD (default
# build), FIRST_ROUND_S (default 600: about 10^6 cases on 16 cores). It runs attn-fuzz rounds with the same
# --out (the corpus resumes); after the first round the next round's length comes from the measured rate.
# Prints cases, failing checks, distinct failures and wall time; exit 0 when no check failed, 1 otherwise,
# 2 on usage / build problems.
set -uo pipefail
cd "$(dirname "$0")/.."
CASES=${CASES:-1000000}
WORKERS=${WORKERS:-$(nproc)}
OUT=${OUT:-reports/soak}
BUILD=${BUILD:-build}
FIRST_ROUND_S=${FIRST_ROUND_S:-600}
FUZZ="$BUILD/bin/attn-fuzz"
[ -x "$FUZZ" ] || { echo "soak.sh: $FUZZ not found: build first (cmake --build --preset default)" >&2; exit 2; }
# The campaign object is the last part of report.json: its "cases" / "failing_checks" are the last ones.
field() { grep -o "\"$1\": [0-9]*" "$OUT/report.json" | tail -1 | grep -o '[0-9]*$'; }

total=0 failing=0 round=0 round_s=$FIRST_ROUND_S
start=$(date +%s)
while [ "$total" -lt "$CASES" ]; do
  round=$((round + 1))
  "$FUZZ" --max-time "$round_s" --workers "$WORKERS" --out "$OUT" --quiet --progress 60 "$@"
  rc=$?
  [ "$rc" -le 1 ] || { echo "soak.sh: attn-fuzz exited with $rc" >&2; exit 2; }
  cases=$(field cases) && fails=$(field failing_checks) || { echo "soak.sh: no counts in $OUT/report.json" >&2; exit 2; }
  total=$((total + cases))
  failing=$((failing + fails))
  echo "soak.sh: round $round: $cases cases, $fails failing checks (total $total / $CASES cases)"
  [ "$cases" -gt 0 ] || { echo "soak.sh: a round ran no case" >&2; exit 2; }
  # Next round: long enough for the rest at this round's rate, plus 10 %, at least 30 s.
  round_s=$(awk -v left=$((CASES - total)) -v c="$cases" -v s="$round_s" \
    'BEGIN { t = 1.1 * left * s / c; if (t < 30) t = 30; printf "%d", t }')
done
distinct=$(find "$OUT/failures" -name '*.case' 2>/dev/null | wc -l)
echo "soak: $total cases, $failing failing checks, $distinct distinct failures, $(( $(date +%s) - start )) s," \
  "$WORKERS workers, $round round(s); summary: $OUT/summary.md"
[ "$failing" -eq 0 ]
