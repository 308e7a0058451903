"""test_jax_adapters.py - the JAX adapters (python/attnfuzz/adapters/jax_attention.py, pallas_attention.py) without
JAX: a fake jax (tests/python/fake_jax: JAX's documented semantics and refusals in numpy, recording every call) runs
their library calls, so the argument translation (masks, windows, scale, tunables), layouts, dtypes, the backward
through jax.vjp, the declarations, the refusal classification and the bug-report script are checked in CI."""

import os
import subprocess
import sys

import numpy as np
import pytest

FAKE = os.path.join(os.path.dirname(__file__), "fake_jax")
PY_ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "python")
sys.path.insert(0, FAKE)

import jax  # noqa: E402 - the fake (tests/python/fake_jax)

from attnfuzz.adapter import Problem  # noqa: E402
from attnfuzz.adapters import jax_attention as JA  # noqa: E402
from attnfuzz.adapters import pallas_attention as PA  # noqa: E402
from attnfuzz.adapters._jax_common import refusal  # noqa: E402
from attnfuzz.dtypes import from_float32, to_float32  # noqa: E402
from attnfuzz.reference import attention, attention_backward  # noqa: E402

assert jax.__version__ == "0.0-fake", "the tests must run the fake jax, not an installed one"

MASKS = {"none": ("none", -1, -1, False), "causal-tl": ("causal", -1, 0, False), "causal-br": ("causal", -1, 0, True),
         "window-tl": ("window", 2, 1, False), "window-br": ("window", 1, 0, True),
         "window-0-0-tl": ("window", 0, 0, False)}


def problem(mask="none", sq=5, sk=7, dtype="f32", hq=4, hkv=2, d=8, variants=(), pass_name="fwd", tunables=None,
            batch=2):
    kind, left, right, br = MASKS[mask]
    text = {"none": "none", "causal": "causal", "window": f"window:{left},{right}"}[kind] + ("-br" if br else "-tl")
    return Problem({"batch": batch, "heads_q": hq, "heads_kv": hkv, "seq_q": sq, "seq_k": sk, "head_dim": d,
                    "head_dim_v": d, "scale": 0.37, "dtype": dtype, "mask": "none" if kind == "none" else text,
                    "mask_kind": kind, "mask_align": "bottom-right" if br else "top-left", "window_left": left,
                    "window_right": right, "diagonal_offset": sk - sq if br else 0, "variants": list(variants),
                    "pass": pass_name, "tunables": tunables or {}})


def inputs(p, seed=5):
    rng = np.random.default_rng(seed)
    mk = lambda s, h: from_float32(rng.uniform(-1, 1, (p.batch, s, h, p.head_dim)).astype(np.float32), p.dtype)
    return mk(p.seq_q, p.heads_q), mk(p.seq_k, p.heads_kv), mk(p.seq_k, p.heads_kv)


def kernel(kernels, name):
    return next(k for k in kernels if k.name == name)


def jax_kernels(backward=False):
    return JA.kernels(JA.IMPLEMENTATIONS, list(JA.ROUTES), ["f32", "f16", "bf16"], backward, jax.__version__)


def pallas_kernels(backward=False):
    return [PA.make(op, ["f32", "f16", "bf16"], backward, False, jax.__version__) for op in PA.OPS]


def close(got, p, q, k, v, rel):
    """got (O, or (O, LSE) from a kernel declaring LSE: JAX's return_residual) against the reference."""
    want, want_lse = attention(q, k, v, p)[:2]
    got, lse = got if isinstance(got, tuple) else (got, None)
    got = to_float32(got, p.dtype) if np.asarray(got).dtype != np.float32 else got
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=rel, atol=rel)
    if lse is not None:  # [B, Hq, Sq], natural log; -inf on a row without keys
        np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", [f"jax-{i}-{r}" for i in JA.IMPLEMENTATIONS for r in JA.ROUTES
                                  if (i, r) != ("cudnn", "bias")])
def test_every_route_computes_each_declared_mask_as_the_tool_means_it(name):
    k = kernel(jax_kernels(), name)
    for mask in k.decl["masks"]:
        for dtype in k.decl["dtypes"]:
            for sq, sk in ((5, 7), (7, 5)):
                p = problem(mask, sq, sk, dtype)
                why = k.supports(p)
                if why and name == "jax-cudnn-window" and (mask == "window-tl" or sq > sk):
                    continue  # cuDNN refuses a right window and a window with Sq > Sk (test_library_refusals_...)
                assert why is None, (mask, dtype, why)
                q, kk, v = inputs(p)
                close(k.fn(q, kk, v, p), p, q, kk, v, 1e-5 if dtype == "f32" else 2e-2)


