"""Sequence layouts on the adapter side (adapters/PROTOCOL.md "Sequence layouts"; docs/sequence-layouts.md): each
sequence of a packed or KV-cache problem as a dense problem of its own, and the packing a cu_seqlens library takes.

    o = per_sequence(q, k, v, p, dense_attention)        # any dense kernel fn(q, k, v, p) -> O or (O, LSE)
    qp, kp, vp, cu_q, cu_k = pack(q, k, v, p)            # varlen: packed rows of the used keys, int32 prefix sums
    o = unpack_o(o_packed, p)                            # [total_q, Hq, Dv] -> O in q's layout

q is [total_q, Hq, D] when p.q_layout == "packed" (token t of sequence b at row cu_seqlens_q[b] + t), else
[B, Sq, Hq, D]; k, v alike with cu_seqlens_k; sequence b uses its first seqused_k[b] keys when the problem has them.
The mask aligns per sequence: bottom-right offset Sk_b - Sq_b.
"""

import numpy as np

from attnfuzz.adapter import Problem

LAYOUT_KEYS = ("q_layout", "kv_layout", "total_q", "total_k", "kv_capacity")


def has_sequences(p):
    return p.q_layout != "dense" or p.kv_layout != "dense" or p.seqused_k is not None


def check_metadata(p):
    """Raises ValueError naming the first malformed array (cu_seqlens not starting at 0, decreasing or not ending at
    the packed total; seqused_k negative or past its sequence's keys): the helpers refuse what attn-fuzz's malformed
    cases send (docs/semantics.md "Malformed metadata") instead of slicing garbage. A library behind pack() sees only
    well-formed arrays, so its own metadata checks are not tested through this path."""
    for name, packed, total in (("cu_seqlens_q", p.q_layout == "packed", p.total_q),
                                ("cu_seqlens_k", p.kv_layout == "packed", p.total_k)):
        if not packed:
            continue
        cu = np.asarray(getattr(p, name), np.int64)
        bad = np.flatnonzero(np.diff(cu) < 0)
        if cu[0] != 0 or bad.size or cu[-1] != total:
            why = (f"{name}[0] = {cu[0]}" if cu[0] != 0 else
                   f"{name}[{bad[0] + 1}] = {cu[bad[0] + 1]} < {name}[{bad[0]}] = {cu[bad[0]]}" if bad.size else
                   f"{name}[{len(cu) - 1}] = {cu[-1]} != total {total}")
            raise ValueError(f"malformed sequence metadata: {why}")
    if p.seqused_k is not None:
        used = np.asarray(p.seqused_k, np.int64)
        cap = np.diff(np.asarray(p.cu_seqlens_k, np.int64)) if p.kv_layout == "packed" else np.full(p.batch, p.seq_k)
        bad = np.flatnonzero((used < 0) | (used > cap))
        if bad.size:
            b = bad[0]
            raise ValueError(f"malformed sequence metadata: seqused_k[{b}] = {used[b]} outside [0, {cap[b]}]")


def lengths(p):
    """(Sq_b, Sk_b) int64 [B] each: query rows and used keys of every sequence (check_metadata first)."""
    check_metadata(p)
    B = p.batch
    sq = np.diff(p.cu_seqlens_q).astype(np.int64) if p.q_layout == "packed" else np.full(B, p.seq_q, np.int64)
    sk = np.diff(p.cu_seqlens_k).astype(np.int64) if p.kv_layout == "packed" else np.full(B, p.seq_k, np.int64)
    if p.seqused_k is not None:
        sk = np.minimum(sk, np.asarray(p.seqused_k, np.int64))
    return sq, sk


def sub_problem(p, sq, sk):
    """The dense one-sequence problem of a sequence with sq queries and sk keys (the mask aligned to it)."""
    d = {k: v for k, v in p.raw.items() if k not in LAYOUT_KEYS}
    d.update(batch=1, seq_q=int(sq), seq_k=int(sk),
             diagonal_offset=int(sk - sq) if p.mask_align == "bottom-right" else 0)
    return Problem(d)


def dense_view(p):
    """The dense batch of p's largest lengths (p itself when dense): what a library is probed on before a layout case."""
    if p.q_layout == "dense" and p.kv_layout == "dense" and "kv_capacity" not in p.raw:
        return p
    return Problem({k: v for k, v in p.raw.items() if k not in LAYOUT_KEYS})


def split(q, k, v, p):
    """Per sequence b: (q_b [1, Sq_b, Hq, D], k_b [1, Sk_b, Hkv, D], v_b, its dense problem)."""
    sq, sk = lengths(p)
    out = []
    for b in range(p.batch):
        qb = q[p.cu_seqlens_q[b]:p.cu_seqlens_q[b + 1]] if p.q_layout == "packed" else q[b]
        start = int(p.cu_seqlens_k[b]) if p.kv_layout == "packed" else 0
        kb, vb = (x[start:start + sk[b]] if p.kv_layout == "packed" else x[b, :sk[b]] for x in (k, v))
        out.append((qb[None], kb[None], vb[None], sub_problem(p, sq[b], sk[b])))
    return out


def per_sequence(q, k, v, p, fn):
    """A dense kernel fn(q, k, v, p) -> O [1, Sq, Hq, Dv] (float32 values) or (O, LSE [1, Hq, Sq]) run on every
    sequence: O in q's layout (float32) and, when fn returns one, LSE [B, Hq, max Sq] (rows past a sequence 0)."""
    sq, _ = lengths(p)
    rows = p.total_q if p.q_layout == "packed" else None
    o = np.zeros((rows, p.heads_q, p.head_dim_v) if rows is not None else
                 (p.batch, p.seq_q, p.heads_q, p.head_dim_v), np.float32)
    lse, has_lse = np.zeros((p.batch, p.heads_q, p.seq_q), np.float32), False
    for b, (qb, kb, vb, sub) in enumerate(split(q, k, v, p)):
        if sq[b] == 0:
            continue
        r = fn(qb, kb, vb, sub)
        ob = r[0] if isinstance(r, tuple) else r
        if isinstance(r, tuple) and len(r) > 1:
            lse[b, :, :sq[b]], has_lse = np.asarray(r[1])[0], True
        if rows is not None:
            o[p.cu_seqlens_q[b]:p.cu_seqlens_q[b + 1]] = np.asarray(ob, np.float32)[0]
        else:
            o[b] = np.asarray(ob, np.float32)[0]
    return (o, lse) if has_lse else o


def pack(q, k, v, p):
    """(q, k, v packed over their used rows, cu_seqlens_q, cu_seqlens_k as int32 [B + 1]) from any layout."""
    parts = split(q, k, v, p)
    cat = lambda i, like: np.concatenate([x[i][0] for x in parts], 0) if parts else like[:0]
    sq, sk = lengths(p)
    cu = lambda n: np.concatenate([[0], np.cumsum(n)]).astype(np.int32)
    return cat(0, q), cat(1, k), cat(2, v), cu(sq), cu(sk)


def unpack_o(o, p):
    """A packed O [sum Sq_b, Hq, Dv] (pack()'s rows) in q's layout: itself when q is packed, else [B, Sq, Hq, Dv]."""
    if p.q_layout == "packed":
        return o
    return np.asarray(o).reshape(p.batch, p.seq_q, p.heads_q, -1)
