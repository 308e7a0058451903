"""float_mask_probe.py - which arithmetic explains SDPA's float-mask precision failures (issue 28 item 10)?

An adapter serving torch_sdpa's float-mask kernels (cudnn, efficient, flash, math) unchanged; after each call it
recomputes the case in float64 under several hypotheses of how the library combines the scores and the additive mask
(ALiBi + bias, handed over in the query's dtype as the adapter does) and prints, per hypothesis, the largest
|got - hypothesis| over the output (the hypothesis rounded to the case's dtype first). The hypothesis that leaves
only rounding is the arithmetic the library did; the exact one is attn-fuzz's reading of the call.

  PROBE_OUT=probe.txt attn-check --replay CASE --adapter 'python3 scripts/device/float_mask_probe.py'
(an adapter's stderr goes to the tool's unlinked log, so the lines are appended to $PROBE_OUT)
"""
import os
import sys

import torch

from attnfuzz.adapter import serve
from attnfuzz.adapters import _torch_common as T
from attnfuzz.adapters.torch_sdpa import make


def rounded(x, dtype):
    return x.to(T.DTYPES[dtype]).double() if dtype in ("f16", "bf16") else x.float().double()


def hypotheses(Q, K, V, add, dtype, scale):
    """name -> O [B, H, Sq, Dv] float64 for the logits QK^T, the additive mask add (in the query dtype) and V."""
    raw = Q @ K.transpose(-1, -2)
    s = raw * scale
    sm = lambda x: torch.softmax(x, dim=-1)  # noqa: E731
    out = {
        "exact (mask as handed over)": sm(s + add) @ V,
        "scores rounded to dtype, then + mask": sm(rounded(s, dtype) + add) @ V,
        "scores + mask summed in dtype": sm(rounded(rounded(s, dtype) + add, dtype)) @ V,
        "fp32 scores + mask, sum rounded to dtype": sm(rounded(s.float().double() + add, dtype)) @ V,
        "mask added before the scale: (QK^T + mask) * scale": sm((raw + add) * scale) @ V,
        "mask ignored but its -inf": sm(s + torch.where(torch.isinf(add), add, torch.zeros_like(add))) @ V,
        "P rounded to dtype before P @ V": rounded(sm(s + add), dtype) @ V,
    }
    m = (s + add).amax(-1, keepdim=True)
    e = torch.exp(s + add - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
    out["unnormalised P rounded to dtype (flash style)"] = (rounded(e, dtype) @ V) / e.sum(-1, keepdim=True)
    return out


def probe(kernel):
    inner = kernel.fn

    def fn(q, k, v, p):
        got = inner(q, k, v, p)
        try:
            report(kernel.name, q, k, v, p, got)
        except Exception as e:  # the probe never changes what the kernel answers
            print(f"probe {kernel.name}: {type(e).__name__}: {e}", file=log())
        return got
    kernel.fn = fn
    return kernel


def log():
    return open(os.environ.get("PROBE_OUT", "/dev/stderr"), "a")


def report(name, q, k, v, p, got):
    if p.pass_name != "fwd" or not hasattr(got, "shape"):
        return
    Q, K, V = (T.to_torch(x, "cpu", p.dtype).double().transpose(1, 2) for x in (q, k, v))
    if p.heads_q != p.heads_kv:
        K, V = (x.repeat_interleave(p.heads_q // p.heads_kv, dim=1) for x in (K, V))
    add = T.score_add(p, "cpu")
    m = T.bool_mask(p, "cpu")
    base = torch.zeros(m.shape) if add is None else add
    mask = rounded(base.masked_fill(~m, float("-inf")), p.dtype)
    G = torch.from_numpy(got).double().transpose(1, 2)
    out = log()
    print(f"probe {name} B={p.batch} H={p.heads_q} Sq={p.seq_q} Sk={p.seq_k} D={p.head_dim} {p.dtype} "
          f"variants={'+'.join(p.variants) or 'none'} scale={p.scale:.9g}", file=out)
    for h, o in hypotheses(Q, K, V, mask, p.dtype, p.scale).items():
        d = (G - rounded(o, p.dtype)).abs().nan_to_num(nan=float("inf"))
        print(f"  max |got - h| {d.max().item():.3e}  mean {d.mean().item():.3e}  : {h}", file=out)
    out.close()


def main():
    dtypes = ["f32", "f16", "bf16"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    backends = ("cudnn", "efficient", "flash", "math") if device == "cuda" else ("math",)
    serve([probe(make(b, "float-mask", device, dtypes, False)) for b in backends], name="torch_sdpa")


if __name__ == "__main__":
    main()
