"""The numpy reference adapter (f32, f16, bf16, fp8; forward and backward), and its planted-bug variants for the
tool's own tests.

    attn-check --sweep --adapter 'python3 -m attnfuzz.adapters.numpy_ref'
    attn-check --sweep --dtype bf16 --adapter 'python3 -m attnfuzz.adapters.numpy_ref'
    attn-check --sweep --pass bwd --adapter 'python3 -m attnfuzz.adapters.numpy_ref'
    attn-check --sweep --adapter 'python3 -m attnfuzz.adapters.numpy_ref --bug mask-leak'
    attn-check --repeat-calls --sq 9 --adapter 'python3 -m attnfuzz.adapters.numpy_ref --bug stale-plan'
    attn-check --repeat-calls --sq 9 --adapter 'python3 -m attnfuzz.adapters.numpy_ref --bug stale-plan --stale-key-lacks mask'
    attn-fuzz --adapter 'python3 -m attnfuzz.adapters.numpy_ref --compile-delay 0.5' --max-time 60
    attn-check --sweep --variant kv-shared --adapter 'python3 -m attnfuzz.adapters.numpy_ref'

--bug trusts-metadata takes a sequence layout's cu_seqlens / seqused_k as sent, unchecked (numpy_ref itself refuses a
malformed array by name, attnfuzz/sequences.py check_metadata), so a malformed case (attn-check --malformed) is named
accepted-malformed through the adapter:

    attn-check --seq-layout varlen --seqlens-q 3,5 --seqlens-k 4,9 --malformed cu-k-decreasing@1 \
        --adapter 'python3 -m attnfuzz.adapters.numpy_ref --bug trusts-metadata'

--compile-delay SECONDS makes it behave like a JIT-compiled kernel: the first call at each new shape (compile_key)
in this process sleeps SECONDS first, and the kernel declares recompiles_per_shape (--hide-recompiles: it does not,
so that attn-fuzz has to measure it); bench/compile_aware.sh runs campaigns against it with and without the pool.
--refuse-head-dims adds what compiled FlexAttention does to most fuzzed shapes: a head dim (D or Dv) that is not a
power of two >= 16 is refused after the support question compiled (SECONDS, once per compile_key).
"""

import argparse
import time

import numpy as np

from attnfuzz import repro, sequences
from attnfuzz.adapter import ALL_MASKS, FEATURES, SCORE_VARIANTS, VARIANTS, Kernel, serve

# What a problem's plan cache may leave out of its key beside the shape (--bug stale-plan --stale-key-lacks).
STALE_PARAMS = ("scale", "mask", "dtype")
BUGS = ("mask-leak", "missing-rescale", "empty-row-nan", "lse-error", "bwd-mask-leak", "empty-row-mean",
        "split-average", "scale-nan", "sink-ignored", "dbias-half", "dropout-bwd-wrap",
        "stale-plan", "kv-latent-rows", "softcap-ignored", "trusts-metadata", "short-seq-16x", "fa2-window",
        "last-tile-dropped", "bwd-align-tl", "headdim-repeat-16", "bwd-lse-tl", "bwd-empty-all-keys")
# The bugs of the backward alone (the forward is the reference's).
BWD_BUGS = ("bwd-mask-leak", "bwd-align-tl", "bwd-lse-tl", "bwd-empty-all-keys")
# The KV-split knob of the split-average kernel (the split-kv detector varies it; 1 = no split).
SPLITS = [{"name": "num_splits", "role": "kv_splits", "values": [4, 1, 2, 8],
           "description": "contiguous KV splits combined at the end"}]


