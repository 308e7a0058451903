"""PyTorch scaled_dot_product_attention as attn-fuzz kernels: one kernel per (backend, call route).

    attn-fuzz --adapter 'python3 -m attnfuzz.adapters.torch_sdpa' --kernel 'sdpa-efficient-*' --max-time 300

Backends (torch.nn.attention.sdpa_kernel): math, efficient, cudnn, flash. Routes:
  is-causal     is_causal=False (mask none) / True (causal top-left: PyTorch's alignment)
  lower-right   attn_mask=torch.nn.attention.bias.causal_lower_right(Sq, Sk) (causal bottom-right)
  bool-mask     an explicit boolean attn_mask (True = visible), every mask kind
  float-mask    an additive float attn_mask (0 visible, -inf masked), every mask kind
A configuration the backend refuses ("No available kernel") is reported as unsupported through the
protocol's check message, not as a failure. GQA uses enable_gqa=True.
"""

import argparse

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnfuzz.adapter import Kernel, serve
from attnfuzz.adapters import _torch_common as T

BACKENDS = {"math": SDPBackend.MATH, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
ROUTES = {"is-causal": ["none", "causal-tl"], "lower-right": ["causal-br"],
          "bool-mask": ["none", "causal-tl", "causal-br", "window-tl", "window-br"],
          "float-mask": ["none", "causal-tl", "causal-br", "window-tl", "window-br"]}


def make(backend, route, device, dtype):
    be = BACKENDS[backend]
    refused = {}

    def call(q, k, v, p):
        Q, K, V = (T.to_device(x, device, dtype) for x in (q, k, v))
        kw = {"scale": p.scale}
        if p.heads_q != p.heads_kv:
            kw["enable_gqa"] = True
        if route == "is-causal":
            kw["is_causal"] = p.mask_kind == "causal"
        elif route == "lower-right":
            from torch.nn.attention.bias import causal_lower_right
            kw["attn_mask"] = causal_lower_right(p.seq_q, p.seq_k)
        elif route == "bool-mask":
            kw["attn_mask"] = T.bool_mask(p, device)
        else:
            m = T.bool_mask(p, device)
            kw["attn_mask"] = torch.zeros(m.shape, dtype=Q.dtype, device=device).masked_fill(~m, float("-inf"))
        with sdpa_kernel([be]):
            o = torch.nn.functional.scaled_dot_product_attention(Q, K, V, **kw)
        return T.from_device(o)

    def run(q, k, v, p):
        try:
            return call(q, k, v, p)
        except RuntimeError as e:
            T.fatal_cuda_error(e)
            raise

    def supports(p):
        key = (p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_k, p.head_dim, p.head_dim_v, p.mask)
        if key not in refused:
            import numpy as np
            z = lambda s, h, d: np.zeros((p.batch, s, h, d), np.float32)
            try:
                call(z(p.seq_q, p.heads_q, p.head_dim), z(p.seq_k, p.heads_kv, p.head_dim),
                     z(p.seq_k, p.heads_kv, p.head_dim_v), p)
                refused[key] = None
            except RuntimeError as e:
                T.fatal_cuda_error(e)
                refused[key] = f"sdpa {backend}/{route} refuses it: {str(e).splitlines()[0][:200]}" \
                    if T.is_unsupported(e) else None
            except Exception as e:  # e.g. a ValueError from the mask constructors
                refused[key] = f"sdpa {backend}/{route} refuses it: {type(e).__name__}: {str(e)[:200]}"
        return refused[key]

    return Kernel(f"sdpa-{backend}-{route}", run, family="torch-sdpa",
                  description=f"torch {torch.__version__} SDPA backend {backend}, route {route}, {dtype} on {device}",
                  dtypes=[dtype], masks=ROUTES[route], supports=supports)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated: " + ",".join(BACKENDS))
    ap.add_argument("--routes", default=",".join(ROUTES), help="comma-separated: " + ",".join(ROUTES))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="f32", choices=list(T.DTYPES), help="(f16/bf16 once the tool carries them)")
    a = ap.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 (math backend matmuls)
    torch.backends.cudnn.allow_tf32 = False
    kernels = [make(b, r, a.device, a.dtype) for b in a.backends.split(",") if b for r in a.routes.split(",") if r]
    serve(kernels, name="torch_sdpa")


if __name__ == "__main__":
    main()
