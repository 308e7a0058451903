"""PyTorch scaled_dot_product_attention as attn-fuzz kernels: one kernel per (backend, call route).

    attn-fuzz --adapter 'python3 -m attnfuzz.adapters.torch_sdpa' --kernel 'sdpa-efficient-*' --max-time 300

Backends (torch.nn.attention.sdpa_kernel): math, efficient, cudnn, flash. Routes:
  is-causal     is_causal=False (mask none) / True (causal top-left: PyTorch's alignment)
  lower-right   attn_mask=torch.nn.attention.bias.causal_lower_right(Sq, Sk) (causal bottom-right)
  bool-mask     an explicit boolean attn_mask (True = visible), every mask kind
  float-mask    an additive float attn_mask (0 visible, -inf masked), every mask kind
(bool-mask and float-mask also take the custom masks: mask-dense, mask-bits, block-sparse, as one dense
[B, Hq, Sq, Sk] attn_mask)
A configuration the backend refuses ("No available kernel") is reported as unsupported through the
protocol's check message, not as a failure. GQA uses enable_gqa=True. Every kernel declares the dtypes of
--dtypes (default f32,f16,bf16) and runs each case in its dtype (attn-fuzz --dtype f16: flash and cudnn
refuse f32). --backward also declares the backward pass (dQ, dK, dV through torch.autograd of the same SDPA
call; attn-check/attn-fuzz --pass bwd); then a configuration is supported only if forward and backward run.
  dropout       SDPA's own dropout (flash and efficient on CUDA) through the private ops
                that give the keep mask back, seeded from the problem's (dropout_seed, dropout_offset); writes LSE
                (so --pass fwdbwd checks that forward and backward drew the same mask):
                attn-check --adapter '... --routes dropout --backward' --dropout 0.3 --dropout-rng exported
                Masks: none, and is_causal as each private op aligns it: efficient top-left (causal-tl), flash
                bottom-right (causal-br; causal-tl too where Sq = Sk, the same mask), since the private flash op
                runs FlashAttention's causal, which the public SDPA call refuses for Sq != Sk.
"""

import argparse

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnfuzz import repro
from attnfuzz.adapter import MASK_VARIANTS, Kernel, serve
from attnfuzz.adapters import _torch_common as T

BACKEND_NAMES = {"math": "MATH", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                 "flash": "FLASH_ATTENTION"}  # SDPBackend members
BACKENDS = {k: getattr(SDPBackend, v) for k, v in BACKEND_NAMES.items()}
ROUTES = {"is-causal": ["none", "causal-tl"], "lower-right": ["causal-br"],
          "bool-mask": ["none", "causal-tl", "causal-br", "window-tl", "window-br"],
          "float-mask": ["none", "causal-tl", "causal-br", "window-tl", "window-br"],
          "dropout": ["none", "causal-tl", "causal-br"]}
# The backends of the dropout route: their private ops give the keep mask back (flash: its debug mask, a dropped
# weight with the sign bit set; efficient: the uniforms redrawn from the (seed, offset) it returns, kept where > p).
DROPOUT_BACKENDS = ("flash", "efficient")
# The causal alignment of each private op's is_causal: efficient top-left; flash FlashAttention's bottom-right (public
# SDPA refuses flash with is_causal for Sq != Sk; the private op does not check). At Sq = Sk the two are one mask.
DROPOUT_CAUSAL = {"efficient": "causal-tl", "flash": "causal-br"}