def test_the_call_carries_the_problems_scale_implementation_and_window_and_runs_f32_in_f32():
    ks = jax_kernels()
    p = problem("causal-tl", 5, 7)
    kernel(ks, "jax-cudnn-window").fn(*inputs(problem("causal-tl", 5, 7, "f16")), problem("causal-tl", 5, 7, "f16"))
    call = jax.CALLS[-1][1]
    assert call["implementation"] == "cudnn" and call["local_window_size"] == (12, 0) and call["scale"] == p.scale
    kernel(ks, "jax-xla-window").fn(*inputs(problem("window-tl")), problem("window-tl"))
    assert jax.CALLS[-1][1]["local_window_size"] == (2, 1) and jax.CALLS[-1][1]["implementation"] == "xla"
    kernel(ks, "jax-xla-is-causal").fn(*inputs(p), p)
    assert jax.CALLS[-1][1]["is_causal"] is True and jax.CALLS[-1][1]["mask"] is None
    assert jax.CALLS[-1][1]["dtype"] == np.float32 and jax.config.values["jax_default_matmul_precision"] == "highest"
    p16 = problem("none", dtype="f16")
    kernel(ks, "jax-xla-bool-mask").fn(*inputs(p16), p16)
    assert jax.CALLS[-1][1]["dtype"] == np.float16 and jax.CALLS[-1][1]["mask"].dtype == bool


def test_the_bias_route_adds_the_bias_and_alibi_and_returns_their_gradient():
    p = problem("causal-br", 3, 4, variants=("bias", "alibi"), hq=2, hkv=1, d=2, batch=1, pass_name="bwd")
    rng = np.random.default_rng(2)
    p.bias = rng.uniform(-1, 1, (1, 2, 1, 4)).astype(np.float32)  # broadcast over the batch and the queries
    p.alibi_slopes = np.array([0.5, 0.25], np.float32)
    k = kernel(jax_kernels(backward=True), "jax-xla-bias")
    q, kk, v = inputs(p)
    close(k.fn(q, kk, v, p), p, q, kk, v, 1e-5)
    do = rng.uniform(-1, 1, (1, 3, 2, 2)).astype(np.float32)
    got = k.backward(q, kk, v, None, None, do, p)
    want = attention_backward(q, kk, v, do, p)
    for g, w in zip(got[:3], want[:3]):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    assert got[3]["dbias"].shape == p.bias.shape
    np.testing.assert_allclose(got[3]["dbias"], want[3]["dbias"], rtol=1e-4, atol=1e-5)


def test_backward_through_vjp_in_bf16_matches_the_reference():
    p = problem("causal-tl", 3, 3, "bf16", hq=2, hkv=1, d=2, batch=1, pass_name="bwd")
    k = kernel(jax_kernels(backward=True), "jax-xla-is-causal")
    q, kk, v = inputs(p)
    do = from_float32(np.random.default_rng(4).uniform(-1, 1, (1, 3, 2, 2)).astype(np.float32), "bf16")
    got = k.backward(q, kk, v, None, None, do, p)
    exact = problem("causal-tl", 3, 3, "f32", hq=2, hkv=1, d=2, batch=1, pass_name="bwd")  # of the bf16 values
    want = attention_backward(*(to_float32(a, "bf16") for a in (q, kk, v, do)), exact)
    for g, w in zip(got, want[:3]):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_jax_kernels_return_the_documented_residual_as_lse_where_jax_takes_it(monkeypatch):
    # return_residual (jax.nn.dot_product_attention's logsumexp, [B, T, N]) goes back as LSE [B, Hq, Sq] from kernels
    # served for f32 alone (JAX rounds it to f16 / bf16 inputs' dtype); a jax without it declares no LSE, unasked
    f32_only = lambda: JA.kernels(["xla"], list(JA.ROUTES), ["f32"], False, jax.__version__)
    assert not any(k.decl["lse"] for k in jax_kernels())  # f16 / bf16 served too: no LSE
    for k in f32_only():  # every xla route and mask: O and LSE against the reference
        assert k.decl["lse"] is True
        for mask in k.decl["masks"]:
            p = problem(mask, 5, 7)
            close(k.fn(*inputs(p), p), p, *inputs(p), 1e-5)
    p = problem("window-tl", 5, 7)
    o, lse = kernel(f32_only(), "jax-xla-window").fn(*inputs(p), p)
    assert lse.shape == (p.batch, p.heads_q, p.seq_q) and np.isfinite(lse).all()
    real = jax.nn.dot_product_attention
    monkeypatch.setattr(jax.nn, "dot_product_attention",
                        lambda query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
                        query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None,
                        implementation=None: real(query, key, value, bias, mask, scale=scale, is_causal=is_causal,
                                                  local_window_size=local_window_size, implementation=implementation))
    old = kernel(f32_only(), "jax-xla-window")
    assert old.decl["lse"] is False
    close(old.fn(*inputs(p), p), p, *inputs(p), 1e-5)


