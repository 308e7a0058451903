"""test_head_descale.py - per-head fp8 descales on the adapter side (python/attnfuzz): the numpy reference with
Problem.q_descale_h / k_descale_h / v_descale_h (docs/semantics.md "Per-head descales"), without the tools."""

import numpy as np

from attnfuzz.adapter import Problem
from attnfuzz.dtypes import from_float32
from attnfuzz.reference import attention

B, HQ, HKV, SQ, SK, D = 2, 4, 2, 5, 9, 8


def problem(hq=HQ, hkv=HKV, descales=(1.0, 1.0, 1.0), variants=()):
    d = {"batch": B, "heads_q": hq, "heads_kv": hkv, "seq_q": SQ, "seq_k": SK, "head_dim": D, "head_dim_v": D,
         "scale": 0.35, "dtype": "fp8_e4m3", "mask": "none", "mask_kind": "none", "mask_align": "bottom-right",
         "window_left": -1, "window_right": -1, "diagonal_offset": SK - SQ, "q_descale": descales[0],
         "k_descale": descales[1], "v_descale": descales[2], "o_scale": 1.0, "variants": list(variants)}
    return Problem(d)


def tensors(seed=3):
    rng = np.random.default_rng(seed)
    mk = lambda *s: from_float32((rng.integers(-8, 9, s) * 0.25).astype(np.float32), "fp8_e4m3")
    return mk(B, SQ, HQ, D), mk(B, SK, HKV, D), mk(B, SK, HKV, D)


def test_equal_heads_are_the_per_tensor_descales():
    q, k, v = tensors()
    o0, lse0 = attention(q, k, v, problem(descales=(2.0, 0.5, 8.0)))
    p = problem(variants=["head-descale"])
    p.q_descale_h = np.full((1, HQ), 2.0, np.float32)
    p.k_descale_h = np.full((1, HKV), 0.5, np.float32)
    p.v_descale_h = np.full((1, HKV), 8.0, np.float32)
    o, lse = attention(q, k, v, p)
    assert np.array_equal(o, o0) and np.array_equal(lse, lse0)


def test_k_and_v_follow_the_kv_head_per_batch():
    q, k, v = tensors()
    p = problem(variants=["head-descale"])
    p.q_descale_h = np.array([[1, 2, 0.5, 8], [0.125, 3.25, 1, 0.375]], np.float32)
    p.k_descale_h = np.array([[0.5, 4], [2, 0.25]], np.float32)
    p.v_descale_h = np.array([[2, 0.125], [0.5, 8]], np.float32)
    o, lse = attention(q, k, v, p)
    for b in range(B):
        for h in range(HQ):
            hk = h // (HQ // HKV)
            s = problem(hq=1, hkv=1, descales=(p.q_descale_h[b, h], p.k_descale_h[b, hk], p.v_descale_h[b, hk]))
            s.batch = 1
            os_, lses = attention(q[b:b + 1, :, h:h + 1], k[b:b + 1, :, hk:hk + 1], v[b:b + 1, :, hk:hk + 1], s)
            assert np.array_equal(o[b, :, h], os_[0, :, 0]) and np.array_equal(lse[b, h], lses[0, 0])
    # Query head 1 with KV head 1's descales (indexed by query head) is another result.
    s = problem(hq=1, hkv=1, descales=(p.q_descale_h[0, 1], p.k_descale_h[0, 1], p.v_descale_h[0, 1]))
    s.batch = 1
    assert not np.array_equal(o[0, :, 1], attention(q[:1, :, 1:2], k[:1, :, 0:1], v[:1, :, 0:1], s)[0][0, :, 0])
