#!/usr/bin/env bash
# jax_smoke.sh - the JAX / Pallas / varlen_attn / PyTorch-CPU adapters on a GPU host (issue 30 item 7): a short sweep of each new
# adapter, then a 60 s campaign per JAX route, all results tarred; about 6 minutes.
#
#   scripts/device/jax_smoke.sh BIN OUT        # BIN: the tools (build/dev/bin after scripts/offline-build.sh)
#   SECONDS_PER_CAMPAIGN=120 scripts/device/jax_smoke.sh build/dev/bin /tmp/jax-smoke
#
# Needs jax[cuda] (0.11: jax.nn.dot_product_attention, jax.experimental.pallas.ops.gpu) and torch for the CPU SDPA
# sweep. The sweeps run side by side, then the campaigns two at a time (JAX does not preallocate GPU memory). Writes OUT/<step>/ (reports) and OUT/<step>.log per step, OUT/summary.txt (one line per step: its exit status,
# 0 pass / 1 failures found / 2 usage, and the log's last verdict line) and OUT.tar.gz. Exit 0 when every step ran
# (failures found in a library are results, not errors of this script), 2 on bad arguments or a step that could not run.
set -uo pipefail
[ $# -eq 2 ] || { echo "usage: $0 BIN_DIR OUT_DIR" >&2; exit 2; }
BIN=$(cd "$1" 2>/dev/null && pwd) || { echo "jax_smoke.sh: no directory $1" >&2; exit 2; }
[ -x "$BIN/attn-check" ] && [ -x "$BIN/attn-fuzz" ] || { echo "jax_smoke.sh: no attn-check / attn-fuzz in $BIN" >&2; exit 2; }
OUT=$(mkdir -p "$2" && cd "$2" && pwd) || { echo "jax_smoke.sh: cannot create $2" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" XLA_PYTHON_CLIENT_PREALLOCATE=false
T=${SECONDS_PER_CAMPAIGN:-60}
JAX='python3 -m attnfuzz.adapters.jax_attention'
PALLAS='python3 -m attnfuzz.adapters.pallas_attention'
VARLEN='python3 -m attnfuzz.adapters.torch_varlen'
: > "$OUT/summary.txt"

step() {  # step NAME LIMIT_S TOOL ARGS...: one run, its log, its line in the summary
  local name=$1 limit=$2 tool=$3
  shift 3
  timeout -k 10 "$limit" "$BIN/$tool" --out "$OUT/$name" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $(grep -E 'checked|cases|fail' "$OUT/$name.log" | tail -1)" | tee -a "$OUT/summary.txt"
}

python3 -c 'import jax; print("jax", jax.__version__, jax.devices())' > "$OUT/versions.txt" 2>&1
python3 -c 'import torch; print("torch", torch.__version__)' >> "$OUT/versions.txt" 2>&1

# Smoke: one sweep per new adapter (the refusals must be unsupported, never launch-error).
# xla compiles every new shape (about 0.7 s a check on an H200: the two routes' 206 checks ran past 90 s), so one
# route, the one that takes every mask: about 103 checks, 75 s.
step sweep-jax-xla 150 attn-check --sweep --adapter "$JAX --implementations xla --routes bool-mask" &
step sweep-jax-cudnn 90 attn-check --sweep --dtype bf16 --adapter "$JAX --implementations cudnn --routes is-causal,window --backward" --pass bwd &
step sweep-pallas-mha 90 attn-check --sweep --dtype f16 --adapter "$PALLAS --ops mha --backward" --pass bwd &
step check-pallas-gqa 60 attn-check --sq 3 --sk 512 --heads 8 --kv-heads 2 --mask causal-br --dtype bf16 --adapter "$PALLAS --ops gqa" &
step sweep-sdpa-cpu 90 attn-check --sweep --adapter 'python3 -m attnfuzz.adapters.torch_sdpa --device cpu --backends math,flash --routes is-causal,bool-mask' &
step check-varlen 60 attn-check --seq-layout varlen --seqlens-q 3,0,17,128 --seqlens-k 5,1,40,300 --mask causal-br --heads 4 --kv-heads 2 --dtype bf16 --adapter "$VARLEN" &
step check-varlen-kvcache 60 attn-check --seq-layout kvcache --sq 4 --sk 64 --seqused-k 33,1,64 --mask window:8,0-br --dtype f16 --adapter "$VARLEN" &
wait
(cd "$ROOT" && timeout 120 python3 -m pytest -q -p no:cacheprovider tests/python/test_torch_cpu.py tests/python/test_jax_adapters.py) \
  > "$OUT/pytest.log" 2>&1
echo "pytest rc=$? $(tail -1 "$OUT/pytest.log")" | tee -a "$OUT/summary.txt"

# One campaign per JAX route (the minimizer's share included in T), then varlen_attn (the fuzzer draws varlen and KV-cache layouts itself).
step fuzz-jax-xla $((T + 60)) attn-fuzz --workers 4 --max-time "$T" --adapter "$JAX --implementations xla" &
step fuzz-jax-cudnn $((T + 60)) attn-fuzz --workers 4 --max-time "$T" --dtype bf16 --adapter "$JAX --implementations cudnn" &
wait
step fuzz-pallas-mha $((T + 60)) attn-fuzz --workers 4 --max-time "$T" --dtype f16 --adapter "$PALLAS --ops mha" &
step fuzz-pallas-gqa $((T + 60)) attn-fuzz --workers 4 --max-time "$T" --dtype bf16 --adapter "$PALLAS --ops gqa" &
step fuzz-varlen $((T + 60)) attn-fuzz --workers 4 --max-time "$T" --dtype bf16 --adapter "$VARLEN" &
wait

grep -c '"unsupported"' "$OUT"/*/report.json > "$OUT/unsupported_counts.txt" 2>/dev/null
grep -l 'launch-error' "$OUT"/*/report.json > "$OUT/launch_errors.txt" 2>/dev/null
tar -C "$(dirname "$OUT")" -czf "$OUT.tar.gz" "$(basename "$OUT")" && echo "results: $OUT.tar.gz"
! grep -qE ' rc=([2-9]|[0-9]{2,})' "$OUT/summary.txt" || { echo "jax_smoke.sh: a step did not run (exit status above 1, or killed by its limit)" >&2; exit 2; }
