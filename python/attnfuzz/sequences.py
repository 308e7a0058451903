"""Sequence layouts on the adapter side (adapters/PROTOCOL.md "Sequence layouts"; docs/sequence-layouts.md): each
sequence of a packed or KV-cache problem as a dense problem of its own, and the arrays a cu_seqlens library takes.

    o = per_sequence(q, k, v, p, dense_attention)        # any dense kernel fn(q, k, v, p) -> O or (O, LSE)
    a = varlen_args(p, takes_seqused=True)               # a cu_seqlens library's arrays, malformed ones as sent

q is [total_q, Hq, D] when p.q_layout == "packed" (token t of sequence b at row cu_seqlens_q[b] + t), else
[B, Sq, Hq, D]; k, v alike with cu_seqlens_k; sequence b uses its first seqused_k[b] keys when the problem has them.
The mask aligns per sequence: bottom-right offset Sk_b - Sq_b.
"""

import numpy as np

from attnfuzz.adapter import Problem

LAYOUT_KEYS = ("q_layout", "kv_layout", "total_q", "total_k", "kv_capacity")


def has_sequences(p):
    return p.q_layout != "dense" or p.kv_layout != "dense" or p.seqused_k is not None


METADATA = ("cu_seqlens_q", "cu_seqlens_k", "seqused_k")


def check_metadata(p, names=METADATA):
    """Raises ValueError naming the first malformed array of `names` (cu_seqlens not starting at 0, decreasing or not
    ending at the packed total; seqused_k negative or past its sequence's keys): the helpers refuse what attn-fuzz's
    malformed cases send (docs/semantics.md "Malformed metadata") instead of slicing garbage. A library that takes
    the arrays itself gets them as sent instead (varlen_args), so that its own checks are what the case tests."""
    for name, packed, total in (("cu_seqlens_q", p.q_layout == "packed", p.total_q),
                                ("cu_seqlens_k", p.kv_layout == "packed", p.total_k)):
        if not packed or name not in names:
            continue
        cu = np.asarray(getattr(p, name), np.int64)
        bad = np.flatnonzero(np.diff(cu) < 0)
        if cu[0] != 0 or bad.size or cu[-1] != total:
            why = (f"{name}[0] = {cu[0]}" if cu[0] != 0 else
                   f"{name}[{bad[0] + 1}] = {cu[bad[0] + 1]} < {name}[{bad[0]}] = {cu[bad[0]]}" if bad.size else
                   f"{name}[{len(cu) - 1}] = {cu[-1]} != total {total}")
            raise ValueError(f"malformed sequence metadata: {why}")
    if p.seqused_k is not None and "seqused_k" in names:
        used = np.asarray(p.seqused_k, np.int64)
        cap = np.diff(np.asarray(p.cu_seqlens_k, np.int64)) if p.kv_layout == "packed" else np.full(p.batch, p.seq_k)
        bad = np.flatnonzero((used < 0) | (used > cap))
        if bad.size:
            b = bad[0]
            raise ValueError(f"malformed sequence metadata: seqused_k[{b}] = {used[b]} outside [0, {cap[b]}]")


def lengths(p, trust=False):
    """(Sq_b, Sk_b) int64 [B] each: query rows and used keys of every sequence, from the arrays as sent
    (check_metadata first, unless trust: then a malformed array's lengths come out as they are, even negative)."""
    if not trust:
        check_metadata(p)
    B = p.batch
    sq = np.diff(p.cu_seqlens_q).astype(np.int64) if p.q_layout == "packed" else np.full(B, p.seq_q, np.int64)
    sk = np.diff(p.cu_seqlens_k).astype(np.int64) if p.kv_layout == "packed" else np.full(B, p.seq_k, np.int64)
    if p.seqused_k is not None:
        sk = np.minimum(sk, np.asarray(p.seqused_k, np.int64))
    return sq, sk


def _rows(x, start, n):
    """Rows [start, start + n) of x, clipped to x (a trusted malformed array may point outside it)."""
    start = max(int(start), 0)
    return x[start:start + max(int(n), 0)]


def sub_problem(p, sq, sk):
    """The dense one-sequence problem of a sequence with sq queries and sk keys (the mask aligned to it), with p's
    sinks and ALiBi slopes (per head: the same for every sequence; ALiBi's distance uses this sequence's offset)."""
    d = {k: v for k, v in p.raw.items() if k not in LAYOUT_KEYS}
    d.update(batch=1, seq_q=int(sq), seq_k=int(sk),
             diagonal_offset=int(sk - sq) if p.mask_align == "bottom-right" else 0)
    sub = Problem(d)
    sub.sinks, sub.alibi_slopes = getattr(p, "sinks", None), getattr(p, "alibi_slopes", None)
    return sub


