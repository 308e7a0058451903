"""test_masks.py - the custom masks on the adapter side (python/attnfuzz): Problem.custom_visible and the numpy
reference with dense, bit-packed and block-sparse masks (docs/semantics.md "Custom masks"), without the tools."""

import numpy as np

from attnfuzz.adapter import Problem
from attnfuzz.reference import attention, attention_backward


def problem(sq=9, sk=21, variants=(), block=(4, 8), mask="none"):
    d = {"batch": 1, "heads_q": 2, "heads_kv": 1, "seq_q": sq, "seq_k": sk, "head_dim": 8, "head_dim_v": 8,
         "scale": 0.35, "dtype": "f32", "mask": mask, "mask_kind": "none" if mask == "none" else "causal",
         "mask_align": "bottom-right", "window_left": -1, "window_right": -1 if mask == "none" else 0,
         "diagonal_offset": sk - sq, "variants": list(variants), "block_size": list(block)}
    return Problem(d)


def tensors(p, seed=3):
    rng = np.random.default_rng(seed)
    q = rng.uniform(-1, 1, (1, p.seq_q, 2, 8)).astype(np.float32)
    k = rng.uniform(-1, 1, (1, p.seq_k, 1, 8)).astype(np.float32)
    v = rng.uniform(-1, 1, (1, p.seq_k, 1, 8)).astype(np.float32)
    return q, k, v


def dense(p, seed=5, density=0.5):
    return (np.random.default_rng(seed).random((1, 2, p.seq_q, p.seq_k)) < density).astype(np.uint8)


def test_bits_and_dense_of_one_pattern_are_the_same_mask():
    pd, pb = problem(variants=["mask-dense"]), problem(variants=["mask-bits"])
    pd.custom_mask = dense(pd)
    pb.custom_mask = np.packbits(pd.custom_mask, axis=-1, bitorder="little")  # bit j % 8 of byte j / 8
    assert pb.custom_mask.shape[-1] == (pb.seq_k + 7) // 8
    assert np.array_equal(pd.custom_visible(), pb.custom_visible())
    q, k, v = tensors(pd)
    assert np.array_equal(attention(q, k, v, pd)[0], attention(q, k, v, pb)[0])


def test_ones_equal_no_mask_and_hidden_keys_are_never_read():
    p, plain = problem(variants=["mask-dense"]), problem()
    p.custom_mask = np.ones((1, 1, 1, p.seq_k), dtype=np.uint8)  # broadcast over b, h, i
    q, k, v = tensors(p)
    o, lse = attention(q, k, v, p)
    o0, lse0 = attention(q, k, v, plain)
    assert np.allclose(o, o0, atol=1e-6) and np.allclose(lse, lse0, atol=1e-6)
    p.custom_mask = dense(p)
    v[0, np.nonzero(p.custom_mask[0, 0, 0] == 0)[0][0], 0, :] = np.nan  # a key row 0 of head 0 does not see
    assert np.all(np.isfinite(attention(q, k, v, p)[0][0, 0, 0]))


def test_fully_hidden_rows_are_empty_rows():
    p = problem(variants=["mask-dense"])
    p.custom_mask = dense(p)
    p.custom_mask[0, 1, 3, :] = 0
    q, k, v = tensors(p)
    o, lse = attention(q, k, v, p)
    assert np.all(o[0, 3, 1] == 0) and lse[0, 1, 3] == -np.inf
    dq, dk, dv = attention_backward(q, k, v, np.ones_like(o), p, o=o, lse=lse)
    assert np.all(dq[0, 3, 1] == 0) and np.all(np.isfinite(dk)) and np.all(np.isfinite(dv))


def test_block_values_empty_full_partial():
    p = problem(variants=["mask-dense", "block-sparse"], block=(4, 8))
    p.custom_mask = dense(p)
    nq, nk = -(-p.seq_q // 4), -(-p.seq_k // 8)
    p.block_mask = np.full((1, 1, nq, nk), 2, dtype=np.uint8)  # partial everywhere: the custom mask decides
    assert np.array_equal(p.custom_visible(), np.broadcast_to(p.custom_mask != 0, (1, 2, p.seq_q, p.seq_k)))
    p.block_mask[0, 0, 0, 0], p.block_mask[0, 0, 1, 1] = 0, 1
    vis = p.custom_visible()
    assert not vis[:, :, 0:4, 0:8].any()  # empty block
    assert vis[:, :, 4:8, 8:16].all()  # full block: the custom mask is not read


def test_the_mask_kind_interval_still_applies():
    p = problem(variants=["mask-dense"], mask="causal-br", sq=9, sk=9)
    p.custom_mask = np.ones((1, 2, 9, 9), dtype=np.uint8)
    assert np.array_equal(p.visible_all()[0, 0], np.tril(np.ones((9, 9), dtype=bool)))
