"""A module-level forward and backward for tests/adapters: served by attnfuzz.adapters.callable --backward."""

from attnfuzz.reference import attention, attention_backward


def attention_fwd(q, k, v, p):
    return attention(q, k, v, p)[0]


def attention_bwd(q, k, v, o, lse, do, p):
    return attention_backward(q, k, v, do, p, o=o, lse=lse)
