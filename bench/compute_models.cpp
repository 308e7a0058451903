// compute_models.cpp - the f16 / bf16 O bound under each compute model (fused, unfused) at score magnitudes 1 .. 1e4:
// bound / max|O| and bound / (u_c max|v|), side by side in one run (oracle/README.md "Compute models").
//   compute_models [--rows N]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "attnfuzz/case.h"
#include "oracle/lowp.h"
#include "oracle/oracle.h"

using namespace attnfuzz;

namespace {

struct Row {
  double bound_over_o = 0, bound_over_uv = 0;
  int64_t outside = 0, rows = 0;
};

Row measure(int32_t dt, int32_t model, double mag, int64_t sq) {
  Problem p = make_problem(1, 2, 2, sq, 256, 64, 64);
  p.dtype = dt;
  Case c = make_case(p, 0x5eed + static_cast<uint64_t>(mag));
  c.values.dist = {Distribution::kExtreme, mag};
  const Tensors t = generate(c);
  OracleOptions o;
  o.compute_model = model;
  o.baseline = false;
  const OracleResult r = compute_oracle(c.problem, t.q.data(), t.k.data(), t.v.data(), o);
  double vmax = 0, omax = 0, bmax = 0;
  for (float x : t.v) vmax = std::max(vmax, std::fabs(static_cast<double>(x)));
  for (size_t i = 0; i < r.o.size(); ++i) {
    if (!std::isfinite(r.o_bound[i])) continue;
    omax = std::max(omax, std::fabs(r.o[i]));
    bmax = std::max(bmax, r.o_bound[i]);
  }
  Row out;
  for (const RowInfo& ri : r.rows) out.outside += !ri.inside_contract(), out.rows += 1;
  out.bound_over_o = omax > 0 ? bmax / omax : 0;
  out.bound_over_uv = bmax / (unit_roundoff(dt) * vmax);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = 32;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rows" && i + 1 < argc) {
      rows = std::atoll(argv[++i]);
      if (rows >= 1 && rows <= 4096) continue;
    }
    std::fprintf(stderr, "usage: compute_models [--rows N (1 .. 4096)]\n");
    return 2;
  }
  std::printf("# O bound per compute model: B=1 H=2 Sq=%lld Sk=256 D=64, values extreme:MAG (v uniform in [-1, 1])\n",
              static_cast<long long>(rows));
  std::printf("# %-5s %-8s %8s %14s %18s %10s\n", "dtype", "model", "|s|", "bound/max|O|", "bound/(u_c max|v|)",
              "outside");
  for (int32_t dt : {AF_DTYPE_F16, AF_DTYPE_BF16})
    for (int32_t model : {AF_COMPUTE_FUSED, AF_COMPUTE_UNFUSED})
      for (double mag : {1.0, 1e2, 1e3, 1e4}) {
        Row r;
        try {
          r = measure(dt, model, mag, rows);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "compute_models: %s\n", e.what());
          return 1;
        }
        const char* dn = dt == AF_DTYPE_F16 ? "f16" : "bf16";
        const char* mn = model == AF_COMPUTE_FUSED ? "fused" : "unfused";
        std::printf("  %-5s %-8s %8.0e %14.3g %18.3g %6lld/%lld\n", dn, mn, mag, r.bound_over_o, r.bound_over_uv,
                    static_cast<long long>(r.outside), static_cast<long long>(r.rows));
        std::printf("%s.%s.s%.0e.bound_over_max_o=%.4g\n", dn, mn, mag, r.bound_over_o);
      }
  return 0;
}
