"""What the torch-based adapters share: numpy <-> torch on a device, masks as tensors, CUDA failure handling."""

import os
import sys

import numpy as np
import torch

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
_FP8 = {"fp8_e4m3": getattr(torch, "float8_e4m3fn", None), "fp8_e5m2": getattr(torch, "float8_e5m2", None)}
DTYPES.update({k: v for k, v in _FP8.items() if v is not None})  # torch >= 2.1


def to_torch(a, device, dtype="f32"):
    """numpy [B, S, H, D] stored elements of dtype (float32, float16, or uint16 bf16 bit patterns; float32
    values are converted) -> torch [B, S, H, D] of that dtype on device, bit for bit."""
    a = np.array(a, copy=True)  # a writable copy (protocol buffers are read-only)
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
    every key masked) gets a zero gradient."""

    def backward(q, k, v, o, lse, do, p):
        leaves = [to_torch(x, device, p.dtype).requires_grad_() for x in (q, k, v)]
        with torch.enable_grad():
            out = forward(*leaves, p)
            if isinstance(out, tuple):
                out = out[0]
            out.backward(to_torch(do, device, p.dtype))
        return tuple(from_torch(x.grad) if x.grad is not None else np.zeros(x.shape, np.float32) for x in leaves)

    return backward


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


def fatal_cuda_error(e):
    """A CUDA fault leaves the context unusable: exit so attn-fuzz reports a crash and restarts us."""
    text = str(e)
    if any(s in text for s in ("illegal memory access", "CUDA error", "device-side assert", "misaligned address",
                               "unspecified launch failure")):
        print(f"attnfuzz adapter: fatal CUDA error, exiting: {text[:500]}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(70)


def cuda_guarded(fn):
    """fn, exiting the adapter on a fatal CUDA error (fatal_cuda_error) before the exception goes on."""
    def g(*a):
        try:
            return fn(*a)
        except RuntimeError as e:
            fatal_cuda_error(e)
            raise
    return g


def probe_on_zeros(p, call, grad=None):
    """Runs call (and grad, the backward, if given) once on zero inputs of problem p's shape: raises as they do."""
    import numpy as np
    z = lambda s, h, d: np.zeros((p.batch, s, h, d), np.float32)
    q, k, v = z(p.seq_q, p.heads_q, p.head_dim), z(p.seq_k, p.heads_kv, p.head_dim), z(p.seq_k, p.heads_kv, p.head_dim_v)
    call(q, k, v, p)
    if grad is not None:
        grad(q, k, v, None, None, z(p.seq_q, p.heads_q, p.head_dim_v), p)


def is_unsupported(e):
    """SDPA / flex refusing a configuration (not a kernel failure)."""
    text = str(e)
    return any(s in text for s in ("No available kernel", "not supported", "Unsupported", "unsupported",
                                   "does not support", "must be", "Expected"))
