"""A numpy reference attention (float64 inside) with the tool's semantics (docs/semantics.md): masks as key intervals
and, with custom masks (p.variants), the keys of the interval they show (problem.visible_all()); fully masked rows
O = 0 / LSE = -inf, masked positions never contribute.

Dtypes (p.dtype): f32 in and out; f16 / bf16 / fp8 (stored elements: float16, uint16 bf16 or uint8 fp8 bit
patterns; fp8 real values = stored * descale) are computed like a FlashAttention kernel in that dtype (FA3 for
fp8): exact scores, P = exp(s - max) rounded to the dtype before P.V (the row sum taken from the unrounded P,
in float64), O rounded once to the dtype on store (fp8: fp8(O * o_scale)); LSE float32.
(Rounding goes float64 -> float32 -> dtype: a double rounding that can differ from one rounding by one unit in
the last place of the dtype in rare ties, well inside the low-precision bound.) The backward is float32."""

import copy

import numpy as np

from attnfuzz.dtypes import round_to, to_float32


def _f64(a, dtype):
    return to_float32(a, dtype).astype(np.float64)


def _custom(p):
    """bool [B, Hq, Sq, Sk] of a problem with variants (None without: the interval path)."""
    return p.visible_all() if getattr(p, "variants", None) else None


class _Scores:
    """The score variants of problem p (docs/semantics.md "Variants"): final(raw, b, h, i, keys) is
    softcap(raw) + bias - slope |j - (i + off)|, dfinal(raw) the softcap's derivative, sink(h) the sink logit
    (-inf: none)."""

    def __init__(self, p):
        keep = p.dropout_keep() if hasattr(p, "dropout_keep") else None
        # dropout: the weight each kept P_ij is multiplied by (1 / (1 - p)), 0 where dropped; None without dropout
        self.drop = None if keep is None else keep / (1.0 - p.dropout_p)
        self.keep = keep
        self.cap = getattr(p, "softcap", 0.0)
        self.add = p.score_add() if hasattr(p, "score_add") else None
        if self.add is not None and getattr(p, "score_add_in_dtype", False) and p.dtype in ("f16", "bf16"):
            # the kernel takes ALiBi + bias as one term in the dtype (SDPA's float attn_mask): fp32 sum, rounded
            self.add = round_to(self.add.astype(np.float32), p.dtype)
        sinks = getattr(p, "sinks", None)
        self.sinks = None if sinks is None else np.asarray(sinks, np.float64)

    def final(self, raw, b, h, i, keys):
        s = self.cap * np.tanh(raw / self.cap) if self.cap > 0 else raw
        if self.add is not None:
            a = self.add
            s = s + a[min(b, a.shape[0] - 1), min(h, a.shape[1] - 1), i, keys]
        return s

    def dfinal(self, raw):
        return 1 - np.tanh(raw / self.cap) ** 2 if self.cap > 0 else 1.0

    def sink(self, h):
        return -np.inf if self.sinks is None else float(self.sinks[h])

    def weights(self, b, h, i, keys):
        """The dropout factors of row (b, h, i) at keys (1.0 without dropout)."""
        return 1.0 if self.drop is None else self.drop[b, h, i, keys]


def _shown(vis, b, h, i, first, last):
    """The keys of [first, last) the custom masks show for row (b, h, i)."""
    return first + np.nonzero(vis[b, h, i, first:last])[0]


def _fa2_window(p):
    """p with its window sides normalised as FlashAttention-2's set_params_fprop does (planted bug "fa2-window"): a
    side >= Sk becomes unbounded (-1), then an unbounded side facing a bounded one becomes Sk. Under bottom-right
    alignment with Sq > Sk that is another mask: window (0, unbounded) hides a row's last keys (flash-attention #895)."""
    left, right, sk = p.window_left, p.window_right, p.seq_k
    left, right = (-1 if left >= sk else left), (-1 if right >= sk else right)
    left = sk if left < 0 <= right else left
    right = sk if right < 0 <= left else right
    q = copy.copy(p)
    q.window_left, q.window_right = left, right
    return q


