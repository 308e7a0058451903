"""test_variants.py - the score variants on the adapter side (python/attnfuzz): the numpy reference with sinks,
softcap, ALiBi and bias (docs/semantics.md "Variants"), forward identities and backward gradients of q, k, v and of
the sinks and bias against finite differences, without the tools."""

import numpy as np

from attnfuzz.adapter import Problem
from attnfuzz.reference import attention, attention_backward


def problem(variants, sq=7, sk=11, softcap=0.0, mask="causal-br"):
    d = {"batch": 2, "heads_q": 4, "heads_kv": 2, "seq_q": sq, "seq_k": sk, "head_dim": 8, "head_dim_v": 8,
         "scale": 0.9, "dtype": "f32", "mask": mask, "mask_kind": "none" if mask == "none" else "causal",
         "mask_align": "bottom-right", "window_left": -1, "window_right": -1 if mask == "none" else 0,
         "diagonal_offset": sk - sq, "variants": list(variants), "softcap": softcap}
    p = Problem(d)
    rng = np.random.default_rng(11)
    if "sink" in variants:
        p.sinks = rng.uniform(-2, 2, 4).astype(np.float32)
    if "alibi" in variants:
        p.alibi_slopes = np.array([0.5, 0.25, 0.125, 0.0625], np.float32)
    if "bias" in variants:
        p.bias = rng.uniform(-1, 1, (1, 4, sq, sk)).astype(np.float32)  # broadcast over the batch
    return p


def tensors(p, seed=3, mag=1.0):
    rng = np.random.default_rng(seed)
    u = lambda *s: rng.uniform(-mag, mag, s).astype(np.float32)
    return u(2, p.seq_q, 4, 8), u(2, p.seq_k, 2, 8), u(2, p.seq_k, 2, 8)


def test_a_row_without_keys_and_a_sink_is_zero_with_lse_the_sink():
    p = problem(["sink"], sq=7, sk=5)  # bottom-right causal with Sq > Sk: rows 0 and 1 see no key
    q, k, v = tensors(p)
    o, lse = attention(q, k, v, p)
    assert np.all(o[:, 0:2] == 0)
    assert np.allclose(lse[:, :, 0], p.sinks[None, :]) and np.allclose(lse[:, :, 1], p.sinks[None, :])


def test_a_sink_shrinks_the_weights_and_adds_to_the_lse():
    p, plain = problem(["sink"]), problem([])
    q, k, v = tensors(p)
    o, lse = attention(q, k, v, p)
    o0, lse0 = attention(q, k, v, plain)
    want = np.logaddexp(lse0.astype(np.float64), p.sinks[None, :, None])
    assert np.allclose(lse, want, atol=1e-5)
    w = np.exp(lse0 - lse).transpose(0, 2, 1)[..., None]  # [B, Sq, Hq, 1]
    assert np.allclose(o, o0 * w, atol=1e-5)


def test_softcap_bounds_the_scores_and_is_finite_far_beyond_88():
    p = problem(["softcap"], softcap=2.0)
    q, k, v = tensors(p, mag=40.0)  # |s / cap| >> 88: exp-based tanh overflows, tanh does not
    o, lse = attention(q, k, v, p)
    assert np.all(np.isfinite(o)) and np.all(np.isfinite(lse))
    assert np.all(lse <= 2.0 + np.log(p.seq_k) + 1e-5)  # every score <= cap


def test_alibi_is_a_bias():
    pa, pb = problem(["alibi"]), problem(["bias"])
    i = np.arange(pa.seq_q)[:, None]
    j = np.arange(pa.seq_k)[None, :]
    pb.bias = (-pa.alibi_slopes[None, :, None, None] * np.abs(j - (i + pa.diagonal_offset))).astype(np.float32)
    q, k, v = tensors(pa)
    assert np.allclose(attention(q, k, v, pa)[0], attention(q, k, v, pb)[0], atol=1e-6)


def loss(q, k, v, p, do):
    return float(np.sum(attention(q, k, v, p)[0].astype(np.float64) * do))


