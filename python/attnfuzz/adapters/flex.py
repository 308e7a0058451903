"""PyTorch FlexAttention as an attn-fuzz kernel: masks through mask_mod (causal, both alignments, windows); the
custom masks (mask-dense, mask-bits, block-sparse) through a mask_mod over their visibility and, for a block mask,
BlockMask.from_kv_blocks (empty blocks left out, full blocks as flex full blocks, partial ones through mask_mod);
softcap, ALiBi and bias through score_mod; sinks from flex's LSE (O' = O exp(LSE - LSE'), LSE' = logaddexp(LSE,
sink)), so their gradients come through autograd too.

    attn-fuzz --adapter 'python3 -m attnfuzz.adapters.flex' --timeout 120 --max-time 300

--no-compile runs flex_attention eagerly (a slow reference path); compiled, every new shape compiles
(seconds), hence the larger --timeout, and the kernel declares recompiles_per_shape: attn-fuzz then spends most
inputs on shapes already compiled (fuzz/README.md "Compile-aware fuzzing"). LSE comes from return_lse=True. The kernel declares the dtypes of
--dtypes (default f32,f16,bf16) and runs each case in its dtype; --backward also declares the backward pass
(torch.autograd through flex_attention).
"""

import argparse

import numpy as np
import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from attnfuzz.adapter import MASK_VARIANTS, SCORE_VARIANTS, Kernel, serve
from attnfuzz.adapters import _torch_common as T


def _ordered(sel):
    """(num_blocks int32 [B, H, nQ], indices int32 [B, H, nQ, nK]) of a bool block matrix, the True ones first."""
    order = np.argsort(~sel, axis=-1, kind="stable").astype(np.int32)
    return torch.from_numpy(sel.sum(-1).astype(np.int32)), torch.from_numpy(np.ascontiguousarray(order))


