"""Fake Pallas attention.mha: its argument checks and Triton's power-of-2 sizes; top-left causal."""

import numpy as np

import jax
from jax.nn import softmax_attention


class BlockSizes:
    def __init__(self, block_q, block_k, block_q_dkv=None, block_kv_dkv=None, block_q_dq=None, block_kv_dq=None):
        self.block_q, self.block_k = block_q, block_k
        self.backward = (block_q_dkv, block_kv_dkv, block_q_dq, block_kv_dq)


def mha(q, k, v, segment_ids, sm_scale=1.0, causal=False, block_sizes=None, interpret=False):
    jax.CALLS.append(("mha", dict(sm_scale=sm_scale, causal=causal, block_sizes=block_sizes, interpret=interpret)))
    T, S = np.shape(q)[1], np.shape(k)[1]
    if np.shape(q)[-1] != np.shape(k)[-1] or np.shape(q)[-1] != np.shape(v)[-1]:
        raise ValueError("This kernel expects q, k, and v to have the same head dimension")
    bq, bk = min(block_sizes.block_q, T), min(block_sizes.block_k, S)
    if T % bq:
        raise ValueError(f"q_seq_len={T} must be a multiple of block_q={bq}")
    if S % bk:
        raise ValueError(f"kv_seq_len={S} must be a multiple of block_k={bk}")
    for n in (bq, bk):
        if n & (n - 1):
            raise ValueError("The Pallas Triton lowering currently requires that all operations have array arguments "
                             f"and results whose size is a power of 2. Encountered an array of shape ({n},)")
    i, j = np.arange(T)[:, None], np.arange(S)[None, :]
    return softmax_attention(q, k, v, sm_scale, (j <= i) if causal else np.ones((T, S), bool))