def assert_matches_finite_differences(q, k, v, p, do, pairs, seed, h=1e-3):
    """Each (input array, its gradient) pair agrees with a central difference of loss at 6 random elements."""
    for arr, g in pairs:
        rng = np.random.default_rng(seed)
        for _ in range(6):
            idx = tuple(int(rng.integers(n)) for n in arr.shape)
            a0 = arr[idx]
            arr[idx] = a0 + h
            up = loss(q, k, v, p, do)
            arr[idx] = a0 - h
            dn = loss(q, k, v, p, do)
            arr[idx] = a0
            assert abs((up - dn) / (2 * h) - g[idx]) < 2e-3 * (1 + abs(g[idx])), (arr.shape, idx)


def test_gradients_of_every_input_match_finite_differences():
    p = problem(["sink", "softcap", "alibi", "bias"], softcap=3.0)
    q, k, v = tensors(p)
    do = np.random.default_rng(7).uniform(-1, 1, (2, p.seq_q, 4, 8)).astype(np.float32)
    o, lse = attention(q, k, v, p)
    dq, dk, dv, extra = attention_backward(q, k, v, do, p, o=o, lse=lse)
    assert extra["dsinks"].shape == (4,) and extra["dbias"].shape == p.bias.shape
    assert_matches_finite_differences(
        q, k, v, p, do, ((q, dq), (k, dk), (v, dv), (p.sinks, extra["dsinks"]), (p.bias, extra["dbias"])), seed=1)


def test_without_score_variants_the_backward_returns_three_gradients():
    p = problem([])
    q, k, v = tensors(p)
    assert len(attention_backward(q, k, v, np.ones((2, p.seq_q, 4, 8), np.float32), p)) == 3


def dropout_problem(sq=7, sk=11, p=0.3, seed=9, offset=2 ** 33 + 1):
    pr = problem(["dropout"], sq=sq, sk=sk)
    pr.dropout_p, pr.dropout_seed, pr.dropout_offset = p, seed, offset
    return pr


def test_the_keep_mask_depends_only_on_seed_offset_and_position():
    small, big = dropout_problem(sq=5, sk=9), dropout_problem(sq=7, sk=11)
    assert np.array_equal(small.dropout_keep(), big.dropout_keep()[:, :, :5, :9])
    other = dropout_problem(offset=2 ** 33 + 2)
    assert not np.array_equal(other.dropout_keep(), big.dropout_keep())
    many = dropout_problem(sq=64, sk=256)
    assert abs(many.dropout_keep().mean() - 0.7) < 0.01  # 2 x 4 x 64 x 256 draws


def test_dropout_scales_the_kept_weights_and_its_backward_matches_finite_differences():
    p = dropout_problem(p=0.0)
    q, k, v = tensors(p)
    o, lse, extra = attention(q, k, v, p)
    assert np.allclose(o, attention(q, k, v, problem([]))[0], atol=1e-6) and extra["dropout_mask"].all()
    p = dropout_problem()
    o, lse, extra = attention(q, k, v, p)
    do = np.random.default_rng(7).uniform(-1, 1, o.shape).astype(np.float32)
    dq, dk, dv, ex = attention_backward(q, k, v, do, p, o=o, lse=lse)
    assert np.array_equal(ex["dropout_mask"], extra["dropout_mask"])
    assert_matches_finite_differences(q, k, v, p, do, ((q, dq), (k, dk), (v, dv)), seed=2)


def test_a_dropout_kernel_must_return_its_keep_mask_even_at_p_zero():
    # torch_sdpa's dropout route once returned None at p = 0 (no mask drawn): a launch-error with a confusing shape
    # message on the H200 sweep; the adapter side now names the fault, and a mask of the wrong shape is refused too.
    from attnfuzz.adapter import _dropout_mask
    import pytest
    p = dropout_problem(p=0.0)
    with pytest.raises(ValueError, match="dropout_mask None"):
        _dropout_mask(p, {"dropout_mask": None}, [], [])
    with pytest.raises(ValueError, match="expected"):
        _dropout_mask(p, {"dropout_mask": np.ones((1,), np.uint8)}, [], [])
    arrays = []
    _dropout_mask(p, {"dropout_mask": np.ones((2, 4, 7, 11), np.uint8)}, arrays, [])
    assert arrays[0].shape == (2, 4, 7, 11)
