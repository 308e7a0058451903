"""test_repro.py - bug-report scripts (python/attnfuzz/repro.py) without the tools: the numpy reference's script exits 1
on its planted bugs and 0 on the fixed library, stays within 40 lines, and (with torch) the SDPA adapter's script
computes bit for bit what the adapter does."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from attnfuzz import repro, sequences
from attnfuzz.adapter import Kernel, Problem
from attnfuzz.adapters.numpy_ref import library_call
from attnfuzz.dtypes import from_float32
from attnfuzz.reference import attention, attention_backward

PY_ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "python")


def problem(dtype="f32", pass_name="fwd", sq=5, sk=7):
    return {"batch": 1, "heads_q": 2, "heads_kv": 1, "seq_q": sq, "seq_k": sk, "head_dim": 4, "head_dim_v": 4,
            "scale": 0.5, "dtype": dtype, "mask": "causal-tl", "mask_kind": "causal", "mask_align": "top-left",
            "window_left": -1, "window_right": 0, "diagonal_offset": 0, "pass": pass_name}


def inputs(d, seed=1):
    rng = np.random.default_rng(seed)
    mk = lambda s, h, n: from_float32(rng.uniform(-1, 1, (d["batch"], s, h, n)).astype(np.float32), d["dtype"])
    q = mk(d["seq_q"], d["heads_q"], d["head_dim"])
    k, v = mk(d["seq_k"], d["heads_kv"], d["head_dim"]), mk(d["seq_k"], d["heads_kv"], d["head_dim_v"])
    return {"q": q, "k": k, "v": v}


def bundle(tmp_path, bug, d):
    """Writes the script of kernel numpy-<bug> for problem d; expected = the correct reference (float64 inside), within
    a relative bound of a few units of the dtype (the tool's own bounds are tighter and per element)."""
    rel_bound = 1e-5 if d["dtype"] == "f32" else 3e-2
    p = Problem(d)
    ts = inputs(d)
    if d["pass"] == "bwd":
        o, lse = attention(ts["q"], ts["k"], ts["v"], p)
        ts.update(o=from_float32(o, d["dtype"]), lse=lse, do=inputs(d, seed=2)["q"])
        names, exact = ("dq", "dk", "dv"), attention_backward(ts["q"], ts["k"], ts["v"], ts["do"], p, o=ts["o"], lse=lse)
    else:
        names, exact = ("o", "lse"), attention(ts["q"], ts["k"], ts["v"], p)
    for n, e in zip(names, exact):
        ts["expected_" + n] = np.asarray(e, np.float64)
        ts["bound_" + n] = np.abs(ts["expected_" + n]) * rel_bound + 1e-6
    k = Kernel("numpy-" + (bug or "ref"), None, repro=library_call(bug))
    return repro.write(k, p, d, ts, {"dir": str(tmp_path), "stem": "repro", "comment": ["a test", "second line"]})


def run(script, pythonpath=PY_ROOT):
    env = dict(os.environ, PYTHONPATH=pythonpath, PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=60)


def fixed_library(tmp_path):
    """A copy of python/attnfuzz whose reference has every planted bug fixed: the library after the maintainer's fix."""
    root = tmp_path / "fixed"
    shutil.copytree(os.path.join(PY_ROOT, "attnfuzz"), root / "attnfuzz",
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(root / "attnfuzz" / "reference.py", "a", encoding="utf-8") as f:
        f.write("\n_a, _b = attention, attention_backward\n"
                "attention = lambda q, k, v, p, bug=None: _a(q, k, v, p)\n"
                "attention_backward = lambda q, k, v, do, p, o=None, lse=None, bug=None: _b(q, k, v, do, p, o=o, lse=lse)\n")
    return str(root)


@pytest.mark.parametrize("bug,d", [("mask-leak", problem()), ("bwd-mask-leak", problem("bf16", "bwd"))])
def test_the_script_fails_on_the_bug_and_passes_once_fixed(tmp_path, bug, d):
    script, npz = bundle(tmp_path, bug, d)
    text = open(script, encoding="utf-8").read()
    assert text.count("\n") <= repro.MAX_LINES
    assert text.startswith("# a test\n# second line\n")
    assert f"bug={bug!r}" in text  # the call the adapter makes, as written
    wrong = run(script)
    assert wrong.returncode == 1, wrong.stdout + wrong.stderr
    assert "STILL WRONG" in wrong.stdout and "expected" in wrong.stdout
    ok = run(script, fixed_library(tmp_path))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "fixed" in ok.stdout


def test_the_correct_reference_passes_its_own_script(tmp_path):
    script, _ = bundle(tmp_path, None, problem())
    r = run(script)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_nan_bound_is_not_compared_and_non_finite_mismatches_fail(tmp_path):
    d = problem()
    script, npz = bundle(tmp_path, "mask-leak", d)
    x = dict(np.load(npz))
    x["bound_o"] = np.full(x["bound_o"].shape, np.nan)  # nothing of O compared
    x["bound_lse"] = np.full(x["bound_lse"].shape, np.nan)
    np.savez(npz, **x)
    assert run(script).returncode == 0
    x["bound_o"][0, 0, 0, 0] = np.inf  # a NaN against a finite value fails whatever the bound
    x["expected_o"][0, 0, 0, 0] = np.nan
    np.savez(npz, **x)
    r = run(script)
    assert r.returncode == 1 and "o: 1 of 1 elements beyond their bound" in r.stdout, r.stdout


def test_the_adapter_runs_the_source_the_script_prints():
    d = problem()
    p = Problem(d)
    ts = inputs(d)
    via_source = repro.forward(library_call("mask-leak"))(ts["q"], ts["k"], ts["v"], p)
    direct = attention(ts["q"], ts["k"], ts["v"], p, bug="mask-leak")
    for a, b in zip(via_source, direct):
        assert np.array_equal(a, b)


def varlen_bundle(tmp_path, bug, sq=(3, 0, 5), sk=(4, 1, 6)):
    """The script of numpy-<bug> on a varlen problem (packed q and K/V, causal per sequence), as attn-check
    --bug-report asks for it: the run's tensors with the int32 cu_seqlens, expected O in q's packed layout, the LSE
    rows past a sequence not compared (a NaN bound)."""
    cu = lambda n: np.concatenate([[0], np.cumsum(n)]).astype(np.int32)
    d = dict(problem(sq=max(sq), sk=max(sk)), batch=len(sq), mask="causal-br", mask_align="bottom-right",
             diagonal_offset=max(sk) - max(sq), q_layout="packed", kv_layout="packed", total_q=sum(sq), total_k=sum(sk),
             kv_capacity=0)
    rng = np.random.default_rng(5)
    u = lambda *shape: rng.uniform(-1, 1, shape).astype(np.float32)
    ts = {"q": u(sum(sq), 2, 4), "k": u(sum(sk), 1, 4), "v": u(sum(sk), 1, 4), "cu_seqlens_q": cu(sq),
          "cu_seqlens_k": cu(sk)}
    p = Problem.from_run(d, ts)
    o, lse = sequences.per_sequence(ts["q"], ts["k"], ts["v"], p, attention)
    ts.update(expected_o=o.astype(np.float64), bound_o=np.abs(o) * 1e-5 + 1e-6, expected_lse=lse.astype(np.float64))
    ts["bound_lse"] = np.where(np.arange(max(sq))[None, None, :] < np.array(sq)[:, None, None], 1e-5, np.nan)
    k = Kernel("numpy-" + (bug or "ref"), None, repro=library_call(bug))
    return repro.write(k, p, d, ts, {"dir": str(tmp_path), "stem": "repro", "comment": ["varlen"]})


def test_a_varlen_script_calls_per_sequence_fails_on_the_bug_and_passes_once_fixed(tmp_path):
    script, npz = varlen_bundle(tmp_path, "mask-leak")
    text = open(script, encoding="utf-8").read()
    assert "per_sequence(q, k, v, p, dense, trust=False)" in text and text.count("\n") <= repro.MAX_LINES
    wrong = run(script)
    assert wrong.returncode == 1 and "o: " in wrong.stdout, wrong.stdout + wrong.stderr
    ok = run(script, fixed_library(tmp_path))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    (tmp_path / "ref").mkdir()
    assert run(varlen_bundle(tmp_path / "ref", None)[0]).returncode == 0  # the correct reference passes its script


def malformed_bundle(tmp_path, right_answer):
    """The script of numpy-trusts-metadata on a varlen problem whose cu_seqlens_k decreases at sequence 1, as attn-check
    --bug-report asks for an accepted-malformed case: the arrays as sent, no expected values when no right answer
    exists (with right_answer, the well-formed reading's O as expected, as for page-unused-out-of-pool)."""
    d = dict(problem(sq=5, sk=6), batch=2, q_layout="packed", kv_layout="packed", total_q=8, total_k=10, kv_capacity=0)
    rng = np.random.default_rng(3)
    u = lambda *shape: rng.uniform(-1, 1, shape).astype(np.float32)
    ts = {"q": u(8, 2, 4), "k": u(10, 1, 4), "v": u(10, 1, 4), "cu_seqlens_q": np.array([0, 3, 8], np.int32),
          "cu_seqlens_k": np.array([0, 4, 10], np.int32)}
    if right_answer:  # expected: the well-formed arrays' result
        o = sequences.per_sequence(ts["q"], ts["k"], ts["v"], Problem.from_run(d, ts), attention)[0]
        ts.update(expected_o=o.astype(np.float64), bound_o=np.abs(o) * 1e-5 + 1e-6)
    else:
        ts["cu_seqlens_k"] = np.array([0, 4, 3], np.int32)  # cu_seqlens_k[2] = 3 < cu_seqlens_k[1] = 4
    p = Problem.from_run(d, ts)
    k = Kernel("numpy-trusts-metadata", None, repro=library_call("trusts-metadata"))
    req = {"dir": str(tmp_path), "stem": "repro", "comment": ["malformed"],
           "malformed": {"kind": "cu-k-decreasing", "defect": "cu_seqlens_k[2] = 3 < cu_seqlens_k[1] = 4",
                         "right_answer": right_answer}}
    return repro.write(k, p, d, ts, req)


def checking_library(tmp_path):
    """A copy of python/attnfuzz whose per_sequence checks the arrays even when asked to trust them: the library after
    the maintainer's fix of trusts-metadata (it raises on malformed metadata)."""
    root = tmp_path / "checking"
    shutil.copytree(os.path.join(PY_ROOT, "attnfuzz"), root / "attnfuzz", ignore=shutil.ignore_patterns("__pycache__"))
    with open(root / "attnfuzz" / "sequences.py", "a", encoding="utf-8") as f:
        f.write("\n_ps = per_sequence\nper_sequence = lambda q, k, v, p, fn, trust=False: _ps(q, k, v, p, fn)\n")
    return str(root)


def test_a_malformed_script_passes_the_arrays_as_sent_and_wants_a_refusal(tmp_path):
    script, npz = malformed_bundle(tmp_path, False)
    text = open(script, encoding="utf-8").read()
    assert text.count("\n") <= repro.MAX_LINES and "trust=True" in text and "must raise" in text, text
    assert np.array_equal(np.load(npz)["cu_seqlens_k"], [0, 4, 3])  # exactly as sent
    wrong = run(script)
    assert wrong.returncode == 1 and "STILL WRONG" in wrong.stdout and "o came back" in wrong.stdout, wrong.stdout
    ok = run(script, checking_library(tmp_path))
    assert ok.returncode == 0 and "refused: ValueError: malformed sequence metadata" in ok.stdout, ok.stdout + ok.stderr


def test_a_malformed_script_with_a_right_answer_compares_what_comes_back(tmp_path):
    script, npz = malformed_bundle(tmp_path, True)
    assert run(script).returncode == 0  # the well-formed reading's result, within its bound
    x = dict(np.load(npz))
    x["expected_o"] = x["expected_o"] + 1
    np.savez(npz, **x)
    r = run(script)
    assert r.returncode == 1 and "STILL WRONG" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("layout", ["varlen", "kvcache"])
def test_the_torch_varlen_script_computes_what_the_adapter_does(tmp_path, layout):
    torch = pytest.importorskip("torch")  # varlen_attn is FlashAttention: a CUDA machine with PyTorch (the H200 host)
    if not torch.cuda.is_available():
        pytest.skip("varlen_attn needs CUDA")
    from attnfuzz.adapters import torch_varlen
    from attnfuzz.dtypes import from_float32
    k = torch_varlen.make("cuda", ["bf16"], False)
    sq, sk, used = ([3, 0, 17], [5, 1, 40], None) if layout == "varlen" else ([4, 4, 4], [64, 64, 64], [33, 1, 64])
    packed = layout == "varlen"
    cu = lambda n: np.concatenate([[0], np.cumsum(n)]).astype(np.int32)
    d = dict(problem("bf16", sq=max(sq), sk=max(sk)), batch=3, heads_q=4, heads_kv=2, head_dim=64, head_dim_v=64,
             mask="causal-br", mask_align="bottom-right", diagonal_offset=max(sk) - max(sq),
             q_layout="packed" if packed else "dense", kv_layout="packed" if packed else "dense",
             total_q=sum(sq) if packed else 0, total_k=sum(sk) if packed else 0, kv_capacity=0 if packed else max(sk))
    rng = np.random.default_rng(7)
    u = lambda *shape: from_float32(rng.uniform(-1, 1, shape).astype(np.float32), "bf16")
    rows = lambda n, h: (sum(n), h, 64) if packed else (3, max(n), h, 64)
    ts = {"q": u(*rows(sq, 4)), "k": u(*rows(sk, 2)), "v": u(*rows(sk, 2))}
    ts.update({"cu_seqlens_q": cu(sq), "cu_seqlens_k": cu(sk)} if packed else {"seqused_k": np.array(used, np.int32)})
    p = Problem.from_run(d, ts)
    got = k.fn(ts["q"], ts["k"], ts["v"], p)  # the adapter's own output as the expected value, bound 0: bit for bit
    ts.update(expected_o=np.asarray(got, np.float64), bound_o=np.zeros(np.shape(got)))
    script, _ = repro.write(k, p, d, ts, {"dir": str(tmp_path), "stem": layout, "comment": []})
    r = run(script)
    assert r.returncode == 0, open(script).read() + r.stdout + r.stderr
    assert "varlen_attn(" in open(script).read()


@pytest.mark.parametrize("route", ["is-causal", "lower-right", "bool-mask", "float-mask"])
@pytest.mark.parametrize("pass_name", ["fwd", "bwd"])
def test_the_sdpa_script_computes_what_the_adapter_does(tmp_path, route, pass_name):
    torch = pytest.importorskip("torch")  # on a machine with PyTorch (CPU is enough): the H200 host
    from attnfuzz.adapters import torch_sdpa
    k = torch_sdpa.make("math", route, "cpu", ["f32", "bf16"], True)
    for dtype in ("f32", "bf16"):
        d = problem(dtype, pass_name, 5, 7 if route != "is-causal" else 5)
        if route == "lower-right":
            d.update(mask="causal-br", mask_align="bottom-right", diagonal_offset=2)
        if route == "is-causal":
            d.update(mask="none", mask_kind="none", window_right=-1)
        p = Problem(d)
        ts = inputs(d)
        if pass_name == "bwd":
            ts.update(o=np.zeros((1, 5, 2, 4), np.float32), lse=np.zeros((1, 2, 5), np.float32), do=inputs(d, 2)["q"])
            got = k.backward(ts["q"], ts["k"], ts["v"], ts["o"], ts["lse"], ts["do"], p)
            names = ("dq", "dk", "dv")
        else:
            got, names = (k.fn(ts["q"], ts["k"], ts["v"], p),), ("o",)
        for n, g in zip(names, got):  # the adapter's own output as the expected value, bound 0: bit for bit
            ts["expected_" + n] = np.asarray(g, np.float64)
            ts["bound_" + n] = np.zeros(np.shape(g))
        script, _ = repro.write(k, p, d, ts, {"dir": str(tmp_path), "stem": f"{route}-{dtype}", "comment": []})
        r = run(script)
        assert r.returncode == 0, open(script).read() + r.stdout + r.stderr
        assert open(script).read().count("\n") <= repro.MAX_LINES
    assert torch.__version__
