#!/usr/bin/env bash
# live_campaigns.sh - on a GPU host: one attn-fuzz campaign per live target, side by side, then the merge and a
# bug-report bundle for the first ordinary-tier failures of each (issue 30 item 8; examples/h100-campaigns/README.md).
#
#   scripts/device/live_campaigns.sh BIN OUT [SECONDS]   # BIN: the tools (build/dev/bin after scripts/offline-build.sh)
#
# Targets: SDPA bf16, SDPA backward f16, FlexAttention compiled, eager backward and with the score / block variants,
# jax.nn.dot_product_attention bf16, the Pallas GPU ops f16, torch's varlen_attn bf16, and SDPA with ALiBi and a float
# bias (its float-mask route), forward bf16 and backward (issue 28 item 10). Each campaign: SECONDS (default
# 200) on 2 workers, then the minimizer (MINIMIZE seconds, default 60); rerun on the same OUT to extend them (a resume
# is the same campaign, fuzz/README.md). Needs torch 2.11 and jax[cuda] 0.11; 16 cores keep all ten busy.
# CAMPAIGNS="flex-variants sdpa-bias-bf16" runs those campaigns only.
# Writes OUT/<campaign>/ and OUT/<campaign>.log, OUT/merged/ (attn-fuzz --merge), OUT/bundles/<campaign>--<failure>/.
# Exit 0 when every campaign ran (failures found in a library are results), 2 on bad arguments.
set -uo pipefail
[ $# -ge 2 ] && [ $# -le 3 ] || { echo "usage: $0 BIN_DIR OUT_DIR [SECONDS]" >&2; exit 2; }
BIN=$(cd "$1" 2>/dev/null && pwd) || { echo "live_campaigns.sh: no directory $1" >&2; exit 2; }
[ -x "$BIN/attn-check" ] && [ -x "$BIN/attn-fuzz" ] || { echo "live_campaigns.sh: no attn-check / attn-fuzz in $BIN" >&2; exit 2; }
OUT=$(mkdir -p "$2" && cd "$2" && pwd) || { echo "live_campaigns.sh: cannot create $2" >&2; exit 2; }
T=${3:-200}
[[ "$T" =~ ^[0-9]+$ ]] && [ "$T" -gt 0 ] || { echo "live_campaigns.sh: SECONDS must be a positive whole number, not '$T'" >&2; exit 2; }
MIN=${MINIMIZE:-60}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" XLA_PYTHON_CLIENT_PREALLOCATE=false
declare -A ARGS=(
  [sdpa-bf16]="--dtype bf16" [sdpa-bwd-f16]="--pass bwd --dtype f16" [flex-compiled]="" [flex-eager-bwd]="--pass bwd"
  [flex-variants]="--variant sink,softcap,alibi,bias,block-sparse" [jax-bf16]="--dtype bf16" [pallas-f16]="--dtype f16"
  [varlen-bf16]="--dtype bf16" [sdpa-bias-bf16]="--variant alibi,bias --dtype bf16"
  [sdpa-bias-bwd]="--variant alibi,bias --pass bwd")
declare -A ADAPTER=(
  [sdpa-bf16]="python3 -m attnfuzz.adapters.torch_sdpa" [sdpa-bwd-f16]="python3 -m attnfuzz.adapters.torch_sdpa --backward"
  [flex-compiled]="python3 -m attnfuzz.adapters.flex" [flex-eager-bwd]="python3 -m attnfuzz.adapters.flex --no-compile --backward"
  [flex-variants]="python3 -m attnfuzz.adapters.flex" [jax-bf16]="python3 -m attnfuzz.adapters.jax_attention"
  [pallas-f16]="python3 -m attnfuzz.adapters.pallas_attention" [varlen-bf16]="python3 -m attnfuzz.adapters.torch_varlen"
  [sdpa-bias-bf16]="python3 -m attnfuzz.adapters.torch_sdpa" [sdpa-bias-bwd]="python3 -m attnfuzz.adapters.torch_sdpa --backward")
NAMES=(sdpa-bf16 sdpa-bwd-f16 flex-compiled flex-eager-bwd flex-variants jax-bf16 pallas-f16 varlen-bf16 sdpa-bias-bf16
  sdpa-bias-bwd)
if [ -n "${CAMPAIGNS:-}" ]; then
  read -ra NAMES <<< "$CAMPAIGNS"
  for n in "${NAMES[@]}"; do
    [ -n "${ARGS[$n]+set}" ] || { echo "live_campaigns.sh: no campaign '$n' (CAMPAIGNS names some of: ${!ARGS[*]})" >&2; exit 2; }
  done
fi

for n in "${NAMES[@]}"; do
  # shellcheck disable=SC2086  # ARGS holds several words
  timeout -k 10 $((T + MIN + 400)) "$BIN/attn-fuzz" --max-time "$T" --workers 2 --minimize-budget "$MIN" \
    --seeds "$ROOT/corpus/seed" --progress 60 --name "$n" --out "$OUT/$n" ${ARGS[$n]} --adapter "${ADAPTER[$n]}" \
    > "$OUT/$n.log" 2>&1 &
done
wait
dirs=()
for n in "${NAMES[@]}"; do [ -f "$OUT/$n/report.json" ] && dirs+=("$OUT/$n"); done
[ ${#dirs[@]} -gt 0 ] || { echo "live_campaigns.sh: no campaign wrote a report (see $OUT/*.log)" >&2; exit 2; }
"$BIN/attn-fuzz" --out "$OUT/merged" --merge "${dirs[@]}" > "$OUT/merge.log" 2>&1
head -40 "$OUT/merge.log"

# The first BUNDLES (default 2) ordinary-tier failures of each campaign (their minimal case where there is one), the
# campaigns side by side (BUNDLE_TIMEOUT seconds each, default 300).
bundles() {
  local n=$1
  python3 - "$OUT/$n" "${BUNDLES:-2}" <<'PY' | while read -r f; do
import json, pathlib, sys
d, most = pathlib.Path(sys.argv[1]), int(sys.argv[2])
try:
    failures = json.load(open(d / "report.json"))["campaign"]["failures"]
except (OSError, ValueError, KeyError):
    sys.exit(0)
shown = 0
for x in failures:
    if x.get("tier") != "ordinary" or shown >= most:
        continue
    m = x.get("minimized", {}).get("file")
    p = d / m if m else next((q for q in (d / "failures").glob(x["file"])), None)
    if p and p.exists():
        print(p)
        shown += 1
PY
    b="$OUT/bundles/$n--$(basename "$f" .case)"
    timeout -k 10 "${BUNDLE_TIMEOUT:-300}" "$BIN/attn-check" --replay "$f" --adapter "${ADAPTER[$n]}" --bug-report "$b" \
      > "$b.log" 2>&1 < /dev/null
    echo "bundle $n: $(tail -1 "$b.log")"
  done
}
mkdir -p "$OUT/bundles"
for n in "${NAMES[@]}"; do bundles "$n" & done
wait
echo "live_campaigns.sh: $OUT/merged/summary.md, bundles in $OUT/bundles"
exit 0
