"""JAX's jax.nn.dot_product_attention as attn-fuzz kernels: one kernel per (implementation, call route).

    attn-fuzz --adapter 'python3 -m attnfuzz.adapters.jax_attention' --kernel 'jax-xla-*' --max-time 300
    attn-fuzz --dtype bf16 --pass bwd --adapter 'python3 -m attnfuzz.adapters.jax_attention --implementations cudnn --backward'

Implementations: xla, cudnn (f16 / bf16 only, D a multiple of 8 up to 256; on a GPU). Routes:
  is-causal   is_causal=False (mask none) / True (causal, top-left: JAX's alignment)
  window      local_window_size=(left, right) (top-left; an unbounded side as Sq + Sk; causal as (Sq + Sk, 0))
  bool-mask   an explicit boolean mask (True = visible), every mask kind and the custom masks
  bias        the boolean mask plus an additive float32 bias: the bias and ALiBi variants (xla only)
GQA through JAX's own Hq % Hkv grouping; D = Dv (JAX wants value shaped as key). LSE: the documented logsumexp of
return_residual=True ([B, T, N], natural log) where the installed jax takes it and the kernels are served for f32
alone (--dtypes f32; JAX rounds the residual to f16 / bf16 inputs' dtype). --backward also declares the
backward pass (dQ, dK, dV, and d bias, through jax.vjp of the same call). A problem the library refuses (its
argument checks, cuDNN's "Unsupported sequence length") is `unsupported` with the library's words, found by one probe
on zeros per shape before the case runs; each kernel declares recompiles_per_shape (every new shape compiles).
The JAX process does not preallocate GPU memory (XLA_PYTHON_CLIENT_PREALLOCATE=false) and runs f32 matmuls in f32.
"""

import argparse
import copy
import inspect
import sys

import numpy as np

from attnfuzz.adapter import ALL_MASKS, MASK_VARIANTS, Kernel, serve
from attnfuzz.adapters import _common as C
from attnfuzz.adapters import _jax_common as J
from attnfuzz import repro

IMPLEMENTATIONS = ("xla", "cudnn")
ROUTES = {"is-causal": ["none", "causal-tl"], "window": ["causal-tl", "window-tl"],
          "bool-mask": list(ALL_MASKS), "bias": list(ALL_MASKS)}
LOWP = ("f16", "bf16")  # cuDNN's dtypes (and fp8, which the adapter does not send)


def window(p):
    """local_window_size for a top-left causal / window problem: (left, right), an unbounded side as Sq + Sk."""
    far = p.seq_q + p.seq_k
    side = lambda w: far if w < 0 else w
    return side(p.window_left), side(p.window_right)


def score_arrays(p):
    """{name: float32 array} of the bias route: "bias" (the problem's own, differentiable) and "alibi" (-slope_h |j -
    (i + off)|), each where the problem uses it; at a check (no tensors yet) a zero bias [1, 1, Sq, Sk]."""
    out = {}
    if "bias" in p.variants:
        b = p.bias if p.bias is not None else np.zeros((1, 1, p.seq_q, p.seq_k), np.float32)
        out["bias"] = np.ascontiguousarray(b, np.float32)
    if "alibi" in p.variants and p.alibi_slopes is not None:
        only = copy.copy(p)
        only.bias = None
        out["alibi"] = np.ascontiguousarray(only.score_add(), np.float32)
    return out


def arguments(impl, route, p, arrays):
    """The keyword arguments of the call, as source text; fills arrays with the mask / bias / ALiBi it reads."""
    kw = []
    if route == "is-causal":
        kw.append(f"is_causal={p.mask_kind == 'causal'}")
    elif route == "window":
        kw.append(f"local_window_size={window(p)}")
    else:  # bool-mask, bias: True = visible, [B|1, Hq|1, Sq, Sk]
        vis = p.visible_all() if set(p.variants) & set(MASK_VARIANTS) else p.visible()[None, None]
        arrays["mask"] = np.ascontiguousarray(vis)
        kw.append("mask=jnp.asarray(x['mask'])")
    scores = score_arrays(p) if route == "bias" else {}
    arrays.update(scores)
    terms = (["B[0]"] if "bias" in scores else []) + (["jnp.asarray(x['alibi'])"] if "alibi" in scores else [])
    if terms:
        kw.append("bias=" + " + ".join(terms))
    kw += [f"scale={p.scale!r}", f"implementation={impl!r}"]
    return kw, tuple(n for n in ("bias",) if n in scores)


