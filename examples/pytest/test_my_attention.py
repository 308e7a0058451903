"""How a kernel author adds attn-fuzz to a test suite: the attnfuzz fixture runs attn-check's edge-shape
sweep and a time-boxed attn-fuzz campaign on the callable; failures fail the test with their class,
evidence and replay command.

    PYTHONPATH=python ATTNFUZZ_BIN=build/bin python3 -m pytest examples/pytest
"""

from my_attention import blocked_attention


def test_blocked_attention_is_exact(attnfuzz):
    attnfuzz.check(blocked_attention, fuzz_seconds=20, max_seq=48, max_d=32)


def test_blocked_attention_in_f16(attnfuzz):
    # q, k, v arrive as numpy float16; the float32 O it returns is rounded to f16 on the way back and judged
    # with the f16 bound. (bf16 would arrive as uint16 bit patterns: attnfuzz.dtypes.to_float32 converts.)
    attnfuzz.check(blocked_attention, dtypes=["f16"], fuzz_seconds=0)
