"""What every library adapter shares, torch or JAX alike (numpy only): CUDA faults, probing a problem on zeros."""

import os
import sys

import numpy as np

from attnfuzz.dtypes import STORED

# Text of an error after which the CUDA context is unusable (PyTorch's RuntimeError, XLA's XlaRuntimeError).
_FATAL = ("illegal memory access", "CUDA error", "device-side assert", "misaligned address",
          "unspecified launch failure", "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED",
          "CUDA_ERROR_MISALIGNED_ADDRESS")


def fatal_cuda_error(e):
    """A CUDA fault leaves the context unusable: exit so attn-fuzz reports a crash and restarts us."""
    text = str(e)
    if any(s in text for s in _FATAL):
        print(f"attnfuzz adapter: fatal CUDA error, exiting: {text[:500]}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(70)


def cuda_guarded(fn):
    """fn, exiting the adapter on a fatal CUDA error (fatal_cuda_error) before the exception goes on."""
    def g(*a):
        try:
            return fn(*a)
        except RuntimeError as e:
            fatal_cuda_error(e)
            raise
    return g


# Text of a torch library refusing a configuration (a TORCH_CHECK on dtype, shape or head dim: SDPA's backend
# selection, the private flash / efficient ops of the dropout route, flex, varlen_attn), not a kernel failure.
_REFUSALS = ("No available kernel", "not supported", "Unsupported", "unsupported", "does not support", "must be",
             "Expected", "only support", "no kernel found", "must have shape")


def is_unsupported(e):
    """A torch library refusing a configuration (a refusal: the case is `unsupported`), not a kernel failure."""
    text = str(e)
    return not any(s in text for s in _FATAL) and any(s in text for s in _REFUSALS)


def c_strides(a):
    """numpy array a with C-order strides, also when it has no element: numpy gives many zero-size arrays strides of
    0 (np.empty((0, H, D)), a concatenation of empty rows), torch.from_numpy keeps them, and FlashAttention then
    refuses an empty packed K ("Input tensor must have contiguous last dimension"), which no caller's torch.empty
    would be."""
    a = np.asarray(a)
    if a.size:
        return a
    c = [a.itemsize] * a.ndim
    for i in range(a.ndim - 2, -1, -1):
        c[i] = c[i + 1] * a.shape[i + 1]
    return np.lib.stride_tricks.as_strided(a, a.shape, tuple(c))


def probe_on_zeros(p, call, grad=None):
    """Runs what the run of problem p runs, once on zero inputs of its shape: grad (the backward) when given, else
    call (the forward); raises as it does. A backward problem probes the backward alone: its run launches only the
    backward, and a forward error must not stop the probe before the backward's own refusal (JAX cuDNN: a forward
    sliding window with Sq > Sk fails to compile, the training call refuses odd lengths)."""
    # Zeros stored as the protocol stores the dtype (bf16: uint16 bit patterns): float32 zeros for a bf16 problem
    # read as bit patterns had twice the head dims (cuDNN then accepted Dv = 4 as 8 and refused the run itself).
    z = lambda s, h, d: np.zeros((p.batch, s, h, d), STORED.get(p.dtype, np.float32))
    q, k, v = z(p.seq_q, p.heads_q, p.head_dim), z(p.seq_k, p.heads_kv, p.head_dim), z(p.seq_k, p.heads_kv, p.head_dim_v)
    if grad is not None:
        grad(q, k, v, None, None, z(p.seq_q, p.heads_q, p.head_dim_v), p)
    else:
        call(q, k, v, p)


def problem_key(p):
    """What decides whether a library accepts a problem: its shape, mask, dtype, variants, pass and tunables."""
    return (p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_k, p.head_dim, p.head_dim_v, p.mask, p.dtype,
            tuple(p.variants), p.pass_name, tuple(sorted(p.tunables.items())))


def probed_supports(label, call, grad, refusal, declared=None):
    """A Kernel supports(p): None, or why the library refuses p. declared(p) states a limit the adapter declares
    (a reason or None) before anything runs; otherwise call (and grad, for a backward problem) run once on zeros per
    problem_key, and an exception that refusal(e) names (a reason string) is a refusal: the case is `unsupported`
    with the library's own words. Any other exception is not a refusal: the run then reports it as a launch-error."""
    seen = {}

    def supports(p):
        why = declared(p) if declared is not None else None
        if why:
            return why
        key = problem_key(p)
        if key not in seen:
            try:
                probe_on_zeros(p, call, grad if p.pass_name == "bwd" else None)
                seen[key] = None
            except Exception as e:  # noqa: BLE001 - classified: a refusal, or left to the run to report
                fatal_cuda_error(e)
                why = refusal(e)
                seen[key] = f"{label} refuses it: {why}" if why else None
        return seen[key]

    return supports


def parse_list(ap, text, allowed, what):
    """The comma-separated items of a command-line option, each one of allowed (else argparse's usage error, exit 2)."""
    items = [s for s in text.split(",") if s]
    for s in items:
        if s not in allowed:
            ap.error(f"unknown {what} {s!r} (" + ",".join(allowed) + ")")
    return items
