#!/usr/bin/env bash
# setup.sh - one command on a fresh Debian 12 machine: install what is missing, build, run the default check.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
preset=default
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  preset=nvidia   # a GPU is here: build its backend too
fi
cmake --preset "$preset"
cmake --build --preset "$preset" -j "$(nproc)"
# The default check: the edge-shape sweep over every registered kernel on the best backend present
# (cpu emulator when there is no GPU). Exit code 0 = all pass, 1 = a failure, 2 = usage error.
exec "build/$([ "$preset" = default ] || echo "$preset/")bin/attn-check" --sweep --backend auto "$@"
