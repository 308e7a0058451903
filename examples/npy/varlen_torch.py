#!/usr/bin/env python3
"""varlen_torch.py - PyTorch outputs of a varlen / KV-cache / paged case emitted by attn-check, for --npy.

    attn-check --npy-emit vl --seq-layout varlen --seqlens-q 3,0,17 --seqlens-k 5,1,40 --mask causal-br --heads 4 --kv-heads 2
    python3 examples/npy/varlen_torch.py vl                 # FlexAttention, document block mask (CUDA if present)
    python3 examples/npy/varlen_torch.py vl --route sdpa    # one SDPA call per sequence
    attn-check --npy vl

Reads DIR/q.npy k.npy v.npy, the int32 arrays (cu_seqlens_q/k, seqused_k, block_table) and case.json, and
writes DIR/o.npy in q's layout ([total_q, Hq, Dv] packed, [B, Sq, Hq, Dv] dense), float32.
Routes: 'flex' packs every sequence into one [1, H, total, D] batch and masks with a FlexAttention block mask
(same sequence, the case's window aligned per sequence, keys below seqused_k); paged K/V are gathered through
the block table first (PyTorch has no paged kernel). 'sdpa' runs scaled_dot_product_attention per sequence
with an explicit boolean mask. Needs numpy and torch (2.5+ for FlexAttention).
"""
import argparse
import json
import os
import sys

import numpy as np
import torch


def load(d, name):
    p = os.path.join(d, name)
    return np.load(p) if os.path.exists(p) else None


def parse_mask(text):
    """(kind, left, right, bottom_right): kind none | window (causal = window inf, 0)."""
    br = not text.endswith("-tl")
    t = text[:-3] if text.endswith(("-tl", "-br")) else text
    if t == "none":
        return None, None, None, br
    if t == "causal":
        return "window", None, 0, br
    left, right = t[len("window:"):].split(",")
    side = lambda s: None if s == "inf" else int(s)
    return "window", side(left), side(right), br