def make(impl, route, dtypes, backward, version, residual=False):
    """The kernel jax-<impl>-<route>; residual: the installed jax.nn.dot_product_attention takes return_residual (its
    documented logsumexp, [B, T, N]), so the kernel returns LSE too."""
    def library_call(p, pass_name):
        """repro.Call: this kernel's jax.nn.dot_product_attention call on p, as source the adapter runs and a
        bug-report script prints (attnfuzz/repro.py)."""
        arrays = {}
        kw, extra = arguments(impl, route, p, arrays)
        kw += ["return_residual=True"] if residual else []
        lines = ["def attn(Q, K, V, *B):  # the call attnfuzz.adapters.jax_attention makes, [B, S, H, D] in and out",
                 f"    return jax.nn.dot_product_attention(Q, K, V, {', '.join(kw)})"]
        return J.repro_call(p.dtype, [], lines, arrays, pass_name, extra, lse=residual)

    call, grad = repro.forward(library_call), repro.backward(library_call)
    variants = ()
    if route in ("bool-mask", "bias"):
        variants = MASK_VARIANTS + (("alibi", "bias") if route == "bias" else ())
    cudnn = impl == "cudnn"
    return Kernel(f"jax-{impl}-{route}", C.cuda_guarded(call), family="jax-dpa",
                  description=f"jax {version} jax.nn.dot_product_attention implementation={impl}, route {route}",
                  dtypes=[d for d in dtypes if d in LOWP] if cudnn else dtypes, masks=ROUTES[route],
                  dv_ne_d=False, head_dim_multiple=8 if cudnn else 1, max_head_dim=256 if cudnn else 0,
                  supports=C.probed_supports(f"jax {impl}/{route}", call, grad, J.refusal),
                  # xla: scores and softmax in fp32, P rounded to the dtype; declared unfused (the wider bound) since
                  # XLA may fuse the two einsums differently per shape; cuDNN is a flash kernel
                  compute_model="fused" if cudnn else "unfused", variants=variants,
                  backward=C.cuda_guarded(grad) if backward else None, repro=library_call,
                  recompiles_per_shape=True, lse=residual)


def kernels(implementations, routes, dtypes, backward, version):
    """The kernels of these implementations x routes (the bias route only for xla: cuDNN's bias is in the dtype); with
    LSE where jax.nn.dot_product_attention takes return_residual and the kernels are served for f32 alone (--dtypes
    f32): JAX rounds the residual to the input dtype (xla: logsumexp(...).astype(key.dtype); cudnn: .astype(out.dtype)),
    so an f16 / bf16 LSE would be judged against an fp32 LSE's bound and fail on a correct call."""
    import jax
    residual = "return_residual" in inspect.signature(jax.nn.dot_product_attention).parameters and list(dtypes) == ["f32"]
    return [make(i, r, dtypes, backward, version, residual) for i in implementations for r in routes
            if not (i == "cudnn" and r == "bias")]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--implementations", default=",".join(IMPLEMENTATIONS),
                    help="comma-separated: " + ",".join(IMPLEMENTATIONS) + " (cudnn only where JAX sees a GPU)")
    ap.add_argument("--routes", default=",".join(ROUTES), help="comma-separated: " + ",".join(ROUTES))
    ap.add_argument("--dtypes", default="f32,f16,bf16", help="declared dtypes, comma-separated: " + ",".join(J.DTYPES))
    ap.add_argument("--backward", action="store_true", help="also declare the backward pass (jax.vjp)")
    a = ap.parse_args(argv)
    impls = C.parse_list(ap, a.implementations, IMPLEMENTATIONS, "implementation")
    routes = C.parse_list(ap, a.routes, ROUTES, "route")
    dtypes = C.parse_list(ap, a.dtypes, J.DTYPES, "dtype")
    jax = J.start_jax()
    if "cudnn" in impls and not J.has_gpu(jax):
        print("jax_attention: no GPU backend, cudnn kernels left out", file=sys.stderr)
        impls = [i for i in impls if i != "cudnn"]
    if not impls:
        ap.exit(2, "jax_attention: no kernels to serve (cudnn needs a GPU JAX sees)\n")
    serve(kernels(impls, routes, dtypes, a.backward, jax.__version__), name="jax_attention")


if __name__ == "__main__":
    main()
