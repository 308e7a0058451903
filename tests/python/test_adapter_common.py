"""attnfuzz.adapters._common: which library errors are refusals (the case `unsupported`), which are not."""

import numpy as np
import pytest

from attnfuzz.adapter import Problem
from attnfuzz.adapters._common import is_unsupported, probe_on_zeros

# Refusals the torch libraries gave on an H200 (torch 2.11), each once reported as a launch-error because the
# dropout route's probe did not know its words: SDPA's private flash op on f32 and on Dv != D, the private
# efficient op on a head dim it has no kernel for; and the refusals known before.
REFUSALS = ["FlashAttention only support fp16 and bf16 data type",
            "cutlassF: no kernel found to launch!",
            "v must have shape (batch_size, seqlen_k, num_heads_k, head_size_og)",
            "No available kernel. Aborting execution.",
            "head_dim must be a multiple of 8",
            "Unsupported head dimension 576"]
# Kernel failures: never a refusal, whatever else the text says.
FAILURES = ["CUDA error: an illegal memory access was encountered",
            "CUDA error: misaligned address (the kernel is not supported on ...)",
            "index 70 is out of bounds for dimension 0 with size 64",
            "division by zero"]


@pytest.mark.parametrize("text", REFUSALS)
def test_a_library_refusal_is_unsupported(text):
    assert is_unsupported(RuntimeError(text))


@pytest.mark.parametrize("text", FAILURES)
def test_a_kernel_failure_is_not_a_refusal(text):
    assert not is_unsupported(RuntimeError(text))


@pytest.mark.parametrize("dtype,stored", [("f32", np.float32), ("f16", np.float16), ("bf16", np.uint16)])
def test_the_probe_hands_the_kernel_zeros_stored_as_the_protocol_stores_its_dtype(dtype, stored):
    # A bf16 probe once got float32 zeros; a kernel reading them as bf16 bit patterns saw twice the head dims.
    p = Problem(dict(batch=2, heads_q=4, heads_kv=2, seq_q=3, seq_k=5, head_dim=8, head_dim_v=4, scale=0.5,
                     dtype=dtype, mask="none", mask_kind="none", mask_align="top-left", window_left=-1,
                     window_right=-1, diagonal_offset=0))
    seen = {}

    def call(q, k, v, prob):
        seen.update(q=q, k=k, v=v)

    def grad(q, k, v, o, lse, do, prob):
        seen.update(do=do)

    probe_on_zeros(p, call)
    probe_on_zeros(p, call, grad)
    shapes = {"q": (2, 3, 4, 8), "k": (2, 5, 2, 8), "v": (2, 5, 2, 4), "do": (2, 3, 4, 4)}
    for name, shape in shapes.items():
        assert seen[name].dtype == stored and seen[name].shape == shape and not seen[name].any(), name
