"""Fake Pallas decode_attention.gqa: q [B, Hq, D], k / v [B, S, Hkv, D]; its asserts; keys in [start_idx, kv_seq_len)."""

import numpy as np

import jax
from jax.nn import softmax_attention


def gqa(q, k, v, start_idx=None, kv_seq_len=None, sm_scale=None, block_h=16, block_k=128, k_splits=16,
        interpret=False):
    jax.CALLS.append(("gqa", dict(start_idx=start_idx, kv_seq_len=kv_seq_len, sm_scale=sm_scale, k_splits=k_splits,
                                  block_k=block_k, interpret=interpret)))
    S = np.shape(k)[1]
    assert S % k_splits == 0, f"k_seq_len={S} must be divisible by k_splits={k_splits}"
    assert S // k_splits >= 16, f"k_seq_len={S} divided by k_splits={k_splits} must be >= 16."
    j = np.arange(S)[None, None, None, :]
    lo = 0 if start_idx is None else np.asarray(start_idx)[:, None, None, None]
    hi = S if kv_seq_len is None else np.asarray(kv_seq_len)[:, None, None, None]
    return softmax_attention(np.asarray(q)[:, None], k, v, sm_scale, (j >= lo) & (j < hi))[:, 0]