def sequences(case, q, k, v, arrays):
    """Per sequence: (q [Sq, Hq, D], k [Sk, Hkv, D], v [Sk, Hkv, Dv]) in the case's lengths."""
    p = case["problem"]
    B = p["batch"]
    cu_q, cu_k, used, table = arrays
    out = []
    for b in range(B):
        qs = q[cu_q[b]:cu_q[b + 1]] if cu_q is not None else q[b]
        if table is not None:  # paged: gather the sequence's pages in order
            n = int(used[b])
            P = k.shape[1]
            pages = [int(table[b, j // P]) for j in range(0, n, P)]
            ks = np.concatenate([k[pg] for pg in pages], axis=0)[:n] if pages else k[:0, 0]
            vs = np.concatenate([v[pg] for pg in pages], axis=0)[:n] if pages else v[:0, 0]
        elif cu_k is not None:
            n = int(used[b]) if used is not None else int(cu_k[b + 1] - cu_k[b])
            ks, vs = k[cu_k[b]:cu_k[b] + n], v[cu_k[b]:cu_k[b] + n]
        else:
            n = int(used[b]) if used is not None else k.shape[1]
            ks, vs = k[b, :n], v[b, :n]
        out.append((qs, ks, vs))
    return out


def visible(mask, sq, sk):
    kind, left, right, br = mask
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    if kind is None:
        return np.ones((sq, sk), dtype=bool)
    c = i + (sk - sq if br else 0)
    ok = np.ones((sq, sk), dtype=bool)
    if left is not None:
        ok &= j >= c - left
    if right is not None:
        ok &= j <= c + right
    return ok


def run_sdpa(seqs, mask, scale, dev):
    outs = []
    for qs, ks, vs in seqs:
        sq, hq, dv = qs.shape[0], qs.shape[1], vs.shape[-1]
        if sq == 0:
            outs.append(np.zeros((0, hq, dv), np.float32))
            continue
        if ks.shape[0] == 0:
            outs.append(np.zeros((sq, hq, dv), np.float32))
            continue
        m = torch.from_numpy(visible(mask, sq, ks.shape[0])).to(dev)
        tq = torch.from_numpy(qs).to(dev).transpose(0, 1)[None]
        tk = torch.from_numpy(ks).to(dev).transpose(0, 1)[None]
        tv = torch.from_numpy(vs).to(dev).transpose(0, 1)[None]
        o = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=m, scale=scale,
                                                             enable_gqa=tq.shape[1] != tk.shape[1])
        o = torch.where(m.any(-1)[None, None, :, None], o, torch.zeros_like(o))  # fully masked rows: O = 0
        outs.append(o[0].transpose(0, 1).float().cpu().numpy())
    return outs


def run_flex(seqs, mask, scale, dev):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    lq = [s[0].shape[0] for s in seqs]
    lk = [s[1].shape[0] for s in seqs]
    hq, d, dv = seqs[0][0].shape[1], seqs[0][0].shape[2], seqs[0][2].shape[-1]
    hkv = seqs[0][1].shape[1]
    Q, K = sum(lq), max(1, sum(lk))
    q = np.concatenate([s[0] for s in seqs], 0)
    k = np.concatenate([s[1] for s in seqs] + [np.zeros((K - sum(lk), hkv, d), np.float32)], 0)
    v = np.concatenate([s[2] for s in seqs] + [np.zeros((K - sum(lk), hkv, dv), np.float32)], 0)
    doc_q = torch.tensor(np.repeat(np.arange(len(seqs)), lq), device=dev)
    doc_k = torch.tensor(np.concatenate([np.repeat(np.arange(len(seqs)), lk), np.full(K - sum(lk), -1)]), device=dev)
    off_q = torch.tensor(np.concatenate([[0], np.cumsum(lq)[:-1]]), device=dev)
    off_k = torch.tensor(np.concatenate([[0], np.cumsum(lk)[:-1]]), device=dev)
    len_q = torch.tensor(lq, device=dev)
    len_k = torch.tensor(lk, device=dev)
    kind, left, right, br = mask

    def mask_mod(b, h, qi, ki):
        dq = doc_q[qi]
        same = dq == doc_k[ki]
        i = qi - off_q[dq]
        j = ki - off_k[dq]
        ok = same
        if kind is not None:
            c = i + (len_k[dq] - len_q[dq] if br else 0)
            if left is not None:
                ok = ok & (j >= c - left)
            if right is not None:
                ok = ok & (j <= c + right)
        return ok

    bm = create_block_mask(mask_mod, 1, 1, Q, K, device=dev)
    to = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(dev).transpose(0, 1)[None]
    fa = torch.compile(flex_attention) if dev == "cuda" else flex_attention
    o = fa(to(q), to(k), to(v), block_mask=bm, scale=scale, enable_gqa=hq != hkv)
    o = o[0].transpose(0, 1).float().cpu().numpy()
    outs, at = [], 0
    for n in lq:
        outs.append(o[at:at + n])
        at += n
    return outs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--route", choices=["flex", "sdpa"], default="flex")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    meta = json.load(open(os.path.join(a.dir, "case.json")))
    if "sequence_case" not in meta:
        sys.exit("varlen_torch.py: %s was not emitted from a --seq-layout case" % a.dir)
    case = meta["sequence_case"]
    p = case["problem"]
    q, k, v = (np.nan_to_num(load(a.dir, n + ".npy"), nan=0.0) for n in "qkv")  # NaN marks the gaps
    arrays = tuple(load(a.dir, n + ".npy") for n in ("cu_seqlens_q", "cu_seqlens_k", "seqused_k", "block_table"))
    seqs = sequences(case, q, k, v, arrays)
    mask = parse_mask(p.get("mask", "none"))
    scale = float(p["scale"])
    with torch.no_grad():
        outs = (run_flex if a.route == "flex" else run_sdpa)(seqs, mask, scale, a.device)
    if arrays[0] is not None:
        o = np.concatenate(outs, 0)
    else:
        o = np.stack(outs, 0)
    np.save(os.path.join(a.dir, "o.npy"), o.astype(np.float32))
    print("wrote %s/o.npy %s (%s, %s)" % (a.dir, list(o.shape), a.route, a.device))


if __name__ == "__main__":
    main()
