#!/usr/bin/env bash
# adapter_campaign.sh - benchmark: cases/s of an attn-fuzz campaign through an adapter vs a built-in cpu kernel.
#   bench/adapter_campaign.sh [SECONDS] [ADAPTER_CMD] [ATTN-FUZZ ARGS...]   (default 60 s, the numpy reference)
#   e.g. bench/adapter_campaign.sh 60 '' --dtype f16        bench/adapter_campaign.sh 60 '' --pass bwd
# Prints name=value lines; both campaigns: 1 worker, --max-seq 64 --max-d 64, no seed corpus, plus the extra
# args. The built-in kernel ($BUILTIN) is materialized (f32, forward and backward), online-row for f16 / bf16.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${ATTNFUZZ_BIN:-$here/build/bin}
secs=${1:-60}
py=${PYTHON:-/usr/bin/python3}
adapter=${2:-"PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=$here/python $py -m attnfuzz.adapters.numpy_ref"}
shift $(( $# < 2 ? $# : 2 ))
extra=("$@")
builtin=${BUILTIN:-materialized}
case " ${extra[*]} " in *" f16 "*|*" bf16 "*) builtin=${BUILTIN:-online-row} ;; esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rate() {  # cases/s from the campaign's report.json
  "$py" -c "import json,sys; print('%.1f' % json.load(open(sys.argv[1]))['campaign']['cases_per_s'])" "$1/report.json"
}
common=(--max-time "$secs" --workers 1 --max-seq 64 --max-d 64 --no-seeds --quiet --progress 1000 "${extra[@]}")
"$bin/attn-fuzz" "${common[@]}" --kernel "$builtin" --out "$tmp/builtin" > "$tmp/builtin.log" 2>&1 || true
"$bin/attn-fuzz" "${common[@]}" --adapter "$adapter" --out "$tmp/adapter" > "$tmp/adapter.log" 2>&1 || true
b=$(rate "$tmp/builtin"); a=$(rate "$tmp/adapter")
echo "seconds=$secs"
echo "args=${extra[*]}"
echo "builtin_${builtin//-/_}_cases_per_s=$b"
echo "adapter_cases_per_s=$a"
echo "adapter=$adapter"
"$py" -c "print('adapter_over_builtin=%.2f' % ($a / $b if $b else float('nan')))"
