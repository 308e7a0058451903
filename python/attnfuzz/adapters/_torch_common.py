"""What the torch-based adapters share: numpy <-> torch on a device, masks as tensors, CUDA failure handling."""

import os
import sys

import numpy as np
import torch

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def to_device(a, device, dtype="f32"):
    """numpy [B, S, H, D] -> torch [B, H, S, D] on device."""
    return torch.from_numpy(np.array(a, copy=True)).to(  # a writable copy (protocol buffers are read-only)
        device=device, dtype=DTYPES[dtype]).transpose(1, 2)


def from_device(o):
    """torch [B, H, S, Dv] -> numpy float32 [B, S, H, Dv] (synchronises)."""
    return o.transpose(1, 2).to(torch.float32).contiguous().cpu().numpy()


def bool_mask(p, device):
    """[Sq, Sk] bool, True = visible (attnfuzz semantics: j - (i + off) in [-left, right])."""
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


def is_unsupported(e):
    """SDPA / flex refusing a configuration (not a kernel failure)."""
    text = str(e)
    return any(s in text for s in ("No available kernel", "not supported", "Unsupported", "unsupported",
                                   "does not support", "must be", "Expected"))
