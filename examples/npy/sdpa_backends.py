# sdpa_backends.py - runs torch.nn.functional.scaled_dot_product_attention on every available backend for a case
# emitted by `attn-check --npy-emit DIR` and saves each backend's outputs as NPY, ready for `attn-check --npy`.
#
# Example for users (not built or tested by attn-fuzz). Needs numpy and torch; a GPU for the flash /
# efficient / cudnn backends (the math backend also runs on the CPU).
#
#   attn-check --npy-emit case --compute-dtype fp16 --sq 100 --sk 130 --d 64 --mask causal-br \
#              --special nan@k:masked
#   python3 sdpa_backends.py case          # writes case-<backend>/ (a copy of case with o.npy per variant)
#   attn-check --npy case-flash            # one verdict per variant; exit 0 pass, 1 failure, 2 bad input
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def load(path, raw_bf16):
    a = np.load(path)
    if raw_bf16:  # 16-bit bfloat16 bit patterns -> float32 (exact)
        return torch.from_numpy((a.astype(np.uint32) << 16).view(np.float32))
    return torch.from_numpy(a.astype(np.float32))


def attn_mask(mask, sq, sk, device):
    """Boolean mask (True = visible) for attn-check's mask text, or None."""
    if mask == "none":
        return None
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    if mask.startswith("causal"):
        off = 0 if mask.endswith("-tl") else sk - sq
        return j <= i + off
    body, _, align = mask.partition(":")[2].partition("-")
    left, right = (float("inf") if x == "inf" else int(x) for x in body.split(","))
    off = 0 if align == "tl" else sk - sq
    rel = j - (i + off)
    return (rel >= -left) & (rel <= right)


def run_variant(src, dst, backend, device):
    meta = json.loads((src / "case.json").read_text())
    raw = meta.get("bf16_raw", False)
    dtype = DTYPES[meta.get("compute_dtype", "fp32")]
    q, k, v = (load(src / f"{n}.npy", raw).to(device=device, dtype=dtype) for n in "qkv")
    if meta.get("layout", "bshd") == "bshd":  # SDPA wants [B, H, S, D]
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    sq, sk = q.shape[2], k.shape[2]
    mask = attn_mask(meta["mask"], sq, sk, device)
    gqa = q.shape[1] != k.shape[1]
    with sdpa_kernel([BACKENDS[backend]]):
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=meta.get("scale"), enable_gqa=gqa)
    if meta.get("layout", "bshd") == "bshd":
        o = o.transpose(1, 2)
    o = o.float().cpu().numpy() if dtype != torch.float16 else o.cpu().numpy()  # fp16 stays float16
    np.save(dst / "o.npy", np.ascontiguousarray(o))


def main():
    case = Path(sys.argv[1])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    variants = [v["name"] for v in json.loads((case / "manifest.json").read_text())["variants"]]
    for backend in BACKENDS:
        out = Path(f"{case}-{backend}")
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(case, out)
        try:
            for name in variants:
                run_variant(case / name, out / name, backend, device)
        except RuntimeError as e:  # backend not available for this device, dtype or mask
            print(f"{backend}: not available ({str(e).splitlines()[0]})")
            shutil.rmtree(out, ignore_errors=True)
            continue
        print(f"{backend}: outputs in {out}/  ->  attn-check --npy {out}")


if __name__ == "__main__":
    main()
