# sdpa_backward.py - PyTorch SDPA's backward on every available backend, written as NPY for `attn-check --npy`:
# q, k, v, do in; o, dq, dk, dv out (and case.json), one directory per backend.
#
# Example for users (not built or tested by attn-fuzz). Needs numpy and torch; a GPU for the flash /
# efficient / cudnn backends (the math backend also runs on the CPU).
#
#   python3 sdpa_backward.py OUT --sq 12 --sk 8 --d 64 --mask causal-br --dtype fp32   # rows 0..3 fully masked
#   attn-check --npy OUT/math          # exit 0 pass, 1 failure (the verdict names O / LSE / dQ / dK / dV)
#   for d in OUT/*; do attn-check --npy $d --out reports-$(basename $d); done
#
# Masks: none | causal-tl | causal-br (an explicit boolean mask, so a bottom-right causal mask with Sq > Sk
# has fully masked rows: attn-fuzz's semantics is O = 0 and zero gradients there). SDPA returns no LSE, so
# attn-check judges the backward as if it had been given the exact LSE.
import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def mask_of(mask, sq, sk, device):
    if mask == "none":
        return None
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    off = 0 if mask == "causal-tl" else sk - sq
    return j <= i + off


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--kv-heads", type=int, default=0)
    ap.add_argument("--sq", type=int, default=12)
    ap.add_argument("--sk", type=int, default=8)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--mask", default="causal-br", choices=["none", "causal-tl", "causal-br"])
    ap.add_argument("--dtype", default="fp32", choices=list(DTYPES))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = DTYPES[a.dtype]
    hkv = a.kv_heads or a.heads
    g = torch.Generator().manual_seed(a.seed)
    # [B, S, H, D] values, rounded to the compute dtype first so the files hold exactly what the kernel reads.
    def rand(*shape):
        return (torch.rand(*shape, generator=g) * 2 - 1).to(dtype).float()
    q, k, v = rand(a.batch, a.sq, a.heads, a.d), rand(a.batch, a.sk, hkv, a.d), rand(a.batch, a.sk, hkv, a.d)
    do = rand(a.batch, a.sq, a.heads, a.d)
    mask = mask_of(a.mask, a.sq, a.sk, device)
    out = Path(a.out)
    for name, backend in BACKENDS.items():
        dst = out / name
        shutil.rmtree(dst, ignore_errors=True)
        try:
            qt, kt, vt = (x.to(device, dtype).transpose(1, 2).requires_grad_() for x in (q, k, v))
            with sdpa_kernel([backend]):
                o = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=hkv != a.heads)
                o.backward(do.to(device, dtype).transpose(1, 2))
        except RuntimeError as e:  # backend not available for this device, dtype, mask or shape
            print(f"{name}: not available ({str(e).splitlines()[0]})")
            continue
        dst.mkdir(parents=True)
        tensors = {"q": q, "k": k, "v": v, "do": do, "o": o.detach().transpose(1, 2),
                   "dq": qt.grad.transpose(1, 2), "dk": kt.grad.transpose(1, 2), "dv": vt.grad.transpose(1, 2)}
        for n, t in tensors.items():
            np.save(dst / f"{n}.npy", np.ascontiguousarray(t.float().cpu().numpy()))
        (dst / "case.json").write_text(json.dumps({"layout": "bshd", "mask": a.mask, "compute_dtype": a.dtype}))
        print(f"{name}: wrote {dst}")


if __name__ == "__main__":
    main()
