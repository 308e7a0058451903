"""The numpy reference adapter (fp32), and its planted-bug variants for the tool's own tests.

    attn-check --sweep --adapter 'python3 -m attnfuzz.adapters.numpy_ref'
    attn-check --sweep --adapter 'python3 -m attnfuzz.adapters.numpy_ref --bug mask-leak'
"""

import argparse

from attnfuzz.adapter import Kernel, serve
from attnfuzz.reference import attention

BUGS = ("mask-leak", "missing-rescale", "empty-row-nan", "lse-error")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bug", choices=BUGS, help="serve a planted-bug variant instead (kernel numpy-<bug>)")
    ap.add_argument("--no-lse", action="store_true", help="declare no LSE output")
    a = ap.parse_args(argv)
    bug = a.bug

    def run(q, k, v, p):
        return attention(q, k, v, p, bug=bug)

    name = "numpy-" + bug if bug else "numpy-ref"
    desc = f"numpy reference with planted bug {bug}" if bug else "numpy reference (float64 inside)"
    serve([Kernel(name, run, family="numpy", description=desc, lse=not a.no_lse)], name="numpy_ref")


if __name__ == "__main__":
    main()
