"""attnfuzz.adapters._common: which library errors are refusals (the case `unsupported`), which are not."""

import pytest

from attnfuzz.adapters._common import is_unsupported

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
