"""Fake jax.nn.dot_product_attention: JAX's semantics and cuDNN's refusals; a row without keys gets O = 0 (and, with
return_residual, LSE = -inf: the residual is the natural-log logsumexp of the scaled, biased scores, [B, T, N])."""

import numpy as np

import jax


def softmax_attention(q, k, v, scale, visible, bias=None, residual=False):
    """q [B, T, N, H], k / v [B, S, K, H] (N % K == 0, head n reads kv head n // (N / K)), visible bool broadcastable
    to [B, N, T, S]; float64 O [B, T, N, H] (residual: and the logsumexp [B, T, N])."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    g = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    s = np.einsum("btnh,bsnh->bnts", q, k) * scale
    if bias is not None:
        s = s + np.asarray(bias, np.float64)
    vis = np.broadcast_to(visible, s.shape)
    s = np.where(vis, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    e = np.where(vis, np.exp(s - np.where(np.isfinite(m), m, 0)), 0.0)
    w = e / np.maximum(e.sum(-1, keepdims=True), 1e-300)
    o = np.einsum("bnts,bsnh->btnh", w, v)
    if not residual:
        return o
    with np.errstate(divide="ignore"):
        lse = np.where(np.isfinite(m[..., 0]), m[..., 0], -np.inf) + np.log(e.sum(-1))
    return o, lse.transpose(0, 2, 1)


def dot_product_attention(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
                          query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None,
                          implementation=None, return_residual=False):
    jax.CALLS.append(("dot_product_attention", dict(bias=bias, mask=mask, scale=scale, is_causal=is_causal,
                                                    local_window_size=local_window_size,
                                                    implementation=implementation, dtype=np.asarray(query).dtype)))
    if np.shape(key) != np.shape(value):
        raise ValueError(f"value shape should be {np.shape(key)}: but got {np.shape(value)}")
    B, T, N, H = np.shape(query)
    S = np.shape(key)[1]
    if implementation == "cudnn":
        if H % 8 or H > 256:
            raise NotImplementedError(f"The head dim must be <= 256 and a multiple of 8, but got {H}.")
        # jax 0.11 check_is_flash_attention in the training (vjp) call: "is_training and has_bias and odd T or S",
        # where has_bias is always true (a None bias becomes an empty placeholder array before the check)
        if jax.TRAINING and (T % 2 or S % 2):
            raise NotImplementedError(f"Unsupported sequence length Q {T}, KV {S}.")
        if local_window_size is not None and local_window_size[1] != 0 and not is_causal:
            raise ValueError(f"cuDNN doesn't support right window: {local_window_size[1]} when causal mask is not used.")
        if local_window_size is not None and T > S:  # cuDNN frontend's graph validation, at XLA's compile
            raise jax.JaxRuntimeError("INTERNAL: Sliding window attention is only supported with max_s_q <= "
                                      "max_s_kv. in external/xla+/xla/stream_executor/cuda/cuda_dnn.cc(6893): "
                                      "'graph_.validate()'")
    i, j = np.arange(T)[:, None], np.arange(S)[None, :]
    vis = np.ones((1, 1, T, S), bool)
    if mask is not None:
        vis = vis & np.asarray(mask, bool)
    if is_causal:
        vis = vis & (j <= i)
    if local_window_size is not None:
        left, right = local_window_size
        vis = vis & (i <= j + left) & (i >= j - right)
    scale = 1.0 / np.sqrt(H) if scale is None else scale
    return softmax_attention(query, key, value, scale, vis, bias, return_residual)
