"""test_torch_cpu.py - torch_sdpa --device cpu (PyTorch's CPU SDPA backends) against the numpy reference, in process:
the math backend on every route and mask, forward and backward; flash on the CPU where torch accepts the case.
Skipped without torch (CI here); scripts/device/jax_smoke.sh runs it on the GPU host."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from attnfuzz.adapter import Problem  # noqa: E402
from attnfuzz.adapters import torch_sdpa  # noqa: E402
from attnfuzz.reference import attention, attention_backward  # noqa: E402

MASKS = {"none": ("none", -1, -1, False), "causal-tl": ("causal", -1, 0, False), "causal-br": ("causal", -1, 0, True),
         "window-tl": ("window", 2, 1, False), "window-br": ("window", 1, 0, True)}


def problem(mask, sq=5, sk=7, pass_name="fwd"):
    kind, left, right, br = MASKS[mask]
    return Problem({"batch": 2, "heads_q": 4, "heads_kv": 2, "seq_q": sq, "seq_k": sk, "head_dim": 8, "head_dim_v": 8,
                    "scale": 0.37, "dtype": "f32", "mask": mask, "mask_kind": kind,
                    "mask_align": "bottom-right" if br else "top-left", "window_left": left, "window_right": right,
                    "diagonal_offset": sk - sq if br else 0, "pass": pass_name})


def inputs(p, seed=5):
    rng = np.random.default_rng(seed)
    u = lambda s, h: rng.uniform(-1, 1, (p.batch, s, h, 8)).astype(np.float32)
    return u(p.seq_q, 4), u(p.seq_k, 2), u(p.seq_k, 2), u(p.seq_q, 4)


@pytest.mark.parametrize("backend", ["math", "flash"])
@pytest.mark.parametrize("route", ["is-causal", "lower-right", "bool-mask", "float-mask"])
def test_cpu_sdpa_matches_the_reference_forward_and_backward(backend, route):
    k = torch_sdpa.make(backend, route, "cpu", ["f32"], True)
    ran = 0
    for mask in torch_sdpa.ROUTES[route]:
        for sq, sk in ((5, 7), (7, 7)):
            p, pb = problem(mask, sq, sk), problem(mask, sq, sk, "bwd")
            if k.supports(p) or k.supports(pb):
                assert backend != "math", k.supports(p) or k.supports(pb)  # math takes everything on the CPU
                continue
            q, kk, v, do = inputs(p)
            np.testing.assert_allclose(k.fn(q, kk, v, p), attention(q, kk, v, p)[0], rtol=1e-4, atol=1e-5)
            for g, w in zip(k.backward(q, kk, v, None, None, do, pb), attention_backward(q, kk, v, do, pb)[:3]):
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
            ran += 1
    assert ran > 0 or backend == "flash"


def test_the_dropout_route_asks_the_public_call_first():
    """The dropout route runs SDPA's private ops, which accept what the public call refuses (Sk = 0 on the fused
    backends, misaligned head dims): public_refusal says why, and None where the public call runs (math, Sk = 0)."""
    p = problem("none", 5, 0)
    assert torch_sdpa.public_refusal(torch_sdpa.BACKENDS["math"], p, "cpu") is None
    why = torch_sdpa.public_refusal(torch_sdpa.BACKENDS["cudnn"], p, "cpu")  # no cuDNN kernel on the CPU
    assert why and why.startswith("the public call refuses it")
