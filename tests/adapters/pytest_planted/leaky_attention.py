"""A planted bug for the pytest entry point's test: the causal mask lets one future key through."""

from attnfuzz.reference import attention


def leaky_attention(q, k, v, p):
    o, _ = attention(q, k, v, p, bug="mask-leak")
    return o
