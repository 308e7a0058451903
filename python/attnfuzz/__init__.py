"""attnfuzz: the Python side of attn-fuzz adapters (adapters/PROTOCOL.md): serve any attention callable to
attn-check / attn-fuzz, a numpy reference, PyTorch / FlexAttention / Triton adapters, and a pytest helper."""

PROTOCOL_VERSION = 1

try:
    import numpy  # noqa: F401  (every adapter needs it: one line instead of a traceback when it is missing)
except ImportError as e:  # pragma: no cover - exercised by tests/adapters with an interpreter without numpy
    import sys

    sys.stderr.write(f"attnfuzz: the adapter's Python {sys.executable} cannot import numpy ({e}): install numpy "
                     "for that interpreter (e.g. apt install python3-numpy) or start the adapter with one that has it\n")
    raise SystemExit(2)

from .adapter import Kernel, Problem, serve  # noqa: E402,F401
