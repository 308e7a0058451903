// variant_oracle.cpp - the oracle's cost per case with each variant (sink, softcap, ALiBi, bias, all; the
// custom masks mask-dense, mask-bits, block-sparse, each at density 0.5) against the plain case, forward and
// backward, side by side in one run (issue 28); per-head fp8 descales (head-descale) against the same
// fp8-e4m3 case with per-tensor descales, forward only (fp8 has no backward).
//   variant_oracle [--reps N]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "attnfuzz/case.h"
#include "oracle/grad.h"
#include "oracle/oracle.h"

using namespace attnfuzz;

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  struct V {
    const char* name;
    uint32_t bits;
  };
  const V vs[] = {{"plain", 0},
                  {"sink", AF_VARIANT_SINK},
                  {"softcap", AF_VARIANT_SOFTCAP},
                  {"alibi", AF_VARIANT_ALIBI},
                  {"bias", AF_VARIANT_BIAS},
                  {"all", AF_VARIANT_SINK | AF_VARIANT_SOFTCAP | AF_VARIANT_ALIBI | AF_VARIANT_BIAS},
                  {"mask-dense", AF_VARIANT_MASK_DENSE},
                  {"mask-bits", AF_VARIANT_MASK_BITS},
                  {"block-sparse", AF_VARIANT_MASK_DENSE | AF_VARIANT_BLOCK_SPARSE}};
  Problem p = make_problem(1, 4, 2, 256, 256, 64, 64);
  (void)parse_mask("causal-br", p);
  double plain_f = 0, plain_b = 0;
  std::printf("# oracle cost per case, B=1 Hq=4 Hkv=2 Sq=Sk=256 D=64 causal-br, %d rep(s), 1 thread\n", reps);
  for (const V& v : vs) {
    Case c = make_case(p, 0x5eed);
    (void)set_variants(c, v.bits & kScoreVariants, 30.0f, "b");
    if (v.bits & kMaskVariants) (void)set_mask_variants(c, v.bits & kMaskVariants, "random:0.5", "mixed", "", 64, 64);
    c.pass = Pass::kBwd;
    const Tensors t = generate(c);
    OracleOptions o;
    o.threads = 1;
    o.baseline = false;
    double fwd = 1e300, bwd = 1e300;
    int64_t mp = 0;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      const OracleResult F = compute_oracle(c.problem, t.q.data(), t.k.data(), t.v.data(), t.variant_inputs(), o);
      fwd = std::min(fwd, ms_since(t0));
      mp = F.rows_mp;
      std::vector<float> oo(static_cast<size_t>(o_elements(c.problem))), ll(static_cast<size_t>(lse_elements(c.problem)));
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t s = 0; s < p.seq_q; ++s) {
          ll[static_cast<size_t>(lse_index(p, 0, h, s))] = static_cast<float>(F.lse[F.lse_at(0, h, s)]);
          for (int64_t d = 0; d < p.head_dim_v; ++d)
            oo[static_cast<size_t>(o_index(p, 0, s, h, d))] = static_cast<float>(F.o[F.o_at(0, s, h, d)]);
        }
      GradOptions g;
      g.fwd = o;
      g.forward = &F;
      const auto t1 = std::chrono::steady_clock::now();
      (void)compute_grad_oracle(c.problem, t.q.data(), t.k.data(), t.v.data(), t.dout.data(), oo.data(), ll.data(),
                                t.variant_inputs(), g);
      bwd = std::min(bwd, ms_since(t1));
    }
    if (v.bits == 0) plain_f = fwd, plain_b = bwd;
    std::printf("variant=%-12s fwd_ms=%8.2f fwd_ratio=%5.2f bwd_ms=%8.2f bwd_ratio=%5.2f mp_rows=%lld\n", v.name, fwd,
                fwd / plain_f, bwd, bwd / plain_b, (long long)mp);
  }
  Problem p8 = p;
  p8.dtype = AF_DTYPE_FP8_E4M3;
  p8.q_descale = 2, p8.k_descale = 0.5f, p8.v_descale = 8;
  double plain8 = 0;
  for (bool hd : {false, true}) {
    Case c = make_case(p8, 0x5eed);
    if (hd) (void)set_variants(c, AF_VARIANT_HEAD_DESCALE);
    const Tensors t = generate(c);
    OracleOptions o;
    o.threads = 1;
    o.baseline = false;
    double fwd = 1e300;
    int64_t mp = 0;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      const OracleResult F =
          compute_oracle(c.problem, t.q.data(), t.k.data(), t.v.data(), t.variant_inputs(), o);
      fwd = std::min(fwd, ms_since(t0));
      mp = F.rows_mp;
    }
    if (!hd) plain8 = fwd;
    std::printf(
        "variant=%-12s fwd_ms=%8.2f fwd_ratio=%5.2f (fp8-e4m3, against per-tensor descales) mp_rows=%lld\n",
        hd ? "head-descale" : "fp8-tensor", fwd, fwd / plain8, (long long)mp);
  }
  return 0;
}
