"""pytest entry point: check an attention callable with attn-check's sweep and a time-boxed attn-fuzz campaign.

    # conftest.py (or the test module):  pytest_plugins = ["attnfuzz.pytest_plugin"]
    def test_my_attention(attnfuzz):
        attnfuzz.check(my_attention, masks=["none", "causal-br"], fuzz_seconds=30)

or without the fixture:  attnfuzz.testing.check_attention(my_attention, out_dir=tmp_path).
my_attention must be importable as MODULE:NAME (a module-level function); it gets numpy q, k, v
[B, S, H, D] and an attnfuzz.Problem and returns O [B, Sq, Hq, Dv] (or (O, LSE) with lse=True).
dtypes=["f32", "f16", "bf16"] checks each dtype (a sweep each; the fuzz time is shared): the arrays hold the
stored elements (float32, float16, uint16 bf16 bits; attnfuzz.dtypes converts). torch_device="cuda": the
function takes and returns torch tensors on that device instead. Backward: backward=my_backward (a
module-level function (q, k, v, o, lse, do, problem) -> (dQ, dK, dV)) or autograd=True (with torch_device)
adds the --pass bwd sweep (f32).
Failures raise AttnFuzzFailure (an AssertionError) listing each failure's class, reason, evidence and
replay command. The tools are found through $ATTNFUZZ_BIN (a directory), then PATH, then the source
tree's build/bin.
"""

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

from attnfuzz.adapter import ALL_MASKS


class AttnFuzzFailure(AssertionError):
    """attn-check or attn-fuzz found failures (the message lists them)."""


def find_tool(name):
    d = os.environ.get("ATTNFUZZ_BIN")
    if d and os.access(os.path.join(d, name), os.X_OK):
        return os.path.join(d, name)
    p = shutil.which(name)
    if p:
        return p
    here = os.path.dirname(os.path.abspath(__file__))
    cand = os.path.join(here, "..", "..", "build", "bin", name)
    if os.access(cand, os.X_OK):
        return os.path.abspath(cand)
    raise FileNotFoundError(f"{name} not found: set ATTNFUZZ_BIN to the directory of the attn-fuzz tools")


def _target(fn):
    mod, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not mod or "<" in qual:
        raise TypeError("attnfuzz: the function must be defined at module level (importable as MODULE:NAME)")
    if mod == "__main__":
        raise TypeError("attnfuzz: the function must live in an importable module, not __main__")
    return f"{mod}:{qual}"


def adapter_command(fn=None, *, target=None, masks=ALL_MASKS, lse=False, gqa=True, dv_ne_d=True,
                    empty_keys=True, max_head_dim=0, name=None, dtypes=("f32",), backward=None,
                    torch_device=None, autograd=False):
    """The --adapter command that serves fn (a module-level function) through attnfuzz.adapters.callable."""
    if target is None:
        target = _target(fn)
    args = [sys.executable, "-m", "attnfuzz.adapters.callable", target, "--masks", ",".join(masks),
            "--dtypes", ",".join(dtypes)]
    if torch_device:
        args += ["--torch", torch_device]
    if autograd:
        args.append("--autograd")
    if backward is not None:
        args += ["--backward", backward if isinstance(backward, str) else _target(backward)]
    if name:
        args += ["--name", name]
    if lse:
        args.append("--lse")
    if not gqa:
        args.append("--no-gqa")
    if not dv_ne_d:
        args.append("--no-dv-ne-d")
    if not empty_keys:
        args.append("--no-empty-keys")
    if max_head_dim:
        args += ["--max-head-dim", str(max_head_dim)]
    path = os.pathsep.join(_extra_path())
    return "PYTHONPATH=" + shlex.quote(path) + " " + " ".join(shlex.quote(a) for a in args)


_default_path = None


