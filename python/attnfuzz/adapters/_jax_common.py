"""What the JAX adapters share: starting JAX for a fuzzer, JAX's refusals, and the glue of their library calls."""

import os

REFUSED_TYPES = (ValueError, NotImplementedError, AssertionError)  # how JAX, cuDNN's and Pallas's checks refuse
REFUSED_TEXT = ("Unsupported", "unsupported", "not supported", "NOT_SUPPORTED", "No valid engine", "does not support",
                "UNIMPLEMENTED", "out of resource", "OutOfResources",  # these two: Triton's shared memory limit
                "is only supported with")  # cuDNN frontend's graph validation, raised through XLA as INTERNAL
# ("Sliding window attention is only supported with max_s_q <= max_s_kv."), at compile time of the first call
DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def start_jax():
    """Imports jax for an adapter and returns it: no 75 % preallocation of the GPU (other processes share it) and f32
    matmuls in f32 (no TF32), as the library calls below also say."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    jax.config.update("jax_default_matmul_precision", "highest")
    return jax


def has_gpu(jax):
    try:
        return jax.default_backend() == "gpu"
    except RuntimeError:
        return False


def refusal(e):
    """The library's reason when exception e is a refusal of the problem (an argument check: ValueError,
    NotImplementedError, AssertionError; or cuDNN / XLA saying unsupported), else None (a failure to report)."""
    text = str(e).strip().splitlines()
    first = text[0][:200] if text else ""
    if isinstance(e, REFUSED_TYPES) or any(s in str(e) for s in REFUSED_TEXT):
        return f"{type(e).__name__}: {first}" if first else type(e).__name__
    return None


def repro_call(dtype, imports, attn_lines, arrays, pass_name, extra=(), lse=False):
    """A repro.Call (attnfuzz/repro.py) of a JAX library call: attn_lines define attn(Q, K, V, *extra), jax arrays
    [B, S, H, D] -> O [B, Sq, Hq, Dv] (lse: (O, the logsumexp residual [B, Sq, Hq]), returned as LSE [B, Hq, Sq]);
    around them the glue the adapter runs (stored elements to jax bit for bit, O back
    as float32 values; the backward through jax.vjp of the same call). extra: names of arrays(float32) that are
    differentiable inputs too (the bias): the backward returns their gradients as {"d<name>": ...}."""
    from attnfuzz import repro
    glue = ['jax.config.update("jax_default_matmul_precision", "highest")  # f32 means f32 (no TF32)',
            f"DT, EXTRA = jnp.{DTYPES[dtype]}, tuple(jnp.asarray(x[n]) for n in {tuple(extra)!r})",
            "def t(a):  # stored elements (bf16: uint16 bit patterns) -> a jax array of DT, bit for bit",
            "    a = np.asarray(a)",
            "    return jax.lax.bitcast_convert_type(jnp.asarray(a), DT) if a.dtype == np.uint16 else jnp.asarray(a, DT)",
            "f32 = lambda a: np.asarray(jnp.asarray(a).astype(jnp.float32))"]
    if pass_name == "bwd":
        run = ["def call_bwd(q, k, v, o, lse, do):",
               "    g = jax.vjp(" + ("lambda *a: attn(*a)[0]" if lse else "attn") + ", t(q), t(k), t(v), *EXTRA)[1](t(do))",
               f"    return tuple(f32(a) for a in g[:3]) + (({{'d' + n: f32(a) for n, a in zip({tuple(extra)!r}, g[3:])}},)"
               " if EXTRA else ())"]
    elif lse:
        run = ["def call(q, k, v):  # O, and the residual [B, Sq, Hq] as LSE [B, Hq, Sq]",
               "    o, res = attn(t(q), t(k), t(v), *EXTRA)",
               "    return f32(o), f32(res).transpose(0, 2, 1)"]
    else:
        run = ["def call(q, k, v):", "    return f32(attn(t(q), t(k), t(v), *EXTRA))"]
    return repro.Call(["import jax", "import jax.numpy as jnp"] + list(imports), glue + list(attn_lines) + run, arrays)
