"""A numpy reference attention (fp32 in and out, float64 inside) with the spec's semantics (DESIGN.md):
masks as key intervals, fully masked rows O = 0 / LSE = -inf, masked positions never contribute."""

import numpy as np


def attention(q, k, v, p, bug=None):
    """O [B, Sq, Hq, Dv] float32 and LSE [B, Hq, Sq] float32 of problem p (attnfuzz.Problem).

    bug (planted, for tests): "mask-leak" (one key past the window's right edge is visible),
    "missing-rescale" (tiles of 16 keys, accumulator not rescaled when the running max grows),
    "empty-row-nan" (a fully masked row gives 0/0 = NaN), "lse-error" (LSE in base 2)."""
    B, Sq, Hq, _ = q.shape
    Hkv, Dv = k.shape[2], v.shape[3]
    group = Hq // Hkv
    q64, k64, v64 = q.astype(np.float64), k.astype(np.float64), v.astype(np.float64)
    o = np.zeros((B, Sq, Hq, Dv), dtype=np.float64)
    lse = np.full((B, Hq, Sq), -np.inf, dtype=np.float64)
    scale = float(p.scale)
    with np.errstate(all="ignore"):
        for b in range(B):
            for h in range(Hq):
                kh = h // group
                K, V = k64[b, :, kh, :], v64[b, :, kh, :]
                for i in range(Sq):
                    first, last = p.key_range(i)
                    if bug == "mask-leak" and last < p.seq_k and last > first:
                        last += 1
                    if last <= first:
                        if bug == "empty-row-nan":
                            o[b, i, h, :] = np.nan
                        continue
                    s = scale * (K[first:last] @ q64[b, i, h, :])
                    m = np.max(s)
                    if m == -np.inf:  # every visible score -inf: weight 0 everywhere
                        if bug == "empty-row-nan":
                            o[b, i, h, :] = np.nan
                        continue
                    if bug == "missing-rescale":
                        acc, l, mrun = np.zeros(Dv), 0.0, -np.inf
                        for t in range(0, last - first, 16):
                            st = s[t:t + 16]
                            mnew = max(mrun, np.max(st))
                            pt = np.exp(st - mnew)
                            l = l * np.exp(mrun - mnew) + pt.sum()
                            acc = acc + pt @ V[first + t:first + t + 16]  # BUG: acc not rescaled
                            mrun = mnew
                        o[b, i, h, :] = acc / l
                        lse[b, h, i] = mrun + np.log(l)
                        continue
                    e = np.exp(s - m)
                    l = e.sum()
                    # Every visible key takes part, IEEE: a zero weight (underflow or a -inf score) times a
                    # NaN / inf in v is NaN, as the oracle says (attn-props and attn-fuzz found both).
                    o[b, i, h, :] = (e @ V[first:last]) / l
                    lse[b, h, i] = m + np.log(l)
    if bug == "lse-error":
        lse = lse * np.log2(np.e)
    return o.astype(np.float32), lse.astype(np.float32)
