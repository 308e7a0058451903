"""Fake jax.lax: the bit cast of bf16 bit patterns."""

import numpy as np

from attnfuzz.dtypes import to_float32


def bitcast_convert_type(a, dtype):
    assert np.asarray(a).dtype == np.uint16 and dtype.__name__ == "bfloat16", "the adapters bit-cast bf16 only"
    return to_float32(a, "bf16")