def private_sdpa(backend, Q, K, V, p):
    """The dropout route: SDPA's private flash / efficient op on the CUDA generator set to (dropout_seed,
    4 * dropout_offset), so a backward's recomputed forward draws the forward's mask. Q, K, V [B, H, S, D];
    returns O [B, Hq, Sq, Dv], LSE [B, Hq, Sq] (natural log) and the keep mask (numpy u8 [B, Hq, Sq, Sk]; all
    ones at p = 0)."""
    drop = p.dropout_p if "dropout" in p.variants else 0.0
    gen = torch.cuda.default_generators[Q.device.index or 0]
    gen.manual_seed(p.dropout_seed)
    gen.set_offset(4 * p.dropout_offset)
    if p.heads_q != p.heads_kv:  # the private ops take equal heads
        K, V = (x.repeat_interleave(p.heads_q // p.heads_kv, 1) for x in (K, V))
    causal = p.mask_kind == "causal"
    if causal and p.mask != DROPOUT_CAUSAL[backend] and p.seq_q != p.seq_k:
        raise ValueError(f"the private {backend} op aligns is_causal as {DROPOUT_CAUSAL[backend]}, not {p.mask}, "
                         "when Sq != Sk")
    if backend == "flash":
        out = torch.ops.aten._scaled_dot_product_flash_attention(Q, K, V, drop, causal, drop > 0, scale=p.scale)
        keep = out[-1][:, :, :p.seq_q, :p.seq_k] >= 0 if drop > 0 else None
    else:
        out = torch.ops.aten._scaled_dot_product_efficient_attention(Q, K, V, None, True, drop, causal, scale=p.scale)
        keep = None
        if drop > 0:
            u = torch.empty(p.batch, p.heads_q, p.seq_q, p.seq_k, device=Q.device, dtype=torch.float32)
            keep = torch.ops.aten._fill_mem_eff_dropout_mask_(u, drop, out[2].item(), out[3].item()) > drop
    if keep is None:  # p = 0: every weight kept
        keep = torch.ones(p.batch, p.heads_q, p.seq_q, p.seq_k, dtype=torch.bool)
    keep = keep.to(torch.uint8).cpu().numpy()
    return out[0], out[1][:, :, :p.seq_q], keep


def public_refusal(be, p, device):
    """Why SDPA's public call refuses problem p on backend be with its dropout (None: it runs it). The dropout route
    calls the private ops, which check less: at Sk = 0 they returned LSE +inf or a finite one where the public call
    has "No available kernel", and the efficient op at Dv = 33 (bf16) faulted with a misaligned address (an H200
    campaign, examples/h200-campaigns/README.md): problems the public call refuses are not the library's answers."""
    dt = T.DTYPES[p.dtype]
    z = lambda h, s, d: torch.zeros(p.batch, h, s, d, device=device, dtype=dt)
    kw = {"dropout_p": p.dropout_p if "dropout" in p.variants else 0.0, "scale": p.scale,
          "is_causal": p.mask_kind == "causal"}
    if p.heads_q != p.heads_kv:
        kw["enable_gqa"] = True
    try:
        with sdpa_kernel([be]):
            torch.nn.functional.scaled_dot_product_attention(z(p.heads_q, p.seq_q, p.head_dim),
                                                             z(p.heads_kv, p.seq_k, p.head_dim),
                                                             z(p.heads_kv, p.seq_k, p.head_dim_v), **kw)
    except RuntimeError as e:
        T.fatal_cuda_error(e)
        return f"the public call refuses it: {str(e).splitlines()[0][:160]}"
    except Exception as e:  # e.g. a ValueError from a shape check: refused, with what was raised
        return f"the public call refuses it: {type(e).__name__}: {str(e)[:160]}"
    return None


def make(backend, route, device, dtypes, backward):
    be = BACKENDS[backend]
    refused = {}

    def library_call(p, pass_name):
        """repro.Call: the SDPA call of this backend and route on p, as source the adapter runs and a bug-report
        script prints (attnfuzz/repro.py). A mask tensor is the adapter's, handed over as x["attn_mask"]."""
        if not scripted(p):
            raise ValueError("no script for fp8, ALiBi / bias (the adapter's differentiable float mask) or the dropout "
                             "route (SDPA's private ops)")
        kw, arrays, imports = [], {}, ["from torch.nn.attention import SDPBackend, sdpa_kernel"]
        if route == "is-causal":
            kw.append(f"is_causal={p.mask_kind == 'causal'}")
        elif route == "lower-right":
            imports.append("from torch.nn.attention.bias import causal_lower_right")
            kw.append(f"attn_mask=causal_lower_right({p.seq_q}, {p.seq_k})")
        else:  # bool-mask: True = visible; float-mask: additive, 0 visible, -inf masked (in the dtype)
            vis = np.ascontiguousarray(p.visible_all() if p.variants else p.visible())
            arrays["attn_mask"] = vis if route == "bool-mask" else np.where(vis, 0, -np.inf).astype(np.float32)
            kw.append("attn_mask=torch.from_numpy(x['attn_mask']).to(DEV" + (")" if route == "bool-mask" else ", DT)"))
        kw.append(f"scale={p.scale!r}")
        if p.heads_q != p.heads_kv:
            kw.append("enable_gqa=True")
        lines = ["def sdpa(Qs, Ks, Vs):  # the call attnfuzz.adapters.torch_sdpa makes, [B, S, H, D] in and out",
                 "    Q, K, V = (a.transpose(1, 2) for a in (Qs, Ks, Vs))",
                 f"    with sdpa_kernel([SDPBackend.{BACKEND_NAMES[backend]}]):",
                 f"        o = torch.nn.functional.scaled_dot_product_attention(Q, K, V, {', '.join(kw)})",
                 "    return o.transpose(1, 2)"]
        return T.repro_call(p.dtype, device, imports, lines, arrays, pass_name)

    def scripted(p):
        """True when the problem runs through library_call: everything but ALiBi / bias (differentiable parts of the
        float mask, below), fp8 and the dropout route (SDPA's private ops)."""
        return route != "dropout" and p.dtype in ("f32", "f16", "bf16") and not {"alibi", "bias"} & set(p.variants)

    def sdpa(Qs, Ks, Vs, p):
        """torch [B, S, H, D] in, O [B, Sq, Hq, Dv] out (autograd-able), for what library_call does not run: fp8, the
        float mask with ALiBi / bias, and the dropout route: (O, LSE), and p._dropout_keep = the keep mask it drew."""
        Q, K, V = (x.transpose(1, 2) for x in (Qs, Ks, Vs))
        if route == "dropout":
            o, lse, p._dropout_keep = private_sdpa(backend, Q, K, V, p)
            return o.transpose(1, 2), lse
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
        else:  # float-mask: the additive mask carries ALiBi and the bias too (bias - slope |j - (i + off)|)
            m = T.bool_mask(p, device)
            add = T.score_add(p, device)
            base = torch.zeros(m.shape, dtype=torch.float32, device=device) if add is None else add
            kw["attn_mask"] = base.masked_fill(~m, float("-inf")).to(Q.dtype)
        with sdpa_kernel([be]):
            o = torch.nn.functional.scaled_dot_product_attention(Q, K, V, **kw)
        return o.transpose(1, 2)

    run_fwd, run_bwd = repro.forward(library_call), repro.backward(library_call)

    def call(q, k, v, p):
        if scripted(p):
            return run_fwd(q, k, v, p)
        out = sdpa(*(T.to_torch(x, device, p.dtype) for x in (q, k, v)), p)
        if route != "dropout":
            return T.from_torch(out)
        o, lse = T.from_torch(out[0]), out[1].detach().float().cpu().numpy()
        return (o, lse, {"dropout_mask": p._dropout_keep}) if "dropout" in p.variants else (o, lse)

    autograd = T.torch_backward(sdpa, device)

    def grad(q, k, v, o, lse, do, p):
        return run_bwd(q, k, v, o, lse, do, p) if scripted(p) else autograd(q, k, v, o, lse, do, p)

    def supports(p):
        key = (p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_k, p.head_dim, p.head_dim_v, p.mask, p.dtype,
               tuple(p.variants), p.pass_name)
        if key not in refused and route == "dropout":
            why = public_refusal(be, p, device)
            if why:
                refused[key] = f"sdpa {backend}/{route}: {why}"
        if key not in refused:
            try:
                T.probe_on_zeros(p, call, grad if backward and p.pass_name == "bwd" else None)
                refused[key] = None
            except RuntimeError as e:
                T.fatal_cuda_error(e)
                refused[key] = f"sdpa {backend}/{route} refuses it: {str(e).splitlines()[0][:200]}" \
                    if T.is_unsupported(e) else None
            except Exception as e:  # e.g. a ValueError from the mask constructors
                refused[key] = f"sdpa {backend}/{route} refuses it: {type(e).__name__}: {str(e)[:200]}"
        return refused[key]

    # An explicit attn_mask carries the custom masks too (a dense [B, Hq, Sq, Sk] bool, _torch_common.bool_mask);
    # the float one also ALiBi and the bias (SDPA has no softcap and no sinks).
    variants = MASK_VARIANTS if route in ("bool-mask", "float-mask") else ()
    if route == "float-mask":
        variants += ("alibi", "bias")
    if route == "dropout":
        variants = ("dropout",)
    return Kernel(f"sdpa-{backend}-{route}", T.cuda_guarded(call), family="torch-sdpa",
                  description=f"torch {torch.__version__} SDPA backend {backend}, route {route}, on {device}",
                  dtypes=dtypes, masks=ROUTES[route], supports=supports, variants=variants,
                  # math rounds q*sqrt(scale), k*sqrt(scale) and the scores to the dtype; the fused backends keep
                  # scores and softmax statistics in fp32
                  compute_model="unfused" if backend == "math" else "fused", lse=route == "dropout",
                  # SDPA takes a float attn_mask in the query's dtype: ALiBi + bias are rounded to it
                  score_add_in_dtype=route == "float-mask",
                  backward=T.cuda_guarded(grad) if backward else None, repro=library_call)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated: " + ",".join(BACKENDS))
    ap.add_argument("--routes", default=",".join(ROUTES), help="comma-separated: " + ",".join(ROUTES))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtypes", default="f32,f16,bf16", help="declared dtypes, comma-separated: " + ",".join(T.DTYPES))
    ap.add_argument("--backward", action="store_true", help="also declare the backward pass (torch.autograd)")
    a = ap.parse_args(argv)
    dtypes = [d for d in a.dtypes.split(",") if d]
    for d in dtypes:
        if d not in T.DTYPES:
            ap.error(f"unknown dtype {d!r} (" + ",".join(T.DTYPES) + ")")
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 (math backend matmuls)
    torch.backends.cudnn.allow_tf32 = False
    kernels = [make(b, r, a.device, dtypes, a.backward)
               for b in a.backends.split(",") if b for r in a.routes.split(",") if r
               if r != "dropout" or (b in DROPOUT_BACKENDS and a.device != "cpu")]
    serve(kernels, name="torch_sdpa")


if __name__ == "__main__":
    main()
