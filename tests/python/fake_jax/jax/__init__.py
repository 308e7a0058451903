"""A fake jax for tests/python/test_jax_adapters.py: the few calls the JAX adapters make, computed in float64 numpy with
JAX's documented semantics (top-left causal, local_window_size, GQA grouping) and its refusals, recording each call."""

import numpy as np

__version__ = "0.0-fake"
CALLS = []  # (function name, keyword arguments) of every library call, newest last

from jax import lax, nn, numpy  # noqa: E402,F401 - jax.lax, jax.nn, jax.numpy as the real package exposes them


class _Config:
    def __init__(self):
        self.values = {}

    def update(self, name, value):
        self.values[name] = value


config = _Config()


def default_backend():
    return "cpu"


TRAINING = []  # non-empty while vjp traces f: JAX's cuDNN call then takes its training checks


class JaxRuntimeError(RuntimeError):
    """What XLA raises when a compilation fails (jax.errors.JaxRuntimeError, a RuntimeError)."""


def vjp(f, *args):
    """(f(*args), pull): pull(ct) -> the gradients of <f, ct> by central differences (float64; tiny shapes only)."""
    args = [np.asarray(a, np.float64) for a in args]
    TRAINING.append(True)
    try:
        out = f(*args)
    finally:
        TRAINING.pop()

    def pull(ct):
        ct = np.asarray(ct, np.float64)
        grads = []
        for i, a in enumerate(args):
            g = np.zeros_like(a)
            for idx in np.ndindex(a.shape):
                hi, lo = [list(args) for _ in range(2)]
                for s, side in ((1e-4, hi), (-1e-4, lo)):
                    b = a.copy()
                    b[idx] += s
                    side[i] = b
                g[idx] = np.sum((np.asarray(f(*hi), np.float64) - np.asarray(f(*lo), np.float64)) * ct) / 2e-4
            grads.append(g)
        return tuple(grads)

    return out, pull
