"""test_kv_shared.py - MLA's shared K/V latent on the adapter side (PROTOCOL.md "Shared K/V latent"): V is the view
k[..., :Dv] that the helper sets for a kv-shared run, and the numpy reference's planted copy reads it wrong."""

import numpy as np

from attnfuzz.adapter import VARIANTS, Problem, kv_shared_view
from attnfuzz.reference import attention

B, HQ, HKV, SQ, SK, D, DV = 1, 4, 1, 2, 9, 16, 8


def problem(variants=("kv-shared",)):
    d = {"batch": B, "heads_q": HQ, "heads_kv": HKV, "seq_q": SQ, "seq_k": SK, "head_dim": D, "head_dim_v": DV,
         "scale": 0.25, "dtype": "f32", "mask": "causal-br", "mask_kind": "causal", "mask_align": "bottom-right",
         "window_left": -1, "window_right": 0, "diagonal_offset": SK - SQ, "variants": list(variants)}
    return Problem(d)


def tensors(seed=5):
    rng = np.random.default_rng(seed)
    return {"q": rng.standard_normal((B, SQ, HQ, D)).astype(np.float32),
            "k": rng.standard_normal((B, SK, HKV, D)).astype(np.float32)}


def test_a_kv_shared_run_gets_v_as_a_view_of_k():
    assert "kv-shared" in VARIANTS
    ts = kv_shared_view(problem(), tensors())
    assert ts["v"].shape == (B, SK, HKV, DV)
    assert np.shares_memory(ts["v"], ts["k"]) and ts["v"].strides == ts["k"].strides
    assert np.array_equal(ts["v"], ts["k"][..., :DV])


def test_a_plain_run_keeps_its_own_v():
    ts = tensors()
    ts["v"] = np.zeros((B, SK, HKV, DV), np.float32)
    assert not np.shares_memory(kv_shared_view(problem(variants=()), ts)["v"], ts["k"])


def test_the_latent_rows_bug_reads_other_values_past_key_0():
    p, ts = problem(), kv_shared_view(problem(), tensors())
    o, _ = attention(ts["q"], ts["k"], ts["v"], p)
    o_bug, _ = attention(ts["q"], ts["k"], ts["v"], p, bug="kv-latent-rows")
    v_bug = ts["k"].reshape(-1)[:B * SK * HKV * DV].reshape(B, SK, HKV, DV)
    assert np.array_equal(v_bug[:, 0], ts["v"][:, 0]) and not np.array_equal(v_bug[:, 1:], ts["v"][:, 1:])
    assert not np.allclose(o, o_bug)
