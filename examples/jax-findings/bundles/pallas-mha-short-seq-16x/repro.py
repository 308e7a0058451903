# attn-fuzz bug report: pallas-mha fails (wrong) on B=1 Hq=1 Hkv=1 Sq=1 Sk=1 D=1 Dv=1 mask=none scale=1 f16 values=uniform:1 seed=0x5ef05ea6d8013bbb explicit
# attn-fuzz replay: attn-check --replay examples/jax-findings/bundles/pallas-mha-short-seq-16x/corpus/wrong-7017f896402e7ae4.case --adapter 'python3 -m attnfuzz.adapters.pallas_attention --ops mha'
# Expected = attn-fuzz's exact oracle; exit 1 while the library is wrong, 0 once fixed. Inputs: the .npz;
# o, dq [b, s, h, d], lse [b, h, s], dk, dv [b, j, h, d] (j: key), as attn-fuzz's adapters carry them.
import sys
import numpy as np
import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.gpu.attention import BlockSizes, mha
x = dict(np.load(sys.argv[1] if sys.argv[1:] else __file__[:-3] + ".npz"))
jax.config.update("jax_default_matmul_precision", "highest")  # f32 means f32 (no TF32)
DT, EXTRA = jnp.float16, tuple(jnp.asarray(x[n]) for n in ())
def t(a):  # stored elements (bf16: uint16 bit patterns) -> a jax array of DT, bit for bit
    a = np.asarray(a)
    return jax.lax.bitcast_convert_type(jnp.asarray(a), DT) if a.dtype == np.uint16 else jnp.asarray(a, DT)
f32 = lambda a: np.asarray(jnp.asarray(a).astype(jnp.float32))
def attn(Q, K, V):  # the call attnfuzz.adapters.pallas_attention makes, [B, S, H, D] in and out
    return mha(Q, K, V, None, sm_scale=1.0, causal=False, block_sizes=BlockSizes(128, 128, block_q_dkv=128, block_kv_dkv=128, block_q_dq=128, block_kv_dq=128))
def call(q, k, v):
    return f32(attn(t(q), t(k), t(v), *EXTRA))
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
