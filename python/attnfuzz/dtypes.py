"""Element types of the adapter protocol in numpy: f32 (float32), f16 (float16) and bf16, which numpy lacks,
carried as uint16 bit patterns (the upper 16 bits of a float32) and converted with bit shifts; fp8_e4m3 (OCP
e4m3fn: no Inf, NaN = S.1111.111, max 448) and fp8_e5m2 (IEEE-like, max 57344) as uint8 bit patterns.

    x = to_float32(q, "bf16")          # stored elements -> float32 values (exact for every dtype)
    o_bits = from_float32(o, "bf16")   # float32 values -> stored elements, round to nearest even
    p_c = round_to(p, "f16")           # values rounded to the dtype, as float64 (what a kernel storing p gets)
"""

import numpy as np

# numpy type of the stored elements of each protocol dtype (little-endian on the wire).
STORED = {"f32": np.dtype("<f4"), "f16": np.dtype("<f2"), "bf16": np.dtype("<u2"),
          "fp8_e4m3": np.dtype("u1"), "fp8_e5m2": np.dtype("u1")}
FP8 = ("fp8_e4m3", "fp8_e5m2")


def _fp8_values(dtype):
    """float64 value of each of the 256 codes (NaN codes NaN)."""
    e4 = dtype == "fp8_e4m3"
    mbits, bias, emax = (3, 7, 15) if e4 else (2, 15, 31)
    out = np.empty(256)
    for b in range(256):
        sign, e, m = b >> 7, (b >> mbits) & emax, b & ((1 << mbits) - 1)
        if (e4 and e == 15 and m == 7) or (not e4 and e == 31 and m):
            v = np.nan
        elif not e4 and e == 31:
            v = np.inf
        elif e == 0:
            v = m * 2.0 ** (1 - bias - mbits)
        else:
            v = (m | (1 << mbits)) * 2.0 ** (e - bias - mbits)
        out[b] = -v if sign else v
    return out


_FP8 = {d: _fp8_values(d) for d in FP8}


def fp8_bits_to_f32(bits, dtype):
    """uint8 fp8 bit patterns -> float32 (exact)."""
    return _FP8[dtype][np.asarray(bits, dtype=np.uint8)].astype(np.float32)


def f32_to_fp8_bits(a, dtype):
    """float -> uint8 fp8 bit patterns, round to nearest even, a finite overflow saturating to +-max (as
    cvt.rn.satfinite); +-inf -> +-inf in e5m2, +-max in e4m3 (no Inf); NaN -> the format's quiet NaN (0x7f
    e4m3, 0x7e e5m2)."""
    a = np.asarray(a, dtype=np.float64)
    table = _FP8[dtype]
    top = 0x7E if dtype == "fp8_e4m3" else 0x7B  # code of the largest finite value
    vals = table[:top + 1]                        # non-negative finite values, increasing with the code
    mag = np.minimum(np.abs(a), vals[-1])
    hi = np.clip(np.searchsorted(vals, mag), 0, top)
    lo = np.maximum(hi - 1, 0)
    dlo, dhi = mag - vals[lo], vals[hi] - mag
    code = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    if dtype == "fp8_e5m2":
        code = np.where(np.isinf(a), 0x7C, code)
    code = np.where(np.signbit(a), code | 0x80, code)
    code = np.where(np.isnan(a), 0x7F if dtype == "fp8_e4m3" else 0x7E, code)
    return code.astype(np.uint8)


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
    if dtype in FP8:
        return fp8_bits_to_f32(a, dtype)
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
    if dtype in FP8:
        return f32_to_fp8_bits(a32, dtype)
    raise ValueError(f"dtype {dtype!r} is not carried (f32, f16, bf16, fp8_e4m3, fp8_e5m2)")


def round_to(a, dtype):
    """Values rounded to dtype (through float32, as a kernel with fp32 registers stores them), as float64."""
    if dtype == "f32":
        return np.asarray(a, dtype=np.float32).astype(np.float64)
    return to_float32(from_float32(a, dtype), dtype).astype(np.float64)


def as_stored(x, shape, dtype, what, o_scale=1.0):
    """A kernel's result as stored elements of dtype with the given shape: float32 / float64 values are rounded
    to dtype (fp8: the stored element is fp8(value * o_scale)); float16 (f16), uint16 bit patterns (bf16) and
    uint8 bit patterns (fp8) are taken as they are."""
    a = np.asarray(x)
    if tuple(a.shape) != tuple(shape):
        raise ValueError(f"{what} has shape {tuple(a.shape)}, expected {tuple(shape)}")
    if a.dtype == STORED[dtype] and dtype != "f32":
        return a
    if a.dtype.kind not in "fiu":
        raise ValueError(f"{what} has numpy dtype {a.dtype}, expected floats")
    if dtype in FP8:
        return from_float32(a.astype(np.float64) * o_scale, dtype)
    return from_float32(a, dtype)
