#!/usr/bin/env bash
# sync_overhead.sh - benchmark: cases/s of attn-fuzz campaigns with and without --sync, side by side in one run.
#   bench/sync_overhead.sh [SECONDS] [ROUNDS] [KERNEL] [SYNC_INTERVAL]   (default 30 s, 3 rounds, flash-bm32-bn32, 5 s)
# Each round runs a pair of campaigns at once (1 worker each, --max-seq 64 --max-d 64, no seed corpus),
# first without sync, then the same pair syncing through one directory; the two modes alternate so that
# a change of machine load hits both. Prints name=value lines: the pair's summed cases/s per round and the
# median per mode, their ratio, and what sync did (rounds, seconds spent in them, entries imported / run).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${ATTNFUZZ_BIN:-$here/build/bin}
secs=${1:-30}
rounds=${2:-3}
kernel=${3:-flash-bm32-bn32}
interval=${4:-5}
py=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Not --quiet: a quiet campaign converts libFuzzer's inputs into .case files only at the end (inflating its
# wall time), a syncing one every round; with progress lines both do it every 5 s, as campaigns normally do.
common=(--kernel "$kernel" --max-time "$secs" --workers 1 --max-seq 64 --max-d 64 --no-seeds --progress 5)
pair() {  # pair DIR [sync args...]: two campaigns at once; prints their summed cases/s
  local d=$1; shift
  "$bin/attn-fuzz" "${common[@]}" --out "$d/a" "$@" ${1:+--name a} > "$d.a.log" 2>&1 &
  local pa=$!
  "$bin/attn-fuzz" "${common[@]}" --out "$d/b" "$@" ${1:+--name b} > "$d.b.log" 2>&1 || true
  wait $pa || true
  "$py" - "$d" <<'PY'
import json, sys
r = [json.load(open(f"{sys.argv[1]}/{n}/report.json"))["campaign"] for n in "ab"]
s = [c.get("sync") for c in r]
print("%.1f" % sum(c["cases_per_s"] for c in r), end="")
if s[0]:
    print(" rounds=%d sync_s=%.2f sync_cpu_s=%.2f imported=%d run=%d" % (sum(x["rounds"] for x in s),
          sum(x["seconds"] for x in s), sum(x["cpu_seconds"] for x in s),
          sum(sum(x["imported_corpus"].values()) for x in s), sum(x["imported_inputs_run"] for x in s)), end="")
print()
PY
}
plain=() synced=()
echo "seconds=$secs rounds=$rounds kernel=$kernel sync_interval_s=$interval"
for r in $(seq "$rounds"); do
  p=$(pair "$tmp/plain$r")
  s=$(pair "$tmp/sync$r" --sync "$tmp/syncdir$r" --sync-interval "$interval")
  plain+=("${p%% *}") synced+=("${s%% *}")
  echo "round${r}_plain_pair_cases_per_s=${p}"
  echo "round${r}_sync_pair_cases_per_s=${s%% *} (${s#* })"
done
"$py" - "${plain[*]}" "${synced[*]}" <<'PY'
import statistics, sys
p = [float(x) for x in sys.argv[1].split()]
s = [float(x) for x in sys.argv[2].split()]
mp, ms = statistics.median(p), statistics.median(s)
print("plain_pair_cases_per_s_median=%.1f" % mp)
print("sync_pair_cases_per_s_median=%.1f" % ms)
print("sync_over_plain=%.3f" % (ms / mp if mp else float("nan")))
PY
