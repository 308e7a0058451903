#!/usr/bin/env bash
# gpu_breakdown.sh - benchmark (issue 32): where a GPU campaign's time goes, and two builds side by side on one host.
#   bench/gpu_breakdown.sh [SECONDS] [BIN_A [BIN_B]]    (default 60 s; BIN_A: build/nvidia/bin; BIN_B: none)
# For each round (A, B, A, B: a change of load hits both), `attn-fuzz --backend nvidia --variant all --mps
# --workers N` (N = cores) over the built-in kernels, then the cpu backend on the same host for SECONDS/2. Prints
# one name=value block per campaign: cases/s, the checks' time by phase (fuzz/README.md "Where a GPU campaign's time
# goes"), the kernels' own share, guarded-buffer device calls per check and nvidia-smi's mean SM utilisation.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-60}
a=${2:-$here/build/nvidia/bin}
b=${3:-}
workers=${WORKERS:-$(nproc)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; kill $(jobs -p) 2>/dev/null || true' EXIT
[ -x "$a/attn-fuzz" ] || { echo "gpu_breakdown.sh: no attn-fuzz in $a" >&2; exit 2; }
[ -z "$b" ] || [ -x "$b/attn-fuzz" ] || { echo "gpu_breakdown.sh: no attn-fuzz in $b" >&2; exit 2; }
camp() {  # label bin backend seconds [--mps]
  local label=$1 bin=$2 backend=$3 t=$4 dm=""
  shift 4
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi dmon -s u -d 1 > "$tmp/$label.dmon" 2>/dev/null &
    dm=$!
  fi
  timeout -k 5 $((t + 120)) "$bin/attn-fuzz" --backend "$backend" --variant all --workers "$workers" --max-time "$t" \
    --out "$tmp/$label" "$@" > "$tmp/$label.log" 2>&1 || true
  [ -n "$dm" ] && kill "$dm" 2>/dev/null
  if [ ! -f "$tmp/$label/report.json" ]; then
    echo "${label}_error=$(tail -1 "$tmp/$label.log")"
    return
  fi
  /usr/bin/python3 - "$tmp/$label/report.json" "$label" "$tmp/$label.dmon" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["campaign"]
label, ph = sys.argv[2], c["worker_phase_s"]
total = sum(ph.values()) or 1
print(f"{label}_cases_per_s={c['cases_per_s']:.0f}")
print(f"{label}_ms_per_check={1000 * total / max(c['cases'], 1):.2f}")
print(f"{label}_phases=" + " ".join(f"{k}:{100 * v / total:.0f}%" for k, v in sorted(ph.items())))
print(f"{label}_kernel_share={100 * c.get('worker_kernel_s', 0) / total:.0f}%")
print(f"{label}_buffer_calls_per_check={c.get('worker_buffer_calls', 0) / max(c['cases'], 1):.1f}")
try:
    sm = [float(l.split()[1]) for l in open(sys.argv[3]) if l.strip() and not l.startswith("#")]
    print(f"{label}_sm_util_mean_pct={sum(sm) / len(sm):.1f}")
except (OSError, ValueError, IndexError, ZeroDivisionError):
    pass
PY
}
for round in 1 2; do
  camp "a$round" "$a" nvidia "$secs" --mps
  [ -z "$b" ] || camp "b$round" "$b" nvidia "$secs" --mps
done
camp cpu "$a" cpu $((secs / 2))
