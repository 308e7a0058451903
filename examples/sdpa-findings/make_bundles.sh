#!/usr/bin/env bash
# make_bundles.sh - writes a bug-report bundle (attn-check --bug-report) for every PyTorch SDPA finding in this folder.
#
# Usage (from the repository root, on a machine with a CUDA GPU and PyTorch):
#   examples/sdpa-findings/make_bundles.sh [ATTN_CHECK [OUT]]
# ATTN_CHECK defaults to build/nvidia/bin/attn-check, OUT to examples/sdpa-findings/bundles. Each FILE.case gets
# OUT/FILE/ (README.md, the minimal case, repro.py + repro.npz, the heatmap); the adapter is the one the file's kernel
# name sdpa-BACKEND-ROUTE names, with --backward for backward files. A finding that no longer reproduces (a fixed
# torch) gets no bundle and is listed; the exit status is 1 then, 0 when every bundle was written. MINIMIZE_TIME
# (seconds, default 45) bounds the minimizer per finding.
set -u
here=$(dirname "$0")
check=${1:-build/nvidia/bin/attn-check}
out=${2:-$here/bundles}
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/python
failed=()
for f in "$here"/*.case; do
  kernel=$(sed -n 's/^ *"kernel": "\(sdpa-[^"]*\)".*/\1/p' "$f" | head -1)
  rest=${kernel#sdpa-}
  backend=${rest%%-*} route=${rest#*-}
  extra=$(grep -q '"pass": "bwd"' "$f" && echo " --backward")
  adapter="python3 -m attnfuzz.adapters.torch_sdpa --backends $backend --routes $route$extra"
  name=$(basename "$f" .case)
  echo "== $name: $kernel"
  ( set -x; "$check" --replay "$f" --adapter "$adapter" --timeout 120 --minimize --minimize-time "${MINIMIZE_TIME:-45}" \
      --bug-report "$out/$name" --out "$out/.work/$name" ) || failed+=("$name")
done
rm -rf "$out/.work"
if ((${#failed[@]})); then
  echo "no bundle (does not reproduce, or see above): ${failed[*]}"
  exit 1
fi
echo "bundles: $out"
