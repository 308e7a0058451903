"""JAX's Pallas GPU attention ops as attn-fuzz kernels: attention.mha (forward, backward) and decode_attention.gqa.

    attn-fuzz --adapter 'python3 -m attnfuzz.adapters.pallas_attention' --kernel pallas-mha --max-time 300
    attn-check --sq 1 --sk 512 --heads 8 --kv-heads 2 --adapter 'python3 -m attnfuzz.adapters.pallas_attention --ops gqa'

pallas-mha        jax.experimental.pallas.ops.gpu.attention.mha(q, k, v, None, sm_scale, causal, block_sizes):
                  [B, S, H, D], Hq = Hkv, D = Dv, Sk > 0, mask none or causal (top-left); tunables block_q, block_k (default
                  128: BlockSizes for the forward and both backward kernels); --backward: its custom VJP (Triton)
pallas-gqa-decode jax.experimental.pallas.ops.gpu.decode_attention.gqa(q[:, 0], k, v, start_idx, kv_seq_len, sm_scale,
                  k_splits, block_k): one query per sequence (Sq = 1), GQA, D = Dv; the one row's visible keys, an
                  interval for every mask kind, as start_idx / kv_seq_len; tunables k_splits (kv_splits role: the
                  split-kv detector varies it) and block_k; forward only (no VJP)
What the ops refuse (their ValueError / assert checks, Triton's power-of-2 sizes) is `unsupported` with their words,
found by one probe on zeros per shape; every kernel declares recompiles_per_shape. --interpret runs Pallas's
interpreter (no GPU needed).
"""

import argparse
import sys

from attnfuzz import repro
from attnfuzz.adapter import ALL_MASKS, Kernel, serve
from attnfuzz.adapters import _common as C
from attnfuzz.adapters import _jax_common as J

OPS = ("mha", "gqa")
BLOCKS = [128, 64, 32, 16]
MHA_TUNABLES = [{"name": "block_q", "values": BLOCKS, "description": "BlockSizes.block_q (and the backward's)"},
                {"name": "block_k", "values": BLOCKS, "description": "BlockSizes.block_k (and the backward's)"}]
GQA_TUNABLES = [{"name": "k_splits", "role": "kv_splits", "values": [16, 1, 2, 4, 8],
                 "description": "KV splits combined at the end"},
                {"name": "block_k", "values": [128, 16, 32, 64], "description": "keys per block"}]


def mha_lines(p, interpret):
    bq, bk = p.tunables.get("block_q", 128), p.tunables.get("block_k", 128)
    blocks = f"BlockSizes({bq}, {bk}, block_q_dkv={bq}, block_kv_dkv={bk}, block_q_dq={bq}, block_kv_dq={bk})"
    return ["def attn(Q, K, V):  # the call attnfuzz.adapters.pallas_attention makes, [B, S, H, D] in and out",
            f"    return mha(Q, K, V, None, sm_scale={p.scale!r}, causal={p.mask_kind == 'causal'}, "
            f"block_sizes={blocks}{', interpret=True' if interpret else ''})"]


def gqa_lines(p, interpret):
    first, last = p.key_range(0)  # the one query's visible keys: [first, last)
    rng = "" if (first, last) == (0, p.seq_k) else \
        f"start_idx=jnp.full(({p.batch},), {first}, jnp.int32), kv_seq_len=jnp.full(({p.batch},), {last}, jnp.int32), "
    tune = f"k_splits={p.tunables.get('k_splits', 16)}, block_k={p.tunables.get('block_k', 128)}"
    return ["def attn(Q, K, V):  # the call attnfuzz.adapters.pallas_attention makes: q [B, 1, Hq, D] as gqa's [B, Hq, D]",
            f"    return gqa(Q[:, 0], K, V, {rng}sm_scale={p.scale!r}, {tune}"
            f"{', interpret=True' if interpret else ''})[:, None]"]


IMPORTS = {"mha": ["from jax.experimental.pallas.ops.gpu.attention import BlockSizes, mha"],
           "gqa": ["from jax.experimental.pallas.ops.gpu.decode_attention import gqa"]}
LINES = {"mha": mha_lines, "gqa": gqa_lines}


def declared(op):
    """Limits the adapter declares before any call: gqa decodes one query per sequence."""
    if op == "gqa":
        return lambda p: None if p.seq_q == 1 else "pallas gqa decodes one query per sequence (Sq = 1)"
    return None


def make(op, dtypes, backward, interpret, version):
    def library_call(p, pass_name):
        """repro.Call: the op's call on p, as source the adapter runs and a bug-report script prints."""
        return J.repro_call(p.dtype, IMPORTS[op], LINES[op](p, interpret), {}, pass_name)

    call, grad = repro.forward(library_call), repro.backward(library_call)
    mha = op == "mha"
    return Kernel("pallas-mha" if mha else "pallas-gqa-decode", C.cuda_guarded(call), family="jax-pallas",
                  description=f"jax {version} Pallas GPU {'attention.mha' if mha else 'decode_attention.gqa'}"
                              f"{' (interpreted)' if interpret else ''}",
                  dtypes=dtypes, masks=["none", "causal-tl"] if mha else list(ALL_MASKS), gqa=not mha, dv_ne_d=False,
                  empty_keys=not mha,  # mha's block_k = min(block_k, Sk) = 0 divides by zero
                  supports=C.probed_supports(f"pallas {op}", call, grad, J.refusal, declared(op)),
                  compute_model="fused", tunables=MHA_TUNABLES if mha else GQA_TUNABLES,
                  backward=C.cuda_guarded(grad) if backward and mha else None, repro=library_call,
                  recompiles_per_shape=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", default=",".join(OPS), help="comma-separated: " + ",".join(OPS))
    ap.add_argument("--dtypes", default="f32,f16,bf16", help="declared dtypes, comma-separated: " + ",".join(J.DTYPES))
    ap.add_argument("--backward", action="store_true", help="also declare mha's backward pass (its custom VJP)")
    ap.add_argument("--interpret", action="store_true", help="run Pallas's interpreter instead of Triton (no GPU)")
    a = ap.parse_args(argv)
    ops = C.parse_list(ap, a.ops, OPS, "op")
    dtypes = C.parse_list(ap, a.dtypes, J.DTYPES, "dtype")
    jax = J.start_jax()
    if not a.interpret and not J.has_gpu(jax):
        print("pallas_attention: JAX sees no GPU; the Triton ops will refuse every case (try --interpret)",
              file=sys.stderr)
    serve([make(op, dtypes, a.backward, a.interpret, jax.__version__) for op in ops], name="pallas_attention")


if __name__ == "__main__":
    main()
