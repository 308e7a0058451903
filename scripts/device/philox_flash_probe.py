# philox_flash_probe.py - experiment (a CUDA GPU with torch): does the tool's philox-flash draw (include/attnfuzz/philox.h, mirrored here in numpy)
# equal the keep mask of a real FlashAttention 2 build (torch 2.11's flash backend, its debug mask)?
import numpy as np, torch
M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
U32 = np.uint64(0xffffffff)
def philox7(c0, c1, c2, c3, k0, k1):
    c = [x.astype(np.uint64) for x in (c0, c1, c2, c3)]; k0 = np.uint64(k0); k1 = np.uint64(k1)
    for r in range(7):
        if r: k0 = (k0 + np.uint64(W0)) & U32; k1 = (k1 + np.uint64(W1)) & U32
        p0 = np.uint64(M0) * c[0]; p1 = np.uint64(M1) * c[2]
        hi0, lo0, hi1, lo1 = p0 >> np.uint64(32), p0 & U32, p1 >> np.uint64(32), p1 & U32
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
    return c
def tool_keep(seed, offset, p, B, H, Sq, Sk):
    b, h, i, j = np.meshgrid(np.arange(B), np.arange(H), np.arange(Sq), np.arange(Sk), indexing="ij")
    b, h, i, j = (x.astype(np.uint64) for x in (b, h, i, j))
    lane = np.uint64(4) * (i % np.uint64(8)) + (j % np.uint64(8)) // np.uint64(2)
    sub_lo, sub_hi = i // np.uint64(16), j // np.uint64(32)
    off = np.uint64(offset) + (b * np.uint64(H) + h) * np.uint64(32) + lane
    byte = (np.uint64(8) * ((j % np.uint64(32)) // np.uint64(16)) + np.uint64(4) * ((j % np.uint64(16)) // np.uint64(8))
            + np.uint64(2) * ((i % np.uint64(16)) // np.uint64(8)) + j % np.uint64(2))
    c = philox7(off & U32, off >> np.uint64(32), sub_lo & U32, sub_hi, seed & 0xffffffff, seed >> 32)
    words = np.stack(c, -1)
    w = np.take_along_axis(words, (byte // np.uint64(4)).astype(np.int64)[..., None], -1)[..., 0]
    val = (w >> (np.uint64(8) * (byte % np.uint64(4)))) & np.uint64(0xff)
    thr = int(np.float64(np.float32(1) - np.float32(p)) * 255.0)
    return val <= np.uint64(thr)
torch.zeros(1, device="cuda")  # initialises CUDA and its generators
gen = torch.cuda.default_generators[0]
for (B, H, Sq, Sk, D, p, seed, off) in [(1, 2, 40, 100, 64, 0.3, 1234, 0), (2, 3, 33, 65, 32, 0.1, 7, 8), (1, 1, 128, 256, 128, 0.5, 99, 4096)]:
    q = torch.randn(B, H, Sq, D, device="cuda", dtype=torch.float16); k = torch.randn(B, H, Sk, D, device="cuda", dtype=torch.float16); v = torch.randn_like(k)
    gen.manual_seed(seed); gen.set_offset(off)
    out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, p, False, True, scale=0.1)
    st = out[-3]  # torch >= 2.5: rng_state [seed, offset] (int64); older: philox_seed, philox_offset
    ps, po = (int(st[0]), int(st[1])) if torch.is_tensor(st) and st.numel() == 2 else (int(out[-3]), int(out[-2]))
    real = (out[-1][:, :, :Sq, :Sk] >= 0).cpu().numpy()
    print(f"B={B} H={H} {Sq}x{Sk} D={D} p={p} seed={seed} gen offset {off}: real keep fraction {real.mean():.4f}; op's philox (seed, offset) = ({ps}, {po})")
    for cand in sorted({off, off // 4, 4 * off, off + 4, po}):
        t = tool_keep(seed, cand, p, B, H, Sq, Sk)
        print(f"   tool philox-flash with offset {cand}: equal fraction {(t == real).mean():.4f}{'  IDENTICAL' if (t == real).all() else ''}")
