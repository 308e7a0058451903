"""test_sequences.py - sequence layouts on the adapter side (python/attnfuzz/sequences.py, adapters/PROTOCOL.md
"Sequence layouts"): per-sequence splitting with the mask aligned per sequence, the arrays a cu_seqlens library gets
(malformed ones as sent), and torch_varlen's argument translation (no torch needed)."""

import re

import numpy as np
import pytest

from attnfuzz import sequences
from attnfuzz.adapter import Problem
from attnfuzz.adapters.torch_varlen import call_lines, keywords
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


def test_dense_view_is_the_largest_dense_batch():
    p = problem()
    d = sequences.dense_view(p)
    assert (d.q_layout, d.kv_layout, d.batch, d.seq_q, d.seq_k) == ("dense", "dense", 3, 5, 6)
    assert not sequences.has_sequences(d) and sequences.has_sequences(p)


def test_varlen_attn_gets_flash_windows_or_refuses_them_without_window_size():
    w = {"window_size"}
    assert keywords(problem(mask="none"), w) == {"scale": 0.5, "window_size": (-1, -1)}
    assert keywords(problem(mask="causal-br"), w)["window_size"] == (-1, 0)
    assert keywords(problem(mask="window-br"), w)["window_size"] == (2, 0)
    assert keywords(problem(mask="causal-br"), set()) == {"scale": 0.5, "is_causal": True}
    assert keywords(problem(mask="none"), {"window_size", "enable_gqa"})["enable_gqa"] is True  # Hq 4, Hkv 2
    with pytest.raises(ValueError, match="windows are unsupported"):
        keywords(problem(mask="window-br"), set())


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


# Issue 30 item 1: a library that takes the metadata itself gets a malformed array as attn-fuzz sent it, so that its own
# checks are what a malformed case tests; only the adapter's own translation (no seqused_k) refuses by name.
MALFORMED = [("cu_seqlens_q", 2, 2, "packed", "packed", None),  # cu-q-decreasing@1: cu_q[2] = cu_q[1] - 1
             ("cu_seqlens_k", 3, 12, "packed", "packed", None),  # cu-k-past-total
             ("seqused_k", 1, -1, "dense", "dense", [2, 1, 6])]  # seqused-negative@1


@pytest.mark.parametrize("name,i,value,ql,kl,used", MALFORMED)
def test_varlen_args_carry_malformed_arrays_as_sent(name, i, value, ql, kl, used):
    p = problem(ql, kl, "none", used)
    getattr(p, name)[i] = value
    a = sequences.varlen_args(p, takes_seqused=True)
    sent = {"cu_seqlens_q": "cu_seq_q", "cu_seqlens_k": "cu_seq_k", "seqused_k": "seqused_k"}[name]
    assert a[sent].tolist() == getattr(p, name).tolist() and a[sent][i] == value
    if ql == "dense":  # a dense side: B sequences of equal length, nothing malformed about them
        assert a["cu_seq_q"].tolist() == [0, 5, 10, 15] and a["cu_seq_k"].tolist() == [0, 6, 12, 18]
    assert a["max_q"] >= 0 and a["max_k"] >= 0
    with pytest.raises(ValueError, match="malformed sequence metadata"):
        sequences.lengths(p)  # the per-sequence helpers still refuse it by name


def test_without_seqused_k_the_used_rows_are_packed_and_a_malformed_one_refused_by_name():
    p = problem("dense", "dense", "none", used=[2, 1, 6])
    a = sequences.varlen_args(p, takes_seqused=False)
    assert "seqused_k" not in a and a["cu_seq_k"].tolist() == [0, 2, 3, 9] and a["max_k"] == 6
    assert a["k_rows"].tolist() == [0, 1, 6, 12, 13, 14, 15, 16, 17]  # slots of [B, cap 6] as rows b * 6 + j
    p.seqused_k[1] = 7
    with pytest.raises(ValueError, match=r"seqused_k\[1\] = 7 outside \[0, 6\]"):
        sequences.varlen_args(p, takes_seqused=False)


class _FakeTensor:
    """What the varlen source touches of a torch tensor (from_numpy, to, reshape, indexing, shape)."""

    def __init__(self, a):
        self.a, self.shape = np.asarray(a), np.asarray(a).shape

    def to(self, *args):
        return self

    def reshape(self, *shape):
        return _FakeTensor(self.a.reshape(*shape))

    def __getitem__(self, i):
        return _FakeTensor(self.a[i.a if isinstance(i, _FakeTensor) else i])


