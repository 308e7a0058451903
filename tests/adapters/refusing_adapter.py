"""An adapter whose one kernel refuses every problem (a kernel declared for shapes the campaign never draws)."""

from attnfuzz.adapter import Kernel, serve


def run(q, k, v, p):
    raise RuntimeError("never called: supports() refuses every problem")


serve([Kernel("refuse-all", run, supports=lambda p: "this kernel refuses every problem")], name="refusing")