def attention(q, k, v, p, bug=None):
    """O [B, Sq, Hq, Dv] and LSE [B, Hq, Sq] float32 of problem p (attnfuzz.Problem); O holds values of p.dtype.

    bug (planted, for tests): "mask-leak" (one key past the window's right edge is visible),
    "missing-rescale" (tiles of 16 keys, accumulator not rescaled when the running max grows),
    "empty-row-nan" (a fully masked row gives 0/0 = NaN), "lse-error" (LSE in base 2), "empty-row-mean" (a
    fully masked row gives the mean of V over every key, as a softmax over all-equal masked scores does),
    "split-average" (the visible keys in p.tunables["num_splits"] contiguous splits, whose partial outputs are
    averaged instead of weighted by exp(lse_i - lse): exact at num_splits = 1), "scale-nan" (a scale <= 0 makes
    every output NaN, as a flash kernel that takes log2(scale) does), "sink-ignored" (the sinks accepted and
    not applied, as vLLM PR #52148's prefill kernel did), "softcap-ignored" (the softcap accepted and not applied),
    "fa2-window" (the window sides normalised as FlashAttention-2 does: _fa2_window),
    "short-seq-16x" (O 8x (f32) or 16x (f16, bf16) too large when Sk < 16, as jax's Pallas GPU mha was found to be),
    "headdim-repeat-16" (with D < 16 dividing 16, every score 16 / D times too large, as a head dimension padded to 16 by
    repeating its columns gives: jax's Pallas GPU gqa decode returned exactly that at D = 1 on an H100),
    "last-tile-dropped" (a row's keys in tiles of 16 from its first key; a last partial tile never loaded, so its
    keys reach neither O nor the sum),
    "kv-latent-rows" (kv-shared: V read from K's buffer as a
    contiguous [B, Sk, Hkv, Dv] tensor, its rows Hkv Dv elements apart instead of K's row stride, as ik_llama.cpp PR
    #2031's MLA decode stepped V)."""
    if bug == "fa2-window":
        p = _fa2_window(p)
    if bug == "kv-latent-rows" and "kv-shared" in getattr(p, "variants", ()):
        v = np.ascontiguousarray(k).reshape(-1)[:v.size].reshape(v.shape)
    B, Sq, Hq, _ = q.shape
    Hkv, Dv = k.shape[2], v.shape[3]
    group = Hq // Hkv
    dt = getattr(p, "dtype", "f32")
    lowp = dt != "f32"
    rp = (lambda x: round_to(x, dt)) if lowp else (lambda x: x)  # P as the kernel feeds it to P.V
    q64, k64, v64 = _f64(q, dt), _f64(k, dt), _f64(v, dt)
    if dt.startswith("fp8") and getattr(p, "q_descale_h", None) is not None:  # per-head: [B|1, H] per (b, head)
        q64 = q64 * np.asarray(p.q_descale_h, np.float64)[:, None, :, None]
        k64 = k64 * np.asarray(p.k_descale_h, np.float64)[:, None, :, None]
        v64 = v64 * np.asarray(p.v_descale_h, np.float64)[:, None, :, None]
    elif dt.startswith("fp8"):  # exact: an fp8 value has 4 significand bits, a descale at most 16
        q64, k64, v64 = q64 * p.q_descale, k64 * p.k_descale, v64 * p.v_descale
    o = np.zeros((B, Sq, Hq, Dv), dtype=np.float64)
    lse = np.full((B, Hq, Sq), -np.inf, dtype=np.float64)
    scale = float(p.scale)
    if bug == "headdim-repeat-16" and q.shape[3] < 16 and 16 % q.shape[3] == 0:
        scale *= 16 // q.shape[3]
    vis = _custom(p)
    sc = _Scores(p)
    if bug == "sink-ignored":
        sc.sinks = None
    if bug == "softcap-ignored":
        sc.cap = 0.0
    with np.errstate(all="ignore"):
        for b in range(B):
            for h in range(Hq):
                kh = h // group
                K, V = k64[b, :, kh, :], v64[b, :, kh, :]
                for i in range(Sq):
                    first, last = p.key_range(i)
                    if vis is not None:  # variants: only the keys the masks show, the final scores, the sink
                        keys = _shown(vis, b, h, i, first, last)
                        sink = sc.sink(h)
                        s = sc.final(scale * (K[keys] @ q64[b, i, h, :]), b, h, i, keys)
                        m = max(np.max(s) if keys.size else -np.inf, sink)
                        if m == -np.inf:
                            continue
                        e = np.exp(s - m)
                        l = e.sum() + np.exp(sink - m)  # the sink enters the denominator only
                        if keys.size:
                            o[b, i, h, :] = ((rp(e) * sc.weights(b, h, i, keys)) @ V[keys]) / l
                        lse[b, h, i] = m + np.log(l)
                        continue
                    if bug == "mask-leak" and last < p.seq_k and last > first:
                        last += 1
                    if bug == "last-tile-dropped" and last - first > 16:
                        last = first + (last - first) // 16 * 16
                    if last <= first:
                        if bug == "empty-row-nan":
                            o[b, i, h, :] = np.nan
                        if bug == "empty-row-mean" and p.seq_k > 0:
                            o[b, i, h, :] = V.mean(axis=0)
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
                            acc = acc + rp(pt) @ V[first + t:first + t + 16]  # BUG: acc not rescaled
                            mrun = mnew
                        o[b, i, h, :] = acc / l
                        lse[b, h, i] = mrun + np.log(l)
                        continue
                    splits = p.tunables.get("num_splits", 1) if bug == "split-average" else 1
                    if splits > 1 and last - first > 1:
                        parts = [c for c in np.array_split(np.arange(last - first), splits) if len(c)]
                        outs, lses = [], []
                        for c in parts:
                            mc = np.max(s[c])
                            ec = np.exp(s[c] - mc)
                            outs.append((rp(ec) @ V[first + c]) / ec.sum())
                            lses.append(mc + np.log(ec.sum()))
                        o[b, i, h, :] = np.mean(outs, axis=0)  # BUG: not weighted by exp(lse_i - lse)
                        mx = max(lses)
                        lse[b, h, i] = mx + np.log(np.sum(np.exp(np.array(lses) - mx)))
                        continue
                    e = np.exp(s - m)
                    l = e.sum()
                    # Every visible key takes part, IEEE: a zero weight (underflow or a -inf score) times a
                    # NaN / inf in v is NaN, as the oracle says (attn-props and attn-fuzz found both).
                    o[b, i, h, :] = (rp(e) @ V[first:last]) / l
                    lse[b, h, i] = m + np.log(l)
    if bug == "short-seq-16x" and 0 < p.seq_k < 16:  # as Pallas mha on sequences shorter than its 16-key block
        o = o * (8.0 if dt == "f32" else 16.0)
    if bug == "lse-error":
        lse = lse * np.log2(np.e)
    if bug == "scale-nan" and not scale > 0:
        o[:], lse[:] = np.nan, np.nan
    if dt.startswith("fp8"):  # the real O the stored fp8(O * o_scale) holds (o_scale a power of two: exact)
        o32 = (round_to(o * p.o_scale, dt) / p.o_scale).astype(np.float32)
    else:
        o32 = round_to(o, dt).astype(np.float32) if lowp else o.astype(np.float32)
    if sc.keep is not None:  # dropout: the mask it used goes back with the result (PROTOCOL.md "Dropout")
        return o32, lse.astype(np.float32), {"dropout_mask": sc.keep}
    return o32, lse.astype(np.float32)


