#!/usr/bin/env bash
# compile_aware.sh - on a GPU host: cases/s per worker of compiled FlexAttention (or ADAPTER) with today's behaviour and
# with the shape pool, side by side (bench/compile_aware.sh; fuzz/README.md "Compile-aware fuzzing"). About 2 minutes.
#   scripts/device/compile_aware.sh                      # torch.compile'd flex_attention, f32, 90 s per campaign
#   SECONDS_EACH=60 ADAPTER='python3 -m attnfuzz.adapters.jax ...' scripts/device/compile_aware.sh --dtype bf16
# Any build of the tools will do (the adapter runs the kernels): BUILD=build/nvidia or the default build/.
# The issue-30 target: pool_cases_per_s_per_worker >= 10.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-python3}
adapter=${ADAPTER:-"$py -m attnfuzz.adapters.flex"}
exec "$here/bench/compile_aware.sh" "${SECONDS_EACH:-90}" "$adapter" --timeout 120 "$@"
