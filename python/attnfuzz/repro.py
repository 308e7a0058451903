"""Bug-report scripts (attn-check --replay FILE --bug-report DIR; adapters/PROTOCOL.md "Bug reports"): one source of
truth for how an adapter kernel calls its library, run by the adapter and printed into the script.

A kernel that can write a bug report is declared with Kernel(..., repro=make_call), make_call(problem, pass_name) ->
Call: the Python source that calls the library on that problem in that pass ("fwd" | "bwd"). The adapter runs that very source (compile + exec: forward()
and backward() below build the kernel's callables from it), and the script prints it as written, so the script and
the adapter cannot drift. The script also holds the generic parts written here: load the .npz, run the source on
its inputs, compare with attn-fuzz's exact oracle element by element under the tool's bounds, print the worst
elements, exit 1 while the library is wrong and 0 once it is fixed.
"""

import functools
import json
import os

import numpy as np

MAX_LINES = 40  # what a maintainer reads: the whole script


class Call:
    """How a kernel calls its library on one problem, as source lines.

    imports: import lines of the source ("import torch").
    source: lines that define call(q, k, v) -> O or (O, LSE) for the pass "fwd" and call_bwd(q, k, v, o, lse, do)
        -> (dQ, dK, dV) for "bwd", on the stored numpy elements the protocol
        carries (Kernel fn / backward conventions; float32 values are rounded to the dtype like the helper does).
        They may read x[name] (the arrays below, and the run's tensors) and, with needs_problem, p (the Problem).
    arrays: {name: numpy array} the source reads as x[name] (e.g. the attention mask the adapter built); the
        adapter hands them over, the script loads them from the .npz.
    needs_problem: the script rebuilds p (attnfuzz.adapter.Problem) from the .npz: for a library that takes the
        problem itself (the numpy reference); a library called with literal arguments does not need it.
    """

    def __init__(self, imports, source, arrays=None, needs_problem=False):
        self.imports, self.source = list(imports), list(source)
        self.arrays = dict(arrays or {})
        self.needs_problem = needs_problem


@functools.lru_cache(maxsize=256)
def _code(text):
    return compile(text, "<attnfuzz repro call>", "exec")


def namespace(call, p, tensors=None):
    """The globals after running call's imports and source: x (call.arrays and tensors), p, call / call_bwd."""
    ns = {"np": np, "x": dict(tensors or {}, **call.arrays), "p": p}
    exec(_code("\n".join(call.imports + call.source)), ns)  # noqa: S102 - the adapter's own source
    return ns


def forward(make_call):
    """A Kernel fn (q, k, v, p) running make_call(p)'s call."""
    return lambda q, k, v, p: namespace(make_call(p, "fwd"), p)["call"](q, k, v)


def backward(make_call):
    """A Kernel backward (q, k, v, o, lse, do, p) running make_call(p)'s call_bwd."""
    return lambda q, k, v, o, lse, do, p: namespace(make_call(p, "bwd"), p)["call_bwd"](q, k, v, o, lse, do)


_COMPARE = '''bad = 0
for n in [n for n in got if "expected_" + n in x]:  # a NaN bound: not compared (a row the oracle did not compute)
    e, b, g = x["expected_" + n], x["bound_" + n], np.asarray(got[n], np.float64).reshape(x["expected_" + n].shape)
    with np.errstate(all="ignore"):
        ok = (g == e) | (np.isnan(g) & np.isnan(e)) | np.isnan(b) | (np.abs(g - e) <= b)
        ratio = np.where(ok, 0.0, np.where(np.isfinite(g - e), np.abs(g - e) / b, np.inf))
    bad += int((~ok).sum())
    print(f"{n}: {int((~ok).sum())} of {int((~np.isnan(b)).sum())} elements beyond their bound")
    for i in np.argsort(-ratio, axis=None, kind="stable")[: min(6, int((~ok).sum()))]:
        at = ",".join(str(int(c)) for c in np.unravel_index(i, ratio.shape))
        print(f"  {n}[{at}] expected {e.flat[i]:.9g} got {g.flat[i]:.9g} bound {b.flat[i]:.3g}")
print("STILL WRONG" if bad else "fixed: every element within its bound")
sys.exit(1 if bad else 0)'''


