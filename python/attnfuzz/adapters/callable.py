"""Serve any importable attention callable:  python3 -m attnfuzz.adapters.callable MODULE:FUNCTION [options]

The function takes (q, k, v, problem) - numpy float32 [B, S, H, D] arrays and an attnfuzz.Problem - and
returns O [B, Sq, Hq, Dv] (numpy, or anything np.asarray accepts, e.g. a CPU torch tensor), or (O, LSE)
with --lse. Example:

    attn-fuzz --adapter 'python3 -m attnfuzz.adapters.callable mypkg.attn:my_attention --masks none,causal-br'
"""

import argparse
import importlib
import sys

from attnfuzz.adapter import ALL_MASKS, Kernel, serve


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
    a = ap.parse_args(argv)
    fn = load(a.target)
    name = a.name or a.target.rpartition(":")[2].replace(".", "-").replace("_", "-")
    masks = [m for m in a.masks.split(",") if m]
    serve([Kernel(name, fn, family="callable", description=a.target, masks=masks, lse=a.lse,
                  gqa=not a.no_gqa, dv_ne_d=not a.no_dv_ne_d, empty_keys=not a.no_empty_keys,
                  max_head_dim=a.max_head_dim, max_head_dim_v=a.max_head_dim)], name=a.target)


if __name__ == "__main__":
    sys.exit(main())