def library_call(bug):
    """(problem, pass) -> repro.Call: how the kernel (numpy-ref, or numpy-<bug>) calls the reference, run by the adapter and
    printed into bug-report scripts as written; the float32 results rounded to the dtype as the helper stores them."""
    fwd_bug = None if bug in BWD_BUGS + ("trusts-metadata",) else bug
    bwd_bug = bug if bug in BWD_BUGS else None
    trust = bug == "trusts-metadata"  # the sequence arrays taken as sent, unchecked (a malformed one is not refused)

    def make(p, pass_name):
        if pass_name == "bwd":
            body = ["def call_bwd(q, k, v, o, lse, do):",
                    f"    g = attention_backward(q, k, v, do, p, o=o, lse=lse, bug={bwd_bug!r})",
                    "    return tuple(round_to(a, p.dtype) for a in g[:3]) + tuple(g[3:])"]
            return repro.Call(["from attnfuzz.dtypes import round_to",
                               "from attnfuzz.reference import attention_backward"], body, needs_problem=True)
        if sequences.has_sequences(p):  # varlen / KV cache: every sequence as a dense problem of its own
            body = ["def call(q, k, v):",
                    f"    dense = lambda q, k, v, sp: attention(q, k, v, sp, bug={fwd_bug!r})",
                    f"    return per_sequence(q, k, v, p, dense, trust={trust})"]
            return repro.Call(["from attnfuzz.reference import attention",
                               "from attnfuzz.sequences import per_sequence"], body, needs_problem=True)
        body = ["def call(q, k, v):",
                f"    return attention(q, k, v, p, bug={fwd_bug!r})"]
        return repro.Call(["from attnfuzz.reference import attention"], body, needs_problem=True)
    return make


def compile_key(p, data_variants=()):
    """What the simulated compilation of --compile-delay is specialised on, as a JIT's is (fuzz/shape_pool.h's
    shape key holds all of it): the shape, dtype, pass, mask and variants but data_variants (--variants-as-data: the
    score variants, as FlexAttention's compiled path takes them); not the values or the scale."""
    return (p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_k, p.head_dim, p.head_dim_v, p.dtype, p.mask,
            tuple(v for v in p.variants if v not in data_variants), p.pass_name)


