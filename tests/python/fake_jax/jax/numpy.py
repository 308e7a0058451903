"""Fake jax.numpy: arrays are float numpy arrays of the values (bf16 values held in float32)."""

import numpy as np

from attnfuzz.dtypes import round_to

float32, float16, int32 = np.float32, np.float16, np.int32


class bfloat16:  # noqa: N801 - the name jnp uses; a marker, values are held in float32
    pass


def asarray(a, dtype=None):
    a = np.asarray(a)
    if dtype is bfloat16:
        return round_to(a, "bf16").astype(np.float32)
    return a if dtype is None else a.astype(dtype)


repeat, pad = np.repeat, np.pad


def full(shape, value, dtype):
    return np.full(shape, value, dtype)
