"""What the torch-based adapters share: numpy <-> torch on a device, masks as tensors, CUDA failure handling."""

import numpy as np
import torch

from attnfuzz.adapters._common import (c_strides, cuda_guarded, fatal_cuda_error, is_unsupported,  # noqa: F401 (shared)
                                       probe_on_zeros)

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
_FP8 = {"fp8_e4m3": getattr(torch, "float8_e4m3fn", None), "fp8_e5m2": getattr(torch, "float8_e5m2", None)}
DTYPES.update({k: v for k, v in _FP8.items() if v is not None})  # torch >= 2.1


def to_torch(a, device, dtype="f32"):
    """numpy [B, S, H, D] stored elements of dtype (float32, float16, or uint16 bf16 bit patterns; float32
    values are converted) -> torch [B, S, H, D] of that dtype on device, bit for bit."""
    a = c_strides(np.array(a, copy=True))  # a writable copy (protocol buffers are read-only), C strides if empty
    if dtype == "bf16" and a.dtype == np.uint16:
        t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    elif dtype in _FP8 and a.dtype == np.uint8:  # the stored fp8 elements (real value = stored * descale)
        t = torch.from_numpy(a).view(DTYPES[dtype])
    else:
        t = torch.from_numpy(a)
    return t.to(device=device, dtype=DTYPES[dtype])


def to_device(a, device, dtype="f32"):
    """numpy [B, S, H, D] (as to_torch) -> torch [B, H, S, D] on device."""
    return to_torch(a, device, dtype).transpose(1, 2)


def from_torch(t):
    """torch [B, S, H, D] of any float dtype -> numpy float32 (exact; the helper stores it in the case's dtype);
    an fp8 tensor (the stored fp8(O * o_scale)) -> its uint8 bit patterns, taken as stored."""
    if t.dtype in [d for d in _FP8.values() if d is not None]:
        return t.detach().contiguous().view(torch.uint8).cpu().numpy()
    return t.detach().to(torch.float32).contiguous().cpu().numpy()


def from_device(o):
    """torch [B, H, S, Dv] -> numpy float32 [B, S, H, Dv] (synchronises)."""
    return from_torch(o.transpose(1, 2))


def torch_backward(forward, device):
    """A Kernel backward (q, k, v, o, lse, do, p) -> (dQ, dK, dV) through torch.autograd of forward(Q, K, V, p),
    a torch function of [B, S, H, D] tensors returning O [B, Sq, Hq, Dv] (or (O, LSE)). The given o / lse are
    not used: autograd recomputes what it needs from its own forward. An input O does not depend on (e.g.
    every key masked) gets a zero gradient. With dropout, forward leaves the keep mask it drew in p._dropout_keep
    and it goes back with the gradients."""

    def backward(q, k, v, o, lse, do, p):
        leaves = [to_torch(x, device, p.dtype).requires_grad_() for x in (q, k, v)]
        # The score variants' own parameters (sinks, bias) as leaves too: variant_tensor hands them to forward.
        p._leaves = {n: variant_tensor(p, n, device).requires_grad_() for n in ("sinks", "bias")
                     if getattr(p, n, None) is not None}
        try:
            with torch.enable_grad():
                out = forward(*leaves, p)
                if isinstance(out, tuple):
                    out = out[0]
                out.backward(to_torch(do, device, p.dtype))
        finally:
            extra, p._leaves = p._leaves, None
        grad = lambda x: from_torch(x.grad) if x.grad is not None else np.zeros(tuple(x.shape), np.float32)
        grads = tuple(grad(x) for x in leaves)
        out = {"d" + n: grad(x) for n, x in extra.items()}
        if "dropout" in getattr(p, "variants", ()):  # the keep mask forward drew (forward sets p._dropout_keep)
            out["dropout_mask"] = p._dropout_keep
        return grads + (out,) if out else grads

    return backward


def variant_tensor(p, name, device):
    """p.<name> (sinks [Hq], alibi_slopes [Hq], bias [B|1, Hq|1, Sq|1, Sk|1]) as a float32 torch tensor on device
    (None where the problem does not use it); inside torch_backward, the leaf whose gradient it returns."""
    leaves = getattr(p, "_leaves", None)
    if leaves and name in leaves:
        return leaves[name]
    a = getattr(p, name, None)
    return None if a is None else torch.from_numpy(np.array(a, np.float32)).to(device)