def test_declarations_say_what_each_library_takes():
    ks = {k.name: k.decl for k in jax_kernels(backward=True) + pallas_kernels(backward=True)}
    assert "jax-cudnn-bias" not in ks
    assert all(d["recompiles_per_shape"] for d in ks.values())
    assert all(not d["dv_ne_d"] for d in ks.values())
    cudnn = ks["jax-cudnn-bool-mask"]
    assert cudnn["dtypes"] == ["f16", "bf16"] and cudnn["head_dim_multiple"] == 8 and cudnn["max_head_dim"] == 256
    assert ks["jax-xla-bias"]["variants"] == ["mask-dense", "mask-bits", "block-sparse", "alibi", "bias"]
    assert ks["jax-xla-is-causal"]["masks"] == ["none", "causal-tl"] and ks["jax-xla-window"]["backward"]
    mha, gqa = ks["pallas-mha"], ks["pallas-gqa-decode"]
    assert mha["gqa"] is False and mha["masks"] == ["none", "causal-tl"] and mha["backward"] and not mha["empty_keys"]
    assert gqa["gqa"] and "backward" not in gqa and gqa["tunables"][0]["role"] == "kv_splits"


def test_library_refusals_are_unsupported_with_the_librarys_words():
    ks = jax_kernels(backward=True)
    p = problem("none", 33, 33, "f16", pass_name="bwd")
    why = kernel(ks, "jax-cudnn-is-causal").supports(p)
    assert why == "jax cudnn/is-causal refuses it: NotImplementedError: Unsupported sequence length Q 33, KV 33."
    why = kernel(ks, "jax-cudnn-window").supports(problem("window-tl", dtype="bf16"))
    assert why.startswith("jax cudnn/window refuses it: ValueError: cuDNN doesn't support right window: 1")
    mha, gqa = pallas_kernels()
    assert "must be a multiple of block_q" in mha.supports(problem("none", 200, 128, hkv=4))
    assert "power of 2" in mha.supports(problem("none", 24, 24, hkv=4))
    assert mha.supports(problem("none", 8, 16, hkv=4)) is None
    assert PA.capacity(100, 16) == 256 and PA.capacity(40, 2) == 64 and PA.capacity(0, 4) == 64
    assert gqa.supports(problem("none", 3, 100)) is None  # padded to a capacity of 256, masked by kv_seq_len
    assert "power of 2" in mha.supports(problem("none", 8, 24, hkv=4))  # mha cannot pad: it has no length argument
    assert refusal(RuntimeError("INTERNAL: ptxas exited with 137")) is None  # not a refusal: the run reports it
    assert refusal(RuntimeError("triton OutOfResources: out of resource: shared memory, Required: 262144")) == \
        "RuntimeError: triton OutOfResources: out of resource: shared memory, Required: 262144"


def test_cudnn_window_refusals_at_sq_above_sk_are_unsupported_forward_and_backward():
    """H200 smoke (jax 0.11.2): the forward window with Sq > Sk fails cuDNN's graph validation (an XLA INTERNAL
    error, once a launch-error at 4x3 window:0,0-tl), and a backward problem's probe ran that forward first, took
    its error for 'supported' and never reached the backward's own refusal: the run then raised "Unsupported
    sequence length Q 129, KV 1" as a launch-error."""
    k = kernel(jax_kernels(backward=True), "jax-cudnn-window")
    why = k.supports(problem("window-0-0-tl", 4, 3, "bf16", batch=1, hq=1, hkv=1, d=16))  # the minimized launch-error
    assert why.startswith("jax cudnn/window refuses it: JaxRuntimeError: INTERNAL: Sliding window attention is only "
                          "supported with max_s_q <= max_s_kv.")
    why = k.supports(problem("causal-tl", 129, 1, "bf16", batch=1, hq=1, hkv=1, pass_name="bwd"))
    assert why == "jax cudnn/window refuses it: NotImplementedError: Unsupported sequence length Q 129, KV 1."
    assert k.supports(problem("causal-tl", 4, 6, "bf16", pass_name="bwd")) is None  # even lengths train
    assert kernel(jax_kernels(backward=True), "jax-cudnn-is-causal").supports(problem("none", 5, 7, "f16")) is None


