"""The adapter side of adapters/PROTOCOL.md: wrap any attention callable and serve it to attn-check / attn-fuzz.

    from attnfuzz import Kernel, serve
    def my_attention(q, k, v, problem):          # numpy [B, S, H, D] in, O [B, Sq, Hq, Dv] out
        ...
    serve([Kernel("mine", my_attention, masks=["none", "causal-br"], dtypes=["f32", "f16", "bf16"])])

Pure Python + numpy. A kernel returns O, or (O, LSE) when declared with lse=True (LSE [B, Hq, Sq], natural
log, float32 in every dtype). Anything it raises is sent back as an error (the tool reports a launch-error and
keeps going); a kernel that cannot run a problem says so in supports() (declared with check=True), not by
raising.

dtypes (problem.dtype): q, k, v arrive as the stored elements - float32 (f32), float16 (f16), uint16 bit
patterns (bf16: numpy has no bfloat16) or uint8 bit patterns (fp8_e4m3, fp8_e5m2: the real value is stored *
problem.q_descale etc.); attnfuzz.dtypes.to_float32 / from_float32 convert. O may be returned as float32
values (rounded here to the dtype, to nearest even, as a kernel's store does; fp8: fp8(O * problem.o_scale),
saturating), or already stored (float16, uint16 bits, uint8 bits).

Backward (Kernel(..., backward=fn)): fn(q, k, v, o, lse, do, problem) -> (dQ, dK, dV), same conventions; o,
lse are the forward the tool gives (the exact one for --pass bwd, the kernel's own for --pass fwdbwd).
Its dtypes: backward_dtypes (default: the kernel's f32 / f16 / bf16).
attnfuzz.adapters._torch_common.torch_backward(forward, device) builds one from a torch forward.
"""

import json
import os
import struct
import sys
import traceback

import numpy as np

from attnfuzz.dtypes import STORED, as_stored

PROTOCOL_VERSION = 1
ALL_MASKS = ("none", "causal-tl", "causal-br", "window-tl", "window-br")
# bf16 travels as uint16 bit patterns; masks as u8; a repro run's expected values and bounds as f64
_DTYPES = dict(STORED, u8=np.dtype("u1"), f64=np.dtype("<f8"), i32=np.dtype("<i4"))  # i32: sequence arrays
MASK_VARIANTS = ("mask-dense", "mask-bits", "block-sparse")
SCORE_VARIANTS = ("sink", "softcap", "alibi", "bias")  # PROTOCOL.md "Variants"
# The variants a kernel may declare: score variants, custom masks, per-head fp8 descales (PROTOCOL.md "Per-head
# descales"), dropout (PROTOCOL.md "Dropout": the mask comes back) and MLA's shared K/V latent (PROTOCOL.md "Shared
# K/V latent": no v tensor, V is the view k[..., :Dv]).
VARIANTS = SCORE_VARIANTS + MASK_VARIANTS + ("head-descale", "dropout", "kv-shared")
# The sequence layouts a kernel may take, and "layout-variants": its sinks / softcap / ALiBi apply on them too
# (PROTOCOL.md "Sequence layouts"; sequences.per_sequence hands each sequence's problem the sinks and slopes).
FEATURES = ("q-packed", "kv-packed", "seqused-k", "layout-variants")


class ProtocolError(Exception):
    """The peer broke the framing; the stream cannot be trusted any more."""


