# flex_recompiles.py - experiment (a CUDA GPU with torch): at one fixed shape, which parameter of the flex adapter's
# compiled call (values, scale, mask, window, softcap, bias, ALiBi, sinks, a custom mask) makes torch.compile recompile?
# Each call's wall time and dynamo's recompile reasons (TORCH_LOGS=recompiles) are printed; run:
#   PYTHONPATH=python python3 scripts/device/flex_recompiles.py [ADAPTER_FILE]   # default: the flex adapter
# (ADAPTER_FILE: another version of python/attnfuzz/adapters/flex.py, e.g. from git show, to compare).
import importlib.util
import sys
import time

import numpy as np
import torch

from attnfuzz.adapter import Problem
if len(sys.argv) > 1:
    spec = importlib.util.spec_from_file_location("flex_under_test", sys.argv[1])
    F = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(F)
else:
    from attnfuzz.adapters import flex as F

torch._logging.set_logs(recompiles=True)
B, H, S, D = 1, 2, 64, 32
rng = np.random.default_rng(1)
kernel = F.make("cuda", ["f32"], True, False)


def problem(**kw):
    d = dict(batch=B, heads_q=H, heads_kv=H, seq_q=S, seq_k=S, head_dim=D, head_dim_v=D, scale=0.125, dtype="f32",
             mask="none", mask_kind="none", mask_align="top-left", window_left=-1, window_right=-1,
             diagonal_offset=0, variants=[], softcap=0.0)
    tensors = kw.pop("tensors", {})
    d.update(kw)
    return Problem.from_run(d, tensors)


def call(label, p):
    q, k, v = (rng.standard_normal((B, S, H, D)).astype(np.float32) for _ in range(3))
    torch.cuda.synchronize()
    t = time.perf_counter()
    kernel.fn(q, k, v, p)
    torch.cuda.synchronize()
    print(f"{time.perf_counter() - t:8.3f} s  {label}", flush=True)


causal = dict(mask="causal-br", mask_kind="causal", mask_align="bottom-right", window_left=-1, window_right=0)
window = lambda l, r: dict(mask=f"window:{l},{r}-br", mask_kind="window", mask_align="bottom-right",
                           window_left=l, window_right=r)
u = lambda *s: rng.uniform(-1, 1, s).astype(np.float32)
steps = [
    ("first call (compiles)", problem()), ("same problem, new values", problem()),
    ("scale 0.125 -> 0.2", problem(scale=0.2)), ("scale 0.3", problem(scale=0.3)),
    ("causal-br", problem(**causal)), ("causal-br again", problem(**causal)),
    ("window 3,5", problem(**window(3, 5))), ("window 4,6", problem(**window(4, 6))),
    ("softcap 30", problem(variants=["softcap"], softcap=30.0)),
    ("softcap 50", problem(variants=["softcap"], softcap=50.0)),
    ("bias", problem(variants=["bias"], tensors={"bias": u(1, 1, S, S)})),
    ("bias, new values", problem(variants=["bias"], tensors={"bias": u(1, 1, S, S)})),
    ("alibi", problem(variants=["alibi"], tensors={"alibi_slopes": np.abs(u(H))})),
    ("sinks", problem(variants=["sink"], tensors={"sinks": u(H)})),
    ("mask-dense", problem(variants=["mask-dense"], tensors={"custom_mask": (u(1, 1, S, S) > 0).astype(np.uint8)})),
    ("mask-dense, new mask", problem(variants=["mask-dense"],
                                     tensors={"custom_mask": (u(1, 1, S, S) > 0).astype(np.uint8)})),
    ("none again, scale 0.125", problem()),
]
t0 = time.perf_counter()
for label, p in steps:
    call(label, p)
print(f"{time.perf_counter() - t0:8.3f} s  all {len(steps)} calls", flush=True)