def score_add(p, device):
    """float32 [B|1, Hq|1, Sq, Sk] torch: bias - slope_h |j - (i + off)| (docs/semantics.md "Variants"), or None
    without bias and ALiBi; differentiable in the bias under torch_backward."""
    bias, slopes = variant_tensor(p, "bias", device), variant_tensor(p, "alibi_slopes", device)
    if bias is None and slopes is None:
        return None
    add = torch.zeros(1, 1, p.seq_q, p.seq_k, device=device)
    if bias is not None:
        add = add + bias
    if slopes is not None:
        i = torch.arange(p.seq_q, device=device)[:, None]
        j = torch.arange(p.seq_k, device=device)[None, :]
        add = add - slopes[None, :, None, None] * (j - (i + p.diagonal_offset)).abs().to(torch.float32)
    return add


def with_sinks(o, lse, p, device):
    """(O, LSE) of attention with sinks from (O, LSE) without them (natural log; O [B, Sq, Hq, Dv], LSE [B, Hq,
    Sq]): LSE' = logaddexp(LSE, sink_h), O' = O exp(LSE - LSE'); a row without keys keeps O = 0 and gets LSE = sink.
    The identity the sink's definition gives (docs/semantics.md "Variants"); differentiable in the sinks."""
    sinks = variant_tensor(p, "sinks", device)
    if sinks is None:
        return o, lse
    lse32 = lse.to(torch.float32)
    new = torch.logaddexp(lse32, sinks[None, :, None].expand_as(lse32))
    w = torch.exp(lse32 - new).nan_to_num(0.0)  # -inf - finite = -inf -> 0; both -inf (no sink, no key): 0
    return (o.to(torch.float32) * w.transpose(1, 2)[..., None]).to(o.dtype), new


def bool_mask(p, device):
    """[Sq, Sk] bool, True = visible (attnfuzz semantics: j - (i + off) in [-left, right]); with custom masks
    (p.variants) [B, Hq, Sq, Sk]: the interval AND the custom / block masks (problem.visible_all())."""
    if getattr(p, "variants", None):
        return torch.from_numpy(np.ascontiguousarray(p.visible_all())).to(device)
    i = torch.arange(p.seq_q, device=device)[:, None]
    j = torch.arange(p.seq_k, device=device)[None, :]
    rel = j - (i + p.diagonal_offset)
    m = torch.ones(p.seq_q, p.seq_k, dtype=torch.bool, device=device)
    if p.window_left >= 0:
        m &= rel >= -p.window_left
    if p.window_right >= 0:
        m &= rel <= p.window_right
    return m


def repro_call(dtype, device, imports, sdpa_lines, arrays, pass_name, fn="sdpa"):
    """A repro.Call (attnfuzz/repro.py) of a torch library call: sdpa_lines define <fn>(Q, K, V), torch in q's, k's
    and v's layout ([B, S, H, D], or packed rows) -> O in q's layout; around them the glue the adapter then runs for
    that kernel (the stored elements to torch on the device bit for bit, as to_torch; O back as float32, as
    from_torch; the backward through torch.autograd of the same call, as torch_backward: an input O does not depend
    on gets a zero gradient). f32 / f16 / bf16."""
    glue = [f"DEV, DT = {device!r}, torch.{str(DTYPES[dtype]).split('.')[-1]}",
            "def t(a):  # stored elements (bf16: uint16 bit patterns) -> torch on DEV, bit for bit",
            "    a = np.array(np.ravel(a)).reshape(np.shape(a))  # a writable copy with C strides, also when empty",
            "    return (torch.from_numpy(a.view(np.int16)).view(DT) if DT == torch.bfloat16 else torch.from_numpy(a)).to(DEV, DT)"]
    if pass_name == "bwd":
        run = ["def call_bwd(q, k, v, o, lse, do):",
               "    Q, K, V = (t(a).requires_grad_() for a in (q, k, v))",
               f"    {fn}(Q, K, V).backward(t(do))",
               "    return tuple(np.zeros(a.shape, np.float32) if a.grad is None else a.grad.float().cpu().numpy() for a in (Q, K, V))"]
    else:
        run = ["def call(q, k, v):", f"    return {fn}(t(q), t(k), t(v)).detach().float().cpu().numpy()"]
    from attnfuzz import repro
    return repro.Call(["import torch"] + list(imports), glue + list(sdpa_lines) + run, arrays)
