"""Serve any importable attention callable:  python3 -m attnfuzz.adapters.callable MODULE:FUNCTION [options]

The function takes (q, k, v, problem) - numpy [B, S, H, D] arrays and an attnfuzz.Problem - and returns O
[B, Sq, Hq, Dv] (numpy, or anything np.asarray accepts, e.g. a CPU torch tensor), or (O, LSE) with --lse.
Arrays hold the stored elements of problem.dtype: float32, float16, uint16 bf16 or uint8 fp8 bit patterns
(attnfuzz.dtypes converts; fp8 descales in problem.q_descale ...); --dtypes declares which the function
takes (default f32). With --torch DEVICE the function takes and returns torch tensors [B, S, H, D] of the
case's dtype on DEVICE instead. Backward (attn-check / attn-fuzz --pass bwd): --backward MODULE:FUNCTION, a
function (q, k, v, o, lse, do, problem) -> (dQ, dK, dV) in the same conventions, or --autograd (with
--torch): torch.autograd through the function. --variants sink,softcap,... declares the variants the function
applies (it reads them from problem: problem.sinks, problem.softcap, problem.score_add(), problem.visible_all(),
problem.q_descale_h ...; with kv-shared, v is the view k[..., :Dv]); without it, variant cases are unsupported.
Examples:

    attn-fuzz --adapter 'python3 -m attnfuzz.adapters.callable mypkg.attn:my_attention --masks none,causal-br'
    attn-fuzz --dtype bf16 \
        --adapter 'python3 -m attnfuzz.adapters.callable mypkg.attn:attn --torch cuda --dtypes bf16'
    attn-check --sweep --pass bwd \
        --adapter 'python3 -m attnfuzz.adapters.callable mypkg.attn:attn --torch cuda --autograd'
    attn-check --sweep --variant sink+softcap \
        --adapter 'python3 -m attnfuzz.adapters.callable mypkg.attn:attn --variants sink,softcap --lse'
"""

import argparse
import importlib
import sys

from attnfuzz.adapter import ALL_MASKS, VARIANTS, Kernel, serve


def load(spec):
    mod, _, attr = spec.partition(":")
    if not mod or not attr:
        raise SystemExit(f"callable: expected MODULE:FUNCTION, got {spec!r}")
    obj = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target", help="MODULE:FUNCTION (importable with the current PYTHONPATH)")
    ap.add_argument("--name", help="kernel name (default: the function's name)")
    ap.add_argument("--masks", default=",".join(ALL_MASKS), help="comma-separated: " + ",".join(ALL_MASKS))
    ap.add_argument("--lse", action="store_true", help="the function returns (O, LSE)")
    ap.add_argument("--no-gqa", action="store_true", help="Hq != Hkv is not supported")
    ap.add_argument("--no-dv-ne-d", action="store_true", help="Dv != D is not supported")
    ap.add_argument("--no-empty-keys", action="store_true", help="Sk = 0 is not supported")
    ap.add_argument("--max-head-dim", type=int, default=0)
    ap.add_argument("--compute-model", choices=("fused", "unfused"), default="unfused",
                    help="how its f16 / bf16 path computes: fused (fp32 scores and softmax statistics, "
                         "FlashAttention-style) or unfused (scores rounded to the dtype; default: the wider bound)")
    ap.add_argument("--dtypes", default="f32",
                    help="dtypes the function takes, comma-separated: f32,f16,bf16,fp8_e4m3,fp8_e5m2")
    ap.add_argument("--torch", metavar="DEVICE", help="the function takes torch tensors on DEVICE (e.g. cuda)")
    ap.add_argument("--backward", metavar="MODULE:FUNCTION", help="its backward (q, k, v, o, lse, do, problem)")
    ap.add_argument("--autograd", action="store_true", help="backward through torch.autograd (needs --torch)")
    ap.add_argument("--variants", default="",
                    help="variants the function applies, comma-separated (PROTOCOL.md \"Variants\"): "
                         + ",".join(VARIANTS) + " (default none: cases with a variant are unsupported)")
    a = ap.parse_args(argv)
    variants = [v for v in a.variants.split(",") if v]
    if any(v not in VARIANTS for v in variants):
        ap.error(f"--variants takes {','.join(VARIANTS)}, not {a.variants!r}")
    if a.autograd and not a.torch:
        ap.error("--autograd needs --torch DEVICE")
    if a.autograd and a.backward:
        ap.error("--autograd and --backward exclude each other")
    fn = load(a.target)
    bwd = load(a.backward) if a.backward else None
    if a.torch:
        from attnfuzz.adapters import _torch_common as T
        tfn, dev = fn, a.torch

        def fn(q, k, v, p):  # noqa: F811 - numpy in, numpy out around the torch function
            res = tfn(*(T.to_torch(x, dev, p.dtype) for x in (q, k, v)), p)
            return tuple(T.from_torch(r) for r in res) if isinstance(res, tuple) else T.from_torch(res)

        if a.autograd:
            bwd = T.torch_backward(tfn, dev)
        elif bwd is not None:
            tbwd = bwd

            def bwd(q, k, v, o, lse, do, p):
                args = [T.to_torch(x, dev, dt) for x, dt in ((q, p.dtype), (k, p.dtype), (v, p.dtype),
                                                             (o, p.dtype), (lse, "f32"), (do, p.dtype))]
                return tuple(T.from_torch(g) for g in tbwd(*args, p))
    name = a.name or a.target.rpartition(":")[2].replace(".", "-").replace("_", "-")
    masks = [m for m in a.masks.split(",") if m]
    serve([Kernel(name, fn, family="callable", description=a.target, masks=masks, lse=a.lse,
                  gqa=not a.no_gqa, dv_ne_d=not a.no_dv_ne_d, empty_keys=not a.no_empty_keys,
                  max_head_dim=a.max_head_dim, max_head_dim_v=a.max_head_dim,
                  dtypes=[d for d in a.dtypes.split(",") if d], compute_model=a.compute_model,
                  backward=bwd, variants=variants)], name=a.target)


if __name__ == "__main__":
    sys.exit(main())
