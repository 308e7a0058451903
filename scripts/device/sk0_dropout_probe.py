# sk0_dropout_probe.py - experiment (a CUDA GPU with torch): SDPA with dropout and no keys (Sk = 0), through the
# public call and the private ops the torch_sdpa adapter's dropout route uses, per backend, forward and backward.
# The exact answer: O = 0, LSE = -inf, dQ = 0 (no key, nothing to attend). Issue 30's Sk = 0 candidates.
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def show(tag, fn):
    try:
        r = fn()
        print(f"{tag}: {r}")
    except Exception as e:  # a library error is a result here
        print(f"{tag}: raised {type(e).__name__}: {str(e).splitlines()[0][:140]}")


def public(backend, dtype, p):
    q = torch.randn(1, 2, 5, 64, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.empty(1, 2, 0, 64, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.empty(1, 2, 0, 64, device="cuda", dtype=dtype, requires_grad=True)
    with sdpa_kernel(backend):
        o = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        o.float().sum().backward()
    torch.cuda.synchronize()
    return (f"O max|.| {o.detach().abs().max().item()} finite {bool(torch.isfinite(o).all())}; "
            f"dQ max|.| {q.grad.abs().max().item()} finite {bool(torch.isfinite(q.grad).all())}")


def private_lse(op, dtype, p):
    q = torch.randn(1, 2, 5, 64, device="cuda", dtype=dtype)
    k = torch.empty(1, 2, 0, 64, device="cuda", dtype=dtype)
    if op == "flash":
        r = torch.ops.aten._scaled_dot_product_flash_attention(q, k, k, p, False, True)
    else:
        r = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, k, None, True, p, False)
    torch.cuda.synchronize()
    return f"O max|.| {r[0].abs().max().item()}; LSE {r[1].flatten()[:3].tolist()}"


print(torch.__version__, torch.cuda.get_device_name())
for dtype in (torch.float16, torch.bfloat16):
    for p in (0.0, 0.3):
        for name, b in (("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                        ("cudnn", SDPBackend.CUDNN_ATTENTION), ("math", SDPBackend.MATH)):
            show(f"public {name} {dtype} p={p}", lambda: public(b, dtype, p))
        for op in ("flash", "efficient"):
            show(f"private {op} {dtype} p={p}", lambda: private_lse(op, dtype, p))