def custom_block_mask(p, device):
    """A BlockMask for a problem with custom masks (docs/semantics.md "Custom masks"): mask_mod reads the visibility
    [B, Hq, Sq, Sk] (the interval AND the custom / block masks). Without a block mask: create_block_mask over it.
    With one: its empty blocks (0) are left out; a full block (1) is a flex full block (mask_mod skipped) where the
    interval shows every key of it, else partial; a partial block (2) is partial (mask_mod applies)."""
    vis = torch.from_numpy(np.ascontiguousarray(p.visible_all())).to(device)

    def mask_mod(b, h, q_idx, kv_idx):
        return vis[b, h, q_idx, kv_idx]

    if p.block_mask is None:
        return create_block_mask(mask_mod, B=p.batch, H=p.heads_q, Q_LEN=p.seq_q, KV_LEN=p.seq_k, device=device)
    bq, bk = p.block_q, p.block_k
    nq, nk = -(-p.seq_q // bq), -(-p.seq_k // bk)
    blocks = np.broadcast_to(p.block_mask, (p.batch, p.heads_q, nq, nk))
    inside = np.ones((nq, nk), dtype=bool)  # the interval shows every in-bounds key of the block
    iv = p.visible()
    for a in range(nq):
        for c in range(nk):
            inside[a, c] = iv[a * bq:(a + 1) * bq, c * bk:(c + 1) * bk].all()
    full = (blocks == 1) & inside
    partial = (blocks != 0) & ~full
    kv_n, kv_i = _ordered(partial)
    f_n, f_i = _ordered(full)
    return BlockMask.from_kv_blocks(kv_n.to(device), kv_i.to(device), f_n.to(device), f_i.to(device),
                                    BLOCK_SIZE=(bq, bk), mask_mod=mask_mod, seq_lengths=(p.seq_q, p.seq_k))


def score_mod(p, device):
    """flex's score_mod for the softcap, ALiBi and bias (docs/semantics.md "Variants": softcap first, then the
    additive terms), or None without them. The additive term is one captured [B, Hq, Sq, Sk] tensor (a broadcast
    view of bias - slope |j - (i + off)|), differentiable in the bias."""
    cap = p.softcap
    add = T.score_add(p, device)
    if add is not None:
        add = add.expand(p.batch, p.heads_q, p.seq_q, p.seq_k)
    if not cap and add is None:
        return None

    def mod(score, b, h, q_idx, kv_idx):
        if cap:
            score = cap * torch.tanh(score / cap)
        if add is not None:
            score = score + add[b, h, q_idx, kv_idx]
        return score

    return mod


def uniform_score_mod(p, device):
    """The compiled path's score_mod: one traced function for every case of a shape. Dynamo guards on a captured
    Python float and on the branches a score_mod takes, so a new scale or softcap, or a variant switched on or off
    (the ignored-parameter probe's relaunch), would compile flex again; here each is a captured tensor: the scale
    (flex is called with scale 1: q.k * 1 is exact), then the softcap (0 = none: the where keeps the score and
    divides by 1, so no gradient is NaN), then the additive term (zeros without bias and ALiBi). The same float
    operations in the same order as score_mod with flex's own scale."""
    scale, cap = (torch.tensor(x, dtype=torch.float32, device=device) for x in (p.scale, p.softcap))
    add = T.score_add(p, device)
    if add is None:
        add = torch.zeros(1, 1, p.seq_q, p.seq_k, device=device)
    add = add.expand(p.batch, p.heads_q, p.seq_q, p.seq_k).contiguous()  # one stride for bias and ALiBi alike

    def mod(score, b, h, q_idx, kv_idx):
        s = score * scale
        capped = cap * torch.tanh(s / torch.where(cap > 0, cap, 1.0))
        return torch.where(cap > 0, capped, s) + add[b, h, q_idx, kv_idx]

    return mod


def make(device, dtypes, compiled, backward):
    torch._dynamo.config.cache_size_limit = 256  # fuzzing visits many shapes
    fa = torch.compile(flex_attention) if compiled else flex_attention
    refused = {}

    def flex(Qs, Ks, Vs, p):
        """torch [B, S, H, D] in, (O [B, Sq, Hq, Dv], LSE [B, Hq, Sq]) out (autograd-able)."""
        Q, K, V = (x.transpose(1, 2) for x in (Qs, Ks, Vs))
        # Captured tensors, not Python ints: one compiled mask_mod serves every window.
        off, left, right = (torch.tensor(x, device=device) for x in
                            (p.diagonal_offset, p.window_left, p.window_right))

        def mask_mod(b, h, q_idx, kv_idx):
            rel = kv_idx - (q_idx + off)
            return ((left < 0) | (rel >= -left)) & ((right < 0) | (rel <= right))

        bm = None
        if any(v in MASK_VARIANTS for v in p.variants):  # mask_mod reads the whole visibility; block-sparse: flex's own
            bm = custom_block_mask(p, device)
        elif p.mask_kind != "none" or compiled:  # compiled: 'none' too (every key visible), one traced mask_mod
            bm = create_block_mask(mask_mod, B=None, H=None, Q_LEN=p.seq_q, KV_LEN=p.seq_k, device=device)
        mod, scale = (uniform_score_mod(p, device), 1.0) if compiled else (score_mod(p, device), p.scale)
        o, lse = fa(Q, K, V, score_mod=mod, block_mask=bm, scale=scale,
                    enable_gqa=p.heads_q != p.heads_kv, return_lse=True)
        return T.with_sinks(o.transpose(1, 2), lse, p, device)  # sinks: from flex's own LSE

    def call(q, k, v, p):
        o, lse = flex(*(T.to_torch(x, device, p.dtype) for x in (q, k, v)), p)
        return T.from_torch(o), T.from_torch(lse)

    grad = T.torch_backward(flex, device)

    def supports(p):
        # flex refuses some shapes (head dims, lengths) by raising: probe each new shape once on zeros.
        key = (p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_k, p.head_dim, p.head_dim_v, p.mask, p.dtype,
               tuple(p.variants), p.pass_name)
        if key not in refused:
            try:
                T.probe_on_zeros(p, call, grad if backward and p.pass_name == "bwd" else None)
                refused[key] = None
            except Exception as e:
                T.fatal_cuda_error(e)
                refused[key] = f"flex_attention refuses it: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        return refused[key]

    # KV_LEN = 0 is not a flex configuration (empty_keys=False).
    return Kernel("flex" + ("" if compiled else "-eager"), T.cuda_guarded(call), family="torch-flex",
                  description=f"torch {torch.__version__} flex_attention ({'compiled' if compiled else 'eager'}) "
                              f"on {device}",
                  dtypes=dtypes, lse=True, empty_keys=False, supports=supports,
                  variants=SCORE_VARIANTS + MASK_VARIANTS,
                  # compiled: one fused Triton kernel (fp32 scores); eager: materialised scores in the dtype
                  compute_model="fused" if compiled else "unfused",
                  backward=T.cuda_guarded(grad) if backward else None,
                  # compiled: every new shape compiles (seconds); attn-fuzz keeps a pool of compiled shapes
                  recompiles_per_shape=compiled,
                  # compiled: the score variants enter uniform_score_mod as captured tensors, not code
                  data_variants=SCORE_VARIANTS if compiled else ())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtypes", default="f32,f16,bf16", help="declared dtypes, comma-separated: " + ",".join(T.DTYPES))
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--backward", action="store_true", help="also declare the backward pass (torch.autograd)")
    a = ap.parse_args(argv)
    dtypes = [d for d in a.dtypes.split(",") if d]
    for d in dtypes:
        if d not in T.DTYPES:
            ap.error(f"unknown dtype {d!r} (" + ",".join(T.DTYPES) + ")")
    torch.backends.cuda.matmul.allow_tf32 = False
    serve([make(a.device, dtypes, not a.no_compile, a.backward)], name="flex")


if __name__ == "__main__":
    main()
