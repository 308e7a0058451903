"""A user's attention kernel to test (here: numpy, blocked online softmax over keys, like a flash kernel)."""

import numpy as np


def blocked_attention(q, k, v, p, block=16):
    """O [B, Sq, Hq, Dv] of q, k, v float32 [B, S, H, D] under p.scale and p's mask (attnfuzz.Problem)."""
    B, Sq, Hq, _ = q.shape
    Hkv, Dv = k.shape[2], v.shape[3]
    o = np.zeros((B, Sq, Hq, Dv), np.float32)
    with np.errstate(all="ignore"):
        for b in range(B):
            for h in range(Hq):
                K, V = k[b, :, h // (Hq // Hkv)].astype(np.float64), v[b, :, h // (Hq // Hkv)].astype(np.float64)
                for i in range(Sq):
                    first, last = p.key_range(i)
                    m, l, acc = -np.inf, 0.0, np.zeros(Dv)
                    for t in range(first, last, block):
                        s = p.scale * (K[t:min(t + block, last)] @ q[b, i, h].astype(np.float64))
                        m_new = np.maximum(m, s.max())  # NaN propagates (builtin max(-inf, nan) is -inf)
                        if m_new == -np.inf:
                            continue
                        w = np.exp(s - m_new)
                        alpha = np.exp(m - m_new)
                        acc = acc * alpha + w @ V[t:min(t + block, last)]  # IEEE: 0 * NaN in v is NaN
                        l = l * alpha + w.sum()
                        m = m_new
                    o[b, i, h] = 0.0 if l == 0 else acc / l  # empty row: O = 0
    return o