def test_a_backward_problem_probes_the_backward_whatever_the_forward_raises():
    from attnfuzz.adapters import _common as C

    def call(q, k, v, p):
        raise RuntimeError("a forward failure that is no refusal")

    def grad(q, k, v, o, lse, do, p):
        raise NotImplementedError("Unsupported sequence length Q 5, KV 7.")

    supports = C.probed_supports("lib", call, grad, refusal)
    assert supports(problem("none", pass_name="bwd")) == \
        "lib refuses it: NotImplementedError: Unsupported sequence length Q 5, KV 7."
    assert supports(problem("none")) is None  # the forward's error is the run's to report, not a refusal


def test_empty_arrays_get_c_strides_for_the_libraries():
    from attnfuzz.adapters._common import c_strides
    empty = np.concatenate([np.zeros((0, 1, 64), np.uint16)], 0)  # a packed K of Sk = 0 (a concatenation of no rows)
    assert c_strides(empty).strides == (128, 128, 2) and c_strides(empty).shape == (0, 1, 64)
    full = np.zeros((2, 3), np.float32)[:, ::2]
    assert c_strides(full) is full  # arrays with elements are left as they are


def test_pallas_mha_passes_block_sizes_and_top_left_causal():
    mha = pallas_kernels()[0]
    p = problem("causal-tl", 8, 16, hkv=4, tunables={"block_q": 32, "block_k": 16})
    q, kk, v = inputs(p)
    close(mha.fn(q, kk, v, p), p, q, kk, v, 1e-5)
    call = jax.CALLS[-1][1]
    assert call["causal"] and call["sm_scale"] == p.scale and call["block_sizes"].block_q == 32
    assert call["block_sizes"].backward == (32, 16, 32, 16)


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("sq,sk", [(1, 32), (5, 32), (4, 20)])
def test_pallas_gqa_decodes_each_row_over_its_keys_as_start_and_length(mask, sq, sk):
    gqa = pallas_kernels()[1]
    p = problem(mask, sq, sk, tunables={"k_splits": 2})
    assert gqa.supports(p) is None
    q, kk, v = inputs(p)
    close(gqa.fn(q, kk, v, p), p, q, kk, v, 1e-5)
    ranges = [p.key_range(i) for i in range(sq)] * 2  # batch entry b * Sq + i
    call = jax.CALLS[-1][1]
    assert call["k_splits"] == 2
    if sk == 32 and all(r == (0, 32) for r in ranges):  # 2 splits of 16 keys: no padding, nothing to mask
        assert call["start_idx"] is None and call["kv_seq_len"] is None
    else:
        assert list(call["start_idx"]) == [r[0] for r in ranges] and list(call["kv_seq_len"]) == [r[1] for r in ranges]


def test_the_bug_report_script_makes_the_adapters_call(tmp_path):
    k = kernel(jax_kernels(), "jax-xla-bool-mask")
    p = problem("window-br", 5, 7)
    q, kk, v = inputs(p)
    o = attention(q, kk, v, p)[0].astype(np.float64)
    req = {"dir": str(tmp_path), "stem": "repro", "comment": ["a test"]}
    bound = np.full(o.shape, 1e-5)
    from attnfuzz import repro
    files = repro.write(k, p, p.raw, {"q": q, "k": kk, "v": v, "expected_o": o, "bound_o": bound}, req)
    text = open(files[0]).read()
    assert "jax.nn.dot_product_attention(Q, K, V, mask=jnp.asarray(x['mask']), scale=0.37" in text
    assert text.count("\n") <= repro.MAX_LINES
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([FAKE, PY_ROOT]))
    run = subprocess.run([sys.executable, files[0]], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    np.savez(files[1], **dict(np.load(files[1]), expected_o=o + 1.0))  # a wrong library: the script says so
    run = subprocess.run([sys.executable, files[0]], capture_output=True, text=True, env=env)
    assert run.returncode == 1 and "STILL WRONG" in run.stdout
