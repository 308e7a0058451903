"""PyTorch's torch.nn.attention.varlen.varlen_attn as an attn-fuzz kernel, on the sequence layouts it is made for.

    attn-check --seq-layout varlen --seqlens-q 3,0,17 --seqlens-k 5,1,40 --mask causal-br --heads 4 --kv-heads 2 \
        --dtype bf16 --adapter 'python3 -m attnfuzz.adapters.torch_varlen'
    attn-fuzz --dtype f16 --adapter 'python3 -m attnfuzz.adapters.torch_varlen' --max-time 300

Packed q and K/V (varlen, varlen-q, varlen-k) and the KV cache (its used keys) are packed over their used rows with
int32 cu_seqlens (attnfuzz/sequences.py) and go to one varlen_attn(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, scale=,
window_size=) call; a dense batch is B sequences of equal length. Masks: none, causal and windows, bottom-right per
sequence (FlashAttention's alignment; window_size=(left, right), -1 unbounded, causal (-1, 0)); where the installed
torch's varlen_attn takes is_causal instead of window_size, windows are refused. f16 / bf16 (a flash kernel), GQA,
D = Dv. --backward declares the backward of dense batches (torch.autograd through the same call; the tool checks
backward on dense batches only). Refusals (its argument checks, FlashAttention's limits) are `unsupported`, found by
one probe on zeros per shape.
"""

import argparse
import inspect

import numpy as np

from attnfuzz import sequences
from attnfuzz.adapter import Kernel, serve
from attnfuzz.adapters import _common as C

MASKS = ["none", "causal-br", "window-br"]


def window(p):
    """window_size of a bottom-right problem: (left, right), -1 unbounded (FlashAttention's convention)."""
    return (p.window_left, p.window_right) if p.mask_kind != "none" else (-1, -1)


def keywords(p, takes_window):
    """varlen_attn's keyword arguments for p: scale and the mask (window_size, or is_causal in a torch without it)."""
    kw = {"scale": p.scale}
    if takes_window:
        kw["window_size"] = window(p)
    elif p.mask_kind == "window":
        raise ValueError("this torch's varlen_attn has is_causal, no window_size: windows are unsupported")
    elif p.mask_kind == "causal":
        kw["is_causal"] = True
    return kw


def make(device, dtypes, backward):
    import torch
    from torch.nn.attention.varlen import varlen_attn
    from attnfuzz.adapters import _torch_common as T
    takes_window = "window_size" in inspect.signature(varlen_attn).parameters

    def packed(Q, K, V, cu_q, cu_k, max_q, max_k, p):
        """varlen_attn on packed torch [total, H, D] rows; O [total_q, Hq, Dv]."""
        return varlen_attn(Q, K, V, cu_q, cu_k, int(max_q), int(max_k), **keywords(p, takes_window))

    def dense(Qs, Ks, Vs, p):
        """torch [B, S, H, D] (autograd-able) as B equal sequences -> O [B, Sq, Hq, Dv]."""
        B, Sq, Sk = p.batch, p.seq_q, p.seq_k
        cu = lambda S: torch.arange(B + 1, dtype=torch.int32, device=device) * S
        rows = lambda X, S: X.reshape(B * S, X.shape[2], X.shape[3])
        o = packed(rows(Qs, Sq), rows(Ks, Sk), rows(Vs, Sk), cu(Sq), cu(Sk), Sq, Sk, p)
        return o.reshape(B, Sq, p.heads_q, p.head_dim_v)

    def call(q, k, v, p):
        if not sequences.has_sequences(p):
            return T.from_torch(dense(*(T.to_torch(x, device, p.dtype) for x in (q, k, v)), p))
        qp, kp, vp, cu_q, cu_k = sequences.pack(q, k, v, p)
        to = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)
        lens = lambda cu: int(np.max(np.diff(cu), initial=0))
        o = packed(*(T.to_torch(x, device, p.dtype) for x in (qp, kp, vp)), to(cu_q), to(cu_k), lens(cu_q),
                   lens(cu_k), p)
        return sequences.unpack_o(T.from_torch(o), p)

    grad = T.torch_backward(dense, device)
    refusal = lambda e: str(e).splitlines()[0][:200] if isinstance(e, ValueError) or T.is_unsupported(e) else None
    probe = C.probed_supports("varlen_attn", call, grad, refusal)
    return Kernel("torch-varlen-attn", T.cuda_guarded(call), family="torch-varlen",
                  description=f"torch {torch.__version__} torch.nn.attention.varlen.varlen_attn on {device}",
                  dtypes=dtypes, masks=MASKS, dv_ne_d=False, compute_model="fused",
                  features=("q-packed", "kv-packed", "seqused-k"),
                  supports=lambda p: probe(sequences.dense_view(p)),  # a layout's shape, probed as a dense batch
                  backward=T.cuda_guarded(grad) if backward else None)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtypes", default="f16,bf16", help="declared dtypes, comma-separated: f16,bf16 (flash's)")
    ap.add_argument("--backward", action="store_true", help="also declare the backward pass (dense batches)")
    a = ap.parse_args(argv)
    dtypes = C.parse_list(ap, a.dtypes, ("f32", "f16", "bf16"), "dtype")
    serve([make(a.device, dtypes, a.backward)], name="torch_varlen")


if __name__ == "__main__":
    main()
