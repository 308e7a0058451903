# npy_backward_test.py - the NPY backward path end to end: numpy-computed dQ, dK, dV (python/attnfuzz/reference.py)
# judged by `attn-check --npy DIR` (pass), and the same files with a planted gradient bug (fail, naming the tensor).
#
# Usage: npy_backward_test.py ATTN_CHECK WORKDIR   (needs numpy; ctest runs it with /usr/bin/python3)
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
from attnfuzz.adapter import Problem  # noqa: E402
from attnfuzz.reference import attention, attention_backward  # noqa: E402


def problem(b, hq, hkv, sq, sk, d, dv, mask):
    """attnfuzz.Problem for a causal (bottom-right) or unmasked case."""
    off = sk - sq
    causal = mask == "causal-br"
    return Problem({"batch": b, "heads_q": hq, "heads_kv": hkv, "seq_q": sq, "seq_k": sk, "head_dim": d,
                    "head_dim_v": dv, "scale": float(np.float32(1 / np.sqrt(d))), "dtype": "f32", "mask": mask,
                    "mask_kind": "causal" if causal else "none", "mask_align": "bottom-right",
                    "window_left": -1, "window_right": 0 if causal else -1, "diagonal_offset": off})


def write_case(dirname, p, seed, bug=None):
    rng = np.random.default_rng(seed)
    B, Hq, Hkv, Sq, Sk, D, Dv = p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_k, p.head_dim, p.head_dim_v
    q = rng.uniform(-1, 1, (B, Sq, Hq, D)).astype(np.float32)
    k = rng.uniform(-1, 1, (B, Sk, Hkv, D)).astype(np.float32)
    v = rng.uniform(-1, 1, (B, Sk, Hkv, Dv)).astype(np.float32)
    do = rng.uniform(-1, 1, (B, Sq, Hq, Dv)).astype(np.float32)
    o, lse = attention(q, k, v, p)
    dq, dk, dv = attention_backward(q, k, v, do, p, o, lse)
    if bug == "dk-no-scale":  # the scale missing from dK
        dk = dk / np.float32(p.scale)
    if bug == "empty-row-nan":  # exp(s - LSE) of a fully masked row: NaN dQ
        for i in range(Sq):
            if p.key_range(i)[1] <= p.key_range(i)[0]:
                dq[:, i] = np.nan
    out = Path(dirname)
    out.mkdir(parents=True, exist_ok=True)
    for name, a in {"q": q, "k": k, "v": v, "o": o, "lse": lse, "do": do, "dq": dq, "dk": dk, "dv": dv}.items():
        np.save(out / f"{name}.npy", a)
    (out / "case.json").write_text('{"layout": "bshd", "mask": "%s"}' % p.mask)
    return out


def run(attn_check, d, expect_rc, expect_text=None):
    r = subprocess.run([attn_check, "--npy", str(d), "--no-reports"], capture_output=True, text=True)
    out = r.stdout + r.stderr
    ok = r.returncode == expect_rc and (expect_text is None or expect_text in out)
    print(("ok  " if ok else "BAD ") + f"{d}: rc {r.returncode} (want {expect_rc})" +
          (f", want text {expect_text!r}" if expect_text else ""))
    if not ok:
        print(out)
    return ok


def main():
    attn_check, work = sys.argv[1], Path(sys.argv[2])
    os.makedirs(work, exist_ok=True)
    ok = True
    # GQA, Sq > Sk bottom-right causal: rows 0..3 see no key (fully masked), Dv != D.
    p = problem(1, 4, 2, 12, 8, 16, 12, "causal-br")
    ok &= run(attn_check, write_case(work / "good-causal", p, 1), 0)
    ok &= run(attn_check, write_case(work / "good-none", problem(2, 2, 2, 9, 17, 8, 8, "none"), 2), 0)
    ok &= run(attn_check, write_case(work / "dk-no-scale", p, 1, "dk-no-scale"), 1, "wrong in dK")
    ok &= run(attn_check, write_case(work / "empty-row-nan", p, 1, "empty-row-nan"), 1, "empty-row in dQ")
    # A missing gradient file is bad input (exit 2).
    bad = write_case(work / "missing-dv", p, 1)
    (bad / "dv.npy").unlink()
    ok &= run(attn_check, bad, 2)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
