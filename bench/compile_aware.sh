#!/usr/bin/env bash
# compile_aware.sh - benchmark: cases/s per worker of a campaign over a kernel that compiles per shape, today's
# behaviour (--compile-aware off) and the shape pool (--compile-aware auto) side by side, at the same time.
#   bench/compile_aware.sh [SECONDS] [ADAPTER_CMD] [ATTN-FUZZ ARGS...]
#   default: 60 s, the numpy reference with a simulated 0.5 s compilation per new shape (numpy_ref --compile-delay)
#   e.g. bench/compile_aware.sh 90 "python3 -m attnfuzz.adapters.flex" --dtype bf16 --timeout 120     (a GPU host)
# Prints name=value lines: per mode the cases/s per worker, checks, new shapes and the pool's line of the summary;
# then pool_over_today. Both campaigns: 1 worker, --max-seq 64 --max-d 64, --minimize-budget 0, plus the extra args.
# BUILD=build/nvidia picks another build; KEEP=DIR keeps both campaign directories there.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${ATTNFUZZ_BIN:-$here/${BUILD:-build}/bin}
secs=${1:-60}
py=${PYTHON:-$(command -v /usr/bin/python3 || command -v python3)}
adapter=${2:-"$py -m attnfuzz.adapters.numpy_ref --compile-delay 0.5"}
shift $(( $# < 2 ? $# : 2 ))
extra=("$@")
export PYTHONPATH="$here/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONDONTWRITEBYTECODE=1
tmp=${KEEP:-$(mktemp -d)}
mkdir -p "$tmp"
[ -n "${KEEP:-}" ] || trap 'rm -rf "$tmp"' EXIT
common=(--adapter "$adapter" --max-time "$secs" --workers 1 --max-seq 64 --max-d 64 --minimize-budget 0 --quiet
        --progress 1000 "${extra[@]}")
for mode in off auto; do
  rm -rf "${tmp:?}/$mode"
  "$bin/attn-fuzz" "${common[@]}" --compile-aware "$mode" --out "$tmp/$mode" > "$tmp/$mode.log" 2>&1 &
done
wait || true
report() {  # name=value lines of one campaign's report.json
  "$py" - "$1" "$2" <<'EOF'
import json, sys
mode, out = sys.argv[1], sys.argv[2]
try:
    c = json.load(open(out + "/report.json"))["campaign"]
except (OSError, ValueError, KeyError) as e:
    print(f"{mode}_error=no report.json ({e}); see {out}.log")
    sys.exit(0)
print(f"{mode}_cases_per_s_per_worker={c['cases_per_s']:.2f}")
print(f"{mode}_checks={c['cases']}")
for k, t in c.get("compile_aware", {}).items():
    print(f"{mode}_{k}_mode={t['mode']} ({t['why']})")
    print(f"{mode}_{k}_new_shapes={t['new_shapes']} refused={t.get('refused', 0)} "
          f"new_shape_time_share={t['new_shape_s'] / max(t['check_s'], 1e-9):.2f}")
EOF
}
echo "seconds=$secs"
echo "adapter=$adapter"
echo "args=${extra[*]}"
report today "$tmp/off"
report pool "$tmp/auto"
"$py" - "$tmp" <<'EOF'
import json, sys
def rate(m):
    try:
        return json.load(open(f"{sys.argv[1]}/{m}/report.json"))["campaign"]["cases_per_s"]
    except (OSError, ValueError, KeyError):
        return float("nan")
a, b = rate("off"), rate("auto")
print("pool_over_today=%.1f" % (b / a if a else float("nan")))
EOF