class Problem:
    """One attention problem as the tool sent it (PROTOCOL.md "problem")."""

    def __init__(self, d):
        self.raw = d
        self.batch = int(d["batch"])
        self.heads_q = int(d["heads_q"])
        self.heads_kv = int(d["heads_kv"])
        self.seq_q = int(d["seq_q"])
        self.seq_k = int(d["seq_k"])
        self.head_dim = int(d["head_dim"])
        self.head_dim_v = int(d["head_dim_v"])
        self.scale = float(np.float32(d["scale"]))
        self.dtype = d["dtype"]
        self.mask = d["mask"]                  # "none", "causal-br", "window:3,inf-tl", ...
        self.mask_kind = d["mask_kind"]        # "none" | "causal" | "window"
        self.mask_align = d["mask_align"]      # "top-left" | "bottom-right"
        self.window_left = int(d["window_left"])    # -1 = unbounded (causal and none normalised)
        self.window_right = int(d["window_right"])
        self.diagonal_offset = int(d["diagonal_offset"])  # 0 top-left, Sk - Sq bottom-right
        # fp8: real q/k/v = stored * descale, stored O = fp8(O * o_scale); 1.0 for every other dtype.
        self.q_descale = float(d.get("q_descale", 1.0))
        self.k_descale = float(d.get("k_descale", 1.0))
        self.v_descale = float(d.get("v_descale", 1.0))
        self.o_scale = float(d.get("o_scale", 1.0))
        # The kernel's declared tunables (Kernel(tunables=...)), name -> the value this run uses; {} if none.
        self.tunables = {str(k): int(v) for k, v in d.get("tunables", {}).items()}
        # Custom masks (PROTOCOL.md "Custom masks"): the variants this run uses and, set by serve() from the run's
        # tensors, custom_mask u8 [B|1, Hq|1, Sq|1, Sk or ceil(Sk / 8)] and block_mask u8 [B|1, Hq|1, nQ|1, nK].
        self.variants = list(d.get("variants", []))
        self.block_q, self.block_k = (int(x) for x in d.get("block_size", [0, 0]))
        self.custom_mask = None
        self.block_mask = None
        # Score variants (PROTOCOL.md "Variants"; docs/semantics.md "Variants"): softcap (0 = none) from the problem;
        # set by serve() from the run's tensors: sinks f32 [Hq], alibi_slopes f32 [Hq], bias f32 [B|1, Hq|1, Sq|1,
        # Sk|1] (a broadcast dimension has size 1); None where the run does not use the variant.
        self.softcap = float(d.get("softcap", 0.0)) if "softcap" in self.variants else 0.0
        self.sinks = self.alibi_slopes = self.bias = None
        self.pass_name = d.get("pass", "fwd")  # "fwd" | "bwd": the pass of the run, or of the check asked for
        # Dropout (PROTOCOL.md "Dropout"): probability, seed and counter offset; 0.0 / 0 / 0 without dropout.
        self.dropout_p = float(d.get("dropout_p", 0.0))
        self.dropout_seed = int(d.get("dropout_seed", 0))
        self.dropout_offset = int(d.get("dropout_offset", 0))
        # Per-head fp8 descales (variant head-descale), set by serve(): float32 q_descale_h [B|1, Hq], k_descale_h and
        # v_descale_h [B|1, Hkv] (a batch of 1 = the same for every batch), replacing q/k/v_descale; else None.
        self.q_descale_h = self.k_descale_h = self.v_descale_h = None
        # Sequence layouts (PROTOCOL.md "Sequence layouts"; attnfuzz/sequences.py): "dense" or "packed" ([total, H,
        # D] rows), the packed totals, and, set by serve(), cu_seqlens_q / _k int32 [B + 1] and seqused_k int32 [B]
        # (None where absent). seq_q / seq_k are then the largest per-sequence lengths.
        self.q_layout = d.get("q_layout", "dense")
        self.kv_layout = d.get("kv_layout", "dense")
        self.total_q, self.total_k = int(d.get("total_q", 0)), int(d.get("total_k", 0))
        self.cu_seqlens_q = self.cu_seqlens_k = self.seqused_k = None

    @classmethod
    def from_run(cls, d, tensors):
        """The problem of a run message: its "problem" dict with the variants' tensors (a {name: array} mapping, as
        split_tensors gives them, or an .npz a bug-report script loads) set as attributes."""
        p = cls(d)
        get = lambda n: tensors[n] if n in tensors else None
        p.custom_mask, p.block_mask = get("custom_mask"), get("block_mask")
        p.sinks, p.alibi_slopes, p.bias = get("sinks"), get("alibi_slopes"), get("bias")
        p.q_descale_h, p.k_descale_h, p.v_descale_h = get("q_descale"), get("k_descale"), get("v_descale")
        p.cu_seqlens_q, p.cu_seqlens_k, p.seqused_k = get("cu_seqlens_q"), get("cu_seqlens_k"), get("seqused_k")
        return p

    def dropout_keep(self):
        """uint8 [B, Hq, Sq, Sk], 1 = kept: a counter-based draw that depends on (seed, offset, b, h, i, j) only
        (splitmix64 of each, chained; kept iff the 53-bit uniform >= dropout_p). None without dropout."""
        if "dropout" not in self.variants:
            return None
        def mix(x):
            x = (x + np.uint64(0x9E3779B97F4A7C15))
            x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            return x ^ (x >> np.uint64(31))
        with np.errstate(over="ignore"):
            idx = np.indices((self.batch, self.heads_q, self.seq_q, self.seq_k), dtype=np.uint64)
            x = mix(np.uint64(self.dropout_seed) ^ mix(np.uint64(self.dropout_offset)))
            for a in idx:
                x = mix(x ^ a)
        u = (x >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
        return (u >= self.dropout_p).astype(np.uint8)

    def score_add(self):
        """float64 [B|1, Hq|1, Sq, Sk] added to the (softcapped) scores: bias - slope_h |j - (i + off)|; None when
        the problem has neither bias nor ALiBi."""
        if self.bias is None and self.alibi_slopes is None:
            return None
        add = np.zeros((1, 1, self.seq_q, self.seq_k))
        if self.bias is not None:
            add = add + np.asarray(self.bias, np.float64)
        if self.alibi_slopes is not None:
            i = np.arange(self.seq_q)[:, None]
            j = np.arange(self.seq_k)[None, :]
            dist = np.abs(j - (i + self.diagonal_offset)).astype(np.float64)
            add = add - np.asarray(self.alibi_slopes, np.float64)[None, :, None, None] * dist[None, None]
        return add

    def custom_visible(self):
        """bool [B|1, Hq|1, Sq, Sk]: visible under the custom and block masks alone (all True without them). A
        block byte 0 hides its keys, 1 shows them (the custom mask is not read), 2 leaves them to the custom mask
        (visible without one); dense: byte != 0; bits: bit j % 8 of byte j / 8 of the row."""
        Sq, Sk = self.seq_q, self.seq_k
        vis = np.ones((1, 1, Sq, Sk), dtype=bool)
        if self.custom_mask is not None:
            m = self.custom_mask
            if "mask-bits" in self.variants:
                m = np.unpackbits(m, axis=-1, bitorder="little")[..., :Sk]
            vis = np.broadcast_to(m[..., :Sk] != 0, m.shape[:2] + (Sq, Sk))
        if self.block_mask is not None:
            qb = np.arange(Sq) // self.block_q
            kb = np.arange(Sk) // self.block_k
            bm = self.block_mask
            blk = bm[:, :, np.minimum(qb, bm.shape[2] - 1)][:, :, :, kb]  # [B|1, Hq|1, Sq, Sk]
            vis = np.where(blk == 1, True, np.where(blk == 0, False, vis))
        return vis

    def visible_all(self):
        """bool [B, Hq, Sq, Sk]: the one visibility rule, mask_kind AND the custom / block masks."""
        return np.broadcast_to(self.visible()[None, None] & self.custom_visible(),
                               (self.batch, self.heads_q, self.seq_q, self.seq_k))

    def visible(self):
        """bool [Sq, Sk]: visible(i, j) <=> j - (i + off) in [-left, right]."""
        i = np.arange(self.seq_q)[:, None]
        j = np.arange(self.seq_k)[None, :]
        rel = j - (i + self.diagonal_offset)
        ok = np.ones((self.seq_q, self.seq_k), dtype=bool)
        if self.window_left >= 0:
            ok &= rel >= -self.window_left
        if self.window_right >= 0:
            ok &= rel <= self.window_right
        return ok

    def key_range(self, i):
        """The visible keys of row i are exactly [first, last) (an interval; empty when first >= last)."""
        off = i + self.diagonal_offset
        first = 0 if self.window_left < 0 else max(0, off - self.window_left)
        last = self.seq_k if self.window_right < 0 else min(self.seq_k, off + self.window_right + 1)
        return first, max(first, last)

    def __repr__(self):
        return (f"Problem(B={self.batch} Hq={self.heads_q} Hkv={self.heads_kv} Sq={self.seq_q} Sk={self.seq_k} "
                f"D={self.head_dim} Dv={self.head_dim_v} mask={self.mask} scale={self.scale} {self.dtype})")


class Kernel:
    """One kernel an adapter serves: a name, the callable, and what it supports (PROTOCOL.md "kernels")."""

    def __init__(self, name, fn, *, family="adapter", description="", dtypes=("f32",), masks=ALL_MASKS,
                 gqa=True, dv_ne_d=True, lse=False, max_head_dim=0, max_head_dim_v=0, head_dim_multiple=1,
                 empty_keys=True, supports=None, backward=None, backward_dtypes=None, compute_model=None,
                 tunables=None, variants=(), repro=None, recompiles_per_shape=False, features=(),
                 data_variants=(), score_add_in_dtype=False):
        self.name, self.fn, self.supports, self.backward = name, fn, supports, backward
        self.repro = repro  # problem -> attnfuzz.repro.Call: the kernel writes bug-report scripts (PROTOCOL.md)
        self.decl = {"name": name, "family": family, "description": description, "dtypes": list(dtypes),
                     "masks": list(masks), "gqa": gqa, "dv_ne_d": dv_ne_d, "lse": lse,
                     "max_head_dim": max_head_dim, "max_head_dim_v": max_head_dim_v,
                     "head_dim_multiple": head_dim_multiple, "empty_keys": empty_keys,
                     "check": supports is not None}
        if repro is not None:  # absent for kernels without: a version-1 declaration as before
            self.decl["repro"] = True
        if features:  # the sequence layouts it takes (PROTOCOL.md "Sequence layouts"); absent: dense only
            bad = [f for f in features if f not in FEATURES]
            if bad:
                raise ValueError(f"features are {FEATURES}, not {bad}")
            self.decl["features"] = list(features)
        if recompiles_per_shape:  # every new shape compiles (a JIT): attn-fuzz keeps a pool of compiled shapes
            self.decl["recompiles_per_shape"] = True
        if variants:  # the variants it applies (PROTOCOL.md "Variants"); absent: none, as before
            bad = [v for v in variants if v not in VARIANTS]
            if bad:
                raise ValueError(f"variants are {VARIANTS}, not {bad}")
            self.decl["variants"] = list(variants)
        if data_variants:  # the score variants its compiled code takes as data (PROTOCOL.md; absent: none)
            bad = [v for v in data_variants if v not in SCORE_VARIANTS or v not in variants]
            if bad:
                raise ValueError(f"data_variants are among its variants {', '.join(SCORE_VARIANTS)}, not {bad}")
            self.decl["data_variants"] = list(data_variants)
        if compute_model is not None:  # "fused" | "unfused" (PROTOCOL.md; absent: the tool assumes unfused)
            if compute_model not in ("fused", "unfused"):
                raise ValueError(f"compute_model is 'fused' or 'unfused', not {compute_model!r}")
            self.decl["compute_model"] = compute_model
        if score_add_in_dtype:  # f16 / bf16: bias + ALiBi reach the kernel as one term in the dtype (PROTOCOL.md)
            self.decl["score_add_in_dtype"] = True
        if tunables:  # [{"name", "values": [default, ...], "role": "kv_splits" | "other", "description"}]
            decl = []
            for t in tunables:
                vals = [int(v) for v in t["values"]]
                if not vals or any(v < 1 for v in vals):
                    raise ValueError(f"tunable {t.get('name')!r}: values are integers >= 1, the default first")
                decl.append({"name": str(t["name"]), "values": vals, "role": t.get("role", "other"),
                             "description": t.get("description", "")})
            self.decl["tunables"] = decl
        if backward is not None:
            self.decl["backward"] = True  # absent for forward-only kernels: a version-1 declaration as before
            # default: every declared dtype the gradient oracle checks (f32, f16, bf16)
            bd = [d for d in dtypes if d in ("f32", "f16", "bf16")] if backward_dtypes is None else list(backward_dtypes)
            self.decl["backward_dtypes"] = bd
        self.lse = lse


def _read_exact(f, n):
    buf = f.read(n) if n else b""
    if buf is None or len(buf) < n:
        return None
    return buf


def read_message(f):
    """(header dict, payload bytes), or None at a clean end of stream."""
    raw = f.read(4)
    if not raw:
        return None
    if len(raw) < 4:
        raise ProtocolError("truncated length prefix")
    (n,) = struct.unpack("<I", raw)
    if n == 0 or n > (1 << 20):
        raise ProtocolError(f"header length {n}")
    h = _read_exact(f, n)
    if h is None:
        raise ProtocolError("truncated header")
    header = json.loads(h.decode("utf-8"))
    nbytes = int(header.get("payload_bytes", 0))
    payload = _read_exact(f, nbytes)
    if payload is None:
        raise ProtocolError("truncated payload")
    return header, payload


def write_message(f, header, arrays=()):
    """Writes header (payload_bytes filled in) and the arrays' bytes, C order little-endian."""
    blobs = [np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<"), copy=False).tobytes() for a in arrays]
    header = dict(header)
    header["payload_bytes"] = sum(len(b) for b in blobs)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    f.write(struct.pack("<I", len(h)))
    f.write(h)
    for b in blobs:
        f.write(b)
    f.flush()


def tensor_desc(name, a, dtype="f32"):
    return {"name": name, "dtype": dtype, "shape": [int(x) for x in a.shape]}


def split_tensors(header, payload):
    """{name: numpy array} from a message's tensor list."""
    out, off = {}, 0
    for t in header.get("tensors", []):
        dt = _DTYPES.get(t["dtype"])
        if dt is None:
            raise ProtocolError(f"dtype {t['dtype']} is not handled by this helper yet")
        shape = tuple(int(x) for x in t["shape"])
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if off + n > len(payload):
            raise ProtocolError("payload shorter than its tensors")
        out[t["name"]] = np.frombuffer(payload, dtype=dt, count=n // dt.itemsize, offset=off).reshape(shape)
        off += n
    if off != len(payload):
        raise ProtocolError("payload longer than its tensors")
    return out


def _protocol_streams():
    """The protocol's pipes; fd 1 is pointed at stderr so a stray print() cannot corrupt the stream."""
    inp = os.fdopen(os.dup(0), "rb", buffering=1 << 16)
    out = os.fdopen(os.dup(1), "wb", buffering=1 << 16)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return inp, out


def kv_shared_view(p, ts):
    """kv-shared (PROTOCOL.md "Shared K/V latent"): a run sends no v; V is the first Dv columns of K's rows, set here
    as the view ts["v"] = ts["k"][..., :Dv] (K's row stride, not a copy), as MLA kernels read it."""
    if "kv-shared" in p.variants and "v" not in ts:
        ts["v"] = ts["k"][..., :p.head_dim_v]
    return ts


def _run_forward(k, p, ts, want_lse):
    res = k.fn(ts["q"], ts["k"], ts["v"], p)
    lse, extra = None, {}
    if isinstance(res, tuple) and len(res) == 3:  # (O, LSE, {"dropout_mask": ...})
        res, lse, extra = res
    elif isinstance(res, tuple):
        res, lse = res
    rows = (p.total_q,) if p.q_layout == "packed" else (p.batch, p.seq_q)  # O follows q's layout
    o = as_stored(res, rows + (p.heads_q, p.head_dim_v), p.dtype, "O", p.o_scale)
    arrays, descs = [o], [tensor_desc("o", o, p.dtype)]
    if want_lse:
        if lse is None:
            raise ValueError("the kernel returned no LSE")
        lse = as_stored(lse, (p.batch, p.heads_q, p.seq_q), "f32", "LSE")
        arrays.append(lse)
        descs.append(tensor_desc("lse", lse))
    _dropout_mask(p, extra, arrays, descs)
    return arrays, descs


def _dropout_mask(p, extra, arrays, descs):
    """With dropout, the keep mask the kernel used (extra["dropout_mask"], [B, Hq, Sq, Sk], 1 kept) goes back."""
    if "dropout" not in p.variants:
        return
    if "dropout_mask" not in extra:
        raise ValueError("the problem uses dropout: the kernel must also return {'dropout_mask': keep [B, Hq, Sq, Sk]}")
    if extra["dropout_mask"] is None:
        raise ValueError("the kernel returned dropout_mask None: return the keep mask [B, Hq, Sq, Sk] (all ones at p = 0)")
    m = np.ascontiguousarray(np.asarray(extra["dropout_mask"]) != 0, dtype=np.uint8)
    if m.shape != (p.batch, p.heads_q, p.seq_q, p.seq_k):
        raise ValueError(f"dropout_mask has shape {m.shape}, expected {(p.batch, p.heads_q, p.seq_q, p.seq_k)}")
    arrays.append(m)
    descs.append(tensor_desc("dropout_mask", m, "u8"))


def _run_backward(k, p, ts):
    if k.backward is None:
        raise ValueError(f"kernel {k.name} has no backward (it did not declare one)")
    grads = k.backward(ts["q"], ts["k"], ts["v"], ts["o"], ts["lse"], ts["do"], p)
    if not isinstance(grads, (tuple, list)) or len(grads) not in (3, 4):
        raise ValueError("the backward must return (dQ, dK, dV) or (dQ, dK, dV, {'dsinks': ..., 'dbias': ...})")
    extra = grads[3] if len(grads) == 4 else {}
    shapes = {"dq": (p.batch, p.seq_q, p.heads_q, p.head_dim), "dk": (p.batch, p.seq_k, p.heads_kv, p.head_dim),
              "dv": (p.batch, p.seq_k, p.heads_kv, p.head_dim_v)}
    arrays, descs = [], []
    for (name, shape), g in zip(shapes.items(), grads):
        a = as_stored(g, shape, p.dtype, name)
        arrays.append(a)
        descs.append(tensor_desc(name, a, p.dtype))
    # The gradients of the score variants' own parameters: d sinks [Hq], d bias in the bias's (broadcast) shape.
    for name, src in (("dsinks", p.sinks), ("dbias", p.bias)):
        if src is None:
            continue
        if name not in extra:
            raise ValueError(f"the problem uses {name[1:]}: the backward must also return {{'{name}': ...}}")
        a = as_stored(extra[name], np.shape(src), "f32", name)
        arrays.append(a)
        descs.append(tensor_desc(name, a))
    _dropout_mask(p, extra, arrays, descs)
    return arrays, descs


def _write_repro(k, p, h, ts):
    """{"files": [script, npz]} or {"error": why}: never an exception (the run's result still goes back)."""
    from attnfuzz import repro
    try:
        return {"files": repro.write(k, p, h["problem"], ts, h["repro"])}
    except Exception as e:  # noqa: BLE001 - said to the tool, which writes the bundle without a script
        return {"error": f"{type(e).__name__}: {e}"}


def serve(kernels, name=None, inp=None, out=None):
    """Runs the adapter loop until the tool says bye or closes the pipe."""
    if inp is None or out is None:
        inp, out = _protocol_streams()
    by_name = {k.name: k for k in kernels}
    if len(by_name) != len(kernels):
        raise ValueError("kernel names must be unique")
    name = name or os.path.basename(sys.argv[0] or "adapter")
    while True:
        msg = read_message(inp)
        if msg is None:
            return
        h, payload = msg
        t = h.get("type")
        if t == "hello":
            write_message(out, {"type": "hello", "protocol": PROTOCOL_VERSION, "name": name,
                                "kernels": [k.decl for k in kernels]})
        elif t == "bye":
            return
        elif t == "check":
            k = by_name.get(h.get("kernel"))
            reason = None
            if k is None:
                reason = "unknown kernel"
            elif k.supports is not None:
                try:
                    reason = k.supports(Problem(h["problem"]))
                except Exception as e:  # a broken supports() must not hide the kernel: let the launch tell
                    print(f"attnfuzz adapter: supports() raised {e!r}", file=sys.stderr)
                    reason = None
            write_message(out, {"type": "check", "id": h.get("id"), "supported": not reason,
                                "reason": reason or ""})
        elif t == "run":
            rid, p = h.get("id"), None
            try:
                k = by_name.get(h.get("kernel"))
                if k is None:
                    raise ValueError(f"unknown kernel {h.get('kernel')!r}")
                ts = split_tensors(h, payload)
                p = Problem.from_run(h["problem"], ts)
                kv_shared_view(p, ts)
                if h.get("pass", "fwd") == "bwd":
                    arrays, descs = _run_backward(k, p, ts)
                else:
                    arrays, descs = _run_forward(k, p, ts, h.get("want_lse"))
            except ProtocolError:
                raise
            except Exception as e:  # the kernel's own exception: reported per case, the loop goes on
                tb = traceback.format_exc(limit=4).strip().splitlines()
                reply = {"type": "error", "id": rid,
                         "message": f"{type(e).__name__}: {e}" + (f" [{tb[-3].strip()}]" if len(tb) > 2 else "")}
                if h.get("repro") and p is not None and k is not None:  # the script raises as the library did
                    reply["repro"] = _write_repro(k, p, h, ts)
                write_message(out, reply)
                continue
            reply = {"type": "result", "id": rid, "tensors": descs}
            if h.get("repro"):  # a bug report (PROTOCOL.md "Bug reports"): the script and .npz of this very run
                reply["repro"] = _write_repro(k, p, h, ts)
            write_message(out, reply, arrays)
        else:
            write_message(out, {"type": "error", "id": h.get("id"), "message": f"unknown message type {t!r}"})
