"""How a kernel author adds attn-fuzz to a test suite: the attnfuzz fixture runs attn-check's edge-shape
sweep and a time-boxed attn-fuzz campaign on the callable; failures fail the test with their class,
evidence and replay command.

    PYTHONPATH=python ATTNFUZZ_BIN=build/bin python3 -m pytest examples/pytest
"""

from my_attention import blocked_attention


def test_blocked_attention_is_exact(attnfuzz):
    attnfuzz.check(blocked_attention, fuzz_seconds=20, max_seq=48, max_d=32)
