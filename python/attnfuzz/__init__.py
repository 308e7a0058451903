"""attnfuzz: the Python side of attn-fuzz adapters (adapters/PROTOCOL.md): serve any attention callable to
attn-check / attn-fuzz, a numpy reference, PyTorch / FlexAttention / Triton adapters, and a pytest helper."""

PROTOCOL_VERSION = 1

from .adapter import Kernel, Problem, serve  # noqa: E402,F401