_REFUSED = ['except Exception as e:  # noqa: BLE001 - refusing malformed metadata is what the contract asks',
            '    print(f"refused: {type(e).__name__}: {e}")',
            '    sys.exit(0)']

_ACCEPTED = '''for n, g in got.items():
    g = np.asarray(g, np.float64)
    print(f"{n} came back {g.shape}: {int(np.isnan(g).sum())} NaN, {int(np.isinf(g).sum())} Inf, first {g.ravel()[:4]}")
print("STILL WRONG: the call returned instead of raising, and no result of these arrays is right")
sys.exit(1)'''


def _contract(malformed):
    """The head's lines for a malformed case (docs/semantics.md "Malformed metadata"): the defect and the rule."""
    lines = [f"Malformed metadata, in the .npz exactly as attn-fuzz sent it: {malformed.get('defect', '')}",
             "Contract (attn-fuzz docs/semantics.md \"Malformed metadata\"): the library must raise (exit 0);"]
    if malformed.get("right_answer"):
        return lines + ["or return the well-formed arrays' result within the bounds below (exit 0; else exit 1)."]
    return lines + ["these arrays have no right result, so a call that returns exits 1 (what came back is printed)."]


def script_text(call, p, comment, malformed=None):
    """The script: comment lines (what failed, the replay command), the call's source, the comparison. malformed (a
    run's repro "malformed": kind, defect, right_answer): the call may raise (exit 0); a return is compared with the
    well-formed reading where it has a right answer, else exits 1."""
    about = ["Expected = attn-fuzz's exact oracle; exit 1 while the library is wrong, 0 once fixed. Inputs: the .npz;",
             "o, dq [b, s, h, d], lse [b, h, s], dk, dv [b, j, h, d] (j: key), as attn-fuzz's adapters carry them."]
    if malformed and not malformed.get("right_answer"):
        about = ["Inputs: the .npz: q, k, v ([total, h, d] packed, else [b, s, h, d]) and the int32 arrays, as sent."]
    head = ["# " + c for c in comment + (_contract(malformed) if malformed else []) + about] + [
        "import sys", "import numpy as np"]
    load = ['x = dict(np.load(sys.argv[1] if sys.argv[1:] else __file__[:-3] + ".npz"))']
    if call.needs_problem:
        head.append("import json")
        load += ["from attnfuzz.adapter import Problem",
                 'p = Problem.from_run(json.loads(str(x["problem"])), x)']
    if p.pass_name == "bwd":
        run = ['got = dict(zip(("dq", "dk", "dv"), call_bwd(*(x[n] for n in ("q", "k", "v", "o", "lse", "do")))))']
    else:
        run = ['r = call(x["q"], x["k"], x["v"])',
               'got = dict(zip(("o", "lse"), r if isinstance(r, tuple) else (r,)))']
    tail = _COMPARE
    if malformed:  # the call may raise; what it returns is judged by the contract
        run = ["try:", "    " + run[0]] + _REFUSED + run[1:]
        tail = _COMPARE if malformed.get("right_answer") else _ACCEPTED
    return "\n".join(head + call.imports + load + call.source + run + [tail]) + "\n"


def write(kernel, p, problem_dict, tensors, req):
    """Writes req["dir"]/<req["stem"]>.py and .npz for a run of kernel on p (PROTOCOL.md "Bug reports"): the run's
    inputs, expected_* / bound_* (the oracle's values and per-element bounds, f64), the call's arrays. Returns the
    paths; raises ValueError when this kernel or problem cannot have a script."""
    if kernel.repro is None:
        raise ValueError(f"kernel {kernel.name} does not write bug-report scripts")
    call = kernel.repro(p, p.pass_name)
    comment = [str(c) for c in req.get("comment", [])]
    text = script_text(call, p, comment, req.get("malformed"))
    n = text.count("\n")
    if n > MAX_LINES:
        raise ValueError(f"the script would have {n} lines (at most {MAX_LINES}): the call is too long to report")
    arrays = {k: np.asarray(v) for k, v in tensors.items()}
    arrays.update(call.arrays)
    if call.needs_problem:
        arrays["problem"] = np.array(json.dumps(problem_dict))
    base = os.path.join(str(req["dir"]), str(req.get("stem", "repro")))
    np.savez(base + ".npz", **arrays)
    with open(base + ".py", "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(base + ".py", 0o755)
    return [base + ".py", base + ".npz"]
