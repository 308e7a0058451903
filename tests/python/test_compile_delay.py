"""test_compile_delay.py - numpy_ref --compile-delay (python/attnfuzz/adapters/numpy_ref.py): a simulated JIT that sleeps at
the first call at each new shape only, and the hello key recompiles_per_shape (adapters/PROTOCOL.md) that tells attn-fuzz."""

import time

from attnfuzz.adapter import Kernel, Problem
from attnfuzz.adapters.numpy_ref import compile_key, compiling


def problem(sq=5, scale=0.5, mask="causal-tl"):
    return Problem({"batch": 1, "heads_q": 2, "heads_kv": 1, "seq_q": sq, "seq_k": 7, "head_dim": 4, "head_dim_v": 4,
                    "scale": scale, "dtype": "f32", "mask": mask, "mask_kind": "causal", "mask_align": "top-left",
                    "window_left": -1, "window_right": 0, "diagonal_offset": 0})


def timed(fn, p):
    t0 = time.monotonic()
    fn(p)
    return time.monotonic() - t0


def test_only_the_first_call_at_a_shape_waits():
    compiled = set()
    fn = compiling(lambda p: None, 0.1, compiled)
    assert timed(fn, problem()) >= 0.1
    assert timed(fn, problem(scale=0.25)) < 0.05  # the scale is data, not a new compilation
    assert timed(fn, problem(sq=6)) >= 0.1        # a new shape compiles
    assert timed(fn, problem(mask="causal-br")) >= 0.1
    assert compile_key(problem()) in compiled and len(compiled) == 3


def test_no_delay_is_the_function_itself():
    f = lambda p: None
    assert compiling(f, 0, set()) is f


def test_the_declaration_carries_the_key_only_when_set():
    assert Kernel("k", None, recompiles_per_shape=True).decl["recompiles_per_shape"] is True
    assert "recompiles_per_shape" not in Kernel("k", None).decl  # a version-1 declaration as before


def test_data_variants_do_not_compile_again_and_are_declared():
    compiled = set()
    fn = compiling(lambda p: None, 0.1, compiled, ("sink", "softcap"))
    p, q = problem(), problem()
    q.variants = ["sink", "softcap"]
    assert timed(fn, p) >= 0.1
    assert timed(fn, q) < 0.05  # sinks and a softcap: data, not a new compilation
    k = Kernel("k", None, variants=("sink", "softcap", "bias"), data_variants=("sink", "softcap"))
    assert k.decl["data_variants"] == ["sink", "softcap"]
    assert "data_variants" not in Kernel("k", None).decl  # absent unless set
    for bad in (("bias",), ("block-sparse",)):  # not among its variants / not a score variant
        try:
            Kernel("k", None, variants=("sink", "block-sparse"), data_variants=bad)
        except ValueError:
            continue
        raise AssertionError(f"data_variants={bad} accepted")
