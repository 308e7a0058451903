#!/usr/bin/env bash
# adapter_campaign.sh - benchmark: cases/s of an attn-fuzz campaign through an adapter vs a built-in cpu kernel.
#   bench/adapter_campaign.sh [SECONDS] [ADAPTER_CMD]     (default 60 s, the numpy reference adapter)
# Prints name=value lines; both campaigns: 1 worker, --max-seq 64 --max-d 64, no seed corpus.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${ATTNFUZZ_BIN:-$here/build/bin}
secs=${1:-60}
py=${PYTHON:-/usr/bin/python3}
adapter=${2:-"PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=$here/python $py -m attnfuzz.adapters.numpy_ref"}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rate() {  # cases/s from the campaign's report.json
  "$py" -c "import json,sys; print('%.1f' % json.load(open(sys.argv[1]))['campaign']['cases_per_s'])" "$1/report.json"
}
common=(--max-time "$secs" --workers 1 --max-seq 64 --max-d 64 --no-seeds --quiet --progress 1000)
"$bin/attn-fuzz" "${common[@]}" --kernel materialized --out "$tmp/builtin" > "$tmp/builtin.log" 2>&1 || true
"$bin/attn-fuzz" "${common[@]}" --adapter "$adapter" --out "$tmp/adapter" > "$tmp/adapter.log" 2>&1 || true
b=$(rate "$tmp/builtin"); a=$(rate "$tmp/adapter")
echo "seconds=$secs"
echo "builtin_materialized_cpu_cases_per_s=$b"
echo "adapter_cases_per_s=$a"
echo "adapter=$adapter"
"$py" -c "print('adapter_over_builtin=%.2f' % ($a / $b if $b else float('nan')))"
