"""Must FAIL under pytest with the class mask and a replay command (tests/adapters runs it by path; its name
keeps a plain `pytest` run from collecting it)."""

from leaky_attention import leaky_attention


def test_leaky_attention(attnfuzz):
    attnfuzz.check(leaky_attention, masks=["none", "causal-br", "causal-tl"], fuzz_seconds=0)
