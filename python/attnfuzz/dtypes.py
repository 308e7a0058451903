"""Element types of the adapter protocol in numpy: f32 (float32), f16 (float16) and bf16, which numpy lacks,
carried as uint16 bit patterns (the upper 16 bits of a float32) and converted with bit shifts.

    x = to_float32(q, "bf16")          # stored elements -> float32 values (exact for every dtype)
    o_bits = from_float32(o, "bf16")   # float32 values -> stored elements, round to nearest even
    p_c = round_to(p, "f16")           # values rounded to the dtype, as float64 (what a kernel storing p gets)
"""

import numpy as np

# numpy type of the stored elements of each protocol dtype (little-endian on the wire).
STORED = {"f32": np.dtype("<f4"), "f16": np.dtype("<f2"), "bf16": np.dtype("<u2")}


def bf16_bits_to_f32(bits):
    """uint16 bf16 bit patterns -> float32 (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(a):
    """float32 -> uint16 bf16 bit patterns, round to nearest even; overflow -> +-inf; NaN stays a (quiet) NaN
    with its sign."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    r = np.where(nan, (u >> 16) | 0x40, r)
    return r.astype(np.uint16)


def to_float32(a, dtype):
    """Stored elements of dtype -> float32 values (every f16 / bf16 value is a float32 value)."""
    if dtype == "bf16":
        return bf16_bits_to_f32(a)
    return np.asarray(a).astype(np.float32)


def from_float32(a, dtype):
    """Values (any float array) -> stored elements of dtype, each rounded once to nearest even from float32
    (a float64 input is rounded to float32 first)."""
    a32 = np.asarray(a, dtype=np.float32)
    if dtype == "f32":
        return a32
    if dtype == "f16":
        return a32.astype(np.float16)
    if dtype == "bf16":
        return f32_to_bf16_bits(a32)
    raise ValueError(f"dtype {dtype!r} is not carried (f32, f16, bf16)")


def round_to(a, dtype):
    """Values rounded to dtype (through float32, as a kernel with fp32 registers stores them), as float64."""
    if dtype == "f32":
        return np.asarray(a, dtype=np.float32).astype(np.float64)
    return to_float32(from_float32(a, dtype), dtype).astype(np.float64)


def as_stored(x, shape, dtype, what):
    """A kernel's result as stored elements of dtype with the given shape: float32 / float64 values are rounded
    to dtype; float16 (f16) and uint16 bit patterns (bf16) are taken as they are."""
    a = np.asarray(x)
    if tuple(a.shape) != tuple(shape):
        raise ValueError(f"{what} has shape {tuple(a.shape)}, expected {tuple(shape)}")
    if dtype == "bf16" and a.dtype == np.uint16:
        return a
    if dtype == "f16" and a.dtype == np.float16:
        return a
    if a.dtype.kind not in "fiu":
        raise ValueError(f"{what} has numpy dtype {a.dtype}, expected floats")
    return from_float32(a, dtype)