def compiling(fn, delay, compiled, data_variants=()):
    """fn, with a first call at each new compile_key sleeping `delay` seconds (a simulated compilation)."""
    if not delay:
        return fn

    def call(*args):
        key = compile_key(args[-1], data_variants)
        if key not in compiled:
            time.sleep(delay)
            compiled.add(key)
        return fn(*args)

    return call


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bug", choices=BUGS, help="serve a planted-bug variant instead (kernel numpy-<bug>)")
    ap.add_argument("--no-lse", action="store_true", help="declare no LSE output")
    ap.add_argument("--dtypes", default="f32,f16,bf16,fp8_e4m3,fp8_e5m2",
                    help="declared dtypes, comma-separated (f32, f16, bf16, fp8_e4m3, fp8_e5m2)")
    ap.add_argument("--no-backward", action="store_true", help="declare no backward (a forward-only kernel)")
    ap.add_argument("--stale-key-lacks", default=",".join(STALE_PARAMS),
                    help="stale-plan: the parameters its cache key lacks, comma-separated (of scale, mask, dtype; "
                         "default all: the key is the shape alone)")
    ap.add_argument("--nan-noise", action="store_true",
                    help="flip the sign of NaN outputs at random, as a multithreaded BLAS's operand order does")
    ap.add_argument("--compile-delay", type=float, default=0, metavar="SECONDS",
                    help="sleep SECONDS at the first call at each new shape, as a JIT compiles (and declare "
                         "recompiles_per_shape)")
    ap.add_argument("--hide-recompiles", action="store_true",
                    help="with --compile-delay: do not declare recompiles_per_shape (attn-fuzz measures it)")
    ap.add_argument("--variants-as-data", action="store_true",
                    help="with --compile-delay: sinks, softcap, ALiBi and bias do not compile again (declared as "
                         "data_variants), as in FlexAttention's compiled path")
    ap.add_argument("--refuse-head-dims", action="store_true",
                    help="with --compile-delay: refuse a head dim that is not a power of two >= 16, after a simulated "
                         "compilation in the support question (as flex_attention's probe compiles, then raises)")
    ap.add_argument("--compute-model", choices=("fused", "unfused"),
                    help="declare this compute model (default none: the tool assumes unfused, the wider bound)")
    ap.add_argument("--score-add-in-dtype", choices=("declared", "undeclared"),
                    help="in f16 / bf16 take ALiBi + bias as one term rounded to the dtype, as SDPA's float attn_mask "
                         "does, and declare it (score_add_in_dtype) or not (a kernel that rounds its bias silently)")
    a = ap.parse_args(argv)
    if a.compile_delay < 0:
        ap.error("--compile-delay needs SECONDS >= 0")
    bug = a.bug
    rng = np.random.default_rng()

    call = library_call(bug)
    call_fwd, call_bwd = repro.forward(call), repro.backward(call)

    plans = {}  # stale-plan: problems by key, as a plan cache keyed on the shape and the parameters not lacked
    lacks = [x for x in a.stale_key_lacks.split(",") if x]
    if not set(lacks) <= set(STALE_PARAMS):
        ap.error(f"--stale-key-lacks takes some of {', '.join(STALE_PARAMS)}")
    keyed = [x for x in STALE_PARAMS if x not in lacks]

    def run(q, k, v, p):
        p.score_add_in_dtype = a.score_add_in_dtype is not None  # reference._Scores rounds the additive term
        if bug == "stale-plan":  # the first problem of each key is replayed: the parameters the key lacks go stale
            arrays = tuple(None if a is None else tuple(np.asarray(a).tolist())
                           for a in (p.cu_seqlens_q, p.cu_seqlens_k, p.seqused_k))  # a layout is shape too
            shape = (p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_k, p.head_dim, p.head_dim_v, p.q_layout,
                     p.kv_layout) + arrays
            p = plans.setdefault(shape + tuple(getattr(p, x) for x in keyed), p)
        o, lse, *extra = call_fwd(q, k, v, p)  # a sequence layout: per sequence (library_call)
        if a.nan_noise:  # a NaN's sign carries no value: the tool must not read its variation as a race
            flip = np.isnan(o) & (rng.random(o.shape) < 0.5)
            o = np.where(flip, -o, o).astype(np.float32)
        return (o, lse, *extra)

    def backward(q, k, v, o, lse, do, p):
        p.score_add_in_dtype = a.score_add_in_dtype is not None
        if bug == "dropout-bwd-wrap":  # the backward's counter offset wrapped at 32 bits (PyTorch PR #188015's bug)
            p.dropout_offset &= 0xFFFFFFFF
        g = call_bwd(q, k, v, o, lse, do, p)
        if bug == "dbias-half" and len(g) == 4 and "dbias" in g[3]:  # d bias off by a factor; dQ, dK, dV right
            g[3]["dbias"] = g[3]["dbias"] * np.float32(0.5)
        return g

    compiled = set()  # compile keys seen by this process (--compile-delay), forward and backward alike
    variants = VARIANTS if bug in (None, "sink-ignored", "dbias-half", "dropout-bwd-wrap", "kv-latent-rows",
                                   "softcap-ignored") else ()
    data = tuple(v for v in SCORE_VARIANTS if v in variants) if a.variants_as_data else ()
    run, backward = compiling(run, a.compile_delay, compiled, data), compiling(backward, a.compile_delay, compiled, data)
    refused = {}  # --refuse-head-dims: compile key -> reason, the question answered once per key

    def supports(p):
        if all(d >= 16 and d & (d - 1) == 0 for d in (p.head_dim, p.head_dim_v)):
            return None
        key = compile_key(p, data)
        if key not in refused:
            time.sleep(a.compile_delay)  # compiled, then refused
            refused[key] = (f"numpy-ref --refuse-head-dims: head dims {p.head_dim}, {p.head_dim_v} "
                            "(powers of two >= 16 only)")
        return refused[key]

    name = "numpy-" + bug if bug else "numpy-ref"
    desc = f"numpy reference with planted bug {bug}" if bug else "numpy reference (float64 inside)"
    serve([Kernel(name, run, family="numpy", description=desc, lse=not a.no_lse,
                  dtypes=[d for d in a.dtypes.split(",") if d],
                  backward=None if a.no_backward else backward,
                  tunables=SPLITS if bug == "split-average" else None, repro=call, features=FEATURES,
                  supports=supports if a.refuse_head_dims else None,
                  variants=variants, data_variants=data, compute_model=a.compute_model,
                  score_add_in_dtype=a.score_add_in_dtype == "declared",
                  # bwd-align-tl, bwd-lse-tl: causal-br only, as SDPA's lower-right route (no other mask to rerun with)
                  masks=("causal-br",) if bug in ("bwd-align-tl", "bwd-lse-tl") else ALL_MASKS,
                  recompiles_per_shape=a.compile_delay > 0 and not a.hide_recompiles)], name="numpy_ref")


if __name__ == "__main__":
    main()