@pytest.mark.parametrize("takes_seqused", [True, False])
def test_torch_varlen_hands_varlen_attn_the_arrays_as_sent(takes_seqused):
    seen = {}

    def varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, **kw):
        seen.update(q=q.shape, k=k.shape, cu_q=cu_q.a.tolist(), cu_k=cu_k.a.tolist(), max_q=max_q, max_k=max_k, **kw)
        return _FakeTensor(np.zeros(q.shape[:-1] + v.shape[-1:], np.float32))

    takes = {"window_size"} | ({"seqused_k"} if takes_seqused else set())
    for p in (problem(), problem("dense", "dense", "causal-br", used=[2, 1, 6])):
        if p.q_layout == "packed":
            p.cu_seqlens_q[2] = 2  # cu-q-decreasing@1: reaches varlen_attn as it is
        lines, arrays = call_lines(p, takes)
        torch = type("torch", (), {"from_numpy": staticmethod(_FakeTensor)})
        ns = {"np": np, "x": arrays, "DEV": "cuda", "torch": torch, "varlen_attn": varlen_attn}
        exec("\n".join(lines), ns)  # noqa: S102 - the adapter's own source
        q, k, v = (_FakeTensor(t) for t in tensors(p))
        o = ns["varlen"](q, k, v)
        assert o.shape == q.shape  # O in q's layout
        if p.q_layout == "packed":
            assert seen["cu_q"] == [0, 3, 2, 8] and seen["q"] == (8, 4, 8) and seen["k"] == (11, 2, 8)
            assert seen["cu_k"] == [0, 4, 5, 11] and (seen["max_q"], seen["max_k"]) == (6, 6)
        elif takes_seqused:  # the dense cache as rows [B * cap], its seqused_k as sent
            assert seen["cu_k"] == [0, 6, 12, 18] and seen["seqused_k"].a.tolist() == [2, 1, 6] and seen["k"] == (18, 2, 8)
        else:  # the used rows packed by the adapter
            assert seen["cu_k"] == [0, 2, 3, 9] and "seqused_k" not in seen and seen["k"] == (9, 2, 8)
        assert seen["window_size"] == (-1, 0 if p.mask_kind == "causal" else -1)
        seen.clear()


@pytest.mark.parametrize("name,i,value,ql,kl,used", MALFORMED)
def test_a_trusting_kernel_computes_on_malformed_arrays_without_raising(name, i, value, ql, kl, used):
    p = problem(ql, kl, "causal-br", used)
    q, k, v = tensors(p)
    good = sequences.per_sequence(q, k, v, p, attention)
    trusted = sequences.per_sequence(q, k, v, p, attention, trust=True)
    for a, b in zip(good, trusted):  # well formed: trusting changes nothing
        np.testing.assert_array_equal(a, b)
    getattr(p, name)[i] = value
    o, lse = sequences.per_sequence(q, k, v, p, attention, trust=True)
    assert o.shape == good[0].shape and lse.shape == good[1].shape


def test_sinks_softcap_and_alibi_apply_per_sequence_with_its_own_offset():
    """Issue 28: per_sequence hands each sequence's problem the sinks and ALiBi slopes; ALiBi's distance uses that
    sequence's bottom-right offset Sk_b - Sq_b, the softcap comes first, the sink enters the denominator only."""
    base = problem(mask="causal-br")
    d = dict(base.raw, variants=["sink", "softcap", "alibi"], softcap=2.0)
    ts = {"cu_seqlens_q": base.cu_seqlens_q, "cu_seqlens_k": base.cu_seqlens_k,
          "sinks": np.array([0.5, -1.0, 2.0, -np.inf], np.float32),
          "alibi_slopes": np.array([0.5, 0.25, 0.125, 0.0625], np.float32)}
    p = Problem.from_run(d, ts)
    q, k, v = tensors(p)
    o, lse = sequences.per_sequence(q, k, v, p, attention)
    b, h, i = 2, 2, 4  # sequence 2: 5 queries over 6 keys, offset 1; query head 2 reads KV head 1
    off = SK[b] - SQ[b]
    qrow = q[sum(SQ[:b]) + i, h].astype(np.float64)
    keys = k[sum(SK[:b]):sum(SK[:b + 1]), h // 2].astype(np.float64)
    j = np.arange(SK[b])
    s = 2.0 * np.tanh(np.float32(p.scale) * (keys @ qrow) / 2.0) - 0.125 * np.abs(j - (i + off))
    seen = j <= i + off
    assert lse[b, h, i] == pytest.approx(np.log(np.exp(s[seen]).sum() + np.exp(2.0)), rel=1e-6)
    plain = Problem.from_run(base.raw, {n: ts[n] for n in ("cu_seqlens_q", "cu_seqlens_k")})
    _, lse_plain = sequences.per_sequence(q, k, v, plain, attention)
    assert abs(lse_plain[b, h, i] - lse[b, h, i]) > 1e-3