def _extra_path():
    """The entries of sys.path a fresh interpreter would not have (test dirs, the package): the child's
    PYTHONPATH, short enough to read in a replay command."""
    global _default_path
    if _default_path is None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        try:
            out = subprocess.run([sys.executable, "-c", "import sys; print(repr(sys.path))"], env=env,
                                 stdout=subprocess.PIPE, text=True, check=True).stdout
            _default_path = set(eval(out))  # a repr of a list of str from our own interpreter
        except (subprocess.CalledProcessError, OSError, SyntaxError):
            _default_path = set()
    return [os.path.abspath(p) for p in sys.path if p and p not in _default_path]


def _failures(report_path):
    try:
        with open(report_path) as f:
            rep = json.load(f)
    except (OSError, ValueError):
        return []
    out = []
    for r in rep.get("results", []):
        if r.get("verdict") == "FAIL" or r.get("class"):
            out.append(r)
    return out


def _describe(r):
    lines = [f"  [{r.get('class')}] {r.get('kernel')}: {r.get('case_text', '')}", f"    {r.get('reason', '')}"]
    for ev in r.get("evidence", [])[:6]:
        if isinstance(ev, dict):
            lines.append(f"    {ev.get('detector', '')}: {ev.get('detail', '')}"[:400])
    if r.get("replay"):
        lines.append(f"    replay: {r['replay']}")
    return "\n".join(lines)


def check_attention(fn=None, *, target=None, out_dir=None, sweep=True, fuzz_seconds=0, max_seq=64, max_d=64,
                    timeout_s=60, extra_args=(), dtypes=("f32",), **decl):
    """Sweep + optional fuzz of fn (per dtype; + the backward sweep when it has one); returns the list of
    failures (empty) or raises AttnFuzzFailure."""
    dtypes = list(dtypes)
    cmd = adapter_command(fn, target=target, dtypes=dtypes, **decl)
    out_dir = str(out_dir or tempfile.mkdtemp(prefix="attnfuzz-"))
    failures, logs = [], []
    runs = []
    one = len(dtypes) == 1
    for dt in dtypes if sweep else ():
        runs.append(("attn-check", [find_tool("attn-check"), "--sweep", "--quiet", "--adapter", cmd, "--dtype", dt,
                                     "--timeout", str(timeout_s),
                                     "--out", os.path.join(out_dir, "sweep" if one else f"sweep-{dt}")]))
    has_bwd = decl.get("backward") is not None or decl.get("autograd")
    bwd = [d for d in dtypes if d in ("f32", "f16", "bf16")] if sweep and has_bwd else []  # the gradient oracle's
    for dt in bwd:
        runs.append(("attn-check", [find_tool("attn-check"), "--sweep", "--quiet", "--adapter", cmd, "--pass", "bwd",
                                     "--dtype", dt, "--timeout", str(timeout_s),
                                     "--out", os.path.join(out_dir, "sweep-bwd" if len(bwd) == 1 else f"sweep-bwd-{dt}")]))
    for dt in dtypes if fuzz_seconds > 0 else ():
        runs.append(("attn-fuzz", [find_tool("attn-fuzz"), "--adapter", cmd, "--dtype", dt,
                                    "--max-time", str(max(1, round(fuzz_seconds / len(dtypes)))),
                                    "--workers", "1", "--max-seq", str(max_seq), "--max-d", str(max_d),
                                    "--timeout", str(timeout_s), "--progress", "1000",
                                    "--out", os.path.join(out_dir, "fuzz" if one else f"fuzz-{dt}")]))
    for tool, args in runs:
        p = subprocess.run(list(args) + list(extra_args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
        out = args[args.index("--out") + 1]
        if p.returncode == 2:
            raise RuntimeError(f"{tool} refused to run (exit 2):\n{p.stdout[-3000:]}")
        if p.returncode == 1:
            found = _failures(os.path.join(out, "report.json"))
            failures += found
            if not found:
                logs.append(p.stdout[-3000:])
    if failures or logs:
        msg = [f"attn-fuzz found {len(failures)} failure(s) (reports in {out_dir}):"]
        msg += [_describe(r) for r in failures[:20]]
        msg += logs
        raise AttnFuzzFailure("\n".join(msg))
    return failures
