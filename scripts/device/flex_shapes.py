# flex_shapes.py - experiment (a CUDA GPU with torch): what a new shape costs the flex adapter's compiled call, under
# torch.compile's default (dynamic=None: the second size seen in a dimension recompiles it as dynamic) or with
# dynamic=False (every shape compiled as static). Prints each call's wall time and dynamo's recompile reasons; run in
# a fresh inductor cache so that every compilation is a real one:
#   TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) PYTHONPATH=python python3 scripts/device/flex_shapes.py [default|static]
import sys
import time

import numpy as np
import torch

from attnfuzz.adapter import Problem

mode = sys.argv[1] if len(sys.argv) > 1 else "default"
if mode not in ("default", "static"):
    sys.exit("flex_shapes.py: mode is default or static")
if mode == "static":
    compile_ = torch.compile
    torch.compile = lambda fn, **kw: compile_(fn, dynamic=False, **kw)
from attnfuzz.adapters import flex as F  # noqa: E402  (after the patch, which make() reads)

torch._logging.set_logs(recompiles=True)
rng = np.random.default_rng(1)
kernel = F.make("cuda", ["f32"], True, False)


def call(B, H, Sq, Sk, D):
    p = Problem.from_run(dict(batch=B, heads_q=H, heads_kv=H, seq_q=Sq, seq_k=Sk, head_dim=D, head_dim_v=D,
                              scale=D ** -0.5, dtype="f32", mask="none", mask_kind="none", mask_align="top-left",
                              window_left=-1, window_right=-1, diagonal_offset=0, variants=[], softcap=0.0), {})
    q = rng.standard_normal((B, Sq, H, D)).astype(np.float32)
    k, v = (rng.standard_normal((B, Sk, H, D)).astype(np.float32) for _ in range(2))
    torch.cuda.synchronize()
    t = time.perf_counter()
    kernel.fn(q, k, v, p)
    torch.cuda.synchronize()
    print(f"{mode}: {time.perf_counter() - t:8.3f} s  B={B} H={H} Sq={Sq} Sk={Sk} D={D}", flush=True)


t0 = time.perf_counter()
for shape in [(1, 2, 64, 64, 32), (1, 2, 64, 64, 32), (1, 2, 37, 37, 32), (1, 2, 37, 37, 32), (2, 3, 19, 45, 32),
              (1, 2, 64, 64, 16), (1, 2, 100, 80, 16), (1, 2, 100, 80, 16), (3, 1, 7, 130, 64)]:
    call(*shape)
print(f"{mode}: {time.perf_counter() - t0:8.3f} s  all calls", flush=True)
