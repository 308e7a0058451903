"""test_sequences.py - sequence layouts on the adapter side (python/attnfuzz/sequences.py, adapters/PROTOCOL.md
"Sequence layouts"): per-sequence splitting with the mask aligned per sequence, packing for cu_seqlens libraries, and
torch_varlen's argument translation (no torch needed)."""

import re

import numpy as np
import pytest

from attnfuzz import sequences
from attnfuzz.adapter import Problem
from attnfuzz.adapters.torch_varlen import keywords
from attnfuzz.reference import attention

SQ, SK = [3, 0, 5], [4, 1, 6]  # per sequence; the second has no query rows


def problem(q_layout="packed", kv_layout="packed", mask="causal-br", used=None):
    kind, left, right = {"none": ("none", -1, -1), "causal-br": ("causal", -1, 0),
                         "window-br": ("window", 2, 0)}[mask]
    d = {"batch": 3, "heads_q": 4, "heads_kv": 2, "seq_q": max(SQ), "seq_k": max(SK), "head_dim": 8,
         "head_dim_v": 8, "scale": 0.5, "dtype": "f32", "mask": mask, "mask_kind": kind, "mask_align": "bottom-right",
         "window_left": left, "window_right": right, "diagonal_offset": max(SK) - max(SQ), "q_layout": q_layout,
         "kv_layout": kv_layout, "total_q": sum(SQ) if q_layout == "packed" else 0,
         "total_k": sum(SK) if kv_layout == "packed" else 0, "kv_capacity": 0 if kv_layout == "packed" else max(SK)}
    cu = lambda n: np.concatenate([[0], np.cumsum(n)]).astype(np.int32)
    ts = {"cu_seqlens_q": cu(SQ) if q_layout == "packed" else None,
          "cu_seqlens_k": cu(SK) if kv_layout == "packed" else None,
          "seqused_k": None if used is None else np.array(used, np.int32)}
    return Problem.from_run(d, {k: v for k, v in ts.items() if v is not None})


def tensors(p, seed=3):
    rng = np.random.default_rng(seed)
    rows = lambda packed, total, s: (total,) if packed else (p.batch, s)
    u = lambda shape: rng.uniform(-1, 1, shape).astype(np.float32)
    q = u(rows(p.q_layout == "packed", p.total_q, p.seq_q) + (4, 8))
    kv = rows(p.kv_layout == "packed", p.total_k, p.seq_k) + (2, 8)
    return q, u(kv), u(kv)


@pytest.mark.parametrize("mask", ["none", "causal-br", "window-br"])
def test_each_sequence_is_its_own_dense_problem_with_the_mask_aligned_to_it(mask):
    p = problem(mask=mask)
    q, k, v = tensors(p)
    o, lse = sequences.per_sequence(q, k, v, p, attention)
    assert o.shape == (sum(SQ), 4, 8) and lse.shape == (3, 4, max(SQ))
    at = 0
    for b in range(3):  # each sequence by hand: its rows, its keys, its own bottom-right offset
        qb, kb, vb = q[at:at + SQ[b]][None], k[sum(SK[:b]):sum(SK[:b + 1])][None], v[sum(SK[:b]):sum(SK[:b + 1])][None]
        d = dict(p.raw, batch=1, seq_q=SQ[b], seq_k=SK[b], diagonal_offset=SK[b] - SQ[b])
        for key in sequences.LAYOUT_KEYS:
            d.pop(key)
        if SQ[b]:
            want_o, want_lse = attention(qb, kb, vb, Problem(d))
            np.testing.assert_array_equal(o[at:at + SQ[b]], want_o[0])
            np.testing.assert_array_equal(lse[b, :, :SQ[b]], want_lse[0])
        at += SQ[b]


def test_a_kv_cache_uses_only_its_used_keys():
    p = problem(q_layout="dense", kv_layout="dense", mask="none", used=[2, 1, 6])
    q, k, v = tensors(p)
    k2, v2 = k.copy(), v.copy()
    k2[0, 2:], v2[0, 2:] = np.nan, np.nan  # past sequence 0's used length: never read
    np.testing.assert_array_equal(sequences.per_sequence(q, k2, v2, p, attention)[0],
                                  sequences.per_sequence(q, k, v, p, attention)[0])
    assert sequences.lengths(p)[1].tolist() == [2, 1, 6]


def test_pack_and_unpack_round_trip_any_layout():
    p = problem(q_layout="dense", kv_layout="dense", mask="none", used=[4, 1, 6])
    q, k, v = tensors(p)
    qp, kp, vp, cu_q, cu_k = sequences.pack(q, k, v, p)
    assert qp.shape == (3 * max(SQ), 4, 8) and cu_q.tolist() == [0, 5, 10, 15] and cu_k.tolist() == [0, 4, 5, 11]
    np.testing.assert_array_equal(kp[4], k[1, 0])
    np.testing.assert_array_equal(sequences.unpack_o(qp, p), q)
    packed = problem()
    pq = tensors(packed)[0]
    assert sequences.unpack_o(pq, packed) is pq


def test_dense_view_is_the_largest_dense_batch():
    p = problem()
    d = sequences.dense_view(p)
    assert (d.q_layout, d.kv_layout, d.batch, d.seq_q, d.seq_k) == ("dense", "dense", 3, 5, 6)
    assert not sequences.has_sequences(d) and sequences.has_sequences(p)


def test_varlen_attn_gets_flash_windows_or_refuses_them_without_window_size():
    assert keywords(problem(mask="none"), True) == {"scale": 0.5, "window_size": (-1, -1)}
    assert keywords(problem(mask="causal-br"), True)["window_size"] == (-1, 0)
    assert keywords(problem(mask="window-br"), True)["window_size"] == (2, 0)
    assert keywords(problem(mask="causal-br"), False) == {"scale": 0.5, "is_causal": True}
    with pytest.raises(ValueError, match="windows are unsupported"):
        keywords(problem(mask="window-br"), False)


def test_malformed_metadata_is_refused_by_name_never_sliced():
    # attn-fuzz's malformed cases (docs/semantics.md "Malformed metadata") reach adapter kernels: the helpers refuse
    # them (an error reply, which the tool counts as a refusal) instead of computing on garbage rows; numpy_ref
    # accepted cu_seqlens_k past total_k before and was named accepted-malformed.
    sequences.lengths(problem(used=[4, 1, 6]))  # well formed: no error
    for name, i, value, words in (("cu_seqlens_k", 3, 12, "!= total"), ("cu_seqlens_q", 2, 1, "< cu_seqlens_q[1]"),
                                  ("cu_seqlens_q", 0, 1, "cu_seqlens_q[0] = 1")):
        p = problem()
        getattr(p, name)[i] = value
        with pytest.raises(ValueError, match=r"malformed sequence metadata: .*" + re.escape(words)):
            sequences.lengths(p)
    for used in ([4, 2, 6], [4, -1, 6]):
        with pytest.raises(ValueError, match=r"seqused_k\[1\]"):
            sequences.lengths(problem(used=used))
