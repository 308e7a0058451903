"""JAX's Pallas GPU attention ops as attn-fuzz kernels: attention.mha (forward, backward) and decode_attention.gqa.

    attn-fuzz --adapter 'python3 -m attnfuzz.adapters.pallas_attention' --kernel pallas-mha --max-time 300
    attn-check --sq 3 --sk 512 --heads 8 --kv-heads 2 --mask causal-br --adapter 'python3 -m attnfuzz.adapters.pallas_attention --ops gqa'

pallas-mha        jax.experimental.pallas.ops.gpu.attention.mha(q, k, v, None, sm_scale, causal, block_sizes):
                  [B, S, H, D], Hq = Hkv, D = Dv, Sk > 0, mask none or causal (top-left); tunables block_q, block_k (default
                  128: BlockSizes for the forward and both backward kernels); --backward: its custom VJP (Triton)
pallas-gqa-decode jax.experimental.pallas.ops.gpu.decode_attention.gqa(q, k, v, start_idx, kv_seq_len, sm_scale,
                  k_splits, block_k): every query row is a decode step of its own (row i of sequence b is gqa's batch
                  entry b * Sq + i, with a copy of K / V), its visible keys, an interval for every mask kind, as that
                  entry's start_idx / kv_seq_len; K / V zero-padded to a cache capacity gqa takes (k_splits splits of
                  a power of two >= 16 keys), the padding masked by kv_seq_len; GQA, D = Dv; tunables k_splits (kv_splits role: the split-kv
                  detector varies it) and block_k; forward only (no VJP)
What the ops refuse (their ValueError / assert checks, Triton's power-of-2 sizes) is `unsupported` with their words,
found by one probe on zeros per shape; every kernel declares recompiles_per_shape. --interpret runs Pallas's
interpreter (no GPU needed).
"""

import argparse
import sys

import numpy as np

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


def key_ranges(p):
    """int32 start_idx, kv_seq_len [B * Sq]: the visible keys [first, last) of query row i, for every (b, i)."""
    ranges = np.array([p.key_range(i) for i in range(p.seq_q)], np.int32).reshape(p.seq_q, 2)
    return np.tile(ranges[:, 0], p.batch), np.tile(ranges[:, 1], p.batch)


def capacity(sk, k_splits):
    """The KV length gqa takes for sk keys: k_splits splits of a power of two >= 16 keys each (a KV cache's capacity)."""
    per = max(16, -(-sk // k_splits))
    return k_splits * (1 << (per - 1).bit_length())


def gqa_lines(p, interpret, arrays):
    """gqa decodes one query per batch entry: query row i of sequence b is batch entry b * Sq + i, against its own
    copy of K / V, zero-padded to a capacity gqa takes, and its visible keys [start_idx, kv_seq_len) (omitted when
    every row sees every key and nothing is padded)."""
    splits = p.tunables.get("k_splits", 16)
    pad = capacity(p.seq_k, splits) - p.seq_k
    start, end = key_ranges(p)
    rng = ""
    if pad or (start != 0).any() or (end != p.seq_k).any():
        arrays.update(start_idx=start, kv_seq_len=end)
        rng = "start_idx=jnp.asarray(x['start_idx']), kv_seq_len=jnp.asarray(x['kv_seq_len']), "
    tune = f"k_splits={splits}, block_k={p.tunables.get('block_k', 128)}"
    B, S, H, D = p.batch, p.seq_q, p.heads_q, p.head_dim
    return ["def attn(Q, K, V):  # the call attnfuzz.adapters.pallas_attention makes: row i of sequence b decoded as",
            f"    K, V = (jnp.pad(jnp.repeat(X, {S}, axis=0), ((0, 0), (0, {pad}), (0, 0), (0, 0))) for X in (K, V))"
            "  # entry b * Sq + i; a KV cache of capacity gqa takes",
            f"    o = gqa(Q.reshape({B * S}, {H}, {D}), K, V, {rng}sm_scale={p.scale!r}, {tune}"
            f"{', interpret=True' if interpret else ''})",
            f"    return o.reshape({B}, {S}, {H}, {D})"]


IMPORTS = {"mha": ["from jax.experimental.pallas.ops.gpu.attention import BlockSizes, mha"],
           "gqa": ["from jax.experimental.pallas.ops.gpu.decode_attention import gqa"]}
LINES = {"mha": lambda p, interpret, arrays: mha_lines(p, interpret), "gqa": gqa_lines}


def make(op, dtypes, backward, interpret, version):
    def library_call(p, pass_name):
        """repro.Call: the op's call on p, as source the adapter runs and a bug-report script prints."""
        arrays = {}
        lines = LINES[op](p, interpret, arrays)
        return J.repro_call(p.dtype, IMPORTS[op], lines, arrays, pass_name)

    call, grad = repro.forward(library_call), repro.backward(library_call)
    mha = op == "mha"
    return Kernel("pallas-mha" if mha else "pallas-gqa-decode", C.cuda_guarded(call), family="jax-pallas",
                  description=f"jax {version} Pallas GPU {'attention.mha' if mha else 'decode_attention.gqa'}"
                              f"{' (interpreted)' if interpret else ''}",
                  dtypes=dtypes, masks=["none", "causal-tl"] if mha else list(ALL_MASKS), gqa=not mha, dv_ne_d=False,
                  empty_keys=not mha,  # mha's block_k = min(block_k, Sk) = 0 divides by zero
                  supports=C.probed_supports(f"pallas {op}", call, grad, J.refusal),
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
