# attn-fuzz bug report: sdpa-flash-lower-right fails (non-finite) on B=1 Hq=1 Hkv=1 Sq=1 Sk=1 D=1 Dv=1 mask=causal-br scale=-0.5 bf16 values=uniform:1 seed=0xafb94bbc6ce7cfe9 explicit
# attn-fuzz replay: attn-check --replay examples/sdpa-findings/bundles/flash-negative-scale-empty-rows/corpus/non-finite-9161d8311d024d0b.case --adapter 'python3 -m attnfuzz.adapters.torch_sdpa --backends flash --routes lower-right'
# Expected = attn-fuzz's exact oracle; exit 1 while the library is wrong, 0 once fixed. Inputs: the .npz;
# o, dq [b, s, h, d], lse [b, h, s], dk, dv [b, j, h, d] (j: key), as attn-fuzz's adapters carry them.
import sys
import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right
x = dict(np.load(sys.argv[1] if sys.argv[1:] else __file__[:-3] + ".npz"))
DEV, DT = 'cuda', torch.bfloat16
def t(a):  # stored elements (bf16: uint16 bit patterns) -> torch on DEV, bit for bit
    a = np.array(a)
    return (torch.from_numpy(a.view(np.int16)).view(DT) if DT == torch.bfloat16 else torch.from_numpy(a)).to(DEV, DT)
def sdpa(Qs, Ks, Vs):  # the call attnfuzz.adapters.torch_sdpa makes, [B, S, H, D] in and out
    Q, K, V = (a.transpose(1, 2) for a in (Qs, Ks, Vs))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        o = torch.nn.functional.scaled_dot_product_attention(Q, K, V, attn_mask=causal_lower_right(1, 1), scale=-0.5)
    return o.transpose(1, 2)
def call(q, k, v):
    return sdpa(t(q), t(k), t(v)).detach().float().cpu().numpy()
r = call(x["q"], x["k"], x["v"])
got = dict(zip(("o", "lse"), r if isinstance(r, tuple) else (r,)))
bad = 0
for n in [n for n in got if "expected_" + n in x]:  # a NaN bound: not compared (a row the oracle did not compute)
    e, b, g = x["expected_" + n], x["bound_" + n], np.asarray(got[n], np.float64).reshape(x["expected_" + n].shape)
    with np.errstate(all="ignore"):
        ok = (g == e) | (np.isnan(g) & np.isnan(e)) | np.isnan(b) | (np.abs(g - e) <= b)
        ratio = np.where(ok, 0.0, np.where(np.isfinite(g - e), np.abs(g - e) / b, np.inf))
    bad += int((~ok).sum())
    print(f"{n}: {int((~ok).sum())} of {int((~np.isnan(b)).sum())} elements beyond their bound")
    for i in np.argsort(-ratio, axis=None, kind="stable")[: min(6, int((~ok).sum()))]:
        at = ",".join(str(int(c)) for c in np.unravel_index(i, ratio.shape))
        print(f"  {n}[{at}] expected {e.flat[i]:.9g} got {g.flat[i]:.9g} bound {b.flat[i]:.3g}")
print("STILL WRONG" if bad else "fixed: every element within its bound")
sys.exit(1 if bad else 0)
