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
Failures raise AttnFuzzFailure (an AssertionError) listing each failure's class, reason, evidence (the
evidence of the detector that decided the class first) and replay command. The tools are found through
$ATTNFUZZ_BIN (a directory), then PATH, then the source tree's build/bin.
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
            out = subprocess.run([sys.executable, "-c", "import json, sys; print(json.dumps(sys.path))"], env=env,
                                 stdout=subprocess.PIPE, text=True, check=True).stdout
            _default_path = set(json.loads(out))
        except (subprocess.CalledProcessError, OSError, ValueError):
            _default_path = set()
    return [os.path.abspath(p) for p in sys.path if p and p not in _default_path]


def _failures(report_path):
    try:
        with open(report_path) as f:
            rep = json.load(f)
    except (OSError, ValueError):
        return []
    cases = rep.get("cases", [])  # schema 2: each case once, results name it by index
    fails = [dict(r) for r in rep.get("results", []) if r.get("verdict") == "fail"]  # verdict_name(): lower case
    for r in fails:
        if isinstance(r.get("case"), int) and 0 <= r["case"] < len(cases):
            r.setdefault("case_text", cases[r["case"]].get("text", ""))
    return fails


# Evidence lines shown besides the decisive ones (the rest stay in report.json), and the length of one line.
_OTHER_EVIDENCE = 6
_LINE_CHARS = 2000
# Which detectors decide a class found by the check itself (no classify line: the launch or the canaries).
_CHECK_DETECTORS = ("canary", "guard-page", "launch")


def _decisive(r):
    """The detector whose experiment decided r's class: the classify line says 'CLASS by DETECTOR (...)'."""
    for ev in r.get("evidence", []):
        if isinstance(ev, dict) and ev.get("detector") == "classify":
            words = str(ev.get("detail", "")).split()
            if len(words) >= 3 and words[1] == "by" and words[2] != "check":
                return (words[2],)
    return _CHECK_DETECTORS + ((r["class"],) if r.get("class") else ())


def _describe(r):
    """One failure: class, kernel and case; the reason; the deciding detector's evidence first, then the
    classify line and the first few other lines; the replay command."""
    lines = [f"  [{r.get('class')}] {r.get('kernel')}: {r.get('case_text', '')}", f"    {r.get('reason', '')}"]
    evidence = [ev for ev in r.get("evidence", []) if isinstance(ev, dict)]
    deciders = _decisive(r)
    first = [ev for ev in evidence if ev.get("detector") in deciders]
    closing = [ev for ev in evidence if ev.get("detector") == "classify"]
    rest = [ev for ev in evidence if ev not in first and ev not in closing]

    def show(ev):
        lines.append(f"    {ev.get('detector', '')}: {ev.get('detail', '')}"[:_LINE_CHARS])

    for ev in first + closing + rest[:_OTHER_EVIDENCE]:
        show(ev)
    if len(rest) > _OTHER_EVIDENCE:
        lines.append(f"    ({len(rest) - _OTHER_EVIDENCE} more evidence line(s) in report.json)")
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
