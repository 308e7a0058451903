"""A Triton flash-attention forward kernel written for attn-fuzz after the algorithm of Triton's fused-attention
tutorial (Q tile x K/V tiles, online softmax with running max and rescaled accumulator), extended to the
attn-fuzz problem: any Sq / Sk / D / Dv, GQA, causal and windows in both alignments, LSE, empty rows.

    attn-fuzz --adapter 'python3 -m attnfuzz.adapters.triton_flash' --max-time 300

fp32 dots use input_precision="ieee" (--precision tf32 serves the TF32 variant, expected to fail the
fp32 bound: a calibration of the tool). f16 / bf16 cases (declared by --dtypes, default f32,f16,bf16) run as
the tutorial does: tensor-core dots with fp32 accumulation, P cast to the input dtype before P.V, O stored in
the input dtype, LSE fp32. Known limit of the algorithm, kept on purpose: a NaN / inf in V at
a key masked for some rows of a tile reaches those rows through 0 * NaN in the P.V product.
"""

import argparse

import torch
import triton
import triton.language as tl

from attnfuzz.adapter import Kernel, serve
from attnfuzz.adapters import _torch_common as T


@triton.jit
def _flash_fwd(Q, K, V, O, L, scale,
               sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sob, sos, soh,
               Hq, group, Sq, Sk, D, Dv, off, left, right,
               HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, IEEE: tl.constexpr, LOWP: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // Hq
    h = bh % Hq
    hk = h // group
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dq = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    cols0 = tl.arange(0, BLOCK_N)
    q = tl.load(Q + b * sqb + rows[:, None] * sqs + h * sqh + dq[None, :],
                mask=(rows[:, None] < Sq) & (dq[None, :] < D), other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    # Keys any row of this tile can see: [lo, hi).
    first_row = pid_m * BLOCK_M
    last_row = tl.minimum(first_row + BLOCK_M, Sq) - 1
    lo = 0
    hi = Sk
    if HAS_LEFT:
        lo = tl.maximum(first_row + off - left, 0)
    if HAS_RIGHT:
        hi = tl.minimum(last_row + off + right + 1, Sk)
    lo = (lo // BLOCK_N) * BLOCK_N
    for start in range(lo, hi, BLOCK_N):
        cols = start + cols0
        k = tl.load(K + b * skb + cols[:, None] * sks + hk * skh + dq[None, :],
                    mask=(cols[:, None] < Sk) & (dq[None, :] < D), other=0.0)
        if LOWP:
            s = tl.dot(q, tl.trans(k))
        elif IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k), input_precision="tf32")
        s = s * scale
        rel = cols[None, :] - (rows[:, None] + off)
        vis = (cols[None, :] < Sk) & (rows[:, None] >= 0)
        if HAS_LEFT:
            vis = vis & (rel >= -left)
        if HAS_RIGHT:
            vis = vis & (rel <= right)
        s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # an all-masked row so far: no exp(-inf - -inf)
        alpha = tl.exp(m_i - m_use)
        p = tl.exp(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + b * svb + cols[:, None] * svs + hk * svh + dv[None, :],
                    mask=(cols[:, None] < Sk) & (dv[None, :] < Dv), other=0.0)
        if LOWP:
            pv = tl.dot(p.to(v.dtype), v)  # P rounded to the input dtype, as the tutorial does
        elif IEEE:
            pv = tl.dot(p, v, input_precision="ieee")
        else:
            pv = tl.dot(p, v, input_precision="tf32")
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    empty = l_i == 0.0
    l_div = tl.where(empty, 1.0, l_i)
    o = acc / l_div[:, None]
    tl.store(O + b * sob + rows[:, None] * sos + h * soh + dv[None, :], o.to(O.dtype.element_ty),
             mask=(rows[:, None] < Sq) & (dv[None, :] < Dv))
    lse = tl.where(empty, float("-inf"), m_i + tl.log(l_div))
    tl.store(L + bh * Sq + rows, lse, mask=rows < Sq)


def flash_attention(q, k, v, p, ieee=True, device="cuda"):
    """q, k, v numpy [B, S, H, D] stored elements of p.dtype; returns O [B, Sq, Hq, Dv], LSE [B, Hq, Sq] (numpy
    float32; O holds values of p.dtype)."""
    B, Sq, Hq, D = q.shape
    Sk, Hkv, Dv = k.shape[1], k.shape[2], v.shape[3]
    Q, K, V = (T.to_torch(x, device, p.dtype) for x in (q, k, v))
    O = torch.zeros((B, Sq, Hq, Dv), dtype=T.DTYPES[p.dtype], device=device)
    L = torch.empty((B, Hq, Sq), dtype=torch.float32, device=device)
    BLOCK_D = max(16, triton.next_power_of_2(D))
    BLOCK_DV = max(16, triton.next_power_of_2(Dv))
    big = max(BLOCK_D, BLOCK_DV) > 64
    BLOCK_M, BLOCK_N = (32, 32) if big else (64, 64)
    grid = (triton.cdiv(Sq, BLOCK_M), B * Hq)
    _flash_fwd[grid](Q, K, V, O, L, p.scale,
                     Q.stride(0), Q.stride(1), Q.stride(2), K.stride(0), K.stride(1), K.stride(2),
                     V.stride(0), V.stride(1), V.stride(2), O.stride(0), O.stride(1), O.stride(2),
                     Hq, Hq // Hkv, Sq, Sk, D, Dv, p.diagonal_offset, max(p.window_left, 0),
                     max(p.window_right, 0),
                     HAS_LEFT=p.window_left >= 0, HAS_RIGHT=p.window_right >= 0, IEEE=ieee,
                     LOWP=p.dtype != "f32",
                     BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D, BLOCK_DV=BLOCK_DV,
                     num_warps=4)
    return T.from_torch(O), L.cpu().numpy()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--precision", default="ieee", choices=["ieee", "tf32"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtypes", default="f32,f16,bf16", help="declared dtypes, comma-separated: " + ",".join(T.DTYPES))
    a = ap.parse_args(argv)
    ieee = a.precision == "ieee"

    def run(q, k, v, p):
        try:
            return flash_attention(q, k, v, p, ieee=ieee, device=a.device)
        except RuntimeError as e:
            T.fatal_cuda_error(e)
            raise

    name = "triton-flash" + ("" if ieee else "-tf32")
    serve([Kernel(name, run, family="triton", description=f"Triton flash forward (tutorial algorithm), "
                  f"{a.precision} dots", lse=True, max_head_dim=256, max_head_dim_v=256,
                  dtypes=[d for d in a.dtypes.split(",") if d], compute_model="fused",
                  empty_keys=False)], name="triton_flash")


if __name__ == "__main__":
    main()