def attention_backward(q, k, v, do, p, o=None, lse=None, bug=None):
    """dQ [B, Sq, Hq, D], dK [B, Sk, Hkv, D], dV [B, Sk, Hkv, Dv] float32 of problem p for output gradient do
    (float64 inside; inputs of p.dtype are widened, the gradients are not rounded to it). o and lse are the
    forward the backward is given (default: attention(q, k, v, p)).
    P = exp(scale q.k - LSE) on visible keys only; Delta_i = dO_i . O_i; dS = P (dP - Delta); a fully masked
    row (LSE = -inf) contributes nothing; GQA sums dK / dV over the query heads of a group.
    Score variants (p.variants): P from the final scores, dS_f = P (dP - Delta) summed into d bias over the
    bias's broadcast dimensions, dS = dS_f softcap'(raw) into dQ and dK, d sink_h = -sum_(b, i) exp(sink_h - LSE)
    Delta; then the result is (dQ, dK, dV, {"dsinks": [Hq], "dbias": the bias's shape}) (the keys present).
    bug (planted, for tests): "bwd-mask-leak" (P recomputed for every key: the mask is not re-applied);
    "bwd-align-tl" (causal-br computed as causal-tl, forward recomputed and backward: SDPA's efficient route with
    causal_lower_right and Sq > Sk did that in its backward on an H200, examples/h200-campaigns); "bwd-lse-tl"
    (causal-br's backward given the forward of causal-tl: the O and LSE of a forward recomputed top-left, the mask
    bottom-right; SDPA's efficient lower-right f16 backward returned exactly that on a 3x2 case on an H100,
    examples/h100-campaigns-s20); "bwd-empty-all-keys" (a row that sees no key attends to every key: P the softmax
    over all Sk keys; SDPA's cuDNN lower-right f16 backward returned dV within 0.4% of that on an H100,
    examples/h100-campaigns-s22)."""
    if bug in ("bwd-align-tl", "bwd-lse-tl") and p.mask == "causal-br":
        tl = copy.copy(p)
        tl.mask, tl.mask_align, tl.diagonal_offset = "causal-tl", "top-left", 0
        if bug == "bwd-align-tl":
            return attention_backward(q, k, v, do, tl)
        o, lse = attention(q, k, v, tl)[:2]
    if o is None or lse is None:
        o, lse = attention(q, k, v, p)[:2]
    B, Sq, Hq, D = q.shape
    Sk, Hkv, Dv = k.shape[1], k.shape[2], v.shape[3]
    group = Hq // Hkv
    dt = getattr(p, "dtype", "f32")
    q64, k64, v64, do64, o64 = (_f64(x, dt) for x in (q, k, v, do, o))
    lse64 = np.asarray(lse, dtype=np.float64)
    dq = np.zeros((B, Sq, Hq, D))
    dk = np.zeros((B, Sk, Hkv, D))
    dv = np.zeros((B, Sk, Hkv, Dv))
    scale = float(p.scale)
    if bug == "headdim-repeat-16" and q.shape[3] < 16 and 16 % q.shape[3] == 0:
        scale *= 16 // q.shape[3]
    vis = _custom(p)
    sc = _Scores(p)
    bias = getattr(p, "bias", None)
    dbias = None if bias is None else np.zeros(np.shape(bias))
    dsinks = None if sc.sinks is None else np.zeros(Hq)
    with np.errstate(all="ignore"):
        for b in range(B):
            for h in range(Hq):
                kh = h // group
                K, V = k64[b, :, kh, :], v64[b, :, kh, :]
                for i in range(Sq):
                    first, last = p.key_range(i)
                    lse_i = lse64[b, h, i]
                    if bug == "bwd-empty-all-keys" and vis is None and Sk > 0 and (last <= first or lse_i == -np.inf):
                        every = scale * (K @ q64[b, i, h, :])
                        first, last, lse_i = 0, Sk, every.max() + np.log(np.exp(every - every.max()).sum())
                    if lse_i == -np.inf:
                        continue
                    dov = do64[b, i, h, :]
                    delta = dov @ o64[b, i, h, :]
                    if dsinks is not None and sc.sink(h) > -np.inf:
                        dsinks[h] -= np.exp(sc.sink(h) - lse_i) * delta
                    if last <= first:
                        continue
                    if bug == "bwd-mask-leak":
                        first, last = 0, p.seq_k
                    keys = np.arange(first, last) if vis is None or bug == "bwd-mask-leak" else \
                        _shown(vis, b, h, i, first, last)
                    raw = scale * (K[keys] @ q64[b, i, h, :])
                    pr = np.exp(sc.final(raw, b, h, i, keys) - lse_i)
                    w = sc.weights(b, h, i, keys)  # dropout: dV sees the dropped P, dP the dropped dO.V
                    dv[b, keys, kh, :] += np.outer(pr * w, dov)
                    dp = (V[keys] @ dov) * w
                    ds = pr * (dp - delta)
                    if dbias is not None:  # summed over the bias's broadcast dimensions (size 1)
                        nb, nh, ni, nj = dbias.shape
                        np.add.at(dbias[min(b, nb - 1), min(h, nh - 1), min(i, ni - 1)],
                                  keys if nj > 1 else np.zeros(keys.size, int), ds)
                    ds = ds * sc.dfinal(raw)
                    dq[b, i, h, :] = scale * (ds @ K[keys])
                    dk[b, keys, kh, :] += scale * np.outer(ds, q64[b, i, h, :])
    grads = dq.astype(np.float32), dk.astype(np.float32), dv.astype(np.float32)
    extra = {n: g.astype(np.float32) for n, g in (("dsinks", dsinks), ("dbias", dbias)) if g is not None}
    if sc.keep is not None:
        extra["dropout_mask"] = sc.keep
    return grads + (extra,) if extra else grads
