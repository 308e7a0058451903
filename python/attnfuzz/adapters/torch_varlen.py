"""PyTorch's torch.nn.attention.varlen.varlen_attn as an attn-fuzz kernel, on the sequence layouts it is made for.

    attn-check --seq-layout varlen --seqlens-q 3,0,17 --seqlens-k 5,1,40 --mask causal-br --heads 4 --kv-heads 2 \
        --dtype bf16 --adapter 'python3 -m attnfuzz.adapters.torch_varlen'
    attn-fuzz --dtype f16 --adapter 'python3 -m attnfuzz.adapters.torch_varlen' --max-time 300

Every case goes to one varlen_attn(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, scale=, window_size=) call on rows
[total, H, D]: a packed side with the int32 cu_seqlens attn-fuzz sent, as they are (a malformed one, attn-check
--malformed, reaches varlen_attn itself: its exception is a refusal, a result is judged accepted-malformed), a dense
side as B sequences of equal length; a KV cache's seqused_k goes as it is where varlen_attn takes seqused_k, else its
used rows are packed (attnfuzz/sequences.py varlen_args). Masks: none, causal and windows, bottom-right per sequence
(FlashAttention's alignment; window_size=(left, right), -1 unbounded, causal (-1, 0)); where the installed torch's
varlen_attn takes is_causal instead of window_size, windows are refused. f16 / bf16 (a flash kernel), GQA, D = Dv.
--backward declares the backward of dense batches (torch.autograd through the same call; the tool checks backward on
dense batches only). Refusals (its argument checks, FlashAttention's limits) are `unsupported`, found by one probe on
zeros per shape. The call is source (library_call) the adapter runs and bug-report scripts print (attnfuzz/repro.py).
"""

import argparse
import inspect

from attnfuzz import repro, sequences
from attnfuzz.adapter import Kernel, serve
from attnfuzz.adapters import _common as C

MASKS = ["none", "causal-br", "window-br"]


def window(p):
    """window_size of a bottom-right problem: (left, right), -1 unbounded (FlashAttention's convention)."""
    return (p.window_left, p.window_right) if p.mask_kind != "none" else (-1, -1)


def keywords(p, takes):
    """varlen_attn's keyword arguments for p, given the names its signature takes: scale, the mask (window_size, or
    is_causal in a torch without it) and enable_gqa where it has one and Hq != Hkv."""
    kw = {"scale": p.scale}
    if "window_size" in takes:
        kw["window_size"] = window(p)
    elif p.mask_kind == "window":
        raise ValueError("this torch's varlen_attn has is_causal, no window_size: windows are unsupported")
    elif p.mask_kind == "causal":
        kw["is_causal"] = True
    if "enable_gqa" in takes and p.heads_q != p.heads_kv:
        kw["enable_gqa"] = True
    return kw


def call_lines(p, takes):
    """(source lines defining varlen(Qs, Ks, Vs) -> O in q's layout, the arrays it reads as x[name]): the
    varlen_attn call this adapter makes for p, with the metadata of sequences.varlen_args (as attn-fuzz sent it)."""
    a = sequences.varlen_args(p, "seqused_k" in takes)
    arrays = {n: a[n] for n in ("cu_seq_q", "cu_seq_k", "seqused_k", "k_rows") if n in a}
    kw = ", ".join(f"{n}={v!r}" for n, v in keywords(p, takes).items())
    kw += ", seqused_k=A['seqused_k']" if "seqused_k" in a else ""
    lines = ["def varlen(Qs, Ks, Vs):  # varlen_attn as attnfuzz.adapters.torch_varlen calls it: rows [total, H, D]",
             "    Q, K, V = (a.reshape(-1, *a.shape[-2:]) for a in (Qs, Ks, Vs))",
             "    A = {n: torch.from_numpy(x[n]).to(DEV) for n in " + repr(tuple(arrays)) + "}  # as attn-fuzz sent them"]
    if "k_rows" in a:
        lines.append("    K, V = K[A['k_rows']], V[A['k_rows']]  # the KV cache's used rows (no seqused_k here)")
    lines += [f"    o = varlen_attn(Q, K, V, A['cu_seq_q'], A['cu_seq_k'], {a['max_q']}, {a['max_k']}, {kw})",
              "    return o.reshape(Qs.shape[:-1] + o.shape[-1:])"]
    return lines, arrays


def make(device, dtypes, backward):
    import torch
    from torch.nn.attention.varlen import varlen_attn
    from attnfuzz.adapters import _torch_common as T
    takes = set(inspect.signature(varlen_attn).parameters)

    def library_call(p, pass_name):
        """repro.Call: the varlen_attn call on p (a backward: torch.autograd through it), as source the adapter runs
        and a bug-report script prints."""
        lines, arrays = call_lines(p, takes)
        return T.repro_call(p.dtype, device, ["from torch.nn.attention.varlen import varlen_attn"], lines, arrays,
                            pass_name, fn="varlen")

    call, grad = repro.forward(library_call), repro.backward(library_call)
    refusal = lambda e: str(e).splitlines()[0][:200] if isinstance(e, ValueError) or T.is_unsupported(e) else None
    probe = C.probed_supports("varlen_attn", call, grad, refusal)
    return Kernel("torch-varlen-attn", T.cuda_guarded(call), family="torch-varlen",
                  description=f"torch {torch.__version__} torch.nn.attention.varlen.varlen_attn on {device}",
                  dtypes=dtypes, masks=MASKS, dv_ne_d=False, compute_model="fused",
                  features=("q-packed", "kv-packed", "seqused-k"),
                  supports=lambda p: probe(sequences.dense_view(p)),  # a layout's shape, probed as a dense batch
                  backward=T.cuda_guarded(grad) if backward else None, repro=library_call)


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