def dense_view(p):
    """The dense batch of p's largest lengths (p itself when dense): what a library is probed on before a layout case."""
    if p.q_layout == "dense" and p.kv_layout == "dense" and "kv_capacity" not in p.raw:
        return p
    return Problem({k: v for k, v in p.raw.items() if k not in LAYOUT_KEYS})


def split(q, k, v, p, trust=False):
    """Per sequence b: (q_b [1, Sq_b, Hq, D], k_b [1, Sk_b, Hkv, D], v_b, its dense problem). trust: the arrays are
    not checked (lengths(trust=True)); each sequence takes the rows they name, clipped to the tensors."""
    sq, sk = lengths(p, trust)
    out = []
    for b in range(p.batch):
        qb = _rows(q, p.cu_seqlens_q[b], sq[b]) if p.q_layout == "packed" else q[b]
        start = int(p.cu_seqlens_k[b]) if p.kv_layout == "packed" else 0
        kb, vb = (_rows(x, start, sk[b]) if p.kv_layout == "packed" else _rows(x[b], 0, sk[b]) for x in (k, v))
        out.append((qb[None], kb[None], vb[None], sub_problem(p, len(qb), len(kb))))
    return out


def per_sequence(q, k, v, p, fn, trust=False):
    """A dense kernel fn(q, k, v, p) -> O [1, Sq, Hq, Dv] (float32 values) or (O, LSE [1, Hq, Sq]) run on every
    sequence: O in q's layout (float32) and, when fn returns one, LSE [B, Hq, max Sq] (rows past a sequence 0).
    trust: the metadata as sent, unchecked (split); a kernel that trusts it (numpy_ref --bug trusts-metadata)."""
    rows = p.total_q if p.q_layout == "packed" else None
    o = np.zeros((rows, p.heads_q, p.head_dim_v) if rows is not None else
                 (p.batch, p.seq_q, p.heads_q, p.head_dim_v), np.float32)
    lse, has_lse = np.zeros((p.batch, p.heads_q, p.seq_q), np.float32), False
    for b, (qb, kb, vb, sub) in enumerate(split(q, k, v, p, trust)):
        n = sub.seq_q
        if n == 0:
            continue
        r = fn(qb, kb, vb, sub)
        ob = np.asarray(r[0] if isinstance(r, tuple) else r, np.float32)[0]
        if isinstance(r, tuple) and len(r) > 1:
            m = min(n, p.seq_q)
            lse[b, :, :m], has_lse = np.asarray(r[1])[0][:, :m], True
        if rows is not None:
            start = max(int(p.cu_seqlens_q[b]), 0)
            o[start:start + n] = ob
        else:
            o[b] = ob
    return (o, lse) if has_lse else o


def varlen_args(p, takes_seqused):
    """The metadata a cu_seqlens library (FlashAttention's varlen) is called with for p, as attn-fuzz sent it:
    {"cu_seq_q", "cu_seq_k": int32 [B + 1], "max_q", "max_k": the longest sequence those arrays name, and, for a KV
    cache, "seqused_k" int32 [B] (takes_seqused) or "k_rows" (int64 rows of k and v to take)}. q, k and v go to the
    library as rows, x.reshape(-1, H, D) (a dense side: B sequences of equal length, cu = arange * S), k and v then
    [k_rows] when present. A packed side's cu_seqlens and a KV cache's seqused_k (when the library takes it) go as they
    came, so a malformed array (docs/semantics.md "Malformed metadata") reaches the library itself and its own checks
    are what the case tests. A library without seqused_k gets the used rows packed instead (k_rows, cu_seq_k their
    prefix sums), after check_metadata refused a malformed cu_seqlens_k / seqused_k by name: that translation is the
    adapter's, not the library's."""
    B = p.batch
    even = lambda S: np.arange(B + 1, dtype=np.int32) * np.int32(S)
    out = {"cu_seq_q": np.array(p.cu_seqlens_q, np.int32) if p.q_layout == "packed" else even(p.seq_q),  # copies
           "cu_seq_k": np.array(p.cu_seqlens_k, np.int32) if p.kv_layout == "packed" else even(p.seq_k)}
    if p.seqused_k is not None and takes_seqused:
        out["seqused_k"] = np.array(p.seqused_k, np.int32)
    elif p.seqused_k is not None:
        check_metadata(p, ("cu_seqlens_k", "seqused_k"))
        used, starts = np.asarray(p.seqused_k, np.int64), out["cu_seq_k"][:-1].astype(np.int64)
        out["k_rows"] = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, used)] + [np.zeros(0, np.int64)])
        out["cu_seq_k"] = np.concatenate([[0], np.cumsum(used)]).astype(np.int32)
    longest = lambda cu: max(int(np.max(np.diff(cu.astype(np.int64)), initial=0)), 0)
    out["max_q"], out["max_k"] = longest(out["cu_seq_q"]), longest(out["cu_seq_k"])
    return out
